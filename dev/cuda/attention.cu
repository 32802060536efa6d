// dev/cuda/attention.cu: checks the public API of fox/attention.cuh (Forgetting Attention forward, and
// backward deterministic and not) against the fp64 CPU reference at 14 shapes (d_h 64 and 128, odd T,
// with and without ACP pruning; poisoned outputs, bitwise repeats), then times it; `acp` times ACP's
// pruning at measured fractions of pruned tiles (random gates of six decay speeds, T = 16384).
//   make attention && ./attention        (./attention check | ./attention bench | ./attention acp for one part)
// The kernel versions behind the API, and the experiments beside them, are attention_forward.cu and
// attention_backward.cu; their measurements are in NOTES.md.
#include "attention_ref.h"          // reference, checks, timing; includes fox/attention.cuh
#include "../../fox/acp_tables.cuh" // fox_acp_tables: the trainers' ACP staircase scan

struct ApiBwd {
    const char *name;
    BwdFn fn64, fn128;
    bool nondet;
};
static const ApiBwd api_bwd[] = {
    {"api, deterministic", api_backward<64, 1>, api_backward<128, 1>, false},
    {"api, nondeterministic (fp32 atomics in arrival order)", api_backward<64, 0>, api_backward<128, 0>, true},
};

static bool run_checks() {
    bool all = true;
    for (const Shape &s : check_shapes) {
        print_shape(s);
        Problem p = make_problem(s);
        all &= check_forward(p, s.dh == 64 ? api_forward<64> : api_forward<128>, "api");
        for (const ApiBwd &a : api_bwd) all &= check_backward(p, s.dh == 64 ? a.fn64 : a.fn128, a.name, a.nondet);
        free_problem(p);
    }
    printf("correctness: %s\n", all ? "ALL PASS" : "SOME FAILED");
    return all;
}

static bool run_bench() {
    bool ok = true;
    for (const BenchShape &bs : bench_shapes) {
        BenchInputs b = make_bench_inputs(bs.B, bs.H, bs.T, bs.dh);
        bench_forward(b, bs.dh == 64 ? api_forward<64> : api_forward<128>, "api");
        for (const ApiBwd &a : api_bwd) ok &= bench_backward(b, bs.dh == 64 ? a.fn64 : a.fn128, a.name, a.nondet);
        free_bench_inputs(b);
    }
    return ok;
}

// ---------------------------------------------------------------------------------------------
// ACP at measured pruning fractions (issue 12): random gates log f_t = -r·u_t, u_t ~ U[0, 2] i.i.d. per
// (b, h, t), at the decay speeds r that make the staircase prune about 0, 25, 50, 75, 90 and 97% of the tiles
// (a bisection on the host staircase; r = 0 for 0%). U comes from QK-norm weights set so that it bounds
// these inputs' |q·k|/√d_h (fox-pro's bound, fox/acp.h). Per speed, medians of 20 timed runs (after 3
// warm-up) of the trainers' scan (fox_acp_tables), the forward with kv_first and the backward with q_last
// (deterministic, and nondeterministic: --deterministic 0), and of each without ACP on the same inputs; "ideal" is the time without ACP × the fraction of
// tiles computed. The outputs with ACP must equal those without to bf16 rounding: the pruned weights are
// below e^-10/T of their row's largest (a live tile skipped would move them by whole weights); two more
// backward runs with ACP must repeat the timed one bit for bit (the add order of the pruned staircase).

static const double acp_targets[] = {0.0, 0.25, 0.50, 0.75, 0.90, 0.97};

// The fraction of tiles the staircase (fox/acp.h, made monotone) prunes for c = r·C, C = -Σ u (BH rows of T);
// c gets r·C as the GPU will see it.
static double acp_host_pruned(const std::vector<float> &C, float r, int BH, int T, double delta, std::vector<float> &c) {
    const int nblk = fox_acp_blocks(T);
    long long pruned = 0;
    for (size_t i = 0; i < C.size(); i++) c[i] = r * C[i];
    for (int bh = 0; bh < BH; bh++)
        for (int m = 0, prev = 0; m < nblk; m++) {
            prev = std::max(prev, fox_acp_first_live(c.data() + (size_t)bh * T, T, m, delta));
            pruned += prev;
        }
    return (double)pruned / ((double)BH * fox_acp_tiles(T));
}

