/* Tool-call formats and the incremental parser (toolcall.h). */
#include "toolcall.h"

#include <stdio.h>
#include <string.h>

/* ---- which format ---- */

static int has(const char *src, size_t n, const char *needle) {
    const size_t m = strlen(needle);
    for (size_t i = 0; i + m <= n; i++)
        if (src[i] == needle[0] && !memcmp(src + i, needle, m)) return 1;
    return 0;
}

/* The rule, first match wins: harmony when the template writes channels and
 * the "functions." namespace; Qwen3-Coder's XML when it writes <function=
 * and <parameter=; GLM's when it writes <tool_call> and <arg_key>; Hermes
 * for <tool_call> without; Mistral for [TOOL_CALLS]; Llama 3.1 for
 * <|python_tag|> or a "parameters" key beside Llama 3's header tokens;
 * DeepSeek's, Kimi K2's, MiniMax-M2's and Gemma 4's by their call tags;
 * LFM2's Python-style calls by its tool list's tag. Anything else is
 * unknown. */
cb_tool_format cb_tool_format_detect(const char *src, size_t n) {
    if (!src) return CB_TOOLFMT_NONE;
    if (has(src, n, "<|channel|>") && has(src, n, "functions.")) return CB_TOOLFMT_HARMONY;
    if (has(src, n, "<function=") && has(src, n, "<parameter=")) return CB_TOOLFMT_XML;
    if (has(src, n, "<tool_call>") && has(src, n, "<arg_key>")) return CB_TOOLFMT_GLM;
    if (has(src, n, "<tool_call>")) return CB_TOOLFMT_HERMES;
    if (has(src, n, "[TOOL_CALLS]")) return CB_TOOLFMT_MISTRAL;
    if (has(src, n, "<|python_tag|>") || (has(src, n, "\"parameters\": ") && has(src, n, "<|start_header_id|>")))
        return CB_TOOLFMT_LLAMA3;
    if (has(src, n, "<｜tool▁calls▁begin｜>")) return CB_TOOLFMT_DEEPSEEK;
    if (has(src, n, "<|tool_calls_section_begin|>")) return CB_TOOLFMT_KIMI;
    if (has(src, n, "<minimax:tool_call>")) return CB_TOOLFMT_MINIMAX;
    if (has(src, n, "<|tool_call>call:")) return CB_TOOLFMT_GEMMA4;
    if (has(src, n, "<|tool_list_start|>")) return CB_TOOLFMT_PYTHONIC;
    return CB_TOOLFMT_NONE;
}

const char *cb_tool_format_name(cb_tool_format f) {
    static const char *names[] = {"none",    "hermes", "qwen3-coder-xml", "mistral", "llama3-json",
                                  "harmony", "glm",    "deepseek",        "kimi-k2", "minimax-xml", "gemma4", "pythonic"};
    return (unsigned)f < sizeof names / sizeof *names ? names[f] : "none";
}

/* ---- markers that start a call ---- */

/* The special tokens of a format whose calls come in a section: each call
 * call_begin, the name, sep, the arguments, call_end. */
typedef struct {
    const char *begin, *end, *call_begin, *sep, *call_end;
} section_tags;

static const section_tags deepseek_tags = {"<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>",
                                           "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"};
