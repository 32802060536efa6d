// test/test_finite_diff.c: the gradients fox.c alone defines the numerics of, by finite differences,
// independent of PyTorch: the forget gate (data-dependent weights and bias, data-independent bias), the
// KV-shift weights (including the t = 0 terms) and the QK-norm weights (per head and shared), also under
// the document mask, whose log f of -512 at separators must leave the differences exact; Gated Slot
// Attention (docs/model.md §1.9: its slot gates, features, output norm, through the recurrence); and
// TransformerFAM (docs/model.md §1.10: the initial memory, and every weight the memory passes through,
// block after block, the forget gate's c on the memory's keys and queries included). Built with
// FOX_REAL_DOUBLE, so train_fox.c's model runs in float64 and central differences with one Richardson
// step are exact to ~1e-10; tolerance 1e-6 relative on the projection of the gradient on a random
// direction. Usage: test_finite_diff
#define TESTING
#include "train_fox.c"
#include "testing.h"  // check: PASS / FAIL lines and their count

static double loss_at(Model *m, const int *in, const int *tg, int B, int T) { return model_forward(m, in, tg, B, T); }

// Derivative of the loss along a random direction u restricted to `mask` elements of tensor k
// (all when mask is NULL), by central differences with one Richardson step (error O(eps^4)),
// against the analytic gradient's projection g·u. The projection sums many elements, so it
// stays far above the fp32 rounding of the loss.
static void fd_direction(Model *m, int k, int layer, const char *label, const int *in, const int *tg, int B, int T,
                         int (*mask)(const Model *, size_t), double eps, double tol) {
    const FoxParamInfo *p = &m->lay.p[k];
    size_t n = p->rows * p->cols;
    real *w = param(m, k, layer), *g = grad(m, k, layer);
    double *u = fox_malloc(n * sizeof(double));
    real *saved = fox_malloc(n * sizeof(real));
    memcpy(saved, w, n * sizeof(real));
    zero(m->grads, m->lay.total);
    loss_at(m, in, tg, B, T);
    model_backward(m, in, tg, B, T, 1.0f);
    // u has the scale of the weights it moves (their RMS), so eps is a relative step.
    double gu = 0.0, ss = 0.0;
    size_t cnt = 0;
    for (size_t i = 0; i < n; i++)
        if (!mask || mask(m, i)) { ss += (double)w[i] * w[i]; cnt++; }
    double scale = sqrt(ss / (double)(cnt ? cnt : 1));
    uint64_t key = fox_rng_key(4242, (uint64_t)k * 64 + (uint64_t)layer);
    for (size_t i = 0; i < n; i++) {
        u[i] = (!mask || mask(m, i)) ? scale * fox_rng_normal(key, i) : 0.0;
        gu += u[i] * g[i];
    }
    double d[2];
    for (int r = 0; r < 2; r++) {
        double h = r ? eps / 2 : eps, l[2];
        for (int sgn = 0; sgn < 2; sgn++) {
            for (size_t i = 0; i < n; i++) w[i] = (real)(saved[i] + (sgn ? -h : h) * u[i]);
            l[sgn] = loss_at(m, in, tg, B, T);
        }
        d[r] = (l[0] - l[1]) / (2 * h);
    }
    memcpy(w, saved, n * sizeof(real));
    double fd = (4 * d[1] - d[0]) / 3, rel = fabs(fd - gu) / fmax(fabs(gu), 1e-12);
    check(rel <= tol && fabs(gu) > 1e-6, "finite diff %-34s fd %+.6e  analytic %+.6e  rel %.2e (tol %.0e)", label, fd, gu, rel, tol);
    free(u);
    free(saved);
}

