/* Constrained decoding: the schema compiler, the byte matcher, and token
 * masks over the vocabulary. See constrain.h for the contract. */
#include "constrain.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The sampler's order (cb_ranks_before in kernels/kernels.h, kept out so the
 * matcher builds alone for its test): higher first, NaN last, ties to the
 * lower id. */
static int ranks_before(float v, int i, float w, int j) {
    if (v != v) return w != w && i < j;
    if (w != w) return 1;
    return v > w || (v == w && i < j);
}

#define INF 0x3fffffffu

enum { CT_NULL = 1, CT_BOOL = 2, CT_OBJECT = 4, CT_ARRAY = 8, CT_STRING = 16, CT_NUMBER = 32, CT_INTEGER = 64 };
#define CT_ALL 127
enum { CF_NONE = 0, CF_DATE = 1, CF_UUID = 2 };
enum { F_VALUE = 1, F_OBJ, F_ARR, F_STR, F_NUM, F_LIT, F_TEXT };
enum { O_START, O_KEY, O_COLON, O_AFTER, O_NEXT };
enum { A_START, A_AFTER };
enum { R_REJECT = 0, R_OK = 1, R_REFEED = 2, R_EXPAND = 3 };
enum { LIT_TRUE = 0, LIT_FALSE = 1, LIT_NULL = 2 };

static const char DATE_TEMPLATE[] = "dddd-dd-dd";
static const char UUID_TEMPLATE[] = "hhhhhhhh-hhhh-hhhh-hhhh-hhhhhhhhhhhh";

static uint32_t add_sat(uint32_t a, uint32_t b) { return a >= INF || b >= INF || a + b >= INF ? INF : a + b; }

/* Numbers: integers in units of 1 (at most 15 digits), other numbers in
 * units of 10^-6 (at most 12 integer digits and 6 decimals), so bounds are
 * checked exactly in int64. */
static int node_is_int(const cb_con_node *n) { return !(n->types & CT_NUMBER); }
static const int64_t POW10[19] = {1,
                                  10,
                                  100,
                                  1000,
                                  10000,
                                  100000,
                                  1000000,
                                  10000000,
                                  100000000,
                                  1000000000,
                                  10000000000LL,
                                  100000000000LL,
                                  1000000000000LL,
                                  10000000000000LL,
                                  100000000000000LL,
                                  1000000000000000LL,
                                  10000000000000000LL,
                                  100000000000000000LL,
                                  1000000000000000000LL};

/* ================= compiling ================= */

typedef struct {
    cb_con_schema *c;
    const char *json;
    const cb_json_tok *t;
    int root;
    char *err;
    size_t err_len;
    char path[256];
} compiler;

/* k->path ("#/properties/x/anyOf/1") dotted for an error's param
 * ("properties.x.anyOf[1]"), then keyword (may be NULL). */
static void set_err_at(compiler *k, const char *keyword) {
    char *out = k->c->err_at;
    const size_t cap = sizeof k->c->err_at;
    size_t n = 0;
    int index = 0; /* the segment after anyOf/oneOf is a branch number */
    for (const char *p = k->path + 1; *p == '/';) {
        const char *seg = p + 1, *end = strchr(seg, '/');
        if (!end) end = seg + strlen(seg);
        n += (size_t)snprintf(out + n, cap - n, index ? "[%.*s]" : n ? ".%.*s" : "%.*s", (int)(end - seg), seg);
        if (n >= cap) n = cap - 1;
        index = !index && ((end - seg == 5 && (!memcmp(seg, "anyOf", 5) || !memcmp(seg, "oneOf", 5))));
        p = end;
    }
    if (keyword) snprintf(out + n, cap - n, n ? ".%s" : "%s", keyword);
}

static int cfail_at(compiler *k, const char *keyword, const char *fmt, va_list ap) {
    char msg[320];
    vsnprintf(msg, sizeof msg, fmt, ap);
    snprintf(k->err, k->err_len, "%s (at %s)", msg, k->path);
    set_err_at(k, keyword);
    return -1;
}

static int cfail(compiler *k, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    cfail_at(k, NULL, fmt, ap);
    va_end(ap);
    return -1;
}

/* cfail() naming the refused keyword in err_at too. */
static int cfail_keyword(compiler *k, const char *keyword, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    cfail_at(k, keyword, fmt, ap);
    va_end(ap);
    return -1;
}

static int text_add(compiler *k, const char *s, size_t n, uint16_t *off) {
    cb_con_schema *c = k->c;
    if (c->text_len + n > CB_CON_TEXT) return cfail(k, "the schema needs more than %d bytes of keys and values", CB_CON_TEXT);
    memcpy(c->text + c->text_len, s, n);
    *off = (uint16_t)c->text_len;
    c->text_len += n;
    return 0;
}

static int text_put(compiler *k, const char *s, size_t n) {
    uint16_t off;
    return text_add(k, s, n, &off);
}

/* Appends the string token t as canonical JSON string text (no quotes):
 * the form the model must write. */
static int put_escaped(compiler *k, const cb_json_tok *t) {
    char buf[CB_CON_TEXT];
    int n = cb_json_unescape(k->json, t, buf, sizeof buf);
    if (n < 0) return cfail(k, "a string is too long or invalid");
    for (int i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)buf[i];
        char esc[8];
        if (ch == '"' || ch == '\\') esc[0] = '\\', esc[1] = (char)ch, esc[2] = 0;
        else if (ch < 0x20) snprintf(esc, sizeof esc, "\\u%04x", ch);
        else esc[0] = (char)ch, esc[1] = 0;
        if (text_put(k, esc, strlen(esc))) return -1;
    }
    return 0;
}

/* The value toks[i] as compact JSON text. */
static int put_value(compiler *k, int i) {
    const cb_json_tok *t = &k->t[i];
    switch (t->type) {
    case CB_JSON_STRING:
        return text_put(k, "\"", 1) || put_escaped(k, t) || text_put(k, "\"", 1) ? -1 : 0;
    case CB_JSON_NUMBER:
    case CB_JSON_TRUE:
    case CB_JSON_FALSE:
    case CB_JSON_NULL:
        return text_put(k, k->json + t->start, (size_t)(t->end - t->start));
    case CB_JSON_ARRAY: {
        if (text_put(k, "[", 1)) return -1;
        for (int e = i + 1, n = 0; n < t->size; n++, e = k->t[e].next)
            if ((n && text_put(k, ",", 1)) || put_value(k, e)) return -1;
        return text_put(k, "]", 1);
    }
    case CB_JSON_OBJECT: {
        if (text_put(k, "{", 1)) return -1;
        for (int e = i + 1, n = 0; n < t->size; n++, e = k->t[e + 1].next)
            if ((n && text_put(k, ",", 1)) || put_value(k, e) || text_put(k, ":", 1) || put_value(k, e + 1))
                return -1;
        return text_put(k, "}", 1);
    }
    }
    return cfail(k, "an unknown JSON value");
}

static int type_of_value(const cb_json_tok *t) {
    switch (t->type) {
    case CB_JSON_OBJECT: return CT_OBJECT;
    case CB_JSON_ARRAY: return CT_ARRAY;
    case CB_JSON_STRING: return CT_STRING;
    case CB_JSON_NUMBER: return CT_NUMBER | ((t->flags & CB_JSON_F_INTEGER) ? CT_INTEGER : 0);
    case CB_JSON_TRUE:
    case CB_JSON_FALSE: return CT_BOOL;
    default: return CT_NULL;
    }
}

static int new_node(compiler *k) {
    cb_con_schema *c = k->c;
    if (c->n_nodes >= CB_CON_MAX_NODES) return cfail(k, "the schema has more than %d subschemas", CB_CON_MAX_NODES);
    cb_con_node *n = &c->nodes[c->n_nodes];
    memset(n, 0, sizeof *n);
    n->types = CT_ALL;
    n->add = 0;
    n->items = 0;
    n->max_items = n->max_len = INT32_MAX;
    n->lo = -(POW10[18] - 1), n->hi = POW10[18] - 1;
    return c->n_nodes++;
}

/* Scaled bounds of a numeric node; number bounds beyond +-1e9 and integer
 * bounds beyond +-1e15 are refused (they would not be exact here). */
static int set_bounds(compiler *k, cb_con_node *n, const double b[4], const int has[4]) {
    const int is_int = node_is_int(n);
    const double scale = is_int ? 1.0 : 1e6, lim = is_int ? 1e15 : 1e9;
    int64_t lo = is_int ? -(POW10[15] - 1) : -(POW10[18] - 1), hi = -lo;
    static const char *names[4] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    for (int i = 0; i < 4; i++) {
        if (!has[i]) continue;
        if (!(fabs(b[i]) < lim))
            return cfail_keyword(k, names[i], "'%s' %g is out of the supported range (%s: at most %g in magnitude)",
                                 names[i], b[i], is_int ? "integer" : "number", lim);
        const double v = b[i] * scale;
        int64_t s;
        if (i == 0) s = (int64_t)ceil(v);
        else if (i == 1) s = (int64_t)floor(v) + 1;
        else if (i == 2) s = (int64_t)floor(v);
        else s = (int64_t)ceil(v) - 1;
        if (i < 2 && s > lo) lo = s;
        if (i >= 2 && s < hi) hi = s;
    }
    n->lo = lo, n->hi = hi;
    return 0;
}

static uint32_t num_min_more(const cb_con_node *n, const cb_con_frame *f);
static int compile_node(compiler *k, int i, int depth);

static const char *ANNOTATIONS[] = {"title", "description", "default", "examples", "$schema", "$id", "$comment",
                                    "deprecated", "readOnly", "writeOnly", "$defs", "definitions", "strict"};

static int is_annotation(const char *json, const cb_json_tok *key) {
    for (size_t a = 0; a < sizeof ANNOTATIONS / sizeof *ANNOTATIONS; a++)
        if (cb_json_str_eq(json, key, ANNOTATIONS[a])) return 1;
    return 0;
}

