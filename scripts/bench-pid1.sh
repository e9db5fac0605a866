#!/usr/bin/env bash
# tfinit against tini, dumb-init and catatonit as PID 1, side by side in one run (issue 2):
#   - signal-forwarding latency: SIGTERM to the init until its child has it (p50, p99);
#   - reaping: 20,000 orphans at once, from the spawner's exit until none is left;
#   - the init's memory while it supervises an idle child (VmRSS and Pss);
#   - start-to-exec (the init's clone until its child's main) and a whole `INIT -- /bin/true`;
#   - exit time: the child's last instruction until the init has been reaped;
#   - binary size, and whether it is static.
#
#   scripts/bench-pid1.sh [--write] [TRIALS]   # default 200 trials, 15 bursts (BENCH_REAP_TRIALS); root
#
# Each init runs as PID 1 of a new PID namespace, as in a container: a small C program
# (pid1bench, written out and compiled below) clones it with CLONE_NEWPID, so the init is its
# direct child and waitpid times the init's exit exactly, and runs itself as the init's child to
# report CLOCK_MONOTONIC timestamps through an inherited pipe. Trials are interleaved over the
# inits so load from elsewhere on the machine spreads over all of them. Each init runs in its
# default mode: tini and catatonit forward to the child, dumb-init and tfinit to its process
# group. tfinit runs with a control socket and a writable state directory (lock-owner records
# on), as in a pod with a volume.
#
# --write replaces the section between <!-- bench-pid1:start --> and <!-- bench-pid1:end --> in
# docs/benchmarks.md (date, machine and versions included); without it the section is printed.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh

WRITE=0
if [ "${1:-}" = --write ]; then
    WRITE=1
    shift
fi
TRIALS=${1:-200}
REAP_TRIALS=${BENCH_REAP_TRIALS:-15}
ORPHANS=20000
RSS_TRIALS=5

