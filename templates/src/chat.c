#include "chat.h"

#include <stdio.h>
#include <string.h>

#include "jinja.h"

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

int cb_chat_available(const cb_tokenizer *t) {
    if (t->kind == CB_TOKENIZER_BYTES) return t->info.role_user != CB_NO_TOKEN;
    return t->chat_tpl != NULL;
}

int cb_chat_format(const cb_tokenizer *t, const cb_chat_message *msgs, int n, int32_t *out, int cap, char *err,
                   size_t err_len) {
    if (t->kind != CB_TOKENIZER_BYTES || t->info.role_user == CB_NO_TOKEN || t->info.role_assistant == CB_NO_TOKEN) {
        snprintf(err, err_len, "this model's tokenizer has no chat roles");
        return -1;
    }
    int used = 0;
    if (cap < 1) goto too_long;
    out[used++] = (int32_t)t->info.bos_id;
    for (int i = 0; i < n; i++) {
        uint32_t role = role_token(t, role_of(&msgs[i]));
        if (role == CB_NO_TOKEN) {
            snprintf(err, err_len, "messages[%d].role: got '%.*s', expected system, user or assistant", i,
                     (int)(msgs[i].role_len > 32 ? 32 : msgs[i].role_len), msgs[i].role);
            return -1;
        }
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

/* A special token's text as the template gets it (bos_token...). */
static int set_token(cb_jrender *r, const cb_tokenizer *t, const char *name, uint32_t id) {
    if (id == CB_NO_TOKEN || id >= t->n_tokens) return 0;
    return cb_jinja_set_string(r, name, t->enc + t->enc_off[id], t->enc_off[id + 1] - t->enc_off[id]);
}

/* transformers' continue_final_message marker: appended to the final
 * message, and the rendering cut where it appears. */
static const char CONTINUE_TAG[] = "CONTINUE_FINAL_MESSAGE_TAG ";

long cb_chat_apply(const cb_tokenizer *t, const cb_chat_request *q, void *work, size_t work_cap, char *text,
                   size_t cap, char *err, size_t err_len) {
    if (!t->chat_tpl) {
        snprintf(err, err_len, "this model has no chat template (convert it with one: colibri-build tokenizer "
                               "--chat-template FILE)");
        return -1;
    }
    cb_jrender *r = cb_jinja_begin(t->chat_tpl, work, work_cap);
    int dev_as_system = !cb_jinja_mentions(t->chat_tpl, "developer");
    if (!r || cb_jinja_set_messages(r, q->json, q->toks, q->messages, dev_as_system,
                                    q->continue_final ? CONTINUE_TAG : NULL) != 0 ||
        (q->tools >= 0 ? cb_jinja_set_json(r, "tools", q->json, q->toks, q->tools)
                       : cb_jinja_set_none(r, "tools")) != 0 ||
        cb_jinja_set_none(r, "documents") != 0 || set_token(r, t, "bos_token", t->bos_id) != 0 ||
        set_token(r, t, "eos_token", t->eos_id) != 0 || set_token(r, t, "unk_token", t->unk_id) != 0 ||
        (q->kwargs >= 0 && cb_jinja_set_json_keys(r, q->json, q->toks, q->kwargs) != 0) ||
        cb_jinja_set_bool(r, "add_generation_prompt", q->add_generation_prompt) != 0) {
        snprintf(err, err_len, "the request's messages need more than the chat template's %zu bytes of working memory",
                 work_cap);
        return -1;
    }
    long n = cb_jinja_render(r, text, cap, err, err_len);
    if (n < 0) return -1;
    if (q->continue_final) {
        const size_t tag = sizeof CONTINUE_TAG - 2; /* without its space */
        long at = -1;
        for (long i = n - (long)tag; i >= 0; i--)
            if (!memcmp(text + i, CONTINUE_TAG, tag)) {
                at = i;
                break;
            }
        if (at < 0) {
            snprintf(err, err_len, "the chat template does not render the final message's content, so it cannot be "
                                   "continued");
            return -1;
        }
        int spaced = at + (long)tag < n && text[at + (long)tag] == ' ';
        n = at;
        /* the template trimmed the message: so is its continuation point */
        if (!spaced)
            while (n > 0 && (text[n - 1] == ' ' || text[n - 1] == '\n' || text[n - 1] == '\t' || text[n - 1] == '\r'))
                n--;
    }
    return n;
}
