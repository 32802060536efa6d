// fox/run.h: a training or evaluation run — flags, data, the step loop, logs, checkpoints, resume,
// --eval-only and sampling — shared by train_fox_cpu (train_fox.c) and train_fox (train_fox.cu).
// Each trainer defines its Model (with fields cfg, lay and T) and these before including this file:
//   void   run_model_init(Model *m, const FoxConfig *c, int B, int T, uint64_t seed, int recompute,
//                         const Dist *d);   (a GPU trainer picks its GPU and joins its ranks here)
//   void   run_model_options(const FoxArgs *a);   trainer-specific flags (--deterministic, --acp)
//   void   model_free(Model *m);
//   double model_forward(Model *m, const int *inputs, const int *targets, int B, int T);
//   const float *run_model_losses(Model *m);     per-position losses of the last forward, on the host
//   void   run_model_backward(Model *m, const int *inputs, const int *targets, int B, int T, float dloss_scale,
//                             int last);   last: the step's last micro-batch (a trainer may start averaging
//                                          the ranks' gradients as they become final)
//   void   run_model_zero_grad(Model *m);
//   void   run_model_average_grads(Model *m, const Dist *d);   mean of the ranks' gradients
//   double optimizer_step(Model *m, const OptConfig *o, double lr, int t);   returns the pre-clip norm
//   void   run_model_get(Model *m, float *params, float *m1, float *m2);   fp32, FOX_PARAMS layout;
//   void   run_model_set(Model *m, const float *params, const float *m1, const float *m2);  NULL skips
//   void   run_model_shard(const Model *m, size_t *offset, size_t *count);   the AdamW moments this rank holds
//                                          (m1, m2 above): elements [offset, offset + count)
//   void   run_model_logits_row(Model *m, int row, float *out);   after a forward without targets
//   double run_model_acp_live(Model *m);         ACP: fraction of the attention tiles the last forward
//                                                computed (this rank's); < 0 without ACP
//   void   run_model_sync(Model *m);             waits for queued work (step timing)
//   double run_model_peak_flops(void);           dense peak for MFU (SPEC §6), 0 when unknown
//   void   run_model_report(Model *m);           once, after the first step (memory)
#ifndef FOX_RUN_H
#define FOX_RUN_H

#include <time.h>
#include "config.h"
#include "args.h"
#include "io.h"
#include "npy.h"
#include "checkpoint.h"
#include "train_common.h"
#include "dist.h"
#include "../dataloader.h"
#include "../tokenizer.h"

typedef struct {
    FoxArgs args;
    Dist dist;
    Model model;
    OptConfig opt;
    DataLoader train, val;
    int has_val, grad_accum, step;
    long long tokens;
    uint64_t rng;                 // counter of the sampling stream
    int *inputs, *targets;
    double *pos_loss;             // per-position loss summed since the last save (SPEC §6 L(i))
    long long pos_loss_seqs;
    int train_seq_len;            // --eval-only: the evaluated checkpoint's training context (0 = unknown)
    float *h_params, *h_m, *h_v;  // host staging of weights and AdamW moments (checkpoints)
    FILE *log;
} Run;

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

// Checks that every token id is a valid index for the model's vocabulary.
static void check_tokens(const int *ids, size_t n, int vocab, const char *what) {
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab) fox_fatal("%s holds token id %d, outside the vocabulary of %d (set --vocab)", what, ids[i], vocab);
}

// The next batch of a loader, with its ids checked against the vocabulary.
static void next_batch(Run *r, DataLoader *dl, const char *what, size_t n) {
    dataloader_next(dl, r->inputs, r->targets);
    check_tokens(r->inputs, n, r->model.cfg.vocab_size, what);
    check_tokens(r->targets, n, r->model.cfg.vocab_size, what);
}

