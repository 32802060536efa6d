// fox/attention.cuh: Forgetting Attention (docs/model.md §1.1; FoX paper eq. 11-13 and Appendix E), forward
// and backward, FlashAttention-2 style on tensor cores, bf16 operands with fp32 accumulation: warpgroup MMA
// (wgmma) on Hopper (sm_90a builds), with FlashAttention-3's warp specialisation (a TMA producer warp feeding
// consumer warpgroups that take turns on the tensor cores: three in the forward at d_h 64, two at 128; the
// backward in attention_backward.cuh), mma.sync m16n8k16 otherwise
// (sm_80), at d_h = 64 and 128.
// FOX_ATTN_NO_WGMMA=1 forces mma.sync. The CPU references are attention_forward and attention_backward in
// train_fox.c; dev/cuda/attention.cu checks this API against an fp64 reference and times it.
//
// Per (batch b, head h), scale = 1/sqrt(d_h), j <= i:
//   s_ij = scale q_i.k_j + c_i - c_j,  P = softmax_j(s),  o_i = sum_j P_ij v_j,  lse_i = logsumexp_j s_ij,
// where c_t = sum_{l <= t} log f_l is the cumulative log forget gate (c_i - c_j = D_ij, the paper's log F_ij).
// Under the document mask (docs/model.md §1.8) the scan of fox/forget_gate.cuh puts log f = FOX_DOC_LOG_F at
// every separator (with or without a gate), so c_i - c_j <= -512 across a document boundary; the attention is
// unchanged. The backward returns dc = dL/dc and d log f, its reverse cumulative sum: dlogf_t = sum_{i >= t} dc_i;
// forget_gate_backward_kernel (fox/forget_gate.cuh) then turns d log f into the gate logits' gradient (dproj's
// forget column, dfg).
// Layouts: q, k, v, dq, dk, dv bf16 (B, H, T, dh); o, dO bf16 (B, T, H, dh); c, lse, dc, dlogf fp32 (B, H, T);
// the bf16 tensors 16-byte aligned (the kernels move 16 bytes at a time).
//
// Adaptive Computation Pruning hooks work on a grid of FOX_ACP_BLOCK x FOX_ACP_BLOCK tiles (fox/acp.h):
// kv_first[(b*H + h)*nblk + m] is the first live key block of query block m, q_last[(b*H + h)*nblk + n]
// the last live query block of key block n (nblk = ceil(T / FOX_ACP_BLOCK)); NULL means no pruning. They
// describe a staircase (fox/acp.h): kv_first never decreases, so query block m's live key blocks are
// [kv_first[m], m] (the backward's add order counts on it).
// Every kernel's tiles nest inside that grid, so a pruned ACP tile is skipped exactly, forward and backward.
//
// Determinism: the forward is deterministic. The backward is deterministic when asked (deterministic = 1:
// the same inputs give bitwise the same outputs, run after run; the dQ and dc adds of the key blocks come
// in a fixed order, fox/attention_backward.cuh); deterministic = 0 adds them in arrival order (the low bits of
// dq, dc and dlogf can differ between runs; faster: with mma.sync, and on Hopper, where with no order to keep
// the key blocks are launched longest first).
// Measurements and the variants tried: dev/cuda/NOTES.md, section "Index: the notes of each product kernel".
#ifndef FOX_ATTENTION_CUH
#define FOX_ATTENTION_CUH

#include <stdio.h>                   // fprintf
#include <stdlib.h>                  // exit
#include <stdint.h>                  // uintptr_t
#include <cuda_runtime.h>            // cudaStream_t
#include <cuda_bf16.h>               // __nv_bfloat16
#include "acp.h"                     // FOX_ACP_BLOCK: the grid of the kv_first / q_last hooks
#include "forget_gate.cuh"           // fox_forget_gate_forward (c), fox_attention_reverse_scan (d log f), its backward
#include "attention_forward.cuh"     // fox_attn::forward: the forward kernel and its launcher
#include "attention_backward.cuh"    // fox_attn::backward: D = rowsum(dO o), dK / dV / dQ / dS sums, dq to bf16

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

// Bytes of device scratch the backward needs: the fp32 dq accumulators, D = rowsum(dO * o), the dS column
// and row sums and the order counters.
static inline size_t fox_attention_backward_scratch_bytes(int B, int H, int T, int dh) {
    return fox_attn::bwd_scratch_bytes(B, H, T, dh);
}

