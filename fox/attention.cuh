// fox/attention.cuh: Forgetting Attention (docs/model.md §1), forward and backward, FlashAttention-2 style on
// tensor cores, bf16 operands with fp32 accumulation: warpgroup MMA (wgmma) at d_h = 64 on Hopper
// (sm_90a builds), mma.sync m16n8k16 otherwise (d_h = 128, sm_80). FOX_ATTN_NO_WGMMA=1 forces mma.sync.
// The backward is deterministic by default: the same inputs give bitwise the same outputs, run after run
// (fox_attention_set_deterministic(0) picks the faster arrival-order atomics instead).
//
// Per (batch b, head h), scale = 1/sqrt(d_h), j <= i:
//   s_ij = scale q_i.k_j + c_i - c_j,  P = softmax_j(s),  o_i = sum_j P_ij v_j,  lse_i = logsumexp_j s_ij.
// Layouts: q, k, v, dq, dk, dv bf16 (B, H, T, dh); o, dO bf16 (B, T, H, dh); c, lse, dc, dlogf fp32 (B, H, T).
//
// Adaptive Computation Pruning hooks work on a grid of FOX_ATTN_ACP_BLOCK x FOX_ATTN_ACP_BLOCK tiles:
// kv_first[(b*H + h)*nblk + m] is the first live key block of query block m, q_last[(b*H + h)*nblk + n]
// the last live query block of key block n (nblk = ceil(T / FOX_ATTN_ACP_BLOCK)); NULL means no pruning.
// Every kernel's tiles nest inside that grid, so a pruned ACP tile is skipped exactly, forward and backward.
#ifndef FOX_ATTENTION_CUH
#define FOX_ATTENTION_CUH

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <math.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include "acp.h"

#define FOX_ATTN_ACP_BLOCK FOX_ACP_BLOCK

#define FOX_CUDA_CHECK(call) fox_attn_cuda_check((call), #call, __FILE__, __LINE__)
static inline void fox_attn_cuda_check(cudaError_t err, const char *what, const char *file, int line) {
    if (err != cudaSuccess) {
        fprintf(stderr, "CUDA error at %s:%d: %s: %s\n", file, line, what, cudaGetErrorString(err));
        exit(EXIT_FAILURE);
    }
}

namespace fox_attn {

constexpr float LOG2E = 1.4426950408889634f;
constexpr int NWARPS = 8;              // backward warps per block
constexpr int NTHREADS = NWARPS * 32;
constexpr int FWD_BM = 128;            // forward: query rows per block
constexpr int FWD_BN = 64;             // forward: keys per pipelined tile
constexpr int BWD_BN = 128;            // backward: keys per block (16 per warp)
static_assert(FWD_BM == FOX_ATTN_ACP_BLOCK && BWD_BN == FOX_ATTN_ACP_BLOCK, "tiles must nest in the ACP grid");


// ---------------------------------------------------------------------------------------------
// Shared-memory tiles of bf16 rows, 16-byte chunks XOR-swizzled so ldmatrix reads of 8 rows at one
// column hit 8 different bank groups.
template <int COLS> __device__ __forceinline__ int swz(int row, int col) {
    constexpr int CHUNKS = COLS / 8;
    static_assert(CHUNKS >= 4, "rows of at least 64 bytes");
    const int chunk = col >> 3;
    const int x = CHUNKS >= 8 ? (row & 7) : ((row >> 1) & 3);
    return row * COLS + ((chunk ^ x) << 3) + (col & 7);
}

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

// 16-byte async copy global -> shared; bytes past `valid` (0 or 16) are zero-filled.
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(p)));
}

