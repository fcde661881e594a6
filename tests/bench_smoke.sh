#!/usr/bin/env bash
# tests/bench_smoke.sh: `ember bench` (tools/cmd_bench.c) and `compat_llama_ref bench` (its
# twin through llama.cpp's prebuilt) on a tiny synthetic kimi-linear model (compat_synth_ckpt:
# 4 layers, hidden 256, MLA every 4th layer, converted to Q8_0). Not a speed test: it checks
# the protocol and the output.
#
#   - ember bench --json: one JSON object with the settings given, `reps` runs of prompt and
#     decode rates, all positive, min <= median <= max; --verify-width 3 reports rows/s;
#     --verify-width 5 --commit 3 (a replayed pass at tau 3) reports tok/s and, with experts on
#     storage, bytes per committed token; --commit above the width exits 2;
#     -n 0 has no decode entry; prompts longer than the model's default context work;
#   - the text table has a prompt and a decode line;
#   - bad flags exit 2, a missing model exits 1;
#   - bench_pair (the default pair, one prompt a set): speculative tokens equal plain ones;
#   - compat_llama_ref bench --json: the same fields, llama.cpp's settings reported (n_ubatch
#     512, F16 K/V cache); skipped (the rest still counts) when npm cannot install the package.
#
# Env (set by CTest): EMBER_BIN, EMBER_SRC, EMBER_BUILD.
set -u

SRC="${EMBER_SRC:-$(cd "$(dirname "$0")/.." && pwd)}"
BUILD="${EMBER_BUILD:-$SRC/build}"
EMBER="${EMBER_BIN:-$BUILD/ember}"
SYNTH="$BUILD/compat_synth_ckpt"
REF="$BUILD/compat_llama_ref"

. "$SRC/tests/lib/check.sh"
. "$SRC/tests/lib/npm_ggml.sh"
em_need_exes bench_smoke "$EMBER" "$SYNTH" "$REF"
command -v python3 >/dev/null || { echo "skipped: python3 is needed to read the JSON"; exit 77; }

W="$BUILD/testtmp/bench_smoke"
rm -rf "$W"
mkdir -p "$W"
"$SYNTH" "$W/ckpt" --hidden 256 --layers 4 --mla-every 4 --heads 2 --experts 8 --top-k 2 --ff-exp 128 \
    --ff 512 --vocab 1024 >/dev/null || { echo "FAIL: compat_synth_ckpt"; exit 1; }
"$EMBER" convert "$W/ckpt" -o "$W/tiny.gguf" --type q8_0 >"$W/convert.txt" 2>&1 ||
    { echo "FAIL: ember convert"; cat "$W/convert.txt"; exit 1; }
grep -q '"mla_use_nope"' "$W/ckpt/config.json" && pass || fail "config.json"
# MLA every 4th layer: layer 3 (the last) only
grep -q '"full_attn_layers": \[4\]' "$W/ckpt/config.json" && pass || fail "full_attn_layers: $(grep -o '"full_attn_layers": [^]]*]' "$W/ckpt/config.json")"

# check_json FILE ENGINE REPS WIDTH NGEN [COMMIT]: the fields and the ordering of the statistics
check_json() {
    python3 - "$@" <<'EOF'
import json, sys
path, engine, reps, width, n_gen = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
commit = int(sys.argv[6]) if len(sys.argv) > 6 else width
lines = [l for l in open(path) if l.strip()]
assert len(lines) == 1, f"{len(lines)} lines"
o = json.loads(lines[0])
assert o["engine"] == engine, o["engine"]
assert o["reps"] == reps and o["verify_width"] == width and o["n_gen"] == n_gen and o["threads"] == 2, o
if engine == "ember":
    assert o["commit"] == commit, o["commit"]
metrics = [("prompt", "tok/s")] + ([("decode", "tok/s" if width == 1 or commit < width else "rows/s")] if n_gen > 0 else [])
if n_gen == 0:
    assert "decode" not in o, "decode reported for -n 0"
for key, unit in metrics:
    m = o[key]
    assert m["unit"] == unit, (key, m["unit"])
    assert len(m["runs"]) == reps and all(v > 0 for v in m["runs"]), (key, m["runs"])
    assert m["min"] == min(m["runs"]) and m["max"] == max(m["runs"]) and m["min"] <= m["median"] <= m["max"], m
if engine == "llama.cpp":
    assert o["n_ubatch"] == 512 and o["kv_types"] == "K (f16) V (f16)", (o["n_ubatch"], o["kv_types"])
EOF
}

B=(-p 40 -n 4 --threads 2 --reps 2 --warmup 1)
if "$EMBER" bench -m "$W/tiny.gguf" "${B[@]}" --json >"$W/e1.json" 2>"$W/e1.err"; then
    check_json "$W/e1.json" ember 2 1 4 && pass || fail "ember bench --json: $(cat "$W/e1.json")"
else
    fail "ember bench --json: $(cat "$W/e1.err")"
fi
# the CPU breakdown: phases whose weight bytes add up to what a step streams, and the read reference
python3 - "$W/e1.json" <<'EOF' && pass || fail "ember bench --json phases / read rate: $(cat "$W/e1.json")"
import json, sys
o = json.load(open(sys.argv[1]))
ph = o["decode_phases"]
assert len(ph) > 5 and all(p["ms_per_step"] >= 0 and p["pool_runs_per_step"] >= 0 for p in ph), ph
mb = sum(p["weight_mb_per_step"] for p in ph if p["name"] != "embed")
assert abs(mb * 1e6 - o["weight_bytes_per_step"]) <= 1e-6 * o["weight_bytes_per_step"] + 1, (mb, o["weight_bytes_per_step"])
for key in ("decode_weight_gbs", "read_same_bytes_gbs"):
    assert o[key]["unit"] == "GB/s" and len(o[key]["runs"]) == 2 and all(v > 0 for v in o[key]["runs"]), o[key]
