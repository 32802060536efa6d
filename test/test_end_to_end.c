// test/test_end_to_end.c: the train_fox_cpu binary as a user runs it: checkpoints and a resume that
// equals the uninterrupted run, --eval-only's per-token loss, data parallel under mpirun (when the MPI
// build exists), one-line errors on bad input, and weights exchanged with the PyTorch reference
// (train_fox.py init / loss); the document mask (--doc-mask: ACP's live tiles, --eval-doc-pos, the
// reference's loss with --doc-sep); ACP's live tiles per layer and head (the log's matrix); Gated Slot Attention (--model gsa) and TransformerFAM (--model fox-fam,
// transformer-fam) end to end; a checkpoint written before the GSA config fields still loads. The model code of train_fox.c recomputes what the binary should have written.
// Usage (repository root, after make): test_end_to_end   (environment: PYTHON = an interpreter that can import
// torch; FOX_MPI_BIN = the MPI build, if any)
#define TESTING
#include <ctype.h>           // isdigit: the log's numbers
#include "train_fox.c"
#include "fox/args.h"        // FoxArgs, fox_args_parse, fox_args_config: the trainer's command line
#include "fox/checkpoint.h"  // fox_read_model_bin, fox_read_checked_header, fox_write_model_bin, fox_ckpt_list
#include "fox/npy.h"         // fox_write_npy_f64_2d
#include "dataloader.h"      // DataLoader: the windows the binary trained on
#include "testing.h"         // check: PASS / FAIL lines and their count

static const char *tmpdir;

// The config of a model.bin, its magic, version, checksum and size checked (fatal otherwise).
static FoxConfig read_model_config(const char *path) {
    int32_t h[FOX_CKPT_HEADER_INTS];
    fox_read_checked_header(path, h, FOX_CKPT_MAGIC, FOX_CKPT_VERSION, "model file");
    return fox_model_header_config(path, h);
}

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
    expect_error("--doc-sep outside the vocabulary", "--doc-sep", sh(TINY " --vocab 1000 --doc-mask"));
    expect_error("--doc-sep out of range", "--doc-sep", sh(TINY " --doc-sep -1 --doc-mask"));
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
    // Cut run_b's log back to the first 3 steps, as if the run had been killed after step 3.
    st = st || sh("head -n 4 %s/log.jsonl > %s/log.tmp && mv %s/log.tmp %s/log.jsonl", a, b, b, b);
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
    FoxConfig c = read_model_config(pa[0] ? (snprintf(pa, sizeof(pa), "%s/ckpt_00000006/model.bin", a), pa) : pa);
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

// --eval-only on the checkpoint of run `run` (after 6 steps at context 32) at twice its training context:
// L(i) equals this process's own forward over the same validation sequences, and the JSON's P(l) follows.
static void test_eval_only(const char *run) {
    char out[4200], path[4300];
    snprintf(out, sizeof(out), "%s/eval_%s", tmpdir, run);
    int st = sh("./train_fox_cpu --eval-only --init %s/%s/ckpt_00000006/model.bin --val data/val.bin "
                "--eval-seqs 3 --eval-seq-len 64 --out %s", tmpdir, run, out);
    check(st == 0, "--eval-only of %s at context 64 exits 0 (status %d)", run, st);
    snprintf(path, sizeof(path), "%s/%s/ckpt_00000006/model.bin", tmpdir, run);
    FoxConfig c = read_model_config(path);
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
    check(n == 64 && mx < 1e-6, "%s: per_token_loss.npy has 64 values equal to L(i) recomputed here (max diff %.2e)", run, mx);
    snprintf(path, sizeof(path), "%s/per_token_loss.json", out);
    size_t len;
    char *js = fox_read_file(path, &len);
    char *at = js ? strstr(js, "\"64\": ") : NULL;
    double p64 = at ? strtod(at + 6, NULL) : NAN;
    check(fabs(p64 - exp(mean)) < 1e-6 * exp(mean) && js && strstr(js, "\"n_seqs\": 3"),
          "%s: per_token_loss.json: P(64) %.6f = exp(mean L) %.6f over 3 sequences", run, p64, exp(mean));
    free(js);
}


