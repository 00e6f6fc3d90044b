#!/usr/bin/env bash
# Usage: expect_variant_passes.sh CHECK_PROGRAM VARIANT_DIFF
#
# CHECK_PROGRAM is an exercise's checks linked with the solution rewritten by VARIANT_DIFF, a
# correct solution written another way. Passes when every check passes; otherwise prints the
# failing checks and names the variant: a check that rejects a right answer would send a
# learner who wrote it looking for a mistake that is not there.
set -u
program=$1 source=$2
. "${BASH_SOURCE[0]%/*}/run_catalogue_entry.sh"
run_catalogue_entry variant "$program" "$source"
variant=$title
if [ $status = 0 ]; then
  echo "every check passes on ${source##*/checks/}: $variant"
  exit 0
fi
printf '%s\n' "$output" | tail -30
if [ $status = 124 ] || [ $status = 137 ]; then
  echo "the checks were still running after $limit s on ${source##*/checks/}: $variant"
else
  echo "a check rejects ${source##*/checks/}, a correct solution ($variant): exit status $status"
fi
exit 1
