// ops.cuh: one element of each operation, on the type an element computes in (numerics.cuh's
// Elem<S>::W). The rules (the top of topoccl.cu says them once) match src/exec/reduce.rs.
#pragma once

#include "numerics.cuh"

// Integers wrap: the arithmetic happens on the unsigned type of the same width, where C++
// defines overflow (signed overflow would be undefined behaviour, which an optimiser exploits).
// Division truncates toward zero in 64 bits, so no divisor up to 2^32-1 is cut short.
#define TOPOCCL_INT_OPS(T, U, WIDE)                                                    \
  TOPOCCL_FN T op_sum(T a, T b) { return (T)(U)((U)a + (U)b); }                       \
  TOPOCCL_FN T op_prod(T a, T b) { return (T)(U)((U)a * (U)b); }                      \
  TOPOCCL_FN T op_min(T a, T b) { return b < a ? b : a; }                             \
  TOPOCCL_FN T op_max(T a, T b) { return a < b ? b : a; }                             \
  TOPOCCL_FN T op_div(T a, u32 n) { return (T)((WIDE)a / (WIDE)n); }
TOPOCCL_INT_OPS(i8, u8, i64)
TOPOCCL_INT_OPS(u8, u8, u64)
TOPOCCL_INT_OPS(i32, u32, i64)
TOPOCCL_INT_OPS(u32, u32, u64)
TOPOCCL_INT_OPS(i64, u64, i64)
TOPOCCL_INT_OPS(u64, u64, u64)
#undef TOPOCCL_INT_OPS

TOPOCCL_FN bool sign_bit(float x) { return (f32_bits(x) >> 31) != 0; }
TOPOCCL_FN bool sign_bit(double x) { return (f64_bits(x) >> 63) != 0; }

// Floats: one IEEE operation each. min/max are IEEE 754-2019 minimumNumber/maximumNumber,
// written out rather than through fminf/fmaxf (whose handling of signalling NaN differs
// between glibc and PTX): a NaN operand yields the other operand (NaN only when both are),
// and -0 < +0. Selects, no branches, so both compilers keep the loops straight.
#define TOPOCCL_FLOAT_OPS(T)                                                           \
  TOPOCCL_FN T op_sum(T a, T b) { return a + b; }                                      \
  TOPOCCL_FN T op_prod(T a, T b) { return a * b; }                                     \
  TOPOCCL_FN T op_min(T a, T b) {                                                      \
    bool take_a = (b != b) | (a < b) | ((a == b) & sign_bit(a));                       \
    return take_a ? a : b;                                                             \
  }                                                                                    \
  TOPOCCL_FN T op_max(T a, T b) {                                                      \
    bool take_a = (b != b) | (a > b) | ((a == b) & sign_bit(b));                       \
    return take_a ? a : b;                                                             \
  }                                                                                    \
  TOPOCCL_FN T op_div(T a, u32 n) { return a / (T)n; }
TOPOCCL_FLOAT_OPS(float)
TOPOCCL_FLOAT_OPS(double)
#undef TOPOCCL_FLOAT_OPS

// The operations as types, so one loop template serves them all. `apply` gets the widened
// operands; `scalar` is the second operand of scale (PreMulSum) and the divisor of divide.
struct OpSum {
  template <class W>
  static __device__ __forceinline__ W apply(W a, W b) { return op_sum(a, b); }
};
struct OpProd {
  template <class W>
  static __device__ __forceinline__ W apply(W a, W b) { return op_prod(a, b); }
};
struct OpMin {
  template <class W>
  static __device__ __forceinline__ W apply(W a, W b) { return op_min(a, b); }
};
struct OpMax {
  template <class W>
  static __device__ __forceinline__ W apply(W a, W b) { return op_max(a, b); }
};
