#!/usr/bin/env bash
# Usage: expect_mutant_caught.sh CHECK_PROGRAM MUTANT_DIFF
#
# CHECK_PROGRAM is an exercise's checks linked with the solution changed by MUTANT_DIFF, one
# mistake a learner makes. Passes when at least one check fails, or the program crashes with
# a report naming the check that was running; fails, naming the mistake, when every check
# passes (the checks would let it through), when a crash names no check, or when the program
# is still running after the time limit (a learner would see `./workbook check` hang).
# Each `says: <text>` line among the diff's header lines is text the checks' output must
# contain when they catch it: the message that tells the learner which mistake it is.
set -u
program=$1 source=$2
. "${BASH_SOURCE[0]%/*}/run_catalogue_entry.sh"
run_catalogue_entry mistake "$program" "$source"
mistake=$title
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
  while IFS= read -r said; do
    if ! grep -q -F -- "$said" <<<"$output"; then
      printf '%s\n' "$output" | grep -E -A4 ': ERROR: ' | head -20
      echo "caught on ${source##*/checks/}, but no failure says \"$said\""
      exit 1
    fi
  done < <(sed -n '/^--- /q; s/^says: *//p' "$source")
  echo "caught by $failed failing check(s): $mistake"
  exit 0
fi
# Not a check's verdict (the program did not start, or doctest refused its arguments).
printf '%s\n' "$output" | tail -5
echo "$program exited with status $status without a failing check"
exit 1
