#!/usr/bin/python3
"""Plots for fox.c runs: per-token loss / perplexity, and training curves.

Two kinds of figure (docs/model.md §6):

per-token
    For each run, the per-token validation loss L(i) (``per_token_loss.npy``,
    a 1-D float64 vector written by the trainers' eval), smoothed with a
    centred moving average (101 tokens by default; the window shrinks at the
    edges), in the top panel, and the prefix perplexity
    P(l) = exp(mean_{i<=l} L(i)), computed from the same vector, in the bottom
    panel.  The training context is marked by a vertical dashed line, taken
    from ``--train-ctx`` or else from ``train_seq_len`` in the
    ``per_token_loss.json`` next to the npy.

doc-pos
    For each run, the validation loss by position within the document
    (``doc_pos_loss.npy`` with the token counts of ``doc_pos_count.npy``
    beside it, written by ``--eval-only --eval-doc-pos``), smoothed by a
    count-weighted centred moving average, in the top panel, and the tokens
    counted at each position in the bottom panel (log scale).

curves
    For each run, training loss vs step and validation loss vs step, read
    from the JSON-lines log ``log.jsonl`` (training lines carry ``loss``,
    validation lines ``val_loss``; other lines are ignored).

acp
    For each run (one panel each), the fraction of attention tiles that
    Adaptive Computation Pruning skips in each layer (the mean over its
    heads) vs step, from the ``acp_pruned`` matrices (layers x heads) of the
    step lines of ``log.jsonl`` (``--acp 1``; README: when they are written),
    with the whole model's fraction (1 - ``acp_live``) as a thick black line.

Usage (needs only numpy and matplotlib; Debian's /usr/bin/python3 has both):

    plot.py per-token RUN_OR_NPY [...] --out FILE.png [--labels a,b]
                      [--train-ctx T] [--logx] [--window 101]
    plot.py doc-pos RUN_OR_NPY [...] --out FILE.png [--labels a,b] [--window 101]
    plot.py curves LOG_JSONL_OR_RUNDIR [...] --out FILE.png [--labels a,b]
    plot.py acp LOG_JSONL_OR_RUNDIR [...] --out FILE.png [--labels a,b]

A run directory stands for the file of the expected name inside it.  Legend
labels default to the run's directory name.  On bad input the script prints
one line ``plot.py: error: ...`` to stderr and exits with status 1.

The building blocks (moving_average, perplexity_curve, read_log,
load_per_token, load_doc_pos, load_curves, load_acp, per_token_figure,
doc_pos_figure, curves_figure, acp_figure) are importable;
the figure builders return a matplotlib Figure without saving it.
"""

import argparse
import json
import os
import sys
from dataclasses import dataclass, field
from typing import List, Optional

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

PER_TOKEN_NPY = "per_token_loss.npy"
PER_TOKEN_JSON = "per_token_loss.json"
DOC_POS_NPY = "doc_pos_loss.npy"
DOC_POS_COUNT_NPY = "doc_pos_count.npy"
LOG_JSONL = "log.jsonl"


class PlotError(Exception):
    """Bad input; the message is shown to the user as one line."""


# ---------------------------------------------------------------------------
# Computations


