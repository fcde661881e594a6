#!/usr/bin/env python3
"""Writes the test data of tests/test_hftokenizer.c (run from this folder; the outputs are
committed, so the tests never run Python):

  gpt2/    a small hand-made GPT-2 style byte-level BPE tokenizer.json, tokenizer_config.json
           and config.json (vocab_size above the tokenizer's size, so there are pads);
  holes/   a tiktoken.model whose ranks have a gap, with its tokenizer_config.json and
           config.json;
  expected/<name>.json  what llama.cpp's converter writes for kimi_a (the fixture), gpt2 and
           holes: tokens, token types, merges and special ids. Computed here by a separate,
           plain transcription of the converter's rules (KimiLinearModel.set_vocab with
           QwenModel.bpe, TextModel.get_vocab_base, gguf-py SpecialVocab), written for this
           test without transformers, so the C code is checked against an independent
           implementation.
"""
import base64
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "..", "..", "fixtures", "kimi_a")


def byte_map():
    """GPT-2 bytes_to_unicode: printable Latin-1 stays, the rest moves to U+0100 onwards."""
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out, keep


BYTE_MAP, GPT2_ORDER = byte_map()


def text_of(bs):
    return "".join(BYTE_MAP[b] for b in bs)


def dump(path, obj):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1)
        f.write("\n")


# ---- the converter's rules, transcribed ------------------------------------------------

def split_lowest(ranks, token, limit):
    """Merge the lowest-ranked adjacent pair (leftmost first) while its rank is below limit."""
    parts = [bytes([b]) for b in token]
    while len(parts) > 1:
        best = None
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and (best is None or r < best[0]):
                best = (r, i)
        if best is None or best[0] >= limit:
            break
        i = best[1]
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return parts


