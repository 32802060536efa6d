// dev/cuda/gemm.cu: the block GEMMs of a fox-pro training step as train_fox.cu makes them (fox/gemm.cuh),
// each timed with every algorithm cuBLASLt's heuristic offers (up to 16, best first): TFLOP/s of its first
// choice, of the one gemm_tune keeps by this run's timings (the fastest of the first FOX_GEMM_TUNE_ALGOS that
// sum as the first does and give its bits; the first for products of fewer than FOX_GEMM_TUNE_MIN outputs)
// and of the fastest of all, with that one's configuration (tile, stages, split-K, reduction scheme,
// cluster); fails if an algorithm's product differs between two runs. Operands random bf16; accumulating
// products (beta = 1) start from the same C each time (the copy's time subtracted).
// First it checks linear_backward_weight against an fp64 product, at output widths it splits and not.
// With SECONDS, each product's candidates for gemm_tune are also held back to back that long (sustained_tflops):
// which of them is fastest once the power cap binds, against the one the tuner's bursts keep.
//   make gemm && ./gemm [dim heads T [name [SECONDS]]]   (default 760M: 1536 24 16384; 125M: 768 12 16384; name:
//   only the products whose name contains it, "" all)
#include "kcheck.h"
#include "held.h"  // held_ms
#include "../../fox/gemm.cuh"
#include "../../fox/config.h"

// Uniform values in [-1, 1) from a hash of the index (the operands are too large to draw on the host).
template <typename T> __global__ void fill_kernel(T *x, size_t n, uint32_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        x[i] = (T)((float)(h >> 8) * (2.0f / 16777216.0f) - 1.0f);
    }
}

template <typename T> static T *random_device(size_t n, uint32_t seed) {
    T *x = dmalloc<T>(n);
    fill_kernel<<<1024, 256>>>(x, n, seed);
    FOX_LAUNCH_CHECK();
    return x;
}

struct Product {
    const char *name;
    int ta, tb, m, n, k, lda, ldb, ldd;
    cudaDataType_t dtype;
    int accumulate;
};

// TFLOP/s of algorithm `run` held back to back for `seconds` (held_ms): the rate a training step gets once the GPU's
// power cap binds (dev/perf_history/2026-11-27.md "The 760M step under the power cap"), where time_ms's short bursts run at the full
// clock.
template <typename F> static double sustained_tflops(F run, double flops, double seconds, cudaStream_t s) {
    return flops / held_ms(run, seconds, s) * 1e-9;
}

