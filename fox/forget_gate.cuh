// fox/forget_gate.cuh: the forget gate's kernels around Forgetting Attention (docs/model.md §1.1, §1.8; FoX paper
// eq. 20): c = the cumulative sum of log f before the forward, d log f = the reverse cumulative sum of dc after the
// backward (the attention backward's last step, fox_attention_backward in fox/attention.cuh), then the gate
// logits' gradient from d log f. Layouts as fox/attention.cuh's: c, dc, dlogf fp32 (B, H, T); proj's rows B·T.
// The CPU references are forget_gate_forward and forget_gate_backward in train_fox.c; dev/cuda/forget_gate.cu
// checks these kernels against an fp64 reference and times them.
// Measurements and the variants tried: dev/cuda/NOTES.md, section "Index: the notes of each product kernel".
#ifndef FOX_FORGET_GATE_CUH
#define FOX_FORGET_GATE_CUH

#include <stddef.h>                  // size_t
#include <cuda_runtime.h>            // cudaStream_t
#include "docmask.h"                 // fox_doc_start, FOX_DOC_LOG_F: the document mask's term of the scan
#include "cuda_common.cuh"           // FOX_LAUNCH_CHECK, logsigmoidf_, sigmoidf_, bf16
#include "proj.cuh"                  // Proj, proj_logit, proj_ld: the forget gate's logits

static constexpr int FOX_ATTN_SCAN_THREADS = 1024;

// log f_t of head h at row n (b·T + t) of proj (paper eq. 20): log σ(bias[h] + proj[n, cf + h]) (no projection
// term when cf < 0: data-independent and fixed gates; 0 when bias is NULL: no forget gate), replaced by
// FOX_DOC_LOG_F at a separator of the document mask (tokens[n] == sep; sep < 0: no mask, tokens unread and may be
// NULL; docs/model.md §1.8). CPU: log_forget.
__device__ __forceinline__ float fox_gate_log_f(const Proj &proj, int cf, const float *bias, const int *tokens, int sep,
                                                size_t n, int h) {
    if (sep >= 0 && fox_doc_start(tokens[n], sep)) return FOX_DOC_LOG_F;
    return bias ? logsigmoidf_(bias[h] + (cf >= 0 ? proj_logit(proj, n, cf + h) : 0.0f)) : 0.0f;
}

// Paper eq. 20 and the cumulative sum behind D_ij = c_i − c_j: c_t = Σ_{l≤t} log f_l per (b, h), log f_l from
// fox_gate_log_f, an inclusive fp32 scan (one block per sequence and head: each thread sums a contiguous
// chunk, the block scans the chunk totals, then each thread walks its chunk forward from its prefix).
// CPU: forget_gate_forward.
__global__ void __launch_bounds__(FOX_ATTN_SCAN_THREADS) forget_gate_forward_kernel(float *c, const Proj proj, int cf,
                                                                            const float *bias, const int *tokens, int sep,
                                                                            int H, int T) {
    __shared__ float warp_tot[FOX_ATTN_SCAN_THREADS / 32];
    int bh = blockIdx.x, b = bh / H, h = bh % H;
    int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    int chunk = (T + FOX_ATTN_SCAN_THREADS - 1) / FOX_ATTN_SCAN_THREADS, lo = min(T, tid * chunk), hi = min(T, lo + chunk);
    const size_t n0 = (size_t)b * T;  // the sequence's first row of proj and tokens
    float *cr = c + (size_t)bh * T;
    float tot = 0.0f;
    for (int t = lo; t < hi; t++) tot += fox_gate_log_f(proj, cf, bias, tokens, sep, n0 + t, h);
    float pre = tot;  // inclusive prefix across lanes, then across warps
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        float o = __shfl_up_sync(0xffffffffu, pre, off);
        if (lane >= off) pre += o;
    }
    if (lane == 31) warp_tot[warp] = pre;
    __syncthreads();
    if (warp == 0) {
        float x = warp_tot[lane];
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            float o = __shfl_up_sync(0xffffffffu, x, off);
            if (lane >= off) x += o;
        }
        warp_tot[lane] = x;
    }
    __syncthreads();
    float excl = __shfl_up_sync(0xffffffffu, pre, 1);  // exact exclusive prefix (no pre − tot)
    float run = (lane ? excl : 0.0f) + (warp ? warp_tot[warp - 1] : 0.0f);
    for (int t = lo; t < hi; t++) {
        run += fox_gate_log_f(proj, cf, bias, tokens, sep, n0 + t, h);
        cr[t] = run;
    }
}

// c (B, H, T) for the attention from the gate logits: proj's (B·T rows) at columns cf.. (cf < 0: none, and
// proj unread), bias (H), or NULL for no forget gate (c then holds the document mask's terms alone); tokens
// (B·T) and sep: the document mask (sep < 0: none, tokens may be NULL).
static inline void fox_forget_gate_forward(float *c, const Proj &proj, int cf, const float *bias, const int *tokens,
                                           int sep, int B, int H, int T, cudaStream_t s) {
    forget_gate_forward_kernel<<<B * H, FOX_ATTN_SCAN_THREADS, 0, s>>>(c, proj, cf, bias, tokens, sep, H, T);
    FOX_LAUNCH_CHECK();
}

