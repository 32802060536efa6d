// fox/output_gate.cuh: the attention's output norm and gate, z = RMSNorm_head(o) ⊙ σ(W_g x) (paper eq. 21 and
// 23), forward and backward (the backward also writes z again where the forward did not keep it).
// Measurements and the variants tried: dev/cuda/NOTES.md, section "Index: the notes of each product kernel".
#ifndef FOX_OUTPUT_GATE_CUH
#define FOX_OUTPUT_GATE_CUH

#include "cuda_common.cuh"  // bf16, warp_sums, sigmoidf_ (FOX_LAUNCH_CHECK in LAUNCH_HEAD_BLOCKS)
#include "config.h"         // FOX_NORM_EPS
#include "proj.cuh"         // Proj, proj_wide_row, proj_ld: the gate's columns of attn_in_w's output rows
#include "rows.cuh"         // LAUNCH_HEAD_BLOCKS, head_weights, head_sumsq, head_rstd_of, head_norm_backward_rs, head_partials_*

// Attention output: z = RMSNorm_head(o) ⊙ σ(g) (each part optional) on the (head, HEAD_BLOCK_ROWS tokens)
// grid, a warp a token at a time; o and z are (N, D) bf16, g read from proj's wide part at column cg (< 0: no
// gate); ow NULL: no norm.

// Two tokens' inputs of the output norm+gate kernels, rows nn and nn + FOX_WARPS (the second only when
// live[1]): o as x, the gate logits gl (0 without a gate), and each row's rstd rs (1 without the norm), the two
// reductions interleaved. The forward and the backward (which writes z again) take them from here, so their z
// agree bitwise.
template <int PER_LANE>
__device__ __forceinline__ void output_rows_load(float x[2][PER_LANE], float gl[2][PER_LANE], float rs[2], const int live[2],
                                                 const bf16 *o, const Proj &proj, int cg, const float *ow, int nn,
                                                 int D, int hc) {
#pragma unroll
    for (int g = 0; g < 2; g++) {
        size_t n = (size_t)(nn + g * FOX_WARPS);
#pragma unroll
        for (int e = 0; e < PER_LANE; e++) {
            x[g][e] = live[g] ? __bfloat162float(o[n * D + hc + 32 * e]) : 0.0f;
            gl[g][e] = live[g] && cg >= 0 ? __bfloat162float(proj_wide_row(proj, n)[cg + hc + 32 * e]) : 0.0f;
        }
        rs[g] = head_sumsq<PER_LANE>(x[g]);
    }
    if (ow) warp_sums<2>(rs);
#pragma unroll
    for (int g = 0; g < 2; g++) rs[g] = ow ? head_rstd_of<PER_LANE>(rs[g], FOX_NORM_EPS) : 1.0f;
}

// Paper eq. 21 and 23: z = RMSNorm(o) ⊙ σ(W_g x) (output norm and output gate, each optional). CPU:
// rmsnorm_forward (per head) and output_gate_forward in attention_block_forward.
template <int PER_LANE>
__global__ void output_forward_kernel(bf16 *z, const bf16 *o, const Proj proj, int cg, const float *ow, int N, int H) {
    constexpr int dh = 32 * PER_LANE;
    int lane = threadIdx.x % 32, h = blockIdx.x, hc = h * dh + lane, D = H * dh;
    int n1 = min(N, (int)(blockIdx.y + 1) * HEAD_BLOCK_ROWS);
    float w[PER_LANE] = {};
    if (ow) head_weights<PER_LANE>(w, ow + h * dh, lane);
    // two rows at a time (n and n + FOX_WARPS), their norms' reductions interleaved (warp_sums)
    for (int nn = blockIdx.y * HEAD_BLOCK_ROWS + threadIdx.x / 32; nn < n1; nn += 2 * FOX_WARPS) {
        int live[2] = {1, nn + FOX_WARPS < n1};
        float x[2][PER_LANE], gl[2][PER_LANE], rs[2];
        output_rows_load<PER_LANE>(x, gl, rs, live, o, proj, cg, ow, nn, D, hc);
#pragma unroll
        for (int g = 0; g < 2; g++) {
            if (!live[g]) continue;
            size_t n = (size_t)(nn + g * FOX_WARPS);
#pragma unroll
            for (int e = 0; e < PER_LANE; e++) {
                float y = ow ? x[g][e] * rs[g] * w[e] : x[g][e];
                if (cg >= 0) y *= sigmoidf_(gl[g][e]);
                z[n * D + hc + 32 * e] = __float2bfloat16(y);
            }
        }
    }
}

