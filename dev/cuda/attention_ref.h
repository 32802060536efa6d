// dev/cuda/attention_ref.h: what the attention check-and-bench programs share (attention.cu: the public
// API; attention_forward.cu, attention_backward.cu: the numbered kernel versions): random inputs, the
// fp64 CPU reference of Forgetting Attention forward and backward (with the ACP pruning the kernels
// apply), the checks against it (poisoned outputs and scratch, bitwise repeats) and the timing loops.
#ifndef FOX_ATTENTION_REF_H
#define FOX_ATTENTION_REF_H

#include "../../fox/attention.cuh"  // the public API (forward, backward, scratch size), FOX_CUDA_CHECK
#include "held.h"  // wall_s, held_ms (FOX_BENCH_SUSTAIN)

#include <math.h>
#include <stdint.h>
#include <stdlib.h>  // strtol, getenv, atof
#include <string.h>

#include <algorithm>
#include <vector>

typedef void (*FwdFn)(const bf16 *q, const bf16 *k, const bf16 *v, const float *c, bf16 *o, float *lse, int B, int H,
                      int T, const int *kv_first, cudaStream_t s);
typedef void (*BwdFn)(const bf16 *q, const bf16 *k, const bf16 *v, const float *c, const bf16 *o, const float *lse,
                      const bf16 *dout, float *dc, float *dlogf, bf16 *dq, bf16 *dk, bf16 *dv, void *scratch, int B,
                      int H, int T, const int *q_last, cudaStream_t s);

// The public API in those shapes.
template <int DH>
static void api_forward(const bf16 *q, const bf16 *k, const bf16 *v, const float *c, bf16 *o, float *lse, int B, int H,
                        int T, const int *kv_first, cudaStream_t s) {
    fox_attention_forward(q, k, v, c, o, lse, B, H, T, DH, kv_first, s);
}
template <int DH, int DET>
static void api_backward(const bf16 *q, const bf16 *k, const bf16 *v, const float *c, const bf16 *o, const float *lse,
                         const bf16 *dout, float *dc, float *dlogf, bf16 *dq, bf16 *dk, bf16 *dv, void *scratch, int B,
                         int H, int T, const int *q_last, cudaStream_t s) {
    fox_attention_backward(q, k, v, c, o, lse, dout, dc, dlogf, dq, dk, dv, scratch, B, H, T, DH, q_last, DET, s);
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double rand_uniform() {  // xorshift64*, in [0, 1)
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 0x2545F4914F6CDD1Dull) >> 11) * (1.0 / 9007199254740992.0);
}
static double rand_normal() {
    const double u = rand_uniform() + 1e-300, w = rand_uniform();
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * w);
}

// bf16 values as the GPU sees them, with their exact doubles for the reference.
static void fill_bf16(std::vector<bf16> &h, std::vector<double> &d, size_t n) {
    h.resize(n);
    d.resize(n);
    for (size_t i = 0; i < n; i++) {
        h[i] = __float2bfloat16((float)rand_normal());
        d[i] = (double)__bfloat162float(h[i]);
    }
}

template <typename T> static T *to_device(const std::vector<T> &h) {
    T *p;
    FOX_CUDA_CHECK(cudaMalloc(&p, h.size() * sizeof(T)));
    FOX_CUDA_CHECK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return p;
}
template <typename T> static std::vector<T> to_host(const T *p, size_t n) {
    std::vector<T> h(n);
    FOX_CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}

struct Shape {
    int B, H, T, dh;
    double logf_lo;  // log f ~ U[logf_lo, 0]
    bool acp;        // prune with a synthetic staircase
};

// The check shapes: odd T, T = 1, both head sizes, weak and strong forgetting, ACP staircases.
static const Shape check_shapes[] = {
    {1, 2, 1, 64, -0.5, false},    {2, 2, 63, 64, -0.5, false},   {1, 3, 257, 64, -0.5, false},
    {1, 2, 1000, 64, -0.5, false}, {1, 2, 1000, 64, -0.01, false}, {1, 2, 1, 128, -0.5, false},
    {2, 2, 63, 128, -0.5, false},  {1, 3, 257, 128, -0.5, false}, {1, 2, 1000, 128, -0.5, false},
    {1, 2, 1000, 128, -0.01, false}, {1, 2, 1000, 64, -0.01, true}, {1, 2, 1000, 128, -0.01, true},
    {2, 2, 2000, 64, -0.05, true},  {1, 2, 1800, 128, -0.01, false},
};

