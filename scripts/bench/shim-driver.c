// The timing driver of scripts/bench-shim.sh (built there by bench_cc, scripts/bench-lib.sh).
/* driver lat N WARMUP PATH ARGV0 [ARGS]: one line per timed run, microseconds.
   driver tput PATH ARGV0 [ARGS]: "bytes seconds" for the run's stdout, read from a pipe. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
extern char **environ;
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
static pid_t start(char *path, char **argv, int out) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    if (out >= 0) posix_spawn_file_actions_adddup2(&fa, out, 1);
    else posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    pid_t pid;
    int e = posix_spawn(&pid, path, &fa, NULL, argv, environ);
    if (e) { fprintf(stderr, "driver: posix_spawn %s: %s\n", path, strerror(e)); exit(2); }
    posix_spawn_file_actions_destroy(&fa);
    return pid;
}
static void reap(pid_t pid) {
    int st;
    if (waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "driver: the run failed (status 0x%x)\n", st);
        exit(3);
    }
}
int main(int argc, char **argv) {
    if (argc >= 6 && !strcmp(argv[1], "lat")) {
        int n = atoi(argv[2]), warm = atoi(argv[3]);
        for (int i = 0; i < warm + n; i++) {
            double t0 = now();
            reap(start(argv[4], argv + 5, -1));
            double t1 = now();
            if (i >= warm) printf("%.1f\n", (t1 - t0) * 1e6);
        }
        return 0;
    }
    if (argc >= 4 && !strcmp(argv[1], "tput")) {
        int p[2];
        if (pipe2(p, O_CLOEXEC)) return 2;
        static char buf[1 << 20];
        double t0 = now();
        pid_t pid = start(argv[2], argv + 3, p[1]);
        close(p[1]);
        long long total = 0;
        ssize_t n;
        while ((n = read(p[0], buf, sizeof buf)) > 0) total += n;
        reap(pid);
        printf("%lld %.6f\n", total, now() - t0);
        return 0;
    }
    fprintf(stderr, "usage: driver lat N WARMUP PATH ARGV0 [ARGS] | driver tput PATH ARGV0 [ARGS]\n");
    return 2;
}
