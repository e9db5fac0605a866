#!/usr/bin/env bash
# Builds BASE_IMAGE with tfinit as its entrypoint and keeps the base's command.
#
#   scripts/build-image.sh [OPTIONS] BASE_IMAGE TAG [-- DOCKER_BUILD_ARGS...]
#
#   --prebuilt      use target/x86_64-unknown-linux-gnu/release/tfinit (run `cargo build --release`
#                   first) instead of compiling tfinit in a Rust container: Dockerfile target
#                   image-prebuilt, which pulls nothing but BASE_IMAGE and works with the legacy builder
#   --tfinit PATH   use this static tfinit binary (implies --prebuilt)
#   --no-pull       never pull BASE_IMAGE: it must be present locally
#   --cmd JSON      the command to keep, as a JSON array (default: the base's ENTRYPOINT + CMD)
#
# Why a script: Docker clears an inherited CMD when a Dockerfile sets ENTRYPOINT and cannot take CMD
# from a build arg. So this script reads the base's ENTRYPOINT and CMD (`docker image inspect`),
# builds the Dockerfile, then sets CMD to them on top:
#   base  ENTRYPOINT ["crossplane-terraform-provider"]  CMD (none)
#   TAG   ENTRYPOINT ["/usr/local/bin/tfinit", "--"]    CMD ["crossplane-terraform-provider"]
# A base that already has tfinit's entrypoint is refused: build from the image it was made from.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ENTRYPOINT_JSON='["/usr/local/bin/tfinit","--"]'
PREBUILT="" TFINIT_BIN="" NO_PULL="" CMD_JSON=""

usage() { sed -n '2,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
die() { echo "build-image: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
    case $1 in
        --prebuilt) PREBUILT=1; shift ;;
        --tfinit) [ $# -ge 2 ] || usage; TFINIT_BIN=$2; PREBUILT=1; shift 2 ;;
        --no-pull) NO_PULL=1; shift ;;
        --cmd) [ $# -ge 2 ] || usage; CMD_JSON=$2; shift 2 ;;
        -h|--help) usage ;;
        --) break ;;
        -*) echo "build-image: unknown option $1" >&2; usage ;;
        *) break ;;
    esac
done
[ $# -ge 2 ] || usage
BASE=$1 TAG=$2
shift 2
[ "${1:-}" = "--" ] && shift
EXTRA=("$@")

# ---- the base image and its command ---------------------------------------------------------
if ! docker image inspect "$BASE" >/dev/null 2>&1; then
    [ -z "$NO_PULL" ] || die "$BASE is not present locally and --no-pull was given"
    docker pull "$BASE" || die "cannot pull $BASE"
fi
base_ep=$(docker image inspect -f '{{json .Config.Entrypoint}}' "$BASE")
base_cmd=$(docker image inspect -f '{{json .Config.Cmd}}' "$BASE")

empty() { [ "$1" = null ] || [ "$1" = "[]" ]; }
# Concatenates two JSON arrays of strings as docker prints them (`["a","b"]`, or null).
concat() {
    if empty "$1"; then echo "$2"; elif empty "$2"; then echo "$1"; else echo "${1%]},${2#[}"; fi
}
if [ "$base_ep" = "$ENTRYPOINT_JSON" ]; then
    die "$BASE already runs tfinit (ENTRYPOINT $base_ep): build from the image it was made from; its controller command is its CMD, $base_cmd"
fi
[ -n "$CMD_JSON" ] || CMD_JSON=$(concat "$base_ep" "$base_cmd")
empty "$CMD_JSON" && die "$BASE has neither ENTRYPOINT nor CMD: give the controller's command with --cmd '[\"/path/to/controller\", \"arg\"]'"
case $CMD_JSON in \[*\]) ;; *) die "--cmd must be a JSON array of strings, e.g. '[\"/usr/local/bin/provider\"]'" ;; esac

# ---- build the Dockerfile ---------------------------------------------------------------------
if [ -n "$PREBUILT" ]; then
    bin=${TFINIT_BIN:-$REPO/target/x86_64-unknown-linux-gnu/release/tfinit}
    [ -x "$bin" ] || die "$bin is missing: run \`cargo build --release\` (or pass --tfinit PATH)"
    case $(file -L "$bin" 2>/dev/null || echo unknown) in
        *"statically linked"*|*"static-pie linked"*|unknown) ;;
        *) die "$bin is not statically linked: build it with this repository's .cargo/config.toml" ;;
    esac
    # A small context of its own: the Dockerfile, the overlay and the binary, at the paths the
    # Dockerfile names (no walk through target/, which cargo may be writing to).
    ctx=$(mktemp -d "${TMPDIR:-/tmp}/tfinit-image.XXXXXX")
    trap 'rm -rf "$ctx"' EXIT
    mkdir -p "$ctx/docker" "$ctx/target/x86_64-unknown-linux-gnu/release"
    cp "$REPO/Dockerfile" "$ctx/"
    cp -a "$REPO/docker/overlay" "$ctx/docker/"
    cp "$bin" "$ctx/target/x86_64-unknown-linux-gnu/release/tfinit"
    docker build --target image-prebuilt --build-arg "BASE_IMAGE=$BASE" -t "$TAG" ${EXTRA[@]+"${EXTRA[@]}"} "$ctx"
else
    docker build --target image --build-arg "BASE_IMAGE=$BASE" -t "$TAG" ${EXTRA[@]+"${EXTRA[@]}"} "$REPO"
fi

# ---- restate the base's command ---------------------------------------------------------------
printf 'FROM %s\nCMD %s\n' "$TAG" "$CMD_JSON" | docker build -q -t "$TAG" - >/dev/null

got_ep=$(docker image inspect -f '{{json .Config.Entrypoint}}' "$TAG")
got_cmd=$(docker image inspect -f '{{json .Config.Cmd}}' "$TAG")
[ "$got_ep" = "$ENTRYPOINT_JSON" ] || die "$TAG has ENTRYPOINT $got_ep, expected $ENTRYPOINT_JSON"
echo "build-image: $TAG: ENTRYPOINT $got_ep CMD $got_cmd (base $BASE: ENTRYPOINT $base_ep CMD $base_cmd)"
