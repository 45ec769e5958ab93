#!/usr/bin/env bash
# One device call for a restructuring (issue "Architecture"): the GPU tests
# of the new build, the push-deadlock proof (the new push matrix test run
# against the old binary must fail, against the new one pass), and the GPU
# bench of old and new builds interleaved (bench/ab_compare.sh).
# Expects .devcarry/{old,new}/refit, .devcarry/new/refit_gpu_tests and the
# shared libraries in .devcarry/lib (docs/PERF.md "Reproducing").
# Usage: bench/arch_gpu_check.sh [tests] [bench CONFIG...]
set -uo pipefail
out=${OUT:-/tmp/refit-gpu-out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/.devcarry/lib:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
if [[ ${1:-} == tests ]]; then
  shift
  REFIT_BINARY="$PWD/.devcarry/new/refit" timeout 420 .devcarry/new/refit_gpu_tests 2>&1 > "$out/gpu_tests.log"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED|tests? ran" "$out/gpu_tests.log" | head -40
  echo "---- the default-settings push (2 slots, 4 MiB, registered) against the OLD binary:"
  REFIT_BINARY="$PWD/.devcarry/old/refit" timeout 90 .devcarry/new/refit_gpu_tests \
    --gtest_filter='*PushGpuTest*slots2_4MiB_registered_staged*' 2>&1 | tail -15 > "$out/push_old.log"
  grep -E "^\[  (PASSED|FAILED|OK) |received no bucket|credit|Failure" "$out/push_old.log" | head -8
fi
if [[ ${1:-} == bench ]]; then
  shift
  ROUNDS=${ROUNDS:-5} REFITS=${REFITS:-3} bench/ab_compare.sh .devcarry/old .devcarry/new "$out/ab.jsonl" "$@"
fi