// The decay speed whose staircase prunes the nearest fraction to target (bisection on log r; the fraction
// grows with r in steps).
static float acp_speed_for(const std::vector<float> &C, double target, int BH, int T, double delta, std::vector<float> &c) {
    if (target <= 0.0) return 0.0f;
    double lo = log(1e-6), hi = log(50.0);
    for (int it = 0; it < 40; it++) {
        double mid = 0.5 * (lo + hi);
        if (acp_host_pruned(C, (float)exp(mid), BH, T, delta, c) < target) lo = mid;
        else hi = mid;
    }
    double a = acp_host_pruned(C, (float)exp(lo), BH, T, delta, c), b = acp_host_pruned(C, (float)exp(hi), BH, T, delta, c);
    return (float)exp(fabs(a - target) < fabs(b - target) ? lo : hi);
}

// max |a - b| over max |b|.
template <typename T> static double rel_max_diff(const T *a, const T *b, size_t n) {
    std::vector<T> ha = to_host(a, n), hb = to_host(b, n);
    double d = 0.0, mx = 0.0;
    for (size_t i = 0; i < n; i++) {
        d = std::max(d, fabs(to_double(ha[i]) - to_double(hb[i])));
        mx = std::max(mx, fabs(to_double(hb[i])));
    }
    return mx > 0.0 ? d / mx : d;
}

// The outputs of the runs with ACP (the bench inputs' own buffers hold those without).
struct AcpOut {
    bf16 *o, *gq, *gk, *gv;
    float *lse, *dc, *dlogf;
};

