#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite with ctest.
# GPU tests (label gpu) skip with a reason where no GPU exists.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ctest --test-dir build --output-on-failure --timeout 900 -j 2 "$@"
