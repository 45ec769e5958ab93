#!/usr/bin/env bash
# The Python binding's GPU proof (issue 7): Hugging Face Llama and Qwen3-MoE
# models refit bit-exactly in staged and direct modes
# (python/tests/gpu_transformers_proof.py). Two steps, like bench/gpu_run.sh:
#
#   here (the build machine):  bench/python_gpu.sh prepare
#       builds the module for the GPU machine's interpreter (Python 3.12 there:
#       /opt/torch/.venv/bin/python3) with CUDA, Release, only the _refit
#       target, and copies the package into .devcarry/python/refit. The GPU
#       machine cannot build it: it lacks the Debian headers refit_core needs
#       (CLI11, xxhash, nlohmann-json, OpenSSL; see docs/PERF.md). Needs a
#       Python 3.12 with headers here: PY312=/path/to/python3.12 (default: pyenv's).
#   there (device tool, carry .devcarry):  bash bench/python_gpu.sh
#       runs the proof with the GPU machine's python3 (torch, transformers),
#       prints each case and a last line "SUMMARY: PASS|FAIL: ...";
#       the log goes to $OUT/python_gpu.log. Exit status 0 only on PASS.
#   there, `bash bench/python_gpu.sh fp8 [--models llama --modes staged]`:
#       bf16 trainers into FP8 engines, each code and scale equal to a PyTorch
#       quantization from the format (python/tests/gpu_fp8_proof.py, issue 20).
#   there, `bash bench/python_gpu.sh adapters [--bench | --bench-only]
#       [--models llama --adapters vllm] [--benches llama3_8b]`:
#       refit.adapters (issue 21 items 4 and 5): the vLLM worker extension and the
#       SGLang custom loader refit Llama and Qwen3-MoE into stand-in servers bit
#       for bit, LoaderCapture replays the loaders' copies (or names why not)
#       (python/tests/gpu_adapters_proof.py), then with --bench the speed bench
#       times loader, replay and copy mode on llama3-8b and qwen3-30b-a3b shapes
#       (python/tests/gpu_adapters_bench.py); with no arguments both, within 560 s
#       in all; one SUMMARY line for both and the same exit status.
#   there, `bash bench/python_gpu.sh fsdp [--cases llama:2:3,...]`: FSDP2
#       trainers (fully_shard over gloo ranks sharing the GPU) refit into
#       engines of another TP size, bit for bit (python/tests/gpu_fsdp_proof.py,
#       issue 19 item 5), within 600 s; the same SUMMARY line and exit status.
#       Cases model:M:N:same or :own (issue 23 item 2): the trainers an NCCL
#       group, one per GPU, the engines on the trainers' GPUs or their own.
set -uo pipefail
cd "$(dirname "$0")/.."
carry=${CARRY:-.devcarry}

if [[ ${1:-run} == prepare ]]; then
  set -e
  py=${PY312:-$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3 2>/dev/null | tail -1)}
  [[ -x $py ]] || { echo "prepare: no Python 3.12 found; set PY312=/path/to/python3.12" >&2; exit 1; }
  build=${BUILD:-build-py312}
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DREFIT_PYTHON="$py" -DREFIT_WITH_UCX=OFF >/dev/null
  grep -q "REFIT_HAVE_CUDA=1" "$build/CMakeFiles/refit_core.dir/flags.make" ||
    { echo "prepare: refit was configured without CUDA (no nvcc?)" >&2; exit 1; }
  cmake --build "$build" --target _refit -j "${JOBS:-2}"
  rm -rf "$carry/python" && mkdir -p "$carry/python"
  cp -r "$build/python/refit" "$carry/python/"
  cp -L /lib/x86_64-linux-gnu/libxxhash.so.0 "$carry/python/refit/"
  grep -qx '/.devcarry/' .git/info/exclude 2>/dev/null || echo /.devcarry/ >> .git/info/exclude
  ls -l "$carry/python/refit"
  echo "prepare: done; on the GPU machine (carry $carry): bash bench/python_gpu.sh"
  exit 0
