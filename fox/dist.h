// fox/dist.h: the processes of a data-parallel run. Built with FOX_MPI, ranks come from the launcher
// (mpirun, or srun) and these reductions go through MPI; started without a launcher, or built without
// MPI, there is one rank, MPI is never initialised, and these are no-ops.
#ifndef FOX_DIST_H
#define FOX_DIST_H

#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#ifdef FOX_MPI
#define OMPI_SKIP_MPICXX 1  // the C API only, also from C++ (train_fox.cu)
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif
#include "io.h"

typedef struct {
    int rank, world;              // this process among all
    int local_rank, local_world;  // ... among those of its node (a GPU trainer takes GPU local_rank)
    int node, nodes;              // its node, numbered in the order of their lowest ranks, and how many
} Dist;

// Whether a launcher started this process: Open MPI's mpirun, PMI (MPICH's hydra, Slurm) or PMIx.
static inline int dist_launched(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

// The node's ranks are those that share memory with this one (MPI's notion of a node, the launcher's: Open MPI's
// hostfile entries, Slurm's nodes); nodes are numbered by their lowest rank.
static inline void dist_init(Dist *d, int *argc, char ***argv) {
    d->rank = d->local_rank = d->node = 0;
    d->world = d->local_world = d->nodes = 1;
#ifdef FOX_MPI
    if (!dist_launched()) return;
    int provided = 0;  // the main thread alone calls MPI; OpenMP's and the collective timeout's threads never do
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) fox_fatal("MPI_Init_thread failed");
    if (provided < MPI_THREAD_FUNNELED) fox_fatal("this MPI gives no MPI_THREAD_FUNNELED (threads beside the one calling MPI)");
    if (MPI_Comm_rank(MPI_COMM_WORLD, &d->rank) != MPI_SUCCESS || MPI_Comm_size(MPI_COMM_WORLD, &d->world) != MPI_SUCCESS)
        fox_fatal("MPI_Comm_rank/size failed");
    MPI_Comm node;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, d->rank, MPI_INFO_NULL, &node) != MPI_SUCCESS ||
        MPI_Comm_rank(node, &d->local_rank) != MPI_SUCCESS || MPI_Comm_size(node, &d->local_world) != MPI_SUCCESS)
        fox_fatal("MPI_Comm_split_type (the ranks of this node) failed");
    int first = d->local_rank == 0, before = 0;
    if (MPI_Exscan(&first, &before, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS ||
        MPI_Allreduce(&first, &d->nodes, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS)
        fox_fatal("MPI_Exscan/MPI_Allreduce (numbering the nodes) failed");
    d->node = d->rank == 0 ? 0 : before;  // MPI_Exscan leaves rank 0's result undefined
    if (MPI_Bcast(&d->node, 1, MPI_INT, 0, node) != MPI_SUCCESS || MPI_Comm_free(&node) != MPI_SUCCESS)
        fox_fatal("MPI_Bcast (numbering the nodes) failed");
#else
    (void)argc;
    (void)argv;
#endif
}

// Every rank's n bytes at mine, in rank order, at all (world * n bytes) on every rank.
static inline void dist_allgather(const Dist *d, const void *mine, size_t n, void *all) {
#ifdef FOX_MPI
    if (d->world > 1) {
        if (MPI_Allgather(mine, (int)n, MPI_BYTE, all, (int)n, MPI_BYTE, MPI_COMM_WORLD) != MPI_SUCCESS) fox_fatal("MPI_Allgather failed");
        return;
    }
#endif
    (void)d;
    memcpy(all, mine, n);
}

// Rank root's n bytes at p, to every rank.
static inline void dist_broadcast(const Dist *d, void *p, size_t n, int root) {
#ifdef FOX_MPI
    if (d->world > 1 && MPI_Bcast(p, (int)n, MPI_BYTE, root, MPI_COMM_WORLD) != MPI_SUCCESS) fox_fatal("MPI_Bcast failed");
#else
    (void)d; (void)p; (void)n; (void)root;
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

// Maximum of x over ranks, in place.
static inline void dist_allreduce_max_f64(const Dist *d, double *x, size_t n) {
#ifdef FOX_MPI
    if (d->world > 1 && MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD) != MPI_SUCCESS)
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
    int on = 0;
    if (MPI_Initialized(&on) == MPI_SUCCESS && on) MPI_Finalize();
#endif
}

#endif
