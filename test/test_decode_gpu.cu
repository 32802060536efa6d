// test/test_decode_gpu.cu: generation with the KV cache of train_fox.cu (docs/model.md §7) against the full
// forward it must reproduce, on the GPU. For every preset and switch test_foxcu covers (head_dim 64; 128 for
// fox-pro and transformer-pro), with every term made to matter (norm weights N(1, 0.1²), gate biases moved by
// ±1, the q and k projections scaled so that the scores, hence RoPE and the keys' order, count): the prefill of
// a prompt (lengths 1, 7 and 33; batch 3, 1 and 6) and then one decode step per token give, at every position
// up to 3x past the prompt's length (the decoding model's context), the logits of one forward over the whole
// sequence; a prefill under --recompute 1 and 2 gives bitwise the decode of level 0; greedy decoding twice is
// bitwise the same; with ACP and fast-forgetting gates (biases near -4) the decode reads a fraction of the
// cached keys, its attention stays within the ACP bound of the attention over every key (in double, from the
// GPU's cache) and its logits near the unpruned decode's; a cache that does not fit is refused before
// anything is allocated, with one line and exit 1; a decode step past the cache's end too. The document mask
// (docs/model.md §1.8), with and without ACP, fox-pro and transformer-pro: prompts with separators (one at the
// prompt's last position) and decoded separators give the full forward's logits with the mask, and ACP's decode
// reads at most the keys of each token's document (exactly those without a forget gate). Gated Slot Attention
// (docs/model.md §1.9, head_dim 64 and 128, 64 slots): the prefill (the chunked kernels, a prompt of 1000 tokens
// over 16 chunks too) and then one step of the recurrence per token give the full forward's logits.
// TransformerFAM (docs/model.md §1.10, K = 128, head_dim 64 and 128, transformer-fam and fox-fam, and BSWA alone):
// prompts ending inside and at the end of a block, then decode steps over several blocks (memory updates), give the
// full forward's logits.
// The full forward itself is checked against the PyTorch reference by test_fox.
// Usage: test_decode_gpu   (test_decode_gpu refuse-cache | decode-past-end: the refusals, run as a child)
#define TESTING
#include "train_fox.cu"
#include <sys/wait.h>  // WIFEXITED, WEXITSTATUS: the refusals' exit status
#include <unistd.h>    // readlink
#include "testing.h"   // check: PASS / FAIL lines and their count

// Tolerances, as max |error| over the largest |logit| of the positions compared. The decode computes the
// forward's function with the same bf16 operands, but its GEMMs run on B rows instead of B·T (another
// cuBLASLt algorithm, another fp32 summation order) and its attention sums the keys in flash-decoding
// chunks instead of the forward kernel's tiles. An fp32 difference of ~1e-6 relative moves a bf16 rounding
// of an operand by one unit (2^-8 relative) now and then, and the operands are rounded anew in every layer,
// so the logits agree at bf16 level, the bound test_foxcu sets the GPU's logits against float64 (2e-2).
// ACP: each skipped key weighs below e^-10/(t+1) of its row's largest, so an attention output moves by less
// than 2e^-10 max|v| = 9e-5 max|v|, checked in double on the last step's attention (check_acp_attention).
// Through the network that is one more perturbation of the bf16 operands: where the skipped weight is near
// the bound (fox-llama: no QK-norm, so U is tight), it moves about 1% of o's bf16 roundings by a unit, which
// the blocks carry to the logits as they carry any rounding (measured 3.5e-3 for fox-llama, whose decode
// differs from its full forward by 6e-3 at bf16 level): 1e-2 on the logits.
#define TOL_DECODE 2e-2
#define TOL_ACP 1e-2

#define VOCAB 512
#define N_LAYER 2
#define N_HEAD 2
#define QK_SCALE 4.0  // the q and k rows of attn_in_w: std 0.08 instead of 0.02

static FoxConfig test_config(const char *preset, int dh, int qk_shared, int gate) {
    FoxConfig c;
    fox_config_defaults(&c);
    c.vocab_size = VOCAB;
    c.n_layer = N_LAYER;
    c.n_head = N_HEAD;
    c.d_model = N_HEAD * dh;
    if (!fox_config_apply_preset(&c, preset)) fox_fatal("unknown preset %s", preset);
    if (c.arch == FOX_ARCH_GSA) c.gsa_heads = N_HEAD;  // GSA's heads are its n_head, 64 slots
    if (qk_shared) c.qk_norm_shared = 1;
    if (gate >= 0) c.forget_gate = gate;
    return c;
}

