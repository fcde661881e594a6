#!/usr/bin/env bash
# bench/bench_spec.sh: plain vs speculative decoding with `ember run --json`, on the same
# prompts, threads and token budget: generation tok/s, tau (mean tokens committed per target
# pass), drafts accepted, the mean verify width, drafter time per block, for plain decoding,
# the confidence/cost scheduler (--verify-width 0) and fixed widths. Greedy, so every
# configuration must produce the same tokens as plain decoding (checked: "same" column).
#
#   bench/bench_spec.sh [TARGET.gguf DRAFT.gguf] [-n N] [--threads T] [--widths "2 4 8"]
#                       [--feature-dtype T] [--prompts FILE (one prompt per line)]
#
# Without model paths it converts the test fixtures (kimi_a + dspark_deepspec, random weights:
# expect tau near 1, the numbers then measure the loop's overhead, not a speedup). EMBER_BIN
# selects the binary (default build/ember). Needs jq.
set -euo pipefail

EMBER_BIN=${EMBER_BIN:-build/ember}
N=64
THREADS=1
WIDTHS="2 4 8"
FTYPE=f32
PROMPTS_FILE=""
POS=()
while [ $# -gt 0 ]; do
    case "$1" in
    -n) N="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --widths) WIDTHS="$2"; shift 2 ;;
    --feature-dtype) FTYPE="$2"; shift 2 ;;
    --prompts) PROMPTS_FILE="$2"; shift 2 ;;
    -h | --help) sed -n '2,14p' "$0"; exit 0 ;;
    *) POS+=("$1"); shift ;;
    esac
done
command -v jq >/dev/null || { echo "bench_spec: jq is needed" >&2; exit 1; }
[ -x "$EMBER_BIN" ] || { echo "bench_spec: no ember binary at $EMBER_BIN (set EMBER_BIN)" >&2; exit 1; }

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
if [ ${#POS[@]} -ge 2 ]; then
    TARGET="${POS[0]}" DRAFT="${POS[1]}"
else
    SRC=$(cd "$(dirname "$0")/.." && pwd)
    TARGET="$WORK/kimi_a.gguf" DRAFT="$WORK/dspark.gguf"
    "$EMBER_BIN" convert "$SRC/tests/fixtures/kimi_a" -o "$TARGET" --type f32 >/dev/null
    "$EMBER_BIN" convert "$SRC/tests/fixtures/dspark_deepspec" -o "$DRAFT" --type f32 >/dev/null
    echo "note: fixtures (random weights): tau ~ 1 is expected; this measures overhead, not speedup"
fi

PROMPTS=()
if [ -n "$PROMPTS_FILE" ]; then
    while IFS= read -r line; do [ -n "$line" ] && PROMPTS+=("$line"); done <"$PROMPTS_FILE"
else
    PROMPTS=("Write a short story about a lighthouse keeper." "Explain how a hash table works."
             "What is 17 times 23? Think step by step." "List five uses of copper.")
fi

# run NAME ARGS...: every prompt once; prints one table row, keeps the tokens in $WORK/NAME.tok
run_config() {
    local name="$1"; shift
    local i=0 json
    : >"$WORK/$name.tok"
    : >"$WORK/$name.jsonl"
    for p in "${PROMPTS[@]}"; do
        json=$("$EMBER_BIN" run -m "$TARGET" --chat -p "$p" -n "$N" --temp 0 --threads "$THREADS" --json "$@" \
               2>"$WORK/err.txt" | tail -n 1) || { cat "$WORK/err.txt" >&2; exit 1; }
        jq -c .tokens <<<"$json" >>"$WORK/$name.tok"
        echo "$json" >>"$WORK/$name.jsonl"
        i=$((i + 1))
    done
    local same=yes
    [ -f "$WORK/plain.tok" ] && ! cmp -s "$WORK/plain.tok" "$WORK/$name.tok" && same=NO
    jq -rs --arg name "$name" --arg same "$same" '
        def gen_s: if .tok_per_s > 0 then (.n_gen - 1) / .tok_per_s else 0 end;
        (map(.n_gen - 1) | add) as $toks | (map(gen_s) | add) as $secs |
        (map(.spec.passes) | add) as $passes | (map(.spec.accepted) | add) as $acc |
        (map(.spec.drafted) | add) as $dr | (map(.spec.draft_seconds) | add) as $ds |
        (map(.spec.mean_verify_width * .spec.passes) | add) as $rows |
        [$name, (if $secs > 0 then $toks / $secs else 0 end | . * 10 | round / 10),
         (if $passes > 0 then ($passes + $acc) / $passes else 0 end | . * 1000 | round / 1000),
         "\($acc)/\($dr)", (if $passes > 0 then $rows / $passes else 0 end | . * 100 | round / 100),
         (if $passes > 0 then $ds / $passes * 1e6 | round else 0 end), $same] | @tsv' "$WORK/$name.jsonl"
}

echo "target $TARGET, drafter $DRAFT, ${#PROMPTS[@]} prompts x $N tokens, $THREADS threads, features $FTYPE"
{
    printf 'config\tgen_tok/s\ttau\taccepted/drafted\tmean_width\tdraft_us/pass\tsame\n'
    run_config plain
    run_config scheduled --draft "$DRAFT" --feature-dtype "$FTYPE"
    for w in $WIDTHS; do run_config "width$w" --draft "$DRAFT" --verify-width "$w" --feature-dtype "$FTYPE"; done
} | column -t -s $'\t'