static int path_push(compiler *k, const char *fmt, const char *s, int len, size_t *saved) {
    *saved = strlen(k->path);
    snprintf(k->path + *saved, sizeof k->path - *saved, fmt, len, s);
    return 0;
}

/* "$ref": "#/$defs/NAME" (or #/definitions/NAME) in the root schema. */
static int resolve_ref(compiler *k, int ref) {
    const cb_json_tok *t = &k->t[ref];
    if (t->type != CB_JSON_STRING) return cfail(k, "'$ref' must be a string");
    const char *s = k->json + t->start;
    const int len = t->end - t->start;
    static const char *roots[2] = {"#/$defs/", "#/definitions/"};
    for (int r = 0; r < 2; r++) {
        const int rl = (int)strlen(roots[r]);
        if (len <= rl || memcmp(s, roots[r], (size_t)rl)) continue;
        char key[16];
        snprintf(key, sizeof key, "%.*s", rl - 3, roots[r] + 2); /* "$defs", "definitions" */
        int defs = cb_json_find(k->json, k->t, k->root, key);
        if (defs < 0 || k->t[defs].type != CB_JSON_OBJECT) break;
        char name[256];
        if (len - rl >= (int)sizeof name) break;
        memcpy(name, s + rl, (size_t)(len - rl));
        name[len - rl] = 0;
        int target = cb_json_find(k->json, k->t, defs, name);
        if (target >= 0) return target;
        break;
    }
    return cfail_keyword(k, "$ref", "'$ref' '%.*s' is not supported (only '#/$defs/NAME' of the root schema)",
                         len < 100 ? len : 100, s);
}

static int compile_object_keywords(compiler *k, int i, int ni, int depth) {
    const char *json = k->json;
    const cb_json_tok *t = k->t;
    cb_con_schema *c = k->c;
    int v = cb_json_find(json, t, i, "additionalProperties");
    if (v >= 0) {
        if (t[v].type == CB_JSON_FALSE) c->nodes[ni].add = -1;
        else if (t[v].type == CB_JSON_TRUE) c->nodes[ni].add = 0;
        else if (t[v].type == CB_JSON_OBJECT) {
            size_t saved;
            path_push(k, "/%.*s", "additionalProperties", 20, &saved);
            int a = compile_node(k, v, depth + 1);
            k->path[saved] = 0;
            if (a < 0) return -1;
            c->nodes[ni].add = (int16_t)a;
        } else return cfail(k, "'additionalProperties' must be a boolean or a schema");
    }
    int props = cb_json_find(json, t, i, "properties");
    c->nodes[ni].prop0 = (uint16_t)c->n_props;
    if (props >= 0) {
        if (t[props].type != CB_JSON_OBJECT) return cfail(k, "'properties' must be an object");
        if (t[props].size > CB_CON_OBJ_PROPS) return cfail(k, "an object has more than %d properties", CB_CON_OBJ_PROPS);
        if (c->n_props + t[props].size > CB_CON_MAX_PROPS)
            return cfail(k, "the schema has more than %d properties in all", CB_CON_MAX_PROPS);
        /* reserve the object's slots first: nested objects append after */
        const int p0 = c->n_props, np = t[props].size;
        c->n_props += np;
        for (int e = props + 1, n = 0; n < np; n++, e = t[e + 1].next) {
            cb_con_prop *p = &c->props[p0 + n];
            p->off = (uint16_t)c->text_len;
            if (put_escaped(k, &t[e])) return -1;
            p->len = (uint16_t)(c->text_len - p->off);
            p->required = 0;
            size_t saved;
            path_push(k, "/properties/%.*s", json + t[e].start, t[e].end - t[e].start < 64 ? t[e].end - t[e].start : 64,
                      &saved);
            int sub = compile_node(k, e + 1, depth + 1);
            k->path[saved] = 0;
            if (sub < 0) return -1;
            p->node = (int16_t)sub;
        }
        c->nodes[ni].nprops = (uint16_t)np;
    }
    int req = cb_json_find(json, t, i, "required");
    if (req >= 0) {
        if (t[req].type != CB_JSON_ARRAY) return cfail(k, "'required' must be an array of strings");
        for (int e = req + 1, n = 0; n < t[req].size; n++, e = t[e].next) {
            if (t[e].type != CB_JSON_STRING) return cfail(k, "'required' must be an array of strings");
            cb_con_node *node = &c->nodes[ni];
            int found = -1;
            uint16_t off = (uint16_t)c->text_len;
            if (put_escaped(k, &t[e])) return -1;
            const uint16_t len = (uint16_t)(c->text_len - off);
            for (int p = 0; p < node->nprops; p++)
                if (c->props[node->prop0 + p].len == len && !memcmp(c->text + c->props[node->prop0 + p].off, c->text + off, len))
                    found = p;
            if (found >= 0) {
                c->text_len = off;
            } else {
                /* required but not listed: a property under additionalProperties */
                if (node->add < 0)
                    return cfail(k, "required property '%.*s' is not in 'properties' and additionalProperties is false",
                                 len, c->text + off);
                if (node->prop0 + node->nprops != c->n_props)
                    return cfail(k, "required property '%.*s' must be listed in 'properties'", len, c->text + off);
                if (node->nprops >= CB_CON_OBJ_PROPS || c->n_props >= CB_CON_MAX_PROPS)
                    return cfail(k, "an object has more than %d properties", CB_CON_OBJ_PROPS);
                cb_con_prop *p = &c->props[c->n_props++];
                p->off = off, p->len = len, p->node = node->add, p->required = 0;
                found = node->nprops++;
            }
            c->props[node->prop0 + found].required = 1;
            node->req |= 1ull << found;
        }
    }
    return 0;
}

