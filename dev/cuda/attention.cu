// dev/cuda/attention.cu: checks fox/attention.cuh (Forgetting Attention forward and backward) against a
// CPU fp64 reference at several shapes, with and without ACP pruning, then times it.
//   make attention && ./attention   (./attention check | ./attention bench for one half; ./attention all NAME:
//   only the variants whose name contains NAME, and the API)
#include "../../fox/attention.cuh"

#include <algorithm>
#include <string.h>
#include <vector>

typedef __nv_bfloat16 bf16;

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

// Backward variants: the public API's choice first ("api": wgmma + sync-warp order + pipelined MMAs
// (BWD_SYNC_WG_PIPE) at dh 64 on Hopper, else mma.sync + staggered warp order), then others that are
// checked and timed beside it.
typedef void (*BwdFn)(const bf16 *, const bf16 *, const bf16 *, const float *, const bf16 *, const float *,
                      const bf16 *, float *, float *, bf16 *, bf16 *, bf16 *, void *, int, int, int, const int *,
                      cudaStream_t);
// The public API with fox_attention_set_deterministic(0) (arrival-order atomics), then the default again.
template <int DH>
static void api_nondeterministic(const bf16 *q, const bf16 *k, const bf16 *v, const float *c, const bf16 *o,
                                 const float *lse, const bf16 *dout, float *dc, float *dlogf, bf16 *dq, bf16 *dk,
                                 bf16 *dv, void *scratch, int B, int H, int T, const int *q_last, cudaStream_t s) {
    fox_attention_set_deterministic(0);
    fox_attention_backward(q, k, v, c, o, lse, dout, dc, dlogf, dq, dk, dv, scratch, B, H, T, DH, q_last, s);
    fox_attention_set_deterministic(1);
}
// `./attention MODE NAME`: only the variants whose name contains NAME (and "api"); NULL: all.
static const char *only_variants = nullptr;
static bool selected(const char *name) { return !only_variants || !strcmp(name, "api") || strstr(name, only_variants); }
struct Variant {
    const char *name;
    int dh;
    BwdFn fn;          // NULL: the public API fox_attention_backward
    bool nondet;       // not deterministic (an experiment's control, or the API's opt-out): accuracy
                       // checked, bitwise repeat reported but not required
    bool wg = false;   // needs the warpgroup path (skipped where fox_attn::use_wgmma() is false)
};
static const Variant variants[] = {
    {"api", 64, nullptr, false},
    {"api, fox_attention_set_deterministic(0)", 64, api_nondeterministic<64>, true},
    {"wgmma, BWD_SYNC_WG_PIPE's order, MMAs not pipelined (BWD_SYNC_WG, the previous default)", 64,
     fox_attn::backward_cfg<64, 64, 1, fox_attn::BWD_SYNC_WG, true>, false, true},
    {"wgmma, sync warpgroup + setmaxnreg 240/24, one barrier (BWD_SYNC_WG_FULLBAR)", 64,
     fox_attn::backward_cfg<64, 64, 1, fox_attn::BWD_SYNC_WG_FULLBAR, true>, false, true},
    {"wgmma, sync warp, 168 registers, barrier per warpgroup (BWD_SYNC_LATE_WGBAR)", 64,
     fox_attn::backward_cfg<64, 64, 1, fox_attn::BWD_SYNC_LATE_WGBAR, true>, false, true},
    {"wgmma, sync warp, dQ step last, 168 registers (BWD_SYNC_LATE)", 64,
     fox_attn::backward_cfg<64, 64, 1, fox_attn::BWD_SYNC_LATE, true>, false, true},
    {"wgmma, sync warp, dQ step first (BWD_SYNC)", 64, fox_attn::backward_cfg<64, 64, 1, fox_attn::BWD_SYNC, true>,
     false, true},
    {"wgmma, atomics, dQ step first (timing control, nondeterministic)", 64,
     fox_attn::backward_cfg<64, 64, 1, fox_attn::BWD_ATOMIC_EARLY, true>, true, true},
    {"wgmma, two sync warps (release / acquire)", 64, fox_attn::backward_cfg<64, 64, 1, fox_attn::BWD_SYNC2, true>,
     false, true},
    {"wgmma, sync warp without the waits (timing control, nondeterministic)", 64,
     fox_attn::backward_cfg<64, 64, 1, fox_attn::BWD_SYNC_NOWAIT, true>, true, true},
    {"wgmma, block-ordered (thread 0; the previous default)", 64,
     fox_attn::backward_cfg<64, 64, 1, fox_attn::BWD_BLOCK, true>, false, true},
    {"mma.sync, BM 64, block-ordered", 64, fox_attn::backward_cfg<64, 64, 1, fox_attn::BWD_BLOCK>, false},
    {"mma.sync, BM 64, warp-ordered, staggered", 64, fox_attn::backward_cfg<64, 64, 1, fox_attn::BWD_STAGGER>, false},
    {"wgmma, atomics, MMAs not pipelined (BWD_ATOMIC, nondeterministic)", 64,
     fox_attn::backward_cfg<64, 64, 1, fox_attn::BWD_ATOMIC, true>, true, true},
    {"mma.sync, BM 64, atomics (nondeterministic)", 64, fox_attn::backward_cfg<64, 64, 1, fox_attn::BWD_ATOMIC>, true},
    {"api", 128, nullptr, false},
    {"api, fox_attention_set_deterministic(0)", 128, api_nondeterministic<128>, true},
    {"mma.sync, BM 32, block-ordered", 128, fox_attn::backward_cfg<128, 32, 1, fox_attn::BWD_BLOCK>, false},
    {"mma.sync, BM 32, atomics (nondeterministic)", 128, fox_attn::backward_cfg<128, 32, 1, fox_attn::BWD_ATOMIC>, true},
};
typedef void (*FwdFn)(const bf16 *, const bf16 *, const bf16 *, const float *, bf16 *, float *, int, int, int,
                      const int *, cudaStream_t);
