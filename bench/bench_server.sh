#!/usr/bin/env bash
# bench/bench_server.sh: how much of the engine's speed reaches an HTTP client. Starts
# `ember serve` on a free loopback port and drives it with wrk (Debian's package; the request
# is bench/server_post.lua) at 1, 4 and 16 concurrent connections (keep-alive), each request a
# short greedy completion of N tokens (ignore_eos, so every request generates exactly N).
# Reports requests/s, p50/p99 latency and the generated tokens/s the clients receive, next to
# `ember run`'s steady generation tok/s (256 tokens) for the same model and prompt, and one
# request's wall time.
#
#   bash bench/bench_server.sh [-m MODEL.gguf] [-n TOKENS] [-d SECONDS] [-t THREADS] [BUILD_DIR]
#
# Without -m the fixture tests/fixtures/kimi_a is converted (f32) into a temp folder: a tiny
# random model, so the numbers show the server's overhead more than the engine. The decode
# worker is single-sequence: concurrent requests queue, so requests/s should stay flat with
# more clients while latency grows with the queue.
set -eu

SRC="$(cd "$(dirname "$0")/.." && pwd)"
MODEL="" N=16 N_REF=256 DUR=10 THREADS=""
while getopts "m:n:d:t:" opt; do
    case $opt in
        m) MODEL=$OPTARG ;;
        n) N=$OPTARG ;;
        d) DUR=$OPTARG ;;
        t) THREADS=$OPTARG ;;
        *) exit 2 ;;
    esac
done
shift $((OPTIND - 1))
BUILD="${1:-$SRC/build}"
EMBER="$BUILD/ember"
[ -x "$EMBER" ] || { echo "bench_server: $EMBER is missing (build first)" >&2; exit 1; }
for tool in wrk curl jq; do
    command -v $tool >/dev/null || { echo "bench_server: $tool is missing (scripts/deps.sh)" >&2; exit 1; }
done