static int compile_node(compiler *k, int i, int depth) {
    const char *json = k->json;
    const cb_json_tok *t = k->t;
    cb_con_schema *c = k->c;
    if (depth > CB_CON_DEPTH - 4) return cfail(k, "the schema nests deeper than %d levels", CB_CON_DEPTH - 4);
    if (t[i].type == CB_JSON_TRUE) return 0; /* any value: node 0 */
    if (t[i].type != CB_JSON_OBJECT) return cfail(k, "a schema must be an object (or true)");
    int ref = cb_json_find(json, t, i, "$ref");
    if (ref >= 0) {
        for (int e = i + 1, n = 0; n < t[i].size; n++, e = t[e + 1].next)
            if (!cb_json_str_eq(json, &t[e], "$ref") && !is_annotation(json, &t[e]))
                return cfail(k, "'$ref' beside '%.*s' is not supported", t[e].end - t[e].start, json + t[e].start);
        int target = resolve_ref(k, ref);
        if (target < 0) return -1;
        return compile_node(k, target, depth + 1); /* a recursive $ref ends at the depth limit */
    }
    const int ni = new_node(k);
    if (ni < 0) return -1;
    /* Every keyword is known, an annotation, or refused by name. */
    static const char *known[] = {"type", "properties", "required", "additionalProperties", "enum", "const", "items",
                                  "minItems", "maxItems", "anyOf", "oneOf", "minimum", "maximum", "exclusiveMinimum",
                                  "exclusiveMaximum", "minLength", "maxLength", "format"};
    int has_enum = 0, has_any = 0, n_constraints = 0;
    for (int e = i + 1, n = 0; n < t[i].size; n++, e = t[e + 1].next) {
        int ok = is_annotation(json, &t[e]);
        for (size_t a = 0; !ok && a < sizeof known / sizeof *known; a++)
            if (cb_json_str_eq(json, &t[e], known[a])) {
                ok = 1;
                if (a == 4 || a == 5) has_enum = 1;
                else if (a == 9 || a == 10) has_any = 1;
                else if (a != 0) n_constraints++;
            }
        if (!ok) {
            char kw[72];
            snprintf(kw, sizeof kw, "%.*s", t[e].end - t[e].start < 64 ? t[e].end - t[e].start : 64, json + t[e].start);
            return cfail_keyword(k, kw, "the JSON Schema keyword '%s' is not supported", kw);
        }
    }
    int v = cb_json_find(json, t, i, "type");
    uint8_t types = CT_ALL;
    if (v >= 0) {
        static const char *names[7] = {"null", "boolean", "object", "array", "string", "number", "integer"};
        const int one = t[v].type == CB_JSON_STRING;
        if (!one && t[v].type != CB_JSON_ARRAY) return cfail(k, "'type' must be a string or an array of strings");
        types = 0;
        for (int e = one ? v : v + 1, n = 0; n < (one ? 1 : t[v].size); n++, e = t[e].next) {
            int found = -1;
            for (int a = 0; a < 7; a++)
                if (t[e].type == CB_JSON_STRING && cb_json_str_eq(json, &t[e], names[a])) found = a;
            if (found < 0)
                return cfail_keyword(k, "type", "'type' '%.*s' is not a JSON Schema type",
                                     t[e].end - t[e].start < 32 ? t[e].end - t[e].start : 32, json + t[e].start);
            types |= (uint8_t)(1 << found);
        }
        if (!types) return cfail(k, "'type' is an empty list");
    }
    c->nodes[ni].types = types;
    if (has_any) {
        if (has_enum || n_constraints || v >= 0)
            return cfail(k, "'anyOf'/'oneOf' beside other keywords is not supported (only annotations)");
        int any = cb_json_find(json, t, i, "anyOf");
        const char *kw = "anyOf";
        if (any < 0) any = cb_json_find(json, t, i, "oneOf"), kw = "oneOf";
        if (t[any].type != CB_JSON_ARRAY || t[any].size == 0) return cfail(k, "'%s' must be a non-empty array", kw);
        if (c->n_list + t[any].size > CB_CON_MAX_LIST) return cfail(k, "more than %d anyOf branches and enum values", CB_CON_MAX_LIST);
        const int l0 = c->n_list, nl = t[any].size;
        c->n_list += nl;
        uint32_t best = INF, deepest = 0;
        for (int e = any + 1, n = 0; n < nl; n++, e = t[e].next) {
            char idx[16];
            snprintf(idx, sizeof idx, "%d", n);
            size_t saved;
            path_push(k, "/%.*s", kw, (int)strlen(kw), &saved);
            path_push(k, "/%.*s", idx, (int)strlen(idx), &(size_t){0});
            int sub = compile_node(k, e, depth);
            k->path[saved] = 0;
            if (sub < 0) return -1;
            c->list[l0 + n] = (uint16_t)sub;
            if (c->nodes[sub].min_bytes < best) best = c->nodes[sub].min_bytes;
            if (c->nodes[sub].depth > deepest) deepest = c->nodes[sub].depth;
        }
        /* Shortest branch first: a thread that splits keeps branch 0 itself,
         * so the shortest completion (what the budget counts on) is never
         * among the branches dropped beyond CB_CON_THREADS. */
        for (int a = 1; a < nl; a++)
            for (int b = a; b > 0 && c->nodes[c->list[l0 + b]].min_bytes < c->nodes[c->list[l0 + b - 1]].min_bytes; b--) {
                uint16_t x = c->list[l0 + b];
                c->list[l0 + b] = c->list[l0 + b - 1];
                c->list[l0 + b - 1] = x;
            }
        cb_con_node *node = &c->nodes[ni];
        node->alt0 = (uint16_t)l0, node->nalt = (uint16_t)nl;
        node->min_bytes = best, node->depth = deepest;
        return ni;
    }
    if (has_enum) {
        if (n_constraints) return cfail(k, "'enum'/'const' beside other constraints than 'type' is not supported");
        int en = cb_json_find(json, t, i, "enum"), one = 0;
        if (en < 0) en = cb_json_find(json, t, i, "const"), one = 1;
        if (!one && (t[en].type != CB_JSON_ARRAY || t[en].size == 0)) return cfail(k, "'enum' must be a non-empty array");
        const int nv = one ? 1 : t[en].size;
        if (nv > CB_CON_ENUM) return cfail(k, "'enum' has more than %d values", CB_CON_ENUM);
        cb_con_node *node = &c->nodes[ni];
        node->has_enum = 1;
        node->lit0 = (uint16_t)c->n_lits;
        node->min_bytes = INF;
        for (int e = one ? en : en + 1, n = 0; n < nv; n++, e = t[e].next) {
            const int vt = type_of_value(&t[e]);
            if (!(vt & types) && !((vt & CT_INTEGER) && (types & CT_NUMBER))) continue; /* the type rules it out */
            if (c->n_lits >= CB_CON_MAX_LIST + 3) return cfail(k, "more than %d enum values in all", CB_CON_MAX_LIST);
            cb_con_lit *lit = &c->lits[c->n_lits++];
            lit->off = (uint16_t)c->text_len;
            if (put_value(k, e)) return -1;
            lit->len = (uint16_t)(c->text_len - lit->off);
            if (lit->len < node->min_bytes) node->min_bytes = lit->len;
            node->nlit++;
        }
        if (!node->nlit) return cfail(k, "no value of 'enum'/'const' has the schema's 'type'");
        return ni;
    }
    cb_con_node *node = &c->nodes[ni];
    int64_t x;
    static const char *ints[4] = {"minItems", "maxItems", "minLength", "maxLength"};
    int32_t *dst[4] = {&node->min_items, &node->max_items, &node->min_len, &node->max_len};
    for (int a = 0; a < 4; a++) {
        v = cb_json_find(json, t, i, ints[a]);
        if (v < 0) continue;
        if (cb_json_get_int64(json, &t[v], &x) != 0 || x < 0 || x > 1000000)
            return cfail_keyword(k, ints[a], "'%s' must be an integer from 0 to 1000000", ints[a]);
        *dst[a] = (int32_t)x;
    }
    if (node->min_items > node->max_items) return cfail(k, "'minItems' is over 'maxItems'");
    if (node->min_len > node->max_len) return cfail(k, "'minLength' is over 'maxLength'");
    v = cb_json_find(json, t, i, "format");
    if (v >= 0) {
        if (cb_json_str_eq(json, &t[v], "date")) node->format = CF_DATE;
        else if (cb_json_str_eq(json, &t[v], "uuid")) node->format = CF_UUID;
        else
            return cfail_keyword(k, "format", "'format' '%.*s' is not supported (supported: date, uuid)",
                                 t[v].end - t[v].start < 32 ? t[v].end - t[v].start : 32, json + t[v].start);
        if (cb_json_find(json, t, i, "minLength") >= 0 || cb_json_find(json, t, i, "maxLength") >= 0)
            return cfail(k, "'format' beside 'minLength'/'maxLength' is not supported");
    }
    static const char *bnames[4] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    double b[4] = {0, 0, 0, 0};
    int has[4] = {0, 0, 0, 0};
    for (int a = 0; a < 4; a++) {
        v = cb_json_find(json, t, i, bnames[a]);
        if (v < 0) continue;
        if (cb_json_get_double(json, &t[v], &b[a]) != 0)
            return cfail_keyword(k, bnames[a], "'%s' must be a number", bnames[a]);
        has[a] = 1;
    }
    if (set_bounds(k, node, b, has)) return -1;
    if (compile_object_keywords(k, i, ni, depth)) return -1;
    node = &c->nodes[ni];
    v = cb_json_find(json, t, i, "items");
    if (v >= 0) {
        if (t[v].type != CB_JSON_OBJECT && t[v].type != CB_JSON_TRUE) return cfail(k, "'items' must be a schema (tuples are not supported)");
        size_t saved;
        path_push(k, "/%.*s", "items", 5, &saved);
        int sub = compile_node(k, v, depth + 1);
        k->path[saved] = 0;
        if (sub < 0) return -1;
        node = &c->nodes[ni];
        node->items = (int16_t)sub;
    }
    /* The shortest value of each allowed type; the node needs one. */
    uint32_t best = INF, deepest = 1;
    if (node->types & CT_NULL) best = 4;
    if ((node->types & CT_BOOL) && 4 < best) best = 4;
    if (node->types & CT_STRING) {
        uint32_t s = node->format == CF_DATE ? 12 : node->format == CF_UUID ? 38 : add_sat(2, (uint32_t)node->min_len);
        if (s < best) best = s;
    }
    if (node->types & (CT_NUMBER | CT_INTEGER)) {
        cb_con_frame f;
        memset(&f, 0, sizeof f);
        uint32_t s = num_min_more(node, &f);
        f.u.num.neg = 1;
        uint32_t s2 = add_sat(1, num_min_more(node, &f));
        if (s2 < s) s = s2;
        if (s < best) best = s;
    }
    if (node->types & CT_ARRAY) {
        const uint32_t m = c->nodes[node->items].min_bytes, n = (uint32_t)node->min_items;
        uint32_t s = 2;
        for (uint32_t j = 0; j < n && s < INF; j++) s = add_sat(s, add_sat(m, j ? 1 : 0));
        if (s < best) best = s;
        if (c->nodes[node->items].depth + 1 > deepest) deepest = c->nodes[node->items].depth + 1;
    }
    if (node->types & CT_OBJECT) {
        uint32_t s = 2;
        for (int p = 0, first = 1; p < node->nprops; p++) {
            const cb_con_prop *pr = &c->props[node->prop0 + p];
            if (c->nodes[pr->node].depth + 1 > deepest) deepest = c->nodes[pr->node].depth + 1;
            if (!pr->required) continue;
            s = add_sat(s, add_sat((uint32_t)pr->len + 3 + (first ? 0 : 1), c->nodes[pr->node].min_bytes));
            first = 0;
        }
        if (s < best) best = s;
    }
    if (best >= INF) return cfail(k, "no value satisfies this schema");
    node->min_bytes = best;
    node->depth = deepest;
    return ni;
}

static void add_literal(cb_con_schema *c, const char *s) {
    cb_con_lit *lit = &c->lits[c->n_lits++];
    lit->off = (uint16_t)c->text_len;
    lit->len = (uint16_t)strlen(s);
    memcpy(c->text + c->text_len, s, lit->len);
    c->text_len += lit->len;
}

int cb_con_compile(cb_con_schema *c, const char *prefix, size_t prefix_len, const char *json,
                   const cb_json_tok *toks, int schema, const char *suffix, size_t suffix_len, char *err,
                   size_t err_len) {
    compiler k = {c, json, toks, schema, err, err_len, "#"};
    c->err_at[0] = 0;
    c->n_nodes = c->n_props = c->n_list = c->n_lits = 0;
    c->text_len = 0;
    add_literal(c, "true");
    add_literal(c, "false");
    add_literal(c, "null");
    int any = new_node(&k); /* node 0: any value */
    c->nodes[any].min_bytes = 1;
    c->nodes[any].depth = 1;
    if (text_add(&k, prefix, prefix_len, &c->prefix_off) || text_add(&k, suffix, suffix_len, &c->suffix_off)) return -1;
    c->prefix_len = (uint16_t)prefix_len, c->suffix_len = (uint16_t)suffix_len;
    if (schema < 0) {
        int obj = new_node(&k); /* any JSON object */
        c->nodes[obj].types = CT_OBJECT;
        c->nodes[obj].min_bytes = 2;
        c->nodes[obj].depth = 1;
        c->root = obj;
        return 0;
    }
    int root = compile_node(&k, schema, 0);
    if (root < 0) return -1;
    c->root = root;
    return 0;
}

/* ================= matching ================= */

static const cb_con_node *node_at(const cb_con_schema *c, int n) { return &c->nodes[n]; }

