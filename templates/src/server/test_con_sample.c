/* cb_con_sample's fast paths against the full mask (tests/test_constrain_c.py
 * builds it over a real vocabulary, Qwen3's 151,669 tokens):
 *   - the full mask itself: every normal token is in it exactly when its
 *     bytes feed the matcher and leave the output completable in budget;
 *   - greedy: the token cb_con_sample picks is the best token of the full
 *     mask (the sampler's order: penalised logit, ties to the lower id);
 *   - sampled: cb_con_sample makes the same choice, from the same random
 *     numbers, as a plain rejection sampler over the full mask (draw from
 *     the sampler's distribution, keep a valid draw, else one draw from the
 *     mask), whose law is the renormalised masked distribution: checked by
 *     a chi-square test against the exact probabilities.
 * Random walks through several schemas, random logits (spread, peaked,
 * tied, with -inf), random budgets, penalties and filters.
 *     test_con_sample TOKENIZER.cbt */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "constrain.h"
#include "engine.h"
#include "kernels/kernels.h"

/* engine.c is not linked: its argmax, the same kernel. */
int32_t cb_argmax(const float *logits, int n) {
    int32_t best = 0;
    cb_topk_f32(logits, n, 1, &best);
    return best;
}

static int passed, failed;
#define CHECK(cond, ...)                                \
    do {                                                \
        if (cond) passed++;                             \
        else {                                          \
            if (failed++ < 20) {                        \
                printf("FAIL %s:%d: ", __FILE__, __LINE__); \
                printf(__VA_ARGS__);                    \
                printf("\n");                           \
            }                                           \
        }                                               \
    } while (0)

static uint64_t rs = 0x9E3779B97F4A7C15ull;
static uint64_t rnd64(void) {
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return rs;
}
static unsigned rnd(unsigned n) { return (unsigned)(rnd64() % n); }
static float unif(void) { return (float)(rnd64() >> 40) / 16777216.0f; }

static const char *SCHEMAS[] = {
    /* the benchmark's person */
    "{\"type\":\"object\",\"additionalProperties\":false,\"required\":[\"name\",\"age\",\"tags\",\"address\"],"
    "\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":40},\"age\":{\"type\":\"integer\",\"minimum\":0},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":4},\"address\":{\"type\":\"object\","
    "\"additionalProperties\":false,\"required\":[\"city\"],\"properties\":{\"city\":{\"type\":\"string\"},"
    "\"zip\":{\"type\":\"string\"}}}}}",
    NULL, /* any JSON object */
    "{\"type\":\"object\",\"required\":[\"kind\",\"n\",\"when\"],\"properties\":{\"kind\":{\"enum\":[\"alpha\",\"beta\","
    "\"alphabet\",3,null]},\"n\":{\"type\":\"number\",\"minimum\":-2.5,\"exclusiveMaximum\":100},\"when\":{\"type\":"
    "\"string\",\"format\":\"date\"},\"id\":{\"type\":\"string\",\"format\":\"uuid\"},\"opt\":{\"anyOf\":[{\"type\":"
    "\"integer\"},{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"minItems\":1},{\"type\":\"string\","
    "\"minLength\":2,\"maxLength\":5}]}}}",
    "{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"k\\\"ey\":{\"type\":\"string\"}},"
    "\"additionalProperties\":{\"type\":\"integer\"}},\"maxItems\":3}",
};
static const char *PREFIX[] = {"", "", "", "<tool_call>\n{\"name\": \"f\", \"arguments\": "};
static const char *SUFFIX[] = {"", "", "", "}\n</tool_call>"};

static cb_json_tok toks[4096];
static cb_con_schema schema;
static cb_con_vocab voc;
static cb_sampler smp;
static cb_tokenizer tok;
static float *logits, *weights;
static uint8_t *mask;
static int V;

/* Random logits: spread, peaked on a few tokens, few levels (ties), some -inf. */
static void make_logits(int kind) {
    for (int i = 0; i < V; i++) {
        float x = unif() * 20.0f - 10.0f;
        if (kind == 1) x = unif() < 0.002f ? 10.0f + unif() * 5.0f : -20.0f + unif();
        else if (kind == 2) x = (float)rnd(4);
        if (kind == 3 && rnd(3) == 0) x = -INFINITY;
        logits[i] = x;
    }
}

/* A rejection sampler written plainly over the full mask: what
 * cb_con_sample computes without the mask where it can. */
