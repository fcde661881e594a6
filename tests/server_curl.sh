#!/usr/bin/env bash
# tests/server_curl.sh: `ember serve` end to end with curl, on the tiny fixture model (converted
# here) and servers started on free loopback ports (tests/server/lib.sh). Checks every
# endpoint, streaming and not; greedy results against `ember run` (token ids, and the text
# decoded independently by Node's UTF-8 decoder); stop strings, finish reasons, usage and
# timings; the API key, body and context limits; keep-alive; 16 concurrent clients against
# their sequential results; a client that disconnects mid-stream; a slow client; a flood past
# the queue (503 + Retry-After); and over a hundred malformed requests (a committed list plus
# generated mutations), each a 4xx with an OpenAI-style error while /health stays 200.
set -u
. "$EMBER_SRC/tests/server/lib.sh"

for tool in curl jq; do
    command -v "$tool" >/dev/null 2>&1 || { echo "skipped: $tool is not installed (scripts/deps.sh)"; exit 77; }
done
HAVE_NODE=0
command -v node >/dev/null 2>&1 && HAVE_NODE=1

srv_setup

timeout 10 "$EMBER_BIN" serve -m "$MODEL" --port 0 --verify-width 4 >/dev/null 2>"$WORK/flag.err"
check "serve --verify-width 4 without a drafter: exit 2, 'needs a drafter'" bash -c '[ "$1" = 2 ] && grep -q "needs a drafter" "$2"' _ "$?" "$WORK/flag.err"
timeout 10 "$EMBER_BIN" serve -m "$MODEL" --port 0 --draft "$MODEL" >/dev/null 2>"$WORK/flag.err"
check "serve --draft with a file that is no drafter: exit 1" bash -c '[ "$1" = 1 ]' _ "$?"
timeout 10 "$EMBER_BIN" serve -m "$WORK/missing.gguf" --port 0 >/dev/null 2>"$WORK/flag.err"
check "serve with a missing model file: exit 1 with the file named" bash -c '[ "$1" = 1 ] && grep -q missing.gguf "$2"' _ "$?" "$WORK/flag.err"

srv_start A --queue 32
srv_start B --queue 2 --api-key sekrit-key --max-body 64KiB --ctx-size 512

CT=(-H 'Content-Type: application/json')
KEY=(-H 'Authorization: Bearer sekrit-key')

# post URL BODY [curl args]: the response body on stdout
post() { local url="$1" body="$2"; shift 2; curl -s --max-time 60 "${CT[@]}" "$@" "$url" --data-binary "$body"; }
# status URL BODY [curl args]: the HTTP status only
status() { local url="$1" body="$2"; shift 2; curl -s -o /dev/null -w '%{http_code}' --max-time 60 "${CT[@]}" "$@" "$url" --data-binary "$body"; }
jqc() { jq -e "$@" >/dev/null 2>&1; }
health_ok() { [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$A_URL/health")" = 200 ]; }
metric() { curl -s --max-time 5 "$1/metrics" "${@:3}" | awk -v m="$2" '$1 == m { print $2 }'; }
# SSE helpers: the JSON of every data event, and the text the events carry
sse_json() { sed -n 's/^data: //p' "$1" | grep -v '^\[DONE\]$'; }
sse_text() { sse_json "$1" | jq -j '.choices[0]? // {} | (.delta.content // .text // "")'; }

echo "== endpoints"
check "/health is 200 {\"status\":\"ok\"}" test "$(curl -s --max-time 5 "$A_URL/health")" = '{"status":"ok"}'
check "/v1/health is 200" test "$(curl -s -o /dev/null -w '%{http_code}' "$A_URL/v1/health")" = 200
models=$(curl -s --max-time 5 "$A_URL/v1/models")
check "/v1/models lists the model by its file name" jqc '.object == "list" and (.data | length) == 1 and .data[0].id == "kimi_a.gguf" and .data[0].object == "model"' <<<"$models"
check "/v1/models meta: vocabulary, parameters, context" jqc '.data[0].meta | .n_vocab == 512 and .n_ctx == 4096 and .n_ctx_train == 1048576 and .n_embd == 96 and .n_params > 600000 and .size > 0' <<<"$models"
props=$(curl -s --max-time 5 "$A_URL/props")
check "/props: context, slots, chat template, alias" jqc '.default_generation_settings.n_ctx == 4096 and .total_slots == 1 and (.chat_template | test("im_middle")) and .model_alias == "kimi_a.gguf" and .build_info != null' <<<"$props"
ctype=$(curl -s -o /dev/null -w '%{content_type}' "$A_URL/metrics")
check "/metrics is Prometheus text ($ctype)" test "${ctype%%;*}" = text/plain
mtext=$(curl -s "$A_URL/metrics")
for m in requests_total prompt_tokens_total prompt_seconds_total tokens_predicted_total tokens_predicted_seconds_total \
    spec_passes_total spec_drafted_total spec_accepted_total spec_draft_seconds_total spec_target_seconds_total expert_bytes_read_total \
    expert_cache_hits_total \
    expert_bytes_read_generating_total \
    requests_processing requests_deferred; do
    check "/metrics has ember_$m with HELP and TYPE" bash -c 'grep -q "^ember_$1 [0-9]" <<<"$2" && grep -q "^# TYPE ember_$1 " <<<"$2"' _ "$m" "$mtext"
