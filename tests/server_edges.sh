#!/usr/bin/env bash
# tests/server_edges.sh: `ember serve` at its edges, where a careless user or an attacker pushes:
# API keys that would silently open or lock the server (empty, NUL bytes, surrounding spaces);
# slow clients (partial headers, a header trickled byte by byte) against --request-timeout and
# --max-connections-per-ip, with /health still answering; requests whose framing
# libmicrohttpd cannot parse (two Content-Lengths, unknown transfer codings, garbage lines), each
# answered 400 and closed, or at least closed; a model whose logits are NaN (500, and `ember run`
# names the file); and SIGTERM during a stream (an error event, then the end). Raw sockets
# through tests/server/rawhttp.py; every wait is bounded; loopback only.
set -u
. "$EMBER_SRC/tests/server/lib.sh"

for tool in curl jq python3; do
    command -v "$tool" >/dev/null 2>&1 || { echo "skipped: $tool is not installed (scripts/deps.sh)"; exit 77; }
done
RAW=(python3 "$EMBER_SRC/tests/server/rawhttp.py")
jqc() { jq -e "$@" >/dev/null 2>&1; }
CT=(-H 'Content-Type: application/json')

srv_setup

echo "== API keys that would silently open or lock the server"
# serve_fails RC PATTERN ARGS...: ember serve exits RC at startup, its message matching PATTERN
serve_fails() {
    local want="$1" pattern="$2"; shift 2
    timeout 10 "$EMBER_BIN" serve -m "$MODEL" --port 0 "$@" >/dev/null 2>"$WORK/start.err"
    local rc=$?
    check "serve $(printf '%q ' "$@"| head -c 60): exit $want, '$pattern' ($(head -c 120 "$WORK/start.err"))" \
        bash -c '[ "$1" = "$2" ] && grep -q -- "$3" "$4"' _ "$rc" "$want" "$pattern" "$WORK/start.err"
}
serve_fails 2 "the key is empty" --api-key ''
serve_fails 2 "API key is empty" --api-key '   '
serve_fails 2 "control byte (0x01) at offset 1" --api-key $'a\x01b'
printf 'secret\0tail\n' >"$WORK/nul.key"
serve_fails 1 "NUL byte at offset 6" --api-key-file "$WORK/nul.key"
printf '\n' >"$WORK/empty.key"
serve_fails 1 "is empty" --api-key-file "$WORK/empty.key"
printf '  spaced-key\t \r\nsecond line\n' >"$WORK/spaced.key"
srv_start K --api-key-file "$WORK/spaced.key"
check "a key file with spaces around the key: a note on stderr" grep -q "removed whitespace around the API key (2 bytes before, 3 after)" "$WORK/K.log"
check "... and the trimmed key is the key (200)" test "$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer spaced-key' "$K_URL/v1/models")" = 200
check "... and no key is still 401" test "$(curl -s -o /dev/null -w '%{http_code}' "$K_URL/v1/models")" = 401
srv_stop K
srv_start K2 --api-key ' cli-key '
check "--api-key with spaces: a note, and the trimmed key works" bash -c 'grep -q "^ember serve: note: --api-key: removed whitespace" "$1" && [ "$(curl -s -o /dev/null -w "%{http_code}" -H "Authorization: Bearer cli-key" "$2/v1/models")" = 200 ]' _ "$WORK/K2.log" "$K2_URL"
srv_stop K2

