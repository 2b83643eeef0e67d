//! Element types and reduction operators, with NCCL's numbering and nccl-tests' names.

use std::fmt;
use std::str::FromStr;

use crate::buffer::Buffer;
use crate::error::Error;

/// Every NCCL datatype; the discriminant is `ncclDataType_t`'s value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Dtype {
    Int8 = 0,
    Uint8 = 1,
    Int32 = 2,
    Uint32 = 3,
    Int64 = 4,
    Uint64 = 5,
    Float16 = 6,
    Float32 = 7,
    Float64 = 8,
    Bfloat16 = 9,
    /// NCCL 2.24's 8-bit floats (see [`crate::fp8`]).
    Float8e4m3 = 10,
    Float8e5m2 = 11,
}

impl Dtype {
    /// The 8-bit float format of an fp8 type.
    pub fn fp8(self) -> Option<crate::fp8::Fp8> {
        match self {
            Dtype::Float8e4m3 => Some(crate::fp8::Fp8::E4m3),
            Dtype::Float8e5m2 => Some(crate::fp8::Fp8::E5m2),
            _ => None,
        }
    }

    pub const ALL: [Dtype; 12] = [
        Dtype::Int8,
        Dtype::Uint8,
        Dtype::Int32,
        Dtype::Uint32,
        Dtype::Int64,
        Dtype::Uint64,
        Dtype::Float16,
        Dtype::Float32,
        Dtype::Float64,
        Dtype::Bfloat16,
        Dtype::Float8e4m3,
        Dtype::Float8e5m2,
    ];

    /// The datatype with NCCL's number `value`.
    pub fn from_raw(value: i64) -> Option<Dtype> {
        Dtype::ALL.into_iter().find(|t| *t as i64 == value)
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::Int8 | Dtype::Uint8 | Dtype::Float8e4m3 | Dtype::Float8e5m2 => 1,
            Dtype::Float16 | Dtype::Bfloat16 => 2,
            Dtype::Int32 | Dtype::Uint32 | Dtype::Float32 => 4,
            Dtype::Int64 | Dtype::Uint64 | Dtype::Float64 => 8,
        }
    }

    /// nccl-tests' name (`float`, `half`, `bfloat16`, …).
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Int8 => "int8",
            Dtype::Uint8 => "uint8",
            Dtype::Int32 => "int32",
            Dtype::Uint32 => "uint32",
            Dtype::Int64 => "int64",
            Dtype::Uint64 => "uint64",
            Dtype::Float16 => "half",
            Dtype::Float32 => "float",
            Dtype::Float64 => "double",
            Dtype::Bfloat16 => "bfloat16",
            Dtype::Float8e4m3 => "f8e4m3",
            Dtype::Float8e5m2 => "f8e5m2",
        }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Dtype {
    type Err = Error;
    fn from_str(s: &str) -> Result<Dtype, Error> {
        Ok(match s {
            "int8" | "char" => Dtype::Int8,
            "uint8" => Dtype::Uint8,
            "int32" | "int" => Dtype::Int32,
            "uint32" => Dtype::Uint32,
            "int64" => Dtype::Int64,
            "uint64" => Dtype::Uint64,
            "half" | "float16" | "f16" => Dtype::Float16,
            "float" | "float32" | "f32" => Dtype::Float32,
            "double" | "float64" | "f64" => Dtype::Float64,
            "bfloat16" | "bf16" => Dtype::Bfloat16,
            "f8e4m3" | "float8e4m3" | "fp8_e4m3" => Dtype::Float8e4m3,
            "f8e5m2" | "float8e5m2" | "fp8_e5m2" => Dtype::Float8e5m2,
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "unknown datatype `{s}` (int8, uint8, int32, uint32, int64, uint64, half, float, double, bfloat16, f8e4m3, f8e5m2)"
                )))
            }
        })
    }
}

