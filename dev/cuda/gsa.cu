// dev/cuda/gsa.cu: checks the Gated Slot Attention kernels of fox/gsa.cuh against an fp64 CPU reference of the
// recurrence (docs/model.md §1.9: S_t = α_t ⊙ S_{t−1} + (1 − α_t) ⊗ k_t, U_t alike with v, o_t = U_tᵀ softmax(S_t q_t
// /√dh); its backward through time as gsa_backward in train_fox.c), then times them at the 125M shape.
//   make gsa && ./gsa        on a GPU: every check, the element-wise kernels too, then the timings
//   ./gsa --cpu              no GPU needed: the chunk kernels' block steps run on the CPU, one thread after another
//                            (GsaEmulated, the same code with its MMA tiles as loops), with the same checks
//   ./gsa --bench            the timings alone (for a profiler)
// Inputs are fresh random numbers: Swish features of bf16 pre-activations in [−3, 3) (proj's wide part), fp32
// slot-gate logits from fast (−40) to slow (+8) gates (its logits; fox/proj.cuh), dL/do in [−1, 1); every output
// poisoned (NaN) before the launch. Errors are relative L2 norms ‖gpu − ref‖ / ‖ref‖ over each output (NaN or Inf
// fails). Tolerances: the forward rounds the states, e^b ⊙ p and P̃ to bf16 once each (2^-9 relative) before fp32
// GEMMs: o within 1e-2; the backward adds bf16 roundings of dsr, p, D1, P̃ and the state gradients: dq, dk, dv
// within 2e-2; the slot-gate logits' gradient sums terms that cancel (y − ω κ, the suffix sums of a chunk): 3e-2.
// Timing: CUDA events, the median of 21 launches after 3; TFLOP/s counts the tensor-core GEMMs the chunked kernels
// run (2 FLOPs a multiply-add, C = GSA_CHUNK, M = GSA_SLOTS, per head and chunk): forward 4·M·C·dh (chunk deltas)
// + 4·C²·dh (Q Kᵀ, P̃ V) + 4·C·M·dh (Q S0ᵀ, (e⊙p) U0); backward 12·C²·dh + 16·C·M·dh.
#include "kcheck.h"
#include "../../fox/gsa.cuh"

#include <stdlib.h>

// The CPU: each block step runs for every thread in turn (__host__ __device__ only so that the chunk bodies,
// which are, may call it; it runs on the host).
struct GsaEmulated {
    template <class F> __host__ __device__ void each(F f) const {
        for (int t = 0; t < GSA_THREADS; t++) f(t);
    }
};

struct Cfg {
    int B, T, G, m, dh;
};

// The inputs of one check: proj as its two parts, the q, k, v pre-activations (wide, (N, ldw = 3·D) bf16) and the
// slot-gate logits (N, ldl) fp32 (slot_col = ldw); the features (bf16 Swish, N + GSA_CHUNK rows, the last zero),
// dL/do alike. dproj's rows: ldp = ldw + ldl.
struct Problem {
    GsaShape sh;
    int N, D, ldw, ldl;
    std::vector<bf16> wide;
    std::vector<float> logits;
    std::vector<bf16> q, k, v, d_o;
};

// Column col of proj's row n as the kernels read it: a bf16 pre-activation (col < ldw) or an fp32 logit.
static double proj_at(const Problem &p, size_t n, int col) {
    return col < p.ldw ? bf(p.wide[n * p.ldw + col]) : p.logits[n * p.ldl + (col - p.ldw)];
}

static double swish_d(double x) { return x * sigmoid_d(x); }
static double swish_grad_d(double x) {
    double s = sigmoid_d(x);
    return s * (1.0 + x * (1.0 - s));
}

