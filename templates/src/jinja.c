#if !defined(_WIN32) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L /* localtime_r */
#endif
#include "jinja.h"

#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_DEPTH 200            /* nested evaluation (macros calling macros...) */
#define MAX_STEPS 20000000L      /* nodes evaluated in one render: a bound on loops over range(10**9) */
#define MAX_PARSE_DEPTH 150      /* nested expressions and tags */

/* ------------------------------------------------------------------ */
/* Lexer                                                              */

enum { T_TEXT, T_VAR_BEGIN, T_VAR_END, T_BLOCK_BEGIN, T_BLOCK_END, T_NAME, T_STRING, T_INT, T_FLOAT, T_OP, T_EOF };

typedef struct {
    uint8_t type;
    char op[3];
    int line;
    const char *s; /* text, name or (unescaped) string */
    size_t n;
    int64_t i;
    double f;
} token;

typedef struct node node;

struct cb_jinja {
    char *src; /* newline-normalised copy */
    size_t src_len;
    uint8_t *mem;
    size_t mem_used, mem_cap;
    token *toks;
    int n_toks, cap_toks, pos, depth;
    node *body;
    jmp_buf fail;
    char *err;
    size_t err_len;
};

#if defined(__GNUC__) || defined(__clang__)
#define NORETURN __attribute__((noreturn))
#else
#define NORETURN
#endif

NORETURN static void perr(cb_jinja *t, int line, const char *fmt, ...) {
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(t->err, t->err_len, "line %d: %s", line, msg);
    longjmp(t->fail, 1);
}

static void *ptake(cb_jinja *t, size_t n) {
    n = (n + 7) & ~(size_t)7;
    if (n > t->mem_cap - t->mem_used) perr(t, 0, "the template is too large to parse");
    void *p = t->mem + t->mem_used;
    t->mem_used += n;
    memset(p, 0, n);
    return p;
}

