/* POSIX implementation of platform.h (Linux, and other Unix-likes: macOS). */
#define _GNU_SOURCE
#include "platform.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifdef __APPLE__
#include <mach-o/dyld.h>
#endif

const char *cb_self_exe_path(void) {
    static char path[4096]; /* start-up only, from the loading thread */
    if (path[0]) return path;
#ifdef __APPLE__
    uint32_t cap = sizeof path;
    if (_NSGetExecutablePath(path, &cap) != 0) path[0] = 0;
#else
    ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
    path[n > 0 ? n : 0] = 0;
#endif
    return path;
}

int cb_map_file(const char *path, cb_mapped_file *out, char *err, size_t err_len) {
    return cb_map_file_range(path, 0, 0, out, err, err_len);
}

int cb_map_file_range(const char *path, uint64_t offset, uint64_t size, cb_mapped_file *out, char *err,
                      size_t err_len) {
    const int whole = offset == 0 && size == 0;
    memset(out, 0, sizeof *out);
    /* The running executable: /proc/self/exe is the file even when its path
     * has been renamed or replaced since the start. */
#ifdef __APPLE__
    const char *name = path ? path : cb_self_exe_path(), *open_path = name;
#else
    const char *name = path ? path : cb_self_exe_path(), *open_path = path ? path : "/proc/self/exe";
#endif
    int fd = open(open_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, err_len, "%s: cannot open: %s", name, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size <= 0) {
        snprintf(err, err_len, "%s: empty or unreadable file", name);
        close(fd);
        return -1;
    }
    const uint64_t file_size = (uint64_t)st.st_size;
    if (whole) size = file_size;
    if (size == 0 || offset > file_size || size > file_size - offset) {
        snprintf(err, err_len, "%s: bytes %llu..%llu lie outside the file of %llu bytes (truncated?)", name,
                 (unsigned long long)offset, (unsigned long long)(offset + size), (unsigned long long)file_size);
        close(fd);
        return -1;
    }
    const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), skip = offset % page;
    if (size + skip > (uint64_t)SIZE_MAX) {
        snprintf(err, err_len, "%s: %llu bytes do not fit in this process's address space", name,
                 (unsigned long long)size);
        close(fd);
        return -1;
    }
    void *p = mmap(NULL, (size_t)(size + skip), PROT_READ, MAP_PRIVATE, fd, (off_t)(offset - skip));
    close(fd); /* the mapping keeps the file alive */
    if (p == MAP_FAILED) {
        snprintf(err, err_len, "%s: cannot map: %s", name, strerror(errno));
        return -1;
    }
    out->base = p;
    out->base_size = size + skip;
    out->data = out->base + skip;
    out->size = size;
    return 0;
}

void cb_unmap_file(cb_mapped_file *m) {
    if (m->base) munmap((void *)m->base, (size_t)m->base_size);
    memset(m, 0, sizeof *m);
}

static int advise(const void *addr, size_t len, int advice) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t start = (uintptr_t)addr & ~(page - 1);
    uintptr_t end = (uintptr_t)addr + len;
    return end > start ? madvise((void *)start, end - start, advice) : -1;
}

void cb_map_advise_willneed(const void *addr, size_t len) { (void)advise(addr, len, MADV_WILLNEED); }
void cb_map_advise_random(const void *addr, size_t len) { (void)advise(addr, len, MADV_RANDOM); }

int cb_map_advise_huge(const void *addr, size_t len) {
#ifdef MADV_HUGEPAGE
    /* Only where a PMD page is 2 MiB (4 KiB base pages): on a 64 KiB-page
     * arm64 kernel it would be 512 MiB. */
    return sysconf(_SC_PAGESIZE) == 4096 && advise(addr, len, MADV_HUGEPAGE) == 0 ? 0 : -1;
#else
    (void)addr, (void)len;
    return -1;
#endif
}

struct cb_thread { pthread_t id; void (*fn)(void *); void *arg; };
struct cb_mutex { pthread_mutex_t m; };
struct cb_cond { pthread_cond_t c; };

static void *thread_main(void *p) {
    cb_thread *t = p;
    t->fn(t->arg);
    return NULL;
}

cb_thread *cb_thread_start(void (*fn)(void *), void *arg) {
    cb_thread *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->fn = fn;
    t->arg = arg;
    /* The kernels keep their scratch on the stack (the AVX-512 q8_0x4 GEMM
     * about 100 KB, matmul's staging up to 16 KB), so threads get glibc's default
     * 8 MB even where the C library gives less (musl, the zig builds: 128
     * KB). Only the pages touched cost memory. */
    pthread_attr_t attr;
    if (pthread_attr_init(&attr) != 0) {
        free(t);
        return NULL;
    }
    const int sized = pthread_attr_setstacksize(&attr, (size_t)8 << 20) == 0;
    const int started = pthread_create(&t->id, sized ? &attr : NULL, thread_main, t) == 0;
    pthread_attr_destroy(&attr);
    if (!started) {
        free(t);
        return NULL;
    }
    return t;
}

void cb_thread_join(cb_thread *t) {
    pthread_join(t->id, NULL);
    free(t);
}

cb_mutex *cb_mutex_create(void) {
    cb_mutex *m = calloc(1, sizeof *m);
    if (m) pthread_mutex_init(&m->m, NULL);
    return m;
}
void cb_mutex_destroy(cb_mutex *m) { pthread_mutex_destroy(&m->m); free(m); }
void cb_mutex_lock(cb_mutex *m) { pthread_mutex_lock(&m->m); }
void cb_mutex_unlock(cb_mutex *m) { pthread_mutex_unlock(&m->m); }
cb_cond *cb_cond_create(void) {
    cb_cond *c = calloc(1, sizeof *c);
    if (c) pthread_cond_init(&c->c, NULL);
    return c;
}
void cb_cond_destroy(cb_cond *c) { pthread_cond_destroy(&c->c); free(c); }
void cb_cond_wait(cb_cond *c, cb_mutex *m) { pthread_cond_wait(&c->c, &m->m); }
void cb_cond_broadcast(cb_cond *c) { pthread_cond_broadcast(&c->c); }

void cb_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

void cb_thread_yield(void) { sched_yield(); }

int cb_cpu_count(void) {
#ifdef __linux__ /* the CPUs this process may use (taskset, cgroups) */
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
#endif
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

uint64_t cb_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t cb_thread_cpu_ns(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return cb_now_ns();
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void cb_local_date(char out[11]) {
    time_t now = time(NULL);
    struct tm tm;
    if (!localtime_r(&now, &tm) || strftime(out, 11, "%Y-%m-%d", &tm) != 10) memcpy(out, "1970-01-01", 11);
}

static void (*stop_callback)(void);
static void on_signal(int sig) { (void)sig; if (stop_callback) stop_callback(); }

void cb_install_stop_handler(void (*on_stop)(void)) {
    stop_callback = on_stop;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

void *cb_aligned_alloc(size_t bytes) {
    /* calloc, not memset: a large block comes straight from mmap, already
     * zero, so a page is touched only when used (the KV cache of idle slots
     * costs neither start-up time nor RSS). The raw pointer is kept just
     * below the aligned one. */
    unsigned char *raw = calloc(1, bytes + 64 + sizeof(void *));
    if (!raw) return NULL;
    uintptr_t aligned = ((uintptr_t)raw + sizeof(void *) + 63) & ~(uintptr_t)63;
    ((void **)aligned)[-1] = raw;
    return (void *)aligned;
}
void cb_aligned_free(void *p) {
    if (p) free(((void **)p)[-1]);
}
