/*
 * driver_probes: what the CUDA driver of this machine does in the cases topoccl's device path
 * depends on, as a table (benches/gpu/lease.sh, step 1). The driver API only, loaded with
 * dlopen (libcuda.so.1, or $LEASE_LIBCUDA), so this builds with any C compiler and no CUDA
 * headers, and runs the same on a GPU and on the stand-in driver (standins/cuda).
 *
 *   driver_probes --image kernels/images/sm_90.cubin [--only i,ii,iii,iv,v] [--watchdog-ms 2000]
 *                 [--connections 1,8] [--max-between 40] [--window-ms 100]
 *
 * (i)   a stream waits on a pinned host word (cuStreamWaitValue32); a kernel plus a
 *       cuStreamWriteValue32 on a stream made k streams later, in the same context, releases
 *       it; for k = 0..40 and CUDA_DEVICE_MAX_CONNECTIONS 1 and 8. A release that does not
 *       come is a deadlock: the host then stores the word itself, and the probe goes on.
 * (ii)  thread A sits in a device-to-host copy into pageable memory queued behind such a
 *       waiting stream; thread B makes one driver call; the host releases the word later.
 *       Each call: free (returns while A waits), BLOCKS (returns only after the release: in a
 *       library whose release needs that call, a deadlock) or HANGS.
 * (iii) cuFuncIsLoaded right after cuModuleGetFunction (lazy and eager loading), after
 *       cuFuncGetAttribute and after cuFuncLoad; the first and second launch's time.
 * (iv)  latencies: launch to completion, a small copy-engine copy, cuEventQuery, a host store
 *       seen by a waiting stream (round trip), a stream write seen by the host, a 4-byte
 *       pageable read back.
 *
 * Every probe runs in a child process (fork before any CUDA call: the parent makes none),
 * which reports progress on a pipe; a child silent for --watchdog-ms (set-up: 20 s) is killed
 * and the table says so. Output: one line per result, flushed as it is known.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUstream, *CUevent, *CUmodule, *CUfunction;
typedef struct { char reserved[64]; } CUipcMemHandle;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_NOT_READY = 600,
    MEMHOSTALLOC_PORTABLE = 1,
    MEMHOSTALLOC_DEVICEMAP = 2,
    MEMHOSTREGISTER_PORTABLE = 1,
    MEMHOSTREGISTER_DEVICEMAP = 2,
    STREAM_NON_BLOCKING = 1,
    WAIT_VALUE_GEQ = 0,
    WRITE_VALUE_DEFAULT = 0,
    EVENT_DISABLE_TIMING = 2,
    IPC_LAZY_ENABLE_PEER_ACCESS = 1,
    FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES = 3,
};

/* The driver's functions this program calls, by the names libcuda.so.1 exports. */
#define DRIVER_FUNCTIONS(X)                                                                    \
    X(cuInit, (unsigned))                                                                      \
    X(cuDriverGetVersion, (int *))                                                             \
    X(cuGetErrorName, (CUresult, const char **))                                               \
    X(cuDeviceGet, (CUdevice *, int))                                                          \
    X(cuDeviceGetName, (char *, int, CUdevice))                                                \
    X(cuDevicePrimaryCtxRetain, (CUcontext *, CUdevice))                                       \
    X(cuCtxSetCurrent, (CUcontext))                                                            \
    X(cuMemAlloc_v2, (CUdeviceptr *, size_t))                                                  \
    X(cuMemFree_v2, (CUdeviceptr))                                                             \
    X(cuMemHostAlloc, (void **, size_t, unsigned))                                             \
    X(cuMemFreeHost, (void *))                                                                 \
    X(cuMemHostRegister_v2, (void *, size_t, unsigned))                                        \
    X(cuMemHostUnregister, (void *))                                                           \
    X(cuMemHostGetDevicePointer_v2, (CUdeviceptr *, void *, unsigned))                         \
    X(cuMemcpyHtoD_v2, (CUdeviceptr, const void *, size_t))                                    \
    X(cuMemcpyDtoH_v2, (void *, CUdeviceptr, size_t))                                          \
    X(cuMemcpyDtoHAsync_v2, (void *, CUdeviceptr, size_t, CUstream))                           \
    X(cuMemcpyAsync, (CUdeviceptr, CUdeviceptr, size_t, CUstream))                             \
    X(cuIpcGetMemHandle, (CUipcMemHandle *, CUdeviceptr))                                      \
    X(cuIpcOpenMemHandle_v2, (CUdeviceptr *, CUipcMemHandle, unsigned))                        \
    X(cuIpcCloseMemHandle, (CUdeviceptr))                                                      \
    X(cuEventCreate, (CUevent *, unsigned))                                                    \
    X(cuEventRecord, (CUevent, CUstream))                                                      \
    X(cuEventQuery, (CUevent))                                                                 \
    X(cuEventDestroy_v2, (CUevent))                                                            \
    X(cuStreamCreate, (CUstream *, unsigned))                                                  \
    X(cuStreamDestroy_v2, (CUstream))                                                          \
    X(cuStreamQuery, (CUstream))                                                               \
    X(cuStreamSynchronize, (CUstream))                                                         \
    X(cuStreamWaitValue32_v2, (CUstream, CUdeviceptr, unsigned, unsigned))                     \
    X(cuStreamWriteValue32_v2, (CUstream, CUdeviceptr, unsigned, unsigned))                    \
    X(cuModuleLoadData, (CUmodule *, const void *))                                            \
    X(cuModuleGetFunction, (CUfunction *, CUmodule, const char *))                             \
    X(cuLaunchKernel, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, \
                       unsigned, CUstream, void **, void **))                                  \
    X(cuFuncGetAttribute, (int *, int, CUfunction))                                            \
    X(cuFuncLoad, (CUfunction))                                                                \
    X(cuFuncIsLoaded, (int *, CUfunction))

#define DECLARE(name, args) static CUresult(*p_##name) args;
DRIVER_FUNCTIONS(DECLARE)
#undef DECLARE

static void *driver;
static const char *image_path;
static void *image;
static int watchdog_ms = 2000;
/* A probe child's status after a call that hung: the parent goes on from the next call in a
 * new child (the hung thread may hold anything of the driver's). */
