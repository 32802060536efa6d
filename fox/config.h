// fox/config.h: the one definition of the model configuration, the presets and the parameter
// layout. train_fox.c, train_fox.cu and train_fox.py all use it (the Python reference parses the
// X-macro lines below with a regex, so keep each entry on one line in the form shown).
#ifndef FOX_CONFIG_H
#define FOX_CONFIG_H

#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

// Forget-gate kinds (docs/model.md §1).
#define FOX_FG_NONE 0
#define FOX_FG_DATA_DEPENDENT 1
#define FOX_FG_DATA_INDEPENDENT 2
#define FOX_FG_FIXED 3

// Token mixers (docs/model.md §1.9, §1.10): softmax attention (FoX with a forget gate, the Transformer without),
// Gated Slot Attention, or block sliding-window attention with a feedback attention memory (TransformerFAM).
#define FOX_ARCH_ATTENTION 0
#define FOX_ARCH_GSA 1
#define FOX_ARCH_FAM 2

static inline const char *fox_arch_name(int arch) {
    return arch == FOX_ARCH_GSA ? "GSA" : arch == FOX_ARCH_FAM ? "FAM" : "attention";
}

#define FOX_EOT 50256
#define FOX_VOCAB_GPT2 50257
#define FOX_NORM_EPS 1e-6f
#define FOX_QK_NORM_EPS 1e-5f
// A double: a weight is (float)(0.02 * normal) in every implementation.
#define FOX_INIT_STD 0.02

// Config fields, in checkpoint-header order: X(type, name, default). Floats travel as their bits. New fields
// go at the end: a checkpoint written before them holds fewer, and the missing ones take their defaults.
#define FOX_CONFIG_FIELDS(X) \
    X(INT, vocab_size, 50257) \
    X(INT, n_layer, 12) \
    X(INT, d_model, 768) \
    X(INT, n_head, 12) \
    X(INT, mlp_hidden, 1792) \
    X(INT, forget_gate, 1) \
    X(INT, rope, 0) \
    X(INT, qk_norm, 1) \
    X(INT, qk_norm_shared, 0) \
    X(INT, kv_shift, 1) \
    X(INT, output_gate, 1) \
    X(INT, output_norm, 1) \
    X(FLOAT, t_min, 2.0) \
    X(FLOAT, t_max, 128.0) \
    X(FLOAT, rope_theta, 500000.0) \
    X(INT, arch, 0) \
    X(INT, gsa_heads, 4) \
    X(INT, gsa_slots, 64) \
    X(FLOAT, gsa_tau, 8.0) \
    X(INT, fam_block, 1024) \
    X(INT, fam_memory, 64) \
    X(INT, fam_window_blocks, 3)

// Presets (docs/model.md §1): P(name, arch, forget_gate, rope, qk_norm, kv_shift, output_gate, output_norm, mlp_ratio_x2)
#define FOX_PRESETS(P) \
    P(fox-pro, 0, 1, 0, 1, 1, 1, 1, 7) \
    P(fox-llama, 0, 1, 0, 0, 0, 0, 0, 8) \
    P(transformer-pro, 0, 0, 1, 1, 1, 1, 1, 7) \
    P(transformer-llama, 0, 0, 1, 0, 0, 0, 0, 8) \
    P(gsa, 1, 0, 0, 0, 0, 0, 1, 8) \
    P(transformer-fam, 2, 0, 1, 1, 1, 1, 1, 7) \
    P(fox-fam, 2, 1, 0, 1, 1, 1, 1, 7)

