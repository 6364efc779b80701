/* Pre-tokenizers of byte-level BPE vocabularies: each regex below, hand
 * compiled into a walk over code points with the same leftmost-first
 * alternation and backtracking (Oniguruma semantics, as HF tokenizers runs
 * them). \p{L}, \p{N} and \s come from unicode_tables.c.
 *   GPT-2:  's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *   Llama3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *           ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *   Qwen2:  Llama3 with \p{N} instead of \p{N}{1,3}
 *   o200k (gpt-oss), with U = [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}], W = [\p{Ll}\p{Lm}\p{Lo}\p{M}],
 *   C = (?i:'s|'t|'re|'ve|'m|'ll|'d):
 *           [^\r\n\p{L}\p{N}]?U*W+C?|[^\r\n\p{L}\p{N}]?U+W*C?|\p{N}{1,3}|
 *            ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *   DeepSeek-V3: three Split rules, each applied to the pieces of the one
 *   before: \p{N}{1,3}, then [\x{4E00}-\x{9FA5}\x{3040}-\x{30FF}]+ (CJK), then
 *           [!-/:-@[-`{-~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|
 *            ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *   where text a rule does not match stays a piece of its own. */
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

/* 's 't 're 've 'm 'll 'd at i: its length, or 0. Case-insensitive, the
 * long s U+017F (C5 BF) matches s too: Oniguruma's case folding maps it. */
