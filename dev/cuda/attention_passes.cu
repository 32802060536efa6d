// dev/cuda/attention_passes.cu: the attention backward's passes over every row, beside step 2's tiles:
// step 1, D_i = dO_i . o_i (fox_attn::dot_do_o, fox/attention_backward.cuh), and the last step, dc += the dS
// column sums and dlogf = the reverse cumulative sum of dc (fox_attention_reverse_scan, fox/attention.cuh).
// Each in two versions, which must give the same bits (the trainers' deterministic runs print the same losses
// across the change), and each timed:
//   1 (before session 12): D with one warp a row (4 bytes a lane); the scan reading x, xc straight from
//     global memory, a thread's chunk of T / 1024 contiguous elements (a warp's loads 64 bytes apart).
//   2 (the API since session 12): D with d_h / 8 threads a row, 16 bytes each, the same sums in the same order;
//     the scan staged through shared memory in segments of 4096, loaded and stored by consecutive threads, up to
//     T 131072 (version 1's loads beyond).
// Session 12, H100 80GB HBM3 (a harness with these kernels, before this program took its form): D 93.0 -> 52.0 us
// at B 2 H 16 T 16384 d_h 64, 71.3 -> 41.2 at B 1 H 24, 55.6 -> 51.4 at d_h 128 B 2 H 8; the scan 47.6 -> 15.8
// us at 32 rows of 16384, 49.2 -> 16.1 at 24, 222 -> 79 at 3 of 70000; every output the same bits.
// The values themselves are checked against fp64 references by ./attention, ./attention_backward and
// ./forget_gate.
//   make attention_passes && ./attention_passes
#include <cstring>
#include "kcheck.h"                 // uniform, to_device, to_host, time_ms
#include "../../fox/attention.cuh"  // fox_attention_reverse_scan, FOX_ATTN_SCAN_THREADS; dot_do_o

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

}  // namespace v1

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
    const bool same = memcmp(to_host(D1, rows).data(), to_host(D2, rows).data(), rows * 4) == 0;
    printf("D = rowsum(dO o)  B %d H %2d T %5d d_h %3d: version 1 %7.1f us, API %7.1f us; bits %s\n", B, H, T, DH, t1 * 1e3,
           t2 * 1e3, same ? "the same" : "DIFFERENT");
    FOX_CUDA_CHECK(cudaFree(da));
    FOX_CUDA_CHECK(cudaFree(dx));
    FOX_CUDA_CHECK(cudaFree(D1));
    FOX_CUDA_CHECK(cudaFree(D2));
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
    const double t1 = time_ms(f1), t2 = time_ms(f2);  // (the timed runs add into dc again and again)
    FOX_CUDA_CHECK(cudaMemcpy(x1, x0, n * 4, cudaMemcpyDeviceToDevice));
    FOX_CUDA_CHECK(cudaMemcpy(x2, x0, n * 4, cudaMemcpyDeviceToDevice));
    f1();
    f2();
    FOX_CUDA_CHECK(cudaDeviceSynchronize());
    const bool same = memcmp(to_host(y1, n).data(), to_host(y2, n).data(), n * 4) == 0 &&
                      memcmp(to_host(x1, n).data(), to_host(x2, n).data(), n * 4) == 0;
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
    const int scans[][2] = {{32, 16384}, {24, 16384}, {12, 16384}, {5, 1000}, {2, 1}, {3, 4099}, {3, 70000},
                            {3, 131072}, {2, 140000}};  // the last: past the staged range
    for (const auto &s : scans) ok &= reverse_scan(s[0], s[1]);
    printf("%s\n", ok ? "ALL THE SAME BITS" : "SOME DIFFERENT");
    return ok ? 0 : 1;
}
