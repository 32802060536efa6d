// train_fox.c: the fp32 CPU reference trainer for the Forgetting Transformer (FoX).
// Readable first, parallel with OpenMP, every forward next to its backward. docs/model.md §1-2, §5-6.
// The model's shapes and switches come from fox/config.h; the checkpoint format from
// fox/checkpoint.h; the data from dataloader.h. The tests in test/ include this file with TESTING set.
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <time.h>

// The model's number type: float for training; the finite-difference test builds it as double
// (FOX_REAL_DOUBLE) so that differences of losses are exact enough to check gradients tightly.
#ifdef FOX_REAL_DOUBLE
typedef double real;
#define exp_r exp
#define sqrt_r sqrt
#define log_r log
#define log1p_r log1p
#define fabs_r fabs
#define fmin_r fmin
#else
typedef float real;
#define exp_r expf
#define sqrt_r sqrtf
#define log_r logf
#define log1p_r log1pf
#define fabs_r fabsf
#define fmin_r fminf
#endif
// c = Σ log f is kept in double whatever `real` is: the bias c_i − c_j is a difference of two large sums,
// and the document mask adds FOX_DOC_LOG_F at every boundary (docs/model.md §1.6, §1.8).
typedef double creal;
#define FOX_ACP_REAL creal  // the number type of c in fox/acp.h's staircase search

#include "fox/config.h"        // FoxConfig, presets, FOX_PARAMS layout, FOX_ATTN_IN_ROWS (AttnCols)
#include "fox/io.h"            // fox_malloc, fox_calloc, fox_fatal: checked allocation, one-line errors
#include "fox/train_common.h"  // fox_init_params, fox_rope_angle, fox_counted_targets, OptConfig
#include "fox/dist.h"          // Dist, dist_allreduce_sum: the data-parallel ranks (MPI)
#include "fox/trainer.h"       // ModelOptions and the run_model_* functions this file defines for fox/run.h
#include "fox/acp.h"           // ACP: the tile grid, the bound U, the staircase search
#include "fox/docmask.h"       // the document mask: separators, their log f, KV-shift's reach, ACP's blocks

// ----------------------------------------------------------------------------
// Model state

// TransformerFAM (docs/model.md §1.10): the per-row arrays of the feedback memory's pass through a layer, its
// attention inputs and then its update through the attention's output and the MLP, X(name, row width).
#define FAM_FIELDS(X) \
    X(x, D) X(xn1, D) X(ln1_rstd, 1) X(proj, NIN) X(q, D) X(k, D) X(v, D) X(q_rstd, H) X(k_rstd, H) X(o, D) X(lse, H) \
    X(on, D) X(on_rstd, H) X(z, D) X(mid, D) X(xn2, D) X(ln2_rstd, 1) X(u, 2 * I) X(h, I)

typedef struct {
#define X(name, width) real *name;
    FAM_FIELDS(X)
#undef X
} FamRows;

// The row widths FAM_FIELDS names, for model m.
#define FAM_WIDTHS(m) size_t D = (size_t)(m)->cfg.d_model, NIN = (size_t)(m)->cols.width, H = (size_t)(m)->cfg.n_head, \
                             I = (size_t)(m)->cfg.mlp_hidden

// Gradient scratch of one layer's memory (R = B·M rows a state, nS states).
typedef struct {
    real *dx, *dk, *dv;  // (nS, R, D): the gradients of each state's rows and of their keys and values
    real *dq, *dproj, *dxn, *dz, *don, *d_o, *du, *dh, *y;  // one state's (R rows; y also the forward's scratch)
    real *dprompt[2];    // (M, D): the gradient of the prompt's rows entering layer l, at [l & 1]
} FamScratch;

// Activations of one forward pass over B×T tokens (N = B*T), kept for the backward pass.
typedef struct {
    real *resid;     // (L+1, N, D): input of each block, then the last block's output
    real *mid;       // (L, N, D): residual after attention
    real *ln1_rstd, *xn1;  // (L, N), (L, N, D)
    real *proj;      // (L, N, NIN): attn_in_w outputs
    real *ks, *v;    // (L, N, D): keys after KV-shift (before QK-norm); values after KV-shift
    real *q, *k;     // (L, N, D): attention q and k (after QK-norm and RoPE)
    real *q_rstd, *k_rstd;  // (L, N, H)
    creal *c;        // (L, B, H, T): c_t = Σ log f
    real *o, *lse;   // (L, N, D), (L, B, H, T)
    real *on, *on_rstd;     // (L, N, D), (L, N, H): output-normed attention
    real *z;         // (L, N, D): input of attn_out_w
    real *ln2_rstd, *xn2;   // (L, N), (L, N, D)
    real *mlp_u, *mlp_h;    // (L, N, 2I), (L, N, I)
    real *lnf_rstd, *xnf;   // (N), (N, D)
    real *logits;    // (N, V); the backward pass turns it into dlogits
    real *losses;    // (N): per-position cross entropy
    real *gsa_S, *gsa_U;  // GSA (docs/model.md §1.9): (L, B, G, gsa_chunks(T), m, dh) the key and value slots after
                          // each chunk of FOX_GSA_CHUNK tokens
    real *gsa_p;          // (L, B, G, T, m): the softmax over the slots of each token's read
    FamRows fam;          // FAM: (L, T/K + 1, B, M) rows, the memory states F_τ of every layer and sequence
    FamRows famp;         // FAM: (L, M) rows, the prompt (the initial memory) entering each layer
} Acts;

// Gradient scratch for one block at a time.
typedef struct {
    real *dres, *dxn, *dproj, *dks, *dv, *dq, *dk, *dc, *d_o, *don, *dz, *du, *dh;
} Scratch;

// The KV cache of generation (docs/model.md §7), for B sequences of up to max_len tokens each.
typedef struct {
    int max_len, len;    // capacity and cached positions (0: no cache)
    real *k, *v;         // (L, B, H, max_len, Dh): keys and values as attention sees them
    creal *c;            // (L, B, H, max_len): c_t = Σ log f (forget gate or document mask)
    int *doc_start;      // (B): the position of each sequence's latest separator (document mask)
    real *gsa_S, *gsa_U, *gsa_p;  // GSA's recurrent state instead (L, B, G, m, dh) each, and one step's slot reads
    FamRows fam;         // FAM: (L, B, M) rows, each layer's current memory and its attention inputs
    real *fam_out, *fam_y;  // FAM: (B, M, D) the next memory of a layer, and scratch
    real *k_prev, *v_prev;  // (L, B, D): the newest token's unshifted key and value (KV-shift state)
    real *k_max2;        // (L, B, H): the largest cached |k_j|² (ACP's bound without QK-norm)
    real *x, *xn, *proj, *q, *kn, *vn, *o, *on, *z, *y, *mlp_u, *mlp_h, *rstd;  // one step's rows
    long long keys_read, keys_cached;  // over the decode steps since the prefill (ACP)
} Cache;

struct Model {
    FoxConfig cfg;
    FoxLayout lay;
    AttnCols cols;
    real *params, *grads, *m, *v;
    int B, T;  // activation capacity
    int acp;   // Adaptive Computation Pruning (--acp): skip the attention tiles of acp_kv_first
    int *acp_kv_first;  // (B, H, ceil(T / FOX_ACP_BLOCK)): first live key block of each query block
    int doc_sep;     // --doc-mask: the separator token (docs/model.md §1.8); -1: no mask
    int *tokens;     // (B, T): the last forward's inputs (the document mask reads them)
    int *doc_first;  // (B, ceil(T / FOX_ACP_BLOCK)): fox_doc_first_blocks of the last forward
    long long *acp_live;  // (L, H): attention tiles the last forward computed, summed over the batch (ACP)
    long long acp_tiles;  // tiles in one (layer, head)'s causal grids, B·fox_acp_tiles(T); 0: ACP did not run
    double queued_loss;   // run_model_forward_queue's mean loss, for run_model_loss
    Acts a;
    Scratch s;
    FamScratch fs;
    Cache cache;
};

static real *param(Model *m, int which, int layer) { return m->params + fox_param_offset(&m->lay, which, layer); }

static real *grad(Model *m, int which, int layer) { return m->grads + fox_param_offset(&m->lay, which, layer); }

// The states the forward keeps for the backward: those after every FOX_GSA_CHUNK-th token (and the last);
// the backward recomputes each chunk's states from the one before it, so memory grows with T/FOX_GSA_CHUNK.
#define FOX_GSA_CHUNK 32

static int gsa_chunks(int T) { return (T + FOX_GSA_CHUNK - 1) / FOX_GSA_CHUNK; }

static void fam_rows_alloc(const Model *m, FamRows *f, size_t rows) {
    FAM_WIDTHS(m);
#define X(name, width) f->name = fox_calloc(rows * (width), sizeof(real));
    FAM_FIELDS(X)
#undef X
}

static void fam_rows_free(FamRows *f) {
#define X(name, width) free(f->name); f->name = NULL;
    FAM_FIELDS(X)
#undef X
}

// The rows from row r of base on.
static FamRows fam_rows_at(const Model *m, const FamRows *base, size_t r) {
    FAM_WIDTHS(m);
    FamRows f;
#define X(name, width) f.name = base->name + r * (width);
    FAM_FIELDS(X)
#undef X
    return f;
}

// The reals of one row of FAM_FIELDS.
static size_t fam_row_reals(const Model *m) {
    FAM_WIDTHS(m);
    size_t n = 0;
#define X(name, width) n += (width);
    FAM_FIELDS(X)
#undef X
    return n;
}

// A layer's blocks of K tokens over a context T (docs/model.md §1.10): nb blocks, nfull of them complete,
// hence nfull + 1 memory states F_0 .. F_nfull (the last one only generation reads).
typedef struct { int K, M, W, nb, nfull, nS; } FamShape;

static FamShape fam_shape(const FoxConfig *cfg, int T) {
    int K = cfg->fam_block;
    FamShape f = {K, cfg->fam_memory, cfg->fam_window_blocks, (T + K - 1) / K, T / K, T / K + 1};
    return f;
}

static void fam_alloc(Model *m, int B, int T) {
    const FoxConfig *cfg = &m->cfg;
    FamShape fs = fam_shape(cfg, T);
    size_t L = (size_t)cfg->n_layer, R = (size_t)B * fs.M, D = (size_t)cfg->d_model, I = (size_t)cfg->mlp_hidden;
    fam_rows_alloc(m, &m->a.fam, L * fs.nS * R);
    fam_rows_alloc(m, &m->a.famp, L * fs.M);
    FamScratch *g = &m->fs;
    real **states[] = {&g->dx, &g->dk, &g->dv};
    for (int i = 0; i < 3; i++) *states[i] = fox_calloc(fs.nS * R * D, sizeof(real));
    real **rows[] = {&g->dq, &g->dxn, &g->dz, &g->don, &g->d_o, &g->y};
    for (int i = 0; i < 6; i++) *rows[i] = fox_calloc(R * D, sizeof(real));
    g->dproj = fox_calloc(R * (size_t)m->cols.width, sizeof(real));
    g->du = fox_calloc(R * 2 * I, sizeof(real));
    g->dh = fox_calloc(R * I, sizeof(real));
    for (int i = 0; i < 2; i++) g->dprompt[i] = fox_calloc((size_t)fs.M * D, sizeof(real));
}

static void fam_free(Model *m) {
    FamScratch *g = &m->fs;
    fam_rows_free(&m->a.fam);
    fam_rows_free(&m->a.famp);
    real *bufs[] = {g->dx, g->dk, g->dv, g->dq, g->dproj, g->dxn, g->dz, g->don, g->d_o, g->du, g->dh, g->y,
                    g->dprompt[0], g->dprompt[1]};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) free(bufs[i]);
    memset(g, 0, sizeof(*g));
}

static void model_alloc_acts(Model *m, int B, int T) {
    const FoxConfig *cfg = &m->cfg;
    size_t L = (size_t)cfg->n_layer, N = (size_t)B * T, D = (size_t)cfg->d_model, H = (size_t)cfg->n_head;
    size_t I = (size_t)cfg->mlp_hidden, NIN = (size_t)m->cols.width, V = (size_t)cfg->vocab_size;
    Acts *a = &m->a;
    a->resid = fox_calloc((L + 1) * N * D, sizeof(real));
    a->mid = fox_calloc(L * N * D, sizeof(real));
    a->ln1_rstd = fox_calloc(L * N, sizeof(real));
    a->xn1 = fox_calloc(L * N * D, sizeof(real));
    a->proj = fox_calloc(L * N * NIN, sizeof(real));
    a->ks = fox_calloc(L * N * D, sizeof(real));
    a->v = fox_calloc(L * N * D, sizeof(real));
    a->q = fox_calloc(L * N * D, sizeof(real));
    a->k = fox_calloc(L * N * D, sizeof(real));
    a->q_rstd = fox_calloc(L * N * H, sizeof(real));
    a->k_rstd = fox_calloc(L * N * H, sizeof(real));
    a->c = fox_calloc(L * N * H, sizeof(creal));
    a->o = fox_calloc(L * N * D, sizeof(real));
    a->lse = fox_calloc(L * N * H, sizeof(real));
    a->on = fox_calloc(L * N * D, sizeof(real));
    a->on_rstd = fox_calloc(L * N * H, sizeof(real));
    a->z = fox_calloc(L * N * D, sizeof(real));
    a->ln2_rstd = fox_calloc(L * N, sizeof(real));
    a->xn2 = fox_calloc(L * N * D, sizeof(real));
    a->mlp_u = fox_calloc(L * N * 2 * I, sizeof(real));
    a->mlp_h = fox_calloc(L * N * I, sizeof(real));
    a->lnf_rstd = fox_calloc(N, sizeof(real));
    a->xnf = fox_calloc(N * D, sizeof(real));
    a->logits = fox_calloc(N * V, sizeof(real));
    a->losses = fox_calloc(N, sizeof(real));
    if (cfg->arch == FOX_ARCH_GSA) {
        size_t slots = (size_t)cfg->gsa_slots;
        size_t kept = L * (size_t)B * gsa_chunks(T) * slots * D;
        a->gsa_S = fox_calloc(kept, sizeof(real));
        a->gsa_U = fox_calloc(kept, sizeof(real));
        a->gsa_p = fox_calloc(L * N * (size_t)cfg->gsa_heads * slots, sizeof(real));
    }
    if (cfg->arch == FOX_ARCH_FAM) fam_alloc(m, B, T);
    Scratch *sc = &m->s;
    sc->dres = fox_calloc(N * D, sizeof(real));
    sc->dxn = fox_calloc(N * D, sizeof(real));
    sc->dproj = fox_calloc(N * NIN, sizeof(real));
    sc->dks = fox_calloc(N * D, sizeof(real));
    sc->dv = fox_calloc(N * D, sizeof(real));
    sc->dq = fox_calloc(N * D, sizeof(real));
    sc->dk = fox_calloc(N * D, sizeof(real));
    sc->dc = fox_calloc(N * H, sizeof(real));
    sc->d_o = fox_calloc(N * D, sizeof(real));
    sc->don = fox_calloc(N * D, sizeof(real));
    sc->dz = fox_calloc(N * D, sizeof(real));
    sc->du = fox_calloc(N * 2 * I, sizeof(real));
    sc->dh = fox_calloc(N * I, sizeof(real));
    m->acp_kv_first = fox_calloc((size_t)B * H * fox_acp_blocks(T), sizeof(int));
    m->acp_live = fox_calloc(L * H, sizeof(long long));
    m->tokens = fox_calloc(N, sizeof(int));
    m->doc_first = fox_calloc((size_t)B * fox_acp_blocks(T), sizeof(int));
    m->B = B;
    m->T = T;
}

static void model_init(Model *m, const FoxConfig *cfg, int B, int T, uint64_t seed) {
    memset(m, 0, sizeof(*m));
    m->cfg = *cfg;
    fox_layout(cfg, &m->lay);
    m->cols = fox_attn_cols(cfg);
    m->doc_sep = -1;
    size_t n = m->lay.total;
    m->params = fox_malloc(n * sizeof(real));
    m->grads = fox_calloc(n, sizeof(real));
    m->m = fox_calloc(n, sizeof(real));
    m->v = fox_calloc(n, sizeof(real));
    float *init = fox_malloc(n * sizeof(float));  // the shared init is defined in float32
    fox_init_params(cfg, &m->lay, init, seed);
    for (size_t i = 0; i < n; i++) m->params[i] = init[i];
    free(init);
    model_alloc_acts(m, B, T);
}

static void model_cache_free(Model *m);

static void model_free(Model *m) {
    real **bufs[] = {
        &m->params, &m->grads, &m->m, &m->v, &m->a.resid, &m->a.mid, &m->a.ln1_rstd, &m->a.xn1, &m->a.proj,
        &m->a.ks, &m->a.v, &m->a.q, &m->a.k, &m->a.q_rstd, &m->a.k_rstd, &m->a.o, &m->a.lse,
        &m->a.on, &m->a.on_rstd, &m->a.z, &m->a.ln2_rstd, &m->a.xn2, &m->a.mlp_u, &m->a.mlp_h,
        &m->a.lnf_rstd, &m->a.xnf, &m->a.logits, &m->a.losses, &m->s.dres, &m->s.dxn, &m->s.dproj,
        &m->s.dks, &m->s.dv, &m->s.dq, &m->s.dk, &m->s.dc, &m->s.d_o, &m->s.don, &m->s.dz,
        &m->s.du, &m->s.dh, &m->a.gsa_S, &m->a.gsa_U, &m->a.gsa_p,
    };
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) { free(*bufs[i]); *bufs[i] = NULL; }
    free(m->a.c);
    free(m->acp_kv_first);
    free(m->acp_live);
    free(m->tokens);
    free(m->doc_first);
    m->a.c = NULL;
    m->acp_kv_first = m->tokens = m->doc_first = NULL;
    m->acp_live = NULL;
    fam_free(m);
    model_cache_free(m);
}