done

echo "== tokenize / detokenize"
text='Hello world, <|im_end|> and again'
want=$("$EMBER_BIN" tokenize -m "$MODEL" -p "$text")
got=$(post "$A_URL/tokenize" "$(jq -nc --arg c "$text" '{content: $c, add_special: true}')" | jq -r '.tokens | map(tostring) | join(",")')
check "/tokenize equals ember tokenize" test "$got" = "$want"
pieces=$(post "$A_URL/tokenize" "$(jq -nc --arg c "$text" '{content: $c, with_pieces: true}')")
check "/tokenize with_pieces: ids and pieces that spell the text" jqc --arg t "$text" '[.tokens[].piece] | join("") == $t' <<<"$pieces"
check "/tokenize with_pieces ids equal the plain ids" test "$(jq -r '[.tokens[].id] | map(tostring) | join(",")' <<<"$pieces")" = "$want"
back=$(post "$A_URL/detokenize" "{\"tokens\":[$want]}" | jq -r .content)
check "/detokenize gives the text back" test "$back" = "$text"

echo "== greedy results equal ember run"
# ref PROMPT N [--chat]: ember run's token ids on stdout, its text in $WORK/ref.txt
ref() {
    local prompt="$1" n="$2"; shift 2
    timeout 120 "$EMBER_BIN" run -m "$MODEL" --temp 0 -n "$n" "$@" -p "$prompt" --json >"$WORK/ref.out" 2>"$WORK/ref.err"
    head -n -1 "$WORK/ref.out" >"$WORK/ref.txt"
    tail -n 1 "$WORK/ref.out" | jq -c .tokens
}
# same_text FILE: FILE (the server's text) equals ember run's raw bytes decoded by Node (invalid
# UTF-8 as U+FFFD, WHATWG's rule) plus the newline ember run adds after text without one
same_text() {
    [ "$HAVE_NODE" = 1 ] || return 0
    node -e '
        const fs = require("fs");
        const ref = fs.readFileSync(process.argv[1]).toString("utf8");
        let got = fs.readFileSync(process.argv[2], "utf8");
        if (got.length && !got.endsWith("\n")) got += "\n";
        process.exit(ref === got ? 0 : 1);' "$WORK/ref.txt" "$1"
}
for prompt in "Hello world" "The quick brown fox" "1 2 3 4 5" "<|im_user|>user<|im_middle|>Hi"; do
    want=$(ref "$prompt" 24)
    resp=$(post "$A_URL/v1/completions" "$(jq -nc --arg p "$prompt" '{prompt: $p, max_tokens: 24, temperature: 0, return_tokens: true}')")
    check "completions: greedy tokens equal ember run ('$prompt')" test "$(jq -c '.choices[0].tokens' <<<"$resp")" = "$want"
    jq -j '.choices[0].text' <<<"$resp" >"$WORK/got.txt"
    check "completions: text equals ember run's, decoded ('$prompt')" same_text "$WORK/got.txt"
    want=$(ref "$prompt" 24 --chat)
    resp=$(post "$A_URL/v1/chat/completions" "$(jq -nc --arg p "$prompt" '{messages: [{role: "user", content: $p}], max_tokens: 24, temperature: 0, return_tokens: true}')")
    check "chat: greedy tokens equal ember run --chat ('$prompt')" test "$(jq -c '.choices[0].tokens' <<<"$resp")" = "$want"
    jq -j '.choices[0].message.content' <<<"$resp" >"$WORK/got.txt"
    check "chat: text equals ember run --chat's, decoded ('$prompt')" same_text "$WORK/got.txt"
done

