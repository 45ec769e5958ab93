"""The PyTorch path that `--quantize fp8-block128` is measured against (issue 20).

Peers quantize in Python after the transfer: for each 2-D weight the engine
holds as FP8, a block quantization written in PyTorch from the format
(docs/DESIGN.md "FP8 block quantization"). This script times that path on
the GPU for a preset's quantized weights (the default selection: every
linear weight but embeddings, lm_head, norms and the router), beside the
one-copy floor of the same bf16 bytes (one device-to-device copy), and
prints one JSON line:

  {"model", "layers", "tensors", "bf16_bytes", "floor_ms", "torch_ms", "torch_over_floor"}

Usage (on the GPU machine): python3 bench/fp8_torch_path.py llama3-8b -1
                            python3 bench/fp8_torch_path.py qwen3-30b-a3b 24

The preset dimensions are those of src/model/presets.cc; the weights are
random bf16 (the time does not depend on the values).
"""
import json
import sys

import torch

PRESETS = {
    "llama3-8b": dict(hidden=4096, heads=32, kv=8, head_dim=128, inter=14336, layers=32, experts=0, moe_inter=0),
    "qwen3-30b-a3b": dict(hidden=2048, heads=32, kv=4, head_dim=128, inter=0, layers=48, experts=128,
                          moe_inter=768),
}


def quantized_shapes(name, layers):
    p = PRESETS[name]
    layers = p["layers"] if layers < 0 else layers
    h, hd = p["hidden"], p["head_dim"]
    shapes = []
    for _ in range(layers):
        shapes += [(p["heads"] * hd, h), (p["kv"] * hd, h), (p["kv"] * hd, h), (h, p["heads"] * hd)]
        if p["experts"]:
            for _ in range(p["experts"]):
                shapes += [(p["moe_inter"], h), (p["moe_inter"], h), (h, p["moe_inter"])]
        else:
            shapes += [(p["inter"], h), (p["inter"], h), (h, p["inter"])]
    return layers, shapes


def quantize_block128(w):
    """The format, in PyTorch: codes (float8_e4m3fn, w's shape) and scales (fp32 per 128x128 block)."""
    rows, cols = w.shape
    pr, pc = -(-rows // 128) * 128, -(-cols // 128) * 128
    x = w.float()
    if (pr, pc) != (rows, cols):
        x = torch.nn.functional.pad(x, (0, pc - cols, 0, pr - rows))
    blocks = x.view(pr // 128, 128, pc // 128, 128)
    amax = blocks.abs().amax(dim=(1, 3))
    scale = torch.clamp(amax, min=1e-12) / 448.0
    q = (blocks / scale[:, None, :, None]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q.view(pr, pc)[:rows, :cols].contiguous(), scale


def timed_ms(fn, rounds=5):
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def main():
    name, layers = sys.argv[1], int(sys.argv[2])
    layers, shapes = quantized_shapes(name, layers)
    # The weights are views of one flat buffer, which the floor copies whole:
    # the peak is two copies of the bf16 bytes, not three (qwen3-30b-a3b's 24
    # layers then fit an 80 GB H100).
    numels = [s[0] * s[1] for s in shapes]
    flat = torch.randn(sum(numels), dtype=torch.bfloat16, device="cuda")
    weights = [v.view(s) for v, s in zip(torch.split(flat, numels), shapes)]
    total = flat.numel() * 2
    dst = torch.empty_like(flat)
    floor_ms = timed_ms(lambda: dst.copy_(flat))
    del dst
    torch_ms = timed_ms(lambda: [quantize_block128(w) for w in weights])
    print(json.dumps({"model": name, "layers": layers, "tensors": len(weights), "bf16_bytes": total,
                      "floor_ms": floor_ms, "torch_ms": torch_ms, "torch_over_floor": torch_ms / floor_ms}))


if __name__ == "__main__":
    main()