static int32_t reference_sample(const cb_con_state *s, const cb_sampling *p, const int32_t *hist, int n_hist,
                                cb_rng *rng, int budget) {
    int n = cb_con_mask(&voc, &schema, s, budget, 0);
    if (!n) return -1;
    memcpy(mask, voc.allowed, (size_t)V);
    cb_candidates cand;
    cb_sample_candidates(&smp, logits, p, hist, n_hist, &cand);
    if (cand.n == 0) { /* greedy: the best masked token */
        int32_t best = -1;
        for (int i = 0; i < V; i++)
            if (mask[i] && (best < 0 || cb_ranks_before(smp.work[i], i, smp.work[best], best))) best = i;
        return best;
    }
    const int tries = cb_con_draw_tries(&schema, s, cand.n, cand.all);
    for (int i = 0; i < tries; i++) {
        int32_t t = cb_sample_draw(&smp, &cand, rng, NULL);
        if (t >= 0 && mask[t]) return t;
    }
    int32_t t = cb_sample_draw(&smp, &cand, rng, mask);
    if (t >= 0) return t;
    return cb_sample_masked(&smp, logits, p, hist, n_hist, rng, mask);
}

/* The mask against token-by-token feeding, normal tokens: the tokens that
 * feed and leave the output completable in the budget's bytes (budget - 1
 * after this token; no limit where the budget is already short, or where
 * nothing but an end or added token would be left). */
static void check_mask(const cb_con_state *s, int budget) {
    static uint8_t in_budget[1 << 18], fed[1 << 18];
    cb_con_mask(&voc, &schema, s, budget, 0);
    const int left = budget <= 0 || cb_con_min_bytes(&schema, s) > (uint32_t)budget ? -1 : budget - 1;
    int any_in = 0, any_allowed = 0;
    for (int id = 0; id < V; id++) {
        in_budget[id] = fed[id] = 0;
        if (tok.attr[id] != CB_TOKA_NORMAL && tok.attr[id] != CB_TOKA_BYTE) continue;
        char b[512];
        size_t n = cb_token_bytes(&tok, id, b, sizeof b);
        if (!n || n > CB_CON_TOKEN_BYTES) continue;
        cb_con_state t = *s;
        fed[id] = (uint8_t)cb_con_feed(&schema, &t, b, n);
        in_budget[id] = fed[id] && (left < 0 || cb_con_min_bytes(&schema, &t) <= (uint32_t)left);
        any_in |= in_budget[id];
        any_allowed |= voc.allowed[id];
    }
    /* no normal token in the budget: the mask was the budget's (end or added
     * tokens only) or, that being empty, the one without it */
    const uint8_t *want = any_in || !any_allowed ? in_budget : fed;
    int bad = 0;
    for (int id = 0; id < V && !bad; id++) {
        if (tok.attr[id] != CB_TOKA_NORMAL && tok.attr[id] != CB_TOKA_BYTE) continue;
        if (want[id] != voc.allowed[id]) {
            bad = 1;
            CHECK(0, "token %d: mask %d, feeding %d (budget %d)", id, voc.allowed[id], want[id], budget);
        }
    }
    if (!bad) passed++;
}

static int walk_schema(int which) {
    int root = -1;
    const char *json = SCHEMAS[which];
    if (json) {
        if (cb_json_parse(json, strlen(json), toks, 4096, NULL) < 0) return printf("bad test JSON %d\n", which), 1;
        root = 0;
    }
    char err[512];
    if (cb_con_compile(&schema, PREFIX[which], strlen(PREFIX[which]), json, toks, root, SUFFIX[which],
                       strlen(SUFFIX[which]), err, sizeof err))
        return printf("schema %d: %s\n", which, err), 1;
    int32_t hist[256];
    for (int w = 0; w < 6; w++) {
        cb_con_state s;
        cb_con_start(&schema, &s);
        const int max_tokens = 20 + (int)rnd(80);
        for (int i = 0; i < max_tokens && !cb_con_complete(&s); i++) {
            const int budget = rnd(4) == 0 ? 1 + (int)rnd(6) : max_tokens - i;
            make_logits((int)rnd(4));
            cb_sampling p;
            memset(&p, 0, sizeof p);
            const int mode = (int)rnd(5);
            p.temperature = mode == 0 ? 0.0f : 0.5f + unif();
            if (mode == 2) p.top_k = 1 + (int)rnd(100);
            if (mode == 3) p.top_p = 0.5f + 0.5f * unif();
            else p.top_p = 1.0f;
            if (mode == 4) p.min_p = 0.05f * unif();
            if (rnd(3) == 0) p.presence_penalty = 1.0f, p.frequency_penalty = 0.5f;
            cb_rng r1, r2;
            cb_rng_seed(&r1, rnd64());
            r2 = r1;
            int32_t got = cb_con_sample(&voc, &schema, &s, &smp, logits, &p, hist, i, &r1, budget, 0);
            int32_t want = reference_sample(&s, &p, hist, i, &r2, budget);
            CHECK(got == want, "schema %d walk %d step %d mode %d: fast %d, full mask %d", which, w, i, mode, got, want);
            CHECK(!memcmp(&r1, &r2, sizeof r1), "schema %d step %d: a different number of random draws", which, i);
            if (w == 0 && i % 8 == 0) check_mask(&s, budget);
            if (got < 0) break;
            if (cb_is_end_token(&tok, got)) break;
            hist[i] = got;
            CHECK(cb_con_advance(&voc, &schema, &s, got, 0), "schema %d: the chosen token %d does not advance", which, got);
        }
    }
    return 0;
}

