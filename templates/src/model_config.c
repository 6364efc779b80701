#include "model_config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "server/json.h"

#define MAX_CONFIG_BYTES (16u << 20) /* configs are a few KiB; a bigger file is not one */

typedef struct {
    const char *json;
    const cb_json_tok *toks;
    const char *path;
    char *err;
    size_t err_len;
    int failed;
} reader;

/* Names of enum values, indexed by value (NULL: not a value). */
static const char *const ARCHS[] = {NULL, "mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "gemma4", "gpt_oss", "deepseek_v3",
                                    "glm4_moe"};
static const char *const BLOCKS[] = {"pre_norm", "gemma4"};
static const char *const FFN_ACTS[] = {"silu", "gelu_tanh", "swiglu_oai"};
static const char *const ROUTERS[] = {NULL, "softmax_topk_renorm", "softmax_topk", "topk_softmax",
                                      "sigmoid_topk_renorm", "sigmoid_topk"};
/* Indexed by enum cb_dtype; the x4 layouts are per tensor, never a model's. */
static const char *const DTYPES[] = {"f32",  "f16",  "bf16", "q8_0", "q4_0", NULL,     NULL,     NULL,    "q4_1", "q5_0",
                                     "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs", "mxfp4"};
_Static_assert(sizeof DTYPES / sizeof DTYPES[0] == CB_DTYPE_COUNT, "a name for every dtype id");
static const char *const QK_NORMS[] = {"none", "per_head", "whole"};
static const char *const TOKENIZERS[] = {"none", "bytes", "bpe", "spm"};
static const char *const KV_CACHES[] = {"f32", "f16", NULL, "f16-llama"}; /* enum cb_kv_type; AUTO is no name */
#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

static void fail(reader *r, const char *field, const char *what, int tok) {
    if (r->failed) return;
    r->failed = 1;
    if (tok < 0) {
        snprintf(r->err, r->err_len, "%s: %s '%s'", r->path, what, field);
        return;
    }
    const cb_json_tok *t = &r->toks[tok];
    const int quoted = t->type == CB_JSON_STRING;
    const int start = t->start - quoted, len = t->end - t->start + 2 * quoted;
    snprintf(r->err, r->err_len, "%s: field '%s': got %.*s%s, expected %s", r->path, field, len > 40 ? 40 : len,
             r->json + start, len > 40 ? "..." : "", what);
}

/* The value of key in object obj, or -1 (a failure too when required). */
static int member(reader *r, int obj, const char *key, const char *field, int required) {
    int v = obj < 0 ? -1 : cb_json_find(r->json, r->toks, obj, key);
    if (v < 0 && required) fail(r, field, "missing field", -1);
    return v;
}

static int object(reader *r, int obj, const char *key, const char *field, int required) {
    int v = member(r, obj, key, field, required);
    if (v >= 0 && r->toks[v].type != CB_JSON_OBJECT) {
        fail(r, field, "an object", v);
        return -1;
    }
    return v;
}

static uint32_t integer(reader *r, int obj, const char *key, const char *field, int required, uint32_t dflt,
                        uint32_t min) {
    int v = member(r, obj, key, field, required);
    int64_t x;
    if (v < 0) return dflt;
    if (cb_json_get_int64(r->json, &r->toks[v], &x) != 0 || x < min || x > UINT32_MAX) {
        char what[64];
        snprintf(what, sizeof what, "an integer in %u..%u", min, UINT32_MAX);
        fail(r, field, what, v);
        return dflt;
    }
    return (uint32_t)x;
}

/* An integer, or null / absent: CB_NO_TOKEN. */
static uint32_t token_id(reader *r, int obj, const char *key, const char *field) {
    int v = member(r, obj, key, field, 0);
    if (v < 0 || r->toks[v].type == CB_JSON_NULL) return CB_NO_TOKEN;
    int64_t x;
    if (cb_json_get_int64(r->json, &r->toks[v], &x) != 0 || x < 0 || x >= CB_NO_TOKEN) {
        fail(r, field, "a token id or null", v);
        return CB_NO_TOKEN;
    }
    return (uint32_t)x;
}