echo "== response shapes, usage, timings"
body='{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hello"}],"max_tokens":6,"temperature":0,"ignore_eos":true}'
resp=$(post "$A_URL/v1/chat/completions" "$body")
check "chat response: id, object, created, model" jqc '(.id | startswith("chatcmpl-")) and .object == "chat.completion" and (.created | type) == "number" and .model == "kimi_a.gguf"' <<<"$resp"
check "chat response: one choice, assistant message, finish_reason length" jqc '(.choices | length) == 1 and .choices[0].index == 0 and .choices[0].message.role == "assistant" and .choices[0].finish_reason == "length"' <<<"$resp"
n_prompt=$("$EMBER_BIN" tokenize -m "$MODEL" -p '<|im_system|>system<|im_middle|>Be brief.<|im_end|><|im_user|>user<|im_middle|>Hello<|im_end|><|im_assistant|>assistant<|im_middle|>' | tr ',' '\n' | wc -l)
check "chat usage: prompt tokens as the chat format encodes ($n_prompt), 6 completion tokens" jqc --argjson n "$n_prompt" '.usage.prompt_tokens == $n and .usage.completion_tokens == 6 and .usage.total_tokens == $n + 6' <<<"$resp"
check "chat timings: llama-server's fields" jqc '.timings | .prompt_n == .prompt_n and .predicted_n == 6 and .prompt_per_second > 0 and .predicted_per_second >= 0 and .prompt_ms > 0 and .draft_n == 0 and .draft_n_accepted == 0 and (.cache_n | type) == "number"' <<<"$resp"
check "chat timings: prompt_n equals usage.prompt_tokens" jqc '.timings.prompt_n == .usage.prompt_tokens' <<<"$resp"
check "chat timings: the devices (cpu target, no drafter), draft_ms 0" jqc '.timings | .device == "cpu" and .draft_device == null and .draft_ms == 0' <<<"$resp"
check "/metrics: ember_device_info names the target and no drafter" bash -c 'curl -s --max-time 5 "$1/metrics" | grep -qx "ember_device_info{target=\"cpu\",drafter=\"none\"} 1"' _ "$A_URL"
resp=$(post "$A_URL/v1/completions" '{"prompt":"Hello","max_completion_tokens":3,"temperature":0,"ignore_eos":true}')
check "completion response: text_completion, cmpl- id, finish length, 3 tokens" jqc '(.id | startswith("cmpl-")) and .object == "text_completion" and (.choices[0].text | type) == "string" and .choices[0].finish_reason == "length" and .usage.completion_tokens == 3' <<<"$resp"
resp=$(post "$A_URL/v1/completions" '{"prompt":"Hello","max_tokens":3,"temperature":0.9,"top_k":5,"top_p":0.9,"min_p":0.01,"seed":42}')
resp2=$(post "$A_URL/v1/completions" '{"prompt":"Hello","max_tokens":3,"temperature":0.9,"top_k":5,"top_p":0.9,"min_p":0.01,"seed":42}')
check "sampling with a seed is reproducible" test "$(jq -c .choices <<<"$resp")" = "$(jq -c .choices <<<"$resp2")"
resp=$(post "$A_URL/v1/completions" '{"model":"kimi_a.gguf","prompt":[23,285,229],"max_tokens":2,"temperature":0}')
check "prompt as token ids, model by name" jqc '.usage.prompt_tokens == 3 and .usage.completion_tokens >= 1' <<<"$resp"
# one-model servers serve any name (clients often send a fixed one): the same greedy result as
# naming none, and the response names the model served
body='{"messages":[{"role":"user","content":"Hello"}],"max_tokens":8,"temperature":0,"ignore_eos":true,"return_tokens":true}'
want=$(post "$A_URL/v1/chat/completions" "$body" | jq -c '.choices[0].tokens')
for name in default gpt-4o-mini kimi_a.gguf "$MODEL"; do
    resp=$(post "$A_URL/v1/chat/completions" "$(jq -c --arg m "$name" '. + {model: $m}' <<<"$body")" -w '\n%{http_code}')
    check "any model name ('${name##*/}'): 200, the same tokens, model kimi_a.gguf" bash -c '[ "$(tail -n 1 <<<"$1")" = 200 ] && head -n 1 <<<"$1" | jq -e --argjson w "$2" ".choices[0].tokens == \$w and .model == \"kimi_a.gguf\"" >/dev/null' _ "$resp" "$want"
done
code=$(status "$A_URL/v1/completions" '{"prompt":"Hi","max_tokens":2,"model":"davinci-002"}')
check "completions naming another model: 200 ($code)" test "$code" = 200
resp=$(post "$A_URL/v1/chat/completions" '{"messages":[{"role":"user","content":[{"type":"text","text":"Hel"},{"type":"text","text":"lo"}]}],"max_tokens":2,"temperature":0}')
check "chat content as a list of text parts" jqc '.choices[0].message.role == "assistant"' <<<"$resp"

