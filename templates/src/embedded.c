#include "embedded.h"

#include <stdio.h>
#include <string.h>

#include "sha256.h"

#define MAX_SMALL_PART (64u << 20)  /* a config or tokenizer larger than this is not one */
#define SCAN_LIMIT (256ull << 20)   /* an executable image is a few MiB: look no further for the first record */

static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }

typedef struct {
    uint32_t version, record_bytes;
    uint64_t file_bytes, image_bytes, alignment;
    uint64_t config_offset, config_bytes, tokenizer_offset, tokenizer_bytes, weights_offset, weights_bytes;
    const uint8_t *config_sha256, *tokenizer_sha256, *weights_sha256;
} record;

/* A record at p: the magic and its own checksum. (The magic alone also
 * lies in this program's constants; the checksum tells a record.) */
static int parse_record(const uint8_t *p, record *r) {
    if (memcmp(p, CB_EMBED_MAGIC, 16) != 0) return 0;
    cb_sha256 s;
    uint8_t digest[32];
    cb_sha256_init(&s);
    cb_sha256_update(&s, p, CB_EMBED_RECORD_BYTES - 32);
    cb_sha256_final(&s, digest);
    if (memcmp(digest, p + CB_EMBED_RECORD_BYTES - 32, 32) != 0) return 0;
    r->version = get32(p + 16);
    r->record_bytes = get32(p + 20);
    r->file_bytes = get64(p + 24);
    r->image_bytes = get64(p + 32);
    r->alignment = get64(p + 40);
    r->config_offset = get64(p + 48);
    r->config_bytes = get64(p + 56);
    r->tokenizer_offset = get64(p + 64);
    r->tokenizer_bytes = get64(p + 72);
    r->weights_offset = get64(p + 80);
    r->weights_bytes = get64(p + 88);
    r->config_sha256 = p + 96;
    r->tokenizer_sha256 = p + 128;
    r->weights_sha256 = p + 160;
    return 1;
}

static uint64_t payload_start(uint64_t image_bytes) {
    return (image_bytes + CB_EMBED_GRANULE - 1) / CB_EMBED_GRANULE * CB_EMBED_GRANULE;
}

/* The record's parts against the file and each other: in order, inside the
 * file between the two records, the weights aligned. NULL, or what is wrong. */
static const char *check_layout(const record *r, uint64_t size, char *why, size_t len) {
    const uint64_t first = payload_start(r->image_bytes) + CB_EMBED_RECORD_BYTES, last = size - CB_EMBED_RECORD_BYTES;
    const struct {
        const char *name;
        uint64_t offset, bytes;
    } parts[] = {{"model-config.json", r->config_offset, r->config_bytes},
                 {"tokenizer.cbt", r->tokenizer_offset, r->tokenizer_bytes},
                 {"weights", r->weights_offset, r->weights_bytes}};
    uint64_t at = first;
    for (int i = 0; i < 3; i++) {
        if (i == 1 && parts[i].bytes == 0) continue; /* no tokenizer */
        if (parts[i].offset < at || parts[i].offset > last || parts[i].bytes == 0 ||
            parts[i].bytes > last - parts[i].offset) {
            snprintf(why, len, "%s at bytes %llu..%llu, outside %llu..%llu or overlapping what precedes it",
                     parts[i].name, (unsigned long long)parts[i].offset,
                     (unsigned long long)(parts[i].offset + parts[i].bytes), (unsigned long long)at,
                     (unsigned long long)last);
            return why;
        }
        at = parts[i].offset + parts[i].bytes;
    }
    if (r->config_bytes > MAX_SMALL_PART || r->tokenizer_bytes > MAX_SMALL_PART) {
        snprintf(why, len, "model-config.json or tokenizer.cbt larger than %u MiB", MAX_SMALL_PART >> 20);
        return why;
    }
    const uint64_t a = r->alignment;
    if (a < 4096 || (a & (a - 1)) || r->weights_offset % a || r->weights_offset % CB_EMBED_GRANULE) {
        snprintf(why, len, "weights offset %llu, alignment %llu (expected a power of two >= 4096 dividing the "
                 "offset, and the offset a multiple of %u)", (unsigned long long)r->weights_offset,
                 (unsigned long long)a, CB_EMBED_GRANULE);
        return why;
    }
    return NULL;
}

static int sha_matches(const uint8_t *data, size_t len, const uint8_t *want) {
    cb_sha256 s;
    uint8_t got[32];
    cb_sha256_init(&s);
    cb_sha256_update(&s, data, len);
    cb_sha256_final(&s, got);
    return memcmp(got, want, 32) == 0;
}

