// What CUDA C++ the kernel sources use, for the host C++ compiler: the
// host-build tests (mod.rs beside this file) build the sources with it
// into a shared library and run every entry on host memory.
//
// A launch runs its blocks one after another. With one thread a block
// (blockDim.x == 1) the kernel is called once per block on the calling
// thread; with more, each of the block's threads is a std::thread and
// __syncthreads is a barrier among them, so the block reductions run as
// they do on a GPU. __shared__ variables are statics: the blocks of a
// launch run one at a time, and launches run one at a time (the test
// serializes them).
#include <math.h>

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

struct dim3 {
    unsigned int x, y, z;
};

inline thread_local dim3 threadIdx = {0, 0, 0};
inline thread_local dim3 blockIdx = {0, 0, 0};
inline thread_local dim3 blockDim = {1, 1, 1};
inline thread_local dim3 gridDim = {1, 1, 1};

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __align__(n) alignas(n)

// A reusable barrier for the threads of one block.
class strata_barrier {
  public:
    explicit strata_barrier(unsigned int n) : n_(n) {}
    void wait() {
        std::unique_lock<std::mutex> lock(m_);
        unsigned long long gen = gen_;
        if (++arrived_ == n_) {
            arrived_ = 0;
            ++gen_;
            cv_.notify_all();
        } else {
            cv_.wait(lock, [&] { return gen_ != gen; });
        }
    }

  private:
    std::mutex m_;
    std::condition_variable cv_;
    unsigned int n_;
    unsigned int arrived_ = 0;
    unsigned long long gen_ = 0;
};

inline thread_local strata_barrier* strata_block_barrier = nullptr;

inline void __syncthreads() {
    if (strata_block_barrier != nullptr) strata_block_barrier->wait();
}

// Runs kernel over blocks_x × blocks_y blocks of threads threads.
inline void strata_launch(unsigned int blocks_x, unsigned int blocks_y, unsigned int threads,
                          const std::function<void()>& kernel) {
    const dim3 grid = {blocks_x, blocks_y, 1};
    const dim3 block = {threads, 1, 1};
    if (threads <= 1) {
        gridDim = grid;
        blockDim = block;
        threadIdx = {0, 0, 0};
        strata_block_barrier = nullptr;
        for (unsigned int y = 0; y < blocks_y; ++y) {
            for (unsigned int x = 0; x < blocks_x; ++x) {
                blockIdx = {x, y, 0};
                kernel();
            }
        }
        return;
    }
    strata_barrier barrier(threads);
    std::vector<std::thread> pool;
    pool.reserve(threads);
    for (unsigned int t = 0; t < threads; ++t) {
        pool.emplace_back([&, t] {
            gridDim = grid;
            blockDim = block;
            threadIdx = {t, 0, 0};
            strata_block_barrier = &barrier;
            for (unsigned int y = 0; y < blocks_y; ++y) {
                for (unsigned int x = 0; x < blocks_x; ++x) {
                    blockIdx = {x, y, 0};
                    kernel();
                    // The block's last statics are read before the next
                    // block's threads write them.
                    barrier.wait();
                }
            }
        });
    }
    for (std::thread& th : pool) th.join();
}
