/* grammar.h - constrained decoding (L1): grammars as recursive networks of
 * small deterministic automata over bytes, and the matcher that gives, at
 * each step, exactly the tokens that can continue a valid output.
 *
 * A grammar is a set of machines.  A machine is an automaton over symbols
 * (the 256 bytes and K3's four template specials, GR_SYM_*) whose edges are
 * either symbol ranges or *calls* of another machine (run it to one of its
 * accepting states, then continue at the edge's target).  It is built as an
 * NFA (gr_builder) and determinized per machine by gr_build; calls keep the
 * network recursive (nested JSON, $ref cycles), so the matcher holds a set
 * of stacks of frames (machine, state, count).  A machine may have one
 * counter (min..max): edges flagged GR_INC add one (never past max), edges
 * flagged GR_NEEDMIN and returning need count >= min; string lengths and
 * array item counts use it, so maxLength 524288 is one counter, not 524288
 * states.
 *
 * Building owns: the NFA, subset construction, trimming every state from
 * which no output can be completed (so a masked step never strands the
 * decoder), and refusing grammars that accept nothing.  It does not know
 * JSON Schema (json_schema.h) or regular-expression syntax (gr_string.h).
 *
 * Invariants: after gr_build every reachable state can reach acceptance;
 * a machine's states are numbered from 0 (its start).  Symbols outside
 * 0..GR_NSYM-1 never match.
 */
#ifndef DF_GRAMMAR_H
#define DF_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "df_error.h"

/* K3's template specials as symbols after the bytes */
#define GR_SYM_OPEN 256  /* <|open|> */
#define GR_SYM_CLOSE 257 /* <|close|> */
#define GR_SYM_SEP 258   /* <|sep|> */
#define GR_SYM_EOM 259   /* <|end_of_msg|> */
#define GR_NSYM 260

#define GR_INC 1u     /* edge flag: count += 1 (must stay <= max) */
#define GR_NEEDMIN 2u /* edge flag: taken only when count >= min */

#define GR_COUNT_INF UINT32_MAX

typedef struct gr_builder gr_builder;
typedef struct gr_grammar gr_grammar;

gr_builder *gr_builder_new(void);
void gr_builder_free(gr_builder *b);
/* A new machine (its state 0, the start, is created with it); name is
 * copied (for messages and dumps).  Returns the machine's index. */
int gr_machine(gr_builder *b, const char *name);
/* A new NFA state of machine m. */
int gr_state(gr_builder *b, int m);
/* Edges of machine m from state `from` to state `to`. */
void gr_range(gr_builder *b, int m, int from, int to, int lo, int hi, unsigned flags); /* symbols lo..hi */
void gr_sym(gr_builder *b, int m, int from, int to, int sym, unsigned flags);
void gr_eps(gr_builder *b, int m, int from, int to);
void gr_call(gr_builder *b, int m, int from, int to, int callee, unsigned flags);
/* The bytes of s, one edge each, from -> to through new states. */
void gr_lit(gr_builder *b, int m, int from, int to, const char *s, size_t n);
void gr_accept(gr_builder *b, int m, int state);
/* Machine m counts: GR_INC edges, returning needs count in [min, max]. */
void gr_counter(gr_builder *b, int m, uint32_t min, uint32_t max);
int gr_n_states(const gr_builder *b, int m);
/* Determinize every machine, trim, and check that `start` accepts
 * something.  Fails with DF_ERR_ARG naming the machine whose language is
 * empty (e.g. a schema no value satisfies) or DF_ERR_LIMIT past
 * GR_MAX_DFA_STATES states in all (a state's table is 1 KiB: the cap keeps
 * one request's grammar under ~40 MiB).  The builder stays valid. */
#define GR_MAX_DFA_STATES 40000
int gr_build(const gr_builder *b, int start, gr_grammar **out, df_error *err);
void gr_grammar_free(gr_grammar *g);
/* Sizes, for the bench and tests. */
int gr_grammar_n_machines(const gr_grammar *g);
size_t gr_grammar_n_states(const gr_grammar *g);

/* ---- the matcher ------------------------------------------------------- */

/* A vocabulary as symbol strings: token id -> its bytes, or one special
 * symbol (GR_SYM_*), or nothing (a special the grammar never allows).
 * Shared by every matcher on it; built once per tokenizer.  The byte trie
 * and per-state token classes are computed here and cached per grammar. */
typedef struct gr_vocab gr_vocab;

/* bytes[id] (len[id] bytes; may contain NUL), special[id] = GR_SYM_* or -1
 * for an ordinary token, or -2 for a token that is never allowed. */
gr_vocab *gr_vocab_new(int n_vocab, const char *const *bytes, const size_t *len, const int *special);
void gr_vocab_free(gr_vocab *v);
int gr_vocab_n(const gr_vocab *v);

typedef struct gr_matcher gr_matcher;

/* A matcher of grammar g over vocabulary v (both must outlive it).  Owns
 * its state and scratch; stepping and masking allocate nothing except the
 * grammar's per-state token classes the first time a state is met (see
 * gr_matcher_warm). */
#define GR_MAX_STACKS 256
#define GR_MAX_DEPTH 96
gr_matcher *gr_matcher_new(gr_grammar *g, const gr_vocab *v);
void gr_matcher_free(gr_matcher *m);
/* Back to the start. */
void gr_matcher_reset(gr_matcher *m);
/* Compute the token classes of every state now (tokens cost nothing
 * later); returns the number of states classified. */
size_t gr_matcher_warm(gr_matcher *m);
/* Advance by token id; returns 0, or -1 (state unchanged) when the token
 * cannot follow. */
int gr_matcher_accept(gr_matcher *m, int32_t id);
/* Advance by raw symbols (bytes / GR_SYM_*): 0 or -1 (state unchanged). */
int gr_matcher_feed(gr_matcher *m, const int *syms, size_t n);
/* 1 when the output so far is a complete sentence of the grammar. */
int gr_matcher_done(gr_matcher *m);
/* 1 when no symbol can follow (done and nothing may be added). */
int gr_matcher_ended(gr_matcher *m);
/* The allowed tokens as a bitset of (n_vocab + 63) / 64 words; returns the
 * number allowed.  Exact: id is set iff gr_matcher_accept(id) would succeed. */
size_t gr_matcher_mask(gr_matcher *m, uint64_t *bits);
/* Set the logits of disallowed tokens to -infinity (using the mask). */
size_t gr_matcher_apply(gr_matcher *m, float *logits);
/* 1 once stacks were dropped (more than GR_MAX_STACKS alternatives or
 * nesting past GR_MAX_DEPTH): the mask may then refuse tokens the grammar
 * allows (never the reverse); callers report it. */
int gr_matcher_overflow(const gr_matcher *m);
/* Copy the state of src into dst (same grammar and vocabulary). */
void gr_matcher_copy(gr_matcher *dst, const gr_matcher *src);

/* The reference check (tests, fuzzing): whether the symbol string is a
 * complete sentence (complete = 1) or a prefix of one (complete = 0), by a
 * plain breadth-first simulation of the network, sharing no code with the
 * matcher's token classes. */
int gr_reference_accepts(const gr_grammar *g, const int *syms, size_t n, int complete);

#endif
