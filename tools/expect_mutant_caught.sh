#!/usr/bin/env bash
# Usage: expect_mutant_caught.sh CHECK_PROGRAM MUTANT_DIFF
#
# CHECK_PROGRAM is an exercise's checks linked with the solution changed by MUTANT_DIFF, one
# mistake a learner makes. Passes when at least one check fails, or the program crashes with
# a report naming the check that was running; fails, naming the mistake, when every check
# passes (the checks would let it through), when a crash names no check, or when the program
# is still running after the time limit (a learner would see `./workbook check` hang).
set -u
program=$1 source=$2
limit=${ATTN_CHECK_TIME_LIMIT:-30}
mistake=$(sed -n '1s|^mistake: *||p' "$source")
[ -n "$mistake" ] || { echo "$source: the first line must be 'mistake: <what is wrong>'"; exit 1; }
output=$(timeout -k 5 "$limit" "$program" --no-intro --no-version 2>&1)
status=$?
if [ $status = 0 ]; then
  echo "every check passes on ${source##*/checks/}: \"$mistake\" is not caught"
  exit 1
fi
if [ $status = 124 ] || [ $status = 137 ]; then
  printf '%s\n' "$output" | tail -5
  echo "the checks were still running after $limit s on ${source##*/checks/}: \"$mistake\" makes them hang"
  exit 1
fi
if [ $status -gt 128 ]; then
  check=$(printf '%s\n' "$output" |
          awk '/^TEST CASE:/ { t = $0; sub(/^TEST CASE: +/, "", t) } /test case CRASHED:/ { print t; exit }')
  if [ -z "$check" ]; then
    printf '%s\n' "$output" | tail -5
    echo "the program crashed (signal $((status - 128))) without naming the check that was running"
    exit 1
  fi
  echo "caught (crash, signal $((status - 128)), in the check \"$check\"): $mistake"
  exit 0
fi
failed=$(printf '%s\n' "$output" | sed -n 's/^\[doctest\] test cases:.*| *\([0-9]*\) failed.*/\1/p')
if [ "${failed:-0}" -gt 0 ]; then
  echo "caught by $failed failing check(s): $mistake"
  exit 0
fi
# Not a check's verdict (the program did not start, or doctest refused its arguments).
printf '%s\n' "$output" | tail -5
echo "$program exited with status $status without a failing check"
exit 1