static const section_tags kimi_tags = {"<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                                       "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"};

static const section_tags *section_of(cb_tool_format f) {
    return f == CB_TOOLFMT_DEEPSEEK ? &deepseek_tags : &kimi_tags;
}

typedef struct {
    const char *s[3];
    int n;
} markers;

static markers markers_of(cb_tool_format f) {
    markers m = {{NULL, NULL, NULL}, 0};
    switch (f) {
    case CB_TOOLFMT_HERMES:
    case CB_TOOLFMT_XML:
    case CB_TOOLFMT_GLM: m.s[0] = "<tool_call>", m.n = 1; break;
    case CB_TOOLFMT_MINIMAX: m.s[0] = "<minimax:tool_call>", m.n = 1; break;
    case CB_TOOLFMT_GEMMA4: m.s[0] = "<|tool_call>", m.n = 1; break;
    case CB_TOOLFMT_PYTHONIC: m.s[0] = "<|tool_call_start|>", m.n = 1; break;
    case CB_TOOLFMT_MISTRAL: m.s[0] = "[TOOL_CALLS]", m.n = 1; break;
    case CB_TOOLFMT_LLAMA3: m.s[0] = "<|python_tag|>", m.n = 1; break;
    case CB_TOOLFMT_DEEPSEEK:
    case CB_TOOLFMT_KIMI: /* the section, or a call without one */
        m.s[0] = section_of(f)->begin, m.s[1] = section_of(f)->call_begin, m.n = 2;
        break;
    case CB_TOOLFMT_HARMONY:
        /* the recipient after the channel, in the header, or (right after
         * the generation prompt "<|start|>assistant") first */
        m.s[0] = "<|channel|>commentary to=functions.", m.s[1] = "<|start|>assistant to=functions.",
        m.s[2] = " to=functions.", m.n = 3;
        break;
    default: break;
    }
    return m;
}

static int is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

static size_t find_from(const char *t, size_t from, size_t len, const char *needle) {
    const size_t m = strlen(needle);
    for (size_t i = from; i + m <= len; i++)
        if (t[i] == needle[0] && !memcmp(t + i, needle, m)) return i;
    return (size_t)-1;
}

/* ---- JSON checks on a complete piece ---- */

static int parse_json(cb_tool_parser *p, const char *s, size_t n) {
    size_t at;
    int got = cb_json_parse(s, n, p->toks, p->max_toks, &at);
    return got > 0 ? got : -1;
}

static void trim(const char **s, size_t *n) {
    while (*n && is_ws(**s)) (*s)++, (*n)--;
    while (*n && is_ws((*s)[*n - 1])) (*n)--;
}

static void skip_ws(const char *s, size_t n, size_t *i) {
    while (*i < n && is_ws(s[*i])) (*i)++;
}

/* How deep a value the parser turns into JSON nests (Gemma 4's, Python's). */
enum { MAX_VALUE_DEPTH = 32 };

/* A name as these formats write it: no spaces or tags. */
static int plain_name(const char *s, size_t n) {
    if (n == 0 || n > CB_TOOL_NAME_BYTES) return 0;
    for (size_t i = 0; i < n; i++)
        if (is_ws(s[i]) || s[i] == '<' || s[i] == '>' || s[i] == '{') return 0;
    return 1;
}

/* Emits one call: name (unescaped from the JSON string token name_tok of
 * json, or raw when json is NULL) and args. */
static int emit_call(cb_tool_parser *p, const cb_tool_sink *sink, const char *json, const cb_json_tok *name_tok,
                     const char *name, size_t name_n, const char *args, size_t args_n) {
    char buf[CB_TOOL_NAME_BYTES + 1];
    if (json) {
        int got = cb_json_unescape(json, name_tok, buf, sizeof buf);
        if (got <= 0) return 1; /* malformed: no name, or too long */
        name = buf, name_n = (size_t)got;
    }
    if (name_n == 0 || name_n > CB_TOOL_NAME_BYTES) return 1;
    if (p->n_calls >= p->max_calls) {
        p->done = 1;
        return 0;
    }
    if (sink->call(sink->ctx, p->n_calls, name, name_n, args, args_n) != 0) return -1;
    if (++p->n_calls >= p->max_calls) p->done = 1;
    return 0;
}

/* A call object {"name": "...", args_key: {...}} at toks[obj] of json:
 * 0 emitted, 1 malformed, -1 sink stop. Missing arguments are "{}". */
static int object_call(cb_tool_parser *p, const cb_tool_sink *sink, const char *json, int obj, const char *args_key) {
    const cb_json_tok *t = p->toks;
    if (t[obj].type != CB_JSON_OBJECT) return 1;
    int name = cb_json_find(json, t, obj, "name");
    int args = cb_json_find(json, t, obj, args_key);
    if (args < 0) args = cb_json_find(json, t, obj, "arguments");
    if (name < 0 || t[name].type != CB_JSON_STRING) return 1;
    if (args >= 0 && t[args].type != CB_JSON_OBJECT) return 1;
    const char *a = args >= 0 ? json + t[args].start : "{}";
    size_t an = args >= 0 ? (size_t)(t[args].end - t[args].start) : 2;
    return emit_call(p, sink, json, &t[name], NULL, 0, a, an);
}

/* Hermes body: one JSON object. */
static int hermes_call(cb_tool_parser *p, const cb_tool_sink *sink, const char *s, size_t n) {
    trim(&s, &n);
    if (parse_json(p, s, n) < 0) return 1;
    return object_call(p, sink, s, 0, "arguments");
}

/* A parameter's value as JSON: the text itself when it is a JSON number,
 * boolean, null, object or array, else the text as a string (the template
 * writes strings bare; without the tool's schema "7" is taken as 7). */
static void xml_value(cb_tool_parser *p, cb_jw *w, const char *v, size_t n) {
    if (parse_json(p, v, n) > 0 && p->toks[0].type != CB_JSON_STRING) cb_jw_raw(w, v, n);
    else cb_jw_str_n(w, v, n);
}

/* Qwen3-Coder body: <function=NAME> (<parameter=KEY>\nVALUE\n</parameter>)*
 * </function>, arguments built as a JSON object in scratch. */
static int xml_call(cb_tool_parser *p, const cb_tool_sink *sink, const char *s, size_t n) {
    trim(&s, &n);
    static const char fopen_[] = "<function=", fclose_[] = "</function>", popen_[] = "<parameter=",
                      pclose_[] = "</parameter>";
    if (n < sizeof fopen_ - 1 || memcmp(s, fopen_, sizeof fopen_ - 1)) return 1;
    size_t i = sizeof fopen_ - 1, name_at = i;
    while (i < n && s[i] != '>' && s[i] != '\n' && s[i] != '<') i++;
    if (i >= n || s[i] != '>') return 1;
    const size_t name_n = i - name_at;
    i++;
    /* the name first, then the arguments, in scratch */
    if (name_n == 0 || name_n > CB_TOOL_NAME_BYTES || p->scratch_cap < name_n + 16) return 1;
    char name[CB_TOOL_NAME_BYTES];
    memcpy(name, s + name_at, name_n);
    cb_jw w;
    cb_jw_init(&w, p->scratch, p->scratch_cap);
    cb_jw_begin_object(&w);
    for (;;) {
        while (i < n && is_ws(s[i])) i++;
        if (n - i >= sizeof fclose_ - 1 && !memcmp(s + i, fclose_, sizeof fclose_ - 1)) {
            i += sizeof fclose_ - 1;
            break;
        }
        if (n - i < sizeof popen_ - 1 || memcmp(s + i, popen_, sizeof popen_ - 1)) return 1;
        i += sizeof popen_ - 1;
        size_t key = i;
        while (i < n && s[i] != '>' && s[i] != '\n' && s[i] != '<') i++;
        if (i >= n || s[i] != '>' || i == key || i - key > 255) return 1;
        char keybuf[256];
        memcpy(keybuf, s + key, i - key);
        keybuf[i - key] = 0;
        i++;
        size_t end = find_from(s, i, n, pclose_);
        if (end == (size_t)-1) return 1;
        size_t v = i, vn = end - i;
        if (vn && s[v] == '\n') v++, vn--; /* the template's own newlines around a value */
        if (vn && s[v + vn - 1] == '\n') vn--;
        cb_jw_key(&w, keybuf);
        xml_value(p, &w, s + v, vn);
        i = end + sizeof pclose_ - 1;
    }
    while (i < n && is_ws(s[i])) i++;
    cb_jw_end_object(&w);
    if (i != n || w.overflow) return 1;
    return emit_call(p, sink, NULL, NULL, name, name_n, p->scratch, w.len);
}

/* s[*i..n) starts with tag (then *i moves past it). */
static int take(const char *s, size_t n, size_t *i, const char *tag) {
    const size_t m = strlen(tag);
    if (n - *i < m || memcmp(s + *i, tag, m)) return 0;
    *i += m;
    return 1;
}

/* GLM body: NAME (<arg_key>KEY</arg_key> <arg_value>VALUE</arg_value>)*,
 * the values bare as the template writes them (strings as they are, the
 * rest as JSON), arguments built as a JSON object in scratch. */
static int glm_call(cb_tool_parser *p, const cb_tool_sink *sink, const char *s, size_t n) {
    trim(&s, &n);
    size_t i = 0;
    while (i < n && s[i] != '\n' && s[i] != '<') i++;
    size_t name_n = i;
    while (name_n && (s[name_n - 1] == ' ' || s[name_n - 1] == '\t' || s[name_n - 1] == '\r')) name_n--;
    if (name_n == 0 || name_n > CB_TOOL_NAME_BYTES || p->scratch_cap < name_n + 16) return 1;
    char name[CB_TOOL_NAME_BYTES];
    memcpy(name, s, name_n);
    cb_jw w;
    cb_jw_init(&w, p->scratch, p->scratch_cap);
    cb_jw_begin_object(&w);
    for (;;) {
        while (i < n && is_ws(s[i])) i++;
        if (i == n) break;
        if (!take(s, n, &i, "<arg_key>")) return 1;
        const size_t key = i, key_end = find_from(s, i, n, "</arg_key>");
        if (key_end == (size_t)-1 || key_end == key || key_end - key > 255) return 1;
        char keybuf[256];
        memcpy(keybuf, s + key, key_end - key);
        keybuf[key_end - key] = 0;
        i = key_end + sizeof "</arg_key>" - 1;
        while (i < n && is_ws(s[i])) i++;
        if (!take(s, n, &i, "<arg_value>")) return 1;
        const size_t end = find_from(s, i, n, "</arg_value>");
        if (end == (size_t)-1) return 1;
        cb_jw_key(&w, keybuf);
        xml_value(p, &w, s + i, end - i);
        i = end + sizeof "</arg_value>" - 1;
    }
    cb_jw_end_object(&w);
    if (w.overflow) return 1;
    return emit_call(p, sink, NULL, NULL, name, name_n, p->scratch, w.len);
}

/* s[*i..n) as NAME"> (a name or key in double quotes, the tag closed
 * after it): its bytes in out (NUL-ended), *i past the '>'. */
static int quoted_name(const char *s, size_t n, size_t *i, char *out, size_t cap) {
    size_t k = *i;
    while (k < n && s[k] != '"' && s[k] != '<' && s[k] != '>' && s[k] != '\n') k++;
    if (k + 1 >= n || s[k] != '"' || s[k + 1] != '>' || k == *i || k - *i >= cap) return 0;
    memcpy(out, s + *i, k - *i);
    out[k - *i] = 0;
    *i = k + 2;
    return 1;
}

/* MiniMax-M2 body: (<invoke name="NAME"> (<parameter name="K">VALUE
 * </parameter>)* </invoke>)+, the values as GLM's; every call checked (its
 * arguments built) first, then handed out, so a bad one makes the block
 * content. */
static int minimax_calls(cb_tool_parser *p, const cb_tool_sink *sink, const char *s, size_t n) {
    for (int emit = 0; emit < 2; emit++) {
        size_t i = 0;
        int calls = 0;
        for (;;) {
            skip_ws(s, n, &i);
            if (i == n) break;
            char name[CB_TOOL_NAME_BYTES + 1];
            if (!take(s, n, &i, "<invoke name=\"") || !quoted_name(s, n, &i, name, sizeof name)) return 1;
            cb_jw w;
            cb_jw_init(&w, p->scratch, p->scratch_cap);
            cb_jw_begin_object(&w);
            for (;;) {
                skip_ws(s, n, &i);
                if (take(s, n, &i, "</invoke>")) break;
                char key[256];
                if (!take(s, n, &i, "<parameter name=\"") || !quoted_name(s, n, &i, key, sizeof key)) return 1;
                const size_t end = find_from(s, i, n, "</parameter>");
                if (end == (size_t)-1) return 1;
                cb_jw_key(&w, key);
                xml_value(p, &w, s + i, end - i);
                i = end + sizeof "</parameter>" - 1;
            }
            cb_jw_end_object(&w);
            if (w.overflow) return 1;
            if (emit && !p->done) {
                const int r = emit_call(p, sink, NULL, NULL, name, strlen(name), p->scratch, w.len);
                if (r) return r;
            }
            calls++;
        }
        if (!calls) return 1;
    }
    return 0;
}

/* Gemma 4's values, as its template's format_argument writes them, to
 * JSON: strings between <|"|> marks (raw text), {key:value,...} with bare
 * (or marked) keys, [a,b], and bare scalars up to the next , } or ]
 * (true, false, null, None, numbers; other bare text as a string). 0 when
 * s[*i..n) holds no such value. */
#define GEMMA_QUOTE "<|\"|>"

static int gemma_value(cb_tool_parser *p, cb_jw *w, const char *s, size_t n, size_t *i, int depth);

static int gemma_string(const char *s, size_t n, size_t *i, const char **v, size_t *vn) {
    size_t at = *i;
    if (!take(s, n, &at, GEMMA_QUOTE)) return 0;
    const size_t end = find_from(s, at, n, GEMMA_QUOTE);
    if (end == (size_t)-1) return 0;
    *v = s + at, *vn = end - at;
    *i = end + sizeof GEMMA_QUOTE - 1;
    return 1;
}

static int gemma_object(cb_tool_parser *p, cb_jw *w, const char *s, size_t n, size_t *i, int depth) {
    if (depth > MAX_VALUE_DEPTH || !take(s, n, i, "{")) return 0;
    cb_jw_begin_object(w);
    for (int first = 1;; first = 0) {
        skip_ws(s, n, i);
        if (take(s, n, i, "}")) break;
        if (!first && !take(s, n, i, ",")) return 0;
        skip_ws(s, n, i);
        char key[256];
        const char *k;
        size_t kn;
        if (!gemma_string(s, n, i, &k, &kn)) {
            k = s + *i;
            while (*i < n && s[*i] != ':' && s[*i] != ',' && s[*i] != '{' && s[*i] != '}' && s[*i] != '<') (*i)++;
            kn = (size_t)(s + *i - k);
            while (kn && is_ws(k[kn - 1])) kn--;
        }
        if (kn == 0 || kn >= sizeof key || !take(s, n, i, ":")) return 0;
        memcpy(key, k, kn);
        key[kn] = 0;
        cb_jw_key(w, key);
        if (!gemma_value(p, w, s, n, i, depth + 1)) return 0;
    }
    cb_jw_end_object(w);
    return 1;
}

static int gemma_value(cb_tool_parser *p, cb_jw *w, const char *s, size_t n, size_t *i, int depth) {
    skip_ws(s, n, i);
    if (*i >= n || depth > MAX_VALUE_DEPTH) return 0;
    const char *v;
    size_t vn;
    if (gemma_string(s, n, i, &v, &vn)) {
        cb_jw_str_n(w, v, vn);
        return 1;
    }
    if (s[*i] == '{') return gemma_object(p, w, s, n, i, depth);
    if (s[*i] == '[') {
        (*i)++;
        cb_jw_begin_array(w);
        for (int first = 1;; first = 0) {
            skip_ws(s, n, i);
            if (take(s, n, i, "]")) break;
            if (!first && !take(s, n, i, ",")) return 0;
            if (!gemma_value(p, w, s, n, i, depth + 1)) return 0;
        }
        cb_jw_end_array(w);
        return 1;
    }
    v = s + *i;
    while (*i < n && s[*i] != ',' && s[*i] != '}' && s[*i] != ']' && s[*i] != '<') (*i)++;
    vn = (size_t)(s + *i - v);
    trim(&v, &vn);
    if (vn == 0) return 0;
    if (vn == 4 && !memcmp(v, "None", 4)) cb_jw_null(w);
    else xml_value(p, w, v, vn);
    return 1;
}

/* Gemma 4 body: call:NAME{...}. */
static int gemma_call(cb_tool_parser *p, const cb_tool_sink *sink, const char *s, size_t n) {
    trim(&s, &n);
    size_t i = 0;
    if (!take(s, n, &i, "call:")) return 1;
    const size_t name_at = i;
    while (i < n && s[i] != '{') i++;
    const size_t name_n = i - name_at;
    if (!plain_name(s + name_at, name_n)) return 1;
    cb_jw w;
    cb_jw_init(&w, p->scratch, p->scratch_cap);
    if (!gemma_object(p, &w, s, n, &i, 0) || i != n || w.overflow) return 1;
    return emit_call(p, sink, NULL, NULL, s + name_at, name_n, p->scratch, w.len);
}

/* ---- Python-style calls: [NAME(key=value, ...), ...] ---- */

/* A Python string literal at s[*i] ('...' or "...", backslash escapes)
 * decoded into tmp[0..cap): its length, or -1. */
static long py_string(const char *s, size_t n, size_t *i, char *tmp, size_t cap) {
    const char q = s[*i];
    size_t k = *i + 1, len = 0;
    while (k < n && s[k] != q) {
        if (len + 4 > cap || s[k] == '\n') return -1;
        if (s[k] != '\\') {
            tmp[len++] = s[k++];
            continue;
        }
        if (++k >= n) return -1;
        const char c = s[k++];
        unsigned cp = 0;
        int hex = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
        if (!hex) {
            const char *from = "ntr0abfv", *to = "\n\t\r\0\a\b\f\v";
            const char *e = c ? strchr(from, c) : NULL;
            if (e) tmp[len++] = to[e - from];
            else if (c == '\\' || c == '\'' || c == '"') tmp[len++] = c;
            else tmp[len++] = '\\', tmp[len++] = c; /* Python keeps an unknown escape */
            continue;
        }
        for (; hex; hex--, k++) {
            if (k >= n) return -1;
            const char h = s[k];
            const int d = h >= '0' && h <= '9' ? h - '0' : (h | 0x20) >= 'a' && (h | 0x20) <= 'f' ? (h | 0x20) - 'a' + 10 : -1;
            if (d < 0) return -1;
            cp = cp * 16 + (unsigned)d;
        }
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) return -1;
        if (cp < 0x80) tmp[len++] = (char)cp;
        else if (cp < 0x800) tmp[len++] = (char)(0xC0 | cp >> 6), tmp[len++] = (char)(0x80 | (cp & 0x3F));
        else if (cp < 0x10000)
            tmp[len++] = (char)(0xE0 | cp >> 12), tmp[len++] = (char)(0x80 | (cp >> 6 & 0x3F)),
            tmp[len++] = (char)(0x80 | (cp & 0x3F));
        else
            tmp[len++] = (char)(0xF0 | cp >> 18), tmp[len++] = (char)(0x80 | (cp >> 12 & 0x3F)),
            tmp[len++] = (char)(0x80 | (cp >> 6 & 0x3F)), tmp[len++] = (char)(0x80 | (cp & 0x3F));
    }
    if (k >= n) return -1;
    *i = k + 1;
    return (long)len;
}

