// dev/cuda/rmsnorm.cu: checks the residual-stream RMSNorm of fox/kernels.cuh against an fp64 CPU
// reference, then times it, through the launchers train_fox.cu calls. Forward: fox_rmsnorm_forward
// (fp32 in, bf16 out). Backward: fox_rmsnorm_backward (dres = dx, or dres += dx; dres_bf; dw's block
// partials, then their column sums: dw += Σ_rows dy⊙x̂; and the forward's output again, which must equal
// the forward's bitwise: the trainer keeps no per-block copy of it).
//   make rmsnorm && ./rmsnorm
#include "kcheck.h"

static void launch_fwd(bf16 *out, const float *x, const float *w, int N, int D) { fox_rmsnorm_forward(out, x, w, N, D, 0); }
static void launch_bwd(float *dres, bf16 *dres_bf, bf16 *xn, float *rows, float *dw, float *part, const float *dy,
                       const float *x, const float *w, int N, int D, int acc) {
    fox_rmsnorm_backward(dres, dres_bf, xn, dw, dy, x, w, N, D, acc, rows, part, 0);
}

static void run(int N, int D) {
    std::string shape = fmt("N=%d D=%d", N, D);
    printf("rmsnorm %s\n", shape.c_str());
    const size_t n = (size_t)N * D;
    // rows with different scales, so rstd varies
    std::vector<float> x(n), w = rand_f32(D, 0.5, 1.5), dy = rand_f32(n, -1, 1), dres0 = rand_f32(n, -1, 1),
                             dw0 = rand_f32(D, -1, 1);
    for (int r = 0; r < N; r++) {
        double s = uniform(0.05, 5.0);
        for (int i = 0; i < D; i++) x[(size_t)r * D + i] = (float)(s * uniform(-1, 1));
    }
    float *dx_in = to_device(x), *dw_ = to_device(w), *ddy = to_device(dy), *ddres = dmalloc<float>(n),
          *drows = dmalloc<float>(colsum_rows_floats(N, D)), *ddw = dmalloc<float>(D), *dpart = dmalloc<float>(colsum_scratch_floats(N, D));
    bf16 *dout = dmalloc<bf16>(n), *ddres_bf = dmalloc<bf16>(n), *dxn = dmalloc<bf16>(n);

    // fp64 reference
    std::vector<double> out(n), dx(n), dwr(D, 0.0);
    for (int r = 0; r < N; r++) {
        const float *xr = &x[(size_t)r * D], *g = &dy[(size_t)r * D];
        double ss = 0;
        for (int i = 0; i < D; i++) ss += (double)xr[i] * xr[i];
        const double rs = 1.0 / sqrt(ss / D + (double)FOX_NORM_EPS);
        double dot = 0;
        for (int i = 0; i < D; i++) dot += (double)g[i] * w[i] * xr[i] * rs;
        dot /= D;
        for (int i = 0; i < D; i++) {
            out[(size_t)r * D + i] = xr[i] * rs * w[i];
            dx[(size_t)r * D + i] = rs * ((double)g[i] * w[i] - xr[i] * rs * dot);
            dwr[i] += (double)g[i] * xr[i] * rs;
        }
    }

    Group gf;
    poison(dout, n);
    launch_fwd(dout, dx_in, dw_, N, D);
    check_bf16(gf, "out", dout, out);
    std::vector<bf16> fwd_out = to_host(dout, n);

    Group gb;
    for (int acc = 0; acc < 2; acc++) {
        upload(ddres, dres0);
        if (!acc) poison(ddres, n);
        upload(ddw, dw0);
        poison(ddres_bf, n);
        poison(dxn, n);
        launch_bwd(ddres, ddres_bf, dxn, drows, ddw, dpart, ddy, dx_in, dw_, N, D, acc);
        std::vector<double> rres(n), rdw(D);
        for (size_t i = 0; i < n; i++) rres[i] = dx[i] + (acc ? dres0[i] : 0.0);
        for (int i = 0; i < D; i++) rdw[i] = dwr[i] + dw0[i];
        check_f32(gb, acc ? "dres (acc)" : "dres", ddres, rres, TOL_F32);
        check_bf16(gb, acc ? "dres_bf (acc)" : "dres_bf", ddres_bf, rres);
        check_f32(gb, acc ? "dw (acc)" : "dw", ddw, rdw, TOL_F32_RED);
        bool same = !memcmp(to_host(dxn, n).data(), fwd_out.data(), n * sizeof(bf16));
        printf("    %-14s %s\n", "xn = fwd out", same ? "bitwise ok" : "FAIL");
        if (!same) gb.ok = false, kc_failures++;
    }

    // timing: fwd; bwd with accumulate (what the blocks do); bytes each input once, each output once
    double tf = time_ms([&] { launch_fwd(dout, dx_in, dw_, N, D); });
    double tb = time_ms([&] { launch_bwd(ddres, ddres_bf, dxn, drows, ddw, dpart, ddy, dx_in, dw_, N, D, 1); });
    double bf_ = n * (4.0 + 2.0) + D * 4.0;
    // dy, x, dres in; dres, dres_bf, xn out (the block partials and dw are O(N·D/32))
    double bb = n * (4.0 + 4.0 + 4.0 + 4.0 + 2.0 + 2.0) + D * 12.0;
    summary("rmsnorm", "fwd", shape, gf, tf, bf_);
    summary("rmsnorm", "bwd+colsum", shape, gb, tb, bb);
    cudaFree(dx_in); cudaFree(dw_); cudaFree(ddy); cudaFree(ddres); cudaFree(drows); cudaFree(ddw); cudaFree(dpart);
    cudaFree(dout); cudaFree(ddres_bf); cudaFree(dxn);
}

int main() {
    print_device();
    const int Ds[] = {64, 768, 1536}, Ns[] = {1, 7, 255, 1000};
    for (int D : Ds)
        for (int N : Ns) run(N, D);
    run(16384, 768);
    run(16384, 1536);
    return kc_finish("rmsnorm");
}
