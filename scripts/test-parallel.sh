#!/usr/bin/env bash
# Runs the unit and integration tests as a few groups of test binaries at once (issue 14, point 7):
# the binaries are built once with `cargo test --no-run`, then each group runs its binaries one
# after the other in a background job, writing target/test-logs/GROUP.log; the logs are printed
# in order once every job has ended. Groups share nothing a test can see (each test has its own
# temp dir, PID namespace, run dir, moto port and Docker names); what must not overlap stays in
# one group: the heavy process/pid bursts (load, bad_input_peers, pid1_reaping, shim_bytes,
# hostile_clients) run one after the other in `heavy`, the Docker tests in `pods`. Most tests
# wait on processes, not on the CPU, which is why 5 groups (one of them the simulation, which
# computes) fit on 2 cores; the CPU is still busy all through (vmstat: 0 % idle), so the groups
# are balanced to end together. A test binary no group names goes to `rest`, so a new file is
# never left out. `kube_client` (tfinit's API client against the HTTPS stand-in, ~16 s, mostly
# waiting on deadlines and Retry-After) runs first in `rest`: its timing bounds want a group
# without the heavy bursts. `kubernetes_leases` (the Lease store on terraform's kubernetes
# backend, pods with no volume: ~50 s, mostly waiting on TTLs) runs last in `rest`, once the
# bursts of `heavy` but hostile_clients are over (it starts at ~140 s, beside hostile_clients).
#
# Usage: scripts/test-parallel.sh          (scripts/test.sh runs it; TFINIT_TEST_THREADS: threads
#                                           per binary, default 2; TFINIT_TEST_ONLY="a b": only
#                                           the test binaries a and b, no doc tests)
# Exit status: 0 when every binary passed; the last line counts them.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${TFINIT_TEST_THREADS:-2}
logs=target/test-logs
rm -rf "$logs"
mkdir -p "$logs"

# name<TAB>executable of every test binary (unit tests: unit-lib-NAME, unit-bin-NAME).
cargo test --no-run --message-format=json 2>"$logs/build.log" | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") != "compiler-artifact" or not m.get("executable") or not m["profile"]["test"]:
        continue
    kind = m["target"]["kind"][0]
    name = m["target"]["name"] if kind == "test" else "unit-" + kind + "-" + m["target"]["name"]
    print(name + "\t" + m["executable"])
' >"$logs/binaries.tsv" || {
    cat "$logs/build.log"
    echo "scripts/test-parallel.sh: building the tests failed" >&2
    exit 1
}

declare -A exe
while IFS=$'\t' read -r name path; do
    # TFINIT_TEST_ONLY="a b": only these binaries (to try the script on a few).
    case " ${TFINIT_TEST_ONLY:-$name} " in *" $name "*) exe[$name]=$path ;; esac
done <"$logs/binaries.tsv"

# Balanced on the binaries' own times (each log says what each took, wall and CPU) in a CI-like
# run of 2026-11-29 (pods 239 s, heavy 215, terraform 213, sim 194, rest 91): locks_never (43 s)
# moved from `pods` to `rest`, kubernetes_leases (52 s) from `heavy` to the end of `rest`, and
# lock_probe (21 s) from `terraform` to the end of `heavy`; each group then sums to 184-196 s.
heavy="load bad_input_peers pid1_reaping shim_bytes shim_survival hostile_clients lock_probe"
pods="locks_recovery locks_state container_shutdown container_recovery container_images"
terraform="shutdown drain max_runs cancel storage delayfs shim_signals shim_status shim_protocol examples kubernetes"
# The simulation (100,000 schedules and the mutation check, ~100 s of CPU on a loaded CI machine)
# is the one binary that computes rather than waits: a group of its own, started with the
# others, so it is never the tail of `rest`. `records` (~8 s) follows it: in a CI-like run of
# 2026-12-06 the simulation's group ended at 194 s and `pods`, with records, at 223 s.
sim="simulation records"
rest="kube_client locks_never"
rest_tail="kubernetes_leases"
for name in $(printf '%s\n' "${!exe[@]}" | sort); do
    case " $heavy $pods $terraform $sim $rest $rest_tail " in
    *" $name "*) ;;
    *) rest="$rest $name" ;;
    esac
done
rest="$rest $rest_tail"

start=$(date +%s)
# Runs the binaries named in $2.. one after the other into target/test-logs/$1.log; its exit
# status is the number of binaries that failed.
run_group() {
    local group=$1 failed=0 name
    shift
    for name in "$@"; do
        [ -n "${exe[$name]:-}" ] || continue
        echo "== $name (at $(($(date +%s) - start)) s)" >>"$logs/$group.log"
        # Each binary's wall and CPU time (bash's `time`): what to balance the groups on.
        local TIMEFORMAT="== $name took %0R s wall, %0U s user, %0S s sys"
        { time "${exe[$name]}" --test-threads="$threads" >>"$logs/$group.log" 2>&1; } 2>>"$logs/$group.log" || {
            echo "== $name FAILED" >>"$logs/$group.log"
            failed=$((failed + 1))
        }
    done
    echo "== $group done (at $(($(date +%s) - start)) s)" >>"$logs/$group.log"
    return "$failed"
}

declare -A pid
for group in heavy pods terraform sim rest; do
    : >"$logs/$group.log"
    # shellcheck disable=SC2086 # word splitting of the name lists is meant
    run_group "$group" ${!group} &
    pid[$group]=$!
done
failed=0
for group in heavy pods terraform sim rest; do
    wait "${pid[$group]}" || failed=$((failed + $?))
done

# Doc tests need cargo (rustdoc builds them); they run after the jobs, alone.
if [ -z "${TFINIT_TEST_ONLY:-}" ]; then
    cargo test --doc -- --test-threads="$threads" >"$logs/doc.log" 2>&1 || failed=$((failed + 1))
else
    : >"$logs/doc.log"
fi

for group in heavy pods terraform sim rest doc; do
    echo
    echo "===== $group ====="
    cat "$logs/$group.log"
done
passed=$(cat "$logs"/*.log | awk '/^test result:/ { s += $4 } END { print s + 0 }')
failures=$(cat "$logs"/*.log | awk '/^test result:/ { s += $6 } END { print s + 0 }')
echo
echo "scripts/test-parallel.sh: ${passed:-0} tests passed, ${failures:-0} failed, in $(($(date +%s) - start)) s;" \
    "$failed test binaries failed (logs in $logs/)"
[ "$failed" -eq 0 ]
