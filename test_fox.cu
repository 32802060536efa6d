// test_fox.cu: checks train_fox.cu on the GPU against the PyTorch reference's float64 fixtures
// (forward, loss, per-position losses, every gradient, 10 AdamW steps; the -docmask fixtures with the
// document mask, docs/model.md §1.8), that the recompute levels give bitwise the same gradients, that
// training is bitwise reproducible, and that a model.bin written from the GPU state reads back in
// train_fox_cpu's format. The document mask besides: ACP skips exactly the tiles before each query
// block's document, and a document after another in one window has the losses it has alone.
// Usage: test_foxcu FIXTURE_DIR   (fixtures at head_dim 64 or 128: `make test-gpu` writes them)
#define TESTING
#include "train_fox.cu"
#include "fox/checkpoint.h"  // fox_read_model_bin, fox_write_model_bin
#include "fixture.h"         // the reference's tensors
#include "testing.h"         // check, compare, check_rel

static void check_abs(const char *fx, const char *what, const float *a, const double *ref, size_t n, double tol) {
    Err e = compare(a, ref, n);
    check(e.abs <= tol, "%-18s %-24s max abs %.3e  rel %.3e  (tol abs %.0e)", fx, what, e.abs, e.rel, tol);
}

// Tolerances against the float64 reference, as max |error| over the tensor's largest |entry|. bf16 keeps 8
// significant bits (unit roundoff 2^-9 = 2e-3); every GEMM and attention operand is rounded once and
// accumulated in fp32, so a forward value carries a few independent 2e-3 relative errors: logits 2e-2 (H200,
// 2026-11-21: worst 7.3e-3 over the seven fixtures), losses 1e-2 absolute (the issue's bound; worst 1.3e-4 for
// the loss, 3.9e-3 for one position's loss; 8.1e-3 on an H100 on 2026-11-27, since q, k, v and the output gate
// are rounded as the attn_in GEMM writes them, docs/model.md §1.6). A gradient passes through about twice as
// many roundings (the forward operands, then the bf16 dres, dproj, du, dO and the attention's dq/dk/dv) and the
// norm-weight and gate-bias gradients sum them over B·T tokens: 3e-2 (worst 1.3e-2, d qnorm_w; 1.5e-2, d
// knorm_w, on 2026-11-27). Training: the issue's 1e-2 absolute on the 10 losses (worst 8.2e-4), grad norms 2e-2
// (worst 7.7e-3); the final weights only to 1e-1 (worst 5.6e-2): Adam divides by √v, so the rounding of a
// near-zero gradient becomes a whole lr-sized step of that weight.
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

// The host copy of n device values of `size` bytes each.
static void *host_copy(const void *dev, size_t n, size_t size) {
    void *h = fox_malloc(n * size);
    FOX_CUDA_CHECK(cudaMemcpy(h, dev, n * size, cudaMemcpyDeviceToHost));
    return h;
}

static float *device_copy(const float *dev, size_t n) { return (float *)host_copy(dev, n, sizeof(float)); }

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

// A deterministic training model of B x T tokens at a recompute level; logits_bytes 0: the default buffer;
// doc_sep: the document mask's separator (-1: none).
static ModelOptions test_options(int B, int T, int level, size_t logits_bytes, int doc_sep) {
    ModelOptions o = {B, T, 1234, 0, level, 0, doc_sep, 0, 1, logits_bytes, 0, 0};
    return o;
}

// Gradients of one forward/backward at a recompute level (host copy), with the given logits buffer and
// document mask, the first blocks' q, k, v (qkv_blocks of them) and xn, z, h (outs_blocks) kept (at level 0).
static float *grads_at_level(const FoxConfig *c, int B, int T, int level, int qkv_blocks, int outs_blocks,
                             size_t logits_bytes, int doc_sep, const float *params, const int *in, const int *tg) {
    Model m;
    ModelOptions o = test_options(B, T, level, logits_bytes, doc_sep);
    o.qkv_blocks = qkv_blocks;
    o.outs_blocks = outs_blocks;
    model_init(&m, c, &o);
    model_set_params(&m, params);
    model_zero_grad(&m);
    model_forward(&m, in, tg, B, T);
    model_backward(&m, in, B, T, 1.0f, 0);
    float *g = device_copy(m.grads, m.lay.total);
    model_free(&m);
    return g;
}

