// fox/args.h: the command line shared by train_fox_cpu and train_fox (one table makes both the
// parser and --help). Model switches left unset follow the --model preset.
#ifndef FOX_ARGS_H
#define FOX_ARGS_H

#include <errno.h>
#include <limits.h>
#include "config.h"
#include "io.h"

// F(kind, field, flag, default, lo, hi, help). kind: STR, INT, I64 (accepts K/M/G and Ki/Mi/Gi
// suffixes), FLT, SW (a switch whose unset value follows the preset), FG (forget-gate kind, unset =
// preset), BOOL. Numbers must lie in [lo, hi] (FLT: lo exclusive when FOX_OPEN_LO); the others ignore it.
// Every boolean (SW, BOOL) takes --flag, --flag=V or --flag V with V one of on/off/1/0/true/false.
#define FOX_OPEN_LO 1e-300
#define FOX_EXIT_USAGE 2  // the exit code of a bad command line (one line on stderr)
#define FOX_FLAGS(F) \
    F(STR, model, "model", "fox-pro", 0, 0, "preset: fox-pro | fox-llama | transformer-pro | transformer-llama | gsa (Gated Slot Attention) | transformer-fam | fox-fam (TransformerFAM)") \
    F(INT, layers, "layers", 12, 1, 4096, "number of blocks") \
    F(INT, dim, "dim", 768, 1, 1 << 20, "d_model") \
    F(INT, heads, "heads", 12, 1, 1 << 16, "attention heads (head_dim = dim/heads)") \
    F(INT, vocab, "vocab", 50257, 2, 1 << 30, "vocabulary size (GPT-2: 50257; SlimPajama/LLaMA: 32000)") \
    F(INT, mlp_hidden, "mlp-hidden", 0, 0, 1 << 24, "SwiGLU hidden size; 0 = the preset's ratio (docs/model.md §1.2)") \
    F(FG, forget_gate, "forget-gate", -1, 0, 0, "data-dependent | data-independent | fixed | none") \
    F(SW, rope, "rope", -1, 0, 0, "rotary embedding on q and k") \
    F(SW, qk_norm, "qk-norm", -1, 0, 0, "per-head RMSNorm of q and k") \
    F(SW, qk_norm_shared, "qk-norm-shared", -1, 0, 0, "one QK-norm weight vector shared by all heads, as in the paper's runs") \
    F(SW, kv_shift, "kv-shift", -1, 0, 0, "data-dependent token shift of keys and values") \
    F(SW, output_gate, "output-gate", -1, 0, 0, "sigmoid output gate") \
    F(SW, output_norm, "output-norm", -1, 0, 0, "per-head RMSNorm of the attention output") \
    F(FLT, t_min, "t-min", 2.0, 1.0, 1e9, "shortest timescale of the fixed/data-independent gate init") \
    F(FLT, t_max, "t-max", 128.0, 1.0, 1e9, "longest timescale of the fixed/data-independent gate init") \
    F(FLT, rope_theta, "rope-theta", 500000.0, 1.0, 1e12, "RoPE base") \
    F(INT, gsa_heads, "gsa-heads", 4, 1, 4096, "--model gsa: heads of Gated Slot Attention (docs/model.md §1.9)") \
    F(INT, gsa_slots, "gsa-slots", 64, 1, 65536, "--model gsa: memory slots per head") \
    F(FLT, gsa_tau, "gsa-tau", 8.0, FOX_OPEN_LO, 1e6, "--model gsa: damping of the slot gates, alpha = sigmoid(W x)^(1/tau)") \
    F(INT, fam_block, "fam-block", 1024, 1, 1 << 24, "--model transformer-fam/fox-fam: tokens per block of the sliding window, a divisor of the context; on the GPU (train_fox) a multiple of 128 (docs/model.md §1.10)") \
    F(INT, fam_memory, "fam-memory", 64, 0, 65536, "--model transformer-fam/fox-fam: feedback-memory (FAM) tokens per layer (0: none, block sliding window attention alone, the FAM paper's BSWA baseline)") \
    F(INT, fam_window_blocks, "fam-window-blocks", 3, 0, 1 << 20, "--model transformer-fam/fox-fam: previous blocks a block attends to besides itself and the FAM") \
    F(STR, train, "train", "data/train.bin", 0, 0, "training data: glob of llm.c .bin shards or a zarr array directory") \
    F(STR, val, "val", "data/val.bin", 0, 0, "validation data (same forms); empty string disables validation") \
    F(INT, seq_len, "seq-len", 256, 1, 1 << 24, "training context T") \
    F(INT, batch, "batch", 4, 1, 1 << 20, "sequences per micro-batch (per rank)") \
    F(I64, total_batch_tokens, "total-batch-tokens", 0, 0, 1LL << 40, "tokens per optimizer step; 0 = batch*seq-len*ranks (no accumulation)") \
    F(INT, steps, "steps", 100, 1, 2147483647, "optimizer steps (the cosine schedule ends here)") \
    F(FLT, lr, "lr", 2e-3, FOX_OPEN_LO, 1e6, "peak learning rate") \
    F(FLT, min_lr, "min-lr", 0.0, 0.0, 1e6, "final learning rate of the cosine decay (at most --lr)") \
    F(I64, warmup_tokens, "warmup-tokens", 268435456, 0, 1LL << 50, "linear warmup length in tokens (paper: 256Mi)") \
    F(FLT, weight_decay, "weight-decay", 0.1, 0.0, 1e6, "AdamW decay on matrices (embedding and lm_head included)") \
    F(FLT, grad_clip, "grad-clip", 1.0, 0.0, 1e30, "global gradient-norm clip; 0 disables") \
    F(I64, seed, "seed", 1337, 0, 9223372036854775807LL, "seed of the weights and of the data order") \
    F(STR, out, "out", "", 0, 0, "run directory for log.jsonl and checkpoints (one run at a time); empty = write nothing") \
    F(BOOL, resume, "resume", 0, 0, 0, "continue from the newest complete checkpoint in --out (fresh start if none)") \
    F(BOOL, overwrite, "overwrite", 0, 0, 0, "a fresh run in an --out that holds checkpoints or a log: delete them first") \
    F(STR, init, "init", "", 0, 0, "initial weights from a model.bin (e.g. written by train_fox.py)") \
    F(INT, eval_every, "eval-every", 50, 0, 2147483647, "validation every N steps (and at the end); 0 = never") \
    F(INT, val_steps, "val-steps", 20, 1, 1 << 24, "validation micro-batches per evaluation") \
    F(INT, ckpt_every, "ckpt-every", 0, 0, 2147483647, "checkpoint every N steps (and at the end); 0 = only at the end") \
    F(INT, keep, "keep", 3, 1, 4096, "checkpoints kept in --out (older ones are deleted)") \
    F(INT, max_bad_steps, "max-bad-steps", 5, 1, 1 << 20, "consecutive skipped steps (non-finite loss or gradient norm, loss spike) before the run stops (exit 3)") \
    F(FLT, collective_timeout, "collective-timeout", 300.0, 0.0, 1e7, "several ranks: seconds without progress (a rank dead or stuck) before every rank stops with exit 76 (relaunch with --resume); at least twice the first step; 0 = no limit") \
    F(FLT, spike_z, "spike-z", 0.0, 0.0, 1e6, "also skip a step whose loss exceeds the recent mean by Z standard deviations (after 20 steps); 0 = off") \
    F(INT, sample_tokens, "sample-tokens", 64, 0, 1 << 24, "tokens to generate after training (after --prompt if given); 0 = none") \
    F(INT, generate, "generate", 0, 0, 1 << 24, "no training: N tokens after the prompt from --init or the newest checkpoint in --out, with a KV cache (docs/model.md §7)") \
    F(STR, prompt, "prompt", "", 0, 0, "the text to continue (it follows an <|endoftext|>)") \
    F(STR, prompt_file, "prompt-file", "", 0, 0, "the prompt from a UTF-8 file") \
    F(INT, samples, "samples", 1, 1, 65536, "--generate: sequences generated together from the prompt, each with its own draws") \
    F(FLT, temperature, "temperature", 1.0, FOX_OPEN_LO, 100.0, "sampling temperature") \
    F(INT, top_k, "top-k", 0, 0, 1 << 30, "sample among the k most likely tokens; 1 = greedy (deterministic), 0 = all") \
    F(FLT, top_p, "top-p", 1.0, FOX_OPEN_LO, 1.0, "then among the fewest most likely ones holding this probability (nucleus); 1 = all") \
    F(BOOL, stop_at_eot, "stop-at-eot", 1, 0, 0, "a sequence ends at <|endoftext|>") \
    F(STR, tokenizer, "tokenizer", "data/gpt2_tokenizer.bin", 0, 0, "GPT-2 vocabulary file: encodes the prompt, decodes samples") \
    F(INT, log_every, "log-every", 1, 1, 2147483647, "print a training line every N steps") \
    F(BOOL, deterministic, "deterministic", 1, 0, 0, "bitwise reproducible attention backward; off: adds in arrival order, longest key blocks first (the backward 2-3% faster on Hopper; train_fox; the CPU trainer is always deterministic)") \
    F(BOOL, doc_mask, "doc-mask", 0, 0, 0, "no attention across documents: the forget gate closes at every --doc-sep token, which starts a document (docs/model.md §1.8)") \
    F(INT, doc_sep, "doc-sep", 50256, 0, (1 << 30) - 1, "the document separator token of --doc-mask and --eval-doc-pos (GPT-2: <|endoftext|> 50256)") \
    F(BOOL, acp, "acp", 0, 0, 0, "Adaptive Computation Pruning, skip the attention tiles the forget gates make negligible (weights below e^-10/T of the row's largest; docs/model.md §1.5)") \
    F(BOOL, zero, "zero", 1, 0, 0, "ZeRO-1 with several ranks: each holds 1/N of the AdamW moments and updates 1/N of the weights, then they exchange them (train_fox)") \
    F(INT, recompute, "recompute", 0, 0, 2, "activations recomputed in the backward: 0 only what the device has no room to keep (q, k, v; then the norm, gate and SwiGLU outputs), 1 also q, k, v, those outputs and the MLP input, 2 whole blocks (train_fox; the CPU trainer keeps all)") \
    F(BOOL, eval_only, "eval-only", 0, 0, 0, "no training: per-token loss of --init, or of the newest checkpoint in --out, on --val") \
    F(INT, eval_seqs, "eval-seqs", 64, 1, 2147483647, "--eval-only: validation sequences (fewer if the data holds fewer)") \
    F(INT, eval_seq_len, "eval-seq-len", 0, 0, 1 << 24, "--eval-only: context length, may exceed the training one; 0 = --seq-len") \
    F(BOOL, eval_doc_pos, "eval-doc-pos", 0, 0, 0, "--eval-only: also the loss by position within the document (from its --doc-sep token), OUT/doc_pos_loss.npy") \
    F(BOOL, eval_niah, "eval-niah", 0, 0, 0, "needle in a haystack (docs/model.md §8.1): with --eval-only, or with training at step 0 and every --eval-every steps; OUT/niah.json") \
    F(STR, niah_mode, "niah-mode", "standard", 0, 0, "--eval-niah: standard (the needle states the fact) or easy (it also holds the question), as the FoX repository's eval/niah") \
    F(STR, niah_haystack, "niah-haystack", "data/haystack", 0, 0, "--eval-niah: directory of .txt files, the haystack (concatenated in name order, repeated as needed)") \
    F(INT, niah_lengths, "niah-lengths", 11, 1, 1024, "--eval-niah: context lengths of the grid, evenly spaced from --niah-min-len to --niah-max-len") \
    F(INT, niah_depths, "niah-depths", 11, 1, 1024, "--eval-niah: needle depths of the grid, evenly spaced from 0% to 100%") \
    F(INT, niah_min_len, "niah-min-len", 0, 0, 1 << 24, "--eval-niah: shortest prompt in tokens; 0 = the longest / --niah-lengths") \
    F(INT, niah_max_len, "niah-max-len", 0, 0, 1 << 24, "--eval-niah: longest prompt in tokens, may exceed the training context; 0 = the training context") \
    F(INT, niah_tokens, "niah-tokens", 32, 1, 4096, "--eval-niah: tokens generated (greedy) after each prompt, then scored") \
    F(BOOL, eval_passkey, "eval-passkey", 0, 0, 0, "passkey retrieval (docs/model.md §8.2), like --eval-niah; OUT/passkey.json") \
    F(STR, passkey_lengths, "passkey-lengths", "", 0, 0, "--eval-passkey: prompt lengths in tokens, comma-separated; empty = 1, 2, 4 and 8 times the training context") \
    F(INT, passkey_trials, "passkey-trials", 10, 1, 65536, "--eval-passkey: keys (and depths) per length, drawn from --seed") \
    F(STR, eval_mc, "eval-mc", "", 0, 0, "multiple choice by log-likelihood (docs/model.md §8.3) of a JSONL file (HellaSwag's validation file, or {context, choices, label}), like --eval-niah; OUT/mc.jsonl, OUT/mc.json") \
    F(STR, eval_mqar, "eval-mqar", "", 0, 0, "associative recall (docs/model.md §8.4): accuracy on the answers of DIR/test.bin, a `fox_data mqar` directory; OUT/mqar_result.json") \
    F(INT, eval_batch, "eval-batch", 8, 1, 1 << 20, "sequences per forward of --eval-mc and --eval-mqar") \
    F(BOOL, mqar_loss, "mqar-loss", 0, 0, 0, "train on the answers alone (Zoology's loss; docs/model.md §8.4): the loss and its gradient count only the answer positions of the --eval-mqar set, whose train.bin --train is")

