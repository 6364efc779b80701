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
 *   DeepSeek LLM (deepseek-llm: DeepSeek-V2, V2-Lite, Coder-V2): six Split
 *   rules in sequence, each on the pieces of the one before: [\r\n],
 *   \s?[L2]+ (L2: the Latin, Greek, Cyrillic, ... letters listed in
 *   DL_LETTERS), \s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}
 *   \x{3000}-\x{3002}]+, \s+$, [\x{0800}-\x{9FA5}\x{AC00}-\x{D7FF}]+, \p{N}+
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


/* ---- DeepSeek LLM ---- */

/* Its second rule's letters, as written in the tokenizer (ranges merged). */
static const uint32_t DL_LETTERS[][2] = {
    {0x0041, 0x005A}, {0x0061, 0x007A}, {0x00B5, 0x00B5}, {0x00C0, 0x00D6}, {0x00D8, 0x00F6}, {0x00F8, 0x01BA},
    {0x01BC, 0x01BF}, {0x01C4, 0x0293}, {0x0295, 0x02AF}, {0x0370, 0x0373}, {0x0376, 0x0377}, {0x037B, 0x037D},
    {0x037F, 0x037F}, {0x0386, 0x0386}, {0x0388, 0x038A}, {0x038C, 0x038C}, {0x038E, 0x03A1}, {0x03A3, 0x03F5},
    {0x03F7, 0x0481}, {0x048A, 0x052F}, {0x0531, 0x0556}, {0x10A0, 0x10C5}, {0x13A0, 0x13F5}, {0x13F8, 0x13FD},
    {0x1C90, 0x1CBA}, {0x1CBD, 0x1CBF}, {0x1D00, 0x1D2B}, {0x1D6B, 0x1D77}, {0x1D79, 0x1D9A}, {0x1E00, 0x1F15},
    {0x1F18, 0x1F1D}, {0x1F20, 0x1F45}, {0x1F48, 0x1F4D}, {0x1F50, 0x1F57}, {0x1F59, 0x1F59}, {0x1F5B, 0x1F5B},
    {0x1F5D, 0x1F5D}, {0x1F5F, 0x1F7D}, {0x1F80, 0x1FB4}, {0x1FB6, 0x1FBC}, {0x1FBE, 0x1FBE}, {0x1FC2, 0x1FC4},
    {0x1FC6, 0x1FCC}, {0x1FD0, 0x1FD3}, {0x1FD6, 0x1FDB}, {0x1FE0, 0x1FEC}, {0x1FF2, 0x1FF4}, {0x1FF6, 0x1FFC},
    {0x2102, 0x2102}, {0x2107, 0x2107}, {0x210A, 0x2113}, {0x2115, 0x2115}, {0x2119, 0x211D}, {0x2124, 0x2124},
    {0x2126, 0x2126}, {0x2128, 0x2128}, {0x212A, 0x212D}, {0x212F, 0x2134}, {0x2139, 0x2139}, {0x213C, 0x213F},
    {0x2145, 0x2149}, {0x214E, 0x214E}, {0x2183, 0x2184}, {0x2C00, 0x2C7B}, {0x2C7E, 0x2CE4}, {0x2CEB, 0x2CEE},
    {0x2CF2, 0x2CF3}, {0xA640, 0xA66D}, {0xA680, 0xA69B}, {0xA722, 0xA76F}, {0xA771, 0xA787}, {0xA78B, 0xA78E},
    {0xAB70, 0xABBF}, {0xFB00, 0xFB06}, {0xFB13, 0xFB17}, {0xFF21, 0xFF3A}, {0xFF41, 0xFF5A}, {0x10400, 0x1044F},
    {0x104B0, 0x104D3}, {0x104D8, 0x104FB}, {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF},
    {0x1E900, 0x1E943},
};

enum { DL_NL = 1, DL_S = 2, DL_L2 = 4, DL_P3 = 8, DL_CJK = 16, DL_N = 32 };

static int dl_letter(uint32_t cp) {
    size_t lo = 0, hi = sizeof DL_LETTERS / sizeof DL_LETTERS[0];
    while (lo < hi) {
        const size_t mid = (lo + hi) / 2;
        if (cp < DL_LETTERS[mid][0]) hi = mid;
        else if (cp > DL_LETTERS[mid][1]) lo = mid + 1;
        else return 1;
    }
    return 0;
}

