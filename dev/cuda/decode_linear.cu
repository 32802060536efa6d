// dev/cuda/decode_linear.cu: checks the batch-1 decode step's GEMV (fox/decode.cuh: fox_decode_linear, y = x Wᵀ
// for one row, with its four epilogues) and the decode row norm (fox_decode_rmsnorm, any number of rows)
// against fp64 CPU references, then times the GEMV beside cuBLASLt (fox/gemm.cuh's linear_forward, what the
// training step uses) at the shapes of a 125M and a 760M fox-pro decode step: GB/s of the weights read,
// against HBM bandwidth. (A version for 4 and 16 rows lost to cuBLASLt there: NOTES.md.)
//   make decode_linear && ./decode_linear        (./decode_linear check | ./decode_linear bench)
#include "kcheck.h"
#include "../../fox/rng.h"      // fox_mix64: the bench weights filled on the device
#include "../../fox/gemm.cuh"    // Gemm, linear_forward: cuBLASLt, the comparison
#include "../../fox/decode.cuh"  // fox_decode_linear, fox_decode_rmsnorm
#include "../../fox/swiglu.cuh"  // fox_swiglu_forward: the cuBLASLt comparison's separate SwiGLU

// g and u rounded to bf16 before silu(g)·u (as the forward's mlp_u), then h: three roundings, and silu's
// relative slope 1 + g(1 − σ(g)) stays under 1.3 where |h| is not small against the tensor's scale.
static const Tol TOL_SWIGLU = {3 * 0.00390625, 2e-3};

static const char *epi_name(int epi) {
    return epi == DECODE_F32 ? "f32" : epi == DECODE_F32_ADD ? "f32+C" : epi == DECODE_BF16 ? "bf16" : "swiglu";
}

static void check_linear(int IN, int OUT, int epi) {
    const int B = 1, rows = epi == DECODE_SWIGLU ? 2 * OUT : OUT, ldo = OUT;
    std::string shape = fmt("IN=%d OUT=%d %s", IN, OUT, epi_name(epi));
    printf("decode_linear %s\n", shape.c_str());
    std::vector<bf16> x = rand_bf16((size_t)B * IN, -2.0, 2.0), w = rand_bf16((size_t)rows * IN, -0.1, 0.1);
    std::vector<float> c = rand_f32((size_t)B * ldo, -1.0, 1.0);
    std::vector<double> ref((size_t)B * OUT);
    for (int n = 0; n < B; n++)
        for (int o = 0; o < OUT; o++) {
            double y[2] = {0.0, 0.0};
            for (int r = 0; r < (epi == DECODE_SWIGLU ? 2 : 1); r++)
                for (int i = 0; i < IN; i++) y[r] += bf(x[(size_t)n * IN + i]) * bf(w[((size_t)o + r * OUT) * IN + i]);
            double g = (double)__bfloat162float(__float2bfloat16((float)y[0])), u = (double)__bfloat162float(__float2bfloat16((float)y[1]));
            ref[(size_t)n * OUT + o] = epi == DECODE_SWIGLU ? g / (1.0 + exp(-g)) * u
                                       : y[0] + (epi == DECODE_F32_ADD ? (double)c[(size_t)n * ldo + o] : 0.0);
        }
    bf16 *dx = to_device(x), *dw = to_device(w);
    float *dc = to_device(c);
    const bool f32 = epi == DECODE_F32 || epi == DECODE_F32_ADD;
    void *dout = f32 ? (void *)dmalloc<float>((size_t)B * ldo) : (void *)dmalloc<bf16>((size_t)B * ldo);
    if (f32) poison((float *)dout, (size_t)B * ldo);
    else poison((bf16 *)dout, (size_t)B * ldo);
    fox_decode_linear(dout, epi == DECODE_F32_ADD ? dc : nullptr, dx, dw, IN, OUT, epi, 0, 1);
    std::vector<double> got((size_t)B * OUT);
    if (f32) {
        std::vector<float> h = to_host((float *)dout, (size_t)B * ldo);
        for (int n = 0; n < B; n++)
            for (int o = 0; o < OUT; o++) got[(size_t)n * OUT + o] = h[(size_t)n * ldo + o];
    } else {
        std::vector<bf16> h = to_host((bf16 *)dout, (size_t)B * ldo);
        for (int n = 0; n < B; n++)
            for (int o = 0; o < OUT; o++) got[(size_t)n * OUT + o] = bf(h[(size_t)n * ldo + o]);
    }
    Group g;
    check_values(g, "y", got, ref, f32 ? TOL_F32_RED : epi == DECODE_BF16 ? TOL_BF16 : TOL_SWIGLU);
    cudaFree(dx); cudaFree(dw); cudaFree(dc); cudaFree(dout);
}

static void check_rmsnorm(int N, int D) {
    std::string shape = fmt("N=%d D=%d", N, D);
    printf("decode_rmsnorm %s\n", shape.c_str());
    std::vector<float> x = rand_f32((size_t)N * D, -3.0, 3.0), w = rand_f32(D, 0.5, 1.5);
    std::vector<double> ref((size_t)N * D);
    for (int n = 0; n < N; n++) {
        double ss = 0.0;
        for (int i = 0; i < D; i++) ss += (double)x[(size_t)n * D + i] * x[(size_t)n * D + i];
        double rs = 1.0 / sqrt(ss / D + FOX_NORM_EPS);
        for (int i = 0; i < D; i++) ref[(size_t)n * D + i] = x[(size_t)n * D + i] * rs * w[i];
    }
    float *dx = to_device(x), *dw = to_device(w);
    bf16 *dout = dmalloc<bf16>((size_t)N * D);
    poison(dout, (size_t)N * D);
    fox_decode_rmsnorm(dout, dx, dw, N, D, 0, 1);
    Group g;
    check_bf16(g, "out", dout, ref);
    cudaFree(dx); cudaFree(dw); cudaFree(dout);
}