// d[4] += a (16x16 bf16, row) * b (16x8 bf16, col)
__device__ __forceinline__ void mma16816(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                 "{%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

// A fragment (16 x 16, row-major in smem, COLS per row) at (row0, col0).
template <int COLS> __device__ __forceinline__ void load_a(uint32_t a[4], const __nv_bfloat16 *s, int row0, int col0, int lane) {
    ldmatrix_x4(a, s + swz<COLS>(row0 + (lane & 15), col0 + ((lane >> 4) << 3)));
}
// A fragment (16 x 16) of the transpose of a row-major smem tile X: A[m][k] = X[k0 + k][m0 + m].
template <int COLS> __device__ __forceinline__ void load_a_trans(uint32_t a[4], const __nv_bfloat16 *s, int k0, int m0, int lane) {
    const int mi = lane >> 3;
    ldmatrix_x4_trans(a, s + swz<COLS>(k0 + (lane & 7) + ((mi >> 1) << 3), m0 + ((mi & 1) << 3)));
}
// B fragments of two n8 tiles (b[0..1] for n0..n0+7, b[2..3] for n0+8..n0+15), k0..k0+15, from
// smem holding X[n][k] row-major (B = X^T, e.g. K for Q K^T).
template <int COLS> __device__ __forceinline__ void load_b_nk(uint32_t b[4], const __nv_bfloat16 *s, int n0, int k0, int lane) {
    ldmatrix_x4(b, s + swz<COLS>(n0 + (lane & 7) + ((lane >> 4) << 3), k0 + (((lane >> 3) & 1) << 3)));
}
// Same, from smem holding X[k][n] row-major (B = X, e.g. V for P V).
template <int COLS> __device__ __forceinline__ void load_b_kn(uint32_t b[4], const __nv_bfloat16 *s, int k0, int n0, int lane) {
    ldmatrix_x4_trans(b, s + swz<COLS>(k0 + (lane & 7) + (((lane >> 3) & 1) << 3), n0 + ((lane >> 4) << 3)));
}

// Async copy of `rows` rows of DH bf16 starting at global row `row0` (row stride `ld` elements) into a
// swizzled smem tile; rows at or past T are zero-filled.
template <int DH, int ROWS, int NT = NTHREADS>
__device__ __forceinline__ void load_tile_async(__nv_bfloat16 *dst, const __nv_bfloat16 *src, int ld, int row0, int T, int tid) {
    constexpr int CHUNKS = ROWS * DH / 8;
    static_assert(CHUNKS % NT == 0, "whole chunks per thread");
#pragma unroll
    for (int i = 0; i < CHUNKS / NT; i++) {
        const int idx = tid + i * NT;
        const int r = idx / (DH / 8), col = (idx % (DH / 8)) * 8;
        const bool valid = row0 + r < T;
        const __nv_bfloat16 *g = src + (size_t)(valid ? row0 + r : 0) * ld + col;
        cp_async16(dst + swz<DH>(r, col), g, valid);
    }
}

// ---------------------------------------------------------------------------------------------
// Hopper warpgroup MMA (sm_90a; the backward's BWD_WGMMA path). Shared-memory operands are described by
// 64-bit descriptors: 128-byte swizzle (our swz<64> layout: 16-byte chunk ^= row & 7 in rows of 128 bytes,
// tiles 1024-byte aligned), 8-row groups 1024 bytes apart. A K-major operand advances 32 bytes per k16
// step; an MN-major one 16 rows (2048 bytes).
__device__ __forceinline__ uint64_t gmma_desc(const void *p) {
    const uint32_t a = smem_u32(p);
    return (uint64_t)((a & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}
__device__ __forceinline__ void wg_fence() {
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wg_commit() {
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Waits until at most N committed groups of this warpgroup's MMAs are still running.
template <int N> __device__ __forceinline__ void wg_wait() {
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
__device__ __forceinline__ void wg_commit_wait() {
    wg_commit();
    wg_wait<0>();
}
// generic-proxy smem writes (st.shared, cp.async) -> later reads by wgmma (async proxy)
__device__ __forceinline__ void fence_proxy_async_smem() {
#if __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// D (64 x 64, fp32, m16n8 accumulator layout per warp) += A (64 x 16) B (16 x 64), both from smem
// descriptors; TA / TB: A / B stored MN-major (transposed) rather than K-major.
// scale_d = 0: D = A B (D's old contents ignored, so no zeroing: zeroing the accumulator registers
// makes ptxas serialize the warpgroup MMAs).
template <int TA, int TB>
__device__ __forceinline__ void wgmma_m64n64_ss(float (&d)[8][4], uint64_t da, uint64_t db, int scale_d) {
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %36, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, %34, %35;\n"
        "}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "l"(da), "l"(db), "n"(TA), "n"(TB), "r"(scale_d));
#else
    __trap();
#endif
}
// D (64 x 64) += A (64 x 16, registers: this warp's 16 rows as an mma.m16n8k16 A fragment) B (smem).
template <int TB>
__device__ __forceinline__ void wgmma_m64n64_rs(float (&d)[8][4], const uint32_t a[4], uint64_t db) {
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %38, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %37;\n"
        "}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(TB), "r"(1));
#else
    __trap();
#endif
}
// D (64 x 32) += A (64 x 16) B (16 x 32), both from smem descriptors (scale_d = 0: D = A B).
template <int TA, int TB>
__device__ __forceinline__ void wgmma_m64n32_ss(float (&d)[4][4], uint64_t da, uint64_t db, int scale_d) {
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %20, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, %18, %19;\n"
        "}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
        : "l"(da), "l"(db), "n"(TA), "n"(TB), "r"(scale_d));
#else
    __trap();
#endif
}

// Convert two n8 accumulator tiles (16 x 16 of one row block) to an A fragment, as bf16.
__device__ __forceinline__ void acc_to_a(uint32_t a[4], const float lo[4], const float hi[4]) {
    a[0] = pack_bf16(lo[0], lo[1]);
    a[1] = pack_bf16(lo[2], lo[3]);
    a[2] = pack_bf16(hi[0], hi[1]);
    a[3] = pack_bf16(hi[2], hi[3]);
}

// 2^x on the special-function unit (2^-inf = 0).
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// ---------------------------------------------------------------------------------------------
// Forward. Block = FWD_BM query rows of one (b, h); each warp owns MT row tiles of 16 (so every K/V
// fragment read from smem feeds MT mma). Key tiles are walked from the diagonal down to the first live
// one, double-buffered with cp.async.
//
// Gate precision: c reaches -1e4 and beyond at long T, where an fp32 ulp is ~1e-3, so c_i - c_j must be
// formed from differences, never from c*log2e products. Each key tile takes c_ref = c at its first
// key; a_i = (c_i - c_ref) log2e per row and nb_j = -(c_j - c_ref) log2e per key are small for every
// tile that matters, and s_ij log2e = a_i + fma(qk, scale log2e, nb_j).
// WG: S = Q K^T and O += P V on Hopper warpgroup MMA (sm_90a, dh 64): 8 warps of 16 rows, warpgroup w4
// owning rows 64 w4.., operands straight from the swizzled smem tiles; the rest of the kernel is shared.
// PIPE (with WG): tile t-1's P V runs on the tensor cores during tile t's softmax. Per tile a warpgroup
// commits S(t) = Q K(t)^T, then P(t-1) V(t-1) (P kept in registers as bf16 fragments), waits for S(t)
// only, forms tile t's exponentials and row sums, then waits for P V and rescales O: the same operations
// on O in the same order as without PIPE (the same output bit for bit). V is triple-buffered (V(t-1)
// is still read while V(t+1) lands); the P V issue is unconditional (at t = 0 a zero P on a zeroed V
// buffer): under a branch ptxas would serialize the kernel's warpgroup MMAs.
template <int DH, bool WG = false> struct FwdCfg {
    static constexpr int MT = DH == 64 && !WG ? 2 : 1;  // dh 128 has no registers for a second row tile
    static constexpr int THREADS = FWD_BM / (16 * MT) * 32;
    // dh 64: 3 would cap mma.sync at 168 registers (spills); the warpgroup path needs ~126 at 256 threads
    static constexpr int MIN_BLOCKS = DH == 64 ? 2 : 1;
};

template <int DH, bool WG = false, bool PIPE = false>
__global__ void __launch_bounds__(FwdCfg<DH, WG>::THREADS, FwdCfg<DH, WG>::MIN_BLOCKS)
fwd_kernel(const __nv_bfloat16 *__restrict__ q, const __nv_bfloat16 *__restrict__ k,
           const __nv_bfloat16 *__restrict__ v, const float *__restrict__ c, __nv_bfloat16 *__restrict__ o,
           float *__restrict__ lse, int H, int T, const int *__restrict__ kv_first) {
    constexpr int BM = FWD_BM, BN = FWD_BN, MT = FwdCfg<DH, WG>::MT, NT = FwdCfg<DH, WG>::THREADS;
    constexpr int NV = PIPE ? 3 : 2;  // V buffers
    static_assert(!WG || (DH == 64 && MT == 1), "warpgroup path: 128-byte smem rows, 16 rows per warp");
    static_assert(!PIPE || WG, "pipelined P V: warpgroup path");
    extern __shared__ __align__(1024) unsigned char fwd_smem[];  // 1024: the 128-byte swizzle's period
    __nv_bfloat16 *Qs = reinterpret_cast<__nv_bfloat16 *>(fwd_smem);
    __nv_bfloat16 *Ks = Qs + BM * DH;          // [2][BN][DH]
    __nv_bfloat16 *Vs = Ks + 2 * BN * DH;      // [NV][BN][DH]
    float *nbs = reinterpret_cast<float *>(Vs + NV * BN * DH);  // [2][BN]: -(c_j - c_ref) log2e
    float *crefs = nbs + 2 * BN;                                // [2]

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tq = lane & 3;
    const int nqb = gridDim.x;
    const int mb = nqb - 1 - blockIdx.x;  // longest rows first
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const size_t head_off = (size_t)bh * T;
    const __nv_bfloat16 *qh = q + head_off * DH, *kh = k + head_off * DH, *vh = v + head_off * DH;
    const float *ch = c + head_off;
    const int q0 = mb * BM;

    const int n_last = min((T - 1) / BN, (q0 + BM - 1) / BN);
    const int n_first = kv_first ? kv_first[(size_t)bh * nqb + mb] * (FOX_ATTN_ACP_BLOCK / BN) : 0;
    const int ntiles = n_last - n_first + 1;

    // Loader threads tid < BN fetch c for the next key tile; its nb_j goes to smem after this tile's math.
    auto fetch_c = [&](int n, float &cj, float &cref) {
        const int j = n * BN + tid;
        cref = ch[n * BN];
        cj = tid < BN && j < T ? ch[j] : cref;
    };
    auto store_c = [&](int buf, float cj, float cref) {
        if (tid < BN) nbs[buf * BN + tid] = -(cj - cref) * LOG2E;
        if (tid == 0) crefs[buf] = cref;
    };

    if constexpr (PIPE) {  // V buffer 2: the operand of the zero P V issued with tile 0
        uint4 *z = reinterpret_cast<uint4 *>(Vs + 2 * BN * DH);
        for (int i = tid; i < BN * DH / 8; i += NT) z[i] = make_uint4(0u, 0u, 0u, 0u);
    }
    load_tile_async<DH, BM, NT>(Qs, qh, DH, q0, T, tid);
    load_tile_async<DH, BN, NT>(Ks, kh, DH, n_last * BN, T, tid);
    load_tile_async<DH, BN, NT>(Vs, vh, DH, n_last * BN, T, tid);
    cp_async_commit();
    {
        float cj, cref;
        fetch_c(n_last, cj, cref);
        store_c(0, cj, cref);
    }

    // this thread's query rows: row[mt][0] = g and row[mt][1] = g + 8 of row tile mt
    int row[MT][2];
    float crow[MT][2], m[MT][2], l[MT][2];  // gate, running max (log2 units), running sum
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            row[mt][hf] = q0 + (warp * MT + mt) * 16 + g + 8 * hf;
            crow[mt][hf] = row[mt][hf] < T ? ch[row[mt][hf]] : 0.f;
            m[mt][hf] = -INFINITY;
            l[mt][hf] = 0.f;
        }
    const float sl2 = LOG2E / sqrtf((float)DH);

    uint32_t qf[MT][DH / 16][4];
    uint32_t pprev[BN / 16][4];  // PIPE: tile t-1's P as bf16 A fragments (zero before tile 0)
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++) pprev[kk][0] = pprev[kk][1] = pprev[kk][2] = pprev[kk][3] = 0u;
    float oacc[MT][DH / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < DH / 8; i++) oacc[mt][i][0] = oacc[mt][i][1] = oacc[mt][i][2] = oacc[mt][i][3] = 0.f;

    for (int it = 0; it < ntiles; it++) {
        const int n = n_last - it, buf = it & 1, vbuf = PIPE ? it % 3 : buf;
        cp_async_wait_all();
        if constexpr (WG) fence_proxy_async_smem();  // cp.async writes -> wgmma reads
        __syncthreads();
        const bool more = it + 1 < ntiles;
        float cj_next = 0.f, cref_next = 0.f;
        if (more) {
            load_tile_async<DH, BN, NT>(Ks + (buf ^ 1) * BN * DH, kh, DH, (n - 1) * BN, T, tid);
            load_tile_async<DH, BN, NT>(Vs + (PIPE ? (it + 1) % 3 : buf ^ 1) * BN * DH, vh, DH, (n - 1) * BN, T, tid);
            cp_async_commit();
            fetch_c(n - 1, cj_next, cref_next);
        }
        if (!WG && it == 0) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int kk = 0; kk < DH / 16; kk++) load_a<DH>(qf[mt][kk], Qs, (warp * MT + mt) * 16, kk * 16, lane);
        }
        const __nv_bfloat16 *Kb = Ks + buf * BN * DH, *Vb = Vs + vbuf * BN * DH;
        const float *nb = nbs + buf * BN;

        float s[MT][BN / 8][4];
        if constexpr (WG) {
            const int w4 = warp >> 2;
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < DH / 16; kk++)
                wgmma_m64n64_ss<0, 0>(s[0], gmma_desc(Qs + w4 * 64 * DH + kk * 16), gmma_desc(Kb + kk * 16), kk > 0);
            if constexpr (PIPE) {  // then tile t-1's P V; only S is waited for here
                wg_commit();
                const __nv_bfloat16 *Vp = Vs + ((it + 2) % 3) * BN * DH;
#pragma unroll
                for (int kk = 0; kk < BN / 16; kk++) wgmma_m64n64_rs<1>(oacc[0], pprev[kk], gmma_desc(Vp + kk * 16 * DH));
                wg_commit();
                wg_wait<1>();
            } else {
                wg_commit_wait();
            }
        } else {
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int i = 0; i < BN / 8; i++) s[mt][i][0] = s[mt][i][1] = s[mt][i][2] = s[mt][i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < DH / 16; kk++) {
#pragma unroll
            for (int np = 0; np < BN / 16; np++) {
                uint32_t bf[4];
                load_b_nk<DH>(bf, Kb, np * 16, kk * 16, lane);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma16816(s[mt][2 * np], qf[mt][kk], bf[0], bf[1]);
                    mma16816(s[mt][2 * np + 1], qf[mt][kk], bf[2], bf[3]);
                }
            }
        }
        }

        const bool diag = n * BN + BN - 1 > q0;
        const float cref = crefs[buf];
        float nbj[BN / 4];  // this thread's key columns: nt * 8 + 2 * tq + e
#pragma unroll
        for (int nt = 0; nt < BN / 8; nt++) {
            nbj[2 * nt] = nb[nt * 8 + 2 * tq];
            nbj[2 * nt + 1] = nb[nt * 8 + 2 * tq + 1];
        }
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            // t = s log2e - a_i: the log2 score without the row's own gate term; element e + 2 hf is row hf
            float mt_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
                for (int x = 0; x < 4; x++) {
                    const int hf = x >> 1, j = n * BN + nt * 8 + 2 * tq + (x & 1);
                    float t = fmaf(s[mt][nt][x], sl2, nbj[2 * nt + (x & 1)]);
                    if (diag && j > row[mt][hf]) t = -INFINITY;
                    s[mt][nt][x] = t;
                    mt_max[hf] = fmaxf(mt_max[hf], t);
                }
            float sh[2], al[2], ps[2] = {0.f, 0.f};
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const float a = (crow[mt][hf] - cref) * LOG2E;
                const float mn = fmaxf(m[mt][hf], a + quad_max(mt_max[hf]));
                // Rows with nothing live yet keep max -inf: shift by 0 so exp2 sees -inf, not NaN.
                sh[hf] = mn == -INFINITY ? 0.f : mn - a;
                al[hf] = mn == -INFINITY ? 1.f : ex2(m[mt][hf] - mn);
                m[mt][hf] = mn;
            }