def tiktoken_expected(folder, vocab_size, arch):
    ranks = {}
    with open(os.path.join(folder, "tiktoken.model"), "rb") as f:
        for line in f.read().splitlines():
            if line:
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
    tc = json.load(open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8"))
    cfg = json.load(open(os.path.join(folder, "config.json"), encoding="utf-8"))
    decoder = {int(k): v["content"] for k, v in tc["added_tokens_decoder"].items()}
    n_base = len(ranks)
    specials = {}
    for i in range(n_base, n_base + 256):
        specials[decoder.get(i, "<|reserved_token_%d|>" % i)] = i
    merges = []
    for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(tok) > 1:
            parts = split_lowest(ranks, tok, rank)
            if len(parts) == 2:
                merges.append(text_of(parts[0]) + " " + text_of(parts[1]))
    by_id = {r: text_of(t) for t, r in ranks.items()}
    by_id.update({i: s for s, i in specials.items()})
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:
            tokens.append("[PAD%d]" % i)
            types.append(5)
        else:
            tokens.append(by_id[i])
            types.append(3 if i in specials.values() else 1)
    ids = {t: cfg.get(t + "_token_id", -1) for t in ("bos", "eos", "unk", "pad", "mask")}
    if arch in ("kimi-linear", "kimi-k3"):
        ids["eos"] = specials[tc.get("eos_token", "[EOS]")]
    if arch == "kimi-k3" and "eos_token_id" in cfg:
        ids["eos"] = cfg["eos_token_id"]
    return {"tokens": tokens, "types": types, "merges": merges, "ids": ids,
            "pre": "kimi-k2", "chat_template": tc.get("chat_template")}


def looks_special(s):
    return (s in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or
            (s.startswith("<|") and s.endswith("|>")) or
            (s.startswith("<\uff5c") and s.endswith("\uff5c>")) or
            (s.startswith("<unused") and s.endswith(">")))


def tokenizer_json_expected(folder):
    tj = json.load(open(os.path.join(folder, "tokenizer.json"), encoding="utf-8"))
    tc = json.load(open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8"))
    cfg = json.load(open(os.path.join(folder, "config.json"), encoding="utf-8"))
    vocab = dict(tj["model"]["vocab"])
    added = {a["content"]: a for a in tj["added_tokens"]}
    for a in tj["added_tokens"]:
        vocab[a["content"]] = a["id"]
    by_id = {i: s for s, i in vocab.items()}
    tokens, types = [], []
    for i in range(cfg["vocab_size"]):
        if i not in by_id:
            tokens.append("[PAD%d]" % i)
            types.append(5)
            continue
        s = by_id[i]
        if s in added:
            if added[s]["special"] or looks_special(s):
                types.append(3)
            else:
                s = s.replace("\u2581", " ")
                types.append(4)
        else:
            types.append(1)
        tokens.append(s)
    merges = []
    for m in tj["model"]["merges"]:
        if isinstance(m, str):
            merges.append(m)
        else:
            merges.append(" ".join("".join(chr(ord(c) + 256) if c == " " else c for c in p)
                                   for p in m))
    ids = {}
    for t in ("bos", "eos", "unk", "sep", "pad", "cls", "mask"):
        v = tc.get(t + "_token")
        content = v if isinstance(v, str) else (v or {}).get("content")
        hit = next((a["id"] for a in tj["added_tokens"] if a["content"] == content), None)
        if hit is None:
            hit = cfg.get(t + "_token_id")
        ids[t] = hit if isinstance(hit, int) else -1
    return {"tokens": tokens, "types": types, "merges": merges, "ids": ids, "pre": "gpt-2",
            "chat_template": tc.get("chat_template"),
            "add_bos": tc.get("add_bos_token"), "add_eos": tc.get("add_eos_token")}


# ---- the GPT-2 style tokenizer ---------------------------------------------------------

GPT2_MERGES = [
    "Ġ t", "Ġ a", "h e", "i n", "r e", "o n", "Ġt he", "e r", "Ġ s", "a t", "Ġ w", "Ġ o",
    "e n", "Ġ c", "i t", "i s", "a n", "o r", "e s", "Ġ b", "e d", "Ġ f", "in g", "Ġ p",
    "o u", "Ġa n", "a l", "a r", "Ġt o", "Ġ m", "Ġo f", "Ġ in", "Ġ d", "Ġ h", "Ġan d",
    "Ċ Ċ",
]


def write_gpt2():
    folder = os.path.join(HERE, "gpt2")
    vocab = {}
    for b in GPT2_ORDER + [b for b in range(256) if b not in GPT2_ORDER]:
        vocab[BYTE_MAP[b]] = len(vocab)
    for m in GPT2_MERGES:
        vocab[m.replace(" ", "")] = len(vocab)
    eot = len(vocab)
    vocab["<|endoftext|>"] = eot
    added = [
        {"id": eot, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": True, "special": True},
        {"id": eot + 1, "content": "<|im_end|>", "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": False, "special": False},
        {"id": eot + 2, "content": "<custom>", "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": False, "special": False},
        {"id": eot + 3, "content": "\u2581pad\u2581me", "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": False, "special": False},
        {"id": eot + 5, "content": "<|mask|>", "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": False, "special": True},
    ]
    tj = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False,
                          "trim_offsets": True, "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True,
                           "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "",
                  "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                  "merges": GPT2_MERGES},
    }
    tc = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "bos_token": "<|endoftext|>",
        "eos_token": {"content": "<|endoftext|>", "lstrip": False, "normalized": True,
                      "rstrip": False, "single_word": False},
        "unk_token": "<|endoftext|>",
        "mask_token": "<|mask|>",
        "chat_template": "{% for m in messages %}{{ m['content'] }}<|im_end|>{% endfor %}",
        "model_max_length": 1024,
        "tokenizer_class": "GPT2Tokenizer",
    }
    cfg = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 300,
           "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 299}
    dump(os.path.join(folder, "tokenizer.json"), tj)
    dump(os.path.join(folder, "tokenizer_config.json"), tc)
    dump(os.path.join(folder, "config.json"), cfg)
    return folder


# ---- a tiktoken.model with a gap in its ranks -------------------------------------------

def write_holes():
    folder = os.path.join(HERE, "holes")
    os.makedirs(folder, exist_ok=True)
    lines = ["%s %d" % (base64.b64encode(bytes([b])).decode(), b) for b in range(256)]
    for tok, rank in ((b"ab", 256), (b"abc", 257), (b"cd", 258), (b" ab", 259), (b"abcd", 600)):
        lines.append("%s %d" % (base64.b64encode(tok).decode(), rank))
    with open(os.path.join(folder, "tiktoken.model"), "w") as f:
        f.write("\n".join(lines) + "\n")
    # 261 ranks: Kimi's specials take [261, 517)
    specials = {261: "[BOS]", 262: "[EOS]", 263: "<|im_end|>", 264: "<|im_user|>", 516: "[PAD]"}
    tc = {
        "added_tokens_decoder": {str(i): {"content": c, "lstrip": False, "normalized": False,
                                          "rstrip": False, "single_word": False, "special": True}
                                 for i, c in specials.items()},
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "pad_token": "[PAD]",
        "tokenizer_class": "TikTokenTokenizer",
    }
    cfg = {"model_type": "kimi_linear", "vocab_size": 640, "bos_token_id": 261,
           "eos_token_id": 263, "pad_token_id": 516}
    dump(os.path.join(folder, "tokenizer_config.json"), tc)
    dump(os.path.join(folder, "config.json"), cfg)
    return folder


def main():
    gpt2 = write_gpt2()
    holes = write_holes()
    exp = os.path.join(HERE, "expected")
    dump(os.path.join(exp, "kimi_a.json"), tiktoken_expected(FIXTURE, 512, "kimi-linear"))
    dump(os.path.join(exp, "holes.json"), tiktoken_expected(holes, 640, "kimi-linear"))
    dump(os.path.join(exp, "gpt2.json"), tokenizer_json_expected(gpt2))


if __name__ == "__main__":
    main()
