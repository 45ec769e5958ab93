"""GPU proof of refit.adapters: vLLM and SGLang adapters refit Hugging Face models
bit for bit, and LoaderCapture replays a loader's copies or names why not (issue 21
items 4 and 5). The speed part (the loader at copy speed) is gpu_adapters_bench.py.

Two parts, each in processes of its own (the parent never touches the GPU):

  capture checks   LoaderCapture against one small loader per rule, with an
                   in-process stand-in for refit.Engine (FakeEngine): a plain
                   copying loader replays; a transposing, casting, scaling,
                   summing, .item()-reading, twice-copying, skipping, partial,
                   temporary-buffer, overlapping (tied), storage-swapping,
                   afterwards-modifying or invisibly-writing (a CUDA graph
                   replay) loader stays in loader mode naming why; a replaced
                   parameter is captured again; enabled=False never captures.
                   Values are checked after every refit where they must hold.
                   (`--role checks --device cpu --out DIR` runs them alone on
                   the CPU, a memset standing in for the graph replay.)
  adapters         for Llama (dense) and Qwen3-MoE (transformers, small configs,
                   gpu_transformers_proof.build_model) and each adapter (vLLM
                   worker extension, SGLang custom loader) with a copying loader
                   and a computing one (FusedModel(computing=True) casts through
                   float32): a trainer process registers the Hugging Face model's
                   checkpoint-named tensors (server_standin.checkpoint_tensors)
                   and refits versions 1..4 with an AdamW step before each; an
                   engine process serves a stand-in server (server_standin.py:
                   fused qkv / gate_up / stacked-expert parameters, the Hugging
                   Face forward reading views of them, seed 2) through the
                   adapter; before version 3 it re-allocates lm_head.weight.
                   Passes when, for every version, the stand-in's logits and every
                   checkpoint tensor are the trainer's bit for bit, the refit took
                   the expected path (copying: capture, replay, capture (the
                   re-allocation), replay, the loader not called on replays;
                   computing: capture then loader, the reason naming a tensor read
                   by aten::_to_copy), SGLang flushed its cache once per refit; as
                   controls the logits differ before the first refit and between
                   versions, and the trainer's forward repeats bit for bit.

Usage: python3 gpu_adapters_proof.py [--models llama,qwen3_moe] [--adapters vllm,sglang]
(bash bench/python_gpu.sh adapters runs it, then gpu_adapters_bench.py.)
Exit status: 0 PASS, 1 FAIL, 77 skipped (no torch, transformers or CUDA device, or
refit built without CUDA), with the reason printed. Last line "SUMMARY: PASS|FAIL: ...".
"""
import argparse
import ctypes
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_transformers_proof as base  # noqa: E402
from adapters_jobs import (TIMEOUTS, print_results, print_summary, publish, save_json, spawn,  # noqa: E402
                           wait_for, wait_procs)

VERSIONS = [1, 2, 3, 4]
REALLOCATE_BEFORE = 3       # the engine re-allocates lm_head.weight before this refit
BUCKET = 64 << 10           # small: many batches per refit, embeddings chunked
LOADERS = ("copying", "computing")
EXPECTED = {"copying": ["capture", "replay", "capture", "replay"],
            "computing": ["capture", "loader", "loader", "loader"]}


def jobs(args):
    return [(adapter, loader) for adapter in args.adapters.split(",") for loader in LOADERS]


# ---- capture checks (role "checks") ------------------------------------------------