static int mask_rows_f(const Model *m, size_t i) { return m->cols.fgate >= 0 && (int)(i / m->cfg.d_model) >= m->cols.fgate; }
static int mask_rows_ak(const Model *m, size_t i) {
    int r = (int)(i / m->cfg.d_model);
    return m->cols.k_shift >= 0 && r >= m->cols.k_shift && r < m->cols.k_shift + m->cfg.n_head;
}
static int mask_rows_slot(const Model *m, size_t i) {
    int r = (int)(i / m->cfg.d_model);
    return m->cols.slot_gate >= 0 && r >= m->cols.slot_gate;
}
static int mask_rows_qkv(const Model *m, size_t i) { return (int)(i / m->cfg.d_model) < 3 * m->cfg.d_model; }
static int mask_rows_gate(const Model *m, size_t i) {
    int r = (int)(i / m->cfg.d_model);
    return m->cols.gate >= 0 && r >= m->cols.gate && r < m->cols.gate + m->cfg.d_model;
}
static int mask_rows_av(const Model *m, size_t i) {
    int r = (int)(i / m->cfg.d_model);
    return m->cols.v_shift >= 0 && r >= m->cols.v_shift && r < m->cols.v_shift + m->cfg.n_head;
}

// One tensor (and row mask) whose directional derivative is checked in every layer.
typedef struct { int param; const char *label; int (*mask)(const Model *, size_t); } FdCase;

static void fd_layers(Model *m, const FdCase *cases, int n, const int *in, const int *tg, int B, int T, double eps,
                      double tol) {
    for (int l = 0; l < m->cfg.n_layer; l++) {
        for (int i = 0; i < n; i++) {
            char label[96];
            snprintf(label, sizeof(label), "%s (layer %d)", cases[i].label, l);
            fd_direction(m, cases[i].param, l, label, in, tg, B, T, cases[i].mask, eps, tol);
        }
    }
}

// A tiny model with strong, varied gates (biases spread around 0) so that every term matters.
static void fd_model(Model *m, int fg, int qk_shared, int output_norm, int B, int T) {
    FoxConfig c;
    fox_config_defaults(&c);
    c.vocab_size = 32; c.n_layer = 2; c.d_model = 16; c.n_head = 2; c.mlp_hidden = 24;
    fox_config_apply_preset(&c, "fox-pro");
    c.mlp_hidden = 24;
    c.forget_gate = fg;
    c.qk_norm_shared = qk_shared;
    c.output_norm = output_norm;
    model_init(m, &c, B, T, 77);
    uint64_t key = fox_rng_key(99, 1);
    for (int k = 0; k < FOX_NUM_PARAMS; k++) {
        const FoxParamInfo *p = &m->lay.p[k];
        if (p->init == FOX_INIT_N) continue;
        for (size_t i = 0; i < p->numel; i++) m->params[p->offset + i] += (real)(0.5 * fox_rng_normal(key, p->offset + i));
    }
    for (size_t i = 0; i < m->lay.p[FOX_P_attn_in_w].numel; i++)  // larger weights: data-dependent gates
        m->params[m->lay.p[FOX_P_attn_in_w].offset + i] *= 5.0f;
}

static void test_finite_differences(void) {
    const int B = 2, T = 96;
    int in[2 * 96], tg[2 * 96];
    uint64_t key = fox_rng_key(5, 5);
    for (int i = 0; i < B * T; i++) { in[i] = (int)fox_rng_below(key, 2 * i, 32); tg[i] = (int)fox_rng_below(key, 2 * i + 1, 32); }
    const double eps = 1e-3, tol = 1e-6;
    Model m;
    fd_model(&m, FOX_FG_DATA_DEPENDENT, 0, 1, B, T);
    const FdCase cases[] = {{FOX_P_fgate_b, "forget-gate bias", NULL}, {FOX_P_attn_in_w, "forget-gate weights", mask_rows_f},
                            {FOX_P_attn_in_w, "k-shift weights", mask_rows_ak}, {FOX_P_attn_in_w, "v-shift weights", mask_rows_av},
                            {FOX_P_qnorm_w, "q-norm weights", NULL}, {FOX_P_knorm_w, "k-norm weights", NULL}};
    fd_layers(&m, cases, 6, in, tg, B, T, eps, tol);
    model_free(&m);
    // The t = 0 terms of KV-shift alone (k_0 = (1 − α_0) k̃_0): at T = 1 only v_0 reaches the
    // output, at T = 2 the key shift of t = 0 and t = 1 both do. Without the output norm, which
    // would cancel the (1 − α_0) scale of v_0 at T = 1.
    fd_model(&m, FOX_FG_DATA_DEPENDENT, 0, 0, B, T);
    fd_direction(&m, FOX_P_attn_in_w, 0, "v-shift weights at T=1", in, tg, 1, 1, mask_rows_av, eps, tol);
    fd_direction(&m, FOX_P_attn_in_w, 0, "k-shift weights at T=2", in, tg, 1, 2, mask_rows_ak, eps, tol);
    model_free(&m);
    fd_model(&m, FOX_FG_DATA_INDEPENDENT, 1, 1, B, T);
    fd_direction(&m, FOX_P_fgate_b, 1, "data-independent gate bias", in, tg, B, T, NULL, eps, tol);
    fd_direction(&m, FOX_P_qnorm_w, 1, "shared q-norm weights", in, tg, B, T, NULL, eps, tol);
    model_free(&m);
}

