// dev/cuda/attention_forward.cu: the Forgetting Attention forward kernel in every version tried, each
// checked against the fp64 CPU reference (attention_ref.h) and timed beside the public API
// (fox/attention.cuh, whose kernels are version 1 and, on Hopper, 32 up to T 8192 and 27 beyond; 3 and 6 before
// session 8, 10 before session 11, 23 (d_h 128: 16) before session 12, 27 at every T before session 18).
//   make attention_forward
//   ./attention_forward            every version: checks, then timings
//   ./attention_forward 3          version 3 only (and the API); 10,11,12: those three
//   ./attention_forward 3 check    (or bench) one half
//   ./attention_forward 0 blocks   the API's cost per key tile and per block (an ACP staircase of n tiles); 32 blocks:
//                                  version 32's
//   ./attention_forward 0 orders   the API kernel's launch orders (groups of heads) at the trainers' shapes;
//                                  orders B,H,T[,d_h]: at one shape
//   FOX_BENCH_SUSTAIN=S ./attention_forward ...   every timing held S seconds (the rate at the power cap)
//   ./attention_forward 0 persistent   version 32 (persistent) against 27 (a block an item), T 1024 to 16384
//
// Versions (figures: forward TFLOP/s; NOTES.md has the full tables):
//  1 mma.sync, d_h 64: 4 warps x 2 row tiles of 16, 2 blocks/SM; d_h 128: 8 warps x 1 row tile.
//    284-285 at T 16384, 265 at T 4096 (H200, session 2 run 3); d_h 128 287 (H200, session 1), 291.5-291.8
//    at T 16384 B 2 H 8, 251.8-252.6 at T 4096 (H100, session 7 runs 2 and 3).
//    The API's forward on sm_80 and with FOX_ATTN_NO_WGMMA=1.
//  2 wgmma (d_h 64, Hopper), 8 warps of 16 rows, 2 blocks/SM, P V issued and waited for after each
//    tile's softmax: 333-336 at T 16384, 307-308 at T 4096 (H200, session 2 run 3); 336.9 / 341.6 at
//    T 16384 B 2 H 16, 334.0 / 335.3 at B 1 H 24, 307.2 at T 4096 (H100, session 5). d_h 64 only.
//  3 wgmma with tile t-1's P V pipelined under tile t's softmax (V triple-buffered): the same output bit
//    for bit as 2. 348.3 / 344.9 at T 16384 B 2 H 16, 340.9 / 337.5 at B 1 H 24, 309.8 at T 4096 (H100,
//    session 5, the same runs as 2's figures). The API's forward at d_h 64 on Hopper until session 8.
//  4 2 at d_h 128 (Hopper): Q, K, V tiles stored as two 64-column halves (swz_halves), each a canonical
//    128-byte-swizzle operand; S's k16 steps walk both halves, P V is an m64n64 product per half of V.
//    1 block of 8 warps per SM (O alone is 64 registers per thread); 168 registers, ptxas injects a
//    warpgroup.arrive (C7519). 389.8-390.2 at T 16384 B 2 H 8, 326.0-331.5 at T 4096 (H100, session 7
//    runs 2 and 3).
//  5 3 at d_h 128: 4 with tile t-1's P V pipelined under tile t's softmax; 167 registers. 405.6-405.8 at
//    T 16384, 337.0-341.2 at T 4096 (the same runs).
//  6 5 with key tiles of 128 (S = Q K^T one m64n128 product per k16 step; smem 197 KB; 254 registers, no
//    spills): half the per-tile softmax bookkeeping and S's operand traffic per flop of 5 (K read once
//    per 128 keys for 64 query rows of a warpgroup instead of once per 64). 422.7 at T 16384, 349.6 at
//    T 4096 (H100, session 7 run 3, beside 5's 405.6 / 341.2). The API's forward at d_h 128 on Hopper until
//    session 8.
// Session 8 (H200 at 1980 MHz, runs 2 and 3 of session 8; T 4096 = B 8 H 16 at d_h 64, B 8 H 8 at 128;
// T 16384 = B 2 H 16 / B 2 H 8; each figure beside the same run's 3 (d_h 64) and 6 (d_h 128): run 2
// 309.2 / 341.3 / 348.8 / 410.8, run 3 312.1 / 341.1 / 343.7 / 407.4 at d_h 64 T 4096, T 16384, d_h 128
// T 4096, T 16384):
//  7 TMA producer warpgroup (warp 8 issues the copies and forms the gate terms; setmaxnreg 24 / 240),
//    two consumer warpgroups of 64 rows, key tiles of 128, K / V / gate terms in 2 mbarrier stages, 1 block
//    per SM; the per-tile math of 6. d_h 64: 267.2 / 268.2 at T 4096, 306.6 / 307.3 at T 16384; d_h 128:
//    384.9 / 384.1, 458.1 / 452.9 (runs 2 / 3).
//  8 7 with the consumer warpgroups taking turns to issue their MMAs (named barriers; FA3's scheduler
//    barrier). d_h 64: 291.2 / 293.6, 338.4 / 338.5; d_h 128: 465.3 / 463.0, 546.9 / 540.1. Run 3's API
//    at d_h 128 was this code (fox/attention_forward.cuh then): 458.7 at T 4096, 558.7 at T 16384.
//  9 7 at d_h 64 with 2 blocks per SM, key tiles of 64: setmaxnreg 24 / 104 within the 80 registers of a
//    384-thread block at 2 blocks per SM; ptxas serializes the warpgroup MMAs (C7512) and spills 48 bytes.
//    292.8 / 291.9, 319.3 / 319.1.
// 10 8 with the causal mask on the diagonal tile only (a uniform branch between two copies of the score
//    loop; 8 compares and selects every score of every tile). d_h 64: 332.9 at T 4096, 402.9 at T 16384
//    (399.3 at B 1 H 12, 407.9 at B 1 H 24, beside 3's 311.5 / 336.8); d_h 128: 507.8, 586.8 (run 3). The
//    API's forward on Hopper at both d_h from session 8 to session 11.
// Session 8, later (H200 at 1980 MHz, one run; each figure beside the same run's 10: d_h 64 333.3 at T 4096,
// 401.3 at T 16384 B 2 H 16, 398.0 at B 1 H 12, 399.1 at B 1 H 24; d_h 128 508.1 at T 4096, 574.8 at T 16384):
// 11 10 with S(t+1) issued before tile t's softmax into a second score accumulator, K / V / gate terms in 3
//    stages, d_h 64 only (fwd_la_kernel): 304.9, 367.0, 364.0, 363.9: 8-9% slower than 10.
// 12 11 with the exponentials of 3 of a tile's 16 column tiles on the FMA pipe (ex2_fma: Cody-Waite and a
//    degree-4 polynomial, relative error 2.7e-6; lse within 5.2e-7 of the reference, relative): 300.2,
//    364.0, 358.5, 358.3.
// 13 10 with 12's exponentials: d_h 64 328.4, 390.4, 383.5, 384.8; d_h 128 482.0, 544.5 (1.5-5% slower).
// 14 11 with 2 of 16 on the FMA pipe: 301.5, 364.0, 361.9, 360.1.
// 15 11 with 5 of 16 on the FMA pipe: 293.5, 356.6, 354.0, 355.0.
// Session 11 (H100 80GB HBM3 at 1980 MHz, 2026-11-26; d_h 64 at T 4096 B 8 H 16, T 16384 B 2 H 16, B 1 H 12,
// B 1 H 24, beside the same run's 10: 334-337, 406-409, 402-405, 404-407; ranges over 4 runs):
// 16-18, 20, 23 are fox/attention_forward.cuh's fwd_ws_kernel in other forms (FwdWsShape); their figures are
// from its first text (a dev copy, commit ff0b4dd), whose dead tiles were masked whole with a key-limit select.
// 16 three consumer warpgroups of 64 rows, 192-row blocks, 512 threads, setmaxnreg 160 / 24 (at d_h 128 two
//    warpgroups, version 10's shape): 356-360, 437-450, 410-415, 432-436; d_h 128 512-517 at
//    T 4096, 575-633 at T 16384 (10: 573-587 in the same runs; the first-timed row runs ~630 there).
// 17 16 with 3 K / V stages: 354-358, 436-441, 413-415, 432-436.
// 18 17 with the grid (heads, query blocks), every head's longest block first: 358-361, 436-450, 450-451,
//    435-442; at d_h 128 (2 stages) 450-453 and 543-554: slower there.
// 19 18 persistent (a block per SM, items in 18's order, static stride, the item in registers: 12 / 28 bytes
//    of spills): 314-320, 405-421, 396, 391. Removed (code at commit 71a45d2); 21 and 22 are its forms.
// 20 16 with 18's order (2 stages): 314-320, 409-422, 437-440, 415-418.
// 21 18 persistent with the work item passed through smem (no spills): 320-328, 401-418, 394-399, 415-419.
// 22 21 with the items handed out by an atomic counter: 346, 415-443, 431-435, 431-442. Still below 18.
//    21 and 22 removed in session 12 (code at commit c91c701: fwd_pers_kernel, a near copy of the API kernel).
// 23 18 with a warpgroup's dead tiles' S cut to its first k16 step, their softmax and the P V after them
//    skipped: first text (with the key-limit select) 355-364, 435-457, 443-461, 435-464; without the select
//    the API's forward on Hopper at d_h 64 in session 11: 364-366, 469-472, 464-466, 470 (16 at d_h 128).
// Session 12 (H100 80GB HBM3; the producer issues K's copy before it stores the gate terms, in every form
// from 16 on; T 4096 B 8 H 16, T 16384 B 2 H 16, B 1 H 12, B 1 H 24, beside the same runs' 23: 369-372,
// 457, 466-467, 459-463; `./attention_forward 0 orders` has group sizes 2-16 at 16 shapes):
// 24 23 launched longest first in groups of 2 heads (d_h 128: 16 in groups of 2): 354-356, 457-460,
//    441-448, 449-450; d_h 128 513-524 at T 4096, 588 at T 16384 (the API then, head after head: 520-523, 635-639).
// 25 groups of 4: 358-381, 469-470, 446-457, 451; d_h 128 530-541, 588-590.
// 26 groups of 8: 386-388, 472, 456-460, 458-460; d_h 128 502-536, 561-565.
// 27 groups of 16 (d_h 128: of about one wave of blocks, fwd_head_group): the API's forward on Hopper since
//    session 12: 386-393 at T 4096, 463-475 / 463-466 / 450-470 at T 16384; d_h 128 537-542, 586-648. Since
//    session 27 its groups at d_h 64 are fwd_head_group's, as many heads as keep K and V within 24 MB of L2 (6, 6
//    and 4 at the T 16384 shapes, 12 at T 8192): +0.8-2.1% held at the power cap (`FOX_BENCH_SUSTAIN=1
//    ./attention_forward 0 orders`; dev/cuda/NOTES.md session 27).
// 28 27 with 4 K / V stages at d_h 64 (3 at d_h 128, 231 KB of smem): 390-394 at T 4096, level at T 16384; d_h
//    128 538-540 at T 4096, 561-591 at T 16384 (27: 586-641 in the same runs).
// 29 (session 17) the forward's Q in registers for S: commit 1bfa51d, reverted (dev/cuda/NOTES.md session 17).
// Session 18 (2026-11-26; T 4096 B 8 H 16 / d_h 128 B 8 H 8, T 16384 B 2 H 16 / B 2 H 8, B 1 H 12, B 1 H 24; each
// figure beside the same run's API (27); `./attention_forward 32 blocks` gives a version's block costs):
// 30 27 persistent (a block an SM, items from a counter in 27's order), Q and the item's rows' c in two smem
//    buffers. First form (the next item claimed when an item starts, H200): 395-396 / 450-454 / 444 / 449-451
//    against 391-396 / 476-477 / 468 / 469-472; d_h 128 527-528 / 559-567 against 538-542 / 640-641. Block costs:
//    a tile 1.722-1.733 us of an SM against 27's 1.643-1.647, a block's fixed cost 1.94-1.96 us against 4.30-4.40.
//    Claimed once its last copies are issued (H100): 405 / 440 / 439 / 445 against 393 / 472 / 465 / 472.
// 31 30's kernel launched a block an item (not persistent): 377-380 / 441-447 / 438-441 / 439-443 (H200). Its
//    tiles cost 1.673 us: the per-tile loss is the code, not the persistence. ncu (T 16384 B 2 H 16): 1.1% more
//    instructions, 0.58 issued a cycle against 0.61: the tile loop recomputes per-item values every tile (n_last's
//    division, the smem window, T from the constant bank) and forms Q's descriptors from the buffer's address.
// 32 30 with one Q buffer at 27's constant address (the next Q loaded once the item's last S is complete), the
//    next item claimed when this one's last copies are issued, the item read through shfl (warp-uniform) (H100,
//    two runs): 412-413 / 452-453 / 464-467 / 450-469 against 397-398 /
//    473-474 / 471-474 / 472-474; d_h 128 553-558 / 585-601 against 537-538 / 640-646. Block costs: a tile
//    1.589-1.602 us against 27's 1.592-1.630, a block's fixed cost 3.47-3.50 us against 4.33-4.50 (d_h 128 4.84-5.14
//    against 6.51-6.58). +3-4% at T 4096 at both d_h; at T 16384 1-9% slower, which the block costs (the same
//    tile, a lower fixed cost) do not explain. `0 persistent` (27 and 32 in the order 27, 32, 32, 27, B T = 32k):
//    +8-13% at T 1024, +4-7% at 2048, +3-7% at 4096, 0-5% at 8192, 1-3% slower at 16384 (both d_h): since
//    session 18 the API's Hopper forward up to T 8192, as fox/attention_forward.cuh's fwd_ws_kernel with
//    FwdWsPersistentCfg (version 32 now runs it at every T); 30, 31 and the dev copy of 32 were removed (code at
//    commit 4ba1cf7).
// 33 (session 19, commit 9c840c4, removed since): the persistent form before LATE_O, an experiment in the API (and
//    so in 32): an item's last P V and O store under the next item's first tile, P, O and the V stage carried across
//    items. At d_h 64 ptxas serialized the warpgroup MMAs (C7511: the carried P and O beside the next item's S exceed
//    160 registers): 32 at 281-284 against 33's 407-410 at T 4096, 309-316 against 463-470 at T 16384 (H100, two
//    runs); at d_h 128 +1.3% at T 4096 (540 / 547 against 534 / 538), 5-6% slower at T 16384. Not kept. What stayed: P and O declared outside the item's lambda (and the
//    epilogue as store_o), with which ptxas fits the kernel a block an item (27, the API at T 16384) without its 4-byte
//    spill at d_h 64: API +1.5-2.5% at T 16384 d_h 64 (B 2 H 16 476.2 / 475.3 against 471.6 / 466.2, B 1 H 12 474.8
//    / 469.5 against 462.9 / 462.0, B 1 H 24 470.8 / 471.1 against 465.0 / 462.2), at d_h 128 and at T 4096 level
//    to 1-2% slower within the runs' spread (T 16384 d_h 128 626.5 / 629.0 against 637.4 / 647.7; H100, 30b8fe3's
//    binary alternating in one call).
// Session 19, the blocks of a head aligned to its end (q_shift in fwd_ws_kernel: where T is not a multiple of the
//    block's 192 rows the short block is the head's first, one key tile, not its last, the longest walk with two dead
//    warpgroups), every version of fwd_ws_kernel: API (the persistent form) T 4096 d_h 64 421.4 / 420.0 against
//    408.3 / 409.8 (+3%), 32 427.3 / 426.2 against 414.4 / 416.1; T 16384 level (477.1 / 481.1 against 477.3 /
//    477.2), d_h 128 unchanged (no short block at these T); H100, 8237dec's binary alternating in one call.
#include "attention_ref.h"  // reference, checks, timing; includes fox/attention.cuh (primitives, traits)

