#!/usr/bin/env python3
"""A Kimi-Linear target's Hugging Face checkpoint rebuilt from the GGUF Ember converted it to.

stage2_drafter.py trains a drafter against a transformers target (config.json,
model.safetensors, tokenizer.json). Only the GGUF of the shipped target is kept in the
repository, so this writes that directory back from it, the inverse of `ember convert`'s
kimi-linear mapping (src/convert/map_kimi.c):

  - every tensor under its transformers 5.17 name, as F32 (Q8_0, F16 and BF16 widened exactly:
    a Q8_0 value is an int8 times an fp16 scale, which F32 holds; so `ember convert --type q8_0`
    of the result gives back the same Q8_0 bytes);
  - stacked experts split per expert, kv_b rebuilt from attn_k_b (transposed per head) and
    attn_v_b, A_log = log(-ssm_a) (the one inexact step: -exp(log(-a)) may differ from a in
    the last bit);
  - config.json from the GGUF's keys (Moonshot's field names; the layer pattern from
    head_count_kv: 0 on KDA layers, 1 on MLA);
  - tokenizer.json (byte-level BPE from tokenizer.ggml.tokens / merges, Kimi's pre-tokenizer
    regex, the special tokens as added tokens) and tokenizer_config.json.

Standard library only. Refuses, naming it, a GGUF of
another architecture, a tensor type it cannot widen, or a missing tensor; writes into a new
folder next to --out and renames it into place, so a failure leaves nothing half-written.

  python3 tools/train/target_from_gguf.py models/kimi-linear-19m-q8_0.gguf --out DIR
"""
import argparse
import array
import json
import math
import os
import shutil
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from gguf_io import TYPE_BF16, TYPE_F16, TYPE_F32, TYPE_Q8_0, GGUFError, read_gguf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from assemble_drafter import write_st  # noqa: E402
from kimi_pat import KIMI_PAT  # noqa: E402

TOKEN_CONTROL = 3  # tokenizer.ggml.token_type of special tokens


def fail(msg):
    raise SystemExit("target_from_gguf: " + msg)


