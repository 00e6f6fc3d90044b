# Sourced by the tests of the programs' answers to bad input (test_train_gpt.sh,
# test_inspect_attention.sh). Expects $program (the program under test) and $tmp (a scratch
# folder) to be set, and status=0; expect_one_line sets status=1 on a failure.
#
# expect_one_line DESCRIPTION ARGS...: runs $program ARGS and passes when it exits non-zero
# (not by a signal) with exactly one line on stderr: no usage dump, no stack of templates.
expect_one_line() {
  local what=$1; shift
  "$program" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$? lines
  lines=$(wc -l <"$tmp/err")
  if [ $rc -eq 0 ] || [ $rc -ge 128 ] || [ "$lines" -ne 1 ]; then
    echo "FAIL: $what: exit $rc, $lines lines on stderr:"; cat "$tmp/err"; status=1
  else
    echo "ok: $what: $(cat "$tmp/err")"
  fi
}
