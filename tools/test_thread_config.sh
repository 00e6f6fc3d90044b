#!/usr/bin/env bash
# Usage: test_thread_config.sh BUILD_DIR
#
# Every program learners run applies the library's thread policy (attn/threads.hpp) and
# reports the same settings: train_gpt, every lesson, the benchmark harness. Each one is
# asked under several environments (the defaults, OMP_NUM_THREADS, OPENBLAS_NUM_THREADS,
# one CPU by taskset, --threads) and its line must equal train_gpt's and say what the policy
# promises. train_gpt's line is also taken from a real (one-step) run, not only from
# --threads-info. No timing: this checks the configuration, not the speed.
set -u
build=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf 'the cat sat on the mat. %.0s' $(seq 200) > "$tmp/corpus.txt"
cpus=$(nproc)
# Each case sets what it tests; nothing from the calling environment leaks in.
unset OMP_NUM_THREADS OPENBLAS_NUM_THREADS GOTO_NUM_THREADS
status=0
fail() { echo "FAIL: $*"; status=1; }

programs=("$build/tools/train_gpt" "$build/tools/bench/bench_train_cpu")
for lesson in "$build"/lesson_[0-9][0-9]; do programs+=("$lesson"); done
[ ${#programs[@]} -ge 3 ] || { echo "FAIL: no lesson programs in $build"; exit 1; }

# check_all LABEL EXPECTED_REGEX ENV... -- EXTRA_ARGS...: every program's line matches.
check_all() {
  local label=$1 expected=$2; shift 2
  local envs=() extra=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  extra=("$@")
  local reference="" p line
  for p in "${programs[@]}"; do
    line=$(env ${envs[@]+"${envs[@]}"} "$p" ${extra[@]+"${extra[@]}"} --threads-info 2>&1)
    if [ $? -ne 0 ]; then fail "$label: $(basename "$p") --threads-info failed: $line"; continue; fi
    [ -z "$reference" ] && reference=$line
    [ "$line" = "$reference" ] ||
      fail "$label: $(basename "$p") says '$line', train_gpt says '$reference'"
  done
  if [[ "$reference" =~ $expected ]]; then
    echo "ok: $label: ${#programs[@]} programs say: $reference"
  else
    fail "$label: expected /$expected/, got '$reference'"
  fi
}

# OpenBLAS starts one thread per CPU of its own; the policy keeps it to one per product.
check_all "defaults" "^threads: $cpus \\(the $cpus CPUs? this process may use\\); OpenBLAS 1 thread per product \\(the library's default\\)$"
check_all "OMP_NUM_THREADS=3" "^threads: 3 \\(OMP_NUM_THREADS\\); OpenBLAS 1 thread per product" \
  OMP_NUM_THREADS=3
check_all "--threads 1 beats OMP_NUM_THREADS=3" "^threads: 1 \\(--threads\\); OpenBLAS 1 thread per product" \
  OMP_NUM_THREADS=3 -- --threads 1
if [ "$cpus" -ge 2 ]; then
  check_all "OPENBLAS_NUM_THREADS=2 is honoured, with a warning" \
    "OpenBLAS 2 threads per product \\(OPENBLAS_NUM_THREADS\\); warning: " \
    OPENBLAS_NUM_THREADS=2
  if command -v taskset >/dev/null; then
    programs_saved=("${programs[@]}")
    for i in "${!programs[@]}"; do programs[$i]="$tmp/one_cpu_$i"; done
    for i in "${!programs[@]}"; do
      printf '#!/bin/sh\nexec taskset -c 0 "%s" "$@"\n' "${programs_saved[$i]}" >"$tmp/one_cpu_$i"
      chmod +x "$tmp/one_cpu_$i"
    done
    check_all "taskset -c 0" "^threads: 1 \\(the 1 CPU this process may use\\); OpenBLAS 1 thread per product"
    programs=("${programs_saved[@]}")
  fi
else
  echo "skipped: OPENBLAS_NUM_THREADS and taskset cases (this machine has 1 CPU)"
fi

# A real run prints the same line first.
expected=$("$build/tools/train_gpt" --threads-info)
run=$("$build/tools/train_gpt" --recipe tiny \
        --data "$tmp/corpus.txt" --bench 1 2>/dev/null | head -n 1)
[ "$run" = "$expected" ] && echo "ok: train_gpt --bench prints it first: $run" ||
  fail "train_gpt --bench's first line is '$run', expected '$expected'"

[ $status -eq 0 ] && echo "the thread configuration is the same everywhere" || echo "thread configuration FAILED"
exit $status
