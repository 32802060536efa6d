// fox/attention_primitives.cuh: the building blocks of the attention kernels (fox/attention_forward.cuh,
// fox/attention_backward.cuh, and the experiments of dev/cuda): PTX wrappers for cp.async, ldmatrix,
// mma.sync, Hopper warpgroup MMA (wgmma), barriers, atomics, memory ordering and register reallocation,
// the swizzled shared-memory layout, and small warp-level helpers. Nothing here knows about attention.
#ifndef FOX_ATTENTION_PRIMITIVES_CUH
#define FOX_ATTENTION_PRIMITIVES_CUH

#include <stdint.h>      // uint32_t, uint64_t
#include <cuda_runtime.h>  // __cvta_generic_to_shared, atomicAdd, shuffles
#include <cuda_bf16.h>   // __nv_bfloat16, __floats2bfloat162_rn

namespace fox_attn {

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

// Warpgroup-MMA tiles: ROWS x DH stored as DH / 64 halves of ROWS x 64 (rows of 128 bytes, swz<64>), so
// each half is a canonical 128-byte-swizzle operand whatever DH is. At DH 64 this is swz<64> itself.
template <int DH, int ROWS> __device__ __forceinline__ int swz_halves(int row, int col) {
    static_assert(DH % 64 == 0, "whole 64-column halves");
    if constexpr (DH == 64) return swz<64>(row, col);  // one half: the same offset in fewer instructions
    return (col >> 6) * ROWS * 64 + swz<64>(row, col & 63);
}

// Async copy of `rows` rows of DH bf16 starting at global row `row0` (row stride `ld` elements) into a
// swizzled smem tile by NT threads; rows at or past T are zero-filled. HALVES: the warpgroup-MMA layout
// (swz_halves), otherwise swz<DH> (rows of DH * 2 bytes, for ldmatrix).
template <int DH, int ROWS, int NT, bool HALVES = false>
__device__ __forceinline__ void load_tile_async(__nv_bfloat16 *dst, const __nv_bfloat16 *src, int ld, int row0, int T, int tid) {
    constexpr int CHUNKS = ROWS * DH / 8;
    static_assert(CHUNKS % NT == 0, "whole chunks per thread");
#pragma unroll
    for (int i = 0; i < CHUNKS / NT; i++) {
        const int idx = tid + i * NT;
        const int r = idx / (DH / 8), col = (idx % (DH / 8)) * 8;
        const bool valid = row0 + r < T;
        const __nv_bfloat16 *g = src + (size_t)(valid ? row0 + r : 0) * ld + col;
        cp_async16(dst + (HALVES ? swz_halves<DH, ROWS>(r, col) : swz<DH>(r, col)), g, valid);
    }
}

// ---------------------------------------------------------------------------------------------
// Hopper warpgroup MMA (sm_90a builds; a no-op or a trap elsewhere). Shared-memory operands are described by
// 64-bit descriptors: 128-byte swizzle (our swz<64> layout: 16-byte chunk ^= row & 7 in rows of 128 bytes,
// tiles 1024-byte aligned), 8-row groups 1024 bytes apart. A K-major operand advances 32 bytes per k16
// step; an MN-major one 16 rows (2048 bytes).
__device__ __forceinline__ uint64_t gmma_desc(const void *p) {
    const uint32_t a = smem_u32(p);
    return (uint64_t)((a & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}
// The descriptor of the operand e bf16 elements (a multiple of 8) past a tile whose descriptor is d: d plus e / 8
// in the address field, which cannot carry out of its 14 bits (a shared address is below 2^18 bytes), added to
// the low word alone.
__device__ __forceinline__ uint64_t gmma_desc_add(uint64_t d, int e) {
    return (d & 0xFFFFFFFF00000000ull) | (uint32_t)((uint32_t)d + (uint32_t)(e >> 3));
}
// Operand starts in a swz_halves tile of ROWS rows, in elements. K-major (the contraction runs along the row,
// e.g. Q and K for Q K^T): k16 step kk of the rows from row0, walking half kk / 4 at 32 bytes a step. MN-major
// (the contraction runs down the rows, e.g. V for P V): rows 16 kk.. of half hf (64 columns).
template <int ROWS> __device__ __forceinline__ int kmajor_at(int row0, int kk) {
    return (kk >> 2) * ROWS * 64 + row0 * 64 + (kk & 3) * 16;
}
template <int ROWS> __device__ __forceinline__ int mnmajor_at(int hf, int kk) { return hf * ROWS * 64 + kk * 16 * 64; }
// Each operand's descriptor, from the tile's descriptor (one add an MMA) or from the operand's own address (five
// more uniform-datapath instructions an MMA). The backward takes the first; the d_h 64 forward measured slower
// with it (ptxas's schedule of its P V products), so the forward keeps the second.
template <int ROWS> __device__ __forceinline__ uint64_t desc_kmajor(uint64_t tile, int row0, int kk) {
    return gmma_desc_add(tile, kmajor_at<ROWS>(row0, kk));
}
template <int ROWS> __device__ __forceinline__ uint64_t desc_mnmajor(uint64_t tile, int hf, int kk) {
    return gmma_desc_add(tile, mnmajor_at<ROWS>(hf, kk));
}
template <int ROWS> __device__ __forceinline__ uint64_t desc_kmajor(const __nv_bfloat16 *tile, int row0, int kk) {
    return gmma_desc(tile + kmajor_at<ROWS>(row0, kk));
}
template <int ROWS> __device__ __forceinline__ uint64_t desc_mnmajor(const __nv_bfloat16 *tile, int hf, int kk) {
    return gmma_desc(tile + mnmajor_at<ROWS>(hf, kk));
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
// D (64 x 64) += A (64 x 16, registers: this warp's 16 rows as an mma.m16n8k16 A fragment) B (smem);
// scale_d = 0: D = A B.
template <int TB>
__device__ __forceinline__ void wgmma_m64n64_rs(float (&d)[8][4], const uint32_t a[4], uint64_t db, int scale_d = 1) {
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %38, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %37;\n"
        "}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(TB), "r"(scale_d));
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

// D (64 x 128) += A (64 x 16) B (16 x 128), both from smem descriptors (scale_d = 0: D = A B).
template <int TA, int TB>
__device__ __forceinline__ void wgmma_m64n128_ss(float (&d)[16][4], uint64_t da, uint64_t db, int scale_d) {
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %68, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p, 1, 1, %66, %67;\n"
        "}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
          "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),
          "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),
          "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]),
          "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),
          "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
          "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]),
          "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
          "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
        : "l"(da), "l"(db), "n"(TA), "n"(TB), "r"(scale_d));
#else
    __trap();
#endif
}

// Columns 64 hf.. of an accumulator of n8 tiles (float [N][4], N = DH / 8) as one m64n64 warpgroup-MMA
// accumulator (the product of an MN-major operand's half hf).
typedef float AccN64[8][4];
template <int N> __device__ __forceinline__ AccN64 &acc_half(float (&d)[N][4], int hf) {
    static_assert(N % 8 == 0, "whole 64-column halves");
    return *reinterpret_cast<AccN64 *>(&d[8 * hf]);
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

__device__ __forceinline__ void atomic_add2(float *p, float x, float y) {
#if __CUDA_ARCH__ >= 900
    atomicAdd(reinterpret_cast<float2 *>(p), make_float2(x, y));
#else
    atomicAdd(p, x);
    atomicAdd(p + 1, y);
#endif
}

// Cross-block ordering at GPU scope: an acquiring load, a releasing add (fire and forget).
__device__ __forceinline__ int ld_acquire_gpu(const int *p) {
    int v;
    asm volatile("ld.global.acquire.gpu.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void red_release_gpu_add(int *p, int v) {
    asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
// Warpgroup register reallocation (sm_90a): every warp of a warpgroup runs the same one.
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
// Named barriers: `arrive` signals without waiting, `sync` waits for nthreads arrivals (both count).
__device__ __forceinline__ void named_bar_arrive(int id, int nthreads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(nthreads) : "memory");
}
__device__ __forceinline__ void named_bar_sync(int id, int nthreads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(nthreads) : "memory");
}

// ---------------------------------------------------------------------------------------------
// TMA and mbarrier: the bulk tensor copy engine (cp.async.bulk.tensor, sm_90) writing tiles into smem and
// completing on a shared-memory mbarrier (arrivals plus a byte count, phases of parity 0, 1, 0, ...).
__device__ __forceinline__ void mbar_init(uint64_t *bar, int count) {
#if __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
#endif
}
// Makes the inits visible to the copy engine (then a __syncthreads makes them visible to the block).
__device__ __forceinline__ void mbar_fence_init() {
#if __CUDA_ARCH__ >= 900
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
#if __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
#endif
}
// An arrival that also announces `bytes` more to come from the copy engine before the phase completes.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t *bar, uint32_t bytes) {
#if __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
#endif
}
// Announces `bytes` more to come from the copy engine in the current phase, without an arrival: a producer
// issues a tile's copies first and arrives once its own smem stores for that stage are done.
__device__ __forceinline__ void mbar_expect_tx(uint64_t *bar, uint32_t bytes) {
#if __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
#endif
}
// Waits until the phase of the given parity has completed.
__device__ __forceinline__ void mbar_wait(uint64_t *bar, int parity) {
#if __CUDA_ARCH__ >= 900
    uint32_t done;
    do {
        asm volatile(
            "{\n"
            ".reg .pred p;\n"
            "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
            "selp.u32 %0, 1, 0, p;\n"
            "}\n"
            : "=r"(done) : "r"(smem_u32(bar)), "r"(parity) : "memory");
    } while (!done);
#endif
}
// Bulk add by the copy engine (sm_90): `bytes` (a multiple of 16; both addresses 16-byte aligned) of fp32
// from smem at src added element-wise to global memory at dst, in this thread's bulk async-group.
__device__ __forceinline__ void bulk_reduce_add_f32(float *dst, const float *src, uint32_t bytes) {
#if __CUDA_ARCH__ >= 900
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
                 ::"l"(dst), "r"(smem_u32(src)), "r"(bytes) : "memory");
#else
    __trap();
#endif
}
// Bulk copy by the copy engine (sm_90): the same operands as bulk_reduce_add_f32, the bytes stored, not added.
__device__ __forceinline__ void bulk_store(float *dst, const float *src, uint32_t bytes) {
#if __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n"
                 ::"l"(dst), "r"(smem_u32(src)), "r"(bytes) : "memory");
#else
    __trap();
#endif
}
__device__ __forceinline__ void bulk_commit() {
#if __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}
// Waits for this thread's bulk groups: READ, until they have read their smem sources (which may then be
// written again); otherwise until they are complete (their writes to global memory performed).
template <bool READ> __device__ __forceinline__ void bulk_wait() {
#if __CUDA_ARCH__ >= 900
    if constexpr (READ) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
    else asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
#endif
}
// Orders this thread's generic-proxy accesses to global memory (an acquire, a release) with the copy
// engine's (async-proxy) ones.
__device__ __forceinline__ void fence_proxy_async_global() {
#if __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
#endif
}
// One box of a 3-D tensor map (a __grid_constant__ kernel parameter) at coordinates (c0, c1, c2), innermost
// first, into smem at dst; elements outside the tensor are written as zeros. Completes on bar.
__device__ __forceinline__ void tma_load_3d(void *dst, const void *tmap, uint64_t *bar, int c0, int c1, int c2) {
#if __CUDA_ARCH__ >= 900
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n"
        ::"r"(smem_u32(dst)), "l"(tmap), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2) : "memory");
#else
    __trap();
#endif
}

}  // namespace fox_attn

#endif  // FOX_ATTENTION_PRIMITIVES_CUH
