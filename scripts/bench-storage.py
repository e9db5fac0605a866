#!/usr/bin/env python3
"""The measuring side of scripts/bench-storage.sh (read that script's header first).

    bench-storage.py config --tfinit BIN --kind tmpfs|fuse --delay-ms N --trials N --out FILE
    bench-storage.py true --tfinit BIN --trials N --out FILE
    bench-storage.py report --out DIR VOLUME...   (the Markdown table of DIR's results)
    bench-storage.py controller FIFO          (run by tfinit as its controller)

`config` measures one state volume: tfinit runs as PID 1 of a PID namespace (unshare) with this
file's `controller` mode as its controller, TFINIT_STATE_DIR on a fresh tmpfs or on delayfs
(tests/support/delayfs.py) with N ms per create/rename/unlink/fsync/mkdir. The volume holds 1,000
records of 100 other owners (other working directories) whose heartbeats a thread here keeps
fresh. 16 workers run `terraform apply` through the shim in a loop in their own directories; the
stand-in terraform (sh) notes when it started and whether its record was on disk, then prints
four `Creating...` lines over 0.4 s. Meanwhile:
  - forwarding: SIGUSR1 to the init -> the controller has it (CLOCK_MONOTONIC on both sides,
    reported through a FIFO), TRIALS times, 25-35 ms apart;
  - status: `tfinit status` spawn to exit, 20 times (fewer for fewer trials);
  - start: `terraform version` (no lock) through the shim, spawn to the stand-in's start, 10 times
    (fewer for fewer trials);
    a locking run's extra start time is its own spawn-to-start minus that median;
  - at the end, one long run in flight and SIGTERM to the init (grace 6 s, stop timeout 3 s):
    how late terraform gets its graceful SIGTERM against signal + 3 s.
`true` times `unshare --pid --fork INIT -- /bin/true` for tfinit (state dir on tmpfs, and on
delayfs at 5 ms) and tini, TRIALS times each, interleaved.
`config` and `true` print nothing and write one JSON object to --out.
"""

import argparse
import json
import os
import random
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DELAYFS = os.path.join(REPO, "tests", "support", "delayfs.py")
WORKERS = 16
OTHER_OWNERS = 100
RECORDS_PER_OWNER = 10
GRACE, STOP, MARGIN = 6.0, 3.0, 1.0
# When the other owners' incarnations started: a minute before this bench.
OTHERS_STARTED_MS = int(time.time() * 1000) - 60000
SLOW_OPS = ["create", "rename", "unlink", "fsync", "fsyncdir", "mkdir"]

FAKE = r"""#!/bin/sh
t=$(date +%s%N)
if grep -qsE "\"workdir\": ?\"$PWD\"" "$BENCH_BACKING"/records/bench.*.json; then r=1; else r=0; fi
echo "$BENCH_TAG $t $r" >> "$BENCH_OUT"
[ "$1" = version ] && exit 0
if [ -n "$BENCH_TERM" ]; then
    trap 'date +%s%N > "$BENCH_TERM"; exit 1' TERM
    sleep 60 & wait
    exit 0
fi
for i in 1 2 3 4; do echo "null_resource.r$i: Creating..."; sleep 0.1; done
"""


def parse_ts(s):
    """tracing's `2026-11-22T00:10:00.552425Z` as Unix seconds."""
    import datetime
    day, frac = s.rstrip("Z").split(".") if "." in s else (s.rstrip("Z"), "0")
    t = datetime.datetime.strptime(day, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.timezone.utc)
    return t.timestamp() + float("0." + frac)


def pct(values, p):
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p / 100.0 * (len(v) - 1))))]


