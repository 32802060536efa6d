// fox/gsa.cuh: Gated Slot Attention on the GPU (docs/model.md §1.9; GSA paper eq. 6-9), forward and backward,
// as chunked two-pass gated linear attention (the paper's Appendix A/B form, train_fox.py's gsa_chunked). The CPU
// reference is gsa_forward / gsa_backward in train_fox.c (the recurrence); dev/cuda/gsa.cu checks these kernels
// against an fp64 recurrence and times them.
//
// Per sequence b and head g (m slots, d_h = dh, scale = 1/sqrt(dh)), the recurrence
//   S_t = Diag(α_t) S_{t-1} + ω_t ⊗ k_t,  U_t = Diag(α_t) U_{t-1} + ω_t ⊗ v_t   (m × dh, ω = 1 − α, eq. 6)
//   p_t = softmax(scale·S_t q_t) over the slots,  o_t = U_tᵀ p_t
// runs on chunks of GSA_CHUNK tokens. Within a chunk (local t, j; b_t = Σ_{l<=t} log α_l per slot, fp32;
// E(t, j) = exp(b_t − b_j) = Π_{j<l<=t} α_l; S0, U0 the states after the previous chunk):
//   s_t = scale·(e^{b_t} ⊙ S0 q_t + Σ_{j<=t} E(t,j) ω_j (q_t·k_j))        pass 1: A = Q Kᵀ, X1 = Q S0ᵀ (GEMMs)
//   o_t = U0ᵀ (e^{b_t} ⊙ p_t) + Σ_{j<=t} P̃_tj v_j,  P̃_tj = Σ_i p_ti E(t,j)_i ω_ji   pass 2 (GEMMs on P̃, e⊙p)
// The softmax between the passes links them (eq. 7). The sum over j with a per-slot decay is not a GEMM: it
// runs element-wise in fp32, as running products of α (pass 1) or exp of b differences (P̃), never as
// e^{b_t}·e^{−b_j}, which overflows for fast gates. The states move between chunks in fp32
// (S_c = e^{b_last} ⊙ S_{c−1} + Σ_j E(last, j) ω_j k_j: chunk deltas by GEMM, then a scan over chunks), and are
// kept after each chunk in bf16 as the next chunk's GEMM operand (and the backward's).
//
// Backward (dsr = dL/d(S_t q_t), dp = dL/dp; the same scan runs backwards over dL/d state):
//   dp_t = e^{b_t} ⊙ U0 do_t + Σ_j E ω_j (do_t·v_j),  dsr_t = scale·p_t ⊙ (dp_t − p_t·dp_t)
//   dq_t = S0ᵀ(e^{b_t} ⊙ dsr_t) + Σ_j D1_tj k_j,  D1_tj = Σ_i dsr_ti E(t,j)_i ω_ji
//   dk_j = Σ_t D1_tj q_t + Σ_i E(last,j)_i ω_ji dS'_i,  dv_j = Σ_t P̃_tj do_t + Σ_i E(last,j)_i ω_ji dU'_i
// with dS', dU' the gradients of the states after the chunk. The slot gates: with κ_t = dS_t·k_t + dU_t·v_t (per
// slot; dS_t the gradient of S_t), d log α_t = α_t (⟨dS_t, S_{t−1}⟩ + ⟨dU_t, U_{t−1}⟩) − α_t κ_t, and the inner
// products of states are taken within the chunk (so no sum runs over more than a chunk):
//   α_t ⟨dS_t, S_{t−1}⟩ + (U alike) = e^{b_last} (⟨dS', S0⟩ + ⟨dU', U0⟩) + Σ_{j<t} E(last,j) ω_j (k_j·dS' + v_j·dU')
//                                    + Σ_{j>=t} (dsr_j·s_j/scale + p_j·dp_j − ω_j κ^in_j)
// (κ^in: κ without the part from after the chunk). The logit's gradient is d log α · σ(−logit)/τ.
//
// Layouts: proj as fox/proj.cuh keeps it (docs/model.md §1.6): the q, k, v pre-activations in its bf16 wide part,
// the slot-gate logits (head g's slot i at column slot_col + g·m + i) in its fp32 logits; dproj (N, ldp) bf16 with
// the same columns; q, k, v, d_o bf16 (N + GSA_CHUNK, D): a chunk's rows past its sequence's end (the next
// sequence's, or past N, where they must be finite: zero at allocation) are read and multiplied by exact zeros;
// o (N, D); states (B·G, nc, GSA_SLOTS, dh); s (B·G, T, GSA_SLOTS) and lse (B·G, T) fp32. Slots past m are zero rows.
// Deterministic: no atomics, every sum in a fixed order. Head dims 64, 128, 192, 256; up to GSA_SLOTS slots.
//
// The chunk kernels are written once as a sequence of block-wide steps (x.each: every thread runs the step,
// then the block waits), so dev/cuda/gsa.cu can run the same code on the CPU, a thread at a time
// (GsaEmulated); their MMA tiles (gsa_tile) then compute the same products in plain loops.
// Measurements and the variants tried: dev/cuda/NOTES.md, section "Index: the notes of each product kernel".
#ifndef FOX_GSA_CUH
#define FOX_GSA_CUH

#include <math.h>
#include <mma.h>
#include "cuda_common.cuh"  // FOX_CUDA_CHECK, FOX_LAUNCH_CHECK, bf16, warp_sum, warp_max, sigmoidf_
#include "rows.cuh"         // FOX_WARPS, warp_index, norm_blocks, colsum_accumulate, NORM_BLOCK_ROWS
#include "config.h"         // FOX_NORM_EPS
#include "proj.cuh"         // Proj, proj_wide_row, proj_logit: attn_in_w's output rows

#define GSA_CHUNK 64                 // tokens per chunk
#define GSA_SLOTS 64                 // the slot rows of a state; m <= GSA_SLOTS
#define GSA_THREADS 256
#define GSA_WARPS (GSA_THREADS / 32)
#define GSA_LDF (GSA_SLOTS + 1)      // fp32 (chunk, slot) arrays: an odd row stride, read along both axes
#define GSA_LDW (GSA_CHUNK + 4)      // fp32 MMA results (chunk × chunk or chunk × slot)
#define GSA_LDB (GSA_CHUNK + 8)      // bf16 MMA operands (chunk × chunk or chunk × slot)

#define GSA_HD __host__ __device__ inline
#ifdef __CUDA_ARCH__
#define GSA_UNROLL_8 _Pragma("unroll 8")
#else
#define GSA_UNROLL_8
#endif

GSA_HD int gsa_chunks(int T) { return (T + GSA_CHUNK - 1) / GSA_CHUNK; }

// log α = logsigmoid(logit)/τ (docs/model.md §1.9).
GSA_HD float gsa_log_alpha(float logit, float tau) { return (fminf(logit, 0.0f) - log1pf(expf(-fabsf(logit)))) / tau; }

GSA_HD float gsa_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// Swish'(x) = σ(x)(1 + x(1 − σ(x))).
GSA_HD float gsa_swish_grad(float x) {
    float sg = gsa_sigmoid(x);
    return sg * (1.0f + x * (1.0f - sg));
}

// The shapes the kernels run, or NULL: the reason they do not.
static inline const char *gsa_unsupported(int dh, int m) {
    if (dh != 64 && dh != 128 && dh != 192 && dh != 256)
        return "train_fox's GSA kernels take a head dim (d_model / gsa_heads) of 64, 128, 192 or 256";
    if (m < 1 || m > GSA_SLOTS) return "train_fox's GSA kernels take 1 to 64 slots (--gsa-slots)";
    return NULL;
}

typedef struct {
    int B, T, G, m, dh;   // sequences, tokens, heads, slots, head dim
    float tau;            // α = σ(logit)^(1/τ)
    int ldp, slot_col;    // dproj's row stride (proj_ld); head g's slot i at column slot_col + g·m + i (>= ldw: a logit)
    int col_q, col_k, col_v;  // the columns of q, k, v in proj's wide part (and dproj)
} GsaShape;

