"""Shared pieces of Ember's default-model training (tools/train/).

Inputs: the Python standard library of the machine that runs the scripts (sysconfig's
"stdlib" folder: every *.py file under it, site-packages / dist-packages / test folders
excluded), and optionally the *.py files of the installed packages (site_corpus, with the
eval prompts kept out). Nothing is downloaded.

What lives here:
  - the corpus: file list, train / held-out split (by a hash of the relative path), the
    chat samples made from documented functions (user = docstring summary, assistant =
    the function's source);
  - the tokenizer layout: 8160 byte-level BPE tokens, then 32 specials at Kimi's offsets;
  - the target config (Moonshot-style config.json for KimiLinearForCausalLM);
  - the drafter (a DSpark drafter in DeepSpec's Qwen3DSparkModel layout) as a torch module
    whose state_dict names are the DeepSpec checkpoint names.
All randomness is seeded; see stage1_target.py and stage2_drafter.py.
"""

import ast
import hashlib
import json
import math
import os
import re
import sysconfig

import torch
import torch.nn as nn
import torch.nn.functional as F

# ---------------------------------------------------------------- tokenizer layout

VOCAB_SIZE = 8192
N_SPECIALS = 32
N_BPE = VOCAB_SIZE - N_SPECIALS  # 8160 byte-level BPE tokens (256 bytes + 7904 merges)

# Kimi's named specials by offset from the first special id (163584 in Kimi-Linear-48B).
_NAMED = {
    0: "[BOS]",
    1: "[EOS]",
    2: "<|im_end|>",
    3: "<|im_user|>",
    4: "<|im_assistant|>",
    6: "<|start_header_id|>",
    7: "<|end_header_id|>",
    9: "[EOT]",
    10: "<|im_system|>",
    11: "<|tool_calls_section_begin|>",
    12: "<|tool_calls_section_end|>",
    13: "<|tool_call_begin|>",
    14: "<|tool_call_argument_begin|>",
    15: "<|tool_call_end|>",
    17: "<|im_middle|>",
    29: "[MASK]",  # DSpark mask token (Kimi leaves this offset reserved)
    30: "[UNK]",
    31: "[PAD]",
}


def special_tokens():
    """[(content, id)] for the 32 specials, in id order."""
    out = []
    for off in range(N_SPECIALS):
        tid = N_BPE + off
        out.append((_NAMED.get(off, f"<|reserved_token_{tid}|>"), tid))
    return out


def special_id(name):
    return dict(special_tokens())[name]


MASK_ID = N_BPE + 29

from kimi_pat import KIMI_PAT  # noqa: E402,F401  (common.KIMI_PAT: the tokenizer's split)

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "<|im_{{ message['role'] }}|>{{ message.get('name') or message['role'] }}<|im_middle|>"
    "{{ message['content'] }}<|im_end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
)


def chat_text(user, assistant=None):
    s = f"<|im_user|>user<|im_middle|>{user}<|im_end|><|im_assistant|>assistant<|im_middle|>"
    if assistant is not None:
        s += f"{assistant}<|im_end|>"
    return s


def tokenizer_config():
    """tokenizer_config.json in Kimi's style (added_tokens_decoder + the named specials)."""
    dec = {str(i): {"content": c, "lstrip": False, "normalized": False, "rstrip": False,
                    "single_word": False, "special": True} for c, i in special_tokens()}
    return {
        "added_tokens_decoder": dec,
        "add_bos_token": False,
        "add_eos_token": False,
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "mask_token": "[MASK]",
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1048576,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }


# ---------------------------------------------------------------- corpus

EXCLUDE_DIRS = {"site-packages", "dist-packages", "test", "tests", "__pycache__"}
HELDOUT_PER_256 = 8  # files whose sha256(relative path)[0] < 8 are held out (~3%)


def stdlib_root():
    return sysconfig.get_paths()["stdlib"]


def corpus_files(root=None):
    """Sorted relative paths of the corpus files."""
    root = root or stdlib_root()
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in EXCLUDE_DIRS)
        for fn in filenames:
            if fn.endswith(".py"):
                out.append(os.path.relpath(os.path.join(dirpath, fn), root))
    return sorted(out)


def is_heldout(rel):
    return hashlib.sha256(rel.encode()).digest()[0] < HELDOUT_PER_256