/* A Python literal (string, number, True/False/None, list, tuple, dict)
 * at s[*i] as JSON. */
static int py_value(cb_tool_parser *p, cb_jw *w, const char *s, size_t n, size_t *i, char *tmp, size_t cap,
                    int depth) {
    skip_ws(s, n, i);
    if (*i >= n || depth > MAX_VALUE_DEPTH) return 0;
    const char c = s[*i];
    if (c == '\'' || c == '"') {
        const long len = py_string(s, n, i, tmp, cap);
        if (len < 0) return 0;
        cb_jw_str_n(w, tmp, (size_t)len);
        return 1;
    }
    if (c == '[' || c == '(' || c == '{') {
        const char close = c == '[' ? ']' : c == '(' ? ')' : '}';
        (*i)++;
        if (c == '{') cb_jw_begin_object(w);
        else cb_jw_begin_array(w);
        for (int first = 1;; first = 0) {
            skip_ws(s, n, i);
            if (*i < n && s[*i] == close) break;
            if (!first) {
                if (*i >= n || s[*i] != ',') return 0;
                (*i)++;
                skip_ws(s, n, i);
                if (*i < n && s[*i] == close) break; /* a trailing comma */
            }
            if (c == '{') { /* a string key */
                if (*i >= n || (s[*i] != '\'' && s[*i] != '"')) return 0;
                const long kn = py_string(s, n, i, tmp, cap);
                char key[256];
                if (kn < 0 || kn >= (long)sizeof key || memchr(tmp, 0, (size_t)kn)) return 0;
                memcpy(key, tmp, (size_t)kn);
                key[kn] = 0;
                skip_ws(s, n, i);
                if (*i >= n || s[*i] != ':') return 0;
                (*i)++;
                cb_jw_key(w, key);
            }
            if (!py_value(p, w, s, n, i, tmp, cap, depth + 1)) return 0;
        }
        (*i)++;
        if (c == '{') cb_jw_end_object(w);
        else cb_jw_end_array(w);
        return 1;
    }
    const char *v = s + *i;
    while (*i < n && s[*i] != ',' && s[*i] != ')' && s[*i] != ']' && s[*i] != '}' && !is_ws(s[*i])) (*i)++;
    const size_t vn = (size_t)(s + *i - v);
    if (vn == 4 && !memcmp(v, "True", 4)) cb_jw_bool(w, 1);
    else if (vn == 5 && !memcmp(v, "False", 5)) cb_jw_bool(w, 0);
    else if (vn == 4 && !memcmp(v, "None", 4)) cb_jw_null(w);
    else if (vn && parse_json(p, v, vn) > 0 && p->toks[0].type == CB_JSON_NUMBER) cb_jw_raw(w, v, vn);
    else return 0;
    return 1;
}