typedef struct {
#define FOX_ARG_STR const char *
#define FOX_ARG_INT int
#define FOX_ARG_I64 long long
#define FOX_ARG_FLT double
#define FOX_ARG_SW int
#define FOX_ARG_FG int
#define FOX_ARG_BOOL int
#define F(kind, field, flag, dflt, lo, hi, help) FOX_ARG_##kind field;
    FOX_FLAGS(F)
#undef F
} FoxArgs;

static inline void fox_args_defaults(FoxArgs *a) {
#define F(kind, field, flag, dflt, lo, hi, help) a->field = dflt;
    FOX_FLAGS(F)
#undef F
}

// The default as --help shows it: a switch's unset value is the preset's, a boolean is on or off.
static inline const char *fox_args_default_text(const char *kind, const char *dflt) {
    if (!strcmp(dflt, "-1")) return "(preset)";
    if (!strcmp(kind, "BOOL")) return strcmp(dflt, "0") ? "on" : "off";
    return dflt;
}

static inline void fox_args_help(const char *prog) {
    printf("usage: %s [--flag value ...]   (also --flag=value; a boolean: --flag, --flag on|off|1|0|true|false)\n\n", prog);
#define F(kind, field, flag, dflt, lo, hi, help) \
    printf("  --%-20s %-22s %s\n", flag, fox_args_default_text(#kind, #dflt), help);
    FOX_FLAGS(F)
#undef F
    printf("  --%-20s %-22s %s\n", "help", "", "print this and exit");
}

// A bad command line: one line "error: ..." on stderr, exit status FOX_EXIT_USAGE.
static inline FOX_NORETURN FOX_PRINTF(1, 2) void fox_usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fox_vfatal(FOX_EXIT_USAGE, fmt, ap);
}

static inline FOX_NORETURN void fox_arg_error(const char *flag, const char *value, const char *what) {
    fox_usage_error("--%s %s: %s", flag, value, what);
}

static inline long long fox_parse_i64(const char *flag, const char *s) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || errno) fox_arg_error(flag, s, "expected an integer");
    long long mult = 1;
    if (!strcmp(end, "K") || !strcmp(end, "k")) mult = 1000LL;
    else if (!strcmp(end, "M")) mult = 1000000LL;
    else if (!strcmp(end, "G")) mult = 1000000000LL;
    else if (!strcmp(end, "Ki")) mult = 1LL << 10;
    else if (!strcmp(end, "Mi")) mult = 1LL << 20;
    else if (!strcmp(end, "Gi")) mult = 1LL << 30;
    else if (*end) fox_arg_error(flag, s, "expected an integer (suffixes K M G Ki Mi Gi)");
    if (v > LLONG_MAX / mult || v < LLONG_MIN / mult) fox_arg_error(flag, s, "out of range");
    return v * mult;
}