#pragma unroll
            for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
                for (int x = 0; x < 4; x++) {
                    s[mt][nt][x] = ex2(s[mt][nt][x] - sh[x >> 1]);
                    ps[x >> 1] += s[mt][nt][x];
                }
#pragma unroll
            for (int hf = 0; hf < 2; hf++) l[mt][hf] = l[mt][hf] * al[hf] + ps[hf];  // quad-reduced at the end
            if constexpr (PIPE) wg_wait<0>();  // tile t-1's P V has landed in O
#pragma unroll
            for (int i = 0; i < DH / 8; i++)
#pragma unroll
                for (int x = 0; x < 4; x++) oacc[mt][i][x] *= al[x >> 1];
        }
        if constexpr (PIPE) {
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) acc_to_a(pprev[kk], s[0][2 * kk], s[0][2 * kk + 1]);
        } else if constexpr (WG) {
            uint32_t pa[BN / 16][4];
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) acc_to_a(pa[kk], s[0][2 * kk], s[0][2 * kk + 1]);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) wgmma_m64n64_rs<1>(oacc[0], pa[kk], gmma_desc(Vb + kk * 16 * DH));
            wg_commit_wait();
        } else
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            uint32_t pa[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) acc_to_a(pa[mt], s[mt][2 * kk], s[mt][2 * kk + 1]);
#pragma unroll
            for (int np = 0; np < DH / 16; np++) {
                uint32_t bf[4];
                load_b_kn<DH>(bf, Vb, kk * 16, np * 16, lane);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma16816(oacc[mt][2 * np], pa[mt], bf[0], bf[1]);
                    mma16816(oacc[mt][2 * np + 1], pa[mt], bf[2], bf[3]);
                }
            }
        }
        if (more) store_c(buf ^ 1, cj_next, cref_next);
    }

    if constexpr (PIPE) {  // the last tile's P V
        const __nv_bfloat16 *Vp = Vs + ((ntiles - 1) % 3) * BN * DH;
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) wgmma_m64n64_rs<1>(oacc[0], pprev[kk], gmma_desc(Vp + kk * 16 * DH));
        wg_commit_wait();
    }
    const size_t ld_o = (size_t)H * DH;
    __nv_bfloat16 *ob = o + (size_t)b * T * ld_o + (size_t)h * DH;
    constexpr float LN2 = 0.6931471805599453f;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int r = row[mt][hf];
            const float lsum = quad_sum(l[mt][hf]), inv = 1.f / lsum;
            if (r >= T) continue;
#pragma unroll
            for (int nt = 0; nt < DH / 8; nt++)
                *reinterpret_cast<uint32_t *>(ob + r * ld_o + nt * 8 + 2 * tq) =
                    pack_bf16(oacc[mt][nt][2 * hf] * inv, oacc[mt][nt][2 * hf + 1] * inv);
            if (tq == 0) lse[head_off + r] = (m[mt][hf] + log2f(lsum)) * LN2;
        }
}

// ---------------------------------------------------------------------------------------------
// Backward, step 1: D_i = dO_i . o_i in fp32 (both in (B, T, H, dh)); one warp per (b, t, h) row.
template <int DH>
__global__ void dot_do_o_kernel(const __nv_bfloat16 *__restrict__ dout, const __nv_bfloat16 *__restrict__ o,
                                float *__restrict__ D, int H, int T, int rows) {
    const int row = blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= rows) return;
    const __nv_bfloat162 *a = reinterpret_cast<const __nv_bfloat162 *>(dout + (size_t)row * DH);
    const __nv_bfloat162 *x = reinterpret_cast<const __nv_bfloat162 *>(o + (size_t)row * DH);
    float sum = 0.f;
#pragma unroll
    for (int i = lane; i < DH / 2; i += 32) {
        const float2 fa = __bfloat1622float2(a[i]), fx = __bfloat1622float2(x[i]);
        sum += fa.x * fx.x + fa.y * fx.y;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane == 0) {
        const int h = row % H, bt = row / H, b = bt / T, t = bt % T;
        D[((size_t)b * H + h) * T + t] = sum;
    }
}

// One halving step: lanes with bit M set keep the upper N/2 values, the others the lower N/2, each
// adding its partner's copy of the half it keeps.
template <int N, int M> __device__ __forceinline__ void halve_and_add(float v[], int lane) {
    const bool upper = lane & M;
#pragma unroll
    for (int i = 0; i < N / 2; i++) {
        const float lo = v[i], hi = v[i + N / 2];
        const float send = upper ? lo : hi, keep = upper ? hi : lo;
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, M);
    }
}
// Sums N per-thread values (v[c] belongs to column (c/2)*8 + 2*tq + c%2 of an accumulator tile) over the
// 8 lanes that share tq, halving the live values each step (reduce-scatter): afterwards v[i], i < N/8,
// holds the warp's total for value index g*(N/8) + i.
template <int N> __device__ __forceinline__ void warp_column_sums(float v[N], int lane) {
    halve_and_add<N, 16>(v, lane);
    halve_and_add<N / 2, 8>(v, lane);
    halve_and_add<N / 4, 4>(v, lane);
}

// How the backward adds dQ and the dc row sums across key blocks. BWD_ATOMIC: fp32 atomics in whatever
// order they land (not deterministic; kept to time the order's cost). BWD_ORDERED: the same adds, in
// a fixed order (see bwd_kernel). BWD_STAGGER: ordered, and half the warps do their dQ step before the
// tile's other work, so each scheduler has one warp computing while the other waits on memory.
// BWD_BLOCK: ordered, one thread per block polls and releases (see bwd_kernel). BWD_SYNC: ordered, a 9th
// "sync" warp alone waits on and releases the counters (see bwd_kernel). BWD_SYNC2: the same with two
// such warps, one releasing and one acquiring, so their latencies overlap. BWD_SYNC_NOWAIT: BWD_SYNC
// without the waits (a timing control, not deterministic). BWD_SYNC_LATE: a sync warp off the per-tile
// barrier, the dQ step after the tile's other work (see bwd_kernel). BWD_SYNC_WG: BWD_SYNC_LATE in a
// 384-thread block whose third warpgroup holds the sync warp and gives its registers to the two compute
// warpgroups (setmaxnreg: 240 / 24 instead of 168 for all), and each compute warpgroup waits for the sync
// warp's acquire on its own named barrier (2, 3) instead of one shared by all 8 compute warps, so the two
// warpgroups do not wait on each other there (the public default at dh 64 on Hopper until BWD_SYNC_WG_PIPE).
// BWD_ATOMIC_EARLY: BWD_ATOMIC with the dQ step before the tile's other work (a timing control).
// BWD_SYNC_WG_FULLBAR: BWD_SYNC_WG with BWD_SYNC_LATE's single barrier 2 (all 8 compute warps meet the sync
// warp before their adds); BWD_SYNC_LATE_WGBAR: BWD_SYNC_LATE (288 threads, 168 registers) with BWD_SYNC_WG's
// barrier per warpgroup. Both are controls.
// Measured (H200, T 16k, dh 64, backward TFLOP/s): mma.sync ATOMIC 231, ORDERED 183, STAGGER 205, BLOCK 179;
// wgmma ATOMIC 317, ATOMIC_EARLY 290, BLOCK 215, SYNC 276, SYNC2 278, SYNC_NOWAIT 276, SYNC_LATE 277. The
// sync-warp kernels are held back by registers, not by the order: ptxas sizes a 288-thread block as 12
// warps (3 per SM sub-partition), so the compute warps get 168 registers instead of 210-222 (NOTES.md).
// H100, session 4 (same run, backward TFLOP/s, T 16k, dh 64): ATOMIC 322, SYNC_LATE 279, SYNC_WG_FULLBAR 283,
// SYNC_LATE_WGBAR 303, SYNC_WG 307: the loss was mostly SYNC_LATE's barrier 2, which made the two compute
// warpgroups meet once more per tile; registers were worth ~1%.
// BWD_SYNC_WG_PIPE / BWD_ATOMIC_PIPE: BWD_SYNC_WG / BWD_ATOMIC with the warpgroup MMAs pipelined across
// the tile's steps (see bwd_kernel): tile it-1's dQ product runs on the tensor cores during tile it's
// softmax work, and tile it's dV/dK products during tile it-1's dQ adds. The public defaults at dh 64 on
// Hopper (deterministic / not). Same results bit for bit as without the pipelining.
// H100, session 5 (same run, backward TFLOP/s, T 16k, dh 64): SYNC_WG 308, SYNC_WG_PIPE 327, ATOMIC_PIPE 340.
enum {
    BWD_ATOMIC = 0, BWD_ORDERED = 1, BWD_STAGGER = 2, BWD_BLOCK = 3, BWD_SYNC = 4, BWD_SYNC2 = 5, BWD_SYNC_NOWAIT = 6,
    BWD_SYNC_LATE = 7, BWD_ATOMIC_EARLY = 8, BWD_SYNC_WG = 9, BWD_SYNC_WG_FULLBAR = 10, BWD_SYNC_LATE_WGBAR = 11,
    BWD_SYNC_WG_PIPE = 12, BWD_ATOMIC_PIPE = 13
};
// threads per backward block: BWD_SYNC / BWD_SYNC2 add one / two sync warps to the NWARPS compute warps
constexpr int bwd_threads(int mode) {
    return mode == BWD_SYNC || mode == BWD_SYNC_NOWAIT || mode == BWD_SYNC_LATE || mode == BWD_SYNC_LATE_WGBAR
               ? NTHREADS + 32
           : mode == BWD_SYNC2                                                   ? NTHREADS + 64
           : mode == BWD_SYNC_WG || mode == BWD_SYNC_WG_FULLBAR || mode == BWD_SYNC_WG_PIPE ? NTHREADS + 128
                                                                                 : NTHREADS;
}

