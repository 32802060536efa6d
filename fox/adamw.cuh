// fox/adamw.cuh: the optimizer step's kernels: Σ g² of the gradients (a fixed-order sum; the host takes its root
// and the clip factor), AdamW over every learned tensor of this rank's shard in one launch, and the bf16 copy of
// the weights the GEMMs read.
// Measurements and the variants tried: dev/cuda/NOTES.md, section "Index: the notes of each product kernel".
#ifndef FOX_ADAMW_CUH
#define FOX_ADAMW_CUH

#include <stdint.h>         // uint32_t
#include "cuda_common.cuh"  // FOX_LAUNCH_CHECK, bf16, fox_blocks, warp_sum

// Σ g² of an fp32 vector: a fixed grid of SUMSQ_BLOCKS blocks, each a fixed element set and a fixed
// tree, then one thread adds the block partials in order (in double). Deterministic.
#define SUMSQ_BLOCKS 1024
#define SUMSQ_THREADS 256

__global__ void sumsq_partial_kernel(float *part, const float *g, size_t n) {
    __shared__ float s[SUMSQ_THREADS / 32];
    float acc = 0.0f;
    for (size_t i = (size_t)blockIdx.x * SUMSQ_THREADS + threadIdx.x; i < n; i += (size_t)SUMSQ_BLOCKS * SUMSQ_THREADS)
        acc += g[i] * g[i];
    acc = warp_sum(acc);
    if (threadIdx.x % 32 == 0) s[threadIdx.x / 32] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.0f;
        for (int w = 0; w < SUMSQ_THREADS / 32; w++) t += s[w];
        part[blockIdx.x] = t;
    }
}

__global__ void sumsq_final_kernel(double *out, const float *part) {
    double t = 0.0;
    for (int i = 0; i < SUMSQ_BLOCKS; i++) t += part[i];
    *out = t;
}

// AdamW (torch semantics, the CPU trainer's arithmetic in double) over every learned tensor of the flat
// parameter vector in one launch: g ·= clip scale, m, v moments, decoupled decay, update, and the bf16
// copy of a GEMM weight with `pad` zero elements after each layer's `layer_numel` (its rows padded; the padding
// stays zero).
typedef struct {
    double lr, beta1, beta2, eps, bc1, bc2;
    float gscale;  // 1, or the clip factor
} AdamStep;

// The tensors of one launch: flat elements [lo[t], hi[t]) of tensor t (ascending, disjoint; the part of a
// learned tensor in this rank's shard), its first element `first`, decoupled decay factor, and bf16 copy
// (NULL: none) with layer_numel elements and pad padding elements per layer.
#define ADAMW_MAX_TENSORS 16
typedef struct {
    int n;
    size_t lo[ADAMW_MAX_TENSORS], hi[ADAMW_MAX_TENSORS], first[ADAMW_MAX_TENSORS];
    size_t layer_numel[ADAMW_MAX_TENSORS], pad[ADAMW_MAX_TENSORS];
    double decay[ADAMW_MAX_TENSORS];
    bf16 *wbf[ADAMW_MAX_TENSORS];
} AdamTensors;

// One element's update: m, v in place; returns the new weight. CPU: adamw_update.
__device__ __forceinline__ float adamw_element(float w, float g, float *m, float *v, double decay, const AdamStep &a) {
    if (a.gscale != 1.0f) g *= a.gscale;
    float mn = (float)(a.beta1 * *m + (1.0 - a.beta1) * g), vn = (float)(a.beta2 * *v + (1.0 - a.beta2) * g * g);
    *m = mn;
    *v = vn;
    double mhat = mn / a.bc1, vhat = vn / a.bc2;
    return (float)(w * (float)decay - a.lr * mhat / (sqrt(vhat) + a.eps));
}

