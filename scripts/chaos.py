#!/usr/bin/env python3
"""Chaos rounds: pods applying a slow configuration get killed at random moments; the next pod
must reconcile. Run through scripts/chaos.sh (it installs the dependencies and builds tfinit).

Each round:
  1. pod A (a PID namespace with its own hostname, the init as PID 1, a controller stand-in that
     reconciles in a loop like provider-terraform) applies round R of the configuration
     (every resource is replaced each round: its `triggers` name the round);
  2. at a random moment pod A gets either SIGTERM with a random grace period (then SIGKILL of
     everything when the grace period ends, as the kubelet does), or SIGKILL (node loss);
  3. pod B (a new hostname, the same workspace path, the same TFINIT_STATE_DIR) starts and
     reconciles round R. The round is checked:
     - reconciled within the bound (TFINIT_OWNER_TTL + one retry + one apply);
     - no lock left in DynamoDB;
     - every resource in the state exists in the "external world" (a marker file per resource
       id, written by a create-time local-exec and removed by a destroy-time one) and vice
       versa: markers without a state entry are orphans, state entries without a marker are lost;
     - the init never crashed (pod B's init exits 0; pod A's init, when SIGTERMed, exits with
       the controller's code before the grace period ends);
     - no zombie left in pod B at the end, no lock-owner record left behind.
The same rounds run with tini as the init (no shim: the controller's SIGKILL reaches terraform).
A stuck lock under tini is counted, then cleared by the harness (as an operator would) so the
rounds stay independent.

Usage: chaos.py --rounds N --init tfinit|tini [--seed S] [--json OUT]
"""

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import boto3

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEPS = os.environ.get("TFINIT_TEST_DEPS", os.path.join(REPO, ".test-deps"))
BIN = os.environ.get("TFINIT_BIN_DIR", os.path.join(REPO, "target", "x86_64-unknown-linux-gnu", "release"))
TFINIT = os.path.join(BIN, "tfinit")
HELPER = os.path.join(BIN, "tfinit-test-helper")
TERRAFORM = os.path.join(DEPS, "bin", "terraform")
PLUGINS = os.path.join(DEPS, "plugins")
TINI = shutil.which("tini") or "/usr/bin/tini"

RESOURCES = 3          # resources replaced per round
SLEEP = 5              # seconds each create takes (after its marker is written)
OWNER_TTL = 3          # seconds
RETRY = 1              # seconds between the controller's reconcile attempts
APPLY_BOUND = 20       # seconds one apply may take (destroy + create of RESOURCES, in parallel)

MAIN_TF = """
terraform {
  backend "s3" {
    bucket                      = "tfstate"
    key                         = "chaos/terraform.tfstate"
    region                      = "us-east-1"
    dynamodb_table              = "tflock"
    access_key                  = "test"
    secret_key                  = "test"
    force_path_style            = true
    skip_credentials_validation = true
    skip_metadata_api_check     = true
    skip_region_validation      = true
  }
}

variable "round" { type = number }
variable "markers" { type = string }
variable "sleep" { type = number }

resource "null_resource" "r" {
  count    = %d
  triggers = { round = var.round, markers = var.markers }
  provisioner "local-exec" {
    command = "touch ${var.markers}/${self.id} && sleep ${var.sleep}"
  }
  provisioner "local-exec" {
    when    = destroy
    command = "rm -f ${self.triggers.markers}/${self.id}"
  }
}
""" % RESOURCES

LOCK_ID = "tfstate/chaos/terraform.tfstate"


def log(*a):
    print("chaos:", *a, flush=True)


class Backend:
    def __init__(self, port):
        self.port = port
        ep = "http://127.0.0.1:%d" % port
        self.ddb = boto3.client("dynamodb", endpoint_url=ep, region_name="us-east-1",
                                aws_access_key_id="test", aws_secret_access_key="test")

    def lock(self):
        item = self.ddb.get_item(TableName="tflock", Key={"LockID": {"S": LOCK_ID}}).get("Item")
        if item and "Info" in item:
            return json.loads(item["Info"]["S"])
        return None

    def clear_lock(self):
        self.ddb.delete_item(TableName="tflock", Key={"LockID": {"S": LOCK_ID}})


