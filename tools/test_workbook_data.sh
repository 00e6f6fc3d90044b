#!/usr/bin/env bash
# Usage: test_workbook_data.sh COURSE_ROOT
#
# `./workbook data` in a scratch course (the workbook script and the corpus, committed to a
# git repository of their own, so the real checkout is never touched): a deleted corpus is
# restored from git; a changed one is replaced only after asking (refused without a
# terminal, replaced with --yes after a backup of the changed copy); a file that is not tiny
# shakespeare is refused as a source.
set -u
root=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
course=$tmp/course
mkdir -p "$course/data"
cp "$root/workbook" "$course/"
cp "$root/data/tinyshakespeare.txt" "$course/data/"
cp "$root/.gitattributes" "$course/"
git -C "$course" init -q
git -C "$course" -c user.name=t -c user.email=t@t add -A
git -C "$course" -c user.name=t -c user.email=t@t commit -q -m corpus
corpus=$course/data/tinyshakespeare.txt
original=$(sha256sum "$corpus" | cut -d' ' -f1)
status=0
fail() { echo "FAIL: $*"; status=1; }
sum() { sha256sum "$1" | cut -d' ' -f1; }

out=$("$course/workbook" data </dev/null 2>&1) || fail "an intact corpus: $out"
case $out in *"checksum ok"*) echo "ok: intact: $out" ;; *) fail "intact: $out" ;; esac

rm "$corpus"
out=$("$course/workbook" data </dev/null 2>&1) || fail "a deleted corpus: $out"
[ "$(sum "$corpus")" = "$original" ] && echo "ok: deleted, restored: $out" || fail "deleted: not restored ($out)"

echo "my own line" >>"$corpus"
edited=$(sum "$corpus")
out=$("$course/workbook" data </dev/null 2>&1) && fail "a changed corpus without a terminal was replaced"
[ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] || fail "a changed corpus: more than one line: $out"
[ "$(sum "$corpus")" = "$edited" ] && echo "ok: changed, left as it is without asking: $out" ||
  fail "a changed corpus was overwritten without asking"

out=$("$course/workbook" data --yes </dev/null 2>&1) || fail "data --yes: $out"
[ "$(sum "$corpus")" = "$original" ] || fail "data --yes did not restore the corpus"
backup=$(ls "$course/.workbook/backups/"tinyshakespeare-*.txt 2>/dev/null | head -n1)
[ -n "$backup" ] && [ "$(sum "$backup")" = "$edited" ] && echo "ok: --yes: backed up, then restored: $out" ||
  fail "data --yes: the changed copy was not backed up"

printf 'not shakespeare\n' >"$tmp/other.txt"
rm "$corpus"
out=$("$course/workbook" data "$tmp/other.txt" </dev/null 2>&1) && fail "another text was accepted as tiny shakespeare"
[ ! -e "$corpus" ] && echo "ok: another text refused: $out" || fail "another text was copied"
exit $status
