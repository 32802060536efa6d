// fox/attention_forward.cuh: the Forgetting Attention forward kernels and their launchers, in the two forms
// the public API (fox/attention.cuh) selects: mma.sync m16n8k16 (sm_80 and up), and Hopper warpgroup MMA
// fed by a TMA producer warpgroup (sm_90a builds), each at d_h 64 and 128. Other forms, and their
// measurements, are in dev/cuda/attention_forward.cu.
// Measurements and the variants tried: dev/cuda/NOTES.md, section "Index: the notes of each product kernel".
#ifndef FOX_ATTENTION_FORWARD_CUH
#define FOX_ATTENTION_FORWARD_CUH

#include <math.h>                     // INFINITY, sqrtf, log2f
#include <cuda_runtime.h>             // dim3, cudaFuncSetAttribute, cudaStream_t
#include <cuda_bf16.h>                // __nv_bfloat16
#include "acp.h"                      // FOX_ACP_BLOCK: kv_first's grid
#include "cuda_common.cuh"            // FOX_CUDA_CHECK, FOX_LAUNCH_CHECK, fox_sm_count
#include <type_traits>                // std::true_type, std::false_type
#include "attention_primitives.cuh"   // cp.async, ldmatrix, mma.sync, wgmma, TMA, mbarriers, ex2, quad_max / quad_sum
#include "attention_traits.cuh"       // LOG2E, FWD_BM, FWD_BN, FWD_WS_BN, FwdCfg, FwdWsCfg, smem sizes, use_wgmma
#include "attention_order.cuh"        // grouped_longest_first, fwd_head_group, fwd_item_counter: the launch order
#include "tma.cuh"                    // tma_map_bf16_3d: the tensor maps of q, k, v

namespace fox_attn {

// Forgetting Attention forward, FoX paper eq. 11-13 and Appendix E Algorithm 1 (docs/model.md §1.1; the
// CPU reference is attention_forward in train_fox.c): per (b, h) and query row i,
//   o_i = sum_{j <= i} exp(s_ij) v_j / sum_{j <= i} exp(s_ij),  s_ij = scale q_i.k_j + c_i - c_j,
// and lse_i = log sum_{j <= i} exp(s_ij), which the backward uses to recompute P.
// Block = FWD_BM query rows of one (b, h); each warp owns MT row tiles of 16 (so every K/V fragment read
// from smem feeds MT mma). Key tiles of FWD_BN are walked from the diagonal down to the first live one,
// double-buffered with cp.async, with an online softmax (running max and sum per row).
//
// Gate precision: c reaches -1e4 and beyond at long T, where an fp32 ulp is ~1e-3, so c_i - c_j must be
// formed from differences, never from c*log2e products. Each key tile takes c_ref = c at its first
// key; a_i = (c_i - c_ref) log2e per row and nb_j = -(c_j - c_ref) log2e per key are small for every
// tile that matters, and s_ij log2e = a_i + fma(qk, scale log2e, nb_j).
// This kernel: mma.sync (sm_80 and up; on Hopper fwd_ws_kernel below).
template <int DH>
__global__ void __launch_bounds__(FwdCfg<DH>::THREADS, FwdCfg<DH>::MIN_BLOCKS)
fwd_kernel(const __nv_bfloat16 *__restrict__ q, const __nv_bfloat16 *__restrict__ k,
           const __nv_bfloat16 *__restrict__ v, const float *__restrict__ c, __nv_bfloat16 *__restrict__ o,
           float *__restrict__ lse, int H, int T, const int *__restrict__ kv_first) {
    constexpr int BM = FWD_BM, BN = FWD_BN, MT = FwdCfg<DH>::MT, NT = FwdCfg<DH>::THREADS;
    static_assert(BN <= NT, "one loader thread per key");
    extern __shared__ __align__(1024) unsigned char fwd_smem[];  // 1024: as fwd_ws_kernel's (the same array)
    __nv_bfloat16 *Qs = reinterpret_cast<__nv_bfloat16 *>(fwd_smem);
    __nv_bfloat16 *Ks = Qs + BM * DH;          // [2][BN][DH]
    __nv_bfloat16 *Vs = Ks + 2 * BN * DH;      // [2][BN][DH]
    float *nbs = reinterpret_cast<float *>(Vs + 2 * BN * DH);  // [2][BN]: -(c_j - c_ref) log2e
    float *crefs = nbs + 2 * BN;                                // [2]

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tq = lane & 3;
    const int nqb = gridDim.x;
    const int mb = nqb - 1 - blockIdx.x;  // longest rows first
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const size_t head_off = (size_t)bh * T;
    const __nv_bfloat16 *qh = q + head_off * DH, *kh = k + head_off * DH, *vh = v + head_off * DH;
    const float *ch = c + head_off;
    const int q0 = mb * BM;

    const int n_last = min((T - 1) / BN, (q0 + BM - 1) / BN);
    const int n_first = kv_first ? kv_first[(size_t)bh * nqb + mb] * (FOX_ACP_BLOCK / BN) : 0;
    const int ntiles = n_last - n_first + 1;

    // Loader threads tid < BN fetch c for the next key tile; its nb_j goes to smem after this tile's math.
    auto fetch_c = [&](int n, float &cj, float &cref) {
        const int j = n * BN + tid;
        cref = ch[n * BN];
        cj = tid < BN && j < T ? ch[j] : cref;
    };
    auto store_c = [&](int buf, float cj, float cref) {
        if (tid < BN) nbs[buf * BN + tid] = key_gate_log2(cj, cref);
        if (tid == 0) crefs[buf] = cref;
    };

    load_tile_async<DH, BM, NT>(Qs, qh, DH, q0, T, tid);
    load_tile_async<DH, BN, NT>(Ks, kh, DH, n_last * BN, T, tid);
    load_tile_async<DH, BN, NT>(Vs, vh, DH, n_last * BN, T, tid);
    cp_async_commit();
    {
        float cj, cref;
        fetch_c(n_last, cj, cref);
        store_c(0, cj, cref);
    }

    // this thread's query rows: row[mt][0] = g and row[mt][1] = g + 8 of row tile mt
    int row[MT][2];
    float crow[MT][2], m[MT][2], l[MT][2];  // gate, running max (log2 units), running sum
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            row[mt][hf] = q0 + (warp * MT + mt) * 16 + g + 8 * hf;
            crow[mt][hf] = row[mt][hf] < T ? ch[row[mt][hf]] : 0.f;
            m[mt][hf] = -INFINITY;
            l[mt][hf] = 0.f;
        }
    const float sl2 = LOG2E / sqrtf((float)DH);

