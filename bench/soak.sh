#!/usr/bin/env bash
# Soak: runs N refits (default 1000) of the `tiny` preset with `refit demo`
# and reports, for the coordinator and every rank process, resident memory
# (VmRSS), open file descriptors (/proc/PID/fd) and shared memory (files of
# /dev/shm mapped by each process, and /dev/shm/refit-* entries of the job)
# at the start (2 s into the job: setup done, the first refits committed)
# and at the end (the last sample, 100 ms apart, while every process runs).
# Fails on growth beyond noise: descriptors, mapped shared memory and
# /dev/shm entries must not grow at all; VmRSS may grow by at most
# max(4 MiB, 5 %) per process (allocator noise; docs/RELIABILITY.md).
#
# Usage: bench/soak.sh [REFITS] [extra `refit demo` flags...]
#   e.g. bench/soak.sh 1000 --transport tcp
# Environment: REFIT (the refit binary; default build-rel/refit, then
# build/refit), SOAK_REPORT (where the JSON report goes; default
# /tmp/refit-soak.json).
set -euo pipefail
cd "$(dirname "$0")/.."
refits=${1:-1000}
shift || true
refit=${REFIT:-}
if [[ -z $refit ]]; then
  for candidate in build-rel/refit build/refit; do
    [[ -x $candidate ]] && { refit=$candidate; break; }
  done
fi
[[ -x ${refit:-} ]] || { echo "soak: no refit binary (build it, or set REFIT=path)" >&2; exit 2; }
report=${SOAK_REPORT:-/tmp/refit-soak.json}

start=$(date +%s%N)
status=0
"$refit" demo --model tiny --refits "$refits" --engine-ranks 2 --json --soak-report "$report" "$@" \
  > "$report.demo.json" || status=$?
end=$(date +%s%N)

# The demo's verdict (every refit verified) and the soak's (no growth).
grep -q '"verified": true' "$report.demo.json" || { echo "soak: the demo failed:" >&2; grep '"error"' "$report.demo.json" >&2 || true; }
printf 'soak: %s refits of tiny in %s s (%s)\n' "$(grep -c '"version"' "$report.demo.json")" \
  "$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", (b - a) / 1e9 }')" "$refit"
# The per-process table, from the soak report (start -> end).
printf '%-16s %12s %12s %8s %8s %8s %8s\n' process "rss start" "rss end" "fd start" "fd end" "shm st" "shm end"
awk '
  /"start": \{/ { sec = "start" } /"end": \{/ { sec = "end" } /"(growth|problems|thresholds)": / { sec = "" }
  /"(coordinator|engine rank [0-9]+|trainer rank [0-9]+)": \{/ { match($0, /"[^"]+"/); name = substr($0, RSTART + 1, RLENGTH - 2) }
  sec != "" && /"rss_kib"/ { gsub(/[^0-9]/, "", $2); rss[sec, name] = $2; names[name] = 1 }
  sec != "" && /"fds"/ { gsub(/[^0-9]/, "", $2); fds[sec, name] = $2 }
  sec != "" && /"shm_maps"/ { gsub(/[^0-9]/, "", $2); shm[sec, name] = $2 }
  END {
    for (n in names) printf "%-16s %9d KiB %9d KiB %8d %8d %8d %8d\n", n, rss["start", n], rss["end", n], fds["start", n], fds["end", n], shm["start", n], shm["end", n]
  }' "$report" | sort
awk '
  /"start": \{/ { sec = "start" } /"end": \{/ { sec = "end" } /"(growth|problems|thresholds)": / { sec = "" }
  /"t_s"/ && sec != "" { gsub(/[^0-9.]/, "", $2); t[sec] = $2 }
  /"dev_shm_entries"/ && sec != "" { gsub(/[^0-9]/, "", $2); shm[sec] = $2 }
  /"samples"/ { gsub(/[^0-9]/, "", $2); n = $2 }
  END { printf "soak: %d samples; start at %.1f s, end at %.1f s; /dev/shm/refit-* of the job: %d -> %d\n", n, t["start"], t["end"], shm["start"], shm["end"] }
' "$report"
if grep -q '"ok": true' "$report" && ((status == 0)); then
  echo "soak: ok, no growth beyond noise (report: $report)"
else
  echo "soak: FAILED (report: $report)" >&2
  grep -A20 '"problems"' "$report" >&2 || true
  exit 1
fi
