// dev/cuda/attention_backward.cu: the Forgetting Attention backward (step 2, the dK / dV / dQ / dS-sums
// kernel) in every version tried, numbered by the order of the dQ / dc adds across key blocks, each
// checked against the fp64 CPU reference (attention_ref.h) and timed beside the public API
// (fox/attention.cuh, whose kernels are versions 1 and 3 on mma.sync, and on warpgroup MMA at both head sizes
// fox/attention_backward.cuh's bwd_ws_kernel: 50 in the order's four chains, 47 in one, 41 without the order;
// its deterministic ones were 13 and 15 until session 8, 35 / 33 at d_h 64 / 128 until session 9, 38 / 33 until
// session 10, and its nondeterministic warpgroup-MMA kernels 14 / 16 until session 10). Versions 29-40, 42-46 and
// 51-56 and 63 run bwd_ws_forms_kernel below: the product's kernel with every switch tried (63: at the API's
// settings).
//   make attention_backward
//   ./attention_backward            every version: checks, then timings
//   ./attention_backward 13         version 13 only (and the API); 13,15,21: those three
//   ./attention_backward 13 check   (or bench) one half; bench 4: the first 4 bench shapes
//   ./attention_backward 0 blocks   the API's cost per query tile and per key block (ACP staircases of n tiles)
//   FOX_BENCH_SUSTAIN=S ./attention_backward ... bench   each timing held S seconds (the rate at the power cap)
// Each version runs on the paths it was built for: mma.sync (d_h 64 with 64-row query tiles, d_h 128 with
// 32) and / or warpgroup MMA (d_h 64 or 128 with 64-row tiles, Hopper; skipped where fox_attn::use_wgmma()
// is false).
//
// Versions (figures: backward TFLOP/s, T 16384, d_h 64 unless noted; NOTES.md has the full tables):
//  1 BWD_ATOMIC       fp32 atomics in arrival order, dQ step after the tile's other work (not
//                     deterministic). mma.sync: 231 (H200, session 3 run 3), 227 at d_h 128; wgmma: 307
//                     (H200, session 2), 317-320 (H200, session 3), 322 (H100, session 4), 326 (H100,
//                     session 5). The API's nondeterministic mma.sync kernel.
//  2 BWD_ORDERED      the same adds in a fixed order, every warp waits after its tile: mma.sync 183 (H200,
//                     session 2 run 2), 179 at d_h 128.
//  3 BWD_STAGGER      ordered, half the warps do their dQ step first: mma.sync 205 (H200, session 2),
//                     208 at d_h 128. The API's deterministic mma.sync kernel.
//  4 BWD_BLOCK        ordered per block, thread 0 polls and releases: mma.sync 179 (H200), 174 at d_h 128;
//                     wgmma 214-216 (H200, sessions 2 and 3; the default then).
//  5 BWD_SYNC         a 9th sync warp on the per-tile barrier, dQ step first: wgmma 276-278 (H200, session 3).
//  6 BWD_SYNC2        two sync warps (release / acquire): wgmma 278-279 (H200, session 3).
//  7 BWD_SYNC_NOWAIT  5 without the waits (timing control, not deterministic): wgmma 276-278 (H200).
//  8 BWD_SYNC_LATE    sync warp off the barrier, dQ step last, 168 registers: wgmma 277 (H200, session 3),
//                     279-281 (H100, session 4).
//  9 BWD_ATOMIC_EARLY 1 with the dQ step first (timing control): wgmma 290 (H200, session 3).
// 10 BWD_SYNC_WG      8 in a 384-thread block, setmaxnreg 240 / 24, a barrier per warpgroup: wgmma 307
//                     (H100, session 4), 306-308 (H100, session 5).
// 11 BWD_SYNC_WG_FULLBAR  10 with one barrier for both warpgroups (control): wgmma 282-283 (H100, session 4).
// 12 BWD_SYNC_LATE_WGBAR  8 with a barrier per warpgroup, 168 registers (control): wgmma 303 (H100, session 4).
// 13 BWD_SYNC_WG_PIPE 10 with the warpgroup MMAs pipelined across the tile's steps: wgmma 327 (H100,
//                     session 5). The API's deterministic wgmma kernel.
// 14 BWD_ATOMIC_PIPE  1 on wgmma with the pipelined MMAs (not deterministic): 338-340 (H100, session 5).
//                     The API's nondeterministic wgmma kernel at d_h 64.
// 15 BWD_SYNC_WG_PIPE at d_h 128 on wgmma (session 7): tiles as two 64-column halves, BM 64, 128 keys per
//                     block (64 per compute warpgroup), dQ of tile it-1 issued after tile it's softmax step
//                     (DQ_LATE); 4 bytes of spill (one loop-invariant register, one reload per tile). The API's
//                     deterministic wgmma kernel at d_h 128: 349.5-356.7 at T 16384 B 2 H 8, 300.2-304.7 at
//                     T 4096 B 8 H 8 (H100, session 7 runs 1-3; mma.sync version 3 in run 1: 207.4 / 184.6).
// 16 BWD_ATOMIC_PIPE at d_h 128 on wgmma (not deterministic, control; 255 registers). The API's
//                     nondeterministic wgmma kernel at d_h 128: 406.6-411.3 at T 16384, 343.3-348.3 at T 4096
//                     (the same runs; mma.sync version 1 in run 1: 230.1 / 204.9).
// 17 BWD_SYNC_WG_PIPE_DQ_EARLY: 15 with d_h 64's MMA order (dQ of tile it-1 beside S^T / dP^T of tile it):
//                     control; ptxas spills 584 bytes under setmaxnreg 240 and serializes the warpgroup MMAs
//                     (C7512): 217.2 at T 16384, 197.3 at T 4096 (run 1).
// 18 BWD_SYNC_WG_PIPE_NOWAIT: 13 (d_h 64) / 15 (d_h 128) with a sync warp that does not wait (timing
//                     control, not deterministic: the same kernel, the adds in arrival order). d_h 128: 354.0
//                     beside 15's 349.6 at T 16384, 300.8 / 300.2 at T 4096; d_h 64: 317.7 beside 13's 320.3
//                     (run 2). The waits cost nothing.
// 19 BWD_ATOMIC_PIPE_REGS: 14 (d_h 64) / 16 (d_h 128) under 13's / 15's register budget (a 384-thread
//                     block, setmaxnreg 240 for the compute warpgroups, the third exits; timing control; 60
//                     bytes of spill at d_h 128, none at d_h 64). d_h 128: 362.5 beside 15's 355.6 at T 16384
//                     (16: 409.2 in the same run), 314.5 / 300.4 at T 4096; d_h 64: 319.5 beside 13's 320.3
//                     (run 3). The deterministic kernels' loss to the atomics ones is this block shape.
// 20 BWD_SYNC_WG_PIPE_ADDS_LAST: 13 / 15 with the dQ adds after tile it's dV/dK products complete (the
//                     adds no longer overlap them, but P^T / dS^T fragments are dead there: registers).
//                     d_h 128: 352.5 beside 15's 349.5, 304.5 / 302.4 at T 4096; d_h 64: 310.0 beside 320.0
//                     (run 3). Not taken.
// 21-28 (session 8): the deterministic order in the atomics kernel's block (256 threads, no sync warp, no
// setmaxnreg; 255 registers at d_h 128, 224-232 at d_h 64, no spills), a counter per (query tile, compute
// warpgroup); every deterministic one gives the API's results bit for bit (checked at every check shape
// and both bench sizes). Figures: H200 at 1980 MHz, backward TFLOP/s, T 16384 B 2 H 16 (d_h 64) / B 2 H 8
// (d_h 128), then T 4096 B 8 H 16 / B 8 H 8; run 1 | run 2, the API (deterministic: 13 / 15) and the
// atomics kernel (14 / 16) beside them in each run: API 312.9 / 346.2, 276.2 / 308.9 | 314.1 / 347.2,
// 273.4 / 305.6; atomics 332.8 / 404.3, 293.2 / 354.8 | 335.3 / 406.8, 290.0 / 351.2.
// 21 BWD_WG_LANE      every warp's lane 0 issues its acquire (ld.acquire) while the tile's S^T / dP^T
//                     products run and checks it before its adds; the warpgroup's first warp releases one
//                     tile late, also while the products run: 263.8 / 340.9, 234.8 / 304.5 | 265.2 / 343.1,
//                     233.3 / 305.9. Slower than the API at d_h 64 (-15%), level at d_h 128 (-1.5 to +0.1%).
// 22 BWD_WG_LANE_LATE_ACQ: 21 with each warp's acquire issued just before its adds: 251.2 / 350.6, 229.3 /
//                     316.4 (run 1): +1-2% over the API at d_h 128, -17 to -20% at d_h 64.
// 23 BWD_WG_LANE_NOWAIT: 21 whose acquires do not wait (timing control): 304.2 / 369.0, 271.3 / 331.3 |
//                     305.8 / 374.8, 268.6 / 330.5. 21's waits cost 7-13%: blocks below now do wait.
// 24 BWD_WG_LANE_WARP_REL: every warp releases its own adds right after issuing them (counters count warps):
//                     237.9 / 305.4, 212.2 / 277.9 (run 2): the fences wait for the adds just issued.
// 25 BWD_WG_LANE_WG_REL: a warpgroup barrier after the adds, then one release: 242.6 / 321.1, 217.7 / 287.3.
// 26 BWD_WG_LANE_REL_ONLY: 14 / 16 plus 21's releases alone (control): 300.0 / 376.5, 268.2 / 332.7 (run 2):
//                     the release's fence (MEMBAR.ALL.GPU) on a compute warp costs 7-10%.
// 27 BWD_WG_LANE_ACQ_ONLY: 14 / 16 plus 21's acquires alone (control): 330.8 / 406.0, 287.3 / 350.6: the
//                     acquires (LDG.STRONG.GPU + CCTL.IVALL, 8 per tile) cost 0-1.5%.
// 28 BWD_WG_LANE_TOP_REL: 21 with the release right after the block barrier, before the next tile's loads:
//                     256.7 / 331.7, 227.1 / 293.3 (run 2).
// 29-35 (session 8, "the deterministic backward with the forward's lessons"; bwd_ws_kernel's forms): the then API's
// deterministic kernel (13 / 15) with the forward's three changes, every one bitwise the API's results (the
// same arithmetic in the same order; checked by `one_chain_bits`). Backward TFLOP/s on an H200 (1980 MHz, one run,
// 2026-11-25 23:10 UTC) at T 4096 / 16384, d_h 64 | d_h 128, beside 13 / 15: 276.0 / 314.9 | 308.5 / 348.4.
// ptxas (nvcc 13.0, sm_90a), spill stores at d_h 64 / 128 (13 / 15: 0 / 4 bytes) after the colon.
// 29 the causal mask on the diagonal tiles alone (two copies of the P^T / dS^T loop): 0 / 64.
//    275.4 / 314.7 | 318.1 / 360.1.
// 30 29 + the compute warpgroups taking turns at every MMA issue (named barriers 4, 5): 0 / 112.
//    231.0 / 260.7 | 296.2 / 335.8.
// 31 29 + turns at each tile's first MMA issue only: 0 / 68. 235.5 / 266.6 | 295.5 / 334.3.
// 32 29 + a TMA producer warp in the sync warpgroup (K, V once; Q, dO, rs, Ds per tile, 2 stages): 0 / 0.
//    267.7 / 304.9 | 335.1 / 383.5.
// 33 32 + turns at every MMA issue: 0 / 0. 261.6 / 297.6 | 353.8 / 408.3: the API's form at d_h 128.
// 34 32 + turns at each tile's first MMA issue only: 0 / 0. 267.5 / 305.0 | 332.0 / 379.2.
// 35 29 with the mask as a pass setting S^T to -inf before one copy of the loop: 0 / 12.
//    286.2 / 329.1 | 313.0 / 354.9: the API's form at d_h 64.
// 36-39 (session 9): BM, query tiles of 128 rows at d_h 64 walked as two sub-tiles of 64 (NOTES.md session 9):
//    36 = 35 with them (cp.async), 37 = 36 + turns, 38 = 36 + the TMA producer (the API's form at d_h 64 until
//    session 10), 39 = 38 + turns. T 4096 / 16384 (B 2, H 16): 272.0 / 311.2, 246.1 / 280.1, 286.9 / 334.5,
//    287.0 / 333.9 beside 35's 283.6 / 325.9 (H200).
// 40 (session 10): 38 (d_h 64) / 33 (d_h 128) with DQ_BULK: each tile's dQ stored to smem in the accumulator's
//    fragment order and added by the copy engine in one bulk reduction, issued by the sync warp inside the
//    order (NOTES.md session 10). The API's form at both head sizes: T 4096 / 16384, d_h 64: 342.9 / 426.1
//    beside 38's 285.2 / 337.4; d_h 128: 400 / 481 against 33's 352 / 406 (H200).
// 41 (session 11): the nondeterministic API, 40 without the order, launched longest first in groups of 4 heads;
//    42 the same launched in 40's order (NOTES.md session 11).
// 45, 46 (session 12): 41 in groups of 8 and 16 heads: level with 41 at every bench shape (H100: T 4096 351.9 /
//    354.1 against 353.9, T 16384 B 1 H 12 435.1 / 427.1 against 434.4).
// 47-50 (session 16): the API's deterministic form (since session 16: its order in BWD_CHAINS chains, each
//    with its own accumulator, launched longest chain first in groups of 4 heads; NOTES.md session 16) in one,
//    two, three and four chains; 47 gives 40's bits. 51-53: 50 launched in groups of 1, 2 and 8 heads.
// 56 (session 17): 50 at d_h 64 with K read from smem at every S^T sub-tile, the API's form until the API took
//    K's fragments into registers once a block (K_REGS; the same bits, checked by `api_bits`): the API +1.8-2.4%
//    over 56 at the d_h 64 bench shapes (H100: T 4096 363.9 against 357.6, B 1 H 24 447.9 against 437.3). K and
//    V both in registers (commit 95e7bcb) made ptxas serialize the MMAs: 324.5 / 395.0 at T 4096 / 16384.
//    A persistent form (one block an SM taking key blocks from a work counter, the next K / V copy under the
//    dK / dV stores; commit 559ee4e, reverted): level with 50 (NOTES.md session 17).
// 54, 55 (session 18): since session 18 the API (50, 41) is that persistent form, its work item read through shfl
//    (warp-uniform; session 17's read it plainly from smem) and K in registers once a key block; 54 and 55 are the
//    API's forms before, a block a key block. H100, `./attention_backward 54,55 bench` twice with the persistent
//    form as 54 and the API of the time beside it: T 4096 d_h 64 374.4-374.6 against 364.8-370.0, d_h 128
//    426.9-427.4 against 421.2-421.5, T 16384 B 2 H 16 453.7-453.8 against 446.8-450.6, d_h 128 515.1-515.3
//    against 513.2-514.2, B 1 H 12 443.3-443.4 against 433.4-433.5, B 1 H 24 451.3-451.7 against 444.9-448.7.
// 57, 58 (session 19, commit 8959126, removed since): the API's forms (50, 41) before ITEM_OVERLAP, an experiment in
//    the API at d_h 64: K in two buffers, V given back at the last tile's dP^T, the next key block claimed early and
//    its K / V loaded then, the last tile's dQ product under the next key block's first tile. Same bits; level or
//    slower (H100, two runs: T 4096 377.4 / 377.7 against 57's 377.3 / 375.6, B 2 H 16 452.0 / 452.0 against 450.1
//    / 453.6, B 1 H 12 437.2 / 440.6 against 442.9 / 443.2, B 1 H 24 449.3 / 446.1 against 451.8 / 451.6).
// Step 3 inside step 2 (session 20, commit 1d64e76, removed since; no version of its own: the API's kernel with a
//    runtime switch): the persistent backward's two idle warps convert each query tile's dQ once its last live
//    chain has added it. Same bits; the API's backward alone, in its better protocol, 1-2% faster at (4096, 64),
//    6-7% slower at (4096, 128), level to 3% slower at T 16384 (H100; NOTES.md session 20 has both protocols and
//    their ceilings).
// 59-61 (session 25, commit 867a03c, removed since): the API's deterministic form at d_h 64 with a fourth warpgroup
//    for the dQ products (the compute warpgroups hand each tile's dS^T and row sums over through two mbarriers; the
//    dQ warpgroup multiplies and stores the tile for the sync warp's bulk add). Registers 2 x 208 + 64 + 24: K out
//    of the registers (59; 88 bytes spilled), K in them (60; 228 bytes), 59 with turns (61). Same bits. H100, against
//    the API in the same calls: T 4096 377.0 / 374.4 against 374.1 / 373.9, B 1 H 24 444.9 / 448.3 against 451.3 /
//    451.2 (61: 454.5 / 454.4), 60 36% slower: level (NOTES.md session 25).
// 62 (session 25, commit 6e5f912, removed since): the API's deterministic form at d_h 64 with sub-tile 0's dV / dK
//    products issued after sub-tile 1's S^T / dP^T, under its softmax step. Same bits; 3-5% slower (H100: B 1 H 24
//    428.0 / 428.0 against 451.1 / 447.1).
// 63 (2026-11-29): bwd_ws_forms_kernel, this program's copy of the product kernel with every switch of versions
//    29-56, at the API's settings; it must give the API's bits (api_bits). Since 2026-11-29 the product's
//    bwd_ws_kernel holds the API's settings alone, and the other forms run here.
#include "attention_ref.h"  // reference, checks, timing; includes fox/attention.cuh (primitives, traits)