// The (N, V) logits of the last forward, chunk by chunk as the lm_head computes them (this writes them
// over the dlogits the forward left in the buffer; the backward then computes those again).
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
    if (c.arch == FOX_ARCH_FAM && fam_unsupported(&c)) {  // the CPU's fixtures of small blocks (-gpu: multiples of 128)
        printf("SKIP %s: %s\n", name, fam_unsupported(&c));
        fixture_free(&fx);
        return;
    }
    int dh = fox_head_dim(&c);
    const char *unsupported = c.arch == FOX_ARCH_GSA ? gsa_unsupported(dh, c.gsa_slots)
                              : dh != 64 && dh != 128 ? "the attention kernel runs head_dim 64 and 128" : NULL;
    if (unsupported) {
        check(0, "%-18s head_dim %d: %s (write the fixtures with `make test-gpu`)", name, dh, unsupported);
        fixture_free(&fx);
        return;
    }
    const FixtureTensor *tin = fixture_get(&fx, "inputs");
    int B = (int)tin->dims[0], T = (int)tin->dims[1], N = B * T, V = c.vocab_size;
    const FixtureTensor *hp = fixture_get(&fx, "train.hparams");
    const int doc_sep = fixture_doc_sep(&fx);  // the -docmask fixtures: everything below with the mask
    Model m;
    ModelOptions opts = test_options(B, T, RECOMPUTE_NONE, logits_bytes, doc_sep);
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

    // Recomputation changes where activations come from, never their values; so does keeping q, k, v and
    // xn, z, h (level 0 above recomputes or rewrites every block's, here every block keeps them, then the
    // first alone).
    for (int level = RECOMPUTE_NORM_MLP; level <= RECOMPUTE_BLOCK; level++) {
        float *g = grads_at_level(&c, B, T, level, 0, 0, logits_bytes, doc_sep, params, inputs, targets);
        check(!memcmp(g, grads, m.lay.total * sizeof(float)), "%-18s --recompute %d: gradients bitwise equal to level 0", name, level);
        free(g);
    }
    const int kept[2] = {c.n_layer, 1};
    for (int i = 0; i < (c.n_layer > 1 ? 2 : 1); i++) {
        float *g = grads_at_level(&c, B, T, RECOMPUTE_NONE, kept[i], kept[i], logits_bytes, doc_sep, params, inputs, targets);
        check(!memcmp(g, grads, m.lay.total * sizeof(float)),
              "%-18s q, k, v and xn, z, h kept in %d of %d blocks: gradients bitwise equal", name, kept[i], c.n_layer);
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

// A preset at the given vocabulary, 2 layers, d_model 128, 2 heads (head_dim 64).
static FoxConfig small_config(const char *preset, int vocab) {
    FoxConfig c;
    fox_config_defaults(&c);
    c.vocab_size = vocab;
    c.n_layer = 2;
    c.d_model = 128;
    c.n_head = 2;
    if (!fox_config_apply_preset(&c, preset)) fox_fatal("unknown preset %s", preset);
    return c;
}

// Determinism where the attention has several key blocks per head (T = 1024): a fox-pro model from
// the shared init, 2 steps twice on random tokens.
static void test_determinism_long(void) {
    FoxConfig c = small_config("fox-pro", 512);
    int B = 2, T = 1024, steps = 2, N = B * T;
    Model m;
    ModelOptions opts = test_options(B, T, RECOMPUTE_NONE, 0, -1);
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

// A device copy of n bf16 values drawn from N(0, sd) (stream `stream` of seed 79).
static bf16 *random_bf16(size_t n, double sd, uint64_t stream) {
    bf16 *h = (bf16 *)fox_malloc(n * sizeof(bf16)), *d;
    for (size_t i = 0; i < n; i++) h[i] = __float2bfloat16((float)(sd * fox_rng_normal(fox_rng_key(79, stream), i)));
    FOX_CUDA_CHECK(cudaMalloc(&d, n * sizeof(bf16)));
    FOX_CUDA_CHECK(cudaMemcpy(d, h, n * sizeof(bf16), cudaMemcpyHostToDevice));
    free(h);
    return d;
}

// max |a - b| / max |b| over n values of type T (bf16 or float).
template <class T> static double max_rel_diff(const T *a, const T *b, size_t n) {
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)(float)a[i] - (double)(float)b[i]));
        r = fmax(r, fabs((double)(float)b[i]));
    }
    return r > 0 ? d / r : d;
}

