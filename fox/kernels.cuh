// fox/kernels.cuh: the element-wise, normalisation, scan and reduction kernels of train_fox.cu
// (everything but the GEMMs and the attention). Each forward sits next to its backward. Math is fp32;
// bf16 appears only where a tensor is a GEMM or attention operand. No atomics: every reduction runs
// in a fixed order, so a step is bitwise reproducible.
#ifndef FOX_KERNELS_CUH
#define FOX_KERNELS_CUH

#include "cuda_common.cuh"  // FOX_CUDA_CHECK, FOX_LAUNCH_CHECK, bf16, fox_blocks, warp_sum, warp_max
#include "config.h"         // FOX_NORM_EPS
#include "acp.h"            // FOX_ACP_BLOCK, fox_acp_threshold: the ACP tables' grid and bound
#include "docmask.h"        // fox_doc_has_prev, fox_doc_start: KV-shift's reach under the document mask
#include "proj.cuh"         // Proj, proj_wide_row, proj_logit, proj_ld: attn_in_w's output rows

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
// Embedding

// Paper: x_0 = the token embedding (no positional embedding; docs/model.md §1). CPU: embedding_forward.
__global__ void embedding_forward_kernel(float *out, const int *tokens, const float *wte, int N, int D) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * D) return;
    size_t n = i / D, d = i % D;
    out[i] = wte[(size_t)tokens[n] * D + d];
}

// dwte[token] += Σ dres over the token's positions, in position order. Tokens come bucketed on the host
// (buckets: token at 0, start at N, pos at 2N + 1; bucket b is token[b] at positions pos[start[b] ..
// start[b+1]), the largest first), so no two blocks touch one row and no atomics are needed. A block takes
// EMB_BWD_COLS columns of one bucket, EMB_BWD_LOADS of its rows' loads in flight, added in order: a frequent
// token's sum (hundreds of rows in a batch) is a chain of latencies, not of adds.
// CPU: embedding_backward.
#define EMB_BWD_COLS 128
#define EMB_BWD_LOADS 16
__global__ void __launch_bounds__(EMB_BWD_COLS)
    embedding_backward_kernel(float *dwte, const float *__restrict__ dres, const int *__restrict__ buckets, int N, int D) {
    const int b = blockIdx.x, d = blockIdx.y * EMB_BWD_COLS + threadIdx.x;
    if (d >= D) return;
    const int *start = buckets + N, *pos = start + N + 1;
    const int j1 = start[b + 1];
    int j = start[b];
    float acc = 0.0f;
    for (; j + EMB_BWD_LOADS <= j1; j += EMB_BWD_LOADS) {
        float x[EMB_BWD_LOADS];
#pragma unroll
        for (int k = 0; k < EMB_BWD_LOADS; k++) x[k] = dres[(size_t)pos[j + k] * D + d];
#pragma unroll
        for (int k = 0; k < EMB_BWD_LOADS; k++) acc += x[k];
    }
    for (; j < j1; j++) acc += dres[(size_t)pos[j] * D + d];
    dwte[(size_t)buckets[b] * D + d] += acc;
}