// Synthetic ACP staircase: query block m keeps key blocks >= m - 2 (monotone, diagonal always live).
static void acp_tables(int BH, int nblk, std::vector<int> &kv_first, std::vector<int> &q_last) {
    kv_first.resize((size_t)BH * nblk);
    q_last.resize((size_t)BH * nblk);
    for (int bh = 0; bh < BH; bh++)
        for (int m = 0; m < nblk; m++) {
            kv_first[(size_t)bh * nblk + m] = std::max(0, m - 2);
            q_last[(size_t)bh * nblk + m] = std::min(nblk - 1, m + 2);
        }
}

struct Reference {
    std::vector<double> o, lse, dq, dk, dv, dc, dlogf;
};

// fp64 reference of forward and backward for one shape (train_fox.c's attention_forward and
// attention_backward in double); o and dO in (B, T, H, dh), the rest (B, H, T, ...).
static Reference reference(const Shape &s, const std::vector<double> &q, const std::vector<double> &k,
                           const std::vector<double> &v, const std::vector<double> &c, const std::vector<double> &dout,
                           const std::vector<int> &kv_first) {
    const int B = s.B, H = s.H, T = s.T, dh = s.dh, nblk = (T + FOX_ACP_BLOCK - 1) / FOX_ACP_BLOCK;
    const double scale = 1.0 / sqrt((double)dh);
    Reference r;
    r.o.assign((size_t)B * T * H * dh, 0.0);
    r.lse.assign((size_t)B * H * T, 0.0);
    r.dq.assign((size_t)B * H * T * dh, 0.0);
    r.dk = r.dq;
    r.dv = r.dq;
    r.dc.assign((size_t)B * H * T, 0.0);
    r.dlogf = r.dc;
    std::vector<double> P(T), dS(T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const size_t bh = (size_t)b * H + h;
            const double *qh = &q[bh * T * dh], *kh = &k[bh * T * dh], *vh = &v[bh * T * dh], *ch = &c[bh * T];
            for (int i = 0; i < T; i++) {
                const int j_lo = kv_first.empty() ? 0 : kv_first[bh * nblk + i / FOX_ACP_BLOCK] * FOX_ACP_BLOCK;
                double mx = -INFINITY;
                for (int j = j_lo; j <= i; j++) {
                    double dot = 0;
                    for (int d = 0; d < dh; d++) dot += qh[(size_t)i * dh + d] * kh[(size_t)j * dh + d];
                    P[j] = dot * scale + ch[i] - ch[j];
                    mx = std::max(mx, P[j]);
                }
                double sum = 0;
                for (int j = j_lo; j <= i; j++) sum += (P[j] = exp(P[j] - mx));
                r.lse[bh * T + i] = mx + log(sum);
                double *oi = &r.o[(((size_t)b * T + i) * H + h) * dh];
                const double *doi = &dout[(((size_t)b * T + i) * H + h) * dh];
                for (int j = j_lo; j <= i; j++) {
                    P[j] /= sum;
                    for (int d = 0; d < dh; d++) oi[d] += P[j] * vh[(size_t)j * dh + d];
                }
                double Di = 0;
                for (int d = 0; d < dh; d++) Di += doi[d] * oi[d];
                for (int j = j_lo; j <= i; j++) {
                    double dp = 0;
                    for (int d = 0; d < dh; d++) dp += doi[d] * vh[(size_t)j * dh + d];
                    dS[j] = P[j] * (dp - Di);
                    r.dc[bh * T + i] += dS[j];
                    r.dc[bh * T + j] -= dS[j];
                    for (int d = 0; d < dh; d++) {
                        r.dq[(bh * T + i) * dh + d] += scale * dS[j] * kh[(size_t)j * dh + d];
                        r.dk[(bh * T + j) * dh + d] += scale * dS[j] * qh[(size_t)i * dh + d];
                        r.dv[(bh * T + j) * dh + d] += P[j] * doi[d];
                    }
                }
            }
            double run = 0;
            for (int t = T - 1; t >= 0; t--) r.dlogf[bh * T + t] = (run += r.dc[bh * T + t]);
        }
    return r;
}