class FakeEngine:
    """refit.Engine's staged surface in process, for LoaderCapture: next(load_fn) adds 1 to
    every source, then hands load_fn batches of 2 [(name, staged copy)] (fresh memory,
    poisoned after the call); set_targets(pairs) checks what refit's binding checks (every
    spec once, same dtype and bytes, C-contiguous); next() copies into the targets."""

    def __init__(self, sources):
        self.sources = sources
        self.specs = [(n, str(t.dtype).replace("torch.", ""), tuple(t.shape)) for n, t in sources]
        self.targets = None
        self.weight_version = 0
        self.last_only = ()  # Engine.last_only: () = the last refit moved every tensor

    def set_targets(self, pairs):
        pairs = list(pairs)
        want = {n: t for n, t in self.sources}
        names = [n for n, _ in pairs]
        if sorted(names) != sorted(want) or len(set(names)) != len(names):
            raise ValueError(f"set_targets: names {names} do not cover {sorted(want)} once each")
        for n, t in pairs:
            if t.dtype != want[n].dtype or t.numel() != want[n].numel() or not t.is_contiguous():
                raise ValueError(f"set_targets: '{n}' is {t.dtype} x {t.numel()}, contiguous={t.is_contiguous()}")
        self.targets = dict(pairs)

    def next(self, load_fn=None):
        import torch
        for _, t in self.sources:
            t.add_(1)
        if load_fn is None:
            if self.targets is None:
                raise RuntimeError("next() without load_fn before set_targets")
            for n, t in self.sources:
                self.targets[n].reshape(-1).copy_(t.reshape(-1))
        else:
            for i in range(0, len(self.sources), 2):
                staged = [(n, t.clone()) for n, t in self.sources[i:i + 2]]
                load_fn(staged)
                for _, t in staged:
                    t.fill_(float("nan"))  # the slot is recycled: a kept view reads garbage
        if self.sources[0][1].is_cuda:
            torch.cuda.synchronize()
        self.weight_version += 1
        return self.weight_version


def toy_model(device):
    """The model the capture checks load into: zero bf16 parameters (norm float32), their
    targets q/k/v rows of qkv, w (or its transpose wt), norm, and part and spare for the
    loaders that copy in part or twice."""
    import torch
    from torch import nn
    bf16 = torch.bfloat16

    class Toy(nn.Module):
        def __init__(self):
            super().__init__()
            zeros = lambda *shape, dtype=bf16: nn.Parameter(torch.zeros(*shape, dtype=dtype, device=device),
                                                            requires_grad=False)
            self.qkv, self.w, self.wt = zeros(6, 4), zeros(3, 4), zeros(4, 3)
            self.norm, self.part, self.spare = zeros(4, dtype=torch.float32), zeros(1, 4), zeros(3, 4)

    return Toy()


def check_sources(device, tied=False):
    """The trainer's tensors of the capture checks: q, k, v, w (bf16) and norm (float32)."""
    import torch
    bf16 = torch.bfloat16
    g = torch.Generator().manual_seed(7)
    out = [(n, torch.randn(*s, generator=g).to(device=device, dtype=bf16))
           for n, s in (("q", (2, 4)), ("k", (2, 4)), ("v", (2, 4)), ("w", (3, 4)))]
    out.append(("norm", torch.randn(4, generator=g).to(device=device)))
    if tied:  # v carries k's bytes (tied weights): one destination for both
        out[2] = ("v", out[1][1].clone())
    return out


# ---- the capture checks' loaders: plain(m, pairs, w=...) copies q, k, v and norm; w(m, t, keep) loads w ----


def plain(m, pairs, w=None, v_rows=4):
    keep = []
    for name, t in pairs:
        if name in ("q", "k"):
            m.qkv.data.narrow(0, 2 * "qk".index(name), 2).copy_(t)
        elif name == "v":
            m.qkv.data.narrow(0, v_rows, 2).copy_(t)
        elif name == "norm":
            m.norm.data.copy_(t)
        elif w is None:
            m.w.data.copy_(t)
        else:
            w(m, t, keep)


def item(m, t, keep):
    if t[0, 0].item() > 1e30:
        return
    m.w.data.copy_(t)


def hidden(m, t, keep):  # the copy, then a write no aten op shows: a CUDA graph replay, or memset on the host
    m.w.data.copy_(t)
    if m.w.is_cuda:
        m.graph.replay()
    else:
        ctypes.memset(m.w.data_ptr(), 0, 2)