// The shared init (seed 7) with every norm weight drawn from N(1, 0.1²), every gate bias moved by
// gate_shift ± 1, and attn_in_w's q and k rows scaled by QK_SCALE: host weights in the FOX_PARAMS layout.
static float *test_weights(const FoxConfig *c, double gate_shift) {
    FoxLayout lay;
    fox_layout(c, &lay);
    AttnCols cols = fox_attn_cols(c);
    float *w = (float *)fox_malloc(lay.total * sizeof(float));
    fox_init_params(c, &lay, w, 7);
    uint64_t key = fox_rng_key(99, 0), n = 0;
    int norms[] = {FOX_P_ln1_w, FOX_P_ln2_w, FOX_P_lnf_w, FOX_P_qnorm_w, FOX_P_knorm_w, FOX_P_onorm_w};
    for (size_t k = 0; k < sizeof(norms) / sizeof(norms[0]); k++) {
        const FoxParamInfo *p = &lay.p[norms[k]];
        for (size_t i = 0; i < p->numel; i++) w[p->offset + i] = (float)(1.0 + 0.1 * fox_rng_normal(key, n++));
    }
    const FoxParamInfo *g = &lay.p[FOX_P_fgate_b];
    for (size_t i = 0; i < g->numel; i++) w[g->offset + i] += (float)(gate_shift + 2.0 * fox_rng_uniform(key, n++) - 1.0);
    const FoxParamInfo *in = &lay.p[FOX_P_attn_in_w];
    for (int l = 0; l < c->n_layer; l++)
        for (size_t r = (size_t)cols.q; r < (size_t)cols.k + c->d_model; r++)  // the q rows, then the k rows
            for (size_t i = 0; i < in->cols; i++) w[fox_param_offset(&lay, FOX_P_attn_in_w, l) + r * in->cols + i] *= QK_SCALE;
    return w;
}

static int *random_tokens(int count, uint64_t seed) {
    int *t = (int *)fox_malloc((size_t)count * sizeof(int));
    for (int i = 0; i < count; i++) t[i] = (int)fox_rng_below(fox_rng_key(seed, 1), (uint64_t)i, VOCAB);
    return t;
}

// A forward-only model of B x T tokens with the weights w; doc_sep: the document mask's separator (-1: none).
static void test_model(Model *m, const FoxConfig *c, const float *w, int B, int T, int recompute, int acp, int doc_sep) {
    ModelOptions o = {B, T, 7, 1, recompute, acp, doc_sep, 0, 1, 0, 0, 0};
    model_init(m, c, &o);
    model_set_params(m, w);
}

// Logits (B, n, V) of one forward over all of tokens (B x n), with the document mask of doc_sep (-1: none).
static float *full_logits(const FoxConfig *c, const float *w, const int *tokens, int B, int n, int doc_sep) {
    Model m;
    test_model(&m, c, w, B, n, RECOMPUTE_NONE, 0, doc_sep);
    model_forward(&m, tokens, NULL, B, n);
    float *out = (float *)fox_malloc((size_t)B * n * c->vocab_size * sizeof(float));
    model_logits_rows(&m, 0, B * n, out);
    model_free(&m);
    return out;
}