__device__ __forceinline__ void atomic_add2(float *p, float x, float y) {
#if __CUDA_ARCH__ >= 900
    atomicAdd(reinterpret_cast<float2 *>(p), make_float2(x, y));
#else
    atomicAdd(p, x);
    atomicAdd(p + 1, y);
#endif
}

// Cross-block ordering for the deterministic dQ / dc accumulation (see bwd_kernel).
__device__ __forceinline__ int ld_acquire_gpu(const int *p) {
    int v;
    asm volatile("ld.global.acquire.gpu.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ int ld_relaxed_gpu(const int *p) {
    int v;
    asm volatile("ld.global.relaxed.gpu.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;\n" ::: "memory"); }
__device__ __forceinline__ void red_release_gpu_add(int *p, int v) {
    asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
// Warpgroup register reallocation (sm_90a; BWD_SYNC_WG): every warp of a warpgroup runs the same one.
template <int N> __device__ __forceinline__ void setmaxnreg_inc() {
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
template <int N> __device__ __forceinline__ void setmaxnreg_dec() {
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
// Named barrier 1 between the compute warps (arrive, no wait) and the sync warp (waits) of BWD_SYNC.
__device__ __forceinline__ void named_bar_arrive(int id, int nthreads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(nthreads) : "memory");
}
__device__ __forceinline__ void named_bar_sync(int id, int nthreads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(nthreads) : "memory");
}
// Key block nb's place in the add order of ACP row m (the same for every query tile of the row), computed
// by one whole warp: `before` = live key blocks above nb in the row (its adds wait for all of theirs),
// `last` = no live key block below nb. Warp-uniform results.
__device__ __forceinline__ void acp_order(int m, int nb, const int *qlh, int lane, int &before, bool &last) {
    if (!qlh) {
        before = m - nb;
        last = nb == 0;
        return;
    }
    int above = 0, below = 0;
    for (int base = 0; base <= m; base += 32) {
        const int n2 = base + lane;
        if (n2 <= m && n2 != nb && max(qlh[n2], n2) >= m) {
            above += n2 > nb;
            below += n2 < nb;
        }
    }
    before = __reduce_add_sync(0xffffffffu, above);
    last = __reduce_add_sync(0xffffffffu, below) == 0;
}

// BWD_SYNC_WG register split (setmaxnreg): 2 compute warpgroups x 240 + the sync warpgroup x 24 =
// 64.5k of the 65536 registers (the 384-thread block starts at 168 each, 64.5k).
constexpr int BWD_SYNC_WG_REGS_COMPUTE = 240, BWD_SYNC_WG_REGS_SYNC = 24;

// Backward tile configuration: BM query rows per tile, MINB blocks per SM (register cap).
template <int DH> struct BwdCfg {
    static constexpr int BM = DH == 64 ? 64 : 32;  // dh 128: 32 keeps dK, dV and S^T in registers
    static constexpr int MINB = 1;
};

// Backward, step 2. Block = BWD_BN keys of one (b, h); warp w owns keys 16w..16w+15 and keeps their dK,
// dV in registers while query tiles of BM rows stream through (from the diagonal to the last live one).
// Per tile each warp forms S^T and dP^T for its keys, P^T, dS^T = P^T (dP^T - D), accumulates
// dV += P^T dO and dK += dS^T Q, and parks dS^T in smem (double-buffered); in the next iteration all
// warps compute dQ = dS K for that tile and add it to the fp32 accumulator (software-pipelined: one
// block barrier per tile).
// dc: dc_t = sum_j dS_tj - sum_i dS_it. The row sum would vanish in exact arithmetic (softmax is shift
// invariant), but D is formed from the bf16-rounded o, and that rounding error e_t enters both sums:
// dc_t picks up -e_t + sum_i P_it e_i. Summed into dlogf the two parts cancel; with the column sum alone
// they random-walk (3e-2 relative error in dlogf at T = 1000). So both sums are kept, in fp32: column
// sums in registers (written to `colsum`, one writer per key), row sums reduced across the block.
//
// Determinism (BWD_ORDERED, BWD_STAGGER): the dQ and dc-row-sum contributions of the key blocks to a
// query tile are fp32 atomic adds (fire and forget, into a zeroed accumulator), but issued in a fixed
// order, highest key block first, so each address sees the same sequence of adds every run. A per-tile
// counter `sem` orders them: every warp of key block n waits (acquire) until all warps of the live key
// blocks above n in the tile's ACP row have released, adds, and releases one tile later (by then its
// adds have landed, so the release costs no wait). Blocks are launched highest key block first
// (blockIdx.x reversed), so a block only ever waits on blocks launched before it (no deadlock whatever
// the occupancy), and block n+1 reaches each query tile one ACP row before block n does, so the waits
// are short. dK, dV and the column sums are per-block register sums: deterministic by construction.
// BWD_BLOCK: the same order, kept per block instead of per warp: thread 0 reads the counter of tile it
// (relaxed) while the tile is computed, checks it at the end (fence.acq_rel, or spins with acquire)
// before the barrier after which every warp adds tile it; and releases tile it-2 right after the
// barrier that follows all warps' adds of it. Both sit on the block's critical path (about 1 us a tile).
// BWD_SYNC: the same order as BWD_BLOCK, with the counters taken off the compute warps' path: a 9th warp
// (the sync warp, NWARPS * 32 + 32 threads per block) joins the per-tile block barrier and does nothing
// else. In iteration it, after barrier it, it waits on named barrier 1, which every compute warp arrives
// at (without waiting) once it has issued tile it-1's adds, releases tile it-1, then acquires tile it
// (spins until the live key blocks above have released it) before it arrives at barrier it+1, after
// which the compute warps add tile it. Its fence and spin stall only itself. BWD_SYNC2: warp NWARPS
// only releases, warp NWARPS + 1 only acquires (from barrier it on, in parallel with the release).
// BWD_SYNC_LATE: the sync warp stays off the per-tile barrier (the compute warps use barrier 0 with a
// count of NWARPS * 32), and the dQ step of tile it-1 comes after tile it's other work (as in
// BWD_ATOMIC). Per tile t the sync warp acquires t, arrives at named barrier 2 (which the compute warps
// wait on just before adding t, after its dQ product), waits on named barrier 1 (every compute warp has
// issued its adds of t), releases t, and moves on to t+1: it has a whole tile's work for release and
// acquire, and neither its fence nor its spin is on the compute warps' path unless a predecessor is late.
// BWD_SYNC_WG: the same protocol; warps NWARPS..NWARPS+3 form a third warpgroup that runs setmaxnreg.dec
// (then all but warp NWARPS exit), the compute warpgroups setmaxnreg.inc: ptxas caps the 384-thread
// block at 168 registers per thread at entry and compiles the compute path for BWD_SYNC_WG_REGS_COMPUTE
// (highest register R194 in the SASS). Barrier 2 is split per warpgroup: the sync warp arrives at 2 and 3 (128 + 32 each), compute
// warpgroup w4 syncs on 2 + w4. Each warpgroup adds only its own dQ columns (and warpgroup 0 the dc row
// sums), so every address still sees this block's adds of a tile between the same acquire and release,
// and the sync warp still waits (barrier 1) for all 8 compute warps' adds before it releases.
// WG: the five products on Hopper warpgroup MMA (sm_90a; dh 64, BM 64): warpgroup w4 (warps 4w4..4w4+3)
// owns keys 64 w4.., so every accumulator keeps the mma.sync layout and the rest of the kernel is shared.
// PIPE (BWD_SYNC_WG_PIPE, BWD_ATOMIC_PIPE): per tile it a warpgroup commits three MMA groups, S^T/dP^T of
// tile it, then dQ of tile it-1, then dV/dK of tile it, and waits for each only where its result is
// needed: S^T/dP^T before the softmax step (dQ keeps running), dQ before its adds (dV/dK keep running),
// dV/dK before the next tile's barrier (their register operands, and the Q/dO buffer the next prefetch
// overwrites). The dQ issue is unconditional (at it = 0 on a zeroed dS^T buffer, result unused): ptxas
// serializes every warpgroup MMA of the kernel when the issue sits under a branch (C7514).
template <int DH, int BM, int MINB, int MODE, bool WG>
__global__ void __launch_bounds__(bwd_threads(MODE), MINB)
bwd_kernel(const __nv_bfloat16 *__restrict__ q, const __nv_bfloat16 *__restrict__ k,
           const __nv_bfloat16 *__restrict__ v, const float *__restrict__ c,
           const __nv_bfloat16 *__restrict__ dout, const float *__restrict__ lse, const float *__restrict__ Dg,
           float *__restrict__ dq_acc, __nv_bfloat16 *__restrict__ dk,
           __nv_bfloat16 *__restrict__ dv, float *__restrict__ dc, float *__restrict__ colsum, int *__restrict__ sem,
           int H, int T, const int *__restrict__ q_last) {
    constexpr int BN = BWD_BN, TPB = FOX_ATTN_ACP_BLOCK / BM;  // TPB query tiles per ACP row
    static_assert(FOX_ATTN_ACP_BLOCK % BM == 0, "query tiles nest in the ACP grid");
    static_assert(!WG || (DH == 64 && BM == 64), "warpgroup path: 128-byte smem rows");
    extern __shared__ __align__(1024) unsigned char bwd_smem[];  // 1024: the 128-byte swizzle's period
    __nv_bfloat16 *Ks = reinterpret_cast<__nv_bfloat16 *>(bwd_smem);  // [BN][DH]
    __nv_bfloat16 *Vs = Ks + BN * DH;                                   // [BN][DH]
    __nv_bfloat16 *Qs = Vs + BN * DH;                                   // [2][BM][DH]
    __nv_bfloat16 *dOs = Qs + 2 * BM * DH;                              // [2][BM][DH]
    __nv_bfloat16 *dSt = dOs + 2 * BM * DH;                             // [2][BN][BM]: dS^T
    float *rs = reinterpret_cast<float *>(dSt + 2 * BN * BM);           // [2][BM]: a_i - lse_i log2e
    float *Ds = rs + 2 * BM;                                            // [2][BM]
    float *rowsum = Ds + 2 * BM;                                        // [2][NWARPS][BM]: dS row sums

    const int tid = threadIdx.x, lane = tid & 31;
    const int warp = __shfl_sync(0xffffffffu, tid >> 5, 0), w4 = warp >> 2;  // shfl: provably warp-uniform
    const int g = lane >> 2, tq = lane & 3;
    const int nblk = gridDim.x;
    const int nb = nblk - 1 - blockIdx.x;  // key block: highest first (see above)
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const size_t head_off = (size_t)bh * T;
    const __nv_bfloat16 *qh = q + head_off * DH, *kh = k + head_off * DH, *vh = v + head_off * DH;
    const float *ch = c + head_off, *lh = lse + head_off, *Dh = Dg + head_off;
    const size_t ld_o = (size_t)H * DH;
    const __nv_bfloat16 *doh = dout + (size_t)b * T * ld_o + (size_t)h * DH;
    float *dqh = dq_acc + head_off * DH;
    const int k0 = nb * BN;
    const float c_ref = ch[k0];

    const int nqt = (T + BM - 1) / BM;
    const int *qlh = q_last ? q_last + (size_t)bh * nblk : nullptr;
    // ACP: the diagonal tile is always live (every query row needs it), so a block covers at least it
    const int m_last = qlh ? min(nblk - 1, max(qlh[nb], nb)) : nblk - 1;
    const int qt_first = k0 / BM;
    const int qt_last = min(nqt - 1, (m_last + 1) * TPB - 1);
    const int ntiles = qt_last - qt_first + 1;
    int *semh = sem + (size_t)bh * nqt;

    constexpr bool PIPE = MODE == BWD_SYNC_WG_PIPE || MODE == BWD_ATOMIC_PIPE;  // pipelined warpgroup MMAs
    constexpr bool REGS = MODE == BWD_SYNC_WG || MODE == BWD_SYNC_WG_FULLBAR || MODE == BWD_SYNC_WG_PIPE;  // setmaxnreg
    constexpr bool WGBAR = MODE == BWD_SYNC_WG || MODE == BWD_SYNC_LATE_WGBAR || MODE == BWD_SYNC_WG_PIPE;  // barrier 2 per wg
    constexpr bool LATE = MODE == BWD_SYNC_LATE || REGS || MODE == BWD_SYNC_LATE_WGBAR;
    constexpr bool SYNCW = MODE == BWD_SYNC || MODE == BWD_SYNC2 || MODE == BWD_SYNC_NOWAIT || LATE;
    static_assert(!REGS || WG, "BWD_SYNC_WG: setmaxnreg needs the sm_90a warpgroup path");
    static_assert(!WGBAR || WG, "per-warpgroup barriers: a warpgroup adds its own dQ columns (warpgroup path)");
    static_assert(!PIPE || WG, "pipelined MMAs: warpgroup path");
    if constexpr (LATE) {
        if (warp >= NWARPS) {  // the sync warp (see above); BWD_SYNC_WG: its warpgroup gives registers back
            if constexpr (REGS) setmaxnreg_dec<BWD_SYNC_WG_REGS_SYNC>();
            if (warp != NWARPS) return;  // BWD_SYNC_WG: warps NWARPS+1.. have nothing to do
            int ord_row = -1, before = 0;
            bool last = false;
            for (int t = qt_first; t <= qt_last; t++) {
                const int m = t / TPB;
                if (m != ord_row) {
                    ord_row = m;
                    acp_order(m, nb, qlh, lane, before, last);
                }
                if (lane == 0 && before > 0) {
                    unsigned spins = 0;
                    while (ld_acquire_gpu(semh + t) < before) {
                        __nanosleep(32);
                        if (++spins > (1u << 27)) __trap();  // a missing predecessor: fail loudly, never hang
                    }
                }
                __syncwarp();
                if constexpr (WGBAR) {  // t acquired: each compute warpgroup may add it, independently
                    named_bar_arrive(2, 128 + 32);
                    named_bar_arrive(3, 128 + 32);
                } else {
                    named_bar_arrive(2, NTHREADS + 32);  // t acquired: the compute warps may add it
                }
                named_bar_sync(1, NTHREADS + 32);    // every compute warp has issued its adds of t
                if (lane == 0) red_release_gpu_add(semh + t, 1);
                __syncwarp();
            }
            return;
        }
        if constexpr (REGS) setmaxnreg_inc<BWD_SYNC_WG_REGS_COMPUTE>();
    } else if constexpr (SYNCW) {
        if (warp >= NWARPS) {  // the sync warp(s) (see above): the compute warps never touch the counters
            const bool rel = warp == NWARPS, acq = MODE != BWD_SYNC2 || warp == NWARPS + 1;
            int ord_row = -1, before = 0;
            bool last = false;
            for (int it = 0; it <= ntiles; it++) {
                __syncthreads();  // barrier it
                if (rel && it > 0) {
                    named_bar_sync(1, NTHREADS + 32);  // every compute warp has issued tile it-1's adds
                    if (lane == 0) red_release_gpu_add(semh + qt_first + it - 1, 1);
                }
                if (acq && it < ntiles) {
                    const int m = (qt_first + it) / TPB;
                    if (m != ord_row) {
                        ord_row = m;
                        acp_order(m, nb, qlh, lane, before, last);
                    }
                    if (MODE == BWD_SYNC_NOWAIT && lane == 0 && before > 0) {
                        (void)ld_acquire_gpu(semh + qt_first + it);  // the load, without waiting on it
                    } else if (lane == 0 && before > 0) {
                        unsigned spins = 0;
                        while (ld_acquire_gpu(semh + qt_first + it) < before) {
                            __nanosleep(32);
                            if (++spins > (1u << 27)) __trap();  // a missing predecessor: fail loudly, never hang
                        }
                    }
                }
                __syncwarp();
            }
            return;
        }
    }

    // Loader threads tid < BM fetch per-query values; rows past T get lse = +inf so their P is 0.
    auto fetch_rows = [&](int qt, float &r, float &d) {
        const int i = qt * BM + tid;
        if (tid < BM) {
            const bool ok = i < T;
            r = ok ? (ch[i] - c_ref) * LOG2E - lh[i] * LOG2E : -INFINITY;
            d = ok ? Dh[i] : 0.f;
        }
    };
    auto store_rows = [&](int buf, float r, float d) {
        if (tid < BM) {
            rs[buf * BM + tid] = r;
            Ds[buf * BM + tid] = d;
        }
    };

    if constexpr (PIPE) {  // dS^T buffer 1: the operand of the unused dQ product issued in iteration 0
        uint4 *z = reinterpret_cast<uint4 *>(dSt + BN * BM);
        for (int i = tid; i < BN * BM / 8; i += NTHREADS) z[i] = make_uint4(0u, 0u, 0u, 0u);
    }
    load_tile_async<DH, BN>(Ks, kh, DH, k0, T, tid);
    load_tile_async<DH, BN>(Vs, vh, DH, k0, T, tid);
    load_tile_async<DH, BM>(Qs, qh, DH, qt_first * BM, T, tid);
    load_tile_async<DH, BM>(dOs, doh, (int)ld_o, qt_first * BM, T, tid);
    cp_async_commit();
    {
        float r = 0.f, d = 0.f;
        fetch_rows(qt_first, r, d);
        store_rows(0, r, d);
    }

    const int j0 = k0 + warp * 16 + g, j1 = j0 + 8;  // this thread's two keys
    const float nb0 = -((j0 < T ? ch[j0] : c_ref) - c_ref) * LOG2E;
    const float nb1 = -((j1 < T ? ch[j1] : c_ref) - c_ref) * LOG2E;
    const float sl2 = LOG2E / sqrtf((float)DH);
    const float scale = 1.f / sqrtf((float)DH);

    float dka[DH / 8][4], dva[DH / 8][4];
#pragma unroll
    for (int i = 0; i < DH / 8; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) dka[i][e] = dva[i][e] = 0.f;
    float cs0 = 0.f, cs1 = 0.f;  // column sums of dS for keys j0, j1

    // dQ work split: warp owns query rows rg*16.. and DQC dh-columns of each tile.
    constexpr int RG = BM / 16, DQC = DH * RG / NWARPS;
    static_assert(DQC % 16 == 0, "dQ column split");
    const int dq_r = (warp % RG) * 16, dq_c = (warp / RG) * DQC;
    int ord_m = -1, ord_before = 0;  // ACP row of the cached order; live key blocks above nb in it
    bool ord_last = false;           // no live key block below nb in it
    int *pending = nullptr;          // counter this warp still has to release (one tile later)
    const bool early = (MODE == BWD_STAGGER && warp < NWARPS / 2) || MODE == BWD_BLOCK || MODE == BWD_ATOMIC_EARLY ||
                       (SYNCW && !LATE);
    // this block's place in the order for ACP row m (same for every tile of the row); warp-uniform
    auto ord_update = [&](int m) {
        if (m == ord_m) return;
        ord_m = m;
        acp_order(m, nb, qlh, lane, ord_before, ord_last);
    };

    // dQ of tile it-1 = dS K from its parked dS^T. WG: warpgroup w4 takes all 64 query rows and dh columns
    // 32 w4..; A = dS (dS^T in smem: MN-major), B = K (MN-major); issued only (the caller fences, commits
    // and waits).
    auto dq_mma_issue = [&](int it, float (&dqa)[DQC / 8][4]) {
        const __nv_bfloat16 *dSb = dSt + ((it - 1) & 1) * BN * BM;
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++)
            wgmma_m64n32_ss<1, 1>(dqa, gmma_desc(dSb + kk * 16 * BM), gmma_desc(Ks + kk * 16 * DH + w4 * 32), kk > 0);
    };
    // dQ (and dc row sums) of tile it-1 added to the fp32 accumulators (dqa: its dQ product, complete).
    auto dq_phase = [&](int it, float (&dqa)[DQC / 8][4]) {
        const int pb = (it - 1) & 1, qt = qt_first + it - 1, i0 = qt * BM;
        const __nv_bfloat16 *dSb = dSt + pb * BN * BM;
        if constexpr (WG && !PIPE) {
            wg_fence();
            dq_mma_issue(it, dqa);
            wg_commit_wait();
        } else if constexpr (!WG) {
#pragma unroll
            for (int i = 0; i < DQC / 8; i++) dqa[i][0] = dqa[i][1] = dqa[i][2] = dqa[i][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) {
                uint32_t a[4];
                load_a_trans<BM>(a, dSb, kk * 16, dq_r, lane);
#pragma unroll
                for (int np = 0; np < DQC / 16; np++) {
                    uint32_t bk[4];
                    load_b_kn<DH>(bk, Ks, kk * 16, dq_c + np * 16, lane);
                    mma16816(dqa[2 * np], a, bk[0], bk[1]);
                    mma16816(dqa[2 * np + 1], a, bk[2], bk[3]);
                }
            }
        }
        float rtot = 0.f;
        if (tid < BM) {
#pragma unroll
            for (int w = 0; w < NWARPS; w++) rtot += rowsum[(pb * NWARPS + w) * BM + tid];
        }
        int *sp = semh + qt;
        if (MODE == BWD_ORDERED || MODE == BWD_STAGGER) {
            // release the previous tile (its adds were issued an iteration ago, so the fence is cheap)
            if (pending) {
                __syncwarp();
                if (lane == 0) red_release_gpu_add(pending, 1);
                pending = nullptr;
            }
            ord_update(qt / TPB);
            if (ord_before > 0) {
                const int target = NWARPS * ord_before;
                unsigned spins = 0;
                while (ld_acquire_gpu(sp) < target) {
                    __nanosleep(64);
                    if (++spins > (1u << 27)) __trap();  // a missing predecessor: fail loudly, never hang
                }
            }
        }
        // the sync warp has acquired tile it-1 (WGBAR: a barrier per warpgroup, so the two warpgroups do not
        // wait on each other here)
        if (LATE) {
            if (WGBAR && w4 == 0) named_bar_sync(2, 128 + 32);  // constant ids: ptxas counts 4 barriers, not 16
            else if (WGBAR) named_bar_sync(3, 128 + 32);
            else named_bar_sync(2, NTHREADS + 32);
        }
        // fp32 adds; in the ordered modes every address sees its adds in one fixed order
        const int qr0 = i0 + dq_r + g;
#pragma unroll
        for (int nt = 0; nt < DQC / 8; nt++) {
            const int col = dq_c + nt * 8 + 2 * tq;
            if (qr0 < T) atomic_add2(dqh + (size_t)qr0 * DH + col, dqa[nt][0], dqa[nt][1]);
            if (qr0 + 8 < T) atomic_add2(dqh + (size_t)(qr0 + 8) * DH + col, dqa[nt][2], dqa[nt][3]);
        }
        if (tid < BM && i0 + tid < T) atomicAdd(dc + head_off + i0 + tid, rtot);
        if ((MODE == BWD_ORDERED || MODE == BWD_STAGGER) && !ord_last) pending = sp;
        if (SYNCW) named_bar_arrive(1, NTHREADS + 32);  // this warp's adds of tile it-1 issued
    };

    float dqp[DQC / 8][4];  // dQ product of tile it-1 (PIPE: in flight during tile it's softmax work)
    for (int it = 0; it <= ntiles; it++) {
        const int buf = it & 1;
        cp_async_wait_all();
        if constexpr (WG) fence_proxy_async_smem();  // cp.async and dS^T writes -> wgmma reads
        // Q/dO/row stats of tile it ready; dS^T and row sums of tile it-1 complete
        if constexpr (LATE) named_bar_sync(0, NTHREADS);  // the compute warps only
        else __syncthreads();
        // BWD_BLOCK: every warp issued tile it-2's adds before this barrier (and long ago): release them
        if (MODE == BWD_BLOCK && tid == 0 && it >= 2) red_release_gpu_add(semh + qt_first + it - 2, 1);
        if (early && it > 0) dq_phase(it, dqp);
        const bool more = it + 1 < ntiles;
        float r_next = 0.f, d_next = 0.f;
        if (more) {
            const int i1 = (qt_first + it + 1) * BM;
            load_tile_async<DH, BM>(Qs + (buf ^ 1) * BM * DH, qh, DH, i1, T, tid);
            load_tile_async<DH, BM>(dOs + (buf ^ 1) * BM * DH, doh, (int)ld_o, i1, T, tid);
            cp_async_commit();
            fetch_rows(qt_first + it + 1, r_next, d_next);
        }
        // BWD_BLOCK: tile it's adds come in the next iteration, after the next barrier; thread 0 must have
        // seen the blocks above release it by then. Read the counter now, check it after this tile's work.
        int poll = 0;
        if (MODE == BWD_BLOCK && warp == 0 && it < ntiles) {
            ord_update((qt_first + it) / TPB);
            if (lane == 0 && ord_before > 0) poll = ld_relaxed_gpu(semh + qt_first + it);
        }
        if (it < ntiles) {
            const int i0 = (qt_first + it) * BM;
            const __nv_bfloat16 *Qb = Qs + buf * BM * DH, *dOb = dOs + buf * BM * DH;
            const float *rb = rs + buf * BM, *Db = Ds + buf * BM;
            __nv_bfloat16 *dSb = dSt + buf * BN * BM;

            float st[BM / 8][4], dpt[BM / 8][4];
            if constexpr (!WG) {
#pragma unroll
                for (int i = 0; i < BM / 8; i++)
#pragma unroll
                    for (int e = 0; e < 4; e++) st[i][e] = dpt[i][e] = 0.f;
            }
            if constexpr (WG) {
                // S^T = K Q^T, dP^T = V dO^T for this warpgroup's 64 keys (all operands K-major)
                wg_fence();
#pragma unroll
                for (int kk = 0; kk < DH / 16; kk++)
                    wgmma_m64n64_ss<0, 0>(st, gmma_desc(Ks + w4 * 64 * DH + kk * 16), gmma_desc(Qb + kk * 16), kk > 0);
#pragma unroll
                for (int kk = 0; kk < DH / 16; kk++)
                    wgmma_m64n64_ss<0, 0>(dpt, gmma_desc(Vs + w4 * 64 * DH + kk * 16), gmma_desc(dOb + kk * 16), kk > 0);
                if constexpr (PIPE) {  // tile it-1's dQ product queues behind; only S^T, dP^T are waited for
                    wg_commit();
                    dq_mma_issue(it, dqp);  // at it = 0 on the zeroed buffer, unused: no branch in the stage
                    wg_commit();
                    wg_wait<1>();
                } else {
                    wg_commit_wait();
                }
            } else {
#pragma unroll
                for (int kk = 0; kk < DH / 16; kk++) {
                    uint32_t ka[4], va[4];
                    load_a<DH>(ka, Ks, warp * 16, kk * 16, lane);
                    load_a<DH>(va, Vs, warp * 16, kk * 16, lane);
#pragma unroll
                    for (int np = 0; np < BM / 16; np++) {
                        uint32_t bq[4], bo[4];
                        load_b_nk<DH>(bq, Qb, np * 16, kk * 16, lane);
                        mma16816(st[2 * np], ka, bq[0], bq[1]);
                        mma16816(st[2 * np + 1], ka, bq[2], bq[3]);
                        load_b_nk<DH>(bo, dOb, np * 16, kk * 16, lane);
                        mma16816(dpt[2 * np], va, bo[0], bo[1]);
                        mma16816(dpt[2 * np + 1], va, bo[2], bo[3]);
                    }
                }
            }

            // P^T and dS^T in place: st <- P^T, dpt <- dS^T; rsum: this thread's part of dS row sums
            const bool diag = i0 < k0 + BN - 1;
            float rsum[BM / 4];
#pragma unroll
            for (int nt = 0; nt < BM / 8; nt++) {
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int col = nt * 8 + 2 * tq + e, i = i0 + col;
                    const float r = rb[col], d = Db[col];
                    float p0 = ex2(fmaf(st[nt][e], sl2, r + nb0));
                    float p1 = ex2(fmaf(st[nt][2 + e], sl2, r + nb1));
                    if (diag) {
                        if (j0 > i) p0 = 0.f;
                        if (j1 > i) p1 = 0.f;
                    }
                    const float ds0 = p0 * (dpt[nt][e] - d), ds1 = p1 * (dpt[nt][2 + e] - d);
                    cs0 += ds0;
                    cs1 += ds1;
                    rsum[2 * nt + e] = ds0 + ds1;
                    st[nt][e] = p0;
                    st[nt][2 + e] = p1;
                    dpt[nt][e] = ds0;
                    dpt[nt][2 + e] = ds1;
                }
            }
            if constexpr (WG) {
                // dV += P^T dO, dK += dS^T Q: A from registers, B = dO / Q (MN-major)
                uint32_t pa[BM / 16][4], sa[BM / 16][4];
#pragma unroll
                for (int kk = 0; kk < BM / 16; kk++) {
                    acc_to_a(pa[kk], st[2 * kk], st[2 * kk + 1]);
                    acc_to_a(sa[kk], dpt[2 * kk], dpt[2 * kk + 1]);
                    const int kr = warp * 16 + g, qc = kk * 16 + 2 * tq;
                    *reinterpret_cast<uint32_t *>(dSb + swz<BM>(kr, qc)) = sa[kk][0];
                    *reinterpret_cast<uint32_t *>(dSb + swz<BM>(kr + 8, qc)) = sa[kk][1];
                    *reinterpret_cast<uint32_t *>(dSb + swz<BM>(kr, qc + 8)) = sa[kk][2];
                    *reinterpret_cast<uint32_t *>(dSb + swz<BM>(kr + 8, qc + 8)) = sa[kk][3];
                }
                wg_fence();
#pragma unroll
                for (int kk = 0; kk < BM / 16; kk++) {
                    wgmma_m64n64_rs<1>(dva, pa[kk], gmma_desc(dOb + kk * 16 * DH));
                    wgmma_m64n64_rs<1>(dka, sa[kk], gmma_desc(Qb + kk * 16 * DH));
                }
                if constexpr (PIPE) wg_commit();  // waited for after tile it-1's dQ adds
                else wg_commit_wait();
            } else
#pragma unroll
            for (int kk = 0; kk < BM / 16; kk++) {
                uint32_t pa[4], sa[4];
                acc_to_a(pa, st[2 * kk], st[2 * kk + 1]);
                acc_to_a(sa, dpt[2 * kk], dpt[2 * kk + 1]);
                // park dS^T rows (keys) for the dQ product: sa[0]/sa[2] are row g, sa[1]/sa[3] row g+8
                const int kr = warp * 16 + g, qc = kk * 16 + 2 * tq;
                *reinterpret_cast<uint32_t *>(dSb + swz<BM>(kr, qc)) = sa[0];
                *reinterpret_cast<uint32_t *>(dSb + swz<BM>(kr + 8, qc)) = sa[1];
                *reinterpret_cast<uint32_t *>(dSb + swz<BM>(kr, qc + 8)) = sa[2];
                *reinterpret_cast<uint32_t *>(dSb + swz<BM>(kr + 8, qc + 8)) = sa[3];
#pragma unroll
                for (int np = 0; np < DH / 16; np++) {
                    uint32_t bo[4], bq[4];
                    load_b_kn<DH>(bo, dOb, kk * 16, np * 16, lane);
                    mma16816(dva[2 * np], pa, bo[0], bo[1]);
                    mma16816(dva[2 * np + 1], pa, bo[2], bo[3]);
                    load_b_kn<DH>(bq, Qb, kk * 16, np * 16, lane);
                    mma16816(dka[2 * np], sa, bq[0], bq[1]);
                    mma16816(dka[2 * np + 1], sa, bq[2], bq[3]);
                }
            }
            warp_column_sums<BM / 4>(rsum, lane);
#pragma unroll
            for (int i = 0; i < BM / 32; i++) {
                const int cidx = g * (BM / 32) + i;
                rowsum[(buf * NWARPS + warp) * BM + (cidx >> 1) * 8 + 2 * tq + (cidx & 1)] = rsum[i];
            }
        }
        if constexpr (PIPE) {
            if (it < ntiles) {
                wg_wait<1>();  // tile it-1's dQ product (tile it's dV/dK products may still run)
            } else {  // after the last tile: its dQ product alone
                wg_fence();
                dq_mma_issue(it, dqp);
                wg_commit_wait();
            }
        }
        if (!early && it > 0) dq_phase(it, dqp);
        if constexpr (PIPE) wg_wait<0>();  // dV/dK done: their register operands and this Q/dO buffer are free
        if (MODE == BWD_BLOCK && tid == 0 && it < ntiles && ord_before > 0) {
            if (poll >= ord_before) {
                fence_acq_rel_gpu();  // relaxed read + fence: an acquire (own adds landed long ago: cheap)
            } else {
                unsigned spins = 0;
                while (ld_acquire_gpu(semh + qt_first + it) < ord_before) {
                    __nanosleep(64);
                    if (++spins > (1u << 27)) __trap();  // a missing predecessor: fail loudly, never hang
                }
            }
        }
        if (more) store_rows(buf ^ 1, r_next, d_next);
    }
    if (pending) {
        __syncwarp();
        if (lane == 0) red_release_gpu_add(pending, 1);
    }
    if (MODE == BWD_BLOCK) {
        __syncthreads();  // the last tile's adds
        if (tid == 0) red_release_gpu_add(semh + qt_first + ntiles - 1, 1);
    }

    __nv_bfloat16 *dkh = dk + head_off * DH, *dvh = dv + head_off * DH;
#pragma unroll
    for (int nt = 0; nt < DH / 8; nt++) {
        const int col = nt * 8 + 2 * tq;
        if (j0 < T) {
            *reinterpret_cast<uint32_t *>(dkh + (size_t)j0 * DH + col) = pack_bf16(dka[nt][0] * scale, dka[nt][1] * scale);
            *reinterpret_cast<uint32_t *>(dvh + (size_t)j0 * DH + col) = pack_bf16(dva[nt][0], dva[nt][1]);
        }
        if (j1 < T) {
            *reinterpret_cast<uint32_t *>(dkh + (size_t)j1 * DH + col) = pack_bf16(dka[nt][2] * scale, dka[nt][3] * scale);
            *reinterpret_cast<uint32_t *>(dvh + (size_t)j1 * DH + col) = pack_bf16(dva[nt][2], dva[nt][3]);
        }
    }
    cs0 = quad_sum(cs0);
    cs1 = quad_sum(cs1);
    if (tq == 0) {
        if (j0 < T) colsum[head_off + j0] = -cs0;
        if (j1 < T) colsum[head_off + j1] = -cs1;
    }
}

