#!/usr/bin/env bash
# Usage: test_train_gpt_recompute.sh TRAIN_GPT
#
# train_gpt --recompute: its refusals (one line on stderr, a non-zero exit), then runs of the
# tiny recipe with dropout that keep everything, recompute the attention or recompute whole
# blocks: the same losses and the same weight files, byte for byte; a resumed run keeps its
# mode (trainer.json).
set -u
program=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf 'the cat sat on the mat. %.0s' $(seq 200) > "$tmp/corpus.txt"
status=0
. "$(dirname "$0")/one_line_errors.sh"  # expect_one_line DESCRIPTION ARGS...
tiny=(--recipe tiny --data "$tmp/corpus.txt" --dropout 0.1 --eval-interval 2 --eval-iters 2 --sample 0)
expect_one_line "an unknown recomputation" "${tiny[@]}" --out "$tmp/bad" --recompute layers
# On the GPU (cuda in a build with one, sim in a build with the CUDA simulator): the one that
# this build can run refuses the recomputation itself.
named=0
for device in cuda sim; do
  expect_one_line "recomputation on --device $device" "${tiny[@]}" --out "$tmp/bad" --recompute blocks --device "$device"
  grep -q -- "--recompute blocks" "$tmp/err" && named=1
done
[ $named = 1 ] || { echo "FAIL: no device refused --recompute by name"; status=1; }
"$program" "${tiny[@]}" --max-iters 1 --out "$tmp/one" >/dev/null 2>&1
expect_one_line "--recompute with --resume (the run keeps its own)" --data "$tmp/corpus.txt" --resume "$tmp/one" --recompute blocks

# The losses of metrics.jsonl, one a line (the timings differ from run to run).
losses() { grep -o '"loss":[^,}]*\|"train_loss":[^,}]*\|"val_loss":[^,}]*' "$1/metrics.jsonl"; }
weights() { (cd "$1/checkpoint" && cat ./*.npy | sha256sum); }
for mode in none attention blocks; do
  if ! "$program" "${tiny[@]}" --max-iters 4 --recompute "$mode" --out "$tmp/$mode" >"$tmp/$mode.out" 2>&1; then
    echo "FAIL: --recompute $mode: the run failed:"; cat "$tmp/$mode.out"; status=1
  fi
done
for mode in attention blocks; do
  if [ -n "$(losses "$tmp/none")" ] && [ "$(losses "$tmp/$mode")" = "$(losses "$tmp/none")" ] &&
     [ "$(weights "$tmp/$mode")" = "$(weights "$tmp/none")" ]; then
    echo "ok: --recompute $mode: the losses and weights of --recompute none, byte for byte"
  else
    echo "FAIL: --recompute $mode: not the losses and weights of --recompute none"; status=1
  fi
  grep -q "\"recompute\": *\"$mode\"" "$tmp/$mode/checkpoint/trainer.json" ||
    { echo "FAIL: --recompute $mode is not in trainer.json"; status=1; }
done

# Run for 2 steps, then resumed to 4: the mode comes from trainer.json, and the weights are
# those of the same two runs without recomputation.
for mode in none blocks; do
  "$program" "${tiny[@]}" --max-iters 2 --recompute "$mode" --out "$tmp/resumed_$mode" >/dev/null 2>&1
  "$program" --data "$tmp/corpus.txt" --resume "$tmp/resumed_$mode" --max-iters 4 --sample 0 \
    >"$tmp/resumed_$mode.out" 2>&1
done
if grep -q "recompute blocks" "$tmp/resumed_blocks.out" &&
   grep -q '"recompute": *"blocks"' "$tmp/resumed_blocks/checkpoint/trainer.json" &&
   [ -n "$(losses "$tmp/resumed_none")" ] && [ "$(losses "$tmp/resumed_blocks")" = "$(losses "$tmp/resumed_none")" ] &&
   [ "$(weights "$tmp/resumed_blocks")" = "$(weights "$tmp/resumed_none")" ]; then
  echo "ok: a resumed run recomputes blocks as it did, to the losses and weights of none"
else
  echo "FAIL: the resumed run:"; cat "$tmp/resumed_blocks.out"; status=1
fi
exit $status
