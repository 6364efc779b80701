/* Test driver of the tool-call parser (toolcall.c), built and run by
 * tests/test_toolcall.py (with ASan/UBSan):
 *   test_toolcall parse CASES.json   each case {"format", "text", "cuts": [byte offsets], "max_calls",
 *                                    "final"} fed in pieces ending at the cuts, then whole (the last
 *                                    feed final unless "final": false); prints a JSON line per case:
 *                                    {"content", "calls": [{"name", "arguments"}], "pieces": n}
 *   test_toolcall detect FILE...     the format name of each chat template
 *   test_toolcall constraint FORMAT NAME|- TOOLS.json   {"prefix", "schema", "suffix"} */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "toolcall.h"

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)len + 1);
    if (s && fread(s, 1, (size_t)len, f) != (size_t)len) len = 0;
    fclose(f);
    if (s) s[len] = 0;
    *n = (size_t)len;
    return s;
}

typedef struct {
    cb_jw *w;
    int pieces;
} out_ctx;

/* Content pieces and calls are collected as they come, in order. */
static char content_buf[1 << 20];
static size_t content_len;

static int on_content(void *ctx, const char *s, size_t n) {
    out_ctx *o = ctx;
    if (n == 0) return -1; /* the parser never hands out empty content */
    if (content_len + n > sizeof content_buf) return -1;
    memcpy(content_buf + content_len, s, n);
    content_len += n;
    o->pieces++;
    return 0;
}

static int on_call(void *ctx, int index, const char *name, size_t name_n, const char *args, size_t args_n) {
    out_ctx *o = ctx;
    (void)index;
    cb_jw_begin_object(o->w);
    cb_jw_key(o->w, "name");
    cb_jw_str_n(o->w, name, name_n);
    cb_jw_key(o->w, "arguments");
    cb_jw_str_n(o->w, args, args_n);
    cb_jw_end_object(o->w);
    return 0;
}

static cb_tool_format format_named(const char *json, const cb_json_tok *t) {
    for (int f = CB_TOOLFMT_NONE; f <= CB_TOOLFMT_LAST; f++)
        if (cb_json_str_eq(json, t, cb_tool_format_name((cb_tool_format)f))) return (cb_tool_format)f;
    return CB_TOOLFMT_NONE;
}

#define MAX_TOKS (1 << 20)
static cb_json_tok toks[MAX_TOKS], ptoks[4096];
static char text[1 << 20], scratch[1 << 16], calls_buf[1 << 20];

static int parse_cases(const char *path) {
    size_t n;
    char *json = slurp(path, &n);
    if (!json || cb_json_parse(json, n, toks, MAX_TOKS, NULL) < 1 || toks[0].type != CB_JSON_ARRAY) {
        fprintf(stderr, "%s: not a JSON array\n", path);
        free(json);
        return 1;
    }
    static char line[1 << 21];
    for (int k = 0, c = 1; k < toks[0].size; k++, c = toks[c].next) {
        int fmt = cb_json_find(json, toks, c, "format"), tx = cb_json_find(json, toks, c, "text");
        int cuts = cb_json_find(json, toks, c, "cuts"), mc = cb_json_find(json, toks, c, "max_calls");
        int fin = cb_json_find(json, toks, c, "final"), final = 1;
        if (fin >= 0) cb_json_get_bool(&toks[fin], &final);
        int len = cb_json_unescape(json, &toks[tx], text, sizeof text);
        int64_t max_calls = CB_MAX_TOOL_CALLS;
        if (mc >= 0) cb_json_get_int64(json, &toks[mc], &max_calls);
        cb_jw calls;
        cb_jw_init(&calls, calls_buf, sizeof calls_buf);
        cb_jw_begin_array(&calls);
        out_ctx o = {&calls, 0};
        cb_tool_sink sink = {&o, on_content, on_call};
        cb_tool_parser p;
        cb_tool_parser_init(&p, format_named(json, &toks[fmt]), (int)max_calls, scratch, sizeof scratch, ptoks, 4096);
        content_len = 0;
        int r = 0;
        for (int i = 0, e = cuts + 1; cuts >= 0 && i < toks[cuts].size && !r; i++, e = toks[e].next) {
            int64_t cut;
            cb_json_get_int64(json, &toks[e], &cut);
            if (cut > len) cut = len;
            r = cb_tool_parser_feed(&p, text, (size_t)cut, 0, &sink);
        }
        if (!r) r = cb_tool_parser_feed(&p, text, (size_t)len, final, &sink);
        cb_jw_end_array(&calls);
        cb_jw w;
        cb_jw_init(&w, line, sizeof line);
        cb_jw_begin_object(&w);
        cb_jw_key(&w, "content");
        cb_jw_str_n(&w, content_buf, content_len);
        cb_jw_key(&w, "calls");
        cb_jw_raw(&w, calls.buf, calls.len);
        cb_jw_key(&w, "pieces");
        cb_jw_int(&w, o.pieces);
        cb_jw_key(&w, "done");
        cb_jw_bool(&w, p.done);
        cb_jw_key(&w, "status");
        cb_jw_int(&w, r);
        cb_jw_end_object(&w);
        if (w.overflow || calls.overflow) return 2;
        printf("%s\n", line);
    }
    free(json);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 3 && !strcmp(argv[1], "parse")) return parse_cases(argv[2]);
    if (argc >= 2 && !strcmp(argv[1], "detect")) {
        for (int i = 2; i < argc; i++) {
            size_t n;
            char *src = slurp(argv[i], &n);
            printf("%s\n", cb_tool_format_name(cb_tool_format_detect(src, n)));
            free(src);
        }
        return 0;
    }
    if (argc == 5 && !strcmp(argv[1], "constraint")) {
        size_t n;
        char *json = slurp(argv[4], &n);
        if (!json || cb_json_parse(json, n, toks, MAX_TOKS, NULL) < 1) {
            free(json);
            return 1;
        }
        cb_tool_format f = CB_TOOLFMT_NONE;
        for (int k = 0; k <= CB_TOOLFMT_LAST; k++)
            if (!strcmp(argv[2], cb_tool_format_name((cb_tool_format)k))) f = (cb_tool_format)k;
        static char prefix[512], schema[1 << 16], suffix[64];
        if (cb_tool_constraint(f, json, toks, 0, strcmp(argv[3], "-") ? argv[3] : NULL, prefix, sizeof prefix, schema,
                               sizeof schema, suffix, sizeof suffix) != 0) {
            free(json);
            printf("unsupported\n");
            return 0;
        }
        static char line[1 << 17];
        cb_jw w;
        cb_jw_init(&w, line, sizeof line);
        cb_jw_begin_object(&w);
        cb_jw_key(&w, "prefix");
        cb_jw_str(&w, prefix);
        cb_jw_key(&w, "schema");
        cb_jw_raw(&w, schema, strlen(schema));
        cb_jw_key(&w, "suffix");
        cb_jw_str(&w, suffix);
        cb_jw_end_object(&w);
        printf("%s\n", line);
        free(json);
        return 0;
    }
    fprintf(stderr, "usage: test_toolcall parse CASES.json | detect FILE... | constraint FORMAT NAME|- TOOLS.json\n");
    return 2;
}