/* No record at the end: the first one after the image, if any, tells a
 * damaged payload from none. Returns 0 (none) or -1, with the message. */
static int no_trailer(cb_embedded *m, char *err, size_t err_len) {
    const uint64_t size = m->file.size;
    record r;
    for (uint64_t off = CB_EMBED_GRANULE; off < SCAN_LIMIT && off + CB_EMBED_RECORD_BYTES <= size;
         off += CB_EMBED_GRANULE) {
        if (!parse_record(m->file.data + off, &r) || payload_start(r.image_bytes) != off) continue;
        snprintf(err, err_len, "%s: carries a model (its record at byte %llu) but is %llu bytes long where the "
                 "record says %llu: %s; build it again (colibri-build --embed-weights) or copy it whole",
                 m->label, (unsigned long long)off, (unsigned long long)size, (unsigned long long)r.file_bytes,
                 size < r.file_bytes ? "truncated"
                 : size > r.file_bytes ? "bytes were appended after it (a signing tool?)"
                                       : "the record at its end is damaged");
        return -1;
    }
    snprintf(err, err_len, "%s carries no model (colibri-build --embed-weights builds one that does; strip "
             "removes it)", m->label);
    return 0;
}

int cb_embedded_open(cb_embedded *m, char *err, size_t err_len) {
    memset(m, 0, sizeof *m);
    snprintf(m->label, sizeof m->label, "%s", cb_self_exe_path()[0] ? cb_self_exe_path() : "this executable");
    if (cb_map_file_range(NULL, 0, 0, &m->file, err, err_len) != 0) return -1;
    /* Touch only the pages read here: no read-around into the weights. */
    cb_map_advise_random(m->file.data, m->file.size);
    const uint64_t size = m->file.size;
    record r;
    if (size < 2 * CB_EMBED_RECORD_BYTES || !parse_record(m->file.data + size - CB_EMBED_RECORD_BYTES, &r)) {
        const int status = no_trailer(m, err, err_len);
        cb_embedded_close(m);
        return status;
    }
    char why[512];
    const char *bad = NULL;
    const uint64_t start = payload_start(r.image_bytes);
    if (r.version != CB_EMBED_VERSION || r.record_bytes != CB_EMBED_RECORD_BYTES) {
        snprintf(why, sizeof why, "embedded model format version %u (record of %u bytes), this server reads "
                 "version %d; build it again with this colibri-build", r.version, r.record_bytes, CB_EMBED_VERSION);
        bad = why;
    }
    else if (r.file_bytes != size)
        bad = (snprintf(why, sizeof why, "the record at its end says the file is %llu bytes, it is %llu",
                        (unsigned long long)r.file_bytes, (unsigned long long)size), why);
    else if (r.image_bytes == 0 || start + 2 * CB_EMBED_RECORD_BYTES > size ||
             memcmp(m->file.data + start, m->file.data + size - CB_EMBED_RECORD_BYTES, CB_EMBED_RECORD_BYTES) != 0)
        bad = (snprintf(why, sizeof why, "the record after the executable image (byte %llu) differs from the one "
                        "at its end (overwritten?)", (unsigned long long)start), why);
    else bad = check_layout(&r, size, why, sizeof why);
    if (!bad && !sha_matches(m->file.data + r.config_offset, (size_t)r.config_bytes, r.config_sha256))
        bad = "model-config.json's bytes do not match their sha256 in the record (overwritten?)";
    if (!bad && r.tokenizer_bytes &&
        !sha_matches(m->file.data + r.tokenizer_offset, (size_t)r.tokenizer_bytes, r.tokenizer_sha256))
        bad = "tokenizer.cbt's bytes do not match their sha256 in the record (overwritten?)";
    if (bad) {
        snprintf(err, err_len, "%s: its embedded model is damaged: %s", m->label, bad);
        cb_embedded_close(m);
        return -1;
    }
    m->file_bytes = r.file_bytes;
    m->image_bytes = r.image_bytes;
    m->alignment = r.alignment;
    m->config = m->file.data + r.config_offset;
    m->config_bytes = (size_t)r.config_bytes;
    m->tokenizer = r.tokenizer_bytes ? m->file.data + r.tokenizer_offset : NULL;
    m->tokenizer_bytes = (size_t)r.tokenizer_bytes;
    m->weights_offset = r.weights_offset;
    m->weights_bytes = r.weights_bytes;
    cb_sha256_hex(r.weights_sha256, m->weights_sha256);
    return 1;
}

void cb_embedded_close(cb_embedded *m) {
    cb_unmap_file(&m->file);
    m->config = m->tokenizer = NULL;
}
