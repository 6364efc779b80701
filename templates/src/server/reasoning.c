/* Thinking text as reasoning_content (chat completions, and /v1/responses
 * as a reasoning item; not /v1/completions), where the
 * model's chat template marks it: a template whose source holds both
 * "<think>" and "</think>", each one token of the vocabulary (Qwen3,
 * DeepSeek-R1 style), or Gemma 4's "<|channel>" and "<channel|>" (its
 * thinking is "<|channel>thought\n...<channel|>": the channel's name, up
 * to its newline, is dropped). The rule, by generated token:
 *   - the answer starts inside a thinking block when the prompt's last
 *     marker is <think> (a template that opens the block in the generation
 *     prompt, or an assistant prefill that does); otherwise a first token
 *     <think> opens one;
 *   - inside the block, </think> closes it; what came before is
 *     reasoning_content, what follows is content;
 *   - the newlines that open each part are dropped (as Qwen3's template
 *     strips them when it reads reasoning back); markers elsewhere are text.
 * A model whose template has no markers answers as before, without the
 * reasoning_content field.
 *
 * gpt-oss (a harmony template, toolcall.c's rule, with <|start|>,
 * <|channel|>, <|message|>, <|end|>, <|constrain|> each one token): its
 * answer is messages "<|channel|>analysis<|message|>...<|end|><|start|>
 * assistant<|channel|>final<|message|>...". The markers and each header's
 * text (role, channel, recipient, up to <|message|>) never reach the
 * answer; the header is kept aside and decides where the body goes:
 *   - analysis: reasoning_content (while no other message has begun; a
 *     later one is content, as the reasoning comes first in text[]);
 *   - a recipient "to=functions.NAME": a tool call. With tools, the
 *     header is written back into text[] as " to=functions.NAME ...
 *     <|message|>" for the tool parser's harmony mode, which reads the
 *     arguments up to <|call|> or the end (<|call|> ends the answer);
 *     without tools the arguments are content;
 *   - final, or anything else: content.
 * Text before any marker is content. An assistant prefill that opens a
 * message is not followed (the answer starts as content). */
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

enum { H_START, H_CHANNEL, H_MESSAGE, H_END, H_CONSTRAIN };

static void harmony_init(cb_app *a, const cb_tokenizer *t) {
    static const char *const names[5] = {"<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|constrain|>"};
    a->harmony = 0;
    if (!t->chat_tpl || t->n_chat != 1 ||
        cb_tool_format_detect(t->chat[0], t->chat_len[0]) != CB_TOOLFMT_HARMONY)
        return;
    for (int i = 0; i < 5; i++)
        if ((a->harmony_tok[i] = single_token(t, names[i])) < 0) return;
    a->harmony = 1;
}

void cb_reasoning_init(cb_app *a) {
    const cb_tokenizer *t = cb_engine_tokenizer(a->engine);
    a->think_open = a->think_close = -1;
    harmony_init(a, t);
    if (a->harmony) return;
    a->think_label = 0;
    if (!t->chat_tpl || t->n_chat != 1) return;
    const char *src = t->chat[0];
    const size_t n = t->chat_len[0];
    const int gemma = !(holds(src, n, "<think>") && holds(src, n, "</think>"));
    if (gemma && !(holds(src, n, "<|channel>") && holds(src, n, "<channel|>"))) return;
    const int32_t open = single_token(t, gemma ? "<|channel>" : "<think>");
    const int32_t close = single_token(t, gemma ? "<channel|>" : "</think>");
    if (open >= 0 && close >= 0 && open != close) a->think_open = open, a->think_close = close, a->think_label = gemma;
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
    const int split = (a->think_open >= 0 || a->harmony) && st->req->endpoint != CB_EP_COMPLETION;
    st->think_state = !split ? CB_THINK_NONE
                      : a->harmony ? CB_THINK_CONTENT
                      : st->req->reasoning ? CB_THINK_REASONING : CB_THINK_START;
    st->harmony_in_header = st->harmony_content = 0;
    st->harmony_hdr_len = 0;
    st->had_reasoning = st->think_state == CB_THINK_REASONING;
    st->think_fresh = 1;
    st->think_in_label = 0;
    st->reasoning_end = 0;
}

static int harmony_marker(const cb_app *a, int32_t token) {
    for (int i = 0; i < 5; i++)
        if (token == a->harmony_tok[i]) return 1;
    return 0;
}

