/* Constrained decoding: the output must be a literal prefix, then one JSON
 * document a (subset of) JSON Schema accepts, then a literal suffix, and
 * then it ends. A schema is compiled once per request into a fixed-size
 * cb_con_schema (a schema too big for it is refused, never allocated for);
 * the matcher (cb_con_state) is a pushdown automaton over bytes, copied and
 * stepped while the token list is walked, so nothing allocates while
 * serving. Whitespace: none outside strings (compact JSON), so the document
 * is complete as soon as its last value closes and the end is forced there.
 *
 * The schema subset and its limits are in docs/server.md ("Structured
 * outputs"); every keyword outside it is refused by name. */
#ifndef CB_CONSTRAIN_H
#define CB_CONSTRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "json.h"
#include "sampler.h"
#include "tokenizer.h"

#define CB_CON_MAX_NODES 128     /* schema nodes (every subschema) per request */
#define CB_CON_MAX_PROPS 128     /* properties, all objects together */
#define CB_CON_MAX_LIST 192      /* anyOf branches and enum values, together */
#define CB_CON_TEXT 4096         /* keys, enum values, prefix and suffix, in bytes */
#define CB_CON_OBJ_PROPS 64      /* properties of one object */
#define CB_CON_ENUM 64           /* values of one enum */
#define CB_CON_DEPTH 16          /* nesting of the output (prefix and suffix included) */
#define CB_CON_TOKEN_BYTES 256  /* longest token text a mask considers (CB_TOKEN_BYTES) */
#define CB_CON_THREADS 4         /* anyOf alternatives followed at once */

typedef struct {
    uint8_t types;               /* CB_CT_* bits */
    uint8_t format;              /* 0, or a CB_CF_* string format */
    uint8_t has_enum;
    int16_t add;                 /* additionalProperties: -1 none allowed, else a node */
    int16_t items;               /* array items: a node */
    uint16_t prop0, nprops;      /* properties: props[prop0 ..] */
    uint16_t alt0, nalt;         /* anyOf: list[alt0 ..] are nodes */
    uint16_t lit0, nlit;         /* enum/const: list[lit0 ..] index lits[] */
    int32_t min_items, max_items, min_len, max_len;
    int64_t lo, hi;              /* number bounds, in units of 10^-6 (integer: of 1) */
    uint64_t req;                /* bit i: property prop0 + i is required */
    uint32_t min_bytes;          /* shortest value this node accepts, in bytes */
    uint32_t depth;              /* nesting this node's values need (frames) */
} cb_con_node;

typedef struct {
    uint16_t off, len;           /* the key as JSON text (escaped, no quotes) in text[] */
    int16_t node;
    uint8_t required;
} cb_con_prop;

typedef struct {
    uint16_t off, len;
} cb_con_lit;

/* A compiled constraint: prefix, schema (root), suffix. */
typedef struct {
    int n_nodes, n_props, n_list, n_lits;
    size_t text_len;
    int root;
    uint16_t prefix_off, prefix_len, suffix_off, suffix_len;
    cb_con_node nodes[CB_CON_MAX_NODES];
    cb_con_prop props[CB_CON_MAX_PROPS];
    uint16_t list[CB_CON_MAX_LIST];
    cb_con_lit lits[CB_CON_MAX_LIST + 3];
    char text[CB_CON_TEXT];
    char err_at[192];            /* after a refusal: where in the schema, dotted
                                    ("properties.x.pattern"), "" at its root */
} cb_con_schema;

/* Compiles the constraint. schema: index of the schema object in toks
 * (parsed from json), or -1 for "any JSON object". Returns 0, or -1 with a
 * message naming the keyword (and its path in the schema) in err. */
int cb_con_compile(cb_con_schema *c, const char *prefix, size_t prefix_len, const char *json,
                   const cb_json_tok *toks, int schema, const char *suffix, size_t suffix_len, char *err,
                   size_t err_len);

/* One matcher frame; see constrain.c. */
typedef struct {
    uint8_t kind, sub;
    int16_t node;
    union {
        struct { uint64_t seen, cand; uint16_t kpos; uint8_t kfree; int16_t cur; } obj;
        struct { int32_t count; } arr;
        struct { int32_t chars; uint8_t esc, need, have, lead, prev; } str;
        struct { int64_t m; int32_t x; uint8_t neg, n_int, n_frac, zero, in_frac; } num;
        struct { uint64_t alive; uint16_t first, n, pos; } lit;
        struct { uint16_t off, len, pos; } text;
    } u;
} cb_con_frame;

typedef struct {
    int depth;
    cb_con_frame f[CB_CON_DEPTH];
} cb_con_thread;

/* The matcher: the alternatives still alive (anyOf), each a stack. */
typedef struct {
    int n;
    cb_con_thread t[CB_CON_THREADS];
} cb_con_state;

