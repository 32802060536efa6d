// fox/cuda_common.cuh: what every CUDA file of fox.c shares: the checked CUDA call, the bf16 type, the
// launch-size helper, the device's SM count, the warp reductions and the sigmoids. Included by each .cuh that
// needs them.
#ifndef FOX_CUDA_COMMON_CUH
#define FOX_CUDA_COMMON_CUH

#include <stdio.h>
#include <stdlib.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>

typedef __nv_bfloat16 bf16;

// Every CUDA runtime call is checked: an error prints where and what, and the process exits with 1.
#define FOX_CUDA_CHECK(call) fox_cuda_check((call), #call, __FILE__, __LINE__)
static inline void fox_cuda_check(cudaError_t err, const char *what, const char *file, int line) {
    if (err != cudaSuccess) {
        fprintf(stderr, "CUDA error at %s:%d: %s: %s\n", file, line, what, cudaGetErrorString(err));
        exit(EXIT_FAILURE);
    }
}
// After a kernel launch: the launch's own error (bad configuration, too much shared memory).
#define FOX_LAUNCH_CHECK() FOX_CUDA_CHECK(cudaGetLastError())

// Blocks of `threads` threads that cover n items.
static inline unsigned fox_blocks(size_t n, int threads) { return (unsigned)((n + threads - 1) / threads); }

// The current device's SM count (queried once: a process drives one GPU).
static inline int fox_sm_count() {
    static int sms = 0;
    if (!sms) {
        int dev = 0;
        FOX_CUDA_CHECK(cudaGetDevice(&dev));
        FOX_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    }
    return sms;
}

// G independent sums over each group of L lanes (L a power of 2 up to 32: a warp, or its aligned L-lane parts,
// each summing its own values) at once: each value's adds in the same butterfly order, so the same bits as one at
// a time, their shuffles interleaved rather than one chain after another. A group's shuffles name its own lanes
// alone (group_mask), so groups of one warp may take different paths.
template <int L>
__device__ __forceinline__ unsigned group_mask() {
    static_assert(L >= 2 && L <= 32 && (L & (L - 1)) == 0, "a group is a power-of-2 part of a warp");
    return L == 32 ? 0xffffffffu : ((1u << (L % 32)) - 1u) << (threadIdx.x % 32 / L * L);
}

template <int G, int L>
__device__ __forceinline__ void group_sums(float x[G]) {
    const unsigned mask = group_mask<L>();
#pragma unroll
    for (int off = L / 2; off > 0; off >>= 1)
#pragma unroll
        for (int g = 0; g < G; g++) x[g] += __shfl_xor_sync(mask, x[g], off);
}

template <int G>
__device__ __forceinline__ void warp_sums(float x[G]) { group_sums<G, 32>(x); }

__device__ __forceinline__ float warp_sum(float x) {
    warp_sums<1>(&x);
    return x;
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
    return x;
}

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }
// log σ(x) without overflow.
__device__ __forceinline__ float logsigmoidf_(float x) { return fminf(x, 0.0f) - log1pf(expf(-fabsf(x))); }

#endif  // FOX_CUDA_COMMON_CUH
