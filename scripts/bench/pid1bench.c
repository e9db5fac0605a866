// pid1bench: runs an init as PID 1 of a fresh PID namespace (clone(CLONE_NEWPID): the init is our
// direct child, so waitpid times its exit exactly) with pid1bench itself as the init's child,
// reporting CLOCK_MONOTONIC timestamps through an inherited pipe.
//
//   pid1bench latency N   SPEC...   SIGTERM to the init -> the child has it (a fresh init each)
//   pid1bench cpu N K     SPEC...   K SIGUSR1s to the init, one at a time, then a SIGTERM: the
//                                   init's CPU time (every thread's, /proc/PID/task/*/schedstat)
//                                   per SIGUSR1, and for the SIGTERM
//   pid1bench lifecycle N SPEC...   clone -> child's main (start-to-exec); child's last
//                                   instruction -> init reaped (child exit to init exit), the
//                                   child exiting once the init is idle (its CPU time still)
//   pid1bench true N      SPEC...   clone -> `INIT /bin/true` reaped (a whole run)
//   pid1bench rss N       SPEC...   VmRSS, Pss, RssAnon and RssFile of the init supervising an
//                                   idle child
//   pid1bench reap N K    SPEC...   K orphans at once: from the spawner's exit until none is left
//
// SPEC is NAME=ARGV, the init's argv up to where the child's goes, split on spaces
// (`tini=/usr/bin/tini-static --`), after optional VAR=VALUE words set in the init's environment
// only (`base=TFINIT_STATE_DIR=/tmp/b /tmp/tfinit --`); `none=` runs the child as PID 1 itself
// (the baseline).
// Trials are interleaved over the SPECs in a rotating order, so load from elsewhere spreads over
// every init. Prints one line per SPEC: NAME metric values (microseconds, KiB, milliseconds).
// Built by scripts/bench-pid1.sh and scripts/trace-pid1.sh (bench_cc in scripts/bench-lib.sh).
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
    if (!strcmp(mode, "usr1")) {
        sigset_t s;
        sigemptyset(&s);
        sigaddset(&s, SIGUSR1);
        sigaddset(&s, SIGTERM);
        sigprocmask(SIG_BLOCK, &s, NULL);
        report(fd, 'R', 0, 0);
        for (;;) {
            siginfo_t info;
            if (sigwaitinfo(&s, &info) < 0) continue;
            report(fd, info.si_signo == SIGTERM ? 'T' : 'U', 0, 0);
        }
    }
    if (!strcmp(mode, "stamp")) {
        // The exit is measured from an idle init: the driver says when (SIGUSR2, to our pid as
        // the driver sees it: /proc is the driver's), once the init's CPU time stands still.
        sigset_t s;
        sigemptyset(&s);
        sigaddset(&s, SIGUSR2);
        sigprocmask(SIG_BLOCK, &s, NULL);
        char self[32] = {0};
        if (readlink("/proc/self", self, sizeof self - 1) <= 0) return 2;
        report(fd, 'S', t_main, atoll(self));
        siginfo_t info;
        while (sigwaitinfo(&s, &info) < 0) {}
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
        // Leading VAR=VALUE words of a SPEC are the init's own environment.
        while (argv[0] && argv[0][0] != '/' && strchr(argv[0], '=')) putenv(*argv++);
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

// Whether every thread of `pid` sleeps interruptibly (state S in /proc/PID/task/TID/stat): not
// running, and not waiting on storage (D), which uses no CPU time either.
static int all_sleeping(pid_t pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", pid);
    DIR *d = opendir(path);
    if (!d) return 1;
    int ok = 1;
    struct dirent *e;
    while (ok && (e = readdir(d))) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        char f[320], buf[512];
        snprintf(f, sizeof f, "/proc/%d/task/%s/stat", pid, e->d_name);
        FILE *s = fopen(f, "r");
        if (!s) continue;
        size_t n = fread(buf, 1, sizeof buf - 1, s);
        fclose(s);
        buf[n] = 0;
        char *paren = strrchr(buf, ')');
        if (paren && paren[1] == ' ' && paren[2] != 'S') ok = 0;
    }
    closedir(d);
    return ok;
}

// CPU time (ns) every thread of `pid` has run so far: the first field of each
// /proc/PID/task/TID/schedstat (the scheduler's sum_exec_runtime, exact, not sampled by ticks).
static int64_t cpu_ns(pid_t pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", pid);
    DIR *d = opendir(path);
    if (!d) return -1;
    int64_t sum = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        char f[320];
        snprintf(f, sizeof f, "/proc/%d/task/%s/schedstat", pid, e->d_name);
        FILE *s = fopen(f, "r");
        if (!s) continue;
        long long ns = 0;
        if (fscanf(s, "%lld", &ns) == 1) sum += ns;
        fclose(s);
    }
    closedir(d);
    return sum;
}

// Waits until `pid` is idle: every thread asleep (S) and no CPU time used for 10 ms; at least
// `min_ms`, at most 2 s. An init still starting (tfinit's recorder opening its store, fsync
// included) is not measured as idle.
static void wait_idle(pid_t pid, int min_ms) {
    int64_t t0 = now_ns(), last = cpu_ns(pid);
    for (;;) {
        struct timespec d = {0, 10 * 1000 * 1000};
        nanosleep(&d, NULL);
        int64_t c = cpu_ns(pid), waited = now_ns() - t0;
        if (c == last && all_sleeping(pid) && waited >= (int64_t)min_ms * 1000000) return;
        if (waited > 2000000000LL) return;
        last = c;
    }
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
    int64_t *a, *b, *c, *d;
    int ok, bad;
};

