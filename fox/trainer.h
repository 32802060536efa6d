// fox/trainer.h: the contract between the run loop (fox/run.h: flags, data, steps, logs, checkpoints,
// --eval-only, sampling) and a trainer (train_fox.c on the CPU, train_fox.cu on the GPU). A trainer
// includes this header, defines `struct Model` (which the run never looks into) and every function
// declared below, then includes fox/run.h. The compiler checks each definition against its declaration
// here.
#ifndef FOX_TRAINER_H
#define FOX_TRAINER_H

#include <stddef.h>
#include <stdint.h>
#include "config.h"        // FoxConfig, FoxLayout
#include "train_common.h"  // OptConfig
#include "dist.h"          // Dist: this process's rank among the data-parallel ranks

typedef struct Model Model;

// How the run wants the model built: everything a trainer needs from the command line, passed in (a
// trainer keeps no flags of its own in file-scope variables).
typedef struct {
    int batch, seq_len;     // the micro-batch: batch sequences of seq_len tokens
    uint64_t seed;          // the weights' seed (docs/model.md §1 init)
    int forward_only;       // --eval-only: no gradients, optimizer state or backward scratch
    int recompute;          // --recompute: activations recomputed in the backward (GPU; the CPU keeps all)
    int acp;                // --acp: Adaptive Computation Pruning (docs/model.md §1.5)
    int doc_sep;            // --doc-mask: the token that starts a document (docs/model.md §1.8); -1: no mask
    int zero;               // --zero: ZeRO-1, this rank holds 1/ranks of the AdamW moments (GPU)
    int deterministic;      // --deterministic: bitwise reproducible attention backward (GPU)
    size_t logits_bytes;    // largest logits buffer; longer batches run the lm_head in chunks (GPU;
                            // 0 = FOX_LOGITS_BYTES)
    int qkv_blocks;         // --recompute 0: the blocks (the first ones) whose attention q, k, v the forward
                            // keeps for the backward, the others' recomputed (GPU); -1: as many as the
                            // device has room for
    int outs_blocks;        // the same for the norms', output gate's and SwiGLU's outputs, which the
                            // backward's kernels otherwise write again (GPU)
} ModelOptions;

#define FOX_LOGITS_BYTES ((size_t)2 << 30)

// The tests (TESTING) drive the model directly and build without the run, hence without these.
#ifndef TESTING
// A new model with the shared init (a GPU trainer also picks its GPU, joins its ranks and checks that
// the run fits in device memory before allocating: one line with the need and the remedy if not). The
// run releases it with model_free, then free.
static Model *run_model_init(const FoxConfig *cfg, const ModelOptions *o, const Dist *d);
static void model_free(Model *m);
// Mean loss over the targets (inputs and targets: batch x T token ids; targets NULL: logits only).
static double model_forward(Model *m, const int *inputs, const int *targets, int B, int T);
// A training micro-batch's forward in two halves, so that the backward is queued before the trainer waits
// for the forward: run_model_forward_queue (with targets), then run_model_loss, the mean loss (the GPU trainer
// copies the per-position losses back while the backward runs).
static void run_model_forward_queue(Model *m, const int *inputs, const int *targets, int B, int T);
static double run_model_loss(Model *m);
// Per-position losses of the last forward, on the host (after run_model_loss for a queued one).
static const float *run_model_losses(Model *m);
// The fp32 logits of rows [r0, r0 + rows) (row b·T + t) of the last model_forward without targets, on the
// host (rows x vocab_size floats).
static void run_model_logits(Model *m, int r0, int rows, float *out);
// Adds this micro-batch's gradient, scaled by dloss_scale. last: the step's last micro-batch (a trainer
// may start averaging the ranks' gradients as they become final).
static void run_model_backward(Model *m, const int *inputs, const int *targets, int B, int T, float dloss_scale,
                               int last);
static void run_model_zero_grad(Model *m);
// The mean of the ranks' gradients, on every rank.
static void run_model_average_grads(Model *m, const Dist *d);
// Global L2 norm of the (averaged) gradient; every rank gets the same value.
static double run_model_grad_norm(Model *m);
// Clips by that norm, then one AdamW step (t: 1-based step).
static void run_model_update(Model *m, const OptConfig *o, double lr, int t, double norm);
// fp32 copies in the FOX_PARAMS layout: all weights, and the AdamW moments this rank holds
// (run_model_shard); a NULL pointer skips that part.
static void run_model_get(Model *m, float *params, float *m1, float *m2);
static void run_model_set(Model *m, const float *params, const float *m1, const float *m2);
// The AdamW moments this rank holds: elements [offset, offset + count) of the flat vector.
static void run_model_shard(const Model *m, size_t *offset, size_t *count);
// ACP: the attention tiles the last forward computed (this rank's), per layer and head summed over the
// batch (live[l·H + h], fox_acp_live_tiles of each sequence's staircase), each out of *tiles (the causal
// grids of one (layer, head), B·fox_acp_tiles(T)); returns 0, writing nothing, without ACP.
static int run_model_acp_tiles(Model *m, long long *live, long long *tiles);
// Waits for queued work (step timing).
static void run_model_sync(Model *m);
// The device's dense bf16 peak for MFU (docs/model.md §6); 0 when unknown.
static double run_model_peak_flops(void);
// Printed once, after the first step (device memory).
static void run_model_report(Model *m);

// Generation with a KV cache (docs/model.md §7). The cache holds, per layer and sequence, the keys and
// values as attention sees them (after KV-shift, QK-norm and RoPE), c = Σ log f of every cached position,
// and the KV-shift state (the last token's unshifted key and value). The model is made with forward_only,
// batch = the sequences generated together, seq_len >= the prompt length.
// A cache for the model's batch of sequences of up to max_len tokens (any length: past the training
// context too). When it does not fit in memory: one line with the need and exit 1, nothing allocated.
// The prefill fills it layer by layer during the forward, so any recompute level works.
static void run_model_cache_init(Model *m, int max_len);
// The normal forward over tokens (batch x T, T >= 1), which fills the cache's first T positions; writes
// each sequence's last-position logits (batch x vocab_size floats).
static void run_model_prefill(Model *m, const int *tokens, int T, float *logits);
// One token per sequence (batch of them) at the next position: attends over the cache (with ACP, only to
// the cached keys whose decay bias is above the ACP threshold), appends the token to it and writes its
// logits (batch x vocab_size floats). Fatal past max_len.
static void run_model_decode(Model *m, const int *tokens, float *logits);
// ACP: the fraction of the cached keys the decode steps since the prefill read (this rank's); < 0
// without ACP or without a forget gate.
static double run_model_decode_keys_read(Model *m);
#endif

#endif