// dc_t = (dS row sum)_t + (minus dS column sum)_t, stored back into dc, and dlogf_t = sum_{i >= t} dc_i
// (the paper's dc = dc^q + dc^k, then the gradient through c_t = sum_{l <= t} log f_l), a true reverse scan
// in fp32, one block per (b, h): each thread sums a contiguous chunk, the block scans the chunk totals,
// then each thread walks its chunk backwards from its suffix offset. No output is formed as a difference
// of large sums. Up to T = 32 FOX_ATTN_SCAN_STAGE (a segment then holds 32 threads' chunks or more) the row
// passes through shared memory in segments of FOX_ATTN_SCAN_STAGE elements, loaded and stored with
// consecutive threads on consecutive elements, each thread taking its chunk's part of a segment from there
// (segments in order, then in reverse): the loads are coalesced, but a segment's chunks are walked by its
// threads alone, a serial walk that grows as T^2, so longer rows read each chunk from global memory. Both
// form every sum in the order above (dev/cuda/attention_passes: the same bits as the unstaged form).
#define FOX_ATTN_SCAN_STAGE 4096
__device__ __forceinline__ int scan_pad(int j) { return j + (j >> 5); }  // a thread's chunk on distinct banks
__global__ void __launch_bounds__(FOX_ATTN_SCAN_THREADS)
fox_attention_reverse_scan_kernel(float *__restrict__ x, const float *__restrict__ xc, float *__restrict__ y, int T) {
    __shared__ float warp_tot[FOX_ATTN_SCAN_THREADS / 32];
    __shared__ float seg_x[FOX_ATTN_SCAN_STAGE + FOX_ATTN_SCAN_STAGE / 32];  // x + xc of a segment (scan_pad)
    __shared__ float seg_y[FOX_ATTN_SCAN_STAGE + FOX_ATTN_SCAN_STAGE / 32];  // its y
    float *xr = x + (size_t)blockIdx.x * T;
    const float *xcr = xc + (size_t)blockIdx.x * T;
    float *yr = y + (size_t)blockIdx.x * T;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int chunk = (T + FOX_ATTN_SCAN_THREADS - 1) / FOX_ATTN_SCAN_THREADS;
    const int lo = min(T, tid * chunk), hi = min(T, lo + chunk);
    const bool staged = chunk <= FOX_ATTN_SCAN_STAGE / 32;  // block-uniform
    const int nseg = (T + FOX_ATTN_SCAN_STAGE - 1) / FOX_ATTN_SCAN_STAGE;
    auto stage = [&](int s0, int s1) {  // seg_x = x + xc over [s0, s1)
        __syncthreads();  // the previous segment's reads are done
        for (int t = s0 + tid; t < s1; t += FOX_ATTN_SCAN_THREADS) seg_x[scan_pad(t - s0)] = xr[t] + xcr[t];
        __syncthreads();
    };
    float tot = 0.f;
    if (staged) {
        for (int k = 0; k < nseg; k++) {
            const int s0 = k * FOX_ATTN_SCAN_STAGE, s1 = min(T, s0 + FOX_ATTN_SCAN_STAGE);
            stage(s0, s1);
            for (int t = max(lo, s0); t < min(hi, s1); t++) tot += seg_x[scan_pad(t - s0)];
        }
    } else {
        for (int t = lo; t < hi; t++) tot += xr[t] + xcr[t];
    }
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
    float run = (lane < 31 ? after_mine : 0.f) + (warp + 1 < FOX_ATTN_SCAN_THREADS / 32 ? warp_tot[warp + 1] : 0.f);
    if (!staged) {
        for (int t = hi - 1; t >= lo; t--) {
            const float xt = xr[t] + xcr[t];
            xr[t] = xt;
            run += xt;
            yr[t] = run;
        }
        return;
    }
    for (int k = nseg - 1; k >= 0; k--) {
        const int s0 = k * FOX_ATTN_SCAN_STAGE, s1 = min(T, s0 + FOX_ATTN_SCAN_STAGE);
        stage(s0, s1);
        for (int t = min(hi, s1) - 1; t >= max(lo, s0); t--) {
            run += seg_x[scan_pad(t - s0)];
            seg_y[scan_pad(t - s0)] = run;
        }
        __syncthreads();
        for (int t = s0 + tid; t < s1; t += FOX_ATTN_SCAN_THREADS) {
            xr[t] = seg_x[scan_pad(t - s0)];
            yr[t] = seg_y[scan_pad(t - s0)];
        }
    }
}

// The backward's last step: dc += colsum (in place), dlogf = reverse cumulative sum of dc, for BH rows of T.
static inline void fox_attention_reverse_scan(float *dc, const float *colsum, float *dlogf, int BH, int T,
                                              cudaStream_t s) {
    fox_attention_reverse_scan_kernel<<<BH, FOX_ATTN_SCAN_THREADS, 0, s>>>(dc, colsum, dlogf, T);
    FOX_LAUNCH_CHECK();
}

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

#endif  // FOX_FORGET_GATE_CUH
