// fox/rng.h: the one random-number definition shared by C, CUDA and Python (train_fox.py
// re-implements these few lines in numpy and test_foxcu checks both give the same weights).
// Counter-based: element i of stream s under seed k is a pure function of (k, s, i), so any
// element can be drawn independently (in parallel on a GPU, or vectorised in numpy).
#ifndef FOX_RNG_H
#define FOX_RNG_H

#include <stdint.h>
#include <math.h>

#ifdef __CUDACC__
#define FOX_HD __host__ __device__
#else
#define FOX_HD
#endif

// splitmix64's finaliser (Steele, Lea, Flood 2014).
static inline FOX_HD uint64_t fox_mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// The key of stream `stream` under `seed`.
static inline FOX_HD uint64_t fox_rng_key(uint64_t seed, uint64_t stream) {
    return fox_mix64(seed ^ fox_mix64(stream));
}

// 64 random bits, the i-th of a stream.
static inline FOX_HD uint64_t fox_rng_bits(uint64_t key, uint64_t i) { return fox_mix64(key + i); }

// Uniform double in [0, 1) from the top 53 bits.
static inline FOX_HD double fox_rng_uniform(uint64_t key, uint64_t i) {
    return (double)(fox_rng_bits(key, i) >> 11) * (1.0 / 9007199254740992.0);
}

// Standard normal, the i-th of a stream: Box-Muller on the uniforms 2i and 2i+1, in double.
static inline FOX_HD double fox_rng_normal(uint64_t key, uint64_t i) {
    double u1 = ((double)(fox_rng_bits(key, 2 * i) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
    double u2 = (double)(fox_rng_bits(key, 2 * i + 1) >> 11) * (1.0 / 9007199254740992.0);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

// Uniform integer in [0, n) (n > 0), the i-th of a stream; Lemire's multiply-shift (bias < n/2^64).
static inline FOX_HD uint64_t fox_rng_below(uint64_t key, uint64_t i, uint64_t n) {
    return (uint64_t)(((unsigned __int128)fox_rng_bits(key, i) * n) >> 64);
}

// Stream ids: parameter tensors use their index in FOX_PARAMS; the others are named here.
#define FOX_STREAM_DATA 1000
#define FOX_STREAM_SAMPLE 1001
#define FOX_STREAM_FIXTURE 1002
#define FOX_STREAM_MQAR 1003
#define FOX_STREAM_PASSKEY 1004
#define FOX_STREAM_PASSKEY_DATA 1005

#endif
