// topoccl.cu: topoccl's device-side local work (copy, reduce, reduce-and-copy, PreMulSum's
// scale, the average's divide) as CUDA kernels. This one source is compiled by NVRTC into the
// shipped images (kernels/build-images.py) and, through host_shim.h, by g++ into the host
// build (standins/kernels-host) that tests/kernels_host.rs checks against `CpuOps`.
//
// ABI: every kernel is `extern "C" __global__ void NAME(topoccl_args args)`, one 48-byte
// struct by value. Names: topoccl_copy; topoccl_{reduce_sum,reduce_prod,reduce_min,
// reduce_max,scale,divide}_<t> for t in i8 u8 i32 u32 i64 u64 f16 f32 f64 bf16 f8e4m3 f8e5m2.
//
// Numerics (decided once; src/exec/reduce.rs does exactly the same):
// - Integers wrap (sum, prod); min/max are the ordinary ones; divide truncates toward zero,
//   computed in 64 bits so any divisor n up to 2^32-1 is exact (Rust: `(x as i128 / n) as T`).
// - f32/f64: one IEEE operation in the type itself, round to nearest even, subnormals kept.
// - f16, bf16, fp8 e4m3/e5m2: both operands widened to f32 (exact), one f32 operation, one
//   rounding back to nearest even. f16/bf16 overflow to ±inf; fp8 saturates to ±max finite
//   (NCCL's __NV_SATFINITE: inf -> ±max too); NaN stays NaN.
// - scale (PreMulSum): x * scalar, the scalar widened like x (f32 for the narrow types), one
//   rounding. divide (average): x / n with n converted to the compute type (f32 for the narrow
//   types, rounded to nearest), one rounding.
// - min/max on floats: IEEE 754-2019 minimumNumber/maximumNumber: a NaN operand gives the
//   other operand (NaN only when both are NaN) and -0 < +0. Not fminf/fmaxf.
// - NaN payloads and signs are not specified: device instructions may return a canonical NaN.
// - No FMA contraction: no kernel writes a*b+c, and both builds turn contraction off anyway
//   (NVRTC --fmad=false, g++ -ffp-contract=off).
//
// Launch: 1-D grid-stride loops over every thread of the whole (3-D) grid, valid for any grid
// and block shape: no __syncthreads, shared memory or warp operations, so the host build may
// run each thread as a plain call. When every pointer is 16-byte aligned the loop moves 16
// bytes per step (the same element operations, so the same results); otherwise it moves one
// element per step, which only needs element alignment (copy: none).
//
// Pointers: dst may be exactly a or exactly b (in place), never a partial overlap (copy: dst
// and a must not partly overlap either; an exact alias rewrites the same bytes). dst2, when
// not NULL, receives a second copy of the result (every kernel honours it). divide with n == 0
// writes nothing (n is a rank count, at least 1).
#include "numerics.cuh"
#include "ops.cuh"

struct topoccl_args {
  void* dst;
  void* dst2;
  const void* a;
  const void* b;
  unsigned long long count;
  unsigned long long scalar;
};
static_assert(sizeof(topoccl_args) == 48, "topoccl_args is a fixed 48-byte ABI");

// ---- the element operations as functors: one result from one element of a (and of b) ----

template <class S, class Op>
struct ReduceF {
  enum { reads_b = 1 };  // an enum, not a variable: nothing is emitted for it on the device
  __device__ __forceinline__ explicit ReduceF(const topoccl_args&) {}
  __device__ __forceinline__ bool runs() const { return true; }
  __device__ __forceinline__ S operator()(S a, S b) const {
    return Elem<S>::narrow(Op::apply(Elem<S>::widen(a), Elem<S>::widen(b)));
  }
};

// The scalar's bits sit in the low bytes of `scalar` (little endian, as both hosts and the GPU).
template <class S>
TOPOCCL_FN S scalar_as(u64 bits) {
  union {
    u64 u;
    S s;
  } c;
  c.u = bits;
  return c.s;
}

