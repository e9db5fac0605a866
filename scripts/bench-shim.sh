#!/usr/bin/env bash
# What the terraform shim costs (issue 3): a run through the shim and the init against exec'ing
# the same program directly, the relay's throughput, and the init's memory with runs attached.
#
#   scripts/bench-shim.sh [--write] [RUNS]   # default 1000 runs per latency row; needs root, gcc
#   TFINIT_BIN=/path/to/tfinit scripts/bench-shim.sh
#
# --write replaces the section between <!-- bench-shim:start --> and <!-- bench-shim:end --> in
# docs/benchmarks.md with the results (date, machine and commit included); without it the section
# is only printed.
#
# The "terraform" is a tiny static C program (scripts/bench/shim-fake.c, built here): it exits 0 at
# once, or writes FAKE_BYTES bytes of stdout in 128 KiB writes, or sleeps FAKE_SLEEP seconds. That
# is the cheapest honest stand-in: it costs the same in both columns, so the difference is the
# shim's. The init runs as PID 1 of a PID namespace (unshare) with `sleep infinity` as its
# controller; the shim is a `terraform` symlink to tfinit first on PATH, the fake `terraform`
# after it, exactly as in a container. A small C driver (scripts/bench/shim-driver.c, also built
# here) starts each run with posix_spawn and times it with CLOCK_MONOTONIC:
#   latency     spawn to reaped exit, stdio on /dev/null, RUNS runs after 50 warm-up runs; p50,
#               p90, p99, max. `version` takes no state lock; `plan` does, so the init also writes
#               and removes a lock-owner record for it (TFINIT_STATE_DIR on /tmp).
#   throughput  1 GiB on stdout into a pipe the driver drains with 1 MiB reads; best of 3.
#   memory      first: the init's VmRSS with nothing running, then with 64 runs attached (the fake
#               sleeps); one shim's VmRSS; last, the init's VmHWM (peak) after the throughput runs.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh

WRITE=0
if [ "${1:-}" = --write ]; then
    WRITE=1
    shift
fi
RUNS=${1:-1000}
WARMUP=50
GIB=$((1 << 30))
ATTACHED=64
[ "$(id -u)" = 0 ] || { echo "bench-shim: needs root (unshare --pid); run it as root or in the CI container" >&2; exit 2; }
for tool in unshare gcc; do
    command -v "$tool" >/dev/null || { echo "bench-shim: $tool is missing (apt-get install util-linux gcc)" >&2; exit 2; }
done

REL=target/x86_64-unknown-linux-gnu/release
if [ -z "${TFINIT_BIN:-}" ]; then
    cargo build --release --quiet --bin tfinit
    TFINIT_BIN=$REL/tfinit
fi
TFINIT_BIN=$(readlink -f "$TFINIT_BIN")