/* A multiple of g in [A, B] within [mlo, mhi] (all >= 0 but B). */
static int has_mult(int64_t mlo, int64_t mhi, int64_t g, int64_t A, int64_t B) {
    const int64_t a = A > mlo ? A : mlo, b = B < mhi ? B : mhi;
    return a <= b && ((a + g - 1) / g) * g <= b;
}

/* Fewest bytes, from frame f's state, that complete its number (0: it may
 * end here), INF when no completion fits the bounds. */
static uint32_t num_min_more(const cb_con_node *n, const cb_con_frame *f) {
    const int is_int = node_is_int(n);
    const int D = is_int ? 0 : 6, maxint = is_int ? 15 : 12;
    const int64_t S = POW10[D];
    int64_t mlo, mhi;
    if (f->u.num.neg) mlo = n->hi < 0 ? -n->hi : 0, mhi = -n->lo;
    else mlo = n->lo > 0 ? n->lo : 0, mhi = n->hi;
    if (mhi < mlo) return INF;
    uint32_t best = INF;
    if (!f->u.num.in_frac) {
        const int n_int = f->u.num.n_int;
        int kmin = n_int == 0 ? 1 : 0, kmax = f->u.num.zero ? 0 : maxint - n_int;
        for (int kk = kmin; kk <= kmax; kk++) {
            int64_t imin, imax;
            if (n_int == 0) imin = kk == 1 ? 0 : POW10[kk - 1], imax = POW10[kk] - 1;
            else imin = f->u.num.m * POW10[kk], imax = (f->u.num.m + 1) * POW10[kk] - 1;
            if ((uint32_t)kk >= best) break;
            if (has_mult(mlo, mhi, S, imin * S, imax * S)) {
                best = (uint32_t)kk;
                break;
            }
            for (int j = 1; j <= D && (uint32_t)(kk + 1 + j) < best; j++) {
                const int64_t g = POW10[D - j];
                if (has_mult(mlo, mhi, g, imin * S, imax * S + S - g)) best = (uint32_t)(kk + 1 + j);
            }
        }
    } else {
        const int nf = f->u.num.n_frac;
        const int64_t unit = POW10[D - nf], base = f->u.num.m * S + (int64_t)f->u.num.x * unit;
        if (nf > 0 && base >= mlo && base <= mhi) return 0;
        for (int e = 1; e <= D - nf; e++) {
            const int64_t g = POW10[D - nf - e];
            if (has_mult(mlo, mhi, g, base, base + unit - g)) return (uint32_t)e;
        }
    }
    return best;
}

static int num_accepting(const cb_con_node *n, const cb_con_frame *f) {
    if (f->u.num.n_int == 0 || (f->u.num.in_frac && f->u.num.n_frac == 0)) return 0;
    return num_min_more(n, f) == 0;
}

static int lit_accepting(const cb_con_schema *c, const cb_con_frame *f) {
    for (int i = 0; i < f->u.lit.n; i++)
        if ((f->u.lit.alive >> i & 1) && c->lits[f->u.lit.first + i].len == f->u.lit.pos) return 1;
    return 0;
}

/* Bytes of `"key":value` for property p at its shortest, without a comma. */
static uint32_t prop_cost(const cb_con_schema *c, const cb_con_node *n, int p) {
    const cb_con_prop *pr = &c->props[n->prop0 + p];
    return add_sat((uint32_t)pr->len + 3, c->nodes[pr->node].min_bytes);
}

/* Required properties not seen yet: their count and shortest bytes. */
static uint32_t required_rest(const cb_con_schema *c, const cb_con_node *n, uint64_t seen, int *count) {
    uint32_t s = 0;
    *count = 0;
    for (int p = 0; p < n->nprops; p++)
        if ((n->req >> p & 1) && !(seen >> p & 1)) s = add_sat(s, prop_cost(c, n, p)), ++*count;
    return s;
}

/* Bytes that close an object after a member: required ones, then '}'. */
static uint32_t obj_after_cost(const cb_con_schema *c, const cb_con_node *n, uint64_t seen) {
    int k;
    uint32_t r = required_rest(c, n, seen, &k);
    return add_sat(r, (uint32_t)k + 1);
}

static uint32_t frame_min(const cb_con_schema *c, const cb_con_frame *f) {
    const cb_con_node *n = node_at(c, f->node);
    switch (f->kind) {
    case F_VALUE: return n->min_bytes;
    case F_TEXT: return (uint32_t)(f->u.text.len - f->u.text.pos);
    case F_LIT: {
        uint32_t best = INF;
        for (int i = 0; i < f->u.lit.n; i++)
            if (f->u.lit.alive >> i & 1) {
                uint32_t r = (uint32_t)(c->lits[f->u.lit.first + i].len - f->u.lit.pos);
                if (r < best) best = r;
            }
        return best;
    }
    case F_NUM: return num_min_more(n, f);
    case F_STR: {
        if (n->format) return (uint32_t)((n->format == CF_DATE ? 10 : 36) - f->u.str.chars + 1);
        uint32_t pending = f->u.str.esc == 1 ? 1 : f->u.str.esc ? (uint32_t)(6 - f->u.str.esc) : (uint32_t)(f->u.str.need - f->u.str.have);
        uint32_t chars = n->min_len > f->u.str.chars ? (uint32_t)(n->min_len - f->u.str.chars) : 0;
        return pending + chars + 1;
    }
    case F_ARR: {
        const uint32_t m = c->nodes[n->items].min_bytes;
        /* A_START: min_items values and min_items - 1 commas, then ']' */
        const int32_t done = f->sub == A_START ? 0 : f->u.arr.count;
        const uint32_t need = n->min_items > done ? (uint32_t)(n->min_items - done) : 0;
        if (!need) return 1;
        if (m >= INF || (uint64_t)need * (m + 1) >= INF) return INF;
        return need * (m + 1) + (f->sub == A_START ? 0 : 1);
    }
    case F_OBJ: {
        const uint64_t seen = f->u.obj.seen;
        int k;
        uint32_t r = required_rest(c, n, seen, &k);
        switch (f->sub) {
        case O_START: return add_sat(r, (uint32_t)(k ? k - 1 : 0) + 1);
        case O_AFTER: return add_sat(r, (uint32_t)k + 1);
        case O_COLON: {
            const int node = f->u.obj.cur >= 0 ? c->props[n->prop0 + f->u.obj.cur].node : n->add;
            return add_sat(add_sat(1, c->nodes[node].min_bytes), obj_after_cost(c, n, seen));
        }
        case O_NEXT: {
            if (k) return add_sat(r, (uint32_t)k); /* k keys, k-1 commas, '}' */
            uint32_t best = INF;
            for (int p = 0; p < n->nprops; p++)
                if (!(seen >> p & 1)) {
                    uint32_t s = prop_cost(c, n, p);
                    if (s < best) best = s;
                }
            if (n->add >= 0) {
                uint32_t s = add_sat(3, c->nodes[n->add].min_bytes);
                if (s < best) best = s;
            }
            return add_sat(best, 1);
        }
        case O_KEY: {
            uint32_t best = INF;
            int exact = 0;
            for (int p = 0; p < n->nprops; p++) {
                if (!(f->u.obj.cand >> p & 1)) continue;
                const cb_con_prop *pr = &c->props[n->prop0 + p];
                if (pr->len == f->u.obj.kpos) exact = 1;
                if (seen >> p & 1) continue;
                uint32_t s = add_sat((uint32_t)(pr->len - f->u.obj.kpos) + 2, c->nodes[pr->node].min_bytes);
                s = add_sat(s, obj_after_cost(c, n, seen | 1ull << p));
                if (s < best) best = s;
            }
            if (f->u.obj.kfree && n->add >= 0) {
                uint32_t s = add_sat((uint32_t)exact + 2, c->nodes[n->add].min_bytes);
                s = add_sat(s, obj_after_cost(c, n, seen));
                if (s < best) best = s;
            }
            return best;
        }
        }
    }
    }
    return INF;
}

uint32_t cb_con_min_bytes(const cb_con_schema *c, const cb_con_state *s) {
    uint32_t best = INF;
    for (int i = 0; i < s->n; i++) {
        uint32_t sum = 0;
        for (int d = 0; d < s->t[i].depth; d++) sum = add_sat(sum, frame_min(c, &s->t[i].f[d]));
        if (sum < best) best = sum;
    }
    return best;
}

static int push(cb_con_thread *th, int kind, int node) {
    if (th->depth >= CB_CON_DEPTH) return 0;
    cb_con_frame *f = &th->f[th->depth++];
    memset(f, 0, sizeof *f);
    f->kind = (uint8_t)kind;
    f->node = (int16_t)node;
    return 1;
}

static void set_lit(cb_con_frame *f, int first, int n) {
    f->kind = F_LIT;
    f->u.lit.first = (uint16_t)first, f->u.lit.n = (uint16_t)n, f->u.lit.pos = 0;
    f->u.lit.alive = n >= 64 ? ~0ull : (1ull << n) - 1;
}

static int is_hex(int b) { return (b >= '0' && b <= '9') || (b >= 'a' && b <= 'f'); }

/* A string of a fixed template (date, uuid): one position at a time. */
static int step_format(const cb_con_node *n, cb_con_frame *f, int b) {
    const char *tpl = n->format == CF_DATE ? DATE_TEMPLATE : UUID_TEMPLATE;
    const int pos = f->u.str.chars, len = (int)strlen(tpl);
    if (pos == len) return b == '"' ? 2 : 0;
    int ok;
    if (tpl[pos] == '-') ok = b == '-';
    else if (tpl[pos] == 'h') ok = is_hex(b);
    else if (pos == 0) ok = b >= '1' && b <= '9'; /* years 1000-9999 */
    else if (pos == 5) ok = b == '0' || b == '1';
    else if (pos == 6) ok = f->u.str.prev == '0' ? b >= '1' && b <= '9' : b >= '0' && b <= '2';
    else if (pos == 8) ok = b >= '0' && b <= '2'; /* days 01-28: valid in every month */
    else if (pos == 9) ok = f->u.str.prev == '0' ? b >= '1' && b <= '9' : f->u.str.prev == '1' ? b >= '0' && b <= '9' : b >= '0' && b <= '8';
    else ok = b >= '0' && b <= '9';
    if (!ok) return 0;
    f->u.str.chars++;
    f->u.str.prev = (uint8_t)b;
    return 1;
}

