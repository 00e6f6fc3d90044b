#!/usr/bin/env bash
# Usage: expect_compile_error.sh COMPILER INCLUDE_DIR SOURCE LINE PATTERN
#
# SOURCE must fail to compile, with an error at LINE of SOURCE whose text matches PATTERN:
# a mistake the course turns into a compile error (rather than a run-time surprise) stays one.
set -u
compiler=$1 include=$2 source=$3 line=$4 pattern=$5
output=$("$compiler" -std=c++17 -fsyntax-only -I"$include" "$source" 2>&1)
if [ $? = 0 ]; then
  echo "${source##*/} compiles, but must not: $(sed -n 1p "$source")"
  exit 1
fi
if ! grep -E "${source##*/}:$line:[0-9]+: error: .*$pattern" <<<"$output" >/dev/null; then
  printf '%s\n' "$output" | head -5
  echo "${source##*/} fails to compile, but not with an error at line $line matching \"$pattern\""
  exit 1
fi
echo "${source##*/}:$line: error: $(grep -oE "error: .{0,60}" <<<"$output" | head -1 | cut -c8-)…"