// The deterministic attention backward in its chains (fox_attention_backward, fox/attention_traits.cuh:
// bwd_chain_lo) against the one-chain order (fox_attention_backward_keys + _finish) at T = 2000 (16 key blocks:
// four chains), without ACP and with a staircase of 6 live key blocks a row (rows where whole chains are
// dead): dk and dv bitwise equal (no chain sums them), dq, dc and dlogf equal up to the fp32 adds' order, and
// the chains' result the same bits from scratch poisoned with NaN and with zeros (no unwritten accumulator read).
static void test_attention_chains(void) {
    const int B = 1, H = 3, T = 2000, BH = B * H, nblk = fox_acp_blocks(T);
    const size_t nv = (size_t)BH * T;
    int kvf[BH * 16], qls[BH * 16];
    for (int bh = 0; bh < BH; bh++)
        for (int n = 0; n < nblk; n++) {
            kvf[bh * nblk + n] = n > 5 ? n - 5 : 0;
            qls[bh * nblk + n] = n + 5 < nblk ? n + 5 : nblk - 1;
        }
    float *hc = (float *)fox_malloc(nv * sizeof(float));
    for (int bh = 0; bh < BH; bh++) {
        double acc = 0;
        for (int t = 0; t < T; t++) {  // log f = log sigmoid(3 + N(0, 1))
            acc -= log1p(exp(-(3.0 + fox_rng_normal(fox_rng_key(79, 9), (size_t)bh * T + t))));
            hc[(size_t)bh * T + t] = (float)acc;
        }
    }
    float *c, *lse, *dc, *dlogf;
    int *kv_first, *q_last;
    FOX_CUDA_CHECK(cudaMalloc(&c, nv * sizeof(float)));
    FOX_CUDA_CHECK(cudaMalloc(&lse, nv * sizeof(float)));
    FOX_CUDA_CHECK(cudaMalloc(&dc, nv * sizeof(float)));
    FOX_CUDA_CHECK(cudaMalloc(&dlogf, nv * sizeof(float)));
    FOX_CUDA_CHECK(cudaMalloc(&kv_first, sizeof(kvf)));
    FOX_CUDA_CHECK(cudaMalloc(&q_last, sizeof(qls)));
    FOX_CUDA_CHECK(cudaMemcpy(c, hc, nv * sizeof(float), cudaMemcpyHostToDevice));
    FOX_CUDA_CHECK(cudaMemcpy(kv_first, kvf, sizeof(kvf), cudaMemcpyHostToDevice));
    FOX_CUDA_CHECK(cudaMemcpy(q_last, qls, sizeof(qls), cudaMemcpyHostToDevice));
    for (int dh = 64; dh <= 128; dh *= 2)
        for (int acp = 0; acp < 2; acp++) {
            const size_t n = nv * dh, sbytes = fox_attention_backward_scratch_bytes(B, H, T, dh);
            bf16 *q = random_bf16(n, 1.0, 1), *k = random_bf16(n, 1.0, 2), *v = random_bf16(n, 1.0, 3);
            bf16 *dout = random_bf16(n, 1.0, 4), *o, *g[3];
            void *scratch;
            FOX_CUDA_CHECK(cudaMalloc(&o, n * sizeof(bf16)));
            for (int i = 0; i < 3; i++) FOX_CUDA_CHECK(cudaMalloc(&g[i], n * sizeof(bf16)));
            FOX_CUDA_CHECK(cudaMalloc(&scratch, sbytes));
            fox_attention_forward(q, k, v, c, o, lse, B, H, T, dh, acp ? kv_first : NULL, 0);
            void *out[3][5];  // chains from NaN, chains from zeros, one chain: dq, dk, dv, dc, dlogf
            for (int r = 0; r < 3; r++) {
                FOX_CUDA_CHECK(cudaMemset(scratch, r == 1 ? 0x00 : 0xff, sbytes));
                if (r < 2) {
                    fox_attention_backward(q, k, v, c, o, lse, dout, dc, dlogf, g[0], g[1], g[2], scratch, B, H, T, dh,
                                           acp ? q_last : NULL, 1, 0);
                } else {
                    FoxAttnSums sums = fox_attention_backward_keys(q, k, v, c, o, lse, dout, dc, g[1], g[2], scratch, B, H,
                                                                   T, dh, acp ? q_last : NULL, 1, 0);
                    fox_attention_backward_finish(sums, dc, dlogf, g[0], B, H, T, dh, 0);
                }
                for (int i = 0; i < 3; i++) out[r][i] = host_copy(g[i], n, sizeof(bf16));
                out[r][3] = host_copy(dc, nv, sizeof(float));
                out[r][4] = host_copy(dlogf, nv, sizeof(float));
            }
            int same = 1;
            for (int i = 0; i < 5; i++) same &= !memcmp(out[0][i], out[1][i], i < 3 ? n * sizeof(bf16) : nv * sizeof(float));
            const int kv_same = !memcmp(out[0][1], out[2][1], n * sizeof(bf16)) &&
                                !memcmp(out[0][2], out[2][2], n * sizeof(bf16));
            const double edq = max_rel_diff((bf16 *)out[0][0], (bf16 *)out[2][0], n);
            const double edc = max_rel_diff((float *)out[0][3], (float *)out[2][3], nv);
            const double edl = max_rel_diff((float *)out[0][4], (float *)out[2][4], nv);
            check(same && kv_same && edq < 1e-2 && edc < 1e-5 && edl < 1e-5,
                  "%-18s d_h %d, %s: from NaN and zeros the same bits %s; dk, dv as one chain's %s; dq, dc, dlogf against "
                  "one chain's %.2e %.2e %.2e (tol 1e-2, 1e-5, 1e-5)",
                  "attention chains", dh, acp ? "ACP, 6 live key blocks a row" : "no ACP", same ? "yes" : "NO",
                  kv_same ? "bitwise" : "DIFFER", edq, edc, edl);
            for (int r = 0; r < 3; r++)
                for (int i = 0; i < 5; i++) free(out[r][i]);
            bf16 *bufs[] = {q, k, v, dout, o, g[0], g[1], g[2]};
            for (int i = 0; i < 8; i++) FOX_CUDA_CHECK(cudaFree(bufs[i]));
            FOX_CUDA_CHECK(cudaFree(scratch));
        }
    void *rest[] = {c, lse, dc, dlogf, kv_first, q_last};
    for (int i = 0; i < 6; i++) FOX_CUDA_CHECK(cudaFree(rest[i]));
    free(hc);
}

