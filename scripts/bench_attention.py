#!/usr/bin/env python3
"""Forgetting Attention kernel (fox/attention.cuh through dev/cuda/libfoxattn.so) beside PyTorch SDPA.

1. Checks our forward and backward against an fp32 PyTorch reference with the forget gate on small cases,
   and that a second forward+backward gives bitwise the same outputs (the backward is deterministic).
2. Times forward and forward+backward at T in {4096, 16384}, d_h in {64, 128} (B*T = 32k tokens,
   16 heads of 64 or 8 of 128) for ours and for causal SDPA (flash and cuDNN backends, no gate), with
   triton.testing.do_bench medians, and prints TFLOP/s (causal forward = 2 B H T^2 d_h, fwd+bwd = 3.5x).
   "ours" is the deterministic backward (deterministic = 1); "nondet" is deterministic = 0 (fp32 atomics
   in arrival order), timed beside it.

    cd dev/cuda && make libfoxattn.so && cd ../.. && python3 scripts/bench_attention.py [--both-orders] [--runs N]
(FOX_ATTN_NO_WGMMA=1 times the mma.sync kernels instead of the Hopper wgmma ones. --both-orders times every
shape a second time with SDPA's columns before ours: a GPU that slows as it heats favours what runs first.
--runs N repeats the timing N times (each with both orders if asked) and ends with ours / cuDNN per shape over
every table, lowest, median and highest: one table's ratio moves by a few percent from run to run.
--sustained S instead runs each forward+backward, then each forward, back to back for S seconds (after one second
of warm-up), ours and cuDNN's in turn and then in the other order, and reads the GPU's energy counter and SM clock
through NVML: the rate a long run holds once the power cap binds, and the work a joule buys.)
"""
import ctypes
import math
import os
import sys
import threading

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

LIB_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "dev", "cuda", "libfoxattn.so")


def load_lib():
    lib = ctypes.CDLL(LIB_PATH)
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.foxattn_forward.argtypes = [p, p, p, p, p, p, i, i, i, i, p, p]
    lib.foxattn_forward.restype = None
    lib.foxattn_backward_scratch_bytes.argtypes = [i, i, i, i]
    lib.foxattn_backward_scratch_bytes.restype = ctypes.c_size_t
    lib.foxattn_backward.argtypes = [p, p, p, p, p, p, p, p, p, p, p, p, p, i, i, i, i, p, i, p]
    lib.foxattn_backward.restype = None
    return lib


class FoxAttention:
    """Our kernel on preallocated buffers. q, k, v: (B, H, T, d) bf16; c: (B, H, T) fp32; dout: (B, T, H, d).
    deterministic: 1 for the bitwise-repeatable backward, 0 for fp32 atomics in arrival order."""

    def __init__(self, lib, q, k, v, c, dout, deterministic=1):
        self.lib, self.q, self.k, self.v, self.c, self.dout = lib, q, k, v, c, dout
        self.deterministic = deterministic
        B, H, T, d = q.shape
        self.shape = (B, H, T, d)
        dev = q.device
        self.o = torch.empty(B, T, H, d, dtype=torch.bfloat16, device=dev)
        self.lse = torch.empty(B, H, T, dtype=torch.float32, device=dev)
        self.dq, self.dk, self.dv = (torch.empty_like(q) for _ in range(3))
        self.dc = torch.empty(B, H, T, dtype=torch.float32, device=dev)
        self.dlogf = torch.empty_like(self.dc)
        self.scratch = torch.empty(lib.foxattn_backward_scratch_bytes(B, H, T, d), dtype=torch.uint8, device=dev)

    def forward(self):
        s = torch.cuda.current_stream().cuda_stream
        self.lib.foxattn_forward(self.q.data_ptr(), self.k.data_ptr(), self.v.data_ptr(), self.c.data_ptr(),
                                 self.o.data_ptr(), self.lse.data_ptr(), *self.shape, None, s)

    def backward(self):
        s = torch.cuda.current_stream().cuda_stream
        self.lib.foxattn_backward(self.q.data_ptr(), self.k.data_ptr(), self.v.data_ptr(), self.c.data_ptr(),
                                  self.o.data_ptr(), self.lse.data_ptr(), self.dout.data_ptr(), self.dc.data_ptr(),
                                  self.dlogf.data_ptr(), self.dq.data_ptr(), self.dk.data_ptr(), self.dv.data_ptr(),
                                  self.scratch.data_ptr(), *self.shape, None, self.deterministic, s)

    def forward_backward(self):
        self.forward()
        self.backward()


