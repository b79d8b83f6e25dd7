// A stand-in for the CUDA driver, NVRTC, cuBLAS and cuSOLVER over host
// memory, so that the CUDA chip's engine runs where there is no GPU: the
// conformance suite on `cuda:0` in CI, every driver call the engine makes
// answered as a driver would, with the checks a driver makes.
//
// What it keeps of a GPU:
// - device memory is its own mappings, apart from host memory; every copy,
//   memset and library call is checked to lie inside a live allocation
//   (and a registered or pinned host range, under FAKECUDA_STRICT_PINNED=1,
//   for an asynchronous copy of more than 64 bytes), and a copy into a
//   host range registered read-only is refused;
// - streams are threads: work queued on one runs later, in order, and
//   only cuStreamSynchronize waits for it (FAKECUDA_DELAY_US sleeps before
//   each piece of work, to show a missing wait as a wrong byte);
// - every call but the first needs a context current on the calling
//   thread;
// - a kernel that touches memory it may not (SIGSEGV, SIGBUS) loses the
//   context: CUDA_ERROR_ILLEGAL_ADDRESS from then on, for every call;
// - kernel sources are compiled by the host C++ compiler (kernel.h in
//   front), NVRTC's "PTX" is the source with its entries named (its
//   "CUBIN", for a real architecture only, that PTX behind an ELF magic
//   and before the entries' names),
//   and a module is the shared library built from it (cached by hash in
//   $FAKECUDA_CACHE, else /tmp/strata-fakecuda-<uid>).
//
// Devices: FAKECUDA_DEVICES (default 1), each of FAKECUDA_MEM_MIB MiB
// (default 4096; memory is reserved, not committed).
//
// scripts/fakecuda.sh builds it as libfakecuda.so and links the names the
// loaders look for (libcuda.so.1, libnvrtc.so.13, libcublas.so.13,
// libcusolver.so.12 and their unversioned names) to it.

#include <dlfcn.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <complex>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#define EXPORT extern "C" __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
    CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
    CUDA_ERROR_NOT_SUPPORTED = 801,
};

static const char KERNEL_H[] =
#include "kernel_h.inc"
    ;

// ---- Configuration and diagnostics ------------------------------------------

static unsigned env_u64(const char* name, unsigned long long dflt, unsigned long long* out) {
    const char* v = getenv(name);
    *out = v && *v ? strtoull(v, nullptr, 10) : dflt;
    return 0;
}

