#include "chat.h"

#include <stdio.h>
#include <string.h>

#include "platform/platform.h"

enum { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT, ROLE_UNKNOWN };

static int role_of(const cb_chat_message *m) {
    if (m->role_len == 6 && !memcmp(m->role, "system", 6)) return ROLE_SYSTEM;
    if (m->role_len == 4 && !memcmp(m->role, "user", 4)) return ROLE_USER;
    if (m->role_len == 9 && !memcmp(m->role, "assistant", 9)) return ROLE_ASSISTANT;
    return ROLE_UNKNOWN;
}

static uint32_t role_token(const cb_tokenizer *t, int role) {
    return role == ROLE_SYSTEM ? t->info.role_system : role == ROLE_USER ? t->info.role_user
                                                     : role == ROLE_ASSISTANT ? t->info.role_assistant : CB_NO_TOKEN;
}

static int bad_role(const cb_chat_message *m, int i, char *err, size_t err_len) {
    snprintf(err, err_len, "messages[%d].role: got '%.*s', expected system, user or assistant", i,
             (int)(m->role_len > 32 ? 32 : m->role_len), m->role);
    return -1;
}

int cb_chat_available(const cb_tokenizer *t) {
    if (t->kind == CB_TOKENIZER_BYTES) return t->info.role_user != CB_NO_TOKEN;
    return t->n_chat == CB_CHAT_N_FIELDS;
}

static int format_bytes(const cb_tokenizer *t, const cb_chat_message *msgs, int n, int32_t *out, int cap,
                        char *err, size_t err_len) {
    int used = 0;
    if (cap < 1) goto too_long;
    out[used++] = (int32_t)t->info.bos_id;
    for (int i = 0; i < n; i++) {
        uint32_t role = role_token(t, role_of(&msgs[i]));
        if (role == CB_NO_TOKEN) return bad_role(&msgs[i], i, err, err_len);
        if (used + 2 > cap) goto too_long;
        out[used++] = (int32_t)role;
        int got = cb_tokenize(t, msgs[i].content, msgs[i].content_len, out + used, cap - used - 1);
        if (got < 0) goto too_long;
        used += got;
        out[used++] = (int32_t)t->info.end_of_turn;
    }
    if (used + 1 > cap) goto too_long;
    out[used++] = (int32_t)t->info.role_assistant;
    return used;
too_long:
    snprintf(err, err_len, "the prompt is longer than %d tokens", cap);
    return -1;
}

typedef struct {
    char *buf;
    size_t cap, len;
    int overflow;
    char date[11];
} text_out;

static void put(text_out *o, const char *s, size_t n) {
    if (o->len + n > o->cap) {
        o->overflow = 1;
        return;
    }
    memcpy(o->buf + o->len, s, n);
    o->len += n;
}

/* A template string, with today's date where it has CB_CHAT_DATE. */
static void put_field(text_out *o, const cb_tokenizer *t, int field) {
    const char *s = t->chat[field];
    size_t n = t->chat_len[field];
    for (const char *mark; (mark = memchr(s, CB_CHAT_DATE, n)) != NULL;) {
        put(o, s, (size_t)(mark - s));
        if (!o->date[0]) cb_local_date(o->date); /* transformers' strftime_now uses local time */
        put(o, o->date, 10);
        n -= (size_t)(mark - s) + 1;
        s = mark + 1;
    }
    put(o, s, n);
}

static void put_content(text_out *o, const cb_chat_message *m, int trim) {
    const char *s = m->content;
    size_t n = m->content_len;
    if (trim) { /* Python's str.strip(): ASCII whitespace is what chat text carries */
        while (n && (*s == ' ' || *s == '\n' || *s == '\t' || *s == '\r' || *s == '\f' || *s == '\v')) s++, n--;
        while (n && (s[n - 1] == ' ' || s[n - 1] == '\n' || s[n - 1] == '\t' || s[n - 1] == '\r' ||
                     s[n - 1] == '\f' || s[n - 1] == '\v'))
            n--;
    }
    put(o, s, n);
}

long cb_chat_render(const cb_tokenizer *t, const cb_chat_message *msgs, int n, char *text, size_t cap,
                    char *err, size_t err_len) {
    if (t->kind == CB_TOKENIZER_BYTES || t->n_chat != CB_CHAT_N_FIELDS || t->chat_len[CB_CHAT_OPTIONS] != 4) {
        snprintf(err, err_len, "this model has no chat template (convert it with one: colibri-build tokenizer "
                               "--chat-template FILE)");
        return -1;
    }
    const char *opt = t->chat[CB_CHAT_OPTIONS];
    const int last_user = opt[0] == '1';
    const int trim[3] = {opt[1] == '1', opt[2] == '1', opt[3] == '1'};
    for (int i = 0; i < n; i++) {
        int role = role_of(&msgs[i]);
        if (role == ROLE_UNKNOWN) return bad_role(&msgs[i], i, err, err_len);
        if (role == ROLE_SYSTEM && i > 0) {
            snprintf(err, err_len, "messages[%d]: a system message is only supported first", i);
            return -1;
        }
    }
    const int has_system = n > 0 && role_of(&msgs[0]) == ROLE_SYSTEM;
    if (n == has_system || role_of(&msgs[n - 1]) != ROLE_USER) {
        snprintf(err, err_len, "messages: the last message must be the user's");
        return -1;
    }
    text_out o = {text, cap, 0, 0, {0}};
    if (has_system && !last_user) {
        put_field(&o, t, CB_CHAT_HEAD_SYS);
        put_content(&o, &msgs[0], trim[ROLE_SYSTEM]);
        put_field(&o, t, CB_CHAT_SYS_USER);
    } else {
        put_field(&o, t, CB_CHAT_HEAD);
    }
    int prev = -1;
    for (int i = has_system; i < n; i++) {
        int role = role_of(&msgs[i]);
        if (prev == ROLE_USER) put_field(&o, t, CB_CHAT_USER_ASST);
        else if (prev == ROLE_ASSISTANT) put_field(&o, t, CB_CHAT_ASST_USER);
        if (has_system && last_user && i == n - 1) {
            put_content(&o, &msgs[0], trim[ROLE_SYSTEM]);
            put_field(&o, t, CB_CHAT_SYS_SEP);
        }
        put_content(&o, &msgs[i], trim[role]);
        prev = role;
    }
    put_field(&o, t, CB_CHAT_TAIL);
    if (o.overflow) {
        snprintf(err, err_len, "the formatted prompt is longer than %zu bytes", cap);
        return -1;
    }
    return (long)o.len;
}

int cb_chat_format(const cb_tokenizer *t, const cb_chat_message *msgs, int n, char *text, size_t text_cap,
                   int32_t *out, int cap, char *err, size_t err_len) {
    if (t->kind == CB_TOKENIZER_BYTES) {
        if (t->info.role_user == CB_NO_TOKEN || t->info.role_assistant == CB_NO_TOKEN) {
            snprintf(err, err_len, "this model's tokenizer has no chat roles");
            return -1;
        }
        return format_bytes(t, msgs, n, out, cap, err, err_len);
    }
    long len = cb_chat_render(t, msgs, n, text, text_cap, err, err_len);
    if (len < 0) return -1;
    int got = cb_tokenize_ex(t, text, (size_t)len, 1, out, cap, err, err_len);
    if (got < 0 && strstr(err, "more than")) snprintf(err, err_len, "the prompt is longer than %d tokens", cap);
    return got;
}
