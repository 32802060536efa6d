// fox/fam.cuh: TransformerFAM's attention on the GPU (docs/model.md §1.10; FAM paper §2, Algorithm 2) beside the
// Forgetting Attention kernel, which computes every token's block sliding window (BSWA) unchanged, through the
// kv_first / q_last staircase of fam_window_tables. What the kernel does not see is here:
// - the tokens' read of their block's memory F_τ (M keys, bias c_i − c_{τK−1}), merged into the window's output by
//   log-sum-exp (fam_token_memory_forward), and its backward (dq into the attention backward's fp32 accumulator,
//   the dc terms into its row and column sums, before the reverse scan to d log f);
// - the memory update: F_τ's M queries over [F_τ's M keys, block τ's K tokens] (bias c_{τK+K−1} − c_key), and the
//   prompt's M queries over its own M keys (no bias), forward and backward.
// One warp per query row (its lanes over 32 keys at a time, an online softmax) or, for the keys' gradients, one
// warp per key row (its lanes over 32 queries at a time); every sum runs in a fixed order, no atomics.
// Layouts: token q, k, v (B, H, T, dh), o and dO (B, T, H, dh), c and lse (B, H, T), as fox/attention.cuh; a memory
// state's q, k, v (B, H, M, dh) and its o, dO (B, M, H, dh) (rows of D = H·dh), lse (B, H, M); the states of a
// layer one after the other. dev/cuda/fam.cu checks the kernels against a double-precision loop and times them.
#ifndef FOX_FAM_CUH
#define FOX_FAM_CUH

#include <math.h>
#include "cuda_common.cuh"  // FOX_LAUNCH_CHECK, bf16, warp_sum, warp_max
#include "kernels.cuh"      // FOX_WARPS, warp_index, warp_blocks
#include "acp.h"            // FOX_ACP_BLOCK: the attention kernel's tile grid the window is cut on
#include "config.h"         // FoxConfig

// The shapes the kernels share: B sequences of T tokens, H heads of dh, blocks of K tokens, memories of M rows.
typedef struct {
    int B, H, T, dh, K, M;
    float scale;  // 1/√dh
} FamDims;

// Why train_fox cannot run config c's TransformerFAM, or NULL: the window must be whole tiles of the attention
// kernel, so that BSWA is a staircase of its 128 x 128 tiles (fam_window_tables).
static inline const char *fam_unsupported(const FoxConfig *c) {
    if (c->fam_block % FOX_ACP_BLOCK)
        return "train_fox runs TransformerFAM with --fam-block a multiple of 128 (its window is whole 128 x 128 tiles "
               "of the attention kernel); train_fox_cpu takes any block";
    return NULL;
}

// BSWA (FAM paper eq. 1) as the attention kernel's staircase (fox/acp.h's format, B·H rows of nblk = T/128): query
// tile m, in block τ = m·128/K, reads key tiles from max(0, τ − W)·K/128 on; key tile n, in block σ, is read up to
// the last tile of block σ + W. Host arrays.
static inline void fam_window_tables(int *kv_first, int *q_last, int B, int H, int T, int K, int W) {
    int nblk = fox_acp_blocks(T), per = K / FOX_ACP_BLOCK;
    for (int r = 0; r < B * H; r++)
        for (int n = 0; n < nblk; n++) {
            int tau = n / per, first = tau - W > 0 ? (tau - W) * per : 0, last = (tau + W + 1) * per - 1;
            kv_first[(size_t)r * nblk + n] = first;
            q_last[(size_t)r * nblk + n] = last < nblk - 1 ? last : nblk - 1;
        }
}