#include <limits.h>  // INT_MAX
#include <stdlib.h>

namespace fox_attn_dev {
using namespace fox_attn;  // the primitives, the tile constants, steps 1 and 3 of the product backward

// How the backward adds dQ and the dc row sums across key blocks. BWD_ATOMIC: fp32 atomics in whatever
// order they land (not deterministic; kept to time the order's cost). BWD_ORDERED: the same adds, in
// a fixed order (see bwd_kernel). BWD_STAGGER: ordered, and half the warps do their dQ step before the
// tile's other work, so each scheduler has one warp computing while the other waits on memory.
// BWD_BLOCK: ordered, one thread per block polls and releases (see bwd_kernel). BWD_SYNC: ordered, a 9th
// "sync" warp alone waits on and releases the counters (see bwd_kernel). BWD_SYNC2: the same with two
// such warps, one releasing and one acquiring, so their latencies overlap. BWD_SYNC_NOWAIT: BWD_SYNC
// without the waits (a timing control, not deterministic). BWD_SYNC_LATE: a sync warp off the per-tile
// barrier, the dQ step after the tile's other work (see bwd_kernel). BWD_SYNC_WG: BWD_SYNC_LATE in a
// 384-thread block whose third warpgroup holds the sync warp and gives its registers to the two compute
// warpgroups (setmaxnreg: 240 / 24 instead of 168 for all), and each compute warpgroup waits for the sync
// warp's acquire on its own named barrier (2, 3) instead of one shared by all 8 compute warps, so the two
// warpgroups do not wait on each other there (the public default at dh 64 on Hopper until BWD_SYNC_WG_PIPE).
// BWD_ATOMIC_EARLY: BWD_ATOMIC with the dQ step before the tile's other work (a timing control).
// BWD_SYNC_WG_FULLBAR: BWD_SYNC_WG with BWD_SYNC_LATE's single barrier 2 (all 8 compute warps meet the sync
// warp before their adds); BWD_SYNC_LATE_WGBAR: BWD_SYNC_LATE (288 threads, 168 registers) with BWD_SYNC_WG's
// barrier per warpgroup. Both are controls.
// BWD_SYNC_WG_PIPE / BWD_ATOMIC_PIPE: BWD_SYNC_WG / BWD_ATOMIC with the warpgroup MMAs pipelined across
// the tile's steps (see bwd_kernel): tile it-1's dQ product runs on the tensor cores during tile it's
// softmax work, and tile it's dV/dK products during tile it-1's dQ adds. The public defaults at dh 64 on
// Hopper (deterministic / not). Same results bit for bit as without the pipelining. At dh 128 they issue
// tile it-1's dQ product after tile it's softmax step (DQ_LATE, see bwd_kernel); BWD_SYNC_WG_PIPE_DQ_EARLY
// is BWD_SYNC_WG_PIPE at dh 128 with the dh 64 order instead (a control: it spills). BWD_SYNC_WG_PIPE_NOWAIT:
// BWD_SYNC_WG_PIPE whose sync warp does not wait for the blocks above (a timing control, not deterministic:
// the same kernel and barriers, the adds in arrival order). BWD_ATOMIC_PIPE_REGS: BWD_ATOMIC_PIPE in
// BWD_SYNC_WG_PIPE's 384-thread block, whose third warpgroup only gives its registers back (setmaxnreg
// 240 / 24) and exits: a control for what the compute warps' register budget costs.
// BWD_SYNC_WG_PIPE_ADDS_LAST: BWD_SYNC_WG_PIPE whose dQ adds wait for tile it's dV/dK products too, so
// the P^T and dS^T fragments (32 registers at dh 128) are dead during the adds.
// BWD_WG_LANE (and its variants, see bwd_kernel): BWD_ATOMIC_PIPE's block and schedule with the order
// kept by the compute warps themselves, one lane at a time, per warpgroup.
enum {
    BWD_ATOMIC = 0, BWD_ORDERED = 1, BWD_STAGGER = 2, BWD_BLOCK = 3, BWD_SYNC = 4, BWD_SYNC2 = 5, BWD_SYNC_NOWAIT = 6,
    BWD_SYNC_LATE = 7, BWD_ATOMIC_EARLY = 8, BWD_SYNC_WG = 9, BWD_SYNC_WG_FULLBAR = 10, BWD_SYNC_LATE_WGBAR = 11,
    BWD_SYNC_WG_PIPE = 12, BWD_ATOMIC_PIPE = 13, BWD_SYNC_WG_PIPE_DQ_EARLY = 14, BWD_SYNC_WG_PIPE_NOWAIT = 15,
    BWD_ATOMIC_PIPE_REGS = 16, BWD_SYNC_WG_PIPE_ADDS_LAST = 17, BWD_WG_LANE = 18, BWD_WG_LANE_LATE_ACQ = 19,
    BWD_WG_LANE_NOWAIT = 20, BWD_WG_LANE_WARP_REL = 21, BWD_WG_LANE_WG_REL = 22, BWD_WG_LANE_REL_ONLY = 23,
    BWD_WG_LANE_ACQ_ONLY = 24, BWD_WG_LANE_TOP_REL = 25
};
// threads per backward block: BWD_SYNC / BWD_SYNC2 add one / two sync warps to the NWARPS compute warps
constexpr int bwd_threads(int mode) {
    return mode == BWD_SYNC || mode == BWD_SYNC_NOWAIT || mode == BWD_SYNC_LATE || mode == BWD_SYNC_LATE_WGBAR
               ? NTHREADS + 32
           : mode == BWD_SYNC2                                                   ? NTHREADS + 64
           : mode == BWD_SYNC_WG || mode == BWD_SYNC_WG_FULLBAR || mode == BWD_SYNC_WG_PIPE ||
                   mode == BWD_SYNC_WG_PIPE_DQ_EARLY || mode == BWD_SYNC_WG_PIPE_NOWAIT || mode == BWD_ATOMIC_PIPE_REGS ||
                   mode == BWD_SYNC_WG_PIPE_ADDS_LAST
               ? NTHREADS + 128
                                                                                 : NTHREADS;
}

// Ordering primitives only version 4 (BWD_BLOCK) uses.
__device__ __forceinline__ int ld_relaxed_gpu(const int *p) {
    int v;
    asm volatile("ld.global.relaxed.gpu.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;\n" ::: "memory"); }


// Backward, step 2. Block = BWD_BN keys of one (b, h); warp w owns keys 16w..16w+15 and keeps their dK,
// dV in registers while query tiles of BM rows stream through (from the diagonal to the last live one).
// Per tile each warp forms S^T and dP^T for its keys, P^T, dS^T = P^T (dP^T - D), accumulates
// dV += P^T dO and dK += dS^T Q, and parks dS^T in smem (double-buffered); in the next iteration all
// warps compute dQ = dS K for that tile and add it to the fp32 accumulator (software-pipelined: one
// block barrier per tile).
// dc: dc_t = sum_j dS_tj - sum_i dS_it. The row sum would vanish in exact arithmetic (softmax is shift
// invariant), but D is formed from the bf16-rounded o, and that rounding error e_t enters both sums:
// dc_t picks up -e_t + sum_i P_it e_i. Summed into dlogf the two parts cancel; with the column sum alone
// they random-walk (3e-2 relative error in dlogf at T = 1000). So both sums are kept, in fp32: column
// sums in registers (written to `colsum`, one writer per key), row sums reduced across the block.
//
// Determinism (BWD_ORDERED, BWD_STAGGER): the dQ and dc-row-sum contributions of the key blocks to a
// query tile are fp32 atomic adds (fire and forget, into a zeroed accumulator), but issued in a fixed
// order, highest key block first, so each address sees the same sequence of adds every run. A per-tile
// counter `sem` orders them: every warp of key block n waits (acquire) until all warps of the live key
// blocks above n in the tile's ACP row have released, adds, and releases one tile later (by then its
// adds have landed, so the release costs no wait). Blocks are launched highest key block first
// (blockIdx.x reversed), so a block only ever waits on blocks launched before it (no deadlock whatever
// the occupancy), and block n+1 reaches each query tile one ACP row before block n does, so the waits
// are short. dK, dV and the column sums are per-block register sums: deterministic by construction.
// BWD_BLOCK: the same order, kept per block instead of per warp: thread 0 reads the counter of tile it
// (relaxed) while the tile is computed, checks it at the end (fence.acq_rel, or spins with acquire)
// before the barrier after which every warp adds tile it; and releases tile it-2 right after the
// barrier that follows all warps' adds of it. Both sit on the block's critical path (about 1 us a tile).
// BWD_SYNC: the same order as BWD_BLOCK, with the counters taken off the compute warps' path: a 9th warp
// (the sync warp, NWARPS * 32 + 32 threads per block) joins the per-tile block barrier and does nothing
// else. In iteration it, after barrier it, it waits on named barrier 1, which every compute warp arrives
// at (without waiting) once it has issued tile it-1's adds, releases tile it-1, then acquires tile it
// (spins until the live key blocks above have released it) before it arrives at barrier it+1, after
// which the compute warps add tile it. Its fence and spin stall only itself. BWD_SYNC2: warp NWARPS
// only releases, warp NWARPS + 1 only acquires (from barrier it on, in parallel with the release).
// BWD_SYNC_LATE: the sync warp stays off the per-tile barrier (the compute warps use barrier 0 with a
// count of NWARPS * 32), and the dQ step of tile it-1 comes after tile it's other work (as in
// BWD_ATOMIC). Per tile t the sync warp acquires t, arrives at named barrier 2 (which the compute warps
// wait on just before adding t, after its dQ product), waits on named barrier 1 (every compute warp has
// issued its adds of t), releases t, and moves on to t+1: it has a whole tile's work for release and
// acquire, and neither its fence nor its spin is on the compute warps' path unless a predecessor is late.
// BWD_SYNC_WG: the same protocol; warps NWARPS..NWARPS+3 form a third warpgroup that runs setmaxnreg.dec
// (then all but warp NWARPS exit), the compute warpgroups setmaxnreg.inc: ptxas caps the 384-thread
// block at 168 registers per thread at entry and compiles the compute path for BWD_REGS_COMPUTE
// (highest register R194 in the SASS). Barrier 2 is split per warpgroup: the sync warp arrives at 2 and 3 (128 + 32 each), compute
// warpgroup w4 syncs on 2 + w4. Each warpgroup adds only its own dQ columns (and warpgroup 0 the dc row
// sums), so every address still sees this block's adds of a tile between the same acquire and release,
// and the sync warp still waits (barrier 1) for all 8 compute warps' adds before it releases.
// WG: the five products on Hopper warpgroup MMA (sm_90a; BM 64; dh 128 below): warpgroup w4 (warps 4w4..4w4+3)
// owns keys 64 w4.., so every accumulator keeps the mma.sync layout and the rest of the kernel is shared.
// PIPE (BWD_SYNC_WG_PIPE, BWD_ATOMIC_PIPE): per tile it a warpgroup commits three MMA groups, S^T/dP^T of
// tile it, then dQ of tile it-1, then dV/dK of tile it, and waits for each only where its result is
// needed: S^T/dP^T before the softmax step (dQ keeps running), dQ before its adds (dV/dK keep running),
// dV/dK before the next tile's barrier (their register operands, and the Q/dO buffer the next prefetch
// overwrites). The dQ issue is unconditional (at it = 0 on a zeroed dS^T buffer, result unused): ptxas
// serializes every warpgroup MMA of the kernel when the issue sits under a branch (C7514).
// WG at dh 128: K, V, Q and dO tiles are stored as 64-column halves (swz_halves), each a canonical
// 128-byte-swizzle operand: S^T and dP^T walk both halves in their k16 steps, dV and dK are one m64n64
// product per half of dO / Q, and warpgroup w4's dQ columns are K's half w4 (m64n64). dK and dV hold
// 128 registers per thread, so with PIPE the dQ product of tile it-1 is issued after tile it's softmax
// step, just before dV/dK (DQ_LATE: S^T, dP^T (64) and the dQ product (32) are never live together), and
// the dS row sums are reduced before the MMAs (their 16 registers freed).
// BWD_WG_LANE: the same add order as BWD_SYNC_WG_PIPE in BWD_ATOMIC_PIPE's 256-thread block. Each warpgroup
// adds only its own dQ columns (warpgroup 0 also the dc row sums), so the order is kept per warpgroup, by
// a counter per (tile, warpgroup) (two per tile in `sem`): in iteration it, while the warpgroup's first
// MMAs run, every warp's lane 0 issues an ld.acquire of tile it-1's counter (whose adds come later in
// the iteration; the value is checked just before them, spinning only if short, then __syncwarp), and
// lane 0 of the warpgroup's first warp releases tile it-2 (added before this iteration's block barrier,
// which orders every warp's adds before the release). A block releases nothing in an ACP row where it is
// the lowest live key block. Variants: LATE_ACQ acquires just before the adds; WARP_REL releases each
// warp's adds right after issuing them (counters count warps); WG_REL releases after a warpgroup barrier
// that follows the adds; TOP_REL releases right after the block barrier; NOWAIT, REL_ONLY and ACQ_ONLY
// are timing controls (not deterministic).
template <int DH, int BM, int MINB, int MODE, bool WG>
__global__ void __launch_bounds__(bwd_threads(MODE), MINB)
bwd_kernel(const __nv_bfloat16 *__restrict__ q, const __nv_bfloat16 *__restrict__ k,
           const __nv_bfloat16 *__restrict__ v, const float *__restrict__ c,
           const __nv_bfloat16 *__restrict__ dout, const float *__restrict__ lse, const float *__restrict__ Dg,
           float *__restrict__ dq_acc, __nv_bfloat16 *__restrict__ dk,
           __nv_bfloat16 *__restrict__ dv, float *__restrict__ dc, float *__restrict__ colsum, int *__restrict__ sem,
           int H, int T, const int *__restrict__ q_last) {
    constexpr int BN = BWD_BN, TPB = FOX_ACP_BLOCK / BM;  // TPB query tiles per ACP row
    static_assert(FOX_ACP_BLOCK % BM == 0, "query tiles nest in the ACP grid");
    static_assert(!WG || BM == 64, "warpgroup path: the dQ product's M is the tile's 64 queries");
    extern __shared__ __align__(1024) unsigned char bwd_smem[];  // 1024: the 128-byte swizzle's period
    __nv_bfloat16 *Ks = reinterpret_cast<__nv_bfloat16 *>(bwd_smem);  // [BN][DH]
    __nv_bfloat16 *Vs = Ks + BN * DH;                                   // [BN][DH]
    __nv_bfloat16 *Qs = Vs + BN * DH;                                   // [2][BM][DH]
    __nv_bfloat16 *dOs = Qs + 2 * BM * DH;                              // [2][BM][DH]
    __nv_bfloat16 *dSt = dOs + 2 * BM * DH;                             // [2][BN][BM]: dS^T
    float *rs = reinterpret_cast<float *>(dSt + 2 * BN * BM);           // [2][BM]: a_i - lse_i log2e
    float *Ds = rs + 2 * BM;                                            // [2][BM]
    float *rowsum = Ds + 2 * BM;                                        // [2][NWARPS][BM]: dS row sums

    const int tid = threadIdx.x, lane = tid & 31;
    const int warp = __shfl_sync(0xffffffffu, tid >> 5, 0), w4 = warp >> 2;  // shfl: provably warp-uniform
    const int g = lane >> 2, tq = lane & 3;
    const int nblk = gridDim.x;
    const int nb = nblk - 1 - blockIdx.x;  // key block: highest first (see above)
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const size_t head_off = (size_t)bh * T;
    const __nv_bfloat16 *qh = q + head_off * DH, *kh = k + head_off * DH, *vh = v + head_off * DH;
    const float *ch = c + head_off, *lh = lse + head_off, *Dh = Dg + head_off;
    const size_t ld_o = (size_t)H * DH;
    const __nv_bfloat16 *doh = dout + (size_t)b * T * ld_o + (size_t)h * DH;
    float *dqh = dq_acc + head_off * DH;
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

    constexpr bool SYNC_PIPE = MODE == BWD_SYNC_WG_PIPE || MODE == BWD_SYNC_WG_PIPE_DQ_EARLY ||
                               MODE == BWD_SYNC_WG_PIPE_NOWAIT || MODE == BWD_SYNC_WG_PIPE_ADDS_LAST;
    constexpr bool ADDS_LAST = MODE == BWD_SYNC_WG_PIPE_ADDS_LAST;  // dQ adds after dV/dK complete
    constexpr bool REGS_ONLY = MODE == BWD_ATOMIC_PIPE_REGS;  // the sync warpgroup's registers, no sync warp
    // one lane per warp / warpgroup keeps the order (see above); LATE_ACQ: each warp's acquire right before
    // its adds instead of early; NOWAIT: the acquires' values ignored (timing control, not deterministic);
    // WARP_REL: every warp releases its own adds right after issuing them (the counters count warps);
    // WG_REL: the warpgroup's first warp releases right after a warpgroup barrier that follows the adds;
    // REL_ONLY / ACQ_ONLY: 21's releases alone / acquires alone (timing controls, not deterministic);
    // TOP_REL: 21 with its release right after the block barrier, before the next tile's loads are issued
    constexpr bool WLANE = MODE >= BWD_WG_LANE && MODE <= BWD_WG_LANE_TOP_REL;
    constexpr bool EARLY_ACQ = MODE != BWD_WG_LANE_LATE_ACQ;
    constexpr bool ACQ = WLANE && MODE != BWD_WG_LANE_REL_ONLY;
    constexpr bool WAITS = MODE == BWD_WG_LANE || MODE == BWD_WG_LANE_LATE_ACQ || MODE == BWD_WG_LANE_WARP_REL ||
                           MODE == BWD_WG_LANE_WG_REL || MODE == BWD_WG_LANE_TOP_REL;
    constexpr bool REL_LATE = MODE == BWD_WG_LANE || MODE == BWD_WG_LANE_LATE_ACQ || MODE == BWD_WG_LANE_NOWAIT ||
                              MODE == BWD_WG_LANE_REL_ONLY;  // one tile late, at the order point
    constexpr bool REL_TOP = MODE == BWD_WG_LANE_TOP_REL;  // one tile late, after the block barrier
    constexpr int REL_PER_BLOCK = MODE == BWD_WG_LANE_WARP_REL ? 4 : 1;  // releases per warpgroup and tile
    constexpr bool PIPE = SYNC_PIPE || MODE == BWD_ATOMIC_PIPE || REGS_ONLY || WLANE;  // pipelined warpgroup MMAs
    constexpr bool REGS = MODE == BWD_SYNC_WG || MODE == BWD_SYNC_WG_FULLBAR || SYNC_PIPE;  // setmaxnreg
    constexpr bool WGBAR = MODE == BWD_SYNC_WG || MODE == BWD_SYNC_LATE_WGBAR || SYNC_PIPE;  // barrier 2 per wg
    constexpr bool LATE = MODE == BWD_SYNC_LATE || REGS || MODE == BWD_SYNC_LATE_WGBAR;
    constexpr bool SYNCW = MODE == BWD_SYNC || MODE == BWD_SYNC2 || MODE == BWD_SYNC_NOWAIT || LATE;
    static_assert(!REGS || WG, "BWD_SYNC_WG: setmaxnreg needs the sm_90a warpgroup path");
    static_assert(!WGBAR || WG, "per-warpgroup barriers: a warpgroup adds its own dQ columns (warpgroup path)");
    static_assert(!PIPE || WG, "pipelined MMAs: warpgroup path");
    // BWD_WG_LANE: one counter per (query tile, compute warpgroup), tile qt's of warpgroup w4 at semw[2 qt]
    int *semw = sem + (size_t)bh * 2 * nqt + w4;
    // BWD_WG_LANE: the lowest live key block of ACP row m is nb iff m is past the last row of block nb - 1
    const int ql_below = nb > 0 && qlh ? qlh[nb - 1] : nb > 0 ? INT_MAX : -1;
    // dh 128: dQ of tile it-1 issued after tile it's softmax step, just before dV/dK (see above)
    constexpr bool DQ_LATE = PIPE && DH == 128 && MODE != BWD_SYNC_WG_PIPE_DQ_EARLY;
    if constexpr (REGS_ONLY) {
        if (warp >= NWARPS) {
            setmaxnreg_dec<BWD_REGS_SYNC>();
            return;
        }
        setmaxnreg_inc<BWD_REGS_COMPUTE>();
    }
    if constexpr (LATE) {
        if (warp >= NWARPS) {  // the sync warp (see above); BWD_SYNC_WG: its warpgroup gives registers back
            if constexpr (REGS) setmaxnreg_dec<BWD_REGS_SYNC>();
            if (warp != NWARPS) return;  // BWD_SYNC_WG: warps NWARPS+1.. have nothing to do
            int ord_row = -1, before = 0;
            bool last = false;
            for (int t = qt_first; t <= qt_last; t++) {
                const int m = t / TPB;
                if (m != ord_row) {
                    ord_row = m;
                    acp_order(m, nb, 0, nblk, qlh, before, last);
                }
                if (MODE != BWD_SYNC_WG_PIPE_NOWAIT && lane == 0 && before > 0) {
                    unsigned spins = 0;
                    while (ld_acquire_gpu(semh + t) < before) {
                        __nanosleep(32);
                        if (++spins > (1u << 27)) __trap();  // a missing predecessor: fail loudly, never hang
                    }
                }
                __syncwarp();
                if constexpr (WGBAR) {  // t acquired: each compute warpgroup may add it, independently
                    named_bar_arrive(2, 128 + 32);
                    named_bar_arrive(3, 128 + 32);
                } else {
                    named_bar_arrive(2, NTHREADS + 32);  // t acquired: the compute warps may add it
                }
                named_bar_sync(1, NTHREADS + 32);    // every compute warp has issued its adds of t
                if (lane == 0) red_release_gpu_add(semh + t, 1);
                __syncwarp();
            }
            return;
        }
        if constexpr (REGS) setmaxnreg_inc<BWD_REGS_COMPUTE>();
    } else if constexpr (SYNCW) {
        if (warp >= NWARPS) {  // the sync warp(s) (see above): the compute warps never touch the counters
            const bool rel = warp == NWARPS, acq = MODE != BWD_SYNC2 || warp == NWARPS + 1;
            int ord_row = -1, before = 0;
            bool last = false;
            for (int it = 0; it <= ntiles; it++) {
                __syncthreads();  // barrier it
                if (rel && it > 0) {
                    named_bar_sync(1, NTHREADS + 32);  // every compute warp has issued tile it-1's adds
                    if (lane == 0) red_release_gpu_add(semh + qt_first + it - 1, 1);
                }
                if (acq && it < ntiles) {
                    const int m = (qt_first + it) / TPB;
                    if (m != ord_row) {
                        ord_row = m;
                        acp_order(m, nb, 0, nblk, qlh, before, last);
                    }
                    if (MODE == BWD_SYNC_NOWAIT && lane == 0 && before > 0) {
                        (void)ld_acquire_gpu(semh + qt_first + it);  // the load, without waiting on it
                    } else if (lane == 0 && before > 0) {
                        unsigned spins = 0;
                        while (ld_acquire_gpu(semh + qt_first + it) < before) {
                            __nanosleep(32);
                            if (++spins > (1u << 27)) __trap();  // a missing predecessor: fail loudly, never hang
                        }
                    }
                }
                __syncwarp();
            }
            return;
        }
    }

    // Loader threads tid < BM fetch per-query values; rows past T get lse = +inf so their P is 0.
    auto fetch_rows = [&](int qt, float &r, float &d) {
        const int i = qt * BM + tid;
        if (tid < BM) {
            const bool ok = i < T;
            r = ok ? (ch[i] - c_ref) * LOG2E - lh[i] * LOG2E : -INFINITY;
            d = ok ? Dh[i] : 0.f;
        }
    };
    auto store_rows = [&](int buf, float r, float d) {
        if (tid < BM) {
            rs[buf * BM + tid] = r;
            Ds[buf * BM + tid] = d;
        }
    };

    if constexpr (PIPE) {  // dS^T buffer 1: the operand of the unused dQ product issued in iteration 0
        uint4 *z = reinterpret_cast<uint4 *>(dSt + BN * BM);
        for (int i = tid; i < BN * BM / 8; i += NTHREADS) z[i] = make_uint4(0u, 0u, 0u, 0u);
    }
    load_key_block_async<DH, BN, BM, NTHREADS, WG>(Ks, Vs, Qs, dOs, kh, vh, qh, doh, (int)ld_o, k0, qt_first * BM, T,
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
    const bool early = (MODE == BWD_STAGGER && warp < NWARPS / 2) || MODE == BWD_BLOCK || MODE == BWD_ATOMIC_EARLY ||
                       (SYNCW && !LATE);
    int seen = 0;  // BWD_WG_LANE, lane 0: the counter of the tile this warp adds next, as last read
    // BWD_WG_LANE, in iteration it while the warpgroup's MMAs run (the warp would wait for them anyway): the
    // warpgroup's first warp releases tile it-2 (its adds were issued before this iteration's barrier, an
    // iteration ago, so the release's fence finds them landed), and every warp issues its acquire of tile
    // it-1, whose adds come later in this iteration (dq_phase checks the value, spinning only if short).
    auto order_point = [&](int it) {
        if (REL_LATE && it >= 2 && (warp & 3) == 0 && lane == 0) {
            const int qt = qt_first + it - 2;
            if (qt / TPB <= ql_below) red_release_gpu_add(semw + 2 * qt, 1);  // a live key block below waits
        }
        const int qt = qt_first + it - 1;
        if (ACQ && EARLY_ACQ && it >= 1 && lane == 0 && qt / TPB > nb) seen = ld_acquire_gpu(semw + 2 * qt);
    };
    // this block's place in the order for ACP row m (same for every tile of the row); warp-uniform
    auto ord_update = [&](int m) {
        if (m == ord_m) return;
        ord_m = m;
        acp_order(m, nb, 0, nblk, qlh, ord_before, ord_last);
    };

    // dQ of tile it-1 = dS K from its parked dS^T. WG: warpgroup w4 takes all 64 query rows and dh columns
    // DQC w4..; A = dS (dS^T in smem: MN-major), B = K (MN-major: 32 columns from byte 64 w4 of the one
    // half at dh 64, half w4 at dh 128); issued only (the caller fences, commits and waits).
    auto dq_mma_issue = [&](int it, float (&dqa)[DQC / 8][4]) {
        const __nv_bfloat16 *dSb = dSt + ((it - 1) & 1) * BN * BM;
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            if constexpr (DQC == 32)
                wgmma_m64n32_ss<1, 1>(dqa, gmma_desc(dSb + kk * 16 * BM), gmma_desc(Ks + kk * 16 * DH + w4 * 32), kk > 0);
            else
                wgmma_m64n64_ss<1, 1>(dqa, gmma_desc(dSb + kk * 16 * BM), desc_mnmajor<BN>(Ks, w4, kk), kk > 0);
        }
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
    // dQ (and dc row sums) of tile it-1 added to the fp32 accumulators (dqa: its dQ product, complete).
    auto dq_phase = [&](int it, float (&dqa)[DQC / 8][4]) {
        const int pb = (it - 1) & 1, qt = qt_first + it - 1, i0 = qt * BM;
        const __nv_bfloat16 *dSb = dSt + pb * BN * BM;
        if constexpr (WG && !PIPE) {
            wg_fence();
            dq_mma_issue(it, dqa);
            wg_commit_wait();
        } else if constexpr (!WG) {
            dq_tile_mma_sync<DH, BM, DQC>(dqa, dSb, Ks, dq_r, dq_c, lane);
        }
        float rtot = 0.f;
        if (tid < BM) {
#pragma unroll
            for (int w = 0; w < NWARPS; w++) rtot += rowsum[(pb * NWARPS + w) * BM + tid];
        }
        int *sp = semh + qt;
        if constexpr (WLANE) {  // this warpgroup of every live key block above has released tile qt
            const int before = REL_PER_BLOCK * (qt / TPB - nb);
            if (!EARLY_ACQ && lane == 0 && before > 0) seen = ld_acquire_gpu(semw + 2 * qt);
            if (WAITS && lane == 0 && before > 0) {
                unsigned spins = 0;
                while (seen < before) {
                    __nanosleep(32);
                    seen = ld_acquire_gpu(semw + 2 * qt);
                    if (++spins > (1u << 27)) __trap();  // a missing predecessor: fail loudly, never hang
                }
            }
            __syncwarp();  // lane 0's acquire before every lane's adds
        }
        if (MODE == BWD_ORDERED || MODE == BWD_STAGGER) {
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
        // the sync warp has acquired tile it-1 (WGBAR: a barrier per warpgroup, so the two warpgroups do not
        // wait on each other here)
        if (LATE) {
            if (WGBAR && w4 == 0) named_bar_sync(2, 128 + 32);  // constant ids: ptxas counts 4 barriers, not 16
            else if (WGBAR) named_bar_sync(3, 128 + 32);
            else named_bar_sync(2, NTHREADS + 32);
        }
        // fp32 adds; in the ordered modes every address sees its adds in one fixed order
        const int qr0 = i0 + dq_r + g;
#pragma unroll
        for (int nt = 0; nt < DQC / 8; nt++) {
            const int col = dq_c + nt * 8 + 2 * tq;
            if (qr0 < T) atomic_add2(dqh + (size_t)qr0 * DH + col, dqa[nt][0], dqa[nt][1]);
            if (qr0 + 8 < T) atomic_add2(dqh + (size_t)(qr0 + 8) * DH + col, dqa[nt][2], dqa[nt][3]);
        }
        if (tid < BM && i0 + tid < T) atomicAdd(dc + head_off + i0 + tid, rtot);
        if constexpr (MODE == BWD_WG_LANE_WARP_REL) {  // this warp's adds, released at once
            __syncwarp();
            if (lane == 0 && qt / TPB <= ql_below) red_release_gpu_add(semw + 2 * qt, 1);
        }
        if constexpr (MODE == BWD_WG_LANE_WG_REL) {  // the warpgroup's adds, released at once by its first warp
            if (w4 == 0) named_bar_sync(1, 128);  // constant ids: ptxas counts barriers by id
            else named_bar_sync(2, 128);
            if ((warp & 3) == 0 && lane == 0 && qt / TPB <= ql_below) red_release_gpu_add(semw + 2 * qt, 1);
        }
        if ((MODE == BWD_ORDERED || MODE == BWD_STAGGER) && !ord_last) pending = sp;
        if (SYNCW) named_bar_arrive(1, NTHREADS + 32);  // this warp's adds of tile it-1 issued
    };

    float dqp[DQC / 8][4];  // dQ product of tile it-1 (PIPE: in flight during tile it's softmax or dV/dK work)
    for (int it = 0; it <= ntiles; it++) {
        const int buf = it & 1;
        cp_async_wait_all();
        if constexpr (WG) fence_proxy_async_smem();  // cp.async and dS^T writes -> wgmma reads
        // Q/dO/row stats of tile it ready; dS^T and row sums of tile it-1 complete
        if constexpr (LATE || REGS_ONLY) named_bar_sync(0, NTHREADS);  // the compute warps only
        else __syncthreads();
        // BWD_BLOCK: every warp issued tile it-2's adds before this barrier (and long ago): release them
        if (MODE == BWD_BLOCK && tid == 0 && it >= 2) red_release_gpu_add(semh + qt_first + it - 2, 1);
        if (REL_TOP && it >= 2 && (warp & 3) == 0 && lane == 0) {  // the same for BWD_WG_LANE_TOP_REL's warpgroup
            const int qt = qt_first + it - 2;
            if (qt / TPB <= ql_below) red_release_gpu_add(semw + 2 * qt, 1);
        }
        if (early && it > 0) dq_phase(it, dqp);
        const bool more = it + 1 < ntiles;
        float r_next = 0.f, d_next = 0.f;
        if (more) {
            const int i1 = (qt_first + it + 1) * BM;
            load_tile_async<DH, BM, NTHREADS, WG>(Qs + (buf ^ 1) * BM * DH, qh, DH, i1, T, tid);
            load_tile_async<DH, BM, NTHREADS, WG>(dOs + (buf ^ 1) * BM * DH, doh, (int)ld_o, i1, T, tid);
            cp_async_commit();
            fetch_rows(qt_first + it + 1, r_next, d_next);
        }
        // BWD_BLOCK: tile it's adds come in the next iteration, after the next barrier; thread 0 must have
        // seen the blocks above release it by then. Read the counter now, check it after this tile's work.
        int poll = 0;
        if (MODE == BWD_BLOCK && warp == 0 && it < ntiles) {
            ord_update((qt_first + it) / TPB);
            if (lane == 0 && ord_before > 0) poll = ld_relaxed_gpu(semh + qt_first + it);
        }
        if (it < ntiles) {
            const int i0 = (qt_first + it) * BM;
            const __nv_bfloat16 *Qb = Qs + buf * BM * DH, *dOb = dOs + buf * BM * DH;
            const float *rb = rs + buf * BM, *Db = Ds + buf * BM;
            __nv_bfloat16 *dSb = dSt + buf * BN * BM;

            float st[BM / 8][4], dpt[BM / 8][4];
            if constexpr (WG) {
                // S^T = K Q^T, dP^T = V dO^T for this warpgroup's 64 keys (all operands K-major)
                wg_fence();
#pragma unroll
                for (int kk = 0; kk < DH / 16; kk++)
                    wgmma_m64n64_ss<0, 0>(st, desc_kmajor<BN>(Ks, w4 * 64, kk), desc_kmajor<BM>(Qb, 0, kk), kk > 0);
#pragma unroll
                for (int kk = 0; kk < DH / 16; kk++)
                    wgmma_m64n64_ss<0, 0>(dpt, desc_kmajor<BN>(Vs, w4 * 64, kk), desc_kmajor<BM>(dOb, 0, kk), kk > 0);
                if constexpr (PIPE && !DQ_LATE) {  // tile it-1's dQ product queues behind; only S^T, dP^T are waited for
                    wg_commit();
                    dq_mma_issue(it, dqp);  // at it = 0 on the zeroed buffer, unused: no branch in the stage
                    wg_commit();
                    if constexpr (WLANE) order_point(it);
                    wg_wait<1>();
                } else {
                    wg_commit();
                    if constexpr (WLANE) order_point(it);
                    wg_wait<0>();
                }
            } else {
                scores_mma_sync<DH, BM>(st, dpt, Ks, Vs, Qb, dOb, warp, lane);
            }

            // P^T and dS^T in place: st <- P^T, dpt <- dS^T; rsum: this thread's part of dS row sums
            const bool diag = i0 < k0 + BN - 1;
            float rsum[BM / 4];
#pragma unroll
            for (int nt = 0; nt < BM / 8; nt++) {
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int col = nt * 8 + 2 * tq + e, i = i0 + col;
                    const float r = rb[col], d = Db[col];
                    float p0 = ex2(fmaf(st[nt][e], sl2, r + nb0));
                    float p1 = ex2(fmaf(st[nt][2 + e], sl2, r + nb1));
                    if (diag) {
                        if (j0 > i) p0 = 0.f;
                        if (j1 > i) p1 = 0.f;
                    }
                    // rounded one by one, as the product's bwd_p_ds_pair
                    const float ds0 = __fmul_rn(p0, dpt[nt][e] - d), ds1 = __fmul_rn(p1, dpt[nt][2 + e] - d);
                    cs0 = __fadd_rn(cs0, ds0);
                    cs1 = __fadd_rn(cs1, ds1);
                    rsum[2 * nt + e] = __fadd_rn(ds0, ds1);
                    st[nt][e] = p0;
                    st[nt][2 + e] = p1;
                    dpt[nt][e] = ds0;
                    dpt[nt][2 + e] = ds1;
                }
            }
            if constexpr (DQ_LATE) park_row_sums(rsum, buf);  // its 16 registers free before the MMAs
            if constexpr (WG) {
                // dV += P^T dO, dK += dS^T Q: A from registers, B = dO / Q (MN-major)
                uint32_t pa[BM / 16][4], sa[BM / 16][4];
#pragma unroll
                for (int kk = 0; kk < BM / 16; kk++) {
                    acc_to_a(pa[kk], st[2 * kk], st[2 * kk + 1]);
                    acc_to_a(sa[kk], dpt[2 * kk], dpt[2 * kk + 1]);
                    const int kr = warp * 16 + g, qc = kk * 16 + 2 * tq;
                    *reinterpret_cast<uint32_t *>(dSb + swz<BM>(kr, qc)) = sa[kk][0];
                    *reinterpret_cast<uint32_t *>(dSb + swz<BM>(kr + 8, qc)) = sa[kk][1];
                    *reinterpret_cast<uint32_t *>(dSb + swz<BM>(kr, qc + 8)) = sa[kk][2];
                    *reinterpret_cast<uint32_t *>(dSb + swz<BM>(kr + 8, qc + 8)) = sa[kk][3];
                }
                wg_fence();
                if constexpr (DQ_LATE) {  // tile it-1's dQ product first: its adds wait for it alone
                    dq_mma_issue(it, dqp);  // at it = 0 on the zeroed buffer, unused: no branch in the stage
                    wg_commit();
                }
#pragma unroll
                for (int kk = 0; kk < BM / 16; kk++)
#pragma unroll
                    for (int hf = 0; hf < DH / 64; hf++) {
                        wgmma_m64n64_rs<1>(acc_half(dva, hf), pa[kk], desc_mnmajor<BM>(dOb, hf, kk));
                        wgmma_m64n64_rs<1>(acc_half(dka, hf), sa[kk], desc_mnmajor<BM>(Qb, hf, kk));
                    }
                if constexpr (PIPE) wg_commit();  // waited for after tile it-1's dQ adds
                else wg_commit_wait();
            } else {
                dkdv_mma_sync<DH, BM>(dka, dva, st, dpt, dSb, Qb, dOb, warp, lane);
            }
            if constexpr (!DQ_LATE) park_row_sums(rsum, buf);
        }
        if constexpr (PIPE) {
            if (it < ntiles) {
                if constexpr (ADDS_LAST) wg_wait<0>();  // dQ and dV/dK: P^T, dS^T fragments dead during the adds
                else wg_wait<1>();  // tile it-1's dQ product (tile it's dV/dK products may still run)
            } else {  // after the last tile: its dQ product alone
                wg_fence();
                dq_mma_issue(it, dqp);
                wg_commit();
                if constexpr (WLANE) order_point(it);
                wg_wait<0>();
            }
        }
        if (!early && it > 0) dq_phase(it, dqp);
        if constexpr (PIPE) wg_wait<0>();  // dV/dK done: their register operands and this Q/dO buffer are free
        if (MODE == BWD_BLOCK && tid == 0 && it < ntiles && ord_before > 0) {
            if (poll >= ord_before) {
                fence_acq_rel_gpu();  // relaxed read + fence: an acquire (own adds landed long ago: cheap)
            } else {
                unsigned spins = 0;
                while (ld_acquire_gpu(semh + qt_first + it) < ord_before) {
                    __nanosleep(64);
                    if (++spins > (1u << 27)) __trap();  // a missing predecessor: fail loudly, never hang
                }
            }
        }
        if (more) store_rows(buf ^ 1, r_next, d_next);
    }
    if (pending) {
        __syncwarp();
        if (lane == 0) red_release_gpu_add(pending, 1);
    }
    if constexpr (REL_LATE || REL_TOP) {
        __syncthreads();  // every warp's adds of the last tile
        const int qt = qt_first + ntiles - 1;
        if ((warp & 3) == 0 && lane == 0 && qt / TPB <= ql_below) red_release_gpu_add(semw + 2 * qt, 1);
    }
    if (MODE == BWD_BLOCK) {
        __syncthreads();  // the last tile's adds
        if (tid == 0) red_release_gpu_add(semh + qt_first + ntiles - 1, 1);
    }

    bwd_store_keys<DH>(dk, dv, colsum, head_off, j0, j1, T, tq, dka, dva, cs0, cs1, scale);
}

// Step 3 for these versions, whose dq accumulator is row-major (B, H, T, dh): dq = scale * it, as bf16 (the
// product's dq_convert_kernel before its accumulator took the fragment order, fox/attention_traits.cuh).
__global__ void dq_convert_rowmajor_kernel(const float4 *__restrict__ acc, __nv_bfloat16 *__restrict__ dq, float scale,
                                           size_t n4) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x) {
        const float4 x = acc[i];
        uint2 out;
        out.x = pack_bf16(x.x * scale, x.y * scale);
        out.y = pack_bf16(x.z * scale, x.w * scale);
        reinterpret_cast<uint2 *>(dq)[i] = out;
    }
}

