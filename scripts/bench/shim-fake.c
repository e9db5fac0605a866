// The fake terraform of scripts/bench-shim.sh: the cheapest honest stand-in, so that the shim's
// cost is the difference between its two columns. With FAKE_SLEEP=S it first sleeps S seconds
// (runs held in flight); with FAKE_BYTES=N it writes N bytes of 'x' to stdout in 128 KiB writes
// (the relay's throughput); then it exits 0. Built static, so no loader time is measured.
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
int main(void) {
    const char *b = getenv("FAKE_BYTES"), *s = getenv("FAKE_SLEEP");
    if (s) sleep((unsigned)atoi(s));
    if (b) {
        static char buf[128 << 10];
        memset(buf, 'x', sizeof buf);
        long long left = atoll(b);
        while (left > 0) {
            ssize_t n = write(1, buf, left < (long long)sizeof buf ? (size_t)left : sizeof buf);
            if (n <= 0) return 1;
            left -= n;
        }
    }
    return 0;
}
