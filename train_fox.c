// train_fox.c: the fp32 CPU reference trainer for the Forgetting Transformer (FoX).
// Readable first, parallel with OpenMP, every forward next to its backward. SPEC.md §1-2, §5-6.
// The model's shapes and switches come from fox/config.h; the checkpoint format from
// fox/checkpoint.h; the data from dataloader.h. test_fox.c includes this file with TESTING set.
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef FOX_MPI
#include <mpi.h>
#endif
#include "fox/config.h"
#include "fox/rng.h"
#include "fox/args.h"
#include "fox/io.h"
#include "fox/checkpoint.h"
#include "fox/npy.h"
#include "fox/train_common.h"
#include "dataloader.h"
#include "tokenizer.h"

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

// ----------------------------------------------------------------------------
// Model state

// Activations of one forward pass over B×T tokens (N = B*T), kept for the backward pass.
typedef struct {
    real *resid;     // (L+1, N, D): input of each block, then the last block's output
    real *mid;       // (L, N, D): residual after attention
    real *ln1_rstd, *xn1;  // (L, N), (L, N, D)
    real *proj;      // (L, N, NIN): attn_in_w outputs
    real *ks, *vs;   // (L, N, D): keys and values after KV-shift
    real *qn, *kn;   // (L, N, D): attention q and k (after QK-norm and RoPE)
    real *q_rstd, *k_rstd;  // (L, N, H)
    real *cum;       // (L, B, H, T): c_t = Σ log f
    real *att, *lse; // (L, N, D), (L, B, H, T)
    real *on, *on_rstd;     // (L, N, D), (L, N, H): output-normed attention
    real *z;         // (L, N, D): input of attn_out_w
    real *ln2_rstd, *xn2;   // (L, N), (L, N, D)
    real *mlp_u, *mlp_h;    // (L, N, 2I), (L, N, I)
    real *lnf_rstd, *xnf;   // (N), (N, D)
    real *logits;    // (N, V); the backward pass turns it into dlogits
    real *losses;    // (N): per-position cross entropy
} Acts;

// Gradient scratch for one block at a time.
typedef struct {
    real *dresid, *dxn, *dproj, *dks, *dvs, *dqn, *dkn, *dcum, *datt, *don, *dz, *du, *dh;
} Grads;

typedef struct {
    FoxConfig cfg;
    FoxLayout lay;
    AttnCols cols;
    real *params, *grads, *m, *v;
    int B, T;  // activation capacity
    Acts a;
    Grads d;
} Model;

static real *param(Model *m, int which, int layer) {
    const FoxParamInfo *p = &m->lay.p[which];
    return m->params + p->offset + (size_t)layer * p->rows * p->cols;
}

static real *grad(Model *m, int which, int layer) {
    const FoxParamInfo *p = &m->lay.p[which];
    return m->grads + p->offset + (size_t)layer * p->rows * p->cols;
}

static void model_alloc_acts(Model *m, int B, int T) {
    const FoxConfig *c = &m->cfg;
    size_t L = (size_t)c->n_layer, N = (size_t)B * T, D = (size_t)c->d_model, H = (size_t)c->n_head;
    size_t I = (size_t)c->mlp_hidden, NIN = (size_t)m->cols.width, V = (size_t)c->vocab_size;
    Acts *a = &m->a;
    a->resid = fox_calloc((L + 1) * N * D, sizeof(real));
    a->mid = fox_calloc(L * N * D, sizeof(real));
    a->ln1_rstd = fox_calloc(L * N, sizeof(real));
    a->xn1 = fox_calloc(L * N * D, sizeof(real));
    a->proj = fox_calloc(L * N * NIN, sizeof(real));
    a->ks = fox_calloc(L * N * D, sizeof(real));
    a->vs = fox_calloc(L * N * D, sizeof(real));
    a->qn = fox_calloc(L * N * D, sizeof(real));
    a->kn = fox_calloc(L * N * D, sizeof(real));
    a->q_rstd = fox_calloc(L * N * H, sizeof(real));
    a->k_rstd = fox_calloc(L * N * H, sizeof(real));
    a->cum = fox_calloc(L * N * H, sizeof(real));
    a->att = fox_calloc(L * N * D, sizeof(real));
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
    Grads *d = &m->d;
    d->dresid = fox_calloc(N * D, sizeof(real));
    d->dxn = fox_calloc(N * D, sizeof(real));
    d->dproj = fox_calloc(N * NIN, sizeof(real));
    d->dks = fox_calloc(N * D, sizeof(real));
    d->dvs = fox_calloc(N * D, sizeof(real));
    d->dqn = fox_calloc(N * D, sizeof(real));
    d->dkn = fox_calloc(N * D, sizeof(real));
    d->dcum = fox_calloc(N * H, sizeof(real));
    d->datt = fox_calloc(N * D, sizeof(real));
    d->don = fox_calloc(N * D, sizeof(real));
    d->dz = fox_calloc(N * D, sizeof(real));
    d->du = fox_calloc(N * 2 * I, sizeof(real));
    d->dh = fox_calloc(N * I, sizeof(real));
    m->B = B;
    m->T = T;
}

static void model_init(Model *m, const FoxConfig *c, int B, int T, uint64_t seed) {
    memset(m, 0, sizeof(*m));
    m->cfg = *c;
    fox_layout(c, &m->lay);
    m->cols = attn_cols(c);
    size_t n = m->lay.total;
    m->params = fox_malloc(n * sizeof(real));
    m->grads = fox_calloc(n, sizeof(real));
    m->m = fox_calloc(n, sizeof(real));
    m->v = fox_calloc(n, sizeof(real));
    float *init = fox_malloc(n * sizeof(float));  // the shared init is defined in float32
    fox_init_params(c, &m->lay, init, seed);
    for (size_t i = 0; i < n; i++) m->params[i] = init[i];
    free(init);
    model_alloc_acts(m, B, T);
}

static void model_free(Model *m) {
    real **bufs[] = {
        &m->params, &m->grads, &m->m, &m->v, &m->a.resid, &m->a.mid, &m->a.ln1_rstd, &m->a.xn1, &m->a.proj,
        &m->a.ks, &m->a.vs, &m->a.qn, &m->a.kn, &m->a.q_rstd, &m->a.k_rstd, &m->a.cum, &m->a.att, &m->a.lse,
        &m->a.on, &m->a.on_rstd, &m->a.z, &m->a.ln2_rstd, &m->a.xn2, &m->a.mlp_u, &m->a.mlp_h,
        &m->a.lnf_rstd, &m->a.xnf, &m->a.logits, &m->a.losses, &m->d.dresid, &m->d.dxn, &m->d.dproj,
        &m->d.dks, &m->d.dvs, &m->d.dqn, &m->d.dkn, &m->d.dcum, &m->d.datt, &m->d.don, &m->d.dz,
        &m->d.du, &m->d.dh,
    };
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) { free(*bufs[i]); *bufs[i] = NULL; }
}

// ----------------------------------------------------------------------------
// Ops. Backward functions accumulate (+=) into their input gradients.

static real sigmoid_r(real x) { return 1.0f / (1.0f + exp_r(-x)); }

// log σ(x) without overflow.
static real logsigmoid_r(real x) { return fmin_r(x, 0.0f) - log1p_r(exp_r(-fabs_r(x))); }