#define RESUME_STATUS 10
static int progress_fd = -1; /* the child's end of its progress pipe */

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void sleep_us(double us) {
    struct timespec t = {(time_t)(us / 1e6), (long)((us - (time_t)(us / 1e6) * 1e6) * 1e3)};
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {
    }
}

/* One line of output, written at once (parent and children share stdout). */
static void out(const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (n > (int)sizeof line - 2) n = (int)sizeof line - 2;
    line[n++] = '\n';
    fflush(stdout);
    ssize_t w = write(1, line, (size_t)n);
    (void)w;
}

/* Tells the parent this child is alive (resets its watchdog); mark(k) also says it starts
 * part k of its probe (so that a parent whose child hangs knows where to resume). */
static void progress(unsigned char b) {
    if (progress_fd >= 0) {
        ssize_t w = write(progress_fd, &b, 1);
        (void)w;
    }
}
static void alive(void) { progress(0); }
static void mark(int k) { progress((unsigned char)(k + 1)); }

static const char *err_name(CUresult r) {
    const char *s = NULL;
    if (p_cuGetErrorName && p_cuGetErrorName(r, &s) == CUDA_SUCCESS && s) return s;
    static char buf[32];
    snprintf(buf, sizeof buf, "CUresult %d", r);
    return buf;
}

/* A failed call in a probe's set-up: the probe says so and its child ends. */
#define MUST(call)                                                                 \
    do {                                                                           \
        CUresult r_ = (call);                                                      \
        if (r_ != CUDA_SUCCESS) {                                                  \
            out("   set-up failed: %s = %s (line %d)", #call, err_name(r_), __LINE__); \
            _exit(3);                                                              \
        }                                                                          \
    } while (0)
#define HAVE(name) (p_##name != NULL)
#define CALL(name, ...) (p_##name ? p_##name(__VA_ARGS__) : -1)

static int load_driver(void) {
    const char *lib = getenv("LEASE_LIBCUDA");
    driver = dlopen(lib && *lib ? lib : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!driver) {
        out("no CUDA driver: %s", dlerror());
        return -1;
    }
#define RESOLVE(name, args) p_##name = (CUresult(*) args)dlsym(driver, #name);
    DRIVER_FUNCTIONS(RESOLVE)
#undef RESOLVE
    /* Older names where the _v2 forms are missing (the stand-in exports both). */
    if (!p_cuStreamWaitValue32_v2)
        p_cuStreamWaitValue32_v2 = (CUresult(*)(CUstream, CUdeviceptr, unsigned, unsigned))dlsym(driver, "cuStreamWaitValue32");
    if (!p_cuStreamWriteValue32_v2)
        p_cuStreamWriteValue32_v2 = (CUresult(*)(CUstream, CUdeviceptr, unsigned, unsigned))dlsym(driver, "cuStreamWriteValue32");
    return 0;
}

static void *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = n > 0 ? malloc((size_t)n + 1) : NULL;
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    if (b) b[n] = 0; /* PTX ends at its NUL */
    fclose(f);
    return b;
}

/* What every probe child sets up: the driver, device 0's primary context current, the
 * kernels' module. */
static CUcontext ctx;
static CUmodule module;
static CUfunction copy_fn;

static void setup(int with_module) {
    MUST(CALL(cuInit, 0));
    CUdevice dev;
    MUST(CALL(cuDeviceGet, &dev, 0));
    MUST(CALL(cuDevicePrimaryCtxRetain, &ctx, dev));
    MUST(CALL(cuCtxSetCurrent, ctx));
    if (with_module) {
        MUST(CALL(cuModuleLoadData, &module, image));
        MUST(CALL(cuModuleGetFunction, &copy_fn, module, "topoccl_copy"));
    }
}

/* topoccl's kernel ABI (kernels/README.md): one 48-byte struct by value. */
struct kernel_args {
    CUdeviceptr dst, dst2, a, b;
    unsigned long long count, scalar;
};

static CUresult launch_copy(CUfunction f, CUstream s, CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
    struct kernel_args args = {dst, 0, src, 0, bytes, 0};
    void *params[] = {&args};
    return CALL(cuLaunchKernel, f, 1, 1, 1, 64, 1, 1, 0, s, params, NULL);
}

/* A pinned host word the device sees, and its device address. */
struct word {
    volatile unsigned *host;
    CUdeviceptr dev;
};

static struct word host_word(void) {
    struct word w;
    void *p;
    MUST(CALL(cuMemHostAlloc, &p, 64, MEMHOSTALLOC_PORTABLE | MEMHOSTALLOC_DEVICEMAP));
    memset(p, 0, 64);
    w.host = p;
    MUST(CALL(cuMemHostGetDevicePointer_v2, &w.dev, p, 0));
    return w;
}

static void store(struct word w, unsigned v) {
    atomic_thread_fence(memory_order_seq_cst);
    *w.host = v;
    atomic_thread_fence(memory_order_seq_cst);
}

/* Polls `s` until done or `limit_us`; CUDA_SUCCESS when done, else the last answer. */
static CUresult wait_stream(CUstream s, double limit_us) {
    double t0 = now_us();
    CUresult r;
    while ((r = CALL(cuStreamQuery, s)) == CUDA_ERROR_NOT_READY && now_us() - t0 < limit_us) {
    }
    return r;
}

/* ---------------------------------------------------------------------------------------- */
/* Running a probe in a child under a watchdog. */

/* Runs `body(arg)` in a child; kills it when silent for the watchdog (set-up: 20 s before its
 * first sign of life). Returns 0 when it ended by itself with status 0, the child's status when
 * it ended with another, -1 when killed or lost; `*last` (if given) gets the last mark(k)'s k. */
