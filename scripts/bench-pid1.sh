#!/usr/bin/env bash
# tfinit against tini, dumb-init and catatonit as PID 1, side by side in one run (issue 2):
#   - signal-forwarding latency: SIGTERM to the init until its child has it (p50, p99);
#   - CPU per forwarded signal: the init's CPU time (all its threads) per SIGUSR1, and for the
#     SIGTERM that begins its shutdown;
#   - reaping: 20,000 orphans at once, from the spawner's exit until none is left;
#   - the init's memory while it supervises an idle child (VmRSS and Pss);
#   - start-to-exec (the init's clone until its child's main) and a whole `INIT -- /bin/true`;
#   - exit time: the child's last instruction until the init has been reaped, and the floor of it
#     that tfinit's size sets (a do-nothing init holding tfinit's binary mapped and its anonymous
#     memory, scripts/bench/mapinit.c);
#   - binary size, and whether it is static.
#
#   scripts/bench-pid1.sh [--write] [TRIALS]   # default 200 trials, 15 bursts (BENCH_REAP_TRIALS); root
#
# Each init runs as PID 1 of a new PID namespace, as in a container: a small C program
# (scripts/bench/pid1bench.c, compiled below) clones it with CLONE_NEWPID, so the init is its
# direct child and waitpid times the init's exit exactly, and runs itself as the init's child to
# report CLOCK_MONOTONIC timestamps through an inherited pipe. Trials are interleaved over the
# inits so load from elsewhere on the machine spreads over all of them. Each init runs in its
# default mode: tini and catatonit forward to the child, dumb-init and tfinit to its process
# group. tfinit runs with a control socket and a writable state directory (lock-owner records
# on), as in a pod with a volume.
#
# TFINIT_BASE_BIN=/path/to/older/tfinit adds that binary to the same interleaved trials and prints
# an A/B block after the table (latency, exit, reaping, memory, and idle wake-ups over
# BENCH_IDLE_SECONDS, default 60): how a change moved tfinit, measured in one run; TFINIT_BASE_LABEL
# names the base in the table (e.g. its commit).
#
# --write replaces the section between <!-- bench-pid1:start --> and <!-- bench-pid1:end --> in
# docs/benchmarks.md (date, machine and versions included); without it the section is printed.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh

WRITE=0
if [ "${1:-}" = --write ]; then
    WRITE=1
    shift
fi
TRIALS=${1:-200}
REAP_TRIALS=${BENCH_REAP_TRIALS:-15}
CPU_TRIALS=${BENCH_CPU_TRIALS:-100}
CPU_SIGNALS=20
ORPHANS=20000
RSS_TRIALS=5

