// dev/cuda/output_gate.cu: checks the attention-output kernels of fox/output_gate.cuh against an fp64 CPU
// reference, then times them: z = RMSNorm_head(o) ⊙ σ(g) (fox_output_forward: output_forward_kernel on the
// (64 tokens, head) grid, a warp a token at a time) and its backward fox_output_backward (output_backward_kernel
// on the same grid: d_o, the gate's dproj columns, the norm weight's block partials, then their column sums; and
// z again, which must equal the forward's bitwise: the trainer keeps no per-block copy of it), as train_fox.cu
// launches them (E = dh/32). proj as train_fox.cu keeps it (fox/proj.cuh), in fox-pro's column layout: the q, k, v
// and gate columns bf16 (N, 4D; the gate g at 3D, the rest 0: not read), the per-head logits fp32 (N, ldl; 0, not
// read); dproj one bf16 array of rows 4D + ldl. The reference reads g as the kernels do, rounded to bf16.
//   make output_gate && ./output_gate
#include "kcheck.h"
#include "../../fox/output_gate.cuh"   // fox_output_forward/backward

struct Cfg {
    int B, T, H, dh;
    bool norm, gate;
};

static void run(const Cfg &c) {
    const int N = c.B * c.T, H = c.H, dh = c.dh, D = H * dh;
    // fox-pro's column layout; ld: dproj's row stride (proj_ld), a multiple of 64 as train_fox.cu pads it
    const int ldw = 4 * D, ldl = (3 * H + 63) / 64 * 64, ld = ldw + ldl, cg = c.gate ? 3 * D : -1;
    std::string shape = fmt("B=%d T=%d H=%d dh=%d%s%s", c.B, c.T, H, dh, c.norm ? "" : " no-norm", c.gate ? "" : " no-gate");
    printf("output_gate %s\n", shape.c_str());
    const size_t n = (size_t)N * D;
    std::vector<bf16> o(n);
    for (size_t r = 0; r < (size_t)N * H; r++) {  // per-head scales, so rstd varies
        double s = uniform(0.05, 3.0);
        for (int i = 0; i < dh; i++) o[r * dh + i] = __float2bfloat16((float)(s * uniform(-1, 1)));
    }
    std::vector<bf16> wide((size_t)N * ldw, __float2bfloat16(0.0f));
    std::vector<float> logits((size_t)N * ldl, 0.0f), ow = rand_f32(D, 0.5, 1.5), dz = rand_f32(n, -1, 1),
                       dow0 = rand_f32(D, -1, 1);
    for (int nn = 0; nn < N; nn++)  // the gate columns (the rest of the projection is not read)
        for (int k = 0; k < D; k++) wide[(size_t)nn * ldw + 3 * D + k] = __float2bfloat16((float)uniform(-6, 6));
    bf16 *d_o_in = to_device(o), *dz_out = dmalloc<bf16>(n), *dd_o = dmalloc<bf16>(n), *dz2 = dmalloc<bf16>(n),
         *ddproj = dmalloc<bf16>((size_t)N * ld), *dwide = to_device(wide);
    float *dlogits = to_device(logits), *dow = c.norm ? to_device(ow) : nullptr, *ddz = to_device(dz),
          *drows = dmalloc<float>(colsum_rows_floats(N, D)), *ddow = dmalloc<float>(D),
          *dpart = dmalloc<float>(colsum_scratch_floats(N, D));
    const Proj proj = {dwide, dlogits, ldw, ldl};

    std::vector<double> z(n), rdo(n), rdg(n), rdow(D);
    for (int i = 0; i < D; i++) rdow[i] = dow0[i];
    for (int nn = 0; nn < N; nn++)
        for (int h = 0; h < H; h++) {
            const size_t base = (size_t)nn * D + (size_t)h * dh;
            double ss = 0;
            for (int i = 0; i < dh; i++) ss += bf(o[base + i]) * bf(o[base + i]);
            const double rs = c.norm ? 1.0 / sqrt(ss / dh + (double)FOX_NORM_EPS) : 1.0;
            std::vector<double> don(dh);
            double dot = 0;
            for (int i = 0; i < dh; i++) {
                const int k = h * dh + i;
                const double xh = bf(o[base + i]) * rs, on = c.norm ? xh * ow[k] : xh;
                const double sg = c.gate ? sigmoid_d(bf(wide[(size_t)nn * ldw + cg + k])) : 1.0;
                z[base + i] = on * sg;
                rdg[base + i] = dz[base + i] * on * sg * (1.0 - sg);
                don[i] = dz[base + i] * sg;
                if (c.norm) dot += don[i] * ow[k] * xh;
            }
            dot /= dh;
            for (int i = 0; i < dh; i++) {
                const int k = h * dh + i;
                const double xh = bf(o[base + i]) * rs;
                rdo[base + i] = c.norm ? rs * (don[i] * ow[k] - xh * dot) : don[i];
                if (c.norm) rdow[k] += don[i] * xh;
            }
        }

    auto fwd = [&] { fox_output_forward(dz_out, d_o_in, proj, cg, dow, N, H, dh, 0); };
    auto bwd = [&] {
        fox_output_backward(dd_o, ddproj, dz2, ddow, ddz, d_o_in, proj, cg, dow, N, H, dh, drows, dpart, 0);
    };
    Group gf, gb;
    poison(dz_out, n);
    fwd();
    check_bf16(gf, "z", dz_out, z);
    poison(dd_o, n);
    poison(ddproj, (size_t)N * ld);
    poison(dz2, n);
    upload(ddow, dow0);
    bwd();
    check_bf16(gb, "d_o", dd_o, rdo);
    bool same = !memcmp(to_host(dz2, n).data(), to_host(dz_out, n).data(), n * sizeof(bf16));
    printf("    %-14s %s\n", "z = fwd z", same ? "bitwise ok" : "FAIL");
    if (!same) gb.ok = false, kc_failures++;
    if (c.gate) {
        std::vector<bf16> dp = to_host(ddproj, (size_t)N * ld);
        std::vector<double> g(n);
        for (int nn = 0; nn < N; nn++)
            for (int k = 0; k < D; k++) g[(size_t)nn * D + k] = bf(dp[(size_t)nn * ld + cg + k]);
        check_values(gb, "dproj[gate]", g, rdg, TOL_BF16);
    }
    if (c.norm) check_f32(gb, "dow (colsum)", ddow, rdow, TOL_F32_RED);

    double tf = time_ms(fwd), tb = time_ms(bwd);
    // fwd: o, gate (bf16) in, z (bf16) out; bwd: dz (fp32), o, gate in; d_o, dproj, z (bf16) out
    const double gt = c.gate ? 2.0 : 0.0;
    summary("output_gate", "fwd", shape, gf, tf, n * (2.0 + gt + 2.0));
    summary("output_gate", "bwd+colsum (+z)", shape, gb, tb, n * (4.0 + 2.0 + gt + 2.0 + (c.gate ? 2.0 : 0.0) + 2.0));
    cudaFree(d_o_in); cudaFree(dz_out); cudaFree(dz2); cudaFree(dd_o); cudaFree(ddproj); cudaFree(dwide); cudaFree(dlogits);
    if (dow) cudaFree(dow);
    cudaFree(ddz); cudaFree(drows); cudaFree(ddow); cudaFree(dpart);
}

int main() {
    print_device();
    const int Ts[] = {1, 7, 255, 1000};
    for (int T : Ts) run({2, T, 1, 64, true, true});    // D = 64
    for (int T : Ts) run({2, T, 12, 64, true, true});   // D = 768 (125M)
    for (int T : Ts) run({2, T, 12, 128, true, true});  // D = 1536, dh 128
    run({2, 255, 12, 64, false, true});
    run({2, 255, 12, 64, true, false});
    run({1, 16384, 24, 64, true, true});  // 760M: D = 1536, 24 heads of 64
    run({1, 16384, 12, 128, true, true});
    return kc_finish("output_gate");
}
