// fox/run.h: a training or evaluation run — flags, data, the step loop, logs, checkpoints, resume,
// --eval-only and sampling — shared by train_fox_cpu (train_fox.c) and train_fox (train_fox.cu).
// What the run needs from a trainer is declared in fox/trainer.h; what its parts share is in
// fox/run_base.h, the run directory in fox/rundir.h, generation in fox/generate.h.
#ifndef FOX_RUN_H
#define FOX_RUN_H

#include "run_base.h"  // Run, the stop signals, the exits, the log
#include "rundir.h"    // the run directory: lock, --overwrite, stale files
#include "generate.h"  // --generate and the sample after training
#include "docmask.h"   // fox_doc_start: --eval-doc-pos finds the documents
#include "npy.h"

// Test-only hooks, read from the environment: FOX_TEST_NONFINITE="S[:N]" gives the first N (default 1)
// attempts at step S a NaN gradient; FOX_TEST_DISCARD_BATCH=S throws away one step's batches before
// step S (what a skipped step must be equivalent to); FOX_TEST_CKPT_STALL_MS=N pauses every checkpoint
// write for N ms between its state and weights files, so that a test's kill -9 lands inside writes.
static void run_test_hooks(Run *r) {
    const char *nan = getenv("FOX_TEST_NONFINITE"), *discard = getenv("FOX_TEST_DISCARD_BATCH");
    const char *stall = getenv("FOX_TEST_CKPT_STALL_MS"), *slow = getenv("FOX_TEST_SLOW_RANK");
    r->test_nan_attempts = 1;
    r->test_slow_rank = -1;
    if (slow && (sscanf(slow, "%d:%d:%d", &r->test_slow_rank, &r->test_slow_step, &r->test_slow_ms) != 3 || r->test_slow_ms < 0))
        fox_fatal("FOX_TEST_SLOW_RANK=%s: expected RANK:STEP:MILLISECONDS", slow);
    if (nan && sscanf(nan, "%d:%d", &r->test_nan_step, &r->test_nan_attempts) < 1) fox_fatal("FOX_TEST_NONFINITE=%s: expected S[:N]", nan);
    if (discard && sscanf(discard, "%d", &r->test_discard_step) != 1) fox_fatal("FOX_TEST_DISCARD_BATCH=%s: expected a step", discard);
    if (stall && (sscanf(stall, "%d", &r->test_ckpt_stall_ms) != 1 || r->test_ckpt_stall_ms < 0))
        fox_fatal("FOX_TEST_CKPT_STALL_MS=%s: expected milliseconds", stall);
}

// Checks that every token id is a valid index for the model's vocabulary.
static void check_tokens(const int *ids, size_t n, int vocab, const char *what) {
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab) fox_fatal("%s holds token id %d, outside the vocabulary of %d (set --vocab)", what, ids[i], vocab);
}

// --mqar-loss (Zoology's loss): every target but the answers' (docs/model.md §8.4) becomes -1, which the
// loss and its gradient skip; the sequences are the --eval-mqar set's examples.
static void keep_answer_targets(Run *r, size_t n) {
    const FoxMqar *mq = &r->ev.mqar.mq;
    for (size_t s = 0; s < n / (size_t)mq->seq_len; s++)
        for (int t = 0; t < mq->seq_len; t++)
            if (!fox_mqar_is_answer(mq, r->inputs + s * mq->seq_len, t)) r->targets[s * mq->seq_len + t] = -1;
}

// The next batch of a loader, with its ids checked against the vocabulary.
static void next_batch(Run *r, DataLoader *dl, const char *what, size_t n) {
    dataloader_next(dl, r->inputs, r->targets);
    check_tokens(r->inputs, n, r->cfg.vocab_size, what);
    check_tokens(r->targets, n, r->cfg.vocab_size, what);
    if (r->args.mqar_loss) keep_answer_targets(r, n);
}

static void load_weights(Run *r, const char *path, const FoxConfig *cfg) {
    ensure_host_staging(r, 0);
    fox_read_model_bin(path, cfg, r->h_params);
    run_model_set(r->model, r->h_params, NULL, NULL);
}

// The number of validation batches an evaluation reads: up to --val-steps.
static int val_batches(Run *r) {
    long long avail = dataloader_num_windows(&r->val) / r->args.batch;
    if (avail < 1) fox_fatal("validation data %s holds fewer than --batch %d sequences of --seq-len %d", r->args.val, r->args.batch, r->args.seq_len);
    return (int)(avail < r->args.val_steps ? avail : r->args.val_steps);
}

// Start-up check of the validation batches (size and token ids), so bad data fails before training.
static void check_val_data(Run *r) {
    int n = val_batches(r);
    for (int s = 0; s < n; s++) next_batch(r, &r->val, r->args.val, (size_t)r->args.batch * r->args.seq_len);
    dataloader_reset(&r->val);
}

// Mean validation loss over up to val_steps batches, averaged across ranks.
static double evaluate(Run *r) {
    int B = r->args.batch, T = r->args.seq_len, steps = val_batches(r);
    dataloader_reset(&r->val);
    double sum = 0.0;
    for (int s = 0; s < steps; s++) {
        fox_watchdog_beat("in the validation after step", r->step);
        next_batch(r, &r->val, r->args.val, (size_t)B * T);
        sum += model_forward(r->model, r->inputs, r->targets, B, T);
    }
    double mean = sum / steps;
    dist_allreduce_sum_f64(&r->dist, &mean, 1);
    return mean / r->dist.world;
}

// The signal that stops the run, the same on every rank (all of them call this once the stop is agreed): a
// rank the launcher had not yet reached when the step ended names another rank's.
static int agreed_stop_signal(const Run *r) {
    double sig = run_stop_signal;
    if (r->dist.world > 1) dist_allreduce_max_f64(&r->dist, &sig, 1);
    return (int)sig;
}

