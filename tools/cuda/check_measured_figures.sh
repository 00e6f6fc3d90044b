#!/usr/bin/env bash
# Usage: tools/cuda/check_measured_figures.sh SOURCE_DIR
#
# The GPU figures lesson 12's page quotes are the ones its programs printed on that GPU: each
# is read here from the committed logs of each lease and looked for, as printed, in the page.
set -euo pipefail
src=$1
page="$src/lessons/12_training_gpu/lesson.md"
status=0
for dir in "$src"/tools/cuda/measured/2026-11-26-h200 "$src"/tools/cuda/measured/2026-11-26-h200-second \
           "$src"/tools/cuda/measured/2026-11-26-h100; do
  ours=$(sed -n 's/^ours: \([0-9.]*\) ms\/iter.*/\1/p' "$dir/race-tf32.log")
  torch=$(sed -n 's/^pytorch: \([0-9.]*\) ms\/iter.*/\1/p' "$dir/race-tf32.log")
  ratio=$(sed -n 's/^ratio: ours takes \([0-9.]*\)x.*/\1/p' "$dir/race-tf32.log")
  for figure in "$ours ms" "$torch ms" "$ratio times"; do
    if [ -z "${figure%% *}" ]; then echo "no figure in $dir/race-tf32.log"; exit 1; fi
    if ! tr '\n' ' ' < "$page" | grep -qF "$figure"; then
      echo "lesson 12's page does not quote '$figure' from $dir/race-tf32.log"; status=1
    fi
  done
  card=$(basename "$dir" | sed -n 's/^[0-9-]*-\(h[0-9]*\).*/\1/p' | tr a-z A-Z)
  grep -q "NVIDIA $card" "$dir/race-tf32.log" || { echo "$dir/race-tf32.log names no $card"; status=1; }
  [ $status -eq 0 ] && echo "lesson 12 quotes $(basename "$dir"): ours $ours ms, PyTorch $torch ms, ${ratio}x"
done
# Lesson 13: the fused backward at hs 128, T = 4096 on two grids and by key tiles, forward
# and backward in ms to one decimal, from the row "4096 4 16 fused" of each log.
page13="$src/lessons/13_fused_attention/lesson.md"
m="$src/tools/cuda/measured"
for log in "$m/2026-11-26-h200-two-grids/attention-hs128.log" "$m/2026-11-26-h200-second/attention-hs128.log" \
           "$m/2026-11-26-h100/attention-hs128.log"; do
  ms=$(awk '$1 == 4096 && $4 == "fused" {printf "%.1f", $7}' "$log")
  if [ -z "$ms" ]; then echo "no T = 4096 fused row in $log"; status=1; continue; fi
  if tr '\n' ' ' < "$page13" | grep -qF "$ms ms"; then
    echo "lesson 13 quotes $ms ms from $log"
  else
    echo "lesson 13's page does not quote '$ms ms' from $log"; status=1
  fi
done
# Lessons 13 and 18: the performance model against measurement on the H200, the forward's
# measured ms, the H100 bound and their ratio as attention_bench and half_attention_bench
# print them.
mm="$m/2026-11-27-h200-model"
quote() {  # quote PAGE LOG AWK-CONDITION WHAT FIELD: the row's measured ms, bound and ratio from FIELD on
  local figures
  figures=$(awk -v f="$5" "$3 {print \$f, \$(f + 1), \$(f + 2)}" "$2" | head -1)
  if [ -z "$figures" ]; then echo "no $4 row in $2"; status=1; return; fi
  set -- "$1" "$2" "$4" $figures
  local ok=1
  for f in "$4 ms" "$5 ms" "(${6%x}×"; do
    tr '\n' ' ' < "$1" | grep -qF "$f" || { echo "$(basename "$(dirname "$1")")'s page does not quote '$f' ($3) from $2"; ok=0; status=1; }
  done
  [ $ok -eq 1 ] && echo "$(basename "$(dirname "$1")") quotes $3: $4 ms, bound $5 ms, $6 from $2"
}
quote_ms() {  # quote_ms PAGE LOG AWK-CONDITION WHAT FIELD: one measured time, "N ms" in the page
  local ms
  ms=$(awk -v f="$5" "$3 {print \$f}" "$2" | head -1)
  if [ -z "$ms" ]; then echo "no $4 row in $2"; status=1; return; fi
  if tr '\n' ' ' < "$1" | grep -qF "$ms ms"; then
    echo "$(basename "$(dirname "$1")") quotes $4: $ms ms from $2"
  else
    echo "$(basename "$(dirname "$1")")'s page does not quote '$ms ms' ($4) from $2"; status=1
  fi
}
quote_ms "$page13" "$mm/attention-torch.log" '$1 == 1024 && $4 == "sdpa"' "PyTorch's SDPA, T = 1024" 5
quote "$page13" "$mm/attention-hs64.log" '$1 == 1024 && $4 == "plain"' "plain, T = 1024" 5
quote "$page13" "$mm/attention-hs64.log" '$1 == 1024 && $4 == "fused"' "fused, T = 1024" 5
page18=$(ls "$src"/lessons/18_*/lesson.md)
quote "$page18" "$mm/half-attention-hs64.log" '$1 == 4096 && $4 == "fp16" && $5 == "tensor"' "fp16 tensor cores, T = 4096" 10
quote_ms "$page18" "$mm/half-attention-hs64.log" '$1 == 4096 && $4 == "fp16" && $5 == "16-bit"' "fp16 16-bit loads, T = 4096" 10
quote "$page18" "$m/2026-11-27-h200-wmma-softmax/half-attention-hs64.log" '$1 == 4096 && $4 == "fp16" && $5 == "tensor"' \
  "fp16 tensor cores with the softmax by lanes, T = 4096" 10
# Lesson 20: the paged decode kernel's smallest and largest error against float64 on the H100,
# and the CPU's, as the log prints them, from the test's "paged" lines.
page20="$src/lessons/20_serving/lesson.md"
log20="$m/2026-11-26-h100/test-attention.log"
for side in device cpu; do
  range=$(awk -v side="$side" '/^paged NH=/ { for (i = 1; i < NF; ++i) if ($i == side) print $(i + 1) }' "$log20" |
          sort -g | sed -n '1p;$p' | sed 's/e-0*/e-/' | tr '\n' ' ')
  set -- $range
  if [ $# -ne 2 ]; then echo "no paged $side errors in $log20"; status=1; continue; fi
  if tr '\n' ' ' < "$page20" | grep -qF "$1 to $2"; then
    echo "lesson 20 quotes the paged kernel's $side errors $1 to $2 from $log20"
  else
    echo "lesson 20's page does not quote the $side errors '$1 to $2' of $log20"; status=1
  fi
done
exit $status