// ----------------------------------------------------------------------------
// Ops. Backward functions accumulate (+=) into their input gradients.

// OpenMP regions fork a team only when their work (multiply-adds or elements touched; WORK_TRANSC for an exp, log,
// sine or square root) reaches omp_min_work. With the cores to itself that is 0: the threads spin between regions,
// so a fork and join is quick. Where other processes share the cores each join waits for whichever team thread they
// preempted, so only regions of OMP_SHARED_MIN_WORK or more fork (threads_watch tells the two cases apart). No
// result depends on it: every element has one owner and a fixed order of sums.
#ifndef OMP_SHARED_MIN_WORK
#define OMP_SHARED_MIN_WORK 1e6
#endif
#define WORK_TRANSC 16.0

static double omp_min_work = OMP_SHARED_MIN_WORK;  // until the first window says otherwise

static inline int threads_pay(double work) { return work >= omp_min_work; }

// At each step's and decoded token's start, over windows of 10 ms or more: the calling thread's share of a core.
// Below 0.8 other runnable threads take its core (this program's own spin rather than yield): shared. Above 0.95
// ten windows in a row: alone again (one is not enough: a lone thread on shared cores can hold one for a while).
static void threads_watch(void) {
    static double cpu0, wall0;
    static int alone = 9;  // so that the first window decides
    struct timespec c, w;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c);
    clock_gettime(CLOCK_MONOTONIC, &w);
    double cpu = c.tv_sec + 1e-9 * c.tv_nsec, wall = w.tv_sec + 1e-9 * w.tv_nsec;
    if (wall - wall0 < 0.01) return;
    double share = (cpu - cpu0) / (wall - wall0);
    if (wall0 > 0) {
        alone = share > 0.95 ? alone + 1 : 0;
        if (share < 0.8) omp_min_work = OMP_SHARED_MIN_WORK;
        else if (alone >= 10) omp_min_work = 0;
    }
    cpu0 = cpu;
    wall0 = wall;
}

static real sigmoid_r(real x) { return 1.0f / (1.0f + exp_r(-x)); }

// log σ(x) without overflow.
static real logsigmoid_r(real x) { return fmin_r(x, 0.0f) - log1p_r(exp_r(-fabs_r(x))); }

static void embedding_forward(real *out, const int *tokens, const real *wte, int N, int D) {
    #pragma omp parallel for if(threads_pay((double)N * D))
    for (int n = 0; n < N; n++) memcpy(out + (size_t)n * D, wte + (size_t)tokens[n] * D, (size_t)D * sizeof(real));
}

static void embedding_backward(real *dwte, const real *dout, const int *tokens, int N, int D) {
    // Sequential over tokens: repeated ids add into the same row.
    for (int n = 0; n < N; n++) {
        real *row = dwte + (size_t)tokens[n] * D;
        const real *g = dout + (size_t)n * D;
        for (int d = 0; d < D; d++) row[d] += g[d];
    }
}

// RMSNorm over groups: each of `rows` rows holds `groups` groups of G values; group g of every row
// uses weight w[g*wstride .. +G) (wstride = G: per-head weights; 0: one shared vector).
typedef struct { int rows, groups, G, in_stride, out_stride, wstride; real eps; } NormShape;

static void rmsnorm_forward(real *out, real *rstd, const real *in, const real *w, NormShape s) {
    #pragma omp parallel for if(threads_pay((double)s.rows * s.groups * s.G)) collapse(2)
    for (int r = 0; r < s.rows; r++) {
        for (int g = 0; g < s.groups; g++) {
            const real *x = in + (size_t)r * s.in_stride + (size_t)g * s.G;
            real *y = out + (size_t)r * s.out_stride + (size_t)g * s.G;
            const real *wg = w + (size_t)g * s.wstride;
            real ss = 0.0f;
            #pragma omp simd reduction(+:ss)
            for (int i = 0; i < s.G; i++) ss += x[i] * x[i];
            real rs = 1.0f / sqrt_r(ss / s.G + s.eps);
            for (int i = 0; i < s.G; i++) y[i] = x[i] * rs * wg[i];
            rstd[(size_t)r * s.groups + g] = rs;
        }
    }
}

// dx = rstd·(dy⊙w − x̂·mean(dy⊙w⊙x̂)), x̂ = x·rstd; dw += Σ dy⊙x̂. dout/din use out_stride/in_stride.
static void rmsnorm_backward(real *din, real *dw, const real *dout, const real *in, const real *rstd,
                             const real *w, NormShape s) {
    #pragma omp parallel for if(threads_pay((double)s.rows * s.groups * s.G)) collapse(2)
    for (int r = 0; r < s.rows; r++) {
        for (int g = 0; g < s.groups; g++) {
            const real *x = in + (size_t)r * s.in_stride + (size_t)g * s.G;
            const real *dy = dout + (size_t)r * s.out_stride + (size_t)g * s.G;
            real *dx = din + (size_t)r * s.in_stride + (size_t)g * s.G;
            const real *wg = w + (size_t)g * s.wstride;
            real rs = rstd[(size_t)r * s.groups + g], dot = 0.0f;
            for (int i = 0; i < s.G; i++) dot += dy[i] * wg[i] * x[i] * rs;
            dot /= s.G;
            for (int i = 0; i < s.G; i++) dx[i] += rs * (dy[i] * wg[i] - x[i] * rs * dot);
        }
    }
    // Weight gradient: one output per weight element, summed over rows (and groups when shared).
    int nw = s.wstride ? s.groups * s.G : s.G;
    #pragma omp parallel for if(threads_pay((double)s.rows * s.groups * s.G))
    for (int k = 0; k < nw; k++) {
        int g0 = s.wstride ? k / s.G : 0, g1 = s.wstride ? g0 + 1 : s.groups, i = k % s.G;
        real acc = 0.0f;
        for (int r = 0; r < s.rows; r++)
            for (int g = g0; g < g1; g++)
                acc += dout[(size_t)r * s.out_stride + (size_t)g * s.G + i] * in[(size_t)r * s.in_stride + (size_t)g * s.G + i]
                       * rstd[(size_t)r * s.groups + g];
        dw[k] += acc;
    }
}

// The three matmuls share one register-blocked micro-kernel: a 4 x MM_W tile of the result,
// acc[r][j] += Σ_k a_r[k·as] · b[k·bs + j], where b's rows are contiguous, so the inner loop is a
// vector FMA with the tile held in registers. Each result element is owned by one thread and summed
// in a fixed order, so results do not depend on the thread count.
#define MM_W 64
#define MM_R 4

typedef struct { const real *a[MM_R]; size_t as; const real *b; size_t bs; int K, width; } Tile;

static void tile_accumulate(real acc[MM_R][MM_W], Tile t) {
    if (t.width == MM_W) {
        for (int k = 0; k < t.K; k++) {
            const real *b = t.b + (size_t)k * t.bs;
            for (int r = 0; r < MM_R; r++) {
                real x = t.a[r][(size_t)k * t.as];
                #pragma omp simd
                for (int j = 0; j < MM_W; j++) acc[r][j] += x * b[j];
            }
        }
    } else {
        for (int k = 0; k < t.K; k++) {
            const real *b = t.b + (size_t)k * t.bs;
            for (int r = 0; r < MM_R; r++) {
                real x = t.a[r][(size_t)k * t.as];
                for (int j = 0; j < t.width; j++) acc[r][j] += x * b[j];
            }
        }
    }
}

// Points the tile's rows at rows r0.. of a (row stride lda), repeating the last valid row past n.
static void tile_rows(Tile *t, const real *a, size_t lda, int r0, int n) {
    for (int r = 0; r < MM_R; r++) t->a[r] = a + (size_t)(r0 + r < n ? r0 + r : n - 1) * lda;
}

static int min_int(int a, int b) { return a < b ? a : b; }

// out (N, OUT) = in (N, IN) · Wᵀ, W (OUT, IN) row-major. Each thread transposes a block of MM_W
// rows of W once, then streams every input row past it.
static void matmul_forward(real *out, const real *in, const real *W, int N, int IN, int OUT) {
    int nblocks = (OUT + MM_W - 1) / MM_W;
    #pragma omp parallel if(threads_pay((double)(N + 1) * IN * OUT))  // (+ 1: the transposes of W)
    {
        real *wt = fox_malloc((size_t)IN * MM_W * sizeof(real));
        #pragma omp for schedule(dynamic)
        for (int ob = 0; ob < nblocks; ob++) {
            int o0 = ob * MM_W, width = min_int(MM_W, OUT - o0);
            for (int i = 0; i < IN; i++)
                for (int j = 0; j < MM_W; j++) wt[(size_t)i * MM_W + j] = j < width ? W[(size_t)(o0 + j) * IN + i] : 0;
            for (int n0 = 0; n0 < N; n0 += MM_R) {
                real acc[MM_R][MM_W] = {{0}};
                Tile t = {{NULL}, 1, wt, MM_W, IN, MM_W};
                tile_rows(&t, in, (size_t)IN, n0, N);
                tile_accumulate(acc, t);
                for (int r = 0; r < MM_R && n0 + r < N; r++)
                    memcpy(out + (size_t)(n0 + r) * OUT + o0, acc[r], (size_t)width * sizeof(real));
            }
        }
        free(wt);
    }
}

// din += dout · W; dW += doutᵀ · in.
static void matmul_backward(real *din, real *dW, const real *dout, const real *in, const real *W,
                            int N, int IN, int OUT) {
    int ncols = (IN + MM_W - 1) / MM_W, nrows = (N + MM_R - 1) / MM_R, nouts = (OUT + MM_R - 1) / MM_R;
    // din[n][i0 : i0+MM_W] += Σ_o dout[n][o] W[o][i0 : i0+MM_W]
    #pragma omp parallel for if(threads_pay((double)N * IN * OUT)) collapse(2) schedule(dynamic)
    for (int rb = 0; rb < nrows; rb++) {
        for (int cb = 0; cb < ncols; cb++) {
            int n0 = rb * MM_R, i0 = cb * MM_W;
            real acc[MM_R][MM_W] = {{0}};
            Tile t = {{NULL}, 1, W + i0, (size_t)IN, OUT, min_int(MM_W, IN - i0)};
            tile_rows(&t, dout, (size_t)OUT, n0, N);
            tile_accumulate(acc, t);
            for (int r = 0; r < MM_R && n0 + r < N; r++)
                for (int j = 0; j < t.width; j++) din[(size_t)(n0 + r) * IN + i0 + j] += acc[r][j];
        }
    }
    // dW[o][i0 : i0+MM_W] += Σ_n dout[n][o] in[n][i0 : i0+MM_W]
    #pragma omp parallel for if(threads_pay((double)N * IN * OUT)) collapse(2) schedule(dynamic)
    for (int ob = 0; ob < nouts; ob++) {
        for (int cb = 0; cb < ncols; cb++) {
            int o0 = ob * MM_R, i0 = cb * MM_W;
            real acc[MM_R][MM_W] = {{0}};
            Tile t = {{NULL}, (size_t)OUT, in + i0, (size_t)IN, N, min_int(MM_W, IN - i0)};
            for (int r = 0; r < MM_R; r++) t.a[r] = dout + min_int(o0 + r, OUT - 1);
            tile_accumulate(acc, t);
            for (int r = 0; r < MM_R && o0 + r < OUT; r++)
                for (int j = 0; j < t.width; j++) dW[(size_t)(o0 + r) * IN + i0 + j] += acc[r][j];
        }
    }
}

// KV-shift (FoX eq. 14): y_t = α_t x_{t-1} + (1-α_t) x_t per head, α_t = σ(w·x̂_t), x_{-1} = 0, and
// x_{t-1} = 0 at a document's first token (fox_doc_has_prev, docs/model.md §1.8).
// x is read from proj at column xc (stride NIN), the α logits at column ac; y is (N, D).
// tokens (B, T) and sep: the document mask (sep < 0: none).
typedef struct { int B, T, H, Dh, stride; const int *tokens; int sep; } SeqShape;

// The previous row of x (t − 1 of the same sequence) when KV-shift reaches it, else NULL.
static const real *shift_prev(const real *x, size_t n, int t, SeqShape s) {
    return fox_doc_has_prev(s.tokens + (n - t), t, s.sep) ? x - s.stride : NULL;
}

static void kv_shift_forward(real *y, const real *proj, int xc, int ac, SeqShape s) {
    int D = s.H * s.Dh;
    #pragma omp parallel for if(threads_pay((double)s.B * s.T * D)) collapse(2)
    for (int b = 0; b < s.B; b++) {
        for (int t = 0; t < s.T; t++) {
            size_t n = (size_t)b * s.T + t;
            const real *x = proj + n * s.stride + xc, *xp = shift_prev(x, n, t, s);
            for (int h = 0; h < s.H; h++) {
                real al = sigmoid_r(proj[n * s.stride + ac + h]);
                for (int i = 0; i < s.Dh; i++) {
                    int k = h * s.Dh + i;
                    y[n * D + k] = (xp ? al * xp[k] : 0.0f) + (1.0f - al) * x[k];
                }
            }
        }
    }
}

static void kv_shift_backward(real *dproj, const real *dy, const real *proj, int xc, int ac, SeqShape s) {
    int D = s.H * s.Dh;
    #pragma omp parallel for if(threads_pay((double)s.B * s.T * D)) collapse(2)
    for (int b = 0; b < s.B; b++) {
        for (int h = 0; h < s.H; h++) {
            for (int t = 0; t < s.T; t++) {
                size_t n = (size_t)b * s.T + t;
                const real *x = proj + n * s.stride + xc, *xp = shift_prev(x, n, t, s);
                real *dx = dproj + n * s.stride + xc, *dxp = xp ? dx - s.stride : NULL;
                real al = sigmoid_r(proj[n * s.stride + ac + h]), dal = 0.0f;
                for (int i = 0; i < s.Dh; i++) {
                    int k = h * s.Dh + i;
                    real g = dy[n * D + k];
                    dx[k] += (1.0f - al) * g;
                    if (xp) { dxp[k] += al * g; dal += g * (xp[k] - x[k]); }
                    else dal -= g * x[k];
                }
                dproj[n * s.stride + ac + h] += dal * al * (1.0f - al);
            }
        }
    }
}

// Copies columns [xc, xc+D) of proj into y (used when KV-shift is off).
static void copy_columns(real *y, const real *proj, int xc, int N, int D, int stride) {
    #pragma omp parallel for if(threads_pay((double)N * D))
    for (int n = 0; n < N; n++) memcpy(y + (size_t)n * D, proj + (size_t)n * stride + xc, (size_t)D * sizeof(real));
}

static void add_columns(real *dproj, const real *dy, int xc, int N, int D, int stride) {
    #pragma omp parallel for if(threads_pay((double)N * D))
    for (int n = 0; n < N; n++)
        for (int k = 0; k < D; k++) dproj[(size_t)n * stride + xc + k] += dy[(size_t)n * D + k];
}

// RoPE, rotate-half convention: pairs (i, i + Dh/2) of one head's vector turn by t·θ^(-2i/Dh).
static void rope_rotate(real *v, int t, int Dh, real theta, int inverse) {
    int half = Dh / 2;
    for (int i = 0; i < half; i++) {
        double ang = fox_rope_angle(t, i, Dh, (double)theta);
        real cs = (real)cos(ang), sn = (real)(inverse ? -sin(ang) : sin(ang));
        real x1 = v[i], x2 = v[i + half];
        v[i] = x1 * cs - x2 * sn;
        v[i + half] = x2 * cs + x1 * sn;
    }
}

// RoPE in place on (N, D), position pos0 + t of each sequence's row t.
static void rope_apply(real *x, SeqShape s, real theta, int inverse, int pos0) {
    int D = s.H * s.Dh;
    #pragma omp parallel for if(threads_pay(WORK_TRANSC * s.B * s.T * D)) collapse(2)
    for (int b = 0; b < s.B; b++)
        for (int t = 0; t < s.T; t++)
            for (int h = 0; h < s.H; h++)
                rope_rotate(x + ((size_t)b * s.T + t) * D + (size_t)h * s.Dh, pos0 + t, s.Dh, theta, inverse);
}

// log f_t of head h (FoX eq. 20; docs/model.md §1.1 for the gate kinds) from one row of proj: 0 without a
// gate, FOX_DOC_LOG_F at a separator under the document mask (docs/model.md §1.8).
static real log_forget(const real *proj_row, const real *bias, int fc, int kind, int h, int token, int sep) {
    real lf = kind == FOX_FG_NONE ? 0.0f : logsigmoid_r(bias[h] + (kind == FOX_FG_DATA_DEPENDENT ? proj_row[fc + h] : 0.0f));
    return (real)fox_doc_log_f(lf, token, sep);
}

// Forget gate: log f_t per head (logsigmoid in fp32) and c_t = Σ_{l≤t} log f_l, stored (B, H, T).
static void forget_gate_forward(creal *c, const real *proj, const real *bias, int fc, int kind, SeqShape s) {
    #pragma omp parallel for if(threads_pay(WORK_TRANSC * s.B * s.H * s.T)) collapse(2)
    for (int b = 0; b < s.B; b++) {
        for (int h = 0; h < s.H; h++) {
            creal acc = 0.0;
            creal *ch = c + ((size_t)b * s.H + h) * s.T;
            for (int t = 0; t < s.T; t++) {
                size_t n = (size_t)b * s.T + t;
                acc += log_forget(proj + n * s.stride, bias, fc, kind, h, s.tokens[n], s.sep);
                ch[t] = acc;
            }
        }
    }
}