static token *new_tok(cb_jinja *t, int type, int line) {
    if (t->n_toks == t->cap_toks) {
        int cap = t->cap_toks ? t->cap_toks * 2 : 256;
        token *nt = ptake(t, sizeof(token) * (size_t)cap);
        if (t->n_toks) memcpy(nt, t->toks, sizeof(token) * (size_t)t->n_toks);
        t->toks = nt, t->cap_toks = cap;
    }
    token *k = &t->toks[t->n_toks++];
    memset(k, 0, sizeof *k);
    k->type = (uint8_t)type, k->line = line;
    return k;
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
static int is_name0(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static int is_digit(char c) { return c >= '0' && c <= '9'; }

static int count_lines(const char *s, size_t from, size_t to) {
    int n = 0;
    for (size_t i = from; i < to; i++) n += s[i] == '\n';
    return n;
}

static void put_utf8(char *out, size_t *n, uint32_t cp) {
    if (cp < 0x80) out[(*n)++] = (char)cp;
    else if (cp < 0x800) out[(*n)++] = (char)(0xC0 | (cp >> 6)), out[(*n)++] = (char)(0x80 | (cp & 63));
    else if (cp < 0x10000)
        out[(*n)++] = (char)(0xE0 | (cp >> 12)), out[(*n)++] = (char)(0x80 | ((cp >> 6) & 63)),
        out[(*n)++] = (char)(0x80 | (cp & 63));
    else
        out[(*n)++] = (char)(0xF0 | (cp >> 18)), out[(*n)++] = (char)(0x80 | ((cp >> 12) & 63)),
        out[(*n)++] = (char)(0x80 | ((cp >> 6) & 63)), out[(*n)++] = (char)(0x80 | (cp & 63));
}

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* A quoted string literal from s[*i] (the quote); Python's escapes. */
static void lex_string(cb_jinja *t, size_t *i, int line) {
    const char *s = t->src;
    char q = s[*i];
    size_t j = *i + 1;
    while (j < t->src_len && s[j] != q) j += s[j] == '\\' ? 2 : 1;
    if (j >= t->src_len) perr(t, line, "unterminated string");
    char *out = ptake(t, j - *i + 4);
    size_t n = 0;
    for (size_t k = *i + 1; k < j; k++) {
        if (s[k] != '\\') {
            out[n++] = s[k];
            continue;
        }
        char e = s[++k];
        int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (digits) {
            uint32_t cp = 0;
            int ok = k + (size_t)digits < j;
            for (int d = 1; ok && d <= digits; d++) {
                int h = hexval(s[k + (size_t)d]);
                if (h < 0) ok = 0;
                else cp = cp * 16 + (uint32_t)h;
            }
            if (!ok || cp > 0x10FFFF) perr(t, line, "bad \\%c escape in a string", e);
            put_utf8(out, &n, cp);
            k += (size_t)digits;
            continue;
        }
        switch (e) {
        case 'n': out[n++] = '\n'; break;
        case 't': out[n++] = '\t'; break;
        case 'r': out[n++] = '\r'; break;
        case '\\': out[n++] = '\\'; break;
        case '\'': out[n++] = '\''; break;
        case '"': out[n++] = '"'; break;
        case 'a': out[n++] = '\a'; break;
        case 'b': out[n++] = '\b'; break;
        case 'f': out[n++] = '\f'; break;
        case 'v': out[n++] = '\v'; break;
        case '0': out[n++] = '\0'; break;
        case '\n': break;
        default: out[n++] = '\\', out[n++] = e;
        }
    }
    token *k = new_tok(t, T_STRING, line);
    k->s = out, k->n = n;
    *i = j + 1;
}

/* Expression tokens inside a tag, up to its end ("}}" or "%}", with "-" or
 * "+" before it); returns the position after the end and whether it had "-". */
static size_t lex_tag(cb_jinja *t, size_t i, int block, int *line, int *strip_after, int *keep_newline) {
    const char *s = t->src;
    const size_t n = t->src_len;
    int depth = 0;
    char end = block ? '%' : '}';
    for (;;) {
        while (i < n && is_space(s[i])) {
            if (s[i] == '\n') (*line)++;
            i++;
        }
        if (i >= n) perr(t, *line, "the %s tag is not closed", block ? "{%" : "{{");
        if (depth == 0) {
            if ((s[i] == '-' || s[i] == '+') && i + 2 < n && s[i + 1] == end && s[i + 2] == '}') {
                *strip_after = s[i] == '-', *keep_newline = s[i] == '+';
                new_tok(t, block ? T_BLOCK_END : T_VAR_END, *line);
                return i + 3;
            }
            if (s[i] == end && i + 1 < n && s[i + 1] == '}') {
                *strip_after = 0, *keep_newline = 0;
                new_tok(t, block ? T_BLOCK_END : T_VAR_END, *line);
                return i + 2;
            }
        }
        char c = s[i];
        if (c == '\'' || c == '"') {
            lex_string(t, &i, *line);
        } else if (is_digit(c)) {
            size_t j = i;
            int is_float = 0;
            while (j < n && (is_digit(s[j]) || s[j] == '_')) j++;
            if (j + 1 < n && s[j] == '.' && is_digit(s[j + 1])) {
                is_float = 1, j++;
                while (j < n && (is_digit(s[j]) || s[j] == '_')) j++;
            }
            if (j < n && (s[j] == 'e' || s[j] == 'E')) {
                size_t k = j + 1;
                if (k < n && (s[k] == '+' || s[k] == '-')) k++;
                if (k < n && is_digit(s[k])) {
                    is_float = 1, j = k;
                    while (j < n && is_digit(s[j])) j++;
                }
            }
            char buf[64];
            size_t m = 0;
            for (size_t k = i; k < j && m < sizeof buf - 1; k++)
                if (s[k] != '_') buf[m++] = s[k];
            buf[m] = 0;
            token *k = new_tok(t, is_float ? T_FLOAT : T_INT, *line);
            if (is_float) k->f = strtod(buf, NULL);
            else k->i = strtoll(buf, NULL, 10);
            i = j;
        } else if (is_name0(c)) {
            size_t j = i;
            while (j < n && (is_name0(s[j]) || is_digit(s[j]))) j++;
            token *k = new_tok(t, T_NAME, *line);
            k->s = s + i, k->n = j - i;
            i = j;
        } else {
            static const char *two[] = {"//", "**", "==", "!=", "<=", ">="};
            token *k = new_tok(t, T_OP, *line);
            k->op[0] = c;
            for (size_t w = 0; w < sizeof two / sizeof *two; w++)
                if (i + 1 < n && c == two[w][0] && s[i + 1] == two[w][1]) k->op[1] = s[i + 1];
            if (!strchr("+-*/%~<>=|.,:()[]{}!", c) || (c == '!' && !k->op[1]))
                perr(t, *line, "unexpected character '%c'", c);
            if (c == '(' || c == '[' || c == '{') depth++;
            if ((c == ')' || c == ']' || c == '}') && depth > 0) depth--;
            i += k->op[1] ? 2 : 1;
        }
    }
}

static int only_blanks(const char *s, size_t from, size_t to) {
    for (size_t i = from; i < to; i++)
        if (s[i] != ' ' && s[i] != '\t') return 0;
    return 1;
}

static void emit_text(cb_jinja *t, size_t from, size_t to, int line) {
    if (to <= from) return;
    token *k = new_tok(t, T_TEXT, line);
    k->s = t->src + from, k->n = to - from;
}

/* Matches "{%[-+]? *name *[-+]?%}" at i; returns its end, or 0. */
static size_t block_named(const cb_jinja *t, size_t i, const char *name, int *strip_before, int *strip_after) {
    const char *s = t->src;
    size_t n = t->src_len, j = i + 2, len = strlen(name);
    if (i + 2 > n || s[i] != '{' || s[i + 1] != '%') return 0;
    *strip_before = j < n && s[j] == '-';
    if (j < n && (s[j] == '-' || s[j] == '+')) j++;
    while (j < n && is_space(s[j])) j++;
    if (j + len > n || memcmp(s + j, name, len) != 0) return 0;
    j += len;
    while (j < n && is_space(s[j])) j++;
    *strip_after = j < n && s[j] == '-';
    if (j < n && (s[j] == '-' || s[j] == '+')) j++;
    if (j + 2 > n || s[j] != '%' || s[j + 1] != '}') return 0;
    return j + 2;
}

static void lex(cb_jinja *t) {
    const char *s = t->src;
    const size_t n = t->src_len;
    size_t i = 0;
    int line = 1, line_starting = 1;
    while (i < n) {
        /* Text up to the next tag. */
        size_t j = i;
        while (j + 1 < n && !(s[j] == '{' && (s[j + 1] == '{' || s[j + 1] == '%' || s[j + 1] == '#'))) j++;
        if (j + 1 >= n) {
            emit_text(t, i, n, line);
            break;
        }
        char kind = s[j + 1];
        char mod = j + 2 < n ? s[j + 2] : 0;
        size_t text_end = j;
        if (mod == '-') {
            while (text_end > i && is_space(s[text_end - 1])) text_end--;
        } else if (kind != '{' && mod != '+') {
            /* lstrip_blocks: blanks between the line's start and a block or comment tag */
            size_t l = text_end;
            while (l > i && s[l - 1] != '\n') l--;
            if ((l > i || line_starting) && only_blanks(s, l, text_end)) text_end = l;
        }
        int strip_after = 0, keep_newline = 0;
        int rb, ra;
        size_t raw_end = block_named(t, j, "raw", &rb, &ra);
        if (kind == '%' && raw_end) {
            emit_text(t, i, text_end, line);
            line += count_lines(s, i, raw_end);
            size_t k = raw_end, close = 0;
            int eb = 0, ea = 0;
            for (; k + 1 < n; k++)
                if (s[k] == '{' && s[k + 1] == '%' && (close = block_named(t, k, "endraw", &eb, &ea))) break;
            if (!close) perr(t, line, "{%% raw %%} is not closed by {%% endraw %%}");
            size_t from = raw_end, to = k;
            if (ra)
                while (from < to && is_space(s[from])) from++;
            else if (from < to && s[from] == '\n')
                from++;
            if (eb)
                while (to > from && is_space(s[to - 1])) to--;
            emit_text(t, from, to, line);
            line += count_lines(s, raw_end, close);
            i = close;
            strip_after = ea;
        } else {
            emit_text(t, i, text_end, line);
            line += count_lines(s, i, j);
            size_t p = j + 2 + (mod == '-' || mod == '+');
            if (kind == '#') {
                size_t k = p;
                while (k + 1 < n && !(s[k] == '#' && s[k + 1] == '}')) k++;
                if (k + 1 >= n) perr(t, line, "the comment is not closed");
                strip_after = s[k - 1] == '-' && k > p;
                keep_newline = s[k - 1] == '+' && k > p;
                line += count_lines(s, p, k);
                i = k + 2;
            } else {
                new_tok(t, kind == '{' ? T_VAR_BEGIN : T_BLOCK_BEGIN, line);
                i = lex_tag(t, p, kind == '%', &line, &strip_after, &keep_newline);
            }
        }
        line_starting = 0;
        if (strip_after) {
            while (i < n && is_space(s[i])) {
                line_starting = s[i] == '\n';
                if (s[i] == '\n') line++;
                i++;
            }
        } else if (kind != '{' && !keep_newline && i < n && s[i] == '\n') { /* trim_blocks */
            i++, line++, line_starting = 1;
        }
    }
    new_tok(t, T_EOF, line);
}

/* ------------------------------------------------------------------ */
/* Parser                                                             */

enum {
    /* statements */
    S_TEXT, S_OUT, S_IF, S_FOR, S_SET, S_SETBLOCK, S_MACRO, S_BREAK, S_CONTINUE, S_CALLBLOCK,
    /* expressions */
    E_CONST, E_NAME, E_ATTR, E_ITEM, E_SLICE, E_CALL, E_FILTER, E_TEST, E_NEG, E_POS, E_NOT, E_AND, E_OR, E_BIN,
    E_COND, E_LIST, E_TUPLE, E_DICT, E_KWARG, E_NONE_ARG
};
enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_CONCAT, OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT,
       OP_GE, OP_IN, OP_NOTIN };

enum { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_NS, V_MACRO, V_LOOP, V_FUNC };

typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct jloop jloop;

typedef struct {
    uint8_t t;
    uint8_t tuple; /* a list that is a Python tuple (its repr) */
    size_t n;      /* string length */
    union {
        int64_t i;
        double f;
        const char *s; /* string; for undefined, its name (may be NULL) */
        jlist *l;
        jdict *d;
        const node *m;
        jloop *lp;
    } u;
} jv;

struct jlist {
    jv *v;
    size_t n, cap;
};
struct jdict {
    jv *k, *v;
    size_t n, cap;
};
struct jloop {
    jlist *items;
    size_t index;
};

struct node {
    uint8_t kind, op, neg;
    int line;
    node *a, *b, *c, *d, *next;
    const char *s;
    size_t n;
    jv val;
};

static const token *peek(cb_jinja *t) { return &t->toks[t->pos]; }
static const token *next_tok(cb_jinja *t) {
    const token *k = &t->toks[t->pos];
    if (k->type != T_EOF) t->pos++;
    return k;
}
static int is_op(const token *k, const char *op) { return k->type == T_OP && !strcmp(k->op, op); }
static int is_name(const token *k, const char *name) {
    return k->type == T_NAME && k->n == strlen(name) && !memcmp(k->s, name, k->n);
}
static void expect_op(cb_jinja *t, const char *op) {
    const token *k = next_tok(t);
    if (!is_op(k, op)) perr(t, k->line, "expected '%s'", op);
}
static const token *expect_name(cb_jinja *t) {
    const token *k = next_tok(t);
    if (k->type != T_NAME) perr(t, k->line, "expected a name");
    return k;
}
static node *new_node(cb_jinja *t, int kind, int line) {
    node *x = ptake(t, sizeof *x);
    x->kind = (uint8_t)kind, x->line = line;
    return x;
}

static node *parse_expr(cb_jinja *t);
static node *parse_or(cb_jinja *t);
static node *parse_unary(cb_jinja *t, int with_filter);

/* Call arguments after "(": positional then name=value (E_KWARG). */
static node *parse_args(cb_jinja *t) {
    node *head = NULL, **tail = &head;
    while (!is_op(peek(t), ")")) {
        node *arg;
        if (peek(t)->type == T_NAME && is_op(&t->toks[t->pos + 1], "=")) {
            const token *name = next_tok(t);
            next_tok(t);
            arg = new_node(t, E_KWARG, name->line);
            arg->s = name->s, arg->n = name->n, arg->a = parse_expr(t);
        } else {
            arg = parse_expr(t);
        }
        *tail = arg, tail = &arg->next;
        if (!is_op(peek(t), ",")) break;
        next_tok(t);
    }
    expect_op(t, ")");
    return head;
}

static node *parse_primary(cb_jinja *t) {
    const token *k = next_tok(t);
    node *x;
    switch (k->type) {
    case T_STRING: {
        x = new_node(t, E_CONST, k->line);
        x->val.t = V_STR, x->val.u.s = k->s, x->val.n = k->n;
        /* adjacent literals concatenate, as in Python */
        while (peek(t)->type == T_STRING) {
            const token *m = next_tok(t);
            char *s = ptake(t, x->val.n + m->n + 1);
            memcpy(s, x->val.u.s, x->val.n), memcpy(s + x->val.n, m->s, m->n);
            x->val.u.s = s, x->val.n += m->n;
        }
        return x;
    }
    case T_INT: x = new_node(t, E_CONST, k->line), x->val.t = V_INT, x->val.u.i = k->i; return x;
    case T_FLOAT: x = new_node(t, E_CONST, k->line), x->val.t = V_FLOAT, x->val.u.f = k->f; return x;
    case T_NAME:
        x = new_node(t, E_CONST, k->line);
        if (is_name(k, "true") || is_name(k, "True")) x->val.t = V_BOOL, x->val.u.i = 1;
        else if (is_name(k, "false") || is_name(k, "False")) x->val.t = V_BOOL, x->val.u.i = 0;
        else if (is_name(k, "none") || is_name(k, "None")) x->val.t = V_NONE;
        else x->kind = E_NAME, x->s = k->s, x->n = k->n;
        return x;
    case T_OP:
        if (is_op(k, "(")) {
            if (is_op(peek(t), ")")) {
                next_tok(t);
                x = new_node(t, E_TUPLE, k->line);
                return x;
            }
            node *first = parse_expr(t);
            if (!is_op(peek(t), ",")) {
                expect_op(t, ")");
                return first;
            }
            x = new_node(t, E_TUPLE, k->line);
            x->a = first;
            node **tail = &first->next;
            while (is_op(peek(t), ",")) {
                next_tok(t);
                if (is_op(peek(t), ")")) break;
                node *e = parse_expr(t);
                *tail = e, tail = &e->next;
            }
            expect_op(t, ")");
            return x;
        }
        if (is_op(k, "[")) {
            x = new_node(t, E_LIST, k->line);
            node **tail = &x->a;
            while (!is_op(peek(t), "]")) {
                node *e = parse_expr(t);
                *tail = e, tail = &e->next;
                if (!is_op(peek(t), ",")) break;
                next_tok(t);
            }
            expect_op(t, "]");
            return x;
        }
        if (is_op(k, "{")) {
            x = new_node(t, E_DICT, k->line);
            node **tail = &x->a;
            while (!is_op(peek(t), "}")) {
                node *key = parse_expr(t);
                expect_op(t, ":");
                key->next = NULL;
                node *pair = new_node(t, E_KWARG, key->line);
                pair->a = key, pair->b = parse_expr(t);
                *tail = pair, tail = &pair->next;
                if (!is_op(peek(t), ",")) break;
                next_tok(t);
            }
            expect_op(t, "}");
            return x;
        }
        break;
    default: break;
    }
    perr(t, k->line, k->type == T_EOF ? "unexpected end of template"
                     : k->type == T_BLOCK_END || k->type == T_VAR_END ? "expected an expression before the tag's end"
                                                                        : "unexpected '%.*s'",
         k->type == T_OP ? (int)strlen(k->op) : (int)k->n, k->type == T_OP ? k->op : k->s);
    return NULL;
}

static node *parse_postfix(cb_jinja *t, node *x) {
    for (;;) {
        const token *k = peek(t);
        if (is_op(k, ".")) {
            next_tok(t);
            const token *name = next_tok(t);
            node *y = new_node(t, E_ATTR, k->line);
            y->a = x;
            if (name->type == T_NAME) y->s = name->s, y->n = name->n;
            else if (name->type == T_INT) { /* x.0 is x[0] */
                y->kind = E_ITEM;
                y->b = new_node(t, E_CONST, k->line);
                y->b->val.t = V_INT, y->b->val.u.i = name->i;
            } else perr(t, k->line, "expected a name after '.'");
            x = y;
        } else if (is_op(k, "[")) {
            next_tok(t);
            node *y = new_node(t, E_ITEM, k->line);
            y->a = x;
            node *parts[3] = {NULL, NULL, NULL};
            int colons = 0;
            for (;;) {
                if (is_op(peek(t), "]")) break;
                if (is_op(peek(t), ":")) {
                    if (++colons > 2) perr(t, k->line, "bad slice");
                    next_tok(t);
                    continue;
                }
                parts[colons] = parse_expr(t);
            }
            expect_op(t, "]");
            if (colons) y->kind = E_SLICE, y->b = parts[0], y->c = parts[1], y->d = parts[2];
            else if (!parts[0]) perr(t, k->line, "expected an index");
            else y->b = parts[0];
            x = y;
        } else if (is_op(k, "(")) {
            next_tok(t);
            node *y = new_node(t, E_CALL, k->line);
            y->a = x, y->b = parse_args(t);
            x = y;
        } else {
            return x;
        }
    }
}

static node *parse_filters(cb_jinja *t, node *x) {
    for (;;) {
        const token *k = peek(t);
        if (is_op(k, "|")) {
            next_tok(t);
            const token *name = expect_name(t);
            node *y = new_node(t, E_FILTER, k->line);
            y->s = name->s, y->n = name->n, y->a = x;
            if (is_op(peek(t), "(")) next_tok(t), y->b = parse_args(t);
            x = y;
        } else if (is_name(k, "is")) {
            next_tok(t);
            node *y = new_node(t, E_TEST, k->line);
            if (is_name(peek(t), "not")) next_tok(t), y->neg = 1;
            const token *name = next_tok(t);
            if (name->type == T_NAME) y->s = name->s, y->n = name->n;
            else if (name->type == T_OP && (is_op(name, "==") || is_op(name, "!=") || is_op(name, "<") ||
                                            is_op(name, ">") || is_op(name, "<=") || is_op(name, ">=")))
                y->s = name->op, y->n = strlen(name->op);
            else perr(t, k->line, "expected a test name after 'is'");
            y->a = x;
            const token *p = peek(t);
            if (is_op(p, "(")) {
                next_tok(t), y->b = parse_args(t);
            } else if (p->type == T_STRING || p->type == T_INT || p->type == T_FLOAT ||
                       (p->type == T_NAME && !is_name(p, "and") && !is_name(p, "or") && !is_name(p, "if") &&
                        !is_name(p, "else") && !is_name(p, "is") && !is_name(p, "in") && !is_name(p, "not"))) {
                y->b = parse_unary(t, 0); /* "x is divisibleby 3", "x is sameas none" */
            }
            x = y;
        } else {
            return x;
        }
    }
}

static node *parse_unary(cb_jinja *t, int with_filter) {
    const token *k = peek(t);
    if (++t->depth > MAX_PARSE_DEPTH) perr(t, k->line, "expressions nested too deeply");
    node *x;
    if (is_op(k, "-") || is_op(k, "+")) {
        next_tok(t);
        x = new_node(t, is_op(k, "-") ? E_NEG : E_POS, k->line);
        x->a = parse_unary(t, 0);
    } else {
        x = parse_postfix(t, parse_primary(t));
    }
    t->depth--;
    return with_filter ? parse_filters(t, x) : x;
}

static node *bin(cb_jinja *t, int op, node *a, node *b, int line) {
    node *x = new_node(t, E_BIN, line);
    x->op = (uint8_t)op, x->a = a, x->b = b;
    return x;
}

static node *parse_pow(cb_jinja *t) {
    node *x = parse_unary(t, 1);
    while (is_op(peek(t), "**")) {
        int line = next_tok(t)->line;
        x = bin(t, OP_POW, x, parse_unary(t, 1), line);
    }
    return x;
}
static node *parse_mul(cb_jinja *t) {
    node *x = parse_pow(t);
    for (;;) {
        const token *k = peek(t);
        int op = is_op(k, "*") ? OP_MUL : is_op(k, "/") ? OP_DIV : is_op(k, "//") ? OP_FLOORDIV : is_op(k, "%") ? OP_MOD : -1;
        if (op < 0) return x;
        next_tok(t);
        x = bin(t, op, x, parse_pow(t), k->line);
    }
}
static node *parse_add(cb_jinja *t) {
    node *x = parse_mul(t);
    for (;;) {
        const token *k = peek(t);
        int op = is_op(k, "+") ? OP_ADD : is_op(k, "-") ? OP_SUB : -1;
        if (op < 0) return x;
        next_tok(t);
        x = bin(t, op, x, parse_mul(t), k->line);
    }
}
static node *parse_concat(cb_jinja *t) {
    node *x = parse_add(t);
    while (is_op(peek(t), "~")) {
        int line = next_tok(t)->line;
        x = bin(t, OP_CONCAT, x, parse_add(t), line);
    }
    return x;
}
static node *parse_compare(cb_jinja *t) {
    node *x = parse_concat(t);
    for (;;) {
        const token *k = peek(t);
        int op = is_op(k, "==") ? OP_EQ : is_op(k, "!=") ? OP_NE : is_op(k, "<") ? OP_LT : is_op(k, "<=") ? OP_LE
                 : is_op(k, ">") ? OP_GT : is_op(k, ">=") ? OP_GE : is_name(k, "in") ? OP_IN : -1;
        if (op < 0 && is_name(k, "not") && is_name(&t->toks[t->pos + 1], "in")) {
            next_tok(t);
            op = OP_NOTIN;
        }
        if (op < 0) return x;
        next_tok(t);
        /* chained comparisons (a < b < c) are rare in templates: left to right pairs */
        x = bin(t, op, x, parse_concat(t), k->line);
    }
}
static node *parse_not(cb_jinja *t) {
    if (is_name(peek(t), "not")) {
        int line = next_tok(t)->line;
        if (++t->depth > MAX_PARSE_DEPTH) perr(t, line, "expressions nested too deeply");
        node *x = new_node(t, E_NOT, line);
        x->a = parse_not(t);
        t->depth--;
        return x;
    }
    return parse_compare(t);
}
/* operand (kw operand)*, left-associative: the and and or chains. */
static node *parse_chain(cb_jinja *t, const char *kw, int type, node *(*operand)(cb_jinja *)) {
    node *x = operand(t);
    while (is_name(peek(t), kw)) {
        int line = next_tok(t)->line;
        node *y = new_node(t, type, line);
        y->a = x, y->b = operand(t);
        x = y;
    }
    return x;
}
static node *parse_and(cb_jinja *t) { return parse_chain(t, "and", E_AND, parse_not); }
static node *parse_or(cb_jinja *t) { return parse_chain(t, "or", E_OR, parse_and); }
static node *parse_expr(cb_jinja *t) {
    if (++t->depth > MAX_PARSE_DEPTH) perr(t, peek(t)->line, "expressions nested too deeply");
    node *x = parse_or(t);
    while (is_name(peek(t), "if")) {
        int line = next_tok(t)->line;
        node *y = new_node(t, E_COND, line);
        y->a = parse_or(t), y->b = x;
        if (is_name(peek(t), "else")) next_tok(t), y->c = parse_expr(t);
        x = y;
    }
    t->depth--;
    return x;
}
/* "a, b" as a tuple where a statement allows one. */
static node *parse_tuple(cb_jinja *t, int with_cond) {
    node *first = with_cond ? parse_expr(t) : parse_or(t);
    if (!is_op(peek(t), ",")) return first;
    node *x = new_node(t, E_TUPLE, first->line);
    x->a = first;
    node **tail = &first->next;
    while (is_op(peek(t), ",")) {
        next_tok(t);
        if (peek(t)->type == T_BLOCK_END || peek(t)->type == T_VAR_END || is_name(peek(t), "in")) break;
        node *e = with_cond ? parse_expr(t) : parse_or(t);
        *tail = e, tail = &e->next;
    }
    return x;
}

static void expect_block_end(cb_jinja *t) {
    const token *k = next_tok(t);
    if (k->type != T_BLOCK_END) perr(t, k->line, "expected the end of the tag ('%%}')");
}

/* Statements until a block tag named one of ends ("a|b|c"); leaves the
 * position on that name. */
static node *parse_body(cb_jinja *t, const char *ends, const char *opened, int open_line);
static node *parse_statement_in(cb_jinja *t, const token *kw, int line);

static node *parse_statement(cb_jinja *t) {
    const token *kw = expect_name(t);
    int line = kw->line;
    if (++t->depth > MAX_PARSE_DEPTH) perr(t, line, "tags nested too deeply");
    node *x = parse_statement_in(t, kw, line);
    t->depth--;
    return x;
}

static node *parse_statement_in(cb_jinja *t, const token *kw, int line) {
    node *x;
    if (is_name(kw, "if")) {
        x = new_node(t, S_IF, line);
        x->a = parse_tuple(t, 1);
        expect_block_end(t);
        x->b = parse_body(t, "elif|else|endif", "if", line);
        node *cur = x;
        for (;;) {
            const token *e = next_tok(t);
            if (is_name(e, "elif")) {
                node *y = new_node(t, S_IF, e->line);
                y->neg = 1; /* an elif, not an if opening the else body */
                y->a = parse_tuple(t, 1);
                expect_block_end(t);
                y->b = parse_body(t, "elif|else|endif", "if", line);
                cur->c = y, cur = y;
            } else if (is_name(e, "else")) {
                expect_block_end(t);
                cur->c = parse_body(t, "endif", "if", line);
            } else {
                expect_block_end(t);
                break;
            }
        }
        return x;
    }
    if (is_name(kw, "for")) {
        x = new_node(t, S_FOR, line);
        /* targets: names, optionally in parentheses */
        node **tail = &x->a;
        int paren = is_op(peek(t), "(");
        if (paren) next_tok(t);
        for (;;) {
            const token *name = expect_name(t);
            node *v = new_node(t, E_NAME, name->line);
            v->s = name->s, v->n = name->n;
            *tail = v, tail = &v->next;
            if (!is_op(peek(t), ",")) break;
            next_tok(t);
        }
        if (paren) expect_op(t, ")");
        if (!is_name(next_tok(t), "in")) perr(t, line, "expected 'in' in the for tag");
        x->b = parse_tuple(t, 0);
        if (is_name(peek(t), "if")) next_tok(t), x->d = parse_expr(t);
        if (is_name(peek(t), "recursive")) perr(t, line, "recursive loops are not supported");
        expect_block_end(t);
        x->c = parse_body(t, "else|endfor", "for", line);
        if (is_name(next_tok(t), "else")) {
            expect_block_end(t);
            node *els = parse_body(t, "endfor", "for", line);
            next_tok(t);
            x->next = NULL;
            node *wrap = new_node(t, S_TEXT, line); /* holder: the else body hangs off ->a */
            wrap->a = els;
            x->val.t = V_LIST, x->val.u.m = wrap; /* else body */
        }
        expect_block_end(t);
        return x;
    }
    if (is_name(kw, "set")) {
        node *target;
        const token *name = expect_name(t);
        target = new_node(t, E_NAME, name->line);
        target->s = name->s, target->n = name->n;
        if (is_op(peek(t), ".")) {
            next_tok(t);
            const token *attr = expect_name(t);
            node *y = new_node(t, E_ATTR, line);
            y->a = target, y->s = attr->s, y->n = attr->n;
            target = y;
        } else if (is_op(peek(t), ",")) {
            node *tup = new_node(t, E_TUPLE, line), **tail = &target->next;
            tup->a = target;
            while (is_op(peek(t), ",")) {
                next_tok(t);
                const token *more = expect_name(t);
                node *v = new_node(t, E_NAME, more->line);
                v->s = more->s, v->n = more->n;
                *tail = v, tail = &v->next;
            }
            target = tup;
        }
        if (peek(t)->type == T_BLOCK_END && target->kind == E_NAME) {
            next_tok(t);
            x = new_node(t, S_SETBLOCK, line);
            x->a = target;
            x->b = parse_body(t, "endset", "set", line);
            next_tok(t);
            expect_block_end(t);
            return x;
        }
        expect_op(t, "=");
        x = new_node(t, S_SET, line);
        x->a = target, x->b = parse_tuple(t, 1);
        expect_block_end(t);
        return x;
    }
    if (is_name(kw, "macro")) {
        const token *name = expect_name(t);
        x = new_node(t, S_MACRO, line);
        x->s = name->s, x->n = name->n;
        expect_op(t, "(");
        node **tail = &x->a;
        while (!is_op(peek(t), ")")) {
            const token *p = expect_name(t);
            node *param = new_node(t, E_KWARG, p->line);
            param->s = p->s, param->n = p->n;
            if (is_op(peek(t), "=")) next_tok(t), param->a = parse_expr(t);
            *tail = param, tail = &param->next;
            if (!is_op(peek(t), ",")) break;
            next_tok(t);
        }
        expect_op(t, ")");
        expect_block_end(t);
        x->b = parse_body(t, "endmacro", "macro", line);
        next_tok(t);
        expect_block_end(t);
        return x;
    }
    if (is_name(kw, "call")) {
        x = new_node(t, S_CALLBLOCK, line);
        x->a = parse_expr(t);
        if (x->a->kind != E_CALL) perr(t, line, "expected a macro call in the call tag");
        expect_block_end(t);
        x->b = parse_body(t, "endcall", "call", line);
        next_tok(t);
        expect_block_end(t);
        return x;
    }
    if (is_name(kw, "generation")) { /* transformers' assistant-mask tag: renders its body */
        expect_block_end(t);
        x = new_node(t, S_IF, line);
        x->a = new_node(t, E_CONST, line);
        x->a->val.t = V_BOOL, x->a->val.u.i = 1;
        x->b = parse_body(t, "endgeneration", "generation", line);
        next_tok(t);
        expect_block_end(t);
        return x;
    }
    if (is_name(kw, "break") || is_name(kw, "continue")) {
        x = new_node(t, is_name(kw, "break") ? S_BREAK : S_CONTINUE, line);
        expect_block_end(t);
        return x;
    }
    perr(t, line, "unknown tag '%.*s'", (int)kw->n, kw->s);
    return NULL;
}

static int name_in(const token *k, const char *names) {
    if (k->type != T_NAME) return 0;
    for (const char *p = names; *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == k->n && !memcmp(p, k->s, len)) return 1;
        if (!bar) break;
        p = bar + 1;
    }
    return 0;
}