def read_text(path):
    with open(path, "rb") as f:
        raw = f.read()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def load_corpus(root=None):
    """{"train": [(rel, text)], "heldout": [(rel, text)], "root", "sha256"} (sha over paths+texts)."""
    root = root or stdlib_root()
    files = corpus_files(root)
    h = hashlib.sha256()
    train, held = [], []
    for rel in files:
        text = read_text(os.path.join(root, rel))
        if not text.strip():
            continue
        h.update(rel.encode() + b"\0" + text.encode("utf-8", "surrogatepass") + b"\0")
        (held if is_heldout(rel) else train).append((rel, text))
    return {"train": train, "heldout": held, "root": root, "sha256": h.hexdigest()}


# ---------------------------------------------------------------- the larger corpus

SITE_EXCLUDE_DIRS = {"test", "tests", "testing", "__pycache__", "_vendor", "vendor", "vendored", "examples"}
SITE_MAX_FILE = 400_000  # characters; larger files are mostly generated tables


def site_roots():
    """The Python environment's package folders (sysconfig purelib / platlib), deduplicated."""
    out = []
    for key in ("purelib", "platlib"):
        p = os.path.realpath(sysconfig.get_paths()[key])
        if os.path.isdir(p) and p not in out:
            out.append(p)
    return out


def eval_lines(eval_dir):
    """Stripped lines of the eval prompts (>= 40 characters, imports not counted): a training
    file holding any of them is left out."""
    lines = set()
    for fn in sorted(os.listdir(eval_dir)) if os.path.isdir(eval_dir) else []:
        if not fn.endswith(".jsonl"):
            continue
        with open(os.path.join(eval_dir, fn), encoding="utf-8") as f:
            for row in f:
                rec = json.loads(row)
                text = rec.get("prompt") or " ".join(rec.get("turns", []))
                lines.update(l.strip() for l in text.split("\n")
                             if len(l.strip()) >= 40 and not l.strip().startswith(("from ", "import ")))
    return lines


def site_corpus(max_chars, eval_dir, roots=None):
    """Extra training text: the *.py files of the installed packages (site_roots), sorted by
    path, identical files once, test / vendored folders and files over SITE_MAX_FILE left out,
    and any file sharing a line with an eval prompt left out. Over max_chars, a fixed subset:
    files in order of sha256(path) until the budget is spent.
    Returns ([(rel, text)], stats)."""
    banned = eval_lines(eval_dir)
    seen, files, stats = set(), [], {"roots": roots or site_roots(), "leak_guard_lines": len(banned),
                                     "skipped_eval_overlap": 0, "skipped_duplicate": 0, "skipped_large": 0}
    for root in stats["roots"]:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in SITE_EXCLUDE_DIRS and not d.endswith(".dist-info"))
            for fn in sorted(filenames):
                if not fn.endswith(".py"):
                    continue
                path = os.path.join(dirpath, fn)
                try:
                    if os.path.getsize(path) > SITE_MAX_FILE:
                        stats["skipped_large"] += 1
                        continue
                    text = read_text(path)
                except OSError:
                    continue
                if not text.strip():
                    continue
                digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
                if digest in seen:
                    stats["skipped_duplicate"] += 1
                    continue
                seen.add(digest)
                if banned and any(l.strip() in banned for l in text.split("\n")):
                    stats["skipped_eval_overlap"] += 1
                    continue
                files.append(("site/" + os.path.relpath(path, root), text))
    files.sort()
    total = sum(len(t) for _, t in files)
    stats["files_found"], stats["chars_found"] = len(files), total
    if total > max_chars:
        keep, used = set(), 0
        for rel, text in sorted(files, key=lambda f: hashlib.sha256(f[0].encode()).digest()):
            if used + len(text) > max_chars:
                continue
            keep.add(rel)
            used += len(text)
        files = [f for f in files if f[0] in keep]
    per_pkg = {}
    for rel, text in files:
        top = rel.split("/")[1]
        n, c = per_pkg.get(top, (0, 0))
        per_pkg[top] = (n + 1, c + len(text))
    stats["files"], stats["chars"] = len(files), sum(len(t) for _, t in files)
    stats["packages_top30_by_chars"] = sorted(per_pkg.items(), key=lambda kv: -kv[1][1])[:30]
    h = hashlib.sha256()
    for rel, text in files:
        h.update(rel.encode() + b"\0" + text.encode("utf-8", "surrogatepass") + b"\0")
    stats["sha256"] = h.hexdigest()
    return files, stats