// Max abs error, normalised by the largest reference magnitude (at least 1, as where T = 1 makes the
// exact gradients 0); PASS when under tol.
template <typename T> static double to_double(T x);
template <> double to_double(bf16 x) { return (double)__bfloat162float(x); }
template <> double to_double(float x) { return (double)x; }

template <typename T>
static bool compare(const char *name, const std::vector<T> &got, const std::vector<double> &want, double tol) {
    double max_err = 0, max_ref = 0;
    bool finite = true;
    for (size_t i = 0; i < want.size(); i++) {
        const double g = to_double(got[i]);
        if (!std::isfinite(g)) finite = false;
        max_err = std::max(max_err, fabs(g - want[i]));
        max_ref = std::max(max_ref, fabs(want[i]));
    }
    const double rel = max_err / std::max(max_ref, 1.0);
    const bool ok = finite && rel <= tol;
    printf("    %-6s max|err| %.3e  max|ref| %.3e  rel %.3e  (tol %.0e) %s\n", name, max_err, max_ref, rel, tol,
           ok ? "PASS" : "FAIL");
    return ok;
}

// The numbered-version programs: which versions to run, every one (only NULL) or those listed ("13,15,21").
static inline bool wanted(const char *only, int number) {
    if (!only) return true;
    for (const char *p = only; *p;) {
        char *end;
        const long x = strtol(p, &end, 10);
        if (end == p) return false;
        if (x == number) return true;
        p = *end == ',' ? end + 1 : end;
    }
    return false;
}

// The backward's scratch in the dev programs: the API's, whose last region is the order counters, plus a second
// counter per query tile (attention_backward.cu's 256-thread deterministic versions keep one per compute warpgroup).
static size_t dev_backward_scratch_bytes(int B, int H, int T, int dh) {
    return fox_attention_backward_scratch_bytes(B, H, T, dh) + fox_attn::bwd_sem_count(B, H, T) * sizeof(int);
}

// One shape's inputs (host and device), output buffers, and its reference.
struct Problem {
    Shape s;
    size_t nqkv, nvec, scratch_bytes;
    bf16 *q, *k, *v, *dout, *o, *gq, *gk, *gv;
    float *c, *lse, *dc, *dlogf;
    int *kv_first, *q_last;  // NULL without ACP
    void *scratch;
    Reference r;
};

static Problem make_problem(const Shape &s) {
    Problem p;
    p.s = s;
    const int BH = s.B * s.H, T = s.T, nblk = (T + FOX_ACP_BLOCK - 1) / FOX_ACP_BLOCK;
    p.nqkv = (size_t)BH * T * s.dh;
    p.nvec = (size_t)BH * T;
    std::vector<bf16> hq, hk, hv, hdo;
    std::vector<double> q, k, v, dout;
    fill_bf16(hq, q, p.nqkv);
    fill_bf16(hk, k, p.nqkv);
    fill_bf16(hv, v, p.nqkv);
    fill_bf16(hdo, dout, p.nqkv);
    std::vector<float> hc(p.nvec);
    std::vector<double> c(p.nvec);
    for (int bh = 0; bh < BH; bh++) {
        float run = 0.f;  // fp32 cumsum, as the trainer forms c
        for (int t = 0; t < T; t++) {
            run += (float)(s.logf_lo * rand_uniform());
            hc[(size_t)bh * T + t] = run;
            c[(size_t)bh * T + t] = run;
        }
    }
    std::vector<int> kv_first, q_last;
    if (s.acp) acp_tables(BH, nblk, kv_first, q_last);
    p.q = to_device(hq), p.k = to_device(hk), p.v = to_device(hv), p.dout = to_device(hdo);
    p.c = to_device(hc);
    p.kv_first = s.acp ? to_device(kv_first) : nullptr;
    p.q_last = s.acp ? to_device(q_last) : nullptr;
    FOX_CUDA_CHECK(cudaMalloc(&p.o, p.nqkv * sizeof(bf16)));
    FOX_CUDA_CHECK(cudaMalloc(&p.gq, p.nqkv * sizeof(bf16)));
    FOX_CUDA_CHECK(cudaMalloc(&p.gk, p.nqkv * sizeof(bf16)));
    FOX_CUDA_CHECK(cudaMalloc(&p.gv, p.nqkv * sizeof(bf16)));
    FOX_CUDA_CHECK(cudaMalloc(&p.lse, p.nvec * sizeof(float)));
    FOX_CUDA_CHECK(cudaMalloc(&p.dc, p.nvec * sizeof(float)));
    FOX_CUDA_CHECK(cudaMalloc(&p.dlogf, p.nvec * sizeof(float)));
    p.scratch_bytes = dev_backward_scratch_bytes(s.B, s.H, T, s.dh);
    FOX_CUDA_CHECK(cudaMalloc(&p.scratch, p.scratch_bytes));
    p.r = reference(s, q, k, v, c, dout, kv_first);
    return p;
}

