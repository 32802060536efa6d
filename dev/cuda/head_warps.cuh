// dev/cuda/head_warps.cuh: the warp form of the per-head kernels, which the earlier versions in attn_inputs.cu
// and output_gate.cu keep (fox/kernels.cuh's kernels walk rows in HeadWalk's walkers since sessions 22-24): a
// warp a token at a time on the (head, HEAD_BLOCK_ROWS tokens) grid, lane l holding elements l + 32e of the head.
#ifndef FOX_DEV_HEAD_WARPS_CUH
#define FOX_DEV_HEAD_WARPS_CUH

#include "../../fox/kernels.cuh"

// Launches a kernel of the (head, HEAD_BLOCK_ROWS tokens) grid templated on PER_LANE = dh/32. The head is
// blockIdx.x so that the blocks running at once cover whole rows (DRAM locality).
#define LAUNCH_HEAD_BLOCKS(kernel, dh, N, H, stream, ...)                                                               \
    do {                                                                                                                \
        dim3 grid_ = head_grid(N, H);                                                                                   \
        if ((dh) == 64) kernel<2><<<grid_, FOX_WARPS * 32, 0, stream>>>(__VA_ARGS__);                                   \
        else kernel<4><<<grid_, FOX_WARPS * 32, 0, stream>>>(__VA_ARGS__);                                              \
        FOX_LAUNCH_CHECK();                                                                                             \
    } while (0)

// In the (head, HEAD_BLOCK_ROWS tokens) kernels a lane owns elements lane + 32e (e < PER_LANE) of head
// h = blockIdx.x in every token its warp visits; this adds the warps' per-lane sums acc in warp order
// into part[blockIdx.y, h·dh + lane + 32e], i.e. a (head_blocks(N), H·dh) matrix of block partials.
// Every thread of the block must call it.
template <int PER_LANE>
__device__ __forceinline__ void head_partials_store(float *part, const float acc[PER_LANE], int dh) {
    __shared__ float red[FOX_WARPS][PER_LANE * 32];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();  // a previous call's reads of red are done
#pragma unroll
    for (int e = 0; e < PER_LANE; e++) red[warp][lane + 32 * e] = acc[e];
    __syncthreads();
    if (warp == 0) {
#pragma unroll
        for (int e = 0; e < PER_LANE; e++) {
            float t = 0.0f;
            for (int w = 0; w < FOX_WARPS; w++) t += red[w][lane + 32 * e];
            part[((size_t)blockIdx.y * gridDim.x + blockIdx.x) * dh + lane + 32 * e] = t;
        }
    }
}

#endif  // FOX_DEV_HEAD_WARPS_CUH
