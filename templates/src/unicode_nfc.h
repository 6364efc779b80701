/* Unicode normalisation form C for the tokenizers that normalise. */
#ifndef CB_UNICODE_NFC_H
#define CB_UNICODE_NFC_H

#include <stddef.h>
#include <stdint.h>

/* Whether NFC could change s (holds a character outside the inert set). */
int cb_nfc_needed(const uint8_t *s, size_t len);
/* NFC of s into out, using cps[cap] as scratch; returns the length, or -1
 * if cps or out is too small. */
long cb_nfc(const uint8_t *s, size_t len, uint32_t *cps, size_t cap, uint8_t *out, size_t out_cap);

#endif