static inline int fox_bucket_key_order(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

// The tables embedding_backward_kernel reads, on the host, for N token ids of a V-token vocabulary: tables (3N + 1
// ints) gets token at 0, start at N, pos at 2N + 1; bucket b is token[b] at positions pos[start[b] .. start[b+1])
// in ascending order, the buckets largest first (their blocks start first), ties by token id. Scratch: count and
// fill (V ints), key (N). Returns the number of buckets.
static inline int fox_embedding_buckets(int *tables, uint64_t *key, int *count, int *fill, const int *inputs, int N,
                                        int V) {
    int *token = tables, *start = tables + N, *pos = start + N + 1, nb = 0, at = 0;
    memset(count, 0, (size_t)V * sizeof(int));
    for (int n = 0; n < N; n++) count[inputs[n]]++;
    for (int v = 0; v < V; v++)
        if (count[v]) key[nb++] = (uint64_t)(N - count[v]) << 32 | (uint64_t)v;
    qsort(key, (size_t)nb, sizeof(uint64_t), fox_bucket_key_order);
    for (int b = 0; b < nb; b++) {
        int v = (int)(key[b] & 0xFFFFFFFFu);
        token[b] = v;
        start[b] = at;
        fill[v] = at;
        at += count[v];
    }
    start[nb] = N;
    for (int n = 0; n < N; n++) pos[fill[inputs[n]]++] = n;
    return nb;
}

static inline void fox_embedding_backward(float *dwte, const float *dres, const int *buckets, int nb, int N, int D,
                                          cudaStream_t st) {
    dim3 grid(nb, (D + EMB_BWD_COLS - 1) / EMB_BWD_COLS);
    embedding_backward_kernel<<<grid, EMB_BWD_COLS, 0, st>>>(dwte, dres, buckets, N, D);
    FOX_LAUNCH_CHECK();
}

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

// The norm-weight gradients are column sums of per-row products (dy ⊙ x̂). The backward kernels below
// add them as they go, without storing the (rows, cols) product: each block owns a fixed set of rows
// and writes one row of block partials (fixed order inside the block); colsum_accumulate then adds the
// block rows in order. A step stays bitwise reproducible. Rows (tokens) per block:
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
// RMSNorm of the residual stream (one warp per row, float4 accesses: D % 4 == 0): fp32 in, bf16 out
// (a GEMM operand). The norm weight w may sit at any 4-byte offset of the parameter vector, so it is
// read by element.

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

static inline void fox_check_width(int D) {
    if (D % 4) {
        fprintf(stderr, "error: d_model %d is not a multiple of 4 (the GPU kernels' vector width)\n", D);
        exit(EXIT_FAILURE);
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

// ----------------------------------------------------------------------------
// Attention inputs: KV-shift, QK-norm and RoPE in one pass over the projection, writing the
// attention's bf16 q, k, v in (B, H, T, dh). The decode step's warp holds a head-row with lane l holding
// elements l + 32e (e < PER_LANE = dh/32), so each RoPE pair (i, i + dh/2) lives in one lane (dh % 64 == 0);
// training's kernels walk rows in walkers of dh / 4 lanes (QkvWalk, below). Under the document mask
// (docs/model.md §1.8) KV-shift does not reach back across a separator: the previous token counts as 0 there,
// as at t = 0 (fox_doc_has_prev).

typedef struct {
    Proj proj;                   // attn_in_w's outputs
    AttnCols cols;               // where q, k, v and the shift logits sit in a row (k_shift < 0: no KV-shift)
    const float *qw, *kw;        // QK-norm weights (NULL without QK-norm); wstride 0 when shared
    int wstride;
    const float *rope_cos, *rope_sin;  // (T, dh/2) tables, NULL without RoPE
    int B, T, H, dh;
    const int *tokens;           // (N): the token of each row (the document mask reads them); NULL when sep < 0
    int sep;                     // the document mask's separator (docs/model.md §1.8); -1: no mask
} QkvInputs;

// Whether row n (position t of its sequence) takes KV-shift's previous row: t > 0 and, under the document
// mask, the token is not a separator (fox_doc_has_prev). CPU: shift_prev.
__device__ __forceinline__ int qkv_has_prev(const QkvInputs &s, size_t n, int t) {
    return s.sep >= 0 ? fox_doc_has_prev(s.tokens + (n - (size_t)t), t, s.sep) : t > 0;
}

// Row n's shift logit of head h at column col (k_shift or v_shift; 0 when < 0: no KV-shift).
__device__ __forceinline__ float qkv_shift_logit(const QkvInputs &s, size_t n, int col, int h) {
    return col >= 0 ? proj_logit(s.proj, n, col + h) : 0.0f;
}

// A lane's elements lane + 32e of a head's norm weight w (w: the head's first), kept in registers by the
// kernels that use them on every row.
template <int PER_LANE>
__device__ __forceinline__ void head_weights(float wl[PER_LANE], const float *w, int lane) {
#pragma unroll
    for (int e = 0; e < PER_LANE; e++) wl[e] = w[lane + 32 * e];
}

// The lane's QK-norm weights of head h (zeros without QK-norm).
template <int PER_LANE>
__device__ __forceinline__ void qk_weights(float qw[PER_LANE], float kw[PER_LANE], const QkvInputs &s, int h, int lane) {
#pragma unroll
    for (int e = 0; e < PER_LANE; e++) qw[e] = kw[e] = 0.0f;
    if (s.qw) {
        head_weights<PER_LANE>(qw, s.qw + h * s.wstride, lane);
        head_weights<PER_LANE>(kw, s.kw + h * s.wstride, lane);
    }
}

// Where a warp's walk over the rows of head h is: row n, position t of its sequence, and o, the row's offset
// in the (B, H, T, dh) tensors. Stepping back by one row needs no division.
struct QkvPos {
    int n, t;
    size_t o;
};

__device__ __forceinline__ QkvPos qkv_pos(const QkvInputs &s, int n, int h, int dh) {
    int t = n % s.T, b = n / s.T;
    return {n, t, (((size_t)b * s.H + h) * s.T + t) * dh};
}

__device__ __forceinline__ QkvPos qkv_pos_next(const QkvInputs &s, QkvPos p, int dh) {
    if (p.t < s.T - 1) return {p.n + 1, p.t + 1, p.o + dh};
    return {p.n + 1, 0, p.o + ((size_t)s.H * s.T - (s.T - 1)) * dh};  // the first row of sequence b + 1
}

__device__ __forceinline__ QkvPos qkv_pos_prev(const QkvInputs &s, QkvPos p, int dh) {
    if (p.t > 0) return {p.n - 1, p.t - 1, p.o - dh};
    return {p.n - 1, s.T - 1, p.o - ((size_t)s.H * s.T - (s.T - 1)) * dh};  // the last row of sequence b − 1
}

// KV-shift (ca >= 0: y = α x_{n−1} + (1 − α) x_n, the previous row xp taken only when has_prev, qkv_has_prev,
// else 0) or none (ca < 0: y = x).
template <int PER_LANE>
__device__ __forceinline__ void kv_shift(float y[PER_LANE], const float x[PER_LANE], const float xp[PER_LANE], float al,
                                         int has_prev, int ca) {
#pragma unroll
    for (int e = 0; e < PER_LANE; e++) y[e] = ca >= 0 ? (has_prev ? al * xp[e] : 0.0f) + (1.0f - al) * x[e] : x[e];
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

// inverse = 1 turns by −angle (the backward of the rotation is its transpose).
template <int PER_LANE>
__device__ __forceinline__ void rope_rotate(float x[PER_LANE], const QkvInputs &s, int t, int lane, int inverse) {
    int half = s.dh / 2;
#pragma unroll
    for (int e = 0; e < PER_LANE / 2; e++) {
        int i = lane + 32 * e;
        float cs = s.rope_cos[(size_t)t * half + i], sn = s.rope_sin[(size_t)t * half + i];
        if (inverse) sn = -sn;
        float x1 = x[e], x2 = x[e + PER_LANE / 2];
        x[e] = x1 * cs - x2 * sn;
        x[e + PER_LANE / 2] = x2 * cs + x1 * sn;
    }
}

// The per-head RMSNorm of q and k (when s.qw) and their rotation at position t (when s.rope_cos), in place:
// head h's lane-held dimensions (qw, kw: the lane's norm weights, qk_weights), for G rows (positions t[g]) at
// once, their reductions interleaved (warp_sums). The decode step's q and k (fox/decode.cuh) come from here.
template <int PER_LANE, int G>
__device__ __forceinline__ void qk_norm_rope_rows(float qv[G][PER_LANE], float kv[G][PER_LANE], const QkvInputs &s,
                                                  const float qw[PER_LANE], const float kw[PER_LANE], const int t[G],
                                                  int lane) {
    if (s.qw) {
        float ss[2 * G];
#pragma unroll
        for (int g = 0; g < G; g++) {
            ss[2 * g] = head_sumsq<PER_LANE>(qv[g]);
            ss[2 * g + 1] = head_sumsq<PER_LANE>(kv[g]);
        }
        warp_sums<2 * G>(ss);
#pragma unroll
        for (int g = 0; g < G; g++) {
            float rq = head_rstd_of<PER_LANE>(ss[2 * g], FOX_QK_NORM_EPS), rk = head_rstd_of<PER_LANE>(ss[2 * g + 1], FOX_QK_NORM_EPS);
#pragma unroll
            for (int e = 0; e < PER_LANE; e++) {
                qv[g][e] = qv[g][e] * rq * qw[e];
                kv[g][e] = kv[g][e] * rk * kw[e];
            }
        }
    }
    if (s.rope_cos) {
#pragma unroll
        for (int g = 0; g < G; g++) {
            rope_rotate<PER_LANE>(qv[g], s, t[g], lane, 0);
            rope_rotate<PER_LANE>(kv[g], s, t[g], lane, 0);
        }
    }
}

template <int PER_LANE>
__device__ __forceinline__ void qk_norm_rope(float qv[PER_LANE], float kv[PER_LANE], const QkvInputs &s, const float qw[PER_LANE],
                                             const float kw[PER_LANE], int t, int lane) {
    typedef float Row[PER_LANE];
    qk_norm_rope_rows<PER_LANE, 1>((Row *)qv, (Row *)kv, s, qw, kw, &t, lane);
}

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

// The attention inputs' kernels (qkv_forward_kernel, qkv_backward_kernel) walk a head's rows with walkers of
// L = dh / 4 lanes, a lane holding 4 adjacent elements of the row (one 8-byte load or store of bf16 a column
// group): at d_h 64 a half-warp a row, so that the per-row work (the sums of the norm and of dα, the sigmoids,
// the rstd) is issued once for two rows. A walker walks 16 rows; 128 threads a block.
template <int DH> struct QkvWalk {
    static constexpr int L = DH / 4;               // lanes a walker
    static constexpr int threads = 128;
    static constexpr int walkers = threads / L;    // 8 at d_h 64, 4 at 128
    static constexpr int run = 16;                 // rows a walker walks
    static constexpr int rows = walkers * run;     // a block's: 128 or 64, whole HEAD_BLOCK_ROWS blocks
    static constexpr int groups = rows / HEAD_BLOCK_ROWS;  // the block's rows of norm-weight partials
    static_assert(DH == 64 || DH == 128, "walkers of 16 or 32 lanes");
    static_assert(rows % HEAD_BLOCK_ROWS == 0, "a block's partials are whole rows of head_partials_accumulate's");
    // (head, rows of N tokens), after head_grid's check of N
    static dim3 grid(int N, int H) {
        dim3 g = head_grid(N, H);
        g.y = (N + rows - 1) / rows;
        return g;
    }
};

// Whether the walkers' 8-byte accesses of proj's wide part are aligned: its row stride and the q, k, v columns
// multiples of 4 (train_fox.cu's are multiples of 64), the array 8-byte aligned.
static inline int qkv_walk_aligned(const QkvInputs &s) {
    return (s.proj.ldw | s.cols.q | s.cols.k | s.cols.v) % 4 == 0 && (uintptr_t)s.proj.wide % 8 == 0;
}

// A lane's 4 adjacent elements: fp32 as one float4 (p aligned to it); bf16 as the 8-byte word loaded.
__device__ __forceinline__ void load_f32x4(float x[4], const float *p) {
    const float4 v = *reinterpret_cast<const float4 *>(p);
    x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
}

__device__ __forceinline__ uint2 load_bf16x4(const bf16 *p) { return *reinterpret_cast<const uint2 *>(p); }

__device__ __forceinline__ void unpack_bf16x4(float x[4], uint2 u) {
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&u.x));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&u.y));
    x[0] = a.x, x[1] = a.y, x[2] = b.x, x[3] = b.y;
}

