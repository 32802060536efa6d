// fox/embedding.cuh: the token embedding (no positional embedding) and its backward, which sums each token's
// rows in a fixed order from buckets of positions built on the host (deterministic, no atomics).
// Measurements and the variants tried: dev/cuda/NOTES.md, section "Index: the notes of each product kernel".
#ifndef FOX_EMBEDDING_CUH
#define FOX_EMBEDDING_CUH

#include <stdint.h>         // uint64_t
#include "cuda_common.cuh"  // FOX_LAUNCH_CHECK

// Paper: x_0 = the token embedding (no positional embedding; docs/model.md §1). CPU: embedding_forward.
__global__ void embedding_forward_kernel(float *out, const int *tokens, const float *wte, int N, int D) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * D) return;
    size_t n = i / D, d = i % D;
    out[i] = wte[(size_t)tokens[n] * D + d];
}

// dwte[token] += Σ dres over the token's positions, in position order. Tokens come bucketed on the host
// (buckets: token at 0, start at N, pos at 2N + 1; bucket b is token[b] at positions pos[start[b] ..
// start[b+1]), the largest first), so no two blocks touch one row and no atomics are needed. A block takes
// EMB_BWD_COLS columns of one bucket, EMB_BWD_LOADS of its rows' loads in flight, added in order: a frequent
// token's sum (hundreds of rows in a batch) is a chain of latencies, not of adds.
// CPU: embedding_backward.
#define EMB_BWD_COLS 128
#define EMB_BWD_LOADS 16
__global__ void __launch_bounds__(EMB_BWD_COLS)
    embedding_backward_kernel(float *dwte, const float *__restrict__ dres, const int *__restrict__ buckets, int N, int D) {
    const int b = blockIdx.x, d = blockIdx.y * EMB_BWD_COLS + threadIdx.x;
    if (d >= D) return;
    const int *start = buckets + N, *pos = start + N + 1;
    const int j1 = start[b + 1];
    int j = start[b];
    float acc = 0.0f;
    for (; j + EMB_BWD_LOADS <= j1; j += EMB_BWD_LOADS) {
        float x[EMB_BWD_LOADS];
#pragma unroll
        for (int k = 0; k < EMB_BWD_LOADS; k++) x[k] = dres[(size_t)pos[j + k] * D + d];
#pragma unroll
        for (int k = 0; k < EMB_BWD_LOADS; k++) acc += x[k];
    }
    for (; j < j1; j++) acc += dres[(size_t)pos[j] * D + d];
    dwte[(size_t)buckets[b] * D + d] += acc;
}

static inline int fox_bucket_key_order(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

// The tables embedding_backward_kernel reads, on the host, for N token ids of a V-token vocabulary: tables (3N + 1
// ints) gets token at 0, start at N, pos at 2N + 1; bucket b is token[b] at positions pos[start[b] .. start[b+1])
// in ascending order, the buckets largest first (their blocks start first), ties by token id. Scratch: count and
// fill (V ints), key (N). Returns the number of buckets.
static inline int fox_embedding_buckets(int *tables, uint64_t *key, int *count, int *fill, const int *inputs, int N,
                                        int V) {
    int *token = tables, *start = tables + N, *pos = start + N + 1, nb = 0, at = 0;
    memset(count, 0, (size_t)V * sizeof(int));
    for (int n = 0; n < N; n++) count[inputs[n]]++;
    for (int v = 0; v < V; v++)
        if (count[v]) key[nb++] = (uint64_t)(N - count[v]) << 32 | (uint64_t)v;
    qsort(key, (size_t)nb, sizeof(uint64_t), fox_bucket_key_order);
    for (int b = 0; b < nb; b++) {
        int v = (int)(key[b] & 0xFFFFFFFFu);
        token[b] = v;
        start[b] = at;
        fill[v] = at;
        at += count[v];
    }
    start[nb] = N;
    for (int n = 0; n < N; n++) pos[fill[inputs[n]]++] = n;
    return nb;
}

static inline void fox_embedding_backward(float *dwte, const float *dres, const int *buckets, int nb, int N, int D,
                                          cudaStream_t st) {
    dim3 grid(nb, (D + EMB_BWD_COLS - 1) / EMB_BWD_COLS);
    embedding_backward_kernel<<<grid, EMB_BWD_COLS, 0, st>>>(dwte, dres, buckets, N, D);
    FOX_LAUNCH_CHECK();
}

#endif  // FOX_EMBEDDING_CUH