typedef struct {
    GsaShape sh;
    Proj proj;                // attn_in_w's outputs: q, k, v pre-activations (wide), slot-gate logits
    const bf16 *q, *k, *v;    // (N + GSA_CHUNK, D): the Swish features
    bf16 *o;                  // (N, D)
    bf16 *S, *U;              // (B·G, nc, GSA_SLOTS, dh): the states after each chunk
    float *dS, *dU, *decay;   // scratch: the chunk deltas of S and U (fp32, the states' shape), e^{b_last} (B·G, nc, GSA_SLOTS)
    float *s, *lse;           // (B·G, T, GSA_SLOTS): scale·S_t q_t; (B·G, T): its log-sum-exp
    float *S_last, *U_last;   // NULL, or (B·G, GSA_SLOTS, dh) fp32: the states after the last token (a prefill)
    const bf16 *d_o;          // (N + GSA_CHUNK, D): dL/do (backward)
    bf16 *dSs, *dUs;          // (B·G, nc, GSA_SLOTS, dh): dL/d the states after each chunk
    float *dsr, *y;           // (B·G, T, GSA_SLOTS): dsr and dsr·s/scale + p·dp
    bf16 *D1, *Pt;            // (B·G, nc, GSA_CHUNK, GSA_CHUNK): D1 and P̃ of each chunk
    bf16 *dproj;              // (N, ldp): the q, k, v and slot-gate columns are written
} GsaArgs;

// ---------------------------------------------------------------------------------------------
// Block-wide steps and MMA tiles

// The GPU: every thread of the block runs f(thread), then the block waits.
struct GsaBlock {
    template <class F> __device__ __forceinline__ void each(F f) const {
        f((int)threadIdx.x);
        __syncthreads();
    }
};

struct GsaRow {};
struct GsaCol {};
template <class L> struct GsaWmma;
template <> struct GsaWmma<GsaRow> { typedef nvcuda::wmma::row_major T; };
template <> struct GsaWmma<GsaCol> { typedef nvcuda::wmma::col_major T; };

template <class L> GSA_HD float gsa_at(const bf16 *p, int ld, int r, int c);
template <> GSA_HD float gsa_at<GsaRow>(const bf16 *p, int ld, int r, int c) { return __bfloat162float(p[(size_t)r * ld + c]); }
template <> GSA_HD float gsa_at<GsaCol>(const bf16 *p, int ld, int r, int c) { return __bfloat162float(p[(size_t)c * ld + r]); }

template <class L> GSA_HD const bf16 *gsa_tile_ptr(const bf16 *p, int ld, int r, int c);
template <> GSA_HD const bf16 *gsa_tile_ptr<GsaRow>(const bf16 *p, int ld, int r, int c) { return p + (size_t)r * ld + c; }
template <> GSA_HD const bf16 *gsa_tile_ptr<GsaCol>(const bf16 *p, int ld, int r, int c) { return p + (size_t)c * ld + r; }

// One product of an MMA tile: A (rows, k) · B (k, columns), each row- or column-major with its leading dimension,
// k a multiple of 64 (d_h, GSA_SLOTS or GSA_CHUNK); a == NULL: none (a zero state).
template <class LA, class LB> struct GsaProd {
    const bf16 *a;
    int lda;
    const bf16 *b;
    int ldb, k;
};
template <class LA, class LB> GSA_HD GsaProd<LA, LB> gsa_prod(const bf16 *a, int lda, const bf16 *b, int ldb, int k) {
    GsaProd<LA, LB> p = {a, lda, b, ldb, k};
    return p;
}

#ifdef __CUDA_ARCH__
template <class LA, class LB>
__device__ __forceinline__ void gsa_mma(nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> &acc,
                                        const GsaProd<LA, LB> &p, int r0, int c0) {
    using namespace nvcuda;
    if (!p.a) return;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, typename GsaWmma<LA>::T> fa[4];
    wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, typename GsaWmma<LB>::T> fb[4];
    for (int k0 = 0; k0 < p.k; k0 += 64) {  // k is a multiple of 64: four steps' loads in flight, then their MMAs
#pragma unroll
        for (int u = 0; u < 4; u++) {
            wmma::load_matrix_sync(fa[u], gsa_tile_ptr<LA>(p.a, p.lda, r0, k0 + 16 * u), p.lda);
            wmma::load_matrix_sync(fb[u], gsa_tile_ptr<LB>(p.b, p.ldb, k0 + 16 * u, c0), p.ldb);
        }
#pragma unroll
        for (int u = 0; u < 4; u++) wmma::mma_sync(acc, fa[u], fb[u], acc);
    }
}
#else
template <class LA, class LB> static inline float gsa_dot(const GsaProd<LA, LB> &p, int r, int c) {
    float acc = 0.0f;
    if (p.a)
        for (int kk = 0; kk < p.k; kk++) acc += gsa_at<LA>(p.a, p.lda, r, kk) * gsa_at<LB>(p.b, p.ldb, kk, c);
    return acc;
}
#endif

// The 16 × 16 tile at (r0, c0) of p1 + p2 (fp32 accumulation), handed element by element to epi(row, column,
// value). A warp computes it together (lane: this thread's lane; stage: the warp's 256 floats of shared memory);
// emulated on the CPU, lane 0 computes the whole tile.
template <class LA1, class LB1, class LA2, class LB2, class F>
GSA_HD void gsa_tile(const GsaProd<LA1, LB1> &p1, const GsaProd<LA2, LB2> &p2, int r0, int c0, float *stage, int lane, F epi) {
#ifdef __CUDA_ARCH__
    nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> acc;
    nvcuda::wmma::fill_fragment(acc, 0.0f);
    gsa_mma(acc, p1, r0, c0);
    gsa_mma(acc, p2, r0, c0);
    nvcuda::wmma::store_matrix_sync(stage, acc, 16, nvcuda::wmma::mem_row_major);
    __syncwarp();
    for (int e = lane; e < 256; e += 32) epi(r0 + e / 16, c0 + e % 16, stage[e]);
    __syncwarp();
#else
    (void)stage;
    if (lane) return;
    for (int e = 0; e < 256; e++) epi(r0 + e / 16, c0 + e % 16, gsa_dot(p1, r0 + e / 16, c0 + e % 16) + gsa_dot(p2, r0 + e / 16, c0 + e % 16));
#endif
}

template <class LA, class LB, class F>
GSA_HD void gsa_tile(const GsaProd<LA, LB> &p, int r0, int c0, float *stage, int lane, F epi) {
    gsa_tile(p, gsa_prod<LA, LB>(NULL, 0, NULL, 0, 0), r0, c0, stage, lane, epi);
}

// gsa_tile of a feature's gradient g (rows: a chunk's tokens) into its dproj columns: dproj[r·ldp] = g·Swish'(pre[r·ldw])
// for the rows r < L (pre: its pre-activations in proj's wide part; pre, dproj point at the chunk's first row and the
// tile's column 0). Each lane loads its 8 pre-activations together before it stores.
template <class LA1, class LB1, class LA2, class LB2>
GSA_HD void gsa_tile_dproj(const GsaProd<LA1, LB1> &p1, const GsaProd<LA2, LB2> &p2, int r0, int c0, float *stage, int lane,
                           const bf16 *pre, int ldw, bf16 *dproj, int ldp, int L) {
#ifdef __CUDA_ARCH__
    nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> acc;
    nvcuda::wmma::fill_fragment(acc, 0.0f);
    gsa_mma(acc, p1, r0, c0);
    gsa_mma(acc, p2, r0, c0);
    nvcuda::wmma::store_matrix_sync(stage, acc, 16, nvcuda::wmma::mem_row_major);
    __syncwarp();
    float x[8];
#pragma unroll
    for (int u = 0; u < 8; u++) {
        int e = lane + 32 * u, r = r0 + e / 16;
        x[u] = r < L ? __bfloat162float(pre[(size_t)r * ldw + c0 + e % 16]) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < 8; u++) {
        int e = lane + 32 * u, r = r0 + e / 16;
        if (r < L) dproj[(size_t)r * ldp + c0 + e % 16] = __float2bfloat16(stage[e] * gsa_swish_grad(x[u]));
    }
    __syncwarp();
#else
    (void)stage;
    if (lane) return;
    for (int e = 0; e < 256; e++) {
        int r = r0 + e / 16, c = c0 + e % 16;
        if (r >= L) continue;
        float x = __bfloat162float(pre[(size_t)r * ldw + c]);
        dproj[(size_t)r * ldp + c] = __float2bfloat16((gsa_dot(p1, r, c) + gsa_dot(p2, r, c)) * gsa_swish_grad(x));
    }
#endif
}

// ---------------------------------------------------------------------------------------------
// Shared memory: arrays carved one after another (128-byte aligned); with base NULL only the size is counted.