def controller(fifo):
    """Blocks SIGUSR1 and SIGTERM and reports each arrival's CLOCK_MONOTONIC ns to FIFO."""
    sigs = {signal.SIGUSR1, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    fd = os.open(fifo, os.O_WRONLY)
    while True:
        info = signal.sigwaitinfo(sigs)
        t = time.monotonic_ns()
        os.write(fd, b"%d %d\n" % (info.si_signo, t))
        if info.si_signo == signal.SIGTERM:
            return 0


class Volume:
    """The state directory: a tmpfs, or delayfs over a backing directory."""

    def __init__(self, work, kind, delay_ms):
        self.kind = kind
        self.daemon = None
        self.mount = os.path.join(work, "state")
        os.makedirs(self.mount)
        if kind == "tmpfs":
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", self.mount],
                           check=True)
            self.backing = self.mount
            return
        self.backing = os.path.join(work, "backing")
        os.makedirs(self.backing)
        self.control = os.path.join(work, "control.json")
        self.set_delay(0)
        python = os.path.join(os.environ.get("TFINIT_TEST_DEPS", os.path.join(REPO, ".test-deps")),
                              "bin", "python")
        self.daemon = subprocess.Popen([python, DELAYFS, self.backing, self.mount, self.control],
                                       stdout=subprocess.DEVNULL,
                                       stderr=open(os.path.join(work, "delayfs.log"), "w"))
        deadline = time.time() + 20
        while not os.path.exists(self.control + ".ready"):
            if time.time() > deadline or self.daemon.poll() is not None:
                raise SystemExit("bench-storage: delayfs did not mount; see %s/delayfs.log" % work)
            time.sleep(0.01)
        self.delay_ms = delay_ms

    def set_delay(self, ms):
        with open(self.control + ".tmp", "w") as f:
            json.dump({"delay_ms": ms, "delay_ops": SLOW_OPS}, f)
        os.rename(self.control + ".tmp", self.control)

    def slow_down(self):
        if self.kind == "fuse":
            self.set_delay(self.delay_ms)

    def close(self):
        if self.daemon:
            self.daemon.kill()
            self.daemon.wait()
        subprocess.run(["umount", "-l", self.mount], stderr=subprocess.DEVNULL)


def owner(name, started_ms):
    return {"name": name, "boot_id": "bench-boot", "started_ms": started_ms, "pid": 1}


def seed(backing, work):
    """1,000 records of 100 other owners in other working directories, and their heartbeats."""
    os.makedirs(os.path.join(backing, "records"), exist_ok=True)
    os.makedirs(os.path.join(backing, "owners"), exist_ok=True)
    now = OTHERS_STARTED_MS + 60000
    for o in range(OTHER_OWNERS):
        name = "other-%03d" % o
        for r in range(RECORDS_PER_OWNER):
            rec = {"v": 1, "owner": owner(name, OTHERS_STARTED_MS), "who": "@" + name,
                   "run_id": "r%d" % r, "cwd": "/elsewhere/%s/%d" % (name, r),
                   "workdir": "/elsewhere/%s/%d" % (name, r), "workspace": "default",
                   "subcommand": "apply", "argv": ["apply"], "started_ms": now - 50000,
                   "in_progress": [], "updated_ms": now - 50000}
            path = os.path.join(backing, "records", "%s.bench-boot-%d-1.r%d.json"
                                % (name, OTHERS_STARTED_MS, r))
            with open(path, "w") as f:
                json.dump(rec, f, indent=2)
    refresh_heartbeats(backing)


def refresh_heartbeats(backing):
    """Fresh heartbeats of the other owners (the same incarnations as their records)."""
    now = int(time.time() * 1000)
    for o in range(OTHER_OWNERS):
        name = "other-%03d" % o
        path = os.path.join(backing, "owners", name + ".json")
        with open(path + ".tmp", "w") as f:
            json.dump({"v": 1, "owner": owner(name, OTHERS_STARTED_MS), "updated_ms": now}, f)
        os.rename(path + ".tmp", path)


