"""GPU proof of bf16 trainers into FP8 engines through the Python binding (issue 20).

Hugging Face transformers models built from small configs (gpu_transformers_proof.py's
build_model: a Llama-style dense model and a Qwen3-MoE-style model, bfloat16 on CUDA device 0).

  trainer process  registers its parameters with refit.Trainer(quantize="fp8-block128"),
                   then per version: one AdamW step (the parameters change in place),
                   refit(v), and saves the bf16 parameters it sent. Stacked expert
                   parameters ([E, R, C], transformers 5) are registered per expert, as
                   "<name>.<e>.weight" views of the parameter, the way FP8 checkpoints
                   store experts (one 2-D weight per expert).
  engine process   declares the same (name, dtype, shape) specs with quantize=
                   "fp8-block128" (refit.quantized_specs: codes and scales in place of
                   each selected weight) and after each version saves what it holds:
                   staged: each view copied in load_fn (torch.from_dlpack);
                   direct: the views of refit's weight arena (cuda_ipc writes there).

Passes when, for every version, each FP8 weight's codes and scales equal a reference
quantization written in PyTorch from the format (docs/DESIGN.md "FP8 block
quantization": amax per 128x128 block in fp32, s = max(amax, 1e-12) / 448, codes =
e4m3fn(W / s) rounded to nearest even, saturating at 448) bit for bit, and every other
weight equals the trainer's bf16 bit for bit; as controls, some weights are quantized and
the codes change between versions.

Usage: python3 gpu_fp8_proof.py [--models llama,qwen3_moe] [--modes staged,direct]
Exit status: 0 PASS, 1 FAIL, 77 skipped (no torch, transformers or CUDA device, or refit
built without CUDA), with the reason printed.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_transformers_proof as base  # noqa: E402

VERSIONS = [1, 2, 3]
BUCKET = 256 << 10
QUANTIZE = "fp8-block128"


def entries(model):
    """(name, tensor) as refit sees them: stacked experts as one 2-D weight per expert."""
    out = []
    for name, p in model.named_parameters():
        if p.dim() == 3 and ".experts." in name + ".":
            out += [(f"{name}.{e}.weight", p.data[e]) for e in range(p.shape[0])]
        else:
            out.append((name, p.data))
    return out


def run_trainer(args):
    import torch
    import refit
    model = base.build_model(args.model, seed=1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tensors = entries(model)
    with refit.Trainer(args.address, tensors, quantize=QUANTIZE, transport="cuda_ipc", mode=args.mode,
                       bucket_size=BUCKET, setup_timeout=180, refit_timeout=120) as trainer:
        for v in VERSIONS:
            model.train()
            generator = torch.Generator().manual_seed(100 + v)
            batch = torch.randint(0, model.config.vocab_size, (4, 32), generator=generator).cuda()
            loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            trainer.refit(v)
            base.save(os.path.join(args.out, f"trainer_v{v}.pt"), {n: t.detach().cpu().clone() for n, t in tensors})


def run_engine(args):
    import torch
    import refit
    model = base.build_model(args.model, seed=2)
    specs = [(n, t.dtype, tuple(t.shape)) for n, t in entries(model)]
    held = {}

    def load(items):
        for name, tensor in items:
            held[name] = tensor.clone()  # a view into the staging slot: copy now

    engine = refit.Engine(args.address, specs, quantize=QUANTIZE, transport="cuda_ipc", device="cuda", gpu=0,
                          mode=args.mode, bucket_size=BUCKET, setup_timeout=180, refit_timeout=120)
    with engine:
        while True:
            version = engine.next(load, convert=torch.from_dlpack) if args.mode == "staged" else engine.next()
            if version is None:
                break
            if args.mode == "direct":
                held = engine.weights(convert=torch.from_dlpack)
            base.save(os.path.join(args.out, f"engine_v{version}.pt"), {n: t.cpu().clone() for n, t in held.items()})


def reference(w):
    """The format in PyTorch, on the GPU: (codes as uint8, scales fp32)."""
    import torch
    rows, cols = w.shape
    pr, pc = -(-rows // 128) * 128, -(-cols // 128) * 128
    x = torch.nn.functional.pad(w.cuda().float(), (0, pc - cols, 0, pr - rows))
    blocks = x.view(pr // 128, 128, pc // 128, 128)
    amax = torch.clamp(blocks.abs().amax(dim=(1, 3)), min=1e-12)
    # A tensor divisor: PyTorch divides by a Python scalar on the GPU as a
    # product with its reciprocal (one bit lost: scales an ulp off, seen on
    # an H100 in session 22), and the format names an IEEE division.
    scale = amax / torch.full_like(amax, 448.0)
    q = (blocks / scale[:, None, :, None]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q.view(pr, pc)[:rows, :cols].contiguous().view(torch.uint8).cpu(), scale.cpu()


def raw(t):
    import torch
    return t.contiguous().view(torch.uint8)


def prove(model, mode, out):
    import torch
    ok, lines, report = base.run_roles(__file__, model, mode, out)
    if not ok:
        return False, lines
    load = lambda name: torch.load(os.path.join(out, name), weights_only=True)
    previous = None
    for v in VERSIONS:
        sent, held = load(f"trainer_v{v}.pt"), load(f"engine_v{v}.pt")
        wrong, quantized, copied = [], 0, 0
        for name, w in sent.items():
            scale_name = name[:-len(".weight")] + ".weight_scale_inv" if name.endswith(".weight") else None
            if scale_name in held:
                codes, scales = reference(w)
                quantized += 1
                if not torch.equal(raw(held[name]), codes) or not torch.equal(raw(held[scale_name]), raw(scales)):
                    wrong.append(name)
            else:
                copied += 1
                if name not in held or not torch.equal(raw(held[name]), raw(w)):
                    wrong.append(name)
        first = next(n for n in sent if n[:-len(".weight")] + ".weight_scale_inv" in held)
        moved = previous is None or not torch.equal(raw(held[first]), previous)
        previous = raw(held[first])
        good = not wrong and quantized > 0 and moved
        ok = ok and good
        lines.append(f"  v{v}: {quantized} FP8 weights (codes and scales) and {copied} copies bit-exact="
                     f"{quantized + copied - len(wrong)}/{quantized + copied}, codes moved={moved}, "
                     f"refit bytes {report.get('bytes_per_refit', 0)}: {'ok' if good else 'MISMATCH'}")
        if wrong:
            lines.append(f"    differing: {', '.join(wrong[:8])}{' ...' if len(wrong) > 8 else ''}")
    return ok, lines


def main():
    args = base.parse_args("staged,direct")
    if args.role == "trainer":
        return run_trainer(args)
    if args.role == "engine":
        return run_engine(args)
    base.check_requirements()
    import torch
    import transformers
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.cuda.get_device_name(0)}",
          flush=True)
    return base.run_cases("gpu_fp8", args, prove, [])


if __name__ == "__main__":
    sys.exit(main() or 0)
