// packs.cuh: 16-byte packs of elements and one operation over a whole pack. On the device a
// pack uses the paired instructions where their result is the same bits as the element rule
// of ops.cuh (which the host build, and src/ops/reduce.rs, follow element by element):
//
// - f16 and bf16 sum and product (and scale, a product by the scalar) as f16x2 / bf16x2
//   arithmetic. The element rule widens both operands to f32, computes there and rounds back
//   once; the paired instruction rounds the exact result once. They agree: a product of two
//   11-bit (f16) or 8-bit (bf16) significands is exact in f32 (24 bits), and for a sum the
//   f32 rounding followed by the rounding to the narrow type is the single rounding, because
//   f32's 24 bits are at least 2p + 2 for p = 11 and p = 8 (double rounding is innocuous for
//   +, -, *, / under that condition: Figueroa, "When is double rounding innocuous?", 1995).
//   tests/kernels_host.rs checks the element rule against a single rounding of the exact
//   result on every pair of f16 operands and on samples of bf16 (the paired instructions
//   themselves run only on a GPU: benches/gpu/lease.sh's kernels step checks them against
//   CpuOps there). No .ftz: subnormals are kept, as the element rule keeps them. bf16x2
//   add/mul are sm_90 instructions; sm_80 has fma.rn.bf16x2, whose a*1 + b and a*b + (-0)
//   are the same single roundings.
// - fp8 (sm_89+): the conversions to and from f32 two at a time (cvt ...x2), each half the same
//   conversion as the single one; the arithmetic stays the element rule's, in f32.
//
// Everything else (min/max, divide, the 1- 4- and 8-byte types) goes element by element.
#pragma once

#include "numerics.cuh"
#include "ops.cuh"

template <class S>
struct alignas(16) Pack {
  S e[16 / sizeof(S)];
};

// Packs a thread keeps in flight in one round of the loop (topoccl.cu's pack_loop): four, but
// two for fp8, whose 16 elements a pack are each a conversion each way (arithmetic enough to
// hide the loads; unrolled further they would only double the image), and one below sm_89,
// where those conversions are the software routines of numerics.cuh.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
#define TOPOCCL_FP8_UNROLL 1
#else
#define TOPOCCL_FP8_UNROLL 2
#endif
template <class S>
struct Unroll {
  enum { packs = 4 };
};
template <>
struct Unroll<e4m3_t> {
  enum { packs = TOPOCCL_FP8_UNROLL };
};
template <>
struct Unroll<e5m2_t> {
  enum { packs = TOPOCCL_FP8_UNROLL };
};
#undef TOPOCCL_FP8_UNROLL

// A pack as four 32-bit words (pairs of 2-byte elements, quads of fp8), and back.
template <class S>
union PackWords {
  Pack<S> p;
  u32 w[4];
};

// One element through a functor's operation on the widened type (`f.wide`).
template <class S, class F>
TOPOCCL_FN S elem_op(const F& f, S a, S b) {
  return Elem<S>::narrow(f.wide(Elem<S>::widen(a), Elem<S>::widen(b)));
}

// Paired arithmetic of `Op` on 2-byte type S, where it is bit-equal (above): `native` says
// whether there is one; `apply` works on one word of two elements.
template <class S, class Op>
struct Pairs {
  enum { native = 0 };
  static __device__ __forceinline__ u32 apply(u32 a, u32) { return a; }
};

#ifdef __CUDA_ARCH__
#define TOPOCCL_PAIRS(S, OP, ASM)                                             \
  template <>                                                                 \
  struct Pairs<S, OP> {                                                       \
    enum { native = 1 };                                                      \
    static __device__ __forceinline__ u32 apply(u32 a, u32 b) {               \
      u32 r;                                                                  \
      asm(ASM : "=r"(r) : "r"(a), "r"(b));                                    \
      return r;                                                               \
    }                                                                         \
  };