def reference(q, k, v, logf, dout):
    """fp32 Forgetting Attention with autograd; c = cumsum(log f). Returns o (B,T,H,d), lse and grads."""
    q, k, v = (x.float().detach().requires_grad_() for x in (q, k, v))
    logf = logf.detach().clone().requires_grad_()
    B, H, T, d = q.shape
    c = torch.cumsum(logf, dim=-1)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(d) + c[..., :, None] - c[..., None, :]
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    s = s.masked_fill(~causal, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    o = (torch.softmax(s, dim=-1) @ v).transpose(1, 2)  # (B, T, H, d)
    o.backward(dout.float())
    return o.detach(), lse.detach(), q.grad, k.grad, v.grad, logf.grad


def check(lib):
    ok = True
    for T, d, H in [(1, 64, 2), (300, 64, 3), (1000, 64, 2), (300, 128, 2), (1000, 128, 2)]:
        torch.manual_seed(T + d)
        B = 2
        q, k, v = (torch.randn(B, H, T, d, device="cuda").bfloat16() for _ in range(3))
        logf = -0.5 * torch.rand(B, H, T, device="cuda")
        c = torch.cumsum(logf, dim=-1)
        dout = torch.randn(B, T, H, d, device="cuda").bfloat16()
        ours = FoxAttention(lib, q, k, v, c, dout)
        ours.forward_backward()
        torch.cuda.synchronize()
        got = tuple(x.clone() for x in (ours.o, ours.lse, ours.dq, ours.dk, ours.dv, ours.dlogf, ours.dc))
        ours.forward_backward()  # a second run must agree bit for bit (the trainer needs deterministic losses)
        torch.cuda.synchronize()
        again = (ours.o, ours.lse, ours.dq, ours.dk, ours.dv, ours.dlogf, ours.dc)
        same = all(torch.equal(a.view(torch.uint8) if a.dtype == torch.bfloat16 else a.view(torch.int32),
                               b.view(torch.uint8) if b.dtype == torch.bfloat16 else b.view(torch.int32))
                   for a, b in zip(got, again))
        ok &= same
        got = got[:6]
        ref = reference(q, k, v, logf, dout)
        errs = []
        for name, g, r in zip(("o", "lse", "dq", "dk", "dv", "dlogf"), got, ref):
            rel = ((g.float() - r).abs().max() / r.abs().max().clamp_min(1.0)).item()
            tol = 1e-4 if name == "lse" else 1e-2
            ok &= bool(math.isfinite(rel) and rel <= tol)
            errs.append(f"{name} {rel:.1e}")
        print(f"check B={B} H={H} T={T} d={d}: max|err|/max(max|ref|, 1): " + ", ".join(errs)
              + f"; repeat bitwise {'same' if same else 'DIFFERENT'}")
    print("check vs fp32 PyTorch reference (tol 1e-2, lse 1e-4) and bitwise repeat:", "PASS" if ok else "FAIL")
    return ok


def tflops(flops, ms):
    return flops / ms * 1e-9


def bench_shapes():
    """The bench's shapes, T in {4096, 16384} and d_h in {64, 128} (B*T = 32k tokens, 16 heads of 64 or 8 of 128), each
    as (T, d_h, causal forward flops, q, k, v, c, dout) on random inputs."""
    for T in (4096, 16384):
        for d in (64, 128):
            H, B = (16 if d == 64 else 8), 32768 // T
            q, k, v = (torch.randn(B, H, T, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            c = torch.cumsum(-0.5 * torch.rand(B, H, T, device="cuda"), dim=-1)
            dout = torch.randn(B, T, H, d, device="cuda", dtype=torch.bfloat16)
            yield T, d, 2.0 * B * H * T * T * d, q, k, v, c, dout


def bench(lib, sdpa_first=False):
    """One row per (T, d_h), printed and returned; sdpa_first times SDPA's columns before ours at each shape (a GPU
    that slows as it heats favours whatever runs first, so a comparison is fair only if it holds in both orders)."""
    rows = []
    for T, d, flops, q, k, v, c, dout in bench_shapes():
        def ours_columns():
            ours = FoxAttention(lib, q, k, v, c, dout)
            cols = [tflops(flops, do_bench(ours.forward, return_mode="median")),
                    tflops(3.5 * flops, do_bench(ours.forward_backward, return_mode="median"))]
            ours.deterministic = 0
            cols.append(tflops(3.5 * flops, do_bench(ours.forward_backward, return_mode="median")))
            return cols

        def sdpa_columns():
            qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
            dout_bhtd = dout.transpose(1, 2).contiguous()
            cols = []
            for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
                with sdpa_kernel(backend):
                    def fwd():
                        with torch.no_grad():
                            F.scaled_dot_product_attention(q, k, v, is_causal=True)

                    def fwd_bwd():
                        F.scaled_dot_product_attention(qg, kg, vg, is_causal=True).backward(dout_bhtd)

                    cols += [tflops(flops, do_bench(fwd, return_mode="median")),
                             tflops(3.5 * flops, do_bench(fwd_bwd, grad_to_none=[qg, kg, vg], return_mode="median"))]
            return cols

        if sdpa_first:
            theirs = sdpa_columns()
            row = [T, d] + ours_columns() + theirs
        else:
            row = [T, d] + ours_columns() + sdpa_columns()
        rows.append(row)
        torch.cuda.empty_cache()
    order = "SDPA timed first at each shape" if sdpa_first else "ours timed first at each shape"
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}; TFLOP/s (causal fwd = 2*B*H*T^2*d, fwd+bwd = 3.5x); "
          f"{order}")
    print("| T | d_h | FoX ours fwd | FoX ours fwd+bwd | FoX ours fwd+bwd, nondet | SDPA flash fwd | SDPA flash fwd+bwd "
          "| SDPA cuDNN fwd | SDPA cuDNN fwd+bwd |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | " + " | ".join(f"{x:.0f}" for x in r[2:]) + " |")
    return rows


class Nvml:
    """The GPU's energy counter (mJ since the driver loaded) and SM clock, through libnvidia-ml (the driver's)."""

    def __init__(self):
        try:
            self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        except OSError as e:
            sys.exit(f"error: --sustained reads the GPU's energy through NVML, which did not load: {e}")
        if self.lib.nvmlInit_v2() != 0:
            sys.exit("error: nvmlInit_v2 failed")
        self.handle = ctypes.c_void_p()
        uuid = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "uuid", None)
        found = uuid is not None and self.lib.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}".encode(), ctypes.byref(self.handle)) == 0
        if not found and self.lib.nvmlDeviceGetHandleByIndex_v2(torch.cuda.current_device(), ctypes.byref(self.handle)) != 0:
            sys.exit("error: NVML does not see this GPU")

    def energy_j(self):
        mj = ctypes.c_ulonglong()
        if self.lib.nvmlDeviceGetTotalEnergyConsumption(self.handle, ctypes.byref(mj)) != 0:
            sys.exit("error: this GPU's driver gives no energy counter (nvmlDeviceGetTotalEnergyConsumption)")
        return mj.value / 1000.0

    def sm_clock_mhz(self):
        mhz = ctypes.c_uint()
        return mhz.value if self.lib.nvmlDeviceGetClockInfo(self.handle, 1, ctypes.byref(mhz)) == 0 else None  # 1: SM


