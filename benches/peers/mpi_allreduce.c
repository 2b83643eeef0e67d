/* Open MPI's all-reduce, swept like examples/allreduce_sweep.rs (same sizes, iterations,
 * timing and output) so benches/peers/run.sh can compare them line by line. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static size_t iterations(size_t bytes) {
    size_t it = (64u << 20) / (bytes ? bytes : 1);
    return it < 5 ? 5 : it > 500 ? 500 : it;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    size_t min = argc > 1 ? strtoull(argv[1], 0, 10) : 8;
    size_t max = argc > 2 ? strtoull(argv[2], 0, 10) : 64u << 20;
    size_t factor = argc > 3 ? strtoull(argv[3], 0, 10) : 4;
    /* Warm up for 300 ms (rank 0 decides; an all-reduce waits for every rank), as the other
       programs do. */
    double t0 = MPI_Wtime();
    for (int go = 1; go;) {
        int mine = rank == 0 ? MPI_Wtime() - t0 < 0.3 : 0;
        MPI_Allreduce(&mine, &go, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    }
    for (size_t bytes = min; bytes <= max; bytes *= factor) {
        size_t count = bytes / 4 ? bytes / 4 : 1;
        float *send = malloc(count * 4), *recv = malloc(count * 4);
        for (size_t i = 0; i < count; i++) send[i] = 1.0f;
        size_t iters = iterations(count * 4), warm = iters / 10 > 2 ? iters / 10 : 2;
        for (size_t i = 0; i < warm; i++) MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        double t = MPI_Wtime();
        for (size_t i = 0; i < iters; i++) MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double us = (MPI_Wtime() - t) * 1e6 / iters;
        if (recv[0] != (float)n) { fprintf(stderr, "wrong result\n"); return 1; }
        if (rank == 0) {
            double algbw = count * 4 / us / 1e3;
            printf("%zu %.2f %.3f %.3f\n", count * 4, us, algbw, algbw * 2.0 * (n - 1) / n);
            fflush(stdout);
        }
        free(send); free(recv);
    }
    MPI_Finalize();
    return 0;
}