static node *parse_body(cb_jinja *t, const char *ends, const char *opened, int open_line) {
    node *head = NULL, **tail = &head;
    for (;;) {
        const token *k = next_tok(t);
        node *x;
        if (k->type == T_EOF) {
            if (!ends) return head;
            perr(t, k->line, "the '%s' tag of line %d is not closed (expected %s)", opened, open_line, ends);
        } else if (k->type == T_TEXT) {
            x = new_node(t, S_TEXT, k->line);
            x->s = k->s, x->n = k->n;
        } else if (k->type == T_VAR_BEGIN) {
            x = new_node(t, S_OUT, k->line);
            x->a = parse_tuple(t, 1);
            const token *e = next_tok(t);
            if (e->type != T_VAR_END) perr(t, e->line, "expected the end of the expression ('}}')");
        } else if (k->type == T_BLOCK_BEGIN) {
            if (ends && name_in(peek(t), ends)) return head;
            if (name_in(peek(t), "endif|endfor|endmacro|endset|endcall|endgeneration|elif|else|endraw"))
                perr(t, k->line, "unexpected '%.*s'%s", (int)peek(t)->n, peek(t)->s,
                     ends ? "" : " (no tag is open)");
            x = parse_statement(t);
        } else {
            perr(t, k->line, "unexpected token");
            return NULL;
        }
        *tail = x, tail = &x->next;
        while (*tail) tail = &(*tail)->next;
    }
}

cb_jinja *cb_jinja_parse(const char *src, size_t len, char *err, size_t err_len) {
    cb_jinja *volatile t = calloc(1, sizeof *t);
    if (!t) {
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    t->err = err, t->err_len = err_len;
    t->mem_cap = len * 48 + (1u << 16);
    t->mem = malloc(t->mem_cap);
    t->src = malloc(len + 1);
    if (!t->mem || !t->src) {
        snprintf(err, err_len, "out of memory");
        cb_jinja_free(t);
        return NULL;
    }
    /* Newlines normalised to "\n" and one trailing newline dropped, as jinja's lexer does. */
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            t->src[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            t->src[n++] = src[i];
        }
    }
    if (n && t->src[n - 1] == '\n') n--;
    t->src[n] = 0;
    t->src_len = n;
    if (setjmp(t->fail)) {
        cb_jinja_free(t);
        return NULL;
    }
    lex(t);
    t->pos = 0;
    t->body = parse_body(t, NULL, NULL, 0);
    t->err = NULL;
    return t;
}

void cb_jinja_free(cb_jinja *t) {
    if (!t) return;
    free(t->mem);
    free(t->src);
    free(t);
}

int cb_jinja_mentions(const cb_jinja *t, const char *name) {
    size_t n = strlen(name);
    for (size_t i = 0; i + n <= t->src_len; i++)
        if (!memcmp(t->src + i, name, n)) return 1;
    return 0;
}

/* ------------------------------------------------------------------ */
/* Values and rendering                                               */

typedef struct var var;
struct var {
    var *next;
    const char *name;
    size_t n;
    jv v;
};
typedef struct frame frame;
struct frame {
    frame *up;
    var *vars;
};
typedef struct {
    char *p;
    size_t n, cap;
    int fixed; /* the caller's buffer: overflowing it ends the render */
} obuf;

enum { F_RANGE = 1, F_NAMESPACE, F_DICT, F_RAISE, F_STRFTIME };

struct cb_jrender {
    const cb_jinja *t;
    uint8_t *mem;
    size_t used, cap;
    frame globals, *top;
    obuf *out;
    jmp_buf fail;
    int status, loop_ctl, depth;
    long steps;
    const node *caller; /* body of the {% call %} block being run */
    char msg[400];
};

NORETURN static void rfail(cb_jrender *r, int status, int line, const char *fmt, ...) {
    char m[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    if (status == CB_JINJA_ERROR && line > 0) snprintf(r->msg, sizeof r->msg, "chat template line %d: %s", line, m);
    else snprintf(r->msg, sizeof r->msg, "%s", m);
    r->status = status;
    longjmp(r->fail, 1);
}

static void *rtake(cb_jrender *r, size_t n) {
    n = (n + 7) & ~(size_t)7;
    if (n > r->cap - r->used)
        rfail(r, CB_JINJA_NO_MEMORY, 0, "rendering the chat template needs more than its %zu bytes of working memory",
              r->cap);
    void *p = r->mem + r->used;
    r->used += n;
    return p;
}

static jv mk_undef(const char *name) {
    jv v = {V_UNDEF, 0, 0, {0}};
    v.u.s = name;
    return v;
}
static jv mk_none(void) { return (jv){V_NONE, 0, 0, {0}}; }
static jv mk_bool(int b) {
    jv v = {V_BOOL, 0, 0, {0}};
    v.u.i = b != 0;
    return v;
}
static jv mk_int(int64_t i) {
    jv v = {V_INT, 0, 0, {0}};
    v.u.i = i;
    return v;
}
static jv mk_float(double f) {
    jv v = {V_FLOAT, 0, 0, {0}};
    v.u.f = f;
    return v;
}
static jv mk_str(const char *s, size_t n) {
    jv v = {V_STR, 0, n, {0}};
    v.u.s = s;
    return v;
}
static jv mk_list(cb_jrender *r, size_t cap) {
    jv v = {V_LIST, 0, 0, {0}};
    v.u.l = rtake(r, sizeof(jlist));
    v.u.l->n = 0, v.u.l->cap = cap;
    v.u.l->v = cap ? rtake(r, cap * sizeof(jv)) : NULL;
    return v;
}
static jv mk_dict(cb_jrender *r, size_t cap) {
    jv v = {V_DICT, 0, 0, {0}};
    v.u.d = rtake(r, sizeof(jdict));
    v.u.d->n = 0, v.u.d->cap = cap;
    v.u.d->k = cap ? rtake(r, cap * sizeof(jv)) : NULL;
    v.u.d->v = cap ? rtake(r, cap * sizeof(jv)) : NULL;
    return v;
}
static void list_push(cb_jrender *r, jlist *l, jv x) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        jv *nv = rtake(r, cap * sizeof(jv));
        if (l->n) memcpy(nv, l->v, l->n * sizeof(jv));
        l->v = nv, l->cap = cap;
    }
    l->v[l->n++] = x;
}
static int str_eq(jv a, const char *s, size_t n) { return a.t == V_STR && a.n == n && !memcmp(a.u.s, s, n); }
static jv *dict_find(const jdict *d, const char *k, size_t n) {
    for (size_t i = 0; i < d->n; i++)
        if (str_eq(d->k[i], k, n)) return &d->v[i];
    return NULL;
}
static int eq(jv a, jv b);
static void dict_set(cb_jrender *r, jdict *d, jv k, jv v) {
    for (size_t i = 0; i < d->n; i++)
        if (eq(d->k[i], k)) {
            d->v[i] = v;
            return;
        }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        jv *nk = rtake(r, cap * sizeof(jv)), *nv = rtake(r, cap * sizeof(jv));
        if (d->n) memcpy(nk, d->k, d->n * sizeof(jv)), memcpy(nv, d->v, d->n * sizeof(jv));
        d->k = nk, d->v = nv, d->cap = cap;
    }
    d->k[d->n] = k, d->v[d->n] = v, d->n++;
}

static int is_num(jv v) { return v.t == V_INT || v.t == V_FLOAT || v.t == V_BOOL; }
static double num(jv v) { return v.t == V_FLOAT ? v.u.f : (double)v.u.i; }

static int truthy(jv v) {
    switch (v.t) {
    case V_UNDEF: case V_NONE: return 0;
    case V_BOOL: case V_INT: return v.u.i != 0;
    case V_FLOAT: return v.u.f != 0.0;
    case V_STR: return v.n != 0;
    case V_LIST: return v.u.l->n != 0;
    case V_DICT: return v.u.d->n != 0;
    default: return 1;
    }
}

static int eq(jv a, jv b) {
    if (is_num(a) && is_num(b)) {
        if (a.t != V_FLOAT && b.t != V_FLOAT) return a.u.i == b.u.i;
        return num(a) == num(b);
    }
    if (a.t != b.t) return 0;
    switch (a.t) {
    case V_UNDEF: case V_NONE: return 1;
    case V_STR: return a.n == b.n && !memcmp(a.u.s, b.u.s, a.n);
    case V_LIST:
        if (a.u.l->n != b.u.l->n || a.tuple != b.tuple) return 0;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!eq(a.u.l->v[i], b.u.l->v[i])) return 0;
        return 1;
    case V_DICT:
        if (a.u.d->n != b.u.d->n) return 0;
        for (size_t i = 0; i < a.u.d->n; i++) {
            int found = 0;
            for (size_t j = 0; j < b.u.d->n && !found; j++)
                if (eq(a.u.d->k[i], b.u.d->k[j])) {
                    if (!eq(a.u.d->v[i], b.u.d->v[j])) return 0;
                    found = 1;
                }
            if (!found) return 0;
        }
        return 1;
    default: return a.u.m == b.u.m;
    }
}

static const char *type_name(jv v) {
    static const char *names[] = {"Undefined", "NoneType", "bool", "int", "float", "str", "list",
                                  "dict", "Namespace", "Macro", "LoopContext", "function"};
    return v.t == V_LIST && v.tuple ? "tuple" : names[v.t];
}

/* ---- output buffers ---- */

static void oput(cb_jrender *r, obuf *o, const char *s, size_t n) {
    if (n > o->cap - o->n) {
        if (o->fixed) rfail(r, CB_JINJA_TOO_LONG, 0, "the rendered prompt is longer than %zu bytes", o->cap);
        size_t cap = o->cap * 2 + n + 64;
        char *p = rtake(r, cap);
        if (o->n) memcpy(p, o->p, o->n);
        o->p = p, o->cap = cap;
    }
    if (n) memcpy(o->p + o->n, s, n);
    o->n += n;
}
static void oputs(cb_jrender *r, obuf *o, const char *s) { oput(r, o, s, strlen(s)); }
static obuf new_obuf(cb_jrender *r, size_t cap) {
    obuf o = {rtake(r, cap), 0, cap, 0};
    return o;
}
static jv obuf_str(obuf *o) { return mk_str(o->p, o->n); }

