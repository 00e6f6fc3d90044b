#!/usr/bin/env bash
# Usage: test_checkpoint_kills.sh TRAIN_GPT
#
# Kills train_gpt (SIGKILL, through the test-only ATTN_CHECKPOINT_FAULT) at each point of its
# second checkpoint save, with the atomic exchange and with the two renames a file system
# without it takes, then resumes the run: each must end with the losses, gradient norms and
# evaluations of the same run never killed, and with nothing but the checkpoint in the folder.
set -u
program=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf 'the cat sat on the mat. %.0s' $(seq 200) > "$tmp/corpus.txt"
run=(--recipe tiny --data "$tmp/corpus.txt" --max-iters 6 --eval-interval 2 --sample 0)
# Each line of metrics.jsonl without its time: what must not change.
numbers() { sed -E 's/,?"ms":[0-9.e+-]+//' "$1/metrics.jsonl"; }
"$program" "${run[@]}" --out "$tmp/whole" >/dev/null 2>&1 || { echo "FAIL: the uninterrupted run failed"; exit 1; }
status=0
for exchange in yes no; do
  for point in written synced stepped-aside swapped; do
    out="$tmp/killed-$point-$exchange"
    # (in a subshell whose stderr is dropped: bash's own "Killed" notice)
    (ATTN_CHECKPOINT_FAULT="$point:2" ATTN_CHECKPOINT_NO_EXCHANGE=$([ $exchange = no ] && echo 1 || echo 0) \
      "$program" "${run[@]}" --out "$out" >"$tmp/log" 2>&1; exit $?) 2>/dev/null
    killed=$?
    what="killed at '$point' of the second save (atomic exchange: $exchange, exit status $killed)"
    if [ $killed = 0 ] && ! { [ $point = stepped-aside ] && [ $exchange = yes ]; }; then
      echo "FAIL: not $what: the fault point was never reached"; status=1; continue
    fi
    if ! "$program" --resume "$out" --data "$tmp/corpus.txt" --sample 0 >"$tmp/log" 2>&1; then
      echo "FAIL: $what, --resume failed:"; tail -3 "$tmp/log"; status=1; continue
    fi
    if [ "$(numbers "$out")" != "$(numbers "$tmp/whole")" ]; then
      echo "FAIL: $what, the resumed run's metrics differ from the uninterrupted run's:"
      diff <(numbers "$tmp/whole") <(numbers "$out") | head -5; status=1; continue
    fi
    left=$(ls -A "$out" | grep '^\.checkpoint' || true)
    if [ -n "$left" ]; then echo "FAIL: $what, left beside the checkpoint: $left"; status=1; continue; fi
    echo "ok: $what, resumed with the same metrics"
  done
done
exit $status
