/* Text <-> token ids. This build has the byte-level tokenizer of synthetic
 * models (token b < 256 is byte b; specials follow); real BPE vocabularies
 * come with the tokenizer work. No call allocates. */
#ifndef CB_TOKENIZER_H
#define CB_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "weights.h"

typedef struct {
    cb_tok_info info;
    uint32_t vocab;
} cb_tokenizer;

void cb_tokenizer_init(cb_tokenizer *t, const cb_tok_info *info, uint32_t vocab);
/* Encodes text into out; returns the count, or -1 if more than cap ids. */
int cb_tokenize(const cb_tokenizer *t, const char *text, size_t len, int32_t *out, int cap);
/* Writes the bytes token id stands for (none for specials); returns how many. */
size_t cb_token_bytes(const cb_tokenizer *t, int32_t id, char *out, size_t cap);
int cb_is_end_token(const cb_tokenizer *t, int32_t id);

#endif