// x · row for x in shared memory (fp32, dh = 32·PL, all lanes reading the same address) and a bf16 row of dh.
template <int PL>
__device__ __forceinline__ float fam_dot(const float *x, const bf16 *row) {
    const uint4 *r = reinterpret_cast<const uint4 *>(row);
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < 4 * PL; i++) {
        uint4 u = r[i];
        const __nv_bfloat162 *p = reinterpret_cast<const __nv_bfloat162 *>(&u);
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float2 f = __bfloat1622float2(p[e]);
            acc += x[8 * i + 2 * e] * f.x + x[8 * i + 2 * e + 1] * f.y;
        }
    }
    return acc;
}

// A bf16 row of dh into the warp's shared-memory row (fp32); the caller syncs the warp.
template <int PL>
__device__ __forceinline__ void fam_stage(float *xs, const bf16 *row, int lane) {
#pragma unroll
    for (int e = 0; e < PL; e++) xs[lane + 32 * e] = __bfloat162float(row[lane + 32 * e]);
}

// One query's online softmax over keys fed 32 at a time: the running maximum score, Σ exp(s − mx), and the lane's
// PL dimensions of Σ exp(s − mx) v.
template <int PL> struct FamRow {
    float mx, l, acc[PL];
};

template <int PL>
__device__ __forceinline__ FamRow<PL> fam_row_start() {
    FamRow<PL> r;
    r.mx = -INFINITY;
    r.l = 0.0f;
#pragma unroll
    for (int e = 0; e < PL; e++) r.acc[e] = 0.0f;
    return r;
}

// Adds keys 0..n−1 (rows dh apart in k, v) to the query qs (shared memory): s_j = scale q·k_j + bias, or with ck,
// + cq − ck[j] (FoX's c_query − c_key).
template <int PL>
__device__ __forceinline__ void fam_row_keys(FamRow<PL> &r, const float *qs, const bf16 *k, const bf16 *v, int n,
                                             const float *ck, float cq, float bias, float scale, int lane) {
    const int dh = 32 * PL;
    for (int j0 = 0; j0 < n; j0 += 32) {
        int j = j0 + lane, cnt = min(32, n - j0);
        float s = j < n ? fam_dot<PL>(qs, k + (size_t)j * dh) * scale + (ck ? cq - ck[j] : bias) : -INFINITY;
        float mn = fmaxf(r.mx, warp_max(s)), rescale = expf(r.mx - mn), p = j < n ? expf(s - mn) : 0.0f;
        r.l = r.l * rescale + warp_sum(p);
#pragma unroll
        for (int e = 0; e < PL; e++) r.acc[e] *= rescale;
        for (int jj = 0; jj < cnt; jj++) {
            float pj = __shfl_sync(0xffffffffu, p, jj);
            const bf16 *vj = v + (size_t)(j0 + jj) * dh;
#pragma unroll
            for (int e = 0; e < PL; e++) r.acc[e] += pj * __bfloat162float(vj[lane + 32 * e]);
        }
        r.mx = mn;
    }
}

// The c a memory carries as keys at block τ: that of the token before the block (docs/model.md §1.10), 0 for F_0.
__device__ __forceinline__ float fam_c_memory(const float *ch, int tau, int K) { return ch && tau ? ch[tau * K - 1] : 0.0f; }

// ---------------------------------------------------------------------------------------------
// The tokens' read of their memory, merged with the window's attention.

