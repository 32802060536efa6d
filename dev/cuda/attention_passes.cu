// dev/cuda/attention_passes.cu: the attention backward's passes over every row, beside step 2's tiles:
// step 1, D_i = dO_i . o_i (fox_attn::dot_do_o, fox/attention_passes.cuh), and the last step, dc += the dS
// column sums and dlogf = the reverse cumulative sum of dc (fox_attention_reverse_scan, fox/forget_gate.cuh),
// and step 3, dq = the dQ accumulators' sum in bf16 and dc += the other chains' row sums (fox_attn::bwd_dq,
// fox/attention_passes.cuh).
// Each in two versions, which must give the same bits (the trainers' deterministic runs print the same losses
// across the change), and each timed:
//   1 (before session 12): D with one warp a row (4 bytes a lane); the scan reading x, xc straight from
//     global memory, a thread's chunk of T / 1024 contiguous elements (a warp's loads 64 bytes apart).
//   2 (the API since session 12): D with d_h / 8 threads a row, 16 bytes each, the same sums in the same order;
//     the scan staged through shared memory in segments of 4096, loaded and stored by consecutive threads, up to
//     T 131072 (version 1's loads beyond).
//   dq conversion: 1 (before session 17) a thread a float4 of the accumulators, grid-strided, its 8 bytes of dq
//     stored where they land; 2 (the API since session 17) a block a 64-row block of a head, the bf16 rows staged
//     in smem and stored as one contiguous range.
// Session 12, H100 80GB HBM3 (a harness with these kernels, before this program took its form): D 93.0 -> 52.0 us
// at B 2 H 16 T 16384 d_h 64, 71.3 -> 41.2 at B 1 H 24, 55.6 -> 51.4 at d_h 128 B 2 H 8; the scan 47.6 -> 15.8
// us at 32 rows of 16384, 49.2 -> 16.1 at 24, 222 -> 79 at 3 of 70000; every output the same bits.
// The values themselves are checked against fp64 references by ./attention, ./attention_backward and
// ./forget_gate.
//   make attention_passes && ./attention_passes
#include <cstring>
#include "kcheck.h"                 // uniform, to_device, to_host, time_ms
#include "../../fox/attention.cuh"  // attention_passes.cuh: dot_do_o, bwd_dq; forget_gate.cuh: fox_attention_reverse_scan

namespace v1 {
using namespace fox_attn;
// Version 1 of D: one warp a row, lane l the pair of elements 2l, 2l + 1 (and 2l + 64, 2l + 65 at d_h 128).
template <int DH>
__global__ void row_dots_v1(const __nv_bfloat16 *__restrict__ dout, const __nv_bfloat16 *__restrict__ o,
                            float *__restrict__ D, int H, int T, int rows) {
    const int row = blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= rows) return;
    const __nv_bfloat162 *a = reinterpret_cast<const __nv_bfloat162 *>(dout + (size_t)row * DH);
    const __nv_bfloat162 *x = reinterpret_cast<const __nv_bfloat162 *>(o + (size_t)row * DH);
    float sum = 0.f;
#pragma unroll
    for (int i = lane; i < DH / 2; i += 32) {
        const float2 fa = __bfloat1622float2(a[i]), fx = __bfloat1622float2(x[i]);
        sum += fa.x * fx.x + fa.y * fx.y;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane == 0) {
        const int h = row % H, bt = row / H, b = bt / T, t = bt % T;
        D[((size_t)b * H + h) * T + t] = sum;
    }
}
// Version 1 of the reverse scan: the API's sums, each thread's chunk read straight from global memory.
__global__ void __launch_bounds__(FOX_ATTN_SCAN_THREADS)
reverse_scan_v1(float *__restrict__ x, const float *__restrict__ xc, float *__restrict__ y, int T) {
    __shared__ float warp_tot[FOX_ATTN_SCAN_THREADS / 32];
    float *xr = x + (size_t)blockIdx.x * T;
    const float *xcr = xc + (size_t)blockIdx.x * T;
    float *yr = y + (size_t)blockIdx.x * T;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int chunk = (T + FOX_ATTN_SCAN_THREADS - 1) / FOX_ATTN_SCAN_THREADS;
    const int lo = min(T, tid * chunk), hi = min(T, lo + chunk);
    float tot = 0.f;
    for (int t = lo; t < hi; t++) tot += xr[t] + xcr[t];
    // inclusive suffix scan across lanes (lane l gets sum over lanes >= l), then across warps
    float suf = tot;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const float o = __shfl_down_sync(0xffffffffu, suf, off);
        if (lane + off < 32) suf += o;
    }
    if (lane == 0) warp_tot[warp] = suf;
    const float after_mine = __shfl_down_sync(0xffffffffu, suf, 1);  // lanes after mine, in this warp
    __syncthreads();
    if (warp == 0) {
        float w = warp_tot[lane];
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const float o = __shfl_down_sync(0xffffffffu, w, off);
            if (lane + off < 32) w += o;
        }
        warp_tot[lane] = w;
    }
    __syncthreads();
    float run = (lane < 31 ? after_mine : 0.f) + (warp + 1 < FOX_ATTN_SCAN_THREADS / 32 ? warp_tot[warp + 1] : 0.f);
    for (int t = hi - 1; t >= lo; t--) {
        const float xt = xr[t] + xcr[t];
        xr[t] = xt;
        run += xt;
        yr[t] = run;
    }
}

