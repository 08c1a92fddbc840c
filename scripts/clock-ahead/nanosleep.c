/* clock_nanosleep straight to the kernel, preloaded before libfaketime by scripts/clock-ahead.sh.
 *
 * libfaketime 0.9.10 (Debian's) with FAKETIME_DONT_FAKE_MONOTONIC=1 still shifts the deadline of
 * an absolute clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME), which Python >= 3.11's time.sleep
 * uses: every sleep fails with EINVAL. Faking the monotonic clock instead hangs condition waits.
 * The wall clock is what the suite must survive being moved; the monotonic clock stays real.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int clock_nanosleep(clockid_t clock_id, int flags, const struct timespec *request, struct timespec *remain) {
    return syscall(SYS_clock_nanosleep, clock_id, flags, request, remain) == 0 ? 0 : errno;
}
