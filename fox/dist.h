// fox/dist.h: the processes of a data-parallel run. Built with FOX_MPI (mpicc), ranks come from
// mpirun and reductions go through MPI; otherwise there is one rank and these are no-ops.
#ifndef FOX_DIST_H
#define FOX_DIST_H

#include <stddef.h>
#ifdef FOX_MPI
#include <mpi.h>
#endif
#include "io.h"

typedef struct {
    int rank, world;
} Dist;

static inline void dist_init(Dist *d, int *argc, char ***argv) {
    d->rank = 0;
    d->world = 1;
#ifdef FOX_MPI
    if (MPI_Init(argc, argv) != MPI_SUCCESS) fox_fatal("MPI_Init failed");
    if (MPI_Comm_rank(MPI_COMM_WORLD, &d->rank) != MPI_SUCCESS || MPI_Comm_size(MPI_COMM_WORLD, &d->world) != MPI_SUCCESS)
        fox_fatal("MPI_Comm_rank/size failed");
#else
    (void)argc;
    (void)argv;
#endif
}

// Sum of x over ranks, in place (an average divides by world afterwards).
static inline void dist_allreduce_sum(const Dist *d, float *x, size_t n) {
#ifdef FOX_MPI
    for (size_t at = 0; d->world > 1 && at < n;) {
        int cnt = n - at > (size_t)1 << 30 ? 1 << 30 : (int)(n - at);
        if (MPI_Allreduce(MPI_IN_PLACE, x + at, cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS)
            fox_fatal("MPI_Allreduce failed");
        at += (size_t)cnt;
    }
#else
    (void)d; (void)x; (void)n;
#endif
}

static inline void dist_allreduce_sum_f64(const Dist *d, double *x, size_t n) {
#ifdef FOX_MPI
    if (d->world > 1 && MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS)
        fox_fatal("MPI_Allreduce failed");
#else
    (void)d; (void)x; (void)n;
#endif
}

static inline void dist_barrier(const Dist *d) {
#ifdef FOX_MPI
    if (d->world > 1 && MPI_Barrier(MPI_COMM_WORLD) != MPI_SUCCESS) fox_fatal("MPI_Barrier failed");
#else
    (void)d;
#endif
}

static inline void dist_finalize(void) {
#ifdef FOX_MPI
    MPI_Finalize();
#endif
}

#endif
