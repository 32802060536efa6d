// fox/attention_passes.cuh: the Forgetting Attention backward's passes over the rows around its main kernel
// (FlashAttention-3's flash_bwd_preprocess_kernel.h and flash_bwd_postprocess_kernel.h): the scratch's layout,
// step 1 (D = rowsum(dO * o), zeroing what step 2 adds into) and step 3 (the fp32 dQ accumulators to bf16 dq, the
// chains' dc row sums added). Step 2 is fox/attention_backward.cuh's; dev/cuda/attention_passes.cu checks and
// times these passes.
// Measurements and the variants tried: dev/cuda/NOTES.md, section "Index: the notes of each product kernel".
#ifndef FOX_ATTENTION_PASSES_CUH
#define FOX_ATTENTION_PASSES_CUH

#include <stddef.h>                   // size_t
#include <cuda_runtime.h>             // cudaMemsetAsync, cudaStream_t
#include <cuda_bf16.h>                // __nv_bfloat16
#include "acp.h"                      // FOX_ACP_BLOCK: q_last's grid
#include "cuda_common.cuh"            // FOX_CUDA_CHECK, FOX_LAUNCH_CHECK
#include "attention_primitives.cuh"   // pack_bf16
#include "attention_traits.cuh"       // DQ_BLOCK, dq_acc_rows: the dQ accumulator's layout
#include "attention_order.cuh"        // BWD_CHAINS, bwd_chain_live: the order's chains

namespace fox_attn {

// Backward, step 1: D_i = dO_i . o_i in fp32 (both in (B, T, H, dh), rows contiguous). A row's DH / 8 threads
// each load 16 bytes (pairs 4j .. 4j + 3 of elements 2l, 2l + 1) of both; the sums then follow a warp a row
// with pair l at lane l (and l + 32 at d_h 128) and a butterfly over lanes 16, 8, 4, 2, 1: between threads
// for the distances 16 to 4, within a thread for 2 and 1. fp32 addition commutes, so every thread of a row
// ends with the same bits, and D has the bits of that form.
// The same launch zeroes what step 2 adds into (bwd_prepare), saving the launches of their memsets: with dc
// given, dc and the `chains - 1` row-sum vectors of dc_chains at D's indices, and the first nzi ints of zi.
template <int DH>
__global__ void dot_do_o_kernel(const __nv_bfloat16 *__restrict__ dout, const __nv_bfloat16 *__restrict__ o,
                                float *__restrict__ D, int H, int T, int rows, float *__restrict__ dc,
                                float *__restrict__ dc_chains, int chains, int *__restrict__ zi, size_t nzi) {
    constexpr int L = DH / 8;  // threads a row
    static_assert(DH == 64 || DH == 128, "pairs of one warp a row: 32 or 64");
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // this thread's 16-byte chunk of the rows
    const size_t row = i / L;
    float v[4] = {0.f, 0.f, 0.f, 0.f};
    if (row < (size_t)rows) {
        const uint4 a = reinterpret_cast<const uint4 *>(dout)[i], x = reinterpret_cast<const uint4 *>(o)[i];
        const __nv_bfloat162 *pa = reinterpret_cast<const __nv_bfloat162 *>(&a);
        const __nv_bfloat162 *px = reinterpret_cast<const __nv_bfloat162 *>(&x);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float2 fa = __bfloat1622float2(pa[k]), fx = __bfloat1622float2(px[k]);
            v[k] = 0.f + __fmaf_rn(fa.x, fx.x, __fmul_rn(fa.y, fx.y));  // the old form's contraction, pinned
        }
    }
#pragma unroll
    for (int k = 0; k < 4; k++) {
        if (DH == 128) v[k] += __shfl_xor_sync(0xffffffffu, v[k], 8);  // lane l's second pair, l + 32
#pragma unroll
        for (int off = 4; off > 0; off >>= 1) v[k] += __shfl_xor_sync(0xffffffffu, v[k], off);  // lanes 16, 8, 4 apart
    }
    const float sum = (v[0] + v[2]) + (v[1] + v[3]);  // lanes 2 apart, then 1: (p0 + p2) + (p1 + p3)
    if (i % L == 0 && row < (size_t)rows) {
        const int h = (int)(row % H), bt = (int)(row / H), b = bt / T, t = bt % T;
        const size_t di = ((size_t)b * H + h) * T + t;
        D[di] = sum;
        if (dc) {
            dc[di] = 0.f;
            for (int c = 1; c < chains; c++) dc_chains[(size_t)(c - 1) * rows + di] = 0.f;
        }
    }
    for (size_t z = i; z < nzi; z += (size_t)gridDim.x * blockDim.x) zi[z] = 0;
}

