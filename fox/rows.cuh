// fox/rows.cuh: how the row-wise kernels of fox.c divide their work, and what they share: a warp a row
// (FOX_WARPS warps a block) or a (head, HEAD_BLOCK_ROWS tokens) block, deterministic column sums (the norm
// weights' and biases' gradients: fixed-order block partials, never atomics), vector loads and stores of a row,
// and the per-head RMSNorm pieces. Math is fp32; every reduction runs in a fixed order, so a step is bitwise
// reproducible.
#ifndef FOX_ROWS_CUH
#define FOX_ROWS_CUH

#include <stdint.h>         // uint32_t
#include "cuda_common.cuh"  // FOX_LAUNCH_CHECK, bf16, fox_blocks, group_sums

// ----------------------------------------------------------------------------
// How rows are divided: a warp a row (FOX_WARPS warps a block), or a block a (head, HEAD_BLOCK_ROWS tokens).

#define FOX_WARPS 8  // warps per block of the one-warp-per-row kernels

// Global warp index of the one-warp-per-item kernels.
__device__ __forceinline__ size_t warp_index() { return (size_t)blockIdx.x * FOX_WARPS + threadIdx.x / 32; }

static inline unsigned warp_blocks(size_t items) { return (unsigned)((items + FOX_WARPS - 1) / FOX_WARPS); }

// Launches a one-warp-per-(token, head) kernel templated on PER_LANE = dh/32 (2 or 4): the elements of a head each lane holds.
#define LAUNCH_HEADS(kernel, dh, items, stream, ...)                                                                    \
    do {                                                                                                                \
        if ((dh) == 64) kernel<2><<<warp_blocks(items), FOX_WARPS * 32, 0, stream>>>(__VA_ARGS__);                     \
        else kernel<4><<<warp_blocks(items), FOX_WARPS * 32, 0, stream>>>(__VA_ARGS__);                                \
        FOX_LAUNCH_CHECK();                                                                                             \
    } while (0)

// Launches a kernel of the (head, HEAD_BLOCK_ROWS tokens) grid templated on PER_LANE = dh/32. The head is
// blockIdx.x so that the blocks running at once cover whole rows (DRAM locality).
#define LAUNCH_HEAD_BLOCKS(kernel, dh, N, H, stream, ...)                                                               \
    do {                                                                                                                \
        dim3 grid_ = head_grid(N, H);                                                                                   \
        if ((dh) == 64) kernel<2><<<grid_, FOX_WARPS * 32, 0, stream>>>(__VA_ARGS__);                                   \
        else kernel<4><<<grid_, FOX_WARPS * 32, 0, stream>>>(__VA_ARGS__);                                              \
        FOX_LAUNCH_CHECK();                                                                                             \
    } while (0)

// ----------------------------------------------------------------------------
// Deterministic column sums: grad[c] += Σ_r x[r, c] over a (rows, cols) fp32 matrix with leading
// dimension ld. Stage 1: each block sums COLSUM_ROWS rows of 32 columns (8 row lanes, then a fixed
// tree); stage 2: one thread per column adds the block partials in order.
#define COLSUM_ROWS 256

__global__ void colsum_partial_kernel(float *part, const float *x, int rows, int cols, int ld) {
    __shared__ float s[8][33];
    int c = blockIdx.x * 32 + threadIdx.x, r0 = blockIdx.y * COLSUM_ROWS;
    int r1 = min(rows, r0 + COLSUM_ROWS);
    float acc = 0.0f;
    if (c < cols)
        for (int r = r0 + threadIdx.y; r < r1; r += 8) acc += x[(size_t)r * ld + c];
    s[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
        float t = 0.0f;
        for (int y = 0; y < 8; y++) t += s[y][threadIdx.x];
        part[(size_t)blockIdx.y * cols + c] = t;
    }
}

__global__ void colsum_final_kernel(float *grad, const float *part, int nparts, int cols) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    float t = 0.0f;
    for (int p = 0; p < nparts; p++) t += part[(size_t)p * cols + c];
    grad[c] += t;
}

// Partial buffer size (floats) colsum_accumulate needs for a (rows, cols) matrix.
static inline size_t colsum_scratch_floats(size_t rows, size_t cols) { return ((rows + COLSUM_ROWS - 1) / COLSUM_ROWS) * cols; }

static inline void colsum_accumulate(float *grad, const float *x, int rows, int cols, int ld, float *part, cudaStream_t s) {
    int nparts = (rows + COLSUM_ROWS - 1) / COLSUM_ROWS;
    dim3 grid((cols + 31) / 32, nparts), block(32, 8);
    colsum_partial_kernel<<<grid, block, 0, s>>>(part, x, rows, cols, ld);
    FOX_LAUNCH_CHECK();
    colsum_final_kernel<<<fox_blocks(cols, 256), 256, 0, s>>>(grad, part, nparts, cols);
    FOX_LAUNCH_CHECK();
}

// The norm-weight gradients are column sums of per-row products (dy ⊙ x̂). The backward kernels (RMSNorm's,
// QK-norm's, the output norm's) add them as they go, without storing the (rows, cols) product: each block owns
// a fixed set of rows and writes one row of block partials (fixed order inside the block); colsum_accumulate
// then adds the block rows in order. A step stays bitwise reproducible. Rows (tokens) per block:
#define NORM_BLOCK_ROWS 32   // rmsnorm_backward_kernel: FOX_WARPS warps, a row at a time each
#define HEAD_BLOCK_ROWS 64   // the per-head kernels: a block per (64 tokens, head)

static inline int norm_blocks(int N) { return (N + NORM_BLOCK_ROWS - 1) / NORM_BLOCK_ROWS; }
static inline int head_blocks(int N) { return (N + HEAD_BLOCK_ROWS - 1) / HEAD_BLOCK_ROWS; }

