/* Turning chat messages into the prompt's token ids. For the byte tokenizer:
 *   BOS, then per message <role> content <end_of_turn>, then <assistant>.
 * Real chat templates, reduced from Jinja at build time, come with the
 * tokenizer work. */
#ifndef CB_CHAT_H
#define CB_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"

typedef struct {
    const char *role;
    size_t role_len;
    const char *content;
    size_t content_len;
} cb_chat_message;

/* Returns the number of ids, or -1 with a message in err (unknown role,
 * prompt longer than cap). */
int cb_chat_format(const cb_tokenizer *t, const cb_chat_message *msgs, int n, int32_t *out, int cap,
                   char *err, size_t err_len);

#endif