static void embedding_forward(real *out, const int *tokens, const real *wte, int N, int D) {
    #pragma omp parallel for
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
    #pragma omp parallel for collapse(2)
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
    #pragma omp parallel for collapse(2)
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
    #pragma omp parallel for
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
    #pragma omp parallel
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
    #pragma omp parallel for collapse(2) schedule(dynamic)
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
    #pragma omp parallel for collapse(2) schedule(dynamic)
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

// KV-shift (FoX eq. 14): y_t = α_t x_{t-1} + (1-α_t) x_t per head, α_t = σ(w·x̂_t), x_{-1} = 0.
// x is read from proj at column xc (stride NIN), the α logits at column ac; y is (N, D).
typedef struct { int B, T, H, Dh, stride; } SeqShape;

static void kv_shift_forward(real *y, const real *proj, int xc, int ac, SeqShape s) {
    int D = s.H * s.Dh;
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < s.B; b++) {
        for (int t = 0; t < s.T; t++) {
            size_t n = (size_t)b * s.T + t;
            const real *x = proj + n * s.stride + xc, *xp = t ? x - s.stride : NULL;
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
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < s.B; b++) {
        for (int h = 0; h < s.H; h++) {
            for (int t = 0; t < s.T; t++) {
                size_t n = (size_t)b * s.T + t;
                const real *x = proj + n * s.stride + xc, *xp = t ? x - s.stride : NULL;
                real *dx = dproj + n * s.stride + xc, *dxp = t ? dx - s.stride : NULL;
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
    #pragma omp parallel for
    for (int n = 0; n < N; n++) memcpy(y + (size_t)n * D, proj + (size_t)n * stride + xc, (size_t)D * sizeof(real));
}

static void add_columns(real *dproj, const real *dy, int xc, int N, int D, int stride) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++)
        for (int k = 0; k < D; k++) dproj[(size_t)n * stride + xc + k] += dy[(size_t)n * D + k];
}

// RoPE, rotate-half convention: pairs (i, i + Dh/2) turn by t·θ^(-2i/Dh). In place on (N, D).
static void rope_apply(real *x, SeqShape s, real theta, int inverse) {
    int half = s.Dh / 2, D = s.H * s.Dh;
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < s.B; b++) {
        for (int t = 0; t < s.T; t++) {
            for (int h = 0; h < s.H; h++) {
                real *v = x + ((size_t)b * s.T + t) * D + (size_t)h * s.Dh;
                for (int i = 0; i < half; i++) {
                    double ang = t * pow((double)theta, -2.0 * i / s.Dh);
                    real cs = (real)cos(ang), sn = (real)(inverse ? -sin(ang) : sin(ang));
                    real x1 = v[i], x2 = v[i + half];
                    v[i] = x1 * cs - x2 * sn;
                    v[i + half] = x2 * cs + x1 * sn;
                }
            }
        }
    }
}

// Forget gate: log f_t per head (logsigmoid in fp32) and c_t = Σ_{l≤t} log f_l, stored (B, H, T).
static void forget_gate_forward(real *cum, const real *proj, const real *bias, int fc, int kind, SeqShape s) {
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < s.B; b++) {
        for (int h = 0; h < s.H; h++) {
            double acc = 0.0;
            real *c = cum + ((size_t)b * s.H + h) * s.T;
            for (int t = 0; t < s.T; t++) {
                real logit = bias[h];
                if (kind == FOX_FG_DATA_DEPENDENT) logit += proj[((size_t)b * s.T + t) * s.stride + fc + h];
                acc += logsigmoid_r(logit);
                c[t] = (real)acc;
            }
        }
    }
}

// d log f_t = Σ_{i≥t} dc_i, a true reverse cumulative sum (no "total minus prefix"); then through
// logsigmoid: d logit = d log f · σ(-logit).
static void forget_gate_backward(real *dproj, real *dbias, const real *dcum, const real *proj,
                                 const real *bias, int fc, int kind, SeqShape s) {
    #pragma omp parallel for
    for (int h = 0; h < s.H; h++) {
        double db = 0.0;
        for (int b = 0; b < s.B; b++) {
            const real *dc = dcum + ((size_t)b * s.H + h) * s.T;
            double acc = 0.0;
            for (int t = s.T - 1; t >= 0; t--) {
                acc += dc[t];
                size_t n = (size_t)b * s.T + t;
                real logit = bias[h] + (kind == FOX_FG_DATA_DEPENDENT ? proj[n * s.stride + fc + h] : 0.0f);
                real dlogit = (real)acc * sigmoid_r(-logit);
                if (kind == FOX_FG_DATA_DEPENDENT) dproj[n * s.stride + fc + h] += dlogit;
                db += dlogit;
            }
        }
        if (kind != FOX_FG_FIXED) dbias[h] += (real)db;
    }
}

// Forgetting Attention (FoX eq. 5-6), causal, row by row with an online softmax:
// o_i = Σ_{j≤i} exp(q_i·k_j/√d + c_i − c_j) v_j / Σ_{j≤i} exp(...). Stores lse_i for backward.
// q, k, v, o are (N, D) with head h at columns h·Dh; cum and lse are (B, H, T).
static void attention_forward(real *o, real *lse, const real *q, const real *k, const real *v,
                              const real *cum, SeqShape s) {
    int D = s.H * s.Dh;
    real scale = 1.0f / sqrt_r((real)s.Dh);
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < s.B; b++) {
        for (int h = 0; h < s.H; h++) {
            const real *c = cum ? cum + ((size_t)b * s.H + h) * s.T : NULL;
            real *acc = fox_malloc((size_t)s.Dh * sizeof(real));
            for (int i = 0; i < s.T; i++) {
                const real *qi = q + ((size_t)b * s.T + i) * D + h * s.Dh;
                real mx = -INFINITY, l = 0.0f;
                memset(acc, 0, (size_t)s.Dh * sizeof(real));
                for (int j = 0; j <= i; j++) {
                    const real *kj = k + ((size_t)b * s.T + j) * D + h * s.Dh;
                    const real *vj = v + ((size_t)b * s.T + j) * D + h * s.Dh;
                    real dot = 0.0f;
                    #pragma omp simd reduction(+:dot)
                    for (int d = 0; d < s.Dh; d++) dot += qi[d] * kj[d];
                    real sc = dot * scale + (c ? c[i] - c[j] : 0.0f);
                    if (sc > mx) {
                        real r = exp_r(mx - sc);
                        l *= r;
                        for (int d = 0; d < s.Dh; d++) acc[d] *= r;
                        mx = sc;
                    }
                    real p = exp_r(sc - mx);
                    l += p;
                    for (int d = 0; d < s.Dh; d++) acc[d] += p * vj[d];
                }
                real *oi = o + ((size_t)b * s.T + i) * D + h * s.Dh;
                for (int d = 0; d < s.Dh; d++) oi[d] = acc[d] / l;
                lse[((size_t)b * s.H + h) * s.T + i] = mx + log_r(l);
            }
            free(acc);
        }
    }
}