fi

[[ ${1:-} == run ]] && shift  # the rest goes to the proof (--models, --modes)
# `bash bench/python_gpu.sh dtensor`: the DTensor trainers' test
# (python/tests/dtensor_test.py, CPU and gloo; needs torch) instead of the proof.
# `bash bench/python_gpu.sh fsdp`: FSDP2 trainers into engines of another TP
# size (python/tests/gpu_fsdp_proof.py; needs torch with FSDP2, transformers).
what=proof
[[ ${1:-} == dtensor ]] && { what=dtensor; shift; }
[[ ${1:-} == fsdp ]] && { what=fsdp; shift; }
[[ ${1:-} == fp8 ]] && { what=fp8; shift; }
[[ ${1:-} == adapters ]] && { what=adapters; shift; }
out=${OUT:-/tmp/refit-python-gpu-out}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
py=${PYTHON:-python3}
package="$carry/python"
export PYTHONPATH="$PWD/$package${PYTHONPATH:+:$PYTHONPATH}"
export LD_LIBRARY_PATH="$PWD/$package/refit:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONUNBUFFERED=1

# The adapters mode: gpu_adapters_proof.py (--models, --adapters) unless --bench-only,
# then gpu_adapters_bench.py (--benches) with --bench or --bench-only (no arguments:
# --bench), one after the other within 560 s in all; a proof that skips, hangs or
# dies without its SUMMARY line ends the run. Each part's log is $out/adapters_<part>.log
# and its SUMMARY line shows as "<part> summary: ..."; the last line sums the parts:
# "SUMMARY: PASS|FAIL: <passed>/<cases> cases passed[; failed: ...][; why a part failed]".
adapters_part() {  # NAME SCRIPT ARGS...: 0 when the part printed its SUMMARY line
  local name=$1 script=$2 left=$(( 560 - (SECONDS - adapters_started) )) status line
  shift 2
  (( left > 0 )) || { adapters_problems+=("the adapters $name did not start: 560 s spent"); return 1; }
  timeout -k 15 "$left" "$py" "$script" "$@" 2>&1 | tee "$out/adapters_$name.log" |
    sed -u "s/^SUMMARY: /$name summary: /"
  status=${PIPESTATUS[0]}
  line=$(grep '^SUMMARY: ' "$out/adapters_$name.log" | tail -n 1)
  case $status in
    0|1) [[ -n $line ]] && { adapters_summaries+=("$line"); return 0; }
         adapters_problems+=("the adapters $name exited $status without a summary (see above)") ;;
    77) adapters_problems+=("the adapters $name skipped (see the reason above)") ;;
    124|137) adapters_problems+=("the adapters $name ran past 560 s") ;;
    *) adapters_problems+=("the adapters $name exited $status (killed by a signal?)") ;;
  esac
  return 1
}