static int in_child_marked(const char *what, void (*body)(void *), void *arg, const char *env_name, const char *env_value,
                           int *last) {
    int fds[2];
    if (pipe(fds) != 0) return -1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        close(fds[0]);
        progress_fd = fds[1];
        if (env_name) {
            if (env_value)
                setenv(env_name, env_value, 1);
            else
                unsetenv(env_name);
        }
        body(arg);
        fflush(stdout);
        _exit(0);
    }
    close(fds[1]);
    int first = 1, status = 0, killed = 0;
    for (;;) {
        struct pollfd p = {fds[0], POLLIN, 0};
        int n = poll(&p, 1, first ? 20000 : watchdog_ms);
        if (n > 0) {
            unsigned char b[64];
            ssize_t got = read(fds[0], b, sizeof b);
            if (got > 0) {
                first = 0;
                for (ssize_t i = 0; i < got; i++)
                    if (b[i] && last) *last = b[i] - 1;
                continue;
            }
            break; /* EOF: the child ended (or closed its end) */
        }
        if (n < 0 && errno == EINTR) continue;
        kill(pid, SIGKILL);
        killed = 1;
        break;
    }
    close(fds[0]);
    /* After EOF the child may still be exiting: wait, and kill it if that takes too long. */
    double t0 = now_us();
    while (waitpid(pid, &status, WNOHANG) == 0) {
        if (!killed && now_us() - t0 > 2e6) {
            kill(pid, SIGKILL);
            killed = 1;
        }
        sleep_us(1000);
    }
    if (killed) {
        out("   WATCHDOG: %s: no progress for %d ms%s; killed", what, first ? 20000 : watchdog_ms,
            first ? " (in its set-up)" : "");
        return -1;
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
    if (WIFEXITED(status) && WEXITSTATUS(status) == RESUME_STATUS) return RESUME_STATUS;
    out("   %s: its process ended with %s %d", what, WIFSIGNALED(status) ? "signal" : "status",
        WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    return -1;
}

static int in_child(const char *what, void (*body)(void *), void *arg, const char *env_name, const char *env_value) {
    return in_child_marked(what, body, arg, env_name, env_value, NULL);
}

/* ---------------------------------------------------------------------------------------- */
/* (i) A wait released by a later stream's work. */

#define MAX_BETWEEN 40
static int max_between = MAX_BETWEEN;
static double release_window_us = 100000.0;

static void ranges(char *buf, size_t len, const int *set, int n) {
    size_t at = 0;
    buf[0] = 0;
    for (int k = 0; k <= n; k++) {
        if (!set[k]) continue;
        int e = k;
        while (e + 1 <= n && set[e + 1]) e++;
        at += (size_t)snprintf(buf + at, at < len ? len - at : 0, "%s%d%s", at ? "," : "", k, "");
        if (e > k && at < len) at += (size_t)snprintf(buf + at, len - at, "-%d", e);
        k = e;
    }
    if (!at) snprintf(buf, len, "none");
}

static void probe_release(void *arg) {
    (void)arg;
    setup(1);
    struct word w = host_word();
    CUdeviceptr d;
    MUST(CALL(cuMemAlloc_v2, &d, 4096));
    alive();
    int released[MAX_BETWEEN + 1] = {0}, deadlocked[MAX_BETWEEN + 1] = {0}, stuck[MAX_BETWEEN + 1] = {0};
    int n = max_between;
    double lat[MAX_BETWEEN + 1] = {0};
    int made = 0; /* streams made in this context so far */
    for (int k = 0; k <= n; k++) {
        store(w, 0);
        CUstream a, b, between[MAX_BETWEEN];
        MUST(CALL(cuStreamCreate, &a, STREAM_NON_BLOCKING));
        int a_index = made++;
        for (int i = 0; i < k; i++) MUST(CALL(cuStreamCreate, &between[i], STREAM_NON_BLOCKING));
        made += k;
        MUST(CALL(cuStreamCreate, &b, STREAM_NON_BLOCKING));
        int b_index = made++;
        MUST(CALL(cuStreamWaitValue32_v2, a, w.dev, 1, WAIT_VALUE_GEQ));
        MUST(launch_copy(copy_fn, a, d + 2048, d + 1024, 256)); /* work behind the wait */
        double t0 = now_us();
        MUST(launch_copy(copy_fn, b, d + 256, d, 256));
        MUST(CALL(cuStreamWriteValue32_v2, b, w.dev, 1, WRITE_VALUE_DEFAULT));
        CUresult r = wait_stream(a, release_window_us);
        if (r == CUDA_SUCCESS) {
            released[k] = 1;
            lat[k] = now_us() - t0;
        } else {
            store(w, 1); /* the host releases it: the probe goes on */
            if (wait_stream(a, 1e6) == CUDA_SUCCESS && wait_stream(b, 1e6) == CUDA_SUCCESS)
                deadlocked[k] = 1;
            else
                stuck[k] = 1;
        }
        out("   k=%2d (streams #%d and #%d of this context): %s", k, a_index, b_index,
            released[k] ? "released" : deadlocked[k] ? "DEADLOCK (freed by a host store)" : "STUCK (not even a host store freed it)");
        if (released[k]) out("         released %.1f us after the kernel's launch", lat[k]);
        for (int i = 0; i < k; i++) CALL(cuStreamDestroy_v2, between[i]);
        if (!stuck[k]) {
            CALL(cuStreamDestroy_v2, a);
            CALL(cuStreamDestroy_v2, b);
        }
        alive();
        if (stuck[k]) break;
    }
    char rel[256], dead[256], st[256];
    ranges(rel, sizeof rel, released, n);
    ranges(dead, sizeof dead, deadlocked, n);
    ranges(st, sizeof st, stuck, n);
    int nd = 0;
    for (int k = 0; k <= n; k++) nd += deadlocked[k] + stuck[k];
    const char *mc = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    int any_stuck = strcmp(st, "none") != 0;
    out("RESULT (i) CUDA_DEVICE_MAX_CONNECTIONS=%s: %s; released at k=%s; deadlocked at k=%s%s%s", mc ? mc : "(unset)",
        nd ? "DEADLOCKS" : "no deadlock", rel, dead, any_stuck ? "; stuck at k=" : "", any_stuck ? st : "");
}

/* ---------------------------------------------------------------------------------------- */
/* (ii) Which calls wait while another thread sits in a pageable copy behind a waiting stream. */

enum call_kind {
    C_MEM_ALLOC,
    C_MEM_FREE,
    C_MEM_HOST_ALLOC,
    C_MEM_FREE_HOST,
    C_MEM_HOST_REGISTER,
    C_MEM_HOST_UNREGISTER,
    C_IPC_GET,
    C_IPC_OPEN,
    C_IPC_CLOSE,
    C_EVENT_CREATE,
    C_EVENT_RECORD,
    C_EVENT_QUERY,
    C_STREAM_CREATE,
    C_STREAM_DESTROY,
    C_MODULE_LOAD,
    C_FUNC_LOAD,
    C_LAUNCH_WARM,
    C_LAUNCH_FIRST,
    C_MEMCPY_ASYNC,
    C_WRITE_VALUE,
    C_COUNT
};

static const char *call_names[C_COUNT] = {
    "cuMemAlloc", "cuMemFree", "cuMemHostAlloc", "cuMemFreeHost", "cuMemHostRegister", "cuMemHostUnregister",
    "cuIpcGetMemHandle", "cuIpcOpenMemHandle (another process's)", "cuIpcCloseMemHandle",
    "cuEventCreate", "cuEventRecord (another stream)", "cuEventQuery",
    "cuStreamCreate", "cuStreamDestroy (an idle stream)", "cuModuleLoadData",
    "cuFuncLoad", "cuLaunchKernel (a kernel launched before)", "cuLaunchKernel (a kernel's first launch)",
    "cuMemcpyAsync (device to device, another stream)", "cuStreamWriteValue32 (another stream)",
};

static CUipcMemHandle exported; /* from the exporter process, for C_IPC_OPEN */
static CUdeviceptr ipc_opened;   /* its mapping in this child, which C_IPC_CLOSE closes */
static int simulate_hang = -1;   /* DRIVER_PROBES_SIMULATE_HANG: the call whose thread B never returns */
static int have_exported;

/* What one call of (ii) needs, made before the stream waits. */
struct lock_state {
    int kind;
    CUstream other;    /* for launches, copies, records, writes */
    CUdeviceptr spare; /* device memory for them */
    CUdeviceptr to_free, opened;
    void *host_to_free, *registered, *page;
    CUevent event;
    CUstream idle;
    CUfunction first_fn, load_fn;
    /* results */
    atomic_int a_done, b_done;
    double a_end, b_end;
    CUresult b_result;
};

/* Shared by every call of (ii) in one child. */
static struct word lock_word;
static unsigned lock_round;
static CUstream waiting_stream;
static CUdeviceptr copy_source;
static void *pageable;

static void *thread_a(void *p) {
    struct lock_state *s = p;
    CALL(cuCtxSetCurrent, ctx);
    CALL(cuMemcpyDtoHAsync_v2, pageable, copy_source, 1 << 20, waiting_stream);
    s->a_end = now_us();
    atomic_store(&s->a_done, 1);
    return NULL;
}

static void *thread_b(void *p) {
    struct lock_state *s = p;
    CALL(cuCtxSetCurrent, ctx);
    CUresult r = -1;
    CUdeviceptr d;
    void *h;
    CUevent e;
    CUstream st;
    CUmodule m;
    CUipcMemHandle handle;
    if (simulate_hang == s->kind) sleep_us(3600e6); /* the harness's own test (lease/killtest.sh) */
    switch (s->kind) {
    case C_MEM_ALLOC: r = CALL(cuMemAlloc_v2, &d, 1 << 20); break;
    case C_MEM_FREE: r = CALL(cuMemFree_v2, s->to_free); break;
    case C_MEM_HOST_ALLOC: r = CALL(cuMemHostAlloc, &h, 1 << 20, MEMHOSTALLOC_PORTABLE | MEMHOSTALLOC_DEVICEMAP); break;
    case C_MEM_FREE_HOST: r = CALL(cuMemFreeHost, s->host_to_free); break;
    case C_MEM_HOST_REGISTER: r = CALL(cuMemHostRegister_v2, s->page, 1 << 16, MEMHOSTREGISTER_PORTABLE | MEMHOSTREGISTER_DEVICEMAP); break;
    case C_MEM_HOST_UNREGISTER: r = CALL(cuMemHostUnregister, s->registered); break;
    case C_IPC_GET: r = CALL(cuIpcGetMemHandle, &handle, s->to_free); break;
    case C_IPC_OPEN:
        r = CALL(cuIpcOpenMemHandle_v2, &d, exported, IPC_LAZY_ENABLE_PEER_ACCESS);
        if (r == CUDA_SUCCESS) ipc_opened = d;
        break;
    case C_IPC_CLOSE: r = CALL(cuIpcCloseMemHandle, s->opened); break;
    case C_EVENT_CREATE: r = CALL(cuEventCreate, &e, EVENT_DISABLE_TIMING); break;
    case C_EVENT_RECORD: r = CALL(cuEventRecord, s->event, s->other); break;
    case C_EVENT_QUERY: r = CALL(cuEventQuery, s->event); break;
    case C_STREAM_CREATE: r = CALL(cuStreamCreate, &st, STREAM_NON_BLOCKING); break;
    case C_STREAM_DESTROY: r = CALL(cuStreamDestroy_v2, s->idle); break;
    case C_MODULE_LOAD: r = CALL(cuModuleLoadData, &m, image); break;
    case C_FUNC_LOAD: r = CALL(cuFuncLoad, s->load_fn); break;
    case C_LAUNCH_WARM: r = launch_copy(copy_fn, s->other, s->spare + 512, s->spare, 256); break;
    case C_LAUNCH_FIRST: {
        struct kernel_args args = {s->spare + 512, 0, s->spare, s->spare + 256, 64, 0};
        void *params[] = {&args};
        r = CALL(cuLaunchKernel, s->first_fn, 1, 1, 1, 64, 1, 1, 0, s->other, params, NULL);
        break;
    }
    case C_MEMCPY_ASYNC: r = CALL(cuMemcpyAsync, s->spare + 1024, s->spare, 1024, s->other); break;
    case C_WRITE_VALUE: r = CALL(cuStreamWriteValue32_v2, s->other, s->spare, 7, WRITE_VALUE_DEFAULT); break;
    }
    s->b_result = r;
    s->b_end = now_us();
    atomic_store(&s->b_done, 1);
    return NULL;
}

/* How long thread B's call is given before the release, and after it (--window-ms widens
 * both, for a loaded machine). */
#define B_WINDOW_US (release_window_us > 500000.0 ? release_window_us : 500000.0)
#define AFTER_RELEASE_US (release_window_us > 400000.0 ? 2 * release_window_us : 800000.0)

static const char *call_missing(int kind) {
    switch (kind) {
    case C_FUNC_LOAD: return HAVE(cuFuncLoad) ? NULL : "cuFuncLoad not exported";
    case C_IPC_OPEN:
    case C_IPC_CLOSE: return have_exported && HAVE(cuIpcOpenMemHandle_v2) ? NULL : "no handle from another process";
    default: return NULL;
    }
}

/* One call of (ii); 0 when it came back (before or after the release), 1 when it hung. */
static int lock_call(int kind, CUstream other, CUdeviceptr spare) {
    static struct lock_state s; /* outlives this call: a hung thread B may still use it */
    memset(&s, 0, sizeof s);
    s.kind = kind;
    s.other = other;
    s.spare = spare;
    /* This call's own resources, made while nothing waits. */
    switch (kind) {
    case C_MEM_FREE:
    case C_IPC_GET: MUST(CALL(cuMemAlloc_v2, &s.to_free, 1 << 20)); break;
    case C_MEM_FREE_HOST: MUST(CALL(cuMemHostAlloc, &s.host_to_free, 1 << 16, MEMHOSTALLOC_PORTABLE)); break;
    case C_MEM_HOST_REGISTER: s.page = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0); break;
    case C_MEM_HOST_UNREGISTER:
        s.registered = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        MUST(CALL(cuMemHostRegister_v2, s.registered, 1 << 16, MEMHOSTREGISTER_PORTABLE));
        break;
    case C_IPC_CLOSE: /* the mapping the open made, or one of its own (one open per handle and context) */
        if (!ipc_opened) MUST(CALL(cuIpcOpenMemHandle_v2, &ipc_opened, exported, IPC_LAZY_ENABLE_PEER_ACCESS));
        s.opened = ipc_opened;
        break;
    case C_EVENT_RECORD:
    case C_EVENT_QUERY:
        MUST(CALL(cuEventCreate, &s.event, EVENT_DISABLE_TIMING));
        MUST(CALL(cuEventRecord, s.event, other));
        MUST(CALL(cuStreamSynchronize, other));
        break;
    case C_STREAM_DESTROY: MUST(CALL(cuStreamCreate, &s.idle, STREAM_NON_BLOCKING)); break;
    case C_FUNC_LOAD: MUST(CALL(cuModuleGetFunction, &s.load_fn, module, "topoccl_reduce_prod_f32")); break;
    case C_LAUNCH_FIRST: MUST(CALL(cuModuleGetFunction, &s.first_fn, module, "topoccl_reduce_sum_f32")); break;
    default: break;
    }
    alive();
    /* The stream waits; thread A's pageable copy waits behind it. */
    unsigned want = ++lock_round;
    MUST(CALL(cuStreamWaitValue32_v2, waiting_stream, lock_word.dev, want, WAIT_VALUE_GEQ));
    pthread_t a, b;
    pthread_create(&a, NULL, thread_a, &s);
    pthread_detach(a);
    sleep_us(100000);
    if (atomic_load(&s.a_done))
        out("   %-48s | (the pageable copy returned before the release: it did not wait for its stream)", call_names[kind]);
    double t_b = now_us();
    pthread_create(&b, NULL, thread_b, &s);
    pthread_detach(b);
    double t0 = now_us();
    while (!atomic_load(&s.b_done) && now_us() - t0 < B_WINDOW_US) sleep_us(200);
    alive();
    int before = atomic_load(&s.b_done);
    double t_release = now_us();
    store(lock_word, want);
    t0 = now_us();
    while (!atomic_load(&s.b_done) && now_us() - t0 < AFTER_RELEASE_US) sleep_us(200);
    int after = atomic_load(&s.b_done);
    t0 = now_us();
    while (!atomic_load(&s.a_done) && now_us() - t0 < AFTER_RELEASE_US) sleep_us(200);
    alive();
    char res[80] = "";
    if (after && s.b_result != CUDA_SUCCESS) snprintf(res, sizeof res, " (returned %s)", err_name(s.b_result));
    if (before)
        out("   %-48s | free    | back in %.0f us%s", call_names[kind], s.b_end - t_b, res);
    else if (after)
        out("   %-48s | BLOCKS  | back %.1f ms after the release (%.0f ms in all)%s", call_names[kind],
            (s.b_end - t_release) / 1e3, (s.b_end - t_b) / 1e3, res);
    else
        out("   %-48s | HANGS   | not back %.0f ms after the release", call_names[kind], AFTER_RELEASE_US / 1e3);
    if (!atomic_load(&s.a_done)) {
        out("   (thread A's pageable copy was still not back %.0f ms after the release)", AFTER_RELEASE_US / 1e3);
        return 1;
    }
    return after ? 0 : 1;
}

