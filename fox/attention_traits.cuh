// fox/attention_traits.cuh: the attention kernels' tile shapes, threads per block and shared-memory
// sizes (fox/attention_forward.cuh, fox/attention_backward.cuh, and the experiments of dev/cuda), and
// the run-time choice between the warpgroup-MMA and mma.sync paths.
#ifndef FOX_ATTENTION_TRAITS_CUH
#define FOX_ATTENTION_TRAITS_CUH

#include <stddef.h>           // size_t
#include <stdlib.h>           // getenv
#include <string.h>           // strcmp
#include "acp.h"              // FOX_ACP_BLOCK: the ACP grid every tile nests in
#include "cuda_common.cuh"    // FOX_CUDA_CHECK

namespace fox_attn {

inline constexpr float LOG2E = 1.4426950408889634f;
// A key's term of the log2 scores, nb_j = -(c_j - c_ref) log2e with c_ref the gate at its tile's first key (the
// precision note of fox/attention_forward.cuh), in every kernel that forms scores, forward and backward.
__host__ __device__ __forceinline__ float key_gate_log2(float cj, float c_ref) { return -(cj - c_ref) * LOG2E; }
inline constexpr int NWARPS = 8;              // backward warps per block (the compute warps)
inline constexpr int NTHREADS = NWARPS * 32;
inline constexpr int FWD_BM = 128;            // forward: query rows per block
inline constexpr int FWD_BN = 64;             // forward: keys per pipelined tile (FwdCfg: 128 at WG dh 128)
inline constexpr int BWD_BN = 128;            // backward: keys per block (16 per warp)
static_assert(FWD_BM == FOX_ACP_BLOCK && BWD_BN == FOX_ACP_BLOCK, "tiles must nest in the ACP grid");

// The backward's fp32 dQ accumulator: per (b, h), ceil(T / 64) blocks of 64 query rows x
// d_h (rows past T are padding), each block in the order of the MMA accumulator fragments: 16-row warp slices,
// then per 8-column group the slice's rows g and g + 8, then per lane (g, tq) its columns 2 tq, 2 tq + 1. A
// warp's store or add of one fragment register pair then covers 256 contiguous bytes, and a query tile of 64
// or 128 rows is one contiguous range (one bulk add by the copy engine, fox/attention_backward.cuh).
inline constexpr int DQ_BLOCK = 64;
__host__ __device__ __forceinline__ size_t dq_acc_rows(int T) { return (size_t)(T + DQ_BLOCK - 1) / DQ_BLOCK * DQ_BLOCK; }
// Offset of row t, column c of one head's accumulator (t from the head's first row, or from any multiple of 64).
__host__ __device__ __forceinline__ int dq_acc_offset(int t, int c, int dh) {
    const int r = t % DQ_BLOCK, slice = r / 16, half = (r / 8) % 2, g = r % 8;
    return (t - r) * dh + (((slice * (dh / 8) + c / 8) * 2 + half) * 32 + g * 4 + (c % 8) / 2) * 2 + c % 2;
}

// Forward block shape. WG: the Hopper warpgroup-MMA path, 8 warps of 16 rows; mma.sync: each warp owns MT
// row tiles of 16, so every K/V fragment read from smem feeds MT mma.
template <int DH, bool WG = false> struct FwdCfg {
    static constexpr int MT = DH == 64 && !WG ? 2 : 1;  // dh 128 has no registers for a second row tile
    static constexpr int THREADS = FWD_BM / (16 * MT) * 32;
    // dh 64: 3 would cap mma.sync at 168 registers (spills); the warpgroup path needs ~126 at 256 threads.
    // dh 128: O alone is 64 registers per thread.
    static constexpr int MIN_BLOCKS = DH == 64 ? 2 : 1;
};

// Forward smem: the Q tile, K double-buffered, V double- (or, PIPE, triple-) buffered, the gate terms;
// key tiles of BN.
template <int DH, bool PIPE = false, int BN = FWD_BN> size_t fwd_smem_bytes() {
    static_assert(FOX_ACP_BLOCK % BN == 0, "key tiles nest in the ACP grid");
    return (size_t)(FWD_BM + (PIPE ? 5 : 4) * BN) * DH * 2 + (2 * BN + 2) * 4;
}

// The Hopper forward (fwd_ws_kernel): NWG consumer warpgroups of 64 query rows (a block of 64 NWG rows)
// and a producer warpgroup whose first warp issues the bulk tensor copies of Q, K and V and forms the gate
// terms. One block per SM; setmaxnreg moves the producer's registers to the consumers within the block's
// 65,536: d_h 64 has three consumer warpgroups, 128 x 24 + 384 x 160; d_h 128 two, 128 x 24 + 256 x 240 (S and
// O alone take 128 registers a thread there). K, V and the gate terms in STAGES stages; key tiles of FWD_WS_BN
// (S one m64n128 product per k16 step). GROUPED, the launch order: a 1-D grid in groups of heads, each
// group's longest query blocks first (grouped_longest_first; the group size is the launcher's, the API's
// fwd_head_group); else the grid (query blocks, heads), head after head (a group of one head). SKIP_DEAD: a
// warpgroup's dead tiles (fwd_ws_kernel) skip the softmax and P V rather than being masked whole. PERSISTENT:
// a block an SM taking the grouped order's items from a counter (fwd_ws_kernel). FwdWsShape derives the block's
// rows, threads and register split from NWG; FwdWsCfg<DH> is the API's form, FwdWsPersistentCfg<DH> its
// persistent form (up to T = FWD_PERSISTENT_MAX_T), dev/cuda/attention_forward.cu instantiates others.
inline constexpr int FWD_WS_BN = 128;
inline constexpr int FWD_PERSISTENT_MAX_T = 8192;  // the longest T the API runs the forward persistent at
template <int NWG_, int STAGES_, bool GROUPED_, bool SKIP_DEAD_, bool PERSISTENT_ = false> struct FwdWsShape {
    static constexpr int NWG = NWG_, STAGES = STAGES_;
    static constexpr bool GROUPED = GROUPED_, SKIP_DEAD = SKIP_DEAD_, PERSISTENT = PERSISTENT_;
    static constexpr int BM = 64 * NWG, THREADS = 128 * (NWG + 1), PRODUCER_WARP = 4 * NWG;
    static constexpr int REGS_CONSUMER = NWG == 3 ? 160 : 240, REGS_PRODUCER = 24;
    static_assert(REGS_PRODUCER * 128 + REGS_CONSUMER * 128 * NWG <= 65536, "the block's registers");
    static_assert(FOX_ACP_BLOCK % FWD_WS_BN == 0 && FOX_ACP_BLOCK % 64 == 0, "key tiles and warpgroups nest in the ACP grid");
};
template <int DH> struct FwdWsCfg : FwdWsShape<DH == 64 ? 3 : 2, DH == 64 ? 3 : 2, true, DH == 64> {};
template <int DH> struct FwdWsPersistentCfg : FwdWsShape<DH == 64 ? 3 : 2, DH == 64 ? 3 : 2, true, DH == 64, true> {};

// The order "longest first in groups of heads" of a 1-D grid of nheads x nblk blocks: block i lies in group
// i / (group nblk) of `group` heads (1 <= group <= nheads; the last group may have fewer), where every head's
// longest walk comes first, then every head's second longest, ... rank: the block's place in its head's walks
// (0: the longest); bh: the head.
__device__ __forceinline__ void grouped_longest_first(int i, int nblk, int nheads, int group, int &rank, int &bh) {
    const int per = group * nblk, g0 = i / per * group, r = i % per;
    const int heads = min(group, nheads - g0);
    rank = r / heads;
    bh = g0 + r % heads;
}

// Its smem: the Q tile, K and V in STAGES stages each, the gate terms of each stage (c_ref padded to an even
// count: the mbarriers are 8-byte aligned), with PERSISTENT the item's rows' c and the item (4 ints), then the
// mbarriers (Q full, with PERSISTENT Q empty, K full / empty, V full / empty per stage).
template <int DH, class Cfg = FwdWsCfg<DH>> constexpr size_t fwd_ws_smem_bytes() {
    constexpr int ST = Cfg::STAGES, P = Cfg::PERSISTENT;
    return (size_t)(Cfg::BM + 2 * ST * FWD_WS_BN) * DH * 2 + (ST * FWD_WS_BN + (ST + 1) / 2 * 2 + P * (Cfg::BM + 4)) * 4 +
           (1 + P + 4 * ST) * 8;
}

// The mma.sync backward's tiles (bwd_kernel): BM query rows per tile, MINB blocks per SM (register cap).
template <int DH> struct BwdCfg {
    static constexpr int BM = DH == 64 ? 64 : 32;  // dh 128: 32 keeps dK, dV and S^T in registers
    static constexpr int MINB = 1;
};

// Backward smem: K, V, Q and dO double-buffered, dS^T double-buffered, per-row stats and row sums.
template <int DH, int BM> size_t bwd_smem_bytes() {
    return (size_t)(2 * BWD_BN * DH + 4 * BM * DH + 2 * BWD_BN * BM) * 2 + (4 + 2 * NWARPS) * BM * 4;
}

// Backward smem with a TMA producer (bwd_ws_kernel, 384 threads: two compute warpgroups and a third that holds
// the sync warp and the producer): bwd_smem_bytes' tiles, then the mbarriers (K/V full, Q/dO/row-stat full and
// empty per stage, 2 stages; K/V empty) and two work-item slots (the persistent form's).
// With DQ_BULK, before the mbarriers: the query tile's dQ in the accumulator's order (dq_acc_offset) and its dc
// row sums, for the copy engine's and the sync warp's adds.
template <int DH, int BM, bool DQ_BULK> size_t bwd_ws_smem_bytes() {
    return bwd_smem_bytes<DH, BM>() + (DQ_BULK ? (size_t)BM * (DH + 1) * 4 : 0) + 6 * 8 + 2 * 4;
}

// The deterministic Hopper backward's form per head size (bwd_ws_kernel; each measured faster at its size,
// dev/cuda/NOTES.md sessions 8 and 9): TMA, a producer warp loads Q, dO and the row stats (else the compute
// warps, with cp.async); TURNS, the compute warpgroups take turns issuing their MMAs (0: never, 1: at each
// tile's first issue, 2: at every issue); MASK_PASS, the causal mask as a pass over S^T (else two copies of
// the P^T / dS^T loop); BM, the query rows per tile: 64, or 128 at d_h 64 (two sub-tiles of 64 per tile);
// DQ_BULK, a tile's dQ goes through smem to one bulk add by the copy engine (else fp32 atomics from registers);
// K_REGS (d_h 64), K's A fragments held in registers for S^T (else read from smem at every sub-tile; V's too
// did not fit: ptxas serialized the MMAs); PERSISTENT (since session 18), one block an SM taking key blocks in the
// launch order from a work counter (bwd_ws_kernel), else a block a key block;
// ORDER, the key blocks add a query tile in the fixed order (else as they come: --deterministic 0).
// GROUPED, the launch order: a 1-D grid in groups of HEAD_GROUP heads (0: bwd_head_group's, by T and d_h;
// bwd_block_of): with ORDER, in each group the first chain's key blocks, highest first, every head's at each
// rank, then the next chain's; without it every head's key block 0 (the longest walk), then every head's key
// block 1, ... Else the grid (key blocks, heads), highest key block first, head after head (one chain). Small
// groups keep a head's Q, dO and dQ accumulator in L2 for its blocks resident at once; all heads at once
// measured 33% slower at T 4096 (dev/cuda/NOTES.md, session 11).
template <int DH> struct BwdDetCfg {
    static constexpr bool TMA = true, MASK_PASS = DH == 64, DQ_BULK = true, ORDER = true, GROUPED = true;
    static constexpr bool K_REGS = DH == 64;
    static constexpr bool PERSISTENT = true;
    static constexpr int TURNS = DH == 128 ? 2 : 0;
    static constexpr int BM = DH == 64 ? 128 : 64;
    static constexpr int HEAD_GROUP = 0;
};
// The same kernel form without the order (the API's nondeterministic backward on Hopper), its blocks launched
// longest first in groups of 4 heads: with no order to keep, nothing waits on a block launched later.
template <int DH> struct BwdAtomicCfg : BwdDetCfg<DH> {
    static constexpr bool ORDER = false;
    static constexpr int HEAD_GROUP = 4;
};
// With the order, the first add of each query tile to its chain's accumulator stores it (bwd_ws_kernel): the
// accumulators are not zeroed first (bwd_dq reads only what was stored).
template <class Cfg> __host__ __device__ constexpr bool bwd_store_first() { return Cfg::ORDER && Cfg::DQ_BULK; }

// The deterministic order's chains (docs/model.md §1.6): a head's key blocks [0, nblk) split into `chains`
// ranges [lo(c), lo(c + 1)), halving: [0, nblk/2), [nblk/2, 3 nblk/4), ..., the last up to nblk (empty ones at
// small nblk). Each chain adds into its own dQ accumulator and dc row sums in its own fixed order (highest
// key block first), so its blocks wait only on blocks of the chain, and a chain of short walks launched after
// one of long walks keeps the order: the launch is longest chain first with no block ever waiting on one
// launched after it. bwd_dq adds the chains, first to last.
inline constexpr int BWD_CHAINS = 4;  // the API's deterministic backward; the scratch holds this many
__host__ __device__ __forceinline__ int bwd_chain_lo(int c, int chains, int nblk) {
    return c >= chains ? nblk : nblk - (nblk >> c);
}
// Whether chain c has a live key block in ACP row m (q_last: the ACP hook, this head's, or NULL): its first
// block is at or below the diagonal, and it holds the diagonal block m or its highest block is live there (the
// row's live blocks are [kv_first[m], m], fox/acp.h). A chain without one never touched the row's tiles.
__host__ __device__ __forceinline__ bool bwd_chain_live(int c, int chains, int nblk, int m, const int *qlh) {
    const int lo = bwd_chain_lo(c, chains, nblk), hi = bwd_chain_lo(c + 1, chains, nblk);
    return lo <= m && lo < hi && (m < hi || !qlh || qlh[hi - 1] >= m);
}

// Block i of a GROUPED backward's 1-D grid (BwdDetCfg, above; nheads x nblk blocks): its key block nb, head bh
// and chain. ordered: the chains' order (rank r of chain [lo, hi) is key block lo + hi - 1 - r); else longest
// first (one chain).
__device__ __forceinline__ void bwd_block_of(int i, int nblk, int nheads, int group, bool ordered, int chains, int &nb,
                                             int &bh, int &chain) {
    int rank;
    grouped_longest_first(i, nblk, nheads, group, rank, bh);
    chain = 0;
    nb = rank;
    if (!ordered) return;
    while (rank >= bwd_chain_lo(chain + 1, chains, nblk)) chain++;
    nb = bwd_chain_lo(chain, chains, nblk) + bwd_chain_lo(chain + 1, chains, nblk) - 1 - rank;
}

// The sync warpgroup's register split (setmaxnreg): 2 compute warpgroups x 240 + the sync warpgroup x 24
// = 64.5k of the 65536 registers (the 384-thread block starts at 168 each, 64.5k).
inline constexpr int BWD_REGS_COMPUTE = 240, BWD_REGS_SYNC = 24;

// Whether the kernels take the warpgroup-MMA path: the current device (queried once) is a Hopper
// (compute capability 9.x; the build must then be sm_90a), and FOX_ATTN_NO_WGMMA is unset or "0"
// (set it to fall back to the mma.sync kernels, e.g. to compare).
inline bool use_wgmma() {
    static const bool yes = [] {
        int dev = 0, m = 0;
        FOX_CUDA_CHECK(cudaGetDevice(&dev));
        FOX_CUDA_CHECK(cudaDeviceGetAttribute(&m, cudaDevAttrComputeCapabilityMajor, dev));
        const char *e = getenv("FOX_ATTN_NO_WGMMA");
        return m == 9 && !(e && e[0] && strcmp(e, "0") != 0);
    }();
    return yes;
}

}  // namespace fox_attn

#endif  // FOX_ATTENTION_TRAITS_CUH
