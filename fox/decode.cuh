// fox/decode.cuh: the kernels of generation with a KV cache (docs/model.md §7) in train_fox.cu: a decode step
// feeds one new token per sequence at position t, read from the device (*pos), so that one CUDA graph of the
// step serves every position. decode_qkv_kernel forms the token's q and its shifted,
// normed, rotated k and v from the attn_in projection and the KV-shift state, appends k, v and c_t to the
// cache and, with ACP, picks the first cached key the query reads (under the document mask, not before the
// sequence's latest separator: doc_start, which decode_advance_kernel keeps). The attention over the cache is split
// over the keys (flash-decoding): several blocks per (b, h) each reduce a chunk of keys to a partial max,
// sum and output in fp32, then a combine kernel merges the chunks, so that one sequence at a long context
// still fills the GPU and streams the cache at close to HBM bandwidth (16-byte loads of K and V). The step's
// GEMMs are matrix-vector products at batch 1 (decode_linear, with the SwiGLU and residual add as
// epilogues) and its norms one block per row (decode_rmsnorm).
// The CPU references are decode_qkv, decode_first_key and decode_attention_block in train_fox.c;
// dev/cuda/attention_decode.cu checks the attention against an fp64 loop and times it, dev/cuda/decode_linear.cu
// the GEMV against fp64 and cuBLASLt.
// Layouts of one layer: k, v bf16 (B, H, max_len, dh); c fp32 (B, H, max_len); q, o bf16 (B, H, dh), which
// is the (B, D) row layout of the block's other kernels.
// Measurements and the variants tried: dev/cuda/NOTES.md, sections "Decode attention" and "The rest of the decode step".
#ifndef FOX_DECODE_CUH
#define FOX_DECODE_CUH

#include <stdint.h>
#include "cuda_common.cuh"  // FOX_LAUNCH_CHECK, bf16, fox_sm_count, sigmoidf_, logsigmoidf_, warp_sum, warp_max
#include "attn_inputs.cuh"  // QkvInputs, qk_weights, qk_norm_rope: the forward's arithmetic
#include "rows.cuh"         // warp_index, load_w4, store_bf16x4, fox_check_width
#include "proj.cuh"         // proj_wide_row, proj_logit: the new token's row of attn_in_w's output
#include "config.h"         // FOX_NORM_EPS
#include "io.h"             // fox_fatal
#include "acp.h"            // fox_acp_first_key, fox_acp_threshold, fox_acp_bound_*: ACP's first key
#include "docmask.h"        // fox_doc_start, FOX_DOC_LOG_F: the document mask in a decode step

// One layer's slice of the cache, as the kernels take it.
typedef struct {
    bf16 *k, *v;             // (B, H, max_len, dh): keys and values as attention sees them
    float *c;                // (B, H, max_len): c_t = Σ log f, NULL without a forget gate or document mask
    bf16 *k_prev, *v_prev;   // (B, D): the newest token's unshifted key and value, NULL without KV-shift
    float *k_max2;           // (B, H): the largest cached |k_j|², NULL unless ACP without QK-norm
    int max_len;
} CacheLayer;

// Programmatic dependent launch (Hopper and later; docs/perf.md, Generation): a decode kernel launched with it
// (decode_launch, pdl = 1) may start while its predecessor in the stream still runs. Before pdl_wait() it
// reads only what no kernel of the step writes (the weights, which the GEMV prefetches into L2 there);
// pdl_wait() returns once the predecessor has finished and its writes are visible; pdl_trigger() lets the
// successor start. Both are no-ops on a kernel launched without it, and below sm_90.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// kernel<<<grid, block, 0, s>>>(args...), with programmatic dependent launch when pdl and the device has it.
template <typename... Params, typename... Args>
static inline void decode_launch(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t s, int pdl, Args... args) {
    int dev, major;
    FOX_CUDA_CHECK(cudaGetDevice(&dev));
    FOX_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = pdl && major >= 9;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.stream = s;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    FOX_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
}