    uint32_t qf[MT][DH / 16][4];
    float oacc[MT][DH / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < DH / 8; i++) oacc[mt][i][0] = oacc[mt][i][1] = oacc[mt][i][2] = oacc[mt][i][3] = 0.f;
    for (int it = 0; it < ntiles; it++) {
        const int n = n_last - it, buf = it & 1;
        cp_async_wait_all();
        __syncthreads();
        const bool more = it + 1 < ntiles;
        float cj_next = 0.f, cref_next = 0.f;
        if (more) {
            load_tile_async<DH, BN, NT>(Ks + (buf ^ 1) * BN * DH, kh, DH, (n - 1) * BN, T, tid);
            load_tile_async<DH, BN, NT>(Vs + (buf ^ 1) * BN * DH, vh, DH, (n - 1) * BN, T, tid);
            cp_async_commit();
            fetch_c(n - 1, cj_next, cref_next);
        }
        if (it == 0) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int kk = 0; kk < DH / 16; kk++) load_a<DH>(qf[mt][kk], Qs, (warp * MT + mt) * 16, kk * 16, lane);
        }
        const __nv_bfloat16 *Kb = Ks + buf * BN * DH, *Vb = Vs + buf * BN * DH;
        const float *nb = nbs + buf * BN;

        float s[MT][BN / 8][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int i = 0; i < BN / 8; i++) s[mt][i][0] = s[mt][i][1] = s[mt][i][2] = s[mt][i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < DH / 16; kk++) {
#pragma unroll
            for (int np = 0; np < BN / 16; np++) {
                uint32_t bf[4];
                load_b_nk<DH>(bf, Kb, np * 16, kk * 16, lane);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma16816(s[mt][2 * np], qf[mt][kk], bf[0], bf[1]);
                    mma16816(s[mt][2 * np + 1], qf[mt][kk], bf[2], bf[3]);
                }
            }
        }

        const bool diag = n * BN + BN - 1 > q0;
        const float cref = crefs[buf];
        float nbj[BN / 4];  // this thread's key columns: nt * 8 + 2 * tq + e
#pragma unroll
        for (int nt = 0; nt < BN / 8; nt++) {
            nbj[2 * nt] = nb[nt * 8 + 2 * tq];
            nbj[2 * nt + 1] = nb[nt * 8 + 2 * tq + 1];
        }
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            // t = s log2e - a_i: the log2 score without the row's own gate term; element e + 2 hf is row hf
            float mt_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
                for (int x = 0; x < 4; x++) {
                    const int hf = x >> 1, j = n * BN + nt * 8 + 2 * tq + (x & 1);
                    float t = fmaf(s[mt][nt][x], sl2, nbj[2 * nt + (x & 1)]);
                    if (diag && j > row[mt][hf]) t = -INFINITY;
                    s[mt][nt][x] = t;
                    mt_max[hf] = fmaxf(mt_max[hf], t);
                }
            float sh[2], al[2], ps[2] = {0.f, 0.f};
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const float a = (crow[mt][hf] - cref) * LOG2E;
                const float mn = fmaxf(m[mt][hf], a + quad_max(mt_max[hf]));
                // Rows with nothing live yet keep max -inf: shift by 0 so exp2 sees -inf, not NaN.
                sh[hf] = mn == -INFINITY ? 0.f : mn - a;
                al[hf] = mn == -INFINITY ? 1.f : ex2(m[mt][hf] - mn);
                m[mt][hf] = mn;
            }
