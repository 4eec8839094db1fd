/* test_schedule.c - a chunk's forward pass as data (engine/schedule.c): the
 * steps printed for one shape against the order worked out by hand, and the
 * rules every schedule keeps, over many shapes (chunk and row-slice widths,
 * dense and MoE layers, AttnRes block lengths, a streamed trunk, all rows or
 * the last): each block of each layer's rows once, a MoE layer's blocks
 * finished once, after its experts and before the next layer's same block,
 * reads only while blocks follow, no wavefront with a streamed trunk, the
 * anchors each step sees, the output rows, and the capacity. */
#include "harness.h"
#include "schedule.h"

#include <stdio.h>
#include <string.h>

static void test_golden(void)
{
    static const uint8_t moe[3] = {0, 1, 1};
    sched_shape sh = {.T = 5, .row_slice = 2, .n_layers = 3, .block_len = 2, .moe = moe};
    sched_step st[128];
    int n = sched_build(&sh, st, 128);
    char buf[4096];
    sched_format(st, n, buf, sizeof buf);
    static const char want[] =
        "rows L0 0+2 anc 0\nrows L0 2+2 anc 0\nrows L0 4+1 anc 0\nend L0\n"
        "rows L1 0+2 anc 1\nreads L1\nrows L1 2+2 anc 1\nreads L1\nrows L1 4+1 anc 1\nexperts L1\nend L1\n"
        "finish L1 0+2 anc 1\nrows L2 0+2 anc 1\nreads L2\nfinish L1 2+2 anc 1\nrows L2 2+2 anc 1\nreads L2\n"
        "finish L1 4+1 anc 1\nrows L2 4+1 anc 1\nexperts L2\nfinish L2 0+2 anc 2\nfinish L2 2+2 anc 2\n"
        "finish L2 4+1 anc 2\nend L2\noutput L3 4+1 anc 2\n";
    TCHECKF(!strcmp(buf, want), "schedule:\n%s", buf);
    /* streamed: each layer present first, finished before the next; all rows out */
    sh.streamed = 1;
    sh.all_rows = 1;
    n = sched_build(&sh, st, 128);
    sched_format(st, n, buf, sizeof buf);
    static const char want_s[] =
        "trunk L0\nrows L0 0+2 anc 0\nrows L0 2+2 anc 0\nrows L0 4+1 anc 0\nend L0\n"
        "trunk L1\nrows L1 0+2 anc 1\nreads L1\nrows L1 2+2 anc 1\nreads L1\nrows L1 4+1 anc 1\nexperts L1\n"
        "finish L1 0+2 anc 1\nfinish L1 2+2 anc 1\nfinish L1 4+1 anc 1\nend L1\n"
        "trunk L2\nrows L2 0+2 anc 1\nreads L2\nrows L2 2+2 anc 1\nreads L2\nrows L2 4+1 anc 1\nexperts L2\n"
        "finish L2 0+2 anc 2\nfinish L2 2+2 anc 2\nfinish L2 4+1 anc 2\nend L2\ntrunk L3\n"
        "output L3 0+2 anc 2\noutput L3 2+2 anc 2\noutput L3 4+1 anc 2\n";
    TCHECKF(!strcmp(buf, want_s), "streamed schedule:\n%s", buf);
    TCHECK(sched_build(&sh, st, 10) == -1); /* short of room: refused, not overrun */
}

static int anchors_before(int il, int B) { return (il + B - 1) / B; } /* boundary layers < il */

