// test/test_eval.c: fox/eval.h's evaluation tasks (docs/model.md §8) against a fake model whose outputs the
// test scripts, so each task's logic is checked exactly, independent of any network: the NIAH and passkey
// prompts token by token (the real GPT-2 tokenizer, the real data/haystack and a small haystack written
// here), the scorers on hand-made answers, greedy generation into niah.json and passkey.json, the
// multiple-choice log-likelihoods (sums over exactly each choice's positions, truncation, acc and acc_norm,
// batching), MQAR's accuracy over the answer positions alone, and the inputs that stop a run (in a child
// process: its exit status and its stderr line). The expected values come from the spec's strings and
// rules, written out here; fox/eval.h's own functions serve only where two of its results must agree (a
// cell's needle_pos in niah.json and niah_prompt's).
// Run from the repository root (it reads data/gpt2_tokenizer.bin and data/haystack/ and runs ./fox_data,
// which `make fox_data` builds).
// Usage: gcc -O1 -g -std=c11 -D_DEFAULT_SOURCE -Wall -Wextra -Werror -I. -o /tmp/test_eval test/test_eval.c -lm && /tmp/test_eval
#ifndef _DEFAULT_SOURCE
#define _DEFAULT_SOURCE  // fileno, mkdtemp, d_type, as the Makefile's CFLAGS give
#endif
#ifndef FOX_NO_BLOSC
#define FOX_NO_BLOSC  // MQAR's data are llm.c shards: no compressed zarr array is read here
#endif
#include <sys/wait.h>
#include <unistd.h>

#pragma GCC diagnostic ignored "-Wunknown-pragmas"  // fox/train_common.h's omp pragma, built without -fopenmp
#include "fox/trainer.h"
#include "fox/eval.h"
#include "test/testing.h"

// The spec's strings (docs/model.md §8.1, §8.2).
#define DOC_NEEDLE "\nThe best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.\n"
#define DOC_NEEDLE_EASY "\nWhat is the best thing to do in San Francisco? Answer: The best thing to do in San Francisco is " \
                        "eat a sandwich and sit in Dolores Park on a sunny day.\n"
#define DOC_QUESTION_ONLY "What is the best thing to do in San Francisco? Answer: The best thing to do in San Francisco is"
#define DOC_QUESTION "\n\nThere is an important piece of information hidden inside the above document. Now that you've read " \
                     "the document, I will quiz you about it. Answer the following question: " DOC_QUESTION_ONLY
#define DOC_PK_TASK "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. " \
                    "I will quiz you about the important information there.\n"
#define DOC_PK_FILLER "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
#define DOC_PK_QUESTION "\nWhat is the pass key? The pass key is"
#define DOC_PK_LINE "\nThe pass key is %d. Remember it. %d is the pass key.\n"

#define GUARD 16         // sentinel ints past a prompt's end: a write past L tokens changes one
#define SENTINEL (-7)
#define TRAIN_SEQ_LEN 256  // the checkpoint's training context every Evals here is given
#define NEVER_CALLED __attribute__((unused))  // a trainer function the tasks never call: defined, unused

static Tokenizer tok;  // the test's own GPT-2 tokenizer (the one every Evals loads too)

// ---- The fake model ----
// It computes nothing; the test scripts what it returns:
//  - generation: the prefill asks fake_answer(prompt, L, b) for sequence b's answer text, and the greedy
//    steps then see one-hot logits at its tokens, <|endoftext|>, FAKE_AFTER_EOT's tokens, <|endoftext|>...;
//  - a forward with targets: the loss at position p is fake_loss(p, input, target);
//  - a forward without targets: the logits of row (b, p) are one-hot at fake_next(sequence b, p).
// A call outside the shape it was made for, or a decode fed other than the greedy token, counts in fake_misuse.
#define FAKE_AFTER_EOT " Dolores Park on a sunny day"  // would score if the text did not stop at <|endoftext|>

struct Model {
    ModelOptions o;
    int vocab, heads;                // the config's vocabulary; its layers x heads (ACP's tile counts)
    int cache_len, cached;           // the KV cache: its capacity, the tokens in it
    int **answer, *answer_n, *last;  // per sequence: the scripted tokens, the token emitted last
    int step;                        // the greedy step the next logits are for
    int B, T, *inputs, has_targets;  // the last forward
    float *losses;
};

static const char *(*fake_answer)(const int *prompt, int L, int b);
static int (*fake_next)(const int *seq, int p);
static int fake_acp;                 // run_model_acp_tiles: every (layer, head) computed a quarter of the tiles
static int fake_misuse;
static const float *fake_params;     // what the last run_model_set gave

// In sixteenths, so that sums of losses are exact in float and double alike.
static float fake_loss(int p, int in, int tgt) {
    return 0.5f * (float)(tgt % 8) + 0.125f * (float)(p % 4) + 0.0625f * (float)(in % 5);
}

static void fake_misused(const char *what) {
    printf("     fake model misused: %s\n", what);
    fake_misuse++;
}

static FOX_NORETURN void fake_never(const char *name) { fox_fatal("the evaluation tasks called %s", name); }

static Model *run_model_init(const FoxConfig *c, const ModelOptions *o, const Dist *d) {
    Model *m = (Model *)fox_calloc(1, sizeof(Model));
    m->o = *o;
    m->vocab = c->vocab_size;
    m->heads = c->n_layer * c->n_head;
    if (!o->forward_only || d->world != 1 || o->batch < 1 || o->seq_len < 1) fake_misused("not a forward-only model of one rank");
    size_t bt = (size_t)o->batch * (size_t)o->seq_len;
    m->answer = (int **)fox_calloc((size_t)o->batch, sizeof(int *));
    m->answer_n = (int *)fox_calloc((size_t)o->batch, sizeof(int));
    m->last = (int *)fox_calloc((size_t)o->batch, sizeof(int));
    m->inputs = (int *)fox_calloc(bt, sizeof(int));
    m->losses = (float *)fox_calloc(bt, sizeof(float));
    return m;
}

static void model_free(Model *m) {
    for (int b = 0; b < m->o.batch; b++) free(m->answer[b]);
    free(m->answer); free(m->answer_n); free(m->last); free(m->inputs); free(m->losses);
}

static void run_model_set(Model *m, const float *params, const float *m1, const float *m2) {
    (void)m;
    if (m1 || m2) fake_misused("AdamW moments given to a forward-only model");
    fake_params = params;
}

static void run_model_cache_init(Model *m, int max_len) {
    m->cache_len = max_len;
    m->cached = 0;
}

// The greedy step's logits: one-hot at each sequence's scripted token (its last one repeats).
static void fake_emit(Model *m, float *logits) {
    for (int b = 0; b < m->o.batch; b++) {
        int i = m->step < m->answer_n[b] ? m->step : m->answer_n[b] - 1;
        m->last[b] = m->answer[b][i];
        memset(logits + (size_t)b * m->vocab, 0, (size_t)m->vocab * sizeof(float));
        logits[(size_t)b * m->vocab + m->last[b]] = 1.0f;
    }
    m->step++;
}

static void fake_append(TokenList *s, const char *text) {
    size_t n;
    int *ids = tokenizer_encode(&tok, text, strlen(text), &n, 0);
    s->ids = (int *)fox_realloc(s->ids, ((size_t)s->n + n + 1) * sizeof(int));
    memcpy(s->ids + s->n, ids, n * sizeof(int));
    s->n += (int)n;
    s->ids[s->n++] = FOX_EOT;
    free(ids);
}

static void run_model_prefill(Model *m, const int *tokens, int T, float *logits) {
    if (T < 1 || T > m->o.seq_len || T > m->cache_len) fake_misused("a prefill longer than the model or its cache");
    m->cached = T;
    m->step = 0;
    for (int b = 0; b < m->o.batch; b++) {
        TokenList s = {NULL, 0};
        fake_append(&s, fake_answer(tokens + (size_t)b * T, T, b));
        fake_append(&s, FAKE_AFTER_EOT);
        free(m->answer[b]);
        m->answer[b] = s.ids;
        m->answer_n[b] = s.n;
    }
    fake_emit(m, logits);
}

static void run_model_decode(Model *m, const int *tokens, float *logits) {
    for (int b = 0; b < m->o.batch; b++)
        if (tokens[b] != m->last[b]) fake_misused("a decode fed other than the greedy token");
    if (++m->cached > m->cache_len) fake_misused("a decode past the cache");
    fake_emit(m, logits);
}

static double model_forward(Model *m, const int *inputs, const int *targets, int B, int T) {
    if (B < 1 || B > m->o.batch || T < 1 || T > m->o.seq_len) {
        fake_misused("a forward outside the model's batch and length");
        return 0.0;
    }
    m->B = B;
    m->T = T;
    m->has_targets = targets != NULL;
    memcpy(m->inputs, inputs, (size_t)B * T * sizeof(int));
    double sum = 0.0;
    for (int i = 0; targets && i < B * T; i++) sum += m->losses[i] = fake_loss(i % T, inputs[i], targets[i]);
    return sum / (B * T);
}

static const float *run_model_losses(Model *m) {
    if (!m->has_targets) fake_misused("losses of a forward without targets");
    return m->losses;
}