static inline void fox_output_forward(bf16 *z, const bf16 *o, const Proj &proj, int cg, const float *ow, int N, int H,
                                      int dh, cudaStream_t s) {
    LAUNCH_HEAD_BLOCKS(output_forward_kernel, dh, N, H, s, z, o, proj, cg, ow, N, H);
}

// Backward of the above: dz (N, D) fp32 → d_o (N, D) bf16 (the attention's dO), the gate's dproj
// columns, and with the norm the block partials of its weight gradient Σ d(on)⊙ô (head_partials_store).
// z: the forward's output again, bitwise (head_sumsq, head_rstd_of: the same products), for the attn_out
// weight-gradient GEMM that follows, so the forward need not keep it per block (NULL where it did). Grid:
// (head, token block); a warp takes two tokens at a time (n and n + FOX_WARPS), their norms' reductions
// interleaved (warp_sums).
// Backward of eq. 21 and 23. CPU: output_gate_backward, rmsnorm_backward (per head).
template <int PER_LANE>
__global__ void output_backward_kernel(bf16 *d_o, bf16 *dproj, bf16 *z, float *part, const float *dz, const bf16 *o,
                                       const Proj proj, int cg, const float *ow, int N, int H) {
    constexpr int dh = 32 * PER_LANE;
    int lane = threadIdx.x % 32, h = blockIdx.x, hc = h * dh + lane, D = H * dh;
    int n1 = min(N, (int)(blockIdx.y + 1) * HEAD_BLOCK_ROWS);
    float acc[PER_LANE] = {}, w[PER_LANE] = {};
    if (ow) head_weights<PER_LANE>(w, ow + h * dh, lane);
    for (int nn = blockIdx.y * HEAD_BLOCK_ROWS + threadIdx.x / 32; nn < n1; nn += 2 * FOX_WARPS) {
        int live[2] = {1, nn + FOX_WARPS < n1};
        float x[2][PER_LANE], gy[2][PER_LANE], gl[2][PER_LANE], rs[2];  // o, dz and the gate logits
#pragma unroll
        for (int g = 0; g < 2; g++)
#pragma unroll
            for (int e = 0; e < PER_LANE; e++) gy[g][e] = live[g] ? dz[(size_t)(nn + g * FOX_WARPS) * D + hc + 32 * e] : 0.0f;
        output_rows_load<PER_LANE>(x, gl, rs, live, o, proj, cg, ow, nn, D, hc);
        float don[2][PER_LANE], wr[2][PER_LANE], dx[2][PER_LANE], prod[2][PER_LANE];
#pragma unroll
        for (int g = 0; g < 2; g++) {
            size_t n = (size_t)(nn + g * FOX_WARPS);
#pragma unroll
            for (int e = 0; e < PER_LANE; e++) {
                float gv = gy[g][e], on = ow ? x[g][e] * rs[g] * w[e] : x[g][e], y = on;
                if (cg >= 0) {
                    float sg = sigmoidf_(gl[g][e]);
                    if (live[g]) dproj[n * proj_ld(proj) + cg + hc + 32 * e] = __float2bfloat16(gv * on * sg * (1.0f - sg));
                    gv *= sg;
                    y *= sg;
                }
                if (live[g] && z) z[n * D + hc + 32 * e] = __float2bfloat16(y);
                don[g][e] = gv;
                wr[g][e] = w[e];
            }
        }
        if (ow) head_norm_backward_rs<PER_LANE, 2>(dx, prod, x, don, wr, rs);
#pragma unroll
        for (int g = 0; g < 2; g++) {
            if (!live[g]) continue;
            size_t n = (size_t)(nn + g * FOX_WARPS);
#pragma unroll
            for (int e = 0; e < PER_LANE; e++) {
                d_o[n * D + hc + 32 * e] = __float2bfloat16(ow ? dx[g][e] : don[g][e]);
                if (ow) acc[e] += prod[g][e];
            }
        }
    }
    if (ow) head_partials_store<PER_LANE>(part, acc, dh);
}

// The output norm+gate backward, z again, and with the norm dow += its weight gradient. part:
// colsum_rows_floats(N, D) floats, part2: colsum_scratch_floats(head_blocks(N), D).
static inline void fox_output_backward(bf16 *d_o, bf16 *dproj, bf16 *z, float *dow, const float *dz, const bf16 *o,
                                       const Proj &proj, int cg, const float *ow, int N, int H, int dh, float *part,
                                       float *part2, cudaStream_t s) {
    LAUNCH_HEAD_BLOCKS(output_backward_kernel, dh, N, H, s, d_o, dproj, z, part, dz, o, proj, cg, ow, N, H);
    if (ow) head_partials_accumulate(dow, part, N, H, dh, 0, part2, s);
}

#endif  // FOX_OUTPUT_GATE_CUH
