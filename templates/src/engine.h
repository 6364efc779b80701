/* Public API of the Colibri inference engine: what the server, the Cython
 * binding and the tests use. Everything the engine needs is allocated by
 * cb_engine_open(); no call below allocates memory. */
#ifndef CB_ENGINE_H
#define CB_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "dims.h"
#include "tokenizer.h"

typedef struct cb_engine cb_engine;

/* One token to run through the model: which slot's KV cache it belongs to,
 * its position in that slot, and whether its logits are wanted. Tokens of one
 * slot must be given in position order; a batch may mix slots. rope_len
 * matters only to dynamic NTK RoPE: the token is rotated for the sequence
 * length max(rope_len, pos + 1); a request gives its prompt length (0: pos + 1),
 * as transformers' one call over the prompt, then one call a new token. */
typedef struct {
    int32_t token;
    int32_t slot;
    int32_t pos;
    int32_t want_logits;
    int32_t rope_len;
    /* f16-llama only: the tokens llama.cpp's server would run this token's
     * attention with (its micro-batch, cb_llama_ubatch; 0 or 1: one token).
     * From CB_LLAMA_TILED_MIN its CPU flash attention goes a tiled float32
     * way, which the plain f16 cache's numbers follow; below it (decode, a
     * short prompt) the float16 accumulation F16_LLAMA copies. */
    int32_t llama_ubatch;
} cb_batch_item;

/* llama-server's micro-batch (-ub, default 512) and the query rows from
 * which ggml's CPU flash attention tiles (GGML_FA_TILE_Q) in llama.cpp
 * 0.3.36. */
#define CB_LLAMA_UBATCH 512
#define CB_LLAMA_TILED_MIN 64
/* The size of the micro-batch holding token offset of a prompt of n tokens
 * run from its first: n cut into CB_LLAMA_UBATCH from the start. */
static inline int32_t cb_llama_ubatch(int32_t offset, int32_t n) {
    const int32_t first = offset / CB_LLAMA_UBATCH * CB_LLAMA_UBATCH;
    return n - first < CB_LLAMA_UBATCH ? n - first : CB_LLAMA_UBATCH;
}

/* What the KV cache holds: float32 (transformers' numbers) or float16 (half
 * the memory and half the bytes each attention step reads). AUTO: float16,
 * but float32 for float32 weights, whose parity bound with transformers
 * (1e-4 relative, docs/models.md) float16 keys and values break (2.2e-4 to
 * 9.1e-4 on the tiny_moe references) where reduced-precision weights' bounds
 * (1e-2, or greedy agreement) hold with them. */
/* F16_LLAMA: a float16 cache attended as llama.cpp's CPU flash attention
 * does (the query rounded to float16, V summed in a float16 accumulator in
 * position order: attn_split.c) where it does so (a token's llama_ubatch
 * under CB_LLAMA_TILED_MIN), and GELU through float16 as ggml's table gives
 * it (moe.c), for llama.cpp's answers on its GGUF files (docs/models.md
 * has what it costs). A model config's kv_cache
 * (a GGUF conversion writes f16-llama) is what AUTO takes when it names
 * one; MODEL_OR_F32 (the Python Engine's default) takes it too, else f32. */
enum cb_kv_type { CB_KV_F32 = 0, CB_KV_F16 = 1, CB_KV_AUTO = 2, CB_KV_F16_LLAMA = 3, CB_KV_MODEL_OR_F32 = 4 };

/* Opens the model folder: reads model-config.json, maps (does not read) the
 * weights file it names, refuses a header whose shape differs from the
 * config's, and allocates every buffer. model_dir NULL: the model the
 * running executable carries (embedded.h), its weights mapped from the
 * executable. n_threads <= 0 means one per online CPU.
 * n_slots <= 0 means the compiled-in number of slots. On failure returns NULL
 * and writes a message naming the file and the problem into err. */
cb_engine *cb_engine_open(const char *model_dir, int n_threads, int n_slots, enum cb_kv_type kv,
                          char *err, size_t err_len);
void cb_engine_close(cb_engine *e);

const cb_dims *cb_engine_dims(const cb_engine *e);
/* Bytes of the KV cache of every slot (reserved at open; pages are touched
 * as positions fill). */
size_t cb_engine_kv_bytes(const cb_engine *e);
/* "f16", "f16-llama" or "f32": what the KV cache holds and how it is attended (CB_KV_AUTO resolved). */
const char *cb_engine_kv_name(const cb_engine *e);
int cb_engine_n_slots(const cb_engine *e);
/* 1 when a token at pos in slot finds every earlier position it reads in
 * the cache: always, but where sliding-window layers keep a ring of the
 * last positions written, which a slot taken back to an earlier position
 * may have overwritten (cb_engine_forward refuses such a token). */
