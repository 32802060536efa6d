// dev/cuda/swiglu.cu: checks the SwiGLU kernels of fox/swiglu.cuh (h = silu(a) ⊙ b over u = [a | b],
// bf16 in and out; backward du from bf16 dh, and h again, which must equal the forward's bitwise: the
// trainer keeps no per-block copy of it) against an fp64 CPU reference, then times them, with the
// launchers train_fox.cu calls (8 units per thread; element by element when I % 8 != 0).
//   make swiglu && ./swiglu
#include "kcheck.h"
#include "../../fox/swiglu.cuh"        // fox_swiglu_forward/backward

static void launch_fwd(bf16 *h, const bf16 *u, int N, int I) { fox_swiglu_forward(h, u, N, I, 0); }
static void launch_bwd(bf16 *du, bf16 *h, const bf16 *dh, const bf16 *u, int N, int I) {
    fox_swiglu_backward(du, h, dh, u, N, I, 0);
}

static void run(int N, int I) {
    std::string shape = fmt("N=%d I=%d", N, I);
    printf("swiglu %s\n", shape.c_str());
    const size_t n = (size_t)N * I;
    std::vector<bf16> u(2 * n);
    for (int r = 0; r < N; r++)
        for (int j = 0; j < I; j++) {
            u[(size_t)r * 2 * I + j] = __float2bfloat16((float)uniform(-8, 8));      // a: the sigmoid's tails too
            u[(size_t)r * 2 * I + I + j] = __float2bfloat16((float)uniform(-2, 2));  // b
        }
    std::vector<bf16> dh = rand_bf16(n, -1, 1);
    bf16 *du_ = to_device(u), *dhout = dmalloc<bf16>(n), *ddu = dmalloc<bf16>(2 * n), *dh2 = dmalloc<bf16>(n);
    bf16 *ddh = to_device(dh);

    std::vector<double> h(n), rdu(2 * n);
    for (int r = 0; r < N; r++)
        for (int j = 0; j < I; j++) {
            size_t ia = (size_t)r * 2 * I + j, ib = ia + I, i = (size_t)r * I + j;
            double a = bf(u[ia]), b = bf(u[ib]), sg = sigmoid_d(a), g = bf(dh[i]);
            h[i] = a * sg * b;
            rdu[ia] = g * b * sg * (1.0 + a * (1.0 - sg));
            rdu[ib] = g * a * sg;
        }
    Group gf, gb;
    poison(dhout, n);
    launch_fwd(dhout, du_, N, I);
    check_bf16(gf, "h", dhout, h);
    poison(ddu, 2 * n);
    poison(dh2, n);
    launch_bwd(ddu, dh2, ddh, du_, N, I);
    check_bf16(gb, "du", ddu, rdu);
    bool same = !memcmp(to_host(dh2, n).data(), to_host(dhout, n).data(), n * sizeof(bf16));
    printf("    %-14s %s\n", "h = fwd h", same ? "bitwise ok" : "FAIL");
    if (!same) gb.ok = false, kc_failures++;

    double tf = time_ms([&] { launch_fwd(dhout, du_, N, I); });
    double tb = time_ms([&] { launch_bwd(ddu, dh2, ddh, du_, N, I); });
    summary("swiglu", "fwd", shape, gf, tf, n * (4.0 + 2.0));
    summary("swiglu", "bwd (+h)", shape, gb, tb, n * (2.0 + 4.0 + 4.0 + 2.0));
    cudaFree(du_); cudaFree(dhout); cudaFree(ddu); cudaFree(ddh); cudaFree(dh2);
}

int main() {
    print_device();
    // I: fox-pro's MLP width for d_model 64, 768, 1536 (256·ceil(3.5d/3 / 256)), and an odd one
    const int Is[] = {256, 1792, 3584}, Ns[] = {1, 7, 255, 1000};
    for (int I : Is)
        for (int N : Ns) run(N, I);
    run(1000, 333);
    run(16384, 1792);
    run(16384, 3584);
    return kc_finish("swiglu");
}