// d log f_t = Σ_{i≥t} dc_i, a true reverse cumulative sum (no "total minus prefix"); then through
// logsigmoid: d logit = d log f · σ(-logit).
static void forget_gate_backward(real *dproj, real *dbias, const real *dc, const real *proj,
                                 const real *bias, int fc, int kind, SeqShape s) {
    #pragma omp parallel for if(threads_pay(WORK_TRANSC * s.B * s.H * s.T))
    for (int h = 0; h < s.H; h++) {
        double db = 0.0;
        for (int b = 0; b < s.B; b++) {
            const real *dch = dc + ((size_t)b * s.H + h) * s.T;
            double acc = 0.0;
            for (int t = s.T - 1; t >= 0; t--) {
                acc += dch[t];
                size_t n = (size_t)b * s.T + t;
                real logit = bias[h] + (kind == FOX_FG_DATA_DEPENDENT ? proj[n * s.stride + fc + h] : 0.0f);
                // a separator's log f is FOX_DOC_LOG_F whatever the gate says (docs/model.md §1.8)
                real dlogit = fox_doc_start(s.tokens[n], s.sep) ? 0.0f : (real)acc * sigmoid_r(-logit);
                if (kind == FOX_FG_DATA_DEPENDENT) dproj[n * s.stride + fc + h] += dlogit;
                db += dlogit;
            }
        }
        if (kind != FOX_FG_FIXED) dbias[h] += (real)db;
    }
}

// The first key a query row attends to: 0, or with ACP the first key of its first live block.
static int first_key(const int *kv_first, int bh, int i, SeqShape s) {
    return kv_first ? kv_first[(size_t)bh * fox_acp_blocks(s.T) + i / FOX_ACP_BLOCK] * FOX_ACP_BLOCK : 0;
}

// One query's online softmax, fed keys in one or more runs (attend_keys), then closed (attend_finish):
// the running maximum score and the sum of exp(s_j − mx); o holds Σ_j exp(s_j − mx) v_j meanwhile.
typedef struct { real mx, l; } Softmax;

static Softmax attend_start(real *o, int Dh) {
    memset(o, 0, (size_t)Dh * sizeof(real));
    Softmax sm = {-INFINITY, 0.0f};
    return sm;
}

// Adds keys j in [j0, j1] (rows ld apart in k and v) to the query's softmax: s_j = q·k_j/√d + ci − c[j], or
// + bias0 for every key when c is NULL.
static void attend_keys(real *o, Softmax *sm, const real *qi, const real *k, const real *v, size_t ld, const creal *c,
                        creal ci, real bias0, int j0, int j1, int Dh) {
    real scale = 1.0f / sqrt_r((real)Dh), mx = sm->mx, l = sm->l;
    for (int j = j0; j <= j1; j++) {
        const real *kj = k + (size_t)j * ld, *vj = v + (size_t)j * ld;
        real dot = 0.0f;
        #pragma omp simd reduction(+:dot)
        for (int d = 0; d < Dh; d++) dot += qi[d] * kj[d];
        real sc = dot * scale + (c ? (real)(ci - c[j]) : bias0);
        if (sc > mx) {
            real r = exp_r(mx - sc);
            l *= r;
            for (int d = 0; d < Dh; d++) o[d] *= r;
            mx = sc;
        }
        real p = exp_r(sc - mx);
        l += p;
        for (int d = 0; d < Dh; d++) o[d] += p * vj[d];
    }
    sm->mx = mx;
    sm->l = l;
}

// o = Σ_j exp(s_j) v_j / Σ_j exp(s_j); returns the log-sum-exp of the s_j.
static real attend_finish(real *o, Softmax sm, int Dh) {
    for (int d = 0; d < Dh; d++) o[d] /= sm.l;
    return sm.mx + log_r(sm.l);
}

// One query row of Forgetting Attention over keys j in [j0, j1] (rows ld apart in k and v):
// o = Σ_j exp(s_j) v_j / Σ_j exp(s_j), s_j = q·k_j/√d + ci − c[j] (c NULL: no bias). Returns the log-sum-exp.
static real attend_row(real *o, const real *qi, const real *k, const real *v, size_t ld, const creal *c, creal ci,
                       int j0, int j1, int Dh) {
    Softmax sm = attend_start(o, Dh);
    attend_keys(o, &sm, qi, k, v, ld, c, ci, 0.0f, j0, j1, Dh);
    return attend_finish(o, sm, Dh);
}

// Forgetting Attention (FoX eq. 11-13), causal, row by row (attend_row):
// o_i = Σ_{j≤i} exp(q_i·k_j/√d + c_i − c_j) v_j / Σ_{j≤i} exp(...). Stores lse_i for backward.
// q, k, v, o are (N, D) with head h at columns h·Dh; c and lse are (B, H, T). kv_first: the ACP
// staircase (fox/acp.h), or NULL.
static void attention_forward(real *o, real *lse, const real *q, const real *k, const real *v,
                              const creal *c, const int *kv_first, SeqShape s) {
    int D = s.H * s.Dh;
    #pragma omp parallel for if(threads_pay((double)s.B * s.H * s.T * (s.T + 1) * s.Dh)) collapse(2)
    for (int b = 0; b < s.B; b++) {
        for (int h = 0; h < s.H; h++) {
            const creal *ch = c ? c + ((size_t)b * s.H + h) * s.T : NULL;
            size_t row0 = (size_t)b * s.T * D + (size_t)h * s.Dh;
            for (int i = 0; i < s.T; i++) {
                size_t ri = row0 + (size_t)i * D;
                lse[((size_t)b * s.H + h) * s.T + i] = attend_row(o + ri, q + ri, k + row0, v + row0, (size_t)D, ch,
                                                                  ch ? ch[i] : 0.0f, first_key(kv_first, b * s.H + h, i, s), i, s.Dh);
            }
        }
    }
}

// Backward of the above: with P_ij = exp(s_ij − lse_i), D_i = dO_i·o_i, dS_ij = P_ij (dO_i·v_j − D_i):
// dq_i = Σ_j dS_ij k_j/√d, dk_j = Σ_i dS_ij q_i/√d, dv_j = Σ_i P_ij dO_i, dc_i += Σ_j dS_ij, dc_j −= Σ_i dS_ij.
static void attention_backward(real *dq, real *dk, real *dv, real *dc, const real *dout,
                               const real *q, const real *k, const real *v, const real *o,
                               const real *lse, const creal *c, const int *kv_first, SeqShape s) {
    int D = s.H * s.Dh;
    real scale = 1.0f / sqrt_r((real)s.Dh);
    #pragma omp parallel for if(threads_pay(2.0 * s.B * s.H * s.T * (s.T + 1) * s.Dh)) collapse(2)
    for (int b = 0; b < s.B; b++) {
        for (int h = 0; h < s.H; h++) {
            size_t bh = ((size_t)b * s.H + h) * s.T;
            const creal *ch = c ? c + bh : NULL;
            for (int i = 0; i < s.T; i++) {
                size_t ri = ((size_t)b * s.T + i) * D + h * s.Dh;
                real Di = 0.0f;
                for (int d = 0; d < s.Dh; d++) Di += dout[ri + d] * o[ri + d];
                for (int j = first_key(kv_first, b * s.H + h, i, s); j <= i; j++) {
                    size_t rj = ((size_t)b * s.T + j) * D + h * s.Dh;
                    real dot = 0.0f, dp = 0.0f;
                    for (int d = 0; d < s.Dh; d++) { dot += q[ri + d] * k[rj + d]; dp += dout[ri + d] * v[rj + d]; }
                    real p = exp_r(dot * scale + (ch ? (real)(ch[i] - ch[j]) : 0.0f) - lse[bh + i]);
                    real ds = p * (dp - Di);
                    for (int d = 0; d < s.Dh; d++) {
                        dq[ri + d] += ds * scale * k[rj + d];
                        dk[rj + d] += ds * scale * q[ri + d];
                        dv[rj + d] += p * dout[ri + d];
                    }
                    if (dc) { dc[bh + i] += ds; dc[bh + j] -= ds; }
                }
            }
        }
    }
}

// The backward of attend_keys for one query row: with p_j = exp(s_j − lse), ds_j = p_j (dO·v_j − Di), Di = dO·o:
// dq += Σ_j ds_j k_j/√d, dk_j += ds_j q/√d, dv_j += p_j dO, and with dc, dc[j] −= ds_j. Returns Σ_j ds_j (the
// gradient of the query's own c).
static real attend_keys_backward(real *dqi, real *dk, real *dv, real *dc, const real *qi, const real *doi, real Di, real lse,
                                 const real *k, const real *v, size_t ld, const creal *c, creal ci, real bias0, int j0,
                                 int j1, int Dh) {
    real scale = 1.0f / sqrt_r((real)Dh), dsum = 0.0f;
    for (int j = j0; j <= j1; j++) {
        const real *kj = k + (size_t)j * ld, *vj = v + (size_t)j * ld;
        real *dkj = dk + (size_t)j * ld, *dvj = dv + (size_t)j * ld, dot = 0.0f, dp = 0.0f;
        for (int d = 0; d < Dh; d++) { dot += qi[d] * kj[d]; dp += doi[d] * vj[d]; }
        real p = exp_r(dot * scale + (c ? (real)(ci - c[j]) : bias0) - lse), ds = p * (dp - Di);
        for (int d = 0; d < Dh; d++) {
            dqi[d] += ds * scale * kj[d];
            dkj[d] += ds * scale * qi[d];
            dvj[d] += p * doi[d];
        }
        if (dc) dc[j] -= ds;
        dsum += ds;
    }
    return dsum;
}

// TransformerFAM (docs/model.md §1.10): the block a memory update reads, for one sequence and head. The tokens'
// keys and values (rows ld apart; k NULL: none, the prompt's update), their gradients, the sequence's c (NULL:
// no bias) and its gradient, and the block [t0, t1). The update's queries carry c of the block's last token,
// the memory's keys c of the token before the block (0 before the first).
typedef struct {
    const real *k, *v;
    real *dk, *dv;
    size_t ld;
    const creal *c;
    real *dc;
    int t0, t1;
} FamBlock;

static creal fam_c_query(FamBlock blk) { return blk.c ? blk.c[blk.t1 - 1] : 0.0; }
static creal fam_c_memory(FamBlock blk) { return blk.c && blk.t0 > 0 ? blk.c[blk.t0 - 1] : 0.0; }

// The memory's M queries of one sequence and head (rows D apart in fq, fk, fv, o; lse H apart): each attends to
// the memory's M keys, then to the block's tokens (FAM paper Algorithm 2: the memory compresses the block,
// conditioned on itself).
static void fam_attend_head(real *o, real *lse, const real *fq, const real *fk, const real *fv, FamBlock blk, int M,
                            int D, int H, int Dh) {
    creal cq = fam_c_query(blk);
    real bias_memory = (real)(cq - fam_c_memory(blk));
    for (int i = 0; i < M; i++) {
        real *oi = o + (size_t)i * D;
        const real *qi = fq + (size_t)i * D;
        Softmax sm = attend_start(oi, Dh);
        attend_keys(oi, &sm, qi, fk, fv, (size_t)D, NULL, 0.0, bias_memory, 0, M - 1, Dh);
        if (blk.k) attend_keys(oi, &sm, qi, blk.k, blk.v, blk.ld, blk.c, cq, 0.0f, blk.t0, blk.t1 - 1, Dh);
        lse[(size_t)i * H] = attend_finish(oi, sm, Dh);
    }
}

// Backward of fam_attend_head: d_o → dfq, dfk, dfv (+=) and the block's dk, dv, dc (+=).
static void fam_attend_head_backward(real *dfq, real *dfk, real *dfv, const real *d_o, const real *fq, const real *fk,
                                     const real *fv, const real *o, const real *lse, FamBlock blk, int M, int D, int H,
                                     int Dh) {
    creal cq = fam_c_query(blk);
    real bias_memory = (real)(cq - fam_c_memory(blk));
    for (int i = 0; i < M; i++) {
        const real *qi = fq + (size_t)i * D, *doi = d_o + (size_t)i * D, *oi = o + (size_t)i * D;
        real Di = 0.0f, li = lse[(size_t)i * H];
        for (int d = 0; d < Dh; d++) Di += doi[d] * oi[d];
        real s_mem = attend_keys_backward(dfq + (size_t)i * D, dfk, dfv, NULL, qi, doi, Di, li, fk, fv, (size_t)D, NULL, 0.0,
                                          bias_memory, 0, M - 1, Dh);
        real s_blk = blk.k ? attend_keys_backward(dfq + (size_t)i * D, blk.dk, blk.dv, blk.dc, qi, doi, Di, li, blk.k, blk.v,
                                                  blk.ld, blk.c, cq, 0.0f, blk.t0, blk.t1 - 1, Dh) : 0.0f;
        if (blk.dc) {
            blk.dc[blk.t1 - 1] += s_mem + s_blk;
            if (blk.t0 > 0) blk.dc[blk.t0 - 1] -= s_mem;
        }
    }
}

// ----------------------------------------------------------------------------
// Gated Slot Attention (docs/model.md §1.9; GSA paper eq. 6-9). Per head g of G, with m slots of dh values:
// K̃_t = α_t ⊙ K̃_{t-1} + (1 − α_t) ⊗ k_t, Ṽ_t likewise with v_t, o_t = Ṽ_tᵀ softmax(K̃_t q_t / √dh),
// α_t = σ(W_α x̂_t)^(1/τ) one per slot; q, k, v are the Swish features of their projections. The recurrent
// form (train_fox.py checks it against the chunked form), the states kept every FOX_GSA_CHUNK tokens.

typedef struct { int B, T, G, m, dh, stride, slot_col; real tau; } GsaShape;

static GsaShape gsa_shape(const Model *m, int B, int T) {
    const FoxConfig *cfg = &m->cfg;
    GsaShape s = {B, T, cfg->gsa_heads, cfg->gsa_slots, cfg->d_model / cfg->gsa_heads, m->cols.width, m->cols.slot_gate, cfg->gsa_tau};
    return s;
}

static real swish_r(real x) { return x * sigmoid_r(x); }

static real swish_grad_r(real x) {
    real sg = sigmoid_r(x);
    return sg * (1.0f + x * (1.0f - sg));
}

// log α of slot i of head g at row n of proj: logsigmoid(logit) / τ (α = σ(logit)^(1/τ)).
static real gsa_log_alpha(const real *proj, size_t n, int g, int i, GsaShape s) {
    return logsigmoid_r(proj[n * s.stride + s.slot_col + g * s.m + i]) / s.tau;
}

// One token's update of one head's slots (eq. 6): S1 = α ⊙ S0 + (1 − α) ⊗ k, U1 likewise with v, α from
// row n of proj; S0, U0 NULL: zeros. S1 may be S0 (in place).
static void gsa_update(real *S1, real *U1, const real *S0, const real *U0, const real *kh, const real *vh,
                       const real *proj, size_t n, int g, GsaShape s) {
    for (int i = 0; i < s.m; i++) {
        real al = exp_r(gsa_log_alpha(proj, n, g, i, s));
        for (int j = 0; j < s.dh; j++) {
            size_t e = (size_t)i * s.dh + j;
            S1[e] = (S0 ? al * S0[e] : 0.0f) + (1.0f - al) * kh[j];
            U1[e] = (U0 ? al * U0[e] : 0.0f) + (1.0f - al) * vh[j];
        }
    }
}

// The read of one head (eq. 6): p = softmax(S q / √dh) over the m slots, o = Uᵀ p.
static void gsa_read(real *oh, real *p, const real *S, const real *U, const real *qh, GsaShape s) {
    real scale = 1.0f / sqrt_r((real)s.dh), mx = -INFINITY, sum = 0.0f;
    for (int i = 0; i < s.m; i++) {
        real dot = 0.0f;
        for (int j = 0; j < s.dh; j++) dot += S[(size_t)i * s.dh + j] * qh[j];
        p[i] = dot * scale;
        mx = p[i] > mx ? p[i] : mx;
    }
    for (int i = 0; i < s.m; i++) { p[i] = exp_r(p[i] - mx); sum += p[i]; }
    for (int i = 0; i < s.m; i++) p[i] /= sum;
    for (int j = 0; j < s.dh; j++) {
        real acc = 0.0f;
        for (int i = 0; i < s.m; i++) acc += U[(size_t)i * s.dh + j] * p[i];
        oh[j] = acc;
    }
}

// The recurrence over every sequence and head: o (N, D), P (B, G, T, m), and in S, U (B, G, gsa_chunks(T), m,
// dh) the states after each chunk's last token. S0, U0 (B, G, m, dh): the states before the first token, or
// NULL for zeros (a decode step: T = 1 and S0 = S, U0 = U, so the cache's states move on by one token).
static void gsa_forward(real *o, real *S, real *U, real *P, const real *S0, const real *U0, const real *q, const real *k,
                        const real *v, const real *proj, GsaShape s) {
    int D = s.G * s.dh, nc = gsa_chunks(s.T);
    size_t state = (size_t)s.m * s.dh;
    #pragma omp parallel for if(threads_pay(4.0 * s.B * s.G * s.T * s.m * s.dh)) collapse(2)
    for (int b = 0; b < s.B; b++) {
        for (int g = 0; g < s.G; g++) {
            size_t bg = (size_t)b * s.G + g;
            real *Sw = fox_malloc(state * sizeof(real)), *Uw = fox_malloc(state * sizeof(real));
            int fresh = !S0;
            if (S0) {
                memcpy(Sw, S0 + bg * state, state * sizeof(real));
                memcpy(Uw, U0 + bg * state, state * sizeof(real));
            }
            for (int t = 0; t < s.T; t++) {
                size_t n = (size_t)b * s.T + t, hd = n * D + (size_t)g * s.dh;
                gsa_update(Sw, Uw, fresh && !t ? NULL : Sw, fresh && !t ? NULL : Uw, k + hd, v + hd, proj, n, g, s);
                gsa_read(o + hd, P + (bg * s.T + t) * s.m, Sw, Uw, q + hd, s);
                if (t % FOX_GSA_CHUNK == FOX_GSA_CHUNK - 1 || t == s.T - 1) {
                    memcpy(S + (bg * nc + t / FOX_GSA_CHUNK) * state, Sw, state * sizeof(real));
                    memcpy(U + (bg * nc + t / FOX_GSA_CHUNK) * state, Uw, state * sizeof(real));
                }
            }
            free(Sw);
            free(Uw);
        }
    }
}

