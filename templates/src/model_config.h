/* model-config.json as the engine reads it. The config is the model folder's
 * description: it names the weights file, its type and its sha256, and its
 * shape is what a server is built for. The weights header repeats the shape;
 * the engine refuses a folder where the two differ (a weights file swapped
 * or a config edited after conversion). The full schema is checked by the
 * toolkit (toolkit/schema/model-config.schema.json, colibri-build verify);
 * here only the fields the engine compares or uses, strictly typed. */
#ifndef CB_MODEL_CONFIG_H
#define CB_MODEL_CONFIG_H

#include <stddef.h>

#include "dims.h"
#include "weights.h"

#define CB_MODEL_CONFIG_FILE "model-config.json"

/* rope.scaling as llama.cpp's RoPE takes it: f16-llama rebuilds the cos/sin
 * tables that way (engine.c). The weights header holds the frequencies
 * the toolkit worked out instead. */
enum cb_rope_kind { CB_ROPE_PLAIN, CB_ROPE_LINEAR, CB_ROPE_YARN, CB_ROPE_OTHER };
typedef struct {
    uint32_t kind;            /* enum cb_rope_kind */
    uint32_t orig_ctx;        /* YaRN's original_max_position_embeddings */
    float factor, beta_fast, beta_slow;
} cb_rope_scaling;

typedef struct {
    char path[4096];          /* model_dir/model-config.json (or where an embedded one lies), for messages */
    char name[64];
    char weights_file[1024];  /* weights.file, relative to the model folder */
    char sha256[65];          /* weights.sha256, lowercase hex; "" when absent */
    cb_dims dims;             /* as the weights header records them */
    uint32_t tok_kind, bos_id, eos_id; /* enum cb_tokenizer_kind; CB_NO_TOKEN if null or absent */
    cb_rope_scaling rope_scaling;
    uint32_t kv_cache;        /* enum cb_kv_type: "kv_cache", the model's default; CB_KV_AUTO when absent */
} cb_model_config;

/* Reads and checks model_dir/model-config.json: valid JSON, an object, every
 * field the engine needs present with the right type and a known value.
 * Returns 0, or -1 with a message naming the file, the field and what was
 * wrong in err. */
int cb_model_config_load(cb_model_config *c, const char *model_dir, char *err, size_t err_len);
/* The same checks of a config's text (len bytes, text[len] == 0) from
 * elsewhere (an executable that carries its model); label names it in
 * messages. */
int cb_model_config_parse(cb_model_config *c, const char *text, size_t len, const char *label, char *err,
                          size_t err_len);

/* Compares the config with the weights header (at weights_path): name,
 * shape, types and tokenizer. Returns 0, or -1 naming the first field that
 * differs and both values. */
int cb_model_config_check(const cb_model_config *c, const cb_weights_header *h, const char *weights_path,
                          char *err, size_t err_len);

/* model_dir joined with weights.file into out; -1 (message in err) when it
 * does not fit. */
int cb_model_config_weights_path(const cb_model_config *c, const char *model_dir, char *out, size_t cap,
                                 char *err, size_t err_len);

#endif
