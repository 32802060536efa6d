// fox/acp.h: Adaptive Computation Pruning (docs/model.md §1; ACP paper §3), the one definition both trainers use.
// Attention runs on a grid of FOX_ACP_BLOCK x FOX_ACP_BLOCK tiles (query block m, key block n <= m). The
// decay bias c_i - c_j of tile (m, n) is at most c[first row of m] - c[last column of n]; when that is
// below delta = -2U - ln T + ln eps (U >= |q.k|/sqrt(d_h), eps = e^-10) every attention weight of the tile
// is below eps/T of the row's largest, so the tile is skipped. c (cumulative log f) never increases,
// so the live key blocks of query block m are n in [first_live(m), m] and first_live never decreases:
// a staircase, stored as kv_first[m] (forward, dQ) and q_last[n], the last query block that keeps key
// block n (dK, dV).
#ifndef FOX_ACP_H
#define FOX_ACP_H

#include <math.h>

#define FOX_ACP_BLOCK 128
#define FOX_ACP_LOG_EPS (-10.0)

#ifndef FOX_ACP_REAL
#define FOX_ACP_REAL float
#endif

#ifdef __CUDACC__
#define FOX_ACP_HD __host__ __device__
#else
#define FOX_ACP_HD
#endif

static inline FOX_ACP_HD int fox_acp_blocks(int T) { return (T + FOX_ACP_BLOCK - 1) / FOX_ACP_BLOCK; }

// Tiles of one sequence and head's causal grid (n <= m), all of them computed without ACP.
static inline FOX_ACP_HD long long fox_acp_tiles(int T) { return (long long)fox_acp_blocks(T) * (fox_acp_blocks(T) + 1) / 2; }

static inline FOX_ACP_HD double fox_acp_threshold(double U, int T) { return -2.0 * U - log((double)T) + FOX_ACP_LOG_EPS; }

// U from the QK-norm weights of one head (docs/model.md §1.5: max|g_q| max|g_k| sqrt(d_h), q and k being RMS-normed).
static inline FOX_ACP_HD double fox_acp_bound_qknorm(double max_abs_gq, double max_abs_gk, int dh) {
    return max_abs_gq * max_abs_gk * sqrt((double)dh);
}

// U without QK-norm: max ||q|| max ||k|| / sqrt(d_h) over the sequence (Cauchy-Schwarz).
static inline FOX_ACP_HD double fox_acp_bound_norms(double max_q2, double max_k2, int dh) {
    return sqrt(max_q2) * sqrt(max_k2) / sqrt((double)dh);
}

// The first live key block of query block m for the sequence's c (T values): a binary search, liveness
// being monotone in n; the diagonal block is always live. c's number type is FOX_ACP_REAL: float, or
// double in the float64 build of the CPU trainer (which defines it before including this header).
static inline FOX_ACP_HD int fox_acp_first_live(const FOX_ACP_REAL *c, int T, int m, double delta) {
    double top = (double)c[m * FOX_ACP_BLOCK];
    int lo = 0, hi = m;  // the answer is in [lo, hi]
    while (lo < hi) {
        int mid = (lo + hi) / 2, last = mid * FOX_ACP_BLOCK + FOX_ACP_BLOCK - 1;
        if (top - (double)c[last < T ? last : T - 1] >= delta) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

// The tiles one (sequence, head)'s staircase computes: query block m takes key blocks kv_first[m]..m. Both
// trainers count ACP's live tiles per (layer, head) with it (the step log's per-head pruned fractions).
static inline FOX_ACP_HD long long fox_acp_live_tiles(const int *kv_first, int nblk) {
    long long n = 0;
    for (int m = 0; m < nblk; m++) n += m - kv_first[m] + 1;
    return n;
}

// Decoding (docs/model.md §7): the first cached key a query at position t reads. Keys j < t+1 with
// c_t - c_j < delta weigh less than eps/(t+1) of the largest (delta from fox_acp_threshold with T = t+1
// and U from the QK-norm weights or from |q_t| and the largest cached |k_j|); c never increases, so they
// are a prefix, found by binary search. The key at t itself is always read.
static inline FOX_ACP_HD int fox_acp_first_key(const FOX_ACP_REAL *c, int t, double delta) {
    double top = (double)c[t];
    int lo = 0, hi = t;  // the answer is in [lo, hi]
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (top - (double)c[mid] >= delta) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

#endif
