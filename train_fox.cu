// train_fox.cu: the CUDA trainer for the Forgetting Transformer (FoX). It computes the model of
// train_fox.c (same ops, same order, same run logic: flags, logs, checkpoints, resume, eval,
// sampling) with the precision of docs/model.md §2: bf16 GEMM and attention operands with fp32 accumulation;
// fp32 master weights, AdamW moments, residual stream, gate/norm/softmax statistics and loss.
// GEMMs: fox/gemm.cuh (cuBLASLt); attention: fox/attention.cuh; Gated Slot Attention (--model gsa): fox/gsa.cuh;
// TransformerFAM (--model transformer-fam, fox-fam): fox/attention.cuh's window and fox/fam.cuh's memory; the
// other kernels a header a role (the includes below); generation with a KV cache (prefill, decode steps):
// fox/decode.cuh (GSA: its recurrent state, fox/gsa.cuh).
// Data parallel when built with FOX_MPI and started by mpirun: one rank per GPU, each block's gradients
// averaged by NCCL during the step's last backward pass (reduce_final_grads), ZeRO-1 sharding of the
// AdamW state (--zero). test_fox.cu and test/test_decode_gpu.cu include this file with TESTING set.
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include "fox/config.h"        // FoxConfig, presets, FOX_PARAMS layout, FOX_ATTN_IN_ROWS (AttnCols)
#include "fox/io.h"            // fox_malloc, fox_calloc, fox_fatal: checked allocation, one-line errors
#include "fox/train_common.h"  // fox_init_params, fox_rope_angle, fox_counted_targets, OptConfig
#include "fox/dist.h"          // Dist, dist_allreduce_sum_f64, dist_broadcast: the data-parallel ranks (MPI)
#include "fox/watchdog.h"      // fox_watchdog_hooks: the collective timeout aborts the NCCL communicator
#include "fox/trainer.h"       // ModelOptions and the run_model_* functions this file defines for fox/run.h
#include "fox/cuda_common.cuh" // FOX_CUDA_CHECK, FOX_LAUNCH_CHECK, bf16
#include "fox/attention.cuh"   // fox_attention_forward/backward: Forgetting Attention (and fox/forget_gate.cuh's scans)
#include "fox/gemm.cuh"        // Gemm, linear_forward, linear_backward_*: cuBLASLt GEMMs
#include "fox/rows.cuh"        // LAUNCH_HEADS, colsum_accumulate, colsum_*_floats: the row-wise kernels' rows and sums
#include "fox/embedding.cuh"   // fox_embedding_buckets, fox_embedding_backward: the token embedding
#include "fox/rmsnorm.cuh"     // fox_rmsnorm_forward/backward: the residual stream's norms
#include "fox/attn_inputs.cuh" // QkvInputs, fox_qkv_forward/backward: KV-shift, QK-norm, RoPE
#include "fox/acp_tables.cuh"  // fox_acp_tables: ACP's live key blocks per query block
#include "fox/output_gate.cuh" // fox_output_forward/backward: the output norm and gate
#include "fox/swiglu.cuh"      // fox_swiglu_forward/backward: the MLP's SwiGLU
#include "fox/crossentropy.cuh" // fox_crossentropy: losses and dlogits in one pass over the logits
#include "fox/adamw.cuh"       // fox_adamw, the gradient norm's sums, the weights' bf16 copy
#include "fox/decode.cuh"      // CacheLayer, decode_qkv_kernel, fox_decode_attention: a decode step over the KV cache
#include "fox/gsa.cuh"         // fox_gsa_forward/backward: Gated Slot Attention's chunked kernels, its output norm, decode
#include "fox/fam.cuh"         // TransformerFAM: the window's staircase, the memory's attention kernels and merges
#include "fox/args.h"          // fox_usage_error: a model train_fox cannot run is a one-line error, exit 2
#include "fox/docmask.h"       // fox_doc_start, fox_doc_first_blocks: the document mask (--doc-mask)
#ifdef FOX_MPI
#include <nccl.h>

#define FOX_NCCL_CHECK(call) fox_nccl_check((call), #call, __FILE__, __LINE__)
static inline void fox_nccl_check(ncclResult_t r, const char *what, const char *file, int line) {
    if (r != ncclSuccess) {
        fprintf(stderr, "NCCL error at %s:%d: %s: %s\n", file, line, what, ncclGetErrorString(r));
        exit(EXIT_FAILURE);
    }
}
#endif

// Activation recomputation (--recompute): what the forward keeps for the backward.
enum { RECOMPUTE_NONE = 0, RECOMPUTE_NORM_MLP = 1, RECOMPUTE_BLOCK = 2 };

// ----------------------------------------------------------------------------
// Model state (all device memory unless named h_)

// TransformerFAM (docs/model.md §1.10): the arrays of the memory rows' pass through a layer, its attention inputs
// and then its update through the attention's output and the MLP, X(type, name, row width); q, k, v in the
// attention's (B, H, M, dh) layout, the others by row. Kept at every recompute level.
#define FAM_FIELDS(X) \
    X(float, x, D) X(bf16, xn1, D) X(bf16, proj_wide, NW) X(float, proj_logits, NL) X(bf16, q, D) X(bf16, k, D) \
    X(bf16, v, D) X(bf16, o, D) X(float, lse, H) X(bf16, z, D) X(float, mid, D) X(bf16, xn2, D) X(bf16, u, 2 * I) \
    X(bf16, h, I)

typedef struct {
#define X(type, name, width) type *name;
    FAM_FIELDS(X)
#undef X
} FamRows;

// The row widths FAM_FIELDS names, for model m.
#define FAM_WIDTHS(m) size_t D = (size_t)(m)->cfg.d_model, NINP = (size_t)(m)->NINP, H = (size_t)(m)->cfg.n_head, \
                             I = (size_t)(m)->cfg.mlp_hidden, NW = (size_t)(m)->cols.wide, NL = NINP - NW

// Per-layer activations: each ** entry points at its layer's slice, or, for what the recompute level or the
// device's room drops (q, k, v from block qkv_kept on, xn1, xn2, z, mlp_h from block outs_kept on), at one slice
// shared by those layers, which the backward writes again before their weight-gradient GEMM or the attention
// backward (recompute_block; the norm, output and SwiGLU backward kernels rewrite xn1, z and mlp_h bitwise).
typedef struct {
    float *resid;   // (L+1, N, D): input of each block, then the last block's output (always kept)
    float **mid;    // (N, D): residual after attention
    bf16 **xn1, **xn2;  // (N, D): RMSNorm(resid) and RMSNorm(mid), attn_in_w's and mlp_in_w's operands; blocks
                       // from outs_kept on share one slice for both (the backward writes each again)
    bf16 **proj_wide;     // (N, cols.wide): attn_in_w's outputs q, k, v and the output gate (docs/model.md §1.6)
    float **proj_logits;  // (N, NINP − cols.wide): its per-head logits (fp32: gates and shifts are formed in fp32)
    bf16 **q, **k, **v;  // (B, H, T, dh): attention operands after KV-shift, QK-norm, RoPE; GSA:
                         // (N + GSA_CHUNK, D), the Swish features (the rows past N stay zero)
    float **c, **lse;    // (B, H, T): c = Σ log f (a forget gate or the document mask); attention log-sum-exp
    bf16 **o;       // (N, D): attention output
    bf16 **z;       // (N, D): o output-normed and gated (attn_out_w's operand)
    bf16 **mlp_u;   // (N, 2I): mlp_in_w output
    bf16 **mlp_h;   // (N, I): SwiGLU output
    bf16 **gsa_S, **gsa_U;  // GSA (fox/gsa.cuh): (B·G, nc, GSA_SLOTS, dh) the states after each chunk
    float **gsa_s;          // (B·G, T, GSA_SLOTS): the slot scores (their log-sum-exp in lse)
    float *gsa_dS, *gsa_dU, *gsa_decay;  // scratch of the forward's and backward's state scans
    bf16 *xnf;      // (N, D)
    bf16 *logits;   // (ce_rows, VP); the fused cross entropy turns it into dlogits
    float *losses;  // (N)
    float *zero_c;  // (B, H, T) zeros: the gate bias of the presets without a forget gate (and no document mask)
    int *acp_kv_first, *acp_q_last;  // (B, H, ceil(T / FOX_ACP_BLOCK)): the ACP staircase of one block
    int *doc_first;  // (B, ceil(T / FOX_ACP_BLOCK)): ACP's first key block of each query block's document
                     // (fox_doc_first_blocks of the forward's inputs; ACP with the document mask)
    unsigned long long *acp_live;    // (L, H): attention tiles the forward pass computes, over the batch (ACP)
    int *inputs, *targets;   // (N)
    FamRows fam;             // FAM: per layer, the memory states F_0 .. F_{T/K - 1} (B·M rows each), then the prompt
                             // entering the layer (M rows)
    int *fam_kv_first, *fam_q_last;  // FAM: (B, H, ceil(T / FOX_ACP_BLOCK)) the window as a staircase
} Acts;

// Gradient scratch for one block at a time.
typedef struct {
    float *dres;      // (N, D) dL/d residual
    bf16 *dres_bf;    // (N, D) the same as a GEMM operand: dL/d mid, the token mixer's output
    bf16 *dres_up_bf; // (N, D) dL/d resid[l+1], the MLP's output (the MLP's weight gradients read it beside
                      // the mixer's backward)
    float *dxn;       // (N, D) GEMM output: dL/d normed input, or dL/d z
    bf16 *dh;         // (N, I)
    bf16 *du;         // (N, 2I)
    bf16 *dproj;      // (N, NINP); the padding columns zero (clear_dproj_padding)
    bf16 *dq, *dk, *dv, *d_o;  // GSA: d_o (N + GSA_CHUNK, D), no dq, dk, dv (its kernels write dproj)
    float *dc, *dlogf, *dfg;  // (B, H, T), (B, H, T), (N, H)
    float *colsum_rows;       // block partials of the fused norm-weight column sums
    float *colsum_part, *sumsq_part;
    double *sumsq;
    void *attn_scratch;
    int *buckets;     // the embedding backward's buckets (3N + 1 ints: fox_embedding_buckets' layout)
    bf16 *gsa_dSs, *gsa_dUs;  // GSA: dL/d the states after each chunk
    float *gsa_dsr, *gsa_y;   // GSA: (B·G, T, GSA_SLOTS)
    bf16 *gsa_D1, *gsa_Pt;    // GSA: (B·G, nc, GSA_CHUNK, GSA_CHUNK)
} Scratch;

// TransformerFAM's backward scratch (R = B·M rows a state, nS = T/K states).
typedef struct {
    float *dx, *dk, *dv;  // (nS, R, D): dL/d each state's rows, and its keys' and values' ((B, H, M, dh) layout)
    bf16 *dxbf;           // (R, D): a rows' gradient as a GEMM operand
    float *dxn;           // (R, D)
    bf16 *dh;             // (R, I)
    bf16 *du, *dproj, *d_o, *dq, *dkb, *dvb;  // (R, 2I), (R, NINP), (R, D) each
    float *rows3;         // (B, H, M, 3): fam_update_backward's per-query sums
    float *ds_rows;       // (B, H, T): fam_token_memory_backward's
    float *dprompt[2];    // (M, D): dL/d the prompt's rows entering layer l, at [l & 1]
} FamScratch;

// The KV cache of generation (docs/model.md §7) for the model's B sequences of up to max_len tokens; a
// layer's slice is a CacheLayer (fox/decode.cuh).
typedef struct {
    int max_len, len;               // capacity and cached positions (0: no cache)
    int prefilling;                 // model_forward stores each block's keys, values, c and shift state
    int max_splits;                 // key chunks per (b, h) of the decode attention, at most
    bf16 *k, *v;                    // (L, B, H, max_len, dh)
    float *c;                       // (L, B, H, max_len): a forget gate or the document mask
    int *doc_start;                 // (B): each sequence's latest separator position (document mask; 0: none)
    bf16 *k_prev, *v_prev;          // (L, B, D): the KV-shift state
    float *k_max2;                  // (L, B, H): ACP without QK-norm
    bf16 *q;                        // (B, H, dh): one step's queries
    int *first;                     // (B, H): one step's first key read (ACP)
    float *part;                    // the decode attention's partials
    unsigned long long *keys_read;  // keys read by the decode steps since the prefill (ACP)
    long long keys_cached;          // and the keys they had in the cache
    int *pos;                       // the next decode step's position, on the device (= len)
    cudaGraphExec_t step;           // the decode step's kernels as one graph (NULL until the first step)
    int step_acp;                   // the ACP switch the graph was captured with
    float *gsa_S, *gsa_U;           // GSA instead of keys and values: (L, B·G, GSA_SLOTS, dh) the recurrent states
    FamRows fam;                    // FAM: per layer, the current memory's B·M rows (x and its attention inputs)
} Cache;

struct Model {
    FoxConfig cfg;
    FoxLayout lay;
    AttnCols cols;
    int NINP, VP, Dh, recompute;
    int qkv_kept;                   // blocks [0, qkv_kept) keep their attention q, k, v for the backward
    int outs_kept;                  // blocks [0, outs_kept) keep xn1, xn2, z and mlp_h, which the backward
                                    // kernels otherwise write again
    int forward_only;               // --eval-only: no gradients, AdamW moments or backward scratch
    int planning;                   // the buffers are only counted (device_bytes_needed), not allocated
    int acp;                        // Adaptive Computation Pruning (--acp)
    int doc_sep;                    // --doc-mask: the separator token (docs/model.md §1.8); -1: no mask
    unsigned long long *acp_live;   // (L, H): a->acp_live of the last forward on the host (ACP)
    long long acp_tiles;            // tiles in one (layer, head)'s causal grids, B·fox_acp_tiles(T); 0: no ACP
    int deterministic;              // bitwise reproducible attention backward (--deterministic)
    size_t logits_bytes;            // largest bf16 logits buffer; longer batches run the lm_head and
                                    // cross entropy in chunks, recomputing each chunk's logits in the backward
    float *params, *grads, *m, *v;  // fp32, FOX_PARAMS layout (a checkpoint is a straight copy)
    unsigned char *grad_fresh;      // (FOX_NUM_PARAMS, n_layer): a GEMM weight's gradient slice not yet written
                                    // this step (weight_grad); not when forward_only
    bf16 *wbf[FOX_NUM_PARAMS];      // bf16 copies of the GEMM weights, rows padded (NULL otherwise)
    size_t rows_pad[FOX_NUM_PARAMS];
    float *rope_cos, *rope_sin;     // (rope_len, dh/2), RoPE presets only
    float *fam_rope_cos, *fam_rope_sin;  // FAM with RoPE: (fam_rope_states, M, dh/2), state τ's positions τK − M + i
    int fam_rope_states;            // memory states the FAM RoPE tables cover: fam_states(T), or a longer cache's
    int rope_len;                   // positions the RoPE tables cover: T, or a longer cache's max_len
    int B, T, ce_rows;
    int dlogits_kept;               // a->logits holds the dlogits of the last forward's whole batch
    Acts a;
    Scratch s;
    FamScratch fs;
    Gemm gemm;
    cudaStream_t stream;
    // The MLP's and W_o's weight-gradient GEMMs run on wstream (lower priority) beside the attention backward,
    // filling the SMs its kernels leave idle (its last blocks); not forward_only (beside_begin).
    Gemm wgemm;
    cudaStream_t wstream;
    cudaEvent_t beside_ready, beside_done;
    int world;                      // data-parallel ranks (1: no gradient averaging)
    size_t shard_lo, shard_hi;      // the elements whose AdamW moments this rank holds and updates
                                    // (ZeRO-1: rank r's 1/world of the flat vector; else all); m, v
                                    // hold shard_hi - shard_lo floats
#ifdef FOX_MPI
    ncclComm_t nccl;                // the ranks of a data-parallel run (NULL with one rank)
    cudaStream_t comm;              // where the all-reduces run, beside the backward pass
    cudaEvent_t grads_final, reduced;
#endif
    // Pinned host buffers, so that their copies wait for nothing else: the forward's inputs and targets (2N),
    // a->doc_first, and the per-position losses (N) and a->acp_live coming back; the events mark the copies.
    int *h_tokens;
    int *h_doc_first;               // (B, ceil(T / FOX_ACP_BLOCK))
    float *h_losses;
    cudaEvent_t tokens_copied;      // h_tokens and h_doc_first may be written again after it
    cudaEvent_t losses_copied;      // h_losses (losses_n of them) and acp_live hold the last forward's after it
    int losses_n;
    int counted;                    // the last forward's targets the loss counts (the non-negative ones)
    int *h_count, *h_fill;          // (V), h_bucket_key (N): fox_embedding_buckets' scratch
    int *h_buckets;                 // (3N + 1) pinned: fox_embedding_buckets' tables, copied to s.buckets
    uint64_t *h_bucket_key;
    cudaEvent_t buckets_copied;     // after the last copy of h_buckets (which must not change before it)
    size_t bytes_weights, bytes_acts, bytes_scratch;
    Cache cache;
};

// Whether attention takes a bias c (and the forget-gate scan runs): a forget gate, or the document mask's
// boundary terms (docs/model.md §1.8). Otherwise it gets a->zero_c.
static int model_has_c(const Model *m) { return m->cfg.forget_gate != FOX_FG_NONE || m->doc_sep >= 0; }

// A zeroed device buffer, its size added to *counter; when the model is only being planned, the size
// alone (NULL).
static void *dev_alloc(const Model *m, size_t bytes, size_t *counter) {
    void *p = NULL;
    if (bytes == 0) bytes = 16;
    *counter += bytes;
    if (m->planning) return NULL;
    FOX_CUDA_CHECK(cudaMalloc(&p, bytes));
    FOX_CUDA_CHECK(cudaMemset(p, 0, bytes));
    return p;
}

// n arrays of L pointers (*out[0] .. *out[n-1]) into one allocation, which *out[0]'s first slice starts:
// layers [0, kept) have a slice in each array, the others (if any) share one more across all n (NULL when
// planning).
static void layer_slice_arrays(const Model *m, int L, size_t bytes, int kept, int n, void ***out[], size_t *counter) {
    char *base = (char *)dev_alloc(m, bytes * (size_t)n * (kept < L ? kept : L) + (kept < L ? bytes : 0), counter);
    for (int i = 0; i < n; i++) {
        *out[i] = NULL;
        if (m->planning) continue;
        *out[i] = (void **)fox_calloc((size_t)L, sizeof(void *));
        for (int l = 0; l < L; l++) (*out[i])[l] = base + bytes * (size_t)(l < kept ? n * l + i : n * kept);
    }
}