// Step 1's launch: D for the B T H rows; with dc, the zeroing above too.
template <int DH>
void dot_do_o(const __nv_bfloat16 *dout, const __nv_bfloat16 *o, float *D, int B, int H, int T, cudaStream_t s,
              float *dc = nullptr, float *dc_chains = nullptr, int chains = 1, int *zi = nullptr, size_t nzi = 0) {
    const int rows = B * T * H;
    dot_do_o_kernel<DH><<<(unsigned)(((size_t)rows * (DH / 8) + 255) / 256), 256, 0, s>>>(dout, o, D, H, T, rows, dc,
                                                                                        dc_chains, chains, zi, nzi);
    FOX_LAUNCH_CHECK();
}

// Scratch layout (fp32 unless noted): BWD_CHAINS dq accumulators (B H Tp dh each, dq_acc_offset's order), D
// (B H T), dS column sums (B H T), the dc row sums of chains 1.. (B H T each), order counters (int, BWD_CHAINS
// x B H ceil(T/16): enough for any query tile of >= 16 rows), the persistent blocks' work counter (int).
inline size_t bwd_sem_count(int B, int H, int T) { return (size_t)BWD_CHAINS * B * H * ((T + 15) / 16) + 1; }
inline size_t bwd_dq_acc_count(int B, int H, int T, int dh) { return (size_t)B * H * dq_acc_rows(T) * dh; }
inline size_t bwd_scratch_bytes(int B, int H, int T, int dh) {
    return (BWD_CHAINS * bwd_dq_acc_count(B, H, T, dh) + (BWD_CHAINS + 1) * (size_t)B * H * T) * sizeof(float) +
           bwd_sem_count(B, H, T) * sizeof(int);
}

// The scratch's parts: the fp32 dq accumulators (unscaled: Σ_j dS_ij k_j), D = rowsum(dO * o), the minus dS
// column sums (fox_attention_reverse_scan's second operand), the other chains' dc row sums, the order counters;
// and what step 3 needs to read the accumulators: how many chains were used, and the ACP hook they followed.
struct BwdSums {
    float *dq_acc, *D, *colsum, *dc_chains;
    int *sem, *next_item;
    int chains;
    const int *q_last;
};

inline BwdSums bwd_sums(void *scratch, int B, int H, int T, int dh, int chains, const int *q_last) {
    const size_t nvec = (size_t)B * H * T;
    BwdSums p;
    p.dq_acc = static_cast<float *>(scratch);
    p.D = p.dq_acc + BWD_CHAINS * bwd_dq_acc_count(B, H, T, dh);
    p.colsum = p.D + nvec;
    p.dc_chains = p.colsum + nvec;
    p.sem = reinterpret_cast<int *>(p.dc_chains + (BWD_CHAINS - 1) * nvec);
    p.next_item = p.sem + bwd_sem_count(B, H, T) - 1;
    p.chains = chains;
    p.q_last = q_last;
    return p;
}

// Step 1 of the backward, and the zeroed accumulators step 2 adds into (dq unless zero_dq is false: the kernel
// stores each tile's first add; the dc row sums of every chain, the order counters and the work counter, zeroed
// in step 1's launch).
template <int DH>
void bwd_prepare(const __nv_bfloat16 *o, const __nv_bfloat16 *dout, float *dc, const BwdSums &p, bool zero_dq, int B,
                 int H, int T, cudaStream_t s) {
    dot_do_o<DH>(dout, o, p.D, B, H, T, s, dc, p.dc_chains, p.chains, p.sem, bwd_sem_count(B, H, T));
    if (zero_dq) FOX_CUDA_CHECK(cudaMemsetAsync(p.dq_acc, 0, bwd_dq_acc_count(B, H, T, DH) * sizeof(float), s));
}

