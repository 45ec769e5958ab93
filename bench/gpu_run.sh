#!/usr/bin/env bash
# One call on the GPU machine: GPU tests, the batched-copy benchmark, and the
# refit benchmarks (figures for docs/PERF.md), results under $OUT.
# Expects the binaries built here in .devcarry/ (refit, refit_gpu_tests,
# batched_copy_bench, libxxhash.so.0): see docs/PERF.md.
set -uo pipefail
carry=${CARRY:-.devcarry}
out=${OUT:-/tmp/refit-gpu-out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/$carry:${LD_LIBRARY_PATH:-}"
export REFIT_BINARY="$PWD/$carry/refit"
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
what=${1:-all}
if [[ $what == all || $what == tests ]]; then
  timeout 300 "$carry/refit_gpu_tests" 2>&1 | tee "$out/gpu_tests.log" | grep -E "^\[  (PASSED|FAILED|SKIPPED) |OK \]|FAILED|Failure|rror" | head -60
fi
if [[ $what == all || $what == copy ]]; then
  timeout 120 "$carry/batched_copy_bench" 2>&1 | tee "$out/batched_copy_bench.txt" | tail -12
fi
if [[ $what == all || $what == bench ]]; then
  # MODELS="preset:layers ...", MODES, BUCKETS, POOLS, REFITS select the runs.
  for spec in ${MODELS:-llama3-8b:-1 qwen3-30b-a3b:24}; do
    model=${spec%%:*}
    layers=${spec#*:}
    for mode in ${MODES:-direct staged}; do
      for bucket in ${BUCKETS:-256MiB 1GiB 4GiB}; do
        for pool in ${POOLS:-2}; do
          pools=${POOLS:-2}
          [[ $mode == direct && $pool != "${pools%% *}" ]] && continue  # no pool in direct mode
          name="$model-$mode-$bucket-p$pool"
          tmp=$(mktemp -d)
          timeout 240 "$carry/refit" bench --json --device cuda --transport cuda_ipc --mode "$mode" --model "$model" \
            --layers "$layers" --engine-ranks 1 --bucket-size "$bucket" --refits "${REFITS:-4}" --pool-slots "$pool" \
            --timeout 120 > "$tmp/report.json" 2> "$tmp/err"
          python3 bench/record_report.py "$tmp/report.json" "$name" "$out/bench.jsonl" "$tmp/err"
          rm -rf "$tmp"
        done
      done
    done
  done
fi
