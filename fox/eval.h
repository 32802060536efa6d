// fox/eval.h: what the models are for (docs/model.md §8): needle in a haystack (--eval-niah), passkey
// retrieval (--eval-passkey), multiple choice by log-likelihood (--eval-mc) and multi-query associative
// recall (--eval-mqar). fox/run.h runs them with --eval-only and every --eval-every steps of training;
// each task has its own forward-only model (made before the training model, so the device memory both
// need is known before the first step), into which the weights being evaluated are copied.
//
// Every input is checked, and every prompt and item built, by evals_init: bad input stops the run before
// any model exists. The ranks share each task's work (lengths, batches, examples) and meet in float64
// all-reduces; a stop signal ends a task at the next batch on every rank, writing nothing.
#ifndef FOX_EVAL_H
#define FOX_EVAL_H

#include <glob.h>
#include <signal.h>
#include <time.h>
#include "config.h"
#include "args.h"
#include "dist.h"
#include "io.h"
#include "json.h"
#include "mqar.h"
#include "passkey.h"   // TokenList, fox_encode_text; FoxPasskeyText, fox_passkey_prompt: shared with fox_data passkey
#include "rng.h"
#include "watchdog.h"  // fox_watchdog_alive: each batch is a sign of progress
#include "trainer.h"
#include "../dataloader.h"
#include "../tokenizer.h"

#define FOX_PASSKEY_NEW_TOKENS 8

// The FoX repository's eval/niah strings (its config-prompt-{standard,easy}.yaml and prompt.py): the
// standard needle states the fact; the easy one also holds the question, so retrieval is copying.
#define FOX_NIAH_NEEDLE "\nThe best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.\n"
#define FOX_NIAH_NEEDLE_EASY "\nWhat is the best thing to do in San Francisco? Answer: The best thing to do in San Francisco is " \
                             "eat a sandwich and sit in Dolores Park on a sunny day.\n"
#define FOX_NIAH_QUESTION "What is the best thing to do in San Francisco? Answer: The best thing to do in San Francisco is"
#define FOX_NIAH_SUFFIX "\n\nThere is an important piece of information hidden inside the above document. Now that you've " \
                        "read the document, I will quiz you about it. Answer the following question: "
// The scored words of the answer "eat a sandwich and sit in Dolores Park on a sunny day" (its function words left out).
static const char *const fox_niah_words[] = {"eat", "sandwich", "sit", "dolores", "park", "sunny", "day"};
#define FOX_NIAH_WORDS 7

// A task's forward-only model, for `batch` sequences of up to `len` tokens (and `gen` generated ones).
typedef struct {
    Model *m;
    int batch, len, gen;
} TaskModel;

typedef struct {
    int on, easy, n_lengths, n_depths, new_tokens;
    int *lengths, *depths;
    TokenList hay, needle, suffix;  // the haystack (as long as the longest prompt needs), needle, question
    int period;                     // the token "." (a needle goes after one)
    TaskModel tm;
} NiahTask;

typedef struct {
    int on, n_lengths, trials;
    int *lengths;
    FoxPasskeyText text;
    TaskModel tm;
} PasskeyTask;

// One continuation of a multiple-choice item as one row: [start] + context (cut from the left to fit) +
// choice, whose log-likelihood is the sum of the losses at its positions (docs/model.md §8.3).
typedef struct {
    int *ids, n;          // the row's tokens (n + 1 of them: inputs ids[0, n), targets ids[1, n + 1))
    int item, choice, first, count;  // the choice's targets are positions [first, first + count)
    int cut;              // whether the context lost its oldest tokens to fit
    long long bytes;      // its text's length in bytes (token items: its token count), for acc_norm
} McRow;

typedef struct {
    int on, n_items, n_rows, *labels, *row_of;  // row_of[i]: item i's first row (its choices follow)
    McRow *rows;
    int *order;           // rows by length, longest first (a batch's rows have similar lengths)
    TaskModel tm;
} McTask;

typedef struct {
    int on;
    FoxMqar mq;
    char test[4352];
    long long examples;
    TaskModel tm;
} MqarTask;

typedef struct {
    const FoxArgs *a;
    const FoxConfig *cfg;
    Dist dist;             // the ranks, which share the work
    volatile sig_atomic_t *stop;
    int context;           // the evaluation context: the training one (or --eval-seq-len)
    int train_seq_len;     // the checkpoint's training context, for the result files (0: unknown)
    Tokenizer tok;
    int has_tok;
    NiahTask niah;
    PasskeyTask pk;
    McTask mc;
    MqarTask mqar;
} Evals;

// What one evaluation found, for log.jsonl (NAN: the task did not run).
typedef struct {
    double niah, passkey, mc_acc, mc_acc_norm, mqar;
} EvalScores;

static inline int evals_any(const FoxArgs *a) {
    return a->eval_niah || a->eval_passkey || a->eval_mc[0] || a->eval_mqar[0];
}

// ---- Shared pieces ----

static inline double eval_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline TokenList eval_encode(const Evals *e, const char *text) { return fox_encode_text(&e->tok, text); }

// GPT-2's tokenizer (--tokenizer PATH) into t, or one line naming the file and what is wrong with it: the
// evaluation tasks' and generation's (fox/generate.h).
static inline void fox_load_gpt2_tokenizer(Tokenizer *t, const char *path) {
    const char *why = NULL;
    if (!tokenizer_load(t, path, &why)) fox_fatal("cannot load the GPT-2 tokenizer %s (--tokenizer): %s", path, why);
}

static inline int eval_start_token(const FoxConfig *cfg) { return FOX_EOT < cfg->vocab_size ? FOX_EOT : 0; }

static inline int eval_argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

// Whether any rank was signalled to stop (every rank calls it at the same point of a task).
static inline int evals_stopped(Evals *e) {
    fox_watchdog_alive();
    double s = *e->stop;
    dist_allreduce_max_f64(&e->dist, &s, 1);
    return (int)s;
}

// Rounds of a task's `units` shared round-robin by the ranks: every rank takes part in each round.
static inline int eval_rounds(const Evals *e, int units) { return (units + e->dist.world - 1) / e->dist.world; }

// The text of ids (up to an <|endoftext|>), as a NUL-terminated string.
static inline char *eval_text(const Evals *e, const int *ids, int n) {
    int len = 0;
    while (len < n && ids[len] >= 0 && ids[len] != FOX_EOT) len++;
    size_t bytes;
    char *text = tokenizer_decode(&e->tok, ids, (size_t)len, &bytes);
    if (!text) fox_fatal("cannot decode generated tokens (out of memory)");
    return text;
}

