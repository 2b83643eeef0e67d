/* NCCL's GPU data path through nccl.h, on the CUDA driver API directly (no cuda.h: the few
 * declarations it needs are below): ranks, processes forked from this program or threads of
 * it, each with its own context (or the primary one) and stream, run every collective x
 * datatype x operator (PreMulSum with a host-immediate and a device-resident scalar) on device
 * buffers, in place and out of place; inputs are filled with cuMemcpyHtoD_v2 (on the rank's
 * stream where ranks share a context: see put), outputs poisoned on the stream right before
 * the call, and read back straight after the call as users read results, with no
 * synchronisation first: cuMemcpyDtoH_v2 into malloc'd memory (cudaMemcpy into a vector: the
 * legacy stream's copy waits for the rank's blocking stream), or, where ranks share a context,
 * cuMemcpyDtoHAsync_v2 on the rank's own stream into malloc'd memory (which returns once the
 * copy is done; the legacy stream would also wait for the other ranks' streams). The call must
 * start after the stream's earlier work and finish before its later work. Every element is checked. Also: a group of calls on one stream, chains of queued
 * calls read back once, DistributedDataParallel's steps as PyTorch's NCCL process group queues
 * them (ddp_steps), collectives captured into a CUDA graph and replayed (cuda_graph), ncclCommInitAll with every rank on device 0 (one thread, one stream
 * each, in a group), ncclCommCuDevice, ncclMemAlloc's device memory, and a stream of another
 * context refused.
 *
 * usage: device NRANKS [primary|created] [own|legacy] [full|small] [all|no-device-scalar|device-scalar]
 *               [processes|threads]
 *   primary: the device's primary context made current; created: a cuCtxCreate_v2 context
 *   own: a cuStreamCreate stream; legacy: the NULL (legacy default) stream
 *   full: all 12 types; small: four of them (int8, int32, float32, fp8 e5m2)
 *   all: every operator; no-device-scalar: without PreMulSum's ncclScalarDevice; device-scalar:
 *   the reductions with that operator only (and nothing else)
 *   processes: each rank a process forked before cuInit; threads: each rank a thread of this
 *   process, after one cuInit here, making its context current itself, its communicator from
 *   ncclCommInitRank with a unique id made here (threads on the primary context cannot use its
 *   one legacy stream: every rank's calls would queue behind the others', a deadlock)
 * Prints "device: N ranks as processes|threads, ...: C calls, E elements checked, W wrong"
 * (totals over the ranks) and the same for ncclCommInitAll; exits 1 unless every rank
 * succeeded with nothing wrong; a failing rank's messages start with "rank R: ".
 * DEVICE_TEST_TIMEOUT (seconds, default 120) bounds each process; DEVICE_TEST_VERBOSE=1 prints
 * each call.
 *
 * Ranks sharing a context (threads on the primary one) must not synchronise the whole context
 * while another rank's collective may wait for them: cuMemFree_v2 and cuCtxSynchronize wait for
 * every stream of the context, and a synchronous copy goes through the legacy stream, which
 * waits for the context's blocking streams. So every rank allocates all its memory before
 * ncclCommInitRank (which no rank leaves before all joined it), frees it after
 * ncclCommFinalize, and synchronises only its own stream. */
static const char* who(void);
#define TEST_WHO who()
#include "ranks.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>

/* ---- The CUDA driver API, as cuda.h declares it (the subset used here). ---- */
typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st* CUcontext;
typedef struct CUstream_st* CUstream;
typedef unsigned long long CUdeviceptr;

CUresult cuInit(unsigned int flags);
CUresult cuDeviceGet(CUdevice* device, int ordinal);
CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev);
CUresult cuCtxDestroy_v2(CUcontext ctx);
CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount);
CUresult cuMemcpyDtoH_v2(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount);
CUresult cuMemcpyDtoHAsync_v2(void* dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void* srcHost, size_t ByteCount, CUstream hStream);
CUresult cuStreamCreate(CUstream* phStream, unsigned int Flags);
CUresult cuStreamSynchronize(CUstream hStream);
CUresult cuStreamDestroy_v2(CUstream hStream);
CUresult cuGetErrorName(CUresult error, const char** pStr);
typedef struct CUevent_st* CUevent;
CUresult cuStreamCreateWithPriority(CUstream* phStream, unsigned int flags, int priority);
CUresult cuEventCreate(CUevent* phEvent, unsigned int Flags);
CUresult cuEventRecord(CUevent hEvent, CUstream hStream);
CUresult cuEventQuery(CUevent hEvent);
CUresult cuEventDestroy_v2(CUevent hEvent);
CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags);
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream);
CUresult cuStreamBeginCapture_v2(CUstream hStream, int mode);
CUresult cuStreamEndCapture(CUstream hStream, void** phGraph);
CUresult cuGraphInstantiateWithFlags(void** phGraphExec, void* hGraph, unsigned long long flags);
CUresult cuGraphLaunch(void* hGraphExec, CUstream hStream);
CUresult cuGraphExecDestroy(void* hGraphExec);
CUresult cuGraphDestroy(void* hGraph);
#define CU_STREAM_CAPTURE_MODE_GLOBAL 0
#define CU_STREAM_NON_BLOCKING 0x1
#define CU_EVENT_DISABLE_TIMING 0x2
#define CUDA_ERROR_NOT_READY 600

