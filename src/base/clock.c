/* clock.c - see clock.h. */
#define _POSIX_C_SOURCE 200809L
#include "clock.h"

#include <time.h>

double now_sec(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