EOF
"$EMBER" bench -m "$W/tiny.gguf" "${B[@]}" --phases >"$W/e6.txt" 2>&1 &&
    grep -q '^decode step by phase' "$W/e6.txt" && grep -q '^  lm_head ' "$W/e6.txt" && grep -q '^read  ' "$W/e6.txt" &&
    pass || fail "ember bench --phases: $(cat "$W/e6.txt")"
"$EMBER" bench -m "$W/tiny.gguf" "${B[@]}" --verify-width 3 --json >"$W/e2.json" 2>"$W/e2.err" &&
    check_json "$W/e2.json" ember 2 3 4 && pass || fail "ember bench --verify-width 3: $(cat "$W/e2.json")"
# a replayed speculative pass at tau 3: 5 rows verified, 3 committed, experts from storage
"$EMBER" bench -m "$W/tiny.gguf" "${B[@]}" --verify-width 5 --commit 3 --moe-storage ssd --expert-cache 512K --json \
    >"$W/e7.json" 2>"$W/e7.err" && check_json "$W/e7.json" ember 2 5 4 3 &&
    python3 -c 'import json, sys; o = json.load(open(sys.argv[1])); b = o["storage_bytes_per_row"]; assert b["unit"] == "bytes" and all(v > 0 for v in b["runs"]), b' "$W/e7.json" &&
    pass || fail "ember bench --verify-width 5 --commit 3: $(cat "$W/e7.json" "$W/e7.err")"
"$EMBER" bench -m "$W/tiny.gguf" --verify-width 3 --commit 4 >/dev/null 2>"$W/e8.err"
check "exit of --commit above --verify-width" 2 $?
grep -q "commits at most" "$W/e8.err" && pass || fail "--commit message: $(cat "$W/e8.err")"
"$EMBER" bench -m "$W/tiny.gguf" -p 40 -n 0 --threads 2 --reps 3 --json >"$W/e3.json" 2>"$W/e3.err" &&
    check_json "$W/e3.json" ember 3 1 0 && pass || fail "ember bench -n 0: $(cat "$W/e3.json")"
"$EMBER" bench -m "$W/tiny.gguf" -p 4200 -n 2 --threads 2 --reps 1 --warmup 0 >"$W/e4.txt" 2>&1 &&
    grep -q '^prompt  *4200 tokens' "$W/e4.txt" && grep -q '^decode  *2 steps' "$W/e4.txt" && pass ||
    fail "ember bench table / long prompt: $(cat "$W/e4.txt")"
"$EMBER" bench -m "$W/tiny.gguf" --verify-width 0 >/dev/null 2>&1
check "exit of --verify-width 0" 2 $?
"$EMBER" bench -m "$W/tiny.gguf" --frobnicate 1 >/dev/null 2>&1
check "exit of an unknown flag" 2 $?
"$EMBER" bench -m "$W/missing.gguf" >/dev/null 2>"$W/e5.err"
check "exit of a missing model" 1 $?
grep -q "missing.gguf" "$W/e5.err" && pass || fail "missing model message: $(cat "$W/e5.err")"

# bench_pair (bench/bench_pair.c): the default pair on one prompt of each set, plain and
# speculative in one process; its own identity check decides the exit status
if [ -x "$BUILD/bench_pair" ] && [ -f "$SRC/models/dspark-kimi-linear-19m-q8_0.gguf" ]; then
    (cd "$SRC" && "$BUILD/bench_pair" --limit 1 -n 16 --threads 1) >"$W/p1.txt" 2>"$W/p1.err" &&
        [ "$(grep -c 'identical 1/1' "$W/p1.txt")" = 2 ] && pass || fail "bench_pair: $(cat "$W/p1.txt" "$W/p1.err" | tail -n 4)"
    "$BUILD/bench_pair" --limit 0 >/dev/null 2>&1
    check "bench_pair: exit of --limit 0" 2 $?
fi

BINS=$(em_npm_ggml_bins "$SRC")
rc=$?
if [ $rc -eq 77 ]; then
    echo "llama.cpp part skipped (npm package unavailable)"
elif [ $rc -ne 0 ]; then
    fail "npm package"
else
    em_preload_stdcxx_for_asan "$REF"
    if "$REF" bench "$BINS" "$W/tiny.gguf" "${B[@]}" --json >"$W/l1.json" 2>"$W/l1.err"; then
        check_json "$W/l1.json" llama.cpp 2 1 4 && pass || fail "llama bench --json: $(cat "$W/l1.json")"
    else
        fail "compat_llama_ref bench: $(tail -n 5 "$W/l1.err")"
    fi
    "$REF" bench "$BINS" "$W/tiny.gguf" "${B[@]}" --verify-width 3 --json >"$W/l2.json" 2>"$W/l2.err" &&
        check_json "$W/l2.json" llama.cpp 2 3 4 && pass || fail "llama bench --verify-width 3: $(tail -n 5 "$W/l2.err")"
fi
rm -rf "$W"
finish