// Query i of block τ over F_τ's M keys (bias c_i − c_{τK−1}), then o, lse ← the log-sum-exp merge of that and the
// window's o, lse (already in o, lse): lse = log(e^lse_w + e^lse_m), o = e^(lse_w − lse) o_w + e^(lse_m − lse) o_m.
// One warp per (b, h, i). kF, vF: the layer's memory states. CPU: fam_token_attention.
template <int PL>
__global__ void fam_token_memory_forward_kernel(bf16 *o, float *lse, const bf16 *q, const bf16 *kF, const bf16 *vF,
                                                const float *c, FamDims d) {
    __shared__ float qs[FOX_WARPS][32 * PL];
    const int dh = 32 * PL, lane = threadIdx.x % 32, wid = threadIdx.x / 32;
    size_t w = warp_index();
    if (w >= (size_t)d.B * d.H * d.T) return;
    size_t bh = w / d.T;
    int i = (int)(w % d.T), b = (int)(bh / d.H), h = (int)(bh % d.H), tau = i / d.K;
    fam_stage<PL>(qs[wid], q + w * dh, lane);
    __syncwarp();
    const float *ch = c ? c + bh * d.T : NULL;
    float bias = ch ? ch[i] - fam_c_memory(ch, tau, d.K) : 0.0f;
    size_t fo = (((size_t)tau * d.B + b) * d.H + h) * d.M * dh;
    FamRow<PL> r = fam_row_start<PL>();
    fam_row_keys<PL>(r, qs[wid], kF + fo, vF + fo, d.M, NULL, 0.0f, bias, d.scale, lane);
    float lw = lse[w], lm = r.mx + logf(r.l), mx = fmaxf(lw, lm), ew = expf(lw - mx), em = expf(lm - mx);
    float tot = ew + em, fw = ew / tot, fm = em / tot / r.l;
    bf16 *orow = o + (((size_t)b * d.T + i) * d.H + h) * dh;
#pragma unroll
    for (int e = 0; e < PL; e++)
        orow[lane + 32 * e] = __float2bfloat16(fw * __bfloat162float(orow[lane + 32 * e]) + fm * r.acc[e]);
    if (lane == 0) lse[w] = mx + logf(tot);
}

// Backward, queries: with the merged lse and D_i = dO_i·o_i (the attention backward's), p_m = exp(s_m − lse_i),
// ds_m = p_m (dO_i·v_m − D_i): dq_acc_i += Σ_m ds_m k_m (unscaled, as the attention backward's accumulator), and
// with c: dc_i += Σ_m ds_m (a row sum), ds_rows_i = the same (for the memory's column term). CPU:
// fam_token_attention_backward.
template <int PL>
__global__ void fam_token_memory_backward_q_kernel(float *dq_acc, float *dc, float *ds_rows, const bf16 *q,
                                                   const bf16 *kF, const bf16 *vF, const bf16 *d_o, const float *lse,
                                                   const float *Dg, const float *c, FamDims d) {
    __shared__ float qs[FOX_WARPS][32 * PL], gs[FOX_WARPS][32 * PL];
    const int dh = 32 * PL, lane = threadIdx.x % 32, wid = threadIdx.x / 32;
    size_t w = warp_index();
    if (w >= (size_t)d.B * d.H * d.T) return;
    size_t bh = w / d.T;
    int i = (int)(w % d.T), b = (int)(bh / d.H), h = (int)(bh % d.H), tau = i / d.K;
    fam_stage<PL>(qs[wid], q + w * dh, lane);
    fam_stage<PL>(gs[wid], d_o + (((size_t)b * d.T + i) * d.H + h) * dh, lane);
    __syncwarp();
    const float *ch = c ? c + bh * d.T : NULL;
    float bias = ch ? ch[i] - fam_c_memory(ch, tau, d.K) : 0.0f, li = lse[w], Di = Dg[w], dsum = 0.0f, dq[PL] = {};
    const bf16 *k = kF + (((size_t)tau * d.B + b) * d.H + h) * d.M * dh, *v = vF + (k - kF);
    for (int j0 = 0; j0 < d.M; j0 += 32) {
        int j = j0 + lane, cnt = min(32, d.M - j0);
        float ds = 0.0f;
        if (j < d.M) {
            float p = expf(fam_dot<PL>(qs[wid], k + (size_t)j * dh) * d.scale + bias - li);
            ds = p * (fam_dot<PL>(gs[wid], v + (size_t)j * dh) - Di);
        }
        dsum += warp_sum(ds);
        for (int jj = 0; jj < cnt; jj++) {
            float dj = __shfl_sync(0xffffffffu, ds, jj);
#pragma unroll
            for (int e = 0; e < PL; e++) dq[e] += dj * __bfloat162float(k[(size_t)(j0 + jj) * dh + lane + 32 * e]);
        }
    }
#pragma unroll
    for (int e = 0; e < PL; e++) dq_acc[w * dh + lane + 32 * e] += dq[e];
    if (lane == 0 && dc) {
        dc[w] += dsum;
        ds_rows[w] = dsum;
    }
}

