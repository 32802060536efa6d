// dev/cuda/forget_gate.cu: checks the forget-gate kernels against an fp64 CPU reference, then times them,
// with train_fox.cu's launches:
//   forward:  fox_forget_gate_forward (fox/forget_gate.cuh): c_t = Σ_{l≤t} log σ(b_h + proj[t, f+h]) (fp32 scan per (b, h))
//   backward: fox_attention_reverse_scan (fox/forget_gate.cuh; the last step of the attention backward:
//             dc += dS column sums, dlogf_t = Σ_{i≥t} dc_i, a true reverse scan), forget_gate_backward_kernel
//             (d logit = dlogf·σ(−logit) into dproj's forget column and dfg) and colsum_accumulate (bias
//             gradient).
// Data-dependent gate (cf >= 0), data-independent (cf < 0, bias only) and none (bias NULL: the forward only,
// as train_fox runs it for the Transformer presets under the document mask). With the document mask
// (docs/model.md §1.8; tokens with separators at random, position 0 among them): log f = FOX_DOC_LOG_F at a
// separator (replacing the gate's value) and d logit = 0 there.
// proj as train_fox.cu keeps it (fox/proj.cuh), in fox-pro's column layout: the q, k, v and output-gate columns
// bf16 (N, 4D; noise, not read), the per-head logits fp32 (N, ldl), the forget logits f = 4D + 2H among them;
// dproj one bf16 array of rows 4D + ldl.
//   make forget_gate && ./forget_gate
#include "kcheck.h"
#include "../../fox/forget_gate.cuh"  // fox_forget_gate_forward, fox_attention_reverse_scan, forget_gate_backward_kernel
#include "../../fox/rows.cuh"       // colsum_accumulate, colsum_scratch_floats

enum { GATE_DATA_DEP, GATE_BIAS_ONLY, GATE_NONE };

struct Cfg {
    int B, T, H;
    int gate;       // GATE_*
    double doc_p;   // > 0: the document mask, a separator at each position with this probability (and at 0)
};

