//! CPU reduction kernels for every datatype × operator, on byte buffers.
//!
//! Each (type, op) pair is a monomorphised element-wise loop that LLVM vectorises; half
//! precision types are widened to f32 in blocks (with the `half` crate's SIMD conversions),
//! reduced, and rounded back once, so a sum of small integers stays exact. Integers wrap, as
//! NCCL's do. `Avg` reduces as `Sum`; the executor divides once at the end ([`divide`]).
//! Buffers whose alignment does not suit the type (possible through the C ABI) take a slower
//! unaligned path rather than failing.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use crate::fp8::Fp8;
use crate::types::{Dtype, ReduceOp};

trait Arith: bytemuck::Pod {
    fn sum(self, o: Self) -> Self;
    fn prod(self, o: Self) -> Self;
    fn min(self, o: Self) -> Self;
    fn max(self, o: Self) -> Self;
    fn div(self, n: u32) -> Self;
}

macro_rules! int_arith {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)] fn sum(self, o: Self) -> Self { self.wrapping_add(o) }
            #[inline(always)] fn prod(self, o: Self) -> Self { self.wrapping_mul(o) }
            #[inline(always)] fn min(self, o: Self) -> Self { Ord::min(self, o) }
            #[inline(always)] fn max(self, o: Self) -> Self { Ord::max(self, o) }
            #[inline(always)] fn div(self, n: u32) -> Self { (self as i128 / n as i128) as $t }
        }
    )*};
}
int_arith!(i8, u8, i32, u32, i64, u64);

// Float min/max are IEEE 754-2019 minimumNumber/maximumNumber, exactly as the CUDA kernels
// (kernels/topoccl.cu) compute them: a NaN operand yields the other operand (NaN only when both
// are), and -0 < +0. Rust's `f32::min` leaves the sign of a zero result unspecified, so the
// rule is written out, as selects (no branches) that still vectorise.
macro_rules! float_arith {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)] fn sum(self, o: Self) -> Self { self + o }
            #[inline(always)] fn prod(self, o: Self) -> Self { self * o }
            #[inline(always)]
            fn min(self, o: Self) -> Self {
                let take_self = o.is_nan() | (self < o) | ((self == o) & self.is_sign_negative());
                if take_self { self } else { o }
            }
            #[inline(always)]
            fn max(self, o: Self) -> Self {
                let take_self = o.is_nan() | (self > o) | ((self == o) & o.is_sign_negative());
                if take_self { self } else { o }
            }
            #[inline(always)] fn div(self, n: u32) -> Self { self / n as $t }
        }
    )*};
}
float_arith!(f32, f64);

#[inline(always)]
fn apply2<T: Arith>(acc: &mut [T], x: &[T], f: impl Fn(T, T) -> T) {
    for (a, b) in acc.iter_mut().zip(x) {
        *a = f(*a, *b);
    }
}

#[inline(always)]
fn apply3<T: Arith>(dst: &mut [T], x: &[T], y: &[T], f: impl Fn(T, T) -> T) {
    for ((d, a), b) in dst.iter_mut().zip(x).zip(y) {
        *d = f(*a, *b);
    }
}

fn op2<T: Arith>(op: ReduceOp, acc: &mut [T], x: &[T]) {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => apply2(acc, x, T::sum),
        ReduceOp::Prod => apply2(acc, x, T::prod),
        ReduceOp::Min => apply2(acc, x, T::min),
        ReduceOp::Max => apply2(acc, x, T::max),
    }
}

fn op3<T: Arith>(op: ReduceOp, dst: &mut [T], x: &[T], y: &[T]) {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => apply3(dst, x, y, T::sum),
        ReduceOp::Prod => apply3(dst, x, y, T::prod),
        ReduceOp::Min => apply3(dst, x, y, T::min),
        ReduceOp::Max => apply3(dst, x, y, T::max),
    }
}

/// Elements per block of the unaligned and half-precision paths.
const BLOCK: usize = 512;