/* String content: valid UTF-8, escapes (no surrogate \u escapes), no raw
 * control characters; a character counts at its first byte. Returns 1
 * consumed, 2 closed, 0 rejected. */
static int step_string(const cb_con_node *n, cb_con_frame *f, int b) {
    if (n->format) return step_format(n, f, b);
    if (f->u.str.esc == 1) {
        if (b == 'u') return f->u.str.esc = 2, 1;
        if (!strchr("\"\\/bfnrt", b) || !b) return 0;
        return f->u.str.esc = 0, 1;
    }
    if (f->u.str.esc >= 2) {
        if (!(is_hex(b) || (b >= 'A' && b <= 'F'))) return 0;
        if (f->u.str.esc == 3 && (f->u.str.lead == 'd' || f->u.str.lead == 'D') && !(b >= '0' && b <= '7')) return 0;
        if (f->u.str.esc == 2) f->u.str.lead = (uint8_t)b;
        f->u.str.esc = f->u.str.esc == 5 ? 0 : f->u.str.esc + 1;
        return 1;
    }
    if (f->u.str.need) {
        uint8_t lo = 0x80, hi = 0xBF;
        if (f->u.str.have == 1) {
            const uint8_t lead = f->u.str.lead;
            if (lead == 0xE0) lo = 0xA0;
            else if (lead == 0xED) hi = 0x9F;
            else if (lead == 0xF0) lo = 0x90;
            else if (lead == 0xF4) hi = 0x8F;
        }
        if (b < lo || b > hi) return 0;
        if (++f->u.str.have == f->u.str.need) f->u.str.need = f->u.str.have = 0;
        return 1;
    }
    if (b == '"') return f->u.str.chars >= n->min_len ? 2 : 0;
    if (b < 0x20) return 0;
    if (f->u.str.chars >= n->max_len) return 0;
    if (b == '\\') f->u.str.esc = 1;
    else if (b >= 0x80) {
        if (b < 0xC2 || b > 0xF4) return 0;
        f->u.str.need = b <= 0xDF ? 2 : b <= 0xEF ? 3 : 4;
        f->u.str.have = 1;
        f->u.str.lead = (uint8_t)b;
    }
    f->u.str.chars++;
    return 1;
}

static int step_number(const cb_con_node *n, cb_con_frame *f, int b) {
    cb_con_frame g = *f;
    const int is_int = node_is_int(n), D = is_int ? 0 : 6, maxint = is_int ? 15 : 12;
    if (b == '-') {
        if (g.u.num.neg || g.u.num.n_int || g.u.num.in_frac) goto other;
        g.u.num.neg = 1;
    } else if (b >= '0' && b <= '9') {
        if (!g.u.num.in_frac) {
            if (g.u.num.zero || g.u.num.n_int >= maxint) goto other;
            g.u.num.m = g.u.num.m * 10 + (b - '0');
            g.u.num.n_int++;
            g.u.num.zero = g.u.num.n_int == 1 && b == '0';
        } else {
            if (g.u.num.n_frac >= D) goto other;
            g.u.num.x = g.u.num.x * 10 + (b - '0');
            g.u.num.n_frac++;
        }
    } else if (b == '.') {
        if (D == 0 || g.u.num.in_frac || g.u.num.n_int == 0) goto other;
        g.u.num.in_frac = 1;
    } else goto other;
    if (num_min_more(n, &g) >= INF) goto other;
    *f = g;
    return R_OK;
other:
    return num_accepting(n, f) ? R_REFEED + 10 : R_REJECT; /* +10: pop, then feed the parent */
}

static int plain_key_byte(int b) { return b >= 0x20 && b < 0x7F && b != '"' && b != '\\'; }

/* One byte into the top frame of th. */
static int step_thread(const cb_con_schema *c, cb_con_thread *th, int b) {
    for (;;) {
        if (th->depth == 0) return R_REJECT;
        cb_con_frame *f = &th->f[th->depth - 1];
        const cb_con_node *n = node_at(c, f->node);
        switch (f->kind) {
        case F_TEXT:
            if (c->text[f->u.text.off + f->u.text.pos] != (char)b) return R_REJECT;
            if (++f->u.text.pos == f->u.text.len) th->depth--;
            return R_OK;
        case F_VALUE:
            if (n->nalt) return R_EXPAND;
            if (n->has_enum) {
                set_lit(f, n->lit0, n->nlit);
                continue;
            }
            if (b == '{' && (n->types & CT_OBJECT) && th->depth + 1 < CB_CON_DEPTH) {
                f->kind = F_OBJ, f->sub = O_START;
                memset(&f->u, 0, sizeof f->u);
                return R_OK;
            }
            if (b == '[' && (n->types & CT_ARRAY) && th->depth + 1 < CB_CON_DEPTH) {
                f->kind = F_ARR, f->sub = A_START;
                memset(&f->u, 0, sizeof f->u);
                return R_OK;
            }
            if (b == '"' && (n->types & CT_STRING)) {
                f->kind = F_STR;
                memset(&f->u, 0, sizeof f->u);
                return R_OK;
            }
            if ((b == '-' || (b >= '0' && b <= '9')) && (n->types & (CT_NUMBER | CT_INTEGER))) {
                f->kind = F_NUM;
                memset(&f->u, 0, sizeof f->u);
                continue;
            }
            if (b == 't' && (n->types & CT_BOOL)) set_lit(f, LIT_TRUE, 1);
            else if (b == 'f' && (n->types & CT_BOOL)) set_lit(f, LIT_FALSE, 1);
            else if (b == 'n' && (n->types & CT_NULL)) set_lit(f, LIT_NULL, 1);
            else return R_REJECT;
            continue;
        case F_LIT: {
            uint64_t alive = 0;
            int longer = 0;
            for (int i = 0; i < f->u.lit.n; i++) {
                if (!(f->u.lit.alive >> i & 1)) continue;
                const cb_con_lit *l = &c->lits[f->u.lit.first + i];
                if (l->len > f->u.lit.pos && c->text[l->off + f->u.lit.pos] == (char)b) {
                    alive |= 1ull << i;
                    if (l->len > f->u.lit.pos + 1) longer = 1;
                }
            }
            if (alive) {
                f->u.lit.alive = alive;
                f->u.lit.pos++;
                if (!longer) th->depth--; /* nothing longer can follow: done */
                return R_OK;
            }
            if (!lit_accepting(c, f)) return R_REJECT;
            th->depth--;
            continue;
        }
        case F_NUM: {
            int r = step_number(n, f, b);
            if (r < 10) return r;
            th->depth--;
            continue;
        }
        case F_STR: {
            int r = step_string(n, f, b);
            if (r == 2) th->depth--;
            return r ? R_OK : R_REJECT;
        }
        case F_ARR:
            if (f->sub == A_START) {
                if (b == ']') {
                    if (n->min_items > 0) return R_REJECT;
                    th->depth--;
                    return R_OK;
                }
                if (n->max_items == 0) return R_REJECT;
                f->sub = A_AFTER;
                f->u.arr.count = 1;
                if (!push(th, F_VALUE, n->items)) return R_REJECT;
                continue;
            }
            if (b == ']') {
                if (f->u.arr.count < n->min_items) return R_REJECT;
                th->depth--;
                return R_OK;
            }
            if (b != ',' || f->u.arr.count >= n->max_items) return R_REJECT;
            f->u.arr.count++;
            return push(th, F_VALUE, n->items) ? R_OK : R_REJECT;
        case F_OBJ: {
            const uint64_t all = n->nprops >= 64 ? ~0ull : (1ull << n->nprops) - 1;
            switch (f->sub) {
            case O_START:
            case O_NEXT:
                if (b == '}' && f->sub == O_START && (n->req & ~f->u.obj.seen) == 0) {
                    th->depth--;
                    return R_OK;
                }
                if (b != '"' || (!(all & ~f->u.obj.seen) && n->add < 0)) return R_REJECT;
                f->sub = O_KEY;
                f->u.obj.cand = all;
                f->u.obj.kfree = n->add >= 0;
                f->u.obj.kpos = 0;
                return R_OK;
            case O_KEY: {
                const int pos = f->u.obj.kpos;
                /* a quote closes the key unless a declared key escapes one here */
                int quoted = 0;
                for (int p = 0; b == '"' && p < n->nprops; p++) {
                    const cb_con_prop *pr = &c->props[n->prop0 + p];
                    if ((f->u.obj.cand >> p & 1) && pr->len > pos && c->text[pr->off + pos] == '"') quoted = 1;
                }
                if (b == '"' && !quoted) {
                    int exact = -1;
                    for (int p = 0; p < n->nprops; p++)
                        if ((f->u.obj.cand >> p & 1) && c->props[n->prop0 + p].len == pos) exact = p;
                    if (exact >= 0) {
                        if (f->u.obj.seen >> exact & 1) return R_REJECT; /* a key twice */
                        f->u.obj.seen |= 1ull << exact;
                        f->u.obj.cur = (int16_t)exact;
                    } else if (f->u.obj.kfree) {
                        f->u.obj.cur = -1;
                    } else return R_REJECT;
                    f->sub = O_COLON;
                    return R_OK;
                }
                uint64_t cand = 0;
                for (int p = 0; p < n->nprops; p++) {
                    const cb_con_prop *pr = &c->props[n->prop0 + p];
                    if ((f->u.obj.cand >> p & 1) && pr->len > pos && c->text[pr->off + pos] == (char)b) cand |= 1ull << p;
                }
                const int kfree = f->u.obj.kfree && plain_key_byte(b) && pos < 256;
                if (!(cand & ~f->u.obj.seen) && !kfree) return R_REJECT;
                f->u.obj.cand = cand;
                f->u.obj.kfree = (uint8_t)kfree;
                f->u.obj.kpos++;
                return R_OK;
            }
            case O_COLON:
                if (b != ':') return R_REJECT;
                f->sub = O_AFTER;
                return push(th, F_VALUE, f->u.obj.cur >= 0 ? c->props[n->prop0 + f->u.obj.cur].node : n->add) ? R_OK
                                                                                                               : R_REJECT;
            case O_AFTER:
                if (b == '}') {
                    if (n->req & ~f->u.obj.seen) return R_REJECT;
                    th->depth--;
                    return R_OK;
                }
                if (b != ',' || (!(all & ~f->u.obj.seen) && n->add < 0)) return R_REJECT;
                f->sub = O_NEXT;
                return R_OK;
            }
            return R_REJECT;
        }
        }
        return R_REJECT;
    }
}

