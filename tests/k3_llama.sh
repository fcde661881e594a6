#!/usr/bin/env bash
# tests/k3_llama.sh: Ember's kimi-k3 against llama.cpp's own kimi-k3 graph (the npm prebuilt
# @node-llama-cpp/linux-x64@3.22.1, driven by compat_llama_ref from tests/compat/llama_ref.c)
# on small random kimi-k3 GGUFs written by compat_synth_k3 (tests/compat/k3_synth.h), all F32:
#
#   a  8 layers, AttnRes blocks of 3 (banks at layers 0, 3, 6), q-LoRA MLA with the output
#      gate at layers 3 and 7, full-rank KDA gate, lower bound -5, SiTU 4 / 25, latent MoE
#      (64 -> 32) with the routed norm, 8 experts top-3 + 1 shared, dense layer 0
#   b  6 layers, AttnRes blocks of 4 (two banks), lower bound -3, SiTU 1.5 / 2 (far from
#      linear), latent 48 without the routed norm, 16 experts top-4 + 2 shared, no renorm
#   c  5 layers, AttnRes off, no latent, no q-LoRA, no MLA gate, no lower bound
#
#   - llama.cpp loads each file as kimi-k3;
#   - logits of two sequences (24 and 40 tokens, one decode each): per row
#     max |Ember - llama.cpp| / max |llama.cpp logit| <= 1e-3 (measured about 1e-4 and below;
#     the remaining difference is fp32 rounding plus llama.cpp's eps choices: rms_norm_eps for
#     the MLA latent norms where Ember keeps transformers' 1e-6, x / max(|x|, eps) for the KDA
#     q/k L2 norm, its chunk-16 KDA prefill). A row from which Ember's routing has a near tie
#     (some MoE layer's margin below 1e-5, compat_synth_k3 margins) may flip an expert in
#     either engine: such rows are reported by margin and left out, the tolerance never grows;
#   - greedy continuation (12 tokens): llama.cpp's `generate` (token by token, its recurrent
#     path) and Ember's argmax chain give the same ids;
#   - variants i (routed experts in all nine IQ types) and m (MXFP4 experts): see the section
#     "quantized experts" below for what is checked tightly and what is only reported.
#
# Env (set by CTest): EMBER_BIN, EMBER_SRC, EMBER_BUILD. Exit 77 (skip) when the npm package
# cannot be installed.
set -u

SRC="${EMBER_SRC:-$(cd "$(dirname "$0")/.." && pwd)}"
BUILD="${EMBER_BUILD:-$SRC/build}"
EMBER="${EMBER_BIN:-$BUILD/ember}"
REF="$BUILD/compat_llama_ref"
SYN="$BUILD/compat_synth_k3"
V=320
TOL=1e-3
TIE=1e-5
THREADS=(--threads 2)

. "$SRC/tests/lib/npm_ggml.sh"
. "$SRC/tests/lib/check.sh"

em_need_exes k3_llama "$REF" "$EMBER" "$SYN"
BINS=$(em_npm_ggml_bins "$SRC") || exit $?
em_preload_stdcxx_for_asan "$REF"

W="$BUILD/testtmp/k3_llama"
rm -rf "$W"
mkdir -p "$W"

SEQ[0]=5,77,300,12,200,45,9,130,250,61,33,98,140,7,19,260,300,2,180,111,64,3,222,17
SEQ[1]=90,150,8,201,33,270,41,5,104,104,256,319,0,1,255,66,188,42,42,42,300,12,7,99,123,231,17,280,5,60,61,62,146,251,9,33,77,140,211,3

for m in a b c; do
    if ! "$SYN" "$W/k3_$m.gguf" --variant $m >"$W/synth_$m.txt" 2>&1; then
        fail "compat_synth_k3 --variant $m: $(cat "$W/synth_$m.txt")"
        finish
    fi
done

echo "== llama.cpp loads the synthetic kimi-k3 files"
for m in a b c; do
    if "$REF" load "$BINS" "$W/k3_$m.gguf" >"$W/load_$m.txt" 2>"$W/load_$m.err"; then
        check "k3_$m arch" kimi-k3 "$(val arch "$W/load_$m.txt")"
        check "k3_$m n_vocab" $V "$(val n_vocab "$W/load_$m.txt")"
    else
        fail "llama.cpp cannot load k3_$m.gguf:"; sed 's/^/  /' "$W/load_$m.err"
    fi
done

