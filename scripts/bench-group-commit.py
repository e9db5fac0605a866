#!/usr/bin/env python3
"""The measuring side of scripts/bench-group-commit.sh (read that script's header first).

    bench-group-commit.py run --tfinit BIN --store file|kube --delay-ms N --rounds N --out FILE
    bench-group-commit.py report --out DIR LABEL...   (the Markdown table of DIR's results)

`run` starts tfinit as PID 1 of a PID namespace (unshare; scripts/bench-storage.py's `Pod`, its
controller and stand-in terraform) with an empty store, waits for "lock-owner records enabled",
then measures how long a state-locking run waits for its lock-owner record:
  - the store: `file`, TFINIT_STATE_DIR on delayfs (tests/support/delayfs.py) sleeping N ms before
    every create, rename, unlink, fsync and mkdir; or `kube`, TFINIT_STORE=kubernetes against the
    stand-in API server (tests/fixtures/kube/apiserver.py over TLS, a CA made here with openssl)
    answering every Lease request N ms late (its "slow" fault), TFINIT_STATE_DIR on a tmpfs (the
    incarnation's lock file only);
  - base: `terraform version` (takes no lock) through the shim, spawn to the stand-in's start,
    median of 5;
  - alone: one `terraform apply` at a time, ROUNDS times: its spawn to the stand-in's start minus
    base is its wait (one batch: the record's write);
  - together: 16 `terraform apply` in 16 directories spawned at once (a barrier), ROUNDS times:
    each run's wait the same way. Each round waits for every run to end and their records to go.
The stand-in terraform prints four `Creating...` lines over 0.4 s, so no run's end (a removal)
comes before the 16 creates are asked for. The init's own heartbeat (every TTL/3, TTL 30 s) goes
on meanwhile: a round that meets it waits one more write.
"""

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location(
    "bench_storage", os.path.join(REPO, "scripts", "bench-storage.py"))
bs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bs)

RUNS = 16
NS = "bench"
APISERVER = os.path.join(REPO, "tests", "fixtures", "kube", "apiserver.py")


def openssl(*args):
    subprocess.run(["openssl"] + list(args), check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=60)


class Api:
    """The stand-in API server over TLS, a service-account directory for it, its slow fault."""

    def __init__(self, work, delay_ms):
        d = os.path.join(work, "pki")
        os.makedirs(d)
        p = lambda n: os.path.join(d, n)
        curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
        openssl("req", "-x509", *curve, "-nodes", "-keyout", p("ca.key"), "-out", p("ca.crt"),
                "-days", "2", "-subj", "/CN=tfinit-bench-ca",
                "-addext", "basicConstraints=critical,CA:TRUE",
                "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        openssl("req", "-new", *curve, "-nodes", "-keyout", p("server.key"), "-out",
                p("server.csr"), "-subj", "/CN=kube-apiserver")
        with open(p("server.ext"), "w") as f:
            f.write("subjectAltName=IP:127.0.0.1\nbasicConstraints=critical,CA:FALSE\n"
                    "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n")
        openssl("x509", "-req", "-days", "2", "-set_serial", "2", "-in", p("server.csr"),
                "-CA", p("ca.crt"), "-CAkey", p("ca.key"), "-extfile", p("server.ext"),
                "-out", p("server.crt"))
        self.sa = os.path.join(work, "serviceaccount")
        os.makedirs(self.sa)
        with open(os.path.join(self.sa, "token"), "w") as f:
            f.write("bench-token\n")
        with open(os.path.join(self.sa, "namespace"), "w") as f:
            f.write(NS)
        with open(p("ca.crt")) as src, open(os.path.join(self.sa, "ca.crt"), "w") as dst:
            dst.write(src.read())
        port_file = os.path.join(work, "api.port")
        admin_file = os.path.join(work, "api.admin-port")
        python = os.path.join(os.environ.get("TFINIT_TEST_DEPS", os.path.join(REPO, ".test-deps")),
                              "bin", "python")
        self.proc = subprocess.Popen(
            [python, APISERVER, port_file, NS, "--tls", p("server.crt"), p("server.key"),
             "--token-file", os.path.join(self.sa, "token"), "--admin-port-file", admin_file],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(work, "apiserver.log"), "w"))
        deadline = time.time() + 20
        while not (os.path.exists(port_file) and os.path.exists(admin_file)):
            if time.time() > deadline or self.proc.poll() is not None:
                raise SystemExit("bench-group-commit: the stand-in API did not start; see "
                                 + os.path.join(work, "apiserver.log"))
            time.sleep(0.02)
        time.sleep(0.1)
        self.port = int(open(port_file).read().strip())
        self.admin = int(open(admin_file).read().strip())
        self.delay_ms = delay_ms

    def slow_down(self):
        import http.client
        slow = {"%s leases" % v: {"ms": self.delay_ms}
                for v in ("get", "list", "create", "update", "delete", "patch")}
        c = http.client.HTTPConnection("127.0.0.1", self.admin, timeout=10)
        c.request("PUT", "/_admin/faults", json.dumps({"slow": slow}),
                  {"Content-Type": "application/json"})
        if c.getresponse().status != 200:
            raise SystemExit("bench-group-commit: the stand-in refused the slow fault")

    def env(self):
        return {"TFINIT_STORE": "kubernetes", "KUBERNETES_SERVICE_HOST": "127.0.0.1",
                "KUBERNETES_SERVICE_PORT": str(self.port), "TFINIT_SERVICE_ACCOUNT_DIR": self.sa}

    def close(self):
        self.proc.kill()
        self.proc.wait()