/* Free keys (additionalProperties), where the mask walks only the tokens
 * that may close the key once no declared key matches it: the mask against
 * feeding every token, at random key texts and lengths (near the 256 bytes
 * a key may have too, where long tokens stop fitting), budgets, and with a
 * declared key (one with a quote in it) matching or not. */
static void check_free_keys(void) {
    static const char *schemas[] = {
        NULL,
        "{\"type\":\"object\",\"properties\":{\"k\\\"ey\":{\"type\":\"string\"},\"ab\":{\"type\":\"integer\"}},"
        "\"additionalProperties\":{\"type\":\"integer\"}}",
    };
    static const char *starts[] = {"{\"", "{\"a\":1,\"", "{\"k", "{\"k\\", "{\"a", "{\"x"};
    const int before = failed;
    int states = 0;
    for (int k = 0; k < 2; k++) {
        int root = -1;
        if (schemas[k]) {
            if (cb_json_parse(schemas[k], strlen(schemas[k]), toks, 4096, NULL) < 0) {
                CHECK(0, "bad test JSON (free keys %d)", k);
                return;
            }
            root = 0;
        }
        char err[512];
        if (cb_con_compile(&schema, "", 0, schemas[k], toks, root, "", 0, err, sizeof err)) {
            CHECK(0, "free keys %d: %s", k, err);
            return;
        }
        for (int w = 0; w < 16; w++) {
            const char *start = starts[w < 6 ? w : (int)rnd(6)]; /* each alone first */
            char text[300];
            size_t n = strlen(start);
            memcpy(text, start, n);
            const int len = w < 6 ? 0 : w % 3 == 0 ? 248 + (int)rnd(9) : (int)rnd(256);
            for (int i = 0; i < len; i++) { /* printable ASCII but quote and backslash: the key stays open */
                int b = ' ' + (int)rnd(95);
                text[n++] = (char)(b == '"' || b == '\\' ? 'q' : b);
            }
            cb_con_state s;
            cb_con_start(&schema, &s);
            if (!cb_con_feed(&schema, &s, text, n)) continue; /* a quote or backslash closed or broke it */
            check_mask(&s, w >= 6 && rnd(3) == 0 ? 2 + (int)rnd(8) : 0);
            states++;
        }
    }
    printf("free keys: %d states, %d failed\n", states, failed - before);
    CHECK(states >= 12, "free keys: only %d states reached", states);
}

/* The law of the sampled choice: many draws at fixed states and logits
 * against the renormalised masked weights (chi-square over the tokens
 * expected at least 10 times, the rest pooled). */