// The gradient of one optimizer step: grad_accum micro-batches and the mean over ranks. The ranks'
// losses and stop signals meet in one reduction, so all ranks take the same decisions. Returns the
// loss; the gradient's norm goes to norm_out, the signal that stops the run (0: none) to stop_out.
static double step_gradient(Run *r, double *norm_out, int *stop_out) {
    Model *m = r->model;
    int B = r->args.batch, T = r->args.seq_len, N = B * T;
    int poison = r->step + 1 == r->test_nan_step && r->test_nan_attempts > 0;
    r->test_nan_attempts -= poison;
    if (r->step + 1 == r->test_slow_step && r->dist.rank == r->test_slow_rank) {  // a slow but live rank
        struct timespec pause = {r->test_slow_ms / 1000, (long)(r->test_slow_ms % 1000) * 1000000L};
        nanosleep(&pause, NULL);
    }
    if (r->step + 1 == r->test_discard_step)
        for (int micro = 0; micro < r->grad_accum; micro++) next_batch(r, &r->train, r->args.train, (size_t)N);
    run_model_zero_grad(m);
    memset(r->step_pos_loss, 0, (size_t)T * sizeof(double));
    double loss = 0.0;
    for (int micro = 0; micro < r->grad_accum; micro++) {
        fox_watchdog_beat("in step", r->step + 1);
        next_batch(r, &r->train, r->args.train, (size_t)N);
        run_model_forward_queue(m, r->inputs, r->targets, B, T);
        float scale = poison ? NAN : 1.0f / r->grad_accum;
        run_model_backward(m, r->inputs, r->targets, B, T, scale, micro == r->grad_accum - 1);
        loss += run_model_loss(m) / r->grad_accum;
        const float *pos = run_model_losses(m);
        for (int n = 0; n < N; n++) r->step_pos_loss[n % T] += pos[n];
    }
    double shared[2] = {loss, run_stop_signal ? 1.0 : 0.0};
    if (r->dist.world > 1) {
        run_model_average_grads(m, &r->dist);
        dist_allreduce_sum_f64(&r->dist, shared, 2);
        shared[0] /= r->dist.world;
    }
    *stop_out = shared[1] > 0.0 ? agreed_stop_signal(r) : 0;
    *norm_out = run_model_grad_norm(m);
    return shared[0];
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
    run_model_shard(r->model, &off, &cnt);
    s.shard_offset = (long long)off;
    s.shard_count = (long long)cnt;
    s.params = (long long)r->lay.total;
    s.total_batch = (long long)r->grad_accum * r->args.batch * r->args.seq_len * r->dist.world;
    s.loader_bytes = (long long)dataloader_state_bytes(&r->train);
    s.rng = r->rng;
    s.skipped = r->skipped;
    s.loss_mean = r->loss_mean;
    s.loss_var = r->loss_var;
    s.loss_count = r->loss_count;
    s.schedule = (FoxSchedule){1, r->args.steps, r->args.lr, r->args.min_lr, r->args.weight_decay, r->args.grad_clip,
                               r->args.warmup_tokens};
    return s;
}

static void state_path(char *buf, size_t cap, const char *dir, int rank) {
    if (snprintf(buf, cap, "%s/state_%05d.bin", dir, rank) >= (int)cap) fox_fatal("path too long: %s", dir);
}

// Atomic checkpoint (docs/model.md §5): every rank writes its state into the temporary directory, rank 0
// the weights, then rank 0 renames it into place and prunes old ones. Weights or moments that are
// not finite on any rank are never written: the run stops instead. A failed write removes its
// temporary directory (fox_fatal), so the newest complete checkpoint stays the one to resume.
static void save_checkpoint(Run *r) {
    const char *out = r->args.out;
    char tmp[4096], path[4352];
    ensure_host_staging(r, 1);
    run_model_get(r->model, r->h_params, r->h_m, r->h_v);
    FoxTrainState s = run_state(r);
    double bad = !fox_all_finite(r->h_params, r->lay.total) || !fox_all_finite(r->h_m, (size_t)s.shard_count) ||
                 !fox_all_finite(r->h_v, (size_t)s.shard_count);
    dist_allreduce_sum_f64(&r->dist, &bad, 1);
    if (bad > 0.0) {
        snprintf(path, sizeof(path), "error: the weights or AdamW moments at step %d are not finite: no checkpoint written, "
                 "the run stops (its newest checkpoint is the last good one)", r->step);
        run_exit(r, FOX_EXIT_DIVERGED, path);
    }
    fox_watchdog_beat("writing the checkpoint of step", r->step);
    if (r->dist.rank == 0) fox_ckpt_begin(out, r->step, tmp, sizeof(tmp));
    dist_barrier(&r->dist);
    fox_ckpt_dir(tmp, sizeof(tmp), out, r->step, 1);
    snprintf(fox_fatal_cleanup_dir, sizeof(fox_fatal_cleanup_dir), "%s", tmp);
    void *loader = fox_malloc((size_t)s.loader_bytes);
    dataloader_save_state(&r->train, loader);
    state_path(path, sizeof(path), tmp, r->dist.rank);
    fox_write_state(path, &s, r->h_m, r->h_v, loader);
    free(loader);
    if (r->test_ckpt_stall_ms > 0) {
        struct timespec pause = {r->test_ckpt_stall_ms / 1000, (long)(r->test_ckpt_stall_ms % 1000) * 1000000L};
        nanosleep(&pause, NULL);
    }
    fox_watchdog_beat("writing the checkpoint of step", r->step);
    dist_barrier(&r->dist);
    fox_watchdog_beat("writing the checkpoint of step", r->step);
    if (r->dist.rank == 0) {
        snprintf(path, sizeof(path), "%s/model.bin", tmp);
        fox_write_model_bin(path, &r->cfg, r->h_params);
        fox_ckpt_commit(out, r->step);
        fox_fatal_cleanup_dir[0] = 0;
        fox_ckpt_prune(out, r->args.keep);
        printf("checkpoint %s/ckpt_%08d\n", out, r->step);
    }
    fox_fatal_cleanup_dir[0] = 0;
    dist_barrier(&r->dist);
    fox_watchdog_checkpoint(r->step);
    fox_watchdog_beat("after the checkpoint of step", r->step);
}

