/*
 * Clock reads as system calls, for measuring llmgw as it runs on a host whose clock
 * source has no user-space path (where the vDSO cannot serve `clock_gettime`, each read
 * enters the kernel). On a host with `tsc` or a stable `kvm-clock`, this makes every
 * process it is preloaded into pay for a system call per read, as such a host would:
 *
 *   cc -O2 -shared -fPIC -o /tmp/sysclock.so bench/tools/sysclock.c
 *   LD_PRELOAD=/tmp/sysclock.so .venv/bin/python -m bench run throughput ...
 *
 * Every process the bench starts inherits it (gateways, control plane, upstream, load);
 * the result's `machine.preload` names it. Python's `time` functions, asyncio's clock and
 * Rust's `Instant`/`SystemTime` all read the clock through these symbols of the C library.
 * A diagnostic, never part of llmgw.
 */
#define _GNU_SOURCE
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

int clock_gettime(clockid_t id, struct timespec *ts) {
    return (int)syscall(SYS_clock_gettime, id, ts);
}

int __clock_gettime(clockid_t id, struct timespec *ts) __attribute__((alias("clock_gettime"), copy(clock_gettime)));

int gettimeofday(struct timeval *tv, void *tz) {
    return (int)syscall(SYS_gettimeofday, tv, tz);
}

time_t time(time_t *out) {
    struct timespec ts;
    syscall(SYS_clock_gettime, CLOCK_REALTIME, &ts);
    if (out != NULL) {
        *out = ts.tv_sec;
    }
    return ts.tv_sec;
}
