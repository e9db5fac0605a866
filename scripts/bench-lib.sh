# Shared by the bench-*.sh scripts: `source scripts/bench-lib.sh`.

# One line naming the machine: CPU model, CPU count, kernel.
bench_machine() {
    local cpu
    cpu=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
    echo "${cpu:-an unknown CPU}, $(nproc) CPUs, kernel $(uname -r)"
}

# The commit the working tree is at, with "+changes" when it has local changes.
bench_commit() {
    local c
    c=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
    if ! git diff --quiet HEAD 2>/dev/null; then c="$c+changes"; fi
    echo "$c"
}

# bench_write_section NAME BODY_FILE [DOC]: replaces what lies between `<!-- NAME:start -->` and
# `<!-- NAME:end -->` in DOC (default docs/benchmarks.md) with BODY_FILE. Fails when a marker is
# missing: the document's structure (headings, prose around the markers) is not the script's.
bench_write_section() {
    local name=$1 body=$2 doc=${3:-docs/benchmarks.md} tmp
    if ! grep -q "<!-- $name:start -->" "$doc" || ! grep -q "<!-- $name:end -->" "$doc"; then
        echo "bench: the markers <!-- $name:start --> / <!-- $name:end --> are missing in $doc" >&2
        return 1
    fi
    tmp=$(mktemp "$doc.XXXXXX")
    awk -v body="$body" -v start="<!-- $name:start -->" -v end="<!-- $name:end -->" '
        index($0, start) { print; while ((getline l < body) > 0) print l; skip = 1; next }
        index($0, end)   { skip = 0 }
        !skip' "$doc" >"$tmp"
    cat "$tmp" >"$doc"
    rm -f "$tmp"
}

# bench_static FILE: "static" or "dynamic", from file(1).
bench_static() {
    case "$(file -L "$1")" in
        *"statically linked"* | *"static-pie linked"*) echo static ;;
        *) echo dynamic ;;
    esac
}

# bench_cc SRC OUT [GCC_FLAGS...]: compiles scripts/bench/SRC (the benchmarks' C programs) into
# OUT, with every warning an error: a warning in a measuring program is a bug in the figures.
bench_cc() {
    local src=$1 out=$2
    shift 2
    command -v gcc >/dev/null || { echo "bench: gcc is missing (apt-get install gcc)" >&2; return 2; }
    gcc -O2 -Wall -Werror "$@" -o "$out" "scripts/bench/$src"
}
