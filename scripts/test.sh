#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs its own test dependencies (apt + PyPI into
# .test-deps/), then runs format and lint checks, unit and integration tests (as root: real PID
# namespaces), the signal-state tests once more under nohup, the static-binary check, short fuzz
# runs and the container tests.
# Usage: scripts/test.sh            (CI runs exactly this through .ci/run)
set -euo pipefail
cd "$(dirname "$0")/.."
export TFINIT_REQUIRE_DEPS=1
export CARGO_TERM_COLOR=never
# A clean clone builds everything once: incremental compilation's bookkeeping only costs time.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}

START=$SECONDS
# Each step's header says when it began (seconds since the start): where the 10 minutes go.
step() { printf '\n== %s (at %ds)\n' "$*" $((SECONDS - START)); }

# Background jobs beside the steps that compute (2 cores): the test dependencies (downloads and
# installs) beside format, lint and the release build; the fuzz targets' build (unoptimised, at
# nice 10: it takes what the others leave) from the start, through the integration tests. The
# release build's last minute (one codegen unit, fat LTO) uses one core: the fuzz build takes
# the other there. Each background job's output is printed, in order, once it is waited for.
mkdir -p target
# A failed step ends the script: its background jobs end with it.
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
step "test dependencies and the fuzz targets' build (in the background) beside rustfmt --check, clippy -D warnings, module cycles and the static release build"
scripts/install-test-deps.sh >target/test-deps.log 2>&1 &
deps=$!
fuzz=""
if [ -x scripts/fuzz.sh ]; then
    FUZZ_DEV=1 nice -n 10 scripts/fuzz.sh build >target/fuzz-build.log 2>&1 &
    fuzz=$!
fi

cargo fmt --all -- --check
cargo clippy --all-targets -- -D warnings
scripts/module-cycles.py src
cargo build --release
scripts/check-static.sh target/x86_64-unknown-linux-gnu/release/tfinit

step "waiting for the test dependencies"
deps_ok=0
wait "$deps" || deps_ok=$?
cat target/test-deps.log
if [ "$deps_ok" != 0 ]; then
    echo "scripts/test.sh: installing the test dependencies failed (exit $deps_ok); see above" >&2
    exit 1
fi

step "unit and integration tests (groups of test binaries in parallel: scripts/test-parallel.sh; the fuzz targets' build goes on beside them)"
scripts/test-parallel.sh

step "signal-state tests again under nohup, stdin from /dev/null (SIGHUP inherited as ignored)"
# The suite must not depend on the signal dispositions it inherits (issue 14): run the tests that
# read a child's SigIgn/SigBlk once more as a contributor would behind `nohup` (through cat: nohup
# would send output on a terminal to nohup.out).
nohup cargo test --test pid1_signal_state -- --test-threads="${TFINIT_TEST_THREADS:-2}" \
    the_child_starts_with_no_blocked the_child_gets_no_ignored_signal the_init_blocks_the_signals \
    </dev/null 2>&1 | cat

# The chaos rounds (mostly waiting on terraform and moto) run beside the fuzzing short run, which
# runs two targets at a time at nice 10 (libFuzzer stops on wall time: it gets fewer executions
# under load, never a longer run).
step "chaos: pods killed at random moments, the next pod reconciles (short run), beside short fuzz runs of every target"
scripts/chaos.sh "${TFINIT_CHAOS_ROUNDS:-3}" --check >target/chaos.log 2>&1 &
chaos=$!

if [ -n "$fuzz" ]; then
    fuzz_ok=0
    wait "$fuzz" || fuzz_ok=$?
    cat target/fuzz-build.log
    if [ "$fuzz_ok" != 0 ]; then
        echo "scripts/test.sh: building the fuzz targets failed (exit $fuzz_ok); see above" >&2
        exit 1
    fi
    # 10 s per target here (a smoke run of each parser on its corpus); `scripts/fuzz.sh long` is
    # the real search (10 minutes each).
    FUZZ_DEV=1 FUZZ_SECONDS=${FUZZ_SECONDS:-10} FUZZ_JOBS=${FUZZ_JOBS:-2} nice -n 10 scripts/fuzz.sh
fi

chaos_ok=0
wait "$chaos" || chaos_ok=$?
echo "-- chaos"
cat target/chaos.log
if [ "$chaos_ok" != 0 ]; then
    echo "scripts/test.sh: the chaos rounds failed (exit $chaos_ok); see above" >&2
    exit 1
fi

echo
echo "scripts/test.sh: all suites passed in $((SECONDS - START)) s"