// Paper eq. 15-20 for the new token of each sequence at position t >= 1 (docs/model.md §7): q = QK-norm(W_q x);
// k = QK-norm(α_t k~_{t-1} + (1 − α_t) W_k x) with k~_{t-1} from the shift state, v likewise; RoPE at angle t;
// c_t = c_{t-1} + log σ(gate logit). k, v, c_t go into the cache at t, the shift state moves on to this
// token's unshifted key and value, q (bf16) to q (B, H, dh). With acp (and a forget gate): first[b, h] =
// the first cached key the query reads (fox_acp_first_key; U from the head's QK-norm weights, else from
// |q_t| and the largest cached |k_j|²), and keys_read gains the keys it reads. s.proj holds the B rows of
// this step; cf: the data-dependent gate's column (-1: none); fbias NULL: no forget gate. One warp per
// (b, h). CPU: decode_qkv and decode_first_key.
// The document mask (s.sep >= 0, docs/model.md §1.8; s.tokens: the step's B tokens): when this token is a
// separator, KV-shift's previous key and value count as 0 and log f is FOX_DOC_LOG_F (c is kept without a
// forget gate too, log f = 0 elsewhere then); with acp (a forget gate or not) the first key read is at least
// the position of the sequence's latest separator: t itself for a separator, else doc_start[b] (the latest
// before t, which decode_advance_kernel keeps; NULL without the mask).
template <int PER_LANE>
__global__ void decode_qkv_kernel(bf16 *q, int *first, unsigned long long *keys_read, CacheLayer cl, QkvInputs s,
                                  int cf, const float *fbias, int acp, const int *doc_start, const int *pos) {
    size_t w = warp_index();
    int lane = threadIdx.x % 32;
    pdl_trigger();  // the attention's blocks may launch now; they wait for this grid to finish
    if (w >= (size_t)s.B * s.H) return;
    const int t = *pos;
    int b = (int)(w / s.H), h = (int)(w % s.H), D = s.H * s.dh;
    const int starts = s.sep >= 0 && fox_doc_start(s.tokens[b], s.sep);  // this token starts a document
    const bf16 *row = proj_wide_row(s.proj, b);
    bf16 *kp = cl.k_prev ? cl.k_prev + (size_t)b * D : NULL, *vp = cl.v_prev ? cl.v_prev + (size_t)b * D : NULL;
    float ak = kp ? sigmoidf_(proj_logit(s.proj, b, s.cols.k_shift + h)) : 0.0f;
    float av = vp ? sigmoidf_(proj_logit(s.proj, b, s.cols.v_shift + h)) : 0.0f;
    float qv[PER_LANE], kv[PER_LANE], vv[PER_LANE];
#pragma unroll
    for (int e = 0; e < PER_LANE; e++) {
        int i = h * s.dh + lane + 32 * e;
        const bf16 kb = row[s.cols.k + i], vb = row[s.cols.v + i];
        const float kt = __bfloat162float(kb), vt = __bfloat162float(vb);
        qv[e] = __bfloat162float(row[s.cols.q + i]);
        kv[e] = kp ? (starts ? 0.0f : ak * __bfloat162float(kp[i])) + (1.0f - ak) * kt : kt;  // kv_shift's arithmetic
        vv[e] = vp ? (starts ? 0.0f : av * __bfloat162float(vp[i])) + (1.0f - av) * vt : vt;
        if (kp) {
            kp[i] = kb;
            vp[i] = vb;
        }
    }
    float qw[PER_LANE], kw[PER_LANE];
    qk_weights<PER_LANE>(qw, kw, s, h, lane);
    qk_norm_rope<PER_LANE>(qv, kv, s, qw, kw, t, lane);
    size_t at = ((size_t)w * cl.max_len + t) * s.dh;
    float q2 = 0.0f, k2 = 0.0f;  // of the bf16 values attention reads
#pragma unroll
    for (int e = 0; e < PER_LANE; e++) {
        int i = lane + 32 * e;
        bf16 qb = __float2bfloat16(qv[e]), kb = __float2bfloat16(kv[e]);
        q[w * s.dh + i] = qb;
        cl.k[at + i] = kb;
        cl.v[at + i] = __float2bfloat16(vv[e]);
        q2 += __bfloat162float(qb) * __bfloat162float(qb);
        k2 += __bfloat162float(kb) * __bfloat162float(kb);
    }
    if (!cl.c) return;
    float *ch = cl.c + w * cl.max_len;
    if (lane == 0) {  // fox_gate_log_f's value (fox/forget_gate.cuh) for this row
        const float logit = cf >= 0 ? proj_logit(s.proj, b, cf + h) : 0.0f;
        float lf = starts ? FOX_DOC_LOG_F : fbias ? logsigmoidf_(fbias[h] + logit) : 0.0f;
        ch[t] = ch[t - 1] + lf;
    }
    if (!acp) return;
    const int doc = doc_start ? (starts ? t : doc_start[b]) : 0;  // the first key of this token's document
    if (!fbias) {  // no forget gate: no threshold, only the document's start
        if (lane == 0) {
            first[w] = doc;
            atomicAdd(keys_read, (unsigned long long)(t + 1 - doc));
        }
        return;
    }
    double U;
    if (s.qw) {
        float mq = 0.0f, mk = 0.0f;
#pragma unroll
        for (int e = 0; e < PER_LANE; e++) {
            mq = fmaxf(mq, fabsf(s.qw[h * s.wstride + lane + 32 * e]));
            mk = fmaxf(mk, fabsf(s.kw[h * s.wstride + lane + 32 * e]));
        }
        U = fox_acp_bound_qknorm(warp_max(mq), warp_max(mk), s.dh);
    } else {
        q2 = warp_sum(q2);
        k2 = fmaxf(cl.k_max2[w], warp_sum(k2));
        if (lane == 0) cl.k_max2[w] = k2;
        U = fox_acp_bound_norms(q2, k2, s.dh);
    }
    if (lane == 0) {
        int f = max(fox_acp_first_key(ch, t, fox_acp_threshold(U, t + 1)), doc);
        first[w] = f;
        atomicAdd(keys_read, (unsigned long long)(t + 1 - f));
    }
}

