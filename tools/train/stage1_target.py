#!/usr/bin/env python3
"""Stage 1: corpus -> byte-level BPE tokenizer -> Kimi-Linear target, trained next-token.

Inputs:  the Python standard library of this machine (common.load_corpus) and, with
         --site-chars N, up to N characters of the installed packages' *.py files
         (common.site_corpus; eval prompts kept out by common.eval_lines); nothing downloaded.
         The tokenizer is trained on the standard library's training files alone.
Outputs (under --out):
  target/config.json            Moonshot-style config (common.target_config)
  target/model.safetensors      Moonshot tensor names (as Kimi-Linear-48B ships them), BF16
                                except A_log, dt_bias, e_score_correction_bias (F32)
  target/tokenizer.json         byte-level BPE, Kimi pre-tokenizer regex, 32 Kimi specials
  target/tokenizer_config.json  Kimi-style specials and chat template
  stage1_log.json               environment, corpus stats, tokenizer checks, loss curve,
                                held-out perplexity, samples
  tok_tests.json                HF tokenizer ids of test strings (for `ember tokenize` checks)
Seeds: torch 1234 (init), 4321 (batches), random 7 (document order). The number of steps is
set from the measured step time so training fits --train-seconds (stated in the log); rerun
with --steps N to repeat a run exactly.
"""

import argparse
import json
import math
import os
import random
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

EVAL_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "eval")

T0 = time.time()
LOG = {"stages": {}}


def log(*a):
    print(f"[{time.time() - T0:7.1f}s]", *a, flush=True)


def stage(name):
    LOG["stages"][name] = round(time.time() - T0, 1)
    log("==", name)


# ---------------------------------------------------------------- tokenizer