// The RoPE rotation at position t in the walkers' layout (inverse = 1: by −angle, the backward's): element
// i = 4·gl + e (gl: the lane in its walker of L) pairs with i ± dh/2, held by lane gl ^ L/2 of the same walker.
// The same products as rope_rotate.
template <int L>
__device__ __forceinline__ void rope_rotate4(float x[4], const QkvInputs &s, int t, int gl, int inverse) {
    const int half = s.dh / 2, upper = gl >= L / 2;
    float cs[4], sn[4];
    load_f32x4(cs, s.rope_cos + (size_t)t * half + gl % (L / 2) * 4);
    load_f32x4(sn, s.rope_sin + (size_t)t * half + gl % (L / 2) * 4);
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const float other = __shfl_xor_sync(group_mask<L>(), x[e], L / 2), si = inverse ? -sn[e] : sn[e];
        x[e] = upper ? x[e] * cs[e] + other * si : x[e] * cs[e] - other * si;
    }
}

// A walker's QK-norm weights of head h, its lane's 4 (zeros without QK-norm).
__device__ __forceinline__ void qk_weights4(float qw[4], float kw[4], const QkvInputs &s, int h, int gl) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
        qw[e] = s.qw ? s.qw[h * s.wstride + 4 * gl + e] : 0.0f;
        kw[e] = s.qw ? s.kw[h * s.wstride + 4 * gl + e] : 0.0f;
    }
}

