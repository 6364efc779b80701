/* Unicode NFC (canonical decomposition, canonical ordering, canonical
 * composition; UAX #15) over the generated tables, for tokenizers whose
 * normaliser is NFC (Qwen2/3, OLMo). Bytes that are not UTF-8 pass through. */
#include "unicode_nfc.h"

#include "unicode_tables.h"

#define RAW_BYTE 0x80000000u /* a byte that is not UTF-8, kept as it is */
enum { S_BASE = 0xAC00, L_BASE = 0x1100, V_BASE = 0x1161, T_BASE = 0x11A7, L_COUNT = 19, V_COUNT = 21,
       T_COUNT = 28, N_COUNT = V_COUNT * T_COUNT, S_COUNT = L_COUNT * N_COUNT };

static uint32_t decode(const uint8_t *s, size_t len, size_t i, size_t *n) {
    uint8_t c = s[i];
    int need = c < 0x80 ? 0 : c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2 : c >= 0xF0 && c <= 0xF4 ? 3 : -1;
    uint32_t cp = need == 0 ? c : need == 1 ? c & 0x1Fu : need == 2 ? c & 0x0Fu : c & 0x07u;
    static const uint32_t min[4] = {0, 0x80, 0x800, 0x10000};
    if (need < 0 || i + (size_t)need >= len + (need == 0)) goto raw;
    for (int k = 1; k <= need; k++) {
        if ((s[i + k] & 0xC0) != 0x80) goto raw;
        cp = cp << 6 | (s[i + k] & 0x3Fu);
    }
    if (cp < min[need] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) goto raw;
    *n = (size_t)need + 1;
    return cp;
raw:
    *n = 1;
    return RAW_BYTE | c;
}

int cb_nfc_needed(const uint8_t *s, size_t len) {
    for (size_t i = 0; i < len;) {
        if (s[i] < 0xCC) { /* below U+0300: NFC never changes these (generator checks) */
            i++;
            continue;
        }
        size_t n;
        uint32_t cp = decode(s, len, i, &n);
        if (!(cp & RAW_BYTE) && !(cb_uni_class(cp) & CB_UNI_NFC_INERT)) return 1;
        i += n;
    }
    return 0;
}

static uint32_t ccc(uint32_t cp) {
    if (cp < 0x300 || (cp & RAW_BYTE)) return 0;
    int lo = 0, hi = cb_uni_n_ccc - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < cb_uni_ccc_table[mid].cp) hi = mid - 1;
        else if (cp > cb_uni_ccc_table[mid].cp) lo = mid + 1;
        else return cb_uni_ccc_table[mid].ccc;
    }
    return 0;
}

static const cb_uni_decomp *find_decomp(uint32_t cp) {
    int lo = 0, hi = cb_uni_n_decomp - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < cb_uni_decomp_table[mid].cp) hi = mid - 1;
        else if (cp > cb_uni_decomp_table[mid].cp) lo = mid + 1;
        else return &cb_uni_decomp_table[mid];
    }
    return 0;
}

static uint32_t compose(uint32_t a, uint32_t b) {
    if (a >= L_BASE && a < L_BASE + L_COUNT && b >= V_BASE && b < V_BASE + V_COUNT)
        return S_BASE + ((a - L_BASE) * V_COUNT + (b - V_BASE)) * T_COUNT;
    if (a >= S_BASE && a < S_BASE + S_COUNT && (a - S_BASE) % T_COUNT == 0 && b > T_BASE && b < T_BASE + T_COUNT)
        return a + (b - T_BASE);
    int lo = 0, hi = cb_uni_n_comp - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const cb_uni_comp *c = &cb_uni_comp_table[mid];
        if (a < c->first || (a == c->first && b < c->second)) hi = mid - 1;
        else if (a > c->first || b > c->second) lo = mid + 1;
        else return c->composite;
    }
    return 0;
}

static size_t put_utf8(uint32_t cp, uint8_t *out) {
    if (cp & RAW_BYTE) return out[0] = (uint8_t)cp, 1;
    if (cp < 0x80) return out[0] = (uint8_t)cp, 1;
    if (cp < 0x800) return out[0] = (uint8_t)(0xC0 | cp >> 6), out[1] = (uint8_t)(0x80 | (cp & 0x3F)), 2;
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | cp >> 12), out[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | cp >> 18), out[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F)), out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

long cb_nfc(const uint8_t *s, size_t len, uint32_t *cps, size_t cap, uint8_t *out, size_t out_cap) {
    size_t n = 0;
    /* 1. Full canonical decomposition. */
    for (size_t i = 0; i < len;) {
        size_t k;
        uint32_t cp = decode(s, len, i, &k);
        i += k;
        if (n + 4 > cap) return -1;
        if (cp >= S_BASE && cp < S_BASE + S_COUNT) {
            uint32_t si = cp - S_BASE;
            cps[n++] = L_BASE + si / N_COUNT;
            cps[n++] = V_BASE + (si % N_COUNT) / T_COUNT;
            if (si % T_COUNT) cps[n++] = T_BASE + si % T_COUNT;
            continue;
        }
        const cb_uni_decomp *d = cp >= 0xC0 && !(cp & RAW_BYTE) ? find_decomp(cp) : 0;
        if (!d) {
            cps[n++] = cp;
            continue;
        }
        if (n + d->len > cap) return -1;
        for (uint32_t j = 0; j < d->len; j++) cps[n++] = cb_uni_decomp_pool[d->offset + j];
    }
    /* 2. Canonical ordering: marks between starters sorted by class, stably. */
    for (size_t i = 1; i < n; i++) {
        uint32_t c = ccc(cps[i]);
        if (c == 0) continue;
        size_t j = i;
        uint32_t cp = cps[i];
        while (j > 0 && ccc(cps[j - 1]) > c) {
            cps[j] = cps[j - 1];
            j--;
        }
        cps[j] = cp;
    }
    /* 3. Canonical composition with the last starter, unless blocked. */
    size_t w = 0;
    long starter = -1;
    int last = -1; /* class of the last kept character after the starter; -1: none */
    for (size_t i = 0; i < n; i++) {
        uint32_t cp = cps[i], c = ccc(cp);
        if (starter >= 0 && (last == -1 || (last != 0 && (uint32_t)last < c))) {
            uint32_t comp = compose(cps[starter], cp);
            if (comp) {
                cps[starter] = comp;
                continue;
            }
        }
        if (c == 0) {
            starter = (long)w;
            last = -1;
        } else {
            last = (int)c;
        }
        cps[w++] = cp;
    }
    size_t bytes = 0;
    for (size_t i = 0; i < w; i++) {
        if (bytes + 4 > out_cap) return -1;
        bytes += put_utf8(cps[i], out + bytes);
    }
    return (long)bytes;
}
