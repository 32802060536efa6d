// dev/cuda/fam.cu: checks TransformerFAM's kernels (fox/fam.cuh, docs/model.md §1.10) against an fp64 CPU
// reference on the same bf16 inputs, then times them at the paper's shape on the 125M model (T = 16384, 12 heads of
// 64, blocks of 1024, memories of 64):
// - the tokens' read of their block's memory merged into a window's o, lse (fam_token_memory_forward), and its
//   backward (dq's fp32 accumulator, the dc row and column sums, the memory's dk, dv: fam_token_memory_backward);
// - a memory update over the memory and its block (fam_update_forward / _backward: the queries' dq, the memory's and
//   the tokens' dk, dv, the dc terms), and the prompt's (no tokens, no bias);
// - a decode step's query over its memory and its window of the KV cache (fam_decode_attention), at a block's first,
//   middle and last position, with windows of 1 and 2 blocks.
//   make fam && ./fam            (./fam --no-bench: the checks alone)
#include "kcheck.h"
#include "../../fox/fam.cuh"

struct Cfg {
    int B, H, T, dh, K, M;
    bool gate;  // a forget gate (fox-fam's c), else no bias (transformer-fam)
};

static double dotd(const bf16 *a, const bf16 *b, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += bf(a[i]) * bf(b[i]);
    return s;
}

// c: per (b, h) a running sum of log f in [−0.05, 0).
static std::vector<float> rand_c(int BH, int T) {
    std::vector<float> c((size_t)BH * T);
    for (int r = 0; r < BH; r++) {
        float run = 0.0f;
        for (int t = 0; t < T; t++) c[(size_t)r * T + t] = run += (float)uniform(-0.05, 0.0);
    }
    return c;
}