// After a prefill of T tokens: the largest |k_j|² of each (b, h)'s cached keys (ACP's bound without QK-norm).
// One warp per (b, h). CPU: the k_max2 of cache_append.
template <int PER_LANE>
__global__ void cache_key_norms_kernel(float *k_max2, const bf16 *k, int BH, int T, int max_len, int dh) {
    size_t w = warp_index();
    int lane = threadIdx.x % 32;
    if (w >= (size_t)BH) return;
    float mx = 0.0f;
    for (int t = 0; t < T; t++) {
        const bf16 *kr = k + (w * max_len + t) * dh;
        float k2 = 0.0f;
#pragma unroll
        for (int e = 0; e < PER_LANE; e++) k2 += __bfloat162float(kr[lane + 32 * e]) * __bfloat162float(kr[lane + 32 * e]);
        mx = fmaxf(mx, warp_sum(k2));
    }
    if (lane == 0) k_max2[w] = mx;
}

// ----------------------------------------------------------------------------
// Attention of the new token over the cache (paper eq. 11-13 for one query row, docs/model.md §7):
// o = Σ_{first <= j <= t} softmax_j(q·k_j/√dh + c_t − c_j) v_j, first = 0 without ACP.
// The live keys [first, t] of each (b, h) are cut into equal chunks of DECODE_MIN_KEYS keys at least, at most
// `splits` of them, one block each (the grid is (B·H, splits); the blocks past the live keys' chunks, at a
// short context or with ACP, leave empty partials, which the combine weighs exactly 0); a block's threads work in groups of dh/8, each thread holding 8 dimensions of q and of
// its output, each group a key at a time with DECODE_UNROLL keys' 16-byte loads in flight, an online
// softmax per group, then the groups merged in shared memory into the chunk's partial: the output
// unnormalised, its max m and its sum l (log2 units), in part[(bh · splits + split) · (dh + 2)]; a combine
// kernel then merges the chunks.
#define DECODE_THREADS 128
#define DECODE_UNROLL 4
#define DECODE_MIN_KEYS 64       // fewest keys per chunk worth a block of their own
#define DECODE_MAX_SPLITS 128