// One decay speed: tables, timings with and without ACP, the checks. Returns whether the checks passed.
static bool acp_point(BenchInputs &b, AcpOut &a, const float *w, int *kvf, int *ql, unsigned long long *live, double target,
                      float r, double host_pruned) {
    const int BH = b.B * b.H;
    FOX_CUDA_CHECK(cudaMemset(live, 0, b.H * sizeof(unsigned long long)));
    fox_acp_tables(kvf, ql, live, b.c, b.q, b.k, w, w, 0, nullptr, b.B, b.H, b.T, b.dh, 0);
    std::vector<unsigned long long> hl = to_host(live, (size_t)b.H);
    unsigned long long n_live = 0;
    for (unsigned long long x : hl) n_live += x;
    const double frac = (double)n_live / ((double)BH * fox_acp_tiles(b.T));
    // Each rep: the scan, then with ACP the forward, the nondeterministic and the deterministic backward, then
    // the same three without ACP (the deterministic runs last: the checks below compare their outputs).
    cudaEvent_t e[8];
    for (cudaEvent_t &x : e) FOX_CUDA_CHECK(cudaEventCreate(&x));
    std::vector<float> ts, tf, tn, tb, tf0, tn0, tb0;
    // events e[e0], e[e0 + 1], e[e0 + 2] before the forward and the two backwards into the given outputs
    auto fwd_bwd = [&](int e0, bf16 *o, float *lse, float *dc, float *dlogf, bf16 *gq, bf16 *gk, bf16 *gv, const int *kf,
                       const int *qlast) {
        FOX_CUDA_CHECK(cudaEventRecord(e[e0]));
        fox_attention_forward(b.q, b.k, b.v, b.c, o, lse, b.B, b.H, b.T, b.dh, kf, 0);
        for (int det = 0; det < 2; det++) {
            FOX_CUDA_CHECK(cudaEventRecord(e[e0 + 1 + det]));
            fox_attention_backward(b.q, b.k, b.v, b.c, o, lse, b.dout, dc, dlogf, gq, gk, gv, b.scratch, b.B, b.H, b.T, b.dh,
                                   qlast, det, 0);
        }
    };
    for (int rep = 0; rep < 23; rep++) {
        FOX_CUDA_CHECK(cudaEventRecord(e[0]));
        fox_acp_tables(kvf, ql, nullptr, b.c, b.q, b.k, w, w, 0, nullptr, b.B, b.H, b.T, b.dh, 0);
        fwd_bwd(1, a.o, a.lse, a.dc, a.dlogf, a.gq, a.gk, a.gv, kvf, ql);
        fwd_bwd(4, b.o, b.lse, b.dc, b.dlogf, b.gq, b.gk, b.gv, nullptr, nullptr);
        FOX_CUDA_CHECK(cudaEventRecord(e[7]));
        FOX_CUDA_CHECK(cudaEventSynchronize(e[7]));
        float t[7];
        for (int i = 0; i < 7; i++) FOX_CUDA_CHECK(cudaEventElapsedTime(&t[i], e[i], e[i + 1]));
        if (rep < 3) continue;
        ts.push_back(t[0]);
        tf.push_back(t[1]);
        tn.push_back(t[2]);
        tb.push_back(t[3]);
        tf0.push_back(t[4]);
        tn0.push_back(t[5]);
        tb0.push_back(t[6]);
    }
    for (cudaEvent_t &x : e) FOX_CUDA_CHECK(cudaEventDestroy(x));
    std::vector<bf16> q1 = to_host(a.gq, b.nqkv), k1 = to_host(a.gk, b.nqkv);
    std::vector<float> c1 = to_host(a.dlogf, b.nvec);
    bool same = true;
    for (int rep = 0; rep < 2; rep++) {
        fox_attention_backward(b.q, b.k, b.v, b.c, a.o, a.lse, b.dout, a.dc, a.dlogf, a.gq, a.gk, a.gv, b.scratch, b.B, b.H,
                               b.T, b.dh, ql, 1, 0);
        same &= memcmp(to_host(a.gq, b.nqkv).data(), q1.data(), b.nqkv * sizeof(bf16)) == 0;
        same &= memcmp(to_host(a.gk, b.nqkv).data(), k1.data(), b.nqkv * sizeof(bf16)) == 0;
        same &= memcmp(to_host(a.dlogf, b.nvec).data(), c1.data(), b.nvec * sizeof(float)) == 0;
    }
    const double err_o = rel_max_diff(a.o, b.o, b.nqkv), err_lse = rel_max_diff(a.lse, b.lse, b.nvec);
    const double err_g = std::max({rel_max_diff(a.gq, b.gq, b.nqkv), rel_max_diff(a.gk, b.gk, b.nqkv),
                                   rel_max_diff(a.gv, b.gv, b.nqkv)});
    const double err_c = std::max(rel_max_diff(a.dc, b.dc, b.nvec), rel_max_diff(a.dlogf, b.dlogf, b.nvec));
    const bool ok = err_o <= 1e-2 && err_lse <= 1e-4 && err_g <= 1e-2 && err_c <= 1e-2 && same &&
                    fabs(frac - (1.0 - host_pruned)) < 1e-12;
    const float s = median(ts), f = median(tf), bw = median(tb), f0 = median(tf0), b0 = median(tb0), nd = median(tn),
                nd0 = median(tn0);
    bench_header(b);
    printf("target %2.0f%% r %.4f | pruned %5.1f%% (computed %.4f) | scan %.3f ms | fwd %7.3f ms vs %7.3f (ideal %7.3f) | "
           "bwd %7.3f vs %7.3f (ideal %7.3f) | nondet bwd %7.3f vs %7.3f | scan+fwd+bwd %7.3f vs %7.3f: %5.2fx (ideal %5.2fx) | "
           "rel err o %.1e lse %.1e dq,dk,dv %.1e dc,dlogf %.1e | bwd bitwise repeat %s | %s\n",
           100 * target, r, 100 * (1.0 - frac), frac, s, f, f0, f0 * frac, bw, b0, b0 * frac, nd, nd0, s + f + bw, f0 + b0,
           (f0 + b0) / (s + f + bw), 1.0 / frac, err_o, err_lse, err_g, err_c, same ? "yes" : "NO", ok ? "PASS" : "FAIL");
    return ok;
}

