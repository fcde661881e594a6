#!/usr/bin/env bash
# tests/convert_k3.sh: `ember convert` of the Kimi-K3 Hugging Face layout, end to end.
#
# tools/fixtures/make_k3_hf.py turns a synthetic kimi-k3 GGUF (compat_synth_k3, written in
# llama.cpp's layout and checked against the llama.cpp prebuilt by tests/k3_llama.sh) back into
# the K3 release's layout (config.json model_type kimi_k3 with a text_config;
# `language_model.` names, q-LoRA MLA, g_proj for both output gates, latent MoE, per-expert
# w1/w2/w3, the split res_norm / res_proj pairs, a padded A_log, two vision tensors). Checks:
#
#   - variants a, b, c (every K3 feature on; latent without the routed norm; AttnRes, latent,
#     q-LoRA, MLA gate and lower bound off), F32 experts, --type f32: every tensor of the
#     converted file equals the synthetic GGUF's, bit for bit (ssm_a within 2 ulp: -exp(log x)),
#     same names, same shapes; every kimi-k3.* key equal in type and value; the vision tensors
#     skipped and counted in the report; Ember's logits of the converted file equal, byte for
#     byte, those of the synthetic file;
#   - variant a with compressed-tensors MXFP4 experts (weight_packed + weight_scale): converted
#     with --type f32 and --type q8_0, the experts are ggml MXFP4 whose bytes equal ggml's
#     block packing of the HF codes (computed independently in Python), whose values as Ember
#     dequantizes them (`ember tensor`) equal the HF values decoded in Python bit for bit, and
#     which are the same bytes under both --type values (never requantized); general.file_type
#     38 (MOSTLY_MXFP4_MOE); the report says so; all other tensors as above;
#   - when the npm prebuilt is reachable: llama.cpp loads the converted MXFP4 file as kimi-k3
#     and its logits of an 8-token prefill agree with Ember's within 1e-3 of the row's largest
#     logit (measured about 1e-5). Why 8 tokens: for MXFP4 weights both engines quantize the
#     activations to Q8_0, and this random model amplifies one activation rounded the other way
#     (float-level differences put a value on the other side of a Q8_0 rounding boundary):
#     measured on this file, Q8_0 activations instead of f32 move the logits by up to 87% in
#     BOTH engines, and from token 9 on the two engines' rows part by a few percent. With the
#     same expert values stored as F32 the engines agree to 1e-4 on every row (k3_llama.sh);
#     the first rows agreeing to 1e-5 is what shows llama.cpp reads the repacked bytes as Ember
#     does;
#   - the same conversion split into shards (--split-max-size) gives Ember the same logits;
#   - the converted file carries Ember's K3 chat template (K3 ships none), and Python's Jinja
#     renders it to K3's XTML format, checked against conversations written out here;
#   - a checkpoint missing one expert's weight_scale fails naming it, and a quantization format
#     other than mxfp4-pack-quantized is refused, both leaving no output.
#
# Env (set by CTest): EMBER_BIN, EMBER_SRC, EMBER_BUILD. Exit 77 when /usr/bin/python3 has no numpy or jinja2.
set -u

SRC="${EMBER_SRC:-$(cd "$(dirname "$0")/.." && pwd)}"
BUILD="${EMBER_BUILD:-$SRC/build}"
EMBER="${EMBER_BIN:-$BUILD/ember}"
SYN="$BUILD/compat_synth_k3"
REF="$BUILD/compat_llama_ref"
PY=/usr/bin/python3
GEN="$SRC/tools/fixtures/make_k3_hf.py"
V=320
TOK=5,77,300,12,200,45,9,130,250,61,33,98,140,7,19,260,300,2,180,111,64,3,222,17
TOK8=5,77,300,12,200,45,9,130

. "$SRC/tests/lib/check.sh"

em_need_exes convert_k3 "$EMBER" "$SYN"
if ! "$PY" -c 'import numpy, jinja2' 2>/dev/null; then
    echo "skipped: $PY with numpy (for $GEN) and jinja2 (the chat template) is needed"
    exit 77
fi

W="$BUILD/testtmp/convert_k3"
rm -rf "$W"
mkdir -p "$W"

