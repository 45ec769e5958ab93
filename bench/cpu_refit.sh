#!/usr/bin/env bash
# CPU refit benchmark (issue: refit core): shm transport, tiny and tiny-moe,
# throughput against memcpy measured in the same run (refit bench).
# Usage: bench/cpu_refit.sh [build dir]
set -euo pipefail
build=${1:-build}
printf '%-9s %-6s %-8s %10s %10s %7s\n' model ranks bucket refit_GB/s memcpy_GB/s ratio
for model in tiny tiny-moe; do
  for ranks in 1 2; do
    for bucket in 4MiB 16MiB 64MiB; do
      out=$("$build/refit" bench --json --model "$model" --engine-ranks "$ranks" --transport shm \
              --bucket-size "$bucket" --refits 10)
      REPORT="$out" python3 - "$model" "$ranks" "$bucket" <<'PY'
import json, os, sys
r = json.loads(os.environ["REPORT"])
b = r["bench"]
assert r["verified"], r.get("error")
print(f'{sys.argv[1]:<9} {sys.argv[2]:<6} {sys.argv[3]:<8} {b["median_gbps"]:10.2f} {b["ceiling_gbps"]:10.2f} {b["ratio_to_ceiling"]:7.2f}')
PY
    done
  done
done
