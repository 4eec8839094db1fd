/* threadpool.h - a persistent worker pool with parallel_for.
 *
 * Owns: n_threads - 1 worker threads created once (the caller is worker 0).
 * parallel_for(pool, n, fn, ctx) calls fn(ctx, begin, end, worker) over
 * disjoint ranges covering [0, n) and returns when all are done.  Ranges are
 * handed out dynamically, so fn must make each item's result independent of
 * which worker ran it and of the range boundaries: that is what keeps output
 * identical for every thread count.  parallel_for is not reentrant (fn must
 * not call it) and is called from one thread at a time (the session's).
 * Nothing here allocates after threadpool_new.
 */
#ifndef DF_THREADPOOL_H
#define DF_THREADPOOL_H

#include <stddef.h>

typedef struct threadpool threadpool;
typedef void (*parallel_fn)(void *ctx, size_t begin, size_t end, int worker);

threadpool *threadpool_new(int n_threads);
void threadpool_free(threadpool *pool);
/* The number of workers (the caller included); 1 for a NULL pool. */
int threadpool_size(const threadpool *pool);
/* grain: the smallest range worth handing out (>= 1). */
void parallel_for(threadpool *pool, size_t n, size_t grain, parallel_fn fn, void *ctx);

#endif