static inline double fox_parse_flt(const char *flag, const char *s) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !isfinite(v)) fox_arg_error(flag, s, "expected a number");
    return v;
}

// One of on/off/1/0/true/false, or -1 when s is none of them.
static inline int fox_bool_word(const char *s) {
    if (!strcmp(s, "on") || !strcmp(s, "1") || !strcmp(s, "true")) return 1;
    if (!strcmp(s, "off") || !strcmp(s, "0") || !strcmp(s, "false")) return 0;
    return -1;
}

static inline int fox_parse_bool(const char *flag, const char *s) {
    int b = fox_bool_word(s);
    if (b < 0) fox_arg_error(flag, s, "expected on, off, 1, 0, true or false");
    return b;
}

static inline int fox_parse_fg(const char *flag, const char *s) {
    if (!strcmp(s, "data-dependent")) return FOX_FG_DATA_DEPENDENT;
    if (!strcmp(s, "data-independent")) return FOX_FG_DATA_INDEPENDENT;
    if (!strcmp(s, "fixed")) return FOX_FG_FIXED;
    if (!strcmp(s, "none")) return FOX_FG_NONE;
    fox_arg_error(flag, s, "expected data-dependent, data-independent, fixed or none");
}

// A number outside the flag's [lo, hi] (lo FOX_OPEN_LO: must be positive) is a one-line error.
static inline void fox_check_range(const char *flag, const char *s, double v, double lo, double hi) {
    char what[96];
    if (v >= lo && v <= hi) return;
    if (lo == FOX_OPEN_LO) snprintf(what, sizeof(what), "must be positive and at most %g", hi);
    else snprintf(what, sizeof(what), "must be between %.15g and %.15g", lo, hi);
    fox_arg_error(flag, s, what);
}

