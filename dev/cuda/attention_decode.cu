// dev/cuda/attention_decode.cu: checks the decode step's attention over the KV cache (fox/decode.cuh:
// fox_decode_attention, flash-decoding: chunks of keys reduced by separate blocks, then combined) against an
// fp64 CPU loop, then times it. Checks: d_h 64 and 128, batch 1 to 3, from one cached key to 16384, with and
// without the forget gate's bias c_t − c_j and ACP's first key, with the default chunk count and with one
// chunk; the output poisoned before each launch, and every key the kernel must not read (before the first,
// after t) set to NaN. Timing: batch 1 and 16, contexts 2k and 16k, 12 and 16 heads of 64 and 128, with
// every key read and with ACP-style pruning (the last eighth read); GB/s of the cache bytes read (K, V, c of
// the keys read) against the device's HBM bandwidth, for fox_decode_max_splits' chunk count (train_fox's) and
// for 1, 2, 4, .. 128 chunks (the fastest of them is printed beside it).
//   make attention_decode && ./attention_decode        (./attention_decode check | ./attention_decode bench)
#include "kcheck.h"
#include "../../fox/rng.h"      // fox_mix64: device-side random fill of the bench caches
#include "../../fox/decode.cuh"  // fox_decode_attention, fox_decode_max_splits

// ---------------------------------------------------------------------------------------------
// Check against fp64

struct CheckCase {
    int B, H, dh, len;  // len cached keys: the query sits at t = len - 1
    bool bias, acp;
};

static const CheckCase check_cases[] = {
    {1, 2, 64, 1, true, false},     {3, 2, 64, 2, true, false},      {1, 12, 64, 1001, true, true},
    {3, 4, 128, 258, false, false}, {2, 12, 128, 5001, true, true},  {1, 16, 64, 16384, true, false},
    {1, 16, 128, 16384, false, true},
};

static void check_case(const CheckCase &cc, bool one_chunk) {
    const int BH = cc.B * cc.H, dh = cc.dh, t = cc.len - 1, max_len = cc.len + 5;
    const int splits = one_chunk ? 1 : fox_decode_max_splits(BH, dh);
    const float nan = nanf("");
    std::string shape = fmt("B=%d H=%d dh=%d keys=%d%s%s, %d chunks", cc.B, cc.H, dh, cc.len, cc.bias ? " bias" : "",
                            cc.acp ? " acp" : "", splits);
    printf("attention_decode %s\n", shape.c_str());
    std::vector<bf16> q = rand_bf16((size_t)BH * dh, -2.0, 2.0), k = rand_bf16((size_t)BH * max_len * dh, -1.5, 1.5),
                      v = rand_bf16((size_t)BH * max_len * dh, -1.0, 1.0);
    std::vector<float> c((size_t)BH * max_len, nan);
    std::vector<int> first(BH, 0);
    for (int bh = 0; bh < BH; bh++) {
        double run = 0.0, z0 = uniform(1.0, 5.0);  // log f ≈ log σ(z): heads forget at different speeds
        for (int j = 0; j <= t; j++) c[(size_t)bh * max_len + j] = (float)(run += -log1p(exp(-(z0 + uniform(-1.5, 1.5)))));
        if (cc.acp) first[bh] = (int)(uniform(0.0, 1.0) * (t + 1));
        for (int j = 0; j < max_len; j++)  // keys not to be read
            if (j < first[bh] || j > t)
                for (int i = 0; i < dh; i++) k[((size_t)bh * max_len + j) * dh + i] = v[((size_t)bh * max_len + j) * dh + i] = __float2bfloat16(nan);
    }
    std::vector<double> ref((size_t)BH * dh), extra((size_t)BH * dh);
    for (int bh = 0; bh < BH; bh++) {
        std::vector<double> s(t + 1);
        double mx = -INFINITY, sum = 0.0;
        for (int j = first[bh]; j <= t; j++) {
            double d = 0.0;
            for (int i = 0; i < dh; i++) d += bf(q[(size_t)bh * dh + i]) * bf(k[((size_t)bh * max_len + j) * dh + i]);
            s[j] = d / sqrt((double)dh) + (cc.bias ? (double)c[(size_t)bh * max_len + t] - c[(size_t)bh * max_len + j] : 0.0);
            mx = fmax(mx, s[j]);
        }
        for (int j = first[bh]; j <= t; j++) sum += exp(s[j] - mx);
        for (int i = 0; i < dh; i++) {
            double o = 0.0, mag = 0.0;
            for (int j = first[bh]; j <= t; j++) {
                double p = exp(s[j] - mx) / sum, x = bf(v[((size_t)bh * max_len + j) * dh + i]);
                o += p * x;
                mag += p * fabs(x);
            }
            ref[(size_t)bh * dh + i] = o;
            // fp32 sums of up to 16384 weighted terms and exp2f's ulps: 1e-5 of the terms' size
            extra[(size_t)bh * dh + i] = 1e-5 * mag;
        }
    }
    bf16 *dq = to_device(q), *dk = to_device(k), *dv = to_device(v), *dout = dmalloc<bf16>((size_t)BH * dh);
    float *dc = to_device(c), *part = dmalloc<float>(fox_decode_scratch_floats(BH, splits, dh));
    int *dfirst = to_device(first), *dpos = to_device(std::vector<int>(1, t));
    poison(dout, (size_t)BH * dh);
    fox_decode_attention(dout, dq, dk, dv, cc.bias ? dc : nullptr, cc.acp ? dfirst : nullptr, part, BH, dh, max_len, dpos,
                         splits, 0, 1);
    Group g;
    check_values(g, "o", widen(to_host(dout, (size_t)BH * dh)), ref, TOL_BF16, &extra);
    std::vector<bf16> o1 = to_host(dout, (size_t)BH * dh);
    fox_decode_attention(dout, dq, dk, dv, cc.bias ? dc : nullptr, cc.acp ? dfirst : nullptr, part, BH, dh, max_len, dpos,
                         splits, 0, 1);
    std::vector<bf16> o2 = to_host(dout, (size_t)BH * dh);
    bool same = !memcmp(o1.data(), o2.data(), o1.size() * sizeof(bf16));
    printf("    %-14s %s\n", "repeat", same ? "bitwise the same: ok" : "differs: FAIL");
    if (!same) kc_failures++;
    cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(dout); cudaFree(dc); cudaFree(part); cudaFree(dfirst); cudaFree(dpos);
}