int cb_engine_slot_holds(const cb_engine *e, int slot, int pos);

/* The RAM a running engine needs, in bytes (toolkit/memory.py computes the
 * same from the weights file, for build-info.json). Weights are mapped from
 * the file: clean pages the OS may drop and read again, so a machine with
 * less than `needs` still runs, reading experts from disk as tokens route
 * to them; below `least` a token's own weights no longer fit. */
typedef struct {
    size_t dense;        /* the weights file up to the experts: every other tensor (the embedding table whole) */
    size_t experts;      /* every routed expert's block: over many tokens all of them are touched */
    size_t least_weights; /* what one token keeps resident: dense less the embedding rows it does not read,
                            and the working set */
    size_t working_set;  /* top_k expert blocks of each MoE layer: one token's share at batch 1 */
    size_t kv_per_slot;  /* the KV cache of one slot: kv_full_per_slot + kv_sliding_per_slot */
    size_t kv_full_per_slot;    /* its full-attention layers' part (the whole context) */
    size_t kv_sliding_per_slot; /* its sliding-window layers' part (a ring: kv_sliding_rows positions) */
    unsigned kv_sliding_rows, kv_window; /* positions a sliding layer keeps, and its window; 0 if none */
    size_t arena;        /* activations, logits, scratch, RoPE tables: the arena less the KV cache */
    int slots;
    size_t needs;        /* dense + experts + slots x kv_per_slot + arena */
    size_t least;        /* least_weights + 1 x kv_per_slot + arena: experts paged from disk, one slot */
} cb_memory_budget;
void cb_engine_memory(const cb_engine *e, cb_memory_budget *m);

/* Most tokens one cb_engine_forward() call accepts. */
int cb_engine_max_batch(const cb_engine *e);
/* Most items of one batch that may want logits (want_logits): the slots,
 * and at least 64 (or max_batch if smaller). */
int cb_engine_logit_rows(const cb_engine *e);
/* The model's name from the weights header (model-config.json "name"). */
const char *cb_engine_model_name(const cb_engine *e);

const cb_tokenizer *cb_engine_tokenizer(const cb_engine *e);

/* Runs the batch. Returns
 *   0  every item's numbers stayed finite;
 *  -1  nothing ran: a message in err (bad slot, position past the context,
 *      batch too large or wanting more logits than cb_engine_logit_rows,
 *      token out of the vocabulary, a position a sliding
 *      layer reads no longer cached: cb_engine_slot_holds);
 *  >0  the batch ran, but that many items met a NaN or inf (a broken weight,
 *      an overflow): err describes the first; cb_engine_item_fault() tells
 *      which. Items never mix, so the others' results are exact (the same
 *      bits as without the faulty ones); a faulty item's logits and the KV
 *      cache it wrote are garbage: fail its request (its slot's later
 *      positions read that cache). */
int cb_engine_forward(cb_engine *e, const cb_batch_item *items, int n_items,
                      char *err, size_t err_len);
/* For the item-th token of the last batch: -1 when its numbers were finite,
 * else where they first were not: a layer 0..n_layers-1 (its residual stream
 * after that layer), or n_layers (its logits). */
int cb_engine_item_fault(const cb_engine *e, int item);
/* 1 when positions 0..n-1 of slot's cache hold keys rotated as a request
 * with rope_len (its prompt length) would rotate them, so a prefix cache
 * may reuse them: always, but for dynamic NTK RoPE, where they must all have
 * the plain rotation and rope_len must not reach past max_position_embeddings. */
int cb_engine_rope_reusable(const cb_engine *e, int slot, int n, int rope_len);
/* A fault as words: "at layer 3", "in the logits". */
void cb_engine_fault_text(const cb_engine *e, int fault, char *buf, size_t len);
/* Logits [vocab] of the row-th item of the last batch that had want_logits
 * set (rows counted in batch order). Valid until the next forward. */
const float *cb_engine_logits(const cb_engine *e, int row);
/* The experts the item-th token of the last batch was routed to in a layer,
 * top_k entries, highest router weight first. */
const int32_t *cb_engine_routing(const cb_engine *e, int item, int layer);

/* Greedy choice: the highest logit, ties to the lowest token id, NaN below
 * everything: always an id in 0..n-1 (n >= 1). */
int32_t cb_argmax(const float *logits, int n);

#endif
