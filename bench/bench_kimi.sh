#!/usr/bin/env bash
# bench/bench_kimi.sh: Ember vs llama.cpp speed on a kimi-linear model large enough to be
# memory-bound (issue 4). Builds once, and caches, a synthetic Kimi-Linear checkpoint with
# random weights (tests/compat/synth_ckpt.c) converted by `ember convert --type q8_0`, then
# runs `ember bench` and llama.cpp's prebuilt (`compat_llama_ref bench`, the npm package
# @node-llama-cpp/linux-x64@3.22.1) alternately REPS times with the same thread count, and
# prints prompt tok/s (N_PROMPT tokens in one prefill) and decode tok/s (N_GEN single-token
# steps) as min / median / max per engine and the ratio of the medians (Ember / llama.cpp).
#
#   bash bench/bench_kimi.sh [BUILD_DIR]
#
# BUILD_DIR (default build) holds ember, compat_synth_ckpt and compat_llama_ref. Env knobs:
#   THREADS (2), REPS (5), N_PROMPT (512), N_GEN (64), WARMUP (1: untimed repetitions in each
#   process before its timed one), VERIFY_WIDTH (1; W > 1 times verify(W)+commit(W) steps in
#   Ember and W-token batches in llama.cpp, as rows/s), WORK (cache folder, default
#   build/bench of the source tree), SYNTH_ARGS (the geometry, below), KEEP_JSON (1: keep the
#   per-run JSON lines in WORK/runs-*.jsonl), QUIET_WAIT (60: before each run, wait up to this
#   many seconds for a second in which the CPUs are at least 85% idle; 0: do not wait).
#
# The development machine is shared (2 cores, other builds and tests come and go), and a
# busy core hurts llama.cpp most: its threads spin at every graph barrier, so one preempted
# thread stalls the other. Runs therefore start on a quiet second when one comes, the two
# engines alternate, and the ratio is taken from runs interleaved in time. The load average
# before and after is printed; rerun when it is far above 0 + THREADS.
#
# Default geometry (Kimi-Linear's shape, scaled): hidden 2048, 12 layers of which every 4th is
# MLA (layers 3, 7, 11; the other 9 KDA with 16 heads x 128), 16 MLA heads (kv_lora 512, nope
# 128, rope 64, v 128), layer 0 a dense SwiGLU of 4096, layers 1-11 MoE with 32 experts of 512
# (8 per token) plus one shared expert of 512, vocabulary 32768. 1.50 G parameters = 1.60 GB
# at Q8_0 (3.0 GB of BF16 safetensors while converting, deleted afterwards). Per token a
# decode step reads ~0.64 GB of weights: attention 0.21 GB, routed experts 0.29 GB, LM head
# 0.07 GB, dense + shared MLPs 0.06 GB.
#
# Besides the table: Ember's decode weight rate (weight bytes a step streams x steps/s) as a
# share of a plain read of as many bytes of the model file timed right after each run, and
# where its decode step's time goes (ember bench's phases).
#
# llama.cpp runs with its own defaults for speed: F16 K/V cache, flash attention auto,
# n_ubatch 512, weights mmap'd (and repacked where its CPU backend has a repacked layout);
# n_threads = n_threads_batch = THREADS. Ember runs with its defaults (prefill ubatch 128).
set -eu

SRC="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="$(cd "${1:-$SRC/build}" && pwd)"
THREADS="${THREADS:-2}"
REPS="${REPS:-5}"
N_PROMPT="${N_PROMPT:-512}"
N_GEN="${N_GEN:-64}"
WARMUP="${WARMUP:-1}"
VERIFY_WIDTH="${VERIFY_WIDTH:-1}"
WORK="${WORK:-$SRC/build/bench}"
SYNTH_ARGS="${SYNTH_ARGS:---hidden 2048 --layers 12 --mla-every 4 --heads 16 --experts 32 --top-k 8 --ff-exp 512 --ff 4096 --vocab 32768 --seed 7}"
EMBER="$BUILD/ember"
SYNTH="$BUILD/compat_synth_ckpt"
REF="$BUILD/compat_llama_ref"