typedef fox_attn::BwdSums FoxAttnSums;

// The backward's steps 1 and 2 (fox_attn::backward), the deterministic order in one chain if one_chain.
static inline FoxAttnSums fox_attention_backward_sums(const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                                                      const __nv_bfloat16 *v, const float *c, const __nv_bfloat16 *o,
                                                      const float *lse, const __nv_bfloat16 *dout, float *dc,
                                                      __nv_bfloat16 *dk, __nv_bfloat16 *dv, void *scratch, int B, int H,
                                                      int T, int dh, const int *q_last, int deterministic,
                                                      bool one_chain, cudaStream_t s) {
    fox_attn_check_dh(dh);
    if ((uintptr_t)o % 16 || (uintptr_t)dout % 16) {
        fprintf(stderr, "error: the attention backward needs o and dO 16-byte aligned\n");
        exit(EXIT_FAILURE);
    }
    const bool det = deterministic != 0;
    if (dh == 64)
        return fox_attn::backward<64>(q, k, v, c, o, lse, dout, dc, dk, dv, scratch, B, H, T, q_last, det, one_chain, s);
    return fox_attn::backward<128>(q, k, v, c, o, lse, dout, dc, dk, dv, scratch, B, H, T, q_last, det, one_chain, s);
}

// The backward in two halves, for a caller whose queries also read keys the kernel does not see (TransformerFAM's
// memory, fox/fam.cuh): fox_attention_backward_keys writes dk, dv (bf16) and leaves in the scratch the fp32 dq
// accumulator (unscaled: Σ_j dS_ij k_j; in one chain, so one sum), D_i = dO_i·o_i, and the dS
// row sums in dc and minus column sums in colsum; the caller adds its own keys' terms to dq_acc, dc and colsum;
// fox_attention_backward_finish then writes dq and dc = dL/dc, dlogf = dL/dlog f. The sums' buffers are the
// scratch's (FoxAttnSums).
static inline FoxAttnSums fox_attention_backward_keys(const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                                                      const __nv_bfloat16 *v, const float *c, const __nv_bfloat16 *o,
                                                      const float *lse, const __nv_bfloat16 *dout, float *dc,
                                                      __nv_bfloat16 *dk, __nv_bfloat16 *dv, void *scratch, int B, int H,
                                                      int T, int dh, const int *q_last, int deterministic,
                                                      cudaStream_t s) {
    return fox_attention_backward_sums(q, k, v, c, o, lse, dout, dc, dk, dv, scratch, B, H, T, dh, q_last, deterministic,
                                       true, s);
}

static inline void fox_attention_backward_finish(FoxAttnSums sums, float *dc, float *dlogf, __nv_bfloat16 *dq, int B,
                                                 int H, int T, int dh, cudaStream_t s) {
    fox_attn::bwd_dq(sums, dc, dq, B, H, T, dh, s);
    fox_attention_reverse_scan(dc, sums.colsum, dlogf, B * H, T, s);
}

// Backward: dq, dk, dv (B, H, T, dh) bf16; dc = dL/dc and dlogf = dL/dlog f (reverse cumsum of dc),
// both fp32 (B, H, T). scratch: fox_attention_backward_scratch_bytes() bytes, 16-byte aligned.
// q_last: ACP hook (see top), or NULL. deterministic: 1 for bitwise-repeatable outputs, 0 for arrival-order
// fp32 atomics (see top).
static inline void fox_attention_backward(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                                          const float *c, const __nv_bfloat16 *o, const float *lse,
                                          const __nv_bfloat16 *dout, float *dc, float *dlogf, __nv_bfloat16 *dq,
                                          __nv_bfloat16 *dk, __nv_bfloat16 *dv, void *scratch, int B, int H, int T,
                                          int dh, const int *q_last, int deterministic, cudaStream_t s) {
    FoxAttnSums sums = fox_attention_backward_sums(q, k, v, c, o, lse, dout, dc, dk, dv, scratch, B, H, T, dh, q_last,
                                                   deterministic, false, s);
    fox_attention_backward_finish(sums, dc, dlogf, dq, B, H, T, dh, s);
}

#endif  // FOX_ATTENTION_CUH