// 8 bf16 (one 16-byte load) as floats.
__device__ __forceinline__ void bf16x8_to_float(float f[8], uint4 u) {
    const __nv_bfloat162 *p = (const __nv_bfloat162 *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 x = __bfloat1622float2(p[i]);
        f[2 * i] = x.x;
        f[2 * i + 1] = x.y;
    }
}

// Sum over the G consecutive lanes of a thread group (G divides 32).
template <int G>
__device__ __forceinline__ float group_sum(float x) {
#pragma unroll
    for (int off = G / 2; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
    return x;
}

// One chunk's partial softmax-weighted sum. CPU: attend_row (train_fox.c).
template <int DH>
__global__ void __launch_bounds__(DECODE_THREADS) decode_attention_partial_kernel(float *part, const bf16 *q, const bf16 *k,
                                                                                  const bf16 *v, const float *c,
                                                                                  const int *first, int max_len, const int *pos) {
    constexpr int G = DH / 8, NG = DECODE_THREADS / G;  // threads per key, keys per pass of the block
    constexpr float LOG2E = 1.4426950408889634f;
    __shared__ float sm_m[NG], sm_l[NG], sm_o[NG][DH];
    const int bh = blockIdx.x, split = blockIdx.y, splits = gridDim.y;
    pdl_wait();
    pdl_trigger();
    const int g = threadIdx.x / G, r = threadIdx.x % G, t = *pos;
    const int lo = first ? first[bh] : 0, live = t + 1 - lo;
    const int chunks = min(splits, (live + DECODE_MIN_KEYS - 1) / DECODE_MIN_KEYS), per = (live + chunks - 1) / chunks;
    const int j0 = lo + split * per, j1 = min(t + 1, j0 + per);  // empty for split >= chunks
    float qf[8], acc[8] = {}, m = -INFINITY, l = 0.0f;
    bf16x8_to_float(qf, *(const uint4 *)(q + (size_t)bh * DH + 8 * r));
    const float qscale = LOG2E / sqrtf((float)DH);
#pragma unroll
    for (int i = 0; i < 8; i++) qf[i] *= qscale;
    const bf16 *kh = k + (size_t)bh * max_len * DH + 8 * r, *vh = v + (size_t)bh * max_len * DH + 8 * r;
    const float *ch = c ? c + (size_t)bh * max_len : NULL;
    const float ct = ch ? ch[t] : 0.0f;
    // The pass count is the same for every thread of the block, so the group sums see all their lanes.
    for (int base = j0; base < j1; base += NG * DECODE_UNROLL) {
        uint4 kr[DECODE_UNROLL], vr[DECODE_UNROLL];
        float s[DECODE_UNROLL];
#pragma unroll
        for (int u = 0; u < DECODE_UNROLL; u++) {
            int j = base + u * NG + g;
            kr[u] = vr[u] = make_uint4(0u, 0u, 0u, 0u);
            s[u] = -INFINITY;
            if (j < j1) {
                kr[u] = __ldg((const uint4 *)(kh + (size_t)j * DH));
                vr[u] = __ldg((const uint4 *)(vh + (size_t)j * DH));
                s[u] = ch ? (ct - ch[j]) * LOG2E : 0.0f;
            }
        }
        float mx = m;
#pragma unroll
        for (int u = 0; u < DECODE_UNROLL; u++) {
            float kf[8], d = 0.0f;
            bf16x8_to_float(kf, kr[u]);
#pragma unroll
            for (int i = 0; i < 8; i++) d += qf[i] * kf[i];
            s[u] += group_sum<G>(d);
            mx = fmaxf(mx, s[u]);
        }
        const float ms = mx == -INFINITY ? 0.0f : mx;  // a group without a key yet keeps l = acc = 0
        const float corr = exp2f(m - ms);
        l *= corr;
#pragma unroll
        for (int i = 0; i < 8; i++) acc[i] *= corr;
#pragma unroll
        for (int u = 0; u < DECODE_UNROLL; u++) {
            float vf[8], p = exp2f(s[u] - ms);
            bf16x8_to_float(vf, vr[u]);
            l += p;
#pragma unroll
            for (int i = 0; i < 8; i++) acc[i] += p * vf[i];
        }
        m = mx;
    }
    if (r == 0) {
        sm_m[g] = m;
        sm_l[g] = l;
    }
#pragma unroll
    for (int i = 0; i < 8; i++) sm_o[g][8 * r + i] = acc[i];
    __syncthreads();
    float M = -INFINITY;
    for (int gg = 0; gg < NG; gg++) M = fmaxf(M, sm_m[gg]);
    const float Ms = M == -INFINITY ? 0.0f : M;  // an empty chunk: m = -inf, l = 0, o = 0
    float *out = part + ((size_t)bh * splits + split) * (DH + 2);
    for (int d = threadIdx.x; d < DH; d += DECODE_THREADS) {
        float o = 0.0f;
        for (int gg = 0; gg < NG; gg++) o += sm_o[gg][d] * exp2f(sm_m[gg] - Ms);
        out[d] = o;
    }
    if (threadIdx.x == 0) {
        float L = 0.0f;
        for (int gg = 0; gg < NG; gg++) L += sm_l[gg] * exp2f(sm_m[gg] - Ms);
        out[DH] = M;
        out[DH + 1] = L;
    }
}

// The chunks' partials of each (b, h) merged: o = Σ_s o_s 2^(m_s − M) / Σ_s l_s 2^(m_s − M), M = max_s m_s, as
// bf16 (the output kernel's operand). One block per (b, h), every load independent of the others (the
// chunks' m and l one per thread, then the outputs by DECODE_COMBINE_THREADS / dh rows of threads, each row
// over every R-th chunk), all sums in a fixed order. Key t is always read, so M is finite.
#define DECODE_COMBINE_THREADS 256

// The block's reduction of x (max or sum), every thread of the block calling.
template <bool MAX>
__device__ __forceinline__ float combine_reduce(float x, float *red) {
    x = MAX ? warp_max(x) : warp_sum(x);
    __syncthreads();  // a previous call's reads of red are done
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = x;
    __syncthreads();
    x = red[0];
    for (int w = 1; w < DECODE_COMBINE_THREADS / 32; w++) x = MAX ? fmaxf(x, red[w]) : x + red[w];
    return x;
}

template <int DH>
__global__ void __launch_bounds__(DECODE_COMBINE_THREADS) decode_attention_combine_kernel(bf16 *o, const float *part, int splits) {
    static_assert(DECODE_MAX_SPLITS <= DECODE_COMBINE_THREADS, "one chunk's m and l per thread");
    constexpr int R = DECODE_COMBINE_THREADS / DH;
    __shared__ float w[DECODE_MAX_SPLITS], red[DECODE_COMBINE_THREADS / 32], rows[R][DH];
    pdl_wait();
    pdl_trigger();
    const int bh = blockIdx.x, tid = threadIdx.x, d = tid % DH, r = tid / DH;
    const float *p = part + (size_t)bh * splits * (DH + 2);
    const float m = tid < splits ? p[(size_t)tid * (DH + 2) + DH] : -INFINITY;
    const float l = tid < splits ? p[(size_t)tid * (DH + 2) + DH + 1] : 0.0f;
    const float M = combine_reduce<true>(m, red), ws = tid < splits ? exp2f(m - M) : 0.0f;
    if (tid < splits) w[tid] = ws;
    const float L = combine_reduce<false>(l * ws, red);  // its barriers also publish w
    float acc = 0.0f;
#pragma unroll 8
    for (int s = r; s < splits; s += R) acc += p[(size_t)s * (DH + 2) + d] * w[s];
    rows[r][d] = acc;
    __syncthreads();
    if (r == 0) {
        for (int rr = 1; rr < R; rr++) acc += rows[rr][d];
        o[(size_t)bh * DH + d] = __float2bfloat16(acc / L);
    }
}

// The most chunks per (b, h) a decode attention over BH rows at head dim dh uses on this device (the
// partials' scratch holds that many): enough blocks for DECODE_WAVES full waves (every SM holding as many
// blocks as its registers allow), at most DECODE_MAX_SPLITS.
#define DECODE_WAVES 4

static inline int fox_decode_max_splits(int BH, int dh) {
    int sms = fox_sm_count(), per_sm;
    const void *kernel = dh == 64 ? (const void *)decode_attention_partial_kernel<64> : (const void *)decode_attention_partial_kernel<128>;
    FOX_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, DECODE_THREADS, 0));
    long long want = ((long long)DECODE_WAVES * sms * per_sm + BH - 1) / BH;
    return want < 1 ? 1 : want > DECODE_MAX_SPLITS ? DECODE_MAX_SPLITS : (int)want;
}

