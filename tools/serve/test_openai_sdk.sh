#!/usr/bin/env bash
# serve_gpt against the official OpenAI Node SDK (npm package openai@6), unchanged
# (ctest -L serving). The SDK is installed under SCRATCH once; without npm, or when npm cannot
# fetch it (no network), the test says so in one line and is skipped (exit 77).
#
# usage: test_openai_sdk.sh SERVE_GPT TRAIN_GPT SCRATCH_DIR
set -euo pipefail
serve=$1 train=$2 scratch=$3
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$scratch"

if ! command -v npm > /dev/null || ! command -v node > /dev/null; then
  echo "skipped: npm and node are not installed (apt-get install npm)"
  exit 77
fi
if [ ! -f "$scratch/node/node_modules/openai/package.json" ]; then
  mkdir -p "$scratch/node"
  if ! (cd "$scratch/node" && npm install --no-audit --no-fund --silent openai@6 > install.log 2>&1); then
    echo "skipped: npm could not install openai@6 (no network?): $(tail -n 1 "$scratch/node/install.log")"
    exit 77
  fi
fi
cp "$here/openai_sdk_check.mjs" "$scratch/node/"  # resolves 'openai' from node_modules beside it

run=$scratch/run
if [ ! -f "$run/checkpoint/config.json" ]; then
  rm -rf "$run"
  "$train" --recipe tiny --max-iters 30 --eval-interval 30 --eval-iters 2 --out "$run" > /dev/null
fi

log=$scratch/serve.log
"$serve" "$run" --port 0 > "$log" 2>&1 &
server=$!
trap 'kill "$server" 2> /dev/null || true' EXIT
port=""
for _ in $(seq 1 300); do
  port=$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$log" | head -n 1 | sed 's/.*://') || true
  [ -n "$port" ] && break
  kill -0 "$server" 2> /dev/null || { echo "serve_gpt did not start: $(cat "$log")"; exit 1; }
  sleep 0.1
done
[ -n "$port" ] || { echo "serve_gpt printed no address: $(cat "$log")"; exit 1; }
node "$scratch/node/openai_sdk_check.mjs" "http://127.0.0.1:$port/v1"
