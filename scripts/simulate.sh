#!/usr/bin/env bash
# Deep runs of the deterministic simulation (tests/simulation.rs): N schedules in release mode,
# one process per core, each on its own range of seeds, with longer schedules than the test
# suite's (TFINIT_SIM_MAX_TTLS, default 10 TTLs of trouble instead of 4).
#
# Usage: scripts/simulate.sh [N] [FIRST]   N schedules (default 1000000) from seed FIRST (default
#                                          1000000, after the test suite's 0..100000)
#   JOBS=4 scripts/simulate.sh ...         processes (default: the number of cores)
#   EXPLORE=1 scripts/simulate.sh ...      do not stop at a violation: list every kind found, with
#                                          its first seeds (TFINIT_SIM_EXPLORE)
#   LEGACY=1 scripts/simulate.sh ...       the model of the rules before issue 18
#   OFF=fence scripts/simulate.sh ...      one safety guard turned off (the mutation check's
#                                          names: watch, fence, fresh-heartbeat, unseen, shadowed,
#                                          recover-lock, live-on-host, lock-file-inode,
#                                          state-identity, owners-ttl, live-runs, wordings)
#   FOCUS=crowd scripts/simulate.sh ...    favour one trouble (tests/simulation.rs FOCI)
# Exit status: 0 when no schedule broke an invariant (always 0 with EXPLORE=1). A failing seed's
# schedule, what happened, its shrunk schedule and the replay command are in its job's log,
# printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-1000000}
first=${2:-1000000}
jobs=${JOBS:-$(nproc)}
export TFINIT_SIM_MAX_TTLS=${TFINIT_SIM_MAX_TTLS:-10}
export TFINIT_SIM_THREADS=1
[ -n "${EXPLORE:-}" ] && export TFINIT_SIM_EXPLORE=1
[ -n "${LEGACY:-}" ] && export TFINIT_SIM_LEGACY=1
[ -n "${OFF:-}" ] && export TFINIT_SIM_OFF=$OFF
[ -n "${FOCUS:-}" ] && export TFINIT_SIM_FOCUS=$FOCUS

# The test binary, built once (release: the seeds run about 2 to 3 times as fast as in debug).
bin=$(cargo test --release --test simulation --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "simulation" and m.get("executable"):
        print(m["executable"])')
[ -n "$bin" ] || { echo "simulate.sh: building tests/simulation.rs failed (cargo test --release --test simulation --no-run)" >&2; exit 1; }

logs=target/simulate
rm -rf "$logs"
mkdir -p "$logs"
per=$(((n + jobs - 1) / jobs))
start=$SECONDS
pids=()
for ((j = 0; j < jobs; j++)); do
    from=$((first + j * per))
    count=$((per < n - j * per ? per : n - j * per))
    [ "$count" -gt 0 ] || break
    TFINIT_SIM_FIRST=$from TFINIT_SIM_SCHEDULES=$count \
        "$bin" todays_rules_hold_on_many_schedules --exact --nocapture >"$logs/job$j.log" 2>&1 &
    pids+=($!)
done
failed=0
for j in "${!pids[@]}"; do
    if ! wait "${pids[$j]}"; then
        failed=$((failed + 1))
        echo "== job $j (seeds from $((first + j * per))) FAILED:"
        cat "$logs/job$j.log"
    fi
done
echo "== summary ($((SECONDS - start)) s, $jobs jobs, seeds $first..$((first + n)), TFINIT_SIM_MAX_TTLS=$TFINIT_SIM_MAX_TTLS${LEGACY:+, legacy rules}${TFINIT_SIM_OFF:+, guard off: $TFINIT_SIM_OFF}${TFINIT_SIM_FOCUS:+, focus: $TFINIT_SIM_FOCUS})"
grep -h "^simulation \|^ *[0-9]\+  " "$logs"/job*.log || true
if [ "$failed" -gt 0 ]; then
    echo "simulate.sh: $failed job(s) found a schedule that breaks an invariant (see above)" >&2
    exit 1
fi