static void run_model_logits(Model *m, int r0, int rows, float *out) {
    if (m->has_targets || r0 < 0 || rows < 1 || r0 + rows > m->B * m->T) {
        fake_misused("logits of rows the last forward does not have");
        return;
    }
    for (int r = 0; r < rows; r++) {
        int b = (r0 + r) / m->T, p = (r0 + r) % m->T;
        memset(out + (size_t)r * m->vocab, 0, (size_t)m->vocab * sizeof(float));
        out[(size_t)r * m->vocab + fake_next(m->inputs + (size_t)b * m->T, p)] = 1.0f;
    }
}

static int run_model_acp_tiles(Model *m, long long *live, long long *tiles) {
    if (!fake_acp) return 0;
    *tiles = 64;
    for (int i = 0; i < m->heads; i++) live[i] = 16;
    return 1;
}

NEVER_CALLED static void run_model_forward_queue(Model *m, const int *inputs, const int *targets, int B, int T) {
    (void)m; (void)inputs; (void)targets; (void)B; (void)T;
    fake_never(__func__);
}
NEVER_CALLED static double run_model_loss(Model *m) { (void)m; fake_never(__func__); }
NEVER_CALLED static void run_model_backward(Model *m, const int *inputs, const int *targets, int B, int T, float dloss_scale, int last) {
    (void)m; (void)inputs; (void)targets; (void)B; (void)T; (void)dloss_scale; (void)last;
    fake_never(__func__);
}
NEVER_CALLED static void run_model_zero_grad(Model *m) { (void)m; fake_never(__func__); }
NEVER_CALLED static void run_model_average_grads(Model *m, const Dist *d) { (void)m; (void)d; fake_never(__func__); }
NEVER_CALLED static double run_model_grad_norm(Model *m) { (void)m; fake_never(__func__); }
NEVER_CALLED static void run_model_update(Model *m, const OptConfig *o, double lr, int t, double norm) {
    (void)m; (void)o; (void)lr; (void)t; (void)norm;
    fake_never(__func__);
}
NEVER_CALLED static void run_model_get(Model *m, float *params, float *m1, float *m2) {
    (void)m; (void)params; (void)m1; (void)m2;
    fake_never(__func__);
}
NEVER_CALLED static void run_model_shard(const Model *m, size_t *offset, size_t *count) {
    (void)m; (void)offset; (void)count;
    fake_never(__func__);
}
NEVER_CALLED static void run_model_sync(Model *m) { (void)m; fake_never(__func__); }
NEVER_CALLED static double run_model_peak_flops(void) { fake_never(__func__); }
NEVER_CALLED static void run_model_report(Model *m) { (void)m; fake_never(__func__); }
NEVER_CALLED static double run_model_decode_keys_read(Model *m) { (void)m; fake_never(__func__); }

// ---- Helpers ----

static volatile sig_atomic_t stop_flag;

static FoxArgs default_args(void) {
    FoxArgs a;
    fox_args_defaults(&a);
    return a;
}

// evals_init for the tasks a asks for, on the default config with `vocab` tokens, one rank, evaluation
// context `context`.
static void setup(Evals *e, const FoxArgs *a, FoxConfig *cfg, int vocab, int context) {
    fox_config_defaults(cfg);
    cfg->vocab_size = vocab;
    Dist one = {0, 1, 0, 1, 0, 1};
    evals_init(e, a, cfg, &one, context, TRAIN_SEQ_LEN, &stop_flag);
}

static TokenList enc(const char *text) {
    size_t n;
    int *ids = tokenizer_encode(&tok, text, strlen(text), &n, 0);
    TokenList t = {ids, (int)n};
    return t;
}

static char *dec(const int *ids, int n) {
    size_t len;
    return tokenizer_decode(&tok, ids, (size_t)n, &len);
}

static int same(const int *a, const int *b, int n) { return n >= 0 && !memcmp(a, b, (size_t)n * sizeof(int)); }

static int holds(const int *a, int n, int x) {
    for (int i = 0; i < n; i++)
        if (a[i] == x) return 1;
    return 0;
}

// A prompt buffer of L tokens and GUARD more, all SENTINEL; prompt_exact says whether exactly L were written.
static int *prompt_buffer(int L) {
    int *out = (int *)fox_malloc((size_t)(L + GUARD) * sizeof(int));
    for (int i = 0; i < L + GUARD; i++) out[i] = SENTINEL;
    return out;
}

static int prompt_exact(const int *out, int L) {
    for (int i = 0; i < L + GUARD; i++)
        if ((out[i] == SENTINEL) != (i >= L)) return 0;
    return 1;
}