// Greedy continuation of the task model's batch of prompts (batch x L tokens): n tokens each into out
// (batch x n). The cache is made anew for each length, so a prompt's answer is that of a fresh model.
static inline void eval_greedy(TaskModel *tm, const int *prompts, int L, int n, int *out, int V) {
    float *logits = (float *)fox_malloc((size_t)tm->batch * V * sizeof(float));
    int *next = (int *)fox_malloc((size_t)tm->batch * sizeof(int));
    run_model_cache_init(tm->m, L + n);
    run_model_prefill(tm->m, prompts, L, logits);
    for (int i = 0; i < n; i++) {
        if (i) run_model_decode(tm->m, next, logits);
        for (int b = 0; b < tm->batch; b++) next[b] = out[(size_t)b * n + i] = eval_argmax(logits + (size_t)b * V, V);
    }
    free(logits);
    free(next);
}

// ACP's pruned share of the last prefill's attention tiles (NAN without ACP).
static inline double eval_acp_pruned(TaskModel *tm, const FoxConfig *cfg) {
    size_t lh = (size_t)cfg->n_layer * cfg->n_head;
    long long *live = (long long *)fox_calloc(lh, sizeof(long long)), tiles = 0;
    double pruned = NAN;
    if (run_model_acp_tiles(tm->m, live, &tiles) && tiles > 0) {
        double sum = 0.0;
        for (size_t i = 0; i < lh; i++) sum += (double)live[i];
        pruned = 1.0 - sum / ((double)tiles * (double)lh);
    }
    free(live);
    return pruned;
}

static inline void eval_json_step(FILE *f, const Evals *e, int step) {
    if (step >= 0) fprintf(f, "\"step\": %d, ", step);
    else fprintf(f, "\"step\": null, ");
    if (e->train_seq_len > 0) fprintf(f, "\"train_seq_len\": %d, ", e->train_seq_len);
    else fprintf(f, "\"train_seq_len\": null, ");
}

static inline void eval_json_number(FILE *f, double x) {
    if (isfinite(x)) fprintf(f, "%.10g", x);
    else fprintf(f, "null");
}

// n evenly spaced integers from lo to hi, rounded (numpy's round(linspace)), repeats dropped.
static inline int eval_linspace(int lo, int hi, int n, int *out) {
    int count = 0;
    for (int i = 0; i < n; i++) {
        double x = n == 1 ? lo : lo + (double)(hi - lo) * i / (n - 1);
        int v = (int)nearbyint(x);
        if (!count || out[count - 1] != v) out[count++] = v;
    }
    return count;
}

// A forward's length: TransformerFAM's in whole blocks (docs/model.md §1.10), the others' as they are.
static inline int eval_forward_len(const Evals *e, int len) {
    int blk = e->cfg->arch == FOX_ARCH_FAM ? e->cfg->fam_block : 1;
    return (len + blk - 1) / blk * blk;
}

static inline TaskModel eval_task_shape(const Evals *e, int batch, int len, int gen) {
    TaskModel tm = {NULL, batch, eval_forward_len(e, len), gen};
    return tm;
}

// ---- A generation task's grid (NIAH, passkey) ----

// Prompt j of length L into out (L tokens); returns the position of what is to be retrieved.
typedef int (*EvalPromptFn)(const Evals *e, int L, int j, int *out);
// The score of the answer text to prompt j of length L.
typedef double (*EvalScoreFn)(const Evals *e, int L, int j, const char *text);

// Per length, the task model's batch of prompts (per of them) and their greedy answers, every rank's cells
// gathered (each rank fills its own, the sums put them together).
typedef struct {
    int nl, per, n;      // lengths, prompts per length, tokens generated per prompt
    double *score;       // per cell (length-major)
    double *gen;         // per cell, its n tokens + 1 (0: none)
    double *pos;         // per cell, the retrieved item's position
    double *pruned;      // per length, ACP's pruned share of the prompts' tiles (NAN without ACP)
    double mean;         // of the scores
} EvalGrid;

static inline void eval_grid_free(EvalGrid *g) {
    free(g->score); free(g->gen); free(g->pos); free(g->pruned);
}

// The grid of the task model's lengths (shared round-robin by the ranks); *stopped: the stop signal that
// ended it (the grid then holds no result).
static inline EvalGrid eval_grid(Evals *e, TaskModel *tm, const int *lengths, int nl, EvalPromptFn prompt, EvalScoreFn score,
                                 int *stopped) {
    int V = e->cfg->vocab_size, per = tm->batch, n = tm->gen;
    size_t cells = (size_t)nl * per;
    EvalGrid g = {nl, per, n, (double *)fox_calloc(cells, sizeof(double)), (double *)fox_calloc(cells * n, sizeof(double)),
                  (double *)fox_calloc(cells, sizeof(double)), (double *)fox_calloc((size_t)nl, sizeof(double)), NAN};
    int *prompts = (int *)fox_malloc((size_t)per * tm->len * sizeof(int)), *ids = (int *)fox_malloc((size_t)per * n * sizeof(int));
    for (int r = 0; r < eval_rounds(e, nl); r++) {
        int li = r * e->dist.world + e->dist.rank;
        if (li < nl) {
            int L = lengths[li];
            for (int j = 0; j < per; j++) g.pos[(size_t)li * per + j] = prompt(e, L, j, prompts + (size_t)j * L);
            eval_greedy(tm, prompts, L, n, ids, V);
            g.pruned[li] = eval_acp_pruned(tm, e->cfg);
            for (int j = 0; j < per; j++) {
                size_t c = (size_t)li * per + j;
                char *text = eval_text(e, ids + (size_t)j * n, n);
                g.score[c] = score(e, L, j, text);
                free(text);
                for (int i = 0; i < n; i++) g.gen[c * n + i] = ids[(size_t)j * n + i] + 1;
            }
        }
        if ((*stopped = evals_stopped(e))) break;
    }
    free(prompts);
    free(ids);
    if (*stopped) return g;
    dist_allreduce_sum_f64(&e->dist, g.score, cells);
    dist_allreduce_sum_f64(&e->dist, g.gen, cells * n);
    dist_allreduce_sum_f64(&e->dist, g.pos, cells);
    dist_allreduce_sum_f64(&e->dist, g.pruned, (size_t)nl);
    g.mean = 0.0;
    for (size_t c = 0; c < cells; c++) g.mean += g.score[c] / cells;
    return g;
}

