#!/usr/bin/env bash
# Installs what is missing, builds, and runs `refit demo` (arguments pass through).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec ./build/refit demo "$@"
