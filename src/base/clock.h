/* clock.h - the one monotonic clock (L0).
 *
 * Every elapsed time in the engine, the front ends and the tools (k3gen,
 * llama_peer, which compile clock.c alone) is a difference of now_sec():
 * CLOCK_MONOTONIC in seconds as a double, never the wall clock (which can
 * jump).  No state, thread-safe.
 */
#ifndef DF_CLOCK_H
#define DF_CLOCK_H

/* Seconds on CLOCK_MONOTONIC (an arbitrary origin: use differences). */
double now_sec(void);

#endif
