// topoccl's libnccl.so.2, opened privately: loaded by full path with RTLD_LOCAL and every
// function looked up on its handle, so NVIDIA's libnccl.so.2 (which a CUDA build of torch
// loads) and ours never mix. Nothing here includes torch.
#pragma once

#include <string>

#include "nccl.h"
#include "topoccl.h"

namespace topoccl {

struct Library {
  std::string path;
  int version = 0;

  decltype(&::ncclGetUniqueId) GetUniqueId = nullptr;
  decltype(&::ncclCommInitRank) CommInitRank = nullptr;
  decltype(&::ncclCommDestroy) CommDestroy = nullptr;
  decltype(&::ncclCommAbort) CommAbort = nullptr;
  decltype(&::ncclCommGetAsyncError) CommGetAsyncError = nullptr;
  decltype(&::ncclGetErrorString) GetErrorString = nullptr;
  decltype(&::ncclGetLastError) GetLastError = nullptr;
  decltype(&::ncclAllReduce) AllReduce = nullptr;
  decltype(&::ncclBroadcast) Broadcast = nullptr;
  decltype(&::ncclReduce) Reduce = nullptr;
  decltype(&::ncclAllGather) AllGather = nullptr;
  decltype(&::ncclReduceScatter) ReduceScatter = nullptr;
  decltype(&::ncclAlltoAll) AlltoAll = nullptr;
  decltype(&::ncclGather) Gather = nullptr;
  decltype(&::ncclScatter) Scatter = nullptr;
  decltype(&::ncclSend) Send = nullptr;
  decltype(&::ncclRecv) Recv = nullptr;
  decltype(&::ncclGroupStart) GroupStart = nullptr;
  decltype(&::ncclGroupEnd) GroupEnd = nullptr;
  decltype(&::ncclRedOpCreatePreMulSum) RedOpCreatePreMulSum = nullptr;
  decltype(&::ncclRedOpDestroy) RedOpDestroy = nullptr;
  decltype(&::topocclGroupEndAsync) GroupEndAsync = nullptr;
  decltype(&::topocclWorkTest) WorkTest = nullptr;
  decltype(&::topocclWorkWait) WorkWait = nullptr;
  decltype(&::topocclWorkOnComplete) WorkOnComplete = nullptr;
  decltype(&::topocclWorkFree) WorkFree = nullptr;
  decltype(&::topocclSendTagged) SendTagged = nullptr;
  decltype(&::topocclRecvTagged) RecvTagged = nullptr;

  // "<what>: <result name> (<NCCL's text>): <this thread's last error>", for a failed call.
  std::string describe(const char* what, ncclResult_t result) const;
};

// The library at `path`, opened once per process (later calls with the same path return the
// same one). Throws std::runtime_error saying what is wrong: no such file, not topoccl's
// library (a function or the extension missing), an extension of another version.
const Library& load(const std::string& path);

// ncclResult_t's enumerator name ("ncclTimeout").
const char* resultName(ncclResult_t result);

} // namespace topoccl
