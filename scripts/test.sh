#!/usr/bin/env bash
# The test command (README; CI runs it through .ci/run). Stages:
#   main   installs what is missing (scripts/setup.sh), builds ./build and
#          runs the whole suite with ctest; GPU tests skip with a reason where
#          no GPU exists. Extra arguments go to this ctest.
#   asan   AddressSanitizer + UndefinedBehaviorSanitizer build (build-asan,
#          no CUDA): the unit and process tests.
#   tsan   ThreadSanitizer build (build-tsan, no CUDA): the tests of the
#          threaded components (link, receiver, transports, control plane,
#          and whole jobs of processes).
#   fuzz   every libFuzzer target (fuzz/*_fuzz.cc) for REFIT_FUZZ_SECONDS
#          (default 30) seconds each (fuzz/run.sh).
# (Stage functions run inside `if`, where `set -e` does not apply: every
# step checks its status.)
# Sanitizers halt at the first report, and every process (a test, or a refit
# process a test spawned) writes its reports to a folder that must stay
# empty: a report from a process that was expected to fail anyway fails the
# run too. REFIT_TEST_STAGES picks stages (default: all four, "main asan
# tsan fuzz", about 50-70 minutes on the 2-core CI machine; REFIT_TEST_STAGES=main
# for the normal suite alone, about 16 minutes with its build).
# The last line counts every stage's tests, skipped ones apart, and names the
# labels that skipped and why: "N passed, M failed, K skipped (gpu: 73 (no
# CUDA device: ...))" (scripts/ctest_counts.py reads ctest's JUnit report).
set -euo pipefail
cd "$(dirname "$0")/.."

stages=${REFIT_TEST_STAGES:-main asan tsan fuzz}
passed=0
failed=0
skipped=0
failures=()
timing=()
# One line per skipped test of every stage: label, reason, test
# (scripts/ctest_counts.py); summed up on the last line.
skips_file=$(mktemp)
trap 'rm -f "$skips_file"' EXIT

