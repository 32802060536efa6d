// dev/cuda/output_gate.cu: checks the attention-output kernels against an fp64 CPU reference, then times them:
// z = RMSNorm_head(o) ⊙ σ(g) (fox_output_forward) and its backward fox_output_backward (d_o, the gate's dproj
// columns, the norm weight's block partials, then their column sums; and z again, which must equal the
// forward's bitwise: the trainer keeps no per-block copy of it), as train_fox.cu launches them.
// Versions (each checked against the reference, z bitwise between its forward and backward, timed side by side):
//   version 1 (until session 24): a warp a token at a time on the (64 tokens, head) grid, lane l holding elements
//     l + 32e (2-byte loads and stores), two tokens' norm reductions interleaved (head_warps.cuh).
//   version 2 (fox/kernels.cuh, session 24): in the attention inputs' walkers (HeadWalk: dh / 4 lanes a row, 4
//     adjacent elements a lane; 8-byte bf16 and 16-byte fp32 accesses), two rows at a time; the norm-weight
//     partials summed per walker. Its row sums add other pairs first: its bits differ from version 1's in the
//     last places.
// proj as train_fox.cu keeps it (fox/proj.cuh), in fox-pro's column layout: the q, k, v and gate columns bf16
// (N, 4D; the gate g at 3D, the rest 0: not read), the per-head logits fp32 (N, ldl; 0, not read); dproj one
// bf16 array of rows 4D + ldl. The reference reads g as the kernels do, rounded to bf16.
//   make output_gate && ./output_gate
#include "kcheck.h"
#include "head_warps.cuh"  // LAUNCH_HEAD_BLOCKS, head_partials_store: version 1

// Version 1's two tokens' inputs, rows nn and nn + FOX_WARPS (the second only when
// live[1]): o as x, the gate logits gl (0 without a gate), and each row's rstd rs (1 without the norm), the two
// reductions interleaved. The forward and the backward (which writes z again) take them from here, so their z
// agree bitwise.
template <int PER_LANE>
__device__ __forceinline__ void output_rows_load_v1(float x[2][PER_LANE], float gl[2][PER_LANE], float rs[2], const int live[2],
                                                 const bf16 *o, const Proj &proj, int cg, const float *ow, int nn,
                                                 int D, int hc) {
#pragma unroll
    for (int g = 0; g < 2; g++) {
        size_t n = (size_t)(nn + g * FOX_WARPS);
#pragma unroll
        for (int e = 0; e < PER_LANE; e++) {
            x[g][e] = live[g] ? __bfloat162float(o[n * D + hc + 32 * e]) : 0.0f;
            gl[g][e] = live[g] && cg >= 0 ? __bfloat162float(proj_wide_row(proj, n)[cg + hc + 32 * e]) : 0.0f;
        }
        rs[g] = head_sumsq<PER_LANE>(x[g]);
    }
    if (ow) warp_sums<2>(rs);
#pragma unroll
    for (int g = 0; g < 2; g++) rs[g] = ow ? head_rstd_of<PER_LANE>(rs[g], FOX_NORM_EPS) : 1.0f;
}

// Paper eq. 21 and 23: z = RMSNorm(o) ⊙ σ(W_g x) (output norm and output gate, each optional). CPU:
// rmsnorm_forward (per head) and output_gate_forward in attention_block_forward.
template <int PER_LANE>
__global__ void output_forward_v1(bf16 *z, const bf16 *o, const Proj proj, int cg, const float *ow, int N, int H) {
    constexpr int dh = 32 * PER_LANE;
    int lane = threadIdx.x % 32, h = blockIdx.x, hc = h * dh + lane, D = H * dh;
    int n1 = min(N, (int)(blockIdx.y + 1) * HEAD_BLOCK_ROWS);
    float w[PER_LANE] = {};
    if (ow) head_weights<PER_LANE>(w, ow + h * dh, lane);
    // two rows at a time (n and n + FOX_WARPS), their norms' reductions interleaved (warp_sums)
    for (int nn = blockIdx.y * HEAD_BLOCK_ROWS + threadIdx.x / 32; nn < n1; nn += 2 * FOX_WARPS) {
        int live[2] = {1, nn + FOX_WARPS < n1};
        float x[2][PER_LANE], gl[2][PER_LANE], rs[2];
        output_rows_load_v1<PER_LANE>(x, gl, rs, live, o, proj, cg, ow, nn, D, hc);
#pragma unroll
        for (int g = 0; g < 2; g++) {
            if (!live[g]) continue;
            size_t n = (size_t)(nn + g * FOX_WARPS);
#pragma unroll
            for (int e = 0; e < PER_LANE; e++) {
                float y = ow ? x[g][e] * rs[g] * w[e] : x[g][e];
                if (cg >= 0) y *= sigmoidf_(gl[g][e]);
                z[n * D + hc + 32 * e] = __float2bfloat16(y);
            }
        }
    }
}

static void output_forward_v1_launch(bf16 *z, const bf16 *o, const Proj &proj, int cg, const float *ow, int N, int H,
                                      int dh, cudaStream_t s) {
    LAUNCH_HEAD_BLOCKS(output_forward_v1, dh, N, H, s, z, o, proj, cg, ow, N, H);
}