static void thread_copy(cb_con_thread *d, const cb_con_thread *s) {
    d->depth = s->depth;
    memcpy(d->f, s->f, sizeof *s->f * (size_t)s->depth);
}

static void state_copy(cb_con_state *d, const cb_con_state *s) {
    d->n = s->n;
    for (int i = 0; i < s->n; i++) thread_copy(&d->t[i], &s->t[i]);
}

/* One byte into every thread; anyOf values split a thread into one per
 * branch (beyond CB_CON_THREADS the later branches are dropped: what is
 * kept is still valid, only fewer alternatives are followed). */
static int feed_byte(const cb_con_schema *c, cb_con_state *s, int b) {
    uint8_t ok[CB_CON_THREADS];
    for (int i = 0; i < s->n; i++) {
        for (;;) {
            cb_con_thread *th = &s->t[i];
            int r = step_thread(c, th, b);
            if (r != R_EXPAND) {
                ok[i] = r == R_OK;
                break;
            }
            cb_con_frame *f = &th->f[th->depth - 1];
            const cb_con_node *n = node_at(c, f->node);
            for (int j = 1; j < n->nalt && s->n < CB_CON_THREADS; j++) {
                cb_con_thread *clone = &s->t[s->n++];
                thread_copy(clone, th);
                clone->f[clone->depth - 1].node = (int16_t)c->list[n->alt0 + j];
            }
            f->node = (int16_t)c->list[n->alt0];
        }
    }
    int kept = 0;
    for (int i = 0; i < s->n; i++)
        if (ok[i]) {
            if (kept != i) thread_copy(&s->t[kept], &s->t[i]);
            kept++;
        }
    s->n = kept;
    return kept > 0;
}

void cb_con_start(const cb_con_schema *c, cb_con_state *s) {
    cb_con_thread *th = &s->t[0];
    s->n = 1;
    th->depth = 0;
    if (c->suffix_len) {
        push(th, F_TEXT, 0);
        th->f[0].u.text.off = c->suffix_off, th->f[0].u.text.len = c->suffix_len;
    }
    push(th, F_VALUE, c->root);
    if (c->prefix_len) {
        push(th, F_TEXT, 0);
        cb_con_frame *f = &th->f[th->depth - 1];
        f->u.text.off = c->prefix_off, f->u.text.len = c->prefix_len;
    }
}

int cb_con_feed(const cb_con_schema *c, cb_con_state *s, const char *bytes, size_t n) {
    cb_con_state tmp;
    state_copy(&tmp, s);
    for (size_t i = 0; i < n; i++)
        if (!feed_byte(c, &tmp, (unsigned char)bytes[i])) return 0;
    state_copy(s, &tmp);
    return 1;
}

int cb_con_complete(const cb_con_state *s) {
    for (int i = 0; i < s->n; i++)
        if (s->t[i].depth == 0) return 1;
    return 0;
}

int cb_con_accepting(const cb_con_schema *c, const cb_con_state *s) {
    for (int i = 0; i < s->n; i++) {
        const cb_con_thread *th = &s->t[i];
        if (th->depth == 0) return 1;
        if (th->depth == 1 && th->f[0].kind == F_NUM && num_accepting(node_at(c, th->f[0].node), &th->f[0])) return 1;
        if (th->depth == 1 && th->f[0].kind == F_LIT && lit_accepting(c, &th->f[0])) return 1;
    }
    return 0;
}

/* ================= the vocabulary ================= */

static const cb_tokenizer *sort_tok; /* qsort's comparison has no context argument */
static char BYTE_TEXT[256];          /* the byte tokenizer's token texts, set at init */

static size_t tok_bytes(const cb_tokenizer *t, int32_t id, const char **out) {
    if (t->kind == CB_TOKENIZER_BYTES) {
        if (id > 255) return 0;
        *out = BYTE_TEXT + id;
        return 1;
    }
    *out = t->dec + t->dec_off[id];
    return t->dec_off[id + 1] - t->dec_off[id];
}

static int cmp_tokens(const void *a, const void *b) {
    const char *x = "", *y = "";
    const size_t nx = tok_bytes(sort_tok, *(const int32_t *)a, &x), ny = tok_bytes(sort_tok, *(const int32_t *)b, &y);
    int r = memcmp(x, y, nx < ny ? nx : ny);
    if (r) return r;
    if (nx != ny) return nx < ny ? -1 : 1;
    return *(const int32_t *)a < *(const int32_t *)b ? -1 : 1;
}

/* Characters of a token that is plain string text (printable ASCII but
 * quote and backslash, and whole UTF-8 characters); 0 otherwise. */
static int plain_chars(const unsigned char *s, size_t n) {
    cb_con_node any;
    memset(&any, 0, sizeof any);
    any.max_len = INT32_MAX;
    cb_con_frame f;
    memset(&f, 0, sizeof f);
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '"' || s[i] == '\\' || s[i] < 0x20) return 0;
        if (step_string(&any, &f, s[i]) != 1) return 0;
    }
    if (f.u.str.need || f.u.str.esc) return 0;
    return f.u.str.chars > 65535 ? 0 : f.u.str.chars;
}

/* Printable ASCII but quote and backslash throughout: free key text. */
static int ascii_plain(const char *b, size_t n) {
    for (size_t j = 0; j < n; j++)
        if (!plain_key_byte((unsigned char)b[j])) return 0;
    return 1;
}

/* Not ascii_plain, and the first byte that is not is a quote: a token that
 * may close a free key (and go on after it). */
static int key_end(const char *b, size_t n) {
    size_t j = 0;
    while (j < n && plain_key_byte((unsigned char)b[j])) j++;
    return j < n && b[j] == '"';
}

static int list_alloc(cb_con_list *l, int vocab) {
    l->n = 0;
    l->off = calloc((size_t)vocab + 2, sizeof *l->off);
    l->ids = calloc((size_t)vocab + 1, sizeof *l->ids);
    l->lcp = calloc((size_t)vocab + 1, sizeof *l->lcp);
    l->skip0 = calloc((size_t)vocab + 1, sizeof *l->skip0);
    l->skip1 = calloc((size_t)vocab + 1, sizeof *l->skip1);
    return l->off && l->ids && l->lcp && l->skip0 && l->skip1 ? 0 : -1;
}

static size_t list_bytes(const cb_con_list *l) {
    const size_t n = (size_t)l->n;
    return (n + 2) * sizeof *l->off + (n + 1) * (sizeof *l->ids + sizeof *l->lcp + sizeof *l->skip0 + sizeof *l->skip1) +
           (l->off ? l->off[n] + 1 : 0);
}

size_t cb_con_vocab_bytes(const cb_con_vocab *v) {
    const size_t n = (size_t)v->vocab + 1;
    return list_bytes(&v->all) + list_bytes(&v->loose) + list_bytes(&v->unkeyed) + list_bytes(&v->keyend) +
           n * (sizeof *v->plain_chars + sizeof *v->plain + sizeof *v->ascii_plain + sizeof *v->key_len +
                sizeof *v->allowed + sizeof *v->allowed_ids) +
           ((size_t)v->n_special + 1) * sizeof *v->special + (CB_CON_TOKEN_BYTES + 2) * sizeof *v->stack;
}

static void list_free(cb_con_list *l) {
    free(l->off);
    free(l->text);
    free(l->ids);
    free(l->lcp);
    free(l->skip0);
    free(l->skip1);
}

/* Shared prefixes with the previous token, and where the tokens after i
 * stop sharing i's first byte (skip0) or first two bytes (skip1): a byte
 * that fails there skips them all at once. */
static int list_index(const cb_tokenizer *t, cb_con_list *l) {
    size_t bytes = 0;
    const char *b = "";
    for (int i = 0; i < l->n; i++) bytes += tok_bytes(t, l->ids[i], &b);
    l->text = malloc(bytes + 1);
    if (!l->text) return -1;
    bytes = 0;
    for (int i = 0; i < l->n; i++) {
        const size_t n = tok_bytes(t, l->ids[i], &b);
        l->off[i] = (uint32_t)bytes;
        memcpy(l->text + bytes, b, n);
        bytes += n;
    }
    l->off[l->n] = (uint32_t)bytes;
    for (int i = 0; i < l->n; i++) {
        const char *x = "", *y = "";
        size_t nx = i ? tok_bytes(t, l->ids[i - 1], &x) : 0, ny = tok_bytes(t, l->ids[i], &y), k = 0;
        while (k < nx && k < ny && x[k] == y[k]) k++;
        l->lcp[i] = (uint16_t)k;
    }
    int next0 = l->n, next1 = l->n;
    for (int i = l->n - 1; i >= 0; i--) {
        l->skip0[i] = next0;
        l->skip1[i] = next1;
        if (l->lcp[i] == 0) next0 = i;
        if (l->lcp[i] <= 1) next1 = i;
    }
    return 0;
}

