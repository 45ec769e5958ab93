#!/usr/bin/env python3
"""Loads the safetensors files refit wrote with the reference implementation.

Run on a machine with the Python `torch` and `safetensors` packages:

    scripts/check_safetensors_load.py [DIR]
        DIR defaults to tests/fixtures/safetensors/refit_written

Every sidecar DIR/NAME.json (format: scripts/make_safetensors_fixtures.py)
names a checkpoint refit wrote (a file, or a directory with
model.safetensors.index.json). Each one is opened with
safetensors.safe_open (and, for files, safetensors.torch.load_file too) and
every tensor's name, dtype, shape, byte count and bytes (xxh64) is compared
with the sidecar, as is the file's __metadata__. Prints one line per
checkpoint; exit status 1 if anything differs or fails to load.

`--selftest` only checks this script's xxh64 against known values (no torch).
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_safetensors_fixtures import ST_TO_TORCH, tensor_bytes, xxh64, xxh64_hex  # noqa: E402


def selftest():
    # Reference values of XXH64 with seed 0.
    known = {b"": 0xEF46DB3751D8E999, b"a": 0xD24EC4F1A98C6E5B, b"abc": 0x44BC2CF5AD770999}
    for data, want in known.items():
        got = xxh64(data)
        if got != want:
            print("xxh64(%r) = %016x, expected %016x" % (data, got, want))
            return 1
    print("xxh64 selftest passed")
    return 0


def compare(name, t, want, problems):
    if str(t.dtype) != "torch." + ST_TO_TORCH[want["dtype"]]:
        problems.append("%s: dtype %s, expected %s" % (name, t.dtype, want["dtype"]))
    if list(t.shape) != want["shape"]:
        problems.append("%s: shape %s, expected %s" % (name, list(t.shape), want["shape"]))
    data = tensor_bytes(t)
    if len(data) != want["nbytes"]:
        problems.append("%s: %d bytes, expected %d" % (name, len(data), want["nbytes"]))
    elif xxh64_hex(data) != want["xxh64"]:
        problems.append("%s: bytes differ (xxh64 %s, expected %s)" % (name, xxh64_hex(data), want["xxh64"]))


def check(sidecar_path):
    from safetensors import safe_open
    from safetensors.torch import load_file

    with open(sidecar_path) as f:
        side = json.load(f)
    path = os.path.join(os.path.dirname(sidecar_path), side["checkpoint"])
    wanted = {t["name"]: t for t in side["tensors"]}
    problems = []
    if os.path.isdir(path):
        with open(os.path.join(path, "model.safetensors.index.json")) as f:
            weight_map = json.load(f)["weight_map"]
        files = sorted(set(weight_map.values()))
    else:
        weight_map = None
        files = [None]
    seen = set()
    for fname in files:
        fpath = path if fname is None else os.path.join(path, fname)
        with safe_open(fpath, framework="pt", device="cpu") as f:
            keys = list(f.keys())
            if fname is None and "metadata" in side and (f.metadata() or {}) != side["metadata"]:
                problems.append("metadata %s, expected %s" % (f.metadata(), side["metadata"]))
            for k in keys:
                seen.add(k)
                if weight_map is not None and weight_map.get(k) != fname:
                    problems.append("%s is in %s, index says %s" % (k, fname, weight_map.get(k)))
                if k not in wanted:
                    problems.append("%s: in the file, not in the sidecar" % k)
                    continue
                compare(k, f.get_tensor(k), wanted[k], problems)
        if fname is None:
            loaded = load_file(fpath)
            for k, t in loaded.items():
                if k in wanted:
                    compare("load_file " + k, t, wanted[k], problems)
    for k in wanted:
        if k not in seen:
            problems.append("%s: in the sidecar, not in the checkpoint" % k)
    return problems


def main():
    if "--selftest" in sys.argv:
        return selftest()
    if selftest() != 0:
        return 1
    import safetensors
    import torch

    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    root = args[0] if args else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "safetensors", "refit_written")
    sidecars = sorted(os.path.join(root, n) for n in os.listdir(root) if n.endswith(".json"))
    if not sidecars:
        print("no sidecars (*.json) in %s" % root)
        return 1
    print("safetensors %s, torch %s" % (safetensors.__version__, torch.__version__))
    failed = 0
    for s in sidecars:
        try:
            problems = check(s)
        except Exception as e:  # a file the reference implementation refuses
            problems = ["failed to load: %r" % e]
        if problems:
            failed += 1
            print("FAIL %s" % s)
            for p in problems:
                print("  " + p)
        else:
            n = len(json.load(open(s))["tensors"])
            print("ok   %s (%d tensors)" % (s, n))
    print("%d of %d checkpoints load with the reference implementation" % (len(sidecars) - failed, len(sidecars)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
