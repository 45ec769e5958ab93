#!/usr/bin/env bash
# Cross-GPU refits on one host with two GPUs (issue 8), results under $OUT.
#
# For each preset (llama3-8b, all layers; qwen3-30b-a3b, 24 layers), transport
# (cuda_ipc, nccl) and mode (staged, direct), as separate coordinator,
# trainer and engine processes, every byte verified by the engine ranks:
#   tp2   2 trainer ranks, 2 engine ranks on GPUs 0 and 1 (--base-gpu-id 0);
#         trainer rank r feeds engine rank r and sits on the OTHER GPU
#         (--gpu 1-r), so every byte crosses the GPU-to-GPU link both ways.
#   tp1   1 trainer rank on GPU 0, 1 engine rank on GPU 1 (--base-gpu-id 1).
#   tp2x  (4 GPUs) 2 trainer ranks on GPUs 0 and 1, 2 engine ranks on GPUs 2
#         and 3 (--base-gpu-id 2): trainers and engines on GPUs of their own.
#   tp4   (4 GPUs) 4 engine ranks on GPUs 0..3, trainer rank r on GPU (r+2)%4.
#   rule7 (llama3-8b only) tp1 with the engine under CUDA_VISIBLE_DEVICES=<GPU 1>
#         and --base-gpu-id 0 (DESIGN.md rule 7: a local index), and the
#         same engine with --base-gpu-id 1 (the physical id) must be refused.
#   relay (issue 23 item 1) one trainer rank on GPU 0 feeding engine 0 of a
#         chain of RELAY_ENGINES engines of TP 1 (default: one per other GPU,
#         at least 2), engine k on GPU 1 + k % (G - 1); its time beside tp1's
#         (one engine) in the table.
#   relay_kill  relay with --min-engines E-1 and engine 1 (the last engine
#         when E = 2) killed at its go of refit 2 (--debug-fault go:2:kill):
#         verified when it is the one engine lost and every other engine
#         holds every version.
#   relay_tp2  (4 GPUs) trainer ranks on GPUs 0, 1 feeding engine 0 of TP 2 on
#         GPUs 2, 3, which relays to engine 1 on GPUs 0, 1 (4, 5 with 6 GPUs).
#   fsdp_same, fsdp_own  (issue 23 item 2) FSDP trainer ranks (--trainer-layout
#         fsdp), one per GPU, into engines of another TP size on the same
#         GPUs (G trainers -> TP G/2, or TP 1 with 2 GPUs) or on a GPU of
#         their own (G-1 trainers -> TP 1 on GPU G-1, 3+ GPUs); the ceiling
#         copies over every trainer-to-engine GPU pair at once.
#   fp8   (issue 23 item 3) tp1 with --quantize fp8-block128: bf16 weights on
#         GPU 0 into an FP8 engine on GPU 1; its ceiling is the peer copy of
#         the FP8 bytes (bytes_per_refit).
# Topologies that need more GPUs than there are (G: nvidia-smi's count, or
# GPUS) are skipped and said so.
# Each job's figure is the median GB/s of refits 2..N (the coordinator's
# timing); its ceiling is `refit ceiling --kind peer` over the same bytes,
# measured in this run once the job's processes exited: one way (0 -> 1) for
# tp1/rule7, both ways at once (half each way) for tp2, whose trainers feed
# the other GPU in both directions, and every trainer GPU -> engine GPU pair at
# once (`--pairs`) for tp2x and tp4. tp2 lines carry the one-way figure too.
#
# Output ($OUT, default /tmp/refit-multi-gpu-out): gpu.txt (nvidia-smi),
# multi_gpu.jsonl (one JSON line per job), multi_gpu.log (one line per job),
# failures.log (short stderr tails of failed jobs), table.md
# (bench/multi_gpu_table.py). Exit status 0 when every job verified.
#
# Binaries: $CARRY (default .devcarry) holds refit and its libraries (see
# docs/PERF.md "Reproducing"); REFIT_BINARY overrides the refit path.
# Env: MODELS ("preset:layers ..."), TRANSPORTS, MODES, TOPOLOGIES
# ("tp2 tp1 rule7"), REFITS (4), BUCKET (1GiB), POOL (3 staged pool slots),
# LIMIT (seconds per process, 90), BUDGET (seconds for all jobs, 360: later
# jobs are skipped and said so), RELAY_ENGINES, GPUS.
# SELFTEST=cpu runs the same orchestration on the CPU (tiny, shm, memcpy
# ceiling; GPUS=4 unless set) to check the script itself on a machine
# without GPUs.
set -uo pipefail