// Host buffers for the weights (and the AdamW moments), allocated on first use.
static void ensure_host_staging(Run *r, int moments) {
    size_t n = r->model.lay.total;
    if (!r->h_params) r->h_params = (float *)fox_malloc(n * sizeof(float));
    if (moments && !r->h_m) {
        r->h_m = (float *)fox_malloc(n * sizeof(float));
        r->h_v = (float *)fox_malloc(n * sizeof(float));
    }
}

static void load_weights(Run *r, const char *path, const FoxConfig *cfg) {
    ensure_host_staging(r, 0);
    fox_read_model_bin(path, cfg, r->h_params);
    run_model_set(&r->model, r->h_params, NULL, NULL);
}

// Mean validation loss over up to val_steps batches, averaged across ranks.
static double evaluate(Run *r) {
    int B = r->args.batch, T = r->args.seq_len;
    long long avail = dataloader_num_windows(&r->val) / B;
    int steps = (int)(avail < r->args.val_steps ? avail : r->args.val_steps);
    if (steps < 1) fox_fatal("validation data %s holds fewer than --batch %d sequences of --seq-len %d", r->args.val, B, T);
    dataloader_reset(&r->val);
    double sum = 0.0;
    for (int s = 0; s < steps; s++) {
        next_batch(r, &r->val, r->args.val, (size_t)B * T);
        sum += model_forward(&r->model, r->inputs, r->targets, B, T);
    }
    double mean = sum / steps;
    dist_allreduce_sum_f64(&r->dist, &mean, 1);
    return mean / r->dist.world;
}

// One optimizer step: grad_accum micro-batches, the mean over ranks, clip, AdamW. Returns the loss.
static double train_step(Run *r, double lr, double *norm_out) {
    Model *m = &r->model;
    int B = r->args.batch, T = r->args.seq_len, N = B * T;
    run_model_zero_grad(m);
    double loss = 0.0;
    for (int micro = 0; micro < r->grad_accum; micro++) {
        next_batch(r, &r->train, r->args.train, (size_t)N);
        loss += model_forward(m, r->inputs, r->targets, B, T) / r->grad_accum;
        const float *pos = run_model_losses(m);
        for (int n = 0; n < N; n++) r->pos_loss[n % T] += pos[n];
        r->pos_loss_seqs += B;
        run_model_backward(m, r->inputs, r->targets, B, T, 1.0f / r->grad_accum, micro == r->grad_accum - 1);
    }
    if (r->dist.world > 1) {
        run_model_average_grads(m, &r->dist);
        dist_allreduce_sum_f64(&r->dist, &loss, 1);
        loss /= r->dist.world;
    }
    *norm_out = optimizer_step(m, &r->opt, lr, r->step + 1);
    return loss;
}

static FoxTrainState run_state(const Run *r) {
    FoxTrainState s;
    memset(&s, 0, sizeof(s));
    s.rank = r->dist.rank;
    s.world = r->dist.world;
    s.step = r->step;
    s.seq_len = r->args.seq_len;
    s.batch = r->args.batch;
    s.tokens = r->tokens;
    size_t off, cnt;
    run_model_shard(&r->model, &off, &cnt);
    s.shard_offset = (long long)off;
    s.shard_count = (long long)cnt;
    s.total_batch = (long long)r->grad_accum * r->args.batch * r->args.seq_len * r->dist.world;
    s.loader_bytes = (long long)dataloader_state_bytes(&r->train);
    s.rng = r->rng;
    return s;
}

static void state_path(char *buf, size_t cap, const char *dir, int rank) {
    if (snprintf(buf, cap, "%s/state_%05d.bin", dir, rank) >= (int)cap) fox_fatal("path too long: %s", dir);
}