def swap(m):
    import torch
    m.w.data = torch.zeros_like(m.w.data)


def temporary(m, t, keep):
    import torch
    tmp = torch.empty_like(t)
    tmp.copy_(t)
    keep.append(tmp)


def capture_cases():
    """{name: (loader(m, pairs), sources kwargs, expected reason fragment or None (replay))}."""
    # Each line: the mutation of LoaderCapture it catches.
    return {
        # Catches: a capture that never replays, or replays into the wrong places (values).
        "plain": (lambda m, p: plain(m, p), {}, None),
        # Catches: accepting a non-contiguous (transposed) source as a copy.
        "transposed": (lambda m, p: plain(m, p, w=lambda m, t, k: m.wt.data.copy_(t.t())), {},
                       "copied as a transposed or strided view"),
        # Catches: ignoring ops that read an incoming view (a cast).
        "cast": (lambda m, p: plain(m, p, w=lambda m, t, k: m.w.data.copy_(t.float())), {}, "read by aten::_to_copy"),
        # Catches: the same, for arithmetic (a scale, a sum).
        "scale": (lambda m, p: plain(m, p, w=lambda m, t, k: m.w.data.copy_(t * 2)), {}, "read by aten::mul"),
        "sum": (lambda m, p: plain(m, p, w=lambda m, t, k: m.w.data.copy_(t + t)), {}, "read by aten::add"),
        # Catches: value-dependent loaders (.item()) passing as copies.
        "item": (lambda m, p: plain(m, p, w=item), {}, "read by aten::_local_scalar_dense"),
        # Catches: a second copy of one source silently dropped (only one target registered).
        "twice": (lambda m, p: plain(m, p, w=lambda m, t, k: (m.w.data.copy_(t), m.spare.data.copy_(t))), {},
                  "copied twice"),
        # Catches: a tensor the loader skips getting no target (or a stale one).
        "skipped": (lambda m, p: plain(m, p, w=lambda m, t, k: None), {}, "not copied by the loader"),
        # Catches: a partial copy (a TP shard) registered as the whole tensor.
        "partial": (lambda m, p: plain(m, p, w=lambda m, t, k: m.part.data.copy_(t[:1])), {}, "copied in part"),
        # Catches: a destination outside the model (a temporary) accepted.
        "temporary": (lambda m, p: plain(m, p, w=temporary), {}, "not a parameter or buffer"),
        # Catches: the overlap check (tied weights: both land in one place, bytes equal).
        "overlap": (lambda m, p: plain(m, p, v_rows=2), {"tied": True}, "overlaps the destination"),
        # Catches: dropping the bytes check (a write the dispatch mode cannot see changed the destination).
        "hidden": (lambda m, p: plain(m, p, w=hidden), {}, "does not match its destination's bytes"),
        # Catches: a loader that swaps a parameter's storage after copying into it (replay into dead memory).
        "swapped": (lambda m, p: plain(m, p, w=lambda m, t, k: (m.w.data.copy_(t), swap(m))), {}, "re-allocated"),
        # Catches: writes into the model after the copy (the loader changes what it copied).
        "modified": (lambda m, p: plain(m, p, w=lambda m, t, k: (m.w.data.copy_(t), m.w.data.add_(1))), {},
                     "writes into 'w'"),
    }


