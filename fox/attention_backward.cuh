// fox/attention_backward.cuh: the Forgetting Attention backward, in the four forms the public API
// (fox/attention.cuh) selects: {Hopper warpgroup MMA (sm_90a), mma.sync} x {deterministic, fp32 adds in
// arrival order}, each at d_h 64 and 128. Step 1 forms D = rowsum(dO * o) (and zeroes step 2's sums), step 2
// (bwd_kernel: mma.sync; bwd_ws_kernel: Hopper) dK, dV, the fp32 dQ accumulator and the dS row and column sums, step 3
// converts dQ to bf16; steps 1 and 3 are fox/attention_passes.cuh's; the last step, dc and the reverse scan into
// d log f, is fox_attention_reverse_scan in fox/forget_gate.cuh. Other forms of step 2, with their measurements,
// are in dev/cuda/attention_backward.cu.
// Measurements and the variants tried: dev/cuda/NOTES.md, section "Index: the notes of each product kernel".
#ifndef FOX_ATTENTION_BACKWARD_CUH
#define FOX_ATTENTION_BACKWARD_CUH

#include <math.h>                     // INFINITY, sqrtf
#include <stdio.h>                    // fprintf
#include <stdlib.h>                   // exit
#include <cuda_runtime.h>             // dim3, cudaFuncSetAttribute, cudaMemsetAsync, cudaStream_t
#include <cuda_bf16.h>                // __nv_bfloat16, __nv_bfloat162
#include "acp.h"                      // FOX_ACP_BLOCK: q_last's grid
#include "cuda_common.cuh"            // FOX_CUDA_CHECK, FOX_LAUNCH_CHECK
#include "attention_primitives.cuh"   // cp.async, ldmatrix, mma.sync, wgmma, atomics, acquire / release, barriers
#include "attention_traits.cuh"       // LOG2E, NWARPS, BWD_BN, BwdCfg, BwdDetCfg, bwd_smem_bytes, bwd_ws_smem_bytes
#include "attention_order.cuh"        // BWD_CHAINS, bwd_chain_lo / _live, bwd_block_of, bwd_head_group: the order
#include "attention_passes.cuh"       // steps 1 and 3 (dot_do_o, bwd_dq), the scratch's layout (BwdSums, bwd_sums)
#include "tma.cuh"                    // tma_map_bf16_3d: the tensor maps of q, k, v, dout