#define CU(call)                                                                    \
  do {                                                                              \
    CUresult e_ = (call);                                                           \
    if (e_ != 0) {                                                                  \
      const char* n_ = "unknown";                                                   \
      cuGetErrorName(e_, &n_);                                                      \
      FAIL("%s -> CUDA error %d (%s)", #call, (int)e_, n_);                         \
    }                                                                               \
  } while (0)

/* nccl.h's cudaStream_t is the driver's CUstream (both `struct CUstream_st*`). */
#define ST(s) ((cudaStream_t)(s))

/* ---- What this run does (set in main, before the ranks start). ---- */
static int use_created_ctx; /* a cuCtxCreate_v2 context, else the primary one */
static int use_legacy;      /* the NULL stream, else a cuStreamCreate one */
static int use_threads;     /* ranks are threads of this process, else forked processes */
static int shared_ctx;      /* the ranks share one context: threads on the primary context */
static int small_matrix;
static int ops_from, ops_to; /* the operators of the matrix: [from, to) of OP_NAME */
static int only_reductions;
static int verbose;
static unsigned timeout_s = 120;

/* Counts, one slot per rank (and one for ncclCommInitAll's), in memory shared across the fork;
 * `me` is the calling rank's (per thread). */
struct tally {
  long calls, checked, wrong, printed;
};
static struct tally* tallies;
static _Thread_local struct tally* me;
static _Thread_local int my_rank = -1; /* -1: not a rank (main, ncclCommInitAll) */

/* What every error message starts with: the failing rank. */
static const char* who(void) {
  static _Thread_local char name[24];
  if (my_rank < 0) return "";
  snprintf(name, sizeof name, "rank %d: ", my_rank);
  return name;
}

#define COUNT 1027           /* elements per call of the matrix: odd, not a multiple of anything */
#define LARGE 262147         /* float32 elements of the large calls (several slices per chunk) */
#define POISON 0xA5          /* what outputs hold before the call writes them */
#define GROUP_BUFFERS 5      /* calls of group() with buffers of their own */

/* ---- One rank's setup. ---- */
struct rank_env {
  int rank, n;
  ncclComm_t comm;
  CUdevice dev;
  CUcontext ctx;
  CUstream s; /* NULL: the legacy default stream */
  CUstream ddp_stream; /* ddp_steps' process-group stream: non-blocking, low priority */
  CUdeviceptr send, recv, scalar;
  size_t cap;        /* bytes of send, recv and the host buffers */
  char *host, *got, *poison;
  double* want;      /* expected values: cap of them (elements are a byte at least) */
  CUdeviceptr group_in[GROUP_BUFFERS], group_out[GROUP_BUFFERS]; /* group's, a pair per call */
  void *nccl_a, *nccl_b; /* ncclMemAlloc's, for mem_alloc */
};

/* The host buffers hold e->cap bytes: every use is checked. */
static void fits(struct rank_env* e, size_t bytes) {
  if (bytes > e->cap) FAIL("test bug: %zu bytes do not fit the %zu-byte host buffers", bytes, e->cap);
}

/* Copies `bytes` from src (pageable host memory) to dst, before the rank's next call: with the
 * synchronous cuMemcpyHtoD_v2, on the legacy stream, which the rank's stream (blocking or the
 * legacy one itself) waits for. Ranks sharing a context copy on their own stream instead: the
 * legacy stream waits for every blocking stream of the context, other ranks' calls that wait
 * for this rank among them. Either way the source is read at once (pageable memory is staged). */
static void copy_in(struct rank_env* e, CUdeviceptr dst, const void* src, size_t bytes) {
  if (shared_ctx) CU(cuMemcpyHtoDAsync_v2(dst, src, bytes, e->s));
  else CU(cuMemcpyHtoD_v2(dst, src, bytes));
}

/* Copies `bytes` from src (pageable host memory) to dst on the rank's stream (the source is read
 * at once: pageable memory is staged). */
static void copy_in_async(struct rank_env* e, CUdeviceptr dst, const void* src, size_t bytes) {
  CU(cuMemcpyHtoDAsync_v2(dst, src, bytes, e->s));
}

static void put(struct rank_env* e, CUdeviceptr dst, size_t bytes) {
  fits(e, bytes);
  copy_in(e, dst, e->host, bytes);
}

/* Fills `bytes` at dst with POISON, on the stream (queued before the call that must write it). */
static void poison_async(struct rank_env* e, CUdeviceptr dst, size_t bytes) {
  fits(e, bytes);
  CU(cuMemcpyHtoDAsync_v2(dst, e->poison, bytes, e->s));
}

/* The only synchronisation: a copy into pageable memory, right after the call. */
static void fetch(struct rank_env* e, CUdeviceptr src, size_t bytes) {
  fits(e, bytes);
  memset(e->got, 0x5A, bytes);
  if (shared_ctx || use_legacy) CU(cuMemcpyDtoHAsync_v2(e->got, src, bytes, e->s));
  else CU(cuMemcpyDtoH_v2(e->got, src, bytes));
}

static void call_done(const char* what) {
  me->calls++;
  if (verbose) fprintf(stderr, "%scall %ld: %s\n", who(), me->calls, what);
}

/* Compares count elements of type t at got with want; counts and reports what is wrong. */
static void expect(const char* what, ncclDataType_t t, const void* got, const double* want, size_t count) {
  long wrong = 0;
  for (size_t i = 0; i < count; i++) {
    double g = load(t, got, i);
    if (g != want[i]) {
      if (wrong < 3 && me->printed < 40) {
        fprintf(stderr, "%sWRONG %s (type %d): element %zu of %zu is %g, expected %g\n", who(), what, (int)t, i,
                count, g, want[i]);
        me->printed++;
      }
      wrong++;
    }
  }
  me->checked += (long)count;
  me->wrong += wrong;
}

/* ---- Values exact in every type, fp8 included. ---- */
enum { SUM, PROD, MAX, MIN, AVG, PMS_HOST, PMS_DEVICE, NUM_OPS };
static const char* OP_NAME[] = {"sum", "prod", "max", "min", "avg", "premulsum(host)", "premulsum(device)"};
static const char* TYPE_NAME[] = {"int8",    "uint8",   "int32",    "uint32",   "int64",    "uint64",
                                  "float16", "float32", "float64", "bfloat16", "fp8e4m3", "fp8e5m2"};

/* A reduction's input at element i of rank r: 1 or 2 from bit r of i (the results vary with i,
 * so a misplaced block shows; fp8 holds every partial sum and product exactly); for avg,
 * per-rank offsets that cancel (equal values for fp8). */
static double input(ncclDataType_t t, int o, int r, int n, size_t i) {
  if (o != AVG) return 1 + (double)((i >> r) & 1);
  if (is_fp8(t)) return 1 + (double)(i % 2);
  double offset = r < n - 1 ? r : -(double)(n - 1) * (n - 2) / 2;
  return 8 + (double)(i % 3) + offset;
}

/* PreMulSum scalars: the host-immediate one fixed at creation, the device one rewritten on the
 * stream before each call (k counts those calls); per rank, apart from fp8, whose sums must
 * stay even to be exact. */
static double host_scalar(ncclDataType_t t, int r) { return is_fp8(t) ? 2 : 2 + (r % 2); }
static double device_scalar(ncclDataType_t t, int r, long k) {
  return is_fp8(t) ? 1 + (double)(k % 2) : 1 + (double)((r + k) % 3);
}

static double reduced(ncclDataType_t t, int o, int n, size_t i, long k) {
  double acc = 0;
  for (int r = 0; r < n; r++) {
    double v = input(t, o, r, n, i);
    switch (o) {
      case SUM: case AVG: acc += v; break;
      case PROD: acc = r == 0 ? v : acc * v; break;
      case MAX: acc = r == 0 || v > acc ? v : acc; break;
      case MIN: acc = r == 0 || v < acc ? v : acc; break;
      case PMS_HOST: acc += host_scalar(t, r) * v; break;
      default: acc += device_scalar(t, r, k) * v; break;
    }
  }
  return o == AVG ? acc / n : acc;
}

/* Data movement: 1..8 (exact in fp8), different per rank. */
static double moved(int r, size_t i) { return 1 + (double)((3 * (size_t)r + i) % 8); }

/* ---- The reductions. ---- */
struct op_set {
  ncclRedOp_t op[NUM_OPS];
  long k; /* device-scalar calls so far */
};

/* Before a call with the device-scalar operator: its scalar, written on the stream. */
static void prepare_op(struct rank_env* e, ncclDataType_t t, int o, struct op_set* ops) {
  if (o != PMS_DEVICE) return;
  ops->k++;
  char v[8];
  store(t, v, 0, device_scalar(t, e->rank, ops->k));
  CU(cuMemcpyHtoDAsync_v2(e->scalar, v, type_size(t), e->s));
}

static void all_reduce(struct rank_env* e, ncclDataType_t t, int o, struct op_set* ops, size_t count, int inplace) {
  size_t es = type_size(t), bytes = count * es;
  char what[96];
  snprintf(what, sizeof what, "%sall-reduce %s %s", inplace ? "in-place " : "", OP_NAME[o], TYPE_NAME[t]);
  for (size_t i = 0; i < count; i++) store(t, e->host, i, input(t, o, e->rank, e->n, i));
  CUdeviceptr dst = inplace ? e->recv : e->send;
  put(e, dst, bytes);
  if (!inplace) poison_async(e, e->recv, bytes);
  prepare_op(e, t, o, ops);
  CHECK(ncclAllReduce((const void*)dst, (void*)e->recv, count, t, ops->op[o], e->comm, ST(e->s)));
  call_done(what);
  for (size_t i = 0; i < count; i++) e->want[i] = reduced(t, o, e->n, i, ops->k);
  fetch(e, e->recv, bytes);
  expect(what, t, e->got, e->want, count);
}

static void reduce_scatter(struct rank_env* e, ncclDataType_t t, int o, struct op_set* ops, size_t count,
                           int inplace) {
  size_t es = type_size(t), n = (size_t)e->n, mine = (size_t)e->rank * count * es;
  char what[96];
  snprintf(what, sizeof what, "%sreduce-scatter %s %s", inplace ? "in-place " : "", OP_NAME[o], TYPE_NAME[t]);
  for (size_t i = 0; i < count * n; i++) store(t, e->host, i, input(t, o, e->rank, e->n, i));
  CUdeviceptr src = inplace ? e->recv : e->send, dst = inplace ? e->recv + mine : e->recv;
  put(e, src, count * n * es);
  if (!inplace) poison_async(e, e->recv, count * es);
  prepare_op(e, t, o, ops);
  CHECK(ncclReduceScatter((const void*)src, (void*)dst, count, t, ops->op[o], e->comm, ST(e->s)));
  call_done(what);
  for (size_t i = 0; i < count; i++) e->want[i] = reduced(t, o, e->n, (size_t)e->rank * count + i, ops->k);
  fetch(e, dst, count * es);
  expect(what, t, e->got, e->want, count);
}

static void reduce(struct rank_env* e, ncclDataType_t t, int o, struct op_set* ops, size_t count, int inplace,
                   int root) {
  size_t es = type_size(t), bytes = count * es;
  char what[96];
  snprintf(what, sizeof what, "%sreduce %s %s root %d", inplace ? "in-place " : "", OP_NAME[o], TYPE_NAME[t], root);
  for (size_t i = 0; i < count; i++) store(t, e->host, i, input(t, o, e->rank, e->n, i));
  CUdeviceptr src = inplace ? e->recv : e->send;
  put(e, src, bytes);
  if (!inplace && e->rank == root) poison_async(e, e->recv, bytes);
  prepare_op(e, t, o, ops);
  /* Out of place, recvbuff is used on the root only: NULL elsewhere. */
  void* dst = inplace ? (void*)e->recv : e->rank == root ? (void*)e->recv : NULL;
  CHECK(ncclReduce((const void*)src, dst, count, t, ops->op[o], root, e->comm, ST(e->s)));
  call_done(what);
  if (e->rank == root) {
    for (size_t i = 0; i < count; i++) e->want[i] = reduced(t, o, e->n, i, ops->k);
  } else {
    /* Elsewhere the input is left as it was. */
    for (size_t i = 0; i < count; i++) e->want[i] = input(t, o, e->rank, e->n, i);
  }
  fetch(e, e->rank == root ? e->recv : src, bytes);
  expect(what, t, e->got, e->want, count);
}

/* ---- Data movement. ---- */
static void all_gather(struct rank_env* e, ncclDataType_t t, size_t count, int inplace) {
  size_t es = type_size(t), n = (size_t)e->n, mine = (size_t)e->rank * count * es;
  const char* what = inplace ? "in-place all-gather" : "all-gather";
  CUdeviceptr src;
  if (inplace) {
    memset(e->host, POISON, count * n * es);
    for (size_t i = 0; i < count; i++) store(t, e->host + mine, i, moved(e->rank, i));
    put(e, e->recv, count * n * es);
    src = e->recv + mine;
  } else {
    for (size_t i = 0; i < count; i++) store(t, e->host, i, moved(e->rank, i));
    put(e, e->send, count * es);
    poison_async(e, e->recv, count * n * es);
    src = e->send;
  }
  CHECK(ncclAllGather((const void*)src, (void*)e->recv, count, t, e->comm, ST(e->s)));
  call_done(what);
  for (size_t i = 0; i < count * n; i++) e->want[i] = moved((int)(i / count), i % count);
  fetch(e, e->recv, count * n * es);
  expect(what, t, e->got, e->want, count * n);
}

/* mode 0: out of place; 1: ncclBroadcast in place; 2: ncclBcast. */
static void broadcast(struct rank_env* e, ncclDataType_t t, size_t count, int mode, int root) {
  size_t es = type_size(t), bytes = count * es;
  const char* what = mode == 0 ? "broadcast" : mode == 1 ? "in-place broadcast" : "bcast";
  if (mode == 0 || e->rank == root) {
    for (size_t i = 0; i < count; i++) store(t, e->host, i, e->rank == root ? moved(e->rank, i) : 0);
  } else {
    memset(e->host, POISON, bytes);
  }
  if (mode == 0) {
    put(e, e->send, bytes);
    poison_async(e, e->recv, bytes);
    CHECK(ncclBroadcast((const void*)e->send, (void*)e->recv, count, t, root, e->comm, ST(e->s)));
  } else {
    put(e, e->recv, bytes);
    if (mode == 1) CHECK(ncclBroadcast((const void*)e->recv, (void*)e->recv, count, t, root, e->comm, ST(e->s)));
    else CHECK(ncclBcast((void*)e->recv, count, t, root, e->comm, ST(e->s)));
  }
  call_done(what);
  for (size_t i = 0; i < count; i++) e->want[i] = moved(root, i);
  fetch(e, e->recv, bytes);
  expect(what, t, e->got, e->want, count);
}

static void all_to_all(struct rank_env* e, ncclDataType_t t, size_t count) {
  size_t es = type_size(t), n = (size_t)e->n;
  /* Block j goes to rank j: element i of it is moved(rank, j * count + i). */
  for (size_t i = 0; i < count * n; i++) store(t, e->host, i, moved(e->rank, i));
  put(e, e->send, count * n * es);
  poison_async(e, e->recv, count * n * es);
  CHECK(ncclAlltoAll((const void*)e->send, (void*)e->recv, count, t, e->comm, ST(e->s)));
  call_done("all-to-all");
  for (size_t i = 0; i < count * n; i++) e->want[i] = moved((int)(i / count), (size_t)e->rank * count + i % count);
  fetch(e, e->recv, count * n * es);
  expect("all-to-all", t, e->got, e->want, count * n);
}

static void gather(struct rank_env* e, ncclDataType_t t, size_t count, int inplace, int root) {
  size_t es = type_size(t), n = (size_t)e->n, at = (size_t)root * count * es;
  const char* what = inplace ? "in-place gather" : "gather";
  CUdeviceptr src = e->send;
  if (inplace && e->rank == root) {
    memset(e->host, POISON, count * n * es);
    for (size_t i = 0; i < count; i++) store(t, e->host + at, i, moved(root, i));
    put(e, e->recv, count * n * es);
    src = e->recv + at;
  } else {
    for (size_t i = 0; i < count; i++) store(t, e->host, i, moved(e->rank, i));
    put(e, e->send, count * es);
    if (e->rank == root) poison_async(e, e->recv, count * n * es);
  }
  CHECK(ncclGather((const void*)src, (void*)e->recv, count, t, root, e->comm, ST(e->s)));
  call_done(what);
  if (e->rank == root) {
    for (size_t i = 0; i < count * n; i++) e->want[i] = moved((int)(i / count), i % count);
    fetch(e, e->recv, count * n * es);
    expect(what, t, e->got, e->want, count * n);
  } else {
    for (size_t i = 0; i < count; i++) e->want[i] = moved(e->rank, i);
    fetch(e, e->send, count * es); /* the input, unchanged */
    expect(what, t, e->got, e->want, count);
  }
}

static void scatter(struct rank_env* e, ncclDataType_t t, size_t count, int inplace, int root) {
  size_t es = type_size(t), n = (size_t)e->n, at = (size_t)root * count * es;
  const char* what = inplace ? "in-place scatter" : "scatter";
  /* The root's block i, element j: moved(root, i * count + j). */
  if (e->rank == root) {
    for (size_t i = 0; i < count * n; i++) store(t, e->host, i, moved(root, i));
    put(e, e->send, count * n * es);
  }
  CUdeviceptr dst = e->recv;
  if (inplace && e->rank == root) dst = e->send + at;
  else poison_async(e, e->recv, count * es);
  CHECK(ncclScatter((const void*)e->send, (void*)dst, count, t, root, e->comm, ST(e->s)));
  call_done(what);
  for (size_t i = 0; i < count; i++) e->want[i] = moved(root, (size_t)e->rank * count + i);
  fetch(e, dst, count * es);
  expect(what, t, e->got, e->want, count);
}

/* A ring in a group: send to the next rank, receive from the previous one. */
static void ring(struct rank_env* e, ncclDataType_t t, size_t count) {
  size_t es = type_size(t);
  int next = (e->rank + 1) % e->n, prev = (e->rank + e->n - 1) % e->n;
  for (size_t i = 0; i < count; i++) store(t, e->host, i, moved(e->rank, i));
  put(e, e->send, count * es);
  poison_async(e, e->recv, count * es);
  CHECK(ncclGroupStart());
  CHECK(ncclSend((const void*)e->send, count, t, next, e->comm, ST(e->s)));
  CHECK(ncclRecv((void*)e->recv, count, t, prev, e->comm, ST(e->s)));
  CHECK(ncclGroupEnd());
  call_done("send");
  call_done("recv");
  for (size_t i = 0; i < count; i++) e->want[i] = moved(prev, i);
  fetch(e, e->recv, count * es);
  expect("send/recv ring", t, e->got, e->want, count);
}

static void matrix(struct rank_env* e) {
  static const ncclDataType_t SMALL[] = {ncclInt8, ncclInt32, ncclFloat32, ncclFloat8e5m2};
  int ntypes = small_matrix ? 4 : NUM_TYPES;
  int call = 0;
  for (int ti = 0; ti < ntypes; ti++) {
    ncclDataType_t t = small_matrix ? SMALL[ti] : ALL_TYPES[ti];
    struct op_set ops = {{ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg}, 0};
    char v[8];
    store(t, v, 0, host_scalar(t, e->rank));
    CHECK(ncclRedOpCreatePreMulSum(&ops.op[PMS_HOST], v, t, ncclScalarHostImmediate, e->comm));
    memset(v, 0x7f, sizeof v); /* copied at creation: no effect */
    store(t, v, 0, device_scalar(t, e->rank, 0));
    copy_in(e, e->scalar, v, type_size(t));
    CHECK(ncclRedOpCreatePreMulSum(&ops.op[PMS_DEVICE], (void*)e->scalar, t, ncclScalarDevice, e->comm));
    for (int o = ops_from; o < ops_to; o++) {
      for (int inplace = 0; inplace < 2; inplace++) {
        all_reduce(e, t, o, &ops, COUNT, inplace);
        reduce_scatter(e, t, o, &ops, COUNT, inplace);
        reduce(e, t, o, &ops, COUNT, inplace, call++ % e->n);
      }
    }
    CHECK(ncclRedOpDestroy(ops.op[PMS_HOST], e->comm));
    CHECK(ncclRedOpDestroy(ops.op[PMS_DEVICE], e->comm));
    if (only_reductions) continue;
    for (int inplace = 0; inplace < 2; inplace++) {
      all_gather(e, t, COUNT, inplace);
      gather(e, t, COUNT, inplace, call++ % e->n);
      scatter(e, t, COUNT, inplace, call++ % e->n);
    }
    for (int mode = 0; mode < 3; mode++) broadcast(e, t, COUNT, mode, call++ % e->n);
    all_to_all(e, t, COUNT);
    ring(e, t, COUNT);
  }
  if (only_reductions) return;
  /* Single elements, and large calls: several slices per chunk. */
  struct op_set ops = {{ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg}, 0};
  all_reduce(e, ncclFloat64, SUM, &ops, 1, 0);
  reduce_scatter(e, ncclInt8, MAX, &ops, 1, 1);
  all_gather(e, ncclFloat8e4m3, 1, 0);
  all_reduce(e, ncclFloat32, SUM, &ops, LARGE, 0);
  all_reduce(e, ncclBfloat16, MIN, &ops, LARGE, 1);
  reduce_scatter(e, ncclFloat32, SUM, &ops, LARGE / e->n, 0);
  all_gather(e, ncclFloat32, LARGE / e->n, 1);
  all_to_all(e, ncclInt64, LARGE / e->n / 2);
}

/* Calls queued one after another on the stream, read back once: each must start after the
 * previous one. Four in-place all-reduces (each multiplies by n after the first), an
 * all-gather of the result, a broadcast over it from the last rank. */
static void chain(struct rank_env* e, ncclDataType_t t) {
  size_t count = COUNT, es = type_size(t), n = (size_t)e->n;
  for (size_t i = 0; i < count; i++) store(t, e->host, i, (double)(e->rank + 1 + (i % 2)));
  put(e, e->send, count * es);
  poison_async(e, e->recv, count * n * es);
  for (int k = 0; k < 4; k++) {
    CHECK(ncclAllReduce((const void*)e->send, (void*)e->send, count, t, ncclSum, e->comm, ST(e->s)));
    call_done("chained all-reduce");
  }
  CHECK(ncclAllGather((const void*)e->send, (void*)e->recv, count, t, e->comm, ST(e->s)));
  call_done("chained all-gather");
  CHECK(ncclBroadcast((const void*)e->recv, (void*)e->recv, count * n, t, e->n - 1, e->comm, ST(e->s)));
  call_done("chained broadcast");
  for (size_t i = 0; i < count * n; i++) {
    double first = (double)n * (n + 1) / 2 + (double)n * ((i % count) % 2);
    e->want[i] = first * n * n * n;
  }
  fetch(e, e->recv, count * n * es);
  expect("chain of queued calls", t, e->got, e->want, count * n);
}

/* A group of calls on one stream: collectives and a ring, each on its own buffers. */
static void group(struct rank_env* e) {
  size_t count = COUNT, n = (size_t)e->n, es = 4;
  ncclDataType_t t = ncclFloat32;
  enum { AR, AG, BC, RS, P2P, NB };
  _Static_assert(NB == GROUP_BUFFERS, "a pair of buffers per call");
  const CUdeviceptr *in = e->group_in, *out = e->group_out; /* count * n * es bytes each */
  for (int b = 0; b < NB; b++) {
    for (size_t i = 0; i < count * n; i++) store(t, e->host, i, b == AR || b == RS ? input(t, SUM, e->rank, e->n, i)
                                                                                  : moved(e->rank, i));
    put(e, in[b], count * n * es);
    poison_async(e, out[b], count * n * es);
  }
  int root = 1 % e->n, next = (e->rank + 1) % e->n, prev = (e->rank + e->n - 1) % e->n;
  CHECK(ncclGroupStart());
  CHECK(ncclAllReduce((const void*)in[AR], (void*)out[AR], count, t, ncclSum, e->comm, ST(e->s)));
  CHECK(ncclAllGather((const void*)in[AG], (void*)out[AG], count, t, e->comm, ST(e->s)));
  CHECK(ncclBroadcast((const void*)in[BC], (void*)out[BC], count, t, root, e->comm, ST(e->s)));
  CHECK(ncclReduceScatter((const void*)in[RS], (void*)out[RS], count, t, ncclSum, e->comm, ST(e->s)));
  CHECK(ncclSend((const void*)in[P2P], count, t, next, e->comm, ST(e->s)));
  CHECK(ncclRecv((void*)out[P2P], count, t, prev, e->comm, ST(e->s)));
  CHECK(ncclGroupEnd());
  for (int c = 0; c < 6; c++) call_done("grouped call");
  for (int b = 0; b < NB; b++) {
    size_t m = b == AG ? count * n : count;
    for (size_t i = 0; i < m; i++) {
      switch (b) {
        case AR: e->want[i] = reduced(t, SUM, e->n, i, 0); break;
        case AG: e->want[i] = moved((int)(i / count), i % count); break;
        case BC: e->want[i] = moved(root, i); break;
        case RS: e->want[i] = reduced(t, SUM, e->n, (size_t)e->rank * count + i, 0); break;
        default: e->want[i] = moved(prev, i); break;
      }
    }
    fetch(e, out[b], m * es);
    static const char* names[] = {"grouped all-reduce", "grouped all-gather", "grouped broadcast",
                                  "grouped reduce-scatter", "grouped send/recv"};
    expect(names[b], t, e->got, e->want, m);
  }
}

/* PyTorch's DistributedDataParallel as its NCCL process group drives the GPU, step by step:
 * the backward pass writes the gradient buckets on the compute stream (here e->s); an event
 * recorded there is waited for by the process group's own stream (a non-blocking stream of
 * c10's pool, made once, at low priority), which all-reduces each bucket (views of one flat
 * gradient buffer: a small, a middle and a large one, by Sum or Avg); an event recorded after
 * the last call is waited for by the compute stream, whose optimiser step copies the reduced
 * gradients into the parameters; then `float(loss)`: a pageable read of the parameters,
 * straight away, with no synchronisation. Meanwhile a watchdog thread (ProcessGroupNCCL's)
 * queries the step's end event over and over, as PyTorch's does. */
#define DDP_STEPS 6
struct watchdog {
  CUevent end;
  volatile int stop;
  long queries;
};

static void* watchdog_main(void* arg) {
  struct watchdog* w = arg;
  while (!w->stop) {
    CUresult r = cuEventQuery(w->end);
    if (r != 0 && r != CUDA_ERROR_NOT_READY) FAIL("watchdog: cuEventQuery -> %d", (int)r);
    w->queries++;
    usleep(200);
  }
  return NULL;
}

static void ddp_steps(struct rank_env* e) {
  static const size_t bucket[3] = {COUNT, 65539, LARGE - COUNT - 65539};
  static const ncclRedOp_t bucket_op[3] = {ncclSum, ncclAvg, ncclSum};
  size_t total = bucket[0] + bucket[1] + bucket[2], es = 4, n = (size_t)e->n;
  ncclDataType_t t = ncclFloat32;
  fits(e, total * es);
  CUevent grads_ready, reduced;
  struct watchdog w = {.stop = 0, .queries = 0};
  CU(cuEventCreate(&grads_ready, CU_EVENT_DISABLE_TIMING));
  CU(cuEventCreate(&reduced, CU_EVENT_DISABLE_TIMING));
  CU(cuEventCreate(&w.end, CU_EVENT_DISABLE_TIMING));
  pthread_t dog;
  if (pthread_create(&dog, NULL, watchdog_main, &w) != 0) FAIL("pthread_create (watchdog)");
  CUdeviceptr grads = e->send, params = e->recv;
  for (int step = 0; step < DDP_STEPS; step++) {
    for (size_t i = 0; i < total; i++) store(t, e->host, i, (double)(e->rank + 1) + (double)((i + (size_t)step) % 4));
    copy_in_async(e, grads, e->host, total * es); /* the backward pass */
    poison_async(e, params, total * es);
    CU(cuEventRecord(grads_ready, e->s));
    CU(cuStreamWaitEvent(e->ddp_stream, grads_ready, 0));
    size_t at = 0;
    for (int b = 0; b < 3; b++) {
      CHECK(ncclAllReduce((const void*)(grads + at * es), (void*)(grads + at * es), bucket[b], t, bucket_op[b],
                          e->comm, ST(e->ddp_stream)));
      call_done("DDP bucket all-reduce");
      at += bucket[b];
    }
    CU(cuEventRecord(reduced, e->ddp_stream));
    CU(cuEventRecord(w.end, e->ddp_stream));
    CU(cuStreamWaitEvent(e->s, reduced, 0));
    CU(cuMemcpyDtoDAsync_v2(params, grads, total * es, e->s)); /* the optimiser step */
    at = 0;
    for (int b = 0; b < 3; b++) {
      for (size_t i = 0; i < bucket[b]; i++) {
        double k = (double)((at + i + (size_t)step) % 4);
        double sum = (double)n * (double)(n + 1) / 2 + (double)n * k;
        e->want[at + i] = bucket_op[b] == ncclAvg ? sum / (double)n : sum;
      }
      at += bucket[b];
    }
    fetch(e, params, total * es); /* float(loss) */
    expect("DDP step", t, e->got, e->want, total);
  }
  w.stop = 1;
  if (pthread_join(dog, NULL) != 0) FAIL("pthread_join (watchdog)");
  if (w.queries == 0) FAIL("the watchdog never ran");
  CU(cuEventDestroy_v2(grads_ready));
  CU(cuEventDestroy_v2(reduced));
  CU(cuEventDestroy_v2(w.end));
}

/* PyTorch's CUDA graphs (torch.cuda.graph): the collectives of a step captured once on the
 * rank's stream (global mode) into a graph, then replayed, each replay after new inputs were
 * copied into the graph's static buffers on the stream and read back straight after it: a
 * small all-reduce, an all-gather, and (where the ranks share no context) a large in-place
 * all-reduce of several pieces; where they share one, that large call is refused in the
 * capture (ncclInvalidArgument) and the capture goes on. */
#define GRAPH_REPLAYS 3
static double graph_input(int r, int replay, size_t i) { return (double)((r + 1) * (replay + 1)) + (double)(i % 5); }

static void cuda_graph(struct rank_env* e) {
  if (use_legacy) return; /* the legacy stream cannot be captured */
  size_t n = (size_t)e->n, es = 4, small = COUNT, large = LARGE;
  ncclDataType_t t = ncclFloat32;
  /* send: [0, large) the large call's in-place buffer, its first `small` the small calls'
   * input; recv: [0, small) the all-reduce's output, then the all-gather's (small * n). */
  fits(e, large * es);
  CUdeviceptr ar_out = e->recv, ag_out = e->recv + small * es;
  void *graph = NULL, *exec = NULL;
  CU(cuStreamBeginCapture_v2(e->s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  ncclResult_t first = ncclAllReduce((const void*)e->send, (void*)ar_out, small, t, ncclSum, e->comm, ST(e->s));
  if (first == ncclInvalidArgument && use_threads) {
    /* Threads on one device capture only one-kernel calls (TOPOCCL_DEVICE_LL=2): refused
     * alike on every rank, said so, and the capture ends empty. */
    if (e->rank == 0) printf("device: capture refused between threads on one device: %s\n", ncclGetLastError(e->comm));
    CU(cuStreamEndCapture(e->s, &graph));
    CU(cuGraphDestroy(graph));
    return;
  }
  CHECK(first);
  CHECK(ncclAllGather((const void*)e->send, (void*)ag_out, small, t, e->comm, ST(e->s)));
  ncclResult_t big = ncclAllReduce((const void*)e->send, (void*)e->send, large, t, ncclSum, e->comm, ST(e->s));
  if (shared_ctx ? big != ncclInvalidArgument : big != ncclSuccess)
    FAIL("a large all-reduce in a capture (ranks %s a context): %d (%s): %s", shared_ctx ? "sharing" : "not sharing",
         (int)big, ncclGetErrorString(big), ncclGetLastError(e->comm));
  CU(cuStreamEndCapture(e->s, &graph));
  CU(cuGraphInstantiateWithFlags(&exec, graph, 0));
  for (int replay = 0; replay < GRAPH_REPLAYS; replay++) {
    for (size_t i = 0; i < large; i++) store(t, e->host, i, graph_input(e->rank, replay, i));
    copy_in_async(e, e->send, e->host, large * es);
    poison_async(e, e->recv, small * (n + 1) * es);
    CU(cuGraphLaunch(exec, e->s));
    call_done("replayed graph");
    double ranks = (double)n * (double)(n + 1) / 2 * (double)(replay + 1);
    fetch(e, ar_out, small * es);
    for (size_t i = 0; i < small; i++) e->want[i] = ranks + (double)n * (double)(i % 5);
    expect("all-reduce replayed from a CUDA graph", t, e->got, e->want, small);
    fetch(e, ag_out, small * n * es);
    for (size_t i = 0; i < small * n; i++) e->want[i] = graph_input((int)(i / small), replay, i % small);
    expect("all-gather replayed from a CUDA graph", t, e->got, e->want, small * n);
    if (!shared_ctx) {
      fetch(e, e->send, large * es);
      for (size_t i = 0; i < large; i++) e->want[i] = ranks + (double)n * (double)(i % 5);
      expect("large in-place all-reduce replayed from a CUDA graph", t, e->got, e->want, large);
    }
  }
  CU(cuGraphExecDestroy(exec));
  CU(cuGraphDestroy(graph));
}

/* ncclMemAlloc hands out device memory (allocated with the rank's buffers, freed with them by
 * free_buffers, once): not host memory (a child that reads it dies), a copy target of the
 * driver, a collective's buffer. */
static void mem_alloc(struct rank_env* e) {
  size_t n = (size_t)e->n, es = 4, count = e->cap / es / n;
  void *a = e->nccl_a, *b = e->nccl_b; /* count * es and count * n * es bytes */
  pid_t child = fork();
  if (child == 0) {
    /* After cuInit the child must not use the driver; it only reads (no core dump). */
    struct rlimit no_core = {0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    volatile char c = *(volatile char*)a;
    (void)c;
    _exit(0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  if (!WIFSIGNALED(status) || (WTERMSIG(status) != SIGSEGV && WTERMSIG(status) != SIGBUS))
    FAIL("ncclMemAlloc's memory %p is readable by the host (status %d): not device memory", a, status);
  for (size_t i = 0; i < count; i++) store(ncclFloat32, e->host, i, input(ncclFloat32, SUM, e->rank, e->n, i));
  put(e, (CUdeviceptr)a, count * es);
  fetch(e, (CUdeviceptr)a, count * es);
  for (size_t i = 0; i < count; i++) e->want[i] = input(ncclFloat32, SUM, e->rank, e->n, i);
  expect("ncclMemAlloc memory copied in and out", ncclFloat32, e->got, e->want, count);
  CHECK(ncclAllReduce(a, a, count, ncclFloat32, ncclSum, e->comm, ST(e->s)));
  call_done("all-reduce in ncclMemAlloc memory");
  CHECK(ncclAllGather(a, b, count, ncclFloat32, e->comm, ST(e->s)));
  call_done("all-gather into ncclMemAlloc memory");
  for (size_t i = 0; i < count * n; i++) e->want[i] = reduced(ncclFloat32, SUM, e->n, i % count, 0);
  fetch(e, (CUdeviceptr)b, count * n * es);
  expect("all-reduce then all-gather in ncclMemAlloc memory", ncclFloat32, e->got, e->want, count * n);
}

/* A stream of another context is refused, says why, and breaks nothing. */
static void other_context(struct rank_env* e) {
  CUcontext other;
  if (use_created_ctx) {
    CU(cuDevicePrimaryCtxRetain(&other, e->dev));
    CU(cuCtxSetCurrent(other));
  } else {
    CU(cuCtxCreate_v2(&other, 0, e->dev)); /* current now */
  }
  CUstream os;
  CU(cuStreamCreate(&os, 0));
  CU(cuCtxSetCurrent(e->ctx));
  ncclResult_t r = ncclAllReduce((const void*)e->send, (void*)e->recv, 16, ncclFloat32, ncclSum, e->comm, ST(os));
  if (r != ncclInvalidArgument)
    FAIL("a stream of another context: %d (%s), expected ncclInvalidArgument: %s", (int)r, ncclGetErrorString(r),
         ncclGetLastError(e->comm));
  const char* why = ncclGetLastError(e->comm);
  if (!strstr(why, "context")) FAIL("a stream of another context, said as: \"%s\"", why);
  if (e->rank == 0) printf("device: a stream of another context: %s: %s\n", ncclGetErrorString(r), why);
  ncclResult_t async = ncclSuccess;
  CHECK(ncclCommGetAsyncError(e->comm, &async));
  if (async != ncclSuccess) FAIL("the refused call broke the communicator: %d", (int)async);
  /* In a group, the refused call fails the group whole: the good call before it does not run
   * either (its output keeps what was there). */
  fits(e, 16 * sizeof(float));
  memset(e->host, 0x3c, 16 * sizeof(float)); /* not fetch's 0x5a */
  put(e, e->recv, 16 * sizeof(float));
  CHECK(ncclGroupStart());
  CHECK(ncclAllReduce((const void*)e->send, (void*)e->recv, 16, ncclFloat32, ncclSum, e->comm, ST(e->s)));
  CHECK(ncclAllReduce((const void*)e->send, (void*)e->send, 16, ncclFloat32, ncclSum, e->comm, ST(os)));
  r = ncclGroupEnd();
  if (r != ncclInvalidArgument) FAIL("a group with a stream of another context: %d, expected ncclInvalidArgument", (int)r);
  fetch(e, e->recv, 16 * sizeof(float));
  for (int i = 0; i < (int)(16 * sizeof(float)); i++)
    if ((unsigned char)e->got[i] != 0x3c) FAIL("a group refused at its end still ran a call (byte %d)", i);
  CU(cuCtxSetCurrent(other));
  CU(cuStreamDestroy_v2(os));
  CU(cuCtxSetCurrent(e->ctx));
  if (!use_created_ctx) CU(cuCtxDestroy_v2(other));
  /* Still usable. */
  struct op_set ops = {{ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg}, 0};
  all_reduce(e, ncclFloat32, SUM, &ops, COUNT, 0);
}

/* Every buffer of a rank, device and host, made before its first call (see the top). */
static void alloc_buffers(struct rank_env* e) {
  size_t n = (size_t)e->n;
  e->cap = (size_t)LARGE * 4;
  if ((size_t)COUNT * n * 8 > e->cap) e->cap = (size_t)COUNT * n * 8;
  CU(cuMemAlloc_v2(&e->send, e->cap));
  CU(cuMemAlloc_v2(&e->recv, e->cap));
  CU(cuMemAlloc_v2(&e->scalar, 8));
  for (int b = 0; b < GROUP_BUFFERS; b++) {
    CU(cuMemAlloc_v2(&e->group_in[b], COUNT * n * 4));
    CU(cuMemAlloc_v2(&e->group_out[b], COUNT * n * 4));
  }
  size_t count = e->cap / 4 / n; /* mem_alloc's float32 elements per rank */
  CHECK(ncclMemAlloc(&e->nccl_a, count * 4));
  CHECK(ncclMemAlloc(&e->nccl_b, count * n * 4));
  if (e->nccl_a == NULL || e->nccl_b == NULL) FAIL("ncclMemAlloc gave NULL");
  e->host = malloc(e->cap);
  e->got = malloc(e->cap);
  e->poison = malloc(e->cap);
  e->want = malloc(e->cap * sizeof(double));
  if (!e->host || !e->got || !e->poison || !e->want) FAIL("malloc");
  memset(e->poison, POISON, e->cap);
}

/* ...and freed after its last (ncclMemFree once only). */
static void free_buffers(struct rank_env* e) {
  CU(cuMemFree_v2(e->send));
  CU(cuMemFree_v2(e->recv));
  CU(cuMemFree_v2(e->scalar));
  for (int b = 0; b < GROUP_BUFFERS; b++) {
    CU(cuMemFree_v2(e->group_in[b]));
    CU(cuMemFree_v2(e->group_out[b]));
  }
  CHECK(ncclMemFree(e->nccl_a));
  CHECK(ncclMemFree(e->nccl_b));
  EXPECT(ncclInvalidArgument, ncclMemFree(e->nccl_a));
  free(e->host);
  free(e->got);
  free(e->poison);
  free(e->want);
}

/* One rank, a process or a thread, on a driver initialised in this process: its context made
 * current on this thread, its stream, buffers and communicator, then every test. */
static void rank_body(int rank, int n, ncclUniqueId id) {
  me = &tallies[rank];
  my_rank = rank;
  struct rank_env env = {.rank = rank, .n = n};
  struct rank_env* e = &env;
  CU(cuDeviceGet(&e->dev, 0));
  if (use_created_ctx) {
    CU(cuCtxCreate_v2(&e->ctx, 0, e->dev));
  } else {
    CU(cuDevicePrimaryCtxRetain(&e->ctx, e->dev));
  }
  CU(cuCtxSetCurrent(e->ctx));
  e->s = NULL;
  if (!use_legacy) CU(cuStreamCreate(&e->s, 0));
  CU(cuStreamCreateWithPriority(&e->ddp_stream, CU_STREAM_NON_BLOCKING, 0));
  alloc_buffers(e);

  CHECK(ncclCommInitRank(&e->comm, n, id, rank));
  int dev = -1;
  CHECK(ncclCommCuDevice(e->comm, &dev)); /* before any call: the current context's device */
  if (dev != 0) FAIL("ncclCommCuDevice before any call: %d", dev);

  matrix(e);
  if (!only_reductions) {
    CHECK(ncclCommCuDevice(e->comm, &dev));
    if (dev != 0) FAIL("ncclCommCuDevice: %d", dev);
    chain(e, ncclInt32);
    chain(e, ncclFloat64);
    group(e);
    ddp_steps(e);
    cuda_graph(e);
    mem_alloc(e);
    other_context(e);
  }

  ncclResult_t async = ncclSuccess;
  CHECK(ncclCommGetAsyncError(e->comm, &async));
  if (async != ncclSuccess) FAIL("asynchronous error %d", (int)async);
  CHECK(ncclCommFinalize(e->comm));
  CHECK(ncclCommDestroy(e->comm));
  free_buffers(e);
  if (e->s) CU(cuStreamDestroy_v2(e->s));
  CU(cuStreamDestroy_v2(e->ddp_stream));
  if (use_created_ctx) CU(cuCtxDestroy_v2(e->ctx));
}

/* A forked rank: the driver starts after the fork. */
static void process_rank(int rank, int n, ncclUniqueId id) {
  alarm(timeout_s);
  CU(cuInit(0));
  rank_body(rank, n, id);
}

/* ncclCommInitAll with every rank on device 0, in this one process (its driver initialised):
 * one thread drives them all in groups, each communicator on its own stream. */
static void init_all(int n) {
  me = &tallies[n];
  my_rank = -1;
  size_t count = COUNT, es = 4, nn = (size_t)n;
  ncclDataType_t t = ncclFloat32;
  CUdevice dev;
  CUcontext ctx;
  CU(cuDeviceGet(&dev, 0));
  CU(cuDevicePrimaryCtxRetain(&ctx, dev));
  CU(cuCtxSetCurrent(ctx));
  int devs[64] = {0};
  ncclComm_t comms[64];
  CUstream s[64];
  CUdeviceptr in[64], out[64];
  CHECK(ncclCommInitAll(comms, n, devs));
  char* host = malloc(count * nn * es);
  char* got = malloc(count * nn * es);
  double* want = malloc(count * nn * sizeof(double));
  if (!host || !got || !want) FAIL("malloc");
  memset(host, POISON, count * nn * es);
  for (int r = 0; r < n; r++) {
    int d = -1;
    CHECK(ncclCommCuDevice(comms[r], &d));
    if (d != 0) FAIL("InitAll rank %d: ncclCommCuDevice %d", r, d);
    CU(cuStreamCreate(&s[r], 0));
    CU(cuMemAlloc_v2(&in[r], count * nn * es));
    CU(cuMemAlloc_v2(&out[r], count * nn * es));
  }
  for (int step = 0; step < 3; step++) {
    const char* what = step == 0 ? "InitAll all-reduce" : step == 1 ? "InitAll all-gather" : "InitAll send/recv ring";
    for (int r = 0; r < n; r++) {
      for (size_t i = 0; i < count; i++) store(t, host, i, step == 0 ? input(t, SUM, r, n, i) : moved(r, i));
      CU(cuMemcpyHtoD_v2(in[r], host, count * es));
      memset(host, POISON, count * nn * es);
      CU(cuMemcpyHtoDAsync_v2(out[r], host, count * nn * es, s[r]));
    }
    CHECK(ncclGroupStart());
    for (int r = 0; r < n; r++) {
      if (step == 0) {
        CHECK(ncclAllReduce((const void*)in[r], (void*)out[r], count, t, ncclSum, comms[r], ST(s[r])));
      } else if (step == 1) {
        CHECK(ncclAllGather((const void*)in[r], (void*)out[r], count, t, comms[r], ST(s[r])));
      } else {
        CHECK(ncclSend((const void*)in[r], count, t, (r + 1) % n, comms[r], ST(s[r])));
        CHECK(ncclRecv((void*)out[r], count, t, (r + n - 1) % n, comms[r], ST(s[r])));
        call_done(what);
      }
      call_done(what);
    }
    CHECK(ncclGroupEnd());
    for (int r = 0; r < n; r++) {
      size_t m = step == 1 ? count * nn : count;
      for (size_t i = 0; i < m; i++) {
        want[i] = step == 0   ? reduced(t, SUM, n, i, 0)
                  : step == 1 ? moved((int)(i / count), i % count)
                              : moved((r + n - 1) % n, i);
      }
      CU(cuMemcpyDtoHAsync_v2(got, out[r], m * es, s[r]));
      expect(what, t, got, want, m);
    }
  }
  for (int r = 0; r < n; r++) {
    CHECK(ncclCommDestroy(comms[r]));
    CU(cuMemFree_v2(in[r]));
    CU(cuMemFree_v2(out[r]));
    CU(cuStreamDestroy_v2(s[r]));
  }
}

/* init_all in a process of its own, forked before cuInit, or with threads (the driver started
 * here, so no child could use it) in this one. Returns whether it failed. */
static int run_init_all(int n) {
  if (use_threads) {
    init_all(n); /* a failure exits */
    return 0;
  }
  pid_t p = fork();
  if (p < 0) FAIL("fork");
  if (p == 0) {
    alarm(timeout_s);
    CU(cuInit(0));
    init_all(n);
    fflush(stdout);
    _exit(0);
  }
  int status = 0;
  waitpid(p, &status, 0);
  int failed = !WIFEXITED(status) || WEXITSTATUS(status) != 0;
  if (failed) fprintf(stderr, "ncclCommInitAll's process failed (status %d)\n", status);
  return failed;
}

static void summary(const char* what, struct tally* t, int nt, int failed) {
  struct tally sum = {0, 0, 0, 0};
  for (int i = 0; i < nt; i++) {
    sum.calls += t[i].calls;
    sum.checked += t[i].checked;
    sum.wrong += t[i].wrong;
  }
  printf("%s: %ld calls, %ld elements checked, %ld wrong%s\n", what, sum.calls, sum.checked, sum.wrong,
         failed ? " (FAILED: see the ranks' errors)" : "");
  fflush(stdout);
}

int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2;
  use_created_ctx = argc > 2 && strcmp(argv[2], "created") == 0;
  use_legacy = argc > 3 && strcmp(argv[3], "legacy") == 0;
  small_matrix = argc > 4 && strcmp(argv[4], "small") == 0;
  const char* ops = argc > 5 ? argv[5] : "all";
  ops_from = 0, ops_to = NUM_OPS;
  if (strcmp(ops, "no-device-scalar") == 0) ops_to = PMS_DEVICE;
  if (strcmp(ops, "device-scalar") == 0) ops_from = PMS_DEVICE, only_reductions = 1;
  use_threads = argc > 6 && strcmp(argv[6], "threads") == 0;
  shared_ctx = use_threads && !use_created_ctx;
  if (shared_ctx && use_legacy)
    FAIL("threads on the primary context share its legacy stream: each rank's calls would wait behind the others'");
  verbose = getenv("DEVICE_TEST_VERBOSE") != NULL && strcmp(getenv("DEVICE_TEST_VERBOSE"), "1") == 0;
  if (getenv("DEVICE_TEST_TIMEOUT")) timeout_s = (unsigned)atoi(getenv("DEVICE_TEST_TIMEOUT"));
  if (n < 1 || n > 63) FAIL("nranks %d", n);
  tallies = mmap(NULL, sizeof(struct tally) * 64, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (tallies == MAP_FAILED) FAIL("mmap");
  memset(tallies, 0, sizeof(struct tally) * 64);
  alarm(timeout_s + 10);

  int failed = 0;
  if (use_threads) {
    CU(cuInit(0)); /* once, for every rank */
    run_rank_threads(n, rank_body); /* a failing rank exits */
  } else {
    /* The parent never touches the driver: each process calls cuInit after the fork. */
    failed = run_ranks(n, process_rank);
  }
  char what[192];
  snprintf(what, sizeof what, "device: %d ranks as %s, %s context, %s stream, %s matrix, %s operators", n,
           use_threads ? "threads" : "processes", use_created_ctx ? "created" : "primary",
           use_legacy ? "legacy" : "own", small_matrix ? "small" : "full", ops);
  summary(what, tallies, n, failed);
  int wrong = failed;
  for (int r = 0; r < n; r++) wrong += tallies[r].wrong != 0;

  if (only_reductions) return wrong == 0 ? 0 : 1;
  int init_failed = run_init_all(n);
  snprintf(what, sizeof what, "device: ncclCommInitAll, %d ranks on device 0 in one process", n);
  summary(what, tallies + n, 1, init_failed);
  wrong += init_failed + (tallies[n].wrong != 0);
  return wrong == 0 ? 0 : 1;
}