static inline void eval_json_ints(FILE *f, const char *key, const int *x, int n) {
    fprintf(f, "%s: [", key);
    for (int i = 0; i < n; i++) fprintf(f, "%s%d", i ? ", " : "", x[i]);
    fprintf(f, "]");
}

// A grid file's end: "acp_pruned", "mean", and the opening of "cells".
static inline void eval_json_grid_tail(FILE *f, const EvalGrid *g) {
    fprintf(f, "], \"acp_pruned\": [");
    for (int i = 0; i < g->nl; i++) { fprintf(f, "%s", i ? ", " : ""); eval_json_number(f, g->pruned[i]); }
    fprintf(f, "], \"mean\": %.6g, \"cells\": [", g->mean);
}

// Cell c's generated text as a JSON string.
static inline void eval_json_cell_text(FILE *f, const Evals *e, const EvalGrid *g, size_t c) {
    int *ids = (int *)fox_malloc((size_t)g->n * sizeof(int));
    for (int i = 0; i < g->n; i++) ids[i] = (int)g->gen[c * g->n + i] - 1;
    char *text = eval_text(e, ids, g->n);
    fox_json_write_string(f, text, strlen(text));
    fprintf(f, "}");
    free(text);
    free(ids);
}

// ---- Needle in a haystack (docs/model.md §8.1) ----

// The text of every .txt file in dir (sorted by name), concatenated.
static inline char *niah_read_haystack(const char *dir, size_t *len) {
    char pattern[4352];
    snprintf(pattern, sizeof(pattern), "%s/*.txt", dir);
    glob_t g;
    int rc = glob(pattern, 0, NULL, &g);
    if (rc == GLOB_NOMATCH) fox_usage_error("--niah-haystack %s holds no .txt file", dir);
    if (rc) fox_fatal("--niah-haystack %s: cannot list its files", dir);
    char *text = (char *)fox_malloc(1);
    size_t n = 0;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        size_t part;
        char *t = fox_read_file(g.gl_pathv[i], &part);
        if (!t) fox_fatal("cannot read %s: %s", g.gl_pathv[i], strerror(errno));
        text = (char *)fox_realloc(text, n + part + 1);
        memcpy(text + n, t, part);
        n += part;
        free(t);
    }
    globfree(&g);
    text[n] = 0;
    *len = n;
    return text;
}

// The tokens a prompt of `max_len` needs from the haystack: its text's tokens, repeated as needed.
static inline TokenList niah_haystack_tokens(const Evals *e, const char *dir, int need) {
    size_t len, n;
    char *text = niah_read_haystack(dir, &len);
    int *ids = tokenizer_encode(&e->tok, text, len, &n, 0);
    if (!ids) fox_fatal("cannot encode the haystack (out of memory)");
    free(text);
    if (n == 0) fox_usage_error("--niah-haystack %s holds no text (its .txt files are empty)", dir);
    TokenList t = {(int *)fox_malloc((size_t)(need > 0 ? need : 1) * sizeof(int)), need};
    for (int i = 0; i < need; i++) t.ids[i] = ids[(size_t)i % n];
    free(ids);
    return t;
}

// The prompt of length L with the needle at depth percent: <|endoftext|>, the haystack's first tokens with
// the needle inserted after the last "." at or before depth% of them (at the end for 100%, as the FoX
// repository's prompt.py), then the question. Returns the needle's position.
static inline int niah_prompt(const NiahTask *t, int L, int depth, int *out) {
    int n = L - 1 - t->needle.n - t->suffix.n;
    int pos = depth >= 100 ? n : (int)((long long)n * depth / 100);
    while (depth < 100 && pos > 0 && t->hay.ids[pos - 1] != t->period) pos--;
    out[0] = FOX_EOT;
    memcpy(out + 1, t->hay.ids, (size_t)pos * sizeof(int));
    memcpy(out + 1 + pos, t->needle.ids, (size_t)t->needle.n * sizeof(int));
    memcpy(out + 1 + pos + t->needle.n, t->hay.ids + pos, (size_t)(n - pos) * sizeof(int));
    memcpy(out + 1 + n + t->needle.n, t->suffix.ids, (size_t)t->suffix.n * sizeof(int));
    return 1 + pos;
}

// The score of an answer: the share of the answer's words (fox_niah_words) among the text's words
// (lower case, split at anything but a letter).
static inline double niah_score(const char *text) {
    int found[FOX_NIAH_WORDS] = {0};
    char word[32];
    size_t n = 0;
    for (const char *p = text;; p++) {
        int c = (unsigned char)*p;
        if (isalpha(c) && c < 128) {
            if (n + 1 < sizeof(word)) word[n++] = (char)tolower(c);
            continue;
        }
        word[n] = 0;
        for (int w = 0; n && w < FOX_NIAH_WORDS; w++)
            if (!strcmp(word, fox_niah_words[w])) found[w] = 1;
        n = 0;
        if (!c) break;
    }
    int hits = 0;
    for (int w = 0; w < FOX_NIAH_WORDS; w++) hits += found[w];
    return (double)hits / FOX_NIAH_WORDS;
}

static inline void niah_init(Evals *e) {
    const FoxArgs *a = e->a;
    NiahTask *t = &e->niah;
    t->on = 1;
    if (strcmp(a->niah_mode, "standard") && strcmp(a->niah_mode, "easy"))
        fox_arg_error("niah-mode", a->niah_mode, "expected standard or easy");
    t->easy = !strcmp(a->niah_mode, "easy");
    t->needle = eval_encode(e, t->easy ? FOX_NIAH_NEEDLE_EASY : FOX_NIAH_NEEDLE);
    t->suffix = eval_encode(e, FOX_NIAH_SUFFIX FOX_NIAH_QUESTION);
    TokenList dot = eval_encode(e, ".");
    t->period = dot.ids[0];
    free(dot.ids);
    int hi = a->niah_max_len ? a->niah_max_len : e->context, lo = a->niah_min_len ? a->niah_min_len : hi / a->niah_lengths;
    int least = t->needle.n + t->suffix.n + 2;  // <|endoftext|>, the needle, the question and a haystack token
    if (hi < least)
        fox_usage_error("--eval-niah: the longest prompt, %d tokens (--niah-max-len, default the training context), is "
                        "shorter than the %d a prompt needs (the needle and the question take %d)", hi, least, least - 2);
    if (lo < least && a->niah_min_len)
        fox_usage_error("--niah-min-len %d: a prompt needs at least %d tokens (the needle and the question take %d)", lo,
                        least, least - 2);
    if (lo < least) lo = least;
    if (lo > hi) fox_usage_error("--niah-min-len %d exceeds the longest context %d (--niah-max-len)", lo, hi);
    t->lengths = (int *)fox_malloc((size_t)a->niah_lengths * sizeof(int));
    t->depths = (int *)fox_malloc((size_t)a->niah_depths * sizeof(int));
    t->n_lengths = eval_linspace(lo, hi, a->niah_lengths, t->lengths);
    t->n_depths = eval_linspace(0, 100, a->niah_depths, t->depths);
    t->new_tokens = a->niah_tokens;
    t->hay = niah_haystack_tokens(e, a->niah_haystack, hi);
    t->tm = eval_task_shape(e, t->n_depths, hi, t->new_tokens);
}

