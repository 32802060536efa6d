// fox/fam.cuh: TransformerFAM's attention on the GPU (docs/model.md §1.10; FAM paper §2, Algorithm 2) beside the
// Forgetting Attention kernel, which computes every token's block sliding window (BSWA) unchanged, through the
// kv_first / q_last staircase of fam_window_tables. What the kernel does not see is here:
// - the tokens' read of their block's memory F_τ (M keys, bias c_i − c_{τK−1}), merged into the window's output by
//   log-sum-exp (fam_token_memory_forward), and its backward (dq into the attention backward's fp32 accumulator,
//   the dc terms into its row and column sums, before the reverse scan to d log f);
// - the memory update: F_τ's M queries over [F_τ's M keys, block τ's K tokens] (bias c_{τK+K−1} − c_key), and the
//   prompt's M queries over its own M keys (no bias), forward and backward;
// - generation's decode step: a query over its window of the KV cache and its memory (fam_decode_attention).
// One warp per query row (its lanes over 32 keys at a time, an online softmax; an update's query splits its keys
// over a block's warps) or, for the keys' gradients, a warp per key (its lanes over 32 queries at a time, the
// tokens' through shared memory); SIMT fp32 on bf16 operands. Every sum runs in a fixed order, no atomics.
// Layouts: token q, k, v (B, H, T, dh), o and dO (B, T, H, dh), c and lse (B, H, T), as fox/attention.cuh; a memory
// state's q, k, v (B, H, M, dh) and its o, dO (B, M, H, dh) (rows of D = H·dh), lse (B, H, M); the states of a
// layer one after the other. dev/cuda/fam.cu checks the kernels against a double-precision loop and times them.
// Measurements and the variants tried: dev/cuda/NOTES.md, section "Index: the notes of each product kernel".
#ifndef FOX_FAM_CUH
#define FOX_FAM_CUH

#include <math.h>
#include "cuda_common.cuh"  // FOX_LAUNCH_CHECK, bf16, warp_sum, warp_max
#include "rows.cuh"         // FOX_WARPS, warp_index, warp_blocks
#include "acp.h"            // FOX_ACP_BLOCK: the attention kernel's tile grid the window is cut on
#include "config.h"         // FoxConfig
#include "attention_traits.cuh"  // dq_acc_rows, dq_acc_offset: the attention backward's dq accumulator

// The shapes the kernels share: B sequences of T tokens, H heads of dh, blocks of K tokens, memories of M rows.
typedef struct {
    int B, H, T, dh, K, M;
    float scale;  // 1/√dh
} FamDims;

// Why train_fox cannot run config c's TransformerFAM, or NULL: the window must be whole tiles of the attention
// kernel, so that BSWA is a staircase of its 128 x 128 tiles (fam_window_tables).
static inline const char *fam_unsupported(const FoxConfig *cfg) {
    if (cfg->fam_block % FOX_ACP_BLOCK)
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

// acc[e] += Σ_{jj < cnt} w_jj · row jj's element lane + 32e (rows ld apart, w_jj lane jj's w): the weighted sum of a
// chunk's rows, 8 rows' loads in flight at a time (a loop of dependent loads would wait for each).
template <int PL>
__device__ __forceinline__ void fam_accumulate_rows(float acc[PL], float w, const bf16 *rows, size_t ld, int cnt, int lane) {
    for (int j0 = 0; j0 < cnt; j0 += 8) {
#pragma unroll
        for (int u = 0; u < 8; u++) {
            int jj = j0 + u;
            float wj = __shfl_sync(0xffffffffu, w, jj & 31);
            if (jj < cnt) {
#pragma unroll
                for (int e = 0; e < PL; e++) acc[e] += wj * __bfloat162float(rows[(size_t)jj * ld + lane + 32 * e]);
            }
        }
    }
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
        fam_accumulate_rows<PL>(r.acc, p, v + (size_t)j0 * dh, dh, cnt, lane);
        r.mx = mn;
    }
}

// The c a memory carries as keys at block τ: that of the token before the block (docs/model.md §1.10), 0 for F_0.
__device__ __forceinline__ float fam_c_memory(const float *ch, int tau, int K) { return ch && tau ? ch[tau * K - 1] : 0.0f; }