static void check_tokens(const Cfg &g, Group &gf, Group &gb) {
    const int B = g.B, H = g.H, T = g.T, dh = g.dh, K = g.K, M = g.M, nb = T / K, BH = B * H;
    const double scale = 1.0 / sqrt((double)dh);
    FamDims d = {B, H, T, dh, K, M, (float)scale};
    const size_t nt = (size_t)BH * T * dh, nf = (size_t)nb * BH * M * dh;
    std::vector<bf16> q = rand_bf16(nt, -2, 2), kF = rand_bf16(nf, -2, 2), vF = rand_bf16(nf, -1, 1), ow = rand_bf16(nt, -1, 1),
                      dO = rand_bf16(nt, -1, 1);
    std::vector<float> c = g.gate ? rand_c(BH, T) : std::vector<float>(), lw = rand_f32((size_t)BH * T, -1, 2),
                       Dg = rand_f32((size_t)BH * T, -0.5, 0.5), acc0 = rand_f32(BH * fox_attn::dq_acc_rows(T) * dh, -1, 1),
                       dc0 = rand_f32((size_t)BH * T, -1, 1), cs0 = rand_f32((size_t)BH * T, -1, 1);
    // forward: the memory's softmax merged with the window's (o_w in (B, T, H, dh))
    std::vector<double> ro(nt), rl((size_t)BH * T), racc(acc0.begin(), acc0.end()), rdc(dc0.begin(), dc0.end()),
        rcs(cs0.begin(), cs0.end()), rdk(nf, 0.0), rdv(nf, 0.0), rrows((size_t)BH * T, 0.0);
    std::vector<float> lse_merged((size_t)BH * T);
    std::vector<double> s(M), p(M);
    // query i of (b, h): the decay bias of its block's memory keys, c_i − c_{τK−1} (0 without the gate)
    auto memory_bias = [&](size_t bh, int i) {
        const int tau = i / K;
        return g.gate ? (double)c[bh * T + i] - (tau ? (double)c[bh * T + (size_t)tau * K - 1] : 0.0) : 0.0;
    };
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < T; i++) {
                size_t bh = (size_t)b * H + h, row = bh * T + i, orow = (((size_t)b * T + i) * H + h) * dh;
                double bias = memory_bias(bh, i), mx = -INFINITY, sum = 0;
                const bf16 *kf = &kF[(((size_t)(i / K) * B + b) * H + h) * M * dh], *vf = &vF[kf - kF.data()];
                for (int m = 0; m < M; m++) {
                    s[m] = dotd(&q[row * dh], kf + (size_t)m * dh, dh) * scale + bias;
                    mx = std::max(mx, s[m]);
                }
                for (int m = 0; m < M; m++) sum += p[m] = exp(s[m] - mx);
                double lm = mx + log(sum), l0 = lw[row], top = std::max(l0, lm), lse = top + log(exp(l0 - top) + exp(lm - top));
                rl[row] = lse;
                lse_merged[row] = (float)lse;
                for (int e = 0; e < dh; e++) {
                    double om = 0;
                    for (int m = 0; m < M; m++) om += p[m] / sum * bf(vf[(size_t)m * dh + e]);
                    ro[orow + e] = exp(l0 - lse) * bf(ow[orow + e]) + exp(lm - lse) * om;
                }
            }
    // backward, from the merged lse (the kernel's input there is the forward's output, in fp32)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < T; i++) {
                size_t bh = (size_t)b * H + h, row = bh * T + i, orow = (((size_t)b * T + i) * H + h) * dh;
                int tau = i / K;
                double bias = memory_bias(bh, i), dsum = 0;
                size_t fo = (((size_t)tau * B + b) * H + h) * M * dh;
                for (int m = 0; m < M; m++) {
                    double pm = exp(dotd(&q[row * dh], &kF[fo + (size_t)m * dh], dh) * scale + bias - lse_merged[row]);
                    double ds = pm * (dotd(&dO[orow], &vF[fo + (size_t)m * dh], dh) - Dg[row]);
                    dsum += ds;
                    for (int e = 0; e < dh; e++) {
                        racc[bh * fox_attn::dq_acc_rows(T) * dh + fox_attn::dq_acc_offset(i, e, dh)] += ds * bf(kF[fo + (size_t)m * dh + e]);
                        rdk[fo + (size_t)m * dh + e] += scale * ds * bf(q[row * dh + e]);
                        rdv[fo + (size_t)m * dh + e] += pm * bf(dO[orow + e]);
                    }
                }
                if (g.gate) {
                    rdc[row] += dsum;
                    if (tau) rcs[bh * T + (size_t)tau * K - 1] -= dsum;
                }
            }
    bf16 *dq = to_device(q), *dkF = to_device(kF), *dvF = to_device(vF), *dob = to_device(ow), *ddO = to_device(dO);
    float *dc = g.gate ? to_device(c) : nullptr, *dl = to_device(lw), *dlm = to_device(lse_merged), *dD = to_device(Dg),
          *dacc = to_device(acc0), *ddc = to_device(dc0), *dcs = to_device(cs0), *ddk = dmalloc<float>(nf),
          *ddv = dmalloc<float>(nf), *drows = dmalloc<float>((size_t)BH * T);
    fam_token_memory_forward(dob, dl, dq, dkF, dvF, dc, d, 0);
    check_bf16(gf, "o (merged)", dob, ro);
    check_f32(gf, "lse (merged)", dl, rl, TOL_F32);
    poison(ddk, nf);
    poison(ddv, nf);
    fam_token_memory_backward(dacc, ddc, dcs, ddk, ddv, drows, dq, dkF, dvF, ddO, dlm, dD, dc, d, 0);
    check_f32(gb, "dq_acc", dacc, racc, TOL_F32_RED);
    check_f32(gb, "dF_k", ddk, rdk, TOL_F32_RED);
    check_f32(gb, "dF_v", ddv, rdv, TOL_F32_RED);
    check_f32(gb, "dc rows", ddc, rdc, TOL_F32_RED);
    check_f32(gb, "dc columns", dcs, rcs, TOL_F32_RED);
    void *bufs[] = {dq, dkF, dvF, dob, ddO, dc, dl, dlm, dD, dacc, ddc, dcs, ddk, ddv, drows};
    for (void *x : bufs) FOX_CUDA_CHECK(cudaFree(x));
}

