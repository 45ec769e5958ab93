#!/usr/bin/env bash
# Runs `refit demo` (arguments pass through): installs the Debian packages
# that are missing (scripts/setup.sh) and builds the `refit` command alone
# (no tests, no benchmarks) into ./build first. The build's output goes to
# build/demo-build.log; the terminal gets one line.
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=${REFIT_BUILD_DIR:-build}
log=$build_dir/demo-build.log

usage() {
  cat <<EOF
Usage: scripts/demo.sh [refit demo flags...]

Installs the missing Debian packages (scripts/setup.sh, sudo when not root),
builds only the refit command into $build_dir/ (a first build takes about
10 minutes on 2 cores; later ones rebuild only what changed) and runs
\`$build_dir/refit demo\` with the flags given. Build output: $log.

Settings (environment):
  REFIT_BUILD_DIR    build directory (default: build)
  REFIT_BUILD_TYPE   CMake build type (default: Release)
EOF
  if [[ -x $build_dir/refit ]]; then
    echo
    "$build_dir/refit" demo --help
  else
    echo
    echo "The demo's flags and their defaults: README.md, \"refit demo\"; after the"
    echo "first build \`scripts/demo.sh --help\` also prints \`refit demo --help\` here."
  fi
}

for arg in "$@"; do
  if [[ $arg == --help || $arg == -h ]]; then
    usage
    exit 0
  fi
done

mkdir -p "$build_dir"
printf 'demo.sh: building refit in %s/ (output: %s) ... ' "$build_dir" "$log" >&2
start=$SECONDS
if ! REFIT_BUILD_TARGETS=refit scripts/setup.sh >"$log" 2>&1; then
  echo "failed" >&2
  echo "demo.sh: the build failed; the end of $log:" >&2
  tail -n 30 "$log" >&2
  exit 1
fi
echo "done ($((SECONDS - start)) s)" >&2
exec "$build_dir/refit" demo "$@"
