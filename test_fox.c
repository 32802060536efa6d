// test_fox.c: train_fox.c against the PyTorch reference's float64 fixtures (train_fox.py
// fixtures): per preset and switch the init, logits, loss, per-position losses, every gradient and 10 AdamW
// steps (the *-docmask fixtures under the document mask, which the reference applies as an explicit
// block-diagonal mask); then Adaptive Computation Pruning against no pruning (the staircase against the
// tile rule, loss and gradients within the ACP bound); then the document mask's own properties (a
// document's losses do not depend on what precedes its separator; ACP skips exactly the cross-document
// tiles). Tolerances below, relative to each tensor's largest entry.
// Usage: test_fox FIXTURE_DIR   (make test writes the fixtures to build/fixtures)
#define TESTING
#include "train_fox.c"
#include "fixture.h"  // Fixture, fixture_load / get / config / params: the reference's tensors
#include "testing.h"  // check, compare, check_rel: PASS / FAIL lines and their count

// Tolerances (fp32 against a float64 reference, T = 64), relative to the tensor's largest entry:
// forward values and losses 1e-5; gradients 1e-4; the weights after 10 AdamW steps 3e-4, since
// Adam divides by √v and so turns rounding in near-zero gradients into whole-step differences
// (PyTorch's own float32 run of the same steps lands 1e-4 from the float64 reference).
#define TOL_FWD 1e-5
#define TOL_GRAD 1e-4
#define TOL_TRAIN 3e-4

static void test_fixture(const char *dir, const char *name) {
    char path[4352];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    Fixture fx;
    fixture_load(&fx, path);
    FoxConfig c = fixture_config(&fx);
    const FixtureTensor *tin = fixture_get(&fx, "inputs");
    int B = (int)tin->dims[0], T = (int)tin->dims[1], N = B * T;
    const FixtureTensor *hp = fixture_get(&fx, "train.hparams");
    Model m;
    model_init(&m, &c, B, T, 1234);
    m.doc_sep = fixture_doc_sep(&fx);

    // The shared RNG: our init must equal the reference's from the same seed.
    char pname[160];
    for (int k = 0; k < FOX_NUM_PARAMS; k++) {
        const FoxParamInfo *p = &m.lay.p[k];
        if (!p->numel) continue;
        snprintf(pname, sizeof(pname), "init.%s", p->name);
        const FixtureTensor *t = fixture_get(&fx, pname);
        Err e = compare(m.params + p->offset, t->data, p->numel);
        if (e.abs > 1e-7) check(0, "%-18s init %-17s differs from the reference by %.3e", name, p->name, e.abs);
        else passed++;
    }

    fixture_params(&fx, &m.lay, "param.", m.params);
    int *inputs = fox_malloc((size_t)N * sizeof(int)), *targets = fox_malloc((size_t)N * sizeof(int));
    fixture_ints(inputs, tin->data, (size_t)N);
    fixture_ints(targets, fixture_get(&fx, "targets")->data, (size_t)N);
    double loss = model_forward(&m, inputs, targets, B, T);
    float lossf = (float)loss;
    check_rel(name, "logits", m.a.logits, fixture_get(&fx, "logits")->data, (size_t)N * c.vocab_size, TOL_FWD);
    check_rel(name, "loss", &lossf, fixture_get(&fx, "loss")->data, 1, TOL_FWD);
    check_rel(name, "per-position loss", m.a.losses, fixture_get(&fx, "pos_loss")->data, (size_t)N, TOL_FWD);
    zero(m.grads, m.lay.total);
    model_backward(&m, inputs, targets, B, T, 1.0f);
    for (int k = 0; k < FOX_NUM_PARAMS; k++) {
        const FoxParamInfo *p = &m.lay.p[k];
        if (!p->numel) continue;
        snprintf(pname, sizeof(pname), "grad.%s", p->name);
        char what[64];
        snprintf(what, sizeof(what), "d %s", p->name);
        check_rel(name, what, m.grads + p->offset, fixture_get(&fx, pname)->data, p->numel, TOL_GRAD);
    }

    // 10 AdamW steps with accumulation, clipping and the warmup/cosine schedule.
    OptConfig o = {hp->data[0], hp->data[1], hp->data[4], hp->data[5], hp->data[6], hp->data[7], hp->data[8],
                   (int)hp->data[2], (int)hp->data[3]};
    int accum = (int)hp->data[9];
    const FixtureTensor *tri = fixture_get(&fx, "train.inputs"), *trt = fixture_get(&fx, "train.targets");
    int steps = (int)tri->dims[0];
    float *losses = fox_malloc((size_t)steps * sizeof(float)), *norms = fox_malloc((size_t)steps * sizeof(float));
    float *lrs = fox_malloc((size_t)steps * sizeof(float));
    for (int s = 0; s < steps; s++) {
        zero(m.grads, m.lay.total);
        double l = 0.0;
        for (int a = 0; a < accum; a++) {
            size_t off = ((size_t)s * accum + a) * N;
            fixture_ints(inputs, tri->data + off, (size_t)N);
            fixture_ints(targets, trt->data + off, (size_t)N);
            l += model_forward(&m, inputs, targets, B, T) / accum;
            model_backward(&m, inputs, targets, B, T, 1.0f / accum);
        }
        double lr = lr_at(&o, s);
        double norm = grad_norm(m.grads, m.lay.total);
        optimizer_update(&m, &o, lr, s + 1, norm);
        norms[s] = (float)norm;
        losses[s] = (float)l;
        lrs[s] = (float)lr;
    }
    check_rel(name, "10-step lrs", lrs, fixture_get(&fx, "train.lrs")->data, (size_t)steps, 1e-6);
    const FixtureTensor *ref_losses = fixture_get(&fx, "train.losses");
    check_rel(name, "10-step losses", losses, ref_losses->data, (size_t)steps, TOL_FWD);
    if (compare(losses, ref_losses->data, (size_t)steps).rel > TOL_FWD)
        for (int s = 0; s < steps; s++) printf("     step %d: loss %.8f ref %.8f  norm %.6f\n", s, losses[s], ref_losses->data[s], norms[s]);
    check_rel(name, "10-step grad norms", norms, fixture_get(&fx, "train.grad_norms")->data, (size_t)steps, TOL_GRAD);
    for (int k = 0; k < FOX_NUM_PARAMS; k++) {
        const FoxParamInfo *p = &m.lay.p[k];
        if (!p->numel) continue;
        snprintf(pname, sizeof(pname), "train.final.%s", p->name);
        char what[64];
        snprintf(what, sizeof(what), "10-step %s", p->name);
        check_rel(name, what, m.params + p->offset, fixture_get(&fx, pname)->data, p->numel, TOL_TRAIN);
    }
    free(losses);
    free(norms);
    free(lrs);
    free(inputs);
    free(targets);
    model_free(&m);
    fixture_free(&fx);
}