// The document mask (docs/model.md §1.8): separators (token 7) at the first position, in the middle, twice
// in a row and at the last position; the gate, KV-shift and QK-norm gradients through c = Σ log f with its
// FOX_DOC_LOG_F terms, and KV-shift stopping at each boundary.
static void test_finite_differences_doc_mask(void) {
    const int B = 2, T = 64, sep = 7;
    int in[2 * 64], tg[2 * 64];
    const int seps[] = {0, 9, 30, 31, 64 + 17, 64 + 63};
    uint64_t key = fox_rng_key(6, 6);
    for (int i = 0; i < B * T; i++) {
        in[i] = (int)fox_rng_below(key, 2 * i, 31);
        in[i] += in[i] >= sep;  // no separator but the chosen ones
        tg[i] = (int)fox_rng_below(key, 2 * i + 1, 32);
    }
    for (size_t i = 0; i < sizeof(seps) / sizeof(seps[0]); i++) in[seps[i]] = sep;
    const double eps = 1e-3, tol = 1e-6;
    Model m;
    fd_model(&m, FOX_FG_DATA_DEPENDENT, 0, 1, B, T);
    m.doc_sep = sep;
    fd_direction(&m, FOX_P_fgate_b, 0, "forget-gate bias, document mask", in, tg, B, T, NULL, eps, tol);
    fd_direction(&m, FOX_P_attn_in_w, 0, "forget-gate weights, document mask", in, tg, B, T, mask_rows_f, eps, tol);
    fd_direction(&m, FOX_P_attn_in_w, 1, "k-shift weights, document mask", in, tg, B, T, mask_rows_ak, eps, tol);
    fd_direction(&m, FOX_P_attn_in_w, 1, "v-shift weights, document mask", in, tg, B, T, mask_rows_av, eps, tol);
    fd_direction(&m, FOX_P_knorm_w, 1, "k-norm weights, document mask", in, tg, B, T, NULL, eps, tol);
    model_free(&m);
    fd_model(&m, FOX_FG_NONE, 0, 1, B, T);
    m.doc_sep = sep;
    fd_direction(&m, FOX_P_attn_in_w, 0, "k-shift weights, no gate, document mask", in, tg, B, T, mask_rows_ak, eps, tol);
    fd_direction(&m, FOX_P_qnorm_w, 1, "q-norm weights, no gate, document mask", in, tg, B, T, NULL, eps, tol);
    model_free(&m);
}