def chat_samples(files, max_chars=3000):
    """(user, assistant) pairs: a function's docstring summary asks for its source.

    For every def / async def with a docstring in the given files (source order):
    user = "Write a Python function `name` that ..." with the docstring's first paragraph,
    assistant = the function's source (ast.get_source_segment, dedented; skipped if longer
    than max_chars)."""
    out = []
    for rel, text in files:
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            doc = ast.get_docstring(node)
            if not doc or node.name.startswith("_"):
                continue
            para = doc.strip().split("\n\n")[0].strip()
            para = re.sub(r"\s+", " ", para)
            if len(para) < 16 or len(para) > 400:
                continue
            src = ast.get_source_segment(text, node, padded=True)
            if not src or len(src) > max_chars:
                continue
            lines = src.split("\n")
            indent = min((len(l) - len(l.lstrip()) for l in lines if l.strip()), default=0)
            src = "\n".join(l[indent:] for l in lines)
            out.append((f"Write a Python function `{node.name}`: {para}", src))
    return out


# ---------------------------------------------------------------- target config

def target_config():
    """Moonshot-style config.json of the default target (8 layers: KDA x3, MLA, KDA x3, MLA)."""
    return {
        "architectures": ["KimiLinearForCausalLM"],
        "bos_token_id": special_id("[BOS]"),
        "dtype": "bfloat16",
        "eos_token_id": special_id("[EOS]"),
        "first_k_dense_replace": 1,
        "head_dim": 64,
        "hidden_act": "silu",
        "hidden_size": 256,
        "initializer_range": 0.02,
        "intermediate_size": 768,
        "kv_lora_rank": 128,
        "linear_attn_config": {
            "full_attn_layers": [4, 8],
            "head_dim": 64,
            "kda_layers": [1, 2, 3, 5, 6, 7],
            "num_heads": 4,
            "short_conv_kernel_size": 4,
        },
        "mla_use_nope": True,
        "model_max_length": 1048576,
        "model_type": "kimi_linear",
        "moe_intermediate_size": 128,
        "moe_layer_freq": 1,
        "moe_renormalize": True,
        "moe_router_activation_func": "sigmoid",
        "num_attention_heads": 4,
        "num_expert_group": 1,
        "num_experts": 16,
        "num_experts_per_token": 2,
        "num_hidden_layers": 8,
        "num_key_value_heads": 4,
        "num_nextn_predict_layers": 0,
        "num_shared_experts": 1,
        "pad_token_id": special_id("[PAD]"),
        "q_lora_rank": None,
        "qk_nope_head_dim": 64,
        "qk_rope_head_dim": 32,
        "rms_norm_eps": 1e-05,
        "rope_scaling": None,
        "rope_theta": 10000.0,
        "routed_scaling_factor": 2.446,
        "tie_word_embeddings": False,
        "topk_group": 1,
        "use_cache": True,
        "use_grouped_topk": False,
        "v_head_dim": 64,
        "vocab_size": VOCAB_SIZE,
    }


F32_ALWAYS = ("A_log", "dt_bias", "e_score_correction_bias")


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True, ensure_ascii=False)
        f.write("\n")


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------- drafter