echo "== streaming"
body='{"messages":[{"role":"user","content":"Hello world"}],"max_tokens":40,"temperature":0,"ignore_eos":true}'
post "$A_URL/v1/chat/completions" "$body" | jq -j '.choices[0].message.content' >"$WORK/plain.txt"
curl -s -N --max-time 60 "${CT[@]}" "$A_URL/v1/chat/completions" --data-binary "$(jq -c '. + {stream: true, stream_options: {include_usage: true}}' <<<"$body")" >"$WORK/chat.sse"
sse_text "$WORK/chat.sse" >"$WORK/stream.txt"
check "chat stream: the deltas spell the non-streaming content" cmp -s "$WORK/plain.txt" "$WORK/stream.txt"
check "chat stream: ends with data: [DONE]" test "$(tail -n 2 "$WORK/chat.sse" | head -n 1)" = "data: [DONE]"
check "chat stream: every event is 'data: ...' followed by a blank line" bash -c 'awk "NR % 2 == 1 && !/^data: / { bad = 1 } NR % 2 == 0 && \$0 != \"\" { bad = 1 } END { exit bad }" "$1"' _ "$WORK/chat.sse"
check "chat stream: chunks with one id, chat.completion.chunk" bash -c 'sse_json() { sed -n "s/^data: //p" "$1" | grep -v "^\[DONE\]$"; }; sse_json "$1" | jq -s -e "(map(.id) | unique | length) == 1 and all(.[]; .object == \"chat.completion.chunk\")" >/dev/null' _ "$WORK/chat.sse"
check "chat stream: the first delta has the assistant role" bash -c 'sed -n "s/^data: //p" "$1" | head -n 1 | jq -e ".choices[0].delta.role == \"assistant\"" >/dev/null' _ "$WORK/chat.sse"
check "chat stream: the last choice chunk has finish_reason length and timings" bash -c 'sed -n "s/^data: //p" "$1" | grep -v "^\[DONE\]$" | jq -s -e "map(select(.choices | length > 0)) | last | .choices[0].finish_reason == \"length\" and .timings.predicted_n == 40" >/dev/null' _ "$WORK/chat.sse"
check "chat stream: include_usage gives a usage chunk with choices []" bash -c 'sed -n "s/^data: //p" "$1" | grep -v "^\[DONE\]$" | tail -n 1 | jq -e "(.choices | length) == 0 and .usage.completion_tokens == 40 and .usage.prompt_tokens > 0" >/dev/null' _ "$WORK/chat.sse"
body='{"prompt":"The quick brown fox","max_tokens":30,"temperature":0,"ignore_eos":true}'
post "$A_URL/v1/completions" "$body" | jq -j '.choices[0].text' >"$WORK/plain.txt"
curl -s -N --max-time 60 "${CT[@]}" "$A_URL/v1/completions" --data-binary "$(jq -c '. + {stream: true}' <<<"$body")" >"$WORK/comp.sse"
sse_text "$WORK/comp.sse" >"$WORK/stream.txt"
check "completion stream: the chunks spell the non-streaming text" cmp -s "$WORK/plain.txt" "$WORK/stream.txt"
check "completion stream: text_completion chunks, no usage without include_usage, [DONE]" bash -c 'sed -n "s/^data: //p" "$1" | grep -v "^\[DONE\]$" | jq -s -e "all(.[]; .object == \"text_completion\" and (has(\"usage\") | not)) and (last.choices[0].finish_reason == \"length\")" >/dev/null && tail -n 2 "$1" | grep -q "^data: \[DONE\]$"' _ "$WORK/comp.sse"
check "completion stream: event-stream content type" test "$(curl -s -o /dev/null -w '%{content_type}' --max-time 60 "${CT[@]}" "$A_URL/v1/completions" --data-binary '{"prompt":"Hi","max_tokens":1,"stream":true}' | cut -d';' -f1)" = text/event-stream

echo "== stop strings"
full=$(post "$A_URL/v1/completions" '{"prompt":"The quick brown fox","max_tokens":60,"temperature":0,"ignore_eos":true}' | jq -c '.choices[0].text')
# a stop string cut from the middle of the greedy text; expected: the text before its first occurrence
stop=$(jq -c '(explode | .[12:14] | implode)' <<<"$full")
expect=$(jq -c --argjson s "$stop" '(explode) as $c | ($s | explode) as $t | [range(0; $c | length) | select($c[.:. + ($t | length)] == $t)][0] as $i | $c[:$i] | implode' <<<"$full")
resp=$(post "$A_URL/v1/completions" "{\"prompt\":\"The quick brown fox\",\"max_tokens\":60,\"temperature\":0,\"ignore_eos\":true,\"stop\":[\"never-there\",$stop]}")
check "stop: the text ends before the stop string, finish_reason stop" jqc --argjson e "$expect" '.choices[0].text == $e and .choices[0].finish_reason == "stop"' <<<"$resp"
curl -s -N --max-time 60 "${CT[@]}" "$A_URL/v1/completions" --data-binary "{\"prompt\":\"The quick brown fox\",\"max_tokens\":60,\"temperature\":0,\"ignore_eos\":true,\"stream\":true,\"stop\":$stop}" >"$WORK/stop.sse"
check "stop while streaming: same text, never a piece of the stop string" test "$(sse_text "$WORK/stop.sse" | jq -Rsc .)" = "$expect"
check "stop while streaming: finish_reason stop" bash -c 'sed -n "s/^data: //p" "$1" | grep -v "^\[DONE\]$" | tail -n 1 | jq -e ".choices[0].finish_reason == \"stop\"" >/dev/null' _ "$WORK/stop.sse"

