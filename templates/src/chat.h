/* Turning chat messages into the prompt's token ids.
 *   bytes tokenizer (synthetic models): BOS, then per message
 *     <role> content <end_of_turn>, then <assistant>.
 *   real tokenizers: the model's own Jinja chat template (tokenizer.cbt's
 *     chat section, parsed once when the tokenizer opens), rendered per
 *     request by jinja.c as transformers' apply_chat_template renders it,
 *     then tokenized with special tokens parsed. */
#ifndef CB_CHAT_H
#define CB_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include "server/json.h"
#include "tokenizer.h"

/* Working memory of one template render (values, captured text): the
 * request's messages and tools as Python values take a few times their JSON
 * size, and a request body is at most 1 MiB. */
#define CB_CHAT_WORK_BYTES ((size_t)24 << 20)

typedef struct {
    const char *role;
    size_t role_len;
    const char *content;
    size_t content_len;
} cb_chat_message;

/* A chat request as the template sees it: JSON values of the body. */
typedef struct {
    const char *json;
    const cb_json_tok *toks;
    int messages;              /* the "messages" array */
    int tools;                 /* the "tools" array, or -1 (the template gets none) */
    int kwargs;                /* "chat_template_kwargs" object, or -1 */
    int add_generation_prompt; /* 1 or 0 */
    int continue_final;        /* continue the final message (assistant prefill) */
} cb_chat_request;

/* Whether the tokenizer carries a chat template (or is the byte tokenizer). */
int cb_chat_available(const cb_tokenizer *t);
/* The template's text for the request into text[cap], rendered in
 * work[work_cap] (8-byte aligned); returns the length, or -1 with a message
 * in err: no template, the template's raise_exception message, a template
 * error, or a limit (text longer than cap, work too small). */
long cb_chat_apply(const cb_tokenizer *t, const cb_chat_request *q, void *work, size_t work_cap, char *text,
                   size_t cap, char *err, size_t err_len);
/* Byte tokenizer: the prompt's ids. Returns the number of ids, or -1 with a
 * message in err (unknown role, prompt longer than cap tokens). */
int cb_chat_format(const cb_tokenizer *t, const cb_chat_message *msgs, int n, int32_t *out, int cap, char *err,
                   size_t err_len);

#endif
