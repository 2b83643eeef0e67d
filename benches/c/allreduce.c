/* All-reduce time through the C ABI (libnccl.so.2), for comparison with collbench, which
 * calls the Rust API: the difference is what the C boundary costs.
 * usage: allreduce NRANKS BYTES... ; prints "bytes us" per size (mean over ranks of rank 0). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nccl.h"

#define CHECK(c) do { ncclResult_t r_ = (c); if (r_ != ncclSuccess) { fprintf(stderr, "%s: %s\n", #c, ncclGetLastError(NULL)); exit(1); } } while (0)

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char** argv) {
  if (argc < 3) { fprintf(stderr, "usage: %s NRANKS BYTES...\n", argv[0]); return 2; }
  int n = atoi(argv[1]);
  int fds[2];
  if (pipe(fds) != 0) return 1;
  ncclUniqueId id;
  CHECK(ncclGetUniqueId(&id));
  for (int r = 0; r < n; r++) {
    if (fork() != 0) continue;
    ncclComm_t comm;
    CHECK(ncclCommInitRank(&comm, n, id, r));
    for (int a = 2; a < argc; a++) {
      size_t bytes = strtoull(argv[a], NULL, 10), count = bytes / 4;
      float* s = calloc(count, 4);
      float* d = calloc(count, 4);
      int iters = bytes <= 65536 ? 2000 : bytes <= (1 << 20) ? 200 : 20;
      for (int w = 0; w < 5; w++) CHECK(ncclAllReduce(s, d, count, ncclFloat32, ncclSum, comm, NULL));
      double t0 = now();
      for (int i = 0; i < iters; i++) CHECK(ncclAllReduce(s, d, count, ncclFloat32, ncclSum, comm, NULL));
      double us = (now() - t0) / iters * 1e6, sum = 0;
      CHECK(ncclAllReduce(&us, &sum, 1, ncclFloat64, ncclSum, comm, NULL));
      if (r == 0) printf("%zu %.2f\n", bytes, sum / n);
      free(s);
      free(d);
    }
    CHECK(ncclCommDestroy(comm));
    fflush(stdout);
    _exit(0);
  }
  int failed = 0;
  for (int r = 0; r < n; r++) {
    int st;
    wait(&st);
    failed += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  return failed != 0;
}
