/* topoccl.h from C, on ranks forked from this program: an asynchronous group's work handle
 * (wait, test, completion, free), tagged sends matched out of order, and receives from any
 * source naming their senders.   usage: extension [nranks] */
#include "ranks.h"
#include "topoccl.h"

static int told;
static ncclResult_t told_result = ncclInternalError;

static void on_complete(void* arg, ncclResult_t result, const char* message) {
  (void)message;
  *(int*)arg += 1;
  told_result = result;
}

static void body(int rank, int n, ncclUniqueId id) {
  ncclComm_t comm;
  CHECK(ncclCommInitRank(&comm, n, id, rank));
  int version = 0;
  CHECK(topocclExtVersion(&version));
  if (version != TOPOCCL_EXT_VERSION) FAIL("extension version %d, header %d", version, TOPOCCL_EXT_VERSION);

  /* An all-reduce ended without waiting: its handle completes, tells once, and is freed. */
  enum { COUNT = 1 << 16 };
  float* buf = malloc(COUNT * sizeof(float));
  for (int i = 0; i < COUNT; i++) buf[i] = (float)(rank + 1);
  topocclWork_t work = NULL;
  CHECK(ncclGroupStart());
  CHECK(ncclAllReduce(buf, buf, COUNT, ncclFloat32, ncclSum, comm, NULL));
  CHECK(topocclGroupEndAsync(&work));
  CHECK(topocclWorkOnComplete(work, on_complete, &told));
  CHECK(topocclWorkWait(work, -1));
  int done = 0;
  CHECK(topocclWorkTest(work, &done));
  if (!done || told != 1 || told_result != ncclSuccess) FAIL("done %d, told %d (%d)", done, told, (int)told_result);
  CHECK(topocclWorkFree(work));
  EXPECT(ncclInvalidArgument, topocclWorkFree(work));
  for (int i = 0; i < COUNT; i++)
    if (buf[i] != (float)(n * (n + 1) / 2)) FAIL("all-reduce: element %d is %g", i, buf[i]);

  /* Tags: rank 1 sends tags 1, 2, 3; rank 0 takes them 3, 1, 2. */
  if (rank == 1) {
    for (int tag = 1; tag <= 3; tag++) {
      int64_t v[2] = {tag, tag};
      CHECK(topocclSendTagged(v, 2, ncclInt64, 0, tag, comm, NULL));
    }
  } else if (rank == 0) {
    int order[3] = {3, 1, 2};
    for (int k = 0; k < 3; k++) {
      int64_t v[2] = {0, 0};
      int from = -7;
      CHECK(topocclRecvTagged(v, 2, ncclInt64, 1, order[k], &from, comm, NULL));
      if (v[0] != order[k] || v[1] != order[k] || from != 1) FAIL("tag %d: got %lld from %d", order[k], (long long)v[0], from);
    }
  }

  /* Any source: rank 0 takes one message from every other rank, in one asynchronous group. */
  if (rank == 0) {
    int32_t got[64][4];
    int from[64];
    CHECK(ncclGroupStart());
    for (int k = 0; k < n - 1; k++) {
      from[k] = -7;
      CHECK(topocclRecvTagged(got[k], 4, ncclInt32, TOPOCCL_ANY_SOURCE, 9, &from[k], comm, NULL));
    }
    CHECK(topocclGroupEndAsync(&work));
    CHECK(topocclWorkWait(work, 30000));
    CHECK(topocclWorkFree(work));
    int seen = 0;
    for (int k = 0; k < n - 1; k++) {
      if (from[k] < 1 || from[k] >= n) FAIL("receive %d came from rank %d", k, from[k]);
      for (int i = 0; i < 4; i++)
        if (got[k][i] != from[k] * 100 + i) FAIL("receive %d from %d: element %d is %d", k, from[k], i, got[k][i]);
      seen |= 1 << from[k];
    }
    if (seen != ((1 << n) - 2)) FAIL("senders seen: %#x", seen);
  } else {
    int32_t mine[4];
    for (int i = 0; i < 4; i++) mine[i] = rank * 100 + i;
    CHECK(topocclSendTagged(mine, 4, ncclInt32, 0, 9, comm, NULL));
  }

  /* Refused, with a message: a tag out of range, any source for a send or for ncclRecv. */
  int32_t one = 0;
  EXPECT(ncclInvalidArgument, topocclSendTagged(&one, 1, ncclInt32, 0, TOPOCCL_MAX_TAG + 1, comm, NULL));
  EXPECT(ncclInvalidArgument, topocclSendTagged(&one, 1, ncclInt32, TOPOCCL_ANY_SOURCE, 0, comm, NULL));
  EXPECT(ncclInvalidArgument, ncclRecv(&one, 1, ncclInt32, TOPOCCL_ANY_SOURCE, comm, NULL));

  /* Still in step. */
  CHECK(ncclAllReduce(buf, buf, 1, ncclFloat32, ncclSum, comm, NULL));
  CHECK(ncclCommDestroy(comm));
  free(buf);
  if (rank == 0) printf("extension: %d ranks\n", n);
}

int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 3;
  if (n < 2 || n > 16) FAIL("2 to 16 ranks");
  return run_ranks(n, body) ? 1 : 0;
}
