/* Turning chat messages into the prompt's token ids.
 * bytes tokenizer (synthetic models): BOS, then per message
 *   <role> content <end_of_turn>, then <assistant>.
 * Real tokenizers: the model's Jinja chat template, reduced at build time by
 * toolkit/chat_template.py to the strings below (tokenizer.cbt's chat
 * section), is rendered to text, then tokenized with special tokens parsed:
 *   turn mode:      [head_sys system sys_user | head] user1 user_asst asst1 asst_user user2 ... tail
 *   last_user mode: head user1 user_asst asst1 asst_user system sys_sep userN tail
 * An optional system message comes first; the last message is the user's. */
#ifndef CB_CHAT_H
#define CB_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"

enum cb_chat_field {
    CB_CHAT_HEAD_SYS, CB_CHAT_HEAD, CB_CHAT_SYS_USER, CB_CHAT_USER_ASST, CB_CHAT_ASST_USER, CB_CHAT_TAIL,
    CB_CHAT_SYS_SEP, CB_CHAT_OPTIONS, /* "<mode><trim system><trim user><trim assistant>" digits */
    CB_CHAT_N_FIELDS
};
#define CB_CHAT_DATE '\x1a' /* in a template string: today's date, YYYY-MM-DD */

typedef struct {
    const char *role;
    size_t role_len;
    const char *content;
    size_t content_len;
} cb_chat_message;

/* Whether the tokenizer carries a chat template (or is the byte tokenizer). */
int cb_chat_available(const cb_tokenizer *t);
/* Renders the messages as the template's text into text[cap]; returns the
 * length, or -1 with a message in err (no template, bad roles or order,
 * text longer than cap). */
long cb_chat_render(const cb_tokenizer *t, const cb_chat_message *msgs, int n, char *text, size_t cap,
                    char *err, size_t err_len);
/* The prompt's ids (rendered into text[text_cap] first, for real
 * tokenizers). Returns the number of ids, or -1 with a message in err
 * (unknown role, prompt longer than cap tokens). */
int cb_chat_format(const cb_tokenizer *t, const cb_chat_message *msgs, int n, char *text, size_t text_cap,
                   int32_t *out, int cap, char *err, size_t err_len);

#endif