// One row's inputs of qkv_forward_kernel (row p.n of head h, the lane's columns from c = h·dh + 4·gl), loaded a
// row ahead: q, k, v as loaded (4 bf16 each), the shift logits (0 without KV-shift), whether KV-shift takes row
// n − 1 (qkv_has_prev).
struct QkvFwdIn {
    uint2 q, k, v;
    float ak, av;
    int hp;
};

__device__ __forceinline__ QkvFwdIn qkv_fwd_load(const QkvInputs &s, QkvPos p, int h, int c) {
    const bf16 *row = proj_wide_row(s.proj, p.n);
    QkvFwdIn in;
    in.q = load_bf16x4(row + s.cols.q + c);
    in.k = load_bf16x4(row + s.cols.k + c);
    in.v = load_bf16x4(row + s.cols.v + c);
    in.ak = qkv_shift_logit(s, p.n, s.cols.k_shift, h);
    in.av = qkv_shift_logit(s, p.n, s.cols.v_shift, h);
    in.hp = qkv_has_prev(s, (size_t)p.n, p.t);
    return in;
}

// Paper eq. 15-19 (FoX Pro): q = QK-norm(W_q x); k = QK-norm(KV-shift(W_k x)), v = KV-shift(W_v x); then
// RoPE (Transformer presets). Grid: (head, QkvWalk::rows tokens); a walker walks its run of rows in order, the
// next row's loads issued before this row's work, so a row's k and v columns, read once, are the next row's shift
// input. CPU: kv_shift_forward, rmsnorm_forward (per head), rope_apply in attention_block_forward.
template <int DH>
__global__ void __launch_bounds__(QkvWalk<DH>::threads) qkv_forward_kernel(bf16 *q, bf16 *k, bf16 *v, QkvInputs s) {
    using S = QkvWalk<DH>;
    constexpr int L = S::L;
    const int walker = threadIdx.x / L, gl = threadIdx.x % L, h = blockIdx.x, N = s.B * s.T, c = h * DH + 4 * gl;
    const int lo = blockIdx.y * S::rows + walker * S::run, hi = min(N, lo + S::run);
    if (lo >= hi) return;
    float qw[4], kw[4], kx[4] = {}, vx[4] = {};  // kx, vx: the previous row's k, v columns
    qk_weights4(qw, kw, s, h, gl);
    if (lo > 0) {
        unpack_bf16x4(kx, load_bf16x4(proj_wide_row(s.proj, lo - 1) + s.cols.k + c));
        unpack_bf16x4(vx, load_bf16x4(proj_wide_row(s.proj, lo - 1) + s.cols.v + c));
    }
    QkvPos p = qkv_pos(s, lo, h, DH);
    QkvFwdIn cur = qkv_fwd_load(s, p, h, c), next = cur;
    while (p.n < hi) {
        const QkvPos pn = qkv_pos_next(s, p, DH);
        if (pn.n < hi) next = qkv_fwd_load(s, pn, h, c);
        float qv[4], kr[4], vr[4], kv[4], vv[4];
        unpack_bf16x4(qv, cur.q);
        unpack_bf16x4(kr, cur.k);
        unpack_bf16x4(vr, cur.v);
        const float ak = s.cols.k_shift >= 0 ? sigmoidf_(cur.ak) : 0.0f;
        const float av = s.cols.v_shift >= 0 ? sigmoidf_(cur.av) : 0.0f;
        kv_shift<4>(kv, kr, kx, ak, cur.hp, s.cols.k_shift);
        kv_shift<4>(vv, vr, vx, av, cur.hp, s.cols.v_shift);
        if (s.qw) {
            float ss[2] = {head_sumsq<4>(qv), head_sumsq<4>(kv)};
            group_sums<2, L>(ss);
            const float rq = head_rstd_of<4, L>(ss[0], FOX_QK_NORM_EPS), rk = head_rstd_of<4, L>(ss[1], FOX_QK_NORM_EPS);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                qv[e] = qv[e] * rq * qw[e];
                kv[e] = kv[e] * rk * kw[e];
            }
        }
        if (s.rope_cos) {
            rope_rotate4<L>(qv, s, p.t, gl, 0);
            rope_rotate4<L>(kv, s, p.t, gl, 0);
        }
        const size_t o = p.o + 4 * gl;
        store_bf16x4(q + o, qv[0], qv[1], qv[2], qv[3]);
        store_bf16x4(k + o, kv[0], kv[1], kv[2], kv[3]);
        store_bf16x4(v + o, vv[0], vv[1], vv[2], vv[3]);
#pragma unroll
        for (int e = 0; e < 4; e++) kx[e] = kr[e], vx[e] = vr[e];
        cur = next;
        p = pn;
    }
}