/// Where a reduction's result goes.
enum Out<'a> {
    /// `acc = acc ⊕ y`.
    InPlace(&'a mut [u8]),
    /// `dst = x ⊕ y`.
    Into(&'a mut [u8], &'a [u8]),
}

fn typed<T: Arith>(op: ReduceOp, out: Out<'_>, y: &[u8]) {
    let Ok(yt) = bytemuck::try_cast_slice::<u8, T>(y) else { return unaligned::<T>(op, out, y) };
    match out {
        Out::InPlace(acc) => match bytemuck::try_cast_slice_mut::<u8, T>(acc) {
            Ok(at) => op2(op, at, yt),
            Err(_) => unaligned::<T>(op, Out::InPlace(acc), y),
        },
        Out::Into(dst, x) => {
            if aligned::<T>(dst) && aligned::<T>(x) {
                if let (Ok(dt), Ok(xt)) =
                    (bytemuck::try_cast_slice_mut::<u8, T>(dst), bytemuck::try_cast_slice::<u8, T>(x))
                {
                    return op3(op, dt, xt, yt);
                }
            }
            unaligned::<T>(op, Out::Into(dst, x), y)
        }
    }
}

fn aligned<T>(b: &[u8]) -> bool {
    (b.as_ptr() as usize) % std::mem::align_of::<T>() == 0
}

/// Runs `f(a, b, n)` over blocks of widened elements: `a` holds the accumulator's (or `x`'s)
/// block, `b` `y`'s; `f` leaves the result in `a`, which is written back.
fn blocks<W: bytemuck::Pod>(out: Out<'_>, y: &[u8], mut f: impl FnMut(&[u8], &[u8], &mut [u8])) {
    let bytes = BLOCK * std::mem::size_of::<W>();
    match out {
        Out::InPlace(acc) => {
            let mut tmp = vec![0u8; bytes];
            for (a, b) in acc.chunks_mut(bytes).zip(y.chunks(bytes)) {
                let n = b.len();
                f(&a[..n], b, &mut tmp[..n]);
                a[..n].copy_from_slice(&tmp[..n]);
            }
        }
        Out::Into(dst, x) => {
            for ((d, a), b) in dst.chunks_mut(bytes).zip(x.chunks(bytes)).zip(y.chunks(bytes)) {
                f(a, b, d);
            }
        }
    }
}

fn unaligned<T: Arith>(op: ReduceOp, out: Out<'_>, y: &[u8]) {
    let mut a = [T::zeroed(); BLOCK];
    let mut b = [T::zeroed(); BLOCK];
    blocks::<T>(out, y, |xs, ys, res| {
        let n = ys.len() / std::mem::size_of::<T>();
        bytemuck::cast_slice_mut::<T, u8>(&mut a[..n]).copy_from_slice(xs);
        bytemuck::cast_slice_mut::<T, u8>(&mut b[..n]).copy_from_slice(ys);
        op2(op, &mut a[..n], &b[..n]);
        res.copy_from_slice(bytemuck::cast_slice(&a[..n]));
    })
}

macro_rules! half_typed {
    ($name:ident, $t:ty) => {
        fn $name(op: ReduceOp, out: Out<'_>, y: &[u8]) {
            let mut a = [0f32; BLOCK];
            let mut b = [0f32; BLOCK];
            let mut h = [<$t>::ZERO; BLOCK];
            blocks::<$t>(out, y, |xs, ys, res| {
                let n = ys.len() / 2;
                bytemuck::cast_slice_mut::<$t, u8>(&mut h[..n]).copy_from_slice(xs);
                h[..n].convert_to_f32_slice(&mut a[..n]);
                bytemuck::cast_slice_mut::<$t, u8>(&mut h[..n]).copy_from_slice(ys);
                h[..n].convert_to_f32_slice(&mut b[..n]);
                op2(op, &mut a[..n], &b[..n]);
                h[..n].convert_from_f32_slice(&a[..n]);
                res.copy_from_slice(bytemuck::cast_slice(&h[..n]));
            })
        }
    };
}
half_typed!(typed_f16, f16);
half_typed!(typed_bf16, bf16);