[ "$(id -u)" = 0 ] || { echo "bench-pid1: needs root (clone(CLONE_NEWPID)); run it as root or in the CI container" >&2; exit 2; }
missing=()
for b in tini dumb-init catatonit; do command -v "$b" >/dev/null || missing+=("$b"); done
if [ ${#missing[@]} -gt 0 ]; then
    echo "bench-pid1: installing ${missing[*]}" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
command -v gcc >/dev/null || { echo "bench-pid1: gcc is missing (apt-get install gcc)" >&2; exit 2; }

if [ -z "${TFINIT_BIN:-}" ]; then
    cargo build --release --quiet
    TFINIT_BIN=target/x86_64-unknown-linux-gnu/release/tfinit
fi
TFINIT_BIN=$(readlink -f "$TFINIT_BIN")
# Docker's --init ships a static tini (docker-init); Debian has both, prefer the static one.
TINI=$(command -v tini-static || command -v tini)
DUMB_INIT=$(command -v dumb-init)
CATATONIT=$(command -v catatonit)

WORK=$(mktemp -d /tmp/tfinit-bench-pid1.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/run" "$WORK/state"
export TFINIT_RUN_DIR=$WORK/run TFINIT_STATE_DIR=$WORK/state TFINIT_OWNER=bench-pid1
unset TFINIT_LOG TFINIT_LOG_FORMAT TFINIT_FORWARD TFINIT_REWRITE TFINIT_GRACE_PERIOD \
    TFINIT_STOP_TIMEOUT TFINIT_KILL_MARGIN

cat >"$WORK/pid1bench.c" <<'EOF_C'
// pid1bench: runs an init as PID 1 of a fresh PID namespace (clone(CLONE_NEWPID): the init is our
// direct child, so waitpid times its exit exactly) with pid1bench itself as the init's child,
// reporting CLOCK_MONOTONIC timestamps through an inherited pipe.
//
//   pid1bench latency N   SPEC...   SIGTERM to the init -> the child has it (a fresh init each)
//   pid1bench lifecycle N SPEC...   clone -> child's main (start-to-exec); child's last
//                                   instruction -> init reaped (child exit to init exit)
//   pid1bench true N      SPEC...   clone -> `INIT /bin/true` reaped (a whole run)
//   pid1bench rss N       SPEC...   VmRSS and Pss of the init supervising an idle child
//   pid1bench reap N K    SPEC...   K orphans at once: from the spawner's exit until none is left
//
// SPEC is NAME=ARGV, the init's argv up to where the child's goes, split on spaces
// (`tini=/usr/bin/tini-static --`); `none=` runs the child as PID 1 itself (the baseline).
// Trials are interleaved over the SPECs in a rotating order, so load from elsewhere spreads over
// every init. Prints one line per SPEC: NAME metric values (microseconds, KiB, milliseconds).
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void die(const char *what) {
    perror(what);
    exit(1);
}

static void report(int fd, char tag, int64_t a, int64_t b) {
    char buf[64];
    int n = snprintf(buf, sizeof buf, "%c %lld %lld\n", tag, (long long)a, (long long)b);
    if (write(fd, buf, n) != n) _exit(3);
}

// ---------- the child, run by the init ----------

// Whether /proc lists more than `limit` processes. Stops reading at the first one over, so a
// poll costs one getdents batch, not a walk over 20,000 entries (the poller must not compete
// with the init it measures).
static int more_procs_than(int limit) {
    DIR *d = opendir("/proc");
    if (!d) return 1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] >= '0' && e->d_name[0] <= '9' && ++n > limit) break;
    closedir(d);
    return n > limit;
}

static int child_main(int argc, char **argv) {
    int64_t t_main = now_ns();
    if (argc < 2) return 2;
    const char *mode = argv[0];
    int fd = atoi(argv[1]);
    if (!strcmp(mode, "term")) {
        sigset_t s;
        sigemptyset(&s);
        sigaddset(&s, SIGTERM);
        sigprocmask(SIG_BLOCK, &s, NULL);
        report(fd, 'R', 0, 0);
        siginfo_t info;
        while (sigwaitinfo(&s, &info) < 0 && errno == EINTR) {}
        report(fd, 'T', now_ns(), 0);
        return 0;
    }
    if (!strcmp(mode, "stamp")) {
        report(fd, 'S', t_main, 0);
        // Let the init settle into its wait, so the exit is measured from an idle init.
        struct timespec d = {0, 20 * 1000 * 1000};
        nanosleep(&d, NULL);
        report(fd, 'E', now_ns(), 0);
        _exit(0);
    }
    if (!strcmp(mode, "idle")) {
        report(fd, 'R', 0, 0);
        for (;;) pause();
    }
    if (!strcmp(mode, "orphans") && argc >= 3) {
        int k = atoi(argv[2]);
        int64_t t0 = now_ns();
        pid_t spawner = fork();
        if (spawner == 0) {
            for (int i = 0; i < k;) {
                pid_t p = fork();
                if (p == 0) _exit(0);
                if (p > 0) i++;
                else usleep(1000);
            }
            _exit(0);
        }
        waitpid(spawner, NULL, 0);
        // Every orphan is now the init's; the namespace holds the init, us, and the zombies.
        int64_t t1 = now_ns();
        while (more_procs_than(2)) usleep(500);
        int64_t t2 = now_ns();
        report(fd, 'O', t1 - t0, t2 - t1);
        return 0;
    }
    return 2;
}

// ---------- the driver ----------

struct run {
    pid_t pid;     // the init (PID 1 inside), as we see it
    int rd;        // read end of the child's report pipe
    int64_t t_clone;
};

// Starts argv as PID 1 of a new PID namespace; with `proc`, also a mount namespace with its own
// /proc (for children that look at /proc). The report pipe's write end is inherited as `wfd`.
static struct run start(char **argv, int proc, int p[2]) {
    struct run r = {0};
    r.t_clone = now_ns();
    long flags = CLONE_NEWPID | SIGCHLD | (proc ? CLONE_NEWNS : 0);
    pid_t pid = (pid_t)syscall(SYS_clone, flags, NULL, NULL, NULL, 0);
    if (pid < 0) die("clone");
    if (pid == 0) {
        close(p[0]);
        if (proc) {
            if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL)) _exit(125);
            if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL)) _exit(125);
        }
        int null = open("/dev/null", O_RDWR);
        dup2(null, 0);
        dup2(null, 1);
        if (!getenv("BENCH_SHOW_STDERR")) dup2(null, 2);
        execv(argv[0], argv);
        _exit(127);
    }
    close(p[1]);
    r.pid = pid;
    r.rd = p[0];
    return r;
}