// The document mask on the bundled data (documents of ~800 tokens, each after an <|endoftext|>): a
// Transformer with --doc-mask --acp computes exactly the tiles of each query block's document (the log's
// acp_live against the count from the first training window's separators); --eval-only --eval-doc-pos
// writes the loss by position within the document that this process's own masked forward gives.
static void test_doc_mask(void) {
    const int T = 1024, nb = fox_acp_blocks(T);
    char out[4200], path[4300];
    snprintf(out, sizeof(out), "%s/docmask", tmpdir);
    int st = sh("./train_fox_cpu --model transformer-pro --layers 1 --dim 32 --heads 2 --mlp-hidden 64 --seq-len %d "
                "--batch 1 --steps 1 --eval-every 0 --sample-tokens 0 --doc-mask --acp --out %s", T, out);
    DataLoader train;
    int *in = fox_malloc((size_t)T * sizeof(int)), *tg = fox_malloc((size_t)T * sizeof(int));
    dataloader_init(&train, "data/train.bin", 1, T, 0, 1, 1337, 1);
    dataloader_next(&train, in, tg);
    dataloader_free(&train);
    long long live = 0, seps = 0;
    for (int mb = 0; mb < nb; mb++) {
        int start = 0;
        for (int t = 0; t <= mb * FOX_ACP_BLOCK; t++)
            if (in[t] == FOX_EOT) start = t;
        live += mb - start / FOX_ACP_BLOCK + 1;
    }
    for (int t = 0; t < T; t++) seps += in[t] == FOX_EOT;
    double want = (double)live / fox_acp_tiles(T), got = NAN;
    snprintf(path, sizeof(path), "%s/log.jsonl", out);
    size_t len;
    char *log = fox_read_file(path, &len);
    char *at = log ? strstr(log, "\"acp_live\": ") : NULL;
    if (at) got = strtod(at + 12, NULL);
    free(log);
    check(st == 0 && seps > 0 && fabs(got - want) < 1e-4, "--doc-mask --acp, transformer-pro: a window with %lld "
          "separators computes %.4f of the tiles (the log), exactly those after each document start: %.4f", seps, got, want);

    snprintf(out, sizeof(out), "%s/docmask_eval", tmpdir);
    snprintf(path, sizeof(path), "%s/run_a/ckpt_00000006/model.bin", tmpdir);
    st = sh("./train_fox_cpu --eval-only --init %s --val data/val.bin --eval-seqs 3 --eval-seq-len %d --doc-mask "
            "--eval-doc-pos --out %s", path, T, out);
    FoxConfig c = read_model_config(path);
    Model m;
    model_init(&m, &c, 1, T, 0);
    fox_read_model_bin(path, &c, m.params);
    m.doc_sep = FOX_EOT;
    DataLoader val;
    dataloader_init(&val, "data/val.bin", 1, T, 0, 1, 1337, 0);
    double *sum = fox_calloc((size_t)T, sizeof(double)), *cnt = fox_calloc((size_t)T, sizeof(double));
    double *got_loss = fox_malloc((size_t)T * sizeof(double)), *got_cnt = fox_malloc((size_t)T * sizeof(double));
    for (int s = 0; s < 3; s++) {
        dataloader_next(&val, in, tg);
        model_forward(&m, in, tg, 1, T);
        for (int t = 0, start = -1; t < T; t++) {
            if (in[t] == FOX_EOT) start = t;
            if (start >= 0) { sum[t - start] += m.a.losses[t]; cnt[t - start] += 1; }
        }
    }
    dataloader_free(&val);
    model_free(&m);
    snprintf(path, sizeof(path), "%s/doc_pos_loss.npy", out);
    size_t n = read_npy_f64(path, got_loss, (size_t)T);
    snprintf(path, sizeof(path), "%s/doc_pos_count.npy", out);
    size_t nc = read_npy_f64(path, got_cnt, (size_t)T);
    double mx = 0.0, counted = 0.0;
    int agree = n == (size_t)T && nc == (size_t)T;
    for (int t = 0; agree && t < T; t++) {
        counted += cnt[t];
        agree = got_cnt[t] == cnt[t] && (cnt[t] > 0 ? !isnan(got_loss[t]) : isnan(got_loss[t]));
        if (cnt[t] > 0) mx = fmax(mx, fabs(got_loss[t] - sum[t] / cnt[t]));
    }
    check(st == 0 && agree && counted > 0 && mx < 1e-6, "--eval-doc-pos: doc_pos_loss.npy and doc_pos_count.npy (%.0f "
          "tokens) equal the masked losses by position within the document recomputed here (max diff %.2e)", counted, mx);
    free(sum); free(cnt); free(got_loss); free(got_cnt); free(in); free(tg);
}

