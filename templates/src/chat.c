#include "chat.h"

#include <stdio.h>
#include <string.h>

static uint32_t role_token(const cb_tokenizer *t, const char *role, size_t len) {
    if (len == 6 && !memcmp(role, "system", 6)) return t->info.role_system;
    if (len == 4 && !memcmp(role, "user", 4)) return t->info.role_user;
    if (len == 9 && !memcmp(role, "assistant", 9)) return t->info.role_assistant;
    return CB_NO_TOKEN;
}

int cb_chat_format(const cb_tokenizer *t, const cb_chat_message *msgs, int n, int32_t *out, int cap,
                   char *err, size_t err_len) {
    int used = 0;
    if (t->info.role_user == CB_NO_TOKEN || t->info.role_assistant == CB_NO_TOKEN) {
        snprintf(err, err_len, "this model's tokenizer has no chat roles");
        return -1;
    }
    if (cap < 1) goto too_long;
    out[used++] = (int32_t)t->info.bos_id;
    for (int i = 0; i < n; i++) {
        uint32_t role = role_token(t, msgs[i].role, msgs[i].role_len);
        if (role == CB_NO_TOKEN) {
            snprintf(err, err_len, "messages[%d].role: got '%.*s', expected system, user or assistant", i,
                     (int)(msgs[i].role_len > 32 ? 32 : msgs[i].role_len), msgs[i].role);
            return -1;
        }
        if (used + 2 > cap) goto too_long;
        out[used++] = (int32_t)role;
        int got = cb_tokenize(t, msgs[i].content, msgs[i].content_len, out + used, cap - used - 1);
        if (got < 0) goto too_long;
        used += got;
        out[used++] = (int32_t)t->info.end_of_turn;
    }
    if (used + 1 > cap) goto too_long;
    out[used++] = (int32_t)t->info.role_assistant;
    return used;
too_long:
    snprintf(err, err_len, "the prompt is longer than %d tokens", cap);
    return -1;
}