// The update of state tau (B sequences; tokens NULL: the prompt, B = 1, no bias).
static void check_update(const Cfg &g, int tau, bool tokens, Group &gf, Group &gb) {
    const int B = g.B, H = g.H, T = g.T, dh = g.dh, K = g.K, M = g.M, BH = B * H, nk = M + (tokens ? K : 0);
    const double scale = 1.0 / sqrt((double)dh);
    FamDims d = {B, H, T, dh, K, M, (float)scale};
    const size_t nt = (size_t)BH * T * dh, nf = (size_t)BH * M * dh;
    std::vector<bf16> k = rand_bf16(nt, -2, 2), v = rand_bf16(nt, -1, 1), qF = rand_bf16(nf, -2, 2), kF = rand_bf16(nf, -2, 2),
                      vF = rand_bf16(nf, -1, 1), doF = rand_bf16(nf, -1, 1), dk0 = rand_bf16(nt, -1, 1), dv0 = rand_bf16(nt, -1, 1);
    const bool gate = g.gate && tokens;
    std::vector<float> c = gate ? rand_c(BH, T) : std::vector<float>(), dFk0 = rand_f32(nf, -1, 1), dFv0 = rand_f32(nf, -1, 1),
                       dc0 = rand_f32((size_t)BH * T, -1, 1), cs0 = rand_f32((size_t)BH * T, -1, 1);
    std::vector<double> roF(nf), rlF((size_t)BH * M), rdq(nf), rdFk(dFk0.begin(), dFk0.end()), rdFv(dFv0.begin(), dFv0.end()),
        rdk = widen(dk0), rdv = widen(dv0), rdc(dc0.begin(), dc0.end()), rcs(cs0.begin(), cs0.end());
    std::vector<bf16> oF(nf);
    std::vector<float> lseF((size_t)BH * M);
    std::vector<double> s(nk), p(nk);
    for (int pass = 0; pass < 2; pass++)  // 0: forward; 1: backward from the forward's bf16 o and fp32 lse
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++) {
                size_t bh = (size_t)b * H + h;
                const float *ch = gate ? &c[bh * T] : nullptr;
                double cq = ch ? ch[tau * K + K - 1] : 0.0, cm = ch && tau ? ch[tau * K - 1] : 0.0;
                auto key = [&](int j) { return j < M ? &kF[(bh * M + j) * dh] : &k[(bh * T + (size_t)tau * K + j - M) * dh]; };
                auto val = [&](int j) { return j < M ? &vF[(bh * M + j) * dh] : &v[(bh * T + (size_t)tau * K + j - M) * dh]; };
                for (int mq = 0; mq < M; mq++) {
                    size_t qr = bh * M + mq, orow = (((size_t)b * M + mq) * H + h) * dh;
                    double mx = -INFINITY, sum = 0;
                    for (int j = 0; j < nk; j++) {
                        s[j] = dotd(&qF[qr * dh], key(j), dh) * scale + cq - (j < M ? cm : ch ? ch[tau * K + j - M] : 0.0);
                        mx = std::max(mx, s[j]);
                    }
                    if (pass == 0) {
                        for (int j = 0; j < nk; j++) sum += p[j] = exp(s[j] - mx);
                        rlF[qr] = mx + log(sum);
                        lseF[qr] = (float)rlF[qr];
                        for (int e = 0; e < dh; e++) {
                            double o = 0;
                            for (int j = 0; j < nk; j++) o += p[j] / sum * bf(val(j)[e]);
                            roF[orow + e] = o;
                            oF[orow + e] = __float2bfloat16((float)o);
                        }
                        continue;
                    }
                    double Di = dotd(&doF[orow], &oF[orow], dh), smem = 0, sall = 0;
                    for (int j = 0; j < nk; j++) {
                        double pj = exp(s[j] - lseF[qr]), ds = pj * (dotd(&doF[orow], val(j), dh) - Di);
                        sall += ds;
                        if (j < M) smem += ds;
                        else if (ch) rcs[bh * T + (size_t)tau * K + j - M] -= ds;
                        for (int e = 0; e < dh; e++) {
                            if (j == 0) rdq[qr * dh + e] = 0;
                            rdq[qr * dh + e] += scale * ds * bf(key(j)[e]);
                            double gk = scale * ds * bf(qF[qr * dh + e]), gv = pj * bf(doF[orow + e]);
                            if (j < M) {
                                rdFk[(bh * M + j) * dh + e] += gk;
                                rdFv[(bh * M + j) * dh + e] += gv;
                            } else {
                                rdk[(bh * T + (size_t)tau * K + j - M) * dh + e] += gk;
                                rdv[(bh * T + (size_t)tau * K + j - M) * dh + e] += gv;
                            }
                        }
                    }
                    if (ch) {
                        rdc[bh * T + (size_t)tau * K + K - 1] += sall;
                        if (tau) rcs[bh * T + (size_t)tau * K - 1] -= smem;
                    }
                }
            }
    bf16 *dk_ = tokens ? to_device(k) : nullptr, *dv_ = tokens ? to_device(v) : nullptr, *dqF = to_device(qF), *dkF = to_device(kF),
         *dvF = to_device(vF), *doFo = dmalloc<bf16>(nf), *ddoF = to_device(doF), *ddq = dmalloc<bf16>(nf), *ddk = to_device(dk0),
         *ddv = to_device(dv0);
    float *dc = gate ? to_device(c) : nullptr, *dlF = dmalloc<float>((size_t)BH * M), *ddFk = to_device(dFk0),
          *ddFv = to_device(dFv0), *ddc = to_device(dc0), *dcs = to_device(cs0), *drows = dmalloc<float>((size_t)BH * M * 3);
    poison(doFo, nf);
    poison(dlF, (size_t)BH * M);
    fam_update_forward(doFo, dlF, dqF, dkF, dvF, dk_, dv_, dc, d, tau, 0);
    check_bf16(gf, "o", doFo, roF);
    check_f32(gf, "lse", dlF, rlF, TOL_F32);
    upload(doFo, oF);  // the backward reads what the reference's forward gave
    upload(dlF, lseF);
    poison(ddq, nf);
    fam_update_backward(ddq, ddFk, ddFv, tokens ? ddk : nullptr, tokens ? ddv : nullptr, ddc, dcs, drows, dqF, dkF, dvF, doFo,
                        ddoF, dlF, dk_, dv_, dc, d, tau, 0);
    check_bf16(gb, "dq", ddq, rdq);
    check_f32(gb, "dF_k", ddFk, rdFk, TOL_F32_RED);
    check_f32(gb, "dF_v", ddFv, rdFv, TOL_F32_RED);
    if (tokens) {
        check_bf16(gb, "tokens' dk (+=)", ddk, rdk);
        check_bf16(gb, "tokens' dv (+=)", ddv, rdv);
        check_f32(gb, "dc rows", ddc, rdc, TOL_F32_RED);
        check_f32(gb, "dc columns", dcs, rcs, TOL_F32_RED);
    }
    void *bufs[] = {dk_, dv_, dqF, dkF, dvF, doFo, ddoF, ddq, ddk, ddv, dc, dlF, ddFk, ddFv, ddc, dcs, drows};
    for (void *x : bufs) FOX_CUDA_CHECK(cudaFree(x));
}