#pragma unroll
            for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
                for (int x = 0; x < 4; x++) {
                    s[mt][nt][x] = ex2(s[mt][nt][x] - sh[x >> 1]);
                    ps[x >> 1] += s[mt][nt][x];
                }
#pragma unroll
            for (int hf = 0; hf < 2; hf++) l[mt][hf] = l[mt][hf] * al[hf] + ps[hf];  // quad-reduced at the end
#pragma unroll
            for (int i = 0; i < DH / 8; i++)
#pragma unroll
                for (int x = 0; x < 4; x++) oacc[mt][i][x] *= al[x >> 1];
        }
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            uint32_t pa[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) acc_to_a(pa[mt], s[mt][2 * kk], s[mt][2 * kk + 1]);
#pragma unroll
            for (int np = 0; np < DH / 16; np++) {
                uint32_t bf[4];
                load_b_kn<DH>(bf, Vb, kk * 16, np * 16, lane);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma16816(oacc[mt][2 * np], pa[mt], bf[0], bf[1]);
                    mma16816(oacc[mt][2 * np + 1], pa[mt], bf[2], bf[3]);
                }
            }
        }
        if (more) store_c(buf ^ 1, cj_next, cref_next);
    }

    const size_t ld_o = (size_t)H * DH;
    __nv_bfloat16 *ob = o + (size_t)b * T * ld_o + (size_t)h * DH;
    constexpr float LN2 = 0.6931471805599453f;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int r = row[mt][hf];
            const float lsum = quad_sum(l[mt][hf]), inv = 1.f / lsum;
            if (r >= T) continue;
#pragma unroll
            for (int nt = 0; nt < DH / 8; nt++)
                *reinterpret_cast<uint32_t *>(ob + r * ld_o + nt * 8 + 2 * tq) =
                    pack_bf16(oacc[mt][nt][2 * hf] * inv, oacc[mt][nt][2 * hf + 1] * inv);
            if (tq == 0) lse[head_off + r] = (m[mt][hf] + log2f(lsum)) * LN2;
        }
}