static inline int niah_grid_prompt(const Evals *e, int L, int j, int *out) { return niah_prompt(&e->niah, L, e->niah.depths[j], out); }

static inline double niah_grid_score(const Evals *e, int L, int j, const char *text) {
    (void)e; (void)L; (void)j;
    return niah_score(text);
}

// The grid, one batch of depths per length: OUT/niah.json. Returns the mean score, or NAN when stopped
// (*stopped set).
static inline double niah_run(Evals *e, int step, const char *out, int *stopped) {
    NiahTask *t = &e->niah;
    EvalGrid g = eval_grid(e, &t->tm, t->lengths, t->n_lengths, niah_grid_prompt, niah_grid_score, stopped);
    if (*stopped) { eval_grid_free(&g); return NAN; }
    if (e->dist.rank == 0 && out) {
        char tmp[4400];
        FILE *f = fox_open_tmp(out, "niah.json", tmp, sizeof(tmp));
        const char *needle = t->easy ? FOX_NIAH_NEEDLE_EASY : FOX_NIAH_NEEDLE;
        fprintf(f, "{\"task\": \"niah\", \"mode\": \"%s\", ", t->easy ? "easy" : "standard");
        eval_json_step(f, e, step);
        fprintf(f, "\"new_tokens\": %d, \"needle\": ", g.n);
        fox_json_write_string(f, needle, strlen(needle));
        fprintf(f, ", \"question\": ");
        fox_json_write_string(f, FOX_NIAH_QUESTION, strlen(FOX_NIAH_QUESTION));
        eval_json_ints(f, ", \"lengths\"", t->lengths, g.nl);
        eval_json_ints(f, ", \"depths\"", t->depths, g.per);
        fprintf(f, ", \"score\": [");
        for (int i = 0; i < g.nl; i++) {
            fprintf(f, "%s[", i ? ", " : "");
            for (int d = 0; d < g.per; d++) fprintf(f, "%s%.6g", d ? ", " : "", g.score[(size_t)i * g.per + d]);
            fprintf(f, "]");
        }
        eval_json_grid_tail(f, &g);
        for (size_t c = 0; c < (size_t)g.nl * g.per; c++) {
            fprintf(f, "%s\n  {\"length\": %d, \"depth\": %d, \"needle_pos\": %.0f, \"score\": %.6g, \"text\": ", c ? "," : "",
                    t->lengths[c / g.per], t->depths[c % g.per], g.pos[c], g.score[c]);
            eval_json_cell_text(f, e, &g, c);
        }
        fprintf(f, "]}\n");
        fox_commit_tmp(f, tmp);
    }
    double mean = g.mean;
    eval_grid_free(&g);
    return mean;
}

// ---- Passkey retrieval (docs/model.md §8.2) ----

// The passkey of (length, trial) and the share of the filler before it: pure functions of --seed.
// Trial k of length L is draw pair (L 2^23 + k): draws L 2^24 + 2k and + 1 (docs/model.md §8.2).
static inline int passkey_key(const Evals *e, int L, int trial) {
    return fox_passkey_key(fox_rng_key((uint64_t)e->a->seed, FOX_STREAM_PASSKEY), ((uint64_t)L << 23) + (uint64_t)trial);
}

static inline double passkey_depth(const Evals *e, int L, int trial) {
    return fox_passkey_depth(fox_rng_key((uint64_t)e->a->seed, FOX_STREAM_PASSKEY), ((uint64_t)L << 23) + (uint64_t)trial);
}

// The prompt of length L (fox/passkey.h): the key's line at a random depth of the filler. Returns the key
// line's position.
static inline int passkey_prompt(const Evals *e, int L, int trial, int *out) {
    TokenList line = fox_passkey_line(&e->tok, passkey_key(e, L, trial));
    int at = fox_passkey_prompt(&e->pk.text, &line, L, passkey_depth(e, L, trial), out);
    if (at < 0) fox_fatal("a passkey prompt of %d tokens is too short for its fixed tokens", L);
    free(line.ids);
    return at;
}

// Whether the answer's first number is the key.
static inline int passkey_correct(const char *text, int key) {
    const char *p = text;
    while (*p && !isdigit((unsigned char)*p)) p++;
    if (!*p) return 0;
    char *end;
    errno = 0;
    long v = strtol(p, &end, 10);
    return errno == 0 && end - p == 5 && v == key;
}

// --passkey-lengths: a comma-separated list, or (empty) 1, 2, 4 and 8 times the context.
static inline int passkey_lengths(const Evals *e, int *out, int cap) {
    const char *s = e->a->passkey_lengths;
    if (!s[0]) {
        for (int i = 0; i < 4; i++) out[i] = e->context << i;
        return 4;
    }
    int n = 0;
    for (const char *p = s;; p++) {  // digits, then a comma and more digits, or the end
        long v = 0;
        const char *start = p;
        while (isdigit((unsigned char)*p) && v <= (1 << 24)) v = 10 * v + (*p++ - '0');
        if (p == start || v < 1 || v > (1 << 24) || (*p && *p != ','))
            fox_arg_error("passkey-lengths", s, "expected lengths in tokens (1 to 16777216) separated by commas, e.g. 1024,2048");
        if (n == cap) fox_arg_error("passkey-lengths", s, "too many lengths");
        out[n++] = (int)v;
        if (!*p) return n;
    }
}

