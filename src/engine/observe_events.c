/* observe_events.c - the events observer (--events): one JSON line per
 * forward call with the expert cache's hits and misses, bytes read, I/O
 * wait, the prefetcher's counters and each layer's time, from a chunk's
 * begin, each layer's end and the chunk's end.
 */
#include "engine_impl.h"
#include "util.h"

#include <stdio.h>

void observe_events(df_engine *eng, chunk_obs *o, const probe_ev *ev)
{
    switch (ev->point) {
    case PROBE_CHUNK_BEGIN:
        o->t_start = o->t_layer = now_sec();
        o->hits0 = eng->cache.hits;
        o->miss0 = eng->cache.misses;
        o->bytes0 = eng->m.store.st.bytes_io;
        o->pfi0 = eng->pf.issued;
        o->pfu0 = eng->cache.pf_used;
        o->late0 = eng->cache.late;
        o->wait0 = eng->m.store.st.wait_sec;
        break;
    case PROBE_LAYER_END: {
        double t = now_sec();
        eng->layer_sec[ev->il] = t - o->t_layer;
        o->t_layer = t;
        break;
    }
    case PROBE_CHUNK_END: {
        /* one JSON line per forward call (per token while decoding) */
        double dt_s = now_sec() - o->t_start, wait = eng->m.store.st.wait_sec - o->wait0;
        uint64_t hits = eng->cache.hits - o->hits0, miss = eng->cache.misses - o->miss0;
        uint64_t bytes = eng->m.store.st.bytes_io - o->bytes0;
        fprintf(eng->events,
                "{\"pos\":%d,\"tokens\":%d,\"ms\":%.3f,\"expert_hits\":%llu,\"expert_misses\":%llu,"
                "\"hit_rate\":%.4f,\"bytes_read\":%llu,\"io_wait_ms\":%.3f,\"io_wait_share\":%.4f,"
                "\"read_gbps\":%.3f,\"prefetch\":%d,\"prefetch_issued\":%llu,\"prefetch_used\":%llu,"
                "\"prefetch_late\":%llu,\"layer_ms\":[",
                ev->pos0, ev->T, 1e3 * dt_s, (unsigned long long)hits, (unsigned long long)miss,
                hits + miss ? (double)hits / (double)(hits + miss) : 1.0, (unsigned long long)bytes, 1e3 * wait,
                dt_s > 0 ? wait / dt_s : 0.0, dt_s > 0 ? (double)bytes / dt_s / 1e9 : 0.0, eng->pf.active,
                (unsigned long long)(eng->pf.issued - o->pfi0), (unsigned long long)(eng->cache.pf_used - o->pfu0),
                (unsigned long long)(eng->cache.late - o->late0));
        for (int il = 0; il < eng->m.cfg.NL; il++) fprintf(eng->events, "%s%.3f", il ? "," : "", 1e3 * eng->layer_sec[il]);
        fprintf(eng->events, "]}\n");
        fflush(eng->events);
        break;
    }
    default: break;
    }
}

