#!/usr/bin/env bash
# Records what `terraform force-unlock -force <id that cannot match>` (tfinit's read-only lock
# probe) prints with the s3 backend on moto, for one terraform binary: the lock held (an apply
# SIGKILLed mid-creation), free, unreadable (the lock table's endpoint on a closed port, then
# moto stopped), the directory not initialised, no lock configured, and the real unlock; with a
# DynamoDB lock table, and for terraform 1.10+ also with the S3-native lock object
# (`use_lockfile`) and with both. Byte-exact triples
# NAME.stdout, NAME.stderr, NAME.exit go to OUTDIR (tests/fixtures/terraform/lock-<version>/);
# docs/notes/terraform-facts.md (section 12) says what they mean.
#
#   scripts/record-lock-probes.sh TERRAFORM OUTDIR [PORT]
#
# Needs scripts/install-test-deps.sh (moto, the null provider); starts moto on PORT (default
# 45321) with scripts/moto.sh and stops it before the last probes. Takes about a minute. Hostname and user
# show in the recorded Who (`root@vm` in the committed fixtures).
set -euo pipefail

[ $# -ge 2 ] || { echo "usage: $0 TERRAFORM OUTDIR [PORT]" >&2; exit 2; }
TF=$(command -v "$1") || { echo "record-lock-probes.sh: no terraform at $1" >&2; exit 1; }
OUT=$2
PORT=${3:-45321}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEPS=${TFINIT_TEST_DEPS:-$REPO/.test-deps}
export TFINIT_TEST_DEPS=$DEPS CHECKPOINT_DISABLE=1 TF_CLI_CONFIG_FILE=/dev/null
unset TF_CLI_ARGS TF_WORKSPACE TF_DATA_DIR TF_LOG
ZERO=00000000-0000-0000-0000-000000000000
ENDPOINT=http://127.0.0.1:$PORT

mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/record-lock-probes.XXXXXX)
"$REPO/scripts/moto.sh" start "$PORT" >/dev/null
trap '"$REPO/scripts/moto.sh" stop "$PORT" >/dev/null; rm -rf "$WORK"' EXIT

version=$("$TF" version -json 2>/dev/null | sed -n 's/.*"terraform_version": *"\([^"]*\)".*/\1/p')
[ -n "$version" ] || version=$("$TF" version | sed -n '1s/^Terraform v//p')
modern=0
case $version in 0.*|1.[0-9].*) ;; *) modern=1 ;; esac
echo "terraform $version at $TF -> $OUT"

# The backend settings that differ by version: endpoints and path style (1.6+ renamed them).
backend_args() { # MODE (dynamodb|lockfile|both|none) ENDPOINT KEY [DYNAMODB_ENDPOINT]
    local mode=$1 ep=$2 key=$3 ddb=${4:-$2}
    echo "-backend-config=key=$key"
    if [ $modern = 1 ]; then
        echo "-backend-config=endpoints={s3=\"$ep\",dynamodb=\"$ddb\"}"
        echo "-backend-config=use_path_style=true"
        echo "-backend-config=skip_requesting_account_id=true"
    else
        echo "-backend-config=endpoint=$ep"
        echo "-backend-config=dynamodb_endpoint=$ddb"
        echo "-backend-config=force_path_style=true"
    fi
    case $mode in
        dynamodb) echo "-backend-config=dynamodb_table=tflock" ;;
        lockfile) echo "-backend-config=use_lockfile=true" ;;
        both) echo "-backend-config=dynamodb_table=tflock"; echo "-backend-config=use_lockfile=true" ;;
    esac
}

# A working directory for MODE on ENDPOINT, initialised (unless noinit; DYNAMODB_ENDPOINT: the
# lock table's endpoint when it is another).
workdir() { # NAME MODE ENDPOINT [noinit|init] [DYNAMODB_ENDPOINT]
    local d=$WORK/$1
    mkdir -p "$d"
    cat >"$d/main.tf" <<'EOF'
terraform {
  backend "s3" {
    bucket                      = "tfstate"
    region                      = "us-east-1"
    access_key                  = "test"
    secret_key                  = "test"
    skip_credentials_validation = true
    skip_metadata_api_check     = true
    skip_region_validation      = true
  }
}
variable "sleep" {
  type    = number
  default = 30
}
resource "null_resource" "a" {
  provisioner "local-exec" {
    command = "sleep ${var.sleep}"
  }
}
resource "null_resource" "b" {}
EOF
    if [ "${4:-}" != noinit ]; then
        mapfile -t args < <(backend_args "$2" "$3" "$1/terraform.tfstate" "${5:-$3}")
        (cd "$d" && "$TF" init -input=false -no-color -plugin-dir="$DEPS/plugins" "${args[@]}" >init.out 2>&1) ||
            { cat "$d/init.out" >&2; exit 1; }
    fi
    echo "$d"
}

# Runs terraform ARGS in DIR and records NAME.{stdout,stderr,exit}.
record() { # NAME DIR ARGS...
    local name=$1 dir=$2
    shift 2
    local rc=0
    (cd "$dir" && "$TF" "$@" >"$OUT/$name.stdout" 2>"$OUT/$name.stderr") || rc=$?
    echo "$rc" >"$OUT/$name.exit"
    printf '  %-34s rc %s  %s\n' "$name" "$rc" "$(head -c 160 "$OUT/$name.stderr" | tr '\n' ' ')"
}