// ACP's live tiles by brute force: each (layer, head)'s, summed over the batch, from c (the model's last
// forward) and the QK-norm weight bound U: each sequence's staircase from fox_acp_first_live, made monotone.
static void acp_brute_live(Model *m, int B, int T, long long *live) {
    const FoxConfig *c = &m->cfg;
    int L = c->n_layer, H = c->n_head, dh = c->d_model / H, nb = fox_acp_blocks(T);
    for (int l = 0; l < L; l++)
        for (int h = 0; h < H; h++) {
            const real *gq = param(m, FOX_P_qnorm_w, l) + h * dh, *gk = param(m, FOX_P_knorm_w, l) + h * dh;
            double mq = 0.0, mk = 0.0;
            for (int i = 0; i < dh; i++) {
                mq = fmax(mq, fabs((double)gq[i]));
                mk = fmax(mk, fabs((double)gk[i]));
            }
            double delta = fox_acp_threshold(fox_acp_bound_qknorm(mq, mk, dh), T);
            live[l * H + h] = 0;
            for (int b = 0; b < B; b++) {
                const creal *cs = m->a.c + (((size_t)l * B + b) * H + h) * T;
                for (int mb = 0, prev = 0; mb < nb; mb++) {
                    int f = fox_acp_first_live(cs, T, mb, delta);
                    prev = f > prev ? f : prev;
                    live[l * H + h] += mb - prev + 1;
                }
            }
        }
}