/* [NAME(key=value, ...), ...]: every call checked (its arguments built)
 * first, then handed out. Strings are decoded through scratch's upper
 * half, the arguments written in its lower half. */
static int pythonic_calls(cb_tool_parser *p, const cb_tool_sink *sink, const char *s, size_t n) {
    trim(&s, &n);
    const size_t half = p->scratch_cap / 2;
    char *tmp = p->scratch + half;
    if (n < 2 || s[0] != '[' || s[n - 1] != ']') return 1;
    for (int emit = 0; emit < 2; emit++) {
        size_t i = 1;
        int calls = 0;
        for (;;) {
            skip_ws(s, n - 1, &i);
            if (i == n - 1) break;
            if (calls) {
                if (s[i] != ',') return 1;
                i++;
                skip_ws(s, n - 1, &i);
            }
            const size_t name_at = i;
            while (i < n - 1 && s[i] != '(' && !is_ws(s[i])) i++;
            const size_t name_n = i - name_at;
            if (!plain_name(s + name_at, name_n) || i >= n - 1 || s[i] != '(') return 1;
            i++;
            cb_jw w;
            cb_jw_init(&w, p->scratch, half);
            cb_jw_begin_object(&w);
            for (int first = 1;; first = 0) {
                skip_ws(s, n - 1, &i);
                if (i < n - 1 && s[i] == ')') break;
                if (!first) {
                    if (i >= n - 1 || s[i] != ',') return 1;
                    i++;
                    skip_ws(s, n - 1, &i);
                    if (i < n - 1 && s[i] == ')') break;
                }
                const size_t key = i;
                while (i < n - 1 && (s[i] == '_' || (s[i] >= '0' && s[i] <= '9') || ((s[i] | 0x20) >= 'a' && (s[i] | 0x20) <= 'z'))) i++;
                if (i == key || i - key > 255) return 1;
                char keybuf[256];
                memcpy(keybuf, s + key, i - key);
                keybuf[i - key] = 0;
                skip_ws(s, n - 1, &i);
                if (i >= n - 1 || s[i] != '=') return 1;
                i++;
                cb_jw_key(&w, keybuf);
                if (!py_value(p, &w, s, n - 1, &i, tmp, p->scratch_cap - half, 0)) return 1;
            }
            i++;
            cb_jw_end_object(&w);
            if (w.overflow) return 1;
            if (emit && !p->done) {
                const int r = emit_call(p, sink, NULL, NULL, s + name_at, name_n, p->scratch, w.len);
                if (r) return r;
            }
            calls++;
        }
        if (!calls) return 1;
    }
    return 0;
}