echo "== API key (server B)"
check "no key: 401" test "$(curl -s -o "$WORK/r" -w '%{http_code}' "$B_URL/v1/models")" = 401
check "no key: OpenAI-style authentication error" jqc '.error.type == "authentication_error" and (.error.message | type) == "string"' <"$WORK/r"
check "wrong key: 401" test "$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer nope' "$B_URL/v1/models")" = 401
check "right key: 200" test "$(curl -s -o /dev/null -w '%{http_code}' "${KEY[@]}" "$B_URL/v1/models")" = 200
check "/health needs no key" test "$(curl -s -o /dev/null -w '%{http_code}' "$B_URL/health")" = 200
check "POST without key: 401" test "$(status "$B_URL/v1/completions" '{"prompt":"Hi","max_tokens":1}')" = 401

echo "== limits (server B: 64 KiB bodies, 512 positions)"
head -c 100000 /dev/zero | tr '\0' 'a' | jq -Rc '{prompt: ., max_tokens: 1}' >"$WORK/big.json"
check "a 100 KB body: 413" test "$(curl -s -o "$WORK/r" -w '%{http_code}' --max-time 30 "${CT[@]}" "${KEY[@]}" "$B_URL/v1/completions" --data-binary @"$WORK/big.json")" = 413
check "413 carries an OpenAI-style error" jqc '.error.type == "invalid_request_error"' <"$WORK/r"
check "a 100 KB chunked body: 413" test "$(curl -s -o /dev/null -w '%{http_code}' --max-time 30 "${CT[@]}" "${KEY[@]}" -H 'Transfer-Encoding: chunked' "$B_URL/v1/completions" --data-binary @"$WORK/big.json")" = 413
ids=$(yes 7 | head -n 600 | paste -sd, -)
check "a prompt longer than the context: 400 context_length_exceeded" jqc '.error.code == "context_length_exceeded"' <<<"$(post "$B_URL/v1/completions" "{\"prompt\":[$ids],\"max_tokens\":1}" "${KEY[@]}")"
check "max_tokens beyond the context: 400" test "$(status "$B_URL/v1/completions" '{"prompt":"Hi","max_tokens":513}' "${KEY[@]}")" = 400
ids=$(yes 7 | head -n 500 | paste -sd, -)
resp=$(post "$B_URL/v1/completions" "{\"prompt\":[$ids],\"max_tokens\":100,\"temperature\":0,\"ignore_eos\":true}" "${KEY[@]}")
check "generation stops where the context ends: 12 tokens, finish length" jqc '.usage.completion_tokens == 12 and .choices[0].finish_reason == "length"' <<<"$resp"
check "server B healthy after the limits" test "$(curl -s -o /dev/null -w '%{http_code}' "$B_URL/health")" = 200

echo "== keep-alive and slow clients"
conns=$(curl -s -o /dev/null -o /dev/null -o /dev/null -w '%{num_connects} ' "$A_URL/health" "$A_URL/v1/models" "$A_URL/nope")
check "three requests over one connection (new connections: $conns)" test "$conns" = "1 0 0 "
# a client that sends half a request and stalls must not hold up anybody else
exec 7<>"/dev/tcp/127.0.0.1/$A_PORT"
printf 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"pro' >&7
t0=$(date +%s%N)
resp=$(post "$A_URL/v1/completions" '{"prompt":"Hi","max_tokens":4,"temperature":0}')
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
check "a stalled client does not delay another request (${ms} ms)" bash -c '[ "$1" -lt 5000 ] && jq -e ".usage.completion_tokens >= 1" >/dev/null <<<"$2"' _ "$ms" "$resp"
exec 7>&-

echo "== 16 concurrent clients"
for i in $(seq 1 16); do
    jq -nc --arg p "client $i asks" --argjson n $((8 + i)) '{prompt: $p, max_tokens: $n, temperature: 0, return_tokens: true}' >"$WORK/c$i.json"
    post "$A_URL/v1/completions" "@$WORK/c$i.json" | jq -c '.choices[0] | {text, tokens, finish_reason}' >"$WORK/seq$i"