// Reads the next report line, which must have the given tag; returns 0 on success. Lines are
// single writes of a few bytes, so one read(2) usually returns exactly one: the driver wakes once
// per report instead of once per byte (it shares the CPUs with what it measures).
static char pending[256];
static size_t npending;

static int expect(int fd, char tag, int64_t *a, int64_t *b) {
    char *nl;
    while (!(nl = memchr(pending, '\n', npending))) {
        if (npending == sizeof pending) return -1;
        ssize_t k = read(fd, pending + npending, sizeof pending - npending);
        if (k <= 0) return -1;
        npending += (size_t)k;
    }
    *nl = 0;
    long long x = 0, y = 0;
    char t = 0;
    int ok = sscanf(pending, "%c %lld %lld", &t, &x, &y) >= 1 && t == tag;
    size_t used = (size_t)(nl - pending) + 1;
    memmove(pending, pending + used, npending - used);
    npending -= used;
    if (!ok) return -1;
    if (a) *a = x;
    if (b) *b = y;
    return 0;
}

static int64_t reap(pid_t pid, int *status) {
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) die("waitpid");
    int64_t t = now_ns();
    if (status) *status = st;
    return t;
}

static int cmp64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int64_t pct(int64_t *v, int n, int p) {
    qsort(v, n, sizeof *v, cmp64);
    int i = (int)((int64_t)(n - 1) * p / 100);
    return v[i];
}

static long status_kib(pid_t pid, const char *file, const char *key) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/%s", pid, file);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    long v = -1;
    size_t kl = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, kl) && line[kl] == ':') v = atol(line + kl + 1);
    fclose(f);
    return v;
}

// argv for one run: INIT... + [self, "child", mode, fd, extra...]
static char **build(char **init, int ninit, const char *self, const char *mode, int fd,
                    const char *extra) {
    char **a = calloc(ninit + 8, sizeof *a);
    int i = 0;
    for (; i < ninit; i++) a[i] = init[i];
    static char fdbuf[16];
    snprintf(fdbuf, sizeof fdbuf, "%d", fd);
    if (!strcmp(mode, "true")) {
        a[i++] = "/bin/true";
    } else {
        a[i++] = (char *)self;
        a[i++] = "child";
        a[i++] = (char *)mode;
        a[i++] = fdbuf;
        if (extra) a[i++] = (char *)extra;
    }
    a[i] = NULL;
    return a;
}

static void sleep_ms(int ms) {
    struct timespec d = {ms / 1000, (long)(ms % 1000) * 1000000};
    nanosleep(&d, NULL);
}

struct init {
    const char *name;
    char *argv[16];
    int n;
    int64_t *a, *b;
    int ok, bad;
};