// A decode step's attention (the cache holds T positions, (B, H, T, dh)) at positions t: each (b, h) query over
// the memory's M keys (bias c_t − c_{τK−1}) and the cached keys [max(0, (τ − W)K), t] (bias c_t − c_j), in double.
static void check_decode(const Cfg &g, int W, Group &gd) {
    const int B = g.B, H = g.H, T = g.T, dh = g.dh, K = g.K, M = g.M, BH = B * H;
    const double scale = 1.0 / sqrt((double)dh);
    FamDims d = {B, H, T, dh, K, M, (float)scale};
    const size_t nt = (size_t)BH * T * dh, nf = (size_t)BH * M * dh, nq = (size_t)BH * dh;
    std::vector<bf16> q = rand_bf16(nq, -2, 2), k = rand_bf16(nt, -2, 2), v = rand_bf16(nt, -1, 1), kF = rand_bf16(nf, -2, 2),
                      vF = rand_bf16(nf, -1, 1);
    std::vector<float> c = g.gate ? rand_c(BH, T) : std::vector<float>();
    bf16 *dq = to_device(q), *dk = to_device(k), *dv = to_device(v), *dkF = to_device(kF), *dvF = to_device(vF),
         *dout = dmalloc<bf16>(nq);
    float *dc = g.gate ? to_device(c) : nullptr;
    int *dpos = dmalloc<int>(1);
    const int ts[] = {K, K + K / 2, 2 * K - 1, T - 1};
    for (int t : ts) {
        int tau = t / K, lo = std::max(0, (tau - W) * K);
        std::vector<double> ro(nq);
        for (int bh = 0; bh < BH; bh++) {
            const float *ch = g.gate ? &c[(size_t)bh * T] : nullptr;
            double ct = ch ? ch[t] : 0.0, cm = ch && tau ? ch[tau * K - 1] : 0.0, mx = -INFINITY, sum = 0.0;
            std::vector<double> s;
            std::vector<const bf16 *> vals;
            for (int m = 0; m < M; m++) {
                s.push_back(dotd(&q[(size_t)bh * dh], &kF[((size_t)bh * M + m) * dh], dh) * scale + ct - cm);
                vals.push_back(&vF[((size_t)bh * M + m) * dh]);
            }
            for (int j = lo; j <= t; j++) {
                s.push_back(dotd(&q[(size_t)bh * dh], &k[((size_t)bh * T + j) * dh], dh) * scale + (ch ? ct - ch[j] : 0.0));
                vals.push_back(&v[((size_t)bh * T + j) * dh]);
            }
            for (double x : s) mx = std::max(mx, x);
            for (double &x : s) sum += x = exp(x - mx);
            for (int e = 0; e < dh; e++) {
                double o = 0.0;
                for (size_t i = 0; i < s.size(); i++) o += s[i] * bf(vals[i][e]);
                ro[(size_t)bh * dh + e] = o / sum;
            }
        }
        FOX_CUDA_CHECK(cudaMemcpy(dpos, &t, sizeof(int), cudaMemcpyHostToDevice));
        poison(dout, nq);
        fam_decode_attention(dout, dq, dk, dv, dc, dkF, dvF, d, W, dpos, 0);
        check_bf16(gd, fmt("decode o at t=%d, W=%d", t, W).c_str(), dout, ro);
    }
    void *bufs[] = {dq, dk, dv, dkF, dvF, dout, dc, dpos};
    for (void *x : bufs) FOX_CUDA_CHECK(cudaFree(x));
}