echo "== framing libmicrohttpd cannot parse: 400 and closed at once (server A: --request-timeout 30)"
srv_start A --request-timeout 30
# framed WHY REQUEST: 400 with an OpenAI-style error, and the connection closed well before
# the request timeout (30 s; the read gives up after 10)
framed() {
    local out
    out=$("${RAW[@]}" send "$A_PORT" "$2" 10)
    check "$1: 400, an error object, closed ($(head -c 160 <<<"$out"))" \
        jqc '.status == 400 and .closed and (.body | fromjson | .error.type == "invalid_request_error")' <<<"$out"
}
H='POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n'
framed "two different Content-Length headers" "${H}Content-Length: 13\r\nContent-Length: 15\r\n\r\n{\"content\":\"a\"}"
framed "Transfer-Encoding: gzip" "${H}Transfer-Encoding: gzip\r\n\r\n{\"content\":\"a\"}"
framed "Transfer-Encoding: gzip, chunked" "${H}Transfer-Encoding: gzip, chunked\r\n\r\nf\r\n{\"content\":\"a\"}\r\n0\r\n\r\n"
framed "Transfer-Encoding: chunked, identity" "${H}Transfer-Encoding: chunked, identity\r\n\r\nf\r\n{\"content\":\"a\"}\r\n0\r\n\r\n"
framed "Transfer-Encoding and Content-Length" "${H}Transfer-Encoding: chunked\r\nContent-Length: 15\r\n\r\nf\r\n{\"content\":\"a\"}\r\n0\r\n\r\n"
framed "Transfer-Encoding on a GET" 'GET /health HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n'
out=$("${RAW[@]}" send "$A_PORT" "${H}Content-Length: 15\r\nContent-Length: 15\r\nConnection: close\r\n\r\n{\"content\":\"a\"}" 10)
check "two equal Content-Length headers are one: 200" jqc '.status == 200 and (.body | fromjson | .tokens | length) == 1' <<<"$out"
out=$("${RAW[@]}" send "$A_PORT" "${H}Transfer-Encoding: chunked\r\nConnection: close\r\n\r\nf\r\n{\"content\":\"a\"}\r\n0\r\n\r\n" 10)
check "plain chunked still works: 200" jqc '.status == 200' <<<"$out"
# garbage libmicrohttpd answers itself (400, its HTML page) or drops at once (no space in the
# request line): closed either way, never held
for req in 'FOO BAR\r\n\r\n' 'GET / HTTP/1.1 extra\r\nHost: x\r\n\r\n' 'HELLO\r\n\r\n' 'GET\r\n\r\n'; do
    out=$("${RAW[@]}" send "$A_PORT" "$req" 10)
    check "garbage request line '$req': 400 or dropped, closed ($out)" jqc '(.status == 400 or .status == null) and .closed' <<<"$out"
done
check "/health is 200 after the framing errors" test "$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$A_URL/health")" = 200

echo "== slow clients (server B: --request-timeout 3, --max-connections 16, --max-connections-per-ip 8)"
srv_start B --request-timeout 3 --max-connections 16 --max-connections-per-ip 8 --timeout 60
# 12 sockets from 127.0.0.1 each send part of a header and stall: 8 are held (the per-address
# limit), 4 refused at once; meanwhile /health answers another address (127.0.0.2, loopback
# too) and not this one; the request timeout then closes the 8 (the old server held them for
# --timeout, 600 s; the wait gives up after 20 s)
out=$("${RAW[@]}" hold "$B_PORT" 12 20)
check "12 stalled sockets: 4 refused at once by the per-address limit ($out)" jqc '.closed_early == 4' <<<"$out"
check "... /health answers another address while they stall" jqc '.health_other == 200' <<<"$out"
check "... not this one, which is at its limit" jqc '.health_same == null' <<<"$out"
check "... and the request timeout closes every one of them" jqc '.closed == 12' <<<"$out"
out=$("${RAW[@]}" trickle "$B_PORT" 20)
check "a header trickled a byte every 0.25 s is closed by the request timeout ($out)" jqc '.closed' <<<"$out"
out=$("${RAW[@]}" send "$B_PORT" 'GET /health HTTP/1.1\r\nHost: x\r\n\x00\r' 20)
check "a header line starting with NUL (which libmicrohttpd skips): closed by the request timeout, no answer ($out)" jqc '.closed and .status == null' <<<"$out"
out=$("${RAW[@]}" send "$B_PORT" 'GET /health HTTP/1.1\rHost: x\r\r' 20)
check "CR-only line ends (no line ever ends): closed by the request timeout, no answer ($out)" jqc '.closed and .status == null' <<<"$out"
# a response is not bounded by the request timeout: a stream not read for 5 s (> 3) is whole
out=$("${RAW[@]}" slowread "$B_PORT" '{"prompt":"Hi","max_tokens":1500,"temperature":0,"ignore_eos":true,"stream":true}' 5 90)
check "a stream not read for longer than the request timeout is sent in full ($(head -c 100 <<<"$out"))" jqc '.status == 200 and .closed and .last == "data: [DONE]"' <<<"$out"
conns=$(curl -s -o /dev/null -o /dev/null -w '%{num_connects} ' "$B_URL/health" "$B_URL/v1/models")
check "keep-alive still carries two requests on one connection ($conns)" test "$conns" = "1 0 "
check "server B answers /health after all of it" test "$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$B_URL/health")" = 200
srv_stop B