static Problem make_problem(const Cfg &c) {
    Problem p;
    const int D = c.G * c.dh, N = c.B * c.T, ldw = 3 * D, ldl = (c.G * c.m + 3) / 4 * 4;
    GsaShape s = {c.B, c.T, c.G, c.m, c.dh, 8.0f, ldw + ldl, ldw, 0, D, 2 * D};
    p.sh = s;
    p.N = N;
    p.D = D;
    p.ldw = ldw;
    p.ldl = ldl;
    p.wide = rand_bf16((size_t)N * ldw, -3, 3);
    p.logits.assign((size_t)N * ldl, 0.0f);
    std::vector<double> base((size_t)c.G * c.m);
    for (size_t i = 0; i < base.size(); i++) base[i] = i % 16 == 5 ? -40.0 : uniform(-8, 8);  // a fast slot in 16
    for (int n = 0; n < N; n++)
        for (int j = 0; j < c.G * c.m; j++) p.logits[(size_t)n * ldl + j] = (float)(base[j] + uniform(-2, 2));
    size_t rows = (size_t)N + GSA_CHUNK;
    p.q.assign(rows * D, __float2bfloat16(0.0f));
    p.k = p.q;
    p.v = p.q;
    p.d_o = p.q;
    auto feature = [&](int n, int col) {
        float x = (float)proj_at(p, n, col);
        return __float2bfloat16(x / (1.0f + expf(-x)));
    };
    for (int n = 0; n < N; n++)
        for (int d = 0; d < D; d++) {
            p.q[(size_t)n * D + d] = feature(n, s.col_q + d);
            p.k[(size_t)n * D + d] = feature(n, s.col_k + d);
            p.v[(size_t)n * D + d] = feature(n, s.col_v + d);
            p.d_o[(size_t)n * D + d] = __float2bfloat16((float)uniform(-1, 1));
        }
    return p;
}

// The reference: o (N, D), the q, k, v columns of dproj (dL/d pre-activation = dL/dfeature · Swish') and the
// slot-gate logits' gradient (N, G·m), in fp64, from the bf16 features and the pre-activations the kernels read.
struct Ref {
    std::vector<double> o, dq, dk, dv, dlogit;
};