/* Python's repr(float): the shortest text that reads back the same. */
static void put_float(cb_jrender *r, obuf *o, double f) {
    if (isnan(f)) return oputs(r, o, "nan");
    if (isinf(f)) return oputs(r, o, f < 0 ? "-inf" : "inf");
    char buf[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, f);
        if (strtod(buf, NULL) == f) break;
    }
    /* buf: [-]d[.ddd]e[+-]XX */
    char digits[24];
    int nd = 0, neg = buf[0] == '-';
    const char *p = buf + neg;
    for (; *p && *p != 'e'; p++)
        if (is_digit(*p)) digits[nd++] = *p;
    int exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    char out[64];
    int n = 0;
    if (neg) out[n++] = '-';
    if (exp >= -5 + 1 && exp < 16) {
        if (exp < 0) {
            out[n++] = '0', out[n++] = '.';
            for (int i = 0; i < -exp - 1; i++) out[n++] = '0';
            for (int i = 0; i < nd; i++) out[n++] = digits[i];
        } else {
            for (int i = 0; i <= exp; i++) out[n++] = i < nd ? digits[i] : '0';
            out[n++] = '.';
            if (nd > exp + 1)
                for (int i = exp + 1; i < nd; i++) out[n++] = digits[i];
            else
                out[n++] = '0';
        }
    } else {
        out[n++] = digits[0];
        if (nd > 1) {
            out[n++] = '.';
            for (int i = 1; i < nd; i++) out[n++] = digits[i];
        }
        n += snprintf(out + n, sizeof out - (size_t)n, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
    oput(r, o, out, (size_t)n);
}

static void put_int(cb_jrender *r, obuf *o, int64_t i) {
    char buf[24];
    int n = snprintf(buf, sizeof buf, "%lld", (long long)i);
    oput(r, o, buf, (size_t)n);
}

static void put_repr(cb_jrender *r, obuf *o, jv v);

/* Python's str(v). */
static void put_str(cb_jrender *r, obuf *o, jv v) {
    switch (v.t) {
    case V_UNDEF: return;
    case V_NONE: return oputs(r, o, "None");
    case V_BOOL: return oputs(r, o, v.u.i ? "True" : "False");
    case V_INT: return put_int(r, o, v.u.i);
    case V_FLOAT: return put_float(r, o, v.u.f);
    case V_STR: return oput(r, o, v.u.s, v.n);
    case V_LIST: case V_DICT: return put_repr(r, o, v);
    case V_NS: return oputs(r, o, "<Namespace>");
    case V_MACRO: return oputs(r, o, "<Macro>");
    case V_LOOP: return oputs(r, o, "<LoopContext>");
    default: return oputs(r, o, "<function>");
    }
}

static void put_repr(cb_jrender *r, obuf *o, jv v) {
    if (v.t == V_STR) {
        int has_sq = memchr(v.u.s, '\'', v.n) != NULL, has_dq = memchr(v.u.s, '"', v.n) != NULL;
        char q = has_sq && !has_dq ? '"' : '\'';
        oput(r, o, &q, 1);
        for (size_t i = 0; i < v.n; i++) {
            unsigned char c = (unsigned char)v.u.s[i];
            char esc[8];
            if (c == '\\' || c == (unsigned char)q) esc[0] = '\\', esc[1] = (char)c, oput(r, o, esc, 2);
            else if (c == '\n') oputs(r, o, "\\n");
            else if (c == '\r') oputs(r, o, "\\r");
            else if (c == '\t') oputs(r, o, "\\t");
            else if (c < 0x20 || c == 0x7f) snprintf(esc, sizeof esc, "\\x%02x", c), oput(r, o, esc, 4);
            else oput(r, o, (const char *)&c, 1);
        }
        oput(r, o, &q, 1);
    } else if (v.t == V_LIST) {
        oputs(r, o, v.tuple ? "(" : "[");
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) oputs(r, o, ", ");
            put_repr(r, o, v.u.l->v[i]);
        }
        oputs(r, o, v.tuple ? (v.u.l->n == 1 ? ",)" : ")") : "]");
    } else if (v.t == V_DICT) {
        oputs(r, o, "{");
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i) oputs(r, o, ", ");
            put_repr(r, o, v.u.d->k[i]);
            oputs(r, o, ": ");
            put_repr(r, o, v.u.d->v[i]);
        }
        oputs(r, o, "}");
    } else {
        put_str(r, o, v);
    }
}

static jv to_str(cb_jrender *r, jv v) {
    if (v.t == V_STR) return v;
    obuf o = new_obuf(r, 32);
    put_str(r, &o, v);
    return obuf_str(&o);
}

/* ---- JSON (transformers' tojson: json.dumps) ---- */

typedef struct {
    int ensure_ascii, sort_keys;
    const char *indent; /* NULL: one line */
    size_t indent_n;
    jv item_sep, key_sep;
} json_opts;

static uint32_t utf8_next(const char *s, size_t n, size_t *i) {
    unsigned char c = (unsigned char)s[*i];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (*i + (size_t)len > n) len = 1;
    uint32_t cp = len == 1 ? c : len == 2 ? c & 31u : len == 3 ? c & 15u : c & 7u;
    for (int k = 1; k < len; k++) cp = (cp << 6) | ((unsigned char)s[*i + (size_t)k] & 63u);
    *i += (size_t)len;
    return cp;
}

static void put_json_str(cb_jrender *r, obuf *o, const char *s, size_t n, int ensure_ascii) {
    oputs(r, o, "\"");
    size_t i = 0;
    while (i < n) {
        size_t start = i;
        uint32_t cp = utf8_next(s, n, &i);
        char esc[16];
        switch (cp) {
        case '"': oputs(r, o, "\\\""); continue;
        case '\\': oputs(r, o, "\\\\"); continue;
        case '\n': oputs(r, o, "\\n"); continue;
        case '\r': oputs(r, o, "\\r"); continue;
        case '\t': oputs(r, o, "\\t"); continue;
        case '\b': oputs(r, o, "\\b"); continue;
        case '\f': oputs(r, o, "\\f"); continue;
        default: break;
        }
        if (cp < 0x20 || (ensure_ascii && cp >= 0x7f)) {
            if (cp >= 0x10000) {
                uint32_t v = cp - 0x10000;
                snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
            } else {
                snprintf(esc, sizeof esc, "\\u%04x", cp);
            }
            oputs(r, o, esc);
        } else {
            oput(r, o, s + start, i - start);
        }
    }
    oputs(r, o, "\"");
}

static void json_newline(cb_jrender *r, obuf *o, const json_opts *js, int level) {
    oputs(r, o, "\n");
    for (int i = 0; i < level; i++) oput(r, o, js->indent, js->indent_n);
}

static int cmp(cb_jrender *r, jv a, jv b, int line);

static void put_json(cb_jrender *r, obuf *o, jv v, const json_opts *js, int level, int line) {
    if (++r->depth > 400) rfail(r, CB_JINJA_ERROR, line, "tojson: the value is nested too deeply");
    switch (v.t) {
    case V_NONE: oputs(r, o, "null"); break;
    case V_BOOL: oputs(r, o, v.u.i ? "true" : "false"); break;
    case V_INT: put_int(r, o, v.u.i); break;
    case V_FLOAT:
        if (isnan(v.u.f)) oputs(r, o, "NaN");
        else if (isinf(v.u.f)) oputs(r, o, v.u.f < 0 ? "-Infinity" : "Infinity");
        else put_float(r, o, v.u.f);
        break;
    case V_STR: put_json_str(r, o, v.u.s, v.n, js->ensure_ascii); break;
    case V_LIST:
        if (!v.u.l->n) {
            oputs(r, o, "[]");
            break;
        }
        oputs(r, o, "[");
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) oput(r, o, js->item_sep.u.s, js->item_sep.n);
            if (js->indent) json_newline(r, o, js, level + 1);
            put_json(r, o, v.u.l->v[i], js, level + 1, line);
        }
        if (js->indent) json_newline(r, o, js, level);
        oputs(r, o, "]");
        break;
    case V_DICT: case V_NS: {
        jdict *d = v.u.d;
        if (!d->n) {
            oputs(r, o, "{}");
            break;
        }
        size_t *order = rtake(r, d->n * sizeof(size_t));
        for (size_t i = 0; i < d->n; i++) order[i] = i;
        if (js->sort_keys)
            for (size_t i = 1; i < d->n; i++)
                for (size_t j = i; j > 0 && cmp(r, d->k[order[j - 1]], d->k[order[j]], line) > 0; j--) {
                    size_t tmp = order[j];
                    order[j] = order[j - 1], order[j - 1] = tmp;
                }
        oputs(r, o, "{");
        for (size_t i = 0; i < d->n; i++) {
            jv k = d->k[order[i]];
            if (i) oput(r, o, js->item_sep.u.s, js->item_sep.n);
            if (js->indent) json_newline(r, o, js, level + 1);
            if (k.t == V_STR) put_json_str(r, o, k.u.s, k.n, js->ensure_ascii);
            else if (k.t == V_NONE || k.t == V_BOOL || k.t == V_INT || k.t == V_FLOAT) {
                obuf tmp = new_obuf(r, 16);
                put_json(r, &tmp, k, js, level, line);
                oputs(r, o, "\""), oput(r, o, tmp.p, tmp.n), oputs(r, o, "\"");
            } else rfail(r, CB_JINJA_ERROR, line, "tojson: keys must be str, int, float, bool or None, not %s",
                         type_name(k));
            oput(r, o, js->key_sep.u.s, js->key_sep.n);
            put_json(r, o, d->v[order[i]], js, level + 1, line);
        }
        if (js->indent) json_newline(r, o, js, level);
        oputs(r, o, "}");
        break;
    }
    default:
        rfail(r, CB_JINJA_ERROR, line, "tojson: Object of type %s is not JSON serializable", type_name(v));
    }
    r->depth--;
}

/* The JSON value toks[i], as json.loads gives it. */
static jv from_json(cb_jrender *r, const char *json, const cb_json_tok *toks, int i) {
    const cb_json_tok *k = &toks[i];
    switch (k->type) {
    case CB_JSON_STRING: {
        if (!(k->flags & CB_JSON_F_ESCAPED)) return mk_str(json + k->start, (size_t)(k->end - k->start));
        size_t cap = (size_t)(k->end - k->start) + 1;
        char *s = rtake(r, cap);
        int n = cb_json_unescape(json, k, s, cap);
        if (n < 0) rfail(r, CB_JINJA_ERROR, 0, "an invalid string in the request");
        return mk_str(s, (size_t)n);
    }
    case CB_JSON_NUMBER: {
        char buf[64];
        size_t n = (size_t)(k->end - k->start);
        if (n >= sizeof buf) n = sizeof buf - 1;
        memcpy(buf, json + k->start, n);
        buf[n] = 0;
        if (k->flags & CB_JSON_F_INTEGER) {
            char *end;
            long long v = strtoll(buf, &end, 10);
            if ((v != LLONG_MAX && v != LLONG_MIN) || n < 19) return mk_int(v);
        }
        return mk_float(strtod(buf, NULL));
    }
    case CB_JSON_TRUE: return mk_bool(1);
    case CB_JSON_FALSE: return mk_bool(0);
    case CB_JSON_NULL: return mk_none();
    case CB_JSON_ARRAY: {
        jv v = mk_list(r, (size_t)k->size);
        for (int e = i + 1, c = 0; c < k->size; c++, e = toks[e].next) list_push(r, v.u.l, from_json(r, json, toks, e));
        return v;
    }
    default: {
        jv v = mk_dict(r, (size_t)k->size);
        for (int e = i + 1, c = 0; c < k->size; c++, e = toks[e + 1].next)
            dict_set(r, v.u.d, from_json(r, json, toks, e), from_json(r, json, toks, e + 1));
        return v;
    }
    }
}

/* ---- strings ---- */

static const char *find_sub(const char *h, size_t hn, const char *nd, size_t nn);

static size_t cp_count(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}
/* Byte offset of code point k (k <= count). */
static size_t cp_offset(const char *s, size_t n, size_t k) {
    size_t i = 0;
    while (i < n && k) {
        i++;
        while (i < n && ((unsigned char)s[i] & 0xC0) == 0x80) i++;
        k--;
    }
    return i;
}
static int py_space(unsigned char c) { return c == ' ' || (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x1f); }

/* Length of the Python whitespace character starting at s[i] (str.isspace:
 * ASCII and the Unicode spaces), or 0. */
static size_t space_at(const char *s, size_t n, size_t i) {
    unsigned char c = (unsigned char)s[i];
    if (c < 0x80) return py_space(c);
    size_t j = i;
    uint32_t cp = utf8_next(s, n, &j);
    int sp = cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
             cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
    return sp ? j - i : 0;
}
/* Length of the whitespace character ending at s[e - 1], or 0. */
static size_t space_before(const char *s, size_t e) {
    size_t i = e;
    while (i > 0 && e - i < 4) {
        i--;
        if (((unsigned char)s[i] & 0xC0) != 0x80) return space_at(s, e, i) == e - i ? e - i : 0;
    }
    return 0;
}

