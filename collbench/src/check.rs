//! Correctness check data, as nccl-tests builds it: inputs are small integers, chosen so that
//! every datatype and operator has one exact expected result whatever order the ranks'
//! contributions are combined in (sums stay within bf16's exact integers for up to 64 ranks,
//! products are powers of two). Integers wrap as the reductions do; `avg` divides once at the
//! end, as topoccl documents.

use half::{bf16, f16};

use topoccl::types::{Dtype, ReduceOp};

/// One expected element, before conversion to its datatype.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Value {
    Exact(i128),
    /// A sum to divide by the rank count (`avg`).
    Mean(i128, u32),
}

/// Rank `rank`'s input element at index `i` (for reductions with `op`).
pub(crate) fn input(op: ReduceOp, rank: u32, i: usize) -> i128 {
    let k = rank as usize * 3 + i;
    match op {
        // A factor 2 from one rank in eight: exact powers of two.
        ReduceOp::Prod => 1 + i128::from((k % 8) == 0),
        _ => 1 + (k % 4) as i128,
    }
}

/// The reduction over `nranks` ranks of their element `i`.
pub(crate) fn reduced(op: ReduceOp, nranks: u32, i: usize) -> Value {
    let vals = (0..nranks).map(|r| input(op, r, i));
    match op {
        ReduceOp::Sum => Value::Exact(vals.sum()),
        ReduceOp::Prod => Value::Exact(vals.product()),
        ReduceOp::Max => Value::Exact(vals.max().unwrap_or(0)),
        ReduceOp::Min => Value::Exact(vals.min().unwrap_or(0)),
        ReduceOp::Avg => Value::Mean(vals.sum(), nranks),
    }
}

fn encode(dtype: Dtype, v: Value, out: &mut [u8]) {
    macro_rules! int {
        ($t:ty) => {{
            let x: $t = match v {
                Value::Exact(x) => x as $t,
                Value::Mean(s, n) => ((s as $t) as i128 / i128::from(n)) as $t,
            };
            out.copy_from_slice(&x.to_le_bytes());
        }};
    }
    let exact = |x: i128| x as f64;
    match dtype {
        Dtype::Int8 => int!(i8),
        Dtype::Uint8 => int!(u8),
        Dtype::Int32 => int!(i32),
        Dtype::Uint32 => int!(u32),
        Dtype::Int64 => int!(i64),
        Dtype::Uint64 => int!(u64),
        Dtype::Float32 => {
            let x = match v {
                Value::Exact(x) => exact(x) as f32,
                Value::Mean(s, n) => exact(s) as f32 / n as f32,
            };
            out.copy_from_slice(&x.to_le_bytes());
        }
        Dtype::Float64 => {
            let x = match v {
                Value::Exact(x) => exact(x),
                Value::Mean(s, n) => exact(s) / f64::from(n),
            };
            out.copy_from_slice(&x.to_le_bytes());
        }
        Dtype::Float16 => {
            let x = match v {
                Value::Exact(x) => f16::from_f64(exact(x)),
                Value::Mean(s, n) => f16::from_f32(f16::from_f64(exact(s)).to_f32() / n as f32),
            };
            out.copy_from_slice(&x.to_le_bytes());
        }
        Dtype::Float8e4m3 | Dtype::Float8e5m2 => {
            let x = match v {
                Value::Exact(x) => exact(x) as f32,
                Value::Mean(s, n) => exact(s) as f32 / n as f32,
            };
            if let Some(format) = dtype.fp8() {
                out[0] = format.from_f32(x);
            }
        }
        Dtype::Bfloat16 => {
            let x = match v {
                Value::Exact(x) => bf16::from_f64(exact(x)),
                Value::Mean(s, n) => bf16::from_f32(bf16::from_f64(exact(s)).to_f32() / n as f32),
            };
            out.copy_from_slice(&x.to_le_bytes());
        }
    }
}

/// Writes element `i` of `buf` as `f(i)`, for every element.
pub(crate) fn fill(dtype: Dtype, buf: &mut [u8], f: impl Fn(usize) -> Value) {
    for (i, e) in buf.chunks_exact_mut(dtype.size()).enumerate() {
        encode(dtype, f(i), e);
    }
}

/// How many elements of `buf` differ from `f(i)`: bit for bit, except in the 8-bit floats,
/// whose 2 or 3 mantissa bits cannot hold every partial sum of the check's integers, so each
/// step of a reduction may round; there an element is wrong when it is further from the
/// exact value than that rounding allows (an eighth for E4M3, a quarter for E5M2).
pub(crate) fn wrong(dtype: Dtype, buf: &[u8], f: impl Fn(usize) -> Value) -> u64 {
    let mut want = vec![0u8; dtype.size()];
    let mut bad = 0;
    for (i, e) in buf.chunks_exact(dtype.size()).enumerate() {
        if let Some(format) = dtype.fp8() {
            let exact = match f(i) {
                Value::Exact(x) => x as f64,
                Value::Mean(s, n) => s as f64 / f64::from(n),
            };
            let tolerance = if format == topoccl::fp8::Fp8::E4m3 { 0.125 } else { 0.25 };
            let got = f64::from(format.to_f32(e[0]));
            // NaN is wrong too.
            let close = (got - exact).abs() <= tolerance * exact.abs();
            bad += u64::from(!close);
            continue;
        }
        encode(dtype, f(i), &mut want);
        bad += u64::from(e != want.as_slice());
    }
    bad
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_values_are_exact_in_every_type() {
        // 8 ranks: sums up to 32, products up to 2, averages of small integers.
        let mut buf = [0u8; 8];
        for dtype in Dtype::ALL {
            for op in ReduceOp::ALL {
                let b = &mut buf[..dtype.size()];
                fill(dtype, b, |_| reduced(op, 8, 5));
                assert_eq!(wrong(dtype, b, |_| reduced(op, 8, 5)), 0);
                if op == ReduceOp::Sum {
                    // 1+2+3+4 twice = 20 at every index.
                    assert_eq!(wrong(dtype, b, |_| Value::Exact(20)), 0, "{dtype:?}");
                    let off = if dtype.fp8().is_some() { 40 } else { 21 };
                    assert_eq!(wrong(dtype, b, |_| Value::Exact(off)), 1, "{dtype:?}");
                }
            }
        }
        assert_eq!(reduced(ReduceOp::Prod, 16, 0), Value::Exact(4));
        assert_eq!(reduced(ReduceOp::Max, 3, 0), Value::Exact(4));
    }
}
