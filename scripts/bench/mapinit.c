// mapinit: the exit floor an init's size sets. A do-nothing init that first maps the first
// FILE_KIB KiB of a file (MAPFILE; all of it without FILE_KIB) the way an executable's text is
// mapped once the page cache holds it in large folios (every page touched, PROT_READ|PROT_EXEC)
// and touches ANON_KIB KiB of anonymous memory, then runs its argv as its child and exits with the
// child's status once it has reaped it. Given tfinit's own binary and what tfinit holds when idle
// (RssFile, RssAnon), its exit in pid1bench's lifecycle trials is what any init of tfinit's size
// pays before doing anything (scripts/bench-pid1.sh, docs/benchmarks.md).
//
//   MAPFILE=/path/to/tfinit FILE_KIB=3080 ANON_KIB=248 mapinit CHILD ARGS...
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static void die(const char *what) {
    perror(what);
    exit(125);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: MAPFILE=FILE FILE_KIB=N ANON_KIB=N mapinit CHILD ARGS...\n");
        return 2;
    }
    volatile unsigned long sum = 0;
    const char *file = getenv("MAPFILE");
    if (file && *file) {
        int fd = open(file, O_RDONLY | O_CLOEXEC);
        struct stat st;
        if (fd < 0 || fstat(fd, &st)) die("mapinit: MAPFILE");
        const char *kib = getenv("FILE_KIB");
        off_t len = st.st_size;
        if (kib && *kib && (off_t)atol(kib) * 1024 < len) len = (off_t)atol(kib) * 1024;
        unsigned char *p = mmap(NULL, len, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) die("mapinit: mmap MAPFILE");
        close(fd);
        for (off_t o = 0; o < len; o += 4096) sum += p[o];
    }
    const char *anon = getenv("ANON_KIB");
    if (anon && *anon) {
        size_t n = (size_t)atol(anon) * 1024;
        char *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) die("mapinit: mmap ANON_KIB");
        memset(m, 1, n);
        sum += (unsigned char)m[n - 1];
    }
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, NULL);
    pid_t child = fork();
    if (child < 0) die("mapinit: fork");
    if (child == 0) {
        sigprocmask(SIG_UNBLOCK, &chld, NULL);
        execv(argv[1], argv + 1);
        _exit(127);
    }
    for (;;) {
        int sig, st;
        if (sigwait(&chld, &sig)) die("mapinit: sigwait");
        pid_t w;
        while ((w = waitpid(-1, &st, WNOHANG)) > 0)
            if (w == child) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
}
