/* Loading tokenizer.cbt, encoding (added tokens, pre-tokens, BPE merges)
 * and decoding. BPE follows HF tokenizers' Word::merge_all: the pair of
 * lowest rank merges first, ties to the leftmost, through a heap, so a word
 * of n symbols costs O(n log n). SentencePiece BPE is the same loop with
 * ranks ordered by the merged piece's score (toolkit/tokenizer.py). */
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja.h"
#include "pretok.h"
#include "unicode_nfc.h"

#define DEAD 0xFFFFFFFEu
#define MAX_SYMS (CB_TOK_MAX_WORD + 1)
#define META "\xE2\x96\x81" /* U+2581, SentencePiece's space */

struct cb_tok_work {
    uint32_t *id, *start;   /* [MAX_SYMS + 1] symbol token (or CB_NO_TOKEN) and first byte */
    int32_t *prev, *next;   /* [MAX_SYMS] linked list of live symbols */
    uint64_t *heap;         /* [3 * MAX_SYMS] (rank << 32 | position) */
    uint8_t *word;          /* [3 * CB_TOK_MAX_WORD + 3] the word as the model sees it */
    uint32_t *nfc_cps;      /* [CB_TOK_MAX_NFC] code points being normalised */
    uint8_t *nfc;           /* [4 * CB_TOK_MAX_NFC] the normalised chunk */
};

/* ---- loading ---- */