// Atomic checkpoint (SPEC §5): every rank writes its state into the temporary directory, rank 0
// the weights, then rank 0 renames it into place and prunes old ones.
static void save_checkpoint(Run *r) {
    const char *out = r->args.out;
    char tmp[4096], path[4352];
    ensure_host_staging(r, 1);
    run_model_get(&r->model, r->h_params, r->h_m, r->h_v);
    if (r->dist.rank == 0) fox_ckpt_begin(out, r->step, tmp, sizeof(tmp));
    dist_barrier(&r->dist);
    fox_ckpt_dir(tmp, sizeof(tmp), out, r->step, 1);
    FoxTrainState s = run_state(r);
    void *loader = fox_malloc((size_t)s.loader_bytes);
    dataloader_save_state(&r->train, loader);
    state_path(path, sizeof(path), tmp, r->dist.rank);
    fox_write_state(path, &s, r->h_m, r->h_v, loader);
    free(loader);
    dist_barrier(&r->dist);
    if (r->dist.rank == 0) {
        snprintf(path, sizeof(path), "%s/model.bin", tmp);
        fox_write_model_bin(path, &r->model.cfg, r->h_params);
        fox_ckpt_commit(out, r->step);
        fox_ckpt_prune(out, r->args.keep);
        printf("checkpoint %s/ckpt_%08d\n", out, r->step);
    }
    dist_barrier(&r->dist);
}

static void load_checkpoint(Run *r, int step) {
    char dir[4096], path[4352];
    ensure_host_staging(r, 1);
    fox_ckpt_dir(dir, sizeof(dir), r->args.out, step, 0);
    snprintf(path, sizeof(path), "%s/model.bin", dir);
    fox_read_model_bin(path, &r->model.cfg, r->h_params);
    FoxTrainState s = run_state(r);
    void *loader = fox_malloc((size_t)s.loader_bytes);
    state_path(path, sizeof(path), dir, r->dist.rank);
    fox_read_state(path, &s, r->h_m, r->h_v, loader);
    dataloader_load_state(&r->train, loader, (size_t)s.loader_bytes);
    free(loader);
    run_model_set(&r->model, r->h_params, r->h_m, r->h_v);
    r->step = s.step;
    r->tokens = s.tokens;
    r->rng = s.rng;
    if (r->dist.rank == 0) printf("resumed from %s at step %d\n", dir, step);
}

static FOX_PRINTF(2, 3) void log_json(Run *r, const char *fmt, ...) {
    if (!r->log) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(r->log, fmt, ap);
    va_end(ap);
    fputc('\n', r->log);
    if (fflush(r->log)) fox_fatal("cannot write %s/log.jsonl", r->args.out);
}

// Saves the mean training loss per position since the last save as OUT/train_loss_pos_SSSSSSSS.npy
// (this rank's sequences; rank 0 writes) and starts a new window.
static void save_train_pos_loss(Run *r) {
    int T = r->args.seq_len;
    if (r->dist.rank == 0 && r->pos_loss_seqs > 0) {
        char name[64], path[4352];
        snprintf(name, sizeof(name), "train_loss_pos_%08d.npy", r->step);
        snprintf(path, sizeof(path), "%s/%s", r->args.out, name);
        for (int t = 0; t < T; t++) r->pos_loss[t] /= (double)r->pos_loss_seqs;
        fox_write_npy_f64(path, r->pos_loss, (size_t)T);
        log_json(r, "{\"step\": %d, \"train_loss_pos\": \"%s\", \"sequences\": %lld}", r->step, name, r->pos_loss_seqs);
    }
    memset(r->pos_loss, 0, (size_t)T * sizeof(double));
    r->pos_loss_seqs = 0;
}


// Index of the token drawn from logits z: among the k largest, in proportion to exp(z), with the
// uniform u in [0, 1) (k = 1: the argmax).
static int pick_token(const float *z, int V, int k, double u, int *best) {
    int nb = 0;  // indices of the k largest logits, by insertion
    for (int v = 0; v < V; v++) {
        int at = nb < k ? nb++ : k;
        if (at == k && z[v] <= z[best[k - 1]]) continue;
        if (at == k) at = k - 1;
        while (at > 0 && z[best[at - 1]] < z[v]) { best[at] = best[at - 1]; at--; }
        best[at] = v;
    }
    double total = 0.0;
    for (int j = 0; j < nb; j++) total += exp((double)(z[best[j]] - z[best[0]]));
    u *= total;
    for (int j = 0; j < nb; j++) {
        u -= exp((double)(z[best[j]] - z[best[0]]));
        if (u < 0) return best[j];
    }
    return best[0];
}