// GSA with fast and slow slots (τ 2, gate logits spread by the ×5 weights) so that forgetting matters, T
// longer than the slots: the slot gates, the q/k/v projections, the output norm and the output projection.
static void test_finite_differences_gsa(void) {
    const int B = 2, T = 40;
    int in[2 * 40], tg[2 * 40];
    uint64_t key = fox_rng_key(7, 7);
    for (int i = 0; i < B * T; i++) { in[i] = (int)fox_rng_below(key, 2 * i, 32); tg[i] = (int)fox_rng_below(key, 2 * i + 1, 32); }
    FoxConfig c;
    fox_config_defaults(&c);
    c.vocab_size = 32; c.n_layer = 2; c.d_model = 16; c.n_head = 2;
    fox_config_apply_preset(&c, "gsa");
    c.mlp_hidden = 24; c.gsa_heads = 2; c.gsa_slots = 3; c.gsa_tau = 2.0f;
    Model m;
    model_init(&m, &c, B, T, 78);
    uint64_t pk = fox_rng_key(99, 2);
    const FoxParamInfo *nw = &m.lay.p[FOX_P_onorm_w];
    for (size_t i = 0; i < nw->numel; i++) m.params[nw->offset + i] += (real)(0.5 * fox_rng_normal(pk, i));
    for (size_t i = 0; i < m.lay.p[FOX_P_attn_in_w].numel; i++) m.params[m.lay.p[FOX_P_attn_in_w].offset + i] *= 5.0f;
    const double eps = 1e-3, tol = 1e-6;
    const FdCase cases[] = {{FOX_P_attn_in_w, "GSA slot gates", mask_rows_slot},
                            {FOX_P_attn_in_w, "GSA q/k/v projections", mask_rows_qkv}, {FOX_P_onorm_w, "GSA output norm", NULL}};
    fd_layers(&m, cases, 3, in, tg, B, T, eps, tol);
    fd_direction(&m, FOX_P_attn_out_w, 1, "GSA output projection (layer 1)", in, tg, B, T, NULL, eps, tol);
    model_free(&m);
}

// TransformerFAM with a memory that matters: norm weights and gate biases spread, the initial memory at the
// scale of the residual stream, T past the last complete block (a partial block), several memory updates
// per layer. fox-fam (a data-dependent gate, blocks of 8, memory 3, one block of window) and
// transformer-fam (RoPE, blocks of 6, memory 4, no window: only the block and the memory); M 0: BSWA alone.
static void test_finite_differences_fam(const char *preset, int K, int M, int W) {
    const int B = 2, T = 44;
    int in[2 * 44], tg[2 * 44];
    uint64_t key = fox_rng_key(8, 8);
    for (int i = 0; i < B * T; i++) { in[i] = (int)fox_rng_below(key, 2 * i, 32); tg[i] = (int)fox_rng_below(key, 2 * i + 1, 32); }
    FoxConfig c;
    fox_config_defaults(&c);
    c.vocab_size = 32; c.n_layer = 2; c.d_model = 16; c.n_head = 2;
    fox_config_apply_preset(&c, preset);
    c.mlp_hidden = 24; c.fam_block = K; c.fam_memory = M; c.fam_window_blocks = W;
    Model m;
    model_init(&m, &c, B, T, 79);
    uint64_t pk = fox_rng_key(99, 3);
    for (int k = 0; k < FOX_NUM_PARAMS; k++) {
        const FoxParamInfo *p = &m.lay.p[k];
        if (p->init == FOX_INIT_N) continue;
        for (size_t i = 0; i < p->numel; i++) m.params[p->offset + i] += (real)(0.5 * fox_rng_normal(pk, p->offset + i));
    }
    for (size_t i = 0; i < m.lay.p[FOX_P_attn_in_w].numel; i++) m.params[m.lay.p[FOX_P_attn_in_w].offset + i] *= 3.0f;
    for (size_t i = 0; i < m.lay.p[FOX_P_fam_init].numel; i++) m.params[m.lay.p[FOX_P_fam_init].offset + i] *= 25.0f;
    const double eps = 1e-3, tol = 1e-6;
    char label[96], name[48];
    snprintf(name, sizeof(name), "%s%s", preset, M ? "" : " without memory (BSWA)");
    if (M > 0) {  // M 0: BSWA alone, no memory and no fam_init
        snprintf(label, sizeof(label), "%s initial memory (fam_init)", name);
        fd_direction(&m, FOX_P_fam_init, 0, label, in, tg, B, T, NULL, eps, tol);
    }
    FdCase cases[] = {{FOX_P_attn_in_w, "q/k/v projections", mask_rows_qkv}, {FOX_P_attn_in_w, "output gate", mask_rows_gate},
                      {FOX_P_qnorm_w, "q-norm weights", NULL}, {FOX_P_knorm_w, "k-norm weights", NULL},
                      {FOX_P_ln1_w, "attention norm", NULL}, {FOX_P_ln2_w, "MLP norm", NULL},
                      {FOX_P_mlp_in_w, "MLP input", NULL}, {FOX_P_fgate_b, "forget-gate bias", NULL},
                      {FOX_P_attn_in_w, "forget-gate weights", mask_rows_f}};
    int n = c.forget_gate == FOX_FG_NONE ? 7 : 9;
    char labels[9][96];
    for (int i = 0; i < n; i++) {
        snprintf(labels[i], sizeof(labels[i]), "%s %s", name, cases[i].label);
        cases[i].label = labels[i];
    }
    fd_layers(&m, cases, n, in, tg, B, T, eps, tol);
    snprintf(label, sizeof(label), "%s output projection (layer 1)", name);
    fd_direction(&m, FOX_P_attn_out_w, 1, label, in, tg, B, T, NULL, eps, tol);
    snprintf(label, sizeof(label), "%s MLP output (layer 0)", name);
    fd_direction(&m, FOX_P_mlp_out_w, 0, label, in, tg, B, T, NULL, eps, tol);
    model_free(&m);
}

