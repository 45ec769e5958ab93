#!/usr/bin/env python3
"""Writes safetensors fixtures with the reference implementation.

Run on a machine with the Python `torch` and `safetensors` packages (the GPU
machine); commit what it writes. refit's unit test
SafetensorsFixtures.ReferenceWrittenFilesLoad (src/checkpoint/checkpoint_test.cc)
then reads every checkpoint here and compares it with its sidecar.

    scripts/make_safetensors_fixtures.py [OUT_DIR]
        OUT_DIR defaults to tests/fixtures/safetensors/reference

For each checkpoint NAME (a file, or the directory `sharded`) it writes a
sidecar NAME.json:
    {"checkpoint": "NAME.safetensors", "writer": "...",
     "metadata": {...},              # single files: the __metadata__ written
     "tensors": [{"name", "dtype" (safetensors name), "shape", "nbytes",
                  "xxh64" (of the tensor's bytes, seed 0, 16 hex digits)}],
     "expect_error": "..."}          # only for files refit must refuse
The hashes are computed here from the torch tensors (not from the files), so
the test checks the file against what was meant to be in it.
"""

import json
import os
import struct
import sys

M64 = (1 << 64) - 1
P1 = 0x9E3779B185EBCA87
P2 = 0xC2B2AE3D27D4EB4F
P3 = 0x165667B19E3779F9
P4 = 0x85EBCA77C2B2AE63
P5 = 0x27D4EB2F165667C5


def _rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & M64


def _round(acc, lane):
    acc = (acc + lane * P2) & M64
    return (_rotl(acc, 31) * P1) & M64


def _merge(h, v):
    h ^= _round(0, v)
    return (h * P1 + P4) & M64


def xxh64(data, seed=0):
    """XXH64 of `data` (bytes), written from the xxHash specification; the
    C++ side uses libxxhash. Uses the `xxhash` package when it is installed."""
    try:
        import xxhash  # type: ignore

        return xxhash.xxh64_intdigest(data, seed)
    except ImportError:
        pass
    n = len(data)
    i = 0
    if n >= 32:
        v1 = (seed + P1 + P2) & M64
        v2 = (seed + P2) & M64
        v3 = seed & M64
        v4 = (seed - P1) & M64
        while i + 32 <= n:
            a, b, c, d = struct.unpack_from("<4Q", data, i)
            v1, v2, v3, v4 = _round(v1, a), _round(v2, b), _round(v3, c), _round(v4, d)
            i += 32
        h = (_rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)) & M64
        for v in (v1, v2, v3, v4):
            h = _merge(h, v)
    else:
        h = (seed + P5) & M64
    h = (h + n) & M64
    while i + 8 <= n:
        (k,) = struct.unpack_from("<Q", data, i)
        h ^= _round(0, k)
        h = (_rotl(h, 27) * P1 + P4) & M64
        i += 8
    if i + 4 <= n:
        (k,) = struct.unpack_from("<I", data, i)
        h ^= (k * P1) & M64
        h = (_rotl(h, 23) * P2 + P3) & M64
        i += 4
    while i < n:
        h ^= (data[i] * P5) & M64
        h = (_rotl(h, 11) * P1) & M64
        i += 1
    h ^= h >> 33
    h = (h * P2) & M64
    h ^= h >> 29
    h = (h * P3) & M64
    h ^= h >> 32
    return h


def xxh64_hex(data):
    return "%016x" % xxh64(bytes(data))


# safetensors dtype name -> torch dtype attribute name.
ST_TO_TORCH = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "I32": "int32", "I64": "int64",
    "F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "U16": "uint16",
}


def tensor_bytes(t):
    """The tensor's bytes in C order (what safetensors stores)."""
    import torch

    flat = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
    try:
        return flat.numpy().tobytes()
    except Exception:  # torch without numpy
        return bytes(flat.tolist())


def st_dtype(t):
    import torch

    for name, attr in ST_TO_TORCH.items():
        if getattr(torch, attr, None) == t.dtype:
            return name
    raise ValueError("no safetensors name for %s" % t.dtype)


def describe(tensors):
    return [{"name": name, "dtype": st_dtype(t), "shape": list(t.shape),
             "nbytes": len(tensor_bytes(t)), "xxh64": xxh64_hex(tensor_bytes(t))}
            for name, t in sorted(tensors.items())]


