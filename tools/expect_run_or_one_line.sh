#!/usr/bin/env bash
# Usage: expect_run_or_one_line.sh PROGRAM ARGS...
#
# Passes when PROGRAM ARGS exits 0, or refuses cleanly: exit status 1 or 2 (not a signal,
# not a sanitizer's abort) with exactly one line on stderr, saying why.
set -u
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$@" >"$tmp/out" 2>"$tmp/err"
rc=$?
lines=$(wc -l <"$tmp/err")
if [ $rc -eq 0 ]; then
  echo "ran to the end (exit 0)"
elif { [ $rc -eq 1 ] || [ $rc -eq 2 ]; } && [ "$lines" -eq 1 ]; then
  echo "refused in one line: $(cat "$tmp/err")"
else
  echo "FAIL: exit $rc, $lines lines on stderr:"; cat "$tmp/err"; tail -5 "$tmp/out"; exit 1
fi
