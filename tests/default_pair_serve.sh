#!/usr/bin/env bash
# tests/default_pair_serve.sh: `ember serve` without -m loads the default pair (models/, or
# $EMBER_MODELS): it becomes ready with the default drafter, --draft none makes it plain, a
# greedy chat completion equals `ember run --chat` without -m, and a folder without the pair
# exits 1 naming the file. (`ember run`'s default-pair rules: tests/test_run.c; greedy
# identity on the eval prompts: tests/test_default_pair.c.) Skipped without the models or curl.
set -u
BIN=${EMBER_BIN:?EMBER_BIN is not set}
SRC=${EMBER_SRC:-.}
[ -f "$SRC/models/kimi-linear-19m-q8_0.gguf" ] && [ -f "$SRC/models/dspark-kimi-linear-19m-q8_0.gguf" ] ||
    { echo "skipped: the default pair is not in $SRC/models"; exit 77; }
command -v curl >/dev/null 2>&1 || { echo "skipped: curl is not installed"; exit 77; }
export EMBER_MODELS="$SRC/models"
WORK=$(mktemp -d)
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT
fails=0
check() { if "${@:2}"; then echo "ok: $1"; else echo "FAIL: $1"; fails=$((fails + 1)); fi; }

# Starts `ember serve --port 0 ARGS`; waits for "ready" (or exit); sets PID and PORT.
start() {
    rm -f "$WORK/serve.err"  # not the child's redirection: it may truncate after the first grep
    "$BIN" serve --port 0 --threads 1 "$@" 2>"$WORK/serve.err" &
    PID=$!
    for _ in $(seq 300); do
        grep -qs "ready:" "$WORK/serve.err" && break
        kill -0 "$PID" 2>/dev/null || break
        sleep 0.1
    done
    PORT=$(sed -nE 's/.*listening on http:\/\/[^ ]*:([0-9]+)$/\1/p' "$WORK/serve.err" | head -1)
}
stop() { kill "$PID" 2>/dev/null; wait "$PID" 2>/dev/null; PID=; }

PROMPT='Write a Python function `quote`: Quote a string for use in a URL.'
start
check "serve without -m: ready with the default drafter" grep -q "ready: model 'kimi-linear-19m-q8_0.gguf'.*speculative decoding with drafter .*dspark-kimi-linear-19m-q8_0.gguf" "$WORK/serve.err"
body='{"messages":[{"role":"user","content":"'"${PROMPT//\`/\\u0060}"'"}],"max_tokens":24,"temperature":0}'
curl -s "http://127.0.0.1:$PORT/v1/chat/completions" -H 'Content-Type: application/json' -d "$body" >"$WORK/resp.json"
stop
"$BIN" run --chat -p "$PROMPT" -n 24 --temp 0 --threads 1 >"$WORK/run.txt" 2>/dev/null
check "serve's greedy chat completion equals ember run --chat's text" \
    python3 -c 'import json,sys; c=json.load(open(sys.argv[1]))["choices"][0]["message"]["content"]; r=open(sys.argv[2]).read(); sys.exit(0 if c.rstrip("\n") == r.rstrip("\n") and c else 1)' "$WORK/resp.json" "$WORK/run.txt"

start --draft none
check "serve without -m, --draft none: plain decoding" grep -q "ready: .*plain decoding (no drafter)" "$WORK/serve.err"
stop

EMBER_MODELS="$WORK/none" timeout 10 "$BIN" serve --port 0 >/dev/null 2>"$WORK/err.txt"
rc=$?
check "serve without -m and no default pair: exit 1 naming the file" \
    bash -c '[ "$1" = 1 ] && grep -q "kimi-linear-19m-q8_0.gguf" "$2" && grep -q "EMBER_MODELS" "$2"' _ "$rc" "$WORK/err.txt"
[ "$fails" = 0 ]
