/* SHA-256 (FIPS 180-4), streamed: what model-config.json's weights.sha256
 * records of the weights file (toolkit/weights.py writes it with hashlib),
 * checked by colibri-server --verify. */
#ifndef CB_SHA256_H
#define CB_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint32_t h[8];
    uint64_t bytes;     /* hashed so far */
    uint8_t block[64];  /* a partial block, block_len bytes */
    size_t block_len;
} cb_sha256;

void cb_sha256_init(cb_sha256 *s);
void cb_sha256_update(cb_sha256 *s, const void *data, size_t len);
void cb_sha256_final(cb_sha256 *s, uint8_t digest[32]);
/* Lowercase hex of a digest, NUL-terminated. */
void cb_sha256_hex(const uint8_t digest[32], char hex[65]);

/* Hashes the file at path, read in binary in 1 MiB pieces (never whole in
 * memory), into hex. progress (may be NULL) is called after each piece with
 * the bytes read so far. Returns 0, or -1 with the path and reason in err. */
int cb_sha256_file(const char *path, char hex[65], uint64_t *bytes, void (*progress)(void *ctx, uint64_t done),
                   void *ctx, char *err, size_t err_len);

#endif