// One trial of `what` for one init; stores its samples at index init->ok, or counts a failure.
static void trial(const char *what, struct init *in, const char *self, const char *k_orphans) {
    int p[2];
    if (pipe(p)) die("pipe");
    fcntl(p[0], F_SETFD, FD_CLOEXEC);
    int fd = p[1];
    int i = in->ok;
    npending = 0;
    int failed = 0;
    if (!strcmp(what, "latency")) {
        struct run r = start(build(in->argv, in->n, self, "term", fd, NULL), 0, p);
        int64_t t0, t1;
        if (expect(r.rd, 'R', NULL, NULL)) failed = 1;
        else {
            sleep_ms(20);  // let the init finish starting and sit in its wait
            t0 = now_ns();
            kill(r.pid, SIGTERM);
            if (expect(r.rd, 'T', &t1, NULL)) failed = 1;
            else in->a[i] = t1 - t0;
        }
        if (failed) kill(r.pid, SIGKILL);
        reap(r.pid, NULL);
        close(r.rd);
    } else if (!strcmp(what, "lifecycle")) {
        struct run r = start(build(in->argv, in->n, self, "stamp", fd, NULL), 0, p);
        int64_t s, e;
        if (expect(r.rd, 'S', &s, NULL) || expect(r.rd, 'E', &e, NULL)) {
            failed = 1;
            kill(r.pid, SIGKILL);
        }
        int64_t t_end = reap(r.pid, NULL);
        if (!failed) {
            in->a[i] = s - r.t_clone;
            in->b[i] = t_end - e;
        }
        close(r.rd);
    } else if (!strcmp(what, "true")) {
        struct run r = start(build(in->argv, in->n, self, "true", fd, NULL), 0, p);
        int st;
        int64_t t_end = reap(r.pid, &st);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) failed = 1;
        else in->a[i] = t_end - r.t_clone;
        close(r.rd);
    } else if (!strcmp(what, "rss")) {
        struct run r = start(build(in->argv, in->n, self, "idle", fd, NULL), 0, p);
        if (expect(r.rd, 'R', NULL, NULL)) failed = 1;
        else {
            sleep_ms(200);
            in->a[i] = status_kib(r.pid, "status", "VmRSS");
            in->b[i] = status_kib(r.pid, "smaps_rollup", "Pss");
        }
        kill(r.pid, SIGKILL);
        reap(r.pid, NULL);
        close(r.rd);
    } else if (!strcmp(what, "reap")) {
        struct run r = start(build(in->argv, in->n, self, "orphans", fd, k_orphans), 1, p);
        int64_t spawn, gone;
        if (expect(r.rd, 'O', &spawn, &gone)) {
            failed = 1;
            kill(r.pid, SIGKILL);
        } else {
            in->a[i] = gone;
            in->b[i] = spawn;
        }
        reap(r.pid, NULL);
        close(r.rd);
    } else {
        fprintf(stderr, "unknown measurement %s\n", what);
        exit(2);
    }
    if (failed) in->bad++;
    else in->ok++;
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "child")) return child_main(argc - 2, argv + 2);
    int first = 3;
    if (argc >= 2 && !strcmp(argv[1], "reap")) first = 4;
    if (argc <= first) {
        fprintf(stderr, "usage: pid1bench latency|lifecycle|true|rss N 'NAME=INIT ARGV'...\n"
                        "       pid1bench reap N K 'NAME=INIT ARGV'...\n");
        return 2;
    }
    const char *what = argv[1];
    int n = atoi(argv[2]);
    const char *k_orphans = first == 4 ? argv[3] : NULL;
    int ninits = argc - first;
    struct init *inits = calloc(ninits, sizeof *inits);
    for (int j = 0; j < ninits; j++) {
        char *spec = strdup(argv[first + j]);
        char *eq = strchr(spec, '=');
        if (!eq) { fprintf(stderr, "bad init spec %s\n", spec); return 2; }
        *eq = 0;
        inits[j].name = spec;
        for (char *w = strtok(eq + 1, " "); w && inits[j].n < 15; w = strtok(NULL, " "))
            inits[j].argv[inits[j].n++] = w;
        inits[j].a = calloc(n, sizeof(int64_t));
        inits[j].b = calloc(n, sizeof(int64_t));
    }
    char self[4096];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl < 0) die("readlink /proc/self/exe");
    self[sl] = 0;
    // Interleaved, in a rotating order, so that load from elsewhere spreads over every init.
    for (int t = 0; t < n; t++)
        for (int j = 0; j < ninits; j++) trial(what, &inits[(t + j) % ninits], self, k_orphans);
    for (int j = 0; j < ninits; j++) {
        struct init *in = &inits[j];
        int ok = in->ok;
        printf("%s ", in->name);
        if (ok == 0) {
            printf("%s failed %d\n", what, in->bad);
            continue;
        }
        if (!strcmp(what, "latency"))
            printf("latency_us p50 %.1f p99 %.1f n %d failed %d\n", pct(in->a, ok, 50) / 1e3,
                   pct(in->a, ok, 99) / 1e3, ok, in->bad);
        else if (!strcmp(what, "lifecycle")) {
            int64_t s50 = pct(in->a, ok, 50), e50 = pct(in->b, ok, 50), e99 = pct(in->b, ok, 99);
            printf("start_us p50 %.1f exit_us p50 %.1f p99 %.1f n %d failed %d\n", s50 / 1e3,
                   e50 / 1e3, e99 / 1e3, ok, in->bad);
        } else if (!strcmp(what, "true"))
            printf("true_us p50 %.1f n %d failed %d\n", pct(in->a, ok, 50) / 1e3, ok, in->bad);
        else if (!strcmp(what, "rss"))
            printf("rss_kib median %lld pss_kib median %lld n %d failed %d\n",
                   (long long)pct(in->a, ok, 50), (long long)pct(in->b, ok, 50), ok, in->bad);
        else
            printf("reap_ms median %.1f max %.1f spawn_ms median %.1f n %d failed %d\n",
                   pct(in->a, ok, 50) / 1e6, pct(in->a, ok, 100) / 1e6, pct(in->b, ok, 50) / 1e6,
                   ok, in->bad);
    }
    return 0;
}
EOF_C
gcc -O2 -Wall -o "$WORK/pid1bench" "$WORK/pid1bench.c"
B=$WORK/pid1bench