// Backward, step 3: dq = scale * fp32 accumulator, as bf16.
__global__ void dq_convert_kernel(const float4 *__restrict__ acc, __nv_bfloat16 *__restrict__ dq, float scale, size_t n4) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x) {
        const float4 x = acc[i];
        uint2 out;
        out.x = pack_bf16(x.x * scale, x.y * scale);
        out.y = pack_bf16(x.z * scale, x.w * scale);
        reinterpret_cast<uint2 *>(dq)[i] = out;
    }
}

// Backward, step 4: dc_t = (dS row sum)_t + (minus dS column sum)_t, stored back into dc, and
// dlogf_t = sum_{i >= t} dc_i, a true reverse scan in fp32 (one block per (b, h)): each thread sums a
// contiguous chunk, the block scans the chunk totals, then each thread walks its chunk backwards from
// its suffix offset. No output is formed as a difference of large sums.
constexpr int SCAN_THREADS = 1024;
__global__ void __launch_bounds__(SCAN_THREADS) reverse_cumsum_kernel(float *__restrict__ x, const float *__restrict__ xc,
                                                                      float *__restrict__ y, int T) {
    __shared__ float warp_tot[SCAN_THREADS / 32];
    float *xr = x + (size_t)blockIdx.x * T;
    const float *xcr = xc + (size_t)blockIdx.x * T;
    float *yr = y + (size_t)blockIdx.x * T;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int chunk = (T + SCAN_THREADS - 1) / SCAN_THREADS;
    const int lo = min(T, tid * chunk), hi = min(T, lo + chunk);
    float tot = 0.f;
    for (int t = lo; t < hi; t++) tot += xr[t] + xcr[t];
    // inclusive suffix scan across lanes (lane l gets sum over lanes >= l), then across warps
    float suf = tot;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const float o = __shfl_down_sync(0xffffffffu, suf, off);
        if (lane + off < 32) suf += o;
    }
    if (lane == 0) warp_tot[warp] = suf;
    const float after_mine = __shfl_down_sync(0xffffffffu, suf, 1);  // lanes after mine, in this warp
    __syncthreads();
    if (warp == 0) {
        float w = warp_tot[lane];
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const float o = __shfl_down_sync(0xffffffffu, w, off);
            if (lane + off < 32) w += o;
        }
        warp_tot[lane] = w;
    }
    __syncthreads();
    float run = (lane < 31 ? after_mine : 0.f) + (warp + 1 < SCAN_THREADS / 32 ? warp_tot[warp + 1] : 0.f);
    for (int t = hi - 1; t >= lo; t--) {
        const float xt = xr[t] + xcr[t];
        xr[t] = xt;
        run += xt;
        yr[t] = run;
    }
}