namespace fox_attn {

// The cp.async loads that open a key block (step 2's kernels, when their compute warps load): its K and V (BN
// rows from k0) and the first query tile's Q and dO (BM rows from q0; dO's row stride ld_o), one commit group.
template <int DH, int BN, int BM, int NT, bool HALVES>
__device__ __forceinline__ void load_key_block_async(__nv_bfloat16 *Ks, __nv_bfloat16 *Vs, __nv_bfloat16 *Qs,
                                                     __nv_bfloat16 *dOs, const __nv_bfloat16 *kh,
                                                     const __nv_bfloat16 *vh, const __nv_bfloat16 *qh,
                                                     const __nv_bfloat16 *doh, int ld_o, int k0, int q0, int T,
                                                     int tid) {
    load_tile_async<DH, BN, NT, HALVES>(Ks, kh, DH, k0, T, tid);
    load_tile_async<DH, BN, NT, HALVES>(Vs, vh, DH, k0, T, tid);
    load_tile_async<DH, BM, NT, HALVES>(Qs, qh, DH, q0, T, tid);
    load_tile_async<DH, BM, NT, HALVES>(dOs, doh, ld_o, q0, T, tid);
    cp_async_commit();
}

// A thread's two keys of the key block from k0 (rows g and g + 8 of its warp's 16) and their gate terms
// (key_gate_log2; a key past T gets c_ref's, 0).
__device__ __forceinline__ void bwd_thread_keys(const float *ch, int k0, int warp, int g, int T, float c_ref, int &j0,
                                                int &j1, float &nb0, float &nb1) {
    j0 = k0 + warp * 16 + g, j1 = j0 + 8;
    nb0 = key_gate_log2(j0 < T ? ch[j0] : c_ref, c_ref);
    nb1 = key_gate_log2(j1 < T ? ch[j1] : c_ref, c_ref);
}

// Query row i's statistics for step 2, from the head's c (ch), lse (lh) and D (Dh): r = its term of the log2 score
// s_ij log2e / sqrt(d_h) + r + nb_j, r = (c_i - c_ref - lse_i) log2e with c_ref the key block's first gate
// (docs/model.md §1.1), and d = D_i; rows past T get r = -inf (so their P is 0) and d = 0.
__device__ __forceinline__ void bwd_row_stats(const float *ch, const float *lh, const float *Dh, int i, int T, float c_ref,
                                              float &r, float &d) {
    const bool ok = i < T;
    r = ok ? (ch[i] - c_ref) * LOG2E - lh[i] * LOG2E : -INFINITY;
    d = ok ? Dh[i] : 0.f;
}

// One score pair of the P^T / dS^T step (both step-2 kernels): keys j0, j1 (gate terms nb0, nb1) against one
// query i (row term r, D_i = d). P = 2^(s sl2 + r + nb), 0 where `mask` and the key is past the query, dS =
// P (dP - D); P and dS overwrite the scores and dP, dS is added to the keys' column sums, and the pair's dS sum
// (the query's row-sum part) is returned. The fp32 products and sums are rounded one by one (__fmul_rn,
// __fadd_rn: never contracted into an FMA), so that the row and column sums, and dc from them, have the same bits
// in every kernel form and build, whatever the compiler's scheduling.
__device__ __forceinline__ float bwd_p_ds_pair(float &s0, float &s1, float &dp0, float &dp1, float r, float d,
                                               float nb0, float nb1, float sl2, bool mask, int i, int j0, int j1,
                                               float &cs0, float &cs1) {
    float p0 = ex2(fmaf(s0, sl2, r + nb0));
    float p1 = ex2(fmaf(s1, sl2, r + nb1));
    if (mask) {
        if (j0 > i) p0 = 0.f;
        if (j1 > i) p1 = 0.f;
    }
    const float ds0 = __fmul_rn(p0, dp0 - d), ds1 = __fmul_rn(p1, dp1 - d);
    cs0 = __fadd_rn(cs0, ds0);
    cs1 = __fadd_rn(cs1, ds1);
    s0 = p0;
    s1 = p1;
    dp0 = ds0;
    dp1 = ds1;
    return __fadd_rn(ds0, ds1);
}

// S^T = K Q^T and dP^T = V dO^T of one query tile on mma.sync, into st and dpt: this warp's 16 keys from row
// 16 warp of the K / V tiles against the tile's BM queries.
template <int DH, int BM>
__device__ __forceinline__ void scores_mma_sync(float (&st)[BM / 8][4], float (&dpt)[BM / 8][4], const __nv_bfloat16 *Ks,
                                                const __nv_bfloat16 *Vs, const __nv_bfloat16 *Qb,
                                                const __nv_bfloat16 *dOb, int warp, int lane) {
#pragma unroll
    for (int i = 0; i < BM / 8; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) st[i][e] = dpt[i][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < DH / 16; kk++) {
        uint32_t ka[4], va[4];
        load_a<DH>(ka, Ks, warp * 16, kk * 16, lane);
        load_a<DH>(va, Vs, warp * 16, kk * 16, lane);
#pragma unroll
        for (int np = 0; np < BM / 16; np++) {
            uint32_t bq[4], bo[4];
            load_b_nk<DH>(bq, Qb, np * 16, kk * 16, lane);
            mma16816(st[2 * np], ka, bq[0], bq[1]);
            mma16816(st[2 * np + 1], ka, bq[2], bq[3]);
            load_b_nk<DH>(bo, dOb, np * 16, kk * 16, lane);
            mma16816(dpt[2 * np], va, bo[0], bo[1]);
            mma16816(dpt[2 * np + 1], va, bo[2], bo[3]);
        }
    }
}

// dV += P^T dO and dK += dS^T Q of one query tile on mma.sync (P^T in st, dS^T in dpt: this warp's 16 keys), and
// dS^T parked in the swizzled buffer dSb for the dQ product.
template <int DH, int BM>
__device__ __forceinline__ void dkdv_mma_sync(float (&dka)[DH / 8][4], float (&dva)[DH / 8][4], const float (&st)[BM / 8][4],
                                              const float (&dpt)[BM / 8][4], __nv_bfloat16 *dSb, const __nv_bfloat16 *Qb,
                                              const __nv_bfloat16 *dOb, int warp, int lane) {
    const int g = lane >> 2, tq = lane & 3;
#pragma unroll
    for (int kk = 0; kk < BM / 16; kk++) {
        uint32_t pa[4], sa[4];
        acc_to_a(pa, st[2 * kk], st[2 * kk + 1]);
        acc_to_a(sa, dpt[2 * kk], dpt[2 * kk + 1]);
        // sa[0] / sa[2] are dS^T row (key) g, sa[1] / sa[3] row g + 8
        const int kr = warp * 16 + g, qc = kk * 16 + 2 * tq;
        *reinterpret_cast<uint32_t *>(dSb + swz<BM>(kr, qc)) = sa[0];
        *reinterpret_cast<uint32_t *>(dSb + swz<BM>(kr + 8, qc)) = sa[1];
        *reinterpret_cast<uint32_t *>(dSb + swz<BM>(kr, qc + 8)) = sa[2];
        *reinterpret_cast<uint32_t *>(dSb + swz<BM>(kr + 8, qc + 8)) = sa[3];
#pragma unroll
        for (int np = 0; np < DH / 16; np++) {
            uint32_t bo[4], bq[4];
            load_b_kn<DH>(bo, dOb, kk * 16, np * 16, lane);
            mma16816(dva[2 * np], pa, bo[0], bo[1]);
            mma16816(dva[2 * np + 1], pa, bo[2], bo[3]);
            load_b_kn<DH>(bq, Qb, kk * 16, np * 16, lane);
            mma16816(dka[2 * np], sa, bq[0], bq[1]);
            mma16816(dka[2 * np + 1], sa, bq[2], bq[3]);
        }
    }
}

// dQ = dS K of one parked tile on mma.sync, into dqa: this warp's 16 query rows from dq_r and DQC columns from
// dq_c (A = dS from the swizzled dS^T buffer dSb of BM query columns, B = K's BWD_BN rows).
template <int DH, int BM, int DQC>
__device__ __forceinline__ void dq_tile_mma_sync(float (&dqa)[DQC / 8][4], const __nv_bfloat16 *dSb,
                                                 const __nv_bfloat16 *Ks, int dq_r, int dq_c, int lane) {
#pragma unroll
    for (int i = 0; i < DQC / 8; i++) dqa[i][0] = dqa[i][1] = dqa[i][2] = dqa[i][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < BWD_BN / 16; kk++) {
        uint32_t a[4];
        load_a_trans<BM>(a, dSb, kk * 16, dq_r, lane);
#pragma unroll
        for (int np = 0; np < DQC / 16; np++) {
            uint32_t bk[4];
            load_b_kn<DH>(bk, Ks, kk * 16, dq_c + np * 16, lane);
            mma16816(dqa[2 * np], a, bk[0], bk[1]);
            mma16816(dqa[2 * np + 1], a, bk[2], bk[3]);
        }
    }
}

// The end of step 2 for this thread's keys j0, j1 of the head at head_off: dK (scaled) and dV as bf16, and the
// dS column sums (quad-reduced, negated) into colsum.
template <int DH>
__device__ __forceinline__ void bwd_store_keys(__nv_bfloat16 *dk, __nv_bfloat16 *dv, float *colsum, size_t head_off,
                                               int j0, int j1, int T, int tq, const float (&dka)[DH / 8][4],
                                               const float (&dva)[DH / 8][4], float cs0, float cs1, float scale) {
    __nv_bfloat16 *dkh = dk + head_off * DH, *dvh = dv + head_off * DH;
#pragma unroll
    for (int nt = 0; nt < DH / 8; nt++) {
        const int col = nt * 8 + 2 * tq;
        if (j0 < T) {
            *reinterpret_cast<uint32_t *>(dkh + (size_t)j0 * DH + col) = pack_bf16(dka[nt][0] * scale, dka[nt][1] * scale);
            *reinterpret_cast<uint32_t *>(dvh + (size_t)j0 * DH + col) = pack_bf16(dva[nt][0], dva[nt][1]);
        }
        if (j1 < T) {
            *reinterpret_cast<uint32_t *>(dkh + (size_t)j1 * DH + col) = pack_bf16(dka[nt][2] * scale, dka[nt][3] * scale);
            *reinterpret_cast<uint32_t *>(dvh + (size_t)j1 * DH + col) = pack_bf16(dva[nt][2], dva[nt][3]);
        }
    }
    cs0 = quad_sum(cs0);
    cs1 = quad_sum(cs1);
    if (tq == 0) {
        if (j0 < T) colsum[head_off + j0] = -cs0;
        if (j1 < T) colsum[head_off + j1] = -cs1;
    }
}

// Key block nb's place in the add order of ACP row m within its chain [lo, hi) (bwd_chain_lo; one chain:
// [0, nblk)), the same for every query tile of the row: `before` = live key blocks of the chain above nb in the
// row (its adds wait for all of theirs; 0: nb adds first), `last` = none of the chain's live blocks is below nb.
// A row's live key blocks are contiguous, [kv_first[m], m] (fox/acp.h's staircase), and nb is one of them,
// so every block above it is live, and one below is live iff block nb - 1 is (q_last[nb - 1] >= m): O(1),
// no scan of the row on the path between two tiles' adds. Warp-uniform results.
__device__ __forceinline__ void acp_order(int m, int nb, int lo, int hi, const int *qlh, int &before, bool &last) {
    before = min(m, hi - 1) - nb;
    last = nb == lo || (qlh && qlh[nb - 1] < m);
}

// Backward, step 2: the gradients of Forgetting Attention, FoX paper Appendix E Algorithm 2 (docs/model.md
// §1.1; the CPU reference is attention_backward in train_fox.c): with P_ij = exp(s_ij - lse_i),
// dP_ij = dO_i.v_j, dS_ij = P_ij (dP_ij - D_i):
//   dq_i = scale sum_j dS_ij k_j,  dk_j = scale sum_i dS_ij q_i,  dv_j = sum_i P_ij dO_i,
//   dc_t = sum_j dS_tj - sum_i dS_it  (the paper's dc^q + dc^k).
// Block = BWD_BN keys of one (b, h); warp w owns keys 16w..16w+15 and keeps their dK, dV in registers
// while query tiles of BM rows stream through (from the diagonal to the last live one). Per tile each
// warp forms S^T and dP^T for its keys, P^T, dS^T = P^T (dP^T - D), accumulates dV += P^T dO and
// dK += dS^T Q, and parks dS^T in smem (double-buffered); in the next iteration all warps compute
// dQ = dS K for that tile and add it to the fp32 accumulator (software-pipelined: one block barrier per
// tile).
// dc: dc_t = sum_j dS_tj - sum_i dS_it. The row sum would vanish in exact arithmetic (softmax is shift
// invariant), but D is formed from the bf16-rounded o, and that rounding error e_t enters both sums:
// dc_t picks up -e_t + sum_i P_it e_i. Summed into dlogf the two parts cancel; with the column sum alone
// they random-walk (3e-2 relative error in dlogf at T = 1000). So both sums are kept, in fp32: column
// sums in registers (written to `colsum`, one writer per key), row sums reduced across the block.
//
// DET = false: the dQ and dc-row-sum adds are fp32 atomics in whatever order they land (faster; the low
// bits of dq, dc and dlogf can differ between runs).
// DET = true (deterministic): the same fp32 atomic adds (fire and forget, into a zeroed accumulator),
// issued in a fixed order, highest key block first, so each address sees the same sequence of adds every
// run. A per-tile counter `sem` orders them: the adds of key block n to a tile wait (acquire) until the
// live key blocks above n in the tile's ACP row have released the tile, and key block n releases it once
// its own adds are issued. Blocks are launched highest key block first (blockIdx.x reversed), so a block
// only ever waits on blocks launched before it (no deadlock whatever the occupancy), and block n+1
// reaches each query tile one ACP row before block n does, so the waits are short. dK, dV and the column
// sums are per-block register sums: deterministic by construction. Who keeps the order:
// - mma.sync (WARP_ORDER): every warp of key block n waits until all warps of the live key blocks above
//   have released, adds, and releases one tile later (by then its adds have landed, so the release costs
//   no wait). Staggered: half the warps do their dQ step before the tile's other work, half after, so
//   each scheduler has one warp computing while the other waits on memory.
// - warpgroup MMA (Hopper): a sync warp in a third warpgroup does all the counter work, off the compute warps'
//   path: bwd_ws_kernel below, which is also the nondeterministic Hopper backward (its order left out).
// This kernel is the mma.sync backward (sm_80, or FOX_ATTN_NO_WGMMA).
template <int DH, int BM, int MINB, bool DET>
__global__ void __launch_bounds__(NTHREADS, MINB)
bwd_kernel(const __nv_bfloat16 *__restrict__ q, const __nv_bfloat16 *__restrict__ k,
           const __nv_bfloat16 *__restrict__ v, const float *__restrict__ c,
           const __nv_bfloat16 *__restrict__ dout, const float *__restrict__ lse, const float *__restrict__ Dg,
           float *__restrict__ dq_acc, __nv_bfloat16 *__restrict__ dk,
           __nv_bfloat16 *__restrict__ dv, float *__restrict__ dc, float *__restrict__ colsum, int *__restrict__ sem,
           int H, int T, const int *__restrict__ q_last) {
    constexpr int BN = BWD_BN, TPB = FOX_ACP_BLOCK / BM;  // TPB query tiles per ACP row
    static_assert(FOX_ACP_BLOCK % BM == 0, "query tiles nest in the ACP grid");
    extern __shared__ __align__(1024) unsigned char bwd_smem[];  // 1024: the 128-byte swizzle's period
    __nv_bfloat16 *Ks = reinterpret_cast<__nv_bfloat16 *>(bwd_smem);  // [BN][DH]
    __nv_bfloat16 *Vs = Ks + BN * DH;                                   // [BN][DH]
    __nv_bfloat16 *Qs = Vs + BN * DH;                                   // [2][BM][DH]
    __nv_bfloat16 *dOs = Qs + 2 * BM * DH;                              // [2][BM][DH]
    __nv_bfloat16 *dSt = dOs + 2 * BM * DH;                             // [2][BN][BM]: dS^T
    float *rs = reinterpret_cast<float *>(dSt + 2 * BN * BM);           // [2][BM]: bwd_row_stats' r
    float *Ds = rs + 2 * BM;                                            // [2][BM]
    float *rowsum = Ds + 2 * BM;                                        // [2][NWARPS][BM]: dS row sums

    const int tid = threadIdx.x, lane = tid & 31;
    const int warp = __shfl_sync(0xffffffffu, tid >> 5, 0);  // shfl: provably warp-uniform
    const int g = lane >> 2, tq = lane & 3;
    const int nblk = gridDim.x;
    const int nb = nblk - 1 - blockIdx.x;  // key block: highest first (see above)
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const size_t head_off = (size_t)bh * T;
    const __nv_bfloat16 *qh = q + head_off * DH, *kh = k + head_off * DH, *vh = v + head_off * DH;
    const float *ch = c + head_off, *lh = lse + head_off, *Dsh = Dg + head_off;  // D_i = dO_i . o_i of this (b, h)
    const size_t ld_o = (size_t)H * DH;
    const __nv_bfloat16 *doh = dout + (size_t)b * T * ld_o + (size_t)h * DH;
    float *dqh = dq_acc + (size_t)bh * dq_acc_rows(T) * DH;  // this head's accumulator (dq_acc_offset)
    const int k0 = nb * BN;
    const float c_ref = ch[k0];

    const int nqt = (T + BM - 1) / BM;
    const int *qlh = q_last ? q_last + (size_t)bh * nblk : nullptr;
    // ACP: the diagonal tile is always live (every query row needs it), so a block covers at least it
    const int m_last = qlh ? min(nblk - 1, max(qlh[nb], nb)) : nblk - 1;
    const int qt_first = k0 / BM;
    const int qt_last = min(nqt - 1, (m_last + 1) * TPB - 1);
    const int ntiles = qt_last - qt_first + 1;
    int *semh = sem + (size_t)bh * nqt;

    constexpr bool WARP_ORDER = DET;  // every compute warp keeps the order itself (see above)

    // Loader threads tid < BM fetch per-query values; rows past T get lse = +inf so their P is 0.
    auto fetch_rows = [&](int qt, float &r, float &d) {
        if (tid < BM) bwd_row_stats(ch, lh, Dsh, qt * BM + tid, T, c_ref, r, d);
    };
    auto store_rows = [&](int buf, float r, float d) {
        if (tid < BM) {
            rs[buf * BM + tid] = r;
            Ds[buf * BM + tid] = d;
        }
    };

    load_key_block_async<DH, BN, BM, NTHREADS, false>(Ks, Vs, Qs, dOs, kh, vh, qh, doh, (int)ld_o, k0, qt_first * BM, T,
                                                      tid);
    {
        float r = 0.f, d = 0.f;
        fetch_rows(qt_first, r, d);
        store_rows(0, r, d);
    }

    int j0, j1;  // this thread's two keys
    float nb0, nb1;
    bwd_thread_keys(ch, k0, warp, g, T, c_ref, j0, j1, nb0, nb1);
    const float sl2 = LOG2E / sqrtf((float)DH);
    const float scale = 1.f / sqrtf((float)DH);

    float dka[DH / 8][4], dva[DH / 8][4];
#pragma unroll
    for (int i = 0; i < DH / 8; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) dka[i][e] = dva[i][e] = 0.f;
    float cs0 = 0.f, cs1 = 0.f;  // column sums of dS for keys j0, j1

    // dQ work split: warp owns query rows rg*16.. and DQC dh-columns of each tile.
    constexpr int RG = BM / 16, DQC = DH * RG / NWARPS;
    static_assert(DQC % 16 == 0, "dQ column split");
    const int dq_r = (warp % RG) * 16, dq_c = (warp / RG) * DQC;
    int ord_m = -1, ord_before = 0;  // ACP row of the cached order; live key blocks above nb in it
    bool ord_last = false;           // no live key block below nb in it
    int *pending = nullptr;          // counter this warp still has to release (one tile later)
    const bool early = WARP_ORDER && warp < NWARPS / 2;  // staggered: half the warps do the dQ step first
    // this block's place in the order for ACP row m (same for every tile of the row); warp-uniform
    auto ord_update = [&](int m) {
        if (m == ord_m) return;
        ord_m = m;
        acp_order(m, nb, 0, nblk, qlh, ord_before, ord_last);
    };

    // dQ = dS K of tile it-1 from its parked dS^T, added with the dc row sums to the fp32 accumulators.
    auto dq_phase = [&](int it, float (&dqa)[DQC / 8][4]) {
        const int pb = (it - 1) & 1, qt = qt_first + it - 1, i0 = qt * BM;
        dq_tile_mma_sync<DH, BM, DQC>(dqa, dSt + pb * BN * BM, Ks, dq_r, dq_c, lane);
        float rtot = 0.f;
        if (tid < BM) {
#pragma unroll
            for (int w = 0; w < NWARPS; w++) rtot += rowsum[(pb * NWARPS + w) * BM + tid];
        }
        int *sp = semh + qt;
        if constexpr (WARP_ORDER) {
            // release the previous tile (its adds were issued an iteration ago, so the fence is cheap)
            if (pending) {
                __syncwarp();
                if (lane == 0) red_release_gpu_add(pending, 1);
                pending = nullptr;
            }
            ord_update(qt / TPB);
            if (ord_before > 0) {
                const int target = NWARPS * ord_before;
                unsigned spins = 0;
                while (ld_acquire_gpu(sp) < target) {
                    __nanosleep(64);
                    if (++spins > (1u << 27)) __trap();  // a missing predecessor: fail loudly, never hang
                }
            }
        }
        // fp32 adds; deterministic: every address sees its adds in one fixed order
        const int qr0 = i0 + dq_r + g;
#pragma unroll
        for (int nt = 0; nt < DQC / 8; nt++) {
            const int col = dq_c + nt * 8 + 2 * tq;
            if (qr0 < T) atomic_add2(dqh + dq_acc_offset(qr0, col, DH), dqa[nt][0], dqa[nt][1]);
            if (qr0 + 8 < T) atomic_add2(dqh + dq_acc_offset(qr0 + 8, col, DH), dqa[nt][2], dqa[nt][3]);
        }
        if (tid < BM && i0 + tid < T) atomicAdd(dc + head_off + i0 + tid, rtot);
        if (WARP_ORDER && !ord_last) pending = sp;
    };

    // this warp's dS row sums of a tile (rsum: this thread's part) reduced over its keys, to smem buffer buf
    auto park_row_sums = [&](float (&rsum)[BM / 4], int buf) {
        warp_column_sums<BM / 4>(rsum, lane);
#pragma unroll
        for (int i = 0; i < BM / 32; i++) {
            const int cidx = g * (BM / 32) + i;
            rowsum[(buf * NWARPS + warp) * BM + (cidx >> 1) * 8 + 2 * tq + (cidx & 1)] = rsum[i];
        }
    };

    float dqp[DQC / 8][4];  // dQ of tile it-1
    for (int it = 0; it <= ntiles; it++) {
        const int buf = it & 1;
        cp_async_wait_all();
        // Q/dO/row stats of tile it ready; dS^T and row sums of tile it-1 complete
        __syncthreads();
        if (early && it > 0) dq_phase(it, dqp);
        const bool more = it + 1 < ntiles;
        float r_next = 0.f, d_next = 0.f;
        if (more) {
            const int i1 = (qt_first + it + 1) * BM;
            load_tile_async<DH, BM, NTHREADS>(Qs + (buf ^ 1) * BM * DH, qh, DH, i1, T, tid);
            load_tile_async<DH, BM, NTHREADS>(dOs + (buf ^ 1) * BM * DH, doh, (int)ld_o, i1, T, tid);
            cp_async_commit();
            fetch_rows(qt_first + it + 1, r_next, d_next);
        }
        if (it < ntiles) {
            const int i0 = (qt_first + it) * BM;
            const __nv_bfloat16 *Qb = Qs + buf * BM * DH, *dOb = dOs + buf * BM * DH;
            const float *rb = rs + buf * BM, *Db = Ds + buf * BM;
            __nv_bfloat16 *dSb = dSt + buf * BN * BM;

            float st[BM / 8][4], dpt[BM / 8][4];
            scores_mma_sync<DH, BM>(st, dpt, Ks, Vs, Qb, dOb, warp, lane);

            // P^T and dS^T in place: st <- P^T, dpt <- dS^T; rsum: this thread's part of dS row sums
            const bool diag = i0 < k0 + BN - 1;
            float rsum[BM / 4];
#pragma unroll
            for (int nt = 0; nt < BM / 8; nt++) {
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int col = nt * 8 + 2 * tq + e, i = i0 + col;
                    rsum[2 * nt + e] = bwd_p_ds_pair(st[nt][e], st[nt][2 + e], dpt[nt][e], dpt[nt][2 + e], rb[col], Db[col],
                                                     nb0, nb1, sl2, diag, i, j0, j1, cs0, cs1);
                }
            }
            dkdv_mma_sync<DH, BM>(dka, dva, st, dpt, dSb, Qb, dOb, warp, lane);
            park_row_sums(rsum, buf);
        }
        if (!early && it > 0) dq_phase(it, dqp);
        if (more) store_rows(buf ^ 1, r_next, d_next);
    }
    if (pending) {
        __syncwarp();
        if (lane == 0) red_release_gpu_add(pending, 1);
    }