#include <stdlib.h>

#include <type_traits>  // std::true_type, std::false_type

namespace fox_attn_dev {
using namespace fox_attn;  // the primitives and the tile constants

// The block shape of fwd_kernel below: fox/attention_traits.cuh's FwdCfg, and with WG the warpgroup-MMA path
// (8 warps of 16 rows). The API's mma.sync forward is WG false.
template <int DH, bool WG> struct DevFwdCfg {
    static constexpr int MT = DH == 64 && !WG ? 2 : 1;
    static constexpr int THREADS = FWD_BM / (16 * MT) * 32;
    static constexpr int MIN_BLOCKS = DH == 64 ? 2 : 1;  // the warpgroup path needs ~126 registers at 256 threads
};
// Its smem: the Q tile, K double-buffered, V double- (or, PIPE, triple-) buffered, the gate terms; key tiles of BN.
template <int DH, bool PIPE, int BN> size_t dev_fwd_smem_bytes() {
    static_assert(FOX_ACP_BLOCK % BN == 0, "key tiles nest in the ACP grid");
    return (size_t)(FWD_BM + (PIPE ? 5 : 4) * BN) * DH * 2 + (2 * BN + 2) * 4;
}

// Forward. Block = FWD_BM query rows of one (b, h); each warp owns MT row tiles of 16 (FwdCfg). Key
// tiles of BN (64, or 128 on the warpgroup path) are walked from the diagonal down to the first live one,
// double-buffered with cp.async.
//
// Gate precision: c reaches -1e4 and beyond at long T, where an fp32 ulp is ~1e-3, so c_i - c_j must be
// formed from differences, never from c*log2e products. Each key tile takes c_ref = c at its first
// key; a_i = (c_i - c_ref) log2e per row and nb_j = -(c_j - c_ref) log2e per key are small for every
// tile that matters, and s_ij log2e = a_i + fma(qk, scale log2e, nb_j).
// WG: S = Q K^T and O += P V on Hopper warpgroup MMA (sm_90a): 8 warps of 16 rows, warpgroup w4 owning
// rows 64 w4.., operands straight from the swizzled smem tiles; the rest of the kernel is shared. Tiles
// are stored as 64-column halves (swz_halves: one half at dh 64, two at dh 128), each a canonical
// 128-byte-swizzle operand: S's k16 steps walk Q's and K's halves in turn, and P V is one m64n64 product
// per half of V (MN-major), giving O's columns 64 hf.. (acc_half).
// PIPE (with WG): tile t-1's P V runs on the tensor cores during tile t's softmax. Per tile a warpgroup
// commits S(t) = Q K(t)^T, then P(t-1) V(t-1) (P kept in registers as bf16 fragments), waits for S(t)
// only, forms tile t's exponentials and row sums, then waits for P V and rescales O: the same operations
// on O in the same order as without PIPE (the same output bit for bit). V is triple-buffered (V(t-1)
// is still read while V(t+1) lands); the P V issue is unconditional (at t = 0 a zero P on a zeroed V
// buffer): under a branch ptxas would serialize the kernel's warpgroup MMAs.
template <int DH, bool WG = false, bool PIPE = false, int BN = FWD_BN>
__global__ void __launch_bounds__(DevFwdCfg<DH, WG>::THREADS, DevFwdCfg<DH, WG>::MIN_BLOCKS)
fwd_kernel(const __nv_bfloat16 *__restrict__ q, const __nv_bfloat16 *__restrict__ k,
           const __nv_bfloat16 *__restrict__ v, const float *__restrict__ c, __nv_bfloat16 *__restrict__ o,
           float *__restrict__ lse, int H, int T, const int *__restrict__ kv_first) {
    constexpr int BM = FWD_BM, MT = DevFwdCfg<DH, WG>::MT, NT = DevFwdCfg<DH, WG>::THREADS;
    static_assert(BN == FWD_BN || (WG && BN == 128), "key tiles of 64, or 128 on the warpgroup path");
    static_assert(BN <= NT && FOX_ACP_BLOCK % BN == 0, "one loader thread per key; tiles nest in the ACP grid");
    constexpr int NV = PIPE ? 3 : 2;  // V buffers
    static_assert(!WG || MT == 1, "warpgroup path: 16 rows per warp");
    static_assert(!PIPE || WG, "pipelined P V: warpgroup path");
    extern __shared__ __align__(1024) unsigned char fwd_smem[];  // 1024: the 128-byte swizzle's period
    __nv_bfloat16 *Qs = reinterpret_cast<__nv_bfloat16 *>(fwd_smem);
    __nv_bfloat16 *Ks = Qs + BM * DH;          // [2][BN][DH]
    __nv_bfloat16 *Vs = Ks + 2 * BN * DH;      // [NV][BN][DH]
    float *nbs = reinterpret_cast<float *>(Vs + NV * BN * DH);  // [2][BN]: -(c_j - c_ref) log2e
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

    if constexpr (PIPE) {  // V buffer 2: the operand of the zero P V issued with tile 0
        uint4 *z = reinterpret_cast<uint4 *>(Vs + 2 * BN * DH);
        for (int i = tid; i < BN * DH / 8; i += NT) z[i] = make_uint4(0u, 0u, 0u, 0u);
    }
    load_tile_async<DH, BM, NT, WG>(Qs, qh, DH, q0, T, tid);
    load_tile_async<DH, BN, NT, WG>(Ks, kh, DH, n_last * BN, T, tid);
    load_tile_async<DH, BN, NT, WG>(Vs, vh, DH, n_last * BN, T, tid);
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
    uint32_t pprev[BN / 16][4];  // PIPE: tile t-1's P as bf16 A fragments (zero before tile 0)
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++) pprev[kk][0] = pprev[kk][1] = pprev[kk][2] = pprev[kk][3] = 0u;
    float oacc[MT][DH / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < DH / 8; i++) oacc[mt][i][0] = oacc[mt][i][1] = oacc[mt][i][2] = oacc[mt][i][3] = 0.f;
    // WG: O += P V for P as bf16 A fragments and V tile Vb, one m64n64 product per half of V
    auto pv_issue = [&](const uint32_t (&p)[BN / 16][4], const __nv_bfloat16 *Vb) {
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++)
#pragma unroll
            for (int hf = 0; hf < DH / 64; hf++)
                wgmma_m64n64_rs<1>(acc_half(oacc[0], hf), p[kk], desc_mnmajor<BN>(Vb, hf, kk));
    };

    for (int it = 0; it < ntiles; it++) {
        const int n = n_last - it, buf = it & 1, vbuf = PIPE ? it % 3 : buf;
        cp_async_wait_all();
        if constexpr (WG) fence_proxy_async_smem();  // cp.async writes -> wgmma reads
        __syncthreads();
        const bool more = it + 1 < ntiles;
        float cj_next = 0.f, cref_next = 0.f;
        if (more) {
            load_tile_async<DH, BN, NT, WG>(Ks + (buf ^ 1) * BN * DH, kh, DH, (n - 1) * BN, T, tid);
            load_tile_async<DH, BN, NT, WG>(Vs + (PIPE ? (it + 1) % 3 : buf ^ 1) * BN * DH, vh, DH, (n - 1) * BN, T, tid);
            cp_async_commit();
            fetch_c(n - 1, cj_next, cref_next);
        }
        if (!WG && it == 0) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int kk = 0; kk < DH / 16; kk++) load_a<DH>(qf[mt][kk], Qs, (warp * MT + mt) * 16, kk * 16, lane);
        }
        const __nv_bfloat16 *Kb = Ks + buf * BN * DH, *Vb = Vs + vbuf * BN * DH;
        const float *nb = nbs + buf * BN;

        float s[MT][BN / 8][4];
        if constexpr (WG) {
            const int w4 = warp >> 2;
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < DH / 16; kk++)
                if constexpr (BN == 128)
                    wgmma_m64n128_ss<0, 0>(s[0], desc_kmajor<BM>(Qs, w4 * 64, kk), desc_kmajor<BN>(Kb, 0, kk), kk > 0);
                else
                    wgmma_m64n64_ss<0, 0>(s[0], desc_kmajor<BM>(Qs, w4 * 64, kk), desc_kmajor<BN>(Kb, 0, kk), kk > 0);
            if constexpr (PIPE) {  // then tile t-1's P V; only S is waited for here
                wg_commit();
                pv_issue(pprev, Vs + ((it + 2) % 3) * BN * DH);
                wg_commit();
                wg_wait<1>();
            } else {
                wg_commit_wait();
            }
        } else {
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
            if constexpr (PIPE) wg_wait<0>();  // tile t-1's P V has landed in O
#pragma unroll
            for (int i = 0; i < DH / 8; i++)
#pragma unroll
                for (int x = 0; x < 4; x++) oacc[mt][i][x] *= al[x >> 1];
        }
        if constexpr (PIPE) {
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) acc_to_a(pprev[kk], s[0][2 * kk], s[0][2 * kk + 1]);
        } else if constexpr (WG) {
            uint32_t pa[BN / 16][4];
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) acc_to_a(pa[kk], s[0][2 * kk], s[0][2 * kk + 1]);
            wg_fence();
            pv_issue(pa, Vb);
            wg_commit_wait();
        } else
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

    if constexpr (PIPE) {  // the last tile's P V
        const __nv_bfloat16 *Vp = Vs + ((ntiles - 1) % 3) * BN * DH;
        wg_fence();
        pv_issue(pprev, Vp);
        wg_commit_wait();
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

template <int DH, bool WG, bool PIPE, int BN = FWD_BN>
void forward_cfg(const bf16 *q, const bf16 *k, const bf16 *v, const float *c, bf16 *o, float *lse, int B, int H, int T,
                 const int *kv_first, cudaStream_t s) {
    const size_t smem = dev_fwd_smem_bytes<DH, PIPE, BN>();
    FOX_CUDA_CHECK(cudaFuncSetAttribute(fwd_kernel<DH, WG, PIPE, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    dim3 grid((T + FWD_BM - 1) / FWD_BM, B * H);
    fwd_kernel<DH, WG, PIPE, BN><<<grid, DevFwdCfg<DH, WG>::THREADS, smem, s>>>(q, k, v, c, o, lse, H, T, kv_first);
    FOX_LAUNCH_CHECK();
}


// 2^x for x <= 0 on the FMA and integer pipes, off the MUFU pipe that ex2 uses (FlashAttention-4's
// trick, our code): Cody-Waite range reduction x = i + f, i = round(x), |f| <= 1/2, read from the low
// mantissa bits of x + 1.5 * 2^23; 2^f by a degree-4 polynomial (relative-error fit on [-1/2, 1/2]:
// max relative error 2.7e-6 with these fp32 coefficients, against 2^-22 for ex2.approx); 2^i added into
// the exponent field. x is clamped at -126, so x = -inf (a masked score) gives 2^-126, not 0: a weight
// 2^-126 beside the row's maximum, whose own weight is 1.
__device__ __forceinline__ float ex2_fma(float x) {
    constexpr float RND = 12582912.f;                       // 1.5 * 2^23
    x = fmaxf(x, -126.f);
    const float j = __fadd_rn(x, RND);                      // _rn: kept apart from the subtraction below
    const float f = __fsub_rn(x, __fsub_rn(j, RND));        // x - round(x)
    float p = fmaf(9.570096619e-03f, f, 5.591785908e-02f);
    p = fmaf(p, f, 2.402474433e-01f);
    p = fmaf(p, f, 6.931217909e-01f);
    p = fmaf(p, f, 9.999992847e-01f);
    return __int_as_float(__float_as_int(p) + (__float_as_int(j) << 23));  // the low bits of j: i
}

// Versions 7-15's block: consumer warps 0-7 (two warpgroups of 64 query rows) and a producer warpgroup
// (warps 8-11). setmaxnreg moves the producer's registers to the consumers within what the block was launched
// with (__launch_bounds__(384, MINB): 168 registers a thread at MINB 1, 80 at 2): MINB 1: 128 x 24 + 256 x 240
// = 64.5k of 384 x 168; MINB 2: 128 x 24 + 256 x 104 = 29.7k of 384 x 80. K, V and the gate terms in 2
// stages (11-15: 3). The API's Hopper forward until session 11 (fox/attention_traits.cuh's FwdWsCfg now).
template <int MINB> struct Fwd2Cfg {
    static constexpr int THREADS = 384;
    static constexpr int PRODUCER_WARP = 8;
    static constexpr int STAGES = 2;
    static constexpr int REGS_CONSUMER = MINB == 1 ? 240 : 104, REGS_PRODUCER = 24;
    static_assert(REGS_PRODUCER * 128 + REGS_CONSUMER * 256 <= (MINB == 1 ? 168 : 80) * THREADS, "the block's registers");
};
template <int DH, int BN, int ST = 2> constexpr size_t fwd2_smem_bytes() {
    static_assert(FOX_ACP_BLOCK % BN == 0, "key tiles nest in the ACP grid");
    return (size_t)(FWD_BM + 2 * ST * BN) * DH * 2 + (ST * BN + (ST + 1) / 2 * 2) * 4 + (1 + 4 * ST) * 8;
}

// Versions 7-9: the warpgroup-MMA forward with its loads taken off the consumer warps (FA3's recipe, our
// code). Warps 0-7 are two consumer warpgroups of 64 query rows each (as in 3 and 6); warp 8 is the
// producer: one lane issues the bulk tensor copies (TMA) of Q, then of each key tile's K and V (each
// 64-column half a box of the 3-D map [B H][T][d_h], arriving in the 128-byte-swizzle layout the
// descriptors read; rows past T come in as zeros), and the warp's 32 lanes form the tile's gate terms
// nb_j and c_ref (the same values as fwd_kernel's) into the stage's smem before arriving on its mbarrier.
// K, V and the gate terms have 2 stages each, with "full" mbarriers (32 producer arrivals + the bytes of
// the copies) and "empty" ones (one arrival per consumer warp): a consumer frees K(t) and the gate terms
// once S(t) is complete and its gate terms are in registers, V(t-1) once P(t-1) V(t-1) is. No
// __syncthreads in the tile loop. The P V of tile t-1 is pipelined under tile t's softmax exactly as in 3
// and 6 (the same operations on O in the same order: the same output bit for bit); at t = 0 the zero P
// multiplies V(0), whose copy is waited for.
// SCHED (FA3's warp scheduler barrier): the two consumer warpgroups take turns issuing their MMAs (named
// barriers 1 and 2), so that one warpgroup's softmax runs while the other's products occupy the tensor
// cores.
// SPLIT: the causal mask is applied on the diagonal tile alone (a uniform branch between two copies of the
// score loop), rather than tested per element on every tile (a compare and a select per score).
// POLY: the exponentials of the first POLY of the tile's BN / 8 column tiles of 8 on the FMA pipe (ex2_fma),
// the others on the MUFU pipe (ex2).
template <int DH, int BN, int MINB, bool SCHED, bool SPLIT, int POLY = 0>
__global__ void __launch_bounds__(Fwd2Cfg<MINB>::THREADS, MINB)
fwd_ws_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
              const __grid_constant__ CUtensorMap tm_v, const float *__restrict__ c, __nv_bfloat16 *__restrict__ o,
              float *__restrict__ lse, int H, int T, const int *__restrict__ kv_first) {
    constexpr int BM = FWD_BM, ST = Fwd2Cfg<MINB>::STAGES;
    static_assert(ST == 2, "stage and parity arithmetic below assumes 2 stages");
    extern __shared__ __align__(1024) unsigned char fwd_smem[];  // 1024: the 128-byte swizzle's period
    __nv_bfloat16 *Qs = reinterpret_cast<__nv_bfloat16 *>(fwd_smem);
    __nv_bfloat16 *Ks = Qs + BM * DH;          // [ST][BN][DH]
    __nv_bfloat16 *Vs = Ks + ST * BN * DH;     // [ST][BN][DH]
    float *nbs = reinterpret_cast<float *>(Vs + ST * BN * DH);  // [ST][BN]: -(c_j - c_ref) log2e
    float *crefs = nbs + ST * BN;                                // [ST]
    uint64_t *q_full = reinterpret_cast<uint64_t *>(crefs + ST);
    uint64_t *k_full = q_full + 1, *k_empty = k_full + ST, *v_full = k_empty + ST, *v_empty = v_full + ST;

    const int tid = threadIdx.x, lane = tid & 31;
    const int warp = __shfl_sync(0xffffffffu, tid >> 5, 0);  // shfl: provably warp-uniform
    const int g = lane >> 2, tq = lane & 3;
    const int nqb = gridDim.x;
    const int mb = nqb - 1 - blockIdx.x;  // longest rows first
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const size_t head_off = (size_t)bh * T;
    const float *ch = c + head_off;
    const int q0 = mb * BM;
    const int n_last = min((T - 1) / BN, (q0 + BM - 1) / BN);
    const int n_first = kv_first ? kv_first[(size_t)bh * nqb + mb] * (FOX_ACP_BLOCK / BN) : 0;
    const int ntiles = n_last - n_first + 1;

    if (tid == 0) {
        mbar_init(q_full, 1);
        for (int s = 0; s < ST; s++) {
            mbar_init(k_full + s, 32);
            mbar_init(k_empty + s, 8);
            mbar_init(v_full + s, 1);
            mbar_init(v_empty + s, 8);
        }
        mbar_fence_init();
    }
    __syncthreads();

    if (warp >= Fwd2Cfg<MINB>::PRODUCER_WARP) {  // the producer
        setmaxnreg_dec<Fwd2Cfg<MINB>::REGS_PRODUCER>();
        if (warp != Fwd2Cfg<MINB>::PRODUCER_WARP) return;
        if (lane == 0) {
            mbar_arrive_expect_tx(q_full, BM * DH * 2);
#pragma unroll
            for (int hf = 0; hf < DH / 64; hf++) tma_load_3d(Qs + hf * BM * 64, &tm_q, q_full, hf * 64, q0, bh);
        }
        for (int it = 0; it < ntiles; it++) {
            const int n = n_last - it, s = it & 1, parity = ((it >> 1) & 1) ^ 1;  // the release of tile it-2
            if (it >= ST) mbar_wait(k_empty + s, parity);
            const float cref = ch[n * BN];
#pragma unroll
            for (int i = lane; i < BN; i += 32) {
                const int j = n * BN + i;
                nbs[s * BN + i] = key_gate_log2(j < T ? ch[j] : cref, cref);
            }
            if (lane == 0) {
                crefs[s] = cref;
                mbar_arrive_expect_tx(k_full + s, BN * DH * 2);
#pragma unroll
                for (int hf = 0; hf < DH / 64; hf++)
                    tma_load_3d(Ks + s * BN * DH + hf * BN * 64, &tm_k, k_full + s, hf * 64, n * BN, bh);
            } else {
                mbar_arrive(k_full + s);
            }
            if (it >= ST) mbar_wait(v_empty + s, parity);
            if (lane == 0) {
                mbar_arrive_expect_tx(v_full + s, BN * DH * 2);
#pragma unroll
                for (int hf = 0; hf < DH / 64; hf++)
                    tma_load_3d(Vs + s * BN * DH + hf * BN * 64, &tm_v, v_full + s, hf * 64, n * BN, bh);
            }
        }
        return;
    } else {  // the consumers
        setmaxnreg_inc<Fwd2Cfg<MINB>::REGS_CONSUMER>();
        const int w4 = warp >> 2;
        int row[2];
        float crow[2], m[2], l[2];  // gate, running max (log2 units), running sum
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            row[hf] = q0 + warp * 16 + g + 8 * hf;
            crow[hf] = row[hf] < T ? ch[row[hf]] : 0.f;
            m[hf] = -INFINITY;
            l[hf] = 0.f;
        }
        const float sl2 = LOG2E / sqrtf((float)DH);
        uint32_t pprev[BN / 16][4];  // tile t-1's P as bf16 A fragments (zero before tile 0)
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) pprev[kk][0] = pprev[kk][1] = pprev[kk][2] = pprev[kk][3] = 0u;
        float oacc[DH / 8][4];
#pragma unroll
        for (int i = 0; i < DH / 8; i++) oacc[i][0] = oacc[i][1] = oacc[i][2] = oacc[i][3] = 0.f;
        // O += P V for the previous tile's P (pprev) and V tile Vp, one m64n64 product per half of V
        auto pv_issue = [&](const __nv_bfloat16 *Vp) {
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++)
#pragma unroll
                for (int hf = 0; hf < DH / 64; hf++)
                    wgmma_m64n64_rs<1>(acc_half(oacc, hf), pprev[kk], desc_mnmajor<BN>(Vp, hf, kk));
        };
        // Warp lane 0 arrives for its warp once every lane's reads of the stage are done.
        auto release = [&](uint64_t *bar) {
            __syncwarp();
            if (lane == 0) mbar_arrive(bar);
        };

        mbar_wait(q_full, 0);
        if constexpr (SCHED)
            if (w4 == 1) named_bar_arrive(1, 256);  // warpgroup 0 issues first
        for (int it = 0; it < ntiles; it++) {
            const int n = n_last - it, s = it & 1;
            const int vi = it > 0 ? it - 1 : 0, vs = vi & 1;  // V(t-1); V(0) under the zero P of t = 0
            mbar_wait(k_full + s, (it >> 1) & 1);
            mbar_wait(v_full + vs, (vi >> 1) & 1);
            if constexpr (SCHED) {  // constant ids: ptxas counts the barriers
                if (w4 == 0) named_bar_sync(1, 256);
                else named_bar_sync(2, 256);
            }
            float sacc[BN / 8][4];
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < DH / 16; kk++)
                if constexpr (BN == 128)
                    wgmma_m64n128_ss<0, 0>(sacc, desc_kmajor<BM>(Qs, w4 * 64, kk), desc_kmajor<BN>(Ks + s * BN * DH, 0, kk), kk > 0);
                else
                    wgmma_m64n64_ss<0, 0>(sacc, desc_kmajor<BM>(Qs, w4 * 64, kk), desc_kmajor<BN>(Ks + s * BN * DH, 0, kk), kk > 0);
            wg_commit();  // then tile t-1's P V; only S is waited for here
            pv_issue(Vs + vs * BN * DH);
            wg_commit();
            if constexpr (SCHED) {  // the other warpgroup's turn (none after warpgroup 1's last tile)
                if (w4 == 0) named_bar_arrive(2, 256);
                else if (it + 1 < ntiles) named_bar_arrive(1, 256);
            }
            wg_wait<1>();

            const bool diag = n * BN + BN - 1 > q0;
            const float cref = crefs[s];
            // t = s log2e - a_i: the log2 score without the row's own gate term; element e + 2 hf is row hf
            float mt_max[2] = {-INFINITY, -INFINITY};
            auto scores = [&](auto diag_tile) {  // SPLIT: std::true_type on the diagonal tile
#pragma unroll
                for (int nt = 0; nt < BN / 8; nt++) {
                    const float2 nbj = *reinterpret_cast<const float2 *>(nbs + s * BN + nt * 8 + 2 * tq);  // key columns
#pragma unroll
                    for (int x = 0; x < 4; x++) {
                        const int hf = x >> 1, j = n * BN + nt * 8 + 2 * tq + (x & 1);
                        float t = fmaf(sacc[nt][x], sl2, x & 1 ? nbj.y : nbj.x);
                        if ((SPLIT ? decltype(diag_tile)::value : diag) && j > row[hf]) t = -INFINITY;
                        sacc[nt][x] = t;
                        mt_max[hf] = fmaxf(mt_max[hf], t);
                    }
                }
            };
            if (SPLIT && !diag) scores(std::false_type{});
            else scores(std::true_type{});
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
                    const float e = sacc[nt][x] - sh[x >> 1];
                    sacc[nt][x] = nt < POLY ? ex2_fma(e) : ex2(e);
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
        }
        {  // the last tile's P V
            const int vi = ntiles - 1;
            mbar_wait(v_full + (vi & 1), (vi >> 1) & 1);
            wg_fence();
            pv_issue(Vs + (vi & 1) * BN * DH);
            wg_commit_wait();
        }
        const size_t ld_o = (size_t)H * DH;
        __nv_bfloat16 *ob = o + (size_t)b * T * ld_o + (size_t)h * DH;
        constexpr float LN2 = 0.6931471805599453f;
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int r = row[hf];
            const float lsum = quad_sum(l[hf]), inv = 1.f / lsum;
            if (r >= T) continue;
