// fox/gemm.cuh: the GEMMs of train_fox.cu through cuBLASLt: bf16 operands, fp32 accumulation,
// output bf16 (forward activations) or fp32 (gradients, and the residual stream through the
// beta = 1 epilogue). Row-major helpers for the three products of a linear layer y = x Wᵀ. Each shape's
// algorithm is chosen at its first product by timing the heuristic's candidates that give the same bits
// as its first choice (gemm_tune), so results do not depend on the choice.
// Measurements and the variants tried: dev/cuda/NOTES.md, section "Index: the notes of each product kernel".
#ifndef FOX_GEMM_CUH
#define FOX_GEMM_CUH

#include <string.h>
#include <stdint.h>
#include <cublasLt.h>
#include "cuda_common.cuh"  // FOX_CUDA_CHECK, bf16

#define FOX_CUBLAS_CHECK(call) fox_cublas_check((call), #call, __FILE__, __LINE__)
static inline void fox_cublas_check(cublasStatus_t st, const char *what, const char *file, int line) {
    if (st != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cuBLAS error at %s:%d: %s: status %d\n", file, line, what, (int)st);
        exit(EXIT_FAILURE);
    }
}

#define FOX_GEMM_WORKSPACE (32u << 20)
#define FOX_GEMM_CACHE 128
#define FOX_GEMM_TUNE_ALGOS 8        // the heuristic's algorithms a shape's first product tries (gemm_tune)
#define FOX_GEMM_TUNE_MIN (1u << 20)  // the fewest outputs (m·n) a product must have to be tried

// One GEMM shape and operand alignment; the cache maps it to the algorithm gemm_tune chose the first time.
typedef struct {
    int ta, tb, m, n, k, lda, ldb, ldd, dtype, accumulate, align_a, align_b, align_cd;
} GemmKey;

// Alignment of a pointer in bytes, up to 256. cuBLASLt assumes 256 unless told: weight-gradient
// slices of the flat fp32 vector can sit at any 4-byte offset (the small tensors between them).
static inline int ptr_alignment(const void *p) {
    uintptr_t a = (uintptr_t)p;
    int al = 1;
    while (al < 256 && !(a & (uintptr_t)al)) al <<= 1;
    return al;
}

typedef struct {
    cublasLtHandle_t lt;
    void *workspace;
    cudaStream_t stream;
    int ncached;
    GemmKey keys[FOX_GEMM_CACHE];
    cublasLtMatmulAlgo_t algos[FOX_GEMM_CACHE];
} Gemm;

static inline void gemm_init(Gemm *g, cudaStream_t stream) {
    FOX_CUBLAS_CHECK(cublasLtCreate(&g->lt));
    FOX_CUDA_CHECK(cudaMalloc(&g->workspace, FOX_GEMM_WORKSPACE));
    g->stream = stream;
    g->ncached = 0;
}

static inline void gemm_free(Gemm *g) {
    FOX_CUBLAS_CHECK(cublasLtDestroy(g->lt));
    FOX_CUDA_CHECK(cudaFree(g->workspace));
}

// One product's cuBLASLt description: column-major D (m×n, ldd) = alpha·op(A) op(B) + (accumulate ? C : 0),
// A/B bf16, C and D of type dtype (CUDA_R_16BF or CUDA_R_32F) with C's leading dimension ldd.
typedef struct {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    GemmKey key;
} GemmOp;

static void gemm_op_create(GemmOp *op, int ta, int tb, int m, int n, int k, const bf16 *A, int lda, const bf16 *B, int ldb,
                           const void *C, void *D, int ldd, cudaDataType_t dtype, int accumulate) {
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    FOX_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    FOX_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
    FOX_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
    FOX_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&op->la, CUDA_R_16BF, ta ? k : m, ta ? m : k, lda));
    FOX_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&op->lb, CUDA_R_16BF, tb ? n : k, tb ? k : n, ldb));
    FOX_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&op->lc, dtype, m, n, ldd));
    int align_c = accumulate && ptr_alignment(C) < ptr_alignment(D) ? ptr_alignment(C) : ptr_alignment(D);
    GemmKey key = {ta, tb, m, n, k, lda, ldb, ldd, (int)dtype, accumulate, ptr_alignment(A), ptr_alignment(B), align_c};
    op->key = key;
}

