/* Test driver of gpt-oss channel splitting and thinking blocks
 * (reasoning.c) with the tool-call parser (toolcall.c), built and run by
 * tests/test_harmony_split.py (with ASan/UBSan):
 *   test_harmony TEMPLATE TOOLS STREAM TOKEN...
 * TEMPLATE: the chat template file (its format decides whether channels are
 * split); TOOLS 1: the request has tools; STREAM 1: streamed. Each TOKEN is
 * one generated token: a harmony marker ("<|channel|>", ...) or thinking
 * marker ("<think>", Gemma 4's "<|channel>", ...) is that special token,
 * anything else a text token; <|return|> and <|call|> end the answer. The tokens go through the same steps as take_token() and
 * release() in app.c (non-streamed: text[] and write_message_text's split;
 * streamed: each release's key as cb_stream_delta picks it). Prints
 * {"split", "reasoning" (null: none), "content", "calls": [{"name", "arguments"}]}. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app_internal.h"

static const char *const SPECIALS[] = {"<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|constrain|>",
                                       "<|return|>", "<|call|>",    "<think>",     "</think>", "<|channel>",
                                       "<channel|>"};
enum { N_SPECIALS = 11, TEXT_ID = 1000 };

static cb_tokenizer tok;
static char **args;

const cb_tokenizer *cb_engine_tokenizer(const cb_engine *e) { return (void)e, &tok; }

int cb_tokenize_ex(const cb_tokenizer *t, const char *text, size_t len, int parse_special, int32_t *out, int cap,
                   char *err, size_t err_len) {
    (void)t, (void)parse_special, (void)cap, (void)err, (void)err_len;
    for (int i = 0; i < N_SPECIALS; i++)
        if (strlen(SPECIALS[i]) == len && !memcmp(SPECIALS[i], text, len)) return out[0] = i, 1;
    return 2; /* any other text: not one token */
}

/* Text token k is argument TEXT_ID + k. */
size_t cb_token_bytes(const cb_tokenizer *t, int32_t id, char *out, size_t cap) {
    (void)t;
    const char *s = id < N_SPECIALS ? SPECIALS[id] : args[id - TEXT_ID];
    size_t n = strlen(s);
    if (n > cap) return 0;
    memcpy(out, s, n);
    return n;
}

static char text_buf[1 << 16], content[1 << 16], reasoning[1 << 16], scratch[1 << 16], calls[1 << 16];
static size_t content_len, reasoning_len;
static cb_json_tok toks[1024];
static cb_jw calls_w;
static int stream;

static void put(char *buf, size_t *len, const char *s, size_t n) {
    memcpy(buf + *len, s, n);
    *len += n;
}

static int on_content(void *ctx, const char *s, size_t n) {
    (void)ctx;
    put(content, &content_len, s, n);
    return 0;
}

static int on_call(void *ctx, int index, const char *name, size_t name_n, const char *a, size_t args_n) {
    (void)ctx, (void)index;
    cb_jw_begin_object(&calls_w);
    cb_jw_key(&calls_w, "name");
    cb_jw_str_n(&calls_w, name, name_n);
    cb_jw_key(&calls_w, "arguments");
    cb_jw_str_n(&calls_w, a, args_n);
    cb_jw_end_object(&calls_w);
    return 0;
}

/* release() of app.c, for the held text s[0..n). */
static void release(cb_slot *st, const char *s, size_t n, int final) {
    const size_t skip = cb_reasoning_skip(st, s, n);
    s += skip, n -= skip;
    if (!st->req->tool_format || st->think_state == CB_THINK_REASONING) {
        if (stream) put(st->think_state == CB_THINK_REASONING ? reasoning : content,
                        st->think_state == CB_THINK_REASONING ? &reasoning_len : &content_len, s, n);
        else put(st->text, &st->text_len, s, n);
        return;
    }
    put(st->text, &st->text_len, s, n);
    cb_tool_sink sink = {NULL, on_content, on_call};
    cb_tool_parser_feed(&st->tools, st->text + st->reasoning_end, st->text_len - st->reasoning_end, final, &sink);
}

int main(int argc, char **argv) {
    if (argc < 4) return 2;
    FILE *f = fopen(argv[1], "rb");
    static char tpl[1 << 16];
    if (!f) return 2;
    size_t tpl_n = fread(tpl, 1, sizeof tpl - 1, f);
    fclose(f);
    args = argv;
    tok.n_chat = 1, tok.chat[0] = tpl, tok.chat_len[0] = (uint32_t)tpl_n;
    tok.chat_tpl = (struct cb_jinja *)tpl; /* only tested for NULL */
    stream = atoi(argv[3]);

    static cb_app a;
    static cb_slot st;
    static cb_request q;
    cb_reasoning_init(&a);
    q.endpoint = CB_EP_CHAT;
    q.tool_format = atoi(argv[2]) ? cb_tool_format_detect(tpl, tpl_n) : CB_TOOLFMT_NONE;
    st.req = &q;
    st.text = text_buf, st.text_cap = sizeof text_buf;
    if (q.tool_format) cb_tool_parser_init(&st.tools, q.tool_format, CB_MAX_TOOL_CALLS, scratch, sizeof scratch, toks, 1024);
    cb_reasoning_slot(&a, &st);
    static char out[1 << 18];
    cb_jw_init(&calls_w, calls, sizeof calls);
    cb_jw_begin_array(&calls_w);

    for (int k = 4; k <= argc; k++) {
        int32_t id = TEXT_ID + k;
        for (int i = 0; k < argc && i < N_SPECIALS; i++)
            if (!strcmp(argv[k], SPECIALS[i])) id = i;
        if (k == argc || id == 5 || id == 6) { /* the end */
            release(&st, "", 0, 1);
            break;
        }
        char b[256];
        if (cb_reasoning_marker(&a, &st, id)) {
            cb_reasoning_switch(&a, &st, id);
        } else if (!cb_harmony_header(&a, &st, id)) {
            size_t n = cb_token_bytes(&tok, id, b, sizeof b);
            release(&st, b, n, 0);
        }
    }
    cb_jw_end_array(&calls_w);

    cb_jw w;
    cb_jw_init(&w, out, sizeof out);
    cb_jw_begin_object(&w);
    cb_jw_key(&w, "split");
    cb_jw_int(&w, st.think_state != CB_THINK_NONE);
    if (!stream) { /* write_message_text() of response.c */
        size_t from = 0;
        const size_t end = st.think_state == CB_THINK_REASONING ? st.text_len : st.reasoning_end;
        if (st.had_reasoning) put(reasoning, &reasoning_len, st.text, end), from = end;
        if (!q.tool_format) put(content, &content_len, st.text + from, st.text_len - from);
    }
    cb_jw_key(&w, "reasoning");
    if (st.had_reasoning) cb_jw_str_n(&w, reasoning, reasoning_len);
    else cb_jw_null(&w);
    cb_jw_key(&w, "content");
    cb_jw_str_n(&w, content, content_len);
    cb_jw_end_object(&w);
    printf("%.*s, \"calls\": %s}\n", (int)w.len - 1, out, calls);
    return 0;
}
