//! Element types and reduction operators, with NCCL's numbering and nccl-tests' names.

use std::fmt;
use std::str::FromStr;

use crate::error::Error;

/// Every NCCL datatype; the discriminant is `ncclDataType_t`'s value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DataType {
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
}

impl DataType {
    pub const ALL: [DataType; 10] = [
        DataType::Int8,
        DataType::Uint8,
        DataType::Int32,
        DataType::Uint32,
        DataType::Int64,
        DataType::Uint64,
        DataType::Float16,
        DataType::Float32,
        DataType::Float64,
        DataType::Bfloat16,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DataType::Int8 | DataType::Uint8 => 1,
            DataType::Float16 | DataType::Bfloat16 => 2,
            DataType::Int32 | DataType::Uint32 | DataType::Float32 => 4,
            DataType::Int64 | DataType::Uint64 | DataType::Float64 => 8,
        }
    }

    /// nccl-tests' name (`float`, `half`, `bfloat16`, …).
    pub fn name(self) -> &'static str {
        match self {
            DataType::Int8 => "int8",
            DataType::Uint8 => "uint8",
            DataType::Int32 => "int32",
            DataType::Uint32 => "uint32",
            DataType::Int64 => "int64",
            DataType::Uint64 => "uint64",
            DataType::Float16 => "half",
            DataType::Float32 => "float",
            DataType::Float64 => "double",
            DataType::Bfloat16 => "bfloat16",
        }
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DataType {
    type Err = Error;
    fn from_str(s: &str) -> Result<DataType, Error> {
        Ok(match s {
            "int8" | "char" => DataType::Int8,
            "uint8" => DataType::Uint8,
            "int32" | "int" => DataType::Int32,
            "uint32" => DataType::Uint32,
            "int64" => DataType::Int64,
            "uint64" => DataType::Uint64,
            "half" | "float16" | "f16" => DataType::Float16,
            "float" | "float32" | "f32" => DataType::Float32,
            "double" | "float64" | "f64" => DataType::Float64,
            "bfloat16" | "bf16" => DataType::Bfloat16,
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "unknown datatype `{s}` (int8, uint8, int32, uint32, int64, uint64, half, float, double, bfloat16)"
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for t in DataType::ALL {
            assert_eq!(t.name().parse::<DataType>().unwrap(), t);
        }
        for op in ReduceOp::ALL {
            assert_eq!(op.name().parse::<ReduceOp>().unwrap(), op);
        }
        assert!("complex".parse::<DataType>().is_err());
    }
}
