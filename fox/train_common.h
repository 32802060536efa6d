// fox/train_common.h: facts of the model and the optimizer shared by the CPU and CUDA trainers:
// where each projection sits in attn_in_w's output, the initialisation, the learning-rate schedule.
#ifndef FOX_TRAIN_COMMON_H
#define FOX_TRAIN_COMMON_H

#include <math.h>
#include "config.h"
#include "rng.h"

// Column offsets of each projection inside a row of attn_in_w's output; -1 when absent.
typedef struct { int q, k, v, g, ak, av, f, width; } AttnCols;

static inline AttnCols attn_cols(const FoxConfig *c) {
    int D = c->d_model, H = c->n_head, at = 3 * D;
    AttnCols a = {0, D, 2 * D, -1, -1, -1, -1, 0};
    if (c->output_gate) { a.g = at; at += D; }
    if (c->kv_shift) { a.ak = at; a.av = at + H; at += 2 * H; }
    if (c->forget_gate == FOX_FG_DATA_DEPENDENT) { a.f = at; at += H; }
    a.width = at;
    return a;
}

// docs/model.md §1 init: N(0, 0.02²) from the shared counter RNG (stream = tensor index), norms 1,
// forget-gate biases per Appendix D.
static inline void fox_init_params(const FoxConfig *c, const FoxLayout *lay, float *params, uint64_t seed) {
    for (int t = 0; t < FOX_NUM_PARAMS; t++) {
        const FoxParamInfo *p = &lay->p[t];
        float *w = params + p->offset;
        uint64_t key = fox_rng_key(seed, (uint64_t)t);
        #pragma omp parallel for
        for (size_t i = 0; i < p->numel; i++) {
            if (p->init == FOX_INIT_N) w[i] = (float)(FOX_INIT_STD * fox_rng_normal(key, i));
            else if (p->init == FOX_INIT_ONE) w[i] = 1.0f;
            else w[i] = fox_fgate_bias_init(c, (int)(i % p->cols));
        }
    }
}

typedef struct {
    double lr, min_lr, weight_decay, grad_clip, beta1, beta2, eps;
    int warmup_steps, total_steps;
} OptConfig;

// Linear warmup to the peak over warmup_steps, then cosine decay to min_lr at total_steps.
static inline double lr_at(const OptConfig *o, int step) {
    if (step < o->warmup_steps) return o->lr * (step + 1) / o->warmup_steps;
    double p = (double)(step - o->warmup_steps) / (o->total_steps - o->warmup_steps > 1 ? o->total_steps - o->warmup_steps : 1);
    if (p > 1.0) p = 1.0;
    return o->min_lr + 0.5 * (o->lr - o->min_lr) * (1.0 + cos(M_PI * p));
}

#endif