static size_t contraction(const uint8_t *s, size_t len, size_t i, int icase) {
    if (i >= len || s[i] != '\'' || i + 1 >= len) return 0;
    if (icase && i + 2 < len && s[i + 1] == 0xC5 && s[i + 2] == 0xBF) return 3;
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

/* \s*[\r\n]+ (up to the last \r or \n of the whitespace run), else
 * \s+(?!\S)|\s+ . */
static size_t newline_or_space_run(const uint8_t *s, size_t len, size_t i) {
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

/* \p{N}{1,max} at i (s[i] starts a number): its end. */
static size_t digit_run(const uint8_t *s, size_t len, size_t i, int max_digits) {
    size_t j = i;
    for (int d = 0; d < max_digits && j < len; d++) {
        size_t nd;
        if (!IS_N(cls_at(s, len, j, &nd))) break;
        j += nd;
    }
    return j;
}

/* The tail Llama 3 and o200k share:  ?[^\s\p{L}\p{N}]+[\r\n]* (o200k,
 * slash set: [\r\n/]*), else \s*[\r\n]+|\s+(?!\S)|\s+ . */
static size_t punct_or_space_run(const uint8_t *s, size_t len, size_t i, int slash) {
    size_t j = (s[i] == ' ' && i + 1 < len) ? i + 1 : i;
    size_t n1;
    uint32_t c1 = cls_at(s, len, j, &n1);
    if (!IS_S(c1) && !IS_L(c1) && !IS_N(c1)) {
        RUN(!IS_S(c) && !IS_L(c) && !IS_N(c));
        while (j < len && (s[j] == '\r' || s[j] == '\n' || (slash && s[j] == '/'))) j++;
        return j;
    }
    return newline_or_space_run(s, len, i);
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
    if (IS_N(c0)) return digit_run(s, len, i, max_digits);
    return punct_or_space_run(s, len, i, 0);
}

/* ---- o200k (gpt-oss) ---- */

#define IN_U(c) (((c) & CB_UNI_LETTER && !((c) & CB_UNI_LOWER)) || ((c) & CB_UNI_MARK))
#define IN_W(c) (((c) & CB_UNI_LETTER && !((c) & CB_UNI_UPPER)) || ((c) & CB_UNI_MARK))

/* U*W+ from a: its end, or a when it does not match. U* is greedy and gives
 * characters back until W+ can start: the last U that is also W. */
static size_t o200k_uw(const uint8_t *s, size_t len, size_t a) {
    size_t j = a, last_w = (size_t)-1, last_n = 0;
    while (j < len) {
        size_t n;
        uint32_t c = cls_at(s, len, j, &n);
        if (!IN_U(c)) break;
        if (IN_W(c)) last_w = j, last_n = n;
        j += n;
    }
    size_t n;
    if (j < len && IN_W(cls_at(s, len, j, &n))) {
        RUN(IN_W(c));
        return j;
    }
    return last_w == (size_t)-1 ? a : last_w + last_n;
}

/* U+W* from a: its end, or a. */
static size_t o200k_uw2(const uint8_t *s, size_t len, size_t a) {
    size_t j = a;
    RUN(IN_U(c));
    if (j == a) return a;
    RUN(IN_W(c));
    return j;
}

static size_t o200k_next(const uint8_t *s, size_t len, size_t i) {
    size_t n0;
    uint32_t c0 = cls_at(s, len, i, &n0);
    int prefix = s[i] != '\r' && s[i] != '\n' && !IS_L(c0) && !IS_N(c0);
    /* the two letter alternatives, each with then without the prefix */
    for (int alt = 0; alt < 2; alt++) {
        for (int p = prefix; p >= 0; p--) {
            size_t a = p ? i + n0 : i;
            if (a >= len) continue;
            size_t e = alt == 0 ? o200k_uw(s, len, a) : o200k_uw2(s, len, a);
            if (e > a) return e + contraction(s, len, e, 1);
        }
    }
    if (IS_N(c0)) return digit_run(s, len, i, 3);
    return punct_or_space_run(s, len, i, 1);
}

/* ---- DeepSeek-V3 ---- */

enum { SEG_OTHER, SEG_CJK, SEG_DIGIT };

static int ds_seg(uint32_t cp, uint32_t cls) {
    if ((cp >= 0x3040 && cp <= 0x30FF) || (cp >= 0x4E00 && cp <= 0x9FA5)) return SEG_CJK;
    return cp != CP_INVALID && (cls & CB_UNI_NUMBER) ? SEG_DIGIT : SEG_OTHER;
}

/* The first two rules cut the text where the segment kind changes; the third
 * rule runs inside one segment, so a character of another kind reads as the
 * end of the text (DS_END). */
#define DS_END 0x80000000u

static uint32_t ds_at(const uint8_t *s, size_t len, size_t j, int seg, size_t *n) {
    if (j >= len) {
        *n = 0;
        return DS_END;
    }
    uint32_t cp = cp_at(s, len, j, n);
    uint32_t c = cp == CP_INVALID ? 0 : cb_uni_class(cp);
    return ds_seg(cp, c) == seg ? c : DS_END;
}

#define DS_RUN(cond)                                     \
    do {                                                 \
        for (;;) {                                       \
            size_t n_;                                   \
            uint32_t c = ds_at(s, len, j, seg, &n_);     \
            if (c == DS_END || !(cond)) break;           \
            j += n_;                                     \
        }                                                \
    } while (0)

#define DS_PS(c) ((c) & (CB_UNI_PUNCT | CB_UNI_SYMBOL))
#define DS_LM(c) ((c) & (CB_UNI_LETTER | CB_UNI_MARK))

static int ascii_punct(uint8_t b) {
    return (b >= 0x21 && b <= 0x2F) || (b >= 0x3A && b <= 0x40) || (b >= 0x5B && b <= 0x60) || (b >= 0x7B && b <= 0x7E);
}

static int ascii_alpha(uint8_t b) { return (b >= 'A' && b <= 'Z') || (b >= 'a' && b <= 'z'); }

/* The third rule at i (inside segment seg): the end of its match, or i. */
static size_t ds_match(const uint8_t *s, size_t len, size_t i, int seg) {
    size_t n0, n1, j;
    uint32_t c0 = ds_at(s, len, i, seg, &n0);
    if (c0 == DS_END) return i;
    /* [!-/:-@[-`{-~][A-Za-z]+ (all ASCII, so one segment) */
    if (ascii_punct(s[i]) && i + 1 < len && ascii_alpha(s[i + 1])) {
        j = i + 1;
        while (j < len && ascii_alpha(s[j])) j++;
        return j;
    }
    /* [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ */
    uint32_t c1 = ds_at(s, len, i + n0, seg, &n1);
    if (s[i] != '\r' && s[i] != '\n' && !IS_L(c0) && !DS_PS(c0) && c1 != DS_END && DS_LM(c1)) {
        j = i + n0;
        DS_RUN(DS_LM(c));
        return j;
    }
    if (DS_LM(c0)) {
        j = i;
        DS_RUN(DS_LM(c));
        return j;
    }
    /*  ?[\p{P}\p{S}]+[\r\n]* */
    j = i;
    if (s[i] == ' ' && c1 != DS_END && DS_PS(c1)) j = i + 1;
    {
        size_t nj;
        uint32_t cj = ds_at(s, len, j, seg, &nj);
        if (cj != DS_END && DS_PS(cj)) {
            DS_RUN(DS_PS(c));
            while (seg == SEG_OTHER && j < len && (s[j] == '\r' || s[j] == '\n')) j++;
            return j;
        }
    }
    if (!IS_S(c0)) return i;
    /* \s*[\r\n]+ , \s+(?!\S), \s+ : a segment's end reads as the text's end */
    size_t end = i, last = i, last_nl = (size_t)-1;
    for (;;) {
        size_t ns;
        uint32_t c = ds_at(s, len, end, seg, &ns);
        if (c == DS_END || !IS_S(c)) break;
        if (s[end] == '\r' || s[end] == '\n') last_nl = end;
        last = end;
        end += ns;
    }
    if (last_nl != (size_t)-1) return last_nl + 1;
    size_t nx;
    if (ds_at(s, len, end, seg, &nx) != DS_END && last > i) return last;
    return end;
}

static size_t deepseek_v3_next(const uint8_t *s, size_t len, size_t i) {
    size_t n;
    uint32_t cp = cp_at(s, len, i, &n);
    int seg = ds_seg(cp, cp == CP_INVALID ? 0 : cb_uni_class(cp));
    if (seg == SEG_DIGIT) {
        size_t j = i;
        for (int d = 0; d < 3; d++) {
            size_t nd;
            if (ds_at(s, len, j, SEG_DIGIT, &nd) == DS_END) break;
            j += nd;
        }
        return j;
    }
    size_t e = ds_match(s, len, i, seg);
    if (e > i) return e;
    /* unmatched text (controls, format characters, ...) up to the next match
     * or the segment's end is one piece */
    size_t j = i + n;
    for (;;) {
        size_t nj;
        if (ds_at(s, len, j, seg, &nj) == DS_END || ds_match(s, len, j, seg) > j) return j;
        j += nj;
    }
}

size_t cb_pretok_next(int kind, const uint8_t *s, size_t len, size_t i) {
    switch (kind) {
    case CB_PRETOK_GPT2: return gpt2_next(s, len, i);
    case CB_PRETOK_LLAMA3: return llama3_next(s, len, i, 3);
    case CB_PRETOK_QWEN2: return llama3_next(s, len, i, 1);
    case CB_PRETOK_O200K: return o200k_next(s, len, i);
    case CB_PRETOK_DEEPSEEK_V3: return deepseek_v3_next(s, len, i);
    default: return len;
    }
}
