#include "tokenizer.h"

void cb_tokenizer_init(cb_tokenizer *t, const cb_tok_info *info, uint32_t vocab) {
    t->info = *info;
    t->vocab = vocab;
}

int cb_tokenize(const cb_tokenizer *t, const char *text, size_t len, int32_t *out, int cap) {
    (void)t;
    if (len > (size_t)cap) return -1;
    for (size_t i = 0; i < len; i++) out[i] = (uint8_t)text[i];
    return (int)len;
}

size_t cb_token_bytes(const cb_tokenizer *t, int32_t id, char *out, size_t cap) {
    (void)t;
    if (id < 0 || id > 255 || cap < 1) return 0;
    out[0] = (char)id;
    return 1;
}

int cb_is_end_token(const cb_tokenizer *t, int32_t id) {
    return (uint32_t)id == t->info.eos_id || (uint32_t)id == t->info.end_of_turn;
}