template <int DH, bool PIPE = false> size_t fwd_smem_bytes() {
    return (size_t)(FWD_BM + (PIPE ? 5 : 4) * FWD_BN) * DH * 2 + (2 * FWD_BN + 2) * 4;
}
template <int DH, int BM> size_t bwd_smem_bytes() {
    return (size_t)(2 * BWD_BN * DH + 4 * BM * DH + 2 * BWD_BN * BM) * 2 + (4 + 2 * NWARPS) * BM * 4;
}

// Whether the dh 64 kernels take the warpgroup-MMA path: the current device (queried once) is a Hopper
// (compute capability 9.x; the build must then be sm_90a), and FOX_ATTN_NO_WGMMA is unset or "0"
// (set it to fall back to the mma.sync kernels, e.g. to compare).
inline bool use_wgmma() {
    static const bool yes = [] {
        int dev = 0, m = 0;
        FOX_CUDA_CHECK(cudaGetDevice(&dev));
        FOX_CUDA_CHECK(cudaDeviceGetAttribute(&m, cudaDevAttrComputeCapabilityMajor, dev));
        const char *e = getenv("FOX_ATTN_NO_WGMMA");
        return m == 9 && !(e && e[0] && strcmp(e, "0") != 0);
    }();
    return yes;
}

template <int DH, bool WG = false, bool PIPE = false>
void forward_cfg(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const float *c,
                 __nv_bfloat16 *o, float *lse, int B, int H, int T, const int *kv_first, cudaStream_t s) {
    const size_t smem = fwd_smem_bytes<DH, PIPE>();
    FOX_CUDA_CHECK(cudaFuncSetAttribute(fwd_kernel<DH, WG, PIPE>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    dim3 grid((T + FWD_BM - 1) / FWD_BM, B * H);
    fwd_kernel<DH, WG, PIPE><<<grid, FwdCfg<DH, WG>::THREADS, smem, s>>>(q, k, v, c, o, lse, H, T, kv_first);
    FOX_CUDA_CHECK(cudaGetLastError());
}

// The public forward: warpgroup MMA with the pipelined P V at dh 64 on Hopper (needs an sm_90a build),
// mma.sync otherwise.
template <int DH>
void forward(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const float *c,
             __nv_bfloat16 *o, float *lse, int B, int H, int T, const int *kv_first, cudaStream_t s) {
    if constexpr (DH == 64) {
        if (use_wgmma()) {
            forward_cfg<64, true, true>(q, k, v, c, o, lse, B, H, T, kv_first, s);
            return;
        }
    }
    forward_cfg<DH>(q, k, v, c, o, lse, B, H, T, kv_first, s);
}

// Scratch layout (fp32 unless noted): dq accumulator (B H T dh), D (B H T), dS column sums (B H T),
// order counters (int, B H ceil(T/16): enough for any query tile of >= 16 rows).
inline size_t bwd_sem_count(int B, int H, int T) { return (size_t)B * H * ((T + 15) / 16); }

template <int DH, int BM, int MINB, int MODE, bool WG = false>
void backward_cfg(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const float *c,
                  const __nv_bfloat16 *o, const float *lse, const __nv_bfloat16 *dout, float *dc, float *dlogf,
                  __nv_bfloat16 *dq, __nv_bfloat16 *dk, __nv_bfloat16 *dv, void *scratch, int B, int H, int T,
                  const int *q_last, cudaStream_t s) {
    const size_t nvec = (size_t)B * H * T, nq = nvec * DH;
    float *dq_acc = static_cast<float *>(scratch);
    float *D = dq_acc + nq, *colsum = D + nvec;
    int *sem = reinterpret_cast<int *>(colsum + nvec);
    const int rows = B * T * H;
    dot_do_o_kernel<DH><<<(rows + 7) / 8, 256, 0, s>>>(dout, o, D, H, T, rows);
    FOX_CUDA_CHECK(cudaGetLastError());
    FOX_CUDA_CHECK(cudaMemsetAsync(dq_acc, 0, nq * sizeof(float), s));
    FOX_CUDA_CHECK(cudaMemsetAsync(dc, 0, nvec * sizeof(float), s));
    FOX_CUDA_CHECK(cudaMemsetAsync(sem, 0, (size_t)B * H * ((T + BM - 1) / BM) * sizeof(int), s));
    const size_t smem = bwd_smem_bytes<DH, BM>();
    FOX_CUDA_CHECK(cudaFuncSetAttribute(bwd_kernel<DH, BM, MINB, MODE, WG>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    dim3 grid((T + BWD_BN - 1) / BWD_BN, B * H);
    bwd_kernel<DH, BM, MINB, MODE, WG><<<grid, bwd_threads(MODE), smem, s>>>(q, k, v, c, dout, lse, D, dq_acc, dk, dv, dc, colsum,
                                                                sem, H, T, q_last);
    FOX_CUDA_CHECK(cudaGetLastError());
    const size_t conv_blocks = (nq / 4 + 255) / 256;
    dq_convert_kernel<<<(unsigned)(conv_blocks < 4096 ? conv_blocks : 4096), 256, 0, s>>>(
        reinterpret_cast<const float4 *>(dq_acc), dq, 1.f / sqrtf((float)DH), nq / 4);
    FOX_CUDA_CHECK(cudaGetLastError());
    reverse_cumsum_kernel<<<B * H, SCAN_THREADS, 0, s>>>(dc, colsum, dlogf, T);
    FOX_CUDA_CHECK(cudaGetLastError());
}

// Whether the public backward is deterministic (1, the default) or adds dQ / dc in arrival order (0).
// One flag per process (an inline function's static: shared by every translation unit).
inline int &deterministic_flag() {
    static int on = 1;
    return on;
}

// The deterministic warpgroup-MMA backward the public API uses at dh 64 on Hopper (see the enum above).
constexpr int BWD_DET_WG_MODE = BWD_SYNC_WG_PIPE;

// The public backward. Deterministic (default): warpgroup MMA with the sync-warp order (BWD_DET_WG_MODE) at dh 64
// on Hopper (needs an sm_90a build); otherwise mma.sync with the staggered warp-level order (BWD_STAGGER),
// which measured faster than BWD_BLOCK there (dev/cuda/NOTES.md). Nondeterministic (see
// fox_attention_set_deterministic): the same kernels with plain fp32 atomics (BWD_ATOMIC_PIPE at dh 64 on
// Hopper, BWD_ATOMIC otherwise).
template <int DH>
void backward(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const float *c,
              const __nv_bfloat16 *o, const float *lse, const __nv_bfloat16 *dout, float *dc, float *dlogf,
              __nv_bfloat16 *dq, __nv_bfloat16 *dk, __nv_bfloat16 *dv, void *scratch, int B, int H, int T,
              const int *q_last, cudaStream_t s) {
    const bool det = deterministic_flag() != 0;
    if constexpr (DH == 64) {
        if (use_wgmma()) {
            if (det)
                backward_cfg<64, 64, 1, BWD_DET_WG_MODE, true>(q, k, v, c, o, lse, dout, dc, dlogf, dq, dk, dv,
                                                               scratch, B, H, T, q_last, s);
            else
                backward_cfg<64, 64, 1, BWD_ATOMIC_PIPE, true>(q, k, v, c, o, lse, dout, dc, dlogf, dq, dk, dv,
                                                               scratch, B, H, T, q_last, s);
            return;
        }
    }
    if (det)
        backward_cfg<DH, BwdCfg<DH>::BM, BwdCfg<DH>::MINB, BWD_STAGGER>(q, k, v, c, o, lse, dout, dc, dlogf, dq, dk,
                                                                        dv, scratch, B, H, T, q_last, s);
    else
        backward_cfg<DH, BwdCfg<DH>::BM, BwdCfg<DH>::MINB, BWD_ATOMIC>(q, k, v, c, o, lse, dout, dc, dlogf, dq, dk,
                                                                       dv, scratch, B, H, T, q_last, s);
}

}  // namespace fox_attn

static inline void fox_attn_check_dh(int dh) {
    if (dh != 64 && dh != 128) {
        fprintf(stderr, "error: head_dim %d is not supported by the attention kernel (64 or 128: choose --dim and --heads to match)\n", dh);
        exit(EXIT_FAILURE);
    }
}

// Forward: o (B, T, H, dh) and lse (B, H, T). kv_first: ACP hook (see top), or NULL.
static inline void fox_attention_forward(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                                         const float *c, __nv_bfloat16 *o, float *lse, int B, int H, int T, int dh,
                                         const int *kv_first, cudaStream_t s) {
    fox_attn_check_dh(dh);
    if (dh == 64) fox_attn::forward<64>(q, k, v, c, o, lse, B, H, T, kv_first, s);
    else fox_attn::forward<128>(q, k, v, c, o, lse, B, H, T, kv_first, s);
}

// Bytes of device scratch the backward needs: the fp32 dq accumulator and D = rowsum(dO * o).
static inline size_t fox_attention_backward_scratch_bytes(int B, int H, int T, int dh) {
    return (size_t)B * H * T * ((size_t)dh + 2) * sizeof(float) + fox_attn::bwd_sem_count(B, H, T) * sizeof(int);
}

// Chooses the backward's accumulation order for the whole process (host side; takes effect at the next
// fox_attention_backward call). on = 1 (the default): deterministic, the same inputs give bitwise the
// same outputs, run after run. on = 0: dq and dc are added with fp32 atomics in arrival order, so their
// low bits (and dlogf's) can differ between runs; faster (H200, T 16384, d_h 64: see docs/perf.md).
// Reading it back: fox_attention_get_deterministic().
static inline void fox_attention_set_deterministic(int on) { fox_attn::deterministic_flag() = on ? 1 : 0; }
static inline int fox_attention_get_deterministic(void) { return fox_attn::deterministic_flag(); }

// Backward: dq, dk, dv (B, H, T, dh) bf16; dc = dL/dc and dlogf = dL/dlog f (reverse cumsum of dc),
// both fp32 (B, H, T). scratch: fox_attention_backward_scratch_bytes() bytes, 16-byte aligned.
// q_last: ACP hook (see top), or NULL. Deterministic by default (fox_attention_set_deterministic).
static inline void fox_attention_backward(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                                          const float *c, const __nv_bfloat16 *o, const float *lse,
                                          const __nv_bfloat16 *dout, float *dc, float *dlogf, __nv_bfloat16 *dq,
                                          __nv_bfloat16 *dk, __nv_bfloat16 *dv, void *scratch, int B, int H, int T,
                                          int dh, const int *q_last, cudaStream_t s) {
    fox_attn_check_dh(dh);
    if (dh == 64) fox_attn::backward<64>(q, k, v, c, o, lse, dout, dc, dlogf, dq, dk, dv, scratch, B, H, T, q_last, s);
    else fox_attn::backward<128>(q, k, v, c, o, lse, dout, dc, dlogf, dq, dk, dv, scratch, B, H, T, q_last, s);
}

#endif  // FOX_ATTENTION_CUH
