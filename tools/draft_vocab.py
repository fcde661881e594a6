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

GGUF_TYPE_I64 = 27
SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
DRAFT_ROWS = ("output.weight", "markov_w2.weight")


class Reader:
    def __init__(self, data):
        self.d, self.at = data, 0

    def take(self, n):
        b = self.d[self.at:self.at + n]
        if len(b) != n:
            raise SystemExit("draft_vocab: the GGUF file ends early (at byte %d)" % self.at)
        self.at += n
        return b

    def unpack(self, fmt):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self):
        return self.take(self.unpack("<Q")).decode("utf-8")

    def skip_value(self, t):
        if t == STRING:
            self.string()
        elif t == ARRAY:
            et, n = self.unpack("<I"), self.unpack("<Q")
            for _ in range(n):
                self.skip_value(et)
        elif t in SCALAR:
            self.take(struct.calcsize(SCALAR[t]))
        else:
            raise SystemExit("draft_vocab: unknown GGUF value type %d at byte %d" % (t, self.at))

    def value(self, t):
        if t == STRING:
            return self.string()
        if t in SCALAR:
            return self.unpack(SCALAR[t])
        self.skip_value(t)
        return None


def read_gguf(path):
    """Header KVs (raw bytes kept, scalars decoded), tensor infos and the data section."""
    with open(path, "rb") as f:
        data = f.read()
    r = Reader(data)
    if r.take(4) != b"GGUF":
        raise SystemExit("draft_vocab: %s is not a GGUF file" % path)
    version, n_tensors, n_kv = r.unpack("<I"), r.unpack("<Q"), r.unpack("<Q")
    kvs, values = [], {}
    for _ in range(n_kv):
        start = r.at
        key = r.string()
        values[key] = r.value(r.unpack("<I"))  # arrays are skipped (None)
        kvs.append((key, data[start:r.at]))
    tensors = []
    for _ in range(n_tensors):
        name = r.string()
        nd = r.unpack("<I")
        dims = [r.unpack("<Q") for _ in range(nd)]
        ttype, off = r.unpack("<I"), r.unpack("<Q")
        tensors.append({"name": name, "dims": dims, "type": ttype, "offset": off})
    align = values.get("general.alignment", 32)
    base = (r.at + align - 1) // align * align
    ends = sorted(t["offset"] for t in tensors)[1:] + [len(data) - base]
    by_off = {o: e for o, e in zip(sorted(t["offset"] for t in tensors), ends)}
    for t in tensors:  # a tensor's bytes run to the next one's offset (padding included, trimmed below)
        t["raw"] = data[base + t["offset"]:base + by_off[t["offset"]]]
    return version, kvs, values, tensors, align


def write_gguf(path, version, kvs, tensors, align):
    def pad(n):
        return (align - n % align) % align

    head = bytearray(b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs)))
    for _, raw in kvs:
        head += raw
    off = 0
    for t in tensors:
        name = t["name"].encode()
        head += struct.pack("<Q", len(name)) + name + struct.pack("<I", len(t["dims"]))
        head += b"".join(struct.pack("<Q", d) for d in t["dims"]) + struct.pack("<IQ", t["type"], off)
        off += len(t["raw"]) + pad(len(t["raw"]))
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(head + b"\0" * pad(len(head)))
        for t in tensors:
            f.write(t["raw"] + b"\0" * pad(len(t["raw"])))
    os.replace(tmp, path)  # nothing half-written is left at path


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
    tensors.append({"name": "d2t", "dims": [len(keep)], "type": GGUF_TYPE_I64,
                    "raw": b"".join(struct.pack("<q", i) for i in keep)})
    write_gguf(a.output, version, kvs, tensors, align)
    print("draft_vocab: %s: %d of %d tokens kept (%.2f%% of the corpus's %d tokens), written to %s"
          % (a.drafter, len(keep), vocab, 100 * covered, sum(counts.values()), a.output), file=sys.stderr)


if __name__ == "__main__":
    main()