// A buffer carved out of a shared allocation: where its pointer goes, and its size.
typedef struct {
    void **ptr;
    size_t bytes;
} Carve;

// The logits buffer (logits_b bytes, in the activations' count) and the backward's per-block buffers `carves` in one
// allocation (the excess over the logits in the scratch's count). The logits are live from the forward's lm_head
// to the backward's lm_head GEMMs, which come before any block's backward; each carved buffer is written by a
// block's backward before that backward reads it (dproj's padding columns: zeroed after the lm_head GEMMs).
static void logits_region_alloc(Model *m, size_t logits_b, Carve *carves, int n) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += (carves[i].bytes + 255) / 256 * 256;
    char *base = (char *)dev_alloc(m, logits_b > total ? logits_b : total, &m->bytes_acts);
    if (total > logits_b) {
        m->bytes_acts -= total - logits_b;
        m->bytes_scratch += total - logits_b;
    }
    m->a.logits = (bf16 *)base;
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        *carves[i].ptr = base ? base + off : NULL;
        off += (carves[i].bytes + 255) / 256 * 256;
    }
}

// One such array.
static void **layer_slices(const Model *m, int L, size_t bytes, int kept, size_t *counter) {
    void **p, ***out[1] = {&p};
    layer_slice_arrays(m, L, bytes, kept, 1, out, counter);
    return p;
}

static float *param(Model *m, int which, int layer) { return m->params + fox_param_offset(&m->lay, which, layer); }

static float *grad(Model *m, int which, int layer) { return m->grads + fox_param_offset(&m->lay, which, layer); }

static const bf16 *wbf(Model *m, int which, int layer) {
    return m->wbf[which] + (size_t)layer * m->rows_pad[which] * m->lay.p[which].cols;
}

static int is_gemm_weight(int k) {
    return k == FOX_P_attn_in_w || k == FOX_P_attn_out_w || k == FOX_P_mlp_in_w || k == FOX_P_mlp_out_w || k == FOX_P_lm_head_w;
}

// GEMM weight `which`'s layer-`layer` gradient (+)= scale · doutᵀ in (linear_backward_weight on g): the slice's
// first product of the step overwrites it and the others add (model_zero_grad leaves these slices out, so a
// step's first product, not a memset, clears the last step's values).
static void weight_grad(Model *m, Gemm *g, int which, int layer, const bf16 *dout, int ldd, const bf16 *in, int N, int IN,
                        int OUT, float scale) {
    unsigned char *fresh = &m->grad_fresh[(size_t)which * m->cfg.n_layer + layer];
    linear_backward_weight(g, grad(m, which, layer), dout, ldd, in, N, IN, OUT, scale, !*fresh);
    *fresh = 0;
}

// Rewrites every bf16 GEMM weight from the fp32 masters (after init or a load).
static void model_refresh_bf16(Model *m) {
    for (int k = 0; k < FOX_NUM_PARAMS; k++) {
        if (!m->wbf[k]) continue;
        const FoxParamInfo *p = &m->lay.p[k];
        size_t layer_numel = p->rows * p->cols, pad = (m->rows_pad[k] - p->rows) * p->cols;
        to_bf16_padded_kernel<<<fox_blocks(p->numel, 256), 256, 0, m->stream>>>(m->wbf[k], m->params + p->offset,
                                                                                 p->numel, layer_numel, pad);
        FOX_LAUNCH_CHECK();
    }
}

// Copies host fp32 weights (FOX_PARAMS layout) to the device masters and their bf16 copies.
static void model_set_params(Model *m, const float *host) {
    FOX_CUDA_CHECK(cudaMemcpy(m->params, host, m->lay.total * sizeof(float), cudaMemcpyHostToDevice));
    model_refresh_bf16(m);
}

static void model_get_params(Model *m, float *host) {
    FOX_CUDA_CHECK(cudaMemcpy(host, m->params, m->lay.total * sizeof(float), cudaMemcpyDeviceToHost));
}

// GSA's sizes for B x T tokens (fox/gsa.cuh): elements of the states of all chunks, of the slot scores, of the
// chunks' (GSA_CHUNK, GSA_CHUNK) matrices; 0 for an attention model.
typedef struct {
    size_t state, scores, pairs, decay;
} GsaSizes;

static GsaSizes gsa_sizes(const Model *m, int B, int T) {
    GsaSizes z = {0, 0, 0, 0};
    if (m->cfg.arch != FOX_ARCH_GSA) return z;
    size_t BG = (size_t)B * m->cfg.gsa_heads, nc = (size_t)gsa_chunks(T);
    z.state = BG * nc * GSA_SLOTS * m->Dh;
    z.scores = BG * T * GSA_SLOTS;
    z.pairs = BG * nc * GSA_CHUNK * GSA_CHUNK;
    z.decay = BG * nc * GSA_SLOTS;
    return z;
}

// TransformerFAM's memory states read by T tokens: one a block, the last block partial in a generation's prompt
// (docs/model.md §1.10).
static int fam_states(const Model *m, int T) { return (T + m->cfg.fam_block - 1) / m->cfg.fam_block; }

// TransformerFAM (docs/model.md §1.10): a layer's rows in a->fam, the states of the model's B x T capacity, then
// the prompt's.
static size_t fam_layer_rows(const Model *m) {
    size_t M = (size_t)m->cfg.fam_memory;
    return (size_t)fam_states(m, m->T) * m->B * M + M;
}

// The rows of a->fam from row r on.
static FamRows fam_rows_at(const Model *m, size_t r) {
    FAM_WIDTHS(m);
    FamRows f;
#define X(type, name, width) f.name = m->a.fam.name + r * (width);
    FAM_FIELDS(X)
#undef X
    return f;
}

// Memory state τ of layer l for B sequences (B·M rows), and the prompt's rows entering layer l (M rows).
static FamRows fam_state(const Model *m, int l, int tau, int B) {
    return fam_rows_at(m, (size_t)l * fam_layer_rows(m) + (size_t)tau * B * m->cfg.fam_memory);
}

static FamRows fam_prompt(const Model *m, int l) {
    return fam_rows_at(m, (size_t)l * fam_layer_rows(m) + fam_layer_rows(m) - m->cfg.fam_memory);
}

// FAM's rows, window tables and RoPE tables, and unless forward_only its backward scratch.
static void fam_alloc(Model *m, int B, int T) {
    const FoxConfig *cfg = &m->cfg;
    FAM_WIDTHS(m);
    size_t rows = (size_t)cfg->n_layer * fam_layer_rows(m), M = (size_t)cfg->fam_memory, R = (size_t)B * M;
    size_t nS = (size_t)fam_states(m, T), f = sizeof(float), b = sizeof(bf16), *cnt = &m->bytes_acts;
    Acts *a = &m->a;
#define X(type, name, width) a->fam.name = (type *)dev_alloc(m, rows * (width) * sizeof(type), cnt);
    FAM_FIELDS(X)
#undef X
    a->fam_kv_first = (int *)dev_alloc(m, (size_t)B * H * fox_acp_blocks(T) * sizeof(int), cnt);
    a->fam_q_last = (int *)dev_alloc(m, (size_t)B * H * fox_acp_blocks(T) * sizeof(int), cnt);
    if (cfg->rope) {
        m->fam_rope_cos = (float *)dev_alloc(m, nS * M * (m->Dh / 2) * f, cnt);
        m->fam_rope_sin = (float *)dev_alloc(m, nS * M * (m->Dh / 2) * f, cnt);
        m->fam_rope_states = (int)nS;
    }
    if (m->forward_only) return;
    FamScratch *g = &m->fs;
    cnt = &m->bytes_scratch;
    g->dx = (float *)dev_alloc(m, nS * R * D * f, cnt);
    g->dk = (float *)dev_alloc(m, nS * R * D * f, cnt);
    g->dv = (float *)dev_alloc(m, nS * R * D * f, cnt);
    g->dxbf = (bf16 *)dev_alloc(m, R * D * b, cnt);
    g->dxn = (float *)dev_alloc(m, R * D * f, cnt);
    g->dh = (bf16 *)dev_alloc(m, R * I * b, cnt);
    g->du = (bf16 *)dev_alloc(m, R * 2 * I * b, cnt);
    g->dproj = (bf16 *)dev_alloc(m, R * NINP * b, cnt);
    bf16 **rows_bf[] = {&g->d_o, &g->dq, &g->dkb, &g->dvb};
    for (int i = 0; i < 4; i++) *rows_bf[i] = (bf16 *)dev_alloc(m, R * D * b, cnt);
    g->rows3 = (float *)dev_alloc(m, (size_t)B * H * M * 3 * f, cnt);
    g->ds_rows = (float *)dev_alloc(m, (size_t)B * H * T * f, cnt);
    for (int i = 0; i < 2; i++) g->dprompt[i] = (float *)dev_alloc(m, M * D * f, cnt);
}

static void fam_free(Model *m) {
    FamScratch *g = &m->fs;
#define X(type, name, width) FOX_CUDA_CHECK(cudaFree(m->a.fam.name));
    FAM_FIELDS(X)
#undef X
    void *bufs[] = {m->a.fam_kv_first, m->a.fam_q_last, m->fam_rope_cos, m->fam_rope_sin, g->dx, g->dk, g->dv, g->dxbf,
                    g->dxn, g->dh, g->du, g->dproj, g->d_o, g->dq, g->dkb, g->dvb, g->rows3, g->ds_rows,
                    g->dprompt[0], g->dprompt[1]};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) FOX_CUDA_CHECK(cudaFree(bufs[i]));
}

// The activations the forward keeps (by recompute level) and, unless forward_only, the backward's
// scratch. GSA keeps its states and slot scores where attention keeps c (and reads q, k, v and d_o a chunk
// past their last row), and needs none of attention's backward scratch.
static void model_alloc_acts(Model *m, int B, int T) {
    const FoxConfig *cfg = &m->cfg;
    int L = cfg->n_layer, r = m->recompute, gsa = cfg->arch == FOX_ARCH_GSA;
    size_t N = (size_t)B * T, D = (size_t)cfg->d_model, H = (size_t)cfg->n_head, I = (size_t)cfg->mlp_hidden;
    size_t NINP = (size_t)m->NINP, f = sizeof(float), h = sizeof(bf16), *cnt = &m->bytes_acts;
    size_t NQ = gsa ? N + GSA_CHUNK : N;  // rows of q, k, v, d_o
    int keep_block = r < RECOMPUTE_BLOCK ? L : 0, keep_norm_mlp = r < RECOMPUTE_NORM_MLP ? L : 0;
    GsaSizes gz = gsa_sizes(m, B, T);
    Acts *a = &m->a;
    a->resid = (float *)dev_alloc(m, (L + 1) * N * D * f, cnt);
    a->mid = (float **)layer_slices(m, L, N * D * f, keep_block, cnt);
    void ***xns[2] = {(void ***)&a->xn1, (void ***)&a->xn2};
    layer_slice_arrays(m, L, N * D * h, m->outs_kept, 2, xns, cnt);
    a->proj_wide = (bf16 **)layer_slices(m, L, N * m->cols.wide * h, keep_block, cnt);
    a->proj_logits = (float **)layer_slices(m, L, N * (NINP - m->cols.wide) * f, keep_block, cnt);
    a->q = (bf16 **)layer_slices(m, L, NQ * D * h, m->qkv_kept, cnt);
    a->k = (bf16 **)layer_slices(m, L, NQ * D * h, m->qkv_kept, cnt);
    a->v = (bf16 **)layer_slices(m, L, NQ * D * h, m->qkv_kept, cnt);
    if (gsa) {
        a->gsa_S = (bf16 **)layer_slices(m, L, gz.state * h, keep_block, cnt);
        a->gsa_U = (bf16 **)layer_slices(m, L, gz.state * h, keep_block, cnt);
        a->gsa_s = (float **)layer_slices(m, L, gz.scores * f, keep_block, cnt);
        a->gsa_dS = (float *)dev_alloc(m, gz.state * f, cnt);
        a->gsa_dU = (float *)dev_alloc(m, gz.state * f, cnt);
        a->gsa_decay = (float *)dev_alloc(m, gz.decay * f, cnt);
    }
    // Without a forget gate c is the document mask's alone, the same in every block: one shared slice.
    a->c = (float **)layer_slices(m, L, N * H * f, cfg->forget_gate != FOX_FG_NONE ? keep_block : 0, cnt);
    a->lse = (float **)layer_slices(m, L, N * H * f, keep_block, cnt);
    a->o = (bf16 **)layer_slices(m, L, N * D * h, keep_block, cnt);
    a->z = (bf16 **)layer_slices(m, L, N * D * h, m->outs_kept, cnt);
    a->mlp_u = (bf16 **)layer_slices(m, L, N * 2 * I * h, keep_norm_mlp, cnt);
    a->mlp_h = (bf16 **)layer_slices(m, L, N * I * h, m->outs_kept, cnt);
    a->xnf = (bf16 *)dev_alloc(m, N * D * h, cnt);
    size_t budget_rows = m->logits_bytes / ((size_t)m->VP * h);
    m->ce_rows = (int)(N < budget_rows ? N : (budget_rows ? budget_rows : 1));
    const size_t logits_b = (size_t)m->ce_rows * m->VP * h;
    if (m->forward_only) a->logits = (bf16 *)dev_alloc(m, logits_b, cnt);
    a->losses = (float *)dev_alloc(m, N * f, cnt);
    a->zero_c = (float *)dev_alloc(m, N * H * f, cnt);
    a->acp_kv_first = (int *)dev_alloc(m, (size_t)B * H * fox_acp_blocks(T) * sizeof(int), cnt);
    a->acp_q_last = (int *)dev_alloc(m, (size_t)B * H * fox_acp_blocks(T) * sizeof(int), cnt);
    a->doc_first = (int *)dev_alloc(m, (size_t)B * fox_acp_blocks(T) * sizeof(int), cnt);
    a->acp_live = (unsigned long long *)dev_alloc(m, L * H * sizeof(unsigned long long), cnt);
    a->inputs = (int *)dev_alloc(m, N * sizeof(int), cnt);
    a->targets = (int *)dev_alloc(m, N * sizeof(int), cnt);
    if (cfg->rope) {
        m->rope_cos = (float *)dev_alloc(m, (size_t)T * (m->Dh / 2) * f, cnt);
        m->rope_sin = (float *)dev_alloc(m, (size_t)T * (m->Dh / 2) * f, cnt);
    }
    if (cfg->arch == FOX_ARCH_FAM) fam_alloc(m, B, T);
    if (m->forward_only) return;

    Scratch *s = &m->s;
    cnt = &m->bytes_scratch;
    // GSA shares the first three (its d_o is read a chunk past its last row; it has no dq, dk, dv or attention scratch).
    Carve shared[] = {{(void **)&s->dh, N * I * h}, {(void **)&s->du, N * 2 * I * h}, {(void **)&s->dproj, N * NINP * h},
                      {(void **)&s->d_o, N * D * h}, {(void **)&s->dq, N * D * h}, {(void **)&s->dk, N * D * h},
                      {(void **)&s->dv, N * D * h},
                      {&s->attn_scratch, fox_attention_backward_scratch_bytes(B, (int)H, T, m->Dh)}};
    logits_region_alloc(m, logits_b, shared, gsa ? 3 : (int)(sizeof(shared) / sizeof(shared[0])));
    s->dres = (float *)dev_alloc(m, N * D * f, cnt);
    s->dres_bf = (bf16 *)dev_alloc(m, N * D * h, cnt);
    s->dres_up_bf = (bf16 *)dev_alloc(m, N * D * h, cnt);
    s->dxn = (float *)dev_alloc(m, N * D * f, cnt);
    if (gsa) {
        s->d_o = (bf16 *)dev_alloc(m, NQ * D * h, cnt);
        s->gsa_dSs = (bf16 *)dev_alloc(m, gz.state * h, cnt);
        s->gsa_dUs = (bf16 *)dev_alloc(m, gz.state * h, cnt);
        s->gsa_dsr = (float *)dev_alloc(m, gz.scores * f, cnt);
        s->gsa_y = (float *)dev_alloc(m, gz.scores * f, cnt);
        s->gsa_D1 = (bf16 *)dev_alloc(m, gz.pairs * h, cnt);
        s->gsa_Pt = (bf16 *)dev_alloc(m, gz.pairs * h, cnt);
    } else {
        s->dc = (float *)dev_alloc(m, N * H * f, cnt);
        s->dlogf = (float *)dev_alloc(m, N * H * f, cnt);
        s->dfg = (float *)dev_alloc(m, N * H * f, cnt);
    }
    s->colsum_rows = (float *)dev_alloc(m, 2 * colsum_rows_floats((int)N, (int)D) * f, cnt);
    s->colsum_part = (float *)dev_alloc(m, colsum_scratch_floats(N * H, D) * f, cnt);
    s->sumsq_part = (float *)dev_alloc(m, SUMSQ_BLOCKS * f, cnt);
    s->sumsq = (double *)dev_alloc(m, sizeof(double), cnt);
    s->buckets = (int *)dev_alloc(m, (3 * N + 1) * sizeof(int), cnt);
}

// Every device buffer of the model: fp32 weights, gradients and this rank's AdamW moments (the latter
// two not when forward_only), the bf16 GEMM copies, activations and scratch.
static void model_alloc(Model *m, int B, int T) {
    size_t n = m->lay.total, moments = m->forward_only ? 0 : m->shard_hi - m->shard_lo, *cnt = &m->bytes_weights;
    m->params = (float *)dev_alloc(m, n * sizeof(float), cnt);
    if (!m->forward_only) {
        m->grads = (float *)dev_alloc(m, n * sizeof(float), cnt);
        m->m = (float *)dev_alloc(m, moments * sizeof(float), cnt);
        m->v = (float *)dev_alloc(m, moments * sizeof(float), cnt);
    }
    for (int k = 0; k < FOX_NUM_PARAMS; k++) {
        const FoxParamInfo *p = &m->lay.p[k];
        if (!is_gemm_weight(k)) continue;
        size_t layers = p->layered ? (size_t)m->cfg.n_layer : 1;
        m->wbf[k] = (bf16 *)dev_alloc(m, layers * m->rows_pad[k] * p->cols * sizeof(bf16), cnt);
    }
    model_alloc_acts(m, B, T);
}

