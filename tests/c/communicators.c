/* Communicator life cycles through nccl.h: split (with NCCL_SPLIT_NOCOLOR), ncclCommInitAll
 * driven by one thread in a group, non-blocking init, grouped inits, and abort — a peer that
 * aborts, and an abort from a second thread that stops a call waiting on a rank that never
 * comes. Nothing may hang: each wait ends in an error code.   usage: communicators [nranks] */
#include "ranks.h"

#include <pthread.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void split_ranks(int rank, int n, ncclUniqueId id) {
  ncclComm_t comm, half, none;
  CHECK(ncclCommInitRank(&comm, n, id, rank));
  /* Even and odd ranks, each half in reverse order; the last rank takes no part. */
  int color = rank == n - 1 ? NCCL_SPLIT_NOCOLOR : rank % 2;
  CHECK(ncclCommSplit(comm, color, -rank, &half, NULL));
  if (color == NCCL_SPLIT_NOCOLOR) {
    if (half != NULL) FAIL("NOCOLOR gave a communicator");
  } else {
    int count, me, members = 0, above = 0;
    for (int r = 0; r < n - 1; r++)
      if (r % 2 == color) {
        members++;
        above += r > rank;
      }
    CHECK(ncclCommCount(half, &count));
    CHECK(ncclCommUserRank(half, &me));
    if (count != members || me != above) FAIL("split: rank %d is %d of %d, expected %d of %d", rank, me, count, above, members);
    int x = rank, sum = 0, want = 0;
    CHECK(ncclAllReduce(&x, &sum, 1, ncclInt32, ncclSum, half, NULL));
    for (int r = color; r < n - 1; r += 2) want += r;
    if (sum != want) FAIL("all-reduce on the split: %d, expected %d", sum, want);
    CHECK(ncclCommDestroy(half));
  }
  /* Everyone out: every rank gets NULL. */
  CHECK(ncclCommSplit(comm, NCCL_SPLIT_NOCOLOR, 0, &none, NULL));
  if (none != NULL) FAIL("all-NOCOLOR split gave a communicator");
  CHECK(ncclCommDestroy(comm));
}

static void nonblocking_init(int rank, int n, ncclUniqueId id) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm;
  ncclResult_t r = ncclCommInitRankConfig(&comm, n, id, rank, &config);
  if (r != ncclInProgress && r != ncclSuccess) FAIL("non-blocking init: %d", (int)r);
  ncclResult_t state = ncclInProgress;
  double deadline = now() + 60;
  while (state == ncclInProgress && now() < deadline) CHECK(ncclCommGetAsyncError(comm, &state));
  if (state != ncclSuccess) FAIL("non-blocking init ended in %d", (int)state);
  double x = 1, y = 0;
  CHECK(ncclAllReduce(&x, &y, 1, ncclFloat64, ncclSum, comm, NULL));
  if (y != n) FAIL("all-reduce after non-blocking init: %g", y);
  CHECK(ncclCommDestroy(comm));
}

static void peer_aborts(int rank, int n, ncclUniqueId id) {
  (void)n;
  ncclComm_t comm;
  CHECK(ncclCommInitRank(&comm, 2, id, rank));
  if (rank == 1) {
    CHECK(ncclCommAbort(comm));
    return;
  }
  float x[1024] = {0}, y[1024];
  double started = now();
  ncclResult_t r = ncclAllReduce(x, y, 1024, ncclFloat32, ncclSum, comm, NULL);
  if (r == ncclSuccess) FAIL("all-reduce with an aborted peer succeeded");
  if (now() - started > 10) FAIL("the failure took %.1f s", now() - started);
  ncclResult_t async;
  CHECK(ncclCommGetAsyncError(comm, &async));
  if (async == ncclSuccess) FAIL("no async error after a peer aborted");
  printf("peer abort: all-reduce returned %d (%s) after %.2f s: %s\n", (int)r, ncclGetErrorString(r),
         now() - started, ncclGetLastError(comm));
  CHECK(ncclCommAbort(comm));
}

