#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs its own test dependencies (apt + PyPI into
# .test-deps/), then runs format and lint checks, unit and integration tests (as root: real PID
# namespaces), the static-binary check, short fuzz runs and the container tests.
# Usage: scripts/test.sh            (CI runs exactly this through .ci/run)
set -euo pipefail
cd "$(dirname "$0")/.."
export TFINIT_REQUIRE_DEPS=1
export CARGO_TERM_COLOR=never

step() { printf '\n== %s\n' "$*"; }

step "test dependencies"
scripts/install-test-deps.sh

step "rustfmt --check"
cargo fmt --all -- --check

step "clippy -D warnings"
cargo clippy --all-targets -- -D warnings

step "release build (static)"
cargo build --release
scripts/check-static.sh target/x86_64-unknown-linux-gnu/release/tfinit

step "unit and integration tests"
cargo test -- --test-threads="${TFINIT_TEST_THREADS:-2}"

step "chaos: pods killed at random moments, the next pod reconciles (short run)"
scripts/chaos.sh "${TFINIT_CHAOS_ROUNDS:-3}" --check

if [ -x scripts/fuzz.sh ]; then
    step "fuzzing (short run of every target)"
    scripts/fuzz.sh
fi

echo
echo "scripts/test.sh: all suites passed"
