/* Code point classes for the pre-tokenizers: \p{L}, \p{N} and \s (the
 * White_Space property), Lu|Lt, Ll, \p{M}, \p{P}, \p{S}, as ranges generated
 * from the Unicode database by scripts/gen_unicode_tables.py. */
#ifndef CB_UNICODE_TABLES_H
#define CB_UNICODE_TABLES_H

#include <stdint.h>

/* NFC_INERT: a starter that is its own NFC and never the second half of a
 * composition, so NFC leaves any run of them unchanged. */
enum {
    CB_UNI_LETTER = 1, CB_UNI_NUMBER = 2, CB_UNI_SPACE = 4, CB_UNI_NFC_INERT = 8,
    CB_UNI_UPPER = 16, /* Lu, Lt (with LETTER) */
    CB_UNI_LOWER = 32, /* Ll (with LETTER); a letter with neither is Lm or Lo */
    CB_UNI_MARK = 64, CB_UNI_PUNCT = 128, CB_UNI_SYMBOL = 256
};

typedef struct {
    uint32_t first, last, cls;
} cb_uni_range;

typedef struct {
    uint32_t cp, ccc;
} cb_uni_ccc;

typedef struct {
    uint32_t cp, offset, len; /* full canonical decomposition in cb_uni_decomp_pool */
} cb_uni_decomp;

typedef struct {
    uint32_t first, second, composite;
} cb_uni_comp;

extern const cb_uni_ccc cb_uni_ccc_table[];
extern const int cb_uni_n_ccc;
extern const cb_uni_decomp cb_uni_decomp_table[];
extern const int cb_uni_n_decomp;
extern const uint32_t cb_uni_decomp_pool[];
extern const cb_uni_comp cb_uni_comp_table[];
extern const int cb_uni_n_comp;

extern const uint16_t cb_uni_ascii[128];
extern const cb_uni_range cb_uni_ranges[];
extern const int cb_uni_n_ranges;

/* The class bits of code point cp (0 for anything else). */
static inline uint32_t cb_uni_class(uint32_t cp) {
    if (cp < 128) return cb_uni_ascii[cp];
    int lo = 0, hi = cb_uni_n_ranges - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < cb_uni_ranges[mid].first) hi = mid - 1;
        else if (cp > cb_uni_ranges[mid].last) lo = mid + 1;
        else return cb_uni_ranges[mid].cls;
    }
    return 0;
}

#endif