// Keeping q, k, v (and xn, z, h) in some blocks and recomputing (rewriting) them in the others (between kept
// ones and the last block, which the forward leaves in the shared slices): a 4-layer fox-pro model's
// gradients, bitwise those of keeping none.
static void test_kept_blocks(void) {
    FoxConfig c = small_config("fox-pro", 512);
    c.n_layer = 4;
    int B = 2, T = 256, N = B * T;
    Model m;
    ModelOptions opts = test_options(B, T, RECOMPUTE_NONE, 0, -1);
    model_init(&m, &c, &opts);
    float *params = device_copy(m.params, m.lay.total);
    const size_t total = m.lay.total;
    model_free(&m);
    int *tok = (int *)fox_malloc((size_t)2 * N * sizeof(int));
    for (size_t i = 0; i < (size_t)2 * N; i++) tok[i] = (int)fox_rng_below(fox_rng_key(78, 0), i, (uint64_t)c.vocab_size);
    float *g0 = grads_at_level(&c, B, T, RECOMPUTE_NONE, 0, 0, 0, -1, params, tok, tok + N);
    size_t nonzero = 0;
    for (size_t i = 0; i < total; i++) nonzero += g0[i] != 0.0f;
    check(nonzero > total / 2, "%-18s %zu of %zu gradients nonzero", "kept blocks", nonzero, total);
    const int kept[4][2] = {{1, 0}, {2, 0}, {4, 1}, {4, 4}};  // q, k, v; xn, z, h
    for (int i = 0; i < 4; i++) {
        float *g = grads_at_level(&c, B, T, RECOMPUTE_NONE, kept[i][0], kept[i][1], 0, -1, params, tok, tok + N);
        check(!memcmp(g, g0, total * sizeof(float)),
              "%-18s q, k, v kept in %d of 4 blocks, xn, z, h in %d: gradients bitwise equal", "kept blocks", kept[i][0],
              kept[i][1]);
        free(g);
    }
    free(g0);
    free(tok);
    free(params);
}

