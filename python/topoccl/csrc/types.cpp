#include "types.h"

#include <c10/util/Exception.h>

namespace topoccl {

std::optional<ncclDataType_t> reducible(at::ScalarType type) {
  switch (type) {
    case at::kChar: return ncclInt8;
    case at::kByte: return ncclUint8;
    case at::kBool: return ncclUint8;
    case at::kInt: return ncclInt32;
    case at::kUInt32: return ncclUint32;
    case at::kLong: return ncclInt64;
    case at::kUInt64: return ncclUint64;
    case at::kHalf: return ncclFloat16;
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kBFloat16: return ncclBfloat16;
    case at::kFloat8_e4m3fn: return ncclFloat8e4m3;
    case at::kFloat8_e5m2: return ncclFloat8e5m2;
    default: return std::nullopt;
  }
}

ResolvedOp resolve(
    const Library& lib,
    ncclComm_t comm,
    const c10d::ReduceOp& rop,
    const at::Tensor& t,
    ncclDataType_t dtype,
    const char* what) {
  ResolvedOp r;
  const bool isBool = t.scalar_type() == at::kBool;
  switch (rop.op_) {
    case c10d::ReduceOp::SUM:
      // A sum of bools is their OR, as ProcessGroupNCCL makes it.
      r.op = isBool ? ncclMax : ncclSum;
      break;
    case c10d::ReduceOp::PRODUCT:
      r.op = isBool ? ncclMin : ncclProd;
      break;
    case c10d::ReduceOp::MIN:
      r.op = ncclMin;
      break;
    case c10d::ReduceOp::MAX:
      r.op = ncclMax;
      break;
    case c10d::ReduceOp::AVG:
      TORCH_CHECK(!isBool, "topoccl ", what, ": AVG of bool tensors is not defined");
      r.op = ncclAvg;
      break;
    case c10d::ReduceOp::BAND:
    case c10d::ReduceOp::BOR:
    case c10d::ReduceOp::BXOR:
      TORCH_CHECK(
          at::isIntegralType(t.scalar_type(), /*includeBool=*/true),
          "topoccl ", what, ": bitwise reductions need an integer or bool tensor, got ", t.scalar_type());
      r.bitwise = rop.op_;
      break;
    case c10d::ReduceOp::PREMUL_SUM: {
      TORCH_CHECK(at::isFloatingType(t.scalar_type()), "topoccl ", what, ": PREMUL_SUM needs a floating-point tensor");
      auto* supplement = dynamic_cast<c10d::PreMulSumSupplement*>(rop.supplement_.get());
      TORCH_CHECK(supplement != nullptr, "topoccl ", what, ": PREMUL_SUM without its factor");
      at::Tensor factor = supplement->tensor_factor.defined()
          ? supplement->tensor_factor.to(at::kCPU, t.scalar_type()).contiguous()
          : at::scalar_tensor(supplement->double_factor, at::TensorOptions().dtype(t.scalar_type()));
      ncclRedOp_t op;
      ncclResult_t res = lib.RedOpCreatePreMulSum(&op, factor.data_ptr(), dtype, ncclScalarHostImmediate, comm);
      TORCH_CHECK(res == ncclSuccess, lib.describe("topoccl ncclRedOpCreatePreMulSum", res));
      r.op = op;
      r.premul = true;
      break;
    }
    default:
      TORCH_CHECK(false, "topoccl ", what, ": reduce op ", static_cast<int>(rop.op_), " is not supported");
  }
  return r;
}

at::Tensor foldBitwise(const at::Tensor& gathered, c10d::ReduceOp::RedOpType op) {
  at::Tensor acc = gathered[0].clone();
  for (int64_t r = 1; r < gathered.size(0); ++r) {
    switch (op) {
      case c10d::ReduceOp::BAND: acc.bitwise_and_(gathered[r]); break;
      case c10d::ReduceOp::BOR: acc.bitwise_or_(gathered[r]); break;
      default: acc.bitwise_xor_(gathered[r]); break;
    }
  }
  return acc;
}

} // namespace topoccl
