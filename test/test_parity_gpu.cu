// test/test_parity_gpu.cu: checks train_fox.cu on the GPU against the PyTorch reference's float64 fixtures
// (forward, loss, per-position losses, every gradient, 10 AdamW steps), that the recompute levels
// give bitwise the same gradients, that training is bitwise reproducible, and that a model.bin
// written from the GPU state reads back in train_fox_cpu's format.
// Usage: test_fox FIXTURE_DIR   (fixtures at head_dim 64 or 128: `make test-gpu` writes them)
#define TESTING
#include "train_fox.cu"
#include "fox/checkpoint.h"  // fox_read_model_bin, fox_write_model_bin
#include "fixture.h"         // the reference's tensors
#include "testing.h"         // check, compare, check_rel

static void check_abs(const char *fx, const char *what, const float *a, const double *ref, size_t n, double tol) {
    Err e = compare(a, ref, n);
    check(e.abs <= tol, "%-18s %-24s max abs %.3e  rel %.3e  (tol abs %.0e)", fx, what, e.abs, e.rel, tol);
}

// Tolerances against the float64 reference, as max |error| over the tensor's largest |entry|. bf16
// keeps 8 significant bits (unit roundoff 2^-9 = 2e-3); every GEMM and attention operand is rounded
// once and accumulated in fp32, so a forward value carries a few independent 2e-3 relative errors:
// logits 2e-2 (H200, 2026-11-21: worst 7.3e-3 over the seven fixtures), losses 1e-2 absolute (the
// issue's bound; worst 1.3e-4 for the loss, 3.9e-3 for one position's loss). A gradient passes through
// about twice as many roundings (the forward operands, then the bf16 dres, dproj, du, dO and the
// attention's dq/dk/dv) and the norm-weight and gate-bias gradients sum them over B·T tokens: 3e-2
// (worst 1.3e-2, d qnorm_w). Training: the issue's 1e-2 absolute on the 10 losses (worst 8.2e-4),
// grad norms 2e-2 (worst 7.7e-3); the final weights only to 1e-1 (worst 5.6e-2): Adam divides by √v,
// so the rounding of a near-zero gradient becomes a whole lr-sized step of that weight.
#define TOL_LOGITS 2e-2
#define TOL_LOSS 1e-2
#define TOL_GRAD 3e-2
#define TOL_NORM 2e-2
#define TOL_WEIGHTS 1e-1



// The fixture's tensors prefix.<p> as one host vector in the FOX_PARAMS layout.
// The fixture's prefix.* tensors as a new host vector in the FOX_PARAMS layout.
static float *fixture_host_params(const Model *m, const Fixture *fx, const char *prefix) {
    float *host = (float *)fox_calloc(m->lay.total, sizeof(float));
    fixture_params(fx, &m->lay, prefix, host);
    return host;
}

