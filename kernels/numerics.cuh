// numerics.cuh: the element types of topoccl's kernels and their conversions to and from f32.
//
// Written without any CUDA header, so NVRTC needs no include path and the host build (g++
// through host_shim.h) needs nothing but a C++17 compiler. On the device the conversions are
// single PTX `cvt` instructions where the architecture has them; everywhere else (the host
// build, and fp8 below sm_89) they are the small integer routines below, which give the same
// bits as the device instructions and as the Rust side (`half::f16::from_f32`,
// `half::bf16::from_f32`, `src/fp8.rs`): round to nearest even; f16/bf16 overflow to ±inf;
// fp8 saturates to ±max finite (inf too); NaN stays NaN (its payload may differ).
#pragma once

typedef signed char i8;
typedef unsigned char u8;
typedef unsigned short u16;
typedef int i32;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

#define TOPOCCL_FN static __device__ __forceinline__

// Storage of the narrow float types: raw bits, so that nothing converts them implicitly.
struct f16_t {
  u16 bits;
};
struct bf16_t {
  u16 bits;
};
struct e4m3_t {
  u8 bits;
};
struct e5m2_t {
  u8 bits;
};

// Bit casts through a union: GCC documents this, NVVM lowers it to a register move, and it
// needs no header (memcpy, __float_as_uint).
TOPOCCL_FN u32 f32_bits(float x) {
  union {
    float f;
    u32 u;
  } c;
  c.f = x;
  return c.u;
}
TOPOCCL_FN float f32_from_bits(u32 x) {
  union {
    u32 u;
    float f;
  } c;
  c.u = x;
  return c.f;
}
TOPOCCL_FN u64 f64_bits(double x) {
  union {
    double f;
    u64 u;
  } c;
  c.f = x;
  return c.u;
}

// `m >> s` rounded to nearest, ties to even (0 < s < 32).
TOPOCCL_FN u32 shift_rne(u32 m, u32 s) {
  u32 q = m >> s;
  u32 rem = m & ((1u << s) - 1u);
  u32 half = 1u << (s - 1u);
  return q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
}

// ---- software conversions (the host build; the device where PTX has no instruction) ----

TOPOCCL_FN u16 sw_f32_to_f16(float f) {
  u32 x = f32_bits(f);
  u32 sign = (x >> 16) & 0x8000u;
  u32 a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return (u16)(sign | 0x7e00u | ((a >> 13) & 0x1ffu));  // NaN, kept quiet
  if (a >= 0x477ff000u) return (u16)(sign | 0x7c00u);              // >= 65520 rounds to inf
  if (a >= 0x38800000u) return (u16)(sign | shift_rne(a - 0x38000000u, 13));  // normal
  if (a <= 0x33000000u) return (u16)sign;                          // <= 2^-25 rounds to 0
  // Subnormal result: the value is m * 2^(e-150); in steps of 2^-24 that is m >> (126 - e).
  u32 e = a >> 23;
  return (u16)(sign | shift_rne((a & 0x7fffffu) | 0x800000u, 126u - e));
}

TOPOCCL_FN float sw_f16_to_f32(u16 h) {
  u32 sign = (u32)(h & 0x8000u) << 16;
  u32 e = (h >> 10) & 0x1fu;
  u32 m = h & 0x3ffu;
  if (e == 0x1fu) return f32_from_bits(sign | 0x7f800000u | (m << 13));  // inf, NaN
  if (e != 0) return f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
  // Zero or subnormal: m * 2^-24, exact in f32.
  float v = (float)m * 5.9604644775390625e-8f;
  return f32_from_bits(sign | f32_bits(v));
}

TOPOCCL_FN u16 sw_f32_to_bf16(float f) {
  u32 x = f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (u16)((x >> 16) | 0x0040u);  // NaN, kept quiet
  u32 sign = x & 0x80000000u;
  return (u16)((sign >> 16) | shift_rne(x & 0x7fffffffu, 16));  // a carry rounds up to inf
}

TOPOCCL_FN float bf16_to_f32(u16 h) { return f32_from_bits((u32)h << 16); }

// fp8 with `m` mantissa bits, exponent bias `bias`, largest finite code `max_code` (no sign).
TOPOCCL_FN u8 sw_f32_to_fp8(float f, u32 m, u32 bias, u32 max_code) {
  u32 x = f32_bits(f);
  u32 sign = (x >> 24) & 0x80u;
  u32 a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return (u8)(sign | 0x7fu);  // NaN
  u32 code;
  if (a < ((128u - bias) << 23)) {
    // Below the smallest normal 2^(1-bias): a multiple of the step 2^(1-bias-m). The value is
    // M * 2^(E-150) (M with its hidden bit, E at least 1), so the multiple is M >> s.
    u32 e = a >> 23;
    u32 mm = e == 0 ? (a & 0x7fffffu) : ((a & 0x7fffffu) | 0x800000u);
    u32 s = 151u - bias - m - (e == 0 ? 1u : e);
    code = s > 24u ? 0u : shift_rne(mm, s);  // a result of 2^m is the smallest normal
  } else {
    // Normal (or inf, which saturates): keep the top m mantissa bits; the rounding carry
    // moves into the exponent; anything past the largest finite code saturates.
    u32 r = shift_rne(a, 23u - m);
    u32 exp8 = (r >> m) + bias - 127u;
    code = (exp8 << m) | (r & ((1u << m) - 1u));
  }
  return (u8)(sign | (code < max_code ? code : max_code));
}

