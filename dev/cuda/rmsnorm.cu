// dev/cuda/rmsnorm.cu: checks the residual-stream RMSNorm of fox/rmsnorm.cuh against an fp64 CPU
// reference, then times it, through the launchers train_fox.cu calls. Forward: fox_rmsnorm_forward
// (fp32 in, bf16 out). Backward: fox_rmsnorm_backward (dres = dx, or dres += dx; dres_bf; dw's block
// partials, then their column sums: dw += Σ_rows dy⊙x̂; and the forward's output again, which must equal
// the forward's bitwise: the trainer keeps no per-block copy of it).
//   version 1 (until 2026-11-25): each pass of a warp over its row reads the row (the second from L1/L2).
//   version 2 (fox/rmsnorm.cuh): a lane keeps its float4s of the row in registers between the passes
//     (D <= 4·32·RMS_MAX_RV; beyond that the version 1 loops). Checked bitwise equal to version 1.
//   make rmsnorm && ./rmsnorm
#include "kcheck.h"
#include "../../fox/rmsnorm.cuh"       // fox_rmsnorm_forward/backward

// ---- version 1, as the product had it
__global__ void rmsnorm_forward_v1(bf16 *out, const float *in, const float *w, int N, int D, float eps) {
    size_t row = warp_index();
    int lane = threadIdx.x % 32, D4 = D / 4;
    if (row >= (size_t)N) return;
    const float4 *x = (const float4 *)(in + row * D);
    float rs = row_rstd(x, D4, lane, eps);
    for (int i = lane; i < D4; i += 32) {
        float4 a = x[i], g = load_w4(w, i);
        store_bf16x4(out + row * D + 4 * i, a.x * rs * g.x, a.y * rs * g.y, a.z * rs * g.z, a.w * rs * g.w);
    }
}

