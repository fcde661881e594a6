#!/usr/bin/env bash
# bench/expert_rss.sh: routed experts resident vs from storage on a model whose experts
# dominate: bench/bench_kimi.sh's synthetic 1.6 GB Kimi-Linear (1.10 GiB of routed experts,
# 11 MoE layers x 32 experts of 3.2 MiB, top-8; made and cached the same way when missing).
# Runs bench_expert_storage (bench/bench_expert_storage.c) once per mode, each in its own
# process, and prints its lines: peak RSS, resident / file-backed / budget bytes, and with
# ssd a cache of CACHE_FRAC (0.25) of the experts: expert bytes read per decoded token and per
# verified row at widths 2, 4, 8, hit rates, the read rate against the disk's sequential rate
# measured in the same run (O_DIRECT), and the cost hints.
#
#   bash bench/expert_rss.sh [BUILD_DIR]
#
# Env: THREADS (2), N_PROMPT (16), N_GEN (32), VERIFY_STEPS (4), CACHE_FRAC (0.25), WORK
# (the model cache folder, default build/bench of the source tree, shared with bench_kimi.sh).
set -eu

SRC="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="$(cd "${1:-$SRC/build}" && pwd)"
THREADS="${THREADS:-2}"
N_PROMPT="${N_PROMPT:-16}"
N_GEN="${N_GEN:-32}"
VERIFY_STEPS="${VERIFY_STEPS:-4}"
CACHE_FRAC="${CACHE_FRAC:-0.25}"
WORK="${WORK:-$SRC/build/bench}"
SYNTH_ARGS="--hidden 2048 --layers 12 --mla-every 4 --heads 16 --experts 32 --top-k 8 --ff-exp 512 --ff 4096 --vocab 32768 --seed 7"
BENCH="$BUILD/bench_expert_storage"
for f in "$BENCH" "$BUILD/ember" "$BUILD/compat_synth_ckpt"; do
    [ -x "$f" ] || { echo "expert_rss: $f is missing (build first)" >&2; exit 1; }
done

mkdir -p "$WORK"
MODEL="$WORK/kimi-bench-q8_0.gguf"
if [ ! -f "$MODEL" ] || [ "$(cat "$MODEL.args" 2>/dev/null)" != "$SYNTH_ARGS" ]; then
    rm -f "$MODEL" "$MODEL.args"
    trap 'rm -rf "$WORK/ckpt" "$MODEL.partial"' EXIT
    echo "== writing the synthetic checkpoint ($SYNTH_ARGS)"
    # shellcheck disable=SC2086
    "$BUILD/compat_synth_ckpt" "$WORK/ckpt" $SYNTH_ARGS >/dev/null
    "$BUILD/ember" convert "$WORK/ckpt" -o "$MODEL.partial" --type q8_0 >/dev/null
    rm -rf "$WORK/ckpt"
    mv "$MODEL.partial" "$MODEL"
    printf '%s\n' "$SYNTH_ARGS" >"$MODEL.args"
    trap - EXIT
fi
echo "model: $MODEL ($(du -h "$MODEL" | cut -f1))"
for mode in resident ssd; do
    echo "== $mode"
    "$BENCH" -m "$MODEL" --storage "$mode" --cache-frac "$CACHE_FRAC" -p "$N_PROMPT" -n "$N_GEN" \
        --verify-steps "$VERIFY_STEPS" --threads "$THREADS" 2>&1
done
