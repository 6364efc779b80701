/* RFC 8259 tokeniser and fixed-buffer writer: see json.h. The parser is an
 * explicit state machine with a stack of open containers, so hostile
 * nesting costs a bounded array, never C stack. */
#include "json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- UTF-8 ---- */

/* Length (1..4) of the well-formed UTF-8 sequence at s[0..n), 0 when it is
 * malformed (overlong, surrogate, above U+10FFFF, bad continuation), -1 when
 * it is a valid prefix cut off by the end of the input. Ranges follow the
 * table in RFC 3629 section 4. */
static int utf8_seq_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0], lo = 0x80, hi = 0xbf;
    int need, k;

    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf) {
        need = 1;
    } else if (c >= 0xe0 && c <= 0xef) {
        need = 2;
        if (c == 0xe0)
            lo = 0xa0; /* overlong */
        else if (c == 0xed)
            hi = 0x9f; /* UTF-16 surrogates */
    } else if (c >= 0xf0 && c <= 0xf4) {
        need = 3;
        if (c == 0xf0)
            lo = 0x90; /* overlong */
        else if (c == 0xf4)
            hi = 0x8f; /* above U+10FFFF */
    } else {
        return 0;
    }
    for (k = 1; k <= need; k++) {
        unsigned b;
        if ((size_t)k >= n)
            return -1;
        b = s[k];
        if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xbf))
            return 0;
    }
    return need + 1;
}

