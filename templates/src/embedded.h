/* A model carried by the executable itself (colibri-build --embed-weights,
 * toolkit/embed.py writes it). After the linked executable ("the image"):
 *
 *   image | zeros to 64 KiB | record | model-config.json | tokenizer.cbt |
 *   zeros to the weights' alignment | weights.cbw | record
 *
 * The record (little-endian, CB_EMBED_RECORD_BYTES) says where each part
 * lies, its sha256, and how long the whole file is; its own last 32 bytes
 * are the sha256 of the rest. The copy at the very end is what the server
 * reads; the copy after the image is found (scanning 64 KiB boundaries)
 * when the end is missing, so a truncated file is told from one that never
 * carried a model. The weights start on a multiple of 64 KiB (Windows maps
 * views from there) and of their own alignment (2 MiB pages stay aligned),
 * so they map from the executable as from their own file, paged in on first
 * touch. */
#ifndef CB_EMBEDDED_H
#define CB_EMBEDDED_H

#include <stddef.h>
#include <stdint.h>

#include "platform/platform.h"

#define CB_EMBED_MAGIC "COLIBRI-MODEL\0\0\0" /* 16 bytes */
#define CB_EMBED_VERSION 1
#define CB_EMBED_RECORD_BYTES 256
#define CB_EMBED_GRANULE (64u << 10) /* the payload and the weights start on multiples of it */

typedef struct {
    cb_mapped_file file;          /* the whole executable (nothing is read but what is named here) */
    char label[4200];             /* "<executable>", for messages */
    uint64_t file_bytes, image_bytes, alignment;
    const uint8_t *config;        /* model-config.json's bytes */
    size_t config_bytes;
    const uint8_t *tokenizer;     /* tokenizer.cbt's bytes; NULL when the model has none */
    size_t tokenizer_bytes;
    uint64_t weights_offset, weights_bytes;
    char weights_sha256[65];      /* of the weights' bytes, lowercase hex */
} cb_embedded;

/* Looks for the model this executable carries. 1: found, every offset and
 * size checked against the file and the config's and tokenizer's sha256
 * against the record; 0: it carries none (err says so); -1: it carries one
 * that is damaged (truncated, appended to, overwritten), err naming what.
 * Close with cb_embedded_close() after 1. */
int cb_embedded_open(cb_embedded *m, char *err, size_t err_len);
void cb_embedded_close(cb_embedded *m);

#endif
