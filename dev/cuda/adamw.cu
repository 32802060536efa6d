// dev/cuda/adamw.cu: checks the optimizer kernels of fox/kernels.cuh against an fp64 CPU reference, then
// times them, with train_fox.cu's launches and arithmetic (grad_norm, optimizer_step):
//   grad norm: sumsq_partial_kernel + sumsq_final_kernel (fixed-order Σ g², double result);
//   clipping:  gscale = clip/(norm + 1e-6) when norm > clip (torch clip_grad_norm_), folded into AdamW;
//   adamw_kernel: m, v, decoupled decay, update, and the bf16 copy with per-layer row padding (the padding
//   must stay untouched), launched in two parts split inside the tensor (a ZeRO-1 shard boundary).
//   make adamw && ./adamw
#include "kcheck.h"

struct Cfg {
    size_t layers, rows, rows_pad, cols;
    double gmag;  // gradient scale: sets whether the clip engages
    bool decay;
};

static void run(const Cfg &c) {
    const size_t layer_numel = c.rows * c.cols, n = c.layers * layer_numel, pad = (c.rows_pad - c.rows) * c.cols;
    const size_t nbf = c.layers * c.rows_pad * c.cols;
    std::string shape = fmt("%zux%zux%zu(pad %zu) |g|~%g%s", c.layers, c.rows, c.cols, c.rows_pad, c.gmag,
                            c.decay ? "" : " no-decay");
    printf("adamw %s\n", shape.c_str());
    std::vector<float> w = rand_f32(n, -0.1, 0.1), g = rand_f32(n, -c.gmag, c.gmag), m = rand_f32(n, -1e-3, 1e-3), v(n);
    for (size_t i = 0; i < n; i++) v[i] = (float)uniform(1e-8, 1e-5);
    const double lr = 1e-3, wd = 0.1, clip = 1.0, beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
    const int t = 7;  // step (bias corrections)
    float *d_w = to_device(w), *d_g = to_device(g), *d_m = to_device(m), *d_v = to_device(v),
          *d_part = dmalloc<float>(SUMSQ_BLOCKS);
    double *d_ss = dmalloc<double>(1);
    bf16 *d_wbf = dmalloc<bf16>(nbf);

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

    AdamStep st;  // as optimizer_step builds it
    st.lr = lr;
    st.beta1 = beta1;
    st.beta2 = beta2;
    st.eps = eps;
    st.bc1 = 1.0 - pow(beta1, t);
    st.bc2 = 1.0 - pow(beta2, t);
    st.gscale = (clip > 0.0 && norm > clip) ? (float)(clip / (norm + 1e-6)) : 1.0f;
    st.decay = c.decay ? (double)(float)(1.0 - lr * wd) : 1.0;
    printf("    norm %.6g -> gscale %.6g\n", norm, (double)st.gscale);

    // fp64 reference from the math (the clip factor from the reference norm)
    const double k = norm > clip ? clip / (sqrt(ss) + 1e-6) : 1.0, dec = c.decay ? 1.0 - lr * wd : 1.0;
    std::vector<double> rw(n), rm(n), rv(n);
    for (size_t i = 0; i < n; i++) {
        const double gi = g[i] * k;
        rm[i] = beta1 * m[i] + (1 - beta1) * gi;
        rv[i] = beta2 * v[i] + (1 - beta2) * gi * gi;
        rw[i] = w[i] * dec - lr * (rm[i] / st.bc1) / (sqrt(rv[i] / st.bc2) + eps);
    }
    // in two launches split inside the tensor, as at a ZeRO-1 shard boundary (`first` > 0 for the second)
    const size_t split = n / 3;
    auto adam = [&] {
        if (split) {
            adamw_kernel<<<fox_blocks(split, 256), 256>>>(d_w, d_wbf, d_g, d_m, d_v, split, 0, layer_numel, pad, st);
            FOX_LAUNCH_CHECK();
        }
        adamw_kernel<<<fox_blocks(n - split, 256), 256>>>(d_w + split, d_wbf, d_g + split, d_m + split, d_v + split,
                                                          n - split, split, layer_numel, pad, st);
        FOX_LAUNCH_CHECK();
    };
    poison(d_wbf, nbf);
    adam();
    check_f32(ga, "w", d_w, rw, TOL_F32);
    check_f32(ga, "m", d_m, rm, TOL_F32);
    check_f32(ga, "v", d_v, rv, TOL_F32);
    {
        std::vector<bf16> wb = to_host(d_wbf, nbf);
        std::vector<double> got(n);
        size_t touched = 0;
        for (size_t l = 0; l < c.layers; l++) {
            for (size_t i = 0; i < layer_numel; i++) got[l * layer_numel + i] = bf(wb[l * c.rows_pad * c.cols + i]);
            for (size_t i = layer_numel; i < c.rows_pad * c.cols; i++) {
                unsigned short u;
                memcpy(&u, &wb[l * c.rows_pad * c.cols + i], 2);
                touched += u != 0xFFFF;
            }
        }
        check_values(ga, "w bf16", got, rw, TOL_BF16);
        printf("    %-14s %zu padding entries written  %s\n", "w bf16 [pad]", touched, touched ? "FAIL" : "ok");
        if (touched) ga.ok = false, kc_failures++;
    }

    double tn = time_ms(gradnorm), ta = time_ms(adam);  // repeats keep stepping the same tensors: same bytes
    summary("adamw", "grad norm", shape, gn, tn, n * 4.0);
    summary("adamw", "adamw", shape, ga, ta, n * (16.0 + 12.0 + 2.0));
    float *fl[] = {d_w, d_g, d_m, d_v, d_part};
    for (float *p : fl) cudaFree(p);
    cudaFree(d_ss);
    cudaFree(d_wbf);
}

int main() {
    print_device();
    run({1, 1, 1, 1, 0.5, true});           // one element (a bias)
    run({1, 1, 1, 7, 0.5, false});          // norm weights: no decay, no clip
    run({1, 255, 255, 769, 0.01, true});    // odd sizes, just clipped (norm 2.6)
    run({1, 255, 255, 769, 1.0, true});     // clipped hard (norm 255)
    run({12, 1000, 1024, 768, 1.0, true});  // layered with row padding (the padded bf16 copy)
    run({1, 12288, 12288, 4096, 0.1, true});  // 50M parameters, clipped
    return kc_finish("adamw");
}