// Greedy (top_k = 1) or top-k sampling of n tokens after an EOT prompt, recomputing the full
// forward per token (no KV cache).
static void sample_tokens(Run *r, int *out, int n) {
    Model *m = &r->model;
    int T = m->T < n + 1 ? m->T : n + 1, V = m->cfg.vocab_size, k = r->args.top_k < 1 ? 1 : r->args.top_k;
    int *ctx = (int *)fox_calloc((size_t)T, sizeof(int));
    int *best = (int *)fox_calloc((size_t)k, sizeof(int));
    float *z = (float *)fox_malloc((size_t)V * sizeof(float));
    uint64_t key = fox_rng_key((uint64_t)r->args.seed, FOX_STREAM_SAMPLE);
    ctx[0] = FOX_EOT < V ? FOX_EOT : 0;
    int len = 1;
    for (int i = 0; i < n; i++) {
        if (len == T) { memmove(ctx, ctx + 1, (size_t)(T - 1) * sizeof(int)); len--; }
        model_forward(m, ctx, NULL, 1, len);
        run_model_logits_row(m, len - 1, z);
        out[i] = pick_token(z, V, k, fox_rng_uniform(key, r->rng++), best);
        ctx[len++] = out[i];
    }
    free(ctx);
    free(best);
    free(z);
}

static void print_sample(Run *r) {
    int n = r->args.sample_tokens;
    int *ids = (int *)fox_calloc((size_t)n, sizeof(int));
    sample_tokens(r, ids, n);
    Tokenizer tok;
    if (r->model.cfg.vocab_size == FOX_VOCAB_GPT2 && tokenizer_load(&tok, r->args.tokenizer)) {
        size_t len;
        char *text = tokenizer_decode(&tok, ids, (size_t)n, &len);
        printf("sample: %.*s\n", (int)len, text);
        free(text);
        tokenizer_free(&tok);
    } else {
        printf("sample ids:");
        for (int i = 0; i < n; i++) printf(" %d", ids[i]);
        printf("\n");
    }
    free(ids);
}

// Sets up the run from its arguments: model, optimizer, data, resume.
static void run_init(Run *r, int argc, char **argv) {
    memset(r, 0, sizeof(*r));
    dist_init(&r->dist, &argc, &argv);
    fox_args_parse(&r->args, argc, argv);
    FoxArgs *a = &r->args;
    FoxConfig cfg = fox_args_config(a);
    run_model_options(a);
    if (a->seq_len < 1 || a->batch < 1 || a->steps < 1) fox_fatal("--seq-len, --batch and --steps must be positive");
    if (a->keep < 1) fox_fatal("--keep must be at least 1");
    if (a->resume && !a->out[0]) fox_fatal("--resume needs --out");
    long long per_micro = (long long)a->batch * a->seq_len * r->dist.world;
    long long total = a->total_batch_tokens ? a->total_batch_tokens : per_micro;
    if (total % per_micro) fox_fatal("--total-batch-tokens %lld is not a multiple of batch*seq-len*ranks = %lld", total, per_micro);
    r->grad_accum = (int)(total / per_micro);
    r->opt = (OptConfig){a->lr, a->min_lr, a->weight_decay, a->grad_clip, 0.9, 0.95, 1e-8,
                         (int)((a->warmup_tokens + total - 1) / total), a->steps};
    if (r->opt.warmup_steps < 1) r->opt.warmup_steps = 1;
    // Data first: a bad path or a --seq-len beyond the data fails before any large allocation.
    dataloader_init(&r->train, a->train, a->batch, a->seq_len, r->dist.rank, r->dist.world, (uint64_t)a->seed, 1);
    r->has_val = a->val[0] != 0;
    if (r->has_val) dataloader_init(&r->val, a->val, a->batch, a->seq_len, r->dist.rank, r->dist.world, (uint64_t)a->seed, 0);
    run_model_init(&r->model, &cfg, a->batch, a->seq_len, (uint64_t)a->seed, a->recompute, &r->dist);
    if (a->init[0]) load_weights(r, a->init, &cfg);
    r->inputs = (int *)fox_calloc((size_t)a->batch * a->seq_len, sizeof(int));
    r->targets = (int *)fox_calloc((size_t)a->batch * a->seq_len, sizeof(int));
    r->pos_loss = (double *)fox_calloc((size_t)a->seq_len, sizeof(double));
    if (a->resume) {
        int latest = fox_ckpt_latest(a->out);
        if (latest >= 0) load_checkpoint(r, latest);
        else if (r->dist.rank == 0) printf("no checkpoint in %s: starting fresh\n", a->out);
    }
    if (a->out[0] && r->dist.rank == 0) {
        fox_mkdir_p(a->out);
        char path[4352];
        snprintf(path, sizeof(path), "%s/log.jsonl", a->out);
        r->log = fox_fopen(path, r->step ? "a" : "w");
    }
}

