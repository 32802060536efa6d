// dev/cuda/step_profile.cu: where one training step of train_fox goes. Builds the model of the
// arguments (default fox-pro 760M, batch 1 x 16384, random tokens), runs one step to warm up, then
// times each piece of layer 0 (and the lm_head, embedding and optimizer) with CUDA events, scaled by
// the number of layers where a piece runs once per layer.
// Usage: ./step_profile [layers dim heads T keep]   (repository root: make -C dev/cuda step_profile)
// keep: the blocks whose q, k, v and xn, z, h the forward keeps (default -1: all, as train_fox where memory
// allows; the q, k, v recompute and the backward kernels' rewrites are timed when none are).
#define TESTING
#include "../../train_fox.cu"

static cudaEvent_t ev0, ev1;
static double total_ms;

#define TIME(label, per_layer, ...)                                                                     \
    do {                                                                                                \
        __VA_ARGS__;                                                                                    \
        FOX_CUDA_CHECK(cudaEventRecord(ev0, m.stream));                                                 \
        for (int rep = 0; rep < 3; rep++) { __VA_ARGS__; }                                                     \
        FOX_CUDA_CHECK(cudaEventRecord(ev1, m.stream));                                                 \
        FOX_CUDA_CHECK(cudaEventSynchronize(ev1));                                                      \
        float ms;                                                                                       \
        FOX_CUDA_CHECK(cudaEventElapsedTime(&ms, ev0, ev1));                                            \
        double step_ms = ms / 3 * ((per_layer) ? L : 1);                                                \
        total_ms += step_ms;                                                                            \
        printf("%-34s %9.3f ms %s  -> %8.2f ms/step\n", label, ms / 3, (per_layer) ? "x L" : "   ", step_ms); \
    } while (0)