// Widening needs no arithmetic of its own: every fp8 value is an f16 value. E5M2 is the top
// byte of the f16 with the same bits (inf and NaN included). E4M3's bits shifted into f16's
// layout give the value times 2^-8 (the biases differ by 8; subnormals land on f16
// subnormals), so one exact multiplication by 256 follows; its only NaN (0x7f) is apart.
TOPOCCL_FN float f16_to_f32(u16 h);
TOPOCCL_FN float sw_e5m2_to_f32(u8 c) { return f16_to_f32((u16)((u32)c << 8)); }
TOPOCCL_FN float sw_e4m3_to_f32(u8 c) {
  u32 sign = (u32)(c & 0x80u) << 8;
  u32 mag = c & 0x7fu;
  if (mag == 0x7fu) return f32_from_bits((sign << 16) | 0x7fc00000u);
  return f16_to_f32((u16)(sign | (mag << 7))) * 256.0f;
}

// ---- the conversions the kernels use ----

TOPOCCL_FN float f16_to_f32(u16 h) {
#ifdef __CUDA_ARCH__
  float r;
  asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(h));
  return r;
#else
  return sw_f16_to_f32(h);
#endif
}

TOPOCCL_FN u16 f32_to_f16(float x) {
#ifdef __CUDA_ARCH__
  u16 r;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(x));
  return r;
#else
  return sw_f32_to_f16(x);
#endif
}

TOPOCCL_FN u16 f32_to_bf16(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  u16 r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x));
  return r;
#else
  return sw_f32_to_bf16(x);
#endif
}

// fp8 through PTX on sm_89+: the pair instructions get the same value in both halves, so the
// result does not depend on which half holds which operand.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define TOPOCCL_FP8_CVT(NAME, FMT)                                                   \
  TOPOCCL_FN u8 f32_to_##NAME(float x) {                                             \
    u16 r;                                                                           \
    asm("cvt.rn.satfinite." FMT "x2.f32 %0, %1, %1;" : "=h"(r) : "f"(x));            \
    return (u8)(r & 0xffu);                                                          \
  }                                                                                  \
  TOPOCCL_FN float NAME##_to_f32(u8 c) {                                             \
    u32 h2;                                                                          \
    u16 pair = (u16)(((u32)c << 8) | c);                                             \
    asm("cvt.rn.f16x2." FMT "x2 %0, %1;" : "=r"(h2) : "h"(pair));                    \
    return f16_to_f32((u16)(h2 & 0xffffu));                                          \
  }
TOPOCCL_FP8_CVT(e4m3, "e4m3")
TOPOCCL_FP8_CVT(e5m2, "e5m2")
#undef TOPOCCL_FP8_CVT
#else
TOPOCCL_FN u8 f32_to_e4m3(float x) { return sw_f32_to_fp8(x, 3, 7, 0x7e); }
TOPOCCL_FN float e4m3_to_f32(u8 c) { return sw_e4m3_to_f32(c); }
TOPOCCL_FN u8 f32_to_e5m2(float x) { return sw_f32_to_fp8(x, 2, 15, 0x7b); }
TOPOCCL_FN float e5m2_to_f32(u8 c) { return sw_e5m2_to_f32(c); }
#endif

// ---- each storage type with the type it computes in ----

// Native types compute in themselves.
template <class S>
struct Elem {
  typedef S W;
  static __device__ __forceinline__ W widen(S x) { return x; }
  static __device__ __forceinline__ S narrow(W x) { return x; }
};

#define TOPOCCL_NARROW(S, TO_F32, FROM_F32)                                               \
  template <>                                                                             \
  struct Elem<S> {                                                                        \
    typedef float W;                                                                      \
    static __device__ __forceinline__ float widen(S x) { return TO_F32(x.bits); }         \
    static __device__ __forceinline__ S narrow(float x) {                                 \
      S r;                                                                                \
      r.bits = FROM_F32(x);                                                               \
      return r;                                                                           \
    }                                                                                     \
  };
TOPOCCL_NARROW(f16_t, f16_to_f32, f32_to_f16)
TOPOCCL_NARROW(bf16_t, bf16_to_f32, f32_to_bf16)
TOPOCCL_NARROW(e4m3_t, e4m3_to_f32, f32_to_e4m3)
TOPOCCL_NARROW(e5m2_t, e5m2_to_f32, f32_to_e5m2)
#undef TOPOCCL_NARROW