static void sweep(Gemm *g, const Product &p, double seconds) {
    // column-major op(A) (m x k) and op(B) (k x n) stored with leading dimensions lda, ldb
    size_t na = (size_t)p.lda * (p.ta ? p.m : p.k), nb = (size_t)p.ldb * (p.tb ? p.k : p.n), nd = (size_t)p.ldd * p.n;
    size_t esz = p.dtype == CUDA_R_32F ? 4 : 2;
    bf16 *A = random_device<bf16>(na, 1), *B = random_device<bf16>(nb, 2);
    void *C = dmalloc<char>(nd * esz), *D = dmalloc<char>(nd * esz);
    if (p.dtype == CUDA_R_32F) fill_kernel<<<1024, 256>>>((float *)C, nd, 3);
    else FOX_CUDA_CHECK(cudaMemset(C, 0, nd * esz));
    FOX_LAUNCH_CHECK();
    GemmOp op;
    gemm_op_create(&op, p.ta, p.tb, p.m, p.n, p.k, A, p.lda, B, p.ldb, C, D, p.ldd, p.dtype, p.accumulate);
    cublasLtMatmulHeuristicResult_t res[16];
    int found = gemm_heuristics(g, &op, 16, res);
    double flops = 2.0 * p.m * p.n * p.k, tf[16];
    auto copy_c = [&] { FOX_CUDA_CHECK(cudaMemcpyAsync(D, C, nd * esz, cudaMemcpyDeviceToDevice, g->stream)); };
    auto run = [&](int i) {
        if (p.accumulate) copy_c();
        gemm_op_run(g, &op, &res[i].algo, A, B, C, D, 1.0f);
    };
    auto result = [&](int i) {
        run(i);
        std::vector<char> d(nd * esz);
        FOX_CUDA_CHECK(cudaMemcpy(d.data(), D, nd * esz, cudaMemcpyDeviceToHost));
        return d;
    };
    const std::vector<char> d0 = result(0);
    int fastest = 0, kept = 0;  // the fastest of all, and what gemm_tune keeps (by this run's timings)
    const bool tried = (size_t)p.m * p.n >= FOX_GEMM_TUNE_MIN;
    bool repeatable = true, same[16] = {false};  // same: algorithm i gives the first's bits
    for (int i = 0; i < found; i++) {
        double ms = time_ms([&] { run(i); });
        if (p.accumulate) ms -= time_ms(copy_c);
        tf[i] = flops / ms * 1e-9;
        const std::vector<char> di = result(i);
        repeatable = repeatable && di == result(i);
        same[i] = di == d0;
        if (tf[i] > tf[fastest]) fastest = i;
        if (tried && i < FOX_GEMM_TUNE_ALGOS && gemm_same_reduction(&res[0].algo, &res[i].algo) && same[i] &&
            tf[i] > tf[kept])
            kept = i;
    }
    if (seconds > 0 && tried) {  // gemm_tune's candidates (its first FOX_GEMM_TUNE_ALGOS, the first's bits) held
        int best = kept;
        double st[16] = {0};
        for (int i = 0; i < found && i < FOX_GEMM_TUNE_ALGOS; i++) {
            if (!gemm_same_reduction(&res[0].algo, &res[i].algo) || !same[i]) continue;
            st[i] = sustained_tflops([&] { gemm_op_run(g, &op, &res[i].algo, A, B, C, D, 1.0f); }, flops, seconds, g->stream);
            if (st[i] > st[best]) best = i;
        }
        printf("%-20s sustained %.1f s: kept #%d %6.1f, best #%d %6.1f TFLOP/s (%+.1f%%); each:", p.name, seconds, kept,
               st[kept], best, st[best], 100.0 * (st[best] / st[kept] - 1.0));
        for (int i = 0; i < found && i < FOX_GEMM_TUNE_ALGOS; i++)
            if (st[i] > 0) printf(" #%d %.1f (workspace %zu KiB)", i, st[i], res[i].workspaceSize >> 10);
        printf("\n");
    }
    const cublasLtMatmulAlgo_t &a = res[fastest].algo;
    std::string shape =
        fmt("m %5d n %5d k %5d %s%s", p.m, p.n, p.k, p.dtype == CUDA_R_32F ? "fp32" : "bf16", p.accumulate ? "+C" : "");
    printf("%-20s %s: %2d algos, first %6.1f, kept %6.1f (#%d), fastest %6.1f TFLOP/s (#%d: tile %d stages %d splitK %d "
           "reduction %d cluster %d)%s\n",
           p.name, shape.c_str(), found, tf[0], tf[kept], kept, tf[fastest], fastest,
           gemm_algo_config(&a, CUBLASLT_ALGO_CONFIG_TILE_ID), gemm_algo_config(&a, CUBLASLT_ALGO_CONFIG_STAGES_ID),
           gemm_algo_config(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM), gemm_algo_config(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME),
           gemm_algo_config(&a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID), repeatable ? "" : " NOT REPEATABLE");
    if (!repeatable) kc_failures++;
    gemm_op_destroy(&op);
    cudaFree(A); cudaFree(B); cudaFree(C); cudaFree(D);
}

// linear_backward_weight (dW += scale · doutᵀ in, row-major; and dW = scale · doutᵀ in, a step's first product,
// over a dW of NaNs that it must not read) against an fp64 host product, at OUT values that take the split into
// a multiple of 64 and the rest, and one that does not.
static void check_backward_weight(Gemm *g, int N, int IN, int OUT) {
    const int ldd = (OUT + 63) / 64 * 64;
    std::vector<bf16> dout = rand_bf16((size_t)N * ldd, -1, 1), in = rand_bf16((size_t)N * IN, -1, 1);
    std::vector<float> w0 = rand_f32((size_t)OUT * IN, -1, 1), nans((size_t)OUT * IN, NAN);
    bf16 *d_dout = to_device(dout), *d_in = to_device(in);
    float *d_w = to_device(w0), *d_w1 = to_device(nans);
    const float scale = 0.5f;
    linear_backward_weight(g, d_w, d_dout, ldd, d_in, N, IN, OUT, scale, 1);
    linear_backward_weight(g, d_w1, d_dout, ldd, d_in, N, IN, OUT, scale, 0);
    std::vector<double> ref((size_t)OUT * IN), ref1((size_t)OUT * IN);
    for (int o = 0; o < OUT; o++)
        for (int i = 0; i < IN; i++) {
            double acc = 0;
            for (int n = 0; n < N; n++) acc += bf(dout[(size_t)n * ldd + o]) * bf(in[(size_t)n * IN + i]);
            ref[(size_t)o * IN + i] = w0[(size_t)o * IN + i] + scale * acc;
            ref1[(size_t)o * IN + i] = scale * acc;
        }
    Group gr;
    printf("linear_backward_weight N %d IN %d OUT %d\n", N, IN, OUT);
    check_f32(gr, "dW +=", d_w, ref, TOL_F32_RED);
    check_f32(gr, "dW = (over NaN)", d_w1, ref1, TOL_F32_RED);
    cudaFree(d_dout); cudaFree(d_in); cudaFree(d_w); cudaFree(d_w1);
}