// Host buffers: the per-position losses, the embedding backward's buckets, the gradients' fresh slices.
static void model_alloc_host(Model *m, int B, int T) {
    size_t N = (size_t)B * T, V = (size_t)m->cfg.vocab_size;
    if (!m->forward_only) m->grad_fresh = (unsigned char *)fox_calloc((size_t)FOX_NUM_PARAMS * m->cfg.n_layer, 1);
    FOX_CUDA_CHECK(cudaMallocHost((void **)&m->h_tokens, 2 * N * sizeof(int)));
    FOX_CUDA_CHECK(cudaMallocHost((void **)&m->h_losses, N * sizeof(float)));
    FOX_CUDA_CHECK(cudaEventCreateWithFlags(&m->tokens_copied, cudaEventDisableTiming));
    FOX_CUDA_CHECK(cudaEventCreateWithFlags(&m->losses_copied, cudaEventDisableTiming));
    m->h_count = (int *)fox_calloc(V, sizeof(int));
    m->h_fill = (int *)fox_calloc(V, sizeof(int));
    FOX_CUDA_CHECK(cudaMallocHost((void **)&m->h_buckets, (3 * N + 1) * sizeof(int)));
    m->h_bucket_key = (uint64_t *)fox_calloc(N, sizeof(uint64_t));
    FOX_CUDA_CHECK(cudaEventCreateWithFlags(&m->buckets_copied, cudaEventDisableTiming));
    FOX_CUDA_CHECK(cudaMallocHost((void **)&m->h_doc_first, (size_t)B * fox_acp_blocks(T) * sizeof(int)));
    FOX_CUDA_CHECK(cudaMallocHost((void **)&m->acp_live, (size_t)m->cfg.n_layer * m->cfg.n_head * sizeof(unsigned long long)));
}

// The RoPE angle tables of positions [0, T), the CPU trainer's angles in double: t·θ^(−2i/dh).
static void upload_rope_tables(Model *m, int T) {
    int half = m->Dh / 2;
    size_t bytes = (size_t)T * half * sizeof(float);
    float *cs = (float *)fox_malloc(bytes), *sn = (float *)fox_malloc(bytes);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            double ang = fox_rope_angle(t, i, m->Dh, (double)m->cfg.rope_theta);
            cs[(size_t)t * half + i] = (float)cos(ang);
            sn[(size_t)t * half + i] = (float)sin(ang);
        }
    FOX_CUDA_CHECK(cudaMemcpy(m->rope_cos, cs, bytes, cudaMemcpyHostToDevice));
    FOX_CUDA_CHECK(cudaMemcpy(m->rope_sin, sn, bytes, cudaMemcpyHostToDevice));
    free(cs);
    free(sn);
    m->rope_len = T;
}

// FAM's RoPE tables (docs/model.md §1.10): memory state τ's rows i at positions τK − M + i (−M .. −1 for F_0 and
// the prompt), for the states τ < fam_rope_states, the CPU trainer's angles in double.
static void upload_fam_rope_tables(Model *m) {
    int half = m->Dh / 2, M = m->cfg.fam_memory, K = m->cfg.fam_block, nS = m->fam_rope_states;
    size_t n = (size_t)nS * M * half, bytes = n * sizeof(float);
    float *cs = (float *)fox_malloc(bytes), *sn = (float *)fox_malloc(bytes);
    for (int tau = 0; tau < nS; tau++)
        for (int r = 0; r < M; r++)
            for (int i = 0; i < half; i++) {
                double ang = fox_rope_angle(tau * K - M + r, i, m->Dh, (double)m->cfg.rope_theta);
                cs[((size_t)tau * M + r) * half + i] = (float)cos(ang);
                sn[((size_t)tau * M + r) * half + i] = (float)sin(ang);
            }
    FOX_CUDA_CHECK(cudaMemcpy(m->fam_rope_cos, cs, bytes, cudaMemcpyHostToDevice));
    FOX_CUDA_CHECK(cudaMemcpy(m->fam_rope_sin, sn, bytes, cudaMemcpyHostToDevice));
    free(cs);
    free(sn);
}

// The blocks (the first `want`; -1 or more than L: all L) that keep an activation at --recompute 0 (ModelOptions'
// qkv_blocks, outs_blocks); none at other levels or for a forward-only model.
static int kept_blocks(const ModelOptions *o, int want, int L) {
    if (o->recompute != RECOMPUTE_NONE || o->forward_only) return 0;
    return want < 0 || want > L ? L : want;
}

// The model's shape and options, nothing allocated: this rank's AdamW moments are elements
// [shard_lo, shard_hi) of the flat vector.
static void model_setup(Model *m, const FoxConfig *cfg, const ModelOptions *o, size_t shard_lo, size_t shard_hi) {
    memset(m, 0, sizeof(*m));
    m->cfg = *cfg;
    fox_layout(cfg, &m->lay);
    m->cols = fox_attn_cols(cfg);
    m->Dh = fox_head_dim(cfg);
    if (cfg->arch == FOX_ARCH_GSA) {
        const char *why = gsa_unsupported(m->Dh, cfg->gsa_slots);
        if (why) fox_fatal("%s (got head dim %d, %d slots)", why, m->Dh, cfg->gsa_slots);
    } else {
        fox_attn_check_dh(m->Dh);
    }
    if (cfg->arch == FOX_ARCH_FAM && fam_unsupported(cfg))
        fox_usage_error("%s (got --fam-block %d --fam-memory %d)", fam_unsupported(cfg), cfg->fam_block, cfg->fam_memory);
    m->NINP = (m->cols.width + 63) / 64 * 64;
    m->VP = (cfg->vocab_size + 63) / 64 * 64;
    m->recompute = o->recompute;
    m->forward_only = o->forward_only;
    m->qkv_kept = kept_blocks(o, o->qkv_blocks, cfg->n_layer);
    m->outs_kept = kept_blocks(o, o->outs_blocks, cfg->n_layer);
    m->acp = o->acp;
    m->doc_sep = o->doc_sep;
    m->deterministic = o->deterministic;
    m->logits_bytes = o->logits_bytes ? o->logits_bytes : FOX_LOGITS_BYTES;
    m->shard_lo = shard_lo;
    m->shard_hi = shard_hi;
    for (int k = 0; k < FOX_NUM_PARAMS; k++)
        m->rows_pad[k] = k == FOX_P_attn_in_w ? (size_t)m->NINP : k == FOX_P_lm_head_w ? (size_t)m->VP : m->lay.p[k].rows;
    m->B = o->batch;
    m->T = o->seq_len;
}

// Allocates a set-up model and fills it: the shared init (seed) on the host, copied to the device.
static void model_create(Model *m, uint64_t seed) {
    int least, greatest;
    FOX_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    FOX_CUDA_CHECK(cudaStreamCreateWithPriority(&m->stream, cudaStreamDefault, greatest));
    gemm_init(&m->gemm, m->stream);
    if (!m->forward_only) {
        FOX_CUDA_CHECK(cudaStreamCreateWithPriority(&m->wstream, cudaStreamDefault, least));
        gemm_init(&m->wgemm, m->wstream);
        FOX_CUDA_CHECK(cudaEventCreateWithFlags(&m->beside_ready, cudaEventDisableTiming));
        FOX_CUDA_CHECK(cudaEventCreateWithFlags(&m->beside_done, cudaEventDisableTiming));
    }
    model_alloc(m, m->B, m->T);
    model_alloc_host(m, m->B, m->T);
    if (m->cfg.rope) upload_rope_tables(m, m->T);
    if (m->cfg.rope && m->cfg.arch == FOX_ARCH_FAM) upload_fam_rope_tables(m);
    size_t n = m->lay.total;
    float *init = (float *)fox_malloc(n * sizeof(float));
    fox_init_params(&m->cfg, &m->lay, init, seed);
    model_set_params(m, init);
    free(init);
}

#ifdef TESTING
// A whole model for training (every AdamW moment on this device), as the tests and benchmarks take it.
static void model_init(Model *m, const FoxConfig *cfg, const ModelOptions *o) {
    FoxLayout lay;
    fox_layout(cfg, &lay);
    model_setup(m, cfg, o, 0, lay.total);
    model_create(m, o->seed);
}
#endif

static void model_cache_free(Model *m) {
    Cache *kc = &m->cache;
    void *bufs[] = {kc->k, kc->v, kc->c, kc->doc_start, kc->k_prev, kc->v_prev, kc->k_max2, kc->q, kc->first, kc->part,
                    kc->keys_read, kc->pos, kc->gsa_S, kc->gsa_U};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) FOX_CUDA_CHECK(cudaFree(bufs[i]));
#define X(type, name, width) FOX_CUDA_CHECK(cudaFree(kc->fam.name));
    FAM_FIELDS(X)
#undef X
    if (kc->step) FOX_CUDA_CHECK(cudaGraphExecDestroy(kc->step));
    memset(kc, 0, sizeof(*kc));
}

static void model_free(Model *m) {
    model_cache_free(m);
    if (m->cfg.arch == FOX_ARCH_FAM) fam_free(m);
    Acts *a = &m->a;
    Scratch *s = &m->s;
    void **layered[] = {(void **)a->mid, (void **)a->proj_wide, (void **)a->proj_logits, (void **)a->q, (void **)a->k,
                        (void **)a->v, (void **)a->c,
                        (void **)a->lse, (void **)a->o, (void **)a->mlp_u, (void **)a->gsa_S, (void **)a->gsa_U,
                        (void **)a->gsa_s, (void **)a->xn1, (void **)a->z, (void **)a->mlp_h};
    for (size_t i = 0; i < sizeof(layered) / sizeof(layered[0]); i++) {
        if (!layered[i]) continue;  // GSA's arrays in an attention model
        FOX_CUDA_CHECK(cudaFree(layered[i][0]));
        free(layered[i]);
    }
    free(a->xn2);  // in a->xn1's allocation
    // dh, du, dproj and (but GSA's) d_o, dq, dk, dv and the attention scratch lie in the logits' allocation.
    void *bufs[] = {m->params, m->grads, m->m, m->v, a->resid, a->xnf, a->logits,
                    a->losses, a->zero_c,
                    a->acp_kv_first, a->acp_q_last, a->doc_first, a->acp_live,
                    a->inputs, a->targets, s->dres, s->dres_bf, s->dres_up_bf, s->dxn,
                    m->cfg.arch == FOX_ARCH_GSA ? s->d_o : NULL, s->dc, s->dlogf, s->dfg, s->colsum_rows,
                    s->colsum_part, s->sumsq_part, s->sumsq, s->buckets, m->rope_cos, m->rope_sin,
                    a->gsa_dS, a->gsa_dU, a->gsa_decay, s->gsa_dSs, s->gsa_dUs, s->gsa_dsr, s->gsa_y, s->gsa_D1, s->gsa_Pt};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) FOX_CUDA_CHECK(cudaFree(bufs[i]));
    for (int k = 0; k < FOX_NUM_PARAMS; k++) FOX_CUDA_CHECK(cudaFree(m->wbf[k]));
    gemm_free(&m->gemm);
    if (!m->forward_only) {
        gemm_free(&m->wgemm);
        FOX_CUDA_CHECK(cudaStreamDestroy(m->wstream));
        FOX_CUDA_CHECK(cudaEventDestroy(m->beside_ready));
        FOX_CUDA_CHECK(cudaEventDestroy(m->beside_done));
    }
#ifdef FOX_MPI
    if (m->nccl) {
        fox_watchdog_forget(m->nccl);
        FOX_NCCL_CHECK(ncclCommDestroy(m->nccl));
        FOX_CUDA_CHECK(cudaStreamDestroy(m->comm));
        FOX_CUDA_CHECK(cudaEventDestroy(m->grads_final));
        FOX_CUDA_CHECK(cudaEventDestroy(m->reduced));
    }
#endif
    FOX_CUDA_CHECK(cudaStreamDestroy(m->stream));
    FOX_CUDA_CHECK(cudaFreeHost(m->h_tokens));
    FOX_CUDA_CHECK(cudaFreeHost(m->h_losses));
    FOX_CUDA_CHECK(cudaEventDestroy(m->tokens_copied));
    FOX_CUDA_CHECK(cudaEventDestroy(m->losses_copied));
    free(m->grad_fresh);
    free(m->h_count);
    free(m->h_fill);
    FOX_CUDA_CHECK(cudaFreeHost(m->h_buckets));
    free(m->h_bucket_key);
    FOX_CUDA_CHECK(cudaEventDestroy(m->buckets_copied));
    FOX_CUDA_CHECK(cudaFreeHost(m->h_doc_first));
    FOX_CUDA_CHECK(cudaFreeHost(m->acp_live));
    memset(m, 0, sizeof(*m));
}

// ----------------------------------------------------------------------------
// Launch helpers

// proj's two parts (docs/model.md §1.6) as the kernels read them.
static Proj proj_of(const Model *m, const bf16 *wide, const float *logits) {
    Proj p = {wide, logits, m->cols.wide, m->NINP - m->cols.wide};
    return p;
}

static Proj proj_at(const Model *m, int l) { return proj_of(m, m->a.proj_wide[l], m->a.proj_logits[l]); }

static QkvInputs qkv_inputs(Model *m, int l, int B, int T) {
    const FoxConfig *cfg = &m->cfg;
    QkvInputs s;
    s.proj = proj_at(m, l);
    s.cols = m->cols;
    s.qw = cfg->qk_norm ? param(m, FOX_P_qnorm_w, l) : NULL;
    s.kw = cfg->qk_norm ? param(m, FOX_P_knorm_w, l) : NULL;
    s.wstride = cfg->qk_norm_shared ? 0 : m->Dh;
    s.rope_cos = cfg->rope ? m->rope_cos : NULL;
    s.rope_sin = cfg->rope ? m->rope_sin : NULL;
    s.B = B;
    s.T = T;
    s.H = cfg->n_head;
    s.dh = m->Dh;
    s.tokens = m->a.inputs;  // the forward's B x T tokens, or a decode step's B
    s.sep = m->doc_sep;
    return s;
}


static void rmsnorm_forward(Model *m, bf16 *out, const float *in, const float *w, int N) {
    fox_rmsnorm_forward(out, in, w, N, m->cfg.d_model, m->stream);
}

// Where the backward writes block l's xn, xn2, z or mlp_h again (slices: one of those arrays): its slice, or
// NULL where the block kept it (outs_kept).
static bf16 *rewritten(const Model *m, int l, bf16 **slices) { return l < m->outs_kept ? NULL : slices[l]; }

// dres (+)= RMSNorm backward of dxn; dw += Σ dxn⊙x̂; xn (unless NULL) = the forward's RMSNorm(in)⊙w again.
static void rmsnorm_backward(Model *m, bf16 *dres_bf, bf16 *xn, const float *in, const float *w, float *dw, int N,
                             int accumulate) {
    Scratch *s = &m->s;
    fox_rmsnorm_backward(s->dres, dres_bf, xn, dw, s->dxn, in, w, N, m->cfg.d_model, accumulate, s->colsum_rows,
                         s->colsum_part, m->stream);
}

// ----------------------------------------------------------------------------
// The model: forward, backward

static float *resid_at(Model *m, int l, int B, int T) { return m->a.resid + (size_t)l * B * T * m->cfg.d_model; }

// Block l's ACP staircase (fox/acp.h) into a->acp_kv_first / acp_q_last; 0 when ACP is off or attention has
// no bias (the kernels then take every tile). A query block's first live key block is the larger of the
// threshold's (forget-gate presets) and its document's first (the document mask: a->doc_first, which
// model_forward filled). count: add each head's live tiles to a->acp_live[l·H + h] (the forward).
static int acp_tables(Model *m, int l, int B, int T, int count) {
    const FoxConfig *cfg = &m->cfg;
    if (!m->acp || !model_has_c(m)) return 0;
    Acts *a = &m->a;
    fox_acp_tables(a->acp_kv_first, a->acp_q_last, count ? a->acp_live + (size_t)l * cfg->n_head : NULL,
                   cfg->forget_gate != FOX_FG_NONE ? a->c[l] : NULL, a->q[l], a->k[l],
                   cfg->qk_norm ? param(m, FOX_P_qnorm_w, l) : NULL, cfg->qk_norm ? param(m, FOX_P_knorm_w, l) : NULL,
                   cfg->qk_norm_shared ? 0 : m->Dh, m->doc_sep >= 0 ? a->doc_first : NULL, B, cfg->n_head, T, m->Dh,
                   m->stream);
    return 1;
}

// out (B, OUT, row stride ldo, fp32 or bf16) = [C +] in (B, IN) · W (OUT, IN)ᵀ for the decode step's B rows:
// fox/decode.cuh's GEMV at batch 1 (pdl: launched as a dependent of the step's previous kernel), cuBLASLt beyond
// (linear_forward's arguments).
static void decode_linear(Model *m, void *out, const float *C, cudaDataType_t dtype, int ldo, const bf16 *in, const bf16 *W,
                          int IN, int OUT, int pdl) {
    if (!fox_decode_linear_fits(in, W, m->B, IN)) {
        linear_forward(&m->gemm, out, C, dtype, ldo, in, W, m->B, IN, OUT);
        return;
    }
    int epi = dtype == CUDA_R_16BF ? DECODE_BF16 : C ? DECODE_F32_ADD : DECODE_F32;
    fox_decode_linear(out, C, in, W, IN, OUT, epi, m->stream, pdl);
}

// proj = attn_in_w xn for R rows of xn, as two products (two row ranges of the weight): the wide columns rounded
// to bf16, the per-head logits in fp32 (docs/model.md §1.6). decode: the decode step's B rows (decode_linear).
static void attn_in_forward(Model *m, bf16 *wide, float *logits, const bf16 *xn, int l, int R, int decode) {
    int D = m->cfg.d_model, NW = m->cols.wide, NL = m->NINP - NW;
    const bf16 *W = wbf(m, FOX_P_attn_in_w, l), *WL = W + (size_t)NW * D;
    if (decode) {
        decode_linear(m, wide, NULL, CUDA_R_16BF, NW, xn, W, D, NW, 1);
        if (NL) decode_linear(m, logits, NULL, CUDA_R_32F, NL, xn, WL, D, NL, 1);
        return;
    }
    linear_forward(&m->gemm, wide, NULL, CUDA_R_16BF, NW, xn, W, R, D, NW);
    if (NL) linear_forward(&m->gemm, logits, NULL, CUDA_R_32F, NL, xn, WL, R, D, NL);
}