typedef struct {
    char *base;
    size_t used;
} GsaCarve;

template <class T> GSA_HD T *gsa_carve(GsaCarve &cv, size_t n) {
    size_t at = (cv.used + 127) / 128 * 128;
    cv.used = at + n * sizeof(T);
    return cv.base ? (T *)(cv.base + at) : (T *)0;
}

// The chunk's gates b, α, ω (gsa_load_gates), (C, LDF) each: the first arrays of the steps that walk the states.
GSA_HD void gsa_carve_gates(GsaCarve &cv, float **b, float **al, float **om) {
    *b = gsa_carve<float>(cv, GSA_CHUNK * GSA_LDF);
    *al = gsa_carve<float>(cv, GSA_CHUNK * GSA_LDF);
    *om = gsa_carve<float>(cv, GSA_CHUNK * GSA_LDF);
}

// ---------------------------------------------------------------------------------------------
// One chunk's place and its slot gates

typedef struct {
    int b, g, c, nc, L;  // sequence, head, chunk, chunks per sequence, tokens of this chunk
    size_t bg, row0;     // b·G + g; the chunk's first row of (N, ·)
} GsaChunk;

GSA_HD GsaChunk gsa_chunk(const GsaShape &s, int bg, int c) {
    GsaChunk ch;
    ch.b = bg / s.G;
    ch.g = bg % s.G;
    ch.c = c;
    ch.nc = (s.T + GSA_CHUNK - 1) / GSA_CHUNK;
    ch.L = s.T - c * GSA_CHUNK < GSA_CHUNK ? s.T - c * GSA_CHUNK : GSA_CHUNK;
    ch.bg = (size_t)bg;
    ch.row0 = (size_t)ch.b * s.T + (size_t)c * GSA_CHUNK;
    return ch;
}

// The chunk's gates, (GSA_CHUNK, GSA_LDF) each: b = the running sum of log α from the chunk's start, α, ω = 1 − α
// (al, om may be NULL). Rows past the chunk's end and slots past m take log α = 0 (α = 1, ω = 0): they leave the
// states as they are and add nothing, so every chunk runs as a full one.
template <class X>
GSA_HD void gsa_load_gates(float *b, float *al, float *om, const GsaArgs &a, const GsaChunk &ch, const X &x) {
    const GsaShape &s = a.sh;
    x.each([&](int tid) {
        for (int e = tid; e < GSA_CHUNK * GSA_SLOTS; e += GSA_THREADS) {
            int t = e / GSA_SLOTS, i = e % GSA_SLOTS;
            float la = 0.0f;
            if (t < ch.L && i < s.m) la = gsa_log_alpha(proj_logit(a.proj, ch.row0 + t, s.slot_col + ch.g * s.m + i), s.tau);
            b[t * GSA_LDF + i] = la;
            if (al) al[t * GSA_LDF + i] = expf(la);
            if (om) om[t * GSA_LDF + i] = -expm1f(la);
        }
    });
    x.each([&](int tid) {
        if (tid < GSA_SLOTS)
            for (int t = 1; t < GSA_CHUNK; t++) b[t * GSA_LDF + tid] += b[(t - 1) * GSA_LDF + tid];
    });
}

// The row pointer of head g at the chunk's first row of an (N, D) array.
GSA_HD const bf16 *gsa_rows(const bf16 *x, const GsaShape &s, const GsaChunk &ch) {
    return x + ch.row0 * (size_t)(s.G * s.dh) + (size_t)ch.g * s.dh;
}

// The (GSA_SLOTS, dh) state after chunk c of head bg, or NULL before the first chunk (a zero state).
GSA_HD const bf16 *gsa_state(const bf16 *st, const GsaShape &s, size_t bg, int c) {
    int nc = (s.T + GSA_CHUNK - 1) / GSA_CHUNK;
    return c < 0 ? (const bf16 *)0 : st + ((bg * nc + c) * GSA_SLOTS) * (size_t)s.dh;
}

// Two (C, C) or (C, slot) MMA products of a chunk, out1 = p1 and out2 = p2 (fp32, row stride GSA_LDW), their 16
// tiles each spread over the warps.
template <class LA1, class LB1, class LA2, class LB2>
GSA_HD void gsa_square_tiles(float *out1, const GsaProd<LA1, LB1> &p1, float *out2, const GsaProd<LA2, LB2> &p2,
                             float *stage, int tid) {
    int warp = tid / 32, lane = tid % 32;
    for (int tile = warp; tile < 32; tile += GSA_WARPS) {
        int r0 = (tile % 16) / 4 * 16, c0 = tile % 4 * 16;
        float *out = tile < 16 ? out1 : out2;
        auto store = [&](int r, int c, float v) { out[r * GSA_LDW + c] = v; };
        if (tile < 16) gsa_tile(p1, r0, c0, stage + warp * 256, lane, store);
        else gsa_tile(p2, r0, c0, stage + warp * 256, lane, store);
    }
}

// ---------------------------------------------------------------------------------------------
// Forward step 1 (a block per head and chunk): the chunk's deltas of S and U, ΔS = Σ_j E(last, j) ω_j ⊗ k_j (a GEMM
// Glᵀ K with Gl_ji = E(last, j)_i ω_ji), ΔU alike with v, and its decay e^{b_last} (fp32, for the scan).

typedef struct {
    float *b, *om, *stage;
    bf16 *gl;
} GsaDeltaSmem;

GSA_HD GsaDeltaSmem gsa_delta_smem(char *base, size_t *bytes) {
    GsaCarve cv = {base, 0};
    GsaDeltaSmem m;
    m.b = gsa_carve<float>(cv, GSA_CHUNK * GSA_LDF);
    m.om = gsa_carve<float>(cv, GSA_CHUNK * GSA_LDF);
    m.gl = gsa_carve<bf16>(cv, GSA_CHUNK * GSA_LDB);
    m.stage = gsa_carve<float>(cv, GSA_WARPS * 256);
    *bytes = cv.used;
    return m;
}