template <int DH>
void forward_mma(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const float *c,
                 __nv_bfloat16 *o, float *lse, int B, int H, int T, const int *kv_first, cudaStream_t s) {
    const size_t smem = fwd_smem_bytes<DH>();
    FOX_CUDA_CHECK(cudaFuncSetAttribute(fwd_kernel<DH>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    dim3 grid((T + FWD_BM - 1) / FWD_BM, B * H);
    fwd_kernel<DH><<<grid, FwdCfg<DH>::THREADS, smem, s>>>(q, k, v, c, o, lse, H, T, kv_first);
    FOX_LAUNCH_CHECK();
}

// Forgetting Attention forward on Hopper with a TMA producer (FlashAttention-3's recipe, our code): the
// formulation and gate precision scheme of fwd_kernel above on warpgroup MMA (sm_90a), key tiles of
// FWD_WS_BN. S = Q K^T is one m64n128 product per k16 step with Q and K straight from the swizzled smem
// tiles, stored as d_h / 64 halves of 64 columns (swz_halves), each a canonical 128-byte-swizzle operand;
// P V is one m64n64 product per half of V (MN-major), P kept in registers as bf16 fragments, giving O's
// columns 64 hf.. (acc_half). Tile t-1's P V runs on the tensor cores during tile t's softmax: per tile a
// warpgroup commits S(t), then P(t-1) V(t-1), waits for S(t) only, forms tile t's exponentials and row
// sums, then waits for P V and rescales O (the same operations on O in the same order as a P V issued
// right after tile t-1's softmax). A P V is skipped only where P is zero (t = 0, after a dead tile; with
// Cfg::SKIP_DEAD), never an S: ptxas keeps the warpgroup MMAs asynchronous while every accumulator they write
// is defined by one on every path (a branch around a whole S product serializes them, C7515).
// Warps 0..4 NWG - 1 are NWG consumer warpgroups of 64 query rows (FwdWsCfg: three at d_h 64, two at 128);
// the next warp is the producer: one lane issues the bulk tensor copies (TMA) of Q, then of each key tile's
// K and V (each 64-column half one box of the 3-D map [B H][T][d_h], landing in the 128-byte-swizzle layout
// the descriptors read; rows past T, and below 0 in a head's first block (q_shift), come in as zeros), and the
// warp's 32 lanes form the tile's gate terms nb_j and c_ref into the stage's smem before arriving on its
// mbarrier (K's copy is issued first, with the c loads already in flight, so neither waits for the other). K, V
// and the gate terms have STAGES stages, with "full" mbarriers (32 producer arrivals + the copies' bytes) and
// "empty" ones (one arrival per consumer warp): a consumer frees K(t) and the gate terms once S(t) is complete
// and its gate terms are read, V(t-1) once P(t-1) V(t-1) is; no __syncthreads in the tile loop. The consumer
// warpgroups take turns issuing their MMAs, round robin (named barriers 1..NWG, FA3's warp scheduler
// barrier), so that one warpgroup's softmax runs while another's products occupy the tensor cores.
// A block of 192 rows spans two ACP row blocks and parts of two diagonal key tiles, so every warpgroup walks
// the block's key range (from the lowest of its warpgroups' first live tiles to the block's last tile) and
// classifies each tile for its own rows: live, diagonal (the causal mask, the score loop's masked copy,
// chosen by a uniform branch), or dead (above its rows' diagonal, or pruned by ACP for its row block). For a
// dead tile the warpgroup issues S's first k16 step alone, skips the softmax and the next tile's P V, and
// hands the stages back: O, m and l have the bits of a kernel that never saw the tile (Cfg::SKIP_DEAD, d_h 64;
// without it, at d_h 128, a dead tile's scores are masked whole, with the same result).
// Cfg::PERSISTENT (the API's form up to FWD_PERSISTENT_MAX_T, FwdWsPersistentCfg): one block an SM takes work items
// (a query block of a head, in the launch order) from a counter (next_item, zeroed before the launch:
// FlashAttention-3's dynamic scheduler for causal attention); the producer claims the next item once it has issued
// this item's last copies (the consumers are then STAGES tiles behind, as a launch places its next block on an SM
// about to be free), loads its Q once the consumers' last S of this item is complete (Q stays at one constant smem
// address: from a second buffer the descriptors cost more per tile than the start they save) and puts the item
// and its rows' c in smem, and the K / V stages run on across items, so that an item's start (launch, Q and the
// first tiles' loads) falls under the previous item's last tiles. The consumers read the item through shfl
// (warp-uniform: uniform registers, as blockIdx's values; read plainly, their derived values were recomputed at
// every tile) and pass the turn on across items; an item of no key tiles ends the kernel. The same bits as the
// form a block an item. Otherwise block i of the 1-D grid is item i.
// The launch order (first_row below): grouped_longest_first (fox/attention_order.cuh) in groups of head_group
// heads. Cfg: FwdWsCfg<DH> / FwdWsPersistentCfg<DH> (the API); dev/cuda/attention_forward.cu times other shapes.
template <int DH, class Cfg = FwdWsCfg<DH>>
__global__ void __launch_bounds__(Cfg::THREADS, 1)
fwd_ws_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
              const __grid_constant__ CUtensorMap tm_v, const float *__restrict__ c, __nv_bfloat16 *__restrict__ o,
              float *__restrict__ lse, int H, int T, const int *__restrict__ kv_first, int head_group, int BH,
              int *__restrict__ next_item) {
    constexpr int BM = Cfg::BM, BN = FWD_WS_BN, NWG = Cfg::NWG, ST = Cfg::STAGES;
    constexpr bool SKIP = Cfg::SKIP_DEAD, PERSIST = Cfg::PERSISTENT;
    extern __shared__ __align__(1024) unsigned char fwd_smem[];  // 1024: the 128-byte swizzle's period
    __nv_bfloat16 *Qs = reinterpret_cast<__nv_bfloat16 *>(fwd_smem);
    __nv_bfloat16 *Ks = Qs + BM * DH;          // [ST][BN][DH]
    __nv_bfloat16 *Vs = Ks + ST * BN * DH;     // [ST][BN][DH]
    float *nbs = reinterpret_cast<float *>(Vs + ST * BN * DH);  // [ST][BN]: -(c_j - c_ref) log2e
    float *crefs = nbs + ST * BN;                                // [ST]
    float *crows = crefs + (ST + 1) / 2 * 2;                     // PERSIST: [BM], the item's rows' c
    int *items = reinterpret_cast<int *>(crows + (PERSIST ? BM : 0));  // PERSIST: [4], first row, head, key tiles
    uint64_t *q_full = reinterpret_cast<uint64_t *>(items + (PERSIST ? 4 : 0)), *q_empty = q_full + 1;  // q_empty: PERSIST
    uint64_t *k_full = q_full + 1 + PERSIST, *k_empty = k_full + ST, *v_full = k_empty + ST, *v_empty = v_full + ST;

    const int tid = threadIdx.x, lane = tid & 31;
    const int warp = __shfl_sync(0xffffffffu, tid >> 5, 0);  // shfl: provably warp-uniform
    const int g = lane >> 2, tq = lane & 3;
    const int nqb = (T + BM - 1) / BM;
    const int nacp = (T + FOX_ACP_BLOCK - 1) / FOX_ACP_BLOCK;
    // The blocks end at T rounded up to 64, so that where T is not a multiple of BM the short block is a head's first
    // (rows from q_shift - BM < 0: its warpgroups of rows below 0 are dead, one key tile each) rather than its last,
    // the longest walk. A multiple of 64: every warpgroup's rows stay in one ACP row block.
    const int q_shift = nqb * BM - (T + 63) / 64 * 64;
    auto first_row = [&](int i, int &bh) {  // item (block) i of the launch order: its head and first query row
        int mb;  // query block (the highest first: the longest rows)
        grouped_longest_first(i, nqb, PERSIST ? BH : (int)gridDim.x / nqb, head_group, mb, bh);
        return (nqb - 1 - mb) * BM - q_shift;
    };
    auto last_tile = [&](int q0) { return min((T - 1) / BN, (q0 + BM - 1) / BN); };
    auto wg_first = [&](int bh, int q0, int w) {  // the first live key tile of warpgroup w's ACP row block
        const int a = min(max(q0 + 64 * w, 0) / FOX_ACP_BLOCK, nacp - 1);
        return kv_first ? kv_first[(size_t)bh * nacp + a] * (FOX_ACP_BLOCK / BN) : 0;
    };
    auto count_tiles = [&](int bh, int q0) {  // the item's key tiles: its last down to its warpgroups' lowest first live one
        int n_first = wg_first(bh, q0, 0);
#pragma unroll
        for (int w = 1; w < NWG; w++) n_first = min(n_first, wg_first(bh, q0, w));
        return last_tile(q0) - n_first + 1;
    };

    int bh0;  // the block's one item without PERSIST (the persistent loops below place each of theirs)
    const int q00 = first_row((int)blockIdx.x, bh0);

    if (tid == 0) {
        mbar_init(q_full, PERSIST ? 32 : 1);
        if (PERSIST) mbar_init(q_empty, 4 * NWG);
        for (int s = 0; s < ST; s++) {
            mbar_init(k_full + s, 32);
            mbar_init(k_empty + s, 4 * NWG);
            mbar_init(v_full + s, 1);
            mbar_init(v_empty + s, 4 * NWG);
        }
        mbar_fence_init();
    }
    __syncthreads();

    if (warp >= Cfg::PRODUCER_WARP) {  // the producer
        setmaxnreg_dec<Cfg::REGS_PRODUCER>();
        if (warp != Cfg::PRODUCER_WARP) return;
        int s = 0, parity = 1, nload = 0;  // stage, the parity of its release by the tile ST earlier, tiles loaded
        auto load_q = [&](int q0, int bh) {  // an item's Q, completing q_full's phase
#pragma unroll
            for (int hf = 0; hf < DH / 64; hf++) tma_load_3d(Qs + hf * BM * 64, &tm_q, q_full, hf * 64, q0, bh);
        };
        auto load_tiles = [&](int q0, int bh, int ntiles) {  // the item's K, V and gate terms, stage by stage
            const float *ch = c + (size_t)bh * T;
            const int n_last = last_tile(q0);
            for (int it = 0; it < ntiles; it++) {
                const int n = n_last - it;
                const bool reuse = (PERSIST ? nload + it : it) >= ST;  // the stage held an earlier tile
                // The tile's c loads are in flight during the wait and K's copy; the gate terms are stored after.
                const float cref = ch[n * BN];
                float cj[BN / 32];
#pragma unroll
                for (int i = 0; i < BN / 32; i++) {
                    const int j = n * BN + lane + 32 * i;
                    cj[i] = j < T ? ch[j] : cref;
                }
                if (reuse) mbar_wait(k_empty + s, parity);
                if (lane == 0) {
                    mbar_expect_tx(k_full + s, BN * DH * 2);
#pragma unroll
                    for (int hf = 0; hf < DH / 64; hf++)
                        tma_load_3d(Ks + s * BN * DH + hf * BN * 64, &tm_k, k_full + s, hf * 64, n * BN, bh);
                    crefs[s] = cref;
                }
#pragma unroll
                for (int i = 0; i < BN / 32; i++) nbs[s * BN + lane + 32 * i] = key_gate_log2(cj[i], cref);
                mbar_arrive(k_full + s);
                if (reuse) mbar_wait(v_empty + s, parity);
                if (lane == 0) {
                    mbar_arrive_expect_tx(v_full + s, BN * DH * 2);
#pragma unroll
                    for (int hf = 0; hf < DH / 64; hf++)
                        tma_load_3d(Vs + s * BN * DH + hf * BN * 64, &tm_v, v_full + s, hf * 64, n * BN, bh);
                }
                if (++s == ST) s = 0, parity ^= 1;
            }
            if (PERSIST) nload += ntiles;
        };
        if constexpr (!PERSIST) {
            const int ntiles = count_tiles(bh0, q00);
            if (lane == 0) {
                mbar_arrive_expect_tx(q_full, BM * DH * 2);
                load_q(q00, bh0);
            }
            load_tiles(q00, bh0, ntiles);
        } else {
            const int nitems = nqb * BH;
            for (int i = blockIdx.x, j = 0;; j++) {
                if (j > 0) mbar_wait(q_empty, (j - 1) & 1);  // the consumers' last S of the previous item
                int bh = 0, q0 = 0, ntiles = 0;
                if (i < nitems) {
                    q0 = first_row(i, bh);
                    ntiles = count_tiles(bh, q0);
                }
                if (lane == 0) {
                    items[0] = q0;
                    items[1] = bh;
                    items[2] = ntiles;
                    if (ntiles) {
                        mbar_expect_tx(q_full, BM * DH * 2);
                        load_q(q0, bh);
                    }
                }
                const float *ch = c + (size_t)bh * T;
                if (ntiles)
                    for (int r = lane; r < BM; r += 32) crows[r] = q0 + r >= 0 && q0 + r < T ? ch[q0 + r] : 0.f;
                mbar_arrive(q_full);
                if (!ntiles) break;
                load_tiles(q0, bh, ntiles);
                int next = 0;
                if (lane == 0) next = (int)gridDim.x + atomicAdd(next_item, 1);
                i = __shfl_sync(0xffffffffu, next, 0);
            }
        }
        return;
    }
    // the consumers
    setmaxnreg_inc<Cfg::REGS_CONSUMER>();
    const int wg = warp >> 2;
    const float sl2 = LOG2E / sqrtf((float)DH);
    auto release = [&](uint64_t *bar) {  // lane 0 arrives for its warp once every lane's reads are done
        __syncwarp();
        if (lane == 0) mbar_arrive(bar);
    };
    int s = 0, ks_par = 0, vs = 0, vs_par = 0;  // K(t)'s stage and parity, V(t-1)'s
    // Declared here, not in attend: ptxas then fits the d_h 64 kernel a block an item without its 4-byte spill.
    uint32_t pprev[BN / 16][4];  // tile t-1's P as bf16 A fragments (zero before an item's tile 0)
    float oacc[DH / 8][4];
    auto pv_issue = [&](const __nv_bfloat16 *Vp) {  // O += P(t-1) V(t-1), one m64n64 product per half of V
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++)
#pragma unroll
            for (int hf = 0; hf < DH / 64; hf++)
                wgmma_m64n64_rs<1>(acc_half(oacc, hf), pprev[kk], desc_mnmajor<BN>(Vp, hf, kk));
    };
    const size_t ld_o = (size_t)H * DH;
    auto store_o = [&](int q0, int bh, const float (&inv)[2]) {  // the item's rows of O: oacc / l, as bf16
        __nv_bfloat16 *ob = o + (size_t)(bh / H) * T * ld_o + (size_t)(bh % H) * DH;
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int r = q0 + warp * 16 + g + 8 * hf;
            if (r < 0 || r >= T) continue;
#pragma unroll
            for (int nt = 0; nt < DH / 8; nt++)
                *reinterpret_cast<uint32_t *>(ob + r * ld_o + nt * 8 + 2 * tq) =
                    pack_bf16(oacc[nt][2 * hf] * inv[hf], oacc[nt][2 * hf + 1] * inv[hf]);
        }
    };
    auto attend = [&](int q0, int bh, int ntiles) {  // one item: its key tiles, then O and lse
        const float *ch = c + (size_t)bh * T;
        const int n_last = last_tile(q0);
        const int r0 = q0 + 64 * wg;  // this warpgroup's first row
        const int my_first = wg_first(bh, q0, wg);
        int row[2];
        float crow[2], m[2], l[2];  // gate, running max (log2 units), running sum
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            row[hf] = q0 + warp * 16 + g + 8 * hf;
            if constexpr (PERSIST) crow[hf] = crows[row[hf] - q0];
            else crow[hf] = row[hf] >= 0 && row[hf] < T ? ch[row[hf]] : 0.f;
            m[hf] = -INFINITY;
            l[hf] = 0.f;
        }
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) pprev[kk][0] = pprev[kk][1] = pprev[kk][2] = pprev[kk][3] = 0u;
#pragma unroll
        for (int i = 0; i < DH / 8; i++) oacc[i][0] = oacc[i][1] = oacc[i][2] = oacc[i][3] = 0.f;

        if constexpr (!PERSIST) {
            mbar_wait(q_full, 0);
            if (wg == NWG - 1) named_bar_arrive(1, 256);  // warpgroup 0 issues first
        }
        bool live_prev = false;  // tile t-1 was live for these rows (its P V is not zero)
        for (int it = 0; it < ntiles; it++) {
            const int n = n_last - it;
            // Dead for these rows: above their diagonal, pruned by ACP for their row block, or all of them below 0 (a
            // head's first block where T is not a multiple of 192, q_shift: at T 4096 and 16384 its first two
            // warpgroups); only with three warpgroups: two share the block's ACP row and diagonal key tile.
            const bool dead = NWG == 3 && (n * BN > r0 + 63 || n < my_first || r0 < 0);
            mbar_wait(k_full + s, ks_par);
            mbar_wait(v_full + vs, vs_par);
            if (wg == 0) named_bar_sync(1, 256);  // this warpgroup's turn (constant ids: ptxas counts the barriers)
            else if (wg == 1) named_bar_sync(2, 256);
            else named_bar_sync(3, 256);
            float sacc[BN / 8][4];
            wg_fence();
            static_assert(BN == 128, "S: one m64n128 product per k16 step");
            // A dead tile's S: its first k16 step alone (the product defines sacc; a branch around all of it would
            // serialize the kernel's warpgroup MMAs); the P V after a dead tile (P = 0) is skipped.
#pragma unroll
            for (int kk = 0; kk < DH / 16; kk++)
                if (!SKIP || kk == 0 || !dead)
                    wgmma_m64n128_ss<0, 0>(sacc, desc_kmajor<BM>(Qs, wg * 64, kk), desc_kmajor<BN>(Ks + s * BN * DH, 0, kk), kk > 0);
            wg_commit();  // then tile t-1's P V; only S is waited for here
            if (!SKIP || live_prev) pv_issue(Vs + vs * BN * DH);
            wg_commit();
            live_prev = !dead;
            if (wg == 0) named_bar_arrive(2, 256);  // the next warpgroup's turn (none after the last one's last tile,
            else if (wg == 1 && NWG == 3) named_bar_arrive(3, 256);  // but for the next item's)
            else if (PERSIST || it + 1 < ntiles) named_bar_arrive(1, 256);
            wg_wait<1>();
            if (PERSIST && it + 1 == ntiles) release(q_empty);  // the item's last S is complete (its rows' c read)
            if (SKIP && dead) {  // nothing of this tile reaches O: the stages go back, m, l and O keep their bits
                release(k_empty + s);
                wg_wait<0>();
                if (it > 0) release(v_empty + vs);
                if (it > 0 && ++vs == ST) vs = 0, vs_par ^= 1;
                if (++s == ST) s = 0, ks_par ^= 1;
                continue;
            }

            const float cref = crefs[s];
            float mt_max[2] = {-INFINITY, -INFINITY};
            const bool mask_all = !SKIP && dead;  // every key masked: a key limit of -1 (an all -inf branch spills)
            const int jmax[2] = {mask_all ? -1 : row[0], mask_all ? -1 : row[1]};
            // t = s log2e - a_i: the log2 score without the row's own gate term; element e + 2 hf is row hf
            auto scores = [&](auto masked) {  // std::true_type on this warpgroup's diagonal tile (or masked whole)
#pragma unroll
                for (int nt = 0; nt < BN / 8; nt++) {
                    const float2 nbj = *reinterpret_cast<const float2 *>(nbs + s * BN + nt * 8 + 2 * tq);  // key columns
#pragma unroll
                    for (int x = 0; x < 4; x++) {
                        const int hf = x >> 1, j = n * BN + nt * 8 + 2 * tq + (x & 1);
                        float t = fmaf(sacc[nt][x], sl2, x & 1 ? nbj.y : nbj.x);
                        if (decltype(masked)::value && j > jmax[hf]) t = -INFINITY;
                        sacc[nt][x] = t;
                        mt_max[hf] = fmaxf(mt_max[hf], t);
                    }
                }
            };
            if (n * BN + BN - 1 > r0 || mask_all) scores(std::true_type{});
            else scores(std::false_type{});
            release(k_empty + s);  // S(t) is complete and the gate terms read
            float sh[2], al[2], ps[2] = {0.f, 0.f};
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const float a = (crow[hf] - cref) * LOG2E;
                const float mn = fmaxf(m[hf], a + quad_max(mt_max[hf]));
                // Rows with nothing live yet keep max -inf: shift by 0 so exp2 sees -inf, not NaN.
                sh[hf] = mn == -INFINITY ? 0.f : mn - a;
                al[hf] = mn == -INFINITY ? 1.f : ex2(m[hf] - mn);
                m[hf] = mn;
            }
