/* Tool calls in a model's output: which format a chat template asks for,
 * and an incremental parser that splits generated text into content and
 * OpenAI tool calls (name, arguments as JSON text).
 *
 * The parser reads the whole text generated so far (it only grows) and
 * remembers how far it got, so each byte is looked at a bounded number of
 * times; it allocates nothing (a caller's scratch buffer and JSON token
 * array). Text that may begin a call is held back until it is known; a call
 * is handed out only once complete and valid, so a malformed or unterminated
 * call comes out as plain content, streamed or not. */
#ifndef CB_TOOLCALL_H
#define CB_TOOLCALL_H

#include <stddef.h>

#include "json.h"

typedef enum {
    CB_TOOLFMT_NONE = 0, /* unknown: tools are refused */
    CB_TOOLFMT_HERMES,   /* <tool_call>{"name": ..., "arguments": {...}}</tool_call> (Qwen2.5, Qwen3, Granite) */
    CB_TOOLFMT_XML,      /* <tool_call><function=NAME><parameter=P>v</parameter></function></tool_call> (Qwen3-Coder) */
    CB_TOOLFMT_MISTRAL,  /* [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...] or [TOOL_CALLS]NAME[ARGS]{...} */
    CB_TOOLFMT_LLAMA3,   /* {"name": ..., "parameters": {...}} as the whole answer, or after <|python_tag|> */
    CB_TOOLFMT_HARMONY,  /* gpt-oss: ...to=functions.NAME ...<|message|>{args}<|call|> */
    CB_TOOLFMT_GLM,      /* <tool_call>NAME<arg_key>K</arg_key><arg_value>v</arg_value>...</tool_call> (GLM-4.5..4.7) */
    CB_TOOLFMT_DEEPSEEK, /* <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>...
                          * <｜tool▁calls▁end｜> (DeepSeek V3.1; V3 and R1 write function<｜tool▁sep｜>NAME and
                          * the arguments in a ```json fence) */
    CB_TOOLFMT_KIMI,     /* <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>
                          * {...}<|tool_call_end|>...<|tool_calls_section_end|> (Kimi K2) */
    CB_TOOLFMT_MINIMAX,  /* <minimax:tool_call><invoke name="NAME"><parameter name="K">v</parameter>...</invoke>...
                          * </minimax:tool_call> (MiniMax-M2) */
    CB_TOOLFMT_GEMMA4,   /* <|tool_call>call:NAME{key:value,...}<tool_call|>, strings in <|"|> (Gemma 4) */
    CB_TOOLFMT_PYTHONIC, /* <|tool_call_start|>[NAME(key=value, ...), ...]<|tool_call_end|>, Python literals (LFM2) */
} cb_tool_format;
#define CB_TOOLFMT_LAST CB_TOOLFMT_PYTHONIC

/* A format whose arguments the parser builds as JSON from the text (XML
 * parameters, GLM's key/value pairs, Gemma 4's and Python's values):
 * escapes can make them longer. */
static inline int cb_tool_format_builds_args(cb_tool_format f) {
    return f == CB_TOOLFMT_XML || f == CB_TOOLFMT_GLM || f == CB_TOOLFMT_MINIMAX || f == CB_TOOLFMT_GEMMA4 ||
           f == CB_TOOLFMT_PYTHONIC;
}
/* A format that writes the function's name outside the JSON value (gpt-oss,
 * DeepSeek, Kimi): tool_choice "required" cannot be constrained unless the
 * request has one tool; a named function can. */
static inline int cb_tool_format_names_outside(cb_tool_format f) {
    return f == CB_TOOLFMT_HARMONY || f == CB_TOOLFMT_DEEPSEEK || f == CB_TOOLFMT_KIMI;
}

#define CB_MAX_TOOL_CALLS 64     /* per answer; a call past them ends the answer */
#define CB_TOOL_NAME_BYTES 256   /* longest function name */

/* The format a chat template's source asks for (rule in toolcall.c). */
cb_tool_format cb_tool_format_detect(const char *src, size_t n);
const char *cb_tool_format_name(cb_tool_format f);

typedef struct {
    void *ctx;
    /* Each returns 0, or -1 to stop (the parser then returns -1). */
    int (*content)(void *ctx, const char *s, size_t n);
    int (*call)(void *ctx, int index, const char *name, size_t name_n, const char *args, size_t args_n);
} cb_tool_sink;

typedef struct {
    cb_tool_format fmt;
    int max_calls;      /* calls wanted (1 without parallel_tool_calls) */
    int n_calls;
    int done;           /* max_calls reached: the rest of the text is ignored */
    size_t pos;         /* text consumed */
    size_t ws;          /* whitespace held just before pos */
    size_t emitted;     /* content bytes handed out */
    int in_call;
    size_t call_start, marker_len; /* the marker that began the call */
    size_t name_at, name_n;         /* the function name, where the format puts it before the value */
    size_t search;      /* where the next look for a call's end resumes */
    int stage;          /* within a call: which part is being looked for */
    size_t part;        /* start of that part */
    int depth, in_str, esc; /* bracket scanner over a JSON value */
    char *scratch;      /* unescaped names, built arguments */
    size_t scratch_cap;
    cb_json_tok *toks;
    int max_toks;
} cb_tool_parser;

void cb_tool_parser_init(cb_tool_parser *p, cb_tool_format fmt, int max_calls, char *scratch, size_t scratch_cap,
                         cb_json_tok *toks, int max_toks);
/* text[0..len): all the text so far (the bytes before the previous len
 * unchanged). final: no more text will come; what is held is settled.
 * Returns 0, or -1 when a sink callback asked to stop. */
int cb_tool_parser_feed(cb_tool_parser *p, const char *text, size_t len, int final, const cb_tool_sink *sink);

/* The constraint that forces a call, for tool_choice "required" (name
 * NULL: any of the tools) or a named function, in format fmt: the literal
 * prefix, the JSON Schema of the JSON value that follows (the call object,
 * or for harmony the arguments), and the literal suffix, as constrain.h
 * takes them. tools: the request's "tools" array, toks[tools] of json.
 * Returns 0, or -1 when fmt cannot be constrained so (Qwen3-Coder's XML is
 * no JSON; cb_tool_format_names_outside's formats need a name, or a single
 * tool), the name is no tool's, or a buffer is too small. */
int cb_tool_constraint(cb_tool_format fmt, const char *json, const cb_json_tok *toks, int tools, const char *name,
                       char *prefix, size_t prefix_cap, char *schema, size_t schema_cap, char *suffix,
                       size_t suffix_cap);

#endif