echo "== F32 logits: Ember vs llama.cpp (per row, relative to the row's largest logit, <= $TOL)"
for m in a b c; do
    for s in 0 1; do
        ll="$W/ll_${m}_$s.f32" em="$W/em_${m}_$s.f32"
        "$REF" logits "$BINS" "$W/k3_$m.gguf" --tokens "${SEQ[$s]}" -o "$ll" "${THREADS[@]}" 2>"$W/ll.err" ||
            { fail "llama.cpp logits k3_$m seq$s: $(tail -n 3 "$W/ll.err")"; continue; }
        "$EMBER" logits -m "$W/k3_$m.gguf" --tokens "${SEQ[$s]}" -o "$em" "${THREADS[@]}" 2>"$W/em.err" ||
            { fail "ember logits k3_$m seq$s: $(cat "$W/em.err")"; continue; }
        tie=$("$SYN" margins "$W/k3_$m.gguf" --tokens "${SEQ[$s]}" --tie $TIE 2>"$W/margins.err") ||
            { fail "margins k3_$m seq$s: $(cat "$W/margins.err")"; continue; }
        first=$(echo "$tie" | sed -n 's/.*first_tie=\([0-9]*\).*/\1/p')
        n=$(echo "${SEQ[$s]}" | tr , '\n' | wc -l)
        if out=$("$SYN" compare "$ll" "$em" --n-vocab $V --tol $TOL --rows "$first"); then
            pass; echo "   k3_$m seq$s: $out (routing: $tie)"
        else
            fail "k3_$m seq$s beyond $TOL: $out (routing: $tie)"
        fi
        if [ "$first" -lt "$n" ]; then
            echo "   k3_$m seq$s: rows from $first on follow a near-tie expert choice (reported):" \
                "$("$SYN" compare "$ll" "$em" --n-vocab $V --tol 1e9)"
        fi
    done
done

echo "== greedy continuation of seq0 (12 tokens)"
NG=12
for m in a b c; do
    gen=$("$REF" generate "$BINS" "$W/k3_$m.gguf" --tokens "${SEQ[0]}" -n $NG "${THREADS[@]}" 2>"$W/gen.err") ||
        { fail "llama.cpp generate k3_$m: $(tail -n 3 "$W/gen.err")"; continue; }
    toks="${SEQ[0]}"
    mine=""
    for ((i = 0; i < NG; i++)); do
        "$EMBER" logits -m "$W/k3_$m.gguf" --tokens "$toks" -o "$W/step.f32" "${THREADS[@]}" 2>"$W/step.err" ||
            { fail "ember logits (greedy step $i): $(cat "$W/step.err")"; break; }
        next=$("$REF" argmax "$W/step.f32" --n-vocab $V | tr , '\n' | tail -n 1)
        toks="$toks,$next"
        mine="${mine:+$mine,}$next"
    done
    if [ "$gen" = "$mine" ]; then pass; echo "   k3_$m: $gen"; else fail "k3_$m greedy: llama.cpp $gen, Ember $mine"; fi
done