#pragma unroll
            for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
                for (int x = 0; x < 4; x++) {
                    sacc[nt][x] = ex2(sacc[nt][x] - sh[x >> 1]);
                    ps[x >> 1] += sacc[nt][x];
                }
#pragma unroll
            for (int hf = 0; hf < 2; hf++) l[hf] = l[hf] * al[hf] + ps[hf];  // quad-reduced at the end
            wg_wait<0>();  // tile t-1's P V has landed in O
            if (it > 0) release(v_empty + vs);
#pragma unroll
            for (int i = 0; i < DH / 8; i++)
#pragma unroll
                for (int x = 0; x < 4; x++) oacc[i][x] *= al[x >> 1];
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) acc_to_a(pprev[kk], sacc[2 * kk], sacc[2 * kk + 1]);
            if (it > 0 && ++vs == ST) vs = 0, vs_par ^= 1;  // V(t) is the next tile's V(t-1)
            if (++s == ST) s = 0, ks_par ^= 1;
        }
        mbar_wait(v_full + vs, vs_par);  // the last tile's P V
        wg_fence();
        if (!SKIP || live_prev) pv_issue(Vs + vs * BN * DH);
        wg_commit_wait();
        if constexpr (PERSIST) {  // its V stage goes back to the producer for the next item's tiles
            release(v_empty + vs);
            if (++vs == ST) vs = 0, vs_par ^= 1;
        }
        constexpr float LN2 = 0.6931471805599453f;
        float inv[2];
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const float lsum = quad_sum(l[hf]);
            inv[hf] = 1.f / lsum;
            if (row[hf] >= 0 && row[hf] < T && tq == 0) lse[(size_t)bh * T + row[hf]] = (m[hf] + log2f(lsum)) * LN2;
        }
        store_o(q0, bh, inv);
    };
    if constexpr (!PERSIST) {
        attend(q00, bh0, count_tiles(bh0, q00));
    } else {
        if (wg == NWG - 1) named_bar_arrive(1, 256);  // warpgroup 0 issues first
        for (int j = 0;; j++) {
            mbar_wait(q_full, j & 1);
            // shfl: the item provably warp-uniform
            const int q0 = __shfl_sync(0xffffffffu, items[0], 0), bh = __shfl_sync(0xffffffffu, items[1], 0);
            const int ntiles = __shfl_sync(0xffffffffu, items[2], 0);
            if (ntiles == 0) break;
            attend(q0, bh, ntiles);
        }
        if (wg == 0) named_bar_sync(1, 256);  // the last warpgroup's final turn
    }
}

