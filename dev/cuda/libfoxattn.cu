// dev/cuda/libfoxattn.cu: extern "C" wrappers around fox/attention.cuh, built as libfoxattn.so for
// scripts/bench_attention.py (ctypes passes device pointers as integers; stream 0 = current stream).
#include "../../fox/attention.cuh"

extern "C" {

void foxattn_forward(const void *q, const void *k, const void *v, const float *c, void *o, float *lse, int B, int H,
                     int T, int dh, const int *kv_first, void *stream) {
    fox_attention_forward((const __nv_bfloat16 *)q, (const __nv_bfloat16 *)k, (const __nv_bfloat16 *)v, c,
                          (__nv_bfloat16 *)o, lse, B, H, T, dh, kv_first, (cudaStream_t)stream);
}

// 1 (default): deterministic backward; 0: fp32 atomics in arrival order (fox_attention_set_deterministic).
void foxattn_set_deterministic(int on) { fox_attention_set_deterministic(on); }

size_t foxattn_backward_scratch_bytes(int B, int H, int T, int dh) {
    return fox_attention_backward_scratch_bytes(B, H, T, dh);
}

void foxattn_backward(const void *q, const void *k, const void *v, const float *c, const void *o, const float *lse,
                      const void *dout, float *dc, float *dlogf, void *dq, void *dk, void *dv, void *scratch, int B,
                      int H, int T, int dh, const int *q_last, void *stream) {
    fox_attention_backward((const __nv_bfloat16 *)q, (const __nv_bfloat16 *)k, (const __nv_bfloat16 *)v, c,
                           (const __nv_bfloat16 *)o, lse, (const __nv_bfloat16 *)dout, dc, dlogf, (__nv_bfloat16 *)dq,
                           (__nv_bfloat16 *)dk, (__nv_bfloat16 *)dv, scratch, B, H, T, dh, q_last,
                           (cudaStream_t)stream);
}

}