// Version 1 of the dq conversion (step 3, fox_attn::bwd_dq; the API until session 17): a thread a float4 of the
// accumulators in their fragment order, grid-strided, each float4's 4 columns stored as 8 bytes where they land in
// dq (a warp's stores spread over 16 rows), then dc += the other chains' row sums, grid-strided.
template <int DH>
__global__ void dq_convert_v1(const float4 *__restrict__ acc, size_t stride4, int chains, const int *__restrict__ q_last,
                              __nv_bfloat16 *__restrict__ dq, float scale, int T, size_t n4, float *__restrict__ dc,
                              const float *__restrict__ dc_chains, size_t nvec) {
    const size_t head4 = dq_acc_rows(T) * DH / 4;
    const int nblk = (T + FOX_ACP_BLOCK - 1) / FOX_ACP_BLOCK;
    const size_t i0 = blockIdx.x * (size_t)blockDim.x + threadIdx.x, step = (size_t)gridDim.x * blockDim.x;
    for (size_t i = i0; i < n4; i += step) {
        const size_t bh = i / head4;
        const int o = (int)(i - bh * head4) * 4;
        const int lane = o / 2 % 32, q = o / 64, half = q % 2, cg = q / 2 % (DH / 8), slice = q / 2 / (DH / 8);
        const int t = o / (DQ_BLOCK * DH) * DQ_BLOCK + slice % 4 * 16 + half * 8 + lane / 4;
        if (t >= T) continue;
        const int *qlh = q_last ? q_last + bh * nblk : nullptr;
        float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int c = 0; c < chains; c++) {
            if (!bwd_chain_live(c, chains, nblk, t / FOX_ACP_BLOCK, qlh)) continue;
            const float4 a = acc[c * stride4 + i];
            x.x = __fadd_rn(x.x, a.x), x.y = __fadd_rn(x.y, a.y), x.z = __fadd_rn(x.z, a.z), x.w = __fadd_rn(x.w, a.w);
        }
        uint2 out;
        out.x = pack_bf16(x.x * scale, x.y * scale);
        out.y = pack_bf16(x.z * scale, x.w * scale);
        *reinterpret_cast<uint2 *>(dq + (bh * T + t) * DH + cg * 8 + lane % 4 * 2) = out;
    }
    if (chains > 1)
        for (size_t i = i0; i < nvec; i += step) {
            float x = dc[i];
            for (int c = 1; c < chains; c++) x += dc_chains[(c - 1) * nvec + i];
            dc[i] = x;
        }
}

}  // namespace v1

// Whether device arrays a and b of n elements hold the same bytes.
template <class E> static bool same_bytes(const E *a, const E *b, size_t n) {
    return memcmp(to_host(a, n).data(), to_host(b, n).data(), n * sizeof(E)) == 0;
}

// Times f1 (version 1) and f2 (the API), which add into x1 and x2 in place, then puts x0 back into both and runs
// each once more, for the comparison.
template <class F1, class F2>
static void time_then_once(F1 f1, F2 f2, float *x1, float *x2, const float *x0, size_t n, double &t1, double &t2) {
    t1 = time_ms(f1), t2 = time_ms(f2);
    FOX_CUDA_CHECK(cudaMemcpy(x1, x0, n * sizeof(float), cudaMemcpyDeviceToDevice));
    FOX_CUDA_CHECK(cudaMemcpy(x2, x0, n * sizeof(float), cudaMemcpyDeviceToDevice));
    f1();
    f2();
    FOX_CUDA_CHECK(cudaDeviceSynchronize());
}

