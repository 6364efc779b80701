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
#include "toolcall.h"

#define CB_MAX_JSON_TOKENS 65536
#define CB_TOOL_SCHEMA_BYTES (1 << 16)
#define CB_TOOL_SCHEMA_TOKENS 8192
#define CB_MAX_MESSAGES 256
#define CB_RESPONSE_BYTES (1u << 20)
#define CB_MAX_STOP 4            /* stop sequences per request (OpenAI's limit) */
#define CB_STOP_BYTES 512        /* their total length */
#define CB_MAX_TOP_LOGPROBS 20   /* OpenAI's limit for chat */
#define CB_TOKEN_BYTES 256       /* longest text of one token */
#define CB_DEFAULT_SEED 0        /* seed of a request that sends none */
#define CB_MAX_LOGIT_BIAS 300    /* logit_bias entries per request (OpenAI's limit) */

typedef enum { CB_EP_CHAT, CB_EP_COMPLETION, CB_EP_RESPONSES } cb_endpoint;

/* /v1/responses: what its answer repeats of the request (responses.c). */
enum { CB_RESP_TEXT, CB_RESP_JSON_OBJECT, CB_RESP_JSON_SCHEMA };
enum { CB_RESP_CHOICE_AUTO, CB_RESP_CHOICE_NONE, CB_RESP_CHOICE_REQUIRED, CB_RESP_CHOICE_NAMED };
typedef struct {
    int max_output;              /* max_output_tokens as sent; 0: none */
    uint8_t format;              /* CB_RESP_TEXT... */
    uint8_t tool_choice;         /* CB_RESP_CHOICE_... */
    char tool_name[CB_TOOL_NAME_BYTES + 1];
} cb_resp_echo;

/* An output item of a /v1/responses answer with tools, in order: a message
 * (tool_content[off, off + len)) or a call (calls[off]). */
enum { CB_RESP_ITEM_MESSAGE = 1, CB_RESP_ITEM_CALL };
typedef struct {
    uint8_t kind;
    uint32_t off, len;
} cb_resp_item;
#define CB_RESP_MAX_ITEMS (2 * CB_MAX_TOOL_CALLS + 1)

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
    int n_bias;                  /* logit_bias, pointed to by sampling */
    int32_t bias_id[CB_MAX_LOGIT_BIAS];
    float bias[CB_MAX_LOGIT_BIAS];
    int reasoning;               /* the output starts inside the template's thinking block */
    int choice, n_choices;       /* a list of prompts: this one's index, and how many (1: no list) */
    int n_samples;               /* n: the choices are samples of one prompt (1: not) */
    int group_prompt, group_completion, group_cached; /* tokens of the list's prompts that finished before this one */
    cb_tool_format tool_format;  /* parse the output for tool calls (CB_TOOLFMT_NONE: no) */
    int parallel_tools;          /* parallel_tool_calls: 0 ends the answer after its first call */
    int constrained;             /* the output must match con (response_format) */
    cb_con_schema con;
    cb_resp_echo resp;           /* /v1/responses only */
} cb_request;

/* A tool call of a non-streamed answer: its name and arguments in the
 * slot's tool_calls buffer. */
typedef struct {
    uint32_t name_off, name_len, args_off, args_len;
} cb_tool_call_span;

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
    uint64_t sample_ns;          /* CPU choosing the tokens: sampling, and masks under a constraint */
    uint64_t *token_ns;          /* [context]: when each generated token's text went to the connection */
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
    /* Thinking text (reasoning.c): where the generated text is, and where
     * the answer's reasoning ends and its content starts in text[]. */
    int held_done;               /* finished, kept until the other prompts of its list finish */
    int think_state;             /* CB_THINK_* */
    int think_fresh;             /* at the start of a region: its opening newlines are dropped */
    int think_in_label;          /* in the channel's name after think_open (think_label): dropped */
    int had_reasoning;           /* a thinking block was entered */
    size_t reasoning_end;        /* text[0..reasoning_end): reasoning, once its block closed */
    /* gpt-oss (reasoning.c): inside a message header, its text kept aside */
    int harmony_in_header;
    int harmony_content;         /* a message that is not analysis has begun */
    char harmony_hdr[120];
    size_t harmony_hdr_len;
    /* The prefix cache (prefix_cache.c): what the slot's KV cache holds once
     * its request is done, for the next request that starts the same way. */
    int32_t *kv_tokens;          /* [context]: the token at each position */
    int kv_len;                  /* positions 0..kv_len-1 hold their K and V (while free) */
    int kv_prompt_len;           /* f16-llama: the prompt length those rows were run for (cb_llama_ubatch) */
    uint64_t used_at;            /* admission number of its latest request: least recently used first */
    int cached;                  /* prompt tokens this request took from the cache */
    /* A request with tools (buffers allocated only for a model whose
     * template has a known tool-call format): text accumulates in text[]
     * in both modes and the parser splits it into content and calls. */
    cb_tool_parser tools;
    char *tool_content;          /* [text_cap]: content of a non-streamed answer */
    size_t tool_content_len;
    char *tool_calls;            /* [tool_calls_cap]: names and arguments of its calls */
    size_t tool_calls_len, tool_calls_cap;
    cb_tool_call_span calls[CB_MAX_TOOL_CALLS];
    int n_calls;                 /* calls handed out (streamed or kept) */
    char *tool_scratch;          /* [tool_scratch_cap]: the parser's built arguments */
    size_t tool_scratch_cap;
    cb_con_state con;            /* the constrained output so far (req->constrained) */
    /* /v1/responses: the items of an answer with tools, and a stream's
     * place: its next event's sequence_number, items begun, the open one */
    cb_resp_item resp_items[CB_RESP_MAX_ITEMS];
    int n_resp_items;
    int resp_seq, resp_begun, resp_open;
    int reasoning_tokens;        /* tokens generated inside the thinking block */
} cb_slot;

