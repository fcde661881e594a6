-- bench/server_post.lua: wrk script for bench/bench_server.sh. Every request is the same POST
-- (body from $EMBER_BENCH_BODY, path from $EMBER_BENCH_PATH); a response that is not 200 is
-- counted, so a run with errors can be told apart from a fast one.
wrk.method = "POST"
wrk.path = os.getenv("EMBER_BENCH_PATH") or "/v1/completions"
wrk.body = os.getenv("EMBER_BENCH_BODY")
wrk.headers["Content-Type"] = "application/json"

local non200 = 0
function response(status, headers, body)
  if status ~= 200 then non200 = non200 + 1 end
end

function done(summary, latency, requests)
  io.write(string.format("ember_non200 %d\n", non200))
  io.write(string.format("ember_p50_ms %.3f\nember_p99_ms %.3f\nember_requests %d\nember_seconds %.3f\n",
    latency:percentile(50) / 1000, latency:percentile(99) / 1000, summary.requests, summary.duration / 1e6))
end
