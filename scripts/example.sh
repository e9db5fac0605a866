#!/usr/bin/env bash
# Builds tfinit and runs it on an example: a controller stand-in (like provider-terraform: it runs
# `terraform apply` from PATH and SIGKILLs it when it gets SIGTERM) applies a slow configuration
# under tfinit as PID 1; the "pod" is then told to stop mid-apply. Without tfinit, terraform would
# die with the controller; with it, the apply completes inside the grace period and the state holds
# every resource.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

echo "== building tfinit (release, static)"
cargo build --release --quiet
bin=$repo/target/x86_64-unknown-linux-gnu/release
file -L "$bin/tfinit" | sed 's/^/   /'

echo "== installing terraform 1.0.3 and the null provider (PyPI) into .test-deps/"
scripts/install-test-deps.sh >/dev/null
deps=${TFINIT_TEST_DEPS:-$repo/.test-deps}

work=$(mktemp -d /tmp/tfinit-example.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/shim" "$work/tf" "$work/state"
ln -s "$bin/tfinit" "$work/shim/terraform"          # the shim: first `terraform` on PATH
cat >"$work/tf/main.tf" <<'TF'
resource "null_resource" "slow" {
  count = 3
  provisioner "local-exec" { command = "sleep 4" }
}
TF
(cd "$work/tf" && "$deps/bin/terraform" init -no-color -input=false -plugin-dir="$deps/plugins" >/dev/null)

export PATH="$work/shim:$deps/bin:$PATH" TFINIT_STATE_DIR="$work/state" TFINIT_GRACE_PERIOD=30s
run_init() {
    if [ "$(id -u)" -eq 0 ]; then
        # A real PID namespace: tfinit is PID 1, as in a container.
        unshare --pid --fork --mount-proc "$bin/tfinit" -- "$@"
    else
        # Not root: tfinit runs as a child subreaper instead.
        "$bin/tfinit" -- "$@"
    fi
}

echo "== starting the controller under tfinit: terraform apply (3 resources, ~12 s)"
cd "$work/tf"
run_init "$bin/tfinit-test-helper" controller --on-term kill --exit-code 0 --log "$work/controller.log" \
    -- terraform apply -auto-approve -no-color -input=false 2>"$work/init.log" &
init_pid=$!
for _ in $(seq 1 300); do grep -q "terraform started" "$work/init.log" 2>/dev/null && break; sleep 0.1; done
sleep 3   # let the apply get going (terraform's output is the controller's, on our stdout)
echo "== the pod is told to stop (SIGTERM to tfinit, PID 1) mid-apply"
pkill -TERM -f "^$bin/tfinit --" || { echo "tfinit is not running" >&2; exit 1; }
start=$(date +%s)
wait "$init_pid" || true
echo "   init exited after $(( $(date +%s) - start ))s (grace period 30s)"
echo "== what tfinit logged:"
grep -E "stop signal|shutdown|terraform started|terraform exited|tfinit exiting" "$work/init.log" | sed 's/^/   /'
echo "== the controller SIGKILLed its terraform (the shim) as provider-terraform does:"
sed 's/^/   /' "$work/controller.log"
echo "== resources in the state:"
"$deps/bin/terraform" state list | sed 's/^/   /'
n=$("$deps/bin/terraform" state list | wc -l)
if [ "$n" -eq 3 ]; then
    echo "OK: the apply completed inside the grace period: 3 of 3 resources are in the state, no lock left."
else
    echo "UNEXPECTED: $n of 3 resources in the state" >&2
    exit 1
fi