def sustain(nvml, fn, flops, seconds):
    """fn back to back for about `seconds` (after one second of it unmeasured): TFLOP/s, watts, TFLOP per joule and
    the mean SM clock (MHz, sampled every 20 ms by a second thread while the GPU works)."""
    per_call = do_bench(fn, return_mode="median")  # ms, to size the windows

    def run_for(sec):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        n = max(1, int(sec * 1000.0 / per_call))
        e0 = nvml.energy_j()
        start.record()
        for _ in range(n):
            fn()
        end.record()
        end.synchronize()
        return n, start.elapsed_time(end) / 1000.0, nvml.energy_j() - e0
    run_for(1.0)
    clocks, done = [], threading.Event()
    def sample():
        while not done.wait(0.02):
            mhz = nvml.sm_clock_mhz()
            if mhz:
                clocks.append(mhz)
    sampler = threading.Thread(target=sample)
    sampler.start()
    n, sec, joules = run_for(seconds)
    done.set()
    sampler.join()
    return flops * n / sec * 1e-12, joules / sec, flops * n / joules * 1e-12, sum(clocks) / max(1, len(clocks))


def sustained(lib, seconds):
    """Forward+backward, then forward, of ours and of SDPA cuDNN at the bench shapes, each back to back for `seconds`,
    in both orders: sustained TFLOP/s, W, TFLOP/J, mean SM clock."""
    nvml = Nvml()
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}; each pass back to back for {seconds:g} s "
          "(fwd = 2*B*H*T^2*d flops, fwd+bwd = 3.5x); energy and SM clock from NVML")
    print("| T | d_h | pass | order | ours TFLOP/s | ours W | ours TFLOP/J | ours MHz | cuDNN TFLOP/s | cuDNN W "
          "| cuDNN TFLOP/J | cuDNN MHz | ours / cuDNN: rate, work a joule |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for T, d, flops, q, k, v, c, dout in bench_shapes():
        ours = FoxAttention(lib, q, k, v, c, dout)
        qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
        dout_bhtd = dout.transpose(1, 2).contiguous()

        def cudnn_fwd_bwd():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                F.scaled_dot_product_attention(qg, kg, vg, is_causal=True).backward(dout_bhtd)
            qg.grad = kg.grad = vg.grad = None

        def cudnn_fwd():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION), torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, is_causal=True)
        passes = (("fwd+bwd", ours.forward_backward, cudnn_fwd_bwd, 3.5 * flops), ("fwd", ours.forward, cudnn_fwd, flops))
        for name, ours_fn, cudnn_fn, work in passes:
            for order in ("ours first", "cuDNN first"):
                if order == "ours first":
                    a = sustain(nvml, ours_fn, work, seconds)
                    b = sustain(nvml, cudnn_fn, work, seconds)
                else:
                    b = sustain(nvml, cudnn_fn, work, seconds)
                    a = sustain(nvml, ours_fn, work, seconds)
                print(f"| {T} | {d} | {name} | {order} | {a[0]:.0f} | {a[1]:.0f} | {a[2]:.3f} | {a[3]:.0f} | {b[0]:.0f} "
                      f"| {b[1]:.0f} | {b[2]:.3f} | {b[3]:.0f} | {a[0] / b[0]:.3f}, {a[2] / b[2]:.3f} |", flush=True)
        del ours
        torch.cuda.empty_cache()