WORK=$(mktemp -d /tmp/ember-bench-server.XXXXXX)
PID=""
cleanup() {
    [ -n "$PID" ] && kill -TERM "$PID" 2>/dev/null && wait "$PID" 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT
if [ -z "$MODEL" ]; then
    MODEL="$WORK/kimi_a.gguf"
    "$EMBER" convert "$SRC/tests/fixtures/kimi_a" -o "$MODEL" --type f32 >/dev/null 2>&1
fi
TFLAG=()
[ -n "$THREADS" ] && TFLAG=(--threads "$THREADS")
PROMPT="Hello world"

# The engine alone, through `ember run`: (1) the same request (prompt + N greedy tokens), its
# engine time being prompt time + generation time, so that process start-up does not count;
# (2) the steady generation rate over N_REF tokens. Medians of 5 runs.
echo "== ember run (the engine alone), '$PROMPT'"
same=() steady=()
for _ in 1 2 3 4 5; do
    r=$("$EMBER" run -m "$MODEL" "${TFLAG[@]}" --temp 0 -n "$N" -p "$PROMPT" --json 2>/dev/null | tail -n 1)
    same+=("$(jq '(.n_prompt / .prompt_tok_per_s) + (if .n_gen > 1 then (.n_gen - 1) / .tok_per_s else 0 end)' <<<"$r")")
    r=$("$EMBER" run -m "$MODEL" "${TFLAG[@]}" --temp 0 -n "$N_REF" -p "$PROMPT" --json 2>/dev/null | tail -n 1)
    steady+=("$(jq .tok_per_s <<<"$r")")
done
RUN_S=$(printf '%s\n' "${same[@]}" | sort -g | sed -n 3p)
RUN_TPS=$(awk -v s="$RUN_S" -v n="$N" 'BEGIN { printf "%.1f", n / s }')
STEADY_TPS=$(printf '%s\n' "${steady[@]}" | sort -g | sed -n 3p)
echo "ember run, $N tokens: $(awk -v s="$RUN_S" 'BEGIN { printf "%.3f", s * 1000 }') ms of prompt + generation = $RUN_TPS tok/s"
echo "ember run, steady generation over $N_REF tokens: $STEADY_TPS tok/s"

"$EMBER" serve -m "$MODEL" "${TFLAG[@]}" --port 0 --queue 64 >"$WORK/serve.log" 2>&1 &
PID=$!
PORT=""
for _ in $(seq 1 200); do
    PORT=$(sed -n 's/^ember serve: listening on http:\/\/[^ ]*:\([0-9][0-9]*\)$/\1/p' "$WORK/serve.log")
    [ -n "$PORT" ] && [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/health")" = 200 ] && break
    sleep 0.05
done
URL="http://127.0.0.1:$PORT"
BODY=$(jq -nc --arg p "$PROMPT" --argjson n "$N" '{prompt: $p, max_tokens: $n, temperature: 0, ignore_eos: true}')

echo "== one request at a time, 20 times (curl, new connection each)"
walls=()
engine=()
for _ in $(seq 1 20); do
    out=$(curl -s -w '\n%{time_total}' -H 'Content-Type: application/json' "$URL/v1/completions" --data-binary "$BODY")
    walls+=("$(tail -n 1 <<<"$out")")
    engine+=("$(head -n 1 <<<"$out" | jq '.timings.prompt_ms + .timings.predicted_ms')")
done
WALL_MS=$(printf '%s\n' "${walls[@]}" | sort -g | sed -n 10p | awk '{ printf "%.3f", $1 * 1000 }')
ENGINE_MS=$(printf '%s\n' "${engine[@]}" | sort -g | sed -n 10p)
ENGINE_TPS=$(awk -v ms="$ENGINE_MS" -v n="$N" 'BEGIN { printf "%.1f", n / ms * 1000 }')
echo "median wall time per request (curl, new connection): $WALL_MS ms, of which the warm engine inside the"
echo "server (its timings: prompt + generation) took $ENGINE_MS ms = $ENGINE_TPS tok/s"

echo "== wrk: ${DUR}s per level"
# the engine's busy time inside the server, from /metrics
busy() { curl -s "$URL/metrics" | awk '$1 == "ember_prompt_seconds_total" || $1 == "ember_tokens_predicted_seconds_total" { s += $2 } END { printf "%.6f", s }'; }
printf '\n| clients | requests/s | p50 latency | p99 latency | tok/s at the clients | engine busy | share of ember run (%s tok/s) |\n' "$RUN_TPS"
printf '|---:|---:|---:|---:|---:|---:|---:|\n'
for c in 1 4 16; do
    threads=$((c < 4 ? c : 4))
    b0=$(busy)
    EMBER_BENCH_BODY="$BODY" EMBER_BENCH_PATH=/v1/completions \
        wrk -t "$threads" -c "$c" -d "${DUR}s" --timeout 60s -s "$SRC/bench/server_post.lua" "$URL" >"$WORK/wrk$c.txt" 2>&1
    b1=$(busy)
    reqs=$(awk '$1 == "ember_requests" { print $2 }' "$WORK/wrk$c.txt")
    secs=$(awk '$1 == "ember_seconds" { print $2 }' "$WORK/wrk$c.txt")
    p50=$(awk '$1 == "ember_p50_ms" { print $2 }' "$WORK/wrk$c.txt")
    p99=$(awk '$1 == "ember_p99_ms" { print $2 }' "$WORK/wrk$c.txt")
    bad=$(awk '$1 == "ember_non200" { print $2 }' "$WORK/wrk$c.txt")
    [ "${bad:-1}" = 0 ] || echo "warning: ${bad:-?} responses were not 200 at $c clients" >&2
    awk -v c="$c" -v r="$reqs" -v s="$secs" -v p50="$p50" -v p99="$p99" -v n="$N" -v run="$RUN_TPS" -v b="$(awk -v a="$b0" -v z="$b1" 'BEGIN { print z - a }')" 'BEGIN {
        rps = r / s; tps = rps * n;
        printf "| %d | %.1f | %.2f ms | %.2f ms | %.0f | %.0f%% | %.0f%% |\n", c, rps, p50, p99, tps, 100 * b / s, 100 * tps / run }'
done
echo
echo "(tok/s at the clients = requests/s x $N. Engine busy = the share of the wall time the decode"
echo " worker spent in prompt + generation (the server's own counters): what is left is HTTP, JSON,"
echo " queueing and the worker's per-request setup. ember run tok/s = $N / (prompt + generation time)"
echo " of one \`ember run\` process for the same request, on cold caches, so tiny requests run slower"
echo " there than in the warm server.)"
