// The reducing calls: all-reduce (dense, sparse, coalesced), reduce, reduce-scatter.
#include "backend.h"
#include "internal.h"

namespace topoccl {

c10::intrusive_ptr<c10d::Work> ProcessGroupTopoccl::allreduce(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  TORCH_CHECK(tensors.size() == 1, "topoccl allreduce: takes one tensor per process, got ", tensors.size());
  if (tensors[0].is_sparse()) {
    return allreduce_sparse(tensors, opts);
  }
  checkOne(tensors, "allreduce");
  at::Tensor t = tensors[0];
  ncclComm_t comm = liveComm();
  Issue what{c10d::OpType::ALLREDUCE, "allreduce", opts.timeout, {t}, {}, {}};
  what.blocking = !opts.asyncOp;
  at::Tensor flat = t.is_complex() ? at::view_as_real(t) : t;
  if (t.is_complex()) {
    TORCH_CHECK(
        opts.reduceOp == c10d::ReduceOp::SUM || opts.reduceOp == c10d::ReduceOp::AVG ||
            opts.reduceOp == c10d::ReduceOp::PREMUL_SUM,
        "topoccl allreduce: complex tensors reduce with SUM, AVG or PREMUL_SUM only");
  }
  ncclDataType_t dtype = reducibleOrThrow(flat, "allreduce");
  ResolvedOp op = resolve(lib_, comm, opts.reduceOp, flat, dtype, "allreduce");
  if (op.bitwise) {
    at::Tensor gathered = gatheredForFold(t, what);
    at::Tensor in = what.keep[0];
    what.after.push_back([t, gathered, bit = *op.bitwise] { t.copy_(foldBitwise(gathered, bit)); });
    return issue(std::move(what), [&] {
      check("ncclAllGather", lib_.AllGather(ptr(in), ptr(gathered), bytesOf(in), ncclUint8, comm, nullptr));
    });
  }
  OpGuard guard{lib_, comm, op};
  at::Tensor buf = writable(flat, what.after, /*copyIn=*/true);
  what.keep.push_back(buf);
  return issue(std::move(what), [&] {
    check("ncclAllReduce", lib_.AllReduce(ptr(buf), ptr(buf), buf.numel(), dtype, op.op, comm, nullptr));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopoccl::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "topoccl allreduce_coalesced: no tensors");
  ncclComm_t comm = liveComm();
  Issue what{c10d::OpType::ALLREDUCE_COALESCED, "allreduce_coalesced", opts.timeout, tensors, {}, {}};
  what.blocking = !opts.asyncOp;
  std::vector<std::pair<at::Tensor, ncclDataType_t>> bufs;
  std::vector<std::unique_ptr<OpGuard>> ops;
  for (const auto& t : tensors) {
    checkCpu(t, "allreduce_coalesced");
    TORCH_CHECK(!t.is_complex(), "topoccl allreduce_coalesced: complex tensors are not supported");
    ncclDataType_t dtype = reducibleOrThrow(t, "allreduce_coalesced");
    ResolvedOp op = resolve(lib_, comm, opts.reduceOp, t, dtype, "allreduce_coalesced");
    TORCH_CHECK(!op.bitwise, "topoccl allreduce_coalesced: bitwise ops are not supported here (use allreduce)");
    ops.push_back(std::make_unique<OpGuard>(OpGuard{lib_, comm, op}));
    at::Tensor buf = writable(t, what.after, true);
    what.keep.push_back(buf);
    bufs.emplace_back(buf, dtype);
  }
  return issue(std::move(what), [&] {
    for (size_t i = 0; i < bufs.size(); ++i) {
      auto& [buf, dtype] = bufs[i];
      check("ncclAllReduce", lib_.AllReduce(ptr(buf), ptr(buf), buf.numel(), dtype, ops[i]->op.op, comm, nullptr));
    }
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopoccl::reduce(
    std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  checkOne(tensors, "reduce");
  checkRoot(opts.rootRank, size_, "reduce");
  at::Tensor t = tensors[0];
  const int root = static_cast<int>(opts.rootRank);
  ncclComm_t comm = liveComm();
  Issue what{c10d::OpType::REDUCE, "reduce", opts.timeout, {t}, {}, {}};
  what.blocking = !opts.asyncOp;
  at::Tensor flat = t.is_complex() ? at::view_as_real(t) : t;
  ncclDataType_t dtype = reducibleOrThrow(flat, "reduce");
  ResolvedOp op = resolve(lib_, comm, opts.reduceOp, flat, dtype, "reduce");
  if (op.bitwise) {
    at::Tensor gathered = gatheredForFold(t, what);
    at::Tensor in = what.keep[0];
    if (rank_ == root) {
      what.after.push_back([t, gathered, bit = *op.bitwise] { t.copy_(foldBitwise(gathered, bit)); });
    }
    return issue(std::move(what), [&] {
      check("ncclAllGather", lib_.AllGather(ptr(in), ptr(gathered), bytesOf(in), ncclUint8, comm, nullptr));
    });
  }
  OpGuard guard{lib_, comm, op};
  at::Tensor buf = writable(flat, what.after, true);
  what.keep.push_back(buf);
  return issue(std::move(what), [&] {
    check("ncclReduce", lib_.Reduce(ptr(buf), ptr(buf), buf.numel(), dtype, op.op, root, comm, nullptr));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopoccl::reduce_scatter(
    std::vector<at::Tensor>& outputs,
    std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  checkOne(outputs, "reduce_scatter");
  TORCH_CHECK(inputs.size() == 1, "topoccl reduce_scatter: one input list per process");
  TORCH_CHECK(
      static_cast<int>(inputs[0].size()) == size_, "topoccl reduce_scatter: the input list has ", inputs[0].size(),
      " tensors for ", size_, " ranks");
  at::Tensor out = outputs[0];
  ncclComm_t comm = liveComm();
  bool even = true;
  for (const auto& in : inputs[0]) {
    checkCpu(in, "reduce_scatter");
    TORCH_CHECK(in.scalar_type() == out.scalar_type(), "topoccl reduce_scatter: inputs and output differ in dtype");
    even &= in.numel() == out.numel();
  }
  TORCH_CHECK(
      inputs[0][rank_].numel() == out.numel(), "topoccl reduce_scatter: the output has ", out.numel(),
      " elements, this rank's input ", inputs[0][rank_].numel());
  Issue what{c10d::OpType::REDUCE_SCATTER, "reduce_scatter", opts.timeout, {out}, {}, {}};
  what.inputs = inputs[0];
  what.blocking = !opts.asyncOp;
  ncclDataType_t dtype = reducibleOrThrow(out, "reduce_scatter");
  ResolvedOp op = resolve(lib_, comm, opts.reduceOp, out, dtype, "reduce_scatter");
  std::vector<at::Tensor> flat;
  for (const auto& in : inputs[0]) {
    flat.push_back(in.reshape({-1}));
  }
  at::Tensor packed = at::cat(flat);
  what.keep.push_back(packed);
  if (op.bitwise) {
    at::Tensor gathered = gatheredForFold(packed, what);
    int64_t offset = std::accumulate(
        inputs[0].begin(), inputs[0].begin() + rank_, int64_t{0}, [](int64_t s, const at::Tensor& t) { return s + t.numel(); });
    what.after.push_back([out, gathered, offset, bit = *op.bitwise] {
      out.copy_(foldBitwise(gathered, bit).narrow(0, offset, out.numel()).view(out.sizes()));
    });
    return issue(std::move(what), [&] {
      check("ncclAllGather", lib_.AllGather(ptr(packed), ptr(gathered), bytesOf(packed), ncclUint8, comm, nullptr));
    });
  }
  OpGuard guard{lib_, comm, op};
  at::Tensor buf = writable(out, what.after, false);
  what.keep.push_back(buf);
  if (even) {
    return issue(std::move(what), [&] {
      check(
          "ncclReduceScatter",
          lib_.ReduceScatter(ptr(packed), ptr(buf), buf.numel(), dtype, op.op, comm, nullptr));
    });
  }
  // Uneven shares: one reduce per rank, to that rank.
  return issue(std::move(what), [&] {
    int64_t offset = 0;
    for (int r = 0; r < size_; ++r) {
      const int64_t n = inputs[0][r].numel();
      void* src = n == 0 ? nullptr : static_cast<char*>(packed.data_ptr()) + offset * packed.element_size();
      void* dst = r == rank_ ? ptr(buf) : nullptr;
      check("ncclReduce", lib_.Reduce(src, dst, n, dtype, op.op, r, comm, nullptr));
      offset += n;
    }
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopoccl::reduce_scatter_single(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  checkCpu(output, "reduce_scatter_tensor");
  checkCpu(input, "reduce_scatter_tensor");
  TORCH_CHECK(input.scalar_type() == output.scalar_type(), "topoccl reduce_scatter_tensor: dtypes differ");
  TORCH_CHECK(
      input.numel() == output.numel() * size_, "topoccl reduce_scatter_tensor: the input has ", input.numel(),
      " elements, which is not ", size_, " x the output's ", output.numel());
  ncclComm_t comm = liveComm();
  Issue what{c10d::OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", opts.timeout, {output}, {}, {}};
  what.inputs = {input};
  what.blocking = !opts.asyncOp;
  ncclDataType_t dtype = reducibleOrThrow(output, "reduce_scatter_tensor");
  ResolvedOp op = resolve(lib_, comm, opts.reduceOp, output, dtype, "reduce_scatter_tensor");
  at::Tensor in = input.contiguous();
  what.keep.push_back(in);
  if (op.bitwise) {
    at::Tensor gathered = gatheredForFold(in, what);
    what.after.push_back([output, gathered, r = rank_, bit = *op.bitwise] {
      output.copy_(foldBitwise(gathered, bit).reshape({-1}).narrow(0, r * output.numel(), output.numel()).view(output.sizes()));
    });
    return issue(std::move(what), [&] {
      check("ncclAllGather", lib_.AllGather(ptr(in), ptr(gathered), bytesOf(in), ncclUint8, comm, nullptr));
    });
  }
  OpGuard guard{lib_, comm, op};
  at::Tensor buf = writable(output, what.after, false);
  what.keep.push_back(buf);
  return issue(std::move(what), [&] {
    check("ncclReduceScatter", lib_.ReduceScatter(ptr(in), ptr(buf), buf.numel(), dtype, op.op, comm, nullptr));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopoccl::reduce_scatter_single_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), "topoccl reduce_scatter_tensor_coalesced: lists differ in length");
  ncclComm_t comm = liveComm();
  Issue what{c10d::OpType::COALESCED, "reduce_scatter_tensor_coalesced", opts.timeout, outputs, {}, {}};
  what.blocking = !opts.asyncOp;
  struct One {
    at::Tensor in, out;
    ncclDataType_t dtype;
  };
  std::vector<One> ones;
  std::vector<std::unique_ptr<OpGuard>> ops;
  for (size_t i = 0; i < outputs.size(); ++i) {
    checkCpu(outputs[i], "reduce_scatter_tensor_coalesced");
    checkCpu(inputs[i], "reduce_scatter_tensor_coalesced");
    TORCH_CHECK(
        inputs[i].numel() == outputs[i].numel() * size_ && inputs[i].scalar_type() == outputs[i].scalar_type(),
        "topoccl reduce_scatter_tensor_coalesced: input ", i, " is not ", size_, " x output ", i);
    ncclDataType_t dtype = reducibleOrThrow(outputs[i], "reduce_scatter_tensor_coalesced");
    ResolvedOp op = resolve(lib_, comm, opts.reduceOp, outputs[i], dtype, "reduce_scatter_tensor_coalesced");
    TORCH_CHECK(!op.bitwise, "topoccl reduce_scatter_tensor_coalesced: bitwise ops are not supported here");
    ops.push_back(std::make_unique<OpGuard>(OpGuard{lib_, comm, op}));
    at::Tensor in = inputs[i].contiguous();
    at::Tensor out = writable(outputs[i], what.after, false);
    what.keep.push_back(in);
    what.keep.push_back(out);
    ones.push_back({in, out, dtype});
  }
  return issue(std::move(what), [&] {
    for (size_t i = 0; i < ones.size(); ++i) {
      check(
          "ncclReduceScatter",
          lib_.ReduceScatter(
              ptr(ones[i].in), ptr(ones[i].out), ones[i].out.numel(), ones[i].dtype, ops[i]->op.op, comm, nullptr));
    }
  });
}

} // namespace topoccl

namespace topoccl {

// A sparse sum: every rank's nonzeros (their counts first, then indices and values, each
// rank's broadcast from it), summed here. Runs to completion before it returns: the second
// step's sizes come from the first.
c10::intrusive_ptr<c10d::Work> ProcessGroupTopoccl::allreduce_sparse(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  TORCH_CHECK(tensors.size() == 1, "topoccl allreduce: takes one tensor per process, got ", tensors.size());
  at::Tensor t = tensors[0];
  if (!t.is_sparse()) {
    return allreduce(tensors, opts);
  }
  TORCH_CHECK(t.device().is_cpu(), "topoccl allreduce (sparse): CPU tensors only, got one on ", t.device());
  TORCH_CHECK(opts.reduceOp == c10d::ReduceOp::SUM, "topoccl allreduce (sparse): only SUM is supported");
  ncclComm_t comm = liveComm();
  at::Tensor input = t.coalesce();
  at::Tensor indices = input._indices().contiguous();
  at::Tensor values = input._values().contiguous();
  at::Tensor counts = at::empty({size_}, at::kLong);
  at::Tensor mine = at::full({1}, indices.size(1), at::kLong);
  issue(
      Issue{c10d::OpType::_ALLREDUCE_SPARSE, "allreduce (sparse): counts", opts.timeout, {counts}, {mine, counts}, {}},
      [&] { check("ncclAllGather", lib_.AllGather(ptr(mine), ptr(counts), sizeof(int64_t), ncclUint8, comm, nullptr)); })
      ->wait();
  std::vector<at::Tensor> idx(size_), val(size_);
  Issue what{c10d::OpType::_ALLREDUCE_SPARSE, "allreduce (sparse)", opts.timeout, {}, {}, {}};
  what.blocking = !opts.asyncOp;
  for (int r = 0; r < size_; ++r) {
    const int64_t n = counts[r].item<int64_t>();
    TORCH_CHECK(n >= 0, "topoccl allreduce (sparse): rank ", r, " reported ", n, " nonzeros");
    if (r == rank_) {
      idx[r] = indices;
      val[r] = values;
      continue;
    }
    std::vector<int64_t> vshape{n};
    vshape.insert(vshape.end(), values.sizes().begin() + 1, values.sizes().end());
    idx[r] = at::empty({indices.size(0), n}, indices.options());
    val[r] = at::empty(vshape, values.options());
  }
  what.keep.insert(what.keep.end(), idx.begin(), idx.end());
  what.keep.insert(what.keep.end(), val.begin(), val.end());
  issue(std::move(what), [&] {
    for (int r = 0; r < size_; ++r) {
      check("ncclBroadcast", lib_.Broadcast(ptr(idx[r]), ptr(idx[r]), bytesOf(idx[r]), ncclUint8, r, comm, nullptr));
      check("ncclBroadcast", lib_.Broadcast(ptr(val[r]), ptr(val[r]), bytesOf(val[r]), ncclUint8, r, comm, nullptr));
    }
  })->wait();
  at::Tensor sum = at::sparse_coo_tensor(at::cat(idx, 1), at::cat(val, 0), input.sizes(), input.options()).coalesce();
  t.copy_(sum);
  return TopocclWork::done(rank_, c10d::OpType::_ALLREDUCE_SPARSE, "allreduce_sparse", {t});
}

} // namespace topoccl