// The forward of the attention inputs (qkv_walk_aligned's layout).
static inline void fox_qkv_forward(bf16 *q, bf16 *k, bf16 *v, const QkvInputs &s, cudaStream_t st) {
    if (!qkv_walk_aligned(s)) {
        fprintf(stderr, "error: fox_qkv_forward needs proj's row stride and q, k, v columns in multiples of 4\n");
        exit(EXIT_FAILURE);
    }
    const int N = s.B * s.T;
    if (s.dh == 64) qkv_forward_kernel<64><<<QkvWalk<64>::grid(N, s.H), QkvWalk<64>::threads, 0, st>>>(q, k, v, s);
    else qkv_forward_kernel<128><<<QkvWalk<128>::grid(N, s.H), QkvWalk<128>::threads, 0, st>>>(q, k, v, s);
    FOX_LAUNCH_CHECK();
}

// One row's inputs of qkv_backward_kernel (row p.n of head h), loaded a row ahead (two rows' loads in flight
// per walker). The row's own k and v columns are not among them: the walk loaded them as the row after's kp, vp.
struct QkvRowIn {
    uint2 gq, gk, gv;           // dq, dk, dv: 4 bf16 each, as loaded (unpacked when used: fewer registers in flight)
    uint2 q;                    // the q columns of the row (4 bf16)
    uint2 kp, vp;               // the k, v columns of row n − 1 (0 when unread)
    float ak, av;               // the shift logits (0 without KV-shift)
    int hp;                     // KV-shift takes row n − 1 (qkv_has_prev)
};

// Row n − 1 is read when KV-shift takes it or when it is the walker's next row (n − 1 >= lo). c: the lane's
// first column of head h, h·dh + 4·gl; oi: its first element in the (B, H, T, dh) tensors' row.
__device__ __forceinline__ void qkv_row_load(QkvRowIn &in, const bf16 *dq, const bf16 *dk, const bf16 *dv,
                                             const QkvInputs &s, QkvPos p, int lo, int h, int c, int oi) {
    const bf16 *row = proj_wide_row(s.proj, p.n);
    in.ak = qkv_shift_logit(s, p.n, s.cols.k_shift, h);
    in.av = qkv_shift_logit(s, p.n, s.cols.v_shift, h);
    in.hp = qkv_has_prev(s, (size_t)p.n, p.t);
    in.gq = load_bf16x4(dq + p.o + oi);
    in.gk = load_bf16x4(dk + p.o + oi);
    in.gv = load_bf16x4(dv + p.o + oi);
    in.q = load_bf16x4(row + s.cols.q + c);
    const int prev = in.hp || p.n - 1 >= lo;
    in.kp = prev ? load_bf16x4(row - s.proj.ldw + s.cols.k + c) : make_uint2(0, 0);  // bf16 0x0000 is 0
    in.vp = prev ? load_bf16x4(row - s.proj.ldw + s.cols.v + c) : make_uint2(0, 0);
}

// Backward of the KV-shift y_t = α_t x_{t−1} + (1−α_t) x_t of one head's columns of row t (eq. 17-18):
// dx_t = (1−α_t) dy_t + α_{t+1} dy_{t+1} (gn, an: row t+1's, when has_next), and the lane's part of
// dα_t = Σ dy_t (x_{t−1} − x_t) (xp, x: rows t − 1 and t; its warp sum goes through the sigmoid into the
// shift-logit column). ca < 0 (no shift): dx = dy.
template <int PER_LANE>
__device__ __forceinline__ float shift_backward(float dx[PER_LANE], const float gy[PER_LANE], const float gn[PER_LANE],
                                                float an, int has_next, const float x[PER_LANE], const float xp[PER_LANE],
                                                float al, int has_prev, int ca) {
    float dal = 0.0f;
#pragma unroll
    for (int e = 0; e < PER_LANE; e++) {
        dx[e] = ca < 0 ? gy[e] : (1.0f - al) * gy[e] + (has_next ? an * gn[e] : 0.0f);
        dal += has_prev ? gy[e] * (xp[e] - x[e]) : -gy[e] * x[e];
    }
    return dal;
}

// A row's shift-logit gradients (dproj's k_shift and v_shift columns of head h, where KV-shift is on) from dα
// (dak: keys', dav: values') through the sigmoid α = σ(logit); stored by the lane where lead.
__device__ __forceinline__ void shift_logit_grads_store(bf16 *drow, int lead, float dak, float dav, float alk, float alv,
                                                        const QkvInputs &s, int h) {
    if (lead && s.cols.k_shift >= 0) drow[s.cols.k_shift + h] = __float2bfloat16(dak * alk * (1.0f - alk));
    if (lead && s.cols.v_shift >= 0) drow[s.cols.v_shift + h] = __float2bfloat16(dav * alv * (1.0f - alv));
}

