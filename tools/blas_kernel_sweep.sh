#!/bin/sh
# Runs every test that compares floats (the label float-compare, cmake/float_compare.cmake)
# once more under a second OpenBLAS kernel (OPENBLAS_CORETYPE), after `ctest` ran them under
# the one OpenBLAS picks for this CPU: a tolerance fitted to one kernel's order of summation
# fails here, not on a learner's machine whose CPU picks another.
#
#   tools/blas_kernel_sweep.sh BUILD_DIR
#
# The second kernel is the one most unlike the default that this CPU runs: SkylakeX where the
# CPU has AVX-512 (and the default is not already an AVX-512 kernel), Haswell where the default
# is SkylakeX or Cooperlake, Sandybridge otherwise. One line: "OpenBLAS kernel X (the default
# is Y): N passed, M failed (T s)". Exits non-zero when a test fails, or when OpenBLAS does not
# switch to the kernel asked for.
#
# The tests must be built first (cmake --build BUILD_DIR). SWEEP_KERNELS="Haswell Zen ..." runs
# those kernels instead (each the CPU can execute; one it cannot is skipped with its reason);
# SWEEP_LABEL=... another label; SWEEP_JOBS the tests run at once (2).
set -u

if [ $# -ne 1 ] || [ ! -f "$1/CTestTestfile.cmake" ]; then
    echo "usage: $0 BUILD_DIR (a configured and built build folder)" >&2
    exit 2
fi
build=$(cd "$1" && pwd)
jobs=${SWEEP_JOBS:-2}
label=${SWEEP_LABEL:-float-compare}

# The CPU's flags, from the first processor's entry.
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has() { case "$flags" in *" $1 "*) return 0 ;; esac; return 1; }

# The instruction sets each kernel needs (OpenBLAS's dynamic-arch checks).
needs() {
    case "$1" in
        Prescott) echo "pni" ;;  # SSE3, named pni in /proc/cpuinfo
        Sandybridge) echo "avx" ;;
        Haswell | Zen) echo "avx2 fma" ;;
        SkylakeX) echo "avx512f avx512bw avx512vl avx512dq avx512cd" ;;
        Cooperlake) echo "avx512f avx512bw avx512vl avx512dq avx512cd avx512_bf16" ;;
        *) echo "unknown" ;;
    esac
}
runs() { for f in $(needs "$1"); do has "$f" || return 1; done; return 0; }

# A program linked with OpenBLAS that starts and exits at once, to ask which kernel it loads.
probe="$build/tests/library_tests"
if [ ! -x "$probe" ]; then
    echo "$0: $probe is missing: build the tests first (cmake --build $1)" >&2
    exit 2
fi
core_of() {  # core_of [KERNEL]: the kernel OpenBLAS loads (OPENBLAS_VERBOSE=2 names it at load)
    if [ -n "${1:-}" ]; then
        OPENBLAS_VERBOSE=2 OPENBLAS_CORETYPE=$1 "$probe" --count 2>&1 >/dev/null | sed -n 's/^Core: *//p' | head -n 1
    else
        OPENBLAS_VERBOSE=2 "$probe" --count 2>&1 >/dev/null | sed -n 's/^Core: *//p' | head -n 1
    fi
}
default=$(core_of)

if [ -n "${SWEEP_KERNELS:-}" ]; then
    kernels=$SWEEP_KERNELS
else
    case "$default" in
        SkylakeX | Cooperlake) kernels=Haswell; runs Haswell || kernels=Sandybridge ;;
        *) if runs SkylakeX; then kernels=SkylakeX; else kernels=Sandybridge; fi ;;
    esac
fi

# ctest's summary line "NN% tests passed, F tests failed out of N" as "passed failed".
counts() {
    sed -n 's/^[0-9]*% tests passed, \([0-9]*\) tests* failed out of \([0-9]*\).*/\1 \2/p' "$1" |
        tail -n 1 | { read -r failed total && echo "$((total - failed)) $failed" || echo "0 0"; }
}

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f", b - a }'; }

status=0
log_dir=$(mktemp -d "${TMPDIR:-/tmp}/blas_kernel_sweep.XXXXXX")
for kernel in $kernels; do
    if ! runs "$kernel"; then
        missing=""
        for f in $(needs "$kernel"); do has "$f" || missing="$missing $f"; done
        echo "OpenBLAS kernel $kernel: skipped, this CPU lacks$missing"
        continue
    fi
    core=$(core_of "$kernel")
    if [ "$core" != "$kernel" ]; then
        echo "OpenBLAS kernel $kernel: not loaded (OpenBLAS reports core '${core:-nothing}'; an OpenBLAS built without DYNAMIC_ARCH cannot switch)"
        status=1
        continue
    fi
    log="$log_dir/$kernel.log"
    start=$(now)
    (cd "$build" && OPENBLAS_CORETYPE=$kernel ctest -L "^$label\$" -j "$jobs" --output-on-failure) >"$log" 2>&1
    set -- $(counts "$log")
    echo "OpenBLAS kernel $kernel (the default here is ${default:-unknown}): every test labelled $label," \
         "$1 passed, $2 failed ($(elapsed "$start" "$(now)") s)"
    if [ "$2" -ne 0 ] || [ "$1" -eq 0 ]; then
        status=1
        echo "  under $kernel, failed:" >&2
        grep -E '^[[:space:]]*[0-9]+ - .*\((Failed|SEGFAULT|Timeout|Child aborted|Exception|ILLEGAL|Subprocess)' "$log" >&2
        echo "  (log: $log)" >&2
    fi
done
[ "$status" -ne 0 ] || rm -rf "$log_dir"
exit "$status"
