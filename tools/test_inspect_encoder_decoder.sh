#!/usr/bin/env bash
# Usage: test_inspect_encoder_decoder.sh INSPECT_ATTENTION LESSON_17
#
# The attention inspector on lesson 17's encoder-decoder: lesson 17's quick run writes a
# checkpoint; bad input (a character outside the model's vocabulary, an input longer than
# max_source, an empty one, a damaged checkpoint) gets one line and a non-zero exit; a good
# input gives a page whose data holds the three attentions with the right shapes: one row per
# written character over the input's characters for cross-attention, the input over itself
# for the encoder, and causal rows for the decoder, every row a distribution.
set -u
program=$1 lesson=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
. "$(dirname "$0")/one_line_errors.sh"  # expect_one_line DESCRIPTION ARGS...
if ! "$lesson" --quick --figures "$tmp/figures" >/dev/null 2>"$tmp/lesson.err"; then
  echo "FAIL: lesson 17's quick run failed:"; cat "$tmp/lesson.err"; exit 1
fi
model=$tmp/figures/lesson17_model
[ -f "$model/config.json" ] || { echo "FAIL: lesson 17 wrote no checkpoint at $model"; exit 1; }
page=(--out "$tmp/page")
expect_one_line "an input with a character outside the vocabulary" "$model" --prompt "23 Qx 2026" "${page[@]}"
expect_one_line "an input longer than max_source (32)" "$model" --prompt "$(printf '23 November 2026 %.0s' 1 2)" "${page[@]}"
expect_one_line "an empty input" "$model" --prompt "" "${page[@]}"
cp -r "$model" "$tmp/damaged"
rm "$tmp/damaged/transformer.encoder.norm.weight.npy"
expect_one_line "a checkpoint with a parameter missing" "$tmp/damaged" "${page[@]}"

input="23 Nov 2026"
if "$program" "$model" --prompt "$input" "${page[@]}" >"$tmp/out" 2>"$tmp/err"; then
  grep -qx "$tmp/page/index.html" "$tmp/out" || { echo "FAIL: it did not print where the page is:"; cat "$tmp/out"; status=1; }
  python3 - "$tmp/page/attention_data.js" "$input" <<'PY' || status=1
import json, math, sys
text = open(sys.argv[1]).read()
data = json.loads(text[text.index("=") + 1:].strip().rstrip(";"))
S = len(sys.argv[2])
assert data["kind"] == "encoder_decoder"
assert "".join(data["source"]) == sys.argv[2], data["source"]
T = len(data["written"])
assert data["written"][-1] == "<eos>" and data["decoder_input"][0] == "<bos>"
assert len(data["decoder_input"]) == T, "the decoder read <bos> + what it wrote, one query per written token"
names = [a["name"] for a in data["attentions"]]
assert names == ["cross-attention", "encoder self-attention", "decoder self-attention"], names
shapes = {"cross-attention": (T, lambda i: S), "encoder self-attention": (S, lambda i: S),
          "decoder self-attention": (T, lambda i: i + 1)}
for a in data["attentions"]:
    rows, keys = shapes[a["name"]]
    layers = data["n_encoder_layer"] if a["name"].startswith("encoder") else data["n_decoder_layer"]
    assert len(a["weights"]) == layers, (a["name"], len(a["weights"]))
    for l, heads in enumerate(a["weights"]):
        assert len(heads) == data["n_head"]
        for h, grid in enumerate(heads):
            assert len(grid) == rows, f'{a["name"]} layer {l} head {h}: {len(grid)} rows, expected {rows}'
            for i, row in enumerate(grid):
                assert len(row) == keys(i), f'{a["name"]} row {i}: {len(row)} keys, expected {keys(i)}'
                assert abs(sum(row) - 1) < 1e-3 and min(row) >= 0, f'{a["name"]} row {i} is not a distribution'
            mean = sum(-sum(w * math.log(w) for w in row if w > 0) for row in grid) / rows
            assert abs(mean - a["entropy"][l][h]) < 5e-3, (mean, a["entropy"][l][h])
print(f"ok: input of {S} characters, {T} written: cross-attention {T}x{S}, encoder {S}x{S}, causal decoder {T}x{T}")
PY
else
  echo "FAIL: inspecting lesson 17's checkpoint failed:"; cat "$tmp/err"; status=1
fi
exit $status