static void run(const Cfg &c) {
    const int B = c.B, T = c.T, H = c.H, N = B * T, sep = c.doc_p > 0 ? 7 : -1, gated = c.gate != GATE_NONE;
    const bool data_dep = c.gate == GATE_DATA_DEP;
    // ld: dproj's row stride (proj_ld), a multiple of 64 as train_fox.cu pads it (ldw = 4D is one)
    const int D = 64 * H, cf = data_dep ? 4 * D + 2 * H : -1, ldw = 4 * D, ldl = (3 * H + 63) / 64 * 64, ld = ldw + ldl;
    std::string shape = fmt("B=%d T=%d H=%d%s%s", B, T, H, data_dep ? "" : gated ? " bias-only" : " no-gate",
                            sep >= 0 ? fmt(" docs(p=%.2g)", c.doc_p).c_str() : "");
    printf("forget_gate %s\n", shape.c_str());
    const size_t nv = (size_t)N * H;
    // only the forget column matters; the rest of the projection is noise
    std::vector<bf16> wide = rand_bf16((size_t)N * ldw, -6, 6);
    std::vector<float> logits = rand_f32((size_t)N * ldl, -6, 6), bias = rand_f32(H, 0.0, 4.0), dc = rand_f32(nv, -1, 1),
                       xc = rand_f32(nv, -1, 1), db0 = rand_f32(H, -1, 1);
    std::vector<int> tokens = random_tokens(N, sep, c.doc_p);
    float *d_logits = to_device(logits), *d_bias = to_device(bias), *d_c = dmalloc<float>(nv), *d_dc = dmalloc<float>(nv),
          *d_xc = to_device(xc), *d_dlogf = dmalloc<float>(nv), *d_dfg = dmalloc<float>(nv), *d_db = dmalloc<float>(H),
          *d_part = dmalloc<float>(colsum_scratch_floats(N, H));
    int *d_tokens = to_device(tokens);
    bf16 *d_wide = to_device(wide), *d_dproj = dmalloc<bf16>((size_t)N * ld);
    const Proj proj = {d_wide, d_logits, ldw, ldl};
    auto at_sep = [&](size_t nn) { return sep >= 0 && tokens[nn] == sep; };

    // fp64 reference: c in (B, H, T); dc, xc, dlogf in (B, H, T); dfg (N, H)
    std::vector<double> rc(nv), rdcsum(nv), rdlogf(nv), rdl(nv), rdfg(nv), rdb(H);
    for (int h = 0; h < H; h++) rdb[h] = db0[h];
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const size_t bh = ((size_t)b * H + h) * T;
            double acc = 0;
            for (int t = 0; t < T; t++) {
                const size_t nn = (size_t)b * T + t;
                const double logit = bias[h] + (data_dep ? logits[nn * ldl + cf - ldw + h] : 0.0);
                // log σ(logit), 0 without a gate, FOX_DOC_LOG_F (replacing it) at a separator
                acc += at_sep(nn) ? (double)FOX_DOC_LOG_F : gated ? -log1p(exp(-logit)) : 0.0;
                rc[bh + t] = acc;
            }
            double racc = 0;
            for (int t = T - 1; t >= 0; t--) {
                const size_t nn = (size_t)b * T + t;
                rdcsum[bh + t] = (double)dc[bh + t] + xc[bh + t];
                racc += rdcsum[bh + t];
                rdlogf[bh + t] = racc;
                const double logit = bias[h] + (data_dep ? logits[nn * ldl + cf - ldw + h] : 0.0);
                const double d = at_sep(nn) ? 0.0 : racc * sigmoid_d(-logit);
                rdl[nn * H + h] = d;
                rdfg[nn * H + h] = d;
                rdb[h] += d;
            }
        }

    const int *tok = sep >= 0 ? d_tokens : nullptr;
    auto fwd = [&] {
        fox_forget_gate_forward(d_c, proj, cf, gated ? d_bias : nullptr, tok, sep, B, H, T, 0);
    };
    auto bwd = [&] {
        fox_attention_reverse_scan(d_dc, d_xc, d_dlogf, B * H, T, 0);
        forget_gate_backward_kernel<<<fox_blocks((size_t)N * H, 256), 256>>>(d_dproj, d_dfg, d_dlogf, proj, cf, d_bias,
                                                                             tok, sep, B, H, T);
        FOX_LAUNCH_CHECK();
        colsum_accumulate(d_db, d_dfg, N, H, H, d_part, 0);
    };
    Group gf, gb;
    poison(d_c, nv);
    fwd();
    check_f32(gf, "c (scan)", d_c, rc, TOL_F32_RED);
    double tf = time_ms(fwd);
    const double lg = data_dep ? 4.0 : 0.0, tk = sep >= 0 ? 4.0 : 0.0;
    summary("forget_gate", "fwd scan", shape, gf, tf, nv * (lg + 4.0) + N * tk);
    if (!gated) {  // no gate: nothing to differentiate (train_fox runs no gate backward)
        float *fl[] = {d_logits, d_bias, d_c, d_dc, d_xc, d_dlogf, d_dfg, d_db, d_part};
        for (float *p : fl) cudaFree(p);
        cudaFree(d_wide);
        cudaFree(d_dproj);
        cudaFree(d_tokens);
        return;
    }

    upload(d_dc, dc);
    upload(d_db, db0);
    poison(d_dlogf, nv);
    poison(d_dfg, nv);
    poison(d_dproj, (size_t)N * ld);
    bwd();
    check_f32(gb, "dc + colsum", d_dc, rdcsum, TOL_F32);
    check_f32(gb, "dlogf (rscan)", d_dlogf, rdlogf, TOL_F32_RED);
    check_f32(gb, "dfg", d_dfg, rdfg, TOL_F32_RED);
    if (data_dep) {
        std::vector<bf16> dp = to_host(d_dproj, (size_t)N * ld);
        std::vector<double> v(nv);
        for (int nn = 0; nn < N; nn++)
            for (int h = 0; h < H; h++) v[(size_t)nn * H + h] = bf(dp[(size_t)nn * ld + cf + h]);
        check_values(gb, "dproj[f]", v, rdl, TOL_BF16);
    }
    check_f32(gb, "dbias (colsum)", d_db, rdb, TOL_F32_RED);

    // the backward reads dc in place: restore it between repeats would add a copy; the scan does the
    // same work whatever dc holds, so repeats run on the accumulated dc
    double tb = time_ms(bwd);
    // rscan: dc, xc in, dc, dlogf out; backward: dlogf (+ logit, token) in, dproj, dfg out; colsum: dfg in
    summary("forget_gate", "bwd(rscan+gate+colsum)", shape, gb, tb,
            nv * (16.0 + 4.0 + lg + (data_dep ? 2.0 : 0.0) + 4.0 + 4.0 + tk));
    float *fl[] = {d_logits, d_bias, d_c, d_dc, d_xc, d_dlogf, d_dfg, d_db, d_part};
    for (float *p : fl) cudaFree(p);
    cudaFree(d_wide);
    cudaFree(d_dproj);
    cudaFree(d_tokens);
}

int main() {
    print_device();
    const int Ts[] = {1, 7, 255, 1000, 1025, 4099};  // 1025, 4099: chunk sizes 2 and 5 with a ragged last chunk
    for (int T : Ts) run({2, T, 12, GATE_DATA_DEP, 0.0});
    run({2, 1000, 1, GATE_DATA_DEP, 0.0});
    run({2, 1000, 12, GATE_BIAS_ONLY, 0.0});
    // the document mask: separators at random (a few per sequence, and runs of them at p = 0.3)
    run({2, 1000, 12, GATE_DATA_DEP, 0.01});
    run({2, 1025, 12, GATE_DATA_DEP, 0.3});
    run({2, 1000, 12, GATE_BIAS_ONLY, 0.01});
    run({2, 1000, 12, GATE_NONE, 0.01});
    run({1, 16384, 24, GATE_DATA_DEP, 0.0});  // 760M: one sequence of 16k, 24 heads
    run({8, 16384, 24, GATE_DATA_DEP, 0.0});  // 8 sequences: enough blocks to fill the GPU
    return kc_finish("forget_gate");
}