def ratio_summary(tables):
    """Ours / SDPA cuDNN, forward and forward+backward, per (T, d_h) over every table of bench: lowest, median,
    highest (rows as bench returns them: T, d_h, ours fwd, fwd+bwd, nondet, flash fwd, fwd+bwd, cuDNN fwd, fwd+bwd)."""
    def spread(xs):
        xs = sorted(xs)
        mid = xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2
        return f"{xs[0]:.3f} / {mid:.3f} / {xs[-1]:.3f}"
    print(f"\nours / SDPA cuDNN over {len(tables)} tables: lowest / median / highest")
    print("| T | d_h | fwd | fwd+bwd |")
    print("|---|---|---|---|")
    for i, r in enumerate(tables[0]):
        fwd = [t[i][2] / t[i][7] for t in tables]
        fb = [t[i][3] / t[i][8] for t in tables]
        print(f"| {r[0]} | {r[1]} | {spread(fwd)} | {spread(fb)} |")


def parse_args(args):
    """(both orders, runs, sustained seconds or 0) from the command line; a bad one ends the program with its usage."""
    usage = f"usage: {sys.argv[0]} [--both-orders] [--runs N] [--sustained S]"
    both, runs, sustained_s, i = False, 1, 0, 0
    while i < len(args):
        a = args[i]
        if a == "--both-orders":
            both = True
        elif a in ("--runs", "--sustained") or a.startswith(("--runs=", "--sustained=")):
            name = a.split("=", 1)[0]
            v = a.split("=", 1)[1] if "=" in a else (args[i + 1] if i + 1 < len(args) else "")
            i += 0 if "=" in a else 1
            if not v.isdigit() or not 1 <= int(v) <= 100:
                sys.exit(f"error: {name} {v!r}: must be between 1 and 100 ({usage})")
            if name == "--runs":
                runs = int(v)
            else:
                sustained_s = int(v)
        else:
            sys.exit(f"error: unknown argument {a!r} ({usage})")
        i += 1
    return both, runs, sustained_s


def main():
    both, runs, sustained_s = parse_args(sys.argv[1:])
    lib = load_lib()
    ok = check(lib)
    if sustained_s:
        sustained(lib, sustained_s)
        sys.exit(0 if ok else 1)
    tables = []
    for _ in range(runs):
        tables.append(bench(lib))
        if both:
            tables.append(bench(lib, sdpa_first=True))
    if len(tables) > 1:
        ratio_summary(tables)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
