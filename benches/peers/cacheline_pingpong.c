/* The floor of a small message between two processes on this machine: a word in shared memory
 * handed back and forth (each side spins until the other has written, then writes), ROUNDS
 * times after a warm-up. Prints "one-way ns" (half a round trip) and, for comparison with the
 * peer programs, the same in microseconds. No library, no framing: what any shared-memory
 * protocol pays at least per message.
 *
 *   cc -O2 -o pingpong benches/peers/cacheline_pingpong.c && ./pingpong [ROUNDS] */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct line {
  _Alignas(64) atomic_ulong v;
};

static void play(struct line* mine, struct line* theirs, unsigned long rounds, int first) {
  for (unsigned long i = 1; i <= rounds; i++) {
    if (first) {
      atomic_store_explicit(&mine->v, i, memory_order_release);
      while (atomic_load_explicit(&theirs->v, memory_order_acquire) != i) __builtin_ia32_pause();
    } else {
      while (atomic_load_explicit(&theirs->v, memory_order_acquire) != i) __builtin_ia32_pause();
      atomic_store_explicit(&mine->v, i, memory_order_release);
    }
  }
}

int main(int argc, char** argv) {
  unsigned long rounds = argc > 1 ? strtoul(argv[1], NULL, 10) : 2000000;
  struct line* l = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (l == MAP_FAILED) return 1;
  struct line *a = &l[0], *b = &l[1];
  pid_t p = fork();
  if (p < 0) return 1;
  if (p == 0) {
    play(b, a, rounds + rounds / 10, 0);
    _exit(0);
  }
  play(a, b, rounds / 10, 1); /* warm-up */
  /* Both sides count on from the warm-up: the child expects rounds/10 + 1 next. */
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (unsigned long i = rounds / 10 + 1; i <= rounds + rounds / 10; i++) {
    atomic_store_explicit(&a->v, i, memory_order_release);
    while (atomic_load_explicit(&b->v, memory_order_acquire) != i) __builtin_ia32_pause();
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  waitpid(p, NULL, 0);
  double ns = ((double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec)) / (double)rounds / 2;
  printf("one-way %.0f ns (%.3f us) over %lu round trips\n", ns, ns / 1000, rounds);
  return 0;
}