// The fused cross-entropy kernel at GPT-2's vocabulary (the fixtures' is 128): per-row loss and the
// in-place dlogits of one launch against float64 on the same bf16 logits.
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
    float *dloss;
    int *dtg;
    FOX_CUDA_CHECK(cudaMalloc(&dz, (size_t)R * VP * sizeof(bf16)));
    FOX_CUDA_CHECK(cudaMalloc(&dloss, (size_t)R * sizeof(float)));
    FOX_CUDA_CHECK(cudaMalloc(&dtg, (size_t)R * sizeof(int)));
    FOX_CUDA_CHECK(cudaMemcpy(dz, z, (size_t)R * VP * sizeof(bf16), cudaMemcpyHostToDevice));
    FOX_CUDA_CHECK(cudaMemcpy(dtg, tg, (size_t)R * sizeof(int), cudaMemcpyHostToDevice));
    fox_crossentropy(dloss, dz, dtg, R, V, VP, scale, 1, 0);
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
// definition (the last query block m with kv_first[m] <= n). Gates of different speeds per (b, h). With
// the document mask (fox/docmask.h): kv_first at least doc_first (fox_doc_first_blocks of tokens with
// separators, one at a block's first row), with the gate's threshold, and without a gate (c NULL). The live
// tiles it counts per head (summed over the batch) = the host staircase's.
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
    FOX_CUDA_CHECK(cudaMalloc(&dlive, H * sizeof(unsigned long long)));
    FOX_CUDA_CHECK(cudaMalloc(&dc, (size_t)BH * T * sizeof(float)));
    FOX_CUDA_CHECK(cudaMalloc(&dw, (size_t)2 * H * dh * sizeof(float)));
    FOX_CUDA_CHECK(cudaMalloc(&dqk, 2 * nqk * sizeof(bf16)));
    FOX_CUDA_CHECK(cudaMalloc(&dkf, (size_t)BH * nblk * sizeof(int)));
    FOX_CUDA_CHECK(cudaMalloc(&dql, (size_t)BH * nblk * sizeof(int)));
    FOX_CUDA_CHECK(cudaMemcpy(dc, c, (size_t)BH * T * sizeof(float), cudaMemcpyHostToDevice));
    FOX_CUDA_CHECK(cudaMemcpy(dw, w, (size_t)2 * H * dh * sizeof(float), cudaMemcpyHostToDevice));
    FOX_CUDA_CHECK(cudaMemcpy(dqk, qk, 2 * nqk * sizeof(bf16), cudaMemcpyHostToDevice));
    int *kf = (int *)fox_malloc((size_t)BH * nblk * sizeof(int)), *ql = (int *)fox_malloc((size_t)BH * nblk * sizeof(int));
    // The document mask: separators (token 3) in row 0 at 200, 700, 701, 1300; in row 1 at 1024 (block 8's first
    // row) and 1499 (the last position).
    int *tok = (int *)fox_calloc((size_t)B * T, sizeof(int)), *df = (int *)fox_malloc((size_t)B * nblk * sizeof(int)), *ddf;
    const int seps[] = {200, 700, 701, 1300, T + 1024, T + 1499};
    for (size_t i = 0; i < sizeof(seps) / sizeof(seps[0]); i++) tok[seps[i]] = 3;
    fox_doc_first_blocks(df, tok, B, T, 3);
    FOX_CUDA_CHECK(cudaMalloc(&ddf, (size_t)B * nblk * sizeof(int)));
    FOX_CUDA_CHECK(cudaMemcpy(ddf, df, (size_t)B * nblk * sizeof(int), cudaMemcpyHostToDevice));
    const char *variant[] = {"QK-norm weight bound", "q/k norm bound", "QK-norm bound + docs", "docs, no gate"};
    for (int var = 0; var < 4; var++) {
        const int norms = var == 1, docs = var >= 2, gate = var != 3;
        FOX_CUDA_CHECK(cudaMemset(dlive, 0, H * sizeof(unsigned long long)));
        fox_acp_tables(dkf, dql, dlive, gate ? dc : NULL, dqk, dqk + nqk, norms ? NULL : dw, norms ? NULL : dw + H * dh, dh,
                       docs ? ddf : NULL, B, H, T, dh, 0);
        unsigned long long live[H];
        long long want[H] = {0};
        FOX_CUDA_CHECK(cudaMemcpy(live, dlive, sizeof(live), cudaMemcpyDeviceToHost));
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
                int f = gate ? fox_acp_first_live(c + (size_t)bh * T, T, m, delta) : 0, d = df[(bh / H) * nblk + m];
                if (docs && d > f) f = d;
                prev = f > prev ? f : prev;
                bad += kf[bh * nblk + m] != prev;
                pruned += prev;
                want[bh % H] += m - prev + 1;
            }
            for (int n = 0; n < nblk; n++) {
                int last = n;
                for (int m = n; m < nblk; m++)
                    if (kf[bh * nblk + m] <= n) last = m;
                bad += ql[bh * nblk + n] != last;
            }
        }
        int tiles = BH * (int)fox_acp_tiles(T);
        for (int h = 0; h < H; h++) bad += live[h] != (unsigned long long)want[h];
        check(bad == 0 && pruned > 0 && want[0] + want[1] + want[2] == tiles - pruned,
              "%-18s GPU tables = host staircase (%s; %d of %d tiles pruned, %d mismatches; live per head %llu %llu %llu)",
              "ACP", variant[var], pruned, tiles, bad, live[0], live[1], live[2]);
    }
    FOX_CUDA_CHECK(cudaFree(ddf));
    free(tok);
    free(df);
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

