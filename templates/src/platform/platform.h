/* What differs between operating systems, behind one small interface:
 * file mapping, threads, clocks, CPU count, shutdown signals. Sockets are in
 * net.h. The rest of the engine has no OS #ifdefs. */
#ifndef CB_PLATFORM_H
#define CB_PLATFORM_H

#include <stddef.h>
#include <stdint.h>

/* A read-only mapping of a file, or of a range of one; pages are read in on
 * first touch. data/size: the range; base/base_size: what was mapped (the
 * range widened down to the system's mapping granularity). */
typedef struct {
    const uint8_t *data;
    uint64_t size;
    const uint8_t *base;
    uint64_t base_size;
} cb_mapped_file;

/* Maps the whole file. Returns 0, or -1 with a message naming the path and
 * reason in err. */
int cb_map_file(const char *path, cb_mapped_file *out, char *err, size_t err_len);
/* Maps bytes [offset, offset + size) of a file; path NULL: the running
 * executable (an executable that carries its model). The range must lie
 * inside the file; any offset is accepted (the mapping starts at the
 * granularity boundary below it, 64 KiB on Windows), but only an offset
 * aligned as the file's own pages keeps 2 MiB-aligned data 2 MiB-aligned. */
int cb_map_file_range(const char *path, uint64_t offset, uint64_t size, cb_mapped_file *out, char *err,
                      size_t err_len);
/* The running executable's path (UTF-8 on Windows), for messages; "" when
 * the system does not say. */
const char *cb_self_exe_path(void);
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
/* CPU time of the calling thread in nanoseconds, where the system counts it
 * finely (POSIX); elsewhere (Windows counts it in scheduler ticks) monotonic
 * time. A busy machine's other work is not in it. */
uint64_t cb_thread_cpu_ns(void);

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
