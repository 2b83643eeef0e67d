#include "library.h"

#include <dlfcn.h>

#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>

namespace topoccl {

const char* resultName(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
    case ncclTimeout: return "ncclTimeout";
    default: return "ncclResult_t(?)";
  }
}

std::string Library::describe(const char* what, ncclResult_t r) const {
  std::string msg = std::string(what) + ": " + resultName(r);
  if (const char* s = GetErrorString(r)) {
    msg += std::string(" (") + s + ")";
  }
  const char* last = GetLastError(nullptr);
  if (last != nullptr && *last != '\0') {
    msg += std::string(": ") + last;
  }
  return msg;
}

namespace {

template <typename F>
void bind(void* handle, const std::string& path, const char* name, F& slot) {
  void* sym = dlsym(handle, name);
  if (sym == nullptr) {
    throw std::runtime_error(
        "topoccl: " + path + " has no " + name +
        ": not topoccl's libnccl.so.2, or an older build (rebuild with `pip install ./python`)");
  }
  slot = reinterpret_cast<F>(sym);
}

std::unique_ptr<Library> open(const std::string& path) {
  // RTLD_LOCAL: our nccl* symbols never satisfy anyone else's references (torch's NCCL).
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    throw std::runtime_error(
        "topoccl: cannot load " + path + ": " + (why ? why : "dlopen failed") +
        " (reinstall with `pip install ./python`, or set TOPOCCL_NCCL_LIB)");
  }
  auto lib = std::make_unique<Library>();
  lib->path = path;
  decltype(&::ncclGetVersion) getVersion = nullptr;
  decltype(&::topocclExtVersion) extVersion = nullptr;
  bind(handle, path, "ncclGetVersion", getVersion);
  bind(handle, path, "topocclExtVersion", extVersion);
  bind(handle, path, "ncclGetUniqueId", lib->GetUniqueId);
  bind(handle, path, "ncclCommInitRank", lib->CommInitRank);
  bind(handle, path, "ncclCommDestroy", lib->CommDestroy);
  bind(handle, path, "ncclCommAbort", lib->CommAbort);
  bind(handle, path, "ncclCommGetAsyncError", lib->CommGetAsyncError);
  bind(handle, path, "ncclGetErrorString", lib->GetErrorString);
  bind(handle, path, "ncclGetLastError", lib->GetLastError);
  bind(handle, path, "ncclAllReduce", lib->AllReduce);
  bind(handle, path, "ncclBroadcast", lib->Broadcast);
  bind(handle, path, "ncclReduce", lib->Reduce);
  bind(handle, path, "ncclAllGather", lib->AllGather);
  bind(handle, path, "ncclReduceScatter", lib->ReduceScatter);
  bind(handle, path, "ncclAlltoAll", lib->AlltoAll);
  bind(handle, path, "ncclGather", lib->Gather);
  bind(handle, path, "ncclScatter", lib->Scatter);
  bind(handle, path, "ncclSend", lib->Send);
  bind(handle, path, "ncclRecv", lib->Recv);
  bind(handle, path, "ncclGroupStart", lib->GroupStart);
  bind(handle, path, "ncclGroupEnd", lib->GroupEnd);
  bind(handle, path, "ncclRedOpCreatePreMulSum", lib->RedOpCreatePreMulSum);
  bind(handle, path, "ncclRedOpDestroy", lib->RedOpDestroy);
  bind(handle, path, "topocclGroupEndAsync", lib->GroupEndAsync);
  bind(handle, path, "topocclWorkTest", lib->WorkTest);
  bind(handle, path, "topocclWorkWait", lib->WorkWait);
  bind(handle, path, "topocclWorkOnComplete", lib->WorkOnComplete);
  bind(handle, path, "topocclWorkFree", lib->WorkFree);
  bind(handle, path, "topocclSendTagged", lib->SendTagged);
  bind(handle, path, "topocclRecvTagged", lib->RecvTagged);
  int ext = 0;
  if (extVersion(&ext) != ncclSuccess || ext != TOPOCCL_EXT_VERSION) {
    throw std::runtime_error(
        "topoccl: " + path + " has extension version " + std::to_string(ext) + ", this backend needs " +
        std::to_string(TOPOCCL_EXT_VERSION) + " (rebuild both with `pip install ./python`)");
  }
  if (getVersion(&lib->version) != ncclSuccess) {
    throw std::runtime_error("topoccl: ncclGetVersion failed in " + path);
  }
  // The handle stays open for the process's life (the library's threads run its code).
  return lib;
}

} // namespace

const Library& load(const std::string& path) {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<Library>> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = loaded.find(path);
  if (it == loaded.end()) {
    it = loaded.emplace(path, open(path)).first;
  }
  return *it->second;
}

} // namespace topoccl
