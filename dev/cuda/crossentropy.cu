// dev/cuda/crossentropy.cu: checks the softmax cross entropy of fox/crossentropy.cuh against an fp64 CPU reference,
// then times it beside the version it replaced. Both take bf16 logits of which the first V of VP columns are
// real, give the per-position loss (fp32) and dlogits = (softmax − onehot)·scale in place (bf16, padding
// columns 0). The padding columns are filled with large values here, so a kernel that read them would fail.
//   version 1 (until 2026-11-25): crossentropy_forward_v1 (loss and lse) in the forward, then
//     crossentropy_backward_v1 (dlogits from the stored lse) in the backward: two reads and one write of the
//     logits, 2-byte accesses.
//   version 2 (fox/crossentropy.cuh, fox_crossentropy): one kernel, the row staged in shared memory with 16-byte
//     loads, the same lse arithmetic (so the same loss bits as version 1), dlogits written with 16-byte stores:
//     one read and one write. Also checked: its unstaged path (rows too long for shared memory read twice from
//     global), the loss-only launch (grad 0), and that losses, lse and dlogits equal version 1's bitwise.
//   make crossentropy && ./crossentropy
#include "kcheck.h"
#include "../../fox/crossentropy.cuh"  // fox_crossentropy

// ---- version 1, as the product had it
__global__ void __launch_bounds__(CE_THREADS) crossentropy_forward_v1(float *losses, float *lse, const bf16 *logits,
                                                                     const int *targets, int V, int VP) {
    size_t row = blockIdx.x;
    const bf16 *z = logits + row * VP;
    __shared__ float l;
    block_lse(&l, z, V);
    if (threadIdx.x == 0) {
        lse[row] = l;
        losses[row] = l - __bfloat162float(z[targets[row]]);
    }
}

__global__ void __launch_bounds__(CE_THREADS) crossentropy_backward_v1(bf16 *logits, const float *lse, const int *targets,
                                                                      int V, int VP, float scale) {
    size_t row = blockIdx.x;
    bf16 *z = logits + row * VP;
    float l = lse[row];
    int tg = targets[row];
    for (int i = threadIdx.x; i < VP; i += CE_THREADS) {
        float p = i < V ? expf(__bfloat162float(z[i]) - l) : 0.0f;
        z[i] = __float2bfloat16((p - (i == tg ? 1.0f : 0.0f)) * scale);
    }
}