static void complain(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static void complain(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fakecuda: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}

struct Config {
    unsigned long long devices = 1, mem = 4096ull << 20, delay_us = 0;
    bool strict = false;
};
static Config g_cfg;
static std::once_flag g_init_once;

// ---- Contexts, memory tables -------------------------------------------------

struct Stream;

struct Ctx {
    int device = 0;
    int refs = 0;
    std::atomic<int> sticky{0};
    unsigned long long used = 0;
    // Shared: a stream destroyed while another thread waits for every
    // stream of the context lives until that wait ends.
    std::vector<std::shared_ptr<Stream>> streams;
    Stream* null_stream = nullptr;
};

static std::mutex g_mu;  // the tables below and every Ctx's fields but sticky
static std::vector<std::unique_ptr<Ctx>> g_ctx;
static thread_local Ctx* t_current = nullptr;

struct DevAlloc {
    size_t size;
    Ctx* ctx;
    bool vmm;  // a cuMemMap'd range, not a cuMemAlloc
};
struct HostRange {
    size_t size;
    bool read_only;
    bool allocated;  // cuMemAllocHost's, not a registration
};
static std::map<uintptr_t, DevAlloc> g_dev;
static std::map<uintptr_t, HostRange> g_host;

// Whether [p, p + n) lies inside one live device allocation (g_mu held).
static bool dev_range(CUdeviceptr p, size_t n) {
    auto it = g_dev.upper_bound((uintptr_t)p);
    if (it == g_dev.begin()) return false;
    --it;
    return p >= it->first && p + n <= it->first + it->second.size && p + n >= p;
}

// The registered or pinned range holding [p, p + n), or null (g_mu held).
static const HostRange* host_range(const void* p, size_t n) {
    uintptr_t a = (uintptr_t)p;
    auto it = g_host.upper_bound(a);
    if (it == g_host.begin()) return nullptr;
    --it;
    if (a >= it->first && a + n <= it->first + it->second.size) return &it->second;
    return nullptr;
}

// ---- Streams -------------------------------------------------------------------

static thread_local sigjmp_buf* t_fault = nullptr;

struct Stream {
    Ctx* ctx;
    int priority;
    std::mutex m;
    std::condition_variable cv;
    std::deque<std::function<void()>> q;
    bool busy = false, stop = false;
    std::thread th;

    Stream(Ctx* c, int p) : ctx(c), priority(p) {
        th = std::thread([this] { loop(); });
    }
    void push(std::function<void()> f) {
        std::lock_guard<std::mutex> l(m);
        q.push_back(std::move(f));
        cv.notify_all();
    }
    void loop() {
        // Faults are caught on this thread's own signal stack (a kernel's
        // coroutine stack may be the one that overflowed).
        stack_t ss;
        ss.ss_size = 1 << 16;
        ss.ss_sp = malloc(ss.ss_size);
        ss.ss_flags = 0;
        sigaltstack(&ss, nullptr);
        t_current = ctx;
        for (;;) {
            std::function<void()> f;
            {
                std::unique_lock<std::mutex> l(m);
                cv.wait(l, [&] { return stop || !q.empty(); });
                if (q.empty()) break;
                f = std::move(q.front());
                q.pop_front();
                busy = true;
            }
            if (g_cfg.delay_us) usleep((useconds_t)g_cfg.delay_us);
            if (ctx->sticky.load() == 0) f();
            {
                std::lock_guard<std::mutex> l(m);
                busy = false;
                cv.notify_all();
            }
        }
        ss.ss_flags = SS_DISABLE;
        sigaltstack(&ss, nullptr);
    }
    int sync() {
        std::unique_lock<std::mutex> l(m);
        cv.wait(l, [&] { return q.empty() && !busy; });
        return ctx->sticky.load();
    }
    ~Stream() {
        {
            std::lock_guard<std::mutex> l(m);
            stop = true;
            cv.notify_all();
        }
        // At process exit the thread may be gone already (the join then
        // fails with ESRCH): nothing is left to wait for, and a throw
        // from a destructor would abort the exiting process.
        try {
            if (th.joinable()) th.join();
        } catch (const std::system_error&) {
        }
    }
};

static struct sigaction g_old_segv, g_old_bus;

static void on_fault(int sig, siginfo_t* si, void* uc) {
    if (t_fault) siglongjmp(*t_fault, 1);
    struct sigaction* old = sig == SIGSEGV ? &g_old_segv : &g_old_bus;
    if (old->sa_flags & SA_SIGINFO) {
        old->sa_sigaction(sig, si, uc);
    } else if (old->sa_handler == SIG_DFL || old->sa_handler == SIG_IGN) {
        sigaction(sig, old, nullptr);  // the fault recurs, unhandled
    } else {
        old->sa_handler(sig);
    }
}

static void init_once() {
    env_u64("FAKECUDA_DEVICES", 1, &g_cfg.devices);
    unsigned long long mib;
    env_u64("FAKECUDA_MEM_MIB", 4096, &mib);
    g_cfg.mem = mib << 20;
    env_u64("FAKECUDA_DELAY_US", 0, &g_cfg.delay_us);
    const char* s = getenv("FAKECUDA_STRICT_PINNED");
    g_cfg.strict = s && strcmp(s, "1") == 0;
    for (unsigned long long d = 0; d < g_cfg.devices; ++d) {
        g_ctx.emplace_back(new Ctx);
        g_ctx.back()->device = (int)d;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_old_segv);
    sigaction(SIGBUS, &sa, &g_old_bus);
}

static std::atomic<bool> g_inited{false};

#define NEED_INIT \
    if (!g_inited) return CUDA_ERROR_NOT_INITIALIZED
#define NEED_CTX                                                   \
    NEED_INIT;                                                     \
    if (t_current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;   \
    if (int sticky_ = t_current->sticky.load()) return sticky_

// The stream to queue on: `s`, or the context's own for the null stream.
static Stream* stream_of(void* s) {
    if (s) return (Stream*)s;
    std::lock_guard<std::mutex> l(g_mu);
    if (!t_current->null_stream) {
        t_current->streams.push_back(std::make_shared<Stream>(t_current, 0));
        t_current->null_stream = t_current->streams.back().get();
    }
    return t_current->null_stream;
}

static int sync_all(Ctx* c) {
    std::vector<std::shared_ptr<Stream>> streams;
    {
        std::lock_guard<std::mutex> l(g_mu);
        streams = c->streams;
    }
    for (const std::shared_ptr<Stream>& s : streams) s->sync();
    return c->sticky.load();
}

// ---- Initialization, devices, contexts -------------------------------------------

EXPORT CUresult cuInit(unsigned int) {
    std::call_once(g_init_once, init_once);
    g_inited = true;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int* v) {
    *v = 13000;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int* n) {
    NEED_INIT;
    *n = (int)g_cfg.devices;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice* d, int ordinal) {
    NEED_INIT;
    if (ordinal < 0 || (unsigned long long)ordinal >= g_cfg.devices) return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetName(char* name, int len, CUdevice d) {
    NEED_INIT;
    snprintf(name, (size_t)len, "strata fake GPU %d", d);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice) {
    NEED_INIT;
    *bytes = g_cfg.mem;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetAttribute(int* v, int attr, CUdevice d) {
    NEED_INIT;
    if (d < 0 || (unsigned long long)d >= g_cfg.devices) return CUDA_ERROR_INVALID_DEVICE;
    switch (attr) {
        case 75: *v = 9; break;  // compute capability major
        case 76: *v = 0; break;  // minor
        default: *v = 0; break;  // memory pools and the rest: not offered
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(void** ctx, CUdevice d) {
    NEED_INIT;
    if (d < 0 || (unsigned long long)d >= g_cfg.devices) return CUDA_ERROR_INVALID_DEVICE;
    std::lock_guard<std::mutex> l(g_mu);
    g_ctx[(size_t)d]->refs++;
    *ctx = g_ctx[(size_t)d].get();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
    NEED_INIT;
    if (d < 0 || (unsigned long long)d >= g_cfg.devices) return CUDA_ERROR_INVALID_DEVICE;
    std::lock_guard<std::mutex> l(g_mu);
    if (g_ctx[(size_t)d]->refs > 0) g_ctx[(size_t)d]->refs--;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(void* ctx) {
    NEED_INIT;
    t_current = (Ctx*)ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(void** ctx) {
    NEED_INIT;
    *ctx = t_current;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSynchronize() {
    NEED_CTX;
    return sync_all(t_current);
}

EXPORT CUresult cuCtxGetStreamPriorityRange(int* least, int* greatest) {
    NEED_CTX;
    *least = 0;
    *greatest = -5;
    return CUDA_SUCCESS;
}

struct ErrorName {
    int code;
    const char* name;
    const char* text;
};
static const ErrorName ERRORS[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {200, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
    {712, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", "part or all of the requested memory range is already mapped"},
    {713, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", "pointer does not correspond to a registered memory region"},
};

EXPORT CUresult cuGetErrorName(int code, const char** out) {
    for (const ErrorName& e : ERRORS)
        if (e.code == code) {
            *out = e.name;
            return CUDA_SUCCESS;
        }
    *out = nullptr;
    return CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuGetErrorString(int code, const char** out) {
    for (const ErrorName& e : ERRORS)
        if (e.code == code) {
            *out = e.text;
            return CUDA_SUCCESS;
        }
    *out = nullptr;
    return CUDA_ERROR_INVALID_VALUE;
}

// ---- Streams ---------------------------------------------------------------------

EXPORT CUresult cuStreamCreateWithPriority(void** s, unsigned int, int priority) {
    NEED_CTX;
    std::lock_guard<std::mutex> l(g_mu);
    t_current->streams.push_back(std::make_shared<Stream>(t_current, priority));
    *s = t_current->streams.back().get();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamCreate(void** s, unsigned int flags) {
    return cuStreamCreateWithPriority(s, flags, 0);
}

EXPORT CUresult cuStreamSynchronize(void* s) {
    NEED_INIT;
    if (t_current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    return stream_of(s)->sync();
}

EXPORT CUresult cuStreamDestroy_v2(void* s) {
    NEED_INIT;
    if (t_current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    std::shared_ptr<Stream> st;
    {
        std::lock_guard<std::mutex> l(g_mu);
        for (auto& c : g_ctx) {
            auto& v = c->streams;
            for (size_t i = 0; i < v.size(); ++i)
                if (v[i].get() == s) {
                    st = v[i];
                    v.erase(v.begin() + (long)i);
                    break;
                }
        }
    }
    if (!st) return CUDA_ERROR_INVALID_HANDLE;
    st->sync();
    return CUDA_SUCCESS;
}

// ---- Events: the time their stream reached them -----------------------------------

struct Event {
    std::atomic<bool> done{false};
    std::chrono::steady_clock::time_point at;
};

EXPORT CUresult cuEventCreate(Event** e, unsigned int) {
    NEED_CTX;
    *e = new Event;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventDestroy_v2(Event* e) {
    NEED_INIT;
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    delete e;  // the caller waited for its stream (as the driver requires)
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventRecord(Event* e, void* s) {
    NEED_CTX;
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    e->done.store(false);
    stream_of(s)->push([e] {
        e->at = std::chrono::steady_clock::now();
        e->done.store(true);
    });
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventElapsedTime_v2(float* ms, Event* a, Event* b) {
    NEED_CTX;
    if (!a || !b) return CUDA_ERROR_INVALID_HANDLE;
    if (!a->done.load() || !b->done.load()) return 600;  // CUDA_ERROR_NOT_READY
    *ms = std::chrono::duration<float, std::milli>(b->at - a->at).count();
    return CUDA_SUCCESS;
}

// ---- Memory ------------------------------------------------------------------------

EXPORT CUresult cuMemGetInfo_v2(size_t* free_, size_t* total) {
    NEED_CTX;
    std::lock_guard<std::mutex> l(g_mu);
    *free_ = g_cfg.mem - t_current->used;
    *total = g_cfg.mem;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t size) {
    NEED_CTX;
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> l(g_mu);
    if (t_current->used + size > g_cfg.mem) return CUDA_ERROR_OUT_OF_MEMORY;
    void* m = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    t_current->used += size;
    g_dev[(uintptr_t)m] = DevAlloc{size, t_current, false};
    *p = (CUdeviceptr)(uintptr_t)m;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
    NEED_INIT;
    if (t_current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    // Freeing waits for the device, as the driver's does.
    sync_all(t_current);
    std::lock_guard<std::mutex> l(g_mu);
    auto it = g_dev.find((uintptr_t)p);
    if (it == g_dev.end() || it->second.vmm) {
        complain("cuMemFree of %#llx, which no cuMemAlloc returned", p);
        return CUDA_ERROR_INVALID_VALUE;
    }
    it->second.ctx->used -= it->second.size;
    munmap((void*)it->first, it->second.size);
    g_dev.erase(it);
    return t_current->sticky.load();
}

EXPORT CUresult cuMemAllocHost_v2(void** p, size_t size) {
    NEED_CTX;
    void* m = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    std::lock_guard<std::mutex> l(g_mu);
    g_host[(uintptr_t)m] = HostRange{size, false, true};
    *p = m;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemFreeHost(void* p) {
    NEED_INIT;
    std::lock_guard<std::mutex> l(g_mu);
    auto it = g_host.find((uintptr_t)p);
    if (it == g_host.end() || !it->second.allocated) return CUDA_ERROR_INVALID_VALUE;
    munmap(p, it->second.size);
    g_host.erase(it);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemHostRegister_v2(void* p, size_t size, unsigned int flags) {
    NEED_CTX;
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> l(g_mu);
    uintptr_t a = (uintptr_t)p;
    // No overlap with a range registered or pinned already.
    auto it = g_host.lower_bound(a);
    if (it != g_host.end() && it->first < a + size) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    if (it != g_host.begin()) {
        --it;
        if (it->first + it->second.size > a) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    }
    g_host[a] = HostRange{size, (flags & 8) != 0, false};
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemHostUnregister(void* p) {
    NEED_INIT;
    if (t_current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    std::lock_guard<std::mutex> l(g_mu);
    auto it = g_host.find((uintptr_t)p);
    if (it == g_host.end() || it->second.allocated) return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    g_host.erase(it);
    return CUDA_SUCCESS;
}

// Checks a copy's ranges: device ones inside allocations; an asynchronous
// copy's host side pinned (under FAKECUDA_STRICT_PINNED=1, beyond 64
// bytes); no write into a read-only registration.
static CUresult check_copy(const char* call, const void* host, size_t host_len, bool host_written,
                           bool async, CUdeviceptr dev, size_t dev_len, CUdeviceptr dev2 = 0,
                           size_t dev2_len = 0) {
    std::lock_guard<std::mutex> l(g_mu);
    if (dev_len && !dev_range(dev, dev_len)) {
        complain("%s: device range %#llx+%zu is not inside one allocation", call, dev, dev_len);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (dev2_len && !dev_range(dev2, dev2_len)) {
        complain("%s: device range %#llx+%zu is not inside one allocation", call, dev2, dev2_len);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (host_len) {
        const HostRange* r = host_range(host, host_len);
        if (r && r->read_only && host_written) {
            complain("%s: writes %zu bytes at %p, registered read-only", call, host_len, host);
            return CUDA_ERROR_INVALID_VALUE;
        }
        if (!r && async && g_cfg.strict && host_len > 64) {
            complain("%s: %zu bytes at %p are neither registered nor pinned (FAKECUDA_STRICT_PINNED=1)",
                     call, host_len, host);
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    return CUDA_SUCCESS;
}

// A synchronous copy from pageable host memory returns once the bytes are
// staged, before the DMA to the device has ended: the fake stages them and
// lands them on the legacy stream, which only a wait on it (or another
// synchronous copy, ordered after it) waits for. The lanes' non-blocking
// streams do not.
EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
    NEED_CTX;
    if (CUresult r = check_copy("cuMemcpyHtoD", src, n, false, false, dst, n)) return r;
    bool pageable;
    {
        std::lock_guard<std::mutex> l(g_mu);
        pageable = host_range(src, n) == nullptr;
    }
    if (pageable) {
        auto staged = std::make_shared<std::vector<char>>((const char*)src, (const char*)src + n);
        stream_of(nullptr)->push([=] { memcpy((void*)(uintptr_t)dst, staged->data(), n); });
        return CUDA_SUCCESS;
    }
    if (int r = stream_of(nullptr)->sync()) return (CUresult)r;
    memcpy((void*)(uintptr_t)dst, src, n);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) {
    NEED_CTX;
    if (CUresult r = check_copy("cuMemcpyDtoH", dst, n, true, false, src, n)) return r;
    if (int r = stream_of(nullptr)->sync()) return (CUresult)r;
    memcpy(dst, (void*)(uintptr_t)src, n);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, void* s) {
    NEED_CTX;
    if (CUresult r = check_copy("cuMemcpyHtoDAsync", src, n, false, true, dst, n)) return r;
    stream_of(s)->push([=] { memcpy((void*)(uintptr_t)dst, src, n); });
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, void* s) {
    NEED_CTX;
    if (CUresult r = check_copy("cuMemcpyDtoHAsync", dst, n, true, true, src, n)) return r;
    stream_of(s)->push([=] { memcpy(dst, (void*)(uintptr_t)src, n); });
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, void* s) {
    NEED_CTX;
    if (CUresult r = check_copy("cuMemcpyDtoDAsync", nullptr, 0, false, true, dst, n, src, n)) return r;
    stream_of(s)->push([=] { memmove((void*)(uintptr_t)dst, (void*)(uintptr_t)src, n); });
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, void* s) {
    NEED_CTX;
    if (CUresult r = check_copy("cuMemsetD8Async", nullptr, 0, false, true, dst, n)) return r;
    stream_of(s)->push([=] { memset((void*)(uintptr_t)dst, v, n); });
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n) {
    NEED_CTX;
    if (CUresult r = check_copy("cuMemsetD8", nullptr, 0, false, false, dst, n)) return r;
    memset((void*)(uintptr_t)dst, v, n);
    return CUDA_SUCCESS;
}

struct Memcpy2D {
    size_t srcXInBytes, srcY;
    int srcMemoryType;
    const void* srcHost;
    CUdeviceptr srcDevice;
    void* srcArray;
    size_t srcPitch;
    size_t dstXInBytes, dstY;
    int dstMemoryType;
    void* dstHost;
    CUdeviceptr dstDevice;
    void* dstArray;
    size_t dstPitch;
    size_t WidthInBytes, Height;
};

EXPORT CUresult cuMemcpy2DAsync_v2(const Memcpy2D* p, void* s) {
    NEED_CTX;
    const Memcpy2D c = *p;
    const int HOST = 1, DEVICE = 2;
    if (c.srcArray || c.dstArray || (c.srcMemoryType != HOST && c.srcMemoryType != DEVICE) ||
        (c.dstMemoryType != HOST && c.dstMemoryType != DEVICE)) {
        complain("cuMemcpy2DAsync: only host and device memory (types %d, %d)", c.srcMemoryType,
                 c.dstMemoryType);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (c.Height == 0 || c.WidthInBytes == 0) return CUDA_SUCCESS;
    if (c.WidthInBytes > c.srcPitch || c.WidthInBytes > c.dstPitch) {
        complain("cuMemcpy2DAsync: width %zu exceeds a pitch (%zu, %zu)", c.WidthInBytes, c.srcPitch,
                 c.dstPitch);
        return CUDA_ERROR_INVALID_VALUE;
    }
    auto start = [](int type, const void* host, CUdeviceptr dev, size_t x, size_t y, size_t pitch) {
        uintptr_t base = type == 1 ? (uintptr_t)host : (uintptr_t)dev;
        return base + x + y * pitch;
    };
    uintptr_t src = start(c.srcMemoryType, c.srcHost, c.srcDevice, c.srcXInBytes, c.srcY, c.srcPitch);
    uintptr_t dst = start(c.dstMemoryType, c.dstHost, c.dstDevice, c.dstXInBytes, c.dstY, c.dstPitch);
    size_t src_len = (c.Height - 1) * c.srcPitch + c.WidthInBytes;
    size_t dst_len = (c.Height - 1) * c.dstPitch + c.WidthInBytes;
    for (int side = 0; side < 2; ++side) {
        int type = side ? c.dstMemoryType : c.srcMemoryType;
        uintptr_t at = side ? dst : src;
        size_t len = side ? dst_len : src_len;
        CUresult r = type == DEVICE
                         ? check_copy("cuMemcpy2DAsync", nullptr, 0, false, true, (CUdeviceptr)at, len)
                         : check_copy("cuMemcpy2DAsync", (const void*)at, len, side == 1, true, 0, 0);
        if (r) return r;
    }
    stream_of(s)->push([=] {
        for (size_t row = 0; row < c.Height; ++row)
            memcpy((void*)(dst + row * c.dstPitch), (const void*)(src + row * c.srcPitch), c.WidthInBytes);
    });
    return CUDA_SUCCESS;
}

// ---- Virtual memory management: physical allocations are memfds ---------------------
//
// A physical allocation is a memfd named for its device, so that an
// exported handle (a dup of it) imports in another process as the same
// memory, and a descriptor of anything else is refused on import.

struct Prop {
    int type;
    int handle_types;
    int location_type;
    int location_id;
    void* win32;
    unsigned char flags[8];
};
struct AccessDesc {
    int location_type;
    int location_id;
    int flags;
};
struct Phys {
    int fd;
    size_t size;
    int device;
    bool exportable;
    bool imported;
};
static const size_t GRANULARITY = 2 << 20;
static std::map<uintptr_t, size_t> g_reserved;

EXPORT CUresult cuMemGetAllocationGranularity(size_t* g, const Prop* p, int) {
    NEED_CTX;
    if (!p || p->type != 1 || p->location_type != 1) return CUDA_ERROR_INVALID_VALUE;
    *g = GRANULARITY;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemCreate(unsigned long long* h, size_t size, const Prop* p, unsigned long long flags) {
    NEED_CTX;
    if (!p || p->type != 1 || p->location_type != 1 || flags || size == 0 || size % GRANULARITY) {
        complain("cuMemCreate: size %zu (granularity %zu), type %d, location type %d", size, GRANULARITY,
                 p ? p->type : -1, p ? p->location_type : -1);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (p->location_id < 0 || (unsigned long long)p->location_id >= g_cfg.devices) return CUDA_ERROR_INVALID_DEVICE;
    Ctx* dev = g_ctx[(size_t)p->location_id].get();
    std::lock_guard<std::mutex> l(g_mu);
    if (dev->used + size > g_cfg.mem) return CUDA_ERROR_OUT_OF_MEMORY;
    std::string name = "fakecuda-vmm-" + std::to_string(p->location_id);
    int fd = memfd_create(name.c_str(), MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
        if (fd >= 0) close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    dev->used += size;
    *h = (unsigned long long)(uintptr_t) new Phys{fd, size, p->location_id, (p->handle_types & 1) != 0, false};
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemRelease(unsigned long long h) {
    NEED_INIT;
    Phys* ph = (Phys*)(uintptr_t)h;
    if (!ph) return CUDA_ERROR_INVALID_HANDLE;
    std::lock_guard<std::mutex> l(g_mu);
    if (!ph->imported) g_ctx[(size_t)ph->device]->used -= ph->size;
    close(ph->fd);  // the memory lives on while a mapping or a descriptor holds it
    delete ph;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t, CUdeviceptr, unsigned long long) {
    NEED_CTX;
    if (size == 0 || size % GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
    void* m = mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    std::lock_guard<std::mutex> l(g_mu);
    g_reserved[(uintptr_t)m] = size;
    *ptr = (CUdeviceptr)(uintptr_t)m;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    NEED_INIT;
    std::lock_guard<std::mutex> l(g_mu);
    auto it = g_reserved.find((uintptr_t)ptr);
    if (it == g_reserved.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
    munmap((void*)(uintptr_t)ptr, size);
    g_reserved.erase(it);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, unsigned long long h, unsigned long long) {
    NEED_CTX;
    Phys* ph = (Phys*)(uintptr_t)h;
    if (!ph || offset + size > ph->size) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> l(g_mu);
    auto it = g_reserved.upper_bound((uintptr_t)ptr);
    if (it == g_reserved.begin()) return CUDA_ERROR_INVALID_VALUE;
    --it;
    if (ptr < it->first || ptr + size > it->first + it->second) return CUDA_ERROR_INVALID_VALUE;
    void* m = mmap((void*)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, ph->fd, (off_t)offset);
    if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    g_dev[(uintptr_t)ptr] = DevAlloc{size, t_current, true};
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const AccessDesc* d, size_t count) {
    NEED_CTX;
    if (count != 1 || d->location_type != 1 || d->flags != 3) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> l(g_mu);
    auto it = g_dev.find((uintptr_t)ptr);
    if (it == g_dev.end() || !it->second.vmm || it->second.size != size) return CUDA_ERROR_INVALID_VALUE;
    return mprotect((void*)(uintptr_t)ptr, size, PROT_READ | PROT_WRITE) == 0 ? CUDA_SUCCESS
                                                                             : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    NEED_INIT;
    if (t_current) sync_all(t_current);
    std::lock_guard<std::mutex> l(g_mu);
    auto it = g_dev.find((uintptr_t)ptr);
    if (it == g_dev.end() || !it->second.vmm || it->second.size != size) return CUDA_ERROR_INVALID_VALUE;
    g_dev.erase(it);
    mmap((void*)(uintptr_t)ptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemExportToShareableHandle(void* out, unsigned long long h, int type, unsigned long long) {
    NEED_CTX;
    Phys* ph = (Phys*)(uintptr_t)h;
    if (!ph || type != 1 || !ph->exportable) return CUDA_ERROR_INVALID_VALUE;
    int fd = fcntl(ph->fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    *(int*)out = fd;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemImportFromShareableHandle(unsigned long long* h, void* os_handle, int type) {
    NEED_CTX;
    if (type != 1) return CUDA_ERROR_INVALID_VALUE;
    int fd = (int)(intptr_t)os_handle;
    char link[256] = {0};
    std::string path = "/proc/self/fd/" + std::to_string(fd);
    ssize_t n = readlink(path.c_str(), link, sizeof link - 1);
    const char prefix[] = "/memfd:fakecuda-vmm-";
    if (n <= 0 || strncmp(link, prefix, strlen(prefix)) != 0) {
        complain("cuMemImportFromShareableHandle: descriptor %d (%s) is no exported allocation", fd,
                 n > 0 ? link : "?");
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) return CUDA_ERROR_INVALID_VALUE;
    int copy = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (copy < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    *h = (unsigned long long)(uintptr_t) new Phys{copy, (size_t)st.st_size, atoi(link + strlen(prefix)), false, true};
    return CUDA_SUCCESS;
}

// ---- Kernel sources: compiled by the host compiler ------------------------------------

static std::string cache_dir() {
    const char* d = getenv("FAKECUDA_CACHE");
    std::string dir = d && *d ? d : "/tmp/strata-fakecuda-" + std::to_string(getuid());
    mkdir(dir.c_str(), 0700);
    return dir;
}

static std::string read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

static bool write_file(const std::string& path, const std::string& text) {
    std::ofstream f(path, std::ios::binary);
    f << text;
    return bool(f);
}

static std::string shell_quote(const std::string& s) {
    std::string out = "'";
    for (char ch : s) {
        if (ch == '\'')
            out += "'\\''";
        else
            out += ch;
    }
    return out + "'";
}

static std::string compiler() {
    const char* cxx = getenv("CXX");
    return cxx && *cxx ? cxx : "g++";
}

// Runs `cmd`, its stderr in `log`; whether it succeeded.
static bool run(const std::string& cmd, const std::string& err_path, std::string* log) {
    int rc = system((cmd + " 2> " + shell_quote(err_path)).c_str());
    *log = read_file(err_path);
    unlink(err_path.c_str());
    return rc == 0;
}

// The names of the source's extern "C" __global__ functions, after the
// preprocessor (entries are often made by macros).
static bool entries_of(const std::string& src, const std::string& dir, std::vector<std::string>* names,
                       std::string* log) {
    std::string base = dir + "/pre-" + std::to_string(getpid()) + "-" +
                       std::to_string((unsigned long long)std::hash<std::thread::id>()(std::this_thread::get_id()));
    if (!write_file(base + ".cu", src)) {
        *log = "fakecuda: cannot write " + base + ".cu";
        return false;
    }
    bool ok = run(compiler() + " -E -P -x c++ " + shell_quote(base + ".cu") + " -o " + shell_quote(base + ".i"),
                  base + ".err", log);
    unlink((base + ".cu").c_str());
    if (!ok) return false;
    std::string text = read_file(base + ".i");
    unlink((base + ".i").c_str());
    const std::string mark = "__global__";
    for (size_t at = text.find(mark); at != std::string::npos; at = text.find(mark, at + 1)) {
        // extern "C" since the last statement ended.
        size_t from = text.find_last_of(";}", at);
        from = from == std::string::npos ? 0 : from;
        if (text.substr(from, at - from).find("extern \"C\"") == std::string::npos) continue;
        size_t p = at + mark.size();
        auto skip = [&] {
            while (p < text.size() && isspace((unsigned char)text[p])) ++p;
        };
        skip();
        if (text.compare(p, 4, "void") != 0) continue;
        p += 4;
        skip();
        size_t name = p;
        while (p < text.size() && (isalnum((unsigned char)text[p]) || text[p] == '_')) ++p;
        if (p == name) continue;
        std::string n = text.substr(name, p - name);
        skip();
        if (p < text.size() && text[p] == '(') names->push_back(n);
    }
    return true;
}

// Builds `src` into a shared library (cached by hash); its path, or false
// with the compiler's log.
static bool build(const std::string& src, const std::string& label, std::string* so, std::string* log,
                  std::vector<std::string>* entries) {
    std::string dir = cache_dir();
    if (!entries_of(src, dir, entries, log)) return false;
    std::string unit = std::string(KERNEL_H) + "\n#line 1 \"" + label + "\"\n" + src + "\n";
    for (const std::string& e : *entries) {
        unit += "extern \"C\" void strata_fake_entry_" + e + "(void** p) { strata_fake_call(&" + e + ", p); }\n";
        unit += "extern \"C\" int strata_fake_sizes_" + e + "(size_t* out) { return strata_fake_sizes(&" + e +
                ", out); }\n";
    }
    char hash[32];
    snprintf(hash, sizeof hash, "%016zx%08zx", std::hash<std::string>()(unit), unit.size());
    *so = dir + "/" + hash + ".so";
    struct stat st;
    if (stat(so->c_str(), &st) == 0) return true;
    std::string tmp = dir + "/" + hash + "-" + std::to_string(getpid()) + "-" +
                      std::to_string((unsigned long long)std::hash<std::thread::id>()(std::this_thread::get_id()));
    if (!write_file(tmp + ".cpp", unit)) {
        *log = "fakecuda: cannot write " + tmp + ".cpp";
        return false;
    }
    bool ok = run(compiler() + " -std=c++17 -O1 -fPIC -shared -pthread -ffp-contract=off -w -o " +
                      shell_quote(tmp + ".so") + " " + shell_quote(tmp + ".cpp"),
                  tmp + ".err", log);
    unlink((tmp + ".cpp").c_str());
    if (!ok) {
        unlink((tmp + ".so").c_str());
        return false;
    }
    return rename((tmp + ".so").c_str(), so->c_str()) == 0;
}

static const char PTX_HEADER[] = "// strata fakecuda ptx 1\n";
static const char PTX_SOURCE[] = "// strata fakecuda source\n";

// ---- NVRTC -------------------------------------------------------------------------------

struct Program {
    std::string src, name, ptx, log;
    // Compiled for a real architecture (sm_XY): a CUBIN is there too.
    bool real = false;
    std::vector<std::string> entries;
};

// The fake's CUBIN: an ELF magic and a line, the PTX and its NUL, then
// each entry's name and a NUL (as an ELF's string table names them).
static const char CUBIN_MAGIC[] = "\x7f" "ELF strata fakecuda cubin 1\n";

EXPORT int nvrtcVersion(int* major, int* minor) {
    // Not a real NVRTC's version: its PTX is not a real NVRTC's.
    *major = 0;
    *minor = 1;
    return 0;
}

EXPORT const char* nvrtcGetErrorString(int code) {
    switch (code) {
        case 0: return "NVRTC_SUCCESS";
        case 3: return "NVRTC_ERROR_INVALID_INPUT";
        case 4: return "NVRTC_ERROR_INVALID_PROGRAM";
        case 5: return "NVRTC_ERROR_INVALID_OPTION";
        case 6: return "NVRTC_ERROR_COMPILATION";
        default: return "NVRTC_ERROR_INTERNAL_ERROR";
    }
}

EXPORT int nvrtcCreateProgram(Program** prog, const char* src, const char* name, int num_headers,
                              const char* const*, const char* const*) {
    if (!prog || !src) return 3;
    if (num_headers != 0) return 3;  // strata passes none; not modelled
    *prog = new Program{src, name ? name : "default_program", "", ""};
    return 0;
}

EXPORT int nvrtcDestroyProgram(Program** prog) {
    if (!prog || !*prog) return 4;
    delete *prog;
    *prog = nullptr;
    return 0;
}

EXPORT int nvrtcCompileProgram(Program* prog, int n, const char* const* opts) {
    if (!prog) return 4;
    std::string target = "sm_52";  // NVRTC's default architecture
    for (int i = 0; i < n; ++i) {
        std::string o = opts[i];
        const std::string arch = "--gpu-architecture=";
        if (o.compare(0, arch.size(), arch) == 0) {
            std::string a = o.substr(arch.size());
            bool ok = (a.compare(0, 8, "compute_") == 0 && a.size() > 8) || (a.compare(0, 3, "sm_") == 0 && a.size() > 3);
            for (size_t k = a.find('_') + 1; ok && k < a.size(); ++k) ok = isdigit((unsigned char)a[k]) || a[k] == 'a';
            if (!ok) {
                prog->log = "nvrtc: error: invalid value for --gpu-architecture (-arch)\n";
                return 5;
            }
            target = "sm_" + a.substr(a.find('_') + 1);
            prog->real = a.compare(0, 3, "sm_") == 0;
        } else if (o != "--std=c++17" && o != "--fmad=false" && o != "--no-source-include" && o != "-default-device") {
            prog->log = "nvrtc: error: unrecognized option " + o + "\n";
            return 5;
        }
    }
    std::string so, log;
    std::vector<std::string> entries;
    if (!build(prog->src, prog->name, &so, &log, &entries)) {
        prog->log = log.empty() ? "error: the host compiler failed" : log;
        return 6;
    }
    std::string ptx = PTX_HEADER;
    ptx += ".target " + target + "\n";
    for (const std::string& e : entries) ptx += ".visible .entry " + e + "(\n)\n";
    ptx += PTX_SOURCE;
    ptx += prog->src;
    prog->ptx = ptx;
    prog->log = log;
    prog->entries = entries;
    return 0;
}

static std::string fake_cubin(const Program* prog) {
    std::string out = CUBIN_MAGIC;
    out += prog->ptx;
    out.push_back('\0');
    for (const std::string& e : prog->entries) {
        out += e;
        out.push_back('\0');
    }
    return out;
}

EXPORT int nvrtcGetPTXSize(Program* prog, size_t* size) {
    if (!prog) return 4;
    *size = prog->ptx.size() + 1;
    return 0;
}

EXPORT int nvrtcGetPTX(Program* prog, char* out) {
    if (!prog) return 4;
    memcpy(out, prog->ptx.c_str(), prog->ptx.size() + 1);
    return 0;
}

// As NVRTC: a CUBIN only for a real architecture (sm_XY); for a virtual
// one the call is refused.
EXPORT int nvrtcGetCUBINSize(Program* prog, size_t* size) {
    if (!prog) return 4;
    if (!prog->real || prog->ptx.empty()) return 3;  // NVRTC_ERROR_INVALID_INPUT
    *size = fake_cubin(prog).size();
    return 0;
}

EXPORT int nvrtcGetCUBIN(Program* prog, char* out) {
    if (!prog) return 4;
    if (!prog->real || prog->ptx.empty()) return 3;
    std::string image = fake_cubin(prog);
    memcpy(out, image.data(), image.size());
    return 0;
}

EXPORT int nvrtcGetProgramLogSize(Program* prog, size_t* size) {
    if (!prog) return 4;
    *size = prog->log.size() + 1;
    return 0;
}

EXPORT int nvrtcGetProgramLog(Program* prog, char* out) {
    if (!prog) return 4;
    memcpy(out, prog->log.c_str(), prog->log.size() + 1);
    return 0;
}

// ---- Modules and launches ---------------------------------------------------------------

typedef void (*EntryFn)(void**);
typedef int (*SizesFn)(size_t*);
typedef int (*RunFn)(EntryFn, void**, const unsigned int*);

struct Module;
struct Function {
    Module* module;
    std::string name;
    EntryFn entry;
    SizesFn sizes;
    // Dynamic shared memory a launch may ask (raised by cuFuncSetAttribute).
    unsigned int max_dynamic_shared = 48u << 10;
};

// What an H100/H200 gives a block: 227 KiB of shared memory when asked.
static const unsigned int k_max_shared_optin = 227u << 10;
struct Module {
    void* so;
    RunFn run;
    std::map<std::string, std::unique_ptr<Function>> functions;
};

EXPORT CUresult cuModuleLoadData(Module** out, const void* image) {
    NEED_CTX;
    // A CUBIN of the fake NVRTC carries its PTX after the magic line.
    const char* start = (const char*)image;
    if (strncmp(start, CUBIN_MAGIC, strlen(CUBIN_MAGIC)) == 0) start += strlen(CUBIN_MAGIC);
    std::string text = start;
    size_t at = text.find(PTX_SOURCE);
    if (text.compare(0, strlen(PTX_HEADER), PTX_HEADER) != 0 || at == std::string::npos) {
        complain("cuModuleLoadData: not an image of the fake NVRTC");
        return CUDA_ERROR_INVALID_IMAGE;
    }
    std::string so, log;
    std::vector<std::string> entries;
    if (!build(text.substr(at + strlen(PTX_SOURCE)), "module.cu", &so, &log, &entries)) {
        complain("cuModuleLoadData: %s", log.c_str());
        return CUDA_ERROR_INVALID_IMAGE;
    }
    void* h = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        complain("cuModuleLoadData: %s", dlerror());
        return CUDA_ERROR_INVALID_IMAGE;
    }
    Module* m = new Module{h, (RunFn)dlsym(h, "strata_fake_run"), {}};
    if (!m->run) {
        dlclose(h);
        delete m;
        return CUDA_ERROR_INVALID_IMAGE;
    }
    *out = m;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuModuleUnload(Module* m) {
    NEED_INIT;
    if (!m) return CUDA_ERROR_INVALID_HANDLE;
    if (t_current) sync_all(t_current);
    dlclose(m->so);
    delete m;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuModuleGetFunction(Function** out, Module* m, const char* name) {
    NEED_CTX;
    if (!m) return CUDA_ERROR_INVALID_HANDLE;
    std::lock_guard<std::mutex> l(g_mu);
    auto it = m->functions.find(name);
    if (it == m->functions.end()) {
        std::string n = name;
        EntryFn e = (EntryFn)dlsym(m->so, ("strata_fake_entry_" + n).c_str());
        SizesFn s = (SizesFn)dlsym(m->so, ("strata_fake_sizes_" + n).c_str());
        if (!e || !s) return CUDA_ERROR_NOT_FOUND;
        it = m->functions.emplace(n, std::unique_ptr<Function>(new Function{m, n, e, s})).first;
    }
    *out = it->second.get();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuFuncSetAttribute(Function* f, int attrib, int value) {
    NEED_CTX;
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    if (attrib != 8) return CUDA_ERROR_NOT_SUPPORTED;  // only MAX_DYNAMIC_SHARED_SIZE_BYTES is modelled
    // The kernels' static shared memory is not known here: the whole
    // opt-in size is the bound.
    if (value < 0 || (unsigned int)value > k_max_shared_optin) return CUDA_ERROR_INVALID_VALUE;
    f->max_dynamic_shared = (unsigned int)value;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuLaunchKernel(Function* f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                               unsigned int by, unsigned int bz, unsigned int shared, void* s, void** params,
                               void** extra) {
    NEED_CTX;
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    if (extra) return CUDA_ERROR_INVALID_VALUE;  // not modelled
    if (!gx || !gy || !gz || !bx || !by || !bz) return CUDA_ERROR_INVALID_VALUE;
    // The driver's limits: a block's threads and axes, the grid's y and z,
    // and dynamic shared memory beyond 48 KiB only once the function's
    // attribute allows it.
    if ((unsigned long long)bx * by * bz > 1024 || bx > 1024 || by > 1024 || bz > 64) return CUDA_ERROR_INVALID_VALUE;
    if (gx > 0x7fffffffu || gy > 65535 || gz > 65535) return CUDA_ERROR_INVALID_VALUE;
    if (shared > f->max_dynamic_shared) return CUDA_ERROR_INVALID_VALUE;
    // The parameters are copied now, as the driver copies them.
    size_t sizes[64];
    int n = f->sizes(sizes);
    if (n > 64) return CUDA_ERROR_INVALID_VALUE;
    if (n > 0 && !params) return CUDA_ERROR_INVALID_VALUE;
    std::vector<size_t> offsets;
    size_t total = 0;
    for (int i = 0; i < n; ++i) {
        total = (total + 15) & ~size_t(15);
        offsets.push_back(total);
        total += sizes[i];
    }
    std::shared_ptr<std::vector<unsigned char>> copy = std::make_shared<std::vector<unsigned char>>(total + 16);
    for (int i = 0; i < n; ++i) memcpy(copy->data() + offsets[i], params[i], sizes[i]);
    const unsigned int grid[6] = {gx, gy, gz, bx, by, bz};
    Ctx* ctx = t_current;
    RunFn runner = f->module->run;
    EntryFn entry = f->entry;
    stream_of(s)->push([=] {
        std::vector<void*> ptrs;
        for (int i = 0; i < n; ++i) ptrs.push_back(copy->data() + offsets[i]);
        sigjmp_buf jb;
        if (sigsetjmp(jb, 1) == 0) {
            t_fault = &jb;
            int r = runner(entry, ptrs.data(), grid);
            t_fault = nullptr;
            if (r) ctx->sticky.store(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES);
        } else {
            t_fault = nullptr;
            ctx->sticky.store(CUDA_ERROR_ILLEGAL_ADDRESS);
        }
    });
    return CUDA_SUCCESS;
}

// ---- cuBLAS ------------------------------------------------------------------------------

struct BlasHandle {
    Ctx* ctx;
    void* stream = nullptr;
};

enum { BLAS_OK = 0, BLAS_NOT_INITIALIZED = 1, BLAS_INVALID_VALUE = 7, BLAS_EXECUTION_FAILED = 13 };

// The stream a library handle queues on: its own, or its context's
// default one.
static Stream* handle_stream(BlasHandle* h) {
    Ctx* saved = t_current;
    t_current = h->ctx;
    Stream* st = stream_of(h->stream);
    t_current = saved;
    return st;
}

// The libraries' versions, as CUDA 13.0's (cuSOLVER keeps its 12).
EXPORT int cublasGetProperty(int type, int* value) {
    static const int v[] = {13, 0, 0};
    if (type < 0 || type > 2) return 7;  // CUBLAS_STATUS_INVALID_VALUE
    *value = v[type];
    return 0;
}

EXPORT int cusolverGetProperty(int type, int* value) {
    static const int v[] = {12, 0, 0};
    if (type < 0 || type > 2) return 3;  // CUSOLVER_STATUS_INVALID_VALUE
    *value = v[type];
    return 0;
}

EXPORT int cublasCreate_v2(BlasHandle** h) {
    if (!t_current) return BLAS_NOT_INITIALIZED;
    *h = new BlasHandle{t_current};
    return BLAS_OK;
}

EXPORT int cublasDestroy_v2(BlasHandle* h) {
    if (!h) return BLAS_NOT_INITIALIZED;
    delete h;
    return BLAS_OK;
}

EXPORT int cublasSetStream_v2(BlasHandle* h, void* s) {
    if (!h) return BLAS_NOT_INITIALIZED;
    h->stream = s;
    return BLAS_OK;
}

// The 16-bit floats: round to nearest even from float, exact to float.
static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else {
            int e = -1;
            do {
                ++e;
                man <<= 1;
            } while (!(man & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000 | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static uint16_t float_to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t abs = x & 0x7fffffff;
    if (abs >= 0x7f800000) return sign | 0x7c00 | (abs > 0x7f800000 ? 0x200 : 0);
    if (abs >= 0x477ff000) return sign | 0x7c00;  // rounds to infinity
    if (abs < 0x38800000) {                       // subnormal or zero in half
        float a;
        memcpy(&a, &abs, 4);
        // a * 2^24 rounded to nearest even is the subnormal's mantissa.
        float scaled = a * 16777216.0f;
        return sign | (uint16_t)std::nearbyint(scaled);
    }
    uint32_t rounded = abs + 0xfff + ((abs >> 13) & 1);
    return sign | (uint16_t)((rounded - 0x38000000) >> 13);
}

static float bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static uint16_t float_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40);
    return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

// Column-major op(X)(i, j) of a matrix at p with leading dimension ld.
template <typename T>
static T at(const T* p, int ld, bool trans, int i, int j) {
    return trans ? p[(size_t)j + (size_t)i * ld] : p[(size_t)i + (size_t)j * ld];
}

// Whether an m×n column-major matrix with leading dimension ld lies in
// device memory.
static bool matrix_in(const void* p, int rows, int cols, int ld, size_t elem) {
    if (rows <= 0 || cols <= 0) return true;
    if (ld < rows) return false;
    std::lock_guard<std::mutex> l(g_mu);
    return dev_range((CUdeviceptr)(uintptr_t)p, ((size_t)(cols - 1) * ld + rows) * elem);
}

template <typename T, typename Acc, typename Load, typename Store>
static int gemm(BlasHandle* h, const char* call, int ta, int tb, int m, int n, int k, Acc alpha, const void* a,
                int lda, const void* b, int ldb, Acc beta, void* c, int ldc, Load load, Store store) {
    if (!h) return BLAS_NOT_INITIALIZED;
    if (m < 0 || n < 0 || k < 0 || ta < 0 || ta > 2 || tb < 0 || tb > 2) return BLAS_INVALID_VALUE;
    bool at_ = ta != 0, bt = tb != 0;
    if (!matrix_in(a, at_ ? k : m, at_ ? m : k, lda, sizeof(T)) ||
        !matrix_in(b, bt ? n : k, bt ? k : n, ldb, sizeof(T)) || !matrix_in(c, m, n, ldc, sizeof(T))) {
        complain("%s: a matrix is not inside device memory (m %d n %d k %d, ld %d %d %d)", call, m, n, k, lda,
                 ldb, ldc);
        return BLAS_EXECUTION_FAILED;
    }
    Stream* st = handle_stream(h);
    st->push([=] {
        const T* A = (const T*)a;
        const T* B = (const T*)b;
        T* C = (T*)c;
        for (int j = 0; j < n; ++j)
            for (int i = 0; i < m; ++i) {
                Acc sum = Acc(0);
                for (int l = 0; l < k; ++l) sum += load(at(A, lda, at_, i, l)) * load(at(B, ldb, bt, l, j));
                T& out = C[(size_t)i + (size_t)j * ldc];
                // beta = 0 ignores C (it may hold NaN), as cuBLAS does.
                Acc prior = beta == Acc(0) ? Acc(0) : beta * load(out);
                out = store(alpha * sum + prior);
            }
    });
    return BLAS_OK;
}

template <typename T>
static T same(T v) {
    return v;
}

EXPORT int cublasSgemm_v2(BlasHandle* h, int ta, int tb, int m, int n, int k, const float* alpha, const float* a,
                          int lda, const float* b, int ldb, const float* beta, float* c, int ldc) {
    return gemm<float, float>(h, "cublasSgemm", ta, tb, m, n, k, *alpha, a, lda, b, ldb, *beta, c, ldc,
                              same<float>, same<float>);
}

EXPORT int cublasDgemm_v2(BlasHandle* h, int ta, int tb, int m, int n, int k, const double* alpha,
                          const double* a, int lda, const double* b, int ldb, const double* beta, double* c,
                          int ldc) {
    return gemm<double, double>(h, "cublasDgemm", ta, tb, m, n, k, *alpha, a, lda, b, ldb, *beta, c, ldc,
                                same<double>, same<double>);
}

typedef std::complex<float> c64;
typedef std::complex<double> c128;

EXPORT int cublasCgemm_v2(BlasHandle* h, int ta, int tb, int m, int n, int k, const c64* alpha, const c64* a,
                          int lda, const c64* b, int ldb, const c64* beta, c64* c, int ldc) {
    if (ta == 2 || tb == 2) return BLAS_INVALID_VALUE;  // conjugates: not modelled
    return gemm<c64, c64>(h, "cublasCgemm", ta, tb, m, n, k, *alpha, a, lda, b, ldb, *beta, c, ldc, same<c64>,
                          same<c64>);
}

EXPORT int cublasZgemm_v2(BlasHandle* h, int ta, int tb, int m, int n, int k, const c128* alpha, const c128* a,
                          int lda, const c128* b, int ldb, const c128* beta, c128* c, int ldc) {
    if (ta == 2 || tb == 2) return BLAS_INVALID_VALUE;
    return gemm<c128, c128>(h, "cublasZgemm", ta, tb, m, n, k, *alpha, a, lda, b, ldb, *beta, c, ldc,
                            same<c128>, same<c128>);
}

EXPORT int cublasGemmEx(BlasHandle* h, int ta, int tb, int m, int n, int k, const void* alpha, const void* a,
                        int atype, int lda, const void* b, int btype, int ldb, const void* beta, void* c, int ctype,
                        int ldc, int compute, int) {
    const int R_16F = 2, R_16BF = 14, COMPUTE_32F = 68;
    if (atype != btype || atype != ctype || (atype != R_16F && atype != R_16BF) || compute != COMPUTE_32F) {
        complain("cublasGemmEx: types %d %d %d compute %d are not modelled", atype, btype, ctype, compute);
        return BLAS_INVALID_VALUE;
    }
    float al = *(const float*)alpha, be = *(const float*)beta;
    if (atype == R_16F)
        return gemm<uint16_t, float>(h, "cublasGemmEx", ta, tb, m, n, k, al, a, lda, b, ldb, be, c, ldc,
                                     half_to_float, float_to_half);
    return gemm<uint16_t, float>(h, "cublasGemmEx", ta, tb, m, n, k, al, a, lda, b, ldb, be, c, ldc,
                                 bf16_to_float, float_to_bf16);
}

// op(A)·X = α·B (left) or X·op(A) = α·B (right); X over B.
template <typename T>
static int trsm(BlasHandle* h, const char* call, int side, int uplo, int trans, int diag, int m, int n, T alpha,
                const T* a, int lda, T* b, int ldb) {
    if (!h) return BLAS_NOT_INITIALIZED;
    if (m < 0 || n < 0 || side < 0 || side > 1 || uplo < 0 || uplo > 1 || trans < 0 || trans > 2)
        return BLAS_INVALID_VALUE;
    int ka = side == 0 ? m : n;
    if (!matrix_in(a, ka, ka, lda, sizeof(T)) || !matrix_in(b, m, n, ldb, sizeof(T))) {
        complain("%s: a matrix is not inside device memory", call);
        return BLAS_EXECUTION_FAILED;
    }
    Stream* st = handle_stream(h);
    st->push([=] {
        bool tr = trans != 0;
        // op(A), dense, with the other triangle zero.
        std::vector<T> t((size_t)ka * ka, T(0));
        for (int j = 0; j < ka; ++j)
            for (int i = 0; i < ka; ++i) {
                bool stored = uplo == 0 ? i >= j : i <= j;  // of A itself
                if (stored) t[(size_t)i + (size_t)j * ka] = a[(size_t)i + (size_t)j * lda];
            }
        auto op = [&](int i, int j) { return tr ? t[(size_t)j + (size_t)i * ka] : t[(size_t)i + (size_t)j * ka]; };
        bool lower = (uplo == 0) != tr;  // op(A) lower triangular
        // Solves M·x = v for M = op(A) (left) or op(A)ᵀ (right).
        auto solve = [&](std::vector<T>& v, bool transpose) {
            auto mat = [&](int i, int j) { return transpose ? op(j, i) : op(i, j); };
            bool low = lower != transpose;
            if (low) {
                for (int i = 0; i < ka; ++i) {
                    T s = v[(size_t)i];
                    for (int l = 0; l < i; ++l) s -= mat(i, l) * v[(size_t)l];
                    v[(size_t)i] = diag ? s : s / mat(i, i);
                }
            } else {
                for (int i = ka - 1; i >= 0; --i) {
                    T s = v[(size_t)i];
                    for (int l = i + 1; l < ka; ++l) s -= mat(i, l) * v[(size_t)l];
                    v[(size_t)i] = diag ? s : s / mat(i, i);
                }
            }
        };
        std::vector<T> v((size_t)ka);
        if (side == 0) {
            for (int j = 0; j < n; ++j) {
                for (int i = 0; i < m; ++i) v[(size_t)i] = alpha * b[(size_t)i + (size_t)j * ldb];
                solve(v, false);
                for (int i = 0; i < m; ++i) b[(size_t)i + (size_t)j * ldb] = v[(size_t)i];
            }
        } else {
            // X·op(A) = αB ⇔ op(A)ᵀ·Xᵀ = αBᵀ, a row of B at a time.
            for (int i = 0; i < m; ++i) {
                for (int j = 0; j < n; ++j) v[(size_t)j] = alpha * b[(size_t)i + (size_t)j * ldb];
                solve(v, true);
                for (int j = 0; j < n; ++j) b[(size_t)i + (size_t)j * ldb] = v[(size_t)j];
            }
        }
    });
    return BLAS_OK;
}

EXPORT int cublasStrsm_v2(BlasHandle* h, int side, int uplo, int trans, int diag, int m, int n, const float* alpha,
                          const float* a, int lda, float* b, int ldb) {
    return trsm<float>(h, "cublasStrsm", side, uplo, trans, diag, m, n, *alpha, a, lda, b, ldb);
}

EXPORT int cublasDtrsm_v2(BlasHandle* h, int side, int uplo, int trans, int diag, int m, int n,
                          const double* alpha, const double* a, int lda, double* b, int ldb) {
    return trsm<double>(h, "cublasDtrsm", side, uplo, trans, diag, m, n, *alpha, a, lda, b, ldb);
}

// ---- cuSOLVER ------------------------------------------------------------------------------

enum { SOLVER_OK = 0, SOLVER_NOT_INITIALIZED = 1, SOLVER_INVALID_VALUE = 3, SOLVER_EXECUTION_FAILED = 6 };

// A cuSOLVER handle is a cuBLAS one here (their success and
// not-initialized codes agree).
EXPORT int cusolverDnCreate(BlasHandle** h) { return cublasCreate_v2(h); }

EXPORT int cusolverDnDestroy(BlasHandle* h) { return cublasDestroy_v2(h); }

EXPORT int cusolverDnSetStream(BlasHandle* h, void* s) { return cublasSetStream_v2(h, s); }

EXPORT int cusolverDnSpotrf_bufferSize(BlasHandle* h, int, int n, float*, int, int* lwork) {
    if (!h) return SOLVER_NOT_INITIALIZED;
    *lwork = n;
    return SOLVER_OK;
}

EXPORT int cusolverDnDpotrf_bufferSize(BlasHandle* h, int, int n, double*, int, int* lwork) {
    if (!h) return SOLVER_NOT_INITIALIZED;
    *lwork = n;
    return SOLVER_OK;
}

// A = L·Lᵀ (lower: L over A's lower triangle) or Uᵀ·U (upper); info the
// order of the first minor that is not positive, or 0.
template <typename T>
static int potrf(BlasHandle* h, int uplo, int n, T* a, int lda, T* work, int lwork, int* info) {
    if (!h) return SOLVER_NOT_INITIALIZED;
    if (n < 0 || lda < (n > 1 ? n : 1) || uplo < 0 || uplo > 1) return SOLVER_INVALID_VALUE;
    {
        std::lock_guard<std::mutex> l(g_mu);
        bool ok = (n == 0 || dev_range((CUdeviceptr)(uintptr_t)a, ((size_t)(n - 1) * lda + n) * sizeof(T))) &&
                  dev_range((CUdeviceptr)(uintptr_t)work, (size_t)lwork * sizeof(T)) &&
                  dev_range((CUdeviceptr)(uintptr_t)info, sizeof(int));
        if (!ok) {
            complain("cusolverDnPotrf: the matrix, workspace or info is not inside device memory");
            return SOLVER_EXECUTION_FAILED;
        }
    }
    Stream* st = handle_stream(h);
    st->push([=] {
        // L(i, j) for i >= j, stored at (i, j) (lower) or (j, i) (upper).
        auto el = [&](int i, int j) -> T& {
            return uplo == 0 ? a[(size_t)i + (size_t)j * lda] : a[(size_t)j + (size_t)i * lda];
        };
        *info = 0;
        for (int j = 0; j < n; ++j) {
            T d = el(j, j);
            for (int l = 0; l < j; ++l) d -= el(j, l) * el(j, l);
            if (!(d > T(0))) {
                *info = j + 1;
                return;
            }
            d = std::sqrt(d);
            el(j, j) = d;
            for (int i = j + 1; i < n; ++i) {
                T s = el(i, j);
                for (int l = 0; l < j; ++l) s -= el(i, l) * el(j, l);
                el(i, j) = s / d;
            }
        }
    });
    return SOLVER_OK;
}

EXPORT int cusolverDnSpotrf(BlasHandle* h, int uplo, int n, float* a, int lda, float* work, int lwork, int* info) {
    return potrf<float>(h, uplo, n, a, lda, work, lwork, info);
}

EXPORT int cusolverDnDpotrf(BlasHandle* h, int uplo, int n, double* a, int lda, double* work, int lwork,
                            int* info) {
    return potrf<double>(h, uplo, n, a, lda, work, lwork, info);
}
