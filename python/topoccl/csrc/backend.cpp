#include "backend.h"

#include <cstdlib>
#include <cstring>
#include <map>
#include <numeric>

#include <c10/util/Exception.h>

#include "internal.h"

namespace topoccl {

namespace {

// Per (group name, rank): communicators this process made, so every member agrees on a
// unique-id key that no earlier group of the same name used (torch reuses names).
std::mutex createdMutex;
std::map<std::pair<std::string, int>, int> created;

// Serializes inits that set TOPOCCL_TIMEOUT for the library to read.
std::mutex initMutex;

} // namespace

ProcessGroupTopoccl::ProcessGroupTopoccl(
    const c10::intrusive_ptr<c10d::Store>& store,
    int rank,
    int size,
    std::chrono::milliseconds timeout,
    const std::string& groupName,
    const std::string& libraryPath)
    : Backend(rank, size), lib_(load(libraryPath)), store_(store), timeout_(timeout), groupName_(groupName) {
  int n = 0;
  {
    std::lock_guard<std::mutex> lock(createdMutex);
    n = created[{groupName, rank}]++;
  }
  const std::string key = "topoccl/unique_id/" + std::to_string(n);
  ncclUniqueId id;
  if (rank == 0) {
    check("ncclGetUniqueId", lib_.GetUniqueId(&id));
    store_->set(key, std::vector<uint8_t>(id.internal, id.internal + sizeof(id.internal)));
  } else {
    std::vector<uint8_t> bytes = store_->get(key);
    TORCH_CHECK(bytes.size() == sizeof(id.internal), "topoccl: the unique id in the store has ", bytes.size(), " bytes");
    std::memcpy(id.internal, bytes.data(), sizeof(id.internal));
  }
  ncclComm_t comm = nullptr;
  ncclResult_t r;
  {
    // The library's deadline (seconds without progress) is the group's timeout, unless the
    // environment sets one. The library reads it when the init is made: made inside a group,
    // the init only starts at the group's end, after the variable is restored, so other
    // threads' inits (ranks of one job in one process) never wait for this one's rendezvous.
    std::lock_guard<std::mutex> lock(initMutex);
    const char* set = std::getenv("TOPOCCL_TIMEOUT");
    const bool ours = (set == nullptr || *set == '\0') && timeout.count() > 0;
    if (ours) {
      setenv("TOPOCCL_TIMEOUT", std::to_string(timeout.count() / 1000.0).c_str(), 1);
    }
    check("ncclGroupStart", lib_.GroupStart());
    r = lib_.CommInitRank(&comm, size, id, rank);
    if (ours) {
      unsetenv("TOPOCCL_TIMEOUT");
    }
  }
  ncclResult_t ended = lib_.GroupEnd();
  if (r == ncclSuccess) {
    r = ended;
  }
  check("ncclCommInitRank", r);
  TORCH_CHECK(comm != nullptr, "topoccl: ncclCommInitRank returned no communicator");
  commTimeout_ = timeout;
  comm_->store(comm);
}

ProcessGroupTopoccl::~ProcessGroupTopoccl() {
  if (ncclComm_t comm = comm_->exchange(nullptr)) {
    lib_.CommDestroy(comm);
  }
}

void ProcessGroupTopoccl::check(const char* what, ncclResult_t result) const {
  if (result != ncclSuccess) {
    // The library's text names the function ("ncclAllReduce: rank 1 ...").
    const char* last = lib_.GetLastError(nullptr);
    std::string message = last != nullptr && *last != '\0' ? std::string(last) : lib_.describe(what, result);
    std::rethrow_exception(callError("", result, message));
  }
}

ncclComm_t ProcessGroupTopoccl::liveComm() const {
  ncclComm_t comm = comm_->load();
  TORCH_CHECK(comm != nullptr, "topoccl: the process group was shut down or aborted");
  return comm;
}

c10::intrusive_ptr<c10d::Backend::Options> ProcessGroupTopoccl::getBackendOptions() {
  auto o = c10::make_intrusive<Options>("topoccl", timeout_);
  o->group_name = groupName_;
  return o;
}

void ProcessGroupTopoccl::setTimeout(std::chrono::milliseconds timeout) {
  timeout_ = timeout;
}

std::function<void()> ProcessGroupTopoccl::abortOnTimeout() const {
  return [lib = &lib_, cell = comm_] {
    if (ncclComm_t comm = cell->exchange(nullptr)) {
      lib->CommAbort(comm);
    }
  };
}

std::chrono::milliseconds ProcessGroupTopoccl::ownDeadline(std::chrono::milliseconds callTimeout) const {
  // The library fails a stalled call after the communicator's timeout (never earlier); a
  // shorter deadline for this call is kept by the wait.
  auto t = callTimeout.count() > 0 ? callTimeout : timeout_;
  if (t.count() > 0 && t < commTimeout_) {
    return t;
  }
  return std::chrono::milliseconds(0);
}

void ProcessGroupTopoccl::callsInGroup(const std::function<void()>& calls) const {
  try {
    calls();
  } catch (...) {
    // Nothing of a call that failed half-way may run: a failed library call in a group makes
    // the group's end run nothing (NCCL's rule), and this one fails on purpose.
    lib_.Send(nullptr, 0, ncclUint8, -1, nullptr, nullptr);
    throw;
  }
}

void ProcessGroupTopoccl::openGroupWith(const std::function<void()>& calls) const {
  check("ncclGroupStart", lib_.GroupStart());
  try {
    callsInGroup(calls);
  } catch (...) {
    lib_.GroupEnd();  // runs nothing: callsInGroup failed the group
    throw;
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopoccl::issue(Issue&& what, const std::function<void()>& calls) {
  const uint64_t seq = ++seq_;
  const auto deadline = ownDeadline(what.timeout);
  // Made before the calls: a profiler's event of the call starts here.
  auto makeWork = [&](std::chrono::milliseconds timeout) {
    const auto& inputs = what.inputs.empty() ? what.outputs : what.inputs;
    auto work = c10::make_intrusive<TopocclWork>(rank_, what.type, what.name, what.outputs, timeout, inputs);
    work->setSequenceNumber(seq);
    work->setSource(what.source);
    return work;
  };
  auto queuedWork = [&] { return makeWork(deadline); };
  {
    std::lock_guard<std::mutex> lock(coalescingMutex_);
    if (coalescing_) {
      auto work = queuedWork();
      callsInGroup(calls);
      coalesced_.push_back(std::move(what));
      coalescedWorks_.push_back(work);
      return work;
    }
  }
  if (what.blocking && deadline.count() == 0) {
    // Made as blocking library calls (a group for calls that pair up): each runs on this
    // thread when the communicator is idle, or waits for the calls queued before it.
    auto work = makeWork(std::chrono::milliseconds(0));
    if (what.grouped) {
      openGroupWith(calls);
      check(what.name, lib_.GroupEnd());
    } else {
      calls();
    }
    for (auto& f : what.after) {
      f();
    }
    work->complete(nullptr);
    return work;
  }
  auto work = queuedWork();
  openGroupWith(calls);
  topocclWork_t handle = nullptr;
  check(what.name, lib_.GroupEndAsync(&handle));
  auto batch = std::make_shared<Batch>();
  batch->lib = &lib_;
  batch->handle = handle;
  batch->after = std::move(what.after);
  batch->keep = std::move(what.keep);
  batch->works.push_back(work);
  batch->onTimeout = abortOnTimeout();
  Batch::start(batch);
  return work;
}

void ProcessGroupTopoccl::startCoalescing() {
  std::lock_guard<std::mutex> lock(coalescingMutex_);
  TORCH_CHECK(!coalescing_, "topoccl: startCoalescing while coalescing");
  check("ncclGroupStart", lib_.GroupStart());
  coalescing_ = true;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopoccl::endCoalescing() {
  std::vector<Issue> issued;
  std::vector<c10::intrusive_ptr<TopocclWork>> works;
  {
    std::lock_guard<std::mutex> lock(coalescingMutex_);
    TORCH_CHECK(coalescing_, "topoccl: endCoalescing without startCoalescing");
    coalescing_ = false;
    issued = std::move(coalesced_);
    works = std::move(coalescedWorks_);
    coalesced_.clear();
    coalescedWorks_.clear();
  }
  std::vector<at::Tensor> outputs;
  for (auto& i : issued) {
    outputs.insert(outputs.end(), i.outputs.begin(), i.outputs.end());
  }
  auto work = c10::make_intrusive<TopocclWork>(
      rank_, c10d::OpType::COALESCED, "coalesced", outputs, ownDeadline(std::chrono::milliseconds(0)));
  work->setSequenceNumber(++seq_);
  topocclWork_t handle = nullptr;
  ncclResult_t r = lib_.GroupEndAsync(&handle);
  if (r != ncclSuccess) {
    auto error = callError("coalesced", r, lib_.describe("coalesced calls", r));
    for (auto& w : works) {
      w->complete(error);
    }
    std::rethrow_exception(error);
  }
  auto batch = std::make_shared<Batch>();
  batch->lib = &lib_;
  batch->handle = handle;
  for (auto& i : issued) {
    batch->after.insert(batch->after.end(), i.after.begin(), i.after.end());
    batch->keep.insert(batch->keep.end(), i.keep.begin(), i.keep.end());
  }
  batch->works = std::move(works);
  batch->works.push_back(work);
  batch->onTimeout = abortOnTimeout();
  Batch::start(batch);
  return work;
}

at::Tensor ProcessGroupTopoccl::gatheredForFold(const at::Tensor& input, Issue& what) {
  at::Tensor in = input.contiguous();
  std::vector<int64_t> shape{static_cast<int64_t>(size_)};
  shape.insert(shape.end(), input.sizes().begin(), input.sizes().end());
  at::Tensor gathered = at::empty(shape, input.options().memory_format(at::MemoryFormat::Contiguous));
  what.keep.push_back(in);
  what.keep.push_back(gathered);
  return gathered;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupTopoccl::barrier(const c10d::BarrierOptions& opts) {
  ncclComm_t comm = liveComm();
  at::Tensor token = at::zeros({1}, at::kInt);
  Issue what{c10d::OpType::BARRIER, "barrier", opts.timeout, {}, {token}, {}};
  what.blocking = !opts.asyncOp;
  return issue(std::move(what), [&] {
    check("ncclAllReduce", lib_.AllReduce(ptr(token), ptr(token), 1, ncclInt32, ncclSum, comm, nullptr));
  });
}

// Through the store, not the communicator: it must name the ranks that did not arrive even
// when the communicator is stuck behind them. Every rank but 0 says it arrived; rank 0 waits
// for them (all of them with `waitAllRanks`, else until the first missing one) and writes
// the outcome, which the others wait for. The messages are Gloo's, which torch's tests match.
void ProcessGroupTopoccl::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  const auto timeout = opts.timeout.count() >= 0 ? opts.timeout : timeout_;
  const std::string base = "topoccl/monitored_barrier/" + std::to_string(monitoredBarriers_.fetch_add(1)) + "/";
  const std::string outcome = base + "outcome";
  if (rank_ != 0) {
    store_->set(base + std::to_string(rank_), std::vector<uint8_t>{1});
    std::string failure;
    try {
      store_->wait({outcome}, timeout.count() > 0 ? timeout : std::chrono::milliseconds(1));
      std::vector<uint8_t> v = store_->get(outcome);
      if (v.size() != 1 || v[0] != 1) {
        failure = "rank 0 found ranks missing";
      }
    } catch (const std::exception& e) {
      failure = e.what();
    }
    if (!failure.empty()) {
      C10_THROW_ERROR(
          DistBackendError,
          c10::str(
              "Rank ", rank_, " successfully reached monitoredBarrier, but received errors while waiting for send/recv from rank 0: ",
              failure));
    }
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + timeout;
  std::vector<int> missing;
  for (int r = 1; r < size_; ++r) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    const std::string key = base + std::to_string(r);
    if (left.count() <= 0 && missing.empty() && !store_->check({key})) {
      store_->set(outcome, std::vector<uint8_t>{0});
      C10_THROW_ERROR(
          DistBackendError,
          c10::str("Rank 0 timed out in monitoredBarrier after ", timeout.count(), " ms (waiting for rank ", r, ")"));
    }
    bool arrived = false;
    try {
      if (left.count() > 0) {
        store_->wait({key}, left);
        arrived = true;
      } else {
        arrived = store_->check({key});
      }
    } catch (const std::exception&) {
      arrived = store_->check({key});
    }
    if (!arrived) {
      missing.push_back(r);
      if (!waitAllRanks) {
        break;
      }
    }
  }
  store_->set(outcome, std::vector<uint8_t>{static_cast<uint8_t>(missing.empty() ? 1 : 0)});
  for (int r = 1; r < size_; ++r) {
    store_->deleteKey(base + std::to_string(r));
  }
  if (missing.empty()) {
    return;
  }
  std::string ranks;
  for (size_t i = 0; i < missing.size(); ++i) {
    ranks += (i ? ", " : "") + std::to_string(missing[i]);
  }
  C10_THROW_ERROR(
      DistBackendError,
      c10::str(
          waitAllRanks ? "Ranks " : "Rank ", ranks, " failed to pass monitoredBarrier in ", timeout.count(),
          " ms (Timed out)"));
}

c10d::ErrorType ProcessGroupTopoccl::getError() {
  ncclComm_t comm = comm_->load();
  if (comm == nullptr) {
    return c10d::ErrorType::SUCCESS;
  }
  ncclResult_t e = ncclSuccess;
  if (lib_.CommGetAsyncError(comm, &e) != ncclSuccess) {
    return c10d::ErrorType::COMM_ERROR;
  }
  switch (e) {
    case ncclSuccess:
    case ncclInProgress:
      return c10d::ErrorType::SUCCESS;
    case ncclTimeout:
      return c10d::ErrorType::TIMEOUT;
    case ncclRemoteError:
      return c10d::ErrorType::REMOTE_ERROR;
    default:
      return c10d::ErrorType::COMM_ERROR;
  }
}

void ProcessGroupTopoccl::abort() {
  if (ncclComm_t comm = comm_->exchange(nullptr)) {
    lib_.CommAbort(comm);
  }
}

void ProcessGroupTopoccl::shutdown() {
  if (ncclComm_t comm = comm_->exchange(nullptr)) {
    check("ncclCommDestroy", lib_.CommDestroy(comm));
  }
}

} // namespace topoccl
