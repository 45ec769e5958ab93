#!/usr/bin/env python3
"""Markdown tables for docs/PERF.md from bench/multi_gpu.sh's JSON lines.

Usage: bench/multi_gpu_table.py multi_gpu.jsonl [more.jsonl ...] > table.md

One row per refit job: model, placement, transport, mode, bytes, the median
GB/s of refits 2..N, the GPU-to-GPU copy ceiling measured in the same run
and the ratio; then the rule-7 checks and any skipped jobs. Python 3 stdlib
only. Lines that are not JSON objects are reported on stderr and skipped.
"""
import json
import sys

PLACEMENT = {
    "tp2": "TP2: trainer r on GPU 1-r -> engine r on GPU r",
    "tp1": "TP1: trainer GPU 0 -> engine GPU 1",
    "tp2x": "TP2: trainers on GPUs 0, 1 -> engine ranks on GPUs 2, 3",
    "tp4": "TP4: trainer r on GPU (r+2)%4 -> engine r on GPU r",
    "rule7": "TP1, engine under CUDA_VISIBLE_DEVICES={visible}, base-gpu-id 0",
    "relay": "trainer GPU 0 -> chain of {engines} TP1 engines on GPUs {bases}",
    "relay_kill": "relay of {engines} on GPUs {bases}, engine {killed} killed in refit 2",
    "relay_tp2": "TP2: trainers GPUs 0, 1 -> engine 0 GPUs 2, 3 -> engine 1 from GPU {second}",
    "fp8": "TP1 FP8: bf16 trainer GPU 0 -> fp8-block128 engine GPU 1",
    "fsdp_same": "FSDP {trainers} (GPUs 0..) -> TP {ranks} from GPU {base}, same GPUs",
    "fsdp_own": "FSDP {trainers} (GPUs 0..) -> TP {ranks} on GPU {base}, its own",
}


def gb(n):
    return f"{n / 1e9:.2f} GB"


def model_name(r):
    layers = r.get("layers", -1)
    return r["model"] if layers is None or layers < 0 else f"{r['model']} ({layers} layers)"


def placement(r):
    text = PLACEMENT.get(r.get("topology"), r.get("topology", "?"))
    bases = r.get("engine_base_gpu_ids") or [r.get("engine_base_gpu_id", "?")]
    return text.format(visible=r.get("engine_cuda_visible_devices", "?"), engines=r.get("engines", 1),
                       bases=", ".join(str(b) for b in bases), killed=r.get("killed_engine", "?"),
                       second=bases[-1], trainers=len(r.get("trainer_gpus", [])), ranks=r.get("engine_ranks", "?"),
                       base=r.get("engine_base_gpu_id", "?"))


def one_engine(records, r):
    """The one-engine job (tp1, or tp2x for relay_tp2) of r's model, transport and mode in the same run."""
    want = "tp2x" if r.get("topology") == "relay_tp2" else "tp1"
    for o in records:
        if (o.get("topology") == want and o.get("verified") and
                all(o.get(k) == r.get(k) for k in ("model", "layers", "transport", "mode"))):
            return o
    return None


def relay_rows(records):
    """Issue 23 item 1: each relay job's median refit time over one engine's (target at most 1.25x)."""
    rows = []
    for r in records:
        if not r.get("topology", "").startswith("relay") or r.get("skipped"):
            continue
        base = one_engine(records, r)
        if not base or not r.get("median_gbps"):
            rows.append(f"| {model_name(r)} | {placement(r)} | {r.get('transport')} | - | - | - | "
                        f"{'yes' if r.get('verified') else 'NO'} |")
            continue
        t, t1 = r["bytes"] / r["median_gbps"] / 1e6, base["bytes"] / base["median_gbps"] / 1e6
        rows.append(f"| {model_name(r)} | {placement(r)} | {r.get('transport')} | {t:.2f} ms | {t1:.2f} ms | "
                    f"{t / t1:.3f}x | {'yes' if r.get('verified') else 'NO: ' + r.get('error', '?')[:80]} |")
    if not rows:
        return []
    return ["", "| model | engines | transport | refit (median 2..N) | one engine | ratio | verified |",
            "| --- | --- | --- | ---: | ---: | ---: | --- |"] + rows


def mode(r):
    if r.get("mode") == "staged" and r.get("pool_slots"):
        return f"staged, {r['pool_slots']} slots"
    return r.get("mode", "?")


def memory(r):
    peak = r.get("peak_gpu_mem_gib") or {}
    return " / ".join(f"{v:.0f}" for _, v in sorted(peak.items())) or "-"


def table(records):
    out = []
    jobs = [r for r in records if r.get("topology") in PLACEMENT and not r.get("skipped")]
    if jobs:
        out.append("| model | placement | transport | mode | bucket | bytes/refit | refits GB/s | "
                   "median 2..N GB/s | ceiling | ceiling GB/s | ratio | peak GiB per GPU | verified |")
        out.append("| --- | --- | --- | --- | --- | ---: | --- | ---: | --- | ---: | ---: | --- | --- |")
        for r in jobs:
            rates = " ".join(f"{g:.0f}" for g in r.get("refit_gbps", []))
            ceiling = r.get("ceiling", "-")
            ratio = f"{r.get('ratio', 0):.2f}"
            if "ceiling_one_way_gbps" in r:
                ceiling += f" (one way {r['ceiling_one_way_gbps']:.0f})"
                ratio += f" ({r.get('ratio_one_way', 0):.2f})"
            verified = "yes" if r.get("verified") else "NO: " + r.get("error", "?")[:120].replace("|", "/")
            out.append(f"| {model_name(r)} | {placement(r)} | {r.get('transport')} | {mode(r)} | "
                       f"{r.get('bucket')} | {gb(r.get('bytes', 0))} | {rates or '-'} | "
                       f"{r.get('median_gbps', 0):.1f} | {ceiling} | {r.get('ceiling_gbps', 0):.1f} | {ratio} | "
                       f"{memory(r)} | {verified} |")
    out += relay_rows(records)
    checks = [r for r in records if r.get("topology") == "rule7-refused"]
    if checks:
        out.append("")
        for r in checks:
            verdict = "refused as it must be" if r.get("verified") else "NOT refused as expected"
            out.append(f"- Engine under CUDA_VISIBLE_DEVICES={r.get('engine_cuda_visible_devices')} with "
                       f"--base-gpu-id {r.get('engine_base_gpu_id')} (the physical id): {verdict} "
                       f"(exit {r.get('exit_code')}): `{r.get('message', '')[-200:]}`")
    skipped = [r["name"] for r in records if r.get("skipped")]
    if skipped:
        out.append("")
        out.append("Skipped (time budget spent): " + ", ".join(skipped))
    return "\n".join(out)


def main(paths):
    if not paths:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    records = []
    for path in paths:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    r = json.loads(line)
                except ValueError as e:
                    print(f"{path}:{n}: not JSON ({e}); skipped", file=sys.stderr)
                    continue
                if not isinstance(r, dict) or "name" not in r:
                    print(f"{path}:{n}: not a multi_gpu.sh record; skipped", file=sys.stderr)
                    continue
                records.append(r)
    print(table(records))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
