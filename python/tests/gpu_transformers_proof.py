"""GPU proof of the Python binding (issue 7, "Proof on real models").

Hugging Face transformers models built from small configs in code (random
init, no downloads): a Llama-style dense model (LlamaConfig) and a
Qwen3-MoE-style model (Qwen3MoeConfig, full-weight experts), both bfloat16 on
CUDA device 0. For each model and each mode:

  trainer process  builds the model with seed 1, registers its parameters
                   with refit.Trainer once, then per version: one AdamW step
                   on a fake batch (the parameters change in place), refit(v),
                   logits of a fixed probe batch
  engine process   builds the same architecture with seed 2 (different
                   weights: only the refit can make the two equal), then
                   staged: next(load_fn) copies each staging view into its
                           parameter (param.copy_(torch.from_dlpack(view)))
                   direct: the parameters adopt refit's weight arena
                           (param.data = torch.from_dlpack(view)); the trainer
                           writes straight into them (cuda_ipc)
                   copy:   staged, no load_fn: refit copies each tensor into the
                           registered parameter (one launch per dtype group)
                   and after each version computes the probe's logits

Passes when, for every version, the engine's logits and every parameter are
bit for bit the trainer's; as controls, the logits differ before the first
refit (different seeds) and between versions (the optimizer step moved the
weights), and the trainer's forward repeats bit for bit (deterministic
kernels, so a mismatch is refit's doing).

Usage: python3 gpu_transformers_proof.py [--models llama,qwen3_moe] [--modes staged,direct,copy]
Exit status: 0 PASS, 1 FAIL, 77 skipped (no torch, transformers or CUDA
device, or refit built without CUDA), with the reason printed.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

SKIPPED = 77
VERSIONS = [1, 2, 3]
BUCKET = 64 << 10  # small enough that embeddings span several buckets (chunked, reassembled)


def skip(reason):
    print(f"SKIP: {reason}", flush=True)
    sys.exit(SKIPPED)


def check_requirements():
    try:
        import torch
    except ImportError:
        skip("torch is not installed for " + sys.executable)
    try:
        import transformers  # noqa: F401
    except ImportError:
        skip("transformers is not installed for " + sys.executable)
    if not torch.cuda.is_available():
        skip("no CUDA device (torch.cuda.is_available() is False)")
    import refit
    if not refit.cuda_built():
        skip("refit was built without CUDA")
    cuda_ipc = {t.name: t for t in refit.transports()}["cuda_ipc"]
    if not cuda_ipc.available:
        skip("cuda_ipc cannot run here: " + cuda_ipc.reason)


def build_model(kind, seed):
    import torch
    import transformers
    torch.manual_seed(seed)
    common = dict(vocab_size=512, hidden_size=256, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
                  max_position_embeddings=128, tie_word_embeddings=False)
    if kind == "llama":
        config = transformers.LlamaConfig(intermediate_size=512, **common)
    elif kind == "qwen3_moe":
        config = transformers.Qwen3MoeConfig(intermediate_size=512, moe_intermediate_size=128, num_experts=8,
                                             num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[],
                                             norm_topk_prob=True, head_dim=32, **common)
    else:
        raise ValueError(kind)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation("eager")  # the reference loop: no atomics, deterministic
    return model.to(device="cuda", dtype=torch.bfloat16)


def probe_logits(model):
    import torch
    generator = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, model.config.vocab_size, (2, 24), generator=generator).cuda()
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    torch.cuda.synchronize()
    return logits.float().cpu()


def save(path, value):
    import torch
    torch.save(value, path + ".tmp")
    os.replace(path + ".tmp", path)


# ---- roles (child processes) ---------------------------------------------------

def run_trainer(args):
    import torch
    import refit
    torch.backends.cuda.matmul.allow_tf32 = False
    model = build_model(args.model, seed=1)
    params = dict(model.named_parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    save(os.path.join(args.out, "trainer_v0.pt"), {"logits": probe_logits(model)})
    mode = "direct" if args.mode == "direct" else "staged"
    with refit.Trainer(args.address, params, transport="cuda_ipc", mode=mode, bucket_size=BUCKET,
                       setup_timeout=180, refit_timeout=120) as trainer:
        for v in VERSIONS:
            model.train()
            generator = torch.Generator().manual_seed(100 + v)
            batch = torch.randint(0, model.config.vocab_size, (4, 32), generator=generator).cuda()
            loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
            optimizer.step()  # in place: the registered memory now holds version v
            optimizer.zero_grad(set_to_none=True)
            started = time.monotonic()
            trainer.refit(v)
            seconds = time.monotonic() - started
            logits = probe_logits(model)
            again = probe_logits(model)
            save(os.path.join(args.out, f"trainer_v{v}.pt"),
                 {"logits": logits, "deterministic": bool(torch.equal(logits, again)), "seconds": seconds,
                  "loss": float(loss), "params": {n: p.detach().cpu() for n, p in params.items()}})


def run_engine(args):
    import torch
    import refit
    torch.backends.cuda.matmul.allow_tf32 = False
    model = build_model(args.model, seed=2)  # NOT the trainer's weights
    params = dict(model.named_parameters())
    save(os.path.join(args.out, "engine_v0.pt"), {"logits": probe_logits(model)})
    loads = {"calls": 0, "tensors": 0}

    def load(items):  # staged: one call per dtype group of each aligned batch
        loads["calls"] += 1
        for name, tensor in items:
            params[name].data.copy_(tensor)  # a view into the staging slot: copy now, keep nothing
            loads["tensors"] += 1

    if args.mode == "staged":
        engine = refit.Engine(args.address, [(n, p.dtype, tuple(p.shape)) for n, p in params.items()],
                              transport="cuda_ipc", device="cuda", gpu=0, bucket_size=BUCKET,
                              setup_timeout=180, refit_timeout=120)
    elif args.mode == "copy":  # staged, no load_fn: refit copies each tensor into the parameter itself
        engine = refit.Engine(args.address, {n: p.detach() for n, p in params.items()}, transport="cuda_ipc",
                              bucket_size=BUCKET, setup_timeout=180, refit_timeout=120)
    else:
        engine = refit.Engine(args.address, {n: p.detach() for n, p in params.items()}, mode="direct",
                              transport="cuda_ipc", bucket_size=BUCKET, setup_timeout=180, refit_timeout=120)
        for name, tensor in engine.weights(convert=torch.from_dlpack).items():
            params[name].data = tensor  # the parameter now lives in refit's arena
    with engine:
        while True:
            if args.mode == "staged":
                version = engine.next(load, convert=torch.from_dlpack)
            else:
                version = engine.next()
            if version is None:
                break
            save(os.path.join(args.out, f"engine_v{version}.pt"),
                 {"logits": probe_logits(model), "loads": dict(loads), "posts": engine.posts,
                  "params": {n: p.detach().cpu() for n, p in params.items()}})


# ---- the proof (parent) ----------------------------------------------------------

def check_producers():
    """torch and cupy CUDA tensors read through DLPack as refit registers them."""
    import torch
    import refit
    want = ("bfloat16", (2, 3), "cuda:0")
    got = {"torch": refit.tensor_spec(torch.zeros(2, 3, dtype=torch.bfloat16, device="cuda"))}
    try:
        import cupy
        got["cupy"] = refit.tensor_spec(cupy.zeros((2, 3), dtype=cupy.float16))
        want_cupy = ("float16", (2, 3), "cuda:0")
    except ImportError:
        want_cupy = None
    ok = got["torch"] == want and (want_cupy is None or got["cupy"] == want_cupy)
    print(f"{'PASS' if ok else 'FAIL'} dlpack producers: {got}" + ("" if want_cupy else " (cupy not installed)"),
          flush=True)
    return ok


def bits(t):
    import torch
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def same_bits(a, b):
    import torch
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(bits(a), bits(b))


def run_roles(script, model, mode, out):
    """Starts a coordinator and `script --role engine` and `--role trainer` for one
    (model, mode) case, waits for them (480 s at most: a hang is killed and said so),
    and returns (ok, lines, report): ok when both exited 0 and the coordinator
    reported no error; lines say what failed, with the end of each failed process's
    log; report is the coordinator's."""
    import refit
    lines = []
    coordinator = refit.Coordinator(trainer_ranks=1, engine_ranks=1, refits=0, setup_timeout=180, refit_timeout=120)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    common = ["--model", model, "--mode", mode, "--out", out, "--address", coordinator.address]
    procs = {}
    for role in ("engine", "trainer"):
        with open(os.path.join(out, role + ".log"), "w") as log:  # a file, never a pipe that could fill
            procs[role] = subprocess.Popen([sys.executable, os.path.abspath(script), "--role", role] + common,
                                           env=env, stdout=log, stderr=subprocess.STDOUT)
    ok = True
    deadline = time.monotonic() + 480
    for role, p in procs.items():
        try:
            p.wait(timeout=max(1, deadline - time.monotonic()))
            killed = ""
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            killed = "[killed after 480 s: a hang]\n"
        with open(os.path.join(out, role + ".log")) as log:
            text = killed + log.read()
        if p.returncode != 0:
            ok = False
            lines.append(f"  {role} process exited {p.returncode}:\n" + "\n".join("    " + l for l in text.splitlines()[-40:]))
    try:
        report = coordinator.wait(60)
    except refit.DeadlineExceededError as e:
        report = {"error": str(e)}
    if "error" in report:
        ok = False
        lines.append(f"  coordinator: {report['error']}")
    return ok, lines, report


