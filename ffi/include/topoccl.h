/*
 * topoccl's extensions to NCCL's C API (nccl.h): asynchronous groups on host memory, and
 * tagged send/receive with receives from any source.
 *
 * NCCL orders calls by CUDA streams; a call on host memory without a stream has completed
 * when it returns (or when its group ends). These functions give host-memory callers the
 * work handles that PyTorch's backends and MPI-style programs need instead: the calls of a
 * group are queued on their communicators' progress threads, and a handle says when they have
 * run. The library exports these beside NCCL 2.30.7's functions (which stay exactly NCCL's);
 * a program using them must load topoccl's libnccl.so.2, not NVIDIA's.
 */
#ifndef TOPOCCL_H_
#define TOPOCCL_H_

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TOPOCCL_EXT_VERSION 2

/* The calls of one ended group (on any number of communicators). */
typedef struct topocclWork* topocclWork_t;

/* Told once the work has ended: its result and, on failure, the error's text (valid during the
 * call only). Runs on the thread that finished the work (a communicator's progress thread, or
 * a waiter that ran it), after that thread released the communicator, so it may make calls. */
typedef void (*topocclCompletion_t)(void* arg, ncclResult_t result, const char* message);

/* The extension's version (TOPOCCL_EXT_VERSION of the library). */
ncclResult_t topocclExtVersion(int* version);

/* Ends the outermost group as ncclGroupEnd does, but returns once its calls are queued (inits
 * and splits in it have run); *work completes when every call of the group has. Calls on
 * device memory or on a stream stay ordered by their streams (the work does not wait for
 * them). A group with no call gives a completed work. */
ncclResult_t topocclGroupEndAsync(topocclWork_t* work);

/* *done = 1 once every call of the work succeeded, 0 while one runs; the first error if one
 * failed (ncclGetLastError says why). */
ncclResult_t topocclWorkTest(topocclWork_t work, int* done);

/* Waits for the work: ncclSuccess once it succeeded, its error if it failed, ncclInProgress
 * if it is still running after timeoutMs (it goes on: wait again or abort the communicator).
 * A negative timeoutMs waits without a deadline of its own (the communicator's timeout,
 * TOPOCCL_TIMEOUT, still ends a stalled call), and runs queued calls on this thread while no
 * other thread does. */
ncclResult_t topocclWorkWait(topocclWork_t work, int64_t timeoutMs);

/* Calls fn(arg, result, message) once when the work ends: at once, on this thread, if it has.
 * One completion per work. */
ncclResult_t topocclWorkOnComplete(topocclWork_t work, topocclCompletion_t fn, void* arg);

/* Releases the handle. The calls run on (freeing does not cancel them); their buffers must
 * stay valid until they have. */
ncclResult_t topocclWorkFree(topocclWork_t work);

/* Tagged point-to-point calls (version 2). A tag (0..TOPOCCL_MAX_TAG) names a stream of
 * messages of its own between two ranks: a receive takes only a message of its tag, in the
 * order they were sent; messages of different tags match in any order (the later ones wait,
 * held by the receiver). Tag 0 is ncclSend's and ncclRecv's. They group, take streams and
 * run like ncclSend/ncclRecv (counts and datatypes must agree). */
#define TOPOCCL_MAX_TAG ((1 << 28) - 1)
/* The peer of a receive that takes the first message of its tag any other rank sends. */
#define TOPOCCL_ANY_SOURCE (-1)

ncclResult_t topocclSendTagged(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                               int tag, ncclComm_t comm, cudaStream_t stream);

/* peer: a rank, or TOPOCCL_ANY_SOURCE. Unless source is NULL, *source is set to the rank the
 * message came from once the receive has completed: source is host memory that must stay
 * valid until then (as the buffer). In one group, a receive from any source must not share its
 * tag with a receive from a given rank (which message each took would be a race). */
ncclResult_t topocclRecvTagged(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                               int tag, int* source, ncclComm_t comm, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* TOPOCCL_H_ */