// ACP's live tiles per (layer, head) in a training forward (what the step log's "acp_pruned" matrix reports):
// fox-pro with fixed gates of timescales 4 to 64 tokens log-spaced over 4 heads (head_dim 64), T = 2048,
// B = 2, random tokens, the shared init with layer 1's query-norm weights tripled (U x3: a lower threshold,
// fewer tiles pruned there; the slowest head prunes none at this T). The host counts each (layer, head)'s tiles from the c the forward left (a->c[l],
// recompute 0) and the weights' bound U, with fox/acp.h's staircase: the same c and the same float search as
// the GPU's, so the counts must be equal. (The CPU trainer's c, summed in double, differs by rounding: a
// tile at the threshold could flip, so test/test_gpu_e2e.sh compares the two trainers' matrices within a
// tolerance.)
static void test_acp_heads(void) {
    FoxConfig c = small_config("fox-pro", 128);
    c.d_model = 256;
    c.n_head = 4;
    c.forget_gate = FOX_FG_FIXED;
    c.t_min = 4.0f;
    c.t_max = 64.0f;
    const int B = 2, T = 2048, N = B * T, L = c.n_layer, H = c.n_head, dh = c.d_model / H, nblk = fox_acp_blocks(T);
    int *in = (int *)fox_malloc((size_t)N * sizeof(int)), *tg = (int *)fox_malloc((size_t)N * sizeof(int));
    for (int i = 0; i < N; i++) {
        in[i] = (int)fox_rng_below(fox_rng_key(71, 0), (uint64_t)i, 128);
        tg[i] = (int)fox_rng_below(fox_rng_key(71, 1), (uint64_t)i, 128);
    }
    Model m;
    ModelOptions o = test_options(B, T, RECOMPUTE_NONE, 0, -1);
    o.acp = 1;
    model_init(&m, &c, &o);
    float *p = device_copy(m.params, m.lay.total);
    const size_t wq = fox_param_offset(&m.lay, FOX_P_qnorm_w, 1);
    for (int i = 0; i < c.d_model; i++) p[wq + i] *= 3.0f;
    model_set_params(&m, p);
    model_forward(&m, in, tg, B, T);
    long long want[8] = {0}, tiles = (long long)B * fox_acp_tiles(T);
    float *cl = (float *)fox_malloc((size_t)N * H * sizeof(float));
    int bad = 0;
    for (int l = 0; l < L; l++) {
        FOX_CUDA_CHECK(cudaMemcpy(cl, m.a.c[l], (size_t)N * H * sizeof(float), cudaMemcpyDeviceToHost));
        const float *gq = p + fox_param_offset(&m.lay, FOX_P_qnorm_w, l), *gk = p + fox_param_offset(&m.lay, FOX_P_knorm_w, l);
        for (int h = 0; h < H; h++) {
            float mq = 0.0f, mk = 0.0f;
            for (int i = 0; i < dh; i++) {
                mq = fmaxf(mq, fabsf(gq[h * dh + i]));
                mk = fmaxf(mk, fabsf(gk[h * dh + i]));
            }
            double delta = fox_acp_threshold(fox_acp_bound_qknorm(mq, mk, dh), T);
            for (int b = 0; b < B; b++)
                for (int mb = 0, prev = 0; mb < nblk; mb++) {
                    int f = fox_acp_first_live(cl + ((size_t)b * H + h) * T, T, mb, delta);
                    prev = f > prev ? f : prev;
                    want[l * H + h] += mb - prev + 1;
                }
            bad += (long long)m.acp_live[l * H + h] != want[l * H + h];
        }
    }
    int varied = want[0] < want[1] && want[1] < want[2] && want[2] < tiles && want[4] > want[0];
    check(bad == 0 && varied && m.acp_tiles == tiles,
          "%-18s live tiles per (layer, head) = the host staircase on the forward's c: layer 0 %lld %lld %lld %lld, "
          "layer 1 %lld %lld %lld %lld of %lld (%d mismatches)", "ACP per head", want[0], want[1], want[2], want[3],
          want[4], want[5], want[6], want[7], tiles, bad);
    model_free(&m);
    free(cl);
    free(p);
    free(in);
    free(tg);
}