static void free_problem(Problem &p) {
    bf16 *bufs[] = {p.q, p.k, p.v, p.dout, p.o, p.gq, p.gk, p.gv};
    for (bf16 *x : bufs) FOX_CUDA_CHECK(cudaFree(x));
    float *fbufs[] = {p.c, p.lse, p.dc, p.dlogf};
    for (float *x : fbufs) FOX_CUDA_CHECK(cudaFree(x));
    FOX_CUDA_CHECK(cudaFree(p.kv_first));
    FOX_CUDA_CHECK(cudaFree(p.q_last));
    FOX_CUDA_CHECK(cudaFree(p.scratch));
}

static void print_shape(const Shape &s) {
    printf("B=%d H=%d T=%d dh=%d log f in [%.2f, 0]%s\n", s.B, s.H, s.T, s.dh, s.logf_lo, s.acp ? ", ACP staircase" : "");
}

// Runs a forward twice into poisoned o and lse (every element must be written: NaN fails the comparison),
// requires the two runs to agree bit for bit (a moving result is a race) and checks o and lse.
static bool check_forward(Problem &p, FwdFn fn, const char *name) {
    const Shape &s = p.s;
    printf("  forward %s\n", name);
    FOX_CUDA_CHECK(cudaMemset(p.o, 0xff, p.nqkv * sizeof(bf16)));
    FOX_CUDA_CHECK(cudaMemset(p.lse, 0xff, p.nvec * sizeof(float)));
    fn(p.q, p.k, p.v, p.c, p.o, p.lse, s.B, s.H, s.T, p.kv_first, 0);
    FOX_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<bf16> ho = to_host(p.o, p.nqkv);
    const std::vector<float> hlse = to_host(p.lse, p.nvec);
    fn(p.q, p.k, p.v, p.c, p.o, p.lse, s.B, s.H, s.T, p.kv_first, 0);
    FOX_CUDA_CHECK(cudaDeviceSynchronize());
    const bool repeat_ok = memcmp(to_host(p.o, p.nqkv).data(), ho.data(), p.nqkv * sizeof(bf16)) == 0 &&
                           memcmp(to_host(p.lse, p.nvec).data(), hlse.data(), p.nvec * sizeof(float)) == 0;
    printf("    forward repeat bitwise identical: %s\n", repeat_ok ? "PASS" : "FAIL");
    bool ok = repeat_ok;
    ok &= compare("o", ho, p.r.o, 1e-2);
    ok &= compare("lse", hlse, p.r.lse, 1e-4);
    return ok;
}

