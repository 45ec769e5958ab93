#!/usr/bin/env bash
# Builds every libFuzzer target (fuzz/*_fuzz.cc) with clang, ASan and UBSan
# into build-fuzz (REFIT_FUZZ=ON), then runs each one on its committed seed
# corpus (fuzz/corpus/<target>/) for a time or a number of executions.
# Fails on any crash, leak, timeout, out-of-memory or sanitizer report; the
# input that triggered it is left in <build>/fuzz-artifacts/.
#
# Usage: fuzz/run.sh [SECONDS | -runs=N] [target...]
#   SECONDS       per target (default 60)
#   -runs=N       N executions per target instead
#   target...     only these (names without _fuzz.cc: auth, control_message ...)
# Environment: REFIT_FUZZ_BUILD_DIR (default build-fuzz), REFIT_JOBS (build
# parallelism and targets run at once, default 2).
set -euo pipefail
cd "$(dirname "$0")/.."

budget=${1:-60}
shift || true
if [[ $budget == -runs=* ]]; then
  limit=("$budget")
elif [[ $budget =~ ^[0-9]+$ ]]; then
  limit=("-max_total_time=$budget")
else
  echo "usage: fuzz/run.sh [SECONDS | -runs=N] [target...]" >&2
  exit 2
fi

build=${REFIT_FUZZ_BUILD_DIR:-build-fuzz}
# Warnings are errors in the gcc builds (scripts/test.sh); clang's extra
# warnings (e.g. unused private fields of CUDA-only members) must not stop
# the fuzzers.
# -O1 with line tables only (what the sanitizers' stack traces need), as in
# the sanitizer stages of scripts/test.sh: about a third of the build time
# of RelWithDebInfo's -O2 -g.
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
      -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only -DNDEBUG" \
      -DREFIT_FUZZ=ON -DREFIT_WERROR=OFF >/dev/null
cmake --build "$build" -j "${REFIT_JOBS:-2}" --target refit_fuzz >/dev/null

targets=()
if (($#)); then
  for t in "$@"; do targets+=("${t%_fuzz}_fuzz"); done
else
  for src in fuzz/*_fuzz.cc; do targets+=("$(basename "$src" .cc)"); done
fi

artifacts=$build/fuzz-artifacts
mkdir -p "$artifacts"
# Sanitizers stop at the first report; a leak fails the run.
export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
# The targets link UCX (where pkg-config finds it), whose libucs installs its
# own SIGSEGV/SIGILL/... handlers when loaded: it would print its backtrace
# and exit before libFuzzer writes the crashing input (a __builtin_trap
# showed exit 132 and no artifact). Leave the signals to libFuzzer and ASan.
export UCX_HANDLE_ERRORS=none

# fuzz_one TARGET: runs it, writes its summary line to $results/TARGET.line
# and, when it failed, the report's lines to $results/TARGET.fail.
results=$(mktemp -d /tmp/refit-fuzz-results-XXXXXX)
trap 'rm -rf "$results"' EXIT
fuzz_one() {
  local t=$1
  local bin=$build/$t
  local seeds=fuzz/corpus/${t%_fuzz}
  mkdir -p "$seeds"
  # New inputs go to a scratch corpus; the committed seeds stay as they are.
  local work
  work=$(mktemp -d "/tmp/refit-fuzz-${t}-XXXXXX")
  local log=$build/$t.log
  local max_len=()
  [[ -f fuzz/$t.options ]] && read -r -a max_len < "fuzz/$t.options"
  local status=0
  "$bin" "${limit[@]}" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 "${max_len[@]}" \
         -artifact_prefix="$artifacts/$t-" "$work" "$seeds" >"$log" 2>&1 || status=$?
  rm -rf "$work"
  local execs secs
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  secs=$(grep -o 'Done [0-9]* runs in [0-9]* second' "$log" | grep -o 'in [0-9]*' | grep -o '[0-9]*' | tail -1)
  printf '%-28s %12s execs %6s s  %s\n' "$t" "${execs:-?}" "${secs:-?}" \
         "$([[ $status -eq 0 ]] && echo ok || echo "FAILED (exit $status, log $log)")" >"$results/$t.line"
  if ((status != 0)); then
    grep -E 'ERROR|SUMMARY|runtime error|Test unit written|deadly signal' "$log" | head -20 >"$results/$t.fail" || true
  fi
}

for t in "${targets[@]}"; do
  [[ -x $build/$t ]] || { echo "fuzz: no target $t (built: $(ls "$build" | grep _fuzz | tr '\n' ' '))" >&2; exit 2; }
done
# Each target is one single-threaded process: REFIT_JOBS (default 2, the
# CI machine's cores) run at once, so the stage takes about
# targets / jobs * SECONDS rather than targets * SECONDS.
jobs=${REFIT_JOBS:-2}
for t in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n || true; done
  fuzz_one "$t" &
done
wait
failed=()
for t in "${targets[@]}"; do
  cat "$results/$t.line" 2>/dev/null || echo "$t: no result (its run ended without writing one)"
  if [[ ! -f $results/$t.line ]] || grep -q FAILED "$results/$t.line"; then
    failed+=("$t")
    cat "$results/$t.fail" >&2 2>/dev/null || true
  fi
done
if ((${#failed[@]})); then
  echo "fuzz: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: ${#targets[@]} targets passed"