// Backward of the above: with P_ij = exp(s_ij − lse_i), D_i = dO_i·o_i, dS_ij = P_ij (dO_i·v_j − D_i):
// dq_i = Σ_j dS_ij k_j/√d, dk_j = Σ_i dS_ij q_i/√d, dv_j = Σ_i P_ij dO_i, dc_i += Σ_j dS_ij, dc_j −= Σ_i dS_ij.
static void attention_backward(real *dq, real *dk, real *dv, real *dcum, const real *dout,
                               const real *q, const real *k, const real *v, const real *o,
                               const real *lse, const real *cum, SeqShape s) {
    int D = s.H * s.Dh;
    real scale = 1.0f / sqrt_r((real)s.Dh);
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < s.B; b++) {
        for (int h = 0; h < s.H; h++) {
            size_t bh = ((size_t)b * s.H + h) * s.T;
            const real *c = cum ? cum + bh : NULL;
            for (int i = 0; i < s.T; i++) {
                size_t ri = ((size_t)b * s.T + i) * D + h * s.Dh;
                real Di = 0.0f;
                for (int d = 0; d < s.Dh; d++) Di += dout[ri + d] * o[ri + d];
                for (int j = 0; j <= i; j++) {
                    size_t rj = ((size_t)b * s.T + j) * D + h * s.Dh;
                    real dot = 0.0f, dp = 0.0f;
                    for (int d = 0; d < s.Dh; d++) { dot += q[ri + d] * k[rj + d]; dp += dout[ri + d] * v[rj + d]; }
                    real p = exp_r(dot * scale + (c ? c[i] - c[j] : 0.0f) - lse[bh + i]);
                    real ds = p * (dp - Di);
                    for (int d = 0; d < s.Dh; d++) {
                        dq[ri + d] += ds * scale * k[rj + d];
                        dk[rj + d] += ds * scale * q[ri + d];
                        dv[rj + d] += p * dout[ri + d];
                    }
                    if (dcum) { dcum[bh + i] += ds; dcum[bh + j] -= ds; }
                }
            }
        }
    }
}

// Output gate: z = on ⊙ σ(graw), graw read from proj at column gc.
static void output_gate_forward(real *z, const real *on, const real *proj, int gc, int N, int D, int stride) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++)
        for (int k = 0; k < D; k++) z[(size_t)n * D + k] = on[(size_t)n * D + k] * sigmoid_r(proj[(size_t)n * stride + gc + k]);
}

static void output_gate_backward(real *don, real *dproj, const real *dz, const real *on, const real *proj,
                                 int gc, int N, int D, int stride) {
    #pragma omp parallel for
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
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        for (int i = 0; i < I; i++) {
            real a = u[(size_t)n * 2 * I + i], b = u[(size_t)n * 2 * I + I + i];
            hout[(size_t)n * I + i] = a * sigmoid_r(a) * b;
        }
    }
}

static void swiglu_backward(real *du, const real *dh, const real *u, int N, int I) {
    #pragma omp parallel for
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
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

// Per-position cross entropy from logits (N, V); returns the mean.
static double crossentropy_forward(real *losses, const real *logits, const int *targets, int N, int V) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const real *z = logits + (size_t)n * V;
        real mx = -INFINITY;
        for (int i = 0; i < V; i++) if (z[i] > mx) mx = z[i];
        double sum = 0.0;
        for (int i = 0; i < V; i++) sum += exp_r(z[i] - mx);
        losses[n] = (real)(log(sum) + mx - z[targets[n]]);
    }
    double total = 0.0;
    for (int n = 0; n < N; n++) total += losses[n];
    return total / N;
}

// In place: logits → dlogits = (softmax − onehot) · dloss.
static void crossentropy_backward(real *logits, const int *targets, int N, int V, real dloss) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        real *z = logits + (size_t)n * V;
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
    SeqShape s = {B, T, m->cfg.n_head, fox_head_dim(&m->cfg), stride};
    return s;
}

static size_t lofs(const Model *m, int l, size_t per_token, int B, int T) {
    (void)m;
    return (size_t)l * (size_t)B * T * per_token;
}

// Block l's slices of the attention activations.
typedef struct { real *x, *xn, *proj, *ks, *vs, *qn, *kn, *cum, *lse, *att, *on, *z; } AttnLayer;

static AttnLayer attn_layer(Model *m, int l, int B, int T) {
    Acts *a = &m->a;
    size_t D = (size_t)m->cfg.d_model, H = (size_t)m->cfg.n_head, NIN = (size_t)m->cols.width;
    AttnLayer al = {a->resid + lofs(m, l, D, B, T), a->xn1 + lofs(m, l, D, B, T), a->proj + lofs(m, l, NIN, B, T),
                    a->ks + lofs(m, l, D, B, T), a->vs + lofs(m, l, D, B, T), a->qn + lofs(m, l, D, B, T),
                    a->kn + lofs(m, l, D, B, T), a->cum + lofs(m, l, H, B, T), a->lse + lofs(m, l, H, B, T),
                    a->att + lofs(m, l, D, B, T), a->on + lofs(m, l, D, B, T), a->z + lofs(m, l, D, B, T)};
    return al;
}

// Forward of block l's attention: resid[l] → mid[l].
static void attention_block_forward(Model *m, int l, int B, int T) {
    const FoxConfig *c = &m->cfg;
    Acts *a = &m->a;
    int N = B * T, D = c->d_model, H = c->n_head, Dh = fox_head_dim(c), NIN = m->cols.width;
    AttnCols cl = m->cols;
    SeqShape s = seq_shape(m, B, T, NIN);
    AttnLayer al = attn_layer(m, l, B, T);
    real *x = al.x, *xn = al.xn, *proj = al.proj, *ks = al.ks, *vs = al.vs, *qn = al.qn, *kn = al.kn;
    real *cum = al.cum, *lse = al.lse, *att = al.att, *on = al.on, *z = al.z;

    NormShape ln = {N, 1, D, D, D, D, FOX_NORM_EPS};
    rmsnorm_forward(xn, a->ln1_rstd + lofs(m, l, 1, B, T), x, param(m, FOX_P_ln1_w, l), ln);
    matmul_forward(proj, xn, param(m, FOX_P_attn_in_w, l), N, D, NIN);
    if (c->kv_shift) {
        kv_shift_forward(ks, proj, cl.k, cl.ak, s);
        kv_shift_forward(vs, proj, cl.v, cl.av, s);
    } else {
        copy_columns(ks, proj, cl.k, N, D, NIN);
        copy_columns(vs, proj, cl.v, N, D, NIN);
    }
    if (c->qk_norm) {
        int wst = c->qk_norm_shared ? 0 : Dh;
        NormShape qs = {N, H, Dh, NIN, D, wst, FOX_QK_NORM_EPS}, kshape = {N, H, Dh, D, D, wst, FOX_QK_NORM_EPS};
        rmsnorm_forward(qn, a->q_rstd + lofs(m, l, H, B, T), proj + cl.q, param(m, FOX_P_qnorm_w, l), qs);
        rmsnorm_forward(kn, a->k_rstd + lofs(m, l, H, B, T), ks, param(m, FOX_P_knorm_w, l), kshape);
    } else {
        copy_columns(qn, proj, cl.q, N, D, NIN);
        memcpy(kn, ks, (size_t)N * D * sizeof(real));
    }
    if (c->rope) {
        rope_apply(qn, s, c->rope_theta, 0);
        rope_apply(kn, s, c->rope_theta, 0);
    }
    if (c->forget_gate != FOX_FG_NONE)
        forget_gate_forward(cum, proj, param(m, FOX_P_fgate_b, l), cl.f, c->forget_gate, s);
    attention_forward(att, lse, qn, kn, vs, c->forget_gate != FOX_FG_NONE ? cum : NULL, s);
    if (c->output_norm) {
        NormShape os = {N, H, Dh, D, D, Dh, FOX_NORM_EPS};
        rmsnorm_forward(on, a->on_rstd + lofs(m, l, H, B, T), att, param(m, FOX_P_onorm_w, l), os);
    } else {
        memcpy(on, att, (size_t)N * D * sizeof(real));
    }
    if (c->output_gate) output_gate_forward(z, on, proj, cl.g, N, D, NIN);
    else memcpy(z, on, (size_t)N * D * sizeof(real));
    real *y = m->d.dz;  // scratch: the projection, before the residual add
    matmul_forward(y, z, param(m, FOX_P_attn_out_w, l), N, D, D);
    residual_add(a->mid + lofs(m, l, D, B, T), x, y, (size_t)N * D);
}