template <int DH, class X> GSA_HD void gsa_delta_chunk(const GsaArgs &a, int bg, int c, char *smem, const X &x) {
    const GsaShape &s = a.sh;
    GsaChunk ch = gsa_chunk(s, bg, c);
    size_t bytes;
    GsaDeltaSmem sm = gsa_delta_smem(smem, &bytes);
    gsa_load_gates(sm.b, NULL, sm.om, a, ch, x);
    const float *last = sm.b + (GSA_CHUNK - 1) * GSA_LDF;
    x.each([&](int tid) {
        for (int e = tid; e < GSA_CHUNK * GSA_SLOTS; e += GSA_THREADS) {
            int j = e / GSA_SLOTS, i = e % GSA_SLOTS;
            sm.gl[j * GSA_LDB + i] = __float2bfloat16(expf(last[i] - sm.b[j * GSA_LDF + i]) * sm.om[j * GSA_LDF + i]);
        }
        if (tid < GSA_SLOTS) a.decay[(ch.bg * ch.nc + c) * GSA_SLOTS + tid] = expf(last[tid]);
    });
    const int D = s.G * DH;
    const bf16 *K = gsa_rows(a.k, s, ch), *V = gsa_rows(a.v, s, ch);
    float *dS = a.dS + (ch.bg * ch.nc + c) * GSA_SLOTS * (size_t)DH, *dU = a.dU + (ch.bg * ch.nc + c) * GSA_SLOTS * (size_t)DH;
    x.each([&](int tid) {
        int warp = tid / 32, lane = tid % 32;
        const int per = (GSA_SLOTS / 16) * (DH / 16);
        for (int tile = warp; tile < 2 * per; tile += GSA_WARPS) {
            int u = tile / per, r0 = (tile % per) / (DH / 16) * 16, c0 = tile % (DH / 16) * 16;
            float *out = u ? dU : dS;
            gsa_tile(gsa_prod<GsaCol, GsaRow>(sm.gl, GSA_LDB, u ? V : K, D, GSA_CHUNK), r0, c0, sm.stage + warp * 256, lane,
                     [&](int r, int cc, float v) { out[(size_t)r * DH + cc] = v; });
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Forward step 2 (and backward step 2): the scan over chunks, one thread per state element. Forward: S_c =
// decay_c ⊙ S_{c−1} + ΔS_c, stored after each chunk (bf16), and with last the fp32 state after the last chunk.
// Backward (reverse): dS'_c = dL/d(state after chunk c) = ΔdS_{c+1} + decay_{c+1} ⊙ dS'_{c+1}, dS'_{nc−1} = 0.

GSA_HD void gsa_scan_element(bf16 *out, float *last, const float *delta, const float *decay, size_t bg, int nc, int i,
                             int d, int dh, int reverse) {
    const size_t step = (size_t)GSA_SLOTS * dh, at0 = (bg * nc * GSA_SLOTS + i) * (size_t)dh + d;
    const float *dc = decay + bg * nc * GSA_SLOTS + i;
    float run = 0.0f;
    if (reverse) {
        GSA_UNROLL_8
        for (int c = nc - 1; c >= 0; c--) {
            out[at0 + c * step] = __float2bfloat16(run);
            run = dc[(size_t)c * GSA_SLOTS] * run + delta[at0 + c * step];
        }
    } else {
        GSA_UNROLL_8
        for (int c = 0; c < nc; c++) {
            run = dc[(size_t)c * GSA_SLOTS] * run + delta[at0 + c * step];
            out[at0 + c * step] = __float2bfloat16(run);
        }
    }
    if (last) last[(bg * GSA_SLOTS + i) * (size_t)dh + d] = run;
}

// blockIdx.y: 0 the S (or dS) state, 1 the U (or dU) state.
__global__ void gsa_scan_kernel(GsaArgs a, int reverse) {
    const GsaShape &s = a.sh;
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x, per = (size_t)GSA_SLOTS * s.dh;
    if (e >= (size_t)s.B * s.G * per) return;
    int u = blockIdx.y;
    bf16 *out = reverse ? (u ? a.dUs : a.dSs) : (u ? a.U : a.S);
    float *last = reverse ? NULL : (u ? a.U_last : a.S_last);
    gsa_scan_element(out, last, u ? a.dU : a.dS, a.decay, e / per, gsa_chunks(s.T), (int)(e % per / s.dh),
                     (int)(e % s.dh), s.dh, reverse);
}

// ---------------------------------------------------------------------------------------------
// Forward step 3 (a block per head and chunk): the scores s, their softmax p and the output o of the chunk.

typedef struct {
    float *b, *al, *om;  // (C, LDF)
    float *A, *p;        // (C, LDW) Q Kᵀ; then p (C, LDF) in its place
    float *X;            // (C, LDW) Q S0ᵀ; then the scores s in place
    bf16 *ep, *pt;       // (C, LDB): e^{b} ⊙ p and P̃
    float *mx, *sum;     // (C): each row's softmax statistics
    float *stage;
} GsaOutSmem;

GSA_HD GsaOutSmem gsa_out_smem(char *base, size_t *bytes) {
    GsaCarve cv = {base, 0};
    GsaOutSmem m;
    gsa_carve_gates(cv, &m.b, &m.al, &m.om);
    m.A = gsa_carve<float>(cv, GSA_CHUNK * GSA_LDW);
    m.p = m.A;
    m.X = gsa_carve<float>(cv, GSA_CHUNK * GSA_LDW);
    m.ep = gsa_carve<bf16>(cv, GSA_CHUNK * GSA_LDB);
    m.pt = gsa_carve<bf16>(cv, GSA_CHUNK * GSA_LDB);
    m.mx = gsa_carve<float>(cv, GSA_CHUNK);
    m.sum = gsa_carve<float>(cv, GSA_CHUNK);
    m.stage = gsa_carve<float>(cv, GSA_WARPS * 256);
    *bytes = cv.used;
    return m;
}

// out[t·ldo + i] = the pass-1 form Σ_{j<=t} E(t,j)_i ω_ji W[t, j] + e^{b_t,i} X[t·ldx + i] for the chunk's rows (t < L),
// all slots: a running product of α from j = t down (row stride of W: GSA_LDW). out may be X.
GSA_HD void gsa_walk_down(float *out, int ldo, const float *W, const float *X, int ldx, const float *b, const float *al,
                          const float *om, int L, int tid) {
    for (int e = tid; e < GSA_CHUNK * GSA_SLOTS; e += GSA_THREADS) {
        int t = e / GSA_SLOTS, i = e % GSA_SLOTS;
        if (t >= L) continue;
        float acc = 0.0f, dec = 1.0f;
        for (int j = t; j >= 0; j--) {
            acc += W[t * GSA_LDW + j] * om[j * GSA_LDF + i] * dec;
            dec *= al[j * GSA_LDF + i];
        }
        out[t * ldo + i] = expf(b[t * GSA_LDF + i]) * X[t * ldx + i] + acc;
    }
}

// X = the gated form (gsa_walk_down) of the chunk's rows L against the chunk's keys R and the state S0 before it
// (NULL: a zero state), through A = L Rᵀ and X = L S0ᵀ: the forward's scores (L = Q, R = K, S0 = S) and the
// backward's dp (L = dO, R = V, S0 = U). A: (C, LDW), X: (C, LDW); ld: the row stride of L and R.
template <int DH, class X>
GSA_HD void gsa_gated_products(float *A, float *Xs, const bf16 *L, const bf16 *R, const bf16 *S0, int ld, const float *b,
                               const float *al, const float *om, int rows, float *stage, const X &x) {
    x.each([&](int tid) {
        gsa_square_tiles(A, gsa_prod<GsaRow, GsaCol>(L, ld, R, ld, DH), Xs, gsa_prod<GsaRow, GsaCol>(S0 ? L : NULL, ld, S0, DH, DH),
                         stage, tid);
    });
    x.each([&](int tid) { gsa_walk_down(Xs, GSA_LDW, A, Xs, GSA_LDW, b, al, om, rows, tid); });
}

template <int DH, class X> GSA_HD void gsa_output_chunk(const GsaArgs &a, int bg, int c, char *smem, const X &x) {
    const GsaShape &s = a.sh;
    const int D = s.G * DH, m = s.m;
    const float scale = 1.0f / sqrtf((float)DH);
    GsaChunk ch = gsa_chunk(s, bg, c);
    size_t bytes;
    GsaOutSmem sm = gsa_out_smem(smem, &bytes);
    gsa_load_gates(sm.b, sm.al, sm.om, a, ch, x);
    const bf16 *Q = gsa_rows(a.q, s, ch), *K = gsa_rows(a.k, s, ch), *V = gsa_rows(a.v, s, ch);
    const bf16 *S0 = gsa_state(a.S, s, ch.bg, c - 1), *U0 = gsa_state(a.U, s, ch.bg, c - 1);
    gsa_gated_products<DH>(sm.A, sm.X, Q, K, S0, D, sm.b, sm.al, sm.om, ch.L, sm.stage, x);
    x.each([&](int tid) {  // the softmax statistics of each row over the m slots (lse kept for the backward)
        if (tid >= ch.L) return;
        int t = tid;
        float *sr = sm.X + t * GSA_LDW, mx = -INFINITY, sum = 0.0f;
        for (int i = 0; i < m; i++) {
            sr[i] *= scale;
            mx = fmaxf(mx, sr[i]);
        }
        for (int i = 0; i < m; i++) sum += expf(sr[i] - mx);
        sm.mx[t] = mx;
        sm.sum[t] = sum;
        a.lse[ch.bg * s.T + (size_t)c * GSA_CHUNK + t] = mx + logf(sum);
    });
    x.each([&](int tid) {  // p and e^{b} ⊙ p; s kept for the backward
        for (int e = tid; e < GSA_CHUNK * GSA_SLOTS; e += GSA_THREADS) {
            int t = e / GSA_SLOTS, i = e % GSA_SLOTS, in = t < ch.L && i < m;
            float sv = sm.X[t * GSA_LDW + i], pi = in ? expf(sv - sm.mx[t]) / sm.sum[t] : 0.0f;
            if (in) a.s[(ch.bg * s.T + (size_t)c * GSA_CHUNK + t) * GSA_SLOTS + i] = sv;
            sm.p[t * GSA_LDF + i] = pi;
            sm.ep[t * GSA_LDB + i] = __float2bfloat16(expf(sm.b[t * GSA_LDF + i]) * pi);
        }
    });
    x.each([&](int tid) {  // P̃
        for (int e = tid; e < GSA_CHUNK * GSA_CHUNK; e += GSA_THREADS) {
            int t = e / GSA_CHUNK, j = e % GSA_CHUNK;
            float acc = 0.0f;
            if (j <= t && t < ch.L)
                for (int i = 0; i < m; i++)
                    acc += sm.p[t * GSA_LDF + i] * sm.om[j * GSA_LDF + i] * expf(sm.b[t * GSA_LDF + i] - sm.b[j * GSA_LDF + i]);
            sm.pt[t * GSA_LDB + j] = __float2bfloat16(acc);
        }
    });
    x.each([&](int tid) {  // o = (e^{b} ⊙ p) U0 + P̃ V
        int warp = tid / 32, lane = tid % 32;
        for (int tile = warp; tile < (GSA_CHUNK / 16) * (DH / 16); tile += GSA_WARPS) {
            int r0 = tile / (DH / 16) * 16, c0 = tile % (DH / 16) * 16;
            gsa_tile(gsa_prod<GsaRow, GsaRow>(U0 ? sm.ep : NULL, GSA_LDB, U0, DH, GSA_SLOTS),
                     gsa_prod<GsaRow, GsaRow>(sm.pt, GSA_LDB, V, D, GSA_CHUNK), r0, c0, sm.stage + warp * 256, lane,
                     [&](int r, int cc, float v) {
                         if (r < ch.L) a.o[(ch.row0 + r) * D + (size_t)ch.g * DH + cc] = __float2bfloat16(v);
                     });
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Backward step 1 (a block per head and chunk): dp, dsr, y = dsr·s/scale + p·dp, D1 and P̃ (kept for step 3), dq
// (into dproj through Swish'), and the chunk's deltas of the state gradients, ΔdS = (e^{b} ⊙ dsr)ᵀ Q and
// ΔdU = (e^{b} ⊙ p)ᵀ dO, with its decay.

typedef struct {
    float *b, *al, *om;  // (C, LDF)
    float *A2, *p;       // (C, LDW) dO Vᵀ; then p (C, LDF) in its place
    float *X;            // (C, LDW) dO U0ᵀ; then dp in place
    float *dsr;          // (C, LDF)
    bf16 *ed, *ep, *d1, *pt;  // (C, LDB)
    float *stage;
} GsaBwd1Smem;

GSA_HD GsaBwd1Smem gsa_bwd1_smem(char *base, size_t *bytes) {
    GsaCarve cv = {base, 0};
    GsaBwd1Smem m;
    gsa_carve_gates(cv, &m.b, &m.al, &m.om);
    m.A2 = gsa_carve<float>(cv, GSA_CHUNK * GSA_LDW);
    m.p = m.A2;
    m.X = gsa_carve<float>(cv, GSA_CHUNK * GSA_LDW);
    m.dsr = gsa_carve<float>(cv, GSA_CHUNK * GSA_LDF);
    m.ed = gsa_carve<bf16>(cv, GSA_CHUNK * GSA_LDB);
    m.ep = gsa_carve<bf16>(cv, GSA_CHUNK * GSA_LDB);
    m.d1 = gsa_carve<bf16>(cv, GSA_CHUNK * GSA_LDB);
    m.pt = gsa_carve<bf16>(cv, GSA_CHUNK * GSA_LDB);
    m.stage = gsa_carve<float>(cv, GSA_WARPS * 256);
    *bytes = cv.used;
    return m;
}

template <int DH, class X> GSA_HD void gsa_bwd1_chunk(const GsaArgs &a, int bg, int c, char *smem, const X &x) {
    const GsaShape &s = a.sh;
    const int D = s.G * DH, m = s.m;
    const float scale = 1.0f / sqrtf((float)DH);
    GsaChunk ch = gsa_chunk(s, bg, c);
    size_t bytes;
    GsaBwd1Smem sm = gsa_bwd1_smem(smem, &bytes);
    gsa_load_gates(sm.b, sm.al, sm.om, a, ch, x);
    const bf16 *Q = gsa_rows(a.q, s, ch), *K = gsa_rows(a.k, s, ch), *V = gsa_rows(a.v, s, ch), *dO = gsa_rows(a.d_o, s, ch);
    const bf16 *S0 = gsa_state(a.S, s, ch.bg, c - 1), *U0 = gsa_state(a.U, s, ch.bg, c - 1);
    gsa_gated_products<DH>(sm.A2, sm.X, dO, V, U0, D, sm.b, sm.al, sm.om, ch.L, sm.stage, x);
    const size_t row0 = ch.bg * s.T + (size_t)c * GSA_CHUNK;  // the chunk's first row of s, dsr, y
    x.each([&](int tid) {  // p from the forward's s and lse; s into dsr's place for now
        for (int e = tid; e < GSA_CHUNK * GSA_SLOTS; e += GSA_THREADS) {
            int t = e / GSA_SLOTS, i = e % GSA_SLOTS, in = t < ch.L && i < m;
            float sv = in ? a.s[(row0 + t) * GSA_SLOTS + i] : 0.0f;
            sm.p[t * GSA_LDF + i] = in ? expf(sv - a.lse[row0 + t]) : 0.0f;
            sm.dsr[t * GSA_LDF + i] = sv;
        }
    });
    x.each([&](int tid) {  // per row: dsr = scale·p ⊙ (dp − p·dp), and y = dsr·s/scale + p·dp in dp's place
        if (tid >= ch.L) return;
        int t = tid;
        float *p = sm.p + t * GSA_LDF, *dp = sm.X + t * GSA_LDW, *dsr = sm.dsr + t * GSA_LDF, pdp = 0.0f;
        for (int i = 0; i < m; i++) pdp += p[i] * dp[i];
        for (int i = 0; i < m; i++) {
            float ds = scale * p[i] * (dp[i] - pdp);
            dp[i] = ds * dsr[i] / scale + p[i] * dp[i];
            dsr[i] = ds;
        }
    });
    x.each([&](int tid) {  // dsr and y kept for step 3; e^{b} ⊙ dsr and e^{b} ⊙ p
        for (int e = tid; e < GSA_CHUNK * GSA_SLOTS; e += GSA_THREADS) {
            int t = e / GSA_SLOTS, i = e % GSA_SLOTS;
            float e_b = expf(sm.b[t * GSA_LDF + i]), ds = sm.dsr[t * GSA_LDF + i];
            if (t < ch.L && i < m) {
                a.dsr[(row0 + t) * GSA_SLOTS + i] = ds;
                a.y[(row0 + t) * GSA_SLOTS + i] = sm.X[t * GSA_LDW + i];
            }
            sm.ed[t * GSA_LDB + i] = __float2bfloat16(e_b * ds);
            sm.ep[t * GSA_LDB + i] = __float2bfloat16(e_b * sm.p[t * GSA_LDF + i]);
        }
    });
    bf16 *D1g = a.D1 + (ch.bg * ch.nc + c) * GSA_CHUNK * GSA_CHUNK, *Ptg = a.Pt + (ch.bg * ch.nc + c) * GSA_CHUNK * GSA_CHUNK;
    x.each([&](int tid) {  // D1 and P̃ (one weight E(t,j)_i ω_ji for both)
        for (int e = tid; e < GSA_CHUNK * GSA_CHUNK; e += GSA_THREADS) {
            int t = e / GSA_CHUNK, j = e % GSA_CHUNK;
            float d1 = 0.0f, pt = 0.0f;
            if (j <= t && t < ch.L)
                for (int i = 0; i < m; i++) {
                    float w = sm.om[j * GSA_LDF + i] * expf(sm.b[t * GSA_LDF + i] - sm.b[j * GSA_LDF + i]);
                    d1 += sm.dsr[t * GSA_LDF + i] * w;
                    pt += sm.p[t * GSA_LDF + i] * w;
                }
            sm.d1[t * GSA_LDB + j] = D1g[t * GSA_CHUNK + j] = __float2bfloat16(d1);
            sm.pt[t * GSA_LDB + j] = Ptg[t * GSA_CHUNK + j] = __float2bfloat16(pt);
        }
        if (tid < GSA_SLOTS) a.decay[(ch.bg * ch.nc + c) * GSA_SLOTS + tid] = expf(sm.b[(GSA_CHUNK - 1) * GSA_LDF + tid]);
    });
    float *dS = a.dS + (ch.bg * ch.nc + c) * GSA_SLOTS * (size_t)DH, *dU = a.dU + (ch.bg * ch.nc + c) * GSA_SLOTS * (size_t)DH;
    x.each([&](int tid) {  // ΔdS, ΔdU (slot × dh) and dq (chunk × dh)
        int warp = tid / 32, lane = tid % 32;
        const int per = 4 * (DH / 16);  // tiles of each: 4 rows of tiles (GSA_SLOTS = GSA_CHUNK = 64)
        for (int tile = warp; tile < 3 * per; tile += GSA_WARPS) {
            int u = tile / per, r0 = (tile % per) / (DH / 16) * 16, c0 = tile % (DH / 16) * 16;
            float *stage = sm.stage + warp * 256;
            if (u < 2) {
                float *out = u ? dU : dS;
                gsa_tile(gsa_prod<GsaCol, GsaRow>(u ? sm.ep : sm.ed, GSA_LDB, u ? dO : Q, D, GSA_CHUNK), r0, c0, stage, lane,
                         [&](int r, int cc, float v) { out[(size_t)r * DH + cc] = v; });
            } else {
                int col = s.col_q + ch.g * DH;
                gsa_tile_dproj(gsa_prod<GsaRow, GsaRow>(S0 ? sm.ed : NULL, GSA_LDB, S0, DH, GSA_SLOTS),
                               gsa_prod<GsaRow, GsaRow>(sm.d1, GSA_LDB, K, D, GSA_CHUNK), r0, c0, stage, lane,
                               proj_wide_row(a.proj, ch.row0) + col, a.proj.ldw, a.dproj + ch.row0 * s.ldp + col, s.ldp,
                               ch.L);
            }
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Backward step 3 (a block per head and chunk), after the reverse scan gave dS', dU' (the gradients of the states
// after the chunk): dk, dv (into dproj through Swish') and the slot-gate logits' gradient.

typedef struct {
    float *b, *al, *om;          // (C, LDF)
    float *A, *A2, *X;           // (C, LDW): Q Kᵀ, dO Vᵀ, K dS'ᵀ + V dU'ᵀ (then Ĝ ω ⊙ it, in place)
    float *dsr, *p, *y, *r;      // (C, LDF): dsr, p, y (then y − ω κ^in, then its suffix sums), −α κ
    float *sd;                   // (GSA_SLOTS): ⟨dS', S0⟩ + ⟨dU', U0⟩ of each slot
    bf16 *gl;                    // (C, LDB): E(last, j) ω_j
    float *stage;
} GsaBwd3Smem;

GSA_HD GsaBwd3Smem gsa_bwd3_smem(char *base, size_t *bytes) {
    GsaCarve cv = {base, 0};
    GsaBwd3Smem m;
    gsa_carve_gates(cv, &m.b, &m.al, &m.om);
    m.A = gsa_carve<float>(cv, GSA_CHUNK * GSA_LDW);
    m.A2 = gsa_carve<float>(cv, GSA_CHUNK * GSA_LDW);
    m.X = gsa_carve<float>(cv, GSA_CHUNK * GSA_LDW);
    m.dsr = gsa_carve<float>(cv, GSA_CHUNK * GSA_LDF);
    m.p = gsa_carve<float>(cv, GSA_CHUNK * GSA_LDF);
    m.y = gsa_carve<float>(cv, GSA_CHUNK * GSA_LDF);
    m.r = gsa_carve<float>(cv, GSA_CHUNK * GSA_LDF);
    m.sd = gsa_carve<float>(cv, GSA_SLOTS);
    m.gl = gsa_carve<bf16>(cv, GSA_CHUNK * GSA_LDB);
    m.stage = gsa_carve<float>(cv, GSA_WARPS * 256);
    *bytes = cv.used;
    return m;
}

template <int DH, class X> GSA_HD void gsa_bwd3_chunk(const GsaArgs &a, int bg, int c, char *smem, const X &x) {
    const GsaShape &s = a.sh;
    const int D = s.G * DH, m = s.m;
    GsaChunk ch = gsa_chunk(s, bg, c);
    size_t bytes;
    GsaBwd3Smem sm = gsa_bwd3_smem(smem, &bytes);
    gsa_load_gates(sm.b, sm.al, sm.om, a, ch, x);
    const bf16 *Q = gsa_rows(a.q, s, ch), *K = gsa_rows(a.k, s, ch), *V = gsa_rows(a.v, s, ch), *dO = gsa_rows(a.d_o, s, ch);
    const bf16 *S0 = gsa_state(a.S, s, ch.bg, c - 1), *U0 = gsa_state(a.U, s, ch.bg, c - 1);
    const bf16 *dSn = gsa_state(a.dSs, s, ch.bg, c), *dUn = gsa_state(a.dUs, s, ch.bg, c);
    const float *last = sm.b + (GSA_CHUNK - 1) * GSA_LDF;
    x.each([&](int tid) {  // the forward's p, the backward's dsr and y; E(last, j) ω_j; ⟨dS', S0⟩ + ⟨dU', U0⟩ by 8 columns
        for (int e = tid; e < GSA_CHUNK * GSA_SLOTS; e += GSA_THREADS) {
            int t = e / GSA_SLOTS, i = e % GSA_SLOTS;
            size_t at = (ch.bg * s.T + (size_t)c * GSA_CHUNK + t) * GSA_SLOTS + i;
            int in = t < ch.L && i < m;
            sm.p[t * GSA_LDF + i] = in ? expf(a.s[at] - a.lse[at / GSA_SLOTS]) : 0.0f;
            sm.dsr[t * GSA_LDF + i] = in ? a.dsr[at] : 0.0f;
            sm.y[t * GSA_LDF + i] = in ? a.y[at] : 0.0f;
            sm.gl[t * GSA_LDB + i] = __float2bfloat16(expf(last[i] - sm.b[t * GSA_LDF + i]) * sm.om[t * GSA_LDF + i]);
        }
        for (int e = tid; e < GSA_SLOTS * (DH / 8); e += GSA_THREADS) {  // partial sums into stage (64 × DH/8 <= 2048)
            float acc = 0.0f;
            if (S0)
                for (int d = 8 * (e % (DH / 8)); d < 8 * (e % (DH / 8)) + 8; d++) {
                    size_t at = (size_t)(e / (DH / 8)) * DH + d;
                    acc += __bfloat162float(dSn[at]) * __bfloat162float(S0[at]) + __bfloat162float(dUn[at]) * __bfloat162float(U0[at]);
                }
            sm.stage[e] = acc;
        }
    });
    x.each([&](int tid) {
        if (tid >= GSA_SLOTS) return;
        float acc = 0.0f;
        for (int k = 0; k < DH / 8; k++) acc += sm.stage[tid * (DH / 8) + k];
        sm.sd[tid] = acc;
    });
    x.each([&](int tid) {  // A = Q Kᵀ, A2 = dO Vᵀ; X = K dS'ᵀ + V dU'ᵀ
        gsa_square_tiles(sm.A, gsa_prod<GsaRow, GsaCol>(Q, D, K, D, DH), sm.A2, gsa_prod<GsaRow, GsaCol>(dO, D, V, D, DH),
                         sm.stage, tid);
        int warp = tid / 32, lane = tid % 32;
        for (int tile = warp; tile < 16; tile += GSA_WARPS)
            gsa_tile(gsa_prod<GsaRow, GsaCol>(K, D, dSn, DH, DH), gsa_prod<GsaRow, GsaCol>(V, D, dUn, DH, DH), tile / 4 * 16,
                     tile % 4 * 16, sm.stage + warp * 256, lane, [&](int r, int cc, float v) { sm.X[r * GSA_LDW + cc] = v; });
    });
    x.each([&](int tid) {  // κ^in by a running product of α from t' = t up; then y − ω κ^in, Ĝ ω X and −α κ
        for (int e = tid; e < GSA_CHUNK * GSA_SLOTS; e += GSA_THREADS) {
            int t = e / GSA_SLOTS, i = e % GSA_SLOTS;
            if (t >= ch.L) continue;
            float acc = 0.0f, dec = 1.0f;
            for (int u = t; u < ch.L; u++) {
                acc += dec * (sm.dsr[u * GSA_LDF + i] * sm.A[u * GSA_LDW + t] + sm.p[u * GSA_LDF + i] * sm.A2[u * GSA_LDW + t]);
                if (u + 1 < ch.L) dec *= sm.al[(u + 1) * GSA_LDF + i];
            }
            float gh = expf(last[i] - sm.b[t * GSA_LDF + i]), om = sm.om[t * GSA_LDF + i], xo = sm.X[t * GSA_LDW + i];
            sm.y[t * GSA_LDF + i] -= om * acc;
            sm.r[t * GSA_LDF + i] = -sm.al[t * GSA_LDF + i] * (acc + gh * xo);
            sm.X[t * GSA_LDW + i] = gh * om * xo;
        }
    });
    x.each([&](int tid) {  // per slot: the suffix sums of y and the prefix sums (j < t) of X, in place
        if (tid >= m) return;
        int i = tid;
        float suf = 0.0f, pre = 0.0f;
        for (int t = ch.L - 1; t >= 0; t--) {
            suf += sm.y[t * GSA_LDF + i];
            sm.y[t * GSA_LDF + i] = suf;
        }
        for (int t = 0; t < ch.L; t++) {
            float xt = sm.X[t * GSA_LDW + i];
            sm.X[t * GSA_LDW + i] = pre;
            pre += xt;
        }
    });
    x.each([&](int tid) {  // d log α_t = e^{b_last}·sd + Σ_{j<t} X_j + Σ_{j>=t} y_j + r_t, then the logit's gradient
        for (int e = tid; e < GSA_CHUNK * GSA_SLOTS; e += GSA_THREADS) {
            int t = e / GSA_SLOTS, i = e % GSA_SLOTS;
            if (t >= ch.L || i >= m) continue;
            float dla = expf(last[i]) * sm.sd[i] + sm.X[t * GSA_LDW + i] + sm.y[t * GSA_LDF + i] + sm.r[t * GSA_LDF + i];
            size_t n = ch.row0 + t;
            int col = s.slot_col + ch.g * m + i;
            a.dproj[n * s.ldp + col] = __float2bfloat16(dla * gsa_sigmoid(-proj_logit(a.proj, n, col)) / s.tau);
        }
    });
    const bf16 *D1g = a.D1 + (ch.bg * ch.nc + c) * GSA_CHUNK * GSA_CHUNK, *Ptg = a.Pt + (ch.bg * ch.nc + c) * GSA_CHUNK * GSA_CHUNK;
    x.each([&](int tid) {  // dk = D1ᵀ Q + Gl dS', dv = P̃ᵀ dO + Gl dU'
        int warp = tid / 32, lane = tid % 32;
        const int per = 4 * (DH / 16);
        for (int tile = warp; tile < 2 * per; tile += GSA_WARPS) {
            int u = tile / per, r0 = (tile % per) / (DH / 16) * 16, c0 = tile % (DH / 16) * 16;
            int col = (u ? s.col_v : s.col_k) + ch.g * DH;
            gsa_tile_dproj(gsa_prod<GsaCol, GsaRow>(u ? Ptg : D1g, GSA_CHUNK, u ? dO : Q, D, GSA_CHUNK),
                           gsa_prod<GsaRow, GsaRow>(sm.gl, GSA_LDB, u ? dUn : dSn, DH, GSA_SLOTS), r0, c0,
                           sm.stage + warp * 256, lane, proj_wide_row(a.proj, ch.row0) + col, a.proj.ldw,
                           a.dproj + ch.row0 * s.ldp + col, s.ldp, ch.L);
        }
    });
}

// ---------------------------------------------------------------------------------------------
// The chunk kernels: a block per (head bg, chunk c), dynamic shared memory as each body carves it.

template <int DH> __global__ void __launch_bounds__(GSA_THREADS) gsa_delta_kernel(GsaArgs a) {
    extern __shared__ __align__(128) char gsa_smem[];
    gsa_delta_chunk<DH>(a, blockIdx.x, blockIdx.y, gsa_smem, GsaBlock());
}

template <int DH> __global__ void __launch_bounds__(GSA_THREADS) gsa_output_kernel(GsaArgs a) {
    extern __shared__ __align__(128) char gsa_smem[];
    gsa_output_chunk<DH>(a, blockIdx.x, blockIdx.y, gsa_smem, GsaBlock());
}

template <int DH> __global__ void __launch_bounds__(GSA_THREADS) gsa_bwd1_kernel(GsaArgs a) {
    extern __shared__ __align__(128) char gsa_smem[];
    gsa_bwd1_chunk<DH>(a, blockIdx.x, blockIdx.y, gsa_smem, GsaBlock());
}

template <int DH> __global__ void __launch_bounds__(GSA_THREADS) gsa_bwd3_kernel(GsaArgs a) {
    extern __shared__ __align__(128) char gsa_smem[];
    gsa_bwd3_chunk<DH>(a, blockIdx.x, blockIdx.y, gsa_smem, GsaBlock());
}

template <class K> static inline void gsa_launch_chunks(K kernel, size_t smem, const GsaArgs &a, cudaStream_t st) {
    FOX_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    kernel<<<dim3(a.sh.B * a.sh.G, gsa_chunks(a.sh.T)), GSA_THREADS, smem, st>>>(a);
    FOX_LAUNCH_CHECK();
}

#define GSA_DISPATCH(dh, F) \
    do { \
        if ((dh) == 64) F(64); \
        else if ((dh) == 128) F(128); \
        else if ((dh) == 192) F(192); \
        else F(256); \
    } while (0)

static inline void gsa_scan(const GsaArgs &a, int reverse, cudaStream_t st) {
    size_t n = (size_t)a.sh.B * a.sh.G * GSA_SLOTS * a.sh.dh;
    gsa_scan_kernel<<<dim3(fox_blocks(n, 256), 2), 256, 0, st>>>(a, reverse);
    FOX_LAUNCH_CHECK();
}

// The forward: o, the states after each chunk, s and lse (and with S_last, U_last the final states) from q, k, v
// and the slot-gate logits. Scratch: dS, dU, decay.
static inline void fox_gsa_forward(const GsaArgs &a, cudaStream_t st) {
    size_t dsm, osm;
    gsa_delta_smem(NULL, &dsm);
    gsa_out_smem(NULL, &osm);
#define GSA_FWD_DELTA(DH) gsa_launch_chunks(gsa_delta_kernel<DH>, dsm, a, st)
#define GSA_FWD_OUT(DH) gsa_launch_chunks(gsa_output_kernel<DH>, osm, a, st)
    GSA_DISPATCH(a.sh.dh, GSA_FWD_DELTA);
    gsa_scan(a, 0, st);
    GSA_DISPATCH(a.sh.dh, GSA_FWD_OUT);
#undef GSA_FWD_DELTA
#undef GSA_FWD_OUT
}

// The backward from d_o and the forward's q, k, v, proj, states, s and lse: the q, k, v and slot-gate columns of
// dproj (through Swish' and the gate's derivative). Scratch: dS, dU, decay, dSs, dUs, dsr, y, D1, Pt.
static inline void fox_gsa_backward(const GsaArgs &a, cudaStream_t st) {
    size_t b1, b3;
    gsa_bwd1_smem(NULL, &b1);
    gsa_bwd3_smem(NULL, &b3);
#define GSA_BWD1(DH) gsa_launch_chunks(gsa_bwd1_kernel<DH>, b1, a, st)
#define GSA_BWD3(DH) gsa_launch_chunks(gsa_bwd3_kernel<DH>, b3, a, st)
    GSA_DISPATCH(a.sh.dh, GSA_BWD1);
    gsa_scan(a, 1, st);
    GSA_DISPATCH(a.sh.dh, GSA_BWD3);
#undef GSA_BWD1
#undef GSA_BWD3
}

// ---------------------------------------------------------------------------------------------
// Element-wise pieces: the Swish features, and the output (eq. 9) z = RMSNorm(Swish(o)) over all D.

// GSA paper eq. 8: q, k, v (N, D) bf16 = Swish of their columns of proj's wide part. CPU: gsa_features.
__global__ void gsa_features_kernel(bf16 *q, bf16 *k, bf16 *v, const Proj proj, int cq, int ck, int cv, int N, int D) {
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)N * 3 * D) return;
    size_t n = e / (3 * (size_t)D);
    int j = (int)(e % (3 * (size_t)D)), w = j / D, d = j % D;
    float x = __bfloat162float(proj_wide_row(proj, n)[(w == 0 ? cq : w == 1 ? ck : cv) + d]);
    bf16 *out = w == 0 ? q : w == 1 ? k : v;
    out[n * D + d] = __float2bfloat16(x * sigmoidf_(x));
}

static inline void fox_gsa_features(bf16 *q, bf16 *k, bf16 *v, const Proj &proj, int cq, int ck, int cv, int N, int D,
                                    cudaStream_t st) {
    gsa_features_kernel<<<fox_blocks((size_t)N * 3 * D, 256), 256, 0, st>>>(q, k, v, proj, cq, ck, cv, N, D);
    FOX_LAUNCH_CHECK();
}

// GSA paper eq. 9 before W_o: z = RMSNorm(Swish(o)) ⊙ w over all D, one warp per row. CPU: gsa_output.
__global__ void gsa_output_norm_kernel(bf16 *z, const bf16 *o, const float *w, int N, int D) {
    size_t row = warp_index();
    int lane = threadIdx.x % 32;
    if (row >= (size_t)N) return;
    const bf16 *x = o + row * D;
    float ss = 0.0f;
    for (int i = lane; i < D; i += 32) {
        float a = __bfloat162float(x[i]), on = a * sigmoidf_(a);
        ss += on * on;
    }
    float rs = 1.0f / sqrtf(warp_sum(ss) / D + FOX_NORM_EPS);
    for (int i = lane; i < D; i += 32) {
        float a = __bfloat162float(x[i]);
        z[row * D + i] = __float2bfloat16(a * sigmoidf_(a) * rs * w[i]);
    }
}

static inline void fox_gsa_output_norm(bf16 *z, const bf16 *o, const float *w, int N, int D, cudaStream_t st) {
    gsa_output_norm_kernel<<<warp_blocks(N), FOX_WARPS * 32, 0, st>>>(z, o, w, N, D);
    FOX_LAUNCH_CHECK();
}

// Backward of the above from dz (N, D) fp32: d_o = Swish'(o) ⊙ rstd·(dz⊙w − ô·mean(dz⊙w⊙ô)), ô = Swish(o)·rstd, and
// the weight gradient's block partials Σ dz⊙ô (as rmsnorm_backward_kernel: a warp's rows into its shared-memory
// row, the block's warps in order into part[blockIdx.x]). Dynamic shared memory: FOX_WARPS·D floats.
// CPU: rmsnorm_backward and swish_grad_r in gsa_block_backward.
__global__ void gsa_output_norm_backward_kernel(bf16 *d_o, float *part, const float *dz, const bf16 *o, const float *w, int N,
                                                int D) {
    extern __shared__ float gsa_wsum[];  // (FOX_WARPS, D)
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float *acc = gsa_wsum + (size_t)warp * D;
    for (int i = lane; i < D; i += 32) acc[i] = 0.0f;
    int r1 = min(N, (int)(blockIdx.x + 1) * NORM_BLOCK_ROWS);
    for (int row = blockIdx.x * NORM_BLOCK_ROWS + warp; row < r1; row += FOX_WARPS) {
        const bf16 *x = o + (size_t)row * D;
        const float *g = dz + (size_t)row * D;
        float ss = 0.0f, gwx = 0.0f;
        for (int i = lane; i < D; i += 32) {
            float a = __bfloat162float(x[i]), on = a * sigmoidf_(a);
            ss += on * on;
            gwx += g[i] * w[i] * on;
        }
        float rs = 1.0f / sqrtf(warp_sum(ss) / D + FOX_NORM_EPS), dot = rs * warp_sum(gwx) / D;
        for (int i = lane; i < D; i += 32) {
            float a = __bfloat162float(x[i]), sg = sigmoidf_(a), on = a * sg;
            float don = rs * (g[i] * w[i] - on * rs * dot);
            d_o[(size_t)row * D + i] = __float2bfloat16(don * sg * (1.0f + a * (1.0f - sg)));
            acc[i] += g[i] * on * rs;
        }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < D; c += blockDim.x) {
        float t = 0.0f;
        for (int k = 0; k < FOX_WARPS; k++) t += gsa_wsum[(size_t)k * D + c];
        part[(size_t)blockIdx.x * D + c] = t;
    }
}

// d_o and dw += the norm weight's gradient. part: norm_blocks(N)·D floats, part2: colsum_scratch_floats(norm_blocks(N), D).
static inline void fox_gsa_output_norm_backward(bf16 *d_o, float *dw, const float *dz, const bf16 *o, const float *w, int N,
                                                int D, float *part, float *part2, cudaStream_t st) {
    size_t smem = (size_t)FOX_WARPS * D * sizeof(float);
    FOX_CUDA_CHECK(cudaFuncSetAttribute(gsa_output_norm_backward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    gsa_output_norm_backward_kernel<<<norm_blocks(N), FOX_WARPS * 32, smem, st>>>(d_o, part, dz, o, w, N, D);
    FOX_LAUNCH_CHECK();
    colsum_accumulate(dw, part, norm_blocks(N), D, D, part2, st);
}

// ---------------------------------------------------------------------------------------------
// Generation: one step of the recurrence for the new token of each sequence, from the states after the previous
// token (fp32, (B·G, GSA_SLOTS, dh), updated in place); q, k, v are rounded to bf16 as the forward's features are.
// proj holds the step's B rows. One block per (sequence, head). CPU: decode_gsa_block's gsa_forward.

#define GSA_DECODE_THREADS 256

__global__ void __launch_bounds__(GSA_DECODE_THREADS)
gsa_decode_kernel(bf16 *o, float *S, float *U, const Proj proj, GsaShape s) {
    __shared__ float q[256], k[256], v[256], al[GSA_SLOTS], sc[GSA_SLOTS];
    const int bg = blockIdx.x, b = bg / s.G, g = bg % s.G, dh = s.dh, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const bf16 *row = proj_wide_row(proj, b);
    for (int d = threadIdx.x; d < dh; d += GSA_DECODE_THREADS) {
        float xq = __bfloat162float(row[s.col_q + g * dh + d]), xk = __bfloat162float(row[s.col_k + g * dh + d]);
        float xv = __bfloat162float(row[s.col_v + g * dh + d]);
        q[d] = __bfloat162float(__float2bfloat16(xq * sigmoidf_(xq)));
        k[d] = __bfloat162float(__float2bfloat16(xk * sigmoidf_(xk)));
        v[d] = __bfloat162float(__float2bfloat16(xv * sigmoidf_(xv)));
    }
    for (int i = threadIdx.x; i < s.m; i += GSA_DECODE_THREADS)
        al[i] = expf(gsa_log_alpha(proj_logit(proj, b, s.slot_col + g * s.m + i), s.tau));
    __syncthreads();
    float *Sb = S + (size_t)bg * GSA_SLOTS * dh, *Ub = U + (size_t)bg * GSA_SLOTS * dh;
    for (int i = warp; i < s.m; i += GSA_DECODE_THREADS / 32) {  // a warp per slot: the update, then the score
        float a = al[i], dot = 0.0f;
        for (int d = lane; d < dh; d += 32) {
            size_t at = (size_t)i * dh + d;
            float sv = a * Sb[at] + (1.0f - a) * k[d];
            Sb[at] = sv;
            Ub[at] = a * Ub[at] + (1.0f - a) * v[d];
            dot += sv * q[d];
        }
        dot = warp_sum(dot);
        if (lane == 0) sc[i] = dot / sqrtf((float)dh);
    }
    __syncthreads();
    if (warp == 0) {  // the softmax over the slots
        float mx = -INFINITY, sum = 0.0f;
        for (int i = lane; i < s.m; i += 32) mx = fmaxf(mx, sc[i]);
        mx = warp_max(mx);
        for (int i = lane; i < s.m; i += 32) sum += expf(sc[i] - mx);
        sum = warp_sum(sum);
        __syncwarp();
        for (int i = lane; i < s.m; i += 32) sc[i] = expf(sc[i] - mx) / sum;
    }
    __syncthreads();
    for (int d = threadIdx.x; d < dh; d += GSA_DECODE_THREADS) {
        float acc = 0.0f;
        for (int i = 0; i < s.m; i++) acc += sc[i] * Ub[(size_t)i * dh + d];
        o[(size_t)b * s.G * dh + (size_t)g * dh + d] = __float2bfloat16(acc);
    }
}

static inline void fox_gsa_decode(bf16 *o, float *S, float *U, const Proj &proj, const GsaShape &s, cudaStream_t st) {
    gsa_decode_kernel<<<s.B * s.G, GSA_DECODE_THREADS, 0, st>>>(o, S, U, proj, s);
    FOX_LAUNCH_CHECK();
}

#endif  // FOX_GSA_CUH