struct FwdVariant {
    const char *name;
    int dh;
    FwdFn fn;  // NULL: the public API fox_attention_forward
    bool wg = false;
};
static const FwdVariant fwd_variants[] = {
    {"api", 64, nullptr},
    {"mma.sync (4 warps x 2 row tiles, 2/SM)", 64, fox_attn::forward_cfg<64, false>},
    {"wgmma (8 warps, 2/SM), P V not pipelined (the previous default)", 64, fox_attn::forward_cfg<64, true>, true},
    {"api", 128, nullptr},
};
static void run_fwd(const FwdVariant &var, const bf16 *q, const bf16 *k, const bf16 *v, const float *c, bf16 *o,
                    float *lse, int B, int H, int T, int dh, const int *kv_first) {
    if (var.fn) var.fn(q, k, v, c, o, lse, B, H, T, kv_first, 0);
    else fox_attention_forward(q, k, v, c, o, lse, B, H, T, dh, kv_first, 0);
}
static void run_bwd(const Variant &var, const bf16 *q, const bf16 *k, const bf16 *v, const float *c, const bf16 *o,
                    const float *lse, const bf16 *dout, float *dc, float *dlogf, bf16 *dq, bf16 *dk, bf16 *dv,
                    void *scratch, int B, int H, int T, int dh, const int *q_last) {
    if (var.fn) var.fn(q, k, v, c, o, lse, dout, dc, dlogf, dq, dk, dv, scratch, B, H, T, q_last, 0);
    else fox_attention_backward(q, k, v, c, o, lse, dout, dc, dlogf, dq, dk, dv, scratch, B, H, T, dh, q_last, 0);
}