// Path of the weights --eval-only reads: --init, else the newest checkpoint's model.bin in --out.
// Returns the training context of that checkpoint (0 when unknown, as for --init).
static int eval_weights_path(const FoxArgs *a, char *path, size_t cap) {
    if (a->init[0]) { snprintf(path, cap, "%s", a->init); return 0; }
    int latest = fox_ckpt_latest(a->out);
    if (latest < 0) fox_fatal("--eval-only needs --init PATH or a checkpoint in --out %s", a->out);
    char dir[4096];
    fox_ckpt_dir(dir, sizeof(dir), a->out, latest, 0);
    if (snprintf(path, cap, "%s/state_00000.bin", dir) >= (int)cap) fox_fatal("path too long: %s", dir);
    int train_T = fox_state_seq_len(path);
    snprintf(path, cap, "%s/model.bin", dir);
    return train_T;
}

// Sets up --eval-only: the model takes the checkpoint's own config; one sequence per forward
// (train_fox's --recompute 2 keeps only the block inputs, for long evaluation contexts).
static void eval_init(Run *r, int argc, char **argv) {
    memset(r, 0, sizeof(*r));
    dist_init(&r->dist, &argc, &argv);
    fox_args_parse(&r->args, argc, argv);
    FoxArgs *a = &r->args;
    run_model_options(a);
    if (!a->out[0]) fox_fatal("--eval-only needs --out (where per_token_loss.npy and .json go)");
    if (!a->val[0]) fox_fatal("--eval-only needs --val");
    if (a->eval_seqs < 1) fox_fatal("--eval-seqs must be positive");
    if (a->recompute < 0 || a->recompute > 2) fox_fatal("--recompute must be 0, 1 or 2");
    int T = a->eval_seq_len ? a->eval_seq_len : a->seq_len;
    if (T < 1) fox_fatal("--eval-seq-len must be positive");
    char path[4352];
    r->train_seq_len = eval_weights_path(a, path, sizeof(path));
    FoxConfig cfg = fox_read_model_config(path);
    dataloader_init(&r->val, a->val, 1, T, r->dist.rank, r->dist.world, (uint64_t)a->seed, 0);
    r->has_val = 1;
    run_model_init(&r->model, &cfg, 1, T, (uint64_t)a->seed, a->recompute, &r->dist);
    load_weights(r, path, &cfg);
    r->inputs = (int *)fox_calloc((size_t)T, sizeof(int));
    r->targets = (int *)fox_calloc((size_t)T, sizeof(int));
    r->pos_loss = (double *)fox_calloc((size_t)T, sizeof(double));
    if (r->dist.rank == 0) printf("evaluating %s (%zu parameters) at context %d\n", path, r->model.lay.total, T);
}

