// fox/sample.h: the draw of the next token in generation (docs/model.md §7): temperature, top-k (1: the
// argmax, deterministic), top-p, from one uniform number, in a fixed order so a seed repeats a sample.
#ifndef FOX_SAMPLE_H
#define FOX_SAMPLE_H

#include <math.h>
#include <stdlib.h>

// The draw of one token: from softmax(z / temperature) restricted to the top_k largest (0: all), then to
// the fewest of those holding top_p of their probability.
typedef struct {
    double temperature, top_p;
    int top_k;
    int *idx;     // (V) scratch: candidate token ids
    double *p;    // (V) scratch: unnormalised probabilities
} Sampler;

static const double *sampler_p;  // the probabilities qsort's comparison reads

// Descending probability, ties by ascending id (a fixed order).
static int by_probability(const void *a, const void *b) {
    int i = *(const int *)a, j = *(const int *)b;
    if (sampler_p[i] != sampler_p[j]) return sampler_p[i] < sampler_p[j] ? 1 : -1;
    return (i > j) - (i < j);
}

// Whether token i comes before token j in by_probability's order.
static int comes_before(const double *p, int i, int j) { return p[i] != p[j] ? p[i] > p[j] : i < j; }

// Restores the heap h[0..k) below position at: every parent comes after its children (the root is the last).
static void sift_down(int *h, int k, int at, const double *p) {
    for (;;) {
        int l = 2 * at + 1, r = l + 1, last = at;
        if (l < k && comes_before(p, h[last], h[l])) last = l;
        if (r < k && comes_before(p, h[last], h[r])) last = r;
        if (last == at) return;
        int t = h[at];
        h[at] = h[last];
        h[last] = t;
        at = last;
    }
}

// Moves the first k of idx[0..n) in by_probability's order to idx[0..k), in no order: O(n log k), where
// sorting all n for top-k would cost a full vocabulary's sort at every step.
static void select_first_k(int *idx, int n, int k, const double *p) {
    for (int i = k / 2 - 1; i >= 0; i--) sift_down(idx, k, i, p);
    for (int j = k; j < n; j++)
        if (comes_before(p, idx[j], idx[0])) {
            idx[0] = idx[j];
            sift_down(idx, k, 0, p);
        }
}

static int argmax(const float *z, int V) {
    int best = 0;
    for (int v = 1; v < V; v++)
        if (z[v] > z[best]) best = v;
    return best;
}

// Token drawn from logits z with the uniform u in [0, 1); top_k 1 is the argmax (no randomness).
static int sample_token(Sampler *s, const float *z, int V, double u) {
    if (s->top_k == 1) return argmax(z, V);
    double mx = z[argmax(z, V)], total = 0.0;
    for (int v = 0; v < V; v++) total += s->p[v] = exp(((double)z[v] - mx) / s->temperature);
    // Tokens below (1 - top_p)·total/V together hold less than 1 - top_p of the mass, so no nucleus
    // needs them: only the rest are sorted.
    double floor_p = s->top_p < 1.0 ? (1.0 - s->top_p) * total / V : 0.0;
    int n = 0, k = s->top_k > 0 && s->top_k < V ? s->top_k : V;
    for (int v = 0; v < V; v++)
        if (k < V || s->p[v] >= floor_p) s->idx[n++] = v;
    if (k < n || s->top_p < 1.0) {
        if (k < n) {
            select_first_k(s->idx, n, k, s->p);
            n = k;
        }
        sampler_p = s->p;
        qsort(s->idx, (size_t)n, sizeof(int), by_probability);
    }
    double mass = 0.0;
    for (int j = 0; j < n; j++) mass += s->p[s->idx[j]];
    if (s->top_p < 1.0) {
        double keep = 0.0, need = s->top_p * mass;
        int j = 0;
        while (j < n && keep < need) keep += s->p[s->idx[j++]];
        n = j;
        mass = keep;
    }
    u *= mass;
    for (int j = 0; j < n; j++) {
        u -= s->p[s->idx[j]];
        if (u < 0) return s->idx[j];
    }
    return s->idx[n - 1];
}

#endif  // FOX_SAMPLE_H
