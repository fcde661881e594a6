#!/usr/bin/env bash
# tests/convert_llama.sh: the GGUFs `ember convert` writes from every fixture, loaded by
# llama.cpp itself (the npm prebuilt @node-llama-cpp/linux-x64@3.22.1, through
# tests/compat/llama_ref.c):
#   - kimi_a (kimi-linear) loads as q8_0, bf16, f32 and split into shards; its F32 conversion
#     gives transformers' logits (tests/fixtures/ref/kimi_a/seq0.logits.bin) within 1e-3, and
#     llama.cpp tokenizes the chat prompt into the ids tiktoken gave;
#   - the vanilla DSpark drafters (DeepSpec, SpecForge) load as dflash, with the target's
#     tokenizer (--tokenizer-from) and without one (tokenizer.ggml.model "none");
#   - what this llama.cpp cannot run is refused by it, not loaded wrongly: the gated and rnn
#     Markov heads ("wrong number of tensors": it knows only markov_w1/w2 and conf_proj), and
#     Kimi-Linear with q-LoRA (kimi_b: the prebuilt's kimi-linear ignores q_lora_rank, so
#     attn_q_a_norm has the "wrong shape"). Either may load with a newer llama.cpp; then the
#     case passes as a load.
#
# Env (set by CTest): EMBER_BIN, EMBER_SRC, EMBER_BUILD. Exit 77 (skip) when npm is unreachable.
set -u

SRC="${EMBER_SRC:-$(cd "$(dirname "$0")/.." && pwd)}"
BUILD="${EMBER_BUILD:-$SRC/build}"
EMBER="${EMBER_BIN:-$BUILD/ember}"
REF="$BUILD/compat_llama_ref"
FX="$SRC/tests/fixtures"

. "$SRC/tests/lib/npm_ggml.sh"
. "$SRC/tests/lib/check.sh"

em_need_exes convert_llama "$EMBER" "$REF"
BINS=$(em_npm_ggml_bins "$SRC") || exit $?
em_preload_stdcxx_for_asan "$REF"

W="$BUILD/testtmp/convert_llama"
rm -rf "$W"
mkdir -p "$W"

# convert NAME OUT.gguf [ember convert flags...]
convert() {
    local name="$1" out="$2"
    shift 2
    if "$EMBER" convert "$FX/$name" -o "$W/$out" "$@" >"$W/$out.txt" 2>&1; then
        return 0
    fi
    fail "ember convert $name $*:"
    sed 's/^/  /' "$W/$out.txt"
    return 1
}

# load_ok FILE ARCH
load_ok() {
    if "$REF" load "$BINS" "$W/$1" >"$W/$1.load" 2>"$W/$1.err"; then
        if [ "$(val arch "$W/$1.load")" = "$2" ]; then
            pass
            echo "ok: llama.cpp loads $1 ($2, $(val n_params "$W/$1.load") parameters)"
        else
            fail "$1: arch '$(val arch "$W/$1.load")', want '$2'"
        fi
    else
        fail "llama.cpp does not load $1:"
        sed 's/^/  /' "$W/$1.err" | tail -n 5
    fi
}

# load_refused FILE PATTERN: refused with PATTERN in llama.cpp's reason (or, newer, loaded)
load_refused() {
    if "$REF" load "$BINS" "$W/$1" >"$W/$1.load" 2>"$W/$1.err"; then
        pass
        echo "ok: llama.cpp loads $1 (this build refuses it: '$2')"
    elif grep -q -- "$2" "$W/$1.err"; then
        pass
        echo "ok: llama.cpp refuses $1: $(grep -m1 -- "$2" "$W/$1.err" | sed 's/^.*error loading model: //')"
    else
        fail "llama.cpp refuses $1 for another reason than '$2':"
        sed 's/^/  /' "$W/$1.err" | tail -n 5
    fi
}

echo "== kimi-linear"
for t in q8_0 bf16 f32; do
    convert kimi_a kimi_a-$t.gguf --type "$t" && load_ok kimi_a-$t.gguf kimi-linear
done
if convert kimi_a kimi_a-split.gguf --type q8_0 --split-max-size 200000; then
    first=$(ls "$W" | grep -m1 'kimi_a-split-00001-of-.*\.gguf$')
    if [ -n "$first" ]; then load_ok "$first" kimi-linear; else fail "no shards written"; fi
fi

# transformers' fp32 logits for kimi_a seq0 (the tokenized chat prompt)
SEQ0=483,117,115,260,497,346,309,322,259,285,378,420,46,482,484,344,115,300,116,345,116,497
if [ -f "$W/kimi_a-f32.gguf" ]; then
    if "$REF" logits "$BINS" "$W/kimi_a-f32.gguf" --tokens "$SEQ0" -o "$W/seq0.f32" \
        --threads 2 >"$W/logits.txt" 2>&1 &&
        "$REF" compare "$W/seq0.f32" "$FX/ref/kimi_a/seq0.logits.bin" --n-vocab 512 --tol 1e-3 \
            >"$W/compare.txt" 2>&1; then
        pass
        echo "ok: kimi_a f32 logits vs transformers: $(cat "$W/compare.txt")"
    else
        fail "kimi_a f32 logits differ from transformers':"
        sed 's/^/  /' "$W/logits.txt" "$W/compare.txt" | tail -n 5
    fi
    PROMPT='<|im_user|>user<|im_middle|>Tell me about the french revolution.<|im_end|><|im_assistant|>assistant<|im_middle|>'
    got=$("$REF" tokenize "$BINS" "$W/kimi_a-f32.gguf" -p "$PROMPT" 2>"$W/tok.err")
    if [ "$got" = "$SEQ0" ]; then
        pass
        echo "ok: llama.cpp tokenizes the chat prompt as tiktoken does"
    else
        fail "tokenize: want $SEQ0, got '$got'"
        sed 's/^/  /' "$W/tok.err" | tail -n 3
    fi
fi

for name in kimi_b kimi_b_bf16; do
    convert $name $name.gguf --type q8_0 && load_refused $name.gguf attn_q_a_norm
done

echo "== dflash / dspark"
for name in dspark_deepspec dspark_specforge; do
    convert $name $name.gguf --tokenizer-from "$FX/kimi_a" && load_ok $name.gguf dflash
done
convert dspark_specforge dspark_specforge-notok.gguf && load_ok dspark_specforge-notok.gguf dflash
for name in dspark_deepspec_gated dspark_specforge_rnn; do
    convert $name $name.gguf --tokenizer-from "$FX/kimi_a" &&
        load_refused $name.gguf "wrong number of tensors"
done

finish
