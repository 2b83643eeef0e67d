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
// run each thread as a plain call. When every pointer is 16-byte aligned the loop moves 16-byte
// packs (packs.cuh: the same results as element by element), four a round per thread with all
// eight loads issued before the first store, in 32-bit indices below 2^31 packs; otherwise it
// moves one element per step, which only needs element alignment (copy: none). The host sizes
// the grid to what the device holds at once (src/cuda/kernels.rs).
//
// Pointers: dst may be exactly a or exactly b (in place), never a partial overlap (copy: dst
// and a must not partly overlap either; an exact alias rewrites the same bytes). dst2, when
// not NULL, receives a second copy of the result (every kernel honours it). divide with n == 0
// writes nothing (n is a rank count, at least 1).
#include "numerics.cuh"
#include "ops.cuh"
#include "packs.cuh"

struct topoccl_args {
  void* dst;
  void* dst2;
  const void* a;
  const void* b;
  unsigned long long count;
  unsigned long long scalar;
};
static_assert(sizeof(topoccl_args) == 48, "topoccl_args is a fixed 48-byte ABI");

// ---- the operations as functors: `wide` is one element's operation on the widened type
// (Elem<S>::W), `pack` the same over a 16-byte pack (packs.cuh) ----

template <class S, class Op>
struct ReduceF {
  // enums, not variables: nothing is emitted for them on the device. `unroll`: packs a thread
  // keeps in flight (pack_loop).
  enum { reads_b = 1, unroll = Unroll<S>::packs };
  typedef typename Elem<S>::W W;
  __device__ __forceinline__ explicit ReduceF(const topoccl_args&) {}
  __device__ __forceinline__ bool runs() const { return true; }
  __device__ __forceinline__ W wide(W a, W b) const { return Op::apply(a, b); }
  __device__ __forceinline__ Pack<S> pack(const Pack<S>& a, const Pack<S>& b) const {
    return pack_op<S, Op>(*this, a, b);
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
  enum { reads_b = 0, unroll = Unroll<S>::packs };
  typedef typename Elem<S>::W W;
  S raw;
  W s;
  __device__ __forceinline__ explicit ScaleF(const topoccl_args& args)
      : raw(scalar_as<S>(args.scalar)), s(Elem<S>::widen(raw)) {}
  __device__ __forceinline__ bool runs() const { return true; }
  __device__ __forceinline__ W wide(W a, W) const { return op_prod(a, s); }
  // A product by the scalar: the paired product against a pack of it, where that is native.
  __device__ __forceinline__ Pack<S> pack(const Pack<S>& a, const Pack<S>&) const {
    Pack<S> splat;
    for (u32 j = 0; j < 16 / sizeof(S); ++j) splat.e[j] = raw;
    return pack_op<S, OpProd>(*this, a, splat);
  }
};

template <class S>
struct DivideF {
  // An IEEE division per element is arithmetic enough to hide the loads' latency; unrolled it
  // would only grow the image (it is a subroutine call on the device).
  enum { reads_b = 0, unroll = 1 };
  typedef typename Elem<S>::W W;
  u32 n;
  __device__ __forceinline__ explicit DivideF(const topoccl_args& args) : n((u32)args.scalar) {}
  __device__ __forceinline__ bool runs() const { return n != 0; }
  __device__ __forceinline__ W wide(W a, W) const { return op_div(a, n); }
  __device__ __forceinline__ Pack<S> pack(const Pack<S>& a, const Pack<S>& b) const { return pack_wide(*this, a, b); }
};

struct CopyF {
  enum { reads_b = 0, unroll = Unroll<u8>::packs };
  typedef u8 W;
  __device__ __forceinline__ explicit CopyF(const topoccl_args&) {}
  __device__ __forceinline__ bool runs() const { return true; }
  __device__ __forceinline__ u8 wide(u8 a, u8) const { return a; }
  __device__ __forceinline__ Pack<u8> pack(const Pack<u8>& a, const Pack<u8>&) const { return a; }
};

// ---- the loop ----

// A round of the loop: a thread issues the loads of all its packs (`unroll`, packs.cuh's
// Unroll) before any store (a store may hit what it loaded, when dst is a or b, never what
// another round or thread reads).

// This thread's place in the whole grid, and the number of threads in it.
TOPOCCL_FN u64 thread_rank() {
  u64 block = blockIdx.x + (u64)gridDim.x * (blockIdx.y + (u64)gridDim.y * blockIdx.z);
  u64 per_block = (u64)blockDim.x * blockDim.y * blockDim.z;
  return block * per_block + threadIdx.x + (u64)blockDim.x * (threadIdx.y + (u64)blockDim.y * threadIdx.z);
}
TOPOCCL_FN u64 thread_count() {
  return (u64)gridDim.x * gridDim.y * gridDim.z * ((u64)blockDim.x * blockDim.y * blockDim.z);
}

TOPOCCL_FN bool aligned16(const void* p) { return ((u64)p & 15u) == 0; }

// Packs v, v + threads, ... below `packs`, in index type I, U packs a round (then one at a
// time). u32 with U > 1 where every index the loop forms fits (packs <= 2^31 and threads <=
// 2^29, so v + U * threads < 2^32 for U <= 4); u64 one at a time beyond that (32 GiB and more,
// where the loop's overhead is nothing beside the bytes, and the image stays small).
template <class I, u32 U, class S, class F>
TOPOCCL_FN void pack_loop(const F& f, Pack<S>* dst, Pack<S>* dst2, const Pack<S>* a, const Pack<S>* b, I packs,
                          I v, I threads) {
  if constexpr (U > 1) {
    while (v < packs && packs - v > (I)(U - 1) * threads) {
      Pack<S> x[U], y[U];
      for (u32 u = 0; u < U; ++u) {
        x[u] = a[v + u * threads];
        if constexpr (F::reads_b != 0) y[u] = b[v + u * threads];
        else y[u] = x[u];
      }
      for (u32 u = 0; u < U; ++u) {
        const Pack<S> r = f.pack(x[u], y[u]);
        dst[v + u * threads] = r;
        if (dst2) dst2[v + u * threads] = r;
      }
      v += U * threads;
    }
  }
  for (; v < packs; v += threads) {
    const Pack<S> x = a[v];
    Pack<S> y;
    if constexpr (F::reads_b != 0) y = b[v];
    else y = x;
    const Pack<S> r = f.pack(x, y);
    dst[v] = r;
    if (dst2) dst2[v] = r;
  }
}

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
    Pack<S>* pd = (Pack<S>*)dst;
    Pack<S>* pd2 = (Pack<S>*)dst2;
    const Pack<S>* pa = (const Pack<S>*)a;
    const Pack<S>* pb = (const Pack<S>*)b;
    if (packs <= (1ull << 31) && threads <= (1ull << 29))
      pack_loop<u32, F::unroll>(f, pd, pd2, pa, pb, (u32)packs, (u32)rank, (u32)threads);
    else
      pack_loop<u64, 1>(f, pd, pd2, pa, pb, packs, rank, threads);
    done = packs * per_pack;
  }
  for (u64 i = done + rank; i < n; i += threads) {
    const S r = elem_op(f, a[i], b[i]);
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