static uint32_t hash_bytes(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

static uint32_t hash_pair(uint32_t a, uint32_t b) {
    uint64_t x = ((uint64_t)a << 32 | b) * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(x >> 32);
}

static uint32_t table_size(uint32_t n) {
    uint32_t size = 16;
    while (size < 2 * n) size <<= 1;
    return size;
}

static uint32_t lookup_text(const cb_tokenizer *t, const char *s, size_t n) {
    for (uint32_t h = hash_bytes(s, n) & t->str_mask;; h = (h + 1) & t->str_mask) {
        uint32_t id = t->str_table[h];
        if (id == CB_NO_TOKEN) return CB_NO_TOKEN;
        if (t->enc_off[id + 1] - t->enc_off[id] == n && !memcmp(t->enc + t->enc_off[id], s, n)) return id;
    }
}

static const cb_tok_merge *lookup_merge(const cb_tokenizer *t, uint32_t a, uint32_t b) {
    for (uint32_t h = hash_pair(a, b) & t->merge_mask;; h = (h + 1) & t->merge_mask) {
        uint32_t m = t->merge_table[h];
        if (m == CB_NO_TOKEN) return NULL;
        if (t->merges[m].left == a && t->merges[m].right == b) return &t->merges[m];
    }
}

typedef struct {
    const uint8_t *p;
    size_t left;
} reader;

static const void *take(reader *r, size_t n) {
    size_t padded = (n + 3) & ~(size_t)3;
    if (padded > r->left) return NULL;
    const void *p = r->p;
    r->p += padded;
    r->left -= padded;
    return p;
}

/* Offsets [n+1] and their text; checks the offsets are monotonic. */
static int take_strings(reader *r, uint32_t n, const uint32_t **off, const char **text) {
    *off = take(r, ((size_t)n + 1) * 4);
    if (!*off || (*off)[0] != 0) return -1;
    for (uint32_t i = 0; i < n; i++)
        if ((*off)[i + 1] < (*off)[i]) return -1;
    *text = take(r, (*off)[n]);
    return *text ? 0 : -1;
}

typedef struct {
    uint32_t key, id, flags;
} added_sort;

static int cmp_added(const void *a, const void *b) {
    uint32_t x = ((const added_sort *)a)->key, y = ((const added_sort *)b)->key;
    return x < y ? -1 : x > y;
}

static int fail(char *err, size_t err_len, const char *path, const char *why) {
    snprintf(err, err_len, "%s: %s", path, why);
    return -1;
}

static int parse(cb_tokenizer *t, const char *path, size_t size, char *err, size_t err_len) {
    reader r = {t->file, size};
    const cb_tok_file_header *h = take(&r, sizeof *h);
    if (!h || memcmp(h->magic, CB_TOK_MAGIC, 8) != 0)
        return fail(err, err_len, path, "not a Colibri tokenizer file (bad magic)");
    if (h->version != CB_TOK_VERSION) {
        snprintf(err, err_len, "%s: version %u, this engine reads version %d (re-run colibri-build tokenizer)",
                 path, h->version, CB_TOK_VERSION);
        return -1;
    }
    if ((h->kind != CB_TOKENIZER_BPE && h->kind != CB_TOKENIZER_SPM) || h->pretok > CB_PRETOK_DEEPSEEK_LLM)
        return fail(err, err_len, path, "unknown tokenizer kind or pre-tokenizer");
    if (h->n_tokens == 0 || h->n_chat > 1)
        return fail(err, err_len, path, "bad token or chat string count");
    t->kind = h->kind, t->pretok = h->pretok, t->flags = h->flags;
    t->n_tokens = h->n_tokens, t->n_merges = h->n_merges, t->n_added = h->n_added, t->n_chat = h->n_chat;
    t->bos_id = h->bos_id, t->eos_id = h->eos_id, t->unk_id = h->unk_id, t->add_bos = h->add_bos;
    t->eot_id = h->eot_id;
    memcpy(t->byte_ids, h->byte_ids, sizeof t->byte_ids);
    const uint32_t *chat_off;
    const char *chat;
    const cb_tok_added *added;
    if (take_strings(&r, t->n_tokens, &t->enc_off, &t->enc) || take_strings(&r, t->n_tokens, &t->dec_off, &t->dec) ||
        !(t->attr = take(&r, t->n_tokens)) ||
        !(t->merges = take(&r, (size_t)t->n_merges * sizeof(cb_tok_merge))) ||
        !(added = take(&r, (size_t)t->n_added * sizeof(cb_tok_added))) || take_strings(&r, t->n_chat, &chat_off, &chat))
        return fail(err, err_len, path, "truncated or corrupt section");
    for (uint32_t i = 0; i < t->n_chat; i++) {
        t->chat[i] = chat + chat_off[i];
        t->chat_len[i] = chat_off[i + 1] - chat_off[i];
    }
    if (t->n_chat == 1) { /* parsed once here: a template this engine cannot run is refused at start */
        char why[256];
        t->chat_tpl = cb_jinja_parse(t->chat[0], t->chat_len[0], why, sizeof why);
        if (!t->chat_tpl) {
            snprintf(err, err_len, "%s: chat template %s", path, why);
            return -1;
        }
    }
    uint32_t ids[4] = {t->bos_id, t->eos_id, t->unk_id, t->eot_id};
    for (int i = 0; i < 4; i++)
        if (ids[i] != CB_NO_TOKEN && ids[i] >= t->n_tokens) return fail(err, err_len, path, "special id out of range");
    for (int b = 0; b < 256; b++)
        if (t->byte_ids[b] != CB_NO_TOKEN && t->byte_ids[b] >= t->n_tokens)
            return fail(err, err_len, path, "byte token out of range");
    for (uint32_t m = 0; m < t->n_merges; m++) {
        const cb_tok_merge *g = &t->merges[m];
        if (g->left >= t->n_tokens || g->right >= t->n_tokens || g->result >= t->n_tokens)
            return fail(err, err_len, path, "merge refers to a token out of range");
    }

    /* Hash tables and the sorted added tokens: the only allocations. */
    t->str_mask = table_size(t->n_tokens) - 1;
    t->merge_mask = table_size(t->n_merges) - 1;
    t->str_table = malloc(sizeof(uint32_t) * (t->str_mask + 1));
    t->merge_table = malloc(sizeof(uint32_t) * (t->merge_mask + 1));
    added_sort *sorted = malloc(sizeof(added_sort) * (t->n_added + 1));
    if (!t->str_table || !t->merge_table || !sorted) {
        free(sorted);
        return fail(err, err_len, path, "out of memory");
    }
    memset(t->str_table, 0xFF, sizeof(uint32_t) * (t->str_mask + 1));
    memset(t->merge_table, 0xFF, sizeof(uint32_t) * (t->merge_mask + 1));
    for (uint32_t id = 0; id < t->n_tokens; id++) {
        if (t->attr[id] != CB_TOKA_NORMAL) continue;
        const char *s = t->enc + t->enc_off[id];
        size_t n = t->enc_off[id + 1] - t->enc_off[id];
        if (lookup_text(t, s, n) != CB_NO_TOKEN) continue; /* the lowest id of duplicates wins */
        uint32_t h = hash_bytes(s, n) & t->str_mask;
        while (t->str_table[h] != CB_NO_TOKEN) h = (h + 1) & t->str_mask;
        t->str_table[h] = id;
    }
    for (uint32_t m = 0; m < t->n_merges; m++) {
        const cb_tok_merge *g = &t->merges[m];
        if (lookup_merge(t, g->left, g->right)) continue; /* first of duplicates wins */
        uint32_t h = hash_pair(g->left, g->right) & t->merge_mask;
        while (t->merge_table[h] != CB_NO_TOKEN) h = (h + 1) & t->merge_mask;
        t->merge_table[h] = m;
    }
    for (uint32_t i = 0; i < t->n_added; i++) {
        uint32_t id = added[i].id;
        uint32_t n = id < t->n_tokens ? t->enc_off[id + 1] - t->enc_off[id] : 0;
        if (n == 0 || n > 0xFFFFFF) {
            free(sorted);
            return fail(err, err_len, path, "added token out of range or empty");
        }
        sorted[i] = (added_sort){(uint32_t)(uint8_t)t->enc[t->enc_off[id]] << 24 | (0xFFFFFF - n), id, added[i].flags};
    }
    qsort(sorted, t->n_added, sizeof *sorted, cmp_added);
    cb_tok_added *own = (cb_tok_added *)sorted; /* compacted in place: 8 bytes from 12 */
    for (uint32_t i = 0; i < t->n_added; i++) own[i] = (cb_tok_added){sorted[i].id, sorted[i].flags};
    t->added = own;
    uint32_t i = 0;
    for (int b = 0; b <= 256; b++) {
        while (i < t->n_added && (uint8_t)t->enc[t->enc_off[own[i].id]] < b) i++;
        t->added_start[b] = b == 256 ? t->n_added : i;
    }
    return 0;
}

static int alloc_work(cb_tokenizer *t) {
    cb_tok_work *w = calloc(1, sizeof *w);
    if (!w) return -1;
    t->work = w;
    w->id = malloc(sizeof(uint32_t) * (MAX_SYMS + 1));
    w->start = malloc(sizeof(uint32_t) * (MAX_SYMS + 1));
    w->prev = malloc(sizeof(int32_t) * MAX_SYMS);
    w->next = malloc(sizeof(int32_t) * MAX_SYMS);
    w->heap = malloc(sizeof(uint64_t) * 3 * MAX_SYMS);
    w->word = malloc(3 * CB_TOK_MAX_WORD + 3);
    if (t->flags & CB_TOKF_NFC) {
        w->nfc_cps = malloc(sizeof(uint32_t) * CB_TOK_MAX_NFC);
        w->nfc = malloc(4 * (size_t)CB_TOK_MAX_NFC);
        if (!w->nfc_cps || !w->nfc) return -1;
    }
    return w->id && w->start && w->prev && w->next && w->heap && w->word ? 0 : -1;
}

/* t->file holds size bytes: parse them and allocate the encoder's buffers. */
static int finish_load(cb_tokenizer *t, const char *path, size_t size, char *err, size_t err_len) {
    if (parse(t, path, size, err, err_len) != 0) {
        cb_tokenizer_close(t);
        return -1;
    }
    if (alloc_work(t) != 0) {
        cb_tokenizer_close(t);
        return fail(err, err_len, path, "out of memory for the encoder's buffers");
    }
    t->vocab = t->n_tokens;
    t->info.kind = t->kind;
    t->info.bos_id = t->bos_id;
    t->info.eos_id = t->eos_id;
    t->info.role_system = t->info.role_user = t->info.role_assistant = t->info.end_of_turn = CB_NO_TOKEN;
    return 0;
}

int cb_tokenizer_load(cb_tokenizer *t, const char *path, char *err, size_t err_len) {
    memset(t, 0, sizeof *t);
    FILE *f = fopen(path, "rb");
    if (!f) return fail(err, err_len, path, "cannot open (write it with colibri-build tokenizer)");
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
    if (size < (long)sizeof(cb_tok_file_header) || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return fail(err, err_len, path, "too short to be a tokenizer file");
    }
    t->file = malloc((size_t)size);
    int ok = t->file && fread(t->file, 1, (size_t)size, f) == (size_t)size;
    fclose(f);
    if (!ok) {
        cb_tokenizer_close(t);
        return fail(err, err_len, path, "cannot read");
    }
    return finish_load(t, path, (size_t)size, err, err_len);
}

int cb_tokenizer_load_bytes(cb_tokenizer *t, const void *bytes, size_t size, const char *label, char *err,
                            size_t err_len) {
    memset(t, 0, sizeof *t);
    if (size < sizeof(cb_tok_file_header)) return fail(err, err_len, label, "too short to be a tokenizer file");
    t->file = malloc(size); /* a copy: the tables parse() builds point into it */
    if (!t->file) return fail(err, err_len, label, "out of memory for its copy");
    memcpy(t->file, bytes, size);
    return finish_load(t, label, size, err, err_len);
}

void cb_tokenizer_init(cb_tokenizer *t, const cb_tok_info *info, uint32_t vocab) {
    memset(t, 0, sizeof *t);
    t->info = *info;
    t->vocab = vocab;
    t->kind = CB_TOKENIZER_BYTES;
    t->n_tokens = vocab;
    t->bos_id = info->bos_id;
    t->eos_id = info->eos_id;
    t->eot_id = info->end_of_turn;
    t->unk_id = CB_NO_TOKEN;
}

/* A loaded tokenizer against what the weights header says it is. */
static int check_against(cb_tokenizer *t, const char *path, const cb_tok_info *info, uint32_t vocab, char *err,
                         size_t err_len) {
    if (t->kind != info->kind || t->n_tokens > vocab) {
        snprintf(err, err_len, "%s: %u tokens of kind %u, but the weights expect at most %u of kind %u", path,
                 t->n_tokens, t->kind, vocab, info->kind);
        cb_tokenizer_close(t);
        return -1;
    }
    t->info = *info;
    t->vocab = vocab;
    return 0;
}

/* The byte tokenizer (or none) needs no file. */
static int builtin(cb_tokenizer *t, const cb_tok_info *info, uint32_t vocab) {
    if (info->kind != CB_TOKENIZER_BYTES && info->kind != CB_TOKENIZER_NONE) return 0;
    cb_tokenizer_init(t, info, vocab);
    t->kind = info->kind;
    return 1;
}

int cb_tokenizer_open(cb_tokenizer *t, const char *model_dir, const cb_tok_info *info, uint32_t vocab,
                      char *err, size_t err_len) {
    if (builtin(t, info, vocab)) return 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.cbt", model_dir);
    if (cb_tokenizer_load(t, path, err, err_len) != 0) return -1;
    return check_against(t, path, info, vocab, err, err_len);
}

int cb_tokenizer_open_bytes(cb_tokenizer *t, const void *bytes, size_t size, const char *label,
                            const cb_tok_info *info, uint32_t vocab, char *err, size_t err_len) {
    if (builtin(t, info, vocab)) return 0;
    if (!bytes) {
        snprintf(err, err_len, "%s: the weights name a tokenizer of kind %u, but no tokenizer.cbt is there", label,
                 info->kind);
        return -1;
    }
    if (cb_tokenizer_load_bytes(t, bytes, size, label, err, err_len) != 0) return -1;
    return check_against(t, label, info, vocab, err, err_len);
}

void cb_tokenizer_close(cb_tokenizer *t) {
    cb_jinja_free(t->chat_tpl);
    t->chat_tpl = NULL;
    if (t->work) {
        free(t->work->id);
        free(t->work->start);
        free(t->work->prev);
        free(t->work->next);
        free(t->work->heap);
        free(t->work->word);
        free(t->work->nfc_cps);
        free(t->work->nfc);
        free(t->work);
    }
    free(t->str_table);
    free(t->merge_table);
    free((void *)t->added);
    free(t->file);
    memset(t, 0, sizeof *t);
}

uint32_t cb_tokenizer_size(const cb_tokenizer *t) { return t->n_tokens; }

/* ---- encoding ---- */

static void heap_push(uint64_t *heap, int *n, uint64_t v) {
    int i = (*n)++;
    while (i > 0) {
        int parent = (i - 1) / 2;
        if (heap[parent] <= v) break;
        heap[i] = heap[parent];
        i = parent;
    }
    heap[i] = v;
}

static uint64_t heap_pop(uint64_t *heap, int *n) {
    uint64_t top = heap[0], v = heap[--(*n)];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap[c + 1] < heap[c]) c++;
        if (v <= heap[c]) break;
        heap[i] = heap[c];
        i = c;
    }
    heap[i] = v;
    return top;
}

