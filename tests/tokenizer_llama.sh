#!/usr/bin/env bash
# tests/tokenizer_llama.sh: `ember tokenize` against llama.cpp's own tokenizer (llama_tokenize
# of the npm prebuilt, through compat_llama_ref, add_special false, parse_special true) on the
# same GGUF files, text by text:
#   - gpt2:   the tiny "llama" model compat_llama_ref writes (GPT-2 style vocabulary, pre
#             "gpt-2", 273 tokens);
#   - kimi_a: `ember convert` of the kimi_a fixture (Kimi's tiktoken vocabulary cut down to
#             480 ranks plus its specials, pre "kimi-k2");
#   - probe:  kimi_a with tests/data/text/probe.tiktoken as its vocabulary: tokens that
#             straddle the places where pre-tokenizers cut (see gen_tiktoken_ref.cjs), so a
#             different cut shows as different ids.
# The texts are the 59 of tests/data/text/tiktoken_ref.json (specials, CJK, emoji, combining
# marks, whitespace runs, code, ...; the one holding NUL bytes cannot be an argument).
#
# Ember ranks BPE pairs as llama.cpp does here (--ranks merges). Known differences, each one
# a place where llama.cpp departs from Moonshot's pattern and Ember follows it (tiktoken's
# ids for these texts are checked in tests/test_text.c), listed by a marker they contain:
#   getUserName  llama.cpp's kimi-k2 splitter has no case split ("getUserName" one piece);
#   漢字々       its Han test is not Script=Han (々 〆 〇 leave the Han run);
#   नमस्ते        combining marks (Devanagari vowel signs, virama) split its words;
#   é (e+U+0301) a combining accent splits its word.
# Every listed text must differ on the probe vocabulary (else the list is stale) and every
# other text must give the same ids. With Ember's default ranking (tiktoken, for kimi-k2) the
# probe's "hello\r\n\r\nworld\r" differs too: its "hello" is a token no two-part merge
# reaches, which tiktoken takes whole.
#
# Env (set by CTest): EMBER_SRC, EMBER_BUILD (with compat_llama_ref), EMBER_BIN.
# Exit 77 (skip) when npm cannot install the prebuilt.
set -u

SRC="${EMBER_SRC:-$(cd "$(dirname "$0")/.." && pwd)}"
BUILD="${EMBER_BUILD:-$SRC/build}"
EMBER="${EMBER_BIN:-$BUILD/ember}"
REF="$BUILD/compat_llama_ref"

. "$SRC/tests/lib/npm_ggml.sh"
. "$SRC/tests/lib/check.sh"

em_need_exes tokenizer_llama "$REF" "$EMBER"
BINS=$(em_npm_ggml_bins "$SRC") || exit $?
if ! command -v node >/dev/null 2>&1; then
    echo "skipped: node is not installed (it reads the reference texts)"
    exit 77
fi
em_preload_stdcxx_for_asan "$REF"

W="$BUILD/testtmp/tokenizer_llama"
rm -rf "$W"
mkdir -p "$W"

# ---- the texts ------------------------------------------------------------------------------
node -e '
const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
for (const e of r.probe.tests) if (!e.text.includes("\0")) process.stdout.write(e.text + "\0");
' "$SRC/tests/data/text/tiktoken_ref.json" >"$W/texts.bin" || { echo "FAIL: cannot read the texts"; exit 1; }
texts=()
while IFS= read -r -d '' t; do texts+=("$t"); done <"$W/texts.bin"
echo "== ${#texts[@]} texts"
[ "${#texts[@]}" -ge 55 ] && pass || fail "only ${#texts[@]} texts"

# ---- the models -------------------------------------------------------------------------------
if ! "$REF" make-llama-test "$BINS" "$W/gpt2" >"$W/make.txt" 2>&1; then
    echo "FAIL: make-llama-test:"; sed 's/^/  /' "$W/make.txt"; exit 1
fi
GPT2=$(head -n 1 "$W/make.txt")
convert() { # convert NAME RANKS_FILE: kimi_a with the given tiktoken.model
    local dir="$W/$1"
    mkdir -p "$dir"
    for f in config.json model.safetensors tokenizer_config.json; do ln -s "$SRC/tests/fixtures/kimi_a/$f" "$dir/$f"; done
    ln -s "$2" "$dir/tiktoken.model"
    if ! "$EMBER" convert "$dir" -o "$W/$1.gguf" --type f32 >"$W/$1.convert.txt" 2>&1; then
        echo "FAIL: ember convert $1:"; sed 's/^/  /' "$W/$1.convert.txt"; exit 1
    fi
}
convert kimi_a "$SRC/tests/fixtures/kimi_a/tiktoken.model"
convert probe "$SRC/tests/data/text/probe.tiktoken"

# the known differences (see the head of this file)
known_split_diff() {
    case "$1" in
        *getUserName* | *漢字々* | *नमस्ते* | *$'e\xcc\x81'*) return 0 ;;
    esac
    return 1
}
known_rank_diff() { [ "$1" = $'hello\r\n\r\nworld\r' ]; }

# compare NAME MODEL DIFF_FN EMBER_FLAGS...: every text through both tokenizers
compare() {
    local name=$1 model=$2 differs=$3
    shift 3
    local same=0 diff=0 known=0 t want got i=0
    for t in "${texts[@]}"; do
        i=$((i + 1))
        want=$("$REF" tokenize "$BINS" "$model" -p "$t" 2>"$W/ref.err") || {
            fail "$name: llama.cpp failed on text $i: $(head -c 300 "$W/ref.err")"; continue; }
        got=$("$EMBER" tokenize -m "$model" --no-add-special "$@" -p "$t" 2>"$W/ember.err") || {
            fail "$name: ember failed on text $i: $(head -c 300 "$W/ember.err")"; continue; }
        if "$differs" "$t"; then
            known=$((known + 1))
            if [ "$want" = "$got" ]; then
                fail "$name: text $i was expected to differ (known llama.cpp deviation) but gives the same ids: $(printf '%q' "$t")"
            else
                pass
            fi
        elif [ "$want" = "$got" ]; then
            same=$((same + 1))
            pass
        else
            diff=$((diff + 1))
            fail "$name: text $i $(printf '%q' "$t")"$'\n'"  llama.cpp $want"$'\n'"  ember     $got"
        fi
    done
    echo "   $name: $same same, $known known differences, $diff unexpected differences"
}

none() { return 1; }
split_or_rank() { known_split_diff "$1" || known_rank_diff "$1"; }

echo "== gpt2 (pre gpt-2)"
compare gpt2 "$GPT2" none
echo "== kimi_a (pre kimi-k2, 480 ranks), merges ranking"
compare kimi_a "$W/kimi_a.gguf" none --ranks merges
echo "== probe vocabulary (pre kimi-k2), merges ranking"
compare probe "$W/probe.gguf" known_split_diff --ranks merges
echo "== probe vocabulary, Ember's default ranking (tiktoken)"
compare probe-default "$W/probe.gguf" split_or_rank

finish
