"""Cross-check of Ember's DSpark drafter (src/draft/) against the training scripts' PyTorch
drafter (common.py: DSparkDrafter, written independently of Ember), on the same inputs.

Inputs: an Ember build (`ember` and `compat_draft_dump`, tests/compat/draft_dump.c) and the
default pair in models/. Runs with any Python that has torch and numpy (here /usr/bin/python3,
torch 1.13, CPU); transformers is not needed. Outputs: a table on stdout; exit 1 when a slot's
max |logit difference| / max |logit| exceeds --tol.

For each prompt:
  1. compat_draft_dump prefills the prompt through Ember's target (opened with the drafter's taps
     [1, 3, 5] as feature layers), takes the target's greedy next token as the anchor, and has
     Ember's drafter propose one block greedily (slot k's Markov input: the token chosen at slot
     k-1, the anchor for slot 0); it dumps the features, the block's corrected logits and
     confidence logits.
  2. The PyTorch drafter, loaded with the drafter GGUF's own weights (every tensor dequantized to
     f32 by `ember tensor`, so both sides use the same Q8_0 values), runs the same block on the
     same features: context rows 0..P-1, block [anchor, MASK x 6] at positions P..P+6, then the
     heads slot by slot with Ember's chosen tokens as the Markov inputs.
  3. Compared per slot: max |delta logit| / max |logit|, argmax agreement, confidence logits.

  /usr/bin/python3 tools/train/xcheck_drafter.py --build build
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

# GGUF tensor name -> DeepSpec state_dict name (src/convert/map_dflash.c's table, reversed).
LAYER_MAP = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
TOP_MAP = {
    "token_embd.weight": "embed_tokens.weight", "fc.weight": "fc.weight",
    "enc.output_norm.weight": "hidden_norm.weight", "output_norm.weight": "norm.weight",
    "output.weight": "lm_head.weight", "markov_w1.weight": "markov_head.markov_w1.weight",
    "markov_w2.weight": "markov_head.markov_w2.weight", "conf_proj.weight": "confidence_head.proj.weight",
    "conf_proj.bias": "confidence_head.proj.bias",
}

PROMPTS = [
    ("raw", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    ("raw", "import os\nimport sys\n\n\nclass Config:\n    def __init__(self, path):\n        self.path = path\n"),
    ("chat", "Write a Python function `quote`: Quote a string for use in a URL."),
    ("chat", "Compose an engaging travel blog post about a recent trip to Hawaii."),
]


def torch_name(gguf_name):
    if gguf_name in TOP_MAP:
        return TOP_MAP[gguf_name]
    parts = gguf_name.split(".")
    if parts[0] == "blk" and parts[2] in LAYER_MAP:
        return "layers.%s.%s.%s" % (parts[1], LAYER_MAP[parts[2]], parts[3])
    raise KeyError(gguf_name)


def load_drafter(ember, draft_path, tmp):
    info = json.loads(subprocess.check_output([ember, "inspect", draft_path, "--json"]))
    meta = {m["key"]: m["value"] for m in info["metadata"] if m["type"] != "array"}
    d = meta["dflash.embedding_length"]
    model = common.DSparkDrafter(d, meta["dflash.vocab_size"])
    sd = {}
    for t in info["tensors"]:
        out = os.path.join(tmp, t["name"] + ".f32")
        subprocess.check_call([ember, "tensor", draft_path, t["name"], "-o", out], stderr=subprocess.DEVNULL)
        shape = list(reversed(t["shape"]))
        sd[torch_name(t["name"])] = torch.from_numpy(np.fromfile(out, dtype="<f4").reshape(shape).copy())
    sd["confidence_head.proj.weight"] = sd["confidence_head.proj.weight"].reshape(1, -1)
    missing, unexpected = model.load_state_dict(sd, strict=True), None
    del missing, unexpected
    model.eval()
    return model, meta


def q8_0_round_trip(x):
    """ggml's quantize_row_q8_0 and back: blocks of 32 along the last axis, d = max|x| / 127 kept
    as f16, q = round(x / d) (half away from zero)."""
    shape = x.shape
    b = x.reshape(-1, 32)
    d = (b.abs().amax(-1, keepdim=True) / 127.0).half().float()
    inv = torch.where(d > 0, 1.0 / (b.abs().amax(-1, keepdim=True) / 127.0), torch.zeros_like(d))
    q = torch.sign(b * inv) * torch.floor((b * inv).abs() + 0.5)
    return (q * d).reshape(shape)


def quantize_linear_inputs(model):
    """Ember (like ggml) multiplies Q8_0 weights by activations quantized to Q8_0: do the same to
    the inputs of every Linear whose GGUF weight is Q8_0 (all but the confidence projection)."""
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and not name.startswith("confidence_head"):
            mod.forward = (lambda m: lambda x: torch.nn.functional.linear(q8_0_round_trip(x), m.weight, m.bias))(mod)


def check_prompt(model, meta, dump_bin, target, draft, kind, prompt, tmp):
    out = tempfile.mkdtemp(dir=tmp)
    cmd = [dump_bin, target, draft, out, prompt] + (["--chat"] if kind == "chat" else [])
    subprocess.check_call(cmd, stderr=subprocess.DEVNULL)
    m = json.load(open(os.path.join(out, "meta.json")))
    P, nf, V = len(m["prompt_ids"]), m["n_feat"], m["n_vocab"]
    feats = torch.from_numpy(np.fromfile(os.path.join(out, "features.f32"), dtype="<f4").reshape(P, nf).copy())
    e_logits = np.fromfile(os.path.join(out, "logits.f32"), dtype="<f4").reshape(-1, V)
    e_conf = np.fromfile(os.path.join(out, "conf.f32"), dtype="<f4")
    K = meta["dflash.block_size"]
    mask_id = meta["tokenizer.ggml.mask_token_id"]
    ids = torch.tensor([[[m["anchor"]] + [mask_id] * (K - 1)]])
    with torch.no_grad():
        h = model.backbone(feats[None], torch.tensor([P]), ids, torch.tensor([[P]]))[0, 0]  # [K, d]
        prev = [m["anchor"]] + m["draft_tokens"][:-1]
        rows = []
        for k in range(len(m["draft_tokens"])):
            logits, z = model.heads(h[k], torch.tensor(prev[k]))
            t_l = logits.numpy()
            rel = float(np.abs(t_l - e_logits[k]).max() / np.abs(t_l).max())
            rows.append((k, rel, int(t_l.argmax()), m["draft_tokens"][k], float(z), float(e_conf[k])))
    return P, m["anchor"], rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="Ember build folder (ember, compat_draft_dump)")
    ap.add_argument("--target", default="models/kimi-linear-19m-q8_0.gguf")
    ap.add_argument("--draft", default="models/dspark-kimi-linear-19m-q8_0.gguf")
    ap.add_argument("--q8-act", action="store_true",
                    help="quantize the inputs of Q8_0 matmuls to Q8_0 as Ember does (isolates that rounding)")
    ap.add_argument("--tol", type=float, default=0.02, help="max |delta logit| / max |logit| allowed per slot")
    args = ap.parse_args()
    ember = os.path.join(args.build, "ember")
    dump_bin = os.path.join(args.build, "compat_draft_dump")
    torch.set_num_threads(1)
    worst = 0.0
    argmax_agree = total = 0
    with tempfile.TemporaryDirectory() as tmp:
        model, meta = load_drafter(ember, args.draft, tmp)
        if args.q8_act:
            quantize_linear_inputs(model)
        print("| prompt | P | anchor | slot | max|dlogit|/max|logit| | argmax torch / ember | conf logit torch / ember |")
        print("|---|---|---|---|---|---|---|")
        for i, (kind, prompt) in enumerate(PROMPTS):
            P, anchor, rows = check_prompt(model, meta, dump_bin, args.target, args.draft, kind, prompt, tmp)
            for k, rel, ta, ea, tz, ez in rows:
                worst = max(worst, rel)
                argmax_agree += ta == ea
                total += 1
                print("| %d (%s) | %d | %d | %d | %.2e | %d / %d | %.4f / %.4f |" % (i, kind, P, anchor, k, rel, ta, ea, tz, ez))
    print("\nworst max|dlogit|/max|logit| %.3e over %d slots; argmax agrees on %d/%d" % (worst, total, argmax_agree, total))
    return 0 if worst <= args.tol else 1


if __name__ == "__main__":
    sys.exit(main())
