#!/usr/bin/env bash
# Regenerates docs/benchmarks.md: every section, each by its script, in one run (root; a quiet
# machine gives steadier figures). Usage: scripts/benchmarks.sh
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-test-deps.sh >/dev/null
cargo build --release --quiet
scripts/bench-pid1.sh --write
scripts/bench-shim.sh --write
scripts/bench-exit.sh --write
scripts/bench-storage.sh --write
echo "benchmarks.sh: docs/benchmarks.md rewritten"