/* Mistral's array form: every element a call. All or nothing: a bad element
 * makes the whole array content. */
static int mistral_array(cb_tool_parser *p, const cb_tool_sink *sink, const char *s, size_t n) {
    if (parse_json(p, s, n) < 0 || p->toks[0].type != CB_JSON_ARRAY || p->toks[0].size == 0) return 1;
    for (int k = 0, e = 1; k < p->toks[0].size; k++, e = p->toks[e].next) {
        const cb_json_tok *t = p->toks;
        int name = cb_json_find(s, t, e, "name"), args = cb_json_find(s, t, e, "arguments");
        if (t[e].type != CB_JSON_OBJECT || name < 0 || t[name].type != CB_JSON_STRING ||
            (args >= 0 && t[args].type != CB_JSON_OBJECT))
            return 1;
    }
    for (int k = 0, e = 1; k < p->toks[0].size && !p->done; k++, e = p->toks[e].next) {
        int r = object_call(p, sink, s, e, "arguments");
        if (r) return r < 0 ? -1 : (k == 0 ? 1 : 0);
    }
    return 0;
}

/* One call's body (between call_begin and call_end) -> its name and
 * arguments; 0 when it is no call. DeepSeek V3.1: NAME sep {...}; V3 and
 * R1: TYPE sep NAME, a newline and the arguments in a ```json fence. Kimi:
 * functions.NAME:INDEX sep {...}. */
static int section_call_parts(cb_tool_parser *p, const char *s, size_t n, const char **name, size_t *name_n,
                              const char **args, size_t *args_n) {
    const section_tags *g = section_of(p->fmt);
    const size_t sep = find_from(s, 0, n, g->sep);
    if (sep == (size_t)-1) return 0;
    const char *left = s, *right = s + sep + strlen(g->sep);
    size_t left_n = sep, right_n = n - sep - strlen(g->sep);
    trim(&left, &left_n);
    if (p->fmt == CB_TOOLFMT_KIMI) {
        if (left_n > 10 && !memcmp(left, "functions.", 10)) left += 10, left_n -= 10;
        size_t k = left_n;
        while (k && left[k - 1] >= '0' && left[k - 1] <= '9') k--;
        if (k < left_n && k && left[k - 1] == ':') left_n = k - 1;
    } else if (right_n && right[0] != '{' && !is_ws(right[0])) { /* V3 / R1: TYPE sep NAME\n```json ... ``` */
        size_t nl = 0;
        while (nl < right_n && right[nl] != '\n') nl++;
        left = right, left_n = nl;
        right += nl, right_n -= nl;
        trim(&right, &right_n);
        if (right_n >= 3 && !memcmp(right, "```", 3)) {
            right += 3, right_n -= 3;
            if (right_n >= 4 && !memcmp(right, "json", 4)) right += 4, right_n -= 4;
            if (right_n < 3 || memcmp(right + right_n - 3, "```", 3)) return 0;
            right_n -= 3;
        }
        trim(&left, &left_n);
    }
    trim(&right, &right_n);
    if (!plain_name(left, left_n)) return 0;
    if (parse_json(p, right, right_n) < 0 || p->toks[0].type != CB_JSON_OBJECT) return 0;
    *name = left, *name_n = left_n, *args = right, *args_n = right_n;
    return 1;
}

