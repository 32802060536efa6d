// dev/cuda/adamw.cu: checks the optimizer kernels of fox/adamw.cuh against an fp64 CPU reference, then
// times them, with train_fox.cu's launches and arithmetic (grad_norm, optimizer_update):
//   grad norm: sumsq_partial_kernel + sumsq_final_kernel (fixed-order Σ g², double result);
//   clipping:  gscale = clip/(norm + 1e-6) when norm > clip (torch clip_grad_norm_), folded into AdamW;
//   AdamW: m, v, decoupled decay (per tensor), update, and the bf16 copy of the GEMM weights with per-layer
//   row padding (the padding must stay untouched), over a flat vector of several tensors, one of them not
//   learned (its weights and moments must stay as they are), on a ZeRO-1 shard [lo, hi) of it.
//     version 1 (until 2026-11-25): adamw_v1, one launch per tensor, one element per thread.
//     version 2 (fox/adamw.cuh, fox_adamw): one launch over every tensor, 4 elements per thread (16-byte
//     accesses, an 8-byte store of the bf16 copy). Checked bitwise equal to version 1 (w, m, v, bf16 copy).
//   make adamw && ./adamw
#include "kcheck.h"
#include "../../fox/adamw.cuh"         // fox_adamw, the gradient norm's sums

// ---- version 1, as the product had it (AdamStep then carried the tensor's decay)
__global__ void adamw_v1(float *w, bf16 *wbf, const float *grad, float *m, float *v, size_t n, size_t first,
                         size_t layer_numel, size_t pad_per_layer, AdamStep a, double decay) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = grad[i];
    if (a.gscale != 1.0f) g *= a.gscale;
    m[i] = (float)(a.beta1 * m[i] + (1.0 - a.beta1) * g);
    v[i] = (float)(a.beta2 * v[i] + (1.0 - a.beta2) * g * g);
    double mhat = m[i] / a.bc1, vhat = v[i] / a.bc2;
    float nw = (float)(w[i] * (float)decay - a.lr * mhat / (sqrt(vhat) + a.eps));
    w[i] = nw;
    size_t j = first + i;
    if (wbf) wbf[j + (j / layer_numel) * pad_per_layer] = __float2bfloat16(nw);
}

struct Tensor {
    size_t layers, rows, rows_pad, cols;
    bool decay, learned, copy;  // copy: a bf16 GEMM copy with rows padded to rows_pad
};

