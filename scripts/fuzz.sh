#!/usr/bin/env bash
# Fuzz tfinit's parsers with libFuzzer + AddressSanitizer (cargo-fuzz's build, without cargo-fuzz).
#
#   scripts/fuzz.sh                    short run of every target (the test suite's step):
#                                      FUZZ_SECONDS each, default 30
#   scripts/fuzz.sh long               10 minutes per target (FUZZ_SECONDS=600), one after the other
#   FUZZ_JOBS=N scripts/fuzz.sh       short run of N targets at a time (the test suite uses 2)
#   scripts/fuzz.sh [short|long] T...  only targets T (decoder record lockinfo follower)
#   scripts/fuzz.sh build              only build the targets (scripts/test.sh builds them beside
#                                      the integration tests, then runs the short run)
#   scripts/fuzz.sh merge [T...]       after a run with FUZZ_KEEP=DIR: add to fuzz/corpus/T a small set
#                                      of the inputs of DIR/T that reach what the kept corpus does not
#
# Targets (fuzz/fuzz_targets/, each states the properties it asserts): decoder (socket frames),
# record (lock-owner record files), lockinfo (terraform's Lock Info and Go times), follower
# (terraform output -> resources in progress).
#
# The seed corpus fuzz/corpus/T is only read: what a run discovers goes to a scratch directory
# (kept with FUZZ_KEEP=DIR, else deleted). A crash or a hang (an input taking over 10 s) fails
# the run; the input is saved in fuzz/artifacts/T/ and the command to replay it is printed.
# Each target ends with a line `fuzz: T: S s, N execs, corpus C inputs (B), crashes 0`.
#
# Needs a nightly toolchain, else the stable one with RUSTC_BOOTSTRAP=1; not cargo-fuzz. The
# targets are built with plain `cargo build` and the RUSTFLAGS that cargo-fuzz 0.13.2 passes for
# `cargo fuzz build [--dev] -O --debug-assertions` (its src/project.rs), so a clean machine does
# not compile cargo-fuzz (~50 s of CPU) before the test command can fuzz; `cargo fuzz run T` still
# works on a machine that has it (fuzz/ is a cargo-fuzz project).
#
# The repository's .cargo/config.toml sets crt-static and relocation-model=static for the
# explicit target; RUSTFLAGS take precedence over target.<triple>.rustflags, so the fuzz build
# is a normal dynamically linked, sanitized one.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGETS=(decoder record lockinfo follower)
MODE=short
case "${1:-}" in
    short|long|merge|build) MODE=$1; shift ;;
esac
if [ $# -gt 0 ]; then
    TARGETS=("$@")
fi
case $MODE in
    short) SECONDS_EACH=${FUZZ_SECONDS:-30} ;;
    long) SECONDS_EACH=${FUZZ_SECONDS:-600} ;;
    merge) SECONDS_EACH=0; : "${FUZZ_KEEP:?set FUZZ_KEEP to the directory a run kept}" ;;
    build) SECONDS_EACH=0 ;;
esac

missing() {
    if [ -n "${CI:-}" ] || [ -n "${TFINIT_REQUIRE_DEPS:-}" ]; then
        echo "fuzz: FAILED: $1" >&2
        exit 1
    fi
    echo "fuzz: SKIP: $1"
    exit 0
}
# The sanitizer flags need a nightly compiler; without the nightly toolchain, the default one
# (stable) accepts them with RUSTC_BOOTSTRAP=1.
if rustup run nightly rustc --version >/dev/null 2>&1; then
    TOOLCHAIN=(+nightly)
else
    TOOLCHAIN=()
    export RUSTC_BOOTSTRAP=1
    echo "fuzz: no nightly toolchain; using the default one with RUSTC_BOOTSTRAP=1"
fi
cargo "${TOOLCHAIN[@]}" --version >/dev/null 2>&1 || missing "cargo ${TOOLCHAIN[*]} does not run"