static inline void passkey_init(Evals *e) {
    PasskeyTask *t = &e->pk;
    t->on = 1;
    t->trials = e->a->passkey_trials;
    t->text = fox_passkey_text(&e->tok);
    int buf[64], maxL = 0;
    t->n_lengths = passkey_lengths(e, buf, 64);
    t->lengths = (int *)fox_malloc((size_t)t->n_lengths * sizeof(int));
    int least = fox_passkey_fixed_tokens(&t->text);
    for (int i = 0; i < t->n_lengths; i++) {
        t->lengths[i] = buf[i];
        if (buf[i] < least)
            fox_usage_error("--passkey-lengths: %d tokens is shorter than the prompt's fixed part (%d tokens)", buf[i], least);
        if (buf[i] > maxL) maxL = buf[i];
    }
    t->tm = eval_task_shape(e, t->trials, maxL, FOX_PASSKEY_NEW_TOKENS);
}

static inline double passkey_grid_score(const Evals *e, int L, int j, const char *text) {
    return passkey_correct(text, passkey_key(e, L, j));
}

// Each length's trials as one batch: OUT/passkey.json. Returns the accuracy over all trials, or NAN when
// stopped.
static inline double passkey_run(Evals *e, int step, const char *out, int *stopped) {
    PasskeyTask *t = &e->pk;
    EvalGrid g = eval_grid(e, &t->tm, t->lengths, t->n_lengths, passkey_prompt, passkey_grid_score, stopped);
    if (*stopped) { eval_grid_free(&g); return NAN; }
    if (e->dist.rank == 0 && out) {
        char tmp[4400];
        FILE *f = fox_open_tmp(out, "passkey.json", tmp, sizeof(tmp));
        fprintf(f, "{\"task\": \"passkey\", ");
        eval_json_step(f, e, step);
        fprintf(f, "\"trials\": %d, \"seed\": %lld", g.per, (long long)e->a->seed);
        eval_json_ints(f, ", \"lengths\"", t->lengths, g.nl);
        fprintf(f, ", \"accuracy\": [");
        for (int i = 0; i < g.nl; i++) {
            double acc = 0.0;
            for (int k = 0; k < g.per; k++) acc += g.score[(size_t)i * g.per + k];
            fprintf(f, "%s%.6g", i ? ", " : "", acc / g.per);
        }
        eval_json_grid_tail(f, &g);
        for (size_t c = 0; c < (size_t)g.nl * g.per; c++) {
            int L = t->lengths[c / g.per], k = (int)(c % g.per);
            fprintf(f, "%s\n  {\"length\": %d, \"trial\": %d, \"key\": \"%d\", \"needle_pos\": %.0f, \"correct\": %.0f, \"text\": ",
                    c ? "," : "", L, k, passkey_key(e, L, k), g.pos[c], g.score[c]);
            eval_json_cell_text(f, e, &g, c);
        }
        fprintf(f, "]}\n");
        fox_commit_tmp(f, tmp);
    }
    double mean = g.mean;
    eval_grid_free(&g);
    return mean;
}

// ---- Multiple choice by log-likelihood (docs/model.md §8.3) ----

// A field of an item as token ids: a string (encoded after a space for a choice, as lm-evaluation-harness
// joins context and continuation) or an array of ids. Returns NULL with why set on bad input.
static inline int *mc_field_ids(const Evals *e, const FoxJsonValue *v, int choice, int *n, long long *bytes, const char **why) {
    *why = NULL;
    if (v->type == FOX_JSON_STRING) {
        if (!e->has_tok) { *why = "is text, which needs the GPT-2 vocabulary (this model has another: give token ids)"; return NULL; }
        size_t len = v->len + (choice ? 1 : 0), count;
        char *s = (char *)fox_malloc(len + 1);
        if (choice) s[0] = ' ';
        memcpy(s + (choice ? 1 : 0), v->string, v->len + 1);
        int *ids = tokenizer_encode(&e->tok, s, len, &count, 0);
        free(s);
        if (!ids) fox_fatal("cannot encode an item (out of memory)");
        *n = (int)count;
        *bytes = (long long)v->len;
        return ids;
    }
    if (v->type != FOX_JSON_ARRAY) { *why = "must be a string or an array of token ids"; return NULL; }
    int *ids = (int *)fox_malloc((size_t)(v->n ? v->n : 1) * sizeof(int));
    for (int i = 0; i < v->n; i++) {
        long long id;
        if (!fox_json_int(&v->items[i], &id) || id < 0 || id >= e->cfg->vocab_size) {
            free(ids);
            *why = "holds something other than a token id of this model's vocabulary";
            return NULL;
        }
        ids[i] = (int)id;
    }
    *n = v->n;
    *bytes = v->n;
    return ids;
}

// An item's row for one choice: [start] + the context's last tokens that fit the context T + the choice.
static inline McRow mc_row(const Evals *e, const int *ctx, int nctx, const int *ch, int nch, long long bytes, int T) {
    int keep = nctx < T - nch ? nctx : T - nch;
    McRow row = {(int *)fox_malloc((size_t)(1 + keep + nch) * sizeof(int)), keep + nch, 0, 0, keep, nch, keep < nctx, bytes};
    row.ids[0] = eval_start_token(e->cfg);
    memcpy(row.ids + 1, ctx + (nctx - keep), (size_t)keep * sizeof(int));
    memcpy(row.ids + 1 + keep, ch, (size_t)nch * sizeof(int));
    return row;
}

// One line naming the file and line: what is wrong (why: a detail, or "").
static inline FOX_NORETURN void mc_bad_item(const char *path, long line, const char *what, const char *why) {
    fox_fatal("%s line %ld: %s%s%s", path, line, what, why[0] ? " " : "", why);
}

