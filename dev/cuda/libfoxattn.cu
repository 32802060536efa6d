// dev/cuda/libfoxattn.cu: extern "C" wrappers around fox/attention.cuh, built as libfoxattn.so for
// scripts/bench_attention.py (ctypes passes device pointers as integers; stream 0 = current stream).
#include "../../fox/attention.cuh"  // fox_attention_forward, fox_attention_backward(_scratch_bytes)

extern "C" {

void foxattn_forward(const void *q, const void *k, const void *v, const float *c, void *o, float *lse, int B, int H,
                     int T, int dh, const int *kv_first, void *stream) {
    fox_attention_forward((const __nv_bfloat16 *)q, (const __nv_bfloat16 *)k, (const __nv_bfloat16 *)v, c,
                          (__nv_bfloat16 *)o, lse, B, H, T, dh, kv_first, (cudaStream_t)stream);
}

size_t foxattn_backward_scratch_bytes(int B, int H, int T, int dh) {
    return fox_attention_backward_scratch_bytes(B, H, T, dh);
}

// deterministic: 1 for bitwise-repeatable outputs, 0 for fp32 atomics in arrival order.
void foxattn_backward(const void *q, const void *k, const void *v, const float *c, const void *o, const float *lse,
                      const void *dout, float *dc, float *dlogf, void *dq, void *dk, void *dv, void *scratch, int B,
                      int H, int T, int dh, const int *q_last, int deterministic, void *stream) {
    fox_attention_backward((const __nv_bfloat16 *)q, (const __nv_bfloat16 *)k, (const __nv_bfloat16 *)v, c,
                           (const __nv_bfloat16 *)o, lse, (const __nv_bfloat16 *)dout, dc, dlogf, (__nv_bfloat16 *)dq,
                           (__nv_bfloat16 *)dk, (__nv_bfloat16 *)dv, scratch, B, H, T, dh, q_last, deterministic,
                           (cudaStream_t)stream);
}

}