// The largest |gradient of m1 − gradient of m0| over the largest |gradient of m0|.
static double grad_diff(const Model *m0, const Model *m1) {
    double gmax = 0.0, gdiff = 0.0;
    for (size_t i = 0; i < m0->lay.total; i++) {
        gmax = fmax(gmax, fabs((double)m0->grads[i]));
        gdiff = fmax(gdiff, fabs((double)m1->grads[i] - (double)m0->grads[i]));
    }
    return gdiff / gmax;
}

// Adaptive Computation Pruning (fox/acp.h). The staircase equals the tile rule applied to every tile;
// then a model whose fixed gates decay by 1/16 a token at T = 1024 (tiles 5 or more blocks below the
// diagonal fall under the threshold with the QK-norm bound U = 4; fox-llama's norm bound prunes more)
// gives, with --acp 1, the loss and gradients of --acp 0 to within the bound ε = e^-10 (relative).
static void test_acp(void) {
    int T = 1000, nblk = fox_acp_blocks(T), bad = 0;
    creal *c = fox_malloc((size_t)T * sizeof(creal));
    for (int t = 0; t < T; t++) c[t] = (t ? c[t - 1] : 0.0) - (t % 300 < 150 ? 0.01f : 0.5f);
    const double deltas[] = {-5.0, -30.0, -200.0};
    for (int di = 0; di < 3; di++) {
        for (int m = 0; m < nblk; m++) {
            int f = fox_acp_first_live(c, T, m, deltas[di]);
            for (int n = 0; n <= m; n++) {
                int last = n * FOX_ACP_BLOCK + FOX_ACP_BLOCK - 1 < T ? n * FOX_ACP_BLOCK + FOX_ACP_BLOCK - 1 : T - 1;
                int live = (double)c[m * FOX_ACP_BLOCK] - (double)c[last] >= deltas[di];
                bad += live != (n >= f);
            }
        }
    }
    free(c);
    check(bad == 0, "ACP staircase = the tile rule on every tile (T %d, 3 thresholds; %d disagreements)", T, bad);

    const char *presets[] = {"fox-pro", "fox-llama"};
    for (int pi = 0; pi < 2; pi++) {
        FoxConfig cfg;
        fox_config_defaults(&cfg);
        fox_config_apply_preset(&cfg, presets[pi]);
        cfg.vocab_size = 256; cfg.n_layer = 2; cfg.d_model = 32; cfg.n_head = 2; cfg.mlp_hidden = 64;
        cfg.forget_gate = FOX_FG_FIXED;
        cfg.t_min = cfg.t_max = 16.0f;
        int B = 1, TT = 1024, N = B * TT;
        Model m0, m1;
        model_init(&m0, &cfg, B, TT, 5);
        model_init(&m1, &cfg, B, TT, 5);
        m1.acp = 1;
        int *in = fox_malloc((size_t)N * sizeof(int)), *tg = fox_malloc((size_t)N * sizeof(int));
        for (int i = 0; i < N; i++) {
            in[i] = (int)fox_rng_below(fox_rng_key(8, 0), (uint64_t)i, 256);
            tg[i] = (int)fox_rng_below(fox_rng_key(8, 1), (uint64_t)i, 256);
        }
        double l0 = model_forward(&m0, in, tg, B, TT), l1 = model_forward(&m1, in, tg, B, TT);
        int live = 0, nb = fox_acp_blocks(TT);
        for (int bh = 0; bh < B * cfg.n_head; bh++)
            for (int mb = 0; mb < nb; mb++) live += mb - m1.acp_kv_first[bh * nb + mb] + 1;
        int tiles = B * cfg.n_head * (int)fox_acp_tiles(TT);
        model_backward(&m0, in, tg, B, TT, 1.0f);
        model_backward(&m1, in, tg, B, TT, 1.0f);
        double gdiff = grad_diff(&m0, &m1);
        check(live < tiles, "ACP %s: %d of %d attention tiles live (last layer)", presets[pi], live, tiles);
        check(fabs(l1 - l0) <= exp(FOX_ACP_LOG_EPS) * fabs(l0) && gdiff <= exp(FOX_ACP_LOG_EPS),
              "ACP %s: loss %.9f vs %.9f, gradients within %.1e of the largest (bound e^-10 = 4.5e-5)", presets[pi],
              l1, l0, gdiff);
        model_free(&m0);
        model_free(&m1);
        free(in);
        free(tg);
    }
}