// Parameter tensors, in checkpoint order; layer-stacked tensors hold all layers contiguously.
// P(name, layered, rows, cols, decay, init); rows/cols name the dims fox_dim_<symbol>() below, where
// 1 means 1 and a 0-sized dim drops the tensor. init: N = normal(0, 0.02), ONE, FGATE (docs/model.md
// §1 forget-gate bias init; 0 for the data-dependent gate). attn_in_w stacks the projections of the
// attention inputs (FOX_ATTN_IN_ROWS). fam_init: TransformerFAM's initial memory, fam_memory learned
// embeddings (docs/model.md §1.10), last so that the other tensors keep their RNG streams.
#define FOX_PARAMS(P) \
    P(wte, 0, V, D, 1, N) \
    P(ln1_w, 1, 1, D, 0, ONE) \
    P(attn_in_w, 1, NIN, D, 1, N) \
    P(fgate_b, 1, 1, HF, 0, FGATE) \
    P(qnorm_w, 1, 1, QN, 0, ONE) \
    P(knorm_w, 1, 1, QN, 0, ONE) \
    P(onorm_w, 1, 1, ON, 0, ONE) \
    P(attn_out_w, 1, D, D, 1, N) \
    P(ln2_w, 1, 1, D, 0, ONE) \
    P(mlp_in_w, 1, I2, D, 1, N) \
    P(mlp_out_w, 1, D, I, 1, N) \
    P(lnf_w, 0, 1, D, 0, ONE) \
    P(lm_head_w, 0, V, D, 1, N) \
    P(fam_init, 0, FM, D, 1, N)

// The row blocks of attn_in_w (so the columns of its output), in this order, each present when its
// condition on the config holds (docs/model.md §1.4): R(name, rows: D, H or GM = gsa_heads x gsa_slots,
// condition). The conditions name the config by the macro's parameter c (FOX_ATTN_IN_ROWS(R, cfg) passes
// cfg), which is what train_fox.py's parser of this table reads.
#define FOX_ATTN_IN_ROWS(R, c) \
    R(q, D, 1) \
    R(k, D, 1) \
    R(v, D, 1) \
    R(gate, D, c->output_gate) \
    R(k_shift, H, c->kv_shift) \
    R(v_shift, H, c->kv_shift) \
    R(fgate, H, c->forget_gate == FOX_FG_DATA_DEPENDENT) \
    R(slot_gate, GM, c->arch == FOX_ARCH_GSA)

typedef struct {
#define FOX_FIELD_INT int
#define FOX_FIELD_FLOAT float
#define X(type, name, dflt) FOX_FIELD_##type name;
    FOX_CONFIG_FIELDS(X)
#undef X
} FoxConfig;

enum {
#define P(name, layered, rows, cols, decay, init) FOX_P_##name,
    FOX_PARAMS(P)
#undef P
    FOX_NUM_PARAMS
};

enum { FOX_INIT_N, FOX_INIT_ONE, FOX_INIT_FGATE };

typedef struct {
    const char *name;
    int layered, decay, init;
    size_t rows, cols;   // per layer when layered
    size_t numel;        // all layers
    size_t offset;       // into the flat parameter vector
} FoxParamInfo;

typedef struct {
    FoxParamInfo p[FOX_NUM_PARAMS];
    size_t total;
} FoxLayout;

// Offset of tensor `which`'s layer-`layer` slice in the flat vector (layer 0 for unlayered tensors).
static inline size_t fox_param_offset(const FoxLayout *lay, int which, int layer) {
    const FoxParamInfo *p = &lay->p[which];
    return p->offset + (size_t)layer * p->rows * p->cols;
}

static inline int fox_head_dim(const FoxConfig *cfg) { return cfg->d_model / cfg->n_head; }

// TransformerFAM with its feedback memory; without one (--fam-memory 0, BSWA alone) its tokens read their window
// only, and there are no memory states, updates or fam_init (docs/model.md §1.10).
static inline int fox_fam_has_memory(const FoxConfig *cfg) { return cfg->arch == FOX_ARCH_FAM && cfg->fam_memory > 0; }

// First row of each FOX_ATTN_IN_ROWS block in attn_in_w (the column in a row of its output), -1 when
// absent; width: the rows of attn_in_w; wide: the rows of its d_model-row blocks (q, k, v, the output gate),
// which come first; the per-head logits' blocks follow (the GPU keeps the two parts of a row in bf16 and fp32,
// docs/model.md §1.6).
typedef struct {
#define R(name, rows, present) int name;
    FOX_ATTN_IN_ROWS(R, cfg)
#undef R
    int width, wide;
} AttnCols;

