// dev/cuda/held.h: timing held at the power cap, shared by the dev programs that measure it (attention_ref.h's
// FOX_BENCH_SUSTAIN, gemm.cu's SECONDS, power.cu): work run back to back for seconds, after half a second of
// warm-up, so that the GPU's clock has settled where its power cap holds it (dev/perf_history/2026-11-27.md "The attention kernels
// under sustained load, at the power cap"); short bursts run at the full clock instead.
#ifndef FOX_HELD_H
#define FOX_HELD_H

#include <time.h>  // clock_gettime

#include "../../fox/cuda_common.cuh"  // FOX_CUDA_CHECK

static double wall_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

// Mean ms of f over `seconds` of calls back to back on stream s (after half a second of them unmeasured), by
// events around the whole run.
template <class F> static double held_ms(F f, double seconds, cudaStream_t s = 0) {
    for (const double t0 = wall_s(); wall_s() - t0 < 0.5;) f();
    cudaEvent_t e0, e1;
    FOX_CUDA_CHECK(cudaEventCreate(&e0));
    FOX_CUDA_CHECK(cudaEventCreate(&e1));
    long n = 0;
    FOX_CUDA_CHECK(cudaEventRecord(e0, s));
    for (const double t0 = wall_s(); wall_s() - t0 < seconds; n++) f();
    FOX_CUDA_CHECK(cudaEventRecord(e1, s));
    FOX_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms;
    FOX_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    FOX_CUDA_CHECK(cudaEventDestroy(e0));
    FOX_CUDA_CHECK(cudaEventDestroy(e1));
    return ms / n;
}

#endif  // FOX_HELD_H
