#!/usr/bin/env bash
# UCX across network namespaces (issue 5): refit throughput over UCX's tcp
# transport against the raw throughput of the same veth path, measured in
# the same run: a plain TCP socket stream of the same bytes, and writes
# through the ucx transport alone (bench/ucx_linkbench.cc).
#
# Three "hosts" (network namespaces: coordinator, engine rank, trainer rank),
# each with one veth (eth0, 10.214.0.x/24) in a bridge of a hub namespace,
# made here and removed on exit. Needs root and iproute2.
#
# Usage: sudo bench/ucx_netns_bench.sh [build dir]
#   MODEL (llama3-8b) LAYERS (1) BUCKET (64MiB) POOL_SLOTS (3) REFITS (5) REPS (5)
#   set the job (3 slots: the engine applies bucket j while j+1 arrives).
set -euo pipefail
build=$(cd "${1:-build}" && pwd)
model=${MODEL:-llama3-8b} layers=${LAYERS:-1} bucket=${BUCKET:-64MiB} slots=${POOL_SLOTS:-3}
refits=${REFITS:-5} reps=${REPS:-5}
[[ $(id -u) -eq 0 ]] || { echo "ucx_netns_bench: needs root (network namespaces)" >&2; exit 1; }
for b in refit ucx_linkbench; do [[ -x $build/$b ]] || { echo "ucx_netns_bench: no $build/$b" >&2; exit 1; }; done

dir=$(mktemp -d /tmp/refit-ucx-bench-XXXXXX)
source "$(dirname "$0")/netns_hosts.sh"
netns_hosts rfb$$ 10.214.0 3  # coordinator, engine rank 0, trainer rank 0

# UCX over tcp only: namespaces of one machine share /dev/shm, and UCX would
# otherwise take shared memory between them. The coordinator listens on a
# network address: ranks authenticate.
export UCX_TLS=tcp REFIT_SECRET="ucx-netns-bench-$$-$RANDOM"

# 1. The refit: coordinator, engine rank 0, trainer rank 0 on three hosts.
common=(--trainer-ranks 1 --engine-ranks 1 --setup-timeout 120 --timeout 600)
in_ns 0 "$build/refit" coordinator --listen "$(addr 0):0" --port-file "$dir/port" --report "$dir/report.json" \
  --refits "$refits" --seed 1 --quiet "${common[@]}" 2>"$dir/coordinator.err" &
pids+=($!)
for _ in $(seq 1000); do [[ -s $dir/port ]] && break; sleep 0.01; done
port=$(cat "$dir/port")
rank=(--coordinator "$(addr 0):$port" --model "$model" --layers "$layers" --transport ucx --bucket-size "$bucket"
      "${common[@]}")
in_ns 1 "$build/refit" engine --rank 0 --listen-host "$(addr 1)" --pool-slots "$slots" "${rank[@]}" 2>"$dir/engine.err" &
pids+=($!)
in_ns 2 "$build/refit" trainer --rank 0 "${rank[@]}" 2>"$dir/trainer.err" &
pids+=($!)
if ! wait "${pids[@]}"; then
  echo "ucx_netns_bench: the refit job failed" >&2
  tail -n 5 "$dir"/*.err >&2
  exit 1
fi
pids=()
bytes=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["verified"], r.get("error"); print(r["bytes_per_refit"])' "$dir/report.json")

# 2. The same path, raw: a socket stream and the ucx transport alone, the
# refit's bytes per refit each time (engine host = sink, trainer host = source).
link() {
  rm -f "$dir/lport"
  in_ns 1 "$build/ucx_linkbench" sink --listen "$(addr 1)" --port-file "$dir/lport" &
  local sink=$!
  for _ in $(seq 1000); do [[ -s $dir/lport ]] && break; sleep 0.01; done
  in_ns 2 "$build/ucx_linkbench" source --connect "$(addr 1):$(cat "$dir/lport")" --mode "$1" \
    --bytes "$bytes" --reps "$reps" --chunk "$(numfmt --from=iec-i "${bucket%B}")"
  wait "$sink"
}
link socket >"$dir/socket.json"
link ucx >"$dir/ucx.json"

python3 - "$dir/report.json" "$dir/socket.json" "$dir/ucx.json" "$model" "$layers" "$bucket" <<'PY'
import json, statistics, sys
report, sock, ucx = (json.load(open(p)) for p in sys.argv[1:4])
rates = [r["gbps"] for r in report["refits"]]
refit = statistics.median(rates[1:] if len(rates) > 1 else rates)  # the first pays page faults
link = sock["median_gbps"]
out = {"model": sys.argv[4], "layers": int(sys.argv[5]), "bucket": sys.argv[6], "bytes_per_refit": report["bytes_per_refit"],
       "refit_gbps": rates, "refit_median_gbps": refit, "socket_median_gbps": link,
       "ucx_writes_median_gbps": ucx["median_gbps"], "refit_to_link": refit / link, "ucx_writes_to_link": ucx["median_gbps"] / link}
print(json.dumps(out))
print(f"refit over ucx/tcp: {refit:.2f} GB/s (median of refits 2..{len(rates)}); link: socket stream {link:.2f} GB/s, "
      f"ucx writes alone {ucx['median_gbps']:.2f} GB/s; refit = {refit / link:.0%} of the link", file=sys.stderr)
PY