def train_tokenizer(texts):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(common.KIMI_PAT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=common.N_BPE, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    n = tok.get_vocab_size()
    if n != common.N_BPE:
        raise RuntimeError(f"BPE vocabulary has {n} tokens, want {common.N_BPE}")
    tok.add_special_tokens([AddedToken(c, special=True, normalized=False) for c, _ in common.special_tokens()])
    for c, i in common.special_tokens():
        got = tok.token_to_id(c)
        if got != i:
            raise RuntimeError(f"special {c} got id {got}, want {i}")
    return tok


def tiktoken_check(tok, texts):
    """Compare HF BPE (merges) with tiktoken (ranks = ids, Kimi pat_str) on texts."""
    try:
        import tiktoken
    except ImportError as e:
        return {"error": f"tiktoken unavailable: {e}"}
    from tokenizers import decoders  # noqa: F401

    # ByteLevel char -> byte map
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    dec = {chr(c): b for b, c in zip(bs, cs)}
    ranks = {}
    for s, i in tok.get_vocab(with_added_tokens=False).items():
        ranks[bytes(dec[ch] for ch in s)] = i
    enc = tiktoken.Encoding(name="ember_default", pat_str=common.KIMI_PAT, mergeable_ranks=ranks,
                            special_tokens={c: i for c, i in common.special_tokens()})
    n_tok = n_bad_tok = n_bad_txt = 0
    examples = []
    for t in texts:
        a = tok.encode(t, add_special_tokens=False).ids
        b = enc.encode(t, allowed_special="all")
        n_tok += len(a)
        if a != b:
            n_bad_txt += 1
            n_bad_tok += sum(1 for x, y in zip(a, b) if x != y) + abs(len(a) - len(b))
            if len(examples) < 3:
                k = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                examples.append({"hf": a[max(0, k - 3):k + 5], "tiktoken": b[max(0, k - 3):k + 5],
                                 "text": tok.decode(a[max(0, k - 3):k + 5])})
    return {"texts": len(texts), "tokens": n_tok, "texts_differing": n_bad_txt,
            "approx_tokens_differing": n_bad_tok, "examples": examples}


TOK_TESTS = [
    "def ",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n        return n\n",
    "import os\nfrom collections import OrderedDict\n\nclass Foo(object):\n\tpass\r\n",
    "Numbers: 12345 and 2024-07-14, price $9.99! x+=1; y**=2 # comment",
    "  leading spaces\n\nand new lines\r\n   \n",
    "unicode: caf\u00e9 na\u00efve \u4f60\u597d\u4e16\u754c \u00c9COLE d'\u00e9t\u00e9 I'm we'LL",
    common.chat_text("Write a Python function `add` that adds two numbers."),
    "<|im_system|>system<|im_middle|>You are helpful.<|im_end|>[EOS]",
    "HTTPServer.handle_request() -> None; XMLParser vs parseXML CamelCase",
]


# ---------------------------------------------------------------- model


def build_model(cfg_dict, device):
    from transformers import KimiLinearConfig, KimiLinearForCausalLM

    with tempfile.TemporaryDirectory() as d:
        common.write_json(os.path.join(d, "config.json"), cfg_dict)
        conf = KimiLinearConfig.from_pretrained(d)
    tried = []
    for attn, experts in (("sdpa", "grouped_mm"), ("sdpa", None), ("eager", None)):
        try:
            kw = {"attn_implementation": attn}
            if experts:
                kw["experts_implementation"] = experts
            torch.manual_seed(1234)
            model = KimiLinearForCausalLM._from_config(conf, **kw)
            init_weights(model, 1234)
            model.to(device)
            x = torch.randint(0, 8000, (2, 130), device=device)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = model(input_ids=x, use_cache=False)
            loss = out.logits.float().mean()
            loss.backward()
            model.zero_grad(set_to_none=True)
            if not torch.isfinite(loss):
                raise RuntimeError("non-finite test loss")
            tried.append(f"{attn}/{experts}: ok")
            return model, conf, tried
        except Exception as e:  # noqa: BLE001
            tried.append(f"{attn}/{experts}: {type(e).__name__}: {str(e)[:300]}")
            log("  model option failed:", tried[-1])
    raise RuntimeError(f"no model option worked: {tried}")


@torch.no_grad()
def init_weights(model, seed):
    """Explicit, version-independent init (transformers' _init_weights differs between versions)."""
    g = torch.Generator().manual_seed(seed)
    n_layers = model.config.num_hidden_layers
    for name, p in sorted(model.named_parameters()):
        if name.endswith("A_log"):
            p.copy_(torch.empty(p.shape).uniform_(1.0, 16.0, generator=g).log())
        elif name.endswith("dt_bias"):
            dt = torch.exp(torch.empty(p.shape).uniform_(math.log(1e-3), math.log(1e-1), generator=g))
            p.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
        elif "conv1d" in name:
            p.copy_(torch.empty(p.shape).uniform_(-0.5, 0.5, generator=g))
        elif p.dim() == 1:
            p.fill_(1.0) if name.endswith("weight") else p.zero_()
        else:
            out_proj = name.endswith(("o_proj.weight", "down_proj.weight", "down_proj"))
            std = 0.02 / math.sqrt(2 * n_layers) if out_proj else 0.02
            p.copy_(torch.randn(p.shape, generator=g) * std)
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            b.zero_()


def router_modules(model):
    return [(n, m) for n, m in model.named_modules() if type(m).__name__.endswith("TopkRouter")]


class LoadTracker:
    """Aux-loss-free balancing (DeepSeek-V3 style): nudge e_score_correction_bias toward equal load."""

    def __init__(self, model, n_experts, rate=1e-3):
        self.rate, self.n = rate, n_experts
        self.counts = {}
        self.mods = router_modules(model)
        for name, m in self.mods:
            m.register_forward_hook(self._hook(name))

    def _hook(self, name):
        def hook(_m, _inp, out):
            outs = out if isinstance(out, (tuple, list)) else (out,)
            ints = [o for o in outs if torch.is_tensor(o) and not o.is_floating_point()]
            if ints:
                c = torch.bincount(ints[-1].reshape(-1), minlength=self.n).float()
                self.counts[name] = self.counts.get(name, 0) + c
        return hook

    @torch.no_grad()
    def update(self):
        imb = []
        for name, m in self.mods:
            c = self.counts.get(name)
            if c is None:
                continue
            m.e_score_correction_bias += self.rate * torch.sign(c.mean() - c)
            imb.append(float(c.max() / c.mean()))
        self.counts = {}
        return max(imb) if imb else None


@torch.no_grad()
def round_to_bf16(model):
    for name, p in model.named_parameters():
        if not name.endswith(common.F32_ALWAYS):
            p.copy_(p.bfloat16().float())


@torch.no_grad()
def heldout_nll(model, stream, seq_len, device, batch=32):
    model.eval()
    n = (len(stream) - 1) // seq_len
    tot, cnt = 0.0, 0
    for i in range(0, n, batch):
        idx = torch.arange(i, min(n, i + batch))
        x = torch.stack([stream[j * seq_len:(j + 1) * seq_len] for j in idx.tolist()]).to(device).long()
        y = torch.stack([stream[j * seq_len + 1:(j + 1) * seq_len + 1] for j in idx.tolist()]).to(device).long()
        logits = model(input_ids=x, use_cache=False).logits.float()
        tot += float(F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1), reduction="sum"))
        cnt += y.numel()
    model.train()
    return tot / max(cnt, 1), cnt