// The logits at positions P-1 .. n-1 of each sequence of tokens (B x n) into out (B, n, V): a model for the
// prompt (B x P) with a cache of n positions, the prefill of the first P tokens, then one decode step per
// token. Returns the fraction of cached keys read (model_decode_keys_read). doc_sep: the document mask's
// separator (-1: none). keep: NULL, or where the model goes afterwards (the caller frees it).
static double decode_logits(const FoxConfig *c, const float *w, const int *tokens, int B, int P, int n, int recompute,
                            int acp, int doc_sep, float *out, Model *keep) {
    int V = c->vocab_size;
    Model m;
    test_model(&m, c, w, B, P, recompute, acp, doc_sep);
    model_cache_init(&m, n);
    int *prompt = (int *)fox_malloc((size_t)B * P * sizeof(int)), *next = (int *)fox_malloc((size_t)B * sizeof(int));
    float *z = (float *)fox_malloc((size_t)B * V * sizeof(float));
    for (int b = 0; b < B; b++) memcpy(prompt + (size_t)b * P, tokens + (size_t)b * n, (size_t)P * sizeof(int));
    model_prefill(&m, prompt, P, z);
    for (int t = P - 1; t < n; t++) {
        if (t >= P) {
            for (int b = 0; b < B; b++) next[b] = tokens[(size_t)b * n + t];
            model_decode(&m, next, z);
        }
        for (int b = 0; b < B; b++) memcpy(out + ((size_t)b * n + t) * V, z + (size_t)b * V, (size_t)V * sizeof(float));
    }
    double read = model_decode_keys_read(&m);
    if (keep) *keep = m;
    else model_free(&m);
    free(prompt);
    free(next);
    free(z);
    return read;
}

// Largest |a - b| over positions P-1 .. n-1 of the B sequences, relative to the largest |b| there.
static double rel_diff(const float *a, const float *b, int B, int P, int n, int V) {
    double mx = 0.0, ref = 0.0;
    for (int s = 0; s < B; s++)
        for (size_t i = ((size_t)s * n + P - 1) * V; i < ((size_t)s * n + n) * V; i++) {
            double d = fabs((double)a[i] - b[i]);
            mx = isnan(d) || d > mx ? (isnan(d) ? INFINITY : d) : mx;
            ref = fmax(ref, fabs((double)b[i]));
        }
    return mx / ref;
}

// Prefill + decode against the full forward, at prompt lengths 1, 7 and 33 (batch 3, 1, 6: the decode GEMV
// serves batch 1, cuBLASLt the others), n = 3P + 9; long:
// a prompt of 1000 tokens (several attention tiles) and 700 decode steps (the attention in several chunks).
static void test_config_decode(const char *name, const FoxConfig *c, int long_context) {
    const int prompts[] = {1, 7, 33}, batches[] = {3, 1, 6};
    float *w = test_weights(c, 0.0);
    for (int i = 0; i < (long_context ? 1 : 3); i++) {
        int P = long_context ? 1000 : prompts[i], B = long_context ? 1 : batches[i], n = long_context ? 1700 : 3 * P + 9;
        int V = c->vocab_size;
        int *tokens = random_tokens(B * n, 100 + i);
        float *full = full_logits(c, w, tokens, B, n, -1), *got = (float *)fox_calloc((size_t)B * n * V, sizeof(float));
        decode_logits(c, w, tokens, B, P, n, RECOMPUTE_NONE, 0, -1, got, NULL);
        double e = rel_diff(got, full, B, P, n, V);
        check(e <= TOL_DECODE, "%-24s B=%d prompt %2d + %2d decode steps: logits at every position = the full forward's "
              "(rel %.2e, tol %.0e)", name, B, P, n - P, e, TOL_DECODE);
        free(tokens);
        free(full);
        free(got);
    }
    free(w);
}

// The prefill fills the cache during the forward, so every recompute level (one activation slice for all
// blocks at level 2) gives bitwise the same decode.
static void test_recompute_levels(void) {
    FoxConfig c = test_config("fox-pro", 64, 0, -1);
    int B = 3, P = 7, n = 30, V = c.vocab_size;
    float *w = test_weights(&c, 0.0), *z[3];
    int *tokens = random_tokens(B * n, 200);
    for (int level = 0; level < 3; level++) {
        z[level] = (float *)fox_calloc((size_t)B * n * V, sizeof(float));
        decode_logits(&c, w, tokens, B, P, n, level, 0, -1, z[level], NULL);
    }
    size_t bytes = (size_t)B * n * V * sizeof(float);
    check(!memcmp(z[0], z[1], bytes) && !memcmp(z[0], z[2], bytes),
          "%-24s prefill under --recompute 1 and 2: the decode's logits bitwise those of level 0", "fox-pro");
    for (int level = 0; level < 3; level++) free(z[level]);
    free(w);
    free(tokens);
}

