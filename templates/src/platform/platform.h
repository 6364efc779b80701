/* What differs between operating systems, behind one small interface:
 * file mapping, threads, clocks, CPU count, shutdown signals. Sockets are in
 * net.h. The rest of the engine has no OS #ifdefs. */
#ifndef CB_PLATFORM_H
#define CB_PLATFORM_H

#include <stddef.h>
#include <stdint.h>

/* A read-only mapping of a whole file; pages are read in on first touch. */
typedef struct {
    const uint8_t *data;
    uint64_t size;
    intptr_t handle;   /* OS handle kept for unmapping */
} cb_mapped_file;

/* Returns 0, or -1 with a message naming the path and reason in err. */
int cb_map_file(const char *path, cb_mapped_file *out, char *err, size_t err_len);
void cb_unmap_file(cb_mapped_file *m);
/* Hints for a mapped range: read ahead soon (dense weights), or read only
 * the pages touched (experts, so unrouted experts stay on disk). */
void cb_map_advise_willneed(const void *addr, size_t len);
void cb_map_advise_random(const void *addr, size_t len);
/* Asks for the range (a file mapping, or allocated memory) to be backed by
 * 2 MiB pages where the system can: a fault on a file mapping then reads
 * the aligned 2 MiB around it (where its page cache can hold such pages),
 * on memory it takes a whole zeroed 2 MiB page. 0 when the system took the
 * advice (Linux with transparent huge pages and 4 KiB base pages), else -1
 * and nothing changes. */
int cb_map_advise_huge(const void *addr, size_t len);

typedef struct cb_thread cb_thread;
cb_thread *cb_thread_start(void (*fn)(void *), void *arg);
void cb_thread_join(cb_thread *t);

typedef struct cb_mutex cb_mutex;
typedef struct cb_cond cb_cond;
cb_mutex *cb_mutex_create(void);
void cb_mutex_destroy(cb_mutex *m);
void cb_mutex_lock(cb_mutex *m);
void cb_mutex_unlock(cb_mutex *m);
cb_cond *cb_cond_create(void);
void cb_cond_destroy(cb_cond *c);
void cb_cond_wait(cb_cond *c, cb_mutex *m);
void cb_cond_broadcast(cb_cond *c);
/* Lets the other hyper-thread or core run while spinning. */
void cb_cpu_relax(void);
/* Gives the CPU to another runnable thread, if any (a waiter on a busy,
 * shared machine must not burn the time slice of the thread it waits for). */
void cb_thread_yield(void);

int cb_cpu_count(void);
/* Monotonic time in nanoseconds. */
uint64_t cb_now_ns(void);

/* Today's local date as "YYYY-MM-DD" (10 characters and a NUL). */
void cb_local_date(char out[11]);

/* Calls on_stop (from a signal or console handler: it may only set a flag)
 * on SIGINT/SIGTERM (Ctrl-C / close on Windows). */
void cb_install_stop_handler(void (*on_stop)(void));

/* Bytes of 64-byte-aligned memory, zeroed; NULL on failure. Used only at
 * start-up by the arena. */
void *cb_aligned_alloc(size_t bytes);
void cb_aligned_free(void *p);

#endif
