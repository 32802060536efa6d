// dev/cuda/kcheck.h: what the per-kernel check-and-bench programs of dev/cuda share (rmsnorm.cu,
// attn_inputs.cu, forget_gate.cu, output_gate.cu, swiglu.cu, crossentropy.cu, adamw.cu, attention_decode.cu,
// decode_linear.cu): random inputs, device transfers with poisoned outputs, the error check against an fp64
// reference, event timing (of one launch, or per launch of back-to-back ones against HBM bandwidth), and the
// one-line summaries ("@@ ...") that run_all.sh gathers into a table.
//
// Error check: every element must satisfy |gpu − ref| <= rtol·|ref| + afrac·rms(ref), with rms(ref) the
// root mean square of the whole reference tensor (so near-zero elements born of cancellation are judged
// on the tensor's scale); NaN or Inf never passes. The line prints max |gpu − ref| and the worst
// ratio err/tol (PASS when <= 1). Tolerances (docs/model.md §2 precision):
//   TOL_BF16   an fp32 computation rounded once to bf16: rounding is <= 2^-8 relative (8 significant
//              bits), the fp32 arithmetic before it ~1e-6 of the scale: rtol 2^-8 + 1e-4, afrac 1e-4.
//   TOL_F32    fp32 element-wise math and short (<= a few thousand terms) reductions: ~10 ulps of 2^-24
//              = 6e-7 typical: rtol = afrac = 1e-5.
//   TOL_F32_RED  fp32 scans and long reductions (up to ~10^5 terms in fixed chunked/tree order): the
//              worst-case bound grows like (chunk + log2 n)·2^-24·Σ|x|, so rtol = afrac = 1e-4.
// Two outputs are cancellations whose error scales with their terms, not their value; their checks add a
// per-element bound (see check_values' `extra`): the KV-shift dα (attn_inputs.cu) and the target entry of
// a confident softmax row, p − 1 with p ≈ 1 (crossentropy.cu).
// KC_HASH=1 in the environment adds each checked output's FNV-1a hash to its line: the same program built
// from two commits, run on its fixed-seed inputs, shows which outputs changed bits (diff the hash lines).
#ifndef FOX_KCHECK_H
#define FOX_KCHECK_H

#include "../../fox/config.h"
#include "../../fox/cuda_common.cuh"  // bf16, FOX_CUDA_CHECK

#include <stdarg.h>

#include <algorithm>
#include <string>
#include <vector>

struct Tol {
    double rtol, afrac;
};
static const Tol TOL_BF16 = {0.00390625 + 1e-4, 1e-4};
static const Tol TOL_F32 = {1e-5, 1e-5};
static const Tol TOL_F32_RED = {1e-4, 1e-4};

// ---------------------------------------------------------------------------------------------
// Random numbers: xorshift64* (cheap enough for 10^8 draws).
static uint64_t kc_rng = 0x9E3779B97F4A7C15ull;
static inline double urand() {  // [0, 1)
    kc_rng ^= kc_rng >> 12;
    kc_rng ^= kc_rng << 25;
    kc_rng ^= kc_rng >> 27;
    return (double)((kc_rng * 0x2545F4914F6CDD1Dull) >> 11) * (1.0 / 9007199254740992.0);
}
static inline double uniform(double lo, double hi) { return lo + (hi - lo) * urand(); }

static inline double bf(bf16 x) { return (double)__bfloat162float(x); }

// fp32 values in [lo, hi).
static inline std::vector<float> rand_f32(size_t n, double lo, double hi) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) v[i] = (float)uniform(lo, hi);
    return v;
}
// bf16 values in [lo, hi) (the GPU's inputs; the reference reads them back exactly with bf()).
// N tokens in [0, 50) other than 7; with sep >= 0, the separator sep at position 0 and at each other position
// with probability p (the document mask's inputs, fox/docmask.h).
static inline std::vector<int> random_tokens(int N, int sep, double p) {
    std::vector<int> tokens(N);
    for (int n = 0; n < N; n++) {
        int tok = (int)uniform(0, 50);
        if (tok == 7) tok = 8;
        if (sep >= 0 && (n == 0 || urand() < p)) tok = sep;
        tokens[n] = tok;
    }
    return tokens;
}

static inline std::vector<bf16> rand_bf16(size_t n, double lo, double hi) {
    std::vector<bf16> v(n);
    for (size_t i = 0; i < n; i++) v[i] = __float2bfloat16((float)uniform(lo, hi));
    return v;
}