# Leaves DIR's lock stuck: an apply SIGKILLed (its whole process group) mid-creation.
stick() { # DIR
    local dir=$1 pid
    (cd "$dir" && exec setsid "$TF" apply -auto-approve -input=false -no-color >apply.out 2>&1) &
    pid=$!
    for _ in $(seq 1 300); do grep -q 'Creating\.\.\.' "$dir/apply.out" 2>/dev/null && break; sleep 0.1; done
    grep -q 'Creating\.\.\.' "$dir/apply.out" || { cat "$dir/apply.out" >&2; exit 1; }
    kill -KILL -- "-$pid"
    wait "$pid" || true
}

# The lock ID a probe printed in NAME.stderr.
held_id() { sed -n 's/^ *ID: *\([^ ]*\).*/\1/p' "$OUT/$1.stderr" | head -1; }

s3() { # METHOD PATH [BODY_FILE]: one S3 request to moto (path style, a fake SigV4 header so
    # moto routes it); prints the HTTP status
    curl -s -o "${3:-/dev/null}" -w '%{http_code}' -X "$1" "$ENDPOINT$2" \
        -H 'Authorization: AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=0'
}
ddb() { # OP JSON: one DynamoDB request to moto
    curl -s -X POST "$ENDPOINT/" -H "X-Amz-Target: DynamoDB_20120810.$1" \
        -H 'Content-Type: application/x-amz-json-1.0' \
        -H 'Authorization: AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/dynamodb/aws4_request, SignedHeaders=host, Signature=0' \
        -d "$2"
}

probe=(force-unlock -force "$ZERO")

echo "DynamoDB lock table"
d=$(workdir ddb dynamodb "$ENDPOINT")
record probe-free "$d" force-unlock -no-color -force "$ZERO"
record probe-free-color "$d" "${probe[@]}"
stick "$d"
record probe-held "$d" force-unlock -no-color -force "$ZERO"
record probe-held-color "$d" "${probe[@]}"
ddb Scan '{"TableName":"tflock"}' >"$OUT/dynamodb-lock-items.json"
record unlock-real "$d" force-unlock -no-color -force "$(held_id probe-held)"
record probe-free-after-unlock "$d" force-unlock -no-color -force "$ZERO"
# S3 answers, the lock table's endpoint does not (a port nothing listens on).
t=$(workdir table-down dynamodb "$ENDPOINT" init http://127.0.0.1:1)
record probe-table-down "$t" force-unlock -no-color -force "$ZERO"
# No lock at all (no table, no lock object): nothing can be held.
u=$(workdir unlocked none "$ENDPOINT")
record probe-no-locking "$u" force-unlock -no-color -force "$ZERO"
n=$(workdir never dynamodb "$ENDPOINT" noinit)
record probe-not-initialized "$n" force-unlock -no-color -force "$ZERO"

if [ $modern = 1 ]; then
    echo "S3-native lock object (use_lockfile)"
    d=$(workdir file lockfile "$ENDPOINT")
    record lockfile-probe-free "$d" force-unlock -no-color -force "$ZERO"
    stick "$d"
    echo "  lock object: HTTP $(s3 HEAD /tfstate/file/terraform.tfstate.tflock)"
    s3 GET /tfstate/file/terraform.tfstate.tflock "$OUT/lockfile-object.json" >/dev/null
    record lockfile-probe-held "$d" force-unlock -no-color -force "$ZERO"
    record lockfile-probe-held-color "$d" "${probe[@]}"
    record lockfile-unlock-real "$d" force-unlock -no-color -force "$(held_id lockfile-probe-held)"
    record lockfile-probe-free-after-unlock "$d" force-unlock -no-color -force "$ZERO"

    echo "Both (use_lockfile and a DynamoDB lock table)"
    d=$(workdir both both "$ENDPOINT")
    record both-probe-free "$d" force-unlock -no-color -force "$ZERO"
    stick "$d"
    record both-probe-held "$d" force-unlock -no-color -force "$ZERO"
    id=$(held_id both-probe-held)
    # One of the two gone by hand: each half of the double lock read on its own.
    ddb GetItem '{"TableName":"tflock","Key":{"LockID":{"S":"tfstate/both/terraform.tfstate"}}}' >"$WORK/item.json"
    ddb DeleteItem '{"TableName":"tflock","Key":{"LockID":{"S":"tfstate/both/terraform.tfstate"}}}' >/dev/null
    record both-probe-file-held-table-free "$d" force-unlock -no-color -force "$ZERO"
    item=$(jq -c '.Item' "$WORK/item.json")
    ddb PutItem "{\"TableName\":\"tflock\",\"Item\":$item}" >/dev/null
    echo "  lock object deleted: HTTP $(s3 DELETE /tfstate/both/terraform.tfstate.tflock)"
    record both-probe-table-held-file-free "$d" force-unlock -no-color -force "$ZERO"
    record both-unlock-real-table-only "$d" force-unlock -no-color -force "$id"
    record both-probe-free-after-unlock "$d" force-unlock -no-color -force "$ZERO"
fi
# Unreadable: the same working directories once the endpoint stops answering.
"$REPO/scripts/moto.sh" stop "$PORT" >/dev/null
echo "Endpoint down (moto stopped)"
start=$(date +%s%N)
record probe-endpoint-down "$WORK/ddb" force-unlock -no-color -force "$ZERO"
echo "  (took $(( ($(date +%s%N) - start) / 1000000 )) ms)"
if [ $modern = 1 ]; then
    record lockfile-probe-endpoint-down "$WORK/file" force-unlock -no-color -force "$ZERO"
    record both-probe-endpoint-down "$WORK/both" force-unlock -no-color -force "$ZERO"
fi
echo "done: $OUT"
