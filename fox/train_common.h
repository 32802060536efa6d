// fox/train_common.h: facts of the model and the optimizer shared by the CPU and CUDA trainers: the
// initialisation, the RoPE angles, the targets the loss counts, the learning-rate schedule.
#ifndef FOX_TRAIN_COMMON_H
#define FOX_TRAIN_COMMON_H

#include <math.h>
#include "config.h"
#include "rng.h"

// docs/model.md §1 init: N(0, 0.02²) from the shared counter RNG (stream = tensor index), norms 1,
// forget-gate biases per Appendix D.
static inline void fox_init_params(const FoxConfig *cfg, const FoxLayout *lay, float *params, uint64_t seed) {
    for (int t = 0; t < FOX_NUM_PARAMS; t++) {
        const FoxParamInfo *p = &lay->p[t];
        float *w = params + p->offset;
        uint64_t key = fox_rng_key(seed, (uint64_t)t);
        #pragma omp parallel for
        for (size_t i = 0; i < p->numel; i++) {
            if (p->init == FOX_INIT_N) w[i] = (float)(FOX_INIT_STD * fox_rng_normal(key, i));
            else if (p->init == FOX_INIT_ONE) w[i] = 1.0f;
            else w[i] = fox_fgate_bias_init(cfg, (int)(i % p->cols));
        }
    }
}

// RoPE (docs/model.md §1.2), rotate-half convention: the pair (i, i + dh/2) of position t turns by
// t·θ^(−2i/dh), in double in both trainers.
static inline double fox_rope_angle(int t, int i, int dh, double theta) { return t * pow(theta, -2.0 * i / dh); }

typedef struct {
    double lr, min_lr, weight_decay, grad_clip, beta1, beta2, eps;
    int warmup_steps, total_steps;
} OptConfig;

// Linear warmup to the peak over warmup_steps, then cosine decay to min_lr at total_steps.
// The targets the loss counts: all but the negative ones (--mqar-loss leaves only the answers; docs/model.md
// §8.4). The mean loss divides by them, its gradient is 1/their number per counted position.
static inline int fox_counted_targets(const int *targets, int N) {
    int count = 0;
    for (int n = 0; n < N; n++) count += targets[n] >= 0;
    return count;
}

static inline double lr_at(const OptConfig *o, int step) {
    if (step < o->warmup_steps) return o->lr * (step + 1) / o->warmup_steps;
    double p = (double)(step - o->warmup_steps) / (o->total_steps - o->warmup_steps > 1 ? o->total_steps - o->warmup_steps : 1);
    if (p > 1.0) p = 1.0;
    return o->min_lr + 0.5 * (o->lr - o->min_lr) * (1.0 + cos(M_PI * p));
}

#endif
