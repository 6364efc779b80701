/* Pre-tokenizer split rules of byte-level BPE vocabularies. */
#ifndef CB_PRETOK_H
#define CB_PRETOK_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"

/* End of the pre-token that starts at i < len (enum cb_pretok kind). */
size_t cb_pretok_next(int kind, const uint8_t *s, size_t len, size_t i);

#endif