// On resume: one line naming the schedule's flags given with other values than the checkpoint's. They
// are taken (as torchtitan and llm.c let a schedule be extended): the learning rate of every later
// step follows the new values.
static void report_schedule_changes(const Run *r, const FoxSchedule *was) {
    if (!was->has) return;
    const FoxArgs *a = &r->args;
    char line[1024] = "";
    size_t n = 0;

#define FOX_CHANGED(flag, fmt, now, then) \
    if ((now) != (then) && n < sizeof(line)) n += (size_t)snprintf(line + n, sizeof(line) - n, "%s" flag " " fmt " (was " fmt ")", n ? ", " : "", now, then);
    FOX_CHANGED("--steps", "%d", a->steps, was->steps)
    FOX_CHANGED("--lr", "%.9g", a->lr, was->lr)
    FOX_CHANGED("--min-lr", "%.9g", a->min_lr, was->min_lr)
    FOX_CHANGED("--warmup-tokens", "%lld", a->warmup_tokens, was->warmup_tokens)
    FOX_CHANGED("--weight-decay", "%.9g", a->weight_decay, was->weight_decay)
    FOX_CHANGED("--grad-clip", "%.9g", a->grad_clip, was->grad_clip)
#undef FOX_CHANGED
    if (n) printf("resuming with changed flags: %s; steps %d on follow the new values\n", line, r->step + 1);
}

