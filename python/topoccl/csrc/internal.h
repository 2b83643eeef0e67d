// Helpers the backend's call files share: argument checks, the pointers the library gets,
// and buffers a call can write.
#pragma once

#include <cstring>
#include <functional>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "library.h"
#include "types.h"

namespace topoccl {

inline void checkCpu(const at::Tensor& t, const char* what) {
  TORCH_CHECK(
      t.device().is_cpu(),
      "topoccl ", what, ": the topoccl backend takes CPU tensors, got one on ", t.device(),
      " (give CUDA tensors to NCCL: init_process_group(\"cpu:topoccl,cuda:nccl\"))");
  TORCH_CHECK(t.layout() == at::kStrided, "topoccl ", what, ": dense tensors only (got ", t.layout(), ")");
}

inline void checkOne(const std::vector<at::Tensor>& tensors, const char* what) {
  TORCH_CHECK(tensors.size() == 1, "topoccl ", what, ": takes one tensor per process, got ", tensors.size());
  checkCpu(tensors[0], what);
}

inline void checkTag(int tag, const char* what) {
  TORCH_CHECK(
      tag >= 0 && tag <= TOPOCCL_MAX_TAG, "topoccl ", what, ": tag ", tag, " is outside 0..", TOPOCCL_MAX_TAG);
}

inline void checkRoot(int64_t root, int size, const char* what) {
  TORCH_CHECK(root >= 0 && root < size, "topoccl ", what, ": invalid root rank ", root, " for ", size, " ranks");
}

inline size_t bytesOf(const at::Tensor& t) {
  return static_cast<size_t>(t.numel()) * t.element_size();
}

// Host memory to the library: a tensor's first byte (NULL for an empty tensor's).
inline void* ptr(const at::Tensor& t) {
  return t.numel() == 0 ? nullptr : t.data_ptr();
}

inline ncclDataType_t reducibleOrThrow(const at::Tensor& t, const char* what) {
  auto d = reducible(t.scalar_type());
  TORCH_CHECK(d.has_value(), "topoccl ", what, ": cannot reduce ", t.scalar_type(), " tensors");
  return *d;
}

// Destroys a PreMulSum operator once the call that uses it is made (the call keeps its factor).
struct OpGuard {
  const Library& lib;
  ncclComm_t comm;
  ResolvedOp op;
  ~OpGuard() {
    if (op.premul) {
      lib.RedOpDestroy(op.op, comm);
    }
  }
};

// Where a call writes a tensor: the tensor itself when it is contiguous, else a contiguous
// copy written back once the call succeeded.
inline at::Tensor writable(const at::Tensor& t, std::vector<std::function<void()>>& after, bool copyIn) {
  if (t.is_contiguous()) {
    return t;
  }
  at::Tensor tmp = copyIn ? t.contiguous() : at::empty(t.sizes(), t.options().memory_format(at::MemoryFormat::Contiguous));
  after.push_back([t, tmp] { t.copy_(tmp); });
  return tmp;
}

} // namespace topoccl
