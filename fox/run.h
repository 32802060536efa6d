// fox/run.h: a training or evaluation run — flags, data, the step loop, logs, checkpoints, resume,
// --eval-only and sampling — shared by train_fox_cpu (train_fox.c) and train_fox (train_fox.cu).
// What the run needs from a trainer is declared in fox/trainer.h.
#ifndef FOX_RUN_H
#define FOX_RUN_H

#include <signal.h>
#include <sys/file.h>
#include <time.h>
#include "config.h"
#include "args.h"
#include "docmask.h"  // fox_doc_start: --eval-doc-pos finds the documents
#include "io.h"
#include "npy.h"
#include "checkpoint.h"
#include "train_common.h"
#include "dist.h"
#include "trainer.h"
#include "sample.h"
#include "eval.h"      // the evaluation tasks: --eval-niah, --eval-passkey, --eval-mc, --eval-mqar
#include "../dataloader.h"
#include "../tokenizer.h"

// Exit codes besides 0 (done) and 1 (an error, one line on stderr): the run stopped itself.
#define FOX_EXIT_DIVERGED 3   // --max-bad-steps steps in a row were not applied (step_rejection)
#define FOX_EXIT_STOPPED 75   // a signal (SIGTERM, SIGINT, SIGUSR1, SIGHUP): checkpoint written, --resume
// A signal where nothing is left to resume (no --out, --generate, --eval-only) exits 128 + its number,
// the shell's code for a process the signal ended.

typedef struct {
    FoxArgs args;
    Dist dist;
    Model *model;                 // the trainer's (fox/trainer.h)
    FoxConfig cfg;                // its configuration and parameter layout
    FoxLayout lay;
    int seq_len;                  // its context: the training --seq-len, or the evaluation's
    OptConfig opt;
    DataLoader train, val;
    int has_val, grad_accum, step;
    long long tokens;
    long long skipped;            // steps skipped so far (checkpointed)
    int bad_in_a_row;             // consecutive skipped steps
    double loss_mean, loss_var;   // recent mean and variance of the applied steps' loss (--spike-z)
    long long loss_count;         // applied steps in them
    uint64_t rng;                 // counter of the sampling stream
    int *inputs, *targets;
    double *pos_loss;             // per-position loss summed since the last save (docs/model.md §6 L(i))
    long long pos_loss_seqs;
    double *step_pos_loss;        // the same for the current step, added to pos_loss if it is applied
    int train_seq_len;            // --eval-only: the evaluated checkpoint's training context (0 = unknown)
    double *doc_pos_loss, *doc_pos_count;  // --eval-doc-pos: loss summed by position within the document, and
                                           // the tokens counted at each position
    Evals ev;                     // the evaluation tasks (fox/eval.h)
    float *h_params, *h_m, *h_v;  // host staging of weights and AdamW moments (checkpoints)
    FILE *log;
    int lock_fd;                  // OUT/.lock, held by rank 0 for the run's life (-1: none)
    int clear_out;                // --overwrite: the earlier run is deleted once the start-up checks pass
    int test_nan_step, test_nan_attempts, test_discard_step, test_ckpt_stall_ms;  // test-only hooks (run_test_hooks)
} Run;

// The stop signal received (0: none). The handler only records it: the step loop acts on it at the
// end of the current step, so a checkpoint being written is always finished; generation at the next
// token, --eval-only at the next sequence. run_stop_note says which, set before each of them starts.
static volatile sig_atomic_t run_stop_signal = 0;
static const char *volatile run_stop_note = "\nstopping after this step, with a checkpoint (SIGINT again to quit at once)\n";

static int run_under_mpirun;  // started by Open MPI's mpirun (its kill sequence begins with SIGCONT)

// Open MPI's mpirun (or its orted on another node) answers SIGTERM and Ctrl-C with SIGCONT, then SIGTERM
// odls_base_sigkill_timeout seconds later, then SIGKILL as long again: its SIGCONT to a running rank
// (sender: the rank's parent) is taken as the stop, which leaves the ranks both intervals. Any other
// SIGCONT (a job resumed after SIGSTOP by a shell or Slurm) changes nothing.
static void run_on_stop_signal(int sig, siginfo_t *info, void *context) {
    (void)context;
    if (sig == SIGCONT && !(run_under_mpirun && info && info->si_code == SI_USER && info->si_pid == getppid())) return;
    if (run_stop_signal && sig == SIGINT) _exit(128 + SIGINT);  // a second Ctrl-C: at once
    if (run_stop_signal) return;
    run_stop_signal = sig;
    const char *note = run_stop_note;
    ssize_t said = write(STDERR_FILENO, note, strlen(note));  // write(2) and strlen: safe in a signal handler
    (void)said;
}

