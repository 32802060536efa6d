// fox/proj.cuh: attn_in_w's output rows (proj) as the GPU keeps them: its d_model-row blocks in bf16 and its
// per-head logits in fp32 (docs/model.md §1.6), and where a column of either is.
// Measurements and the variants tried: dev/cuda/NOTES.md, section "Index: the notes of each product kernel".
#ifndef FOX_PROJ_CUH
#define FOX_PROJ_CUH

#include "cuda_common.cuh"  // bf16

// The d_model-row blocks (q, k, v, the output gate: columns [0, ldw), AttnCols.wide) are the GEMM's output rounded
// once to bf16; the per-head logits after them (KV-shift, the forget gate, GSA's slot gate: columns
// [ldw, ldw + ldl)) stay fp32. A column keeps its AttnCols number in both; dproj is one bf16 array of rows of
// ldw + ldl (proj_ld).
typedef struct {
    const bf16 *wide;     // (N, ldw)
    const float *logits;  // (N, ldl); NULL when the model has no per-head logits
    int ldw, ldl;
} Proj;

__host__ __device__ __forceinline__ const bf16 *proj_wide_row(const Proj &p, size_t n) { return p.wide + n * p.ldw; }
// Row n's logit at column col (col >= ldw).
__host__ __device__ __forceinline__ float proj_logit(const Proj &p, size_t n, int col) {
    return p.logits[n * p.ldl + (col - p.ldw)];
}
__host__ __device__ __forceinline__ int proj_ld(const Proj &p) { return p.ldw + p.ldl; }

#endif  // FOX_PROJ_CUH