    bwd_store_keys<DH>(dk, dv, colsum, head_off, j0, j1, T, tq, dka, dva, cs0, cs1, scale);
}

// Backward, step 2, on Hopper: bwd_kernel's formulation and add order (with Cfg::ORDER; without it, the
// nondeterministic API, the key blocks add in arrival order) with the five products on warpgroup MMA, in a
// warp-specialized 384-thread block. Warps 0-7 are the two compute warpgroups (64 keys each, so every
// accumulator keeps the mma.sync layout; setmaxnreg BWD_REGS_COMPUTE). K, V, Q and dO tiles are stored as
// 64-column halves (swz_halves), each a canonical 128-byte-swizzle operand: S^T and dP^T walk the halves in
// their k16 steps, dV and dK are one m64n64 product per half of dO / Q. The MMAs are pipelined across the
// tile's steps: per tile it a warpgroup commits S^T/dP^T of tile it, then dQ of tile it-1, then dV/dK of
// tile it, and waits for each only where its result is needed (S^T/dP^T before the softmax step, dQ before
// its adds, dV/dK before the next tile's barrier). At dh 128 (DQ_LATE) dQ of tile it-1 is issued after the
// softmax step instead, just before dV/dK: dK and dV hold 128 registers per thread there, and S^T, dP^T (64)
// and the dQ product (32) do not all fit beside them. The dQ issue is unconditional (at it = 0 on a zeroed
// dS^T buffer, result unused): ptxas serializes every warpgroup MMA of the kernel when the issue sits under a
// branch (C7514). The third warpgroup gives its registers back (BWD_REGS_SYNC) and holds two warps:
// - the sync warp (NWARPS) keeps the order, off the compute warps' path. The compute warps store each query
//   tile's dQ in smem, in the accumulator's order (dq_acc_offset: conflict-free float2 stores), and its dc row
//   sums, and arrive on named barrier 1; the sync warp, once it holds tile t (its acquire), has the copy engine
//   add the whole tile with one bulk reduction, adds the dc sums, hands the smem tile back (barrier 2) once the
//   engine has read it, and releases t after the reduction is complete. The compute warps never wait for the
//   order, and issue no dQ atomics. The order runs in chains (bwd_chain_lo, fox/attention_order.cuh: key blocks
//   [0, nblk/2), [nblk/2, 3 nblk/4), ...), each with its own accumulator, dc row sums and counters, highest key
//   block first within a chain; the launch order (bwd_block_of) runs the chain of the longest walks first, so
//   the longest key blocks do not come last, while a block still only waits on blocks launched before it. The
//   chain's first add to a tile (before = 0) stores it (a bulk copy) and nothing zeroes the accumulators; step 3
//   adds the chains that have a live block in the tile's row (bwd_chain_live), first to last.
// - the producer (NWARPS + 1): its lane 0 issues the bulk tensor copies (TMA) of K and V once an item, then per
//   query tile of Q and dO (each 64-column half one box, landing in the 128-byte-swizzle layout the descriptors
//   read; dO through a map [B][T][H dh] whose box starts at column h dh + 64 hf; rows past T come in as zeros),
//   and its 32 lanes load the tile's row stats (bwd_row_stats) before waiting for the stage, store them once the
//   copies are issued, and arrive on the stage's "full" mbarrier (32 arrivals + the bytes). Q, dO and the row
//   stats have 2 stages; each compute warp frees a stage ("empty", one arrival per warp) once the tile's dV / dK
//   products are complete. The compute warps issue no loads; their per-tile named barrier 0 remains (dS^T and
//   the row sums cross warpgroups).
// Persistent: one block an SM walks key blocks (items) in the launch order from a counter in the scratch, the
// producer loading the next item's K and V once every warp has read the current one's (kv_empty), under its
// dK / dV stores and the sync warp's last adds; the Q / dO stages and the dS^T buffers run on across items
// (item_at, begin_item below).
// Cfg::K_REGS (d_h 64): S^T takes K from registers (each warp's 16 keys as A fragments, loaded once a key block)
// rather than from smem at every sub-tile: 32 KB of a tile's ~350 KB of smem traffic; V for dP^T as well did
// not fit the registers (ptxas serialized the MMAs).
// Cfg::BM 128 (d_h 64; FlashAttention-3's 128 x 128 tile at d_h 64): a query tile of 128 rows is walked as two
// sub-tiles of 64 (S^T, dP^T, the softmax step and the dV / dK products of each in turn: one sub-tile's scores
// at a time fit the registers, 128 queries' did not), while the per-tile work is done once per 128 queries:
// barrier 0, the order handshake, the loads, and the dQ product, now m64n64 (warpgroup w4 the 64 queries of
// sub-tile w4, every column; dS^T stored as two 64-column halves).
// Cfg::TURNS (d_h 128): the two compute warpgroups take turns issuing their MMAs (named barriers 4 and 5, the
// forward's scheduler barrier): warpgroup w syncs on 4 + w before every issue and arrives on the other's after;
// warpgroup 1 arrives once at the start and not after its last turn, so every arrival is matched. With barrier
// 0 re-aligning the warpgroups every tile, the turns put one warpgroup's softmax under the other's products.
// The causal mask is applied on the diagonal tiles alone (the first 128 queries of a block), not tested per element
// on every tile: by a uniform branch between two copies of the P^T / dS^T loop, or (Cfg::MASK_PASS, d_h 64) by
// a pass that sets the masked scores of S^T to -inf before the one loop (ex2 gives them P = +0, the same bits as
// the select). Other forms of this kernel (without the producer, the copy engine's adds, the chains or the
// persistence; other turns and tiles) are versions 29-56 of dev/cuda/attention_backward.cu; every form gives the
// same bits.
template <int DH, class Cfg = BwdDetCfg<DH>>
__global__ void __launch_bounds__(NTHREADS + 128, 1)
bwd_ws_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
               const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
               const __nv_bfloat16 *__restrict__ q, const __nv_bfloat16 *__restrict__ k,
               const __nv_bfloat16 *__restrict__ v, const float *__restrict__ c,
               const __nv_bfloat16 *__restrict__ dout, const float *__restrict__ lse, const float *__restrict__ Dg,
               float *__restrict__ dq_acc, __nv_bfloat16 *__restrict__ dk, __nv_bfloat16 *__restrict__ dv,
               float *__restrict__ dc, float *__restrict__ dc_chains, float *__restrict__ colsum,
               int *__restrict__ sem, int *__restrict__ next_item, int H, int T, const int *__restrict__ q_last,
               int nheads, int chains, int group) {
    constexpr int BM = Cfg::BM, BN = BWD_BN, TPB = FOX_ACP_BLOCK / BM;  // TPB query tiles per ACP row
    static_assert(BM == 64 || (BM == 128 && DH == 64), "query tiles of 64, or of 128 at d_h 64");
    constexpr int NSUB = BM / 64;        // sub-tiles of 64 queries per tile (see above)
    constexpr bool DQ_LATE = DH == 128;  // dQ of tile it-1 issued after tile it's softmax (see above)
    constexpr bool TURNS = Cfg::TURNS, MASK_PASS = Cfg::MASK_PASS, K_REGS = Cfg::K_REGS;
    extern __shared__ __align__(1024) unsigned char bwd_smem[];  // 1024: the 128-byte swizzle's period
    __nv_bfloat16 *Ks = reinterpret_cast<__nv_bfloat16 *>(bwd_smem);  // [BN][DH]
    __nv_bfloat16 *Vs = Ks + BN * DH;                                   // [BN][DH]
    __nv_bfloat16 *Qs = Vs + BN * DH;                                   // [2][BM][DH]
    __nv_bfloat16 *dOs = Qs + 2 * BM * DH;                              // [2][BM][DH]
    __nv_bfloat16 *dSt = dOs + 2 * BM * DH;                             // [2][BN][BM]: dS^T (swz_halves)
    float *rs = reinterpret_cast<float *>(dSt + 2 * BN * BM);           // [2][BM]: bwd_row_stats' r
    float *Ds = rs + 2 * BM;                                            // [2][BM]
    float *rowsum = Ds + 2 * BM;                                        // [2][NWARPS][BM]: dS row sums
    float *dQs = rowsum + 2 * NWARPS * BM;                              // [BM * DH]: a tile's dQ (dq_acc_offset)
    float *dcs = dQs + BM * DH;                                         // [BM]: its dc row sums
    uint64_t *kv_full = reinterpret_cast<uint64_t *>(dcs + BM);
    uint64_t *full = kv_full + 1, *empty = full + 2, *kv_empty = empty + 2;
    int *item_slot = reinterpret_cast<int *>(kv_empty + 1);                    // [2]

    const int tid = threadIdx.x, lane = tid & 31;
    const int warp = __shfl_sync(0xffffffffu, tid >> 5, 0), w4 = warp >> 2;  // shfl: provably warp-uniform
    const int g = lane >> 2, tq = lane & 3;
    const int nblk = (T + BWD_BN - 1) / BWD_BN, nqt = (T + BM - 1) / BM, items = nheads * nblk;
    const size_t ld_o = (size_t)H * DH;
    // The work item (a key block of a head) and what follows from it, set by begin_item: key block nb of head
    // bh, in chain `chain` (item i of bwd_block_of's order, `group` heads a group), the query tiles it walks, its
    // pointers.
    int nb = 0, bh = 0, chain = 0, chain_lo = 0, chain_hi = 0, b = 0, h = 0, k0 = 0, qt_first = 0, qt_last = 0, ntiles = 0;
    size_t head_off = 0;
    const __nv_bfloat16 *qh = nullptr, *kh = nullptr, *vh = nullptr, *doh = nullptr;
    const float *ch = nullptr, *lh = nullptr, *Dsh = nullptr;
    const int *qlh = nullptr;
    float *dqh = nullptr, *dch = nullptr, c_ref = 0.f;
    int *semh = nullptr;
    auto begin_item = [&](int i) {
        bwd_block_of(i, nblk, nheads, group, Cfg::ORDER, chains, nb, bh, chain);
        chain_lo = bwd_chain_lo(chain, chains, nblk), chain_hi = bwd_chain_lo(chain + 1, chains, nblk);
        b = bh / H, h = bh % H;
        head_off = (size_t)bh * T;
        qh = q + head_off * DH, kh = k + head_off * DH, vh = v + head_off * DH;
        ch = c + head_off, lh = lse + head_off, Dsh = Dg + head_off;
        doh = dout + (size_t)b * T * ld_o + (size_t)h * DH;
        // This head's accumulators in its chain's (dq_acc_offset; dc's row sums: chain 0 in dc, the others after it).
        dqh = dq_acc + ((size_t)chain * nheads + bh) * dq_acc_rows(T) * DH;
        dch = chain == 0 ? dc + head_off : dc_chains + ((size_t)(chain - 1) * nheads + bh) * T;
        k0 = nb * BN;
        c_ref = ch[k0];
        qlh = q_last ? q_last + (size_t)bh * nblk : nullptr;
        const int m_last = qlh ? min(nblk - 1, max(qlh[nb], nb)) : nblk - 1;
        qt_first = k0 / BM;
        qt_last = min(nqt - 1, (m_last + 1) * TPB - 1);
        ntiles = qt_last - qt_first + 1;
        semh = sem + ((size_t)chain * nheads + bh) * nqt;
    };
    // One block an SM takes items in order from the counter `next_item` (the producer's lane 0 claims them and
    // posts each in item_slot[n % 2] before K and V's copy completes kv_full's phase n; the other warps read it
    // there, through shfl: warp-uniform, so the item's values sit in uniform registers as blockIdx's do; read
    // plainly they were recomputed at every tile); items >= `items` end the block.
    auto item_at = [&](int n) -> int { return __shfl_sync(0xffffffffu, item_slot[n & 1], 0); };

    if (tid == 0) {
        mbar_init(kv_full, 1);
        mbar_init(kv_empty, NWARPS);
        for (int s = 0; s < 2; s++) {
            mbar_init(full + s, 32);
            mbar_init(empty + s, NWARPS);
        }
        mbar_fence_init();
    }
    __syncthreads();
    if (warp >= NWARPS) {  // the sync warpgroup gives its registers to the compute warpgroups
        setmaxnreg_dec<BWD_REGS_SYNC>();
        if (warp == NWARPS) {  // the sync warp (see above)
            // Query tile t acquired: once the compute warps have put its dQ and dc row sums in smem
            // (barrier 1), lane 0 has the copy engine add the dQ tile (one contiguous range of the accumulator,
            // whole 64-row blocks; the chain's first add in the order stores it, bwd_store_first), the lanes
            // add the dc sums, the smem tile goes back to the compute warps (barrier 2) once read, and the adds
            // are complete before the release.
            auto bulk_add_dq = [&](int t, bool first) {
                named_bar_sync(1, NTHREADS + 32);
                const int i0 = t * BM, rows = min(BM, T - i0);
                if (lane == 0) {
                    fence_proxy_async_global();  // the acquire before the copy engine's add
                    const uint32_t bytes = (uint32_t)(dq_acc_rows(rows) * DH * 4);
                    if (Cfg::ORDER && first) bulk_store(dqh + (size_t)i0 * DH, dQs, bytes);
                    else bulk_reduce_add_f32(dqh + (size_t)i0 * DH, dQs, bytes);
                    bulk_commit();
                }
                for (int r = lane; r < rows; r += 32) atomicAdd(dch + i0 + r, dcs[r]);
                if (lane == 0) bulk_wait<true>();
                __syncwarp();
                if (t < qt_last) named_bar_arrive(2, NTHREADS + 32);
                if (lane == 0) {
                    bulk_wait<false>();
                    fence_proxy_async_global();  // the copy engine's add before the release
                }
                __syncwarp();
            };
            for (int n = 0;; n++) {
                mbar_wait(kv_full, n & 1);  // item n posted
                const int i = item_at(n);
                if (i >= items) break;
                begin_item(i);
                int ord_row = -1, before = 0;
                bool last = false;
                named_bar_arrive(2, NTHREADS + 32);  // the smem dQ tile starts free
                for (int t = qt_first; t <= qt_last; t++) {
                    const int m = t / TPB;
                    if (m != ord_row) {
                        ord_row = m;
                        acp_order(m, nb, chain_lo, chain_hi, qlh, before, last);
                    }
                    if (Cfg::ORDER && lane == 0 && before > 0) {
                        unsigned spins = 0;
                        while (ld_acquire_gpu(semh + t) < before) {
                            __nanosleep(32);
                            if (++spins > (1u << 27)) __trap();  // a missing predecessor: fail loudly, never hang
                        }
                    }
                    __syncwarp();
                    bulk_add_dq(t, before == 0);
                    if (lane == 0) red_release_gpu_add(semh + t, 1);
                    __syncwarp();
                }
            }
        } else if (warp == NWARPS + 1) {  // the producer (see above)
            int gt = 0;  // query tiles loaded so far (the Q / dO stages' count)
            for (int n = 0;; n++) {
                // Claim and post item n; a claim past the last ends every warp. Not before item n-1's K and V
                // are read: then every warp has taken item n-1 from its slot and waited on kv_full's phase n-1,
                // so neither is overtaken.
                if (n > 0) mbar_wait(kv_empty, (n - 1) & 1);
                if (lane == 0) {
                    const int i = atomicAdd(next_item, 1);
                    item_slot[n & 1] = i;
                    if (i >= items) mbar_arrive(kv_full);
                }
                __syncwarp();
                const int i = item_at(n);
                if (i >= items) break;
                begin_item(i);
                if (lane == 0) {
                    mbar_arrive_expect_tx(kv_full, 2 * BN * DH * 2);
#pragma unroll
                    for (int hf = 0; hf < DH / 64; hf++) {
                        tma_load_3d(Ks + hf * BN * 64, &tm_k, kv_full, hf * 64, k0, bh);
                        tma_load_3d(Vs + hf * BN * 64, &tm_v, kv_full, hf * 64, k0, bh);
                    }
                }
                for (int it = 0; it < ntiles; it++, gt++) {
                    const int s = gt & 1, i0 = (qt_first + it) * BM;
                    // The row stats' loads are in flight during the wait and the copies; stored after them.
                    float r[BM / 32], d[BM / 32];
#pragma unroll
                    for (int x = 0; x < BM / 32; x++) bwd_row_stats(ch, lh, Dsh, i0 + lane + 32 * x, T, c_ref, r[x], d[x]);
                    if (gt >= 2) mbar_wait(empty + s, ((gt >> 1) & 1) ^ 1);  // tile gt-2's release
                    if (lane == 0) {
                        mbar_expect_tx(full + s, 2 * BM * DH * 2);
#pragma unroll
                        for (int hf = 0; hf < DH / 64; hf++) {
                            tma_load_3d(Qs + s * BM * DH + hf * BM * 64, &tm_q, full + s, hf * 64, i0, bh);
                            tma_load_3d(dOs + s * BM * DH + hf * BM * 64, &tm_do, full + s, h * DH + hf * 64, i0, b);
                        }
                    }
#pragma unroll
                    for (int x = 0; x < BM / 32; x++) {
                        rs[s * BM + lane + 32 * x] = r[x];
                        Ds[s * BM + lane + 32 * x] = d[x];
                    }
                    mbar_arrive(full + s);
                }
            }
        }
        return;
    }
    setmaxnreg_inc<BWD_REGS_COMPUTE>();

    {  // dS^T buffer 1: the operand of the unused dQ product issued in iteration 0
        uint4 *z = reinterpret_cast<uint4 *>(dSt + BN * BM);
        for (int i = tid; i < BN * BM / 8; i += NTHREADS) z[i] = make_uint4(0u, 0u, 0u, 0u);
    }
    const float sl2 = LOG2E / sqrtf((float)DH);
    const float scale = 1.f / sqrtf((float)DH);

    int gt0 = 0;  // query tiles this block walked before the current item (the stages' and buffers' count)

    // The dQ split: at BM 64 each warpgroup takes the tile's 64 query rows and DQC = DH / 2 columns from DQC w4;
    // at BM 128 (d_h 64) warpgroup w4 takes query rows 64 w4.. (dS^T's half w4) and all 64 columns.
    constexpr int DQC = BM == 128 ? DH : DH / 2;
    const int dq_r = BM == 128 ? w4 * 64 + (warp & 3) * 16 : (warp % (BM / 16)) * 16;
    const int dq_c = BM == 128 ? 0 : (warp / (BM / 16)) * DQC;

    // dQ of tile it-1 = dS K from its parked dS^T (the API's); issued only.
    auto dq_mma_issue = [&](int it, float (&dqa)[DQC / 8][4]) {
        const uint64_t ds = gmma_desc(dSt + ((gt0 + it - 1) & 1) * BN * BM), ks = gmma_desc(Ks);
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            if constexpr (BM == 128)
                wgmma_m64n64_ss<1, 1>(dqa, desc_mnmajor<BN>(ds, w4, kk), desc_mnmajor<BN>(ks, 0, kk), kk > 0);
            else if constexpr (DQC == 32)
                wgmma_m64n32_ss<1, 1>(dqa, gmma_desc_add(ds, kk * 16 * BM), gmma_desc_add(ks, kk * 16 * DH + w4 * 32), kk > 0);
            else
                wgmma_m64n64_ss<1, 1>(dqa, gmma_desc_add(ds, kk * 16 * BM), desc_mnmajor<BN>(ks, w4, kk), kk > 0);
        }
    };
    // dQ (and dc row sums) of tile it-1 to smem, for the sync warp's bulk add in its order.
    auto dq_phase = [&](int it, float (&dqa)[DQC / 8][4]) {
        const int pb = (gt0 + it - 1) & 1;
        float rtot = 0.f;
        if (tid < BM) {
#pragma unroll
            for (int w = 0; w < NWARPS; w++) rtot += rowsum[(pb * NWARPS + w) * BM + tid];
        }
        named_bar_sync(2, NTHREADS + 32);  // the copy engine has read tile it-2's
        const int r0 = dq_r + g;
#pragma unroll
        for (int nt = 0; nt < DQC / 8; nt++) {
            const int col = dq_c + nt * 8 + 2 * tq;
            *reinterpret_cast<float2 *>(dQs + dq_acc_offset(r0, col, DH)) = make_float2(dqa[nt][0], dqa[nt][1]);
            *reinterpret_cast<float2 *>(dQs + dq_acc_offset(r0 + 8, col, DH)) = make_float2(dqa[nt][2], dqa[nt][3]);
        }
        if (tid < BM) dcs[tid] = rtot;
        fence_proxy_async_smem();  // st.shared -> the copy engine's reads
        named_bar_arrive(1, NTHREADS + 32);
    };
    // this warp's dS row sums of the 64 query columns from q0 (rsum: this thread's part) reduced over its keys,
    // to smem
    auto park_row_sums = [&](float (&rsum)[16], int buf, int q0) {
        warp_column_sums<16>(rsum, lane);
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int cidx = g * 2 + i;
            rowsum[(buf * NWARPS + warp) * BM + q0 + (cidx >> 1) * 8 + 2 * tq + (cidx & 1)] = rsum[i];
        }
    };
    // The scheduler barrier (TURNS, see above): wait for this warpgroup's turn / pass it to the other one.
    auto turn_wait = [&]() {
        if (!TURNS) return;
        if (w4 == 0) named_bar_sync(4, NTHREADS);  // constant ids: ptxas counts the barriers
        else named_bar_sync(5, NTHREADS);
    };
    auto turn_pass = [&](bool last) {
        if (!TURNS) return;
        if (w4 == 0) named_bar_arrive(5, NTHREADS);
        else if (!last) named_bar_arrive(4, NTHREADS);
    };
    float dqp[DQC / 8][4];  // dQ product of tile it-1 (in flight during tile it's softmax or dV/dK work)
    uint32_t ka[K_REGS ? DH / 16 : 1][4];  // Cfg::K_REGS: this warp's 16 keys of K, S^T's A fragments (see above)
    static_assert(!K_REGS || DH == 64, "K's fragments in registers: d_h 64");
    for (int n = 0;; n++) {
        mbar_wait(kv_full, n & 1);  // item n posted (and its K, V landed)
        const int item = item_at(n);
        if (item >= items) break;
        begin_item(item);

        int j0, j1;  // this thread's two keys
        float nb0, nb1;
        bwd_thread_keys(ch, k0, warp, g, T, c_ref, j0, j1, nb0, nb1);

        float dka[DH / 8][4], dva[DH / 8][4];
#pragma unroll
        for (int i = 0; i < DH / 8; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) dka[i][e] = dva[i][e] = 0.f;
        float cs0 = 0.f, cs1 = 0.f;  // column sums of dS for keys j0, j1
        if (TURNS && w4 == 1) named_bar_arrive(4, NTHREADS);  // warpgroup 0 issues first
        if constexpr (K_REGS) {  // this item's K
#pragma unroll
            for (int kk = 0; kk < DH / 16; kk++) load_a<64>(ka[kk], Ks, w4 * 64 + (warp & 3) * 16, kk * 16, lane);
        }
        for (int it = 0; it <= ntiles; it++) {
            const int buf = (gt0 + it) & 1;  // the Q / dO stage and the dS^T, row-sum buffers
            if (it < ntiles) mbar_wait(full + buf, ((gt0 + it) >> 1) & 1);
            fence_proxy_async_smem();  // dS^T writes -> wgmma reads
            named_bar_sync(0, NTHREADS);  // Q/dO/row stats of tile it ready; dS^T and row sums of tile it-1 complete
            if (it < ntiles) {
                const int i0 = (qt_first + it) * BM;
                const __nv_bfloat16 *Qb = Qs + buf * BM * DH, *dOb = dOs + buf * BM * DH;
                const float *rb = rs + buf * BM, *Db = Ds + buf * BM;
                __nv_bfloat16 *dSb = dSt + buf * BN * BM;
#pragma unroll
                for (int sub = 0; sub < NSUB; sub++) {  // sub-tiles of 64 queries, from column qs of the tile
                    const int qs = sub * 64, i0s = i0 + qs;
                    const float *rbs = rb + qs, *Dbs = Db + qs;
                    float st[8][4], dpt[8][4];
                    turn_wait();
                    // S^T = K Q^T, dP^T = V dO^T for this warpgroup's 64 keys (all operands K-major)
                    wg_fence();
                    // the tiles' descriptors formed at each call (ptxas shares them): named once above the loop,
                    // they cost ptxas more instructions
#pragma unroll
                    for (int kk = 0; kk < DH / 16; kk++) {
                        if constexpr (K_REGS) wgmma_m64n64_rs<0>(st, ka[kk], desc_kmajor<BM>(gmma_desc(Qb), qs, kk), kk > 0);
                        else
                            wgmma_m64n64_ss<0, 0>(st, desc_kmajor<BN>(gmma_desc(Ks), w4 * 64, kk),
                                                  desc_kmajor<BM>(gmma_desc(Qb), qs, kk), kk > 0);
                    }
#pragma unroll
                    for (int kk = 0; kk < DH / 16; kk++)
                        wgmma_m64n64_ss<0, 0>(dpt, desc_kmajor<BN>(gmma_desc(Vs), w4 * 64, kk),
                                              desc_kmajor<BM>(gmma_desc(dOb), qs, kk), kk > 0);
                    wg_commit();
                    if (!DQ_LATE && sub == 0) {  // tile it-1's dQ product queues behind; only S^T, dP^T are waited for
                        dq_mma_issue(it, dqp);  // at it = 0 on the zeroed buffer, unused: no branch in the stage
                        wg_commit();
                    }
                    turn_pass(false);
                    if (DQ_LATE || sub > 0) wg_wait<0>();
                    else wg_wait<1>();

                    // P^T and dS^T in place: st <- P^T, dpt <- dS^T; rsum: this thread's part of dS row sums
                    float rsum[16];
                    auto p_ds = [&](auto diag_tile) {  // std::true_type on a diagonal tile: the causal mask
#pragma unroll
                        for (int nt = 0; nt < 8; nt++) {
#pragma unroll
                            for (int e = 0; e < 2; e++) {
                                const int col = nt * 8 + 2 * tq + e, i = i0s + col;
                                rsum[2 * nt + e] = bwd_p_ds_pair(st[nt][e], st[nt][2 + e], dpt[nt][e], dpt[nt][2 + e], rbs[col],
                                                                 Dbs[col], nb0, nb1, sl2, decltype(diag_tile)::value, i, j0,
                                                                 j1, cs0, cs1);
                            }
                        }
                    };
                    if constexpr (MASK_PASS) {  // -inf scores: ex2 gives the masked P exactly 0, as the select does
                        if (i0s < k0 + BN - 1) {
#pragma unroll
                            for (int nt = 0; nt < 8; nt++)
#pragma unroll
                                for (int e = 0; e < 2; e++) {
                                    const int i = i0s + nt * 8 + 2 * tq + e;
                                    if (j0 > i) st[nt][e] = -INFINITY;
                                    if (j1 > i) st[nt][2 + e] = -INFINITY;
                                }
                        }
                        p_ds(std::false_type{});
                    } else if (i0s < k0 + BN - 1) {
                        p_ds(std::true_type{});
                    } else {
                        p_ds(std::false_type{});
                    }
                    if constexpr (DQ_LATE) park_row_sums(rsum, buf, qs);  // its 16 registers free before the MMAs
                    // dV += P^T dO, dK += dS^T Q: A from registers, B = dO / Q (MN-major)
                    uint32_t pa[4][4], sa[4][4];
#pragma unroll
                    for (int kk = 0; kk < 4; kk++) {
                        acc_to_a(pa[kk], st[2 * kk], st[2 * kk + 1]);
                        acc_to_a(sa[kk], dpt[2 * kk], dpt[2 * kk + 1]);
                        const int kr = warp * 16 + g, qc = qs + kk * 16 + 2 * tq;
                        *reinterpret_cast<uint32_t *>(dSb + swz_halves<BM, BN>(kr, qc)) = sa[kk][0];
                        *reinterpret_cast<uint32_t *>(dSb + swz_halves<BM, BN>(kr + 8, qc)) = sa[kk][1];
                        *reinterpret_cast<uint32_t *>(dSb + swz_halves<BM, BN>(kr, qc + 8)) = sa[kk][2];
                        *reinterpret_cast<uint32_t *>(dSb + swz_halves<BM, BN>(kr + 8, qc + 8)) = sa[kk][3];
                    }
                    turn_wait();
                    wg_fence();
                    if constexpr (DQ_LATE) {  // tile it-1's dQ product first: its adds wait for it alone
                        dq_mma_issue(it, dqp);
                        wg_commit();
                    }
#pragma unroll
                    for (int kk = 0; kk < 4; kk++)
#pragma unroll
                        for (int hf = 0; hf < DH / 64; hf++) {
                            wgmma_m64n64_rs<1>(acc_half(dva, hf), pa[kk], desc_mnmajor<BM>(gmma_desc(dOb), hf, qs / 16 + kk));
                            wgmma_m64n64_rs<1>(acc_half(dka, hf), sa[kk], desc_mnmajor<BM>(gmma_desc(Qb), hf, qs / 16 + kk));
                        }
                    wg_commit();  // waited for after tile it-1's dQ adds
                    turn_pass(false);
                    if constexpr (!DQ_LATE) park_row_sums(rsum, buf, qs);
                }
                wg_wait<1>();  // tile it-1's dQ product (tile it's last dV/dK products may still run)
            } else {  // after the last tile: its dQ product alone
                turn_wait();
                wg_fence();
                dq_mma_issue(it, dqp);
                wg_commit();
                turn_pass(true);
                wg_wait<0>();
            }
            if (it > 0) dq_phase(it, dqp);
            wg_wait<0>();  // dV/dK done: their register operands and this Q/dO buffer are free
            if (it < ntiles) {  // the stage's Q, dO and row stats are free
                __syncwarp();
                if (lane == 0) mbar_arrive(empty + buf);
            }
        }

        // the item's K and V are read: the producer may load the next item's
        __syncwarp();
        if (lane == 0) mbar_arrive(kv_empty);
        bwd_store_keys<DH>(dk, dv, colsum, head_off, j0, j1, T, tq, dka, dva, cs0, cs1, scale);
        gt0 += ntiles;
    }
}

