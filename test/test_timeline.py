#!/usr/bin/python3
"""Tests for scripts/timeline.py, the step breakdown of a kernel timeline (dev/cuda/timeline.cu).

Run:  python3 test/test_timeline.py

Writes a synthetic timeline whose steps have known wall, busy and idle times, per-kernel times on two
streams and gaps on the main stream, and checks what the script computes and prints from it, the demangled
names it shortens, and its refusals (a malformed record, too few steps, a missing file). Prints one line per
check and ends with `N passed, M failed`; exits non-zero if anything failed.
"""

import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "scripts", "timeline.py")
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
import timeline  # noqa: E402

from checks import check, summary  # noqa: E402


def close(a, b, tol=1e-9):
    return abs(a - b) <= tol


MS = 1_000_000  # ns
B_NAME = "void fox_attn::bwd_ws_kernel<64, fox_attn::BwdDetCfg<64> >(CUtensorMap_st, float const*, int)"


def step_records(t0):
    """One step of 10 ms from t0: on the main stream (7) A [0, 2], B [2.5, 6], a memset [8, 8.5] and the
    marker [9, 10]; on stream 9, G [5, 7] beside B. Busy 2 + 4.5 + 0.5 + 1 = 8 ms; gaps on the main stream
    A -> B 0.5, B -> memset 2, memset -> marker 0.5."""
    return [
        ("K", t0, t0 + 2 * MS, 7, "kernel_a(float*)"),
        ("K", t0 + 2.5 * MS, t0 + 6 * MS, 7, B_NAME),
        ("K", t0 + 5 * MS, t0 + 7 * MS, 9, "gemm_g"),
        ("S", t0 + 8 * MS, t0 + 8.5 * MS, 7, "memset"),
        ("K", t0 + 9 * MS, t0 + 10 * MS, 7, "adamw_kernel(float*, float const*)"),
    ]


def write(path, recs):
    with open(path, "w") as f:
        for kind, s, e, stream, name in recs:
            f.write(f"{kind}\t{int(s)}\t{int(e)}\t{stream}\t{name}\n")


def main():
    tmp = tempfile.mkdtemp(prefix="test_timeline_")
    path = os.path.join(tmp, "t.tsv")
    recs = []
    for k in range(5):  # 5 markers: steps 1-4 between them, --skip 1 leaves 3
        recs += step_records(k * 10 * MS)
    write(path, recs)

    check("short name: namespace, template arguments and parameters dropped",
          timeline.short_name(B_NAME) == "bwd_ws_kernel", timeline.short_name(B_NAME))
    check("short name: a plain C name", timeline.short_name("adamw_kernel(float*)") == "adamw_kernel")

    a = timeline.analyze(timeline.read_records(path), "adamw_kernel", 1)
    check("steps after --skip 1", a["steps"] == 3, a["steps"])
    check("wall 10 ms a step", close(a["wall"], 10.0), a["wall"])
    check("busy 8 ms: B and G overlapping counted once", close(a["busy"], 8.0), a["busy"])
    k = a["kernels"]
    want = {(True, "kernel_a"): 2.0, (True, "bwd_ws_kernel"): 3.5, (False, "gemm_g"): 2.0,
            (True, "memset"): 0.5, (True, "adamw_kernel"): 1.0}
    check("per-kernel times by stream and name", set(k) == set(want) and all(close(k[x], want[x]) for x in want), k)
    g = a["gaps"]
    want_g = {("kernel_a", "bwd_ws_kernel"): (0.5, 1), ("bwd_ws_kernel", "memset"): (2.0, 1),
              ("memset", "adamw_kernel"): (0.5, 1)}
    check("main-stream gaps by pair (none across the step boundary)",
          set(g) == set(want_g) and all(close(g[x][0], want_g[x][0]) and g[x][1] == want_g[x][1] for x in want_g), g)
    check("too few steps: None", timeline.analyze(timeline.read_records(path), "adamw_kernel", 4) is None)
    check("another marker: no launches, None", timeline.analyze(timeline.read_records(path), "gemm_x", 0) is None)

    out = subprocess.run([sys.executable, SCRIPT, path, "--skip", "1"], capture_output=True, text=True)
    check("CLI exit 0", out.returncode == 0, out.stderr)
    check("CLI prints wall, busy and idle",
          "wall 10.00   GPU busy 8.00   idle 2.00 (20.0%)" in out.stdout, out.stdout[:300])
    check("CLI prints the main stream's gap total", "idle gaps on the main stream: 3.00 ms in 3 gaps a step" in out.stdout)
    check("CLI prints the other stream's kernel", "other      2.00   20.0  gemm_g" in out.stdout)

    out = subprocess.run([sys.executable, SCRIPT, path, "--skip", "4"], capture_output=True, text=True)
    check("CLI: too few steps, one line and exit 1",
          out.returncode == 1 and "too few launches" in out.stderr and out.stderr.count("\n") == 1, out.stderr)
    bad = os.path.join(tmp, "bad.tsv")
    with open(bad, "w") as f:
        f.write("K\t1\t2\t7\tok\nnot a record\n")
    out = subprocess.run([sys.executable, SCRIPT, bad], capture_output=True, text=True)
    check("CLI: a malformed record named by line, exit 1",
          out.returncode == 1 and "bad.tsv:2: not a timeline record" in out.stderr, out.stderr)
    out = subprocess.run([sys.executable, SCRIPT, os.path.join(tmp, "none.tsv")], capture_output=True, text=True)
    check("CLI: a missing file, exit 1", out.returncode == 1 and "No such file" in out.stderr, out.stderr)

    for f in os.listdir(tmp):
        os.remove(os.path.join(tmp, f))
    os.rmdir(tmp)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