carry=${CARRY:-.devcarry}
refit=${REFIT_BINARY:-$PWD/$carry/refit}
out=${OUT:-/tmp/refit-multi-gpu-out}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$out"
[[ -d $carry ]] && export LD_LIBRARY_PATH="$PWD/$carry:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0             # the device notes require it
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
refits=${REFITS:-4}
bucket=${BUCKET:-1GiB}
pool=${POOL:-3}
limit=${LIMIT:-90}
budget=${BUDGET:-360}
selftest=${SELFTEST:-}
device=cuda
if [[ $selftest == cpu ]]; then
  device=cpu
  : "${MODELS:=tiny:-1}" "${TRANSPORTS:=shm}" "${BUCKET:=4MiB}" "${MODES:=staged}"
  bucket=${BUCKET}
fi
models=${MODELS:-llama3-8b:-1 qwen3-30b-a3b:24}
transports=${TRANSPORTS:-cuda_ipc nccl}
modes=${MODES:-staged direct}
topologies=${TOPOLOGIES:-tp2 tp1 rule7}
log=$out/multi_gpu.log
jsonl=$out/multi_gpu.jsonl
failures=$out/failures.log
: >"$log"
: >"$jsonl"
: >"$failures"

say() { echo "multi_gpu: $*" | tee -a "$log" >&2; }
die() {
  say "$*"
  exit 2
}

# ---- preflight: fail fast, saying why --------------------------------------
[[ -x $refit ]] || die "no refit binary at $refit (build it and copy it into $carry/, or set REFIT_BINARY)"
"$refit" --help >/dev/null 2>"$out/preflight.err" ||
  die "$refit does not run: $(head -c 400 "$out/preflight.err")"
rm -f "$out/preflight.err"
command -v python3 >/dev/null || die "python3 is needed (stdlib only)"
# The physical GPU that local device 1 names for the rule-7 run: the second
# entry of our own CUDA_VISIBLE_DEVICES when it is set, else GPU 1.
gpu1=1
if [[ -n ${CUDA_VISIBLE_DEVICES+x} ]]; then
  IFS=, read -ra visible <<<"$CUDA_VISIBLE_DEVICES"
  gpu1=${visible[1]:-}
  gpu1=${gpu1// /}
fi
if [[ $device == cuda ]]; then
  if command -v nvidia-smi >/dev/null; then
    { nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,memory.total --format=csv,noheader
      nvidia-smi topo -m; } >"$out/gpu.txt" 2>&1
  fi
  # One small peer copy: says clearly when there are not two GPUs.
  probe=$(timeout -k 5 60 "$refit" ceiling --kind peer --bytes 64MiB --from 0 --to 1 2>&1) ||
    die "needs two visible CUDA devices with this refit build; refit ceiling --kind peer says: ${probe:0:400}"
  say "peer probe (64 MiB, 0 -> 1): $probe"
  [[ -n $gpu1 ]] || die "CUDA_VISIBLE_DEVICES=\"$CUDA_VISIBLE_DEVICES\" has no second entry for the rule-7 run"
else
  echo "SELFTEST=cpu: no GPU used" >"$out/gpu.txt"
fi
gpus=${GPUS:-}
if [[ -z $gpus ]]; then
  if [[ $device == cpu ]]; then
    gpus=4
  elif [[ -n ${CUDA_VISIBLE_DEVICES:-} ]]; then
    IFS=, read -ra visible_all <<<"$CUDA_VISIBLE_DEVICES"
    gpus=${#visible_all[@]}
  else
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  fi
fi
relay_engines=${RELAY_ENGINES:-$((gpus - 1 > 2 ? gpus - 1 : 2))}
# needs_gpus TOPOLOGY: the GPUs it places ranks on.
needs_gpus() {
  case $1 in
    tp2x | tp4 | relay_tp2) echo 4 ;;
    fsdp_own) echo 3 ;;
    *) echo 2 ;;
  esac
}

