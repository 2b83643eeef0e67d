/* NCCL 2.22–2.30's host API on topoccl: all-to-all, gather, scatter, fp8, group simulation,
 * windows with put/signal/wait, suspend/resume and memory stats, revoke, shrink (also after a
 * rank died) and grow. Uses only names of NVIDIA's nccl.h 2.30, so it also builds against
 * NVIDIA's header (with a stand-in cuda_runtime.h) and must run the same. */
#include "ranks.h"

static int grow_pipe[2];

static void fill_int(int32_t* p, size_t n, int32_t v) {
  for (size_t i = 0; i < n; i++) p[i] = v;
}

static void collectives(int rank, int n, ncclComm_t comm) {
  const size_t count = 1000;
  int32_t* send = malloc(count * n * sizeof(int32_t));
  int32_t* recv = malloc(count * n * sizeof(int32_t));
  for (int j = 0; j < n; j++)
    for (size_t k = 0; k < count; k++) send[j * count + k] = rank * 100 + j;
  CHECK(ncclAlltoAll(send, recv, count, ncclInt32, comm, NULL));
  for (int i = 0; i < n; i++)
    for (size_t k = 0; k < count; k++)
      if (recv[i * count + k] != i * 100 + rank) FAIL("alltoall: from %d got %d", i, recv[i * count + k]);
  /* Gather to root 1, out of place, then in place. */
  int root = 1 % n;
  fill_int(send, count, rank + 7);
  memset(recv, 0, count * n * sizeof(int32_t));
  CHECK(ncclGather(send, recv, count, ncclInt32, root, comm, NULL));
  if (rank == root)
    for (int i = 0; i < n; i++)
      if (recv[i * count] != i + 7 || recv[i * count + count - 1] != i + 7) FAIL("gather: block %d", i);
  fill_int(recv + rank * count, count, rank + 20);
  CHECK(ncclGather(recv + rank * count, recv, count, ncclInt32, root, comm, NULL));
  if (rank == root)
    for (int i = 0; i < n; i++)
      if (recv[i * count + 5] != i + 20) FAIL("gather in place: block %d = %d", i, recv[i * count + 5]);
  /* Scatter from root: block i to rank i. */
  for (int i = 0; i < n; i++) fill_int(send + i * count, count, rank == root ? 300 + i : -1);
  CHECK(ncclScatter(send, recv, count, ncclInt32, root, comm, NULL));
  if (recv[0] != 300 + rank || recv[count - 1] != 300 + rank) FAIL("scatter: got %d", recv[0]);
  EXPECT(ncclInvalidArgument, ncclGather(send, recv, count, ncclInt32, n, comm, NULL));
  /* fp8: one per rank sums to the rank count, exact in both formats. */
  uint8_t e4[64], e5[64];
  memset(e4, 0x38, sizeof e4); /* 1.0 in E4M3 */
  memset(e5, 0x3c, sizeof e5); /* 1.0 in E5M2 */
  CHECK(ncclAllReduce(e4, e4, sizeof e4, ncclFloat8e4m3, ncclSum, comm, NULL));
  CHECK(ncclAllReduce(e5, e5, sizeof e5, ncclFloat8e5m2, ncclSum, comm, NULL));
  uint8_t want4 = n == 2 ? 0x40 : n == 3 ? 0x44 : 0x48; /* 2, 3, 4 */
  uint8_t want5 = n == 2 ? 0x40 : n == 3 ? 0x42 : 0x44;
  if (e4[63] != want4 || e5[0] != want5) FAIL("fp8 sums: %#x %#x", e4[63], e5[0]);
  /* A simulated group runs nothing and estimates its time. */
  fill_int(send, count, 1);
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  CHECK(ncclGroupStart());
  CHECK(ncclAllReduce(send, send, count, ncclInt32, ncclSum, comm, NULL));
  CHECK(ncclGroupSimulateEnd(&sim));
  if (!(sim.estimatedTime > 0.0f) || send[0] != 1) FAIL("simulated group: %f us, send[0] %d", sim.estimatedTime, send[0]);
  free(send);
  free(recv);
}

static void windows(int rank, int n, ncclComm_t comm) {
  int64_t* base;
  CHECK(ncclMemAlloc((void**)&base, 4096));
  ncclWindow_t win;
  CHECK(ncclCommWindowRegister(comm, base, 4096, &win, NCCL_WIN_DEFAULT));
  void* user;
  CHECK(ncclWinGetUserPtr(comm, win, &user));
  if (user != base) FAIL("window user pointer");
  int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  int64_t mine[4] = {rank, rank * 10, rank * 100, -rank};
  /* Two puts to the next rank (signal 3), one bare signal (signal 5); then wait for the
   * previous rank's, in the other order. */
  CHECK(ncclPutSignal(mine, 4, ncclInt64, next, win, 8 * 16, 3, 0, 0, comm, NULL));
  CHECK(ncclPutSignal(mine, 1, ncclInt64, next, win, 8 * 40, 3, 0, 0, comm, NULL));
  CHECK(ncclSignal(next, 5, 0, 0, comm, NULL));
  ncclWaitSignalDesc_t d[2] = {{1, prev, 5, 0}, {2, prev, 3, 0}};
  CHECK(ncclWaitSignal(2, d, comm, NULL));
  if (base[16] != prev || base[17] != prev * 10 || base[19] != -prev || base[40] != prev)
    FAIL("window holds %ld %ld %ld %ld", (long)base[16], (long)base[17], (long)base[19], (long)base[40]);
  /* A put past the end of the peer's window fails at the peer, naming the sender. */
  EXPECT(ncclInvalidArgument, ncclPutSignal(mine, 1, ncclInt64, next, win, 8, 0, -1, 0, comm, NULL));
  CHECK(ncclCommWindowDeregister(comm, win));
  CHECK(ncclMemFree(base));
}