static float number(reader *r, int obj, const char *key, const char *field, int required, int null_ok) {
    int v = member(r, obj, key, field, required);
    double x;
    if (v < 0 || (null_ok && r->toks[v].type == CB_JSON_NULL)) return 0.0f;
    if (cb_json_get_double(r->json, &r->toks[v], &x) != 0 || x < 0) {
        fail(r, field, null_ok ? "a number >= 0 or null" : "a number >= 0", v);
        return 0.0f;
    }
    return (float)x; /* as the header stores it (toolkit: np.float32) */
}

static uint32_t boolean(reader *r, int obj, const char *key, const char *field) {
    int v = member(r, obj, key, field, 0);
    int b = 0;
    if (v >= 0 && cb_json_get_bool(&r->toks[v], &b) != 0) fail(r, field, "true or false", v);
    return (uint32_t)b;
}

/* A string into out[cap]; returns its length, or -1 (absent and optional). */
static int string(reader *r, int obj, const char *key, const char *field, int required, char *out, size_t cap) {
    int v = member(r, obj, key, field, required);
    out[0] = 0;
    if (v < 0) return -1;
    int n = r->toks[v].type == CB_JSON_STRING ? cb_json_unescape(r->json, &r->toks[v], out, cap) : -2;
    if (n < 0 || (int)strlen(out) != n) {
        char what[64];
        snprintf(what, sizeof what, "a string of at most %zu bytes, without NUL", cap - 1);
        fail(r, field, what, v);
        out[0] = 0;
        return -1;
    }
    return n;
}

static uint32_t choice(reader *r, int obj, const char *key, const char *field, int required, uint32_t dflt,
                       const char *const *names, int n_names) {
    char text[64], what[256];
    if (string(r, obj, key, field, required, text, sizeof text) < 0) return dflt;
    size_t used = (size_t)snprintf(what, sizeof what, "one of");
    for (int i = 0; i < n_names; i++) {
        if (!names[i]) continue;
        if (!strcmp(text, names[i])) return (uint32_t)i;
        if (used < sizeof what) used += (size_t)snprintf(what + used, sizeof what - used, " \"%s\"", names[i]);
    }
    fail(r, field, what, cb_json_find(r->json, r->toks, obj, key));
    return dflt;
}

static void line_and_column(const char *text, size_t offset, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < offset; i++) {
        if (text[i] == '\n') {
            ++*line;
            *col = 1;
        } else {
            ++*col;
        }
    }
}

/* The whole file, NUL-terminated, in a malloc'd buffer; NULL with err set. */
static char *read_file(const char *path, size_t *len, char *err, size_t err_len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, err_len, "%s: cannot open: %s (a model folder holds its model-config.json, which "
                 "colibri-build synth and convert write)", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap || cap >= MAX_CONFIG_BYTES) break;
        char *bigger = realloc(buf, 2 * cap + 1);
        if (!bigger) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = bigger;
        cap *= 2;
    }
    const int failed = ferror(f);
    const int too_big = buf && n == cap && fgetc(f) != EOF;
    fclose(f);
    if (!buf) snprintf(err, err_len, "%s: out of memory reading it", path);
    else if (failed) snprintf(err, err_len, "%s: read error", path);
    else if (too_big) snprintf(err, err_len, "%s: larger than %u MiB: not a model config", path, MAX_CONFIG_BYTES >> 20);
    if (!buf || failed || too_big) {
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

int cb_model_config_load(cb_model_config *c, const char *model_dir, char *err, size_t err_len) {
    char path[sizeof c->path];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", model_dir, CB_MODEL_CONFIG_FILE) >= sizeof path) {
        snprintf(err, err_len, "model folder path too long (%zu bytes)", strlen(model_dir));
        return -1;
    }
    size_t len = 0;
    char *text = read_file(path, &len, err, err_len);
    if (!text) return -1;
    const int status = cb_model_config_parse(c, text, len, path, err, err_len);
    free(text);
    return status;
}