// Floats of partials scratch for BH rows of up to max_splits chunks.
static inline size_t fox_decode_scratch_floats(int BH, int max_splits, int dh) { return (size_t)BH * max_splits * (dh + 2); }

// The attention of the query at position t = *pos (device memory) of each of BH (b, h) rows over its cached
// keys (see above), in at most `splits` chunks (1..DECODE_MAX_SPLITS; fox_decode_max_splits chooses; a short
// context uses fewer, the rest of the grid leaves empty partials): q, o (BH, dh) bf16; k, v (BH, max_len,
// dh) bf16; c (BH, max_len) or NULL (no forget gate: bias 0); first (BH) or NULL (every key from 0). part:
// fox_decode_scratch_floats(BH, splits, dh) floats at least. pdl: programmatic dependent launch (above).
static inline void fox_decode_attention(bf16 *o, const bf16 *q, const bf16 *k, const bf16 *v, const float *c,
                                        const int *first, float *part, int BH, int dh, int max_len, const int *pos, int splits,
                                        cudaStream_t s, int pdl) {
    dim3 grid(BH, splits);
    if (dh == 64) {
        decode_launch(decode_attention_partial_kernel<64>, grid, DECODE_THREADS, s, pdl, part, q, k, v, c, first, max_len, pos);
        decode_launch(decode_attention_combine_kernel<64>, BH, DECODE_COMBINE_THREADS, s, pdl, o, (const float *)part, splits);
    } else {
        decode_launch(decode_attention_partial_kernel<128>, grid, DECODE_THREADS, s, pdl, part, q, k, v, c, first, max_len, pos);
        decode_launch(decode_attention_combine_kernel<128>, BH, DECODE_COMBINE_THREADS, s, pdl, o, (const float *)part, splits);
    }
}