// ref: check against the fp64 reference too (else only bitwise against version 1: the large timing shape).
static void run(int rows, int V, int VP, bool ref = true) {
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
    const float scale = 1.0f / (float)rows;  // 1 / N
    bf16 *d_z = to_device(z), *d_z1 = to_device(z);
    int *d_tg = to_device(tg);
    float *d_loss = dmalloc<float>(rows), *d_loss1 = dmalloc<float>(rows), *d_lse1 = dmalloc<float>(rows);

    std::vector<double> rloss(ref ? rows : 0), rdz(ref ? n : 0), xdz(ref ? n : 0);
    for (int r = 0; r < (ref ? rows : 0); r++) {
        const bf16 *zr = &z[(size_t)r * VP];
        double m = -INFINITY, s = 0;
        for (int i = 0; i < V; i++) m = std::max(m, bf(zr[i]));
        for (int i = 0; i < V; i++) s += exp(bf(zr[i]) - m);
        const double l = m + log(s);
        rloss[r] = l - bf(zr[tg[r]]);
        for (int i = 0; i < VP; i++) {
            const double p = i < V ? exp(bf(zr[i]) - l) : 0.0;
            rdz[(size_t)r * VP + i] = (p - (i == tg[r] ? 1.0 : 0.0)) * scale;
            // p = expf(z − lse) with lse in fp32 carries an absolute error ~p·|lse|·2^-24 (a few ulps);
            // for the target of a confident row (p ≈ 1) p − 1 is that error's size: allow 16 ulps.
            xdz[(size_t)r * VP + i] = 0x1p-20 * scale * p * std::max(1.0, fabs(l));
        }
    }
    // version 1 (the reference bits) and version 2, staged and unstaged
    auto v1 = [&] {
        crossentropy_forward_v1<<<rows, CE_THREADS>>>(d_loss1, d_lse1, d_z1, d_tg, V, VP);
        FOX_LAUNCH_CHECK();
        crossentropy_backward_v1<<<rows, CE_THREADS>>>(d_z1, d_lse1, d_tg, V, VP, scale);
        FOX_LAUNCH_CHECK();
    };
    auto v2 = [&] { fox_crossentropy(d_loss, d_z, d_tg, rows, V, VP, scale, 1, 0); };
    auto v2_unstaged = [&] {
        crossentropy_kernel<<<rows, CE_THREADS>>>(d_loss, d_z, d_tg, V, VP, scale, 1, 0);
        FOX_LAUNCH_CHECK();
    };
    auto v2_loss = [&] { fox_crossentropy(d_loss, d_z, d_tg, rows, V, VP, scale, 0, 0); };
    v1();
    std::vector<float> loss1 = to_host(d_loss1, rows);
    std::vector<bf16> dz1 = to_host(d_z1, n);
    Group g;
    const char *names[] = {"v2", "v2 unstaged", "v2 loss only"};
    for (int variant = 0; variant < 3; variant++) {
        upload(d_z, z);
        poison(d_loss, rows);
        if (variant == 0) v2();
        else if (variant == 1) v2_unstaged();
        else v2_loss();
        printf("  %s%s\n", names[variant], variant == 0 && !ce_stage_bytes(VP) ? " (row too long: unstaged)" : "");
        if (ref) check_f32(g, "loss", d_loss, rloss, TOL_F32);
        std::vector<float> loss = to_host(d_loss, rows);
        std::vector<bf16> dz = to_host(d_z, n);
        bool same_loss = !memcmp(loss.data(), loss1.data(), rows * sizeof(float));
        bool same_dz = !memcmp(dz.data(), variant == 2 ? z.data() : dz1.data(), n * sizeof(bf16));
        printf("    %-14s %s\n", variant == 2 ? "loss = v1's, logits untouched" : "loss, dlogits = v1's",
               same_loss && same_dz ? "bitwise ok" : "FAIL");
        if (!same_loss || !same_dz) g.ok = false, kc_failures++;
        if (variant == 2) continue;
        if (ref) check_values(g, "dlogits", widen(dz), rdz, TOL_BF16, &xdz);
        size_t nz = 0;  // the padding columns must be exactly 0
        for (int r = 0; r < rows; r++)
            for (int i = V; i < VP; i++) nz += bf(dz[(size_t)r * VP + i]) != 0.0;
        printf("    %-14s %zu nonzero padding entries  %s\n", "dlogits[pad]", nz, nz ? "FAIL" : "ok");
        if (nz) g.ok = false, kc_failures++;
    }

    // Timing: the kernels work in place, so the repeats run on their own output (finite, the same bytes and
    // arithmetic). Bytes: the real logits read (v1: twice), VP columns written, per-row scalars.
    upload(d_z, z);
    upload(d_z1, z);
    double t1 = time_ms(v1), t2 = time_ms(v2), tu = time_ms(v2_unstaged), tl = time_ms(v2_loss);
    const double lread = (double)rows * V * 2.0, lwrite = (double)n * 2.0;
    summary("crossentropy", "v1 fwd + bwd", shape, g, t1, 2 * lread + lwrite + rows * 20.0);
    summary("crossentropy", "v2 fused fwd+bwd", shape, g, t2, (double)n * 2.0 + lwrite + rows * 8.0);
    summary("crossentropy", "v2 unstaged fwd+bwd", shape, g, tu, (double)n * 2.0 + lwrite + rows * 8.0);
    summary("crossentropy", "v2 loss only", shape, g, tl, (double)n * 2.0 + rows * 8.0);
    cudaFree(d_z); cudaFree(d_z1); cudaFree(d_tg); cudaFree(d_loss); cudaFree(d_loss1); cudaFree(d_lse1);
}

int main() {
    print_device();
    const int rows[] = {1, 7, 255, 1000};
    for (int r : rows) run(r, 50257, 50304);  // GPT-2 vocabulary padded to a multiple of 64
    run(7, 64, 64);
    run(255, 1000, 1024);
    run(3, 130000, 130048);    // a row too long to stage in shared memory
    run(2048, 50257, 50304, false);  // 206 MB of logits (timing; 1/8 of a 16k-token step's)
    return kc_finish("crossentropy");
}