static Ref reference(const Problem &p) {
    const GsaShape &s = p.sh;
    const int T = s.T, m = s.m, dh = s.dh, D = p.D, N = p.N;
    const double scale = 1.0 / sqrt((double)dh);
    Ref r;
    r.o.assign((size_t)N * D, 0.0);
    r.dq = r.dk = r.dv = r.o;
    r.dlogit.assign((size_t)N * s.G * m, 0.0);
    const size_t st = (size_t)m * dh;
    for (int b = 0; b < s.B; b++)
        for (int g = 0; g < s.G; g++) {
            std::vector<double> S((size_t)(T + 1) * st, 0.0), U = S, P((size_t)T * m), al((size_t)T * m);
            auto feat = [&](const std::vector<bf16> &x, int t, int d) { return bf(x[((size_t)b * T + t) * D + g * dh + d]); };
            for (int t = 0; t < T; t++) {
                const size_t n = (size_t)b * T + t;
                double *S1 = &S[(t + 1) * st], *U1 = &U[(t + 1) * st], *S0 = &S[t * st], *U0 = &U[t * st];
                std::vector<double> sc(m);
                double mx = -INFINITY, sum = 0.0;
                for (int i = 0; i < m; i++) {
                    double z = proj_at(p, n, s.slot_col + g * m + i), a = exp((fmin(z, 0.0) - log1p(exp(-fabs(z)))) / s.tau);
                    al[(size_t)t * m + i] = a;
                    double dot = 0.0;
                    for (int d = 0; d < dh; d++) {
                        S1[i * dh + d] = a * S0[i * dh + d] + (1.0 - a) * feat(p.k, t, d);
                        U1[i * dh + d] = a * U0[i * dh + d] + (1.0 - a) * feat(p.v, t, d);
                        dot += S1[i * dh + d] * feat(p.q, t, d);
                    }
                    sc[i] = dot * scale;
                    mx = fmax(mx, sc[i]);
                }
                for (int i = 0; i < m; i++) sum += exp(sc[i] - mx);
                for (int i = 0; i < m; i++) P[(size_t)t * m + i] = exp(sc[i] - mx) / sum;
                for (int d = 0; d < dh; d++) {
                    double acc = 0.0;
                    for (int i = 0; i < m; i++) acc += U1[i * dh + d] * P[(size_t)t * m + i];
                    r.o[n * D + g * dh + d] = acc;
                }
            }
            std::vector<double> dS(st, 0.0), dU(st, 0.0), dp(m), ds(m);
            for (int t = T - 1; t >= 0; t--) {
                const size_t n = (size_t)b * T + t;
                const double *S1 = &S[(t + 1) * st], *U1 = &U[(t + 1) * st], *S0 = &S[t * st], *U0 = &U[t * st];
                const double *pt = &P[(size_t)t * m];
                double pdp = 0.0;
                for (int i = 0; i < m; i++) {
                    dp[i] = 0.0;
                    for (int d = 0; d < dh; d++) {
                        double g_o = bf(p.d_o[n * D + g * dh + d]);
                        dp[i] += U1[i * dh + d] * g_o;
                        dU[i * dh + d] += pt[i] * g_o;
                    }
                    pdp += pt[i] * dp[i];
                }
                for (int i = 0; i < m; i++) ds[i] = pt[i] * (dp[i] - pdp) * scale;
                for (int d = 0; d < dh; d++) {
                    double dq = 0.0;
                    for (int i = 0; i < m; i++) {
                        dS[i * dh + d] += ds[i] * feat(p.q, t, d);
                        dq += S1[i * dh + d] * ds[i];
                    }
                    r.dq[n * D + g * dh + d] = dq * swish_grad_d(proj_at(p, n, s.col_q + g * dh + d));
                }
                std::vector<double> dk(dh, 0.0), dv(dh, 0.0);
                for (int i = 0; i < m; i++) {
                    double a = al[(size_t)t * m + i], dal = 0.0;
                    for (int d = 0; d < dh; d++) {
                        dk[d] += (1.0 - a) * dS[i * dh + d];
                        dv[d] += (1.0 - a) * dU[i * dh + d];
                        dal += dS[i * dh + d] * (S0[i * dh + d] - feat(p.k, t, d)) + dU[i * dh + d] * (U0[i * dh + d] - feat(p.v, t, d));
                        dS[i * dh + d] *= a;
                        dU[i * dh + d] *= a;
                    }
                    double z = proj_at(p, n, s.slot_col + g * m + i);
                    r.dlogit[n * s.G * m + g * m + i] = dal * a / s.tau * sigmoid_d(-z);
                }
                for (int d = 0; d < dh; d++) {
                    r.dk[n * D + g * dh + d] = dk[d] * swish_grad_d(proj_at(p, n, s.col_k + g * dh + d));
                    r.dv[n * D + g * dh + d] = dv[d] * swish_grad_d(proj_at(p, n, s.col_v + g * dh + d));
                }
            }
        }
    return r;
}

// ---------------------------------------------------------------------------------------------
// The buffers of GsaArgs, on the device or (emulated) on the host.

struct Bufs {
    size_t state, scores, rows, pairs;  // element counts
};

static Bufs sizes(const GsaShape &s) {
    Bufs z;
    size_t nc = (size_t)gsa_chunks(s.T), BG = (size_t)s.B * s.G;
    z.state = BG * nc * GSA_SLOTS * s.dh;
    z.scores = BG * s.T * GSA_SLOTS;
    z.rows = BG * s.T;
    z.pairs = BG * nc * GSA_CHUNK * GSA_CHUNK;
    return z;
}

template <class T> static T *alloc_on(bool dev, size_t n) {
    if (dev) {
        T *p = dmalloc<T>(n);
        poison(p, n);
        return p;
    }
    T *p = (T *)malloc((n ? n : 1) * sizeof(T));
    memset((void *)p, 0xFF, (n ? n : 1) * sizeof(T));
    return p;
}