# Runs ctest (behind ${ctest_prefix[@]}, if set) on the build directory $2 and
# adds its counts (passed, failed, skipped apart) to the totals; returns
# ctest's status.
ctest_prefix=()
run_ctest() {
  local log=$1 dir=$2
  shift 2
  local junit=${log%.log}.xml
  [[ $junit == /* ]] || junit=$PWD/$junit
  rm -f "$junit"
  local rc=0
  "${ctest_prefix[@]}" ctest --test-dir "$dir" "$@" --output-on-failure --no-tests=error --timeout 900 -j 2 \
    --output-junit "$junit" 2>&1 | tee "$log" || rc=$?
  local counts p f k
  if [[ -s $junit ]] && counts=$(python3 scripts/ctest_counts.py "$junit" "$dir" "$skips_file"); then
    read -r p f k <<<"$counts"
    passed=$((passed + p))
    failed=$((failed + f))
    skipped=$((skipped + k))
  else
    # No JUnit report (ctest stopped early): the summary line's counts.
    local line
    line=$(grep -E 'tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -1 || true)
    if [[ $line =~ ([0-9]+)\ tests?\ failed\ out\ of\ ([0-9]+) ]]; then
      failed=$((failed + BASH_REMATCH[1]))
      passed=$((passed + BASH_REMATCH[2] - BASH_REMATCH[1]))
    fi
  fi
  return $rc
}

# "label: N (reason), M (reason); label: ..." for every skipped test: what
# the last line lists after the counts.
skip_summary() {
  sort "$skips_file" | awk -F'\t' '
    { n[$1 "\t" $2]++; if (!($1 in seen)) { seen[$1] = 1; labels[++nl] = $1 } }
    END {
      for (i = 1; i <= nl; i++) {
        s = labels[i] ":"; sep = " "
        for (k in n) { split(k, p, "\t"); if (p[1] == labels[i]) { s = s sep n[k] " (" p[2] ")"; sep = ", " } }
        out = out (i > 1 ? "; " : "") s
      }
      printf "%s", out
    }'
}

# Fails (and prints them) when sanitizer reports were written to $1.
no_reports() {
  local dir=$1
  if compgen -G "$dir/*" >/dev/null; then
    echo "sanitizer reports in $dir:" >&2
    for f in "$dir"/*; do
      echo "---- $f" >&2
      head -60 "$f" >&2
    done
    return 1
  fi
}

# Sanitizer builds compile at -O1 with line tables only (-g1: enough for the
# reports' stack traces), not RelWithDebInfo's -O2 -g: the ASan build of
# coordinator.cc took 80 s at -O2 -g and 27 s at -O1 -g1 on the 2-core VM,
# and the whole ASan build was the largest single cost of CI (about 30 of
# its minutes, 2026-12-02).
sanitizer_build() {
  local dir=$1 sanitize=$2
  shift 2
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
    -DREFIT_SANITIZE="$sanitize" -DREFIT_ENABLE_CUDA=OFF "$@" >/dev/null ||
    return 1
  cmake --build "$dir" -j "$(nproc)" --target refit refit_unit_tests refit_process_tests
}

stage() {
  local name=$1
  shift
  local start=$SECONDS
  echo "==== test.sh: stage $name" >&2
  if "$@"; then
    timing+=("$name $((SECONDS - start))s ok")
  else
    timing+=("$name $((SECONDS - start))s FAILED")
    failures+=("$name")
  fi
}

main_stage() {
  scripts/setup.sh || return 1
  run_ctest build/ctest-main.log build "$@"
}

# The ASan+UBSan build uses clang: about half gcc 12's compile time with
# both sanitizers (tools/refit/main.cc at -O1: 18 s against 38 s on the
# 2-core VM). Its warnings are not errors (clang warns where gcc does not;
# the main and tsan builds keep gcc's -Werror).
asan_stage() {
  local reports=$PWD/build-asan/sanitizer-reports
  sanitizer_build build-asan address,undefined -DCMAKE_CXX_COMPILER=clang++ -DREFIT_WERROR=OFF || return 1
  rm -rf "$reports" && mkdir -p "$reports"
  local rc=0
  # UCX_MEM_EVENTS=no: UCX's memory hooks (libucm) patch malloc and mmap,
  # which ASan intercepts too; refit does not need them (it registers its
  # memory itself). (The UcxExpose hang once blamed on them was the test
  # forking after UCX was initialized: fixed in the test.)
  UCX_MEM_EVENTS=no \
  ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:log_path=$reports/asan" \
  UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$reports/ubsan" \
    run_ctest build-asan/ctest.log build-asan -L 'unit|process' || rc=$?
  no_reports "$reports" || rc=1
  return $rc
}

# The threaded components: their unit tests, and whole jobs (coordinator
# with its join gate, ranks with their control readers and receiver I/O
# threads) in the process tests below.
tsan_stage() {
  local reports=$PWD/build-tsan/sanitizer-reports
  # Without UCX: libucm hooks madvise, which glibc calls as a thread exits,
  # and TSan's interceptor crashes there (SIGSEGV in MutexPreReadLock).
  sanitizer_build build-tsan thread -DREFIT_WITH_UCX=OFF || return 1
  rm -rf "$reports" && mkdir -p "$reports"
  local filter='^(ShadowWeights|WeightReaders|ShadowDemo|ShadowKill|ShadowRecovery|EngineHoldings|ParallelFor|QuantizedShards|QuantizedSource|Link|Listener|SplitHostPort|Receiver|Aligner|Transport|Tcp|Shm|Auth|JoinGate|RecvControl|ControlClient|DemoTest|ControlPlaneFault|SecretFault|KillTest|StalledPeer|CoordinatorLost|Liveness|Faults/CommitStep|EveryRoleStepAndAction|SetupFailure|Summary|RefusalLog|PollWait|FaultHook|AtomicFile)'
  local rc=0
  # TSan maps its shadow at fixed addresses: run without ASLR (setarch -R,
  # inherited by every process), which newer kernels' mmap randomisation
  # would otherwise collide with.
  ctest_prefix=(setarch "$(uname -m)" -R)
  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:log_path=$reports/tsan" \
    run_ctest build-tsan/ctest.log build-tsan -R "$filter" || rc=$?
  ctest_prefix=()
  no_reports "$reports" || rc=1
  return $rc
}

fuzz_stage() {
  fuzz/run.sh "${REFIT_FUZZ_SECONDS:-30}"
}

for s in $stages; do
  case $s in
    main) stage main main_stage "$@" ;;
    asan) stage asan asan_stage ;;
    tsan) stage tsan tsan_stage ;;
    fuzz) stage fuzz fuzz_stage ;;
    *) echo "test.sh: unknown stage '$s' (main asan tsan fuzz)" >&2; exit 2 ;;
  esac
done

echo "test.sh: ${timing[*]/%/;}" >&2
counts="$passed passed, $failed failed, $skipped skipped"
((skipped == 0)) || counts+=" ($(skip_summary))"
if ((${#failures[@]})); then
  echo "test.sh: FAILED stages: ${failures[*]}" >&2
  echo "$counts"
  exit 1
fi
echo "$counts"