// Forward of block l's MLP: mid[l] → resid[l+1].
static void mlp_block_forward(Model *m, int l, int B, int T) {
    const FoxConfig *c = &m->cfg;
    Acts *a = &m->a;
    int N = B * T, D = c->d_model, I = c->mlp_hidden;
    real *x = a->mid + lofs(m, l, D, B, T), *xn = a->xn2 + lofs(m, l, D, B, T);
    real *u = a->mlp_u + lofs(m, l, 2 * (size_t)I, B, T), *hh = a->mlp_h + lofs(m, l, I, B, T);
    NormShape ln = {N, 1, D, D, D, D, FOX_NORM_EPS};
    rmsnorm_forward(xn, a->ln2_rstd + lofs(m, l, 1, B, T), x, param(m, FOX_P_ln2_w, l), ln);
    matmul_forward(u, xn, param(m, FOX_P_mlp_in_w, l), N, D, 2 * I);
    swiglu_forward(hh, u, N, I);
    real *y = m->d.dxn;  // scratch
    matmul_forward(y, hh, param(m, FOX_P_mlp_out_w, l), N, I, D);
    residual_add(a->resid + lofs(m, l + 1, D, B, T), x, y, (size_t)N * D);
}

// Full forward over B×T tokens (B, T within the allocated capacity). With targets, fills the
// per-position losses and returns their mean; without, returns 0 and leaves the logits.
static double model_forward(Model *m, const int *inputs, const int *targets, int B, int T) {
    if (B * T > m->B * m->T) fox_fatal("batch %dx%d exceeds the allocated %dx%d", B, T, m->B, m->T);
    const FoxConfig *c = &m->cfg;
    Acts *a = &m->a;
    int N = B * T, D = c->d_model, V = c->vocab_size, L = c->n_layer;
    embedding_forward(a->resid, inputs, param(m, FOX_P_wte, 0), N, D);
    for (int l = 0; l < L; l++) {
        attention_block_forward(m, l, B, T);
        mlp_block_forward(m, l, B, T);
    }
    NormShape ln = {N, 1, D, D, D, D, FOX_NORM_EPS};
    rmsnorm_forward(a->xnf, a->lnf_rstd, a->resid + lofs(m, L, D, B, T), param(m, FOX_P_lnf_w, 0), ln);
    matmul_forward(a->logits, a->xnf, param(m, FOX_P_lm_head_w, 0), N, D, V);
    return targets ? crossentropy_forward(a->losses, a->logits, targets, N, V) : 0.0;
}

static void zero(real *p, size_t n) { memset(p, 0, n * sizeof(real)); }

// Backward of block l's MLP: d.dresid holds dL/d resid[l+1] on entry, dL/d mid[l] on exit.
static void mlp_block_backward(Model *m, int l, int B, int T) {
    const FoxConfig *c = &m->cfg;
    Acts *a = &m->a;
    Grads *g = &m->d;
    int N = B * T, D = c->d_model, I = c->mlp_hidden;
    real *x = a->mid + lofs(m, l, D, B, T), *xn = a->xn2 + lofs(m, l, D, B, T);
    real *u = a->mlp_u + lofs(m, l, 2 * (size_t)I, B, T), *hh = a->mlp_h + lofs(m, l, I, B, T);
    zero(g->dh, (size_t)N * I);
    zero(g->du, (size_t)N * 2 * I);
    zero(g->dxn, (size_t)N * D);
    matmul_backward(g->dh, grad(m, FOX_P_mlp_out_w, l), g->dresid, hh, param(m, FOX_P_mlp_out_w, l), N, I, D);
    swiglu_backward(g->du, g->dh, u, N, I);
    matmul_backward(g->dxn, grad(m, FOX_P_mlp_in_w, l), g->du, xn, param(m, FOX_P_mlp_in_w, l), N, D, 2 * I);
    NormShape ln = {N, 1, D, D, D, D, FOX_NORM_EPS};
    rmsnorm_backward(g->dresid, grad(m, FOX_P_ln2_w, l), g->dxn, x, a->ln2_rstd + lofs(m, l, 1, B, T),
                     param(m, FOX_P_ln2_w, l), ln);
}