// ---------------------------------------------------------------------------------------------
// Device memory. Outputs are poisoned with 0xFF bytes (NaN in fp32 and bf16) before a checked launch,
// so an element the kernel fails to write fails the check.
template <typename T> static T *dmalloc(size_t n) {
    T *p;
    FOX_CUDA_CHECK(cudaMalloc(&p, (n ? n : 1) * sizeof(T)));
    return p;
}
template <typename T> static T *to_device(const std::vector<T> &h) {
    T *p = dmalloc<T>(h.size());
    FOX_CUDA_CHECK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return p;
}
template <typename T> static void upload(T *d, const std::vector<T> &h) {
    FOX_CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
}
template <typename T> static std::vector<T> to_host(const T *p, size_t n) {
    std::vector<T> h(n);
    FOX_CUDA_CHECK(cudaDeviceSynchronize());
    FOX_CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}
template <typename T> static void poison(T *p, size_t n) { FOX_CUDA_CHECK(cudaMemset(p, 0xFF, n * sizeof(T))); }

// ---------------------------------------------------------------------------------------------
// Checks. Each program checks several outputs per launch group; `Group` keeps the worst ratio.
static int kc_failures = 0;

struct Group {
    double worst = 0.0;  // max over its outputs of err/tol
    bool ok = true;
};

static uint64_t fnv1a(const void *p, size_t bytes) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < bytes; i++) h = (h ^ ((const unsigned char *)p)[i]) * 0x100000001b3ull;
    return h;
}

// extra (optional): a per-element absolute tolerance added to the above, for outputs formed by
// cancellation whose error bound scales with the size of the terms, not of the result.
static void check_values(Group &g, const char *what, const std::vector<double> &gpu, const std::vector<double> &ref, Tol tol,
                         const std::vector<double> *extra = nullptr) {
    double ss = 0.0;
    for (double r : ref) ss += r * r;
    const double rms = ref.empty() ? 0.0 : sqrt(ss / ref.size());
    double maxabs = 0.0, worst = 0.0;
    size_t bad = 0, first_bad = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        const double d = fabs(gpu[i] - ref[i]), t = tol.rtol * fabs(ref[i]) + tol.afrac * rms + (extra ? (*extra)[i] : 0.0) + 1e-300;
        if (!std::isfinite(gpu[i]) || d > t) {
            if (!bad) first_bad = i;
            bad++;
        }
        if (std::isfinite(gpu[i])) {
            maxabs = std::max(maxabs, d);
            worst = std::max(worst, d / t);
        } else {
            worst = INFINITY;
        }
    }
    const bool ok = bad == 0;
    printf("    %-14s n %-10zu max|err| %9.3e  rms(ref) %9.3e  err/tol %7.4f  %s", what, ref.size(), maxabs, rms,
           worst, ok ? "ok" : "FAIL");
    if (!ok) printf("  (%zu bad; first [%zu] gpu %.8g ref %.8g)", bad, first_bad, gpu[first_bad], ref[first_bad]);
    if (getenv("KC_HASH")) printf("  hash %016llx", (unsigned long long)fnv1a(gpu.data(), gpu.size() * sizeof(double)));
    printf("\n");
    g.worst = std::max(g.worst, worst);
    if (!ok) {
        g.ok = false;
        kc_failures++;
    }
}

static std::vector<double> widen(const std::vector<float> &v) { return std::vector<double>(v.begin(), v.end()); }
static std::vector<double> widen(const std::vector<bf16> &v) {
    std::vector<double> d(v.size());
    for (size_t i = 0; i < v.size(); i++) d[i] = bf(v[i]);
    return d;
}

static inline void check_f32(Group &g, const char *what, const float *dev, const std::vector<double> &ref, Tol tol) {
    check_values(g, what, widen(to_host(dev, ref.size())), ref, tol);
}
static inline void check_bf16(Group &g, const char *what, const bf16 *dev, const std::vector<double> &ref, Tol tol = TOL_BF16) {
    check_values(g, what, widen(to_host(dev, ref.size())), ref, tol);
}