static inline AttnCols fox_attn_cols(const FoxConfig *cfg) {
    const int D = cfg->d_model, H = cfg->n_head, GM = cfg->gsa_heads * cfg->gsa_slots;
    AttnCols a;
    a.width = 0;
#define R(name, rows, present) \
    a.name = (present) ? a.width : -1; \
    if (present) a.width += (rows);
    FOX_ATTN_IN_ROWS(R, cfg)
#undef R
    a.wide = (a.gate >= 0 ? a.gate : a.v) + D;
    return a;
}

// docs/model.md §1: I = 256 * ceil(int(d * r * 2/3) / 256), r = ratio_x2 / 2.
static inline int fox_mlp_hidden(int d_model, int mlp_ratio_x2) {
    int raw = d_model * mlp_ratio_x2 / 3;
    return 256 * ((raw + 255) / 256);
}

// The dimension symbols of FOX_PARAMS.
static inline size_t fox_dim_1(const FoxConfig *cfg) { (void)cfg; return 1; }
static inline size_t fox_dim_V(const FoxConfig *cfg) { return (size_t)cfg->vocab_size; }
static inline size_t fox_dim_D(const FoxConfig *cfg) { return (size_t)cfg->d_model; }
static inline size_t fox_dim_I(const FoxConfig *cfg) { return (size_t)cfg->mlp_hidden; }
static inline size_t fox_dim_I2(const FoxConfig *cfg) { return 2 * (size_t)cfg->mlp_hidden; }
static inline size_t fox_dim_NIN(const FoxConfig *cfg) { return (size_t)fox_attn_cols(cfg).width; }
static inline size_t fox_dim_HF(const FoxConfig *cfg) { return cfg->forget_gate == FOX_FG_NONE ? 0 : (size_t)cfg->n_head; }
static inline size_t fox_dim_QN(const FoxConfig *cfg) {
    return cfg->qk_norm ? (size_t)(cfg->qk_norm_shared ? fox_head_dim(cfg) : cfg->d_model) : 0;
}
static inline size_t fox_dim_ON(const FoxConfig *cfg) { return cfg->output_norm ? (size_t)cfg->d_model : 0; }
static inline size_t fox_dim_FM(const FoxConfig *cfg) { return cfg->arch == FOX_ARCH_FAM ? (size_t)cfg->fam_memory : 0; }

static inline void fox_layout(const FoxConfig *cfg, FoxLayout *lay) {
    size_t off = 0;
    int i = 0;
#define P(nm, lyr, r, cl, dec, ini) \
    lay->p[i].name = #nm; lay->p[i].layered = lyr; lay->p[i].decay = dec; \
    lay->p[i].init = FOX_INIT_##ini; \
    lay->p[i].rows = fox_dim_##r(cfg); lay->p[i].cols = fox_dim_##cl(cfg); \
    lay->p[i].numel = (lyr ? (size_t)cfg->n_layer : 1) * lay->p[i].rows * lay->p[i].cols; \
    lay->p[i].offset = off; off += lay->p[i].numel; i++;
    FOX_PARAMS(P)
#undef P
    lay->total = off;
}

// Whether the optimizer updates a tensor: the `fixed` forget gate (ALiBi-like) is not learned.
static inline int fox_param_learned(const FoxConfig *cfg, int param_index) {
    return !(param_index == FOX_P_fgate_b && cfg->forget_gate == FOX_FG_FIXED);
}

static inline void fox_config_defaults(FoxConfig *cfg) {
#define X(type, name, dflt) cfg->name = dflt;
    FOX_CONFIG_FIELDS(X)
#undef X
}

