// fox/attention_order.cuh: the order in which the attention kernels' blocks run (FlashAttention-3's
// tile_scheduler.hpp): the launch order "longest first in groups of heads", the group of heads per kernel and
// shape, the deterministic backward's chains (the fixed order of its dQ and dc adds, docs/model.md §1.6), and the
// persistent forward's work counter. Used by fox/attention_forward.cuh and fox/attention_backward.cuh.
// Measurements and the variants tried: dev/cuda/NOTES.md, section "Index: the notes of each product kernel".
#ifndef FOX_ATTENTION_ORDER_CUH
#define FOX_ATTENTION_ORDER_CUH

#include <cuda_runtime.h>             // cudaStream_t, cudaMalloc, cudaStreamIsCapturing
#include <mutex>                      // std::mutex: fwd_item_counter's table
#include <vector>                     // std::vector: fwd_item_counter's table
#include "cuda_common.cuh"            // FOX_CUDA_CHECK, fox_sm_count

namespace fox_attn {

// The order "longest first in groups of heads" of a 1-D grid of nheads x nblk blocks: block i lies in group
// i / (group nblk) of `group` heads (1 <= group <= nheads; the last group may have fewer), where every head's
// longest walk comes first, then every head's second longest, ... rank: the block's place in its head's walks
// (0: the longest); bh: the head. A group of one head is head after head, each head's longest walk first.
__device__ __forceinline__ void grouped_longest_first(int i, int nblk, int nheads, int group, int &rank, int &bh) {
    const int per = group * nblk, g0 = i / per * group, r = i % per;
    const int heads = min(group, nheads - g0);
    rank = r / heads;
    bh = g0 + r % heads;
}

// The forward's group of heads at nqb query blocks a head, as measured by `./attention_forward 0 orders` (held
// at the power cap with FOX_BENCH_SUSTAIN). At d_h 64, at most 16 heads, and only as many as have their K and V
// (T d_h 4 bytes a head) within FWD_GROUP_KV_BYTES, half the H100's L2, so that every query block after a head's
// first reads them from L2, not DRAM; of those, the most that divide the bh heads (a short last group costs more
// than a smaller group), unless only 1 does. At d_h 128, about one wave of blocks (head after head at T 16384,
// 2 heads at T 8192, 4 at T 4096).
inline constexpr long long FWD_GROUP_KV_BYTES = 24LL << 20;
template <int DH> int fwd_head_group(int nqb, int T, int bh) {
    if (DH == 128) {
        const int g = fox_sm_count() / nqb;
        return g > 1 ? g : 1;
    }
    const long long fit = FWD_GROUP_KV_BYTES / ((long long)T * DH * 4);
    const int cap = fit < 1 ? 1 : fit > 16 ? 16 : (int)fit;
    int divisor = 1;
    for (int g = 2; g <= cap; g++)
        if (bh % g == 0) divisor = g;
    return divisor > 1 ? divisor : cap;
}

// The persistent forward's work counter for stream s on the current device: one a (device, stream), so that
// forwards on different streams never share one (zeroed on its stream before each launch); allocated on first
// use and kept (4 bytes a stream). NULL while s is being captured into a graph and has none yet (cudaMalloc is
// not allowed there): the caller then launches a block an item.
inline int *fwd_item_counter(cudaStream_t s) {
    struct Counter {
        int device;
        cudaStream_t stream;
        int *p;
    };
    static std::mutex lock;
    static std::vector<Counter> counters;
    int device;
    FOX_CUDA_CHECK(cudaGetDevice(&device));
    std::lock_guard<std::mutex> guard(lock);
    for (const Counter &x : counters)
        if (x.device == device && x.stream == s) return x.p;
    cudaStreamCaptureStatus capture;
    FOX_CUDA_CHECK(cudaStreamIsCapturing(s, &capture));
    if (capture != cudaStreamCaptureStatusNone) return nullptr;
    int *p;
    FOX_CUDA_CHECK(cudaMalloc(&p, sizeof(int)));
    counters.push_back({device, s, p});
    return p;
}

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

// Block i of the Hopper backward's 1-D grid (nheads x nblk blocks, in groups of `group` heads): its key block nb,
// head bh and chain. ordered: the chains' order (rank r of chain [lo, hi) is key block lo + hi - 1 - r); else
// longest first (one chain).
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

// The deterministic backward's group of heads: as many heads as keep their Q, dO and one fp32 dQ accumulator,
// T d_h 8 bytes a head, within 32 MB (of the H100's 50 MB of L2), at most 8: 4 at (T, d_h) = (16384, 64), 2 at
// (16384, 128), 8 at (4096, 128), the fastest of 1, 2, 4 and 8 heads at each of those shapes
// (`./attention_backward 50,51,52,53 bench`). The nondeterministic backward's group is BWD_ATOMIC_HEAD_GROUP.
inline int bwd_head_group(int T, int dh) {
    const long long g = (32LL << 20) / ((long long)T * dh * 8);
    return g > 8 ? 8 : g > 1 ? (int)g : 1;
}
// With no order to keep, nothing waits on a block launched later: the nondeterministic backward's key blocks run
// longest first in groups of this many heads.
inline constexpr int BWD_ATOMIC_HEAD_GROUP = 4;

}  // namespace fox_attn

#endif  // FOX_ATTENTION_ORDER_CUH