// The stop signals' handler; SIGXFSZ ignored, so a write past a file-size limit (ulimit -f) fails with
// EFBIG into the checked write's one-line error instead of killing the process without a word.
static void run_catch_stop_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = run_on_stop_signal;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    run_under_mpirun = getenv("OMPI_COMM_WORLD_SIZE") != NULL;
    int sigs[] = {SIGTERM, SIGINT, SIGUSR1, SIGHUP, SIGCONT};
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
        if (sigaction(sigs[i], &sa, NULL)) fox_fatal("cannot install the handler of signal %d: %s", sigs[i], strerror(errno));
    sa.sa_flags = 0;
    sa.sa_handler = SIG_IGN;
    if (sigaction(SIGXFSZ, &sa, NULL)) fox_fatal("cannot ignore SIGXFSZ: %s", strerror(errno));
}

static const char *run_signal_name(int sig) {
    switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    case SIGHUP: return "SIGHUP";
    case SIGCONT: return "mpirun's kill sequence (SIGTERM or Ctrl-C to mpirun)";
    default: return "a signal on another rank";
    }
}

// Test-only hooks, read from the environment: FOX_TEST_NONFINITE="S[:N]" gives the first N (default 1)
// attempts at step S a NaN gradient; FOX_TEST_DISCARD_BATCH=S throws away one step's batches before
// step S (what a skipped step must be equivalent to); FOX_TEST_CKPT_STALL_MS=N pauses every checkpoint
// write for N ms between its state and weights files, so that a test's kill -9 lands inside writes.
static void run_test_hooks(Run *r) {
    const char *nan = getenv("FOX_TEST_NONFINITE"), *discard = getenv("FOX_TEST_DISCARD_BATCH");
    const char *stall = getenv("FOX_TEST_CKPT_STALL_MS");
    r->test_nan_attempts = 1;
    if (nan && sscanf(nan, "%d:%d", &r->test_nan_step, &r->test_nan_attempts) < 1) fox_fatal("FOX_TEST_NONFINITE=%s: expected S[:N]", nan);
    if (discard && sscanf(discard, "%d", &r->test_discard_step) != 1) fox_fatal("FOX_TEST_DISCARD_BATCH=%s: expected a step", discard);
    if (stall && (sscanf(stall, "%d", &r->test_ckpt_stall_ms) != 1 || r->test_ckpt_stall_ms < 0))
        fox_fatal("FOX_TEST_CKPT_STALL_MS=%s: expected milliseconds", stall);
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

// x for a JSON value: the number, or null when it is not finite (NaN and Inf are not JSON).
static const char *json_number(char *buf, size_t cap, double x) {
    if (isfinite(x)) snprintf(buf, cap, "%.17g", x);
    else snprintf(buf, cap, "null");
    return buf;
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

// Host buffers for the weights (and the AdamW moments), allocated on first use.
static void ensure_host_staging(Run *r, int moments) {
    size_t n = r->lay.total;
    if (!r->h_params) r->h_params = (float *)fox_malloc(n * sizeof(float));
    if (moments && !r->h_m) {
        r->h_m = (float *)fox_malloc(n * sizeof(float));
        r->h_v = (float *)fox_malloc(n * sizeof(float));
    }
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
        next_batch(r, &r->val, r->args.val, (size_t)B * T);
        sum += model_forward(r->model, r->inputs, r->targets, B, T);
    }
    double mean = sum / steps;
    dist_allreduce_sum_f64(&r->dist, &mean, 1);
    return mean / r->dist.world;
}

// The gradient of one optimizer step: grad_accum micro-batches and the mean over ranks. The ranks'
// losses and stop signals meet in one reduction, so all ranks take the same decisions. Returns the
// loss; the gradient's norm goes to norm_out, whether some rank was signalled to stop to stop_out.
static double step_gradient(Run *r, double *norm_out, int *stop_out) {
    Model *m = r->model;
    int B = r->args.batch, T = r->args.seq_len, N = B * T;
    int poison = r->step + 1 == r->test_nan_step && r->test_nan_attempts > 0;
    r->test_nan_attempts -= poison;
    if (r->step + 1 == r->test_discard_step)
        for (int micro = 0; micro < r->grad_accum; micro++) next_batch(r, &r->train, r->args.train, (size_t)N);
    run_model_zero_grad(m);
    memset(r->step_pos_loss, 0, (size_t)T * sizeof(double));
    double loss = 0.0;
    for (int micro = 0; micro < r->grad_accum; micro++) {
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
    *stop_out = shared[1] > 0.0;
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

// Stops the run with `code` after printing msg (rank 0), every rank alike: on stdout when a signal
// stopped it, else on stderr.
static FOX_NORETURN void run_exit(Run *r, int code, const char *msg) {
    if (r->dist.rank == 0) {
        fflush(stdout);
        fprintf(code == FOX_EXIT_STOPPED || code > 128 ? stdout : stderr, "%s\n", msg);
    }
    if (r->log) fclose(r->log);
    dist_finalize();
    exit(code);
}

// Frees what the run holds and closes its log and lock.
static void run_free(Run *r) {
    if (r->model) model_free(r->model);
    free(r->model);
    r->model = NULL;
    evals_free(&r->ev);
    if (!r->args.eval_only && !r->args.generate) dataloader_free(&r->train);
    if (r->has_val) dataloader_free(&r->val);
    free(r->inputs);
    free(r->targets);
    free(r->pos_loss);
    free(r->doc_pos_loss);
    free(r->doc_pos_count);
    free(r->step_pos_loss);
    free(r->h_params);
    free(r->h_m);
    free(r->h_v);
    if (r->log && fclose(r->log)) fox_fatal("cannot close the log");
    r->log = NULL;
    if (r->lock_fd >= 0) close(r->lock_fd);
}

// Ends a run that signal `sig` stopped where nothing is left to resume: exit 128 + sig (SIGTERM's code
// when the signal came to another rank: sig 0).
static FOX_NORETURN void run_exit_signalled(Run *r, int sig, const char *where) {
    char msg[256];
    snprintf(msg, sizeof(msg), "stopped by %s %s", run_signal_name(sig), where);
    run_free(r);
    run_exit(r, 128 + (sig ? sig : SIGTERM), msg);
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
    dist_barrier(&r->dist);
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
}

// The message a failed load of the checkpoint of `step` in out ends with: the older one a resume,
// --eval-only or --generate could use.
static void set_fallback_hint(const char *out, int step) {
    int steps[4096], n = fox_ckpt_list(out, steps, 4096), older = -1;
    for (int i = 0; i < n; i++)
        if (steps[i] < step) older = steps[i];
    if (older >= 0)
        snprintf(fox_fatal_hint, sizeof(fox_fatal_hint), " (to use the older complete checkpoint ckpt_%08d, "
                 "move %s/ckpt_%08d aside)", older, out, step);
    else
        snprintf(fox_fatal_hint, sizeof(fox_fatal_hint), " (no older checkpoint in %s)", out);
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

static FOX_PRINTF(2, 3) void log_json(Run *r, const char *fmt, ...) {
    if (!r->log) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(r->log, fmt, ap);
    va_end(ap);
    fputc('\n', r->log);
    if (fflush(r->log)) fox_fatal("cannot write %s/log.jsonl: %s", r->args.out, strerror(errno));
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


// One run per directory: rank 0 holds an exclusive lock on OUT/.lock (with its PID inside) for the
// run's life; the kernel drops it when the process ends, however it ends. Returns the holder's PID
// when another run has it, else 0.
static long lock_out_dir(Run *r) {
    char path[4352];
    snprintf(path, sizeof(path), "%s/.lock", r->args.out);
    r->lock_fd = open(path, O_RDWR | O_CREAT, 0644);
    if (r->lock_fd < 0) fox_fatal("cannot open %s: %s", path, strerror(errno));
    if (flock(r->lock_fd, LOCK_EX | LOCK_NB)) {
        if (errno != EWOULDBLOCK) fox_fatal("cannot lock %s: %s", path, strerror(errno));
        char pid[32] = {0};
        ssize_t got = pread(r->lock_fd, pid, sizeof(pid) - 1, 0);
        long holder = got > 0 ? atol(pid) : 0;
        return holder > 0 ? holder : -1;
    }
    char pid[32];
    int n = snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());
    if (ftruncate(r->lock_fd, 0) || pwrite(r->lock_fd, pid, (size_t)n, 0) != n) fox_fatal("cannot write %s: %s", path, strerror(errno));
    return 0;
}

// Whether OUT holds the work of an earlier run: checkpoints or a non-empty log.
static int out_dir_used(const char *out) {
    int steps[4096];
    char path[4352];
    struct stat st;
    snprintf(path, sizeof(path), "%s/log.jsonl", out);
    return fox_ckpt_list(out, steps, 4096) > 0 || (stat(path, &st) == 0 && st.st_size > 0);
}

// On resume at `step`, log.jsonl keeps only the lines of steps up to it (a killed run may have logged
// steps past its newest checkpoint, and a line cut short by the kill), so no step appears twice. A
// skipped step's line carries the step it tried (step + 1 for the skips before the checkpoint's next
// step, which a stop checkpoints too): those lines stay while their running count "skipped_steps" is
// within the checkpoint's `skipped`.
static void cut_log(const char *out, int step, long long skipped) {
    char path[4352], tmp[4352];
    snprintf(path, sizeof(path), "%s/log.jsonl", out);
    snprintf(tmp, sizeof(tmp), "%s/log.jsonl.tmp", out);
    size_t len;
    char *text = fox_read_file(path, &len);
    if (!text) return;
    FILE *f = fox_fopen(tmp, "w");
    for (char *line = text, *end; (end = strchr(line, '\n')) != NULL; line = end + 1) {
        int st, n = 0;
        long long count;
        if (sscanf(line, "{\"step\": %d, \"skipped\": %n", &st, &n) < 1) continue;
        const char *at = n ? strstr(line, "\"skipped_steps\": ") : NULL;
        int keep = n ? at && at < end && sscanf(at, "\"skipped_steps\": %lld", &count) == 1 && count <= skipped && st <= step + 1
                     : st <= step;
        if (keep) fox_fwrite(line, 1, (size_t)(end - line + 1), f, tmp);
    }
    free(text);
    fox_fclose_synced(f, tmp);
    if (rename(tmp, path)) fox_fatal("cannot rename %s: %s", tmp, strerror(errno));
}

// --overwrite: removes what an earlier run left in OUT (checkpoints, temporaries, logs, losses).
static void clear_out_dir(const char *out) {
    DIR *d = opendir(out);
    if (!d) fox_fatal("cannot open %s: %s", out, strerror(errno));
    struct dirent *e;
    char path[4352];
    while ((e = readdir(d))) {
        const char *n = e->d_name;
        snprintf(path, sizeof(path), "%s/%s", out, n);
        if (!strncmp(n, "ckpt_", 5) || !strncmp(n, ".tmp_ckpt_", 10)) fox_remove_flat_dir(path);
        else if (!strcmp(n, "log.jsonl") || !strncmp(n, "train_loss_pos_", 15) || !strncmp(n, "per_token_loss.", 15))
            if (unlink(path)) fox_fatal("cannot remove %s: %s", path, strerror(errno));
    }
    closedir(d);
}

// The step of a per-position loss file's name, train_loss_pos_SSSSSSSS.npy, or -1 for another name.
static int train_pos_loss_step(const char *name) {
    if (strlen(name) != 27 || strncmp(name, "train_loss_pos_", 15) || strspn(name + 15, "0123456789") != 8 ||
        strcmp(name + 23, ".npy"))
        return -1;
    return atoi(name + 15);
}

// Removes what a killed run left in OUT that no checkpoint up to `step` (the one resumed, 0 when none)
// accounts for: checkpoint directories whose write did not finish (.tmp_ckpt_*), a half-written copy of
// log.jsonl, and the per-position losses of later steps (written just before a checkpoint that was not).
// Rank 0, under the lock; one line names what went.
static void remove_stale_files(const char *out, int step) {
    DIR *d = opendir(out);
    if (!d) fox_fatal("cannot open %s: %s", out, strerror(errno));
    struct dirent *e;
    char path[4352], gone[1024] = "";
    size_t said = 0;
    int count = 0;
    while ((e = readdir(d))) {
        const char *n = e->d_name;
        int tmp_dir = !strncmp(n, ".tmp_ckpt_", 10);
        if (!tmp_dir && strcmp(n, "log.jsonl.tmp") && train_pos_loss_step(n) <= step) continue;
        snprintf(path, sizeof(path), "%s/%s", out, n);
        if (tmp_dir) fox_remove_flat_dir(path);
        else if (unlink(path)) fox_fatal("cannot remove %s: %s", path, strerror(errno));
        if (said < sizeof(gone)) said += (size_t)snprintf(gone + said, sizeof(gone) - said, "%s%s", count ? ", " : "", n);
        count++;
    }
    closedir(d);
    if (count) printf("removed what an interrupted run left in %s: %s\n", out, gone);
}

// What a failed start undoes (fox_fatal_undo): the lock file it created, and the run directory when it
// created that too (rmdir: only while nothing else is in it).
static char run_undo_lock[4352], run_undo_dir[4096];
static void run_undo_start(void) {
    if (run_undo_lock[0]) unlink(run_undo_lock);
    if (run_undo_dir[0]) rmdir(run_undo_dir);
}

// Rank 0 decides whether the run may use OUT (locked by no other run; a fresh run only in an unused
// directory, or with --overwrite, whose deletion waits for the start-up checks: r->clear_out); every
// rank fails alike when it may not, rank 0 saying why.
static void claim_out_dir(Run *r) {
    FoxArgs *a = &r->args;
    char why[4608] = "";
    if (r->dist.rank == 0) {
        struct stat st;
        if (stat(a->out, &st)) snprintf(run_undo_dir, sizeof(run_undo_dir), "%s", a->out);
        snprintf(run_undo_lock, sizeof(run_undo_lock), "%s/.lock", a->out);
        if (stat(run_undo_lock, &st) == 0) run_undo_lock[0] = 0;
        fox_fatal_undo = run_undo_start;
        fox_mkdir_p(a->out);
        long holder = lock_out_dir(r);
        if (holder)
            snprintf(why, sizeof(why), "%s is in use by another run (pid %ld; %s/.lock): one run per directory", a->out,
                     holder, a->out);
        else if (!a->resume && out_dir_used(a->out)) {
            if (!a->overwrite)
                snprintf(why, sizeof(why), "%s holds an earlier run (checkpoints or log.jsonl): add --resume to continue it, "
                         "or --overwrite to delete it and start over", a->out);
            else
                r->clear_out = 1;
        }
    }
    dist_broadcast(&r->dist, why, sizeof(why), 0);
    if (why[0] && r->dist.rank == 0) fox_fatal("%s", why);
    if (why[0]) exit(1);
}

// Rank 0, once the start-up checks have passed: the earlier run deleted (--overwrite), what an
// interrupted run left removed, log.jsonl cut back to the resumed step and opened. From here on a
// failure undoes nothing.
static void open_out_dir(Run *r) {
    const FoxArgs *a = &r->args;
    char path[4352];
    if (r->clear_out) clear_out_dir(a->out);
    remove_stale_files(a->out, r->step);
    if (r->step) cut_log(a->out, r->step, r->skipped);
    snprintf(path, sizeof(path), "%s/log.jsonl", a->out);
    r->log = fox_fopen(path, r->step ? "a" : "w");
    fox_fatal_undo = NULL;
}

// The flags that depend on the model: --doc-sep must be a token of its vocabulary when --doc-mask or
// --eval-doc-pos use it; Gated Slot Attention has no attention tiles to prune and no document mask, and
// neither has TransformerFAM's block sliding window. T: the context of the forward (the training or the
// evaluation window; 0 for generation, whose prompt may end inside a block), which FAM's blocks must divide.
static void check_model_flags(const FoxArgs *a, const FoxConfig *cfg, int T, const char *context_flag) {
    if ((a->doc_mask || (a->eval_only && a->eval_doc_pos)) && a->doc_sep >= cfg->vocab_size)
        fox_usage_error("--doc-sep %d is not a token of this model's vocabulary of %d", a->doc_sep, cfg->vocab_size);
    if (cfg->arch == FOX_ARCH_GSA && (a->acp || a->doc_mask))
        fox_usage_error("%s works on attention: Gated Slot Attention (--model gsa) has neither tiles to prune nor a "
                        "document mask", a->acp ? "--acp" : "--doc-mask");
    if (cfg->arch == FOX_ARCH_FAM && (a->acp || a->doc_mask))
        fox_usage_error("%s works on full causal attention: TransformerFAM's block sliding window (--model %s) has "
                        "neither ACP's tiles nor a document mask", a->acp ? "--acp" : "--doc-mask",
                        cfg->forget_gate == FOX_FG_NONE ? "transformer-fam" : "fox-fam");
    if (cfg->arch == FOX_ARCH_FAM && T > 0 && cfg->fam_block > T)
        fox_usage_error("the FAM block of %d tokens (--fam-block) is longer than the context %s %d", cfg->fam_block,
                        context_flag, T);
    if (cfg->arch == FOX_ARCH_FAM && T > 0 && T % cfg->fam_block)
        fox_usage_error("the FAM block of %d tokens (--fam-block) does not divide the context %s %d", cfg->fam_block,
                        context_flag, T);
}

// The model options of a run's arguments, for micro-batches of batch x seq_len tokens (forward_only:
// --eval-only, which recomputes whole blocks so the longest contexts fit).
static ModelOptions model_options(const FoxArgs *a, int batch, int seq_len, int forward_only) {
    ModelOptions o = {batch, seq_len, (uint64_t)a->seed, forward_only, forward_only ? 2 : a->recompute, a->acp,
                      a->doc_mask ? a->doc_sep : -1, a->zero, a->deterministic, 0, -1, -1};
    return o;
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
    if (a->out[0]) claim_out_dir(r);
    int latest = a->resume ? fox_ckpt_latest(a->out) : -1;
    if (latest > a->steps)
        fox_usage_error("--steps %d: the run in %s is at step %d already (ckpt_%08d), nothing to train; --steps %d or more "
                        "continues it", a->steps, a->out, latest, latest, latest);
    say_stop_signal(r);
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
    r->model = run_model_init(&cfg, &mo, &r->dist);
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
}

// Path of the weights --eval-only and --generate (flag) read: --init, else the newest checkpoint's
// model.bin in --out, a failure to load which names the older checkpoint (fox_fatal_hint, cleared once the
// weights are in). With train_context: returns the training context of that checkpoint, read from its
// state file when present (0 when unknown: --init, or a checkpoint that kept only its weights).
static int eval_weights_path(const FoxArgs *a, const char *flag, char *path, size_t cap, int train_context) {
    if (a->init[0]) { snprintf(path, cap, "%s", a->init); return 0; }
    int latest = a->out[0] ? fox_ckpt_latest(a->out) : -1;
    if (latest < 0) fox_usage_error("%s needs --init PATH or a checkpoint in --out%s%s", flag, a->out[0] ? " " : "", a->out);
    char dir[4096];
    struct stat st;
    fox_ckpt_dir(dir, sizeof(dir), a->out, latest, 0);
    set_fallback_hint(a->out, latest);
    if (snprintf(path, cap, "%s/state_00000.bin", dir) >= (int)cap) fox_fatal("path too long: %s", dir);
    int train_T = train_context && stat(path, &st) == 0 ? fox_state_seq_len(path) : 0;
    snprintf(path, cap, "%s/model.bin", dir);
    return train_T;
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
    FoxConfig cfg = fox_read_model_config(path);
    check_model_flags(a, &cfg, T, a->eval_seq_len ? "--eval-seq-len" : "--seq-len");
    dataloader_init(&r->val, a->val, 1, T, r->dist.rank, r->dist.world, (uint64_t)a->seed, 0);
    r->has_val = 1;
    r->cfg = cfg;
    fox_layout(&cfg, &r->lay);
    r->seq_len = T;
    ModelOptions mo = model_options(a, 1, T, 1);
    r->model = run_model_init(&cfg, &mo, &r->dist);
    load_weights(r, path, &cfg);
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
    if (a->eval_doc_pos) save_doc_pos_loss(r, T);
}

// ---- Generation (docs/model.md §7) ----

// The prompt's text: --prompt, or --prompt-file read whole; it must be UTF-8 (NULL: neither given).
static char *prompt_text(const FoxArgs *a, size_t *len) {
    char *text;
    const char *what = a->prompt_file[0] ? a->prompt_file : "--prompt";
    if (a->prompt_file[0]) {
        text = fox_read_file(a->prompt_file, len);
        if (!text) fox_fatal("cannot read the prompt file %s: %s", a->prompt_file, strerror(errno));
    } else if (a->prompt[0]) {
        *len = strlen(a->prompt);
        text = (char *)fox_malloc(*len + 1);
        memcpy(text, a->prompt, *len + 1);
    } else {
        return NULL;
    }
    if (*len == 0) fox_usage_error("%s: the prompt is empty", what);
    for (size_t i = 0; i < *len;) {
        uint32_t cp;
        int n = fox_utf8_next((const unsigned char *)text, *len, i, &cp);
        if (cp == 0xFFFFFFFFu) fox_usage_error("%s: not UTF-8 text (an invalid byte 0x%02x at offset %zu)", what, (unsigned char)text[i], i);
        i += (size_t)n;
    }
    return text;
}

// The prompt's tokens: <|endoftext|> (a document starts after it, as in the training data), then the
// prompt's encoding with the GPT-2 tokenizer tok (NULL: the model has another vocabulary).
static int *prompt_tokens(const FoxArgs *a, const FoxConfig *cfg, const Tokenizer *tok, int *n) {
    size_t len, count = 0;
    char *text = prompt_text(a, &len);
    int *ids = NULL;
    if (text && !tok) fox_usage_error("--prompt needs the GPT-2 vocabulary and %s (this model has %d tokens)", a->tokenizer, cfg->vocab_size);
    if (text && !(ids = tokenizer_encode(tok, text, len, &count, 1))) fox_fatal("cannot encode the prompt (out of memory)");
    free(text);
    if (count + 1 > (size_t)INT_MAX / 2) fox_usage_error("the prompt is too long (%zu tokens)", count);
    int *out = (int *)fox_malloc((count + 1) * sizeof(int));
    out[0] = FOX_EOT < cfg->vocab_size ? FOX_EOT : 0;
    if (count) memcpy(out + 1, ids, count * sizeof(int));
    free(ids);
    *n = (int)count + 1;
    return out;
}

// Writes token id as text (tok) or as a number, unbuffered enough to follow the generation.
static void emit_token(FILE *f, const Tokenizer *tok, int id) {
    if (!tok) { fprintf(f, " %d", id); return; }
    size_t len;
    char *text = tokenizer_decode(tok, &id, 1, &len);
    if (!text) fox_fatal("cannot decode token %d (out of memory)", id);
    fwrite(text, 1, len, f);
    free(text);
    fflush(f);
}

// n tokens after the prompt for each of `samples` sequences, with the weights params: a model for the
// prompt's length (forward only, on this rank alone), the prompt's forward filling the KV cache, then
// one decode step per token. Sequence 0 streams to stdout (after `lead`), the others follow it; the
// timings go to stderr. A stop signal ends it at the next token: returns the signal (0: none).
static int generate(Run *r, const float *params, const char *source, int n, int samples, const char *lead) {
    const FoxArgs *a = &r->args;
    const FoxConfig *cfg = &r->cfg;
    int V = cfg->vocab_size, P;
    Tokenizer tok_, *tok = NULL;  // GPT-2's, also for a vocabulary padded past its 50257 tokens
    if (V >= FOX_VOCAB_GPT2) {
        if (!tokenizer_load(&tok_, a->tokenizer)) fox_fatal("cannot load the GPT-2 tokenizer %s (--tokenizer)", a->tokenizer);
        tok = &tok_;
    }
    int *prompt = prompt_tokens(a, cfg, tok, &P);
    Dist solo = r->dist;
    solo.rank = 0;
    solo.world = 1;
    ModelOptions mo = model_options(a, samples, P, 1);
    r->model = run_model_init(cfg, &mo, &solo);
    run_model_set(r->model, params, NULL, NULL);
    run_model_cache_init(r->model, P + n);
    if (source) fprintf(stderr, "generating from %s (%zu parameters)\n", source, r->lay.total);
    int *tokens = (int *)fox_malloc((size_t)samples * P * sizeof(int)), *next = (int *)fox_calloc((size_t)samples, sizeof(int));
    int *out = (int *)fox_calloc((size_t)samples * n, sizeof(int)), *len = (int *)fox_calloc((size_t)samples, sizeof(int));
    float *logits = (float *)fox_malloc((size_t)samples * V * sizeof(float));
    Sampler s = {a->temperature, a->top_p, a->top_k, (int *)fox_malloc((size_t)V * sizeof(int)), (double *)fox_malloc((size_t)V * sizeof(double))};
    for (int b = 0; b < samples; b++) memcpy(tokens + (size_t)b * P, prompt, (size_t)P * sizeof(int));
    uint64_t key = fox_rng_key((uint64_t)a->seed, FOX_STREAM_SAMPLE);
    fputs(lead, stdout);
    for (int j = 1; j < P; j++) emit_token(stdout, tok, prompt[j]);
    run_stop_note = "\nstopping at the next token (SIGINT again to quit at once)\n";
    double t0 = now_seconds();
    run_model_prefill(r->model, tokens, P, logits);
    double t_prefill = now_seconds() - t0, t1 = now_seconds();
    int steps = 0, live = samples;
    for (int i = 0; i < n && live && !run_stop_signal; i++) {
        if (i) {
            run_model_decode(r->model, next, logits);
            steps++;
        }
        for (int b = 0; b < samples; b++) {
            int done = len[b] < i;  // ended at <|endoftext|> before this step
            next[b] = done ? next[b] : sample_token(&s, logits + (size_t)b * V, V, fox_rng_uniform(key, r->rng++));
            if (done) continue;
            if (a->stop_at_eot && next[b] == FOX_EOT && V >= FOX_VOCAB_GPT2) { live--; continue; }
            out[(size_t)b * n + len[b]++] = next[b];
            if (b == 0) emit_token(stdout, tok, next[b]);
        }
    }
    double t_decode = now_seconds() - t1;
    for (int b = 1; b < samples; b++) {
        printf("\n--- sample %d ---\n", b);
        for (int j = 0; j < len[b]; j++) emit_token(stdout, tok, out[(size_t)b * n + j]);
    }
    printf("\n");
    fflush(stdout);
    double read = run_model_decode_keys_read(r->model);
    char acp[96] = "";
    if (read >= 0) snprintf(acp, sizeof(acp), ", ACP read %.1f%% of the cached keys", 100.0 * read);
    fprintf(stderr, "prefill: %d x %d tokens in %.3f s (%.0f tokens/s) | decode: %d steps x %d sequences in %.3f s "
            "(%.1f steps/s, %.0f tokens/s)%s\n", samples, P, t_prefill, samples * P / t_prefill, steps, samples, t_decode,
            steps / (t_decode > 0 ? t_decode : 1e-9), (double)steps * samples / (t_decode > 0 ? t_decode : 1e-9), acp);
    free(prompt); free(tokens); free(next); free(out); free(len); free(logits); free(s.idx); free(s.p);
    if (tok) tokenizer_free(tok);
    return run_stop_signal;
}

// --generate: the weights of --init or of the newest checkpoint in --out, with their own config.
static void generate_from_file(Run *r) {
    char path[4352];
    if (!r->args.prompt[0] && !r->args.prompt_file[0]) fox_usage_error("--generate needs a prompt: --prompt TEXT or --prompt-file PATH");
    eval_weights_path(&r->args, "--generate", path, sizeof(path), 0);
    r->cfg = fox_read_model_config(path);
    check_model_flags(&r->args, &r->cfg, 0, NULL);
    fox_layout(&r->cfg, &r->lay);
    ensure_host_staging(r, 0);
    fox_read_model_bin(path, &r->cfg, r->h_params);
    fox_fatal_hint[0] = 0;
    int sig = generate(r, r->h_params, path, r->args.generate, r->args.samples, "");
    if (sig) run_exit_signalled(r, sig, "during generation: the tokens so far are above");
}

// After training (rank 0): --sample-tokens after --prompt (or after <|endoftext|> alone) with the final
// weights, through a fresh forward-only model in place of the training one. A stop signal during it
// exits 75 when the run's final checkpoint is in --out (a --resume samples again), else 128 + signal.
static void print_sample(Run *r) {
    ensure_host_staging(r, 0);
    run_model_get(r->model, r->h_params, NULL, NULL);
    model_free(r->model);
    free(r->model);
    r->model = NULL;
    int sig = generate(r, r->h_params, NULL, r->args.sample_tokens, 1, "sample: ");
    if (!sig) return;
    if (!r->args.out[0]) run_exit_signalled(r, sig, "during the sample (no --out: the trained weights were not saved)");
    char msg[4608];
    snprintf(msg, sizeof(msg), "stopped by %s during the sample: training is complete (%s/ckpt_%08d); --resume samples again",
             run_signal_name(sig), r->args.out, r->step);
    run_free(r);
    run_exit(r, FOX_EXIT_STOPPED, msg);
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
    r->cfg = fox_read_model_config(path);
    int context = a->eval_seq_len ? a->eval_seq_len : r->train_seq_len ? r->train_seq_len : a->seq_len;
    check_model_flags(a, &r->cfg, 0, NULL);
    fox_layout(&r->cfg, &r->lay);
    evals_init(&r->ev, a, &r->cfg, &r->dist, context, r->train_seq_len, &run_stop_signal);
    ensure_host_staging(r, 0);
    fox_read_model_bin(path, &r->cfg, r->h_params);
    fox_fatal_hint[0] = 0;
    if (r->dist.rank == 0) printf("evaluating %s (%zu parameters) at context %d\n", path, r->lay.total, context);
    EvalScores s;
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
    if (r->dist.rank == 0 && r->cfg.arch == FOX_ARCH_FAM)  // TransformerFAM adds no weights but its initial memory
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
            if (a->eval_every > 0 && (r->step % a->eval_every == 0 || r->step == a->steps) && run_evals(r)) stop = 1;
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
                run_exit_signalled(r, run_stop_signal, msg);
            }
            snprintf(msg, sizeof(msg), "stopped by %s at step %d: resume with --resume (--out %s)",
                     run_signal_name(run_stop_signal), r->step, a->out);
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
        if (r.dist.rank == 0 && r.args.sample_tokens > 0) print_sample(&r);
        if (r.dist.rank == 0 && r.args.out[0]) printf("run directory: %s\n", r.args.out);
    }
    run_free(&r);
    dist_finalize();
    return 0;
}

#endif