// Backward, keys: one block per (τ, b, h), a warp per memory key m of F_τ: dF_k = scale Σ_i ds_i q_i and
// dF_v = Σ_i p_i dO_i over block τ's K queries (written, fp32); then with c the memory's c (that of token τK − 1)
// pays the column term: colsum[τK − 1] −= Σ_i ds_rows_i.
template <int PL>
__global__ void fam_token_memory_backward_kv_kernel(float *dFk, float *dFv, float *colsum, const float *ds_rows,
                                                    const bf16 *q, const bf16 *kF, const bf16 *vF, const bf16 *d_o,
                                                    const float *lse, const float *Dg, const float *c, FamDims d) {
    __shared__ float ks[FOX_WARPS][32 * PL], vs[FOX_WARPS][32 * PL];
    const int dh = 32 * PL, lane = threadIdx.x % 32, wid = threadIdx.x / 32, tau = blockIdx.x;
    const size_t bh = blockIdx.y, b = bh / d.H, h = bh % d.H, t0 = (size_t)tau * d.K;
    const float *ch = c ? c + bh * d.T : NULL;
    const float cm = fam_c_memory(ch, tau, d.K);
    size_t fo = (((size_t)tau * d.B + b) * d.H + h) * d.M * dh;
    for (int m = wid; m < d.M; m += FOX_WARPS) {
        fam_stage<PL>(ks[wid], kF + fo + (size_t)m * dh, lane);
        fam_stage<PL>(vs[wid], vF + fo + (size_t)m * dh, lane);
        __syncwarp();
        float dk[PL] = {}, dv[PL] = {};
        for (int i0 = 0; i0 < d.K; i0 += 32) {
            size_t i = t0 + i0 + lane, row = bh * d.T + i;
            const bf16 *gi = d_o + ((b * d.T + i) * d.H + h) * dh;
            float s = fam_dot<PL>(ks[wid], q + row * dh) * d.scale + (ch ? ch[i] - cm : 0.0f);
            float p = expf(s - lse[row]), ds = p * (fam_dot<PL>(vs[wid], gi) - Dg[row]);
            for (int ii = 0; ii < 32; ii++) {
                float di = __shfl_sync(0xffffffffu, ds, ii), pi = __shfl_sync(0xffffffffu, p, ii);
                size_t r = t0 + i0 + ii;
                const bf16 *qr = q + (bh * d.T + r) * dh, *gr = d_o + ((b * d.T + r) * d.H + h) * dh;
#pragma unroll
                for (int e = 0; e < PL; e++) {
                    dk[e] += di * __bfloat162float(qr[lane + 32 * e]);
                    dv[e] += pi * __bfloat162float(gr[lane + 32 * e]);
                }
            }
        }
#pragma unroll
        for (int e = 0; e < PL; e++) {
            dFk[fo + (size_t)m * dh + lane + 32 * e] = d.scale * dk[e];
            dFv[fo + (size_t)m * dh + lane + 32 * e] = dv[e];
        }
        __syncwarp();
    }
    if (wid == 0 && ch && tau > 0) {
        float tot = 0.0f;
        for (int i = lane; i < d.K; i += 32) tot += ds_rows[bh * d.T + t0 + i];
        tot = warp_sum(tot);
        if (lane == 0) colsum[bh * d.T + t0 - 1] -= tot;
    }
}