/* Python's str.strip(chars): chars are code points; none means whitespace. */
static jv strip(jv s, jv chars, int left, int right) {
    const char *p = s.u.s;
    size_t n = s.n;
    if (chars.t != V_STR) {
        size_t k;
        while (left && n && (k = space_at(p, n, 0))) p += k, n -= k;
        while (right && n && (k = space_before(p, n))) n -= k;
        return mk_str(p, n);
    }
    for (;;) { /* one code point at a time, while it is one of chars */
        if (!left || !n) break;
        size_t j = 0;
        utf8_next(p, n, &j);
        if (!find_sub(chars.u.s, chars.n, p, j)) break;
        p += j, n -= j;
    }
    while (right && n) {
        size_t i = n - 1;
        while (i > 0 && ((unsigned char)p[i] & 0xC0) == 0x80) i--;
        if (!find_sub(chars.u.s, chars.n, p + i, n - i)) break;
        n = i;
    }
    return mk_str(p, n);
}
static const char *find_sub(const char *h, size_t hn, const char *nd, size_t nn) {
    if (nn == 0) return h;
    for (size_t i = 0; i + nn <= hn; i++)
        if (h[i] == nd[0] && !memcmp(h + i, nd, nn)) return h + i;
    return NULL;
}
static jv str_case(cb_jrender *r, jv s, int mode) { /* 0 lower, 1 upper, 2 capitalize, 3 title */
    char *p = rtake(r, s.n + 1);
    int word_start = 1;
    for (size_t i = 0; i < s.n; i++) {
        char c = s.u.s[i];
        int up = mode == 1 || (mode == 2 && i == 0) || (mode == 3 && word_start);
        if (up && c >= 'a' && c <= 'z') c = (char)(c - 32);
        else if (!up && mode != 1 && c >= 'A' && c <= 'Z') c = (char)(c + 32);
        word_start = !((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (unsigned char)c >= 0x80);
        p[i] = c;
    }
    return mk_str(p, s.n);
}
static jv replace(cb_jrender *r, jv s, jv a, jv b, int64_t count) {
    obuf o = new_obuf(r, s.n + 16);
    size_t i = 0;
    if (a.n == 0) { /* Python inserts the replacement between every character */
        size_t k = 0;
        while (i <= s.n && (count < 0 || (int64_t)k < count)) {
            oput(r, &o, b.u.s, b.n);
            k++;
            if (i == s.n) { i++; break; }
            size_t j = i;
            utf8_next(s.u.s, s.n, &j);
            oput(r, &o, s.u.s + i, j - i);
            i = j;
        }
        if (i < s.n) oput(r, &o, s.u.s + i, s.n - i);
        return obuf_str(&o);
    }
    for (int64_t k = 0; count < 0 || k < count; k++) {
        const char *f = find_sub(s.u.s + i, s.n - i, a.u.s, a.n);
        if (!f) break;
        size_t at = (size_t)(f - s.u.s);
        oput(r, &o, s.u.s + i, at - i);
        oput(r, &o, b.u.s, b.n);
        i = at + a.n;
    }
    oput(r, &o, s.u.s + i, s.n - i);
    return obuf_str(&o);
}
static jv split(cb_jrender *r, jv s, jv sep, int64_t maxsplit, int line) {
    jv out = mk_list(r, 4);
    size_t i = 0;
    if (sep.t != V_STR) {
        size_t k;
        while (1) {
            while (i < s.n && (k = space_at(s.u.s, s.n, i))) i += k;
            if (i >= s.n) break;
            if (maxsplit >= 0 && (int64_t)out.u.l->n >= maxsplit) {
                size_t e = s.n;
                while (e > i && (k = space_before(s.u.s, e))) e -= k;
                list_push(r, out.u.l, mk_str(s.u.s + i, e - i));
                break;
            }
            size_t j = i;
            while (j < s.n && !space_at(s.u.s, s.n, j)) utf8_next(s.u.s, s.n, &j);
            list_push(r, out.u.l, mk_str(s.u.s + i, j - i));
            i = j;
        }
        return out;
    }
    if (sep.n == 0) rfail(r, CB_JINJA_ERROR, line, "split: empty separator");
    for (;;) {
        const char *f = maxsplit >= 0 && (int64_t)out.u.l->n >= maxsplit ? NULL
                        : find_sub(s.u.s + i, s.n - i, sep.u.s, sep.n);
        if (!f) {
            list_push(r, out.u.l, mk_str(s.u.s + i, s.n - i));
            return out;
        }
        size_t at = (size_t)(f - s.u.s);
        list_push(r, out.u.l, mk_str(s.u.s + i, at - i));
        i = at + sep.n;
    }
}
static jv rsplit(cb_jrender *r, jv s, jv sep, int64_t maxsplit, int line) {
    if (maxsplit < 0 || sep.t != V_STR) return split(r, s, sep, maxsplit, line);
    if (sep.n == 0) rfail(r, CB_JINJA_ERROR, line, "rsplit: empty separator");
    jv parts[64];
    int np = 0;
    size_t end = s.n;
    while (np < maxsplit && np < 63) {
        size_t at = (size_t)-1;
        for (size_t i = end; i >= sep.n; i--)
            if (!memcmp(s.u.s + i - sep.n, sep.u.s, sep.n)) {
                at = i - sep.n;
                break;
            }
        if (at == (size_t)-1) break;
        parts[np++] = mk_str(s.u.s + at + sep.n, end - at - sep.n);
        end = at;
    }
    jv out = mk_list(r, (size_t)np + 1);
    list_push(r, out.u.l, mk_str(s.u.s, end));
    while (np) list_push(r, out.u.l, parts[--np]);
    return out;
}

/* ---- sequences ---- */

/* The items a for loop or a filter walks: list items, dict keys, characters. */
static jlist *iter_items(cb_jrender *r, jv v, int line) {
    if (v.t == V_LIST) return v.u.l;
    jv out = mk_list(r, 0);
    if (v.t == V_DICT || v.t == V_NS) {
        for (size_t i = 0; i < v.u.d->n; i++) list_push(r, out.u.l, v.u.d->k[i]);
    } else if (v.t == V_STR) {
        for (size_t i = 0; i < v.n;) {
            size_t j = i;
            utf8_next(v.u.s, v.n, &j);
            list_push(r, out.u.l, mk_str(v.u.s + i, j - i));
            i = j;
        }
    } else if (v.t != V_UNDEF) {
        rfail(r, CB_JINJA_ERROR, line, "'%s' object is not iterable", type_name(v));
    }
    return out.u.l;
}

static int64_t length(cb_jrender *r, jv v, int line) {
    switch (v.t) {
    case V_STR: return (int64_t)cp_count(v.u.s, v.n);
    case V_LIST: return (int64_t)v.u.l->n;
    case V_DICT: return (int64_t)v.u.d->n;
    case V_UNDEF: return 0;
    default: rfail(r, CB_JINJA_ERROR, line, "object of type '%s' has no len()", type_name(v));
    }
    return 0;
}

static int cmp(cb_jrender *r, jv a, jv b, int line) {
    if (is_num(a) && is_num(b)) {
        if (a.t != V_FLOAT && b.t != V_FLOAT) return a.u.i < b.u.i ? -1 : a.u.i > b.u.i;
        return num(a) < num(b) ? -1 : num(a) > num(b);
    }
    if (a.t == V_STR && b.t == V_STR) {
        int c = memcmp(a.u.s, b.u.s, a.n < b.n ? a.n : b.n);
        return c ? (c < 0 ? -1 : 1) : a.n < b.n ? -1 : a.n > b.n;
    }
    if (a.t == V_LIST && b.t == V_LIST) {
        for (size_t i = 0; i < a.u.l->n && i < b.u.l->n; i++) {
            int c = cmp(r, a.u.l->v[i], b.u.l->v[i], line);
            if (c) return c;
        }
        return a.u.l->n < b.u.l->n ? -1 : a.u.l->n > b.u.l->n;
    }
    rfail(r, CB_JINJA_ERROR, line, "'<' not supported between instances of '%s' and '%s'", type_name(a), type_name(b));
    return 0;
}

static int contains(cb_jrender *r, jv hay, jv needle, int line) {
    if (hay.t == V_STR) {
        if (needle.t != V_STR)
            rfail(r, CB_JINJA_ERROR, line, "'in <string>' requires string as left operand, not %s", type_name(needle));
        return find_sub(hay.u.s, hay.n, needle.u.s, needle.n) != NULL;
    }
    if (hay.t == V_LIST) {
        for (size_t i = 0; i < hay.u.l->n; i++)
            if (eq(hay.u.l->v[i], needle)) return 1;
        return 0;
    }
    if (hay.t == V_DICT || hay.t == V_NS) {
        for (size_t i = 0; i < hay.u.d->n; i++)
            if (eq(hay.u.d->k[i], needle)) return 1;
        return 0;
    }
    if (hay.t == V_UNDEF) return 0;
    rfail(r, CB_JINJA_ERROR, line, "argument of type '%s' is not iterable", type_name(hay));
    return 0;
}

static jv slice(cb_jrender *r, jv v, jv a, jv b, jv c, int line) {
    int64_t step = c.t == V_NONE || c.t == V_UNDEF ? 1 : c.u.i;
    if ((c.t != V_NONE && c.t != V_UNDEF && c.t != V_INT) || (a.t != V_NONE && a.t != V_UNDEF && a.t != V_INT) ||
        (b.t != V_NONE && b.t != V_UNDEF && b.t != V_INT))
        rfail(r, CB_JINJA_ERROR, line, "slice indices must be integers or None");
    if (step == 0) rfail(r, CB_JINJA_ERROR, line, "slice step cannot be zero");
    int is_str = v.t == V_STR;
    if (!is_str && v.t != V_LIST) rfail(r, CB_JINJA_ERROR, line, "'%s' object is not subscriptable", type_name(v));
    int64_t n = is_str ? (int64_t)cp_count(v.u.s, v.n) : (int64_t)v.u.l->n;
    int64_t lo, hi;
    int64_t def_lo = step > 0 ? 0 : n - 1, def_hi = step > 0 ? n : -1;
    lo = a.t == V_INT ? a.u.i : def_lo;
    hi = b.t == V_INT ? b.u.i : def_hi;
    if (a.t == V_INT) {
        if (lo < 0) lo += n;
        if (lo < 0) lo = step > 0 ? 0 : -1;
        if (lo >= n) lo = step > 0 ? n : n - 1;
    }
    if (b.t == V_INT) {
        if (hi < 0) hi += n;
        if (hi < 0) hi = step > 0 ? 0 : -1;
        if (hi >= n) hi = step > 0 ? n : n - 1;
    }
    if (is_str) {
        if (step == 1) {
            if (hi < lo) hi = lo;
            size_t from = cp_offset(v.u.s, v.n, (size_t)lo), to = cp_offset(v.u.s, v.n, (size_t)hi);
            return mk_str(v.u.s + from, to - from);
        }
        obuf o = new_obuf(r, v.n + 1);
        for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step) {
            size_t from = cp_offset(v.u.s, v.n, (size_t)i), to = from;
            utf8_next(v.u.s, v.n, &to);
            oput(r, &o, v.u.s + from, to - from);
        }
        return obuf_str(&o);
    }
    jv out = mk_list(r, 0);
    out.tuple = v.tuple;
    for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step) list_push(r, out.u.l, v.u.l->v[i]);
    return out;
}

static jv getitem(cb_jrender *r, jv obj, jv key, int line) {
    switch (obj.t) {
    case V_DICT: case V_NS:
        for (size_t i = 0; i < obj.u.d->n; i++)
            if (eq(obj.u.d->k[i], key)) return obj.u.d->v[i];
        return mk_undef(NULL);
    case V_LIST:
        if (key.t == V_INT || key.t == V_BOOL) {
            int64_t i = key.u.i < 0 ? key.u.i + (int64_t)obj.u.l->n : key.u.i;
            if (i >= 0 && i < (int64_t)obj.u.l->n) return obj.u.l->v[i];
        }
        return mk_undef(NULL);
    case V_STR:
        if (key.t == V_INT || key.t == V_BOOL) {
            int64_t n = (int64_t)cp_count(obj.u.s, obj.n);
            int64_t i = key.u.i < 0 ? key.u.i + n : key.u.i;
            if (i >= 0 && i < n) {
                size_t from = cp_offset(obj.u.s, obj.n, (size_t)i), to = from;
                utf8_next(obj.u.s, obj.n, &to);
                return mk_str(obj.u.s + from, to - from);
            }
        }
        return mk_undef(NULL);
    case V_UNDEF:
        rfail(r, CB_JINJA_ERROR, line, "'%s' is undefined", obj.u.s ? obj.u.s : "value");
    default: return mk_undef(NULL);
    }
}

static jv getattr_(cb_jrender *r, jv obj, const char *name, size_t n, int line) {
    if (obj.t == V_LOOP) {
        jloop *lp = obj.u.lp;
        int64_t len = (int64_t)lp->items->n, i = (int64_t)lp->index;
#define IS(s) (n == sizeof s - 1 && !memcmp(name, s, n))
        if (IS("index0")) return mk_int(i);
        if (IS("index")) return mk_int(i + 1);
        if (IS("first")) return mk_bool(i == 0);
        if (IS("last")) return mk_bool(i == len - 1);
        if (IS("length")) return mk_int(len);
        if (IS("revindex")) return mk_int(len - i);
        if (IS("revindex0")) return mk_int(len - i - 1);
        if (IS("depth")) return mk_int(1);
        if (IS("depth0")) return mk_int(0);
        if (IS("previtem")) return i > 0 ? lp->items->v[i - 1] : mk_undef("previtem");
        if (IS("nextitem")) return i + 1 < len ? lp->items->v[i + 1] : mk_undef("nextitem");
        return mk_undef(NULL);
    }
    if (obj.t == V_DICT || obj.t == V_NS) {
        jv *v = dict_find(obj.u.d, name, n);
        return v ? *v : mk_undef(NULL);
    }
    if (obj.t == V_UNDEF) rfail(r, CB_JINJA_ERROR, line, "'%s' is undefined", obj.u.s ? obj.u.s : "value");
    return mk_undef(NULL);
}

/* ---- evaluation ---- */

static jv eval(cb_jrender *r, const node *x, frame *f);
static void exec(cb_jrender *r, const node *x, frame *f, obuf *o);

static int name_is(const node *x, const char *s) { return x->n == strlen(s) && !memcmp(x->s, s, x->n); }

static jv lookup(cb_jrender *r, frame *f, const char *name, size_t n) {
    for (; f; f = f->up)
        for (var *v = f->vars; v; v = v->next)
            if (v->n == n && !memcmp(v->name, name, n)) return v->v;
    (void)r;
    jv fn = {V_FUNC, 0, 0, {0}};
    if (IS("range")) return fn.u.i = F_RANGE, fn;
    if (IS("namespace")) return fn.u.i = F_NAMESPACE, fn;
    if (IS("dict")) return fn.u.i = F_DICT, fn;
    if (IS("raise_exception")) return fn.u.i = F_RAISE, fn;
    if (IS("strftime_now")) return fn.u.i = F_STRFTIME, fn;
    return mk_undef(name); /* names are NUL-free slices: printed with their length below */
}

static void assign(cb_jrender *r, frame *f, const char *name, size_t n, jv v) {
    for (var *x = f->vars; x; x = x->next)
        if (x->n == n && !memcmp(x->name, name, n)) {
            x->v = v;
            return;
        }
    var *x = rtake(r, sizeof *x);
    x->name = name, x->n = n, x->v = v, x->next = f->vars;
    f->vars = x;
}

/* Arguments of a call: positional values and name=value pairs. */
typedef struct {
    jv pos[8];
    int n_pos;
    const char *kw[8];
    size_t kw_n[8];
    jv kwv[8];
    int n_kw;
} args;

static void eval_args(cb_jrender *r, const node *a, frame *f, args *out, int line) {
    out->n_pos = out->n_kw = 0;
    for (; a; a = a->next) {
        if (a->kind == E_KWARG) {
            if (out->n_kw == 8) rfail(r, CB_JINJA_ERROR, line, "too many keyword arguments");
            out->kw[out->n_kw] = a->s, out->kw_n[out->n_kw] = a->n, out->kwv[out->n_kw++] = eval(r, a->a, f);
        } else {
            if (out->n_pos == 8) rfail(r, CB_JINJA_ERROR, line, "too many arguments");
            out->pos[out->n_pos++] = eval(r, a, f);
        }
    }
}
/* Argument i, or the keyword name, or dflt. */
static jv arg(const args *a, int i, const char *name, jv dflt) {
    if (i < a->n_pos) return a->pos[i];
    for (int k = 0; name && k < a->n_kw; k++)
        if (a->kw_n[k] == strlen(name) && !memcmp(a->kw[k], name, a->kw_n[k])) return a->kwv[k];
    return dflt;
}
static jv want_str(cb_jrender *r, jv v, const char *what, int line) {
    if (v.t != V_STR) rfail(r, CB_JINJA_ERROR, line, "%s must be a string, not %s", what, type_name(v));
    return v;
}
static int64_t want_int(cb_jrender *r, jv v, const char *what, int line) {
    if (v.t != V_INT && v.t != V_BOOL) rfail(r, CB_JINJA_ERROR, line, "%s must be an integer, not %s", what, type_name(v));
    return v.u.i;
}

static jv call_macro(cb_jrender *r, const node *m, const args *a, const node *caller, int line) {
    if (r->depth > 60) rfail(r, CB_JINJA_ERROR, line, "macros nested too deeply");
    frame *f = rtake(r, sizeof *f);
    f->up = r->top, f->vars = NULL;
    int i = 0;
    for (const node *p = m->a; p; p = p->next, i++) {
        jv v = mk_undef(NULL);
        int found = 0;
        if (i < a->n_pos) v = a->pos[i], found = 1;
        for (int k = 0; k < a->n_kw && !found; k++)
            if (a->kw_n[k] == p->n && !memcmp(a->kw[k], p->s, p->n)) v = a->kwv[k], found = 1;
        if (!found && p->a) v = eval(r, p->a, f);
        assign(r, f, p->s, p->n, v);
    }
    if (a->n_pos > i) rfail(r, CB_JINJA_ERROR, line, "macro '%.*s' takes not more than %d argument(s)", (int)m->n, m->s, i);
    const node *saved = r->caller;
    r->caller = caller;
    if (caller) {
        jv c = {V_MACRO, 1, 0, {0}};
        c.u.m = caller;
        assign(r, f, "caller", 6, c);
    }
    obuf o = new_obuf(r, 256);
    r->depth++;
    int ctl = r->loop_ctl;
    exec(r, m->b, f, &o);
    r->loop_ctl = ctl;
    r->depth--;
    r->caller = saved;
    return obuf_str(&o);
}

static jv strftime_now(cb_jrender *r, jv fmt, int line) {
    want_str(r, fmt, "strftime_now's format", line);
    char cfmt[128], out[256];
    if (fmt.n >= sizeof cfmt) rfail(r, CB_JINJA_ERROR, line, "strftime_now: the format is too long");
    memcpy(cfmt, fmt.u.s, fmt.n);
    cfmt[fmt.n] = 0;
    time_t now = time(NULL);
    struct tm tm;
#ifdef _WIN32
    localtime_s(&tm, &now);
#else
    localtime_r(&now, &tm);
#endif
    size_t n = fmt.n ? strftime(out, sizeof out, cfmt, &tm) : 0;
    char *s = rtake(r, n + 1);
    memcpy(s, out, n);
    return mk_str(s, n);
}

