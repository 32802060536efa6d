// fox/gemm.cuh: the GEMMs of train_fox.cu through cuBLASLt: bf16 operands, fp32 accumulation,
// output bf16 (forward activations) or fp32 (gradients, and the residual stream through the
// beta = 1 epilogue). Row-major helpers for the three products of a linear layer y = x Wᵀ.
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

// One GEMM shape and operand alignment; the cache maps it to the algorithm the heuristic chose the
// first time.
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

// Column-major D (m×n, ldd) = alpha·op(A) op(B) + (accumulate ? C : 0), A/B bf16, C and D of type
// dtype (CUDA_R_16BF or CUDA_R_32F) with C's leading dimension ldd.
static void gemm_colmajor(Gemm *g, int ta, int tb, int m, int n, int k, const bf16 *A, int lda, const bf16 *B,
                          int ldb, const void *C, void *D, int ldd, cudaDataType_t dtype, int accumulate, float alpha) {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    FOX_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    FOX_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
    FOX_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
    FOX_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, ta ? k : m, ta ? m : k, lda));
    FOX_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, tb ? n : k, tb ? k : n, ldb));
    FOX_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lc, dtype, m, n, ldd));
    int align_c = accumulate && ptr_alignment(C) < ptr_alignment(D) ? ptr_alignment(C) : ptr_alignment(D);
    GemmKey key = {ta, tb, m, n, k, lda, ldb, ldd, (int)dtype, accumulate, ptr_alignment(A), ptr_alignment(B), align_c};
    int slot = -1;
    for (int i = 0; i < g->ncached && slot < 0; i++)
        if (!memcmp(&g->keys[i], &key, sizeof(key))) slot = i;
    cublasLtMatmulAlgo_t algo;
    if (slot >= 0) {
        algo = g->algos[slot];
    } else {
        cublasLtMatmulPreference_t pref;
        size_t ws = FOX_GEMM_WORKSPACE;
        FOX_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
        FOX_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
        uint32_t al[4] = {(uint32_t)key.align_a, (uint32_t)key.align_b, (uint32_t)key.align_cd, (uint32_t)key.align_cd};
        const cublasLtMatmulPreferenceAttributes_t which[4] = {
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
        for (int i = 0; i < 4; i++)
            FOX_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, which[i], &al[i], sizeof(al[i])));
        cublasLtMatmulHeuristicResult_t heur;
        int found = 0;
        FOX_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(g->lt, desc, la, lb, lc, lc, pref, 1, &heur, &found));
        if (!found) {
            fprintf(stderr, "cuBLASLt: no algorithm for m=%d n=%d k=%d ta=%d tb=%d lda=%d ldb=%d ldd=%d\n", m, n, k, ta, tb, lda, ldb, ldd);
            exit(EXIT_FAILURE);
        }
        FOX_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
        algo = heur.algo;
        if (g->ncached < FOX_GEMM_CACHE) {
            g->keys[g->ncached] = key;
            g->algos[g->ncached++] = algo;
        }
    }
    const float beta = accumulate ? 1.0f : 0.0f;
    FOX_CUBLAS_CHECK(cublasLtMatmul(g->lt, desc, &alpha, A, la, B, lb, &beta, accumulate ? C : D, lc, D, lc, &algo,
                                    g->workspace, FOX_GEMM_WORKSPACE, g->stream));
    FOX_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(la));
    FOX_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(lb));
    FOX_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(lc));
    FOX_CUBLAS_CHECK(cublasLtMatmulDescDestroy(desc));
}

// Row-major forward: out (N, OUT, ld ldo) = in (N, IN) · W (OUT, IN)ᵀ [+ C (N, OUT, ld ldo)].
static inline void linear_forward(Gemm *g, void *out, const void *C, cudaDataType_t dtype, int ldo, const bf16 *in,
                                  const bf16 *W, int N, int IN, int OUT) {
    gemm_colmajor(g, 1, 0, OUT, N, IN, W, IN, in, IN, C, out, ldo, dtype, C != NULL, 1.0f);
}

// Row-major: din (N, IN) fp32 = scale · dout (N, OUT, ld ldd) · W (OUT, IN).
static inline void linear_backward_input(Gemm *g, float *din, const bf16 *dout, int ldd, const bf16 *W, int N, int IN, int OUT,
                                         float scale) {
    gemm_colmajor(g, 0, 0, IN, N, OUT, W, IN, dout, ldd, NULL, din, IN, CUDA_R_32F, 0, scale);
}

// Row-major: dW (OUT, IN) fp32 += scale · dout (N, OUT, ld ldd)ᵀ · in (N, IN). Accumulating in fp32 across
// micro-batches is what gradient accumulation needs.
static inline void linear_backward_weight(Gemm *g, float *dW, const bf16 *dout, int ldd, const bf16 *in, int N, int IN, int OUT,
                                          float scale) {
    gemm_colmajor(g, 0, 1, IN, OUT, N, in, IN, dout, ldd, dW, dW, IN, CUDA_R_32F, 1, scale);
}

#endif