/* A section s[0..n) (from its begin tag, or from a call's when the model
 * wrote none) up to its end tag: every call, checked first and then handed
 * out, so a bad one makes the whole section content. */
static int section_calls(cb_tool_parser *p, const cb_tool_sink *sink, const char *s, size_t n) {
    const section_tags *g = section_of(p->fmt);
    for (int emit = 0; emit < 2; emit++) {
        size_t i = 0;
        int calls = 0;
        take(s, n, &i, g->begin);
        for (;;) {
            while (i < n && is_ws(s[i])) i++;
            if (i == n) break;
            if (!take(s, n, &i, g->call_begin)) return 1;
            const size_t end = find_from(s, i, n, g->call_end);
            if (end == (size_t)-1) return 1;
            const char *name, *args;
            size_t name_n, args_n;
            if (!section_call_parts(p, s + i, end - i, &name, &name_n, &args, &args_n)) return 1;
            if (emit && !p->done) {
                const int r = emit_call(p, sink, NULL, NULL, name, name_n, args, args_n);
                if (r) return r;
            }
            calls++;
            i = end + strlen(g->call_end);
        }
        if (!calls) return 1;
    }
    return 0;
}

/* ---- the bracket scanner: where a JSON object or array ends ---- */

/* Scans t[p->search..len) for the end of the value starting at p->part:
 * the offset after it, or 0 when not there yet. */
static size_t scan_value(cb_tool_parser *p, const char *t, size_t len) {
    for (size_t i = p->search; i < len; i++) {
        const char c = t[i];
        if (p->in_str) {
            if (p->esc) p->esc = 0;
            else if (c == '\\') p->esc = 1;
            else if (c == '"') p->in_str = 0;
        } else if (c == '"') {
            p->in_str = 1;
        } else if (c == '{' || c == '[') {
            p->depth++;
        } else if (c == '}' || c == ']') {
            if (--p->depth == 0) {
                p->search = i + 1;
                return i + 1;
            }
        }
    }
    p->search = len;
    return 0;
}

static void scan_start(cb_tool_parser *p, size_t at) {
    p->part = p->search = at;
    p->depth = p->in_str = p->esc = 0;
}

/* ---- one call, from its marker ---- */

enum { CALL_DONE, CALL_MORE, CALL_BAD, CALL_STOP };

/* Looks for needle from p->search; on a miss, the next look resumes where
 * a match could still start. */
static size_t find_resume(cb_tool_parser *p, const char *t, size_t len, const char *needle) {
    size_t at = find_from(t, p->search, len, needle);
    if (at == (size_t)-1) {
        size_t m = strlen(needle);
        p->search = len >= m ? len - m + 1 : 0;
        if (p->search < p->part) p->search = p->part;
    }
    return at;
}

static int result(int r) { return r < 0 ? CALL_STOP : r ? CALL_BAD : CALL_DONE; }

/* Tries to complete the call whose marker is at p->call_start; on
 * CALL_DONE, *end is where it ends. */
static int step_call(cb_tool_parser *p, const char *t, size_t len, int final, const cb_tool_sink *sink,
                     size_t *end) {
    const size_t body = p->call_start + p->marker_len;
    switch (p->fmt) {
    case CB_TOOLFMT_PYTHONIC: {
        size_t at = find_resume(p, t, len, "<|tool_call_end|>");
        if (at == (size_t)-1) return CALL_MORE;
        *end = at + sizeof "<|tool_call_end|>" - 1;
        return result(pythonic_calls(p, sink, t + body, at - body));
    }
    case CB_TOOLFMT_GEMMA4: {
        size_t at = find_resume(p, t, len, "<tool_call|>");
        if (at == (size_t)-1) return CALL_MORE;
        *end = at + sizeof "<tool_call|>" - 1;
        return result(gemma_call(p, sink, t + body, at - body));
    }
    case CB_TOOLFMT_MINIMAX: {
        size_t at = find_resume(p, t, len, "</minimax:tool_call>");
        if (at == (size_t)-1) return CALL_MORE;
        *end = at + sizeof "</minimax:tool_call>" - 1;
        return result(minimax_calls(p, sink, t + body, at - body));
    }
    case CB_TOOLFMT_HERMES:
    case CB_TOOLFMT_XML:
    case CB_TOOLFMT_GLM: {
        size_t at = find_resume(p, t, len, "</tool_call>");
        if (at == (size_t)-1) return CALL_MORE;
        *end = at + 12;
        return result(p->fmt == CB_TOOLFMT_HERMES ? hermes_call(p, sink, t + body, at - body)
                      : p->fmt == CB_TOOLFMT_XML  ? xml_call(p, sink, t + body, at - body)
                                                  : glm_call(p, sink, t + body, at - body));
    }
    case CB_TOOLFMT_LLAMA3:
    case CB_TOOLFMT_MISTRAL: {
        if (p->stage == 0) { /* up to the first byte of the value (or of the name) */
            size_t i = p->search;
            while (i < len && is_ws(t[i])) i++;
            if (i >= len) {
                p->search = len;
                return CALL_MORE;
            }
            if (t[i] == '{' || (p->fmt == CB_TOOLFMT_MISTRAL && t[i] == '[')) {
                scan_start(p, i);
                p->stage = 2;
            } else if (p->fmt == CB_TOOLFMT_MISTRAL) {
                p->part = p->search = i; /* NAME[ARGS]{...} */
                p->stage = 1;
            } else {
                return CALL_BAD;
            }
        }
        if (p->stage == 1) {
            size_t at = find_resume(p, t, len, "[ARGS]");
            if (at == (size_t)-1) {
                /* a name is short and has no brackets: anything else is text */
                if (len - p->part > CB_TOOL_NAME_BYTES + 6 || find_from(t, p->part, len, "{") != (size_t)-1)
                    return CALL_BAD;
                return CALL_MORE;
            }
            for (size_t i = p->part; i < at; i++)
                if (!(t[i] == '_' || t[i] == '-' || t[i] == '.' || (t[i] >= '0' && t[i] <= '9') ||
                      ((t[i] | 0x20) >= 'a' && (t[i] | 0x20) <= 'z')))
                    return CALL_BAD;
            p->stage = 3;
            p->name_at = p->part, p->name_n = at - p->part;
            p->search = at + 6;
        }
        if (p->stage == 3) {
            size_t i = p->search;
            while (i < len && is_ws(t[i])) i++;
            if (i >= len) {
                p->search = len;
                return CALL_MORE;
            }
            if (t[i] != '{') return CALL_BAD;
            scan_start(p, i);
            p->stage = 4;
        }
        size_t e = scan_value(p, t, len);
        if (!e) return CALL_MORE;
        *end = e;
        const char *v = t + p->part;
        size_t vn = e - p->part;
        if (p->stage == 4) {
            if (parse_json(p, v, vn) < 0) return CALL_BAD;
            return result(emit_call(p, sink, NULL, NULL, t + p->name_at, p->name_n, v, vn));
        }
        if (v[0] == '[') return result(mistral_array(p, sink, v, vn));
        if (parse_json(p, v, vn) < 0) return CALL_BAD;
        return result(object_call(p, sink, v, 0, p->fmt == CB_TOOLFMT_LLAMA3 ? "parameters" : "arguments"));
    }
    case CB_TOOLFMT_DEEPSEEK:
    case CB_TOOLFMT_KIMI: {
        /* the whole section: its end tag, or the end of the text */
        const char *close = section_of(p->fmt)->end;
        size_t at = find_resume(p, t, len, close);
        size_t stop = at;
        if (at == (size_t)-1) {
            if (!final) return CALL_MORE;
            stop = *end = len;
        } else {
            *end = at + strlen(close);
        }
        return result(section_calls(p, sink, t + p->call_start, stop - p->call_start));
    }
    case CB_TOOLFMT_HARMONY: {
        if (p->stage == 0) { /* the name, then the header up to <|message|> */
            size_t at = find_resume(p, t, len, "<|message|>");
            if (at == (size_t)-1) return len - body > 128 + 11 ? CALL_BAD : CALL_MORE;
            if (at - body > 128) return CALL_BAD;
            size_t i = body;
            while (i < at && !is_ws(t[i]) && t[i] != '<') i++;
            if (i == body) return CALL_BAD;
            p->name_at = body, p->name_n = i - body;
            p->stage = 1;
            p->part = p->search = at + 11;
        }
        size_t at = find_resume(p, t, len, "<|call|>");
        size_t stop = at;
        if (at == (size_t)-1) {
            if (!final) return CALL_MORE;
            stop = len; /* <|call|> is an end token: the text ends instead */
            *end = len;
        } else {
            *end = at + 8;
        }
        const char *v = t + p->part;
        size_t vn = stop - p->part;
        trim(&v, &vn);
        if (parse_json(p, v, vn) < 0 || p->toks[0].type != CB_JSON_OBJECT) return CALL_BAD;
        return result(emit_call(p, sink, NULL, NULL, t + p->name_at, p->name_n, v, vn));
    }
    default: return CALL_BAD;
    }
}