DRAFT = dict(layers=3, heads=4, kv_heads=2, head_dim=64, inter=768, taps=[1, 3, 5], rank=128,
             block_size=7, eps=1e-6, rope_theta=10000.0, gamma=4.0)


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_cos_sin(pos, head_dim, theta, device):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    f = pos.float()[..., None] * inv  # [..., hd/2]
    emb = torch.cat([f, f], -1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    a, b = x.chunk(2, -1)
    return torch.cat([-b, a], -1)


def apply_rope(x, cos, sin):
    # x [B, H, S, hd]; cos/sin [B, S, hd]
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


def sdpa(q, k, v, mask):
    """Scaled dot-product attention with a boolean mask (True = attend); torch < 2 fallback."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s.float(), -1).to(v.dtype) @ v


class DraftAttention(nn.Module):
    def __init__(self, d, s):
        super().__init__()
        self.h, self.kv, self.hd = s["heads"], s["kv_heads"], s["head_dim"]
        self.q_proj = nn.Linear(d, self.h * self.hd, bias=False)
        self.k_proj = nn.Linear(d, self.kv * self.hd, bias=False)
        self.v_proj = nn.Linear(d, self.kv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.h * self.hd, d, bias=False)
        self.q_norm = RMSNorm(self.hd, s["eps"])
        self.k_norm = RMSNorm(self.hd, s["eps"])

    def forward(self, x, ctx, cos_q, sin_q, cos_c, sin_c, mask):
        # x [B, Q, d] block rows (normed); ctx [B, T, d] fused context features
        B, Q, _ = x.shape
        T = ctx.shape[1]
        q = self.q_norm(self.q_proj(x).view(B, Q, self.h, self.hd)).transpose(1, 2)
        kx = self.k_norm(self.k_proj(x).view(B, Q, self.kv, self.hd)).transpose(1, 2)
        kc = self.k_norm(self.k_proj(ctx).view(B, T, self.kv, self.hd)).transpose(1, 2)
        vx = self.v_proj(x).view(B, Q, self.kv, self.hd).transpose(1, 2)
        vc = self.v_proj(ctx).view(B, T, self.kv, self.hd).transpose(1, 2)
        q = apply_rope(q, cos_q, sin_q)
        kx = apply_rope(kx, cos_q, sin_q)
        kc = apply_rope(kc, cos_c, sin_c)
        k = torch.cat([kc, kx], 2)
        v = torch.cat([vc, vx], 2)
        rep = self.h // self.kv
        k = k.repeat_interleave(rep, 1)
        v = v.repeat_interleave(rep, 1)
        o = sdpa(q, k, v, mask[:, None])
        return self.o_proj(o.transpose(1, 2).reshape(B, Q, self.h * self.hd))


class DraftMLP(nn.Module):
    def __init__(self, d, inter):
        super().__init__()
        self.gate_proj = nn.Linear(d, inter, bias=False)
        self.up_proj = nn.Linear(d, inter, bias=False)
        self.down_proj = nn.Linear(inter, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    def __init__(self, d, s):
        super().__init__()
        self.input_layernorm = RMSNorm(d, s["eps"])
        self.post_attention_layernorm = RMSNorm(d, s["eps"])
        self.self_attn = DraftAttention(d, s)
        self.mlp = DraftMLP(d, s["inter"])

    def forward(self, h, ctx, *rope_mask):
        h = h + self.self_attn(self.input_layernorm(h), ctx, *rope_mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class MarkovHead(nn.Module):
    def __init__(self, vocab, r):
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab, r)
        self.markov_w2 = nn.Linear(r, vocab, bias=False)


class ConfidenceHead(nn.Module):
    def __init__(self, d, r):
        super().__init__()
        self.proj = nn.Linear(d + r, 1, bias=True)


class DSparkDrafter(nn.Module):
    """DeepSpec Qwen3DSparkModel: state_dict names are the checkpoint's tensor names."""

    def __init__(self, d, vocab, s=DRAFT):
        super().__init__()
        self.s, self.d = s, d
        self.layers = nn.ModuleList([DraftLayer(d, s) for _ in range(s["layers"])])
        self.fc = nn.Linear(len(s["taps"]) * d, d, bias=False)
        self.hidden_norm = RMSNorm(d, s["eps"])
        self.norm = RMSNorm(d, s["eps"])
        self.markov_head = MarkovHead(vocab, s["rank"])
        self.confidence_head = ConfidenceHead(d, s["rank"])
        self.embed_tokens = nn.Embedding(vocab, d)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def init_weights(self, seed):
        g = torch.Generator().manual_seed(seed)
        n_layers = self.s["layers"]
        for name, p in self.named_parameters():
            if name.startswith(("embed_tokens", "lm_head")):
                continue
            if p.dim() == 1:
                nn.init.ones_(p) if name.endswith("norm.weight") else nn.init.zeros_(p)
            elif "markov_w1" in name:
                p.data.copy_(torch.randn(p.shape, generator=g) * 0.02)
            elif "markov_w2" in name:
                p.data.zero_()  # starts as a zero bias: the drafter begins as plain DFlash
            else:
                std = 0.02 / math.sqrt(2 * n_layers) if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
                p.data.copy_(torch.randn(p.shape, generator=g) * std)

    def backbone(self, taps, ctx_len, block_ids, anchors):
        """taps [B, T, n*d]; block_ids [B, N, K] (anchor + masks); anchors [B, N] (positions).

        Block n of row b sits at positions anchors[b,n] .. +K-1 and sees context rows
        p < anchors[b,n] (p < ctx_len[b]) plus its own K rows. Returns normed h [B, N, K, d]."""
        B, N, K = block_ids.shape
        T = taps.shape[1]
        dev = taps.device
        ctx = self.hidden_norm(self.fc(taps))
        h = self.embed_tokens(block_ids).view(B, N * K, self.d).to(ctx.dtype)
        pos_q = (anchors[:, :, None] + torch.arange(K, device=dev)).view(B, N * K)
        pos_c = torch.arange(T, device=dev).expand(B, T)
        hd, th = self.s["head_dim"], self.s["rope_theta"]
        cq, sq = rope_cos_sin(pos_q, hd, th, dev)
        cc, sc = rope_cos_sin(pos_c, hd, th, dev)
        cq, sq, cc, sc = (t.to(ctx.dtype) for t in (cq, sq, cc, sc))
        # mask [B, N*K, T + N*K]: context rows before the anchor; own block
        ctx_ok = (pos_c[:, None, :] < anchors.repeat_interleave(K, 1)[:, :, None]) & \
                 (pos_c[:, None, :] < ctx_len[:, None, None])
        blk = torch.arange(N, device=dev).repeat_interleave(K)
        own = (blk[:, None] == blk[None, :]).expand(B, N * K, N * K)
        mask = torch.cat([ctx_ok, own], 2)
        for layer in self.layers:
            h = layer(h, ctx, cq, sq, cc, sc, mask)
        return self.norm(h).view(B, N, K, self.d)

    def heads(self, h, prev):
        """h [..., d] normed; prev [...] previous token ids -> (draft logits, confidence logit)."""
        e = self.markov_head.markov_w1(prev).to(h.dtype)
        logits = self.lm_head(h) + self.markov_head.markov_w2(e)
        z = self.confidence_head.proj(torch.cat([h, e], -1)).squeeze(-1)
        return logits, z


def deepspec_fields(target_layers, s=DRAFT):
    return {
        "architectures": ["Qwen3DSparkModel"],
        "num_target_layers": target_layers,
        "num_hidden_layers": s["layers"],
        "block_size": s["block_size"],
        "tie_word_embeddings": False,
        "layer_types": ["full_attention"] * s["layers"],
        "mask_token_id": MASK_ID,
        "target_layer_ids": list(s["taps"]),
        "num_anchors": 512,
        "enable_confidence_head": True,
        "confidence_head_with_markov": True,
        "markov_rank": s["rank"],
        "markov_head_type": "vanilla",
    }


def deepspec_qwen3_kwargs(d, s=DRAFT):
    return dict(
        vocab_size=VOCAB_SIZE, hidden_size=d, intermediate_size=s["inter"],
        num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
        num_key_value_heads=s["kv_heads"], head_dim=s["head_dim"], hidden_act="silu",
        max_position_embeddings=1048576, rms_norm_eps=s["eps"], tie_word_embeddings=False,
        attention_bias=False, attention_dropout=0.0,
        rope_parameters={"rope_type": "default", "rope_theta": s["rope_theta"]},
        bos_token_id=special_id("[BOS]"), eos_token_id=special_id("[EOS]"),
        pad_token_id=special_id("[PAD]"), layer_types=["full_attention"] * s["layers"],
        use_cache=True, use_sliding_window=False, sliding_window=None,
        max_window_layers=s["layers"],
    )


def deepspec_config_fallback(d, target_layers, s=DRAFT):
    cfg = dict(deepspec_qwen3_kwargs(d, s))
    cfg.update(model_type="qwen3", dtype="bfloat16", initializer_range=0.02)
    cfg.update(deepspec_fields(target_layers, s))
    return dict(sorted(cfg.items()))
