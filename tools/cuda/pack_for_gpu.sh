#!/usr/bin/env bash
# Usage: tools/cuda/pack_for_gpu.sh
#
# Builds, on this machine, every program tools/cuda/verify_on_gpu.sh runs (for sm_90, without
# MPI, in build-gpu/) and packs them with the shared libraries they need beyond a CUDA image's
# own into .gpu-carry.tar.xz (about 15 MB), so that a GPU machine lent for a few minutes
# spends them running, not compiling. On that machine:
#
#   tar xf .gpu-carry.tar.xz && tools/cuda/verify_on_gpu.sh lease
#
# The programs hold this checkout's absolute path (fixtures, the corpus): verify_on_gpu.sh
# links that path to the copy it runs in when the two differ.
set -euo pipefail
build=build-gpu
targets=(cuda_device_test cuda_gpt_test cuda_attention_test cuda_half_attention_test cuda_mma_test
         lesson_12 lesson_13 lesson_14 lesson_18 gpt_kernels_bench attention_bench
         half_attention_bench gpu_train_bench train_gpt)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DATTN_LESSON_GPU=gpu >/dev/null
cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/$build/gpu-libs"
progs=(tests/cuda_device_test tests/cuda_gpt_test tests/cuda_attention_test
       tests/cuda_half_attention_test tests/cuda_mma_test lesson_12 lesson_13 lesson_14 lesson_18
       tools/cuda/gpt_kernels_bench tests/attention_bench tests/half_attention_bench
       tools/cuda/gpu_train_bench tools/train_gpt)
for p in "${progs[@]}"; do
  mkdir -p "$stage/$build/$(dirname "$p")"
  cp "$build/$p" "$stage/$build/$p"
done
# The libraries a CUDA image may lack: OpenBLAS and the GNU OpenMP and Fortran run-times.
# glibc, libstdc++ and CUDA's own libraries are the image's (this machine's are older).
for p in "${progs[@]}"; do ldd "$build/$p"; done | awk '$3 ~ /^\// {print $3}' | sort -u |
  grep -E 'lib(openblas|gomp|gfortran|quadmath)' | while read -r lib; do
    cp -L "$lib" "$stage/$build/gpu-libs/"
  done
echo "$(pwd)" > "$stage/$build/source-dir.txt"
grep -qx '/.gpu-carry.tar.xz' .git/info/exclude 2>/dev/null || echo '/.gpu-carry.tar.xz' >> .git/info/exclude
tar -C "$stage" -cJf .gpu-carry.tar.xz "$build"
ls -l .gpu-carry.tar.xz | awk '{printf "wrote .gpu-carry.tar.xz (%.1f MB): name it in carry\n", $5/1e6}'
