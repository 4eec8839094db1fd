/* grammar_impl.h - the built grammar's tables, shared by grammar.c (build,
 * reference simulator) and grammar_match.c (the matcher).  Private to
 * src/grammar/.
 */
#ifndef DF_GRAMMAR_IMPL_H
#define DF_GRAMMAR_IMPL_H

#include "grammar.h"

/* a DFA edge: target state in the low 28 bits, flags above; -1 = none */
#define GR_EDGE(t, fl) ((int32_t)((uint32_t)(t) | ((uint32_t)(fl) << 28)))
#define GR_TARGET(e) ((int)((uint32_t)(e) & 0x0FFFFFFFu))
#define GR_FLAGS(e) (((uint32_t)(e) >> 28) & 3u)
#define GR_UNBOUNDED (UINT32_MAX - 1)

typedef struct gr_frame {
    uint32_t m; /* machine */
    uint32_t s; /* its DFA state */
    uint32_t c; /* its counter */
} gr_frame;

typedef struct gr_call_edge {
    int callee;
    int to;
    unsigned flags;
} gr_call_edge;

struct gr_classes;

typedef struct gr_dfa {
    char *name;
    int n;                 /* states; 0 is the start */
    int32_t *next;         /* [n][GR_NSYM] GR_EDGE or -1 */
    uint8_t *acc;          /* [n] may return (when the counter is >= cmin) */
    uint8_t *has_sym;      /* [n] has a symbol edge */
    int *call_off;         /* [n + 1] into calls */
    gr_call_edge *calls;
    uint8_t *co;           /* [n] can complete */
    uint32_t *minrem;      /* [n] fewest GR_INC edges to a return */
    uint32_t *maxrem;      /* [n] most (GR_UNBOUNDED: no bound); counted machines only */
    int counted;
    uint32_t cmin, cmax;
} gr_dfa;

struct gr_grammar {
    int n_m;
    gr_dfa *m;
    int start;
    size_t n_states;
    /* token classes per (machine, state), for one vocabulary (grammar_match.c) */
    const gr_vocab *cls_vocab;
    struct gr_classes ***cls; /* [n_m][n states] */
};

/* Whether machine d may be in state s with counter c and still return. */
int gr_viable(const gr_dfa *d, int s, uint32_t c);
void gr_classes_free(gr_grammar *g);

#endif
