// fox/run_base.h: what a run holds and how it ends, which the run's parts share (fox/run.h the step loop,
// checkpoints and --eval-only; fox/rundir.h the run directory; fox/generate.h generation): the Run, the
// stop signals, the exits, the log, the model options and the weights an evaluation reads.
#ifndef FOX_RUN_BASE_H
#define FOX_RUN_BASE_H

#include <signal.h>
#include <time.h>
#include "config.h"
#include "args.h"
#include "io.h"
#include "checkpoint.h"
#include "train_common.h"
#include "dist.h"
#include "watchdog.h"  // --collective-timeout: FOX_EXIT_PEER_LOST (76) when a rank died or stopped answering
#include "trainer.h"
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
    int test_slow_rank, test_slow_step, test_slow_ms;
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
    if (sig == SIGCONT) fox_watchdog_stop();  // mpirun ends the rank within its intervals: no second line from it
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

// Host buffers for the weights (and the AdamW moments), allocated on first use.
static void ensure_host_staging(Run *r, int moments) {
    size_t n = r->lay.total;
    if (!r->h_params) r->h_params = (float *)fox_malloc(n * sizeof(float));
    if (moments && !r->h_m) {
        r->h_m = (float *)fox_malloc(n * sizeof(float));
        r->h_v = (float *)fox_malloc(n * sizeof(float));
    }
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

static FOX_PRINTF(2, 3) void log_json(Run *r, const char *fmt, ...) {
    if (!r->log) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(r->log, fmt, ap);
    va_end(ap);
    fputc('\n', r->log);
    if (fflush(r->log)) fox_fatal("cannot write %s/log.jsonl: %s", r->args.out, strerror(errno));
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
#endif