static jv call_value(cb_jrender *r, jv fn, const args *a, int line, const node *callee) {
    if (fn.t == V_MACRO) {
        if (fn.tuple) { /* caller(): the {% call %} block's body */
            obuf o = new_obuf(r, 128);
            exec(r, fn.u.m, r->top, &o);
            return obuf_str(&o);
        }
        return call_macro(r, fn.u.m, a, NULL, line);
    }
    if (fn.t == V_FUNC) {
        switch (fn.u.i) {
        case F_RANGE: {
            int64_t lo = 0, hi, step = 1;
            if (a->n_pos == 1) hi = want_int(r, a->pos[0], "range()", line);
            else if (a->n_pos >= 2) {
                lo = want_int(r, a->pos[0], "range()", line), hi = want_int(r, a->pos[1], "range()", line);
                if (a->n_pos > 2) step = want_int(r, a->pos[2], "range()", line);
            } else rfail(r, CB_JINJA_ERROR, line, "range expected at least 1 argument");
            if (step == 0) rfail(r, CB_JINJA_ERROR, line, "range() arg 3 must not be zero");
            jv out = mk_list(r, 0);
            for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step) {
                if (++r->steps > MAX_STEPS) rfail(r, CB_JINJA_ERROR, line, "the template runs too long");
                list_push(r, out.u.l, mk_int(i));
            }
            return out;
        }
        case F_NAMESPACE: case F_DICT: {
            jv d = mk_dict(r, 4);
            if (fn.u.i == F_NAMESPACE) d.t = V_NS;
            for (int i = 0; i < a->n_pos; i++) {
                if (a->pos[i].t != V_DICT) rfail(r, CB_JINJA_ERROR, line, "namespace()/dict() takes a mapping");
                for (size_t k = 0; k < a->pos[i].u.d->n; k++) dict_set(r, d.u.d, a->pos[i].u.d->k[k], a->pos[i].u.d->v[k]);
            }
            for (int k = 0; k < a->n_kw; k++) dict_set(r, d.u.d, mk_str(a->kw[k], a->kw_n[k]), a->kwv[k]);
            return d;
        }
        case F_RAISE: {
            jv m = to_str(r, arg(a, 0, "message", mk_str("", 0)));
            rfail(r, CB_JINJA_RAISED, line, "%.*s", (int)(m.n > 300 ? 300 : m.n), m.u.s);
        }
        /* fallthrough */
        case F_STRFTIME: return strftime_now(r, arg(a, 0, "format", mk_none()), line);
        }
    }
    if (fn.t == V_UNDEF) {
        if (callee && callee->kind == E_NAME)
            rfail(r, CB_JINJA_ERROR, line, "'%.*s' is undefined", (int)callee->n, callee->s);
        rfail(r, CB_JINJA_ERROR, line, "%s is undefined and cannot be called",
              callee && callee->kind == E_ATTR ? "the attribute" : "the value");
    }
    rfail(r, CB_JINJA_ERROR, line, "'%s' object is not callable", type_name(fn));
    return mk_none();
}

static int run_test(cb_jrender *r, const char *name, size_t n, jv v, const args *a, int line);
static jv run_filter(cb_jrender *r, const char *name, size_t n, jv v, const args *a, int line, frame *f);

/* obj.name(args): Python's str, dict methods. */
static int call_method(cb_jrender *r, jv obj, const char *name, size_t n, const args *a, int line, jv *out) {
    jv none = mk_none();
    if (obj.t == V_LOOP && IS("cycle")) {
        if (!a->n_pos) rfail(r, CB_JINJA_ERROR, line, "no items for cycling given");
        *out = a->pos[obj.u.lp->index % (size_t)a->n_pos];
        return 1;
    }
    if (obj.t == V_STR) {
        if (IS("strip") || IS("lstrip") || IS("rstrip")) {
            jv chars = arg(a, 0, "chars", none);
            *out = strip(obj, chars, name[0] != 'r', name[0] != 'l');
        } else if (IS("split") || IS("rsplit")) {
            jv sep = arg(a, 0, "sep", none);
            if (sep.t != V_NONE) want_str(r, sep, "split's separator", line);
            jv ms = arg(a, 1, "maxsplit", mk_int(-1));
            *out = (IS("split") ? split : rsplit)(r, obj, sep, want_int(r, ms, "maxsplit", line), line);
        } else if (IS("startswith") || IS("endswith")) {
            jv p = arg(a, 0, NULL, none);
            int starts = IS("startswith"), hit = 0;
            jv one[1] = {p};
            jv *cands = p.t == V_LIST ? p.u.l->v : one;
            size_t nc = p.t == V_LIST ? p.u.l->n : 1;
            for (size_t i = 0; i < nc && !hit; i++) {
                jv c = want_str(r, cands[i], name, line);
                hit = c.n <= obj.n && !memcmp(starts ? obj.u.s : obj.u.s + obj.n - c.n, c.u.s, c.n);
            }
            *out = mk_bool(hit);
        } else if (IS("replace")) {
            jv c = arg(a, 2, "count", mk_int(-1));
            *out = replace(r, obj, want_str(r, arg(a, 0, NULL, none), "replace's old", line),
                           want_str(r, arg(a, 1, NULL, none), "replace's new", line), want_int(r, c, "count", line));
        } else if (IS("lower") || IS("upper") || IS("capitalize") || IS("title")) {
            *out = str_case(r, obj, IS("lower") ? 0 : IS("upper") ? 1 : IS("capitalize") ? 2 : 3);
        } else if (IS("find") || IS("rfind") || IS("index") || IS("count")) {
            jv sub = want_str(r, arg(a, 0, NULL, none), name, line);
            if (IS("count")) {
                int64_t c = 0;
                if (sub.n == 0) c = (int64_t)cp_count(obj.u.s, obj.n) + 1;
                else
                    for (const char *p = obj.u.s; (p = find_sub(p, obj.n - (size_t)(p - obj.u.s), sub.u.s, sub.n));
                         p += sub.n)
                        c++;
                *out = mk_int(c);
                return 1;
            }
            const char *hit = NULL;
            if (IS("rfind")) {
                for (size_t i = obj.n + 1; i-- > 0;)
                    if (i + sub.n <= obj.n && !memcmp(obj.u.s + i, sub.u.s, sub.n)) {
                        hit = obj.u.s + i;
                        break;
                    }
            } else {
                hit = find_sub(obj.u.s, obj.n, sub.u.s, sub.n);
            }
            if (!hit && IS("index")) rfail(r, CB_JINJA_ERROR, line, "substring not found");
            *out = mk_int(hit ? (int64_t)cp_count(obj.u.s, (size_t)(hit - obj.u.s)) : -1);
        } else if (IS("join")) {
            jlist *items = iter_items(r, arg(a, 0, NULL, none), line);
            obuf o = new_obuf(r, 64);
            for (size_t i = 0; i < items->n; i++) {
                if (i) oput(r, &o, obj.u.s, obj.n);
                oput(r, &o, want_str(r, items->v[i], "join's items", line).u.s, items->v[i].n);
            }
            *out = obuf_str(&o);
        } else if (IS("isdigit") || IS("isspace") || IS("isalpha") || IS("isalnum")) {
            int ok = obj.n > 0;
            for (size_t i = 0; i < obj.n && ok; i++) {
                unsigned char c = (unsigned char)obj.u.s[i];
                int d = c >= '0' && c <= '9', al = (c | 32) >= 'a' && (c | 32) <= 'z';
                ok = IS("isdigit") ? d : IS("isspace") ? py_space(c) : IS("isalpha") ? al : d || al;
            }
            *out = mk_bool(ok);
        } else {
            return 0;
        }
        return 1;
    }
    if (obj.t == V_DICT) {
        if (IS("items") || IS("keys") || IS("values")) {
            jv l = mk_list(r, obj.u.d->n);
            for (size_t i = 0; i < obj.u.d->n; i++) {
                if (IS("items")) {
                    jv pair = mk_list(r, 2);
                    pair.tuple = 1;
                    list_push(r, pair.u.l, obj.u.d->k[i]), list_push(r, pair.u.l, obj.u.d->v[i]);
                    list_push(r, l.u.l, pair);
                } else {
                    list_push(r, l.u.l, IS("keys") ? obj.u.d->k[i] : obj.u.d->v[i]);
                }
            }
            *out = l;
        } else if (IS("get")) {
            jv v = getitem(r, obj, arg(a, 0, "key", none), line);
            *out = v.t == V_UNDEF ? arg(a, 1, "default", none) : v;
        } else {
            return 0;
        }
        return 1;
    }
    return 0;
}

/* Python's "fmt % args" for the conversions templates use: %s %r %d %i
 * %f (with a precision) and %%. */
static jv percent_format(cb_jrender *r, jv fmt, jv args, int line) {
    jv one[1] = {args};
    jv *items = args.t == V_LIST && args.tuple ? args.u.l->v : one;
    size_t n = args.t == V_LIST && args.tuple ? args.u.l->n : 1, used = 0;
    obuf o = new_obuf(r, fmt.n + 32);
    for (size_t i = 0; i < fmt.n; i++) {
        if (fmt.u.s[i] != '%') {
            oput(r, &o, fmt.u.s + i, 1);
            continue;
        }
        if (++i >= fmt.n) rfail(r, CB_JINJA_ERROR, line, "incomplete format");
        int prec = -1;
        if (fmt.u.s[i] == '.') {
            prec = 0;
            while (++i < fmt.n && is_digit(fmt.u.s[i])) prec = prec * 10 + (fmt.u.s[i] - '0');
            if (i >= fmt.n) rfail(r, CB_JINJA_ERROR, line, "incomplete format");
        }
        char c = fmt.u.s[i];
        if (c == '%') {
            oputs(r, &o, "%");
            continue;
        }
        if (used >= n) rfail(r, CB_JINJA_ERROR, line, "not enough arguments for format string");
        jv v = items[used++];
        if (c == 's') put_str(r, &o, v);
        else if (c == 'r') put_repr(r, &o, v);
        else if ((c == 'd' || c == 'i') && is_num(v)) put_int(r, &o, v.t == V_FLOAT ? (int64_t)v.u.f : v.u.i);
        else if (c == 'f' && is_num(v)) {
            char buf[64];
            int k = snprintf(buf, sizeof buf, "%.*f", prec < 0 ? 6 : (prec > 30 ? 30 : prec), num(v));
            oput(r, &o, buf, (size_t)k);
        } else rfail(r, CB_JINJA_ERROR, line, "unsupported format character '%c' for %s", c, type_name(v));
    }
    if (used < n) rfail(r, CB_JINJA_ERROR, line, "not all arguments converted during string formatting");
    return obuf_str(&o);
}

static jv binop(cb_jrender *r, int op, jv a, jv b, int line) {
    if (op == OP_CONCAT) {
        obuf o = new_obuf(r, 16 + (a.t == V_STR ? a.n : 0) + (b.t == V_STR ? b.n : 0));
        put_str(r, &o, a), put_str(r, &o, b);
        return obuf_str(&o);
    }
    switch (op) {
    case OP_EQ: return mk_bool(eq(a, b));
    case OP_NE: return mk_bool(!eq(a, b));
    case OP_LT: return mk_bool(cmp(r, a, b, line) < 0);
    case OP_LE: return mk_bool(cmp(r, a, b, line) <= 0);
    case OP_GT: return mk_bool(cmp(r, a, b, line) > 0);
    case OP_GE: return mk_bool(cmp(r, a, b, line) >= 0);
    case OP_IN: return mk_bool(contains(r, b, a, line));
    case OP_NOTIN: return mk_bool(!contains(r, b, a, line));
    default: break;
    }
    if (is_num(a) && is_num(b)) {
        int ints = a.t != V_FLOAT && b.t != V_FLOAT;
        double x = num(a), y = num(b);
        switch (op) {
        case OP_ADD: return ints ? mk_int((int64_t)((uint64_t)a.u.i + (uint64_t)b.u.i)) : mk_float(x + y);
        case OP_SUB: return ints ? mk_int((int64_t)((uint64_t)a.u.i - (uint64_t)b.u.i)) : mk_float(x - y);
        case OP_MUL: return ints ? mk_int((int64_t)((uint64_t)a.u.i * (uint64_t)b.u.i)) : mk_float(x * y);
        case OP_DIV:
            if (y == 0) rfail(r, CB_JINJA_ERROR, line, "division by zero");
            return mk_float(x / y);
        case OP_FLOORDIV: case OP_MOD:
            if (y == 0) rfail(r, CB_JINJA_ERROR, line, "integer division or modulo by zero");
            if (ints) {
                int64_t q = a.u.i / b.u.i, m = a.u.i % b.u.i;
                if (m != 0 && ((m < 0) != (b.u.i < 0))) q--, m += b.u.i;
                return mk_int(op == OP_MOD ? m : q);
            } else {
                double q = floor(x / y), m = x - q * y;
                return mk_float(op == OP_MOD ? m : q);
            }
        case OP_POW:
            if (ints && b.u.i >= 0) {
                int64_t p = 1;
                for (int64_t i = 0; i < b.u.i && i < 64; i++) p = (int64_t)((uint64_t)p * (uint64_t)a.u.i);
                return mk_int(p);
            }
            return mk_float(pow(x, y));
        default: break;
        }
    }
    if (op == OP_MOD && a.t == V_STR) return percent_format(r, a, b, line);
    if (op == OP_ADD && a.t == V_STR && b.t == V_STR) {
        char *s = rtake(r, a.n + b.n + 1);
        memcpy(s, a.u.s, a.n), memcpy(s + a.n, b.u.s, b.n);
        return mk_str(s, a.n + b.n);
    }
    if (op == OP_ADD && a.t == V_LIST && b.t == V_LIST) {
        jv out = mk_list(r, a.u.l->n + b.u.l->n);
        out.tuple = a.tuple;
        for (size_t i = 0; i < a.u.l->n; i++) list_push(r, out.u.l, a.u.l->v[i]);
        for (size_t i = 0; i < b.u.l->n; i++) list_push(r, out.u.l, b.u.l->v[i]);
        return out;
    }
    if (op == OP_MUL && (a.t == V_STR || a.t == V_LIST) && (b.t == V_INT || b.t == V_BOOL)) {
        if (a.t == V_STR) {
            obuf o = new_obuf(r, 16);
            for (int64_t i = 0; i < b.u.i; i++) oput(r, &o, a.u.s, a.n);
            return obuf_str(&o);
        }
        jv out = mk_list(r, 0);
        for (int64_t i = 0; i < b.u.i; i++)
            for (size_t k = 0; k < a.u.l->n; k++) list_push(r, out.u.l, a.u.l->v[k]);
        return out;
    }
    static const char *ops[] = {"+", "-", "*", "/", "//", "%", "**"};
    rfail(r, CB_JINJA_ERROR, line, "unsupported operand type(s) for %s: '%s' and '%s'", ops[op], type_name(a),
          type_name(b));
    return mk_none();
}

