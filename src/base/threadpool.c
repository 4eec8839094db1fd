/* threadpool.c - see threadpool.h.
 *
 * A job is published by bumping `generation` under the mutex; workers spin
 * briefly on it (decode issues many short jobs per token) and then sleep on
 * the condition variable.  Work is claimed with an atomic cursor in chunks;
 * completion is an atomic count of workers that left the job.
 */
#define _GNU_SOURCE
#include "threadpool.h"
#include "util.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

struct threadpool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint generation;
    atomic_int stop;
    /* the current job */
    parallel_fn fn;
    void *ctx;
    size_t n, chunk;
    atomic_size_t cursor;
    atomic_int done;        /* workers (excluding the caller) finished */
};

typedef struct { threadpool *pool; int id; } worker_arg;

static void run_job(threadpool *p, int id)
{
    for (;;) {
        size_t b = atomic_fetch_add(&p->cursor, p->chunk);
        if (b >= p->n) break;
        size_t e = b + p->chunk < p->n ? b + p->chunk : p->n;
        p->fn(p->ctx, b, e, id);
    }
}

static void *worker_main(void *arg)
{
    worker_arg *wa = arg;
    threadpool *p = wa->pool;
    int id = wa->id;
    free(wa);
    alloc_guard_join_thread(); /* runs the token loop's parallel_for jobs */
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load(&p->generation)) == seen && !atomic_load(&p->stop)) {
            if (++spins < 20000) {
                if (spins % 1024 == 0) sched_yield();
                else cpu_relax();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            while (atomic_load(&p->generation) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) break;
        seen = g;
        run_job(p, id);
        atomic_fetch_add(&p->done, 1);
    }
    return NULL;
}

threadpool *threadpool_new(int n_threads)
{
    if (n_threads < 1) n_threads = 1;
    threadpool *p = xcalloc(1, sizeof *p);
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->threads = xcalloc((size_t)n_threads, sizeof *p->threads);
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = xmalloc(sizeof *wa);
        wa->pool = p;
        wa->id = i;
        CHECK(pthread_create(&p->threads[i], NULL, worker_main, wa) == 0);
    }
    return p;
}

void threadpool_free(threadpool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->threads);
    free(p);
}


int threadpool_size(const threadpool *p) { return p ? p->n_threads : 1; }

void parallel_for(threadpool *p, size_t n, size_t grain, parallel_fn fn, void *ctx)
{
    if (n == 0) return;
    if (grain < 1) grain = 1;
    if (!p || p->n_threads == 1 || n <= grain) {
        fn(ctx, 0, n, 0);
        return;
    }
    size_t chunk = n / ((size_t)p->n_threads * 4);
    if (chunk < grain) chunk = grain;
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->chunk = chunk;
    atomic_store(&p->cursor, 0);
    atomic_store(&p->done, 0);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->generation, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    run_job(p, 0);
    /* spin briefly, then yield: on an oversubscribed machine the worker we
     * wait for may need this core */
    for (int spins = 0; atomic_load(&p->done) < p->n_threads - 1; spins++) {
        if (spins < 2000) cpu_relax();
        else sched_yield();
    }
}