// Runs a backward twice (on the o and lse the last forward left) into poisoned outputs, the scratch
// poisoned the first time and zeroed the second, and checks every output. Deterministic versions must
// repeat bit for bit; for the others (nondet) the repeat is reported, not required.
static bool check_backward(Problem &p, BwdFn fn, const char *name, bool nondet) {
    const Shape &s = p.s;
    const size_t nqkv = p.nqkv, nvec = p.nvec;
    printf("  backward %s\n", name);
    std::vector<bf16> hgq, hgk, hgv;
    std::vector<float> hdc, hdlogf;
    bool same = true;
    for (int rep = 0; rep < 2; rep++) {
        FOX_CUDA_CHECK(cudaMemset(p.gq, 0xff, nqkv * sizeof(bf16)));
        FOX_CUDA_CHECK(cudaMemset(p.gk, 0xff, nqkv * sizeof(bf16)));
        FOX_CUDA_CHECK(cudaMemset(p.gv, 0xff, nqkv * sizeof(bf16)));
        FOX_CUDA_CHECK(cudaMemset(p.dc, 0xff, nvec * sizeof(float)));
        FOX_CUDA_CHECK(cudaMemset(p.dlogf, 0xff, nvec * sizeof(float)));
        FOX_CUDA_CHECK(cudaMemset(p.scratch, rep ? 0x00 : 0xff, p.scratch_bytes));
        fn(p.q, p.k, p.v, p.c, p.o, p.lse, p.dout, p.dc, p.dlogf, p.gq, p.gk, p.gv, p.scratch, s.B, s.H, s.T, p.q_last, 0);
        FOX_CUDA_CHECK(cudaDeviceSynchronize());
        if (rep == 0) {
            hgq = to_host(p.gq, nqkv), hgk = to_host(p.gk, nqkv), hgv = to_host(p.gv, nqkv);
            hdc = to_host(p.dc, nvec), hdlogf = to_host(p.dlogf, nvec);
        } else {
            same &= memcmp(to_host(p.gq, nqkv).data(), hgq.data(), nqkv * sizeof(bf16)) == 0;
            same &= memcmp(to_host(p.gk, nqkv).data(), hgk.data(), nqkv * sizeof(bf16)) == 0;
            same &= memcmp(to_host(p.gv, nqkv).data(), hgv.data(), nqkv * sizeof(bf16)) == 0;
            same &= memcmp(to_host(p.dc, nvec).data(), hdc.data(), nvec * sizeof(float)) == 0;
            same &= memcmp(to_host(p.dlogf, nvec).data(), hdlogf.data(), nvec * sizeof(float)) == 0;
        }
    }
    bool ok = true;
    if (nondet) {
        printf("    backward repeat bitwise identical: %s (not required: nondeterministic)\n", same ? "yes" : "no");
    } else {
        printf("    backward repeat bitwise identical: %s\n", same ? "PASS" : "FAIL");
        ok &= same;
    }
    ok &= compare("dq", hgq, p.r.dq, 1e-2);
    ok &= compare("dk", hgk, p.r.dk, 1e-2);
    ok &= compare("dv", hgv, p.r.dv, 1e-2);
    ok &= compare("dc", hdc, p.r.dc, 1e-2);
    ok &= compare("dlogf", hdlogf, p.r.dlogf, 1e-2);
    return ok;
}

// ---------------------------------------------------------------------------------------------
// Timing: effective TFLOP/s with causal forward = 2 B H T^2 dh and backward = 2.5x that (docs/model.md §6).

static float median(std::vector<float> x) {
    std::sort(x.begin(), x.end());
    return x[x.size() / 2];
}

static float mean(const std::vector<float> &x) {
    double s = 0;
    for (float v : x) s += v;
    return (float)(s / x.size());
}

// FOX_BENCH_SUSTAIN=S (seconds) in the environment: the timings below hold the work back to back for S seconds
// after half a second of warm-up and give the mean, the rate once the power cap binds (dev/perf_history/2026-11-27.md "The attention
// kernels under sustained load, at the power cap"); 0 when unset: medians of short bursts.
static double bench_sustain_s() {
    const char *s = getenv("FOX_BENCH_SUSTAIN");
    return s ? atof(s) : 0.0;
}

// Median of 20 timed runs of f (after 3 warm-up), in ms, by CUDA events around each; with FOX_BENCH_SUSTAIN, the
// mean of f run back to back for that long.
template <class F> static float median_ms(F f) {
    if (const double hold = bench_sustain_s(); hold > 0) return (float)held_ms(f, hold);
    cudaEvent_t e0, e1;
    FOX_CUDA_CHECK(cudaEventCreate(&e0));
    FOX_CUDA_CHECK(cudaEventCreate(&e1));
    std::vector<float> t;
    for (int rep = 0; rep < 23; rep++) {
        FOX_CUDA_CHECK(cudaEventRecord(e0));
        f();
        FOX_CUDA_CHECK(cudaEventRecord(e1));
        FOX_CUDA_CHECK(cudaEventSynchronize(e1));
        float ms;
        FOX_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        if (rep >= 3) t.push_back(ms);
    }
    FOX_CUDA_CHECK(cudaEventDestroy(e0));
    FOX_CUDA_CHECK(cudaEventDestroy(e1));
    return median(t);
}