static void write_file(const char *dir, const char *name, const char *text) {
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fox_fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

static int exists(const char *dir, const char *name) {
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

static void remove_in(const char *dir, const char *name) {
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    remove(path);
}

// DIR/name parsed (a FAIL line and 0 if it is missing or not JSON).
static int load_json(const char *dir, const char *name, FoxJsonValue *v) {
    char path[4400], err[160];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    size_t len;
    char *text = fox_read_file(path, &len);
    int ok = text && fox_json_parse(text, len, v, err, sizeof err);
    if (!ok) check(0, "%s exists and parses%s%s", path, text ? ": " : "", text ? err : "");
    free(text);
    return ok;
}

static const FoxJsonValue *j_at(const FoxJsonValue *v, int i) {
    return v && v->type == FOX_JSON_ARRAY && i >= 0 && i < v->n ? &v->items[i] : NULL;
}

static int j_int(const FoxJsonValue *v, long long want) {
    long long x = 0;
    return fox_json_int(v, &x) && x == want;
}

static int j_bool(const FoxJsonValue *v, int want) { return v && v->type == FOX_JSON_BOOL && v->boolean == want; }

static int j_num(const FoxJsonValue *v, double want, double tol) {
    return v && v->type == FOX_JSON_NUMBER && fabs(v->number - want) <= tol;
}

static int j_str(const FoxJsonValue *v, const char *s) {
    return v && v->type == FOX_JSON_STRING && v->len == strlen(s) && !memcmp(v->string, s, v->len);
}

static int j_ints(const FoxJsonValue *v, const int *want, int n) {
    if (!v || v->type != FOX_JSON_ARRAY || v->n != n) return 0;
    for (int i = 0; i < n; i++)
        if (!j_int(&v->items[i], want[i])) return 0;
    return 1;
}

static int j_nulls(const FoxJsonValue *v, int n) {
    if (!v || v->type != FOX_JSON_ARRAY || v->n != n) return 0;
    for (int i = 0; i < n; i++)
        if (v->items[i].type != FOX_JSON_NULL) return 0;
    return 1;
}

// Runs fn(arg) in a child process: its exit status (-1: it did not exit), its stderr's first line in err.
static int in_child(void (*fn)(const void *), const void *arg, char *err, size_t cap) {
    fflush(stdout);
    fflush(stderr);
    int fds[2];
    if (pipe(fds)) fox_fatal("pipe: %s", strerror(errno));
    pid_t pid = fork();
    if (pid < 0) fox_fatal("fork: %s", strerror(errno));
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(fds[1], 2);
        close(fds[0]);
        fn(arg);
        fflush(NULL);
        _exit(0);
    }
    close(fds[1]);
    size_t n = 0;
    char scratch[4096];
    for (ssize_t got = 1; got > 0;) {  // read all of it (a child blocked on a full pipe never exits)
        got = read(fds[0], n + 1 < cap ? err + n : scratch, n + 1 < cap ? cap - 1 - n : sizeof scratch);
        if (got > 0 && n + 1 < cap) n += (size_t)got;
    }
    close(fds[0]);
    err[n] = 0;
    err[strcspn(err, "\n")] = 0;
    int status;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

typedef struct {
    const FoxArgs *a;
    int vocab, context;
} InitCase;

static void child_init(const void *arg) {
    const InitCase *c = (const InitCase *)arg;
    Evals e;
    FoxConfig cfg;
    setup(&e, c->a, &cfg, c->vocab, c->context);
    evals_free(&e);
}

// A PASS line when evals_init of a exits with `status` and a stderr line starting with want (status 0: it
// returns, and stderr is empty).
static void check_init_exit(const char *what, const FoxArgs *a, int vocab, int context, int status, const char *want) {
    InitCase c = {a, vocab, context};
    char err[1024];
    int got = in_child(child_init, &c, err, sizeof err);
    int ok = got == status && !strncmp(err, want, strlen(want)) && (status || !err[0]);
    check(ok, "%-44s exit %d \"%s\"%s%s", what, got, err, ok ? "" : ", expected the start ", ok ? "" : want);
}

// ---- Grids (docs/model.md §8.1: numpy's round(linspace); repeats dropped, as eval_linspace says) ----

static void check_linspace(int lo, int hi, int n, const int *want, int count) {
    int got[64];
    int k = eval_linspace(lo, hi, n, got);
    int ok = k == count && same(got, want, count);
    check(ok, "eval_linspace(%d, %d, %d): %d values, from %d to %d", lo, hi, n, k, got[0], got[k - 1]);
}

static void test_linspace(void) {
    const int a[] = {1000, 4100, 7200, 10300, 13400, 16500, 19600, 22700, 25800, 28900, 32000};
    const int b[] = {0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100};
    const int c[] = {0, 33, 67, 100};
    const int d[] = {0, 2, 5, 8, 10};  // numpy rounds 2.5 to 2 and 7.5 to 8 (half to even)
    const int e[] = {1, 2, 4};         // 2.5 -> 2
    const int f[] = {10, 11, 12};      // numpy's [10, 10, 11, 12, 12] without the repeats
    check_linspace(1000, 32000, 11, a, 11);
    check_linspace(0, 100, 11, b, 11);
    check_linspace(0, 100, 4, c, 4);
    check_linspace(0, 10, 5, d, 5);
    check_linspace(1, 4, 3, e, 3);
    check_linspace(10, 12, 5, f, 3);
}

// ---- NIAH prompts (docs/model.md §8.1) ----

// The haystack as the spec makes it: the .txt files of pattern (name order) concatenated, encoded, the
// tokens repeated to `need`.
static TokenList spec_haystack(const char *pattern, int need) {
    glob_t g;
    char *text = (char *)fox_calloc(1, 1);
    size_t n = 0;
    if (!glob(pattern, 0, NULL, &g)) {
        for (size_t i = 0; i < g.gl_pathc; i++) {
            size_t part = 0;
            char *t = fox_read_file(g.gl_pathv[i], &part);
            if (!t) fox_fatal("cannot read %s", g.gl_pathv[i]);
            text = (char *)fox_realloc(text, n + part + 1);
            memcpy(text + n, t, part + 1);
            n += part;
            free(t);
        }
        globfree(&g);
    }
    TokenList once = enc(text), hay = {(int *)fox_malloc((size_t)need * sizeof(int)), need};
    for (int i = 0; i < need; i++) hay.ids[i] = once.ids[i % once.n];
    free(once.ids);
    free(text);
    return hay;
}

enum { NP_EXACT, NP_EOT, NP_NEEDLE, NP_AFTER_DOT, NP_LAST_DOT, NP_HAYSTACK, NP_QUESTION, NP_MONOTONE, NP_COUNT };
static const char *const niah_props[NP_COUNT] = {
    "exactly L tokens", "token 0 is <|endoftext|>", "the needle's tokens at the returned position",
    "the token before the needle is '.' (or it starts the haystack, or depth 100)",
    "needle after the last '.' at or before floor(n*d/100); depth 100: right before the question",
    "the haystack in order around the needle", "the question ends the prompt", "the needle moves forward with depth"};

// Every (length, depth) prompt of e's grid, against the spec (the haystack's files: pattern).
static void check_niah_prompts(const Evals *e, const char *pattern, const char *what) {
    const NiahTask *t = &e->niah;
    int maxL = t->lengths[t->n_lengths - 1];
    TokenList hay = spec_haystack(pattern, maxL), needle = enc(t->easy ? DOC_NEEDLE_EASY : DOC_NEEDLE);
    TokenList question = enc(DOC_QUESTION), dot = enc(".");
    int bad[NP_COUNT] = {0}, first[NP_COUNT][2], prompts = 0;
    for (int li = 0; li < t->n_lengths; li++) {
        int prev = 0;
        for (int d = 0; d < t->n_depths; d++, prompts++) {
            int L = t->lengths[li], depth = t->depths[d], *out = prompt_buffer(L);
            int pos = niah_prompt(t, L, depth, out);
            int n = L - 1 - needle.n - question.n, h = pos - 1, bound = (int)((long long)n * depth / 100);
            int ok[NP_COUNT] = {0};
            ok[NP_EXACT] = prompt_exact(out, L);
            ok[NP_EOT] = out[0] == FOX_EOT;
            ok[NP_NEEDLE] = h >= 0 && h <= n && same(out + pos, needle.ids, needle.n);
            if (ok[NP_NEEDLE]) {
                ok[NP_AFTER_DOT] = depth == 100 || h == 0 || out[pos - 1] == dot.ids[0];
                ok[NP_LAST_DOT] = depth == 100 ? h == n : h <= bound && !holds(hay.ids + h, bound - h, dot.ids[0]);
                ok[NP_HAYSTACK] = same(out + 1, hay.ids, h) && same(out + pos + needle.n, hay.ids + h, n - h);
            }
            ok[NP_QUESTION] = same(out + L - question.n, question.ids, question.n);
            ok[NP_MONOTONE] = pos >= prev;
            prev = pos;
            for (int k = 0; k < NP_COUNT; k++)
                if (!ok[k] && !bad[k]++) { first[k][0] = L; first[k][1] = depth; }
            free(out);
        }
    }
    for (int k = 0; k < NP_COUNT; k++)
        check(!bad[k], "niah prompts %-26s %s: %d of %d bad%s", what, niah_props[k], bad[k], prompts, bad[k] ? " (first: above)" : "");
    for (int k = 0; k < NP_COUNT; k++)
        if (bad[k]) printf("     first bad prompt for '%s': L %d depth %d\n", niah_props[k], first[k][0], first[k][1]);
    free(hay.ids); free(needle.ids); free(question.ids); free(dot.ids);
}

// The needle's position in the prompt of (L, depth).
static int niah_pos(const NiahTask *t, int L, int depth) {
    int *out = prompt_buffer(L), pos = niah_prompt(t, L, depth, out);
    free(out);
    return pos;
}

static void test_niah_prompts(const char *tmp) {
    const int depths[11] = {0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100};
    FoxArgs a = default_args();
    a.eval_niah = 1;
    a.niah_min_len = 100;
    a.niah_max_len = 900;  // past the evaluation context: allowed
    Evals e;
    FoxConfig cfg;
    setup(&e, &a, &cfg, FOX_VOCAB_GPT2, 512);
    const int lengths[11] = {100, 180, 260, 340, 420, 500, 580, 660, 740, 820, 900};
    check(e.niah.n_lengths == 11 && same(e.niah.lengths, lengths, 11) && e.niah.n_depths == 11 && same(e.niah.depths, depths, 11),
          "niah grid: --niah-min-len 100 --niah-max-len 900: lengths 100, 180, ..., 900 x depths 0, 10, ..., 100");
    check(!e.niah.easy && e.niah.new_tokens == 32, "niah: standard mode and 32 new tokens by default");
    check_niah_prompts(&e, "data/haystack/*.txt", "(data/haystack, standard)");
    int L = 900, n = L - 1 - e.niah.needle.n - e.niah.suffix.n;
    check(niah_pos(&e.niah, L, 50) > 1 + n / 4 && niah_pos(&e.niah, L, 100) == 1 + n,
          "niah: in data/haystack the needle at depth 50 lies past the first quarter, at depth 100 after the whole haystack");
    evals_free(&e);

    // The easy needle, and the shortest length by default: the longest / 11, raised to the least a prompt holds.
    a.niah_mode = "easy";
    a.niah_min_len = a.niah_max_len = 0;
    setup(&e, &a, &cfg, FOX_VOCAB_GPT2, 600);
    TokenList easy = enc(DOC_NEEDLE_EASY), question = enc(DOC_QUESTION);
    int least = 1 + easy.n + question.n + 1;
    check(e.niah.easy && e.niah.n_lengths == 11 && e.niah.lengths[0] == least && e.niah.lengths[10] == 600,
          "niah grid: no --niah-min-len, context 600: lengths %d..%d (600/11 = 54 raised to the least prompt, %d tokens)",
          e.niah.lengths[0], e.niah.lengths[e.niah.n_lengths - 1], least);
    check_niah_prompts(&e, "data/haystack/*.txt", "(data/haystack, easy)");
    free(easy.ids);
    free(question.ids);
    evals_free(&e);

    // A small haystack of two files (read in name order, another extension ignored), repeated many times.
    char dir[4400];
    snprintf(dir, sizeof dir, "%s/hay", tmp);
    fox_mkdir_p(dir);
    write_file(dir, "b.txt", "Beta one is here. Beta two, and more (beta three). End of b.\n");
    write_file(dir, "a.txt", "Alpha starts. Alpha goes on for a while without stopping at all; then stops. ");
    write_file(dir, "notes.md", "Not part of the haystack.");
    a.niah_mode = "standard";
    a.niah_haystack = dir;
    a.niah_min_len = 100;
    a.niah_max_len = 300;
    a.niah_lengths = 3;
    setup(&e, &a, &cfg, FOX_VOCAB_GPT2, 256);
    const int small[3] = {100, 200, 300};
    check(e.niah.n_lengths == 3 && same(e.niah.lengths, small, 3), "niah grid: 3 lengths from 100 to 300: 100, 200, 300");
    char pattern[4500];
    snprintf(pattern, sizeof pattern, "%s/*.txt", dir);
    check_niah_prompts(&e, pattern, "(small haystack)");
    evals_free(&e);

    // A haystack without a '.': the needle starts it at every depth but 100.
    char flat[4400];
    snprintf(flat, sizeof flat, "%s/flat", tmp);
    fox_mkdir_p(flat);
    write_file(flat, "x.txt", "words and words with no full stop anywhere, just commas; ");
    a.niah_haystack = flat;
    setup(&e, &a, &cfg, FOX_VOCAB_GPT2, 256);
    int at_start = 0;
    for (int d = 0; d < 10; d++) at_start += niah_pos(&e.niah, 300, depths[d]) == 1;
    check(at_start == 10 && niah_pos(&e.niah, 300, 100) > 1,
          "niah: a haystack without '.': the needle at position 1 for depths 0..90 (%d of 10)", at_start);
    snprintf(pattern, sizeof pattern, "%s/*.txt", flat);
    check_niah_prompts(&e, pattern, "(haystack without '.')");
    evals_free(&e);
}

static void test_niah_errors(const char *tmp) {
    FoxArgs a = default_args();
    a.eval_niah = 1;
    a.niah_min_len = 20;
    check_init_exit("niah: --niah-min-len 20 (too short)", &a, FOX_VOCAB_GPT2, 512, 2, "error: --niah-min-len 20: a prompt needs at least ");
    a.niah_min_len = 800;
    a.niah_max_len = 700;
    check_init_exit("niah: --niah-min-len 800 > --niah-max-len 700", &a, FOX_VOCAB_GPT2, 512, 2,
                    "error: --niah-min-len 800 exceeds the longest context 700");
    a.niah_min_len = 100;
    a.niah_max_len = 0;
    check_init_exit("niah: --niah-min-len 100, context 512", &a, FOX_VOCAB_GPT2, 512, 0, "");
    a.niah_mode = "hard";
    check_init_exit("niah: --niah-mode hard", &a, FOX_VOCAB_GPT2, 512, 2, "error: --niah-mode hard: expected standard or easy");
    a.niah_mode = "standard";
    char dir[4400], want[4600];
    snprintf(dir, sizeof dir, "%s/nohay", tmp);
    fox_mkdir_p(dir);
    write_file(dir, "x.md", "text, but not in a .txt file");
    a.niah_haystack = dir;
    snprintf(want, sizeof want, "error: --niah-haystack %s holds no .txt file", dir);
    check_init_exit("niah: a haystack directory without .txt", &a, FOX_VOCAB_GPT2, 512, 2, want);
    write_file(dir, "empty.txt", "");
    snprintf(want, sizeof want, "error: --niah-haystack %s holds no text", dir);
    check_init_exit("niah: a haystack of empty .txt files", &a, FOX_VOCAB_GPT2, 512, 2, want);
    a.niah_haystack = "data/haystack";
    check_init_exit("niah: a model without the GPT-2 vocabulary", &a, 64, 512, 2, "error: --eval-niah needs the GPT-2 vocabulary");
}

// ---- NIAH scoring ----

static void test_niah_score(void) {
    static const struct { const char *text; int hits; } cases[] = {
        {" eat a sandwich and sit in Dolores Park on a sunny day.", 7},
        {"eat a sandwich and sit", 3},
        {"DOLORES park!", 2},
        {"Day,sunny;SIT", 3},
        {"\"sandwich\" (day)", 2},
        {"parking", 0},
        {"sandwiches in the parkland", 0},
        {"eat eat eat", 1},
        {"", 0},
        {"dolores\xc3\xa9park", 2},  // é is no ASCII letter: it splits the words
        {"na\xc3\xafve sunny", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double got = niah_score(cases[i].text), want = cases[i].hits / 7.0;
        check(got == want, "niah_score(\"%s\") = %.4f, expected %d/7", cases[i].text, got, cases[i].hits);
    }
}

// ---- NIAH greedy generation and niah.json ----

static const Evals *niah_e;  // the Evals whose prompts the fake expects
static int niah_wrong_prompts;
static const char *const niah_texts[3] = {" eat a sandwich and sit in Dolores Park on a sunny day", " eat a sandwich and sit",
                                          " I went parking downtown"};
static const double niah_scores[3] = {1.0, 3.0 / 7.0, 0.0};

static int niah_kind(int L, int d) { return (L / 100 + d) % 3; }

// The fake's answers: one of niah_texts by (length, depth); it counts prompts other than niah_prompt's.
static const char *niah_answer(const int *prompt, int L, int b) {
    const NiahTask *t = &niah_e->niah;
    int *want = prompt_buffer(L);
    niah_prompt(t, L, t->depths[b], want);
    niah_wrong_prompts += !same(want, prompt, L);
    free(want);
    return niah_texts[niah_kind(L, b)];
}

// niah.json of e's grid against the script (cells' texts cut to new_tokens: full_text says they are whole).
static void check_niah_json(const Evals *e, const char *out, int full_text) {
    const NiahTask *t = &e->niah;
    FoxJsonValue v;
    if (!load_json(out, "niah.json", &v)) return;
    int nl = t->n_lengths, nd = t->n_depths, bad_score = 0, bad_cell = 0;
    double mean = 0.0;
    for (int li = 0; li < nl; li++)
        for (int d = 0; d < nd; d++) {
            double want = niah_scores[niah_kind(t->lengths[li], d)];
            mean += want / (nl * nd);
            bad_score += !j_num(j_at(j_at(fox_json_get(&v, "score"), li), d), want, 1e-6);
            const FoxJsonValue *cell = j_at(fox_json_get(&v, "cells"), li * nd + d);
            bad_cell += !j_int(fox_json_get(cell, "length"), t->lengths[li]) || !j_int(fox_json_get(cell, "depth"), t->depths[d]) ||
                        !j_int(fox_json_get(cell, "needle_pos"), niah_pos(t, t->lengths[li], t->depths[d])) ||
                        !j_num(fox_json_get(cell, "score"), want, 1e-6) ||
                        (full_text && !j_str(fox_json_get(cell, "text"), niah_texts[niah_kind(t->lengths[li], d)]));
        }
    check(j_str(fox_json_get(&v, "task"), "niah") && j_str(fox_json_get(&v, "mode"), "standard") && j_int(fox_json_get(&v, "step"), 7) &&
          j_int(fox_json_get(&v, "train_seq_len"), TRAIN_SEQ_LEN) && j_int(fox_json_get(&v, "new_tokens"), t->new_tokens) &&
          j_str(fox_json_get(&v, "needle"), DOC_NEEDLE) && j_str(fox_json_get(&v, "question"), DOC_QUESTION_ONLY),
          "niah.json: task, mode, step, train_seq_len, new_tokens, needle, question");
    check(j_ints(fox_json_get(&v, "lengths"), t->lengths, nl) && j_ints(fox_json_get(&v, "depths"), t->depths, nd) &&
          j_nulls(fox_json_get(&v, "acp_pruned"), nl),
          "niah.json: lengths, depths; acp_pruned null per length without ACP");
    check(!bad_score && j_num(fox_json_get(&v, "mean"), mean, 1e-6),
          "niah.json: score matrix (1, 3/7 and 0 cells as scripted; %d bad) and mean %.6f", bad_score, mean);
    const FoxJsonValue *cells = fox_json_get(&v, "cells");
    check(cells && cells->n == nl * nd && !bad_cell, "niah.json: %d cells with length, depth, needle_pos (niah_prompt's), score%s (%d bad)",
          nl * nd, full_text ? " and the scripted text" : "", bad_cell);
    fox_json_free(&v);
}

static void test_niah_run(const char *tmp) {
    FoxArgs a = default_args();
    a.eval_niah = 1;
    a.niah_min_len = 100;
    a.niah_max_len = 300;
    a.niah_lengths = 3;
    Evals e;
    FoxConfig cfg;
    setup(&e, &a, &cfg, FOX_VOCAB_GPT2, TRAIN_SEQ_LEN);
    niah_e = &e;
    fake_answer = niah_answer;
    niah_wrong_prompts = fake_misuse = 0;
    char out[4400];
    snprintf(out, sizeof out, "%s/niah_out", tmp);
    float params[4] = {0};
    ModelOptions proto;
    memset(&proto, 0, sizeof proto);
    double mean = 0.0;
    for (int li = 0; li < 3; li++)
        for (int d = 0; d < 11; d++) mean += niah_scores[niah_kind(e.niah.lengths[li], d)] / 33;

    // evals_run: the model made, given the weights, run and freed; only the NIAH score set.
    EvalScores s;
    int rc = evals_run(&e, params, 7, out, proto, &s);
    check(rc == 0 && fabs(s.niah - mean) < 1e-12 && isnan(s.passkey) && isnan(s.mc_acc) && isnan(s.mc_acc_norm) && isnan(s.mqar),
          "niah: evals_run returns 0, the mean score %.6f (expected %.6f), the other tasks NAN", s.niah, mean);
    check(fake_params == params && !e.niah.tm.m, "niah: evals_run gives the task model the weights and frees it after");
    check(!niah_wrong_prompts && !fake_misuse,
          "niah: the model saw niah_prompt's prompts, one batch of depths per length, greedy decodes (%d wrong, %d misuses)",
          niah_wrong_prompts, fake_misuse);
    check_niah_json(&e, out, 1);

    // The task's own model: ACP's share, a stop, no output directory.
    evals_open_task(&e, 0, proto);
    int stopped = 0;
    fake_acp = 1;
    niah_run(&e, 7, out, &stopped);
    fake_acp = 0;
    FoxJsonValue v;
    if (load_json(out, "niah.json", &v)) {
        const FoxJsonValue *p = fox_json_get(&v, "acp_pruned");
        check(p && p->n == 3 && j_num(j_at(p, 0), 0.75, 1e-12) && j_num(j_at(p, 2), 0.75, 1e-12),
              "niah.json: acp_pruned 0.75 per length when ACP computed a quarter of the tiles");
        fox_json_free(&v);
    }
    remove_in(out, "niah.json");
    stop_flag = 1;
    double got = niah_run(&e, 7, out, &stopped);
    stop_flag = 0;
    check(isnan(got) && stopped == 1 && !exists(out, "niah.json"), "niah: a stop signal: NAN, *stopped 1, no niah.json");
    got = niah_run(&e, 7, NULL, &stopped);
    check(fabs(got - mean) < 1e-12 && !stopped && !exists(out, "niah.json") && !exists(".", "niah.json"),
          "niah: out NULL: the same mean, no niah.json written");
    evals_free(&e);

    // --niah-tokens 4: the full answer cut to " eat a sandwich and" scores 2/7.
    a.niah_tokens = 4;
    setup(&e, &a, &cfg, FOX_VOCAB_GPT2, TRAIN_SEQ_LEN);
    niah_e = &e;
    evals_open_task(&e, 0, proto);
    niah_run(&e, 7, out, &stopped);
    if (load_json(out, "niah.json", &v)) {
        int full = 0, bad = 0;
        for (int c = 0; c < 33; c++) {
            if (niah_kind(e.niah.lengths[c / 11], c % 11)) continue;
            const FoxJsonValue *cell = j_at(fox_json_get(&v, "cells"), c);
            full++;
            bad += !j_str(fox_json_get(cell, "text"), " eat a sandwich and") || !j_num(fox_json_get(cell, "score"), 2.0 / 7, 1e-6);
        }
        check(full == 11 && !bad && j_int(fox_json_get(&v, "new_tokens"), 4),
              "niah: --niah-tokens 4: the full answer's cells hold \" eat a sandwich and\", score 2/7 (%d bad of %d)", bad, full);
        fox_json_free(&v);
    }
    check(!fake_misuse, "niah: no misuse of the model");
    evals_free(&e);
}

// ---- Passkey prompts, scoring, lengths (docs/model.md §8.2) ----

enum { PP_EXACT, PP_TASK, PP_LINE, PP_FILLER, PP_QUESTION, PP_KEY, PP_DEPTH, PP_SAME_SEED, PP_OTHER_SEED, PP_COUNT };
static const char *const pk_props[PP_COUNT] = {
    "exactly L tokens", "<|endoftext|>, then the task", "the key's line at the returned position",
    "the filler before and after it, continued across it", "the question ends the prompt",
    "the key: 5 digits, draw 2i of stream 1004 at L*2^24, in the prompt's text",
    "the filler before the key: draw 2i+1 of that share", "the same prompt for the same seed",
    "another seed (7): its own key (its draw 2i), another prompt"};

static void test_passkey_prompts(void) {
    FoxArgs a = default_args(), b;
    a.eval_passkey = 1;
    a.passkey_lengths = "300,1000";
    b = a;
    b.seed = 7;
    Evals e, again, other;
    FoxConfig c1, c2, c3;
    setup(&e, &a, &c1, FOX_VOCAB_GPT2, TRAIN_SEQ_LEN);
    setup(&again, &a, &c2, FOX_VOCAB_GPT2, TRAIN_SEQ_LEN);
    setup(&other, &b, &c3, FOX_VOCAB_GPT2, TRAIN_SEQ_LEN);
    const int lengths[2] = {300, 1000};
    check(e.pk.n_lengths == 2 && same(e.pk.lengths, lengths, 2) && e.pk.trials == 10, "passkey: --passkey-lengths 300,1000, 10 trials by default");
    TokenList task = enc(DOC_PK_TASK), filler = enc(DOC_PK_FILLER), question = enc(DOC_PK_QUESTION);
    uint64_t rk = fox_rng_key(1337, 1004), rk7 = fox_rng_key(7, 1004);
    int bad[PP_COUNT] = {0}, distinct = 1, prompts = 0;
    double lo = 1.0, hi = 0.0;
    for (int li = 0; li < 2; li++) {
        int L = lengths[li], keys[10];
        for (int k = 0; k < 10; k++, prompts++) {
            int *out = prompt_buffer(L), *out2 = prompt_buffer(L), *out3 = prompt_buffer(L);
            int pos = passkey_prompt(&e, L, k, out), pos2 = passkey_prompt(&again, L, k, out2);
            passkey_prompt(&other, L, k, out3);
            int key = keys[k] = passkey_key(&e, L, k);
            char line[128], want[128];
            snprintf(line, sizeof line, DOC_PK_LINE, key, key);
            snprintf(want, sizeof want, "The pass key is %d. Remember it. %d is the pass key.", key, key);
            TokenList info = enc(line);
            int fill = L - 1 - task.n - info.n - question.n, before = pos - 1 - task.n;
            uint64_t at = (uint64_t)L << 24;
            int ok[PP_COUNT] = {0};
            ok[PP_EXACT] = prompt_exact(out, L);
            ok[PP_TASK] = out[0] == FOX_EOT && same(out + 1, task.ids, task.n);
            ok[PP_LINE] = before >= 0 && before <= fill && same(out + pos, info.ids, info.n);
            if (ok[PP_LINE]) {
                ok[PP_FILLER] = 1;
                for (int i = 0; i < fill; i++)
                    ok[PP_FILLER] &= out[i < before ? 1 + task.n + i : pos + info.n + i - before] == filler.ids[i % filler.n];
                ok[PP_DEPTH] = before == (int)(fox_rng_uniform(rk, at + 2 * (uint64_t)k + 1) * fill);
                if (before / (double)fill < lo) lo = before / (double)fill;
                if (before / (double)fill > hi) hi = before / (double)fill;
            }
            ok[PP_QUESTION] = same(out + L - question.n, question.ids, question.n);
            char *text = dec(out, L);
            ok[PP_KEY] = key >= 10000 && key <= 99999 && key == 10000 + (int)fox_rng_below(rk, at + 2 * (uint64_t)k, 90000) &&
                         strstr(text, want) != NULL;
            ok[PP_SAME_SEED] = pos2 == pos && same(out2, out, L);
            int key7 = passkey_key(&other, L, k);
            ok[PP_OTHER_SEED] = key7 == 10000 + (int)fox_rng_below(rk7, at + 2 * (uint64_t)k, 90000) && key7 != key && !same(out3, out, L);
            for (int p = 0; p < PP_COUNT; p++) bad[p] += !ok[p];
            for (int j = 0; j < k; j++) distinct &= keys[j] != key;
            free(text); free(info.ids); free(out); free(out2); free(out3);
        }
    }
    for (int p = 0; p < PP_COUNT; p++) check(!bad[p], "passkey prompts: %s (%d of %d bad)", pk_props[p], bad[p], prompts);
    check(distinct, "passkey: the keys of a length's trials differ");
    check(lo < 0.25 && hi > 0.75, "passkey: the key's depth spreads over the filler across trials (%.2f .. %.2f)", lo, hi);
    free(task.ids); free(filler.ids); free(question.ids);
    evals_free(&e); evals_free(&again); evals_free(&other);
}

static void test_passkey_correct(void) {
    static const struct { const char *text; int key, correct; } cases[] = {
        {"12345", 12345, 1}, {" 12345.", 12345, 1}, {"The pass key is 12345", 12345, 1}, {" 12345 is the key", 12345, 1},
        {"123456", 12345, 0}, {"1234", 12345, 0}, {"no digits", 12345, 0}, {" 54321.", 12345, 0}, {"", 12345, 0},
        {" 1 then 12345", 12345, 0},  // the first number counts
        {"012345", 12345, 0},         // not the key's digits exactly
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check(passkey_correct(cases[i].text, cases[i].key) == cases[i].correct, "passkey_correct(\"%s\", %d) = %d", cases[i].text,
              cases[i].key, cases[i].correct);
}

static void test_passkey_lengths(void) {
    FoxArgs a = default_args();
    a.eval_passkey = 1;
    Evals e;
    FoxConfig cfg;
    setup(&e, &a, &cfg, FOX_VOCAB_GPT2, 300);
    const int four[4] = {300, 600, 1200, 2400};
    check(e.pk.n_lengths == 4 && same(e.pk.lengths, four, 4), "passkey_lengths \"\", context 300: 300, 600, 1200, 2400");
    evals_free(&e);
    a.passkey_lengths = "100,200";
    setup(&e, &a, &cfg, FOX_VOCAB_GPT2, 300);
    const int two[2] = {100, 200};
    check(e.pk.n_lengths == 2 && same(e.pk.lengths, two, 2), "passkey_lengths \"100,200\": 100, 200");
    evals_free(&e);
    static const char *const bad[] = {"abc", "100,,200", ",100", "0", "-5", "100x", "100;200", "100,"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char what[64], want[160];
        a.passkey_lengths = bad[i];
        snprintf(what, sizeof what, "passkey: --passkey-lengths \"%s\"", bad[i]);
        snprintf(want, sizeof want, "error: --passkey-lengths %s: expected lengths in tokens (1 to 16777216) separated by commas", bad[i]);
        check_init_exit(what, &a, FOX_VOCAB_GPT2, 300, 2, want);
    }
    a.passkey_lengths = "50";
    check_init_exit("passkey: --passkey-lengths 50 (too short)", &a, FOX_VOCAB_GPT2, 300, 2, "error: --passkey-lengths: 50 tokens is shorter");
}

// ---- Passkey greedy generation and passkey.json ----

static int pk_found[2][4];  // the key the fake read in each prompt

// The fake's answers: the key it reads in the prompt's text, right for trial 0 of length 300 and the even
// trials of 600, one more (wrong) otherwise.
static int pk_right(int L, int b) { return L == 300 ? b == 0 : b % 2 == 0; }

static const char *pk_answer(const int *prompt, int L, int b) {
    static char text[32];
    char *s = dec(prompt, L);
    const char *at = strstr(s, "The pass key is ");
    int key = at ? atoi(at + strlen("The pass key is ")) : -1;
    free(s);
    pk_found[L == 300 ? 0 : 1][b] = key;
    snprintf(text, sizeof text, " %d.", pk_right(L, b) ? key : key + 1);
    return text;
}

static void test_passkey_run(const char *tmp) {
    FoxArgs a = default_args();
    a.eval_passkey = 1;
    a.passkey_lengths = "300,600";
    a.passkey_trials = 4;
    Evals e;
    FoxConfig cfg;
    setup(&e, &a, &cfg, FOX_VOCAB_GPT2, TRAIN_SEQ_LEN);
    fake_answer = pk_answer;
    fake_misuse = 0;
    char out[4400];
    snprintf(out, sizeof out, "%s/passkey_out", tmp);
    ModelOptions proto;
    memset(&proto, 0, sizeof proto);
    evals_open_task(&e, 1, proto);
    int stopped = 0;
    double mean = passkey_run(&e, 7, out, &stopped);
    check(mean == 3.0 / 8 && !stopped && !fake_misuse, "passkey: mean %.4f over the trials (expected 3/8), %d misuses", mean, fake_misuse);
    FoxJsonValue v;
    if (load_json(out, "passkey.json", &v)) {
        const int lengths[2] = {300, 600};
        const FoxJsonValue *acc = fox_json_get(&v, "accuracy");
        check(j_str(fox_json_get(&v, "task"), "passkey") && j_int(fox_json_get(&v, "step"), 7) &&
              j_int(fox_json_get(&v, "train_seq_len"), TRAIN_SEQ_LEN) && j_int(fox_json_get(&v, "trials"), 4) &&
              j_int(fox_json_get(&v, "seed"), 1337) && j_ints(fox_json_get(&v, "lengths"), lengths, 2) &&
              j_nulls(fox_json_get(&v, "acp_pruned"), 2),
              "passkey.json: task, step, train_seq_len, trials, seed, lengths, acp_pruned");
        check(acc && acc->n == 2 && j_num(j_at(acc, 0), 0.25, 1e-9) && j_num(j_at(acc, 1), 0.5, 1e-9) &&
              j_num(fox_json_get(&v, "mean"), 0.375, 1e-9),
              "passkey.json: accuracy 0.25 (length 300), 0.5 (length 600), mean 0.375");
        int bad = 0;
        for (int c = 0; c < 8; c++) {
            int L = lengths[c / 4], k = c % 4, key = pk_found[c / 4][k];
            const FoxJsonValue *cell = j_at(fox_json_get(&v, "cells"), c);
            char key_text[16], text[32];
            snprintf(key_text, sizeof key_text, "%d", key);
            snprintf(text, sizeof text, " %d.", pk_right(L, k) ? key : key + 1);
            int *prompt = prompt_buffer(L), pos = passkey_prompt(&e, L, k, prompt);
            bad += !j_int(fox_json_get(cell, "length"), L) || !j_int(fox_json_get(cell, "trial"), k) ||
                   !j_str(fox_json_get(cell, "key"), key_text) || !j_int(fox_json_get(cell, "needle_pos"), pos) ||
                   !j_int(fox_json_get(cell, "correct"), pk_right(L, k)) || !j_str(fox_json_get(cell, "text"), text);
            free(prompt);
        }
        check(!bad && fox_json_get(&v, "cells")->n == 8,
              "passkey.json: 8 cells with length, trial, the key read in the prompt, needle_pos, correct, the scripted text (%d bad)", bad);
        fox_json_free(&v);
    }
    remove_in(out, "passkey.json");
    double again = passkey_run(&e, 7, NULL, &stopped);
    check(again == mean && !exists(out, "passkey.json") && !exists(".", "passkey.json"), "passkey: out NULL: the same mean, no passkey.json");
    evals_free(&e);
}

// ---- Multiple choice (docs/model.md §8.3) ----

typedef struct {
    int n, ids[24];
    long long bytes;
} Seq;

typedef struct {
    Seq ctx, choice[3];
    int n_choices, label;
} McItem;

#define MC_CTX "The cat sat on the warm mat by the door of the old house, and then"
#define MC_END0 "it purred."
#define MC_END1 "unbelievably"  // one token of 12 bytes: acc_norm by bytes and by tokens disagree
#define MC_END2 "caf\xc3\xa9 au lait"  // 12 bytes of UTF-8 in 11 characters
#define MC_T 16                        // the evaluation context: rows longer are cut from the left

static const char mc_file[] =
    "{\"ind\": 4, \"ctx\": \"" MC_CTX "\", \"endings\": [\"" MC_END0 "\", \"" MC_END1 "\", \"" MC_END2 "\"], \"label\": 0}\n"
    "{\"context\": [11, 12, 13], \"choices\": [[20], [30, 31, 32]], \"label\": \"1\"}\n"
    "{\"context\": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20], \"choices\": [[40, 41, 42], [43]], \"label\": 0}\n"
    "   \n"
    "{\"context\": [5], \"choices\": [[2], [9, 17, 25, 33, 41, 49]], \"label\": 1}\n"
    "{\"context\": [], \"choices\": [[7, 8], [6]], \"label\": 1}\n";

static Seq seq_text(const char *text, int choice) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s%s", choice ? " " : "", text);  // a choice is encoded after a space
    TokenList t = enc(buf);
    Seq s = {t.n, {0}, (long long)strlen(text)};
    memcpy(s.ids, t.ids, (size_t)t.n * sizeof(int));
    free(t.ids);
    return s;
}

static Seq seq_ids(const int *ids, int n) {
    Seq s = {n, {0}, n};
    memcpy(s.ids, ids, (size_t)n * sizeof(int));
    return s;
}

// mc_file's items as the spec reads them (text encoded, ids as they are).
static int mc_items(McItem *it) {
    const int c1[] = {11, 12, 13}, c1a[] = {20}, c1b[] = {30, 31, 32};
    const int c2[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}, c2a[] = {40, 41, 42}, c2b[] = {43};
    const int c3[] = {5}, c3a[] = {2}, c3b[] = {9, 17, 25, 33, 41, 49};  // a short choice with the larger total, a long one per token
    const int none[1] = {0}, c4a[] = {7, 8}, c4b[] = {6};
    it[0] = (McItem){seq_text(MC_CTX, 0), {seq_text(MC_END0, 1), seq_text(MC_END1, 1), seq_text(MC_END2, 1)}, 3, 0};
    it[1] = (McItem){seq_ids(c1, 3), {seq_ids(c1a, 1), seq_ids(c1b, 3)}, 2, 1};
    it[2] = (McItem){seq_ids(c2, 20), {seq_ids(c2a, 3), seq_ids(c2b, 1)}, 2, 0};
    it[3] = (McItem){seq_ids(c3, 1), {seq_ids(c3a, 1), seq_ids(c3b, 6)}, 2, 1};
    it[4] = (McItem){seq_ids(none, 0), {seq_ids(c4a, 2), seq_ids(c4b, 1)}, 2, 1};
    return 5;
}

// The spec's log-likelihood of a choice under the fake's losses: the row [start] + the context's last
// tokens that fit T + the choice; minus the sum of the losses at the choice's targets.
static double spec_loglik(const Seq *ctx, const Seq *ch, int start, int T, int *truncated) {
    int keep = ctx->n < T - ch->n ? ctx->n : T - ch->n, row[64];
    row[0] = start;
    memcpy(row + 1, ctx->ids + ctx->n - keep, (size_t)keep * sizeof(int));
    memcpy(row + 1 + keep, ch->ids, (size_t)ch->n * sizeof(int));
    double ll = 0.0;
    for (int j = 0; j < ch->n; j++) ll -= fake_loss(keep + j, row[keep + j], row[keep + j + 1]);
    *truncated = keep < ctx->n;
    return ll;
}

typedef struct {
    double ll[3];
    int truncated[3], pred, pred_norm;
} McWant;

static McWant mc_want(const McItem *it, int start) {
    McWant w;
    w.pred = w.pred_norm = 0;
    for (int c = 0; c < it->n_choices; c++) {
        w.ll[c] = spec_loglik(&it->ctx, &it->choice[c], start, MC_T, &w.truncated[c]);
        if (w.ll[c] > w.ll[w.pred]) w.pred = c;
        if (w.ll[c] / it->choice[c].bytes > w.ll[w.pred_norm] / it->choice[w.pred_norm].bytes) w.pred_norm = c;
    }
    return w;
}

// Line `line` (from 0) of text, parsed into v (0 if there is none or it is not JSON).
static int mc_line(const char *text, int line, FoxJsonValue *v) {
    const char *p = text;
    for (int i = 0; i < line && p; i++) p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL;
    if (!p || !*p) return 0;
    char err[160];
    return fox_json_parse(p, strcspn(p, "\n"), v, err, sizeof err);
}

enum { MF_INDEX, MF_LOGLIK, MF_TOKENS, MF_BYTES, MF_TRUNCATED, MF_PRED, MF_COUNT };
static const char *const mc_fields[MF_COUNT] = {
    "index and label", "loglik: the sum over exactly the choice's targets (context cut from the left)", "tokens: the choice's",
    "bytes: UTF-8 bytes of the text (without the space), the count of ids", "truncated: true where the context was cut", "pred and pred_norm"};

// DIR/mc.jsonl and DIR/mc.json against the spec's values of items (start: the row's first token).
static void check_mc_files(const char *out, const char *file, const McItem *items, int n, int start, const char *what) {
    char path[4400];
    snprintf(path, sizeof path, "%s/mc.jsonl", out);
    size_t len = 0;
    char *text = fox_read_file(path, &len);
    int bad[MF_COUNT] = {0}, lines = 0;
    double hits = 0, hits_norm = 0;
    for (int i = 0; i < n; i++) {
        McWant w = mc_want(&items[i], start);
        hits += w.pred == items[i].label;
        hits_norm += w.pred_norm == items[i].label;
        FoxJsonValue v;
        if (!text || !mc_line(text, i, &v)) continue;
        lines++;
        const FoxJsonValue *ll = fox_json_get(&v, "loglik"), *tokens = fox_json_get(&v, "tokens"), *bytes = fox_json_get(&v, "bytes"),
                           *trunc = fox_json_get(&v, "truncated");
        bad[MF_INDEX] += !j_int(fox_json_get(&v, "index"), i) || !j_int(fox_json_get(&v, "label"), items[i].label);
        for (int c = 0; c < items[i].n_choices; c++) {
            bad[MF_LOGLIK] += !j_num(j_at(ll, c), w.ll[c], 0.0);
            bad[MF_TOKENS] += !j_int(j_at(tokens, c), items[i].choice[c].n);
            bad[MF_BYTES] += !j_int(j_at(bytes, c), items[i].choice[c].bytes);
            bad[MF_TRUNCATED] += !j_bool(j_at(trunc, c), w.truncated[c]);
        }
        int nc = items[i].n_choices;
        bad[MF_LOGLIK] += !ll || ll->n != nc;
        bad[MF_TOKENS] += !tokens || tokens->n != nc;
        bad[MF_BYTES] += !bytes || bytes->n != nc;
        bad[MF_TRUNCATED] += !trunc || trunc->n != nc;
        bad[MF_PRED] += !j_int(fox_json_get(&v, "pred"), w.pred) || !j_int(fox_json_get(&v, "pred_norm"), w.pred_norm);
        fox_json_free(&v);
    }
    int newlines = 0;
    for (size_t i = 0; text && i < len; i++) newlines += text[i] == '\n';
    check(text && lines == n && newlines == n && text[len - 1] == '\n', "mc.jsonl %s: one JSON line per item (%d of %d, %d lines)", what,
          lines, n, newlines);
    for (int k = 0; k < MF_COUNT; k++) check(!bad[k], "mc.jsonl %s: %s (%d bad)", what, mc_fields[k], bad[k]);
    free(text);
    FoxJsonValue v;
    if (load_json(out, "mc.json", &v)) {
        check(j_str(fox_json_get(&v, "task"), "mc") && j_int(fox_json_get(&v, "step"), 7) &&
              j_int(fox_json_get(&v, "train_seq_len"), TRAIN_SEQ_LEN) &&
              j_str(fox_json_get(&v, "file"), file) && j_int(fox_json_get(&v, "items"), n) && j_int(fox_json_get(&v, "context"), MC_T) &&
              j_num(fox_json_get(&v, "acc"), hits / n, 1e-6) && j_num(fox_json_get(&v, "acc_norm"), hits_norm / n, 1e-6),
              "mc.json %s: task, step, train_seq_len, file, items, context, acc %.4f, acc_norm %.4f", what, hits / n, hits_norm / n);
        fox_json_free(&v);
    }
}

static void test_mc(const char *tmp) {
    char file[4400], out[4400], first[4500];
    snprintf(file, sizeof file, "%s/items.jsonl", tmp);
    write_file(tmp, "items.jsonl", mc_file);
    McItem items[5];
    int n = mc_items(items);
    double hits = 0, hits_norm = 0;
    int cut = 0;
    for (int i = 0; i < n; i++) {
        McWant w = mc_want(&items[i], FOX_EOT);
        hits += w.pred == items[i].label;
        hits_norm += w.pred_norm == items[i].label;
        for (int c = 0; c < items[i].n_choices; c++) cut += w.truncated[c];
    }
    McWant w0 = mc_want(&items[0], FOX_EOT), w3 = mc_want(&items[3], FOX_EOT);
    int by_tokens = 0;  // item 0's choice if acc_norm divided by tokens instead of bytes
    for (int c = 1; c < items[0].n_choices; c++)
        if (w0.ll[c] / items[0].choice[c].n > w0.ll[by_tokens] / items[0].choice[by_tokens].n) by_tokens = c;
    check(w3.pred == 0 && w3.pred_norm == 1 && by_tokens != w0.pred_norm && cut >= 4 && hits != hits_norm,
          "mc: the items exercise acc != acc_norm (item 3: pred 0, pred_norm 1), bytes != tokens (item 0: pred_norm %d, by tokens %d) "
          "and truncation (%d rows cut)", w0.pred_norm, by_tokens, cut);
    const int batches[4] = {1, 2, 3, 16};
    ModelOptions proto;
    memset(&proto, 0, sizeof proto);
    for (int bi = 0; bi < 4; bi++) {
        FoxArgs a = default_args();
        a.eval_mc = file;
        a.eval_batch = batches[bi];
        Evals e;
        FoxConfig cfg;
        setup(&e, &a, &cfg, FOX_VOCAB_GPT2, MC_T);
        snprintf(out, sizeof out, "%s/mc_out_%d", tmp, batches[bi]);
        fake_misuse = 0;
        evals_open_task(&e, 2, proto);
        int stopped = 0;
        double acc_norm, acc = mc_run(&e, 7, out, &stopped, &acc_norm);
        check(acc == hits / n && acc_norm == hits_norm / n && !stopped && !fake_misuse,
              "mc --eval-batch %d: acc %.2f acc_norm %.2f (expected %.2f, %.2f), forwards within the model's shape", batches[bi], acc,
              acc_norm, hits / n, hits_norm / n);
        if (bi == 0) {
            check_mc_files(out, file, items, n, FOX_EOT, "(GPT-2 vocabulary)");
            snprintf(first, sizeof first, "%s/mc.jsonl", out);
        } else {
            char path[4500];
            snprintf(path, sizeof path, "%s/mc.jsonl", out);
            size_t la = 0, lb = 0;
            char *x = fox_read_file(first, &la), *y = fox_read_file(path, &lb);
            check(x && y && la == lb && !memcmp(x, y, la), "mc --eval-batch %d: mc.jsonl identical to --eval-batch 1's", batches[bi]);
            free(x);
            free(y);
        }
        evals_free(&e);
    }

    // Token ids under another vocabulary: the start token 0, no tokenizer.
    static const char small_file[] = "{\"context\": [], \"choices\": [[7, 8], [6]], \"label\": 1}\n"
                                     "{\"context\": [3, 4], \"choices\": [[5], [6, 7]], \"label\": 0}\n";
    write_file(tmp, "small.jsonl", small_file);
    snprintf(file, sizeof file, "%s/small.jsonl", tmp);
    const int s0[] = {3, 4}, s0a[] = {5}, s0b[] = {6, 7};
    McItem small[2] = {items[4], {seq_ids(s0, 2), {seq_ids(s0a, 1), seq_ids(s0b, 2)}, 2, 0}};
    McWant z = mc_want(&small[0], 0), gpt2 = mc_want(&small[0], FOX_EOT);
    check(z.ll[0] != gpt2.ll[0], "mc: the empty context's first target depends on the start token (the test can see it)");
    FoxArgs a = default_args();
    a.eval_mc = file;
    Evals e;
    FoxConfig cfg;
    setup(&e, &a, &cfg, 64, MC_T);
    check(!e.has_tok, "mc: a 64-token model loads no tokenizer");
    snprintf(out, sizeof out, "%s/mc_small", tmp);
    evals_open_task(&e, 2, proto);
    int stopped;
    double acc_norm;
    mc_run(&e, 7, out, &stopped, &acc_norm);
    check_mc_files(out, file, small, 2, 0, "(64 tokens, start 0)");
    remove_in(out, "mc.jsonl");
    remove_in(out, "mc.json");
    mc_run(&e, 7, NULL, &stopped, &acc_norm);
    check(!exists(out, "mc.jsonl") && !exists(out, "mc.json") && !exists(".", "mc.json"), "mc: out NULL: no mc.jsonl, no mc.json");
    evals_free(&e);
}

static void test_mc_errors(const char *tmp) {
    static const struct { const char *what, *text, *want; int vocab, status; } cases[] = {
        {"a line that is not JSON", "{\"context\": [1], \"choices\": [[2]], \"label\": 0}\n{oops}\n", "line 2: not JSON (", FOX_VOCAB_GPT2, 1},
        {"no context", "{\"choices\": [[2]], \"label\": 0}\n", "line 1: has no context", FOX_VOCAB_GPT2, 1},
        {"no choices key", "{\"context\": [1], \"label\": 0}\n", "line 1: has no choices", FOX_VOCAB_GPT2, 1},
        {"no label", "{\"context\": [1], \"choices\": [[2]]}\n", "line 1: has no \"label\"", FOX_VOCAB_GPT2, 1},
        {"an empty choice list", "{\"context\": [1], \"choices\": [], \"label\": 0}\n", "line 1: has no choices", FOX_VOCAB_GPT2, 1},
        {"a label out of range", "{\"context\": [1], \"choices\": [[2], [3]], \"label\": 2}\n", "line 1: label 2 is out of range (2 choices)",
         FOX_VOCAB_GPT2, 1},
        {"a label \"x\"", "{\"context\": [1], \"choices\": [[2]], \"label\": \"x\"}\n", "line 1: its label is not an integer", FOX_VOCAB_GPT2, 1},
        {"an empty choice", "{\"context\": [1], \"choices\": [[2], []], \"label\": 0}\n", "line 1: its choice 1 is empty", FOX_VOCAB_GPT2, 1},
        {"a token id outside the vocabulary", "{\"context\": [1], \"choices\": [[64]], \"label\": 0}\n",
         "line 1: its choice 0 holds something other than a token id", 64, 1},
        {"text without the GPT-2 vocabulary", "{\"context\": \"a cat\", \"choices\": [[2]], \"label\": 0}\n",
         "line 1: its context is text, which needs the GPT-2 vocabulary", 64, 1},
        {"a choice of 17 tokens, context 16", "{\"context\": [1], \"choices\": [[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]], \"label\": 0}\n",
         "line 1: its choice 0 has 17 tokens", FOX_VOCAB_GPT2, 1},
        // 1 + 0 + 16 - 1 = 16 inputs fit the context of 16 (the context dropped whole): only a longer choice stops the run.
        {"a choice of 16 tokens, context 16", "{\"context\": [1], \"choices\": [[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]], \"label\": 0}\n",
         "", FOX_VOCAB_GPT2, 0},
        {"a file of blank lines", "\n  \n", "", FOX_VOCAB_GPT2, 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[4400], want[4600], what[96];
        snprintf(path, sizeof path, "%s/bad%zu.jsonl", tmp, i);
        write_file(tmp, path + strlen(tmp) + 1, cases[i].text);
        if (cases[i].status == 2) snprintf(want, sizeof want, "error: --eval-mc %s holds no item", path);
        else if (cases[i].status) snprintf(want, sizeof want, "error: %s %s", path, cases[i].want);
        else want[0] = 0;
        snprintf(what, sizeof what, "mc: %s", cases[i].what);
        FoxArgs a = default_args();
        a.eval_mc = path;
        check_init_exit(what, &a, cases[i].vocab, MC_T, cases[i].status, want);
    }
}

// ---- MQAR (docs/model.md §8.4) ----

#define MQ_EXAMPLES 10
static FoxMqar mq;
static int mq_examples[MQ_EXAMPLES][32];

static int mq_index(const int *seq) {
    for (int i = 0; i < MQ_EXAMPLES; i++)
        if (same(mq_examples[i], seq, mq.seq_len)) return i;
    fake_misused("an MQAR row that is no test example");
    return -1;
}

// The spec's answer position: a key in the query section, with a next token.
static int mq_is_answer(const int *seq, int p) {
    return p >= 2 * mq.num_kv + 1 && p + 1 < mq.seq_len && seq[p] >= 1 && seq[p] <= (mq.vocab - 1) / 2;
}

// The value the pairs give key k (a perfect recall).
static int mq_recall(const int *seq, int k) {
    for (int i = 0; i < mq.num_kv; i++)
        if (seq[1 + 2 * i] == k) return seq[2 + 2 * i];
    return 0;
}

static int mq_target(const int *seq, int p) { return p + 1 < mq.seq_len ? seq[p + 1] : 0; }

// Right (by recall) at the answers of even examples, wrong at those of odd ones and everywhere else.
static int mq_even_right(const int *seq, int p) {
    if (mq_is_answer(seq, p) && mq_index(seq) % 2 == 0) return mq_recall(seq, seq[p]);
    return (mq_target(seq, p) + 1) % mq.vocab;
}

// Right everywhere but at the answers.
static int mq_right_elsewhere(const int *seq, int p) {
    return mq_is_answer(seq, p) ? (mq_target(seq, p) + 1) % mq.vocab : mq_target(seq, p);
}

static void check_mqar_json(const char *out, const char *dir, int correct, double accuracy) {
    FoxJsonValue v;
    if (!load_json(out, "mqar_result.json", &v)) return;
    check(j_str(fox_json_get(&v, "task"), "mqar") && j_int(fox_json_get(&v, "step"), 7) &&
          j_int(fox_json_get(&v, "train_seq_len"), TRAIN_SEQ_LEN) && j_str(fox_json_get(&v, "data"), dir) &&
          j_int(fox_json_get(&v, "vocab"), 64) && j_int(fox_json_get(&v, "num_kv"), 4) && j_int(fox_json_get(&v, "seq_len"), 32) &&
          j_int(fox_json_get(&v, "examples"), MQ_EXAMPLES) && j_int(fox_json_get(&v, "answers"), MQ_EXAMPLES * 4) &&
          j_int(fox_json_get(&v, "correct"), correct) && j_num(fox_json_get(&v, "accuracy"), accuracy, 0.0),
          "mqar_result.json: task, step, train_seq_len, data, vocab 64, num_kv 4, seq_len 32, examples 10, answers 40, correct %d, accuracy %g",
          correct, accuracy);
    fox_json_free(&v);
}

static void test_mqar(const char *tmp) {
    char dir[4400], cmd[4600], out[4400];
    snprintf(dir, sizeof dir, "%s/mqar", tmp);
    snprintf(out, sizeof out, "%s/mqar_out", tmp);
    snprintf(cmd, sizeof cmd,
             "./fox_data mqar --out '%s' --vocab 64 --num-kv 4 --seq-len 32 --train-examples %d --test-examples %d > /dev/null", dir,
             MQ_EXAMPLES, MQ_EXAMPLES);
    if (access("./fox_data", X_OK) || system(cmd)) {
        check(0, "mqar: ./fox_data mqar writes a data set (make fox_data)");
        return;
    }
    fox_mqar_read(dir, &mq);
    int answers = 0;
    for (int i = 0; i < MQ_EXAMPLES; i++) {
        fox_mqar_example(&mq, fox_mqar_split_key(mq.seed, FOX_MQAR_TEST), i, mq_examples[i]);
        for (int p = 0; p < mq.seq_len; p++) answers += mq_is_answer(mq_examples[i], p);
    }
    check(answers == MQ_EXAMPLES * 4, "mqar: the test split holds 40 answer positions (4 per example)");
    ModelOptions proto;
    memset(&proto, 0, sizeof proto);
    const int batches[3] = {3, 1, 16};  // 3: a last batch of one example; 16: more rows than examples
    for (int bi = 0; bi < 3; bi++) {
        FoxArgs a = default_args();
        a.eval_mqar = dir;
        a.eval_batch = batches[bi];
        Evals e;
        FoxConfig cfg;
        setup(&e, &a, &cfg, 64, 32);
        fake_misuse = 0;
        evals_open_task(&e, 3, proto);
        int stopped = 0;
        fake_next = mq_even_right;
        double acc = mqar_run(&e, 7, out, &stopped);
        check(acc == 0.5 && !stopped && !fake_misuse && e.mqar.examples == MQ_EXAMPLES,
              "mqar --eval-batch %d: right at the answers of even examples only: accuracy %g (expected 0.5)", batches[bi], acc);
        if (bi == 0) check_mqar_json(out, dir, 20, 0.5);
        fake_next = mq_right_elsewhere;
        acc = mqar_run(&e, 7, out, &stopped);
        check(acc == 0.0 && !fake_misuse, "mqar --eval-batch %d: right everywhere but at the answers: accuracy %g (expected 0)", batches[bi], acc);
        if (bi == 0) check_mqar_json(out, dir, 0, 0.0);
        evals_free(&e);
    }

    // Through evals_run, and a model whose vocabulary the data's tokens pass.
    FoxArgs a = default_args();
    a.eval_mqar = dir;
    Evals e;
    FoxConfig cfg;
    setup(&e, &a, &cfg, 64, 32);
    fake_next = mq_even_right;
    float params[1] = {0};
    EvalScores s;
    int rc = evals_run(&e, params, 7, NULL, proto, &s);
    check(rc == 0 && s.mqar == 0.5 && isnan(s.niah) && isnan(s.passkey) && isnan(s.mc_acc), "mqar: evals_run gives mqar 0.5, the others NAN");
    evals_free(&e);
    char want[4600];
    snprintf(want, sizeof want, "error: --eval-mqar %s: its tokens reach 63, past this model's vocabulary of 50", dir);
    check_init_exit("mqar: a model of 50 tokens", &a, 50, 32, 2, want);
}

int main(void) {
    if (!tokenizer_load(&tok, "data/gpt2_tokenizer.bin", NULL)) {
        printf("FAIL cannot load data/gpt2_tokenizer.bin (run from the repository root)\n0 passed, 1 failed\n");
        return 1;
    }
    char tmp[] = "/tmp/test_eval.XXXXXX";
    if (!mkdtemp(tmp)) fox_fatal("mkdtemp: %s", strerror(errno));
    test_linspace();
    test_niah_score();
    test_niah_prompts(tmp);
    test_niah_errors(tmp);
    test_niah_run(tmp);
    test_passkey_prompts();
    test_passkey_correct();
    test_passkey_lengths();
    test_passkey_run(tmp);
    test_mc(tmp);
    test_mc_errors(tmp);
    test_mqar(tmp);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd)) printf("     (could not remove %s)\n", tmp);
    tokenizer_free(&tok);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