static void push_pair(const cb_tokenizer *t, cb_tok_work *w, int *n_heap, int32_t pos) {
    int32_t nx = w->next[pos];
    if (nx < 0) return;
    const cb_tok_merge *m = lookup_merge(t, w->id[pos], w->id[nx]);
    if (m) heap_push(w->heap, n_heap, (uint64_t)m->rank << 32 | (uint32_t)pos);
}

typedef struct {
    int32_t *out;
    int cap, n;
} sink;

static int emit(sink *o, uint32_t id) {
    if (o->n >= o->cap) return -1;
    o->out[o->n++] = (int32_t)id;
    return 0;
}

/* Length of the UTF-8 character at s[i] (1 for an invalid byte). */
static size_t char_len(const uint8_t *s, size_t len, size_t i) {
    uint8_t c = s[i];
    size_t n = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 1;
    if (i + n > len) return 1;
    for (size_t k = 1; k < n; k++)
        if ((s[i + k] & 0xC0) != 0x80) return 1;
    return n;
}

/* Merges one word (w->word[0..n)) and emits its tokens. */
static int encode_word(const cb_tokenizer *t, size_t n, sink *o) {
    cb_tok_work *w = t->work;
    const uint8_t *s = w->word;
    if (n == 0) return 0;
    if (t->flags & CB_TOKF_IGNORE_MERGES) {
        uint32_t id = lookup_text(t, (const char *)s, n);
        if (id != CB_NO_TOKEN) return emit(o, id);
    }
    int32_t count = 0;
    for (size_t i = 0; i < n;) {
        size_t k = t->kind == CB_TOKENIZER_BPE ? 1 : char_len(s, n, i);
        w->id[count] = k == 1 && t->kind == CB_TOKENIZER_BPE ? t->byte_ids[s[i]] : lookup_text(t, (const char *)s + i, k);
        w->start[count] = (uint32_t)i;
        w->prev[count] = count - 1;
        w->next[count] = count + 1;
        count++;
        i += k;
    }
    w->start[count] = (uint32_t)n;
    w->next[count - 1] = -1;
    int n_heap = 0;
    for (int32_t i = 0; i + 1 < count; i++) push_pair(t, w, &n_heap, i);
    while (n_heap > 0) {
        uint64_t top = heap_pop(w->heap, &n_heap);
        uint32_t rank = (uint32_t)(top >> 32);
        int32_t pos = (int32_t)(uint32_t)top, nx = w->next[pos];
        if (w->id[pos] == DEAD || nx < 0) continue;
        const cb_tok_merge *m = lookup_merge(t, w->id[pos], w->id[nx]);
        if (!m || m->rank != rank) continue; /* stale: the pair changed since it was pushed */
        w->id[pos] = m->result;
        w->id[nx] = DEAD;
        w->next[pos] = w->next[nx];
        if (w->next[pos] >= 0) w->prev[w->next[pos]] = pos;
        if (w->prev[pos] >= 0) push_pair(t, w, &n_heap, w->prev[pos]);
        push_pair(t, w, &n_heap, pos);
    }
    for (int32_t i = 0; i >= 0; i = w->next[i]) {
        if (w->id[i] != CB_NO_TOKEN) {
            if (emit(o, w->id[i])) return -1;
            continue;
        }
        /* An unknown character: its bytes as <0xXX> tokens, else <unk>. */
        uint32_t end = w->next[i] >= 0 ? w->start[w->next[i]] : (uint32_t)n;
        if (!(t->flags & CB_TOKF_BYTE_FALLBACK)) {
            if (t->unk_id != CB_NO_TOKEN && emit(o, t->unk_id)) return -1;
            continue;
        }
        for (uint32_t b = w->start[i]; b < end; b++) {
            uint32_t id = t->byte_ids[s[b]] != CB_NO_TOKEN ? t->byte_ids[s[b]] : t->unk_id;
            if (id != CB_NO_TOKEN && emit(o, id)) return -1;
        }
    }
    return 0;
}

