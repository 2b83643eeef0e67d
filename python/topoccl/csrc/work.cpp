#include "work.h"

#include <optional>
#include <string>
#include <unordered_map>

#include <ATen/record_function.h>
#include <c10/util/Exception.h>

namespace topoccl {

std::exception_ptr callError(const std::string& what, ncclResult_t result, const std::string& message) {
  std::string text = what.empty() ? "topoccl: " : "topoccl " + what + ": ";
  if (result == ncclTimeout || result == ncclInProgress) {
    text += "Timed out";
    text += result == ncclTimeout ? " (ncclTimeout)" : "";
  } else {
    text += resultName(result);
  }
  if (!message.empty()) {
    text += ": " + message;
  }
  try {
    C10_THROW_ERROR(DistBackendError, text);
  } catch (...) {
    return std::current_exception();
  }
}

namespace {

// The profiler's name of a call (Gloo's names, "topoccl:" for "gloo:"), when a profiler
// listens: torch's Work then records the work as an event until it ends. Null otherwise, so a
// call costs nothing more without a profiler.
const char* profilingTitle(const char* name) {
  if (!at::hasCallbacks()) {
    return nullptr;
  }
  static const std::unordered_map<std::string, const char*> titles = {
      {"allreduce", "topoccl:all_reduce"},
      {"allreduce_coalesced", "topoccl:all_reduce_coalesced"},
      {"allreduce_sparse", "topoccl:sparse_all_reduce"},
      {"allreduce (sparse)", "topoccl:sparse_all_reduce"},
      {"allgather", "topoccl:all_gather"},
      {"allgather_coalesced", "topoccl:all_gather_coalesced"},
      {"all_gather_into_tensor", "topoccl:all_gather_into_tensor"},
      {"all_gather_into_tensor_coalesced", "topoccl:all_gather_into_tensor_coalesced"},
      {"broadcast", "topoccl:broadcast"},
      {"reduce", "topoccl:reduce"},
      {"reduce_scatter", "topoccl:reduce_scatter"},
      {"reduce_scatter_tensor", "topoccl:reduce_scatter_tensor"},
      {"reduce_scatter_tensor_coalesced", "topoccl:reduce_scatter_tensor_coalesced"},
      {"gather", "topoccl:gather"},
      {"gather_into_tensor", "topoccl:gather"},
      {"scatter", "topoccl:scatter"},
      {"all_to_all", "topoccl:all_to_all"},
      {"all_to_all_single", "topoccl:all_to_all"},
      {"barrier", "topoccl:barrier"},
      {"send", "topoccl:send"},
      {"recv", "topoccl:recv"},
      {"recv_anysource", "topoccl:recvAnySource"},
      {"coalesced", "topoccl:coalesced"},
  };
  auto it = titles.find(name);
  return it == titles.end() ? nullptr : it->second;
}

std::optional<std::vector<at::Tensor>> profiledInputs(const char* name, const std::vector<at::Tensor>& inputs) {
  if (profilingTitle(name) == nullptr) {
    return std::nullopt;
  }
  return inputs;
}

// The library's completion callback: runs on the thread that finished the batch.
void onBatchDone(void* arg, ncclResult_t result, const char* message) noexcept {
  // Exceptions must not cross back into the library.
  auto* owned = static_cast<std::shared_ptr<Batch>*>(arg);
  std::shared_ptr<Batch> batch = std::move(*owned);
  delete owned;
  std::exception_ptr error;
  std::string opName = batch->works.empty() ? "call" : batch->works.front()->name();
  if (result != ncclSuccess) {
    error = callError(opName, result, message ? message : "");
  } else {
    try {
      for (auto& f : batch->after) {
        f();
      }
    } catch (...) {
      error = std::current_exception();
    }
  }
  batch->after.clear();
  auto works = std::move(batch->works);
  for (auto& w : works) {
    try {
      w->complete(error);
    } catch (...) {
      // A future's callback threw; torch's future reports that to whoever waits on it.
    }
  }
}

} // namespace

Batch::~Batch() {
  if (handle != nullptr && lib != nullptr) {
    lib->WorkFree(handle);
  }
}

void Batch::start(const std::shared_ptr<Batch>& batch) {
  for (auto& w : batch->works) {
    w->setBatch(batch);
  }
  auto* arg = new std::shared_ptr<Batch>(batch);
  ncclResult_t r = batch->lib->WorkOnComplete(batch->handle, &onBatchDone, arg);
  if (r != ncclSuccess) {
    delete arg;
    auto error = callError("completion", r, batch->lib->describe("topocclWorkOnComplete", r));
    for (auto& w : batch->works) {
      w->complete(error);
    }
    batch->works.clear();
  }
}

TopocclWork::TopocclWork(
    int rank,
    c10d::OpType type,
    const char* name,
    std::vector<at::Tensor> outputs,
    std::chrono::milliseconds timeout,
    const std::vector<at::Tensor>& inputs)
    : c10d::Work(rank, type, profilingTitle(name), profiledInputs(name, inputs)),
      name_(name),
      outputs_(std::move(outputs)),
      timeout_(timeout) {}

c10::intrusive_ptr<TopocclWork> TopocclWork::done(
    int rank, c10d::OpType type, const char* name, std::vector<at::Tensor> outputs, std::exception_ptr error) {
  auto w = c10::make_intrusive<TopocclWork>(rank, type, name, std::move(outputs), std::chrono::milliseconds(0));
  w->complete(error);
  return w;
}

void TopocclWork::complete(std::exception_ptr error) {
  c10::intrusive_ptr<c10::ivalue::Future> future;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (completed_) {
      return;
    }
    // The profiler's event of the call ends before anyone can see the work completed: a
    // waiter may stop the profiler at once, which must find the event ended (ending it later,
    // from this thread, raced the profiler's teardown: a crash in ~ProfilerResult).
    if (recordFunctionEndCallback_) {
      recordFunctionEndCallback_();
      recordFunctionEndCallback_ = nullptr;
    }
    completed_ = true;
    exception_ = error;
    future = future_;
  }
  cv_.notify_all();
  if (future) {
    settle(future);
  }
}

