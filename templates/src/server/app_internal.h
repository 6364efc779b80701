/* The application's state, shared by app.c (routes, queue, scheduler),
 * request.c (reading a request body) and response.c (writing answers).
 * Everything is allocated by cb_app_create(). */
#ifndef CB_APP_INTERNAL_H
#define CB_APP_INTERNAL_H

#include <stdint.h>

#include "app.h"
#include "chat.h"
#include "constrain.h"
#include "json.h"
#include "metrics.h"
#include "sampler.h"

#define CB_MAX_JSON_TOKENS 65536
#define CB_MAX_MESSAGES 256
#define CB_RESPONSE_BYTES (1u << 20)
#define CB_MAX_STOP 4            /* stop sequences per request (OpenAI's limit) */
#define CB_STOP_BYTES 512        /* their total length */
#define CB_MAX_TOP_LOGPROBS 20   /* OpenAI's limit for chat */
#define CB_TOKEN_BYTES 256       /* longest text of one token */
#define CB_DEFAULT_SEED 0        /* seed of a request that sends none */

typedef enum { CB_EP_CHAT, CB_EP_COMPLETION } cb_endpoint;

/* A validated request, waiting in the queue or running in a slot. */
typedef struct {
    cb_endpoint endpoint;
    cb_conn_id conn;
    uint64_t request_no;
    uint64_t arrived_ns;
    int64_t created;             /* Unix time of arrival, in every answer */
    int stream, include_usage, trace;
    int ignore_eos;            /* keep generating past end-of-sequence tokens (as llama.cpp, vLLM) */
    int logprobs, top_logprobs;  /* logprobs: 0/1; top: 0..CB_MAX_TOP_LOGPROBS */
    int max_tokens;              /* requested, > 0 (clamped to the context later) */
    cb_sampling sampling;
    int n_stop;
    uint16_t stop_off[CB_MAX_STOP], stop_len[CB_MAX_STOP];
    char stop_text[CB_STOP_BYTES];
    int n_prompt;
    int32_t *prompt;             /* [context] */
    int constrained;             /* the output must match con (response_format) */
    cb_con_schema con;
} cb_request;

/* One generation slot: a KV cache in the engine and this state. */
typedef struct {
    cb_request *req;             /* NULL: free */
    int n_fed, n_generated, max_tokens;
    int prompt_steps;            /* forward steps that carried part of the prompt */
    int32_t next_token;          /* sampled, not yet fed */
    const char *finish_reason;   /* set when done */
    int stopped;                 /* a stop sequence ended the text */
    cb_rng rng;
    uint64_t admitted_ns, first_token_ns, last_token_ns; /* server-side timings */
    int32_t *generated;          /* [context] */
    uint32_t *expert_counts;     /* [layers][experts] over every token fed */
    float *trace_logits;         /* [context]: logit of each generated token */
    int32_t *trace_experts;      /* [context][layers][top_k] */
    float *lp;                   /* [context]: log-probability of each generated token */
    int32_t *top_ids;            /* [context][CB_MAX_TOP_LOGPROBS] */
    float *top_lp;               /* [context][CB_MAX_TOP_LOGPROBS] */
    /* Text: bytes not yet released (an incomplete UTF-8 character, or what
     * may be the start of a stop sequence), and the released text of a
     * non-streaming answer. */
    char held[CB_STOP_BYTES + CB_TOKEN_BYTES + 8];
    size_t held_len;
    cb_detok_state detok;        /* whole characters across token boundaries, SentencePiece spaces */
    char *text;                  /* [text_cap] */
    size_t text_len, text_cap;
    size_t stream_text_len;      /* text released so far by a stream */
    cb_con_state con;            /* the constrained output so far (req->constrained) */
} cb_slot;

struct cb_app {
    cb_engine *engine;
    cb_netloop *loop;
    const cb_dims *dims;
    int n_slots;
    cb_slot *slots;
    cb_batch_item *batch;
    int *batch_slot;             /* slot of each batch item */

    /* Requests: a pool of n_slots + queue_cap, so a free slot or a free
     * queue place always has one. */
    cb_request *pool;
    int pool_size;
    int *pool_free;              /* stack of free pool indices */
    int n_pool_free;
    int queue_cap, queue_len, queue_head;
    int *queue;                  /* ring of pool indices, FIFO */

    cb_json_tok *toks;
    char *scratch;               /* unescaped message text */
    size_t scratch_cap;
    cb_chat_message *messages;
    char *text;                  /* a formatted prompt or detokenized text [text_cap] */
    size_t text_cap;
    void *chat_work;             /* a chat template's render [chat_work_cap]; NULL without one */
    size_t chat_work_cap;
    int32_t *ids;                /* /tokenize and /detokenize [scratch_cap] */
    char *response;              /* [CB_RESPONSE_BYTES] */
    int step_tokens;             /* most tokens a step carries while some decode (0: no limit) */
    cb_sampler sampler;
    cb_con_vocab con_vocab;      /* token masks for constrained requests; vocab 0 without a tokenizer */
    cb_metrics metrics;
    const char *api_key;         /* NULL: no auth */
    const char *metrics_key;     /* NULL: /metrics takes the API key only */
    int metrics_public;          /* /metrics needs no key */
    int draining;                /* shutting down: no new requests */
    int verbose;                 /* a line on stderr per generation request (log_request) */
    uint64_t requests;
};

/* request.c: reads body into r. Returns 0, or an HTTP status with a message
 * (naming the field) in err. */
/* The body as a JSON object in a->toks: 0, or 400 with a message. */
int cb_request_parse_object(cb_app *a, const char *body, size_t len, char *err, size_t err_len);
/* The body of /apply-template as the chat template's inputs (tools
 * included): 0, or 400 with a message. */
int cb_request_template(cb_app *a, const char *body, size_t len, cb_chat_request *q, char *err, size_t err_len);
int cb_request_read(cb_app *a, cb_request *r, cb_endpoint ep, const char *body, size_t len, char *err,
                    size_t err_len);

/* response.c */
void cb_respond_json(cb_app *a, cb_conn *c, int status, cb_jw *w);
void cb_respond_error(cb_app *a, cb_conn *c, int status, const char *type, const char *message);
/* The whole answer of a finished non-streaming request. */
void cb_respond_final(cb_app *a, cb_conn *c, const cb_slot *st);
/* Stream pieces; each returns CB_CONN_OK or the netloop error. */
int cb_stream_delta(cb_app *a, cb_conn *c, const cb_slot *st, const char *text, size_t len, int token);
int cb_stream_finish(cb_app *a, cb_conn *c, const cb_slot *st);
/* Ends a started stream with an OpenAI-shaped error event (server_error). */
int cb_stream_error(cb_app *a, cb_conn *c, const char *message);

#endif