static jv eval(cb_jrender *r, const node *x, frame *f) {
    if (++r->steps > MAX_STEPS) rfail(r, CB_JINJA_ERROR, x->line, "the template runs too long");
    if (++r->depth > 2000) rfail(r, CB_JINJA_ERROR, x->line, "the template nests too deeply");
    jv v;
    switch (x->kind) {
    case E_CONST: v = x->val; break;
    case E_NAME:
        v = lookup(r, f, x->s, x->n);
        if (v.t == V_UNDEF) {
            char *s = rtake(r, x->n + 1);
            memcpy(s, x->s, x->n);
            s[x->n] = 0;
            v.u.s = s;
        }
        break;
    case E_ATTR: v = getattr_(r, eval(r, x->a, f), x->s, x->n, x->line); break;
    case E_ITEM: {
        jv obj = eval(r, x->a, f);
        jv key = eval(r, x->b, f);
        v = getitem(r, obj, key, x->line);
        if (v.t == V_UNDEF && key.t == V_STR) v = getattr_(r, obj, key.u.s, key.n, x->line);
        break;
    }
    case E_SLICE: {
        jv obj = eval(r, x->a, f), none = mk_none();
        v = slice(r, obj, x->b ? eval(r, x->b, f) : none, x->c ? eval(r, x->c, f) : none,
                  x->d ? eval(r, x->d, f) : none, x->line);
        break;
    }
    case E_CALL: {
        args a;
        if (x->a->kind == E_ATTR) {
            jv obj = eval(r, x->a->a, f);
            eval_args(r, x->b, f, &a, x->line);
            if (call_method(r, obj, x->a->s, x->a->n, &a, x->line, &v)) break;
            if (obj.t == V_LIST && (name_is(x->a, "append") || name_is(x->a, "pop") || name_is(x->a, "insert") ||
                                    name_is(x->a, "extend") || name_is(x->a, "remove") || name_is(x->a, "sort")))
                rfail(r, CB_JINJA_ERROR, x->line, "access to attribute '%.*s' of 'list' object is unsafe",
                      (int)x->a->n, x->a->s);
            v = call_value(r, getattr_(r, obj, x->a->s, x->a->n, x->line), &a, x->line, x->a);
            break;
        }
        jv fn = eval(r, x->a, f);
        eval_args(r, x->b, f, &a, x->line);
        v = call_value(r, fn, &a, x->line, x->a);
        break;
    }
    case E_FILTER: {
        args a;
        jv obj = eval(r, x->a, f);
        eval_args(r, x->b, f, &a, x->line);
        v = run_filter(r, x->s, x->n, obj, &a, x->line, f);
        break;
    }
    case E_TEST: {
        args a;
        jv obj = eval(r, x->a, f);
        eval_args(r, x->b, f, &a, x->line);
        v = mk_bool(run_test(r, x->s, x->n, obj, &a, x->line) != x->neg);
        break;
    }
    case E_NEG: case E_POS: {
        jv a = eval(r, x->a, f);
        if (!is_num(a)) rfail(r, CB_JINJA_ERROR, x->line, "bad operand type for unary %c: '%s'",
                              x->kind == E_NEG ? '-' : '+', type_name(a));
        v = x->kind == E_POS ? (a.t == V_BOOL ? mk_int(a.u.i) : a)
            : a.t == V_FLOAT ? mk_float(-a.u.f) : mk_int((int64_t)(0 - (uint64_t)a.u.i));
        break;
    }
    case E_NOT: v = mk_bool(!truthy(eval(r, x->a, f))); break;
    case E_AND: v = eval(r, x->a, f), v = truthy(v) ? eval(r, x->b, f) : v; break;
    case E_OR: v = eval(r, x->a, f), v = truthy(v) ? v : eval(r, x->b, f); break;
    case E_BIN: {
        jv a = eval(r, x->a, f);
        v = binop(r, x->op, a, eval(r, x->b, f), x->line);
        break;
    }
    case E_COND: v = truthy(eval(r, x->a, f)) ? eval(r, x->b, f) : x->c ? eval(r, x->c, f) : mk_undef(NULL); break;
    case E_LIST: case E_TUPLE:
        v = mk_list(r, 4);
        v.tuple = x->kind == E_TUPLE;
        for (const node *e = x->a; e; e = e->next) list_push(r, v.u.l, eval(r, e, f));
        break;
    case E_DICT:
        v = mk_dict(r, 4);
        for (const node *e = x->a; e; e = e->next) {
            jv k = eval(r, e->a, f);
            dict_set(r, v.u.d, k, eval(r, e->b, f));
        }
        break;
    default: rfail(r, CB_JINJA_ERROR, x->line, "cannot evaluate this expression"); v = mk_none();
    }
    r->depth--;
    return v;
}

/* ---- tests and filters ---- */

static int run_test(cb_jrender *r, const char *name, size_t n, jv v, const args *a, int line) {
    jv none = mk_none(), x = arg(a, 0, NULL, none);
    if (IS("defined")) return v.t != V_UNDEF;
    if (IS("undefined")) return v.t == V_UNDEF;
    if (IS("none")) return v.t == V_NONE;
    if (IS("string")) return v.t == V_STR;
    if (IS("number")) return v.t == V_INT || v.t == V_FLOAT || v.t == V_BOOL;
    if (IS("integer")) return v.t == V_INT;
    if (IS("float")) return v.t == V_FLOAT;
    if (IS("boolean")) return v.t == V_BOOL;
    if (IS("true")) return v.t == V_BOOL && v.u.i;
    if (IS("false")) return v.t == V_BOOL && !v.u.i;
    if (IS("mapping")) return v.t == V_DICT;
    if (IS("iterable")) return v.t == V_STR || v.t == V_LIST || v.t == V_DICT || v.t == V_NS;
    if (IS("sequence")) return v.t == V_STR || v.t == V_LIST || v.t == V_DICT;
    if (IS("callable")) return v.t == V_MACRO || v.t == V_FUNC;
    if (IS("equalto") || IS("eq") || IS("==") || IS("sameas")) return eq(v, x) && (!IS("sameas") || v.t == x.t);
    if (IS("ne") || IS("!=")) return !eq(v, x);
    if (IS("lt") || IS("lessthan") || IS("<")) return cmp(r, v, x, line) < 0;
    if (IS("le") || IS("<=")) return cmp(r, v, x, line) <= 0;
    if (IS("gt") || IS("greaterthan") || IS(">")) return cmp(r, v, x, line) > 0;
    if (IS("ge") || IS(">=")) return cmp(r, v, x, line) >= 0;
    if (IS("in")) return contains(r, x, v, line);
    if (IS("odd") || IS("even") || IS("divisibleby")) {
        int64_t i = want_int(r, v, "the tested value", line);
        int64_t d = IS("divisibleby") ? want_int(r, x, "divisibleby's argument", line) : 2;
        if (d == 0) rfail(r, CB_JINJA_ERROR, line, "integer division or modulo by zero");
        return IS("odd") ? i % 2 != 0 : i % d == 0;
    }
    if (IS("lower") || IS("upper")) {
        if (v.t != V_STR) return 0;
        jv c = str_case(r, v, IS("upper"));
        return !memcmp(c.u.s, v.u.s, v.n);
    }
    rfail(r, CB_JINJA_ERROR, line, "no test named '%.*s'", (int)n, name);
    return 0;
}

static jv attr_path(cb_jrender *r, jv v, jv path, int line) {
    /* "a.b" walks nested attributes, as jinja's attribute filters do */
    want_str(r, path, "the attribute", line);
    size_t i = 0;
    while (i <= path.n) {
        size_t j = i;
        while (j < path.n && path.u.s[j] != '.') j++;
        jv key = mk_str(path.u.s + i, j - i);
        int digits = j > i;
        for (size_t k = i; k < j; k++) digits &= is_digit(path.u.s[k]);
        if (digits && v.t == V_LIST) key = mk_int(strtoll(path.u.s + i, NULL, 10));
        if (v.t == V_UNDEF) return v;
        v = getitem(r, v, key, line);
        i = j + 1;
    }
    return v;
}

/* The int and float filters' reading of a string: 1 and its number where
 * strtod reads one from its start (at most 63 bytes of it), else 0. */
static int str_number(jv v, double *d) {
    if (v.t != V_STR) return 0;
    char buf[64];
    size_t k = v.n < 63 ? v.n : 63;
    memcpy(buf, v.u.s, k), buf[k] = 0;
    char *end;
    *d = strtod(buf, &end);
    return end != buf;
}

/* Stable insertion sort for the sort and dictsort filters: by column col of
 * each item (a (key, value) pair) when col >= 0, else by attribute attr
 * (none: the item itself); strings compare lower-cased unless case_sensitive. */
static void sort_list(cb_jrender *r, jlist *l, int col, jv attr, int case_sensitive, int reverse, int line) {
    for (size_t i = 1; i < l->n; i++)
        for (size_t j = i; j > 0; j--) {
            jv x = l->v[j - 1], y = l->v[j];
            if (col >= 0) x = x.u.l->v[col], y = y.u.l->v[col];
            else if (attr.t != V_NONE) x = attr_path(r, x, attr, line), y = attr_path(r, y, attr, line);
            if (!case_sensitive) {
                if (x.t == V_STR) x = str_case(r, x, 0);
                if (y.t == V_STR) y = str_case(r, y, 0);
            }
            int c = cmp(r, x, y, line);
            if (reverse ? c >= 0 : c <= 0) break;
            jv tmp = l->v[j];
            l->v[j] = l->v[j - 1], l->v[j - 1] = tmp;
        }
}

static jv run_filter(cb_jrender *r, const char *name, size_t n, jv v, const args *a, int line, frame *f) {
    jv none = mk_none();
    (void)f;
    if (IS("length") || IS("count")) return mk_int(length(r, v, line));
    if (IS("string")) return to_str(r, v);
    if (IS("safe") || IS("e") || IS("escape")) {
        if (IS("safe")) return v;
        jv s = to_str(r, v);
        obuf o = new_obuf(r, s.n + 16);
        for (size_t i = 0; i < s.n; i++) {
            char c = s.u.s[i];
            oputs(r, &o, c == '&' ? "&amp;" : c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '"' ? "&#34;"
                         : c == '\'' ? "&#39;" : "");
            if (!strchr("&<>\"'", c)) oput(r, &o, &c, 1);
        }
        return obuf_str(&o);
    }
    if (IS("trim")) return strip(to_str(r, v), arg(a, 0, "chars", none), 1, 1);
    if (IS("lower") || IS("upper") || IS("capitalize") || IS("title"))
        return str_case(r, to_str(r, v), IS("lower") ? 0 : IS("upper") ? 1 : IS("capitalize") ? 2 : 3);
    if (IS("replace")) {
        jv c = arg(a, 2, "count", none);
        return replace(r, to_str(r, v), to_str(r, arg(a, 0, "old", none)), to_str(r, arg(a, 1, "new", none)),
                       c.t == V_NONE ? -1 : want_int(r, c, "count", line));
    }
    if (IS("default") || IS("d")) {
        int boolean = truthy(arg(a, 1, "boolean", mk_bool(0)));
        if (v.t == V_UNDEF || (boolean && !truthy(v))) return arg(a, 0, "default_value", mk_str("", 0));
        return v;
    }
    if (IS("tojson")) {
        json_opts js = {0, 0, NULL, 0, mk_str(", ", 2), mk_str(": ", 2)};
        js.ensure_ascii = truthy(arg(a, 99, "ensure_ascii", mk_bool(0)));
        js.sort_keys = truthy(arg(a, 99, "sort_keys", mk_bool(0)));
        jv ind = arg(a, 0, "indent", none);
        if (ind.t == V_INT || ind.t == V_BOOL) {
            int64_t k = ind.u.i < 0 ? 0 : ind.u.i > 64 ? 64 : ind.u.i;
            char *sp = rtake(r, (size_t)k + 1);
            memset(sp, ' ', (size_t)k);
            js.indent = sp, js.indent_n = (size_t)k;
        } else if (ind.t == V_STR) {
            js.indent = ind.u.s, js.indent_n = ind.n;
        } else if (ind.t != V_NONE) {
            rfail(r, CB_JINJA_ERROR, line, "tojson: indent must be an integer or a string");
        }
        if (js.indent) js.item_sep = mk_str(",", 1);
        jv seps = arg(a, 99, "separators", none);
        if (seps.t == V_LIST && seps.u.l->n == 2)
            js.item_sep = want_str(r, seps.u.l->v[0], "separators", line),
            js.key_sep = want_str(r, seps.u.l->v[1], "separators", line);
        obuf o = new_obuf(r, 64);
        int depth = r->depth;
        put_json(r, &o, v, &js, 0, line);
        r->depth = depth;
        return obuf_str(&o);
    }
    if (IS("join")) {
        jv sep = arg(a, 0, "d", mk_str("", 0));
        jv attr = arg(a, 1, "attribute", none);
        jlist *items = iter_items(r, v, line);
        obuf o = new_obuf(r, 64);
        for (size_t i = 0; i < items->n; i++) {
            if (i) put_str(r, &o, sep);
            put_str(r, &o, attr.t == V_NONE ? items->v[i] : attr_path(r, items->v[i], attr, line));
        }
        return obuf_str(&o);
    }
    if (IS("items") || IS("dictsort")) {
        if (v.t == V_UNDEF) return mk_list(r, 0);
        if (v.t != V_DICT) rfail(r, CB_JINJA_ERROR, line, "%.*s: expected a mapping, got %s", (int)n, name, type_name(v));
        args none_args = {0};
        jv out;
        call_method(r, v, "items", 5, &none_args, line, &out);
        if (IS("dictsort")) {
            int case_sensitive = truthy(arg(a, 0, "case_sensitive", mk_bool(0)));
            jv by = arg(a, 1, "by", mk_str("key", 3));
            int reverse = truthy(arg(a, 2, "reverse", mk_bool(0)));
            sort_list(r, out.u.l, str_eq(by, "value", 5), none, case_sensitive, reverse, line);
        }
        return out;
    }
    if (IS("list")) {
        jlist *items = iter_items(r, v, line);
        jv out = mk_list(r, items->n);
        for (size_t i = 0; i < items->n; i++) list_push(r, out.u.l, items->v[i]);
        return out;
    }
    if (IS("first") || IS("last")) {
        jlist *items = iter_items(r, v, line);
        if (!items->n) return mk_undef(NULL);
        return items->v[IS("first") ? 0 : items->n - 1];
    }
    if (IS("reverse")) {
        if (v.t == V_STR) return slice(r, v, none, none, mk_int(-1), line);
        jlist *items = iter_items(r, v, line);
        jv out = mk_list(r, items->n);
        for (size_t i = items->n; i-- > 0;) list_push(r, out.u.l, items->v[i]);
        return out;
    }
    if (IS("sort") || IS("unique") || IS("min") || IS("max") || IS("sum")) {
        jlist *items = iter_items(r, v, line);
        jv attr = arg(a, IS("sort") ? 2 : IS("sum") ? 0 : 1, "attribute", none);
        int reverse = IS("sort") && truthy(arg(a, 0, "reverse", mk_bool(0)));
        int case_sensitive = truthy(arg(a, IS("sort") ? 1 : 0, "case_sensitive", mk_bool(0)));
        if (IS("sum")) {
            jv total = arg(a, 1, "start", mk_int(0));
            for (size_t i = 0; i < items->n; i++)
                total = binop(r, OP_ADD, total, attr.t == V_NONE ? items->v[i] : attr_path(r, items->v[i], attr, line), line);
            return total;
        }
        jv out = mk_list(r, items->n);
        for (size_t i = 0; i < items->n; i++) {
            jv x = items->v[i];
            if (IS("unique")) {
                int seen = 0;
                for (size_t k = 0; k < out.u.l->n && !seen; k++) seen = eq(out.u.l->v[k], x);
                if (seen) continue;
            }
            list_push(r, out.u.l, x);
        }
        if (IS("unique")) return out;
        jlist *l = out.u.l;
        sort_list(r, l, -1, attr, case_sensitive, reverse, line);
        if (IS("sort")) return out;
        if (!l->n) return mk_undef(NULL);
        return IS("min") ? l->v[0] : l->v[l->n - 1];
    }
    if (IS("map")) {
        jlist *items = iter_items(r, v, line);
        jv out = mk_list(r, items->n);
        jv attr = arg(a, 99, "attribute", none);
        for (size_t i = 0; i < items->n; i++) {
            jv x = items->v[i];
            if (attr.t != V_NONE) {
                x = attr_path(r, x, attr, line);
                if (x.t == V_UNDEF) x = arg(a, 99, "default", x);
            } else {
                jv fname = want_str(r, arg(a, 0, NULL, none), "map's filter name", line);
                args rest = *a;
                rest.n_pos = a->n_pos > 0 ? a->n_pos - 1 : 0;
                for (int k = 0; k < rest.n_pos; k++) rest.pos[k] = a->pos[k + 1];
                x = run_filter(r, fname.u.s, fname.n, x, &rest, line, f);
            }
            list_push(r, out.u.l, x);
        }
        return out;
    }
    if (IS("select") || IS("reject") || IS("selectattr") || IS("rejectattr")) {
        int by_attr = IS("selectattr") || IS("rejectattr"), keep = IS("select") || IS("selectattr");
        jlist *items = iter_items(r, v, line);
        jv out = mk_list(r, items->n);
        int first = by_attr ? 1 : 0;
        args rest = {0};
        for (int k = first + 1; k < a->n_pos; k++) rest.pos[rest.n_pos++] = a->pos[k];
        jv tname = arg(a, first, NULL, none);
        for (size_t i = 0; i < items->n; i++) {
            jv x = by_attr ? attr_path(r, items->v[i], arg(a, 0, NULL, none), line) : items->v[i];
            int ok = tname.t == V_NONE ? truthy(x)
                                       : run_test(r, want_str(r, tname, "the test name", line).u.s, tname.n, x, &rest, line);
            if (ok == keep) list_push(r, out.u.l, items->v[i]);
        }
        return out;
    }
    if (IS("int")) {
        double d;
        if (v.t == V_INT || v.t == V_BOOL) return mk_int(v.u.i);
        if (v.t == V_FLOAT) return mk_int((int64_t)v.u.f);
        return str_number(v, &d) ? mk_int((int64_t)d) : arg(a, 0, "default", mk_int(0));
    }
    if (IS("float")) {
        double d;
        if (is_num(v)) return mk_float(num(v));
        return str_number(v, &d) ? mk_float(d) : arg(a, 0, "default", mk_float(0));
    }
    if (IS("abs")) {
        if (!is_num(v)) rfail(r, CB_JINJA_ERROR, line, "bad operand type for abs(): '%s'", type_name(v));
        return v.t == V_FLOAT ? mk_float(fabs(v.u.f)) : mk_int(v.u.i < 0 ? -v.u.i : v.u.i);
    }
    if (IS("round")) {
        int64_t prec = want_int(r, arg(a, 0, "precision", mk_int(0)), "precision", line);
        double p = pow(10, (double)prec), x = num(v) * p;
        return mk_float((x < 0 ? ceil(x - 0.5) : floor(x + 0.5)) / p);
    }
    if (IS("indent")) {
        jv s = to_str(r, v);
        jv w = arg(a, 0, "width", mk_int(4));
        int first_line = truthy(arg(a, 1, "first", mk_bool(0))), blank = truthy(arg(a, 2, "blank", mk_bool(0)));
        obuf pad = new_obuf(r, 8);
        if (w.t == V_STR) oput(r, &pad, w.u.s, w.n);
        else for (int64_t i = 0; i < want_int(r, w, "width", line); i++) oputs(r, &pad, " ");
        obuf o = new_obuf(r, s.n + 64);
        size_t i = 0;
        int line_no = 0;
        while (i <= s.n) {
            size_t j = i;
            while (j < s.n && s.u.s[j] != '\n') j++;
            int empty = j == i;
            if ((line_no > 0 || first_line) && (blank || !empty) && !(j == s.n && empty && line_no > 0 && 0))
                oput(r, &o, pad.p, pad.n);
            oput(r, &o, s.u.s + i, j - i);
            if (j < s.n) oputs(r, &o, "\n");
            i = j + 1, line_no++;
        }
        return obuf_str(&o);
    }
    if (IS("format")) {
        jv tup = mk_list(r, (size_t)a->n_pos);
        tup.tuple = 1;
        for (int i = 0; i < a->n_pos; i++) list_push(r, tup.u.l, a->pos[i]);
        return percent_format(r, want_str(r, v, "format's template", line), tup, line);
    }
    if (IS("wordcount")) return mk_int((int64_t)split(r, to_str(r, v), none, -1, line).u.l->n);
    rfail(r, CB_JINJA_ERROR, line, "no filter named '%.*s'", (int)n, name);
    return none;
}