int cb_model_config_parse(cb_model_config *c, const char *text, size_t len, const char *label, char *err,
                          size_t err_len) {
    memset(c, 0, sizeof *c);
    snprintf(c->path, sizeof c->path, "%s", label);
    size_t at = 0;
    if (len > MAX_CONFIG_BYTES) {
        snprintf(err, err_len, "%s: larger than %u MiB: not a model config", c->path, MAX_CONFIG_BYTES >> 20);
        return -1;
    }
    cb_json_tok *toks = NULL;
    int n = cb_json_parse(text, len, NULL, 0, &at);
    if (n > 0) {
        toks = malloc(sizeof *toks * (size_t)n);
        n = toks ? cb_json_parse(text, len, toks, n, &at) : CB_JSON_ERR_NOMEM;
    }
    if (n < 0) {
        int line, col;
        line_and_column(text, at, &line, &col);
        snprintf(err, err_len, "%s: not valid JSON: %s at line %d, column %d", c->path, cb_json_strerror(n), line,
                 col);
        free(toks);
        return -1;
    }
    reader r = {text, toks, c->path, err, err_len, 0};
    if (toks[0].type != CB_JSON_OBJECT) {
        snprintf(err, err_len, "%s: expected a JSON object at the top level", c->path);
        r.failed = 1;
    }
    cb_dims *d = &c->dims;
    const int root = 0;
    if (!r.failed) {
        string(&r, root, "name", "name", 1, c->name, sizeof c->name);
        d->arch = choice(&r, root, "architecture", "architecture", 1, 0, ARCHS, COUNT(ARCHS));
        d->n_layers = integer(&r, root, "layers", "layers", 1, 0, 1);
        d->hidden = integer(&r, root, "hidden_size", "hidden_size", 1, 0, 1);
        d->n_heads = integer(&r, root, "heads", "heads", 1, 1, 1);
        d->n_kv_heads = integer(&r, root, "kv_heads", "kv_heads", 1, 0, 1);
        d->head_dim = integer(&r, root, "head_dim", "head_dim", 0, d->hidden / d->n_heads, 1);
        d->vocab = integer(&r, root, "vocab_size", "vocab_size", 1, 0, 1);
        d->n_experts = integer(&r, root, "experts", "experts", 1, 0, 1);
        d->top_k = integer(&r, root, "top_k", "top_k", 1, 0, 1);
        d->expert_ffn = integer(&r, root, "expert_ffn_size", "expert_ffn_size", 1, 0, 1);
        d->n_shared_experts = integer(&r, root, "shared_experts", "shared_experts", 0, 0, 0);
        d->shared_ffn = integer(&r, root, "shared_expert_ffn_size", "shared_expert_ffn_size", 0, 0, 0);
        d->context_len = integer(&r, root, "context_length", "context_length", 1, 0, 1);
        d->router = choice(&r, root, "router", "router", 1, 0, ROUTERS, COUNT(ROUTERS));
        d->shared_gate = boolean(&r, root, "shared_expert_gate", "shared_expert_gate");
        d->dense_ffn = integer(&r, root, "dense_ffn_size", "dense_ffn_size", 0, 0, 0);
        d->tied_embeddings = boolean(&r, root, "tie_word_embeddings", "tie_word_embeddings");
        d->norm_eps = number(&r, root, "norm_eps", "norm_eps", 1, 0);
        const int rope = object(&r, root, "rope", "rope", 1);
        d->rope_theta = number(&r, rope, "theta", "rope.theta", rope >= 0, 0);
        const int scaling = rope < 0 ? -1 : member(&r, rope, "scaling", "rope.scaling", 0);
        if (scaling >= 0 && r.toks[scaling].type == CB_JSON_OBJECT) {
            d->rope_attn_factor = number(&r, scaling, "attention_factor", "rope.scaling.attention_factor", 1, 0);
            char kind[32];
            string(&r, scaling, "type", "rope.scaling.type", 1, kind, sizeof kind);
            cb_rope_scaling *s = &c->rope_scaling;
            s->kind = !strcmp(kind, "linear") ? CB_ROPE_LINEAR : !strcmp(kind, "yarn") ? CB_ROPE_YARN : CB_ROPE_OTHER;
            if (s->kind != CB_ROPE_OTHER) {
                s->factor = number(&r, scaling, "factor", "rope.scaling.factor", 1, 0);
                if (!(s->factor > 0))
                    fail(&r, "rope.scaling.factor", "a number above 0", member(&r, scaling, "factor", "rope.scaling.factor", 1));
            }
            if (s->kind == CB_ROPE_YARN) {
                s->beta_fast = number(&r, scaling, "beta_fast", "rope.scaling.beta_fast", 1, 0);
                s->beta_slow = number(&r, scaling, "beta_slow", "rope.scaling.beta_slow", 1, 0);
                s->orig_ctx = integer(&r, scaling, "original_max_position_embeddings",
                                      "rope.scaling.original_max_position_embeddings", 1, 0, 1);
            }
        }
        const int att = object(&r, root, "attention", "attention", 0);
        d->qkv_bias = boolean(&r, att, "qkv_bias", "attention.qkv_bias");
        d->qk_norm = choice(&r, att, "qk_norm", "attention.qk_norm", 0, CB_QK_NORM_NONE, QK_NORMS, COUNT(QK_NORMS));
        d->clip_qkv = number(&r, att, "clip_qkv", "attention.clip_qkv", 0, 1);
        d->v_norm = boolean(&r, att, "v_norm", "attention.v_norm");
        d->attn_scale = number(&r, att, "scale", "attention.scale", 0, 1);
        d->block = choice(&r, root, "block", "block", 0, CB_BLOCK_PRE_NORM, BLOCKS, COUNT(BLOCKS));
        d->ffn_act = choice(&r, root, "ffn_act", "ffn_act", 0, CB_ACT_SILU, FFN_ACTS, COUNT(FFN_ACTS));
        d->embed_scale = number(&r, root, "embed_scale", "embed_scale", 0, 1);
        d->logit_softcap = number(&r, root, "logit_softcap", "logit_softcap", 0, 1);
        d->o_bias = boolean(&r, att, "o_bias", "attention.o_bias");
        d->attn_sinks = boolean(&r, att, "sinks", "attention.sinks");
        d->router_bias = boolean(&r, root, "router_bias", "router_bias");
        d->expert_bias = boolean(&r, root, "expert_bias", "expert_bias");
        int swiglu = member(&r, root, "swiglu", "swiglu", 0); /* an object, or null: none */
        if (swiglu >= 0 && r.toks[swiglu].type != CB_JSON_OBJECT) swiglu = -1;
        d->swiglu_alpha = number(&r, swiglu, "alpha", "swiglu.alpha", 0, 0);
        d->swiglu_limit = number(&r, swiglu, "limit", "swiglu.limit", 0, 0);
        int mla = member(&r, root, "mla", "mla", 0); /* DeepSeek-V3: an object, or null: none */
        if (mla >= 0 && r.toks[mla].type != CB_JSON_OBJECT) mla = -1;
        d->q_lora_rank = integer(&r, mla, "q_lora_rank", "mla.q_lora_rank", 0, 0, 0);
        d->kv_lora_rank = integer(&r, mla, "kv_lora_rank", "mla.kv_lora_rank", mla >= 0, 0, 1);
        d->qk_nope_dim = integer(&r, mla, "qk_nope_head_dim", "mla.qk_nope_head_dim", mla >= 0, 0, 1);
        d->v_head_dim = integer(&r, mla, "v_head_dim", "mla.v_head_dim", mla >= 0, 0, 1);
        int groups = member(&r, root, "router_groups", "router_groups", 0);
        if (groups >= 0 && r.toks[groups].type != CB_JSON_OBJECT) groups = -1;
        d->n_group = integer(&r, groups, "groups", "router_groups.groups", groups >= 0, 0, 1);
        d->topk_group = integer(&r, groups, "topk_groups", "router_groups.topk_groups", groups >= 0, 0, 1);
        d->routed_scaling = number(&r, root, "routed_scaling_factor", "routed_scaling_factor", 0, 1);
        const int w = object(&r, root, "weights", "weights", 1);
        if (w >= 0) {
            string(&r, w, "file", "weights.file", 1, c->weights_file, sizeof c->weights_file);
            if (!r.failed && !c->weights_file[0]) fail(&r, "weights.file", "a file name", member(&r, w, "file", "", 0));
            d->weight_dtype = choice(&r, w, "dtype", "weights.dtype", 1, 0, DTYPES, COUNT(DTYPES));
            if (string(&r, w, "sha256", "weights.sha256", 0, c->sha256, sizeof c->sha256) >= 0 &&
                strspn(c->sha256, "0123456789abcdef") != 64) {
                fail(&r, "weights.sha256", "64 lowercase hex digits", member(&r, w, "sha256", "", 0));
            }
        }
        c->kv_cache = choice(&r, root, "kv_cache", "kv_cache", 0, CB_KV_AUTO, KV_CACHES, COUNT(KV_CACHES));
        const int tok = object(&r, root, "tokenizer", "tokenizer", 1);
        if (tok >= 0) {
            c->tok_kind = choice(&r, tok, "kind", "tokenizer.kind", 1, 0, TOKENIZERS, COUNT(TOKENIZERS));
            c->bos_id = token_id(&r, tok, "bos_id", "tokenizer.bos_id");
            c->eos_id = token_id(&r, tok, "eos_id", "tokenizer.eos_id");
        }
    }
    free(toks);
    return r.failed ? -1 : 0;
}