json_get() { "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, {"d": d}))' "$1" "$2"; }

echo "== F32 experts: converted tensors and keys equal the synthetic kimi-k3 GGUF's"
for m in a b c; do
    "$SYN" "$W/k3_$m.gguf" --variant $m >/dev/null 2>"$W/err" || { fail "synth $m: $(cat "$W/err")"; continue; }
    "$PY" "$GEN" write "$W/k3_$m.gguf" "$W/hf_$m" >/dev/null 2>"$W/err" || { fail "make_k3_hf $m: $(cat "$W/err")"; continue; }
    if ! "$EMBER" convert "$W/hf_$m" -o "$W/conv_$m.gguf" --type f32 --threads 2 --report "$W/rep_$m.json" \
        >"$W/conv_$m.txt" 2>&1; then
        fail "convert $m: $(cat "$W/conv_$m.txt")"
        continue
    fi
    if out=$("$PY" "$GEN" check "$W/k3_$m.gguf" "$W/hf_$m" "$W/conv_$m.gguf"); then
        pass; echo "   $m: $(echo "$out" | tr '\n' ';')"
    else
        fail "variant $m: $out"
    fi
    check "$m architecture" kimi-k3 "$(json_get "$W/rep_$m.json" 'd["architecture"]')"
    check "$m vision tensors skipped" 2 "$(json_get "$W/rep_$m.json" 'd["source_tensors_skipped"]')"
    check "$m nothing unmapped" 0 "$(json_get "$W/rep_$m.json" 'd["source_tensors"] - d["source_tensors_mapped"] - d["source_tensors_skipped"]')"
    "$EMBER" logits -m "$W/k3_$m.gguf" --tokens "$TOK" -o "$W/syn_$m.f32" --threads 2 2>"$W/err" &&
        "$EMBER" logits -m "$W/conv_$m.gguf" --tokens "$TOK" -o "$W/conv_$m.f32" --threads 2 2>"$W/err" ||
        { fail "ember logits $m: $(cat "$W/err")"; continue; }
    if cmp -s "$W/syn_$m.f32" "$W/conv_$m.f32"; then pass; else fail "variant $m: logits of the converted file differ from the synthetic file's"; fi
done

echo "== chat template: K3 ships none, the converted file carries Ember's, which renders K3's XTML"
# Rendered with Python's Jinja under transformers' conventions (tojson with ensure_ascii,
# raise_exception); the expected strings are K3's format (llamacpp-formats.md §4.3), written out.
if [ -f "$W/conv_a.gguf" ]; then
    check "report: chat template source" "ember kimi-k3" "$(json_get "$W/rep_a.json" 'd["chat_template"]')"
    "$EMBER" inspect "$W/conv_a.gguf" --json >"$W/inspect_a.json" 2>"$W/err" || fail "inspect: $(cat "$W/err")"
    if out=$("$PY" - "$W/inspect_a.json" <<'PYEOF' 2>&1
import json, sys
import jinja2, jinja2.ext, jinja2.sandbox
meta = {e["key"]: e for e in json.load(open(sys.argv[1]))["metadata"]}
assert meta["tokenizer.chat_template"]["type"] == "str", "tokenizer.chat_template is not a string"
def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
def raise_exception(msg):
    raise jinja2.exceptions.TemplateError(msg)
env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                   extensions=[jinja2.ext.loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
t = env.from_string(meta["tokenizer.chat_template"]["value"])
O, S, C, E = "<|open|>", "<|sep|>", "<|close|>", "<|end_of_msg|>"
def msg(attrs, body):
    return O + "message" + attrs + S + body + C + "message" + S + E
effort = msg(' role="system" type="thinking-effort"',
             "`thinking_effort` guides on how much to think in your thinking channel (not including the "
             "response channel), supported values include `low`, `medium`, `high`, and `max`.\n"
             "Now the system is invoked with `thinking_effort=%s`.")
cases = [
    (dict(messages=[{"role": "user", "content": "hi"}], add_generation_prompt=True),
     effort % "max" + msg(' role="user"', "hi") + O + 'message role="assistant"' + S + O + "think" + S),
    (dict(messages=[{"role": "system", "content": 'Be "brief" & kind.'},
                    {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
          add_generation_prompt=True, thinking=False),
     msg(' role="system"', 'Be "brief" & kind.') + msg(' role="user"', "ab") +
     O + 'message role="assistant"' + S + O + "response" + S),
    (dict(messages=[{"role": "user", "content": "q", "name": 'a"b'},
                    {"role": "assistant", "content": "r", "reasoning_content": "t",
                     "tool_calls": [{"id": "1", "function": {"name": "get", "arguments": {"k": "v", "n": 2}}}]},
                    {"role": "tool", "content": "42"}],
          tools=[{"type": "function", "function": {"name": "get", "parameters": {"b": 1, "a": [{"z": 1, "y": 2}]}}}],
          thinking_effort="low"),
     msg(' role="system" type="tool-declare"', "# Tools\nHere are the available tools, described in JSONSchema."
         '\n\n```json\n[{"function":{"name":"get","parameters":{"a":[{"y":2,"z":1}],"b":1}},"type":"function"}]\n```') +
     effort % "low" + msg(' role="user" name="a&quot;b"', "q") +
     msg(' role="assistant"', O + "think" + S + "t" + C + "think" + S + O + "response" + S + "r" + C + "response" + S +
         O + "tools" + S + O + 'call tool="get" index="1"' + S +
         O + 'argument key="k" type="string"' + S + "v" + C + "argument" + S +
         O + 'argument key="n" type="number"' + S + "2" + C + "argument" + S +
         C + "call" + S + C + "tools" + S) +
     msg(' role="tool" tool="get" index="1"', "42")),
]
for i, (kw, want) in enumerate(cases):
    got = t.render(**kw)
    assert got == want, "case %d:\n got  %r\n want %r" % (i, got, want)
print("%d conversations render as K3's format" % len(cases))
PYEOF
    ); then pass; echo "   $out"; else fail "chat template: $out"; fi
fi

echo "== MXFP4 experts: repacked losslessly, never requantized"
"$PY" "$GEN" write "$W/k3_a.gguf" "$W/hf_mx" --experts mxfp4 >/dev/null 2>"$W/err" || fail "make_k3_hf mxfp4: $(cat "$W/err")"
for t in f32 q8_0; do
    "$EMBER" convert "$W/hf_mx" -o "$W/mx_$t.gguf" --type $t --threads 2 --report "$W/rep_mx_$t.json" >"$W/mx_$t.txt" 2>&1 ||
        fail "convert mxfp4 --type $t: $(cat "$W/mx_$t.txt")"
done
if [ -f "$W/mx_f32.gguf" ] && [ -f "$W/mx_q8_0.gguf" ]; then
    mkdir -p "$W/deq"
    names=$("$EMBER" inspect "$W/mx_f32.gguf" --json |
        "$PY" -c 'import json,sys; [print(t["name"]) for t in json.load(sys.stdin)["tensors"] if t["type"] == "mxfp4"]')
    nx=0
    for n in $names; do
        "$EMBER" tensor "$W/mx_f32.gguf" "$n" -o "$W/deq/$n.f32" >/dev/null 2>"$W/err" || fail "ember tensor $n: $(cat "$W/err")"
        nx=$((nx + 1))
    done
    check "MXFP4 expert tensors (3 per MoE layer, 7 MoE layers)" 21 "$nx"
    if out=$("$PY" "$GEN" check "$W/k3_a.gguf" "$W/hf_mx" "$W/mx_f32.gguf" --deq-dir "$W/deq"); then
        pass; echo "   $(echo "$out" | tr '\n' ';')"
    else
        fail "mxfp4: $out"
    fi
    if out=$("$PY" "$GEN" experts-equal "$W/mx_f32.gguf" "$W/mx_q8_0.gguf"); then pass; echo "   $out"; else fail "$out"; fi
    # the same scale bytes under the F8_E8M0 dtype convert to the same experts
    "$PY" "$GEN" write "$W/k3_a.gguf" "$W/hf_mx8" --experts mxfp4 --scale-dtype e8m0 >/dev/null 2>"$W/err" &&
        "$EMBER" convert "$W/hf_mx8" -o "$W/mx8.gguf" --type f32 --threads 2 >"$W/mx8.txt" 2>&1 &&
        out=$("$PY" "$GEN" experts-equal "$W/mx_f32.gguf" "$W/mx8.gguf") && pass ||
        fail "F8_E8M0 scales: $(cat "$W/err" "$W/mx8.txt" 2>/dev/null) $out"
    check "q8_0 report: mxfp4 tensors" 21 "$(json_get "$W/rep_mx_q8_0.json" 'd["tensor_types"].get("mxfp4", 0)')"
    check "q8_0 report: experts not measured as lossy" 0 \
        "$(json_get "$W/rep_mx_q8_0.json" 'sum(1 for q in d["quantization"]["tensors"] if q["type"] == "mxfp4")')"
    check "q8_0 report: the note" yes "$(json_get "$W/rep_mx_q8_0.json" '"yes" if "losslessly" in d["note"] and "never requantized" in d["note"] else d["note"]')"
    grep -q "never requantized" "$W/mx_q8_0.txt" && pass || fail "the printed report does not mention the MXFP4 experts"
fi

echo "== split output (--split-max-size): same logits as the single file"
if "$EMBER" convert "$W/hf_mx" -o "$W/split.gguf" --type q8_0 --threads 2 --split-max-size 150000 >"$W/split.txt" 2>&1; then
    ns=$(ls "$W"/split-000*-of-*.gguf 2>/dev/null | wc -l)
    [ "$ns" -ge 3 ] && pass || fail "split: $ns shards"
    "$EMBER" logits -m "$W/split-00001-of-$(printf %05d "$ns").gguf" --tokens "$TOK" -o "$W/split.f32" --threads 2 2>"$W/err" &&
        "$EMBER" logits -m "$W/mx_q8_0.gguf" --tokens "$TOK" -o "$W/single.f32" --threads 2 2>"$W/err" ||
        fail "ember logits (split): $(cat "$W/err")"
    cmp -s "$W/split.f32" "$W/single.f32" && pass || fail "split and single-file logits differ"
else
    fail "convert --split-max-size: $(cat "$W/split.txt")"
fi

echo "== llama.cpp on the converted MXFP4 file"
if [ -x "$REF" ] && [ -f "$W/mx_f32.gguf" ] && . "$SRC/tests/lib/npm_ggml.sh" && BINS=$(em_npm_ggml_bins "$SRC" 2>"$W/npm.err"); then
    em_preload_stdcxx_for_asan "$REF"
    if "$REF" load "$BINS" "$W/mx_f32.gguf" >"$W/load.txt" 2>"$W/load.err"; then
        check "llama.cpp arch" kimi-k3 "$(val arch "$W/load.txt")"
        "$REF" logits "$BINS" "$W/mx_f32.gguf" --tokens "$TOK8" -o "$W/ll.f32" --threads 2 2>"$W/err" ||
            fail "llama.cpp logits: $(tail -n 3 "$W/err")"
        "$EMBER" logits -m "$W/mx_f32.gguf" --tokens "$TOK8" -o "$W/em.f32" --threads 2 2>"$W/err" ||
            fail "ember logits: $(cat "$W/err")"
        tie=$("$SYN" margins "$W/mx_f32.gguf" --tokens "$TOK8" --tie 1e-5 2>"$W/err") || fail "margins: $(cat "$W/err")"
        first=$(echo "$tie" | sed -n 's/.*first_tie=\([0-9]*\).*/\1/p')
        if out=$("$SYN" compare "$W/ll.f32" "$W/em.f32" --n-vocab $V --tol 1e-3 --rows "${first:-0}"); then
            pass; echo "   $out (routing: $tie)"
        else
            fail "llama.cpp vs Ember on the converted MXFP4 file: $out (routing: $tie)"
        fi
    else
        fail "llama.cpp cannot load the converted MXFP4 file:"; sed 's/^/  /' "$W/load.err"
    fi
else
    echo "   (not compared: compat_llama_ref or the npm prebuilt is not available: $(cat "$W/npm.err" 2>/dev/null | head -n 1))"
fi

echo "== broken checkpoints are refused by name, leaving nothing"
bad=language_model.model.layers.2.block_sparse_moe.experts.5.w2.weight_scale
"$PY" "$GEN" write "$W/k3_a.gguf" "$W/hf_bad" --experts mxfp4 --drop "$bad" >/dev/null
if "$EMBER" convert "$W/hf_bad" -o "$W/bad.gguf" --type q8_0 >"$W/bad.txt" 2>&1; then
    fail "a missing weight_scale was accepted"
else
    grep -q "tensor '$bad' is missing" "$W/bad.txt" && pass || fail "missing scale: $(cat "$W/bad.txt")"
    grep -q "blk.2.ffn_down_exps.weight" "$W/bad.txt" && pass || fail "missing scale: the GGUF tensor is not named"
fi
[ ! -e "$W/bad.gguf" ] && pass || fail "a failed conversion left bad.gguf"
cp -r "$W/hf_mx" "$W/hf_nv"
sed -i 's/"format": "mxfp4-pack-quantized"/"format": "nvfp4-pack-quantized"/' "$W/hf_nv/config.json"
if "$EMBER" convert "$W/hf_nv" -o "$W/nv.gguf" >"$W/nv.txt" 2>&1; then
    fail "an nvfp4 checkpoint was accepted"
else
    grep -q "nvfp4-pack-quantized" "$W/nv.txt" && pass || fail "nvfp4: $(cat "$W/nv.txt")"
fi

finish
