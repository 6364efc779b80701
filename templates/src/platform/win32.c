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

int cb_map_file(const char *path, cb_mapped_file *out, char *err, size_t err_len) {
    char why[256];
    memset(out, 0, sizeof *out);
    HANDLE file = CreateFileA(path, GENERIC_READ, FILE_SHARE_READ, NULL, OPEN_EXISTING, FILE_ATTRIBUTE_NORMAL, NULL);
    if (file == INVALID_HANDLE_VALUE) {
        snprintf(err, err_len, "%s: cannot open: %s", path, win_error(GetLastError(), why, sizeof why));
        return -1;
    }
    LARGE_INTEGER size;
    if (!GetFileSizeEx(file, &size) || size.QuadPart <= 0 || (uint64_t)size.QuadPart > (uint64_t)SIZE_MAX) {
        snprintf(err, err_len, "%s: empty or unreadable file", path);
        CloseHandle(file);
        return -1;
    }
    HANDLE mapping = CreateFileMappingA(file, NULL, PAGE_READONLY, 0, 0, NULL);
    void *p = mapping ? MapViewOfFile(mapping, FILE_MAP_READ, 0, 0, 0) : NULL;
    DWORD code = GetLastError();
    /* The view keeps the mapping and the file open (as mmap does after close). */
    if (mapping) CloseHandle(mapping);
    CloseHandle(file);
    if (!p) {
        snprintf(err, err_len, "%s: cannot map: %s", path, win_error(code, why, sizeof why));
        return -1;
    }
    out->data = p;
    out->size = (uint64_t)size.QuadPart;
    return 0;
}

void cb_unmap_file(cb_mapped_file *m) {
    if (m->data) UnmapViewOfFile(m->data);
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