// The token mixer's input, shared by attention and GSA: xn = RMSNorm(resid[l]), proj = attn_in_w xn.
static void mixer_input_forward(Model *m, int l, int B, int T) {
    Acts *a = &m->a;
    int N = B * T;
    rmsnorm_forward(m, a->xn1[l], resid_at(m, l, B, T), param(m, FOX_P_ln1_w, l), N);
    attn_in_forward(m, a->proj_wide[l], a->proj_logits[l], a->xn1[l], l, N, 0);
}

// Its backward from s.dproj: dres += the RMSNorm backward of dproj attn_in_w (which writes xn again, the
// forward's bits), then attn_in_w's gradient dprojᵀ xn.
static void mixer_input_backward(Model *m, int l, int B, int T) {
    Acts *a = &m->a;
    Scratch *s = &m->s;
    int N = B * T, D = m->cfg.d_model, NINP = m->NINP;
    linear_backward_input(&m->gemm, s->dxn, CUDA_R_32F, s->dproj, NINP, wbf(m, FOX_P_attn_in_w, l), N, D, NINP, 1.0f);
    FOX_CUDA_CHECK(cudaStreamWaitEvent(m->stream, m->beside_done, 0));  // the weight gradients beside read xn, dres_up_bf
    rmsnorm_backward(m, s->dres_up_bf, rewritten(m, l, a->xn1), resid_at(m, l, B, T), param(m, FOX_P_ln1_w, l),
                     grad(m, FOX_P_ln1_w, l), N, 1);
    weight_grad(m, &m->gemm, FOX_P_attn_in_w, l, s->dproj, NINP, a->xn1[l], N, D, m->cols.width, 1.0f);
}

// Block l's attention inputs: xn, proj, the q, k, v of the attention and c (a forget gate, the document mask).
static void attention_inputs_forward(Model *m, int l, int B, int T) {
    const FoxConfig *cfg = &m->cfg;
    Acts *a = &m->a;
    int H = cfg->n_head;
    mixer_input_forward(m, l, B, T);
    fox_qkv_forward(a->q[l], a->k[l], a->v[l], qkv_inputs(m, l, B, T), m->stream);
    if (model_has_c(m)) {  // c from the gate (or 0 without one) and the document mask's separators
        int cf = cfg->forget_gate == FOX_FG_DATA_DEPENDENT ? m->cols.fgate : -1;
        fox_forget_gate_forward(a->c[l], proj_at(m, l), cf,
                                cfg->forget_gate != FOX_FG_NONE ? param(m, FOX_P_fgate_b, l) : NULL, a->inputs, m->doc_sep,
                                B, H, T, m->stream);
    }
}

// Block l's attention output from o (FoX eq. 21-23): z, then mid[l] = resid[l] + W_o z (the GEMM's epilogue).
static void attention_output_forward(Model *m, int l, int B, int T) {
    const FoxConfig *cfg = &m->cfg;
    Acts *a = &m->a;
    int N = B * T, D = cfg->d_model, H = cfg->n_head;
    fox_output_forward(a->z[l], a->o[l], proj_at(m, l), cfg->output_gate ? m->cols.gate : -1,
                       cfg->output_norm ? param(m, FOX_P_onorm_w, l) : NULL, N, H, m->Dh, m->stream);
    linear_forward(&m->gemm, a->mid[l], resid_at(m, l, B, T), CUDA_R_32F, D, a->z[l], wbf(m, FOX_P_attn_out_w, l), N, D, D);
}

// Block l's c for the attention: the forget gate's or the document mask's, else zeros.
static const float *attention_c(const Model *m, int l) { return model_has_c(m) ? m->a.c[l] : m->a.zero_c; }

// Forward of block l's attention: resid[l] → mid[l].
static void attention_block_forward(Model *m, int l, int B, int T) {
    Acts *a = &m->a;
    attention_inputs_forward(m, l, B, T);
    const int *kv_first = acp_tables(m, l, B, T, 1) ? a->acp_kv_first : NULL;
    fox_attention_forward(a->q[l], a->k[l], a->v[l], attention_c(m, l), a->o[l], a->lse[l], B, m->cfg.n_head, T, m->Dh,
                          kv_first, m->stream);
    attention_output_forward(m, l, B, T);
}

// ----------------------------------------------------------------------------
// TransformerFAM (docs/model.md §1.10; FAM paper Algorithm 2). Per layer, the tokens' window through the attention
// kernel (fam_window_tables' staircase) merged with their reads of the memory F_τ (fox/fam.cuh); the memory states
// one block after the other, each an M-row pass through the layer; F_0 the prompt (fam_init through the layers
// below). CPU: the fam_* functions of train_fox.c, whose names these keep.

static FamDims fam_dims(const Model *m, int B, int T) {
    FamDims d = {B, m->cfg.n_head, T, m->Dh, m->cfg.fam_block, m->cfg.fam_memory, 1.0f / sqrtf((float)m->Dh)};
    return d;
}

// The tokens' c for FAM's kernels: NULL without a forget gate (transformer-fam: no bias).
static const float *fam_c(const Model *m, int l) { return m->cfg.forget_gate != FOX_FG_NONE ? m->a.c[l] : NULL; }

// proj's two parts of a FAM rows' pass (FamRows).
static Proj fam_proj(const Model *m, FamRows f) { return proj_of(m, f.proj_wide, f.proj_logits); }

// The attention inputs of memory state τ's rows (B sequences of M): no KV-shift (the rows are not a sequence in
// time), no document mask, RoPE at the state's positions (docs/model.md §1.10).
static QkvInputs fam_qkv_inputs(Model *m, int l, FamRows f, int B, int tau) {
    QkvInputs s = qkv_inputs(m, l, B, m->cfg.fam_memory);
    s.proj = fam_proj(m, f);
    s.cols.k_shift = s.cols.v_shift = -1;
    if (m->cfg.rope) {
        size_t at = (size_t)tau * m->cfg.fam_memory * (m->Dh / 2);
        s.rope_cos = m->fam_rope_cos + at;
        s.rope_sin = m->fam_rope_sin + at;
    }
    s.tokens = NULL;
    s.sep = -1;
    return s;
}

// The memory rows' attention inputs (FAM paper B.1: they pass through the layer as tokens do): RMSNorm, attn_in_w,
// q, k, v at state τ's positions. CPU: fam_project.
static void fam_project(Model *m, int l, FamRows f, int B, int tau) {
    int R = B * m->cfg.fam_memory;
    rmsnorm_forward(m, f.xn1, f.x, param(m, FOX_P_ln1_w, l), R);
    attn_in_forward(m, f.proj_wide, f.proj_logits, f.xn1, l, R, 0);
    fox_qkv_forward(f.q, f.k, f.v, fam_qkv_inputs(m, l, f, B, tau), m->stream);
}

// The memory rows' update after their attention (f.o): output norm and gate, W_o, the residual (none for the
// first update of the initial memory: FAM paper B.1), the MLP with its residual; the new rows into out. CPU:
// fam_update.
static void fam_update(Model *m, int l, FamRows f, float *out, int R, int residual) {
    const FoxConfig *cfg = &m->cfg;
    int D = cfg->d_model, I = cfg->mlp_hidden;
    fox_output_forward(f.z, f.o, fam_proj(m, f), cfg->output_gate ? m->cols.gate : -1,
                       cfg->output_norm ? param(m, FOX_P_onorm_w, l) : NULL, R, cfg->n_head, m->Dh, m->stream);
    linear_forward(&m->gemm, f.mid, residual ? f.x : NULL, CUDA_R_32F, D, f.z, wbf(m, FOX_P_attn_out_w, l), R, D, D);
    rmsnorm_forward(m, f.xn2, f.mid, param(m, FOX_P_ln2_w, l), R);
    linear_forward(&m->gemm, f.u, NULL, CUDA_R_16BF, 2 * I, f.xn2, wbf(m, FOX_P_mlp_in_w, l), R, D, 2 * I);
    fox_swiglu_forward(f.h, f.u, R, I, m->stream);
    linear_forward(&m->gemm, out, f.mid, CUDA_R_32F, D, f.h, wbf(m, FOX_P_mlp_out_w, l), R, I, D);
}

// The prompt at layer l (FAM paper B.1): its rows attend to each other alone (positions −M..−1, no bias) and leave
// the layer as the rows entering layer l + 1. CPU: fam_prompt_forward.
static void fam_prompt_forward(Model *m, int l) {
    FamRows p = fam_prompt(m, l);
    fam_project(m, l, p, 1, 0);
    fam_update_forward(p.o, p.lse, p.q, p.k, p.v, NULL, NULL, NULL, fam_dims(m, 1, 0), 0, m->stream);
    fam_update(m, l, p, fam_prompt(m, l + 1).x, m->cfg.fam_memory, 1);
}

// Layer l's memory states: F_0 = the prompt's rows entering layer l for every sequence; for each block τ, F_τ's
// attention inputs and the update F_{τ+1} from F_τ and block τ's keys and values. The last block's update is read
// by no token and not computed (a generation's prefill computes it from the cache: fam_prefill_memory); a prompt
// ending inside a block ends with that partial block, whose tokens read the state its full blocks leave. CPU:
// fam_memory_forward.
static void fam_memory_forward(Model *m, int l, int B, int T) {
    Acts *a = &m->a;
    int M = m->cfg.fam_memory, D = m->cfg.d_model, nb = fam_states(m, T);
    FamRows f0 = fam_state(m, l, 0, B);
    for (int b = 0; b < B; b++)
        FOX_CUDA_CHECK(cudaMemcpyAsync(f0.x + (size_t)b * M * D, fam_prompt(m, l).x, (size_t)M * D * sizeof(float),
                                       cudaMemcpyDeviceToDevice, m->stream));
    for (int tau = 0; tau < nb; tau++) {
        FamRows f = fam_state(m, l, tau, B);
        fam_project(m, l, f, B, tau);
        if (tau + 1 == nb) break;
        fam_update_forward(f.o, f.lse, f.q, f.k, f.v, a->k[l], a->v[l], fam_c(m, l), fam_dims(m, B, T), tau, m->stream);
        fam_update(m, l, f, fam_state(m, l, tau + 1, B).x, B * M, tau > 0);
    }
}

// The window of every query tile (fam_window_tables) for B x T tokens, on the device for the forward and backward.
static void fam_upload_window(Model *m, int B, int T) {
    size_t n = (size_t)B * m->cfg.n_head * fox_acp_blocks(T);
    int *kv = (int *)fox_malloc(2 * n * sizeof(int));
    fam_window_tables(kv, kv + n, B, m->cfg.n_head, T, m->cfg.fam_block, m->cfg.fam_window_blocks);
    FOX_CUDA_CHECK(cudaMemcpy(m->a.fam_kv_first, kv, n * sizeof(int), cudaMemcpyHostToDevice));
    FOX_CUDA_CHECK(cudaMemcpy(m->a.fam_q_last, kv + n, n * sizeof(int), cudaMemcpyHostToDevice));
    free(kv);
}

// Forward of block l as TransformerFAM: resid[l] → mid[l], layer l's memory states and the prompt's rows entering
// layer l + 1. The tokens' attention: the window through the attention kernel, then their memory's merged in
// (FAM paper eq. 1 with the memory); with --fam-memory 0 the window alone (BSWA). CPU: fam_block_forward.
static void fam_block_forward(Model *m, int l, int B, int T) {
    Acts *a = &m->a;
    int memory = fox_fam_has_memory(&m->cfg);
    attention_inputs_forward(m, l, B, T);
    if (memory && l < m->cfg.n_layer - 1) fam_prompt_forward(m, l);
    if (memory) fam_memory_forward(m, l, B, T);
    fox_attention_forward(a->q[l], a->k[l], a->v[l], attention_c(m, l), a->o[l], a->lse[l], B, m->cfg.n_head, T, m->Dh,
                          a->fam_kv_first, m->stream);
    if (memory) {
        FamRows f0 = fam_state(m, l, 0, B);
        fam_token_memory_forward(a->o[l], a->lse[l], a->q[l], f0.k, f0.v, fam_c(m, l), fam_dims(m, B, T), m->stream);
    }
    attention_output_forward(m, l, B, T);
}

// Block l's Gated Slot Attention (fox/gsa.cuh) over B x T tokens: the shapes and the forward's buffers and, unless
// forward_only, the backward's; during a prefill the cache's states take the states after the last token.
static GsaShape gsa_shape(const Model *m, int B, int T) {
    const FoxConfig *cfg = &m->cfg;
    GsaShape sh = {B, T, cfg->gsa_heads, cfg->gsa_slots, m->Dh, cfg->gsa_tau, m->NINP, m->cols.slot_gate, m->cols.q, m->cols.k,
                   m->cols.v};
    return sh;
}

static GsaArgs gsa_args(Model *m, int l, int B, int T) {
    const FoxConfig *cfg = &m->cfg;
    Acts *a = &m->a;
    Scratch *s = &m->s;
    GsaArgs g;
    memset(&g, 0, sizeof(g));
    g.sh = gsa_shape(m, B, T);
    g.proj = proj_at(m, l);
    g.q = a->q[l];
    g.k = a->k[l];
    g.v = a->v[l];
    g.o = a->o[l];
    g.S = a->gsa_S[l];
    g.U = a->gsa_U[l];
    g.dS = a->gsa_dS;
    g.dU = a->gsa_dU;
    g.decay = a->gsa_decay;
    g.s = a->gsa_s[l];
    g.lse = a->lse[l];
    if (m->cache.prefilling) {
        size_t per_layer = (size_t)B * cfg->gsa_heads * GSA_SLOTS * m->Dh;
        g.S_last = m->cache.gsa_S + l * per_layer;
        g.U_last = m->cache.gsa_U + l * per_layer;
    }
    if (!m->forward_only) {
        g.d_o = s->d_o;
        g.dSs = s->gsa_dSs;
        g.dUs = s->gsa_dUs;
        g.dsr = s->gsa_dsr;
        g.y = s->gsa_y;
        g.D1 = s->gsa_D1;
        g.Pt = s->gsa_Pt;
        g.dproj = s->dproj;
    }
    return g;
}

// GSA's q, k, v: the Swish features of block l's proj columns (GSA paper eq. 8), into the shared slices.
static void gsa_features(Model *m, int l, int B, int T) {
    Acts *a = &m->a;
    fox_gsa_features(a->q[l], a->k[l], a->v[l], proj_at(m, l), m->cols.q, m->cols.k, m->cols.v, B * T, m->cfg.d_model,
                     m->stream);
}

// Forward of block l's Gated Slot Attention (docs/model.md §1.9; GSA paper eq. 8-9): resid[l] → mid[l]. q, k, v
// hold the Swish features, o the slots' read, z = RMSNorm(Swish(o)) over all D. CPU: gsa_block_forward.
static void gsa_block_forward(Model *m, int l, int B, int T) {
    const FoxConfig *cfg = &m->cfg;
    Acts *a = &m->a;
    int N = B * T, D = cfg->d_model;
    float *x = resid_at(m, l, B, T);
    mixer_input_forward(m, l, B, T);
    gsa_features(m, l, B, T);
    fox_gsa_forward(gsa_args(m, l, B, T), m->stream);
    fox_gsa_output_norm(a->z[l], a->o[l], param(m, FOX_P_onorm_w, l), N, D, m->stream);
    linear_forward(&m->gemm, a->mid[l], x, CUDA_R_32F, D, a->z[l], wbf(m, FOX_P_attn_out_w, l), N, D, D);
}

// Block l's token mixer: resid[l] → mid[l].
static void mixer_forward(Model *m, int l, int B, int T) {
    if (m->cfg.arch == FOX_ARCH_GSA) gsa_block_forward(m, l, B, T);
    else if (m->cfg.arch == FOX_ARCH_FAM) fam_block_forward(m, l, B, T);
    else attention_block_forward(m, l, B, T);
}

// Block l's MLP up to its gate and up projections: xn = RMSNorm(mid), u.
static void mlp_up_forward(Model *m, int l, int B, int T) {
    Acts *a = &m->a;
    int N = B * T, D = m->cfg.d_model, I = m->cfg.mlp_hidden;
    rmsnorm_forward(m, a->xn2[l], a->mid[l], param(m, FOX_P_ln2_w, l), N);
    linear_forward(&m->gemm, a->mlp_u[l], NULL, CUDA_R_16BF, 2 * I, a->xn2[l], wbf(m, FOX_P_mlp_in_w, l), N, D, 2 * I);
}

// Forward of block l's MLP: mid[l] → resid[l+1].
static void mlp_block_forward(Model *m, int l, int B, int T) {
    Acts *a = &m->a;
    int N = B * T, D = m->cfg.d_model, I = m->cfg.mlp_hidden;
    mlp_up_forward(m, l, B, T);
    fox_swiglu_forward(a->mlp_h[l], a->mlp_u[l], N, I, m->stream);
    linear_forward(&m->gemm, resid_at(m, l + 1, B, T), a->mid[l], CUDA_R_32F, D, a->mlp_h[l], wbf(m, FOX_P_mlp_out_w, l),
                   N, I, D);
}

// Logits of rows [r0, r0 + rows) into the logits buffer.
static void lm_head_forward(Model *m, int r0, int rows) {
    m->dlogits_kept = 0;
    linear_forward(&m->gemm, m->a.logits, NULL, CUDA_R_16BF, m->VP, m->a.xnf + (size_t)r0 * m->cfg.d_model,
                   wbf(m, FOX_P_lm_head_w, 0), rows, m->cfg.d_model, m->VP);
}

// The first n rows of a->logits as floats (n x vocab_size) on the host.
static void logits_to_host(Model *m, int n, float *out) {
    int VP = m->VP, V = m->cfg.vocab_size;
    bf16 *tmp = (bf16 *)fox_malloc((size_t)n * VP * sizeof(bf16));
    FOX_CUDA_CHECK(cudaMemcpy(tmp, m->a.logits, (size_t)n * VP * sizeof(bf16), cudaMemcpyDeviceToHost));
    for (int r = 0; r < n; r++)
        for (int v = 0; v < V; v++) out[(size_t)r * V + v] = __bfloat162float(tmp[(size_t)r * VP + v]);
    free(tmp);
}

