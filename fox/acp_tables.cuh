// fox/acp_tables.cuh: Adaptive Computation Pruning's tables on the GPU: for each query block the first live key
// block (fox/acp.h's bound and threshold; under the document mask never before the query's document, and from the
// mask alone without a forget gate), for each key block the last query block that reads it (the attention
// kernels' hooks), and the live tiles counted per head.
// Measurements and the variants tried: dev/cuda/NOTES.md, section "Index: the notes of each product kernel".
#ifndef FOX_ACP_TABLES_CUH
#define FOX_ACP_TABLES_CUH

#include "cuda_common.cuh"  // FOX_LAUNCH_CHECK, bf16, warp_max
#include "acp.h"            // fox_acp_blocks, fox_acp_threshold, fox_acp_bound_*, fox_acp_first_live, fox_acp_live_tiles

// ACP tables (fox/acp.h) of one attention call, one block per (b, h): U from the QK-norm weights (qw, kw;
// wstride 0 when shared) or, with qw NULL, from the largest q and k norms of the sequence; then kv_first[m]
// for every query block (a binary search each), at least doc_first[b·nblk + m] under the document mask
// (fox_doc_first_blocks: the key blocks before the document of the query block's first row are dead,
// docs/model.md §1.8), then a running max, so the staircase is monotone even where the fp32 scan of c is
// not; and q_last[n] = the last query block m with kv_first[m] <= n. c NULL: no forget gate, so no
// threshold (kv_first = doc_first alone; q, k, qw, kw unread); doc_first NULL: no document mask (c must
// not be NULL then). live (may be NULL) gains the number of live tiles (an integer sum: the same every run).
#define ACP_THREADS 256

// ACP paper §3 (docs/model.md §1.5). CPU: acp_tables.
__global__ void __launch_bounds__(ACP_THREADS) acp_tables_kernel(int *kv_first, int *q_last, unsigned long long *live,
                                                                 const float *c, const bf16 *q, const bf16 *k,
                                                                 const float *qw, const float *kw, int wstride,
                                                                 const int *doc_first, int H, int T, int dh) {
    extern __shared__ int kf[];  // (nblk)
    __shared__ float red[2][ACP_THREADS / 32];
    int bh = blockIdx.x, b = bh / H, h = bh % H, tid = threadIdx.x, nblk = fox_acp_blocks(T);
    if (c) {  // the threshold's staircase (every thread of the block takes this branch, or none)
        float mq = 0.0f, mk = 0.0f;
        if (qw) {
            for (int i = tid; i < dh; i += ACP_THREADS) {
                mq = fmaxf(mq, fabsf(qw[h * wstride + i]));
                mk = fmaxf(mk, fabsf(kw[h * wstride + i]));
            }
        } else {
            const bf16 *qh = q + (size_t)bh * T * dh, *kh = k + (size_t)bh * T * dh;
            for (int t = tid; t < T; t += ACP_THREADS) {
                float q2 = 0.0f, k2 = 0.0f;
                for (int i = 0; i < dh; i++) {
                    float a = __bfloat162float(qh[(size_t)t * dh + i]), b2 = __bfloat162float(kh[(size_t)t * dh + i]);
                    q2 += a * a;
                    k2 += b2 * b2;
                }
                mq = fmaxf(mq, q2);
                mk = fmaxf(mk, k2);
            }
        }
        mq = warp_max(mq);
        mk = warp_max(mk);
        if (tid % 32 == 0) {
            red[0][tid / 32] = mq;
            red[1][tid / 32] = mk;
        }
        __syncthreads();
        for (int w = 0; w < ACP_THREADS / 32; w++) {
            mq = fmaxf(mq, red[0][w]);
            mk = fmaxf(mk, red[1][w]);
        }
        double U = qw ? fox_acp_bound_qknorm(mq, mk, dh) : fox_acp_bound_norms(mq, mk, dh), delta = fox_acp_threshold(U, T);
        const float *ch = c + (size_t)bh * T;
        for (int m = tid; m < nblk; m += ACP_THREADS) kf[m] = fox_acp_first_live(ch, T, m, delta);
    } else {
        for (int m = tid; m < nblk; m += ACP_THREADS) kf[m] = 0;
    }
    if (doc_first)  // the same thread wrote kf[m] above
        for (int m = tid; m < nblk; m += ACP_THREADS) kf[m] = max(kf[m], doc_first[(size_t)b * nblk + m]);
    __syncthreads();
    if (tid == 0) {
        for (int m = 1; m < nblk; m++) kf[m] = max(kf[m], kf[m - 1]);
        if (live) atomicAdd(live + h, (unsigned long long)fox_acp_live_tiles(kf, nblk));
    }
    __syncthreads();
    for (int m = tid; m < nblk; m += ACP_THREADS) {
        kv_first[(size_t)bh * nblk + m] = kf[m];
        int lo = m, hi = nblk - 1;  // key block n = m: the last query block keeping it (kf[m] <= m)
        while (lo < hi) {
            int mid = (lo + hi + 1) / 2;
            if (kf[mid] <= m) lo = mid;
            else hi = mid - 1;
        }
        q_last[(size_t)bh * nblk + m] = lo;
    }
}

// The ACP tables of B·H (b, h) rows of T positions (above): c NULL for no forget gate, doc_first (B, nblk) or
// NULL for no document mask; at least one of the two. live: NULL, or H counters, live[h] += head h's live
// tiles summed over the batch (fox_acp_live_tiles).
static inline void fox_acp_tables(int *kv_first, int *q_last, unsigned long long *live, const float *c, const bf16 *q,
                                  const bf16 *k, const float *qw, const float *kw, int wstride, const int *doc_first, int B,
                                  int H, int T, int dh, cudaStream_t s) {
    acp_tables_kernel<<<B * H, ACP_THREADS, fox_acp_blocks(T) * sizeof(int), s>>>(kv_first, q_last, live, c, q, k, qw,
                                                                                 kw, wstride, doc_first, H, T, dh);
    FOX_LAUNCH_CHECK();
}

#endif  // FOX_ACP_TABLES_CUH