// fwd_ws_kernel's launch in groups of `group` heads (capped at B H). The tensor maps are encoded per call (host
// work only; they carry the pointers) and passed by value. With Cfg::PERSISTENT, counter is fwd_item_counter's
// for s.
template <int DH, class Cfg>
void fwd_ws_launch(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const float *c,
                   __nv_bfloat16 *o, float *lse, int B, int H, int T, const int *kv_first, cudaStream_t s, int group,
                   int *counter) {
    const size_t smem = fwd_ws_smem_bytes<DH, Cfg>();
    FOX_CUDA_CHECK(cudaFuncSetAttribute(fwd_ws_kernel<DH, Cfg>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const CUtensorMap tq = tma_map_bf16_3d(q, DH, T, B * H, Cfg::BM), tk = tma_map_bf16_3d(k, DH, T, B * H, FWD_WS_BN),
                      tv = tma_map_bf16_3d(v, DH, T, B * H, FWD_WS_BN);
    const int nqb = (T + Cfg::BM - 1) / Cfg::BM;
    if (group > B * H) group = B * H;
    dim3 grid(nqb * B * H);
    if (Cfg::PERSISTENT) {
        FOX_CUDA_CHECK(cudaMemsetAsync(counter, 0, sizeof(int), s));
        grid.x = nqb * B * H < fox_sm_count() ? nqb * B * H : fox_sm_count();
    }
    fwd_ws_kernel<DH, Cfg><<<grid, Cfg::THREADS, smem, s>>>(tq, tk, tv, c, o, lse, H, T, kv_first, group, B * H, counter);
    FOX_LAUNCH_CHECK();
}

// The same in fwd_head_group's groups of heads.
template <int DH, class Cfg = FwdWsCfg<DH>>
void forward_ws(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const float *c,
                __nv_bfloat16 *o, float *lse, int B, int H, int T, const int *kv_first, cudaStream_t s,
                int *counter = nullptr) {
    const int nqb = (T + Cfg::BM - 1) / Cfg::BM;
    fwd_ws_launch<DH, Cfg>(q, k, v, c, o, lse, B, H, T, kv_first, s, fwd_head_group<DH>(nqb, T, B * H), counter);
}

// The forward the public API runs: on Hopper (an sm_90a build) the TMA-fed warpgroup-MMA kernel, persistent up to
// T = FWD_PERSISTENT_MAX_T, where it measured faster (`./attention_forward 0 persistent`), a block an item beyond;
// mma.sync otherwise.
template <int DH>
void forward(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const float *c,
             __nv_bfloat16 *o, float *lse, int B, int H, int T, const int *kv_first, cudaStream_t s) {
    if (!use_wgmma()) {
        forward_mma<DH>(q, k, v, c, o, lse, B, H, T, kv_first, s);
        return;
    }
    int *counter = T <= FWD_PERSISTENT_MAX_T ? fwd_item_counter(s) : nullptr;
    if (counter) forward_ws<DH, FwdWsPersistentCfg<DH>>(q, k, v, c, o, lse, B, H, T, kv_first, s, counter);
    else forward_ws<DH>(q, k, v, c, o, lse, B, H, T, kv_first, s);
}

}  // namespace fox_attn

#endif  // FOX_ATTENTION_FORWARD_CUH
