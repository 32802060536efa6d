// dev/cuda/power.cu: the power the GPU draws while its SMs stream loads from one level of the memory hierarchy
// (L1, L2, DRAM), against the idle GPU: what a byte moved costs in energy at each level, which decides what a
// kernel saves by moving fewer (dev/perf_history/2026-11-27.md "Where the step's energy goes"). Each level is held for SECONDS
// after a second of warm-up; the GPU's energy counter and SM clock come from NVML (libnvidia-ml, the
// driver's, opened at run time).
//   make power && ./power [SECONDS]   (default 3)
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <cuda_runtime.h>
#include "../../fox/cuda_common.cuh"
#include "held.h"  // wall_s

// NVML's three calls this needs, by name (no NVML header or library at build time).
struct Nvml {
    void *device;
    int (*energy_mj)(void *, unsigned long long *);  // nvmlDeviceGetTotalEnergyConsumption
    int (*clock_mhz)(void *, int, unsigned *);        // nvmlDeviceGetClockInfo
};

static Nvml nvml_open(void) {
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "power: NVML (libnvidia-ml.so.1) did not load: %s\n", dlerror());
        exit(1);
    }
    int (*init)(void) = (int (*)(void))dlsym(lib, "nvmlInit_v2");
    int (*handle)(unsigned, void **) = (int (*)(unsigned, void **))dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
    Nvml n;
    n.energy_mj = (int (*)(void *, unsigned long long *))dlsym(lib, "nvmlDeviceGetTotalEnergyConsumption");
    n.clock_mhz = (int (*)(void *, int, unsigned *))dlsym(lib, "nvmlDeviceGetClockInfo");
    int dev = 0;
    FOX_CUDA_CHECK(cudaGetDevice(&dev));
    if (!init || !handle || !n.energy_mj || !n.clock_mhz || init() != 0 || handle((unsigned)dev, &n.device) != 0) {
        fprintf(stderr, "power: NVML has no energy counter for GPU %d\n", dev);
        exit(1);
    }
    return n;
}

static double energy_j(const Nvml &n) {
    unsigned long long mj = 0;
    if (n.energy_mj(n.device, &mj) != 0) {
        fprintf(stderr, "power: nvmlDeviceGetTotalEnergyConsumption failed\n");
        exit(1);
    }
    return mj * 1e-3;
}

// Each thread sums ITERS x 8 16-byte loads strided over the grid, wrapping inside the first mask + 1 float4s;
// L2: ld.global.cg (L1 bypassed); L1: ld.global.ca over a span that fits it. The sum is never 0.5 (the inputs are
// zeros), so the store only keeps the loads alive.
constexpr int ITERS = 256, THREADS = 256, BLOCKS_PER_SM = 8;
__global__ void stream_loads(const float4 *__restrict__ x, size_t mask, bool l2, float *out) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    float a = 0.f;
    for (int it = 0; it < ITERS; it++) {
        float4 v[8];
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const size_t j = (i + (size_t)(it * 8 + k) * stride) & mask;
            v[k] = l2 ? __ldcg(x + j) : __ldca(x + j);
        }
#pragma unroll
        for (int k = 0; k < 8; k++) a += v[k].x + v[k].y + v[k].z + v[k].w;
    }
    if (a == 0.5f) *out = a;
}

struct Level {
    const char *name;
    size_t bytes;  // the span read (a power of two); 0: the GPU idle
    bool l2;
};

// Watts drawn over `seconds` of level lv (after one second of it), its load rate (bytes/s) and mean SM clock.
static double hold(const Nvml &n, const Level &lv, const float4 *x, float *out, double seconds, double *rate, double *mhz) {
    const int blocks = fox_sm_count() * BLOCKS_PER_SM;
    const double bytes_per_launch = (double)blocks * THREADS * ITERS * 8 * 16;
    cudaEvent_t a, b;
    FOX_CUDA_CHECK(cudaEventCreate(&a));
    FOX_CUDA_CHECK(cudaEventCreate(&b));
    double joules = 0, busy_ms = 0, clock_sum = 0, t_total = 0;
    long launches = 0, clocks = 0;
    for (int pass = 0; pass < 2; pass++) {  // 0: warm-up (1 s), 1: measured
        const double len = pass ? seconds : 1.0, e0 = energy_j(n), t0 = wall_s();
        while (wall_s() - t0 < len) {
            if (!lv.bytes) {
                struct timespec nap = {0, 50 * 1000 * 1000};
                nanosleep(&nap, NULL);
                continue;
            }
            FOX_CUDA_CHECK(cudaEventRecord(a));
            for (int r = 0; r < 10; r++) stream_loads<<<blocks, THREADS>>>(x, lv.bytes / 16 - 1, lv.l2, out);
            FOX_LAUNCH_CHECK();
            FOX_CUDA_CHECK(cudaEventRecord(b));
            FOX_CUDA_CHECK(cudaEventSynchronize(b));
            float ms;
            FOX_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
            unsigned c = 0;
            if (pass && n.clock_mhz(n.device, 1, &c) == 0) clock_sum += c, clocks++;  // 1: NVML_CLOCK_SM
            if (pass) busy_ms += ms, launches += 10;
        }
        if (pass) joules = energy_j(n) - e0, t_total = wall_s() - t0;
    }
    FOX_CUDA_CHECK(cudaEventDestroy(a));
    FOX_CUDA_CHECK(cudaEventDestroy(b));
    *rate = busy_ms > 0 ? launches * bytes_per_launch / (busy_ms * 1e-3) : 0;
    *mhz = clocks ? clock_sum / clocks : 0;
    return joules / t_total;
}

int main(int argc, char **argv) {
    const double seconds = argc > 1 ? atof(argv[1]) : 3.0;
    if (!(seconds > 0 && seconds <= 60)) {
        fprintf(stderr, "usage: ./power [SECONDS]   (0 < SECONDS <= 60)\n");
        return 2;
    }
    const Nvml n = nvml_open();
    cudaDeviceProp prop;
    int dev = 0;
    FOX_CUDA_CHECK(cudaGetDevice(&dev));
    FOX_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    const size_t dram = (size_t)1 << 31;
    float4 *x;
    float *out;
    FOX_CUDA_CHECK(cudaMalloc(&x, dram));
    FOX_CUDA_CHECK(cudaMemset(x, 0, dram));
    FOX_CUDA_CHECK(cudaMalloc(&out, sizeof(float)));
    const Level levels[] = {{"idle", 0, false},
                            {"L1 (64 KiB, ld.ca)", (size_t)64 << 10, false},
                            {"L2 (8 MiB, ld.cg)", (size_t)8 << 20, true},
                            {"L2 (16 MiB, ld.cg)", (size_t)16 << 20, true},
                            {"DRAM (2 GiB, ld.cg)", dram, true}};
    printf("%s (L2 %d MiB), each level %.1f s after 1 s of warm-up\n", prop.name, prop.l2CacheSize >> 20, seconds);
    printf("%-22s %8s %10s %8s %14s\n", "level", "W", "GB/s", "SM MHz", "pJ/byte (all)");
    for (const Level &lv : levels) {
        double rate, mhz;
        const double w = hold(n, lv, x, out, seconds, &rate, &mhz);
        if (!lv.bytes) printf("%-22s %8.1f\n", lv.name, w);
        else printf("%-22s %8.1f %10.0f %8.0f %14.1f\n", lv.name, w, rate * 1e-9, mhz, w / rate * 1e12);
    }
    FOX_CUDA_CHECK(cudaFree(x));
    FOX_CUDA_CHECK(cudaFree(out));
    return 0;
}