done
pids=()
for i in $(seq 1 16); do
    if [ $((i % 2)) = 0 ]; then
        curl -s -N --max-time 120 "${CT[@]}" "$A_URL/v1/completions" --data-binary "$(jq -c '. + {stream: true}' "$WORK/c$i.json")" >"$WORK/par$i.sse" &
    else
        curl -s --max-time 120 "${CT[@]}" "$A_URL/v1/completions" --data-binary @"$WORK/c$i.json" >"$WORK/par$i.json" &
    fi
    pids+=($!)
done
wait "${pids[@]}"
same=0
for i in $(seq 1 16); do
    if [ $((i % 2)) = 0 ]; then
        [ "$(sse_text "$WORK/par$i.sse" | jq -Rsc .)" = "$(jq -c .text "$WORK/seq$i")" ] && same=$((same + 1))
    else
        [ "$(jq -c '.choices[0] | {text, tokens, finish_reason}' "$WORK/par$i.json")" = "$(cat "$WORK/seq$i")" ] && same=$((same + 1))
    fi
done
check "16 concurrent clients (half streaming) all equal their sequential results ($same/16)" test "$same" = 16

echo "== a client that disconnects"
cancelled0=$(metric "$A_URL" ember_requests_cancelled_total)
tokens0=$(metric "$A_URL" ember_tokens_predicted_total)
# The client goes away after its first bytes (head exits, curl's next write fails), not after a
# time: the fixture model can generate all 4000 tokens within a second.
curl -s -N --max-time 10 "${CT[@]}" "$A_URL/v1/completions" --data-binary '{"prompt":"Hi","max_tokens":4000,"temperature":0,"ignore_eos":true,"stream":true}' | head -c 200 >"$WORK/cut.sse"
t0=$(date +%s%N)
for _ in $(seq 1 250); do [ "$(metric "$A_URL" ember_requests_processing)" = 0 ] && break; sleep 0.02; done
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
check "the worker is free ${ms} ms after the stream's client went away" test "$(metric "$A_URL" ember_requests_processing)" = 0
check "the stream had started before the disconnect" grep -q '^data: ' "$WORK/cut.sse"
check "the generation counts as cancelled" test "$(metric "$A_URL" ember_requests_cancelled_total)" = $((cancelled0 + 1))
gen=$(( $(metric "$A_URL" ember_tokens_predicted_total) - tokens0 ))
check "it stopped early ($gen of 4000 tokens)" test "$gen" -lt 4000
# 4000 tokens take the fixture about 250 ms on one 2-core machine (16k tok/s): leave after 40 ms.
curl -s --max-time 0.04 "${CT[@]}" "$A_URL/v1/completions" --data-binary '{"prompt":"Hi","max_tokens":4000,"temperature":0,"ignore_eos":true}' >/dev/null
for _ in $(seq 1 250); do [ "$(metric "$A_URL" ember_requests_processing)" = 0 ] && break; sleep 0.02; done
check "a non-streaming client that goes away frees the worker too" test "$(metric "$A_URL" ember_requests_cancelled_total)" = $((cancelled0 + 2))
resp=$(post "$A_URL/v1/completions" '{"prompt":"Hello world","max_tokens":24,"temperature":0,"return_tokens":true}')
check "the next request is served, with the same greedy result" test "$(jq -c '.choices[0].tokens' <<<"$resp")" = "$(ref "Hello world" 24)"

echo "== a flood past the queue (server B: --queue 2)"
pids=()
for i in $(seq 1 20); do
    curl -s -D "$WORK/flood$i.h" -o "$WORK/flood$i.b" -w '%{http_code}\n' --max-time 120 "${CT[@]}" "${KEY[@]}" \
        "$B_URL/v1/completions" --data-binary '{"prompt":"Hi","max_tokens":200,"temperature":0,"ignore_eos":true}' >"$WORK/flood$i.code" &
    pids+=($!)
done
wait "${pids[@]}"
n200=$(cat "$WORK"/flood*.code | grep -c '^200$')
n503=$(cat "$WORK"/flood*.code | grep -c '^503$')
check "flood: every answer is 200 or 503 ($n200 + $n503 of 20)" test $((n200 + n503)) = 20
check "flood: at least one running and two queued were served ($n200)" test "$n200" -ge 3
check "flood: the rest got 503 ($n503)" test "$n503" -ge 1
f=$(grep -l '^503$' "$WORK"/flood*.code | head -n 1)
check "flood: 503 has Retry-After" grep -qi '^Retry-After: [0-9]' "${f%.code}.h"
check "flood: 503 is an OpenAI-style error" jqc '.error.type == "unavailable_error"' <"${f%.code}.b"
check "flood: the rejections are counted" test "$(metric "$B_URL" ember_requests_rejected_total "${KEY[@]}")" = "$n503"
check "flood: the server is still healthy" test "$(curl -s -o /dev/null -w '%{http_code}' "$B_URL/health")" = 200
check "flood: and serves the next request" test "$(status "$B_URL/v1/completions" '{"prompt":"Hi","max_tokens":2}' "${KEY[@]}")" = 200