// The per-(layer, head) fractions of tiles ACP prunes, in the log and on the step line: fox-pro with fixed
// gates of timescales 4 and 16 tokens (heads 0 and 1) at T = 1024, batch 2, one step (the last step, which
// prints the per-layer summary). This process runs the same forward (the init of --seed 1337, the first
// training window) and counts the live tiles by brute force (acp_brute_live): the trainer's counts
// (m.acp_live) equal them, and so does the log's "acp_pruned" matrix (4 decimals; each entry is a multiple of
// 1/72), which the heads make non-trivial (one in two tiles pruned in head 0, one in six in head 1).
static void test_acp_heads(void) {
    const int B = 2, T = 1024;
    char out[4200], path[4300];
    snprintf(out, sizeof(out), "%s/acp_heads", tmpdir);
    int st = sh("./train_fox_cpu --model fox-pro --forget-gate fixed --t-min 4 --t-max 16 --layers 2 --dim 32 --heads 2 "
                "--mlp-hidden 64 --seq-len %d --batch %d --steps 1 --eval-every 0 --val '' --sample-tokens 0 --acp 1 --out %s",
                T, B, out);
    snprintf(path, sizeof(path), "%s/ckpt_00000001/model.bin", out);
    FoxConfig c = read_model_config(path);
    const int L = c.n_layer, H = c.n_head, LH = L * H;
    DataLoader train;
    int *in = fox_malloc((size_t)B * T * sizeof(int)), *tg = fox_malloc((size_t)B * T * sizeof(int));
    dataloader_init(&train, "data/train.bin", B, T, 0, 1, 1337, 1);
    dataloader_next(&train, in, tg);
    dataloader_free(&train);
    Model m;
    model_init(&m, &c, B, T, 1337);
    m.acp = 1;
    model_forward(&m, in, tg, B, T);
    long long brute[16], tiles = (long long)B * fox_acp_tiles(T);
    acp_brute_live(&m, B, T, brute);
    int same = m.acp_tiles == tiles, lo = 0, hi = 0;
    for (int i = 0; i < LH; i++) {
        same &= m.acp_live[i] == brute[i];
        lo = 1.0 - (double)brute[i] / tiles < 1.0 - (double)brute[lo] / tiles ? i : lo;
        hi = 1.0 - (double)brute[i] / tiles > 1.0 - (double)brute[hi] / tiles ? i : hi;
    }
    check(st == 0 && LH == 4 && same && brute[0] < brute[1] && brute[1] < tiles,
          "ACP per head: the trainer's live tiles of each (layer, head) = the brute-force count from c: "
          "%lld %lld | %lld %lld of %lld", brute[0], brute[1], brute[2], brute[3], tiles);

    snprintf(path, sizeof(path), "%s/log.jsonl", out);
    size_t len;
    char *log = fox_read_file(path, &len);
    char *p = log ? strstr(log, "\"acp_pruned\": [") : NULL;
    double worst = p ? 0.0 : INFINITY;
    for (int i = 0; p && i < LH; i++) {
        while (*p && !isdigit((unsigned char)*p)) p++;
        char *end;
        double got = strtod(p, &end);
        worst = end == p ? INFINITY : fmax(worst, fabs(got - (1.0 - (double)brute[i] / tiles)));
        p = end;
    }
    free(log);
    check(worst <= 1e-4, "ACP per head: log.jsonl's acp_pruned matrix (%d x %d) = 1 - brute-force live / %lld "
          "(max |diff| %.1e, tol 1e-4)", L, H, tiles, worst);
    char want[160];
    snprintf(want, sizeof(want), "heads: least %.1f%% (layer %d head %d), most %.1f%% (layer %d head %d)",
             100.0 * (1.0 - (double)brute[lo] / tiles), lo / H, lo % H, 100.0 * (1.0 - (double)brute[hi] / tiles), hi / H,
             hi % H);
    snprintf(path, sizeof(path), "%s/stdout.txt", tmpdir);
    char *stdout_txt = fox_read_file(path, &len);
    check(stdout_txt && strstr(stdout_txt, "ACP pruned by layer (%):") && strstr(stdout_txt, want),
          "ACP per layer: the step line's summary names the brute force's extremes (%s)", want);
    free(stdout_txt);
    model_free(&m);
    free(in);
    free(tg);

    // Past 256 (layer, head)s the matrix is only on the --eval-every steps and the last (docs/usage.md).
    snprintf(out, sizeof(out), "%s/acp_many_heads", tmpdir);
    st = sh("./train_fox_cpu --model fox-pro --layers 9 --dim 64 --heads 32 --mlp-hidden 64 --seq-len 128 --batch 1 "
            "--steps 3 --eval-every 2 --val '' --sample-tokens 0 --acp 1 --out %s", out);
    snprintf(path, sizeof(path), "%s/log.jsonl", out);
    log = fox_read_file(path, &len);
    int with[4] = {0};
    for (char *line = log; line && *line;) {
        char *nl = strchr(line, '\n'), *st_at = strstr(line, "{\"step\": ");
        if (nl) *nl = 0;
        int step = st_at ? atoi(st_at + 9) : 0;
        if (step >= 1 && step <= 3 && strstr(line, "\"loss\"")) with[step] = strstr(line, "\"acp_pruned\": [[") != NULL;
        line = nl ? nl + 1 : line + strlen(line);
    }
    free(log);
    check(st == 0 && !with[1] && with[2] && with[3], "ACP per head, 9 layers x 32 heads (288 > 256): acp_pruned on the "
          "--eval-every step 2 and the last step 3, not on step 1 (%d %d %d)", with[1], with[2], with[3]);
}

