#!/usr/bin/env bash
# tests/llama_ref_smoke.sh: exercises compat_llama_ref (tests/compat/llama_ref.c), the harness
# that runs llama.cpp's own prebuilt (npm @node-llama-cpp/linux-x64@3.22.1) as a reference,
# on a tiny "llama" model it writes itself (make-llama-test: 2 layers, random F32 weights,
# 273-token GPT-2 style BPE vocabulary).
#
#   - llama.cpp loads the model (written by ggml's gguf writer) and reports the architecture,
#     sizes and parameter count the generator wrote; a vocab-only load works too;
#   - tokenize gives the ids derived by hand from the model's merges (see below);
#   - logits of every position are finite; greedy `generate` equals the argmax chain of the
#     logits of the extended sequence (prompt + generated ids) from one batched decode, and
#     its per-step logits match those rows; the prompt's logits match the extended run's
#     first rows (causality);
#   - the same model written by Ember's writer, whole and split into 3 shards, loads and gives
#     bit-identical logits;
#   - a truncated file and an out-of-range token id fail with exit 1 and a message.
#
# Env (set by CTest): EMBER_SRC (repo root), EMBER_BUILD (build folder with compat_*).
# Exit 77 (skip) when the npm package cannot be installed.
set -u

SRC="${EMBER_SRC:-$(cd "$(dirname "$0")/.." && pwd)}"
BUILD="${EMBER_BUILD:-$SRC/build}"
REF="$BUILD/compat_llama_ref"
V=273            # the tiny model's vocabulary
THREADS=(--threads 2)

. "$SRC/tests/lib/npm_ggml.sh"
. "$SRC/tests/lib/check.sh"

em_need_exes llama_ref_smoke "$REF"
BINS=$(em_npm_ggml_bins "$SRC") || exit $?
em_preload_stdcxx_for_asan "$REF"

W="$BUILD/testtmp/llama_ref_smoke"
rm -rf "$W"
mkdir -p "$W"

# ---- the model, written by ggml ------------------------------------------------------------
if ! "$REF" make-llama-test "$BINS" "$W/ggml" >"$W/make.txt" 2>&1; then
    echo "FAIL: make-llama-test:"; sed 's/^/  /' "$W/make.txt"
    exit 1
fi
MODEL=$(head -n 1 "$W/make.txt")
N_PARAMS=$(val n_params "$W/make.txt")

echo "== load"
if "$REF" load "$BINS" "$MODEL" >"$W/load.txt" 2>"$W/load.err"; then
    pass
    check "arch" llama "$(val arch "$W/load.txt")"
    check "n_vocab" $V "$(val n_vocab "$W/load.txt")"
    check "n_embd" 64 "$(val n_embd "$W/load.txt")"
    check "n_layer" 2 "$(val n_layer "$W/load.txt")"
    check "n_params (llama.cpp's count of loaded weights)" "$N_PARAMS" "$(val n_params "$W/load.txt")"
    check "gguf_n_tensors" "$(val n_tensors "$W/make.txt")" "$(val gguf_n_tensors "$W/load.txt")"
    check "backend" CPU "$(val backend "$W/load.txt")"
else
    fail "load $MODEL:"; sed 's/^/  /' "$W/load.err"
fi
if "$REF" load "$BINS" "$MODEL" --vocab-only >"$W/vload.txt" 2>"$W/vload.err"; then
    check "vocab-only n_vocab" $V "$(val n_vocab "$W/vload.txt")"
else
    fail "load --vocab-only:"; sed 's/^/  /' "$W/vload.err"
fi

echo "== tokenize"
# Ids 0..255 are bytes, 256+k is merge k, 272 is <|endoftext|>. Merges by rank: 0 " t",
# 1 "he", 2 " the", 3 "in", 4 "ing", 5 "ll", 6 "hell", 7 "hello", 8 " w", 9 "or", 10 " wor",
# 11 "ld", 12 " world". GPT-2 pre-splitting gives "hello" " world" <|endoftext|> " the"
# " thing"; BPE then gives hello=263, " world"=268, 272, " the"=258, and " thing" =
# " t"(256) "h"(104) "ing"(260), since no merge joins " t" and "h".
# With add_special true the bos (272) would lead; with parse_special false the special
# token would come out as bytes.
got=$("$REF" tokenize "$BINS" "$MODEL" -p 'hello world<|endoftext|> the thing' 2>"$W/tok.err")
check "tokenize" "263,268,272,258,256,104,260" "$got"

echo "== logits and greedy generation"
PROMPT=263,268,258,256,104
NP=5
NG=12
if "$REF" logits "$BINS" "$MODEL" --tokens $PROMPT -o "$W/prompt.f32" "${THREADS[@]}" 2>"$W/logits.err"; then
    check "logits file size" $((NP * V * 4)) "$(stat -c %s "$W/prompt.f32")"
    if "$REF" argmax "$W/prompt.f32" --n-vocab $V >"$W/prompt.argmax" 2>&1; then pass; else
        fail "prompt logits not finite: $(cat "$W/prompt.argmax")"; fi