# ---- ceilings, measured once per (bytes, direction) in this run ------------
declare -A ceilings
# ceiling BYTES oneway|bothways -> prints the ceiling's JSON line ({} when it failed).
ceiling() {
  local key="$1:$2"
  if [[ -z ${ceilings[$key]:-} ]]; then
    local args=(--kind peer --bytes "$1" --from 0 --to 1)
    [[ $2 == bothways ]] && args+=(--both-ways)
    [[ $2 == pairs:* ]] && args=(--kind peer --bytes "$1" --pairs "${2#pairs:}")
    [[ $device == cpu ]] && args=(--kind memcpy --bytes "$1")
    local line
    line=$(timeout -k 5 60 "$refit" ceiling "${args[@]}" 2>>"$failures") || line=
    [[ -n $line ]] || line='{}'
    ceilings[$key]=$line
  fi
  echo "${ceilings[$key]}"
}

# Samples each GPU's used memory (MiB) every 250 ms into $1 until killed.
start_sampler() {
  sampler_pid=
  [[ $device == cuda ]] && command -v nvidia-smi >/dev/null || return 0
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 250 >"$1" 2>/dev/null &
  sampler_pid=$!
}
stop_sampler() {
  [[ -n ${sampler_pid:-} ]] || return 0
  kill "$sampler_pid" 2>/dev/null
  wait "$sampler_pid" 2>/dev/null
  sampler_pid=
}

