// ATTN_SIMD_CLONES: compile a hot element-wise function twice, for any x86-64 CPU and for
// x86-64-v3 (AVX2 and FMA: Haswell, Zen and later), and let the loader pick the version the
// CPU runs. The build stays portable (no -march=native) and still gets 8-wide vectors where
// the machine has them. Both versions compute the same operations in the same order (the
// ISO C++ mode keeps a·b + c from being fused), so their results are identical.
// Elsewhere (other compilers or architectures, sanitizer builds) it expands to nothing.
#pragma once

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__) && \
    !defined(__clang__)
#define ATTN_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define ATTN_SIMD_CLONES
#endif