static bool run_acp_sweep() {
    bool ok = true;
    const BenchShape shapes[] = {{2, 16, 16384, 64}, {2, 8, 16384, 128}};
    for (const BenchShape &bs : shapes) {
        BenchInputs b = make_bench_inputs(bs.B, bs.H, bs.T, bs.dh);
        const int BH = b.B * b.H;
        // QK-norm weights w = max_t |q_t| / √d_h for every channel: U = w²·√d_h bounds |q·k|/√d_h here (q = k).
        std::vector<bf16> hq = to_host(b.q, b.nqkv);
        double max2 = 0.0;
        for (size_t t = 0; t < b.nqkv / b.dh; t++) {
            double n2 = 0.0;
            for (int i = 0; i < b.dh; i++) n2 += to_double(hq[t * b.dh + i]) * to_double(hq[t * b.dh + i]);
            max2 = std::max(max2, n2);
        }
        const float wv = (float)sqrt(max2 / b.dh);
        std::vector<float> hw((size_t)b.H * b.dh, wv), C(b.nvec), hc(b.nvec);
        float *w = to_device(hw);
        const double delta = fox_acp_threshold(fox_acp_bound_qknorm(wv, wv, b.dh), b.T);
        for (int bh = 0; bh < BH; bh++) {
            float run = 0.0f;
            for (int t = 0; t < b.T; t++) C[(size_t)bh * b.T + t] = (run -= (float)(2.0 * rand_uniform()));
        }
        const int nblk = fox_acp_blocks(b.T);
        int *kvf, *ql;
        unsigned long long *live;
        FOX_CUDA_CHECK(cudaMalloc(&kvf, (size_t)BH * nblk * sizeof(int)));
        FOX_CUDA_CHECK(cudaMalloc(&ql, (size_t)BH * nblk * sizeof(int)));
        FOX_CUDA_CHECK(cudaMalloc(&live, b.H * sizeof(unsigned long long)));
        AcpOut a;
        FOX_CUDA_CHECK(cudaMalloc(&a.o, b.nqkv * sizeof(bf16)));
        FOX_CUDA_CHECK(cudaMalloc(&a.gq, b.nqkv * sizeof(bf16)));
        FOX_CUDA_CHECK(cudaMalloc(&a.gk, b.nqkv * sizeof(bf16)));
        FOX_CUDA_CHECK(cudaMalloc(&a.gv, b.nqkv * sizeof(bf16)));
        FOX_CUDA_CHECK(cudaMalloc(&a.lse, b.nvec * sizeof(float)));
        FOX_CUDA_CHECK(cudaMalloc(&a.dc, b.nvec * sizeof(float)));
        FOX_CUDA_CHECK(cudaMalloc(&a.dlogf, b.nvec * sizeof(float)));
        printf("ACP sweep: T=%d dh=%d B=%d H=%d, U %.2f (threshold %.2f)\n", b.T, b.dh, b.B, b.H,
               fox_acp_bound_qknorm(wv, wv, b.dh), delta);
        for (double target : acp_targets) {
            const float r = acp_speed_for(C, target, BH, b.T, delta, hc);
            const double host_pruned = acp_host_pruned(C, r, BH, b.T, delta, hc);
            FOX_CUDA_CHECK(cudaMemcpy(b.c, hc.data(), b.nvec * sizeof(float), cudaMemcpyHostToDevice));
            ok &= acp_point(b, a, w, kvf, ql, live, target, r, host_pruned);
        }
        void *bufs[] = {w, kvf, ql, live, a.o, a.gq, a.gk, a.gv, a.lse, a.dc, a.dlogf};
        for (void *x : bufs) FOX_CUDA_CHECK(cudaFree(x));
        free_bench_inputs(b);
    }
    printf("ACP sweep: %s\n", ok ? "ALL PASS" : "SOME FAILED");
    return ok;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "all";
    printf("attention kernels: %s\n", fox_attn::use_wgmma() ? "warpgroup MMA (wgmma)" : "mma.sync (FOX_ATTN_NO_WGMMA or not Hopper)");
    bool ok = true;
    if (strcmp(mode, "acp") == 0) return run_acp_sweep() ? 0 : 1;
    if (strcmp(mode, "bench") != 0) ok &= run_checks();
    if (strcmp(mode, "check") != 0) ok &= run_bench();
    return ok ? 0 : 1;
}