// The tensors laid out one after another in a flat vector, AdamW on the shard [lo·n, hi·n) (rounded down to
// 64 elements, as zero_shard does), gradients of scale gmag.
static void run(const char *name, const std::vector<Tensor> &ts, double gmag, double lo_frac, double hi_frac) {
    size_t n = 0, nbf = 0;
    std::vector<size_t> off, boff;
    for (const Tensor &t : ts) {
        off.push_back(n);
        boff.push_back(nbf);
        n += t.layers * t.rows * t.cols;
        if (t.copy) nbf += t.layers * t.rows_pad * t.cols;
    }
    const size_t lo = (size_t)(lo_frac * n) / 64 * 64, hi = hi_frac >= 1.0 ? n : (size_t)(hi_frac * n) / 64 * 64, ns = hi - lo;
    std::string shape = fmt("%s n=%zu shard [%zu,%zu) |g|~%g", name, n, lo, hi, gmag);
    printf("adamw %s\n", shape.c_str());
    std::vector<float> w = rand_f32(n, -0.1, 0.1), g = rand_f32(n, -gmag, gmag), m = rand_f32(ns, -1e-3, 1e-3), v(ns);
    for (size_t i = 0; i < ns; i++) v[i] = (float)uniform(1e-8, 1e-5);
    const double lr = 1e-3, wd = 0.1, clip = 1.0, beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
    const int step = 7;  // bias corrections
    float *d_w = to_device(w), *d_g = to_device(g), *d_m = to_device(m), *d_v = to_device(v), *d_part = dmalloc<float>(SUMSQ_BLOCKS);
    float *d_w1 = to_device(w), *d_m1 = to_device(m), *d_v1 = to_device(v);
    double *d_ss = dmalloc<double>(1);
    bf16 *d_wbf = dmalloc<bf16>(nbf), *d_wbf1 = dmalloc<bf16>(nbf);

    auto gradnorm = [&] {
        sumsq_partial_kernel<<<SUMSQ_BLOCKS, SUMSQ_THREADS>>>(d_part, d_g, n);
        FOX_LAUNCH_CHECK();
        sumsq_final_kernel<<<1, 1>>>(d_ss, d_part);
        FOX_LAUNCH_CHECK();
    };
    Group gn, ga;
    gradnorm();
    double ss_gpu = to_host(d_ss, 1)[0], ss = 0;
    for (size_t i = 0; i < n; i++) ss += (double)g[i] * g[i];
    check_values(gn, "sum g^2", {ss_gpu}, {ss}, TOL_F32_RED);
    const double norm = sqrt(ss_gpu);

    AdamStep st;  // as optimizer_update builds it
    st.lr = lr;
    st.beta1 = beta1;
    st.beta2 = beta2;
    st.eps = eps;
    st.bc1 = 1.0 - pow(beta1, step);
    st.bc2 = 1.0 - pow(beta2, step);
    st.gscale = (clip > 0.0 && norm > clip) ? (float)(clip / (norm + 1e-6)) : 1.0f;
    printf("    norm %.6g -> gscale %.6g\n", norm, (double)st.gscale);
    AdamTensors T;
    T.n = 0;
    std::vector<double> decay(ts.size());
    for (size_t k = 0; k < ts.size(); k++) {
        const Tensor &t = ts[k];
        size_t numel = t.layers * t.rows * t.cols, tlo = std::max(off[k], lo), thi = std::min(off[k] + numel, hi);
        decay[k] = t.decay ? (double)(float)(1.0 - lr * wd) : 1.0;
        if (!t.learned || thi <= tlo) continue;
        int i = T.n++;
        T.lo[i] = tlo;
        T.hi[i] = thi;
        T.first[i] = off[k];
        T.decay[i] = decay[k];
        T.wbf[i] = t.copy ? d_wbf + boff[k] : nullptr;
        T.layer_numel[i] = t.rows * t.cols;
        T.pad[i] = (t.rows_pad - t.rows) * t.cols;
    }
    auto v1 = [&] {
        for (size_t k = 0; k < ts.size(); k++) {
            const Tensor &t = ts[k];
            size_t numel = t.layers * t.rows * t.cols, tlo = std::max(off[k], lo), thi = std::min(off[k] + numel, hi);
            if (!t.learned || thi <= tlo) continue;
            adamw_v1<<<fox_blocks(thi - tlo, 256), 256>>>(d_w1 + tlo, t.copy ? d_wbf1 + boff[k] : nullptr, d_g + tlo,
                                                          d_m1 + (tlo - lo), d_v1 + (tlo - lo), thi - tlo, tlo - off[k],
                                                          t.rows * t.cols, (t.rows_pad - t.rows) * t.cols, st, decay[k]);
            FOX_LAUNCH_CHECK();
        }
    };
    auto v2 = [&] { fox_adamw(d_w, d_g, d_m, d_v, lo, hi, T, st, 0); };

    // fp64 reference from the math (the clip factor from the reference norm); untouched outside the shard
    // and in the tensor that is not learned
    const double kc = norm > clip ? clip / (sqrt(ss) + 1e-6) : 1.0;
    std::vector<double> rw(w.begin(), w.end()), rm(m.begin(), m.end()), rv(v.begin(), v.end()), rbf(nbf, NAN);
    for (size_t k = 0; k < ts.size(); k++) {
        const Tensor &t = ts[k];
        const size_t ln = t.rows * t.cols, numel = t.layers * ln;
        for (size_t j = 0; j < numel; j++) {
            const size_t f = off[k] + j;
            const bool upd = t.learned && f >= lo && f < hi;
            if (upd) {
                const double gi = g[f] * kc, dec = t.decay ? 1.0 - lr * wd : 1.0;
                rm[f - lo] = beta1 * m[f - lo] + (1 - beta1) * gi;
                rv[f - lo] = beta2 * v[f - lo] + (1 - beta2) * gi * gi;
                rw[f] = w[f] * dec - lr * (rm[f - lo] / st.bc1) / (sqrt(rv[f - lo] / st.bc2) + eps);
            }
            if (t.copy && upd) rbf[boff[k] + j / ln * t.rows_pad * t.cols + j % ln] = rw[f];
        }
    }
    poison(d_wbf, nbf);
    poison(d_wbf1, nbf);
    v1();
    v2();
    check_f32(ga, "w", d_w, rw, TOL_F32);
    check_f32(ga, "m", d_m, rm, TOL_F32);
    check_f32(ga, "v", d_v, rv, TOL_F32);
    {  // the bf16 copy where updated; elsewhere (padding, outside the shard) the poison must stay
        std::vector<bf16> wb = to_host(d_wbf, nbf);
        std::vector<double> got, ref;
        size_t touched = 0;
        for (size_t i = 0; i < nbf; i++) {
            unsigned short u;
            memcpy(&u, &wb[i], 2);
            if (std::isnan(rbf[i])) touched += u != 0xFFFF;
            else got.push_back(bf(wb[i])), ref.push_back(rbf[i]);
        }
        check_values(ga, "w bf16", got, ref, TOL_BF16);
        printf("    %-14s %zu padding / outside-shard entries written  %s\n", "w bf16 [rest]", touched, touched ? "FAIL" : "ok");
        if (touched) ga.ok = false, kc_failures++;
    }
    {  // version 2 against version 1, bitwise
        auto same_f = [](const float *x, const float *y, size_t k) {
            return !memcmp(to_host(x, k).data(), to_host(y, k).data(), k * sizeof(float));
        };
        bool same = same_f(d_w, d_w1, n) && same_f(d_m, d_m1, ns) && same_f(d_v, d_v1, ns);
        std::vector<bf16> a = to_host(d_wbf, nbf), b = to_host(d_wbf1, nbf);
        same = same && !memcmp(a.data(), b.data(), nbf * sizeof(bf16));
        printf("    %-14s %s\n", "= version 1", same ? "bitwise ok" : "FAIL");
        if (!same) ga.ok = false, kc_failures++;
    }

    // repeats keep stepping the same tensors: same bytes. Bytes: w, g, m, v in; w, m, v, bf16 copy out
    double tn = time_ms(gradnorm), t1 = time_ms(v1), t2 = time_ms(v2);
    summary("adamw", "grad norm", shape, gn, tn, n * 4.0);
    summary("adamw", "v1 adamw per tensor", shape, ga, t1, ns * (16.0 + 12.0) + nbf * 2.0);
    summary("adamw", "v2 adamw one launch", shape, ga, t2, ns * (16.0 + 12.0) + nbf * 2.0);
    float *fl[] = {d_w, d_g, d_m, d_v, d_part, d_w1, d_m1, d_v1};
    for (float *p : fl) cudaFree(p);
    cudaFree(d_ss);
    cudaFree(d_wbf);
    cudaFree(d_wbf1);
}

