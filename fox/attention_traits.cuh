// fox/attention_traits.cuh: the attention kernels' tile shapes, threads per block and shared-memory
// sizes (fox/attention_forward.cuh, fox/attention_backward.cuh), and the run-time choice between the
// warpgroup-MMA and mma.sync paths.
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
inline constexpr int FWD_BN = 64;             // forward (mma.sync): keys per pipelined tile
inline constexpr int BWD_BN = 128;            // backward: keys per block (16 per warp)
static_assert(FWD_BM == FOX_ACP_BLOCK && BWD_BN == FOX_ACP_BLOCK && FOX_ACP_BLOCK % FWD_BN == 0,
              "tiles must nest in the ACP grid");

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

// The mma.sync forward's block shape (fwd_kernel): each warp owns MT row tiles of 16, so every K/V fragment read
// from smem feeds MT mma.
template <int DH> struct FwdCfg {
    static constexpr int MT = DH == 64 ? 2 : 1;  // dh 128 has no registers for a second row tile
    static constexpr int THREADS = FWD_BM / (16 * MT) * 32;
    // dh 64: 3 would cap mma.sync at 168 registers (spills). dh 128: O alone is 64 registers per thread.
    static constexpr int MIN_BLOCKS = DH == 64 ? 2 : 1;
};

// Its smem: the Q tile, K and V double-buffered, the gate terms.
template <int DH> size_t fwd_smem_bytes() {
    return (size_t)(FWD_BM + 4 * FWD_BN) * DH * 2 + (2 * FWD_BN + 2) * 4;
}

// The Hopper forward (fwd_ws_kernel): NWG consumer warpgroups of 64 query rows (a block of 64 NWG rows)
// and a producer warpgroup whose first warp issues the bulk tensor copies of Q, K and V and forms the gate
// terms. One block per SM; setmaxnreg moves the producer's registers to the consumers within the block's
// 65,536: d_h 64 has three consumer warpgroups, 128 x 24 + 384 x 160; d_h 128 two, 128 x 24 + 256 x 240 (S and
// O alone take 128 registers a thread there). K, V and the gate terms in STAGES stages; key tiles of FWD_WS_BN
// (S one m64n128 product per k16 step). The blocks run in the launch order of fox/attention_order.cuh (a 1-D
// grid in groups of heads, each group's longest query blocks first). SKIP_DEAD (d_h 64): a warpgroup's dead
// tiles (fwd_ws_kernel) skip the softmax and P V rather than being masked whole. PERSISTENT: a block an SM
// taking the order's items from a counter (fwd_ws_kernel). FwdWsShape derives the block's rows, threads and
// register split from NWG; FwdWsCfg<DH> is the API's form, FwdWsPersistentCfg<DH> its persistent form (up to
// T = FWD_PERSISTENT_MAX_T); dev/cuda/attention_forward.cu times other shapes.
inline constexpr int FWD_WS_BN = 128;
inline constexpr int FWD_PERSISTENT_MAX_T = 8192;  // the longest T the API runs the forward persistent at
template <int NWG_, int STAGES_, bool SKIP_DEAD_, bool PERSISTENT_ = false> struct FwdWsShape {
    static constexpr int NWG = NWG_, STAGES = STAGES_;
    static constexpr bool SKIP_DEAD = SKIP_DEAD_, PERSISTENT = PERSISTENT_;
    static constexpr int BM = 64 * NWG, THREADS = 128 * (NWG + 1), PRODUCER_WARP = 4 * NWG;
    static constexpr int REGS_CONSUMER = NWG == 3 ? 160 : 240, REGS_PRODUCER = 24;
    static_assert(REGS_PRODUCER * 128 + REGS_CONSUMER * 128 * NWG <= 65536, "the block's registers");
    static_assert(FOX_ACP_BLOCK % FWD_WS_BN == 0 && FOX_ACP_BLOCK % 64 == 0, "key tiles and warpgroups nest in the ACP grid");
};
template <int DH> struct FwdWsCfg : FwdWsShape<DH == 64 ? 3 : 2, DH == 64 ? 3 : 2, DH == 64> {};
template <int DH> struct FwdWsPersistentCfg : FwdWsShape<DH == 64 ? 3 : 2, DH == 64 ? 3 : 2, DH == 64, true> {};

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
// the sync warp and the producer): bwd_smem_bytes' tiles, the query tile's dQ in the accumulator's order
// (dq_acc_offset) and its dc row sums (for the copy engine's and the sync warp's adds), then the mbarriers (K/V
// full, Q/dO/row-stat full and empty per stage, 2 stages; K/V empty) and two work-item slots.
template <int DH, int BM> size_t bwd_ws_smem_bytes() {
    return bwd_smem_bytes<DH, BM>() + (size_t)BM * (DH + 1) * 4 + 6 * 8 + 2 * 4;
}

// The Hopper backward's form per head size (bwd_ws_kernel, which describes each; the fastest measured at each
// size): BM, the query rows per tile: 128 at d_h 64 (two sub-tiles of 64 per tile), 64 at d_h 128; TURNS (d_h
// 128), the compute warpgroups take turns at every MMA issue; MASK_PASS (d_h 64), the causal mask as a pass over
// S^T (else two copies of the P^T / dS^T loop); K_REGS (d_h 64), K's A fragments held in registers for S^T (else
// read from smem at every sub-tile). ORDER: the key blocks add a query tile in the fixed order, in chains
// (BwdDetCfg), or as they come (BwdAtomicCfg, --deterministic 0). The launch order and its groups of heads are
// fox/attention_order.cuh's (bwd_block_of, bwd_head_group).
template <int DH> struct BwdDetCfg {
    static constexpr bool ORDER = true, TURNS = DH == 128, MASK_PASS = DH == 64, K_REGS = DH == 64;
    static constexpr int BM = DH == 64 ? 128 : 64;
};
template <int DH> struct BwdAtomicCfg : BwdDetCfg<DH> {
    static constexpr bool ORDER = false;
};
// With the order, the first add of each query tile to its chain's accumulator stores it (bwd_ws_kernel): the
// accumulators are not zeroed first (bwd_dq reads only what was stored).
template <class Cfg> __host__ __device__ constexpr bool bwd_store_first() { return Cfg::ORDER; }

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
