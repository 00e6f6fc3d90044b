#!/usr/bin/env bash
# Usage: expect_sanitizer_report.sh CHECK_PROGRAM MUTANT_DIFF MUTATED_SOURCE ERROR
#
# CHECK_PROGRAM is an exercise's checks, built with AddressSanitizer, linked with the
# solution changed by MUTANT_DIFF (written out as MUTATED_SOURCE), a mistake that writes
# out of bounds. Run as `./workbook check NN` runs the debug checks, it must end within the
# time limit with AddressSanitizer's report of ERROR (such as heap-buffer-overflow), a
# stack frame at a line of MUTATED_SOURCE (the learner's file) and the name of the check
# that was running. Before the crash report of checks/support/main.cpp, a heap corrupted
# this way could make the checks hang for ever instead.
set -u
program=$1 source=$2 mutated=$3 error=$4
limit=${ATTN_CHECK_TIME_LIMIT:-30}
mistake=$(sed -n '1s|^mistake: *||p' "$source")
start=$SECONDS
output=$(ASAN_OPTIONS=abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:abort_on_error=1 \
         timeout -k 5 "$limit" "$program" --no-intro --no-version 2>&1)
status=$?
seconds=$((SECONDS - start))
fail() { printf '%s\n' "$output" | tail -30; echo "${source##*/checks/} (\"$mistake\"): $*"; exit 1; }
[ $status = 124 ] || [ $status = 137 ] && fail "still running after $limit s: the checks hang"
[ $status = 0 ] && fail "every check passed and the sanitizer reported nothing"
grep -q "ERROR: AddressSanitizer: $error" <<<"$output" ||
  fail "no \"AddressSanitizer: $error\" report"
frame=$(printf '%s\n' "$output" | grep -E -m1 "^ +#[0-9]+ 0x[0-9a-f]+ in .*/${mutated##*/}:[0-9]+")
[ -n "$frame" ] || fail "the sanitizer's stack names no line of ${mutated##*/}"
at=$(printf '%s\n' "$frame" | grep -oE "[^ ]*/${mutated##*/}:[0-9]+")
check=$(printf '%s\n' "$output" |
        awk '/^TEST CASE:/ { t = $0; sub(/^TEST CASE: +/, "", t) } /test case CRASHED:/ { print t; exit }')
[ -n "$check" ] || fail "the crash report names no check"
echo "ended in $seconds s (status $status) with AddressSanitizer: $error"
echo "  at ${at#"${mutated%/*/*}"/}: $(sed -n "${at##*:}{s/^ *//;p}" "$mutated")"
echo "  in the check \"$check\""