static void reference_loss_check(const char *run, const char *what);

// `cmd` (6 steps, a checkpoint every 3) into run directory a, then into b resumed from a copy of a's step-3
// checkpoint and log: the 6 losses are bitwise the same, and fall.
static void check_resumed_6_steps(const char *cmd, const char *a, const char *b, const char *what) {
    char pa[4300], pb[4300];
    int st = sh("%s --out %s", cmd, a);
    st = st || sh("mkdir -p %s && cp -r %s/ckpt_00000003 %s/ && head -n 4 %s/log.jsonl > %s/log.tmp && mv %s/log.tmp %s/log.jsonl",
                  b, a, b, a, b, b, b);
    st = st || sh("%s --resume --out %s", cmd, b);
    double la[16], lb[16];
    snprintf(pa, sizeof(pa), "%s/log.jsonl", a);
    snprintf(pb, sizeof(pb), "%s/log.jsonl", b);
    int na = read_losses(pa, la, 16), nb = read_losses(pb, lb, 16), same = na == 6 && nb == 6;
    for (int i = 0; same && i < 6; i++) same = la[i] == lb[i];
    check(st == 0 && same && la[5] < la[0], "%s: 6 steps (loss %.4f to %.4f), resumed from step 3: bitwise the same losses",
          what, na ? la[0] : NAN, na ? la[na - 1] : NAN);
}

#define TINY_GSA "./train_fox_cpu --model gsa --layers 2 --dim 32 --gsa-heads 2 --gsa-slots 8 --mlp-hidden 64 " \
                 "--seq-len 32 --batch 2 --val-steps 2 --sample-tokens 0 --warmup-tokens 256 --lr 3e-3"

// Gated Slot Attention as a user runs it (docs/model.md §1.9): 6 steps resumed from step 3 give bitwise the
// same losses; its checkpoint records the architecture, so resuming it as fox-pro is a one-line error;
// --generate continues its recurrent state; --acp and --doc-mask are refused; the PyTorch reference gives
// its checkpoint the loss this process computes.
static void test_gsa(void) {
    char a[4200], b[4200], pa[4300];
    snprintf(a, sizeof(a), "%s/gsa_a", tmpdir);
    snprintf(b, sizeof(b), "%s/gsa_b", tmpdir);
    check_resumed_6_steps(TINY_GSA " --steps 6 --ckpt-every 3 --eval-every 3", a, b, "--model gsa");
    expect_error("a GSA checkpoint resumed as fox-pro", "arch", sh(TINY " --steps 6 --resume --out %s", a));
    expect_error("--model gsa --acp", "--acp", sh(TINY_GSA " --acp"));
    expect_error("--model gsa --doc-mask", "--doc-mask", sh(TINY_GSA " --doc-mask"));
    expect_error("--gsa-slots 0", "--gsa-slots", sh(TINY_GSA " --gsa-slots 0"));
    expect_error("--dim not a multiple of --gsa-heads", "gsa_heads", sh(TINY_GSA " --gsa-heads 3"));
    int st = sh("./train_fox_cpu --out %s --generate 12 --prompt 'Once upon a time' --top-k 1 --stop-at-eot off", a);
    snprintf(pa, sizeof(pa), "%s/stdout.txt", tmpdir);
    size_t len;
    char *text = fox_read_file(pa, &len);
    check(st == 0 && text && !strncmp(text, "Once upon a time", 16) && len > 17, "--generate from a GSA checkpoint "
          "continues the prompt: %.60s", text ? text : "(nothing)");
    free(text);
    reference_loss_check(a, "GSA");
}

