#!/usr/bin/env bash
# Issue 23 (several GPUs, second wave) on a machine with 2 or more GPUs, in
# steps that each fit one device call (600 s):
#   bash bench/several_gpus.sh tests    the GPU tests that need two GPUs and
#                                       the many-engines GPU tests (item 4)
#   bash bench/several_gpus.sh refits   bench/multi_gpu.sh: relays over
#                                       cuda_ipc and nccl beside one engine,
#                                       an engine killed, FP8 direct, FSDP
#                                       trainers (items 1-3), llama3-8b
#   bash bench/several_gpus.sh fsdp     FSDP2 (fully_shard, NCCL, one process
#                                       per GPU) into engines of another TP
#                                       size, logits bit for bit (item 2)
# Binaries and libraries in $CARRY (default .devcarry; docs/PERF.md
# "Reproducing"), the Python module in $CARRY/python (bench/python_gpu.sh
# prepare). Results under $OUT. The last line: "SUMMARY: PASS|FAIL: ...";
# exit status 0 only on PASS.
set -uo pipefail
cd "$(dirname "$0")/.."
carry=${CARRY:-.devcarry}
out=${OUT:-/tmp/refit-several-gpus-out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/$carry:${LD_LIBRARY_PATH:-}"
export REFIT_BINARY=${REFIT_BINARY:-$PWD/$carry/refit}
export NCCL_NVLS_ENABLE=0
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader >"$out/gpus.txt" 2>&1
echo "several_gpus: $gpus GPUs: $(cut -d, -f2 "$out/gpus.txt" | sort | uniq -c | tr -s ' ' | tr '\n' ';')" >&2
if ((gpus < 2)); then
  echo "SUMMARY: FAIL: needs 2 or more GPUs, $gpus here (the one-GPU parts are in refit_gpu_tests)"
  exit 1
fi

case ${1:-} in
  tests)
    # The two-GPU tests (they skip on one GPU) and every many-engines GPU test.
    two='*CudaIpcAcrossGpus*:NcclDeviceTest.*:CudaIpcGpu.WritesFromAnotherGpu*:CudaIpcGpu.TargetGpuHidden*'
    filter=${GPU_FILTER:-"$two:ManyEnginesGpu.*:Transports/JoinGpuTest.*"}
    timeout 560 "$carry/refit_gpu_tests" --gtest_filter="$filter" 2>&1 | tee "$out/gpu_tests.log" |
      grep -E "^\[  (PASSED|FAILED|SKIPPED) |OK \]|FAILED|SKIPPED \]" | head -60
    passed=$(grep -c "^\[       OK \]" "$out/gpu_tests.log")
    failed=$(grep -c "^\[  FAILED  \] [A-Za-z]" "$out/gpu_tests.log")
    skipped=$(grep -c "^\[  SKIPPED \] [A-Za-z]" "$out/gpu_tests.log")
    if ((failed == 0 && skipped == 0 && passed > 0)); then
      echo "SUMMARY: PASS: $passed GPU tests passed on $gpus GPUs, none skipped"
    else
      echo "SUMMARY: FAIL: $passed passed, $failed failed, $skipped skipped on $gpus GPUs"
      exit 1
    fi
    ;;
  refits)
    OUT=$out/refits MODELS=${MODELS:-llama3-8b:-1} TRANSPORTS=${TRANSPORTS:-cuda_ipc nccl} \
      TOPOLOGIES=${TOPOLOGIES:-tp1 relay relay_kill fp8 fsdp_same fsdp_own tp2x relay_tp2} \
      REFITS=${REFITS:-4} LIMIT=${LIMIT:-120} BUDGET=${BUDGET:-500} bash bench/multi_gpu.sh
    rc=$?
    cat "$out/refits/table.md"
    if ((rc == 0)); then echo "SUMMARY: PASS: every job verified"; else echo "SUMMARY: FAIL: see $out/refits"; fi
    exit $rc
    ;;
  fsdp)
    # Trainer rank r on GPU r, engines on the same GPUs, and with 3+ GPUs
    # G-1 trainers into an engine on a GPU of its own.
    own=""
    ((gpus >= 3)) && own=",llama:$((gpus - 1)):1:own,qwen3_moe:$((gpus - 1)):1:own"
    cases=${CASES:-"llama:2:1:same,qwen3_moe:2:3:same$own"}
    OUT=$out bash bench/python_gpu.sh fsdp --cases "$cases"
    ;;
  *)
    echo "usage: bash bench/several_gpus.sh tests|refits|fsdp" >&2
    exit 2
    ;;
esac