// Backward of the above, back through time with the gradients of the current states dS, dU (m, dh):
// at t, dU += p ⊗ do, ds = p ⊙ (U do − p·U do), dS += (ds/√dh) ⊗ q, dq = S ᵀ ds/√dh; then through the
// update: dk = Σ_i (1 − α_i) dS_i, dv likewise, dα_i = Σ_j dS_ij (S_{t-1} − k)_j + dU_ij (U_{t-1} − v)_j,
// and dS, dU ← α ⊙ dS, α ⊙ dU for t − 1. Each chunk's states are recomputed from the kept state before it
// (the same operations as the forward's, so the same values). dq, dk, dv (N, D) are set; the slot-gate
// logits' gradient dα · α / τ · σ(−logit) goes into dproj.
static void gsa_backward(real *dq, real *dk, real *dv, real *dproj, const real *d_o, const real *q, const real *k,
                         const real *v, const real *proj, const real *S, const real *U, const real *P, GsaShape s) {
    int D = s.G * s.dh, nc = gsa_chunks(s.T);
    real scale = 1.0f / sqrt_r((real)s.dh);
    size_t state = (size_t)s.m * s.dh;
    #pragma omp parallel for if(threads_pay(8.0 * s.B * s.G * s.T * s.m * s.dh)) collapse(2)
    for (int b = 0; b < s.B; b++) {
        for (int g = 0; g < s.G; g++) {
            size_t bg = (size_t)b * s.G + g;
            real *dS = fox_calloc(state, sizeof(real)), *dU = fox_calloc(state, sizeof(real));
            real *ds = fox_malloc((size_t)s.m * sizeof(real));
            // Sc[j], Uc[j]: the states after token t0 + j − 1 of the chunk starting at t0 (Sc[0]: before it)
            real *Sc = fox_calloc((FOX_GSA_CHUNK + 1) * state, sizeof(real));
            real *Uc = fox_calloc((FOX_GSA_CHUNK + 1) * state, sizeof(real));
            for (int c = nc - 1; c >= 0; c--) {
                int t0 = c * FOX_GSA_CHUNK, t1 = t0 + FOX_GSA_CHUNK < s.T ? t0 + FOX_GSA_CHUNK : s.T;
                if (c) {
                    memcpy(Sc, S + (bg * nc + c - 1) * state, state * sizeof(real));
                    memcpy(Uc, U + (bg * nc + c - 1) * state, state * sizeof(real));
                } else {
                    memset(Sc, 0, state * sizeof(real));
                    memset(Uc, 0, state * sizeof(real));
                }
                for (int t = t0; t < t1; t++) {
                    size_t n = (size_t)b * s.T + t, hd = n * D + (size_t)g * s.dh, j = (size_t)(t - t0);
                    gsa_update(Sc + (j + 1) * state, Uc + (j + 1) * state, t ? Sc + j * state : NULL,
                               t ? Uc + j * state : NULL, k + hd, v + hd, proj, n, g, s);
                }
                for (int t = t1 - 1; t >= t0; t--) {
                    size_t n = (size_t)b * s.T + t, hd = n * D + (size_t)g * s.dh, j = (size_t)(t - t0);
                    const real *St = Sc + (j + 1) * state, *Ut = Uc + (j + 1) * state, *Sp = Sc + j * state;
                    const real *Up = Uc + j * state, *pt = P + (bg * s.T + t) * s.m;
                    real pdp = 0.0f;
                    for (int i = 0; i < s.m; i++) {
                        real dp = 0.0f;
                        for (int jj = 0; jj < s.dh; jj++) {
                            size_t e = (size_t)i * s.dh + jj;
                            dp += Ut[e] * d_o[hd + jj];
                            dU[e] += pt[i] * d_o[hd + jj];
                        }
                        ds[i] = dp;
                        pdp += pt[i] * dp;
                    }
                    for (int jj = 0; jj < s.dh; jj++) dq[hd + jj] = 0.0f;
                    for (int i = 0; i < s.m; i++) {
                        real dsi = pt[i] * (ds[i] - pdp) * scale;
                        for (int jj = 0; jj < s.dh; jj++) {
                            size_t e = (size_t)i * s.dh + jj;
                            dS[e] += dsi * q[hd + jj];
                            dq[hd + jj] += St[e] * dsi;
                        }
                    }
                    for (int jj = 0; jj < s.dh; jj++) dk[hd + jj] = dv[hd + jj] = 0.0f;
                    for (int i = 0; i < s.m; i++) {
                        real al = exp_r(gsa_log_alpha(proj, n, g, i, s)), dal = 0.0f;
                        for (int jj = 0; jj < s.dh; jj++) {
                            size_t e = (size_t)i * s.dh + jj;
                            dk[hd + jj] += (1.0f - al) * dS[e];
                            dv[hd + jj] += (1.0f - al) * dU[e];
                            dal += dS[e] * (Sp[e] - k[hd + jj]) + dU[e] * (Up[e] - v[hd + jj]);
                            dS[e] *= al;
                            dU[e] *= al;
                        }
                        size_t col = n * s.stride + s.slot_col + (size_t)g * s.m + i;
                        dproj[col] += dal * al / s.tau * sigmoid_r(-proj[col]);
                    }
                }
            }
            free(dS);
            free(dU);
            free(ds);
            free(Sc);
            free(Uc);
        }
    }
}

// Output gate: z = on ⊙ σ(graw), graw read from proj at column gc.
static void output_gate_forward(real *z, const real *on, const real *proj, int gc, int N, int D, int stride) {
    #pragma omp parallel for if(threads_pay(WORK_TRANSC * N * D))
    for (int n = 0; n < N; n++)
        for (int k = 0; k < D; k++) z[(size_t)n * D + k] = on[(size_t)n * D + k] * sigmoid_r(proj[(size_t)n * stride + gc + k]);
}

static void output_gate_backward(real *don, real *dproj, const real *dz, const real *on, const real *proj,
                                 int gc, int N, int D, int stride) {
    #pragma omp parallel for if(threads_pay(WORK_TRANSC * N * D))
    for (int n = 0; n < N; n++) {
        for (int k = 0; k < D; k++) {
            size_t i = (size_t)n * D + k;
            real g = sigmoid_r(proj[(size_t)n * stride + gc + k]);
            don[i] += dz[i] * g;
            dproj[(size_t)n * stride + gc + k] += dz[i] * on[i] * g * (1.0f - g);
        }
    }
}

// SwiGLU: h = silu(a) ⊙ b with u = [a | b], each of width I.
static void swiglu_forward(real *hout, const real *u, int N, int I) {
    #pragma omp parallel for if(threads_pay(WORK_TRANSC * N * I))
    for (int n = 0; n < N; n++) {
        for (int i = 0; i < I; i++) {
            real a = u[(size_t)n * 2 * I + i], b = u[(size_t)n * 2 * I + I + i];
            hout[(size_t)n * I + i] = swish_r(a) * b;
        }
    }
}

static void swiglu_backward(real *du, const real *dh, const real *u, int N, int I) {
    #pragma omp parallel for if(threads_pay(WORK_TRANSC * N * I))
    for (int n = 0; n < N; n++) {
        for (int i = 0; i < I; i++) {
            real a = u[(size_t)n * 2 * I + i], b = u[(size_t)n * 2 * I + I + i], sg = sigmoid_r(a);
            real g = dh[(size_t)n * I + i];
            du[(size_t)n * 2 * I + i] += g * b * sg * (1.0f + a * (1.0f - sg));
            du[(size_t)n * 2 * I + I + i] += g * a * sg;
        }
    }
}