int cb_con_vocab_init(cb_con_vocab *v, const cb_tokenizer *tok, int vocab) {
    memset(v, 0, sizeof *v);
    for (int i = 0; i < 256; i++) BYTE_TEXT[i] = (char)i;
    v->tok = tok;
    v->vocab = vocab;
    const int n_tok = tok->kind == CB_TOKENIZER_BYTES ? (vocab < 256 ? vocab : 256)
                      : (int)tok->n_tokens < vocab ? (int)tok->n_tokens : vocab;
    v->plain_chars = calloc((size_t)vocab + 1, sizeof *v->plain_chars);
    v->plain = calloc((size_t)vocab + 1, 1);
    v->ascii_plain = calloc((size_t)vocab + 1, 1);
    v->key_len = calloc((size_t)vocab + 1, sizeof *v->key_len);
    uint8_t *kind = calloc((size_t)vocab + 1, 1); /* 1 normal, 2 special (start-up scratch) */
    int n_normal = 0, n_loose = 0, n_unkeyed = 0, n_keyend = 0;
    for (int id = 0; kind && v->plain_chars && v->plain && v->ascii_plain && v->key_len && id < n_tok; id++) {
        const char *b = "";
        size_t n = tok_bytes(tok, id, &b);
        if (n == 0 || n > CB_CON_TOKEN_BYTES || cb_is_end_token(tok, id)) continue;
        const int normal = tok->kind == CB_TOKENIZER_BYTES || tok->attr[id] == CB_TOKA_NORMAL || tok->attr[id] == CB_TOKA_BYTE;
        kind[id] = normal ? 1 : 2;
        if (!normal) {
            v->n_special++;
            continue;
        }
        n_normal++;
        if ((int)n > v->max_len) v->max_len = (int)n;
        v->plain_chars[id] = (uint16_t)plain_chars((const unsigned char *)b, n);
        v->plain[id] = v->plain_chars[id] != 0;
        if (v->plain_chars[id] > v->max_plain) v->max_plain = v->plain_chars[id];
        v->ascii_plain[id] = (uint8_t)ascii_plain(b, n);
        v->key_len[id] = (uint16_t)(v->ascii_plain[id] ? n : 0);
        if (v->key_len[id] > v->max_key_len) v->max_key_len = v->key_len[id];
        n_loose += !v->plain_chars[id];
        n_unkeyed += !v->ascii_plain[id];
        n_keyend += key_end(b, n);
    }
    int ok = kind && v->plain_chars && v->plain && v->ascii_plain && v->key_len && list_alloc(&v->all, n_normal) == 0 &&
             list_alloc(&v->loose, n_loose) == 0 && list_alloc(&v->unkeyed, n_unkeyed) == 0 &&
             list_alloc(&v->keyend, n_keyend) == 0;
    v->special = calloc((size_t)v->n_special + 1, sizeof *v->special);
    v->allowed = calloc((size_t)vocab + 1, 1);
    v->allowed_ids = calloc((size_t)vocab + 1, sizeof *v->allowed_ids);
    v->stack = calloc(CB_CON_TOKEN_BYTES + 2, sizeof *v->stack); /* the walk's, then one spare */
    if (!ok || !v->special || !v->allowed || !v->allowed_ids || !v->stack) {
        free(kind);
        cb_con_vocab_free(v);
        return -1;
    }
    v->n_special = 0;
    for (int id = 0; id < n_tok; id++) {
        if (kind[id] == 1) v->all.ids[v->all.n++] = id;
        else if (kind[id] == 2) v->special[v->n_special++] = id;
    }
    free(kind);
    sort_tok = tok;
    qsort(v->all.ids, (size_t)v->all.n, sizeof *v->all.ids, cmp_tokens);
    for (int i = 0; i < v->all.n; i++) {
        const int32_t id = v->all.ids[i];
        if (!v->plain_chars[id]) v->loose.ids[v->loose.n++] = id;
        if (!v->ascii_plain[id]) v->unkeyed.ids[v->unkeyed.n++] = id;
        const char *b = "";
        const size_t n = tok_bytes(tok, id, &b);
        if (key_end(b, n)) v->keyend.ids[v->keyend.n++] = id;
    }
    if (list_index(tok, &v->all) || list_index(tok, &v->loose) || list_index(tok, &v->unkeyed) ||
        list_index(tok, &v->keyend)) {
        cb_con_vocab_free(v);
        return -1;
    }
    return 0;
}

void cb_con_vocab_free(cb_con_vocab *v) {
    list_free(&v->all);
    list_free(&v->loose);
    list_free(&v->unkeyed);
    list_free(&v->keyend);
    free(v->special);
    free(v->plain_chars);
    free(v->plain);
    free(v->ascii_plain);
    free(v->key_len);
    free(v->allowed);
    free(v->allowed_ids);
    free(v->stack);
    memset(v, 0, sizeof *v);
}

static int is_special(const cb_con_vocab *v, int32_t id) {
    const cb_tokenizer *t = v->tok;
    return t->kind != CB_TOKENIZER_BYTES && !(t->attr[id] == CB_TOKA_NORMAL || t->attr[id] == CB_TOKA_BYTE);
}

/* An added/control token only inside the literal prefix or suffix: all its
 * bytes within the TEXT frame on top. */
static int special_fits(const cb_con_schema *c, const cb_con_state *s, const char *b, size_t n) {
    for (int i = 0; i < s->n; i++) {
        const cb_con_thread *th = &s->t[i];
        if (!th->depth || th->f[th->depth - 1].kind != F_TEXT) continue;
        const cb_con_frame *f = &th->f[th->depth - 1];
        if ((size_t)(f->u.text.len - f->u.text.pos) >= n && !memcmp(c->text + f->u.text.off + f->u.text.pos, b, n)) return 1;
    }
    return 0;
}

/* Whether token id keeps the output valid (and, budget_left >= 0, leaves
 * it completable in budget_left more tokens); *after gets the state. */
static int token_fits(cb_con_vocab *v, const cb_con_schema *c, const cb_con_state *s, int32_t id, int strip,
                      int budget_left, cb_con_state *after) {
    if (id < 0 || id >= v->vocab) return 0;
    const cb_tokenizer *t = v->tok;
    if (t->kind != CB_TOKENIZER_BYTES && (uint32_t)id >= t->n_tokens) return 0;
    if (cb_is_end_token(t, id)) return cb_con_accepting(c, s);
    const char *b = "";
    size_t n = tok_bytes(t, id, &b);
    if (n == 0 || n > CB_CON_TOKEN_BYTES) return 0;
    if (is_special(v, id) && !special_fits(c, s, b, n)) return 0;
    if (strip && !is_special(v, id) && b[0] == ' ') b++, n--;
    state_copy(after, s);
    if (n && !cb_con_feed(c, after, b, n)) return 0;
    return budget_left < 0 || cb_con_min_bytes(c, after) <= (uint32_t)budget_left;
}

/* Marks the valid tokens of list in v->allowed, stepping each shared
 * prefix once and skipping what shares a failed one. */
static void walk(cb_con_vocab *v, const cb_con_schema *c, const cb_con_state *s, const cb_con_list *l,
                 int budget_left) {
    cb_con_state *st = v->stack;
    state_copy(&st[0], s);
    int fed = 0; /* bytes of the last token stepped: st[0..fed] hold its prefixes */
    for (int i = 0; i < l->n;) {
        const int common = l->lcp[i];
        if (common > fed) { /* shares the byte that failed before */
            i++;
            continue;
        }
        const int32_t id = l->ids[i];
        const char *b = l->text + l->off[i]; /* in list order: read in sequence */
        const int len = (int)(l->off[i + 1] - l->off[i]);
        int j = common;
        for (; j < len; j++) {
            state_copy(&st[j + 1], &st[j]);
            if (!feed_byte(c, &st[j + 1], (unsigned char)b[j])) break;
        }
        fed = j;
        if (j == len && (budget_left < 0 || cb_con_min_bytes(c, &st[len]) <= (uint32_t)budget_left)) v->allowed[id] = 1;
        i = j == 0 && j < len ? l->skip0[i] : j == 1 && j < len ? l->skip1[i] : i + 1;
    }
}

/* Whether any key text, whatever candidates it leaves, still lets the
 * output complete in budget_left bytes: the free key then closes as an
 * additionalProperties member. */
static int key_fast_ok(const cb_con_schema *c, const cb_con_state *s, int budget_left) {
    if (budget_left < 0) return 1;
    const cb_con_thread *th = &s->t[0];
    const cb_con_frame *top = &th->f[th->depth - 1];
    const cb_con_node *n = node_at(c, top->node);
    uint32_t below = 0;
    for (int d = 0; d + 1 < th->depth; d++) below = add_sat(below, frame_min(c, &th->f[d]));
    /* a character that makes the key differ from a declared one, its quote
     * and colon, the shortest value, the rest of the object */
    uint32_t worst = add_sat(add_sat(3, c->nodes[n->add].min_bytes), obj_after_cost(c, n, top->u.obj.seen));
    return add_sat(below, worst) <= (uint32_t)budget_left;
}

/* Whether most of the vocabulary fits here: plain string text, or the
 * text of a free key (additionalProperties). */
static int mostly_open(const cb_con_schema *c, const cb_con_state *s) {
    const cb_con_thread *th = &s->t[0];
    if (s->n != 1 || !th->depth) return 0;
    const cb_con_frame *top = &th->f[th->depth - 1];
    const cb_con_node *n = node_at(c, top->node);
    if (top->kind == F_STR) return !n->format && !top->u.str.esc && !top->u.str.need;
    return top->kind == F_OBJ && top->sub == O_KEY && top->u.obj.kfree;
}