def save_target(model, tok, out_dir):
    """Moonshot layout: save_pretrained's names, the dense layer's MLP back under mlp.*"""
    from safetensors.torch import load_file, save_file

    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        tensors = {}
        for fn in sorted(os.listdir(tmp)):
            if fn.endswith(".safetensors"):
                tensors.update(load_file(os.path.join(tmp, fn)))
    cfg = common.target_config()
    out = {}
    for name, t in tensors.items():
        parts = name.split(".")
        if (len(parts) > 3 and parts[0] == "model" and parts[1] == "layers"
                and int(parts[2]) < cfg["first_k_dense_replace"] and parts[3] == "block_sparse_moe"):
            name = ".".join(parts[:3] + ["mlp"] + parts[4:])
        keep = name.endswith(common.F32_ALWAYS)
        out[name] = (t.float() if keep else t.to(torch.bfloat16)).contiguous()
    save_file(out, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    common.write_json(os.path.join(out_dir, "config.json"), cfg)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    common.write_json(os.path.join(out_dir, "tokenizer_config.json"), common.tokenizer_config())
    return {k: [str(v.dtype).replace("torch.", ""), list(v.shape)] for k, v in sorted(out.items())}


def chat_samples_parallel(files):
    """common.chat_samples over many files on every CPU, sorted (a fixed order to shuffle)."""
    import multiprocessing as mp

    with mp.Pool(os.cpu_count() or 1) as pool:
        res = pool.map(common.chat_samples, [files[i::64] for i in range(64)])
    return sorted(x for out in res for x in out)


def to_stream(docs, eos):
    """One int32 tensor: every document followed by [EOS]."""
    lens = np.fromiter((len(d) + 1 for d in docs), dtype=np.int64, count=len(docs))
    out = np.empty(int(lens.sum()), dtype=np.int32)
    pos = 0
    for d in docs:
        out[pos:pos + len(d)] = d
        out[pos + len(d)] = eos
        pos += len(d) + 1
    return torch.from_numpy(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--train-seconds", type=float, default=300)
    ap.add_argument("--steps", type=int, default=0, help="fixed step count (0: from --train-seconds)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--site-chars", type=int, default=0,
                    help="characters of installed packages' code added to the corpus (0: standard library only)")
    ap.add_argument("--deadline", type=float, default=0,
                    help="seconds from the start by which everything must be written (training is shortened to fit)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    dev = "cuda"
    torch.backends.cuda.matmul.allow_tf32 = True
    LOG["args"] = vars(args)
    import transformers
    import tokenizers
    LOG["environment"] = {"python": sys.version.split()[0], "torch": torch.__version__,
                          "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
                          "gpu": torch.cuda.get_device_name(0)}
    log(LOG["environment"])

    stage("corpus")
    corpus = common.load_corpus()
    train_files, held_files = corpus["train"], corpus["heldout"]
    site_files = []
    if args.site_chars:
        site_files, LOG["site_corpus"] = common.site_corpus(args.site_chars, EVAL_DIR)
        held_texts = {t for _, t in held_files}
        site_files = [f for f in site_files if f[1] not in held_texts]
        log({k: v for k, v in LOG["site_corpus"].items() if k != "packages_top30_by_chars"})
    chats = chat_samples_parallel(train_files + site_files)
    LOG["corpus"] = {"root": corpus["root"], "sha256": corpus["sha256"], "train_files": len(train_files),
                     "heldout_files": len(held_files), "train_chars": sum(len(t) for _, t in train_files),
                     "heldout_chars": sum(len(t) for _, t in held_files), "chat_samples": len(chats),
                     "heldout_list": [r for r, _ in held_files]}
    log({k: v for k, v in LOG["corpus"].items() if k != "heldout_list"})

    stage("tokenizer")
    tok = train_tokenizer([t for _, t in train_files])
    LOG["tokenizer_vs_tiktoken_heldout"] = tiktoken_check(tok, [t for _, t in held_files])
    log("tiktoken check:", {k: v for k, v in LOG["tokenizer_vs_tiktoken_heldout"].items() if k != "examples"})
    tests = [{"text": s, "ids": tok.encode(s, add_special_tokens=False).ids} for s in TOK_TESTS]
    common.write_json(os.path.join(args.out, "tok_tests.json"), tests)

    stage("tokenize")
    eos = common.special_id("[EOS]")
    file_ids = [e.ids for e in tok.encode_batch([t for _, t in train_files + site_files], add_special_tokens=False)]
    code_tokens = sum(len(x) + 1 for x in file_ids)
    rng = random.Random(7)
    rng.shuffle(chats)
    chat_ids, chat_tokens = [], 0
    cap = code_tokens // 3  # chat at most ~25% of all tokens
    for e in tok.encode_batch([common.chat_text(u, a) for u, a in chats], add_special_tokens=False):
        if chat_tokens + len(e.ids) + 1 > cap:
            break
        chat_ids.append(e.ids)
        chat_tokens += len(e.ids) + 1
    docs = file_ids + chat_ids
    rng.shuffle(docs)
    stream = to_stream(docs, eos)
    held_ids = [e.ids for e in tok.encode_batch([t for _, t in held_files], add_special_tokens=False)]
    held_stream = to_stream(held_ids, eos)
    LOG["tokens"] = {"train": len(stream), "train_code": code_tokens, "train_chat": chat_tokens,
                     "chat_docs": len(chat_ids), "heldout": len(held_stream),
                     "bytes_per_token_train_code": round((LOG["corpus"]["train_chars"] + sum(len(t) for _, t in site_files))
                                                         / max(code_tokens, 1), 3)}
    log(LOG["tokens"])

    stage("model")
    model, conf, tried = build_model(common.target_config(), dev)
    LOG["model_options"] = tried
    n_params = sum(p.numel() for p in model.parameters())
    LOG["parameters"] = n_params
    log("params", n_params, tried)
    balancer = LoadTracker(model, conf.num_experts if hasattr(conf, "num_experts") else 16)

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and "embed_tokens" not in name else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(4321)
    B, L = args.batch, args.seq

    def batch():
        starts = torch.randint(0, len(stream) - L - 1, (B,), generator=gen)
        w = torch.stack([stream[s:s + L + 1] for s in starts.tolist()]).to(dev, non_blocking=True).long()
        return w[:, :-1], w[:, 1:]

    def lr_at(step, total):
        warm = max(1, int(0.04 * total))
        if step < warm:
            return args.lr * (step + 1) / warm
        p = (step - warm) / max(1, total - warm)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))

    def train_step(step, total):
        for gparam in opt.param_groups:
            gparam["lr"] = lr_at(step, total)
        x, y = batch()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=x, use_cache=False).logits
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        imb = balancer.update()
        return loss, gn, imb

    stage("train")
    model.train()
    curve, recent = [], []
    total = args.steps if args.steps else 10 ** 9
    step = 0
    t_meas = None
    while step < total:
        if step == 3:
            torch.cuda.synchronize()
            t_meas = time.time()
        if step == 13 and not args.steps:
            torch.cuda.synchronize()
            per = (time.time() - t_meas) / 10
            budget = args.train_seconds
            if args.deadline:  # leave ~40 s for saving, held-out eval, reload check and samples
                budget = min(budget, args.deadline - (time.time() - T0) - 40)
            LOG["train_budget_seconds"] = round(budget, 1)
            total = max(20, int(budget / per) + 13)
            LOG["step_seconds_measured"] = per
            log(f"step time {per:.3f}s -> {total} steps")
        loss, gn, imb = train_step(step, total if total < 10 ** 9 else 2000)
        recent = (recent + [float(loss)])[-25:]
        if step % 25 == 0 or step == total - 1:
            curve.append({"step": step, "loss": round(float(loss), 4), "grad_norm": round(float(gn), 3),
                          "lr": lr_at(step, total), "max_load_over_mean": imb and round(imb, 2),
                          "t": round(time.time() - T0, 1)})
            log(curve[-1])
        step += 1
    LOG["steps"] = total
    LOG["tokens_seen"] = total * B * L
    LOG["loss_curve"] = curve
    LOG["final_train_loss_last25_mean"] = sum(recent) / len(recent)

    stage("save")
    round_to_bf16(model)
    model.eval()
    listing = save_target(model, tok, os.path.join(args.out, "target"))
    LOG["saved_tensors"] = len(listing)
    with open(os.path.join(args.out, "stage1_log.json"), "w") as f:
        json.dump(LOG, f, indent=1)

    stage("eval")
    try:
        with torch.no_grad():
            losses = []
            for _ in range(8):
                x, y = batch()
                lg = model(input_ids=x, use_cache=False).logits.float()
                losses.append(float(F.cross_entropy(lg.view(-1, lg.shape[-1]), y.reshape(-1))))
        LOG["final_train_loss_bf16_weights_8batches"] = sum(losses) / len(losses)
        nll, cnt = heldout_nll(model, held_stream, L, dev)
        LOG["heldout"] = {"nll": nll, "ppl": math.exp(nll), "tokens": cnt, "seq_len": L,
                          "bytes": LOG["corpus"]["heldout_chars"]}
        log("held-out", LOG["heldout"], "train", LOG["final_train_loss_bf16_weights_8batches"])
    except Exception as e:  # noqa: BLE001
        LOG["eval_error"] = f"{type(e).__name__}: {e}"
        log(LOG["eval_error"])
    try:  # the saved checkpoint reloads through transformers' Moonshot mapping
        from transformers import KimiLinearForCausalLM

        m2, info = KimiLinearForCausalLM.from_pretrained(os.path.join(args.out, "target"), dtype=torch.float32,
                                                         output_loading_info=True)
        m2.to(dev).eval()
        x, _ = batch()
        with torch.no_grad():
            a = model(input_ids=x[:4, :200], use_cache=False).logits
            b = m2(input_ids=x[:4, :200], use_cache=False).logits
        LOG["reload_check"] = {"loading_info": {k: [str(v) for v in vals] for k, vals in info.items() if vals},
                               "max_abs_logit_diff": float((a - b).abs().max())}
        log("reload", LOG["reload_check"])
        del m2
    except Exception as e:  # noqa: BLE001
        LOG["reload_error"] = f"{type(e).__name__}: {e}"
        log(LOG["reload_error"])
    try:
        samples = []
        prompts = ["def ", "import ", "class Stack:\n    \"\"\"A simple stack.\"\"\"\n\n    def push(self, item):",
                   common.chat_text("Write a Python function `is_prime` that returns True if n is prime.")]
        for p in prompts:
            ids = torch.tensor([tok.encode(p, add_special_tokens=False).ids], device=dev)
            with torch.no_grad():
                g = model.generate(ids, max_new_tokens=80, do_sample=False, use_cache=True)
            new = g[0, ids.shape[1]:].tolist()
            with torch.no_grad():  # cached greedy == uncached argmax?
                lg = model(input_ids=g[:, :-1], use_cache=False).logits[0, ids.shape[1] - 1:]
            agree = float((lg.argmax(-1) == g[0, ids.shape[1]:]).float().mean())
            samples.append({"prompt": p, "ids": new, "text": tok.decode(new, skip_special_tokens=False),
                            "uncached_argmax_agreement": agree})
            log(repr(p), "->", repr(samples[-1]["text"]), agree)
        LOG["samples"] = samples
    except Exception as e:  # noqa: BLE001
        LOG["sample_error"] = f"{type(e).__name__}: {e}"
        log(LOG["sample_error"])
    LOG["total_seconds"] = round(time.time() - T0, 1)
    with open(os.path.join(args.out, "stage1_log.json"), "w") as f:
        json.dump(LOG, f, indent=1)
    log("done")


if __name__ == "__main__":
    main()