// Parses one item (HellaSwag's ctx/endings/label, or context/choices/label) into rows.
static inline void mc_add_item(Evals *e, const FoxJsonValue *item, const char *path, long line, int T) {
    McTask *t = &e->mc;
    if (item->type != FOX_JSON_OBJECT) mc_bad_item(path, line, "is not a JSON object", "");
    const FoxJsonValue *ctx = fox_json_get(item, "ctx"), *choices = fox_json_get(item, "endings"), *label = fox_json_get(item, "label");
    if (!ctx) ctx = fox_json_get(item, "context");
    if (!choices) choices = fox_json_get(item, "choices");
    if (!ctx) mc_bad_item(path, line, "has no context (\"ctx\" or \"context\")", "");
    if (!choices) mc_bad_item(path, line, "has no choices (\"endings\" or \"choices\")", "");
    if (!label) mc_bad_item(path, line, "has no \"label\"", "");
    if (choices->type != FOX_JSON_ARRAY) mc_bad_item(path, line, "its choices are not an array", "");
    if (choices->n < 1) mc_bad_item(path, line, "has no choices", "");
    long long k;
    if (label->type == FOX_JSON_STRING) {  // Hugging Face's copy of HellaSwag writes the label as "0".."3"
        char *end;
        k = strtoll(label->string, &end, 10);
        if (end == label->string || *end) mc_bad_item(path, line, "its label is not an integer", "");
    } else if (!fox_json_int(label, &k)) {
        mc_bad_item(path, line, "its label is not an integer", "");
    }
    if (k < 0 || k >= choices->n) {
        char what[96];
        snprintf(what, sizeof(what), "label %lld is out of range (%d choices)", k, choices->n);
        mc_bad_item(path, line, what, "");
    }
    int nctx, nch;
    long long bytes;
    const char *why;
    int *cids = mc_field_ids(e, ctx, 0, &nctx, &bytes, &why);
    if (!cids) mc_bad_item(path, line, "its context", why);
    t->labels = (int *)fox_realloc(t->labels, (size_t)(t->n_items + 1) * sizeof(int));
    t->row_of = (int *)fox_realloc(t->row_of, (size_t)(t->n_items + 1) * sizeof(int));
    t->labels[t->n_items] = (int)k;
    t->row_of[t->n_items] = t->n_rows;
    t->rows = (McRow *)fox_realloc(t->rows, (size_t)(t->n_rows + choices->n) * sizeof(McRow));
    for (int c = 0; c < choices->n; c++) {
        int *ch = mc_field_ids(e, &choices->items[c], 1, &nch, &bytes, &why);
        char what[64];
        snprintf(what, sizeof(what), "its choice %d", c);
        if (!ch) mc_bad_item(path, line, what, why);
        if (nch == 0 || bytes == 0) mc_bad_item(path, line, what, "is empty");
        if (nch > T) {
            char msg[160];
            snprintf(msg, sizeof(msg), "has %d tokens, more than the context of %d leaves room for", nch, T);
            mc_bad_item(path, line, what, msg);
        }
        McRow row = mc_row(e, cids, nctx, ch, nch, bytes, T);
        row.item = t->n_items;
        row.choice = c;
        t->rows[t->n_rows++] = row;
        free(ch);
    }
    free(cids);
    t->n_items++;
}

typedef struct { int n, row; } McKey;

// Longest first, ties in file order.
static inline int mc_key_order(const void *x, const void *y) {
    const McKey *a = (const McKey *)x, *b = (const McKey *)y;
    return a->n != b->n ? b->n - a->n : a->row - b->row;
}

static inline void mc_init(Evals *e, int T) {
    McTask *t = &e->mc;
    const char *path = e->a->eval_mc;
    t->on = 1;
    size_t len;
    char *text = fox_read_file(path, &len);
    if (!text) fox_fatal("--eval-mc %s: %s", path, strerror(errno));
    long line = 0;
    for (size_t i = 0; i < len;) {
        size_t end = i;
        while (end < len && text[end] != '\n') end++;
        line++;
        size_t s = i;
        while (s < end && isspace((unsigned char)text[s])) s++;
        if (s < end) {
            FoxJsonValue item;
            char err[160];
            if (!fox_json_parse(text + i, end - i, &item, err, sizeof(err))) fox_fatal("%s line %ld: not JSON (%s)", path, line, err);
            mc_add_item(e, &item, path, line, T);
            fox_json_free(&item);
        }
        i = end + 1;
    }
    free(text);
    if (t->n_items == 0) fox_usage_error("--eval-mc %s holds no item", path);
    McKey *keys = (McKey *)fox_malloc((size_t)t->n_rows * sizeof(McKey));
    for (int r = 0; r < t->n_rows; r++) { keys[r].n = t->rows[r].n; keys[r].row = r; }
    qsort(keys, (size_t)t->n_rows, sizeof(McKey), mc_key_order);  // a batch's rows have similar lengths
    t->order = (int *)fox_malloc((size_t)t->n_rows * sizeof(int));
    for (int r = 0; r < t->n_rows; r++) t->order[r] = keys[r].row;
    int longest = keys[0].n;
    free(keys);
    t->tm = eval_task_shape(e, e->a->eval_batch, longest, 0);
}

