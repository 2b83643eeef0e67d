// host_shim.h: lets g++ compile topoccl.cu as plain C++ (`-x c++ -include host_shim.h`).
// The CUDA qualifiers vanish, the built-in thread coordinates become thread-local variables,
// and a launch runs every thread of every block in turn, setting them. That is exact for
// topoccl's elementwise kernels (grid-stride loops with no __syncthreads, shared memory or
// warp operations); the one-launch kernels, which have barriers and waits, run their block's
// threads as coroutines (`topoccl_host_run_coop`). Neither shows anything warp-level or
// about speed. Thread-local, so
// launches on different host threads run at the same time without touching each other.
#pragma once

#include <sched.h>
#include <ucontext.h>

#include <vector>

#define TOPOCCL_HOST_BUILD 1
#define __global__
#define __device__
#define __forceinline__ inline __attribute__((always_inline))

struct topoccl_dim3 {
  unsigned x, y, z;
};
inline thread_local topoccl_dim3 threadIdx, blockIdx, blockDim, gridDim;

template <class Args>
inline void topoccl_host_run_grid(void (*kernel)(Args), const unsigned grid[3], const unsigned block[3],
                                  const Args& args) {
  gridDim = topoccl_dim3{grid[0], grid[1], grid[2]};
  blockDim = topoccl_dim3{block[0], block[1], block[2]};
  for (unsigned bz = 0; bz < grid[2]; ++bz)
    for (unsigned by = 0; by < grid[1]; ++by)
      for (unsigned bx = 0; bx < grid[0]; ++bx) {
        blockIdx = topoccl_dim3{bx, by, bz};
        for (unsigned tz = 0; tz < block[2]; ++tz)
          for (unsigned ty = 0; ty < block[1]; ++ty)
            for (unsigned tx = 0; tx < block[0]; ++tx) {
              threadIdx = topoccl_dim3{tx, ty, tz};
              kernel(args);
            }
      }
}

// ---- cooperative blocks, for kernels with barriers (the one-launch kernels, ll.cuh) ----
//
// Each thread of the block is a coroutine (ucontext) of the launching host thread. One runs
// until it waits (topoccl_host_yield: a poll that found nothing) or reaches a barrier
// (topoccl_host_syncthreads), then the next runs; after a round of all of them the host
// thread itself yields, since what they poll for is written by other host threads (the
// peers' kernels).

struct topoccl_coop {
  std::vector<ucontext_t> threads;
  std::vector<std::vector<char>> stacks;
  std::vector<bool> done;
  ucontext_t scheduler;
  unsigned current = 0, alive = 0, arrived = 0, generation = 0;
  void (*entry)(const void*) = nullptr;
  const void* args = nullptr;
};
inline thread_local topoccl_coop* topoccl_coop_now = nullptr;

// A poll found nothing: the block's next thread runs (outside a cooperative block: the
// host's other threads).
inline void topoccl_host_yield() {
  topoccl_coop* c = topoccl_coop_now;
  if (c == nullptr) {
    sched_yield();
    return;
  }
  swapcontext(&c->threads[c->current], &c->scheduler);
}

// __syncthreads: waits until every live thread of the block has arrived.
inline void topoccl_host_syncthreads() {
  topoccl_coop* c = topoccl_coop_now;
  if (c == nullptr) return;
  const unsigned g = c->generation;
  if (++c->arrived == c->alive) {
    c->arrived = 0;
    ++c->generation;
    return;
  }
  while (c->generation == g) swapcontext(&c->threads[c->current], &c->scheduler);
}

// The kernel a cooperative launch of this host thread runs, and its entry from a coroutine.
template <class Args>
inline thread_local void (*topoccl_coop_kernel)(Args) = nullptr;
template <class Args>
void topoccl_coop_entry(const void* a) {
  topoccl_coop_kernel<Args>(*static_cast<const Args*>(a));
}

inline void topoccl_coop_start() {
  topoccl_coop* c = topoccl_coop_now;
  c->entry(c->args);
  c->done[c->current] = true;
  --c->alive;
  // A barrier some threads wait at counts the ones that ended.
  if (c->alive != 0 && c->arrived == c->alive) {
    c->arrived = 0;
    ++c->generation;
  }
}

// Runs the block's threads until every one has ended. Apart, and with its loop state in
// `c`, because swapcontext returns as setjmp does (nothing of the caller's may sit in a
// register across it).
__attribute__((noinline)) inline void topoccl_coop_schedule(topoccl_coop* c, const unsigned block[3]) {
  topoccl_coop* outer = topoccl_coop_now;
  topoccl_coop_now = c;
  while (c->alive != 0) {
    for (c->current = 0; c->current < c->threads.size(); ++c->current) {
      if (c->done[c->current]) continue;
      const unsigned t = c->current;
      threadIdx = topoccl_dim3{t % block[0], (t / block[0]) % block[1], t / (block[0] * block[1])};
      swapcontext(&c->scheduler, &c->threads[c->current]);
    }
    sched_yield();
  }
  topoccl_coop_now = outer;
}

// Runs block `b` of `kernel`'s grid, its threads cooperatively (apart: getcontext, too,
// returns as setjmp does).
template <class Args>
__attribute__((noinline)) void topoccl_coop_block(const unsigned grid[3], const unsigned block[3], const Args* args,
                                                  unsigned b) {
  blockIdx = topoccl_dim3{b % grid[0], (b / grid[0]) % grid[1], b / (grid[0] * grid[1])};
  const unsigned n = block[0] * block[1] * block[2];
  topoccl_coop c;
  c.threads.resize(n);
  c.stacks.resize(n);
  c.done.assign(n, false);
  c.alive = n;
  c.args = args;
  for (unsigned t = 0; t < n; ++t) {
    c.stacks[t].resize(64 << 10);
    getcontext(&c.threads[t]);
    c.threads[t].uc_stack.ss_sp = c.stacks[t].data();
    c.threads[t].uc_stack.ss_size = c.stacks[t].size();
    c.threads[t].uc_link = &c.scheduler;
    makecontext(&c.threads[t], topoccl_coop_start, 0);
  }
  c.entry = topoccl_coop_entry<Args>;
  topoccl_coop_schedule(&c, block);
}

// Runs `kernel`'s blocks one after another, the threads of each cooperatively.
template <class Args>
inline void topoccl_host_run_coop(void (*kernel)(Args), const unsigned grid[3], const unsigned block[3],
                                  const Args& args) {
  gridDim = topoccl_dim3{grid[0], grid[1], grid[2]};
  blockDim = topoccl_dim3{block[0], block[1], block[2]};
  topoccl_coop_kernel<Args> = kernel;
  for (unsigned b = 0; b < grid[0] * grid[1] * grid[2]; ++b) topoccl_coop_block(grid, block, &args, b);
}