[ "$(id -u)" = 0 ] || { echo "bench-pid1: needs root (clone(CLONE_NEWPID)); run it as root or in the CI container" >&2; exit 2; }
missing=()
for b in tini dumb-init catatonit; do command -v "$b" >/dev/null || missing+=("$b"); done
if [ ${#missing[@]} -gt 0 ]; then
    echo "bench-pid1: installing ${missing[*]}" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
command -v gcc >/dev/null || { echo "bench-pid1: gcc is missing (apt-get install gcc)" >&2; exit 2; }

if [ -z "${TFINIT_BIN:-}" ]; then
    cargo build --release --quiet
    TFINIT_BIN=target/x86_64-unknown-linux-gnu/release/tfinit
fi
TFINIT_BIN=$(readlink -f "$TFINIT_BIN")
# Docker's --init ships a static tini (docker-init); Debian has both, prefer the static one.
TINI=$(command -v tini-static || command -v tini)
DUMB_INIT=$(command -v dumb-init)
CATATONIT=$(command -v catatonit)

WORK=$(mktemp -d /tmp/tfinit-bench-pid1.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/run" "$WORK/state"
export TFINIT_RUN_DIR=$WORK/run TFINIT_STATE_DIR=$WORK/state TFINIT_OWNER=bench-pid1
unset TFINIT_LOG TFINIT_LOG_FORMAT TFINIT_FORWARD TFINIT_REWRITE TFINIT_GRACE_PERIOD \
    TFINIT_STOP_TIMEOUT TFINIT_KILL_MARGIN

bench_cc pid1bench.c "$WORK/pid1bench"
B=$WORK/pid1bench
# The exit floor tfinit's size sets (scripts/bench/mapinit.c): static, as tfinit and the peers
# that set the best exit times are.
bench_cc mapinit.c "$WORK/mapinit" -static

# The tfinit binaries measured are copies, written with one write(2) as an image layer's files
# are, not the linker's output: lld writes its output through a shared mapping, which leaves the
# file in the page cache as 4 KiB pages, and an exit then unmaps the 3 MB of text page by page.
# The linker's file exited 542 and 560 µs after its child against 465 and 470 µs for a copy
# (pid1bench lifecycle, 100 interleaved trials, twice, 2026-11-29; tini 319 and 299). The peers'
# files were written by dpkg.
copy_bin() {
    mkdir -p "$WORK/$2"
    dd if="$1" of="$WORK/$2/tfinit" bs=64M status=none
    chmod 755 "$WORK/$2/tfinit"
    echo "$WORK/$2/tfinit"
}
TFINIT_BIN=$(copy_bin "$TFINIT_BIN" bin)

INITS=("tfinit=$TFINIT_BIN --" "tini=$TINI --" "dumb-init=$DUMB_INIT" "catatonit=$CATATONIT --")
BASE_BIN=${TFINIT_BASE_BIN:+$(copy_bin "$(readlink -f "$TFINIT_BASE_BIN")" base)}
# The base keeps its own state directory: a tfinit prunes the heartbeats of the incarnations the
# kernel proves gone, whichever build left them, and each trial's init is one.
mkdir -p "$WORK/state-base"
[ -n "$BASE_BIN" ] && INITS=("${INITS[0]}" "tfinit-base=TFINIT_STATE_DIR=$WORK/state-base $BASE_BIN --" "${INITS[@]:1}")
NAMES=(tfinit tini dumb-init catatonit)

PREFIX=() # what runs the driver (taskset, for the CPU measure)
run() { # run WHAT ARGS... : prints and keeps the driver's lines in $WORK/WHAT
    local what=$1
    shift
    echo "bench-pid1: $what $*" | sed "s|$WORK/||g" >&2
    "${PREFIX[@]}" "$B" "$what" "$@" | tee "$WORK/$what" >&2
}
# get WHAT NAME FIELD: the value after FIELD on NAME's line of WHAT (FIELD may repeat: p50 of the
# second measure is `get lifecycle tfinit exit_us p50`).
get() {
    awk -v n="$2" -v k1="$3" -v k2="${4:-}" '
        $1 == n { for (i = 2; i < NF; i++) if ($i == k1) { if (k2 == "") { print $(i+1); exit }
                  for (j = i + 1; j < NF; j++) if ($j == k2) { print $(j+1); exit } } }' "$WORK/$1"
}
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
run latency "$TRIALS" "${INITS[@]}" "none="
# On one CPU: across two, each signal's wake-up may land on an idle vCPU (an IPI out of halt:
# ~30 µs per signal on this VM, for every init alike), and which of the two happens decides the
# median; on one CPU the figure is each init's own work per signal, run after run.
PIN=(taskset -c 0)
command -v taskset >/dev/null || PIN=()
PREFIX=("${PIN[@]}")
run cpu "$CPU_TRIALS" "$CPU_SIGNALS" "${INITS[@]}"
PREFIX=()
run rss "$RSS_TRIALS" "${INITS[@]}"
# `floor`: a do-nothing init holding what tfinit holds when idle, as much of its binary mapped
# (RssFile: large folios map the text whole) and as much anonymous memory (RssAnon): the part of
# tfinit's exit its size sets.
ANON_KIB=$(get rss tfinit anon_kib median)
FILE_KIB=$(get rss tfinit file_kib median)
FLOOR="floor=MAPFILE=$TFINIT_BIN FILE_KIB=$FILE_KIB ANON_KIB=$ANON_KIB $WORK/mapinit"
run lifecycle "$TRIALS" "${INITS[@]}" "$FLOOR" "none="
run true "$TRIALS" "${INITS[@]}" "none="
run reap "$REAP_TRIALS" "$ORPHANS" "${INITS[@]}"

failures=$(awk '{ for (i = 2; i < NF; i++) if ($i == "failed" && $(i+1) != 0) print FILENAME ": " $0 }' \
    "$WORK"/latency "$WORK"/cpu "$WORK"/lifecycle "$WORK"/true "$WORK"/rss "$WORK"/reap | sed "s|$WORK/||")
if [ -n "$failures" ]; then
    echo "bench-pid1: some trials failed:" >&2
    echo "$failures" >&2
    exit 1
fi

best() { # best WHAT FIELD [FIELD2] -> "VALUE NAME"
    local what=$1
    shift
    for n in tini dumb-init catatonit; do echo "$(get "$what" "$n" "$@") $n"; done | sort -g | head -1
}
# verdict MINE "BEST NAME" UNIT [FACTOR]: "met: ..." when MINE <= BEST * FACTOR (default 1),
# else "missed: ..."; with a FACTOR, the line gives MINE / BEST.
verdict() {
    awk -v m="$1" -v b="${2%% *}" -v who="${2#* }" -v u="$3" -v f="${4:-}" 'BEGIN {
        r = sprintf("%s %s vs %s %s %s", m, u, who, b, u)
        if (f != "") { printf "%s: %s (%.2fx)\n", (m + 0 <= b * f ? "met" : "missed"), r, m / b; exit }
        if (m + 0 <= b + 0) printf "met: %s\n", r
        else printf "missed: %s (+%.0f%%)\n", r, (m - b) * 100 / b }'
}

size() { stat -L -c %s "$1"; }
kib() { awk -v b="$1" 'BEGIN { printf "%.0f KiB", b / 1024 }'; }
bin_cell() { echo "$(kib "$(size "$1")") ($(bench_static "$1"))"; }
row() { # row LABEL CELL_FN: one table row, CELL_FN NAME prints a cell
    local label=$1 fn=$2 line="| $1 |"
    for n in "${NAMES[@]}" none; do line="$line $($fn "$n") |"; done
    echo "$line"
}
c_latency() { echo "$(get latency "$1" p50) / $(get latency "$1" p99)"; }
c_cpu() { [ "$1" = none ] && echo "—" || echo "$(get cpu "$1" cpu_us median) / $(get cpu "$1" term_cpu_us median)"; }
c_reap() { [ "$1" = none ] && echo "—" || echo "$(get reap "$1" reap_ms median) (max $(get reap "$1" max))"; }
c_rss() { [ "$1" = none ] && echo "—" || echo "$(get rss "$1" rss_kib median) / $(get rss "$1" pss_kib median)"; }
c_start() { get lifecycle "$1" start_us p50; }
c_true() { get true "$1" true_us p50; }
c_exit() { echo "$(get lifecycle "$1" exit_us p50) / $(get lifecycle "$1" exit_us p99)"; }
c_bin() {
    case $1 in
        tfinit) bin_cell "$TFINIT_BIN" ;;
        tini) bin_cell "$TINI" ;;
        dumb-init) bin_cell "$DUMB_INIT" ;;
        catatonit) bin_cell "$CATATONIT" ;;
        none) echo "—" ;;
    esac
}