// ---------------------------------------------------------------------------------------------
// The tokens' read of their memory, merged with the window's attention.

// Query i of sequence b, head h (one warp's, w = (b·H + h)·T + i, the row of q, lse, D) and its block τ's memory:
// fo, where F_τ's M keys of (b, h) start; bias = c_i − c_{τK−1}, the decay bias of every memory key (0 without c).
typedef struct {
    size_t fo;
    int i, b, h;
    float bias;
} FamQuery;

__device__ __forceinline__ FamQuery fam_query(const FamDims &d, const float *c, size_t w, int dh) {
    FamQuery fq;
    const size_t bh = w / d.T;
    fq.i = (int)(w % d.T);
    fq.b = (int)(bh / d.H);
    fq.h = (int)(bh % d.H);
    const int tau = fq.i / d.K;
    fq.fo = (((size_t)tau * d.B + fq.b) * d.H + fq.h) * d.M * dh;
    const float *ch = c ? c + bh * d.T : NULL;
    fq.bias = ch ? ch[fq.i] - fam_c_memory(ch, tau, d.K) : 0.0f;
    return fq;
}

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
    const FamQuery fq = fam_query(d, c, w, dh);
    fam_stage<PL>(qs[wid], q + w * dh, lane);
    __syncwarp();
    FamRow<PL> r = fam_row_start<PL>();
    fam_row_keys<PL>(r, qs[wid], kF + fq.fo, vF + fq.fo, d.M, NULL, 0.0f, fq.bias, d.scale, lane);
    float lw = lse[w], lm = r.mx + logf(r.l), mx = fmaxf(lw, lm), ew = expf(lw - mx), em = expf(lm - mx);
    float tot = ew + em, fw = ew / tot, fm = em / tot / r.l;
    bf16 *orow = o + (((size_t)fq.b * d.T + fq.i) * d.H + fq.h) * dh;
#pragma unroll
    for (int e = 0; e < PL; e++)
        orow[lane + 32 * e] = __float2bfloat16(fw * __bfloat162float(orow[lane + 32 * e]) + fm * r.acc[e]);
    if (lane == 0) lse[w] = mx + logf(tot);
}

// The backward of one query over keys 0..n−1 (rows dh apart), its q and dO in shared memory, lse li, D = dO·o:
// dq += Σ_j ds_j k_j (unscaled), returns Σ_j ds_j; the bias as in fam_row_keys.
template <int PL>
__device__ __forceinline__ float fam_row_keys_backward(float dq[PL], const float *qs, const float *gs, const bf16 *k,
                                                       const bf16 *v, int n, const float *ck, float cq, float bias,
                                                       float li, float Di, float scale, int lane) {
    const int dh = 32 * PL;
    float sum = 0.0f;
    for (int j0 = 0; j0 < n; j0 += 32) {
        int j = j0 + lane, cnt = min(32, n - j0);
        float ds = 0.0f;
        if (j < n) {
            float sc = fam_dot<PL>(qs, k + (size_t)j * dh) * scale + (ck ? cq - ck[j] : bias);
            ds = expf(sc - li) * (fam_dot<PL>(gs, v + (size_t)j * dh) - Di);
        }
        sum += warp_sum(ds);
        fam_accumulate_rows<PL>(dq, ds, k + (size_t)j0 * dh, dh, cnt, lane);
    }
    return sum;
}

// Backward, queries: with the merged lse and D_i = dO_i·o_i (the attention backward's), p_m = exp(s_m − lse_i),
// ds_m = p_m (dO_i·v_m − D_i): dq_acc_i += Σ_m ds_m k_m (unscaled, in the attention backward's accumulator), and
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
    const FamQuery fq = fam_query(d, c, w, dh);
    fam_stage<PL>(qs[wid], q + w * dh, lane);
    fam_stage<PL>(gs[wid], d_o + (((size_t)fq.b * d.T + fq.i) * d.H + fq.h) * dh, lane);
    __syncwarp();
    float dq[PL] = {};
    float dsum = fam_row_keys_backward<PL>(dq, qs[wid], gs[wid], kF + fq.fo, vF + fq.fo, d.M, NULL, 0.0f, fq.bias, lse[w],
                                           Dg[w], d.scale, lane);
    float *acc = dq_acc + (w / d.T) * fox_attn::dq_acc_rows(d.T) * dh;  // this (b, h)'s rows