// Backward of block l's attention: d.dresid holds dL/d mid[l] on entry, dL/d resid[l] on exit.
static void attention_block_backward(Model *m, int l, int B, int T) {
    const FoxConfig *c = &m->cfg;
    Acts *a = &m->a;
    Grads *g = &m->d;
    int N = B * T, D = c->d_model, H = c->n_head, Dh = fox_head_dim(c), NIN = m->cols.width;
    AttnCols cl = m->cols;
    SeqShape s = seq_shape(m, B, T, NIN);
    AttnLayer al = attn_layer(m, l, B, T);
    real *x = al.x, *xn = al.xn, *proj = al.proj, *ks = al.ks, *vs = al.vs, *qn = al.qn, *kn = al.kn;
    real *cum = al.cum, *lse = al.lse, *att = al.att, *on = al.on, *z = al.z;
    int has_fg = c->forget_gate != FOX_FG_NONE;

    zero(g->dz, (size_t)N * D);
    zero(g->don, (size_t)N * D);
    zero(g->datt, (size_t)N * D);
    zero(g->dproj, (size_t)N * NIN);
    zero(g->dqn, (size_t)N * D);
    zero(g->dkn, (size_t)N * D);
    zero(g->dks, (size_t)N * D);
    zero(g->dvs, (size_t)N * D);
    zero(g->dcum, (size_t)N * H);
    zero(g->dxn, (size_t)N * D);

    matmul_backward(g->dz, grad(m, FOX_P_attn_out_w, l), g->dresid, z, param(m, FOX_P_attn_out_w, l), N, D, D);
    if (c->output_gate) output_gate_backward(g->don, g->dproj, g->dz, on, proj, cl.g, N, D, NIN);
    else memcpy(g->don, g->dz, (size_t)N * D * sizeof(real));
    if (c->output_norm) {
        NormShape os = {N, H, Dh, D, D, Dh, FOX_NORM_EPS};
        rmsnorm_backward(g->datt, grad(m, FOX_P_onorm_w, l), g->don, att, a->on_rstd + lofs(m, l, H, B, T),
                         param(m, FOX_P_onorm_w, l), os);
    } else {
        memcpy(g->datt, g->don, (size_t)N * D * sizeof(real));
    }
    attention_backward(g->dqn, g->dkn, g->dvs, has_fg ? g->dcum : NULL, g->datt, qn, kn, vs, att, lse,
                       has_fg ? cum : NULL, s);
    if (has_fg)
        forget_gate_backward(g->dproj, grad(m, FOX_P_fgate_b, l), g->dcum, proj, param(m, FOX_P_fgate_b, l),
                             cl.f, c->forget_gate, s);
    if (c->rope) {
        rope_apply(g->dqn, s, c->rope_theta, 1);
        rope_apply(g->dkn, s, c->rope_theta, 1);
    }
    if (c->qk_norm) {
        int wst = c->qk_norm_shared ? 0 : Dh;
        NormShape qs = {N, H, Dh, NIN, D, wst, FOX_QK_NORM_EPS}, kshape = {N, H, Dh, D, D, wst, FOX_QK_NORM_EPS};
        rmsnorm_backward(g->dproj + cl.q, grad(m, FOX_P_qnorm_w, l), g->dqn, proj + cl.q,
                         a->q_rstd + lofs(m, l, H, B, T), param(m, FOX_P_qnorm_w, l), qs);
        rmsnorm_backward(g->dks, grad(m, FOX_P_knorm_w, l), g->dkn, ks, a->k_rstd + lofs(m, l, H, B, T),
                         param(m, FOX_P_knorm_w, l), kshape);
    } else {
        add_columns(g->dproj, g->dqn, cl.q, N, D, NIN);
        memcpy(g->dks, g->dkn, (size_t)N * D * sizeof(real));
    }
    if (c->kv_shift) {
        kv_shift_backward(g->dproj, g->dks, proj, cl.k, cl.ak, s);
        kv_shift_backward(g->dproj, g->dvs, proj, cl.v, cl.av, s);
    } else {
        add_columns(g->dproj, g->dks, cl.k, N, D, NIN);
        add_columns(g->dproj, g->dvs, cl.v, N, D, NIN);
    }
    matmul_backward(g->dxn, grad(m, FOX_P_attn_in_w, l), g->dproj, xn, param(m, FOX_P_attn_in_w, l), N, D, NIN);
    NormShape ln = {N, 1, D, D, D, D, FOX_NORM_EPS};
    rmsnorm_backward(g->dresid, grad(m, FOX_P_ln1_w, l), g->dxn, x, a->ln1_rstd + lofs(m, l, 1, B, T),
                     param(m, FOX_P_ln1_w, l), ln);
}

// Backward of the last model_forward (with targets), adding dloss_scale·∂(mean loss)/∂θ into grads.
static void model_backward(Model *m, const int *inputs, const int *targets, int B, int T, real dloss_scale) {
    const FoxConfig *c = &m->cfg;
    Acts *a = &m->a;
    Grads *g = &m->d;
    int N = B * T, D = c->d_model, V = c->vocab_size, L = c->n_layer;
    crossentropy_backward(a->logits, targets, N, V, dloss_scale / N);
    zero(g->dxn, (size_t)N * D);
    zero(g->dresid, (size_t)N * D);
    matmul_backward(g->dxn, grad(m, FOX_P_lm_head_w, 0), a->logits, a->xnf, param(m, FOX_P_lm_head_w, 0), N, D, V);
    NormShape ln = {N, 1, D, D, D, D, FOX_NORM_EPS};
    rmsnorm_backward(g->dresid, grad(m, FOX_P_lnf_w, 0), g->dxn, a->resid + lofs(m, L, D, B, T), a->lnf_rstd,
                     param(m, FOX_P_lnf_w, 0), ln);
    for (int l = L - 1; l >= 0; l--) {
        mlp_block_backward(m, l, B, T);
        attention_block_backward(m, l, B, T);
    }
    embedding_backward(grad(m, FOX_P_wte, 0), g->dresid, inputs, N, D);
}

// ----------------------------------------------------------------------------
// Optimizer (SPEC §2)

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
    #pragma omp parallel for
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
        #pragma omp parallel for
        for (size_t i = 0; i < p->numel; i++) {
            mm[i] = (real)(o->beta1 * mm[i] + (1.0 - o->beta1) * g[i]);
            vv[i] = (real)(o->beta2 * vv[i] + (1.0 - o->beta2) * g[i] * g[i]);
            double mhat = mm[i] / bc1, vhat = vv[i] / bc2;
            w[i] = (real)(w[i] * decay - lr * mhat / (sqrt(vhat) + o->eps));
        }
    }
}

// Global-norm clipping then AdamW; returns the norm before clipping.
static double optimizer_step(Model *m, const OptConfig *o, double lr, int t) {
    double norm = grad_norm(m->grads, m->lay.total);
    clip_grads(m->grads, m->lay.total, norm, o->grad_clip);
    adamw_update(m, o, lr, t);
    return norm;
}

// ----------------------------------------------------------------------------
// Training run (not part of the test build, which drives the model directly)
#ifndef TESTING

typedef struct {
    int rank, world;
} Dist;

static void dist_init(Dist *d, int *argc, char ***argv) {
    d->rank = 0;
    d->world = 1;
#ifdef FOX_MPI
    if (MPI_Init(argc, argv) != MPI_SUCCESS) fox_fatal("MPI_Init failed");
    if (MPI_Comm_rank(MPI_COMM_WORLD, &d->rank) != MPI_SUCCESS || MPI_Comm_size(MPI_COMM_WORLD, &d->world) != MPI_SUCCESS)
        fox_fatal("MPI_Comm_rank/size failed");
#else
    (void)argc;
    (void)argv;
#endif
}

// Sum of x over ranks, in place (average = caller divides).
static void dist_allreduce_sum(const Dist *d, float *x, size_t n) {
#ifdef FOX_MPI
    if (d->world > 1) {
        for (size_t at = 0; at < n;) {
            int cnt = n - at > (size_t)1 << 30 ? 1 << 30 : (int)(n - at);
            if (MPI_Allreduce(MPI_IN_PLACE, x + at, cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS)
                fox_fatal("MPI_Allreduce failed");
            at += (size_t)cnt;
        }
    }
#else
    (void)d; (void)x; (void)n;
#endif
}

static void dist_allreduce_sum_f64(const Dist *d, double *x, size_t n) {
#ifdef FOX_MPI
    if (d->world > 1 && MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS)
        fox_fatal("MPI_Allreduce failed");
#else
    (void)d; (void)x; (void)n;
#endif
}

static void dist_barrier(const Dist *d) {
#ifdef FOX_MPI
    if (d->world > 1 && MPI_Barrier(MPI_COMM_WORLD) != MPI_SUCCESS) fox_fatal("MPI_Barrier failed");
#else
    (void)d;
#endif
}

static void dist_finalize(void) {
#ifdef FOX_MPI
    MPI_Finalize();
#endif
}

typedef struct {
    FoxArgs args;
    Dist dist;
    Model model;
    OptConfig opt;
    DataLoader train, val;
    int has_val, grad_accum, step;
    long long tokens;
    uint64_t rng;     // counter of the sampling stream
    int *inputs, *targets;
    double *pos_loss; // per-position training loss summed since the last save (SPEC §6 L(i))
    long long pos_loss_seqs;
    int train_seq_len; // --eval-only: the evaluated checkpoint's training context (0 = unknown)
    FILE *log;
} Run;

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

// Checks that every token id is a valid index for the model's vocabulary.
static void check_tokens(const int *ids, size_t n, int vocab, const char *what) {
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab) fox_fatal("%s holds token id %d, outside the vocabulary of %d (set --vocab)", what, ids[i], vocab);
}

