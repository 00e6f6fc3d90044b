# Sourced by expect_mutant_caught.sh and expect_variant_passes.sh: runs CHECK_PROGRAM, an
# exercise's checks linked with the solution changed by the catalogue entry SOURCE (a diff
# whose first line is `KIND: <what it is>`), as `./workbook check` runs it, within the time
# limit. Sets `title` (the text after `KIND:`), `output` (what the checks printed) and
# `status` (their exit status; 124 or 137 when stopped at the limit).
# Usage: run_catalogue_entry KIND CHECK_PROGRAM SOURCE
run_catalogue_entry() {
  local kind=$1 program=$2 source=$3
  limit=${ATTN_CHECK_TIME_LIMIT:-30}
  title=$(sed -n "1s|^$kind: *||p" "$source")
  if [ -z "$title" ]; then
    echo "$source: the first line must be '$kind: <what it is>'"
    exit 1
  fi
  output=$(timeout -k 5 "$limit" "$program" --no-intro --no-version 2>&1)
  status=$?
}