/* The classes the six rules read of the character at i (0 past the end). */
static unsigned dl_flags(const uint8_t *s, size_t len, size_t i, size_t *n) {
    if (i >= len) {
        *n = 0;
        return 0;
    }
    const uint32_t cp = cp_at(s, len, i, n);
    if (cp == CP_INVALID) return 0;
    const uint32_t c = cb_uni_class(cp);
    unsigned f = (IS_S(c) ? DL_S : 0) | (IS_N(c) ? DL_N : 0);
    if (cp == '\r' || cp == '\n') f |= DL_NL;
    if (dl_letter(cp)) f |= DL_L2;
    if ((cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x7E) || (cp >= 0xFF01 && cp <= 0xFF0F) ||
        (cp >= 0xFF1A && cp <= 0xFF5E) || (cp >= 0x2018 && cp <= 0x201F) || (cp >= 0x3000 && cp <= 0x3002))
        f |= DL_P3;
    if ((cp >= 0x0800 && cp <= 0x9FA5) || (cp >= 0xAC00 && cp <= 0xD7FF)) f |= DL_CJK;
    return f;
}

/* Whether the pieces of rules 1..r split between characters a and b (c, d
 * follow b). Every rule isolates its matches, so a piece boundary is one
 * of an earlier rule or a start or end of this rule's match inside an
 * earlier piece; rules 2 and 3 (\s?[X]+) match a run of X and the one space
 * right before it, if that space is in the same piece. */
static int dl_split1(unsigned a, unsigned b) { return ((a | b) & DL_NL) != 0; }

static int dl_split_run(unsigned a, unsigned b, unsigned c, unsigned x, int earlier_ab, int earlier_bc) {
    if (earlier_ab) return 1;
    if ((a & x) && !(b & x)) return 1;                     /* a run ends */
    if ((b & x) && !(a & x) && !(a & DL_S)) return 1;      /* a run starts with no space before it */
    return (b & DL_S) && !(b & x) && (c & x) && !earlier_bc; /* a space starts a match */
}

static int dl_split2(unsigned a, unsigned b, unsigned c) {
    return dl_split_run(a, b, c, DL_L2, dl_split1(a, b), dl_split1(b, c));
}

static int dl_split3(unsigned a, unsigned b, unsigned c, unsigned d) {
    return dl_split_run(a, b, c, DL_P3, dl_split2(a, b, c), dl_split2(b, c, d));
}

/* Four characters in a row: flags f[k] of the one at pos[k] (0 past the
 * end), pos[k + 1] where the next starts. */
typedef struct {
    unsigned f[4];
    size_t pos[5];
} dl_window;

static void dl_open(dl_window *w, const uint8_t *s, size_t len, size_t i) {
    w->pos[0] = i;
    for (int k = 0; k < 4; k++) {
        size_t n;
        w->f[k] = dl_flags(s, len, w->pos[k], &n);
        w->pos[k + 1] = w->pos[k] + n;
    }
}

static void dl_step(dl_window *w, const uint8_t *s, size_t len) {
    for (int k = 0; k < 3; k++) w->f[k] = w->f[k + 1], w->pos[k] = w->pos[k + 1];
    w->pos[3] = w->pos[4];
    size_t n;
    w->f[3] = dl_flags(s, len, w->pos[3], &n);
    w->pos[4] = w->pos[3] + n;
}

static int dl_split3_at(const dl_window *w) { return dl_split3(w->f[0], w->f[1], w->f[2], w->f[3]); }

/* Rule 4 (\s+$) at the space w->f[1]: whether the spaces from it run to
 * the end of its rule-3 piece. */
static int dl_trailing_spaces(dl_window w, const uint8_t *s, size_t len) {
    for (dl_step(&w, s, len);; dl_step(&w, s, len)) {
        if (w.pos[1] >= len || dl_split3_at(&w)) return 1;
        if (!(w.f[1] & DL_S)) return 0;
    }
}

static size_t deepseek_llm_next(const uint8_t *s, size_t len, size_t i) {
    dl_window w;
    for (dl_open(&w, s, len, i); w.pos[1] < len; dl_step(&w, s, len)) {
        const unsigned a = w.f[0], b = w.f[1];
        if (dl_split3_at(&w)) return w.pos[1];
        if ((b & DL_S) && !(a & DL_S) && dl_trailing_spaces(w, s, len)) return w.pos[1]; /* rule 4 */
        if ((a ^ b) & (DL_CJK | DL_N)) return w.pos[1];                                   /* rules 5, 6 */
    }
    return len;
}

size_t cb_pretok_next(int kind, const uint8_t *s, size_t len, size_t i) {
    switch (kind) {
    case CB_PRETOK_GPT2: return gpt2_next(s, len, i);
    case CB_PRETOK_LLAMA3: return llama3_next(s, len, i, 3);
    case CB_PRETOK_QWEN2: return llama3_next(s, len, i, 1);
    case CB_PRETOK_O200K: return o200k_next(s, len, i);
    case CB_PRETOK_DEEPSEEK_V3: return deepseek_v3_next(s, len, i);
    case CB_PRETOK_DEEPSEEK_LLM: return deepseek_llm_next(s, len, i);
    default: return len;
    }
}