// ----------------------------------------------------------------------------
// The document mask (docs/model.md §1.8) beyond the fixtures' 64 positions.

#define DOC_SEP 3


// n random tokens in [0, 128) other than DOC_SEP (stream `seed`).
static void doc_tokens(int *t, int n, uint64_t seed) {
    for (int i = 0; i < n; i++) {
        t[i] = (int)fox_rng_below(fox_rng_key(seed, 0), (uint64_t)i, 128);
        if (t[i] == DOC_SEP) t[i] = DOC_SEP + 1;
    }
}

// ACP with the document mask skips exactly the attention tiles before each query block's document:
// transformer-pro (no forget gate, so no threshold: kv_first is the document's first block alone), B = 2,
// T = 1024, the reference init (model_init's), separators at known positions (row 0: 0, 300, 301, 700; row 1:
// 129, 640 = block 5's first row, 1023). The live tiles counted by the forward must be L·H·Σ_b Σ_m
// (m − f(b, m) + 1), f(b, m) = (the latest separator at or before m·128, else 0) / 128, which this test
// counts by its own loop; the tiles of the grid L·B·H·fox_acp_tiles(T). A skipped tile's scores carry
// c_i − c_j <= FOX_DOC_LOG_F = −512, so its weights are exp(−512 + O(1)) = 0 in fp32 and the forward and
// backward with ACP compute the same sums as without (same mask), up to fp32 summation order at most: the
// per-position losses must agree to 1e-3 absolute and every gradient to 1e-3 of its largest entry (a live
// tile wrongly skipped would move them by a whole key block's weight, orders of magnitude more).
static void test_doc_acp_tiles(void) {
    FoxConfig c = small_config("transformer-pro", 128);
    const int B = 2, T = 1024, N = B * T, L = c.n_layer, H = c.n_head, nblk = fox_acp_blocks(T);
    const int seps[2][4] = {{0, 300, 301, 700}, {129, 640, 1023, -1}};
    int *in = (int *)fox_malloc((size_t)N * sizeof(int)), *tg = (int *)fox_malloc((size_t)N * sizeof(int));
    doc_tokens(in, N, 61);
    for (int i = 0; i < N; i++) tg[i] = (int)fox_rng_below(fox_rng_key(62, 0), (uint64_t)i, 128);
    for (int b = 0; b < B; b++)
        for (int k = 0; k < 4; k++)
            if (seps[b][k] >= 0) in[(size_t)b * T + seps[b][k]] = DOC_SEP;
    long long want = 0;
    for (int b = 0; b < B; b++)
        for (int m = 0; m < nblk; m++) {
            int last = 0;  // the latest separator at or before the block's first row
            for (int t = 0; t <= m * FOX_ACP_BLOCK; t++)
                if (in[(size_t)b * T + t] == DOC_SEP) last = t;
            want += m - last / FOX_ACP_BLOCK + 1;
        }
    want *= (long long)L * H;
    float *losses[2], *grads[2];
    long long live = -1, tiles = -1;
    for (int acp = 0; acp < 2; acp++) {
        Model m;
        ModelOptions o = {B, T, 1234, 0, RECOMPUTE_NONE, acp, DOC_SEP, 0, 1, 0, 0, 0};
        model_init(&m, &c, &o);
        model_zero_grad(&m);
        model_forward(&m, in, tg, B, T);
        losses[acp] = (float *)fox_malloc((size_t)N * sizeof(float));
        memcpy(losses[acp], m.h_losses, (size_t)N * sizeof(float));
        if (acp) {
            live = 0;
            for (int i = 0; i < L * H; i++) live += (long long)m.acp_live[i];
            tiles = (long long)L * H * m.acp_tiles;
        }
        model_backward(&m, in, B, T, 1.0f, 0);
        grads[acp] = device_copy(m.grads, m.lay.total);
        if (acp) {
            double frac = (double)live / tiles;  // the step line's "ACP x% of tiles"
            check(live == want && tiles == (long long)L * B * H * fox_acp_tiles(T),
                  "%-18s ACP live tiles = the cross-document tiles skipped: %lld of %lld (want %lld of %lld), live "
                  "fraction %.4f", "doc mask", live, tiles, want, (long long)L * B * H * fox_acp_tiles(T), frac);
        }
        model_free(&m);
    }
    double worst = 0.0, gworst = 0.0;
    for (int i = 0; i < N; i++) worst = fmax(worst, isnan(losses[1][i]) ? INFINITY : fabs((double)losses[1][i] - losses[0][i]));
    FoxLayout lay;
    fox_layout(&c, &lay);
    double *ref = (double *)fox_malloc(lay.total * sizeof(double));
    for (size_t i = 0; i < lay.total; i++) ref[i] = grads[0][i];
    for (int k = 0; k < FOX_NUM_PARAMS; k++) {
        const FoxParamInfo *p = &lay.p[k];
        if (!p->numel) continue;
        Err e = compare(grads[1] + p->offset, ref + p->offset, p->numel);
        gworst = fmax(gworst, e.rel);
    }
    check(worst <= 1e-3, "%-18s ACP per-position losses = those without ACP: max |diff| %.3e  (tol abs 1e-3)", "doc mask", worst);
    check(gworst <= 1e-3, "%-18s ACP gradients = those without ACP: worst tensor rel %.3e  (tol rel 1e-3)", "doc mask", gworst);
    for (int acp = 0; acp < 2; acp++) {
        free(losses[acp]);
        free(grads[acp]);
    }
    free(ref);
    free(in);
    free(tg);
}