echo "== quantized experts (i: every IQ type, m: MXFP4): first rows tight, the rest reported"
# Both engines quantize the activations of these experts (Q8_K for the IQ types, Q8_0 for
# MXFP4, as ggml pairs them). A float-level difference upstream (about 1e-6 here: llama.cpp's
# eps choices, its chunked KDA prefill, summation order) can put one activation on the other
# side of a rounding boundary, and these random models amplify that: Ember against ITSELF
# (EMBER_ISA=scalar vs the default kernels: same formats, another float summation order)
# parts by a few percent within a few rows, printed below as the noise floor. So the tight
# check is on rows both engines compute from the same quantized activations:
#   - MXFP4: row 0 of single-token prompts (8 tokens, each its own prompt), <= QTOL. For the
#     IQ types these rows are reported only: on this file some single tokens already differ
#     by 1e-3..4e-2 (measured 5 of 8 within 1e-3), and Ember's AVX2 and AVX-512 kernels (same
#     quants, other summation order) differ by 1.4e-2 on one of them too, so one flipped
#     Q8_K activation is enough there (unproven for the others: no per-type vec_dot check
#     against ggml exists yet, only dequantization and Ember's dot vs its dequantization);
#   - the first QROWS_m rows of seq0 for MXFP4 (measured about 1e-5) and QROWS_i for the IQ
#     types (row 1 already follows a flipped Q8_K activation), <= QTOL;
#   - all rows of seq0 and seq1 are then reported next to the ISA noise floor, not checked;
#     likewise the greedy continuation (llama.cpp's ids and Ember's, reported).
# The tolerance is the F32 one; it does not grow for quantized experts.
QTOL=$TOL
QROWS_m=8
QROWS_i=1
for m in i m; do
    if ! "$SYN" "$W/k3_$m.gguf" --variant $m >"$W/synth_$m.txt" 2>&1; then
        fail "compat_synth_k3 --variant $m: $(cat "$W/synth_$m.txt")"
        continue
    fi
    if "$REF" load "$BINS" "$W/k3_$m.gguf" >"$W/load_$m.txt" 2>"$W/load_$m.err"; then
        check "k3_$m arch" kimi-k3 "$(val arch "$W/load_$m.txt")"
    else
        fail "llama.cpp cannot load k3_$m.gguf:"; sed 's/^/  /' "$W/load_$m.err"; continue
    fi
    worst="" within=0
    for t in 5 77 300 12 200 256 0 319; do
        "$REF" logits "$BINS" "$W/k3_$m.gguf" --tokens $t -o "$W/ll1.f32" "${THREADS[@]}" 2>"$W/ll.err" &&
            "$EMBER" logits -m "$W/k3_$m.gguf" --tokens $t -o "$W/em1.f32" "${THREADS[@]}" 2>"$W/em.err" ||
            { fail "k3_$m token $t: $(tail -n 3 "$W/ll.err" "$W/em.err")"; continue; }
        if out=$("$SYN" compare "$W/ll1.f32" "$W/em1.f32" --n-vocab $V --tol $QTOL); then
            [ $m = m ] && pass; within=$((within + 1))
        else
            [ $m = m ] && fail "k3_$m single token $t beyond $QTOL: $out"
        fi
        worst="$worst $(echo "$out" | sed -n 's/.*=\([0-9.e+-]*\) at.*/\1/p')"
    done
    note=checked; [ $m = i ] && note="reported, not checked: see above"
    echo "   k3_$m single-token prompts, row 0, max|d|/max|logit|:$worst ($within of 8 within $QTOL; $note)"
    rows_var=QROWS_$m
    for s in 0 1; do
        ll="$W/ll_${m}_$s.f32" em="$W/em_${m}_$s.f32"
        "$REF" logits "$BINS" "$W/k3_$m.gguf" --tokens "${SEQ[$s]}" -o "$ll" "${THREADS[@]}" 2>"$W/ll.err" &&
            "$EMBER" logits -m "$W/k3_$m.gguf" --tokens "${SEQ[$s]}" -o "$em" "${THREADS[@]}" 2>"$W/em.err" &&
            EMBER_ISA=scalar "$EMBER" logits -m "$W/k3_$m.gguf" --tokens "${SEQ[$s]}" -o "$W/sc.f32" "${THREADS[@]}" 2>"$W/em.err" ||
            { fail "k3_$m seq$s logits: $(tail -n 3 "$W/ll.err" "$W/em.err")"; continue; }
        tie=$("$SYN" margins "$W/k3_$m.gguf" --tokens "${SEQ[$s]}" --tie $TIE 2>"$W/margins.err")
        first=$(echo "$tie" | sed -n 's/.*first_tie=\([0-9]*\).*/\1/p')
        rows=${!rows_var}
        [ "${first:-0}" -lt "$rows" ] && rows=${first:-0}
        if [ $s = 0 ]; then
            if out=$("$SYN" compare "$ll" "$em" --n-vocab $V --tol $QTOL --rows "$rows"); then
                pass; echo "   k3_$m seq0 first $rows rows: $out (routing: $tie)"
            else
                fail "k3_$m seq0 first $rows rows beyond $QTOL: $out (routing: $tie)"
            fi
        fi
        echo "   k3_$m seq$s all rows (reported): llama.cpp vs Ember $("$SYN" compare "$ll" "$em" --n-vocab $V --tol 1e9);" \
            "noise floor, Ember scalar vs SIMD $("$SYN" compare "$W/sc.f32" "$em" --n-vocab $V --tol 1e9)"
    done
    gen=$("$REF" generate "$BINS" "$W/k3_$m.gguf" --tokens "${SEQ[0]}" -n 4 "${THREADS[@]}" 2>"$W/gen.err")
    toks="${SEQ[0]}" mine=""
    for ((i = 0; i < 4; i++)); do
        "$EMBER" logits -m "$W/k3_$m.gguf" --tokens "$toks" -o "$W/step.f32" "${THREADS[@]}" 2>/dev/null || break
        next=$("$REF" argmax "$W/step.f32" --n-vocab $V | tr , '\n' | tail -n 1)
        toks="$toks,$next" mine="${mine:+$mine,}$next"
    done
    echo "   k3_$m greedy (4 tokens, reported): llama.cpp $gen, Ember $mine"
done

finish
