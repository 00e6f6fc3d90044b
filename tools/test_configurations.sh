#!/usr/bin/env bash
# Usage: tools/test_configurations.sh [PRESET...]
#
# The configurations the README promises besides the default build (which `./workbook test`
# builds whole, as it builds the sanitizer preset whole), each configured from its CMake preset
# and built with warnings as errors: train_gpt and the lessons that have code only that
# configuration compiles.
#   cpu      no CUDA even where nvcc is installed: train_gpt and lesson 12 (its GPU part is
#            left out: the code under #if !ATTN_HAVE_CUDA)
#   no-mpi   as on a machine without Open MPI: train_gpt and lessons 19 and 21; then each
#            lesson must say that it left its processes out, and train_gpt --ranks must
#            refuse in one line
# One line per configuration with its time; the first error of a failed build is shown.
# Exit status: 0 when every configuration passed.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
JOBS=$(nproc 2>/dev/null || echo 2)
presets=("$@")
[ ${#presets[@]} -gt 0 ] || presets=(cpu no-mpi)
failed=0
log_dir="$ROOT/.workbook/configurations"
mkdir -p "$log_dir"

fail() { printf 'configuration %s: FAILED: %s\n' "$1" "$2"; failed=1; }

for preset in "${presets[@]}"; do
  start=$SECONDS
  log="$log_dir/$preset.log"
  case $preset in
    cpu) build_dir="$ROOT/build-cpu" targets=(train_gpt lesson_12) ;;
    no-mpi) build_dir="$ROOT/build-nompi" targets=(train_gpt lesson_19 lesson_21) ;;
    *) fail "$preset" "unknown configuration (cpu or no-mpi)"; continue ;;
  esac
  if ! cmake --preset "$preset" -S "$ROOT" >"$log" 2>&1; then
    tail -20 "$log"; fail "$preset" "cmake could not configure it (log: ${log#"$ROOT"/})"; continue
  fi
  if ! cmake --build "$build_dir" -j "$JOBS" --target "${targets[@]}" >>"$log" 2>&1; then
    grep -E -m 12 -A 4 'error:' "$log"
    fail "$preset" "${targets[*]} did not build with warnings as errors (log: ${log#"$ROOT"/})"; continue
  fi
  detail="built ${targets[*]}"
  if [ "$preset" = no-mpi ]; then
    grep -q 'MPI: none found' "$log" || { fail "$preset" "cmake found an MPI all the same"; continue; }
    out=$("$build_dir/lesson_19" --quick 2>&1) || { printf '%s\n' "$out" | tail -5; fail "$preset" "lesson 19 --quick failed"; continue; }
    grep -q 'This build has no MPI' <<<"$out" ||
      { fail "$preset" "lesson 19 did not say that this build has no MPI"; continue; }
    out=$("$build_dir/lesson_21" --quick 2>&1) || { printf '%s\n' "$out" | tail -5; fail "$preset" "lesson 21 --quick failed"; continue; }
    grep -q 'This build has no MPI' <<<"$out" ||
      { fail "$preset" "lesson 21 did not say that this build has no MPI"; continue; }
    err=$("$build_dir/tools/train_gpt" --ranks 2 --max-iters 1 --out "$log_dir/nompi-run" 2>&1 >/dev/null)
    rc=$?
    if [ $rc = 0 ] || [ "$(printf '%s\n' "$err" | wc -l)" != 1 ] || ! grep -q 'no MPI' <<<"$err"; then
      printf '%s\n' "$err" | head -5
      fail "$preset" "train_gpt --ranks 2 did not refuse in one line (exit $rc)"; continue
    fi
    detail="$detail; lessons 19 and 21 ran their single-process parts; train_gpt --ranks 2: \"${err#train_gpt: }\""
  fi
  printf 'configuration %s: passed in %d s (%s)\n' "$preset" $((SECONDS - start)) "$detail"
done
exit $failed