def kill_margin_ms(grace):
    """TFINIT_KILL_MARGIN for a grace period of `grace` s: a tenth of it, 1 to 2 s."""
    return int(max(1000, min(2000, grace * 1000 * 0.1)))


def stop_timeout_ms(grace):
    """TFINIT_STOP_TIMEOUT: 40 % of the grace period, at most 10 s, at least 1 s over the margin."""
    return int(max(kill_margin_ms(grace) + 1000, min(10000, grace * 1000 * 0.4)))


class Pod:
    """A PID namespace with its own hostname, the init as PID 1, a reconciling controller."""

    def __init__(self, name, init, work, state_dir, rnd, grace, logdir, forever=False):
        self.name = name
        self.log_path = os.path.join(logdir, "%s.log" % name)
        self.ctl_log = os.path.join(logdir, "%s.controller" % name)
        env = dict(os.environ)
        env.update({
            "CHECKPOINT_DISABLE": "1",
            "TF_IN_AUTOMATION": "1",
            "TF_INPUT": "0",
            "TFINIT_STATE_DIR": state_dir,
            "TFINIT_OWNER_TTL": "%ds" % OWNER_TTL,
            "TFINIT_GRACE_PERIOD": "%ds" % grace,
            # The least budget tfinit takes (src/config.rs): a margin of 1 s, a stop timeout 1 s
            # longer, the grace period over both.
            "TFINIT_STOP_TIMEOUT": "%dms" % stop_timeout_ms(grace),
            "TFINIT_KILL_MARGIN": "%dms" % kill_margin_ms(grace),
            "TFINIT_LOG": "info",
            "TFINIT_RUN_DIR": os.path.join(work, "run-" + name),
            "TF_VAR_round": str(rnd),
            "TF_VAR_markers": os.path.join(work, "markers"),
            "TF_VAR_sleep": str(SLEEP),
        })
        shim = os.path.join(work, "shim")
        if init == "tfinit":
            env["PATH"] = "%s:%s:%s" % (shim, os.path.dirname(TERRAFORM), env.get("PATH", ""))
            init_argv = [TFINIT, "--"]
        else:
            env["PATH"] = "%s:%s" % (os.path.dirname(TERRAFORM), env.get("PATH", ""))
            init_argv = [TINI, "-s", "--"]
        # The controller: reconcile until one apply succeeds (a provider's loop), like
        # provider-terraform on SIGTERM: SIGKILL its terraform, exit.
        apply = ("%s controller --on-term kill --exit-code 0 --log %s -- terraform apply "
                 "-auto-approve -no-color -input=false -lock-timeout=0s" % (HELPER, self.ctl_log))
        if forever:
            # A running controller: it reconciles again and again until it is stopped.
            loop = "while true; do %s && echo reconciled >> %s; sleep %d; done" % (apply, self.ctl_log, RETRY)
        else:
            loop = ("until %s; do sleep %d; done; echo reconciled >> %s; %s orphans 0 --deadline-s 5 >> %s 2>&1"
                    % (apply, RETRY, self.ctl_log, HELPER, self.ctl_log))
        argv = ["unshare", "--pid", "--fork", "--mount-proc", "--uts", "--kill-child", "sh", "-c",
                'hostname "$0" && exec "$@"', name] + init_argv + ["sh", "-c", loop]
        self.out = open(self.log_path, "wb")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, cwd=os.path.join(work, "tf"), env=env,
                                     stdout=self.out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.init_pid = None
        self.pid1()

    def pid1(self):
        """Host pid of the namespace's PID 1 (unshare's child)."""
        if self.init_pid:
            return self.init_pid
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with open("/proc/%d/task/%d/children" % (self.proc.pid, self.proc.pid)) as f:
                    kids = f.read().split()
                if kids:
                    self.init_pid = int(kids[0])
                    return self.init_pid
            except OSError:
                pass
            time.sleep(0.01)
        raise RuntimeError("pod %s: no PID 1 found" % self.name)

    def signal(self, sig):
        try:
            os.kill(self.pid1(), sig)
        except ProcessLookupError:
            pass

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill_all(self):
        # SIGKILL of PID 1 kills every process of the namespace at once: a node loss.
        self.signal(signal.SIGKILL)
        self.proc.wait()
        self.out.close()

    def text(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def controller_text(self):
        try:
            with open(self.ctl_log) as f:
                return f.read()
        except OSError:
            return ""


def state_ids(work):
    out = subprocess.run([TERRAFORM, "show", "-json"], cwd=os.path.join(work, "tf"),
                         capture_output=True, env=dict(os.environ, CHECKPOINT_DISABLE="1"))
    if out.returncode != 0:
        return None
    doc = json.loads(out.stdout or b"{}")
    ids = set()
    for r in (doc.get("values") or {}).get("root_module", {}).get("resources", []):
        ids.add(r["values"]["id"])
    return ids


def marker_ids(work):
    return set(os.listdir(os.path.join(work, "markers")))


def records(state_dir):
    d = os.path.join(state_dir, "records")
    return sorted(f for f in os.listdir(d)) if os.path.isdir(d) else []


def run(args):
    rng = random.Random(args.seed)
    work = tempfile.mkdtemp(prefix="tfinit-chaos-%s-" % args.init)
    logdir = os.path.join(work, "logs")
    state_dir = os.path.join(work, "state")
    for d in ("tf", "markers", "shim", "logs", "state"):
        os.makedirs(os.path.join(work, d))
    os.symlink(TFINIT, os.path.join(work, "shim", "terraform"))
    with open(os.path.join(work, "tf", "main.tf"), "w") as f:
        f.write(MAIN_TF)
    backend = Backend(args.port)
    backend.clear_lock()
    env = dict(os.environ, CHECKPOINT_DISABLE="1")
    subprocess.run([TERRAFORM, "init", "-input=false", "-no-color", "-plugin-dir=" + PLUGINS,
                    "-reconfigure",
                    "-backend-config=endpoint=http://127.0.0.1:%d" % args.port,
                    "-backend-config=dynamodb_endpoint=http://127.0.0.1:%d" % args.port],
                   cwd=os.path.join(work, "tf"), env=env, check=True, capture_output=True)
    # A clean slate in the backend: destroy whatever an earlier run left.
    subprocess.run([TERRAFORM, "destroy", "-auto-approve", "-input=false", "-no-color",
                    "-var", "round=0", "-var", "markers=" + os.path.join(work, "markers"),
                    "-var", "sleep=0"], cwd=os.path.join(work, "tf"), env=env, capture_output=True)

    totals = {"rounds": 0, "sigterm_long": 0, "sigterm_short": 0, "sigkill": 0,
              "reconciled_in_bound": 0, "stuck_locks": 0, "orphans": 0, "orphans_flagged": 0,
              "lost": 0, "init_crashes": 0, "zombies": 0, "records_left": 0,
              "applies_lost_to_shutdown": 0}
    bound = OWNER_TTL + RETRY + APPLY_BOUND
    pod_no = 0
    for rnd in range(1, args.rounds + 1):
        pod_no += 1
        kind = rng.choice(["sigterm_long", "sigterm_short", "sigkill"])
        grace = rng.choice([25, 30]) if kind == "sigterm_long" else rng.choice([4, 5, 6, 7])
        a = Pod("pod-%d" % pod_no, args.init, work, state_dir, rnd, grace, logdir, forever=True)
        # A random moment in the apply: after the destroys and while creates run.
        deadline = time.monotonic() + 60
        while "Creating..." not in a.text() and "Destroying..." not in a.text():
            if time.monotonic() > deadline or a.proc.poll() is not None:
                break
            time.sleep(0.05)
        time.sleep(rng.uniform(0.1, SLEEP - 0.3))  # while the creates run
        totals[kind] += 1
        crashed = False
        if kind == "sigkill":
            a.kill_all()
        else:
            a.signal(signal.SIGTERM)
            rc = a.wait(grace)
            if rc is None:
                # The kubelet's SIGKILL at the end of the grace period.
                a.kill_all()
                if args.init == "tfinit":
                    crashed = True  # tfinit must have exited before the deadline
            else:
                a.out.close()
                # The controller died of the forwarded SIGTERM: tfinit relays 128+15.
                if args.init == "tfinit" and (rc != 143 or "tfinit exiting exit_code=143" not in a.text()):
                    crashed = True
        if crashed:
            totals["init_crashes"] += 1
            log("round %d: pod A's init did not exit cleanly before the grace period" % rnd)

        pod_no += 1
        b = Pod("pod-%d" % pod_no, args.init, work, state_dir, rnd, 30, logdir)
        rc = b.wait(bound + 5)
        elapsed = time.monotonic() - b.started
        reconciled = rc is not None and "reconciled" in b.controller_text()
        if rc is None:
            b.kill_all()
        else:
            b.out.close()
        if reconciled and elapsed <= bound:
            totals["reconciled_in_bound"] += 1
        if args.init == "tfinit" and rc is not None and (rc != 0 or "tfinit exiting exit_code=0" not in b.text()):
            totals["init_crashes"] += 1
            log("round %d: pod B's init exited %s" % (rnd, rc))
        lock = backend.lock()
        if lock is not None:
            totals["stuck_locks"] += 1
            log("round %d: lock left by %s" % (rnd, lock.get("Who")))
            backend.clear_lock()  # the operator clears it so later rounds stay independent
        ids = state_ids(work) or set()
        marks = marker_ids(work)
        orphans = marks - ids
        lost = ids - marks
        # tfinit names orphan candidates by address (it cannot know the ids): count the distinct
        # addresses its recovery warning listed, at most one per orphan.
        named = set(re.findall(r'null_resource\.r\[\d+\]', " ".join(
            l for l in (a.text() + b.text()).splitlines() if "orphan_candidates" in l)))
        flagged = min(len(orphans), len(named))
        totals["orphans"] += len(orphans)
        totals["orphans_flagged"] += flagged
        totals["lost"] += len(lost)
        if "zombies=0" not in b.controller_text() and reconciled:
            totals["zombies"] += 1
        left = records(state_dir)
        if args.init == "tfinit" and left:
            totals["records_left"] += len(left)
            log("round %d: records left: %s" % (rnd, left))
        if not reconciled:
            totals["applies_lost_to_shutdown"] += 1
        totals["rounds"] += 1
        log("round %d %s grace=%ss: reconciled=%s in %.1fs, lock_left=%s, orphans=%d (flagged %d), lost=%d"
            % (rnd, kind, grace if kind != "sigkill" else "-", reconciled, elapsed, lock is not None,
               len(orphans), flagged, len(lost)))
        # Orphans are real leftovers in the outside world: clean them up so rounds stay independent.
        for o in orphans:
            os.remove(os.path.join(work, "markers", o))
    totals["init"] = args.init
    totals["work"] = work
    print(json.dumps(totals, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(totals, f, indent=2)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return totals


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--init", choices=["tfinit", "tini"], default="tfinit")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--json")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--check", action="store_true", help="exit 1 unless every round is clean (tfinit)")
    args = p.parse_args()
    t = run(args)
    if args.check:
        bad = (t["rounds"] - t["reconciled_in_bound"]) + t["stuck_locks"] + t["lost"] + \
            t["init_crashes"] + t["zombies"] + t["records_left"]
        if bad:
            log("FAILED: %s" % json.dumps(t))
            sys.exit(1)
        log("%d passed, 0 failed" % t["rounds"])


if __name__ == "__main__":
    main()