// Backward of the above: dz (N, D) fp32 → d_o (N, D) bf16 (the attention's dO), the gate's dproj
// columns, and with the norm the block partials of its weight gradient Σ d(on)⊙ô (head_partials_store).
// z: the forward's output again, bitwise (head_sumsq, head_rstd_of: the same products), for the attn_out
// weight-gradient GEMM that follows, so the forward need not keep it per block (NULL where it did). Grid:
// (head, token block); a warp takes two tokens at a time (n and n + FOX_WARPS), their norms' reductions
// interleaved (warp_sums).
// Backward of eq. 21 and 23. CPU: output_gate_backward, rmsnorm_backward (per head).
template <int PER_LANE>
__global__ void output_backward_v1(bf16 *d_o, bf16 *dproj, bf16 *z, float *part, const float *dz, const bf16 *o,
                                       const Proj proj, int cg, const float *ow, int N, int H) {
    constexpr int dh = 32 * PER_LANE;
    int lane = threadIdx.x % 32, h = blockIdx.x, hc = h * dh + lane, D = H * dh;
    int n1 = min(N, (int)(blockIdx.y + 1) * HEAD_BLOCK_ROWS);
    float acc[PER_LANE] = {}, w[PER_LANE] = {};
    if (ow) head_weights<PER_LANE>(w, ow + h * dh, lane);
    for (int nn = blockIdx.y * HEAD_BLOCK_ROWS + threadIdx.x / 32; nn < n1; nn += 2 * FOX_WARPS) {
        int live[2] = {1, nn + FOX_WARPS < n1};
        float x[2][PER_LANE], gy[2][PER_LANE], gl[2][PER_LANE], rs[2];  // o, dz and the gate logits
#pragma unroll
        for (int g = 0; g < 2; g++)
#pragma unroll
            for (int e = 0; e < PER_LANE; e++) gy[g][e] = live[g] ? dz[(size_t)(nn + g * FOX_WARPS) * D + hc + 32 * e] : 0.0f;
        output_rows_load_v1<PER_LANE>(x, gl, rs, live, o, proj, cg, ow, nn, D, hc);
        float don[2][PER_LANE], wr[2][PER_LANE], dx[2][PER_LANE], prod[2][PER_LANE];
#pragma unroll
        for (int g = 0; g < 2; g++) {
            size_t n = (size_t)(nn + g * FOX_WARPS);
#pragma unroll
            for (int e = 0; e < PER_LANE; e++) {
                float gv = gy[g][e], on = ow ? x[g][e] * rs[g] * w[e] : x[g][e], y = on;
                if (cg >= 0) {
                    float sg = sigmoidf_(gl[g][e]);
                    if (live[g]) dproj[n * proj_ld(proj) + cg + hc + 32 * e] = __float2bfloat16(gv * on * sg * (1.0f - sg));
                    gv *= sg;
                    y *= sg;
                }
                if (live[g] && z) z[n * D + hc + 32 * e] = __float2bfloat16(y);
                don[g][e] = gv;
                wr[g][e] = w[e];
            }
        }
        if (ow) head_norm_backward_rs<PER_LANE, 2>(dx, prod, x, don, wr, rs);
#pragma unroll
        for (int g = 0; g < 2; g++) {
            if (!live[g]) continue;
            size_t n = (size_t)(nn + g * FOX_WARPS);
#pragma unroll
            for (int e = 0; e < PER_LANE; e++) {
                d_o[n * D + hc + 32 * e] = __float2bfloat16(ow ? dx[g][e] : don[g][e]);
                if (ow) acc[e] += prod[g][e];
            }
        }
    }
    if (ow) head_partials_store<PER_LANE>(part, acc, dh);
}

static void output_backward_v1_launch(bf16 *d_o, bf16 *dproj, bf16 *z, float *dow, const float *dz, const bf16 *o,
                                      const Proj &proj, int cg, const float *ow, int N, int H, int dh, float *part,
                                      float *part2, cudaStream_t s) {
    LAUNCH_HEAD_BLOCKS(output_backward_v1, dh, N, H, s, d_o, dproj, z, part, dz, o, proj, cg, ow, N, H);
    if (ow) head_partials_accumulate(dow, part, N, H, dh, 0, part2, s);
}


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

    for (int version = 1; version <= 2; version++) {
        auto fwd = [&] {
            if (version == 1) output_forward_v1_launch(dz_out, d_o_in, proj, cg, dow, N, H, dh, 0);
            else fox_output_forward(dz_out, d_o_in, proj, cg, dow, N, H, dh, 0);
        };
        auto bwd = [&] {
            if (version == 1) output_backward_v1_launch(dd_o, ddproj, dz2, ddow, ddz, d_o_in, proj, cg, dow, N, H, dh, drows, dpart, 0);
            else fox_output_backward(dd_o, ddproj, dz2, ddow, ddz, d_o_in, proj, cg, dow, N, H, dh, drows, dpart, 0);
        };
        printf("  version %d\n", version);
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
        const std::string op = fmt("v%d fwd", version), opb = fmt("v%d bwd+colsum (+z)", version);
        summary("output_gate", op.c_str(), shape, gf, tf, n * (2.0 + gt + 2.0));
        summary("output_gate", opb.c_str(), shape, gb, tb, n * (4.0 + 2.0 + gt + 2.0 + (c.gate ? 2.0 : 0.0) + 2.0));
    }
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
