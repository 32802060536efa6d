// dev/cuda/crossentropy.cu: checks the fused softmax cross entropy of fox/kernels.cuh against an fp64 CPU
// reference, then times it, with train_fox.cu's launches: crossentropy_forward_kernel (per-position loss
// and lse, fp32, from bf16 logits of which the first V of VP columns are real) and
// crossentropy_backward_kernel (dlogits = (softmax − onehot)·scale in place, bf16, padding columns 0).
// The padding columns are filled with large values here, so a kernel that read them would fail.
//   make crossentropy && ./crossentropy
#include "kcheck.h"

static void run(int rows, int V, int VP) {
    std::string shape = fmt("rows=%d V=%d VP=%d", rows, V, VP);
    printf("crossentropy %s\n", shape.c_str());
    const size_t n = (size_t)rows * VP;
    std::vector<bf16> z(n);
    std::vector<int> tg(rows);
    for (int r = 0; r < rows; r++) {
        const double s = uniform(0.5, 4.0);  // per-row logit scale: flat to peaked softmaxes
        for (int i = 0; i < VP; i++) z[(size_t)r * VP + i] = __float2bfloat16((float)(i < V ? s * uniform(-4, 4) : 80.0));
        tg[r] = r == 0 ? 0 : r == 1 ? V - 1 : (int)(urand() * V);
        if (r % 3 == 2) z[(size_t)r * VP + tg[r]] = __float2bfloat16(30.0f);  // a confident row: loss ~ 0
    }
    const float scale = 1.0f / (float)rows;  // dloss_scale / N
    bf16 *d_z = to_device(z);
    int *d_tg = to_device(tg);
    float *d_loss = dmalloc<float>(rows), *d_lse = dmalloc<float>(rows);

    std::vector<double> rloss(rows), rlse(rows), rdz(n), xdz(n);
    for (int r = 0; r < rows; r++) {
        const bf16 *zr = &z[(size_t)r * VP];
        double m = -INFINITY, s = 0;
        for (int i = 0; i < V; i++) m = std::max(m, bf(zr[i]));
        for (int i = 0; i < V; i++) s += exp(bf(zr[i]) - m);
        const double l = m + log(s);
        rlse[r] = l;
        rloss[r] = l - bf(zr[tg[r]]);
        for (int i = 0; i < VP; i++) {
            const double p = i < V ? exp(bf(zr[i]) - l) : 0.0;
            rdz[(size_t)r * VP + i] = (p - (i == tg[r] ? 1.0 : 0.0)) * scale;
            // p = expf(z − lse) with lse in fp32 carries an absolute error ~p·|lse|·2^-24 (a few ulps);
            // for the target of a confident row (p ≈ 1) p − 1 is that error's size: allow 16 ulps.
            xdz[(size_t)r * VP + i] = 0x1p-20 * scale * p * std::max(1.0, fabs(l));
        }
    }
    auto fwd = [&] {
        crossentropy_forward_kernel<<<rows, CE_THREADS>>>(d_loss, d_lse, d_z, d_tg, V, VP);
        FOX_LAUNCH_CHECK();
    };
    auto bwd = [&] {
        crossentropy_backward_kernel<<<rows, CE_THREADS>>>(d_z, d_lse, d_tg, V, VP, scale);
        FOX_LAUNCH_CHECK();
    };
    Group gf, gb;
    poison(d_loss, rows);
    poison(d_lse, rows);
    fwd();
    check_f32(gf, "loss", d_loss, rloss, TOL_F32);
    check_f32(gf, "lse", d_lse, rlse, TOL_F32);
    bwd();
    check_values(gb, "dlogits", widen(to_host(d_z, n)), rdz, TOL_BF16, &xdz);
    {  // the padding columns must be exactly 0
        std::vector<bf16> dz = to_host(d_z, n);
        size_t nz = 0;
        for (int r = 0; r < rows; r++)
            for (int i = V; i < VP; i++) nz += bf(dz[(size_t)r * VP + i]) != 0.0;
        printf("    %-14s %zu nonzero padding entries  %s\n", "dlogits[pad]", nz, nz ? "FAIL" : "ok");
        if (nz) gb.ok = false, kc_failures++;
    }

    // timing on fresh logits each time for the backward (it works in place): restore from a copy
    // outside the timed region is not possible per launch, so time the forward on the original logits
    // and the backward on its own output (same arithmetic, same bytes)
    upload(d_z, z);
    double tf = time_ms(fwd);
    double tb = time_ms(bwd);
    summary("crossentropy", "fwd", shape, gf, tf, (double)rows * V * 2.0 + rows * 12.0);
    summary("crossentropy", "bwd", shape, gb, tb, (double)rows * V * 2.0 + n * 2.0 + rows * 8.0);
    cudaFree(d_z); cudaFree(d_tg); cudaFree(d_loss); cudaFree(d_lse);
}

int main() {
    print_device();
    const int rows[] = {1, 7, 255, 1000};
    for (int r : rows) run(r, 50257, 50304);  // GPT-2 vocabulary padded to a multiple of 64
    run(7, 64, 64);
    run(255, 1000, 1024);
    run(2048, 50257, 50304);  // 206 MB of logits
    return kc_finish("crossentropy");
}
