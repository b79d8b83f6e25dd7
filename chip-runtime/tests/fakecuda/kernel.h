// Put in front of every kernel source the fake CUDA driver loads (see
// fakecuda.cpp): what CUDA C++ the sources use, for the host compiler.
//
// A launch runs on the calling stream's thread, one block after another.
// A block's threads run one after another as coroutines (ucontext), each
// to its next __syncthreads: every thread of the block reaches a barrier
// before any passes it, as on a GPU. A block whose thread 0 ends without
// reaching a barrier runs its other threads as plain calls. __shared__
// variables are thread-local statics: one block at a time on a thread.
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <ucontext.h>

#include <type_traits>
#include <utility>

struct dim3 {
    unsigned int x, y, z;
};

inline thread_local dim3 threadIdx = {0, 0, 0};
inline thread_local dim3 blockIdx = {0, 0, 0};
inline thread_local dim3 blockDim = {1, 1, 1};
inline thread_local dim3 gridDim = {1, 1, 1};

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static thread_local
#define __align__(n) alignas(n)
#define __restrict__ __restrict

inline double __longlong_as_double(long long v) { double d; memcpy(&d, &v, 8); return d; }
inline long long __double_as_longlong(double v) { long long d; memcpy(&d, &v, 8); return d; }
inline float __int_as_float(int v) { float d; memcpy(&d, &v, 4); return d; }
inline int __float_as_int(float v) { int d; memcpy(&d, &v, 4); return d; }
inline float __uint_as_float(unsigned int v) { float d; memcpy(&d, &v, 4); return d; }
inline unsigned int __float_as_uint(float v) { unsigned int d; memcpy(&d, &v, 4); return d; }

// The coroutine scheduler of the block running on this thread.
struct strata_fake_thread {
    ucontext_t ctx;
    char* stack;
    bool done;
};
inline thread_local ucontext_t strata_fake_sched;
inline thread_local strata_fake_thread* strata_fake_current = nullptr;
inline thread_local bool strata_fake_yielded = false;

inline void __syncthreads() {
    strata_fake_thread* me = strata_fake_current;
    if (me == nullptr) return;  // a plain call: no other thread to wait for
    strata_fake_yielded = true;
    swapcontext(&me->ctx, &strata_fake_sched);
}

template <typename... A, size_t... I>
void strata_fake_call(void (*k)(A...), void** p, std::index_sequence<I...>) {
    k(*static_cast<std::decay_t<A>*>(p[I])...);
}
template <typename... A>
void strata_fake_call(void (*k)(A...), void** p) {
    strata_fake_call(k, p, std::index_sequence_for<A...>{});
}
template <typename... A>
int strata_fake_sizes(void (*)(A...), size_t* out) {
    const size_t s[] = {sizeof(std::decay_t<A>)..., 0};
    for (size_t i = 0; i < sizeof...(A); ++i) out[i] = s[i];
    return (int)sizeof...(A);
}

typedef void (*strata_fake_entry)(void**);
inline thread_local strata_fake_entry strata_fake_run_entry;
inline thread_local void** strata_fake_run_params;
inline thread_local dim3 strata_fake_thread_index;

inline void strata_fake_trampoline() {
    threadIdx = strata_fake_thread_index;
    strata_fake_run_entry(strata_fake_run_params);
    strata_fake_current->done = true;
    // Returning resumes uc_link: the scheduler.
}

// Stacks of this thread's coroutines, kept for later launches.
inline thread_local char* strata_fake_stacks[1024];
static const size_t STRATA_FAKE_STACK = 256 << 10;

// Runs one block of `threads` threads on coroutines.
inline void strata_fake_block(strata_fake_entry entry, void** params, dim3 block) {
    const unsigned int threads = block.x * block.y * block.z;
    static thread_local strata_fake_thread co[1024];
    strata_fake_run_entry = entry;
    strata_fake_run_params = params;
    // Thread 0 first: without a barrier, the others are plain calls.
    unsigned int started = 0;
    auto start = [&](unsigned int t) {
        strata_fake_thread& c = co[t];
        if (strata_fake_stacks[t] == nullptr) strata_fake_stacks[t] = new char[STRATA_FAKE_STACK];
        c.stack = strata_fake_stacks[t];
        c.done = false;
        getcontext(&c.ctx);
        c.ctx.uc_stack.ss_sp = c.stack;
        c.ctx.uc_stack.ss_size = STRATA_FAKE_STACK;
        c.ctx.uc_link = &strata_fake_sched;
        makecontext(&c.ctx, strata_fake_trampoline, 0);
        strata_fake_thread_index = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
        strata_fake_current = &c;
        swapcontext(&strata_fake_sched, &c.ctx);
        strata_fake_current = nullptr;
    };
    strata_fake_yielded = false;
    start(0);
    started = 1;
    if (!strata_fake_yielded) {
        for (unsigned int t = 1; t < threads; ++t) {
            threadIdx = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
            entry(params);
        }
        return;
    }
    for (; started < threads; ++started) start(started);
    // Every thread is at a barrier or done: let each go on to its next.
    for (;;) {
        bool any = false;
        for (unsigned int t = 0; t < threads; ++t) {
            strata_fake_thread& c = co[t];
            if (c.done) continue;
            any = true;
            strata_fake_current = &c;
            swapcontext(&strata_fake_sched, &c.ctx);
            strata_fake_current = nullptr;
        }
        if (!any) break;
    }
}

// Runs a launch: every block, one after another.
extern "C" int strata_fake_run(strata_fake_entry entry, void** params, const unsigned int* grid) {
    const dim3 g = {grid[0], grid[1], grid[2]};
    const dim3 b = {grid[3], grid[4], grid[5]};
    if (b.x * b.y * b.z > 1024) return 1;
    gridDim = g;
    blockDim = b;
    for (unsigned int z = 0; z < g.z; ++z)
        for (unsigned int y = 0; y < g.y; ++y)
            for (unsigned int x = 0; x < g.x; ++x) {
                blockIdx = {x, y, z};
                if (b.x * b.y * b.z == 1) {
                    threadIdx = {0, 0, 0};
                    strata_fake_current = nullptr;
                    entry(params);
                } else {
                    strata_fake_block(entry, params, b);
                }
            }
    return 0;
}