// The block's QK-norm weight partials: each walker's sums of its rows' dy⊙x̂ (in its walk's order) added in walker
// order, a row of part for each HEAD_BLOCK_ROWS rows of the block (head_partials_accumulate adds the rows).
template <int DH>
__device__ __forceinline__ void qkv_partials_store(float *qpart, float *kpart, float (*red)[QkvWalk<DH>::walkers][DH],
                                                   const float qacc[4], const float kacc[4], int walker, int gl, int N) {
    using S = QkvWalk<DH>;
#pragma unroll
    for (int e = 0; e < 4; e++) red[0][walker][4 * gl + e] = qacc[e], red[1][walker][4 * gl + e] = kacc[e];
    __syncthreads();
    for (int o = threadIdx.x; o < 2 * S::groups * DH; o += S::threads) {
        const int which = o / (S::groups * DH), g = o / DH % S::groups, j = o % DH;
        const int prow = blockIdx.y * S::groups + g;  // the head block
        if (prow * HEAD_BLOCK_ROWS >= N) continue;
        float t = 0.0f;
        for (int w = g * (S::walkers / S::groups); w < (g + 1) * (S::walkers / S::groups); w++) t += red[which][w][j];
        (which ? kpart : qpart)[((size_t)prow * gridDim.x + blockIdx.x) * DH + j] = t;
    }
}

// Backward of eq. 15-19 in one pass: through RoPE and QK-norm for q and the shifted k, then KV-shift for k
// and v: dproj's q, k, v and shift-logit columns and, with QK-norm, the weight gradients' block partials
// (qpart, kpart). Grid: (head, QkvWalk::rows tokens); a walker walks its run of rows last first, so row t's
// dks and α_t are in registers when row t − 1 needs them, and row t − 1's k and v, read as row t's shift input,
// are row t − 1's own. The row after the run has its dks computed again, by the same loop (the same
// instructions, so the same bits as the walker that owns it). CPU: rope_apply (inverse), rmsnorm_backward and
// kv_shift_backward in attention_block_backward. Bounded to 4 blocks an SM (128 registers): the walkers' loads
// in flight are what the kernel's speed is.
template <int DH>
__global__ void __launch_bounds__(QkvWalk<DH>::threads, 4)
    qkv_backward_kernel(bf16 *dproj, float *qpart, float *kpart, const bf16 *dq, const bf16 *dk, const bf16 *dv,
                        QkvInputs s) {
    using S = QkvWalk<DH>;
    constexpr int L = S::L;
    __shared__ float red[2][S::walkers][DH];
    const int walker = threadIdx.x / L, gl = threadIdx.x % L, h = blockIdx.x, N = s.B * s.T, c = h * DH + 4 * gl;
    const int lo = blockIdx.y * S::rows + walker * S::run, hi = min(N, lo + S::run);
    float qacc[4] = {}, kacc[4] = {};
    if (lo < hi) {
        float qw[4], kw[4];
        qk_weights4(qw, kw, s, h, gl);
        QkvRowIn cur, next;
        float kc[4], vc[4];                                               // the current row's k, v columns
        float dksn[4] = {}, gvn[4] = {}, akn = 0.0f, avn = 0.0f;          // the next row's dks, dv, α's
        int hn = 0;                                                       // the next row takes this one
        // the walk starts at the row after the run when that row takes the run's last (its dks alone)
        int tn = (hi - 1) % s.T + 1, top = tn < s.T && qkv_has_prev(s, hi, tn) ? hi : hi - 1;
        QkvPos p = qkv_pos(s, top, h, DH);
        qkv_row_load(cur, dq, dk, dv, s, p, lo, h, c, 4 * gl);
        unpack_bf16x4(kc, load_bf16x4(proj_wide_row(s.proj, top) + s.cols.k + c));
        unpack_bf16x4(vc, load_bf16x4(proj_wide_row(s.proj, top) + s.cols.v + c));
        while (p.n >= lo) {
            QkvPos pn = qkv_pos_prev(s, p, DH);
            if (pn.n >= lo) qkv_row_load(next, dq, dk, dv, s, pn, lo, h, c, 4 * gl);
            float gq[4], gk[4], gv[4], q[4], kp[4], vp[4];
            unpack_bf16x4(gq, cur.gq);
            unpack_bf16x4(gk, cur.gk);
            unpack_bf16x4(gv, cur.gv);
            unpack_bf16x4(q, cur.q);
            unpack_bf16x4(kp, cur.kp);
            unpack_bf16x4(vp, cur.vp);
            if (s.rope_cos) {
                rope_rotate4<L>(gq, s, p.t, gl, 1);
                rope_rotate4<L>(gk, s, p.t, gl, 1);
            }
            float alk = s.cols.k_shift >= 0 ? sigmoidf_(cur.ak) : 0.0f;
            float alv = s.cols.v_shift >= 0 ? sigmoidf_(cur.av) : 0.0f;
            // q (row 0) and the shifted key y_t (row 1) through QK-norm side by side; dx[1] is dks, y_t's gradient
            float x[2][4], g[2][4], w[2][4], dx[2][4], prod[2][4];
            kv_shift<4>(x[1], kc, kp, alk, cur.hp, s.cols.k_shift);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                x[0][e] = q[e];
                g[0][e] = dx[0][e] = gq[e];
                g[1][e] = dx[1][e] = gk[e];
                w[0][e] = qw[e];
                w[1][e] = kw[e];
            }
            if (s.qw) head_norm_backward_rows<4, 2, L>(dx, prod, x, g, w, FOX_QK_NORM_EPS);
            float dkc[4], dvc[4], dal[2];  // the gradients of the k, v columns and shift logits
            dal[0] = shift_backward<4>(dkc, dx[1], dksn, akn, hn, kc, kp, alk, cur.hp, s.cols.k_shift);
            dal[1] = shift_backward<4>(dvc, gv, gvn, avn, hn, vc, vp, alv, cur.hp, s.cols.v_shift);
            group_sums<2, L>(dal);
            if (p.n < hi) {  // the row after the run is another walker's: its dks alone was wanted
                bf16 *drow = dproj + (size_t)p.n * proj_ld(s.proj);
                store_bf16x4(drow + s.cols.q + c, dx[0][0], dx[0][1], dx[0][2], dx[0][3]);
                store_bf16x4(drow + s.cols.k + c, dkc[0], dkc[1], dkc[2], dkc[3]);
                store_bf16x4(drow + s.cols.v + c, dvc[0], dvc[1], dvc[2], dvc[3]);
                if (s.qw)
#pragma unroll
                    for (int e = 0; e < 4; e++) qacc[e] += prod[0][e], kacc[e] += prod[1][e];
                shift_logit_grads_store(drow, gl == 0, dal[0], dal[1], alk, alv, s, h);
            }
            // row t − 1's next row is this one (it takes row t − 1 exactly when this row has a previous)
            hn = cur.hp;
            akn = alk;
            avn = alv;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                dksn[e] = dx[1][e];
                gvn[e] = gv[e];
                kc[e] = kp[e];
                vc[e] = vp[e];
            }
            cur = next;
            p = pn;
        }
    }
    if (s.qw) qkv_partials_store<DH>(qpart, kpart, red, qacc, kacc, walker, gl, N);
}