/* (ii) from the call *arg on, in this process; after a call that hangs the child ends with
 * RESUME_STATUS and the parent goes on from the next call in a new one. */
static void probe_locks(void *arg) {
    int start = *(int *)arg;
    setup(1);
    lock_word = host_word();
    CUstream other;
    CUdeviceptr spare;
    MUST(CALL(cuMemAlloc_v2, &copy_source, 1 << 20));
    MUST(CALL(cuMemAlloc_v2, &spare, 1 << 20));
    MUST(CALL(cuStreamCreate, &waiting_stream, STREAM_NON_BLOCKING));
    MUST(CALL(cuStreamCreate, &other, STREAM_NON_BLOCKING));
    MUST(launch_copy(copy_fn, other, spare + 512, spare, 256)); /* copy_fn launched once */
    MUST(CALL(cuStreamSynchronize, other));
    pageable = malloc(1 << 20);
    memset(pageable, 1, 1 << 20);
    for (int kind = start; kind < C_COUNT; kind++) {
        mark(kind);
        const char *missing = call_missing(kind);
        if (missing) {
            out("   %-48s | skipped: %s", call_names[kind], missing);
            continue;
        }
        if (lock_call(kind, other, spare) != 0) {
            fflush(stdout);
            _exit(RESUME_STATUS); /* threads may still be inside the driver */
        }
    }
    fflush(stdout);
    _exit(0);
}