// Mean validation loss over up to val_steps batches (averaged across ranks).
static double evaluate(Run *r) {
    int B = r->args.batch, T = r->args.seq_len;
    long long avail = dataloader_num_windows(&r->val) / B;
    int steps = (int)(avail < r->args.val_steps ? avail : r->args.val_steps);
    if (steps < 1) fox_fatal("validation data %s holds fewer than --batch %d sequences of --seq-len %d", r->args.val, B, T);
    dataloader_reset(&r->val);
    double sum = 0.0;
    for (int s = 0; s < steps; s++) {
        dataloader_next(&r->val, r->inputs, r->targets);
        check_tokens(r->inputs, (size_t)B * T, r->model.cfg.vocab_size, r->args.val);
        check_tokens(r->targets, (size_t)B * T, r->model.cfg.vocab_size, r->args.val);
        sum += model_forward(&r->model, r->inputs, r->targets, B, T);
    }
    float mean = (float)(sum / steps);
    dist_allreduce_sum(&r->dist, &mean, 1);
    return mean / r->dist.world;
}

// One optimizer step: grad_accum micro-batches, all-reduce, clip, AdamW. Returns the mean loss.
static double train_step(Run *r, double lr, double *norm_out) {
    Model *m = &r->model;
    int B = r->args.batch, T = r->args.seq_len, N = B * T;
    zero(m->grads, m->lay.total);
    double loss = 0.0;
    for (int micro = 0; micro < r->grad_accum; micro++) {
        dataloader_next(&r->train, r->inputs, r->targets);
        check_tokens(r->inputs, (size_t)N, m->cfg.vocab_size, r->args.train);
        check_tokens(r->targets, (size_t)N, m->cfg.vocab_size, r->args.train);
        loss += model_forward(m, r->inputs, r->targets, B, T) / r->grad_accum;
        for (int n = 0; n < N; n++) r->pos_loss[n % T] += m->a.losses[n];
        r->pos_loss_seqs += B;
        model_backward(m, r->inputs, r->targets, B, T, 1.0f / r->grad_accum);
    }
    if (r->dist.world > 1) {
        dist_allreduce_sum(&r->dist, m->grads, m->lay.total);
        float inv = 1.0f / r->dist.world, l = (float)loss;
        for (size_t i = 0; i < m->lay.total; i++) m->grads[i] *= inv;
        dist_allreduce_sum(&r->dist, &l, 1);
        loss = l * inv;
    }
    *norm_out = optimizer_step(m, &r->opt, lr, r->step + 1);
    return loss;
}

static FoxTrainState run_state(const Run *r) {
    FoxTrainState s;
    memset(&s, 0, sizeof(s));
    s.rank = r->dist.rank;
    s.world = r->dist.world;
    s.step = r->step;
    s.seq_len = r->args.seq_len;
    s.batch = r->args.batch;
    s.tokens = r->tokens;
    s.shard_offset = 0;
    s.shard_count = (long long)r->model.lay.total;
    s.total_batch = (long long)r->grad_accum * r->args.batch * r->args.seq_len * r->dist.world;
    s.loader_bytes = (long long)dataloader_state_bytes(&r->train);
    s.rng = r->rng;
    return s;
}

static void state_path(char *buf, size_t cap, const char *dir, int rank) {
    if (snprintf(buf, cap, "%s/state_%05d.bin", dir, rank) >= (int)cap) fox_fatal("path too long: %s", dir);
}

// Atomic checkpoint (SPEC §5): every rank writes its state into the temporary directory, rank 0
// the weights, then rank 0 renames it into place and prunes old ones.
static void save_checkpoint(Run *r) {
    const char *out = r->args.out;
    char tmp[4096], path[4352];
    if (r->dist.rank == 0) fox_ckpt_begin(out, r->step, tmp, sizeof(tmp));
    dist_barrier(&r->dist);
    fox_ckpt_dir(tmp, sizeof(tmp), out, r->step, 1);
    FoxTrainState s = run_state(r);
    void *loader = fox_malloc((size_t)s.loader_bytes);
    dataloader_save_state(&r->train, loader);
    state_path(path, sizeof(path), tmp, r->dist.rank);
    fox_write_state(path, &s, r->model.m, r->model.v, loader);
    free(loader);
    dist_barrier(&r->dist);
    if (r->dist.rank == 0) {
        snprintf(path, sizeof(path), "%s/model.bin", tmp);
        fox_write_model_bin(path, &r->model.cfg, r->model.params);
        fox_ckpt_commit(out, r->step);
        fox_ckpt_prune(out, r->args.keep);
        printf("checkpoint %s/ckpt_%08d\n", out, r->step);
    }
    dist_barrier(&r->dist);
}

static void load_checkpoint(Run *r, int step) {
    char dir[4096], path[4352];
    fox_ckpt_dir(dir, sizeof(dir), r->args.out, step, 0);
    snprintf(path, sizeof(path), "%s/model.bin", dir);
    fox_read_model_bin(path, &r->model.cfg, r->model.params);
    FoxTrainState s = run_state(r);
    void *loader = fox_malloc((size_t)s.loader_bytes);
    state_path(path, sizeof(path), dir, r->dist.rank);
    fox_read_state(path, &s, r->model.m, r->model.v, loader);
    dataloader_load_state(&r->train, loader, (size_t)s.loader_bytes);
    free(loader);
    r->step = s.step;
    r->tokens = s.tokens;
    r->rng = s.rng;
    if (r->dist.rank == 0) printf("resumed from %s at step %d\n", dir, step);
}

// Saves the mean training loss per position since the last save as OUT/train_loss_pos_SSSSSSSS.npy
// (this rank's sequences; rank 0 writes) and starts a new window.
static void save_train_pos_loss(Run *r) {
    int T = r->args.seq_len;
    if (r->dist.rank == 0 && r->pos_loss_seqs > 0) {
        char path[4352];
        snprintf(path, sizeof(path), "%s/train_loss_pos_%08d.npy", r->args.out, r->step);
        for (int t = 0; t < T; t++) r->pos_loss[t] /= (double)r->pos_loss_seqs;
        fox_write_npy_f64(path, r->pos_loss, (size_t)T);
    }
    memset(r->pos_loss, 0, (size_t)T * sizeof(double));
    r->pos_loss_seqs = 0;
}

static void log_json(Run *r, const char *fmt, ...) {
    if (!r->log) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(r->log, fmt, ap);
    va_end(ap);
    fputc('\n', r->log);
    if (fflush(r->log)) fox_fatal("cannot write %s/log.jsonl", r->args.out);
}

