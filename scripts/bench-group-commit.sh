#!/usr/bin/env bash
# How long 16 state-locking runs that start together wait for their lock-owner records, against
# one run alone (issue 24 point 4, group commit: the target is at most two batches, i.e. twice
# the wait of a run alone). For each store and delay, scripts/bench-group-commit.py starts tfinit
# as PID 1 of a PID namespace with an empty store and measures each run's wait (its spawn to
# terraform's start, minus that of `terraform version`, which takes no lock):
#   file  TFINIT_STATE_DIR on delayfs (tests/support/delayfs.py), N ms before every create,
#         rename, unlink, fsync and mkdir;
#   kube  TFINIT_STORE=kubernetes against the stand-in API (tests/fixtures/kube/apiserver.py,
#         HTTPS with a CA made by openssl), every Lease request answered N ms late.
#
#   scripts/bench-group-commit.sh [--write] [ROUNDS]     # default 5 rounds; root
#   BENCH_BINARIES="before=/tmp/tfinit-main after=target/.../release/tfinit" scripts/bench-group-commit.sh
#   BENCH_DELAYS="0 5 50" BENCH_STORES="file kube" ...
#
# Each binary is measured in turn (before, then after), each store and delay in its own init.
# --write replaces the section between <!-- bench-group-commit:start --> and
# <!-- bench-group-commit:end --> in docs/benchmarks.md; without it the section is printed.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh

WRITE=0
if [ "${1:-}" = --write ]; then
    WRITE=1
    shift
fi
ROUNDS=${1:-5}
DELAYS=${BENCH_DELAYS:-"0 5 50"}
STORES=${BENCH_STORES:-"file kube"}

[ "$(id -u)" = 0 ] || { echo "bench-group-commit: needs root (unshare --pid, FUSE and tmpfs mounts)" >&2; exit 2; }
DEPS=${TFINIT_TEST_DEPS:-$PWD/.test-deps}
PY=$DEPS/bin/python
"$PY" -c 'import fuse' 2>/dev/null || { echo "bench-group-commit: $PY cannot import fusepy (with libfuse2); run scripts/install-test-deps.sh" >&2; exit 2; }
[ -r /dev/fuse ] || { echo "bench-group-commit: /dev/fuse is missing; FUSE is needed for the delayed volumes" >&2; exit 2; }
command -v openssl >/dev/null || { echo "bench-group-commit: openssl is missing (the stand-in API's certificates)" >&2; exit 2; }
export TFINIT_TEST_DEPS=$DEPS

if [ -z "${BENCH_BINARIES:-}" ]; then
    cargo build --release --quiet --bin tfinit
    BENCH_BINARIES="this=target/x86_64-unknown-linux-gnu/release/tfinit"
fi

WORK=$(mktemp -d /tmp/tfinit-bench-gc-out.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
LOAD=$(cut -d' ' -f1-3 /proc/loadavg)
labels=()
for b in $BENCH_BINARIES; do
    name=${b%%=*} bin=$(readlink -f "${b#*=}")
    for s in $STORES; do
        for d in $DELAYS; do
            echo "bench-group-commit: $name, $s store, $d ms..." >&2
            "$PY" scripts/bench-group-commit.py run --tfinit "$bin" --store "$s" --delay-ms "$d" \
                --rounds "$ROUNDS" --out "$WORK/$name.$s.$d.json"
            labels+=("$name.$s.$d")
        done
    done
done

section="$WORK/section.md"
{
    echo "Measured $(date -u +%Y-%m-%d) with \`scripts/bench-group-commit.sh $ROUNDS\` (release builds,"
    echo "commit $(bench_commit)) on $(bench_machine); load average $LOAD before the runs. Milliseconds."
    echo
    "$PY" scripts/bench-group-commit.py report --out "$WORK" "${labels[@]}"
    echo
    echo "- *alone*: one locking run at a time, $ROUNDS times: its wait for its record (spawn to terraform's"
    echo "  start, minus the median of \`terraform version\`, which takes no lock): one batch."
    echo "- *16 together*: 16 locking runs in 16 directories spawned at once, $ROUNDS rounds: the median"
    echo "  and the max wait of each round, the median of those over the rounds; *worst round's max*"
    echo "  over all rounds; *worst / alone*: the target is at most 2 (two batches)."
} >"$section"
cat "$section"
if [ "$WRITE" = 1 ]; then
    bench_write_section bench-group-commit "$section"
    echo "bench-group-commit: wrote the group commit section of docs/benchmarks.md"
fi