struct waiting { ncclComm_t comm; ncclResult_t result; char why[256]; };
static void* all_reduce_alone(void* arg) {
  struct waiting* w = arg;
  float x = 1, y;
  w->result = ncclAllReduce(&x, &y, 1, ncclFloat32, ncclSum, w->comm, NULL);
  snprintf(w->why, sizeof w->why, "%s", ncclGetLastError(NULL));
  return NULL;
}

static void abort_from_another_thread(int rank, int n, ncclUniqueId id) {
  (void)n;
  ncclComm_t comm;
  CHECK(ncclCommInitRank(&comm, 2, id, rank));
  if (rank == 1) {
    sleep(3); /* never joins the all-reduce; exits after rank 0 gave up */
    CHECK(ncclCommDestroy(comm));
    return;
  }
  struct waiting w = {comm, ncclSuccess, ""};
  pthread_t t;
  pthread_create(&t, NULL, all_reduce_alone, &w);
  usleep(300 * 1000);
  double started = now();
  CHECK(ncclCommAbort(comm));
  pthread_join(t, NULL);
  if (w.result == ncclSuccess) FAIL("the aborted all-reduce succeeded");
  if (now() - started > 2) FAIL("abort took %.2f s to stop the call", now() - started);
  printf("abort from a second thread: the waiting call returned %d after %.3f s: %s\n", (int)w.result,
         now() - started, w.why);
}

static void init_all_in_one_thread(void) {
  enum { N = 3 };
  ncclComm_t comms[N];
  int devs[N] = {0, 1, 2};
  CHECK(ncclCommInitAll(comms, N, devs));
  /* NCCL refuses a repeated device; topoccl allows it (several ranks on one GPU). */
  int dup[2] = {1, 1};
  ncclComm_t two[2];
  CHECK(ncclCommInitAll(two, 2, dup));
  CHECK(ncclCommDestroy(two[0]));
  CHECK(ncclCommDestroy(two[1]));
  int negative[2] = {0, -1};
  EXPECT(ncclInvalidArgument, ncclCommInitAll(two, 2, negative));
  long in[N][100], out[N][100];
  for (int r = 0; r < N; r++)
    for (int i = 0; i < 100; i++) in[r][i] = r * 10 + i;
  /* One thread drives every rank: only a group makes that possible. */
  CHECK(ncclGroupStart());
  for (int r = 0; r < N; r++) CHECK(ncclAllReduce(in[r], out[r], 100, ncclInt64, ncclMax, comms[r], NULL));
  CHECK(ncclGroupEnd());
  for (int r = 0; r < N; r++)
    for (int i = 0; i < 100; i++)
      if (out[r][i] != (N - 1) * 10 + i) FAIL("InitAll group all-reduce: rank %d element %d = %ld", r, i, out[r][i]);
  for (int r = 0; r < N; r++) CHECK(ncclCommDestroy(comms[r]));

  /* Grouped ncclCommInitRank, one thread, as NCCL's single-process examples do. */
  ncclUniqueId id;
  CHECK(ncclGetUniqueId(&id));
  CHECK(ncclGroupStart());
  for (int r = 0; r < N; r++) CHECK(ncclCommInitRank(&comms[r], N, id, r));
  CHECK(ncclGroupEnd());
  int counts[N];
  for (int r = 0; r < N; r++) {
    CHECK(ncclCommCount(comms[r], &counts[r]));
    if (counts[r] != N) FAIL("grouped init: count %d", counts[r]);
    CHECK(ncclCommDestroy(comms[r]));
  }
  printf("InitAll and grouped init: %d ranks in one thread\n", N);
}

int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 4;
  int failed = 0;
  failed += run_ranks(n, split_ranks);
  failed += run_ranks(n, nonblocking_init);
  failed += run_ranks(2, peer_aborts);
  failed += run_ranks(2, abort_from_another_thread);
  init_all_in_one_thread();
  return failed == 0 ? 0 : 1;
}