static void residual_add(real *out, const real *a, const real *b, size_t n) {
    #pragma omp parallel for if(threads_pay((double)n))
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

// Per-position cross entropy from logits (N, V), 0 where the target is negative; returns the mean over the
// counted targets.
static double crossentropy_forward(real *losses, const real *logits, const int *targets, int N, int V) {
    #pragma omp parallel for if(threads_pay(WORK_TRANSC * N * V))
    for (int n = 0; n < N; n++) {
        const real *z = logits + (size_t)n * V;
        if (targets[n] < 0) { losses[n] = 0.0f; continue; }
        real mx = -INFINITY;
        for (int i = 0; i < V; i++) if (z[i] > mx) mx = z[i];
        double sum = 0.0;
        for (int i = 0; i < V; i++) sum += exp_r(z[i] - mx);
        losses[n] = (real)(log(sum) + mx - z[targets[n]]);
    }
    double total = 0.0;
    for (int n = 0; n < N; n++) total += losses[n];
    int count = fox_counted_targets(targets, N);
    return count ? total / count : 0.0;
}

// In place: logits → dlogits = (softmax − onehot) · dloss (0 where the target is negative).
static void crossentropy_backward(real *logits, const int *targets, int N, int V, real dloss) {
    #pragma omp parallel for if(threads_pay(WORK_TRANSC * N * V))
    for (int n = 0; n < N; n++) {
        real *z = logits + (size_t)n * V;
        if (targets[n] < 0) {
            for (int i = 0; i < V; i++) z[i] = 0.0f;
            continue;
        }
        real mx = -INFINITY;
        for (int i = 0; i < V; i++) if (z[i] > mx) mx = z[i];
        double sum = 0.0;
        for (int i = 0; i < V; i++) sum += exp_r(z[i] - mx);
        real inv = (real)(1.0 / sum);
        for (int i = 0; i < V; i++) z[i] = exp_r(z[i] - mx) * inv * dloss;
        z[targets[n]] -= dloss;
    }
}

// ----------------------------------------------------------------------------
// The model: forward, backward

static SeqShape seq_shape(const Model *m, int B, int T, int stride) {
    SeqShape s = {B, T, m->cfg.n_head, fox_head_dim(&m->cfg), stride, m->tokens, m->doc_sep};
    return s;
}

// Whether attention takes a bias c: a forget gate, or the document mask's boundary terms (docs/model.md §1.8).
static int model_has_c(const Model *m) { return m->cfg.forget_gate != FOX_FG_NONE || m->doc_sep >= 0; }

// Element offset of layer l's slice of an (L, B·T, per_token) activation.
static size_t layer_offset(int l, size_t per_token, int B, int T) {
    return (size_t)l * (size_t)B * T * per_token;
}

// Block l's slices of the attention activations.
typedef struct { real *x, *xn1, *proj, *ks, *v, *q, *k; creal *c; real *lse, *o, *on, *z; } AttnLayer;

static AttnLayer attn_layer(Model *m, int l, int B, int T) {
    Acts *a = &m->a;
    size_t D = (size_t)m->cfg.d_model, H = (size_t)m->cfg.n_head, NIN = (size_t)m->cols.width;
    AttnLayer al = {a->resid + layer_offset(l, D, B, T), a->xn1 + layer_offset(l, D, B, T), a->proj + layer_offset(l, NIN, B, T),
                    a->ks + layer_offset(l, D, B, T), a->v + layer_offset(l, D, B, T), a->q + layer_offset(l, D, B, T),
                    a->k + layer_offset(l, D, B, T), a->c + layer_offset(l, H, B, T), a->lse + layer_offset(l, H, B, T),
                    a->o + layer_offset(l, D, B, T), a->on + layer_offset(l, D, B, T), a->z + layer_offset(l, D, B, T)};
    return al;
}

// ACP's U for head h of block l from its QK-norm weights (fox/acp.h).
static double acp_bound_qknorm_head(Model *m, int l, int h) {
    int Dh = fox_head_dim(&m->cfg), wstride = m->cfg.qk_norm_shared ? 0 : Dh;
    const real *gq = param(m, FOX_P_qnorm_w, l) + h * wstride, *gk = param(m, FOX_P_knorm_w, l) + h * wstride;
    double mq = 0.0, mk = 0.0;
    for (int i = 0; i < Dh; i++) {
        mq = fmax(mq, fabs((double)gq[i]));
        mk = fmax(mk, fabs((double)gk[i]));
    }
    return fox_acp_bound_qknorm(mq, mk, Dh);
}

// The first live key block of query block mb for (b, h) by the ACP threshold (fox/acp.h): U from the
// QK-norm weights, else from the largest q and k norms of the sequence.
static double acp_threshold_bh(Model *m, int l, int b, int h, const real *q, const real *k, SeqShape s) {
    const FoxConfig *cfg = &m->cfg;
    int D = s.H * s.Dh;
    double mq = 0.0, mk = 0.0, U;
    if (cfg->qk_norm) {
        U = acp_bound_qknorm_head(m, l, h);
    } else {
        for (int t = 0; t < s.T; t++) {
            size_t r = ((size_t)b * s.T + t) * D + (size_t)h * s.Dh;
            double q2 = 0.0, k2 = 0.0;
            for (int i = 0; i < s.Dh; i++) {
                q2 += (double)q[r + i] * q[r + i];
                k2 += (double)k[r + i] * k[r + i];
            }
            mq = fmax(mq, q2);
            mk = fmax(mk, k2);
        }
        U = fox_acp_bound_norms(mq, mk, s.Dh);
    }
    return fox_acp_threshold(U, s.T);
}

// Block l's ACP staircase (into m->acp_kv_first), or NULL when ACP is off or attention has no bias. A query
// block's first live key block is the larger of the threshold's (forget-gate presets) and the first block
// of its first row's document (document mask: the blocks before are dead by construction, docs/model.md
// §1.8). count: add each head's live tiles to m->acp_live[l·H + h] (the forward pass).
static const int *acp_tables(Model *m, int l, const creal *gate_c, const real *q, const real *k, SeqShape s, int count) {
    if (!m->acp || !model_has_c(m)) return NULL;
    int nblk = fox_acp_blocks(s.T), gated = m->cfg.forget_gate != FOX_FG_NONE;
    #pragma omp parallel for if(threads_pay((double)s.B * s.H * s.T * s.Dh)) collapse(2)
    for (int b = 0; b < s.B; b++) {
        for (int h = 0; h < s.H; h++) {
            double delta = gated ? acp_threshold_bh(m, l, b, h, q, k, s) : 0.0;
            const creal *ch = gate_c + ((size_t)b * s.H + h) * s.T;
            int *kf = m->acp_kv_first + ((size_t)b * s.H + h) * nblk, prev = 0;
            for (int mb = 0; mb < nblk; mb++) {  // (the running max keeps the staircase monotone)
                int f = gated ? fox_acp_first_live(ch, s.T, mb, delta) : 0;
                if (s.sep >= 0 && m->doc_first[(size_t)b * nblk + mb] > f) f = m->doc_first[(size_t)b * nblk + mb];
                prev = f > prev ? f : prev;
                kf[mb] = prev;
            }
        }
    }
    if (count) {
        for (int b = 0; b < s.B; b++)
            for (int h = 0; h < s.H; h++)
                m->acp_live[(size_t)l * s.H + h] += fox_acp_live_tiles(m->acp_kv_first + ((size_t)b * s.H + h) * nblk, nblk);
        m->acp_tiles = (long long)s.B * fox_acp_tiles(s.T);
    }
    return m->acp_kv_first;
}

// FoX eq. 21-23 (docs/model.md §1): the output-normed attention on (per-head RMSNorm, or o itself) and
// the gated z = on ⊙ σ(W_g x) (or on itself), for N rows; proj holds the gate logits.
static void attention_output(Model *m, int l, real *z, real *on, real *on_rstd, const real *o, const real *proj, int N) {
    const FoxConfig *cfg = &m->cfg;
    int D = cfg->d_model, H = cfg->n_head, Dh = fox_head_dim(cfg);
    if (cfg->output_norm) {
        NormShape os = {N, H, Dh, D, D, Dh, FOX_NORM_EPS};
        rmsnorm_forward(on, on_rstd, o, param(m, FOX_P_onorm_w, l), os);
    } else {
        memcpy(on, o, (size_t)N * D * sizeof(real));
    }
    if (cfg->output_gate) output_gate_forward(z, on, proj, m->cols.gate, N, D, m->cols.width);
    else memcpy(z, on, (size_t)N * D * sizeof(real));
}

// Block l's attention inputs from resid[l] (FoX eq. 14-20): xn, proj, the shifted keys and values, q and k
// after QK-norm and RoPE, and c.
static void attention_inputs_forward(Model *m, int l, int B, int T) {
    const FoxConfig *cfg = &m->cfg;
    Acts *a = &m->a;
    int N = B * T, D = cfg->d_model, H = cfg->n_head, Dh = fox_head_dim(cfg), NIN = m->cols.width;
    AttnCols cols = m->cols;
    SeqShape s = seq_shape(m, B, T, NIN);
    AttnLayer al = attn_layer(m, l, B, T);
    real *x = al.x, *xn = al.xn1, *proj = al.proj, *ks = al.ks, *v = al.v, *q = al.q, *k = al.k;

    NormShape ln = {N, 1, D, D, D, D, FOX_NORM_EPS};
    rmsnorm_forward(xn, a->ln1_rstd + layer_offset(l, 1, B, T), x, param(m, FOX_P_ln1_w, l), ln);
    matmul_forward(proj, xn, param(m, FOX_P_attn_in_w, l), N, D, NIN);
    if (cfg->kv_shift) {
        kv_shift_forward(ks, proj, cols.k, cols.k_shift, s);
        kv_shift_forward(v, proj, cols.v, cols.v_shift, s);
    } else {
        copy_columns(ks, proj, cols.k, N, D, NIN);
        copy_columns(v, proj, cols.v, N, D, NIN);
    }
    if (cfg->qk_norm) {
        int wstride = cfg->qk_norm_shared ? 0 : Dh;
        NormShape qs = {N, H, Dh, NIN, D, wstride, FOX_QK_NORM_EPS}, kshape = {N, H, Dh, D, D, wstride, FOX_QK_NORM_EPS};
        rmsnorm_forward(q, a->q_rstd + layer_offset(l, H, B, T), proj + cols.q, param(m, FOX_P_qnorm_w, l), qs);
        rmsnorm_forward(k, a->k_rstd + layer_offset(l, H, B, T), ks, param(m, FOX_P_knorm_w, l), kshape);
    } else {
        copy_columns(q, proj, cols.q, N, D, NIN);
        memcpy(k, ks, (size_t)N * D * sizeof(real));
    }
    if (cfg->rope) {
        rope_apply(q, s, cfg->rope_theta, 0, 0);
        rope_apply(k, s, cfg->rope_theta, 0, 0);
    }
    if (model_has_c(m)) forget_gate_forward(al.c, proj, param(m, FOX_P_fgate_b, l), cols.fgate, cfg->forget_gate, s);
}

// Block l's attention output from o (FoX eq. 21-23): mid[l] = resid[l] + W_o z.
static void attention_output_forward(Model *m, int l, int B, int T) {
    const FoxConfig *cfg = &m->cfg;
    int N = B * T, D = cfg->d_model;
    AttnLayer al = attn_layer(m, l, B, T);
    attention_output(m, l, al.z, al.on, m->a.on_rstd + layer_offset(l, cfg->n_head, B, T), al.o, al.proj, N);
    real *y = m->s.dz;  // scratch: the projection, before the residual add
    matmul_forward(y, al.z, param(m, FOX_P_attn_out_w, l), N, D, D);
    residual_add(m->a.mid + layer_offset(l, D, B, T), al.x, y, (size_t)N * D);
}

// Forward of block l's attention: resid[l] → mid[l].
static void attention_block_forward(Model *m, int l, int B, int T) {
    SeqShape s = seq_shape(m, B, T, m->cols.width);
    AttnLayer al = attn_layer(m, l, B, T);
    attention_inputs_forward(m, l, B, T);
    attention_forward(al.o, al.lse, al.q, al.k, al.v, model_has_c(m) ? al.c : NULL, acp_tables(m, l, al.c, al.q, al.k, s, 1), s);
    attention_output_forward(m, l, B, T);
}

// Block l's GSA state slices: S, U (B, G, gsa_chunks(T), m, dh) and P (B, G, T, m).
typedef struct { real *S, *U, *P; } GsaLayer;

static GsaLayer gsa_layer(Model *m, int l, int B, int T) {
    if (B > m->B || T > m->T) fox_fatal("GSA batch %dx%d exceeds the allocated %dx%d", B, T, m->B, m->T);
    size_t D = (size_t)m->cfg.d_model, slots = (size_t)m->cfg.gsa_slots, G = (size_t)m->cfg.gsa_heads;
    size_t kept = (size_t)l * B * gsa_chunks(T) * slots * D;
    GsaLayer gl = {m->a.gsa_S + kept, m->a.gsa_U + kept, m->a.gsa_p + layer_offset(l, G * slots, B, T)};
    return gl;
}

// GSA paper eq. 8: the Swish features q, k, v (N, D) of N rows of proj.
static void gsa_features(const Model *m, real *q, real *k, real *v, const real *proj, int N) {
    int D = m->cfg.d_model, NIN = m->cols.width;
    const int cols[3] = {m->cols.q, m->cols.k, m->cols.v};
    real *feat[3] = {q, k, v};
    #pragma omp parallel for if(threads_pay(WORK_TRANSC * N * 3 * D)) collapse(2)
    for (int n = 0; n < N; n++)
        for (int i = 0; i < 3 * D; i++) feat[i / D][(size_t)n * D + i % D] = swish_r(proj[(size_t)n * NIN + cols[i / D] + i % D]);
}

// GSA paper eq. 9 with the residual: out = x + W_o RMSNorm(Swish(o)) over all D, keeping on = Swish(o), z and
// rstd for the backward; y is scratch.
static void gsa_output(Model *m, int l, real *out, const real *x, real *z, real *on, real *rstd, const real *o, real *y,
                       int N) {
    int D = m->cfg.d_model;
    for (size_t i = 0; i < (size_t)N * D; i++) on[i] = swish_r(o[i]);
    NormShape ln = {N, 1, D, D, D, D, FOX_NORM_EPS};
    rmsnorm_forward(z, rstd, on, param(m, FOX_P_onorm_w, l), ln);
    matmul_forward(y, z, param(m, FOX_P_attn_out_w, l), N, D, D);
    residual_add(out, x, y, (size_t)N * D);
}

// Forward of block l's Gated Slot Attention (GSA paper eq. 8-9): resid[l] → mid[l]. q, k, v hold the Swish
// features, o the slots' read, on = Swish(o), z = RMSNorm(on) over all D (the input of attn_out_w).
static void gsa_block_forward(Model *m, int l, int B, int T) {
    const FoxConfig *cfg = &m->cfg;
    Acts *a = &m->a;
    int N = B * T, D = cfg->d_model, NIN = m->cols.width;
    AttnLayer al = attn_layer(m, l, B, T);
    GsaLayer gl = gsa_layer(m, l, B, T);
    NormShape ln = {N, 1, D, D, D, D, FOX_NORM_EPS};
    rmsnorm_forward(al.xn1, a->ln1_rstd + layer_offset(l, 1, B, T), al.x, param(m, FOX_P_ln1_w, l), ln);
    matmul_forward(al.proj, al.xn1, param(m, FOX_P_attn_in_w, l), N, D, NIN);
    gsa_features(m, al.q, al.k, al.v, al.proj, N);
    gsa_forward(al.o, gl.S, gl.U, gl.P, NULL, NULL, al.q, al.k, al.v, al.proj, gsa_shape(m, B, T));
    gsa_output(m, l, a->mid + layer_offset(l, D, B, T), al.x, al.z, al.on, a->on_rstd + layer_offset(l, cfg->n_head, B, T),
               al.o, m->s.dz, N);
}

// Block l's SwiGLU MLP on N rows with the residual: out = x + W_down (silu(a) ⊙ b), [a | b] = W_up RMSNorm(x).
// xn, rstd, u, h keep the intermediates; y is scratch.
static void mlp_forward(Model *m, int l, real *out, const real *x, real *xn, real *rstd, real *u, real *h, real *y, int N) {
    int D = m->cfg.d_model, I = m->cfg.mlp_hidden;
    NormShape ln = {N, 1, D, D, D, D, FOX_NORM_EPS};
    rmsnorm_forward(xn, rstd, x, param(m, FOX_P_ln2_w, l), ln);
    matmul_forward(u, xn, param(m, FOX_P_mlp_in_w, l), N, D, 2 * I);
    swiglu_forward(h, u, N, I);
    matmul_forward(y, h, param(m, FOX_P_mlp_out_w, l), N, I, D);
    residual_add(out, x, y, (size_t)N * D);
}

// Forward of block l's MLP: mid[l] → resid[l+1].
static void mlp_block_forward(Model *m, int l, int B, int T) {
    Acts *a = &m->a;
    size_t D = (size_t)m->cfg.d_model, I = (size_t)m->cfg.mlp_hidden;
    mlp_forward(m, l, a->resid + layer_offset(l + 1, D, B, T), a->mid + layer_offset(l, D, B, T),
                a->xn2 + layer_offset(l, D, B, T), a->ln2_rstd + layer_offset(l, 1, B, T),
                a->mlp_u + layer_offset(l, 2 * I, B, T), a->mlp_h + layer_offset(l, I, B, T), m->s.dxn, B * T);
}

// ----------------------------------------------------------------------------
// TransformerFAM (docs/model.md §1.10; FAM paper Algorithm 2). Per layer, the sequence in blocks of K tokens;
// block τ's queries attend to the memory F_τ (M rows), then to the W blocks before it and to their own block
// causally; F_{τ+1} is F_τ's rows attending to F_τ and to block τ, through the layer's attention output and MLP.
// F_0 is the prompt (fam_init, passed through the layers below).

// The rows of memory state τ of layer l: B sequences of M rows.
static FamRows fam_state(Model *m, int l, int tau, int B, int T) {
    if (B > m->B || T > m->T) fox_fatal("FAM batch %dx%d exceeds the allocated %dx%d", B, T, m->B, m->T);
    FamShape fs = fam_shape(&m->cfg, T);
    return fam_rows_at(m, &m->a.fam, ((size_t)l * fs.nS + tau) * B * fs.M);
}

// The prompt's rows entering layer l (M rows).
static FamRows fam_prompt(Model *m, int l) { return fam_rows_at(m, &m->a.famp, (size_t)l * m->cfg.fam_memory); }

// The memory rows' attention inputs (FAM paper B.1: they pass through the layer as tokens do): RMSNorm, attn_in_w,
// q and k through QK-norm and RoPE at positions pos0 + (row mod M), v; no KV-shift and no forget gate of their own
// (docs/model.md §1.10). R rows, a multiple of M.
static void fam_project(Model *m, int l, FamRows f, int R, int pos0) {
    const FoxConfig *cfg = &m->cfg;
    int D = cfg->d_model, H = cfg->n_head, Dh = fox_head_dim(cfg), NIN = m->cols.width, M = cfg->fam_memory;
    NormShape ln = {R, 1, D, D, D, D, FOX_NORM_EPS};
    rmsnorm_forward(f.xn1, f.ln1_rstd, f.x, param(m, FOX_P_ln1_w, l), ln);
    matmul_forward(f.proj, f.xn1, param(m, FOX_P_attn_in_w, l), R, D, NIN);
    if (cfg->qk_norm) {
        NormShape qs = {R, H, Dh, NIN, D, cfg->qk_norm_shared ? 0 : Dh, FOX_QK_NORM_EPS};
        rmsnorm_forward(f.q, f.q_rstd, f.proj + m->cols.q, param(m, FOX_P_qnorm_w, l), qs);
        rmsnorm_forward(f.k, f.k_rstd, f.proj + m->cols.k, param(m, FOX_P_knorm_w, l), qs);
    } else {
        copy_columns(f.q, f.proj, m->cols.q, R, D, NIN);
        copy_columns(f.k, f.proj, m->cols.k, R, D, NIN);
    }
    copy_columns(f.v, f.proj, m->cols.v, R, D, NIN);
    if (cfg->rope) {
        SeqShape s = {R / M, M, H, Dh, NIN, NULL, -1};
        rope_apply(f.q, s, cfg->rope_theta, 0, pos0);
        rope_apply(f.k, s, cfg->rope_theta, 0, pos0);
    }
}

// The memory rows' update after their attention (f.o): the output norm and gate, W_o, the residual (none for
// the first update of the initial memory, which carries no context: FAM paper B.1), then the layer's MLP; the
// new rows into out. y: scratch of R rows.
static void fam_update(Model *m, int l, FamRows f, real *out, int R, int residual, real *y) {
    int D = m->cfg.d_model;
    attention_output(m, l, f.z, f.on, f.on_rstd, f.o, f.proj, R);
    matmul_forward(y, f.z, param(m, FOX_P_attn_out_w, l), R, D, D);
    if (residual) residual_add(f.mid, f.x, y, (size_t)R * D);
    else memcpy(f.mid, y, (size_t)R * D * sizeof(real));
    mlp_forward(m, l, out, f.mid, f.xn2, f.ln2_rstd, f.u, f.h, y, R);
}

// The prompt at layer l (FAM paper B.1, prompt tuning): the learned initial memory enters layer 0 as token
// embeddings would; its rows attend to each other alone (positions -M..-1, no bias) and leave the layer through
// its residuals and MLP as the rows entering layer l + 1, which are that layer's F_0.
static void fam_prompt_forward(Model *m, int l) {
    const FoxConfig *cfg = &m->cfg;
    int M = cfg->fam_memory, D = cfg->d_model, H = cfg->n_head, Dh = fox_head_dim(cfg);
    FamRows p = fam_prompt(m, l);
    fam_project(m, l, p, M, -M);
    FamBlock none = {NULL, NULL, NULL, NULL, 0, NULL, NULL, 0, 0};
    #pragma omp parallel for if(threads_pay(2.0 * M * M * D))
    for (int h = 0; h < H; h++) {
        size_t hd = (size_t)h * Dh;
        fam_attend_head(p.o + hd, p.lse + h, p.q + hd, p.k + hd, p.v + hd, none, M, D, H, Dh);
    }
    fam_update(m, l, p, fam_prompt(m, l + 1).x, M, 1, m->fs.y);
}

// Block τ of sequence b, head h, as a memory update reads it from the tokens' k, v (N, D) and c (B, H, T).
static FamBlock fam_block_of(const real *k, const real *v, real *dk, real *dv, const creal *c, real *dc, int b, int h,
                             int tau, int K, int H, int Dh, int T) {
    size_t row0 = (size_t)b * T * H * Dh + (size_t)h * Dh, bh = ((size_t)b * H + h) * T;
    FamBlock blk = {k + row0, v + row0, dk ? dk + row0 : NULL, dv ? dv + row0 : NULL, (size_t)H * Dh,
                    c ? c + bh : NULL, dc ? dc + bh : NULL, tau * K, tau * K + K};
    return blk;
}

// Layer l's memory states: F_0 = the prompt's rows entering layer l, for every sequence; for each block τ, F_τ's
// attention inputs (positions τK − M + i: the last M of the block it summarises) and, when the block is
// complete, the update F_{τ+1}. k, v, c: the tokens' keys, values and c (NULL: no bias).
static void fam_memory_forward(Model *m, int l, int B, int T, const real *k, const real *v, const creal *c) {
    const FoxConfig *cfg = &m->cfg;
    FamShape fs = fam_shape(cfg, T);
    int D = cfg->d_model, H = cfg->n_head, Dh = fox_head_dim(cfg), R = B * fs.M;
    const real *prompt = fam_prompt(m, l).x;
    for (int tau = 0; tau < fs.nb; tau++) {
        FamRows f = fam_state(m, l, tau, B, T);
        if (!tau)
            for (int b = 0; b < B; b++) memcpy(f.x + (size_t)b * fs.M * D, prompt, (size_t)fs.M * D * sizeof(real));
        fam_project(m, l, f, R, tau * fs.K - fs.M);
        if (tau >= fs.nfull) continue;  // a partial last block (a generation's prompt) updates nothing
        #pragma omp parallel for if(threads_pay(2.0 * B * fs.M * (fs.M + fs.K) * D)) collapse(2)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < H; h++) {
                size_t fr = (size_t)b * fs.M * D + (size_t)h * Dh;
                FamBlock blk = fam_block_of(k, v, NULL, NULL, c, NULL, b, h, tau, fs.K, H, Dh, T);
                fam_attend_head(f.o + fr, f.lse + (size_t)b * fs.M * H + h, f.q + fr, f.k + fr, f.v + fr, blk, fs.M, D, H, Dh);
            }
        }
        fam_update(m, l, f, fam_state(m, l, tau + 1, B, T).x, R, tau > 0, m->fs.y);
    }
}

// The window of query position i (docs/model.md §1.10): from the first token of block ⌊i/K⌋ − W on.
static int fam_window_start(int i, int K, int W) {
    int first = (i / K - W) * K;
    return first > 0 ? first : 0;
}

// The tokens' attention (FAM paper eq. 1 with the memory): query i of block τ attends to F_τ's M keys (bias
// c_i − c at the token before the block), then to the window's tokens up to itself (bias c_i − c_j).
static void fam_token_attention(Model *m, int l, real *o, real *lse, const real *q, const real *k, const real *v,
                                const creal *c, int B, int T) {
    const FoxConfig *cfg = &m->cfg;
    FamShape fs = fam_shape(cfg, T);
    int D = cfg->d_model, H = cfg->n_head, Dh = fox_head_dim(cfg);
    FamRows f0 = fam_state(m, l, 0, B, T);
    size_t state = (size_t)B * fs.M * D;
    #pragma omp parallel for if(threads_pay(2.0 * B * T * (fs.M + (fs.W + 1) * fs.K) * D)) collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            size_t bh = ((size_t)b * H + h) * T, row0 = (size_t)b * T * D + (size_t)h * Dh;
            size_t fr = (size_t)b * fs.M * D + (size_t)h * Dh;
            const creal *ch = c ? c + bh : NULL;
            for (int i = 0; i < T; i++) {
                int tau = i / fs.K;
                size_t ri = row0 + (size_t)i * D, fm = (size_t)tau * state + fr;
                creal ci = ch ? ch[i] : 0.0, cm = ch && tau ? ch[tau * fs.K - 1] : 0.0;
                Softmax sm = attend_start(o + ri, Dh);
                attend_keys(o + ri, &sm, q + ri, f0.k + fm, f0.v + fm, (size_t)D, NULL, 0.0, (real)(ci - cm), 0, fs.M - 1, Dh);
                attend_keys(o + ri, &sm, q + ri, k + row0, v + row0, (size_t)D, ch, ci, 0.0f, fam_window_start(i, fs.K, fs.W), i, Dh);
                lse[bh + i] = attend_finish(o + ri, sm, Dh);
            }
        }
    }
}

// Forward of block l as TransformerFAM: resid[l] → mid[l], the memory states of layer l, and the prompt's rows
// entering layer l + 1.
static void fam_block_forward(Model *m, int l, int B, int T) {
    AttnLayer al = attn_layer(m, l, B, T);
    const creal *c = model_has_c(m) ? al.c : NULL;
    attention_inputs_forward(m, l, B, T);
    if (fox_fam_has_memory(&m->cfg)) {
        if (l < m->cfg.n_layer - 1) fam_prompt_forward(m, l);
        fam_memory_forward(m, l, B, T, al.k, al.v, c);
    }
    fam_token_attention(m, l, al.o, al.lse, al.q, al.k, al.v, c, B, T);
    attention_output_forward(m, l, B, T);
}