template <class S>
struct ScaleF {
  enum { reads_b = 0 };
  typename Elem<S>::W s;
  __device__ __forceinline__ explicit ScaleF(const topoccl_args& args) : s(Elem<S>::widen(scalar_as<S>(args.scalar))) {}
  __device__ __forceinline__ bool runs() const { return true; }
  __device__ __forceinline__ S operator()(S a, S) const { return Elem<S>::narrow(op_prod(Elem<S>::widen(a), s)); }
};

template <class S>
struct DivideF {
  enum { reads_b = 0 };
  u32 n;
  __device__ __forceinline__ explicit DivideF(const topoccl_args& args) : n((u32)args.scalar) {}
  __device__ __forceinline__ bool runs() const { return n != 0; }
  __device__ __forceinline__ S operator()(S a, S) const { return Elem<S>::narrow(op_div(Elem<S>::widen(a), n)); }
};

struct CopyF {
  enum { reads_b = 0 };
  __device__ __forceinline__ explicit CopyF(const topoccl_args&) {}
  __device__ __forceinline__ bool runs() const { return true; }
  __device__ __forceinline__ u8 operator()(u8 a, u8) const { return a; }
};

// ---- the loop ----

// This thread's place in the whole grid, and the number of threads in it.
TOPOCCL_FN u64 thread_rank() {
  u64 block = blockIdx.x + (u64)gridDim.x * (blockIdx.y + (u64)gridDim.y * blockIdx.z);
  u64 per_block = (u64)blockDim.x * blockDim.y * blockDim.z;
  return block * per_block + threadIdx.x + (u64)blockDim.x * (threadIdx.y + (u64)blockDim.y * threadIdx.z);
}
TOPOCCL_FN u64 thread_count() {
  return (u64)gridDim.x * gridDim.y * gridDim.z * ((u64)blockDim.x * blockDim.y * blockDim.z);
}

template <class S>
struct alignas(16) Pack {
  S e[16 / sizeof(S)];
};

TOPOCCL_FN bool aligned16(const void* p) { return ((u64)p & 15u) == 0; }

template <class S, class F>
TOPOCCL_FN void elementwise(const topoccl_args& args) {
  const F f(args);
  if (!f.runs()) return;
  S* dst = (S*)args.dst;
  S* dst2 = (S*)args.dst2;
  const S* a = (const S*)args.a;
  const S* b = F::reads_b != 0 ? (const S*)args.b : a;
  const u64 n = args.count, rank = thread_rank(), threads = thread_count();
  const u64 per_pack = 16 / sizeof(S);
  u64 done = 0;
  // dst2 == NULL counts as aligned.
  if (aligned16(dst) && aligned16(dst2) && aligned16(a) && aligned16(b)) {
    const u64 packs = n / per_pack;
    for (u64 v = rank; v < packs; v += threads) {
      const Pack<S> pa = ((const Pack<S>*)a)[v];
      Pack<S> pb;
      if constexpr (F::reads_b != 0) pb = ((const Pack<S>*)b)[v];
      else pb = pa;
      Pack<S> r;
      for (u64 j = 0; j < per_pack; ++j) r.e[j] = f(pa.e[j], pb.e[j]);
      ((Pack<S>*)dst)[v] = r;
      if (dst2) ((Pack<S>*)dst2)[v] = r;
    }
    done = packs * per_pack;
  }
  for (u64 i = done + rank; i < n; i += threads) {
    const S r = f(a[i], b[i]);
    dst[i] = r;
    if (dst2) dst2[i] = r;
  }
}

// ---- the kernels, from one list ----