static void check_law(void) {
    if (cb_con_compile(&schema, "", 0, NULL, toks, -1, "", 0, (char[256]){0}, 256)) return;
    cb_con_state states[3];
    cb_con_start(&schema, &states[0]);               /* '{' only */
    states[1] = states[0];
    cb_con_feed(&schema, &states[1], "{\"a\":1", 6); /* ',' or '}', or more digits */
    states[2] = states[0];
    cb_con_feed(&schema, &states[2], "{\"a\":\"x", 7); /* string text */
    static double expect[1 << 18];
    static int count[1 << 18];
    for (int k = 0; k < 3; k++) {
        /* a peaked distribution: valid tokens hold about half the mass */
        for (int i = 0; i < V; i++) logits[i] = -30.0f;
        cb_con_mask(&voc, &schema, &states[k], 0, 0);
        memcpy(mask, voc.allowed, (size_t)V);
        int placed = 0;
        for (int i = 0; i < V && placed < 40; i++)
            if (mask[(i * 7919) % V]) logits[(i * 7919) % V] = (float)(placed++ % 5);
        for (int i = 0; i < 40; i++) logits[rnd((unsigned)V)] = (float)rnd(5);
        cb_sampling p;
        memset(&p, 0, sizeof p);
        p.temperature = 1.0f, p.top_p = 1.0f;
        cb_candidates cand;
        cb_sample_candidates(&smp, logits, &p, NULL, 0, &cand);
        double total = 0.0;
        for (int i = 0; i < V; i++) total += mask[i] ? smp.work[i] : 0.0;
        for (int i = 0; i < V; i++) expect[i] = mask[i] ? smp.work[i] / total : 0.0, count[i] = 0;
        const int N = 3000;
        cb_rng r;
        cb_rng_seed(&r, 1234 + (uint64_t)k);
        int invalid = 0;
        for (int d = 0; d < N; d++) {
            int32_t t = cb_con_sample(&voc, &schema, &states[k], &smp, logits, &p, NULL, 0, &r, 0, 0);
            if (t < 0 || !mask[t]) invalid++;
            else count[t]++;
        }
        CHECK(!invalid, "state %d: %d draws outside the mask", k, invalid);
        double chi = 0.0, rest_e = 0.0, rest_c = 0.0;
        int bins = 0;
        for (int i = 0; i < V; i++) {
            const double e = expect[i] * N;
            if (e >= 10.0) chi += (count[i] - e) * (count[i] - e) / e, bins++;
            else rest_e += e, rest_c += count[i];
        }
        if (rest_e > 0) chi += (rest_c - rest_e) * (rest_c - rest_e) / rest_e, bins++;
        /* chi-square with bins - 1 degrees of freedom: mean bins - 1, sd
         * sqrt(2 (bins - 1)); 6 sd is far beyond chance, a wrong law (say
         * the unmasked one, or a bias to the first try) lands far above */
        const double df = bins - 1, limit = df + 6.0 * sqrt(2.0 * df);
        printf("law state %d: %d bins, chi-square %.1f (limit %.1f)\n", k, bins, chi, limit);
        CHECK(bins >= 3 && chi < limit, "state %d: chi-square %.1f over %d bins", k, chi, bins);
    }
}

/* Repeated whole-vocabulary draws from one step's candidates (the later
 * ones start from the running sum's marks the earlier ones left) against a
 * plain running sum from the first weight, from the same random numbers:
 * the same token every time, the numbers falling before, inside and past
 * the part already marked, at random. */
static void check_repeat_draws(void) {
    int same = 0, draws = 0;
    for (int k = 0; k < 4; k++) {
        make_logits(k);
        cb_sampling p;
        memset(&p, 0, sizeof p);
        p.temperature = k == 2 ? 0.5f : 1.0f, p.top_p = 1.0f;
        cb_candidates cand;
        cb_sample_candidates(&smp, logits, &p, NULL, 0, &cand);
        CHECK(cand.all, "repeat draws %d: not a whole-vocabulary draw", k);
        cb_rng a, b;
        cb_rng_seed(&a, 1000 + (uint64_t)k);
        b = a;
        for (int d = 0; d < 300; d++) {
            const int32_t got = cb_sample_draw(&smp, &cand, &a, NULL);
            const double u = cb_rng_uniform(&b) * cand.total;
            double acc = 0.0;
            int32_t want = V - 1;
            for (int i = 0; i < V; i++) {
                acc += smp.work[i];
                if (acc > u) {
                    want = i;
                    break;
                }
            }
            same += got == want, draws++;
        }
    }
    printf("repeat draws: %d of %d the plain running sum's token\n", same, draws);
    CHECK(same == draws, "repeat draws: %d of %d differ", draws - same, draws);
}

int main(int argc, char **argv) {
    if (argc < 2) return printf("usage: test_con_sample TOKENIZER.cbt\n"), 2;
    char err[512];
    if (cb_tokenizer_load(&tok, argv[1], err, sizeof err)) return printf("%s\n", err), 2;
    V = (int)tok.n_tokens;
    logits = malloc(sizeof *logits * (size_t)V);
    weights = malloc(sizeof *weights * (size_t)V);
    mask = malloc((size_t)V);
    if (!logits || !weights || !mask || cb_sampler_init(&smp, V) || cb_con_vocab_init(&voc, &tok, V))
        return printf("out of memory\n"), 2;
    for (int k = 0; k < (int)(sizeof SCHEMAS / sizeof *SCHEMAS); k++) {
        if (walk_schema(k)) return 2;
        printf("schema %d: %d passed, %d failed\n", k, passed, failed);
        fflush(stdout);
    }
    check_free_keys();
    check_repeat_draws();
    check_law();
    printf("%d passed, %d failed\n", passed, failed);
    cb_con_vocab_free(&voc);
    cb_sampler_free(&smp);
    cb_tokenizer_close(&tok);
    free(logits), free(weights), free(mask);
    return failed ? 1 : 0;
}