// Full forward over B×T tokens (B, T within the allocated capacity). With targets, fills the
// per-position losses and returns their mean; without, returns 0 and leaves the logits.
static double model_forward(Model *m, const int *inputs, const int *targets, int B, int T) {
    if (B * T > m->B * m->T) fox_fatal("batch %dx%d exceeds the allocated %dx%d", B, T, m->B, m->T);
    threads_watch();
    const FoxConfig *cfg = &m->cfg;
    Acts *a = &m->a;
    int N = B * T, D = cfg->d_model, V = cfg->vocab_size, L = cfg->n_layer;
    memset(m->acp_live, 0, (size_t)L * cfg->n_head * sizeof(long long));
    m->acp_tiles = 0;
    memcpy(m->tokens, inputs, (size_t)N * sizeof(int));
    if (m->doc_sep >= 0 && m->acp) fox_doc_first_blocks(m->doc_first, inputs, B, T, m->doc_sep);  // ACP's dead blocks
    embedding_forward(a->resid, inputs, param(m, FOX_P_wte, 0), N, D);
    if (cfg->arch == FOX_ARCH_FAM)  // the prompt enters the first layer (FAM paper B.1)
        memcpy(fam_prompt(m, 0).x, param(m, FOX_P_fam_init, 0), (size_t)cfg->fam_memory * D * sizeof(real));
    for (int l = 0; l < L; l++) {
        if (cfg->arch == FOX_ARCH_GSA) gsa_block_forward(m, l, B, T);
        else if (cfg->arch == FOX_ARCH_FAM) fam_block_forward(m, l, B, T);
        else attention_block_forward(m, l, B, T);
        mlp_block_forward(m, l, B, T);
    }
    NormShape ln = {N, 1, D, D, D, D, FOX_NORM_EPS};
    rmsnorm_forward(a->xnf, a->lnf_rstd, a->resid + layer_offset(L, D, B, T), param(m, FOX_P_lnf_w, 0), ln);
    matmul_forward(a->logits, a->xnf, param(m, FOX_P_lm_head_w, 0), N, D, V);
    return targets ? crossentropy_forward(a->losses, a->logits, targets, N, V) : 0.0;
}

static void zero(real *p, size_t n) { memset(p, 0, n * sizeof(real)); }

// Backward of mlp_forward on N rows: dres holds dL/d out on entry, dL/d x on exit; dh, du, dxn: scratch.
static void mlp_backward(Model *m, int l, real *dres, const real *x, const real *xn, const real *rstd, const real *u,
                         const real *h, real *dh, real *du, real *dxn, int N) {
    int D = m->cfg.d_model, I = m->cfg.mlp_hidden;
    zero(dh, (size_t)N * I);
    zero(du, (size_t)N * 2 * I);
    zero(dxn, (size_t)N * D);
    matmul_backward(dh, grad(m, FOX_P_mlp_out_w, l), dres, h, param(m, FOX_P_mlp_out_w, l), N, I, D);
    swiglu_backward(du, dh, u, N, I);
    matmul_backward(dxn, grad(m, FOX_P_mlp_in_w, l), du, xn, param(m, FOX_P_mlp_in_w, l), N, D, 2 * I);
    NormShape ln = {N, 1, D, D, D, D, FOX_NORM_EPS};
    rmsnorm_backward(dres, grad(m, FOX_P_ln2_w, l), dxn, x, rstd, param(m, FOX_P_ln2_w, l), ln);
}

// Backward of block l's MLP: d.dres holds dL/d resid[l+1] on entry, dL/d mid[l] on exit.
static void mlp_block_backward(Model *m, int l, int B, int T) {
    Acts *a = &m->a;
    Scratch *g = &m->s;
    size_t D = (size_t)m->cfg.d_model, I = (size_t)m->cfg.mlp_hidden;
    mlp_backward(m, l, g->dres, a->mid + layer_offset(l, D, B, T), a->xn2 + layer_offset(l, D, B, T),
                 a->ln2_rstd + layer_offset(l, 1, B, T), a->mlp_u + layer_offset(l, 2 * I, B, T),
                 a->mlp_h + layer_offset(l, I, B, T), g->dh, g->du, g->dxn, B * T);
}

// Backward of block l's GSA: d.dres holds dL/d mid[l] on entry, dL/d resid[l] on exit.
static void gsa_block_backward(Model *m, int l, int B, int T) {
    const FoxConfig *cfg = &m->cfg;
    Acts *a = &m->a;
    Scratch *g = &m->s;
    int N = B * T, D = cfg->d_model, NIN = m->cols.width;
    AttnLayer al = attn_layer(m, l, B, T);
    GsaLayer gl = gsa_layer(m, l, B, T);
    zero(g->dz, (size_t)N * D);
    zero(g->don, (size_t)N * D);
    zero(g->dproj, (size_t)N * NIN);
    zero(g->dxn, (size_t)N * D);
    NormShape ln = {N, 1, D, D, D, D, FOX_NORM_EPS};
    matmul_backward(g->dz, grad(m, FOX_P_attn_out_w, l), g->dres, al.z, param(m, FOX_P_attn_out_w, l), N, D, D);
    rmsnorm_backward(g->don, grad(m, FOX_P_onorm_w, l), g->dz, al.on, a->on_rstd + layer_offset(l, cfg->n_head, B, T),
                     param(m, FOX_P_onorm_w, l), ln);
    for (size_t i = 0; i < (size_t)N * D; i++) g->d_o[i] = g->don[i] * swish_grad_r(al.o[i]);
    gsa_backward(g->dq, g->dk, g->dv, g->dproj, g->d_o, al.q, al.k, al.v, al.proj, gl.S, gl.U, gl.P, gsa_shape(m, B, T));
    const int cols[3] = {m->cols.q, m->cols.k, m->cols.v};
    const real *dfeat[3] = {g->dq, g->dk, g->dv};
    #pragma omp parallel for if(threads_pay(WORK_TRANSC * N * 3 * D)) collapse(2)
    for (int n = 0; n < N; n++)
        for (int i = 0; i < 3 * D; i++) {
            size_t col = (size_t)n * NIN + cols[i / D] + i % D;
            g->dproj[col] = dfeat[i / D][(size_t)n * D + i % D] * swish_grad_r(al.proj[col]);
        }
    matmul_backward(g->dxn, grad(m, FOX_P_attn_in_w, l), g->dproj, al.xn1, param(m, FOX_P_attn_in_w, l), N, D, NIN);
    rmsnorm_backward(g->dres, grad(m, FOX_P_ln1_w, l), g->dxn, al.x, a->ln1_rstd + layer_offset(l, 1, B, T),
                     param(m, FOX_P_ln1_w, l), ln);
}

// Backward of attention_output and W_o on N rows: dy = dL/d(W_o z) → d_o = dL/d o; the output gate's logit
// gradients into dproj (at column cols.gate). dz, don: scratch; dz, don and d_o are overwritten.
static void attention_output_backward(Model *m, int l, real *d_o, real *don, real *dz, real *dproj, const real *dy,
                                      const real *z, const real *on, const real *on_rstd, const real *o,
                                      const real *proj, int N) {
    const FoxConfig *cfg = &m->cfg;
    int D = cfg->d_model, H = cfg->n_head, Dh = fox_head_dim(cfg), NIN = m->cols.width;
    zero(dz, (size_t)N * D);
    zero(don, (size_t)N * D);
    zero(d_o, (size_t)N * D);
    matmul_backward(dz, grad(m, FOX_P_attn_out_w, l), dy, z, param(m, FOX_P_attn_out_w, l), N, D, D);
    if (cfg->output_gate) output_gate_backward(don, dproj, dz, on, proj, m->cols.gate, N, D, NIN);
    else memcpy(don, dz, (size_t)N * D * sizeof(real));
    if (cfg->output_norm) {
        NormShape os = {N, H, Dh, D, D, Dh, FOX_NORM_EPS};
        rmsnorm_backward(d_o, grad(m, FOX_P_onorm_w, l), don, o, on_rstd, param(m, FOX_P_onorm_w, l), os);
    } else {
        memcpy(d_o, don, (size_t)N * D * sizeof(real));
    }
}

// The first part of block l's attention backward: every gradient scratch zeroed, then d.dres = dL/d mid[l]
// back through W_o and the output norm and gate into d_o (and the gate's columns of dproj).
static void attention_output_block_backward(Model *m, int l, int B, int T) {
    const FoxConfig *cfg = &m->cfg;
    Scratch *g = &m->s;
    int N = B * T, D = cfg->d_model, H = cfg->n_head, NIN = m->cols.width;
    AttnLayer al = attn_layer(m, l, B, T);
    zero(g->dproj, (size_t)N * NIN);
    zero(g->dq, (size_t)N * D);
    zero(g->dk, (size_t)N * D);
    zero(g->dks, (size_t)N * D);
    zero(g->dv, (size_t)N * D);
    zero(g->dc, (size_t)N * H);
    zero(g->dxn, (size_t)N * D);
    attention_output_backward(m, l, g->d_o, g->don, g->dz, g->dproj, g->dres, al.z, al.on,
                              m->a.on_rstd + layer_offset(l, H, B, T), al.o, al.proj, N);
}

// The last part of block l's attention backward, from dq, dk, dv and dc (the forget gate's c): through the
// gate, RoPE, QK-norm, KV-shift, attn_in_w and the norm into d.dres = dL/d resid[l] (the residual's term
// included).
static void attention_inputs_backward(Model *m, int l, int B, int T) {
    const FoxConfig *cfg = &m->cfg;
    Acts *a = &m->a;
    Scratch *g = &m->s;
    int N = B * T, D = cfg->d_model, H = cfg->n_head, Dh = fox_head_dim(cfg), NIN = m->cols.width;
    AttnCols cols = m->cols;
    SeqShape s = seq_shape(m, B, T, NIN);
    AttnLayer al = attn_layer(m, l, B, T);
    real *x = al.x, *xn = al.xn1, *proj = al.proj, *ks = al.ks;
    if (cfg->forget_gate != FOX_FG_NONE)
        forget_gate_backward(g->dproj, grad(m, FOX_P_fgate_b, l), g->dc, proj, param(m, FOX_P_fgate_b, l),
                             cols.fgate, cfg->forget_gate, s);
    if (cfg->rope) {
        rope_apply(g->dq, s, cfg->rope_theta, 1, 0);
        rope_apply(g->dk, s, cfg->rope_theta, 1, 0);
    }
    if (cfg->qk_norm) {
        int wstride = cfg->qk_norm_shared ? 0 : Dh;
        NormShape qs = {N, H, Dh, NIN, D, wstride, FOX_QK_NORM_EPS}, kshape = {N, H, Dh, D, D, wstride, FOX_QK_NORM_EPS};
        rmsnorm_backward(g->dproj + cols.q, grad(m, FOX_P_qnorm_w, l), g->dq, proj + cols.q,
                         a->q_rstd + layer_offset(l, H, B, T), param(m, FOX_P_qnorm_w, l), qs);
        rmsnorm_backward(g->dks, grad(m, FOX_P_knorm_w, l), g->dk, ks, a->k_rstd + layer_offset(l, H, B, T),
                         param(m, FOX_P_knorm_w, l), kshape);
    } else {
        add_columns(g->dproj, g->dq, cols.q, N, D, NIN);
        memcpy(g->dks, g->dk, (size_t)N * D * sizeof(real));
    }
    if (cfg->kv_shift) {
        kv_shift_backward(g->dproj, g->dks, proj, cols.k, cols.k_shift, s);
        kv_shift_backward(g->dproj, g->dv, proj, cols.v, cols.v_shift, s);
    } else {
        add_columns(g->dproj, g->dks, cols.k, N, D, NIN);
        add_columns(g->dproj, g->dv, cols.v, N, D, NIN);
    }
    matmul_backward(g->dxn, grad(m, FOX_P_attn_in_w, l), g->dproj, xn, param(m, FOX_P_attn_in_w, l), N, D, NIN);
    NormShape ln = {N, 1, D, D, D, D, FOX_NORM_EPS};
    rmsnorm_backward(g->dres, grad(m, FOX_P_ln1_w, l), g->dxn, x, a->ln1_rstd + layer_offset(l, 1, B, T),
                     param(m, FOX_P_ln1_w, l), ln);
}

// Backward of block l's attention: d.dres holds dL/d mid[l] on entry, dL/d resid[l] on exit.
static void attention_block_backward(Model *m, int l, int B, int T) {
    Scratch *g = &m->s;
    SeqShape s = seq_shape(m, B, T, m->cols.width);
    AttnLayer al = attn_layer(m, l, B, T);
    attention_output_block_backward(m, l, B, T);
    attention_backward(g->dq, g->dk, g->dv, m->cfg.forget_gate != FOX_FG_NONE ? g->dc : NULL, g->d_o, al.q, al.k, al.v,
                       al.o, al.lse, model_has_c(m) ? al.c : NULL, acp_tables(m, l, al.c, al.q, al.k, s, 0), s);
    attention_inputs_backward(m, l, B, T);
}

// Backward of fam_project: from the gradients of the rows' q, k (both overwritten by RoPE's inverse) and v, with
// dproj holding the gate columns' already (the update's output gate), into dx (+=). dxn: scratch.
static void fam_project_backward(Model *m, int l, FamRows f, int R, int pos0, real *dq, real *dk, const real *dv,
                                 real *dproj, real *dxn, real *dx) {
    const FoxConfig *cfg = &m->cfg;
    int D = cfg->d_model, H = cfg->n_head, Dh = fox_head_dim(cfg), NIN = m->cols.width, M = cfg->fam_memory;
    if (cfg->rope) {
        SeqShape s = {R / M, M, H, Dh, NIN, NULL, -1};
        rope_apply(dq, s, cfg->rope_theta, 1, pos0);
        rope_apply(dk, s, cfg->rope_theta, 1, pos0);
    }
    if (cfg->qk_norm) {
        NormShape qs = {R, H, Dh, NIN, D, cfg->qk_norm_shared ? 0 : Dh, FOX_QK_NORM_EPS};
        rmsnorm_backward(dproj + m->cols.q, grad(m, FOX_P_qnorm_w, l), dq, f.proj + m->cols.q, f.q_rstd,
                         param(m, FOX_P_qnorm_w, l), qs);
        rmsnorm_backward(dproj + m->cols.k, grad(m, FOX_P_knorm_w, l), dk, f.proj + m->cols.k, f.k_rstd,
                         param(m, FOX_P_knorm_w, l), qs);
    } else {
        add_columns(dproj, dq, m->cols.q, R, D, NIN);
        add_columns(dproj, dk, m->cols.k, R, D, NIN);
    }
    add_columns(dproj, dv, m->cols.v, R, D, NIN);
    zero(dxn, (size_t)R * D);
    matmul_backward(dxn, grad(m, FOX_P_attn_in_w, l), dproj, f.xn1, param(m, FOX_P_attn_in_w, l), R, D, NIN);
    NormShape ln = {R, 1, D, D, D, D, FOX_NORM_EPS};
    rmsnorm_backward(dx, grad(m, FOX_P_ln1_w, l), dxn, f.x, f.ln1_rstd, param(m, FOX_P_ln1_w, l), ln);
}

// Backward of fam_update: dout = dL/d(the new rows), overwritten; the residual's term into dx (+=) when there is
// one; the attention's output back to g->d_o, and the output gate's logit gradients into g->dproj (zeroed first).
static void fam_update_backward_rows(Model *m, int l, FamRows f, real *dout, real *dx, int R, int residual) {
    FamScratch *g = &m->fs;
    size_t n = (size_t)R * m->cfg.d_model;
    mlp_backward(m, l, dout, f.mid, f.xn2, f.ln2_rstd, f.u, f.h, g->dh, g->du, g->dxn, R);
    if (residual)
        for (size_t i = 0; i < n; i++) dx[i] += dout[i];
    zero(g->dproj, (size_t)R * m->cols.width);
    attention_output_backward(m, l, g->d_o, g->don, g->dz, g->dproj, dout, f.z, f.on, f.on_rstd, f.o, f.proj, R);
}

// Backward of fam_token_attention: dq, dk, dv and (with a forget gate) dc of the tokens, and the gradients of
// each memory state's keys and values (m->fs.dk, dv, zeroed by the caller).
static void fam_token_attention_backward(Model *m, int l, real *dq, real *dk, real *dv, real *dc, const real *dout,
                                         const real *q, const real *k, const real *v, const real *o, const real *lse,
                                         const creal *c, int B, int T) {
    const FoxConfig *cfg = &m->cfg;
    FamShape fs = fam_shape(cfg, T);
    int D = cfg->d_model, H = cfg->n_head, Dh = fox_head_dim(cfg);
    FamRows f0 = fam_state(m, l, 0, B, T);
    FamScratch *g = &m->fs;
    size_t state = (size_t)B * fs.M * D;
    #pragma omp parallel for if(threads_pay(4.0 * B * T * (fs.M + (fs.W + 1) * fs.K) * D)) collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            size_t bh = ((size_t)b * H + h) * T, row0 = (size_t)b * T * D + (size_t)h * Dh;
            size_t fr = (size_t)b * fs.M * D + (size_t)h * Dh;
            const creal *ch = c ? c + bh : NULL;
            real *dch = dc ? dc + bh : NULL;
            for (int i = 0; i < T; i++) {
                int tau = i / fs.K;
                size_t ri = row0 + (size_t)i * D, fm = (size_t)tau * state + fr;
                creal ci = ch ? ch[i] : 0.0, cm = ch && tau ? ch[tau * fs.K - 1] : 0.0;
                real Di = 0.0f;
                for (int d = 0; d < Dh; d++) Di += dout[ri + d] * o[ri + d];
                real s_mem = attend_keys_backward(dq + ri, g->dk + fm, g->dv + fm, NULL, q + ri, dout + ri, Di, lse[bh + i],
                                                  f0.k + fm, f0.v + fm, (size_t)D, NULL, 0.0, (real)(ci - cm), 0, fs.M - 1, Dh);
                real s_win = attend_keys_backward(dq + ri, dk + row0, dv + row0, dch, q + ri, dout + ri, Di, lse[bh + i],
                                                  k + row0, v + row0, (size_t)D, ch, ci, 0.0f, fam_window_start(i, fs.K, fs.W),
                                                  i, Dh);
                if (dch) {
                    dch[i] += s_mem + s_win;
                    if (tau) dch[tau * fs.K - 1] -= s_mem;
                }
            }
        }
    }
}