// X(NAME, S, READS_B, FUNCTOR): every kernel of one element type.
#define TOPOCCL_KERNELS_OF(X, t, S)       \
  X(reduce_sum_##t, S, 1, ReduceF<S, OpSum>)  \
  X(reduce_prod_##t, S, 1, ReduceF<S, OpProd>) \
  X(reduce_min_##t, S, 1, ReduceF<S, OpMin>)  \
  X(reduce_max_##t, S, 1, ReduceF<S, OpMax>)  \
  X(scale_##t, S, 0, ScaleF<S>)               \
  X(divide_##t, S, 0, DivideF<S>)

// All 73: copy, then NCCL's 12 datatypes in ncclDataType_t's order.
#define TOPOCCL_KERNELS(X)                \
  X(copy, u8, 0, CopyF)                   \
  TOPOCCL_KERNELS_OF(X, i8, i8)           \
  TOPOCCL_KERNELS_OF(X, u8, u8)           \
  TOPOCCL_KERNELS_OF(X, i32, i32)         \
  TOPOCCL_KERNELS_OF(X, u32, u32)         \
  TOPOCCL_KERNELS_OF(X, i64, i64)         \
  TOPOCCL_KERNELS_OF(X, u64, u64)         \
  TOPOCCL_KERNELS_OF(X, f16, f16_t)       \
  TOPOCCL_KERNELS_OF(X, f32, float)       \
  TOPOCCL_KERNELS_OF(X, f64, double)      \
  TOPOCCL_KERNELS_OF(X, bf16, bf16_t)     \
  TOPOCCL_KERNELS_OF(X, f8e4m3, e4m3_t)   \
  TOPOCCL_KERNELS_OF(X, f8e5m2, e5m2_t)

#define TOPOCCL_DEFINE(NAME, S, READS_B, ...) \
  extern "C" __global__ void topoccl_##NAME(topoccl_args args) { elementwise<S, __VA_ARGS__>(args); }
TOPOCCL_KERNELS(TOPOCCL_DEFINE)
#undef TOPOCCL_DEFINE

// The one-launch kernels of small calls: `topoccl_ll_<t>(topoccl_ll_args)`, one per datatype.
#include "ll.cuh"

#ifdef TOPOCCL_HOST_BUILD
// The host build's table of kernels, from the same list, for standins/kernels-host.
struct topoccl_host_kernel {
  const char* name;
  u64 elem_bytes;
  u32 reads_b;
  void (*entry)(topoccl_args);
};
#define TOPOCCL_ENTRY(NAME, S, READS_B, ...) {"topoccl_" #NAME, sizeof(S), READS_B, &topoccl_##NAME},
static const topoccl_host_kernel topoccl_table[] = {TOPOCCL_KERNELS(TOPOCCL_ENTRY)};
#undef TOPOCCL_ENTRY

extern "C" u64 topoccl_host_kernel_count() { return sizeof(topoccl_table) / sizeof(topoccl_table[0]); }
extern "C" const topoccl_host_kernel* topoccl_host_kernel_table() { return topoccl_table; }
// Runs kernel `index` over the grid (see host_shim.h); an index out of range does nothing.
extern "C" void topoccl_host_launch(u64 index, const u32* grid, const u32* block, const topoccl_args* args) {
  if (index < topoccl_host_kernel_count()) topoccl_host_run_grid(topoccl_table[index].entry, grid, block, *args);
}

// The one-launch kernels, a table of their own (they take `topoccl_ll_args`).
// Laid out as `topoccl_host_kernel` (reads_b 0), so one reader serves both tables.
struct topoccl_host_ll_kernel {
  const char* name;
  u64 elem_bytes;
  u32 reads_b;
  void (*entry)(topoccl_ll_args);
};
#define TOPOCCL_LL_ENTRY(t, S) {"topoccl_ll_" #t, sizeof(S), 0, &topoccl_ll_##t},
static const topoccl_host_ll_kernel topoccl_ll_table[] = {TOPOCCL_LL_KERNELS(TOPOCCL_LL_ENTRY)};
#undef TOPOCCL_LL_ENTRY

extern "C" u64 topoccl_host_ll_kernel_count() { return sizeof(topoccl_ll_table) / sizeof(topoccl_ll_table[0]); }
extern "C" const topoccl_host_ll_kernel* topoccl_host_ll_kernel_table() { return topoccl_ll_table; }
extern "C" u64 topoccl_host_ll_args_bytes() { return sizeof(topoccl_ll_args); }
extern "C" void topoccl_host_ll_launch(u64 index, const u32* grid, const u32* block, const topoccl_ll_args* args) {
  if (index < topoccl_host_ll_kernel_count()) topoccl_host_run_coop(topoccl_ll_table[index].entry, grid, block, *args);
}
#endif