// A check's summary row (no timing at the check shapes) for run_all.sh's table.
static void check_row(const char *op, const std::string &shape, const Group &g) {
    printf("@@ fam | %s | %s | %.3f | %s | - | -\n", op, shape.c_str(), g.worst, g.ok ? "PASS" : "FAIL");
}

// A timing row: median µs, and the bytes that must move over the time.
static void time_row(const char *op, const std::string &shape, double ms, double bytes) {
    printf("@@ fam | %s | %s | - | - | %.2f | %.0f\n", op, shape.c_str(), ms * 1e3, bytes / (ms * 1e-3) / 1e9);
}

static void check(const Cfg &g) {
    std::string shape = fmt("B=%d H=%d T=%d dh=%d K=%d M=%d%s", g.B, g.H, g.T, g.dh, g.K, g.M, g.gate ? " gate" : "");
    printf("fam %s\n", shape.c_str());
    Group tf, tb, uf, ub, pf, pb, dd;
    check_tokens(g, tf, tb);
    printf("  update of block 1\n");
    check_update(g, g.T / g.K > 1 ? 1 : 0, true, uf, ub);
    printf("  prompt (B=1, no tokens, no bias)\n");
    Cfg p = g;
    p.B = 1;
    check_update(p, 0, false, pf, pb);
    printf("  decode steps\n");
    check_decode(g, 1, dd);
    check_decode(g, 2, dd);
    check_row("token memory fwd", shape, tf);
    check_row("token memory bwd", shape, tb);
    check_row("update fwd", shape, uf);
    check_row("update bwd", shape, ub);
    check_row("prompt fwd", shape, pf);
    check_row("prompt bwd", shape, pb);
    check_row("decode attention", shape, dd);
}

