#!/usr/bin/env bash
# Usage: tools/test_workbook_check.sh SOURCE_DIR
#
# `./workbook check` tells an exercise that is not written yet (every failure says "not
# written yet") from one under way. Its test once read the log through `grep | grep -q`,
# which under pipefail failed whenever the second grep stopped early and the first died of
# SIGPIPE: a written exercise was then called "not written yet" (1 run in 4 with a long log).
# Here the verdict is replayed 200 times on a long log of each kind.
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