/* ---- content ---- */

/* Content t[from..to), after p->ws held whitespace that ends at from:
 * handed out up to its last non-space byte; trailing whitespace is held
 * (dropped before a call, and at the end of an answer with calls). */
static int content(cb_tool_parser *p, const cb_tool_sink *sink, const char *t, size_t from, size_t to) {
    size_t k = to;
    while (k > from && is_ws(t[k - 1])) k--;
    if (k == from) {
        p->ws += to - from;
        return 0;
    }
    const size_t begin = from - p->ws;
    p->ws = to - k;
    p->emitted += k - begin;
    return sink->content(sink->ctx, t + begin, k - begin);
}

/* Where the next call starts in t[p->pos..len), and its marker's length;
 * or -1, with *hold set to the tail that could still begin one. */
static size_t next_marker(cb_tool_parser *p, const char *t, size_t len, size_t *mlen, size_t *hold) {
    markers m = markers_of(p->fmt);
    size_t best = (size_t)-1;
    *hold = 0;
    if (p->fmt == CB_TOOLFMT_LLAMA3 && p->emitted == 0) {
        /* Llama 3.1 answers a call with the bare object: "{" first */
        size_t i = p->pos;
        while (i < len && is_ws(t[i])) i++;
        if (i < len && t[i] == '{') {
            *mlen = 0;
            return i;
        }
    }
    for (int k = 0; k < m.n; k++) {
        size_t at = find_from(t, p->pos, len, m.s[k]);
        if (at < best) best = at, *mlen = strlen(m.s[k]);
    }
    if (best != (size_t)-1) return best;
    for (int k = 0; k < m.n; k++) {
        size_t ml = strlen(m.s[k]);
        for (size_t h = ml - 1 < len - p->pos ? ml - 1 : len - p->pos; h > *hold; h--)
            if (!memcmp(t + len - h, m.s[k], h)) {
                *hold = h;
                break;
            }
    }
    return best;
}

void cb_tool_parser_init(cb_tool_parser *p, cb_tool_format fmt, int max_calls, char *scratch, size_t scratch_cap,
                         cb_json_tok *toks, int max_toks) {
    memset(p, 0, sizeof *p);
    p->fmt = fmt;
    p->max_calls = max_calls < 1 ? 1 : max_calls > CB_MAX_TOOL_CALLS ? CB_MAX_TOOL_CALLS : max_calls;
    p->scratch = scratch, p->scratch_cap = scratch_cap;
    p->toks = toks, p->max_toks = max_toks;
}

int cb_tool_parser_feed(cb_tool_parser *p, const char *t, size_t len, int final, const cb_tool_sink *sink) {
    while (!p->done) {
        if (!p->in_call) {
            size_t mlen = 0, hold = 0;
            size_t at = next_marker(p, t, len, &mlen, &hold);
            size_t limit = at != (size_t)-1 ? at : final ? len : len - hold;
            if (content(p, sink, t, p->pos, limit) != 0) return -1;
            p->pos = limit;
            if (at == (size_t)-1) {
                if (final && p->ws) { /* an answer's own trailing spaces stay, unless it made calls */
                    if (!p->n_calls && sink->content(sink->ctx, t + p->pos - p->ws, p->ws) != 0) return -1;
                    p->ws = 0;
                }
                return 0;
            }
            p->in_call = 1, p->stage = 0;
            p->call_start = at, p->marker_len = mlen;
            p->part = p->search = at + mlen;
        }
        size_t end = 0;
        int r = step_call(p, t, len, final, sink, &end);
        if (r == CALL_STOP) return -1;
        if (r == CALL_MORE && !final) return 0;
        p->in_call = 0;
        if (r == CALL_DONE) {
            p->ws = 0; /* whitespace between content and a call is dropped */
            p->pos = end;
        } else {
            /* malformed or unterminated: its marker is text, and the search
             * goes on after it (after "{" for Llama's bare object) */
            size_t stop = p->call_start + (p->marker_len ? p->marker_len : 1);
            if (content(p, sink, t, p->pos, stop) != 0) return -1;
            p->pos = stop;
        }
    }
    return 0;
}