def prove(model, mode, out):
    """Runs one (model, mode) case; returns (ok, lines)."""
    import torch
    ok, lines, _ = run_roles(__file__, model, mode, out)
    if not ok:
        return False, lines

    load = lambda name: torch.load(os.path.join(out, name), weights_only=True)
    t0, e0 = load("trainer_v0.pt"), load("engine_v0.pt")
    if same_bits(t0["logits"], e0["logits"]):
        ok = False
        lines.append("  control failed: trainer and engine logits agree before any refit (seeds not different?)")
    previous = t0["logits"]
    for v in VERSIONS:
        t, e = load(f"trainer_v{v}.pt"), load(f"engine_v{v}.pt")
        logits_equal = same_bits(t["logits"], e["logits"])
        wrong = [n for n in t["params"] if n not in e["params"] or not same_bits(t["params"][n], e["params"][n])]
        moved = not same_bits(previous, t["logits"])
        previous = t["logits"]
        diff = (t["logits"] - e["logits"]).abs().max().item()
        status = "ok" if logits_equal and not wrong and moved and t["deterministic"] else "MISMATCH"
        ok = ok and status == "ok"
        extra = f" load_fn calls={e['loads']['calls']} posts={e['posts']}" if mode != "direct" else ""
        lines.append(f"  v{v}: logits bit-exact={logits_equal} (max |diff| {diff:.3g}), params bit-exact="
                     f"{len(t['params']) - len(wrong)}/{len(t['params'])}, weights moved={moved}, "
                     f"trainer deterministic={t['deterministic']}, refit {t['seconds'] * 1e3:.1f} ms, "
                     f"loss {t['loss']:.3f}{extra}: {status}")
        if wrong:
            lines.append(f"    differing parameters: {', '.join(wrong[:8])}{' ...' if len(wrong) > 8 else ''}")
    return ok, lines