// The tensors of a fox-pro model of the given shape, as train_fox.cu lays them out and pads its bf16 copies.
static std::vector<Tensor> fox_pro_tensors(int V, int L, int D, int H) {
    FoxConfig c;
    fox_config_defaults(&c);
    c.vocab_size = V;
    c.n_layer = L;
    c.d_model = D;
    c.n_head = H;
    fox_config_apply_preset(&c, "fox-pro");
    FoxLayout lay;
    fox_layout(&c, &lay);
    const size_t ninp = (fox_attn_cols(&c).width + 63) / 64 * 64, vp = (c.vocab_size + 63) / 64 * 64;
    std::vector<Tensor> ts;
    for (int k = 0; k < FOX_NUM_PARAMS; k++) {
        const FoxParamInfo *p = &lay.p[k];
        if (!p->numel) continue;
        bool copy = k == FOX_P_attn_in_w || k == FOX_P_attn_out_w || k == FOX_P_mlp_in_w || k == FOX_P_mlp_out_w ||
                    k == FOX_P_lm_head_w;
        size_t rows_pad = k == FOX_P_attn_in_w ? ninp : k == FOX_P_lm_head_w ? vp : p->rows;
        ts.push_back({p->layered ? (size_t)L : 1, p->rows, rows_pad, p->cols, p->decay != 0, true, copy});
    }
    return ts;
}

int main() {
    print_device();
    run("one bias", {{1, 1, 1, 1, true, true, false}}, 0.5, 0.0, 1.0);
    // odd sizes and offsets: a norm weight (no decay), a fixed gate bias (not learned), a padded GEMM weight
    const std::vector<Tensor> mixed = {{1, 1, 1, 7, false, true, false},
                                       {3, 1, 1, 5, false, false, false},
                                       {3, 255, 256, 769, true, true, true},
                                       {1, 1, 1, 3, false, true, false},
                                       {2, 100, 128, 33, true, true, true}};
    run("mixed", mixed, 0.01, 0.0, 1.0);                           // just clipped
    run("mixed", mixed, 1.0, 0.0, 1.0);                            // clipped hard
    run("mixed shard", mixed, 1.0, 0.3, 0.8);                      // a ZeRO-1 shard with both ends inside tensors
    run("mixed last shard", mixed, 1.0, 0.5, 1.0);
    run("layered", {{12, 1000, 1024, 768, true, true, true}}, 1.0, 0.0, 1.0);  // the padded bf16 copy
    // every tensor of a fox-pro model (the vocabulary small, and not a multiple of 64: the lm_head copy is padded)
    run("fox-pro 6x512", fox_pro_tensors(5000, 6, 512, 8), 0.1, 0.0, 1.0);
    run("fox-pro 6x512 shard", fox_pro_tensors(5000, 6, 512, 8), 0.1, 0.25, 0.75);
    return kc_finish("adamw");
}
