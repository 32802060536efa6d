#!/usr/bin/env python3
"""Nsight Compute's counts for one forward+backward of our Forgetting Attention kernel (dev/cuda/libfoxattn.so)
and of SDPA cuDNN's causal attention, at the shapes of scripts/bench_attention.py: per kernel and in total, the
time and SM cycles (at ncu's locked base clock), warp instructions, warpgroup-MMA instructions, L2 traffic (reads,
writes, reductions) and DRAM bytes. What a kernel moves and issues for the same products is what it costs in energy
once the power cap binds (dev/perf_history/2026-11-27.md "Where the step's energy goes").

    make -C dev/cuda libfoxattn.so && python3 scripts/ncu_attention.py [--stalls] [T,d_h ...]
                                                                  (default 16384,64 16384,128 4096,128)

--stalls instead gives each kernel's issue rate and its warps' stall reasons (warps stalled per issued instruction,
the largest first): where the cycles of the two backward kernels go. Each (side, shape) is one process under ncu
(`--one SIDE T D` runs the pass itself); ncu must be on PATH.
"""
import csv
import io
import os
import re
import shutil
import subprocess
import sys

METRICS = {
    "gpu__time_duration.sum": "time_ns",
    "sm__cycles_elapsed.max": "cycles",
    "smsp__inst_executed.sum": "inst",
    "sm__inst_executed_pipe_tensor_op_gmma.sum": "gmma",
    "lts__t_sectors_op_read.sum": "l2_read",
    "lts__t_sectors_op_write.sum": "l2_write",
    "lts__t_sectors_op_red.sum": "l2_red",
    "dram__bytes_read.sum": "dram_read",
    "dram__bytes_write.sum": "dram_write",
}


def one(side, T, d):
    """One forward+backward of `side` at (T, d_h), on bench_attention.py's inputs, between cudaProfilerStart and
    Stop (process-wide, so the autograd thread's kernels are inside too), after one untimed pass (cuDNN's plan)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import bench_attention as ba
    for t, dh, _, q, k, v, c, dout in ba.bench_shapes():
        if (t, dh) != (T, d):
            continue
        if side == "ours":
            run = ba.FoxAttention(ba.load_lib(), q, k, v, c, dout).forward_backward
        else:
            qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
            dout_bhtd = dout.transpose(1, 2).contiguous()

            def run():
                qg.grad = kg.grad = vg.grad = None  # the gradients written, not added to the last pass's
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    F.scaled_dot_product_attention(qg, kg, vg, is_causal=True).backward(dout_bhtd)
        run()
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        run()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        return
    sys.exit(f"error: ({T}, {d}) is not one of bench_attention.py's shapes")


STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio")
ISSUE = "smsp__issue_active.avg.per_cycle_active"
STALL_METRICS = r"regex:smsp__average_warps_issue_stalled_\w+_per_issue_active\.ratio," + ISSUE


def profile(side, T, d, stalls=False):
    """{kernel: {counter: value}} of one forward+backward under ncu, in launch order (counters named as in METRICS;
    with stalls, each stall reason by its name and "issue" the instructions a scheduler issues a cycle)."""
    metrics = STALL_METRICS if stalls else ",".join(METRICS)
    cmd = ["ncu", "--profile-from-start", "off", "--metrics", metrics, "--csv", sys.executable, os.path.abspath(__file__),
           "--one", side, str(T), str(d)]
    run = subprocess.run(cmd, capture_output=True, text=True)
    lines = run.stdout.splitlines()
    head = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if run.returncode != 0 or head is None:
        sys.exit(f"error: ncu on {side} ({T}, {d}) gave no counters (exit {run.returncode}): "
                 + (run.stderr.strip().splitlines() or ["no output"])[-1])
    kernels = {}
    for r in csv.DictReader(io.StringIO("\n".join(lines[head:]))):
        name = re.sub(r"\(.*", "", r["Kernel Name"]).replace("void ", "")
        name = re.sub(r"<.*", "", name)[:56]
        key = (int(r["ID"]), name)
        metric = r["Metric Name"]
        stall = STALL.fullmatch(metric)
        label = "issue" if metric == ISSUE else stall.group(1) if stall else METRICS[metric]
        kernels.setdefault(key, {})[label] = float(r["Metric Value"].replace(",", ""))
    return kernels


def print_stalls(shapes):
    """Per kernel: instructions issued a scheduler-cycle and the eight largest stall reasons."""
    print("Nsight Compute, one forward+backward each: warps stalled per issued instruction, by reason (largest 8)")
    print("| kernel | issued a cycle | stalls |")
    print("|---|---|---|")
    for T, d in shapes:
        for side in ("ours", "cudnn"):
            for (_, name), m in profile(side, T, d, stalls=True).items():
                top = sorted(((v, k) for k, v in m.items() if k != "issue"), reverse=True)[:8]
                print(f"| {side} ({T}, {d}) {name} | {m.get('issue', 0.0):.2f} | " + ", ".join(f"{k} {v:.2f}" for v, k in top) + " |")


def row(name, m):
    sector = 32e-6  # MB a sector
    return (f"| {name} | {m['time_ns'] / 1e3:.0f} | {m['cycles'] / 1e3:.0f} | {m['inst'] / 1e6:.0f} | {m['gmma'] / 1e6:.1f} | "
            f"{m['l2_read'] * sector:.0f} | {m['l2_write'] * sector:.0f} | {m['l2_red'] * sector:.0f} | "
            f"{(m['dram_read'] + m['dram_write']) / 1e6:.0f} |")


def main(argv):
    if argv[:1] == ["--one"]:
        if len(argv) != 4 or argv[1] not in ("ours", "cudnn") or not (argv[2].isdigit() and argv[3].isdigit()):
            sys.exit("usage: ncu_attention.py --one ours|cudnn T D")
        one(argv[1], int(argv[2]), int(argv[3]))
        return
    if shutil.which("ncu") is None:
        sys.exit("error: ncu (Nsight Compute) is not on PATH")
    stalls = argv[:1] == ["--stalls"]
    argv = argv[1:] if stalls else argv
    try:
        shapes = [tuple(int(x) for x in s.split(",")) for s in argv] or [(16384, 64), (16384, 128), (4096, 128)]
        assert all(len(s) == 2 for s in shapes)
    except (ValueError, AssertionError):
        sys.exit("usage: ncu_attention.py [--stalls] [T,d_h ...]   (e.g. 16384,64)")
    if stalls:
        print_stalls(shapes)
        return
    print("Nsight Compute, one forward+backward each (ncu's base clock); MB of L2 traffic by operation, DRAM both ways")
    print("| kernel | us | k cycles | M inst | M gmma | L2 read MB | L2 write MB | L2 reduction MB | DRAM MB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for T, d in shapes:
        for side in ("ours", "cudnn"):
            kernels = profile(side, T, d)
            total = {k: sum(m.get(k, 0.0) for m in kernels.values()) for k in METRICS.values()}
            for (_, name), m in kernels.items():
                print(row(f"{side} ({T}, {d}) {name}", {k: m.get(k, 0.0) for k in METRICS.values()}))
            print(row(f"**{side} ({T}, {d}) total**", total))


if __name__ == "__main__":
    main(sys.argv[1:])
