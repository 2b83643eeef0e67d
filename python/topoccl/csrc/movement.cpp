// The calls that move data without reducing it: broadcast, the all-gathers, gather, scatter,
// the all-to-alls, send and receive. They move bytes (any dtype).
#include "backend.h"
#include "internal.h"

namespace topoccl {

namespace {

void checkSameType(const at::Tensor& a, const at::Tensor& b, const char* what) {
  TORCH_CHECK(
      a.scalar_type() == b.scalar_type(), "topoccl ", what, ": tensors differ in dtype (", a.scalar_type(), " and ",
      b.scalar_type(), ")");
}

// `base` + `bytes` as the library's pointer (NULL for an empty range).
void* at_offset(const at::Tensor& base, size_t offset, size_t bytes) {
  return bytes == 0 ? nullptr : static_cast<char*>(base.data_ptr()) + offset;
}

} // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupTopoccl::broadcast(
    std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  checkOne(tensors, "broadcast");
  checkRoot(opts.rootRank, size_, "broadcast");
  at::Tensor t = tensors[0];
  const int root = static_cast<int>(opts.rootRank);
  ncclComm_t comm = liveComm();
  Issue what{c10d::OpType::BROADCAST, "broadcast", opts.timeout, {t}, {}, {}};
  what.blocking = !opts.asyncOp;
  at::Tensor buf = writable(t, what.after, /*copyIn=*/rank_ == root);
  what.keep.push_back(buf);
  return issue(std::move(what), [&] {
    check("ncclBroadcast", lib_.Broadcast(ptr(buf), ptr(buf), bytesOf(buf), ncclUint8, root, comm, nullptr));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopoccl::allgather(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  checkOne(inputs, "allgather");
  TORCH_CHECK(outputs.size() == 1, "topoccl allgather: one output list per process");
  auto& outs = outputs[0];
  TORCH_CHECK(
      static_cast<int>(outs.size()) == size_, "topoccl allgather: the output list has ", outs.size(), " tensors for ",
      size_, " ranks");
  at::Tensor input = inputs[0];
  bool even = true;
  for (const auto& o : outs) {
    checkCpu(o, "allgather");
    checkSameType(o, input, "allgather");
    even &= o.numel() == input.numel();
  }
  TORCH_CHECK(
      outs[rank_].numel() == input.numel(), "topoccl allgather: this rank's output has ", outs[rank_].numel(),
      " elements, its input ", input.numel());
  ncclComm_t comm = liveComm();
  Issue what{c10d::OpType::ALLGATHER, "allgather", opts.timeout, outs, {}, {}};
  what.inputs = {input};
  what.blocking = !opts.asyncOp;
  at::Tensor in = input.contiguous();
  what.keep.push_back(in);
  if (even) {
    at::Tensor gathered = at::empty({static_cast<int64_t>(size_) * in.numel()}, in.options());
    what.keep.push_back(gathered);
    what.after.push_back([outs, gathered, n = in.numel()] {
      for (size_t r = 0; r < outs.size(); ++r) {
        outs[r].copy_(gathered.narrow(0, static_cast<int64_t>(r) * n, n).view(outs[r].sizes()));
      }
    });
    return issue(std::move(what), [&] {
      check("ncclAllGather", lib_.AllGather(ptr(in), ptr(gathered), bytesOf(in), ncclUint8, comm, nullptr));
    });
  }
  // Uneven sizes (torch's all_gather with tensors of different shapes): each rank's share
  // broadcast from it.
  std::vector<at::Tensor> bufs;
  for (const auto& o : outs) {
    bufs.push_back(writable(o, what.after, false));
  }
  what.keep.insert(what.keep.end(), bufs.begin(), bufs.end());
  return issue(std::move(what), [&] {
    for (int r = 0; r < size_; ++r) {
      void* send = r == rank_ ? ptr(in) : nullptr;
      check("ncclBroadcast", lib_.Broadcast(send, ptr(bufs[r]), bytesOf(bufs[r]), ncclUint8, r, comm, nullptr));
    }
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopoccl::all_gather_single(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  checkCpu(output, "all_gather_into_tensor");
  checkCpu(input, "all_gather_into_tensor");
  checkSameType(output, input, "all_gather_into_tensor");
  TORCH_CHECK(
      output.numel() == input.numel() * size_, "topoccl all_gather_into_tensor: the output has ", output.numel(),
      " elements, which is not ", size_, " x the input's ", input.numel());
  ncclComm_t comm = liveComm();
  Issue what{c10d::OpType::_ALLGATHER_BASE, "all_gather_into_tensor", opts.timeout, {output}, {}, {}};
  what.inputs = {input};
  what.blocking = !opts.asyncOp;
  at::Tensor in = input.contiguous();
  at::Tensor out = writable(output, what.after, false);
  what.keep.push_back(in);
  what.keep.push_back(out);
  return issue(std::move(what), [&] {
    check("ncclAllGather", lib_.AllGather(ptr(in), ptr(out), bytesOf(in), ncclUint8, comm, nullptr));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopoccl::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputLists,
    std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  // outputLists[r][i] is rank r's input i (torch's documented layout, Gloo's reading).
  TORCH_CHECK(
      static_cast<int>(outputLists.size()) == size_, "topoccl allgather_coalesced: ", outputLists.size(),
      " output lists for ", size_, " ranks");
  for (const auto& list : outputLists) {
    TORCH_CHECK(
        list.size() == inputs.size(), "topoccl allgather_coalesced: an output list has ", list.size(),
        " tensors for ", inputs.size(), " inputs");
    for (size_t i = 0; i < list.size(); ++i) {
      checkCpu(list[i], "allgather_coalesced");
      checkSameType(list[i], inputs[i], "allgather_coalesced");
      TORCH_CHECK(
          list[i].numel() == inputs[i].numel(), "topoccl allgather_coalesced: output ", i, " has ", list[i].numel(),
          " elements, input ", i, " has ", inputs[i].numel());
    }
  }
  ncclComm_t comm = liveComm();
  std::vector<at::Tensor> all;
  for (const auto& list : outputLists) {
    all.insert(all.end(), list.begin(), list.end());
  }
  Issue what{c10d::OpType::ALLGATHER_COALESCED, "allgather_coalesced", opts.timeout, all, {}, {}};
  what.inputs = inputs;
  what.blocking = !opts.asyncOp;
  std::vector<at::Tensor> ins, gathered;
  for (const auto& input : inputs) {
    checkCpu(input, "allgather_coalesced");
    ins.push_back(input.contiguous());
    gathered.push_back(at::empty({static_cast<int64_t>(size_) * input.numel()}, input.options()));
  }
  what.keep.insert(what.keep.end(), ins.begin(), ins.end());
  what.keep.insert(what.keep.end(), gathered.begin(), gathered.end());
  what.after.push_back([outputLists, gathered] {
    for (size_t r = 0; r < outputLists.size(); ++r) {
      for (size_t i = 0; i < gathered.size(); ++i) {
        const auto& o = outputLists[r][i];
        o.copy_(gathered[i].narrow(0, static_cast<int64_t>(r) * o.numel(), o.numel()).view(o.sizes()));
      }
    }
  });
  return issue(std::move(what), [&] {
    for (size_t i = 0; i < ins.size(); ++i) {
      check("ncclAllGather", lib_.AllGather(ptr(ins[i]), ptr(gathered[i]), bytesOf(ins[i]), ncclUint8, comm, nullptr));
    }
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopoccl::all_gather_single_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), "topoccl all_gather_into_tensor_coalesced: lists differ in length");
  ncclComm_t comm = liveComm();
  Issue what{c10d::OpType::COALESCED, "all_gather_into_tensor_coalesced", opts.timeout, outputs, {}, {}};
  what.blocking = !opts.asyncOp;
  std::vector<std::pair<at::Tensor, at::Tensor>> pairs;
  for (size_t i = 0; i < outputs.size(); ++i) {
    checkCpu(outputs[i], "all_gather_into_tensor_coalesced");
    checkCpu(inputs[i], "all_gather_into_tensor_coalesced");
    checkSameType(outputs[i], inputs[i], "all_gather_into_tensor_coalesced");
    TORCH_CHECK(
        outputs[i].numel() == inputs[i].numel() * size_, "topoccl all_gather_into_tensor_coalesced: output ", i,
        " is not ", size_, " x input ", i);
    at::Tensor in = inputs[i].contiguous();
    at::Tensor out = writable(outputs[i], what.after, false);
    what.keep.push_back(in);
    what.keep.push_back(out);
    pairs.emplace_back(in, out);
  }
  return issue(std::move(what), [&] {
    for (auto& [in, out] : pairs) {
      check("ncclAllGather", lib_.AllGather(ptr(in), ptr(out), bytesOf(in), ncclUint8, comm, nullptr));
    }
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopoccl::gather(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  checkOne(inputs, "gather");
  checkRoot(opts.rootRank, size_, "gather");
  const int root = static_cast<int>(opts.rootRank);
  at::Tensor in = inputs[0].contiguous();
  ncclComm_t comm = liveComm();
  std::vector<at::Tensor> outs;
  if (rank_ == root) {
    TORCH_CHECK(outputs.size() == 1, "topoccl gather: the root takes one output list");
    outs = outputs[0];
    TORCH_CHECK(
        static_cast<int>(outs.size()) == size_, "topoccl gather: the output list has ", outs.size(), " tensors for ",
        size_, " ranks");
    for (const auto& o : outs) {
      checkCpu(o, "gather");
      checkSameType(o, in, "gather");
      TORCH_CHECK(o.numel() == in.numel(), "topoccl gather: output and input sizes differ");
    }
  } else {
    TORCH_CHECK(
        outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
        "topoccl gather: only the root takes an output list");
  }
  Issue what{c10d::OpType::GATHER, "gather", opts.timeout, outs, {in}, {}};
  what.inputs = {in};
  what.blocking = !opts.asyncOp;
  at::Tensor gathered;
  if (rank_ == root) {
    gathered = at::empty({static_cast<int64_t>(size_) * in.numel()}, in.options());
    what.keep.push_back(gathered);
    what.after.push_back([outs, gathered, n = in.numel()] {
      for (size_t r = 0; r < outs.size(); ++r) {
        outs[r].copy_(gathered.narrow(0, static_cast<int64_t>(r) * n, n).view(outs[r].sizes()));
      }
    });
  }
  return issue(std::move(what), [&] {
    void* recv = gathered.defined() ? ptr(gathered) : nullptr;
    check("ncclGather", lib_.Gather(ptr(in), recv, bytesOf(in), ncclUint8, root, comm, nullptr));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopoccl::gather_single(
    at::Tensor& output, at::Tensor& input, const c10d::GatherOptions& opts) {
  checkCpu(input, "gather_into_tensor");
  checkRoot(opts.rootRank, size_, "gather_into_tensor");
  const int root = static_cast<int>(opts.rootRank);
  at::Tensor in = input.contiguous();
  ncclComm_t comm = liveComm();
  Issue what{c10d::OpType::GATHER, "gather_into_tensor", opts.timeout, {}, {in}, {}};
  what.inputs = {in};
  what.blocking = !opts.asyncOp;
  at::Tensor out;
  if (rank_ == root) {
    checkCpu(output, "gather_into_tensor");
    checkSameType(output, input, "gather_into_tensor");
    TORCH_CHECK(
        output.numel() == in.numel() * size_, "topoccl gather_into_tensor: the output has ", output.numel(),
        " elements, which is not ", size_, " x the input's ", in.numel());
    what.outputs = {output};
    out = writable(output, what.after, false);
    what.keep.push_back(out);
  }
  return issue(std::move(what), [&] {
    void* recv = out.defined() ? ptr(out) : nullptr;
    check("ncclGather", lib_.Gather(ptr(in), recv, bytesOf(in), ncclUint8, root, comm, nullptr));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopoccl::scatter(
    std::vector<at::Tensor>& outputs,
    std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  checkOne(outputs, "scatter");
  checkRoot(opts.rootRank, size_, "scatter");
  const int root = static_cast<int>(opts.rootRank);
  at::Tensor output = outputs[0];
  ncclComm_t comm = liveComm();
  Issue what{c10d::OpType::SCATTER, "scatter", opts.timeout, {output}, {}, {}};
  what.blocking = !opts.asyncOp;
  at::Tensor packed;
  if (rank_ == root) {
    TORCH_CHECK(inputs.size() == 1, "topoccl scatter: the root takes one input list");
    TORCH_CHECK(
        static_cast<int>(inputs[0].size()) == size_, "topoccl scatter: the input list has ", inputs[0].size(),
        " tensors for ", size_, " ranks");
    std::vector<at::Tensor> flat;
    for (const auto& i : inputs[0]) {
      checkCpu(i, "scatter");
      checkSameType(i, output, "scatter");
      TORCH_CHECK(i.numel() == output.numel(), "topoccl scatter: input and output sizes differ");
      flat.push_back(i.reshape({-1}));
    }
    packed = at::cat(flat);
    what.keep.push_back(packed);
  } else {
    TORCH_CHECK(
        inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
        "topoccl scatter: only the root takes an input list");
  }
  at::Tensor out = writable(output, what.after, false);
  what.keep.push_back(out);
  return issue(std::move(what), [&] {
    void* send = packed.defined() ? ptr(packed) : nullptr;
    check("ncclScatter", lib_.Scatter(send, ptr(out), bytesOf(out), ncclUint8, root, comm, nullptr));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopoccl::all_to_all_single(
    at::Tensor& output,
    at::Tensor& input,
    std::vector<int64_t>& outputSplitSizes,
    std::vector<int64_t>& inputSplitSizes,
    const c10d::AllToAllOptions& opts) {
  checkCpu(output, "all_to_all_single");
  checkCpu(input, "all_to_all_single");
  checkSameType(output, input, "all_to_all_single");
  ncclComm_t comm = liveComm();
  Issue what{c10d::OpType::ALLTOALL_BASE, "all_to_all_single", opts.timeout, {output}, {}, {}};
  what.inputs = {input};
  what.blocking = !opts.asyncOp;
  what.grouped = true;
  at::Tensor in = input.contiguous();
  at::Tensor out = writable(output, what.after, false);
  what.keep.push_back(in);
  what.keep.push_back(out);
  if (outputSplitSizes.empty() && inputSplitSizes.empty()) {
    TORCH_CHECK(
        in.numel() == out.numel() && in.numel() % size_ == 0, "topoccl all_to_all_single: input and output must have the same size, a multiple of ",
        size_);
    return issue(std::move(what), [&] {
      check("ncclAlltoAll", lib_.AlltoAll(ptr(in), ptr(out), bytesOf(in) / size_, ncclUint8, comm, nullptr));
    });
  }
  // Split sizes count rows (the first dimension); an empty list means equal splits.
  auto layout = [&](const at::Tensor& t, const std::vector<int64_t>& splits, const char* which) {
    TORCH_CHECK(
        splits.empty() || static_cast<int>(splits.size()) == size_, "topoccl all_to_all_single: ", which,
        " split sizes have ", splits.size(), " entries for ", size_, " ranks");
    const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    const size_t rowBytes = rows == 0 ? 0 : bytesOf(t) / rows;
    std::vector<size_t> offset(size_), bytes(size_);
    size_t at = 0;
    for (int r = 0; r < size_; ++r) {
      int64_t n = splits.empty() ? rows / size_ : splits[r];
      TORCH_CHECK(n >= 0, "topoccl all_to_all_single: a negative split size");
      offset[r] = at;
      bytes[r] = n * rowBytes;
      at += bytes[r];
    }
    TORCH_CHECK(at <= bytesOf(t), "topoccl all_to_all_single: ", which, " split sizes exceed the tensor");
    return std::make_pair(offset, bytes);
  };
  auto [inOff, inBytes] = layout(in, inputSplitSizes, "input");
  auto [outOff, outBytes] = layout(out, outputSplitSizes, "output");
  TORCH_CHECK(
      inBytes[rank_] == outBytes[rank_], "topoccl all_to_all_single: this rank sends itself ", inBytes[rank_],
      " bytes but expects ", outBytes[rank_]);
  return issue(std::move(what), [&] {
    if (inBytes[rank_] > 0) {
      std::memcpy(at_offset(out, outOff[rank_], 1), at_offset(in, inOff[rank_], 1), inBytes[rank_]);
    }
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) {
        continue;
      }
      if (inBytes[p] > 0) {
        check("ncclSend", lib_.Send(at_offset(in, inOff[p], inBytes[p]), inBytes[p], ncclUint8, p, comm, nullptr));
      }
      if (outBytes[p] > 0) {
        check("ncclRecv", lib_.Recv(at_offset(out, outOff[p], outBytes[p]), outBytes[p], ncclUint8, p, comm, nullptr));
      }
    }
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopoccl::alltoall(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::AllToAllOptions& opts) {
  TORCH_CHECK(
      static_cast<int>(outputs.size()) == size_ && static_cast<int>(inputs.size()) == size_,
      "topoccl all_to_all: one input and one output tensor per rank");
  ncclComm_t comm = liveComm();
  Issue what{c10d::OpType::ALLTOALL, "all_to_all", opts.timeout, outputs, {}, {}};
  what.inputs = inputs;
  what.blocking = !opts.asyncOp;
  what.grouped = true;
  std::vector<at::Tensor> ins, outs;
  for (int r = 0; r < size_; ++r) {
    checkCpu(inputs[r], "all_to_all");
    checkCpu(outputs[r], "all_to_all");
    checkSameType(inputs[r], outputs[r], "all_to_all");
    ins.push_back(inputs[r].contiguous());
    outs.push_back(writable(outputs[r], what.after, false));
  }
  TORCH_CHECK(
      ins[rank_].numel() == outs[rank_].numel(), "topoccl all_to_all: this rank's own input and output differ in size");
  what.keep.insert(what.keep.end(), ins.begin(), ins.end());
  what.keep.insert(what.keep.end(), outs.begin(), outs.end());
  return issue(std::move(what), [&] {
    if (ins[rank_].numel() > 0) {
      std::memcpy(outs[rank_].data_ptr(), ins[rank_].data_ptr(), bytesOf(ins[rank_]));
    }
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) {
        continue;
      }
      if (ins[p].numel() > 0) {
        check("ncclSend", lib_.Send(ptr(ins[p]), bytesOf(ins[p]), ncclUint8, p, comm, nullptr));
      }
      if (outs[p].numel() > 0) {
        check("ncclRecv", lib_.Recv(ptr(outs[p]), bytesOf(outs[p]), ncclUint8, p, comm, nullptr));
      }
    }
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopoccl::send(std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  checkOne(tensors, "send");
  checkRoot(dstRank, size_, "send");
  checkTag(tag, "send");
  ncclComm_t comm = liveComm();
  at::Tensor in = tensors[0].contiguous();
  Issue what{c10d::OpType::SEND, "send", c10d::kUnsetTimeout, {}, {in}, {}};
  what.inputs = {in};
  return issue(std::move(what), [&] {
    check("topocclSendTagged", lib_.SendTagged(ptr(in), bytesOf(in), ncclUint8, dstRank, tag, comm, nullptr));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopoccl::recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  checkRoot(srcRank, size_, "recv");
  return receive(tensors, srcRank, tag, c10d::OpType::RECV, "recv");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopoccl::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return receive(tensors, TOPOCCL_ANY_SOURCE, tag, c10d::OpType::RECVANYSOURCE, "recv_anysource");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopoccl::receive(
    std::vector<at::Tensor>& tensors,
    int srcRank,
    int tag,
    c10d::OpType type,
    const char* name) {
  checkOne(tensors, name);
  checkTag(tag, name);
  ncclComm_t comm = liveComm();
  at::Tensor t = tensors[0];
  Issue what{type, name, c10d::kUnsetTimeout, {t}, {}, {}};
  at::Tensor out = writable(t, what.after, false);
  what.keep.push_back(out);
  // Written by the library when the receive completes; the work keeps it.
  what.source = std::make_shared<int>(srcRank);
  int* source = what.source.get();
  return issue(std::move(what), [&] {
    check("topocclRecvTagged", lib_.RecvTagged(ptr(out), bytesOf(out), ncclUint8, srcRank, tag, source, comm, nullptr));
  });
}

} // namespace topoccl
