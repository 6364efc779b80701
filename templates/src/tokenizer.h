/* Text <-> token ids.
 *   bytes: synthetic models; token b < 256 is byte b, specials follow.
 *   bpe:   byte-level BPE (GPT-2, Llama 3, Qwen2/3) with its pre-tokenizer.
 *   spm:   SentencePiece-style BPE over pieces with U+2581 for spaces and
 *          byte fallback (Llama 2, Mixtral).
 * Real vocabularies come from tokenizer.cbt in the model folder, written by
 * toolkit/tokenizer.py (layout below). Everything is allocated when the
 * tokenizer is opened; encoding and decoding only use that memory, so one
 * tokenizer serves one caller at a time. */
#ifndef CB_TOKENIZER_H
#define CB_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "weights.h"

/* tokenizer.cbt (little-endian, sections 4-byte aligned, in this order):
 *   cb_tok_file_header
 *   u32 enc_off[n_tokens+1], enc bytes    token text as the encoder sees it
 *   u32 dec_off[n_tokens+1], dec bytes    bytes the token decodes to
 *   u8  attr[n_tokens]                    enum cb_tok_attr
 *   cb_tok_merge merges[n_merges]         BPE merges, any order
 *   cb_tok_added added[n_added]           tokens split out of text first
 *   u32 chat_off[n_chat+1], chat bytes    n_chat 0, or 1: the Jinja chat template's source */
#define CB_TOK_MAGIC "CBTOKEN"
#define CB_TOK_VERSION 2 /* 2: the chat section is the Jinja source (1: reduced strings) */
#define CB_TOK_MAX_WORD (1u << 16) /* longest pre-token, in bytes, one encode handles */
#define CB_TOK_MAX_NFC (1u << 18)  /* longest text chunk, in code points, that needs NFC */
#define CB_CHAT_MAX_STRINGS 16

enum cb_pretok {
    CB_PRETOK_NONE = 0, CB_PRETOK_GPT2 = 1, CB_PRETOK_LLAMA3 = 2, CB_PRETOK_QWEN2 = 3,
    CB_PRETOK_O200K = 4, CB_PRETOK_DEEPSEEK_V3 = 5, CB_PRETOK_DEEPSEEK_LLM = 6
};
enum cb_tok_flag {
    CB_TOKF_IGNORE_MERGES = 1,  /* a pre-token that is itself a token is not merged (Llama 3) */
    CB_TOKF_DUMMY_PREFIX = 2,   /* spm: U+2581 before each text chunk */
    CB_TOKF_STRIP_SPACE = 4,    /* decoding drops the space of the first piece */
    CB_TOKF_BYTE_FALLBACK = 8,  /* spm: unknown characters become <0xXX> byte tokens */
    CB_TOKF_SPLIT_WORDS = 16,   /* spm: no piece holds U+2581 after another character, so
                                   words (split before such a U+2581) merge independently */
    CB_TOKF_NFC = 32,           /* text is NFC-normalised before splitting (Qwen, OLMo) */
};
enum cb_tok_attr { CB_TOKA_NORMAL = 0, CB_TOKA_SPECIAL = 1, CB_TOKA_USER = 2, CB_TOKA_BYTE = 3, CB_TOKA_UNUSED = 4 };
enum cb_tok_added_flag { CB_ADDED_SPECIAL = 1 }; /* parsed only when special tokens are */

typedef struct {
    char magic[8];
    uint32_t version, kind, pretok, flags;
    uint32_t n_tokens, n_merges, n_added, n_chat;
    uint32_t bos_id, eos_id, unk_id, add_bos;  /* CB_NO_TOKEN if absent */
    uint32_t eot_id;                           /* end of a chat turn, if not eos */
    uint32_t reserved[2];
    uint32_t byte_ids[256];  /* token of each single byte (byte-level symbol or <0xXX>) */
} cb_tok_file_header;

typedef struct {
    uint32_t left, right, result, rank; /* lower rank merges first */
} cb_tok_merge;

typedef struct {
    uint32_t id, flags;
} cb_tok_added;

_Static_assert(sizeof(cb_tok_file_header) == 1092, "header must match toolkit/tokenizer.py");

typedef struct cb_tok_work cb_tok_work;