// Steps 1 to 4 of the backward with version MODE as step 2 (steps 1 and 4 are the product's).
template <int DH, int BM, int MINB, int MODE, bool WG>
void backward_cfg(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const float *c,
                  const __nv_bfloat16 *o, const float *lse, const __nv_bfloat16 *dout, float *dc, float *dlogf,
                  __nv_bfloat16 *dq, __nv_bfloat16 *dk, __nv_bfloat16 *dv, void *scratch, int B, int H, int T,
                  const int *q_last, cudaStream_t s) {
    const size_t nvec = (size_t)B * H * T, nq = nvec * DH;
    float *dq_acc = static_cast<float *>(scratch);
    float *D = dq_acc + nq, *colsum = D + nvec;
    int *sem = reinterpret_cast<int *>(colsum + nvec);
    dot_do_o<DH>(dout, o, D, B, H, T, s);
    FOX_CUDA_CHECK(cudaMemsetAsync(dq_acc, 0, nq * sizeof(float), s));
    FOX_CUDA_CHECK(cudaMemsetAsync(dc, 0, nvec * sizeof(float), s));
    // two counters per query tile (BWD_WG_LANE's per warpgroup; the others use the first half)
    FOX_CUDA_CHECK(cudaMemsetAsync(sem, 0, (size_t)B * H * 2 * ((T + BM - 1) / BM) * sizeof(int), s));
    const size_t smem = bwd_smem_bytes<DH, BM>();
    FOX_CUDA_CHECK(cudaFuncSetAttribute(bwd_kernel<DH, BM, MINB, MODE, WG>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    dim3 grid((T + BWD_BN - 1) / BWD_BN, B * H);
    bwd_kernel<DH, BM, MINB, MODE, WG><<<grid, bwd_threads(MODE), smem, s>>>(q, k, v, c, dout, lse, D, dq_acc, dk, dv, dc, colsum,
                                                                sem, H, T, q_last);
    FOX_LAUNCH_CHECK();
    const size_t conv_blocks = (nq / 4 + 255) / 256;
    dq_convert_rowmajor_kernel<<<(unsigned)(conv_blocks < 4096 ? conv_blocks : 4096), 256, 0, s>>>(
        reinterpret_cast<const float4 *>(dq_acc), dq, 1.f / sqrtf((float)DH), nq / 4);
    FOX_LAUNCH_CHECK();
    fox_attention_reverse_scan(dc, colsum, dlogf, B * H, T, s);
}


// Versions 29-56: the Hopper backward's kernel with every switch tried, bwd_ws_forms_kernel below. The product's
// bwd_ws_kernel (fox/attention_backward.cuh, which describes the kernel) is this kernel with the switches at the
// API's settings (DevApiCfg) and their other branches taken out; the checks compare the two bit for bit (versions
// 47, 54, 56 and 63 against the API; 29-40 against 40, itself checked against 47). The switches:
// TMA, a producer warp loads Q, dO and the row stats (else the compute warps, with cp.async); TURNS, the compute
// warpgroups take turns issuing their MMAs (0: never, 1: at each tile's first issue, 2: at every issue);
// MASK_PASS, the causal mask as a pass over S^T (else two copies of the P^T / dS^T loop); BM, the query rows per
// tile: 64, or 128 at d_h 64 (two sub-tiles of 64 per tile); DQ_BULK, a tile's dQ goes through smem to one bulk
// add by the copy engine (else fp32 atomics from registers, each compute warpgroup adding its columns once the
// sync warp holds the tile); K_REGS (d_h 64), K's A fragments held in registers for S^T (else read from smem at
// every sub-tile; V's too did not fit: ptxas serialized the MMAs); PERSISTENT (since session 18), one block an SM
// taking key blocks in the launch order from a work counter, else a block a key block; ORDER, the key blocks add
// a query tile in the fixed order (else as they come: --deterministic 0). GROUPED, the launch order: a 1-D grid in
// groups of HEAD_GROUP heads (0: bwd_head_group's, by T and d_h; bwd_block_of): with ORDER, in each group the first
// chain's key blocks, highest first, every head's at each rank, then the next chain's; without it every head's key
// block 0 (the longest walk), then every head's key block 1, ... Else the grid (key blocks, heads), highest key
// block first, head after head (one chain). Small groups keep a head's Q, dO and dQ accumulator in L2 for its
// blocks resident at once; all heads at once measured 33% slower at T 4096 (session 11).
template <int DH, bool ORDER_ = true> struct DevApiCfg {
    static constexpr bool TMA = true, MASK_PASS = DH == 64, DQ_BULK = true, ORDER = ORDER_, GROUPED = true;
    static constexpr bool K_REGS = DH == 64;
    static constexpr bool PERSISTENT = true;
    static constexpr int TURNS = DH == 128 ? 2 : 0;
    static constexpr int BM = DH == 64 ? 128 : 64;
    static constexpr int HEAD_GROUP = ORDER_ ? 0 : BWD_ATOMIC_HEAD_GROUP;
};
// With the order and the copy engine's adds, the first add of each query tile to its chain's accumulator stores it.
template <class Cfg> __host__ __device__ constexpr bool forms_store_first() { return Cfg::ORDER && Cfg::DQ_BULK; }
// The smem of bwd_ws_forms_kernel: bwd_ws_smem_bytes' without DQ_BULK's dQ tile and dc row sums.
template <int DH, int BM, bool DQ_BULK> size_t forms_smem_bytes() {
    return bwd_ws_smem_bytes<DH, BM>() - (DQ_BULK ? 0 : (size_t)BM * (DH + 1) * 4);
}
template <int DH, class Cfg>
__global__ void __launch_bounds__(NTHREADS + 128, 1)
bwd_ws_forms_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
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
    constexpr int TURNS = Cfg::TURNS;
    constexpr bool TMA = Cfg::TMA, MASK_PASS = Cfg::MASK_PASS, DQ_BULK = Cfg::DQ_BULK, K_REGS = Cfg::K_REGS;
    constexpr bool PERSISTENT = Cfg::PERSISTENT;
    static_assert(!PERSISTENT || (TMA && Cfg::GROUPED), "a persistent block takes its items from the producer, in the grouped order");
    extern __shared__ __align__(1024) unsigned char bwd_smem[];  // 1024: the 128-byte swizzle's period
    __nv_bfloat16 *Ks = reinterpret_cast<__nv_bfloat16 *>(bwd_smem);  // [BN][DH]
    __nv_bfloat16 *Vs = Ks + BN * DH;                                   // [BN][DH]
    __nv_bfloat16 *Qs = Vs + BN * DH;                                   // [2][BM][DH]
    __nv_bfloat16 *dOs = Qs + 2 * BM * DH;                              // [2][BM][DH]
    __nv_bfloat16 *dSt = dOs + 2 * BM * DH;                             // [2][BN][BM]: dS^T (swz_halves)
    float *rs = reinterpret_cast<float *>(dSt + 2 * BN * BM);           // [2][BM]: bwd_row_stats' r
    float *Ds = rs + 2 * BM;                                            // [2][BM]
    float *rowsum = Ds + 2 * BM;                                        // [2][NWARPS][BM]: dS row sums
    float *dQs = rowsum + 2 * NWARPS * BM;                              // DQ_BULK: [BM * DH] (dq_acc_offset)
    float *dcs = dQs + (DQ_BULK ? BM * DH : 0);                         // DQ_BULK: [BM], dc row sums
    uint64_t *kv_full = reinterpret_cast<uint64_t *>(dcs + (DQ_BULK ? BM : 0));  // TMA only
    uint64_t *full = kv_full + 1, *empty = full + 2, *kv_empty = empty + 2;  // kv_empty: PERSISTENT only
    int *item_slot = reinterpret_cast<int *>(kv_empty + 1);                    // PERSISTENT: [2]

    const int tid = threadIdx.x, lane = tid & 31;
    const int warp = __shfl_sync(0xffffffffu, tid >> 5, 0), w4 = warp >> 2;  // shfl: provably warp-uniform
    const int g = lane >> 2, tq = lane & 3;
    const int nblk = (T + BWD_BN - 1) / BWD_BN, nqt = (T + BM - 1) / BM, items = nheads * nblk;
    const size_t ld_o = (size_t)H * DH;
    // The work item (a key block of a head) and what follows from it, set by begin_item: key block nb of head
    // bh, in chain `chain` (Cfg::GROUPED: item i of bwd_block_of's order, `group` heads a group; else one chain,
    // highest first in each head, head after head), the query tiles it walks, its pointers.
    int nb = 0, bh = 0, chain = 0, chain_lo = 0, chain_hi = 0, b = 0, h = 0, k0 = 0, qt_first = 0, qt_last = 0, ntiles = 0;
    size_t head_off = 0;
    const __nv_bfloat16 *qh = nullptr, *kh = nullptr, *vh = nullptr, *doh = nullptr;
    const float *ch = nullptr, *lh = nullptr, *Dsh = nullptr;
    const int *qlh = nullptr;
    float *dqh = nullptr, *dch = nullptr, c_ref = 0.f;
    int *semh = nullptr;
    auto begin_item = [&](int i) {
        if constexpr (Cfg::GROUPED) {
            bwd_block_of(i, nblk, nheads, group, Cfg::ORDER, chains, nb, bh, chain);
        } else {
            nb = nblk - 1 - i % nblk;
            bh = i / nblk;
        }
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
    // Cfg::PERSISTENT: one block an SM takes items in order from the counter `next_item` (the producer's lane 0
    // claims them and posts each in item_slot[n % 2] before K and V's copy completes kv_full's phase n; the other
    // warps read it there, through shfl: warp-uniform, so the item's values sit in uniform registers as blockIdx's
    // do; read plainly they cost the tiles what the persistence saved, NOTES.md session 18); items >=
    // `items` end the block. Else the block's one item is its index.
    auto item_at = [&](int n) -> int {
        if constexpr (PERSISTENT) return __shfl_sync(0xffffffffu, item_slot[n & 1], 0);
        else return n == 0 ? (int)(Cfg::GROUPED ? blockIdx.x : blockIdx.y * nblk + blockIdx.x) : items;
    };

    if constexpr (TMA) {
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
    }
    if (warp >= NWARPS) {  // the sync warpgroup gives its registers to the compute warpgroups
        setmaxnreg_dec<BWD_REGS_SYNC>();
        if (warp == NWARPS) {  // the sync warp
            // DQ_BULK, query tile t acquired: once the compute warps have put its dQ and dc row sums in smem
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
                    if (forms_store_first<Cfg>() && first) bulk_store(dqh + (size_t)i0 * DH, dQs, bytes);
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
                if constexpr (PERSISTENT) mbar_wait(kv_full, n & 1);  // item n posted
                const int i = item_at(n);
                if (i >= items) break;
                begin_item(i);
                int ord_row = -1, before = 0;
                bool last = false;
                if (DQ_BULK) named_bar_arrive(2, NTHREADS + 32);  // the smem dQ tile starts free
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
                    if constexpr (DQ_BULK) {
                        bulk_add_dq(t, before == 0);
                    } else {
                        named_bar_arrive(2, 128 + 32);  // t acquired: each compute warpgroup may add it, independently
                        named_bar_arrive(3, 128 + 32);
                        named_bar_sync(1, NTHREADS + 32);  // every compute warp has issued its adds of t
                    }
                    if (lane == 0) red_release_gpu_add(semh + t, 1);
                    __syncwarp();
                }
            }
        } else if (TMA && warp == NWARPS + 1) {  // the producer (see above)
            int gt = 0;  // query tiles loaded so far (the Q / dO stages' count)
            for (int n = 0;; n++) {
                if constexpr (PERSISTENT) {  // claim and post item n; a claim past the last ends every warp
                    // Not before item n-1's K and V are read: then every warp has taken item n-1 from its slot
                    // and waited on kv_full's phase n-1, so neither is overtaken.
                    if (n > 0) mbar_wait(kv_empty, (n - 1) & 1);
                    if (lane == 0) {
                        const int i = atomicAdd(next_item, 1);
                        item_slot[n & 1] = i;
                        if (i >= items) mbar_arrive(kv_full);
                    }
                    __syncwarp();
                }
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

    // cp.async form: loader threads tid < BM fetch per-query values; rows past T get r = -inf so their P is 0.
    auto fetch_rows = [&](int qt, float &r, float &d) {
        if (tid < BM) bwd_row_stats(ch, lh, Dsh, qt * BM + tid, T, c_ref, r, d);
    };
    auto store_rows = [&](int buf, float r, float d) {
        if (tid < BM) {
            rs[buf * BM + tid] = r;
            Ds[buf * BM + tid] = d;
        }
    };

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
    // dQ (and dc row sums) of tile it-1 added in the sync warp's order (the API's).
    auto dq_phase = [&](int it, float (&dqa)[DQC / 8][4]) {
        const int pb = (gt0 + it - 1) & 1, i0 = (qt_first + it - 1) * BM;
        float rtot = 0.f;
        if (tid < BM) {
#pragma unroll
            for (int w = 0; w < NWARPS; w++) rtot += rowsum[(pb * NWARPS + w) * BM + tid];
        }
        if constexpr (DQ_BULK) {  // to smem, for the sync warp's bulk add
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
            return;
        }
        if (w4 == 0) named_bar_sync(2, 128 + 32);  // constant ids: ptxas counts 4 barriers, not 16
        else named_bar_sync(3, 128 + 32);
        const int qr0 = i0 + dq_r + g;
#pragma unroll
        for (int nt = 0; nt < DQC / 8; nt++) {
            const int col = dq_c + nt * 8 + 2 * tq;
            if (qr0 < T) atomic_add2(dqh + dq_acc_offset(qr0, col, DH), dqa[nt][0], dqa[nt][1]);
            if (qr0 + 8 < T) atomic_add2(dqh + dq_acc_offset(qr0 + 8, col, DH), dqa[nt][2], dqa[nt][3]);
        }
        if (tid < BM && i0 + tid < T) atomicAdd(dch + i0 + tid, rtot);
        named_bar_arrive(1, NTHREADS + 32);  // this warp's adds of tile it-1 issued
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
    auto turn_wait = [&](bool on) {
        if (!on) return;
        if (w4 == 0) named_bar_sync(4, NTHREADS);  // constant ids: ptxas counts the barriers
        else named_bar_sync(5, NTHREADS);
    };
    auto turn_pass = [&](bool on, bool last) {
        if (!on) return;
        if (w4 == 0) named_bar_arrive(5, NTHREADS);
        else if (!last) named_bar_arrive(4, NTHREADS);
    };
    float dqp[DQC / 8][4];  // dQ product of tile it-1 (in flight during tile it's softmax or dV/dK work)
    uint32_t ka[K_REGS ? DH / 16 : 1][4];  // Cfg::K_REGS: this warp's 16 keys of K, S^T's A fragments (see above)
    static_assert(!K_REGS || (DH == 64 && TMA), "K's fragments in registers: d_h 64, K loaded by the producer");
    for (int n = 0;; n++) {
        if constexpr (PERSISTENT) mbar_wait(kv_full, n & 1);  // item n posted (and its K, V landed)
        const int item = item_at(n);
        if (item >= items) break;
        begin_item(item);
        if constexpr (!TMA) {
            load_key_block_async<DH, BN, BM, NTHREADS, true>(Ks, Vs, Qs, dOs, kh, vh, qh, doh, (int)ld_o, k0,
                                                             qt_first * BM, T, tid);
            float r = 0.f, d = 0.f;
            fetch_rows(qt_first, r, d);
            store_rows(0, r, d);
        }

        int j0, j1;  // this thread's two keys
        float nb0, nb1;
        bwd_thread_keys(ch, k0, warp, g, T, c_ref, j0, j1, nb0, nb1);

        float dka[DH / 8][4], dva[DH / 8][4];
#pragma unroll
        for (int i = 0; i < DH / 8; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) dka[i][e] = dva[i][e] = 0.f;
        float cs0 = 0.f, cs1 = 0.f;  // column sums of dS for keys j0, j1
        if (TURNS > 0 && w4 == 1) named_bar_arrive(4, NTHREADS);  // warpgroup 0 issues first
        if constexpr (TMA && !PERSISTENT) mbar_wait(kv_full, 0);
        if constexpr (K_REGS) {  // this item's K
#pragma unroll
            for (int kk = 0; kk < DH / 16; kk++) load_a<64>(ka[kk], Ks, w4 * 64 + (warp & 3) * 16, kk * 16, lane);
        }
        for (int it = 0; it <= ntiles; it++) {
            const int buf = (gt0 + it) & 1;  // the Q / dO stage and the dS^T, row-sum buffers
            if constexpr (TMA) {
                if (it < ntiles) mbar_wait(full + buf, ((gt0 + it) >> 1) & 1);
            } else {
                cp_async_wait_all();
            }
            fence_proxy_async_smem();  // cp.async and dS^T writes -> wgmma reads
            named_bar_sync(0, NTHREADS);  // Q/dO/row stats of tile it ready; dS^T and row sums of tile it-1 complete
            const bool more = it + 1 < ntiles;
            float r_next = 0.f, d_next = 0.f;
            if (!TMA && more) {
                const int i1 = (qt_first + it + 1) * BM;
                load_tile_async<DH, BM, NTHREADS, true>(Qs + (buf ^ 1) * BM * DH, qh, DH, i1, T, tid);
                load_tile_async<DH, BM, NTHREADS, true>(dOs + (buf ^ 1) * BM * DH, doh, (int)ld_o, i1, T, tid);
                cp_async_commit();
                fetch_rows(qt_first + it + 1, r_next, d_next);
            }
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
                    turn_wait(TURNS == 2 || (TURNS == 1 && sub == 0));
                    // S^T = K Q^T, dP^T = V dO^T for this warpgroup's 64 keys (all operands K-major)
                    wg_fence();
                    // the tiles' descriptors formed at each call (ptxas shares them): named once above the loop,
                    // they cost ptxas more instructions (NOTES.md session 26)
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
                    turn_pass(TURNS == 2 || (TURNS == 1 && sub == 0), TURNS == 1 && it + 1 == ntiles);
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
                    turn_wait(TURNS == 2);
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
                    turn_pass(TURNS == 2, false);
                    if constexpr (!DQ_LATE) park_row_sums(rsum, buf, qs);
                }
                wg_wait<1>();  // tile it-1's dQ product (tile it's last dV/dK products may still run)
            } else {  // after the last tile: its dQ product alone
                turn_wait(TURNS == 2);
                wg_fence();
                dq_mma_issue(it, dqp);
                wg_commit();
                turn_pass(TURNS == 2, true);
                wg_wait<0>();
            }
            if (it > 0) dq_phase(it, dqp);
            wg_wait<0>();  // dV/dK done: their register operands and this Q/dO buffer are free
            if (TMA && it < ntiles) {  // the stage's Q, dO and row stats are free
                __syncwarp();
                if (lane == 0) mbar_arrive(empty + buf);
            }
            if (!TMA && more) store_rows(buf ^ 1, r_next, d_next);
        }

        if constexpr (PERSISTENT) {  // the item's K and V are read: the producer may load the next item's
            __syncwarp();
            if (lane == 0) mbar_arrive(kv_empty);
        }
        bwd_store_keys<DH>(dk, dv, colsum, head_off, j0, j1, T, tq, dka, dva, cs0, cs1, scale);
        gt0 += ntiles;
    }
}

// Steps 1 and 2 with bwd_ws_forms_kernel in the form Cfg, the order in `chains` chains (1 to BWD_CHAINS; 1
// without the order or GROUPED). With Cfg::TMA the tensor maps are encoded per call; without it they are unused
// (zeros).
template <int DH, class Cfg>
BwdSums backward_ws_forms(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const float *c,
                    const __nv_bfloat16 *o, const float *lse, const __nv_bfloat16 *dout, float *dc, __nv_bfloat16 *dk,
                    __nv_bfloat16 *dv, void *scratch, int B, int H, int T, const int *q_last, int chains,
                    cudaStream_t s) {
    constexpr int BM = Cfg::BM;
    if (chains < 1 || chains > BWD_CHAINS) {
        fprintf(stderr, "error: the attention backward's order takes 1 to %d chains, not %d\n", BWD_CHAINS, chains);
        exit(EXIT_FAILURE);
    }
    if (!Cfg::ORDER || !Cfg::GROUPED) chains = 1;
    const BwdSums p = bwd_sums(scratch, B, H, T, DH, chains, q_last);
    bwd_prepare<DH>(o, dout, dc, p, !forms_store_first<Cfg>(), B, H, T, s);
    const size_t smem = forms_smem_bytes<DH, BM, Cfg::DQ_BULK>();
    FOX_CUDA_CHECK(cudaFuncSetAttribute(bwd_ws_forms_kernel<DH, Cfg>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    CUtensorMap tq = {}, tk = {}, tv = {}, tdo = {};
    if (Cfg::TMA) {
        tq = tma_map_bf16_3d(q, DH, T, B * H, BM);
        tk = tma_map_bf16_3d(k, DH, T, B * H, BWD_BN);
        tv = tma_map_bf16_3d(v, DH, T, B * H, BWD_BN);
        tdo = tma_map_bf16_3d(dout, H * DH, T, B, BM);
    }
    const int nblk = (T + BWD_BN - 1) / BWD_BN, items = nblk * B * H, sms = fox_sm_count();
    const dim3 grid = Cfg::PERSISTENT ? dim3(items < sms ? items : sms) : Cfg::GROUPED ? dim3(items) : dim3(nblk, B * H);
    const int want = Cfg::HEAD_GROUP > 0 ? Cfg::HEAD_GROUP : bwd_head_group(T, DH), group = want < B * H ? want : B * H;
    bwd_ws_forms_kernel<DH, Cfg><<<grid, NTHREADS + 128, smem, s>>>(tq, tk, tv, tdo, q, k, v, c, dout, lse, p.D, p.dq_acc,
                                                              dk, dv, dc, p.dc_chains, p.colsum, p.sem, p.next_item, H,
                                                              T, q_last, B * H, chains, group);
    FOX_LAUNCH_CHECK();
    return p;
}

// Versions 29-35 (session 8, "the deterministic backward with the forward's lessons"): bwd_ws_forms_kernel
// in the forms chosen by DevDetCfg: TURNS (0 none, 1 at a tile's first MMA issue, 2 at every issue), TMA (a producer warp
// in the sync warpgroup), MASK_PASS (the causal mask as a pass over S^T; else two copies of the loop). The
// diagonal-only mask is in every form. Every form gives the previous API's results (13 / 15) bit for bit.
// Versions 36-39 (session 9): BM, query tiles of 128 rows at d_h 64 (FlashAttention-3's 128 x 128 tile: S^T and
// dP^T as m64n128 products, half the tiles and so half the per-tile barriers and order handshakes).
// Version 40 (session 10): DQ_BULK, a tile's dQ through smem to one bulk add by the copy engine (the sync warp
// issues it after its acquire and waits for it before its release; the accumulator in fragment order).
template <int TURNS_, bool TMA_, bool MASK_PASS_, int BM_ = 64, bool DQ_BULK_ = false> struct DevDetCfg {
    static constexpr int TURNS = TURNS_;
    static constexpr bool TMA = TMA_, MASK_PASS = MASK_PASS_, DQ_BULK = DQ_BULK_, ORDER = true, GROUPED = false;
    static constexpr bool K_REGS = false;
    static constexpr bool PERSISTENT = false;
    static constexpr int HEAD_GROUP = 1;  // unused: not GROUPED
    static constexpr int BM = BM_;
};
// Version 42: the API's nondeterministic form (41) launched as the deterministic one, highest key block first in
// each head, head after head.
template <int DH> struct DevAtomicHeadMajorCfg : DevApiCfg<DH, false> {
    static constexpr bool GROUPED = false, PERSISTENT = false;
};
// Versions 45, 46: the API's nondeterministic form (41) launched longest first in groups of G heads.
template <int DH, int G> struct DevAtomicGroupCfg : DevApiCfg<DH, false> {
    static constexpr int HEAD_GROUP = G;
};
// Versions 51-53: the API's deterministic form launched in groups of G heads.
template <int DH, int G> struct DevDetGroupCfg : DevApiCfg<DH> {
    static constexpr int HEAD_GROUP = G;
};
// Versions 54, 55: the API's deterministic and nondeterministic forms a block a key block (PERSISTENT off: the
// API's until session 18).
template <int DH> struct DevDetPerBlockCfg : DevApiCfg<DH> {
    static constexpr bool PERSISTENT = false;
};
template <int DH> struct DevAtomicPerBlockCfg : DevApiCfg<DH, false> {
    static constexpr bool PERSISTENT = false;
};
// Version 56 (session 17): the API's deterministic form with K's fragments read from smem at every sub-tile (the
// API until session 17, K_REGS off).
template <int DH> struct DevDetKSmemCfg : DevApiCfg<DH> {
    static constexpr bool K_REGS = false;
};
// Steps 1 to 4 of the backward with step 2 in the form Cfg, its order (if any) in CHAINS chains: the product's
// bwd_ws_kernel for the API's BwdDetCfg / BwdAtomicCfg (FORMS false), else bwd_ws_forms_kernel.
template <int DH, class Cfg, int CHAINS = 1, bool FORMS = true>
void backward_ws_steps(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const float *c,
                       const __nv_bfloat16 *o, const float *lse, const __nv_bfloat16 *dout, float *dc, float *dlogf,
                       __nv_bfloat16 *dq, __nv_bfloat16 *dk, __nv_bfloat16 *dv, void *scratch, int B, int H, int T,
                       const int *q_last, cudaStream_t s) {
    BwdSums p;
    if constexpr (FORMS) p = backward_ws_forms<DH, Cfg>(q, k, v, c, o, lse, dout, dc, dk, dv, scratch, B, H, T, q_last, CHAINS, s);
    else p = backward_ws<DH, Cfg>(q, k, v, c, o, lse, dout, dc, dk, dv, scratch, B, H, T, q_last, CHAINS, s);
    bwd_dq(p, dc, dq, B, H, T, DH, s);
    fox_attention_reverse_scan(dc, p.colsum, dlogf, B * H, T, s);
}
// The same with the product's kernel.
template <int DH, class Cfg, int CHAINS = 1>
void backward_api_steps(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const float *c,
                        const __nv_bfloat16 *o, const float *lse, const __nv_bfloat16 *dout, float *dc, float *dlogf,
                        __nv_bfloat16 *dq, __nv_bfloat16 *dk, __nv_bfloat16 *dv, void *scratch, int B, int H, int T,
                        const int *q_last, cudaStream_t s) {
    backward_ws_steps<DH, Cfg, CHAINS, false>(q, k, v, c, o, lse, dout, dc, dlogf, dq, dk, dv, scratch, B, H, T, q_last, s);
}

// Steps 1 to 4 of the backward with bwd_ws_forms_kernel in the form DevDetCfg<TURNS, TMA, MASK_PASS, BM, DQ_BULK> as step 2.
template <int DH, int TURNS, bool TMA, bool MASK_PASS = false, int BM = 64, bool DQ_BULK = false>
void backward_det_cfg(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const float *c,
                      const __nv_bfloat16 *o, const float *lse, const __nv_bfloat16 *dout, float *dc, float *dlogf,
                      __nv_bfloat16 *dq, __nv_bfloat16 *dk, __nv_bfloat16 *dv, void *scratch, int B, int H, int T,
                      const int *q_last, cudaStream_t s) {
    backward_ws_steps<DH, DevDetCfg<TURNS, TMA, MASK_PASS, BM, DQ_BULK>>(q, k, v, c, o, lse, dout, dc, dlogf, dq, dk, dv,
                                                                         scratch, B, H, T, q_last, s);
}

}  // namespace fox_attn_dev

using fox_attn_dev::backward_cfg;
using fox_attn_dev::backward_det_cfg;
struct Version {
    int number;
    const char *name;
    BwdFn mma64, mma128, wg64, wg128;  // the paths this version runs on (NULL: not built for it)
    bool nondet;                // not deterministic: accuracy checked, bitwise repeat reported, not required
    bool one_chain_bits;        // the one-chain add order: its results must equal version 40's bit for bit
    bool api_bits;              // the API's add order and arithmetic: its results must equal the API's bit for bit
};
#define MMA64(M) backward_cfg<64, 64, 1, fox_attn_dev::M, false>
#define MMA128(M) backward_cfg<128, 32, 1, fox_attn_dev::M, false>
#define WG64(M) backward_cfg<64, 64, 1, fox_attn_dev::M, true>
#define WG128(M) backward_cfg<128, 64, 1, fox_attn_dev::M, true>
#define DET64(TURNS, TMA) backward_det_cfg<64, TURNS, TMA>
#define DET128(TURNS, TMA) backward_det_cfg<128, TURNS, TMA>
static const Version versions[] = {
    {1, "atomics (BWD_ATOMIC)", MMA64(BWD_ATOMIC), MMA128(BWD_ATOMIC), WG64(BWD_ATOMIC), nullptr, true},
    {2, "warp-ordered (BWD_ORDERED)", MMA64(BWD_ORDERED), MMA128(BWD_ORDERED), nullptr, nullptr, false},
    {3, "warp-ordered, staggered (BWD_STAGGER)", MMA64(BWD_STAGGER), MMA128(BWD_STAGGER), nullptr, nullptr, false},
    {4, "block-ordered, thread 0 (BWD_BLOCK)", MMA64(BWD_BLOCK), MMA128(BWD_BLOCK), WG64(BWD_BLOCK), nullptr, false},
    {5, "sync warp, dQ step first (BWD_SYNC)", nullptr, nullptr, WG64(BWD_SYNC), nullptr, false},
    {6, "two sync warps, release / acquire (BWD_SYNC2)", nullptr, nullptr, WG64(BWD_SYNC2), nullptr, false},
    {7, "sync warp without the waits (BWD_SYNC_NOWAIT, timing control)", nullptr, nullptr, WG64(BWD_SYNC_NOWAIT), nullptr, true},
    {8, "sync warp, dQ step last, 168 registers (BWD_SYNC_LATE)", nullptr, nullptr, WG64(BWD_SYNC_LATE), nullptr, false},
    {9, "atomics, dQ step first (BWD_ATOMIC_EARLY, timing control)", nullptr, nullptr, WG64(BWD_ATOMIC_EARLY), nullptr, true},
    {10, "sync warpgroup + setmaxnreg, barrier per warpgroup (BWD_SYNC_WG)", nullptr, nullptr, WG64(BWD_SYNC_WG), nullptr, false},
    {11, "sync warpgroup + setmaxnreg, one barrier (BWD_SYNC_WG_FULLBAR)", nullptr, nullptr, WG64(BWD_SYNC_WG_FULLBAR),
     nullptr, false},
    {12, "sync warp, 168 registers, barrier per warpgroup (BWD_SYNC_LATE_WGBAR)", nullptr, nullptr,
     WG64(BWD_SYNC_LATE_WGBAR), nullptr, false},
    {13, "BWD_SYNC_WG with pipelined MMAs (BWD_SYNC_WG_PIPE)", nullptr, nullptr, WG64(BWD_SYNC_WG_PIPE), nullptr, false},
    {14, "atomics with pipelined MMAs (BWD_ATOMIC_PIPE)", nullptr, nullptr, WG64(BWD_ATOMIC_PIPE), nullptr, true},
    {15, "BWD_SYNC_WG_PIPE at d_h 128, dQ after the softmax step", nullptr, nullptr, nullptr, WG128(BWD_SYNC_WG_PIPE),
     false},
    {16, "BWD_ATOMIC_PIPE at d_h 128, dQ after the softmax step", nullptr, nullptr, nullptr, WG128(BWD_ATOMIC_PIPE),
     true},
    {17, "BWD_SYNC_WG_PIPE at d_h 128, dQ beside S^T / dP^T (spills; control)", nullptr, nullptr, nullptr,
     WG128(BWD_SYNC_WG_PIPE_DQ_EARLY), false},
    {18, "BWD_SYNC_WG_PIPE without the waits (timing control)", nullptr, nullptr, WG64(BWD_SYNC_WG_PIPE_NOWAIT),
     WG128(BWD_SYNC_WG_PIPE_NOWAIT), true},
    {19, "atomics with pipelined MMAs under setmaxnreg 240 (timing control)", nullptr, nullptr,
     WG64(BWD_ATOMIC_PIPE_REGS), WG128(BWD_ATOMIC_PIPE_REGS), true},
    {20, "BWD_SYNC_WG_PIPE, dQ adds after the dV/dK products", nullptr, nullptr, WG64(BWD_SYNC_WG_PIPE_ADDS_LAST),
     WG128(BWD_SYNC_WG_PIPE_ADDS_LAST), false},
    {21, "256 threads, order kept by one lane per warp / warpgroup (BWD_WG_LANE)", nullptr, nullptr, WG64(BWD_WG_LANE),
     WG128(BWD_WG_LANE), false, true},
    {22, "21 with each warp's acquire just before its adds", nullptr, nullptr, WG64(BWD_WG_LANE_LATE_ACQ),
     WG128(BWD_WG_LANE_LATE_ACQ), false, true},
    {23, "21 without the waits (timing control)", nullptr, nullptr, WG64(BWD_WG_LANE_NOWAIT), WG128(BWD_WG_LANE_NOWAIT),
     true},
    {24, "21 with every warp releasing its own adds at once", nullptr, nullptr, WG64(BWD_WG_LANE_WARP_REL),
     WG128(BWD_WG_LANE_WARP_REL), false, true},
    {25, "21 with a warpgroup barrier after the adds and one release at once", nullptr, nullptr, WG64(BWD_WG_LANE_WG_REL),
     WG128(BWD_WG_LANE_WG_REL), false, true},
    {26, "21's releases alone (timing control)", nullptr, nullptr, WG64(BWD_WG_LANE_REL_ONLY),
     WG128(BWD_WG_LANE_REL_ONLY), true},
    {27, "21's acquires alone (timing control)", nullptr, nullptr, WG64(BWD_WG_LANE_ACQ_ONLY),
     WG128(BWD_WG_LANE_ACQ_ONLY), true},
    {28, "21 with the release right after the block barrier, before the loads", nullptr, nullptr,
     WG64(BWD_WG_LANE_TOP_REL), WG128(BWD_WG_LANE_TOP_REL), false, true},
    {29, "API's deterministic kernel, causal mask on the diagonal tiles only", nullptr, nullptr, DET64(0, false),
     DET128(0, false), false, true},
    {30, "29 + the two compute warpgroups taking turns at every MMA issue", nullptr, nullptr, DET64(2, false),
     DET128(2, false), false, true},
    {31, "29 + turns at the tile's first MMA issue only", nullptr, nullptr, DET64(1, false), DET128(1, false), false,
     true},
    {32, "29 + a TMA producer warp (Q, dO, row stats; K, V) in the sync warpgroup", nullptr, nullptr, DET64(0, true),
     DET128(0, true), false, true},
    {33, "32 + turns at every MMA issue", nullptr, nullptr, DET64(2, true), DET128(2, true), false, true},
    {34, "32 + turns at the tile's first MMA issue only", nullptr, nullptr, DET64(1, true), DET128(1, true), false,
     true},
    {35, "29 with the mask as a pass over the diagonal tiles' S^T before one copy of the loop", nullptr, nullptr,
     backward_det_cfg<64, 0, false, true>, backward_det_cfg<128, 0, false, true>, false, true},
    {36, "35 with query tiles of 128 rows (d_h 64)", nullptr, nullptr, backward_det_cfg<64, 0, false, true, 128>, nullptr,
     false, true},
    {37, "36 + turns at every MMA issue", nullptr, nullptr, backward_det_cfg<64, 2, false, true, 128>, nullptr, false, true},
    {38, "36 + a TMA producer warp", nullptr, nullptr, backward_det_cfg<64, 0, true, true, 128>, nullptr, false, true},
    {39, "38 + turns at every MMA issue", nullptr, nullptr, backward_det_cfg<64, 2, true, true, 128>, nullptr, false, true},
    {40, "38 (d_h 64) / 33 (d_h 128) with dQ added by the copy engine: one bulk add a tile", nullptr, nullptr,
     backward_det_cfg<64, 0, true, true, 128, true>, backward_det_cfg<128, 2, true, false, 64, true>, false, true},
    {41, "the nondeterministic API: 40 without the order, key block 0 first in each group of 4 heads", nullptr, nullptr,
     fox_attn_dev::backward_api_steps<64, fox_attn::BwdAtomicCfg<64>>,
     fox_attn_dev::backward_api_steps<128, fox_attn::BwdAtomicCfg<128>>, true, false},
    {42, "41 launched in 40's order (highest key block first, head after head)", nullptr, nullptr,
     fox_attn_dev::backward_ws_steps<64, fox_attn_dev::DevAtomicHeadMajorCfg<64>>,
     fox_attn_dev::backward_ws_steps<128, fox_attn_dev::DevAtomicHeadMajorCfg<128>>, true, false},
    {45, "41 in groups of 8 heads", nullptr, nullptr, fox_attn_dev::backward_ws_steps<64, fox_attn_dev::DevAtomicGroupCfg<64, 8>>,
     fox_attn_dev::backward_ws_steps<128, fox_attn_dev::DevAtomicGroupCfg<128, 8>>, true, false},
    {46, "41 in groups of 16 heads", nullptr, nullptr,
     fox_attn_dev::backward_ws_steps<64, fox_attn_dev::DevAtomicGroupCfg<64, 16>>,
     fox_attn_dev::backward_ws_steps<128, fox_attn_dev::DevAtomicGroupCfg<128, 16>>, true, false},
    {47, "the deterministic API's form in one chain (40's order, launched in groups of 4 heads)", nullptr, nullptr,
     fox_attn_dev::backward_api_steps<64, fox_attn::BwdDetCfg<64>, 1>,
     fox_attn_dev::backward_api_steps<128, fox_attn::BwdDetCfg<128>, 1>, false, true},
    {48, "the deterministic API's form in two chains", nullptr, nullptr,
     fox_attn_dev::backward_api_steps<64, fox_attn::BwdDetCfg<64>, 2>,
     fox_attn_dev::backward_api_steps<128, fox_attn::BwdDetCfg<128>, 2>, false, false},
    {49, "the deterministic API's form in three chains", nullptr, nullptr,
     fox_attn_dev::backward_api_steps<64, fox_attn::BwdDetCfg<64>, 3>,
     fox_attn_dev::backward_api_steps<128, fox_attn::BwdDetCfg<128>, 3>, false, false},
    {50, "the deterministic API's form in four chains", nullptr, nullptr,
     fox_attn_dev::backward_api_steps<64, fox_attn::BwdDetCfg<64>, 4>,
     fox_attn_dev::backward_api_steps<128, fox_attn::BwdDetCfg<128>, 4>, false, false},
    {51, "50 launched in groups of 1 head", nullptr, nullptr,
     fox_attn_dev::backward_ws_steps<64, fox_attn_dev::DevDetGroupCfg<64, 1>, 4>,
     fox_attn_dev::backward_ws_steps<128, fox_attn_dev::DevDetGroupCfg<128, 1>, 4>, false, false},
    {52, "50 launched in groups of 2 heads", nullptr, nullptr,
     fox_attn_dev::backward_ws_steps<64, fox_attn_dev::DevDetGroupCfg<64, 2>, 4>,
     fox_attn_dev::backward_ws_steps<128, fox_attn_dev::DevDetGroupCfg<128, 2>, 4>, false, false},
    {53, "50 launched in groups of 8 heads", nullptr, nullptr,
     fox_attn_dev::backward_ws_steps<64, fox_attn_dev::DevDetGroupCfg<64, 8>, 4>,
     fox_attn_dev::backward_ws_steps<128, fox_attn_dev::DevDetGroupCfg<128, 8>, 4>, false, false},
    {54, "50 a block a key block (the API before session 18)", nullptr, nullptr,
     fox_attn_dev::backward_ws_steps<64, fox_attn_dev::DevDetPerBlockCfg<64>, 4>,
     fox_attn_dev::backward_ws_steps<128, fox_attn_dev::DevDetPerBlockCfg<128>, 4>, false, false, true},
    {55, "41 a block a key block (the nondeterministic API before session 18)", nullptr, nullptr,
     fox_attn_dev::backward_ws_steps<64, fox_attn_dev::DevAtomicPerBlockCfg<64>>,
     fox_attn_dev::backward_ws_steps<128, fox_attn_dev::DevAtomicPerBlockCfg<128>>, true, false},
    {56, "50 with K read from smem for every S^T sub-tile (the API before session 17)", nullptr, nullptr,
     fox_attn_dev::backward_ws_steps<64, fox_attn_dev::DevDetKSmemCfg<64>, 4>, nullptr, false, false, true},
    {63, "bwd_ws_forms_kernel at the API's settings: the product's kernel, bit for bit", nullptr, nullptr,
     fox_attn_dev::backward_ws_steps<64, fox_attn_dev::DevApiCfg<64>, 4>,
     fox_attn_dev::backward_ws_steps<128, fox_attn_dev::DevApiCfg<128>, 4>, false, false, true},
};

// The paths of version v at this d_h that this device runs: up to two (mma.sync, wgmma).
static int paths(const Version &v, int dh, BwdFn fn[2], const char *path[2]) {
    int n = 0;
    BwdFn mma = dh == 64 ? v.mma64 : v.mma128;
    if (mma) fn[n] = mma, path[n++] = "mma.sync";
    BwdFn wg = dh == 64 ? v.wg64 : v.wg128;
    if (wg && fox_attn::use_wgmma()) fn[n] = wg, path[n++] = "wgmma";
    return n;
}

// The outputs of one backward (device buffers of n q/k/v elements and nv vector elements) as host bytes.
static std::vector<unsigned char> backward_bytes(const bf16 *gq, const bf16 *gk, const bf16 *gv, const float *dc,
                                                 const float *dlogf, size_t n, size_t nv) {
    FOX_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<unsigned char> out;
    auto add = [&](const void *p, size_t bytes) {
        const size_t at = out.size();
        out.resize(at + bytes);
        FOX_CUDA_CHECK(cudaMemcpy(out.data() + at, p, bytes, cudaMemcpyDeviceToHost));
    };
    add(gq, n * sizeof(bf16)), add(gk, n * sizeof(bf16)), add(gv, n * sizeof(bf16));
    add(dc, nv * sizeof(float)), add(dlogf, nv * sizeof(float));
    return out;
}

// Whether fn's dq, dk, dv, dc, dlogf equal those of `ref` (named `what`) bit for bit.
static bool same_bits_as(const bf16 *q, const bf16 *k, const bf16 *v, const float *c, const bf16 *o, const float *lse,
                         const bf16 *dout, float *dc, float *dlogf, bf16 *gq, bf16 *gk, bf16 *gv, void *scratch, int B,
                         int H, int T, int dh, const int *q_last, BwdFn fn, BwdFn ref, const char *what) {
    const size_t n = (size_t)B * H * T * dh, nv = (size_t)B * H * T;
    ref(q, k, v, c, o, lse, dout, dc, dlogf, gq, gk, gv, scratch, B, H, T, q_last, 0);
    const std::vector<unsigned char> want = backward_bytes(gq, gk, gv, dc, dlogf, n, nv);
    fn(q, k, v, c, o, lse, dout, dc, dlogf, gq, gk, gv, scratch, B, H, T, q_last, 0);
    const bool same = backward_bytes(gq, gk, gv, dc, dlogf, n, nv) == want;
    printf("    bitwise equal to %s: %s\n", what, same ? "PASS" : "FAIL");
    return same;
}

// The bitwise comparisons a version asks for (Version::one_chain_bits, api_bits).
static bool same_bits_checks(const Version &v, const bf16 *q, const bf16 *k, const bf16 *val, const float *c,
                             const bf16 *o, const float *lse, const bf16 *dout, float *dc, float *dlogf, bf16 *gq,
                             bf16 *gk, bf16 *gv, void *scratch, int B, int H, int T, int dh, const int *q_last, BwdFn fn) {
    bool ok = true;
    if (v.one_chain_bits)
        ok &= same_bits_as(q, k, val, c, o, lse, dout, dc, dlogf, gq, gk, gv, scratch, B, H, T, dh, q_last, fn,
                           dh == 64 ? backward_det_cfg<64, 0, true, true, 128, true> : backward_det_cfg<128, 2, true, false, 64, true>,
                           "the one-chain order's (version 40)");
    if (v.api_bits)
        ok &= same_bits_as(q, k, val, c, o, lse, dout, dc, dlogf, gq, gk, gv, scratch, B, H, T, dh, q_last, fn,
                           dh == 64 ? api_backward<64, 1> : api_backward<128, 1>, "the API's");
    return ok;
}

static bool run_checks(const char *only) {
    bool all = true;
    for (const Shape &s : check_shapes) {
        print_shape(s);
        Problem p = make_problem(s);
        all &= check_forward(p, s.dh == 64 ? api_forward<64> : api_forward<128>, "api");
        all &= check_backward(p, s.dh == 64 ? api_backward<64, 1> : api_backward<128, 1>, "api, deterministic", false);
        for (const Version &v : versions) {
            if (!wanted(only, v.number)) continue;
            BwdFn fn[2];
            const char *path[2];
            for (int i = 0, n = paths(v, s.dh, fn, path); i < n; i++) {
                char name[160];
                snprintf(name, sizeof name, "version %d, %s: %s", v.number, path[i], v.name);
                all &= check_backward(p, fn[i], name, v.nondet);
                all &= same_bits_checks(v, p.q, p.k, p.v, p.c, p.o, p.lse, p.dout, p.dc, p.dlogf, p.gq, p.gk, p.gv,
                                        p.scratch, s.B, s.H, s.T, s.dh, p.q_last, fn[i]);
            }
        }
        free_problem(p);
    }
    printf("correctness: %s\n", all ? "ALL PASS" : "SOME FAILED");
    return all;
}

static bool run_bench(const char *only, int nshapes) {
    bool ok = true;
    for (int si = 0; si < nshapes; si++) {
        const BenchShape &bs = bench_shapes[si];
        BenchInputs b = make_bench_inputs(bs.B, bs.H, bs.T, bs.dh);
        ok &= bench_backward(b, bs.dh == 64 ? api_backward<64, 1> : api_backward<128, 1>, "api, deterministic", false);
        for (const Version &v : versions) {
            if (!wanted(only, v.number)) continue;
            BwdFn fn[2];
            const char *path[2];
            for (int i = 0, n = paths(v, bs.dh, fn, path); i < n; i++) {
                char name[160];
                snprintf(name, sizeof name, "version %d, %s: %s", v.number, path[i], v.name);
                ok &= bench_backward(b, fn[i], name, v.nondet);
                ok &= same_bits_checks(v, b.q, b.k, b.v, b.c, b.o, b.lse, b.dout, b.dc, b.dlogf, b.gq, b.gk, b.gv,
                                       b.scratch, b.B, b.H, b.T, b.dh, nullptr, fn[i]);
            }
        }
        free_bench_inputs(b);
    }
    return ok;
}

// What a key block costs beside its query tiles: the API backward (deterministic and not) on an ACP staircase that
// leaves every key block n query tiles of 128 (q_last[nb] = nb + n - 1), for several n at a fixed grid; a
// least-squares line through (query tiles walked, ms) gives the per-tile cost (slope) and the intercept: a key
// block's fixed cost over the waves of blocks plus the passes over all of T (D = rowsum(dO o), the dQ
// accumulator's zeroing and conversion, the reverse cumsum), which ACP does not shrink.
template <int DH>
static void block_cost(int B, int H, int T) {
    const int nblk = (T + FOX_ACP_BLOCK - 1) / FOX_ACP_BLOCK;
    BenchInputs b = make_bench_inputs(B, H, T, DH);
    api_forward<DH>(b.q, b.k, b.v, b.c, b.o, b.lse, B, H, T, nullptr, 0);
    const int ns[] = {1, 2, 3, 4, 6, 8, 12, 16};
    for (int det = 1; det >= 0; det--) {
        double sx = 0, sy = 0, sxx = 0, sxy = 0;
        int npts = 0;
        for (int n : ns) {
            std::vector<int> ql((size_t)B * H * nblk);
            double tiles = 0;  // query tiles of 128 walked over every key block
            for (int bh = 0; bh < B * H; bh++)
                for (int nb = 0; nb < nblk; nb++) {
                    ql[(size_t)bh * nblk + nb] = std::min(nblk - 1, nb + n - 1);
                    tiles += ql[(size_t)bh * nblk + nb] - nb + 1;
                }
            int *dql = to_device(ql);
            const double ms = median_ms([&] {
                fox_attention_backward(b.q, b.k, b.v, b.c, b.o, b.lse, b.dout, b.dc, b.dlogf, b.gq, b.gk, b.gv, b.scratch, B,
                                       H, T, DH, dql, det, 0);
            });
            FOX_CUDA_CHECK(cudaFree(dql));
            bench_header(b);
            printf("%s n %2d: %9.0f query tiles in %d key blocks, %7.3f ms\n", det ? "det" : "nondet", n, tiles, B * H * nblk, ms);
            sx += tiles, sy += ms, sxx += tiles * tiles, sxy += tiles * ms, npts++;
        }
        const int sms = fox_sm_count();
        const double slope = (npts * sxy - sx * sy) / (npts * sxx - sx * sx), icpt = (sy - slope * sx) / npts;
        const double waves = (double)B * H * nblk / sms, tile_us = slope * 1e3 * sms;
        bench_header(b);
        printf("%s: a query tile %.3f us of an SM; intercept %.3f ms (%.1f waves of key blocks: %.2f us, %.2f tiles a block "
               "if the passes over T were free)\n",
               det ? "det" : "nondet", tile_us, icpt, waves, icpt * 1e3 / waves, icpt * 1e3 / waves / tile_us);
    }
    free_bench_inputs(b);
}

int main(int argc, char **argv) {
    const char *only = argc > 1 && strcmp(argv[1], "0") != 0 ? argv[1] : nullptr;  // 0 or none: every version
    const char *mode = argc > 2 ? argv[2] : "all";
    if (only && !(only[0] >= '1' && only[0] <= '9')) {
        fprintf(stderr, "usage: %s [0 | versions, e.g. 13,15,21 (of 1..%d)] [check|bench|all|blocks]\n", argv[0],
                (int)(sizeof versions / sizeof versions[0]));
        return 2;
    }
    printf("attention kernels: %s\n", fox_attn::use_wgmma() ? "warpgroup MMA (wgmma)" : "mma.sync (FOX_ATTN_NO_WGMMA or not Hopper)");
    if (!strcmp(mode, "blocks")) {
        block_cost<64>(2, 16, 16384);
        block_cost<64>(8, 16, 4096);
        block_cost<128>(2, 8, 16384);
        block_cost<128>(8, 8, 4096);
        return 0;
    }
    bool ok = true;
    if (strcmp(mode, "bench") != 0) ok &= run_checks(only);
    const int nbench = (int)(sizeof bench_shapes / sizeof bench_shapes[0]);
    const int nshapes = argc > 3 ? std::min(atoi(argv[3]), nbench) : nbench;  // the first nshapes bench shapes
    if (strcmp(mode, "check") != 0) ok &= run_bench(only, nshapes);
    return ok ? 0 : 1;
}
