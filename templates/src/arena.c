#include "arena.h"

#include "platform/platform.h"

void *cb_arena_take(cb_arena *a, size_t bytes) {
    size_t start = (a->used + 63) & ~(size_t)63;
    a->used = start + bytes;
    if (!a->base) return NULL;
    if (a->used > a->cap) return NULL;
    return a->base + start;
}

int cb_arena_allocate(cb_arena *a) {
    a->cap = a->used;
    a->used = 0;
    a->base = cb_aligned_alloc(a->cap);
    return a->base ? 0 : -1;
}

void cb_arena_release(cb_arena *a) {
    if (a->base) cb_aligned_free(a->base);
    a->base = NULL;
    a->used = a->cap = 0;
}
