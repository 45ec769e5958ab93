#!/usr/bin/env bash
# Installs the Debian packages refit needs (only the missing ones) and builds
# it into ./build. CUDA is optional: used when the toolkit is installed.
# Usage: scripts/setup.sh [extra cmake args...]
# REFIT_BUILD_TARGETS: the targets to build (default: all; scripts/demo.sh: refit).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake g++ make pkg-config googletest libgtest-dev libgmock-dev libbenchmark-dev
          nlohmann-json3-dev libcli11-dev libxxhash-dev libucx-dev iproute2
          libssl-dev clang libclang-rt-dev
          pybind11-dev python3-dev python3-numpy libdlpack-dev)  # the last four: the Python binding
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "refit setup: installing ${missing[*]}" >&2
  sudo_cmd=()
  [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
fi

build_dir=${REFIT_BUILD_DIR:-build}
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=${REFIT_BUILD_TYPE:-Release} "$@" >/dev/null
# shellcheck disable=SC2086 # REFIT_BUILD_TARGETS is a list of target names
cmake --build "$build_dir" -j "$(nproc)" ${REFIT_BUILD_TARGETS:+--target $REFIT_BUILD_TARGETS}