def make_tensors(torch):
    g = torch.Generator().manual_seed(1234)

    def floats(shape, dtype):
        return torch.randn(shape, generator=g, dtype=torch.float32).to(dtype)

    def ints(shape, dtype, lo, hi):
        return torch.randint(lo, hi, shape, generator=g, dtype=torch.int64).to(dtype)

    dtypes = {
        "bool.2d": ints((3, 5), torch.bool, 0, 2),
        "uint8.1d": ints((7,), torch.uint8, 0, 256),
        "int8.2d": ints((2, 3), torch.int8, -128, 128),
        "int16.1d": ints((5,), torch.int16, -30000, 30000),
        "int32.2d": ints((3, 3), torch.int32, -2**31, 2**31 - 1),
        "int64.1d": ints((3,), torch.int64, -2**62, 2**62),
        "float16.2d": floats((4, 3), torch.float16),
        "bfloat16.3d": floats((2, 3, 5), torch.bfloat16),
        "bfloat16.odd": floats((3,), torch.bfloat16),
        "float32.2d": floats((8, 4), torch.float32),
        "float64.1d": floats((5,), torch.float64),
    }
    for attr in ("float8_e4m3fn", "float8_e5m2"):
        if hasattr(torch, attr):
            dtypes[attr + ".2d"] = floats((4, 5), getattr(torch, attr))
    edge = {
        "scalar.float32": torch.tensor(3.5, dtype=torch.float32),
        "scalar.int64": torch.tensor(-7, dtype=torch.int64),
        "scalar.bool": torch.tensor(True),
        "empty.bfloat16": torch.zeros((0,), dtype=torch.bfloat16),
        "empty.float32.3d": torch.zeros((3, 0, 2), dtype=torch.float32),
        "special.float32": torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0], dtype=torch.float32),
    }
    sharded = {
        "model.embed_tokens.weight": floats((16, 4), torch.bfloat16),
        "model.layers.0.input_layernorm.weight": floats((4,), torch.float32),
        "model.layers.0.self_attn.q_proj.weight": floats((4, 4), torch.bfloat16),
        "model.layers.0.self_attn.o_proj.weight": floats((4, 4), torch.bfloat16),
        "model.norm.weight": floats((4,), torch.float32),
        "lm_head.weight": floats((16, 4), torch.bfloat16),
    }
    return dtypes, edge, sharded


def main():
    import torch
    import safetensors
    from safetensors.torch import save_file

    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "safetensors", "reference")
    os.makedirs(out, exist_ok=True)
    writer = "safetensors %s, torch %s (scripts/make_safetensors_fixtures.py)" % (
        safetensors.__version__, torch.__version__)
    dtypes, edge, sharded = make_tensors(torch)

    def sidecar(name, tensors, metadata=None, expect_error=None):
        side = {"checkpoint": name, "writer": writer}
        if expect_error is not None:
            side["expect_error"] = expect_error
        else:
            side["tensors"] = describe(tensors)
            if metadata is not None:
                side["metadata"] = metadata
        base = name[:-len(".safetensors")] if name.endswith(".safetensors") else name
        with open(os.path.join(out, base + ".json"), "w") as f:
            json.dump(side, f, indent=1, sort_keys=True)
            f.write("\n")

    meta = {"format": "pt", "source": "make_safetensors_fixtures.py"}
    save_file(dtypes, os.path.join(out, "dtypes.safetensors"), metadata=meta)
    sidecar("dtypes.safetensors", dtypes, meta)
    save_file(edge, os.path.join(out, "edge.safetensors"))
    sidecar("edge.safetensors", edge, {})

    # A sharded checkpoint laid out as transformers' save_pretrained does.
    shard_dir = os.path.join(out, "sharded")
    os.makedirs(shard_dir, exist_ok=True)
    names = list(sharded)
    parts = [names[:3], names[3:]]
    weight_map = {}
    for i, part in enumerate(parts):
        fname = "model-%05d-of-%05d.safetensors" % (i + 1, len(parts))
        save_file({n: sharded[n] for n in part}, os.path.join(shard_dir, fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in part})
    total = sum(len(tensor_bytes(t)) for t in sharded.values())
    with open(os.path.join(shard_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)
        f.write("\n")
    sidecar("sharded", sharded)

    # A dtype of the format that refit lacks: refit must refuse it by name.
    if hasattr(torch, "uint16"):
        try:
            u16 = {"w": torch.tensor([1, 2, 3, 65535], dtype=torch.int64).to(torch.uint16)}
            save_file(u16, os.path.join(out, "unsupported_u16.safetensors"))
            sidecar("unsupported_u16.safetensors", u16,
                    expect_error="tensor 'w': dtype 'U16' is not supported by refit")
        except Exception as e:  # older torch/safetensors without uint16 support
            print("skipping unsupported_u16: %s" % e)

    print("wrote fixtures to %s with %s" % (os.path.normpath(out), writer))


if __name__ == "__main__":
    main()
