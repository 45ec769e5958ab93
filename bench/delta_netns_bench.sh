#!/usr/bin/env bash
# Delta refits over a rate-limited link (issue 22): full refits against
# --delta at each change fraction, over tcp (or ucx) between network namespaces whose
# trainer side sends through a tc token bucket (tbf) standing in for a slow
# NIC, and the link's own rate measured in the same run (a plain TCP socket
# stream of the refit's bytes, bench/ucx_linkbench.cc).
#
# Three "hosts" (network namespaces: coordinator, engine rank, trainer rank),
# each with one veth (eth0, 10.215.0.x/24) in a bridge of a hub namespace;
# the trainer's eth0 egress is shaped to RATE. Made here, removed on exit.
# Needs root, iproute2 and tc.
#
# Usage: sudo bench/delta_netns_bench.sh [build dir] > rows.jsonl
#   RATE (200mbit) MODEL (tiny) LAYERS (-1) REFITS (5) FRACTIONS ("0.01 0.1 1")
#   TRANSPORT (tcp; ucx: UCX's tcp transport, the remote delta sender)
# One JSON row per fraction on stdout: wire bytes and the median seconds of
# refits 2..REFITS (refit 1 is full either way) for full and delta, their
# ratio, and the link's time for the full bytes; a summary on stderr.
set -euo pipefail
build=$(cd "${1:-build}" && pwd)
rate=${RATE:-200mbit} model=${MODEL:-tiny} layers=${LAYERS:--1} refits=${REFITS:-5}
fractions=${FRACTIONS:-0.01 0.1 1}
transport=${TRANSPORT:-tcp}
export UCX_TLS=tcp  # namespaces share /dev/shm: without it UCX would take shared memory past the shaped link
[[ $(id -u) -eq 0 ]] || { echo "delta_netns_bench: needs root (network namespaces)" >&2; exit 1; }
for b in refit ucx_linkbench; do [[ -x $build/$b ]] || { echo "delta_netns_bench: no $build/$b" >&2; exit 1; }; done

dir=$(mktemp -d /tmp/refit-delta-bench-XXXXXX)
source "$(dirname "$0")/netns_hosts.sh"
netns_hosts rfd$$ 10.215.0 3  # coordinator, engine rank 0, trainer rank 0
# The trainer's NIC: a token bucket of RATE (a burst of 256 KiB holds a
# 64 KiB segmentation-offload packet several times over).
ip netns exec "${hosts[2]}" tc qdisc add dev eth0 root tbf rate "$rate" burst 256kb latency 200ms
export REFIT_SECRET="delta-netns-bench-$$-$RANDOM"  # the coordinator listens on a network address

# One job: coordinator, engine rank 0, trainer rank 0 on three hosts; the
# report in $dir/$1.json. Further arguments go to both ranks.
job() {
  local name=$1
  shift
  rm -f "$dir/port"
  local common=(--trainer-ranks 1 --engine-ranks 1 --setup-timeout 120 --timeout 600)
  in_ns 0 "$build/refit" coordinator --listen "$(addr 0):0" --port-file "$dir/port" --report "$dir/$name.json" \
    --refits "$refits" --seed 1 --quiet "${common[@]}" 2>"$dir/coordinator.err" &
  pids=($!)
  for _ in $(seq 1000); do [[ -s $dir/port ]] && break; sleep 0.01; done
  local rank=(--coordinator "$(addr 0):$(cat "$dir/port")" --model "$model" --layers "$layers" --transport "$transport"
              "${common[@]}" "$@")
  in_ns 1 "$build/refit" engine --rank 0 --listen-host "$(addr 1)" "${rank[@]}" 2>"$dir/engine.err" &
  pids+=($!)
  in_ns 2 "$build/refit" trainer --rank 0 "${rank[@]}" 2>"$dir/trainer.err" &
  pids+=($!)
  if ! wait "${pids[@]}"; then
    echo "delta_netns_bench: the job $name failed" >&2
    tail -n 5 "$dir"/*.err >&2
    exit 1
  fi
  pids=()
}

for f in $fractions; do
  job "full-$f" --change-fraction "$f"
  job "delta-$f" --change-fraction "$f" --delta
done
bytes=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["bytes_per_refit"])' \
  "$dir/full-$(echo "$fractions" | awk '{print $1}').json")

# The link alone: a socket stream of the refit's bytes, engine host = sink.
measure_link 2 1 "$bytes"

python3 - "$dir" "$rate" "$model" "$layers" "$fractions" "$transport" <<'PY'
import json, statistics, sys
d, rate, model, layers, fractions = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5].split()
transport = sys.argv[6]
link = json.load(open(f"{d}/link.json"))
for f in fractions:
    full, delta = (json.load(open(f"{d}/{k}-{f}.json")) for k in ("full", "delta"))
    for r in (full, delta):
        assert r["verified"], r.get("error")
    later = lambda r, key: statistics.median(x[key] for x in r["refits"][1:])
    row = {"transport": transport, "rate": rate, "model": model, "layers": layers, "change_fraction": float(f),
           "bytes_per_refit": full["bytes_per_refit"],
           "full_wire_bytes": later(full, "wire_bytes"), "delta_wire_bytes": later(delta, "wire_bytes"),
           "full_s": later(full, "seconds"), "delta_s": later(delta, "seconds"),
           "delta_encodings": delta["refits"][-1].get("encodings"),
           "link_gbps": link["median_gbps"], "link_s_full_bytes": full["bytes_per_refit"] / (link["median_gbps"] * 1e9)}
    row["delta_to_full_s"] = row["delta_s"] / row["full_s"]
    row["delta_to_full_wire"] = row["delta_wire_bytes"] / row["full_wire_bytes"]
    print(json.dumps(row))
    print(f"F={f}: full {row['full_s']:.3f} s, delta {row['delta_s']:.3f} s = {row['delta_to_full_s']:.3f}x "
          f"(wire {row['delta_to_full_wire']:.3f}x); the link moves the full bytes in {row['link_s_full_bytes']:.3f} s "
          f"({row['link_gbps']:.3f} GB/s)", file=sys.stderr)
PY