// Greedy (top_k = 1) or top-k sampling of n tokens after an EOT prompt, recomputing the full
// forward per token (the CPU reference keeps no KV cache).
static void sample_tokens(Run *r, int *out, int n) {
    Model *m = &r->model;
    int T = m->T < n + 1 ? m->T : n + 1, V = m->cfg.vocab_size, k = r->args.top_k < 1 ? 1 : r->args.top_k;
    int *ctx = fox_calloc((size_t)T, sizeof(int));
    int *best = fox_calloc((size_t)k, sizeof(int));
    ctx[0] = FOX_EOT < V ? FOX_EOT : 0;
    int len = 1;
    for (int i = 0; i < n; i++) {
        int start = len < T ? 0 : len - T + 1, cur = len - start;
        if (start) memmove(ctx, ctx + 1, (size_t)(T - 1) * sizeof(int)), len--, cur = len;
        model_forward(m, ctx, NULL, 1, cur);
        const float *z = m->a.logits + (size_t)(cur - 1) * V;
        int nb = 0;  // indices of the k largest logits, by insertion
        for (int v = 0; v < V; v++) {
            int at = nb < k ? nb++ : k;
            if (at == k && z[v] <= z[best[k - 1]]) continue;
            if (at == k) at = k - 1;
            while (at > 0 && z[best[at - 1]] < z[v]) { best[at] = best[at - 1]; at--; }
            best[at] = v;
        }
        double total = 0.0;
        for (int j = 0; j < nb; j++) total += exp((double)(z[best[j]] - z[best[0]]));
        double u = fox_rng_uniform(fox_rng_key((uint64_t)r->args.seed, FOX_STREAM_SAMPLE), r->rng++) * total;
        int pick = best[0];
        for (int j = 0; j < nb; j++) {
            u -= exp((double)(z[best[j]] - z[best[0]]));
            if (u < 0) { pick = best[j]; break; }
        }
        out[i] = pick;
        ctx[len++] = pick;
    }
    free(ctx);
    free(best);
}

static void print_sample(Run *r) {
    int n = r->args.sample_tokens;
    int *ids = fox_calloc((size_t)n, sizeof(int));
    sample_tokens(r, ids, n);
    Tokenizer tok;
    if (r->model.cfg.vocab_size == FOX_VOCAB_GPT2 && tokenizer_load(&tok, r->args.tokenizer)) {
        size_t len;
        char *text = tokenizer_decode(&tok, ids, (size_t)n, &len);
        printf("sample: %.*s\n", (int)len, text);
        free(text);
        tokenizer_free(&tok);
    } else {
        printf("sample ids:");
        for (int i = 0; i < n; i++) printf(" %d", ids[i]);
        printf("\n");
    }
    free(ids);
}

// Sets up the run from its arguments: model, optimizer, data, resume.
static void run_init(Run *r, int argc, char **argv) {
    memset(r, 0, sizeof(*r));
    dist_init(&r->dist, &argc, &argv);
    fox_args_parse(&r->args, argc, argv);
    FoxArgs *a = &r->args;
    FoxConfig cfg = fox_args_config(a);
    if (a->seq_len < 1 || a->batch < 1 || a->steps < 1) fox_fatal("--seq-len, --batch and --steps must be positive");
    if (a->keep < 1) fox_fatal("--keep must be at least 1");
    if (a->resume && !a->out[0]) fox_fatal("--resume needs --out");
    long long per_micro = (long long)a->batch * a->seq_len * r->dist.world;
    long long total = a->total_batch_tokens ? a->total_batch_tokens : per_micro;
    if (total % per_micro) fox_fatal("--total-batch-tokens %lld is not a multiple of batch*seq-len*ranks = %lld", total, per_micro);
    r->grad_accum = (int)(total / per_micro);
    r->opt = (OptConfig){a->lr, a->min_lr, a->weight_decay, a->grad_clip, 0.9, 0.95, 1e-8,
                         (int)((a->warmup_tokens + total - 1) / total), a->steps};
    if (r->opt.warmup_steps < 1) r->opt.warmup_steps = 1;
    // Data first: a bad path or a --seq-len beyond the data fails before any large allocation.
    dataloader_init(&r->train, a->train, a->batch, a->seq_len, r->dist.rank, r->dist.world, (uint64_t)a->seed, 1);
    r->has_val = a->val[0] != 0;
    if (r->has_val) dataloader_init(&r->val, a->val, a->batch, a->seq_len, r->dist.rank, r->dist.world, (uint64_t)a->seed, 0);
    model_init(&r->model, &cfg, a->batch, a->seq_len, (uint64_t)a->seed);
    if (a->init[0]) fox_read_model_bin(a->init, &cfg, r->model.params);
    r->inputs = fox_calloc((size_t)a->batch * a->seq_len, sizeof(int));
    r->targets = fox_calloc((size_t)a->batch * a->seq_len, sizeof(int));
    r->pos_loss = fox_calloc((size_t)a->seq_len, sizeof(double));
    if (a->resume) {
        int latest = fox_ckpt_latest(a->out);
        if (latest >= 0) load_checkpoint(r, latest);
        else if (r->dist.rank == 0) printf("no checkpoint in %s: starting fresh\n", a->out);
    }
    if (a->out[0] && r->dist.rank == 0) {
        fox_mkdir_p(a->out);
        char path[4352];
        snprintf(path, sizeof(path), "%s/log.jsonl", a->out);
        r->log = fox_fopen(path, r->step ? "a" : "w");
    }
}

// Path of the weights --eval-only reads: --init, else the newest checkpoint's model.bin in --out.
// Returns the training context of that checkpoint (0 when unknown, as for --init).
static int eval_weights_path(const FoxArgs *a, char *path, size_t cap) {
    if (a->init[0]) { snprintf(path, cap, "%s", a->init); return 0; }
    int latest = fox_ckpt_latest(a->out);
    if (latest < 0) fox_fatal("--eval-only needs --init PATH or a checkpoint in --out %s", a->out);
    char dir[4096];
    fox_ckpt_dir(dir, sizeof(dir), a->out, latest, 0);
    if (snprintf(path, cap, "%s/state_00000.bin", dir) >= (int)cap) fox_fatal("path too long: %s", dir);
    int train_T = fox_state_seq_len(path);
    snprintf(path, cap, "%s/model.bin", dir);
    return train_T;
}

// Sets up --eval-only: the model takes the checkpoint's own config; one sequence per forward.
static void eval_init(Run *r, int argc, char **argv) {
    memset(r, 0, sizeof(*r));
    dist_init(&r->dist, &argc, &argv);
    fox_args_parse(&r->args, argc, argv);
    FoxArgs *a = &r->args;
    if (!a->out[0]) fox_fatal("--eval-only needs --out (where per_token_loss.npy and .json go)");
    if (!a->val[0]) fox_fatal("--eval-only needs --val");
    if (a->eval_seqs < 1) fox_fatal("--eval-seqs must be positive");
    int T = a->eval_seq_len ? a->eval_seq_len : a->seq_len;
    if (T < 1) fox_fatal("--eval-seq-len must be positive");
    char path[4352];
    r->train_seq_len = eval_weights_path(a, path, sizeof(path));
    FoxConfig cfg = fox_read_model_config(path);
    dataloader_init(&r->val, a->val, 1, T, r->dist.rank, r->dist.world, (uint64_t)a->seed, 0);
    r->has_val = 1;
    model_init(&r->model, &cfg, 1, T, (uint64_t)a->seed);
    fox_read_model_bin(path, &cfg, r->model.params);
    r->inputs = fox_calloc((size_t)T, sizeof(int));
    r->targets = fox_calloc((size_t)T, sizeof(int));
    r->pos_loss = fox_calloc((size_t)T, sizeof(double));
    if (r->dist.rank == 0) printf("evaluating %s (%zu parameters) at context %d\n", path, r->model.lay.total, T);
}

