/* A Jinja interpreter for chat templates: the subset the models' own
 * templates use, with the semantics of the environment transformers'
 * apply_chat_template renders them in (trim_blocks, lstrip_blocks,
 * loopcontrols, its tojson, raise_exception, strftime_now, an immutable
 * sandbox: no list.append).
 *
 * A template is parsed once, at start, into memory allocated then
 * (cb_jinja_parse). Each render works in a caller's fixed block (values,
 * scopes, captured text) and writes into a caller's fixed buffer: nothing is
 * allocated while serving, and a render that needs more memory, more output
 * or more steps than it has stops with an error instead. */
#ifndef CB_JINJA_H
#define CB_JINJA_H

#include <stddef.h>
#include <stdint.h>

#include "server/json.h"

typedef struct cb_jinja cb_jinja;
typedef struct cb_jrender cb_jrender;

enum {
    CB_JINJA_ERROR = -1,     /* the template failed (undefined call, bad operand...): err says where */
    CB_JINJA_RAISED = -2,    /* the template called raise_exception: err is its message */
    CB_JINJA_TOO_LONG = -3,  /* the output is longer than the buffer */
    CB_JINJA_NO_MEMORY = -4, /* the work block is too small for this render */
};

/* The parsed template, or NULL with "line N: reason" in err. */
cb_jinja *cb_jinja_parse(const char *src, size_t len, char *err, size_t err_len);
void cb_jinja_free(cb_jinja *t);

/* A render in work[work_cap] (8-byte aligned); NULL if work is too small.
 * Variables are added with the setters below (0, or -1 when work is full),
 * then cb_jinja_render runs it once. */
cb_jrender *cb_jinja_begin(const cb_jinja *t, void *work, size_t work_cap);
int cb_jinja_set_string(cb_jrender *r, const char *name, const char *s, size_t n);
int cb_jinja_set_bool(cb_jrender *r, const char *name, int value);
int cb_jinja_set_none(cb_jrender *r, const char *name);
/* The JSON value toks[i] of json, as Python's json.loads gives it. */
int cb_jinja_set_json(cb_jrender *r, const char *name, const char *json, const cb_json_tok *toks, int i);
/* Each key of the JSON object toks[obj] as a variable (chat_template_kwargs). */
int cb_jinja_set_json_keys(cb_jrender *r, const char *json, const cb_json_tok *toks, int obj);

/* Chat messages (the JSON array toks[arr]) as `messages`, shaped as
 * transformers hands them to the template: reasoning under
 * `reasoning_content` and `thinking`; and, as the server's own choices
 * (vLLM's too), content given as text parts joined into one string, null
 * content (and an assistant message's absent content) as "", a tool call's
 * arguments given as a JSON object's text as that object, and the
 * developer role renamed system when
 * developer_as_system. append_last (or NULL) is
 * added to the final message's content (transformers' continue marker);
 * -1 when that message has no text content. */
int cb_jinja_set_messages(cb_jrender *r, const char *json, const cb_json_tok *toks, int arr,
                          int developer_as_system, const char *append_last);

/* Renders into out[cap]: the length, or a CB_JINJA_* error with its message
 * in err. */
long cb_jinja_render(cb_jrender *r, char *out, size_t cap, char *err, size_t err_len);

/* Whether the template's source mentions name (e.g. "developer"). */
int cb_jinja_mentions(const cb_jinja *t, const char *name);

#endif
