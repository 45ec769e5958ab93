"""Shadow weights on a GPU through the Python binding (issue 21), for the GPU
machine (with the module from bench/python_gpu.sh prepare on PYTHONPATH): a
trainer thread refits bf16 CUDA tensors into an engine with shadow=True,
staged over cuda_ipc; at each on_flip the served arena (weights()) holds
exactly the trainer's version and the arena served before still holds the
version before it. (The failed-refit case runs on the CPU: failure_test.py.)

Catches: weights() handing out the landing arena; a flip before the copies
finished (the device copy not waited for); the old arena written before the
next refit; weight_memory_bytes not counting both arenas. Prints
"SUMMARY: PASS|FAIL: ..." last; exit status 0 only on PASS.
"""
import sys
import threading

import torch

import refit


def main():
    torch.manual_seed(0)
    shapes = {"model.embed_tokens.weight": (4096, 1024), "model.layers.0.mlp.down_proj.weight": (1024, 3072),
              "model.norm.weight": (1024,)}
    held = {n: torch.zeros(s, dtype=torch.bfloat16, device="cuda") for n, s in shapes.items()}
    versions = {}
    coordinator = refit.Coordinator(1, 1, setup_timeout=60, refit_timeout=60)
    errors, failures = [], []

    def trainer():
        try:
            with refit.Trainer(coordinator, held, transport="cuda_ipc", bucket_size="8MiB") as t:
                for v in (1, 2, 3):
                    for n, p in held.items():
                        p.copy_(torch.randn(p.shape, dtype=torch.float32, device="cuda").to(torch.bfloat16))
                    versions[v] = {n: p.clone() for n, p in held.items()}
                    torch.cuda.synchronize()
                    t.refit(v)
        except refit.Error as e:
            errors.append(f"trainer: {e}")

    served_before = {}

    def on_flip(version):
        got = {n: torch.from_dlpack(view) for n, view in engine.weights().items()}
        for n, tensor in got.items():
            if not torch.equal(tensor, versions[version][n]):
                failures.append(f"version {version}: served '{n}' differs from the trainer's")
        for n, tensor in served_before.items():  # the arena served before: untouched by this refit
            if version - 1 in versions and not torch.equal(tensor, versions[version - 1][n]):
                failures.append(f"version {version}: the arena served before lost version {version - 1}")
        served_before.clear()
        served_before.update(got)

    thread = threading.Thread(target=trainer)
    thread.start()
    engine = refit.Engine(coordinator, [(n, torch.bfloat16, s) for n, s in shapes.items()], transport="cuda_ipc",
                          device="cuda", bucket_size="8MiB", shadow=True, on_flip=on_flip)
    flips = []
    with engine:
        while (v := engine.next()) is not None:
            flips.append(v)
        need = 2 * sum(p.numel() * p.element_size() for p in held.values())
        if engine.weight_memory_bytes < need:
            failures.append(f"weight_memory_bytes {engine.weight_memory_bytes} < both arenas {need}")
        if not engine.weights_complete or engine.weight_version != 3:
            failures.append(f"at the end: version {engine.weight_version}, complete {engine.weights_complete}")
    thread.join(60)
    report = coordinator.wait(30)
    if flips != [1, 2, 3]:
        failures.append(f"flips {flips}, expected [1, 2, 3]")
    failures += errors + ([report["error"]] if "error" in report else [])
    print("SUMMARY: " + ("PASS: 3 shadow refits on " + torch.cuda.get_device_name() if not failures
                          else "FAIL: " + "; ".join(failures[:5])))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