static int hex_value(unsigned char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Reads the 4 hex digits at s[i..i+4). 0, -1 when cut short, -2 not hex. */
static int read_hex4(const unsigned char *s, size_t n, size_t i, unsigned *out)
{
    unsigned v = 0;
    size_t k;
    for (k = 0; k < 4; k++) {
        int d;
        if (i + k >= n)
            return -1;
        d = hex_value(s[i + k]);
        if (d < 0)
            return -2;
        v = (v << 4) | (unsigned)d;
    }
    *out = v;
    return 0;
}

static int is_high_surrogate(unsigned cp) { return cp >= 0xd800 && cp <= 0xdbff; }
static int is_low_surrogate(unsigned cp) { return cp >= 0xdc00 && cp <= 0xdfff; }

/* ---- parser ---- */

typedef struct {
    const unsigned char *s;
    size_t len;
    size_t pos;
    cb_json_tok *toks; /* NULL: count only */
    int max_toks;
    int n_toks;
    size_t err_pos;
} json_parser;

static int fail(json_parser *p, size_t at, int err)
{
    p->err_pos = at;
    return err;
}

static void skip_ws(json_parser *p)
{
    while (p->pos < p->len) {
        unsigned char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            break;
        p->pos++;
    }
}

/* Appends a token; returns its index or CB_JSON_ERR_NOMEM. */
static int new_token(json_parser *p, cb_json_type type, size_t start)
{
    if (p->toks != NULL) {
        cb_json_tok *t;
        if (p->n_toks >= p->max_toks)
            return fail(p, start, CB_JSON_ERR_NOMEM);
        t = &p->toks[p->n_toks];
        t->type = (uint8_t)type;
        t->flags = 0;
        t->start = (int32_t)start;
        t->end = (int32_t)start;
        t->size = 0;
        t->next = p->n_toks + 1;
    }
    return p->n_toks++;
}

static void set_span(json_parser *p, int idx, size_t start, size_t end, unsigned flags)
{
    if (p->toks != NULL) {
        p->toks[idx].start = (int32_t)start;
        p->toks[idx].end = (int32_t)end;
        p->toks[idx].flags = (uint8_t)flags;
    }
}

/* The string whose opening quote is at p->pos. */
static int parse_string(json_parser *p)
{
    const unsigned char *s = p->s;
    size_t open = p->pos, i = open + 1;
    unsigned flags = 0;
    int idx = new_token(p, CB_JSON_STRING, open + 1);

    if (idx < 0)
        return idx;
    for (;;) {
        unsigned c;
        if (i >= p->len)
            return fail(p, i, CB_JSON_ERR_EOF);
        c = s[i];
        if (c == '"')
            break;
        if (c < 0x20)
            return fail(p, i, CB_JSON_ERR_CONTROL);
        if (c == '\\') {
            unsigned cp, low;
            int r;
            flags |= CB_JSON_F_ESCAPED;
            if (i + 1 >= p->len)
                return fail(p, i + 1, CB_JSON_ERR_EOF);
            switch (s[i + 1]) {
            case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
                i += 2;
                continue;
            case 'u':
                break;
            default:
                return fail(p, i, CB_JSON_ERR_ESCAPE);
            }
            r = read_hex4(s, p->len, i + 2, &cp);
            if (r != 0)
                return fail(p, r == -1 ? p->len : i, r == -1 ? CB_JSON_ERR_EOF : CB_JSON_ERR_ESCAPE);
            if (is_low_surrogate(cp))
                return fail(p, i, CB_JSON_ERR_ESCAPE);
            if (is_high_surrogate(cp)) {
                /* Must be followed at once by \u and a low surrogate. */
                size_t j = i + 6;
                if (j >= p->len)
                    return fail(p, p->len, CB_JSON_ERR_EOF);
                if (s[j] != '\\')
                    return fail(p, i, CB_JSON_ERR_ESCAPE);
                if (j + 1 >= p->len)
                    return fail(p, p->len, CB_JSON_ERR_EOF);
                if (s[j + 1] != 'u')
                    return fail(p, i, CB_JSON_ERR_ESCAPE);
                r = read_hex4(s, p->len, j + 2, &low);
                if (r == -1)
                    return fail(p, p->len, CB_JSON_ERR_EOF);
                if (r != 0 || !is_low_surrogate(low))
                    return fail(p, i, CB_JSON_ERR_ESCAPE);
                i += 6;
            }
            i += 6;
            continue;
        }
        if (c >= 0x80) {
            int k = utf8_seq_len(s + i, p->len - i);
            if (k < 0)
                return fail(p, p->len, CB_JSON_ERR_EOF);
            if (k == 0)
                return fail(p, i, CB_JSON_ERR_UTF8);
            i += (size_t)k;
            continue;
        }
        i++;
    }
    set_span(p, idx, open + 1, i, flags);
    p->pos = i + 1;
    return idx;
}

static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

/* number = [ "-" ] ( "0" / 1-9 *DIGIT ) [ "." 1*DIGIT ] [ e [sign] 1*DIGIT ] */
static int parse_number(json_parser *p)
{
    const unsigned char *s = p->s;
    size_t start = p->pos, i = start, n = p->len;
    unsigned flags = CB_JSON_F_INTEGER;
    int idx = new_token(p, CB_JSON_NUMBER, start);

    if (idx < 0)
        return idx;
    if (i < n && s[i] == '-')
        i++;
    if (i < n && s[i] == '0') {
        i++;
        if (i < n && is_digit(s[i]))
            return fail(p, i, CB_JSON_ERR_NUMBER); /* leading zero */
    } else if (i < n && is_digit(s[i])) {
        while (i < n && is_digit(s[i]))
            i++;
    } else {
        return fail(p, i, CB_JSON_ERR_NUMBER);
    }
    if (i < n && s[i] == '.') {
        flags = 0;
        i++;
        if (i >= n || !is_digit(s[i]))
            return fail(p, i, CB_JSON_ERR_NUMBER);
        while (i < n && is_digit(s[i]))
            i++;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        flags = 0;
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-'))
            i++;
        if (i >= n || !is_digit(s[i]))
            return fail(p, i, CB_JSON_ERR_NUMBER);
        while (i < n && is_digit(s[i]))
            i++;
    }
    set_span(p, idx, start, i, flags);
    p->pos = i;
    return idx;
}

static int parse_literal(json_parser *p, const char *word, cb_json_type type)
{
    size_t k, n = strlen(word), start = p->pos;
    int idx;
    for (k = 0; k < n; k++) {
        if (start + k >= p->len)
            return fail(p, p->len, CB_JSON_ERR_EOF);
        if (p->s[start + k] != (unsigned char)word[k])
            return fail(p, start + k, CB_JSON_ERR_SYNTAX);
    }
    idx = new_token(p, type, start);
    if (idx < 0)
        return idx;
    set_span(p, idx, start, start + n, 0);
    p->pos = start + n;
    return idx;
}

static void close_container(json_parser *p, int idx)
{
    if (p->toks != NULL) {
        p->toks[idx].end = (int32_t)p->pos;
        p->toks[idx].next = p->n_toks;
    }
}

int cb_json_parse(const char *json, size_t len, cb_json_tok *toks, int max_toks,
                  size_t *err_offset)
{
    enum { WANT_VALUE, WANT_KEY, AFTER_VALUE } state = WANT_VALUE;
    int open_idx[CB_JSON_MAX_DEPTH];
    unsigned char open_type[CB_JSON_MAX_DEPTH];
    int depth = 0, r;
    json_parser p;

    p.s = (const unsigned char *)json;
    p.len = len;
    p.pos = 0;
    p.toks = toks;
    p.max_toks = max_toks;
    p.n_toks = 0;
    p.err_pos = 0;

    if (len >= (size_t)INT32_MAX) {
        r = fail(&p, 0, CB_JSON_ERR_TOO_BIG);
        goto out;
    }
    for (;;) {
        unsigned char c;
        skip_ws(&p);

        if (state == AFTER_VALUE) {
            int in_object;
            if (depth == 0) {
                r = p.pos == len ? p.n_toks : fail(&p, p.pos, CB_JSON_ERR_TRAILING);
                goto out;
            }
            if (p.pos >= len) {
                r = fail(&p, len, CB_JSON_ERR_EOF);
                goto out;
            }
            c = p.s[p.pos];
            in_object = open_type[depth - 1] == CB_JSON_OBJECT;
            if (c == ',') {
                p.pos++;
                state = in_object ? WANT_KEY : WANT_VALUE;
            } else if (c == (in_object ? '}' : ']')) {
                p.pos++;
                close_container(&p, open_idx[--depth]);
            } else {
                r = fail(&p, p.pos, CB_JSON_ERR_SYNTAX);
                goto out;
            }
            continue;
        }

        if (p.pos >= len) {
            r = fail(&p, len, CB_JSON_ERR_EOF);
            goto out;
        }
        c = p.s[p.pos];

        if (state == WANT_KEY) {
            /* A '}' here follows a comma: trailing commas are invalid. */
            if (c != '"') {
                r = fail(&p, p.pos, CB_JSON_ERR_SYNTAX);
                goto out;
            }
            if ((r = parse_string(&p)) < 0)
                goto out;
            if (toks != NULL)
                toks[open_idx[depth - 1]].size++;
            skip_ws(&p);
            if (p.pos >= len) {
                r = fail(&p, len, CB_JSON_ERR_EOF);
                goto out;
            }
            if (p.s[p.pos] != ':') {
                r = fail(&p, p.pos, CB_JSON_ERR_SYNTAX);
                goto out;
            }
            p.pos++;
            state = WANT_VALUE;
            continue;
        }

        /* WANT_VALUE */
        if (toks != NULL && depth > 0 && open_type[depth - 1] == CB_JSON_ARRAY)
            toks[open_idx[depth - 1]].size++;
        switch (c) {
        case '{':
        case '[': {
            cb_json_type type = c == '{' ? CB_JSON_OBJECT : CB_JSON_ARRAY;
            if (depth == CB_JSON_MAX_DEPTH) {
                r = fail(&p, p.pos, CB_JSON_ERR_DEPTH);
                goto out;
            }
            if ((r = new_token(&p, type, p.pos)) < 0)
                goto out;
            open_idx[depth] = r;
            open_type[depth] = (unsigned char)type;
            depth++;
            p.pos++;
            skip_ws(&p);
            if (p.pos < len && p.s[p.pos] == (c == '{' ? '}' : ']')) {
                p.pos++;
                close_container(&p, open_idx[--depth]);
                state = AFTER_VALUE;
            } else {
                state = type == CB_JSON_OBJECT ? WANT_KEY : WANT_VALUE;
            }
            continue;
        }
        case '"':
            r = parse_string(&p);
            break;
        case 't':
            r = parse_literal(&p, "true", CB_JSON_TRUE);
            break;
        case 'f':
            r = parse_literal(&p, "false", CB_JSON_FALSE);
            break;
        case 'n':
            r = parse_literal(&p, "null", CB_JSON_NULL);
            break;
        default:
            if (c == '-' || is_digit(c))
                r = parse_number(&p);
            else
                r = fail(&p, p.pos, CB_JSON_ERR_SYNTAX);
            break;
        }
        if (r < 0)
            goto out;
        state = AFTER_VALUE;
    }
out:
    if (r < 0 && err_offset != NULL)
        *err_offset = p.err_pos;
    return r;
}

const char *cb_json_strerror(int err)
{
    switch (err) {
    case CB_JSON_ERR_NOMEM: return "document has too many values";
    case CB_JSON_ERR_EOF: return "unexpected end of document";
    case CB_JSON_ERR_SYNTAX: return "unexpected character";
    case CB_JSON_ERR_NUMBER: return "malformed number";
    case CB_JSON_ERR_CONTROL: return "control character in string";
    case CB_JSON_ERR_ESCAPE: return "invalid escape in string";
    case CB_JSON_ERR_UTF8: return "invalid UTF-8 in string";
    case CB_JSON_ERR_DEPTH: return "nesting too deep";
    case CB_JSON_ERR_TRAILING: return "unexpected data after the document";
    case CB_JSON_ERR_TOO_BIG: return "document too large";
    default: return err >= 0 ? "no error" : "unknown error";
    }
}

/* ---- reading helpers ---- */

static size_t put_utf8(unsigned cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xe0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

int cb_json_unescape(const char *json, const cb_json_tok *t, char *out, size_t cap)
{
    const unsigned char *s;
    size_t n, i = 0, o = 0;

    if (t->type != CB_JSON_STRING || t->end < t->start)
        return -2;
    s = (const unsigned char *)json + t->start;
    n = (size_t)(t->end - t->start);
    while (i < n) {
        char enc[4];
        size_t k;
        unsigned cp;

        if (s[i] != '\\') {
            if (o + 1 >= cap)
                return -1;
            out[o++] = (char)s[i++];
            continue;
        }
        if (i + 1 >= n)
            return -2;
        switch (s[i + 1]) {
        case '"': cp = '"'; break;
        case '\\': cp = '\\'; break;
        case '/': cp = '/'; break;
        case 'b': cp = '\b'; break;
        case 'f': cp = '\f'; break;
        case 'n': cp = '\n'; break;
        case 'r': cp = '\r'; break;
        case 't': cp = '\t'; break;
        case 'u': {
            unsigned low;
            if (read_hex4(s, n, i + 2, &cp) != 0 || is_low_surrogate(cp))
                return -2;
            if (is_high_surrogate(cp)) {
                if (i + 7 >= n || s[i + 6] != '\\' || s[i + 7] != 'u' ||
                    read_hex4(s, n, i + 8, &low) != 0 || !is_low_surrogate(low))
                    return -2;
                cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
                i += 6;
            }
            i += 4; /* plus the 2 below */
            break;
        }
        default:
            return -2;
        }
        i += 2;
        k = put_utf8(cp, enc);
        if (o + k >= cap)
            return -1;
        memcpy(out + o, enc, k);
        o += k;
    }
    if (cap == 0)
        return -1;
    out[o] = '\0';
    return (int)o;
}

int cb_json_str_eq(const char *json, const cb_json_tok *t, const char *s)
{
    char tmp[256];
    size_t n = strlen(s);
    int k;

    if (t->type != CB_JSON_STRING)
        return 0;
    if (!(t->flags & CB_JSON_F_ESCAPED))
        return (size_t)(t->end - t->start) == n && memcmp(json + t->start, s, n) == 0;
    k = cb_json_unescape(json, t, tmp, sizeof tmp);
    return k >= 0 && (size_t)k == n && memcmp(tmp, s, n) == 0;
}

int cb_json_find(const char *json, const cb_json_tok *toks, int obj, const char *key)
{
    int i, k, found = -1;
    if (toks[obj].type != CB_JSON_OBJECT)
        return -1;
    for (i = obj + 1, k = 0; k < toks[obj].size; k++, i = toks[i + 1].next) {
        if (cb_json_str_eq(json, &toks[i], key))
            found = i + 1;
    }
    return found;
}

int cb_json_array_at(const cb_json_tok *toks, int arr, int n)
{
    int i, k;
    if (toks[arr].type != CB_JSON_ARRAY || n < 0 || n >= toks[arr].size)
        return -1;
    for (i = arr + 1, k = 0; k < n; k++)
        i = toks[i].next;
    return i;
}

int cb_json_get_int64(const char *json, const cb_json_tok *t, int64_t *out)
{
    const char *s = json + t->start, *end = json + t->end;
    int negative = 0;
    uint64_t v = 0, limit;

    if (t->type != CB_JSON_NUMBER || !(t->flags & CB_JSON_F_INTEGER))
        return -1;
    if (s < end && *s == '-') {
        negative = 1;
        s++;
    }
    limit = negative ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    for (; s < end; s++) {
        unsigned d = (unsigned)(*s - '0');
        if (v > (limit - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    /* INT64_MIN has no positive twin: negate only what fits. */
    if (negative)
        *out = v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v;
    else
        *out = (int64_t)v;
    return 0;
}

int cb_json_get_double(const char *json, const cb_json_tok *t, double *out)
{
    char tmp[512];
    size_t n;
    double v;

    if (t->type != CB_JSON_NUMBER)
        return -1;
    n = (size_t)(t->end - t->start);
    if (n >= sizeof tmp)
        return -1;
    /* strtod needs a terminated string; the document is not. It follows
     * the C locale, which the server never changes. */
    memcpy(tmp, json + t->start, n);
    tmp[n] = '\0';
    v = strtod(tmp, NULL);
    if (!isfinite(v))
        return -1;
    *out = v;
    return 0;
}

int cb_json_get_bool(const cb_json_tok *t, int *out)
{
    if (t->type == CB_JSON_TRUE)
        *out = 1;
    else if (t->type == CB_JSON_FALSE)
        *out = 0;
    else
        return -1;
    return 0;
}

/* ---- writer ---- */

void cb_jw_init(cb_jw *w, char *buf, size_t cap)
{
    w->buf = buf;
    w->cap = cap;
    w->len = 0;
    w->overflow = cap == 0;
    w->depth = 0;
    w->after_key = 0;
    w->has_items = 0;
    if (cap > 0)
        buf[0] = '\0';
}

/* All or nothing: a piece that does not fit sets overflow and stops all
 * later writes, so the buffer never holds a half-written token. */
static void put(cb_jw *w, const char *s, size_t n)
{
    if (w->overflow)
        return;
    if (n >= w->cap - w->len) {
        w->overflow = 1;
        return;
    }
    memcpy(w->buf + w->len, s, n);
    w->len += n;
    w->buf[w->len] = '\0';
}

/* Comma before every element of a container but the first. */
static void before_value(cb_jw *w)
{
    uint64_t bit;
    if (w->after_key) {
        w->after_key = 0;
        return;
    }
    if (w->depth == 0)
        return;
    bit = (uint64_t)1 << (w->depth - 1);
    if (w->has_items & bit)
        put(w, ",", 1);
    w->has_items |= bit;
}

static void open_container(cb_jw *w, char c)
{
    before_value(w);
    if (w->depth == CB_JSON_MAX_DEPTH) {
        w->overflow = 1;
        return;
    }
    put(w, &c, 1);
    w->depth++;
    w->has_items &= ~((uint64_t)1 << (w->depth - 1));
}

static void close_container_w(cb_jw *w, char c)
{
    if (w->depth == 0 || w->after_key) { /* unbalanced, or a key without value */
        w->overflow = 1;
        return;
    }
    w->depth--;
    w->after_key = 0;
    put(w, &c, 1);
}

void cb_jw_begin_object(cb_jw *w) { open_container(w, '{'); }
void cb_jw_end_object(cb_jw *w) { close_container_w(w, '}'); }
void cb_jw_begin_array(cb_jw *w) { open_container(w, '['); }
void cb_jw_end_array(cb_jw *w) { close_container_w(w, ']'); }

static void put_escaped(cb_jw *w, const char *str, size_t n)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0, run = 0;

    put(w, "\"", 1);
    while (i < n) {
        unsigned char c = s[i];
        char esc[8];
        const char *rep;
        size_t rep_len = 2;

        if (c >= 0x20 && c != '"' && c != '\\' && c < 0x80) {
            i++;
            continue;
        }
        size_t skip = 1;
        if (c >= 0x80) {
            int k = utf8_seq_len(s + i, n - i);
            if (k > 0) {
                i += (size_t)k;
                continue;
            }
            if (k < 0) /* a character cut by the end: one U+FFFD for all of it */
                skip = n - i;
        }
        put(w, str + run, i - run); /* the clean run before this byte */
        switch (c) {
        case '"': rep = "\\\""; break;
        case '\\': rep = "\\\\"; break;
        case '\n': rep = "\\n"; break;
        case '\r': rep = "\\r"; break;
        case '\t': rep = "\\t"; break;
        case '\b': rep = "\\b"; break;
        case '\f': rep = "\\f"; break;
        default:
            if (c >= 0x80) {
                rep = "\xef\xbf\xbd"; /* U+FFFD for a byte that is not UTF-8 */
                rep_len = 3;
            } else {
                snprintf(esc, sizeof esc, "\\u%04x", c);
                rep = esc;
                rep_len = 6;
            }
            break;
        }
        put(w, rep, rep_len);
        i += skip;
        run = i;
    }
    put(w, str + run, n - run);
    put(w, "\"", 1);
}

void cb_jw_key(cb_jw *w, const char *key)
{
    before_value(w);
    put_escaped(w, key, strlen(key));
    put(w, ":", 1);
    w->after_key = 1;
}

void cb_jw_str_n(cb_jw *w, const char *s, size_t n)
{
    before_value(w);
    put_escaped(w, s, n);
}

void cb_jw_str(cb_jw *w, const char *s) { cb_jw_str_n(w, s, strlen(s)); }

void cb_jw_int(cb_jw *w, int64_t v)
{
    char tmp[24];
    int n = snprintf(tmp, sizeof tmp, "%lld", (long long)v);
    before_value(w);
    put(w, tmp, (size_t)n);
}

void cb_jw_double(cb_jw *w, double v)
{
    char tmp[32];
    int n, k;
    if (!isfinite(v)) {
        cb_jw_null(w);
        return;
    }
    n = snprintf(tmp, sizeof tmp, "%.9g", v);
    /* A locale with a decimal comma would make invalid JSON. */
    for (k = 0; k < n; k++) {
        if (tmp[k] == ',')
            tmp[k] = '.';
    }
    before_value(w);
    put(w, tmp, (size_t)n);
}

void cb_jw_bool(cb_jw *w, int v)
{
    before_value(w);
    if (v)
        put(w, "true", 4);
    else
        put(w, "false", 5);
}

void cb_jw_null(cb_jw *w)
{
    before_value(w);
    put(w, "null", 4);
}

void cb_jw_raw(cb_jw *w, const char *json, size_t n)
{
    before_value(w);
    put(w, json, n);
}

void cb_jw_openai_error(cb_jw *w, const char *message, const char *type)
{
    cb_jw_openai_error_ex(w, message, type, NULL, NULL);
}

void cb_jw_openai_error_ex(cb_jw *w, const char *message, const char *type, const char *param,
                           const char *code)
{
    cb_jw_begin_object(w);
    cb_jw_key(w, "error");
    cb_jw_begin_object(w);
    cb_jw_key(w, "message");
    cb_jw_str(w, message);
    cb_jw_key(w, "type");
    cb_jw_str(w, type);
    cb_jw_key(w, "param");
    if (param) cb_jw_str(w, param);
    else cb_jw_null(w);
    cb_jw_key(w, "code");
    if (code) cb_jw_str(w, code);
    else cb_jw_null(w);
    cb_jw_end_object(w);
    cb_jw_end_object(w);
}