static void gemm_op_destroy(GemmOp *op) {
    FOX_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(op->la));
    FOX_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(op->lb));
    FOX_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(op->lc));
    FOX_CUBLAS_CHECK(cublasLtMatmulDescDestroy(op->desc));
}

// Up to want of the heuristic's algorithms for op, best first, within the workspace and the operands'
// alignment; returns how many (0: none).
static int gemm_heuristics(Gemm *g, const GemmOp *op, int want, cublasLtMatmulHeuristicResult_t *res) {
    cublasLtMatmulPreference_t pref;
    size_t ws = FOX_GEMM_WORKSPACE;
    FOX_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    FOX_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    uint32_t al[4] = {(uint32_t)op->key.align_a, (uint32_t)op->key.align_b, (uint32_t)op->key.align_cd,
                      (uint32_t)op->key.align_cd};
    const cublasLtMatmulPreferenceAttributes_t which[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++) FOX_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, which[i], &al[i], sizeof(al[i])));
    int found = 0;
    FOX_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(g->lt, op->desc, op->la, op->lb, op->lc, op->lc, pref, want, res, &found));
    FOX_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    return found;
}

static void gemm_op_run(Gemm *g, const GemmOp *op, const cublasLtMatmulAlgo_t *algo, const bf16 *A, const bf16 *B,
                        const void *C, void *D, float alpha) {
    const float beta = op->key.accumulate ? 1.0f : 0.0f;
    FOX_CUBLAS_CHECK(cublasLtMatmul(g->lt, op->desc, &alpha, A, op->la, B, op->lb, &beta, op->key.accumulate ? C : D, op->lc, D,
                                    op->lc, algo, g->workspace, FOX_GEMM_WORKSPACE, g->stream));
}

// Counts (out[0]) the elements of the column-major m x n matrices x and y (leading dimension ld, elements of
// T) whose bits differ, and (out[1]) x's nonzero ones.
template <typename T>
__global__ void gemm_compare_kernel(unsigned long long *out, const T *x, const T *y, int m, int n, int ld) {
    unsigned long long differ = 0, nonzero = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (size_t)m * n; i += (size_t)gridDim.x * blockDim.x) {
        size_t at = i / m * ld + i % m;
        differ += x[at] != y[at];
        nonzero += x[at] != 0;
    }
    atomicAdd(&out[0], differ);
    atomicAdd(&out[1], nonzero);
}

// Milliseconds of one run of algorithm a of op (the least of 3, after one to warm up).
static float gemm_time(Gemm *g, const GemmOp *op, const cublasLtMatmulAlgo_t *a, const bf16 *A, const bf16 *B, const void *C,
                       void *D, float alpha) {
    cudaEvent_t e0, e1;
    FOX_CUDA_CHECK(cudaEventCreate(&e0));
    FOX_CUDA_CHECK(cudaEventCreate(&e1));
    float best = 0.0f;
    for (int rep = 0; rep < 4; rep++) {
        FOX_CUDA_CHECK(cudaEventRecord(e0, g->stream));
        gemm_op_run(g, op, a, A, B, C, D, alpha);
        FOX_CUDA_CHECK(cudaEventRecord(e1, g->stream));
        FOX_CUDA_CHECK(cudaEventSynchronize(e1));
        float ms;
        FOX_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        if (rep == 1 || (rep > 1 && ms < best)) best = ms;
    }
    FOX_CUDA_CHECK(cudaEventDestroy(e0));
    FOX_CUDA_CHECK(cudaEventDestroy(e1));
    return best;
}

// An integer attribute of an algorithm's configuration (2 or 4 bytes in cuBLASLt).
static int gemm_algo_config(const cublasLtMatmulAlgo_t *a, cublasLtMatmulAlgoConfigAttributes_t what) {
    size_t size = 0;
    FOX_CUBLAS_CHECK(cublasLtMatmulAlgoConfigGetAttribute(a, what, NULL, 0, &size));
    uint64_t v = 0;
    if (size > sizeof(v)) return -1;
    FOX_CUBLAS_CHECK(cublasLtMatmulAlgoConfigGetAttribute(a, what, &v, size, &size));
    return (int)(size == 2 ? (uint16_t)v : (uint32_t)v);
}