// SPEC §6: L(i) = mean over sequences of the loss at position i (float64 sums, memory independent
// of the number of sequences), P(l) = exp(mean_{i<l} L(i)); written as OUT/per_token_loss.npy and
// OUT/per_token_loss.json (P at l = 512, 1024, 2048, ... and at the full context).
static void eval_per_token(Run *r) {
    FoxArgs *a = &r->args;
    int T = r->model.T;
    long long avail = dataloader_num_windows(&r->val);
    long long mine = (a->eval_seqs - r->dist.rank + r->dist.world - 1) / r->dist.world;
    if (mine > avail) mine = avail;
    double t0 = now_seconds(), count = (double)mine;
    for (long long s = 0; s < mine; s++) {
        next_batch(r, &r->val, a->val, (size_t)T);
        model_forward(&r->model, r->inputs, r->targets, 1, T);
        const float *pos = run_model_losses(&r->model);
        for (int t = 0; t < T; t++) r->pos_loss[t] += pos[t];
    }
    dist_allreduce_sum_f64(&r->dist, r->pos_loss, (size_t)T);
    dist_allreduce_sum_f64(&r->dist, &count, 1);
    if (count < 1) fox_fatal("%s holds no sequence of %d tokens", a->val, T);
    if (r->dist.rank) return;
    double mean = 0.0;
    for (int t = 0; t < T; t++) { r->pos_loss[t] /= count; mean += r->pos_loss[t]; }
    mean /= T;
    char path[4352];
    snprintf(path, sizeof(path), "%s/per_token_loss.npy", a->out);
    fox_mkdir_p(a->out);
    fox_write_npy_f64(path, r->pos_loss, (size_t)T);
    snprintf(path, sizeof(path), "%s/per_token_loss.json.tmp", a->out);
    FILE *f = fox_fopen(path, "w");
    fprintf(f, "{\"eval_seq_len\": %d, ", T);
    if (r->train_seq_len) fprintf(f, "\"train_seq_len\": %d, ", r->train_seq_len);
    fprintf(f, "\"n_seqs\": %.0f, \"mean_loss\": %.10g, \"P\": {", count, mean);
    printf("%.0f sequences of %d tokens in %.1f s: mean loss %.6f\n%10s %12s\n", count, T, now_seconds() - t0, mean, "l", "P(l)");
    double prefix = 0.0;
    int next = 512, first = 1;
    for (int t = 0; t < T; t++) {
        prefix += r->pos_loss[t];
        int l = t + 1;
        if (l != next && l != T) continue;
        double P = exp(prefix / l);
        fprintf(f, "%s\"%d\": %.10g", first ? "" : ", ", l, P);
        printf("%10d %12.4f\n", l, P);
        first = 0;
        if (l == next) next *= 2;
    }
    fprintf(f, "}}\n");
    fox_fclose_synced(f, path);
    char final_path[4352];
    snprintf(final_path, sizeof(final_path), "%s/per_token_loss.json", a->out);
    if (rename(path, final_path)) fox_fatal("cannot rename %s: %s", path, strerror(errno));
    printf("wrote %s/per_token_loss.npy and per_token_loss.json\n", a->out);
}

static void run_free(Run *r) {
    model_free(&r->model);
    if (!r->args.eval_only) dataloader_free(&r->train);
    if (r->has_val) dataloader_free(&r->val);
    free(r->inputs);
    free(r->targets);
    free(r->pos_loss);
    free(r->h_params);
    free(r->h_m);
    free(r->h_v);
    if (r->log && fclose(r->log)) fox_fatal("cannot close the log");
}

