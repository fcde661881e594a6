#!/usr/bin/env bash
# tests/server_faults.sh: `ember serve` when its clients or its model file misbehave, on the
# tiny fixture model (tests/server/lib.sh). Streaming clients that hang up before their first
# token (raw sockets: the request, then close) while the worker is busy, so each one's job runs
# after its client is gone: the server must go on, and in the ASan/UBSan build (`make asan` runs
# this with that build's ember) any sanitizer report or abort fails the test (srv_stop checks
# the exit status and the log). Then the model file truncated under a running server, resident
# and --moe-storage ssd: between two requests (the next one is 500 naming the file, later ones
# and /health 503 with the same message) and in the middle of a stream (the server survives;
# the stream ends with [DONE] if it was finished, else with an error event naming the file).
set -u
. "$EMBER_SRC/tests/server/lib.sh"

for tool in curl jq truncate; do
    command -v "$tool" >/dev/null 2>&1 || { echo "skipped: $tool is not installed (scripts/deps.sh)"; exit 77; }
done

srv_setup
CT=(-H 'Content-Type: application/json')
# post URL BODY: the response body in $WORK/resp.json, the status on stdout
post() { curl -s -o "$WORK/resp.json" -w '%{http_code}' --max-time 120 "${CT[@]}" "$1" --data-binary "$2"; }
metric() { curl -s --max-time 5 "$1/metrics" | awk -v m="$2" '$1 == m { print $2 }'; }
alive() { kill -0 "$1" 2>/dev/null; }
jqf() { jq -e "$@" >/dev/null; }

echo "== streaming clients that hang up before their first token"
srv_start A
LONG='{"prompt":"Hi","max_tokens":4000,"temperature":0,"ignore_eos":true}'
curl -s --max-time 120 "${CT[@]}" "$A_URL/v1/completions" --data-binary "$LONG" >"$WORK/long.json" &
long_pid=$!
for _ in $(seq 1 250); do [ "$(metric "$A_URL" ember_requests_processing)" = 1 ] && break; sleep 0.02; done
body='{"prompt":"Hello","max_tokens":8,"stream":true}'
for kind in completions chat/completions; do
    [ "$kind" = chat/completions ] && body='{"messages":[{"role":"user","content":"Hello"}],"max_tokens":8,"stream":true}'
    for _ in $(seq 1 8); do
        exec 3<>"/dev/tcp/127.0.0.1/$A_PORT"
        printf 'POST /v1/%s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s' \
            "$kind" "${#body}" "$body" >&3
        exec 3>&- 3<&-
    done
done
wait "$long_pid"
check "the busy worker's own request finished (4000 tokens)" jqf '.usage.completion_tokens == 4000' "$WORK/long.json"
for _ in $(seq 1 500); do [ "$(metric "$A_URL" ember_requests_processing)" = 0 ] && break; sleep 0.02; done
check "the server is up after 16 streams whose clients left at once" alive "$A_PID"
check "the next request is served" test "$(post "$A_URL/v1/completions" '{"prompt":"Hi","max_tokens":4}')" = 200
srv_stop A

# truncated MODE FLAGS...: the model file truncated under a server started with FLAGS
truncated() {
    local mode="$1"; shift
    local copy="$WORK/$mode.gguf" size name="T_$mode"
    cp "$MODEL" "$copy"
    size=$(stat -c %s "$copy")
    local saved="$MODEL"
    MODEL="$copy"
    srv_start "$name" "$@"
    MODEL="$saved"
    local url_var="${name}_URL" pid_var="${name}_PID"
    local url="${!url_var}" pid="${!pid_var}"
    local req='{"prompt":"Hello world","max_tokens":8,"temperature":0}'

    echo "== $mode: truncated between two requests"
    check "$mode: a request before the truncation is served" test "$(post "$url/v1/completions" "$req")" = 200
    truncate -s $((size / 2)) "$copy"
    local want="model file $copy changed on disk while mapped ($((size / 2)) bytes now, $size mapped): restart to reload"
    check "$mode: the next request is 500 with the message" test "$(post "$url/v1/completions" "$req")" = 500
    check "$mode: ... '$want'" jqf --arg m "$want" '.error.message == $m and .error.type == "server_error"' "$WORK/resp.json"
    check "$mode: a later request is 503 with the same message" test "$(post "$url/v1/chat/completions" \
        '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":4}')" = 503
    check "$mode: ... (unavailable_error)" jqf --arg m "$want" '.error.message == $m and .error.type == "unavailable_error"' "$WORK/resp.json"
    check "$mode: /health is 503 with the message" test "$(curl -s -o "$WORK/resp.json" -w '%{http_code}' --max-time 5 "$url/health")" = 503
    check "$mode: ... naming the file" jqf --arg m "$want" '.error.message == $m' "$WORK/resp.json"
    check "$mode: the server is up" alive "$pid"
    srv_stop "$name"

    echo "== $mode: truncated in the middle of a stream"
    cp "$MODEL" "$copy"
    MODEL="$copy"
    srv_start "$name" "$@" --ctx-size 16384
    MODEL="$saved"
    url="${!url_var}" pid="${!pid_var}"
    curl -s -N --max-time 120 "${CT[@]}" "$url/v1/completions" \
        --data-binary '{"prompt":"Hi","max_tokens":16000,"temperature":0,"ignore_eos":true,"stream":true}' >"$WORK/mid.sse" &
    local cpid=$!
    for _ in $(seq 1 500); do grep -q '^data: {' "$WORK/mid.sse" && break; sleep 0.01; done
    truncate -s $((size / 2)) "$copy"
    wait "$cpid"
    local last
    last=$(grep '^data: ' "$WORK/mid.sse" | tail -n 1 | sed 's/^data: //')
    if [ "$last" = "[DONE]" ]; then
        echo "note: the stream had finished before the truncation"
    else
        check "$mode: the stream ends with an error event naming the file" \
            jqf --arg m "$want" '.error.message == $m' <<<"$last"
    fi
    check "$mode: the server survived the truncation" alive "$pid"
    local st
    st=$(post "$url/v1/completions" "$req")
    check "$mode: the next request fails (500 or 503, got $st) with the message" \
        bash -c '[ "$1" = 500 ] || [ "$1" = 503 ]' _ "$st"
    check "$mode: ... '$want'" jqf --arg m "$want" '.error.message == $m' "$WORK/resp.json"
    check "$mode: then 503" test "$(post "$url/v1/completions" "$req")" = 503
    check "$mode: /health is 503" test "$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$url/health")" = 503
    srv_stop "$name"
}

truncated resident --moe-storage resident
truncated ssd --moe-storage ssd

srv_finish