// Parses argv into a; prints help and exits 0 on --help; one-line error and exit 1 on bad input.
static inline void fox_args_parse(FoxArgs *a, int argc, char **argv) {
    fox_args_defaults(a);
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) { fox_args_help(argv[0]); exit(0); }
        if (strncmp(arg, "--", 2)) fox_usage_error("unexpected argument %s (see --help)", arg);
        char name[64];
        const char *eq = strchr(arg, '=');
        size_t len = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
        if (len >= sizeof(name)) fox_usage_error("unknown flag %s (see --help)", arg);
        memcpy(name, arg + 2, len);
        name[len] = 0;
        int matched = 0;
#define FOX_TAKE_VALUE(flag) \
    const char *val = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL); \
    if (!val) fox_usage_error("--%s needs a value", flag);
#define FOX_SET_STR(field, flag, lo, hi) { FOX_TAKE_VALUE(flag) a->field = val; }
#define FOX_SET_INT(field, flag, lo, hi) { FOX_TAKE_VALUE(flag) long long v = fox_parse_i64(flag, val); \
    fox_check_range(flag, val, (double)v, lo, hi); a->field = (int)v; }
#define FOX_SET_I64(field, flag, lo, hi) { FOX_TAKE_VALUE(flag) a->field = fox_parse_i64(flag, val); \
    fox_check_range(flag, val, (double)a->field, lo, hi); }
