// fox/attn_inputs.cuh: the attention's inputs from attn_in_w's output rows (proj): KV-shift, QK-norm and RoPE
// in one pass into the attention's bf16 q, k, v (paper eq. 15-19), and its backward into dproj's q, k, v and
// shift-logit columns with the QK-norm weights' gradients. The decode step (fox/decode.cuh) takes its QK-norm and
// RoPE from here (the warp-a-row helpers, qk_weights and qk_norm_rope; the dev program's earlier versions use them
// too).
// Measurements and the variants tried: dev/cuda/NOTES.md, section "Index: the notes of each product kernel".
#ifndef FOX_ATTN_INPUTS_CUH
#define FOX_ATTN_INPUTS_CUH

#include <stdint.h>         // uintptr_t
#include "cuda_common.cuh"  // FOX_LAUNCH_CHECK, bf16, group_sums, warp_sums, sigmoidf_
#include "config.h"         // FOX_QK_NORM_EPS, AttnCols
#include "docmask.h"        // fox_doc_has_prev: KV-shift's reach under the document mask
#include "proj.cuh"         // Proj, proj_wide_row, proj_logit, proj_ld: attn_in_w's output rows
#include "rows.cuh"         // HEAD_BLOCK_ROWS, head_grid, head_partials_accumulate, store_bf16x4, the per-head norm

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

// Where a walk over the rows of head h is: row n, position t of its sequence, and o, the row's offset
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

// The RoPE table's row t in the walkers' layout: the cos and sin of lane gl's 4 angles (element i = 4·gl + e and
// its pair share one; the lanes gl and gl ^ L/2 hold the same 4). rope_rotate4 turns a row's q and k (the backward's dq
// and dk) by them.
struct Rope4 {
    float cs[4], sn[4];
};

template <int L>
__device__ __forceinline__ Rope4 rope_row4(const QkvInputs &s, int t, int gl) {
    const size_t at = (size_t)t * (s.dh / 2) + gl % (L / 2) * 4;
    Rope4 r;
    load_f32x4(r.cs, s.rope_cos + at);
    load_f32x4(r.sn, s.rope_sin + at);
    return r;
}

// The RoPE rotation by r (rope_row4; inverse = 1: by −angle, the backward's) in the walkers' layout: element
// i = 4·gl + e (gl: the lane in its walker of L) pairs with i ± dh/2, held by lane gl ^ L/2 of the same walker.
// The same products as rope_rotate.
template <int L>
__device__ __forceinline__ void rope_rotate4(float x[4], const Rope4 &r, int gl, int inverse) {
    const int upper = gl >= L / 2;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const float other = __shfl_xor_sync(group_mask<L>(), x[e], L / 2), si = inverse ? -r.sn[e] : r.sn[e];
        x[e] = upper ? x[e] * r.cs[e] + other * si : x[e] * r.cs[e] - other * si;
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
            const Rope4 r = rope_row4<L>(s, p.t, gl);
            rope_rotate4<L>(qv, r, gl, 0);
            rope_rotate4<L>(kv, r, gl, 0);
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
                const Rope4 r = rope_row4<L>(s, p.t, gl);
                rope_rotate4<L>(gq, r, gl, 1);
                rope_rotate4<L>(gk, r, gl, 1);
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

#endif  // FOX_ATTN_INPUTS_CUH