static float *device_copy(const float *dev, size_t n) {
    float *h = (float *)fox_malloc(n * sizeof(float));
    FOX_CUDA_CHECK(cudaMemcpy(h, dev, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}

// Fresh optimizer state and the given weights.
static void reset_model(Model *m, const float *host_params) {
    model_set_params(m, host_params);
    FOX_CUDA_CHECK(cudaMemset(m->m, 0, m->lay.total * sizeof(float)));
    FOX_CUDA_CHECK(cudaMemset(m->v, 0, m->lay.total * sizeof(float)));
}

// `steps` optimizer steps of `accum` micro-batches from the (steps, accum, B, T) token arrays.
static void train_steps(Model *m, const OptConfig *o, int accum, const double *tin, const double *ttg, int steps, int B,
                        int T, float *losses, float *norms, float *lrs) {
    int N = B * T;
    int *inputs = (int *)fox_malloc((size_t)N * sizeof(int)), *targets = (int *)fox_malloc((size_t)N * sizeof(int));
    for (int s = 0; s < steps; s++) {
        model_zero_grad(m);
        double l = 0.0;
        for (int a = 0; a < accum; a++) {
            size_t off = ((size_t)s * accum + a) * N;
            fixture_ints(inputs, tin + off, (size_t)N);
            fixture_ints(targets, ttg + off, (size_t)N);
            l += model_forward(m, inputs, targets, B, T) / accum;
            model_backward(m, inputs, B, T, 1.0f / accum, 0);
        }
        double lr = lr_at(o, s);
        norms[s] = (float)optimizer_step(m, o, lr, s + 1);
        losses[s] = (float)l;
        if (lrs) lrs[s] = (float)lr;
    }
    free(inputs);
    free(targets);
}

// A deterministic training model of B x T tokens at a recompute level; logits_bytes 0: the default buffer.
static ModelOptions test_options(int B, int T, int level, size_t logits_bytes) {
    ModelOptions o = {B, T, 1234, 0, level, 0, -1, 0, 1, logits_bytes};
    return o;
}

// Gradients of one forward/backward at a recompute level (host copy), with the given logits buffer.
static float *grads_at_level(const FoxConfig *c, int B, int T, int level, size_t logits_bytes, const float *params,
                             const int *in, const int *tg) {
    Model m;
    ModelOptions o = test_options(B, T, level, logits_bytes);
    model_init(&m, c, &o);
    model_set_params(&m, params);
    model_zero_grad(&m);
    model_forward(&m, in, tg, B, T);
    model_backward(&m, in, B, T, 1.0f, 0);
    float *g = device_copy(m.grads, m.lay.total);
    model_free(&m);
    return g;
}

// The (N, V) logits of the last forward, chunk by chunk as the lm_head computes them (this
// recomputes the chunks, so call it before the backward pass).
static float *all_logits(Model *m, int N) {
    int V = m->cfg.vocab_size;
    bf16 *lb = (bf16 *)fox_malloc((size_t)m->ce_rows * m->VP * sizeof(bf16));
    float *out = (float *)fox_malloc((size_t)N * V * sizeof(float));
    for (int r0 = 0; r0 < N; r0 += m->ce_rows) {
        int rows = N - r0 < m->ce_rows ? N - r0 : m->ce_rows;
        lm_head_forward(m, r0, rows);
        FOX_CUDA_CHECK(cudaMemcpy(lb, m->a.logits, (size_t)rows * m->VP * sizeof(bf16), cudaMemcpyDeviceToHost));
        for (int n = 0; n < rows; n++)
            for (int v = 0; v < V; v++) out[(size_t)(r0 + n) * V + v] = __bfloat162float(lb[(size_t)n * m->VP + v]);
    }
    free(lb);
    return out;
}

// logits_bytes: the lm_head's logits buffer (0: the default; smaller: the chunked path).
static void test_fixture(const char *dir, const char *name, size_t logits_bytes) {
    char path[4352], pname[160], what[96];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    Fixture fx;
    fixture_load(&fx, path);
    FoxConfig c = fixture_config(&fx);
    int dh = fox_head_dim(&c);
    if (dh != 64 && dh != 128) {
        check(0, "%-18s head_dim %d: the attention kernel runs 64 and 128 (write the fixtures with `make test-gpu`)", name, dh);
        fixture_free(&fx);
        return;
    }
    const FixtureTensor *tin = fixture_get(&fx, "inputs");
    int B = (int)tin->dims[0], T = (int)tin->dims[1], N = B * T, V = c.vocab_size;
    const FixtureTensor *hp = fixture_get(&fx, "train.hparams");
    Model m;
    ModelOptions opts = test_options(B, T, RECOMPUTE_NONE, logits_bytes);
    model_init(&m, &c, &opts);

    // The shared RNG: the weights model_init put on the device equal the reference's init.
    float *got = device_copy(m.params, m.lay.total);
    float *init = fixture_host_params(&m, &fx, "init.");
    check(!memcmp(got, init, m.lay.total * sizeof(float)), "%-18s init equals the reference's (seed 1234)", name);
    free(got);
    free(init);

    float *params = fixture_host_params(&m, &fx, "param.");
    model_set_params(&m, params);
    int *inputs = (int *)fox_malloc((size_t)N * sizeof(int)), *targets = (int *)fox_malloc((size_t)N * sizeof(int));
    fixture_ints(inputs, tin->data, (size_t)N);
    fixture_ints(targets, fixture_get(&fx, "targets")->data, (size_t)N);
    float lossf = (float)model_forward(&m, inputs, targets, B, T);
    float *logits = all_logits(&m, N);
    check_rel(name, "logits", logits, fixture_get(&fx, "logits")->data, (size_t)N * V, TOL_LOGITS);
    check_abs(name, "loss", &lossf, fixture_get(&fx, "loss")->data, 1, TOL_LOSS);
    check_abs(name, "per-position loss", m.h_losses, fixture_get(&fx, "pos_loss")->data, (size_t)N, TOL_LOSS);
    free(logits);
    model_zero_grad(&m);
    model_backward(&m, inputs, B, T, 1.0f, 0);
    float *grads = device_copy(m.grads, m.lay.total);
    for (int k = 0; k < FOX_NUM_PARAMS; k++) {
        const FoxParamInfo *p = &m.lay.p[k];
        if (!p->numel) continue;
        snprintf(pname, sizeof(pname), "grad.%s", p->name);
        snprintf(what, sizeof(what), "d %s", p->name);
        check_rel(name, what, grads + p->offset, fixture_get(&fx, pname)->data, p->numel, TOL_GRAD);
    }

    // Recomputation changes where activations come from, never their values.
    for (int level = RECOMPUTE_NORM_MLP; level <= RECOMPUTE_BLOCK; level++) {
        float *g = grads_at_level(&c, B, T, level, logits_bytes, params, inputs, targets);
        check(!memcmp(g, grads, m.lay.total * sizeof(float)), "%-18s --recompute %d: gradients bitwise equal to level 0", name, level);
        free(g);
    }
    free(grads);

    // 10 AdamW steps with accumulation, clipping and the warmup/cosine schedule.
    OptConfig o = {hp->data[0], hp->data[1], hp->data[4], hp->data[5], hp->data[6], hp->data[7], hp->data[8],
                   (int)hp->data[2], (int)hp->data[3]};
    int accum = (int)hp->data[9];
    const FixtureTensor *tri = fixture_get(&fx, "train.inputs"), *trt = fixture_get(&fx, "train.targets");
    int steps = (int)tri->dims[0];
    float *losses = (float *)fox_malloc((size_t)steps * sizeof(float)), *norms = (float *)fox_malloc((size_t)steps * sizeof(float));
    float *lrs = (float *)fox_malloc((size_t)steps * sizeof(float));
    reset_model(&m, params);
    train_steps(&m, &o, accum, tri->data, trt->data, steps, B, T, losses, norms, lrs);
    check_rel(name, "10-step lrs", lrs, fixture_get(&fx, "train.lrs")->data, (size_t)steps, 1e-6);
    const FixtureTensor *ref_losses = fixture_get(&fx, "train.losses");
    check_abs(name, "10-step losses", losses, ref_losses->data, (size_t)steps, TOL_LOSS);
    check_rel(name, "10-step grad norms", norms, fixture_get(&fx, "train.grad_norms")->data, (size_t)steps, TOL_NORM);
    float *final = device_copy(m.params, m.lay.total);
    for (int k = 0; k < FOX_NUM_PARAMS; k++) {
        const FoxParamInfo *p = &m.lay.p[k];
        if (!p->numel) continue;
        snprintf(pname, sizeof(pname), "train.final.%s", p->name);
        snprintf(what, sizeof(what), "10-step %s", p->name);
        check_rel(name, what, final + p->offset, fixture_get(&fx, pname)->data, p->numel, TOL_WEIGHTS);
    }

    // Determinism: the same 3 steps twice give bitwise the same losses and grad norms.
    float l1[3], n1[3], l2[3], n2[3];
    reset_model(&m, params);
    train_steps(&m, &o, accum, tri->data, trt->data, 3, B, T, l1, n1, NULL);
    reset_model(&m, params);
    train_steps(&m, &o, accum, tri->data, trt->data, 3, B, T, l2, n2, NULL);
    check(!memcmp(l1, l2, sizeof(l1)) && !memcmp(n1, n2, sizeof(n1)), "%-18s 3 steps twice: losses and norms bitwise equal", name);

    // A model.bin written from the GPU state is train_fox_cpu's: same config, same bits.
    snprintf(path, sizeof(path), "%s/%s.gpu_model.bin", dir, name);
    fox_write_model_bin(path, &m.cfg, final);
    float *back = (float *)fox_malloc(m.lay.total * sizeof(float));
    fox_read_model_bin(path, &c, back);
    check(!memcmp(back, final, m.lay.total * sizeof(float)), "%-18s model.bin round trip (train_fox_cpu's reader)", name);
    remove(path);
    free(back);
    free(final);
    free(losses);
    free(norms);
    free(lrs);
    free(params);
    free(inputs);
    free(targets);
    model_free(&m);
    fixture_free(&fx);
}

// Determinism where the attention has several key blocks per head (T = 1024): a fox-pro model from
// the shared init, 2 steps twice on random tokens.
static void test_determinism_long(void) {
    FoxConfig c;
    fox_config_defaults(&c);
    c.vocab_size = 512;
    c.n_layer = 2;
    c.d_model = 128;
    c.n_head = 2;
    fox_config_apply_preset(&c, "fox-pro");
    int B = 2, T = 1024, steps = 2, N = B * T;
    Model m;
    ModelOptions opts = test_options(B, T, RECOMPUTE_NONE, 0);
    model_init(&m, &c, &opts);
    float *params = device_copy(m.params, m.lay.total);
    double *tok = (double *)fox_malloc((size_t)2 * steps * N * sizeof(double));
    for (size_t i = 0; i < (size_t)2 * steps * N; i++)
        tok[i] = (double)fox_rng_below(fox_rng_key(77, 0), i, (uint64_t)c.vocab_size);
    OptConfig o = {1e-3, 1e-4, 0.1, 1.0, 0.9, 0.95, 1e-8, 1, steps};
    float l1[2], n1[2], l2[2], n2[2];
    reset_model(&m, params);
    train_steps(&m, &o, 1, tok, tok + (size_t)steps * N, steps, B, T, l1, n1, NULL);
    reset_model(&m, params);
    train_steps(&m, &o, 1, tok, tok + (size_t)steps * N, steps, B, T, l2, n2, NULL);
    check(!memcmp(l1, l2, sizeof(l1)) && !memcmp(n1, n2, sizeof(n1)),
          "%-18s 2 steps twice at T=%d: losses %.9g %.9g / %.9g %.9g, norms %.9g %.9g / %.9g %.9g", "determinism", T,
          l1[0], l1[1], l2[0], l2[1], n1[0], n1[1], n2[0], n2[1]);
    free(tok);
    free(params);
    model_free(&m);
}

// The cross-entropy kernels at GPT-2's vocabulary (the fixtures' is 128): per-row loss and the
// in-place dlogits against float64 on the same bf16 logits.
static void test_crossentropy_large_vocab(void) {
    int R = 64, V = FOX_VOCAB_GPT2, VP = (V + 63) / 64 * 64;
    bf16 *z = (bf16 *)fox_calloc((size_t)R * VP, sizeof(bf16));
    int *tg = (int *)fox_malloc((size_t)R * sizeof(int));
    uint64_t key = fox_rng_key(31, 0);
    for (int r = 0; r < R; r++) {
        tg[r] = (int)fox_rng_below(key, (uint64_t)r, (uint64_t)V);
        for (int v = 0; v < V; v++) z[(size_t)r * VP + v] = __float2bfloat16((float)(3.0 * fox_rng_normal(key, 1000 + (uint64_t)r * VP + v)));
    }
    double *ref_loss = (double *)fox_malloc((size_t)R * sizeof(double)), *ref_d = (double *)fox_malloc((size_t)R * V * sizeof(double));
    float scale = 1.0f / R;
    for (int r = 0; r < R; r++) {
        double mx = -INFINITY, sum = 0.0;
        for (int v = 0; v < V; v++) mx = fmax(mx, (double)__bfloat162float(z[(size_t)r * VP + v]));
        for (int v = 0; v < V; v++) sum += exp((double)__bfloat162float(z[(size_t)r * VP + v]) - mx);
        ref_loss[r] = log(sum) + mx - (double)__bfloat162float(z[(size_t)r * VP + tg[r]]);
        for (int v = 0; v < V; v++)
            ref_d[(size_t)r * V + v] = (exp((double)__bfloat162float(z[(size_t)r * VP + v]) - mx) / sum - (v == tg[r])) * scale;
    }
    bf16 *dz;
    float *dloss, *dlse;
    int *dtg;
    FOX_CUDA_CHECK(cudaMalloc(&dz, (size_t)R * VP * sizeof(bf16)));
    FOX_CUDA_CHECK(cudaMalloc(&dloss, (size_t)R * sizeof(float)));
    FOX_CUDA_CHECK(cudaMalloc(&dlse, (size_t)R * sizeof(float)));
    FOX_CUDA_CHECK(cudaMalloc(&dtg, (size_t)R * sizeof(int)));
    FOX_CUDA_CHECK(cudaMemcpy(dz, z, (size_t)R * VP * sizeof(bf16), cudaMemcpyHostToDevice));
    FOX_CUDA_CHECK(cudaMemcpy(dtg, tg, (size_t)R * sizeof(int), cudaMemcpyHostToDevice));
    crossentropy_forward_kernel<<<R, CE_THREADS>>>(dloss, dlse, dz, dtg, V, VP);
    FOX_LAUNCH_CHECK();
    crossentropy_backward_kernel<<<R, CE_THREADS>>>(dz, dlse, dtg, V, VP, scale);
    FOX_LAUNCH_CHECK();
    float *loss = (float *)fox_malloc((size_t)R * sizeof(float)), *d = (float *)fox_malloc((size_t)R * V * sizeof(float));
    FOX_CUDA_CHECK(cudaMemcpy(loss, dloss, (size_t)R * sizeof(float), cudaMemcpyDeviceToHost));
    FOX_CUDA_CHECK(cudaMemcpy(z, dz, (size_t)R * VP * sizeof(bf16), cudaMemcpyDeviceToHost));
    int pad_zero = 1;
    for (int r = 0; r < R; r++) {
        for (int v = 0; v < V; v++) d[(size_t)r * V + v] = __bfloat162float(z[(size_t)r * VP + v]);
        for (int v = V; v < VP; v++) pad_zero &= __bfloat162float(z[(size_t)r * VP + v]) == 0.0f;
    }
    // fp32 log-sum-exp over 50257 terms: 1e-5 relative; dlogits are stored as bf16: 2^-9 of the largest.
    check_abs("cross entropy", "loss, V = 50257", loss, ref_loss, (size_t)R, 1e-4);
    check_rel("cross entropy", "dlogits, V = 50257", d, ref_d, (size_t)R * V, 5e-3);
    check(pad_zero, "%-18s padded vocabulary columns get zero gradient", "cross entropy");
    FOX_CUDA_CHECK(cudaFree(dz));
    FOX_CUDA_CHECK(cudaFree(dloss));
    FOX_CUDA_CHECK(cudaFree(dlse));
    FOX_CUDA_CHECK(cudaFree(dtg));
    free(z);
    free(tg);
    free(ref_loss);
    free(ref_d);
    free(loss);
    free(d);
}

// The ACP tables the GPU computes (fox_acp_tables) against the host's, from fox/acp.h: U from the QK-norm
// weights, or from the largest q and k norms (qw NULL); kv_first with its running max; q_last by its
// definition (the last query block m with kv_first[m] <= n). Gates of different speeds per (b, h).
static void test_acp_tables(void) {
    const int B = 2, H = 3, T = 1500, dh = 64, nblk = fox_acp_blocks(T), BH = B * H;
    size_t nqk = (size_t)BH * T * dh;
    float *c = (float *)fox_malloc((size_t)BH * T * sizeof(float)), *w = (float *)fox_malloc((size_t)2 * H * dh * sizeof(float));
    bf16 *qk = (bf16 *)fox_malloc(2 * nqk * sizeof(bf16));
    uint64_t key = fox_rng_key(41, 0);
    for (int bh = 0; bh < BH; bh++) {
        double rate = 0.005 * (1 + 6 * bh);
        for (int t = 0; t < T; t++)
            c[(size_t)bh * T + t] = (t ? c[(size_t)bh * T + t - 1] : 0.0f) - (float)(rate * (1.0 + 0.5 * sin(t / 50.0)));
    }
    for (size_t i = 0; i < 2 * nqk; i++) qk[i] = __float2bfloat16((float)(0.3 * fox_rng_normal(key, i)));
    for (int i = 0; i < 2 * H * dh; i++) w[i] = (float)(1.0 + 0.5 * fox_rng_normal(key, 2 * nqk + i));
    float *dc, *dw;
    bf16 *dqk;
    int *dkf, *dql;
    unsigned long long *dlive;
    FOX_CUDA_CHECK(cudaMalloc(&dlive, sizeof(unsigned long long)));
    FOX_CUDA_CHECK(cudaMalloc(&dc, (size_t)BH * T * sizeof(float)));
    FOX_CUDA_CHECK(cudaMalloc(&dw, (size_t)2 * H * dh * sizeof(float)));
    FOX_CUDA_CHECK(cudaMalloc(&dqk, 2 * nqk * sizeof(bf16)));
    FOX_CUDA_CHECK(cudaMalloc(&dkf, (size_t)BH * nblk * sizeof(int)));
    FOX_CUDA_CHECK(cudaMalloc(&dql, (size_t)BH * nblk * sizeof(int)));
    FOX_CUDA_CHECK(cudaMemcpy(dc, c, (size_t)BH * T * sizeof(float), cudaMemcpyHostToDevice));
    FOX_CUDA_CHECK(cudaMemcpy(dw, w, (size_t)2 * H * dh * sizeof(float), cudaMemcpyHostToDevice));
    FOX_CUDA_CHECK(cudaMemcpy(dqk, qk, 2 * nqk * sizeof(bf16), cudaMemcpyHostToDevice));
    int *kf = (int *)fox_malloc((size_t)BH * nblk * sizeof(int)), *ql = (int *)fox_malloc((size_t)BH * nblk * sizeof(int));
    for (int norms = 0; norms < 2; norms++) {
        FOX_CUDA_CHECK(cudaMemset(dlive, 0, sizeof(unsigned long long)));
        fox_acp_tables(dkf, dql, dlive, dc, dqk, dqk + nqk, norms ? NULL : dw, norms ? NULL : dw + H * dh, dh, B, H, T, dh, 0);
        unsigned long long live = 0;
        FOX_CUDA_CHECK(cudaMemcpy(&live, dlive, sizeof(live), cudaMemcpyDeviceToHost));
        FOX_CUDA_CHECK(cudaMemcpy(kf, dkf, (size_t)BH * nblk * sizeof(int), cudaMemcpyDeviceToHost));
        FOX_CUDA_CHECK(cudaMemcpy(ql, dql, (size_t)BH * nblk * sizeof(int), cudaMemcpyDeviceToHost));
        int bad = 0, pruned = 0;
        for (int bh = 0; bh < BH; bh++) {
            float mq = 0.0f, mk = 0.0f;
            if (!norms) {
                for (int i = 0; i < dh; i++) {
                    mq = fmaxf(mq, fabsf(w[(bh % H) * dh + i]));
                    mk = fmaxf(mk, fabsf(w[H * dh + (bh % H) * dh + i]));
                }
            } else {
                for (int t = 0; t < T; t++) {
                    float q2 = 0.0f, k2 = 0.0f;
                    for (int i = 0; i < dh; i++) {
                        float a = __bfloat162float(qk[((size_t)bh * T + t) * dh + i]);
                        float b = __bfloat162float(qk[nqk + ((size_t)bh * T + t) * dh + i]);
                        q2 += a * a;
                        k2 += b * b;
                    }
                    mq = fmaxf(mq, q2);
                    mk = fmaxf(mk, k2);
                }
            }
            double U = norms ? fox_acp_bound_norms(mq, mk, dh) : fox_acp_bound_qknorm(mq, mk, dh);
            double delta = fox_acp_threshold(U, T);
            int prev = 0;
            for (int m = 0; m < nblk; m++) {
                int f = fox_acp_first_live(c + (size_t)bh * T, T, m, delta);
                prev = f > prev ? f : prev;
                bad += kf[bh * nblk + m] != prev;
                pruned += prev;
            }
            for (int n = 0; n < nblk; n++) {
                int last = n;
                for (int m = n; m < nblk; m++)
                    if (kf[bh * nblk + m] <= n) last = m;
                bad += ql[bh * nblk + n] != last;
            }
        }
        int tiles = BH * (int)fox_acp_tiles(T);
        check(bad == 0 && pruned > 0 && live == (unsigned long long)(tiles - pruned),
              "%-18s GPU tables = host staircase (%s bound; %d of %d tiles pruned, %d mismatches; %llu counted live)",
              "ACP", norms ? "q/k norm" : "QK-norm weight", pruned, tiles, bad, live);
    }
    FOX_CUDA_CHECK(cudaFree(dc));
    FOX_CUDA_CHECK(cudaFree(dw));
    FOX_CUDA_CHECK(cudaFree(dqk));
    FOX_CUDA_CHECK(cudaFree(dkf));
    FOX_CUDA_CHECK(cudaFree(dql));
    FOX_CUDA_CHECK(cudaFree(dlive));
    free(c);
    free(w);
    free(qk);
    free(kf);
    free(ql);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s FIXTURE_DIR\n", argv[0]);
        return 2;
    }
    char path[4352], line[512], first[512] = "";
    snprintf(path, sizeof(path), "%s/manifest.txt", argv[1]);
    FILE *f = fox_fopen(path, "r");
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\r\n")] = 0;
        if (!line[0]) continue;
        if (!first[0]) snprintf(first, sizeof(first), "%s", line);
        test_fixture(argv[1], line, 0);
    }
    fclose(f);
    // The first fixture again with a logits buffer of 48 rows: the lm_head and cross entropy run in
    // chunks, and the backward recomputes each chunk's logits.
    printf("-- %s with the lm_head in chunks of 48 tokens\n", first);
    test_fixture(argv[1], first, (size_t)48 * 128 * sizeof(bf16));
    test_crossentropy_large_vocab();
    test_acp_tables();
    test_determinism_long();
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
