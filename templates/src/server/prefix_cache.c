/* The prefix cache: a slot's KV cache outlives its request, and the next
 * request whose prompt begins with the tokens it holds (a conversation's
 * next turn: its previous prompt and answer) starts after them instead of
 * computing them again.
 *
 * Reuse is exact: a position's K and V rows, and every later number, are
 * the same bits whichever forward step computed them, a prompt chunk of any
 * length or a decode step (tests/test_prefix_engine.py), so an answer is
 * the same with the cache or without it. f16-llama attends a prompt token
 * by the micro-batch llama.cpp would run it in (engine.h), which depends on
 * the prompt's length, and a generated token as a decode step: there only
 * positions that the new prompt attends the same way are reused. The last
 * prompt token is always computed, as its logits give the first token.
 *
 * Which free slot a request takes: the one whose cache it continues (the
 * common prefix is all of the prompt the cache can give, or at least half
 * of what the slot holds), the longest such prefix first; without one, the least recently used slot, so a cached
 * conversation survives the longest (a slot never used counts as the least
 * recent, so new conversations fill empty slots first). A request that
 * shares only a short beginning (a system prompt) with a long cached
 * conversation is thus not steered onto it to save that much; it still takes
 * whatever common prefix the slot it gets holds. */
#include <string.h>

#include "app_internal.h"

/* Positions of slot s's cache that q may take: the common prefix, short of
 * q's last token; none when a sliding layer's ring no longer holds the
 * window that position n reads (the slot went on past n by more than the
 * ring: the engine would refuse to continue there), nor when the cached
 * keys' rotation is not the one q would give them (dynamic NTK RoPE: a
 * prompt or text past max_position_embeddings rotates with its length). */
static int tiled(int pos, int n_prompt) {
    return pos < n_prompt && cb_llama_ubatch(pos, n_prompt) >= CB_LLAMA_TILED_MIN;
}

static int common_prefix(const cb_app *a, int s, const cb_request *q) {
    const cb_slot *st = &a->slots[s];
    const int most = st->kv_len < q->n_prompt - 1 ? st->kv_len : q->n_prompt - 1;
    int n = 0;
    while (n < most && st->kv_tokens[n] == q->prompt[n] &&
           (!a->llama_attn || tiled(n, st->kv_prompt_len) == tiled(n, q->n_prompt)))
        n++;
    if (n > 0 && !cb_engine_rope_reusable(a->engine, s, n, q->n_prompt)) return 0;
    return n > 0 && !cb_engine_slot_holds(a->engine, s, n) ? 0 : n;
}

int cb_prefix_pick(const cb_app *a, const cb_request *q, int *reuse) {
    int best = -1, best_common = -1, lru = -1;
    *reuse = 0;
    for (int s = 0; s < a->n_slots; s++) {
        const cb_slot *st = &a->slots[s];
        if (st->req) continue;
        if (!a->prefix_cache) return s; /* the lowest free slot: slots never used stay out of RAM */
        if (lru < 0 || st->used_at < a->slots[lru].used_at) lru = s;
        const int n = common_prefix(a, s, q);
        /* A continuation (or the same prompt again); ties to the least
         * recently used. */
        if (n > 0 && (2 * n >= st->kv_len || n == q->n_prompt - 1) &&
            (n > best_common || (n == best_common && st->used_at < a->slots[best].used_at))) {
            best = s;
            best_common = n;
        }
    }
    if (best < 0) best = lru;
    if (best >= 0) *reuse = common_prefix(a, best, q);
    return best;
}

void cb_prefix_reuse(cb_app *a, int s, int reuse) {
    cb_slot *st = &a->slots[s];
    const int L = (int)a->dims->n_layers, E = (int)a->dims->n_experts, k = (int)a->dims->top_k;
    st->cached = reuse;
    st->n_fed = reuse;
    /* The answer's expert_activations count every prompt token's experts:
     * those of the reused positions were kept per position when they ran. */
    for (int p = 0; p < reuse; p++)
        for (int l = 0; l < L; l++)
            for (int j = 0; j < k; j++) {
                const int32_t x = st->trace_experts[((size_t)p * L + l) * k + j];
                if (x >= 0) st->expert_counts[(size_t)l * E + x]++;
            }
}

void cb_prefix_keep(cb_app *a, int s) {
    cb_slot *st = &a->slots[s];
    const cb_request *q = st->req;
    /* Positions 0..n_fed-1 hold the prompt, then the generated tokens fed
     * back (the last one sampled never was). */
    const int from_prompt = st->n_fed < q->n_prompt ? st->n_fed : q->n_prompt;
    memcpy(st->kv_tokens, q->prompt, sizeof(int32_t) * (size_t)from_prompt);
    memcpy(st->kv_tokens + from_prompt, st->generated, sizeof(int32_t) * (size_t)(st->n_fed - from_prompt));
    st->kv_len = a->prefix_cache ? st->n_fed : 0;
    st->kv_prompt_len = q->n_prompt;
}

void cb_prefix_forget(cb_app *a, int s) { a->slots[s].kv_len = 0; }