template <class T> static T *copy_on(bool dev, const std::vector<T> &h) {
    if (dev) return to_device(h);
    T *p = (T *)malloc(h.size() * sizeof(T));
    memcpy((void *)p, h.data(), h.size() * sizeof(T));
    return p;
}

template <class T> static std::vector<T> fetch(bool dev, const T *p, size_t n) {
    if (dev) return to_host(p, n);
    return std::vector<T>(p, p + n);
}

static GsaArgs make_args(const Problem &p, bool dev) {
    GsaArgs a;
    memset(&a, 0, sizeof(a));
    a.sh = p.sh;
    Bufs z = sizes(p.sh);
    a.proj.wide = copy_on(dev, p.wide);
    a.proj.logits = copy_on(dev, p.logits);
    a.proj.ldw = p.ldw;
    a.proj.ldl = p.ldl;
    a.q = copy_on(dev, p.q);
    a.k = copy_on(dev, p.k);
    a.v = copy_on(dev, p.v);
    a.d_o = copy_on(dev, p.d_o);
    a.o = alloc_on<bf16>(dev, (size_t)p.N * p.D);
    a.S = alloc_on<bf16>(dev, z.state);
    a.U = alloc_on<bf16>(dev, z.state);
    a.dS = alloc_on<float>(dev, z.state);
    a.dU = alloc_on<float>(dev, z.state);
    a.decay = alloc_on<float>(dev, z.state / p.sh.dh);
    a.s = alloc_on<float>(dev, z.scores);
    a.lse = alloc_on<float>(dev, z.rows);
    a.dSs = alloc_on<bf16>(dev, z.state);
    a.dUs = alloc_on<bf16>(dev, z.state);
    a.dsr = alloc_on<float>(dev, z.scores);
    a.y = alloc_on<float>(dev, z.scores);
    a.D1 = alloc_on<bf16>(dev, z.pairs);
    a.Pt = alloc_on<bf16>(dev, z.pairs);
    a.dproj = alloc_on<bf16>(dev, (size_t)p.N * p.sh.ldp);
    return a;
}

static void free_args(GsaArgs &a, bool dev) {
    const void *bufs[] = {a.proj.wide, a.proj.logits, a.q, a.k, a.v, a.d_o, a.o, a.S, a.U, a.dS, a.dU, a.decay, a.s, a.lse,
                          a.dSs, a.dUs, a.dsr, a.y, a.D1, a.Pt, a.dproj};
    for (const void *b : bufs) {
        if (dev) FOX_CUDA_CHECK(cudaFree((void *)b));
        else free((void *)b);
    }
}

// ---------------------------------------------------------------------------------------------
// The chunk kernels emulated: every block of each step, its threads one after another.

template <class F> static void emulate_blocks(const GsaShape &s, size_t smem, F body) {
    char *buf = (char *)aligned_alloc(128, (smem + 127) / 128 * 128);
    for (int bg = 0; bg < s.B * s.G; bg++)
        for (int c = 0; c < gsa_chunks(s.T); c++) body(bg, c, buf);
    free(buf);
}

static void emulate_scan(const GsaArgs &a, int reverse) {
    const GsaShape &s = a.sh;
    for (int u = 0; u < 2; u++)
        for (size_t bg = 0; bg < (size_t)s.B * s.G; bg++)
            for (int i = 0; i < GSA_SLOTS; i++)
                for (int d = 0; d < s.dh; d++)
                    gsa_scan_element(reverse ? (u ? a.dUs : a.dSs) : (u ? a.U : a.S), NULL, u ? a.dU : a.dS, a.decay, bg,
                                     gsa_chunks(s.T), i, d, s.dh, reverse);
}

