/* JSON in and out without allocation.
 *
 * Reading: cb_json_parse() validates a whole document against RFC 8259 and
 * tokenises it into the caller's array in document order. A container token
 * is followed by its children; an object's children alternate key (a string
 * token) and value. Each token records where its subtree ends (`next`), so
 * skipping a value is one lookup:
 *
 *     for (int i = obj + 1, k = 0; k < toks[obj].size; k++, i = toks[i + 1].next)
 *         key = i, value = i + 1;
 *
 * Writing: cb_jw appends to a fixed buffer, inserts commas itself and sets
 * `overflow` instead of writing past the end. */
#ifndef CB_JSON_H
#define CB_JSON_H

#include <stddef.h>
#include <stdint.h>

#define CB_JSON_MAX_DEPTH 64

typedef enum {
    CB_JSON_OBJECT = 1,
    CB_JSON_ARRAY,
    CB_JSON_STRING,
    CB_JSON_NUMBER,
    CB_JSON_TRUE,
    CB_JSON_FALSE,
    CB_JSON_NULL,
} cb_json_type;

/* Token flags. */
#define CB_JSON_F_ESCAPED 1u /* string: holds backslash escapes */
#define CB_JSON_F_INTEGER 2u /* number: no fraction, no exponent */

typedef struct {
    uint8_t type;  /* cb_json_type */
    uint8_t flags; /* CB_JSON_F_* */
    int32_t start; /* byte offsets into the document: [start, end); */
    int32_t end;   /* a string's span excludes its quotes */
    int32_t size;  /* object: key/value pairs; array: elements; else 0 */
    int32_t next;  /* index of the first token after this subtree */
} cb_json_tok;

/* Errors (negative) from cb_json_parse(). */
enum {
    CB_JSON_ERR_NOMEM = -1,    /* more tokens than max_toks */
    CB_JSON_ERR_EOF = -2,      /* document ends inside a value */
    CB_JSON_ERR_SYNTAX = -3,   /* unexpected character (trailing comma...) */
    CB_JSON_ERR_NUMBER = -4,   /* leading zero, missing digits */
    CB_JSON_ERR_CONTROL = -5,  /* raw control character in a string */
    CB_JSON_ERR_ESCAPE = -6,   /* unknown escape, bad \u, lone surrogate */
    CB_JSON_ERR_UTF8 = -7,     /* invalid UTF-8 in a string */
    CB_JSON_ERR_DEPTH = -8,    /* nesting deeper than CB_JSON_MAX_DEPTH */
    CB_JSON_ERR_TRAILING = -9, /* bytes after the document */
    CB_JSON_ERR_TOO_BIG = -10, /* document of 2 GiB or more */
};

/* Parses json[0..len) into toks[0..max_toks). Returns the number of tokens
 * (>= 1), or an error above with *err_offset (may be NULL) set to the byte
 * offset of the offending byte (len when the document ended early).
 * toks == NULL only counts the tokens (max_toks is then ignored). */
int cb_json_parse(const char *json, size_t len, cb_json_tok *toks, int max_toks,
                  size_t *err_offset);

/* English text for an error code. */
const char *cb_json_strerror(int err);

/* Index of the token after the subtree rooted at toks[i]. */
static inline int cb_json_skip(const cb_json_tok *toks, int i) { return toks[i].next; }

/* Value of `key` in the object toks[obj], or -1 (also when toks[obj] is no
 * object). With duplicate keys the last one wins, as in JavaScript and
 * Python. Keys longer than 255 bytes after unescaping never match. */
int cb_json_find(const char *json, const cb_json_tok *toks, int obj, const char *key);

/* Index of the n-th element of the array toks[arr], or -1. */
int cb_json_array_at(const cb_json_tok *toks, int arr, int n);

/* 1 when the string token t, unescaped, equals the C string s. */
int cb_json_str_eq(const char *json, const cb_json_tok *t, const char *s);

/* Typed reads: 0 on success, -1 on the wrong type or a value out of range.
 * int64 accepts only integer syntax (no fraction or exponent); double
 * rejects values that overflow to infinity. */
int cb_json_get_int64(const char *json, const cb_json_tok *t, int64_t *out);
int cb_json_get_double(const char *json, const cb_json_tok *t, double *out);
int cb_json_get_bool(const cb_json_tok *t, int *out);

/* Writes the string token t, unescaped to UTF-8 (\uXXXX surrogate pairs
 * joined), NUL-terminated into out[0..cap). Returns the length without the
 * NUL (the text may itself contain NUL from \u0000), -1 when cap is too
 * small, -2 when t is no string or holds a bad escape or lone surrogate.
 * The unescaped text is never longer than t->end - t->start. */
int cb_json_unescape(const char *json, const cb_json_tok *t, char *out, size_t cap);

/* ---- writer ---- */

typedef struct {
    char *buf;
    size_t cap;      /* bytes at buf; one is kept for the terminating NUL */
    size_t len;      /* bytes written; buf[len] == '\0' */
    int overflow;    /* set when something did not fit (or nesting went past
                        CB_JSON_MAX_DEPTH): the output must not be used */
    int depth;
    int after_key;   /* the next value completes a key/value pair */
    uint64_t has_items; /* bit d: the container at depth d has an element */
} cb_jw;

void cb_jw_init(cb_jw *w, char *buf, size_t cap);
void cb_jw_begin_object(cb_jw *w);
void cb_jw_end_object(cb_jw *w);
void cb_jw_begin_array(cb_jw *w);
void cb_jw_end_array(cb_jw *w);
void cb_jw_key(cb_jw *w, const char *key);
/* Strings are escaped: quote, backslash, control characters (\n, \u001f...).
 * Valid UTF-8 passes through; an invalid byte becomes U+FFFD so the output
 * is always valid JSON (a token cut inside a character cannot break it). */
void cb_jw_str(cb_jw *w, const char *s);
void cb_jw_str_n(cb_jw *w, const char *s, size_t n);
void cb_jw_int(cb_jw *w, int64_t v);
/* %.9g; NaN and infinities are written as null. */
void cb_jw_double(cb_jw *w, double v);
void cb_jw_bool(cb_jw *w, int v);
void cb_jw_null(cb_jw *w);
/* A value that already is JSON text, copied as is. */
void cb_jw_raw(cb_jw *w, const char *json, size_t n);
/* OpenAI's error object as a value: {"error": {"message", "type", "param": null, "code": null}}. */
void cb_jw_openai_error(cb_jw *w, const char *message, const char *type);
/* The same with "param" and "code" (NULL: null). */
void cb_jw_openai_error_ex(cb_jw *w, const char *message, const char *type, const char *param,
                           const char *code);

#endif
