#!/usr/bin/env bash
# What a slow or hung state volume costs the init (issue 13): TFINIT_STATE_DIR on a FUSE
# passthrough (tests/support/delayfs.py) that sleeps before every create, rename, unlink, fsync and
# mkdir, at 0, 5, 50, 200 and 1000 ms per operation, and on a tmpfs.
#
#   scripts/bench-storage.sh [--write] [TRIALS]   # default 200 trials per volume; root
#   scripts/bench-storage.sh 20                   # a quick check (a few minutes)
#   TFINIT_BIN=/path/to/tfinit BENCH_DELAYS="tmpfs 5 50" scripts/bench-storage.sh 50
#
# For each volume, scripts/bench-storage.py starts tfinit as PID 1 of a PID namespace (unshare)
# with a volume holding 1,000 records of 100 other owners (other working directories) whose
# heartbeats stay fresh, waits for "lock-owner records enabled", and keeps 16 state-locking runs
# (`terraform apply` through the shim; the stand-in terraform prints four `Creating...` lines
# over 0.4 s) starting, progressing and finishing in a loop. Meanwhile it measures:
#   forwarding  SIGUSR1 to the init until the controller has it (CLOCK_MONOTONIC on both sides),
#               TRIALS times, 25-35 ms apart: p50, p99, max;
#   status      `tfinit status`, spawn to exit (a process start included), 20 times: p50, max;
#   start       a locking run's spawn-to-terraform-start minus that of `terraform version`
#               (no lock) on the same volume: p50, p99;
#   unrecorded  how many locking runs found no record of their own on disk when they started;
#   timeline    with one long run in flight, SIGTERM to the init (grace 6 s, stop timeout 3 s):
#               how late terraform got its graceful SIGTERM against signal + 3 s.
# Then `INIT -- /bin/true` under unshare, TRIALS times each, interleaved: tfinit with its state
# directory on tmpfs and at 5 ms per operation, and tini.
#
# --write replaces the section between <!-- bench-storage:start --> and <!-- bench-storage:end -->
# in docs/benchmarks.md (date, machine and commit included); without it the section is printed.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh

WRITE=0
if [ "${1:-}" = --write ]; then
    WRITE=1
    shift
fi
TRIALS=${1:-200}
DELAYS=${BENCH_DELAYS:-"tmpfs 0 5 50 200 1000"}

[ "$(id -u)" = 0 ] || { echo "bench-storage: needs root (unshare --pid, FUSE and tmpfs mounts); run it as root or in the CI container" >&2; exit 2; }
DEPS=${TFINIT_TEST_DEPS:-$PWD/.test-deps}
PY=$DEPS/bin/python
"$PY" -c 'import fuse' 2>/dev/null || { echo "bench-storage: $PY cannot import fusepy (with libfuse2); run scripts/install-test-deps.sh" >&2; exit 2; }
[ -r /dev/fuse ] || { echo "bench-storage: /dev/fuse is missing; FUSE is needed for the delayed volumes" >&2; exit 2; }
command -v tini >/dev/null || command -v tini-static >/dev/null || echo "bench-storage: tini is missing: the INIT -- true row has no tini" >&2

if [ -z "${TFINIT_BIN:-}" ]; then
    cargo build --release --quiet --bin tfinit
    TFINIT_BIN=target/x86_64-unknown-linux-gnu/release/tfinit
fi
TFINIT_BIN=$(readlink -f "$TFINIT_BIN")
export TFINIT_TEST_DEPS=$DEPS

WORK=$(mktemp -d /tmp/tfinit-bench-storage-out.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

LOAD=$(cut -d' ' -f1-3 /proc/loadavg)
for d in $DELAYS; do
    if [ "$d" = tmpfs ]; then
        args=(--kind tmpfs) what=tmpfs
    else
        args=(--kind fuse --delay-ms "$d") what="$d ms per operation"
    fi
    echo "bench-storage: state directory on $what..." >&2
    "$PY" scripts/bench-storage.py config --tfinit "$TFINIT_BIN" "${args[@]}" --trials "$TRIALS" --out "$WORK/$d.json"
done
echo "bench-storage: INIT -- true..." >&2
"$PY" scripts/bench-storage.py true --tfinit "$TFINIT_BIN" --trials "$TRIALS" --out "$WORK/true.json"

# ----- report -----
section="$WORK/section.md"
{
    echo "Measured $(date -u +%Y-%m-%d) with \`scripts/bench-storage.sh $TRIALS\`: tfinit $("$TFINIT_BIN" --version | cut -d' ' -f2)"
    echo "(release build, $(bench_static "$TFINIT_BIN"), commit $(bench_commit)) on $(bench_machine);"
    echo "load average $LOAD (1, 5, 15 min) before the runs. Milliseconds."
    echo
    "$PY" scripts/bench-storage.py report --out "$WORK" $DELAYS
    echo
    echo "- *forwarding*: SIGUSR1 to the init until its controller (a Python process in sigwaitinfo)"
    echo "  has it, $TRIALS trials 25-35 ms apart while 16 locking runs start, progress and finish in a"
    echo "  loop, with 1,000 records of 100 other owners (fresh heartbeats) in other directories."
    echo "- *status*: \`tfinit status\` from spawn to exit, process start included. *graceful SIGTERM"
    echo "  late*: when the long run's terraform got it, against the stop signal + grace - stop timeout."
    echo "- *locking start extra*: a locking run's spawn-to-start minus the median of \`terraform version\`"
    echo "  (no lock) on the same volume. *without a record*: locking runs whose record was not on disk"
    echo "  when terraform started. *set-up*: the init's log from \"controller started\" to \"lock-owner"
    echo "  records enabled\" (opening the volume: probe, heartbeat, sweep of the 1,000 records)."
    echo "- The delayed volumes are delayfs (Python, fusepy over libfuse2): even at 0 ms each operation"
    echo "  costs a round trip through a user-space daemon, which the tmpfs row does not."
} >"$section"
cat "$section"

if [ "$WRITE" = 1 ]; then
    bench_write_section bench-storage "$section"
    echo "bench-storage: wrote the Storage section of docs/benchmarks.md"
fi