// Bench-size inputs (no reference): random q = k = v = dO, log f ~ U[-0.5, 0], no ACP.
struct BenchInputs {
    int B, H, T, dh;
    size_t nqkv, nvec;
    bf16 *q, *k, *v, *dout, *o, *gq, *gk, *gv;
    float *c, *lse, *dc, *dlogf;
    void *scratch;
};

static BenchInputs make_bench_inputs(int B, int H, int T, int dh) {
    BenchInputs b = {B, H, T, dh, (size_t)B * H * T * dh, (size_t)B * H * T};
    std::vector<bf16> hx;
    std::vector<double> unused;
    fill_bf16(hx, unused, b.nqkv);
    std::vector<float> hc(b.nvec);
    for (int bh = 0; bh < B * H; bh++) {
        float run = 0.f;
        for (int t = 0; t < T; t++) hc[(size_t)bh * T + t] = (run += (float)(-0.5 * rand_uniform()));
    }
    b.q = to_device(hx), b.k = to_device(hx), b.v = to_device(hx), b.dout = to_device(hx);
    b.c = to_device(hc);
    FOX_CUDA_CHECK(cudaMalloc(&b.o, b.nqkv * sizeof(bf16)));
    FOX_CUDA_CHECK(cudaMalloc(&b.gq, b.nqkv * sizeof(bf16)));
    FOX_CUDA_CHECK(cudaMalloc(&b.gk, b.nqkv * sizeof(bf16)));
    FOX_CUDA_CHECK(cudaMalloc(&b.gv, b.nqkv * sizeof(bf16)));
    FOX_CUDA_CHECK(cudaMalloc(&b.lse, b.nvec * sizeof(float)));
    FOX_CUDA_CHECK(cudaMalloc(&b.dc, b.nvec * sizeof(float)));
    FOX_CUDA_CHECK(cudaMalloc(&b.dlogf, b.nvec * sizeof(float)));
    FOX_CUDA_CHECK(cudaMalloc(&b.scratch, dev_backward_scratch_bytes(B, H, T, dh)));
    return b;
}

static void free_bench_inputs(BenchInputs &b) {
    bf16 *bufs[] = {b.q, b.k, b.v, b.dout, b.o, b.gq, b.gk, b.gv};
    for (bf16 *x : bufs) FOX_CUDA_CHECK(cudaFree(x));
    float *fbufs[] = {b.c, b.lse, b.dc, b.dlogf};
    for (float *x : fbufs) FOX_CUDA_CHECK(cudaFree(x));
    FOX_CUDA_CHECK(cudaFree(b.scratch));
}

static void bench_header(const BenchInputs &b) { printf("T=%5d dh=%3d B=%d H=%2d | ", b.T, b.dh, b.B, b.H); }

// Median over 20 runs (after 3 warm-up runs) of a forward, in ms and TFLOP/s.
static void bench_forward(BenchInputs &b, FwdFn fn, const char *name) {
    const float mf = median_ms([&] { fn(b.q, b.k, b.v, b.c, b.o, b.lse, b.B, b.H, b.T, nullptr, 0); });
    const double flops_fwd = 2.0 * b.B * b.H * (double)b.T * b.T * b.dh;
    bench_header(b);
    printf("fwd %7.3f ms %6.1f TFLOP/s | forward %s\n", mf, flops_fwd / mf * 1e-9, name);
}