echo "== malformed requests"
n_bad=0
n_sent=0
# send STATUS METHOD PATH CTYPE BODYFILE|- WHY
send() {
    local want="$1" method="$2" path="$3" ctype="$4" bodyf="$5" why="$6"
    local args=(-s --path-as-is --max-time 20 -o "$WORK/mal.out" -w '%{http_code}' -X "$method")
    rm -f "$WORK/mal.out"
    case "$ctype" in
        json) args+=(-H 'Content-Type: application/json') ;;
        -) args+=(-H 'Content-Type:') ;;
        *) args+=(-H "Content-Type: $ctype") ;;
    esac
    [ "$bodyf" != - ] && args+=(--data-binary "@$bodyf")
    local got
    got=$(curl "${args[@]}" "$A_URL$path")
    n_sent=$((n_sent + 1))
    if [ "$got" != "$want" ] || ! jq -e '(.error.message | type) == "string" and (.error.type | type) == "string"' "$WORK/mal.out" >/dev/null 2>&1; then
        n_bad=$((n_bad + 1))
        echo "  malformed '$why': want $want, got $got: $(head -c 300 "$WORK/mal.out")" >&2
    fi
    if ! health_ok; then
        n_bad=$((n_bad + 1))
        echo "  /health is not 200 after '$why'" >&2
    fi
}
while IFS=$'\t' read -r want method path ctype body why; do
    case "$want" in '#'* | '') continue ;; esac
    case "$body" in
        -) bodyf=- ;;
        @empty) : >"$WORK/mal.body"; bodyf="$WORK/mal.body" ;;
        @b64:*) printf '%s' "${body#@b64:}" | base64 -d >"$WORK/mal.body"; bodyf="$WORK/mal.body" ;;
        *) printf '%s' "$body" >"$WORK/mal.body"; bodyf="$WORK/mal.body" ;;
    esac
    send "$want" "$method" "$path" "$ctype" "$bodyf" "$why"