struct Shape {
    int B, H, T, dh;
    double logf_lo;  // log f ~ U[logf_lo, 0]
    bool acp;        // prune with a synthetic staircase
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

// fp64 reference of forward and backward for one shape; o and dO in (B, T, H, dh), the rest (B, H, T, ...).
static Reference reference(const Shape &s, const std::vector<double> &q, const std::vector<double> &k,
                           const std::vector<double> &v, const std::vector<double> &c, const std::vector<double> &dout,
                           const std::vector<int> &kv_first) {
    const int B = s.B, H = s.H, T = s.T, dh = s.dh, nblk = (T + FOX_ATTN_ACP_BLOCK - 1) / FOX_ATTN_ACP_BLOCK;
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
                const int j_lo = kv_first.empty() ? 0 : kv_first[bh * nblk + i / FOX_ATTN_ACP_BLOCK] * FOX_ATTN_ACP_BLOCK;
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

static bool check_shape(const Shape &s) {
    const int B = s.B, H = s.H, T = s.T, dh = s.dh, BH = B * H, nblk = (T + FOX_ATTN_ACP_BLOCK - 1) / FOX_ATTN_ACP_BLOCK;
    printf("B=%d H=%d T=%d dh=%d log f in [%.2f, 0]%s\n", B, H, T, dh, s.logf_lo, s.acp ? ", ACP staircase" : "");
    const size_t nqkv = (size_t)BH * T * dh, nvec = (size_t)BH * T;
    std::vector<bf16> hq, hk, hv, hdo;
    std::vector<double> q, k, v, dout;
    fill_bf16(hq, q, nqkv);
    fill_bf16(hk, k, nqkv);
    fill_bf16(hv, v, nqkv);
    fill_bf16(hdo, dout, nqkv);
    std::vector<float> hc(nvec);
    std::vector<double> c(nvec);
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

    bf16 *dq_in = to_device(hq), *dk_in = to_device(hk), *dv_in = to_device(hv), *ddo = to_device(hdo);
    float *dc_in = to_device(hc);
    int *dkvf = s.acp ? to_device(kv_first) : nullptr, *dql = s.acp ? to_device(q_last) : nullptr;
    bf16 *o, *gq, *gk, *gv;
    float *lse, *dcg, *dlogf;
    void *scratch;
    FOX_CUDA_CHECK(cudaMalloc(&o, nqkv * sizeof(bf16)));
    FOX_CUDA_CHECK(cudaMalloc(&gq, nqkv * sizeof(bf16)));
    FOX_CUDA_CHECK(cudaMalloc(&gk, nqkv * sizeof(bf16)));
    FOX_CUDA_CHECK(cudaMalloc(&gv, nqkv * sizeof(bf16)));
    FOX_CUDA_CHECK(cudaMalloc(&lse, nvec * sizeof(float)));
    FOX_CUDA_CHECK(cudaMalloc(&dcg, nvec * sizeof(float)));
    FOX_CUDA_CHECK(cudaMalloc(&dlogf, nvec * sizeof(float)));
    FOX_CUDA_CHECK(cudaMalloc(&scratch, fox_attention_backward_scratch_bytes(B, H, T, dh)));

    // poison every output and the scratch: each element must be written (NaN fails the comparison)
    const size_t scratch_bytes = fox_attention_backward_scratch_bytes(B, H, T, dh);
    const Reference r = reference(s, q, k, v, c, dout, kv_first);
    bool ok = true;
    // forward variants (the API's last, so o and lse below are the API's)
    std::vector<const FwdVariant *> fv;
    for (const FwdVariant &var : fwd_variants)
        if (var.dh == dh && var.fn && (!var.wg || fox_attn::use_wgmma()) && selected(var.name)) fv.push_back(&var);
    for (const FwdVariant &var : fwd_variants)
        if (var.dh == dh && !var.fn) fv.push_back(&var);
    std::vector<bf16> ho;
    std::vector<float> hlse;
    for (const FwdVariant *var : fv) {
        printf("  forward %s\n", var->name);
        FOX_CUDA_CHECK(cudaMemset(o, 0xff, nqkv * sizeof(bf16)));
        FOX_CUDA_CHECK(cudaMemset(lse, 0xff, nvec * sizeof(float)));
        run_fwd(*var, dq_in, dk_in, dv_in, dc_in, o, lse, B, H, T, dh, dkvf);
        FOX_CUDA_CHECK(cudaDeviceSynchronize());
        ho = to_host(o, nqkv);
        hlse = to_host(lse, nvec);
        // a second forward must match the first bit for bit (a moving result is a race)
        run_fwd(*var, dq_in, dk_in, dv_in, dc_in, o, lse, B, H, T, dh, dkvf);
        FOX_CUDA_CHECK(cudaDeviceSynchronize());
        const bool repeat_ok = memcmp(to_host(o, nqkv).data(), ho.data(), nqkv * sizeof(bf16)) == 0 &&
                               memcmp(to_host(lse, nvec).data(), hlse.data(), nvec * sizeof(float)) == 0;
        printf("    forward repeat bitwise identical: %s\n", repeat_ok ? "PASS" : "FAIL");
        ok &= repeat_ok;
        ok &= compare("o", ho, r.o, 1e-2);
        ok &= compare("lse", hlse, r.lse, 1e-4);
    }
    for (const Variant &var : variants) {
        if (var.dh != dh || (var.wg && !fox_attn::use_wgmma()) || !selected(var.name)) continue;
        printf("  backward %s\n", var.name);
        std::vector<bf16> hgq, hgk, hgv;
        std::vector<float> hdc, hdlogf;
        bool same = true;
        for (int rep = 0; rep < 2; rep++) {
            FOX_CUDA_CHECK(cudaMemset(gq, 0xff, nqkv * sizeof(bf16)));
            FOX_CUDA_CHECK(cudaMemset(gk, 0xff, nqkv * sizeof(bf16)));
            FOX_CUDA_CHECK(cudaMemset(gv, 0xff, nqkv * sizeof(bf16)));
            FOX_CUDA_CHECK(cudaMemset(dcg, 0xff, nvec * sizeof(float)));
            FOX_CUDA_CHECK(cudaMemset(dlogf, 0xff, nvec * sizeof(float)));
            FOX_CUDA_CHECK(cudaMemset(scratch, rep ? 0x00 : 0xff, scratch_bytes));
            run_bwd(var, dq_in, dk_in, dv_in, dc_in, o, lse, ddo, dcg, dlogf, gq, gk, gv, scratch, B, H, T, dh, dql);
            FOX_CUDA_CHECK(cudaDeviceSynchronize());
            if (rep == 0) {
                hgq = to_host(gq, nqkv), hgk = to_host(gk, nqkv), hgv = to_host(gv, nqkv);
                hdc = to_host(dcg, nvec), hdlogf = to_host(dlogf, nvec);
            } else {
                same &= memcmp(to_host(gq, nqkv).data(), hgq.data(), nqkv * sizeof(bf16)) == 0;
                same &= memcmp(to_host(gk, nqkv).data(), hgk.data(), nqkv * sizeof(bf16)) == 0;
                same &= memcmp(to_host(gv, nqkv).data(), hgv.data(), nqkv * sizeof(bf16)) == 0;
                same &= memcmp(to_host(dcg, nvec).data(), hdc.data(), nvec * sizeof(float)) == 0;
                same &= memcmp(to_host(dlogf, nvec).data(), hdlogf.data(), nvec * sizeof(float)) == 0;
            }
        }
        if (var.nondet) {
            printf("    backward repeat bitwise identical: %s (not required: nondeterministic)\n", same ? "yes" : "no");
        } else {
            printf("    backward repeat bitwise identical: %s\n", same ? "PASS" : "FAIL");
            ok &= same;
        }
        ok &= compare("dq", hgq, r.dq, 1e-2);
        ok &= compare("dk", hgk, r.dk, 1e-2);
        ok &= compare("dv", hgv, r.dv, 1e-2);
        ok &= compare("dc", hdc, r.dc, 1e-2);
        ok &= compare("dlogf", hdlogf, r.dlogf, 1e-2);
    }

    FOX_CUDA_CHECK(cudaFree(dq_in));
    FOX_CUDA_CHECK(cudaFree(dk_in));
    FOX_CUDA_CHECK(cudaFree(dv_in));
    FOX_CUDA_CHECK(cudaFree(ddo));
    FOX_CUDA_CHECK(cudaFree(dc_in));
    FOX_CUDA_CHECK(cudaFree(dkvf));
    FOX_CUDA_CHECK(cudaFree(dql));
    FOX_CUDA_CHECK(cudaFree(o));
    FOX_CUDA_CHECK(cudaFree(gq));
    FOX_CUDA_CHECK(cudaFree(gk));
    FOX_CUDA_CHECK(cudaFree(gv));
    FOX_CUDA_CHECK(cudaFree(lse));
    FOX_CUDA_CHECK(cudaFree(dcg));
    FOX_CUDA_CHECK(cudaFree(dlogf));
    FOX_CUDA_CHECK(cudaFree(scratch));
    return ok;
}

static bool run_checks() {
    const Shape shapes[] = {
        {1, 2, 1, 64, -0.5, false},    {2, 2, 63, 64, -0.5, false},   {1, 3, 257, 64, -0.5, false},
        {1, 2, 1000, 64, -0.5, false}, {1, 2, 1000, 64, -0.01, false}, {1, 2, 1, 128, -0.5, false},
        {2, 2, 63, 128, -0.5, false},  {1, 3, 257, 128, -0.5, false}, {1, 2, 1000, 128, -0.5, false},
        {1, 2, 1000, 128, -0.01, false}, {1, 2, 1000, 64, -0.01, true}, {1, 2, 1000, 128, -0.01, true},
        {2, 2, 2000, 64, -0.05, true},  {1, 2, 1800, 128, -0.01, false},
    };
    bool all = true;
    for (const Shape &s : shapes) all &= check_shape(s);
    printf("correctness: %s\n", all ? "ALL PASS" : "SOME FAILED");
    return all;
}

static float median(std::vector<float> x) {
    std::sort(x.begin(), x.end());
    return x[x.size() / 2];
}

// Times forward, backward and both at B*T = 32k tokens (16 heads of 64 or 8 of 128), median of 20 runs,
// for each backward variant of this dh; then checks that two more backward runs agree bit for bit.
static bool bench(int B, int H, int T, int dh) {
    const size_t nqkv = (size_t)B * H * T * dh, nvec = (size_t)B * H * T;
    std::vector<bf16> hx;
    std::vector<double> unused;
    fill_bf16(hx, unused, nqkv);
    std::vector<float> hc(nvec);
    for (int bh = 0; bh < B * H; bh++) {
        float run = 0.f;
        for (int t = 0; t < T; t++) hc[(size_t)bh * T + t] = (run += (float)(-0.5 * rand_uniform()));
    }
    bf16 *q = to_device(hx), *k = to_device(hx), *v = to_device(hx), *dout = to_device(hx), *o, *gq, *gk, *gv;
    float *c = to_device(hc), *lse, *dcg, *dlogf;
    void *scratch;
    FOX_CUDA_CHECK(cudaMalloc(&o, nqkv * sizeof(bf16)));
    FOX_CUDA_CHECK(cudaMalloc(&gq, nqkv * sizeof(bf16)));
    FOX_CUDA_CHECK(cudaMalloc(&gk, nqkv * sizeof(bf16)));
    FOX_CUDA_CHECK(cudaMalloc(&gv, nqkv * sizeof(bf16)));
    FOX_CUDA_CHECK(cudaMalloc(&lse, nvec * sizeof(float)));
    FOX_CUDA_CHECK(cudaMalloc(&dcg, nvec * sizeof(float)));
    FOX_CUDA_CHECK(cudaMalloc(&dlogf, nvec * sizeof(float)));
    FOX_CUDA_CHECK(cudaMalloc(&scratch, fox_attention_backward_scratch_bytes(B, H, T, dh)));
    cudaEvent_t e0, e1, e2;
    FOX_CUDA_CHECK(cudaEventCreate(&e0));
    FOX_CUDA_CHECK(cudaEventCreate(&e1));
    FOX_CUDA_CHECK(cudaEventCreate(&e2));
    bool all_same = true;
    const double flops_fwd = 2.0 * B * H * (double)T * T * dh;
    for (const FwdVariant &var : fwd_variants) {
        if (var.dh != dh || (var.wg && !fox_attn::use_wgmma()) || !selected(var.name)) continue;
        std::vector<float> tf;
        for (int rep = 0; rep < 23; rep++) {
            FOX_CUDA_CHECK(cudaEventRecord(e0));
            run_fwd(var, q, k, v, c, o, lse, B, H, T, dh, nullptr);
            FOX_CUDA_CHECK(cudaEventRecord(e1));
            FOX_CUDA_CHECK(cudaEventSynchronize(e1));
            float f;
            FOX_CUDA_CHECK(cudaEventElapsedTime(&f, e0, e1));
            if (rep >= 3) tf.push_back(f);
        }
        const float mf = median(tf);
        printf("T=%5d dh=%3d B=%d H=%2d | fwd %7.3f ms %6.1f TFLOP/s | forward %s\n", T, dh, B, H, mf,
               flops_fwd / mf * 1e-9, var.name);
    }
    for (const Variant &var : variants) {
        if (var.dh != dh || (var.wg && !fox_attn::use_wgmma()) || !selected(var.name)) continue;
        std::vector<float> tf, tb, tfb;
        for (int rep = 0; rep < 23; rep++) {
            FOX_CUDA_CHECK(cudaEventRecord(e0));
            fox_attention_forward(q, k, v, c, o, lse, B, H, T, dh, nullptr, 0);
            FOX_CUDA_CHECK(cudaEventRecord(e1));
            run_bwd(var, q, k, v, c, o, lse, dout, dcg, dlogf, gq, gk, gv, scratch, B, H, T, dh, nullptr);
            FOX_CUDA_CHECK(cudaEventRecord(e2));
            FOX_CUDA_CHECK(cudaEventSynchronize(e2));
            float f, bw;
            FOX_CUDA_CHECK(cudaEventElapsedTime(&f, e0, e1));
            FOX_CUDA_CHECK(cudaEventElapsedTime(&bw, e1, e2));
            if (rep < 3) continue;  // warm-up
            tf.push_back(f);
            tb.push_back(bw);
            tfb.push_back(f + bw);
        }
        // determinism at full size, where many key blocks meet on each query tile
        std::vector<bf16> q1 = to_host(gq, nqkv), k1 = to_host(gk, nqkv);
        std::vector<float> c1 = to_host(dcg, nvec), l1 = to_host(dlogf, nvec);
        bool same = true;
        for (int rep = 0; rep < 2; rep++) {
            run_bwd(var, q, k, v, c, o, lse, dout, dcg, dlogf, gq, gk, gv, scratch, B, H, T, dh, nullptr);
            FOX_CUDA_CHECK(cudaDeviceSynchronize());
            same &= memcmp(to_host(gq, nqkv).data(), q1.data(), nqkv * sizeof(bf16)) == 0;
            same &= memcmp(to_host(gk, nqkv).data(), k1.data(), nqkv * sizeof(bf16)) == 0;
            same &= memcmp(to_host(dcg, nvec).data(), c1.data(), nvec * sizeof(float)) == 0;
            same &= memcmp(to_host(dlogf, nvec).data(), l1.data(), nvec * sizeof(float)) == 0;
        }
        if (!var.nondet) all_same &= same;
        const float mf = median(tf), mb = median(tb), mfb = median(tfb);
        printf("T=%5d dh=%3d B=%d H=%2d | fwd %7.3f ms %6.1f TFLOP/s | bwd %7.3f ms %6.1f TFLOP/s | fwd+bwd %7.3f ms "
               "%6.1f TFLOP/s | bwd bitwise repeat %s | %s\n",
               T, dh, B, H, mf, flops_fwd / mf * 1e-9, mb, 2.5 * flops_fwd / mb * 1e-9, mfb,
               3.5 * flops_fwd / mfb * 1e-9, same ? "PASS" : var.nondet ? "no (nondet)" : "FAIL", var.name);
    }
    FOX_CUDA_CHECK(cudaEventDestroy(e0));
    FOX_CUDA_CHECK(cudaEventDestroy(e1));
    FOX_CUDA_CHECK(cudaEventDestroy(e2));
    bf16 *bufs[] = {q, k, v, dout, o, gq, gk, gv};
    for (bf16 *p : bufs) FOX_CUDA_CHECK(cudaFree(p));
    float *fbufs[] = {c, lse, dcg, dlogf};
    for (float *p : fbufs) FOX_CUDA_CHECK(cudaFree(p));
    FOX_CUDA_CHECK(cudaFree(scratch));
    return all_same;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "all";
    if (argc > 2) only_variants = argv[2];
    printf("dh 64 kernels: %s\n", fox_attn::use_wgmma() ? "warpgroup MMA (wgmma)" : "mma.sync (FOX_ATTN_NO_WGMMA or not Hopper)");
    bool ok = true;
    if (strcmp(mode, "bench") != 0) ok = run_checks();
    if (strcmp(mode, "check") != 0) {
        const int Ts[] = {4096, 16384}, dhs[] = {64, 128};
        for (int T : Ts)
            for (int dh : dhs) ok &= bench(32768 / T, dh == 64 ? 16 : 8, T, dh);  // B*T = 32k tokens
        // the attention of the fox-pro 125M and 760M training steps (train_fox, batch 1 x 16384)
        ok &= bench(1, 12, 16384, 64);
        ok &= bench(1, 24, 16384, 64);
    }
    return ok ? 0 : 1;
}
