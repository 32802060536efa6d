#!/usr/bin/python3
"""Tests for scripts/plot.py (plain script, no pytest).

Run:  /usr/bin/python3 test/test_plot.py

Builds synthetic per-token losses and JSON-lines logs in a temporary
directory, checks the numerical helpers against direct loops, the figure
objects (labels, legend, line counts, the dashed training-context line), the
CLI's PNG output, and the CLI's error paths.  Prints one line per check and
ends with `N passed, M failed`; exits non-zero if anything failed.
Set PLOT_TEST_KEEP=1 to keep the temporary directory (and its PNGs).
"""

import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "scripts", "plot.py")
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
import plot  # noqa: E402

from checks import check, summary  # noqa: E402


def run_check(name, fn):
    """Run fn() (which returns (ok, detail) or a bool); exceptions fail."""
    try:
        res = fn()
    except Exception as e:
        traceback.print_exc()
        check(name, False, f"{type(e).__name__}: {e}")
        return
    ok, detail = res if isinstance(res, tuple) else (res, "")
    check(name, ok, detail)


# ---------------------------------------------------------------------------
# Reference implementations (direct loops)


def ma_loop(x, w):
    n = len(x)
    out = []
    for i in range(n):
        lo = max(0, i - (w - 1) // 2)
        hi = min(n, i - (w - 1) // 2 + w)
        out.append(sum(x[lo:hi]) / (hi - lo))
    return np.array(out)


def ppl_loop(L):
    out, s = [], 0.0
    for i, v in enumerate(L):
        s += v
        out.append(math.exp(s / (i + 1)))
    return np.array(out)


def png_size(path):
    """(width, height) from the IHDR chunk, or None if not a PNG."""
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", head[16:24])


# ---------------------------------------------------------------------------
# Synthetic inputs


def synth_loss(n, rng):
    i = np.arange(n)
    return 3.0 + 2.0 * np.exp(-i / 300.0) + 0.3 * rng.standard_normal(n)


def write_run(d, n, rng, train_ctx=None):
    os.makedirs(d)
    L = synth_loss(n, rng)
    np.save(os.path.join(d, "per_token_loss.npy"), L)
    meta = {"P": {str(l): float(np.exp(L[: l + 1].mean()))
                  for l in (512, 1024) if l < n},
            "mean_loss": float(L.mean())}
    if train_ctx:
        meta["train_seq_len"] = train_ctx
    with open(os.path.join(d, "per_token_loss.json"), "w") as f:
        json.dump(meta, f)
    return L


def write_log(path, steps, val_every, rng):
    with open(path, "w") as f:
        f.write(json.dumps({"config": {"n_layer": 2}, "note": "header"}) + "\n")
        for s in range(1, steps + 1):
            f.write(json.dumps({"step": s, "loss": 10 / math.sqrt(s) + 0.1 * rng.random(),
                                "lr": 1e-3, "grad_norm": 0.5, "tokens_per_s": 1e5,
                                "mfu": 0.4, "ms": 12.0}) + "\n")
            if s % val_every == 0:
                f.write(json.dumps({"step": s, "val_loss": 10 / math.sqrt(s) + 0.2}) + "\n")
        f.write("\n")  # trailing blank line is allowed
        f.write(json.dumps({"event": "checkpoint", "step": steps}) + "\n")


def write_acp_log(path, steps, L, H):
    """Step lines with acp_pruned (L x H) on every other step, a val line and a skipped step between; returns
    {step: matrix}."""
    mats = {}
    with open(path, "w") as f:
        for s in range(1, steps + 1):
            rec = {"step": s, "loss": 5.0 / s, "acp_live": 0.5}
            if s % 2 == 0:
                mats[s] = [[round(0.9 - 0.05 * l - 0.01 * h + 0.001 * s, 4) for h in range(H)] for l in range(L)]
                rec["acp_pruned"] = mats[s]
            f.write(json.dumps(rec) + "\n")
            f.write(json.dumps({"step": s, "val_loss": 4.0}) + "\n")
        f.write(json.dumps({"step": steps + 1, "skipped": "non-finite loss", "loss": None}) + "\n")
    return mats


def cli(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True,
                          text=True, timeout=60)


# ---------------------------------------------------------------------------


def main():
    rng = np.random.default_rng(0)
    tmp = tempfile.mkdtemp(prefix="test_plot_")

    # --- numerical helpers
    for n in (1, 7, 300):
        x = rng.standard_normal(n)
        for w in (1, 2, 5, 101, 1001):
            got = plot.moving_average(x, w)
            want = ma_loop(list(x), w)
            run_check(f"moving_average n={n} w={w} matches loop (incl. edges)",
                      lambda: (got.shape == want.shape and np.allclose(got, want, rtol=1e-12, atol=1e-12),
                               f"max diff {np.max(np.abs(got - want)) if got.shape == want.shape else 'shape'}"))
    x = np.arange(10.0)
    run_check("moving_average edges shrink, not zero-padded",
              lambda: plot.moving_average(x, 5)[0] == 1.0 and plot.moving_average(x, 5)[-1] == 8.0)
    L = synth_loss(5000, rng)
    run_check("perplexity_curve matches direct computation",
              lambda: np.allclose(plot.perplexity_curve(L), ppl_loop(L), rtol=1e-12))
    run_check("perplexity_curve of constant loss is exp(loss)",
              lambda: np.allclose(plot.perplexity_curve(np.full(10, 2.0)), math.exp(2.0)))

    # --- inputs on disk
    run_a, run_b = os.path.join(tmp, "fox_a"), os.path.join(tmp, "fox_b")
    La = write_run(run_a, 2048, rng, train_ctx=1024)
    Lb = write_run(run_b, 4096, rng)
    log_a, log_b = os.path.join(run_a, "log.jsonl"), os.path.join(tmp, "b_log.jsonl")
    write_log(log_a, 200, 50, rng)
    write_log(log_b, 120, 40, rng)

    # --- read_log / loaders
    recs = plot.read_log(log_a)
    run_check("read_log parses every non-blank line",
              lambda: (len(recs) == 1 + 200 + 4 + 1, f"got {len(recs)} records"))
    ts, tl, vs, vl = plot.split_curves(recs)
    run_check("split_curves separates train and val lines",
              lambda: (len(ts) == 200 and len(vs) == 4 and list(vs) == [50, 100, 150, 200],
                       f"train {len(ts)}, val {list(vs)}"))
    ra = plot.load_per_token(run_a)
    run_check("load_per_token: label = dir name, train_seq_len from json",
              lambda: (ra.label == "fox_a" and ra.train_ctx == 1024 and np.array_equal(ra.loss, La),
                       f"{ra.label} {ra.train_ctx}"))
    rb = plot.load_per_token(os.path.join(run_b, "per_token_loss.npy"), "B")
    run_check("load_per_token from npy path with explicit label",
              lambda: rb.label == "B" and rb.train_ctx is None and len(rb.loss) == 4096)

    # --- per-token figure
    fig = plot.per_token_figure([ra, rb])
    axes = fig.get_axes()
    run_check("per-token figure has two panels", lambda: (len(axes) == 2, f"{len(axes)} axes"))
    ax_loss, ax_ppl = axes
    run_check("per-token axis labels",
              lambda: ("token position" in ax_ppl.get_xlabel() and "loss" in ax_loss.get_ylabel().lower()
                       and "perplexity" in ax_ppl.get_ylabel().lower(),
                       f"{ax_loss.get_ylabel()!r} {ax_ppl.get_ylabel()!r} {ax_ppl.get_xlabel()!r}"))
    for name, ax in (("loss", ax_loss), ("ppl", ax_ppl)):
        lines = ax.get_lines()
        dashed = [l for l in lines if l.get_linestyle() == "--"]
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        run_check(f"per-token {name} panel: 2 run lines + 1 dashed line",
                  lambda: (len(lines) == 3 and len(dashed) == 1, f"{len(lines)} lines, {len(dashed)} dashed"))
        run_check(f"per-token {name} panel: dashed line at train_seq_len 1024 (from json)",
                  lambda: (dashed and list(dashed[0].get_xdata()) == [1024, 1024],
                           f"{dashed[0].get_xdata() if dashed else None}"))
        run_check(f"per-token {name} panel: legend entries",
                  lambda: (legend[:2] == ["fox_a", "B"] and len(legend) == 3, f"{legend}"))
    solid = [l for l in ax_loss.get_lines() if l.get_linestyle() != "--"]
    run_check("per-token loss panel plots the moving average (101)",
              lambda: np.allclose(solid[0].get_ydata(), plot.moving_average(La, 101)))
    solid = [l for l in ax_ppl.get_lines() if l.get_linestyle() != "--"]
    run_check("per-token ppl panel plots P(l) over the full length",
              lambda: (len(solid[1].get_ydata()) == 4096
                       and np.allclose(solid[1].get_ydata(), ppl_loop(Lb))))

    fig = plot.per_token_figure([ra], train_ctx=512, logx=True, window=11)
    ax_loss = fig.get_axes()[0]
    dashed = [l for l in ax_loss.get_lines() if l.get_linestyle() == "--"]
    run_check("per-token --train-ctx overrides json, --logx sets log scale",
              lambda: (len(dashed) == 1 and list(dashed[0].get_xdata()) == [512, 512]
                       and ax_loss.get_xscale() == "log", f"{ax_loss.get_xscale()}"))
    fig = plot.per_token_figure([rb])
    run_check("per-token figure without any train ctx has no dashed line",
              lambda: all(l.get_linestyle() != "--" for ax in fig.get_axes() for l in ax.get_lines()))

    # --- curves figure
    ca, cb = plot.load_curves(run_a), plot.load_curves(log_b, "b")
    fig = plot.curves_figure([ca, cb])
    ax = fig.get_axes()[0]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    run_check("curves figure: one panel, 4 lines (train+val per run)",
              lambda: (len(fig.get_axes()) == 1 and len(ax.get_lines()) == 4, f"{len(ax.get_lines())} lines"))
    run_check("curves figure: legend entries",
              lambda: (legend == ["fox_a train", "fox_a val", "b train", "b val"], f"{legend}"))
    run_check("curves figure: axis labels",
              lambda: ax.get_xlabel() == "step" and "loss" in ax.get_ylabel())
    run_check("curves figure: val data correct",
              lambda: list(ax.get_lines()[3].get_xdata()) == [40, 80, 120])

    # --- ACP's pruned fractions per layer (log.jsonl's acp_pruned)
    log_acp = os.path.join(tmp, "acp_log.jsonl")
    mats = write_acp_log(log_acp, 10, 3, 4)
    acp = plot.load_acp(log_acp, "acp")
    run_check("load_acp: the steps with acp_pruned and their (steps, layers, heads) matrices",
              lambda: (list(acp.step) == [2, 4, 6, 8, 10] and acp.pruned.shape == (5, 3, 4)
                       and np.array_equal(acp.pruned[2], np.array(mats[6])), f"{list(acp.step)} {acp.pruned.shape}"))
    afig = plot.acp_figure([acp, acp])
    aax = afig.get_axes()
    run_check("acp figure: one panel per run, a line per layer and one for the model",
              lambda: (len(aax) == 2 and len(aax[0].get_lines()) == 4, f"{len(aax)} axes, {len(aax[0].get_lines())} lines"))
    want = [100 * np.mean(mats[s][1]) for s in (2, 4, 6, 8, 10)]
    run_check("acp figure: layer 1's line is the mean over its heads, in %",
              lambda: (np.allclose(aax[0].get_lines()[1].get_ydata(), want), f"{aax[0].get_lines()[1].get_ydata()}"))
    run_check("acp figure: the model's line is the mean over layers and heads",
              lambda: np.allclose(aax[0].get_lines()[3].get_ydata(), [100 * np.mean(mats[s]) for s in (2, 4, 6, 8, 10)]))

    # --- loss by position within the document (--eval-doc-pos)
    def wma_loop(loss, count, w):
        h, out = w // 2, []
        for i in range(len(loss)):
            lo, hi = max(0, i - h), min(len(loss), i + h + 1)
            c = sum(count[lo:hi])
            out.append(sum(loss[j] * count[j] for j in range(lo, hi) if count[j] > 0) / c if c > 0 else float("nan"))
        return np.array(out)

    dl = rng.uniform(2.0, 6.0, 300)
    dc = np.floor(rng.uniform(0, 5, 300))
    dc[40:60] = 0
    dl[dc == 0] = np.nan
    dc[250:] = 0
    dl[250:] = np.nan
    run_check("weighted_moving_average matches loop (NaN where no token, incl. edges)",
              lambda: (np.allclose(plot.weighted_moving_average(dl, dc, 21), wma_loop(dl, dc, 21), equal_nan=True), ""))
    run_d = os.path.join(tmp, "docpos_run")
    os.makedirs(run_d)
    np.save(os.path.join(run_d, "doc_pos_loss.npy"), dl)
    np.save(os.path.join(run_d, "doc_pos_count.npy"), dc)
    dp = plot.load_doc_pos(run_d)
    run_check("load_doc_pos: label = dir name, loss and counts", lambda: (
        dp.label == "docpos_run" and np.array_equal(dp.count, dc) and np.allclose(dp.loss, dl, equal_nan=True), dp.label))
    dfig = plot.doc_pos_figure([dp, plot.load_doc_pos(os.path.join(run_d, "doc_pos_loss.npy"), "again")], window=21)
    dax = dfig.get_axes()
    run_check("doc-pos figure: two panels, two runs each, log-scale counts",
              lambda: (len(dax) == 2 and len(dax[0].get_lines()) == 2 and len(dax[1].get_lines()) == 2
                       and dax[1].get_yscale() == "log", f"{len(dax)} axes"))
    run_check("doc-pos figure: the top panel plots the weighted moving average",
              lambda: (np.allclose(dax[0].get_lines()[0].get_ydata(), wma_loop(dl, dc, 21), equal_nan=True), ""))

    # --- CLI, success paths
    def png_ok(res, out):
        if res.returncode != 0:
            return False, f"rc={res.returncode} stderr={res.stderr.strip()}"
        if not os.path.isfile(out) or os.path.getsize(out) == 0:
            return False, "no output file"
        size = png_size(out)
        return (size is not None and size[0] > 100 and size[1] > 100), f"IHDR size {size}"

    out1 = os.path.join(tmp, "per_token.png")
    res = cli("per-token", run_a, run_b, "--out", out1)
    run_check("CLI per-token (run dirs) writes a valid PNG", lambda: png_ok(res, out1))
    out2 = os.path.join(tmp, "per_token_logx.png")
    res = cli("per-token", os.path.join(run_a, "per_token_loss.npy"), os.path.join(run_b, "per_token_loss.npy"),
              "--out", out2, "--labels", "A,B", "--train-ctx", "2048", "--logx", "--window", "51")
    run_check("CLI per-token (npy files, --labels --logx --train-ctx --window) writes a valid PNG",
              lambda: png_ok(res, out2))
    out3 = os.path.join(tmp, "curves.png")
    res = cli("curves", run_a, log_b, "--out", out3, "--labels", "a,b")
    run_check("CLI curves (run dir + jsonl) writes a valid PNG", lambda: png_ok(res, out3))
    out4 = os.path.join(tmp, "doc_pos.png")
    res = cli("doc-pos", run_d, "--out", out4, "--window", "21")
    run_check("CLI doc-pos (run dir) writes a valid PNG", lambda: png_ok(res, out4))
    out5 = os.path.join(tmp, "acp.png")
    res = cli("acp", log_acp, "--out", out5)
    run_check("CLI acp (jsonl) writes a valid PNG", lambda: png_ok(res, out5))

    # --- CLI, error paths
    def err_ok(res, must_contain=""):
        msg = res.stderr.strip()
        ok = (res.returncode != 0 and msg.startswith("plot.py: error:") and "\n" not in msg
              and must_contain in msg)
        return ok, f"rc={res.returncode} stderr={msg!r}"

    out = os.path.join(tmp, "never.png")
    res = cli("per-token", os.path.join(tmp, "nope"), "--out", out)
    run_check("CLI per-token missing file -> one-line error", lambda: err_ok(res, "nope"))
    res = cli("curves", os.path.join(tmp, "nope.jsonl"), "--out", out)
    run_check("CLI curves missing file -> one-line error", lambda: err_ok(res, "nope.jsonl"))

    bad = os.path.join(tmp, "bad.jsonl")
    with open(bad, "w") as f:
        f.write('{"step": 1, "loss": 5.0}\n{"step": 2, "loss": 4.0}\n{"step": 3, "loss": \n')
    res = cli("curves", bad, "--out", out)
    run_check("CLI curves bad JSON line -> one-line error naming line 3", lambda: err_ok(res, "bad.jsonl:3:"))

    empty = os.path.join(tmp, "empty.jsonl")
    open(empty, "w").close()
    res = cli("curves", empty, "--out", out)
    run_check("CLI curves empty log -> one-line error", lambda: err_ok(res, "empty"))

    nolines = os.path.join(tmp, "other.jsonl")
    with open(nolines, "w") as f:
        f.write('{"event": "start"}\n')
    res = cli("curves", nolines, "--out", out)
    run_check("CLI curves log without train/val lines -> one-line error", lambda: err_ok(res))

    npy2d = os.path.join(tmp, "two_d.npy")
    np.save(npy2d, np.zeros((4, 8)))
    res = cli("per-token", npy2d, "--out", out)
    run_check("CLI per-token 2-D npy -> one-line error", lambda: err_ok(res, "1-D"))

    npyint = os.path.join(tmp, "ints.npy")
    np.save(npyint, np.arange(10))
    res = cli("per-token", npyint, "--out", out)
    run_check("CLI per-token integer npy -> one-line error", lambda: err_ok(res, "float"))

    notnpy = os.path.join(tmp, "garbage.npy")
    with open(notnpy, "w") as f:
        f.write("not numpy\n")
    res = cli("per-token", notnpy, "--out", out)
    run_check("CLI per-token corrupt npy -> one-line error", lambda: err_ok(res))

    res = cli("doc-pos", run_a, "--out", out)
    run_check("CLI doc-pos on a run without doc_pos_loss.npy -> one-line error", lambda: err_ok(res, "doc_pos_loss.npy"))
    lonely = os.path.join(tmp, "lonely")
    os.makedirs(lonely)
    np.save(os.path.join(lonely, "doc_pos_loss.npy"), dl)
    res = cli("doc-pos", lonely, "--out", out)
    run_check("CLI doc-pos without doc_pos_count.npy -> one-line error", lambda: err_ok(res, "doc_pos_count.npy"))
    np.save(os.path.join(lonely, "doc_pos_count.npy"), dc[:10])
    res = cli("doc-pos", lonely, "--out", out)
    run_check("CLI doc-pos with counts of another length -> one-line error", lambda: err_ok(res, "positions"))

    res = cli("acp", log_a, "--out", out)
    run_check("CLI acp on a log without acp_pruned -> one-line error", lambda: err_ok(res, "no acp_pruned"))
    ragged = os.path.join(tmp, "ragged.jsonl")
    with open(ragged, "w") as f:
        f.write('{"step": 1, "acp_pruned": [[0.5, 0.5], [0.5, 0.5]]}\n{"step": 2, "acp_pruned": [[0.5, 0.5], [0.5]]}\n')
    res = cli("acp", ragged, "--out", out)
    run_check("CLI acp with a ragged matrix -> one-line error naming the step", lambda: err_ok(res, "step 2"))

    res = cli("per-token", run_a, run_b, "--out", out, "--labels", "only_one")
    run_check("CLI --labels count mismatch -> one-line error", lambda: err_ok(res, "--labels"))
    run_check("no output written on errors", lambda: not os.path.exists(out))

    if os.environ.get("PLOT_TEST_KEEP"):
        print(f"kept outputs in {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