done <"$EMBER_SRC/tests/server/malformed.txt"
n_list=$n_sent
# generated mutations of two valid requests: every field given a value of a wrong type, values
# out of range, and the bodies cut short at many places
base_chat='{"model":"kimi_a.gguf","messages":[{"role":"user","content":"Hi"}],"max_tokens":4,"temperature":0.5,"top_p":0.9,"top_k":10,"min_p":0.1,"seed":1,"n":1,"stream":false,"stop":["zz"],"stream_options":{"include_usage":false}}'
base_comp='{"model":"kimi_a.gguf","prompt":"Hi","max_tokens":4,"temperature":0.5,"top_p":0.9,"top_k":10,"min_p":0.1,"seed":1,"n":1,"stream":false,"stop":"zz","echo":false}'
mutate() { # BASE PATH FIELD VALUE
    jq -c --arg f "$3" --argjson v "$4" '.[$f] = $v' <<<"$1" >"$WORK/mal.body"
    send 400 POST "$2" json "$WORK/mal.body" "$3 = $4"
}
for base in chat comp; do
    if [ $base = chat ]; then b=$base_chat; path=/v1/chat/completions; else b=$base_comp; path=/v1/completions; fi
    for f in max_tokens temperature top_p top_k min_p seed n; do
        for v in '"x"' '[]' '{}' 'true'; do mutate "$b" "$path" "$f" "$v"; done
    done
    for v in '5' '[]' '{}' 'true'; do mutate "$b" "$path" model "$v"; done
    for v in '5' '{}' 'true' '[1]' '[[]]'; do mutate "$b" "$path" stop "$v"; done
    for v in '"x"' '1' '[]' '{}'; do mutate "$b" "$path" stream "$v"; done
    for v in '"x"' '5' '[]'; do mutate "$b" "$path" stream_options "$v"; done
    for fv in 'temperature -1' 'temperature 2.01' 'temperature 1e9' 'top_p -0.5' 'top_p 1.01' 'min_p -1' \
        'min_p 1.5' 'top_k -1' 'top_k 1e10' 'max_tokens 0' 'max_tokens -1' 'max_tokens 4097' 'max_tokens 1e15' \
        'max_tokens 2.5' 'n 0' 'n 2' 'n 100'; do
        mutate "$b" "$path" "${fv% *}" "${fv#* }"
    done
    len=${#b}
    for ((k = 1; k < len; k += 9)); do
        printf '%s' "${b:0:k}" >"$WORK/mal.body"
        send 400 POST "$path" json "$WORK/mal.body" "$base cut at $k"
    done
done
for v in '"x"' '5' '{}' '[]' '[5]' '[{}]' '[{"role":"user","content":5}]' '[{"role":"nobody","content":"x"}]' '[null]'; do
    mutate "$base_chat" /v1/chat/completions messages "$v"
done
for v in '5' '{}' '[]' '[-1]' '[512]' '[true]' '["a","b"]' '""' '[[1],[2]]'; do
    mutate "$base_comp" /v1/completions prompt "$v"
done
check "malformed: $n_sent requests ($n_list listed, $((n_sent - n_list)) generated), each the right 4xx with an error object, /health 200 after each ($n_bad problems)" test "$n_bad" = 0
check "malformed: at least 100 of them" test "$n_sent" -ge 100
# broken HTTP itself (libmicrohttpd answers these)
raw_status() {
    timeout 5 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1"; printf "%b" "$2" >&3; head -n 1 <&3' _ "$A_PORT" "$1" | awk '{ print $2 }'
}
for req in 'GET /health HTTP/1.1\r\nBad Header Line\r\n\r\n' 'GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n' \
    'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n' \
    'POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\nzz\r\n' \
    'BREW /v1/models HTTP/1.1\r\nHost: x\r\n\r\n'; do
    s=$(raw_status "$req")
    check "broken HTTP ('$(printf '%.48s' "$req")...'): 4xx ($s)" bash -c '[ "${1:0:1}" = 4 ]' _ "$s"
done
# A 70 kB header: libmicrohttpd answers 431, or, when its buffer fills before the request has
# been sent, resets the connection (no status line); either way it is refused, never served.
s=$(raw_status 'GET /health HTTP/1.1\r\nHost: x\r\nX-Big: '"$(head -c 70000 /dev/zero | tr '\0' x)"'\r\n\r\n')
check "broken HTTP (a 70 kB header): refused, 4xx or a reset (${s:-reset})" bash -c '[ -z "$1" ] || [ "${1:0:1}" = 4 ]' _ "$s"
check "/health is 200 after all of it" health_ok

echo "== speculative decoding (--draft, the DSpark fixture drafter)"
DRAFT="$WORK/dspark.gguf"
if timeout 120 "$EMBER_BIN" convert "$EMBER_SRC/tests/fixtures/dspark_deepspec" -o "$DRAFT" --type f32 >/dev/null 2>&1; then
    echo "== a drafter on a device this machine lacks: exit 1 at startup, naming CUDA"
    timeout 10 "$EMBER_BIN" serve -m "$MODEL" --draft "$DRAFT" --port 0 --draft-device cuda:7 >/dev/null 2>"$WORK/flag.err"
    rc=$?
    check "serve --draft-device cuda:7: exit 1, names CUDA ($(tail -c 100 "$WORK/flag.err"))" \
        bash -c '[ "$1" = 1 ] && grep -q CUDA "$2"' _ "$rc" "$WORK/flag.err"
    srv_start C --draft "$DRAFT" --verify-width 4 --feature-dtype bf16
    body='{"prompt":"Once upon a time","max_tokens":20,"temperature":0,"ignore_eos":true,"return_tokens":true}'
    plain=$(post "$A_URL/v1/completions" "$body")
    resp=$(post "$C_URL/v1/completions" "$body")
    check "--draft: greedy tokens equal plain decoding's" test "$(jq -c '.choices[0].tokens' <<<"$resp")" = "$(jq -c '.choices[0].tokens' <<<"$plain")"
    check "--draft: timings count drafts (draft_n > 0, accepted <= drafted)" jqc '.timings.draft_n > 0 and .timings.draft_n_accepted <= .timings.draft_n' <<<"$resp"
    drafted=$(metric "$C_URL" ember_spec_drafted_total)
    check "--draft: /metrics counts drafts ($drafted)" bash -c '[ "${1%%.*}" -gt 0 ]' _ "${drafted:-0}"
    check "--draft: timings name the drafter's device and time" jqc '.timings.draft_device == "cpu" and .timings.draft_ms > 0' <<<"$resp"
    dsec=$(metric "$C_URL" ember_spec_draft_seconds_total)
    check "--draft: /metrics counts the drafter's seconds ($dsec) and its device" bash -c 'awk "BEGIN { exit !($1 > 0) }" && curl -s --max-time 5 "$2/metrics" | grep -qx "ember_device_info{target=\"cpu\",drafter=\"cpu\"} 1"' _ "${dsec:-0}" "$C_URL"
    check "--draft: /props names the drafter's device" jqc '.speculative.draft_device == "cpu" and .device == "cpu"' <<<"$(curl -s --max-time 5 "$C_URL/props")"
    srv_stop C
else
    bad "cannot convert the drafter fixture"
fi

echo "== shutdown"
srv_stop A
srv_stop B
srv_finish
