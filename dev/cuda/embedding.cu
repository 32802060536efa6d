// dev/cuda/embedding.cu: checks the embedding backward of fox/embedding.cuh (dwte[token] += Σ dres over the
// token's positions, in position order) against an fp64 CPU reference and bitwise against version 1, then
// times both, with the tables fox_embedding_buckets makes for the trainer (buckets largest first).
//   version 1 (until 2026-11-27): a block of 256 threads a bucket, a thread its columns one after another,
//     one row's load at a time: the most frequent token's block (hundreds of rows) was the kernel's tail
//     (0.9 ms of a 760M step, dev/cuda/timeline).
//   version 2 (fox/embedding.cuh): a block a bucket's 128 columns, 16 rows' loads in flight, the same adds in
//     the same order.
// Tokens: uniform over the vocabulary, and Zipf-distributed (s = 1: the most frequent token ~8% of the
// positions, as in text).
//   make embedding && ./embedding
#include "kcheck.h"
#include "../../fox/embedding.cuh"     // fox_embedding_buckets, fox_embedding_backward

// ---- version 1, as the product had it
__global__ void embedding_backward_v1(float *dwte, const float *dres, const int *bucket_token, const int *start,
                                      const int *pos, int D) {
    int b = blockIdx.x;
    float *row = dwte + (size_t)bucket_token[b] * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float acc = 0.0f;
        for (int j = start[b]; j < start[b + 1]; j++) acc += dres[(size_t)pos[j] * D + d];
        row[d] += acc;
    }
}

// fox_embedding_buckets' tables (the trainer's) for these tokens; returns the bucket count.
static int make_buckets(std::vector<int> &tab, const std::vector<int> &tokens, int V) {
    const int N = (int)tokens.size();
    std::vector<int> count(V), fill(V);
    std::vector<uint64_t> key(N);
    tab.assign(3 * (size_t)N + 1, 0);
    return fox_embedding_buckets(tab.data(), key.data(), count.data(), fill.data(), tokens.data(), N, V);
}

static std::vector<int> zipf_tokens(int N, int V) {
    std::vector<double> cdf(V);
    double s = 0.0;
    for (int v = 0; v < V; v++) cdf[v] = s += 1.0 / (v + 1);
    std::vector<int> t(N);
    for (int n = 0; n < N; n++) {
        const double u = urand() * s;
        t[n] = (int)(std::lower_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
        if (t[n] >= V) t[n] = V - 1;
    }
    return t;
}

static void run(int N, int V, int D, bool zipf) {
    std::string shape = fmt("N=%d V=%d D=%d %s", N, V, D, zipf ? "zipf" : "uniform");
    printf("embedding %s\n", shape.c_str());
    std::vector<int> tokens = zipf ? zipf_tokens(N, V) : std::vector<int>(N);
    if (!zipf)
        for (int n = 0; n < N; n++) tokens[n] = (int)(urand() * V);
    std::vector<int> tab;
    const int nb = make_buckets(tab, tokens, V);
    const int *htab = tab.data();
    int most = 0;
    for (int b = 0; b < nb; b++) most = std::max(most, htab[N + b + 1] - htab[N + b]);
    printf("    %d tokens, the most frequent at %d positions\n", nb, most);
    std::vector<float> dres = rand_f32((size_t)N * D, -1, 1), w0 = rand_f32((size_t)V * D, -1, 1);
    std::vector<double> ref(w0.begin(), w0.end());
    for (int n = 0; n < N; n++)
        for (int d = 0; d < D; d++) ref[(size_t)tokens[n] * D + d] += dres[(size_t)n * D + d];
    float *d_dres = to_device(dres), *d_w = to_device(w0), *d_w1 = to_device(w0);
    int *d_tab = to_device(tab);
    const int *d_token = d_tab, *d_start = d_tab + N, *d_pos = d_tab + 2 * N + 1;
    Group g;
    fox_embedding_backward(d_w, d_dres, d_tab, nb, N, D, 0);
    embedding_backward_v1<<<nb, 256>>>(d_w1, d_dres, d_token, d_start, d_pos, D);
    FOX_LAUNCH_CHECK();
    check_f32(g, "dwte", d_w, ref, TOL_F32_RED);
    const bool same = to_host(d_w, (size_t)V * D) == to_host(d_w1, (size_t)V * D);
    printf("    %-14s %s\n", "= version 1's", same ? "bitwise ok" : "FAIL");
    if (!same) g.ok = false, kc_failures++;
    // bytes: dres read once, each touched row of dwte read and written
    const double bytes = (double)N * D * 4 + 2.0 * nb * D * 4;
    summary("embedding", "bwd", shape, g, time_ms([&] { fox_embedding_backward(d_w, d_dres, d_tab, nb, N, D, 0); }), bytes);
    summary("embedding", "v1 bwd", shape, g, time_ms([&] {
                embedding_backward_v1<<<nb, 256>>>(d_w1, d_dres, d_token, d_start, d_pos, D);
            }), bytes);
    cudaFree(d_dres);
    cudaFree(d_w);
    cudaFree(d_w1);
    cudaFree(d_tab);
}

int main() {
    print_device();
    run(1, 10, 64, false);
    run(100, 7, 70, false);   // few tokens, many positions each; D not a multiple of the block's columns
    run(1000, 50304, 768, true);
    run(16384, 50304, 768, false);  // 125M
    run(16384, 50304, 768, true);
    run(16384, 50304, 1536, true);  // 760M
    return kc_finish("embedding");
}