version() { "$@" 2>&1 | head -1 | grep -Eo '[0-9]+\.[0-9]+(\.[0-9]+)?' | head -1; }
rss_kib=$(get rss tfinit rss_kib median)
tf_size=$(size "$TFINIT_BIN")
section="$WORK/section.md"
{
    echo "Measured $(date -u +%Y-%m-%d) with \`scripts/bench-pid1.sh $TRIALS\` on $(bench_machine):"
    echo "tfinit $("$TFINIT_BIN" --version | cut -d' ' -f2) (release build, commit $(bench_commit)),"
    echo "tini $(version "$TINI" --version) (\`$(basename "$TINI")\`), dumb-init $(version "$DUMB_INIT" --version),"
    echo "catatonit $(version "$CATATONIT" -V) (Debian packages). Each init is PID 1 of a fresh PID namespace;"
    echo "*none* is the child as PID 1 itself (the floor). $TRIALS trials per timing, interleaved over"
    echo "the inits; $REAP_TRIALS bursts of $ORPHANS orphans; memory over $RSS_TRIALS starts."
    echo
    echo "| | tfinit | tini | dumb-init | catatonit | none |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: |"
    row "SIGTERM forwarding latency, p50 / p99 (µs)" c_latency
    row "CPU per forwarded signal, SIGUSR1 / SIGTERM, median (µs)" c_cpu
    row "reap $ORPHANS orphans, median (ms)" c_reap
    row "memory supervising an idle child, VmRSS / Pss (KiB)" c_rss
    row "start-to-exec, p50 (µs)" c_start
    row "\`INIT -- /bin/true\`, whole run, p50 (µs)" c_true
    row "child exit to init exit, p50 / p99 (µs)" c_exit
    row "binary size" c_bin
    echo
    echo "- *Latency*: from kill(SIGTERM) on the init to the child's sigwaitinfo returning (the child"
    echo "  blocks SIGTERM; each init started 20 ms earlier and waits). *CPU*: the init's CPU time, all"
    echo "  its threads (/proc/PID/task/*/schedstat), over $CPU_SIGNALS SIGUSR1s sent one at a time (each after"
    echo "  the child had the last) to an idle init, per signal; then for one SIGTERM (tfinit's begins its"
    echo "  shutdown and logs it); each reading 5 ms after the child had the signal; $CPU_TRIALS inits each, all on one"
    echo "  CPU (\`taskset -c 0\`: across two, idle-vCPU wake-ups decide the median). *Reap*: the spawner forks the"
    echo "  orphans, which exit at once, and exits; from then until /proc shows only the init and the"
    echo "  measuring child (polled every 0.5 ms, reading /proc only up to a third process)."
    echo "  *Start-to-exec*: from clone() to the child's main; it includes the namespace's creation"
    echo "  and, for dynamic binaries, the loader. *Exit*: from the child's last instruction (it exits"
    echo "  once the init is idle: every thread asleep and its CPU time still for 10 ms, 20 ms at least)"
    echo "  to waitpid on the init returning, namespace teardown included."
    echo "- Load average $load_before before the run, $(cut -d' ' -f1-3 /proc/loadavg) after: on a shared"
    echo "  machine the p99s and the reap medians move by tens of percent from run to run."
    echo "- Targets (issue 2), tfinit against the best of the three peers:"
    echo "  - latency p50: $(verdict "$(get latency tfinit p50)" "$(best latency p50)" µs)"
    echo "  - reaping: $(verdict "$(get reap tfinit reap_ms median)" "$(best reap reap_ms median)" ms)"
    echo "  - exit time p50: $(verdict "$(get lifecycle tfinit exit_us p50)" "$(best lifecycle exit_us p50)" µs)"
    echo "  - memory under 2 MiB: $([ "$rss_kib" -lt 2048 ] && echo met || echo missed): VmRSS $rss_kib KiB"
    echo "  - static binary under 2 MiB: $([ "$(bench_static "$TFINIT_BIN")" = static ] && [ "$tf_size" -lt 2097152 ] && echo met || echo missed): $tf_size bytes, $(bench_static "$TFINIT_BIN")"
    echo "- Targets (issue 25), tfinit within 1.5x of the best of the three peers:"
    echo "  - CPU per forwarded signal (SIGUSR1): $(verdict "$(get cpu tfinit cpu_us median)" "$(best cpu cpu_us median)" µs 1.5)"
    echo "  - CPU for the stop signal (SIGTERM): $(verdict "$(get cpu tfinit term_cpu_us median)" "$(best cpu term_cpu_us median)" µs 1.5)"
    echo "  - exit time p50: $(verdict "$(get lifecycle tfinit exit_us p50)" "$(best lifecycle exit_us p50)" µs 1.5)"
    floor=$(get lifecycle floor exit_us p50)
    echo "  - the floor of that exit: a do-nothing init holding $FILE_KIB KiB of tfinit's binary mapped and"
    echo "    $ANON_KIB KiB of anonymous memory, as tfinit does when idle (scripts/bench/mapinit.c), exits in $floor µs, $(awk -v f="$floor" -v b="$(best lifecycle exit_us p50)" 'BEGIN { printf "%.2fx", f / b }') of the best peer;"
    echo "    tfinit's own work on top: $(awk -v t="$(get lifecycle tfinit exit_us p50)" -v f="$floor" 'BEGIN { printf "%.1f", t - f }') µs"
} >"$section"
cat "$section"