// Every item's log-likelihoods, batch by batch (batches shared by the ranks): OUT/mc.jsonl (one line per
// item) and OUT/mc.json (the accuracies). Returns the accuracy (*acc_norm: length-normalised), NAN when stopped.
static inline double mc_run(Evals *e, int step, const char *out, int *stopped, double *acc_norm) {
    McTask *t = &e->mc;
    int B = t->tm.batch, nb = (t->n_rows + B - 1) / B;
    double *ll = (double *)fox_calloc((size_t)t->n_rows, sizeof(double));
    int *inputs = (int *)fox_malloc((size_t)B * t->tm.len * sizeof(int)), *targets = (int *)fox_malloc((size_t)B * t->tm.len * sizeof(int));
    for (int r = 0; r < eval_rounds(e, nb); r++) {
        int bi = r * e->dist.world + e->dist.rank;
        if (bi < nb) {
            int first = bi * B, count = t->n_rows - first < B ? t->n_rows - first : B;
            int T = eval_forward_len(e, t->rows[t->order[first]].n);
            memset(inputs, 0, (size_t)count * T * sizeof(int));
            memset(targets, 0, (size_t)count * T * sizeof(int));
            for (int j = 0; j < count; j++) {
                const McRow *row = &t->rows[t->order[first + j]];
                memcpy(inputs + (size_t)j * T, row->ids, (size_t)row->n * sizeof(int));
                memcpy(targets + (size_t)j * T, row->ids + 1, (size_t)row->n * sizeof(int));
            }
            model_forward(t->tm.m, inputs, targets, count, T);
            const float *loss = run_model_losses(t->tm.m);
            for (int j = 0; j < count; j++) {
                const McRow *row = &t->rows[t->order[first + j]];
                double sum = 0.0;
                for (int i = 0; i < row->count; i++) sum -= loss[(size_t)j * T + row->first + i];
                ll[t->order[first + j]] = sum;
            }
        }
        if ((*stopped = evals_stopped(e))) break;
    }
    double acc = NAN;
    *acc_norm = NAN;
    if (!*stopped) {
        dist_allreduce_sum_f64(&e->dist, ll, (size_t)t->n_rows);
        double hits = 0.0, hits_norm = 0.0;
        FILE *f = NULL;
        char tmp[4400];
        if (e->dist.rank == 0 && out) f = fox_open_tmp(out, "mc.jsonl", tmp, sizeof(tmp));
        for (int i = 0; i < t->n_items; i++) {
            int r0 = t->row_of[i], nc = (i + 1 < t->n_items ? t->row_of[i + 1] : t->n_rows) - r0, pred = 0, pred_norm = 0;
            for (int c = 1; c < nc; c++) {
                if (ll[r0 + c] > ll[r0 + pred]) pred = c;
                if (ll[r0 + c] / t->rows[r0 + c].bytes > ll[r0 + pred_norm] / t->rows[r0 + pred_norm].bytes) pred_norm = c;
            }
            hits += pred == t->labels[i];
            hits_norm += pred_norm == t->labels[i];
            if (!f) continue;
            fprintf(f, "{\"index\": %d, \"label\": %d, \"loglik\": [", i, t->labels[i]);
            for (int c = 0; c < nc; c++) fprintf(f, "%s%.17g", c ? ", " : "", ll[r0 + c]);
            fprintf(f, "], \"tokens\": [");
            for (int c = 0; c < nc; c++) fprintf(f, "%s%d", c ? ", " : "", t->rows[r0 + c].count);
            fprintf(f, "], \"bytes\": [");
            for (int c = 0; c < nc; c++) fprintf(f, "%s%lld", c ? ", " : "", t->rows[r0 + c].bytes);
            fprintf(f, "], \"truncated\": [");
            for (int c = 0; c < nc; c++) fprintf(f, "%s%s", c ? ", " : "", t->rows[r0 + c].cut ? "true" : "false");
            fprintf(f, "], \"pred\": %d, \"pred_norm\": %d}\n", pred, pred_norm);
        }
        acc = hits / t->n_items;
        *acc_norm = hits_norm / t->n_items;
        if (f) {
            fox_commit_tmp(f, tmp);
            f = fox_open_tmp(out, "mc.json", tmp, sizeof(tmp));
            fprintf(f, "{\"task\": \"mc\", ");
            eval_json_step(f, e, step);
            fprintf(f, "\"file\": ");
            fox_json_write_string(f, e->a->eval_mc, strlen(e->a->eval_mc));
            fprintf(f, ", \"items\": %d, \"context\": %d, \"acc\": %.6g, \"acc_norm\": %.6g}\n", t->n_items, e->context, acc, *acc_norm);
            fox_commit_tmp(f, tmp);
        }
    }
    free(ll); free(inputs); free(targets);
    return acc;
}

// ---- Multi-query associative recall (docs/model.md §8.4) ----

static inline void mqar_init(Evals *e) {
    MqarTask *t = &e->mqar;
    const char *dir = e->a->eval_mqar;
    t->on = 1;
    fox_mqar_read(dir, &t->mq);
    if (t->mq.vocab > e->cfg->vocab_size)
        fox_usage_error("--eval-mqar %s: its tokens reach %d, past this model's vocabulary of %d", dir, t->mq.vocab - 1,
                        e->cfg->vocab_size);
    if (e->cfg->arch == FOX_ARCH_FAM && t->mq.seq_len % e->cfg->fam_block)
        fox_usage_error("--eval-mqar %s: the FAM block of %d tokens does not divide its examples of %d", dir, e->cfg->fam_block,
                        t->mq.seq_len);
    if (snprintf(t->test, sizeof(t->test), "%s/test.bin", dir) >= (int)sizeof(t->test)) fox_usage_error("path too long: %s", dir);
    DataLoader dl;
    dataloader_init(&dl, t->test, 1, t->mq.seq_len, 0, 1, 0, 0);
    t->examples = dataloader_num_windows(&dl);
    dataloader_free(&dl);
    t->tm = eval_task_shape(e, e->a->eval_batch, t->mq.seq_len, 0);
}

// Accuracy of the greedy prediction at the answer positions of every test example (batches shared by the
// ranks): OUT/mqar_result.json. NAN when stopped.
static inline double mqar_run(Evals *e, int step, const char *out, int *stopped) {
    MqarTask *t = &e->mqar;
    int B = t->tm.batch, T = t->mq.seq_len, V = e->cfg->vocab_size;
    long long nb = (t->examples + B - 1) / B;
    DataLoader dl;
    dataloader_init(&dl, t->test, B, T, 0, 1, 0, 0);
    int *inputs = (int *)fox_malloc((size_t)B * T * sizeof(int)), *targets = (int *)fox_malloc((size_t)B * T * sizeof(int));
    float *logits = (float *)fox_malloc((size_t)V * sizeof(float));
    double count[2] = {0.0, 0.0};  // correct, answers
    for (long long r = 0; r < (nb + e->dist.world - 1) / e->dist.world; r++) {
        for (int w = 0; w < e->dist.world; w++) {  // every rank reads every batch, keeps its own
            long long bi = r * e->dist.world + w;
            if (bi >= nb) break;
            dataloader_next(&dl, inputs, targets);
            if (w != e->dist.rank) continue;
            int n = t->examples - bi * B < B ? (int)(t->examples - bi * B) : B;
            model_forward(t->tm.m, inputs, NULL, n, T);
            for (int j = 0; j < n; j++)
                for (int p = 0; p < T; p++) {
                    if (!fox_mqar_is_answer(&t->mq, inputs + (size_t)j * T, p)) continue;
                    run_model_logits(t->tm.m, j * T + p, 1, logits);
                    count[0] += eval_argmax(logits, V) == targets[(size_t)j * T + p];
                    count[1] += 1.0;
                }
        }
        if ((*stopped = evals_stopped(e))) break;
    }
    dataloader_free(&dl);
    free(inputs); free(targets); free(logits);
    if (*stopped) return NAN;
    dist_allreduce_sum_f64(&e->dist, count, 2);
    double acc = count[1] > 0 ? count[0] / count[1] : NAN;
    if (e->dist.rank == 0 && out) {
        char tmp[4400];
        FILE *f = fox_open_tmp(out, "mqar_result.json", tmp, sizeof(tmp));
        fprintf(f, "{\"task\": \"mqar\", ");
        eval_json_step(f, e, step);
        fprintf(f, "\"data\": ");
        fox_json_write_string(f, e->a->eval_mqar, strlen(e->a->eval_mqar));
        fprintf(f, ", \"vocab\": %d, \"num_kv\": %d, \"seq_len\": %d, \"examples\": %lld, \"answers\": %.0f, \"correct\": %.0f, "
                "\"accuracy\": ", t->mq.vocab, t->mq.num_kv, T, t->examples, count[1], count[0]);
        eval_json_number(f, acc);
        fprintf(f, "}\n");
        fox_commit_tmp(f, tmp);
    }
    return acc;
}