#define FOX_SET_FLT(field, flag, lo, hi) { FOX_TAKE_VALUE(flag) a->field = fox_parse_flt(flag, val); \
    fox_check_range(flag, val, a->field, lo, hi); }
#define FOX_SET_FG(field, flag, lo, hi) { FOX_TAKE_VALUE(flag) a->field = fox_parse_fg(flag, val); }
/* A boolean's value is =V, or the next argument unless that is a flag; a bare boolean is on. */
#define FOX_SET_BOOL(field, flag, lo, hi) { \
    if (eq) a->field = fox_parse_bool(flag, eq + 1); \
    else if (i + 1 < argc && strncmp(argv[i + 1], "--", 2)) a->field = fox_parse_bool(flag, argv[++i]); \
    else a->field = 1; }
#define FOX_SET_SW FOX_SET_BOOL
#define F(kind, field, flag, dflt, lo, hi, help) \
    if (!matched && !strcmp(name, flag)) { matched = 1; FOX_SET_##kind(field, flag, lo, hi) }
        FOX_FLAGS(F)
#undef F
        if (!matched) fox_usage_error("unknown flag %s (see --help)", arg);
    }
    if (a->min_lr > a->lr) fox_usage_error("--min-lr %g exceeds --lr %g", a->min_lr, a->lr);
    if (a->prompt[0] && a->prompt_file[0]) fox_usage_error("--prompt and --prompt-file: give one of them");
    if (a->generate && a->eval_only) fox_usage_error("--generate and --eval-only: give one of them");
}

