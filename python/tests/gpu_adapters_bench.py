"""GPU speed bench of refit.adapters: the vLLM adapter's loader at copy speed through
LoaderCapture (issue 21 item 5). Its correctness proof is gpu_adapters_proof.py.

llama3-8b and qwen3-30b-a3b (24 layers, 9,435 tensors) shaped bf16 weights with the
real names and shapes, 1 GiB buckets, cuda_ipc, trainer and engine processes on one
GPU, refits 1..5:

  loader   the vLLM adapter calling the stand-in's load_weights every refit
           (server_standin.py)
  replay   the same adapter with LoaderCapture
  copy     refit's copy mode (Engine with the stand-in's (checkpoint name,
           target) pairs)

Each: the median of refits 2..5 (the trainer's RefitReport.seconds plus, for replay,
the engine's layout check before that refit) over one device copy of the same bytes
(dst.copy_(src) of a flat buffer, median of 5, its own process just before). The
engine's weights are zeroed before each case and checksummed against the trainer's
after it. A case passes when all five refits ran, the checksums agree, the job
reported no error and the adapter took the expected path (loader: the loader five
times; replay: capture, then replay four times; copy: no adapter).
Target: replay at most 10% slower than copy mode (printed, not part of PASS).

Usage: python3 gpu_adapters_bench.py [--benches llama3_8b,qwen3_30b_a3b]
(bash bench/python_gpu.sh adapters runs gpu_adapters_proof.py, then this.)
A smoke on the CPU (shm): bench_model(script, "tiny_moe", out, extra=["--device", "cpu"]).
Exit status: 0 PASS, 1 FAIL, 77 skipped (no torch, transformers or CUDA device, or
refit built without CUDA), with the reason printed. Last line "SUMMARY: PASS|FAIL: ...".
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_transformers_proof as base  # noqa: E402
from adapters_jobs import (TIMEOUTS, print_results, print_summary, publish, save_json, spawn,  # noqa: E402
                           wait_for, wait_procs)

BENCH_REFITS = [1, 2, 3, 4, 5]
BENCH_CASES = ("loader", "replay", "copy")
BENCH_BUCKET = 1 << 30


# ---- the roles "copy", "bench-trainer" and "bench-engine" -------------------------

BENCHES = {
    "llama3_8b": dict(vocab=128256, hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128, ffn=14336),
    "qwen3_30b_a3b": dict(vocab=151936, hidden=2048, layers=24, heads=32, kv_heads=4, head_dim=128, ffn=768,
                          experts=128),
    "tiny_moe": dict(vocab=512, hidden=256, layers=2, heads=8, kv_heads=4, head_dim=32, ffn=128, experts=8),  # a smoke
}


def bench_specs(bench):
    """[(checkpoint name, shape)] of the model, in checkpoint order (qwen3-30b-a3b: 24 of its 48 layers)."""
    c = BENCHES[bench]
    h, q, kv = c["hidden"], c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"]
    out = [("model.embed_tokens.weight", (c["vocab"], h))]
    for i in range(c["layers"]):
        p = f"model.layers.{i}."
        out += [(p + "self_attn.q_proj.weight", (q, h)), (p + "self_attn.k_proj.weight", (kv, h)),
                (p + "self_attn.v_proj.weight", (kv, h)), (p + "self_attn.o_proj.weight", (h, q))]
        if "experts" in c:
            out += [(p + "self_attn.q_norm.weight", (c["head_dim"],)),
                    (p + "self_attn.k_norm.weight", (c["head_dim"],)), (p + "mlp.gate.weight", (c["experts"], h))]
            for e in range(c["experts"]):
                out += [(p + f"mlp.experts.{e}.gate_proj.weight", (c["ffn"], h)),
                        (p + f"mlp.experts.{e}.up_proj.weight", (c["ffn"], h)),
                        (p + f"mlp.experts.{e}.down_proj.weight", (h, c["ffn"]))]
        else:
            out += [(p + "mlp.gate_proj.weight", (c["ffn"], h)), (p + "mlp.up_proj.weight", (c["ffn"], h)),
                    (p + "mlp.down_proj.weight", (h, c["ffn"]))]
        out += [(p + "input_layernorm.weight", (h,)), (p + "post_attention_layernorm.weight", (h,))]
    return out + [("model.norm.weight", (h,)), ("lm_head.weight", (c["vocab"], h))]


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def checksum(tensors):
    """Sum of the bf16 bit patterns as int16, in int64: equal bytes give equal sums. In chunks of
    2^27 elements: a sum into int64 first converts its input to int64 (8x the bytes)."""
    import torch
    total = 0
    for t in tensors:
        for chunk in t.reshape(-1).view(torch.int16).split(1 << 27):
            total += int(chunk.sum(dtype=torch.int64).item())
    return total


def bench_place(args):
    """(device, transport) of the bench roles: CUDA over cuda_ipc; --device cpu (a smoke) over shm."""
    device = args.device or "cuda"
    return device, "cuda_ipc" if device == "cuda" else "shm"


def synchronize(device):
    import torch
    if device == "cuda":
        torch.cuda.synchronize()


def run_copy(args):
    import torch
    device, _ = bench_place(args)
    total = sum(numel(s) for _, s in bench_specs(args.bench_model)) * 2
    src = torch.empty(total, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(5):
        synchronize(device)
        started = time.perf_counter()
        dst.copy_(src)
        synchronize(device)
        times.append(time.perf_counter() - started)
    save_json(os.path.join(args.out, "copy.json"),
              {"bytes": total, "seconds": times, "median_s": statistics.median(times)})


def run_bench_trainer(args):
    import torch
    import refit
    device, transport = bench_place(args)
    specs = bench_specs(args.bench_model)
    flat = torch.empty(sum(numel(s) for _, s in specs), dtype=torch.bfloat16, device=device)
    for chunk in flat.split(1 << 28):
        chunk.normal_()
    tensors, offset = [], 0
    for name, shape in specs:
        tensors.append((name, flat[offset:offset + numel(shape)].view(shape)))
        offset += numel(shape)
    sums = checksum([flat])
    for case in BENCH_CASES:
        coordinator = refit.Coordinator(trainer_ranks=1, engine_ranks=1, **TIMEOUTS)
        publish(os.path.join(args.out, f"{case}.addr"), coordinator.address)
        reports = []
        with refit.Trainer(coordinator, tensors, transport=transport, bucket_size=BENCH_BUCKET, **TIMEOUTS) as trainer:
            for v in BENCH_REFITS:
                synchronize(device)
                time.sleep(0.5)  # the engine is waiting inside next() (its layout check done and timed there)
                started = time.perf_counter()
                report = trainer.refit(v)
                reports.append({"seconds": report.seconds, "wall_s": time.perf_counter() - started})
        error = coordinator.wait(60).get("error")
        save_json(os.path.join(args.out, f"{case}_trainer.json"),
                  {"reports": reports, "checksum": sums, "error": error})


def run_bench_engine(args):
    import torch
    import refit
    from refit import adapters
    import server_standin as standin
    device, transport = bench_place(args)
    specs = bench_specs(args.bench_model)
    server = standin.FusedModel([(n, torch.bfloat16, s) for n, s in specs], device=device)
    options = dict(transport=transport, bucket_size=BENCH_BUCKET, **TIMEOUTS)
    for case in BENCH_CASES:
        for p in server.parameters():
            p.data.zero_()  # what a case leaves behind cannot pass the next one's checksum
        address = wait_for(os.path.join(args.out, f"{case}.addr"))
        refits = []
        if case == "copy":
            with refit.Engine(address, server.checkpoint_targets(), **options) as engine:
                while True:
                    started = time.perf_counter()
                    if engine.next() is None:
                        break
                    refits.append({"engine_s": time.perf_counter() - started, "check_s": 0.0})
            status = {"mode": "copy", "reason": "", "history": []}
        else:
            worker = standin.make_vllm_worker(server, adapters.VllmWorkerExtension)
            standin.collective_rpc(worker, "refit_join", args=(address, 0, [(n, "bfloat16", s) for n, s in specs]),
                                   kwargs=dict(options, capture=case == "replay", device=device))
            status = {"mode": "none", "reason": "", "history": []}  # no refit came
            while True:
                started = time.perf_counter()
                if standin.collective_rpc(worker, "refit_next")[0] is None:
                    break
                status = standin.collective_rpc(worker, "refit_status")[0]
                refits.append({"engine_s": time.perf_counter() - started, "check_s": status["last_check_s"]})
            standin.collective_rpc(worker, "refit_close")
        synchronize(device)
        save_json(os.path.join(args.out, f"{case}_engine.json"),
                  {"refits": refits, "status": status, "checksum": checksum(list(server.parameters())),
                   "load_calls": server.load_calls})


def bench_model(script, bench, out, extra=()):
    """One bench model: the copy baseline, then the three cases; returns (results, rows)."""
    procs = {"copy": spawn(script, ["--role", "copy", "--bench-model", bench] + list(extra), out, "copy")}
    ok, lines = wait_procs(procs, out, 120)
    if not ok:
        return [(f"bench {bench} copy", False, lines)], []
    copy = json.load(open(os.path.join(out, "copy.json")))
    procs = {role: spawn(script, ["--role", role, "--bench-model", bench] + list(extra), out, role)
             for role in ("bench-engine", "bench-trainer")}
    ok, lines = wait_procs(procs, out, 420)
    if not ok:
        return [(f"bench {bench}", False, lines)], []
    results, rows = [], []
    specs = bench_specs(bench)
    for case in BENCH_CASES:
        t = json.load(open(os.path.join(out, f"{case}_trainer.json")))
        e = json.load(open(os.path.join(out, f"{case}_engine.json")))
        seconds = [r["seconds"] + x["check_s"] for r, x in zip(t["reports"], e["refits"])]
        if len(seconds) != 5:
            results.append((f"bench {bench} {case}", False, [f"  {len(seconds)} of 5 refits recorded"]))
            continue
        median = statistics.median(seconds[1:])
        row = {"bench": bench, "case": case, "tensors": len(specs), "bytes": copy["bytes"],
               "copy_s": copy["median_s"], "refit_s": seconds, "median_2_5_s": median,
               "x_copy": median / copy["median_s"], "check_s": [x["check_s"] for x in e["refits"]],
               "mode": e["status"]["mode"], "history": e["status"]["history"],
               "checksum_ok": t["checksum"] == e["checksum"], "error": t["error"]}
        print(json.dumps(row), flush=True)
        rows.append(row)
        # Catches: a replay that copies nothing (zeroed weights), a case that never replayed, a failed job.
        want = {"loader": ["loader"] * 5, "replay": ["capture"] + ["replay"] * 4, "copy": []}[case]
        good = row["checksum_ok"] and not row["error"] and row["history"] == want and len(seconds) == 5
        results.append((f"bench {bench} {case}", good,
                        [f"  x device copy {row['x_copy']:.2f} (median {median * 1e3:.1f} ms, copy "
                         f"{copy['median_s'] * 1e3:.2f} ms), history {row['history']}, checksum ok "
                         f"{row['checksum_ok']}" + (f", error {row['error']}" if row["error"] else "")]))
    return results, rows


def print_table(rows):
    print(f"{'bench':<15} {'case':<7} {'tensors':>7} {'GB':>6} {'refit 2..5 ms':>13} {'x copy':>7} "
          f"{'vs copy mode':>12}", flush=True)
    for row in rows:
        copy_mode = next(r for r in rows if r["bench"] == row["bench"] and r["case"] == "copy")
        print(f"{row['bench']:<15} {row['case']:<7} {row['tensors']:>7} {row['bytes'] / 1e9:>6.2f} "
              f"{row['median_2_5_s'] * 1e3:>13.1f} {row['x_copy']:>7.2f} "
              f"{row['median_2_5_s'] / copy_mode['median_2_5_s']:>12.3f}", flush=True)
    for bench in dict.fromkeys(r["bench"] for r in rows):
        replay = next(r for r in rows if r["bench"] == bench and r["case"] == "replay")
        copy_mode = next(r for r in rows if r["bench"] == bench and r["case"] == "copy")
        ratio = replay["median_2_5_s"] / copy_mode["median_2_5_s"]
        print(f"target {bench}: replay at {ratio:.3f}x copy mode ({'met' if ratio <= 1.10 else 'NOT met'}: at most "
              "1.10x)", flush=True)


# ---- the parent -----------------------------------------------------------------------


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["copy", "bench-trainer", "bench-engine"])
    parser.add_argument("--out")
    parser.add_argument("--bench-model", help="roles: one of " + ", ".join(BENCHES))
    parser.add_argument("--device", help="role processes: cpu (a smoke, over shm) or cuda (the default)")
    parser.add_argument("--benches", default="llama3_8b,qwen3_30b_a3b")
    return parser.parse_args()


def main():
    args = parse_args()
    roles = {"copy": run_copy, "bench-trainer": run_bench_trainer, "bench-engine": run_bench_engine}
    if args.role:
        return roles[args.role](args)

    base.check_requirements()
    import torch
    import transformers
    import refit
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, refit {refit.__version__}", flush=True)
    results, rows = [], []
    with tempfile.TemporaryDirectory(prefix="refit-adapters-bench-") as out:
        for bench in args.benches.split(","):
            os.makedirs(os.path.join(out, bench))
            bench_results, bench_rows = bench_model(__file__, bench, os.path.join(out, bench))
            results += bench_results
            rows += bench_rows
    print_results(results)
    if rows:
        print_table(rows)
    return print_summary("gpu_adapters_bench", results)


if __name__ == "__main__":
    sys.exit(main() or 0)
