#!/usr/bin/env python3
"""Packs a BF16 safetensors checkpoint into int8 blocks (npz) and back, to carry stage 1's target
to a fresh device machine for stage 2: the repository plus the BF16 target (38 MB) exceed the
64 MiB a device call carries, the pack is about 21 MB.

  transfer_pack.py pack   model.safetensors target.npz
  transfer_pack.py unpack target.npz        model.safetensors

Pack: every BF16 tensor whose size is a multiple of 32 is cut into blocks of 32 values, each
stored as int8 q = round(x / d) (numpy's round: halves to even) with d = max|x| / 127 as fp16;
other tensors (F32, and BF16 of other sizes) are stored byte for byte. Unpack: x = q * d rounded
to the nearest BF16 (ties to even), written as safetensors with the original names, dtypes and
shapes. Lossy by design, like Ember's own Q8_0 (relative RMS error about 0.5%): a drafter trained
against the unpacked target learns a Q8_0-like copy of the target, which is what Ember runs.
Inputs and outputs are files only; needs numpy (safetensors I/O: assemble_drafter.py's).
"""

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from assemble_drafter import read_st, write_st  # noqa: E402


def pack(src, dst):
    arrays, meta = {}, {}
    for name, (dtype, shape, raw) in read_st(src).items():
        meta[name] = [dtype, shape]
        if dtype == "BF16" and len(raw) // 2 % 32 == 0:
            x = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(-1, 32)
            d = np.abs(x).max(1) / 127.0
            arrays[name + ".q"] = np.round(x / np.where(d == 0, 1, d)[:, None]).astype(np.int8)
            arrays[name + ".d"] = d.astype(np.float16)
        else:
            arrays[name + ".raw"] = np.frombuffer(raw, np.uint8)
    arrays["__meta__"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    np.savez(dst, **arrays)


def unpack(src, dst):
    z = np.load(src)
    meta, out = json.loads(bytes(z["__meta__"]).decode()), {}
    for name, (dtype, shape) in meta.items():
        if name + ".q" in z:
            x = z[name + ".q"].astype(np.float32) * z[name + ".d"].astype(np.float32)[:, None]
            u = x.reshape(-1).view(np.uint32)
            bf16 = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
            out[name] = (dtype, shape, bf16.tobytes())
        else:
            out[name] = (dtype, shape, z[name + ".raw"].tobytes())
    write_st(dst, out)


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("pack", "unpack"):
        sys.exit(__doc__)
    {"pack": pack, "unpack": unpack}[sys.argv[1]](sys.argv[2], sys.argv[3])