else
    fail "logits:"; sed 's/^/  /' "$W/logits.err"
fi

GEN=$("$REF" generate "$BINS" "$MODEL" --tokens $PROMPT -n $NG -o "$W/gen.f32" "${THREADS[@]}" 2>"$W/gen.err")
if [ $? -ne 0 ] || [ "$(echo "$GEN" | tr ',' '\n' | grep -c .)" -ne $NG ]; then
    fail "generate -n $NG printed '$GEN':"; sed 's/^/  /' "$W/gen.err"
else
    pass
    echo "   greedy continuation: $GEN"
    if "$REF" logits "$BINS" "$MODEL" --tokens "$PROMPT,$GEN" -o "$W/ext.f32" "${THREADS[@]}" 2>"$W/ext.err"; then
        # row NP-1+k of the extended sequence's logits predicts generated token k
        chain=$("$REF" argmax "$W/ext.f32" --n-vocab $V | tr ',' '\n' | sed -n "${NP},$((NP + NG - 1))p" | paste -sd,)
        check "argmax chain of the batched logits vs generate" "$GEN" "$chain"
        # the prompt's rows do not see the tokens after them
        if out=$("$REF" compare "$W/prompt.f32" "$W/ext.f32" --n-vocab $V --rows $NP --tol 1e-4); then pass; else
            fail "prompt logits differ from the extended run's first rows: $out"; fi
        # generate's per-step logits (KV cache, one token a step) vs the batched rows
        tail -c +$(((NP - 1) * V * 4 + 1)) "$W/ext.f32" >"$W/ext_tail.f32"
        if out=$("$REF" compare "$W/gen.f32" "$W/ext_tail.f32" --n-vocab $V --rows $NG --tol 1e-3); then
            pass; echo "   token-by-token vs batched logits: $out"
        else
            fail "generate's logits differ from the batched ones: $out"; fi
    else
        fail "logits of the extended sequence:"; sed 's/^/  /' "$W/ext.err"
    fi
fi

echo "== the same model written by Ember's writer"
for variant in whole split; do
    opt=()
    [ $variant = split ] && opt=(--split-bytes 150000)
    if ! "$REF" make-llama-test "$BINS" "$W/ember_$variant" --writer ember "${opt[@]}" >"$W/make_$variant.txt" 2>&1; then
        fail "make-llama-test --writer ember ($variant):"; sed 's/^/  /' "$W/make_$variant.txt"
        continue
    fi
    m=$(head -n 1 "$W/make_$variant.txt")
    if "$REF" load "$BINS" "$m" >"$W/load_$variant.txt" 2>"$W/load_$variant.err"; then
        check "Ember ($variant) n_params" "$N_PARAMS" "$(val n_params "$W/load_$variant.txt")"
        check "Ember ($variant) gguf_n_tensors" 21 "$(val gguf_n_tensors "$W/load_$variant.txt")"
        [ $variant = split ] && check "Ember split shards" 3 "$(val n_shards "$W/load_$variant.txt")"
    else
        fail "llama.cpp loading Ember's $variant file $m:"; sed 's/^/  /' "$W/load_$variant.err"
        continue
    fi
    if "$REF" logits "$BINS" "$m" --tokens $PROMPT -o "$W/ember_$variant.f32" "${THREADS[@]}" 2>"$W/el_$variant.err" &&
        out=$("$REF" compare "$W/prompt.f32" "$W/ember_$variant.f32" --n-vocab $V --tol 0); then
        pass
    else
        fail "logits of Ember's $variant file differ from the ggml-written one's: ${out:-$(cat "$W/el_$variant.err")}"
    fi
done

echo "== failures are reported"
head -c 100000 "$MODEL" >"$W/truncated.gguf"
"$REF" load "$BINS" "$W/truncated.gguf" >/dev/null 2>"$W/trunc.err"
rc=$?
if [ $rc -eq 1 ] && grep -q "truncated.gguf" "$W/trunc.err" && grep -qi "error" "$W/trunc.err"; then pass; else
    fail "loading a truncated file: want exit 1 with llama.cpp's reason, got exit $rc: $(head -c 300 "$W/trunc.err")"; fi
"$REF" logits "$BINS" "$MODEL" --tokens 1,$V -o "$W/bad.f32" >/dev/null 2>"$W/bad.err"
rc=$?
if [ $rc -eq 1 ] && [ -s "$W/bad.err" ]; then pass; else
    fail "token id $V (out of range): want exit 1 and a message, got exit $rc"; fi

finish