#pragma unroll
            for (int nt = 0; nt < DH / 8; nt++)
                *reinterpret_cast<uint32_t *>(ob + r * ld_o + nt * 8 + 2 * tq) =
                    pack_bf16(oacc[nt][2 * hf] * inv, oacc[nt][2 * hf + 1] * inv);
            if (tq == 0) lse[head_off + r] = (m[hf] + log2f(lsum)) * LN2;
        }
    }
}

template <int DH, int BN, int MINB, bool SCHED, bool SPLIT = false, int POLY = 0>
void forward_ws(const bf16 *q, const bf16 *k, const bf16 *v, const float *c, bf16 *o, float *lse, int B, int H, int T,
                const int *kv_first, cudaStream_t s) {
    const size_t smem = fwd2_smem_bytes<DH, BN>();
    FOX_CUDA_CHECK(cudaFuncSetAttribute(fwd_ws_kernel<DH, BN, MINB, SCHED, SPLIT, POLY>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const CUtensorMap tq = tma_map_bf16_3d(q, DH, T, B * H, FWD_BM), tk = tma_map_bf16_3d(k, DH, T, B * H, BN),
                      tv = tma_map_bf16_3d(v, DH, T, B * H, BN);
    dim3 grid((T + FWD_BM - 1) / FWD_BM, B * H);
    fwd_ws_kernel<DH, BN, MINB, SCHED, SPLIT, POLY><<<grid, Fwd2Cfg<MINB>::THREADS, smem, s>>>(tq, tk, tv, c, o, lse, H, T, kv_first);
    FOX_LAUNCH_CHECK();
}

// Versions 11, 12, 14, 15: version 10 with the scores of the next key tile computed under this tile's softmax
// (d_h 64). Per tile t a consumer warpgroup issues P(t-1) V(t-1), then S(t+1) = Q K(t+1)^T into a second
// score accumulator, then forms tile t's exponentials from S(t), which completed during tile t-1: the
// tensor cores compute S(t+1) and P(t-1) V(t-1) while the warps work, and no warpgroup waits on the S it
// has just issued. The two accumulators take turns (the tile loop unrolled by 2, `step` with the roles
// swapped); 2 x 64 + O 32 + P 32 registers per thread (ptxas: 12 bytes of spill stores, 20 of loads).
// Each tile ends waiting for all its products, S(t+1) included: with S(t+1) left in flight across the
// step (FA3-like wg_wait<2> / <1> counting) ptxas serializes the warpgroup MMAs (C7514) once an
// accumulator stays in flight across the loop's back edge, whatever the branches and spin loops inside.
// The last tile issues a dummy S on its own K stage (the issue is unconditional: under a branch ptxas
// would serialize the warpgroup MMAs; no later copy reuses that stage). K is released once S(t) and the
// gate terms are read, so K(t+2) may land only during tile t: K, V and the gate terms have 3 stages (smem
// 112 KB). Turns between the warpgroups: a prologue turn issues S(0), each tile's turn P V(t-1) and
// S(t+1). The operations on O are those of 10 in the same order. POLY as in fwd_ws_kernel above.
template <int DH, int POLY>
__global__ void __launch_bounds__(Fwd2Cfg<1>::THREADS, 1)
fwd_la_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
              const __grid_constant__ CUtensorMap tm_v, const float *__restrict__ c, __nv_bfloat16 *__restrict__ o,
              float *__restrict__ lse, int H, int T, const int *__restrict__ kv_first) {
    constexpr int BM = FWD_BM, BN = FWD_WS_BN, ST = 3;
    static_assert(DH == 64, "two score accumulators and O fit the consumer's 240 registers at d_h 64 only");
    extern __shared__ __align__(1024) unsigned char fwd_smem[];  // 1024: the 128-byte swizzle's period
    __nv_bfloat16 *Qs = reinterpret_cast<__nv_bfloat16 *>(fwd_smem);
    __nv_bfloat16 *Ks = Qs + BM * DH;          // [ST][BN][DH]
    __nv_bfloat16 *Vs = Ks + ST * BN * DH;     // [ST][BN][DH]
    float *nbs = reinterpret_cast<float *>(Vs + ST * BN * DH);  // [ST][BN]: -(c_j - c_ref) log2e
    float *crefs = nbs + ST * BN;                                // [ST], padded to an even count
    uint64_t *q_full = reinterpret_cast<uint64_t *>(crefs + (ST + 1) / 2 * 2);
    uint64_t *k_full = q_full + 1, *k_empty = k_full + ST, *v_full = k_empty + ST, *v_empty = v_full + ST;

    const int tid = threadIdx.x, lane = tid & 31;
    const int warp = __shfl_sync(0xffffffffu, tid >> 5, 0);  // shfl: provably warp-uniform
    const int g = lane >> 2, tq = lane & 3;
    const int nqb = gridDim.x;
    const int mb = nqb - 1 - blockIdx.x;  // longest rows first
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const size_t head_off = (size_t)bh * T;
    const float *ch = c + head_off;
    const int q0 = mb * BM;
    const int n_last = min((T - 1) / BN, (q0 + BM - 1) / BN);
    const int n_first = kv_first ? kv_first[(size_t)bh * nqb + mb] * (FOX_ACP_BLOCK / BN) : 0;
    const int ntiles = n_last - n_first + 1;

    if (tid == 0) {
        mbar_init(q_full, 1);
        for (int s = 0; s < ST; s++) {
            mbar_init(k_full + s, 32);
            mbar_init(k_empty + s, 8);
            mbar_init(v_full + s, 1);
            mbar_init(v_empty + s, 8);
        }
        mbar_fence_init();
    }
    __syncthreads();

    if (warp >= Fwd2Cfg<1>::PRODUCER_WARP) {  // the producer: version 10's, with ST stages
        setmaxnreg_dec<Fwd2Cfg<1>::REGS_PRODUCER>();
        if (warp != Fwd2Cfg<1>::PRODUCER_WARP) return;
        if (lane == 0) {
            mbar_arrive_expect_tx(q_full, BM * DH * 2);
            tma_load_3d(Qs, &tm_q, q_full, 0, q0, bh);
        }
        for (int it = 0, s = 0, parity = 1; it < ntiles; it++) {  // parity: the release of tile it-ST
            const int n = n_last - it;
            if (it >= ST) mbar_wait(k_empty + s, parity);
            const float cref = ch[n * BN];
#pragma unroll
            for (int i = lane; i < BN; i += 32) {
                const int j = n * BN + i;
                nbs[s * BN + i] = key_gate_log2(j < T ? ch[j] : cref, cref);
            }
            if (lane == 0) {
                crefs[s] = cref;
                mbar_arrive_expect_tx(k_full + s, BN * DH * 2);
                tma_load_3d(Ks + s * BN * DH, &tm_k, k_full + s, 0, n * BN, bh);
            } else {
                mbar_arrive(k_full + s);
            }
            if (it >= ST) mbar_wait(v_empty + s, parity);
            if (lane == 0) {
                mbar_arrive_expect_tx(v_full + s, BN * DH * 2);
                tma_load_3d(Vs + s * BN * DH, &tm_v, v_full + s, 0, n * BN, bh);
            }
            if (++s == ST) s = 0, parity ^= 1;
        }
        return;
    } else {  // the consumers
        setmaxnreg_inc<Fwd2Cfg<1>::REGS_CONSUMER>();
        const int w4 = warp >> 2;
        int row[2];
        float crow[2], m[2], l[2];  // gate, running max (log2 units), running sum
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            row[hf] = q0 + warp * 16 + g + 8 * hf;
            crow[hf] = row[hf] < T ? ch[row[hf]] : 0.f;
            m[hf] = -INFINITY;
            l[hf] = 0.f;
        }
        const float sl2 = LOG2E / sqrtf((float)DH);
        uint32_t pprev[BN / 16][4];  // tile t-1's P as bf16 A fragments (zero before tile 0)
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) pprev[kk][0] = pprev[kk][1] = pprev[kk][2] = pprev[kk][3] = 0u;
        float oacc[DH / 8][4];
#pragma unroll
        for (int i = 0; i < DH / 8; i++) oacc[i][0] = oacc[i][1] = oacc[i][2] = oacc[i][3] = 0.f;
        float sa[BN / 8][4], sb[BN / 8][4];  // the two score accumulators
        auto s_issue = [&](float (&sacc)[BN / 8][4], int stage) {
#pragma unroll
            for (int kk = 0; kk < DH / 16; kk++)
                wgmma_m64n128_ss<0, 0>(sacc, desc_kmajor<BM>(Qs, w4 * 64, kk), desc_kmajor<BN>(Ks + stage * BN * DH, 0, kk), kk > 0);
        };
        auto pv_issue = [&](const __nv_bfloat16 *Vp) {
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) wgmma_m64n64_rs<1>(acc_half(oacc, 0), pprev[kk], desc_mnmajor<BN>(Vp, 0, kk));
        };
        auto release = [&](uint64_t *bar) {
            __syncwarp();
            if (lane == 0) mbar_arrive(bar);
        };
        auto turn_wait = [&] {  // constant ids: ptxas counts the barriers
            if (w4 == 0) named_bar_sync(1, 256);
            else named_bar_sync(2, 256);
        };

        // the prologue turn: S(0)
        mbar_wait(q_full, 0);
        mbar_wait(k_full, 0);
        if (w4 == 1) named_bar_arrive(1, 256);  // warpgroup 0 issues first
        turn_wait();
        wg_fence();
        s_issue(sa, 0);
        wg_commit();
        if (w4 == 0) named_bar_arrive(2, 256);
        else named_bar_arrive(1, 256);  // every block has a tile turn after the prologue's
        wg_wait<0>();

        // Tile it: sc holds S(it), sn receives S(it + 1).
        auto step = [&](float (&sc)[BN / 8][4], float (&sn)[BN / 8][4], const int it) {
            const int n = n_last - it, s = it % ST;
            const bool more = it + 1 < ntiles;
            const int vi = it > 0 ? it - 1 : 0, vs = vi % ST;  // V(t-1); V(0) under the zero P of t = 0
            if (more) mbar_wait(k_full + (it + 1) % ST, ((it + 1) / ST) & 1);
            mbar_wait(v_full + vs, (vi / ST) & 1);
            turn_wait();
            wg_fence();
            pv_issue(Vs + vs * BN * DH);
            wg_commit();
            s_issue(sn, more ? (it + 1) % ST : s);  // the last tile: a dummy on its own stage
            wg_commit();
            if (w4 == 0) named_bar_arrive(2, 256);  // the other warpgroup's turn (none after warpgroup 1's last)
            else if (more) named_bar_arrive(1, 256);

            const bool diag = n * BN + BN - 1 > q0;
            const float cref = crefs[s];
            float mt_max[2] = {-INFINITY, -INFINITY};
            auto scores = [&](auto diag_tile) {  // std::true_type on the diagonal tile: the causal mask
#pragma unroll
                for (int nt = 0; nt < BN / 8; nt++) {
                    const float2 nbj = *reinterpret_cast<const float2 *>(nbs + s * BN + nt * 8 + 2 * tq);
#pragma unroll
                    for (int x = 0; x < 4; x++) {
                        const int hf = x >> 1, j = n * BN + nt * 8 + 2 * tq + (x & 1);
                        float t = fmaf(sc[nt][x], sl2, x & 1 ? nbj.y : nbj.x);
                        if (decltype(diag_tile)::value && j > row[hf]) t = -INFINITY;
                        sc[nt][x] = t;
                        mt_max[hf] = fmaxf(mt_max[hf], t);
                    }
                }
            };
            if (diag) scores(std::true_type{});
            else scores(std::false_type{});
            release(k_empty + s);  // S(it) is read and the gate terms too
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
                    const float e = sc[nt][x] - sh[x >> 1];
                    sc[nt][x] = nt < POLY ? ex2_fma(e) : ex2(e);
                    ps[x >> 1] += sc[nt][x];
                }
