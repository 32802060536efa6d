// fox/rmsnorm.cuh: the RMSNorm of the residual stream (each block's two pre-norms and the final norm), forward
// and backward (the backward also writes the forward's output again where it was not kept, and adds the weight's
// gradient: block partials, then fixed-order column sums).
// Measurements and the variants tried: dev/cuda/NOTES.md, section "Index: the notes of each product kernel".
#ifndef FOX_RMSNORM_CUH
#define FOX_RMSNORM_CUH

#include "cuda_common.cuh"  // FOX_CUDA_CHECK, FOX_LAUNCH_CHECK, bf16, warp_sum, warp_sums
#include "config.h"         // FOX_NORM_EPS
#include "rows.cuh"         // FOX_WARPS, warp_index, warp_blocks, norm_blocks, colsum_accumulate, load_w4, store_bf16x4

// RMSNorm of the residual stream (one warp per row, float4 accesses: D % 4 == 0): fp32 in, bf16 out
// (a GEMM operand).

// A lane's part of Σ x² and the row's rstd from the lanes' parts: the forward and the backward (which rewrites
// the forward's output) take them from here, so their rstd agree bitwise.
__device__ __forceinline__ float sumsq4(float4 a) { return a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w; }

// rstd from the row's Σ x² (the lanes' parts summed).
__device__ __forceinline__ float rstd_from_sum(float ss, int D, float eps) { return 1.0f / sqrtf(ss / D + eps); }

__device__ __forceinline__ float rstd_of(float ss, int D, float eps) { return rstd_from_sum(warp_sum(ss), D, eps); }

// The backward's rstd and mean(dy⊙w⊙x̂) from a lane's parts of Σ x² and Σ dy·w·x, their warp sums interleaved.
__device__ __forceinline__ void rms_bwd_stats(float &rs, float &dot, float ss, float gwx, int D, float eps) {
    float t[2] = {ss, gwx};
    warp_sums<2>(t);
    rs = rstd_from_sum(t[0], D, eps);
    dot = rs * t[1] / D;
}

__device__ __forceinline__ float row_rstd(const float4 *x, int D4, int lane, float eps) {
    float ss = 0.0f;
    for (int i = lane; i < D4; i += 32) ss += sumsq4(x[i]);
    return rstd_of(ss, 4 * D4, eps);
}

// A lane holds float4s lane, lane + 32, ... of its row. With RV > 0 (D/4 <= 32·RV) the kernels below keep them
// in registers between their two passes over the row, so it is read once; RV = 0 (any D) reads it again. Both
// add in the same order, so their results are the same bits.
#define RMS_MAX_RV 12

static inline int rms_rv(int D) {
    int need = (D / 4 + 31) / 32;
    return need <= 2 ? 2 : need <= 4 ? 4 : need <= 8 ? 8 : need <= RMS_MAX_RV ? RMS_MAX_RV : 0;
}

// Float4 i of a normed row: x̂·w as bf16.
__device__ __forceinline__ void rms_out4(bf16 *out, float4 a, float rs, const float *w, int i) {
    float4 g = load_w4(w, i);
    store_bf16x4(out + 4 * i, a.x * rs * g.x, a.y * rs * g.y, a.z * rs * g.z, a.w * rs * g.w);
}

// Paper: the pre-norm RMSNorm of each block and the final norm (docs/model.md §1). CPU: rmsnorm_forward.
template <int RV>
__global__ void rmsnorm_forward_kernel(bf16 *__restrict__ out, const float *__restrict__ in, const float *__restrict__ w,
                                       int N, int D, float eps) {
    size_t row = warp_index();
    int lane = threadIdx.x % 32, D4 = D / 4;
    if (row >= (size_t)N) return;
    const float4 *x = (const float4 *)(in + row * D);
    bf16 *o = out + row * D;
    if constexpr (RV == 0) {
        float rs = row_rstd(x, D4, lane, eps);
        for (int i = lane; i < D4; i += 32) rms_out4(o, x[i], rs, w, i);
    } else {
        float4 a[RV];
        float ss = 0.0f;
#pragma unroll
        for (int k = 0; k < RV; k++)
            if (lane + 32 * k < D4) a[k] = x[lane + 32 * k];
#pragma unroll
        for (int k = 0; k < RV; k++)
            if (lane + 32 * k < D4) ss += sumsq4(a[k]);
        float rs = rstd_of(ss, 4 * D4, eps);
#pragma unroll
        for (int k = 0; k < RV; k++)
            if (lane + 32 * k < D4) rms_out4(o, a[k], rs, w, lane + 32 * k);
    }
}