struct cb_app {
    cb_engine *engine;
    cb_netloop *loop;
    const cb_dims *dims;
    int n_slots;
    cb_slot *slots;
    cb_batch_item *batch;
    int *batch_slot;             /* slot of each batch item */
    cb_app_memory_info memory;   /* what cb_app_create allocated */

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
    cb_tool_format tool_format;  /* the chat template's tool-call format (toolcall.c) */
    void *chat_work;             /* a chat template's render [chat_work_cap]; NULL without one */
    size_t chat_work_cap;
    int32_t *ids;                /* /tokenize and /detokenize [scratch_cap] */
    char *response;              /* [CB_RESPONSE_BYTES] */
    char *translated;            /* a /v1/responses body as a chat request [translated_cap] */
    size_t translated_cap;
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
    /* A refused request's error "param" and "code" beside its message (NULL: null). */
    const char *err_param, *err_code;
    char err_param_text[256];    /* a param built for one refusal (err_param points here) */
    int32_t think_open, think_close; /* the template's thinking markers as tokens; -1: none */
    int think_label;                 /* Gemma 4: a channel's name follows think_open, up to a newline */
    int harmony;                 /* gpt-oss channels are split (reasoning.c) */
    int32_t harmony_tok[5];      /* <|start|> <|channel|> <|message|> <|end|> <|constrain|> */
    const cb_slot **list;        /* [n_slots]: the slots of a finished list of prompts, in order */
    const char *const *cors_origins; /* --cors-origin values ("*": any); NULL: no CORS */
    int n_cors_origins;
    int prefix_cache;            /* reuse a free slot's cached prefix (off: --no-prefix-cache) */
    int llama_attn;              /* the engine's KV cache is f16-llama: attention by micro-batch (engine.h) */
    /* tool_choice "required"/named: the call's JSON Schema as cb_tool_constraint
     * writes it, and its tokens for cb_con_compile (a model with a known format) */
    char *tool_schema;           /* [CB_TOOL_SCHEMA_BYTES] */
    cb_json_tok *tool_toks;      /* [CB_TOOL_SCHEMA_TOKENS] */
    uint64_t admissions;         /* requests given a slot so far (cb_slot.used_at) */
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
/* responses.c: a /v1/responses body into r (through the chat request it
 * means): 0, or an HTTP status with a message in err. */
int cb_responses_read(cb_app *a, cb_request *r, const char *body, size_t len, char *err, size_t err_len);
/* Prompt `choice` of a list (after cb_request_read() read the body and
 * prompt 0 into first): q gets first's settings and that prompt; with n,
 * first's prompt and the choice's own seed. */
int cb_request_next_prompt(cb_app *a, cb_request *q, const cb_request *first, const char *body, int choice,
                           char *err, size_t err_len);

/* reasoning.c: thinking text as reasoning_content, where the chat template
 * marks it (Qwen3's <think>...</think>). */
enum { CB_THINK_NONE, CB_THINK_START, CB_THINK_REASONING, CB_THINK_CONTENT };
void cb_reasoning_init(cb_app *a);
/* The request's starting point: inside a thinking block when its prompt's
 * last marker opens one (q->reasoning); a slot's state from it. */
void cb_reasoning_request(const cb_app *a, cb_request *q);
void cb_reasoning_slot(const cb_app *a, cb_slot *st);
/* Whether a generated token is a marker that switches the slot's state (its
 * text then goes nowhere); the caller releases the held text first, then
 * calls cb_reasoning_switch(). A first token that opens no block settles
 * the answer as content. */
int cb_reasoning_marker(const cb_app *a, cb_slot *st, int32_t token);
void cb_reasoning_switch(cb_app *a, cb_slot *st, int32_t token);
/* Bytes at the start of text[0..n) to drop: the newlines that open a region. */
size_t cb_reasoning_skip(cb_slot *st, const char *text, size_t n);
/* Whether token is text of a gpt-oss message header (then kept aside, not
 * released). */
int cb_harmony_header(const cb_app *a, cb_slot *st, int32_t token);

/* cors.c: the Access-Control-* lines of an answer to this request ("" when
 * none), and the preflight answer. */
void cb_cors_headers(const cb_app *a, const cb_http_request *req, char *out, size_t cap);
int cb_cors_preflight(cb_app *a, cb_conn *c, const cb_http_request *req);

/* prefix_cache.c. The free slot a request q goes to, -1 when none is free;
 * *reuse: the positions of its KV cache that q takes as they are. */
int cb_prefix_pick(const cb_app *a, const cb_request *q, int *reuse);
/* Slot s, given q with reuse positions: what those positions contributed
 * to the answer (expert counts) is restored as if they had been fed. */
void cb_prefix_reuse(cb_app *a, int s, int reuse);
/* Slot s is being freed: remember what its KV cache holds, the tokens fed
 * so far (before its request goes back to the pool). */
void cb_prefix_keep(cb_app *a, int s);
/* Slot s's KV cache holds nothing usable (a step that faulted or failed
 * wrote garbage into it). */
void cb_prefix_forget(cb_app *a, int s);

/* response.c */
/* An OpenAI-shaped error with its param and code (NULL: null). */
void cb_respond_error_ex(cb_app *a, cb_conn *c, int status, const char *type, const char *param, const char *code,
                         const char *message);
void cb_respond_json(cb_app *a, cb_conn *c, int status, cb_jw *w);
void cb_respond_error(cb_app *a, cb_conn *c, int status, const char *type, const char *message);
/* The whole answer of a finished non-streaming request. */
void cb_respond_final(cb_app *a, cb_conn *c, const cb_slot *st);
/* The same for a list of prompts: a choice per slot of sts, in order; usage
 * and expert activations of last, which finished last and holds the
 * others' counts. */
void cb_respond_final_list(cb_app *a, cb_conn *c, const cb_slot *const *sts, int n, const cb_slot *last);
/* A list's prompt finished while others run: its last chunk, no [DONE]. */
int cb_stream_finish_choice(cb_app *a, cb_conn *c, const cb_slot *st);
/* Stream pieces; each returns CB_CONN_OK or the netloop error. */
int cb_stream_delta(cb_app *a, cb_conn *c, cb_slot *st, const char *text, size_t len, int token);
int cb_stream_finish(cb_app *a, cb_conn *c, cb_slot *st);
/* A content delta without the opening role; token >= 0 carries that
 * token's logprobs (when asked for), -1 none. */
int cb_stream_content(cb_app *a, cb_conn *c, cb_slot *st, const char *text, size_t len, int token);
/* A tool call as OpenAI streams it: a delta with its index, id, type and
 * name (arguments ""), then one with the arguments. */
int cb_stream_tool_call(cb_app *a, cb_conn *c, cb_slot *st, int index, const char *name, size_t name_len,
                        const char *args, size_t args_len);
/* Ends a started stream with an OpenAI-shaped error event (server_error),
 * then [DONE]; a Responses stream with response.failed. */
int cb_stream_error(cb_app *a, cb_conn *c, cb_slot *st, const char *message);
/* Pieces the Responses answer shares: the server's timings, expert
 * activations, the trace, a call's id. */
void cb_write_timings(cb_jw *w, const cb_slot *st);
void cb_write_expert_activations(cb_app *a, cb_jw *w, const cb_slot *st);
void cb_write_trace(cb_app *a, cb_jw *w, const cb_slot *st);
void cb_tool_call_id(const cb_request *q, int index, char out[16]);

/* responses.c: the answer of /v1/responses and its stream events. */
void cb_responses_final(cb_app *a, cb_conn *c, const cb_slot *st);
/* Text released: the opening (token < 0, no text), or a delta of the
 * reasoning or the message (by the slot's thinking state). */
int cb_responses_stream_text(cb_app *a, cb_conn *c, cb_slot *st, const char *text, size_t len, int token);
/* Call `index` (kept in the slot) as a function_call item. */
int cb_responses_stream_call(cb_app *a, cb_conn *c, cb_slot *st, int index);
int cb_responses_stream_finish(cb_app *a, cb_conn *c, cb_slot *st);
int cb_responses_stream_error(cb_app *a, cb_conn *c, cb_slot *st, const char *message);

#endif
