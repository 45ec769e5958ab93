#!/usr/bin/env bash
# Benchmark of `refit push`: a checkpoint in the page cache refitted into
# running engine ranks, against the ceiling measured in the same run:
#   --device cpu   engines in host memory; ceiling: memcpy of one refit's bytes
#   --device cuda  engines on GPU 0;       ceiling: pinned host-to-device copy
# Usage: bench/push_bench.sh BUILD_DIR [cpu|cuda] [MODEL] [LAYERS] [ENGINE_RANKS] [BUCKET] [REPEAT]
# Env: OUT (where results go; default a temp dir), KEEP=1 keeps the checkpoint,
# MODE=staged|direct, POOL (engine pool slots, default 2), TIMEOUT (seconds per
# process, default 120), PUSH_FLAGS (extra flags of `refit push`, e.g.
# --register-host-weights=false).
# Prints one JSON line: bytes, per-refit GB/s (median of refits 2..N), the
# ceiling and the ratio.
set -euo pipefail
build=${1:?usage: bench/push_bench.sh BUILD_DIR [cpu|cuda] [MODEL] [LAYERS] [ENGINE_RANKS] [BUCKET] [REPEAT]}
device=${2:-cpu}
model=${3:-tiny}
layers=${4:--1}
ranks=${5:-1}
bucket=${6:-64MiB}
repeat=${7:-5}
refit=${REFIT_BINARY:-$build/refit}
limit=${TIMEOUT:-120}  # seconds allowed for each process
mode=${MODE:-staged}   # staged or direct
pool=${POOL:-2}        # receive pool slots of each engine rank
work=$(mktemp -d /tmp/refit-push-bench-XXXXXX)
out=${OUT:-$work}
cleanup() { [[ ${KEEP:-0} == 1 ]] || rm -rf "$work"; }
trap cleanup EXIT

fail() { echo "push_bench: $*" >&2; tail -n 5 "$work"/*.err >&2 || true; exit 1; }
echo "push_bench: writing $model ($layers layers)" >&2
timeout "$limit" "$refit" make-checkpoint --model "$model" --layers "$layers" --files 4 --out "$work/ckpt" ||
  fail "make-checkpoint failed"
cat "$work"/ckpt/*.safetensors >/dev/null  # into the page cache
echo "push_bench: pushing" >&2
transport=shm
[[ $device == cuda ]] && transport=cuda_ipc
timeout "$limit" "$refit" coordinator --refits 0 --trainer-ranks "$ranks" --engine-ranks "$ranks" --port-file "$work/port" \
  --report "$work/report.json" --quiet --timeout "$limit" 2>"$work/coordinator.err" &
for _ in $(seq 100); do [[ -s $work/port ]] && break; sleep 0.1; done
address=127.0.0.1:$(cat "$work/port")
for ((r = 0; r < ranks; r++)); do
  timeout "$limit" "$refit" engine --coordinator "$address" --rank "$r" --engine-ranks "$ranks" --trainer-ranks "$ranks" \
    --model "$work/ckpt" --device "$device" --transport "$transport" --mode "$mode" --bucket-size "$bucket" \
    --pool-slots "$pool" --timeout "$limit" \
    2>"$work/engine-$r.err" &
done
timeout "$limit" "$refit" push "$work/ckpt" --coordinator "$address" --engine-ranks "$ranks" \
  --transport "$transport" --mode "$mode" --bucket-size "$bucket" --repeat "$repeat" --timeout "$limit" ${PUSH_FLAGS:-} 2>"$work/push.err" ||
  fail "push failed"
wait || fail "a process failed"
bytes=$(python3 -c "import json;print(json.load(open('$work/report.json'))['bytes_per_refit'])")
kind=memcpy
[[ $device == cuda ]] && kind=h2d
"$refit" ceiling --kind "$kind" --bytes "$bytes" >"$work/ceiling.json"
python3 - "$work/report.json" "$work/ceiling.json" "$device" "$model" "$layers" "$ranks" "$bucket" <<'PY' | tee -a "$out/push_bench.jsonl"
import json, statistics, sys
report, ceiling = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
rates = [r["gbps"] for r in report["refits"]]
steady = statistics.median(rates[1:] if len(rates) > 1 else rates)
print(json.dumps({"bench": "push", "device": sys.argv[3], "mode": report.get("mode"), "pool_slots": int(__import__("os").environ.get("POOL", "2")), "push_flags": __import__("os").environ.get("PUSH_FLAGS", ""), "model": sys.argv[4], "layers": int(sys.argv[5]),
                  "engine_ranks": int(sys.argv[6]), "bucket": sys.argv[7], "verified": report["verified"],
                  "bytes": report["bytes_per_refit"], "refit_gbps": rates, "median_gbps": steady,
                  "ceiling": ceiling["ceiling"], "ceiling_gbps": ceiling["gbps"],
                  "ratio": steady / ceiling["gbps"] if ceiling["gbps"] else 0}))
PY
