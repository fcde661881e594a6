#!/usr/bin/env bash
# bench/bench_widths.sh: target forward cost per decode / verify step at several widths
# (`ember bench --verify-width W`), optionally A/B against a second binary. On a shared machine
# the numbers drift by tens of percent within minutes, so with --base the two binaries run
# interleaved (base, new, base, new) and each line shows both pairs of medians.
#
#   bench/bench_widths.sh [-m MODEL.gguf] [--threads "2 1"] [--widths "1 2 4 8"] [--reps R]
#                         [-p P] [-n N] [--base OTHER_EMBER_BIN]
#
# EMBER_BIN selects the binary (default build/ember); the model defaults to the shipped
# target. Prints rows/s (tok/s at W=1) medians and the step time in ms.
set -euo pipefail

EMBER_BIN=${EMBER_BIN:-build/ember}
MODEL=models/kimi-linear-19m-q8_0.gguf
THREADS="2 1"
WIDTHS="1 2 4 8"
REPS=5
P=128
N=64
BASE=""
while [ $# -gt 0 ]; do
    case "$1" in
    -m) MODEL=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --widths) WIDTHS=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    -p) P=$2; shift 2 ;;
    -n) N=$2; shift 2 ;;
    --base) BASE=$2; shift 2 ;;
    *) echo "bench_widths: unknown argument $1" >&2; exit 2 ;;
    esac
done

median() { # BIN THREADS WIDTH -> median rows/s
    "$1" bench -m "$MODEL" -p "$P" -n "$N" --threads "$2" --reps "$REPS" --verify-width "$3" 2>/dev/null |
        awk '/^(decode|verify)/ { print $8 }'
}

ms() { awk -v w="$1" -v r="$2" 'BEGIN { printf "%.3f", (r > 0 ? 1000 * w / r : 0) }'; }

for t in $THREADS; do
    for w in $WIDTHS; do
        if [ -n "$BASE" ]; then
            a1=$(median "$BASE" "$t" "$w"); b1=$(median "$EMBER_BIN" "$t" "$w")
            a2=$(median "$BASE" "$t" "$w"); b2=$(median "$EMBER_BIN" "$t" "$w")
            printf 'threads %s W=%s  base %s %s (%s ms)  new %s %s (%s ms)\n' "$t" "$w" "$a1" "$a2" \
                "$(ms "$w" "$a2")" "$b1" "$b2" "$(ms "$w" "$b2")"
        else
            r=$(median "$EMBER_BIN" "$t" "$w")
            printf 'threads %s W=%s  %s rows/s  %s ms/step\n' "$t" "$w" "$r" "$(ms "$w" "$r")"
        fi
    done
done