// Block l's slice of the KV cache.
static CacheLayer cache_layer(Model *m, int l) {
    Cache *kc = &m->cache;
    size_t BH = (size_t)m->B * m->cfg.n_head, rows = BH * kc->max_len, BD = (size_t)m->B * m->cfg.d_model;
    CacheLayer cl;
    cl.k = kc->k + l * rows * m->Dh;
    cl.v = kc->v + l * rows * m->Dh;
    cl.c = kc->c ? kc->c + l * rows : NULL;
    cl.k_prev = kc->k_prev ? kc->k_prev + l * BD : NULL;
    cl.v_prev = kc->v_prev ? kc->v_prev + l * BD : NULL;
    cl.k_max2 = kc->k_max2 ? kc->k_max2 + l * BH : NULL;
    cl.max_len = kc->max_len;
    return cl;
}

// A prefill (docs/model.md §7): block l's keys, values and c of the B x T tokens just computed go into the
// cache's positions [0, T) (strided copies of the (B, H, T) rows into (B, H, max_len)), the last token's
// unshifted key and value (its proj columns k and v) become the KV-shift state, and for ACP without QK-norm
// the largest |k_j|² is taken. Called between the attention and the MLP, since the blocks share one slice of
// k and v (and with --recompute 2 of everything).
static void cache_store(Model *m, int l, int B, int T) {
    Acts *a = &m->a;
    CacheLayer cl = cache_layer(m, l);
    size_t BH = (size_t)B * m->cfg.n_head, f = sizeof(float), h = sizeof(bf16), row = (size_t)T * m->Dh * h;
    size_t pitch = (size_t)cl.max_len * m->Dh * sizeof(bf16), D = (size_t)m->cfg.d_model;
    FOX_CUDA_CHECK(cudaMemcpy2DAsync(cl.k, pitch, a->k[l], row, row, BH, cudaMemcpyDeviceToDevice, m->stream));
    FOX_CUDA_CHECK(cudaMemcpy2DAsync(cl.v, pitch, a->v[l], row, row, BH, cudaMemcpyDeviceToDevice, m->stream));
    if (cl.c)
        FOX_CUDA_CHECK(cudaMemcpy2DAsync(cl.c, cl.max_len * f, a->c[l], T * f, T * f, BH, cudaMemcpyDeviceToDevice, m->stream));
    if (cl.k_prev) {
        const bf16 *last = a->proj_wide[l] + (size_t)(T - 1) * m->cols.wide;
        size_t seq = (size_t)T * m->cols.wide * h;
        FOX_CUDA_CHECK(cudaMemcpy2DAsync(cl.k_prev, D * h, last + m->cols.k, seq, D * h, B, cudaMemcpyDeviceToDevice, m->stream));
        FOX_CUDA_CHECK(cudaMemcpy2DAsync(cl.v_prev, D * h, last + m->cols.v, seq, D * h, B, cudaMemcpyDeviceToDevice, m->stream));
    }
    if (cl.k_max2) LAUNCH_HEADS(cache_key_norms_kernel, m->Dh, BH, m->stream, cl.k_max2, cl.k, (int)BH, T, cl.max_len, m->Dh);
}

// The mean loss's gradient per counted target: 1 / their number (0 when none counts).
static float counted_scale(const Model *m) { return m->counted ? 1.0f / m->counted : 0.0f; }

// Queues the full forward over B×T tokens (B, T within the allocated capacity), with nothing that waits for
// the device: the tokens go through h_tokens; with targets, the per-position losses come back into h_losses
// (model_forward_loss waits for them). Without targets it stops at xnf (model_logits_rows gives rows of
// logits). During a prefill it also fills the KV cache (cache_store).
static void model_forward_queue(Model *m, const int *inputs, const int *targets, int B, int T) {
    if (B * T > m->B * m->T) fox_fatal("batch %dx%d exceeds the allocated %dx%d", B, T, m->B, m->T);
    const FoxConfig *cfg = &m->cfg;
    Acts *a = &m->a;
    int N = B * T, D = cfg->d_model, V = cfg->vocab_size, L = cfg->n_layer;
    FOX_CUDA_CHECK(cudaEventSynchronize(m->tokens_copied));
    memcpy(m->h_tokens, inputs, (size_t)N * sizeof(int));
    FOX_CUDA_CHECK(cudaMemcpyAsync(a->inputs, m->h_tokens, (size_t)N * sizeof(int), cudaMemcpyHostToDevice, m->stream));
    if (targets) {
        m->counted = fox_counted_targets(targets, N);
        memcpy(m->h_tokens + N, targets, (size_t)N * sizeof(int));
        FOX_CUDA_CHECK(
            cudaMemcpyAsync(a->targets, m->h_tokens + N, (size_t)N * sizeof(int), cudaMemcpyHostToDevice, m->stream));
    }
    FOX_CUDA_CHECK(cudaMemsetAsync(a->acp_live, 0, (size_t)L * cfg->n_head * sizeof(unsigned long long), m->stream));
    const int acp_on = m->acp && model_has_c(m);
    if (acp_on && m->doc_sep >= 0) {  // ACP's document blocks (acp_tables), for this forward and its backward
        fox_doc_first_blocks(m->h_doc_first, inputs, B, T, m->doc_sep);
        FOX_CUDA_CHECK(cudaMemcpyAsync(a->doc_first, m->h_doc_first, (size_t)B * fox_acp_blocks(T) * sizeof(int),
                                       cudaMemcpyHostToDevice, m->stream));
    }
    FOX_CUDA_CHECK(cudaEventRecord(m->tokens_copied, m->stream));
    embedding_forward_kernel<<<fox_blocks((size_t)N * D, 256), 256, 0, m->stream>>>(a->resid, a->inputs,
                                                                                     param(m, FOX_P_wte, 0), N, D);
    FOX_LAUNCH_CHECK();
    if (cfg->arch == FOX_ARCH_FAM) {  // the window's tiles; the prompt enters the first layer (FAM paper B.1)
        if (T % cfg->fam_block && !m->cache.prefilling)
            fox_fatal("a FAM forward of %d tokens: the context must be a multiple of the block %d", T, cfg->fam_block);
        fam_upload_window(m, B, T);
        FOX_CUDA_CHECK(cudaMemcpyAsync(fam_prompt(m, 0).x, param(m, FOX_P_fam_init, 0),
                                       (size_t)cfg->fam_memory * D * sizeof(float), cudaMemcpyDeviceToDevice, m->stream));
    }
    for (int l = 0; l < L; l++) {
        mixer_forward(m, l, B, T);
        if (m->cache.prefilling && cfg->arch != FOX_ARCH_GSA) cache_store(m, l, B, T);  // GSA's: in its forward
        mlp_block_forward(m, l, B, T);
    }
    rmsnorm_forward(m, a->xnf, resid_at(m, L, B, T), param(m, FOX_P_lnf_w, 0), N);
    m->dlogits_kept = 0;
    m->acp_tiles = 0;
    if (acp_on) {
        FOX_CUDA_CHECK(cudaMemcpyAsync(m->acp_live, a->acp_live, (size_t)L * cfg->n_head * sizeof(unsigned long long),
                                       cudaMemcpyDeviceToHost, m->stream));
        m->acp_tiles = (long long)B * fox_acp_tiles(T);
    }
    if (!targets) return;
    // When the whole batch's logits fit the buffer, the cross entropy leaves its dlogits there for the backward
    // (one pass over the logits); else the backward computes each chunk's logits and dlogits again.
    const int fused = !m->forward_only && N <= m->ce_rows;
    for (int r0 = 0; r0 < N; r0 += m->ce_rows) {
        int rows = N - r0 < m->ce_rows ? N - r0 : m->ce_rows;
        lm_head_forward(m, r0, rows);
        fox_crossentropy(a->losses + r0, a->logits, a->targets + r0, rows, V, m->VP, counted_scale(m), fused, m->stream);
    }
    m->dlogits_kept = fused;
    FOX_CUDA_CHECK(cudaMemcpyAsync(m->h_losses, a->losses, (size_t)N * sizeof(float), cudaMemcpyDeviceToHost, m->stream));
    FOX_CUDA_CHECK(cudaEventRecord(m->losses_copied, m->stream));
    m->losses_n = N;
}

// The mean of the queued forward's per-position losses, once they are on the host (h_losses; acp_live too).
static double model_forward_loss(Model *m) {
    FOX_CUDA_CHECK(cudaEventSynchronize(m->losses_copied));
    double total = 0.0;
    for (int n = 0; n < m->losses_n; n++) total += m->h_losses[n];
    return m->counted ? total / m->counted : 0.0;
}

// The full forward, waited for: with targets, the mean loss (h_losses the per-position ones); without, 0.
static double model_forward(Model *m, const int *inputs, const int *targets, int B, int T) {
    model_forward_queue(m, inputs, targets, B, T);
    return targets ? model_forward_loss(m) : 0.0;
}

// The fp32 logits of xnf's rows [r0, r0 + rows) on the host (rows x vocab_size), after a forward without
// targets or a decode step; the lm_head runs ce_rows rows at a time.
static void model_logits_rows(Model *m, int r0, int rows, float *out) {
    int chunk = rows < m->ce_rows ? rows : m->ce_rows;
    for (int i = 0; i < rows; i += chunk) {
        int n = rows - i < chunk ? rows - i : chunk;
        lm_head_forward(m, r0 + i, n);
        logits_to_host(m, n, out + (size_t)i * m->cfg.vocab_size);
    }
}

// Refills what the forward did not keep for block l's backward: from block qkv_kept on (those blocks share
// one slice), q, k, v from the kept proj (the attention backward's operands, GSA's features); with
// --recompute 1 also xn and u, with --recompute 2 the whole block. xn, z and h come again from the
// backward kernels that precede their weight-gradient GEMMs (GSA's z from its output norm again).
static void recompute_block(Model *m, int l, int B, int T) {
    Acts *a = &m->a;
    if (m->recompute == RECOMPUTE_BLOCK) {
        mixer_forward(m, l, B, T);
        mlp_block_forward(m, l, B, T);  // rewrites resid[l+1] with the bitwise same values
        return;
    }
    if (l >= m->qkv_kept && m->cfg.arch == FOX_ARCH_GSA)
        gsa_features(m, l, B, T);
    else if (l >= m->qkv_kept)
        fox_qkv_forward(a->q[l], a->k[l], a->v[l], qkv_inputs(m, l, B, T), m->stream);
    if (m->recompute == RECOMPUTE_NORM_MLP) mlp_up_forward(m, l, B, T);
}

// Weight gradients beside the main stream: beside_begin returns the Gemm for products whose operands the main
// stream has written so far, on m->wstream (lower priority), and beside_end marks them; the main stream waits
// for them before it next writes xn and dres_up_bf (mixer_input_backward), by when every operand of block l's
// MLP and W_o products has been read. TransformerFAM's memory rows add to the same gradients during its
// mixer's backward: there they stay on the main stream, in their order.
static Gemm *beside_begin(Model *m) {
    if (m->cfg.arch == FOX_ARCH_FAM) return &m->gemm;
    FOX_CUDA_CHECK(cudaEventRecord(m->beside_ready, m->stream));
    FOX_CUDA_CHECK(cudaStreamWaitEvent(m->wstream, m->beside_ready, 0));
    return &m->wgemm;
}

static void beside_end(Model *m) {
    if (m->cfg.arch != FOX_ARCH_FAM) FOX_CUDA_CHECK(cudaEventRecord(m->beside_done, m->wstream));
}

// Block l's MLP weight gradients, once its backward has written their operands (dres_up_bf, mlp_h, du, xn).
static void mlp_weight_grads(Model *m, int l, int B, int T) {
    Acts *a = &m->a;
    Scratch *s = &m->s;
    int N = B * T, D = m->cfg.d_model, I = m->cfg.mlp_hidden;
    Gemm *g = beside_begin(m);
    weight_grad(m, g, FOX_P_mlp_out_w, l, s->dres_up_bf, D, a->mlp_h[l], N, I, D, 1.0f);
    weight_grad(m, g, FOX_P_mlp_in_w, l, s->du, 2 * I, a->xn2[l], N, D, 2 * I, 1.0f);
    beside_end(m);
}

// Backward of block l's MLP: s.dres holds dL/d resid[l+1] on entry, dL/d mid[l] on exit.
static void mlp_block_backward(Model *m, int l, int B, int T) {
    Acts *a = &m->a;
    Scratch *s = &m->s;
    int N = B * T, D = m->cfg.d_model, I = m->cfg.mlp_hidden;
    linear_backward_input(&m->gemm, s->dh, CUDA_R_16BF, s->dres_up_bf, D, wbf(m, FOX_P_mlp_out_w, l), N, I, D, 1.0f);
    fox_swiglu_backward(s->du, rewritten(m, l, a->mlp_h), s->dh, a->mlp_u[l], N, I, m->stream);
    linear_backward_input(&m->gemm, s->dxn, CUDA_R_32F, s->du, 2 * I, wbf(m, FOX_P_mlp_in_w, l), N, D, 2 * I, 1.0f);
    rmsnorm_backward(m, s->dres_bf, rewritten(m, l, a->xn2), a->mid[l], param(m, FOX_P_ln2_w, l), grad(m, FOX_P_ln2_w, l),
                     N, 1);
    mlp_weight_grads(m, l, B, T);
}

// The first part of block l's attention backward: s.dres (dL/d mid[l]) back through W_o and the output norm and
// gate into s.d_o (and the gate's columns of s.dproj), and W_o's gradient.
static void attention_output_backward(Model *m, int l, int B, int T) {
    const FoxConfig *cfg = &m->cfg;
    Acts *a = &m->a;
    Scratch *s = &m->s;
    int N = B * T, D = cfg->d_model;
    linear_backward_input(&m->gemm, s->dxn, CUDA_R_32F, s->dres_bf, D, wbf(m, FOX_P_attn_out_w, l), N, D, D, 1.0f);
    const float *ow = cfg->output_norm ? param(m, FOX_P_onorm_w, l) : NULL;
    fox_output_backward(s->d_o, s->dproj, rewritten(m, l, a->z), ow ? grad(m, FOX_P_onorm_w, l) : NULL, s->dxn, a->o[l],
                        proj_at(m, l), cfg->output_gate ? m->cols.gate : -1, ow, N, cfg->n_head, m->Dh, s->colsum_rows,
                        s->colsum_part, m->stream);
    weight_grad(m, beside_begin(m), FOX_P_attn_out_w, l, s->dres_bf, D, a->z[l], N, D, D, 1.0f);
    beside_end(m);
}

// The last part, from s.dq, dk, dv and d log f: through the forget gate, RoPE, QK-norm, KV-shift, attn_in_w and
// the norm into s.dres = dL/d resid[l] (the residual's term included).
static void attention_inputs_backward(Model *m, int l, int B, int T) {
    const FoxConfig *cfg = &m->cfg;
    Acts *a = &m->a;
    Scratch *s = &m->s;
    int N = B * T, H = cfg->n_head;
    if (cfg->forget_gate != FOX_FG_NONE) {
        int cf = cfg->forget_gate == FOX_FG_DATA_DEPENDENT ? m->cols.fgate : -1;
        forget_gate_backward_kernel<<<fox_blocks((size_t)N * H, 256), 256, 0, m->stream>>>(
            s->dproj, s->dfg, s->dlogf, proj_at(m, l), cf, param(m, FOX_P_fgate_b, l), a->inputs, m->doc_sep, B, H, T);
        FOX_LAUNCH_CHECK();
        if (cfg->forget_gate != FOX_FG_FIXED)
            colsum_accumulate(grad(m, FOX_P_fgate_b, l), s->dfg, N, H, H, s->colsum_part, m->stream);
    }
    QkvInputs qs = qkv_inputs(m, l, B, T);
    fox_qkv_backward(s->dproj, cfg->qk_norm ? grad(m, FOX_P_qnorm_w, l) : NULL, cfg->qk_norm ? grad(m, FOX_P_knorm_w, l) : NULL,
                     s->dq, s->dk, s->dv, qs, s->colsum_rows, s->colsum_part, m->stream);
    mixer_input_backward(m, l, B, T);
}

// Backward of block l's attention: s.dres holds dL/d mid[l] on entry, dL/d resid[l] on exit.
static void attention_block_backward(Model *m, int l, int B, int T) {
    Acts *a = &m->a;
    Scratch *s = &m->s;
    attention_output_backward(m, l, B, T);
    const int *q_last = acp_tables(m, l, B, T, 0) ? a->acp_q_last : NULL;
    fox_attention_backward(a->q[l], a->k[l], a->v[l], attention_c(m, l), a->o[l], a->lse[l], s->d_o, s->dc, s->dlogf, s->dq,
                           s->dk, s->dv, s->attn_scratch, B, m->cfg.n_head, T, m->Dh, q_last, m->deterministic, m->stream);
    attention_inputs_backward(m, l, B, T);
}

// Backward of fam_update on R rows: dout = dL/d(the new rows) (fp32, overwritten: dL/d mid), back through the MLP,
// W_o and the output norm and gate into fs.d_o (and the gate's columns of fs.dproj), with the weights' gradients;
// with dx, the residual's term: dx = dL/d mid (or += when accumulate). CPU: fam_update_backward_rows.
static void fam_update_backward_rows(Model *m, int l, FamRows f, float *dout, float *dx, int R, int accumulate) {
    const FoxConfig *cfg = &m->cfg;
    FamScratch *g = &m->fs;
    Scratch *s = &m->s;
    int D = cfg->d_model, I = cfg->mlp_hidden;
    size_t n = (size_t)R * D;
    fam_to_bf16(g->dxbf, dout, n, m->stream);
    linear_backward_input(&m->gemm, g->dh, CUDA_R_16BF, g->dxbf, D, wbf(m, FOX_P_mlp_out_w, l), R, I, D, 1.0f);
    fox_swiglu_backward(g->du, f.h, g->dh, f.u, R, I, m->stream);
    weight_grad(m, &m->gemm, FOX_P_mlp_out_w, l, g->dxbf, D, f.h, R, I, D, 1.0f);
    linear_backward_input(&m->gemm, g->dxn, CUDA_R_32F, g->du, 2 * I, wbf(m, FOX_P_mlp_in_w, l), R, D, 2 * I, 1.0f);
    fox_rmsnorm_backward(dout, g->dxbf, NULL, grad(m, FOX_P_ln2_w, l), g->dxn, f.mid, param(m, FOX_P_ln2_w, l), R, D, 1,
                         s->colsum_rows, s->colsum_part, m->stream);
    weight_grad(m, &m->gemm, FOX_P_mlp_in_w, l, g->du, 2 * I, f.xn2, R, D, 2 * I, 1.0f);
    linear_backward_input(&m->gemm, g->dxn, CUDA_R_32F, g->dxbf, D, wbf(m, FOX_P_attn_out_w, l), R, D, D, 1.0f);
    const float *ow = cfg->output_norm ? param(m, FOX_P_onorm_w, l) : NULL;
    fox_output_backward(g->d_o, g->dproj, f.z, ow ? grad(m, FOX_P_onorm_w, l) : NULL, g->dxn, f.o, fam_proj(m, f),
                        cfg->output_gate ? m->cols.gate : -1, ow, R, cfg->n_head, m->Dh, s->colsum_rows, s->colsum_part,
                        m->stream);
    weight_grad(m, &m->gemm, FOX_P_attn_out_w, l, g->dxbf, D, f.z, R, D, D, 1.0f);
    if (!dx) return;
    if (accumulate) fam_sum_rows(dx, dout, 1, n, 1, m->stream);
    else FOX_CUDA_CHECK(cudaMemcpyAsync(dx, dout, n * sizeof(float), cudaMemcpyDeviceToDevice, m->stream));
}