# nor is a generation that takes longer than it: two requests of 4000 tokens at once (the fixture
# takes a second or more for each, far more under the sanitizers; the second also waits for the
# first) against --request-timeout 1: both clients wait and get all of it
srv_start D --request-timeout 1 --ctx-size 8192
pids=()
for i in 1 2; do
    curl -s --max-time 300 "${CT[@]}" "$D_URL/v1/completions" --data-binary '{"prompt":"Hi","max_tokens":4000,"temperature":0,"ignore_eos":true}' >"$WORK/long$i.json" &
    pids+=($!)
done
wait "${pids[@]}"
for i in 1 2; do
    check "generation $i, longer than --request-timeout 1, is answered in full ($(jq -c '.usage // .error' "$WORK/long$i.json" 2>/dev/null | head -c 100))" jqc '.usage.completion_tokens == 4000' "$WORK/long$i.json"
done
srv_stop D

echo "== a model whose logits are NaN: a server fault (500), and ember run names the file"
NAN="$WORK/nan.gguf"
"$EMBER_BIN" tensor "$MODEL" output.weight -o "$WORK/output.f32" >/dev/null 2>&1
python3 - "$MODEL" "$WORK/output.f32" "$NAN" <<'EOF'
import struct, sys
data, lm = bytearray(open(sys.argv[1], "rb").read()), open(sys.argv[2], "rb").read()
at = data.find(lm)  # the f32 fixture stores output.weight as these very bytes
assert at > 0 and data.find(lm, at + 1) < 0, "output.weight not found once"
data[at:at + len(lm)] = struct.pack("<f", float("nan")) * (len(lm) // 4)
open(sys.argv[3], "wb").write(data)
EOF
check "built a copy of the fixture with an all-NaN output.weight" test -s "$NAN"
timeout 60 "$EMBER_BIN" run -m "$NAN" -p Hello -n 4 --temp 0 >/dev/null 2>"$WORK/nan.err"
rc=$?
check "ember run: exit 1, the message names the model file ($(tail -n 1 "$WORK/nan.err"))" bash -c '[ "$1" = 1 ] && grep -q "ember run: $2: generation failed: .*no usable logit" "$3"' _ "$rc" "$NAN" "$WORK/nan.err"
MODEL="$NAN" srv_start N
resp=$(curl -s -w '\n%{http_code}' --max-time 30 "${CT[@]}" "$N_URL/v1/completions" --data-binary '{"prompt":"Hi","max_tokens":3}')
check "completion on the NaN model: 500 server_error ($(head -n 1 <<<"$resp" | head -c 160))" bash -c '[ "$(tail -n 1 <<<"$1")" = 500 ] && head -n 1 <<<"$1" | jq -e ".error.type == \"server_error\" and (.error.message | test(\"no usable logit\"))" >/dev/null' _ "$resp"
curl -s -N --max-time 30 "${CT[@]}" "$N_URL/v1/chat/completions" --data-binary '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":3,"stream":true}' >"$WORK/nan.sse"
check "streaming on the NaN model: the last event is a server_error" bash -c 'sed -n "s/^data: //p" "$1" | tail -n 1 | jq -e ".error.type == \"server_error\"" >/dev/null' _ "$WORK/nan.sse"
srv_stop N

echo "== SIGTERM during a stream: an error event, then the end"
srv_start C --ctx-size 65536
# 60000 tokens take the fixture seconds; SIGTERM comes as soon as the first event is in
curl -s -N --max-time 60 "${CT[@]}" "$C_URL/v1/completions" --data-binary '{"prompt":"Hi","max_tokens":60000,"temperature":0,"ignore_eos":true,"stream":true}' >"$WORK/term.sse" &
cpid=$!
for _ in $(seq 1 500); do grep -q '^data: ' "$WORK/term.sse" 2>/dev/null && break; sleep 0.02; done
check "the stream had started" grep -q '^data: {"id"' "$WORK/term.sse"
srv_stop C
wait "$cpid"
rc=$?
check "curl saw the stream end cleanly (exit $rc)" test "$rc" = 0
check "the last event is an unavailable_error 'shutting down'" bash -c 'sed -n "s/^data: //p" "$1" | tail -n 1 | jq -e ".error.type == \"unavailable_error\" and (.error.message | test(\"shutting down\"))" >/dev/null' _ "$WORK/term.sse"
check "no [DONE] after it" bash -c '! grep -q "^data: \[DONE\]" "$1"' _ "$WORK/term.sse"

srv_stop A
srv_finish
