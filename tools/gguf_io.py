"""tools/gguf_io.py: GGUF files read and written by the Python tools (standard library only).

read_gguf keeps each key-value pair's raw bytes (so a writer can copy them unchanged) beside its
decoded value (scalars, strings, and arrays as lists), the tensor infos, and each tensor's bytes
(to the next tensor's offset, padding included). write_gguf writes a whole file next to the
target and renames it into place, so a failed write never leaves half a file. Errors are
GGUFError with the byte offset where the file went wrong.
"""
import os
import struct

SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
TYPE_F32, TYPE_F16, TYPE_Q8_0, TYPE_I64, TYPE_BF16 = 0, 1, 8, 27, 30
BYTES_PER_32 = {TYPE_F32: 128, TYPE_F16: 64, TYPE_Q8_0: 34, TYPE_I64: 256, TYPE_BF16: 64}


class GGUFError(Exception):
    pass


def tensor_bytes(t):
    """The bytes a tensor's values take, or None for a type this module does not size."""
    n = 1
    for d in t["dims"]:
        n *= d
    per32 = BYTES_PER_32.get(t["type"])
    return None if per32 is None else (n * per32 + 31) // 32


class Reader:
    def __init__(self, data):
        self.d, self.at = data, 0

    def take(self, n):
        b = self.d[self.at:self.at + n]
        if len(b) != n:
            raise GGUFError("the file ends early (at byte %d)" % self.at)
        self.at += n
        return b

    def unpack(self, fmt):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self):
        return self.take(self.unpack("<Q")).decode("utf-8")

    def value(self, t):
        if t == STRING:
            return self.string()
        if t == ARRAY:
            et, n = self.unpack("<I"), self.unpack("<Q")
            if et in SCALAR:  # one unpack for the whole array
                size = struct.calcsize(SCALAR[et])
                if n > (len(self.d) - self.at) // size:
                    raise GGUFError("an array of %d values runs past the end (at byte %d)" % (n, self.at))
                return list(struct.unpack("<%d%s" % (n, SCALAR[et][1]), self.take(n * size)))
            return [self.value(et) for _ in range(n)]
        if t in SCALAR:
            return self.unpack(SCALAR[t])
        raise GGUFError("unknown value type %d at byte %d" % (t, self.at))


def read_gguf(path):
    """(version, [(key, raw bytes)], {key: value}, [tensor info with "raw"], alignment)."""
    with open(path, "rb") as f:
        data = f.read()
    r = Reader(data)
    if r.take(4) != b"GGUF":
        raise GGUFError("%s is not a GGUF file" % path)
    version, n_tensors, n_kv = r.unpack("<I"), r.unpack("<Q"), r.unpack("<Q")
    kvs, values = [], {}
    for _ in range(n_kv):
        start = r.at
        key = r.string()
        values[key] = r.value(r.unpack("<I"))
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
    offs = sorted(t["offset"] for t in tensors)
    by_off = dict(zip(offs, offs[1:] + [len(data) - base]))
    for t in tensors:
        t["raw"] = data[base + t["offset"]:base + by_off[t["offset"]]]
        need = tensor_bytes(t)
        if base + t["offset"] > len(data) or (need is not None and len(t["raw"]) < need):
            raise GGUFError("tensor %s (%s bytes at offset %d) runs past the end of the file"
                            % (t["name"], need, base + t["offset"]))
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