static int word_too_long(char *err, size_t err_len) {
    snprintf(err, err_len, "the text holds a word (pre-token) longer than %u bytes", CB_TOK_MAX_WORD);
    return -2;
}

static int encode_chunk(const cb_tokenizer *t, const uint8_t *s, size_t len, sink *o, char *err, size_t err_len) {
    cb_tok_work *w = t->work;
    if ((t->flags & CB_TOKF_NFC) && cb_nfc_needed(s, len)) {
        long n = cb_nfc(s, len, w->nfc_cps, CB_TOK_MAX_NFC, w->nfc, 4 * (size_t)CB_TOK_MAX_NFC);
        if (n < 0) {
            snprintf(err, err_len, "more than %u characters that need Unicode normalisation (NFC) in one run",
                     CB_TOK_MAX_NFC);
            return -2;
        }
        s = w->nfc;
        len = (size_t)n;
    }
    if (t->kind == CB_TOKENIZER_BPE) {
        for (size_t i = 0; i < len;) {
            size_t end = t->pretok == CB_PRETOK_NONE ? len : cb_pretok_next((int)t->pretok, s, len, i);
            if (end - i > CB_TOK_MAX_WORD) return word_too_long(err, err_len);
            memcpy(w->word, s + i, end - i);
            if (encode_word(t, end - i, o)) return -1;
            i = end;
        }
        return 0;
    }
    /* SentencePiece: spaces become U+2581, the chunk starts with one; words
     * start at a space that follows another character. */
    int first = 1;
    for (size_t i = 0; i < len;) {
        size_t end = len;
        if (t->flags & CB_TOKF_SPLIT_WORDS) {
            end = i;
            while (end < len && s[end] == ' ') end++;
            while (end < len && s[end] != ' ') end++;
        }
        if (end - i > CB_TOK_MAX_WORD) return word_too_long(err, err_len);
        size_t n = 0;
        if (first && (t->flags & CB_TOKF_DUMMY_PREFIX)) memcpy(w->word, META, 3), n = 3;
        for (size_t k = i; k < end; k++) {
            if (s[k] == ' ') memcpy(w->word + n, META, 3), n += 3;
            else w->word[n++] = s[k];
        }
        if (encode_word(t, n, o)) return -1;
        first = 0;
        i = end;
    }
    return 0;
}

