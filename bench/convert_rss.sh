#!/usr/bin/env bash
# bench/convert_rss.sh: peak resident memory of `ember convert` on a multi-GB checkpoint.
# Writes a synthetic Kimi-Linear checkpoint (BF16, two safetensors shards; the generator,
# tests/compat/synth_ckpt.c, streams it, so it needs no memory either), converts it to Q8_0
# under /usr/bin/time -v, prints the peak RSS and the conversion report, and deletes both.
#
#   bash bench/convert_rss.sh [BUILD_DIR] [WORK_DIR]
#
# BUILD_DIR (default build) holds ember and compat_synth_ckpt; WORK_DIR (default a fresh
# folder under /tmp) gets ~3.4 GB of checkpoint and ~1.8 GB of GGUF. Size knobs: SYNTH_ARGS
# (default: hidden 2048, 6 layers, 48 experts of 1024, vocab 32768 = 3.59 GB of tensors).
# The claim it checks: peak RSS stays under 1 GiB (it is ~20 MiB: the source is read with
# pread into bounded buffers, never mapped).
set -eu

SRC="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${1:-$SRC/build}"
WORK="${2:-$(mktemp -d /tmp/ember-convert-rss.XXXXXX)}"
SYNTH_ARGS="${SYNTH_ARGS:---hidden 2048 --layers 6 --experts 48 --ff-exp 1024 --ff 4096 --vocab 32768 --heads 16 --shards 2}"
EMBER="$BUILD/ember"
SYNTH="$BUILD/compat_synth_ckpt"
for f in "$EMBER" "$SYNTH"; do
    [ -x "$f" ] || { echo "convert_rss: $f is missing (build first)" >&2; exit 1; }
done
[ -x /usr/bin/time ] || { echo "convert_rss: /usr/bin/time is missing (apt-get install time)" >&2; exit 1; }

mkdir -p "$WORK"
trap 'rm -rf "$WORK/ckpt" "$WORK/out.gguf" "$WORK"/out.gguf.partial.* "$WORK/report.json" "$WORK/time.txt"; rmdir "$WORK" 2>/dev/null || true' EXIT

echo "== writing the synthetic checkpoint ($SYNTH_ARGS)"
# shellcheck disable=SC2086
bytes=$("$SYNTH" "$WORK/ckpt" $SYNTH_ARGS)
echo "tensor bytes: $bytes ($(du -sh "$WORK/ckpt" | cut -f1) on disk)"

echo "== converting"
CMD=("$EMBER" convert "$WORK/ckpt" -o "$WORK/out.gguf" --type q8_0 --report "$WORK/report.json")
echo "command: /usr/bin/time -v ${CMD[*]}"
/usr/bin/time -v "${CMD[@]}" 2>"$WORK/time.txt"
rss_kb=$(sed -n 's/^[[:space:]]*Maximum resident set size (kbytes): //p' "$WORK/time.txt")
wall=$(sed -n 's/^[[:space:]]*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$WORK/time.txt")
echo "peak RSS: $rss_kb KiB ($((rss_kb / 1024)) MiB), wall time $wall"
if [ "$rss_kb" -ge $((1024 * 1024)) ]; then
    echo "FAIL: peak RSS is not under 1 GiB"
    exit 1
fi
echo "ok: peak RSS under 1 GiB while converting $bytes bytes of tensors"
