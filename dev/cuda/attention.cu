// dev/cuda/attention.cu: checks the public API of fox/attention.cuh (Forgetting Attention forward, and
// backward deterministic and not) against the fp64 CPU reference at 14 shapes (d_h 64 and 128, odd T,
// with and without ACP pruning; poisoned outputs, bitwise repeats), then times it.
//   make attention && ./attention        (./attention check | ./attention bench for one half)
// The kernel versions behind the API, and the experiments beside them, are attention_forward.cu and
// attention_backward.cu; their measurements are in NOTES.md.
#include "attention_ref.h"  // reference, checks, timing; includes fox/attention.cuh

struct ApiBwd {
    const char *name;
    BwdFn fn64, fn128;
    bool nondet;
};
static const ApiBwd api_bwd[] = {
    {"api, deterministic", api_backward<64, 1>, api_backward<128, 1>, false},
    {"api, nondeterministic (fp32 atomics in arrival order)", api_backward<64, 0>, api_backward<128, 0>, true},
};

static bool run_checks() {
    bool all = true;
    for (const Shape &s : check_shapes) {
        print_shape(s);
        Problem p = make_problem(s);
        all &= check_forward(p, s.dh == 64 ? api_forward<64> : api_forward<128>, "api");
        for (const ApiBwd &a : api_bwd) all &= check_backward(p, s.dh == 64 ? a.fn64 : a.fn128, a.name, a.nondet);
        free_problem(p);
    }
    printf("correctness: %s\n", all ? "ALL PASS" : "SOME FAILED");
    return all;
}

static bool run_bench() {
    bool ok = true;
    for (const BenchShape &bs : bench_shapes) {
        BenchInputs b = make_bench_inputs(bs.B, bs.H, bs.T, bs.dh);
        bench_forward(b, bs.dh == 64 ? api_forward<64> : api_forward<128>, "api");
        for (const ApiBwd &a : api_bwd) ok &= bench_backward(b, bs.dh == 64 ? a.fn64 : a.fn128, a.name, a.nondet);
        free_bench_inputs(b);
    }
    return ok;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "all";
    printf("attention kernels: %s\n", fox_attn::use_wgmma() ? "warpgroup MMA (wgmma)" : "mma.sync (FOX_ATTN_NO_WGMMA or not Hopper)");
    bool ok = true;
    if (strcmp(mode, "bench") != 0) ok &= run_checks();
    if (strcmp(mode, "check") != 0) ok &= run_bench();
    return ok ? 0 : 1;
}