// B sequences of T random tokens in [0, V) other than sep, then sep at the given positions (b * T + t).
static int *tokens_with_separators(int B, int T, int V, int sep, const int *at, int n_at, uint64_t seed) {
    int *in = fox_malloc((size_t)B * T * sizeof(int));
    for (int i = 0; i < B * T; i++) {
        in[i] = (int)fox_rng_below(fox_rng_key(seed, 0), (uint64_t)i, (uint64_t)V - 1);
        in[i] += in[i] >= sep;
    }
    for (int i = 0; i < n_at; i++) in[at[i]] = sep;
    return in;
}

static void small_config(FoxConfig *cfg, const char *preset) {
    fox_config_defaults(cfg);
    fox_config_apply_preset(cfg, preset);
    cfg->vocab_size = 64; cfg->n_layer = 2; cfg->d_model = 32; cfg->n_head = 2; cfg->mlp_hidden = 64;
}

// The document mask (docs/model.md §1.8): a window [document A, separator, document B] gives the separator
// and B the losses of the window [separator, B] alone, for every preset (RoPE too, being relative), to 1e-5
// of the largest loss; with ACP as well.
static void test_doc_mask_window(void) {
    const char *presets[] = {"fox-pro", "fox-llama", "transformer-pro", "transformer-llama"};
    const int sep = 5, A = 150, Bn = 170, T1 = A + 1 + Bn, T2 = 1 + Bn;
    for (int pi = 0; pi < 4; pi++) {
        for (int acp = 0; acp < 2; acp++) {
            FoxConfig cfg;
            small_config(&cfg, presets[pi]);
            int at = A;
            int *w1 = tokens_with_separators(1, T1, cfg.vocab_size, sep, &at, 1, 11), *tg1 = fox_malloc((size_t)T1 * sizeof(int));
            for (int t = 0; t < T1; t++) tg1[t] = w1[(t + 1) % T1];
            Model m1, m2;
            model_init(&m1, &cfg, 1, T1, 3);
            model_init(&m2, &cfg, 1, T2, 3);
            m1.doc_sep = m2.doc_sep = sep;
            m1.acp = m2.acp = acp;
            model_forward(&m1, w1, tg1, 1, T1);
            model_forward(&m2, w1 + A, tg1 + A, 1, T2);
            double worst = 0.0, top = 0.0;
            for (int t = 0; t < T2; t++) {
                worst = fmax(worst, fabs((double)m1.a.losses[A + t] - m2.a.losses[t]));
                top = fmax(top, fabs((double)m2.a.losses[t]));
            }
            check(worst <= 1e-5 * top, "document mask %-17s%s: the %d positions from the separator on lose the same "
                  "after a document of %d as alone (worst %.2e, tol %.2e)", presets[pi], acp ? " ACP" : "    ", T2, A,
                  worst, 1e-5 * top);
            model_free(&m1);
            model_free(&m2);
            free(w1);
            free(tg1);
        }
    }
}