/* The rules, for one shape; returns the number of broken ones (each reported). */
static int check_shape(const sched_shape *sh, const sched_step *st, int n)
{
    enum { MAXL = 8, MAXB = 16 };
    int bad = 0, nb = (sh->T + sh->row_slice - 1) / sh->row_slice;
    int rows_at[MAXL][MAXB], fin_at[MAXL][MAXB], exp_at[MAXL], trunk_at[MAXL + 1], end_at[MAXL];
    memset(rows_at, -1, sizeof rows_at);
    memset(fin_at, -1, sizeof fin_at);
    memset(exp_at, -1, sizeof exp_at);
    memset(trunk_at, -1, sizeof trunk_at);
    memset(end_at, -1, sizeof end_at);
    int out_rows = 0, out_first = -1;
#define RULE(c, fmt, ...)                                                                         \
    do {                                                                                          \
        if (!(c)) {                                                                               \
            bad++;                                                                                \
            t_fail(__FILE__, __LINE__, "T %d rb %d L %d B %d streamed %d: " fmt, sh->T, sh->row_slice,  \
                   sh->n_layers, sh->block_len, sh->streamed, __VA_ARGS__);                        \
        }                                                                                         \
    } while (0)
    for (int i = 0; i < n; i++) {
        const sched_step *s = &st[i];
        int b = s->t0 / sh->row_slice;
        switch (s->kind) {
        case STEP_TRUNK: trunk_at[s->il] = i; break;
        case STEP_ROWS:
            RULE(rows_at[s->il][b] < 0, "rows of layer %d block %d twice", s->il, b);
            rows_at[s->il][b] = i;
            RULE(s->n_anc == anchors_before(s->il, sh->block_len), "rows L%d see %d anchors", s->il, s->n_anc);
            if (s->il > 0 && sh->moe[s->il - 1])
                RULE(fin_at[s->il - 1][b] >= 0, "rows L%d block %d before L%d's finish", s->il, b, s->il - 1);
            if (s->il > 0) RULE(end_at[s->il - 1] >= 0, "rows L%d before L%d ended", s->il, s->il - 1);
            break;
        case STEP_READS:
            RULE(sh->moe[s->il] && i > 0 && st[i - 1].kind == STEP_ROWS && st[i - 1].il == s->il &&
                     st[i - 1].t0 + st[i - 1].nt < sh->T,
                 "reads L%d not right after a block with more to come", s->il);
            break;
        case STEP_EXPERTS:
            RULE(sh->moe[s->il], "experts of dense layer %d", s->il);
            for (int k = 0; k < nb; k++) RULE(rows_at[s->il][k] >= 0, "experts L%d before block %d routed", s->il, k);
            exp_at[s->il] = i;
            break;
        case STEP_FINISH:
            RULE(fin_at[s->il][b] < 0 && exp_at[s->il] >= 0, "finish L%d block %d twice or before experts", s->il, b);
            RULE(s->n_anc == anchors_before(s->il + 1, sh->block_len), "finish L%d sees %d anchors", s->il, s->n_anc);
            if (sh->streamed) RULE(trunk_at[s->il + 1] < 0, "finish L%d after the next layer's trunk", s->il);
            fin_at[s->il][b] = i;
            break;
        case STEP_LAYER_END: end_at[s->il] = i; break;
        case STEP_OUTPUT:
            RULE(s->n_anc == anchors_before(sh->n_layers, sh->block_len), "output sees %d anchors", s->n_anc);
            if (out_first < 0) out_first = s->t0;
            out_rows += s->nt;
            break;
        default: RULE(0, "unknown step %d", s->kind);
        }
    }
    for (int il = 0; il < sh->n_layers; il++) {
        for (int b = 0; b < nb; b++) {
            RULE(rows_at[il][b] >= 0, "layer %d block %d never runs", il, b);
            if (sh->moe[il]) RULE(fin_at[il][b] >= 0, "MoE layer %d block %d never finishes", il, b);
        }
        if (sh->streamed) RULE(trunk_at[il] >= 0 && trunk_at[il] < rows_at[il][0], "layer %d's trunk not first", il);
    }
    if (sh->streamed) RULE(trunk_at[sh->n_layers] >= 0, "the output head's trunk step (%d) missing", trunk_at[sh->n_layers]);
    RULE(sh->all_rows ? out_first == 0 && out_rows == sh->T : out_first == sh->T - 1 && out_rows == 1,
         "output rows from %d, %d of them", out_first, out_rows);
    RULE((size_t)n <= sched_capacity(sh->n_layers, sh->T, sh->row_slice), "%d steps past the capacity", n);
#undef RULE
    return bad;
}

static void test_rules(void)
{
    static const uint8_t pats[4][6] = {{0, 1, 1, 1, 1, 1}, {1, 1, 0, 1, 0, 1}, {0, 0, 0, 0, 0, 0}, {1, 0, 1, 1, 0, 0}};
    sched_step st[512];
    int shapes = 0, bad = 0;
    for (int p = 0; p < 4; p++)
        for (int L = 1; L <= 6; L++)
            for (int B = 1; B <= 3; B++)
                for (int T = 1; T <= 9; T++)
                    for (int rb = 1; rb <= 4; rb++)
                        for (int f = 0; f < 4; f++) {
                            sched_shape sh = {.T = T, .row_slice = rb, .n_layers = L, .block_len = B, .moe = pats[p],
                                              .streamed = f & 1, .all_rows = f >> 1};
                            int n = sched_build(&sh, st, sched_capacity(L, T, rb));
                            TCHECK(n > 0);
                            if (n > 0) bad += check_shape(&sh, st, n);
                            shapes++;
                        }
    TCHECKF(bad == 0, "%d broken rules over %d shapes", bad, shapes);
}

static const test_case tests[] = {
    {"golden", test_golden},
    {"rules", test_rules},
};

int main(int argc, char **argv) { return test_main(tests, NTESTS(tests), argc, argv); }