// Thread i takes flat elements lo + 4i .. lo + 4i + 3 (16-byte accesses; lo % 4 == 0) of [lo, hi); m and v
// hold elements [lo, hi). Elements of no tensor in T (a tensor that is not learned) keep their values.
// AdamW (docs/model.md §2).
__global__ void adamw_kernel(float *w, const float *grad, float *m, float *v, size_t lo, size_t hi,
                             const __grid_constant__ AdamTensors T, AdamStep a) {
    size_t f0 = lo + 4 * ((size_t)blockIdx.x * blockDim.x + threadIdx.x);
    if (f0 >= hi) return;
    const int full = f0 + 4 <= hi;
    float wv[4], gv[4], mv[4], vv[4];
    if (full) {
        float4 W = *(const float4 *)(w + f0), G = *(const float4 *)(grad + f0), M = *(const float4 *)(m + (f0 - lo)),
               V = *(const float4 *)(v + (f0 - lo));
        wv[0] = W.x, wv[1] = W.y, wv[2] = W.z, wv[3] = W.w;
        gv[0] = G.x, gv[1] = G.y, gv[2] = G.z, gv[3] = G.w;
        mv[0] = M.x, mv[1] = M.y, mv[2] = M.z, mv[3] = M.w;
        vv[0] = V.x, vv[1] = V.y, vv[2] = V.z, vv[3] = V.w;
    } else {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            bool in = f0 + e < hi;
            wv[e] = in ? w[f0 + e] : 0.0f;
            gv[e] = in ? grad[f0 + e] : 0.0f;
            mv[e] = in ? m[f0 + e - lo] : 0.0f;
            vv[e] = in ? v[f0 + e - lo] : 0.0f;
        }
    }
    int t = 0;
    while (t < T.n && f0 >= T.hi[t]) t++;
    size_t j0 = t < T.n ? f0 - T.first[t] : 0, layer = t < T.n && T.wbf[t] ? j0 / T.layer_numel[t] : 0;
    if (full && t < T.n && f0 >= T.lo[t] && f0 + 4 <= T.hi[t] && (!T.wbf[t] || (j0 + 4 <= (layer + 1) * T.layer_numel[t] &&
                                                                             (j0 + layer * T.pad[t]) % 4 == 0))) {
        // the common case: four elements of one tensor (and of one layer of its bf16 copy, 8-byte aligned)
#pragma unroll
        for (int e = 0; e < 4; e++) wv[e] = adamw_element(wv[e], gv[e], &mv[e], &vv[e], T.decay[t], a);
        if (T.wbf[t]) {
            __nv_bfloat162 lo2 = __floats2bfloat162_rn(wv[0], wv[1]), hi2 = __floats2bfloat162_rn(wv[2], wv[3]);
            uint2 u;
            u.x = *(uint32_t *)&lo2;
            u.y = *(uint32_t *)&hi2;
            *(uint2 *)(T.wbf[t] + j0 + layer * T.pad[t]) = u;
        }
    } else {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            size_t f = f0 + e;
            if (f >= hi) break;
            while (t < T.n && f >= T.hi[t]) t++;
            if (t == T.n || f < T.lo[t]) continue;
            wv[e] = adamw_element(wv[e], gv[e], &mv[e], &vv[e], T.decay[t], a);
            if (T.wbf[t]) {
                size_t j = f - T.first[t];
                T.wbf[t][j + j / T.layer_numel[t] * T.pad[t]] = __float2bfloat16(wv[e]);
            }
        }
    }
    if (full) {
        *(float4 *)(w + f0) = make_float4(wv[0], wv[1], wv[2], wv[3]);
        *(float4 *)(m + (f0 - lo)) = make_float4(mv[0], mv[1], mv[2], mv[3]);
        *(float4 *)(v + (f0 - lo)) = make_float4(vv[0], vv[1], vv[2], vv[3]);
    } else {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            if (f0 + e >= hi) break;
            w[f0 + e] = wv[e];
            m[f0 + e - lo] = mv[e];
            v[f0 + e - lo] = vv[e];
        }
    }
}

static inline void fox_adamw(float *w, const float *grad, float *m, float *v, size_t lo, size_t hi, const AdamTensors &T,
                             const AdamStep &a, cudaStream_t s) {
    if (hi <= lo || !T.n) return;
    adamw_kernel<<<fox_blocks((hi - lo + 3) / 4, 256), 256, 0, s>>>(w, grad, m, v, lo, hi, T, a);
    FOX_LAUNCH_CHECK();
}

// The bf16 copy of one tensor from its fp32 master (after init or a checkpoint load).
__global__ void to_bf16_padded_kernel(bf16 *wbf, const float *w, size_t n, size_t layer_numel, size_t pad_per_layer) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    wbf[i + (i / layer_numel) * pad_per_layer] = __float2bfloat16(w[i]);
}

#endif  // FOX_ADAMW_CUH