// Backward, step 3: dq (B, H, T, dh) = scale * the sum of the fp32 accumulators (dq_acc_offset's order, rows
// padded to Tp = dq_acc_rows(T) per head; `chains` of them, stride4 float4s apart), as bf16, the chains added
// first to last from +0 where bwd_chain_live (the others hold nothing of the row: never zeroed); then, with more
// than one chain, dc (chain 0's row sums) += the other chains' (dc_chains), in that order. One block a DQ_BLOCK-row
// block of a head, which is one contiguous range of each accumulator and of dq: a thread sums its float4s (4
// adjacent columns of one row each), the bf16 rows are staged in smem in dq's row-major order and stored with
// 16-byte writes (storing each float4's 8 bytes where it lands scattered a warp's stores over 16 rows).
inline constexpr int DQ_CONVERT_THREADS = 256;
template <int DH>
__global__ void __launch_bounds__(DQ_CONVERT_THREADS)
dq_convert_kernel(const float4 *__restrict__ acc, size_t stride4, int chains, const int *__restrict__ q_last,
                  __nv_bfloat16 *__restrict__ dq, float scale, int T, float *__restrict__ dc,
                  const float *__restrict__ dc_chains, size_t nvec) {
    constexpr int PER = DQ_BLOCK * DH / 4 / DQ_CONVERT_THREADS;  // float4s a thread
    __shared__ __align__(16) __nv_bfloat16 rows[DQ_BLOCK * DH];
    const int nrb = (T + DQ_BLOCK - 1) / DQ_BLOCK, nblk = (T + FOX_ACP_BLOCK - 1) / FOX_ACP_BLOCK;
    const int bh = blockIdx.x / nrb, t0 = blockIdx.x % nrb * DQ_BLOCK, n = min(DQ_BLOCK, T - t0);
    const int *qlh = q_last ? q_last + (size_t)bh * nblk : nullptr;
    const size_t base4 = ((size_t)bh * dq_acc_rows(T) + t0) * DH / 4;
    bool live[BWD_CHAINS];  // the block's rows lie in one ACP row
#pragma unroll
    for (int c = 0; c < BWD_CHAINS; c++) live[c] = c < chains && bwd_chain_live(c, chains, nblk, t0 / FOX_ACP_BLOCK, qlh);
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const int j = threadIdx.x + k * DQ_CONVERT_THREADS, o = j * 4;  // o: ((slice, c / 8, half) 32 + lane) 2
        const int lane = o / 2 % 32, q = o / 64, half = q % 2, cg = q / 2 % (DH / 8), slice = q / 2 / (DH / 8);
        const int r = slice * 16 + half * 8 + lane / 4;
        float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int c = 0; c < BWD_CHAINS; c++) {
            if (!live[c]) continue;
            const float4 a = acc[c * stride4 + base4 + j];
            x.x = __fadd_rn(x.x, a.x), x.y = __fadd_rn(x.y, a.y), x.z = __fadd_rn(x.z, a.z), x.w = __fadd_rn(x.w, a.w);
        }
        if (r < n) {
            uint2 out;
            out.x = pack_bf16(x.x * scale, x.y * scale);
            out.y = pack_bf16(x.z * scale, x.w * scale);
            *reinterpret_cast<uint2 *>(rows + r * DH + cg * 8 + lane % 4 * 2) = out;
        }
    }
    __syncthreads();
    uint4 *dst = reinterpret_cast<uint4 *>(dq + ((size_t)bh * T + t0) * DH);
    const uint4 *src = reinterpret_cast<const uint4 *>(rows);
    for (int i = threadIdx.x; i < n * DH / 8; i += DQ_CONVERT_THREADS) dst[i] = src[i];
    if (chains > 1)
        for (int i = threadIdx.x; i < n; i += DQ_CONVERT_THREADS) {
            const size_t v = (size_t)bh * T + t0 + i;
            float x = dc[v];
            for (int c = 1; c < chains; c++) x += dc_chains[(c - 1) * nvec + v];
            dc[v] = x;
        }
}

// Step 3: dq = scale · the accumulators' sum, in bf16; dc = the chains' row sums (p: step 2's bwd_sums).
inline void bwd_dq(const BwdSums &p, float *dc, __nv_bfloat16 *dq, int B, int H, int T, int dh, cudaStream_t s) {
    const size_t n4 = bwd_dq_acc_count(B, H, T, dh) / 4, nvec = (size_t)B * H * T;
    const unsigned grid = (unsigned)((size_t)B * H * ((T + DQ_BLOCK - 1) / DQ_BLOCK));
    const float4 *acc = reinterpret_cast<const float4 *>(p.dq_acc);
    const float scale = 1.f / sqrtf((float)dh);
    if (dh == 64)
        dq_convert_kernel<64><<<grid, DQ_CONVERT_THREADS, 0, s>>>(acc, n4, p.chains, p.q_last, dq, scale, T, dc, p.dc_chains, nvec);
    else
        dq_convert_kernel<128><<<grid, DQ_CONVERT_THREADS, 0, s>>>(acc, n4, p.chains, p.q_last, dq, scale, T, dc, p.dc_chains,
                                                                   nvec);
    FOX_LAUNCH_CHECK();
}

}  // namespace fox_attn

#endif  // FOX_ATTENTION_PASSES_CUH