// ----------------------------------------------------------------------------
// The decode step's other work: at batch 1 its GEMMs are matrix-vector products that stream each weight
// once, and at any batch its norms are one row per sequence. cuBLASLt's kernels and the training kernels (a
// warp per row, built for thousands of rows) leave most of HBM's bandwidth unused there, so the step has its own.

// RMSNorm of each of the N rows (docs/model.md §1), one block per row: out = bf16(x · rstd · w), as
// rmsnorm_forward_kernel computes it (the sum of squares in another order).
#define DECODE_NORM_THREADS 256

__global__ void __launch_bounds__(DECODE_NORM_THREADS) decode_rmsnorm_kernel(bf16 *out, const float *in, const float *w,
                                                                            int D, float eps) {
    __shared__ float red[DECODE_NORM_THREADS / 32];
    pdl_wait();
    pdl_trigger();
    const int row = blockIdx.x, D4 = D / 4;
    const float4 *x = (const float4 *)(in + (size_t)row * D);
    float ss = 0.0f;
    for (int i = threadIdx.x; i < D4; i += DECODE_NORM_THREADS) {
        float4 a = x[i];
        ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
    }
    ss = warp_sum(ss);
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = ss;
    __syncthreads();
    ss = 0.0f;
#pragma unroll
    for (int k = 0; k < DECODE_NORM_THREADS / 32; k++) ss += red[k];
    const float rs = 1.0f / sqrtf(ss / D + eps);
    for (int i = threadIdx.x; i < D4; i += DECODE_NORM_THREADS) {
        float4 a = x[i], g = load_w4(w, i);
        store_bf16x4(out + (size_t)row * D + 4 * i, a.x * rs * g.x, a.y * rs * g.y, a.z * rs * g.z, a.w * rs * g.w);
    }
}