# job NAME MODEL LAYERS TRANSPORT MODE TOPOLOGY: one refit job, one JSON line.
ok_all=1
job() {
  local name=$1 model=$2 layers=$3 transport=$4 mode=$5 topo=$6
  if ((SECONDS > budget)); then
    say "$name: skipped (the ${budget} s budget is spent: ${SECONDS} s)"
    ok_all=0
    python3 -c 'import json,sys; print(json.dumps({"name": sys.argv[1], "skipped": True}))' "$name" >>"$jsonl"
    return
  fi
  local work t0=$SECONDS
  work=$(mktemp -d /tmp/refit-multi-gpu-XXXXXX)
  # engines: ranks per engine (TP); replicas: engines (--engines), engine k's
  # ranks from GPU bases[k] on; victim: the engine killed at its go of refit 2.
  local engines trainers base engine_env=() trainer_gpus=() engine_visible="(unset)" pairs=""
  local replicas=1 bases=() coord_extra=() rank_extra=() trainer_extra=() victim="" t
  case $topo in
    tp2) engines=2 trainers=2 base=0 trainer_gpus=(1 0) ;;
    tp1) engines=1 trainers=1 base=1 trainer_gpus=(0) ;;
    tp2x) engines=2 trainers=2 base=2 trainer_gpus=(0 1) pairs="0:2,1:3" ;;
    tp4) engines=4 trainers=4 base=0 trainer_gpus=(2 3 0 1) pairs="2:0,3:1,0:2,1:3" ;;
    rule7)
      engines=1 trainers=1 base=0 trainer_gpus=(0)
      engine_env=(env "CUDA_VISIBLE_DEVICES=$gpu1")
      engine_visible=$gpu1
      ;;
    relay | relay_kill)
      # One trainer on GPU 0, $relay_engines engines of TP 1 on GPUs 1..G-1
      # (round robin when there are more engines than GPUs), a chain.
      engines=1 trainers=1 base=1 trainer_gpus=(0) replicas=$relay_engines
      local k
      for ((k = 0; k < replicas; k++)); do bases+=($((1 + k % (gpus - 1)))); done
      if [[ $topo == relay_kill ]]; then
        victim=$((replicas > 2 ? 1 : replicas - 1))
        coord_extra=(--min-engines $((replicas - 1)))
      fi
      ;;
    relay_tp2)
      # Two trainer ranks on GPUs 0, 1; engine 0 on GPUs 2, 3; engine 1 on
      # GPUs 4, 5, or with 4 GPUs on 0, 1 beside the trainers.
      engines=2 trainers=2 base=2 trainer_gpus=(0 1) replicas=2 bases=(2 $((gpus >= 6 ? 4 : 0))) pairs="0:2,1:3"
      ;;
    fp8) engines=1 trainers=1 base=1 trainer_gpus=(0) rank_extra=(--quantize fp8-block128) ;;
    fsdp_same | fsdp_own)
      # (issue 23 item 2) FSDP trainer ranks (dim-0 chunks, --trainer-layout
      # fsdp), one per GPU, into engines of another TP size: fsdp_same, G
      # trainers on every GPU into TP G/2 (1 with 2 GPUs) on GPUs 0.. ;
      # fsdp_own, G-1 trainers on GPUs 0..G-2 into TP 1 on GPU G-1. The
      # ceiling: every trainer GPU to every engine GPU at once (--pairs).
      trainer_extra=(--trainer-layout fsdp)
      if [[ $topo == fsdp_same ]]; then
        trainers=$gpus engines=$((gpus >= 4 ? gpus / 2 : 1)) base=0
      else
        trainers=$((gpus - 1)) engines=1 base=$((gpus - 1))
      fi
      trainer_gpus=()
      for ((t = 0; t < trainers; t++)); do trainer_gpus+=("$t"); done
      local e2 p=()
      for ((t = 0; t < trainers; t++)); do
        for ((e2 = 0; e2 < engines; e2++)); do p+=("$t:$((base + e2))"); done
      done
      pairs=$(IFS=,; echo "${p[*]}")
      ;;
  esac
  ((${#bases[@]})) || bases=("$base")
  [[ $engine_visible == "(unset)" && -n ${CUDA_VISIBLE_DEVICES+x} ]] && engine_visible=$CUDA_VISIBLE_DEVICES
  local common=(--trainer-ranks "$trainers" --engine-ranks "$engines" --model "$model" --layers "$layers"
    --transport "$transport" --device "$device" --mode "$mode" --bucket-size "$bucket"
    --setup-timeout 60 --timeout 60)
  common+=("${rank_extra[@]}")
  ((replicas > 1)) && coord_extra+=(--engines "$replicas")
  timeout -k 5 "$limit" "$refit" coordinator --refits "$refits" --trainer-ranks "$trainers" --engine-ranks "$engines" \
    --setup-timeout 60 --timeout 60 --port-file "$work/port" --report "$work/report.json" --quiet \
    "${coord_extra[@]}" 2>"$work/coordinator.err" &
  local pids=($!) names=(coordinator)
  for _ in $(seq 100); do [[ -s $work/port ]] && break; sleep 0.1; done
  local address=127.0.0.1:$(cat "$work/port" 2>/dev/null)
  start_sampler "$work/mem.csv"
  local e k
  for ((k = 0; k < replicas; k++)); do
    local own=() tag=""
    ((replicas > 1)) && own=(--engine "$k") tag="$k-"
    [[ $k == "$victim" ]] && own+=(--debug-fault go:2:kill)
    for ((e = 0; e < engines; e++)); do
      "${engine_env[@]}" timeout -k 5 "$limit" "$refit" engine --coordinator "$address" --rank "$e" "${common[@]}" \
        "${own[@]}" --base-gpu-id "${bases[$k]}" --pool-slots "$pool" 2>"$work/engine-$tag$e.err" &
      pids+=($!) names+=("engine-$tag$e")
    done
  done
  for ((t = 0; t < trainers; t++)); do
    timeout -k 5 "$limit" "$refit" trainer --coordinator "$address" --rank "$t" "${common[@]}" \
      "${trainer_extra[@]}" --gpu "${trainer_gpus[$t]}" 2>"$work/trainer-$t.err" &
    pids+=($!) names+=("trainer-$t")
  done
  # Wait for every process; once one failed, give the others 5 s to fail on
  # their own (they name the cause), then end them (a rank that failed at
  # setup would leave the rest waiting for the setup deadline).
  local i rc running=${#pids[@]} grace_until=0 codes=()
  while ((running > 0)); do
    for i in "${!pids[@]}"; do
      [[ -n ${codes[$i]:-} ]] && continue
      kill -0 "${pids[$i]}" 2>/dev/null && continue
      wait "${pids[$i]}"
      rc=$?
      codes[$i]=$rc
      running=$((running - 1))
      # (the victim of relay_kill exits by its fault: the others go on)
      ((rc != 0 && grace_until == 0)) && [[ ${names[$i]} != "engine-$victim-0" ]] && grace_until=$((SECONDS + 5))
    done
    if ((grace_until > 0 && SECONDS >= grace_until)); then
      for i in "${!pids[@]}"; do [[ -z ${codes[$i]:-} ]] && kill "${pids[$i]}" 2>/dev/null; done
    fi
    ((running > 0)) && sleep 0.2
  done
  local exits=()
  for i in "${!pids[@]}"; do exits+=("${names[$i]}=${codes[$i]}"); done
  stop_sampler
  local job_wall=$((SECONDS - t0))  # the processes only, not the ceilings below
  local bytes dir=oneway
  bytes=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("bytes_per_refit", 0))' \
    "$work/report.json" 2>/dev/null || echo 0)
  [[ $topo == tp2 ]] && dir=bothways
  [[ -n $pairs ]] && dir="pairs:$pairs"
  local primary='{}' oneway='{}'
  if [[ $bytes != 0 ]]; then
    primary=$(ceiling "$bytes" "$dir")
    [[ $topo == tp2 ]] && oneway=$(ceiling "$bytes" oneway)
  fi
  # One JSON line into $jsonl, one summary line on stdout; exit 1 unless verified.
  if ! python3 - "$work" "$name" "$model" "$layers" "$transport" "$mode" "$topo" "$bucket" "$pool" \
    "${trainer_gpus[*]}" "$base" "$engine_visible" "$primary" "$oneway" "$job_wall" "${exits[*]}" \
    "$jsonl" "$replicas" "${bases[*]}" "$victim" "${rank_extra[*]}" "$engines" "${trainer_extra[*]}" <<'PY' | tee -a "$log" >&2; then
import json, os, statistics, sys
(work, name, model, layers, transport, mode, topo, bucket, pool, tgpus, base, visible,
 primary, oneway, wall, exits, jsonl, replicas, bases, victim, rank_extra, engine_ranks,
 trainer_extra) = sys.argv[1:]
try:
    report = json.load(open(os.path.join(work, "report.json")))
except Exception as e:
    report = {"verified": False, "error": f"no coordinator report ({e})"}
rates = [r.get("gbps", 0.0) for r in report.get("refits", [])]
steady = rates[1:] if len(rates) > 1 else rates
median = statistics.median(steady) if steady else 0.0
exit_codes = {k: int(v) for k, v in (x.split("=") for x in exits.split())}
victim_name = f"engine-{victim}-0" if victim else None
failed = {k: v for k, v in exit_codes.items() if v != 0 and k != victim_name}
every_refit = len(rates) > 0 and all(r.get("verified") for r in report.get("refits", []))
verified = bool(report.get("verified")) and every_refit and not failed
engines_report = report.get("engines") or []
if victim:  # relay_kill: the victim is lost in refit 2, every other engine has every version
    lost = [e.get("engine") for e in engines_report if e.get("lost")]
    full = list(range(1, len(rates) + 1)) if rates else []
    others = [e.get("versions") == full for e in engines_report if e.get("engine") != int(victim)]
    verified = verified and lost == [int(victim)] and all(others) and len(others) == int(replicas) - 1
def parse(text):
    try:
        return json.loads(text)
    except ValueError:
        return {}
c, c1 = parse(primary), parse(oneway)
peak = {}
try:
    for row in open(os.path.join(work, "mem.csv")):
        idx, used = [x.strip() for x in row.split(",")[:2]]
        peak[idx] = max(peak.get(idx, 0.0), float(used) / 1024)
except (OSError, ValueError):
    pass
if c.get("ceiling") == "peer" and c.get("pairs"):
    ceiling = "peer pairs " + ",".join(f"{a}->{b}" for a, b in c["pairs"])
elif c.get("ceiling") == "peer":
    ceiling = "peer both ways" if c.get("both_ways") else f"peer {c.get('from')}->{c.get('to')}"
else:
    ceiling = c.get("ceiling", "none")
line = {
    "name": name, "model": model, "layers": int(layers), "topology": topo, "transport": transport,
    "mode": mode, "bucket": bucket, "pool_slots": int(pool) if mode == "staged" else None,
    "trainer_gpus": [int(g) for g in tgpus.split()], "engine_ranks": int(engine_ranks),
    "engine_base_gpu_id": int(base), "engine_cuda_visible_devices": visible,
    "verified": verified, "bytes": report.get("bytes_per_refit", 0), "refit_gbps": rates,
    "median_gbps": median, "ceiling": ceiling, "ceiling_gbps": c.get("gbps", 0.0),
    "ratio": median / c["gbps"] if c.get("gbps") else 0.0, "peer_access": c.get("peer_access"),
    "peak_gpu_mem_gib": {k: round(v, 1) for k, v in sorted(peak.items())},
    "wall_s": int(wall), "exit_codes": exit_codes,
}
if int(replicas) > 1:
    line["engines"] = int(replicas)
    line["engine_base_gpu_ids"] = [int(b) for b in bases.split()]
    line["engine_versions"] = {str(e.get("engine")): e.get("versions") for e in engines_report}
    line["trainer_link_bytes"] = [r.get("trainer_link_bytes") for r in report.get("refits", [])]
if victim:
    line["killed_engine"] = int(victim)
    line["lost"] = [e.get("lost") for e in engines_report if e.get("lost")]
if rank_extra:
    line["rank_flags"] = rank_extra
if trainer_extra:
    line["trainer_flags"] = trainer_extra
if c1:
    line["ceiling_one_way_gbps"] = c1.get("gbps", 0.0)
    line["ratio_one_way"] = median / c1["gbps"] if c1.get("gbps") else 0.0
if failed:  # first: a process that failed is the cause; the report (if any) says what it saw
    line["error"] = ("processes failed: " + ", ".join(f"{k} exited {v}" for k, v in failed.items()) +
                     (f"; coordinator: {report['error']}" if report.get("error") else ""))[:300]
elif report.get("error"):
    line["error"] = str(report["error"])[:300]
elif not verified:
    line["error"] = "not every refit verified"
with open(jsonl, "a") as f:
    f.write(json.dumps(line) + "\n")
print(f"{name:<34} verified={verified} median={median:7.1f} GB/s ({' '.join(f'{g:.0f}' for g in rates)}) "
      f"{ceiling}={line['ceiling_gbps']:7.1f} ratio={line['ratio']:.2f} {wall}s mem={line['peak_gpu_mem_gib']} "
      f"{line.get('error', '')[:200]}")
sys.exit(0 if verified else 1)
PY
    ok_all=0
    {
      echo "== $name (${exits[*]})"
      for f in "$work"/*.err; do
        [[ -s $f ]] || continue
        echo "-- $(basename "$f")"
        grep -v "warning: no secret" "$f" | tail -n 6 | cut -c1-300
      done
    } >>"$failures"
  fi
  rm -rf "$work"
}

# rule7_refused: the engine under CUDA_VISIBLE_DEVICES=<GPU 1> given the
# physical id (--base-gpu-id 1) must fail before joining, naming the rule.
rule7_refused() {
  ((SECONDS > budget)) && return
  local err rc
  err=$(CUDA_VISIBLE_DEVICES=$gpu1 timeout -k 5 30 "$refit" engine --coordinator 127.0.0.1:1 --rank 0 \
    --engine-ranks 1 --model tiny --device cuda --transport cuda_ipc --base-gpu-id 1 --setup-timeout 5 2>&1 >/dev/null)
  rc=$?
  python3 - "$rc" "$err" "$gpu1" "$jsonl" <<'PY' | tee -a "$log" >&2 || ok_all=0
import json, sys
rc, err, gpu1, jsonl = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
ok = rc == 1 and "not a visible device" in err
line = {"name": "rule7-physical-id-refused", "topology": "rule7-refused", "verified": ok,
        "engine_cuda_visible_devices": gpu1, "engine_base_gpu_id": 1, "exit_code": rc,
        "message": err.strip()[-300:]}
with open(jsonl, "a") as f:
    f.write(json.dumps(line) + "\n")
print(f"rule7-physical-id-refused          verified={ok} (exit {rc}): {line['message'][-160:]}")
sys.exit(0 if ok else 1)
PY
}

# ---- the jobs ---------------------------------------------------------------
say "refits=$refits bucket=$bucket pool=$pool limit=${limit}s budget=${budget}s device=$device gpus=$gpus relay_engines=$relay_engines NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE"
for spec in $models; do
  model=${spec%%:*}
  layers=${spec#*:}
  for topo in $topologies; do
    if (($(needs_gpus "$topo") > gpus)); then
      say "$model-$topo: skipped ($(needs_gpus "$topo") GPUs needed, $gpus here)"
      continue
    fi
    [[ $topo == rule7 && $model != "${models%%:*}" ]] && continue  # rule 7: the first model only
    [[ $topo == rule7 && $device == cuda ]] && rule7_refused
    for transport in $transports; do
      for mode in $modes; do
        [[ $topo == rule7 && $mode == staged ]] && continue  # one mode is enough to show placement
        [[ $topo == relay* && $mode == direct ]] && continue  # relays carry staged buckets only
        [[ $topo == fp8 && $mode == staged && $device == cuda ]] && continue  # issue 23 item 3: direct
        [[ $topo == fsdp* && $transport == nccl ]] && continue  # an nccl pool takes one trainer rank
        job "$model-$topo-$transport-$mode" "$model" "$layers" "$transport" "$mode" "$topo"
      done
    done
  done
done
python3 "$here/multi_gpu_table.py" "$jsonl" >"$out/table.md" || say "table: multi_gpu_table.py failed"
say "done in ${SECONDS} s; $(grep -c '"verified": true' "$jsonl") of $(wc -l <"$jsonl") lines verified, $(grep -c '"skipped": true' "$jsonl") skipped"
((ok_all)) || exit 1