template <int DH> static void emulate(const GsaArgs &a) {
    size_t dsm, osm, b1, b3;
    gsa_delta_smem(NULL, &dsm);
    gsa_out_smem(NULL, &osm);
    gsa_bwd1_smem(NULL, &b1);
    gsa_bwd3_smem(NULL, &b3);
    emulate_blocks(a.sh, dsm, [&](int bg, int c, char *sm) { gsa_delta_chunk<DH>(a, bg, c, sm, GsaEmulated()); });
    emulate_scan(a, 0);
    emulate_blocks(a.sh, osm, [&](int bg, int c, char *sm) { gsa_output_chunk<DH>(a, bg, c, sm, GsaEmulated()); });
    emulate_blocks(a.sh, b1, [&](int bg, int c, char *sm) { gsa_bwd1_chunk<DH>(a, bg, c, sm, GsaEmulated()); });
    emulate_scan(a, 1);
    emulate_blocks(a.sh, b3, [&](int bg, int c, char *sm) { gsa_bwd3_chunk<DH>(a, bg, c, sm, GsaEmulated()); });
}

// ---------------------------------------------------------------------------------------------
// Checks

static double rel_l2(const std::vector<double> &got, const std::vector<double> &ref) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < ref.size(); i++) {
        if (!std::isfinite(got[i])) return INFINITY;
        num += (got[i] - ref[i]) * (got[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num / (den > 0.0 ? den : 1e-300));
}

static void check_rel(const char *what, const std::vector<double> &got, const std::vector<double> &ref, double tol) {
    double e = rel_l2(got, ref);
    bool ok = e <= tol;
    printf("    %-22s n %-9zu rel L2 %9.3e  (tol %.0e)  %s\n", what, ref.size(), e, tol, ok ? "ok" : "FAIL");
    if (!ok) kc_failures++;
}

static void run_check(const Cfg &c, bool dev) {
    Problem p = make_problem(c);
    printf("gsa %s %s\n", dev ? "GPU" : "emulated", fmt("B=%d T=%d G=%d m=%d dh=%d (%d chunks)", c.B, c.T, c.G, c.m, c.dh,
           gsa_chunks(c.T)).c_str());
    Ref r = reference(p);
    GsaArgs a = make_args(p, dev);
    if (dev) {
        fox_gsa_forward(a, 0);
        fox_gsa_backward(a, 0);
        FOX_CUDA_CHECK(cudaDeviceSynchronize());
    } else {
#define GSA_EMULATE(DH) emulate<DH>(a)
        GSA_DISPATCH(c.dh, GSA_EMULATE);
#undef GSA_EMULATE
    }
    const GsaShape &s = p.sh;
    std::vector<double> o = widen(fetch(dev, a.o, (size_t)p.N * p.D));
    std::vector<bf16> dproj = fetch(dev, a.dproj, (size_t)p.N * s.ldp);
    std::vector<double> dq((size_t)p.N * p.D), dk(dq.size()), dv(dq.size()), dl((size_t)p.N * s.G * s.m);
    for (int n = 0; n < p.N; n++) {
        for (int d = 0; d < p.D; d++) {
            dq[(size_t)n * p.D + d] = bf(dproj[(size_t)n * s.ldp + s.col_q + d]);
            dk[(size_t)n * p.D + d] = bf(dproj[(size_t)n * s.ldp + s.col_k + d]);
            dv[(size_t)n * p.D + d] = bf(dproj[(size_t)n * s.ldp + s.col_v + d]);
        }
        for (int j = 0; j < s.G * s.m; j++) dl[(size_t)n * s.G * s.m + j] = bf(dproj[(size_t)n * s.ldp + s.slot_col + j]);
    }
    check_rel("o", o, r.o, 1e-2);
    check_rel("dproj q", dq, r.dq, 2e-2);
    check_rel("dproj k", dk, r.dk, 2e-2);
    check_rel("dproj v", dv, r.dv, 2e-2);
    check_rel("dproj slot gates", dl, r.dlogit, 3e-2);
    free_args(a, dev);
}

// The element-wise kernels on the GPU: Swish features, the output norm and its backward (d_o and the weight's
// gradient through the column sums).
static void check_elementwise(int N, int D) {
    printf("gsa element-wise N=%d D=%d\n", N, D);
    const int ldw = 4 * D;  // proj's wide part: q, k, v and an output gate's block (unread)
    std::vector<bf16> wide = rand_bf16((size_t)N * ldw, -4, 4), o = rand_bf16((size_t)N * D, -3, 3);
    std::vector<float> w = rand_f32(D, 0.5, 1.5), dz = rand_f32((size_t)N * D, -1, 1);
    bf16 *dwide = to_device(wide);
    float *dw = to_device(w), *ddz = to_device(dz), *dgw = dmalloc<float>(D);
    float *part = dmalloc<float>((size_t)norm_blocks(N) * D), *part2 = dmalloc<float>(colsum_scratch_floats(norm_blocks(N), D));
    bf16 *dq = dmalloc<bf16>((size_t)N * D), *dk = dmalloc<bf16>((size_t)N * D), *dv = dmalloc<bf16>((size_t)N * D);
    bf16 *d_oin = to_device(o), *dz_out = dmalloc<bf16>((size_t)N * D), *dd_o = dmalloc<bf16>((size_t)N * D);
    poison(dq, (size_t)N * D);
    poison(dk, (size_t)N * D);
    poison(dv, (size_t)N * D);
    poison(dz_out, (size_t)N * D);
    poison(dd_o, (size_t)N * D);
    FOX_CUDA_CHECK(cudaMemset(dgw, 0, D * sizeof(float)));
    const Proj proj = {dwide, NULL, ldw, 0};
    fox_gsa_features(dq, dk, dv, proj, 0, D, 2 * D, N, D, 0);
    fox_gsa_output_norm(dz_out, d_oin, dw, N, D, 0);
    fox_gsa_output_norm_backward(dd_o, dgw, ddz, d_oin, dw, N, D, part, part2, 0);
    std::vector<double> rq((size_t)N * D), rk(rq.size()), rv(rq.size()), rz(rq.size()), rdo(rq.size()), rdw(D, 0.0);
    for (int n = 0; n < N; n++) {
        double ss = 0.0, gwx = 0.0;
        for (int d = 0; d < D; d++) {
            size_t i = (size_t)n * D + d;
            rq[i] = swish_d(bf(wide[(size_t)n * ldw + d]));
            rk[i] = swish_d(bf(wide[(size_t)n * ldw + D + d]));
            rv[i] = swish_d(bf(wide[(size_t)n * ldw + 2 * D + d]));
            double on = swish_d(bf(o[i]));
            ss += on * on;
            gwx += dz[i] * w[d] * on;
        }
        double rs = 1.0 / sqrt(ss / D + (double)FOX_NORM_EPS), dot = rs * gwx / D;
        for (int d = 0; d < D; d++) {
            size_t i = (size_t)n * D + d;
            double x = bf(o[i]), on = swish_d(x);
            rz[i] = on * rs * w[d];
            rdo[i] = rs * (dz[i] * w[d] - on * rs * dot) * swish_grad_d(x);
            rdw[d] += dz[i] * on * rs;
        }
    }
    check_rel("features q", widen(to_host(dq, rq.size())), rq, 4e-3);
    check_rel("features k", widen(to_host(dk, rk.size())), rk, 4e-3);
    check_rel("features v", widen(to_host(dv, rv.size())), rv, 4e-3);
    check_rel("output norm z", widen(to_host(dz_out, rz.size())), rz, 4e-3);
    check_rel("output norm d_o", widen(to_host(dd_o, rdo.size())), rdo, 4e-3);
    check_rel("output norm dw", widen(to_host(dgw, D)), rdw, 1e-4);
    const void *bufs[] = {dwide, dw, ddz, dgw, part, part2, dq, dk, dv, d_oin, dz_out, dd_o};
    for (const void *b : bufs) FOX_CUDA_CHECK(cudaFree((void *)b));
}

// ---------------------------------------------------------------------------------------------
// Timing at the 125M shape

template <int DH> static void bench(const Cfg &c) {
    Problem p = make_problem(c);
    GsaArgs a = make_args(p, true);
    size_t dsm, osm, b1, b3;
    gsa_delta_smem(NULL, &dsm);
    gsa_out_smem(NULL, &osm);
    gsa_bwd1_smem(NULL, &b1);
    gsa_bwd3_smem(NULL, &b3);
    const double C = GSA_CHUNK, M = GSA_SLOTS, dh = c.dh, units = (double)c.B * c.G * gsa_chunks(c.T);
    const double fwd_flops = units * (4 * M * C * dh + 4 * C * C * dh + 4 * C * M * dh);
    const double bwd_flops = units * (12 * C * C * dh + 16 * C * M * dh);
    printf("gsa timing B=%d T=%d G=%d m=%d dh=%d (d_model %d), shared memory: delta %zu, output %zu, bwd1 %zu, bwd3 %zu bytes\n",
           c.B, c.T, c.G, c.m, c.dh, c.G * c.dh, dsm, osm, b1, b3);
    struct Part {
        const char *name;
        double ms;
    } parts[] = {
        {"delta", time_ms([&] { gsa_launch_chunks(gsa_delta_kernel<DH>, dsm, a, 0); })},
        {"scan", time_ms([&] { gsa_scan(a, 0, 0); })},
        {"output", time_ms([&] { gsa_launch_chunks(gsa_output_kernel<DH>, osm, a, 0); })},
        {"bwd1", time_ms([&] { gsa_launch_chunks(gsa_bwd1_kernel<DH>, b1, a, 0); })},
        {"scan (reverse)", time_ms([&] { gsa_scan(a, 1, 0); })},
        {"bwd3", time_ms([&] { gsa_launch_chunks(gsa_bwd3_kernel<DH>, b3, a, 0); })},
    };
    for (const Part &x : parts) printf("    %-16s %9.1f us\n", x.name, x.ms * 1e3);
    double fwd = time_ms([&] { fox_gsa_forward(a, 0); }), bwd = time_ms([&] { fox_gsa_backward(a, 0); });
    std::vector<double> o = widen(to_host(a.o, (size_t)p.N * p.D));
    bool finite = true;
    for (double x : o) finite = finite && std::isfinite(x);
    printf("    forward  %9.1f us  %6.1f TFLOP/s (GEMM FLOPs)\n", fwd * 1e3, fwd_flops / (fwd * 1e-3) / 1e12);
    printf("    backward %9.1f us  %6.1f TFLOP/s (GEMM FLOPs)\n", bwd * 1e3, bwd_flops / (bwd * 1e-3) / 1e12);
    printf("    forward + backward %9.1f us per layer: %.2f M tokens/s; outputs finite: %s\n", (fwd + bwd) * 1e3,
           (double)c.B * c.T / ((fwd + bwd) * 1e-3) / 1e6, finite ? "yes" : "NO");
    if (!finite) kc_failures++;
    free_args(a, true);
}

int main(int argc, char **argv) {
    bool dev = !(argc > 1 && !strcmp(argv[1], "--cpu")), bench_only = argc > 1 && !strcmp(argv[1], "--bench");
    const Cfg checks[] = {
        {2, 203, 2, 64, 64},   // odd T, four chunks, the last short
        {1, 131, 4, 64, 128},  // G = 4
        {1, 257, 4, 64, 192},  // the 125M head (d_model 768, 4 heads), a last chunk of 1
        {2, 64, 2, 8, 64},     // the GPU fixtures' 8 slots, one full chunk
        {1, 77, 1, 37, 256},   // an odd number of slots
    };
    if (dev) print_device();
    for (size_t i = 0; i < sizeof(checks) / sizeof(checks[0]) && !bench_only; i++) run_check(checks[i], dev);
    if (dev && !bench_only) check_elementwise(300, 768);
    if (dev) bench<192>(Cfg{1, 16384, 4, 64, 192});
    return kc_finish("gsa");
}
