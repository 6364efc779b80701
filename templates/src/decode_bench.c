/* colibri-decode-bench: decode speed against the memory bandwidth of the
 * same moment. A shared machine's bandwidth can change within seconds (here
 * ~30 <-> ~55 GB/s), so a bandwidth measured before or after a decode run
 * may belong to another state than the run. Here each batch-1 decode step
 * is paired with a streaming read of as many bytes as the step's weights,
 * right after it, through the engine's own thread pool (the same threads),
 * from a buffer of its own; the pairs' ratios then compare like with like.
 *
 *   colibri-decode-bench MODEL_DIR [--pairs N] [--threads T] [--batch B | --phases [--prompt P] [--chunk C]]
 *
 * --phases: no reads; the median time (of --pairs repeats) of each phase the
 * specialised build could change, one line (colibri-build bench runs it in
 * the specialised and the generic build alternately): see phases_bench.
 *
 * --batch B: each step decodes B sequences at once (B slots, one token
 * each), and its paired read is as many bytes as that step's bound: the
 * dense weights once, the distinct experts the B tokens route to (each
 * once), and the KV cache the B tokens' attention reads. decode / read is
 * then the batch's rate against the rate its bytes allow.
 *
 * Prints one line: the weight bytes a token reads, decode tok/s and GB/s,
 * the read's GB/s (median, P10, P90), the median (P10, P90) of the pairs'
 * decode / read ratios, and the pages both go through (2 MiB where the
 * weights are mapped so). Built on demand (ninja colibri-decode-bench). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"
#include "router.h"
#include "platform/cpu_features.h"
#include "platform/platform.h"

#define READ_TASK_BYTES ((size_t)1 << 20)
#define MIN_READ_BYTES ((size_t)256 << 20) /* far past any cache, even for a tiny model */
#define WARMUP 64

typedef struct {
    const uint64_t *base;
    uint64_t sums[64]; /* one per worker: the reads' results go somewhere */
} read_job;

/* 32 bytes, in the widest registers the target has (GCC / Clang vectors). */
typedef uint64_t u64x4 __attribute__((vector_size(32)));

/* One 1 MiB task of the read: four independent sums of 32-byte loads, one
 * sequential stream (membw.c's sum4, which scalar loads fall short of). */
static void read_task(void *p, int task, int worker) {
    read_job *j = p;
    const u64x4 *q = (const u64x4 *)(j->base + (size_t)task * (READ_TASK_BYTES / 8));
    u64x4 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    for (size_t i = 0; i < READ_TASK_BYTES / 32; i += 4) {
        s0 += q[i], s1 += q[i + 1], s2 += q[i + 2], s3 += q[i + 3];
    }
    const u64x4 s = s0 ^ s1 ^ s2 ^ s3;
    j->sums[worker & 63] += s[0] ^ s[1] ^ s[2] ^ s[3];
}