/// fp8: widened to f32 in blocks through a 256-entry table, narrowed once per step.
fn typed_fp8(format: Fp8, op: ReduceOp, out: Out<'_>, y: &[u8]) {
    let table: [f32; 256] = std::array::from_fn(|c| format.to_f32(c as u8));
    let mut a = [0f32; BLOCK];
    let mut b = [0f32; BLOCK];
    blocks::<u8>(out, y, |xs, ys, res| {
        let n = ys.len();
        for ((wa, wb), (x, y)) in a[..n].iter_mut().zip(&mut b[..n]).zip(xs.iter().zip(ys)) {
            *wa = table[usize::from(*x)];
            *wb = table[usize::from(*y)];
        }
        op2(op, &mut a[..n], &b[..n]);
        for (r, v) in res.iter_mut().zip(&a[..n]) {
            *r = format.from_f32(*v);
        }
    })
}

fn dispatch(dtype: Dtype, op: ReduceOp, out: Out<'_>, y: &[u8]) {
    match dtype {
        Dtype::Int8 => typed::<i8>(op, out, y),
        Dtype::Uint8 => typed::<u8>(op, out, y),
        Dtype::Int32 => typed::<i32>(op, out, y),
        Dtype::Uint32 => typed::<u32>(op, out, y),
        Dtype::Int64 => typed::<i64>(op, out, y),
        Dtype::Uint64 => typed::<u64>(op, out, y),
        Dtype::Float32 => typed::<f32>(op, out, y),
        Dtype::Float64 => typed::<f64>(op, out, y),
        Dtype::Float16 => typed_f16(op, out, y),
        Dtype::Bfloat16 => typed_bf16(op, out, y),
        Dtype::Float8e4m3 => typed_fp8(Fp8::E4m3, op, out, y),
        Dtype::Float8e5m2 => typed_fp8(Fp8::E5m2, op, out, y),
    }
}

/// `acc = acc ⊕ x`. Both lengths are equal multiples of the element size.
pub(crate) fn reduce_in_place(dtype: Dtype, op: ReduceOp, acc: &mut [u8], x: &[u8]) {
    debug_assert_eq!(acc.len(), x.len());
    dispatch(dtype, op, Out::InPlace(acc), x)
}

/// `dst = a ⊕ b`, in one pass.
pub(crate) fn reduce_into(dtype: Dtype, op: ReduceOp, dst: &mut [u8], a: &[u8], b: &[u8]) {
    debug_assert!(dst.len() == a.len() && a.len() == b.len());
    dispatch(dtype, op, Out::Into(dst, a), b)
}