// ---------------------------------------------------------------------------------------------
// The memory update (and the prompt): M queries over the memory's own M keys and, unless k is NULL (the prompt),
// block τ's K tokens. The queries carry c of the block's last token, the memory's keys that of the token before
// the block (docs/model.md §1.10); c NULL: no bias.

// Forward: oF (B, M, H, dh) and lseF (B, H, M) of state τ's queries qF over kF, vF (that state's, (B, H, M, dh))
// and block τ of the tokens' k, v. One warp per (b, h, query). CPU: fam_attend_head.
template <int PL>
__global__ void fam_update_forward_kernel(bf16 *oF, float *lseF, const bf16 *qF, const bf16 *kF, const bf16 *vF,
                                          const bf16 *k, const bf16 *v, const float *c, FamDims d, int tau) {
    __shared__ float qs[FOX_WARPS][32 * PL];
    const int dh = 32 * PL, lane = threadIdx.x % 32, wid = threadIdx.x / 32;
    size_t w = warp_index();
    if (w >= (size_t)d.B * d.H * d.M) return;
    size_t bh = w / d.M;
    int mq = (int)(w % d.M), b = (int)(bh / d.H), h = (int)(bh % d.H);
    fam_stage<PL>(qs[wid], qF + w * dh, lane);
    __syncwarp();
    const float *ch = c ? c + bh * d.T : NULL;
    float cq = ch ? ch[tau * d.K + d.K - 1] : 0.0f;
    FamRow<PL> r = fam_row_start<PL>();
    fam_row_keys<PL>(r, qs[wid], kF + bh * d.M * dh, vF + bh * d.M * dh, d.M, NULL, 0.0f, cq - fam_c_memory(ch, tau, d.K),
                     d.scale, lane);
    if (k) {
        size_t t0 = bh * d.T + (size_t)tau * d.K;
        fam_row_keys<PL>(r, qs[wid], k + t0 * dh, v + t0 * dh, d.K, ch ? ch + tau * d.K : NULL, cq, 0.0f, d.scale, lane);
    }
    bf16 *orow = oF + (((size_t)b * d.M + mq) * d.H + h) * dh;
#pragma unroll
    for (int e = 0; e < PL; e++) orow[lane + 32 * e] = __float2bfloat16(r.acc[e] / r.l);
    if (lane == 0) lseF[w] = r.mx + logf(r.l);
}