# cargo-fuzz 0.13.2's RUSTFLAGS (address sanitizer, x86_64 Linux): SanitizerCoverage with inline
# 8-bit counters, the PC table, compare tracing and stack depth, `--cfg fuzzing`, no branch
# folding, debug assertions (an overflow is a finding, not a wrap).
TRIPLE=x86_64-unknown-linux-gnu
RUSTFLAGS_FUZZ="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing \
-Cllvm-args=-simplifycfg-branch-fold-threshold=0 -Zsanitizer=address \
-Cllvm-args=-sanitizer-coverage-stack-depth -Cdebug-assertions"
# FUZZ_DEV=1 (the test suite's smoke run): the targets unoptimised, with debug assertions. The
# optimised build (release, one codegen unit) was the last step the test command waited for; a
# smoke run of 10 s replays each corpus either way. The long run keeps the optimised build:
# release, line tables only, one codegen unit (as cargo-fuzz forces: the sancov passes defeat
# ThinLTO's imports).
if [ -n "${FUZZ_DEV:-}" ] && [ "$MODE" != long ]; then
    BUILD_FLAGS=()
    PROFILE_DIR=debug
else
    BUILD_FLAGS=(--release --config 'profile.release.debug="line-tables-only"')
    RUSTFLAGS_FUZZ="$RUSTFLAGS_FUZZ -Ccodegen-units=1"
    PROFILE_DIR=release
fi
# The user's RUSTFLAGS come last, so that they win (as with cargo-fuzz).
export RUSTFLAGS="$RUSTFLAGS_FUZZ${RUSTFLAGS:+ $RUSTFLAGS}"
# AddressSanitizer: Rust's symbols are defined once per crate graph, not per ODR.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_odr_violation=0"
FUZZ_BUILD=(cargo "${TOOLCHAIN[@]}" build --manifest-path fuzz/Cargo.toml --target "$TRIPLE" --bins)
# Inputs up to 8 KiB (the largest seed is 4 KiB); 10 s for one input is a hang.
LIBFUZZER_FLAGS=(-max_len=8192 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1)

SCRATCH=${FUZZ_KEEP:-$(mktemp -d "${TMPDIR:-/tmp}/tfinit-fuzz.XXXXXX")}
mkdir -p "$SCRATCH"
if [ -z "${FUZZ_KEEP:-}" ]; then
    trap 'rm -rf "$SCRATCH"' EXIT
fi

# The targets are built once and run directly: every target of a run tests the same build.
BIN=fuzz/target/$TRIPLE/$PROFILE_DIR
echo "fuzz: building the targets"
if ! "${FUZZ_BUILD[@]}" "${BUILD_FLAGS[@]}" >"$SCRATCH/build.log" 2>&1; then
    tail -n 40 "$SCRATCH/build.log" >&2
    echo "fuzz: FAILED: the fuzz targets do not build" >&2
    exit 1
fi
if [ "$MODE" = build ]; then
    echo "fuzz: targets built in $BIN"
    exit 0
fi

if [ "$MODE" = merge ]; then
    KEEP=$FUZZ_KEEP
    for t in "${TARGETS[@]}"; do
        before=$(find "fuzz/corpus/$t" -type f | wc -l)
        "$BIN/$t" -set_cover_merge=1 "${LIBFUZZER_FLAGS[@]}" "fuzz/corpus/$t" "$KEEP/$t" \
            >"$KEEP/$t.merge.log" 2>&1
        after=$(find "fuzz/corpus/$t" -type f | wc -l)
        echo "fuzz: $t: corpus $before -> $after inputs ($(du -sh "fuzz/corpus/$t" | cut -f1))"
    done
    exit 0
fi