static inline dim3 head_grid(int N, int H) {
    if (head_blocks(N) > 65535) {
        fprintf(stderr, "error: %d tokens per micro-batch is more than the GPU kernels' grid allows (%d)\n", N,
                65535 * HEAD_BLOCK_ROWS);
        exit(EXIT_FAILURE);
    }
    return dim3(H, head_blocks(N));
}

// Floats of block partials one fused column sum over N rows of D columns needs (both layouts).
static inline size_t colsum_rows_floats(int N, int D) {
    size_t nb = (size_t)(norm_blocks(N) > head_blocks(N) ? norm_blocks(N) : head_blocks(N));
    return nb * D;
}

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

// dw += the column sums of head partials: per-head weights (D columns), or one vector shared by the
// heads (wshared: dh columns, summed over blocks and heads).
static inline void head_partials_accumulate(float *dw, const float *part, int N, int H, int dh, int wshared,
                                            float *part2, cudaStream_t s) {
    int rows = head_blocks(N) * (wshared ? H : 1), cols = wshared ? dh : H * dh;
    colsum_accumulate(dw, part, rows, cols, cols, part2, s);
}

// ----------------------------------------------------------------------------
// Vector access of fp32 and bf16 rows (D % 4 == 0: fox_check_width). A norm weight may sit at any 4-byte offset
// of the parameter vector, so load_w4 reads it by element.

__device__ __forceinline__ float4 load_w4(const float *w, int i4) {
    return make_float4(w[4 * i4], w[4 * i4 + 1], w[4 * i4 + 2], w[4 * i4 + 3]);
}

__device__ __forceinline__ void store_bf16x4(bf16 *p, float a, float b, float c, float d) {
    __nv_bfloat162 lo = __floats2bfloat162_rn(a, b), hi = __floats2bfloat162_rn(c, d);
    uint2 u;
    u.x = *(uint32_t *)&lo;
    u.y = *(uint32_t *)&hi;
    *(uint2 *)p = u;
}

static inline void fox_check_width(int D) {
    if (D % 4) {
        fprintf(stderr, "error: d_model %d is not a multiple of 4 (the GPU kernels' vector width)\n", D);
        exit(EXIT_FAILURE);
    }
}

// ----------------------------------------------------------------------------
// A head's row held by a warp (lane l: elements l + 32e, e < PER_LANE) or by a group of L lanes: its norm
// weights, Σ x², rstd and the per-head RMSNorm backward (the attention inputs' QK-norm, the output norm).

// A lane's elements lane + 32e of a head's norm weight w (w: the head's first), kept in registers by the
// kernels that use them on every row.
template <int PER_LANE>
__device__ __forceinline__ void head_weights(float wl[PER_LANE], const float *w, int lane) {
#pragma unroll
    for (int e = 0; e < PER_LANE; e++) wl[e] = w[lane + 32 * e];
}

// The head's size is PER_LANE·32 (64 or 128): a constant, so the means below divide by a power of 2, which the
// compiler turns into an exact multiply.
template <int PER_LANE>
__device__ __forceinline__ float head_sumsq(const float x[PER_LANE]) {
    float ss = 0.0f;
#pragma unroll
    for (int e = 0; e < PER_LANE; e++) ss += x[e] * x[e];
    return ss;
}

// rstd from the Σ x² of a head's row held by L lanes (ss: the lanes' head_sumsq summed).
template <int PER_LANE, int L = 32>
__device__ __forceinline__ float head_rstd_of(float ss, float eps) { return 1.0f / sqrtf(ss / (PER_LANE * L) + eps); }

// Per-head RMSNorm backward (a row held by a group of L lanes, PER_LANE elements each; w: the lane's weights) of
// G independent rows at once (their reductions interleaved, group_sums), given each row's rstd rs: dx, and
// prod = dy⊙x̂ (the weight's part).
template <int PER_LANE, int G, int L = 32>
__device__ __forceinline__ void head_norm_backward_rs(float dx[G][PER_LANE], float prod[G][PER_LANE], const float x[G][PER_LANE],
                                                      const float dy[G][PER_LANE], const float w[G][PER_LANE], const float rs[G]) {
    float dot[G];
#pragma unroll
    for (int g = 0; g < G; g++) {
        dot[g] = 0.0f;
#pragma unroll
        for (int e = 0; e < PER_LANE; e++) dot[g] += dy[g][e] * w[g][e] * x[g][e] * rs[g];
    }
    group_sums<G, L>(dot);
#pragma unroll
    for (int g = 0; g < G; g++) {
        dot[g] /= PER_LANE * L;
#pragma unroll
        for (int e = 0; e < PER_LANE; e++) {
            dx[g][e] = rs[g] * (dy[g][e] * w[g][e] - x[g][e] * rs[g] * dot[g]);
            prod[g][e] = dy[g][e] * x[g][e] * rs[g];
        }
    }
}

// The same with the rows' rstd computed here.
template <int PER_LANE, int G, int L = 32>
__device__ __forceinline__ void head_norm_backward_rows(float dx[G][PER_LANE], float prod[G][PER_LANE], const float x[G][PER_LANE],
                                                        const float dy[G][PER_LANE], const float w[G][PER_LANE], float eps) {
    float rs[G];
#pragma unroll
    for (int g = 0; g < G; g++) rs[g] = head_sumsq<PER_LANE>(x[g]);
    group_sums<G, L>(rs);
#pragma unroll
    for (int g = 0; g < G; g++) rs[g] = head_rstd_of<PER_LANE, L>(rs[g], eps);
    head_norm_backward_rs<PER_LANE, G, L>(dx, prod, x, dy, w, rs);
}

#endif  // FOX_ROWS_CUH