def parse_args(default_modes):
    """The proofs' command line: --role/--model/--mode/--out/--address for a role
    process, --models/--modes for the parent."""
    parser = argparse.ArgumentParser(description=sys.modules["__main__"].__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["trainer", "engine"])
    parser.add_argument("--model", default="llama")
    parser.add_argument("--mode", default="staged")
    parser.add_argument("--out")
    parser.add_argument("--address")
    parser.add_argument("--models", default="llama,qwen3_moe")
    parser.add_argument("--modes", default=default_modes)
    return parser.parse_args()


def run_cases(proof, args, prove, results):
    """Runs prove(model, mode, out) for every --models x --modes case after the
    `results` already in, prints each case's lines, a JSON line of the cases and a
    SUMMARY line; returns the exit status (0 when every case passed)."""
    for model in args.models.split(","):
        for mode in args.modes.split(","):
            with tempfile.TemporaryDirectory(prefix=f"refit-{proof}-") as out:
                started = time.monotonic()
                ok, lines = prove(model, mode, out)
            print(f"{'PASS' if ok else 'FAIL'} {model} {mode} ({time.monotonic() - started:.0f} s)", flush=True)
            for line in lines:
                print(line, flush=True)
            results.append((model, mode, ok))
    failed = [f"{m}/{mode}" for m, mode, ok in results if not ok]
    print(json.dumps({"proof": proof, "cases": [{"model": m, "mode": mode, "pass": ok} for m, mode, ok in results]}))
    print(f"SUMMARY: {'PASS' if not failed else 'FAIL'}: {len(results) - len(failed)}/{len(results)} cases passed"
          + (f"; failed: {', '.join(failed)}" if failed else ""), flush=True)
    return 0 if not failed else 1


def main():
    args = parse_args("staged,direct,copy")
    if args.role == "trainer":
        return run_trainer(args)
    if args.role == "engine":
        return run_engine(args)

    check_requirements()
    import torch
    import transformers
    import refit
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, refit {refit.__version__}, "
          f"{torch.cuda.get_device_name(0)}", flush=True)
    return run_cases("gpu_transformers", args, prove, [("dlpack", "producers", check_producers())])


if __name__ == "__main__":
    sys.exit(main() or 0)
