#!/usr/bin/env bash
# One call on the GPU machine (device tool, carry .devcarry): release between
# refits (`--release-between-refits`, issue 21 item 6) on one GPU, each run
# beside the same refit without release. Per run, under $OUT/release.jsonl,
# the `refit bench --json` report ("name" added); the printed line gives the
# median refit time and its ratio to the one-copy floor, and a second line
# per released run the bytes each engine rank returned per refit (as
# cudaMemGetInfo counts them) beside its receive pool (pool_slots x the
# plan's largest bucket, from the engine's join) and, with --shadow, its
# second weight arena.
# Env: MODEL (llama3-8b), LAYERS (-1), REFITS (5), BUCKET (1GiB).
set -uo pipefail
carry=${CARRY:-.devcarry}
out=${OUT:-/tmp/refit-release-out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/$carry:${LD_LIBRARY_PATH:-}"
binary=${REFIT_BINARY:-$PWD/$carry/refit}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
for shadow in "" "--shadow"; do
  for release in "" "--release-between-refits"; do
    name="${MODEL:-llama3-8b}-staged${shadow:+-shadow}${release:+-release}"
    tmp=$(mktemp -d)
    timeout 300 "$binary" bench --json --device cuda --transport cuda_ipc --model "${MODEL:-llama3-8b}" \
      --layers "${LAYERS:--1}" --engine-ranks 1 --engine-gpus 1 --bucket-size "${BUCKET:-1GiB}" \
      --refits "${REFITS:-5}" --timeout 200 $shadow $release > "$tmp/report.json" 2> "$tmp/err"
    python3 bench/record_report.py "$tmp/report.json" "$name" "$out/release.jsonl" "$tmp/err"
    python3 - "$tmp/report.json" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    sys.exit(0)
released = [x.get("released_bytes") for x in r.get("refits", [])]
if any(released):
    ranks = r.get("ranks", [{}])
    print("  released_bytes per refit:", released, "pool_slots:", r.get("pool_slots"), "bucket_size:",
          r.get("bucket_size"), "weight_memory_bytes:", [x.get("weight_memory_bytes") for x in ranks])
PY
    rm -rf "$tmp"
  done
done
