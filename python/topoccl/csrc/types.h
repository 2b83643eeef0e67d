// torch's dtypes and reduce ops as the library takes them.
#pragma once

#include <optional>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include "library.h"

namespace topoccl {

// The library's datatype for reducing a tensor of `type` (bool as uint8); none where NCCL has
// no such type (int16, complex: torch passes complex sums as their real view).
std::optional<ncclDataType_t> reducible(at::ScalarType type);

// A reduce op resolved for one tensor: the library's operator, or a bitwise one, which the
// library lacks and the backend computes from an all-gather.
struct ResolvedOp {
  ncclRedOp_t op = ncclSum;
  bool premul = false;  // `op` was made for this call; destroy it once the call is made
  std::optional<c10d::ReduceOp::RedOpType> bitwise;
};

// Resolves `rop` for `t` (its dtype `dtype`), creating a PreMulSum operator on `comm` when
// asked for one. Throws torch's error for a combination no backend could run (AVG of bools,
// a bitwise op on floating point).
ResolvedOp resolve(
    const Library& lib,
    ncclComm_t comm,
    const c10d::ReduceOp& rop,
    const at::Tensor& t,
    ncclDataType_t dtype,
    const char* what);

// Folds rank-major gathered copies (first dimension: ranks) with a bitwise op: the reduction
// of every rank's tensor.
at::Tensor foldBitwise(const at::Tensor& gathered, c10d::ReduceOp::RedOpType op);

} // namespace topoccl