void TopocclWork::settle(const c10::intrusive_ptr<c10::ivalue::Future>& future) {
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    error = exception_;
  }
  if (error) {
    future->setError(error);
  } else {
    future->markCompleted(c10::IValue(outputs_));
  }
}

bool TopocclWork::isCompleted() {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_;
}

bool TopocclWork::isSuccess() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_ && !exception_;
}

std::exception_ptr TopocclWork::exception() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return exception_;
}

int TopocclWork::sourceRank() const {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(source_, "topoccl: ", name_, " is not a receive: it has no source rank");
  TORCH_CHECK(completed_ && !exception_, "topoccl: the source rank of ", name_, " is known once it has succeeded");
  return *source_;
}

std::vector<at::Tensor> TopocclWork::result() {
  return outputs_;
}

bool TopocclWork::wait(std::chrono::milliseconds timeout) {
  std::shared_ptr<Batch> batch = batch_;
  if (batch && !isCompleted()) {
    // The caller's deadline, else the call's own; without one, the library's timeout ends a
    // stalled call. Waiting without a deadline runs queued calls on this thread while no
    // other thread does (no hand-over to the progress thread).
    auto deadline = timeout != kNoTimeout ? timeout : timeout_;
    ncclResult_t r = batch->lib->WorkWait(batch->handle, deadline.count() > 0 ? deadline.count() : -1);
    if (r == ncclInProgress) {
      // Past the deadline: the call cannot be taken back, so the communicator is aborted (its
      // running and queued calls fail at once, on every rank), as NCCL's watchdog does.
      std::string why = "topoccl " + name_ + ": Timed out waiting " + std::to_string(deadline.count()) + "ms for " +
          name_ + " to complete";
      if (batch->onTimeout) {
        batch->onTimeout();
        why += " (the communicator was aborted: its calls fail on every rank)";
      }
      C10_THROW_ERROR(DistBackendError, why);
    }
  }
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return completed_; });
  if (exception_) {
    std::rethrow_exception(exception_);
  }
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> TopocclWork::getFuture() {
  bool settleNow = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (future_) {
      return future_;
    }
    future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    settleNow = completed_;
  }
  if (settleNow) {
    settle(future_);
  }
  return future_;
}

} // namespace topoccl
