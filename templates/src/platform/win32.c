/* Windows implementation of platform.h (MinGW-w64, Windows 7 and later; runs
 * under wine). Only Win32 calls and the system C runtime: no winpthread, so
 * the static executable imports nothing outside Windows itself. */
#define WIN32_LEAN_AND_MEAN
#ifndef _WIN32_WINNT
#define _WIN32_WINNT 0x0601 /* Windows 7: condition variables, GetTickCount64 */
#endif
#include "platform.h"

#include <windows.h>

#include <malloc.h>
#include <process.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* GetLastError() as text (English where the system has it), no trailing newline. */
static const char *win_error(DWORD code, char *buf, size_t len) {
    DWORD n = FormatMessageA(FORMAT_MESSAGE_FROM_SYSTEM | FORMAT_MESSAGE_IGNORE_INSERTS, NULL, code,
                             MAKELANGID(LANG_ENGLISH, SUBLANG_DEFAULT), buf, (DWORD)len, NULL);
    if (n == 0) snprintf(buf, len, "Windows error %lu", (unsigned long)code);
    else
        while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == '.')) buf[--n] = 0;
    return buf;
}

const char *cb_self_exe_path(void) {
    static char path[4 * MAX_PATH]; /* start-up only, from the loading thread */
    static wchar_t wide[32768]; /* start-up only; 64 KiB is too much for a stack */
    if (path[0]) return path;
    DWORD n = GetModuleFileNameW(NULL, wide, sizeof wide / sizeof wide[0]);
    if (n == 0 || n >= sizeof wide / sizeof wide[0] ||
        WideCharToMultiByte(CP_UTF8, 0, wide, (int)n + 1, path, (int)sizeof path, NULL, NULL) == 0)
        path[0] = 0;
    return path;
}

/* The running executable, opened by its wide path (any characters). */
static HANDLE open_self(void) {
    static wchar_t wide[32768]; /* start-up only; 64 KiB is too much for a stack */
    DWORD n = GetModuleFileNameW(NULL, wide, sizeof wide / sizeof wide[0]);
    if (n == 0 || n >= sizeof wide / sizeof wide[0]) return INVALID_HANDLE_VALUE;
    /* The loader holds the image open for reading and executing: share both
     * (and delete, so an update can rename it while it runs). */
    return CreateFileW(wide, GENERIC_READ, FILE_SHARE_READ | FILE_SHARE_DELETE, NULL, OPEN_EXISTING,
                       FILE_ATTRIBUTE_NORMAL, NULL);
}

int cb_map_file(const char *path, cb_mapped_file *out, char *err, size_t err_len) {
    return cb_map_file_range(path, 0, 0, out, err, err_len);
}

int cb_map_file_range(const char *path, uint64_t offset, uint64_t size, cb_mapped_file *out, char *err,
                      size_t err_len) {
    char why[256];
    const int whole = offset == 0 && size == 0;
    const char *name = path ? path : cb_self_exe_path();
    memset(out, 0, sizeof *out);
    HANDLE file = path ? CreateFileA(path, GENERIC_READ, FILE_SHARE_READ, NULL, OPEN_EXISTING, FILE_ATTRIBUTE_NORMAL,
                                     NULL)
                       : open_self();
    if (file == INVALID_HANDLE_VALUE) {
        snprintf(err, err_len, "%s: cannot open: %s", name, win_error(GetLastError(), why, sizeof why));
        return -1;
    }
    LARGE_INTEGER file_size;
    if (!GetFileSizeEx(file, &file_size) || file_size.QuadPart <= 0) {
        snprintf(err, err_len, "%s: empty or unreadable file", name);
        CloseHandle(file);
        return -1;
    }
    const uint64_t total = (uint64_t)file_size.QuadPart;
    if (whole) size = total;
    if (size == 0 || offset > total || size > total - offset) {
        snprintf(err, err_len, "%s: bytes %llu..%llu lie outside the file of %llu bytes (truncated?)", name,
                 (unsigned long long)offset, (unsigned long long)(offset + size), (unsigned long long)total);
        CloseHandle(file);
        return -1;
    }
    /* A view starts on the allocation granularity (64 KiB). */
    SYSTEM_INFO si;
    GetSystemInfo(&si);
    const uint64_t skip = offset % si.dwAllocationGranularity, start = offset - skip;
    if (size + skip > (uint64_t)SIZE_MAX) {
        snprintf(err, err_len, "%s: %llu bytes do not fit in this process's address space", name,
                 (unsigned long long)size);
        CloseHandle(file);
        return -1;
    }
    HANDLE mapping = CreateFileMappingA(file, NULL, PAGE_READONLY, 0, 0, NULL);
    void *p = mapping ? MapViewOfFile(mapping, FILE_MAP_READ, (DWORD)(start >> 32), (DWORD)start,
                                      (SIZE_T)(size + skip))
                      : NULL;
    DWORD code = GetLastError();
    /* The view keeps the mapping and the file open (as mmap does after close). */
    if (mapping) CloseHandle(mapping);
    CloseHandle(file);
    if (!p) {
        snprintf(err, err_len, "%s: cannot map: %s", name, win_error(code, why, sizeof why));
        return -1;
    }
    out->base = p;
    out->base_size = size + skip;
    out->data = out->base + skip;
    out->size = size;
    return 0;
}

void cb_unmap_file(cb_mapped_file *m) {
    if (m->base) UnmapViewOfFile(m->base);
    memset(m, 0, sizeof *m);
}

/* PrefetchVirtualMemory is Windows 8+: looked up at run time so the
 * executable still loads on Windows 7 and on wine versions without it. */
