#!/usr/bin/env bash
# Many engines over rate-limited links (issue 18): one trainer rank and E
# engines of one rank, each on a "host" of its own (network namespaces)
# whose NIC is a tc token bucket of RATE each way (egress of its veth, and
# of its bridge port towards it). Relayed (`--engines E`, a chain: every
# link carries each byte once) against naive fan-out (E separate jobs at
# once, every engine fed by its own trainer process on the trainer's host,
# so the trainer's NIC carries every byte E times), beside the link's own
# rate measured in the same run (a plain TCP stream of the refit's bytes,
# bench/ucx_linkbench.cc). Made here, removed on exit. Needs root,
# iproute2 and tc.
#
# Usage: sudo bench/engines_netns_bench.sh [build dir] > rows.jsonl
#   RATE (400mbit) MODEL (tiny) LAYERS (-1) REFITS (4) ENGINES ("1 4 8")
#   BUCKET (1MiB): relays pipeline per bucket, so a chain of E engines takes
#   about (B + E - 1) / B of one engine's time for B buckets per refit
# One JSON row per engine count on stdout: the median seconds of refits
# 2..REFITS relayed and fanned out, each over the relayed time of 1 engine;
# a summary on stderr.
set -euo pipefail
build=$(cd "${1:-build}" && pwd)
rate=${RATE:-400mbit} model=${MODEL:-tiny} layers=${LAYERS:--1} refits=${REFITS:-4} bucket=${BUCKET:-1MiB}
counts=${ENGINES:-1 4 8}
[[ $(id -u) -eq 0 ]] || { echo "engines_netns_bench: needs root (network namespaces)" >&2; exit 1; }
for b in refit ucx_linkbench; do [[ -x $build/$b ]] || { echo "engines_netns_bench: no $build/$b" >&2; exit 1; }; done
most=$(echo "$counts" | tr ' ' '\n' | sort -n | tail -1)

dir=$(mktemp -d /tmp/refit-engines-bench-XXXXXX)
source "$(dirname "$0")/netns_hosts.sh"
netns_hosts rfe$$ 10.216.0 $((most + 2))  # coordinator, trainer, engines 0..most-1
for i in "${!hosts[@]}"; do
  [[ $i -eq 0 ]] && continue  # the coordinator's control traffic is not shaped
  ip netns exec "${hosts[$i]}" tc qdisc add dev eth0 root tbf rate "$rate" burst 256kb latency 200ms
  ip netns exec "$hub" tc qdisc add dev "p$i" root tbf rate "$rate" burst 256kb latency 200ms
done
export REFIT_SECRET="engines-netns-bench-$$-$RANDOM"  # the coordinator listens on a network address
common=(--trainer-ranks 1 --engine-ranks 1 --setup-timeout 120 --timeout 900)

# A coordinator on host 0 for `name` with further flags; its port in $dir/name.port.
coordinator() {
  local name=$1
  shift
  in_ns 0 "$build/refit" coordinator --listen "$(addr 0):0" --port-file "$dir/$name.port" \
    --report "$dir/$name.json" --refits "$refits" --seed 1 --quiet "${common[@]}" "$@" 2>"$dir/$name.err" &
  pids+=($!)
  for _ in $(seq 1000); do [[ -s $dir/$name.port ]] && break; sleep 0.01; done
}
rank_flags() {
  echo --coordinator "$(addr 0):$(cat "$dir/$1.port")" --model "$model" --layers "$layers" --transport tcp \
    --bucket-size "$bucket" "${common[@]}"
}
await() {
  if ! wait "${pids[@]}"; then
    echo "engines_netns_bench: a job of $1 failed" >&2
    tail -n 5 "$dir"/*.err >&2
    exit 1
  fi
  pids=()
}

# Relayed: one job of E engines, engine k on host k + 2.
relayed() {
  local e=$1 name="relay-$1" k
  coordinator "$name" --engines "$e"
  for ((k = 0; k < e; k++)); do
    # shellcheck disable=SC2046
    in_ns $((k + 2)) "$build/refit" engine --rank 0 --engine "$k" --listen-host "$(addr $((k + 2)))" \
      $(rank_flags "$name") 2>"$dir/$name.engine$k.err" &
    pids+=($!)
  done
  # shellcheck disable=SC2046
  in_ns 1 "$build/refit" trainer --rank 0 $(rank_flags "$name") 2>"$dir/$name.trainer.err" &
  pids+=($!)
  await "$name"
}

# Naive fan-out: E jobs at once, each a trainer on host 1 and one engine.
fanned() {
  local e=$1 k
  for ((k = 0; k < e; k++)); do coordinator "fan-$e-$k"; done
  for ((k = 0; k < e; k++)); do
    # shellcheck disable=SC2046
    in_ns $((k + 2)) "$build/refit" engine --rank 0 --listen-host "$(addr $((k + 2)))" $(rank_flags "fan-$e-$k") \
      2>"$dir/fan-$e-$k.engine.err" &
    pids+=($!)
    # shellcheck disable=SC2046
    in_ns 1 "$build/refit" trainer --rank 0 $(rank_flags "fan-$e-$k") 2>"$dir/fan-$e-$k.trainer.err" &
    pids+=($!)
  done
  await "fan-out $e"
}

for e in $counts; do
  relayed "$e"
  [[ $e -gt 1 ]] && fanned "$e"
done
bytes=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["bytes_per_refit"])' "$dir/relay-1.json")
measure_link 1 2 "$bytes"  # trainer host -> engine 0's host

python3 - "$dir" "$rate" "$model" "$layers" "$counts" "$bucket" <<'PY'
import json, statistics, sys
d, rate, model, layers, counts, bucket = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5].split(), sys.argv[6]
link = json.load(open(f"{d}/link.json"))
later = lambda r: statistics.median(x["seconds"] for x in r["refits"][1:])
def load(name):
    r = json.load(open(f"{d}/{name}.json"))
    assert r["verified"], (name, r.get("error"))
    return r
one = later(load("relay-1"))
for e in map(int, counts):
    relay = load(f"relay-{e}")
    row = {"rate": rate, "model": model, "layers": layers, "bucket_size": bucket, "engines": e,
           "bytes_per_refit": relay["bytes_per_refit"],
           "relay_s": later(relay), "one_engine_s": one, "trainer_link_bytes": relay["refits"][-1]["trainer_link_bytes"],
           "wire_bytes": relay["refits"][-1]["wire_bytes"], "link_gbps": link["median_gbps"],
           "link_s": relay["bytes_per_refit"] / (link["median_gbps"] * 1e9)}
    row["relay_to_one"] = row["relay_s"] / one
    if e > 1:
        fans = [later(load(f"fan-{e}-{k}")) for k in range(e)]
        row["fanout_s"] = max(fans)
        row["fanout_to_one"] = row["fanout_s"] / one
    print(json.dumps(row))
    fan = f", naive fan-out {row['fanout_s']:.3f} s = {row['fanout_to_one']:.2f}x" if e > 1 else ""
    print(f"E={e}: relayed {row['relay_s']:.3f} s = {row['relay_to_one']:.3f}x of one engine{fan}; the link moves "
          f"the bytes in {row['link_s']:.3f} s ({row['link_gbps']:.4f} GB/s)", file=sys.stderr)
PY