/* ---- statements ---- */

static void unpack(cb_jrender *r, frame *f, const node *targets, jv v, int line) {
    if (!targets->next && targets->kind == E_NAME) {
        assign(r, f, targets->s, targets->n, v);
        return;
    }
    size_t want = 0;
    for (const node *t = targets; t; t = t->next) want++;
    jlist *items = iter_items(r, v, line);
    if (items->n != want)
        rfail(r, CB_JINJA_ERROR, line, "cannot unpack %zu values into %zu names", items->n, want);
    size_t i = 0;
    for (const node *t = targets; t; t = t->next, i++) assign(r, f, t->s, t->n, items->v[i]);
}

static void exec(cb_jrender *r, const node *x, frame *f, obuf *o) {
    for (; x && !r->loop_ctl; x = x->next) {
        if (++r->steps > MAX_STEPS) rfail(r, CB_JINJA_ERROR, x->line, "the template runs too long");
        switch (x->kind) {
        case S_TEXT: oput(r, o, x->s, x->n); break;
        case S_OUT: {
            jv v = eval(r, x->a, f);
            put_str(r, o, v);
            break;
        }
        case S_IF: {
            /* a->cond, b->body, c->an elif (S_IF marked neg) or the else body */
            for (const node *c = x;;) {
                if (truthy(eval(r, c->a, f))) {
                    exec(r, c->b, f, o);
                    break;
                }
                const node *e = c->c;
                if (e && e->kind == S_IF && e->neg) {
                    c = e;
                    continue;
                }
                exec(r, e, f, o);
                break;
            }
            break;
        }
        case S_FOR: {
            jv seq = eval(r, x->b, f);
            if (seq.t == V_NONE) rfail(r, CB_JINJA_ERROR, x->line, "'NoneType' object is not iterable");
            jlist *items = iter_items(r, seq, x->line);
            if (x->d) { /* loop filter: the loop (and loop.length) sees only the items it keeps */
                jv kept = mk_list(r, items->n);
                for (size_t i = 0; i < items->n; i++) {
                    frame tmp = {f, NULL};
                    unpack(r, &tmp, x->a, items->v[i], x->line);
                    if (truthy(eval(r, x->d, &tmp))) list_push(r, kept.u.l, items->v[i]);
                }
                items = kept.u.l;
            }
            jloop *lp = rtake(r, sizeof *lp);
            lp->items = items;
            jv loopv = {V_LOOP, 0, 0, {0}};
            loopv.u.lp = lp;
            for (size_t i = 0; i < items->n; i++) {
                frame *it = rtake(r, sizeof *it);
                it->up = f, it->vars = NULL;
                lp->index = i;
                assign(r, it, "loop", 4, loopv);
                unpack(r, it, x->a, items->v[i], x->line);
                exec(r, x->c, it, o);
                if (r->loop_ctl == 1) {
                    r->loop_ctl = 0;
                    break;
                }
                r->loop_ctl = 0;
            }
            if (!items->n && x->val.t == V_LIST) exec(r, x->val.u.m->a, f, o);
            break;
        }
        case S_SET: {
            jv v = eval(r, x->b, f);
            const node *t = x->a;
            if (t->kind == E_NAME) {
                assign(r, f, t->s, t->n, v);
            } else if (t->kind == E_TUPLE) {
                unpack(r, f, t->a, v, x->line);
            } else {
                jv ns = lookup(r, f, t->a->s, t->a->n);
                if (ns.t != V_NS)
                    rfail(r, CB_JINJA_ERROR, x->line, "cannot assign attribute on non-namespace object");
                dict_set(r, ns.u.d, mk_str(t->s, t->n), v);
            }
            break;
        }
        case S_SETBLOCK: {
            obuf cap = new_obuf(r, 128);
            exec(r, x->b, f, &cap);
            assign(r, f, x->a->s, x->a->n, obuf_str(&cap));
            break;
        }
        case S_MACRO: {
            jv m = {V_MACRO, 0, 0, {0}};
            m.u.m = x;
            assign(r, f, x->s, x->n, m);
            break;
        }
        case S_CALLBLOCK: {
            const node *call = x->a;
            jv fn = eval(r, call->a, f);
            if (fn.t != V_MACRO) rfail(r, CB_JINJA_ERROR, x->line, "the call tag needs a macro");
            args a;
            eval_args(r, call->b, f, &a, x->line);
            jv s = call_macro(r, fn.u.m, &a, x->b, x->line);
            oput(r, o, s.u.s, s.n);
            break;
        }
        case S_BREAK: r->loop_ctl = 1; break;
        case S_CONTINUE: r->loop_ctl = 2; break;
        default: break;
        }
    }
}

/* ------------------------------------------------------------------ */
/* API                                                                */

cb_jrender *cb_jinja_begin(const cb_jinja *t, void *work, size_t work_cap) {
    if (!t || work_cap < sizeof(cb_jrender) + 4096) return NULL;
    cb_jrender *r = work;
    memset(r, 0, sizeof *r);
    r->t = t;
    r->mem = (uint8_t *)work;
    r->cap = work_cap;
    r->used = (sizeof *r + 7) & ~(size_t)7;
    return r;
}

static int set_var(cb_jrender *r, const char *name, jv v) {
    size_t n = strlen(name);
    char *copy = rtake(r, n + 1);
    memcpy(copy, name, n + 1);
    assign(r, &r->globals, copy, n, v);
    return 0;
}

#define GUARD()                                                                                                    \
    do {                                                                                                           \
        if (setjmp(r->fail)) return -1;                                                                            \
    } while (0)

int cb_jinja_set_string(cb_jrender *r, const char *name, const char *s, size_t n) {
    GUARD();
    char *copy = rtake(r, n + 1);
    memcpy(copy, s, n);
    return set_var(r, name, mk_str(copy, n));
}
int cb_jinja_set_bool(cb_jrender *r, const char *name, int value) {
    GUARD();
    return set_var(r, name, mk_bool(value));
}
int cb_jinja_set_none(cb_jrender *r, const char *name) {
    GUARD();
    return set_var(r, name, mk_none());
}
int cb_jinja_set_json(cb_jrender *r, const char *name, const char *json, const cb_json_tok *toks, int i) {
    GUARD();
    return set_var(r, name, from_json(r, json, toks, i));
}
int cb_jinja_set_json_keys(cb_jrender *r, const char *json, const cb_json_tok *toks, int obj) {
    GUARD();
    jv d = from_json(r, json, toks, obj);
    if (d.t != V_DICT) return -1;
    for (size_t i = 0; i < d.u.d->n; i++) {
        jv k = d.u.d->k[i];
        assign(r, &r->globals, k.u.s, k.n, d.u.d->v[i]);
    }
    return 0;
}

/* An assistant message's tool_calls[k].function.arguments given as a
 * string of a JSON object (how OpenAI's API sends them back) as that object,
 * which is what templates iterate or pass to tojson. */
static void arguments_as_objects(cb_jrender *r, jv m) {
    jv *calls = dict_find(m.u.d, "tool_calls", 10);
    if (!calls || calls->t != V_LIST) return;
    for (size_t k = 0; k < calls->u.l->n; k++) {
        jv call = calls->u.l->v[k];
        jv *fn = call.t == V_DICT ? dict_find(call.u.d, "function", 8) : NULL;
        jv *args = fn && fn->t == V_DICT ? dict_find(fn->u.d, "arguments", 9) : NULL;
        if (!args || args->t != V_STR) continue;
        const int n_toks = cb_json_parse(args->u.s, args->n, NULL, 0, NULL);
        if (n_toks < 1) continue;
        cb_json_tok *t = rtake(r, (size_t)n_toks * sizeof *t);
        if (cb_json_parse(args->u.s, args->n, t, n_toks, NULL) < 1 || t[0].type != CB_JSON_OBJECT) continue;
        *args = from_json(r, args->u.s, t, 0);
    }
}

int cb_jinja_set_messages(cb_jrender *r, const char *json, const cb_json_tok *toks, int arr, int developer_as_system,
                          const char *append_last) {
    GUARD();
    jv msgs = from_json(r, json, toks, arr);
    if (msgs.t != V_LIST) return -1;
    static const char *reasoning[] = {"reasoning_content", "thinking", "reasoning"};
    for (size_t i = 0; i < msgs.u.l->n; i++) {
        jv m = msgs.u.l->v[i];
        if (m.t != V_DICT) continue;
        jv *content = dict_find(m.u.d, "content", 7), *role = dict_find(m.u.d, "role", 4);
        if (content && content->t == V_NONE) *content = mk_str("", 0); /* as vLLM: null content is empty text */
        if (!content && role && str_eq(*role, "assistant", 9)) {
            /* absent content (an assistant turn of tool calls, as the openai
             * SDK sends it with exclude_none) is null, so empty text too */
            jv d = mk_dict(r, m.u.d->n + 1);
            for (size_t k = 0; k < m.u.d->n; k++) dict_set(r, d.u.d, m.u.d->k[k], m.u.d->v[k]);
            dict_set(r, d.u.d, mk_str("content", 7), mk_str("", 0));
            msgs.u.l->v[i] = m = d;
        }
        if (content && content->t == V_LIST) { /* text parts, joined */
            obuf o = new_obuf(r, 64);
            int all_text = 1;
            for (size_t p = 0; p < content->u.l->n && all_text; p++) {
                jv part = content->u.l->v[p];
                jv *type = part.t == V_DICT ? dict_find(part.u.d, "type", 4) : NULL;
                jv *text = part.t == V_DICT ? dict_find(part.u.d, "text", 4) : NULL;
                all_text = type && str_eq(*type, "text", 4) && text && text->t == V_STR;
                if (all_text) oput(r, &o, text->u.s, text->n);
            }
            if (all_text) *content = obuf_str(&o);
        }
        if (developer_as_system && role && str_eq(*role, "developer", 9)) *role = mk_str("system", 6);
        if (role && str_eq(*role, "assistant", 9)) arguments_as_objects(r, m);
        jv *found = NULL;
        for (int k = 0; k < 3 && !found; k++) {
            jv *v = dict_find(m.u.d, reasoning[k], strlen(reasoning[k]));
            if (v && v->t != V_NONE) found = v;
        }
        if (found) { /* transformers: {"thinking": r, **message, "reasoning_content": r} */
            jv rv = *found, d = mk_dict(r, m.u.d->n + 2);
            dict_set(r, d.u.d, mk_str("thinking", 8), rv);
            for (size_t k = 0; k < m.u.d->n; k++) dict_set(r, d.u.d, m.u.d->k[k], m.u.d->v[k]);
            dict_set(r, d.u.d, mk_str("reasoning_content", 17), rv);
            msgs.u.l->v[i] = d;
        }
    }
    if (append_last) {
        jv last = msgs.u.l->n ? msgs.u.l->v[msgs.u.l->n - 1] : mk_none();
        jv *content = last.t == V_DICT ? dict_find(last.u.d, "content", 7) : NULL;
        if (!content || content->t != V_STR) return -1;
        size_t extra = strlen(append_last);
        char *s = rtake(r, content->n + extra + 1);
        memcpy(s, content->u.s, content->n), memcpy(s + content->n, append_last, extra);
        *content = mk_str(s, content->n + extra);
    }
    return set_var(r, "messages", msgs);
}

long cb_jinja_render(cb_jrender *r, char *out, size_t cap, char *err, size_t err_len) {
    obuf o = {out, 0, cap, 1};
    if (setjmp(r->fail)) {
        snprintf(err, err_len, "%s", r->msg);
        return r->status;
    }
    frame *top = rtake(r, sizeof *top);
    top->up = &r->globals, top->vars = NULL;
    r->top = top;
    exec(r, r->t->body, top, &o);
    return (long)o.n;
}