typedef struct { void *addr; size_t bytes; } cb_memory_range; /* WIN32_MEMORY_RANGE_ENTRY */
typedef BOOL(WINAPI *prefetch_fn)(HANDLE, ULONG_PTR, cb_memory_range *, ULONG);

void cb_map_advise_willneed(const void *addr, size_t len) {
    static prefetch_fn prefetch;
    static int looked_up;
    if (!looked_up) { /* start-up only, from the loading thread */
        HMODULE k32 = GetModuleHandleA("kernel32.dll");
        FARPROC f = k32 ? GetProcAddress(k32, "PrefetchVirtualMemory") : NULL;
        memcpy(&prefetch, &f, sizeof prefetch); /* function pointer cast without a warning */
        looked_up = 1;
    }
    if (!prefetch || len == 0) return;
    cb_memory_range range = {(void *)addr, len};
    prefetch(GetCurrentProcess(), 1, &range, 0);
}

/* Windows has no per-range random-access hint for mapped views; a view is
 * paged in on touch with small read-ahead, which is what experts want. */
void cb_map_advise_random(const void *addr, size_t len) { (void)addr; (void)len; }

/* Large pages on Windows are for committed memory, never for file views. */
int cb_map_advise_huge(const void *addr, size_t len) {
    (void)addr, (void)len;
    return -1;
}

struct cb_thread { HANDLE handle; void (*fn)(void *); void *arg; };
struct cb_mutex { CRITICAL_SECTION cs; };
struct cb_cond { CONDITION_VARIABLE cv; };

/* _beginthreadex (not CreateThread) so the C runtime sets up its per-thread state. */
static unsigned __stdcall thread_main(void *p) {
    cb_thread *t = p;
    t->fn(t->arg);
    return 0;
}

cb_thread *cb_thread_start(void (*fn)(void *), void *arg) {
    cb_thread *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->fn = fn;
    t->arg = arg;
    uintptr_t h = _beginthreadex(NULL, 0, thread_main, t, 0, NULL);
    if (h == 0) {
        free(t);
        return NULL;
    }
    t->handle = (HANDLE)h;
    return t;
}

void cb_thread_join(cb_thread *t) {
    WaitForSingleObject(t->handle, INFINITE);
    CloseHandle(t->handle);
    free(t);
}

cb_mutex *cb_mutex_create(void) {
    cb_mutex *m = calloc(1, sizeof *m);
    if (m) InitializeCriticalSection(&m->cs);
    return m;
}
void cb_mutex_destroy(cb_mutex *m) { DeleteCriticalSection(&m->cs); free(m); }
void cb_mutex_lock(cb_mutex *m) { EnterCriticalSection(&m->cs); }
void cb_mutex_unlock(cb_mutex *m) { LeaveCriticalSection(&m->cs); }
cb_cond *cb_cond_create(void) {
    cb_cond *c = calloc(1, sizeof *c);
    if (c) InitializeConditionVariable(&c->cv);
    return c;
}
void cb_cond_destroy(cb_cond *c) { free(c); } /* condition variables need no cleanup */
void cb_cond_wait(cb_cond *c, cb_mutex *m) { SleepConditionVariableCS(&c->cv, &m->cs, INFINITE); }
void cb_cond_broadcast(cb_cond *c) { WakeAllConditionVariable(&c->cv); }

void cb_cpu_relax(void) { YieldProcessor(); }
void cb_thread_yield(void) { SwitchToThread(); }

int cb_cpu_count(void) {
    /* All processor groups: Windows 11 spreads a process's threads over them. */
    DWORD n = GetActiveProcessorCount(ALL_PROCESSOR_GROUPS);
    if (n == 0) {
        SYSTEM_INFO si;
        GetSystemInfo(&si);
        n = si.dwNumberOfProcessors;
    }
    return n > 0 ? (int)n : 1;
}

uint64_t cb_now_ns(void) {
    static LARGE_INTEGER freq; /* fixed at boot; a racy first read writes the same value */
    LARGE_INTEGER now;
    if (freq.QuadPart == 0) QueryPerformanceFrequency(&freq);
    QueryPerformanceCounter(&now);
    uint64_t c = (uint64_t)now.QuadPart, f = (uint64_t)freq.QuadPart;
    /* Split so c * 1e9 cannot overflow (c reaches 2^63 / 1e9 in days at 10 MHz). */
    return c / f * 1000000000u + c % f * 1000000000u / f;
}

/* GetThreadTimes counts in scheduler ticks (~15.6 ms), too coarse for a token. */
uint64_t cb_thread_cpu_ns(void) { return cb_now_ns(); }

void cb_local_date(char out[11]) {
    SYSTEMTIME t;
    GetLocalTime(&t);
    snprintf(out, 11, "%04u-%02u-%02u", (unsigned)t.wYear % 10000u, (unsigned)t.wMonth % 100u, (unsigned)t.wDay % 100u);
}

static void (*stop_callback)(void);

/* Runs on a thread the system creates: Ctrl-C, Ctrl-Break, console closed,
 * logoff or shutdown all ask the server to stop. */
static BOOL WINAPI on_console_event(DWORD event) {
    (void)event;
    if (stop_callback) stop_callback();
    return TRUE;
}

void cb_install_stop_handler(void (*on_stop)(void)) {
    stop_callback = on_stop;
    SetConsoleCtrlHandler(on_console_event, TRUE);
}

void *cb_aligned_alloc(size_t bytes) {
    void *p = _aligned_malloc(bytes ? bytes : 64, 64);
    if (p) memset(p, 0, bytes);
    return p;
}
void cb_aligned_free(void *p) { _aligned_free(p); }
