# Sourced by the network-namespace benchmarks (ucx_netns_bench.sh,
# delta_netns_bench.sh): "hosts" made of network namespaces, each with one
# veth (eth0, $subnet.<i+1>/24) in a bridge of a hub namespace, removed on
# exit with whatever the caller started. Needs root and iproute2.
#
#   netns_hosts PREFIX SUBNET N   makes hosts[0..N-1] and the hub
#   addr I                        host I's address
#   in_ns I CMD...                runs CMD in host I
#   pids+=(PID)                   killed on exit; $dir is removed on exit
#   measure_link SRC DST BYTES    the link alone: a plain TCP stream of BYTES
#                                 from host SRC to host DST (ucx_linkbench
#                                 --mode socket, 3 reps) into $dir/link.json
netns_hosts() {
  local p=$1 i ns
  subnet=$2
  hub=${p}hub
  hosts=()
  for ((i = 0; i < $3; i++)); do hosts+=("${p}h$i"); done
  trap netns_cleanup EXIT
  ip netns add "$hub"
  ip -n "$hub" link add br0 type bridge
  ip -n "$hub" link set br0 up
  for i in "${!hosts[@]}"; do
    ns=${hosts[$i]}
    ip netns add "$ns"
    ip link add eth0 netns "$ns" type veth peer name "p$i" netns "$hub"
    ip -n "$hub" link set "p$i" master br0
    ip -n "$hub" link set "p$i" up
    ip -n "$ns" addr add "$(addr "$i")/24" dev eth0
    ip -n "$ns" link set eth0 up  # lo stays down: nothing may take 127.0.0.1 for another host
  done
}
addr() { echo "$subnet.$(($1 + 1))"; }
in_ns() { local i=$1; shift; ip netns exec "${hosts[$i]}" "$@"; }
measure_link() {
  local src=$1 dst=$2 bytes=$3 sink
  rm -f "$dir/lport"
  in_ns "$dst" "$build/ucx_linkbench" sink --listen "$(addr "$dst")" --port-file "$dir/lport" &
  sink=$!
  for _ in $(seq 1000); do [[ -s $dir/lport ]] && break; sleep 0.01; done
  in_ns "$src" "$build/ucx_linkbench" source --connect "$(addr "$dst"):$(cat "$dir/lport")" --mode socket \
    --bytes "$bytes" --reps 3 >"$dir/link.json"
  wait "$sink"
}
pids=()
netns_cleanup() {
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  for ns in "${hosts[@]}" "$hub"; do ip netns del "$ns" 2>/dev/null || true; done
  [[ -n ${dir:-} ]] && rm -rf "$dir"
}
