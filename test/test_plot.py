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

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "scripts", "plot.py")
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
import plot  # noqa: E402

from checks import run_check, summary  # noqa: E402


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


NIAH_LENGTHS = [2048, 256, 512, 1024, 4096]  # unsorted on purpose: the loader sorts the columns
NIAH_DEPTHS = [0, 25, 50, 75, 100]


def write_niah(path, train_ctx=1024, mode="standard", step=300, depths=NIAH_DEPTHS, null_cell=True):
    """A niah.json as the C side writes it; returns the score rows in the file's length order."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    score = [[round(max(0.0, 1.0 - L / 4096 - 0.001 * j), 4) for j in range(len(depths))] for L in NIAH_LENGTHS]
    if null_cell:
        score[4][2] = None
    cells = [{"length": L, "depth": d, "needle_pos": int(L * d / 100), "score": s, "text": "the number is 7"}
             for L, row in zip(NIAH_LENGTHS, score) for d, s in zip(depths, row)]
    obj = {"task": "niah", "mode": mode, "step": step, "train_seq_len": train_ctx, "lengths": NIAH_LENGTHS,
           "depths": depths, "score": score, "mean": 0.4321, "new_tokens": 8, "cells": cells}
    with open(path, "w") as f:
        json.dump(obj, f)
    return score


def write_passkey(path, lengths, accuracy, train_ctx, step=200, trials=5):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    cells = [{"length": L, "trial": i, "key": "12345", "needle_pos": L // 2, "correct": int(i < a * trials),
              "text": "12345"} for L, a in zip(lengths, accuracy) for i in range(trials or 0)]
    with open(path, "w") as f:
        json.dump({"task": "passkey", "step": step, "train_seq_len": train_ctx, "trials": trials,
                   "lengths": lengths, "accuracy": accuracy, "cells": cells}, f)


def write_mqar(path, num_kv, accuracy, seq_len=256):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"task": "mqar", "step": 500, "num_kv": num_kv, "seq_len": seq_len, "examples": 64,
                   "answers": 64 * num_kv, "accuracy": accuracy}, f)


def write_eval_log(path, steps, evals):
    """Training and val lines every step, then at each step of evals {step: {metric: value}} its lines (mc_acc and
    mc_acc_norm on one line, as the trainers write them)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(json.dumps({"config": {"n_layer": 2}}) + "\n")
        for s in range(1, steps + 1):
            f.write(json.dumps({"step": s, "loss": 5.0 / s, "lr": 1e-3, "grad_norm": 0.5}) + "\n")
            if s in evals:
                f.write(json.dumps({"step": s, "val_loss": 4.0}) + "\n")
                e = dict(evals[s])
                mc = {k: e.pop(k) for k in ("mc_acc", "mc_acc_norm") if k in e}
                if mc:
                    f.write(json.dumps(dict(step=s, **mc)) + "\n")
                for k, v in e.items():
                    f.write(json.dumps({"step": s, k: v}) + "\n")


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

    # --- evaluation results: needle in a haystack
    run_n = os.path.join(tmp, "niah_run")
    nscore = write_niah(os.path.join(run_n, "niah.json"))
    nr = plot.load_niah(run_n)
    order = np.argsort(NIAH_LENGTHS)
    want = np.array([[np.nan if v is None else v for v in nscore[i]] for i in order])
    run_check("load_niah: label = dir name, columns sorted by length, null -> NaN, mean/mode/step/train_seq_len",
              lambda: (nr.label == "niah_run" and list(nr.lengths) == sorted(NIAH_LENGTHS)
                       and np.allclose(nr.score, want, equal_nan=True) and nr.mean == 0.4321 and nr.mode == "standard"
                       and nr.step == 300 and nr.train_ctx == 1024, f"{nr.label} {list(nr.lengths)} {nr.mean}"))
    nfig = plot.niah_figure(nr)
    nax = nfig.get_axes()
    run_check("niah figure: the heatmap and its colorbar", lambda: (len(nax) == 2, f"{len(nax)} axes"))
    ax = nax[0]
    mesh = ax.collections[0]
    arr = np.ma.filled(mesh.get_array().astype(float), np.nan).reshape(len(NIAH_DEPTHS), len(NIAH_LENGTHS))
    run_check("niah figure: cells = score (depth rows x length columns), null cell masked",
              lambda: (np.allclose(arr, want.T, equal_nan=True) and np.ma.count_masked(mesh.get_array()) == 1, ""))
    run_check("niah figure: colour scale 0..1 from red to green",
              lambda: (mesh.get_clim() == (0.0, 1.0) and mesh.cmap(0.0)[0] > mesh.cmap(0.0)[1]
                       and mesh.cmap(1.0)[1] > mesh.cmap(1.0)[0], f"{mesh.get_clim()}"))
    run_check("niah figure: x = context length, y = depth (%), depth 0 at the top",
              lambda: ("context length" in ax.get_xlabel() and "depth" in ax.get_ylabel() and "%" in ax.get_ylabel()
                       and [t.get_text() for t in ax.get_xticklabels()] == ["256", "512", "1K", "2K", "4K"]
                       and ax.get_ylim()[0] > ax.get_ylim()[1], f"{[t.get_text() for t in ax.get_xticklabels()]}"))
    dashed = [l for l in ax.get_lines() if l.get_linestyle() == "--"]
    run_check("niah figure: dashed line between 1K (within the training context 1024) and 2K",
              lambda: (len(dashed) == 1 and list(dashed[0].get_xdata()) == [2.5, 2.5],
                       f"{[list(l.get_xdata()) for l in dashed]}"))
    run_check("niah figure: title with the mode, the mean score and the step",
              lambda: ("standard" in ax.get_title() and "0.432" in ax.get_title() and "step 300" in ax.get_title(),
                       ax.get_title()))
    run_check("niah_boundary: before all, between, after all lengths",
              lambda: (plot.niah_boundary([256, 512], 100), plot.niah_boundary([256, 512], 256),
                       plot.niah_boundary([256, 512], 9999)) == (-0.5, 0.5, 1.5))
    niah_easy = os.path.join(tmp, "niah_easy.json")
    write_niah(niah_easy, train_ctx=None, mode="easy", step=None, depths=[0.0, 0.25, 0.5, 0.75, 1.0], null_cell=False)
    efig = plot.niah_figure(plot.load_niah(niah_easy))
    eax = efig.get_axes()[0]
    run_check("niah figure without train_seq_len or step: no line, mode easy in the title, no step",
              lambda: (not eax.get_lines() and "easy" in eax.get_title() and "step" not in eax.get_title(),
                       eax.get_title()))
    run_check("niah figure: depths given as fractions are shown in percent",
              lambda: ([t.get_text() for t in eax.get_yticklabels()] == ["0", "25", "50", "75", "100"],
                       f"{[t.get_text() for t in eax.get_yticklabels()]}"))

    # --- passkey
    pk_lengths = [256, 512, 1024, 2048, 4096]
    run_fam, run_swa, run_full = (os.path.join(tmp, n) for n in ("fam", "swa", "full"))
    write_passkey(os.path.join(run_fam, "passkey.json"), [4096, 256, 512, 1024, 2048], [0.6, 1.0, 1.0, 1.0, 0.8], 1024)
    write_passkey(os.path.join(run_swa, "passkey.json"), pk_lengths, [1.0, 0.4, 0.2, 0.0, 0.0], 1024)
    pk_full = os.path.join(run_full, "result.json")
    write_passkey(pk_full, pk_lengths, [1.0, 1.0, 1.0, 0.0, 0.0], 2048, step=None, trials=None)
    pf = plot.load_passkey(run_fam)
    run_check("load_passkey: sorted by length, accuracy along, train_seq_len, trials",
              lambda: (list(pf.lengths) == pk_lengths and list(pf.accuracy) == [1.0, 1.0, 1.0, 0.8, 0.6]
                       and pf.train_ctx == 1024 and pf.trials == 5 and pf.label == "fam", f"{list(pf.accuracy)}"))
    pruns = [pf, plot.load_passkey(run_swa), plot.load_passkey(pk_full, "full attention")]
    pfig = plot.passkey_figure(pruns)
    pax = pfig.get_axes()
    ax = pax[0]
    solid = [l for l in ax.get_lines() if l.get_linestyle() != "--"]
    dashed = [l for l in ax.get_lines() if l.get_linestyle() == "--"]
    run_check("passkey figure: one panel, a line per file with its accuracies",
              lambda: (len(pax) == 1 and len(solid) == 3 and list(solid[0].get_ydata()) == [1.0, 1.0, 1.0, 0.8, 0.6]
                       and list(solid[2].get_xdata()) == pk_lengths, f"{len(solid)} lines"))
    run_check("passkey figure: a dashed line per training context (1024 shared, 2048)",
              lambda: (sorted(l.get_xdata()[0] for l in dashed) == [1024, 2048], f"{[l.get_xdata() for l in dashed]}"))
    run_check("passkey figure: log2 x axis, accuracy 0..1, labels",
              lambda: (ax.get_xscale() == "log" and ax.get_ylim()[0] <= 0 and ax.get_ylim()[1] >= 1
                       and "context length" in ax.get_xlabel() and "accuracy" in ax.get_ylabel(),
                       f"{ax.get_xscale()} {ax.get_ylim()}"))
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    run_check("passkey figure: legend names the runs (label, trials)",
              lambda: (legend[:3] == ["fam, 5 trials", "swa, 5 trials", "full attention"], f"{legend}"))

    # --- MQAR
    mq = os.path.join(tmp, "mqar")
    mq_files, mq_labels = [], []
    for model, base in (("fox", 1.0), ("gsa", 0.7)):
        for i, kv in enumerate((4, 16, 8, 32)):
            fn = os.path.join(mq, f"{model}_kv{kv}.json")
            write_mqar(fn, kv, round(base - 0.1 * i, 3))
            mq_files.append(fn)
            mq_labels.append(model)
    write_mqar(os.path.join(mq, "fox_kv16_lr2.json"), 16, 0.95)  # a sweep's better run at 16
    write_mqar(os.path.join(mq, "fox_kv8_lr2.json"), 8, 0.1)     # and a worse one at 8
    mq_files += [os.path.join(mq, "fox_kv16_lr2.json"), os.path.join(mq, "fox_kv8_lr2.json")]
    mq_labels += ["fox", "fox"]
    mres = [plot.load_mqar(f, lab) for f, lab in zip(mq_files, mq_labels)]
    groups = plot.mqar_groups(mres)
    run_check("mqar_groups: one group per label, num_kv ascending, the best accuracy at each",
              lambda: (list(groups) == ["fox", "gsa"] and list(groups["fox"][0]) == [4, 8, 16, 32]
                       and np.allclose(groups["fox"][1], [1.0, 0.8, 0.95, 0.7])
                       and np.allclose(groups["gsa"][1], [0.7, 0.5, 0.6, 0.4]), f"{groups}"))
    mfig = plot.mqar_figure(mres)
    ax = mfig.get_axes()[0]
    run_check("mqar figure: a line per label, log2 x, key-value pairs, sequence length in the title",
              lambda: (len(ax.get_lines()) == 2 and ax.get_xscale() == "log" and "key-value" in ax.get_xlabel()
                       and "256" in ax.get_title()
                       and [t.get_text() for t in ax.get_legend().get_texts()] == ["fox", "gsa"],
                       f"{len(ax.get_lines())} lines, {ax.get_title()!r}"))
    run_check("mqar figure: the sweep's other runs as dots", lambda: (len(ax.collections) == 1, f"{len(ax.collections)}"))
    run_mq = os.path.join(tmp, "mqar_run")
    write_mqar(os.path.join(run_mq, "mqar_result.json"), 64, 0.5)
    rm = plot.load_mqar(run_mq)
    run_check("load_mqar: a run directory stands for its mqar_result.json, label = dir name",
              lambda: (rm.label == "mqar_run" and rm.num_kv == 64 and rm.accuracy == 0.5 and rm.seq_len == 256, f"{rm}"))

    # --- evaluation metrics vs step (log.jsonl)
    ev_a, ev_b = os.path.join(tmp, "ev_a"), os.path.join(tmp, "ev_b")
    write_eval_log(os.path.join(ev_a, "log.jsonl"), 40, {
        10: {"niah_score": 0.1, "passkey_acc": 0.2, "mc_acc": 0.25, "mc_acc_norm": 0.26, "mqar_acc": 0.3},
        20: {"niah_score": 0.4, "passkey_acc": 0.5, "mc_acc": 0.27, "mc_acc_norm": 0.29, "mqar_acc": 0.6},
        40: {"niah_score": 0.9, "hellaswag_acc": 0.3}})
    write_eval_log(os.path.join(ev_b, "log.jsonl"), 30, {15: {"passkey_acc": 0.1}, 30: {"passkey_acc": 0.7}})
    ea = plot.load_evals(ev_a)
    run_check("load_evals: the metrics in order (known ones, then others ending in _acc), steps and values",
              lambda: (list(ea.metrics) == ["niah_score", "passkey_acc", "mc_acc", "mc_acc_norm", "mqar_acc",
                                            "hellaswag_acc"]
                       and list(ea.metrics["niah_score"][0]) == [10, 20, 40]
                       and list(ea.metrics["niah_score"][1]) == [0.1, 0.4, 0.9]
                       and list(ea.metrics["mc_acc_norm"][1]) == [0.26, 0.29], f"{list(ea.metrics)}"))
    run_check("split_evals ignores loss, val_loss, lr, grad_norm",
              lambda: not (set(plot.split_evals(plot.read_log(os.path.join(ev_a, "log.jsonl"))))
                           & {"loss", "val_loss", "lr", "grad_norm"}))
    eb = plot.load_evals(os.path.join(ev_b, "log.jsonl"), "B")
    vfig = plot.evals_figure([ea, eb])
    vax = vfig.get_axes()
    titles = [a.get_title() for a in vax]
    run_check("evals figure: one panel per metric present",
              lambda: (len(vax) == 6 and any("needle" in t for t in titles) and any("MQAR" in t for t in titles),
                       f"{titles}"))
    pk_ax = vax[1]
    run_check("evals figure: passkey panel has both runs, value vs step",
              lambda: (len(pk_ax.get_lines()) == 2 and list(pk_ax.get_lines()[1].get_xdata()) == [15, 30]
                       and list(pk_ax.get_lines()[1].get_ydata()) == [0.1, 0.7] and pk_ax.get_xlabel() == "step"
                       and [t.get_text() for t in pk_ax.get_legend().get_texts()] == ["ev_a", "B"], ""))
    run_check("evals figure: a run keeps its colour across panels",
              lambda: vax[0].get_lines()[0].get_color() == vax[1].get_lines()[0].get_color()
              != vax[1].get_lines()[1].get_color())
    run_check("evals figure: panels of metrics only one run has hold one line",
              lambda: (len(vax[0].get_lines()) == 1 and len(vax[4].get_lines()) == 1, ""))

    # --- evaluation CLI, success paths
    o = os.path.join(tmp, "niah.png")
    res = cli("niah", run_n, "--out", o)
    run_check("CLI niah (run dir) writes a valid PNG", lambda: png_ok(res, o))
    res = cli("niah", niah_easy)
    run_check("CLI niah without --out writes the file's name with .png beside it",
              lambda: png_ok(res, os.path.join(tmp, "niah_easy.png")))
    res = cli("niah", run_n)
    run_check("CLI niah (run dir) without --out writes RUN/niah.png",
              lambda: png_ok(res, os.path.join(run_n, "niah.png")))
    o = os.path.join(tmp, "passkey.png")
    res = cli("passkey", run_fam, run_swa, pk_full, "--out", o, "--label", "FAM", "SWA", "full")
    run_check("CLI passkey (3 inputs, --label NAME...) writes a valid PNG", lambda: png_ok(res, o))
    res = cli("passkey", run_fam, "--label", "FAM")
    run_check("CLI passkey without --out writes RUN/passkey.png",
              lambda: png_ok(res, os.path.join(run_fam, "passkey.png")))
    o = os.path.join(tmp, "passkey2.png")
    res = cli("passkey", run_fam, run_swa, "--out", o, "--labels", "a,b")
    run_check("CLI passkey with --labels a,b writes a valid PNG", lambda: png_ok(res, o))
    o = os.path.join(tmp, "mqar.png")
    res = cli("mqar", *mq_files, "--label", *mq_labels, "--out", o)
    run_check("CLI mqar (files grouped by --label) writes a valid PNG", lambda: png_ok(res, o))
    o = os.path.join(tmp, "mqar_runs.png")
    res = cli("mqar", run_mq, mq_files[0], "--out", o)
    run_check("CLI mqar (a run dir and a file, labels from the directories) writes a valid PNG", lambda: png_ok(res, o))
    o = os.path.join(tmp, "evals.png")
    res = cli("evals", ev_a, os.path.join(ev_b, "log.jsonl"), "--out", o)
    run_check("CLI evals (run dir + log) writes a valid PNG", lambda: png_ok(res, o))
    res = cli("evals", ev_b)
    run_check("CLI evals without --out writes RUN/evals.png", lambda: png_ok(res, os.path.join(ev_b, "evals.png")))
    res = cli("--help")
    run_check("plot.py --help lists niah, passkey, mqar, evals",
              lambda: (res.returncode == 0 and all(c in res.stdout for c in ("niah", "passkey", "mqar", "evals")), ""))

    # --- evaluation CLI, error paths
    never = os.path.join(tmp, "never_eval.png")

    def bad_json(name, text):
        path = os.path.join(tmp, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    res = cli("niah", os.path.join(tmp, "nope"), "--out", never)
    run_check("CLI niah missing run dir -> one-line error", lambda: err_ok(res, "nope"))
    res = cli("niah", run_a, "--out", never)
    run_check("CLI niah on a run without niah.json -> one-line error naming it", lambda: err_ok(res, "niah.json"))
    res = cli("niah", os.path.join(run_fam, "passkey.json"), "--out", never)
    run_check("CLI niah on a passkey result -> one-line error (wrong task)",
              lambda: err_ok(res, '"task" is "passkey", expected "niah"'))
    res = cli("niah", bad_json("trunc.json", '{"task": "niah", "lengths": [1'), "--out", never)
    run_check("CLI niah malformed JSON -> one-line error", lambda: err_ok(res, "bad JSON"))
    res = cli("niah", bad_json("list.json", "[1, 2]"), "--out", never)
    run_check("CLI niah on a JSON list -> one-line error", lambda: err_ok(res, "JSON object"))
    res = cli("niah", bad_json("notask.json", '{"lengths": [1]}'), "--out", never)
    run_check("CLI niah without task -> one-line error", lambda: err_ok(res, '"task" is missing'))
    res = cli("niah", bad_json("shape.json", json.dumps({"task": "niah", "lengths": [256, 512], "depths": [0, 50],
                                                         "score": [[1, 1], [1]]})), "--out", never)
    run_check("CLI niah score of the wrong shape -> one-line error", lambda: err_ok(res, "score must be"))
    res = cli("niah", bad_json("range.json", json.dumps({"task": "niah", "lengths": [256], "depths": [0],
                                                         "score": [[1.5]]})), "--out", never)
    run_check("CLI niah score outside [0, 1] -> one-line error", lambda: err_ok(res, "[0, 1]"))
    res = cli("niah", bad_json("nolen.json", json.dumps({"task": "niah", "depths": [0], "score": [[1]]})), "--out", never)
    run_check("CLI niah without lengths -> one-line error", lambda: err_ok(res, "lengths"))
    res = cli("passkey", run_fam, os.path.join(tmp, "nope.json"), "--out", never)
    run_check("CLI passkey missing file -> one-line error", lambda: err_ok(res, "nope.json"))
    res = cli("passkey", os.path.join(run_n, "niah.json"), "--out", never)
    run_check("CLI passkey on a niah result -> one-line error (wrong task)", lambda: err_ok(res, 'expected "passkey"'))
    res = cli("passkey", bad_json("pk_len.json", json.dumps({"task": "passkey", "lengths": [256, 512],
                                                             "accuracy": [1.0]})), "--out", never)
    run_check("CLI passkey lengths and accuracy of different sizes -> one-line error", lambda: err_ok(res, "2 lengths"))
    res = cli("passkey", bad_json("pk_ctx.json", json.dumps({"task": "passkey", "lengths": [256], "accuracy": [1.0],
                                                             "train_seq_len": "long"})), "--out", never)
    run_check("CLI passkey train_seq_len not an integer -> one-line error", lambda: err_ok(res, "train_seq_len"))
    res = cli("passkey", run_fam, run_swa, "--out", never, "--label", "only_one")
    run_check("CLI passkey --label count mismatch -> one-line error", lambda: err_ok(res, "--label"))
    res = cli("passkey", run_fam, "--out", never, "--label", "a", "--labels", "a")
    run_check("CLI passkey --label with --labels -> one-line error", lambda: err_ok(res, "not both"))
    dataset = os.path.join(tmp, "mqar_dataset")
    os.makedirs(dataset)
    with open(os.path.join(dataset, "mqar.json"), "w") as f:
        json.dump({"task": "mqar", "num_kv": 8, "seq_len": 256, "vocab_size": 8192, "train": 1000}, f)
    res = cli("mqar", dataset, "--out", never)
    run_check("CLI mqar on fox_data's dataset directory -> one-line error naming mqar_result.json",
              lambda: err_ok(res, "mqar_result.json"))
    res = cli("mqar", os.path.join(dataset, "mqar.json"), "--out", never)
    run_check("CLI mqar on the dataset's mqar.json (no accuracy) -> one-line error", lambda: err_ok(res, "no accuracy"))
    res = cli("mqar", os.path.join(run_fam, "passkey.json"), "--out", never)
    run_check("CLI mqar on a passkey result -> one-line error (wrong task)", lambda: err_ok(res, 'expected "mqar"'))
    res = cli("mqar", bad_json("mq_kv.json", json.dumps({"task": "mqar", "accuracy": 0.5})), "--out", never)
    run_check("CLI mqar without num_kv -> one-line error", lambda: err_ok(res, "num_kv"))
    res = cli("mqar", bad_json("mq_bad.json", '{"task": "mqar", "num_kv": 8, "accuracy": }'), "--out", never)
    run_check("CLI mqar malformed JSON -> one-line error", lambda: err_ok(res, "bad JSON"))
    res = cli("evals", run_a, "--out", never)
    run_check("CLI evals on a log without evaluation lines -> one-line error", lambda: err_ok(res, "no evaluation lines"))
    res = cli("evals", ev_a, os.path.join(tmp, "nope"), "--out", never)
    run_check("CLI evals missing run -> one-line error", lambda: err_ok(res, "nope"))
    res = cli("evals", bad, "--out", never)
    run_check("CLI evals bad JSON line -> one-line error naming line 3", lambda: err_ok(res, "bad.jsonl:3:"))
    res = cli("evals", ev_a, "--out", os.path.join(tmp, "no_dir", "x.png"))
    run_check("CLI evals into a missing directory -> one-line error", lambda: err_ok(res, "does not exist"))
    run_check("no evaluation output written on errors", lambda: not os.path.exists(never))

    if os.environ.get("PLOT_TEST_KEEP"):
        print(f"kept outputs in {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