INITS=("tfinit=$TFINIT_BIN --" "tini=$TINI --" "dumb-init=$DUMB_INIT" "catatonit=$CATATONIT --")
NAMES=(tfinit tini dumb-init catatonit)

run() { # run WHAT ARGS... : prints and keeps the driver's lines in $WORK/WHAT
    local what=$1
    shift
    echo "bench-pid1: $what $*" | sed "s|$WORK/||g" >&2
    "$B" "$what" "$@" | tee "$WORK/$what" >&2
}
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
run latency "$TRIALS" "${INITS[@]}" "none="
run lifecycle "$TRIALS" "${INITS[@]}" "none="
run true "$TRIALS" "${INITS[@]}" "none="
run rss "$RSS_TRIALS" "${INITS[@]}"
run reap "$REAP_TRIALS" "$ORPHANS" "${INITS[@]}"

# get WHAT NAME FIELD: the value after FIELD on NAME's line of WHAT (FIELD may repeat: p50 of the
# second measure is `get lifecycle tfinit exit_us p50`).
get() {
    awk -v n="$2" -v k1="$3" -v k2="${4:-}" '
        $1 == n { for (i = 2; i < NF; i++) if ($i == k1) { if (k2 == "") { print $(i+1); exit }
                  for (j = i + 1; j < NF; j++) if ($j == k2) { print $(j+1); exit } } }' "$WORK/$1"
}
failures=$(awk '{ for (i = 2; i < NF; i++) if ($i == "failed" && $(i+1) != 0) print FILENAME ": " $0 }' \
    "$WORK"/latency "$WORK"/lifecycle "$WORK"/true "$WORK"/rss "$WORK"/reap | sed "s|$WORK/||")
if [ -n "$failures" ]; then
    echo "bench-pid1: some trials failed:" >&2
    echo "$failures" >&2
    exit 1
fi

best() { # best WHAT FIELD [FIELD2] -> "VALUE NAME"
    local what=$1
    shift
    for n in tini dumb-init catatonit; do echo "$(get "$what" "$n" "$@") $n"; done | sort -g | head -1
}
# verdict MINE "BEST NAME" UNIT: "met: ..." when MINE <= BEST, else "missed: ...".
verdict() {
    awk -v m="$1" -v b="${2%% *}" -v who="${2#* }" -v u="$3" 'BEGIN {
        if (m + 0 <= b + 0) printf "met: %s %s vs %s %s %s\n", m, u, who, b, u
        else printf "missed: %s %s vs %s %s %s (+%.0f%%)\n", m, u, who, b, u, (m - b) * 100 / b }'
}

size() { stat -L -c %s "$1"; }
kib() { awk -v b="$1" 'BEGIN { printf "%.0f KiB", b / 1024 }'; }
bin_cell() { echo "$(kib "$(size "$1")") ($(bench_static "$1"))"; }
row() { # row LABEL CELL_FN: one table row, CELL_FN NAME prints a cell
    local label=$1 fn=$2 line="| $1 |"
    for n in "${NAMES[@]}" none; do line="$line $($fn "$n") |"; done
    echo "$line"
}
c_latency() { echo "$(get latency "$1" p50) / $(get latency "$1" p99)"; }
c_reap() { [ "$1" = none ] && echo "—" || echo "$(get reap "$1" reap_ms median) (max $(get reap "$1" max))"; }
c_rss() { [ "$1" = none ] && echo "—" || echo "$(get rss "$1" rss_kib median) / $(get rss "$1" pss_kib median)"; }
c_start() { get lifecycle "$1" start_us p50; }
c_true() { get true "$1" true_us p50; }
c_exit() { echo "$(get lifecycle "$1" exit_us p50) / $(get lifecycle "$1" exit_us p99)"; }
c_bin() {
    case $1 in
        tfinit) bin_cell "$TFINIT_BIN" ;;
        tini) bin_cell "$TINI" ;;
        dumb-init) bin_cell "$DUMB_INIT" ;;
        catatonit) bin_cell "$CATATONIT" ;;
        none) echo "—" ;;
    esac
}

