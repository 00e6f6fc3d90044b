#!/usr/bin/env bash
# Usage: tools/cuda/verify_on_gpu.sh STAGE [RESULTS_DIR]
#
# Everything the GPU lessons (12, 13, 14, 18) claim, checked and measured on one GPU machine in
# a few calls. Each stage fits in under ten minutes on a 16-core machine with an H100 or
# H200; run them in this order on the same machine (the build folder is reused):
#
#   build    configure and build everything with nvcc (build-gpu/)
#   checks   the GPU tests (ctest -L cuda), the library tests, compute-sanitizer on the
#            attention kernels (the 16-bit and tensor-core ones with its race checker too),
#            and the lessons 12-14 and 18 as the learner runs them
#   bench    the kernel workbench, attention (plain, fused, PyTorch's SDPA) for T = 256…4096,
#            the 16-bit, tensor-core (WMMA) and mma.sync (FlashAttention-2's forward)
#            attention against the float32 fused kernel,
#            one training step (fp32, TF32, TF32 + fused attention) and the race against
#            PyTorch (bf16 autocast + torch.compile)
#   lease    for a lease of a few minutes, with programs built elsewhere (tools/cuda/pack_for_gpu.sh):
#            the GPU tests, the lessons 12-14, the benchmarks and PyTorch's figures,
#            compute-sanitizer, each step cut off at STEP_SECONDS (default 90) and none
#            started after LEASE_SECONDS (default 480); lesson 18 last, with the time left
#   recipe   nanoGPT's train_shakespeare_char recipe (needs the corpus at
#            data/tinyshakespeare.txt: ./workbook data, or carry that file), resumed across
#            calls when it outlasts one, then a sample on the CPU from the GPU's checkpoint
#
# Each step's whole output goes to RESULTS_DIR/<step>.log (default: $OUT if set, else
# gpu-results/); a table of the steps, their exit status and wall time is printed last and
# kept in RESULTS_DIR/summary.txt. Nothing here changes the GPU's settings.
set -u
stage=${1:-}
results=${2:-${OUT:-gpu-results}}
build=${BUILD:-build-gpu}
case "$stage" in
  build|checks|bench|lease|recipe) ;;
  *) echo "usage: tools/cuda/verify_on_gpu.sh build|checks|bench|lease|recipe [RESULTS_DIR]" >&2; exit 2 ;;
esac
mkdir -p "$results"
summary="$results/summary.txt"
: > "$summary"
failed=0

# step NAME COMMAND...: runs it, its output to NAME.log (and the last lines to the terminal).
# In the lease stage each step is cut off at STEP_SECONDS, and skipped once LEASE_SECONDS
# have passed.
limit=0
step() {
  local name=$1; shift
  local start=$SECONDS rc
  if [ "$limit" -gt 0 ] && [ "$SECONDS" -ge "$limit" ]; then
    printf '%-28s skipped: the lease stage is out of time\n' "$name" >> "$summary"; return
  fi
  echo "==> $name: $*"
  if [ "$limit" -gt 0 ]; then
    local cap=$(( limit - SECONDS )); [ "$cap" -gt "${STEP_SECONDS:-90}" ] && cap=${STEP_SECONDS:-90}
    timeout --signal=INT --kill-after=5 "$cap" "$@" > "$results/$name.log" 2>&1
  else
    "$@" > "$results/$name.log" 2>&1
  fi
  rc=$?
  tail -n 15 "$results/$name.log"
  printf '%-28s exit %3d  %5d s\n' "$name" "$rc" $((SECONDS - start)) >> "$summary"
  [ $rc -eq 0 ] || failed=1
}

if [ ! -d "$build" ] && [ "$stage" != build ]; then
  echo "verify_on_gpu: $build/ is missing: run the build stage first" >&2; exit 1