WORK=$(mktemp -d /tmp/tfinit-bench-shim.XXXXXX)
INIT_PID=""
cleanup() {
    [ -n "$INIT_PID" ] && kill -KILL "$INIT_PID" 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
mkdir -p "$WORK/shim" "$WORK/fake" "$WORK/run" "$WORK/state"

# ----- the fake terraform and the driver -----
bench_cc shim-fake.c "$WORK/fake/terraform" -static
bench_cc shim-driver.c "$WORK/driver"
ln -s "$TFINIT_BIN" "$WORK/shim/terraform"
FAKE=$WORK/fake/terraform
SHIM=$WORK/shim/terraform
export PATH="$WORK/shim:$WORK/fake:$PATH" TFINIT_RUN_DIR="$WORK/run"

# ----- the init -----
TFINIT_STATE_DIR="$WORK/state" TFINIT_LOG=info \
    unshare --pid --fork --mount-proc --kill-child "$TFINIT_BIN" -- sleep infinity \
    </dev/null >/dev/null 2>"$WORK/init.log" &
UNSHARE_PID=$!
for _ in $(seq 200); do
    "$TFINIT_BIN" status >/dev/null 2>&1 && break
    sleep 0.05
done
"$TFINIT_BIN" status >/dev/null || { echo "bench-shim: the init did not come up:" >&2; cat "$WORK/init.log" >&2; exit 1; }
INIT_PID=$(awk '{ print $1 }' "/proc/$UNSHARE_PID/task/$UNSHARE_PID/children")
rss() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/status"; }
init_runs() { "$TFINIT_BIN" status | grep -c '"id":' || true; }

# ----- memory -----
# First, before any relay has grown the init's buffers.
rss_idle=$(rss "$INIT_PID" VmRSS)
shims=()
for _ in $(seq "$ATTACHED"); do
    FAKE_SLEEP=600 "$SHIM" apply -auto-approve </dev/null >/dev/null 2>&1 &
    shims+=($!)
done
for _ in $(seq 400); do
    [ "$(init_runs)" = "$ATTACHED" ] && break
    sleep 0.05
done
[ "$(init_runs)" = "$ATTACHED" ] || { echo "bench-shim: $ATTACHED runs never were in flight together" >&2; exit 1; }
rss_attached=$(rss "$INIT_PID" VmRSS)
rss_shim=$(rss "${shims[0]}" VmRSS)
# Abandoned: the init SIGTERMs each fake, which exits; wait until every run is gone.
{
    kill -KILL "${shims[@]}"
    wait "${shims[@]}"
} 2>/dev/null || true
for _ in $(seq 400); do
    [ "$(init_runs)" = 0 ] && break
    sleep 0.05
done

# ----- latency -----
LOAD=$(cut -d' ' -f1-3 /proc/loadavg)
# lat NAME PATH ARGS...: RUNS timed runs into $WORK/NAME.txt (microseconds).
lat() {
    local name=$1
    shift
    "$WORK/driver" lat "$RUNS" "$WARMUP" "$@" >"$WORK/$name.txt"
}
lat direct-version "$FAKE" terraform version
lat shim-version "$SHIM" terraform version
lat direct-plan "$FAKE" terraform plan -input=false
lat shim-plan "$SHIM" terraform plan -input=false
grep -q "terraform started" "$WORK/init.log" || { echo "bench-shim: the runs did not go through the init" >&2; exit 1; }

# pct FILE P: the P-th percentile (nearest rank) of a file of numbers, in ms.
pct() { sort -g "$1" | awk -v p="$2" '{ v[NR] = $1 } END { r = int(p * NR + 0.999999); if (r < 1) r = 1; printf "%.3f", v[r] / 1000 }'; }
maxv() { sort -g "$1" | tail -1 | awk '{ printf "%.3f", $1 / 1000 }'; }
latrow() { echo "| $1 | $(pct "$WORK/$2.txt" 0.50) | $(pct "$WORK/$2.txt" 0.90) | $(pct "$WORK/$2.txt" 0.99) | $(maxv "$WORK/$2.txt") |"; }
added() { awk -v a="$(pct "$WORK/shim-$1.txt" "$2")" -v b="$(pct "$WORK/direct-$1.txt" "$2")" 'BEGIN { printf "%.3f", a - b }'; }

# ----- throughput -----
# tput PATH: best GiB/s of 3 runs writing 1 GiB.
tput() {
    local best=0 line bytes secs
    for _ in 1 2 3; do
        line=$(FAKE_BYTES=$GIB "$WORK/driver" tput "$1" terraform show -json)
        bytes=${line% *}
        secs=${line#* }
        [ "$bytes" = "$GIB" ] || { echo "bench-shim: $bytes bytes arrived, not $GIB" >&2; exit 1; }
        best=$(awk -v b="$best" -v s="$secs" -v n="$bytes" 'BEGIN { g = n / s / 1073741824; printf "%.2f", (g > b ? g : b) }')
    done
    echo "$best"
}
tput_direct=$(tput "$FAKE")
tput_shim=$(tput "$SHIM")
hwm_after_tput=$(rss "$INIT_PID" VmHWM)
kill -TERM "$INIT_PID"
wait "$UNSHARE_PID" || true
INIT_PID=""

# ----- report -----
p50_added=$(added version 0.50)
section="$WORK/section.md"
{
    echo "Measured $(date -u +%Y-%m-%d) with \`scripts/bench-shim.sh $RUNS\`: tfinit $("$TFINIT_BIN" --version | cut -d' ' -f2)"
    echo "(release build, $(bench_static "$TFINIT_BIN"), commit $(bench_commit)) on $(bench_machine);"
    echo "load average $LOAD (1, 5, 15 min) just before the latency runs: other work on the machine"
    echo "shows in the p90/p99 columns."
    echo
    echo "Latency of one run, spawn to exit, $RUNS runs after $WARMUP warm-up runs (milliseconds):"
    echo
    echo "| run | p50 | p90 | p99 | max |"
    echo "| --- | ---: | ---: | ---: | ---: |"
    latrow "\`terraform version\`, direct" direct-version
    latrow "\`terraform version\`, through the shim" shim-version
    latrow "\`terraform plan\`, direct" direct-plan
    latrow "\`terraform plan\`, through the shim (+ lock-owner record)" shim-plan
    echo
    echo "Added by the shim: $p50_added ms at p50 and $(added version 0.99) ms at p99 for \`version\`;"
    echo "$(added plan 0.50) ms at p50 and $(added plan 0.99) ms at p99 for \`plan\`. Target: at most 2 ms at p50."
    echo
    echo "| relay of 1 GiB of stdout into a pipe | GiB/s (best of 3) |"
    echo "| --- | ---: |"
    echo "| direct | $tput_direct |"
    echo "| through the shim | $tput_shim |"
    echo
    echo "Target: at least 1 GiB/s through the shim."
    echo
    echo "| memory | KiB |"
    echo "| --- | ---: |"
    echo "| init VmRSS, no run | $rss_idle |"
    echo "| init VmRSS, $ATTACHED runs attached | $rss_attached |"
    echo "| init VmHWM (peak) after the 1 GiB relays | $hwm_after_tput |"
    echo "| one shim's VmRSS | $rss_shim |"
    echo
    echo "- The \"terraform\" is a static C program that exits at once (latency), writes 1 GiB in"
    echo "  128 KiB writes (throughput) or sleeps (memory); the driver starts runs with posix_spawn,"
    echo "  stdio on /dev/null, and reads the 1 GiB from a pipe with 1 MiB reads."
    echo "- \`plan\` takes the state lock, so the init also writes a lock-owner record (temporary file,"
    echo "  fsync, rename, fsync of the directory) before terraform starts and removes it after, in"
    echo "  TFINIT_STATE_DIR, here a directory in /tmp (file system: $(stat -f -c %T "$WORK/state")): that is its extra cost over \`version\`."
    echo "- The init is PID 1 of a PID namespace with \`sleep infinity\` as its controller; the shim is a"
    echo "  \`terraform\` symlink to tfinit first on PATH, the fake after it; the driver runs outside the"
    echo "  namespace and reaches the init through its socket, as the controller would from inside."
} >"$section"
cat "$section"

if [ "$WRITE" = 1 ]; then
    bench_write_section bench-shim "$section"
    echo "bench-shim: wrote the Shim section of docs/benchmarks.md"
fi