// ---------------------------------------------------------------------------------------------
// Bench: us_per_launch (kcheck.h), the weights rotating over enough copies to leave L2.


// bf16 values in [-0.05, 0.05) from a hash of the index.
__global__ void fill_weights(bf16 *x, size_t n, uint64_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = __float2bfloat16((float)(fox_mix64(seed + i) >> 40) * (0.1f / 16777216.0f) - 0.05f);
}

struct BenchShape {
    const char *what;
    int IN, OUT, epi;  // SwiGLU: OUT outputs of 2·OUT weight rows
};

static void bench_shape(Gemm *gemm, const BenchShape &bs, double hbm) {
    const int B = 1;
    const int rows = bs.epi == DECODE_SWIGLU ? 2 * bs.OUT : bs.OUT;
    const size_t nw = (size_t)rows * bs.IN;
    const double wbytes = nw * sizeof(bf16);
    const int sets = (int)std::max(1.0, std::ceil(4.0 * l2_bytes() / wbytes));
    bf16 *w = dmalloc<bf16>(nw * sets), *x = dmalloc<bf16>((size_t)B * bs.IN), *u = dmalloc<bf16>((size_t)B * 2 * bs.OUT);
    float *c = dmalloc<float>((size_t)B * bs.OUT), *y = dmalloc<float>((size_t)B * rows);
    fill_weights<<<1024, 256>>>(w, nw * sets, 1);
    fill_weights<<<64, 256>>>(x, (size_t)B * bs.IN, 2);
    FOX_CUDA_CHECK(cudaMemset(c, 0, (size_t)B * bs.OUT * sizeof(float)));
    FOX_LAUNCH_CHECK();
    const float *C = bs.epi == DECODE_F32_ADD ? c : nullptr;
    double ours = us_per_launch([&](int s) {
        fox_decode_linear(bs.epi == DECODE_F32_ADD ? (void *)c : (void *)y, C, x, w + nw * s, bs.IN, bs.OUT, bs.epi, 0, 1);
    }, sets);
    double lt = us_per_launch([&](int s) {  // what train_fox ran before: the GEMM, then SwiGLU as its own kernel
        if (bs.epi == DECODE_SWIGLU) {
            linear_forward(gemm, u, nullptr, CUDA_R_16BF, 2 * bs.OUT, x, w + nw * s, B, bs.IN, 2 * bs.OUT);
            fox_swiglu_forward((bf16 *)y, u, B, bs.OUT, 0);
        } else {
            linear_forward(gemm, bs.epi == DECODE_F32_ADD ? (void *)c : (void *)y, C,
                           bs.epi == DECODE_BF16 ? CUDA_R_16BF : CUDA_R_32F, bs.OUT, x, w + nw * s, B, bs.IN, bs.OUT);
        }
    }, sets);
    printf("%-20s IN=%-5d OUT=%-5d %6s | %7.2f MB | decode_linear %8.2f us %6.0f GB/s %5.1f%% | cuBLASLt %8.2f us "
           "%6.0f GB/s %5.1f%%\n", bs.what, bs.IN, bs.OUT, epi_name(bs.epi), wbytes / 1e6, ours, wbytes / ours * 1e-3,
           100.0 * wbytes / (ours * 1e-6) / hbm, lt, wbytes / lt * 1e-3, 100.0 * wbytes / (lt * 1e-6) / hbm);
    fflush(stdout);
    cudaFree(w); cudaFree(x); cudaFree(u); cudaFree(c); cudaFree(y);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "all";
    print_device();
    if (strcmp(mode, "bench") != 0) {
        const int shapes[][2] = {{64, 37}, {768, 300}, {2048, 129}, {1536, 1031}};
        for (const auto &sh : shapes)
            for (int epi = DECODE_F32; epi <= DECODE_SWIGLU; epi++) check_linear(sh[0], sh[1], epi);
        const int norms[][2] = {{1, 64}, {3, 768}, {16, 1536}, {2, 4100}};
        for (const auto &nd : norms) check_rmsnorm(nd[0], nd[1]);
    }
    if (strcmp(mode, "check") != 0) {
        bool measured;
        const double hbm = hbm_bytes_per_s(&measured);
        printf("HBM bandwidth %.0f GB/s; bytes = the weights read once; %% of that bandwidth\n", hbm / 1e9);
        // fox-pro: attn_in = q, k, v, output gate, forget gate, k and v shift rows (fox/config.h); SwiGLU 8/3·D
        const BenchShape shapes[] = {
            {"125M attn_in", 768, 4 * 768 + 3 * 12, DECODE_F32}, {"125M attn_out", 768, 768, DECODE_F32_ADD},
            {"125M mlp_in+swiglu", 768, 2048, DECODE_SWIGLU},     {"125M mlp_out", 2048, 768, DECODE_F32_ADD},
            {"125M lm_head", 768, 50304, DECODE_BF16},           {"760M attn_in", 1536, 4 * 1536 + 3 * 24, DECODE_F32},
            {"760M attn_out", 1536, 1536, DECODE_F32_ADD},       {"760M mlp_in+swiglu", 1536, 4096, DECODE_SWIGLU},
            {"760M mlp_out", 4096, 1536, DECODE_F32_ADD},        {"760M lm_head", 1536, 50304, DECODE_BF16},
        };
        Gemm gemm;
        gemm_init(&gemm, 0);
        for (const BenchShape &bs : shapes) bench_shape(&gemm, bs, hbm);
        gemm_free(&gemm);
    }
    return kc_finish("decode_linear");
}