// Two documents in one window give the second the losses it has alone: window 1 = [document A (200 tokens),
// separator, document B (311 tokens)] (T = 512), window 2 = [separator, document B] (T = 312), the same
// targets (each next token; one more random token after B's end), the reference init. The per-position
// losses of the separator and of B's positions agree to 2e-2 absolute: both windows compute the same function
// of B's tokens in bf16 (the issue's loss tolerance is 1e-2; two bf16 computations, each within it of the
// exact value, that differ in their RoPE angles, attention tiles, GEMM shapes and c's magnitude: 2e-2;
// H100, 2026-11-25: 2.3e-3 fox-pro, 3.9e-3 transformer-pro). Without the mask A leaks into B's losses, by
// more than the tolerance (H100: 0.19 and 0.69), so the comparison can fail: that is checked too.
static void test_doc_windows(const char *preset) {
    FoxConfig c = small_config(preset, 128);
    const int LA = 200, LB = 311, T1 = LA + 1 + LB, T2 = 1 + LB;
    int *in1 = (int *)fox_malloc((size_t)T1 * sizeof(int)), *tg1 = (int *)fox_malloc((size_t)T1 * sizeof(int));
    int *in2 = (int *)fox_malloc((size_t)T2 * sizeof(int)), *tg2 = (int *)fox_malloc((size_t)T2 * sizeof(int));
    doc_tokens(in1, T1, 63);  // A, then B from position LA + 1; the last target after B's end
    int after = (int)fox_rng_below(fox_rng_key(64, 0), 0, 128);
    in1[LA] = DOC_SEP;
    for (int t = 0; t < T1; t++) tg1[t] = t + 1 < T1 ? in1[t + 1] : after;
    for (int t = 0; t < T2; t++) {
        in2[t] = in1[LA + t];
        tg2[t] = tg1[LA + t];
    }
    double diff[2] = {0.0, 0.0};  // with the mask, without
    for (int masked = 1; masked >= 0; masked--) {
        Model m;
        ModelOptions o = {1, T1, 1234, 1, RECOMPUTE_NONE, 0, masked ? DOC_SEP : -1, 0, 1, 0, 0, 0};
        model_init(&m, &c, &o);
        float *l1 = (float *)fox_malloc((size_t)T1 * sizeof(float));
        model_forward(&m, in1, tg1, 1, T1);
        memcpy(l1, m.h_losses, (size_t)T1 * sizeof(float));
        model_forward(&m, in2, tg2, 1, T2);
        for (int t = 0; t < T2; t++) {
            double d = fabs((double)l1[LA + t] - m.h_losses[t]);
            diff[!masked] = isnan(d) || d > diff[!masked] ? (isnan(d) ? INFINITY : d) : diff[!masked];
        }
        free(l1);
        model_free(&m);
    }
    check(diff[0] <= 2e-2 && diff[1] > 2e-2, "%-18s %s: document B's %d losses after A and a separator (T=%d) = alone "
          "after a separator (T=%d): max |diff| %.3e  (tol abs 2e-2; without the mask %.3e, more than it)", "doc mask",
          preset, T2, T1, T2, diff[0], diff[1]);
    free(in1);
    free(tg1);
    free(in2);
    free(tg2);
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
    test_acp_heads();
    test_doc_acp_tiles();
    test_doc_windows("fox-pro");
    test_doc_windows("transformer-pro");
    test_determinism_long();
    test_kept_blocks();
    test_attention_chains();
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