/* The exporter: a process of its own that exports a cuMemAlloc buffer and waits. */
static void run_exporter(int handle_fd, int hold_fd) {
    setup(0);
    CUdeviceptr d;
    CUipcMemHandle h;
    MUST(CALL(cuMemAlloc_v2, &d, 1 << 20));
    MUST(CALL(cuIpcGetMemHandle, &h, d));
    ssize_t w = write(handle_fd, &h, sizeof h);
    (void)w;
    char c;
    ssize_t r = read(hold_fd, &c, 1); /* until the parent closes its end */
    (void)r;
    _exit(0);
}

/* ---------------------------------------------------------------------------------------- */
/* (iii) Lazy loading. */

static const char *load_state(CUfunction f) {
    int st = -1;
    if (!HAVE(cuFuncIsLoaded)) return "cuFuncIsLoaded not exported";
    CUresult r = CALL(cuFuncIsLoaded, &st, f);
    if (r != CUDA_SUCCESS) return err_name(r);
    return st == 1 ? "loaded" : st == 0 ? "NOT loaded" : "state?";
}

static void probe_loading(void *arg) {
    (void)arg;
    setup(0);
    MUST(CALL(cuModuleLoadData, &module, image));
    alive();
    const char *mode = getenv("CUDA_MODULE_LOADING");
    CUfunction f, g;
    MUST(CALL(cuModuleGetFunction, &f, module, "topoccl_reduce_max_f64"));
    MUST(CALL(cuModuleGetFunction, &g, module, "topoccl_reduce_min_f64"));
    char s1[64], s2[64], s3[64];
    snprintf(s1, sizeof s1, "%s", load_state(f));
    int local = -1;
    CUresult ra = CALL(cuFuncGetAttribute, &local, FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, f);
    char attr[80];
    if (!HAVE(cuFuncGetAttribute))
        snprintf(attr, sizeof attr, "cuFuncGetAttribute not exported");
    else if (ra != CUDA_SUCCESS)
        snprintf(attr, sizeof attr, "cuFuncGetAttribute(LOCAL_SIZE_BYTES): %s", err_name(ra));
    else
        snprintf(attr, sizeof attr, "cuFuncGetAttribute(LOCAL_SIZE_BYTES) = %d", local);
    snprintf(s2, sizeof s2, "%s", load_state(f));
    if (HAVE(cuFuncLoad)) {
        CUresult rl = CALL(cuFuncLoad, f);
        snprintf(s3, sizeof s3, "%s%s%s", load_state(f), rl == CUDA_SUCCESS ? "" : ", cuFuncLoad: ", rl == CUDA_SUCCESS ? "" : err_name(rl));
    } else
        snprintf(s3, sizeof s3, "cuFuncLoad not exported");
    out("RESULT (iii) CUDA_MODULE_LOADING=%s: after cuModuleGetFunction: %s; after %s: %s; after cuFuncLoad: %s",
        mode ? mode : "(unset)", s1, attr, s2, s3);
    /* g was only looked up: its first launch against its second. */
    CUstream s;
    CUdeviceptr d;
    MUST(CALL(cuStreamCreate, &s, STREAM_NON_BLOCKING));
    MUST(CALL(cuMemAlloc_v2, &d, 4096));
    struct kernel_args args = {d + 1024, 0, d, d + 512, 16, 0};
    void *params[] = {&args};
    double t[2];
    for (int i = 0; i < 2; i++) {
        double t0 = now_us();
        MUST(CALL(cuLaunchKernel, g, 1, 1, 1, 32, 1, 1, 0, s, params, NULL));
        t[i] = now_us() - t0;
        MUST(CALL(cuStreamSynchronize, s));
    }
    out("   a kernel only looked up: its first cuLaunchKernel call took %.1f us, the second %.1f us (call time, not run time)", t[0], t[1]);
}

