// The work objects torch gets: each is the core's work (a topocclWork_t, the handle of one
// ended group), completed by the library's completion callback on the thread that ran the
// calls. No queue or thread of the backend's own.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "library.h"

namespace topoccl {

class TopocclWork;

// One ended group: its handle, what runs once it succeeded (copies into outputs that could
// not be written in place, local folds), the tensors the calls read and write (alive until
// the calls have run), and the works it completes.
struct Batch {
  const Library* lib = nullptr;
  topocclWork_t handle = nullptr;
  std::vector<std::function<void()>> after;
  std::vector<at::Tensor> keep;
  std::vector<c10::intrusive_ptr<TopocclWork>> works;
  // Called when the wait for the batch outlasted its deadline (aborts the communicator).
  std::function<void()> onTimeout;

  Batch() = default;
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;
  ~Batch();

  // Registers the completion callback: from here on the library completes the works.
  static void start(const std::shared_ptr<Batch>& batch);
};

class TopocclWork : public c10d::Work {
 public:
  // `timeout`: a deadline of the call's own (torch's per-call timeout when it is shorter than
  // the communicator's, which the library enforces), or zero.
  // `inputs`: what the profiler records as the call's input (when one listens: the work is
  // then an event "topoccl:<call>" from here to its completion, as Gloo's "gloo:<call>").
  TopocclWork(
      int rank,
      c10d::OpType type,
      const char* name,
      std::vector<at::Tensor> outputs,
      std::chrono::milliseconds timeout,
      const std::vector<at::Tensor>& inputs = {});

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  void synchronize() override {}
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  std::chrono::milliseconds getTimeout() const override {
    return timeout_;
  }
  uint64_t getSequencenumber() const override {
    return seq_;
  }

  // A work that has completed with this result (calls that run nothing, or ran locally).
  static c10::intrusive_ptr<TopocclWork> done(
      int rank, c10d::OpType type, const char* name, std::vector<at::Tensor> outputs, std::exception_ptr error = nullptr);

  void setBatch(std::shared_ptr<Batch> batch) {
    batch_ = std::move(batch);
  }
  void setSequenceNumber(uint64_t seq) {
    seq_ = seq;
  }
  // A receive's: where the library writes the rank its message came from.
  void setSource(std::shared_ptr<int> source) {
    source_ = std::move(source);
  }
  // The rank a receive's message came from, once it has completed (torch's
  // `work._source_rank()`, which `recv(src=None)` returns).
  int sourceRank() const override;
  const std::string& name() const {
    return name_;
  }

  // Marks the work completed (error or not) and settles its future; once.
  void complete(std::exception_ptr error);

 private:
  void settle(const c10::intrusive_ptr<c10::ivalue::Future>& future);

  std::string name_;
  std::vector<at::Tensor> outputs_;
  std::chrono::milliseconds timeout_;
  uint64_t seq_ = 0;
  std::shared_ptr<Batch> batch_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::shared_ptr<int> source_;
};

// torch's error for a failed call (`what`: the torch call, or empty when `message` names the
// library's function): a DistBackendError whose text says "Timed out" for a timeout, as
// torch's and Gloo's do.
std::exception_ptr callError(const std::string& what, ncclResult_t result, const std::string& message);

} // namespace topoccl