// The model config the arguments describe: preset first, then sizes, then explicit switches.
static inline FoxConfig fox_args_config(const FoxArgs *a) {
    FoxConfig cfg;
    fox_config_defaults(&cfg);
    cfg.vocab_size = a->vocab;
    cfg.n_layer = a->layers;
    cfg.d_model = a->dim;
    cfg.n_head = a->heads;
    if (!fox_config_apply_preset(&cfg, a->model))
        fox_arg_error("model", a->model, "unknown preset (fox-pro, fox-llama, transformer-pro, transformer-llama, gsa, transformer-fam, fox-fam)");
    if (a->mlp_hidden > 0) cfg.mlp_hidden = a->mlp_hidden;
    if (a->forget_gate >= 0) cfg.forget_gate = a->forget_gate;
    if (a->rope >= 0) cfg.rope = a->rope;
    if (a->qk_norm >= 0) cfg.qk_norm = a->qk_norm;
    if (a->qk_norm_shared >= 0) cfg.qk_norm_shared = a->qk_norm_shared;
    if (a->kv_shift >= 0) cfg.kv_shift = a->kv_shift;
    if (a->output_gate >= 0) cfg.output_gate = a->output_gate;
    if (a->output_norm >= 0) cfg.output_norm = a->output_norm;
    cfg.t_min = (float)a->t_min;
    cfg.t_max = (float)a->t_max;
    cfg.rope_theta = (float)a->rope_theta;
    if (cfg.arch == FOX_ARCH_GSA) {  // other models keep the defaults, so their checkpoints compare equal
        cfg.n_head = cfg.gsa_heads = a->gsa_heads;  // GSA's heads are --gsa-heads
        cfg.gsa_slots = a->gsa_slots;
        cfg.gsa_tau = (float)a->gsa_tau;
    }
    if (cfg.arch == FOX_ARCH_FAM) {
        cfg.fam_block = a->fam_block;
        cfg.fam_memory = a->fam_memory;
        cfg.fam_window_blocks = a->fam_window_blocks;
    }
    const char *bad = fox_config_invalid(&cfg);
    if (bad) fox_usage_error("invalid model: %s", bad);
    return cfg;
}

#endif