// Backward of fam_memory_forward: the states from the last down (F_{τ+1} depends on F_τ), each update's
// gradient before its rows' attention inputs'; the tokens' dk, dv and dc gain the updates' terms. The gradient
// of F_0, summed over the sequences, starts the prompt's at layer l (m->fs.dprompt[l & 1]).
static void fam_memory_backward(Model *m, int l, int B, int T, const real *k, const real *v, const creal *c, real *dk,
                                real *dv, real *dc) {
    const FoxConfig *cfg = &m->cfg;
    FamShape fs = fam_shape(cfg, T);
    FamScratch *g = &m->fs;
    int D = cfg->d_model, H = cfg->n_head, Dh = fox_head_dim(cfg), R = B * fs.M;
    size_t state = (size_t)R * D;
    for (int tau = fs.nb - 1; tau >= 0; tau--) {
        FamRows f = fam_state(m, l, tau, B, T);
        real *dx = g->dx + tau * state, *dfk = g->dk + tau * state, *dfv = g->dv + tau * state;
        zero(g->dq, state);
        if (tau + 1 < fs.nb) {  // F_{τ+1} is read by block τ + 1 (the last complete block's update, by no token)
            fam_update_backward_rows(m, l, f, dx + state, dx, R, tau > 0);
            #pragma omp parallel for if(threads_pay(4.0 * B * fs.M * (fs.M + fs.K) * D)) collapse(2)
            for (int b = 0; b < B; b++) {
                for (int h = 0; h < H; h++) {
                    size_t fr = (size_t)b * fs.M * D + (size_t)h * Dh;
                    FamBlock blk = fam_block_of(k, v, dk, dv, c, dc, b, h, tau, fs.K, H, Dh, T);
                    fam_attend_head_backward(g->dq + fr, dfk + fr, dfv + fr, g->d_o + fr, f.q + fr, f.k + fr, f.v + fr,
                                             f.o + fr, f.lse + (size_t)b * fs.M * H + h, blk, fs.M, D, H, Dh);
                }
            }
        } else {
            zero(g->dproj, (size_t)R * m->cols.width);
        }
        fam_project_backward(m, l, f, R, tau * fs.K - fs.M, g->dq, dfk, dfv, g->dproj, g->dxn, dx);
    }
    real *dp = g->dprompt[l & 1];
    zero(dp, (size_t)fs.M * D);
    for (int b = 0; b < B; b++)
        for (size_t i = 0; i < (size_t)fs.M * D; i++) dp[i] += g->dx[(size_t)b * fs.M * D + i];
}

// Backward of fam_prompt_forward: the gradient of the prompt's rows entering layer l + 1 (m->fs.dprompt[(l+1) & 1])
// into that of the rows entering layer l (m->fs.dprompt[l & 1], +=). The states' scratch is free by now.
static void fam_prompt_backward(Model *m, int l) {
    const FoxConfig *cfg = &m->cfg;
    FamScratch *g = &m->fs;
    int M = cfg->fam_memory, D = cfg->d_model, H = cfg->n_head, Dh = fox_head_dim(cfg);
    FamRows p = fam_prompt(m, l);
    fam_update_backward_rows(m, l, p, g->dprompt[(l + 1) & 1], g->dprompt[l & 1], M, 1);
    zero(g->dq, (size_t)M * D);
    zero(g->dk, (size_t)M * D);
    zero(g->dv, (size_t)M * D);
    FamBlock none = {NULL, NULL, NULL, NULL, 0, NULL, NULL, 0, 0};
    #pragma omp parallel for if(threads_pay(4.0 * M * M * D))
    for (int h = 0; h < H; h++) {
        size_t hd = (size_t)h * Dh;
        fam_attend_head_backward(g->dq + hd, g->dk + hd, g->dv + hd, g->d_o + hd, p.q + hd, p.k + hd, p.v + hd, p.o + hd,
                                 p.lse + h, none, M, D, H, Dh);
    }
    fam_project_backward(m, l, p, M, -M, g->dq, g->dk, g->dv, g->dproj, g->dxn, g->dprompt[l & 1]);
}

// Backward of block l as TransformerFAM: d.dres holds dL/d mid[l] on entry, dL/d resid[l] on exit; the prompt's
// gradient moves down to layer l.
static void fam_block_backward(Model *m, int l, int B, int T) {
    Scratch *g = &m->s;
    AttnLayer al = attn_layer(m, l, B, T);
    const creal *c = model_has_c(m) ? al.c : NULL;
    real *dc = m->cfg.forget_gate != FOX_FG_NONE ? g->dc : NULL;
    size_t states = (size_t)fam_shape(&m->cfg, T).nS * B * m->cfg.fam_memory * m->cfg.d_model;
    attention_output_block_backward(m, l, B, T);
    zero(m->fs.dx, states);
    zero(m->fs.dk, states);
    zero(m->fs.dv, states);
    fam_token_attention_backward(m, l, g->dq, g->dk, g->dv, dc, g->d_o, al.q, al.k, al.v, al.o, al.lse, c, B, T);
    if (fox_fam_has_memory(&m->cfg)) {
        fam_memory_backward(m, l, B, T, al.k, al.v, c, g->dk, g->dv, dc);
        if (l < m->cfg.n_layer - 1) fam_prompt_backward(m, l);
    }
    attention_inputs_backward(m, l, B, T);
}

// Backward of the last model_forward (with targets), adding dloss_scale·∂(mean loss)/∂θ into grads.
static void model_backward(Model *m, const int *inputs, const int *targets, int B, int T, real dloss_scale) {
    threads_watch();
    const FoxConfig *cfg = &m->cfg;
    Acts *a = &m->a;
    Scratch *g = &m->s;
    int N = B * T, D = cfg->d_model, V = cfg->vocab_size, L = cfg->n_layer;
    int count = fox_counted_targets(targets, N);
    crossentropy_backward(a->logits, targets, N, V, count ? dloss_scale / count : 0.0f);
    zero(g->dxn, (size_t)N * D);
    zero(g->dres, (size_t)N * D);
    matmul_backward(g->dxn, grad(m, FOX_P_lm_head_w, 0), a->logits, a->xnf, param(m, FOX_P_lm_head_w, 0), N, D, V);
    NormShape ln = {N, 1, D, D, D, D, FOX_NORM_EPS};
    rmsnorm_backward(g->dres, grad(m, FOX_P_lnf_w, 0), g->dxn, a->resid + layer_offset(L, D, B, T), a->lnf_rstd,
                     param(m, FOX_P_lnf_w, 0), ln);
    for (int l = L - 1; l >= 0; l--) {
        mlp_block_backward(m, l, B, T);
        if (cfg->arch == FOX_ARCH_GSA) gsa_block_backward(m, l, B, T);
        else if (cfg->arch == FOX_ARCH_FAM) fam_block_backward(m, l, B, T);
        else attention_block_backward(m, l, B, T);
    }
    embedding_backward(grad(m, FOX_P_wte, 0), g->dres, inputs, N, D);
    if (cfg->arch == FOX_ARCH_FAM) {  // the prompt's gradient at layer 0 is fam_init's
        real *dw = grad(m, FOX_P_fam_init, 0);
        for (size_t i = 0; i < (size_t)cfg->fam_memory * D; i++) dw[i] += m->fs.dprompt[0][i];
    }
}

// ----------------------------------------------------------------------------
// Optimizer (docs/model.md §2)

// Global L2 norm of the gradient, summed in a fixed order (deterministic).
static double grad_norm(const real *g, size_t n) {
    double acc = 0.0;
    for (size_t i = 0; i < n; i++) acc += (double)g[i] * g[i];
    return sqrt(acc);
}

// torch.nn.utils.clip_grad_norm_ semantics: scale by clip/(norm+1e-6) when norm exceeds clip.
static void clip_grads(real *g, size_t n, double norm, double clip) {
    if (clip <= 0.0 || norm <= clip) return;
    real k = (real)(clip / (norm + 1e-6));
    #pragma omp parallel for if(threads_pay((double)n))
    for (size_t i = 0; i < n; i++) g[i] *= k;
}

// AdamW (torch semantics: decoupled decay p *= 1 − lr·wd first) on every learned tensor; `t` is
// the 1-based step count used for bias correction.
static void adamw_update(Model *m, const OptConfig *o, double lr, int t) {
    double bc1 = 1.0 - pow(o->beta1, t), bc2 = 1.0 - pow(o->beta2, t);
    for (int k = 0; k < FOX_NUM_PARAMS; k++) {
        const FoxParamInfo *p = &m->lay.p[k];
        if (!fox_param_learned(&m->cfg, k)) continue;
        real decay = p->decay ? (real)(1.0 - lr * o->weight_decay) : 1.0f;
        real *w = m->params + p->offset, *g = m->grads + p->offset, *mm = m->m + p->offset, *vv = m->v + p->offset;
        #pragma omp parallel for if(threads_pay(WORK_TRANSC * p->numel))
        for (size_t i = 0; i < p->numel; i++) {
            mm[i] = (real)(o->beta1 * mm[i] + (1.0 - o->beta1) * g[i]);
            vv[i] = (real)(o->beta2 * vv[i] + (1.0 - o->beta2) * g[i] * g[i]);
            double mhat = mm[i] / bc1, vhat = vv[i] / bc2;
            w[i] = (real)(w[i] * decay - lr * mhat / (sqrt(vhat) + o->eps));
        }
    }
}

// Global-norm clipping by `norm` (the gradient's, from grad_norm), then AdamW.
static void optimizer_update(Model *m, const OptConfig *o, double lr, int t, double norm) {
    clip_grads(m->grads, m->lay.total, norm, o->grad_clip);
    adamw_update(m, o, lr, t);
}


// ----------------------------------------------------------------------------
// Generation with a KV cache (docs/model.md §7): the prefill is the normal forward, keeping each layer's
// keys, values, c and KV-shift state; a decode step runs one new token per sequence against them.

// Row (l, b, h) of the cache's per-head arrays.
static size_t cache_row(const Model *m, int l, int b, int h) { return ((size_t)l * m->B + b) * m->cfg.n_head + h; }

static void model_cache_free(Model *m) {
    Cache *kc = &m->cache;
    real **bufs[] = {&kc->k, &kc->v, &kc->k_prev, &kc->v_prev, &kc->k_max2, &kc->x, &kc->xn, &kc->proj,
                     &kc->q, &kc->kn, &kc->vn, &kc->o, &kc->on, &kc->z, &kc->y, &kc->mlp_u, &kc->mlp_h, &kc->rstd};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) free(*bufs[i]);
    free(kc->c);
    free(kc->doc_start);
    free(kc->gsa_S);
    free(kc->gsa_U);
    free(kc->gsa_p);
    fam_rows_free(&kc->fam);
    free(kc->fam_out);
    free(kc->fam_y);
    memset(kc, 0, sizeof(*kc));
}

// Bytes of a cache of max_len positions for the model's B sequences (keys, values and c dominate).
static double cache_bytes_needed(const Model *m, int max_len) {
    const FoxConfig *cfg = &m->cfg;
    double rows = (double)cfg->n_layer * m->B * cfg->n_head, D = cfg->d_model;
    if (cfg->arch == FOX_ARCH_GSA) return 2.0 * cfg->n_layer * m->B * cfg->gsa_slots * D * sizeof(real);  // the state alone
    double memory = cfg->arch == FOX_ARCH_FAM ? (double)cfg->n_layer * m->B * cfg->fam_memory * fam_row_reals(m) * sizeof(real) : 0.0;
    return rows * max_len * (2.0 * fox_head_dim(cfg) * sizeof(real) + sizeof(creal)) + (double)cfg->n_layer * m->B * 2 * D * sizeof(real) +
           memory;
}

static void model_cache_init(Model *m, int max_len) {
    const FoxConfig *cfg = &m->cfg;
    double need = cache_bytes_needed(m, max_len);
    double have = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    if (max_len < 1 || need > have)
        fox_fatal("the KV cache of %d sequences x %d positions needs %.2f GiB, this machine has %.2f GiB: generate "
                  "fewer tokens or sequences, or use a shorter prompt", m->B, max_len, need / (1 << 30), have / (1 << 30));
    model_cache_free(m);
    Cache *kc = &m->cache;
    size_t L = (size_t)cfg->n_layer, B = (size_t)m->B, H = (size_t)cfg->n_head, D = (size_t)cfg->d_model;
    size_t rows = L * B * H, Dh = (size_t)fox_head_dim(cfg), I = (size_t)cfg->mlp_hidden;
    kc->max_len = max_len;
    if (cfg->arch == FOX_ARCH_GSA) {
        size_t slots = (size_t)cfg->gsa_slots;
        kc->gsa_S = fox_calloc(L * B * slots * D, sizeof(real));
        kc->gsa_U = fox_calloc(L * B * slots * D, sizeof(real));
        kc->gsa_p = fox_calloc(B * (size_t)cfg->gsa_heads * slots, sizeof(real));
    } else {
        kc->k = fox_calloc(rows * max_len * Dh, sizeof(real));
        kc->v = fox_calloc(rows * max_len * Dh, sizeof(real));
        kc->c = fox_calloc(rows * max_len, sizeof(creal));
    }
    if (cfg->arch == FOX_ARCH_FAM) {
        size_t R = B * (size_t)cfg->fam_memory;
        fam_rows_alloc(m, &kc->fam, L * R);
        kc->fam_out = fox_calloc(R * D, sizeof(real));
        kc->fam_y = fox_calloc(R * D, sizeof(real));
    }
    kc->doc_start = fox_calloc(B, sizeof(int));
    kc->k_prev = fox_calloc(L * B * D, sizeof(real));
    kc->v_prev = fox_calloc(L * B * D, sizeof(real));
    kc->k_max2 = fox_calloc(rows, sizeof(real));
    real **step[] = {&kc->x, &kc->xn, &kc->q, &kc->kn, &kc->vn, &kc->o, &kc->on, &kc->z, &kc->y};
    for (size_t i = 0; i < sizeof(step) / sizeof(step[0]); i++) *step[i] = fox_calloc(B * D, sizeof(real));
    kc->proj = fox_calloc(B * (size_t)m->cols.width, sizeof(real));
    kc->mlp_u = fox_calloc(B * 2 * I, sizeof(real));
    kc->mlp_h = fox_calloc(B * I, sizeof(real));
    kc->rstd = fox_calloc(B * H, sizeof(real));
}

// Appends position t of sequence b, head h of block l: key k and value v (as attention sees them) and c_t.
static void cache_append(Model *m, int l, int b, int h, int t, const real *k, const real *v, creal c_t) {
    Cache *kc = &m->cache;
    size_t r = cache_row(m, l, b, h), Dh = (size_t)fox_head_dim(&m->cfg), at = (r * kc->max_len + t) * Dh;
    memcpy(kc->k + at, k, Dh * sizeof(real));
    memcpy(kc->v + at, v, Dh * sizeof(real));
    kc->c[r * kc->max_len + t] = c_t;
    real k2 = 0.0f;
    for (size_t i = 0; i < Dh; i++) k2 += k[i] * k[i];
    if (k2 > kc->k_max2[r]) kc->k_max2[r] = k2;
}

// The forward over the prompt (B x T tokens), then its keys, values, c and shift state into the cache;
// logits: each sequence's last-position logits (B x V).
static void model_prefill(Model *m, const int *tokens, int T, real *logits) {
    const FoxConfig *cfg = &m->cfg;
    Cache *kc = &m->cache;
    if (T < 1 || T > kc->max_len || T > m->T) fox_fatal("prefill of %d tokens: the cache holds %d, the model %d", T, kc->max_len, m->T);
    int B = m->B, H = cfg->n_head, Dh = fox_head_dim(cfg), D = cfg->d_model, V = cfg->vocab_size, NIN = m->cols.width;
    model_forward(m, tokens, NULL, B, T);
    int has_c = model_has_c(m);
    for (int l = 0; l < cfg->n_layer && cfg->arch == FOX_ARCH_GSA; l++) {  // GSA: the states after the last token
        GsaLayer gl = gsa_layer(m, l, B, T);
        size_t state = (size_t)cfg->gsa_slots * (D / cfg->gsa_heads), per_seq = (size_t)cfg->gsa_heads * state;
        for (int bg = 0; bg < B * cfg->gsa_heads; bg++) {
            size_t from = ((size_t)bg * gsa_chunks(T) + gsa_chunks(T) - 1) * state, to = (size_t)l * B * per_seq + (size_t)bg * state;
            memcpy(kc->gsa_S + to, gl.S + from, state * sizeof(real));
            memcpy(kc->gsa_U + to, gl.U + from, state * sizeof(real));
        }
    }
    for (int l = 0; l < cfg->n_layer && fox_fam_has_memory(cfg); l++) {  // FAM: the memory the next block reads
        FamShape fs = fam_shape(cfg, T);
        FamRows f = fam_rows_at(m, &kc->fam, (size_t)l * B * fs.M);
        memcpy(f.x, fam_state(m, l, fs.nfull, B, T).x, (size_t)B * fs.M * D * sizeof(real));
        fam_project(m, l, f, B * fs.M, fs.nfull * fs.K - fs.M);
    }
    for (int l = 0; l < cfg->n_layer && cfg->arch != FOX_ARCH_GSA; l++) {
        AttnLayer al = attn_layer(m, l, B, T);
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < H; h++) {
                const creal *ch = al.c + ((size_t)b * H + h) * T;
                for (int t = 0; t < T; t++) {
                    size_t i = ((size_t)b * T + t) * D + (size_t)h * Dh;
                    cache_append(m, l, b, h, t, al.k + i, al.v + i, has_c ? ch[t] : 0.0);
                }
            }
            const real *last = al.proj + ((size_t)b * T + T - 1) * NIN;
            memcpy(kc->k_prev + ((size_t)l * B + b) * D, last + m->cols.k, (size_t)D * sizeof(real));
            memcpy(kc->v_prev + ((size_t)l * B + b) * D, last + m->cols.v, (size_t)D * sizeof(real));
        }
    }
    for (int b = 0; b < B; b++) {
        memcpy(logits + (size_t)b * V, m->a.logits + ((size_t)b * T + T - 1) * V, (size_t)V * sizeof(real));
        kc->doc_start[b] = 0;
        for (int t = 0; t < T; t++)
            if (fox_doc_start(tokens[(size_t)b * T + t], m->doc_sep)) kc->doc_start[b] = t;
    }
    kc->len = T;
    kc->keys_read = kc->keys_cached = 0;
}