// The PyTorch reference (train_fox.py loss --model-bin) gives the checkpoint of run directory `run` (after 6 steps)
// the loss this process computes, on 2 random windows of 32 tokens.
static void reference_loss_check(const char *run, const char *what) {
    char pa[4300], pb[4300];
    const char *py = getenv("PYTHON");
    if (!py || !*py) { check(0, "PYTHON is not set: cannot compare the %s checkpoint with the reference", what); return; }
    snprintf(pa, sizeof(pa), "%s/ckpt_00000006/model.bin", run);
    FoxConfig c = read_model_config(pa);
    Model m;
    model_init(&m, &c, 2, 32, 0);
    fox_read_model_bin(pa, &c, m.params);
    int in[64], tg[64];
    double toks[2 * 33];
    uint64_t key = fox_rng_key(4, 4);
    for (int i = 0; i < 2 * 33; i++) toks[i] = (double)fox_rng_below(key, (uint64_t)i, (uint64_t)c.vocab_size);
    for (int r = 0; r < 2; r++)
        for (int t = 0; t < 32; t++) { in[r * 32 + t] = (int)toks[r * 33 + t]; tg[r * 32 + t] = (int)toks[r * 33 + t + 1]; }
    snprintf(pb, sizeof(pb), "%s/ref_tokens.npy", tmpdir);
    fox_write_npy_f64_2d(pb, toks, 2, 33);
    double ours = model_forward(&m, in, tg, 2, 32), ref = NAN;
    model_free(&m);
    int st = sh("%s train_fox.py loss --model-bin %s --tokens %s --dtype float64", py, pa, pb);
    snprintf(pb, sizeof(pb), "%s/stdout.txt", tmpdir);
    size_t len;
    char *outp = fox_read_file(pb, &len);
    if (outp && strstr(outp, "loss ")) ref = strtod(strstr(outp, "loss ") + 5, NULL);
    free(outp);
    check(st == 0 && fabs(ours - ref) <= 1e-5 * fabs(ref), "loss of a %s checkpoint: ours %.8f, reference %.8f", what, ours, ref);
}

// A model.bin written before the GSA config fields existed (version 1, 15 fields) loads with their
// defaults: --eval-only gives it the per-token losses of the same weights in today's format.
static void test_old_checkpoint(void) {
    char path[4300], old[4300];
    snprintf(path, sizeof(path), "%s/run_a/ckpt_00000006/model.bin", tmpdir);
    snprintf(old, sizeof(old), "%s/old_format.bin", tmpdir);
    size_t len;
    char *bytes = fox_read_file(path, &len);
    int32_t *h = (int32_t *)bytes;
    h[1] = 1;   // version 1: no checksum
    h[2] = 15;  // the fields up to rope_theta
    for (int i = 3 + 15; i < FOX_CKPT_HEADER_INTS; i++) h[i] = 0;
    FILE *f = fox_fopen(old, "wb");
    fox_fwrite(bytes, 1, len, f, old);
    fclose(f);
    free(bytes);
    int st = sh("./train_fox_cpu --eval-only --init %s --val data/val.bin --eval-seqs 2 --eval-seq-len 32 --out %s/old_eval", old, tmpdir);
    st = st || sh("./train_fox_cpu --eval-only --init %s --val data/val.bin --eval-seqs 2 --eval-seq-len 32 --out %s/new_eval", path, tmpdir);
    double x[32], y[32];
    snprintf(path, sizeof(path), "%s/old_eval/per_token_loss.npy", tmpdir);
    snprintf(old, sizeof(old), "%s/new_eval/per_token_loss.npy", tmpdir);
    int same = read_npy_f64(path, x, 32) == 32 && read_npy_f64(old, y, 32) == 32 && !memcmp(x, y, sizeof(x));
    check(st == 0 && same, "a version-1 model.bin of 15 config fields (before GSA's) evaluates to the same per-token losses");
}