for f in "$EMBER" "$SYNTH" "$REF"; do
    [ -x "$f" ] || { echo "bench_kimi: $f is missing (build first)" >&2; exit 1; }
done
command -v python3 >/dev/null || { echo "bench_kimi: python3 is needed for the table" >&2; exit 1; }
. "$SRC/tests/lib/npm_ggml.sh"
BINS=$(em_npm_ggml_bins "$SRC") || exit $?

# ---- the model (cached: rebuilt only when SYNTH_ARGS change) ------------------------------
mkdir -p "$WORK"
MODEL="$WORK/kimi-bench-q8_0.gguf"
if [ ! -f "$MODEL" ] || [ "$(cat "$MODEL.args" 2>/dev/null)" != "$SYNTH_ARGS" ]; then
    rm -f "$MODEL" "$MODEL.args"
    trap 'rm -rf "$WORK/ckpt" "$MODEL.partial"' EXIT
    echo "== writing the synthetic checkpoint ($SYNTH_ARGS)"
    # shellcheck disable=SC2086
    bytes=$("$SYNTH" "$WORK/ckpt" $SYNTH_ARGS)
    echo "   $bytes bytes of BF16 tensors"
    echo "== converting to Q8_0"
    "$EMBER" convert "$WORK/ckpt" -o "$MODEL.partial" --type q8_0 >"$WORK/convert.txt"
    rm -rf "$WORK/ckpt"
    mv "$MODEL.partial" "$MODEL"
    printf '%s\n' "$SYNTH_ARGS" >"$MODEL.args"
    trap - EXIT
fi
echo "model: $MODEL ($(du -h "$MODEL" | cut -f1)), geometry: $SYNTH_ARGS"

# ---- alternating runs ---------------------------------------------------------------------
COMMON=(-p "$N_PROMPT" -n "$N_GEN" --threads "$THREADS" --reps 1 --warmup "$WARMUP" --verify-width "$VERIFY_WIDTH" --json)
EM_CMD=("$EMBER" bench -m "$MODEL" "${COMMON[@]}")
LL_CMD=("$REF" bench "$BINS" "$MODEL" "${COMMON[@]}")
echo "ember:     ${EM_CMD[*]}"
echo "llama.cpp: ${LL_CMD[*]}"
QUIET_WAIT="${QUIET_WAIT:-60}"
# Waits up to $1 s for a second with the CPUs >= 85% idle (/proc/stat); 1 when none came.
wait_quiet() {
    local max="$1" waited=0 s1 s2
    while [ "$waited" -lt "$max" ]; do
        s1=$(head -n 1 /proc/stat)
        sleep 1
        s2=$(head -n 1 /proc/stat)
        # fields: cpu user nice system idle iowait irq softirq steal
        if awk -v a="$s1" -v b="$s2" 'BEGIN { split(a, x); split(b, y); busy = 0; idle = 0
                for (i = 2; i <= 9; i++) { d = y[i] - x[i]; if (i == 5 || i == 6) idle += d; else busy += d }
                exit !(busy * 100 <= (busy + idle) * 15) }'; then
            return 0
        fi
        waited=$((waited + 1))
    done
    return 1
}
noisy=0
EM_OUT="$WORK/runs-ember.jsonl"
LL_OUT="$WORK/runs-llama.jsonl"
: >"$EM_OUT"
: >"$LL_OUT"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq 1 "$REPS"); do
    if [ "$QUIET_WAIT" -gt 0 ]; then wait_quiet "$QUIET_WAIT" || noisy=$((noisy + 1)); fi
    "${EM_CMD[@]}" >>"$EM_OUT"
    if [ "$QUIET_WAIT" -gt 0 ]; then wait_quiet "$QUIET_WAIT" || noisy=$((noisy + 1)); fi
    "${LL_CMD[@]}" >>"$LL_OUT" 2>"$WORK/llama.err" || { cat "$WORK/llama.err" >&2; exit 1; }
    echo "   run $r/$REPS done (load $(cut -d' ' -f1 /proc/loadavg))"
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

