#!/usr/bin/env bash
# Usage: test_inspect_attention.sh INSPECT_ATTENTION TRAIN_GPT
#
# Feeds inspect_attention bad input and checks each answer: a non-zero exit status and
# exactly one line on stderr. Then inspects a small trained model and checks the page's
# data: one row of weights per layer, head and query, each over the keys 0..query, summing to 1.
set -u
program=$1 train_gpt=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf 'the cat sat on the mat. %.0s' $(seq 200) > "$tmp/corpus.txt"
mkdir -p "$tmp/not_a_checkpoint"
status=0
. "$(dirname "$0")/one_line_errors.sh"  # expect_one_line DESCRIPTION ARGS...
if ! "$train_gpt" --recipe tiny --max-iters 3 --sample 0 --data "$tmp/corpus.txt" --out "$tmp/run" \
     >/dev/null 2>"$tmp/train.err"; then
  echo "FAIL: a 3-step tiny run failed:"; cat "$tmp/train.err"; exit 1
fi
page=(--out "$tmp/page")
expect_one_line "no such checkpoint" "$tmp/nowhere" "${page[@]}"
expect_one_line "a folder that holds no checkpoint" "$tmp/not_a_checkpoint" "${page[@]}"
expect_one_line "a prompt outside the vocabulary" "$tmp/run" --prompt "the QX" "${page[@]}"
expect_one_line "a prompt longer than the block (32)" "$tmp/run" --prompt "$(printf 'the cat %.0s' $(seq 5))" "${page[@]}"
expect_one_line "an empty prompt" "$tmp/run" --prompt "" "${page[@]}"
expect_one_line "no output folder" "$tmp/run" --prompt "the cat"
expect_one_line "an unknown flag" "$tmp/run" --frobnicate "${page[@]}"

prompt="the cat sat on the mat"
if "$program" "$tmp/run" --prompt "$prompt" "${page[@]}" >"$tmp/out" 2>"$tmp/err"; then
  for f in index.html inspector.js inspector.css attention_data.js; do
    [ -s "$tmp/page/$f" ] || { echo "FAIL: the page has no $f"; status=1; }
  done
  grep -qx "$tmp/page/index.html" "$tmp/out" || { echo "FAIL: it did not print where the page is:"; cat "$tmp/out"; status=1; }
  python3 - "$tmp/page/attention_data.js" "${#prompt}" <<'PY' || status=1
import json, math, sys
text = open(sys.argv[1]).read()
data = json.loads(text[text.index("=") + 1:].strip().rstrip(";"))
T = int(sys.argv[2])
assert (data["n_layer"], data["n_head"]) == (2, 2), (data["n_layer"], data["n_head"])
assert len(data["prompt"]) == T and len(data["weights"]) == 2, "one list of heads per layer"
for l, heads in enumerate(data["weights"]):
    assert len(heads) == 2
    for h, rows in enumerate(heads):
        assert len(rows) == T, f"layer {l} head {h}: {len(rows)} queries, expected {T}"
        for i, row in enumerate(rows):
            assert len(row) == i + 1, f"query {i} sees {len(row)} keys, expected {i + 1}"
            assert abs(sum(row) - 1) < 1e-3 and min(row) >= 0, f"row {i} is not a distribution: {row}"
        # the head's mean entropy, recomputed from the rows it summarises
        mean = sum(-sum(w * math.log(w) for w in row if w > 0) for row in rows) / T
        # the page keeps 4 decimals of each weight: the recomputed mean can differ by ~1e-3
        assert abs(mean - data["entropy"][l][h]) < 5e-3, (mean, data["entropy"][l][h])
print(f"ok: a {T}-character prompt: 2 layers x 2 heads of causal rows summing to 1, entropies agree")
PY
else
  echo "FAIL: inspecting a good checkpoint failed:"; cat "$tmp/err"; status=1
fi
exit $status