class Pod:
    """tfinit as PID 1 of a PID namespace, the bench's controller, the shim and the stand-in."""

    def __init__(self, work, tfinit, state, backing):
        self.work, self.tfinit, self.backing = work, tfinit, backing
        for d in ("run", "shim", "fake", "ws"):
            os.makedirs(os.path.join(work, d), exist_ok=True)
        os.symlink(tfinit, os.path.join(work, "shim", "terraform"))
        fake = os.path.join(work, "fake", "terraform")
        with open(fake, "w") as f:
            f.write(FAKE)
        os.chmod(fake, 0o755)
        self.fifo = os.path.join(work, "signals.fifo")
        os.mkfifo(self.fifo)
        self.starts = os.path.join(work, "starts")
        self.log = os.path.join(work, "init.log")
        self.env = {
            "PATH": "%s:%s:/usr/bin:/bin" % (os.path.join(work, "shim"), os.path.join(work, "fake")),
            "TFINIT_RUN_DIR": os.path.join(work, "run"),
            "TFINIT_STATE_DIR": state,
            "TFINIT_OWNER": "bench",
            "TFINIT_LOG": "info",
            "TFINIT_LOG_FORMAT": "json",
            "TFINIT_GRACE_PERIOD": "%dms" % (GRACE * 1000),
            "TFINIT_STOP_TIMEOUT": "%dms" % (STOP * 1000),
            "TFINIT_KILL_MARGIN": "%dms" % (MARGIN * 1000),
            "BENCH_BACKING": backing,
            "BENCH_OUT": self.starts,
        }
        self.unshare = subprocess.Popen(
            ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", tfinit, "--",
             sys.executable, os.path.abspath(__file__), "controller", self.fifo],
            env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=open(self.log, "w"))
        self.signals = os.open(self.fifo, os.O_RDONLY)
        self.pid = self._init_pid()

    def _init_pid(self):
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                with open("/proc/%d/task/%d/children" % (self.unshare.pid, self.unshare.pid)) as f:
                    kids = f.read().split()
                if kids:
                    return int(kids[0])
            except OSError:
                pass
            time.sleep(0.005)
        raise SystemExit("bench-storage: tfinit did not start")

    def wait_log(self, needle, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            with open(self.log) as f:
                if needle in f.read():
                    return True
            time.sleep(0.05)
        return False

    def between(self, first, then):
        """Seconds from the init's first event `first` to its first `then` (log timestamps)."""
        ts = {}
        with open(self.log) as f:
            for line in f:
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                for m in (first, then):
                    if m not in ts and ev.get("message", "").startswith(m):
                        ts[m] = parse_ts(ev["timestamp"])
        return ts[then] - ts[first] if first in ts and then in ts else None

    def shim(self, cwd, args, tag, extra=None):
        env = dict(self.env, BENCH_TAG=tag, **(extra or {}))
        return subprocess.Popen([os.path.join(self.work, "shim", "terraform")] + args, cwd=cwd,
                                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)

    def forward(self, sig, timeout=10.0):
        """Sends sig to the init; ns until the controller had it, or None."""
        t0 = time.monotonic_ns()
        os.kill(self.pid, sig)
        buf = b""
        deadline = time.time() + timeout
        while not buf.endswith(b"\n"):
            r, _, _ = select.select([self.signals], [], [], max(0.0, deadline - time.time()))
            if not r:
                return None
            chunk = os.read(self.signals, 64)
            if not chunk:
                return None
            buf += chunk
        return int(buf.split()[1]) - t0

    def close(self):
        if self.unshare.poll() is None:
            self.unshare.kill()
            self.unshare.wait()


def starts(path):
    """tag -> [(start_ns, recorded)] from the stand-in's lines."""
    out = {}
    try:
        with open(path) as f:
            for line in f:
                p = line.split()
                if len(p) == 3:
                    out.setdefault(p[0], []).append((int(p[1]), p[2] == "1"))
    except OSError:
        pass
    return out


def config(a):
    work = tempfile.mkdtemp(prefix="tfinit-bench-storage.")
    vol = Volume(work, a.kind, a.delay_ms)
    pod = None
    stop = threading.Event()
    threads = []
    try:
        seed(vol.backing, work)
        vol.slow_down()
        pod = Pod(work, os.path.realpath(a.tfinit), vol.mount, vol.backing)
        if not pod.wait_log("lock-owner records enabled", 300):
            raise SystemExit("bench-storage: records never enabled; see " + pod.log)
        open_s = pod.between("controller started", "lock-owner records enabled")

        def heartbeats():
            while not stop.wait(5):
                refresh_heartbeats(vol.backing)

        spawned = {}  # tag -> [spawn_ns]
        lock = threading.Lock()

        def worker(i):
            cwd = os.path.join(work, "ws", "w%02d" % i)
            os.makedirs(cwd)
            n = 0
            while not stop.is_set():
                tag = "w%02d-%d" % (i, n)
                t = time.time_ns()
                p = pod.shim(cwd, ["apply", "-auto-approve"], tag)
                with lock:
                    spawned[tag] = t
                if p.wait() == 75:
                    break
                n += 1

        threads = [threading.Thread(target=heartbeats, daemon=True)]
        threads += [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(WORKERS)]
        for t in threads:
            t.start()
        time.sleep(1.0)

        lat = []
        lost = 0
        for _ in range(a.trials):
            ns = pod.forward(signal.SIGUSR1)
            if ns is None:
                lost += 1
            else:
                lat.append(ns / 1e6)
            time.sleep(random.uniform(0.025, 0.035))

        status = []
        for _ in range(max(5, min(20, a.trials))):
            t = time.monotonic_ns()
            subprocess.run([a.tfinit, "status"], env=pod.env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=120)
            status.append((time.monotonic_ns() - t) / 1e6)
            time.sleep(0.05)

        version = []
        vdir = os.path.join(work, "ws", "version")
        os.makedirs(vdir)
        for k in range(max(5, min(10, a.trials))):
            tag = "v-%d" % k
            t = time.time_ns()
            pod.shim(vdir, ["version"], tag).wait()
            got = starts(pod.starts).get(tag)
            if got:
                version.append((got[0][0] - t) / 1e6)

        # The timeline: one long run in flight, then SIGTERM.
        ldir = os.path.join(work, "ws", "long")
        os.makedirs(ldir)
        term_file = os.path.join(work, "term")
        long_run = pod.shim(ldir, ["apply", "-auto-approve"], "long", {"BENCH_TERM": term_file})
        deadline = time.time() + 120
        while "long" not in starts(pod.starts) and time.time() < deadline:
            time.sleep(0.01)
        sent = time.time_ns()
        os.kill(pod.pid, signal.SIGTERM)
        stop.set()
        late = None
        deadline = time.time() + GRACE + 10
        while time.time() < deadline:
            try:
                with open(term_file) as f:
                    late = (int(f.read().strip()) - sent) / 1e6 - (GRACE - STOP) * 1000
                break
            except (OSError, ValueError):
                time.sleep(0.01)
        long_run.wait(timeout=GRACE + 10)
        pod.unshare.wait(timeout=GRACE + 30)

        runs = starts(pod.starts)
        locking = [(v[0], v[1], spawned[k]) for k, vs in runs.items() if k.startswith("w")
                   for v in vs[:1] if k in spawned]
        base = statistics.median(version) if version else 0.0
        extra = [(s - sp) / 1e6 - base for s, _, sp in locking]
        result = {
            "kind": a.kind, "delay_ms": a.delay_ms, "trials": a.trials, "open_s": open_s,
            "fwd_p50": pct(lat, 50), "fwd_p99": pct(lat, 99), "fwd_max": max(lat or [0]),
            "fwd_lost": lost,
            "status_p50": pct(status, 50), "status_max": max(status),
            "sigterm_late_ms": late,
            "start_extra_p50": pct(extra, 50), "start_extra_p99": pct(extra, 99),
            "version_start_p50": base,
            "runs": len(locking), "unrecorded": sum(1 for _, r, _ in locking if not r),
        }
    finally:
        stop.set()
        if pod:
            pod.close()
        vol.close()
        subprocess.run(["rm", "-rf", work])
    with open(a.out, "w") as f:
        json.dump(result, f)


def true_overhead(a):
    """`INIT -- /bin/true` under unshare, per init, interleaved; ms."""
    work = tempfile.mkdtemp(prefix="tfinit-bench-storage-true.")
    tmpfs = Volume(os.path.join(work, "t"), "tmpfs", 0)
    fuse = Volume(os.path.join(work, "f"), "fuse", 5)
    fuse.slow_down()
    tini = subprocess.run(["sh", "-c", "command -v tini-static || command -v tini"],
                          capture_output=True, text=True).stdout.strip()
    inits = {
        "tfinit (state on tmpfs)": ([a.tfinit, "--"], {"TFINIT_STATE_DIR": tmpfs.mount}),
        "tfinit (state at 5 ms per operation)": ([a.tfinit, "--"], {"TFINIT_STATE_DIR": fuse.mount}),
    }
    if tini:
        inits["tini"] = ([tini, "--"], {})
    base_env = {"PATH": "/usr/bin:/bin", "TFINIT_RUN_DIR": os.path.join(work, "run"),
                "TFINIT_OWNER": "bench-true"}
    times = {k: [] for k in inits}
    try:
        for _ in range(a.trials):
            for name, (argv, env) in inits.items():
                t = time.monotonic_ns()
                subprocess.run(["unshare", "--pid", "--fork"] + argv + ["/bin/true"],
                               env=dict(base_env, **env), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, timeout=120)
                times[name].append((time.monotonic_ns() - t) / 1e6)
    finally:
        fuse.close()
        tmpfs.close()
        subprocess.run(["rm", "-rf", work])
    with open(a.out, "w") as f:
        json.dump({k: {"p50": pct(v, 50), "p90": pct(v, 90)} for k, v in times.items()}, f)


def fmt(v, nd=2):
    return "–" if v is None else ("%.*f" % (nd, v))


def report(work, delays):
    """The Markdown table of the results in WORK (one JSON per volume, and true.json)."""
    f = fmt
    rows = {}
    for d in delays:
        try:
            rows[d] = json.load(open("%s/%s.json" % (work, d)))
        except OSError:
            pass
    print("| state directory | forwarding p50 | p99 | max | status p50 | status max | graceful SIGTERM late | locking start extra p50 | p99 | locking runs | without a record | set-up |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for d in delays:
        r = rows.get(d)
        if not r:
            continue
        name = "tmpfs" if d == "tmpfs" else "%s ms per operation" % d
        lost = " (%d lost)" % r["fwd_lost"] if r.get("fwd_lost") else ""
        print("| %s | %s | %s | %s%s | %s | %s | %s | %s | %s | %d | %d | %s |" % (
            name, f(r["fwd_p50"]), f(r["fwd_p99"]), f(r["fwd_max"]), lost, f(r["status_p50"]),
            f(r["status_max"]), f(r["sigterm_late_ms"], 0), f(r["start_extra_p50"], 1),
            f(r["start_extra_p99"], 1), r["runs"], r["unrecorded"],
            f(None if r["open_s"] is None else r["open_s"] * 1000, 1)))
    tmp = rows.get("tmpfs")
    if tmp and tmp["fwd_p50"] and tmp["fwd_p99"]:
        worst50 = max(r["fwd_p50"] / tmp["fwd_p50"] for r in rows.values() if r["fwd_p50"])
        worst99 = max(r["fwd_p99"] / tmp["fwd_p99"] for r in rows.values() if r["fwd_p99"])
        print()
        print("Worst forwarding against tmpfs in this run: %.2f× at p50, %.2f× at p99 (target: at most 1.5×," % (worst50, worst99))
        print("and never above 2 ms p50 or 20 ms p99). Targets: status ≤ 100 ms; the graceful SIGTERM within")
        print("100 ms of its time.")
    t = json.load(open("%s/true.json" % work))
    print()
    print("| `INIT -- /bin/true` under unshare | p50 | p90 |")
    print("| --- | ---: | ---: |")
    for k, v in t.items():
        print("| %s | %s | %s |" % (k, f(v["p50"]), f(v["p90"])))


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "controller":
        return controller(sys.argv[2])
    if len(sys.argv) >= 4 and sys.argv[1] == "report" and sys.argv[2] == "--out":
        return report(sys.argv[3], sys.argv[4:])
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["config", "true"])
    ap.add_argument("--tfinit", required=True)
    ap.add_argument("--kind", choices=["tmpfs", "fuse"], default="tmpfs")
    ap.add_argument("--delay-ms", type=int, default=0)
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    a.tfinit = os.path.realpath(a.tfinit)
    if a.mode == "config":
        config(a)
    else:
        true_overhead(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