/* ---- constraints for tool_choice "required" and named functions ---- */

static void put(char *out, size_t cap, const char *s, int *bad) {
    if (strlen(s) + 1 > cap) *bad = 1;
    else strcpy(out, s);
}

/* {"type":"object","properties":{"name":{"const":N},KEY:P},"required":["name",KEY]} */
static void call_schema(cb_jw *w, const char *json, const cb_json_tok *t, int fn, const char *key) {
    int name = cb_json_find(json, t, fn, "name"), params = cb_json_find(json, t, fn, "parameters");
    cb_jw_begin_object(w);
    cb_jw_key(w, "type");
    cb_jw_str(w, "object");
    cb_jw_key(w, "properties");
    cb_jw_begin_object(w);
    cb_jw_key(w, "name");
    cb_jw_begin_object(w);
    cb_jw_key(w, "const");
    cb_jw_raw(w, json + t[name].start - 1, (size_t)(t[name].end - t[name].start) + 2);
    cb_jw_end_object(w);
    cb_jw_key(w, key);
    if (params >= 0 && t[params].type == CB_JSON_OBJECT)
        cb_jw_raw(w, json + t[params].start, (size_t)(t[params].end - t[params].start));
    else
        cb_jw_raw(w, "{\"type\":\"object\"}", 17);
    cb_jw_end_object(w);
    cb_jw_key(w, "required");
    cb_jw_begin_array(w);
    cb_jw_str(w, "name");
    cb_jw_str(w, key);
    cb_jw_end_array(w);
    cb_jw_end_object(w);
}

/* The "function" object of the tool named name (NULL: -1). */
static int tool_function(const char *json, const cb_json_tok *t, int tools, const char *name) {
    for (int k = 0, e = tools + 1; k < t[tools].size; k++, e = t[e].next) {
        int fn = cb_json_find(json, t, e, "function");
        int nm = fn >= 0 ? cb_json_find(json, t, fn, "name") : -1;
        if (nm >= 0 && t[nm].type == CB_JSON_STRING && (!name || cb_json_str_eq(json, &t[nm], name))) return fn;
    }
    return -1;
}

int cb_tool_constraint(cb_tool_format fmt, const char *json, const cb_json_tok *t, int tools, const char *name,
                       char *prefix, size_t prefix_cap, char *schema, size_t schema_cap, char *suffix,
                       size_t suffix_cap) {
    int bad = 0;
    if (cb_tool_format_builds_args(fmt) || fmt == CB_TOOLFMT_NONE) return -1;
    if (tools < 0 || t[tools].type != CB_JSON_ARRAY) return -1;
    char only[CB_TOOL_NAME_BYTES + 1];
    if (cb_tool_format_names_outside(fmt) && !name) { /* "required" with one tool is that tool by name */
        const int fn = t[tools].size == 1 ? tool_function(json, t, tools, NULL) : -1;
        const int nm = fn >= 0 ? cb_json_find(json, t, fn, "name") : -1;
        if (nm < 0 || cb_json_unescape(json, &t[nm], only, sizeof only) <= 0) return -1;
        name = only;
    }
    cb_jw w;
    cb_jw_init(&w, schema, schema_cap);
    if (cb_tool_format_names_outside(fmt)) { /* the name in the prefix, the arguments' schema */
        int fn = tool_function(json, t, tools, name);
        if (fn < 0) return -1;
        int params = cb_json_find(json, t, fn, "parameters");
        if (params >= 0 && t[params].type == CB_JSON_OBJECT)
            cb_jw_raw(&w, json + t[params].start, (size_t)(t[params].end - t[params].start));
        else
            cb_jw_raw(&w, "{\"type\":\"object\"}", 17);
        const section_tags *g = section_of(fmt);
        int n = fmt == CB_TOOLFMT_HARMONY
                    ? snprintf(prefix, prefix_cap, "<|channel|>commentary to=functions.%s <|constrain|>json<|message|>",
                               name)
                : fmt == CB_TOOLFMT_KIMI ? snprintf(prefix, prefix_cap, "%s%sfunctions.%s:0%s", g->begin, g->call_begin,
                                                    name, g->sep)
                                         : snprintf(prefix, prefix_cap, "%s%s%s%s", g->begin, g->call_begin, name, g->sep);
        if (n < 0 || (size_t)n >= prefix_cap) bad = 1;
        n = fmt == CB_TOOLFMT_HARMONY ? snprintf(suffix, suffix_cap, "%s", "")
                                      : snprintf(suffix, suffix_cap, "%s%s", g->call_end, g->end);
        if (n < 0 || (size_t)n >= suffix_cap) bad = 1;
        return bad || w.overflow ? -1 : 0;
    }
    const char *key = fmt == CB_TOOLFMT_LLAMA3 ? "parameters" : "arguments";
    if (name) {
        int fn = tool_function(json, t, tools, name);
        if (fn < 0) return -1;
        call_schema(&w, json, t, fn, key);
    } else {
        cb_jw_begin_object(&w);
        cb_jw_key(&w, "anyOf");
        cb_jw_begin_array(&w);
        int any = 0;
        for (int k = 0, e = tools + 1; k < t[tools].size; k++, e = t[e].next) {
            int fn = cb_json_find(json, t, e, "function");
            int nm = fn >= 0 ? cb_json_find(json, t, fn, "name") : -1;
            if (nm < 0 || t[nm].type != CB_JSON_STRING) continue;
            call_schema(&w, json, t, fn, key);
            any = 1;
        }
        cb_jw_end_array(&w);
        cb_jw_end_object(&w);
        if (!any) return -1;
    }
    put(prefix, prefix_cap, fmt == CB_TOOLFMT_HERMES ? "<tool_call>\n" : fmt == CB_TOOLFMT_MISTRAL ? "[TOOL_CALLS][" : "",
        &bad);
    put(suffix, suffix_cap, fmt == CB_TOOLFMT_HERMES ? "\n</tool_call>" : fmt == CB_TOOLFMT_MISTRAL ? "]" : "", &bad);
    return bad || w.overflow ? -1 : 0;
}