/* The longest added token at s[i], or NULL. */
static const cb_tok_added *added_at(const cb_tokenizer *t, const uint8_t *s, size_t len, size_t i, int special,
                                    size_t *n) {
    for (uint32_t k = t->added_start[s[i]]; k < t->added_start[s[i] + 1]; k++) {
        const cb_tok_added *a = &t->added[k];
        size_t tl = t->enc_off[a->id + 1] - t->enc_off[a->id];
        if ((a->flags & CB_ADDED_SPECIAL) && !special) continue;
        if (tl <= len - i && !memcmp(s + i, t->enc + t->enc_off[a->id], tl)) {
            *n = tl;
            return a;
        }
    }
    return NULL;
}

int cb_tokenize_ex(const cb_tokenizer *t, const char *text, size_t len, int parse_special, int32_t *out, int cap,
                   char *err, size_t err_len) {
    sink o = {out, cap, 0};
    const uint8_t *s = (const uint8_t *)text;
    if (t->kind == CB_TOKENIZER_NONE) {
        snprintf(err, err_len, "this model has no tokenizer (it was converted without one): send token ids");
        return -1;
    }
    if (t->kind == CB_TOKENIZER_BYTES) {
        if (len > (size_t)cap) goto too_many;
        for (size_t i = 0; i < len; i++) out[i] = s[i];
        return (int)len;
    }
    size_t chunk = 0;
    for (size_t i = 0; i < len;) {
        size_t n;
        const cb_tok_added *a = t->added_start[s[i]] == t->added_start[s[i] + 1] ? NULL
                                : added_at(t, s, len, i, parse_special, &n);
        if (!a) {
            i++;
            continue;
        }
        int rc = encode_chunk(t, s + chunk, i - chunk, &o, err, err_len);
        if (rc == -2) return -1;
        if (rc || emit(&o, a->id)) goto too_many;
        i += n;
        chunk = i;
    }
    int rc = encode_chunk(t, s + chunk, len - chunk, &o, err, err_len);
    if (rc == -2) return -1;
    if (rc) goto too_many;
    return o.n;
too_many:
    snprintf(err, err_len, "the text is more than %d tokens", cap);
    return -1;
}