// Whether gemm_tune may try candidate b for first choice a: the same split of k and the same reduction of
// its parts, so that every output element is summed in the same order, which the bitwise comparison then
// confirms (the comparison alone could pass by chance on a small bf16 output).
static int gemm_same_reduction(const cublasLtMatmulAlgo_t *a, const cublasLtMatmulAlgo_t *b) {
    return gemm_algo_config(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM) == gemm_algo_config(b, CUBLASLT_ALGO_CONFIG_SPLITK_NUM) &&
           gemm_algo_config(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME) ==
               gemm_algo_config(b, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME);
}

// The algorithm a shape keeps: of the heuristic's first FOX_GEMM_TUNE_ALGOS, the fastest of those that sum
// as its first does (gemm_same_reduction) and whose product has the first's bits (on the call's own
// operands; the first writes the call's result D), so the choice, which timing makes vary from run to run,
// never changes a result. A product that accumulates in place (D = C) is tried from a copy of C. The
// heuristic's first, untried, for a product of fewer than FOX_GEMM_TUNE_MIN outputs, while a stream is
// captured into a CUDA graph, when tune is 0 (no room left to keep a choice), for a zero result, or when
// the copies do not fit.
static cublasLtMatmulAlgo_t gemm_tune(Gemm *g, const GemmOp *op, const bf16 *A, const bf16 *B, const void *C, void *D,
                                      float alpha, int tune) {
    cublasLtMatmulHeuristicResult_t res[FOX_GEMM_TUNE_ALGOS];
    int found = gemm_heuristics(g, op, FOX_GEMM_TUNE_ALGOS, res);
    if (!found) {
        fprintf(stderr, "cuBLASLt: no algorithm for m=%d n=%d k=%d ta=%d tb=%d lda=%d ldb=%d ldd=%d\n", op->key.m, op->key.n,
                op->key.k, op->key.ta, op->key.tb, op->key.lda, op->key.ldb, op->key.ldd);
        exit(EXIT_FAILURE);
    }
    cudaStreamCaptureStatus capturing;
    FOX_CUDA_CHECK(cudaStreamIsCapturing(g->stream, &capturing));
    int m = op->key.m, n = op->key.n, ld = op->key.ldd, f32 = op->key.dtype == CUDA_R_32F;
    int in_place = op->key.accumulate && C == D;
    size_t span = ((size_t)(n - 1) * ld + m) * (f32 ? 4 : 2);  // the bytes of C and D the product covers
    void *S = NULL, *C0 = NULL;  // a candidate's output; in place, the C every candidate starts from
    unsigned long long *count = NULL, host[2];  // gemm_compare_kernel's counts
    tune = tune && found > 1 && (size_t)m * n >= FOX_GEMM_TUNE_MIN && capturing == cudaStreamCaptureStatusNone;
    if (tune) {  // the copies, each pointer NULL unless allocated
        int ok = cudaMalloc(&S, span) == cudaSuccess;
        if (!ok) S = NULL;
        if (ok && !(ok = cudaMalloc(&count, sizeof(host)) == cudaSuccess)) count = NULL;
        if (ok && in_place && !(ok = cudaMalloc(&C0, span) == cudaSuccess)) C0 = NULL;
        if (!ok) {  // no room: the heuristic's first
            (void)cudaGetLastError();  // the failed allocation's error
            void *got[3] = {S, count, C0};
            for (int i = 0; i < 3; i++)
                if (got[i]) FOX_CUDA_CHECK(cudaFree(got[i]));
            tune = 0;
        }
    }
    if (tune && in_place) FOX_CUDA_CHECK(cudaMemcpyAsync(C0, C, span, cudaMemcpyDeviceToDevice, g->stream));
    gemm_op_run(g, op, &res[0].algo, A, B, C, D, alpha);
    if (!tune) return res[0].algo;
    int pick = 0;
    float best = 0.0f;
    for (int i = 0; i < found; i++) {
        if (i > 0) {  // the product's bits against the first's
            if (!gemm_same_reduction(&res[0].algo, &res[i].algo)) continue;
            if (in_place) FOX_CUDA_CHECK(cudaMemcpyAsync(S, C0, span, cudaMemcpyDeviceToDevice, g->stream));
            gemm_op_run(g, op, &res[i].algo, A, B, in_place ? S : C, S, alpha);
            FOX_CUDA_CHECK(cudaMemsetAsync(count, 0, sizeof(host), g->stream));
            if (f32) gemm_compare_kernel<<<256, 256, 0, g->stream>>>(count, (const uint32_t *)D, (const uint32_t *)S, m, n, ld);
            else gemm_compare_kernel<<<256, 256, 0, g->stream>>>(count, (const uint16_t *)D, (const uint16_t *)S, m, n, ld);
            FOX_LAUNCH_CHECK();
            FOX_CUDA_CHECK(cudaMemcpyAsync(host, count, sizeof(host), cudaMemcpyDeviceToHost, g->stream));
            FOX_CUDA_CHECK(cudaStreamSynchronize(g->stream));
            if (host[0] || !host[1]) continue;
        }
        float ms = gemm_time(g, op, &res[i].algo, A, B, in_place ? S : C, S, alpha);
        if (i == 0 || ms < best) best = ms, pick = i;
    }
    FOX_CUDA_CHECK(cudaFree(count));
    FOX_CUDA_CHECK(cudaFree(S));
    if (C0) FOX_CUDA_CHECK(cudaFree(C0));
    return res[pick].algo;
}