#pragma unroll
            for (int hf = 0; hf < 2; hf++) l[hf] = l[hf] * al[hf] + ps[hf];  // quad-reduced at the end
            wg_wait<1>();  // P V(it-1) has landed in O
            if (it > 0) release(v_empty + vs);
#pragma unroll
            for (int i = 0; i < DH / 8; i++)
#pragma unroll
                for (int x = 0; x < 4; x++) oacc[i][x] *= al[x >> 1];
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) acc_to_a(pprev[kk], sc[2 * kk], sc[2 * kk + 1]);
            wg_wait<0>();  // S(it + 1), issued before this tile's softmax
        };
        for (int it = 0; it < ntiles; it += 2) {
            step(sa, sb, it);
            if (it + 1 < ntiles) step(sb, sa, it + 1);
        }
        {  // the last tile's P V (and the end of the dummy S)
            const int vi = ntiles - 1;
            mbar_wait(v_full + vi % ST, (vi / ST) & 1);
            wg_fence();
            pv_issue(Vs + (vi % ST) * BN * DH);
            wg_commit_wait();
        }
        const size_t ld_o = (size_t)H * DH;
        __nv_bfloat16 *ob = o + (size_t)b * T * ld_o + (size_t)h * DH;
        constexpr float LN2 = 0.6931471805599453f;
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int r = row[hf];
            const float lsum = quad_sum(l[hf]), inv = 1.f / lsum;
            if (r >= T) continue;
