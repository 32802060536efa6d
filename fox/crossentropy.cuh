// fox/crossentropy.cuh: the cross entropy over bf16 logits: per-position losses and, in place, dlogits, a block a
// row, the row staged in shared memory where it fits (one read of the logits), else read again for the gradient;
// the logits are never materialised in fp32.
// Measurements and the variants tried: dev/cuda/NOTES.md, section "Index: the notes of each product kernel".
#ifndef FOX_CROSSENTROPY_CUH
#define FOX_CROSSENTROPY_CUH

#include "cuda_common.cuh"  // FOX_CUDA_CHECK, FOX_LAUNCH_CHECK, bf16, warp_sum, warp_max

// Cross entropy over bf16 logits (rows, VP) of which the first V columns are real (the padded
// vocabulary rows of the lm_head copy are zero and are masked here), forward and backward in one pass:
// one block per row takes the row's log-sum-exp (an online max/sum per thread over its strided elements,
// then a fixed-order block combine), the loss lse − z_target and, with grad, dlogits =
// (softmax − onehot)·scale written over the logits in place as bf16. The row is staged in shared memory
// with 16-byte loads when it fits (ce_stage_bytes), so HBM sees one read and one write of it; else the
// backward part reads it again. No fp32 logits or probabilities are stored.
#define CE_THREADS 512

__device__ void block_lse(float *out_lse, const bf16 *z, int V) {
    __shared__ float sm[CE_THREADS / 32], ss[CE_THREADS / 32];
    float m = -INFINITY, s = 0.0f;
    for (int i = threadIdx.x; i < V; i += CE_THREADS) {
        float x = __bfloat162float(z[i]);
        if (x > m) { s *= expf(m - x); m = x; }
        s += expf(x - m);
    }
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    float wm = warp_max(m);
    s = warp_sum(m == -INFINITY ? 0.0f : s * expf(m - wm));
    if (lane == 0) { sm[warp] = wm; ss[warp] = s; }
    __syncthreads();
    if (threadIdx.x == 0) {
        float M = -INFINITY, S = 0.0f;
        for (int w = 0; w < CE_THREADS / 32; w++) M = fmaxf(M, sm[w]);
        for (int w = 0; w < CE_THREADS / 32; w++) S += ss[w] * expf(sm[w] - M);
        *out_lse = M + logf(S);
    }
}

// Per-position cross entropy of the next token (docs/model.md §2) and its gradient; a negative target
// counts for nothing (loss 0, dlogits 0). losses NULL: the loss is not stored. staged: the row goes
// through dynamic shared memory (VP bf16). CPU: crossentropy_forward,
// crossentropy_backward.
__global__ void __launch_bounds__(CE_THREADS) crossentropy_kernel(float *losses, bf16 *logits, const int *targets, int V,
                                                                 int VP, float scale, int grad, int staged) {
    extern __shared__ uint4 ce_row[];  // (VP / 8) when staged
    __shared__ float lse;
    bf16 *z = logits + (size_t)blockIdx.x * VP;
    const int tg = targets[blockIdx.x], nv = VP / 8;
    if (tg < 0) {  // not counted (--mqar-loss): no loss, no gradient
        if (threadIdx.x == 0 && losses) losses[blockIdx.x] = 0.0f;
        for (int i = threadIdx.x; grad && i < nv; i += CE_THREADS) ((uint4 *)z)[i] = make_uint4(0, 0, 0, 0);
        return;
    }
    const float zt = __bfloat162float(z[tg]);  // read before any thread writes dlogits over the row
    const uint4 *src = (const uint4 *)z;
    if (staged) {
        for (int i = threadIdx.x; i < nv; i += CE_THREADS) ce_row[i] = src[i];
        __syncthreads();
        src = ce_row;
    }
    block_lse(&lse, (const bf16 *)src, V);
    __syncthreads();
    const float l = lse;
    if (threadIdx.x == 0 && losses) losses[blockIdx.x] = l - zt;
    if (!grad) return;
    for (int i = threadIdx.x; i < nv; i += CE_THREADS) {
        uint4 u = src[i];
        bf16 *e = (bf16 *)&u;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            int col = 8 * i + k;
            float p = col < V ? expf(__bfloat162float(e[k]) - l) : 0.0f;
            e[k] = __float2bfloat16((p - (col == tg ? 1.0f : 0.0f)) * scale);
        }
        ((uint4 *)z)[i] = u;
    }
}

// Shared memory that stages a row of VP logits (VP % 8 == 0), or 0 when the row does not fit beside
// block_lse's own.
static inline size_t ce_stage_bytes(int VP) {
    int dev, optin;
    FOX_CUDA_CHECK(cudaGetDevice(&dev));
    FOX_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    size_t bytes = (size_t)VP * sizeof(bf16);
    return bytes + 1024 <= (size_t)optin ? bytes : 0;
}

// The loss of `rows` rows of logits (losses NULL: not stored) and, with grad, dlogits·scale in place.
static inline void fox_crossentropy(float *losses, bf16 *logits, const int *targets, int rows, int V, int VP, float scale,
                                    int grad, cudaStream_t s) {
    size_t smem = ce_stage_bytes(VP);
    if (smem)
        FOX_CUDA_CHECK(cudaFuncSetAttribute(crossentropy_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    crossentropy_kernel<<<rows, CE_THREADS, smem, s>>>(losses, logits, targets, V, VP, scale, grad, smem > 0);
    FOX_LAUNCH_CHECK();
}

#endif  // FOX_CROSSENTROPY_CUH
