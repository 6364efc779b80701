/* Thinking text as reasoning_content (chat completions only), where the
 * model's chat template marks it: a template whose source holds both
 * "<think>" and "</think>", each one token of the vocabulary (Qwen3,
 * DeepSeek-R1 style). The rule, by generated token:
 *   - the answer starts inside a thinking block when the prompt's last
 *     marker is <think> (a template that opens the block in the generation
 *     prompt, or an assistant prefill that does); otherwise a first token
 *     <think> opens one;
 *   - inside the block, </think> closes it; what came before is
 *     reasoning_content, what follows is content;
 *   - the newlines that open each part are dropped (as Qwen3's template
 *     strips them when it reads reasoning back); markers elsewhere are text.
 * A model whose template has no markers answers as before, without the
 * reasoning_content field. gpt-oss's harmony channels are not split. */
#include <string.h>

#include "app_internal.h"

static int32_t single_token(const cb_tokenizer *t, const char *text) {
    int32_t ids[4];
    char err[64];
    int n = cb_tokenize_ex(t, text, strlen(text), 1, ids, 4, err, sizeof err);
    return n == 1 ? ids[0] : -1;
}

static int holds(const char *s, size_t n, const char *needle) {
    const size_t m = strlen(needle);
    for (size_t i = 0; i + m <= n; i++)
        if (s[i] == needle[0] && !memcmp(s + i, needle, m)) return 1;
    return 0;
}

void cb_reasoning_init(cb_app *a) {
    const cb_tokenizer *t = cb_engine_tokenizer(a->engine);
    a->think_open = a->think_close = -1;
    if (!t->chat_tpl || t->n_chat != 1 || !holds(t->chat[0], t->chat_len[0], "<think>") ||
        !holds(t->chat[0], t->chat_len[0], "</think>"))
        return;
    const int32_t open = single_token(t, "<think>"), close = single_token(t, "</think>");
    if (open >= 0 && close >= 0 && open != close) a->think_open = open, a->think_close = close;
}

void cb_reasoning_request(const cb_app *a, cb_request *q) {
    q->reasoning = 0;
    if (a->think_open < 0) return;
    for (int i = q->n_prompt - 1; i >= 0; i--) {
        if (q->prompt[i] == a->think_close) return;
        if (q->prompt[i] == a->think_open) {
            q->reasoning = 1;
            return;
        }
    }
}

void cb_reasoning_slot(const cb_app *a, cb_slot *st) {
    const int split = a->think_open >= 0 && st->req->endpoint == CB_EP_CHAT;
    st->think_state = !split ? CB_THINK_NONE : st->req->reasoning ? CB_THINK_REASONING : CB_THINK_START;
    st->had_reasoning = st->think_state == CB_THINK_REASONING;
    st->think_fresh = 1;
    st->reasoning_end = 0;
}

int cb_reasoning_marker(const cb_app *a, cb_slot *st, int32_t token) {
    if (st->think_state == CB_THINK_START && token != a->think_open) {
        st->think_state = CB_THINK_CONTENT; /* an answer without thinking: kept as it is */
        st->think_fresh = 0;
    }
    return (st->think_state == CB_THINK_START && token == a->think_open) ||
           (st->think_state == CB_THINK_REASONING && token == a->think_close);
}

void cb_reasoning_switch(cb_app *a, cb_slot *st, int32_t token) {
    if (token == a->think_open) {
        st->think_state = CB_THINK_REASONING;
        st->had_reasoning = 1;
    } else {
        st->think_state = CB_THINK_CONTENT;
        st->reasoning_end = st->text_len;
    }
    st->think_fresh = 1;
}

size_t cb_reasoning_skip(cb_slot *st, const char *text, size_t n) {
    if (st->think_state == CB_THINK_NONE) return 0;
    size_t skip = 0;
    while (st->think_fresh && skip < n && text[skip] == '\n') skip++;
    if (skip < n) st->think_fresh = 0;
    return skip;
}
