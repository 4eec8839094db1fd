/* df_plan.h - the memory plan as data (L0, like df_error.h): decided by
 * plan.c (L3), acted on by the engine, shown by the front ends through
 * engine.h.  The type only: its printers are declared in plan.h, beside
 * their definitions (plan.c). */
#ifndef DF_PLAN_H
#define DF_PLAN_H

#include <stddef.h>
#include <stdint.h>

/* Where the memory budget goes (src/plan.c decides; see df_plan_model and
 * df_engine_plan).  Every byte the engine allocates for a model and its
 * planned session is in `used`, and used <= budget. */
enum { DF_TRUNK_RESIDENT = 0, DF_TRUNK_STREAMED = 1 };
#define DF_PLAN_MAX_LAYERS 1024 /* trunk layers a plan can keep resident one by one (more: whole-trunk only) */
enum { DF_CTX_GIVEN = 0, DF_CTX_SERVE_FITS, DF_CTX_SERVE_SMALLER, DF_CTX_SERVE_FLOOR };
enum { DF_CTX_WHY_NONE = 0, DF_CTX_WHY_CACHE, DF_CTX_WHY_TRUNK, DF_CTX_WHY_BUDGET };
typedef struct df_plan {
    uint64_t budget;
    int budget_given;             /* the user's --mem (else the default share of RAM) */
    int trunk_mode;               /* DF_TRUNK_RESIDENT or DF_TRUNK_STREAMED */
    uint64_t trunk_bytes;         /* layer matrices + output head */
    uint64_t embed_bytes;         /* embedding (resident: mapped and counted; streamed: read by row) */
    uint64_t vec_bytes;           /* small f32 vectors */
    uint64_t trunk_buf_bytes;     /* streamed: each of the two layer buffers */
    uint64_t trunk_used;          /* what the trunk takes under this plan */
    /* partial residency (a streamed plan): the layers kept in memory, by
     * index (0..NL-1, NL = the output head); the others are streamed
     * through the two buffers, sized for the largest of them */
    int trunk_layers;             /* NL + 1 (0: the sizes did not say) */
    int trunk_resident_n;         /* layers kept resident */
    uint64_t trunk_resident_bytes;/* their matrices' bytes (not read per token) */
    uint8_t trunk_resident_layer[DF_PLAN_MAX_LAYERS];
    /* the alternative it was chosen over: the whole trunk streamed, the
     * cache taking the rest (bytes per decoded token: trunk + experts est.) */
    uint64_t alt_stream_all_read, alt_stream_all_cache;
    uint64_t state_bytes, scratch_bytes, reserve_bytes;
    uint64_t mpi_bytes;           /* of reserve_bytes: Open MPI's share under mpirun (0 in one process) */
    int mpi_ranks;
    uint64_t remote_bytes;        /* of reserve_bytes: libcurl's share when experts stream from a mirror */
    int n_ctx, max_batch;         /* the planned session: context, prompt chunk (positions per pass) */
    int checkpoints;              /* ... its conversation checkpoints (in state_bytes), */
    uint64_t checkpoint_bytes;    /* ... each a copy of the KDA state and conv history */
    /* how n_ctx was chosen: DF_CTX_GIVEN (--ctx or the caller's), or serve's
     * default rule (plan.c plan_serve_ctx): ctx_want fits (DF_CTX_SERVE_FITS),
     * or a smaller power of two does (DF_CTX_SERVE_SMALLER), or none above the
     * floor does (DF_CTX_SERVE_FLOOR); ctx_why says what ctx_want broke */
    int ctx_rule, ctx_want, ctx_why;
    uint64_t ctx_floor_resident;  /* serve's rule: the trunk kept resident at its floor context (a larger
                                     context may take it from partial residency; the reason says so) */
    uint64_t stream_min_slots;    /* the expert cache's streaming minimum (plan_stream_min_slots) */
    int batch_auto;               /* max_batch was chosen by the planner (--batch auto) */
    uint64_t cache_bytes;         /* expert cache (slots + transient) */
    uint64_t n_slots, n_transient, n_experts;
    uint64_t expert_bytes, slot_bytes;
    int k, n_moe_layers;
    int cache_forced;             /* --expert-cache set its size */
    uint64_t used;
    uint64_t resident_from;       /* the smallest budget that keeps the trunk resident (plan.c's own
                                   * rule, at this plan's context and first chunk: doctor prints it) */
    /* expected reads per decoded token (one position per forward pass) */
    uint64_t trunk_read_per_token;    /* streamed trunk: all of it, every pass */
    char trunk_types[40];             /* the trunk matrices' types by bytes ("q8_0+bf16"); "" unknown */
    int trunk_quantized;              /* some are block-quantized: the plan line says so */
    char expert_types[40];            /* the routed experts' types by bytes ("mxfp4", "q4_k+q6_k") */
    int experts_requantized;          /* not the released MXFP4 experts: the plan line says so */
    uint64_t expert_read_cold;        /* n_moe_layers * k experts, nothing cached */
    double est_hit_rate;              /* uniform-routing estimate: slots / experts */
    uint64_t expert_read_est;         /* expert_read_cold * (1 - est_hit_rate) */
} df_plan;

#endif