# Runs target $1 for SECONDS_EACH and writes its report line to $SCRATCH/$1.result (and, when it
# passed, its row of the figures to $SCRATCH/$1.row); returns 1 on a finding.
run_target() {
    local t=$1 log="$SCRATCH/$1.log" start rc took execs corpus inputs bytes artifact
    mkdir -p "$SCRATCH/$t" "fuzz/artifacts/$t"
    start=$(date +%s)
    set +e
    "$BIN/$t" "$SCRATCH/$t" "fuzz/corpus/$t" -artifact_prefix="fuzz/artifacts/$t/" \
        -max_total_time="$SECONDS_EACH" "${LIBFUZZER_FLAGS[@]}" >"$log" 2>&1
    rc=$?
    set -e
    took=$(($(date +%s) - start))
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n1 || true)
    corpus=$(grep -o 'corp: [0-9]*/[0-9]*[a-zA-Z]*' "$log" | tail -n1 | sed 's/corp: //' || true)
    inputs=${corpus%%/*}
    bytes=${corpus#*/}
    if [ "$rc" = 0 ]; then
        echo "fuzz: $t: ${took} s, ${execs:-?} execs, corpus ${inputs:-?} inputs (${bytes:-?}), crashes 0" >"$SCRATCH/$t.result"
        echo "| $t | ${took} s | ${execs:-?} | $((${execs:-0} / (took > 0 ? took : 1))) | ${inputs:-?} inputs, ${bytes:-?} | 0 |" >"$SCRATCH/$t.row"
        return 0
    fi
    artifact=$(grep -o "fuzz/artifacts/$t/[^ ]*" "$log" | tail -n1 || true)
    {
        echo "fuzz: $t: FAILED after ${took} s (exit $rc), ${execs:-?} execs"
        grep -E 'panicked|ERROR: libFuzzer|ERROR: AddressSanitizer|SUMMARY' "$log" | head -n 5 || true
        tail -n 30 "$log"
        if [ -n "$artifact" ]; then
            echo "fuzz: $t: input saved as $artifact; replay: $BIN/$t $artifact (or, with cargo-fuzz: cargo +nightly fuzz run $t $artifact)"
        fi
    } >"$SCRATCH/$t.result"
    return 1
}

# FUZZ_JOBS targets at a time (default 1; the test suite's short run uses one per core: each
# target is one process, and a short run is bounded by wall time, not by executions). The long
# run's figures are of one target at a time.
jobs_at_once=${FUZZ_JOBS:-1}
[ "$MODE" = long ] && jobs_at_once=1
failed=0
ROWS=""
declare -A running=()
# Waits for the oldest target still running and prints its report (in the order they started).
collect() {
    local t=$1
    if ! wait "${running[$t]}"; then
        failed=1
    fi
    unset "running[$t]"
    if grep -q FAILED "$SCRATCH/$t.result"; then cat "$SCRATCH/$t.result" >&2; else cat "$SCRATCH/$t.result"; fi
    [ -f "$SCRATCH/$t.row" ] && ROWS+="$(cat "$SCRATCH/$t.row")"$'\n'
    return 0
}
order=()
for t in "${TARGETS[@]}"; do
    if [ "${#running[@]}" -ge "$jobs_at_once" ]; then
        collect "${order[0]}"
        order=("${order[@]:1}")
    fi
    echo "fuzz: $t: running ${SECONDS_EACH}s"
    run_target "$t" &
    running[$t]=$!
    order+=("$t")
done
for t in "${order[@]}"; do
    collect "$t"
done
if [ -n "${FUZZ_KEEP:-}" ]; then
    echo "fuzz: corpora and logs kept in $SCRATCH (scripts/fuzz.sh merge adds what is new to fuzz/corpus)"
fi

# A long run without a finding rewrites the figures in docs/reliability.md: the rows of the
# targets it ran (those of the others are kept).
if [ "$MODE" = long ] && [ "$failed" = 0 ]; then
    for t in decoder record lockinfo follower; do
        if ! printf '%s' "$ROWS" | grep -q "^| $t |"; then
            ROWS+=$(sed -n "/<!-- fuzz:start -->/,/<!-- fuzz:end -->/p" docs/reliability.md |
                grep "^| $t |" || true)
            ROWS+=$'\n'
        fi
    done
    ROWS=$(printf '%s' "$ROWS" | grep -v '^$' |
        awk -F' [|] ' '{ o = index("decoder record lockinfo follower", substr($1, 3)); print o "\t" $0 }' |
        sort -n | cut -f2-)
    BLOCK="\`scripts/fuzz.sh long\` (last run $(date -u +%Y-%m-%d), cargo-fuzz 0.13.2's flags, \
$(rustc "${TOOLCHAIN[@]}" --version | cut -d' ' -f1-2), libFuzzer + AddressSanitizer, release with debug
assertions, one target at a time on a 2-core machine shared with other builds):

| target | duration | executions | per second | corpus at the end | crashes and hangs |
| --- | --- | --- | --- | --- | --- |
$ROWS"
    BLOCK="$BLOCK" awk '
        /<!-- fuzz:start -->/ { print; print ENVIRON["BLOCK"]; skip = 1; next }
        /<!-- fuzz:end -->/ { skip = 0 }
        !skip' docs/reliability.md >docs/reliability.md.tmp
    mv docs/reliability.md.tmp docs/reliability.md
    echo "fuzz: figures written to docs/reliability.md"
fi
exit $failed
