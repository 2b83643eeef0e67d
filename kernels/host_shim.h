// host_shim.h: lets g++ compile topoccl.cu as plain C++ (`-x c++ -include host_shim.h`).
// The CUDA qualifiers vanish, the built-in thread coordinates become thread-local variables,
// and a launch runs every thread of every block in turn, setting them. That is exact for
// topoccl's kernels (grid-stride loops with no __syncthreads, shared memory or warp
// operations) and shows nothing about anything warp-level or about speed. Thread-local, so
// launches on different host threads run at the same time without touching each other.
#pragma once

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