int cb_model_config_weights_path(const cb_model_config *c, const char *model_dir, char *out, size_t cap,
                                 char *err, size_t err_len) {
    if ((size_t)snprintf(out, cap, "%s/%s", model_dir, c->weights_file) >= cap) {
        snprintf(err, err_len, "%s: weights.file: the path is too long", c->path);
        return -1;
    }
    return 0;
}

static void describe(uint32_t v, const char *const *names, int n, char *out, size_t cap) {
    if (names && v < (uint32_t)n && names[v]) snprintf(out, cap, "\"%s\"", names[v]);
    else if (names) snprintf(out, cap, "id %u", v);
    else if (v == CB_NO_TOKEN) snprintf(out, cap, "null");
    else snprintf(out, cap, "%u", v);
}

int cb_model_config_check(const cb_model_config *c, const cb_weights_header *h, const char *weights_path,
                          char *err, size_t err_len) {
    const cb_dims *cfg = &c->dims, *hdr = &h->dims;
    char a[96], b[96];
    const char *field = NULL;
    if (strncmp(c->name, h->model_name, sizeof h->model_name) != 0) {
        field = "name";
        snprintf(a, sizeof a, "\"%s\"", c->name);
        snprintf(b, sizeof b, "\"%.*s\"", (int)sizeof h->model_name, h->model_name);
    }
    /* Integers and enums (names: the config's spelling of each value). */
    const struct {
        const char *label;
        uint32_t cfg, hdr;
        const char *const *names;
        int n_names;
    } ints[] = {
        {"architecture", cfg->arch, hdr->arch, ARCHS, COUNT(ARCHS)},
        {"layers", cfg->n_layers, hdr->n_layers, NULL, 0},
        {"hidden_size", cfg->hidden, hdr->hidden, NULL, 0},
        {"heads", cfg->n_heads, hdr->n_heads, NULL, 0},
        {"kv_heads", cfg->n_kv_heads, hdr->n_kv_heads, NULL, 0},
        {"head_dim", cfg->head_dim, hdr->head_dim, NULL, 0},
        {"vocab_size", cfg->vocab, hdr->vocab, NULL, 0},
        {"experts", cfg->n_experts, hdr->n_experts, NULL, 0},
        {"top_k", cfg->top_k, hdr->top_k, NULL, 0},
        {"expert_ffn_size", cfg->expert_ffn, hdr->expert_ffn, NULL, 0},
        {"shared_experts", cfg->n_shared_experts, hdr->n_shared_experts, NULL, 0},
        {"shared_expert_ffn_size", cfg->shared_ffn, hdr->shared_ffn, NULL, 0},
        {"context_length", cfg->context_len, hdr->context_len, NULL, 0},
        {"router", cfg->router, hdr->router, ROUTERS, COUNT(ROUTERS)},
        {"weights.dtype", cfg->weight_dtype, hdr->weight_dtype, DTYPES, COUNT(DTYPES)},
        {"attention.qk_norm", cfg->qk_norm, hdr->qk_norm, QK_NORMS, COUNT(QK_NORMS)},
        {"attention.qkv_bias", cfg->qkv_bias, hdr->qkv_bias, NULL, 0},
        {"shared_expert_gate", cfg->shared_gate, hdr->shared_gate, NULL, 0},
        {"dense_ffn_size", cfg->dense_ffn, hdr->dense_ffn, NULL, 0},
        {"tie_word_embeddings", cfg->tied_embeddings, hdr->tied_embeddings, NULL, 0},
        {"block", cfg->block, hdr->block, BLOCKS, COUNT(BLOCKS)},
        {"ffn_act", cfg->ffn_act, hdr->ffn_act, FFN_ACTS, COUNT(FFN_ACTS)},
        {"attention.v_norm", cfg->v_norm, hdr->v_norm, NULL, 0},
        {"attention.o_bias", cfg->o_bias, hdr->o_bias, NULL, 0},
        {"attention.sinks", cfg->attn_sinks, hdr->attn_sinks, NULL, 0},
        {"router_bias", cfg->router_bias, hdr->router_bias, NULL, 0},
        {"expert_bias", cfg->expert_bias, hdr->expert_bias, NULL, 0},
        {"mla.q_lora_rank", cfg->q_lora_rank, hdr->q_lora_rank, NULL, 0},
        {"mla.kv_lora_rank", cfg->kv_lora_rank, hdr->kv_lora_rank, NULL, 0},
        {"mla.qk_nope_head_dim", cfg->qk_nope_dim, hdr->qk_nope_dim, NULL, 0},
        {"mla.v_head_dim", cfg->v_head_dim, hdr->v_head_dim, NULL, 0},
        {"router_groups.groups", cfg->n_group, hdr->n_group, NULL, 0},
        {"router_groups.topk_groups", cfg->topk_group, hdr->topk_group, NULL, 0},
        {"tokenizer.kind", c->tok_kind, h->tok.kind, TOKENIZERS, COUNT(TOKENIZERS)},
        {"tokenizer.bos_id", c->bos_id, h->tok.bos_id, NULL, 0},
        {"tokenizer.eos_id", c->eos_id, h->tok.eos_id, NULL, 0},
    };
    for (int i = 0; i < COUNT(ints) && !field; i++) {
        if (ints[i].cfg == ints[i].hdr) continue;
        field = ints[i].label;
        describe(ints[i].cfg, ints[i].names, ints[i].n_names, a, sizeof a);
        describe(ints[i].hdr, ints[i].names, ints[i].n_names, b, sizeof b);
    }
    /* float32 in the header, as the toolkit rounds the config's numbers. */
    const struct {
        const char *label;
        float cfg, hdr;
    } floats[] = {
        {"norm_eps", cfg->norm_eps, hdr->norm_eps},
        {"rope.theta", cfg->rope_theta, hdr->rope_theta},
        {"attention.clip_qkv", cfg->clip_qkv, hdr->clip_qkv},
        {"attention.scale", cfg->attn_scale, hdr->attn_scale},
        {"embed_scale", cfg->embed_scale, hdr->embed_scale},
        {"logit_softcap", cfg->logit_softcap, hdr->logit_softcap},
        {"rope.scaling.attention_factor", cfg->rope_attn_factor, hdr->rope_attn_factor},
        {"swiglu.alpha", cfg->swiglu_alpha, hdr->swiglu_alpha},
        {"swiglu.limit", cfg->swiglu_limit, hdr->swiglu_limit},
        {"routed_scaling_factor", cfg->routed_scaling, hdr->routed_scaling},
    };
    for (int i = 0; i < COUNT(floats) && !field; i++) {
        if (floats[i].cfg == floats[i].hdr) continue;
        field = floats[i].label;
        snprintf(a, sizeof a, "%.9g", (double)floats[i].cfg);
        snprintf(b, sizeof b, "%.9g", (double)floats[i].hdr);
    }
    if (!field) return 0;
    snprintf(err, err_len, "%s and %s disagree: %s is %s in %s, %s in the weights header (a weights file or "
             "config from another model or conversion; re-convert, or restore the one that changed)",
             c->path, weights_path, field, a, CB_MODEL_CONFIG_FILE, b);
    return -1;
}
