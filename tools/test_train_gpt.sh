#!/usr/bin/env bash
# Usage: test_train_gpt.sh TRAIN_GPT
#
# Feeds train_gpt bad flags and bad files and checks each answer: a non-zero exit status and
# exactly one line on stderr (no usage dump, no stack of templates, no crash).
set -u
program=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf 'the cat sat on the mat. %.0s' $(seq 200) > "$tmp/corpus.txt"
: > "$tmp/empty.txt"
printf 'abc\0def' > "$tmp/binary.txt"
printf 'caf\xe9 au lait\n' > "$tmp/latin1.txt"
head -c 100 "$tmp/corpus.txt" > "$tmp/short.txt"
mkdir -p "$tmp/not_a_checkpoint"
status=0
. "$(dirname "$0")/one_line_errors.sh"  # expect_one_line DESCRIPTION ARGS...
tiny=(--recipe tiny --data "$tmp/corpus.txt" --out "$tmp/run")
expect_one_line "an unknown flag" --frobnicate
expect_one_line "an unknown recipe" --recipe huge
expect_one_line "a negative step count" --max-iters -5
expect_one_line "a step count that is not a number" --max-iters many
expect_one_line "the CUDA device" --device cuda
expect_one_line "an unknown attention" --attention sparse
expect_one_line "an unknown position scheme" --position sinusoidal
expect_one_line "RoPE on the GPU" --position rope --device cuda
expect_one_line "the fused attention with ALiBi" "${tiny[@]}" --position alibi --attention fused
expect_one_line "key/value heads that do not divide the heads" "${tiny[@]}" --kv-heads 3
expect_one_line "zero key/value heads" --kv-heads 0
expect_one_line "a window of zero" --window 0
expect_one_line "grouped keys and values on the GPU" --kv-heads 1 --device cuda
expect_one_line "a window on the GPU" --window 16 --device cuda
expect_one_line "a missing corpus" --data "$tmp/nowhere.txt"
expect_one_line "an empty corpus" --data "$tmp/empty.txt"
expect_one_line "a binary corpus" --data "$tmp/binary.txt"
expect_one_line "a corpus that is not UTF-8" --data "$tmp/latin1.txt"
expect_one_line "a folder as the corpus" --data "$tmp"
expect_one_line "a corpus too short for the block" --data "$tmp/short.txt" --max-iters 2
expect_one_line "resuming from nothing" "${tiny[@]}" --resume "$tmp/nowhere"
expect_one_line "starting from a folder that holds no weights" "${tiny[@]}" --init "$tmp/not_a_checkpoint"
expect_one_line "a temperature of zero" "${tiny[@]}" --max-iters 2 --sample 10 --temperature 0
expect_one_line "a prompt outside the vocabulary" "${tiny[@]}" --max-iters 2 --sample 10 --prompt "QX"
expect_one_line "top-k above the vocabulary size" "${tiny[@]}" --max-iters 2 --sample 10 --top-k 1000
RANK=1 WORLD_SIZE=2 expect_one_line "torchrun's RANK and WORLD_SIZE without an MPI launcher" "${tiny[@]}" --max-iters 2
LOCAL_RANK=0 expect_one_line "torchrun's LOCAL_RANK alone" "${tiny[@]}" --max-iters 2
expect_one_line "a learning rate that makes the loss infinite" "${tiny[@]}" --learning-rate 1e30 --sample 0
rm -rf "$tmp/run"  # the diverged run's step-0 checkpoint
# A good run; a second run into its folder is refused and leaves it as it was, --overwrite
# replaces it; then a checkpoint with a truncated tensor.
if "$program" "${tiny[@]}" --max-iters 3 --sample 0 >/dev/null 2>&1; then
  before=$(cat "$tmp/run/checkpoint"/* "$tmp/run/metrics.jsonl" | sha256sum)
  expect_one_line "a new run into a folder that holds a run" "${tiny[@]}" --max-iters 2 --sample 0
  [ "$(cat "$tmp/run/checkpoint"/* "$tmp/run/metrics.jsonl" | sha256sum)" = "$before" ] ||
    { echo "FAIL: the refused run changed the run already there"; status=1; }
  expect_one_line "--overwrite with --resume" --data "$tmp/corpus.txt" --resume "$tmp/run" --overwrite
  if "$program" "${tiny[@]}" --max-iters 3 --sample 0 --overwrite >/dev/null 2>&1; then
    echo "ok: --overwrite replaces the run"
  else
    echo "FAIL: --overwrite did not replace the run"; status=1
  fi
  f=$(ls "$tmp/run/checkpoint"/transformer.wte.weight.npy)
  head -c 100 "$f" > "$f.cut" && mv "$f.cut" "$f"
  expect_one_line "a truncated weight file" --data "$tmp/corpus.txt" --resume "$tmp/run"
  # Weights holding a NaN (the last value of ln_f's weight): refused when they are loaded,
  # before a loss is computed and written as null.
  small=(--recipe tiny --data "$tmp/corpus.txt" --max-iters 1 --sample 0)
  "$program" "${small[@]}" --out "$tmp/nan_run" >/dev/null 2>&1
  w="$tmp/nan_run/checkpoint/transformer.ln_f.weight.npy"
  printf '\000\000\300\177' | dd of="$w" bs=1 seek=$(( $(stat -c %s "$w") - 4 )) conv=notrunc 2>/dev/null
  expect_one_line "weights holding a NaN" "${small[@]}" --init "$tmp/nan_run/checkpoint" --out "$tmp/nan_out"
  if grep -qs null "$tmp/nan_out/metrics.jsonl"; then echo "FAIL: weights holding a NaN: null in metrics.jsonl"; status=1; fi
else
  echo "FAIL: a 3-step tiny run failed"; status=1
fi
exit $status