static void lifecycle(int rank, int n, ncclComm_t comm) {
  (void)n;
  int32_t v = 1;
  uint64_t stat = 7;
  CHECK(ncclCommMemStats(comm, ncclStatGpuMemTotal, &stat));
  if (stat != 0) FAIL("GPU memory held: %lu", (unsigned long)stat);
  CHECK(ncclCommSuspend(comm, NCCL_SUSPEND_MEM));
  CHECK(ncclCommMemStats(comm, ncclStatGpuMemSuspended, &stat));
  if (stat != 1) FAIL("not suspended");
  EXPECT(ncclInvalidUsage, ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, comm, NULL));
  CHECK(ncclCommResume(comm));
  CHECK(ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, comm, NULL));
  int version = 0;
  CHECK(ncclGetVersion(&version));
  if (version != NCCL_VERSION_CODE || version != 23007) FAIL("version %d", version);
  (void)rank;
}

static void basics(int rank, int n, ncclUniqueId id) {
  ncclComm_t comm;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.commName = "nccl230";
  CHECK(ncclCommInitRankConfig(&comm, n, id, rank, &config));
  collectives(rank, n, comm);
  windows(rank, n, comm);
  lifecycle(rank, n, comm);
  /* Revoke: nothing more runs; destroy still works. */
  int32_t v = 1;
  CHECK(ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT));
  EXPECT(ncclInvalidUsage, ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, comm, NULL));
  CHECK(ncclCommDestroy(comm));
  if (rank == 0) printf("nccl230: %d ranks\n", n);
}

/* The last rank dies; the others' call fails, and they shrink without it. */
static void shrink_after_death(int rank, int n, ncclUniqueId id) {
  ncclComm_t comm, small;
  CHECK(ncclCommInitRank(&comm, n, id, rank));
  int32_t v = 1;
  CHECK(ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, comm, NULL));
  if (rank == n - 1) _exit(0);
  v = 1;
  ncclResult_t r = ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, comm, NULL);
  if (r == ncclSuccess) FAIL("an all-reduce with a dead rank succeeded");
  int dead = n - 1;
  CHECK(ncclCommShrink(comm, &dead, 1, &small, NULL, NCCL_SHRINK_ABORT));
  int count = 0, me = -1;
  CHECK(ncclCommCount(small, &count));
  CHECK(ncclCommUserRank(small, &me));
  if (count != n - 1 || me != rank) FAIL("shrunk: rank %d of %d", me, count);
  v = 1;
  CHECK(ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, small, NULL));
  if (v != n - 1) FAIL("shrunk all-reduce: %d", v);
  CHECK(ncclCommDestroy(small));
  CHECK(ncclCommAbort(comm));
  if (rank == 0) printf("shrink: %d survivors\n", n - 1);
}

/* Ranks 0..n-2 make a communicator, then grow it by the last rank. */
static void grow(int rank, int n, ncclUniqueId id) {
  ncclComm_t comm = NULL, big;
  ncclUniqueId grow_id;
  if (rank < n - 1) {
    CHECK(ncclCommInitRank(&comm, n - 1, id, rank));
    if (rank == 0) {
      CHECK(ncclCommGetUniqueId(comm, &grow_id));
      if (write(grow_pipe[1], &grow_id, sizeof grow_id) != (ssize_t)sizeof grow_id) FAIL("write grow id");
      CHECK(ncclCommGrow(comm, n, &grow_id, -1, &big, NULL));
    } else {
      CHECK(ncclCommGrow(comm, n, NULL, -1, &big, NULL));
    }
  } else {
    if (read(grow_pipe[0], &grow_id, sizeof grow_id) != (ssize_t)sizeof grow_id) FAIL("read grow id");
    CHECK(ncclCommGrow(NULL, n, &grow_id, n - 1, &big, NULL));
  }
  int count = 0, me = -1;
  CHECK(ncclCommCount(big, &count));
  CHECK(ncclCommUserRank(big, &me));
  if (count != n || me != rank) FAIL("grown: rank %d of %d", me, count);
  int32_t v = rank;
  CHECK(ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, big, NULL));
  if (v != n * (n - 1) / 2) FAIL("grown all-reduce: %d", v);
  CHECK(ncclCommDestroy(big));
  if (comm) CHECK(ncclCommDestroy(comm));
  if (rank == 0) printf("grow: %d ranks\n", n);
}

int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 3;
  const char* what = argc > 2 ? argv[2] : "basics";
  if (strcmp(what, "basics") == 0) return run_ranks(n, basics) != 0;
  if (strcmp(what, "grow") == 0) {
    if (pipe(grow_pipe) != 0) FAIL("pipe");
    return run_ranks(n, grow) != 0;
  }
  /* The dead rank's exit is expected: only the survivors' results count. */
  if (strcmp(what, "shrink") == 0) return run_ranks(n, shrink_after_death) != 0;
  FAIL("unknown test %s", what);
}