// --mqar-loss (docs/model.md §8.4): negative targets count for nothing. The loss is the mean of the others'
// per-position losses, and its gradient (scaled by 1 / their number, zero through the skipped rows) is the
// derivative of that mean.
static void test_finite_differences_skipped_targets(void) {
    const int B = 2, T = 48;
    int in[2 * 48], tg[2 * 48], all[2 * 48], kept = 0;
    uint64_t key = fox_rng_key(6, 6);
    for (int i = 0; i < B * T; i++) {
        in[i] = (int)fox_rng_below(key, 3 * i, 32);
        all[i] = (int)fox_rng_below(key, 3 * i + 1, 32);
        tg[i] = fox_rng_below(key, 3 * i + 2, 4) == 0 ? all[i] : -1;  // a quarter counted
        kept += tg[i] >= 0;
    }
    Model m;
    fd_model(&m, FOX_FG_DATA_DEPENDENT, 0, 1, B, T);
    double whole = model_forward(&m, in, all, B, T), sum = 0.0;
    for (int i = 0; i < B * T; i++) sum += tg[i] >= 0 ? m.a.losses[i] : 0.0;
    double part = model_forward(&m, in, tg, B, T), zeros = 0.0;
    for (int i = 0; i < B * T; i++) zeros += tg[i] < 0 ? fabs(m.a.losses[i]) : 0.0;
    check(fabs(part - sum / kept) < 1e-12 && zeros == 0.0 && fabs(part - whole) > 1e-3,
          "skipped targets: the loss is the mean over the %d counted of %d positions (%.12f; all: %.12f), 0 at the others",
          kept, B * T, part, whole);
    const FdCase cases[] = {{FOX_P_lm_head_w, "lm_head, a quarter of the targets", NULL},
                            {FOX_P_attn_in_w, "forget-gate weights, a quarter", mask_rows_f},
                            {FOX_P_fgate_b, "forget-gate bias, a quarter", NULL}};
    fd_layers(&m, cases + 1, 2, in, tg, B, T, 1e-3, 1e-6);
    fd_direction(&m, cases[0].param, 0, cases[0].label, in, tg, B, T, NULL, 1e-3, 1e-6);
    model_free(&m);
}

int main(void) {
    test_finite_differences();
    test_finite_differences_skipped_targets();
    test_finite_differences_doc_mask();
    test_finite_differences_gsa();
    test_finite_differences_fam("fox-fam", 8, 3, 1);
    test_finite_differences_fam("transformer-fam", 6, 4, 0);
    test_finite_differences_fam("transformer-fam", 6, 0, 1);  // BSWA alone (--fam-memory 0)
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