#pragma unroll
            for (int nt = 0; nt < DH / 8; nt++)
                *reinterpret_cast<uint32_t *>(ob + r * ld_o + nt * 8 + 2 * tq) =
                    pack_bf16(oacc[nt][2 * hf] * inv, oacc[nt][2 * hf + 1] * inv);
            if (tq == 0) lse[head_off + r] = (m[hf] + log2f(lsum)) * LN2;
        }
    }
}

template <int DH, int POLY>
void forward_la(const bf16 *q, const bf16 *k, const bf16 *v, const float *c, bf16 *o, float *lse, int B, int H, int T,
                const int *kv_first, cudaStream_t s) {
    const size_t smem = fwd2_smem_bytes<DH, FWD_WS_BN, 3>();
    FOX_CUDA_CHECK(cudaFuncSetAttribute(fwd_la_kernel<DH, POLY>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const CUtensorMap tq = tma_map_bf16_3d(q, DH, T, B * H, FWD_BM), tk = tma_map_bf16_3d(k, DH, T, B * H, FWD_WS_BN),
                      tv = tma_map_bf16_3d(v, DH, T, B * H, FWD_WS_BN);
    dim3 grid((T + FWD_BM - 1) / FWD_BM, B * H);
    fwd_la_kernel<DH, POLY><<<grid, Fwd2Cfg<1>::THREADS, smem, s>>>(tq, tk, tv, c, o, lse, H, T, kv_first);
    FOX_LAUNCH_CHECK();
}

// Versions 16-18, 20, 23-26, 28: fox/attention_forward.cuh's fwd_ws_kernel in other forms (FwdWsShape: NWG consumer
// warpgroups of 64 query rows, FlashAttention-3's d_h 64 forward has three; STAGES; the launch order longest first
// in groups of G heads (G = ALL_HEADS: every head's longest query block first, the grid (heads, query blocks)
// before session 12; G = 1: head after head, which was a 2-D grid (query blocks, heads) until 2026-11-29, the same
// order); SKIP_DEAD, a warpgroup's dead tiles skipped rather than masked whole). The persistent forms of 18 (19, 21,
// 22) were measured and removed: 19 at commit 71a45d2, 21 and 22 at c91c701.
constexpr int ALL_HEADS = 1 << 20;  // a group size above any head count: one group
template <int NWG, int ST, bool SKIP = false> using Fwd3Cfg = FwdWsShape<NWG, ST, SKIP>;
template <int DH, int NWG, int ST, int G, bool SKIP = false>  // G: the group of heads, 1 head after head
void forward_wg3(const bf16 *q, const bf16 *k, const bf16 *v, const float *c, bf16 *o, float *lse, int B, int H, int T,
                 const int *kv_first, cudaStream_t s) {
    fox_attn::fwd_ws_launch<DH, Fwd3Cfg<NWG, ST, SKIP>>(q, k, v, c, o, lse, B, H, T, kv_first, s, G, nullptr);
}
// Version 28: the API's form and launch order (fwd_head_group) with ST stages.
template <int DH, int ST>
void forward_stages(const bf16 *q, const bf16 *k, const bf16 *v, const float *c, bf16 *o, float *lse, int B, int H, int T,
                    const int *kv_first, cudaStream_t s) {
    using Cfg = FwdWsCfg<DH>;
    fox_attn::forward_ws<DH, Fwd3Cfg<Cfg::NWG, ST, Cfg::SKIP_DEAD>>(q, k, v, c, o, lse, B, H, T, kv_first, s);
}


// Version 27: the API's form a block an item (FwdWsCfg), at every T; version 32: its persistent form
// (FwdWsPersistentCfg, the API's up to T = FWD_PERSISTENT_MAX_T), at every T. 30 and 31 (a dev copy of the kernel,
// fwd_pq_kernel, with two Q buffers) were measured and removed: code at commit 4ba1cf7.
template <int DH>
void forward_per_item(const bf16 *q, const bf16 *k, const bf16 *v, const float *c, bf16 *o, float *lse, int B, int H,
                      int T, const int *kv_first, cudaStream_t s) {
    fox_attn::forward_ws<DH>(q, k, v, c, o, lse, B, H, T, kv_first, s);
}
template <int DH>
void forward_persistent(const bf16 *q, const bf16 *k, const bf16 *v, const float *c, bf16 *o, float *lse, int B, int H,
                        int T, const int *kv_first, cudaStream_t s) {
    fox_attn::forward_ws<DH, fox_attn::FwdWsPersistentCfg<DH>>(q, k, v, c, o, lse, B, H, T, kv_first, s,
                                                                fox_attn::fwd_item_counter(s));
}

}  // namespace fox_attn_dev

struct Version {
    int number;
    const char *name;
    FwdFn fn64, fn128;  // NULL: not built for this d_h
    bool wg;            // needs the warpgroup path (skipped where fox_attn::use_wgmma() is false)
    bool api_bits;      // the API's arithmetic: its o and lse must equal the API's bit for bit
};
static const Version versions[] = {
    {1, "mma.sync", fox_attn_dev::forward_cfg<64, false, false>, fox_attn_dev::forward_cfg<128, false, false>, false},
    {2, "wgmma, P V not pipelined", fox_attn_dev::forward_cfg<64, true, false>, nullptr, true},
    {3, "wgmma, P V pipelined", fox_attn_dev::forward_cfg<64, true, true>, nullptr, true},
    {4, "wgmma at d_h 128 (two 64-column halves), P V not pipelined", nullptr, fox_attn_dev::forward_cfg<128, true, false>,
     true},
    {5, "wgmma at d_h 128 (two 64-column halves), P V pipelined", nullptr, fox_attn_dev::forward_cfg<128, true, true>,
     true},
    {6, "wgmma at d_h 128, P V pipelined, key tiles of 128", nullptr, fox_attn_dev::forward_cfg<128, true, true, 128>,
     true},
    {7, "TMA producer warpgroup, 2 consumer warpgroups, key tiles of 128", fox_attn_dev::forward_ws<64, 128, 1, false>,
     fox_attn_dev::forward_ws<128, 128, 1, false>, true},
    {8, "7 with the consumer warpgroups taking turns (scheduler barrier)", fox_attn_dev::forward_ws<64, 128, 1, true>,
     fox_attn_dev::forward_ws<128, 128, 1, true>, true},
    {9, "7 at 2 blocks/SM, key tiles of 64, 104 registers", fox_attn_dev::forward_ws<64, 64, 2, false>, nullptr, true},
    {10, "8 with the causal mask on the diagonal tile only", fox_attn_dev::forward_ws<64, 128, 1, true, true>,
     fox_attn_dev::forward_ws<128, 128, 1, true, true>, true},
    {11, "10 with S(t+1) issued before tile t's softmax (3 stages), d_h 64", fox_attn_dev::forward_la<64, 0>, nullptr, true},
    {12, "11 with 3 of 16 column tiles' exponentials on the FMA pipe", fox_attn_dev::forward_la<64, 3>, nullptr, true},
    {13, "10 with 3 of 16 column tiles' exponentials on the FMA pipe", fox_attn_dev::forward_ws<64, 128, 1, true, true, 3>,
     fox_attn_dev::forward_ws<128, 128, 1, true, true, 3>, true},
    {14, "11 with 2 of 16 column tiles' exponentials on the FMA pipe", fox_attn_dev::forward_la<64, 2>, nullptr, true},
    {15, "11 with 5 of 16 column tiles' exponentials on the FMA pipe", fox_attn_dev::forward_la<64, 5>, nullptr, true},
    {16, "10 with three consumer warpgroups (192-row blocks; d_h 128: two, version 10's shape)",
     fox_attn_dev::forward_wg3<64, 3, 2, 1>, fox_attn_dev::forward_wg3<128, 2, 2, 1>, true},
    {17, "16 with K, V and the gate terms in 3 stages at d_h 64", fox_attn_dev::forward_wg3<64, 3, 3, 1>, nullptr, true},
    {18, "17 with every head's longest query block first (grid: heads, query blocks)",
     fox_attn_dev::forward_wg3<64, 3, 3, fox_attn_dev::ALL_HEADS>, fox_attn_dev::forward_wg3<128, 2, 2, fox_attn_dev::ALL_HEADS>, true},
    {20, "16 with every head's longest query block first (2 stages)", fox_attn_dev::forward_wg3<64, 3, 2, fox_attn_dev::ALL_HEADS>, nullptr, true},
    {23, "18 with a warpgroup's dead tiles' S cut to one k16 step, their softmax and P V skipped (the API)",
     fox_attn_dev::forward_wg3<64, 3, 3, fox_attn_dev::ALL_HEADS, true>, nullptr, true},
    {24, "23 (d_h 128: 16) launched longest first in groups of 2 heads", fox_attn_dev::forward_wg3<64, 3, 3, 2, true>,
     fox_attn_dev::forward_wg3<128, 2, 2, 2>, true},
    {25, "23 (d_h 128: 16) launched longest first in groups of 4 heads", fox_attn_dev::forward_wg3<64, 3, 3, 4, true>,
     fox_attn_dev::forward_wg3<128, 2, 2, 4>, true},
    {26, "23 (d_h 128: 16) launched longest first in groups of 8 heads", fox_attn_dev::forward_wg3<64, 3, 3, 8, true>,
     fox_attn_dev::forward_wg3<128, 2, 2, 8>, true},
    {27, "23 in groups of 16 heads (d_h 128: 16 in groups of about one wave of blocks): the API's form a block an item",
     fox_attn_dev::forward_per_item<64>, fox_attn_dev::forward_per_item<128>, true, true},
    {28, "27 with 4 K / V stages (d_h 128: 3)", fox_attn_dev::forward_stages<64, 4>, fox_attn_dev::forward_stages<128, 3>, true},
    {32, "27 persistent, one Q buffer at the constant address (the API's form up to T 8192), at every T",
     fox_attn_dev::forward_persistent<64>, fox_attn_dev::forward_persistent<128>, true, true},
};

static FwdFn version_fn(const Version &v, int dh) {
    if (v.wg && !fox_attn::use_wgmma()) return nullptr;
    return dh == 64 ? v.fn64 : v.fn128;
}

// For a version with api_bits: whether o and lse (fn's, already computed from these inputs) equal the API's.
static bool same_bits_as_api(const bf16 *q, const bf16 *k, const bf16 *v, const float *c, const bf16 *o, const float *lse,
                             int B, int H, int T, int dh, const int *kv_first, size_t nqkv, size_t nvec) {
    bf16 *ao;
    float *alse;
    FOX_CUDA_CHECK(cudaMalloc(&ao, nqkv * sizeof(bf16)));
    FOX_CUDA_CHECK(cudaMalloc(&alse, nvec * sizeof(float)));
    (dh == 64 ? api_forward<64> : api_forward<128>)(q, k, v, c, ao, alse, B, H, T, kv_first, 0);
    FOX_CUDA_CHECK(cudaDeviceSynchronize());
    const bool same = memcmp(to_host(o, nqkv).data(), to_host((const bf16 *)ao, nqkv).data(), nqkv * sizeof(bf16)) == 0 &&
                      memcmp(to_host(lse, nvec).data(), to_host((const float *)alse, nvec).data(), nvec * sizeof(float)) == 0;
    FOX_CUDA_CHECK(cudaFree(ao));
    FOX_CUDA_CHECK(cudaFree(alse));
    printf("    o and lse bitwise the API's: %s\n", same ? "PASS" : "FAIL");
    return same;
}

static bool run_checks(const char *only) {
    bool all = true;
    for (const Shape &s : check_shapes) {
        print_shape(s);
        Problem p = make_problem(s);
        for (const Version &v : versions) {
            const FwdFn fn = version_fn(v, s.dh);
            if (!wanted(only, v.number) || !fn) continue;
            char name[96];
            snprintf(name, sizeof name, "version %d: %s", v.number, v.name);
            all &= check_forward(p, fn, name);
            if (v.api_bits)
                all &= same_bits_as_api(p.q, p.k, p.v, p.c, p.o, p.lse, s.B, s.H, s.T, s.dh, p.kv_first, p.nqkv, p.nvec);
        }
        all &= check_forward(p, s.dh == 64 ? api_forward<64> : api_forward<128>, "api");
        free_problem(p);
    }
    printf("correctness: %s\n", all ? "ALL PASS" : "SOME FAILED");
    return all;
}

static bool run_bench(const char *only) {
    bool all = true;
    for (const BenchShape &bs : bench_shapes) {
        BenchInputs b = make_bench_inputs(bs.B, bs.H, bs.T, bs.dh);
        bench_forward(b, bs.dh == 64 ? api_forward<64> : api_forward<128>, "api");
        for (const Version &v : versions) {
            const FwdFn fn = version_fn(v, bs.dh);
            if (!wanted(only, v.number) || !fn) continue;
            char name[96];
            snprintf(name, sizeof name, "version %d: %s", v.number, v.name);
            bench_forward(b, fn, name);
            if (v.api_bits)
                all &= same_bits_as_api(b.q, b.k, b.v, b.c, b.o, b.lse, b.B, b.H, b.T, b.dh, nullptr, b.nqkv, b.nvec);
        }
        free_bench_inputs(b);
    }
    return all;
}

// What a block costs beside its tiles: the API forward on an ACP staircase that leaves every query block
// about n key tiles (kv_first[a] = a - n + 1 for ACP row a), for several n at a fixed grid; a least-squares
// line through (key tiles walked, ms) gives the per-tile cost (slope) and a fixed cost per block (the
// intercept spread over the waves of blocks): load latency, pipeline fill and drain, the epilogue.
template <int DH>
static void block_cost(int B, int H, int T, FwdFn fn) {
    using Cfg = fox_attn::FwdWsCfg<DH>;
    constexpr int BN = fox_attn::FWD_WS_BN;
    const int nacp = (T + FOX_ACP_BLOCK - 1) / FOX_ACP_BLOCK, nqb = (T + Cfg::BM - 1) / Cfg::BM;
    BenchInputs b = make_bench_inputs(B, H, T, DH);
    const int ns[] = {1, 2, 3, 4, 6, 8, 12, 16};
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    int npts = 0;
    for (int n : ns) {
        std::vector<int> kvf((size_t)B * H * nacp);
        for (int bh = 0; bh < B * H; bh++)
            for (int a = 0; a < nacp; a++) kvf[(size_t)bh * nacp + a] = std::max(0, a - n + 1);
        double tiles = 0;  // the kernel's count_tiles over every block
        for (int mb = 0; mb < nqb; mb++) {
            const int q0 = mb * Cfg::BM, n_last = std::min((T - 1) / BN, (q0 + Cfg::BM - 1) / BN);
            int first = n_last;
            for (int w = 0; w < Cfg::NWG; w++) first = std::min(first, kvf[std::min((q0 + 64 * w) / FOX_ACP_BLOCK, nacp - 1)] * (FOX_ACP_BLOCK / BN));
            tiles += (double)B * H * (n_last - first + 1);
        }
        int *dkvf = to_device(kvf);
        const double ms = median_ms([&] { fn(b.q, b.k, b.v, b.c, b.o, b.lse, B, H, T, dkvf, 0); });
        FOX_CUDA_CHECK(cudaFree(dkvf));
        bench_header(b);
        printf("n %2d: %9.0f key tiles in %d blocks, %7.3f ms\n", n, tiles, B * H * nqb, ms);
        sx += tiles, sy += ms, sxx += tiles * tiles, sxy += tiles * ms, npts++;
    }
    const double slope = (npts * sxy - sx * sy) / (npts * sxx - sx * sx), icpt = (sy - slope * sx) / npts;
    const double waves = (double)B * H * nqb / fox_sm_count(), tile_us = slope * 1e3 * fox_sm_count();
    bench_header(b);
    printf("a key tile %.3f us of an SM, a block's fixed cost %.2f us (%.2f tiles; intercept %.3f ms over %.1f waves)\n",
           tile_us, icpt * 1e3 / waves, icpt * 1e3 / waves / tile_us, icpt, waves);
    free_bench_inputs(b);
}

// The API kernel's launch order: head after head, and longest first in groups of G heads, at the shapes of
// the trainers (T 16384: B 1, 12 or 24 heads; shorter T: B = 16384 / T) and the bench's; in the form the API runs
// at that T (persistent up to FWD_PERSISTENT_MAX_T, a block an item beyond), the last column the API itself
// (fwd_head_group's pick).
template <int DH>
static void launch_orders(int B, int H, int T) {
    using Cfg = fox_attn::FwdWsCfg<DH>;
    using Persistent = fox_attn::FwdWsPersistentCfg<DH>;
    const bool persistent = T <= fox_attn::FWD_PERSISTENT_MAX_T;
    int *counter = fox_attn::fwd_item_counter(0);
    BenchInputs b = make_bench_inputs(B, H, T, DH);
    const int groups[] = {1, 2, 4, 6, 8, 12, 16, fox_attn_dev::ALL_HEADS, -1};
    const int api = fox_attn::fwd_head_group<DH>((T + Cfg::BM - 1) / Cfg::BM, T, B * H);
    bench_header(b);
    printf("forward TFLOP/s%s, head after head | groups of 2, 4, 6, 8, 12, 16, all heads | the API's (%d):",
           persistent ? " (persistent)" : "", api);
    for (int g : groups) {
        const float ms = median_ms([&] {
            if (g < 0) fox_attn::forward<DH>(b.q, b.k, b.v, b.c, b.o, b.lse, B, H, T, nullptr, 0);
            else if (persistent)
                fox_attn::fwd_ws_launch<DH, Persistent>(b.q, b.k, b.v, b.c, b.o, b.lse, B, H, T, nullptr, 0, g, counter);
            else fox_attn::fwd_ws_launch<DH, Cfg>(b.q, b.k, b.v, b.c, b.o, b.lse, B, H, T, nullptr, 0, g, nullptr);
        });
        printf(" %6.1f%s", 2.0 * B * H * (double)T * T * DH / ms * 1e-9, g == 1 || g == fox_attn_dev::ALL_HEADS ? " |" : "");
    }
    printf("\n");
    free_bench_inputs(b);
}

// Version 32 (persistent) against 27 (a block an item) over T at B T = 32k tokens, timed 27, 32, 32, 27 so that a
// position in the sequence (the clock under the power cap) falls on both alike.
template <int DH>
static void persistent_sweep(int T) {
    const int B = 32768 / T, H = DH == 64 ? 16 : 8;
    BenchInputs b = make_bench_inputs(B, H, T, DH);
    const FwdFn api = fox_attn_dev::forward_per_item<DH>, pers = fox_attn_dev::forward_persistent<DH>;
    double t[4];
    const FwdFn order[4] = {api, pers, pers, api};
    for (int i = 0; i < 4; i++) t[i] = median_ms([&] { order[i](b.q, b.k, b.v, b.c, b.o, b.lse, B, H, T, nullptr, 0); });
    const double flops = 2.0 * B * H * (double)T * T * DH * 1e-9, api_ms = (t[0] + t[3]) / 2, pers_ms = (t[1] + t[2]) / 2;
    bench_header(b);
    printf("27 %6.1f (%6.1f, %6.1f) | 32 %6.1f (%6.1f, %6.1f) TFLOP/s | 32 / 27 %.3f\n", flops / api_ms,
           flops / t[0], flops / t[3], flops / pers_ms, flops / t[1], flops / t[2], api_ms / pers_ms);
    free_bench_inputs(b);
}

int main(int argc, char **argv) {
    const char *only = argc > 1 && strcmp(argv[1], "0") != 0 ? argv[1] : nullptr;  // 0 or none: every version
    const char *mode = argc > 2 ? argv[2] : "all";
    if (only && !(only[0] >= '1' && only[0] <= '9')) {
        fprintf(stderr, "usage: %s [0 | versions, e.g. 10,11,12 (of 1..%d)] [check|bench|all|blocks|orders|persistent]\n", argv[0],
                (int)(sizeof versions / sizeof versions[0]));
        return 2;
    }
    printf("attention kernels: %s\n", fox_attn::use_wgmma() ? "warpgroup MMA (wgmma)" : "mma.sync (FOX_ATTN_NO_WGMMA or not Hopper)");
    if (!strcmp(mode, "blocks")) {
        if (!fox_attn::use_wgmma()) {
            fprintf(stderr, "blocks: measures the Hopper kernel (fwd_ws_kernel); this device runs mma.sync\n");
            return 1;
        }
        const Version *ver = nullptr;  // the version named (its first), else the API
        for (const Version &v : versions)
            if (!ver && only && wanted(only, v.number)) ver = &v;
        if (ver) printf("blocks: version %d: %s\n", ver->number, ver->name);
        if (!ver || ver->fn64) {
            block_cost<64>(2, 16, 16384, ver ? ver->fn64 : api_forward<64>);
            block_cost<64>(8, 16, 4096, ver ? ver->fn64 : api_forward<64>);
        }
        if (!ver || ver->fn128) {
            block_cost<128>(2, 8, 16384, ver ? ver->fn128 : api_forward<128>);
            block_cost<128>(8, 8, 4096, ver ? ver->fn128 : api_forward<128>);
        }
        return 0;
    }
    if (!strcmp(mode, "persistent")) {
        if (!fox_attn::use_wgmma()) {
            fprintf(stderr, "persistent: measures the Hopper kernels; this device runs mma.sync\n");
            return 1;
        }
        for (int T : {1024, 2048, 4096, 8192, 16384}) persistent_sweep<64>(T);
        for (int T : {1024, 2048, 4096, 8192, 16384}) persistent_sweep<128>(T);
        return 0;
    }
    if (!strcmp(mode, "orders")) {
        if (!fox_attn::use_wgmma()) {
            fprintf(stderr, "orders: measures the Hopper kernel (fwd_ws_kernel); this device runs mma.sync\n");
            return 1;
        }
        int B, H, T, dh = 64;
        if (argc > 3) {  // one shape
            if (sscanf(argv[3], "%d,%d,%d,%d", &B, &H, &T, &dh) < 3 || B < 1 || H < 1 || T < 1 || (dh != 64 && dh != 128)) {
                fprintf(stderr, "orders: the shape is B,H,T[,d_h] (d_h 64 or 128), not %s\n", argv[3]);
                return 2;
            }
            if (dh == 64) launch_orders<64>(B, H, T);
            else launch_orders<128>(B, H, T);
            return 0;
        }
        const int shapes[][3] = {{1, 12, 16384}, {1, 24, 16384}, {2, 16, 16384}, {1, 16, 32768}, {2, 12, 8192}, {2, 24, 8192},
                                 {4, 12, 4096}, {4, 24, 4096}, {8, 16, 4096}, {8, 12, 2048}, {8, 24, 2048}};
        for (const auto &x : shapes) launch_orders<64>(x[0], x[1], x[2]);
        const int shapes128[][3] = {{2, 8, 16384}, {1, 16, 16384}, {2, 8, 8192}, {8, 8, 4096}, {4, 16, 4096}};
        for (const auto &x : shapes128) launch_orders<128>(x[0], x[1], x[2]);
        return 0;
    }
    bool ok = true;
    if (strcmp(mode, "bench") != 0) ok &= run_checks(only);
    if (strcmp(mode, "check") != 0) ok &= run_bench(only);
    return ok ? 0 : 1;
}