// The step loop: one log line per step (tokens/s and MFU by SPEC §6, or achieved GFLOP/s where the
// device's peak is unknown), validation every --eval-every, checkpoints every --ckpt-every.
static void train(Run *r) {
    FoxArgs *a = &r->args;
    Model *m = &r->model;
    long long step_tokens = (long long)r->grad_accum * a->batch * a->seq_len * r->dist.world;
    // tokens/s counts every rank's tokens, so MFU is over the peak of every rank's device
    double flops_per_token = fox_flops_per_token(&m->cfg, a->seq_len), peak = run_model_peak_flops() * r->dist.world;
    if (r->dist.rank == 0)
        printf("model %s: %zu parameters (%.2fM non-embedding), %d layers, d_model %d, %d heads, mlp %d | "
               "%lld tokens/step = %d x %d x %d accum x %d ranks, warmup %d steps\n",
               a->model, m->lay.total, fox_mfu_params(&m->cfg) / 1e6, m->cfg.n_layer, m->cfg.d_model,
               m->cfg.n_head, m->cfg.mlp_hidden, step_tokens, a->batch, a->seq_len, r->grad_accum,
               r->dist.world, r->opt.warmup_steps);
    int first = 1;
    while (r->step < a->steps) {
        double t0 = now_seconds(), norm, lr = lr_at(&r->opt, r->step);
        double loss = train_step(r, lr, &norm);
        run_model_sync(m);
        r->step++;
        r->tokens += step_tokens;
        double dt = now_seconds() - t0, tps = step_tokens / dt, flops = tps * flops_per_token;
        if (r->dist.rank == 0 && (r->step % a->log_every == 0 || r->step == a->steps)) {
            char rate[64];
            if (peak > 0) snprintf(rate, sizeof(rate), "MFU %.1f%%", 100.0 * flops / peak);
            else snprintf(rate, sizeof(rate), "%.2f GFLOP/s", flops / 1e9);
            double acp = run_model_acp_live(m);
            char acp_txt[48] = "", acp_json[48] = "";
            if (acp >= 0.0) {
                snprintf(acp_txt, sizeof(acp_txt), " | ACP %.1f%% of tiles", 100.0 * acp);
                snprintf(acp_json, sizeof(acp_json), "\"acp_live\": %.4f, ", acp);
            }
            printf("step %5d/%d | loss %.6f | lr %.3e | norm %.4f | %.1f ms | %.0f tok/s | %s%s\n", r->step, a->steps,
                   loss, lr, norm, dt * 1e3, tps, rate, acp_txt);
            char mfu[48] = "";
            if (peak > 0) snprintf(mfu, sizeof(mfu), "\"mfu\": %.4f, ", flops / peak);
            log_json(r, "{\"step\": %d, \"loss\": %.17g, \"lr\": %.7g, \"grad_norm\": %.17g, \"ms\": %.3f, "
                        "\"tokens_per_s\": %.1f, %s%s\"tokens\": %lld}",
                     r->step, loss, lr, norm, dt * 1e3, tps, mfu, acp_json, r->tokens);
        }
        if (first && r->dist.rank == 0) run_model_report(m);
        first = 0;
        if (r->has_val && a->eval_every > 0 && (r->step % a->eval_every == 0 || r->step == a->steps)) {
            double vl = evaluate(r);
            if (r->dist.rank == 0) {
                printf("step %5d | val loss %.6f\n", r->step, vl);
                log_json(r, "{\"step\": %d, \"val_loss\": %.17g}", r->step, vl);
            }
        }
        if (a->out[0] && ((a->ckpt_every > 0 && r->step % a->ckpt_every == 0) || r->step == a->steps)) {
            save_train_pos_loss(r);
            save_checkpoint(r);
        }
    }
}

// --eval-only is read before the full parse, which the chosen init repeats.
static int wants_eval_only(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--eval-only") || !strcmp(argv[i], "--eval-only=1") || !strcmp(argv[i], "--eval-only=on")) return 1;
    return 0;
}

// The whole program: train (then sample), or evaluate with --eval-only.
static int run_main(int argc, char **argv) {
    Run r;
    setvbuf(stdout, NULL, _IOLBF, 0);  // progress lines show up promptly under tee and mpirun
    if (wants_eval_only(argc, argv)) {
        eval_init(&r, argc, argv);
        eval_per_token(&r);
    } else {
        run_init(&r, argc, argv);
        train(&r);
        if (r.dist.rank == 0 && r.args.sample_tokens > 0) print_sample(&r);
    }
    run_free(&r);
    dist_finalize();
    return 0;
}

#endif