__global__ void rmsnorm_backward_v1(float *dres, bf16 *dres_bf, float *part, const float *dy, const float *in, const float *w,
                                    int N, int D, float eps, int accumulate) {
    extern __shared__ float4 wsum[];  // (FOX_WARPS, D/4)
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, D4 = D / 4;
    float4 *acc = wsum + (size_t)warp * D4;
    for (int i = lane; i < D4; i += 32) acc[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    int r1 = min(N, (int)(blockIdx.x + 1) * NORM_BLOCK_ROWS);
    for (int row = blockIdx.x * NORM_BLOCK_ROWS + warp; row < r1; row += FOX_WARPS) {
        const float4 *x = (const float4 *)(in + (size_t)row * D), *g = (const float4 *)(dy + (size_t)row * D);
        float ss = 0.0f, gwx = 0.0f;
        for (int i = lane; i < D4; i += 32) {
            float4 a = x[i], b = g[i], c = load_w4(w, i);
            ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
            gwx += b.x * c.x * a.x + b.y * c.y * a.y + b.z * c.z * a.z + b.w * c.w * a.w;
        }
        float rs = 1.0f / sqrtf(warp_sum(ss) / D + eps), dot = rs * warp_sum(gwx) / D;
        float4 *r = (float4 *)(dres + (size_t)row * D);
        for (int i = lane; i < D4; i += 32) {
            float4 a = x[i], b = g[i], c = load_w4(w, i), o = accumulate ? r[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            o.x += rs * (b.x * c.x - a.x * rs * dot);
            o.y += rs * (b.y * c.y - a.y * rs * dot);
            o.z += rs * (b.z * c.z - a.z * rs * dot);
            o.w += rs * (b.w * c.w - a.w * rs * dot);
            r[i] = o;
            store_bf16x4(dres_bf + (size_t)row * D + 4 * i, o.x, o.y, o.z, o.w);
            acc[i].x += b.x * a.x * rs;
            acc[i].y += b.y * a.y * rs;
            acc[i].z += b.z * a.z * rs;
            acc[i].w += b.w * a.w * rs;
        }
    }
    __syncthreads();
    const float *ws = (const float *)wsum;
    for (int c = threadIdx.x; c < D; c += blockDim.x) {
        float t = 0.0f;
        for (int k = 0; k < FOX_WARPS; k++) t += ws[(size_t)k * D + c];
        part[(size_t)blockIdx.x * D + c] = t;
    }
}

static void launch_fwd_v1(bf16 *out, const float *x, const float *w, int N, int D) {
    rmsnorm_forward_v1<<<warp_blocks(N), FOX_WARPS * 32>>>(out, x, w, N, D, FOX_NORM_EPS);
    FOX_LAUNCH_CHECK();
}
static void launch_bwd_v1(float *dres, bf16 *dres_bf, float *rows, float *dw, float *part, const float *dy, const float *x,
                          const float *w, int N, int D, int acc) {
    int smem = FOX_WARPS * D * (int)sizeof(float);
    FOX_CUDA_CHECK(cudaFuncSetAttribute(rmsnorm_backward_v1, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    rmsnorm_backward_v1<<<norm_blocks(N), FOX_WARPS * 32, smem>>>(dres, dres_bf, rows, dy, x, w, N, D, FOX_NORM_EPS, acc);
    FOX_LAUNCH_CHECK();
    colsum_accumulate(dw, rows, norm_blocks(N), D, D, part, 0);
}

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
    bf16 *dout = dmalloc<bf16>(n), *ddres_bf = dmalloc<bf16>(n), *dxn = dmalloc<bf16>(n), *dout1 = dmalloc<bf16>(n),
         *ddres_bf1 = dmalloc<bf16>(n);
    float *ddres1 = dmalloc<float>(n), *ddw1 = dmalloc<float>(D);

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
    auto same = [](Group &g, const char *what, const void *a, const void *b, size_t bytes) {
        bool ok = !memcmp(a, b, bytes);
        printf("    %-14s %s\n", what, ok ? "bitwise ok" : "FAIL");
        if (!ok) g.ok = false, kc_failures++;
    };
    launch_fwd_v1(dout1, dx_in, dw_, N, D);
    same(gf, "out = v1's", fwd_out.data(), to_host(dout1, n).data(), n * sizeof(bf16));

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
        same(gb, "xn = fwd out", to_host(dxn, n).data(), fwd_out.data(), n * sizeof(bf16));
        upload(ddres1, dres0);
        upload(ddw1, dw0);
        launch_bwd_v1(ddres1, ddres_bf1, drows, ddw1, dpart, ddy, dx_in, dw_, N, D, acc);
        same(gb, "dres = v1's", to_host(ddres, n).data(), to_host(ddres1, n).data(), n * sizeof(float));
        same(gb, "dres_bf = v1's", to_host(ddres_bf, n).data(), to_host(ddres_bf1, n).data(), n * sizeof(bf16));
        same(gb, "dw = v1's", to_host(ddw, D).data(), to_host(ddw1, D).data(), D * sizeof(float));
    }

    // timing: fwd; bwd with accumulate (what the blocks do); bytes each input once, each output once
    double tf = time_ms([&] { launch_fwd(dout, dx_in, dw_, N, D); });
    double tb = time_ms([&] { launch_bwd(ddres, ddres_bf, dxn, drows, ddw, dpart, ddy, dx_in, dw_, N, D, 1); });
    double tf1 = time_ms([&] { launch_fwd_v1(dout1, dx_in, dw_, N, D); });
    double tb1 = time_ms([&] { launch_bwd_v1(ddres1, ddres_bf1, drows, ddw1, dpart, ddy, dx_in, dw_, N, D, 1); });
    double bf_ = n * (4.0 + 2.0) + D * 4.0;
    // dy, x, dres in; dres, dres_bf, xn out (the block partials and dw are O(N·D/32))
    double bb = n * (4.0 + 4.0 + 4.0 + 4.0 + 2.0 + 2.0) + D * 12.0;
    summary("rmsnorm", "fwd", shape, gf, tf, bf_);
    summary("rmsnorm", "bwd+colsum (+xn)", shape, gb, tb, bb);
    summary("rmsnorm", "v1 fwd", shape, gf, tf1, bf_);
    summary("rmsnorm", "v1 bwd+colsum", shape, gb, tb1, bb - n * 2.0);
    cudaFree(dx_in); cudaFree(dw_); cudaFree(ddy); cudaFree(ddres); cudaFree(drows); cudaFree(ddw); cudaFree(dpart);
    cudaFree(dout); cudaFree(ddres_bf); cudaFree(dxn); cudaFree(dout1); cudaFree(ddres_bf1); cudaFree(ddres1); cudaFree(ddw1);
}

int main() {
    print_device();
    const int Ds[] = {64, 768, 1536}, Ns[] = {1, 7, 255, 1000};
    for (int D : Ds)
        for (int N : Ns) run(N, D);
    run(255, 2048);  // beyond the register path (RMS_MAX_RV): the loops
    run(16384, 768);
    run(16384, 1536);
    return kc_finish("rmsnorm");
}
