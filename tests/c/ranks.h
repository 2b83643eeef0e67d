/* Shared by the C ABI tests: start ranks as processes (the unique id passed through pipes) or
 * as threads of this process (passed in memory), check results, and convert test values to and
 * from every NCCL datatype. Uses only nccl.h's names, so these programs build against NVIDIA's
 * header as well as topoccl's.
 *
 * Every error message starts with TEST_WHO, a string expression a program may define before
 * including this header (say, the failing thread's rank); by default nothing. */
#ifndef TOPOCCL_TEST_RANKS_H
#define TOPOCCL_TEST_RANKS_H

#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nccl.h"

#ifndef TEST_WHO
#define TEST_WHO ""
#endif

#define CHECK(call)                                                                         \
  do {                                                                                      \
    ncclResult_t r_ = (call);                                                               \
    if (r_ != ncclSuccess) {                                                                \
      fprintf(stderr, "%s%s:%d: %s -> %d (%s): %s\n", TEST_WHO, __FILE__, __LINE__, #call,  \
              (int)r_, ncclGetErrorString(r_), ncclGetLastError(NULL));                     \
      exit(1);                                                                              \
    }                                                                                       \
  } while (0)

/* The call must fail with `want`, and say why. */
#define EXPECT(want, call)                                                                  \
  do {                                                                                      \
    ncclResult_t r_ = (call);                                                               \
    if (r_ != (want)) {                                                                     \
      fprintf(stderr, "%s%s:%d: %s -> %d, expected %d\n", TEST_WHO, __FILE__, __LINE__,     \
              #call, (int)r_, (int)(want));                                                 \
      exit(1);                                                                              \
    }                                                                                       \
    if (strlen(ncclGetLastError(NULL)) == 0) {                                              \
      fprintf(stderr, "%s%s:%d: %s failed without a message\n", TEST_WHO, __FILE__,         \
              __LINE__, #call);                                                             \
      exit(1);                                                                              \
    }                                                                                       \
  } while (0)

#define FAIL(...)                                                                           \
  do {                                                                                      \
    fprintf(stderr, "%s%s:%d: ", TEST_WHO, __FILE__, __LINE__);                             \
    fprintf(stderr, __VA_ARGS__);                                                           \
    fprintf(stderr, "\n");                                                                  \
    exit(1);                                                                                \
  } while (0)

/* Forks `nranks` processes running body(rank, nranks, id); rank 0 makes the unique id and
 * writes it into a pipe per other rank. Returns the number of ranks that failed. */
static inline int run_ranks(int nranks, void (*body)(int, int, ncclUniqueId)) {
  int pipes[64][2];
  pid_t pids[64];
  for (int r = 0; r < nranks; r++)
    if (pipe(pipes[r]) != 0) FAIL("pipe");
  for (int r = 0; r < nranks; r++) {
    pids[r] = fork();
    if (pids[r] < 0) FAIL("fork");
    if (pids[r] == 0) {
      ncclUniqueId id;
      if (r == 0) {
        CHECK(ncclGetUniqueId(&id));
        for (int o = 1; o < nranks; o++)
          if (write(pipes[o][1], &id, sizeof id) != (ssize_t)sizeof id) FAIL("write id");
      } else if (read(pipes[r][0], &id, sizeof id) != (ssize_t)sizeof id) {
        FAIL("rank %d: read id", r);
      }
      body(r, nranks, id);
      fflush(stdout);
      _exit(0);
    }
  }
  int failed = 0;
  for (int r = 0; r < nranks; r++) {
    int status = 0;
    waitpid(pids[r], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fprintf(stderr, "rank %d failed (status %d)\n", r, status);
      failed++;
    }
  }
  return failed;
}

/* Starts `nranks` threads of this process running body(rank, nranks, id), with one unique id
 * made here and handed over in memory, and waits for them all. A failing rank exits the
 * process (FAIL, CHECK): when this returns, every rank succeeded. */
struct rank_thread {
  int rank, nranks;
  ncclUniqueId id;
  void (*body)(int, int, ncclUniqueId);
};

static inline void* rank_thread_main(void* arg) {
  struct rank_thread* t = (struct rank_thread*)arg;
  t->body(t->rank, t->nranks, t->id);
  fflush(stdout);
  return NULL;
}

static inline void run_rank_threads(int nranks, void (*body)(int, int, ncclUniqueId)) {
  struct rank_thread args[64];
  pthread_t threads[64];
  ncclUniqueId id;
  if (nranks < 1 || nranks > 64) FAIL("%d ranks", nranks);
  CHECK(ncclGetUniqueId(&id));
  for (int r = 0; r < nranks; r++) {
    args[r] = (struct rank_thread){.rank = r, .nranks = nranks, .id = id, .body = body};
    if (pthread_create(&threads[r], NULL, rank_thread_main, &args[r]) != 0) FAIL("pthread_create (rank %d)", r);
  }
  for (int r = 0; r < nranks; r++)
    if (pthread_join(threads[r], NULL) != 0) FAIL("pthread_join (rank %d)", r);
}

static const ncclDataType_t ALL_TYPES[] = {ncclInt8,    ncclUint8,    ncclInt32,       ncclUint32,
                                           ncclInt64,   ncclUint64,   ncclFloat16,     ncclFloat32,
                                           ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};
#define NUM_TYPES 12

static inline int is_fp8(ncclDataType_t t) { return t == ncclFloat8e4m3 || t == ncclFloat8e5m2; }

static inline size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
  }
}

