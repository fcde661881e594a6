#!/usr/bin/env bash
# bench/bench_k3.sh: routed experts from storage on a Kimi-K3-shaped model scaled to this
# machine, plain decoding vs speculative verify widths 2, 4, 8.
#
# The model (compat_synth_k3 --variant k, tests/compat/synth_k3.c; random weights, ~1.6 GB):
# K3's layer pattern (KDA layers, MLA at 0-indexed i % 4 == 3 and the last layer, a dense
# layer 0, AttnRes blocks banking every 3 layers) and its expert geometry ratios (experts at a
# latent width of half the hidden width, expert FFN width 6/7 of the latent, top-16 routing,
# two shared experts at full width), scaled: hidden 1024 (K3 7168), 8 layers (93), 256
# experts (896), latent 512 (3584), expert width 448 (3072), vocabulary 2048 (163840); routed
# experts Q8_0 (1.22 GiB), the rest F32. Top-16 of 256 is 6.25% of the experts per token
# (K3: 1.8%), so the cache of 25% of the routed bytes holds a larger share of what a token
# needs than it would on K3: the hit rate here is an upper bound.
#
# `ember bench --moe-storage ssd --expert-cache 25%` (O_DIRECT reads through io_uring), 16
# prompt tokens, then 32 decoded rows: W = 1 is 32 steps of one token, W = 2/4/8 is 32/W
# verify steps of W rows, all committed (the upper bound of a drafter accepting everything);
# "tau 4 / W" is 8 steps of W = 5 or 8 rows of which 4 are committed (`--commit 4`: a drafter
# at tau 4 whose passes replay the plain greedy run, the other W - 4 rows rejected drafts).
# Median of REPS (default 5) repetitions after one warm-up that fills the cache. Prints per
# width: rows/s, bytes read from storage per row and per step, the cache hit rate.
#   bench/bench_k3.sh [BUILD_DIR]      (env REPS, THREADS)
set -eu
SRC="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${1:-${EMBER_BUILD:-$SRC/build}}"
REPS="${REPS:-5}"
THREADS="${THREADS:-2}"
PY=/usr/bin/python3
command -v "$PY" >/dev/null || PY=python3
for x in ember compat_synth_k3 compat_k3_big; do
    [ -x "$BUILD/$x" ] || { echo "bench_k3: build $BUILD/$x first" >&2; exit 1; }
done
W="$BUILD/benchtmp/k3"
mkdir -p "$W"
M="$W/k3_scaled.gguf"
[ -f "$M" ] || "$BUILD/compat_synth_k3" "$M" --variant k >/dev/null
routed=$("$BUILD/compat_k3_big" open "$M" --storage ssd --cache 1073741824 2>/dev/null | sed -n 's/^file_bytes=//p')
cache=$((routed / 4))
echo "model: $M ($(du -h "$M" | cut -f1)), routed experts $routed bytes, expert cache $cache bytes (25%)"
for w in 1 2 4 8 5c4 8c4; do
    width=${w%c*} commit=${w#*c}
    [ "$commit" = "$w" ] && commit=$width
    "$BUILD/ember" bench -m "$M" -p 16 -n $((32 / commit)) --verify-width "$width" --commit "$commit" \
        --reps "$REPS" --warmup 1 --threads "$THREADS" --moe-storage ssd --expert-cache "$cache" --json \
        2>/dev/null >"$W/w$w.json"
done
"$PY" - "$W" <<'PYEOF'
import json, sys
print("| verify width | committed rows/s (median) | storage read per committed row | per verify step | cache hit rate |")
print("|---|---|---|---|---|")
for w in ("1", "2", "4", "8", "5c4", "8c4"):
    d = json.load(open("%s/w%s.json" % (sys.argv[1], w)))
    b = d["storage_bytes_per_row"]["median"]
    name = "1 (plain)" if w == "1" else "tau 4 / %d" % d["verify_width"] if "c" in w else w
    print("| %s | %.1f | %.2f MiB | %.2f MiB | %.1f%% |" % (name, d["decode"]["median"], b / 2**20,
          b * d["commit"] / 2**20, 100 * d["expert_hit_rate"]["median"]))
PYEOF
