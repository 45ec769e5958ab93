#!/usr/bin/python3
"""Plots GB/s against bucket size for each preset and mode from the JSON lines
that bench/gpu_run.sh collects (one `refit bench --json` report per line),
with the device-copy ceiling measured in the same runs.

Usage: bench/plot_gpu.py docs/gpu_bench_<date>.jsonl docs/gpu_bucket_sweep.png
Needs Debian's python3-matplotlib.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src, dst):
    reports = [json.loads(line) for line in open(src) if line.strip()]
    series = {}
    ceilings = []
    for r in reports:
        b = r.get("bench", {})
        if not r.get("verified"):
            continue
        key = (r["model"], r.get("mode", "staged"))
        series.setdefault(key, []).append((r["bucket_size"], b["median_gbps"]))
        ceilings.append(b["ceiling_gbps"])
    fig, ax = plt.subplots(figsize=(8, 5))
    for (model, mode), points in sorted(series.items()):
        points.sort()
        xs = [p[0] / 2**20 for p in points]
        ys = [p[1] for p in points]
        ax.plot(xs, ys, marker="o", linestyle="-" if mode == "direct" else "--", label=f"{model} {mode}")
    if ceilings:
        c = sum(ceilings) / len(ceilings)
        ax.axhline(c, color="black", linewidth=1, label=f"device copy {c:.0f} GB/s (same runs)")
        ax.axhline(c / 1.3, color="gray", linestyle=":", linewidth=1, label="direct target (1.3x floor)")
        ax.axhline(c / 2.3, color="gray", linestyle="-.", linewidth=1, label="staged target (2.3x floor)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bucket size (MiB)")
    ax.set_ylabel("refit GB/s (median of refits 2..N)")
    ax.set_title("refit on one H200: trainer and engine processes over cuda_ipc")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(dst, dpi=120)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