def check_case(device, name, loader, kw, fragment):
    """(name, ok, line): three refits of one capture_cases() loader through LoaderCapture."""
    import torch
    from refit.adapters import LoaderCapture
    m = toy_model(device)
    if name == "hidden" and m.w.is_cuda:  # recorded before the capture: its replay runs no aten op
        m.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(m.graph):
            m.w.data.zero_()
    src = check_sources(device, **kw)
    engine = FakeEngine(src)
    capture = LoaderCapture(engine, m, lambda pairs, loader=loader, m=m: loader(m, pairs))
    values_ok = True
    for _ in range(3):
        capture.next()
        if name in ("plain", "cast"):  # loads that must hold the sources' values, replayed or not
            got = dict(q=m.qkv[0:2], k=m.qkv[2:4], v=m.qkv[4:6], w=m.w, norm=m.norm)
            values_ok &= all(torch.equal(got[n], t) for n, t in src)
        if name == "transposed":
            values_ok &= torch.equal(m.wt, dict(src)["w"].t())
    if fragment is None:
        ok = capture.history == ["capture", "replay", "replay"] and capture.mode == "replay" and values_ok
    else:
        ok = (capture.mode == "loader" and capture.history == ["capture", "loader", "loader"]
              and fragment in capture.reason and values_ok)
    return (name, ok, f"history={capture.history} mode={capture.mode} reason={capture.reason!r}")


def check_layout(device):
    """Catches: skipping the layout check (a replaced parameter keeps receiving the replay: stale value)."""
    import torch
    from torch import nn
    from refit.adapters import LoaderCapture
    m = toy_model(device)
    src = check_sources(device)
    capture = LoaderCapture(FakeEngine(src), m, lambda pairs: plain(m, pairs))
    values_ok = True
    for refit in range(1, 5):
        if refit == 3:
            m.w = nn.Parameter(m.w.detach().clone(), requires_grad=False)
        capture.next()
        values_ok &= torch.equal(m.w, dict(src)["w"])
    ok = capture.history == ["capture", "replay", "capture", "replay"] and values_ok
    return ("layout", ok, f"history={capture.history} values={values_ok}")


def check_disabled(device):
    """Catches: enabled=False capturing anyway."""
    from refit.adapters import LoaderCapture
    m = toy_model(device)
    capture = LoaderCapture(FakeEngine(check_sources(device)), m, lambda pairs: plain(m, pairs), enabled=False)
    for _ in range(2):
        capture.next()
    return ("disabled", capture.history == ["loader", "loader"], f"history={capture.history}")


def capture_checks(device):
    """[(name, ok, line)]: LoaderCapture against one loader per rule."""
    results = [check_case(device, name, loader, kw, fragment)
               for name, (loader, kw, fragment) in capture_cases().items()]
    return results + [check_layout(device), check_disabled(device)]


def run_checks(args):
    import torch
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda":
        print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}", flush=True)
    results = capture_checks(device)
    save_json(os.path.join(args.out, "checks.json"), [[n, ok, line] for n, ok, line in results])
    for name, ok, line in results:
        print(f"{'PASS' if ok else 'FAIL'} capture check {name}: {line}", flush=True)
    return 0 if all(ok for _, ok, _ in results) else 1


# ---- adapters (roles "trainer" and "engine") ----------------------------------------


def run_trainer(args):
    import torch
    import refit
    from server_standin import checkpoint_tensors
    torch.backends.cuda.matmul.allow_tf32 = False
    for j, (adapter, loader) in enumerate(jobs(args)):
        model = base.build_model(args.model, seed=1)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        tensors = checkpoint_tensors(model)  # views of the parameters: the optimizer updates them in place
        coordinator = refit.Coordinator(trainer_ranks=1, engine_ranks=1, **TIMEOUTS)
        base.save(os.path.join(args.out, f"job{j}_trainer_v0.pt"), {"logits": base.probe_logits(model)})
        publish(os.path.join(args.out, f"job{j}.addr"), coordinator.address)
        with refit.Trainer(coordinator, tensors, transport="cuda_ipc", bucket_size=BUCKET, **TIMEOUTS) as trainer:
            for v in VERSIONS:
                model.train()
                generator = torch.Generator().manual_seed(100 + v)
                batch = torch.randint(0, model.config.vocab_size, (4, 32), generator=generator).cuda()
                model(input_ids=batch, labels=batch).loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                trainer.refit(v)
                logits, again = base.probe_logits(model), base.probe_logits(model)
                base.save(os.path.join(args.out, f"job{j}_trainer_v{v}.pt"),
                          {"logits": logits, "deterministic": bool(torch.equal(logits, again)),
                           "params": {n: t.detach().cpu().clone() for n, t in tensors}})
        report = coordinator.wait(60)
        save_json(os.path.join(args.out, f"job{j}_report.json"), {"error": report.get("error")})


