#!/usr/bin/env bash
# Usage: expect_each_check_fails.sh CHECK_PROGRAM EXERCISE_DIR
#
# Runs every doctest case of a shipped exercise on its own and fails if any case passes:
# a check that passes on an unwritten exercise cannot tell a learner anything.
# Exits 77 (CTest's "skipped") when the exercise differs from the last commit, because
# then it is the learner's work, which `./workbook check` judges instead.
set -u
program=$1 exercise_dir=$2
if git -C "$exercise_dir" rev-parse --git-dir >/dev/null 2>&1 &&
   ! git -C "$exercise_dir" diff --quiet HEAD -- . 2>/dev/null; then
  echo "skipped: $exercise_dir has been edited (this test checks the exercise as shipped)"
  exit 77
fi
mapfile -t cases < <("$program" --list-test-cases --no-intro --no-version |
                     grep -v -e '^\[doctest\]' -e '^=*$')
[ ${#cases[@]} -gt 0 ] || { echo "no checks found in $program"; exit 1; }
status=0
for name in "${cases[@]}"; do
  # doctest filters treat ',' and '\' specially, and '*' and '?' as wildcards.
  filter=${name//\\/\\\\}; filter=${filter//,/\\,}
  if "$program" "--test-case=$filter" --no-intro --no-version >/dev/null 2>&1; then
    echo "the check \"$name\" passes on the exercise as shipped: it cannot tell a learner anything"
    status=1
  fi
done
[ $status = 0 ] && echo "all ${#cases[@]} checks fail on the shipped exercise, as they should"
exit $status