int main(int argc, char **argv) {
    print_device();
    FoxConfig c;
    fox_config_defaults(&c);
    c.d_model = argc > 1 ? atoi(argv[1]) : 1536;
    c.n_head = argc > 2 ? atoi(argv[2]) : 24;
    int N = argc > 3 ? atoi(argv[3]) : 16384;
    const double seconds = argc > 5 ? atof(argv[5]) : 0.0;
    fox_config_apply_preset(&c, "fox-pro");
    int D = c.d_model, I = c.mlp_hidden, NIN = (int)fox_dim_NIN(&c), NINP = (NIN + 63) / 64 * 64, V = c.vocab_size,
        VP = (V + 63) / 64 * 64;
    Gemm g;
    gemm_init(&g, 0);
    const int outs[] = {1001, 1024, 50257, 7};
    for (int out : outs) check_backward_weight(&g, 64, 96, out);
    // (the row-major linear y = x Wᵀ of fox/gemm.cuh: forward, backward input, backward weight)
    const Product ps[] = {
        {"attn_in fwd", 1, 0, NINP, N, D, D, D, NINP, CUDA_R_32F, 0},
        {"attn_in bwd input", 0, 0, D, N, NINP, D, NINP, D, CUDA_R_32F, 0},
        {"attn_in bwd weight", 0, 1, D, NIN, N, D, NINP, D, CUDA_R_32F, 1},
        {"attn_out fwd (+x)", 1, 0, D, N, D, D, D, D, CUDA_R_32F, 1},
        {"attn_out bwd input", 0, 0, D, N, D, D, D, D, CUDA_R_32F, 0},
        {"attn_out bwd weight", 0, 1, D, D, N, D, D, D, CUDA_R_32F, 1},
        {"mlp_in fwd", 1, 0, 2 * I, N, D, D, D, 2 * I, CUDA_R_16BF, 0},
        {"mlp_in bwd input", 0, 0, D, N, 2 * I, D, 2 * I, D, CUDA_R_32F, 0},
        {"mlp_in bwd weight", 0, 1, D, 2 * I, N, D, 2 * I, D, CUDA_R_32F, 1},
        {"mlp_out fwd (+mid)", 1, 0, D, N, I, I, I, D, CUDA_R_32F, 1},
        {"mlp_out bwd input", 0, 0, I, N, D, I, D, I, CUDA_R_16BF, 0},
        {"mlp_out bwd weight", 0, 1, I, D, N, I, D, I, CUDA_R_32F, 1},
        {"lm_head fwd", 1, 0, VP, N, D, D, D, VP, CUDA_R_16BF, 0},
        {"lm_head bwd input", 0, 0, D, N, VP, D, VP, D, CUDA_R_32F, 0},
        {"lm_head bwd weight", 0, 1, D, V, N, D, VP, D, CUDA_R_32F, 1},
        {"lm_head dW, 64k rows", 0, 1, D, V / 64 * 64, N, D, VP, D, CUDA_R_32F, 1},
        {"lm_head dW, the rest", 0, 1, D, V % 64, N, D, VP, D, CUDA_R_32F, 1},
    };
    printf("fox-pro d_model %d, mlp_hidden %d, attn_in rows %d (padded %d), %d tokens\n", D, I, NIN, NINP, N);
    for (const Product &p : ps)
        if (argc < 5 || strstr(p.name, argv[4])) sweep(&g, p, seconds);
    gemm_free(&g);
    return kc_finish("gemm");
}