// Backward of fam_project for state τ's B sequences: from fs.dq (bf16) and the fp32 dFk, dFv of its keys and
// values, with fs.dproj holding the output gate's columns already, into dx (= or += when accumulate) and the
// weights' gradients. CPU: fam_project_backward.
static void fam_project_backward(Model *m, int l, FamRows f, int B, int tau, const float *dFk, const float *dFv, float *dx,
                                 int accumulate) {
    const FoxConfig *cfg = &m->cfg;
    FamScratch *g = &m->fs;
    Scratch *s = &m->s;
    int R = B * cfg->fam_memory, D = cfg->d_model;
    fam_to_bf16(g->dkb, dFk, (size_t)R * D, m->stream);
    fam_to_bf16(g->dvb, dFv, (size_t)R * D, m->stream);
    fox_qkv_backward(g->dproj, cfg->qk_norm ? grad(m, FOX_P_qnorm_w, l) : NULL, cfg->qk_norm ? grad(m, FOX_P_knorm_w, l) : NULL,
                     g->dq, g->dkb, g->dvb, fam_qkv_inputs(m, l, f, B, tau), s->colsum_rows, s->colsum_part,
                     m->stream);
    linear_backward_input(&m->gemm, g->dxn, CUDA_R_32F, g->dproj, m->NINP, wbf(m, FOX_P_attn_in_w, l), R, D, m->NINP, 1.0f);
    fox_rmsnorm_backward(dx, g->dxbf, NULL, grad(m, FOX_P_ln1_w, l), g->dxn, f.x, param(m, FOX_P_ln1_w, l), R, D, accumulate,
                         s->colsum_rows, s->colsum_part, m->stream);
    weight_grad(m, &m->gemm, FOX_P_attn_in_w, l, g->dproj, m->NINP, f.xn1, R, D, m->cols.width, 1.0f);
}

// Backward of fam_memory_forward: the states from the last down (F_{τ+1} depends on F_τ), each update's gradient
// (from fs.dx[τ + 1], complete by then) before its rows' attention inputs'; the tokens' dk, dv (bf16) and the
// attention backward's dc row sums and colsum column sums gain the updates' terms. fs.dk, dv hold the tokens'
// reads of each state on entry. The gradient of F_0, summed over the sequences, starts the prompt's at layer l
// (fs.dprompt[l & 1]). CPU: fam_memory_backward.
static void fam_memory_backward(Model *m, int l, int B, int T, float *colsum) {
    const FoxConfig *cfg = &m->cfg;
    Acts *a = &m->a;
    FamScratch *g = &m->fs;
    int M = cfg->fam_memory, D = cfg->d_model, R = B * M, nb = T / cfg->fam_block;
    size_t state = (size_t)R * D;
    for (int tau = nb - 1; tau >= 0; tau--) {
        FamRows f = fam_state(m, l, tau, B);
        float *dx = g->dx + tau * state, *dFk = g->dk + tau * state, *dFv = g->dv + tau * state;
        int residual = tau > 0 && tau + 1 < nb;  // dx's first term: the update's residual, else the projection's
        if (tau + 1 < nb) {
            fam_update_backward_rows(m, l, f, dx + state, residual ? dx : NULL, R, 0);
            fam_update_backward(g->dq, dFk, dFv, m->s.dk, m->s.dv, m->s.dc, colsum, g->rows3, f.q, f.k, f.v, f.o, g->d_o,
                                f.lse, a->k[l], a->v[l], fam_c(m, l), fam_dims(m, B, T), tau, m->stream);
        } else {  // F_{nb−1} is read by the last block's tokens alone: no update, no output gate
            FOX_CUDA_CHECK(cudaMemsetAsync(g->dq, 0, state * sizeof(bf16), m->stream));
            FOX_CUDA_CHECK(cudaMemsetAsync(g->dproj, 0, (size_t)R * m->NINP * sizeof(bf16), m->stream));
        }
        fam_project_backward(m, l, f, B, tau, dFk, dFv, dx, residual);
    }
    fam_sum_rows(g->dprompt[l & 1], g->dx, B, (size_t)M * D, 0, m->stream);
}

// Backward of fam_prompt_forward: the gradient of the prompt's rows entering layer l + 1 (fs.dprompt[(l+1) & 1])
// into that of the rows entering layer l (fs.dprompt[l & 1], +=). CPU: fam_prompt_backward.
static void fam_prompt_backward(Model *m, int l) {
    FamScratch *g = &m->fs;
    FamRows p = fam_prompt(m, l);
    int M = m->cfg.fam_memory;
    size_t n = (size_t)M * m->cfg.d_model;
    float *dx = g->dprompt[l & 1];
    fam_update_backward_rows(m, l, p, g->dprompt[(l + 1) & 1], dx, M, 1);
    FOX_CUDA_CHECK(cudaMemsetAsync(g->dk, 0, n * sizeof(float), m->stream));
    FOX_CUDA_CHECK(cudaMemsetAsync(g->dv, 0, n * sizeof(float), m->stream));
    fam_update_backward(g->dq, g->dk, g->dv, NULL, NULL, NULL, NULL, g->rows3, p.q, p.k, p.v, p.o, g->d_o, p.lse, NULL, NULL,
                        NULL, fam_dims(m, 1, 0), 0, m->stream);
    fam_project_backward(m, l, p, 1, 0, g->dk, g->dv, dx, 1);
}

// Backward of block l as TransformerFAM: s.dres holds dL/d mid[l] on entry, dL/d resid[l] on exit; the prompt's
// gradient moves down to layer l. The window's backward runs in its two halves around the memory's terms (the
// tokens' reads of F_τ, then the updates'), so dq and d log f include them. CPU: fam_block_backward.
static void fam_block_backward(Model *m, int l, int B, int T) {
    Acts *a = &m->a;
    Scratch *s = &m->s;
    FamScratch *g = &m->fs;
    int H = m->cfg.n_head, memory = fox_fam_has_memory(&m->cfg);
    attention_output_backward(m, l, B, T);
    FoxAttnSums sums = fox_attention_backward_keys(a->q[l], a->k[l], a->v[l], attention_c(m, l), a->o[l], a->lse[l], s->d_o,
                                                   s->dc, s->dk, s->dv, s->attn_scratch, B, H, T, m->Dh, a->fam_q_last,
                                                   m->deterministic, m->stream);
    if (memory) {
        FamRows f0 = fam_state(m, l, 0, B);
        fam_token_memory_backward(sums.dq_acc, s->dc, sums.colsum, g->dk, g->dv, g->ds_rows, a->q[l], f0.k, f0.v, s->d_o,
                                  a->lse[l], sums.D, fam_c(m, l), fam_dims(m, B, T), m->stream);
        fam_memory_backward(m, l, B, T, sums.colsum);
    }
    fox_attention_backward_finish(sums, s->dc, s->dlogf, s->dq, B, H, T, m->Dh, m->stream);
    if (memory && l < m->cfg.n_layer - 1) fam_prompt_backward(m, l);
    attention_inputs_backward(m, l, B, T);
}

// Backward of block l's Gated Slot Attention: s.dres holds dL/d mid[l] on entry, dL/d resid[l] on exit.
// CPU: gsa_block_backward.
static void gsa_block_backward(Model *m, int l, int B, int T) {
    const FoxConfig *cfg = &m->cfg;
    Acts *a = &m->a;
    Scratch *s = &m->s;
    int N = B * T, D = cfg->d_model;
    const float *ow = param(m, FOX_P_onorm_w, l);
    linear_backward_input(&m->gemm, s->dxn, CUDA_R_32F, s->dres_bf, D, wbf(m, FOX_P_attn_out_w, l), N, D, D, 1.0f);
    fox_gsa_output_norm_backward(s->d_o, grad(m, FOX_P_onorm_w, l), s->dxn, a->o[l], ow, N, D, s->colsum_rows,
                                 s->colsum_part, m->stream);
    if (rewritten(m, l, a->z))  // z again, the forward's bits (one slice for the blocks that do not keep it)
        fox_gsa_output_norm(a->z[l], a->o[l], ow, N, D, m->stream);
    weight_grad(m, &m->gemm, FOX_P_attn_out_w, l, s->dres_bf, D, a->z[l], N, D, D, 1.0f);
    fox_gsa_backward(gsa_args(m, l, B, T), m->stream);
    mixer_input_backward(m, l, B, T);
}

// The embedding backward's tables for inputs (fox_embedding_buckets) into h_buckets, copied to s.buckets on the
// stream without waiting for the GPU (h_buckets is written again only after that copy). Returns the number of
// buckets.
static int embedding_buckets(Model *m, const int *inputs, int N) {
    FOX_CUDA_CHECK(cudaEventSynchronize(m->buckets_copied));
    int nb = fox_embedding_buckets(m->h_buckets, m->h_bucket_key, m->h_count, m->h_fill, inputs, N, m->cfg.vocab_size);
    FOX_CUDA_CHECK(cudaMemcpyAsync(m->s.buckets, m->h_buckets, (3 * (size_t)N + 1) * sizeof(int), cudaMemcpyHostToDevice,
                                   m->stream));
    FOX_CUDA_CHECK(cudaEventRecord(m->buckets_copied, m->stream));
    return nb;
}

// Data parallel, the step's last micro-batch (reduce): averages the ranks' gradients as soon as the
// backward has finished them, one grouped NCCL all-reduce on the comm stream (after the work queued so
// far) while the backward goes on: tensor `tensor` (a tensor without layers), or with tensor < 0 block
// `layer`'s slice of every layered tensor. Every rank issues the same all-reduces in the same order.
static void reduce_final_grads(Model *m, int reduce, int tensor, int layer) {
#ifdef FOX_MPI
    if (!reduce) return;
    FOX_CUDA_CHECK(cudaEventRecord(m->grads_final, m->stream));
    FOX_CUDA_CHECK(cudaStreamWaitEvent(m->comm, m->grads_final, 0));
    FOX_NCCL_CHECK(ncclGroupStart());
    for (int k = 0; k < FOX_NUM_PARAMS; k++) {
        const FoxParamInfo *p = &m->lay.p[k];
        if (!fox_param_learned(&m->cfg, k) || !p->numel || (tensor >= 0 ? k != tensor : !p->layered)) continue;
        float *g = grad(m, k, p->layered ? layer : 0);
        FOX_NCCL_CHECK(ncclAllReduce(g, g, p->layered ? p->rows * p->cols : p->numel, ncclFloat, ncclAvg, m->nccl, m->comm));
    }
    FOX_NCCL_CHECK(ncclGroupEnd());
#else
    (void)m; (void)reduce; (void)tensor; (void)layer;
#endif
}

// dproj's padding columns [width, NINP), which attn_in_w's input-gradient GEMM reads (against zero weight rows) and
// nothing writes but the logits that share its memory (logits_region_alloc): zeroed once their GEMMs are queued.
static void clear_dproj_padding(Model *m, int N) {
    size_t h = sizeof(bf16), pad = (size_t)(m->NINP - m->cols.width);
    if (pad)
        FOX_CUDA_CHECK(cudaMemset2DAsync(m->s.dproj + m->cols.width, m->NINP * h, 0, pad * h, N, m->stream));
}

// Backward of the last model_forward (with targets), adding dloss_scale·∂(mean loss)/∂θ into grads;
// reduce: also average the ranks' gradients as they become final (reduce_final_grads).
static void model_backward(Model *m, const int *inputs, int B, int T, float dloss_scale, int reduce) {
    const FoxConfig *cfg = &m->cfg;
    Acts *a = &m->a;
    Scratch *s = &m->s;
    int N = B * T, D = cfg->d_model, V = cfg->vocab_size, L = cfg->n_layer;
    // dlogits hold the mean loss's gradient; dloss_scale scales the lm_head GEMMs (their alpha).
    const int kept = m->dlogits_kept;
    for (int r0 = 0; r0 < N; r0 += m->ce_rows) {
        int rows = N - r0 < m->ce_rows ? N - r0 : m->ce_rows;
        if (!kept) {
            lm_head_forward(m, r0, rows);
            fox_crossentropy(NULL, a->logits, a->targets + r0, rows, V, m->VP, counted_scale(m), 1, m->stream);
        }
        linear_backward_input(&m->gemm, s->dxn + (size_t)r0 * D, CUDA_R_32F, a->logits, m->VP, wbf(m, FOX_P_lm_head_w, 0),
                              rows, D, m->VP, dloss_scale);
        weight_grad(m, &m->gemm, FOX_P_lm_head_w, 0, a->logits, m->VP, a->xnf + (size_t)r0 * D, rows, D, V, dloss_scale);
    }
    m->dlogits_kept = 0;
    clear_dproj_padding(m, N);
    reduce_final_grads(m, reduce, FOX_P_lm_head_w, 0);
    rmsnorm_backward(m, s->dres_up_bf, NULL, resid_at(m, L, B, T), param(m, FOX_P_lnf_w, 0), grad(m, FOX_P_lnf_w, 0), N, 0);
    reduce_final_grads(m, reduce, FOX_P_lnf_w, 0);
    for (int l = L - 1; l >= 0; l--) {
        if (l < L - 1) recompute_block(m, l, B, T);  // the forward left the last block's in the shared slices
        mlp_block_backward(m, l, B, T);
        if (cfg->arch == FOX_ARCH_GSA) gsa_block_backward(m, l, B, T);
        else if (cfg->arch == FOX_ARCH_FAM) fam_block_backward(m, l, B, T);
        else attention_block_backward(m, l, B, T);
        reduce_final_grads(m, reduce, -1, l);
    }
    if (fox_fam_has_memory(cfg)) {  // the prompt's gradient at layer 0 is fam_init's
        fam_sum_rows(grad(m, FOX_P_fam_init, 0), m->fs.dprompt[0], 1, (size_t)cfg->fam_memory * D, 1, m->stream);
        reduce_final_grads(m, reduce, FOX_P_fam_init, 0);
    }
    int nb = embedding_buckets(m, inputs, N);
    fox_embedding_backward(grad(m, FOX_P_wte, 0), s->dres, s->buckets, nb, N, D, m->stream);
    reduce_final_grads(m, reduce, FOX_P_wte, 0);
}

// Zeroes the gradients but the GEMM weights' (each slice's first product of the step overwrites it:
// weight_grad), as the runs of the flat vector between them (a tensor's layers lie together).
static void model_zero_grad(Model *m) {
    size_t lo = 0;  // where the run still to be zeroed starts
    for (int k = 0; k < FOX_NUM_PARAMS; k++) {
        const FoxParamInfo *p = &m->lay.p[k];
        if (!is_gemm_weight(k)) continue;
        if (p->offset > lo) FOX_CUDA_CHECK(cudaMemsetAsync(m->grads + lo, 0, (p->offset - lo) * sizeof(float), m->stream));
        lo = p->offset + p->numel;
        memset(m->grad_fresh + (size_t)k * m->cfg.n_layer, 1, (size_t)m->cfg.n_layer);
    }
    if (m->lay.total > lo) FOX_CUDA_CHECK(cudaMemsetAsync(m->grads + lo, 0, (m->lay.total - lo) * sizeof(float), m->stream));
}

// ----------------------------------------------------------------------------
// Optimizer (docs/model.md §2)

// Global L2 norm of the gradient: fixed per-block partial sums, then one fixed-order sum.
static double grad_norm(Model *m) {
    sumsq_partial_kernel<<<SUMSQ_BLOCKS, SUMSQ_THREADS, 0, m->stream>>>(m->s.sumsq_part, m->grads, m->lay.total);
    FOX_LAUNCH_CHECK();
    sumsq_final_kernel<<<1, 1, 0, m->stream>>>(m->s.sumsq, m->s.sumsq_part);
    FOX_LAUNCH_CHECK();
    double ss;
    FOX_CUDA_CHECK(cudaMemcpy(&ss, m->s.sumsq, sizeof(double), cudaMemcpyDeviceToHost));
    return sqrt(ss);
}

// ZeRO-1 shard of rank r of `world`: [lo, hi) of the flat vector of n elements, 1/world each, in whole
// 64-element (256-byte) units; the last shards may be shorter or empty.
static void zero_shard(size_t n, int world, int r, size_t *lo, size_t *hi) {
    size_t per = ((n + world - 1) / world + 63) / 64 * 64;
    *lo = (size_t)r * per < n ? (size_t)r * per : n;
    *hi = *lo + per < n ? *lo + per : n;
}

// ZeRO-1: after each rank updated its shard of the fp32 weights, every rank broadcasts its shard (one
// grouped NCCL call), then all rebuild their bf16 GEMM copies from the whole vector.
static void gather_updated_params(Model *m) {
#ifdef FOX_MPI
    FOX_NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < m->world; r++) {
        size_t lo, hi;
        zero_shard(m->lay.total, m->world, r, &lo, &hi);
        if (hi > lo) FOX_NCCL_CHECK(ncclBroadcast(m->params + lo, m->params + lo, hi - lo, ncclFloat, r, m->nccl, m->stream));
    }
    FOX_NCCL_CHECK(ncclGroupEnd());
    model_refresh_bf16(m);
#else
    (void)m;
#endif
}