// D of version 1 against the API's on random rows; row 0's pairs 1 and 33 are -0 (a sum of +0 and -0 is met).
template <int DH> static bool row_dots(int B, int H, int T) {
    const size_t n = (size_t)B * T * H * DH, rows = (size_t)B * T * H;
    std::vector<__nv_bfloat16> a(n), x(n);
    for (size_t i = 0; i < n; i++) {
        a[i] = __float2bfloat16((float)uniform(-1, 1));
        x[i] = __float2bfloat16((float)uniform(-1, 1));
    }
    for (int e : {2, 3, 66, 67})
        if (e < DH) {
            a[e] = __float2bfloat16(-0.f);
            x[e] = __float2bfloat16(1.f);
        }
    __nv_bfloat16 *da = to_device(a), *dx = to_device(x);
    float *D1, *D2;
    FOX_CUDA_CHECK(cudaMalloc(&D1, rows * 4));
    FOX_CUDA_CHECK(cudaMalloc(&D2, rows * 4));
    auto f1 = [&] {
        v1::row_dots_v1<DH><<<(unsigned)((rows + 7) / 8), 256>>>(da, dx, D1, H, T, (int)rows);
        FOX_LAUNCH_CHECK();
    };
    auto f2 = [&] { fox_attn::dot_do_o<DH>(da, dx, D2, B, H, T, 0); };
    const double t1 = time_ms(f1), t2 = time_ms(f2);
    FOX_CUDA_CHECK(cudaDeviceSynchronize());
    const bool same = same_bytes(D1, D2, rows);
    printf("D = rowsum(dO o)  B %d H %2d T %5d d_h %3d: version 1 %7.1f us, API %7.1f us; bits %s\n", B, H, T, DH, t1 * 1e3,
           t2 * 1e3, same ? "the same" : "DIFFERENT");
    FOX_CUDA_CHECK(cudaFree(da));
    FOX_CUDA_CHECK(cudaFree(dx));
    FOX_CUDA_CHECK(cudaFree(D1));
    FOX_CUDA_CHECK(cudaFree(D2));
    return same;
}

// The dq conversion of version 1 against the API's (fox_attn::bwd_dq) from random accumulators of `chains`
// chains (every row written, so the rows of dead chains hold values too, which neither may read), random dc
// and chain row sums, and an ACP staircase of key blocks >= m - 2 (q_last) or none: dq and dc.
template <int DH> static bool dq_conversion(int B, int H, int T, int chains, bool acp) {
    const size_t n4 = fox_attn::bwd_dq_acc_count(B, H, T, DH) / 4, nvec = (size_t)B * H * T, nq = nvec * DH;
    const int nblk = (T + FOX_ACP_BLOCK - 1) / FOX_ACP_BLOCK;
    std::vector<float> acc(n4 * 4 * chains), dcv(nvec), dcc(nvec * (chains - 1 > 0 ? chains - 1 : 1));
    for (float &x : acc) x = (float)uniform(-4, 4);
    for (float &x : dcv) x = (float)uniform(-1, 1);
    for (float &x : dcc) x = (float)uniform(-1, 1);
    std::vector<int> ql((size_t)B * H * nblk);
    for (int bh = 0; bh < B * H; bh++)
        for (int m = 0; m < nblk; m++) ql[(size_t)bh * nblk + m] = std::min(nblk - 1, m + 2);
    float *dacc = to_device(acc), *dc0 = to_device(dcv), *dc1 = to_device(dcv), *dc2 = to_device(dcv), *ddcc = to_device(dcc);
    int *dql = acp ? to_device(ql) : nullptr;
    __nv_bfloat16 *q1, *q2;
    FOX_CUDA_CHECK(cudaMalloc(&q1, nq * 2));
    FOX_CUDA_CHECK(cudaMalloc(&q2, nq * 2));
    fox_attn::BwdSums p{};
    p.dq_acc = dacc, p.dc_chains = ddcc, p.chains = chains, p.q_last = dql;
    const float scale = 1.f / sqrtf((float)DH);
    auto f1 = [&] {
        const size_t blocks = (n4 + 255) / 256;
        v1::dq_convert_v1<DH><<<(unsigned)(blocks < 4096 ? blocks : 4096), 256>>>(
            reinterpret_cast<const float4 *>(dacc), n4, chains, dql, q1, scale, T, n4, dc1, ddcc, nvec);
        FOX_LAUNCH_CHECK();
    };
    auto f2 = [&] { fox_attn::bwd_dq(p, dc2, q2, B, H, T, DH, 0); };
    double t1, t2;
    time_then_once(f1, f2, dc1, dc2, dc0, nvec, t1, t2);
    const bool same = same_bytes(q1, q2, nq) && same_bytes(dc1, dc2, nvec);
    printf("dq conversion     B %d H %2d T %5d d_h %3d, %d chains%s: version 1 %7.1f us, API %7.1f us; bits %s\n", B, H, T,
           DH, chains, acp ? ", ACP" : "     ", t1 * 1e3, t2 * 1e3, same ? "the same" : "DIFFERENT");
    float *fl[] = {dacc, dc0, dc1, dc2, ddcc};
    for (float *f : fl) FOX_CUDA_CHECK(cudaFree(f));
    FOX_CUDA_CHECK(cudaFree(q1));
    FOX_CUDA_CHECK(cudaFree(q2));
    if (dql) FOX_CUDA_CHECK(cudaFree(dql));
    return same;
}