template <int DH>
static void qkv_backward_launch(bf16 *dproj, float *qpart, float *kpart, const bf16 *dq, const bf16 *dk, const bf16 *dv,
                                const QkvInputs &s, cudaStream_t st) {
    using S = QkvWalk<DH>;
    qkv_backward_kernel<DH><<<S::grid(s.B * s.T, s.H), S::threads, 0, st>>>(dproj, qpart, kpart, dq, dk, dv, s);
    FOX_LAUNCH_CHECK();
}

// The backward of the attention inputs (q, k, v → dproj's q, k, v and shift columns) and the QK-norm
// weight gradients dqw, dkw (with QK-norm). part: 2·colsum_rows_floats(N, D) floats,
// part2: colsum_scratch_floats(head_blocks(N)·H, D). proj in qkv_walk_aligned's layout, dproj's row stride a
// multiple of 4 and the array 8-byte aligned.
static inline void fox_qkv_backward(bf16 *dproj, float *dqw, float *dkw, const bf16 *dq, const bf16 *dk, const bf16 *dv,
                                    const QkvInputs &s, float *part, float *part2, cudaStream_t st) {
    int N = s.B * s.T;
    if (!qkv_walk_aligned(s) || proj_ld(s.proj) % 4 || (uintptr_t)dproj % 8) {
        fprintf(stderr, "error: fox_qkv_backward needs proj's and dproj's row strides and q, k, v columns in multiples "
                        "of 4\n");
        exit(EXIT_FAILURE);
    }
    float *qpart = part, *kpart = part + colsum_rows_floats(N, s.H * s.dh);
    if (s.dh == 64) qkv_backward_launch<64>(dproj, qpart, kpart, dq, dk, dv, s, st);
    else qkv_backward_launch<128>(dproj, qpart, kpart, dq, dk, dv, s, st);
    if (s.qw) {
        head_partials_accumulate(dqw, qpart, N, s.H, s.dh, s.wstride == 0, part2, st);
        head_partials_accumulate(dkw, kpart, N, s.H, s.dh, s.wstride == 0, part2, st);
    }
}

// ----------------------------------------------------------------------------
// Backward of eq. 20 (f_t = σ(w_f·x_t + b_f)): d logit = d log f · σ(−logit), into dproj's forget column
// (when there is one) and dfg (N, H) fp32, whose column sums are the bias gradient. At a separator of the
// document mask (tokens[n] == sep >= 0; tokens unread when sep < 0) log f is FOX_DOC_LOG_F whatever the gate
// computes, so d logit = 0 there (docs/model.md §1.8). CPU: the last loop of forget_gate_backward (d log f
// comes from fox_attention_backward's reverse scan).
__global__ void forget_gate_backward_kernel(bf16 *dproj, float *dfg, const float *dlogf, const Proj proj, int cf,
                                            const float *bias, const int *tokens, int sep, int B, int H, int T) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)B * H * T) return;
    int t = (int)(i % T), h = (int)((i / T) % H), b = (int)(i / ((size_t)T * H));
    size_t n = (size_t)b * T + t;
    float logit = bias[h] + (cf >= 0 ? proj_logit(proj, n, cf + h) : 0.0f);
    float d = sep >= 0 && fox_doc_start(tokens[n], sep) ? 0.0f : dlogf[i] * sigmoidf_(-logit);
    if (cf >= 0) dproj[n * proj_ld(proj) + cf + h] = __float2bfloat16(d);
    dfg[n * H + h] = d;
}

// ----------------------------------------------------------------------------
// ACP tables (fox/acp.h) of one attention call, one block per (b, h): U from the QK-norm weights (qw, kw;
// wstride 0 when shared) or, with qw NULL, from the largest q and k norms of the sequence; then kv_first[m]
// for every query block (a binary search each), at least doc_first[b·nblk + m] under the document mask
// (fox_doc_first_blocks: the key blocks before the document of the query block's first row are dead,
// docs/model.md §1.8), then a running max, so the staircase is monotone even where the fp32 scan of c is
// not; and q_last[n] = the last query block m with kv_first[m] <= n. c NULL: no forget gate, so no
// threshold (kv_first = doc_first alone; q, k, qw, kw unread); doc_first NULL: no document mask (c must
// not be NULL then). live (may be NULL) gains the number of live tiles (an integer sum: the same every run).
#define ACP_THREADS 256

