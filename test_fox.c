// test_fox.c: checks train_fox.c against the PyTorch reference's fixtures (forward, loss,
// per-position losses, every gradient, 10 AdamW steps), by finite differences where we own the
// numerics alone, and end to end through the train_fox_cpu binary: checkpoints, resume, bad input.
// Usage: test_fox_cpu FIXTURE_DIR   (environment: PYTHON = an interpreter that can import torch)
// Built with FOX_REAL_DOUBLE (test_fox_fd) it runs the finite-difference checks in float64.
#define TESTING
#include "train_fox.c"
#include "fox/fixture.h"
#include "fox/testing.h"

#ifndef FOX_REAL_DOUBLE
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

#endif

#ifdef FOX_REAL_DOUBLE
// ----------------------------------------------------------------------------
// Finite differences (independent of PyTorch)

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

static int mask_rows_f(const Model *m, size_t i) { return m->cols.f >= 0 && (int)(i / m->cfg.d_model) >= m->cols.f; }
static int mask_rows_ak(const Model *m, size_t i) {
    int r = (int)(i / m->cfg.d_model);
    return m->cols.ak >= 0 && r >= m->cols.ak && r < m->cols.ak + m->cfg.n_head;
}
static int mask_rows_av(const Model *m, size_t i) {
    int r = (int)(i / m->cfg.d_model);
    return m->cols.av >= 0 && r >= m->cols.av && r < m->cols.av + m->cfg.n_head;
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
    for (int l = 0; l < 2; l++) {
        char label[96];
        snprintf(label, sizeof(label), "forget-gate bias (layer %d)", l);
        fd_direction(&m, FOX_P_fgate_b, l, label, in, tg, B, T, NULL, eps, tol);
        snprintf(label, sizeof(label), "forget-gate weights (layer %d)", l);
        fd_direction(&m, FOX_P_attn_in_w, l, label, in, tg, B, T, mask_rows_f, eps, tol);
        snprintf(label, sizeof(label), "k-shift weights (layer %d)", l);
        fd_direction(&m, FOX_P_attn_in_w, l, label, in, tg, B, T, mask_rows_ak, eps, tol);
        snprintf(label, sizeof(label), "v-shift weights (layer %d)", l);
        fd_direction(&m, FOX_P_attn_in_w, l, label, in, tg, B, T, mask_rows_av, eps, tol);
        snprintf(label, sizeof(label), "q-norm weights (layer %d)", l);
        fd_direction(&m, FOX_P_qnorm_w, l, label, in, tg, B, T, NULL, eps, tol);
        snprintf(label, sizeof(label), "k-norm weights (layer %d)", l);
        fd_direction(&m, FOX_P_knorm_w, l, label, in, tg, B, T, NULL, eps, tol);
    }
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

#endif

#ifndef FOX_REAL_DOUBLE
// ----------------------------------------------------------------------------
// End to end through the binary

static const char *tmpdir;

// Runs a shell command; returns its exit status, with stderr captured to TMP/stderr.txt.
static int sh(const char *fmt, ...) {
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    char full[8800];
    snprintf(full, sizeof(full), "%s > %s/stdout.txt 2> %s/stderr.txt", cmd, tmpdir, tmpdir);
    int st = system(full);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

// The binary must fail with exactly one line on stderr that starts with "error:" and names `needle`.
static void expect_error(const char *label, const char *needle, int status) {
    char path[4200];
    snprintf(path, sizeof(path), "%s/stderr.txt", tmpdir);
    size_t len;
    char *err = fox_read_file(path, &len);
    int lines = 0;
    for (char *p = err; p && *p; p++) lines += *p == '\n';
    int ok = status != 0 && err && !strncmp(err, "error: ", 7) && lines == 1 && strstr(err, needle);
    check(ok, "bad input: %-34s exit %d, stderr: %s", label, status, err && *err ? strtok(err, "\n") : "(empty)");
    free(err);
}

#define TINY "./train_fox_cpu --layers 2 --dim 32 --heads 2 --mlp-hidden 64 --seq-len 32 --batch 2 " \
             "--val-steps 2 --sample-tokens 0 --warmup-tokens 256 --lr 3e-3"

static void write_shard(const char *path, int magic, int version, int ntok, int claimed, int tok_bytes) {
    FILE *f = fox_fopen(path, "wb");
    int32_t h[256] = {0};
    h[0] = magic; h[1] = version; h[2] = claimed;
    fox_fwrite(h, 4, 256, f, path);
    for (int i = 0; i < ntok; i++) {
        uint32_t v = (uint32_t)(i * 7919 % 50000);
        fox_fwrite(&v, (size_t)tok_bytes, 1, f, path);
    }
    fclose(f);
}

static void test_bad_inputs(void) {
    char p[4300], q[4300];
    expect_error("unknown flag", "--bogus", sh(TINY " --bogus 1"));
    expect_error("bad flag value", "--rope", sh(TINY " --rope maybe"));
    expect_error("missing shard", "nonexistent", sh(TINY " --train %s/nonexistent_*.bin", tmpdir));
    snprintf(p, sizeof(p), "%s/badmagic.bin", tmpdir);
    write_shard(p, 1234, 1, 4096, 4096, 2);
    expect_error("wrong magic", "badmagic.bin", sh(TINY " --train %s --val ''", p));
    snprintf(p, sizeof(p), "%s/truncated.bin", tmpdir);
    write_shard(p, 20240520, 1, 1000, 4096, 2);
    expect_error("truncated shard", "truncated.bin", sh(TINY " --train %s --val ''", p));
    expect_error("seq-len larger than the data", "data/val.bin", sh(TINY " --seq-len 200000 --train data/val.bin --val ''"));
    snprintf(q, sizeof(q), "%s/run_a", tmpdir);
    expect_error("checkpoint of another config", "d_model", sh(TINY " --steps 6 --dim 64 --resume --out %s", q));
    sh("cp -r %s/run_a %s/run_corrupt", tmpdir, tmpdir);
    snprintf(p, sizeof(p), "%s/run_corrupt/ckpt_00000006/model.bin", tmpdir);
    snprintf(q, sizeof(q), "%s/run_corrupt", tmpdir);
    FILE *f = fox_fopen(p, "r+b");
    int32_t bad = 99;
    fox_fwrite(&bad, 4, 1, f, p);
    fclose(f);
    expect_error("checkpoint with a wrong magic", "model.bin", sh(TINY " --steps 6 --resume --out %s", q));
    snprintf(p, sizeof(p), "%s/run_corrupt/ckpt_00000003/model.bin", tmpdir);
    sh("rm -rf %s/run_corrupt/ckpt_00000006 && mkdir %s/run_corrupt/ckpt_00000006 && cp %s %s/run_corrupt/ckpt_00000006/ && "
       "head -c 2000 %s/run_corrupt/ckpt_00000003/state_00000.bin > %s/run_corrupt/ckpt_00000006/state_00000.bin",
       tmpdir, tmpdir, p, tmpdir, tmpdir, tmpdir);
    expect_error("truncated optimizer state", "state_00000.bin", sh(TINY " --steps 6 --resume --out %s", q));
}

// Parses "loss" of every training line of a log.jsonl into losses (up to cap); returns the count.
static int read_losses(const char *path, double *losses, int cap) {
    size_t len;
    char *text = fox_read_file(path, &len);
    if (!text) return 0;
    int n = 0;
    for (char *line = strtok(text, "\n"); line && n < cap; line = strtok(NULL, "\n")) {
        char *at = strstr(line, "\"loss\": ");
        if (at) losses[n++] = strtod(at + 8, NULL);
    }
    free(text);
    return n;
}

static int files_equal(const char *a, const char *b) {
    size_t la, lb;
    char *x = fox_read_file(a, &la), *y = fox_read_file(b, &lb);
    int eq = x && y && la == lb && !memcmp(x, y, la);
    free(x);
    free(y);
    return eq;
}

// Uninterrupted 6 steps vs. 3 steps, a restart from the checkpoint, 3 more: same losses, bit for bit.
static void test_checkpoint_resume(void) {
    char a[4200], b[4200], pa[4300], pb[4300];
    snprintf(a, sizeof(a), "%s/run_a", tmpdir);
    snprintf(b, sizeof(b), "%s/run_b", tmpdir);
    int st = sh(TINY " --steps 6 --ckpt-every 3 --eval-every 3 --keep 5 --out %s", a);
    check(st == 0, "uninterrupted run of 6 steps exits 0 (status %d)", st);
    st = sh("mkdir -p %s && cp -r %s/ckpt_00000003 %s/ && cp %s/log.jsonl %s/log.jsonl", b, a, b, a, b);
    st = st || sh("%s/../../train_fox_cpu --help > /dev/null || true", a);
    // Cut run_b's log back to the first 3 steps, as if the run had been killed after step 3.
    st = sh("head -n 4 %s/log.jsonl > %s/log.tmp && mv %s/log.tmp %s/log.jsonl", a, b, b, b);
    check(st == 0, "prepared an interrupted copy of the run at step 3");
    // A stale temporary checkpoint (a kill mid-write) must be ignored.
    sh("mkdir -p %s/.tmp_ckpt_00000004 && echo partial > %s/.tmp_ckpt_00000004/model.bin", b, b);
    st = sh(TINY " --steps 6 --ckpt-every 3 --eval-every 3 --keep 5 --resume --out %s", b);
    check(st == 0, "resumed run exits 0 (status %d)", st);
    double la[16], lb[16];
    snprintf(pa, sizeof(pa), "%s/log.jsonl", a);
    snprintf(pb, sizeof(pb), "%s/log.jsonl", b);
    int na = read_losses(pa, la, 16), nb = read_losses(pb, lb, 16);
    int same = na == 6 && nb == 6;
    for (int i = 0; same && i < 6; i++) same = la[i] == lb[i];
    check(same, "resume from step 3 gives bitwise the same 6 losses (%d and %d read; last %.17g vs %.17g)", na, nb,
          na ? la[na - 1] : 0.0, nb ? lb[nb - 1] : 0.0);
    snprintf(pa, sizeof(pa), "%s/ckpt_00000006/model.bin", a);
    snprintf(pb, sizeof(pb), "%s/ckpt_00000006/model.bin", b);
    check(files_equal(pa, pb), "final weights of the resumed run are bitwise equal");
    snprintf(pa, sizeof(pa), "%s/ckpt_00000006/state_00000.bin", a);
    snprintf(pb, sizeof(pb), "%s/ckpt_00000006/state_00000.bin", b);
    check(files_equal(pa, pb), "final optimizer and loader state are bitwise equal");
    // Round trip: the checkpoint's model.bin reads back to the weights that produced it.
    Model m;
    FoxConfig c = fox_read_model_config(pa[0] ? (snprintf(pa, sizeof(pa), "%s/ckpt_00000006/model.bin", a), pa) : pa);
    model_init(&m, &c, 1, 1, 0);
    fox_read_model_bin(pa, &c, m.params);
    snprintf(pb, sizeof(pb), "%s/roundtrip.bin", tmpdir);
    fox_write_model_bin(pb, &c, m.params);
    check(files_equal(pa, pb), "model.bin read then written again is bitwise identical");
    model_free(&m);
    // --keep: with keep 1 only the newest survives.
    st = sh(TINY " --steps 8 --ckpt-every 2 --eval-every 0 --keep 1 --out %s/run_keep", tmpdir);
    char kdir[4300];
    snprintf(kdir, sizeof(kdir), "%s/run_keep", tmpdir);
    int steps[16];
    int n = fox_ckpt_list(kdir, steps, 16);
    check(st == 0 && n == 1 && steps[0] == 8, "--keep 1 leaves only ckpt_00000008 (%d left)", n);
}

// Reads a 1-D float64 .npy that fox_write_npy_f64 wrote; returns its length (0 on failure).
static size_t read_npy_f64(const char *path, double *x, size_t cap) {
    size_t len;
    char *buf = fox_read_file(path, &len);
    if (!buf || len < 10 || memcmp(buf, "\x93NUMPY", 6)) { free(buf); return 0; }
    size_t start = 10 + (size_t)(unsigned char)buf[8] + 256 * (size_t)(unsigned char)buf[9];
    size_t n = (len - start) / sizeof(double);
    if (n > cap) n = cap;
    memcpy(x, buf + start, n * sizeof(double));
    free(buf);
    return n;
}

// --eval-only on a checkpoint at twice its training context: L(i) equals this process's own
// forward over the same validation sequences, and the JSON's P(l) follows from it.
static void test_eval_only(void) {
    char out[4200], path[4300];
    snprintf(out, sizeof(out), "%s/eval", tmpdir);
    int st = sh("./train_fox_cpu --eval-only --init %s/run_a/ckpt_00000006/model.bin --val data/val.bin "
                "--eval-seqs 3 --eval-seq-len 64 --out %s", tmpdir, out);
    check(st == 0, "--eval-only at context 64 exits 0 (status %d)", st);
    snprintf(path, sizeof(path), "%s/run_a/ckpt_00000006/model.bin", tmpdir);
    FoxConfig c = fox_read_model_config(path);
    Model m;
    model_init(&m, &c, 1, 64, 0);
    fox_read_model_bin(path, &c, m.params);
    DataLoader val;
    dataloader_init(&val, "data/val.bin", 1, 64, 0, 1, 1337, 0);
    double ref[64] = {0}, got[64];
    int in[64], tg[64];
    for (int s = 0; s < 3; s++) {
        dataloader_next(&val, in, tg);
        model_forward(&m, in, tg, 1, 64);
        for (int t = 0; t < 64; t++) ref[t] += m.a.losses[t] / 3.0;
    }
    dataloader_free(&val);
    model_free(&m);
    snprintf(path, sizeof(path), "%s/per_token_loss.npy", out);
    size_t n = read_npy_f64(path, got, 64);
    double mx = 0.0, mean = 0.0;
    for (int t = 0; t < 64; t++) { mx = fmax(mx, fabs(got[t] - ref[t])); mean += ref[t] / 64; }
    check(n == 64 && mx < 1e-6, "per_token_loss.npy has 64 values equal to L(i) recomputed here (max diff %.2e)", mx);
    snprintf(path, sizeof(path), "%s/per_token_loss.json", out);
    size_t len;
    char *js = fox_read_file(path, &len);
    char *at = js ? strstr(js, "\"64\": ") : NULL;
    double p64 = at ? strtod(at + 6, NULL) : NAN;
    check(fabs(p64 - exp(mean)) < 1e-6 * exp(mean) && js && strstr(js, "\"n_seqs\": 3"),
          "per_token_loss.json: P(64) %.6f = exp(mean L) %.6f over 3 sequences", p64, exp(mean));
    free(js);
}

// Adaptive Computation Pruning (fox/acp.h). The staircase equals the tile rule applied to every tile;
// then a model whose fixed gates decay by 1/16 a token at T = 1024 (tiles 5 or more blocks below the
// diagonal fall under the threshold with the QK-norm bound U = 4; fox-llama's norm bound prunes more)
// gives, with --acp 1, the loss and gradients of --acp 0 to within the bound ε = e^-10 (relative).
static void test_acp(void) {
    int T = 1000, nblk = fox_acp_blocks(T), bad = 0;
    real *c = fox_malloc((size_t)T * sizeof(real));
    for (int t = 0; t < T; t++) c[t] = (t ? c[t - 1] : 0.0f) - (t % 300 < 150 ? 0.01f : 0.5f);
    const double deltas[] = {-5.0, -30.0, -200.0};
    for (int di = 0; di < 3; di++) {
        for (int m = 0; m < nblk; m++) {
            int f = acp_first_live(c, T, m, deltas[di]);
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
            for (int mb = 0; mb < nb; mb++) live += mb - m1.acp_first[bh * nb + mb] + 1;
        int tiles = B * cfg.n_head * (int)fox_acp_tiles(TT);
        model_backward(&m0, in, tg, B, TT, 1.0f);
        model_backward(&m1, in, tg, B, TT, 1.0f);
        double gmax = 0.0, gdiff = 0.0;
        for (size_t i = 0; i < m0.lay.total; i++) {
            gmax = fmax(gmax, fabs((double)m0.grads[i]));
            gdiff = fmax(gdiff, fabs((double)m1.grads[i] - (double)m0.grads[i]));
        }
        check(live < tiles, "ACP %s: %d of %d attention tiles live (last layer)", presets[pi], live, tiles);
        check(fabs(l1 - l0) <= exp(FOX_ACP_LOG_EPS) * fabs(l0) && gdiff <= exp(FOX_ACP_LOG_EPS) * gmax,
              "ACP %s: loss %.9f vs %.9f, gradients within %.1e of the largest (bound e^-10 = 4.5e-5)", presets[pi],
              l1, l0, gdiff / gmax);
        model_free(&m0);
        model_free(&m1);
        free(in);
        free(tg);
    }
}

// Data parallel: 2 MPI ranks with micro-batch 2 see the same 4 sequences per step as 1 rank
// with 2 micro-batches of 2 (rank r takes windows r, r+2, ...), so the losses agree up to the
// order of fp32 sums. Runs when the Makefile found mpicc (FOX_MPI_BIN).
static void test_data_parallel(void) {
    const char *bin = getenv("FOX_MPI_BIN");
    if (!bin || !*bin) { printf("SKIP data parallel: no MPI build (install libopenmpi-dev openmpi-bin)\n"); return; }
    const char *args = "--layers 2 --dim 32 --heads 2 --mlp-hidden 64 --seq-len 32 --batch 2 --steps 5 --lr 3e-3 "
                       "--warmup-tokens 256 --sample-tokens 0 --eval-every 0";
    int st = sh("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 mpirun --oversubscribe "
                "-np 2 ./%s %s --out %s/dp2", bin, args, tmpdir);
    check(st == 0, "mpirun -np 2 ./%s exits 0 (status %d)", bin, st);
    st = sh("OMP_NUM_THREADS=1 ./train_fox_cpu %s --total-batch-tokens 128 --out %s/dp1", args, tmpdir);
    char p1[4300], p2[4300];
    snprintf(p1, sizeof(p1), "%s/dp1/log.jsonl", tmpdir);
    snprintf(p2, sizeof(p2), "%s/dp2/log.jsonl", tmpdir);
    double l1[8], l2[8], mx = 0.0;
    int n1 = read_losses(p1, l1, 8), n2 = read_losses(p2, l2, 8);
    for (int i = 0; i < n1 && i < n2; i++) mx = fmax(mx, fabs(l1[i] - l2[i]) / l1[i]);
    check(st == 0 && n1 == 5 && n2 == 5 && mx < 1e-5, "2 ranks x batch 2 = 1 rank x 2 micro-batches: 5 losses within %.1e (tol 1e-5)", mx);
    // --eval-only across ranks: rank r takes sequences r, r+2, ..., so 2 ranks cover the same 5.
    const char *ev = "--eval-only --val data/val.bin --eval-seqs 5 --eval-seq-len 64";
    st = sh("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 mpirun --oversubscribe "
            "-np 2 ./%s %s --out %s/dp2", bin, ev, tmpdir);
    snprintf(p2, sizeof(p2), "%s/dp2/per_token_loss.npy", tmpdir);
    double e2[64], e1[64];
    size_t m2 = st == 0 ? read_npy_f64(p2, e2, 64) : 0;
    st = sh("OMP_NUM_THREADS=1 ./train_fox_cpu %s --init %s/dp2/ckpt_00000005/model.bin --out %s/dp1", ev, tmpdir, tmpdir);
    snprintf(p1, sizeof(p1), "%s/dp1/per_token_loss.npy", tmpdir);
    size_t m1 = st == 0 ? read_npy_f64(p1, e1, 64) : 0;
    mx = 0.0;
    for (size_t i = 0; i < m1 && i < m2; i++) mx = fmax(mx, fabs(e1[i] - e2[i]));
    check(m1 == 64 && m2 == 64 && mx < 1e-6, "--eval-only on 2 ranks gives the L(i) of 1 rank (max diff %.1e)", mx);
}

// fox.c and the PyTorch reference exchange weights: the reference's init loads here (and equals
// ours), and the reference computes the same loss from a model.bin that fox.c wrote.
static void test_reference_interop(void) {
    const char *py = getenv("PYTHON");
    if (!py || !*py) { check(0, "PYTHON is not set: cannot run the reference interop tests"); return; }
    char path[4300];
    snprintf(path, sizeof(path), "%s/ref_init.bin", tmpdir);
    int st = sh("%s train_fox.py init --model fox-pro --layers 2 --dim 32 --heads 2 --mlp-hidden 64 --vocab 50257 --seed 1337 --out %s",
                py, path);
    check(st == 0, "train_fox.py init wrote %s (status %d)", path, st);
    FoxArgs a;
    char *argv[] = {"x", "--layers", "2", "--dim", "32", "--heads", "2", "--mlp-hidden", "64"};
    fox_args_parse(&a, 9, argv);
    FoxConfig c = fox_args_config(&a);
    Model ours, theirs;
    model_init(&ours, &c, 2, 32, 1337);
    model_init(&theirs, &c, 2, 32, 0);
    fox_read_model_bin(path, &c, theirs.params);
    double mx = 0.0;
    for (size_t i = 0; i < ours.lay.total; i++) mx = fmax(mx, fabs((double)ours.params[i] - theirs.params[i]));
    check(mx <= 1e-7, "reference init (seed 1337) equals ours: max |diff| %.3e", mx);
    // Our checkpoint from the resume test, evaluated by both on the same tokens.
    char ck[4300], npy[4300];
    snprintf(ck, sizeof(ck), "%s/run_a/ckpt_00000006/model.bin", tmpdir);
    snprintf(npy, sizeof(npy), "%s/tokens.npy", tmpdir);
    fox_read_model_bin(ck, &c, ours.params);
    int B = 2, T = 32, in[64], tg[64];
    double toks[2 * 33];
    uint64_t key = fox_rng_key(3, 3);
    for (int i = 0; i < B * (T + 1); i++) toks[i] = (double)fox_rng_below(key, (uint64_t)i, 50257);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) { in[b * T + t] = (int)toks[b * (T + 1) + t]; tg[b * T + t] = (int)toks[b * (T + 1) + t + 1]; }
    fox_write_npy_f64_2d(npy, toks, (size_t)B, (size_t)(T + 1));
    double ours_loss = model_forward(&ours, in, tg, B, T);
    st = sh("%s train_fox.py loss --model-bin %s --tokens %s --dtype float64", py, ck, npy);
    snprintf(path, sizeof(path), "%s/stdout.txt", tmpdir);
    size_t len;
    char *outp = fox_read_file(path, &len);
    double ref = outp && strstr(outp, "loss ") ? strtod(strstr(outp, "loss ") + 5, NULL) : NAN;
    free(outp);
    check(st == 0 && fabs(ours_loss - ref) <= 1e-5 * fabs(ref), "loss of a fox.c checkpoint: ours %.8f, reference %.8f", ours_loss, ref);
    model_free(&ours);
    model_free(&theirs);
}

#endif

int main(int argc, char **argv) {
#ifdef FOX_REAL_DOUBLE
    (void)argc;
    (void)argv;
    test_finite_differences();
#else
    if (argc < 2) { fprintf(stderr, "usage: %s FIXTURE_DIR\n", argv[0]); return 2; }
    const char *fixdir = argv[1];
    char tmpl[] = "/tmp/fox_test_XXXXXX";
    tmpdir = mkdtemp(tmpl);
    if (!tmpdir) fox_fatal("cannot create a temporary directory");
    char manifest[4300];
    snprintf(manifest, sizeof(manifest), "%s/manifest.txt", fixdir);
    FILE *f = fox_fopen(manifest, "r");
    char name[256];
    int nfix = 0;
    while (fscanf(f, "%255s", name) == 1) { test_fixture(fixdir, name); nfix++; }
    fclose(f);
    check(nfix >= 4, "%d fixtures tested", nfix);
    test_checkpoint_resume();
    test_eval_only();
    test_acp();
    test_data_parallel();
    test_bad_inputs();
    test_reference_interop();
    sh("rm -rf %s", tmpdir);
#endif
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