// Global-norm clipping by `norm` (the whole averaged gradient's, which every rank holds;
// torch.nn.utils.clip_grad_norm_: scale by clip/(norm+1e-6) when the norm exceeds clip) folded into
// AdamW on every learned tensor's elements in this rank's shard (all of them without ZeRO-1); `t` is
// the 1-based step.
static void optimizer_update(Model *m, const OptConfig *o, double lr, int t, double norm) {
    AdamStep st;
    st.lr = lr;
    st.beta1 = o->beta1;
    st.beta2 = o->beta2;
    st.eps = o->eps;
    st.bc1 = 1.0 - pow(o->beta1, t);
    st.bc2 = 1.0 - pow(o->beta2, t);
    st.gscale = (o->grad_clip > 0.0 && norm > o->grad_clip) ? (float)(o->grad_clip / (norm + 1e-6)) : 1.0f;
    static_assert(FOX_NUM_PARAMS <= ADAMW_MAX_TENSORS, "one AdamW launch takes every tensor");
    int sharded = m->shard_hi - m->shard_lo < m->lay.total;
    AdamTensors ts;
    ts.n = 0;
    for (int k = 0; k < FOX_NUM_PARAMS; k++) {
        const FoxParamInfo *p = &m->lay.p[k];
        size_t lo = p->offset > m->shard_lo ? p->offset : m->shard_lo;
        size_t hi = p->offset + p->numel < m->shard_hi ? p->offset + p->numel : m->shard_hi;
        if (!fox_param_learned(&m->cfg, k) || hi <= lo) continue;
        int t = ts.n++;
        ts.lo[t] = lo;
        ts.hi[t] = hi;
        ts.first[t] = p->offset;
        ts.decay[t] = p->decay ? (double)(float)(1.0 - lr * o->weight_decay) : 1.0;
        ts.wbf[t] = sharded ? NULL : m->wbf[k];
        ts.layer_numel[t] = p->rows * p->cols;
        ts.pad[t] = (m->rows_pad[k] - p->rows) * p->cols;
    }
    fox_adamw(m->params, m->grads, m->m, m->v, m->shard_lo, m->shard_hi, ts, st, m->stream);
    if (sharded) gather_updated_params(m);
}

#ifdef TESTING
// The whole step, as the tests and benchmarks take it; returns the norm before clipping.
static double optimizer_step(Model *m, const OptConfig *o, double lr, int t) {
    double norm = grad_norm(m);
    optimizer_update(m, o, lr, t, norm);
    return norm;
}
#endif

// ----------------------------------------------------------------------------
// Generation with a KV cache (docs/model.md §7): the prefill is the normal forward, which stores each
// block's keys, values, c and KV-shift state (cache_store); a decode step runs one new token per sequence
// through the blocks against them (fox/decode.cuh), reusing the first B rows of the activation buffers.

// Free device memory in bytes, capped by the test-only FOX_TEST_DEVICE_MEMORY.
static size_t device_free_bytes(void) {
    size_t free_b, total_b;
    FOX_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    const char *cap = getenv("FOX_TEST_DEVICE_MEMORY");
    if (cap && strtoull(cap, NULL, 10) < free_b) free_b = strtoull(cap, NULL, 10);
    return free_b;
}

// The memory states a FAM generation of max_len positions projects: up to the one after a block ending at max_len.
static int fam_cache_states(const Model *m, int max_len) { return max_len / m->cfg.fam_block + 1; }

// Bytes of device memory a cache of max_len positions takes, with the step's buffers and, when they
// must grow, the RoPE tables (in double: an absurd request must not wrap around).
static double cache_bytes_needed(const Model *m, int max_len) {
    const FoxConfig *cfg = &m->cfg;
    double L = cfg->n_layer, B = m->B, BH = B * cfg->n_head, D = cfg->d_model, Dh = m->Dh, f = sizeof(float);
    int has_fg = cfg->forget_gate != FOX_FG_NONE;
    if (cfg->arch == FOX_ARCH_GSA)  // the recurrent states alone, the step counters
        return 2.0 * L * BH * GSA_SLOTS * Dh * f + sizeof(unsigned long long) + sizeof(int);
    double bytes = L * BH * max_len * (2.0 * Dh * sizeof(bf16) + (model_has_c(m) ? f : 0.0));
    if (m->doc_sep >= 0) bytes += B * sizeof(int);
    if (cfg->kv_shift) bytes += 2.0 * L * B * D * sizeof(bf16);
    if (m->acp && has_fg && !cfg->qk_norm) bytes += L * BH * f;
    bytes += BH * Dh * sizeof(bf16) + BH * sizeof(int) + sizeof(unsigned long long) + sizeof(int);
    bytes += (double)fox_decode_scratch_floats((int)BH, fox_decode_max_splits((int)BH, m->Dh), m->Dh) * f;
    if (cfg->rope && max_len > m->rope_len) bytes += 2.0 * max_len * (Dh / 2) * f;
    if (cfg->arch == FOX_ARCH_FAM) {  // the current memory's rows, and RoPE tables for its states
        FAM_WIDTHS(m);
        double M = cfg->fam_memory, row = 0.0;
#define X(type, name, width) row += (double)(width) * sizeof(type);
        FAM_FIELDS(X)
#undef X
        bytes += L * B * M * row;
        if (cfg->rope && fam_cache_states(m, max_len) > m->fam_rope_states) bytes += 2.0 * fam_cache_states(m, max_len) * M * (Dh / 2) * f;
    }
    return bytes;
}

// cudaMalloc's granularity over the cache's twelve buffers, and what the decode's library calls may take.
#define CACHE_MARGIN_BYTES ((double)(64 << 20))

// 0 when a cache of max_len positions fits in the device's free memory; else 1 and the one-line reason
// (the need, what is free, the remedy) in why.
static int cache_does_not_fit(const Model *m, int max_len, char *why, size_t n) {
    const double gib = 1024.0 * 1024.0 * 1024.0;
    double need = cache_bytes_needed(m, max_len) + CACHE_MARGIN_BYTES, free_b = (double)device_free_bytes();
    if (need <= free_b) return 0;
    snprintf(why, n, "the KV cache of %d sequences x %d positions needs %.2f GiB of device memory but %.2f GiB is "
             "free: generate fewer tokens (--generate), use a shorter prompt or fewer --samples", m->B, max_len,
             need / gib, free_b / gib);
    return 1;
}

// FAM's part of a cache of max_len positions: the current memory's rows of every layer and, with RoPE, tables
// for the memory states the generation reaches (fam_cache_states).
static void fam_cache_alloc(Model *m, int max_len, size_t *counted) {
    const FoxConfig *cfg = &m->cfg;
    FAM_WIDTHS(m);
    size_t rows = (size_t)cfg->n_layer * m->B * cfg->fam_memory, M = (size_t)cfg->fam_memory, f = sizeof(float);
    Cache *kc = &m->cache;
#define X(type, name, width) kc->fam.name = (type *)dev_alloc(m, rows * (width) * sizeof(type), counted);
    FAM_FIELDS(X)
#undef X
    int nS = fam_cache_states(m, max_len);
    if (!cfg->rope || nS <= m->fam_rope_states) return;
    FOX_CUDA_CHECK(cudaFree(m->fam_rope_cos));
    FOX_CUDA_CHECK(cudaFree(m->fam_rope_sin));
    m->fam_rope_cos = (float *)dev_alloc(m, (size_t)nS * M * (m->Dh / 2) * f, counted);
    m->fam_rope_sin = (float *)dev_alloc(m, (size_t)nS * M * (m->Dh / 2) * f, counted);
    m->fam_rope_states = nS;
    upload_fam_rope_tables(m);
}

// A cache for the model's B sequences of up to max_len positions (checked against free memory before
// anything is allocated), and RoPE tables that cover them.
static void model_cache_init(Model *m, int max_len) {
    const FoxConfig *cfg = &m->cfg;
    char why[512];
    if (max_len < 1) fox_fatal("a KV cache of %d positions", max_len);
    model_cache_free(m);  // a cache made again (a new prompt length) fits in the memory of the one it replaces
    if (cache_does_not_fit(m, max_len, why, sizeof(why))) fox_fatal("%s", why);
    Cache *kc = &m->cache;
    size_t L = (size_t)cfg->n_layer, B = (size_t)m->B, BH = B * cfg->n_head, D = (size_t)cfg->d_model, Dh = (size_t)m->Dh;
    size_t f = sizeof(float), counted = 0;
    int has_fg = cfg->forget_gate != FOX_FG_NONE;
    kc->max_len = max_len;
    kc->keys_read = (unsigned long long *)dev_alloc(m, sizeof(unsigned long long), &counted);
    kc->pos = (int *)dev_alloc(m, sizeof(int), &counted);
    if (cfg->arch == FOX_ARCH_GSA) {  // no keys and values: the recurrent states (filled by the prefill)
        kc->gsa_S = (float *)dev_alloc(m, L * BH * GSA_SLOTS * Dh * f, &counted);
        kc->gsa_U = (float *)dev_alloc(m, L * BH * GSA_SLOTS * Dh * f, &counted);
        return;
    }
    kc->max_splits = fox_decode_max_splits((int)BH, m->Dh);
    kc->k = (bf16 *)dev_alloc(m, L * BH * max_len * Dh * sizeof(bf16), &counted);
    kc->v = (bf16 *)dev_alloc(m, L * BH * max_len * Dh * sizeof(bf16), &counted);
    if (model_has_c(m)) kc->c = (float *)dev_alloc(m, L * BH * max_len * f, &counted);
    if (m->doc_sep >= 0) kc->doc_start = (int *)dev_alloc(m, B * sizeof(int), &counted);
    if (cfg->kv_shift) {
        kc->k_prev = (bf16 *)dev_alloc(m, L * B * D * sizeof(bf16), &counted);
        kc->v_prev = (bf16 *)dev_alloc(m, L * B * D * sizeof(bf16), &counted);
    }
    if (m->acp && has_fg && !cfg->qk_norm) kc->k_max2 = (float *)dev_alloc(m, L * BH * f, &counted);
    kc->q = (bf16 *)dev_alloc(m, BH * Dh * sizeof(bf16), &counted);
    kc->first = (int *)dev_alloc(m, BH * sizeof(int), &counted);
    kc->part = (float *)dev_alloc(m, fox_decode_scratch_floats((int)BH, kc->max_splits, m->Dh) * f, &counted);
    if (cfg->rope && max_len > m->rope_len) {
        FOX_CUDA_CHECK(cudaFree(m->rope_cos));
        FOX_CUDA_CHECK(cudaFree(m->rope_sin));
        m->rope_cos = (float *)dev_alloc(m, (size_t)max_len * (Dh / 2) * f, &counted);
        m->rope_sin = (float *)dev_alloc(m, (size_t)max_len * (Dh / 2) * f, &counted);
        upload_rope_tables(m, max_len);
    }
    if (cfg->arch == FOX_ARCH_FAM) fam_cache_alloc(m, max_len, &counted);
}

// Layer l's current memory in the cache (B·M rows).
static FamRows fam_cache_rows(const Model *m, int l) {
    FAM_WIDTHS(m);
    size_t r = (size_t)l * m->B * m->cfg.fam_memory;
    FamRows f;
#define X(type, name, width) f.name = m->cache.fam.name + r * (width);
    FAM_FIELDS(X)
#undef X
    return f;
}

// After block τ's last token, layer l's memory moves on as fam_memory_forward's update: F_{τ+1} from F_τ and the
// block's cached keys and values (the cache's (B, H, max_len) rows are the update kernel's (B, H, T) at T =
// max_len), then F_{τ+1}'s attention inputs. The new rows overwrite x, which the update reads only before its MLP.
// CPU: fam_decode_update.
static void fam_decode_update(Model *m, int l, int tau) {
    Cache *kc = &m->cache;
    FamRows f = fam_cache_rows(m, l);
    CacheLayer cl = cache_layer(m, l);
    int R = m->B * m->cfg.fam_memory;
    fam_update_forward(f.o, f.lse, f.q, f.k, f.v, cl.k, cl.v, cl.c, fam_dims(m, m->B, kc->max_len), tau, m->stream);
    fam_update(m, l, f, f.x, R, tau > 0);
    fam_project(m, l, f, m->B, tau + 1);
}

// After a prefill of T tokens, each layer's memory for the next token (docs/model.md §1.10): the last state the
// forward computed, F_{⌈T/K⌉−1}, and when the prompt ends at a block's end the update from it.
static void fam_prefill_memory(Model *m, int T) {
    FAM_WIDTHS(m);
    size_t R = (size_t)m->B * m->cfg.fam_memory;
    int last = fam_states(m, T) - 1;
    for (int l = 0; l < m->cfg.n_layer; l++) {
        FamRows dst = fam_cache_rows(m, l), src = fam_state(m, l, last, m->B);
#define X(type, name, width) \
    FOX_CUDA_CHECK(cudaMemcpyAsync(dst.name, src.name, R * (width) * sizeof(type), cudaMemcpyDeviceToDevice, m->stream));
        FAM_FIELDS(X)
#undef X
        if (T % m->cfg.fam_block == 0) fam_decode_update(m, l, last);
    }
}

// The normal forward over the prompts (B x T tokens), filling the cache's first T positions; logits: each
// sequence's last-position logits (B x vocab_size).
static void model_prefill(Model *m, const int *tokens, int T, float *logits) {
    Cache *kc = &m->cache;
    int V = m->cfg.vocab_size;
    if (T < 1 || T > kc->max_len || T > m->T)
        fox_fatal("a prefill of %d tokens: the KV cache holds %d positions, the model's forward %d", T, kc->max_len, m->T);
    kc->prefilling = 1;
    model_forward(m, tokens, NULL, m->B, T);
    kc->prefilling = 0;
    if (fox_fam_has_memory(&m->cfg)) fam_prefill_memory(m, T);
    for (int b = 0; b < m->B; b++) model_logits_rows(m, b * T + T - 1, 1, logits + (size_t)b * V);
    if (kc->doc_start) {  // each sequence's latest separator in the prompt (0: none), for ACP's first key
        int *start = (int *)fox_calloc((size_t)m->B, sizeof(int));
        for (int b = 0; b < m->B; b++)
            for (int t = 0; t < T; t++)
                if (fox_doc_start(tokens[(size_t)b * T + t], m->doc_sep)) start[b] = t;
        FOX_CUDA_CHECK(cudaMemcpy(kc->doc_start, start, (size_t)m->B * sizeof(int), cudaMemcpyHostToDevice));
        free(start);
    }
    kc->len = T;
    kc->keys_cached = 0;
    FOX_CUDA_CHECK(cudaMemsetAsync(kc->keys_read, 0, sizeof(unsigned long long), m->stream));
    FOX_CUDA_CHECK(cudaMemcpy(kc->pos, &T, sizeof(int), cudaMemcpyHostToDevice));
}

// Block l's attention for the new token of each sequence at position *kc->pos, over the cache: mid = x + W_o z
// (FoX eq. 11-13 and 15-23; FAM: over its window of the cache and its memory). CPU: decode_attention_block.
static void decode_attention_block(Model *m, int l, const float *x, float *mid) {
    const FoxConfig *cfg = &m->cfg;
    Acts *a = &m->a;
    Cache *kc = &m->cache;
    int B = m->B, D = cfg->d_model, H = cfg->n_head, Dh = m->Dh, has_fg = cfg->forget_gate != FOX_FG_NONE;
    int acp = m->acp && model_has_c(m), cf = cfg->forget_gate == FOX_FG_DATA_DEPENDENT ? m->cols.fgate : -1;
    fox_decode_rmsnorm(a->xn1[0], x, param(m, FOX_P_ln1_w, l), B, D, m->stream, 1);
    attn_in_forward(m, a->proj_wide[0], a->proj_logits[0], a->xn1[0], l, B, 1);
    QkvInputs s = qkv_inputs(m, l, B, 1);
    s.proj = proj_at(m, 0);
    CacheLayer cl = cache_layer(m, l);
    LAUNCH_HEADS(decode_qkv_kernel, Dh, (size_t)B * H, m->stream, kc->q, kc->first, kc->keys_read, cl, s, cf,
                 has_fg ? param(m, FOX_P_fgate_b, l) : NULL, acp, kc->doc_start, kc->pos);
    if (cfg->arch == FOX_ARCH_FAM) {
        FamRows f = fam_cache_rows(m, l);
        fam_decode_attention(a->o[0], kc->q, cl.k, cl.v, cl.c, f.k, f.v, fam_dims(m, B, kc->max_len), cfg->fam_window_blocks,
                             kc->pos, m->stream);
    } else {
        fox_decode_attention(a->o[0], kc->q, cl.k, cl.v, cl.c, acp ? kc->first : NULL, kc->part, B * H, Dh, kc->max_len,
                             kc->pos, kc->max_splits, m->stream, 1);
    }
    fox_output_forward(a->z[0], a->o[0], proj_at(m, 0), cfg->output_gate ? m->cols.gate : -1,
                       cfg->output_norm ? param(m, FOX_P_onorm_w, l) : NULL, B, H, Dh, m->stream);
    decode_linear(m, mid, x, CUDA_R_32F, D, a->z[0], wbf(m, FOX_P_attn_out_w, l), D, D, 1);
}

// Block l's Gated Slot Attention for the new token of each sequence: one step of the recurrence from the cached
// states, mid = x + W_o z (GSA paper eq. 6-9). CPU: decode_gsa_block.
static void decode_gsa_block(Model *m, int l, const float *x, float *mid) {
    const FoxConfig *cfg = &m->cfg;
    Acts *a = &m->a;
    Cache *kc = &m->cache;
    int B = m->B, D = cfg->d_model;
    size_t per_layer = (size_t)B * cfg->gsa_heads * GSA_SLOTS * m->Dh;
    fox_decode_rmsnorm(a->xn1[0], x, param(m, FOX_P_ln1_w, l), B, D, m->stream, 1);
    attn_in_forward(m, a->proj_wide[0], a->proj_logits[0], a->xn1[0], l, B, 1);
    fox_gsa_decode(a->o[0], kc->gsa_S + l * per_layer, kc->gsa_U + l * per_layer, proj_at(m, 0), gsa_shape(m, B, 1), m->stream);
    fox_gsa_output_norm(a->z[0], a->o[0], param(m, FOX_P_onorm_w, l), B, D, m->stream);
    decode_linear(m, mid, x, CUDA_R_32F, D, a->z[0], wbf(m, FOX_P_attn_out_w, l), D, D, 1);
}