// Backward, queries: dqF (bf16, (B, H, M, dh), scale included) and per query rows3 = (D, Σ ds over the memory's
// keys, Σ ds over all keys), D = dO·o. One warp per (b, h, query). CPU: fam_attend_head_backward.
template <int PL>
__global__ void fam_update_backward_q_kernel(bf16 *dqF, float *rows3, const bf16 *qF, const bf16 *kF, const bf16 *vF,
                                             const bf16 *oF, const bf16 *doF, const float *lseF, const bf16 *k,
                                             const bf16 *v, const float *c, FamDims d, int tau) {
    __shared__ float qs[FOX_WARPS][32 * PL], gs[FOX_WARPS][32 * PL];
    const int dh = 32 * PL, lane = threadIdx.x % 32, wid = threadIdx.x / 32;
    size_t w = warp_index();
    if (w >= (size_t)d.B * d.H * d.M) return;
    size_t bh = w / d.M;
    int mq = (int)(w % d.M), b = (int)(bh / d.H), h = (int)(bh % d.H);
    size_t orow = (((size_t)b * d.M + mq) * d.H + h) * dh;
    fam_stage<PL>(qs[wid], qF + w * dh, lane);
    fam_stage<PL>(gs[wid], doF + orow, lane);
    float Di = 0.0f;
#pragma unroll
    for (int e = 0; e < PL; e++) Di += __bfloat162float(doF[orow + lane + 32 * e]) * __bfloat162float(oF[orow + lane + 32 * e]);
    Di = warp_sum(Di);
    __syncwarp();
    const float *ch = c ? c + bh * d.T : NULL;
    float cq = ch ? ch[tau * d.K + d.K - 1] : 0.0f, li = lseF[w], dq[PL] = {}, sums[2] = {0.0f, 0.0f};
    size_t t0 = bh * d.T + (size_t)tau * d.K;
    for (int seg = 0; seg < 2; seg++) {  // the memory's keys, then the block's
        int n = seg ? (k ? d.K : 0) : d.M;
        if (!n) continue;
        const bf16 *ks = seg ? k + t0 * dh : kF + bh * d.M * dh, *vs = seg ? v + t0 * dh : vF + bh * d.M * dh;
        float bias = cq - fam_c_memory(ch, tau, d.K);
        for (int j0 = 0; j0 < n; j0 += 32) {
            int j = j0 + lane, cnt = min(32, n - j0);
            float ds = 0.0f;
            if (j < n) {
                float s = fam_dot<PL>(qs[wid], ks + (size_t)j * dh) * d.scale + (seg && ch ? cq - ch[tau * d.K + j] : seg ? 0.0f : bias);
                ds = expf(s - li) * (fam_dot<PL>(gs[wid], vs + (size_t)j * dh) - Di);
            }
            sums[seg] += warp_sum(ds);
            for (int jj = 0; jj < cnt; jj++) {
                float dj = __shfl_sync(0xffffffffu, ds, jj);
#pragma unroll
                for (int e = 0; e < PL; e++) dq[e] += dj * __bfloat162float(ks[(size_t)(j0 + jj) * dh + lane + 32 * e]);
            }
        }
    }
#pragma unroll
    for (int e = 0; e < PL; e++) dqF[w * dh + lane + 32 * e] = __float2bfloat16(d.scale * dq[e]);
    if (lane == 0) {
        rows3[3 * w] = Di;
        rows3[3 * w + 1] = sums[0];
        rows3[3 * w + 2] = sums[0] + sums[1];
    }
}

