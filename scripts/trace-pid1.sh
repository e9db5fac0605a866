#!/usr/bin/env bash
# Where an init's time goes in the PID-1 benchmark's latency and exit trials, from kernel
# tracepoints (tracefs): the figures behind "Where tfinit's time goes" in docs/benchmarks.md.
#
#   scripts/trace-pid1.sh [TRIALS]   # default 30 trials per init and measure; root, tracefs
#
# It builds the PID-1 benchmark's own program (scripts/bench/pid1bench.c), runs latency and
# lifecycle trials of tfinit and tini-static with the syscall, scheduler, signal and page-fault
# tracepoints on, and prints medians per init:
#   - latency: wake-up syscall's return (epoll_wait / rt_sigtimedwait) to the forwarding kill(2);
#   - exit: SIGCHLD wake-up syscall's return to exit_group (user space), exit_group to the
#     parent's SIGCHLD (kernel: address space and descriptors torn down), page faults on the way.
# Tracing slows every syscall a little, both inits alike: compare the columns, not the absolutes.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh

TRIALS=${1:-30}
[ "$(id -u)" = 0 ] || { echo "trace-pid1: needs root (tracefs, clone(CLONE_NEWPID))" >&2; exit 2; }
TRACE=/sys/kernel/tracing
if [ ! -e "$TRACE/trace" ]; then
    mount -t tracefs nodev "$TRACE" 2>/dev/null || {
        echo "trace-pid1: tracefs is not available at $TRACE (mount -t tracefs nodev $TRACE)" >&2
        exit 2
    }
fi
command -v tini-static >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tini >/dev/null
if [ -z "${TFINIT_BIN:-}" ]; then
    cargo build --release --quiet
    TFINIT_BIN=target/x86_64-unknown-linux-gnu/release/tfinit
fi
TFINIT_BIN=$(readlink -f "$TFINIT_BIN")

WORK=$(mktemp -d /tmp/tfinit-trace-pid1.XXXXXX)
cleanup() {
    echo 0 >"$TRACE/tracing_on" 2>/dev/null || true
    echo 0 >"$TRACE/events/enable" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
mkdir -p "$WORK/run" "$WORK/state"
export TFINIT_RUN_DIR=$WORK/run TFINIT_STATE_DIR=$WORK/state TFINIT_OWNER=trace-pid1
unset TFINIT_LOG TFINIT_LOG_FORMAT TFINIT_FORWARD TFINIT_REWRITE TFINIT_GRACE_PERIOD

bench_cc pid1bench.c "$WORK/pid1bench"

echo 0 >"$TRACE/tracing_on"
echo 0 >"$TRACE/events/enable"
echo 16384 >"$TRACE/buffer_size_kb"
for e in raw_syscalls/sys_enter raw_syscalls/sys_exit sched/sched_switch \
    signal/signal_generate exceptions/page_fault_user; do
    echo 1 >"$TRACE/events/$e/enable"
done
for what in latency lifecycle; do
    echo >"$TRACE/trace"
    echo 1 >"$TRACE/tracing_on"
    "$WORK/pid1bench" "$what" "$TRIALS" "tfinit=$TFINIT_BIN --" "tini=$(command -v tini-static) --" >&2
    echo 0 >"$TRACE/tracing_on"
    cp "$TRACE/trace" "$WORK/$what.trace"
done

python3 - "$WORK" "$(basename "$TFINIT_BIN")" <<'EOF_PY'
import re, statistics, sys
work, tf = sys.argv[1], sys.argv[2][:15]
INITS = {tf: "tfinit", "tini-static": "tini"}
LINE = re.compile(r"^\s*(.+)-(\d+)\s+\[\d+\]\s+\S+\s+(\d+\.\d+): (\w+): (.*)$")
SYS_KILL, SYS_EXIT_GROUP, SYS_EPOLL_WAIT, SYS_SIGTIMEDWAIT = 62, 231, 232, 128

def events(path):
    for line in open(path):
        m = LINE.match(line)
        if m:
            comm, pid, ts, ev, rest = m.groups()
            yield comm, int(pid), float(ts) * 1e6, ev, rest

def nr(rest):
    m = re.match(r"NR (\d+)", rest)
    return int(m.group(1)) if m else None

def med(v):
    return f"{statistics.median(v):.0f}" if v else "-"

# latency: the last wake-up syscall return before the kill(SIGTERM) that forwards
lat = {n: [] for n in INITS.values()}
woke = {}
for comm, pid, ts, ev, rest in events(f"{work}/latency.trace"):
    if comm not in INITS:
        continue
    if ev == "sys_exit" and nr(rest) in (SYS_EPOLL_WAIT, SYS_SIGTIMEDWAIT):
        woke[pid] = ts
    elif ev == "sys_enter" and nr(rest) == SYS_KILL and rest.split("(")[1].split(",")[1].strip() == "f":
        if pid in woke:
            lat[INITS[comm]].append(ts - woke.pop(pid))

# exit: the last wake-up before exit_group, exit_group, the SIGCHLD to the parent
user = {n: [] for n in INITS.values()}
kern = {n: [] for n in INITS.values()}
faults = {n: [] for n in INITS.values()}
woke, nfault, entered = {}, {}, {}
for comm, pid, ts, ev, rest in events(f"{work}/lifecycle.trace"):
    if comm not in INITS:
        continue
    name = INITS[comm]
    if ev == "sys_exit" and nr(rest) in (SYS_EPOLL_WAIT, SYS_SIGTIMEDWAIT):
        woke[pid], nfault[pid] = ts, 0
    elif ev == "page_fault_user" and pid in woke:
        nfault[pid] += 1
    elif ev == "sys_enter" and nr(rest) == SYS_EXIT_GROUP and pid in woke:
        user[name].append(ts - woke[pid])
        faults[name].append(nfault[pid])
        entered[pid] = ts
    elif ev == "signal_generate" and "sig=17" in rest and pid in entered:
        kern[name].append(ts - entered.pop(pid))

print("medians in µs, under tracing | wake-up to kill (latency) | exit: wake-up to exit_group "
      "| exit_group to parent's SIGCHLD | page faults on the exit path | trials")
for name in INITS.values():
    print(f"{name:8} | {med(lat[name]):>5} | {med(user[name]):>5} | {med(kern[name]):>5} "
          f"| {med(faults[name]):>3} | {len(lat[name])}/{len(user[name])}")
EOF_PY