/* Halves of small integers are exact: no rounding needed either way. */
static inline uint16_t to_half(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  int exp = (int)((x >> 23) & 0xff) - 127 + 15;
  if ((x & 0x7fffffff) == 0) return (uint16_t)sign;
  return (uint16_t)(sign | ((uint32_t)exp << 10) | ((x >> 13) & 0x3ff));
}

static inline float from_half(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  int exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t x = (exp == 0 && mant == 0) ? sign : (sign | ((uint32_t)(exp - 15 + 127) << 23) | (mant << 13));
  float f;
  memcpy(&f, &x, 4);
  return f;
}

/* fp8 with `mant` mantissa bits and exponent bias `bias`, for values it holds exactly (the
 * tests' small integers). */
static inline uint8_t to_fp8(double v, int mant, int bias) {
  uint8_t sign = v < 0 ? 0x80 : 0;
  double a = v < 0 ? -v : v;
  if (a == 0) return sign;
  int e = 0;
  while (a >= 2) { a /= 2; e++; }
  while (a < 1) { a *= 2; e--; }
  return (uint8_t)(sign | ((e + bias) << mant) | (int)((a - 1) * (1 << mant)));
}

static inline double from_fp8(uint8_t b, int mant, int bias) {
  int e = (b & 0x7f) >> mant;
  double m = b & ((1 << mant) - 1);
  double a = e == 0 ? m / (1 << mant) * ((double)1 / (1 << (bias - 1)))
                    : (1 + m / (1 << mant)) * (e >= bias ? (double)(1 << (e - bias)) : 1.0 / (1 << (bias - e)));
  return b & 0x80 ? -a : a;
}

static inline void store(ncclDataType_t t, void* buf, size_t i, double v) {
  switch (t) {
    case ncclInt8: ((int8_t*)buf)[i] = (int8_t)v; break;
    case ncclUint8: ((uint8_t*)buf)[i] = (uint8_t)v; break;
    case ncclInt32: ((int32_t*)buf)[i] = (int32_t)v; break;
    case ncclUint32: ((uint32_t*)buf)[i] = (uint32_t)v; break;
    case ncclInt64: ((int64_t*)buf)[i] = (int64_t)v; break;
    case ncclUint64: ((uint64_t*)buf)[i] = (uint64_t)v; break;
    case ncclFloat16: ((uint16_t*)buf)[i] = to_half((float)v); break;
    case ncclFloat32: ((float*)buf)[i] = (float)v; break;
    case ncclFloat64: ((double*)buf)[i] = v; break;
    case ncclFloat8e4m3: ((uint8_t*)buf)[i] = to_fp8(v, 3, 7); break;
    case ncclFloat8e5m2: ((uint8_t*)buf)[i] = to_fp8(v, 2, 15); break;
    case ncclBfloat16: {
      float f = (float)v;
      uint32_t x;
      memcpy(&x, &f, 4);
      ((uint16_t*)buf)[i] = (uint16_t)(x >> 16);
      break;
    }
    default: FAIL("type %d", (int)t);
  }
}

static inline double load(ncclDataType_t t, const void* buf, size_t i) {
  switch (t) {
    case ncclInt8: return ((const int8_t*)buf)[i];
    case ncclUint8: return ((const uint8_t*)buf)[i];
    case ncclInt32: return ((const int32_t*)buf)[i];
    case ncclUint32: return ((const uint32_t*)buf)[i];
    case ncclInt64: return (double)((const int64_t*)buf)[i];
    case ncclUint64: return (double)((const uint64_t*)buf)[i];
    case ncclFloat16: return from_half(((const uint16_t*)buf)[i]);
    case ncclFloat32: return ((const float*)buf)[i];
    case ncclFloat64: return ((const double*)buf)[i];
    case ncclFloat8e4m3: return from_fp8(((const uint8_t*)buf)[i], 3, 7);
    case ncclFloat8e5m2: return from_fp8(((const uint8_t*)buf)[i], 2, 15);
    case ncclBfloat16: {
      uint32_t x = (uint32_t)((const uint16_t*)buf)[i] << 16;
      float f;
      memcpy(&f, &x, 4);
      return f;
    }
    default: FAIL("type %d", (int)t);
  }
  return 0;
}

#endif
