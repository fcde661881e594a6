#!/usr/bin/env python3
"""tools/draft_vocab.py: a DSpark/DFlash drafter with a reduced draft vocabulary, without
retraining (issue 19, item 2: a cheaper drafter).

The drafter's LM head (output.weight) and Markov up-projection (markov_w2.weight) have one row
per token it can propose, and each verified slot computes both over every row: with the
default pair's 8192 tokens that is most of a slot's cost. This keeps the rows of the M tokens
most frequent in a corpus (plus the target's end-of-generation tokens), and adds the d2t table
(draft row -> target id) that Ember's drafter reads (draft/dspark.c): the drafter then proposes
only kept tokens; every other token scores -inf. Nothing else changes, so a proposal among the
kept tokens is the same as before; speculative output stays exactly the target's (the target
verifies every draft).

Counts tokens with `ember tokenize` of the target's tokenizer over the corpus files (text, or
folders searched for *.py / *.md / *.txt files), keeps the M most frequent (ties: lower id),
and rewrites the drafter GGUF: tensor data copied byte for byte, the two heads' kept rows in
ascending target id, d2t as I64. Standard library only.

  python3 tools/draft_vocab.py --drafter D.gguf --target T.gguf --corpus DIR_OR_FILE... \\
      --keep 2048 -o OUT.gguf [--ember build/ember] [--max-bytes 8000000]
"""
import argparse
import collections
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_io  # noqa: E402
from gguf_io import TYPE_I64, GGUFError, write_gguf  # noqa: E402

DRAFT_ROWS = ("output.weight", "markov_w2.weight")


def read_gguf(path):
    try:
        return gguf_io.read_gguf(path)
    except (GGUFError, OSError, UnicodeDecodeError) as e:
        raise SystemExit("draft_vocab: %s: %s" % (path, e))


def corpus_files(paths, max_bytes):
    exts = (".py", ".md", ".txt")
    out, total = [], 0
    for p in paths:
        found = [p] if os.path.isfile(p) else sorted(
            os.path.join(d, f) for d, _, fs in os.walk(p) for f in fs if f.endswith(exts))
        for f in found:
            if total >= max_bytes:
                return out
            size = os.path.getsize(f)
            if size:
                out.append(f)
                total += size
    if not out:
        raise SystemExit("draft_vocab: no corpus files under %s" % ", ".join(paths))
    return out


def count_tokens(ember, target, files):
    counts = collections.Counter()
    with tempfile.TemporaryDirectory() as tmp:
        for i, f in enumerate(files):
            with open(f, "rb") as src:
                text = src.read().decode("utf-8", errors="ignore")
            if not text.strip():
                continue
            path = os.path.join(tmp, "c.txt")
            with open(path, "w", encoding="utf-8") as dst:
                dst.write(text)
            p = subprocess.run([ember, "tokenize", "-m", target, "-f", path], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
            if p.returncode != 0:
                raise SystemExit("draft_vocab: ember tokenize failed on %s: %s" % (f, p.stderr.decode(errors="replace")))
            ids = p.stdout.decode().strip()
            if ids:
                counts.update(int(x) for x in ids.split(","))
            print("\rdraft_vocab: tokenized %d/%d files, %d tokens" % (i + 1, len(files), sum(counts.values())),
                  end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return counts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--target", required=True, help="the target GGUF (its tokenizer counts the corpus)")
    ap.add_argument("--corpus", required=True, nargs="+")
    ap.add_argument("--keep", type=int, default=2048, help="draft vocabulary size (default 2048)")
    ap.add_argument("--max-bytes", type=int, default=8_000_000, help="corpus bytes to read at most")
    ap.add_argument("--ember", default=os.environ.get("EMBER_BIN", "build/ember"))
    ap.add_argument("-o", "--output", required=True)
    a = ap.parse_args()
    version, kvs, values, tensors, align = read_gguf(a.drafter)
    arch = values.get("general.architecture")
    vocab = values.get("%s.vocab_size" % arch)
    names = {t["name"]: t for t in tensors}
    if not vocab or any(n not in names for n in DRAFT_ROWS) or "d2t" in names:
        raise SystemExit("draft_vocab: %s is not a drafter with a full vocabulary (%s.vocab_size, %s, no d2t)"
                         % (a.drafter, arch, " and ".join(DRAFT_ROWS)))
    for n in DRAFT_ROWS:
        if names[n]["dims"][-1] != vocab or len(names[n]["dims"]) != 2:
            raise SystemExit("draft_vocab: %s has shape %s, not [*, %d]" % (n, names[n]["dims"], vocab))
    if not 1 <= a.keep < vocab:
        raise SystemExit("draft_vocab: --keep %d must be in [1, %d)" % (a.keep, vocab))
    _, _, tvalues, _, _ = read_gguf(a.target)
    special = sorted({tvalues.get(k) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")}
                     & set(range(vocab)))
    counts = count_tokens(a.ember, a.target, corpus_files(a.corpus, a.max_bytes))
    ranked = special + sorted((i for i in range(vocab) if i not in special), key=lambda i: (-counts.get(i, 0), i))
    keep = sorted(ranked[:a.keep])  # the end tokens first, then the most frequent; d2t ascending
    covered = sum(counts.get(i, 0) for i in keep) / max(1, sum(counts.values()))
    for n in DRAFT_ROWS:  # rows of vocab x row bytes, then under `align` bytes of padding
        t = names[n]
        nbytes = len(t["raw"]) - (len(t["raw"]) % vocab)
        row = nbytes // vocab
        t["raw"] = b"".join(t["raw"][i * row:(i + 1) * row] for i in keep)
        t["dims"] = [t["dims"][0], len(keep)]
    tensors.append({"name": "d2t", "dims": [len(keep)], "type": TYPE_I64,
                    "raw": b"".join(struct.pack("<q", i) for i in keep)})
    write_gguf(a.output, version, kvs, tensors, align)
    print("draft_vocab: %s: %d of %d tokens kept (%.2f%% of the corpus's %d tokens), written to %s"
          % (a.drafter, len(keep), vocab, 100 * covered, sum(counts.values()), a.output), file=sys.stderr)


if __name__ == "__main__":
    main()