TOPOCCL_PAIRS(f16_t, OpSum, "add.rn.f16x2 %0, %1, %2;")
TOPOCCL_PAIRS(f16_t, OpProd, "mul.rn.f16x2 %0, %1, %2;")
#if __CUDA_ARCH__ >= 900
TOPOCCL_PAIRS(bf16_t, OpSum, "add.rn.bf16x2 %0, %1, %2;")
TOPOCCL_PAIRS(bf16_t, OpProd, "mul.rn.bf16x2 %0, %1, %2;")
#elif __CUDA_ARCH__ >= 800
// a * (1.0, 1.0) + b, and a * b + (-0.0, -0.0) (so that a zero product keeps its sign).
template <>
struct Pairs<bf16_t, OpSum> {
  enum { native = 1 };
  static __device__ __forceinline__ u32 apply(u32 a, u32 b) {
    u32 r;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(0x3f803f80u), "r"(b));
    return r;
  }
};
template <>
struct Pairs<bf16_t, OpProd> {
  enum { native = 1 };
  static __device__ __forceinline__ u32 apply(u32 a, u32 b) {
    u32 r;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(0x80008000u));
    return r;
  }
};
#endif
#undef TOPOCCL_PAIRS
#endif

// fp8 pairs through f32 (sm_89+ has the paired conversions); `native` as above.
template <class S>
struct Fp8Pairs {
  enum { native = 0 };
  static __device__ __forceinline__ void widen(u16, float&, float&) {}
  static __device__ __forceinline__ u16 narrow(float, float) { return 0; }
};
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define TOPOCCL_FP8_PAIRS(S, FMT)                                               \
  template <>                                                                   \
  struct Fp8Pairs<S> {                                                          \
    enum { native = 1 };                                                        \
    /* the low byte's value in lo, the high byte's in hi */                     \
    static __device__ __forceinline__ void widen(u16 pair, float& lo, float& hi) { \
      u32 h2;                                                                   \
      asm("cvt.rn.f16x2." FMT "x2 %0, %1;" : "=r"(h2) : "h"(pair));            \
      lo = f16_to_f32((u16)(h2 & 0xffffu));                                     \
      hi = f16_to_f32((u16)(h2 >> 16));                                         \
    }                                                                           \
    static __device__ __forceinline__ u16 narrow(float lo, float hi) {          \
      u16 r;                                                                    \
      asm("cvt.rn.satfinite." FMT "x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo)); \
      return r;                                                                 \
    }                                                                           \
  };
TOPOCCL_FP8_PAIRS(e4m3_t, "e4m3")
TOPOCCL_FP8_PAIRS(e5m2_t, "e5m2")
#undef TOPOCCL_FP8_PAIRS
#endif

// `f` over a whole pack, through the functor's widened operation (pairs for fp8 where the
// device has them, else element by element).
template <class S, class F>
TOPOCCL_FN Pack<S> pack_wide(const F& f, const Pack<S>& a, const Pack<S>& b) {
  if constexpr (Fp8Pairs<S>::native != 0) {
    PackWords<S> x, y, r;
    x.p = a;
    y.p = b;
    for (u32 w = 0; w < 4; ++w) {
      u32 out = 0;
      for (u32 h = 0; h < 2; ++h) {
        float a0, a1, b0, b1;
        Fp8Pairs<S>::widen((u16)(x.w[w] >> (16 * h)), a0, a1);
        Fp8Pairs<S>::widen((u16)(y.w[w] >> (16 * h)), b0, b1);
        out |= (u32)Fp8Pairs<S>::narrow(f.wide(a0, b0), f.wide(a1, b1)) << (16 * h);
      }
      r.w[w] = out;
    }
    return r.p;
  } else {
    Pack<S> r;
    for (u32 j = 0; j < 16 / sizeof(S); ++j) r.e[j] = elem_op(f, a.e[j], b.e[j]);
    return r;
  }
}

// `Op` over a whole pack: paired arithmetic where it is native, else as pack_wide.
template <class S, class Op, class F>
TOPOCCL_FN Pack<S> pack_op(const F& f, const Pack<S>& a, const Pack<S>& b) {
  if constexpr (Pairs<S, Op>::native != 0) {
    PackWords<S> x, y, r;
    x.p = a;
    y.p = b;
    for (u32 w = 0; w < 4; ++w) r.w[w] = Pairs<S, Op>::apply(x.w[w], y.w[w]);
    return r.p;
  } else {
    return pack_wide(f, a, b);
  }
}
