// fox/swiglu.cuh: the MLP's SwiGLU, h = silu(a) ⊙ b, forward and backward (the backward also writes h again
// where the forward did not keep it).
// Measurements and the variants tried: dev/cuda/NOTES.md, section "Index: the notes of each product kernel".
#ifndef FOX_SWIGLU_CUH
#define FOX_SWIGLU_CUH

#include "cuda_common.cuh"  // FOX_LAUNCH_CHECK, bf16, fox_blocks, sigmoidf_

// SwiGLU: h = silu(a) ⊙ b, u = [a | b] (N, 2I) bf16. A thread takes SWIGLU_VEC consecutive hidden
// units of one row: 16-byte loads and stores when I % SWIGLU_VEC == 0, else element by element.
#define SWIGLU_VEC 8

typedef struct { bf16 x[SWIGLU_VEC]; } Bf16Vec;

__device__ __forceinline__ Bf16Vec load_bf16_vec(const bf16 *p, int n, int vec) {
    Bf16Vec r;
    if (vec) *(uint4 *)r.x = *(const uint4 *)p;
    else
        for (int k = 0; k < SWIGLU_VEC; k++) r.x[k] = k < n ? p[k] : __float2bfloat16(0.0f);
    return r;
}

__device__ __forceinline__ void store_bf16_vec(bf16 *p, const Bf16Vec &r, int n, int vec) {
    if (vec) *(uint4 *)p = *(const uint4 *)r.x;
    else
        for (int k = 0; k < n; k++) p[k] = r.x[k];
}

// Row n and first unit j of thread i, and how many units (< SWIGLU_VEC only at a row's end).
__device__ __forceinline__ int swiglu_slot(size_t i, int I, size_t *n, int *j) {
    int per_row = (I + SWIGLU_VEC - 1) / SWIGLU_VEC;
    *n = i / per_row;
    *j = (int)(i % per_row) * SWIGLU_VEC;
    return min(SWIGLU_VEC, I - *j);
}

__host__ __device__ static inline size_t swiglu_threads(int N, int I) { return (size_t)N * ((I + SWIGLU_VEC - 1) / SWIGLU_VEC); }

// SwiGLU: h = silu(gate) ⊙ up (docs/model.md §1.2). CPU: swiglu_forward.
__global__ void swiglu_forward_kernel(bf16 *hout, const bf16 *u, int N, int I) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, n;
    if (i >= swiglu_threads(N, I)) return;
    int j, cnt = swiglu_slot(i, I, &n, &j), vec = I % SWIGLU_VEC == 0;
    Bf16Vec a = load_bf16_vec(u + n * 2 * I + j, cnt, vec), b = load_bf16_vec(u + n * 2 * I + I + j, cnt, vec), h;
#pragma unroll
    for (int k = 0; k < SWIGLU_VEC; k++) {
        float x = __bfloat162float(a.x[k]);
        h.x[k] = __float2bfloat16(x * sigmoidf_(x) * __bfloat162float(b.x[k]));
    }
    store_bf16_vec(hout + n * I + j, h, cnt, vec);
}

// du from dh (bf16, as the official code's autocast gives it), and h = silu(a) ⊙ b again, bitwise (the
// forward's products), for the mlp_out weight-gradient GEMM that follows, so the forward need not keep it
// per block (hout NULL where it did). CPU: swiglu_backward.
__global__ void swiglu_backward_kernel(bf16 *du, bf16 *hout, const bf16 *dh, const bf16 *u, int N, int I) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, n;
    if (i >= swiglu_threads(N, I)) return;
    int j, cnt = swiglu_slot(i, I, &n, &j), vec = I % SWIGLU_VEC == 0;
    Bf16Vec a = load_bf16_vec(u + n * 2 * I + j, cnt, vec), b = load_bf16_vec(u + n * 2 * I + I + j, cnt, vec), da, db, h;
    Bf16Vec gv = load_bf16_vec(dh + n * I + j, cnt, vec);
#pragma unroll
    for (int k = 0; k < SWIGLU_VEC; k++) {
        float x = __bfloat162float(a.x[k]), y = __bfloat162float(b.x[k]), sg = sigmoidf_(x), g = __bfloat162float(gv.x[k]);
        da.x[k] = __float2bfloat16(g * y * sg * (1.0f + x * (1.0f - sg)));
        db.x[k] = __float2bfloat16(g * x * sg);
        h.x[k] = __float2bfloat16(x * sg * y);
    }
    store_bf16_vec(du + n * 2 * I + j, da, cnt, vec);
    store_bf16_vec(du + n * 2 * I + I + j, db, cnt, vec);
    if (hout) store_bf16_vec(hout + n * I + j, h, cnt, vec);
}

static inline void fox_swiglu_forward(bf16 *hout, const bf16 *u, int N, int I, cudaStream_t s) {
    swiglu_forward_kernel<<<fox_blocks(swiglu_threads(N, I), 256), 256, 0, s>>>(hout, u, N, I);
    FOX_LAUNCH_CHECK();
}

static inline void fox_swiglu_backward(bf16 *du, bf16 *hout, const bf16 *dh, const bf16 *u, int N, int I, cudaStream_t s) {
    swiglu_backward_kernel<<<fox_blocks(swiglu_threads(N, I), 256), 256, 0, s>>>(du, hout, dh, u, N, I);
    FOX_LAUNCH_CHECK();
}

#endif  // FOX_SWIGLU_CUH