/// Divides every element by `n` (the end of `Avg`).
pub(crate) fn divide(dtype: Dtype, data: &mut [u8], n: u32) {
    fn each<T: Arith>(data: &mut [u8], n: u32) {
        match bytemuck::try_cast_slice_mut::<u8, T>(data) {
            Ok(t) => t.iter_mut().for_each(|v| *v = v.div(n)),
            Err(_) => {
                for c in data.chunks_exact_mut(std::mem::size_of::<T>()) {
                    let v: T = bytemuck::pod_read_unaligned(c);
                    c.copy_from_slice(bytemuck::bytes_of(&v.div(n)));
                }
            }
        }
    }
    fn halves<T: bytemuck::Pod + Copy>(data: &mut [u8], n: u32, to: fn(T) -> f32, from: fn(f32) -> T) {
        for c in data.chunks_exact_mut(2) {
            let v: T = bytemuck::pod_read_unaligned(c);
            c.copy_from_slice(bytemuck::bytes_of(&from(to(v) / n as f32)));
        }
    }
    match dtype {
        Dtype::Int8 => each::<i8>(data, n),
        Dtype::Uint8 => each::<u8>(data, n),
        Dtype::Int32 => each::<i32>(data, n),
        Dtype::Uint32 => each::<u32>(data, n),
        Dtype::Int64 => each::<i64>(data, n),
        Dtype::Uint64 => each::<u64>(data, n),
        Dtype::Float32 => each::<f32>(data, n),
        Dtype::Float64 => each::<f64>(data, n),
        Dtype::Float16 => halves::<f16>(data, n, f16::to_f32, f16::from_f32),
        Dtype::Bfloat16 => halves::<bf16>(data, n, bf16::to_f32, bf16::from_f32),
        Dtype::Float8e4m3 | Dtype::Float8e5m2 => {
            if let Some(format) = dtype.fp8() {
                data.iter_mut().for_each(|c| *c = format.from_f32(format.to_f32(*c) / n as f32));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes<T: bytemuck::Pod>(v: &[T]) -> Vec<u8> {
        bytemuck::cast_slice(v).to_vec()
    }

    #[test]
    fn every_op_on_ints_and_floats() {
        let a = bytes(&[5i32, -3, 7, i32::MAX]);
        let b = bytes(&[2i32, 4, -7, 1]);
        let cases = [
            (ReduceOp::Sum, [7, 1, 0, i32::MIN]),
            (ReduceOp::Prod, [10, -12, -49, i32::MAX]),
            (ReduceOp::Min, [2, -3, -7, 1]),
            (ReduceOp::Max, [5, 4, 7, i32::MAX]),
        ];
        for (op, want) in cases {
            let mut acc = a.clone();
            reduce_in_place(Dtype::Int32, op, &mut acc, &b);
            assert_eq!(bytemuck::cast_slice::<u8, i32>(&acc), want, "{op}");
            let mut dst = vec![0u8; a.len()];
            reduce_into(Dtype::Int32, op, &mut dst, &a, &b);
            assert_eq!(dst, acc);
        }
        let mut acc = bytes(&[1.5f64, -2.0]);
        reduce_in_place(Dtype::Float64, ReduceOp::Prod, &mut acc, &bytes(&[2.0f64, 0.25]));
        assert_eq!(bytemuck::cast_slice::<u8, f64>(&acc), [3.0, -0.5]);
    }

    #[test]
    fn half_types_are_exact_on_small_integers_over_block_edges() {
        let n = BLOCK * 2 + 3;
        let x: Vec<f16> = (0..n).map(|i| f16::from_f32((i % 100) as f32)).collect();
        let y: Vec<f16> = (0..n).map(|i| f16::from_f32((i % 7) as f32)).collect();
        let mut acc = bytes(&x);
        reduce_in_place(Dtype::Float16, ReduceOp::Sum, &mut acc, &bytes(&y));
        let got: &[f16] = bytemuck::cast_slice(&acc);
        for (i, g) in got.iter().enumerate() {
            assert_eq!(g.to_f32(), ((i % 100) + (i % 7)) as f32);
        }
        let mut acc = bytes(&[bf16::from_f32(3.0), bf16::from_f32(-1.0)]);
        reduce_in_place(Dtype::Bfloat16, ReduceOp::Max, &mut acc, &bytes(&[bf16::from_f32(2.0), bf16::from_f32(4.0)]));
        assert_eq!(bytemuck::cast_slice::<u8, bf16>(&acc), [bf16::from_f32(3.0), bf16::from_f32(4.0)]);
    }

    #[test]
    fn fp8_reduces_through_f32_and_saturates() {
        let e4 = |v: &[f32]| v.iter().map(|x| Fp8::E4m3.from_f32(*x)).collect::<Vec<u8>>();
        let mut acc = e4(&[1.0, 3.0, 400.0, -2.0]);
        reduce_in_place(Dtype::Float8e4m3, ReduceOp::Sum, &mut acc, &e4(&[2.0, 0.5, 400.0, 2.0]));
        let got: Vec<f32> = acc.iter().map(|c| Fp8::E4m3.to_f32(*c)).collect();
        assert_eq!(got, [3.0, 3.5, 448.0, 0.0]);
        let mut acc = e4(&[1.0, -3.0]);
        reduce_in_place(Dtype::Float8e4m3, ReduceOp::Min, &mut acc, &e4(&[2.0, 0.5]));
        assert_eq!(acc, e4(&[1.0, -3.0]));
        let mut v = vec![Fp8::E5m2.from_f32(12.0)];
        divide(Dtype::Float8e5m2, &mut v, 4);
        assert_eq!(Fp8::E5m2.to_f32(v[0]), 3.0);
    }

    #[test]
    fn float_min_max_are_minimum_and_maximum_number() {
        let (nan, snan) = (f32::NAN, f32::from_bits(0x7f80_0001));
        let a = [nan, 1.0, nan, -0.0, 0.0, -0.0, snan, 2.0, -nan];
        let b = [1.0, nan, nan, 0.0, -0.0, -0.0, -3.0, snan, 5.0];
        let run = |op| {
            let mut acc = bytes(&a);
            reduce_in_place(Dtype::Float32, op, &mut acc, &bytes(&b));
            bytemuck::cast_slice::<u8, f32>(&acc)
                .iter()
                .map(|v| if v.is_nan() { "NaN".into() } else { format!("{v:?}") })
                .collect::<Vec<_>>()
        };
        assert_eq!(run(ReduceOp::Min), ["1.0", "1.0", "NaN", "-0.0", "-0.0", "-0.0", "-3.0", "2.0", "5.0"]);
        assert_eq!(run(ReduceOp::Max), ["1.0", "1.0", "NaN", "0.0", "0.0", "-0.0", "-3.0", "2.0", "5.0"]);
        // Through the widened paths too: bf16 and f64.
        let mut acc = bytes(&[bf16::from_bits(0x7f81), bf16::from_f32(-0.0)]);
        reduce_in_place(Dtype::Bfloat16, ReduceOp::Max, &mut acc, &bytes(&[bf16::from_f32(4.0), bf16::from_f32(0.0)]));
        assert_eq!(bytemuck::cast_slice::<u8, u16>(&acc), [bf16::from_f32(4.0).to_bits(), 0]);
        let mut acc = bytes(&[0.0f64, f64::NAN]);
        reduce_in_place(Dtype::Float64, ReduceOp::Min, &mut acc, &bytes(&[-0.0f64, -1.0]));
        assert_eq!(bytemuck::cast_slice::<u8, u64>(&acc), [(-0.0f64).to_bits(), (-1.0f64).to_bits()]);
    }

    #[test]
    fn misaligned_buffers_take_the_slow_path_correctly() {
        let a: Vec<u64> = (0..1000).collect();
        let mut raw = vec![0u8; 8001];
        raw[1..].copy_from_slice(&bytes(&a));
        let b = bytes(&a);
        reduce_in_place(Dtype::Uint64, ReduceOp::Sum, &mut raw[1..], &b);
        let want: Vec<u64> = a.iter().map(|v| v * 2).collect();
        assert_eq!(&raw[1..], &bytes(&want)[..]);
    }

    #[test]
    fn divide_truncates_integers_and_rounds_floats() {
        let mut v = bytes(&[7i8, -7, 127]);
        divide(Dtype::Int8, &mut v, 2);
        assert_eq!(bytemuck::cast_slice::<u8, i8>(&v), [3, -3, 63]);
        let mut v = bytes(&[10u8]);
        divide(Dtype::Uint8, &mut v, 200);
        assert_eq!(v, [0]);
        let mut v = bytes(&[f16::from_f32(9.0)]);
        divide(Dtype::Float16, &mut v, 3);
        assert_eq!(bytemuck::cast_slice::<u8, f16>(&v)[0].to_f32(), 3.0);
    }
}