// gemm_op_run with the algorithm gemm_tune chose at the shape's first product, cached by shape and alignment.
static void gemm_colmajor(Gemm *g, int ta, int tb, int m, int n, int k, const bf16 *A, int lda, const bf16 *B,
                          int ldb, const void *C, void *D, int ldd, cudaDataType_t dtype, int accumulate, float alpha) {
    GemmOp op;
    gemm_op_create(&op, ta, tb, m, n, k, A, lda, B, ldb, C, D, ldd, dtype, accumulate);
    int slot = -1;
    for (int i = 0; i < g->ncached && slot < 0; i++)
        if (!memcmp(&g->keys[i], &op.key, sizeof(op.key))) slot = i;
    if (slot >= 0) {
        gemm_op_run(g, &op, &g->algos[slot], A, B, C, D, alpha);
    } else {
        // D is written with the heuristic's first; a choice is timed only when the cache can keep it
        cublasLtMatmulAlgo_t algo = gemm_tune(g, &op, A, B, C, D, alpha, g->ncached < FOX_GEMM_CACHE);
        if (g->ncached < FOX_GEMM_CACHE) {
            g->keys[g->ncached] = op.key;
            g->algos[g->ncached++] = algo;
        }
    }
    gemm_op_destroy(&op);
}

// Row-major forward: out (N, OUT, ld ldo) = in (N, IN) · W (OUT, IN)ᵀ [+ C (N, OUT, ld ldo)].
static inline void linear_forward(Gemm *g, void *out, const void *C, cudaDataType_t dtype, int ldo, const bf16 *in,
                                  const bf16 *W, int N, int IN, int OUT) {
    gemm_colmajor(g, 1, 0, OUT, N, IN, W, IN, in, IN, C, out, ldo, dtype, C != NULL, 1.0f);
}

// Row-major: din (N, IN) = scale · dout (N, OUT, ld ldd) · W (OUT, IN), din fp32 or bf16 (dtype).
static inline void linear_backward_input(Gemm *g, void *din, cudaDataType_t dtype, const bf16 *dout, int ldd, const bf16 *W,
                                         int N, int IN, int OUT, float scale) {
    gemm_colmajor(g, 0, 0, IN, N, OUT, W, IN, dout, ldd, NULL, din, IN, dtype, 0, scale);
}

// Row-major: dW (OUT, IN) fp32 += scale · dout (N, OUT, ld ldd)ᵀ · in (N, IN), or = when not accumulate (a
// gradient's first product of a step, so that it need not be zeroed first). Accumulating in fp32 across
// micro-batches is what gradient accumulation needs. With OUT not a multiple of 8 (the vocabulary's
// lm_head) cuBLASLt offers only slow algorithms, so the first OUT rounded down to 64 rows and the rest are
// two products.
static inline void linear_backward_weight(Gemm *g, float *dW, const bf16 *dout, int ldd, const bf16 *in, int N, int IN, int OUT,
                                          float scale, int accumulate) {
    int head = OUT % 8 ? OUT / 64 * 64 : OUT;
    if (head) gemm_colmajor(g, 0, 1, IN, head, N, in, IN, dout, ldd, dW, dW, IN, CUDA_R_32F, accumulate, scale);
    if (head < OUT)
        gemm_colmajor(g, 0, 1, IN, OUT - head, N, in, IN, dout + head, ldd, dW + (size_t)head * IN, dW + (size_t)head * IN, IN,
                      CUDA_R_32F, accumulate, scale);
}

#endif