/* ---------------------------------------------------------------------------------------- */
/* (iv) Latencies. */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#define REPS 200

static void report(const char *what, double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    out("   %-58s | %9.2f | %9.2f | %9.2f", what, v[n / 2], v[n / 10], v[n * 9 / 10]);
}

static void probe_latency(void *arg) {
    (void)arg;
    setup(1);
    struct word w = host_word(), echo = host_word();
    CUstream s;
    CUdeviceptr d;
    CUevent e;
    MUST(CALL(cuStreamCreate, &s, STREAM_NON_BLOCKING));
    MUST(CALL(cuMemAlloc_v2, &d, 1 << 16));
    MUST(CALL(cuEventCreate, &e, EVENT_DISABLE_TIMING));
    alive();
    double v[REPS];
    /* warm-up */
    for (int i = 0; i < 20; i++) {
        MUST(launch_copy(copy_fn, s, d + 4096, d, 256));
        MUST(CALL(cuMemcpyAsync, d + 8192, d, 4096, s));
    }
    MUST(CALL(cuStreamSynchronize, s));
    out("   %-58s | %9s | %9s | %9s", "µs (of 200)", "median", "p10", "p90");
    for (int i = 0; i < REPS; i++) {
        double t0 = now_us();
        MUST(launch_copy(copy_fn, s, d + 4096, d, 256));
        MUST(CALL(cuStreamSynchronize, s));
        v[i] = now_us() - t0;
    }
    report("kernel launch to completion (launch + synchronize)", v, REPS);
    alive();
    for (int i = 0; i < REPS; i++) {
        double t0 = now_us();
        MUST(CALL(cuMemcpyAsync, d + 8192, d, 4096, s));
        MUST(CALL(cuStreamSynchronize, s));
        v[i] = now_us() - t0;
    }
    report("4 KiB device-to-device cuMemcpyAsync + synchronize", v, REPS);
    alive();
    MUST(CALL(cuEventRecord, e, s));
    MUST(CALL(cuStreamSynchronize, s));
    for (int i = 0; i < REPS; i++) {
        double t0 = now_us();
        CALL(cuEventQuery, e);
        v[i] = now_us() - t0;
    }
    report("cuEventQuery of a completed event", v, REPS);
    alive();
    for (int i = 0; i < REPS; i++) {
        double t0 = now_us();
        MUST(CALL(cuStreamWriteValue32_v2, s, echo.dev, (unsigned)i + 1, WRITE_VALUE_DEFAULT));
        while (*echo.host != (unsigned)i + 1 && now_us() - t0 < 1e6) {
        }
        v[i] = now_us() - t0;
    }
    report("cuStreamWriteValue32 to a host word until the host sees it", v, REPS);
    alive();
    store(echo, 0);
    for (int i = 0; i < REPS; i++) {
        unsigned want = (unsigned)i + 1;
        MUST(CALL(cuStreamWaitValue32_v2, s, w.dev, want, WAIT_VALUE_GEQ));
        MUST(CALL(cuStreamWriteValue32_v2, s, echo.dev, want, WRITE_VALUE_DEFAULT));
        sleep_us(50); /* the stream is in its wait */
        double t0 = now_us();
        store(w, want);
        while (*echo.host != want && now_us() - t0 < 1e6) {
        }
        v[i] = now_us() - t0;
    }
    report("host store seen by a waiting stream, echoed back (round trip)", v, REPS);
    alive();
    MUST(CALL(cuStreamSynchronize, s));
    unsigned char small[4];
    for (int i = 0; i < REPS; i++) {
        double t0 = now_us();
        MUST(CALL(cuMemcpyDtoH_v2, small, d, 4));
        v[i] = now_us() - t0;
    }
    report("cuMemcpyDtoH of 4 bytes into pageable memory (idle device)", v, REPS);
}