// The backward's first pass over float4 i of a row: Σ x² and Σ dy·w·x.
__device__ __forceinline__ void rms_bwd_sums(float &ss, float &gwx, float4 a, float4 b, float4 c) {
    ss += sumsq4(a);
    gwx += b.x * c.x * a.x + b.y * c.y * a.y + b.z * c.z * a.z + b.w * c.w * a.w;
}

// The backward's second pass over float4 i of a row (x a, dy b): dres (+)= dx, dres_bf, xn (unless NULL) and the
// lane's dw partials acc.
__device__ __forceinline__ void rms_bwd_out(float4 *r, bf16 *dres_bf, bf16 *xn, float4 *acc, float4 a, float4 b,
                                            const float *w, int i, float rs, float dot, int accumulate) {
    float4 c = load_w4(w, i), o = accumulate ? r[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    o.x += rs * (b.x * c.x - a.x * rs * dot);
    o.y += rs * (b.y * c.y - a.y * rs * dot);
    o.z += rs * (b.z * c.z - a.z * rs * dot);
    o.w += rs * (b.w * c.w - a.w * rs * dot);
    r[i] = o;
    store_bf16x4(dres_bf + 4 * i, o.x, o.y, o.z, o.w);
    if (xn) store_bf16x4(xn + 4 * i, a.x * rs * c.x, a.y * rs * c.y, a.z * rs * c.z, a.w * rs * c.w);
    acc[i].x += b.x * a.x * rs;
    acc[i].y += b.y * a.y * rs;
    acc[i].z += b.z * a.z * rs;
    acc[i].w += b.w * a.w * rs;
}

// dx = rstd·(dy⊙w − x̂·mean(dy⊙w⊙x̂)) with rstd recomputed from x; dres = dx (+ dres when accumulate),
// also as bf16 (the next GEMM's operand). xn (NULL: not written): the forward's output RMSNorm(x)⊙w again,
// bitwise (sumsq4 and rstd_of, the same products), for the weight-gradient GEMM that follows, so the forward
// need not keep it per block. dw's block partials: each warp adds dy⊙x̂ of its rows into its own shared-memory
// row (a lane owns its columns), then the block adds its warps in order into part[blockIdx.x]. Dynamic shared
// memory: FOX_WARPS·D floats.
// CPU: rmsnorm_backward (and the ln weight's column sums).
template <int RV>
__global__ void __launch_bounds__(FOX_WARPS * 32, 2) rmsnorm_backward_kernel(float *__restrict__ dres, bf16 *__restrict__ dres_bf, bf16 *__restrict__ xn,
                                        float *__restrict__ part, const float *__restrict__ dy, const float *__restrict__ in,
                                        const float *__restrict__ w, int N, int D, float eps, int accumulate) {
    extern __shared__ float4 wsum[];  // (FOX_WARPS, D/4)
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, D4 = D / 4;
    float4 *acc = wsum + (size_t)warp * D4;
    for (int i = lane; i < D4; i += 32) acc[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    int r1 = min(N, (int)(blockIdx.x + 1) * NORM_BLOCK_ROWS);
    for (int row = blockIdx.x * NORM_BLOCK_ROWS + warp; row < r1; row += FOX_WARPS) {
        const float4 *x = (const float4 *)(in + (size_t)row * D), *g = (const float4 *)(dy + (size_t)row * D);
        float4 *r = (float4 *)(dres + (size_t)row * D);
        bf16 *rb = dres_bf + (size_t)row * D, *xr = xn ? xn + (size_t)row * D : NULL;
        float ss = 0.0f, gwx = 0.0f;
        if constexpr (RV == 0) {
            for (int i = lane; i < D4; i += 32) rms_bwd_sums(ss, gwx, x[i], g[i], load_w4(w, i));
            float rs, dot;
            rms_bwd_stats(rs, dot, ss, gwx, D, eps);
            for (int i = lane; i < D4; i += 32) rms_bwd_out(r, rb, xr, acc, x[i], g[i], w, i, rs, dot, accumulate);
        } else {
            float4 a[RV], b[RV];
#pragma unroll
            for (int k = 0; k < RV; k++)
                if (lane + 32 * k < D4) {
                    a[k] = x[lane + 32 * k];
                    b[k] = g[lane + 32 * k];
                }
#pragma unroll
            for (int k = 0; k < RV; k++)
                if (lane + 32 * k < D4) rms_bwd_sums(ss, gwx, a[k], b[k], load_w4(w, lane + 32 * k));
            float rs, dot;
            rms_bwd_stats(rs, dot, ss, gwx, D, eps);
#pragma unroll
            for (int k = 0; k < RV; k++)
                if (lane + 32 * k < D4) rms_bwd_out(r, rb, xr, acc, a[k], b[k], w, lane + 32 * k, rs, dot, accumulate);
        }
    }
    __syncthreads();
    const float *ws = (const float *)wsum;
    for (int c = threadIdx.x; c < D; c += blockDim.x) {
        float t = 0.0f;
        for (int k = 0; k < FOX_WARPS; k++) t += ws[(size_t)k * D + c];
        part[(size_t)blockIdx.x * D + c] = t;
    }
}

static inline void fox_rmsnorm_forward(bf16 *out, const float *in, const float *w, int N, int D, cudaStream_t s) {
    fox_check_width(D);
    unsigned grid = warp_blocks(N), threads = FOX_WARPS * 32;
    switch (rms_rv(D)) {
    case 2: rmsnorm_forward_kernel<2><<<grid, threads, 0, s>>>(out, in, w, N, D, FOX_NORM_EPS); break;
    case 4: rmsnorm_forward_kernel<4><<<grid, threads, 0, s>>>(out, in, w, N, D, FOX_NORM_EPS); break;
    case 8: rmsnorm_forward_kernel<8><<<grid, threads, 0, s>>>(out, in, w, N, D, FOX_NORM_EPS); break;
    case RMS_MAX_RV: rmsnorm_forward_kernel<RMS_MAX_RV><<<grid, threads, 0, s>>>(out, in, w, N, D, FOX_NORM_EPS); break;
    default: rmsnorm_forward_kernel<0><<<grid, threads, 0, s>>>(out, in, w, N, D, FOX_NORM_EPS);
    }
    FOX_LAUNCH_CHECK();
}

template <int RV>
static inline void rms_backward_launch(float *dres, bf16 *dres_bf, bf16 *xn, float *part, const float *dy, const float *in,
                                       const float *w, int N, int D, int accumulate, cudaStream_t s) {
    int smem = (int)((size_t)FOX_WARPS * D * sizeof(float));
    FOX_CUDA_CHECK(cudaFuncSetAttribute(rmsnorm_backward_kernel<RV>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    rmsnorm_backward_kernel<RV><<<norm_blocks(N), FOX_WARPS * 32, smem, s>>>(dres, dres_bf, xn, part, dy, in, w, N, D,
                                                                              FOX_NORM_EPS, accumulate);
    FOX_LAUNCH_CHECK();
}

// dres (+)= the RMSNorm backward of dy; dw += Σ_rows dy⊙x̂; xn (unless NULL) = the forward's output again.
// part: colsum_rows_floats(N, D) floats, part2: colsum_scratch_floats(norm_blocks(N), D).
static inline void fox_rmsnorm_backward(float *dres, bf16 *dres_bf, bf16 *xn, float *dw, const float *dy, const float *in,
                                        const float *w, int N, int D, int accumulate, float *part, float *part2,
                                        cudaStream_t s) {
    fox_check_width(D);
    switch (rms_rv(D)) {
    case 2: rms_backward_launch<2>(dres, dres_bf, xn, part, dy, in, w, N, D, accumulate, s); break;
    case 4: rms_backward_launch<4>(dres, dres_bf, xn, part, dy, in, w, N, D, accumulate, s); break;
    case 8: rms_backward_launch<8>(dres, dres_bf, xn, part, dy, in, w, N, D, accumulate, s); break;
    case RMS_MAX_RV: rms_backward_launch<RMS_MAX_RV>(dres, dres_bf, xn, part, dy, in, w, N, D, accumulate, s); break;
    default: rms_backward_launch<0>(dres, dres_bf, xn, part, dy, in, w, N, D, accumulate, s);
    }
    colsum_accumulate(dw, part, norm_blocks(N), D, D, part2, s);
}

#endif  // FOX_RMSNORM_CUH