adapters() {  # the adapters mode's arguments; prints the SUMMARY line, 0 only on PASS
  local run_proof=1 run_bench=0 proof_args=() bench_args=() passed=0 total=0 failed="" any_fail=0 text="" line
  local re='^SUMMARY: (PASS|FAIL): ([0-9]+)/([0-9]+) cases passed(; failed: (.*))?$'
  adapters_summaries=() adapters_problems=() adapters_started=$SECONDS
  (( $# == 0 )) && set -- --bench
  while (( $# )); do
    case $1 in
      --bench) run_bench=1 ;;
      --bench-only) run_proof=0 run_bench=1 ;;
      --benches=*) bench_args+=("$1") ;;
      --benches) bench_args+=("$1"); (( $# > 1 )) && { bench_args+=("$2"); shift; } ;;
      *) proof_args+=("$1") ;;
    esac
    shift
  done
  if (( run_proof )); then
    adapters_part proof python/tests/gpu_adapters_proof.py "${proof_args[@]}" || run_bench=0
  fi
  (( run_bench )) && adapters_part bench python/tests/gpu_adapters_bench.py "${bench_args[@]}"
  for line in "${adapters_summaries[@]}"; do
    [[ $line =~ $re ]] || { adapters_problems+=("a summary line not understood: $line"); continue; }
    (( passed += BASH_REMATCH[2], total += BASH_REMATCH[3] ))
    [[ ${BASH_REMATCH[1]} == FAIL ]] && any_fail=1
    [[ -n ${BASH_REMATCH[5]} ]] && failed+="${failed:+, }${BASH_REMATCH[5]}"
  done
  (( ${#adapters_summaries[@]} )) && text="$passed/$total cases passed${failed:+; failed: $failed}"
  for line in "${adapters_problems[@]}"; do text+="${text:+; }$line"; done
  if (( ${#adapters_problems[@]} == 0 && ! any_fail )) && [[ -z $failed ]]; then
    echo "SUMMARY: PASS: $text"
    return 0
  fi
  echo "SUMMARY: FAIL: $text"
  return 1
}

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$py" -c 'import sys; print("python", sys.version.split()[0], sys.executable)'
  ls "$package/refit"
  # The module must match this interpreter (built by `prepare` for it).
  check='import torch, refit; print("refit", refit.__version__, "cuda", refit.cuda_built(), refit.transports())'
  if ! "$py" -c "$check"; then
    echo "SUMMARY: FAIL: the carried refit module does not import with $py" \
         "(run bench/python_gpu.sh prepare for this Python)"
    exit 1
  fi
  if [[ $what == dtensor ]]; then
    (cd python/tests && timeout 600 "$py" run.py dtensor_test)
    status=$?
    [[ $status == 0 ]] && echo "SUMMARY: PASS: dtensor_test" || echo "SUMMARY: FAIL: dtensor_test exited $status"
    exit $status
  fi
  if [[ $what == fp8 ]]; then
    timeout -k 15 500 "$py" python/tests/gpu_fp8_proof.py "$@" 2>&1 | tee "$out/fp8_proof.log"
    status=${PIPESTATUS[0]}
    grep -q '^SUMMARY: PASS' "$out/fp8_proof.log" || { echo "SUMMARY: FAIL: the fp8 proof exited $status"; status=1; }
    exit $status
  fi
  if [[ $what == adapters ]]; then
    adapters "$@"
    exit $?
  fi
  if [[ $what == fsdp ]]; then
    # The proof's own --budget (540 s) fails the cases it cannot fit before this timeout.
    timeout -k 15 600 "$py" python/tests/gpu_fsdp_proof.py "$@" 2>&1 | tee "$out/fsdp_proof.log"
    status=${PIPESTATUS[0]}
    case $status in
      0|1) grep -q '^SUMMARY: ' "$out/fsdp_proof.log" ||
             { echo "SUMMARY: FAIL: the fsdp proof exited $status without a summary (see above)"; status=1; } ;;
      77) echo "SUMMARY: FAIL: the fsdp proof skipped (see the reason above)"; status=1 ;;
      124|137) echo "SUMMARY: FAIL: the fsdp proof ran past 600 s"; status=1 ;;
      *) echo "SUMMARY: FAIL: the fsdp proof exited $status (killed by a signal?)"; status=1 ;;
    esac
    exit $status
  fi
  timeout 900 "$py" python/tests/gpu_transformers_proof.py "$@"
  status=$?
  case $status in
    0) ;;
    77) echo "SUMMARY: FAIL: the proof skipped (see the reason above)"; status=1 ;;
    124) echo "SUMMARY: FAIL: the proof ran past 900 s"; status=1 ;;
  esac
  exit $status
} 2>&1 | tee "$out/python_gpu.log"
exit "${PIPESTATUS[0]}"