def widen(t):
    """A tensor's values as an array('f'), in GGUF order (ne[0] fastest). Exact for every type
    taken: an fp16 scale times an int8 fits in F32."""
    n = math.prod(t["dims"])
    raw, ty = t["raw"], t["type"]
    if ty == TYPE_F32:
        return array.array("f", raw[:4 * n])
    if ty == TYPE_F16:
        return array.array("f", struct.unpack("<%de" % n, raw[:2 * n]))
    if ty == TYPE_BF16:
        return array.array("f", struct.pack("<%dI" % n, *(h << 16 for h in struct.unpack("<%dH" % n, raw[:2 * n]))))
    if ty == TYPE_Q8_0:
        if n % 32:
            fail("%s: Q8_0 with %d values, not a multiple of 32" % (t["name"], n))
        out = array.array("f")
        for b in range(n // 32):
            d = struct.unpack_from("<e", raw, 34 * b)[0]
            out.extend(d * q for q in struct.unpack_from("<32b", raw, 34 * b + 2))
        return out
    fail("%s: GGUF type %d is not widened by this tool (F32, F16, BF16 and Q8_0 are)" % (t["name"], ty))


class Target:
    """The GGUF's tensors by name, and the checkpoint being built from them."""

    def __init__(self, path):
        try:
            _, _, self.kv, tensors, _ = read_gguf(path)
        except (GGUFError, OSError, UnicodeDecodeError) as e:
            fail("%s: %s" % (path, e))
        self.path = path
        self.arch = self.kv.get("general.architecture")
        if self.arch != "kimi-linear":
            fail("%s: architecture %r; this tool rebuilds kimi-linear targets" % (path, self.arch))
        self.tensors = {t["name"]: t for t in tensors}
        self.out = {}  # HF name -> (shape, array('f'))

    def key(self, name, default=None):
        v = self.kv.get("%s.%s" % (self.arch, name), default)
        if v is None:
            fail("%s: key %s.%s is missing" % (self.path, self.arch, name))
        return v

    def get(self, name):
        t = self.tensors.get(name)
        if t is None:
            fail("%s: tensor %s is missing" % (self.path, name))
        return t, widen(t)

    def put(self, hf_name, shape, values):
        if math.prod(shape) != len(values):
            fail("%s: %d values for shape %s" % (hf_name, len(values), shape))
        self.out[hf_name] = (shape, values)

    def copy(self, gguf_name, hf_name, shape):
        """A pure reshape: a Linear [out, in] is ne [in, out] with the same bytes."""
        t, v = self.get(gguf_name)
        if math.prod(t["dims"]) != math.prod(shape):
            fail("%s: shape %s does not give %s %s" % (gguf_name, t["dims"], hf_name, shape))
        self.put(hf_name, shape, v)


def short(x):
    """The shortest decimal that gives the same float32 (a GGUF's 9.999999747e-06 -> 1e-05)."""
    for digits in range(1, 10):
        y = float("%.*g" % (digits, x))
        if struct.pack("<f", y) == struct.pack("<f", x):
            return y
    return x


def layer_pattern(tg):
    kv = tg.key("attention.head_count_kv")
    n = tg.key("block_count")
    if not isinstance(kv, list) or len(kv) != n:
        fail("%s: %s.attention.head_count_kv is not an array of %d layers" % (tg.path, tg.arch, n))
    return ["mla" if x else "kda" for x in kv]


def build_config(tg, pattern):
    n_lead = tg.key("leading_dense_block_count", 0)
    kda_hd = tg.key("kda.head_dim")
    heads = tg.key("attention.head_count")
    nope_rope = tg.key("attention.key_length_mla")
    rope = tg.key("rope.dimension_count")
    tok = lambda k: tg.kv.get("tokenizer.ggml.%s_token_id" % k)  # noqa: E731
    q_lora = tg.kv.get("%s.attention.q_lora_rank" % tg.arch)
    return {
        "architectures": ["KimiLinearForCausalLM"],
        "bos_token_id": tok("bos"),
        "dtype": "float32",
        "eos_token_id": tok("eos"),
        "first_k_dense_replace": n_lead,
        "head_dim": kda_hd,
        "hidden_act": "silu",
        "hidden_size": tg.key("embedding_length"),
        "initializer_range": 0.02,
        "intermediate_size": tg.key("feed_forward_length"),
        "kv_lora_rank": tg.key("attention.kv_lora_rank"),
        "linear_attn_config": {
            "full_attn_layers": [i + 1 for i, p in enumerate(pattern) if p == "mla"],
            "head_dim": kda_hd,
            "kda_layers": [i + 1 for i, p in enumerate(pattern) if p == "kda"],
            "num_heads": heads,
            "short_conv_kernel_size": tg.key("ssm.conv_kernel"),
        },
        "mla_use_nope": True,
        "model_max_length": tg.key("context_length"),
        "model_type": "kimi_linear",
        "moe_intermediate_size": tg.key("expert_feed_forward_length"),
        "moe_layer_freq": 1,
        "moe_renormalize": bool(tg.key("expert_weights_norm", False)),
        "moe_router_activation_func": "softmax" if tg.key("expert_gating_func", 2) == 1 else "sigmoid",
        "num_attention_heads": heads,
        "num_expert_group": tg.key("expert_group_count", 1),
        "num_experts": tg.key("expert_count"),
        "num_experts_per_token": tg.key("expert_used_count"),
        "num_hidden_layers": len(pattern),
        "num_key_value_heads": heads,
        "num_nextn_predict_layers": 0,
        "num_shared_experts": tg.key("expert_shared_count", 0),
        "pad_token_id": tok("padding"),
        "q_lora_rank": q_lora,
        "qk_nope_head_dim": nope_rope - rope,
        "qk_rope_head_dim": rope,
        "rms_norm_eps": short(tg.key("attention.layer_norm_rms_epsilon")),
        "rope_scaling": None,
        "rope_theta": short(tg.key("rope.freq_base", 10000.0)),
        "routed_scaling_factor": short(tg.key("expert_weights_scale", 1.0)),
        "tie_word_embeddings": False,
        "topk_group": tg.key("expert_group_used_count", 1),
        "use_cache": True,
        "use_grouped_topk": tg.key("expert_group_count", 1) > 1,
        "v_head_dim": tg.key("attention.value_length_mla"),
        "vocab_size": tg.key("vocab_size"),
    }


def kv_b(tg, blk, c):
    """kv_b_proj [heads * (nope + v), kv_lora] from attn_k_b (ne [nope, kv_lora, heads]: each
    head's block transposed) and attn_v_b (ne [kv_lora, v, heads]: rows as they were)."""
    heads, lora = c["num_attention_heads"], c["kv_lora_rank"]
    nope, vd = c["qk_nope_head_dim"], c["v_head_dim"]
    _, kb = tg.get(blk + "attn_k_b.weight")
    _, vb = tg.get(blk + "attn_v_b.weight")
    if len(kb) != heads * lora * nope or len(vb) != heads * vd * lora:
        fail("%sattn_k_b / attn_v_b: sizes do not match heads %d, kv_lora %d, nope %d, v %d"
             % (blk, heads, lora, nope, vd))
    out = array.array("f", bytes(4 * heads * (nope + vd) * lora))
    for h in range(heads):
        base = h * (nope + vd) * lora
        for cc in range(lora):
            row = kb[(h * lora + cc) * nope:(h * lora + cc + 1) * nope]
            for n in range(nope):
                out[base + n * lora + cc] = row[n]
        out[base + nope * lora:base + (nope + vd) * lora] = vb[h * vd * lora:(h + 1) * vd * lora]
    return [heads * (nope + vd), lora], out


def build_tensors(tg, c, pattern):
    d, vocab = c["hidden_size"], c["vocab_size"]
    kh, khd = c["linear_attn_config"]["num_heads"], c["head_dim"]
    inner, conv = kh * khd, c["linear_attn_config"]["short_conv_kernel_size"]
    heads, nope, rope, vd = c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    lora, nexp, ffe = c["kv_lora_rank"], c["num_experts"], c["moe_intermediate_size"]
    tg.copy("token_embd.weight", "model.embed_tokens.weight", [vocab, d])
    for l, kind in enumerate(pattern):
        b, L = "blk.%d." % l, "model.layers.%d." % l
        A, M = L + "self_attn.", L + "block_sparse_moe."
        tg.copy(b + "attn_norm.weight", L + "input_layernorm.weight", [d])
        if kind == "kda":
            for x in "qkv":
                tg.copy(b + "attn_%s.weight" % x, A + "%s_proj.weight" % x, [inner, d])
                tg.copy(b + "ssm_conv1d_%s.weight" % x, A + "%s_conv1d.weight" % x, [inner, 1, conv])
            _, a = tg.get(b + "ssm_a")
            if any(not x < 0 for x in a):
                fail("%sssm_a holds a value that is not negative (it is -exp(A_log))" % b)
            tg.put(A + "A_log", [1, 1, kh, 1], array.array("f", (math.log(-x) for x in a)))
            tg.copy(b + "ssm_dt.bias", A + "dt_bias", [inner])
            tg.copy(b + "ssm_f_a.weight", A + "f_a_proj.weight", [khd, d])
            tg.copy(b + "ssm_f_b.weight", A + "f_b_proj.weight", [inner, khd])
            tg.copy(b + "ssm_beta.weight", A + "b_proj.weight", [kh, d])
            tg.copy(b + "ssm_g_a.weight", A + "g_a_proj.weight", [khd, d])
            tg.copy(b + "ssm_g_b.weight", A + "g_b_proj.weight", [inner, khd])
            tg.copy(b + "ssm_norm.weight", A + "o_norm.weight", [khd])
            tg.copy(b + "attn_output.weight", A + "o_proj.weight", [d, inner])
        else:
            if c["q_lora_rank"]:
                ql = c["q_lora_rank"]
                tg.copy(b + "attn_q_a.weight", A + "q_a_proj.weight", [ql, d])
                tg.copy(b + "attn_q_a_norm.weight", A + "q_a_layernorm.weight", [ql])
                tg.copy(b + "attn_q_b.weight", A + "q_b_proj.weight", [heads * (nope + rope), ql])
            else:
                tg.copy(b + "attn_q.weight", A + "q_proj.weight", [heads * (nope + rope), d])
            tg.copy(b + "attn_kv_a_mqa.weight", A + "kv_a_proj_with_mqa.weight", [lora + rope, d])
            tg.copy(b + "attn_kv_a_norm.weight", A + "kv_a_layernorm.weight", [lora])
            tg.put(A + "kv_b_proj.weight", *kv_b(tg, b, c))
            tg.copy(b + "attn_output.weight", A + "o_proj.weight", [d, heads * vd])
        tg.copy(b + "ffn_norm.weight", L + "post_attention_layernorm.weight", [d])
        if l < c["first_k_dense_replace"]:  # transformers 5.17 saves the dense MLP here
            ff = c["intermediate_size"]
            for x, shape in (("gate", [ff, d]), ("up", [ff, d]), ("down", [d, ff])):
                tg.copy(b + "ffn_%s.weight" % x, M + "%s_proj.weight" % x, shape)
            continue
        tg.copy(b + "ffn_gate_inp.weight", M + "gate.weight", [nexp, d])
        tg.copy(b + "exp_probs_b.bias", M + "gate.e_score_correction_bias", [nexp])
        for x, w, shape in (("gate", "w1", [ffe, d]), ("up", "w3", [ffe, d]), ("down", "w2", [d, ffe])):
            _, v = tg.get(b + "ffn_%s_exps.weight" % x)
            per = ffe * d
            if len(v) != nexp * per:
                fail("%sffn_%s_exps.weight: %d values, not %d experts of %d" % (b, x, len(v), nexp, per))
            for e in range(nexp):
                tg.put(M + "experts.%d.%s.weight" % (e, w), shape, v[e * per:(e + 1) * per])
        if c["num_shared_experts"]:
            sh = ffe * c["num_shared_experts"]
            for x, shape in (("gate", [sh, d]), ("up", [sh, d]), ("down", [d, sh])):
                tg.copy(b + "ffn_%s_shexp.weight" % x, M + "shared_experts.%s_proj.weight" % x, shape)
    tg.copy("output_norm.weight", "model.norm.weight", [d])
    tg.copy("output.weight" if "output.weight" in tg.tensors else "token_embd.weight", "lm_head.weight", [vocab, d])


def safetensors_f32(tensors):
    """{name: (shape, array('f'))} as write_st takes them: F32, little-endian."""
    out = {}
    for name, (shape, v) in tensors.items():
        if sys.byteorder != "little":
            v = array.array("f", v)
            v.byteswap()
        out[name] = ("F32", shape, v.tobytes())
    return out


def tokenizer_files(tg):
    kv = tg.kv
    if kv.get("tokenizer.ggml.model") != "gpt2" or not kv.get("tokenizer.ggml.merges"):
        fail("%s: tokenizer.ggml.model %r with merges is needed (byte-level BPE)"
             % (tg.path, kv.get("tokenizer.ggml.model")))
    tokens, types = kv["tokenizer.ggml.tokens"], kv.get("tokenizer.ggml.token_type") or []
    special = [i for i, ty in enumerate(types) if ty == TOKEN_CONTROL]
    added = [{"id": i, "content": tokens[i], "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i in special]
    skip = set(special)
    vocab = {s: i for i, s in enumerate(tokens) if i not in skip}
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": KIMI_PAT}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [m.split(" ", 1) for m in kv["tokenizer.ggml.merges"]]},
    }

    def token(k):  # a special token's text by its tokenizer.ggml.<k>_token_id key, if it has one
        i = kv.get("tokenizer.ggml.%s_token_id" % k)
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

    keys = ("content", "lstrip", "normalized", "rstrip", "single_word", "special")
    cfg = {"added_tokens_decoder": {str(a["id"]): {k: a[k] for k in keys} for a in added},
           "add_bos_token": False, "add_eos_token": False, "bos_token": token("bos"), "eos_token": token("eos"),
           "pad_token": token("padding"), "unk_token": token("unknown"), "mask_token": token("mask"),
           "clean_up_tokenization_spaces": False, "model_max_length": tg.key("context_length"),
           "tokenizer_class": "PreTrainedTokenizerFast"}
    template = kv.get("tokenizer.chat_template")
    if template:
        cfg["chat_template"] = template
    return tok, cfg


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("gguf", help="a kimi-linear GGUF written by ember convert")
    ap.add_argument("--out", required=True, help="the folder to write (must not exist)")
    a = ap.parse_args()
    if os.path.exists(a.out):
        fail("%s exists; give a new folder" % a.out)
    tg = Target(a.gguf)
    pattern = layer_pattern(tg)
    cfg = build_config(tg, pattern)
    build_tensors(tg, cfg, pattern)
    tok, tok_cfg = tokenizer_files(tg)
    tmp = a.out.rstrip("/") + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        write_st(os.path.join(tmp, "model.safetensors"), safetensors_f32(tg.out))
        for name, obj in (("config.json", cfg), ("tokenizer.json", tok), ("tokenizer_config.json", tok_cfg)):
            with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
                json.dump(obj, f, indent=1, ensure_ascii=False)
        os.replace(tmp, a.out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print("target_from_gguf: %s: %d tensors, %d values, %d layers (%s) -> %s"
          % (a.gguf, len(tg.out), sum(len(v) for _, v in tg.out.values()), len(pattern),
             "".join("M" if p == "mla" else "K" for p in pattern), a.out), file=sys.stderr)


if __name__ == "__main__":
    main()