# idle_wakeups BIN SECONDS: context switches of every thread of BIN as PID 1 supervising a
# sleeping child for SECONDS (state directory on, default TTL: a heartbeat every 10 s).
idle_wakeups() {
    local bin=$1 secs=$2 dir pid init total=0
    dir=$(mktemp -d "$WORK/idle.XXXXXX")
    mkdir -p "$dir/run" "$dir/state"
    TFINIT_RUN_DIR=$dir/run TFINIT_STATE_DIR=$dir/state TFINIT_OWNER=bench-idle \
        unshare --pid --fork --mount-proc "$bin" -- sleep $((secs + 30)) &
    pid=$!
    for _ in $(seq 100); do
        init=$(cat "/proc/$pid/task/$pid/children" 2>/dev/null | awk '{print $1}')
        [ -n "$init" ] && break
        sleep 0.05
    done
    sleep 2 # set-up done: count the idle init only
    sw() { cat /proc/"$init"/task/*/status 2>/dev/null | awk '/ctxt_switches/ { n += $2 } END { print n + 0 }'; }
    local before after
    before=$(sw)
    sleep "$secs"
    after=$(sw)
    kill -KILL "$init" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    echo $((after - before))
}

# A scrape never delays forwarding (issue 20): tfinit alone against tfinit serving
# TFINIT_METRICS_ADDR to scripts/bench/scraper.py (a full scrape every 100 ms, and a client that
# sends a request and never reads the answer), interleaved in one run. Each init waits 250 ms
# before its SIGTERM so that scrapes and a stuck client overlap every trial.
SCRAPE_TRIALS=${BENCH_SCRAPE_TRIALS:-100}
SCRAPE_PORT=${BENCH_SCRAPE_PORT:-19102}
command -v python3 >/dev/null || { echo "bench-pid1: python3 is missing (the scraper)" >&2; exit 2; }
python3 scripts/bench/scraper.py 127.0.0.1 "$SCRAPE_PORT" >"$WORK/scraper" 2>&1 &
scraper=$!
echo "bench-pid1: latency $SCRAPE_TRIALS, tfinit with and without a scraper" >&2
BENCH_SETTLE_MS=250 "$B" latency "$SCRAPE_TRIALS" "tfinit=$TFINIT_BIN --" \
    "tfinit-scraped=/usr/bin/env TFINIT_METRICS_ADDR=127.0.0.1:$SCRAPE_PORT $TFINIT_BIN --" \
    | tee "$WORK/scrape" >&2
kill -TERM "$scraper"
wait "$scraper" || true
{
    echo
    echo "Forwarding with a metrics scraper (issue 20), in one interleaved run of $SCRAPE_TRIALS trials each, each"
    echo "init idle 250 ms before its SIGTERM: tfinit without TFINIT_METRICS_ADDR $(get scrape tfinit p50) / $(get scrape tfinit p99) µs"
    echo "(p50 / p99), tfinit serving it to a scrape every 100 ms plus a client that never reads"
    echo "$(get scrape tfinit-scraped p50) / $(get scrape tfinit-scraped p99) µs. Scraper: $(cat "$WORK/scraper")."
} | tee -a "$section"

if [ -n "$BASE_BIN" ]; then
    IDLE=${BENCH_IDLE_SECONDS:-60}
    ab() { # ab LABEL WHAT FIELD [FIELD2]
        local new old
        new=$(get "$2" tfinit "${@:3}") old=$(get "$2" tfinit-base "${@:3}")
        awk -v l="$1" -v n="$new" -v o="$old" 'BEGIN { printf "| %s | %s | %s | %+.1f%% |\n", l, o, n, (n - o) * 100 / o }'
    }
    {
        echo
        echo "A/B in the same interleaved trials: ${TFINIT_BASE_LABEL:-\`$BASE_BIN\`} (base) against this build."
        echo
        echo "| | base | this build | change |"
        echo "| --- | ---: | ---: | ---: |"
        ab "latency p50 (µs)" latency p50
        ab "CPU per SIGUSR1, median (µs)" cpu cpu_us median
        ab "CPU for the SIGTERM, median (µs)" cpu term_cpu_us median
        ab "exit p50 (µs)" lifecycle exit_us p50
        ab "reap $ORPHANS orphans, median (ms)" reap reap_ms median
        ab "VmRSS idle, median (KiB)" rss rss_kib median
        echo "| idle context switches in ${IDLE} s (all threads) | $(idle_wakeups "$BASE_BIN" "$IDLE") | $(idle_wakeups "$TFINIT_BIN" "$IDLE") | |"
    } | tee -a "$section"
fi

if [ "$WRITE" = 1 ]; then
    bench_write_section bench-pid1 "$section"
    echo "bench-pid1: wrote the PID 1 section of docs/benchmarks.md" >&2
fi
