#!/usr/bin/env bash
# Start/stop a moto_server (fake S3 + DynamoDB) on 127.0.0.1:PORT for the
# terraform s3-backend tests.
#
#   scripts/moto.sh start PORT   # start in the background, wait until it
#                                # answers, create bucket + lock table
#   scripts/moto.sh stop PORT    # SIGTERM (then SIGKILL) it, remove pid file
#   scripts/moto.sh status PORT  # exit 0 if running and answering
#
# Needs scripts/install-test-deps.sh to have run. Files:
#   $TFINIT_TEST_DEPS/run/moto-PORT.pid   pid of moto_server
#   $TFINIT_TEST_DEPS/run/moto-PORT.log   its output
# Environment (optional):
#   TFINIT_TEST_DEPS    deps dir (default <repo>/.test-deps)
#   MOTO_BUCKET         S3 bucket to create   (default: tfstate)
#   MOTO_LOCK_TABLE     DynamoDB table        (default: tflock, hash key LockID (S))
#   MOTO_START_TIMEOUT  seconds to wait for the server (default: 30)
# "start" is idempotent: a server already answering on PORT from an earlier
# "start" is reused (bucket/table creation is idempotent too).
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEPS=${TFINIT_TEST_DEPS:-$REPO_ROOT/.test-deps}
RUN=$DEPS/run
PY=$DEPS/venv/bin/python
MOTO=$DEPS/venv/bin/moto_server
BUCKET=${MOTO_BUCKET:-tfstate}
TABLE=${MOTO_LOCK_TABLE:-tflock}
TIMEOUT=${MOTO_START_TIMEOUT:-30}

usage() { echo "usage: $0 start|stop|status PORT" >&2; exit 2; }
die() { echo "moto.sh: $*" >&2; exit 1; }

[ $# -eq 2 ] || usage
CMD=$1 PORT=$2
case $PORT in ''|*[!0-9]*) usage ;; esac
PIDFILE=$RUN/moto-$PORT.pid
LOG=$RUN/moto-$PORT.log
ENDPOINT=http://127.0.0.1:$PORT

# pid from the pid file, only if that process is alive and is a moto_server
live_pid() {
    [ -f "$PIDFILE" ] || return 1
    local pid
    pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
    case $pid in ''|*[!0-9]*) return 1 ;; esac
    [ -r "/proc/$pid/cmdline" ] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q moto_server || return 1
    echo "$pid"
}

answers() { # one HTTP request to the server, 1 s timeout
    "$PY" - "$ENDPOINT" <<'EOF' >/dev/null 2>&1
import sys, urllib.request, urllib.error
try:
    urllib.request.urlopen(sys.argv[1] + "/moto-api/", timeout=1)
except urllib.error.HTTPError:
    pass  # any HTTP answer means it is up
EOF
}

setup_resources() {
    AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_DEFAULT_REGION=us-east-1 \
    "$PY" - "$ENDPOINT" "$BUCKET" "$TABLE" <<'EOF'
import sys, boto3
ep, bucket, table = sys.argv[1:]
s3 = boto3.client("s3", endpoint_url=ep, region_name="us-east-1")
if bucket not in [b["Name"] for b in s3.list_buckets().get("Buckets", [])]:
    s3.create_bucket(Bucket=bucket)
ddb = boto3.client("dynamodb", endpoint_url=ep, region_name="us-east-1")
if table not in ddb.list_tables()["TableNames"]:
    ddb.create_table(
        TableName=table,
        AttributeDefinitions=[{"AttributeName": "LockID", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "LockID", "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
    )
EOF
}

start() {
    [ -x "$MOTO" ] || die "$MOTO missing: run scripts/install-test-deps.sh"
    mkdir -p "$RUN"
    local pid
    if pid=$(live_pid) && answers; then
        setup_resources || die "creating bucket/table failed"
        echo "moto_server already running on $ENDPOINT (pid $pid, bucket $BUCKET, table $TABLE)"
        return 0
    fi
    if pid=$(live_pid); then # alive but not answering: replace it
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$PIDFILE"
    if answers; then
        die "port $PORT already answers HTTP but is not our moto_server (no live $PIDFILE)"
    fi
    # setsid: own session/process group, so test harness signals do not hit it.
    setsid "$MOTO" -H 127.0.0.1 -p "$PORT" </dev/null >"$LOG" 2>&1 &
    pid=$!
    echo "$pid" >"$PIDFILE"
    local deadline=$((SECONDS + TIMEOUT))
    until answers; do
        if ! kill -0 "$pid" 2>/dev/null; then
            rm -f "$PIDFILE"
            tail -n 20 "$LOG" >&2
            die "moto_server exited early (log: $LOG)"
        fi
        if [ $SECONDS -ge $deadline ]; then
            kill -KILL "$pid" 2>/dev/null || true
            rm -f "$PIDFILE"
            tail -n 20 "$LOG" >&2
            die "moto_server did not answer on $ENDPOINT within ${TIMEOUT}s (log: $LOG)"
        fi
        sleep 0.2
    done
    setup_resources || { stop; die "creating bucket/table failed"; }
    echo "moto_server started on $ENDPOINT (pid $pid, bucket $BUCKET, table $TABLE, log $LOG)"
}

stop() {
    local pid
    if ! pid=$(live_pid); then
        rm -f "$PIDFILE"
        echo "moto_server on port $PORT not running"
        return 0
    fi
    kill -TERM "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + 10))
    while kill -0 "$pid" 2>/dev/null && [ -d "/proc/$pid" ] \
          && ! grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null; do
        if [ $SECONDS -ge $deadline ]; then
            kill -KILL "$pid" 2>/dev/null || true
            break
        fi
        sleep 0.1
    done
    rm -f "$PIDFILE"
    echo "moto_server on port $PORT stopped (pid $pid)"
}

case $CMD in
    start) start ;;
    stop) stop ;;
    status)
        if pid=$(live_pid) && answers; then echo "running (pid $pid) on $ENDPOINT"; else echo "not running"; exit 1; fi ;;
    *) usage ;;
esac