python3 - "$EM_OUT" "$LL_OUT" "$load_before" "$load_after" "$noisy" <<'EOF'
import json, statistics, sys
em = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
ll = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
def runs(rows, key):
    return [v for r in rows if key in r for v in r[key]["runs"]]
first = ll[0]
w = first["verify_width"]
print()
print(f"threads {first['threads']}, {len(em)} alternating runs per engine, prompt {first['n_prompt']} tokens, "
      f"decode {first['n_gen']} steps of {w} row(s)")
print(f"llama.cpp: n_batch {first['n_batch']}, n_ubatch {first['n_ubatch']}, flash attention "
      f"{first['flash_attn']}, {first['kv_types']}")
print(f"load average (1/5/15 min) before: {sys.argv[3]}, after: {sys.argv[4]}; "
      f"runs started without a quiet second: {sys.argv[5]}")
print()
hdr = f"| {'metric':<16} | {'Ember min / median / max':>28} | {'llama.cpp min / median / max':>28} | {'Ember/llama':>11} |"
print(hdr)
print("|" + "-" * 18 + "|" + "-" * 30 + "|" + "-" * 30 + "|" + "-" * 13 + "|")
for key, name in (("prompt", "prompt tok/s"), ("decode", "decode tok/s" if w == 1 else f"verify{w} rows/s")):
    a, b = runs(em, key), runs(ll, key)
    if not a or not b:
        continue
    fa = f"{min(a):.2f} / {statistics.median(a):.2f} / {max(a):.2f}"
    fb = f"{min(b):.2f} / {statistics.median(b):.2f} / {max(b):.2f}"
    ratio = statistics.median(a) / statistics.median(b)
    print(f"| {name:<16} | {fa:>28} | {fb:>28} | {ratio:>10.2f}x |")
# the memory roofline: each Ember run's decode weight rate against its own plain read of as many
# bytes of the model file, right after it (ember bench: decode_weight_gbs / read_same_bytes_gbs)
roof = [(r["decode_weight_gbs"]["median"], r["read_same_bytes_gbs"]["median"]) for r in em
        if "decode_weight_gbs" in r and r["read_same_bytes_gbs"]["median"] > 0]
if roof:
    fr = [m / rd for m, rd in roof]
    print()
    print(f"Ember decode streams {statistics.median(m for m, _ in roof):.2f} GB/s of weights "
          f"({em[0]['weight_bytes_per_step'] / 1e9:.3f} GB a step); a plain {first['threads']}-thread read of as many "
          f"bytes of the model right after each run: {statistics.median(rd for _, rd in roof):.2f} GB/s; "
          f"per run {min(fr):.0%} / {statistics.median(fr):.0%} / {max(fr):.0%} of it (min / median / max)")
phases = [r["decode_phases"] for r in em if "decode_phases" in r]
if phases:
    print()
    print("Ember decode step by phase (medians over the runs):")
    print(f"  {'phase':<18} {'ms':>8} {'share':>6} {'weight MB':>10} {'GB/s':>7} {'pool runs':>10}")
    total = statistics.median(sum(p["ms_per_step"] for p in run) for run in phases)
    for i, p0 in enumerate(phases[0]):
        med = lambda k: statistics.median(run[i][k] for run in phases)
        if med("ms_per_step") == 0:
            continue
        print(f"  {p0['name']:<18} {med('ms_per_step'):>8.3f} {100 * med('ms_per_step') / total:>5.1f}% "
              f"{med('weight_mb_per_step'):>10.2f} {med('gb_per_s'):>7.2f} {med('pool_runs_per_step'):>10.1f}")
EOF
[ "${KEEP_JSON:-0}" = 1 ] || rm -f "$EM_OUT" "$LL_OUT" "$WORK/llama.err"