#pragma unroll
    for (int e = 0; e < PL; e++) acc[fox_attn::dq_acc_offset(fq.i, lane + 32 * e, dh)] += dq[e];
    if (lane == 0 && dc) {
        dc[w] += dsum;
        ds_rows[w] = dsum;
    }
}

// Backward, keys: dF_k = scale Σ_i ds_i q_i and dF_v = Σ_i p_i dO_i over block τ's K queries (written, fp32), for
// F_τ's memory keys m, FAM_KPW per warp, FOX_WARPS·FAM_KPW per block (grid (τ, b·h, key group)). The queries come
// 32 at a time through shared memory, transposed (a lane reads its query's column, then every lane a row: both
// without bank conflicts through the padding of 33). Then with c the memory's c (that of token τK − 1) pays the
// column term: colsum[τK − 1] −= Σ_i ds_rows_i (the first warp of the first key group).
#define FAM_KPW 2

template <int PL>
__global__ void fam_token_memory_backward_kv_kernel(float *dFk, float *dFv, float *colsum, const float *ds_rows,
                                                    const bf16 *q, const bf16 *kF, const bf16 *vF, const bf16 *d_o,
                                                    const float *lse, const float *Dg, const float *c, FamDims d) {
    constexpr int dh = 32 * PL;
    __shared__ float qt[dh][33], gt[dh][33], tl[32], tD[32], tb[32];
    __shared__ bf16 ks[FOX_WARPS][FAM_KPW][dh], vs[FOX_WARPS][FAM_KPW][dh];  // bf16: under 48 KiB in all at dh 128
    const int lane = threadIdx.x % 32, wid = threadIdx.x / 32, tau = blockIdx.x;
    const size_t bh = blockIdx.y, b = bh / d.H, h = bh % d.H, t0 = (size_t)tau * d.K;
    const float *ch = c ? c + bh * d.T : NULL;
    const float cm = fam_c_memory(ch, tau, d.K);
    const size_t fo = (((size_t)tau * d.B + b) * d.H + h) * d.M * dh;
    const int m0 = (blockIdx.z * FOX_WARPS + wid) * FAM_KPW;
    for (int kk = 0; kk < FAM_KPW; kk++)
#pragma unroll
        for (int e = 0; e < PL; e++) {
            bool ok = m0 + kk < d.M;
            ks[wid][kk][lane + 32 * e] = ok ? kF[fo + (size_t)(m0 + kk) * dh + lane + 32 * e] : __float2bfloat16(0.0f);
            vs[wid][kk][lane + 32 * e] = ok ? vF[fo + (size_t)(m0 + kk) * dh + lane + 32 * e] : __float2bfloat16(0.0f);
        }
    float dk[FAM_KPW][PL] = {}, dv[FAM_KPW][PL] = {};
    for (int i0 = 0; i0 < d.K; i0 += 32) {
        __syncthreads();  // the last tile is consumed
        for (int x = threadIdx.x; x < 32 * dh; x += blockDim.x) {
            int ii = x / dh, e = x % dh;
            size_t r = t0 + i0 + ii;
            qt[e][ii] = __bfloat162float(q[(bh * d.T + r) * dh + e]);
            gt[e][ii] = __bfloat162float(d_o[((b * d.T + r) * d.H + h) * dh + e]);
        }
        if (threadIdx.x < 32) {
            size_t r = t0 + i0 + threadIdx.x;
            tl[threadIdx.x] = lse[bh * d.T + r];
            tD[threadIdx.x] = Dg[bh * d.T + r];
            tb[threadIdx.x] = ch ? ch[r] - cm : 0.0f;
        }
        __syncthreads();
        float s[FAM_KPW] = {}, dp[FAM_KPW] = {};
#pragma unroll 8
        for (int e = 0; e < dh; e++) {
            float qe = qt[e][lane], ge = gt[e][lane];
#pragma unroll
            for (int kk = 0; kk < FAM_KPW; kk++) {
                s[kk] += qe * __bfloat162float(ks[wid][kk][e]);
                dp[kk] += ge * __bfloat162float(vs[wid][kk][e]);
            }
        }
        float p[FAM_KPW], ds[FAM_KPW];
#pragma unroll
        for (int kk = 0; kk < FAM_KPW; kk++) {
            p[kk] = expf(s[kk] * d.scale + tb[lane] - tl[lane]);
            ds[kk] = p[kk] * (dp[kk] - tD[lane]);
        }
        for (int ii = 0; ii < 32; ii++) {
#pragma unroll
            for (int kk = 0; kk < FAM_KPW; kk++) {
                float di = __shfl_sync(0xffffffffu, ds[kk], ii), pi = __shfl_sync(0xffffffffu, p[kk], ii);
#pragma unroll
                for (int e = 0; e < PL; e++) {
                    dk[kk][e] += di * qt[lane + 32 * e][ii];
                    dv[kk][e] += pi * gt[lane + 32 * e][ii];
                }
            }
        }
    }
    for (int kk = 0; kk < FAM_KPW; kk++)
        if (m0 + kk < d.M)
#pragma unroll
            for (int e = 0; e < PL; e++) {
                dFk[fo + (size_t)(m0 + kk) * dh + lane + 32 * e] = d.scale * dk[kk][e];
                dFv[fo + (size_t)(m0 + kk) * dh + lane + 32 * e] = dv[kk][e];
            }
    if (blockIdx.z == 0 && wid == 0 && ch && tau > 0) {
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
// and block τ of the tokens' k, v. One block per (b, h, query): warp w takes the block's tokens [w·K/8, (w+1)·K/8)
// (and warp 0 the memory's keys first), then warp 0 merges the warps' softmax states in order. CPU: fam_attend_head.
template <int PL>
__global__ void fam_update_forward_kernel(bf16 *oF, float *lseF, const bf16 *qF, const bf16 *kF, const bf16 *vF,
                                          const bf16 *k, const bf16 *v, const float *c, FamDims d, int tau) {
    __shared__ float qs[32 * PL], pmx[FOX_WARPS], pl[FOX_WARPS], pacc[FOX_WARPS][32 * PL];
    const int dh = 32 * PL, lane = threadIdx.x % 32, wid = threadIdx.x / 32;
    const size_t w = blockIdx.x, bh = w / d.M;
    const int mq = (int)(w % d.M), b = (int)(bh / d.H), h = (int)(bh % d.H);
    for (int i = threadIdx.x; i < dh; i += blockDim.x) qs[i] = __bfloat162float(qF[w * dh + i]);
    __syncthreads();
    const float *ch = c ? c + bh * d.T : NULL;
    float cq = ch ? ch[tau * d.K + d.K - 1] : 0.0f;
    FamRow<PL> r = fam_row_start<PL>();
    if (wid == 0)
        fam_row_keys<PL>(r, qs, kF + bh * d.M * dh, vF + bh * d.M * dh, d.M, NULL, 0.0f, cq - fam_c_memory(ch, tau, d.K),
                         d.scale, lane);
    if (k) {
        int per = d.K / FOX_WARPS, t = tau * d.K + wid * per;
        size_t t0 = bh * d.T + t;
        fam_row_keys<PL>(r, qs, k + t0 * dh, v + t0 * dh, per, ch ? ch + t : NULL, cq, 0.0f, d.scale, lane);
    }
    if (lane == 0) {
        pmx[wid] = r.mx;
        pl[wid] = r.l;
    }
#pragma unroll
    for (int e = 0; e < PL; e++) pacc[wid][lane + 32 * e] = r.acc[e];
    __syncthreads();
    if (wid) return;
    float mx = pmx[0], l = 0.0f, acc[PL] = {};
    for (int x = 1; x < FOX_WARPS; x++) mx = fmaxf(mx, pmx[x]);
    for (int x = 0; x < FOX_WARPS; x++) {
        float f = expf(pmx[x] - mx);  // 0 for a warp without keys (−inf)
        l += pl[x] * f;
#pragma unroll
        for (int e = 0; e < PL; e++) acc[e] += pacc[x][lane + 32 * e] * f;
    }
    bf16 *orow = oF + (((size_t)b * d.M + mq) * d.H + h) * dh;
#pragma unroll
    for (int e = 0; e < PL; e++) orow[lane + 32 * e] = __float2bfloat16(acc[e] / l);
    if (lane == 0) lseF[w] = mx + logf(l);
}

// Backward, queries: dqF (bf16, (B, H, M, dh), scale included) and per query rows3 = (D, Σ ds over the memory's
// keys, Σ ds over all keys), D = dO·o. One block per (b, h, query), its keys split over the warps as in the
// forward, the warps' sums added in order. CPU: fam_attend_head_backward.
template <int PL>
__global__ void fam_update_backward_q_kernel(bf16 *dqF, float *rows3, const bf16 *qF, const bf16 *kF, const bf16 *vF,
                                             const bf16 *oF, const bf16 *doF, const float *lseF, const bf16 *k,
                                             const bf16 *v, const float *c, FamDims d, int tau) {
    __shared__ float qs[32 * PL], gs[32 * PL], pdq[FOX_WARPS][32 * PL], psum[FOX_WARPS], Ds;
    const int dh = 32 * PL, lane = threadIdx.x % 32, wid = threadIdx.x / 32;
    const size_t w = blockIdx.x, bh = w / d.M;
    const int mq = (int)(w % d.M), b = (int)(bh / d.H), h = (int)(bh % d.H);
    const size_t orow = (((size_t)b * d.M + mq) * d.H + h) * dh;
    for (int i = threadIdx.x; i < dh; i += blockDim.x) {
        qs[i] = __bfloat162float(qF[w * dh + i]);
        gs[i] = __bfloat162float(doF[orow + i]);
    }
    if (wid == 0) {
        float x = 0.0f;
#pragma unroll
        for (int e = 0; e < PL; e++) x += __bfloat162float(doF[orow + lane + 32 * e]) * __bfloat162float(oF[orow + lane + 32 * e]);
        x = warp_sum(x);
        if (lane == 0) Ds = x;
    }
    __syncthreads();
    const float *ch = c ? c + bh * d.T : NULL;
    float cq = ch ? ch[tau * d.K + d.K - 1] : 0.0f, li = lseF[w], Di = Ds, dq[PL] = {}, smem = 0.0f, sblk = 0.0f;
    if (wid == 0)
        smem = fam_row_keys_backward<PL>(dq, qs, gs, kF + bh * d.M * dh, vF + bh * d.M * dh, d.M, NULL, 0.0f,
                                         cq - fam_c_memory(ch, tau, d.K), li, Di, d.scale, lane);
    if (k) {
        int per = d.K / FOX_WARPS, t = tau * d.K + wid * per;
        size_t t0 = bh * d.T + t;
        sblk = fam_row_keys_backward<PL>(dq, qs, gs, k + t0 * dh, v + t0 * dh, per, ch ? ch + t : NULL, cq, 0.0f, li, Di,
                                         d.scale, lane);
    }
#pragma unroll
    for (int e = 0; e < PL; e++) pdq[wid][lane + 32 * e] = dq[e];
    if (lane == 0) psum[wid] = sblk;
    __syncthreads();
    if (wid) return;
    float tot[PL] = {}, all = smem;
    for (int x = 0; x < FOX_WARPS; x++) {
        all += psum[x];
#pragma unroll
        for (int e = 0; e < PL; e++) tot[e] += pdq[x][lane + 32 * e];
    }
#pragma unroll
    for (int e = 0; e < PL; e++) dqF[w * dh + lane + 32 * e] = __float2bfloat16(d.scale * tot[e]);
    if (lane == 0) {
        rows3[3 * w] = Di;
        rows3[3 * w + 1] = smem;
        rows3[3 * w + 2] = all;
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
        fam_accumulate_rows<PL>(gk, ds, qF + (bh * d.M + m0) * dh, dh, cnt, lane);
        fam_accumulate_rows<PL>(gv, p, doF + ((b * d.M + m0) * d.H + h) * dh, (size_t)d.H * dh, cnt, lane);
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
// Generation (docs/model.md §1.10): a decode step's query at position t = *pos (device memory, so that one CUDA
// graph serves every step) of block τ = t/K over its memory F_τ's M keys (bias c_t − c_{τK−1}) and the cached
// window [max(0, (τ − W)K), t] (bias c_t − c_j), one online softmax: the query row of fam_token_memory_forward
// and of the window together. One warp per (b, h). q, o (B, H, dh); the cache's k, v (B, H, max_len, dh) and c
// (B, H, max_len) or NULL (transformer-fam: no bias); the memory's kF, vF (B, H, M, dh). d.T: the cache's
// max_len. CPU: fam_decode_attention.
template <int PL>
__global__ void fam_decode_attention_kernel(bf16 *o, const bf16 *q, const bf16 *k, const bf16 *v, const float *c,
                                            const bf16 *kF, const bf16 *vF, FamDims d, int W, const int *pos) {
    __shared__ float qs[FOX_WARPS][32 * PL];
    const int dh = 32 * PL, lane = threadIdx.x % 32, wid = threadIdx.x / 32;
    size_t bh = warp_index();
    if (bh >= (size_t)d.B * d.H) return;
    const int t = *pos, tau = t / d.K, lo = tau > W ? (tau - W) * d.K : 0;
    fam_stage<PL>(qs[wid], q + bh * dh, lane);
    __syncwarp();
    const float *ch = c ? c + bh * d.T : NULL;
    const float ct = ch ? ch[t] : 0.0f;
    FamRow<PL> r = fam_row_start<PL>();
    fam_row_keys<PL>(r, qs[wid], kF + bh * d.M * dh, vF + bh * d.M * dh, d.M, NULL, 0.0f, ct - fam_c_memory(ch, tau, d.K),
                     d.scale, lane);
    size_t w0 = bh * d.T + lo;
    fam_row_keys<PL>(r, qs[wid], k + w0 * dh, v + w0 * dh, t + 1 - lo, ch ? ch + lo : NULL, ct, 0.0f, d.scale, lane);
#pragma unroll
    for (int e = 0; e < PL; e++) o[bh * dh + lane + 32 * e] = __float2bfloat16(r.acc[e] / r.l);
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
    dim3 keys(d.T / d.K, d.B * d.H, (d.M + FOX_WARPS * FAM_KPW - 1) / (FOX_WARPS * FAM_KPW));
    FAM_LAUNCH(fam_token_memory_backward_kv_kernel, keys, d.dh, s, dFk, dFv, colsum, ds_rows, q, kF, vF, d_o, lse, Dg, c, d);
}

// The update of state τ (or the prompt: k, v, c NULL).
static inline void fam_update_forward(bf16 *oF, float *lseF, const bf16 *qF, const bf16 *kF, const bf16 *vF,
                                      const bf16 *k, const bf16 *v, const float *c, FamDims d, int tau, cudaStream_t s) {
    FAM_LAUNCH(fam_update_forward_kernel, (unsigned)(d.B * d.H * d.M), d.dh, s, oF, lseF, qF, kF, vF, k, v, c, d,
               tau);
}

// Its backward: dqF (bf16); dFk, dFv (fp32, +=); the tokens' dk, dv (bf16, +=) and dc, colsum (with c); rows3:
// (B, H, M, 3) scratch.
static inline void fam_update_backward(bf16 *dqF, float *dFk, float *dFv, bf16 *dk, bf16 *dv, float *dc, float *colsum,
                                       float *rows3, const bf16 *qF, const bf16 *kF, const bf16 *vF, const bf16 *oF,
                                       const bf16 *doF, const float *lseF, const bf16 *k, const bf16 *v, const float *c,
                                       FamDims d, int tau, cudaStream_t s) {
    FAM_LAUNCH(fam_update_backward_q_kernel, (unsigned)(d.B * d.H * d.M), d.dh, s, dqF, rows3, qF, kF, vF, oF, doF,
               lseF, k, v, c, d, tau);
    FAM_LAUNCH(fam_update_backward_kv_kernel, warp_blocks((size_t)d.B * d.H * (d.M + (k ? d.K : 0))), d.dh, s, dFk, dFv, dk,
               dv, dc, colsum, rows3, qF, kF, vF, doF, lseF, k, v, c, d, tau);
}

// A decode step's attention (above); d.T = the cache's max_len, W the window in blocks.
static inline void fam_decode_attention(bf16 *o, const bf16 *q, const bf16 *k, const bf16 *v, const float *c,
                                        const bf16 *kF, const bf16 *vF, FamDims d, int W, const int *pos, cudaStream_t s) {
    FAM_LAUNCH(fam_decode_attention_kernel, warp_blocks((size_t)d.B * d.H), d.dh, s, o, q, k, v, c, kF, vF, d, W, pos);
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
