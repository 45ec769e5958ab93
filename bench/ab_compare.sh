#!/usr/bin/env bash
# Same speed, shown: the same refit bench runs for two builds, interleaved
# (A B, then B A, ...), ROUNDS rounds each, so drift of a noisy machine lands
# on both builds alike. Each run records its own ceiling (device copy or
# memcpy) and the refit's ratio to it; the summary prints per configuration
# the median GB/s and x-ceiling of each build and new/old.
# Usage: bench/ab_compare.sh OLD_DIR NEW_DIR OUT_JSONL CONFIG...
#   OLD_DIR/NEW_DIR hold a `refit` binary (and the libraries it needs)
#   CONFIG  model:layers:mode:bucket[:device[:transport[:ranks]]]
#           e.g. llama3-8b:-1:direct:1GiB:cuda:cuda_ipc  tiny:-1:staged:16MiB:cpu:shm:2
# Env: ROUNDS (5), REFITS (4; the bench's median is over refits 2..N),
#      POOLS (pool slots, 2).
set -uo pipefail
old=$1 new=$2 out=$3
shift 3
rounds=${ROUNDS:-5}
: > "$out"
run_one() {  # build_label dir config round
  local label=$1 dir=$2 cfg=$3 round=$4
  IFS=: read -r model layers mode bucket device transport ranks <<< "$cfg"
  device=${device:-cuda} transport=${transport:-cuda_ipc} ranks=${ranks:-1}
  local tmp
  tmp=$(mktemp -d)
  LD_LIBRARY_PATH="$dir:${LD_LIBRARY_PATH:-}" timeout 300 "$dir/refit" bench --json --device "$device" \
    --transport "$transport" --mode "$mode" --model "$model" --layers "$layers" --engine-ranks "$ranks" \
    --bucket-size "$bucket" --refits "${REFITS:-4}" --pool-slots "${POOLS:-2}" --timeout 120 \
    > "$tmp/report.json" 2> "$tmp/err"
  python3 - "$tmp/report.json" "$label" "$cfg" "$round" "$out" "$tmp/err" <<'PY'
import json, sys
path, label, cfg, rnd, out, err = sys.argv[1:]
try:
    r = json.load(open(path))
except Exception as e:
    print(f"{label} {cfg} round {rnd}: no report ({e}): {open(err).read()[-400:]}")
    sys.exit(0)
b = r.get("bench", {})
row = {"build": label, "config": cfg, "round": int(rnd), "verified": r.get("verified"),
       "gbps": b.get("median_gbps"), "ceiling_gbps": b.get("ceiling_gbps"),
       "x_ceiling": b.get("floor_ratio", b.get("ratio_to_ceiling")), "error": r.get("error")}
open(out, "a").write(json.dumps(row) + "\n")
print(f"{label:4} {cfg:40} round {rnd}: verified={row['verified']} {row['gbps'] or 0:9.1f} GB/s "
      f"ceiling {row['ceiling_gbps'] or 0:9.1f} GB/s  x {row['x_ceiling'] or 0:.3f}")
PY
  rm -rf "$tmp"
}
for ((round = 1; round <= rounds; ++round)); do
  for cfg in "$@"; do
    if ((round % 2)); then
      run_one old "$old" "$cfg" "$round"; run_one new "$new" "$cfg" "$round"
    else
      run_one new "$new" "$cfg" "$round"; run_one old "$old" "$cfg" "$round"
    fi
  done
done
python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
cfgs = list(dict.fromkeys(r["config"] for r in rows))
print(f"{'config':40} {'old GB/s':>9} {'new GB/s':>9} {'old x':>7} {'new x':>7} {'new/old':>8} runs  all verified")
for c in cfgs:
    m = {}
    for b in ("old", "new"):
        rs = [r for r in rows if r["config"] == c and r["build"] == b and r["gbps"]]
        m[b] = (statistics.median(r["gbps"] for r in rs) if rs else 0,
                statistics.median(r["x_ceiling"] for r in rs) if rs else 0, len(rs),
                all(r["verified"] for r in rs))
    ratio = m["new"][0] / m["old"][0] if m["old"][0] else 0
    print(f"{c:40} {m['old'][0]:9.1f} {m['new'][0]:9.1f} {m['old'][1]:7.3f} {m['new'][1]:7.3f} {ratio:8.3f} "
          f"{m['old'][2]}/{m['new'][2]}  {m['old'][3] and m['new'][3]}")
PY
