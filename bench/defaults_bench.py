#!/usr/bin/env python3
"""Do the defaults reach 80% of the best setting? (issue 17 item 9)

For each case (a transport, device, mode and model), runs `refit bench` with
the default --bucket-size and --pool-slots, then with each setting of the
sweep, in one process after another on the same machine, and prints one
markdown row per case: the defaults' GB/s, the best sweep setting and its
GB/s, their ratio, and the bench's ceiling (memcpy or device copy) measured
in the defaults' run. Each figure is the bench's median over refits 2..N.

Usage:
  bench/defaults_bench.py REFIT_BINARY [--refits N] [--json FILE] \\
      --case 'LABEL: refit bench flags' ... --sweep '16MiB:3 64MiB:3 1GiB:2 ...'

A sweep item is BUCKET:SLOTS (SLOTS '-' for direct mode, which has no pool).
"""
import argparse
import json
import subprocess
import sys


def bench(refit, flags, refits):
    cmd = [refit, "bench", "--json", "--refits", str(refits)] + flags
    done = subprocess.run(cmd, capture_output=True, text=True)
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        sys.exit(f"{' '.join(cmd)}: no JSON report (exit {done.returncode}): {done.stderr.strip()[-800:]}")
    if not report.get("verified"):
        sys.exit(f"{' '.join(cmd)}: not verified: {report.get('error')}")
    return report


def setting_flags(item):
    bucket, slots = item.split(":")
    return ["--bucket-size", bucket] + ([] if slots == "-" else ["--pool-slots", slots])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("refit")
    p.add_argument("--refits", type=int, default=6)
    p.add_argument("--json", help="append one JSON line per run to this file")
    p.add_argument("--case", action="append", required=True)
    p.add_argument("--sweep", required=True)
    a = p.parse_args()
    out = open(a.json, "a") if a.json else None
    print("| case | defaults (bucket, slots) | defaults GB/s | ceiling GB/s | best of sweep | its GB/s | defaults / best |")
    print("| --- | --- | ---: | ---: | --- | ---: | ---: |")
    for case in a.case:
        label, flags = case.split(":", 1)
        flags = flags.split()
        runs = [("defaults", bench(a.refit, flags, a.refits))]
        for item in a.sweep.split():
            runs.append((item, bench(a.refit, flags + setting_flags(item), a.refits)))
        if out:
            for name, r in runs:
                out.write(json.dumps({"case": label, "setting": name, "bucket_size": r["bucket_size"],
                                      "pool_slots": r.get("pool_slots"), "bench": r["bench"]}) + "\n")
        default = runs[0][1]
        gbps = default["bench"]["median_gbps"]
        best_name, best = max(runs[1:], key=lambda nr: nr[1]["bench"]["median_gbps"])
        best_gbps = best["bench"]["median_gbps"]
        shown = f'{default["bucket_size"] >> 20} MiB, {default.get("pool_slots", "?")}'
        print(f'| {label} | {shown} | {gbps:.2f} | {default["bench"]["ceiling_gbps"]:.2f} | {best_name} | '
              f'{best_gbps:.2f} | **{gbps / best_gbps:.2f}** |', flush=True)


if __name__ == "__main__":
    main()