class KubePod(bs.Pod):
    """bench-storage's Pod with the API's settings in its environment."""

    def __init__(self, work, tfinit, state, backing, extra):
        self._extra = extra
        super().__init__(work, tfinit, state, backing)

    def __setattr__(self, k, v):
        if k == "env" and isinstance(v, dict) and getattr(self, "_extra", None):
            v = dict(v, **self._extra)
        object.__setattr__(self, k, v)


def wait_for_start(pod, tag, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = bs.starts(pod.starts).get(tag)
        if got:
            return got[0][0]
        time.sleep(0.005)
    raise SystemExit("bench-group-commit: run %s never started terraform; see %s" % (tag, pod.log))


def record_count(backing):
    """Records on the file volume (their incarnation's file, or files of one record)."""
    d = os.path.join(backing, "records")
    n = 0
    for name in os.listdir(d) if os.path.isdir(d) else []:
        if name.startswith(".") or not name.endswith(".json"):
            continue
        try:
            v = json.load(open(os.path.join(d, name)))
        except (OSError, ValueError):
            continue
        n += len(v["records"]) if isinstance(v.get("records"), list) else 1
    return n


def run(a):
    work = tempfile.mkdtemp(prefix="tfinit-bench-gc.")
    api = None
    vol = bs.Volume(work, "fuse" if a.store == "file" else "tmpfs", a.delay_ms)
    pod = None
    try:
        os.makedirs(os.path.join(vol.backing, "records"), exist_ok=True)
        os.makedirs(os.path.join(vol.backing, "owners"), exist_ok=True)
        extra = {}
        if a.store == "kube":
            api = Api(work, a.delay_ms)
            api.slow_down()
            extra.update(api.env())
        vol.slow_down()
        pod = KubePod(work, os.path.realpath(a.tfinit), vol.mount, vol.backing, extra)
        if not pod.wait_log("lock-owner records enabled", 300):
            raise SystemExit("bench-group-commit: records never enabled; see " + pod.log)

        base = []
        vdir = os.path.join(work, "ws", "version")
        os.makedirs(vdir)
        for k in range(5):
            tag = "v-%d" % k
            t = time.time_ns()
            pod.shim(vdir, ["version"], tag).wait()
            base.append((wait_for_start(pod, tag) - t) / 1e6)
        base_ms = statistics.median(base)

        def settle():
            # Every record of the round removed (on the file volume; the API's: a second).
            deadline = time.time() + 60
            while a.store == "file" and record_count(vol.backing) and time.time() < deadline:
                time.sleep(0.02)
            time.sleep(0.3 if a.store == "file" else 1.0)

        alone = []
        adir = os.path.join(work, "ws", "alone")
        os.makedirs(adir)
        for k in range(a.rounds):
            tag = "a-%d" % k
            t = time.time_ns()
            p = pod.shim(adir, ["apply", "-auto-approve"], tag)
            alone.append((wait_for_start(pod, tag) - t) / 1e6 - base_ms)
            p.wait(timeout=120)
            settle()

        together = []
        dirs = []
        for i in range(RUNS):
            d = os.path.join(work, "ws", "w%02d" % i)
            os.makedirs(d)
            dirs.append(d)
        for k in range(a.rounds):
            barrier = threading.Barrier(RUNS)
            spawned = {}
            procs = {}

            def one(i):
                tag = "t%d-%02d" % (k, i)
                barrier.wait()
                spawned[tag] = time.time_ns()
                procs[tag] = pod.shim(dirs[i], ["apply", "-auto-approve"], tag)

            threads = [threading.Thread(target=one, args=(i,)) for i in range(RUNS)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            waits = [(wait_for_start(pod, tag) - spawned[tag]) / 1e6 - base_ms
                     for tag in sorted(spawned)]
            for p in procs.values():
                p.wait(timeout=120)
            together.append(waits)
            settle()
        result = {"store": a.store, "delay_ms": a.delay_ms, "rounds": a.rounds,
                  "base_ms": base_ms, "alone": alone, "together": together}
    finally:
        if pod:
            pod.close()
        if api:
            api.close()
        vol.close()
        subprocess.run(["rm", "-rf", work])
    with open(a.out, "w") as f:
        json.dump(result, f)


def report(out, labels):
    f = lambda v: "%.0f" % v
    print("| binary | store | per operation | alone, median | 16 together: median / max per round, median of rounds | worst round's max | worst / alone |")
    print("|---|---|---|---|---|---|---|")
    for label in labels:
        try:
            r = json.load(open(os.path.join(out, label + ".json")))
        except OSError:
            continue
        binary, _, _ = label.partition(".")
        alone = statistics.median(r["alone"])
        medians = [statistics.median(w) for w in r["together"]]
        maxes = [max(w) for w in r["together"]]
        worst = max(maxes)
        per = "%d ms per %s" % (r["delay_ms"], "file operation" if r["store"] == "file"
                                else "request")
        print("| %s | %s | %s | %s | %s / %s | %s | %.1f |" % (
            binary, r["store"], per, f(alone), f(statistics.median(medians)),
            f(statistics.median(maxes)), f(worst), worst / alone if alone > 0 else 0.0))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--tfinit", required=True)
    r.add_argument("--store", choices=["file", "kube"], required=True)
    r.add_argument("--delay-ms", type=int, required=True)
    r.add_argument("--rounds", type=int, default=5)
    r.add_argument("--out", required=True)
    p = sub.add_parser("report")
    p.add_argument("--out", required=True)
    p.add_argument("labels", nargs="+")
    a = ap.parse_args()
    if a.cmd == "run":
        run(a)
    else:
        report(a.out, a.labels)


if __name__ == "__main__":
    main()