// Backward, keys: one warp per (b, h, key) of the M memory keys, then the K tokens of block τ: dk = scale Σ_q ds q,
// dv = Σ_q p dO over the M queries. A memory key's go into dFk, dFv (fp32, +=: the tokens' reads are there); a
// token's are added to dk, dv (bf16, the window's) and with c its column term into colsum (colsum_j −= Σ_q ds).
// With c, the warp of memory key 0 adds the queries' row term dc[τK + K − 1] += Σ ds and the memory keys' column
// term colsum[τK − 1] −= Σ ds over them (from rows3).
template <int PL>
__global__ void fam_update_backward_kv_kernel(float *dFk, float *dFv, bf16 *dk, bf16 *dv, float *dc, float *colsum,
                                              const float *rows3, const bf16 *qF, const bf16 *kF, const bf16 *vF,
                                              const bf16 *doF, const float *lseF, const bf16 *k, const bf16 *v,
                                              const float *c, FamDims d, int tau) {
    __shared__ float ks[FOX_WARPS][32 * PL], vs[FOX_WARPS][32 * PL];
    const int dh = 32 * PL, lane = threadIdx.x % 32, wid = threadIdx.x / 32, nkeys = d.M + (k ? d.K : 0);
    size_t w = warp_index();
    if (w >= (size_t)d.B * d.H * nkeys) return;
    size_t bh = w / nkeys, b = bh / d.H, h = bh % d.H;
    int j = (int)(w % nkeys), mem = j < d.M;
    size_t t = mem ? 0 : (size_t)tau * d.K + (j - d.M);  // a token key's position
    const float *ch = c ? c + bh * d.T : NULL;
    float cq = ch ? ch[tau * d.K + d.K - 1] : 0.0f, bias = cq - (mem ? fam_c_memory(ch, tau, d.K) : ch ? ch[t] : 0.0f);
    size_t krow = mem ? (bh * d.M + j) * dh : (bh * d.T + t) * dh;
    fam_stage<PL>(ks[wid], (mem ? kF : k) + krow, lane);
    fam_stage<PL>(vs[wid], (mem ? vF : v) + krow, lane);
    __syncwarp();
    float gk[PL] = {}, gv[PL] = {}, dsum = 0.0f;
    for (int m0 = 0; m0 < d.M; m0 += 32) {
        int mq = m0 + lane, cnt = min(32, d.M - m0);
        float p = 0.0f, ds = 0.0f;
        if (mq < d.M) {
            size_t qr = bh * d.M + mq;
            p = expf(fam_dot<PL>(ks[wid], qF + qr * dh) * d.scale + bias - lseF[qr]);
            ds = p * (fam_dot<PL>(vs[wid], doF + ((b * d.M + mq) * d.H + h) * dh) - rows3[3 * qr]);
        }
        dsum += warp_sum(ds);
        for (int ii = 0; ii < cnt; ii++) {
            float di = __shfl_sync(0xffffffffu, ds, ii), pi = __shfl_sync(0xffffffffu, p, ii);
            const bf16 *qr = qF + (bh * d.M + m0 + ii) * dh, *gr = doF + ((b * d.M + m0 + ii) * d.H + h) * dh;
#pragma unroll
            for (int e = 0; e < PL; e++) {
                gk[e] += di * __bfloat162float(qr[lane + 32 * e]);
                gv[e] += pi * __bfloat162float(gr[lane + 32 * e]);
            }
        }
    }
#pragma unroll
    for (int e = 0; e < PL; e++) {
        size_t x = krow + lane + 32 * e;
        if (mem) {
            dFk[x] += d.scale * gk[e];
            dFv[x] += gv[e];
        } else {
            dk[x] = __float2bfloat16(__bfloat162float(dk[x]) + d.scale * gk[e]);
            dv[x] = __float2bfloat16(__bfloat162float(dv[x]) + gv[e]);
        }
    }
    if (!ch) return;
    if (!mem && lane == 0) colsum[bh * d.T + t] -= dsum;
    if (j == 0) {
        float all = 0.0f, own = 0.0f;
        for (int mq = lane; mq < d.M; mq += 32) {
            own += rows3[3 * (bh * d.M + mq) + 1];
            all += rows3[3 * (bh * d.M + mq) + 2];
        }
        all = warp_sum(all);
        own = warp_sum(own);
        if (lane == 0) {
            dc[bh * d.T + (size_t)tau * d.K + d.K - 1] += all;
            if (tau > 0) colsum[bh * d.T + (size_t)tau * d.K - 1] -= own;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Row helpers of the memory's backward.

// out[i] (=, or += when accumulate) Σ_s in[s·n + i] over `nseq` slices in order: the gradient of F_0, which every
// sequence reads from the one prompt, and the residual's term.
__global__ void fam_sum_rows_kernel(float *out, const float *in, int nseq, size_t n, int accumulate) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float acc = accumulate ? out[i] : 0.0f;
    for (int s = 0; s < nseq; s++) acc += in[(size_t)s * n + i];
    out[i] = acc;
}

__global__ void fam_to_bf16_kernel(bf16 *out, const float *in, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __float2bfloat16(in[i]);
}

// ---------------------------------------------------------------------------------------------
// Launchers (dh 64 or 128: PL = dh / 32 = 2 or 4).

#define FAM_LAUNCH(kernel, grid, dh, s, ...)                                                          \
    do {                                                                                              \
        if ((dh) == 64) kernel<2><<<(grid), FOX_WARPS * 32, 0, (s)>>>(__VA_ARGS__);                  \
        else kernel<4><<<(grid), FOX_WARPS * 32, 0, (s)>>>(__VA_ARGS__);                             \
        FOX_LAUNCH_CHECK();                                                                           \
    } while (0)

// The tokens' memory reads merged into the window's o, lse (above).
static inline void fam_token_memory_forward(bf16 *o, float *lse, const bf16 *q, const bf16 *kF, const bf16 *vF,
                                            const float *c, FamDims d, cudaStream_t s) {
    FAM_LAUNCH(fam_token_memory_forward_kernel, warp_blocks((size_t)d.B * d.H * d.T), d.dh, s, o, lse, q, kF, vF, c, d);
}

// Their backward, between the attention backward's two halves (fox_attention_backward_keys / _finish): dq_acc, dc,
// colsum as there; dFk, dFv (the states' fp32 gradients, written); ds_rows: (B, H, T) scratch.
static inline void fam_token_memory_backward(float *dq_acc, float *dc, float *colsum, float *dFk, float *dFv,
                                             float *ds_rows, const bf16 *q, const bf16 *kF, const bf16 *vF,
                                             const bf16 *d_o, const float *lse, const float *Dg, const float *c,
                                             FamDims d, cudaStream_t s) {
    FAM_LAUNCH(fam_token_memory_backward_q_kernel, warp_blocks((size_t)d.B * d.H * d.T), d.dh, s, dq_acc, c ? dc : NULL,
               ds_rows, q, kF, vF, d_o, lse, Dg, c, d);
    FAM_LAUNCH(fam_token_memory_backward_kv_kernel, dim3(d.T / d.K, d.B * d.H), d.dh, s, dFk, dFv, colsum, ds_rows, q, kF,
               vF, d_o, lse, Dg, c, d);
}

// The update of state τ (or the prompt: k, v, c NULL).
static inline void fam_update_forward(bf16 *oF, float *lseF, const bf16 *qF, const bf16 *kF, const bf16 *vF,
                                      const bf16 *k, const bf16 *v, const float *c, FamDims d, int tau, cudaStream_t s) {
    FAM_LAUNCH(fam_update_forward_kernel, warp_blocks((size_t)d.B * d.H * d.M), d.dh, s, oF, lseF, qF, kF, vF, k, v, c, d,
               tau);
}

// Its backward: dqF (bf16); dFk, dFv (fp32, +=); the tokens' dk, dv (bf16, +=) and dc, colsum (with c); rows3:
// (B, H, M, 3) scratch.
static inline void fam_update_backward(bf16 *dqF, float *dFk, float *dFv, bf16 *dk, bf16 *dv, float *dc, float *colsum,
                                       float *rows3, const bf16 *qF, const bf16 *kF, const bf16 *vF, const bf16 *oF,
                                       const bf16 *doF, const float *lseF, const bf16 *k, const bf16 *v, const float *c,
                                       FamDims d, int tau, cudaStream_t s) {
    FAM_LAUNCH(fam_update_backward_q_kernel, warp_blocks((size_t)d.B * d.H * d.M), d.dh, s, dqF, rows3, qF, kF, vF, oF, doF,
               lseF, k, v, c, d, tau);
    FAM_LAUNCH(fam_update_backward_kv_kernel, warp_blocks((size_t)d.B * d.H * (d.M + (k ? d.K : 0))), d.dh, s, dFk, dFv, dk,
               dv, dc, colsum, rows3, qF, kF, vF, doF, lseF, k, v, c, d, tau);
}

static inline void fam_sum_rows(float *out, const float *in, int nseq, size_t n, int accumulate, cudaStream_t s) {
    fam_sum_rows_kernel<<<fox_blocks(n, 256), 256, 0, s>>>(out, in, nseq, n, accumulate);
    FOX_LAUNCH_CHECK();
}

static inline void fam_to_bf16(bf16 *out, const float *in, size_t n, cudaStream_t s) {
    fam_to_bf16_kernel<<<fox_blocks(n, 256), 256, 0, s>>>(out, in, n);
    FOX_LAUNCH_CHECK();
}

#endif  // FOX_FAM_CUH
