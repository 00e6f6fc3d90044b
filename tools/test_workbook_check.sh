#!/usr/bin/env bash
# Usage: tools/test_workbook_check.sh SOURCE_DIR
#
# `./workbook check` tells an exercise that is not written yet (every failure says "not
# written yet") from one under way. Its test once read the log through `grep | grep -q`,
# which under pipefail failed whenever the second grep stopped early and the first died of
# SIGPIPE: a written exercise was then called "not written yet" (1 run in 4 with a long log).
# Here the verdict is replayed 200 times on a long log of each kind.
#
# The run under the sanitizers gets SANITIZER_SLOWDOWN times the release run's time where
# that is longer than the limit, and a run that passed and was only too slow under the
# sanitizers is called that, never "a loop that never ends" (a correct block-per-row kernel
# of exercise 12 once was); its "still running" line waits for the slow-down expected there.
# Replayed with stand-in check programs that sleep.
set -uo pipefail
src=$1
# shellcheck source=/dev/null
source "$src/workbook"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
under_way="$work/under-way.log" fresh="$work/fresh.log"
{
  echo "exercise.cpp:12: ERROR: CHECK( max_abs_diff(out, expected) < 1e-6 ) is NOT correct!"
  for i in $(seq 1 4000); do echo "checks.cpp:$i: ERROR: not written yet: causal_softmax"; done
} > "$under_way"
{
  for i in $(seq 1 4000); do echo "checks.cpp:$i: ERROR: not written yet: causal_softmax"; done
  # an unwritten exercise's exception inside a SUBCASE, as doctest words it
  echo "checks.cpp:45: ERROR: test case THREW exception: exception thrown in subcase - will translate later when the whole test case has been exited (cannot translate while there is an active exception)"
} > "$fresh"
wrong=0
for _ in $(seq 1 200); do
  said=$(not_done_yet 03 "$under_way")
  [[ $said == *"is not done yet"* ]] || wrong=$((wrong + 1))
done
if [ $wrong -ne 0 ]; then
  echo "an exercise under way was called 'not written yet' in $wrong of 200 replays"; exit 1
fi
for _ in $(seq 1 20); do
  said=$(not_done_yet 03 "$fresh")
  [[ $said == *"is not written yet"* ]] ||
    { echo "an exercise as shipped was not called 'not written yet'"; exit 1; }
done
echo "200 replays of a long log: an exercise under way is never called 'not written yet'"

# A course folder of one exercise whose release and sanitizer check programs only sleep
# (as long as the file beside them says) and pass.
course="$work/course"
mkdir -p "$course/lessons/12_training_gpu" "$course/exercises/12_training_gpu" "$course/build" \
         "$course/build-debug" "$course/.workbook/status"
echo 'void f();' >"$course/exercises/12_training_gpu/exercise.cpp"
: >"$course/build-debug/build.ninja"
for b in build build-debug; do
  # shellcheck disable=SC2016  # the $(cat …) is the stand-in program's, run when it runs
  printf '#!/bin/sh\nexec sleep "$(cat "%s")"\n' "$course/$b/sleep" >"$course/$b/check_12_exercise"
  chmod +x "$course/$b/check_12_exercise"
done
# shellcheck disable=SC2034  # ROOT, BUILD, STATE and SANITIZER_SLOWDOWN: the workbook's
ROOT=$course BUILD="$course/build" STATE="$course/.workbook"
build_with_progress() { return 0; }
show_report() { cat "$1"; }
# shellcheck disable=SC2034
SANITIZER_SLOWDOWN=10

# Runs the release checks (sleeping RELEASE s) then the sanitizer run (SANITIZED s) under a
# CHECK_TIME_LIMIT of LIMIT s; sets said (what run_debug_check printed) and debug_rc.
replay() {  # replay LIMIT RELEASE SANITIZED
  CHECK_TIME_LIMIT=$1
  echo "$2" >"$course/build/sleep"
  echo "$3" >"$course/build-debug/sleep"
  run_with_time_limit "$work/release.log" "$CHECK_TIME_LIMIT" "$BUILD/check_12_exercise" --no-version
  debug_rc=0
  said=$(run_debug_check 12) || debug_rc=$?
}

