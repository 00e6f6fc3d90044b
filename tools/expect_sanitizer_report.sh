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
#
# ERROR "xtensor index out of bounds" is xtensor's own index check instead (the sanitizer
# builds have XTENSOR_ENABLE_ASSERT): an index past an axis is thrown as an exception, the
# check fails without a crash, and checks/support/main.cpp prints the stack where it was
# thrown, which must name a line of MUTATED_SOURCE. Such a write can stay inside the buffer
# (another row, or the one element of a length-1 axis, whose stride is 0), where no
# AddressSanitizer would see it, and fail the checks in release without crashing.
#
# ERROR "libstdc++ index out of bounds" is libstdc++'s check of std::vector's and
# std::array's operator[] (_GLIBCXX_ASSERTIONS), which aborts before AddressSanitizer would
# see the access; the stack of the abort must name a line of MUTATED_SOURCE.
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
if [ "$error" = "libstdc++ index out of bounds" ]; then
  # An index past a std::vector's (or std::array's) end: libstdc++'s own check
  # (_GLIBCXX_ASSERTIONS, in the sanitizer builds) aborts before the access, naming the
  # container, and checks/support/main.cpp prints the stack where the program aborted.
  marker='^The stack where the program aborted:' ends='test case CRASHED:'
  grep -q "Assertion '__n < this->size()' failed" <<<"$output" || fail "no libstdc++ index assertion"
  grep -q "$marker" <<<"$output" || fail "no stack of the abort"
  found="libstdc++'s index check"
elif [ "$error" = "xtensor index out of bounds" ]; then
  marker='^The stack where xtensor found an index out of bounds:' ends='is out of bounds for axis'
  grep -q "$marker" <<<"$output" || fail "no stack of xtensor's index check"
  found="xtensor's index check"
else
  marker="ERROR: AddressSanitizer: $error" ends='test case CRASHED:'
  grep -q "$marker" <<<"$output" || fail "no \"AddressSanitizer: $error\" report"
  found="AddressSanitizer: $error"
fi
frame=$(printf '%s\n' "$output" | sed -n "/$marker/,\$p" |
        grep -E -m1 "^ +#[0-9]+ 0x[0-9a-f]+ in .*/${mutated##*/}:[0-9]+")
[ -n "$frame" ] || fail "the stack names no line of ${mutated##*/}"
at=$(printf '%s\n' "$frame" | grep -oE "[^ ]*/${mutated##*/}:[0-9]+")
check=$(printf '%s\n' "$output" |
        awk -v ends="$ends" '/^TEST CASE:/ { t = $0; sub(/^TEST CASE: +/, "", t) } $0 ~ ends { print t; exit }')
[ -n "$check" ] || fail "the report names no check"
echo "ended in $seconds s (status $status) with $found"
echo "  at ${at#"${mutated%/*/*}"/}: $(sed -n "${at##*:}{s/^ *//;p}" "$mutated")"
echo "  in the check \"$check\""
