// test/test_decode.c: generation with the KV cache of train_fox.c (docs/model.md §7) against the full
// forward it must reproduce. For every preset and switch, with every term made to matter (norm weights and
// gate biases moved off their init): the prefill of a prompt (lengths 1, 2, 7 and 33) and then one decode
// step per token give, at every position, the logits of one forward over the whole sequence (Gated Slot
// Attention's decode steps continue its recurrent state instead of reading a cache; TransformerFAM's read
// their window and their feedback memory, which moves on after each block's last token, prompts ending
// inside a block and at its end), up to 3x past the prompt's length (the decoding model's context); greedy decoding twice is bitwise the same; with ACP,
// decoding reads fewer keys under a fast-forgetting gate and its logits stay within the ACP bound of the
// unpruned ones; the sampler's top-k selection gives the first k of a full sort, ties included; under the
// document mask (separators in the prompt, at its end and among the decoded tokens) decoding equals the
// masked full forward, and ACP reads no key before a sequence's latest separator. The full forward itself
// is checked against the PyTorch reference by test_fox.
// Usage: test_decode
#define TESTING
#include "train_fox.c"
#include "testing.h"     // check: PASS / FAIL lines and their count
#include "fox/sample.h"  // select_first_k, by_probability: the sampler's top-k

// fp32 against fp32 in another order of operations (the cache's keys are the forward's own; c continues
// the forward's double scan; only the attention's and the GEMMs' row counts differ): 1e-5 of the largest
// logit. ACP drops weights below e^-10/T of a row's largest: the logits move by a few 1e-5 at most.
#define TOL_DECODE 1e-5
#define TOL_ACP 1e-3

#define B_SEQ 2
#define N_LAYER 2
#define D_MODEL 64
#define N_HEAD 2
#define VOCAB 97

static uint64_t rng_state = 88172645463325252ULL;