void cb_con_start(const cb_con_schema *c, cb_con_state *s);
/* Feeds bytes; 1 when the output stays a valid prefix (s advanced), 0 when
 * not (s unchanged). */
int cb_con_feed(const cb_con_schema *c, cb_con_state *s, const char *bytes, size_t n);
/* The output is complete: nothing more may follow (the end is forced). */
int cb_con_complete(const cb_con_state *s);
/* The output may end here (complete, or a top-level number that may go on). */
int cb_con_accepting(const cb_con_schema *c, const cb_con_state *s);
/* Fewest bytes that complete the output from here. */
uint32_t cb_con_min_bytes(const cb_con_schema *c, const cb_con_state *s);

/* Tokens sorted by their bytes, so a walk steps each shared prefix once:
 * lcp[i] bytes shared with ids[i - 1]; skip0[i] / skip1[i]: the first
 * token after i not sharing its first byte / first two bytes. */
typedef struct {
    int n;
    int32_t *ids;
    uint32_t *off;               /* token i's bytes: text[off[i] .. off[i + 1]) */
    char *text;
    uint16_t *lcp;
    int32_t *skip0, *skip1;
} cb_con_list;

/* The vocabulary, prepared once at start for fast masks. */
typedef struct {
    const cb_tokenizer *tok;
    int vocab;
    cb_con_list all;             /* normal tokens (not added or control ones) */
    cb_con_list loose;           /* ... that are not plain string text */
    cb_con_list unkeyed;         /* ... that are not ascii_plain */
    cb_con_list keyend;          /* ... of those, the ones whose first byte that is not
                                    ascii_plain is a quote: all that may fit in a free key
                                    no declared key matches (the rest never do) */
    int n_special;
    int32_t *special;            /* other tokens with bytes (added, control) */
    uint16_t *plain_chars;       /* characters of a plain-string token, 0: not plain */
    uint8_t *plain;              /* [vocab]: plain_chars != 0, the in-string mask where any length fits */
    int max_plain;               /* most characters of a plain-string token */
    uint8_t *ascii_plain;        /* printable ASCII but quote and backslash: free key text */
    uint16_t *key_len;           /* [vocab]: bytes of an ascii_plain token, 0 for the others */
    int max_key_len;             /* longest ascii_plain token, in bytes */
    uint8_t *allowed;            /* [vocab]: the mask of one step */
    int32_t *allowed_ids;        /* its tokens, ascending */
    int n_allowed;
    cb_con_state *stack;         /* [CB_CON_TOKEN_BYTES + 2] states along the walk */
    int max_len;                 /* longest token, in bytes */
} cb_con_vocab;

int cb_con_vocab_init(cb_con_vocab *v, const cb_tokenizer *tok, int vocab); /* 0, -1 out of memory */
void cb_con_vocab_free(cb_con_vocab *v);
/* Bytes cb_con_vocab_init allocated and kept (the start-up memory line). */
size_t cb_con_vocab_bytes(const cb_con_vocab *v);

/* The next token under the constraint: drawn from the sampler's own
 * distribution (penalties, temperature, top-k, top-p, min-p) restricted to
 * the tokens that keep the output valid, renormalised; greedy: the best
 * valid token. When none of the sampler's candidates is valid, the same
 * sampling over the valid tokens alone (the others' logits -inf before the
 * filters). budget: tokens left, this one included:
 * while the output can still be completed in them, tokens that would make
 * that impossible are masked too. strip_space: the detokenizer drops the
 * first text token's leading space (SentencePiece). Returns the token (an
 * end token only when the output may end), or -1 when no token of the
 * vocabulary continues the output. Does not advance s. */
int32_t cb_con_sample(cb_con_vocab *v, const cb_con_schema *c, const cb_con_state *s, cb_sampler *smp,
                      const float *logits, const cb_sampling *p, const int32_t *history, int n_history,
                      cb_rng *rng, int budget, int strip_space);
/* The full mask cb_con_sample agrees with (its fast paths test tokens one
 * by one): v->allowed[id] for every token, their ids ascending in
 * v->allowed_ids; returns how many. budget and strip_space as there. */
int cb_con_mask(cb_con_vocab *v, const cb_con_schema *c, const cb_con_state *s, int budget, int strip_space);
/* How many draws cb_con_sample tries from the sampler's own candidates (n of
 * them, all: the whole vocabulary) before it builds the mask. */
int cb_con_draw_tries(const cb_con_schema *c, const cb_con_state *s, int n, int all);
/* Advances s by token id (its bytes; the first text token's leading space
 * dropped when strip_space). 1, or 0 if it does not fit (s unchanged). */
int cb_con_advance(cb_con_vocab *v, const cb_con_schema *c, cb_con_state *s, int32_t id, int strip_space);

#endif