/* The mask of valid tokens (v->allowed, and their ids in v->allowed_ids);
 * returns how many. */
static int build_mask(cb_con_vocab *v, const cb_con_schema *c, const cb_con_state *s, int strip, int budget_left) {
    memset(v->allowed, 0, (size_t)v->vocab);
    const cb_tokenizer *t = v->tok;
    cb_con_state *after = &v->stack[CB_CON_TOKEN_BYTES + 1];
    const cb_con_thread *th = &s->t[0];
    const cb_con_frame *top = th->depth ? &th->f[th->depth - 1] : NULL;
    const cb_con_node *n = top ? node_at(c, top->node) : NULL;
    if (strip) {
        /* the first text token loses its leading space: no shared prefixes */
        for (int i = 0; i < v->all.n; i++)
            if (token_fits(v, c, s, v->all.ids[i], 1, budget_left, after)) v->allowed[v->all.ids[i]] = 1;
    } else if (s->n == 1 && top && top->kind == F_STR && !n->format && !top->u.str.esc && !top->u.str.need) {
        /* inside a string: plain text tokens fit while maxLength allows */
        const int room = n->max_len - top->u.str.chars;
        const int need = n->min_len > top->u.str.chars ? n->min_len - top->u.str.chars : 0;
        const uint32_t now = cb_con_min_bytes(c, s);
        /* A token of pc characters leaves now - min(pc, need) bytes to go,
         * most for pc = 1: where that fits and maxLength has room for the
         * longest, every plain token fits (the common case: a copy). */
        if (room >= v->max_plain && (budget_left < 0 || now - (uint32_t)(need < 1 ? need : 1) <= (uint32_t)budget_left)) {
            memcpy(v->allowed, v->plain, (size_t)v->vocab);
        } else {
            for (int id = 0; id < v->vocab; id++) { /* by id: plain_chars read in sequence */
                const int pc = v->plain_chars[id];
                if (!pc || pc > room) continue;
                if (budget_left >= 0 && now - (uint32_t)(pc < need ? pc : need) > (uint32_t)budget_left) continue;
                v->allowed[id] = 1;
            }
        }
        walk(v, c, s, &v->loose, budget_left);
    } else if (s->n == 1 && top && top->kind == F_OBJ && top->sub == O_KEY && top->u.obj.kfree && !top->u.obj.cand) {
        /* in a free key no declared key matches: ascii_plain text only
         * moves the key on (up to its 256 bytes), which leaves the shortest
         * completion as it is, so those tokens fit together or not at all;
         * of the others only key_end ones may (a quote closes the key) */
        const int room = 256 - top->u.obj.kpos;
        if (budget_left < 0 || cb_con_min_bytes(c, s) <= (uint32_t)budget_left) {
            if (room >= v->max_key_len) {
                memcpy(v->allowed, v->ascii_plain, (size_t)v->vocab); /* 0 or 1 per token */
            } else {
                for (int id = 0; id < v->vocab; id++) v->allowed[id] = v->key_len[id] && v->key_len[id] <= room;
            }
        }
        walk(v, c, s, &v->keyend, budget_left);
    } else if (s->n == 1 && top && top->kind == F_OBJ && top->sub == O_KEY && top->u.obj.kfree &&
               key_fast_ok(c, s, budget_left) && top->u.obj.kpos + v->max_len < 256) {
        /* in a free key a declared key still matches: printable ASCII but
         * quote and backslash fits, whatever the declared keys */
        memcpy(v->allowed, v->ascii_plain, (size_t)v->vocab); /* 0 or 1 per token */
        walk(v, c, s, &v->unkeyed, budget_left);
    } else {
        walk(v, c, s, &v->all, budget_left);
    }
    for (int i = 0; i < v->n_special; i++)
        if (token_fits(v, c, s, v->special[i], 0, budget_left, after)) v->allowed[v->special[i]] = 1;
    if (cb_con_accepting(c, s)) {
        if (t->eos_id < (uint32_t)v->vocab) v->allowed[t->eos_id] = 1;
        if (t->eot_id < (uint32_t)v->vocab) v->allowed[t->eot_id] = 1;
    }
    /* Eight bytes at a time: away from text few tokens fit. */
    const uint8_t *a = v->allowed;
    int32_t *ids = v->allowed_ids;
    const int vocab = v->vocab;
    int count = 0, i = 0;
    for (; i + 8 <= vocab; i += 8) {
        uint64_t word;
        memcpy(&word, a + i, sizeof word);
        if (!word) continue;
        for (int j = i; j < i + 8; j++) { /* no branch: in text most fit, a few do not */
            ids[count] = j;
            count += a[j] != 0;
        }
    }
    for (; i < vocab; i++)
        if (a[i]) ids[count++] = i;
    v->n_allowed = count;
    return count;
}

/* Bytes the output may still take after this token (-1: no limit). Tokens
 * left after this one must still complete the output; where the budget is
 * already short of that, it is not enforced (length wins). */
static int bytes_left(const cb_con_schema *c, const cb_con_state *s, int budget) {
    if (budget <= 0 || cb_con_min_bytes(c, s) > (uint32_t)budget) return -1;
    return budget - 1;
}

int cb_con_mask(cb_con_vocab *v, const cb_con_schema *c, const cb_con_state *s, int budget, int strip_space) {
    const int budget_left = bytes_left(c, s, budget);
    int n = build_mask(v, c, s, strip_space, budget_left);
    if (!n && budget_left >= 0) n = build_mask(v, c, s, strip_space, -1);
    return n;
}

/* A draw over many candidates reads them all: one try, but four in string
 * or free key text, where most tokens fit and a failed draw would cost a
 * mask over nearly the whole vocabulary. */
int cb_con_draw_tries(const cb_con_schema *c, const cb_con_state *s, int n, int all) {
    if (!all && n <= 64) return 8;
    return mostly_open(c, s) ? 4 : 1;
}

int32_t cb_con_sample(cb_con_vocab *v, const cb_con_schema *c, const cb_con_state *s, cb_sampler *smp,
                      const float *logits, const cb_sampling *p, const int32_t *history, int n_history,
                      cb_rng *rng, int budget, int strip_space) {
    cb_con_state *after = &v->stack[CB_CON_TOKEN_BYTES + 1];
    const int budget_left = bytes_left(c, s, budget);
    /* The sampler's own candidates and weights, restricted to the valid
     * ones: draws from all of them, keeping the first valid token, then
     * (none valid yet) one draw from the valid ones. Either way token t
     * comes with probability q_t / Q (q: the sampler's distribution, Q:
     * its valid mass; after k failed draws, (1 - Q)^k q_t / Q more), and
     * the full mask is only needed when the model wants something invalid. */
    cb_candidates cand;
    cb_sample_candidates(smp, logits, p, history, n_history, &cand);
    const int tries = cand.n == 0 ? 1 : cb_con_draw_tries(c, s, cand.n, cand.all);
    for (int i = 0; i < tries; i++) {
        int32_t t = cb_sample_draw(smp, &cand, rng, NULL);
        if (token_fits(v, c, s, t, strip_space, budget_left, after)) return t;
    }
    if (cand.n == 0 && mostly_open(c, s)) {
        /* Greedy where most tokens fit (string or free key text): the
         * first valid token of the next best is the best valid one (the
         * same order); elsewhere few fit, and the mask is cheaper. */
        int32_t best[4];
        cb_sample_best(smp, 4, best);
        for (int i = 1; i < 4; i++)
            if (token_fits(v, c, s, best[i], strip_space, budget_left, after)) return best[i];
    }
    const float *w = smp->work; /* penalised logits (greedy), or the candidates' weights */
    if (cand.n == 0 || cand.all) {
        int n = build_mask(v, c, s, strip_space, budget_left);
        if (!n && budget_left >= 0) n = build_mask(v, c, s, strip_space, -1);
        if (!n) return -1;
        const int32_t *ids = v->allowed_ids;
        if (cand.n == 0) { /* greedy: the best valid token, ties to the lowest id */
            int32_t best = ids[0];
            for (int i = 1; i < n; i++)
                if (ranks_before(w[ids[i]], ids[i], w[best], best)) best = ids[i];
            return best;
        }
        double total = 0.0;
        for (int i = 0; i < n; i++) total += w[ids[i]];
        if (total > 0.0 && total <= DBL_MAX) {
            const double u = cb_rng_uniform(rng) * total;
            double acc = 0.0;
            for (int i = 0; i < n; i++) {
                acc += w[ids[i]];
                if (acc > u) return ids[i];
            }
            return ids[n - 1];
        }
    } else {
        if (cand.n > 64) {
            build_mask(v, c, s, strip_space, budget_left);
        } else {
            memset(v->allowed, 0, (size_t)v->vocab);
            for (int i = 0; i < cand.n; i++)
                v->allowed[smp->idx[i]] = (uint8_t)token_fits(v, c, s, smp->idx[i], strip_space, budget_left, after);
        }
        int32_t t = cb_sample_draw(smp, &cand, rng, v->allowed);
        if (t >= 0) return t;
    }
    /* No candidate of the sampler is valid: the same sampling over the
     * valid tokens alone (their logits, the others -inf). */
    int n = build_mask(v, c, s, strip_space, budget_left);
    if (!n && budget_left >= 0) n = build_mask(v, c, s, strip_space, -1);
    if (!n) return -1;
    return cb_sample_masked(smp, logits, p, history, n_history, rng, v->allowed);
}

int cb_con_advance(cb_con_vocab *v, const cb_con_schema *c, cb_con_state *s, int32_t id, int strip_space) {
    cb_con_state *after = &v->stack[CB_CON_TOKEN_BYTES + 1];
    if (!token_fits(v, c, s, id, strip_space, -1, after)) return 0;
    if (!cb_is_end_token(v->tok, id)) state_copy(s, after);
    return 1;
}