// Greedy decoding is a function of the weights and the prompt alone: twice, bitwise the same logits.
static void test_greedy_repeatable(const char *preset, int acp) {
    FoxConfig c = test_config(preset, 64, 0, -1);
    int B = 3, P = 5, n = 40, V = c.vocab_size;
    float *w = test_weights(&c, acp ? -4.0 : 0.0), *z[2];
    int *prompt = random_tokens(B * P, 300), next[3];
    float *row = (float *)fox_malloc((size_t)B * V * sizeof(float));
    for (int run = 0; run < 2; run++) {
        Model m;
        test_model(&m, &c, w, B, P, RECOMPUTE_NONE, acp, -1);
        model_cache_init(&m, n);
        z[run] = (float *)fox_calloc((size_t)(n - P) * B * V, sizeof(float));
        model_prefill(&m, prompt, P, row);
        for (int t = P; t < n; t++) {
            for (int b = 0; b < B; b++) {
                const float *zb = row + (size_t)b * V;
                int best = 0;
                for (int v = 1; v < V; v++) best = zb[v] > zb[best] ? v : best;
                next[b] = best;
            }
            model_decode(&m, next, row);
            memcpy(z[run] + (size_t)(t - P) * B * V, row, (size_t)B * V * sizeof(float));
        }
        model_free(&m);
    }
    check(!memcmp(z[0], z[1], (size_t)(n - P) * B * V * sizeof(float)),
          "%-24s greedy decoding twice%s: bitwise the same logits over %d steps", preset, acp ? " with ACP" : "", n - P);
    free(z[0]);
    free(z[1]);
    free(w);
    free(prompt);
    free(row);
}