/* ---------------------------------------------------------------------------------------- */
/* (v) Two one-launch kernels (kernels/ll.cuh) of one context, on two streams, each writing an
 * LL line into the other's area and spinning for the other's: does the GPU run them side by
 * side (what topoccl's thread ranks rely on, and what the stand-in's shared queues model)?
 * Then the hazard: stream A gets more work between the two launches. A kernel that never
 * sees its line is ended through the abort word after 2 s. */

struct ll_region {
    unsigned long long ptr, len;
};
struct ll_operand {
    unsigned off, region;
};
struct ll_step {
    unsigned kind, len;
    struct ll_operand dst, a, b;
};
struct ll_args { /* topoccl_ll_args */
    struct ll_region regions[19];
    unsigned steps, op, divisor, prescale, ticket, line_bytes, active;
    unsigned long long scalar;
    struct ll_step step[112];
};
_Static_assert(sizeof(struct ll_args) == 3928, "topoccl_ll_args");
#define LL_AREA (4096 + 2 * (256 << 10))

static void probe_ll(void *arg) {
    int between = arg != NULL;
    setup(1);
    CUfunction ll;
    MUST(CALL(cuModuleGetFunction, &ll, module, "topoccl_ll_u8"));
    CUstream s[2];
    CUdeviceptr area[2], buf[2];
    struct word ticket[2], abort_word = host_word();
    static unsigned char zeros[LL_AREA];
    for (int r = 0; r < 2; r++) {
        MUST(CALL(cuStreamCreate, &s[r], STREAM_NON_BLOCKING));
        MUST(CALL(cuMemAlloc_v2, &area[r], LL_AREA));
        MUST(CALL(cuMemcpyHtoD_v2, area[r], zeros, LL_AREA));
        MUST(CALL(cuMemAlloc_v2, &buf[r], 64));
        unsigned char in[8] = {(unsigned char)(r + 1), 2, 3, 4, 5, 6, 7, 8};
        MUST(CALL(cuMemcpyHtoD_v2, buf[r], in, 8));
        ticket[r] = host_word();
    }
    MUST(CALL(cuStreamSynchronize, NULL));
    alive();
    double t0 = now_us();
    for (int r = 0; r < 2; r++) {
        struct ll_args a;
        memset(&a, 0, sizeof a);
        a.regions[0] = (struct ll_region){buf[r], 8};          /* input */
        a.regions[1] = (struct ll_region){buf[r] + 32, 8};     /* output */
        a.regions[3] = (struct ll_region){ticket[r].dev, 4};   /* ticket */
        a.regions[4] = (struct ll_region){abort_word.dev, 4};  /* abort */
        a.regions[5] = (struct ll_region){area[1 - r], LL_AREA}; /* the peer's area */
        a.regions[6] = (struct ll_region){area[r], LL_AREA};   /* this one's */
        /* flags 1: the areas' counts (bytes 8 and 12) start at 0 */
        a.active = 1 | 1 << 8;
        a.line_bytes = 256 << 10;
        a.ticket = 1;
        a.steps = 2;
        a.step[0] = (struct ll_step){0, 8, {0, 5}, {0, 0}, {0, 0}}; /* input -> peer's lines */
        a.step[1] = (struct ll_step){0, 8, {0, 1}, {0, 6}, {0, 6}}; /* own lines -> output */
        void *params[] = {&a};
        MUST(CALL(cuLaunchKernel, ll, 1, 1, 1, 32, 1, 1, 0, s[r], params, NULL));
        if (r == 0 && between) MUST(CALL(cuMemcpyAsync, buf[0] + 48, buf[0], 8, s[0]));
    }
    while ((*ticket[0].host != 1 || *ticket[1].host != 1) && now_us() - t0 < 2e6) {
    }
    double took = now_us() - t0;
    int done = *ticket[0].host == 1 && *ticket[1].host == 1;
    store(abort_word, 1);
    CUresult r0 = wait_stream(s[0], 5e6), r1 = wait_stream(s[1], 5e6);
    unsigned char got[8] = {0};
    if (done) MUST(CALL(cuMemcpyDtoH_v2, got, buf[0] + 32, 8));
    out("   %-58s | %s%s", between ? "A's stream has a copy queued between the two launches" : "launched one after the other",
        done ? "both ended" : "held up: neither ended (the abort word ended them)", done && got[0] == 2 ? "" : done ? " (WRONG DATA)" : "");
    if (done) out("   %-58s | %.1f us", "   both launched to both tickets seen by the host", took);
    out("   %-58s | %s", "   streams after the abort", r0 == CUDA_SUCCESS && r1 == CUDA_SUCCESS ? "idle" : "still busy");
}

/* ---------------------------------------------------------------------------------------- */

static int wanted(const char *only, const char *name) {
    if (!only) return 1;
    char buf[128];
    snprintf(buf, sizeof buf, ",%s,", only);
    char key[16];
    snprintf(key, sizeof key, ",%s,", name);
    return strstr(buf, key) != NULL;
}