int cb_tokenize(const cb_tokenizer *t, const char *text, size_t len, int32_t *out, int cap) {
    char err[128];
    return cb_tokenize_ex(t, text, len, 1, out, cap, err, sizeof err);
}

/* ---- decoding ---- */

size_t cb_token_bytes(const cb_tokenizer *t, int32_t id, char *out, size_t cap) {
    if (id < 0 || (uint32_t)id >= t->n_tokens || cap < 1 || t->kind == CB_TOKENIZER_NONE) return 0;
    if (t->kind == CB_TOKENIZER_BYTES) {
        if (id > 255) return 0;
        out[0] = (char)id;
        return 1;
    }
    size_t n = t->dec_off[id + 1] - t->dec_off[id];
    if (n > cap) return 0;
    memcpy(out, t->dec + t->dec_off[id], n);
    return n;
}

int cb_is_end_token(const cb_tokenizer *t, int32_t id) {
    return id >= 0 && ((uint32_t)id == t->eos_id || (uint32_t)id == t->eot_id);
}

void cb_detok_init(cb_detok_state *s) { memset(s, 0, sizeof *s); }

static const char REPLACEMENT[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

/* Feeds bytes through the UTF-8 check; invalid maximal subparts become
 * U+FFFD (as Python's and Rust's lossy decoders do). */
static int feed(cb_detok_state *s, const uint8_t *b, size_t n, char *out, size_t cap) {
    size_t w = 0;
#define PUT(ptr, len)                              \
    do {                                           \
        if (w + (len) > cap) return -1;            \
        memcpy(out + w, (ptr), (len));             \
        w += (len);                                \
    } while (0)
    for (size_t i = 0; i < n; i++) {
        uint8_t c = b[i];
        if (s->n_pending) {
            uint8_t lo = 0x80, hi = 0xBF;
            if (s->n_pending == 1) {
                uint8_t lead = s->pending[0];
                if (lead == 0xE0) lo = 0xA0;
                else if (lead == 0xED) hi = 0x9F;
                else if (lead == 0xF0) lo = 0x90;
                else if (lead == 0xF4) hi = 0x8F;
            }
            if (c >= lo && c <= hi) {
                s->pending[s->n_pending++] = c;
                if (s->n_pending == s->need) {
                    PUT(s->pending, (size_t)s->need);
                    s->n_pending = 0;
                }
                continue;
            }
            PUT(REPLACEMENT, 3);
            s->n_pending = 0;
        }
        if (c < 0x80) {
            PUT(&c, 1);
        } else if (c >= 0xC2 && c <= 0xF4) {
            s->pending[0] = c;
            s->n_pending = 1;
            s->need = c <= 0xDF ? 2 : c <= 0xEF ? 3 : 4;
        } else {
            PUT(REPLACEMENT, 3);
        }
    }
#undef PUT
    return (int)w;
}

int cb_detok_step(const cb_tokenizer *t, cb_detok_state *s, int32_t id, char *out, size_t cap) {
    if (id < 0 || (uint32_t)id >= t->n_tokens) return -2;
    if (t->kind == CB_TOKENIZER_NONE) return 0;
    const uint8_t *b;
    size_t n;
    uint8_t one;
    if (t->kind == CB_TOKENIZER_BYTES) {
        if (id > 255) return 0;
        one = (uint8_t)id;
        b = &one, n = 1;
    } else {
        b = (const uint8_t *)t->dec + t->dec_off[id];
        n = t->dec_off[id + 1] - t->dec_off[id];
        int normal = t->attr[id] == CB_TOKA_NORMAL || t->attr[id] == CB_TOKA_BYTE;
        if (normal && !s->text_started) {
            s->text_started = 1;
            if ((t->flags & CB_TOKF_STRIP_SPACE) && n && b[0] == ' ') b++, n--;
        }
    }
    return feed(s, b, n, out, cap);
}

int cb_detok_flush(cb_detok_state *s, char *out, size_t cap) {
    if (!s->n_pending) return 0;
    s->n_pending = 0;
    if (cap < 3) return -1;
    memcpy(out, REPLACEMENT, 3);
    return 3;
}

long cb_detokenize(const cb_tokenizer *t, const int32_t *ids, int n, char *out, size_t cap, int *bad) {
    cb_detok_state s;
    cb_detok_init(&s);
    size_t w = 0;
    for (int i = 0; i < n; i++) {
        int got = cb_detok_step(t, &s, ids[i], out + w, cap - w);
        if (got == -2 && bad) *bad = i;
        if (got < 0) return got;
        w += (size_t)got;
    }
    int got = cb_detok_flush(&s, out + w, cap - w);
    if (got < 0) return -1;
    return (long)(w + (size_t)got);
}
