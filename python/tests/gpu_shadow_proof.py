"""Shadow weights through the Python binding (issue 21), for the GPU machine
(with the module from bench/python_gpu.sh prepare on PYTHONPATH): a trainer
process refits bf16 tensors into an engine with shadow=True (staged, over
cuda_ipc; `--device cpu`: host tensors over shm, a smoke run); at each
on_flip the served arena (weights()) holds exactly the trainer's version and
the arena served before still holds the version before it. (The failed
refit case runs on the CPU: failure_test.py.)

Catches: weights() handing out the landing arena; a flip before the copies
finished (the device copy not waited for); the old arena written before the
next refit; weight_memory_bytes not counting both arenas. Prints
"SUMMARY: PASS|FAIL: ..." last; exit status 0 only on PASS.
"""
import argparse
import subprocess
import sys

import torch

import refit

SHAPES = {"model.embed_tokens.weight": (4096, 1024), "model.layers.0.mlp.down_proj.weight": (1024, 3072),
          "model.norm.weight": (1024,)}
VERSIONS = (1, 2, 3)


def version_of(name, shape, v, device):
    """Tensor `name` of version v: seeded by (v, the name's position)."""
    g = torch.Generator(device="cpu").manual_seed(1000 * v + list(SHAPES).index(name))
    return torch.randn(shape, generator=g, dtype=torch.float32).to(torch.bfloat16).to(device)


def run_trainer(args):
    held = {n: torch.zeros(s, dtype=torch.bfloat16, device=args.device) for n, s in SHAPES.items()}
    with refit.Trainer(args.address, held, transport=args.transport, bucket_size="8MiB") as trainer:
        for v in VERSIONS:
            for n, p in held.items():
                p.copy_(version_of(n, p.shape, v, args.device))
            trainer.refit(v)
    return 0


def run_proof(args):
    coordinator = refit.Coordinator(1, 1, setup_timeout=60, refit_timeout=60)
    trainer = subprocess.Popen([sys.executable, __file__, "--role", "trainer", "--address", coordinator.address,
                                "--device", args.device, "--transport", args.transport])
    failures, flips, served_before = [], [], {}

    def on_flip(version):
        got = {n: torch.from_dlpack(view) for n, view in engine.weights().items()}
        for n, tensor in got.items():
            if not torch.equal(tensor, version_of(n, SHAPES[n], version, args.device)):
                failures.append(f"version {version}: served '{n}' differs from the trainer's")
        for n, tensor in served_before.items():  # the arena served before: untouched by this refit
            if not torch.equal(tensor, version_of(n, SHAPES[n], version - 1, args.device)):
                failures.append(f"version {version}: the arena served before lost version {version - 1}")
        served_before.clear()
        served_before.update(got)

    engine = refit.Engine(coordinator, [(n, torch.bfloat16, s) for n, s in SHAPES.items()], transport=args.transport,
                          device=args.device, bucket_size="8MiB", shadow=True, on_flip=on_flip)
    with engine:
        while (v := engine.next()) is not None:
            flips.append(v)
        need = 2 * sum(torch.Size(s).numel() * 2 for s in SHAPES.values())
        if engine.weight_memory_bytes < need:
            failures.append(f"weight_memory_bytes {engine.weight_memory_bytes} < both arenas {need}")
        if not engine.weights_complete or engine.weight_version != VERSIONS[-1]:
            failures.append(f"at the end: version {engine.weight_version}, complete {engine.weights_complete}")
    if trainer.wait(timeout=60) != 0:
        failures.append(f"the trainer process exited {trainer.returncode}")
    report = coordinator.wait(30)
    if flips != list(VERSIONS):
        failures.append(f"flips {flips}, expected {list(VERSIONS)}")
    failures += [report["error"]] if "error" in report else []
    where = torch.cuda.get_device_name() if args.device == "cuda" else "the CPU"
    print("SUMMARY: " + (f"PASS: {len(VERSIONS)} shadow refits on {where}" if not failures
                          else "FAIL: " + "; ".join(failures[:5])))
    return 0 if not failures else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["proof", "trainer"], default="proof")
    parser.add_argument("--address")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--transport")
    args = parser.parse_args()
    args.transport = args.transport or ("cuda_ipc" if args.device == "cuda" else "shm")
    return run_trainer(args) if args.role == "trainer" else run_proof(args)


if __name__ == "__main__":
    sys.exit(main())