static inline void fox_decode_rmsnorm(bf16 *out, const float *in, const float *w, int N, int D, cudaStream_t s, int pdl) {
    fox_check_width(D);
    decode_launch(decode_rmsnorm_kernel, N, DECODE_NORM_THREADS, s, pdl, out, in, w, D, FOX_NORM_EPS);
}

// y[o] = Σ_i x[i] W[o, i] for the one row x (IN) bf16 of a batch-1 decode step, W (OUT, IN) bf16 row-major, fp32
// sums; then the epilogue EPI: DECODE_F32 out = y (fp32), DECODE_F32_ADD out = C + y (fp32, the residual add),
// DECODE_BF16 out = y (bf16), DECODE_SWIGLU out = bf16(silu(g) u) with g = bf16(y[o]) and u = bf16(y[o + OUT])
// (W holds the gate rows, then the up rows, as swiglu_forward_kernel reads them). Each warp owns
// DECODE_LINEAR_ROWS output rows and walks their weights with 16-byte loads, DECODE_LINEAR_UNROLL of them per
// row in flight; IN % 8 == 0 and 16-byte aligned rows. At batch 4 and 16 cuBLASLt is the faster (dev/cuda/NOTES.md).
enum { DECODE_F32 = 0, DECODE_F32_ADD = 1, DECODE_BF16 = 2, DECODE_SWIGLU = 3 };
#define DECODE_LINEAR_THREADS 128
#define DECODE_LINEAR_ROWS 2
#define DECODE_LINEAR_UNROLL 4

__device__ __forceinline__ float dot_bf16x8(uint4 a, const float b[8]) {
    float f[8];
    bf16x8_to_float(f, a);
    float d = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) d += f[i] * b[i];
    return d;
}

template <int EPI>
__global__ void __launch_bounds__(DECODE_LINEAR_THREADS) decode_linear_kernel(void *out, const float *C, const bf16 *x,
                                                                             const bf16 *W, int IN, int OUT) {
    constexpr int R = DECODE_LINEAR_ROWS, U = DECODE_LINEAR_UNROLL;
    const int lane = threadIdx.x % 32, warp = blockIdx.x * (DECODE_LINEAR_THREADS / 32) + threadIdx.x / 32, IN8 = IN / 8;
    // SwiGLU: the warp's rows are a gate row and its up row; else R consecutive rows.
    int rows[R];
    bool live[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        rows[r] = EPI == DECODE_SWIGLU ? warp + r * OUT : warp * R + r;
        live[r] = EPI == DECODE_SWIGLU ? warp < OUT : rows[r] < OUT;
    }
    if (!live[0]) return;
    // The warp's weight rows into L2 while the predecessor runs (a lane per 128-byte line).
#pragma unroll
    for (int r = 0; r < R; r++)
        for (int line = lane; live[r] && line < (IN + 63) / 64; line += 32)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(W + (size_t)rows[r] * IN + 64 * line));
    pdl_wait();
    pdl_trigger();
    float acc[R] = {};
    for (int base = lane; base < IN8; base += 32 * U) {
        uint4 wv[R][U];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int u = 0; u < U; u++) {
                int i = base + 32 * u;
                wv[r][u] = live[r] && i < IN8 ? __ldg((const uint4 *)(W + (size_t)rows[r] * IN) + i) : make_uint4(0u, 0u, 0u, 0u);
            }
