/* Pre-tokenizers of byte-level BPE vocabularies: each regex below, hand
 * compiled into a walk over code points with the same leftmost-first
 * alternation and backtracking (Oniguruma semantics, as HF tokenizers runs
 * them). \p{L}, \p{N} and \s come from unicode_tables.c.
 *   GPT-2:  's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *   Llama3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *           ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *   Qwen2:  Llama3 with \p{N} instead of \p{N}{1,3} */
#include "pretok.h"

#include "unicode_tables.h"

/* Invalid UTF-8 is read one byte at a time as a code point of no class. */
#define CP_INVALID 0xFFFFFFFFu

static uint32_t cp_at(const uint8_t *s, size_t len, size_t i, size_t *n) {
    uint8_t c = s[i];
    if (c < 0x80) {
        *n = 1;
        return c;
    }
    int need;
    uint32_t cp, min;
    if (c >= 0xC2 && c <= 0xDF) need = 1, cp = c & 0x1F, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF) need = 2, cp = c & 0x0F, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4) need = 3, cp = c & 0x07, min = 0x10000;
    else goto invalid;
    for (int k = 1; k <= need; k++) {
        if (i + k >= len || (s[i + k] & 0xC0) != 0x80) goto invalid;
        cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) goto invalid;
    *n = (size_t)need + 1;
    return cp;
invalid:
    *n = 1;
    return CP_INVALID;
}

static uint32_t cls_at(const uint8_t *s, size_t len, size_t i, size_t *n) {
    uint32_t cp = cp_at(s, len, i, n);
    return cp == CP_INVALID ? 0 : cb_uni_class(cp);
}

#define IS_L(c) ((c) & CB_UNI_LETTER)
#define IS_N(c) ((c) & CB_UNI_NUMBER)
#define IS_S(c) ((c) & CB_UNI_SPACE)

/* End of a run of characters whose class satisfies pred, from i. */
#define RUN(cond)                                        \
    do {                                                 \
        while (j < len) {                                \
            size_t n_;                                   \
            uint32_t c = cls_at(s, len, j, &n_);         \
            if (!(cond)) break;                          \
            j += n_;                                     \
        }                                                \
    } while (0)

static int lower(uint8_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

/* 's 't 're 've 'm 'll 'd at i: its length, or 0. */
static size_t contraction(const uint8_t *s, size_t len, size_t i, int icase) {
    if (s[i] != '\'' || i + 1 >= len) return 0;
    int a = icase ? lower(s[i + 1]) : s[i + 1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (i + 2 >= len) return 0;
    int b = icase ? lower(s[i + 2]) : s[i + 2];
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

/* \s+(?!\S) then \s+ at i (s[i] is whitespace): the run, less its last
 * character when a non-space follows and the run has two or more. */
static size_t space_run(const uint8_t *s, size_t len, size_t i) {
    size_t j = i, last = i;
    while (j < len) {
        size_t n;
        uint32_t c = cls_at(s, len, j, &n);
        if (!IS_S(c)) break;
        last = j;
        j += n;
    }
    if (j < len && last > i) return last;
    return j;
}

static size_t gpt2_next(const uint8_t *s, size_t len, size_t i) {
    size_t n, j;
    size_t k = contraction(s, len, i, 0);
    if (k) return i + k;
    uint32_t c0 = cls_at(s, len, i, &n);
    j = (s[i] == ' ' && i + 1 < len) ? i + 1 : i;
    uint32_t c1 = cls_at(s, len, j, &n);
    if (IS_L(c1)) {
        RUN(IS_L(c));
        return j;
    }
    if (IS_N(c1)) {
        RUN(IS_N(c));
        return j;
    }
    if (!IS_S(c1) && !(j == i && IS_S(c0))) {
        RUN(!IS_S(c) && !IS_L(c) && !IS_N(c));
        return j;
    }
    return space_run(s, len, i);
}

static size_t llama3_next(const uint8_t *s, size_t len, size_t i, int max_digits) {
    size_t n, j = i;
    size_t k = contraction(s, len, i, 1);
    if (k) return i + k;
    uint32_t c0 = cls_at(s, len, i, &n);
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    if (IS_L(c0)) {
        RUN(IS_L(c));
        return j;
    }
    if (s[i] != '\r' && s[i] != '\n' && !IS_N(c0) && i + n < len) {
        size_t n1;
        if (IS_L(cls_at(s, len, i + n, &n1))) {
            j = i + n;
            RUN(IS_L(c));
            return j;
        }
    }
    /* \p{N}{1,max} */
    if (IS_N(c0)) {
        for (int d = 0; d < max_digits && j < len; d++) {
            size_t nd;
            if (!IS_N(cls_at(s, len, j, &nd))) break;
            j += nd;
        }
        return j;
    }
    /*  ?[^\s\p{L}\p{N}]+[\r\n]* */
    j = (s[i] == ' ' && i + 1 < len) ? i + 1 : i;
    {
        size_t n1;
        uint32_t c1 = cls_at(s, len, j, &n1);
        if (!IS_S(c1) && !IS_L(c1) && !IS_N(c1)) {
            RUN(!IS_S(c) && !IS_L(c) && !IS_N(c));
            while (j < len && (s[j] == '\r' || s[j] == '\n')) j++;
            return j;
        }
    }
    /* \s*[\r\n]+ : up to the last \r or \n of the whitespace run. */
    size_t end = i, last_nl = (size_t)-1;
    while (end < len) {
        size_t ns;
        if (!IS_S(cls_at(s, len, end, &ns))) break;
        if (s[end] == '\r' || s[end] == '\n') last_nl = end;
        end += ns;
    }
    if (last_nl != (size_t)-1) return last_nl + 1;
    return space_run(s, len, i);
}

size_t cb_pretok_next(int kind, const uint8_t *s, size_t len, size_t i) {
    switch (kind) {
    case CB_PRETOK_GPT2: return gpt2_next(s, len, i);
    case CB_PRETOK_LLAMA3: return llama3_next(s, len, i, 3);
    case CB_PRETOK_QWEN2: return llama3_next(s, len, i, 1);
    default: return len;
    }
}
