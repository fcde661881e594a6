#!/usr/bin/env python3
"""Completes the stage-2 drafter into the DeepSpec layout: adds the frozen copies of the target's
embed_tokens / lm_head (stage 2 leaves them out so the checkpoint fits the device's 16 MiB
per-file return limit; they are bit-identical BF16 copies of the target's tables).

Inputs:  --core DIR (stage 2's drafter/: config.json, model_core.safetensors)
         --target DIR (stage 1's target/, or target_from_gguf.py's: model.safetensors)
Outputs: --out DIR: config.json (copied) and model.safetensors (BF16, 42 tensors).
Pure Python (json + struct): no torch or safetensors package needed.
"""

import argparse
import json
import os
import shutil
import struct


def read_st(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        base = 8 + n
        out = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            a, b = info["data_offsets"]
            f.seek(base + a)
            out[name] = (info["dtype"], info["shape"], f.read(b - a))
    return out


def write_st(path, tensors):
    header, off = {"__metadata__": {"format": "pt"}}, 0
    names = sorted(tensors)
    for name in names:
        dtype, shape, raw = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * (-len(hj) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for name in names:
            f.write(tensors[name][2])


def f32_to_bf16(raw):
    """Rounds F32 to BF16, nearest with ties to even (torch's .bfloat16(); no NaNs in weights)."""
    n = len(raw) // 4
    u = struct.unpack("<%dI" % n, raw)
    return struct.pack("<%dH" % n, *((x + 0x7FFF + ((x >> 16) & 1)) >> 16 for x in u))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--core", required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    core = read_st(os.path.join(a.core, "model_core.safetensors"))
    tgt = read_st(os.path.join(a.target, "model.safetensors"))
    for src, dst in (("model.embed_tokens.weight", "embed_tokens.weight"), ("lm_head.weight", "lm_head.weight")):
        dtype, shape, raw = tgt[src]
        if dtype == "F32":  # a target rebuilt from its GGUF (target_from_gguf.py)
            dtype, raw = "BF16", f32_to_bf16(raw)
        if dtype != "BF16":
            raise SystemExit(f"{src} is {dtype}, expected BF16 or F32")
        core[dst] = (dtype, shape, raw)
    os.makedirs(a.out, exist_ok=True)
    write_st(os.path.join(a.out, "model.safetensors"), core)
    shutil.copy(os.path.join(a.core, "config.json"), os.path.join(a.out, "config.json"))
    print(f"{len(core)} tensors -> {a.out}")


if __name__ == "__main__":
    main()
