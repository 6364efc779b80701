/* The memory pool: every buffer the engine uses comes out of one block
 * allocated at start-up. Buffers are carved twice: a sizing pass (base NULL)
 * that only counts bytes, then the real pass over the allocated block. */
#ifndef CB_ARENA_H
#define CB_ARENA_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint8_t *base;   /* NULL during the sizing pass */
    size_t used;
    size_t cap;
} cb_arena;

/* 64-byte aligned, zeroed bytes; NULL in the sizing pass or when full. */
void *cb_arena_take(cb_arena *a, size_t bytes);
/* Allocates the block for a sized arena; returns 0 or -1. */
int cb_arena_allocate(cb_arena *a);
void cb_arena_release(cb_arena *a);

#endif