// The reverse scan of version 1 against the API's: dc (in place) and dlogf.
static bool reverse_scan(int BH, int T) {
    const size_t n = (size_t)BH * T;
    std::vector<float> x(n), xc(n);
    for (size_t i = 0; i < n; i++) {
        x[i] = (float)uniform(-0.5, 0.5);
        xc[i] = (float)uniform(-0.5, 0.5);
    }
    float *x0 = to_device(x), *dxc = to_device(xc), *x1 = to_device(x), *x2 = to_device(x), *y1, *y2;
    FOX_CUDA_CHECK(cudaMalloc(&y1, n * 4));
    FOX_CUDA_CHECK(cudaMalloc(&y2, n * 4));
    auto f1 = [&] {
        v1::reverse_scan_v1<<<BH, FOX_ATTN_SCAN_THREADS>>>(x1, dxc, y1, T);
        FOX_LAUNCH_CHECK();
    };
    auto f2 = [&] { fox_attention_reverse_scan(x2, dxc, y2, BH, T, 0); };
    double t1, t2;
    time_then_once(f1, f2, x1, x2, x0, n, t1, t2);
    const bool same = same_bytes(y1, y2, n) && same_bytes(x1, x2, n);
    printf("reverse scan      %3d rows of T %5d: version 1 %7.1f us, API %7.1f us; bits %s\n", BH, T, t1 * 1e3, t2 * 1e3,
           same ? "the same" : "DIFFERENT");
    float *fl[] = {x0, dxc, x1, x2, y1, y2};
    for (float *p : fl) FOX_CUDA_CHECK(cudaFree(p));
    return same;
}

int main() {
    bool ok = true;
    ok &= row_dots<64>(2, 16, 16384);  // the bench shape
    ok &= row_dots<64>(1, 24, 16384);  // 760M
    ok &= row_dots<64>(1, 3, 1000);
    ok &= row_dots<128>(2, 8, 16384);
    ok &= row_dots<128>(1, 3, 999);
    ok &= dq_conversion<64>(2, 16, 16384, 4, false);  // the bench shape
    ok &= dq_conversion<64>(1, 24, 16384, 4, false);  // 760M
    ok &= dq_conversion<64>(8, 16, 4096, 4, false);
    ok &= dq_conversion<64>(2, 2, 2000, 4, true);
    ok &= dq_conversion<64>(1, 3, 1000, 1, false);
    ok &= dq_conversion<128>(2, 8, 16384, 4, false);
    ok &= dq_conversion<128>(1, 3, 999, 4, true);
    ok &= dq_conversion<128>(1, 2, 70, 2, false);
    const int scans[][2] = {{32, 16384}, {24, 16384}, {12, 16384}, {5, 1000}, {2, 1}, {3, 4099}, {3, 70000},
                            {3, 131072}, {2, 140000}};  // the last: past the staged range
    for (const auto &s : scans) ok &= reverse_scan(s[0], s[1]);
    printf("%s\n", ok ? "ALL THE SAME BITS" : "SOME DIFFERENT");
    return ok ? 0 : 1;
}