// ---- The tasks together ----

// Checks the task flags and builds every prompt and item (context: the evaluation context, train_seq_len the
// checkpoint's training context when known). Nothing is allocated on the device.
static inline void evals_init(Evals *e, const FoxArgs *a, const FoxConfig *cfg, const Dist *d, int context, int train_seq_len,
                              volatile sig_atomic_t *stop) {
    memset(e, 0, sizeof(*e));
    e->a = a;
    e->cfg = cfg;
    e->dist = *d;
    e->stop = stop;
    e->context = context;
    e->train_seq_len = train_seq_len;
    if (!evals_any(a)) return;
    const char *text_task = a->eval_niah ? "--eval-niah" : a->eval_passkey ? "--eval-passkey" : NULL;
    if (text_task && cfg->vocab_size < FOX_VOCAB_GPT2)
        fox_usage_error("%s needs the GPT-2 vocabulary (its prompts are text); this model has %d tokens", text_task, cfg->vocab_size);
    if (cfg->vocab_size >= FOX_VOCAB_GPT2 && (text_task || a->eval_mc[0])) {
        fox_load_gpt2_tokenizer(&e->tok, a->tokenizer);
        e->has_tok = 1;
    }
    if (a->eval_niah) niah_init(e);
    if (a->eval_passkey) passkey_init(e);
    if (a->eval_mc[0]) mc_init(e, context);
    if (a->eval_mqar[0]) mqar_init(e);
}

static inline TaskModel *evals_task(Evals *e, int i) {
    TaskModel *all[4] = {&e->niah.tm, &e->pk.tm, &e->mc.tm, &e->mqar.tm};
    int on[4] = {e->niah.on, e->pk.on, e->mc.on, e->mqar.on};
    return on[i] ? all[i] : NULL;
}

// Makes task i's model (this rank's alone) from the run's model options proto; a generation task's KV cache
// is made at its longest, so the device memory it needs is claimed (or refused in one line) now.
static inline void evals_open_task(Evals *e, int i, ModelOptions proto) {
    TaskModel *tm = evals_task(e, i);
    if (!tm || tm->m) return;
    Dist solo = e->dist;
    solo.rank = 0;
    solo.world = 1;
    proto.batch = tm->batch;
    proto.seq_len = tm->len;
    proto.forward_only = 1;
    tm->m = run_model_init(e->cfg, &proto, &solo);
    if (tm->gen) run_model_cache_init(tm->m, tm->len + tm->gen);
}

static inline void evals_close_task(Evals *e, int i) {
    TaskModel *tm = evals_task(e, i);
    if (!tm || !tm->m) return;
    model_free(tm->m);
    free(tm->m);
    tm->m = NULL;
}

// Runs every task on the weights params (FOX_PARAMS layout), writing its result file in out; a task whose
// model is not open (--eval-only) has it made for its run and freed after; out NULL: no files. Returns the stop signal that
// ended an evaluation (0: none).
static inline int evals_run(Evals *e, const float *params, int step, const char *out, ModelOptions proto, EvalScores *s) {
    s->niah = s->passkey = s->mc_acc = s->mc_acc_norm = s->mqar = NAN;
    for (int i = 0; i < 4; i++) {
        TaskModel *tm = evals_task(e, i);
        if (!tm) continue;
        int opened = !tm->m, stopped = 0;
        evals_open_task(e, i, proto);
        run_model_set(tm->m, params, NULL, NULL);
        double t0 = eval_seconds();
        if (i == 0) s->niah = niah_run(e, step, out, &stopped);
        if (i == 1) s->passkey = passkey_run(e, step, out, &stopped);
        if (i == 2) s->mc_acc = mc_run(e, step, out, &stopped, &s->mc_acc_norm);
        if (i == 3) s->mqar = mqar_run(e, step, out, &stopped);
        double dt = eval_seconds() - t0;
        if (opened) evals_close_task(e, i);
        if (stopped) return stopped;
        if (e->dist.rank) continue;
        char file[4400] = "no --out: not written";
        const char *names[4] = {"niah.json", "passkey.json", "mc.jsonl", "mqar_result.json"};
        if (out) snprintf(file, sizeof(file), "%s/%s", out, names[i]);
        char at[32] = "";
        if (step >= 0) snprintf(at, sizeof(at), "step %5d | ", step);
        if (i == 0)
            printf("%sniah (%s) %.3f: %d lengths %d..%d x %d depths in %.1f s (%s)\n", at,
                   e->niah.easy ? "easy" : "standard", s->niah, e->niah.n_lengths, e->niah.lengths[0],
                   e->niah.lengths[e->niah.n_lengths - 1], e->niah.n_depths, dt, file);
        if (i == 1)
            printf("%spasskey %.3f: %d lengths %d..%d x %d trials in %.1f s (%s)\n", at, s->passkey,
                   e->pk.n_lengths, e->pk.lengths[0], e->pk.lengths[e->pk.n_lengths - 1], e->pk.trials, dt, file);
        if (i == 2)
            printf("%smc acc %.4f acc_norm %.4f: %d items in %.1f s (%.0f items/s; %s)\n", at, s->mc_acc,
                   s->mc_acc_norm, e->mc.n_items, dt, e->mc.n_items / (dt > 0 ? dt : 1e-9), file);
        if (i == 3)
            printf("%smqar accuracy %.4f: %lld examples of %d pairs in %.1f s (%s)\n", at, s->mqar,
                   e->mqar.examples, e->mqar.mq.num_kv, dt, file);
    }
    return 0;
}

static inline void evals_free(Evals *e) {
    for (int i = 0; i < 4; i++) evals_close_task(e, i);
    free(e->niah.lengths); free(e->niah.depths);
    free(e->niah.hay.ids); free(e->niah.needle.ids); free(e->niah.suffix.ids);
    free(e->pk.lengths); fox_passkey_text_free(&e->pk.text);
    for (int r = 0; r < e->mc.n_rows; r++) free(e->mc.rows[r].ids);
    free(e->mc.rows); free(e->mc.labels); free(e->mc.row_of); free(e->mc.order);
    if (e->has_tok) tokenizer_free(&e->tok);
    memset(e, 0, sizeof(*e));
}

#endif