def moving_average(x, w):
    """Centred moving average of a 1-D array over a window of w samples.

    Output i is the mean of x[i - (w-1)//2 : i - (w-1)//2 + w], clipped to the
    array: near the edges the window shrinks to the neighbours that exist (no
    zero padding).  For odd w the window is centred exactly.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError("moving_average expects a 1-D array")
    w = int(w)
    if w < 1:
        raise ValueError("window must be >= 1")
    n = len(x)
    csum = np.concatenate(([0.0], np.cumsum(x)))
    idx = np.arange(n)
    lo = np.clip(idx - (w - 1) // 2, 0, n)
    hi = np.clip(idx - (w - 1) // 2 + w, 0, n)
    return (csum[hi] - csum[lo]) / (hi - lo)


def perplexity_curve(L):
    """P(l) = exp(mean_{i<=l} L(i)) for l = 0..len(L)-1."""
    L = np.asarray(L, dtype=np.float64)
    return np.exp(np.cumsum(L) / np.arange(1, len(L) + 1))


# ---------------------------------------------------------------------------
# Loading inputs


@dataclass
class PerTokenRun:
    label: str
    loss: np.ndarray            # L(i), float64, 1-D
    train_ctx: Optional[int]    # train_seq_len from the json, if any
    meta: dict = field(default_factory=dict)


@dataclass
class CurvesRun:
    label: str
    train_step: np.ndarray
    train_loss: np.ndarray
    val_step: np.ndarray
    val_loss: np.ndarray


@dataclass
class AcpRun:
    label: str
    step: np.ndarray            # (n,) the steps whose line carries acp_pruned
    pruned: np.ndarray          # (n, layers, heads) fractions of tiles skipped


def _resolve(path, default_name):
    """A directory stands for default_name inside it; returns (file, label)."""
    if os.path.isdir(path):
        file = os.path.join(path, default_name)
    else:
        file = path
    if not os.path.isfile(file):
        raise PlotError(f"no such file: {file}")
    label = os.path.basename(os.path.dirname(os.path.abspath(file)))
    return file, label


def _load_vector(npy):
    """A 1-D float .npy, or PlotError."""
    try:
        x = np.load(npy, allow_pickle=False)
    except Exception as e:  # corrupt file, pickled object, not npy at all
        raise PlotError(f"{npy}: not a readable .npy file ({e})") from None
    if not isinstance(x, np.ndarray) or x.ndim != 1 or x.dtype.kind != "f" or len(x) == 0:
        raise PlotError(f"{npy}: expected a non-empty 1-D float array, got {getattr(x, 'dtype', '?')} "
                        f"{getattr(x, 'shape', '?')}")
    return x.astype(np.float64)


def load_per_token(path, label=None):
    """Load a run directory or a per-token-loss .npy (plus its json if any)."""
    npy, default_label = _resolve(path, PER_TOKEN_NPY)
    loss = _load_vector(npy)

    meta = {}
    stem_json = os.path.splitext(npy)[0] + ".json"
    side_json = os.path.join(os.path.dirname(npy), PER_TOKEN_JSON)
    for js in (stem_json, side_json):
        if os.path.isfile(js):
            try:
                with open(js) as f:
                    meta = json.load(f)
            except (OSError, ValueError) as e:
                raise PlotError(f"{js}: bad JSON ({e})") from None
            if not isinstance(meta, dict):
                raise PlotError(f"{js}: expected a JSON object")
            break
    train_ctx = meta.get("train_seq_len")
    if train_ctx is not None:
        try:
            train_ctx = int(train_ctx)
        except (TypeError, ValueError):
            raise PlotError(f"{js}: train_seq_len is not an integer") from None
    return PerTokenRun(label or default_label, loss, train_ctx, meta)


@dataclass
class DocPosRun:
    label: str
    loss: np.ndarray   # mean loss at each position within the document (NaN: none counted)
    count: np.ndarray  # tokens counted at each position


def load_doc_pos(path, label=None):
    """Load a run directory or a doc_pos_loss.npy, with the doc_pos_count.npy beside it."""
    npy, default_label = _resolve(path, DOC_POS_NPY)
    count_npy = os.path.join(os.path.dirname(npy), DOC_POS_COUNT_NPY)
    if not os.path.isfile(count_npy):
        raise PlotError(f"no such file: {count_npy} (written with {DOC_POS_NPY} by --eval-doc-pos)")
    loss, count = _load_vector(npy), _load_vector(count_npy)
    if len(loss) != len(count):
        raise PlotError(f"{npy} has {len(loss)} positions, {count_npy} {len(count)}")
    if not (count > 0).any():
        raise PlotError(f"{count_npy}: no token was counted")
    return DocPosRun(label or default_label, loss, count)


def weighted_moving_average(loss, count, w):
    """Centred moving average of loss weighted by count (positions without tokens weigh 0); NaN where the
    window holds no token."""
    total = moving_average(np.where(count > 0, loss * count, 0.0), w)
    weight = moving_average(count, w)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(weight > 0, total / weight, np.nan)


def read_log(path):
    """Parse a JSON-lines log into a list of dicts (blank lines skipped).

    Raises PlotError for a missing or empty file, or a line that is not a
    JSON object (naming the line number).
    """
    if not os.path.isfile(path):
        raise PlotError(f"no such file: {path}")
    records = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError as e:
                raise PlotError(f"{path}:{lineno}: bad JSON line ({e})") from None
            if not isinstance(rec, dict):
                raise PlotError(f"{path}:{lineno}: not a JSON object")
            records.append(rec)
    if not records:
        raise PlotError(f"{path}: empty log")
    return records


def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def split_curves(records):
    """(train_step, train_loss, val_step, val_loss) arrays from log records.

    Training lines have `step` and `loss`; validation lines have `step` and
    `val_loss` and no `loss`.  Anything else is ignored.
    """
    ts, tl, vs, vl = [], [], [], []
    for rec in records:
        step = rec.get("step")
        if not _is_number(step):
            continue
        if _is_number(rec.get("loss")):
            ts.append(step)
            tl.append(rec["loss"])
        elif _is_number(rec.get("val_loss")):
            vs.append(step)
            vl.append(rec["val_loss"])
    return tuple(np.asarray(a, dtype=np.float64) for a in (ts, tl, vs, vl))


def load_curves(path, label=None):
    """Load a log.jsonl (or the one in a run directory) as a CurvesRun."""
    file, default_label = _resolve(path, LOG_JSONL)
    ts, tl, vs, vl = split_curves(read_log(file))
    if len(ts) == 0 and len(vs) == 0:
        raise PlotError(f"{file}: no training or validation lines")
    return CurvesRun(label or default_label, ts, tl, vs, vl)


def load_acp(path, label=None):
    """The acp_pruned matrices of a log.jsonl (or the one in a run directory) as an AcpRun."""
    file, default_label = _resolve(path, LOG_JSONL)
    steps, mats = [], []
    for rec in read_log(file):
        m = rec.get("acp_pruned")
        if m is None or not _is_number(rec.get("step")):
            continue
        try:
            a = np.asarray(m, dtype=np.float64)
        except (TypeError, ValueError):
            a = np.zeros(0)
        if a.ndim != 2 or a.size == 0 or (mats and a.shape != mats[0].shape):
            raise PlotError(f"{file}: step {rec['step']}: acp_pruned is not a layers x heads matrix like the others")
        steps.append(rec["step"])
        mats.append(a)
    if not mats:
        raise PlotError(f"{file}: no acp_pruned lines (a run with --acp 1 writes them)")
    return AcpRun(label or default_label, np.asarray(steps, dtype=np.float64), np.stack(mats))


# ---------------------------------------------------------------------------
# Figures


def per_token_figure(runs: List[PerTokenRun], train_ctx=None, logx=False,
                     window=101):
    """Two panels sharing the x axis: smoothed L(i) on top, P(l) below.

    train_ctx overrides the runs' own train_seq_len; each distinct training
    context is drawn as one vertical dashed line on both panels.
    """
    fig = Figure(figsize=(9, 8), constrained_layout=True)
    ax_loss, ax_ppl = fig.subplots(2, 1, sharex=True)
    for run in runs:
        x = np.arange(len(run.loss))
        smooth = moving_average(run.loss, window)
        ppl = perplexity_curve(run.loss)
        if logx:  # position 0 has no place on a log axis
            x, smooth, ppl = x[1:], smooth[1:], ppl[1:]
        line, = ax_loss.plot(x, smooth, lw=1.2, label=run.label)
        ax_ppl.plot(x, ppl, lw=1.2, color=line.get_color(), label=run.label)

    if train_ctx is not None:
        contexts = [int(train_ctx)]
    else:
        contexts = sorted({r.train_ctx for r in runs if r.train_ctx})
    for ctx in contexts:
        for ax in (ax_loss, ax_ppl):
            ax.axvline(ctx, color="0.3", ls="--", lw=1,
                       label=f"training context {ctx}")

    ax_loss.set_title(f"Per-token loss (centred moving average, {window} tokens)")
    ax_loss.set_ylabel("loss L(i) (nats)")
    ax_ppl.set_title("Perplexity of the prefix, P(l) = exp(mean of L(i), i ≤ l)")
    ax_ppl.set_ylabel("perplexity P(l)")
    ax_ppl.set_xlabel("token position")
    for ax in (ax_loss, ax_ppl):
        if logx:
            ax.set_xscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    return fig


def doc_pos_figure(runs: List[DocPosRun], window=101):
    """Two panels sharing the x axis: the smoothed loss by position within the document on top, the
    tokens counted at each position below."""
    fig = Figure(figsize=(9, 8), constrained_layout=True)
    ax_loss, ax_count = fig.subplots(2, 1, sharex=True)
    for run in runs:
        x = np.arange(len(run.loss))
        line, = ax_loss.plot(x, weighted_moving_average(run.loss, run.count, window), lw=1.2, label=run.label)
        ax_count.plot(x, run.count, lw=1, color=line.get_color(), label=run.label)
    ax_loss.set_title(f"Loss by position within the document (count-weighted moving average, {window} tokens)")
    ax_loss.set_ylabel("loss (nats)")
    ax_count.set_title("Tokens counted at each position")
    ax_count.set_ylabel("tokens")
    ax_count.set_yscale("log")
    ax_count.set_xlabel("position within the document (its separator at 0)")
    for ax in (ax_loss, ax_count):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    return fig


def curves_figure(runs: List[CurvesRun]):
    """One panel: train loss (solid) and val loss (dashed, dots) vs step."""
    fig = Figure(figsize=(9, 5.5), constrained_layout=True)
    ax = fig.subplots()
    for run in runs:
        color = None
        if len(run.train_step):
            line, = ax.plot(run.train_step, run.train_loss, lw=1,
                            label=f"{run.label} train")
            color = line.get_color()
        if len(run.val_step):
            ax.plot(run.val_step, run.val_loss, ls="--", marker="o", ms=3,
                    lw=1.2, color=color, label=f"{run.label} val")
    ax.set_title("Training curves")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    return fig


def acp_figure(runs: List[AcpRun]):
    """One panel per run: each layer's pruned fraction (mean over heads, %) vs step, and the model's."""
    fig = Figure(figsize=(9, 4 * len(runs) + 1), constrained_layout=True)
    axes = fig.subplots(len(runs), 1, squeeze=False)[:, 0]
    for ax, run in zip(axes, runs):
        layers = run.pruned.mean(axis=2)
        L = layers.shape[1]
        cmap = matplotlib.colormaps["viridis"]
        for l in range(L):
            ax.plot(run.step, 100 * layers[:, l], lw=1, color=cmap(l / max(L - 1, 1)), label=f"layer {l}")
        ax.plot(run.step, 100 * run.pruned.mean(axis=(1, 2)), lw=2.5, color="black", label="all layers")
        ax.set_title(f"{run.label}: attention tiles pruned by ACP, per layer (mean over {run.pruned.shape[2]} heads)")
        ax.set_xlabel("step")
        ax.set_ylabel("tiles pruned (%)")
        ax.set_ylim(0, 100)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small", ncol=max(1, (L + 1) // 12))
    return fig


# ---------------------------------------------------------------------------
# Command line


def _labels(arg, n):
    if arg is None:
        return [None] * n
    labels = arg.split(",")
    if len(labels) != n:
        raise PlotError(f"--labels has {len(labels)} entries for {n} inputs")
    return labels


def _save(fig, out):
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise PlotError(f"output directory does not exist: {parent}")
    fig.savefig(out, dpi=120)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="plot.py", description="Plot fox.c per-token loss, training curves or ACP's pruning.")
    sub = parser.add_subparsers(dest="cmd", required=True)

    pt = sub.add_parser("per-token", help="per-token loss L(i) and perplexity P(l)")
    pt.add_argument("inputs", nargs="+", metavar="RUN_OR_NPY")
    pt.add_argument("--out", required=True, metavar="FILE.png")
    pt.add_argument("--labels", help="comma-separated legend labels, one per input")
    pt.add_argument("--train-ctx", type=int, metavar="T",
                    help="training context to mark (default: train_seq_len from the json)")
    pt.add_argument("--logx", action="store_true", help="log-scale token position")
    pt.add_argument("--window", type=int, default=101,
                    help="moving-average window in tokens (default 101)")

    dp = sub.add_parser("doc-pos", help="loss by position within the document")
    dp.add_argument("inputs", nargs="+", metavar="RUN_OR_NPY")
    dp.add_argument("--out", required=True, metavar="FILE.png")
    dp.add_argument("--labels", help="comma-separated legend labels, one per input")
    dp.add_argument("--window", type=int, default=101,
                    help="moving-average window in positions (default 101)")

    cv = sub.add_parser("curves", help="train and val loss vs step")
    cv.add_argument("inputs", nargs="+", metavar="LOG_JSONL_OR_RUNDIR")
    cv.add_argument("--out", required=True, metavar="FILE.png")
    cv.add_argument("--labels", help="comma-separated legend labels, one per input")

    ac = sub.add_parser("acp", help="ACP's pruned fraction of attention tiles per layer vs step")
    ac.add_argument("inputs", nargs="+", metavar="LOG_JSONL_OR_RUNDIR")
    ac.add_argument("--out", required=True, metavar="FILE.png")
    ac.add_argument("--labels", help="comma-separated panel titles, one per input")

    args = parser.parse_args(argv)
    try:
        labels = _labels(args.labels, len(args.inputs))
        if args.cmd == "per-token":
            if args.window < 1:
                raise PlotError("--window must be >= 1")
            runs = [load_per_token(p, lab) for p, lab in zip(args.inputs, labels)]
            fig = per_token_figure(runs, args.train_ctx, args.logx, args.window)
        elif args.cmd == "doc-pos":
            if args.window < 1:
                raise PlotError("--window must be >= 1")
            runs = [load_doc_pos(p, lab) for p, lab in zip(args.inputs, labels)]
            fig = doc_pos_figure(runs, args.window)
        elif args.cmd == "acp":
            runs = [load_acp(p, lab) for p, lab in zip(args.inputs, labels)]
            fig = acp_figure(runs)
        else:
            runs = [load_curves(p, lab) for p, lab in zip(args.inputs, labels)]
            fig = curves_figure(runs)
        _save(fig, args.out)
    except (PlotError, OSError) as e:
        msg = " ".join(str(e).split())  # always exactly one line
        print(f"plot.py: error: {msg}", file=sys.stderr)
        return 1
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