// ---------------------------------------------------------------------------------------------
// Bench

// bf16 values in [-1, 1) from a hash of the index (caches of gigabytes are filled on the device).
__global__ void fill_random_bf16(bf16 *x, size_t n, uint64_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = __float2bfloat16((float)(fox_mix64(seed + i) >> 40) * (2.0f / 16777216.0f) - 1.0f);
}

// c of a gate that forgets slowly: c_j = -0.01 j in every row.
__global__ void fill_c(float *c, size_t n, int len) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        c[i] = -0.01f * (float)(i % len);
}

struct BenchCase {
    int B, H, dh, len;
};


static void bench_case(const BenchCase &bc, double hbm) {
    const int BH = bc.B * bc.H, dh = bc.dh, len = bc.len, t = len - 1;
    const size_t kv = (size_t)BH * len * dh, nc = (size_t)BH * len;
    const double set_bytes = 2.0 * kv * sizeof(bf16) + nc * sizeof(float);
    const int sets = (int)std::max(1.0, std::ceil(4.0 * l2_bytes() / set_bytes));
    bf16 *k = dmalloc<bf16>(kv * sets), *v = dmalloc<bf16>(kv * sets), *q = dmalloc<bf16>((size_t)BH * dh),
         *o = dmalloc<bf16>((size_t)BH * dh);
    float *c = dmalloc<float>(nc * sets), *part = dmalloc<float>(fox_decode_scratch_floats(BH, DECODE_MAX_SPLITS, dh));
    fill_random_bf16<<<1024, 256>>>(k, kv * sets, 1);
    fill_random_bf16<<<1024, 256>>>(v, kv * sets, 2);
    fill_random_bf16<<<1024, 256>>>(q, (size_t)BH * dh, 3);
    fill_c<<<1024, 256>>>(c, nc * sets, len);
    FOX_LAUNCH_CHECK();
    const int live_acp = len / 8, def = fox_decode_max_splits(BH, dh);
    std::vector<int> first_h(BH, len - live_acp);
    int *first = to_device(first_h), *pos = to_device(std::vector<int>(1, t));
    for (int acp = 0; acp < 2; acp++) {
        const int live = acp ? live_acp : len;
        const double bytes = (double)BH * live * (2.0 * dh * sizeof(bf16) + sizeof(float));
        auto time_splits = [&](int splits) {
            return us_per_launch([&](int s) {
                fox_decode_attention(o, q, k + kv * s, v + kv * s, c + nc * s, acp ? first : nullptr, part, BH, dh, len, pos,
                                     splits, 0, 1);
            }, sets);
        };
        const double us = time_splits(def);
        int best_splits = def;
        double best_us = us;
        for (int s = 1; s <= DECODE_MAX_SPLITS; s *= 2) {
            if (s == def) continue;
            double u = time_splits(s);
            if (u < best_us) best_us = u, best_splits = s;
        }
        printf("B=%-2d H=%-2d dh=%-3d ctx=%-5d %-4s | %5d keys | %7.2f MB | %3d chunks | %8.2f us | %6.0f GB/s | %5.1f%% | "
               "best %3d: %8.2f us %6.0f GB/s %5.1f%%\n", bc.B, bc.H, dh, len, acp ? "acp" : "all", live, bytes / 1e6, def,
               us, bytes / us * 1e-3, 100.0 * bytes / (us * 1e-6) / hbm, best_splits, best_us, bytes / best_us * 1e-3,
               100.0 * bytes / (best_us * 1e-6) / hbm);
        fflush(stdout);
    }
    cudaFree(k); cudaFree(v); cudaFree(q); cudaFree(o); cudaFree(c); cudaFree(part); cudaFree(first); cudaFree(pos);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "all";
    print_device();
    if (strcmp(mode, "bench") != 0) {
        for (const CheckCase &cc : check_cases) {
            check_case(cc, false);
            check_case(cc, true);
        }
    }
    if (strcmp(mode, "check") != 0) {
        bool measured;
        const double hbm = hbm_bytes_per_s(&measured);
        printf("HBM bandwidth %.0f GB/s (%s); bytes = K, V and c of the keys read; %% of that bandwidth; chunks: "
               "fox_decode_max_splits' choice (train_fox's); \"best\": the fastest of 1, 2, 4, .. %d chunks\n", hbm / 1e9,
               measured ? "memory clock x bus width" : "not reported: H100 SXM's 3.35 TB/s", DECODE_MAX_SPLITS);
        const int Bs[] = {1, 16}, lens[] = {2048, 16384};
        const int heads[][2] = {{12, 64}, {16, 64}, {12, 128}, {16, 128}};
        for (int B : Bs)
            for (int len : lens)
                for (const auto &hd : heads) bench_case({B, hd[0], hd[1], len}, hbm);
    }
    return kc_finish("attention_decode");
}