// One trial of `what` for one init; stores its samples at index init->ok, or counts a failure.
// `k` is the third argument of `reap` (orphans) and `cpu` (signals per trial).
static void trial(const char *what, struct init *in, const char *self, const char *k) {
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
            // Let the init finish starting and sit in its wait (BENCH_SETTLE_MS, default 20).
            const char *settle = getenv("BENCH_SETTLE_MS");
            sleep_ms(settle ? atoi(settle) : 20);
            t0 = now_ns();
            kill(r.pid, SIGTERM);
            if (expect(r.rd, 'T', &t1, NULL)) failed = 1;
            else in->a[i] = t1 - t0;
        }
        if (failed) kill(r.pid, SIGKILL);
        reap(r.pid, NULL);
        close(r.rd);
    } else if (!strcmp(what, "cpu")) {
        // K SIGUSR1s one at a time (each waits for the child's report, so none coalesce) to an
        // init that has settled: the init's CPU over all of them, per signal (a, ns); then one
        // SIGTERM, the stop signal, and the init's CPU for it (b, ns). Each reading waits 5 ms
        // after the child's report, so what the init does after its kill(2) is counted too.
        struct run r = start(build(in->argv, in->n, self, "usr1", fd, NULL), 0, p);
        int nsig = atoi(k);
        if (expect(r.rd, 'R', NULL, NULL)) failed = 1;
        else {
            wait_idle(r.pid, 20);
            int64_t c0 = cpu_ns(r.pid);
            for (int s = 0; s < nsig && !failed; s++) {
                kill(r.pid, SIGUSR1);
                if (expect(r.rd, 'U', NULL, NULL)) failed = 1;
            }
            sleep_ms(5);
            int64_t c1 = cpu_ns(r.pid);
            kill(r.pid, SIGTERM);
            if (expect(r.rd, 'T', NULL, NULL)) failed = 1;
            sleep_ms(5);
            int64_t c2 = cpu_ns(r.pid);
            if (c0 < 0 || c1 < 0 || c2 < 0) failed = 1;
            if (!failed) {
                in->a[i] = (c1 - c0) / nsig;
                in->b[i] = c2 - c1;
            }
        }
        kill(r.pid, SIGKILL);
        reap(r.pid, NULL);
        close(r.rd);
    } else if (!strcmp(what, "lifecycle")) {
        struct run r = start(build(in->argv, in->n, self, "stamp", fd, NULL), 0, p);
        int64_t s, e, child;
        if (expect(r.rd, 'S', &s, &child)) failed = 1;
        else {
            wait_idle(r.pid, 20);
            kill((pid_t)child, SIGUSR2);
            if (expect(r.rd, 'E', &e, NULL)) failed = 1;
        }
        if (failed) kill(r.pid, SIGKILL);
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
            in->c[i] = status_kib(r.pid, "status", "RssAnon");
            in->d[i] = status_kib(r.pid, "status", "RssFile");
        }
        kill(r.pid, SIGKILL);
        reap(r.pid, NULL);
        close(r.rd);
    } else if (!strcmp(what, "reap")) {
        struct run r = start(build(in->argv, in->n, self, "orphans", fd, k), 1, p);
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
    if (argc >= 2 && (!strcmp(argv[1], "reap") || !strcmp(argv[1], "cpu"))) first = 4;
    if (argc <= first) {
        fprintf(stderr, "usage: pid1bench latency|lifecycle|true|rss N 'NAME=INIT ARGV'...\n"
                        "       pid1bench reap|cpu N K 'NAME=INIT ARGV'...\n");
        return 2;
    }
    const char *what = argv[1];
    int n = atoi(argv[2]);
    const char *k = first == 4 ? argv[3] : NULL;
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
        inits[j].c = calloc(n, sizeof(int64_t));
        inits[j].d = calloc(n, sizeof(int64_t));
    }
    char self[4096];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl < 0) die("readlink /proc/self/exe");
    self[sl] = 0;
    // Interleaved, in a rotating order, so that load from elsewhere spreads over every init.
    for (int t = 0; t < n; t++)
        for (int j = 0; j < ninits; j++) trial(what, &inits[(t + j) % ninits], self, k);
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
        } else if (!strcmp(what, "cpu"))
            printf("cpu_us median %.1f p90 %.1f term_cpu_us median %.1f p90 %.1f n %d failed %d\n",
                   pct(in->a, ok, 50) / 1e3, pct(in->a, ok, 90) / 1e3, pct(in->b, ok, 50) / 1e3,
                   pct(in->b, ok, 90) / 1e3, ok, in->bad);
        else if (!strcmp(what, "true"))
            printf("true_us p50 %.1f n %d failed %d\n", pct(in->a, ok, 50) / 1e3, ok, in->bad);
        else if (!strcmp(what, "rss"))
            printf("rss_kib median %lld pss_kib median %lld anon_kib median %lld file_kib median "
                   "%lld n %d failed %d\n",
                   (long long)pct(in->a, ok, 50), (long long)pct(in->b, ok, 50),
                   (long long)pct(in->c, ok, 50), (long long)pct(in->d, ok, 50), ok, in->bad);
        else
            printf("reap_ms median %.1f max %.1f spawn_ms median %.1f n %d failed %d\n",
                   pct(in->a, ok, 50) / 1e6, pct(in->a, ok, 100) / 1e6, pct(in->b, ok, 50) / 1e6,
                   ok, in->bad);
    }
    return 0;
}