// ---------------------------------------------------------------------------------------------
// Timing: `warm` launches, then `reps` timed one by one with events; the median in ms.
template <typename F> static double time_ms(F f, int warm = 3, int reps = 21) {
    cudaEvent_t a, b;
    FOX_CUDA_CHECK(cudaEventCreate(&a));
    FOX_CUDA_CHECK(cudaEventCreate(&b));
    for (int i = 0; i < warm; i++) f();
    FOX_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> ms(reps);
    for (int i = 0; i < reps; i++) {
        FOX_CUDA_CHECK(cudaEventRecord(a));
        f();
        FOX_CUDA_CHECK(cudaEventRecord(b));
        FOX_CUDA_CHECK(cudaEventSynchronize(b));
        FOX_CUDA_CHECK(cudaEventElapsedTime(&ms[i], a, b));
    }
    FOX_CUDA_CHECK(cudaEventDestroy(a));
    FOX_CUDA_CHECK(cudaEventDestroy(b));
    std::sort(ms.begin(), ms.end());
    return ms[reps / 2];
}

static double l2_bytes() {
    static double l2 = -1.0;
    if (l2 < 0) {
        int dev = 0, v = 0;
        FOX_CUDA_CHECK(cudaGetDevice(&dev));
        FOX_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrL2CacheSize, dev));
        l2 = v;
    }
    return l2;
}

// One summary row: program, operation, shape, worst err/tol, PASS/FAIL, median µs, the bytes that must
// move (each input read once, each output written once) over the time. "L2" marks a working set under
// twice the L2 size: its GB/s is not an HBM figure.
static inline void summary(const char *prog, const char *op, const std::string &shape, const Group &g, double ms, double bytes) {
    printf("@@ %s | %s | %s | %.3f | %s | %.2f | %.0f%s\n", prog, op, shape.c_str(), g.worst, g.ok ? "PASS" : "FAIL",
           ms * 1e3, bytes / (ms * 1e-3) / 1e9, bytes < 2 * l2_bytes() ? " (L2)" : "");
    fflush(stdout);
}

// The device's HBM bandwidth from its memory clock (kHz, double data rate) and bus width; 3.35e12 B/s (H100
// SXM's datasheet figure) when the runtime reports neither.
static inline double hbm_bytes_per_s(bool *measured) {
    int dev = 0, clk = 0, bits = 0;
    FOX_CUDA_CHECK(cudaGetDevice(&dev));
    FOX_CUDA_CHECK(cudaDeviceGetAttribute(&clk, cudaDevAttrMemoryClockRate, dev));
    FOX_CUDA_CHECK(cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, dev));
    *measured = clk > 0 && bits > 0;
    return *measured ? 2.0 * clk * 1e3 * bits / 8.0 : 3.35e12;
}

// Median over 7 trials of the time per launch (µs) of 40 back-to-back launches (as a decode step issues
// them), each launch on the next of `sets` copies of its operands so that the reads come from HBM, not L2.
template <typename F> static double us_per_launch(F launch, int sets) {
    cudaEvent_t a, b;
    FOX_CUDA_CHECK(cudaEventCreate(&a));
    FOX_CUDA_CHECK(cudaEventCreate(&b));
    for (int i = 0; i < 10; i++) launch(i % sets);
    std::vector<float> per;
    for (int trial = 0; trial < 7; trial++) {
        FOX_CUDA_CHECK(cudaEventRecord(a));
        for (int i = 0; i < 40; i++) launch(i % sets);
        FOX_CUDA_CHECK(cudaEventRecord(b));
        FOX_CUDA_CHECK(cudaEventSynchronize(b));
        float ms;
        FOX_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
        per.push_back(ms * 1e3f / 40);
    }
    FOX_CUDA_CHECK(cudaEventDestroy(a));
    FOX_CUDA_CHECK(cudaEventDestroy(b));
    std::sort(per.begin(), per.end());
    return per[per.size() / 2];
}

static void print_device() {
    int dev = 0;
    cudaDeviceProp p;
    FOX_CUDA_CHECK(cudaGetDevice(&dev));
    FOX_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
    printf("device: %s (%d SMs, L2 %.0f MiB)\n", p.name, p.multiProcessorCount, p.l2CacheSize / 1048576.0);
}

static std::string fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static std::string fmt(const char *f, ...) {
    char buf[256];
    va_list ap;
    va_start(ap, f);
    vsnprintf(buf, sizeof buf, f, ap);
    va_end(ap);
    return buf;
}

static int kc_finish(const char *prog) {
    if (kc_failures) printf("%s: %d check(s) FAILED\n", prog, kc_failures);
    else printf("%s: all checks passed\n", prog);
    return kc_failures ? 1 : 0;
}

static inline double sigmoid_d(double x) { return 1.0 / (1.0 + exp(-x)); }

#endif
