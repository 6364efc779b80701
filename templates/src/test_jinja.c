/* The chat-template interpreter's test program (tests/test_jinja.py): renders
 * each template given against each context of a JSON array, the way the
 * server does, and prints every result as
 *   "=== ok <bytes>\n<text>\n" or "=== <error kind>\n<message>\n".
 * A context's keys become the template's variables ("messages" shaped as
 * the server shapes it). Built with the sanitizers, it is also the fuzz
 * harness: any input must end in a result, never a crash. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja.h"

static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (size_t got; buf && (got = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n == cap) {
            char *more = realloc(buf, cap *= 2);
            if (!more) free(buf);
            buf = more;
        }
    }
    fclose(f);
    *len = n;
    return buf;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: test_jinja CONTEXTS.json TEMPLATE...\n");
        return 2;
    }
    size_t clen;
    char *ctx = read_all(argv[1], &clen);
    if (!ctx) return 2;
    int n_toks = cb_json_parse(ctx, clen, NULL, 0, NULL);
    if (n_toks < 0) {
        fprintf(stderr, "%s: %s\n", argv[1], cb_json_strerror(n_toks));
        return 2;
    }
    cb_json_tok *toks = malloc(sizeof *toks * (size_t)n_toks);
    cb_json_parse(ctx, clen, toks, n_toks, NULL);
    size_t work_cap = (size_t)64 << 20, out_cap = (size_t)4 << 20;
    void *work = malloc(work_cap);
    char *out = malloc(out_cap);
    char err[512];
    for (int a = 2; a < argc; a++) {
        size_t tlen;
        char *src = read_all(argv[a], &tlen);
        if (!src) return 2;
        cb_jinja *t = cb_jinja_parse(src, tlen, err, sizeof err);
        free(src);
        for (int c = 0, e = 1; c < toks[0].size; c++, e = toks[e].next) {
            if (!t) {
                printf("=== parse-error\n%s\n", err);
                continue;
            }
            cb_jrender *r = cb_jinja_begin(t, work, work_cap);
            for (int k = e + 1, i = 0; i < toks[e].size; i++, k = toks[k + 1].next) {
                char name[64];
                int n = cb_json_unescape(ctx, &toks[k], name, sizeof name - 1);
                if (n < 0) return 2;
                name[n] = 0;
                if (!strcmp(name, "messages")) cb_jinja_set_messages(r, ctx, toks, k + 1, 0, NULL);
                else cb_jinja_set_json(r, name, ctx, toks, k + 1);
            }
            long got = cb_jinja_render(r, out, out_cap, err, sizeof err);
            if (got >= 0) {
                printf("=== ok %ld\n", got);
                fwrite(out, 1, (size_t)got, stdout);
                printf("\n");
            } else {
                static const char *kinds[] = {"", "error", "raised", "too-long", "no-memory"};
                printf("=== %s\n%s\n", kinds[-got], err);
            }
        }
        cb_jinja_free(t);
    }
    free(work), free(out), free(toks), free(ctx);
    return 0;
}