int main(int argc, char **argv) {
    int L = argc > 1 ? atoi(argv[1]) : 24, D = argc > 2 ? atoi(argv[2]) : 1536, H = argc > 3 ? atoi(argv[3]) : 24;
    int T = argc > 4 ? atoi(argv[4]) : 16384, B = 1, N = B * T, keep = argc > 5 ? atoi(argv[5]) : -1;
    FoxConfig c;
    fox_config_defaults(&c);
    c.n_layer = L;
    c.d_model = D;
    c.n_head = H;
    fox_config_apply_preset(&c, "fox-pro");
    Model m;
    ModelOptions opts = {B, T, 1337, 0, RECOMPUTE_NONE, 0, -1, 0, 1, 0, keep, keep};
    model_init(&m, &c, &opts);
    int *in = (int *)fox_malloc((size_t)N * sizeof(int)), *tg = (int *)fox_malloc((size_t)N * sizeof(int));
    for (int i = 0; i < N; i++) {
        in[i] = (int)fox_rng_below(fox_rng_key(5, 0), (uint64_t)i, (uint64_t)c.vocab_size);
        tg[i] = (int)fox_rng_below(fox_rng_key(5, 1), (uint64_t)i, (uint64_t)c.vocab_size);
    }
    OptConfig o = {1e-3, 0.0, 0.1, 1.0, 0.9, 0.95, 1e-8, 10, 100};
    FOX_CUDA_CHECK(cudaEventCreate(&ev0));
    FOX_CUDA_CHECK(cudaEventCreate(&ev1));
    double t0 = 0;
    for (int s = 0; s < 3; s++) {
        FOX_CUDA_CHECK(cudaDeviceSynchronize());
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        model_zero_grad(&m);
        model_forward(&m, in, tg, B, T);
        model_backward(&m, in, B, T, 1.0f, 0);
        optimizer_step(&m, &o, 1e-4, s + 1);
        FOX_CUDA_CHECK(cudaDeviceSynchronize());
        clock_gettime(CLOCK_MONOTONIC, &b);
        t0 = (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) * 1e-6;
        printf("whole step %d: %.1f ms (%.0f tok/s)\n", s, t0, N / t0 * 1e3);
    }
    model_forward(&m, in, tg, B, T);  // fills every buffer (the lm_head piece writes the logits again)
    Acts *a = &m.a;
    Scratch *s = &m.s;
    int I = c.mlp_hidden, NINP = m.NINP, Dh = m.Dh, V = c.vocab_size;
    QkvInputs qs = qkv_inputs(&m, 0, B, T);
    float *x = resid_at(&m, 0, B, T);
    printf("--- forward (layer 0, x L)\n");
    TIME("rmsnorm fwd", 1, rmsnorm_forward(&m, a->xn1[0], x, param(&m, FOX_P_ln1_w, 0), N));
    TIME("gemm attn_in (bf16 + fp32 logits)", 1, attn_in_forward(&m, a->proj_wide[0], a->proj_logits[0], a->xn1[0], 0, N, 0));
    TIME("qkv fwd (shift, qk-norm)", 1, fox_qkv_forward(a->q[0], a->k[0], a->v[0], qs, m.stream));
    TIME("forget-gate scan", 1, fox_forget_gate_forward(a->c[0], proj_at(&m, 0), m.cols.fgate, param(&m, FOX_P_fgate_b, 0), a->inputs, m.doc_sep, B, H, T, m.stream));
    TIME("attention fwd", 1, fox_attention_forward(a->q[0], a->k[0], a->v[0], a->c[0], a->o[0], a->lse[0], B, H, T, Dh, NULL, m.stream));
    TIME("output norm+gate fwd", 1, fox_output_forward(a->z[0], a->o[0], proj_at(&m, 0), m.cols.gate, param(&m, FOX_P_onorm_w, 0), N, H, Dh, m.stream));
    TIME("gemm attn_out (+resid)", 1, linear_forward(&m.gemm, a->mid[0], x, CUDA_R_32F, D, a->z[0], wbf(&m, FOX_P_attn_out_w, 0), N, D, D));
    TIME("gemm mlp_in (bf16 out)", 1, linear_forward(&m.gemm, a->mlp_u[0], NULL, CUDA_R_16BF, 2 * I, a->xn2[0], wbf(&m, FOX_P_mlp_in_w, 0), N, D, 2 * I));
    TIME("swiglu fwd", 1, fox_swiglu_forward(a->mlp_h[0], a->mlp_u[0], N, I, m.stream));
    TIME("gemm mlp_out (+resid)", 1, linear_forward(&m.gemm, resid_at(&m, 1, B, T), a->mid[0], CUDA_R_32F, D, a->mlp_h[0], wbf(&m, FOX_P_mlp_out_w, 0), N, I, D));
    TIME("rmsnorm fwd (ln2)", 1, rmsnorm_forward(&m, a->xn2[0], a->mid[0], param(&m, FOX_P_ln2_w, 0), N));
    printf("--- head\n");
    TIME("gemm lm_head", 0, lm_head_forward(&m, 0, N));
    TIME("cross entropy, loss only", 0, fox_crossentropy(a->losses, a->logits, a->targets, N, V, m.VP, 1.0f / N, 0, m.stream));
    TIME("cross entropy fwd+bwd (fused)", 0, fox_crossentropy(a->losses, a->logits, a->targets, N, V, m.VP, 1.0f / N, 1, m.stream));
    TIME("gemm lm_head dx", 0, linear_backward_input(&m.gemm, s->dxn, CUDA_R_32F, a->logits, m.VP, wbf(&m, FOX_P_lm_head_w, 0), N, D, m.VP, 1.0f));
    TIME("gemm lm_head dW", 0, linear_backward_weight(&m.gemm, grad(&m, FOX_P_lm_head_w, 0), a->logits, m.VP, a->xnf, N, D, V, 1.0f, 1));
    // Blocks that keep xn, z and h (outs_kept) skip their backward kernels' rewrites.
    const int kept = m.outs_kept > 0;
    bf16 *rw_xn = rewritten(&m, 0, a->xn2), *rw_z = rewritten(&m, 0, a->z), *rw_h = rewritten(&m, 0, a->mlp_h);
    printf("--- backward (layer 0, x L)\n");
    if (m.qkv_kept < L) TIME("qkv recompute (fwd kernel)", 1, fox_qkv_forward(a->q[0], a->k[0], a->v[0], qs, m.stream));
    TIME("gemm mlp_out dx", 1, linear_backward_input(&m.gemm, s->dh, CUDA_R_16BF, s->dres_bf, D, wbf(&m, FOX_P_mlp_out_w, 0), N, I, D, 1.0f));
    TIME(kept ? "swiglu bwd" : "swiglu bwd (+h)", 1, fox_swiglu_backward(s->du, rw_h, s->dh, a->mlp_u[0], N, I, m.stream));
    TIME("gemm mlp_out dW", 1, linear_backward_weight(&m.gemm, grad(&m, FOX_P_mlp_out_w, 0), s->dres_bf, D, a->mlp_h[0], N, I, D, 1.0f, 1));
    TIME("gemm mlp_in dx", 1, linear_backward_input(&m.gemm, s->dxn, CUDA_R_32F, s->du, 2 * I, wbf(&m, FOX_P_mlp_in_w, 0), N, D, 2 * I, 1.0f));
    TIME(kept ? "rmsnorm bwd + colsum (x2/layer)" : "rmsnorm bwd + colsum (+xn, x2/layer)", 1, rmsnorm_backward(&m, s->dres_bf, rw_xn, a->mid[0], param(&m, FOX_P_ln2_w, 0), grad(&m, FOX_P_ln2_w, 0), N, 1); rmsnorm_backward(&m, s->dres_bf, rw_xn, a->mid[0], param(&m, FOX_P_ln2_w, 0), grad(&m, FOX_P_ln2_w, 0), N, 1));
    TIME("gemm mlp_in dW", 1, linear_backward_weight(&m.gemm, grad(&m, FOX_P_mlp_in_w, 0), s->du, 2 * I, a->xn2[0], N, D, 2 * I, 1.0f, 1));
    TIME("gemm attn_out dx", 1, linear_backward_input(&m.gemm, s->dxn, CUDA_R_32F, s->dres_bf, D, wbf(&m, FOX_P_attn_out_w, 0), N, D, D, 1.0f));
    TIME(kept ? "output bwd + colsum" : "output bwd + colsum (+z)", 1, fox_output_backward(s->d_o, s->dproj, rw_z, grad(&m, FOX_P_onorm_w, 0), s->dxn, a->o[0], proj_at(&m, 0), m.cols.gate, param(&m, FOX_P_onorm_w, 0), N, H, Dh, s->colsum_rows, s->colsum_part, m.stream));
    TIME("gemm attn_out dW", 1, linear_backward_weight(&m.gemm, grad(&m, FOX_P_attn_out_w, 0), s->dres_bf, D, a->z[0], N, D, D, 1.0f, 1));
    TIME("attention bwd", 1, fox_attention_backward(a->q[0], a->k[0], a->v[0], a->c[0], a->o[0], a->lse[0], s->d_o, s->dc, s->dlogf, s->dq, s->dk, s->dv, s->attn_scratch, B, H, T, Dh, NULL, 1, m.stream));
    TIME("forget-gate bwd + colsum", 1, forget_gate_backward_kernel<<<fox_blocks((size_t)N * H, 256), 256, 0, m.stream>>>(s->dproj, s->dfg, s->dlogf, proj_at(&m, 0), m.cols.fgate, param(&m, FOX_P_fgate_b, 0), a->inputs, m.doc_sep, B, H, T); colsum_accumulate(grad(&m, FOX_P_fgate_b, 0), s->dfg, N, H, H, s->colsum_part, m.stream));
    TIME("qkv bwd (one pass + colsums)", 1, fox_qkv_backward(s->dproj, grad(&m, FOX_P_qnorm_w, 0), grad(&m, FOX_P_knorm_w, 0), s->dq, s->dk, s->dv, qs, s->colsum_rows, s->colsum_part, m.stream));
    TIME("gemm attn_in dx", 1, linear_backward_input(&m.gemm, s->dxn, CUDA_R_32F, s->dproj, NINP, wbf(&m, FOX_P_attn_in_w, 0), N, D, NINP, 1.0f));
    TIME("gemm attn_in dW", 1, linear_backward_weight(&m.gemm, grad(&m, FOX_P_attn_in_w, 0), s->dproj, NINP, a->xn1[0], N, D, m.cols.width, 1.0f, 1));
    printf("--- once per step\n");
    TIME("embedding bwd (incl. host buckets)", 0, { int nb = embedding_buckets(&m, in, N); fox_embedding_backward(grad(&m, FOX_P_wte, 0), s->dres, s->buckets, nb, N, D, m.stream); });
    TIME("optimizer (norm + AdamW)", 0, optimizer_step(&m, &o, 1e-4, 5));
    printf("sum of pieces %.1f ms; whole step %.1f ms\n", total_ms, t0);
    const double gib = 1024.0 * 1024.0 * 1024.0;
    printf("buffers: weights+grads+AdamW %.2f GiB, activations %.2f GiB, backward scratch %.2f GiB\n", m.bytes_weights / gib,
           m.bytes_acts / gib, m.bytes_scratch / gib);
    model_free(&m);
    return 0;
}