// Block l's MLP for the decode step's B rows: x = mid + W_down SwiGLU(W_in RMSNorm(mid)). CPU: mlp_forward.
static void decode_mlp_block(Model *m, int l, const float *mid, float *x) {
    Acts *a = &m->a;
    int B = m->B, D = m->cfg.d_model, I = m->cfg.mlp_hidden;
    fox_decode_rmsnorm(a->xn2[0], mid, param(m, FOX_P_ln2_w, l), B, D, m->stream, 1);
    const bf16 *w_in = wbf(m, FOX_P_mlp_in_w, l);
    if (fox_decode_linear_fits(a->xn2[0], w_in, B, D)) {
        fox_decode_linear(a->mlp_h[0], NULL, a->xn2[0], w_in, D, I, DECODE_SWIGLU, m->stream, 1);
    } else {
        linear_forward(&m->gemm, a->mlp_u[0], NULL, CUDA_R_16BF, 2 * I, a->xn2[0], w_in, B, D, 2 * I);
        fox_swiglu_forward(a->mlp_h[0], a->mlp_u[0], B, I, m->stream);
    }
    decode_linear(m, x, mid, CUDA_R_32F, D, a->mlp_h[0], wbf(m, FOX_P_mlp_out_w, l), I, D, 1);
}

// The kernels of a decode step, from the tokens in a->inputs to the final norm's rows in a->xnf, then the
// position moved on. The residual stream alternates between resid's and mid's first B rows.
static void decode_step_kernels(Model *m) {
    const FoxConfig *cfg = &m->cfg;
    Acts *a = &m->a;
    int B = m->B, D = cfg->d_model;
    float *x = a->resid, *mid = a->mid[0];
    embedding_forward_kernel<<<fox_blocks((size_t)B * D, 256), 256, 0, m->stream>>>(x, a->inputs, param(m, FOX_P_wte, 0), B, D);
    FOX_LAUNCH_CHECK();
    for (int l = 0; l < cfg->n_layer; l++) {
        if (cfg->arch == FOX_ARCH_GSA) decode_gsa_block(m, l, x, mid);
        else decode_attention_block(m, l, x, mid);
        decode_mlp_block(m, l, mid, x);
    }
    fox_decode_rmsnorm(a->xnf, x, param(m, FOX_P_lnf_w, 0), B, D, m->stream, 1);
    decode_advance_kernel<<<1, 1, 0, m->stream>>>(m->cache.pos, m->cache.doc_start, a->inputs, B, m->doc_sep);
    FOX_LAUNCH_CHECK();
}

// A decode step's hundreds of small kernels cost more to launch one by one than to run at batch 1, so they
// are captured once as a CUDA graph (the position is read on the device) and replayed at every step.
static void decode_step_capture(Model *m) {
    Cache *kc = &m->cache;
    cudaGraph_t graph;
    if (kc->step) FOX_CUDA_CHECK(cudaGraphExecDestroy(kc->step));
    FOX_CUDA_CHECK(cudaStreamBeginCapture(m->stream, cudaStreamCaptureModeThreadLocal));
    decode_step_kernels(m);
    FOX_CUDA_CHECK(cudaStreamEndCapture(m->stream, &graph));
    FOX_CUDA_CHECK(cudaGraphInstantiate(&kc->step, graph, 0));
    FOX_CUDA_CHECK(cudaGraphDestroy(graph));
    kc->step_acp = m->acp;
}

// One token per sequence (B of them) at the next position; logits: B x vocab_size.
static void model_decode(Model *m, const int *tokens, float *logits) {
    const FoxConfig *cfg = &m->cfg;
    Cache *kc = &m->cache;
    int B = m->B, t = kc->len;
    if (kc->len < 1) fox_fatal("a decode step before the prefill");
    if (kc->len >= kc->max_len) fox_fatal("a decode step at position %d: the KV cache holds %d positions", kc->len, kc->max_len);
    FOX_CUDA_CHECK(cudaMemcpy(m->a.inputs, tokens, (size_t)B * sizeof(int), cudaMemcpyHostToDevice));
    if (!kc->step || kc->step_acp != m->acp) decode_step_capture(m);
    FOX_CUDA_CHECK(cudaGraphLaunch(kc->step, m->stream));
    // FAM after a block's last token: every layer's memory update, outside the graph (which serves every position).
    if (fox_fam_has_memory(cfg) && (t + 1) % cfg->fam_block == 0)
        for (int l = 0; l < cfg->n_layer; l++) fam_decode_update(m, l, t / cfg->fam_block);
    if (B > m->ce_rows) {
        model_logits_rows(m, 0, B, logits);
    } else {
        decode_linear(m, m->a.logits, NULL, CUDA_R_16BF, m->VP, m->a.xnf, wbf(m, FOX_P_lm_head_w, 0), cfg->d_model, m->VP, 0);
        logits_to_host(m, B, logits);
    }
    kc->len++;
    kc->keys_cached += (long long)cfg->n_layer * B * cfg->n_head * (t + 1);
}

// ACP: the fraction of the cached keys the decode steps since the prefill read; < 0 without ACP, without a
// forget gate and document mask, or before a decode step.
static double model_decode_keys_read(Model *m) {
    Cache *kc = &m->cache;
    if (!m->acp || !model_has_c(m) || !kc->keys_cached) return -1.0;
    unsigned long long read;
    FOX_CUDA_CHECK(cudaMemcpy(&read, kc->keys_read, sizeof(read), cudaMemcpyDeviceToHost));
    return (double)read / kc->keys_cached;
}

// ----------------------------------------------------------------------------
// The run (fox/run.h): what it needs from this model. Not part of the test build.
#ifndef TESTING

// Bytes of device memory the model's buffers take at recompute level `recompute` (nothing allocated).
static size_t device_bytes_needed(const Model *m, int recompute, size_t *weights, size_t *acts, size_t *scratch) {
    Model plan = *m;
    plan.planning = 1;
    plan.recompute = recompute;
    plan.bytes_weights = plan.bytes_acts = plan.bytes_scratch = 0;
    model_alloc(&plan, m->B, m->T);
    if (weights) *weights = plan.bytes_weights;
    if (acts) *acts = plan.bytes_acts;
    if (scratch) *scratch = plan.bytes_scratch;
    return plan.bytes_weights + plan.bytes_acts + plan.bytes_scratch;
}

// Device memory not in our buffers: cuBLASLt's two workspaces (the main stream's and the weight
// gradients'), and for the CUDA and NCCL libraries' own allocations a fixed 512 MiB plus 2% of ours.
static size_t device_bytes_other(size_t ours) { return 2 * FOX_GEMM_WORKSPACE + ((size_t)512 << 20) + ours / 50; }

// Fails with one line, before anything is allocated, when the run does not fit in the device's free
// memory (capped by the test-only FOX_TEST_DEVICE_MEMORY, bytes): the need, and what would fit.
static void check_device_memory(const Model *m, const Dist *d) {
    const double gib = 1024.0 * 1024.0 * 1024.0;
    size_t w, a, s, free_b = device_free_bytes();
    size_t ours = device_bytes_needed(m, m->recompute, &w, &a, &s), need = ours + device_bytes_other(ours);
    double short_ranks = need > free_b;
    dist_allreduce_sum_f64(d, &short_ranks, 1);
    if (short_ranks == 0.0) return;
    if (d->rank) exit(1);  // rank 0 says why
    char remedy[256];
    if (m->forward_only) {
        snprintf(remedy, sizeof(remedy), "evaluate at a shorter --eval-seq-len than %d", m->T);
    } else {
        size_t ours2 = device_bytes_needed(m, RECOMPUTE_BLOCK, NULL, NULL, NULL), need2 = ours2 + device_bytes_other(ours2);
        char r2[96] = "";
        if (m->recompute < RECOMPUTE_BLOCK)
            snprintf(r2, sizeof(r2), "--recompute 2 (%.1f GiB%s), ", need2 / gib, need2 > free_b ? ", still too much" : "");
        snprintf(remedy, sizeof(remedy), "use %sa smaller --batch than %d, or more ranks with ZeRO-1 (--zero 1)", r2, m->B);
    }
    fox_fatal("this run needs %.1f GiB of device memory (weights+grads+AdamW %.1f, activations %.1f, backward scratch "
              "%.1f, libraries %.1f) but %.1f GiB is free on GPU %d: %s", need / gib, w / gib, a / gib, s / gib,
              (need - ours) / gib, free_b / gib, d->local_rank, remedy);
}

// Whether the model's buffers fit in free_b bytes with a sixteenth of them to spare.
static int fits_with_spare(const Model *m, size_t free_b) {
    size_t ours = device_bytes_needed(m, m->recompute, NULL, NULL, NULL);
    return ours + device_bytes_other(ours) + free_b / 16 <= free_b;
}

// --recompute 0 keeps, as far as the device's free memory holds them with a sixteenth of it to spare, first
// the attention q, k, v of as many blocks as fit (the others recompute theirs in the backward), then, once
// every block keeps those, the norms', output gate's and SwiGLU's outputs (xn, z, h) of as many blocks (the
// others' backward kernels write them again). Where not even one block's q, k, v fit, the MLP inputs are
// recomputed too: the run is --recompute 1's. The same bits either way.
static void fit_kept_blocks(Model *m, int say) {
    size_t free_b = device_free_bytes();
    int outs = m->outs_kept;
    m->outs_kept = 0;
    while (m->qkv_kept > 0 && !fits_with_spare(m, free_b)) m->qkv_kept--;
    if (m->qkv_kept == 0 && m->recompute == RECOMPUTE_NONE && !fits_with_spare(m, free_b)) {
        m->recompute = RECOMPUTE_NORM_MLP;
        if (say) printf("--recompute 0: not one block's activations fit beside the rest; the run recomputes as --recompute 1 "
                        "(the same bits)\n");
    }
    if (m->qkv_kept < m->cfg.n_layer) return;
    m->outs_kept = outs;
    while (m->outs_kept > 0 && !fits_with_spare(m, free_b)) m->outs_kept--;
}

// One GPU per rank: rank r of a node takes GPU r (or the one GPU a launcher left it, as srun's
// --gpus-per-task does); two ranks given one GPU (a hostfile or binding that puts them there) stop the run.
static void choose_gpu(const Dist *d) {
    int ngpu = 0;
    FOX_CUDA_CHECK(cudaGetDeviceCount(&ngpu));
    int bound = ngpu == 1 && getenv("CUDA_VISIBLE_DEVICES");
    if (d->local_world > ngpu && !bound)
        fox_fatal("%d ranks on this node but %d GPUs: train_fox runs one rank per GPU", d->local_world, ngpu);
    FOX_CUDA_CHECK(cudaSetDevice(bound ? 0 : d->local_rank));
    if (d->world < 2) return;
    cudaDeviceProp prop;
    FOX_CUDA_CHECK(cudaGetDeviceProperties(&prop, bound ? 0 : d->local_rank));
    unsigned char *uuids = (unsigned char *)fox_malloc((size_t)d->world * sizeof(prop.uuid));
    dist_allgather(d, &prop.uuid, sizeof(prop.uuid), uuids);
    for (int i = 0; i < d->rank; i++)
        if (!memcmp(uuids + (size_t)i * sizeof(prop.uuid), &prop.uuid, sizeof(prop.uuid)))
            fox_fatal("ranks %d and %d were given the same GPU (%s, node %d): train_fox runs one rank per GPU (launch as many "
                      "ranks per node as it has GPUs, each seeing all of them or its own: srun --gpus-per-task=1)",
                      i, d->rank, prop.name, d->node);
    free(uuids);
}

#ifdef FOX_MPI
// The collective timeout's hooks (fox/watchdog.h): NCCL's asynchronous error, and the abort that ends a
// collective left waiting for a dead rank.
static const char *nccl_async_error(void *ctx) {
    ncclResult_t st = ncclSuccess;
    if (ncclCommGetAsyncError((ncclComm_t)ctx, &st) != ncclSuccess) return "ncclCommGetAsyncError failed";
    return st == ncclSuccess || st == ncclInProgress ? NULL : ncclGetErrorString(st);
}

static void nccl_abort(void *ctx) { ncclCommAbort((ncclComm_t)ctx); }
#endif

// The rank's GPU (choose_gpu); the run must fit in its memory (check_device_memory); then the ranks' NCCL
// communicator (rank 0 makes the id, MPI carries it to the others). ZeRO-1 (--zero 1, several ranks):
// this rank keeps only its shard of the AdamW moments.
static Model *run_model_init(const FoxConfig *cfg, const ModelOptions *o, const Dist *d) {
    Model *m = (Model *)fox_calloc(1, sizeof(Model));
    choose_gpu(d);
    FoxLayout lay;
    fox_layout(cfg, &lay);
    size_t lo = 0, hi = lay.total;
    if (d->world > 1 && o->zero) zero_shard(lay.total, d->world, d->rank, &lo, &hi);
    model_setup(m, cfg, o, lo, hi);
    fit_kept_blocks(m, d->rank == 0);
    check_device_memory(m, d);
    model_create(m, o->seed);
    m->world = d->world;
#ifdef FOX_MPI
    if (d->world > 1) {
        ncclUniqueId id;
        if (d->rank == 0) FOX_NCCL_CHECK(ncclGetUniqueId(&id));
        dist_broadcast(d, &id, sizeof(id), 0);
        FOX_NCCL_CHECK(ncclCommInitRank(&m->nccl, d->world, id, d->rank));
        FoxWatchdogHooks hooks = {nccl_async_error, nccl_abort, m->nccl};
        fox_watchdog_hooks(hooks);
        FOX_CUDA_CHECK(cudaStreamCreateWithFlags(&m->comm, cudaStreamNonBlocking));
        FOX_CUDA_CHECK(cudaEventCreateWithFlags(&m->grads_final, cudaEventDisableTiming));
        FOX_CUDA_CHECK(cudaEventCreateWithFlags(&m->reduced, cudaEventDisableTiming));
    }
#endif
    return m;
}

static const float *run_model_losses(Model *m) { return m->h_losses; }

static void run_model_logits(Model *m, int r0, int rows, float *out) { model_logits_rows(m, r0, rows, out); }

static void run_model_forward_queue(Model *m, const int *inputs, const int *targets, int B, int T) {
    model_forward_queue(m, inputs, targets, B, T);
}

static double run_model_loss(Model *m) { return model_forward_loss(m); }

static void run_model_backward(Model *m, const int *inputs, const int *targets, int B, int T, float dloss_scale,
                               int last) {
    (void)targets;  // the forward copied them to the device (and left the dlogits when the whole batch's fit)
    model_backward(m, inputs, B, T, dloss_scale, last && m->world > 1);
}

static void run_model_zero_grad(Model *m) { model_zero_grad(m); }

static double run_model_grad_norm(Model *m) { return grad_norm(m); }

static void run_model_update(Model *m, const OptConfig *o, double lr, int t, double norm) { optimizer_update(m, o, lr, t, norm); }

// The ranks' gradients were averaged during the last micro-batch's backward (reduce_final_grads);
// the optimizer waits for those all-reduces.
static void run_model_average_grads(Model *m, const Dist *d) {
#ifdef FOX_MPI
    (void)d;
    FOX_CUDA_CHECK(cudaEventRecord(m->reduced, m->comm));
    FOX_CUDA_CHECK(cudaStreamWaitEvent(m->stream, m->reduced, 0));
#else
    (void)m;
    fox_fatal("this train_fox was built without MPI: %d ranks cannot average their gradients", d->world);
#endif
}

// The moments m1, m2 are this rank's shard (run_model_shard), the weights all of them.
static void run_model_get(Model *m, float *params, float *m1, float *m2) {
    size_t bytes = (m->shard_hi - m->shard_lo) * sizeof(float);
    if (params) model_get_params(m, params);
    if (m1) FOX_CUDA_CHECK(cudaMemcpy(m1, m->m, bytes, cudaMemcpyDeviceToHost));
    if (m2) FOX_CUDA_CHECK(cudaMemcpy(m2, m->v, bytes, cudaMemcpyDeviceToHost));
}

static void run_model_set(Model *m, const float *params, const float *m1, const float *m2) {
    size_t bytes = (m->shard_hi - m->shard_lo) * sizeof(float);
    if (params) model_set_params(m, params);
    if (m1) FOX_CUDA_CHECK(cudaMemcpy(m->m, m1, bytes, cudaMemcpyHostToDevice));
    if (m2) FOX_CUDA_CHECK(cudaMemcpy(m->v, m2, bytes, cudaMemcpyHostToDevice));
}

static void run_model_shard(const Model *m, size_t *offset, size_t *count) {
    *offset = m->shard_lo;
    *count = m->shard_hi - m->shard_lo;
}

static int run_model_acp_tiles(Model *m, long long *live, long long *tiles) {
    if (!m->acp_tiles) return 0;
    FOX_CUDA_CHECK(cudaStreamSynchronize(m->stream));  // the copy of the last forward's counts
    for (int i = 0; i < m->cfg.n_layer * m->cfg.n_head; i++) live[i] = (long long)m->acp_live[i];
    *tiles = m->acp_tiles;
    return 1;
}

static void run_model_cache_init(Model *m, int max_len) { model_cache_init(m, max_len); }

static void run_model_prefill(Model *m, const int *tokens, int T, float *logits) { model_prefill(m, tokens, T, logits); }

static void run_model_decode(Model *m, const int *tokens, float *logits) { model_decode(m, tokens, logits); }

static double run_model_decode_keys_read(Model *m) { return model_decode_keys_read(m); }

static void run_model_sync(Model *m) { FOX_CUDA_CHECK(cudaStreamSynchronize(m->stream)); }

// bf16 dense peak of the device (docs/model.md §6), or 0 when unknown.
static double run_model_peak_flops(void) {
    cudaDeviceProp prop;
    int dev;
    FOX_CUDA_CHECK(cudaGetDevice(&dev));
    FOX_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    if (prop.major == 9) return 989.4e12;
    if (prop.major == 8 && prop.minor == 0) return 312e12;
    return 0.0;
}

// Device memory after the first step, and how much of it is ours.
static void run_model_report(Model *m) {
    size_t free_b, total_b;
    FOX_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    const double gib = 1024.0 * 1024.0 * 1024.0;
    printf("memory (recompute %d, q, k, v kept in %d of %d blocks, xn, z, h in %d): %.2f GiB in use on the device of "
           "%.2f | ours: weights+grads+AdamW %.2f, activations %.2f, backward scratch %.2f GiB\n", m->recompute,
           m->qkv_kept, m->cfg.n_layer, m->outs_kept, (total_b - free_b) / gib, total_b / gib,
           m->bytes_weights / gib, m->bytes_acts / gib, m->bytes_scratch / gib);
}

#include "fox/run.h"

int main(int argc, char **argv) { return run_main(argc, argv); }
#endif