/// Every NCCL reduction; the discriminant is `ncclRedOp_t`'s value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ReduceOp {
    Sum = 0,
    Prod = 1,
    Max = 2,
    Min = 3,
    Avg = 4,
}

impl ReduceOp {
    pub const ALL: [ReduceOp; 5] = [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg];

    /// The operator with NCCL's number `value`.
    pub fn from_raw(value: i64) -> Option<ReduceOp> {
        ReduceOp::ALL.into_iter().find(|op| *op as i64 == value)
    }

    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Avg => "avg",
        }
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ReduceOp {
    type Err = Error;
    fn from_str(s: &str) -> Result<ReduceOp, Error> {
        ReduceOp::ALL
            .into_iter()
            .find(|op| op.name() == s)
            .ok_or_else(|| Error::InvalidArgument(format!("unknown reduction `{s}` (sum, prod, max, min, avg)")))
    }
}

/// A PreMulSum scalar: one element of the call's datatype.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scalar {
    /// The element's bytes, in native byte order, in the first `dtype.size()` bytes.
    Value([u8; 8]),
    /// Where the element is read when the call runs (NCCL's `ncclScalarDevice`).
    At(Buffer),
}

impl Scalar {
    /// The scalar holding `value`.
    pub fn of<T: Element>(value: T) -> Scalar {
        let mut bytes = [0u8; 8];
        let v = bytemuck::bytes_of(&value);
        bytes[..v.len()].copy_from_slice(v);
        Scalar::Value(bytes)
    }
}

/// What a reducing collective computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reduction {
    Op(ReduceOp),
    /// NCCL's PreMulSum: every rank's input multiplied by the scalar, then summed.
    PreMulSum(Scalar),
}

impl Reduction {
    /// The operator the executor combines elements with (PreMulSum sums).
    pub fn op(self) -> ReduceOp {
        match self {
            Reduction::Op(op) => op,
            Reduction::PreMulSum(_) => ReduceOp::Sum,
        }
    }

    /// Its name in messages (`sum`, …, `premulsum`).
    pub fn name(self) -> &'static str {
        match self {
            Reduction::Op(op) => op.name(),
            Reduction::PreMulSum(_) => "premulsum",
        }
    }
}

impl From<ReduceOp> for Reduction {
    fn from(op: ReduceOp) -> Reduction {
        Reduction::Op(op)
    }
}

impl fmt::Display for Reduction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust element type the typed API accepts; `DTYPE` names it on the wire and in the C ABI.
///
/// Implemented for `i8`, `u8`, `i32`, `u32`, `i64`, `u64`, `half::f16`, `f32`, `f64` and
/// `half::bf16` — NCCL's ten types.
pub trait Element: bytemuck::Pod + Send + Sync + 'static {
    const DTYPE: Dtype;
}

macro_rules! data_types {
    ($($t:ty => $d:ident),* $(,)?) => {
        $(impl Element for $t { const DTYPE: Dtype = Dtype::$d; })*
    };
}

data_types! {
    i8 => Int8, u8 => Uint8, i32 => Int32, u32 => Uint32, i64 => Int64, u64 => Uint64,
    half::f16 => Float16, f32 => Float32, f64 => Float64, half::bf16 => Bfloat16,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for t in Dtype::ALL {
            assert_eq!(t.name().parse::<Dtype>().unwrap(), t);
        }
        for op in ReduceOp::ALL {
            assert_eq!(op.name().parse::<ReduceOp>().unwrap(), op);
        }
        assert!("complex".parse::<Dtype>().is_err());
        assert_eq!(Dtype::from_raw(9), Some(Dtype::Bfloat16));
        assert_eq!(Dtype::from_raw(10), Some(Dtype::Float8e4m3));
        assert_eq!(Dtype::from_raw(11), Some(Dtype::Float8e5m2));
        assert_eq!(Dtype::from_raw(12), None);
        assert_eq!(ReduceOp::from_raw(4), Some(ReduceOp::Avg));
        assert_eq!(ReduceOp::from_raw(-1), None);
    }
}