typedef struct {
    cb_tok_info info;
    uint32_t vocab;                   /* rows of the embedding */
    uint32_t kind, pretok, flags, n_tokens, n_merges, n_added;
    uint32_t bos_id, eos_id, unk_id, add_bos, eot_id;
    uint32_t byte_ids[256];
    const uint32_t *enc_off, *dec_off;
    const char *enc, *dec;
    const uint8_t *attr;
    const cb_tok_merge *merges;
    const cb_tok_added *added;        /* sorted by first byte, longest first */
    uint32_t added_start[257];        /* added[added_start[b] ..] start with byte b */
    uint32_t n_chat;
    const char *chat[CB_CHAT_MAX_STRINGS];
    uint32_t chat_len[CB_CHAT_MAX_STRINGS];
    struct cb_jinja *chat_tpl;        /* the chat template, parsed at open; NULL if none */
    uint32_t *str_table, str_mask;    /* enc text -> id, open addressing */
    uint32_t *merge_table, merge_mask;/* (left, right) -> merge index */
    void *file;                       /* the whole .cbt, owned */
    cb_tok_work *work;                /* scratch of one encode call */
} cb_tokenizer;

/* Streaming decode state: holds back a UTF-8 sequence cut between tokens. */
typedef struct {
    uint8_t pending[4];
    int n_pending, need;
    int text_started;
} cb_detok_state;

/* Opens the tokenizer the weights header names: the byte tokenizer, or
 * model_dir/tokenizer.cbt. Returns 0, or -1 with the file and reason in err. */
int cb_tokenizer_open(cb_tokenizer *t, const char *model_dir, const cb_tok_info *info, uint32_t vocab,
                      char *err, size_t err_len);
/* The same from a .cbt file's bytes held elsewhere (an executable that
 * carries its model; bytes NULL: there is none); label names them in
 * messages. The bytes are copied. */
int cb_tokenizer_open_bytes(cb_tokenizer *t, const void *bytes, size_t size, const char *label,
                            const cb_tok_info *info, uint32_t vocab, char *err, size_t err_len);
/* Loads a .cbt file alone (tools, tests), or its bytes. */
int cb_tokenizer_load(cb_tokenizer *t, const char *path, char *err, size_t err_len);
int cb_tokenizer_load_bytes(cb_tokenizer *t, const void *bytes, size_t size, const char *label, char *err,
                            size_t err_len);
void cb_tokenizer_close(cb_tokenizer *t);
/* Kept for the byte tokenizer's callers: cb_tokenizer_open without a folder. */
void cb_tokenizer_init(cb_tokenizer *t, const cb_tok_info *info, uint32_t vocab);

/* Encodes text into out. parse_special: special added tokens written in the
 * text become their ids (other added tokens always do). Returns the count,
 * or -1 with a message in err (more than cap ids, a pre-token longer than
 * CB_TOK_MAX_WORD bytes, over CB_TOK_MAX_NFC characters needing NFC between
 * two added tokens). Invalid UTF-8 is encoded byte by byte, never an error. */
int cb_tokenize_ex(const cb_tokenizer *t, const char *text, size_t len, int parse_special, int32_t *out,
                   int cap, char *err, size_t err_len);
/* cb_tokenize_ex with special tokens parsed and no message. */
int cb_tokenize(const cb_tokenizer *t, const char *text, size_t len, int32_t *out, int cap);

/* Writes the bytes token id stands for (raw, possibly part of a character);
 * returns how many (0 for an unknown id or a too small out). */
size_t cb_token_bytes(const cb_tokenizer *t, int32_t id, char *out, size_t cap);
int cb_is_end_token(const cb_tokenizer *t, int32_t id);
uint32_t cb_tokenizer_size(const cb_tokenizer *t);

void cb_detok_init(cb_detok_state *s);
/* Appends token id's text to out: only whole UTF-8 characters, invalid
 * bytes as U+FFFD. Returns bytes written, -1 if out is too small, -2 for an
 * id outside the vocabulary. */
int cb_detok_step(const cb_tokenizer *t, cb_detok_state *s, int32_t id, char *out, size_t cap);
/* Ends the stream: a cut-off sequence becomes U+FFFD. */
int cb_detok_flush(cb_detok_state *s, char *out, size_t cap);
/* Whole sequence; returns the length, -1 if cap is too small, -2 (with
 * *bad set to its index) for an id outside the vocabulary. */
long cb_detokenize(const cb_tokenizer *t, const int32_t *ids, int n, char *out, size_t cap, int *bad);

#endif