#pragma unroll
        for (int u = 0; u < U; u++) {
            int i = base + 32 * u;
            if (i >= IN8) break;
            float xf[8];
            bf16x8_to_float(xf, *((const uint4 *)x + i));
#pragma unroll
            for (int r = 0; r < R; r++) acc[r] += dot_bf16x8(wv[r][u], xf);
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = warp_sum(acc[r]);
    if (lane != 0) return;
    if constexpr (EPI == DECODE_SWIGLU) {
        float g = __bfloat162float(__float2bfloat16(acc[0])), u = __bfloat162float(__float2bfloat16(acc[1]));
        ((bf16 *)out)[warp] = __float2bfloat16(g * sigmoidf_(g) * u);
    } else {
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (!live[r]) continue;
            if (EPI == DECODE_BF16) ((bf16 *)out)[rows[r]] = __float2bfloat16(acc[r]);
            else ((float *)out)[rows[r]] = (EPI == DECODE_F32_ADD ? C[rows[r]] : 0.0f) + acc[r];
        }
    }
}

// 1 when decode_linear serves these operands (one row, 16-byte rows); else the caller's GEMM does.
static inline int fox_decode_linear_fits(const bf16 *x, const bf16 *W, int B, int IN) {
    return B == 1 && IN % 8 == 0 && (uintptr_t)x % 16 == 0 && (uintptr_t)W % 16 == 0;
}

template <int EPI>
static inline void decode_linear_launch(void *out, const float *C, const bf16 *x, const bf16 *W, int IN, int OUT,
                                        cudaStream_t s, int pdl) {
    const int per_block = DECODE_LINEAR_THREADS / 32 * (EPI == DECODE_SWIGLU ? 1 : DECODE_LINEAR_ROWS);
    decode_launch(decode_linear_kernel<EPI>, (OUT + per_block - 1) / per_block, DECODE_LINEAR_THREADS, s, pdl, out, C, x, W,
                  IN, OUT);
}

// out (OUT) = [C +] x (IN) · W (OUT, IN)ᵀ with epilogue epi (above); SwiGLU: OUT outputs of W's 2·OUT rows.
// pdl: programmatic dependent launch (above).
static inline void fox_decode_linear(void *out, const float *C, const bf16 *x, const bf16 *W, int IN, int OUT, int epi,
                                     cudaStream_t s, int pdl) {
    if (!fox_decode_linear_fits(x, W, 1, IN)) fox_fatal("decode_linear of a row of width %d", IN);
    switch (epi) {
        case DECODE_F32: decode_linear_launch<DECODE_F32>(out, C, x, W, IN, OUT, s, pdl); break;
        case DECODE_F32_ADD: decode_linear_launch<DECODE_F32_ADD>(out, C, x, W, IN, OUT, s, pdl); break;
        case DECODE_BF16: decode_linear_launch<DECODE_BF16>(out, C, x, W, IN, OUT, s, pdl); break;
        default: decode_linear_launch<DECODE_SWIGLU>(out, C, x, W, IN, OUT, s, pdl); break;
    }
}

// The position of the next decode step: one thread, the last kernel of the step's graph. Under the document
// mask (doc_start not NULL) it first records the step's separators: doc_start[b] = the step's position when
// sequence b's token (tokens, B of them) is sep, so that the next steps' ACP starts there.
__global__ void decode_advance_kernel(int *pos, int *doc_start, const int *tokens, int B, int sep) {
    if (doc_start)
        for (int b = 0; b < B; b++)
            if (fox_doc_start(tokens[b], sep)) doc_start[b] = *pos;
    *pos += 1;
}

#endif  // FOX_DECODE_CUH