// SPEC §6: L(i) = mean over sequences of the loss at position i (float64 sums, memory independent
// of the number of sequences), P(l) = exp(mean_{i<l} L(i)); written as OUT/per_token_loss.npy and
// OUT/per_token_loss.json (P at l = 512, 1024, 2048, ... and at the full context).
static void eval_per_token(Run *r) {
    FoxArgs *a = &r->args;
    int T = r->model.T;
    long long avail = dataloader_num_windows(&r->val);
    long long mine = (a->eval_seqs - r->dist.rank + r->dist.world - 1) / r->dist.world;
    if (mine > avail) mine = avail;
    double t0 = now_seconds(), count = (double)mine;
    for (long long s = 0; s < mine; s++) {
        dataloader_next(&r->val, r->inputs, r->targets);
        check_tokens(r->inputs, (size_t)T, r->model.cfg.vocab_size, a->val);
        check_tokens(r->targets, (size_t)T, r->model.cfg.vocab_size, a->val);
        model_forward(&r->model, r->inputs, r->targets, 1, T);
        for (int t = 0; t < T; t++) r->pos_loss[t] += r->model.a.losses[t];
    }
    dist_allreduce_sum_f64(&r->dist, r->pos_loss, (size_t)T);
    dist_allreduce_sum_f64(&r->dist, &count, 1);
    if (count < 1) fox_fatal("%s holds no sequence of %d tokens", a->val, T);
    if (r->dist.rank) return;
    double mean = 0.0;
    for (int t = 0; t < T; t++) { r->pos_loss[t] /= count; mean += r->pos_loss[t]; }
    mean /= T;
    char path[4352];
    snprintf(path, sizeof(path), "%s/per_token_loss.npy", a->out);
    fox_mkdir_p(a->out);
    fox_write_npy_f64(path, r->pos_loss, (size_t)T);
    snprintf(path, sizeof(path), "%s/per_token_loss.json.tmp", a->out);
    FILE *f = fox_fopen(path, "w");
    fprintf(f, "{\"eval_seq_len\": %d, ", T);
    if (r->train_seq_len) fprintf(f, "\"train_seq_len\": %d, ", r->train_seq_len);
    fprintf(f, "\"n_seqs\": %.0f, \"mean_loss\": %.10g, \"P\": {", count, mean);
    printf("%.0f sequences of %d tokens in %.1f s: mean loss %.6f\n%10s %12s\n", count, T, now_seconds() - t0, mean, "l", "P(l)");
    double prefix = 0.0;
    int next = 512, first = 1;
    for (int t = 0; t < T; t++) {
        prefix += r->pos_loss[t];
        int l = t + 1;
        if (l != next && l != T) continue;
        double P = exp(prefix / l);
        fprintf(f, "%s\"%d\": %.10g", first ? "" : ", ", l, P);
        printf("%10d %12.4f\n", l, P);
        first = 0;
        if (l == next) next *= 2;
    }
    fprintf(f, "}}\n");
    fox_fclose_synced(f, path);
    char final[4352];
    snprintf(final, sizeof(final), "%s/per_token_loss.json", a->out);
    if (rename(path, final)) fox_fatal("cannot rename %s: %s", path, strerror(errno));
    printf("wrote %s/per_token_loss.npy and per_token_loss.json\n", a->out);
}

static void run_free(Run *r) {
    model_free(&r->model);
    if (!r->args.eval_only) dataloader_free(&r->train);
    if (r->has_val) dataloader_free(&r->val);
    free(r->inputs);
    free(r->targets);
    free(r->pos_loss);
    if (r->log && fclose(r->log)) fox_fatal("cannot close the log");
}

static void train(Run *r) {
    FoxArgs *a = &r->args;
    Model *m = &r->model;
    long long step_tokens = (long long)r->grad_accum * a->batch * a->seq_len * r->dist.world;
    double flops_per_token = fox_flops_per_token(&m->cfg, a->seq_len);
    if (r->dist.rank == 0)
        printf("model %s: %zu parameters (%.2fM non-embedding), %d layers, d_model %d, %d heads, mlp %d | "
               "%lld tokens/step = %d x %d x %d accum x %d ranks, warmup %d steps\n",
               a->model, m->lay.total, fox_mfu_params(&m->cfg) / 1e6, m->cfg.n_layer, m->cfg.d_model,
               m->cfg.n_head, m->cfg.mlp_hidden, step_tokens, a->batch, a->seq_len, r->grad_accum,
               r->dist.world, r->opt.warmup_steps);
    while (r->step < a->steps) {
        double t0 = now_seconds(), norm, lr = lr_at(&r->opt, r->step);
        double loss = train_step(r, lr, &norm);
        r->step++;
        r->tokens += step_tokens;
        double dt = now_seconds() - t0, tps = step_tokens / dt;
        if (r->dist.rank == 0 && (r->step % a->log_every == 0 || r->step == a->steps)) {
            printf("step %5d/%d | loss %.6f | lr %.3e | norm %.4f | %.1f ms | %.0f tok/s | %.2f GFLOP/s\n", r->step,
                   a->steps, loss, lr, norm, dt * 1e3, tps, tps * flops_per_token / 1e9);
            log_json(r, "{\"step\": %d, \"loss\": %.17g, \"lr\": %.7g, \"grad_norm\": %.17g, \"ms\": %.3f, "
                        "\"tokens_per_s\": %.1f, \"tokens\": %lld}",
                     r->step, loss, lr, norm, dt * 1e3, tps, r->tokens);
        }
        if (r->has_val && a->eval_every > 0 && (r->step % a->eval_every == 0 || r->step == a->steps)) {
            double vl = evaluate(r);
            if (r->dist.rank == 0) {
                printf("step %5d | val loss %.6f\n", r->step, vl);
                log_json(r, "{\"step\": %d, \"val_loss\": %.17g}", r->step, vl);
            }
        }
        if (a->out[0] && ((a->ckpt_every > 0 && r->step % a->ckpt_every == 0) || r->step == a->steps)) {
            save_train_pos_loss(r);
            save_checkpoint(r);
        }
    }
}

// --eval-only is read before the full parse, which the chosen init repeats.
static int wants_eval_only(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--eval-only") || !strcmp(argv[i], "--eval-only=1") || !strcmp(argv[i], "--eval-only=on")) return 1;
    return 0;
}

int main(int argc, char **argv) {
    Run r;
    setvbuf(stdout, NULL, _IOLBF, 0);  // progress lines show up promptly under tee and mpirun
    if (wants_eval_only(argc, argv)) {
        eval_init(&r, argc, argv);
        eval_per_token(&r);
    } else {
        run_init(&r, argc, argv);
        train(&r);
        if (r.dist.rank == 0 && r.args.sample_tokens > 0) print_sample(&r);
    }
    run_free(&r);
    dist_finalize();
    return 0;
}
#endif