// ACP paper §3 (docs/model.md §1.5). CPU: acp_tables.
__global__ void __launch_bounds__(ACP_THREADS) acp_tables_kernel(int *kv_first, int *q_last, unsigned long long *live,
                                                                 const float *c, const bf16 *q, const bf16 *k,
                                                                 const float *qw, const float *kw, int wstride,
                                                                 const int *doc_first, int H, int T, int dh) {
    extern __shared__ int kf[];  // (nblk)
    __shared__ float red[2][ACP_THREADS / 32];
    int bh = blockIdx.x, b = bh / H, h = bh % H, tid = threadIdx.x, nblk = fox_acp_blocks(T);
    if (c) {  // the threshold's staircase (every thread of the block takes this branch, or none)
        float mq = 0.0f, mk = 0.0f;
        if (qw) {
            for (int i = tid; i < dh; i += ACP_THREADS) {
                mq = fmaxf(mq, fabsf(qw[h * wstride + i]));
                mk = fmaxf(mk, fabsf(kw[h * wstride + i]));
            }
        } else {
            const bf16 *qh = q + (size_t)bh * T * dh, *kh = k + (size_t)bh * T * dh;
            for (int t = tid; t < T; t += ACP_THREADS) {
                float q2 = 0.0f, k2 = 0.0f;
                for (int i = 0; i < dh; i++) {
                    float a = __bfloat162float(qh[(size_t)t * dh + i]), b2 = __bfloat162float(kh[(size_t)t * dh + i]);
                    q2 += a * a;
                    k2 += b2 * b2;
                }
                mq = fmaxf(mq, q2);
                mk = fmaxf(mk, k2);
            }
        }
        mq = warp_max(mq);
        mk = warp_max(mk);
        if (tid % 32 == 0) {
            red[0][tid / 32] = mq;
            red[1][tid / 32] = mk;
        }
        __syncthreads();
        for (int w = 0; w < ACP_THREADS / 32; w++) {
            mq = fmaxf(mq, red[0][w]);
            mk = fmaxf(mk, red[1][w]);
        }
        double U = qw ? fox_acp_bound_qknorm(mq, mk, dh) : fox_acp_bound_norms(mq, mk, dh), delta = fox_acp_threshold(U, T);
        const float *ch = c + (size_t)bh * T;
        for (int m = tid; m < nblk; m += ACP_THREADS) kf[m] = fox_acp_first_live(ch, T, m, delta);
    } else {
        for (int m = tid; m < nblk; m += ACP_THREADS) kf[m] = 0;
    }
    if (doc_first)  // the same thread wrote kf[m] above
        for (int m = tid; m < nblk; m += ACP_THREADS) kf[m] = max(kf[m], doc_first[(size_t)b * nblk + m]);
    __syncthreads();
    if (tid == 0) {
        for (int m = 1; m < nblk; m++) kf[m] = max(kf[m], kf[m - 1]);
        if (live) atomicAdd(live + h, (unsigned long long)fox_acp_live_tiles(kf, nblk));
    }
    __syncthreads();
    for (int m = tid; m < nblk; m += ACP_THREADS) {
        kv_first[(size_t)bh * nblk + m] = kf[m];
        int lo = m, hi = nblk - 1;  // key block n = m: the last query block keeping it (kf[m] <= m)
        while (lo < hi) {
            int mid = (lo + hi + 1) / 2;
            if (kf[mid] <= m) lo = mid;
            else hi = mid - 1;
        }
        q_last[(size_t)bh * nblk + m] = lo;
    }
}

// The ACP tables of B·H (b, h) rows of T positions (above): c NULL for no forget gate, doc_first (B, nblk) or
// NULL for no document mask; at least one of the two. live: NULL, or H counters, live[h] += head h's live
// tiles summed over the batch (fox_acp_live_tiles).
static inline void fox_acp_tables(int *kv_first, int *q_last, unsigned long long *live, const float *c, const bf16 *q,
                                  const bf16 *k, const float *qw, const float *kw, int wstride, const int *doc_first, int B,
                                  int H, int T, int dh, cudaStream_t s) {
    acp_tables_kernel<<<B * H, ACP_THREADS, fox_acp_blocks(T) * sizeof(int), s>>>(kv_first, q_last, live, c, q, k, qw,
                                                                                 kw, wstride, doc_first, H, T, dh);
    FOX_LAUNCH_CHECK();
}

// ----------------------------------------------------------------------------
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

// ----------------------------------------------------------------------------
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

// ----------------------------------------------------------------------------
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

// Per-position cross entropy of the next token (docs/model.md §2) and its gradient. losses NULL: the loss
// is not stored. staged: the row goes through dynamic shared memory (VP bf16). CPU: crossentropy_forward,
// crossentropy_backward.
__global__ void __launch_bounds__(CE_THREADS) crossentropy_kernel(float *losses, bf16 *logits, const int *targets, int V,
                                                                 int VP, float scale, int grad, int staged) {
    extern __shared__ uint4 ce_row[];  // (VP / 8) when staged
    __shared__ float lse;
    bf16 *z = logits + (size_t)blockIdx.x * VP;
    const int tg = targets[blockIdx.x], nv = VP / 8;
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

// ----------------------------------------------------------------------------
// Optimizer

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
// copy of a GEMM weight with its rows padded from `rows` to `rows_pad` per layer (the padding stays zero).
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

#endif
