#!/usr/bin/env bash
# Chaos rounds against a real S3+DynamoDB backend (moto): pods killed at random moments, the next
# pod must reconcile. See scripts/chaos.py for what each round checks.
#   scripts/chaos.sh N                 N rounds with tfinit, then N with tini, write docs/reliability.md's table
#   scripts/chaos.sh N --check         N rounds with tfinit only; exit 1 unless every round is clean (the test suite)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
mode=${2:-}
[ "$(id -u)" -eq 0 ] || { echo "chaos.sh: needs root (PID and UTS namespaces)" >&2; exit 1; }
scripts/install-test-deps.sh >/dev/null
cargo build --release --quiet
deps=${TFINIT_TEST_DEPS:-$PWD/.test-deps}
port=$(( 20000 + RANDOM % 20000 ))
scripts/moto.sh start "$port" >/dev/null
trap 'scripts/moto.sh stop "$port" >/dev/null 2>&1 || true' EXIT
py="$deps/bin/python"
if [ "$mode" = "--check" ]; then
    "$py" scripts/chaos.py --rounds "$rounds" --init tfinit --port "$port" --seed "${CHAOS_SEED:-$RANDOM}" --check
    exit
fi
out=$(mktemp -d)
"$py" scripts/chaos.py --rounds "$rounds" --init tfinit --port "$port" --seed 42 --json "$out/tfinit.json"
"$py" scripts/chaos.py --rounds "$rounds" --init tini --port "$port" --seed 42 --json "$out/tini.json"
"$py" scripts/chaos-report.py "$out/tfinit.json" "$out/tini.json" docs/reliability.md
rm -rf "$out"