// Applies a preset's switches; returns 0 for an unknown name. mlp_hidden follows d_model.
static inline int fox_config_apply_preset(FoxConfig *cfg, const char *preset) {
#define P(nm, ar, fg, rp, qk, kv, og, on, r2) \
    if (!strcmp(preset, #nm)) { cfg->arch = ar; cfg->forget_gate = fg; cfg->rope = rp; cfg->qk_norm = qk; cfg->kv_shift = kv; \
        cfg->output_gate = og; cfg->output_norm = on; cfg->mlp_hidden = fox_mlp_hidden(cfg->d_model, r2); return 1; }
    FOX_PRESETS(P)
#undef P
    return 0;
}

// One line describing why a config is invalid, or NULL.
static inline const char *fox_config_invalid(const FoxConfig *cfg) {
    if (cfg->vocab_size <= 0 || cfg->n_layer <= 0 || cfg->d_model <= 0 || cfg->n_head <= 0 || cfg->mlp_hidden <= 0)
        return "vocab_size, n_layer, d_model, n_head and mlp_hidden must be positive";
    if (cfg->arch < FOX_ARCH_ATTENTION || cfg->arch > FOX_ARCH_FAM) return "arch must be 0 (attention), 1 (GSA) or 2 (FAM)";
    if (cfg->arch == FOX_ARCH_FAM) {
        if (cfg->fam_block <= 0) return "FAM: fam_block must be positive";
        if (cfg->fam_memory < 0) return "FAM: fam_memory must be 0 (no memory: BSWA alone) or more";
        if (cfg->fam_window_blocks < 0) return "FAM: fam_window_blocks must be 0 or more";
    }
    if (cfg->arch == FOX_ARCH_GSA) {
        if (cfg->gsa_heads <= 0 || cfg->d_model % cfg->gsa_heads) return "GSA: d_model must be a multiple of gsa_heads";
        if (cfg->n_head != cfg->gsa_heads) return "GSA: n_head must equal gsa_heads";
        if (cfg->gsa_slots <= 0) return "GSA: gsa_slots must be positive";
        if (!(cfg->gsa_tau > 0.0f)) return "GSA: gsa_tau must be positive";
        if (cfg->forget_gate != FOX_FG_NONE || cfg->rope || cfg->qk_norm || cfg->kv_shift || cfg->output_gate)
            return "GSA has its own slot gates and takes no forget gate, RoPE, QK-norm, KV-shift or output gate";
    }
    if (cfg->d_model % cfg->n_head) return "d_model must be a multiple of n_head";
    if (cfg->rope && (cfg->d_model / cfg->n_head) % 2) return "RoPE needs an even head_dim";
    if (cfg->forget_gate < FOX_FG_NONE || cfg->forget_gate > FOX_FG_FIXED) return "forget_gate must be 0..3";
    if (!(cfg->t_min > 1.0f) || !(cfg->t_max >= cfg->t_min)) return "need 1 < t_min <= t_max";
    if (cfg->qk_norm_shared && !cfg->qk_norm) return "qk_norm_shared needs qk_norm";
    return NULL;
}

// docs/model.md §1 / FoX Appendix D: the fixed or data-independent gate of head h has timescale
// T_h = -1/log σ(b), log-spaced from t_min to t_max, so b = -log(expm1(1/T_h)).
static inline float fox_fgate_bias_init(const FoxConfig *cfg, int h) {
    if (cfg->forget_gate == FOX_FG_DATA_DEPENDENT || cfg->forget_gate == FOX_FG_NONE) return 0.0f;
    double frac = cfg->n_head > 1 ? (double)h / (cfg->n_head - 1) : 0.0;
    double T = exp(log((double)cfg->t_min) + frac * (log((double)cfg->t_max) - log((double)cfg->t_min)));
    return (float)(-log(expm1(1.0 / T)));
}

// Non-embedding parameter count N of the MFU formula (docs/model.md §6): all parameters but wte.
static inline size_t fox_mfu_params(const FoxConfig *cfg) {
    FoxLayout lay;
    fox_layout(cfg, &lay);
    return lay.total - lay.p[FOX_P_wte].numel;
}

// FLOPs per token of one training step (docs/model.md §6): 3·(2N + the token mixer's forward), the mixer's
// 2·n_layer·d_model·T for causal attention and 8·n_layer·gsa_slots·d_model for Gated Slot Attention (per head
// and token its recurrence updates two m × d_h states and reads both, 2·m·d_h FLOPs each).
static inline double fox_flops_per_token(const FoxConfig *cfg, int T) {
    double mixer = cfg->arch == FOX_ARCH_GSA ? 8.0 * cfg->gsa_slots : 2.0 * T;
    return 3.0 * (2.0 * (double)fox_mfu_params(cfg) + mixer * cfg->n_layer * (double)cfg->d_model);
}

#endif