static void load_checkpoint(Run *r, int step) {
    char dir[4096], path[4352];
    ensure_host_staging(r, 1);
    set_fallback_hint(r->args.out, step);
    fox_ckpt_dir(dir, sizeof(dir), r->args.out, step, 0);
    snprintf(path, sizeof(path), "%s/model.bin", dir);
    fox_read_model_bin(path, &r->cfg, r->h_params);
    r->step = step;
    FoxTrainState s = run_state(r);
    void *loader = fox_malloc((size_t)s.loader_bytes);
    state_path(path, sizeof(path), dir, r->dist.rank);
    fox_read_state(path, &s, r->h_m, r->h_v, loader);
    dataloader_load_state(&r->train, loader, (size_t)s.loader_bytes);
    free(loader);
    fox_fatal_hint[0] = 0;
    run_model_set(r->model, r->h_params, r->h_m, r->h_v);
    r->tokens = s.tokens;
    r->rng = s.rng;
    r->skipped = s.skipped;
    r->loss_mean = s.loss_mean;
    r->loss_var = s.loss_var;
    r->loss_count = s.loss_count;
    if (r->dist.rank == 0) {
        printf("resumed from %s at step %d\n", dir, step);
        report_schedule_changes(r, &s.schedule);
    }
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

// Under a launcher (docs/model.md §2, Stopping): which signal stops every rank with a checkpoint. Open
// MPI's mpirun forwards SIGUSR1 and SIGUSR2 as they are, but answers SIGTERM and SIGINT with its kill
// sequence (run_on_stop_signal), SIGKILL twice odls_base_sigkill_timeout seconds (1 by default) after
// it begins; Slurm follows scancel's SIGTERM with SIGKILL after its KillWait.
static void say_stop_signal(const Run *r) {
    if (r->dist.rank || !dist_launched()) return;
    const char *t = getenv("OMPI_MCA_odls_base_sigkill_timeout");
    if (getenv("OMPI_COMM_WORLD_SIZE"))
        printf("to stop with a checkpoint: kill -USR1 <mpirun's pid> (no time limit), or SIGTERM or Ctrl-C to mpirun, which "
               "kills the ranks %d s later (twice odls_base_sigkill_timeout; --mca odls_base_sigkill_timeout 300 gives a "
               "step and a checkpoint 10 minutes)\n", 2 * (t ? atoi(t) : 1));
    else if (getenv("SLURM_JOB_ID"))
        printf("to stop with a checkpoint: scancel --signal=USR1 --full JOBID (and #SBATCH --signal=USR1@120 before the "
               "time limit); a plain scancel's SIGTERM is followed by SIGKILL after Slurm's KillWait (scontrol show config)\n");
    else
        printf("to stop with a checkpoint: SIGUSR1 to the launcher, which must forward it to every rank\n");
}

// One line (rank 0) mapping the ranks to their nodes, when there are several: where each node's local ranks,
// and so its GPUs, come from (docs/usage.md "Many nodes").
static void say_ranks(const Dist *d) {
    if (d->world < 2) return;
    typedef struct { int node, local_rank; char host[56]; } Place;
    Place mine, *all = (Place *)fox_calloc((size_t)d->world, sizeof(Place));
    memset(&mine, 0, sizeof(mine));
    mine.node = d->node;
    mine.local_rank = d->local_rank;
    if (gethostname(mine.host, sizeof(mine.host) - 1)) snprintf(mine.host, sizeof(mine.host), "?");
    dist_allgather(d, &mine, sizeof(mine), all);
    if (d->rank == 0) {
        char line[2048];  // the ranks up to the last 400 bytes, which hold " ..." and four nodes' names (< 80 each)
        int n = snprintf(line, sizeof(line), "%d ranks on %d node%s (rank: node/local rank):", d->world, d->nodes, d->nodes > 1 ? "s" : "");
        for (int i = 0; i < d->world && n < (int)sizeof(line) - 400; i++)
            n += snprintf(line + n, sizeof(line) - (size_t)n, " %d:%d/%d", i, all[i].node, all[i].local_rank);
        if (n >= (int)sizeof(line) - 400) n += snprintf(line + n, sizeof(line) - (size_t)n, " ...");
        for (int k = 0, shown = 0; k < d->world && shown < 4; k++)
            if (all[k].local_rank == 0)
                n += snprintf(line + n, sizeof(line) - (size_t)n, "%s node %d = %s", shown++ ? "," : ";", all[k].node, all[k].host);
        printf("%s%s\n", line, d->nodes > 4 ? ", ..." : "");
    }
    free(all);
}

// Sets up the run from its arguments: model, optimizer, data, resume.
static void run_init(Run *r) {
    FoxArgs *a = &r->args;
    FoxConfig cfg = fox_args_config(a);
    check_model_flags(a, &cfg, a->seq_len, "--seq-len");
    run_test_hooks(r);
    if (a->resume && !a->out[0]) fox_usage_error("--resume needs --out");
    if (a->overwrite && a->resume) fox_usage_error("--overwrite starts over, --resume continues: give one of them");
    long long per_micro = (long long)a->batch * a->seq_len * r->dist.world;
    long long total = a->total_batch_tokens ? a->total_batch_tokens : per_micro;
    if (total % per_micro) fox_usage_error("--total-batch-tokens %lld is not a multiple of batch*seq-len*ranks = %lld", total, per_micro);
    r->grad_accum = (int)(total / per_micro);
    r->opt = (OptConfig){a->lr, a->min_lr, a->weight_decay, a->grad_clip, 0.9, 0.95, 1e-8,
                         (int)((a->warmup_tokens + total - 1) / total), a->steps};
    if (r->opt.warmup_steps < 1) r->opt.warmup_steps = 1;
    if (r->dist.rank == 0 && a->warmup_tokens > total * a->steps)
        fprintf(stderr, "warning: --warmup-tokens %lld exceeds the run's %lld tokens (--steps %d x %lld): the learning rate "
                "never reaches --lr %g\n", a->warmup_tokens, total * a->steps, a->steps, total, a->lr);
    check_sample_inputs(a, &cfg);
    if (a->out[0]) claim_out_dir(r);
    int latest = a->resume ? fox_ckpt_latest(a->out) : -1;
    if (latest > a->steps)
        fox_usage_error("--steps %d: the run in %s is at step %d already (ckpt_%08d), nothing to train; --steps %d or more "
                        "continues it", a->steps, a->out, latest, latest, latest);
    say_stop_signal(r);
    say_ranks(&r->dist);
    fox_watchdog_checkpoint(latest);
    // Data first: a bad path or a --seq-len beyond the data fails before any large allocation.
    dataloader_init(&r->train, a->train, a->batch, a->seq_len, r->dist.rank, r->dist.world, (uint64_t)a->seed, 1);
    r->has_val = a->val[0] != 0;
    if (r->has_val) dataloader_init(&r->val, a->val, a->batch, a->seq_len, r->dist.rank, r->dist.world, (uint64_t)a->seed, 0);
    r->inputs = (int *)fox_calloc((size_t)a->batch * a->seq_len, sizeof(int));
    r->targets = (int *)fox_calloc((size_t)a->batch * a->seq_len, sizeof(int));
    r->pos_loss = (double *)fox_calloc((size_t)a->seq_len, sizeof(double));
    r->step_pos_loss = (double *)fox_calloc((size_t)a->seq_len, sizeof(double));
    r->cfg = cfg;  // the token checks read the vocabulary
    fox_layout(&cfg, &r->lay);
    r->seq_len = a->seq_len;
    // The tasks' prompts and items are checked, and their models made, before the training model, so the
    // device memory of both is known before the first step.
    evals_init(&r->ev, a, &r->cfg, &r->dist, a->seq_len, a->seq_len, &run_stop_signal);
    if (a->mqar_loss && !r->ev.mqar.on) fox_usage_error("--mqar-loss needs --eval-mqar DIR, the set whose answers it trains on");
    if (a->mqar_loss && r->ev.mqar.mq.seq_len != a->seq_len)
        fox_usage_error("--mqar-loss: --seq-len %d is not the %d tokens of an example of %s", a->seq_len, r->ev.mqar.mq.seq_len,
                        a->eval_mqar);
    if (r->has_val && a->eval_every > 0) check_val_data(r);
    for (int i = 0; i < 4; i++) evals_open_task(&r->ev, i, model_options(a, 1, 1, 1));
    ModelOptions mo = model_options(a, a->batch, a->seq_len, 0);
    fox_watchdog_beat("starting (the model), before step", 1);
    r->model = run_model_init(&cfg, &mo, &r->dist);
    fox_watchdog_beat("starting (the weights), before step", latest > 0 ? latest + 1 : 1);
    if (a->init[0] && latest < 0) load_weights(r, a->init, &cfg);
    if (latest >= 0) {
        load_checkpoint(r, latest);
        if (r->dist.rank == 0 && a->init[0])
            printf("--init %s is not read: the run resumes from its checkpoint (--init starts a run whose --out holds none)\n",
                   a->init);
        if (r->dist.rank == 0 && r->step == a->steps)
            printf("the run is complete (step %d of --steps %d): nothing to train; a larger --steps continues it\n", r->step, a->steps);
    } else if (a->resume && r->dist.rank == 0) {
        printf("no checkpoint in %s: starting fresh\n", a->out);
    }
    if (a->out[0] && r->dist.rank == 0) open_out_dir(r);
    fox_watchdog_beat("starting, before step", r->step + 1);
}

// Sets up --eval-only: the model takes the checkpoint's own config, one sequence per forward, and
// only what a forward needs (the least device memory, for long evaluation contexts).
static void eval_init(Run *r) {
    FoxArgs *a = &r->args;
    if (!a->out[0]) fox_usage_error("--eval-only needs --out (where per_token_loss.npy and .json go)");
    if (!a->val[0]) fox_usage_error("--eval-only needs --val");
    int T = a->eval_seq_len ? a->eval_seq_len : a->seq_len;
    char path[4352];
    r->train_seq_len = eval_weights_path(a, "--eval-only", path, sizeof(path), 1);
    FoxConfig cfg;
    r->h_params = fox_load_model_bin(path, &cfg);
    check_model_flags(a, &cfg, T, a->eval_seq_len ? "--eval-seq-len" : "--seq-len");
    dataloader_init(&r->val, a->val, 1, T, r->dist.rank, r->dist.world, (uint64_t)a->seed, 0);
    r->has_val = 1;
    r->cfg = cfg;
    fox_layout(&cfg, &r->lay);
    r->seq_len = T;
    ModelOptions mo = model_options(a, 1, T, 1);
    r->model = run_model_init(&cfg, &mo, &r->dist);
    run_model_set(r->model, r->h_params, NULL, NULL);
    fox_fatal_hint[0] = 0;
    r->inputs = (int *)fox_calloc((size_t)T, sizeof(int));
    r->targets = (int *)fox_calloc((size_t)T, sizeof(int));
    r->pos_loss = (double *)fox_calloc((size_t)T, sizeof(double));
    if (a->eval_doc_pos) {
        r->doc_pos_loss = (double *)fox_calloc((size_t)T, sizeof(double));
        r->doc_pos_count = (double *)fox_calloc((size_t)T, sizeof(double));
    }
    if (r->dist.rank == 0)
        printf("evaluating %s (%zu parameters) at context %d%s\n", path, r->lay.total, T,
               a->doc_mask ? ", document mask" : "");
}

// --eval-doc-pos (docs/model.md §6): adds one window's losses by position within the document, the
// distance of each input token from its document's separator; tokens before the window's first separator
// are not counted (their document began before the window).
static void add_doc_pos_loss(Run *r, const float *pos, int T) {
    int start = -1;
    for (int t = 0; t < T; t++) {
        if (fox_doc_start(r->inputs[t], r->args.doc_sep)) start = t;
        if (start < 0) continue;
        r->doc_pos_loss[t - start] += pos[t];
        r->doc_pos_count[t - start] += 1.0;
    }
}

// Writes OUT/doc_pos_loss.npy (mean loss at each position within the document, NaN where no token was
// counted) and OUT/doc_pos_count.npy (the tokens counted there).
static void save_doc_pos_loss(Run *r, int T) {
    const FoxArgs *a = &r->args;
    double tokens = 0.0, docs = r->doc_pos_count[0];
    for (int t = 0; t < T; t++) {
        tokens += r->doc_pos_count[t];
        r->doc_pos_loss[t] = r->doc_pos_count[t] > 0 ? r->doc_pos_loss[t] / r->doc_pos_count[t] : NAN;
    }
    char path[4352];
    snprintf(path, sizeof(path), "%s/doc_pos_loss.npy", a->out);
    fox_write_npy_f64(path, r->doc_pos_loss, (size_t)T);
    snprintf(path, sizeof(path), "%s/doc_pos_count.npy", a->out);
    fox_write_npy_f64(path, r->doc_pos_count, (size_t)T);
    printf("wrote %s/doc_pos_loss.npy and doc_pos_count.npy: %.0f tokens of %.0f documents that start in their window "
           "(separator %d)\n", a->out, tokens, docs, a->doc_sep);
}

// docs/model.md §6: L(i) = mean over sequences of the loss at position i (float64 sums, memory independent
// of the number of sequences), P(l) = exp(mean_{i<l} L(i)); written as OUT/per_token_loss.npy and
// OUT/per_token_loss.json (P at l = 512, 1024, 2048, ... and at the full context).
static void eval_per_token(Run *r) {
    FoxArgs *a = &r->args;
    int T = r->seq_len;
    long long avail = dataloader_num_windows(&r->val);
    long long mine = (a->eval_seqs - r->dist.rank + r->dist.world - 1) / r->dist.world;
    if (mine > avail) mine = avail;
    double t0 = now_seconds(), count = (double)mine, rounds = (double)mine;
    dist_allreduce_max_f64(&r->dist, &rounds, 1);
    run_stop_note = "\nstopping after this sequence, writing nothing (SIGINT again to quit at once)\n";
    for (long long s = 0; s < (long long)rounds; s++) {
        fox_watchdog_beat("in --eval-only, sequence", (int)s + 1);
        if (s < mine) {
            next_batch(r, &r->val, a->val, (size_t)T);
            model_forward(r->model, r->inputs, r->targets, 1, T);
            const float *pos = run_model_losses(r->model);
            for (int t = 0; t < T; t++) r->pos_loss[t] += pos[t];
            if (a->eval_doc_pos) add_doc_pos_loss(r, pos, T);
        }
        double sig = run_stop_signal;  // every rank stops at the same sequence
        dist_allreduce_max_f64(&r->dist, &sig, 1);
        if (sig > 0) {
            char where[128];
            snprintf(where, sizeof(where), "after %lld of %.0f sequences per rank: nothing written", s + 1, rounds);
            run_exit_signalled(r, (int)sig, where);
        }
    }
    dist_allreduce_sum_f64(&r->dist, r->pos_loss, (size_t)T);
    if (a->eval_doc_pos) {
        dist_allreduce_sum_f64(&r->dist, r->doc_pos_loss, (size_t)T);
        dist_allreduce_sum_f64(&r->dist, r->doc_pos_count, (size_t)T);
    }
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
    char tmp[4400];
    FILE *f = fox_open_tmp(a->out, "per_token_loss.json", tmp, sizeof(tmp));
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
    fox_commit_tmp(f, tmp);
    printf("wrote %s/per_token_loss.npy and per_token_loss.json\n", a->out);
    if (a->eval_doc_pos) save_doc_pos_loss(r, T);
}

// ---- The evaluation tasks (fox/eval.h) ----

// Logs one evaluation's scores (rank 0), a line per task, as log.jsonl's {"step", "<task>_..."} lines.
static void log_eval_scores(Run *r, const EvalScores *s) {
    char a[32], b[32];
    if (!isnan(s->niah)) log_json(r, "{\"step\": %d, \"niah_score\": %s}", r->step, json_number(a, sizeof(a), s->niah));
    if (!isnan(s->passkey)) log_json(r, "{\"step\": %d, \"passkey_acc\": %s}", r->step, json_number(a, sizeof(a), s->passkey));
    if (!isnan(s->mc_acc))
        log_json(r, "{\"step\": %d, \"mc_acc\": %s, \"mc_acc_norm\": %s}", r->step, json_number(a, sizeof(a), s->mc_acc),
                 json_number(b, sizeof(b), s->mc_acc_norm));
    if (!isnan(s->mqar)) log_json(r, "{\"step\": %d, \"mqar_acc\": %s}", r->step, json_number(a, sizeof(a), s->mqar));
}

// The tasks on the training model's current weights (every rank), their files in --out (none without it).
// Returns the stop signal that interrupted them (0: none); the training itself is untouched.
static int run_evals(Run *r) {
    if (!evals_any(&r->args)) return 0;
    ensure_host_staging(r, 0);
    run_model_get(r->model, r->h_params, NULL, NULL);
    EvalScores s;
    fox_watchdog_beat("in the evaluation tasks after step", r->step);
    run_stop_note = "\nstopping the evaluation at its next batch, then with a checkpoint (SIGINT again to quit at once)\n";
    int sig = evals_run(&r->ev, r->h_params, r->step, r->args.out[0] ? r->args.out : NULL, model_options(&r->args, 1, 1, 1), &s);
    run_stop_note = "\nstopping after this step, with a checkpoint (SIGINT again to quit at once)\n";
    if (!sig && r->dist.rank == 0) log_eval_scores(r, &s);
    return sig;
}

// --eval-only with tasks: the weights of --init or of the newest checkpoint in --out, with their own config,
// at the checkpoint's training context (--eval-seq-len overrides it; --seq-len when unknown).
static void eval_tasks(Run *r) {
    FoxArgs *a = &r->args;
    char path[4352];
    if (!a->out[0]) fox_usage_error("--eval-only needs --out (where the tasks' result files go)");
    r->train_seq_len = eval_weights_path(a, "--eval-only", path, sizeof(path), 1);
    r->h_params = fox_load_model_bin(path, &r->cfg);
    int context = a->eval_seq_len ? a->eval_seq_len : r->train_seq_len ? r->train_seq_len : a->seq_len;
    check_model_flags(a, &r->cfg, 0, NULL);
    fox_layout(&r->cfg, &r->lay);
    fox_fatal_hint[0] = 0;  // the older checkpoint is no answer to a bad task flag or item
    evals_init(&r->ev, a, &r->cfg, &r->dist, context, r->train_seq_len, &run_stop_signal);
    if (r->dist.rank == 0) printf("evaluating %s (%zu parameters) at context %d\n", path, r->lay.total, context);
    EvalScores s;
    fox_watchdog_beat("in the evaluation tasks of --eval-only, at step", 0);
    run_stop_note = "\nstopping at the next batch, writing nothing more (SIGINT again to quit at once)\n";
    int sig = evals_run(&r->ev, r->h_params, -1, a->out, model_options(a, 1, 1, 1), &s);
    if (sig) run_exit_signalled(r, sig, "during the evaluation: the tasks already done wrote their files");
}

// " | ETA ..." for the step line: the time the remaining steps take at this run's pace so far, when the
// whole run takes longer than a minute; else "".
static void format_eta(char *buf, size_t cap, double elapsed, int done, int left) {
    double eta = done > 0 ? elapsed / done * left : 0.0;
    long s = (long)(eta + 0.5);
    buf[0] = 0;
    if (done < 1 || left < 1 || elapsed + eta < 60.0) return;
    if (s >= 3600) snprintf(buf, cap, " | ETA %ldh%02ldm", s / 3600, s / 60 % 60);
    else if (s >= 60) snprintf(buf, cap, " | ETA %ldm%02lds", s / 60, s % 60);
    else snprintf(buf, cap, " | ETA %lds", s);
}

// ACP's per-(layer, head) detail, the log.jsonl matrix "acp_pruned", goes on every logged step while
// L·H <= FOX_ACP_LOG_HEADS (125M's 12 × 12 included), else on the --eval-every steps and the last one (a
// 760M's 24 × 24 matrix is ~4 KB a line); the step line's per-layer summary goes on those steps alone.
#define FOX_ACP_LOG_HEADS 256

static int acp_eval_step(const Run *r) {
    return r->step == r->args.steps || (r->args.eval_every > 0 && r->step % r->args.eval_every == 0);
}

// ACP in the last forward: the fraction of the attention tiles computed (< 0 without ACP), and in
// pruned[l·H + h] the fraction of (layer l, head h)'s tiles skipped.
static double acp_fractions(Run *r, double *pruned) {
    size_t LH = (size_t)r->cfg.n_layer * r->cfg.n_head;
    long long *live = (long long *)fox_malloc(LH * sizeof(long long)), tiles = 0, sum = 0;
    int on = run_model_acp_tiles(r->model, live, &tiles);
    for (size_t i = 0; on && i < LH; i++) {
        pruned[i] = 1.0 - (double)live[i] / (double)tiles;
        sum += live[i];
    }
    free(live);
    return on ? (double)sum / ((double)tiles * (double)LH) : -1.0;
}

// "\"acp_pruned\": [[l0h0, l0h1, ...], [l1h0, ...], ...], " (layer-major rows of heads), in a new string.
static char *acp_pruned_json(const double *pruned, int L, int H) {
    size_t cap = (size_t)L * (H * 10 + 4) + 32, n = 0;
    char *j = (char *)fox_malloc(cap);
    n += (size_t)snprintf(j + n, cap - n, "\"acp_pruned\": [");
    for (int l = 0; l < L; l++)
        for (int h = 0; h < H; h++)
            n += (size_t)snprintf(j + n, cap - n, "%s%.4f%s", h ? "" : (l ? ", [" : "["), pruned[(size_t)l * H + h],
                                  h == H - 1 ? "]" : ", ");
    snprintf(j + n, cap - n, "], ");
    return j;
}

// One line: each layer's pruned fraction (the mean over its heads, in %), and the least and most pruned heads.
static void print_acp_layers(const Run *r, const double *pruned) {
    int L = r->cfg.n_layer, H = r->cfg.n_head, lo = 0, hi = 0;
    printf("step %5d | ACP pruned by layer (%%):", r->step);
    for (int l = 0; l < L; l++) {
        double mean = 0.0;
        for (int h = 0; h < H; h++) mean += pruned[(size_t)l * H + h] / H;
        printf(" %.0f", 100.0 * mean);
    }
    for (int i = 0; i < L * H; i++) {
        if (pruned[i] < pruned[lo]) lo = i;
        if (pruned[i] > pruned[hi]) hi = i;
    }
    printf(" | heads: least %.1f%% (layer %d head %d), most %.1f%% (layer %d head %d)\n", 100.0 * pruned[lo], lo / H,
           lo % H, 100.0 * pruned[hi], hi / H, hi % H);
}

// The step's line on stdout and in log.jsonl: tokens/s and MFU by docs/model.md §6 (or achieved GFLOP/s where
// the device's peak is unknown), and ACP's fraction of computed tiles (and its detail, above).
static void log_step(Run *r, double loss, double lr, double norm, double dt, double peak, const char *eta) {
    FoxArgs *a = &r->args;
    long long step_tokens = (long long)r->grad_accum * a->batch * a->seq_len * r->dist.world;
    double tps = step_tokens / dt, flops = tps * fox_flops_per_token(&r->cfg, a->seq_len);
    char rate[64], acp_txt[48] = "", acp_json[48] = "", mfu[48] = "", *pruned_json = NULL;
    if (peak > 0) snprintf(rate, sizeof(rate), "MFU %.1f%%", 100.0 * flops / peak);
    else snprintf(rate, sizeof(rate), "%.2f GFLOP/s", flops / 1e9);
    int L = r->cfg.n_layer, H = r->cfg.n_head;
    double *pruned = (double *)fox_malloc((size_t)L * H * sizeof(double)), acp = acp_fractions(r, pruned);
    if (acp >= 0.0) {
        snprintf(acp_txt, sizeof(acp_txt), " | ACP %.1f%% of tiles", 100.0 * acp);
        snprintf(acp_json, sizeof(acp_json), "\"acp_live\": %.4f, ", acp);
        if (L * H <= FOX_ACP_LOG_HEADS || acp_eval_step(r)) pruned_json = acp_pruned_json(pruned, L, H);
    }
    printf("step %5d/%d | loss %.6f | lr %.3e | norm %.4f | %.1f ms | %.0f tok/s | %s%s%s\n", r->step, a->steps, loss, lr,
           norm, dt * 1e3, tps, rate, acp_txt, eta);
    if (acp >= 0.0 && acp_eval_step(r)) print_acp_layers(r, pruned);
    if (peak > 0) snprintf(mfu, sizeof(mfu), "\"mfu\": %.4f, ", flops / peak);
    log_json(r, "{\"step\": %d, \"loss\": %.17g, \"lr\": %.7g, \"grad_norm\": %.17g, \"ms\": %.3f, "
                "\"tokens_per_s\": %.1f, %s%s%s\"tokens\": %lld, \"skipped_steps\": %lld}",
             r->step, loss, lr, norm, dt * 1e3, tps, mfu, acp_json, pruned_json ? pruned_json : "", r->tokens, r->skipped);
    free(pruned_json);
    free(pruned);
}

// Why a step is not applied: a non-finite loss or gradient norm, or (--spike-z Z, once
// FOX_SPIKE_WARMUP steps are in the statistics) a loss more than Z standard deviations above the
// recent mean; NULL to apply it.
#define FOX_SPIKE_WARMUP 20

static const char *step_rejection(const Run *r, double loss, double norm) {
    if (!isfinite(loss)) return "non-finite loss";
    if (!isfinite(norm)) return "non-finite grad norm";
    double z = r->args.spike_z;
    if (z > 0.0 && r->loss_count >= FOX_SPIKE_WARMUP && loss > r->loss_mean + z * sqrt(r->loss_var)) return "loss spike";
    return NULL;
}

// The recent mean and variance of the loss: the newest step weighs 1/n over the first 32 (the plain
// mean and variance), then 1/32 (exponential forgetting), so they follow the falling loss.
static void update_loss_stats(Run *r, double loss) {
    r->loss_count++;
    double a = r->loss_count < 32 ? 1.0 / (double)r->loss_count : 1.0 / 32, d = loss - r->loss_mean;
    r->loss_mean += a * d;
    r->loss_var = (1.0 - a) * (r->loss_var + a * d * d);
}

// A step that is not applied changes nothing but the data position: it is logged and counted, and
// after --max-bad-steps in a row the run stops (FOX_EXIT_DIVERGED).
static void skip_step(Run *r, double loss, double norm, const char *why) {
    char l[32], g[32], msg[512];
    r->skipped++;
    r->bad_in_a_row++;
    if (r->dist.rank == 0) {
        printf("skipped step %d: %s (loss %g, norm %g); %d in a row, %lld in all\n", r->step + 1, why, loss, norm,
               r->bad_in_a_row, r->skipped);
        log_json(r, "{\"step\": %d, \"skipped\": \"%s\", \"loss\": %s, \"grad_norm\": %s, \"skipped_steps\": %lld}", r->step + 1,
                 why, json_number(l, sizeof(l), loss), json_number(g, sizeof(g), norm), r->skipped);
    }
    if (r->bad_in_a_row < r->args.max_bad_steps) return;
    int newest = r->args.out[0] ? fox_ckpt_latest(r->args.out) : -1;
    char kept[64] = "no checkpoint was written";
    if (newest >= 0) snprintf(kept, sizeof(kept), "its newest checkpoint is ckpt_%08d", newest);
    snprintf(msg, sizeof(msg), "error: %d steps in a row had a %s (--max-bad-steps %d): the run stops at step %d; %s",
             r->bad_in_a_row, why, r->args.max_bad_steps, r->step, kept);
    run_exit(r, FOX_EXIT_DIVERGED, msg);
}

// --collective-timeout against the first step's time (the slowest rank's): a timeout that a slow step could
// outlast would take a live run for a dead rank.
static void check_collective_timeout(const Run *r, double first_step) {
    double t = first_step, limit = r->args.collective_timeout;
    if (r->dist.world < 2 || limit <= 0) return;
    dist_allreduce_max_f64(&r->dist, &t, 1);
    if (limit < 2 * t)
        fox_usage_error("--collective-timeout %g is shorter than twice the first step (%.1f s): a slow step would be taken "
                        "for a dead rank; give %.0f or more (0: no limit)", limit, t, ceil(2 * t));
}

// The step loop: one log line per step, validation every --eval-every, checkpoints every
// --ckpt-every; a stop signal ends it after the current step with a checkpoint (FOX_EXIT_STOPPED).
static void train(Run *r) {
    FoxArgs *a = &r->args;
    Model *m = r->model;
    long long step_tokens = (long long)r->grad_accum * a->batch * a->seq_len * r->dist.world;
    double peak = run_model_peak_flops() * r->dist.world;  // tokens/s counts every rank's tokens
    if (r->dist.rank == 0)
        printf("model %s: %zu parameters (%.2fM non-embedding), %d layers, d_model %d, %d heads, mlp %d | "
               "%lld tokens/step = %d x %d x %d accum x %d ranks, warmup %d steps%s\n",
               a->model, r->lay.total, fox_mfu_params(&r->cfg) / 1e6, r->cfg.n_layer, r->cfg.d_model,
               r->cfg.n_head, r->cfg.mlp_hidden, step_tokens, a->batch, a->seq_len, r->grad_accum,
               r->dist.world, r->opt.warmup_steps, a->doc_mask ? ", document mask" : "");
    if (r->dist.rank == 0 && r->cfg.arch == FOX_ARCH_GSA) {  // the GSA paper's accounting (§3.3), per layer
        size_t d = (size_t)r->cfg.d_model, gm = (size_t)r->cfg.gsa_heads * r->cfg.gsa_slots;
        printf("GSA mixer: %zu parameters per layer = 4d^2 + d*G*m = 4*%zu^2 + %zu*%d*%d, and %zu output-norm weights\n",
               4 * d * d + d * gm, d, d, r->cfg.gsa_heads, r->cfg.gsa_slots, d);
    }
    if (r->dist.rank == 0 && r->cfg.arch == FOX_ARCH_FAM && r->cfg.fam_memory == 0)
        printf("BSWA: blocks of %d tokens, %d previous blocks in the window, no memory (--fam-memory 0): no weights beyond "
               "the Transformer's\n", r->cfg.fam_block, r->cfg.fam_window_blocks);
    else if (r->dist.rank == 0 && r->cfg.arch == FOX_ARCH_FAM)  // TransformerFAM adds no weights but its initial memory
        printf("FAM: blocks of %d tokens, %d previous blocks in the window, %d memory tokens per layer; the initial "
               "memory (fam_init, %d x %d) is its only weights beyond the Transformer's: %zu parameters\n",
               r->cfg.fam_block, r->cfg.fam_window_blocks, r->cfg.fam_memory, r->cfg.fam_memory, r->cfg.d_model,
               r->lay.p[FOX_P_fam_init].numel);
    int first = 1, step_start = r->step;
    if (r->step == 0 && a->eval_every > 0) {  // the untrained model's scores, where a skill's curve starts
        int sig = run_evals(r);
        if (sig) run_exit_signalled(r, sig, "during the evaluation at step 0: nothing trained");
    }
    double t_start = now_seconds();
    while (r->step < a->steps) {
        double t0 = now_seconds(), norm, lr = lr_at(&r->opt, r->step);
        int stop, saved = 0;
        double loss = step_gradient(r, &norm, &stop);
        const char *rejected = step_rejection(r, loss, norm);
        if (!rejected) {
            run_model_update(m, &r->opt, lr, r->step + 1, norm);
            run_model_sync(m);
            if (first) check_collective_timeout(r, now_seconds() - t0);
            r->step++;
            r->tokens += step_tokens;
            r->bad_in_a_row = 0;
            update_loss_stats(r, loss);
            for (int t = 0; t < a->seq_len; t++) r->pos_loss[t] += r->step_pos_loss[t];
            r->pos_loss_seqs += (long long)r->grad_accum * a->batch;
            if (r->dist.rank == 0 && (r->step % a->log_every == 0 || r->step == a->steps)) {
                char eta[48];
                format_eta(eta, sizeof(eta), now_seconds() - t_start, r->step - step_start, a->steps - r->step);
                log_step(r, loss, lr, norm, now_seconds() - t0, peak, eta);
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
            if (a->eval_every > 0 && (r->step % a->eval_every == 0 || r->step == a->steps)) {
                int sig = run_evals(r);
                if (sig) stop = sig;
            }
            saved = a->out[0] && ((a->ckpt_every > 0 && r->step % a->ckpt_every == 0) || r->step == a->steps);
        } else {
            skip_step(r, loss, norm, rejected);
        }
        if (stop && a->out[0] && !saved) saved = 1;
        if (saved) {
            save_train_pos_loss(r);
            save_checkpoint(r);
        }
        if (stop) {
            char msg[4608];
            if (!a->out[0]) {
                snprintf(msg, sizeof(msg), "at step %d (no --out: nothing saved)", r->step);
                run_exit_signalled(r, stop, msg);
            }
            snprintf(msg, sizeof(msg), "stopped by %s at step %d: resume with --resume (--out %s)",
                     run_signal_name(stop), r->step, a->out);
            run_free(r);
            run_exit(r, FOX_EXIT_STOPPED, msg);
        }
    }
}

// The whole program: train (then sample), or evaluate with --eval-only.
static int run_main(int argc, char **argv) {
    Run r;
    memset(&r, 0, sizeof(r));
    r.lock_fd = -1;
    setvbuf(stdout, NULL, _IOLBF, 0);  // progress lines show up promptly under tee and mpirun
    dist_init(&r.dist, &argc, &argv);
    fox_args_parse(&r.args, argc, argv);
    run_catch_stop_signals();  // a signal during the set-up stops a training run after its first step
    if (r.dist.world > 1 && !r.args.generate) fox_watchdog_start(r.args.collective_timeout, r.dist.rank, -1);
    if (r.args.eval_only && evals_any(&r.args)) {
        eval_tasks(&r);
    } else if (r.args.eval_only) {
        eval_init(&r);
        eval_per_token(&r);
    } else if (r.args.generate) {
        if (r.dist.rank == 0) generate_from_file(&r);
    } else {
        run_init(&r);
        train(&r);
        fox_watchdog_stop();
        if (r.dist.rank == 0 && r.args.sample_tokens > 0) print_sample(&r);
        if (r.dist.rank == 0 && r.args.out[0]) printf("run directory: %s\n", r.args.out);
    }
    run_free(&r);
    dist_finalize();
    return 0;
}
#endif