// Times at the 125M shape (fox-fam): the tokens' memory reads over the whole context, one memory update.
static void bench() {
    const int B = 1, H = 12, T = 16384, dh = 64, K = 1024, M = 64, nb = T / K, BH = B * H;
    FamDims d = {B, H, T, dh, K, M, 0.125f};
    const size_t nt = (size_t)BH * T * dh, nf = (size_t)nb * BH * M * dh;
    bf16 *q = to_device(rand_bf16(nt, -2, 2)), *k = to_device(rand_bf16(nt, -2, 2)), *v = to_device(rand_bf16(nt, -1, 1)),
         *kF = to_device(rand_bf16(nf, -2, 2)), *vF = to_device(rand_bf16(nf, -1, 1)), *o = to_device(rand_bf16(nt, -1, 1)),
         *dO = to_device(rand_bf16(nt, -1, 1)), *dk = to_device(rand_bf16(nt, -1, 1)), *dv = to_device(rand_bf16(nt, -1, 1)),
         *dqF = dmalloc<bf16>(nf);
    float *c = to_device(rand_c(BH, T)), *lse = to_device(rand_f32((size_t)BH * T, 4, 5)), *D = to_device(rand_f32((size_t)BH * T, -1, 1)),
          *acc = to_device(rand_f32(BH * fox_attn::dq_acc_rows(T) * dh, -1, 1)), *dc = to_device(rand_f32((size_t)BH * T, -1, 1)),
          *cs = to_device(rand_f32((size_t)BH * T, -1, 1)), *dFk = dmalloc<float>(nf), *dFv = dmalloc<float>(nf),
          *rows = dmalloc<float>((size_t)BH * T), *lseF = to_device(rand_f32((size_t)BH * M, 4, 5)),
          *rows3 = dmalloc<float>((size_t)BH * M * 3);
    std::string shape = fmt("B=%d H=%d T=%d dh=%d K=%d M=%d", B, H, T, dh, K, M);
    double ms = time_ms([&] { fam_token_memory_forward(o, lse, q, kF, vF, c, d, 0); });
    time_row("time: token memory fwd", shape, ms, 2.0 * nt * 2 + nf * 2);
    ms = time_ms([&] { fam_token_memory_backward(acc, dc, cs, dFk, dFv, rows, q, kF, vF, dO, lse, D, c, d, 0); });
    time_row("time: token memory bwd", shape, ms, 2.0 * nt * 2 + nf * 2 + nt * 8.0);
    ms = time_ms([&] { fam_update_forward(o, lseF, q, kF, vF, k, v, c, d, 1, 0); });
    time_row("time: one update fwd", shape, ms, 2.0 * BH * (M + K) * dh * 2);
    ms = time_ms([&] { fam_update_backward(dqF, dFk, dFv, dk, dv, dc, cs, rows3, q, kF, vF, o, dO, lseF, k, v, c, d, 1, 0); });
    time_row("time: one update bwd", shape, ms, 4.0 * BH * (M + K) * dh * 2);
    void *bufs[] = {q, k, v, kF, vF, o, dO, dk, dv, dqF, c, lse, D, acc, dc, cs, dFk, dFv, rows, lseF, rows3};
    for (void *x : bufs) FOX_CUDA_CHECK(cudaFree(x));
}

int main(int argc, char **argv) {
    print_device();
    const Cfg cfgs[] = {
        {2, 3, 512, 64, 128, 40, true},    // fox-fam, two chunks of memory keys, the last one partial
        {2, 2, 768, 128, 256, 5, true},    // head dim 128, a memory of 5
        {1, 2, 2048, 64, 1024, 64, false},  // transformer-fam at the paper's block and memory
    };
    for (const Cfg &g : cfgs) check(g);
    if (!(argc > 1 && !strcmp(argv[1], "--no-bench"))) bench();
    return kc_finish("fam");
}