// The API forward then the given backward, 20 timed runs (after 3 warm-up runs), medians of each and of
// their sum; then two more backward runs must agree bit for bit with the last timed one (determinism at
// full size, where many key blocks meet on each query tile). Returns false only for a deterministic
// version that did not repeat.
static bool bench_backward(BenchInputs &b, BwdFn fn, const char *name, bool nondet) {
    const size_t nqkv = b.nqkv, nvec = b.nvec;
    cudaEvent_t e0, e1, e2;
    FOX_CUDA_CHECK(cudaEventCreate(&e0));
    FOX_CUDA_CHECK(cudaEventCreate(&e1));
    FOX_CUDA_CHECK(cudaEventCreate(&e2));
    std::vector<float> tf, tb, tfb;
    const double hold = bench_sustain_s(), t0 = wall_s();  // FOX_BENCH_SUSTAIN: as median_ms, the means
    for (int rep = 0; hold > 0 ? wall_s() - t0 < 0.5 + hold : rep < 23; rep++) {
        FOX_CUDA_CHECK(cudaEventRecord(e0));
        fox_attention_forward(b.q, b.k, b.v, b.c, b.o, b.lse, b.B, b.H, b.T, b.dh, nullptr, 0);
        FOX_CUDA_CHECK(cudaEventRecord(e1));
        fn(b.q, b.k, b.v, b.c, b.o, b.lse, b.dout, b.dc, b.dlogf, b.gq, b.gk, b.gv, b.scratch, b.B, b.H, b.T, nullptr, 0);
        FOX_CUDA_CHECK(cudaEventRecord(e2));
        FOX_CUDA_CHECK(cudaEventSynchronize(e2));
        float f, bw;
        FOX_CUDA_CHECK(cudaEventElapsedTime(&f, e0, e1));
        FOX_CUDA_CHECK(cudaEventElapsedTime(&bw, e1, e2));
        if (hold > 0 ? wall_s() - t0 < 0.5 : rep < 3) continue;  // warm-up
        tf.push_back(f);
        tb.push_back(bw);
        tfb.push_back(f + bw);
    }
    std::vector<bf16> q1 = to_host(b.gq, nqkv), k1 = to_host(b.gk, nqkv);
    std::vector<float> c1 = to_host(b.dc, nvec), l1 = to_host(b.dlogf, nvec);
    bool same = true;
    for (int rep = 0; rep < 2; rep++) {
        fn(b.q, b.k, b.v, b.c, b.o, b.lse, b.dout, b.dc, b.dlogf, b.gq, b.gk, b.gv, b.scratch, b.B, b.H, b.T, nullptr, 0);
        FOX_CUDA_CHECK(cudaDeviceSynchronize());
        same &= memcmp(to_host(b.gq, nqkv).data(), q1.data(), nqkv * sizeof(bf16)) == 0;
        same &= memcmp(to_host(b.gk, nqkv).data(), k1.data(), nqkv * sizeof(bf16)) == 0;
        same &= memcmp(to_host(b.dc, nvec).data(), c1.data(), nvec * sizeof(float)) == 0;
        same &= memcmp(to_host(b.dlogf, nvec).data(), l1.data(), nvec * sizeof(float)) == 0;
    }
    const double flops_fwd = 2.0 * b.B * b.H * (double)b.T * b.T * b.dh;
    const float mf = hold > 0 ? mean(tf) : median(tf), mb = hold > 0 ? mean(tb) : median(tb),
                mfb = hold > 0 ? mean(tfb) : median(tfb);
    bench_header(b);
    printf("fwd %7.3f ms %6.1f TFLOP/s | bwd %7.3f ms %6.1f TFLOP/s | fwd+bwd %7.3f ms %6.1f TFLOP/s | bwd bitwise "
           "repeat %s | %s\n",
           mf, flops_fwd / mf * 1e-9, mb, 2.5 * flops_fwd / mb * 1e-9, mfb, 3.5 * flops_fwd / mfb * 1e-9,
           same ? "PASS" : nondet ? "no (nondet)" : "FAIL", name);
    FOX_CUDA_CHECK(cudaEventDestroy(e0));
    FOX_CUDA_CHECK(cudaEventDestroy(e1));
    FOX_CUDA_CHECK(cudaEventDestroy(e2));
    return same || nondet;
}

// The bench shapes: B*T = 32k tokens (16 heads of 64 or 8 of 128) at T 4096 and 16384, and the attention
// of the fox-pro 125M and 760M training steps (train_fox, batch 1 x 16384: 12 and 24 heads of 64).
struct BenchShape {
    int B, H, T, dh;
};
static const BenchShape bench_shapes[] = {
    {8, 16, 4096, 64}, {8, 8, 4096, 128}, {2, 16, 16384, 64}, {2, 8, 16384, 128}, {1, 12, 16384, 64}, {1, 24, 16384, 64},
};

#endif  // FOX_ATTENTION_REF_H