// Steps 1 and 2 of the backward; leaves the dS row sums in dc, the minus column sums and the unscaled dq in the
// scratch (bwd_sums), for step 3 (bwd_dq) and the final step (fox_attention_reverse_scan).
template <int DH, int BM, int MINB, bool DET>
BwdSums backward_cfg(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const float *c,
                     const __nv_bfloat16 *o, const float *lse, const __nv_bfloat16 *dout, float *dc,
                     __nv_bfloat16 *dk, __nv_bfloat16 *dv, void *scratch, int B, int H, int T,
                     const int *q_last, cudaStream_t s) {
    const BwdSums p = bwd_sums(scratch, B, H, T, DH, 1, q_last);
    bwd_prepare<DH>(o, dout, dc, p, true, B, H, T, s);
    const size_t smem = bwd_smem_bytes<DH, BM>();
    FOX_CUDA_CHECK(cudaFuncSetAttribute(bwd_kernel<DH, BM, MINB, DET>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    dim3 grid((T + BWD_BN - 1) / BWD_BN, B * H);
    bwd_kernel<DH, BM, MINB, DET><<<grid, NTHREADS, smem, s>>>(q, k, v, c, dout, lse, p.D, p.dq_acc, dk, dv, dc,
                                                              p.colsum, p.sem, H, T, q_last);
    FOX_LAUNCH_CHECK();
    return p;
}

// Steps 1 and 2 with bwd_ws_kernel (Hopper; Cfg: BwdDetCfg or BwdAtomicCfg), the order in `chains` chains (1 to
// BWD_CHAINS; 1 without the order), one block an SM. The tensor maps are encoded per call (host work only; they
// carry the pointers) and passed by value.
template <int DH, class Cfg = BwdDetCfg<DH>>
BwdSums backward_ws(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const float *c,
                    const __nv_bfloat16 *o, const float *lse, const __nv_bfloat16 *dout, float *dc, __nv_bfloat16 *dk,
                    __nv_bfloat16 *dv, void *scratch, int B, int H, int T, const int *q_last, int chains,
                    cudaStream_t s) {
    constexpr int BM = Cfg::BM;
    if (chains < 1 || chains > BWD_CHAINS) {
        fprintf(stderr, "error: the attention backward's order takes 1 to %d chains, not %d\n", BWD_CHAINS, chains);
        exit(EXIT_FAILURE);
    }
    if (!Cfg::ORDER) chains = 1;
    const BwdSums p = bwd_sums(scratch, B, H, T, DH, chains, q_last);
    bwd_prepare<DH>(o, dout, dc, p, !bwd_store_first<Cfg>(), B, H, T, s);
    const size_t smem = bwd_ws_smem_bytes<DH, BM>();
    FOX_CUDA_CHECK(cudaFuncSetAttribute(bwd_ws_kernel<DH, Cfg>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const CUtensorMap tq = tma_map_bf16_3d(q, DH, T, B * H, BM), tk = tma_map_bf16_3d(k, DH, T, B * H, BWD_BN),
                      tv = tma_map_bf16_3d(v, DH, T, B * H, BWD_BN), tdo = tma_map_bf16_3d(dout, H * DH, T, B, BM);
    const int nblk = (T + BWD_BN - 1) / BWD_BN, items = nblk * B * H, sms = fox_sm_count();
    const dim3 grid(items < sms ? items : sms);
    const int want = Cfg::ORDER ? bwd_head_group(T, DH) : BWD_ATOMIC_HEAD_GROUP, group = want < B * H ? want : B * H;
    bwd_ws_kernel<DH, Cfg><<<grid, NTHREADS + 128, smem, s>>>(tq, tk, tv, tdo, q, k, v, c, dout, lse, p.D, p.dq_acc,
                                                              dk, dv, dc, p.dc_chains, p.colsum, p.sem, p.next_item, H,
                                                              T, q_last, B * H, chains, group);
    FOX_LAUNCH_CHECK();
    return p;
}

// Steps 1 and 2 as the public API runs them. On Hopper (needs an sm_90a build) bwd_ws_kernel (warpgroup MMA,
// a TMA producer, dQ through the copy engine), in the sync warp's order or (det false) in arrival order;
// otherwise bwd_kernel on mma.sync, with the staggered warp-level order or plain fp32 atomics. one_chain: the
// deterministic order in one chain (one accumulator, complete after this step, for a caller that adds to it).
template <int DH>
BwdSums backward(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const float *c,
                 const __nv_bfloat16 *o, const float *lse, const __nv_bfloat16 *dout, float *dc, __nv_bfloat16 *dk,
                 __nv_bfloat16 *dv, void *scratch, int B, int H, int T, const int *q_last, bool det, bool one_chain,
                 cudaStream_t s) {
    constexpr int BM = BwdCfg<DH>::BM, MINB = BwdCfg<DH>::MINB;
    if (use_wgmma()) {
        if (det)
            return backward_ws<DH>(q, k, v, c, o, lse, dout, dc, dk, dv, scratch, B, H, T, q_last,
                                   one_chain ? 1 : BWD_CHAINS, s);
        return backward_ws<DH, BwdAtomicCfg<DH>>(q, k, v, c, o, lse, dout, dc, dk, dv, scratch, B, H, T, q_last, 1, s);
    }
    if (det) return backward_cfg<DH, BM, MINB, true>(q, k, v, c, o, lse, dout, dc, dk, dv, scratch, B, H, T, q_last, s);
    return backward_cfg<DH, BM, MINB, false>(q, k, v, c, o, lse, dout, dc, dk, dv, scratch, B, H, T, q_last, s);
}

}  // namespace fox_attn

#endif  // FOX_ATTENTION_BACKWARD_CUH