template <typename T> static T *host_copy(const T *dev, size_t n) {
    T *h = (T *)fox_malloc(n * sizeof(T));
    FOX_CUDA_CHECK(cudaMemcpy(h, dev, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}

// The last decode step's attention in the last block, in double on the host from what the GPU left (the
// cache, q, each row's first key, the output o): the output over the keys [first, t] is within 2e^-10 max|v|
// of the output over every key (the ACP bound: what the skipped keys weigh); the first key is
// fox_acp_first_key's for the bound U computed here (from the QK-norm weights, else from |q_t| and the
// largest cached |k_j|²; a row whose boundary key sits within 1e-4 of delta may go either way); the GPU's
// o is this one at bf16 level. Some rows must skip keys.
static void check_acp_attention(Model *m, const char *name) {
    const FoxConfig *c = &m->cfg;
    Cache *kc = &m->cache;
    int l = c->n_layer - 1, H = c->n_head, BH = m->B * H, dh = m->Dh, t = kc->len - 1, ML = kc->max_len;
    CacheLayer cl = cache_layer(m, l);
    bf16 *k = host_copy(cl.k, (size_t)BH * ML * dh), *v = host_copy(cl.v, (size_t)BH * ML * dh);
    bf16 *q = host_copy(kc->q, (size_t)BH * dh), *o = host_copy(m->a.o[0], (size_t)BH * dh);
    float *ch = host_copy(cl.c, (size_t)BH * ML), *params = host_copy(m->params, m->lay.total);
    int *first = host_copy(kc->first, (size_t)BH), wstride = c->qk_norm_shared ? 0 : dh, mismatch = 0, skipping = 0;
    const float *qw = c->qk_norm ? params + fox_param_offset(&m->lay, FOX_P_qnorm_w, l) : NULL;
    const float *kw = c->qk_norm ? params + fox_param_offset(&m->lay, FOX_P_knorm_w, l) : NULL;
    double worst_bound = 0.0, worst_o = 0.0, *s = (double *)fox_malloc((size_t)(t + 1) * sizeof(double));
    for (int bh = 0; bh < BH; bh++) {
        const bf16 *qr = q + (size_t)bh * dh, *kr = k + (size_t)bh * ML * dh, *vr = v + (size_t)bh * ML * dh;
        const float *cr = ch + (size_t)bh * ML;
        double U, q2 = 0.0, k2 = 0.0, vmax = 0.0, mq = 0.0, mk = 0.0;
        for (int i = 0; i < dh; i++) q2 += (double)__bfloat162float(qr[i]) * __bfloat162float(qr[i]);
        for (int j = 0; j <= t; j++) {
            double kk = 0.0, d = 0.0;
            for (int i = 0; i < dh; i++) {
                double x = __bfloat162float(kr[(size_t)j * dh + i]);
                kk += x * x;
                d += (double)__bfloat162float(qr[i]) * x;
                vmax = fmax(vmax, fabs((double)__bfloat162float(vr[(size_t)j * dh + i])));
            }
            k2 = fmax(k2, kk);
            s[j] = d / sqrt((double)dh) + (double)cr[t] - cr[j];
        }
        if (qw) {
            for (int i = 0; i < dh; i++) {
                mq = fmax(mq, fabs((double)qw[(bh % H) * wstride + i]));
                mk = fmax(mk, fabs((double)kw[(bh % H) * wstride + i]));
            }
            U = fox_acp_bound_qknorm(mq, mk, dh);
        } else {
            U = fox_acp_bound_norms(q2, k2, dh);
        }
        double delta = fox_acp_threshold(U, t + 1);
        int fh = fox_acp_first_key(cr, t, delta), fg = first[bh], edge = fg < fh ? fg : fh;
        mismatch += fg != fh && fabs((double)cr[t] - cr[edge] - delta) > 1e-4 * fabs(delta);
        skipping += fg > 0;
        for (int i = 0; i < dh; i++) {
            double all[2] = {0.0, 0.0}, read[2] = {0.0, 0.0}, mx = -INFINITY;
            for (int j = 0; j <= t; j++) mx = fmax(mx, s[j]);
            for (int j = 0; j <= t; j++) {
                double p = exp(s[j] - mx), x = __bfloat162float(vr[(size_t)j * dh + i]);
                all[0] += p * x;
                all[1] += p;
                if (j >= fg) {
                    read[0] += p * x;
                    read[1] += p;
                }
            }
            double o_all = all[0] / all[1], o_read = read[0] / read[1], got = __bfloat162float(o[(size_t)bh * dh + i]);
            worst_bound = fmax(worst_bound, fabs(o_all - o_read) / (2.0 * exp(FOX_ACP_LOG_EPS) * vmax));
            worst_o = fmax(worst_o, fabs(got - o_read) / (ldexp(fabs(o_read), -8) + 1e-5 * vmax));
        }
    }
    check(mismatch == 0 && skipping > 0 && worst_bound <= 1.0 && worst_o <= 1.0,
          "%-11s dh %3d ACP attention at t=%d: %d of %d rows skip keys; |o(all keys) - o(read)| <= %.2e x 2e^-10 max|v|; "
          "first key = the host's (%d mismatches); GPU o = the host's to %.2f of bf16 rounding", name, dh, t, skipping, BH,
          worst_bound, mismatch, worst_o);
    free(k); free(v); free(q); free(o); free(ch); free(params); free(first); free(s);
}

// Fast-forgetting gates (biases near -4: f ≈ 0.02) make old keys negligible: ACP's decode reads a fraction of
// the cached keys (QK-norm bound with fox-pro, the q and k norms' with fox-llama), its last attention is
// within the ACP bound (check_acp_attention), and its logits stay near the unpruned decode's.
static void test_acp_decode(const char *preset, int dh) {
    FoxConfig c = test_config(preset, dh, 0, -1);
    int B = 3, P = 9, n = 200, V = c.vocab_size;
    float *w = test_weights(&c, -4.0);
    int *tokens = random_tokens(B * n, 400);
    float *a = (float *)fox_calloc((size_t)B * n * V, sizeof(float)), *b = (float *)fox_calloc((size_t)B * n * V, sizeof(float));
    Model pruned;
    double plain = decode_logits(&c, w, tokens, B, P, n, RECOMPUTE_NONE, 0, -1, a, NULL);
    double read = decode_logits(&c, w, tokens, B, P, n, RECOMPUTE_NONE, 1, -1, b, &pruned), e = rel_diff(b, a, B, P, n, V);
    check(plain < 0 && read > 0 && read < 0.5, "%-11s dh %3d ACP decode reads %.1f%% of the cached keys over %d steps "
          "(without ACP: no count)", preset, dh, 100 * read, n - P);
    check_acp_attention(&pruned, preset);
    check(e <= TOL_ACP, "%-11s dh %3d ACP decode's logits near the unpruned decode's (rel %.2e, tol %.0e)", preset, dh, e,
          TOL_ACP);
    model_free(&pruned);
    free(w);
    free(tokens);
    free(a);
    free(b);
}

// The document mask (docs/model.md §1.8) in generation, for fox-pro and transformer-pro (no forget gate: c holds
// the separators' terms alone), with and without ACP: B sequences of n tokens whose separators (token DOC_SEP,
// nowhere else) lie in the prompt (row 0 at 0, P/2: a later key block's first document row in the prefill's ACP
// tiles at P = 300, and P - 1, the prompt's last position), among the decoded tokens (row 0 at P + 5, P + 6 and
// n - 10; row 1 at 5, P - 1, halfway and n - 1, the last) or nowhere (row 2). The decode steps, fed those tokens,
// give at every position the logits of one forward over the whole sequences with the mask, at the bf16 tolerance
// of the other cases (TOL_DECODE; with ACP the skipped keys of another document weigh exactly 0, and fox-pro's
// threshold skips keys below e^-10/(t+1) of their row's largest, far below it: see TOL_ACP). With ACP the decode
// reads the keys of each token's document at most (from its latest separator on, doc_start), exactly those
// without a forget gate, counted here by a loop of its own.
#define DOC_SEP 3

static void test_doc_decode(const char *preset, int B, int P, int n, int acp) {
    FoxConfig c = test_config(preset, 64, 0, -1);
    int V = c.vocab_size, L = c.n_layer, H = c.n_head;
    float *w = test_weights(&c, 0.0);
    int *tokens = random_tokens(B * n, 500 + P);
    for (int i = 0; i < B * n; i++)
        if (tokens[i] == DOC_SEP) tokens[i] = DOC_SEP + 1;
    for (int b = 0; b < B; b++) {
        int *row = tokens + (size_t)b * n;
        if (b % 3 == 0) {
            const int at[] = {0, P / 2, P - 1, P + 5, P + 6, n - 10};
            for (int k = 0; k < 6; k++) row[at[k]] = DOC_SEP;
        } else if (b % 3 == 1) {
            const int at[] = {5, P - 1, P + (n - P) / 2, n - 1};
            for (int k = 0; k < 4; k++) row[at[k]] = DOC_SEP;
        }
    }
    unsigned long long want_read = 0, want_cached = 0;  // ACP's keys with the document's start alone
    for (int t = P; t < n; t++)
        for (int b = 0; b < B; b++) {
            int start = 0;
            for (int j = 0; j <= t; j++)
                if (tokens[(size_t)b * n + j] == DOC_SEP) start = j;
            want_read += (unsigned long long)L * H * (t + 1 - start);
            want_cached += (unsigned long long)L * H * (t + 1);
        }
    double want = (double)want_read / (double)(long long)want_cached;
    float *full = full_logits(&c, w, tokens, B, n, DOC_SEP), *got = (float *)fox_calloc((size_t)B * n * V, sizeof(float));
    double read = decode_logits(&c, w, tokens, B, P, n, RECOMPUTE_NONE, acp, DOC_SEP, got, NULL);
    double e = rel_diff(got, full, B, P, n, V);
    check(e <= TOL_DECODE, "%-24s doc mask%s B=%d prompt %3d + %3d decode steps, separators in the prompt (at its end) and "
          "decoded: logits = the full forward's with the mask (rel %.2e, tol %.0e)", preset, acp ? " + ACP" : "", B, P,
          n - P, e, TOL_DECODE);
    if (acp) {
        int gated = c.forget_gate != FOX_FG_NONE;
        check(gated ? read > 0 && read <= want : read == want, "%-24s doc mask + ACP B=%d: the decode read %.2f%% of the "
              "cached keys, %s the keys of each token's document (%.2f%%)", preset, B, 100 * read,
              gated ? "at most" : "exactly", 100 * want);
    } else {
        check(read < 0, "%-24s doc mask B=%d without ACP: no count of keys read (%g)", preset, B, read);
    }
    free(w);
    free(tokens);
    free(full);
    free(got);
}

// TransformerFAM (docs/model.md §1.10) with blocks of K = 128 (the GPU's), B sequences of n = 512 tokens (four
// blocks): the prefill of P tokens, then one decode step per token (each block's last token updating every layer's
// memory from the cache), gives at every position the logits of one forward over the whole sequences, at the bf16
// tolerance of the other presets (TOL_DECODE: the memory updates read the decoded tokens' keys and values as the
// decode step rounded them). P = 100 ends inside block 0, P = 256 at the end of block 1 (the prefill then computes
// the update to F_2 itself). The line also shows how far the decode moves with fam_init negated (every memory
// changed), that the comparison sees the memory; M = 0 is BSWA alone.
#define FAM_N 512

static void test_fam_decode(const char *preset, int dh, int M, int W, int B, int P) {
    FoxConfig c = test_config(preset, dh, 0, -1);
    c.fam_block = 128;
    c.fam_memory = M;
    c.fam_window_blocks = W;
    int n = FAM_N, V = c.vocab_size;
    FoxLayout lay;
    fox_layout(&c, &lay);
    float *w = test_weights(&c, 0.0), *w_neg = (float *)fox_malloc(lay.total * sizeof(float));
    memcpy(w_neg, w, lay.total * sizeof(float));
    const FoxParamInfo *fi = &lay.p[FOX_P_fam_init];
    for (size_t i = 0; i < fi->numel; i++) w_neg[fi->offset + i] = -w_neg[fi->offset + i];
    int *tokens = random_tokens(B * n, 600 + P);
    float *full = full_logits(&c, w, tokens, B, n, -1), *got = (float *)fox_calloc((size_t)B * n * V, sizeof(float));
    float *neg = (float *)fox_calloc((size_t)B * n * V, sizeof(float));
    decode_logits(&c, w, tokens, B, P, n, RECOMPUTE_NONE, 0, -1, got, NULL);
    decode_logits(&c, w_neg, tokens, B, P, n, RECOMPUTE_NONE, 0, -1, neg, NULL);
    double e = rel_diff(got, full, B, P, n, V), e_neg = rel_diff(neg, full, B, P, n, V);
    char seen[64] = "no memory: BSWA alone";
    if (M) snprintf(seen, sizeof(seen), "with fam_init negated: rel %.2e", e_neg);
    check(e <= TOL_DECODE, "%-15s dh %3d K 128 M %2d W %d B=%d prompt %3d + %3d "
          "decode steps: logits at every position = the full forward's (rel %.2e, tol %.0e; %s)", preset, dh, M, W, B, P,
          n - P, e, TOL_DECODE, seen);
    free(w);
    free(w_neg);
    free(tokens);
    free(full);
    free(got);
    free(neg);
}

// The refusals, in a child process (they exit): a cache far larger than the device, and a decode step past
// the cache's end.
static int child(const char *what) {
    FoxConfig c = test_config("fox-pro", 64, 0, -1);
    float *w = test_weights(&c, 0.0);
    Model m;
    test_model(&m, &c, w, 1, 4, RECOMPUTE_NONE, 0, -1);
    if (!strcmp(what, "refuse-cache")) model_cache_init(&m, 2000000000);
    int prompt[4] = {1, 2, 3, 4}, next = 5;
    float *z = (float *)fox_malloc((size_t)VOCAB * sizeof(float));
    model_cache_init(&m, 5);
    model_prefill(&m, prompt, 4, z);
    model_decode(&m, &next, z);  // position 4, the last the cache holds
    model_decode(&m, &next, z);
    return 0;
}

// Runs this program as `child what`: its exit status and the lines it printed (stdout and stderr).
static int run_child(const char *what, char *out, size_t n, int *lines) {
    char self[4096], cmd[4200];
    ssize_t len_self = readlink("/proc/self/exe", self, sizeof(self) - 1);  // this process's, not the shell's
    if (len_self <= 0) fox_fatal("cannot read /proc/self/exe");
    self[len_self] = 0;
    snprintf(cmd, sizeof(cmd), "'%s' %s 2>&1", self, what);
    FILE *p = popen(cmd, "r");
    if (!p) fox_fatal("cannot run %s", cmd);
    size_t len = fread(out, 1, n - 1, p);
    out[len] = 0;
    *lines = 0;
    for (size_t i = 0; i < len; i++) *lines += out[i] == '\n';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// The first line of s (s itself is cut there).
static const char *first_line(char *s) {
    s[strcspn(s, "\n")] = 0;
    return s;
}

static void test_refusals(void) {
    FoxConfig c = test_config("fox-pro", 64, 0, -1);
    float *w = test_weights(&c, 0.0);
    Model m;
    test_model(&m, &c, w, 1, 4, RECOMPUTE_NONE, 0, -1);
    char why[512] = "", why_small[512] = "", out[1024];
    int big = cache_does_not_fit(&m, 2000000000, why, sizeof(why));
    int small = cache_does_not_fit(&m, 4096, why_small, sizeof(why_small));
    check(big && !small && strstr(why, " needs ") && m.cache.k == NULL,
          "%-24s a cache of 2e9 positions is refused before allocating (\"%s\"), one of 4096 is not", "memory", why);
    model_free(&m);
    free(w);
    const char *want_big = "error: the KV cache of 1 sequences x 2000000000 positions needs ";
    const char *want_end = "error: a decode step at position 5: the KV cache holds 5 positions";
    int lines, st = run_child("refuse-cache", out, sizeof(out), &lines);
    check(st == 1 && lines == 1 && !strncmp(out, want_big, strlen(want_big)),
          "%-24s model_cache_init(2e9 positions): exit %d, %d line: %s", "memory", st, lines, first_line(out));
    st = run_child("decode-past-end", out, sizeof(out), &lines);
    check(st == 1 && lines == 1 && !strncmp(out, want_end, strlen(want_end)),
          "%-24s a decode step past the cache's 5 positions: exit %d, %d line: %s", "cache end", st, lines, first_line(out));
}

int main(int argc, char **argv) {
    if (argc == 2) return child(argv[1]);
    struct { const char *name, *preset; int dh, qk_shared, gate; } cases[] = {
        {"fox-pro", "fox-pro", 64, 0, -1},
        {"fox-llama", "fox-llama", 64, 0, -1},
        {"transformer-pro", "transformer-pro", 64, 0, -1},
        {"transformer-llama", "transformer-llama", 64, 0, -1},
        {"fox-pro-qkshared", "fox-pro", 64, 1, -1},
        {"fox-dataind", "fox-pro", 64, 0, FOX_FG_DATA_INDEPENDENT},
        {"fox-fixed", "fox-pro", 64, 0, FOX_FG_FIXED},
        {"fox-pro dh128", "fox-pro", 128, 0, -1},
        {"transformer-pro dh128", "transformer-pro", 128, 0, -1},
        {"gsa", "gsa", 64, 0, -1},
        {"gsa dh128", "gsa", 128, 0, -1},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        FoxConfig c = test_config(cases[i].preset, cases[i].dh, cases[i].qk_shared, cases[i].gate);
        test_config_decode(cases[i].name, &c, 0);
    }
    FoxConfig fox = test_config("fox-pro", 64, 0, -1), tl = test_config("transformer-llama", 128, 0, -1);
    test_config_decode("fox-pro, long", &fox, 1);
    test_config_decode("tr-llama dh128, long", &tl, 1);
    FoxConfig gsa = test_config("gsa", 64, 0, -1);
    test_config_decode("gsa, long", &gsa, 1);
    test_recompute_levels();
    test_greedy_repeatable("fox-pro", 0);
    test_greedy_repeatable("fox-llama", 1);
    test_acp_decode("fox-pro", 64);
    test_acp_decode("fox-llama", 64);
    test_acp_decode("fox-pro", 128);
    const char *doc_presets[] = {"fox-pro", "transformer-pro"};
    for (int p = 0; p < 2; p++)
        for (int acp = 0; acp < 2; acp++) {
            test_doc_decode(doc_presets[p], 3, 300, 400, acp);  // cuBLASLt's GEMMs; several ACP blocks in the prefill
            test_doc_decode(doc_presets[p], 1, 40, 90, acp);    // the batch-1 GEMV
        }
    test_fam_decode("transformer-fam", 64, 16, 0, 3, 100);
    test_fam_decode("transformer-fam", 64, 16, 1, 1, 256);
    test_fam_decode("fox-fam", 64, 36, 1, 3, 256);
    test_fam_decode("fox-fam", 64, 36, 2, 1, 100);
    test_fam_decode("fox-fam", 128, 8, 1, 3, 100);
    test_fam_decode("transformer-fam", 128, 4, 1, 1, 256);
    test_fam_decode("transformer-fam", 64, 0, 1, 3, 100);  // BSWA alone (--fam-memory 0)
    test_fam_decode("fox-fam", 64, 0, 0, 1, 256);
    test_refusals();
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