// Under the document mask ACP skips the tiles before each query block's document (docs/model.md §1.8):
// for a Transformer preset, exactly those (counted here from the separators' positions); for FoX, at
// least those. Loss and gradients equal those without ACP to the ACP bound.
static void test_doc_mask_acp(void) {
    const char *presets[] = {"transformer-pro", "fox-pro"};
    const int sep = 5, B = 2, T = 1000, N = B * T, nb = fox_acp_blocks(T);
    const int at[] = {0, 300, 301, 700, T + 129, T + 640, T + 999};
    for (int pi = 0; pi < 2; pi++) {
        FoxConfig cfg;
        small_config(&cfg, presets[pi]);
        int *in = tokens_with_separators(B, T, cfg.vocab_size, sep, at, 7, 12), *tg = fox_malloc((size_t)N * sizeof(int));
        for (int i = 0; i < N; i++) tg[i] = (int)fox_rng_below(fox_rng_key(13, 0), (uint64_t)i, (uint64_t)cfg.vocab_size);
        Model m0, m1;
        model_init(&m0, &cfg, B, T, 5);
        model_init(&m1, &cfg, B, T, 5);
        m0.doc_sep = m1.doc_sep = sep;
        m1.acp = 1;
        double l0 = model_forward(&m0, in, tg, B, T), l1 = model_forward(&m1, in, tg, B, T);
        long long dead = 0;  // tiles (m, n) with n before the block of the last separator at or before row m*128
        for (int b = 0; b < B; b++) {
            for (int mb = 0; mb < nb; mb++) {
                int start = 0;
                for (int t = 0; t <= mb * FOX_ACP_BLOCK; t++)
                    if (in[b * T + t] == sep) start = t;
                dead += start / FOX_ACP_BLOCK;
            }
        }
        // per (layer, head): the tiles of its B grids less the dead ones
        long long tiles = (long long)B * fox_acp_tiles(T), want = tiles - dead, live = 0;
        int gated = cfg.forget_gate != FOX_FG_NONE, bad = 0;
        for (int i = 0; i < cfg.n_layer * cfg.n_head; i++) {
            live += m1.acp_live[i];
            bad += gated ? m1.acp_live[i] > want : m1.acp_live[i] != want;
        }
        check(m1.acp_tiles == tiles && bad == 0,
              "document mask ACP %-15s: %lld of %lld tiles live over the %d (layer, head)s, each %s %lld of %lld (the "
              "tiles after each query block's document start)", presets[pi], live, tiles * cfg.n_layer * cfg.n_head,
              cfg.n_layer * cfg.n_head, gated ? "at most" : "exactly", want, tiles);
        zero(m0.grads, m0.lay.total);
        zero(m1.grads, m1.lay.total);
        model_backward(&m0, in, tg, B, T, 1.0f);
        model_backward(&m1, in, tg, B, T, 1.0f);
        double gdiff = grad_diff(&m0, &m1);
        check(fabs(l1 - l0) <= exp(FOX_ACP_LOG_EPS) * fabs(l0) && gdiff <= exp(FOX_ACP_LOG_EPS),
              "document mask ACP %-15s: loss %.9f vs %.9f, gradients within %.1e of the largest (bound e^-10)",
              presets[pi], l1, l0, gdiff);
        model_free(&m0);
        model_free(&m1);
        free(in);
        free(tg);
    }
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: %s FIXTURE_DIR\n", argv[0]); return 2; }
    const char *fixdir = argv[1];
    char manifest[4300];
    snprintf(manifest, sizeof(manifest), "%s/manifest.txt", fixdir);
    FILE *f = fox_fopen(manifest, "r");
    char name[256];
    int nfix = 0;
    while (fscanf(f, "%255s", name) == 1) { test_fixture(fixdir, name); nfix++; }
    fclose(f);
    check(nfix >= 4, "%d fixtures tested", nfix);
    test_acp();
    test_doc_mask_window();
    test_doc_mask_acp();
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