static double uniform(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

static FoxConfig test_config(const char *preset, int qk_shared, int gate) {
    FoxConfig c;
    fox_config_defaults(&c);
    c.vocab_size = VOCAB;
    c.n_layer = N_LAYER;
    c.d_model = D_MODEL;
    c.n_head = N_HEAD;
    if (!fox_config_apply_preset(&c, preset)) fox_fatal("unknown preset %s", preset);
    c.mlp_hidden = 96;
    if (qk_shared) c.qk_norm_shared = 1;
    if (gate >= 0) c.forget_gate = gate;
    if (c.arch == FOX_ARCH_GSA) c.gsa_heads = c.n_head;
    if (c.arch == FOX_ARCH_FAM) {  // blocks of 7 (prompt 7 ends one) and 11 (prompt 33 ends one)
        int fox = c.forget_gate != FOX_FG_NONE;
        c.fam_block = fox ? 11 : 7;
        c.fam_memory = fox ? 5 : 3;
        c.fam_window_blocks = fox ? 2 : 1;
    }
    return c;
}

// The init with every norm weight moved by up to ±0.3 and every gate bias by gate_shift ± 1.
static void perturb(Model *m, double gate_shift) {
    int norms[] = {FOX_P_ln1_w, FOX_P_ln2_w, FOX_P_lnf_w, FOX_P_qnorm_w, FOX_P_knorm_w, FOX_P_onorm_w};
    for (size_t k = 0; k < sizeof(norms) / sizeof(norms[0]); k++) {
        const FoxParamInfo *p = &m->lay.p[norms[k]];
        for (size_t i = 0; i < p->numel; i++) m->params[p->offset + i] += (real)(0.6 * uniform() - 0.3);
    }
    const FoxParamInfo *g = &m->lay.p[FOX_P_fgate_b];
    for (size_t i = 0; i < g->numel; i++) m->params[g->offset + i] += (real)(gate_shift + 2.0 * uniform() - 1.0);
}

// A model for the prompt (B_SEQ x P) with the given weights and a cache of n positions.
static void decoder(Model *m, const FoxConfig *c, const Model *weights, int P, int n, int acp) {
    model_init(m, c, B_SEQ, P, 1);
    memcpy(m->params, weights->params, m->lay.total * sizeof(real));
    m->acp = acp;
    model_cache_init(m, n);
}

// Logits at positions P-1 .. n-1 of each sequence by prefill + decode, into out (B_SEQ, n, V) rows.
static void decode_all(Model *m, const int *tokens, int P, int n, real *out) {
    int V = m->cfg.vocab_size;
    int *prompt = fox_malloc((size_t)B_SEQ * P * sizeof(int)), next[B_SEQ];
    real *z = fox_malloc((size_t)B_SEQ * V * sizeof(real));
    for (int b = 0; b < B_SEQ; b++) memcpy(prompt + (size_t)b * P, tokens + (size_t)b * n, (size_t)P * sizeof(int));
    model_prefill(m, prompt, P, z);
    for (int t = P - 1; t < n; t++) {
        if (t >= P) {
            for (int b = 0; b < B_SEQ; b++) next[b] = tokens[(size_t)b * n + t];
            model_decode(m, next, z);
        }
        for (int b = 0; b < B_SEQ; b++) memcpy(out + ((size_t)b * n + t) * V, z + (size_t)b * V, (size_t)V * sizeof(real));
    }
    free(prompt);
    free(z);
}

// Largest |a - b| over positions P-1 .. n-1, relative to the largest |b| there.
static double rel_diff(const real *a, const real *b, int P, int n, int V) {
    double mx = 0.0, ref = 0.0;
    for (int s = 0; s < B_SEQ; s++)
        for (size_t i = ((size_t)s * n + P - 1) * V; i < ((size_t)s * n + n) * V; i++) {
            double d = fabs((double)a[i] - b[i]);
            mx = isnan(d) || d > mx ? (isnan(d) ? INFINITY : d) : mx;
            ref = fmax(ref, fabs((double)b[i]));
        }
    return mx / ref;
}

static void test_config_decode(const char *name, FoxConfig c) {
    int prompts[] = {1, 2, 7, 33}, V = c.vocab_size;
    for (size_t pi = 0; pi < sizeof(prompts) / sizeof(prompts[0]); pi++) {
        int P = prompts[pi], n = 3 * P + 9;
        Model full, dec;
        model_init(&full, &c, B_SEQ, n, 7);
        perturb(&full, c.forget_gate == FOX_FG_DATA_DEPENDENT ? 1.0 : 0.0);
        int *tokens = fox_malloc((size_t)B_SEQ * n * sizeof(int));
        for (int i = 0; i < B_SEQ * n; i++) tokens[i] = (int)(uniform() * V);
        model_forward(&full, tokens, NULL, B_SEQ, n);
        real *got = fox_calloc((size_t)B_SEQ * n * V, sizeof(real));
        decoder(&dec, &c, &full, P, n, 0);
        decode_all(&dec, tokens, P, n, got);
        double e = rel_diff(got, full.a.logits, P, n, V);
        check(e <= TOL_DECODE, "%-22s prompt %2d, %2d decode steps: logits at every position equal the full forward's "
              "(rel %.2e, tol %.0e)", name, P, n - P, e, TOL_DECODE);
        model_free(&dec);
        model_free(&full);
        free(got);
        free(tokens);
    }
}

// Greedy decoding is a function of the weights and prompt alone: twice, bitwise the same logits.
static void test_greedy_repeatable(void) {
    FoxConfig c = test_config("fox-pro", 0, -1);
    int P = 5, n = 40, V = c.vocab_size, tokens[B_SEQ * 40];
    Model w;
    model_init(&w, &c, B_SEQ, P, 3);
    perturb(&w, 1.0);
    real *z[2];
    for (int run = 0; run < 2; run++) {
        Model m;
        decoder(&m, &c, &w, P, n, 0);
        z[run] = fox_calloc((size_t)(n - P) * B_SEQ * V, sizeof(real));
        int prompt[B_SEQ * 5], next[B_SEQ];
        for (int i = 0; i < B_SEQ * P; i++) prompt[i] = (i * 31 + 5) % V;
        real *row = fox_malloc((size_t)B_SEQ * V * sizeof(real));
        model_prefill(&m, prompt, P, row);
        for (int t = P; t < n; t++) {
            for (int b = 0; b < B_SEQ; b++) {
                const real *zb = row + (size_t)b * V;
                int best = 0;
                for (int v = 1; v < V; v++) best = zb[v] > zb[best] ? v : best;
                next[b] = tokens[b * n + t] = best;
            }
            model_decode(&m, next, row);
            memcpy(z[run] + (size_t)(t - P) * B_SEQ * V, row, (size_t)B_SEQ * V * sizeof(real));
        }
        free(row);
        model_free(&m);
    }
    check(!memcmp(z[0], z[1], (size_t)(n - P) * B_SEQ * V * sizeof(real)), "greedy decoding twice: bitwise the same logits over %d steps", n - P);
    free(z[0]);
    free(z[1]);
    model_free(&w);
}

// A fast-forgetting gate (biases near -3: f ≈ 0.05) makes old keys negligible: ACP's decode reads a
// fraction of them and its logits stay within the bound of the unpruned decode's.
static void test_acp_decode(const char *preset) {
    FoxConfig c = test_config(preset, 0, -1);
    int P = 9, n = 120, V = c.vocab_size;
    Model w, plain, pruned;
    model_init(&w, &c, B_SEQ, P, 5);
    perturb(&w, -3.0);
    int *tokens = fox_malloc((size_t)B_SEQ * n * sizeof(int));
    for (int i = 0; i < B_SEQ * n; i++) tokens[i] = (int)(uniform() * V);
    real *a = fox_calloc((size_t)B_SEQ * n * V, sizeof(real)), *b = fox_calloc((size_t)B_SEQ * n * V, sizeof(real));
    decoder(&plain, &c, &w, P, n, 0);
    decoder(&pruned, &c, &w, P, n, 1);
    decode_all(&plain, tokens, P, n, a);
    decode_all(&pruned, tokens, P, n, b);
    double read = (double)pruned.cache.keys_read / pruned.cache.keys_cached, e = rel_diff(b, a, P, n, V);
    check(plain.cache.keys_read == plain.cache.keys_cached && read < 0.5,
          "%-11s ACP decode reads %.1f%% of the cached keys (without ACP: all) under a fast-forgetting gate", preset, 100 * read);
    check(e <= TOL_ACP, "%-11s ACP decode's logits within the ACP bound of the unpruned decode (rel %.2e, tol %.0e)", preset, e, TOL_ACP);
    model_free(&plain);
    model_free(&pruned);
    model_free(&w);
    free(a);
    free(b);
    free(tokens);
}

// The document mask (docs/model.md §1.8) in generation: a prompt of 33 tokens with separators (one at its
// last position) and separators among the 87 decoded tokens; every preset, without and with ACP. Without
// a learned gate ACP reads exactly the keys from each sequence's latest separator on.
static void test_doc_mask_decode(const char *preset) {
    FoxConfig c = test_config(preset, 0, -1);
    const int P = 33, n = 120, V = c.vocab_size, sep = 3;
    const int at[] = {0, 10, 11, 32, n + 5, n + 32, 50, 51, n + 90, 119};
    int *tokens = fox_malloc((size_t)B_SEQ * n * sizeof(int));
    for (int i = 0; i < B_SEQ * n; i++) {
        tokens[i] = (int)(uniform() * (V - 1));
        tokens[i] += tokens[i] >= sep;
    }
    for (size_t i = 0; i < sizeof(at) / sizeof(at[0]); i++) tokens[at[i]] = sep;
    Model full;
    model_init(&full, &c, B_SEQ, n, 7);
    perturb(&full, c.forget_gate == FOX_FG_DATA_DEPENDENT ? 1.0 : 0.0);
    full.doc_sep = sep;
    model_forward(&full, tokens, NULL, B_SEQ, n);
    long long want_read = 0;  // keys from the latest separator at or before each decode step's position on
    for (int b = 0; b < B_SEQ; b++) {
        int start = 0;
        for (int t = 0; t < n; t++) {
            if (tokens[b * n + t] == sep) start = t;
            if (t >= P) want_read += (long long)c.n_layer * c.n_head * (t + 1 - start);
        }
    }
    for (int acp = 0; acp < 2; acp++) {
        Model dec;
        real *got = fox_calloc((size_t)B_SEQ * n * V, sizeof(real));
        decoder(&dec, &c, &full, P, n, acp);
        dec.doc_sep = sep;
        decode_all(&dec, tokens, P, n, got);
        double e = rel_diff(got, full.a.logits, P, n, V), tol = acp && c.forget_gate != FOX_FG_NONE ? TOL_ACP : TOL_DECODE;
        check(e <= tol, "%-17s document mask%s: prompt %d with separators, %d decode steps over 4 more: logits equal "
              "the masked full forward's (rel %.2e, tol %.0e)", preset, acp ? ", ACP" : "     ", P, n - P, e, tol);
        if (acp && c.forget_gate == FOX_FG_NONE)
            check(dec.cache.keys_read == want_read, "%-17s document mask, ACP: decoding read %lld keys, the %lld from each "
                  "sequence's latest separator on", preset, dec.cache.keys_read, want_read);
        model_free(&dec);
        free(got);
    }
    model_free(&full);
    free(tokens);
}

// select_first_k then a sort of the k (fox/run.h's sampler) against a sort of the whole vocabulary, on
// probabilities with many ties (1000 distinct values over 50257 tokens).
static void test_top_k_selection(void) {
    const int V = 50257, ks[] = {1, 2, 40, 1000, 50256};
    double *p = (double *)fox_malloc((size_t)V * sizeof(double));
    int *all = (int *)fox_malloc((size_t)V * sizeof(int)), *sel = (int *)fox_malloc((size_t)V * sizeof(int));
    for (int v = 0; v < V; v++) p[v] = floor(uniform() * 1000.0) / 1000.0;
    for (int v = 0; v < V; v++) all[v] = v;
    sampler_p = p;
    qsort(all, (size_t)V, sizeof(int), by_probability);
    for (size_t i = 0; i < sizeof(ks) / sizeof(ks[0]); i++) {
        int k = ks[i];
        for (int v = 0; v < V; v++) sel[v] = v;
        select_first_k(sel, V, k, p);
        qsort(sel, (size_t)k, sizeof(int), by_probability);
        check(!memcmp(sel, all, (size_t)k * sizeof(int)), "top-%-5d by selection: the first %d of a full sort, ties by id", k, k);
    }
    free(p);
    free(all);
    free(sel);
}

int main(void) {
    enum { NONE, ROPE_ON, NORM_OFF, GATE_OFF, LLAMA, NO_MEMORY };
    struct { const char *name, *preset; int qk_shared, gate, mod; } cases[] = {
        {"fox-pro", "fox-pro", 0, -1, NONE},
        {"fox-llama", "fox-llama", 0, -1, NONE},
        {"transformer-pro", "transformer-pro", 0, -1, NONE},
        {"transformer-llama", "transformer-llama", 0, -1, NONE},
        {"fox-pro-qkshared", "fox-pro", 1, -1, NONE},
        {"fox-dataind", "fox-pro", 0, FOX_FG_DATA_INDEPENDENT, NONE},
        {"fox-fixed", "fox-pro", 0, FOX_FG_FIXED, NONE},
        {"fox-pro+rope", "fox-pro", 0, -1, ROPE_ON},
        {"fox-pro-output-norm", "fox-pro", 0, -1, NORM_OFF},
        {"fox-pro-output-gate", "fox-pro", 0, -1, GATE_OFF},
        {"gsa", "gsa", 0, -1, NONE},
        {"transformer-fam", "transformer-fam", 0, -1, NONE},
        {"fox-fam", "fox-fam", 0, -1, NONE},
        {"transformer-fam-llama", "transformer-fam", 0, -1, LLAMA},
        {"transformer-bswa", "transformer-fam", 0, -1, NO_MEMORY},
        {"fox-bswa", "fox-fam", 0, -1, NO_MEMORY},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        FoxConfig c = test_config(cases[i].preset, cases[i].qk_shared, cases[i].gate);
        c.rope |= cases[i].mod == ROPE_ON;
        c.output_norm &= cases[i].mod != NORM_OFF;
        c.output_gate &= cases[i].mod != GATE_OFF;
        if (cases[i].mod == LLAMA) c.qk_norm = c.kv_shift = c.output_gate = c.output_norm = 0;  // the paper's block
        if (cases[i].mod == NO_MEMORY) c.fam_memory = 0;  // BSWA alone
        test_config_decode(cases[i].name, c);
    }
    test_greedy_repeatable();
    test_acp_decode("fox-pro");
    test_acp_decode("fox-llama");
    const char *presets[] = {"fox-pro", "fox-llama", "transformer-pro", "transformer-llama"};
    for (int i = 0; i < 4; i++) test_doc_mask_decode(presets[i]);
    test_top_k_selection();
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