#define TINY_FAM "./train_fox_cpu --layers 2 --dim 32 --heads 2 --mlp-hidden 64 --seq-len 32 --batch 2 --fam-memory 4 " \
                 "--val-steps 2 --sample-tokens 0 --warmup-tokens 256 --lr 3e-3"

// TransformerFAM as a user runs it (docs/model.md §1.10): fox-fam (blocks of 8, one in the window) for 6 steps
// resumed from step 3 gives bitwise the same losses; its checkpoint records the architecture, so resuming it as
// fox-pro, or a fox-pro checkpoint as fox-fam, is a one-line error; --eval-only at twice the context; --generate
// continues the memory; the PyTorch reference gives its checkpoint our loss; transformer-fam (blocks of 16, no
// window) trains; every bad FAM flag is a one-line error, exit 2.
static void test_fam(void) {
    char a[4200], b[4200], pa[4300], pb[4300];
    snprintf(a, sizeof(a), "%s/fam_a", tmpdir);
    snprintf(b, sizeof(b), "%s/fam_b", tmpdir);
    const char *fox_fam = TINY_FAM " --model fox-fam --fam-block 8 --fam-window-blocks 1 --steps 6 --ckpt-every 3 --eval-every 3";
    check_resumed_6_steps(fox_fam, a, b, "--model fox-fam");
    snprintf(pa, sizeof(pa), "%s/ckpt_00000006/model.bin", a);
    snprintf(pb, sizeof(pb), "%s/ckpt_00000006/model.bin", b);
    check(files_equal(pa, pb), "--model fox-fam: the resumed run's final weights are bitwise those of the uninterrupted run");
    expect_error("a FAM checkpoint resumed as fox-pro", "arch", sh(TINY " --steps 6 --resume --out %s", a));
    snprintf(pa, sizeof(pa), "%s/run_a", tmpdir);
    expect_error("a fox-pro checkpoint resumed as fox-fam", "arch", sh("%s --resume --out %s", fox_fam, pa));
    struct { const char *label, *needle, *flags; } bad[] = {
        {"--fam-block not dividing --seq-len", "--fam-block", "--model fox-fam --fam-block 12"},
        {"--fam-block longer than --seq-len", "longer", "--model transformer-fam --fam-block 64"},
        {"--fam-memory -1", "--fam-memory", "--model fox-fam --fam-block 8 --fam-memory -1"},
        {"--fam-window-blocks -1", "--fam-window-blocks", "--model fox-fam --fam-block 8 --fam-window-blocks -1"},
        {"--model fox-fam --acp", "--acp", "--model fox-fam --fam-block 8 --acp"},
        {"--model transformer-fam --doc-mask", "--doc-mask", "--model transformer-fam --fam-block 8 --doc-mask"},
    };
    int usage = 1;  // a bad command line exits 2
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int code = sh(TINY_FAM " %s", bad[i].flags);
        expect_error(bad[i].label, bad[i].needle, code);
        usage &= code == FOX_EXIT_USAGE;
    }
    int code = sh("./train_fox_cpu --eval-only --init %s/ckpt_00000006/model.bin --val data/val.bin --eval-seq-len 60 "
                  "--out %s/fam_eval_bad", a, tmpdir);
    expect_error("--eval-seq-len not a multiple of the block", "--eval-seq-len", code);
    check(usage && code == FOX_EXIT_USAGE, "every bad FAM flag exits %d", FOX_EXIT_USAGE);
    test_eval_only("fam_a");
    int st = sh("./train_fox_cpu --out %s --generate 20 --prompt 'Once upon a time' --top-k 1 --stop-at-eot off", a);
    snprintf(pa, sizeof(pa), "%s/stdout.txt", tmpdir);
    size_t len;
    char *text = fox_read_file(pa, &len);
    check(st == 0 && text && !strncmp(text, "Once upon a time", 16) && len > 17, "--generate from a FAM checkpoint continues "
          "the prompt past two block ends: %.60s", text ? text : "(nothing)");
    free(text);
    reference_loss_check(a, "fox-fam");
    snprintf(pa, sizeof(pa), "%s/tfam", tmpdir);
    st = sh(TINY_FAM " --model transformer-fam --fam-block 16 --fam-window-blocks 0 --steps 6 --eval-every 0 --out %s", pa);
    snprintf(pb, sizeof(pb), "%s/tfam/log.jsonl", tmpdir);
    double la[16];
    int na = read_losses(pb, la, 16);
    check(st == 0 && na == 6 && la[5] < la[0], "--model transformer-fam --fam-window-blocks 0: 6 steps, loss %.4f to %.4f",
          na ? la[0] : NAN, na ? la[na - 1] : NAN);
    reference_loss_check(pa, "transformer-fam");
    snprintf(pa, sizeof(pa), "%s/bswa", tmpdir);  // BSWA alone: the memory left out
    st = sh(TINY_FAM " --model fox-fam --fam-memory 0 --fam-block 8 --fam-window-blocks 1 --steps 6 --eval-every 0 "
            "--sample-tokens 12 --out %s", pa);
    snprintf(pb, sizeof(pb), "%s/bswa/log.jsonl", tmpdir);
    na = read_losses(pb, la, 16);
    snprintf(pb, sizeof(pb), "%s/stdout.txt", tmpdir);
    size_t n;
    char *out = fox_read_file(pb, &n);
    int said = out && strstr(out, "BSWA: blocks of 8 tokens, 1 previous blocks in the window, no memory");
    free(out);
    check(st == 0 && na == 6 && la[5] < la[0] && said,
          "--model fox-fam --fam-memory 0 (BSWA alone): 6 steps, loss %.4f to %.4f, a sample", na ? la[0] : NAN,
          na ? la[na - 1] : NAN);
    reference_loss_check(pa, "fox-fam --fam-memory 0");
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
    // The same with separators and the document mask (the reference's explicit block-diagonal mask).
    for (int i = 5; i < B * (T + 1); i += 9) toks[i] = FOX_EOT;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) { in[b * T + t] = (int)toks[b * (T + 1) + t]; tg[b * T + t] = (int)toks[b * (T + 1) + t + 1]; }
    fox_write_npy_f64_2d(npy, toks, (size_t)B, (size_t)(T + 1));
    ours.doc_sep = FOX_EOT;
    ours_loss = model_forward(&ours, in, tg, B, T);
    st = sh("%s train_fox.py loss --model-bin %s --tokens %s --dtype float64 --doc-sep %d", py, ck, npy, FOX_EOT);
    outp = fox_read_file(path, &len);
    ref = outp && strstr(outp, "loss ") ? strtod(strstr(outp, "loss ") + 5, NULL) : NAN;
    free(outp);
    check(st == 0 && fabs(ours_loss - ref) <= 1e-5 * fabs(ref), "loss of a fox.c checkpoint with --doc-sep: ours %.8f, "
          "reference %.8f", ours_loss, ref);
    model_free(&ours);
    model_free(&theirs);
}

int main(void) {
    char tmpl[] = "/tmp/fox_test_XXXXXX";
    tmpdir = mkdtemp(tmpl);
    if (!tmpdir) fox_fatal("cannot create a temporary directory");
    test_checkpoint_resume();
    test_eval_only("run_a");
    test_doc_mask();
    test_acp_heads();
    test_gsa();
    test_fam();
    test_old_checkpoint();
    test_data_parallel();
    test_bad_inputs();
    test_reference_interop();
    sh("rm -rf %s", tmpdir);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
