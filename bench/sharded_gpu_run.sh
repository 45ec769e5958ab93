#!/usr/bin/env bash
# Sharded trainers on one GPU (issue 19), one device call: the sharded GPU
# tests (and the cuda_ipc demo cases beside them), the DTensor trainers'
# Python test, and `refit bench` of 8 FSDP trainer ranks into 2 engine ranks
# over cuda_ipc direct against full-weight trainers, each beside the one-copy
# floor measured by the same bench process. Expects .devcarry/ as
# docs/PERF.md "Reproducing" builds it (refit, refit_gpu_tests, libraries)
# and .devcarry/python from `bench/python_gpu.sh prepare`. Results: $OUT.
# MPS=1: the bench runs go through the CUDA MPS server (started here with
# its pipe and log folders under $OUT/mps, stopped at the end), so that the
# processes' kernels share the GPU instead of taking turns by time slice;
# each row then says "mps": true.
set -uo pipefail
cd "$(dirname "$0")/.."
carry=${CARRY:-.devcarry}
out=${OUT:-/tmp/refit-sharded-gpu-out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/$carry:${LD_LIBRARY_PATH:-}"
export REFIT_BINARY="$PWD/$carry/refit"
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
if [[ ${SKIP_TESTS:-0} != 1 ]]; then
  timeout 300 "$carry/refit_gpu_tests" --gtest_filter="${GPU_FILTER:-Layouts/ShardedGpuTest.*:Modes/GpuDemoTest.*}" 2>&1 |
    tee "$out/gpu_tests.log" | grep -E "^\[  (PASSED|FAILED|SKIPPED) |OK \]|FAILED|Failure|rror" | head -40
  bash bench/python_gpu.sh dtensor 2>&1 | tail -15
fi
if [[ ${MPS:-0} == 1 ]]; then
  export CUDA_MPS_PIPE_DIRECTORY="$out/mps/pipe" CUDA_MPS_LOG_DIRECTORY="$out/mps/log"
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d || { echo "MPS: nvidia-cuda-mps-control -d failed" >&2; exit 1; }
  trap 'echo quit | nvidia-cuda-mps-control' EXIT
fi
# name model layers layout trainers engines [engine-experts: tp (default) or ep] [mode: direct (default) or staged]
# [trainer-names: hf (default) or megatron]
runs=${RUNS:-"llama-fsdp8 llama3-8b -1 fsdp 8 2
llama-full2 llama3-8b -1 full 2 2
qwen-fsdp8 qwen3-30b-a3b 24 fsdp 8 2
qwen-full2 qwen3-30b-a3b 24 full 2 2"}
while read -r name model layers layout trainers engines experts mode names; do
  [[ -z $name ]] && continue
  tmp=$(mktemp -d)
  timeout 240 "$carry/refit" bench --json --device cuda --transport cuda_ipc --mode "${mode:-direct}" --model "$model" \
    --layers "$layers" --trainer-layout "$layout" --trainer-ranks "$trainers" --engine-ranks "$engines" --engine-gpus 1 \
    --engine-experts "${experts:-tp}" --trainer-names "${names:-hf}" \
    --refits "${REFITS:-5}" --timeout 120 > "$tmp/report.json" 2> "$tmp/err"
  python3 bench/record_report.py "$tmp/report.json" "$name" "$out/bench.jsonl" "$tmp/err" "mps=$([[ ${MPS:-0} == 1 ]] && echo true || echo false)"
  rm -rf "$tmp"
done <<< "$runs"
