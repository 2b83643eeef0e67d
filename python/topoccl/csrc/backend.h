// torch.distributed's backend "topoccl" for CPU tensors: a c10d::Backend whose calls run on
// one topoccl communicator through the library's C ABI (opened privately, library.h). Each
// call is one group of the library's calls, ended without waiting (topocclGroupEndAsync); the
// work torch gets is that group's handle (work.h). The library's progress thread runs the
// calls, in issue order; a thread that waits runs them itself while none else does.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "library.h"
#include "work.h"

namespace topoccl {

class ProcessGroupTopoccl : public c10d::Backend {
 public:
  ProcessGroupTopoccl(
      const c10::intrusive_ptr<c10d::Store>& store,
      int rank,
      int size,
      std::chrono::milliseconds timeout,
      const std::string& groupName,
      const std::string& libraryPath);
  ~ProcessGroupTopoccl() override;

  const std::string getBackendName() const override {
    return "topoccl";
  }
  c10::intrusive_ptr<Options> getBackendOptions() override;
  bool supportsCoalescing() const override {
    return true;
  }
  void setTimeout(std::chrono::milliseconds timeout) override;
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> all_gather_single(
      at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputLists,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> all_gather_single_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather_single(
      at::Tensor& output, at::Tensor& input, const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(
      std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_single(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_single_coalesced(
      std::vector<at::Tensor>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> all_to_all_single(
      at::Tensor& output,
      at::Tensor& input,
      std::vector<int64_t>& outputSplitSizes,
      std::vector<int64_t>& inputSplitSizes,
      const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) override;
  uint64_t getSequenceNumberForGroup() override {
    return seq_.load();
  }
  void setSequenceNumberForGroup() override {}
  c10d::ErrorType getError() override;
  void abort() override;
  void shutdown() override;

  // The communicator (an ncclComm_t), null once shut down or aborted.
  ncclComm_t comm() const {
    return comm_->load();
  }
  const Library& library() const {
    return lib_;
  }

 private:
  // What one torch call issues: the library calls made inside its group, and what runs once
  // they succeeded.
  struct Issue {
    c10d::OpType type;
    const char* name;
    std::chrono::milliseconds timeout;  // torch's per-call timeout (kUnsetTimeout: none)
    std::vector<at::Tensor> outputs;    // the work's result()
    std::vector<at::Tensor> keep;       // alive until the calls ran
    std::vector<std::function<void()>> after;
    // torch waits at once (async_op=False): the calls run on the caller's thread when nothing
    // else is queued, with no hand-over to the progress thread.
    bool blocking = false;
    // The calls must run together (sends and receives that pair up), not one by one.
    bool grouped = false;
    // A receive's source rank, written by the library once it completes (the work's
    // sourceRank()).
    std::shared_ptr<int> source;
    // The tensors the call reads, as the profiler records them (none: `outputs`, the call is
    // in place).
    std::vector<at::Tensor> inputs;
  };

  // recv and recvAnysource (`srcRank` TOPOCCL_ANY_SOURCE): a tagged receive reporting its source.
  c10::intrusive_ptr<c10d::Work> receive(
      std::vector<at::Tensor>& tensors,
      int srcRank,
      int tag,
      c10d::OpType type,
      const char* name);
  // Issues one call: `calls` makes the library's calls (each checked through `check`) inside
  // a group of their own, or inside the open coalescing group.
  c10::intrusive_ptr<c10d::Work> issue(Issue&& what, const std::function<void()>& calls);
  // Runs `calls` inside the open group; if it throws, fails the group so that none of it runs.
  void callsInGroup(const std::function<void()>& calls) const;
  // Starts a group and makes `calls` in it, leaving it open for its end; if `calls` throws,
  // the group ends having run nothing.
  void openGroupWith(const std::function<void()>& calls) const;
  // What a work does when its own deadline passes: aborts the communicator, once.
  std::function<void()> abortOnTimeout() const;
  // Throws torch's error for a library call that failed when it was made.
  void check(const char* what, ncclResult_t result) const;
  ncclComm_t liveComm() const;
  std::chrono::milliseconds ownDeadline(std::chrono::milliseconds callTimeout) const;

  // Reductions the library lacks (bitwise ones): all-gather, then fold here.
  at::Tensor gatheredForFold(const at::Tensor& input, Issue& what);

  const Library& lib_;
  c10::intrusive_ptr<c10d::Store> store_;
  // Shared with the works' timeout handlers, which abort it: whoever takes it out first (an
  // abort, a shutdown, a timed-out wait) is the one who ends it.
  std::shared_ptr<std::atomic<ncclComm_t>> comm_ = std::make_shared<std::atomic<ncclComm_t>>(nullptr);
  std::chrono::milliseconds timeout_;
  // The timeout the library was given (TOPOCCL_TIMEOUT at init).
  std::chrono::milliseconds commTimeout_{0};
  std::string groupName_;
  std::atomic<uint64_t> seq_{0};
  std::atomic<uint64_t> monitoredBarriers_{0};

  std::mutex coalescingMutex_;
  bool coalescing_ = false;
  std::vector<Issue> coalesced_;
  std::vector<c10::intrusive_ptr<TopocclWork>> coalescedWorks_;

};

} // namespace topoccl