int cb_reasoning_marker(const cb_app *a, cb_slot *st, int32_t token) {
    if (a->harmony) return st->think_state != CB_THINK_NONE && harmony_marker(a, token);
    if (st->think_state == CB_THINK_START && token != a->think_open) {
        st->think_state = CB_THINK_CONTENT; /* an answer without thinking: kept as it is */
        st->think_fresh = 0;
    }
    return (st->think_state == CB_THINK_START && token == a->think_open) ||
           (st->think_state == CB_THINK_REASONING && token == a->think_close);
}

static size_t find(const char *s, size_t n, const char *needle) {
    const size_t m = strlen(needle);
    for (size_t i = 0; i + m <= n; i++)
        if (s[i] == needle[0] && !memcmp(s + i, needle, m)) return i;
    return (size_t)-1;
}

/* A word of the header (channel names are whole words). */
static int has_word(const char *s, size_t n, const char *word) {
    const size_t m = strlen(word);
    for (size_t i = 0; i + m <= n; i++)
        if (!memcmp(s + i, word, m) && (i == 0 || s[i - 1] == ' ') && (i + m == n || s[i + m] == ' '))
            return 1;
    return 0;
}

static void text_put(cb_slot *st, const char *s, size_t n) {
    if (n > st->text_cap - st->text_len) n = st->text_cap - st->text_len;
    memcpy(st->text + st->text_len, s, n);
    st->text_len += n;
}

/* <|message|>: the header is complete; where the body goes. */
static void harmony_body(cb_slot *st) {
    const char *h = st->harmony_hdr;
    const size_t n = st->harmony_hdr_len, to = find(h, n, "to=functions.");
    const int analysis = to == (size_t)-1 && !st->harmony_content && has_word(h, n, "analysis");
    st->harmony_in_header = 0;
    st->think_fresh = 1;
    if (analysis) {
        st->think_state = CB_THINK_REASONING;
        st->had_reasoning = 1;
        return;
    }
    if (st->think_state == CB_THINK_REASONING) st->reasoning_end = st->text_len;
    st->think_state = CB_THINK_CONTENT;
    st->harmony_content = 1;
    if (to != (size_t)-1 && st->req->tool_format == CB_TOOLFMT_HARMONY) {
        text_put(st, " ", 1);
        text_put(st, h + to, n - to);
        text_put(st, "<|message|>", 11);
    }
}

static void harmony_switch(const cb_app *a, cb_slot *st, int32_t token) {
    if (token == a->harmony_tok[H_MESSAGE]) {
        harmony_body(st);
        return;
    }
    /* <|start|> and <|end|> begin a header; <|channel|> and <|constrain|>
     * continue one (or begin it, right after the generation prompt) */
    if (token == a->harmony_tok[H_START] || token == a->harmony_tok[H_END] || !st->harmony_in_header)
        st->harmony_hdr_len = 0;
    st->harmony_in_header = 1;
    if (st->harmony_hdr_len < sizeof st->harmony_hdr) st->harmony_hdr[st->harmony_hdr_len++] = ' ';
}

int cb_harmony_header(const cb_app *a, cb_slot *st, int32_t token) {
    if (!a->harmony || !st->harmony_in_header) return 0;
    char b[64];
    size_t n = cb_token_bytes(cb_engine_tokenizer(a->engine), token, b, sizeof b);
    const size_t room = sizeof st->harmony_hdr - st->harmony_hdr_len; /* a longer header is cut */
    if (n > room) n = room;
    memcpy(st->harmony_hdr + st->harmony_hdr_len, b, n);
    st->harmony_hdr_len += n;
    return 1;
}

void cb_reasoning_switch(cb_app *a, cb_slot *st, int32_t token) {
    if (a->harmony) {
        harmony_switch(a, st, token);
        return;
    }
    if (token == a->think_open) {
        st->think_state = CB_THINK_REASONING;
        st->had_reasoning = 1;
        st->think_in_label = a->think_label;
    } else {
        st->think_state = CB_THINK_CONTENT;
        st->reasoning_end = st->text_len;
    }
    st->think_fresh = 1;
}

size_t cb_reasoning_skip(cb_slot *st, const char *text, size_t n) {
    if (st->think_state == CB_THINK_NONE) return 0;
    size_t skip = 0;
    if (st->think_in_label) { /* the channel's name and its newline */
        while (skip < n && text[skip] != '\n') skip++;
        if (skip == n) return n;
        st->think_in_label = 0;
        skip++;
    }
    while (st->think_fresh && skip < n && text[skip] == '\n') skip++;
    if (skip < n) st->think_fresh = 0;
    return skip;
}