static int by_value(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The q-th percentile (nearest rank) of n values, sorted in place. */
static double percentile(double *v, int n, int q) {
    qsort(v, (size_t)n, sizeof *v, by_value);
    int at = (q * (n - 1) + 50) / 100;
    return v[at];
}

#define MAX_BENCH_BATCH 64

/* The bytes one decode step of n tokens reads at best: the dense weights
 * once, each distinct expert a token routes to once (e->routing of the step
 * just run), and the KV cache rows the tokens' attention reads. */
static size_t step_bound_bytes(const cb_engine *e, const cb_batch_item *items, int n, size_t dense,
                               size_t kv_per_position, int *distinct) {
    const cb_dims *d = CB_DIMS(e);
    const int L = (int)d->n_layers, k = (int)d->top_k, E = (int)d->n_experts;
    size_t bytes = dense;
    *distinct = 0;
    for (int l = 0; l < L; l++) {
        const cb_layer_weights *lw = &e->w.layers[l];
        if (!lw->is_moe) continue;
        uint64_t seen[4] = {0}; /* up to 256 experts */
        for (int i = 0; i < n; i++)
            for (int j = 0; j < k; j++) {
                const int x = e->routing[((size_t)i * L + l) * k + j];
                if (x < 0 || x >= E || x >= 256 || (seen[x / 64] >> (x % 64) & 1)) continue;
                seen[x / 64] |= (uint64_t)1 << (x % 64);
                bytes += lw->experts[x].block_bytes;
                ++*distinct;
            }
    }
    for (int i = 0; i < n; i++) bytes += (size_t)(items[i].pos + 1) * kv_per_position;
    return bytes;
}

/* --batch B: B slots decoding together, each step paired with a read of
 * the step's bound bytes. */
static int batch_bench(const char *model, int pairs, int threads, int batch) {
    char err[512];
    cb_engine *e = cb_engine_open(model, threads, batch, CB_KV_F32, err, sizeof err);
    if (!e) {
        fprintf(stderr, "colibri-decode-bench: %s\n", err);
        return 1;
    }
    const cb_dims *d = CB_DIMS(e);
    if ((int)d->n_experts > 256) {
        fprintf(stderr, "colibri-decode-bench: --batch counts up to 256 experts, the model has %d\n",
                (int)d->n_experts);
        return 1;
    }
    cb_memory_budget m;
    cb_engine_memory(e, &m);
    /* Experts of a token at batch 1: its top-k blocks; the rest is read once a step. */
    const size_t active = cb_weights_active_bytes(&e->w), dense = active - m.working_set;
    const size_t kv_per_position = m.kv_sliding_rows ? 0 : m.kv_full_per_slot / (size_t)d->context_len;
    size_t read_cap = dense + m.experts + (size_t)batch * m.kv_per_slot;
    read_cap = read_cap > MIN_READ_BYTES ? read_cap : MIN_READ_BYTES;
    read_cap = (read_cap + READ_TASK_BYTES - 1) / READ_TASK_BYTES * READ_TASK_BYTES;
    uint64_t *buffer = cb_aligned_alloc(read_cap);
    double *read_gbs = malloc(sizeof(double) * (size_t)pairs), *ratio = malloc(sizeof(double) * (size_t)pairs);
    double *bound_mb = malloc(sizeof(double) * (size_t)pairs), *experts = malloc(sizeof(double) * (size_t)pairs);
    if (!buffer || !read_gbs || !ratio || !bound_mb || !experts) {
        fprintf(stderr, "colibri-decode-bench: out of memory (a %zu MB read buffer)\n", read_cap >> 20);
        return 1;
    }
    const int huge_read = e->w.huge_pages && cb_map_advise_huge(buffer, read_cap) == 0;
    memset(buffer, 1, read_cap);
    const int max_pos = (int)d->context_len - 1;
    cb_batch_item items[MAX_BENCH_BATCH];
    int token[MAX_BENCH_BATCH];
    for (int b = 0; b < batch; b++) token[b] = (97 * b + 3) % (int)d->vocab;
    read_job job = {buffer, {0}};
    double decode_seconds = 0, step_bytes = 0;
    int pos = 0;
    for (int p = -WARMUP; p < pairs; p++, pos++) {
        if (pos > max_pos) pos = 0; /* the slots start again (their rings too: position 0 needs nothing) */
        for (int b = 0; b < batch; b++) items[b] = (cb_batch_item){.token = token[b], .slot = b, .pos = pos, .want_logits = 1};
        uint64_t start = cb_now_ns();
        if (cb_engine_forward(e, items, batch, err, sizeof err)) {
            fprintf(stderr, "colibri-decode-bench: %s\n", err);
            return 1;
        }
        const double step = (double)(cb_now_ns() - start) * 1e-9;
        for (int b = 0; b < batch; b++) token[b] = (token[b] * 31 + 7 + b) % (int)d->vocab;
        if (p < 0) continue;
        int distinct;
        const size_t bound = step_bound_bytes(e, items, batch, dense, kv_per_position, &distinct);
        const int tasks = (int)((bound + READ_TASK_BYTES - 1) / READ_TASK_BYTES);
        start = cb_now_ns();
        cb_threadpool_run(e->pool, read_task, &job, tasks);
        const double read = (double)(cb_now_ns() - start) * 1e-9;
        decode_seconds += step;
        step_bytes += (double)bound;
        read_gbs[p] = (double)tasks * READ_TASK_BYTES / read * 1e-9;
        ratio[p] = (double)bound / step * 1e-9 / read_gbs[p];
        bound_mb[p] = (double)bound / 1e6;
        experts[p] = distinct;
    }
    const double steps_s = pairs / decode_seconds;
    printf("decode-bench: batch %d, %d pairs, %d threads, %.0f MB bound a step (median; %.0f distinct experts): "
           "decode %.1f tok/s (%.1f GB/s of bound); read beside it %.1f GB/s (P10 %.1f, P90 %.1f); "
           "decode / read %.2f (P10 %.2f, P90 %.2f); pages %s\n",
           batch, pairs, cb_threadpool_size(e->pool), percentile(bound_mb, pairs, 50), percentile(experts, pairs, 50),
           steps_s * batch, step_bytes / decode_seconds * 1e-9, percentile(read_gbs, pairs, 50),
           percentile(read_gbs, pairs, 10), percentile(read_gbs, pairs, 90), percentile(ratio, pairs, 50),
           percentile(ratio, pairs, 10), percentile(ratio, pairs, 90), huge_read ? "2 MiB" : "4 KiB");
    cb_aligned_free(buffer);
    free(read_gbs), free(ratio), free(bound_mb), free(experts);
    cb_engine_close(e);
    return 0;
}

static double seconds_since(uint64_t start) { return (double)(cb_now_ns() - start) * 1e-9; }

/* --chunk: tokens a prompt step takes, when under the engine's batch (0: the
 * batch), so that two builds of other batches step alike (bench.py). */
static int prompt_chunk;

/* Prompt tokens [from, to) of slot in chunks of the engine's batch, the last
 * one's logits wanted. */
static int prompt_span(cb_engine *e, int slot, int from, int to, char *err, size_t err_len) {
    const cb_dims *d = CB_DIMS(e);
    const int step = prompt_chunk > 0 && prompt_chunk < e->max_batch ? prompt_chunk : e->max_batch;
    cb_batch_item *items = malloc(sizeof *items * (size_t)step);
    if (!items) return snprintf(err, err_len, "out of memory"), -1;
    for (int at = from; at < to; at += step) {
        const int n = to - at < step ? to - at : step;
        for (int i = 0; i < n; i++) /* one prompt from..to-1, as llama-server would run it (f16-llama) */
            items[i] = (cb_batch_item){(7 * (at + i) + 1) % (int)d->vocab, slot, at + i, at + i == to - 1, 0,
                                       cb_llama_ubatch(at + i - from, to - from)};
        if (cb_engine_forward(e, items, n, err, err_len)) return free(items), -1;
    }
    free(items);
    return 0;
}

/* --phases: each phase timed --pairs times, the median printed:
 *   routing: the router's softmax / top-k / weights of one token's logits
 *     (cb_route or cb_route_grouped), per call, over 4096 rows of logits;
 *   attention: every layer's attention (norm, q/k/v, the heads over P
 *     cached positions, o) of one token, cb_attention_layer alone;
 *   decode-1 / decode-8: one forward step of 1 / 8 slots (at position 64,
 *     and slot 0 after its P);
 *   prefill: a P-token prompt (in chunks of the engine's batch, or --chunk).
 * P: --prompt (default 512), at most the context less 2 (the steps after it). */
static int phases_bench(const char *model, int reps, int threads, int prompt) {
    char err[512];
    cb_engine *e = cb_engine_open(model, threads, 8, CB_KV_AUTO, err, sizeof err);
    if (!e) {
        fprintf(stderr, "colibri-decode-bench: %s\n", err);
        return 1;
    }
    const cb_dims *d = CB_DIMS(e);
    const int E = (int)d->n_experts, k = (int)d->top_k, L = (int)d->n_layers;
    const int P = (int)d->context_len - 2 < prompt ? (int)d->context_len - 2 : prompt, D = P < 64 ? P / 2 : 64;
    enum { ROWS = 4096, ROUTE_RUN = 64 };
    float *logits = malloc(sizeof(float) * (size_t)E * ROWS), *work = malloc(sizeof(float) * (size_t)E);
    double *t[5];
    for (int i = 0; i < 5; i++) t[i] = malloc(sizeof(double) * (size_t)reps);
    int32_t ids[1024];
    float weights[1024];
    if (!logits || !work || !t[0] || !t[1] || !t[2] || !t[3] || !t[4]) {
        fprintf(stderr, "colibri-decode-bench: out of memory\n");
        return 1;
    }
    uint32_t seed = 12345;
    for (size_t i = 0; i < (size_t)E * ROWS; i++) {
        seed = seed * 1664525u + 1013904223u;
        logits[i] = (float)(seed >> 8) / (float)(1u << 24) * 8.0f - 4.0f;
    }
    const int grouped = d->router == CB_ROUTER_SIGMOID_TOPK_RENORM || d->router == CB_ROUTER_SIGMOID_TOPK ||
                        d->n_group > 1 || d->routed_scaling > 0.0f; /* as moe.c route_token */
    const int slots = e->n_slots < 8 ? e->n_slots : 8;
    double sink = 0;
    for (int b = 1; b < slots; b++)
        if (prompt_span(e, b, 0, D, err, sizeof err)) goto fail;
    for (int r = -1; r < reps; r++) { /* r = -1: untimed, pages and caches warm */
        uint64_t start = cb_now_ns();
        if (prompt_span(e, 0, 0, P, err, sizeof err)) goto fail;
        const double prefill = seconds_since(start);
        const cb_batch_item at_p = {.token = 3, .slot = 0, .pos = P, .want_logits = 1}; /* its rings and caches set, then its attention alone */
        if (cb_engine_forward(e, &at_p, 1, err, sizeof err)) goto fail;
        start = cb_now_ns();
        for (int l = 0; l < L; l++) {
            if (d->kv_lora_rank) cb_mla_layer(e, l, &at_p, 1);
            else cb_attention_layer(e, l, &at_p, 1);
        }
        const double attention = seconds_since(start);
        /* Routing in runs of ROUTE_RUN rows, the median run: a run is
         * microseconds, and one the scheduler interrupts says nothing. */
        double runs[ROWS / ROUTE_RUN];
        for (int run = 0; run < ROWS / ROUTE_RUN; run++) {
            start = cb_now_ns();
            for (int row = run * ROUTE_RUN; row < (run + 1) * ROUTE_RUN; row++) {
                memcpy(work, logits + (size_t)row * E, sizeof(float) * (size_t)E);
                if (grouped)
                    cb_route_grouped(work, E, k, (int)d->router, NULL, (int)d->n_group, (int)d->topk_group,
                                     d->routed_scaling, ids, weights);
                else cb_route(work, E, k, (int)d->router, ids, weights);
                sink += weights[0];
            }
            runs[run] = seconds_since(start) / ROUTE_RUN;
        }
        const double routing = percentile(runs, ROWS / ROUTE_RUN, 50);
        /* Slots 1.. at position D (their prompts below), slot 0 next after its own. */
        cb_batch_item items[8];
        for (int b = 0; b < slots; b++)
            items[b] = (cb_batch_item){.token = (5 + 11 * b) % (int)d->vocab, .slot = (b + 1) % slots,
                                        .pos = b + 1 < slots ? D : P + 1, .want_logits = 1};
        start = cb_now_ns();
        if (cb_engine_forward(e, items, 1, err, sizeof err)) goto fail;
        const double one = seconds_since(start);
        start = cb_now_ns();
        if (cb_engine_forward(e, items, slots, err, sizeof err)) goto fail;
        const double eight = seconds_since(start);
        if (r < 0) continue;
        t[0][r] = routing * 1e6, t[1][r] = attention * 1e3, t[2][r] = one * 1e3, t[3][r] = eight * 1e3;
        t[4][r] = prefill * 1e3;
    }
    printf("phases: %d repeats, %d threads, %d experts top-%d, head %d, %d positions: routing %.3f us, "
           "attention %.3f ms, decode-1 %.3f ms, decode-%d %.3f ms, prefill-%d %.3f ms (sink %g)\n",
           reps, cb_threadpool_size(e->pool), E, k, (int)d->head_dim, P, percentile(t[0], reps, 50),
           percentile(t[1], reps, 50), percentile(t[2], reps, 50), slots, percentile(t[3], reps, 50), P,
           percentile(t[4], reps, 50), sink > 0 ? 1.0 : 0.0);
    for (int i = 0; i < 5; i++) free(t[i]);
    free(logits), free(work);
    cb_engine_close(e);
    return 0;
fail:
    fprintf(stderr, "colibri-decode-bench: %s\n", err);
    return 1;
}

int main(int argc, char **argv) {
    cb_cpu_require("colibri-decode-bench");
    const char *model = NULL;
    int pairs = 256, threads = 2, batch = 1, phases = 0, phase_prompt = 512;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--pairs") && i + 1 < argc) pairs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc) batch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--phases")) phases = 1;
        else if (!strcmp(argv[i], "--prompt") && i + 1 < argc) phase_prompt = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--chunk") && i + 1 < argc) prompt_chunk = atoi(argv[++i]);
        else if (argv[i][0] != '-' && !model) model = argv[i];
        else {
            fprintf(stderr, "usage: colibri-decode-bench MODEL_DIR [--pairs N] [--threads T] [--batch B | --phases [--prompt P] [--chunk C]]\n");
            return 2;
        }
    }
    if (!model || pairs < 2 || batch < 1 || batch > MAX_BENCH_BATCH) {
        fprintf(stderr, "usage: colibri-decode-bench MODEL_DIR [--pairs N >= 2] [--threads T] [--batch 1..%d]\n",
                MAX_BENCH_BATCH);
        return 2;
    }
    if (phases) return phases_bench(model, pairs, threads, phase_prompt < 2 ? 2 : phase_prompt);
    if (batch > 1) return batch_bench(model, pairs, threads, batch);
    char err[512];
    cb_engine *e = cb_engine_open(model, threads, 1, CB_KV_AUTO, err, sizeof err); /* the server's default */
    if (!e) {
        fprintf(stderr, "colibri-decode-bench: %s\n", err);
        return 1;
    }
    const cb_dims *d = CB_DIMS(e);
    const size_t active = cb_weights_active_bytes(&e->w);
    size_t read_bytes = active > MIN_READ_BYTES ? active : MIN_READ_BYTES;
    read_bytes = (read_bytes + READ_TASK_BYTES - 1) / READ_TASK_BYTES * READ_TASK_BYTES;
    uint64_t *buffer = cb_aligned_alloc(read_bytes);
    double *read_gbs = malloc(sizeof(double) * (size_t)pairs), *ratio = malloc(sizeof(double) * (size_t)pairs);
    if (!buffer || !read_gbs || !ratio) {
        fprintf(stderr, "colibri-decode-bench: out of memory (a %zu MB read buffer)\n", read_bytes >> 20);
        return 1;
    }
    /* The read goes through pages of the weights' size: a 2 MiB-page read
     * streams faster than a 4 KiB-page one (here 31-35 against 26-27 GB/s),
     * and decode must be set against the read it could at best match. */
    const int huge_read = e->w.huge_pages && cb_map_advise_huge(buffer, read_bytes) == 0;
    memset(buffer, 1, read_bytes); /* its pages exist before the first read */

    /* A 16-token prompt, then WARMUP decode steps, unpaired: the first
     * steps map the experts' pages into this process (the file is in the
     * page cache; the page tables are new), seconds of faults for a large
     * model that say nothing about decode. Then decode on, paired. */
    cb_batch_item items[16];
    const int prompt = d->context_len > 32 + WARMUP ? 16 : 1;
    for (int i = 0; i < prompt; i++) items[i] = (cb_batch_item){.token = (7 * i) % (int)d->vocab, .slot = 0, .pos = i, .want_logits = i == prompt - 1};
    if (cb_engine_forward(e, items, prompt, err, sizeof err)) {
        fprintf(stderr, "colibri-decode-bench: %s\n", err);
        return 1;
    }
    read_job job = {buffer, {0}};
    int token = 3 % (int)d->vocab;
    double decode_seconds = 0;
    for (int p = -WARMUP; p < pairs; p++) {
        const cb_batch_item one = {.token = token, .slot = 0, .pos = prompt + (p + WARMUP) % ((int)d->context_len - prompt),
                                   .want_logits = 1};
        /* Back at the prompt's end after the whole context: the prompt again
         * (untimed), whose keys a sliding layer's ring no longer holds. */
        if (one.pos == prompt && p > -WARMUP && cb_engine_forward(e, items, prompt, err, sizeof err)) {
            fprintf(stderr, "colibri-decode-bench: %s\n", err);
            return 1;
        }
        uint64_t start = cb_now_ns();
        if (cb_engine_forward(e, &one, 1, err, sizeof err)) {
            fprintf(stderr, "colibri-decode-bench: %s\n", err);
            return 1;
        }
        const double step = (double)(cb_now_ns() - start) * 1e-9;
        token = (token * 31 + 7) % (int)d->vocab;
        if (p < 0) continue;
        start = cb_now_ns();
        cb_threadpool_run(e->pool, read_task, &job, (int)(read_bytes / READ_TASK_BYTES));
        const double read = (double)(cb_now_ns() - start) * 1e-9;
        decode_seconds += step;
        read_gbs[p] = (double)read_bytes / read * 1e-9;
        ratio[p] = (double)active / step * 1e-9 / read_gbs[p];
    }
    const double tok_s = pairs / decode_seconds;
    printf("decode-bench: %d pairs, %d threads, %zu bytes of weights a token: decode %.1f tok/s (%.1f GB/s); "
           "read beside it %.1f GB/s (P10 %.1f, P90 %.1f); decode / read %.2f (P10 %.2f, P90 %.2f); "
           "pages %s\n",
           pairs, cb_threadpool_size(e->pool), active, tok_s, tok_s * (double)active * 1e-9,
           percentile(read_gbs, pairs, 50), percentile(read_gbs, pairs, 10), percentile(read_gbs, pairs, 90),
           percentile(ratio, pairs, 50), percentile(ratio, pairs, 10), percentile(ratio, pairs, 90),
           huge_read ? "2 MiB" : "4 KiB");
    cb_aligned_free(buffer);
    free(read_gbs), free(ratio);
    cb_engine_close(e);
    return 0;
}