def run_engine(args):
    import torch
    from refit import adapters
    import server_standin as standin
    torch.backends.cuda.matmul.allow_tf32 = False
    options = dict(transport="cuda_ipc", bucket_size=BUCKET, **TIMEOUTS)
    for j, (adapter, loader) in enumerate(jobs(args)):
        address = wait_for(os.path.join(args.out, f"job{j}.addr"))
        hf = base.build_model(args.model, seed=2)  # NOT the trainer's weights
        specs = [(n, str(t.dtype), list(t.shape)) for n, t in standin.checkpoint_tensors(hf)]
        server = standin.FusedModel.from_hf(hf, computing=loader == "computing")
        base.save(os.path.join(args.out, f"job{j}_engine_v0.pt"), {"logits": base.probe_logits(server.hf)})
        sgl = None
        if adapter == "vllm":
            worker = standin.make_vllm_worker(server, adapters.VllmWorkerExtension)
            standin.collective_rpc(worker, "refit_join", args=(address, 0, specs), kwargs=options)
            step = lambda: standin.collective_rpc(worker, "refit_next")[0]
            status = lambda: standin.collective_rpc(worker, "refit_status")[0]
            close = lambda: standin.collective_rpc(worker, "refit_close")
        else:
            sgl = standin.SglangEngine(server, custom_weight_loader=[adapters.SGLANG_LOADER])
            driver = adapters.SglangRefit(sgl)
            driver.join(address, specs, rank=0, **options)

            def step():
                driver.next()  # flush_cache=True: SGLang flushes after the update
                rank = adapters.sglang_rank(server)
                return None if rank.ended else rank.version

            status = lambda: adapters.sglang_rank(server).status()
            close = driver.close
        refits = 0
        while True:
            if refits + 1 == REALLOCATE_BEFORE:
                server.reallocate("lm_head.weight")  # a layout change between refits
            calls = server.load_calls
            version = step()
            if version is None:
                break
            refits += 1
            base.save(os.path.join(args.out, f"job{j}_engine_v{version}.pt"),
                      {"logits": base.probe_logits(server.hf), "status": status(),
                       "load_calls": server.load_calls - calls, "flushes": -1 if sgl is None else sgl.flushes,
                       "params": {n: server.target(n).cpu().clone() for n, _, _ in specs}})
        close()