version() { "$@" 2>&1 | head -1 | grep -Eo '[0-9]+\.[0-9]+(\.[0-9]+)?' | head -1; }
rss_kib=$(get rss tfinit rss_kib median)
tf_size=$(size "$TFINIT_BIN")
section="$WORK/section.md"
{
    echo "Measured $(date -u +%Y-%m-%d) with \`scripts/bench-pid1.sh $TRIALS\` on $(bench_machine):"
    echo "tfinit $("$TFINIT_BIN" --version | cut -d' ' -f2) (release build, commit $(bench_commit)),"
    echo "tini $(version "$TINI" --version) (\`$(basename "$TINI")\`), dumb-init $(version "$DUMB_INIT" --version),"
    echo "catatonit $(version "$CATATONIT" -V) (Debian packages). Each init is PID 1 of a fresh PID namespace;"
    echo "*none* is the child as PID 1 itself (the floor). $TRIALS trials per timing, interleaved over"
    echo "the inits; $REAP_TRIALS bursts of $ORPHANS orphans; memory over $RSS_TRIALS starts."
    echo
    echo "| | tfinit | tini | dumb-init | catatonit | none |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: |"
    row "SIGTERM forwarding latency, p50 / p99 (µs)" c_latency
    row "reap $ORPHANS orphans, median (ms)" c_reap
    row "memory supervising an idle child, VmRSS / Pss (KiB)" c_rss
    row "start-to-exec, p50 (µs)" c_start
    row "\`INIT -- /bin/true\`, whole run, p50 (µs)" c_true
    row "child exit to init exit, p50 / p99 (µs)" c_exit
    row "binary size" c_bin
    echo
    echo "- *Latency*: from kill(SIGTERM) on the init to the child's sigwaitinfo returning (the child"
    echo "  blocks SIGTERM; each init started 20 ms earlier and waits). *Reap*: the spawner forks the"
    echo "  orphans, which exit at once, and exits; from then until /proc shows only the init and the"
    echo "  measuring child (polled every 0.5 ms, reading /proc only up to a third process)."
    echo "  *Start-to-exec*: from clone() to the child's main; it includes the namespace's creation"
    echo "  and, for dynamic binaries, the loader. *Exit*: from the child's last instruction (it ran"
    echo "  20 ms, so the init is idle) to waitpid on the init returning, namespace teardown included."
    echo "- Load average $load_before before the run, $(cut -d' ' -f1-3 /proc/loadavg) after: on a shared"
    echo "  machine the p99s and the reap medians move by tens of percent from run to run."
    echo "- Targets (issue 2), tfinit against the best of the three peers:"
    echo "  - latency p50: $(verdict "$(get latency tfinit p50)" "$(best latency p50)" µs)"
    echo "  - reaping: $(verdict "$(get reap tfinit reap_ms median)" "$(best reap reap_ms median)" ms)"
    echo "  - exit time p50: $(verdict "$(get lifecycle tfinit exit_us p50)" "$(best lifecycle exit_us p50)" µs)"
    echo "  - memory under 2 MiB: $([ "$rss_kib" -lt 2048 ] && echo met || echo missed): VmRSS $rss_kib KiB"
    echo "  - static binary under 2 MiB: $([ "$(bench_static "$TFINIT_BIN")" = static ] && [ "$tf_size" -lt 2097152 ] && echo met || echo missed): $tf_size bytes, $(bench_static "$TFINIT_BIN")"
} >"$section"
cat "$section"

if [ "$WRITE" = 1 ]; then
    bench_write_section bench-pid1 "$section"
    echo "bench-pid1: wrote the PID 1 section of docs/benchmarks.md" >&2
fi
