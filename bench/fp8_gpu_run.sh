#!/usr/bin/env bash
# One call on the GPU machine (device tool, carry .devcarry): the FP8 GPU
# tests, then bf16 trainers into FP8 engines (`--quantize fp8-block128`,
# issue 20) beside the same refit without conversion and the PyTorch path,
# all in this one run. Results under $OUT:
#   gpu_tests.log      the GPU tests selected by TESTS (a gtest filter)
#   fp8_bench.jsonl    one `refit bench --json` report per run, "name" added;
#                      under --quantize its bench.ceiling_bytes are the bf16
#                      bytes the engine's weights come from, so floor_ratio is
#                      the refit's time over the one-copy floor of those bytes
#   torch_path.jsonl   bench/fp8_torch_path.py per model
# Env: MODELS ("preset:layers ..."), MODES, QUANTIZE, REFITS, BUCKET, TESTS, REFIT_BINARY
# (another build's refit, for A/B runs).
set -uo pipefail
carry=${CARRY:-.devcarry}
out=${OUT:-/tmp/refit-fp8-out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/$carry:${LD_LIBRARY_PATH:-}"
export REFIT_BINARY=${REFIT_BINARY:-$PWD/$carry/refit}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
tests=${TESTS:-*Quantiz*:*Fp8*:*DeviceContent*}
if [[ $tests != none ]]; then
  timeout 400 "$carry/refit_gpu_tests" --gtest_filter="$tests" 2>&1 | tee "$out/gpu_tests.log" |
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED|Failure" | head -40
fi
for spec in ${MODELS:-llama3-8b:-1 qwen3-30b-a3b:24}; do
  model=${spec%%:*}
  layers=${spec#*:}
  timeout 120 python3 bench/fp8_torch_path.py "$model" "$layers" | tee -a "$out/torch_path.jsonl"
  for mode in ${MODES:-direct staged}; do
    for quantize in ${QUANTIZE:-fp8-block128 none}; do
      name="$model-$mode-$quantize"
      tmp=$(mktemp -d)
      timeout 300 "$REFIT_BINARY" bench --json --device cuda --transport cuda_ipc --mode "$mode" --model "$model" \
        --layers "$layers" --engine-ranks 1 --bucket-size "${BUCKET:-1GiB}" --refits "${REFITS:-5}" \
        --quantize "$quantize" --timeout 200 > "$tmp/report.json" 2> "$tmp/err"
      python3 bench/record_report.py "$tmp/report.json" "$name" "$out/fp8_bench.jsonl" "$tmp/err"
      rm -rf "$tmp"
    done
  done
done