# Release 0.3 s: the sanitizer run may take 10 × 0.3 = 3 s, though the limit is 1 s.
replay 1 0.3 1.5
if [ $debug_rc -ne 0 ]; then
  printf '%s\n' "$said"
  echo "a sanitizer run of 1.5 s after a release run of 0.3 s (limit 1 s) was stopped: its limit did not scale"; exit 1
fi
# Slower than that: stopped at 3 s, and called too slow, not a loop that never ends.
replay 1 0.3 6
if [ $debug_rc -eq 0 ] || [[ $said != *"was too slow"* ]] || [[ $said != *"ATTN_CHECK_TIME_LIMIT="* ]] ||
   [[ $said == *"never ends"* ]] || [[ $said != *"after 3 s"* ]]; then
  printf '%s\n' "$said"
  echo "a passing exercise whose sanitizer run was stopped at its scaled limit (3 s) was not called too slow"; exit 1
fi
[ "$(cut -d' ' -f2 "$STATE/status/12" 2>/dev/null)" != fail ] ||
  { echo "a passing exercise whose sanitizer run was only too slow was marked failing"; exit 1; }
# A release run that was itself stopped gives no time to scale: the sanitizer run keeps the
# limit, and both stopped is a loop that never ends.
replay 1 3 3
if [[ $said != *"after 1 s under the sanitizers"* ]] || [[ $said != *"a loop that never ends (a bound"* ]]; then
  printf '%s\n' "$said"
  echo "checks stopped in the release run and under the sanitizers were not called a loop that never ends"; exit 1
fi
# The line saying the sanitizer run is still running waits SANITIZER_EXPECTED_SLOWDOWN (5)
# times the release run's time, at least 5 s: release 1.2 s, sanitizers 5.5 s, no line (a
# correct exercise that is only slower there once read "still running after 5 s" every time);
# release 0.5 s, sanitizers 5.5 s: the line at 5 s, saying the sanitizers slow them down.
replay 30 1.2 5.5
if [ $debug_rc -ne 0 ] || [[ $said == *"still running"* ]]; then
  printf '%s\n' "$said"
  echo "a sanitizer run of 5.5 s after a release run of 1.2 s said it was still running before 6 s"; exit 1
fi
replay 30 0.5 5.5
if [ $debug_rc -ne 0 ] || [[ $said != *"still running after 5 s"*"the sanitizers slow the checks down about 5×"* ]]; then
  printf '%s\n' "$said"
  echo "a sanitizer run of 5.5 s after a release run of 0.5 s did not say at 5 s that it was still running, and why"; exit 1
fi
echo "the sanitizer run's limit scales with the release run's time, and a passing exercise only too slow under the sanitizers is called that"

# A sanitizer run stopped by libstdc++'s index check (_GLIBCXX_ASSERTIONS): the abort, the
# container it names and the learner's line on the abort's stack (checks/support/main.cpp).
cat >"$course/build-debug/check_12_exercise" <<'SH'
#!/bin/sh
echo "TEST CASE:  a row of one key"
echo "/usr/include/c++/12/array:61: constexpr std::array<_Tp, _Nm>::value_type& std::array<_Tp, _Nm>::operator[](size_type) [with _Tp = long unsigned int; long unsigned int _Nm = 2; reference = long unsigned int&]: Assertion '__n < this->size()' failed." >&2
echo "FATAL ERROR: test case CRASHED: SIGABRT - Abort (abnormal termination) signal"
echo "The stack where the program aborted:"
echo "    #3 0x55d0 in exercise::rope_rotate(xt::xtensor<float, 2> const&, int) exercises/15_positions/exercise.cpp:17" >&2
echo "(end of the stack)" >&2
kill -ABRT $$
SH
replay 1 0.1 0
if [ $debug_rc -eq 0 ] || [[ $said != *"indexes past the end of a std::vector or std::array"* ]] ||
   [[ $said != *"std::array<long unsigned int, 2>"* ]] || [[ $said != *"exercise.cpp:17"* ]]; then
  printf '%s\n' "$said"
  echo "an index past a std::array that libstdc++ stopped was not called that, with the container and the line"; exit 1
fi
echo "an index past a std::vector's or std::array's end, stopped by libstdc++, is named with its container and line"