fi
cores=$(nproc 2>/dev/null || echo 4)
case "$stage" in
  build)
    step nvidia-smi nvidia-smi
    step configure cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release
    step build cmake --build "$build" -j "$cores"
    ;;
  checks)
    step ctest-cuda ctest --test-dir "$build" -L '^cuda$' --output-on-failure
    step ctest-library ctest --test-dir "$build" -L library -j "$cores" --output-on-failure
    if command -v compute-sanitizer >/dev/null; then
      step sanitizer-attention compute-sanitizer --error-exitcode 1 "$build/tests/cuda_attention_test"
      step sanitizer-half-attention compute-sanitizer --error-exitcode 1 "$build/tests/cuda_half_attention_test"
      step racecheck-half-attention compute-sanitizer --tool racecheck --error-exitcode 1 \
        "$build/tests/cuda_half_attention_test"
    else
      echo "compute-sanitizer not found: skipped" | tee -a "$summary"
    fi
    step lesson_12 "$build/lesson_12"
    step lesson_13 "$build/lesson_13"
    step lesson_14 "$build/lesson_14"
    step lesson_18 "$build/lesson_18"
    ;;
  bench)
    step kernels "$build/tools/cuda/gpt_kernels_bench" 64 256
    step attention-hs64 "$build/tests/attention_bench"
    step attention-hs128 "$build/tests/attention_bench" --hs 128 --no-validate
    step attention-torch python3 tools/cuda/attention_torch.py
    step half-attention-hs64 "$build/tests/half_attention_bench"
    step half-attention-hs128 "$build/tests/half_attention_bench" --hs 128
    step step-fp32 "$build/tools/cuda/gpu_train_bench" --batch 64
    step step-tf32 "$build/tools/cuda/gpu_train_bench" --batch 64 --tf32
    step step-tf32-fused "$build/tools/cuda/gpu_train_bench" --batch 64 --tf32 --attention fused
    step race-tf32 python3 tools/bench/gpu_race.py --build "$build" --tf32
    step race-tf32-fused python3 tools/bench/gpu_race.py --build "$build" --tf32 --attention fused
    ;;
  lease)
    # Programs built on another machine hold its checkout's path: link it to this copy.
    src=$(cat "$build/source-dir.txt" 2>/dev/null || true)
    if [ -n "$src" ] && [ "$src" != "$(pwd)" ] && [ ! -e "$src" ]; then
      mkdir -p "$(dirname "$src")" && ln -s "$(pwd)" "$src"
    fi
    export LD_LIBRARY_PATH="$(pwd)/$build/gpu-libs:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    limit=$(( SECONDS + ${LEASE_SECONDS:-480} ))
    step nvidia-smi nvidia-smi
    step device "$build/tests/cuda_device_test"
    step test-attention "$build/tests/cuda_attention_test"
    step test-half-attention "$build/tests/cuda_half_attention_test"
    step test-mma "$build/tests/cuda_mma_test"
    step test-gpt "$build/tests/cuda_gpt_test"
    step lesson_12 "$build/lesson_12"
    step lesson_13 "$build/lesson_13"
    step lesson_14 "$build/lesson_14"
    step attention-hs64 "$build/tests/attention_bench"
    step attention-torch python3 tools/cuda/attention_torch.py
    step step-fp32 "$build/tools/cuda/gpu_train_bench" --batch 64
    step step-tf32 "$build/tools/cuda/gpu_train_bench" --batch 64 --tf32
    step step-tf32-fused "$build/tools/cuda/gpu_train_bench" --batch 64 --tf32 --attention fused
    step race-tf32 python3 tools/bench/gpu_race.py --build "$build" --tf32
    step half-attention-hs64 "$build/tests/half_attention_bench"
    step kernels "$build/tools/cuda/gpt_kernels_bench" 64 256
    if command -v compute-sanitizer >/dev/null; then
      step sanitizer-attention compute-sanitizer --error-exitcode 1 "$build/tests/cuda_attention_test"
      step racecheck-half-attention compute-sanitizer --tool racecheck --error-exitcode 1 \
        "$build/tests/cuda_half_attention_test"
    fi
    step attention-hs128 "$build/tests/attention_bench" --hs 128 --no-validate
    step half-attention-hs128 "$build/tests/half_attention_bench" --hs 128
    # Last, with all the time left: its GPU section comes after about two minutes of CPU work
    # (five 600-step trainings of the mixed-precision table), which the CPU's tests cover.
    STEP_SECONDS=$(( limit - SECONDS )) step lesson_18 "$build/lesson_18"
    ;;
  recipe)
    # The run lives in the build folder, which outlasts a call on the same machine: a call
    # that reaches its time limit (RECIPE_SECONDS, default 540) stops the run as Ctrl-C
    # does, with a checkpoint, and the next call goes on from it. Extra flags for a fresh
    # run (e.g. --attention fused) come from RECIPE_ARGS.
    run="$build/recipe-run"
    if [ -f "$run/checkpoint/trainer.json" ]; then
      args=(--resume "$run")
    else
      # shellcheck disable=SC2206
      args=(--recipe shakespeare --out "$run" ${RECIPE_ARGS:-})
    fi
    step recipe timeout --signal=INT "${RECIPE_SECONDS:-540}" "$build/tools/train_gpt" "${args[@]}" \
      --device cuda --tf32 --sample 500
    for f in metrics.jsonl loss.png sample.txt; do [ -f "$run/$f" ] && cp "$run/$f" "$results/"; done
    if grep -q "^stopped at step" "$results/recipe.log"; then
      echo "the recipe stopped at its time limit: run this stage again to go on" | tee -a "$summary"
    else
      step sample-on-cpu "$build/tools/train_gpt" --resume "$run" --device cpu --sample 500
    fi
    ;;
esac
echo
echo "stage $stage on $(hostname), results in $results/"
cat "$summary"
exit $failed
