/* Every collective, datatype and operator through nccl.h, on ranks forked from this program,
 * checked exactly; grouped send/recv; PreMulSum; ncclMemAlloc and registration; the error
 * codes for bad input; finalize and destroy.   usage: collectives [nranks] */
#include "ranks.h"

static const ncclRedOp_t OPS[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
static const char* OP_NAMES[] = {"sum", "prod", "max", "min", "avg"};

/* fp8 holds integers exactly only up to 16 (e4m3) or 8 (e5m2), partial sums included: its
 * averages are of values equal on every rank. */
static int fp8_values;

/* Inputs whose results are exact in every type: small integers; for avg, per-rank offsets
 * that cancel, so the mean is an integer. */
static double value(ncclRedOp_t op, int r, int n, size_t i) {
  if (op != ncclAvg) return 1 + (double)((r + (int)i) % 2);
  if (fp8_values) return 1 + (double)(i % 2);
  double offset = r < n - 1 ? r : -(double)(n - 1) * (n - 2) / 2;
  return 8 + (double)(i % 3) + offset;
}

static double reduced(ncclRedOp_t op, int n, size_t i) {
  double acc = value(op, 0, n, i);
  for (int r = 1; r < n; r++) {
    double v = value(op, r, n, i);
    switch (op) {
      case ncclSum: case ncclAvg: acc += v; break;
      case ncclProd: acc *= v; break;
      case ncclMax: acc = v > acc ? v : acc; break;
      default: acc = v < acc ? v : acc; break;
    }
  }
  return op == ncclAvg ? acc / n : acc;
}

static void expect_values(const char* what, ncclDataType_t t, const void* buf, size_t count,
                          double (*want)(size_t, void*), void* ctx) {
  for (size_t i = 0; i < count; i++) {
    double got = load(t, buf, i), w = want(i, ctx);
    if (got != w) FAIL("%s (type %d): element %zu is %g, expected %g", what, (int)t, i, got, w);
  }
}

struct red { ncclRedOp_t op; int n; size_t offset; double scale; };
static double want_reduced(size_t i, void* c) {
  struct red* x = c;
  return reduced(x->op, x->n, x->offset + i) * x->scale;
}
struct gathered { int n; size_t count; };
static double want_gathered(size_t i, void* c) {
  struct gathered* g = c;
  return value(ncclSum, (int)(i / g->count), g->n, i % g->count);
}
struct bcast { int root; int n; };
static double want_bcast(size_t i, void* c) {
  struct bcast* b = c;
  return value(ncclSum, b->root, b->n, i);
}

static void reductions(ncclComm_t comm, int rank, int n, ncclDataType_t t, size_t count) {
  size_t es = type_size(t);
  char* send = malloc(count * n * es);
  char* recv = malloc(count * n * es);
  for (int o = 0; o < 5; o++) {
    ncclRedOp_t op = OPS[o];
    char what[64];
    for (size_t i = 0; i < count * n; i++) store(t, send, i, value(op, rank, n, i));
    struct red all = {op, n, 0, 1};
    snprintf(what, sizeof what, "all-reduce %s", OP_NAMES[o]);
    CHECK(ncclAllReduce(send, recv, count, t, op, comm, NULL));
    expect_values(what, t, recv, count, want_reduced, &all);
    snprintf(what, sizeof what, "in-place all-reduce %s", OP_NAMES[o]);
    memcpy(recv, send, count * es);
    CHECK(ncclAllReduce(recv, recv, count, t, op, comm, NULL));
    expect_values(what, t, recv, count, want_reduced, &all);

    struct red mine = {op, n, (size_t)rank * count, 1};
    snprintf(what, sizeof what, "reduce-scatter %s", OP_NAMES[o]);
    CHECK(ncclReduceScatter(send, recv, count, t, op, comm, NULL));
    expect_values(what, t, recv, count, want_reduced, &mine);
    snprintf(what, sizeof what, "in-place reduce-scatter %s", OP_NAMES[o]);
    memcpy(recv, send, count * n * es);
    CHECK(ncclReduceScatter(recv, recv + (size_t)rank * count * es, count, t, op, comm, NULL));
    expect_values(what, t, recv + (size_t)rank * count * es, count, want_reduced, &mine);

    int root = n - 1;
    snprintf(what, sizeof what, "reduce %s", OP_NAMES[o]);
    CHECK(ncclReduce(send, rank == root ? recv : NULL, count, t, op, root, comm, NULL));
    if (rank == root) expect_values(what, t, recv, count, want_reduced, &all);
  }
  free(send);
  free(recv);
}

static void movements(ncclComm_t comm, int rank, int n, ncclDataType_t t, size_t count) {
  size_t es = type_size(t);
  char* send = malloc(count * es);
  char* recv = malloc(count * n * es);
  for (size_t i = 0; i < count; i++) store(t, send, i, value(ncclSum, rank, n, i));
  struct gathered g = {n, count};
  CHECK(ncclAllGather(send, recv, count, t, comm, NULL));
  expect_values("all-gather", t, recv, count * n, want_gathered, &g);
  memset(recv, 0, count * n * es);
  memcpy(recv + (size_t)rank * count * es, send, count * es);
  CHECK(ncclAllGather(recv + (size_t)rank * count * es, recv, count, t, comm, NULL));
  expect_values("in-place all-gather", t, recv, count * n, want_gathered, &g);

  struct bcast b = {1 % n, n};
  CHECK(ncclBroadcast(send, recv, count, t, b.root, comm, NULL));
  expect_values("broadcast", t, recv, count, want_bcast, &b);
  memcpy(recv, send, count * es);
  CHECK(ncclBcast(recv, count, t, b.root, comm, NULL));
  expect_values("bcast", t, recv, count, want_bcast, &b);
  free(send);
  free(recv);
}

static void point_to_point(ncclComm_t comm, int rank, int n) {
  size_t count = 5000;
  int* out = malloc(count * n * sizeof(int));
  int* in = malloc(count * n * sizeof(int));
  for (size_t i = 0; i < count * n; i++) out[i] = rank * 1000000 + (int)i;
  /* Everyone sends to everyone, itself included: an all-to-all in one group. */
  CHECK(ncclGroupStart());
  for (int p = 0; p < n; p++) {
    CHECK(ncclSend(out + (size_t)p * count, count, ncclInt32, p, comm, NULL));
    CHECK(ncclRecv(in + (size_t)p * count, count, ncclInt32, p, comm, NULL));
  }
  CHECK(ncclGroupEnd());
  for (int p = 0; p < n; p++)
    for (size_t i = 0; i < count; i++)
      if (in[(size_t)p * count + i] != p * 1000000 + (int)((size_t)rank * count + i))
        FAIL("grouped send/recv: from rank %d element %zu is %d", p, i, in[(size_t)p * count + i]);
  free(out);
  free(in);
}

static void premulsum(ncclComm_t comm, int rank, int n) {
  float two = 2.0f;
  ncclRedOp_t op;
  CHECK(ncclRedOpCreatePreMulSum(&op, &two, ncclFloat32, ncclScalarHostImmediate, comm));
  two = 100.0f; /* copied at creation: no effect */
  float x[3] = {1.0f + rank, 2.0f, 3.0f}, y[3];
  CHECK(ncclAllReduce(x, y, 3, ncclFloat32, op, comm, NULL));
  float first = 0;
  for (int r = 0; r < n; r++) first += 2.0f * (1.0f + r);
  if (y[0] != first || y[1] != 4.0f * n || y[2] != 6.0f * n) FAIL("PreMulSum: %g %g %g", y[0], y[1], y[2]);
  EXPECT(ncclInvalidArgument, ncclAllReduce(x, y, 3, ncclFloat64, op, comm, NULL)); /* wrong type */
  CHECK(ncclRedOpDestroy(op, comm));
  EXPECT(ncclInvalidArgument, ncclRedOpDestroy(op, comm));

  int32_t scale = 3;
  CHECK(ncclRedOpCreatePreMulSum(&op, &scale, ncclInt32, ncclScalarDevice, comm));
  scale = 5; /* read at each call */
  int32_t a = rank + 1, b = 0;
  CHECK(ncclAllReduce(&a, &b, 1, ncclInt32, op, comm, NULL));
  if (b != 5 * n * (n + 1) / 2) FAIL("PreMulSum (scalar read at call time): %d", b);
  CHECK(ncclRedOpDestroy(op, comm));
}

static void memory(ncclComm_t comm, int n) {
  void* buf = NULL;
  CHECK(ncclMemAlloc(&buf, 1 << 20));
  if (buf == NULL || ((uintptr_t)buf & 4095) != 0) FAIL("ncclMemAlloc: %p", buf);
  void* reg = NULL;
  CHECK(ncclCommRegister(comm, buf, 1 << 20, &reg));
  float* f = buf;
  for (int i = 0; i < 1000; i++) f[i] = 1.0f;
  CHECK(ncclAllReduce(f, f, 1000, ncclFloat32, ncclSum, comm, NULL));
  if (f[999] != (float)n) FAIL("all-reduce in ncclMemAlloc memory: %g", f[999]);
  CHECK(ncclCommDeregister(comm, reg));
  EXPECT(ncclInvalidArgument, ncclCommDeregister(comm, reg));
  CHECK(ncclMemFree(buf));
  EXPECT(ncclInvalidArgument, ncclMemFree(buf));
}

static void bad_input(ncclComm_t comm, ncclUniqueId id, int n) {
  float x[4] = {0}, y[4];
  int dev = 0;
  ncclComm_t other;
  EXPECT(ncclInvalidArgument, ncclAllReduce(x, y, 4, ncclFloat32, ncclSum, NULL, NULL));
  EXPECT(ncclInvalidArgument, ncclAllReduce(x, y, 4, (ncclDataType_t)42, ncclSum, comm, NULL));
  EXPECT(ncclInvalidArgument, ncclAllReduce(x, y, 4, ncclFloat32, (ncclRedOp_t)99, comm, NULL));
  EXPECT(ncclInvalidArgument, ncclAllReduce(NULL, y, 4, ncclFloat32, ncclSum, comm, NULL));
  /* Without a CUDA driver (this test's machine), a stream is an error that says so, and host
   * calls are unchanged. */
  EXPECT(ncclUnhandledCudaError, ncclAllReduce(x, y, 4, ncclFloat32, ncclSum, comm, (cudaStream_t)0x10));
  if (!strstr(ncclGetLastError(NULL), "no CUDA driver"))
    FAIL("a stream without a driver: %s", ncclGetLastError(NULL));
  EXPECT(ncclInvalidArgument, ncclBroadcast(x, y, 4, ncclFloat32, n, comm, NULL));
  EXPECT(ncclInvalidArgument, ncclSend(x, 4, ncclFloat32, -1, comm, NULL));
  EXPECT(ncclInvalidArgument, ncclCommInitRank(&other, 2, id, 5));
  EXPECT(ncclInvalidArgument, ncclCommCount(comm, NULL));
  EXPECT(ncclInvalidArgument, ncclRedOpDestroy(ncclSum, comm));
  EXPECT(ncclUnhandledCudaError, ncclCommCuDevice(comm, &dev));
  EXPECT(ncclInvalidUsage, ncclGroupEnd());
  int x_on_stack = 0;
  EXPECT(ncclInvalidArgument, ncclMemFree(&x_on_stack));
  /* A bad call inside a group fails the whole group, which then runs nothing. */
  CHECK(ncclGroupStart());
  EXPECT(ncclInvalidArgument, ncclAllReduce(x, y, 4, (ncclDataType_t)-3, ncclSum, comm, NULL));
  EXPECT(ncclInvalidUsage, ncclGroupEnd());
  if (strcmp(ncclGetErrorString(ncclRemoteError), "remote process exited or there was a network error") != 0)
    FAIL("ncclGetErrorString: %s", ncclGetErrorString(ncclRemoteError));
  /* Zero elements: nothing to do, on every rank. */
  CHECK(ncclAllReduce(x, y, 0, ncclFloat32, ncclSum, comm, NULL));
}

static void body(int rank, int n, ncclUniqueId id) {
  int version = 0, count = 0, me = -1;
  CHECK(ncclGetVersion(&version));
  if (version != NCCL_VERSION_CODE) FAIL("version %d, header %d", version, NCCL_VERSION_CODE);
  ncclComm_t comm;
  CHECK(ncclCommInitRank(&comm, n, id, rank));
  CHECK(ncclCommCount(comm, &count));
  CHECK(ncclCommUserRank(comm, &me));
  if (count != n || me != rank) FAIL("count %d rank %d", count, me);

  for (int t = 0; t < NUM_TYPES; t++) {
    fp8_values = is_fp8(ALL_TYPES[t]);
    reductions(comm, rank, n, ALL_TYPES[t], 1);
    reductions(comm, rank, n, ALL_TYPES[t], 1001);
    movements(comm, rank, n, ALL_TYPES[t], 777);
  }
  fp8_values = 0;
  reductions(comm, rank, n, ncclFloat32, 300000); /* several slices per chunk */
  point_to_point(comm, rank, n);
  premulsum(comm, rank, n);
  memory(comm, n);
  bad_input(comm, id, n);

  ncclResult_t async;
  CHECK(ncclCommGetAsyncError(comm, &async));
  if (async != ncclSuccess) FAIL("async error %d after bad input only", (int)async);
  CHECK(ncclCommFinalize(comm));
  float x = 1, y;
  EXPECT(ncclInvalidUsage, ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, comm, NULL));
  CHECK(ncclCommDestroy(comm));
  EXPECT(ncclInvalidArgument, ncclCommCount(comm, &count)); /* destroyed */
  if (rank == 0) printf("collectives: %d ranks, %d types x 5 ops, all checked\n", n, NUM_TYPES);
}

int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 3;
  return run_ranks(n, body) == 0 ? 0 : 1;
}