def prove_model(script, model, args, out):
    """One model: every adapter x loader job in one trainer and one engine process."""
    import torch
    procs = {role: spawn(script, ["--role", role, "--model", model, "--adapters", args.adapters], out, role)
             for role in ("engine", "trainer")}
    ok, lines = wait_procs(procs, out, 420)
    if not ok:
        return [(f"{model} processes", False, lines)]
    load = lambda name: torch.load(os.path.join(out, name), weights_only=True)
    results = []
    for j, (adapter, loader) in enumerate(jobs(args)):
        lines, good = [], True
        report = json.load(open(os.path.join(out, f"job{j}_report.json")))
        if report["error"]:
            good = False
            lines.append(f"  coordinator: {report['error']}")
        t0, e0 = load(f"job{j}_trainer_v0.pt"), load(f"job{j}_engine_v0.pt")
        if base.same_bits(t0["logits"], e0["logits"]):  # Catches: engine and trainer built alike (vacuous pass)
            good = False
            lines.append("  control failed: logits agree before any refit (seeds not different?)")
        previous = t0["logits"]
        for k, v in enumerate(VERSIONS):
            name = f"job{j}_engine_v{v}.pt"
            if not os.path.exists(os.path.join(out, name)):
                good = False
                lines.append(f"  v{v}: the engine never committed it")
                continue
            t, e = load(f"job{j}_trainer_v{v}.pt"), load(name)
            status = e["status"]
            # Catches: replay into the wrong places, a stale target after the re-allocation, wrong fused slices.
            logits_equal = base.same_bits(t["logits"], e["logits"])
            wrong = [n for n in t["params"]
                     if n not in e["params"] or not base.same_bits(t["params"][n], e["params"][n])]
            # Catches: a trainer whose weights did not change (a replay that copies nothing would pass).
            moved = not base.same_bits(previous, t["logits"])
            previous = t["logits"]
            # Catches: never replaying, never re-capturing after a layout change, replaying a computing loader.
            path_ok = status["history"] == EXPECTED[loader][:k + 1]
            # Catches: a "replay" that still calls the loader, or a loader mode that skips it.
            calls_ok = (e["load_calls"] == 0) == (status["history"][-1] == "replay")
            if loader == "computing":  # Catches: a fallback without its reason, or one not naming the tensor
                mode_ok = (status["mode"] == "loader" and status["reason"].startswith("'")
                           and "is read by aten::_to_copy" in status["reason"])
            else:
                mode_ok = status["mode"] == "replay" and status["reason"] == ""
            # Catches: SglangRefit.next not asking SGLang to flush its cache once per refit.
            flush_ok = adapter != "sglang" or e["flushes"] == k + 1
            fine = (logits_equal and not wrong and moved and t["deterministic"] and path_ok and calls_ok and mode_ok
                    and flush_ok)
            good = good and fine
            lines.append(f"  v{v}: logits bit-exact={logits_equal}, tensors bit-exact={len(t['params']) - len(wrong)}/"
                         f"{len(t['params'])}, moved={moved}, deterministic={t['deterministic']}, path="
                         f"{status['history'][-1]} (history ok={path_ok}), load_weights calls={e['load_calls']}, "
                         f"mode={status['mode']}" + (f", flushes={e['flushes']}" if adapter == "sglang" else "")
                         + f": {'ok' if fine else 'MISMATCH'}")
            if wrong:
                lines.append(f"    differing: {', '.join(wrong[:6])}{' ...' if len(wrong) > 6 else ''}")
            if status["reason"] and k == 0:
                lines.append(f"    reason: {status['reason']}")
        results.append((f"{model} {adapter} {loader}", good, lines))
    return results


# ---- the parent -----------------------------------------------------------------------


def prove_checks(out):
    """The capture checks in a process of their own; their log is printed as it is."""
    procs = {"checks": spawn(__file__, ["--role", "checks"], out, "checks")}
    ok, lines = wait_procs(procs, out, 120)
    checks = json.load(open(os.path.join(out, "checks.json"))) if ok else []
    with open(os.path.join(out, "checks.log")) as log:
        print(log.read(), end="", flush=True)
    return ("capture checks", ok and all(c[1] for c in checks), lines)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["checks", "trainer", "engine"])
    parser.add_argument("--out")
    parser.add_argument("--model", default="llama")
    parser.add_argument("--device", help="role processes: cpu or cuda (checks: default cuda when available)")
    parser.add_argument("--models", default="llama,qwen3_moe")
    parser.add_argument("--adapters", default="vllm,sglang")
    return parser.parse_args()


def main():
    args = parse_args()
    roles = {"checks": run_checks, "trainer": run_trainer, "engine": run_engine}
    if args.role:
        return roles[args.role](args)

    base.check_requirements()
    import torch
    import transformers
    import refit
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, refit {refit.__version__}", flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="refit-adapters-") as out:
        results.append(prove_checks(out))
        for model in args.models.split(","):
            started = time.monotonic()
            os.makedirs(os.path.join(out, model))
            case_results = prove_model(__file__, model, args, os.path.join(out, model))
            print(f"{model}: {time.monotonic() - started:.0f} s", flush=True)
            results += case_results
    print_results(results)
    return print_summary("gpu_adapters", results)


if __name__ == "__main__":
    sys.exit(main() or 0)