// One new token's q and shifted, normed, rotated k and v for block l from proj (FoX eq. 14-19, as
// attention_block_forward forms them for position t), appended to the cache with c_t; the shift state
// moves on to this token. tokens: the new token of each sequence (a separator starts a document).
static void decode_qkv(Model *m, int l, int t, const int *tokens) {
    const FoxConfig *cfg = &m->cfg;
    Cache *kc = &m->cache;
    int B = m->B, H = cfg->n_head, Dh = fox_head_dim(cfg), D = cfg->d_model, NIN = m->cols.width;
    AttnCols cols = m->cols;
    for (int b = 0; b < B; b++) {
        const real *p = kc->proj + (size_t)b * NIN;
        real *kp = kc->k_prev + ((size_t)l * B + b) * D, *vp = kc->v_prev + ((size_t)l * B + b) * D;
        real *k = kc->kn + (size_t)b * D, *v = kc->vn + (size_t)b * D;
        int prev = !fox_doc_start(tokens[b], m->doc_sep);  // KV-shift's reach (fox_doc_has_prev; t > 0 here)
        for (int i = 0; i < D; i++) {
            real ak = cfg->kv_shift ? sigmoid_r(p[cols.k_shift + i / Dh]) : 0.0f;
            real av = cfg->kv_shift ? sigmoid_r(p[cols.v_shift + i / Dh]) : 0.0f;
            k[i] = (prev ? ak * kp[i] : 0.0f) + (1.0f - ak) * p[cols.k + i];
            v[i] = (prev ? av * vp[i] : 0.0f) + (1.0f - av) * p[cols.v + i];
        }
        memcpy(kp, p + cols.k, (size_t)D * sizeof(real));
        memcpy(vp, p + cols.v, (size_t)D * sizeof(real));
        memcpy(kc->q + (size_t)b * D, p + cols.q, (size_t)D * sizeof(real));
    }
    if (cfg->qk_norm) {
        int wstride = cfg->qk_norm_shared ? 0 : Dh;
        NormShape qs = {B, H, Dh, D, D, wstride, FOX_QK_NORM_EPS};
        rmsnorm_forward(kc->q, kc->rstd, kc->q, param(m, FOX_P_qnorm_w, l), qs);
        rmsnorm_forward(kc->kn, kc->rstd, kc->kn, param(m, FOX_P_knorm_w, l), qs);
    }
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            size_t i = (size_t)b * D + (size_t)h * Dh, r = cache_row(m, l, b, h);
            if (cfg->rope) {
                rope_rotate(kc->q + i, t, Dh, cfg->rope_theta, 0);
                rope_rotate(kc->kn + i, t, Dh, cfg->rope_theta, 0);
            }
            creal c_t = 0.0;
            if (model_has_c(m))
                c_t = kc->c[r * kc->max_len + t - 1] +
                      log_forget(kc->proj + (size_t)b * NIN, param(m, FOX_P_fgate_b, l), cols.fgate, cfg->forget_gate, h, tokens[b], m->doc_sep);
            cache_append(m, l, b, h, t, kc->kn + i, kc->vn + i, c_t);
        }
    }
}

// The first cached key the query of (b, h) at position t reads: 0, or with ACP the first whose decay
// bias is above the threshold (fox_acp_first_key) and, under the document mask, not before the
// sequence's latest separator (docs/model.md §1.8).
static int decode_first_key(Model *m, int l, int b, int h, int t, const real *q) {
    const FoxConfig *cfg = &m->cfg;
    if (!m->acp || !model_has_c(m)) return 0;
    Cache *kc = &m->cache;
    int first = 0;
    if (cfg->forget_gate != FOX_FG_NONE) {
        int Dh = fox_head_dim(cfg);
        size_t r = cache_row(m, l, b, h);
        double q2 = 0.0;
        for (int i = 0; i < Dh; i++) q2 += (double)q[i] * q[i];
        double U = cfg->qk_norm ? acp_bound_qknorm_head(m, l, h) : fox_acp_bound_norms(q2, (double)kc->k_max2[r], Dh);
        first = fox_acp_first_key(kc->c + r * kc->max_len, t, fox_acp_threshold(U, t + 1));
    }
    return m->doc_sep >= 0 && kc->doc_start[b] > first ? kc->doc_start[b] : first;
}

// TransformerFAM's attention of the new tokens at position t (fam_token_attention's row t): the layer's memory,
// then the window's cached keys.
static void fam_decode_attention(Model *m, int l, int t) {
    const FoxConfig *cfg = &m->cfg;
    Cache *kc = &m->cache;
    int B = m->B, H = cfg->n_head, Dh = fox_head_dim(cfg), D = cfg->d_model, K = cfg->fam_block, M = cfg->fam_memory, tau = t / K;
    FamRows f = fam_rows_at(m, &kc->fam, (size_t)l * B * M);
    #pragma omp parallel for if(threads_pay(2.0 * B * (M + (cfg->fam_window_blocks + 1) * K) * D)) collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            size_t i = (size_t)b * D + (size_t)h * Dh, r = cache_row(m, l, b, h), fr = (size_t)b * M * D + (size_t)h * Dh;
            const creal *ch = model_has_c(m) ? kc->c + r * kc->max_len : NULL;
            creal ct = ch ? ch[t] : 0.0, cm = ch && tau ? ch[tau * K - 1] : 0.0;
            Softmax sm = attend_start(kc->o + i, Dh);
            attend_keys(kc->o + i, &sm, kc->q + i, f.k + fr, f.v + fr, (size_t)D, NULL, 0.0, (real)(ct - cm), 0, M - 1, Dh);
            attend_keys(kc->o + i, &sm, kc->q + i, kc->k + r * kc->max_len * Dh, kc->v + r * kc->max_len * Dh, (size_t)Dh, ch,
                        ct, 0.0f, fam_window_start(t, K, cfg->fam_window_blocks), t, Dh);
            attend_finish(kc->o + i, sm, Dh);
        }
    }
}

// After the last token t of a block, layer l's memory moves on as fam_memory_forward's update: F_{τ+1} from F_τ
// and the block's cached keys and values, then its attention inputs for the next block.
static void fam_decode_update(Model *m, int l, int t) {
    const FoxConfig *cfg = &m->cfg;
    Cache *kc = &m->cache;
    int B = m->B, H = cfg->n_head, Dh = fox_head_dim(cfg), D = cfg->d_model, K = cfg->fam_block, M = cfg->fam_memory, tau = t / K;
    FamRows f = fam_rows_at(m, &kc->fam, (size_t)l * B * M);
    #pragma omp parallel for if(threads_pay(2.0 * B * M * (M + K) * D)) collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            size_t r = cache_row(m, l, b, h), fr = (size_t)b * M * D + (size_t)h * Dh;
            FamBlock blk = {kc->k + r * kc->max_len * Dh, kc->v + r * kc->max_len * Dh, NULL, NULL, (size_t)Dh,
                            model_has_c(m) ? kc->c + r * kc->max_len : NULL, NULL, tau * K, t + 1};
            fam_attend_head(f.o + fr, f.lse + (size_t)b * M * H + h, f.q + fr, f.k + fr, f.v + fr, blk, M, D, H, Dh);
        }
    }
    fam_update(m, l, f, kc->fam_out, B * M, tau > 0, kc->fam_y);
    memcpy(f.x, kc->fam_out, (size_t)B * M * D * sizeof(real));
    fam_project(m, l, f, B * M, (tau + 1) * K - M);
}

// The attention of the new tokens at position t over every cached key (or, with ACP, the live ones).
static void decode_full_attention(Model *m, int l, int t) {
    const FoxConfig *cfg = &m->cfg;
    Cache *kc = &m->cache;
    int B = m->B, H = cfg->n_head, Dh = fox_head_dim(cfg), D = cfg->d_model;
    long long read = 0;
    #pragma omp parallel for if(threads_pay(2.0 * B * (t + 1) * D)) collapse(2) reduction(+:read)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            size_t i = (size_t)b * D + (size_t)h * Dh, r = cache_row(m, l, b, h);
            const creal *ch = model_has_c(m) ? kc->c + r * kc->max_len : NULL;
            int first = decode_first_key(m, l, b, h, t, kc->q + i);
            read += t + 1 - first;
            attend_row(kc->o + i, kc->q + i, kc->k + r * kc->max_len * Dh, kc->v + r * kc->max_len * Dh, (size_t)Dh, ch,
                       ch ? ch[t] : 0.0f, first, t, Dh);
        }
    }
    kc->keys_read += read;
    kc->keys_cached += (long long)B * H * (t + 1);
}

// Block l's attention for the new tokens at position t: x += W_o z (FoX eq. 11-13, 21-23 over the cache; FAM:
// over its memory and window, and the memory's update after a block's last token).
static void decode_attention_block(Model *m, int l, int t, const int *tokens) {
    const FoxConfig *cfg = &m->cfg;
    Cache *kc = &m->cache;
    int B = m->B, D = cfg->d_model;
    NormShape ln = {B, 1, D, D, D, D, FOX_NORM_EPS};
    rmsnorm_forward(kc->xn, kc->rstd, kc->x, param(m, FOX_P_ln1_w, l), ln);
    matmul_forward(kc->proj, kc->xn, param(m, FOX_P_attn_in_w, l), B, D, m->cols.width);
    decode_qkv(m, l, t, tokens);
    if (cfg->arch == FOX_ARCH_FAM) fam_decode_attention(m, l, t);
    else decode_full_attention(m, l, t);
    attention_output(m, l, kc->z, kc->on, kc->rstd, kc->o, kc->proj, B);
    matmul_forward(kc->y, kc->z, param(m, FOX_P_attn_out_w, l), B, D, D);
    residual_add(kc->x, kc->x, kc->y, (size_t)B * D);
    if (fox_fam_has_memory(cfg) && (t + 1) % cfg->fam_block == 0) fam_decode_update(m, l, t);
}

// Block l's GSA for the new tokens (one per sequence): the recurrence's step from the cached states, x += W_o z.
static void decode_gsa_block(Model *m, int l) {
    const FoxConfig *cfg = &m->cfg;
    Cache *kc = &m->cache;
    int B = m->B, D = cfg->d_model;
    size_t per_layer = (size_t)B * cfg->gsa_slots * D;
    NormShape ln = {B, 1, D, D, D, D, FOX_NORM_EPS};
    rmsnorm_forward(kc->xn, kc->rstd, kc->x, param(m, FOX_P_ln1_w, l), ln);
    matmul_forward(kc->proj, kc->xn, param(m, FOX_P_attn_in_w, l), B, D, m->cols.width);
    gsa_features(m, kc->q, kc->kn, kc->vn, kc->proj, B);
    real *S = kc->gsa_S + l * per_layer, *U = kc->gsa_U + l * per_layer;
    gsa_forward(kc->o, S, U, kc->gsa_p, S, U, kc->q, kc->kn, kc->vn, kc->proj, gsa_shape(m, B, 1));
    gsa_output(m, l, kc->x, kc->x, kc->z, kc->on, kc->rstd, kc->o, kc->y, B);
}

// One token per sequence at the next position; logits: B x V.
static void model_decode(Model *m, const int *tokens, real *logits) {
    const FoxConfig *cfg = &m->cfg;
    Cache *kc = &m->cache;
    if (kc->len < 1 || kc->len >= kc->max_len) fox_fatal("decode at position %d: the KV cache holds %d (prefill first)", kc->len, kc->max_len);
    threads_watch();
    int B = m->B, D = cfg->d_model, t = kc->len;
    for (int b = 0; b < B; b++)
        if (fox_doc_start(tokens[b], m->doc_sep)) kc->doc_start[b] = t;
    embedding_forward(kc->x, tokens, param(m, FOX_P_wte, 0), B, D);
    for (int l = 0; l < cfg->n_layer; l++) {
        if (cfg->arch == FOX_ARCH_GSA) decode_gsa_block(m, l);
        else decode_attention_block(m, l, t, tokens);
        mlp_forward(m, l, kc->x, kc->x, kc->xn, kc->rstd, kc->mlp_u, kc->mlp_h, kc->y, B);
    }
    NormShape ln = {B, 1, D, D, D, D, FOX_NORM_EPS};
    rmsnorm_forward(kc->xn, kc->rstd, kc->x, param(m, FOX_P_lnf_w, 0), ln);
    matmul_forward(logits, kc->xn, param(m, FOX_P_lm_head_w, 0), B, D, cfg->vocab_size);
    kc->len++;
}

// ----------------------------------------------------------------------------
// The run (fox/run.h): what it needs from this model. Not part of the test build.
#ifndef TESTING

// The CPU trainer keeps every activation and its host buffers whether or not a backward follows
// (recompute, forward_only), is always deterministic, holds every AdamW moment (zero), and its ranks
// meet only in MPI_Allreduce.
static Model *run_model_init(const FoxConfig *cfg, const ModelOptions *o, const Dist *d) {
    Model *m = (Model *)fox_calloc(1, sizeof(Model));
    (void)d;
    model_init(m, cfg, o->batch, o->seq_len, o->seed);
    m->acp = o->acp;
    m->doc_sep = o->doc_sep;
    return m;
}

static const float *run_model_losses(Model *m) { return m->a.losses; }

static void run_model_logits(Model *m, int r0, int rows, float *out) {
    memcpy(out, m->a.logits + (size_t)r0 * m->cfg.vocab_size, (size_t)rows * m->cfg.vocab_size * sizeof(float));
}

static void run_model_forward_queue(Model *m, const int *inputs, const int *targets, int B, int T) {
    m->queued_loss = model_forward(m, inputs, targets, B, T);
}

static double run_model_loss(Model *m) { return m->queued_loss; }

static void run_model_backward(Model *m, const int *inputs, const int *targets, int B, int T, float dloss_scale,
                               int last) {
    (void)last;  // the ranks' gradients are averaged after the backward (run_model_average_grads)
    model_backward(m, inputs, targets, B, T, dloss_scale);
}

static void run_model_zero_grad(Model *m) { zero(m->grads, m->lay.total); }

static double run_model_grad_norm(Model *m) { return grad_norm(m->grads, m->lay.total); }

static void run_model_update(Model *m, const OptConfig *o, double lr, int t, double norm) { optimizer_update(m, o, lr, t, norm); }

static void run_model_average_grads(Model *m, const Dist *d) {
    dist_allreduce_sum(d, m->grads, m->lay.total);
    float inv = 1.0f / d->world;
    for (size_t i = 0; i < m->lay.total; i++) m->grads[i] *= inv;
}

static void copy_out(float *dst, const float *src, size_t n) { if (dst) memcpy(dst, src, n * sizeof(float)); }

static int run_model_acp_tiles(Model *m, long long *live, long long *tiles) {
    if (!m->acp_tiles) return 0;
    memcpy(live, m->acp_live, (size_t)m->cfg.n_layer * m->cfg.n_head * sizeof(long long));
    *tiles = m->acp_tiles;
    return 1;
}

// Every rank holds all of the AdamW moments (no ZeRO on the CPU).
static void run_model_shard(const Model *m, size_t *offset, size_t *count) {
    *offset = 0;
    *count = m->lay.total;
}

static void run_model_get(Model *m, float *params, float *m1, float *m2) {
    copy_out(params, m->params, m->lay.total);
    copy_out(m1, m->m, m->lay.total);
    copy_out(m2, m->v, m->lay.total);
}

static void run_model_set(Model *m, const float *params, const float *m1, const float *m2) {
    if (params) copy_out(m->params, params, m->lay.total);
    if (m1) copy_out(m->m, m1, m->lay.total);
    if (m2) copy_out(m->v, m2, m->lay.total);
}

static void run_model_cache_init(Model *m, int max_len) { model_cache_init(m, max_len); }
static void run_model_prefill(Model *m, const int *tokens, int T, float *logits) { model_prefill(m, tokens, T, logits); }
static void run_model_decode(Model *m, const int *tokens, float *logits) { model_decode(m, tokens, logits); }

static double run_model_decode_keys_read(Model *m) {
    const Cache *kc = &m->cache;
    return m->acp && model_has_c(m) && kc->keys_cached ? (double)kc->keys_read / kc->keys_cached : -1.0;
}

static void run_model_sync(Model *m) { (void)m; }
static double run_model_peak_flops(void) { return 0.0; }  // CPU peaks vary: the log shows GFLOP/s
static void run_model_report(Model *m) { (void)m; }

#include "fox/run.h"

int main(int argc, char **argv) { return run_main(argc, argv); }
#endif