int main(int argc, char **argv) {
    const char *only = NULL, *connections = "1,8";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--image") && i + 1 < argc)
            image_path = argv[++i];
        else if (!strcmp(argv[i], "--only") && i + 1 < argc)
            only = argv[++i];
        else if (!strcmp(argv[i], "--watchdog-ms") && i + 1 < argc)
            watchdog_ms = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--connections") && i + 1 < argc)
            connections = argv[++i];
        else if (!strcmp(argv[i], "--max-between") && i + 1 < argc)
            max_between = atoi(argv[++i]) < 0 ? 0 : atoi(argv[i]) > MAX_BETWEEN ? MAX_BETWEEN : atoi(argv[i]);
        else if (!strcmp(argv[i], "--window-ms") && i + 1 < argc)
            release_window_us = atof(argv[++i]) * 1e3;
        else {
            fprintf(stderr, "usage: %s --image FILE [--only i,ii,iii,iv,v] [--watchdog-ms MS] [--connections 1,8] [--max-between K] [--window-ms MS]\n", argv[0]);
            return 2;
        }
    }
    if (!image_path || !(image = read_file(image_path))) {
        fprintf(stderr, "driver_probes: no kernel image (--image kernels/images/sm_90.cubin)\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    const char *hang = getenv("DRIVER_PROBES_SIMULATE_HANG");
    for (int k = 0; hang && k < C_COUNT; k++)
        if (!strncmp(call_names[k], hang, strlen(hang)) && (call_names[k][strlen(hang)] == 0 || call_names[k][strlen(hang)] == ' '))
            simulate_hang = k;
    if (load_driver() != 0) return 1;
    int version = 0;
    if (HAVE(cuDriverGetVersion)) p_cuDriverGetVersion(&version);
    out("driver_probes: %s, driver API %d.%d, image %s; watchdog %d ms per probe", getenv("LEASE_LIBCUDA") ? getenv("LEASE_LIBCUDA") : "libcuda.so.1",
        version / 1000, version % 1000 / 10, image_path, watchdog_ms);
    const char *missing[8];
    int nmissing = 0;
    if (!HAVE(cuFuncLoad)) missing[nmissing++] = "cuFuncLoad";
    if (!HAVE(cuFuncIsLoaded)) missing[nmissing++] = "cuFuncIsLoaded";
    if (!HAVE(cuFuncGetAttribute)) missing[nmissing++] = "cuFuncGetAttribute";
    for (int i = 0; i < nmissing; i++) out("   (the driver does not export %s)", missing[i]);
    int failures = 0;

    if (wanted(only, "i")) {
        out("== (i) a stream waits on a pinned host word; a kernel + cuStreamWriteValue32 on a stream made k streams later (same context) releases it; %.0f ms each ==",
            release_window_us / 1e3);
        char list[64];
        snprintf(list, sizeof list, "%s", connections);
        for (char *c = strtok(list, ","); c; c = strtok(NULL, ",")) {
            char what[64];
            snprintf(what, sizeof what, "(i) CUDA_DEVICE_MAX_CONNECTIONS=%s", c);
            failures += in_child(what, probe_release, NULL, "CUDA_DEVICE_MAX_CONNECTIONS", c) != 0;
        }
    }
    if (wanted(only, "ii")) {
        out("== (ii) thread B's call while thread A sits in a pageable cuMemcpyDtoHAsync behind a stream waiting on a host word (released %.0f ms after B's call) ==",
            B_WINDOW_US / 1e3);
        int handle_pipe[2], hold_pipe[2];
        pid_t exporter = -1;
        if (pipe(handle_pipe) == 0 && pipe(hold_pipe) == 0) {
            fflush(stdout);
            exporter = fork();
            if (exporter == 0) {
                close(handle_pipe[0]);
                close(hold_pipe[1]);
                run_exporter(handle_pipe[1], hold_pipe[0]);
            }
            close(handle_pipe[1]);
            close(hold_pipe[0]);
            struct pollfd p = {handle_pipe[0], POLLIN, 0};
            if (exporter > 0 && poll(&p, 1, 20000) > 0 && read(handle_pipe[0], &exported, sizeof exported) == (ssize_t)sizeof exported)
                have_exported = 1;
            else
                out("   (no IPC handle from an exporting process: the IPC open and close rows are skipped)");
            close(handle_pipe[0]);
        }
        out("   %-48s | verdict | when it returned", "call (thread B)");
        int next = 0;
        while (next < C_COUNT) {
            int last = -1;
            int rc = in_child_marked("(ii) calls behind a pageable copy", probe_locks, &next, NULL, NULL, &last);
            if (rc == 0) break;
            if (last < next) { /* its set-up failed: nothing more to learn here */
                failures++;
                break;
            }
            if (rc != RESUME_STATUS) {
                out("   %-48s | HANGS   | its process had to be killed (no progress for %d ms)", call_names[last], watchdog_ms);
                failures++;
            }
            next = last + 1;
        }
        if (exporter > 0) {
            close(hold_pipe[1]);
            kill(exporter, SIGKILL);
            waitpid(exporter, NULL, 0);
        }
    }
    if (wanted(only, "iii")) {
        out("== (iii) lazy loading: a function's state after cuModuleGetFunction, cuFuncGetAttribute and cuFuncLoad ==");
        failures += in_child("(iii) CUDA_MODULE_LOADING unset", probe_loading, NULL, "CUDA_MODULE_LOADING", NULL) != 0;
        failures += in_child("(iii) CUDA_MODULE_LOADING=EAGER", probe_loading, NULL, "CUDA_MODULE_LOADING", "EAGER") != 0;
    }
    if (wanted(only, "iv")) {
        out("== (iv) latencies ==");
        failures += in_child("(iv) latencies", probe_latency, NULL, NULL, NULL) != 0;
    }
    if (wanted(only, "v")) {
        out("== (v) two one-launch kernels of one context, on two streams, each waiting for the other's LL line ==");
        char list[64];
        snprintf(list, sizeof list, "%s", connections);
        for (char *c = strtok(list, ","); c; c = strtok(NULL, ",")) {
            char what[64];
            snprintf(what, sizeof what, "(v) CUDA_DEVICE_MAX_CONNECTIONS=%s", c);
            out("   CUDA_DEVICE_MAX_CONNECTIONS=%s:", c);
            failures += in_child(what, probe_ll, NULL, "CUDA_DEVICE_MAX_CONNECTIONS", c) != 0;
            failures += in_child(what, probe_ll, (void *)1, "CUDA_DEVICE_MAX_CONNECTIONS", c) != 0;
        }
    }
    out("driver_probes: %s", failures ? "some probes did not finish (see WATCHDOG lines)" : "every probe finished");
    return failures ? 1 : 0;
}
