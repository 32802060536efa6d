#!/usr/bin/python3
"""Plots for fox.c runs: per-token loss / perplexity, training curves, evaluations.

The figures (docs/model.md §6):

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
    step lines of ``log.jsonl`` (``--acp 1``; docs/usage.md: when they are written),
    with the whole model's fraction (1 - ``acp_live``) as a thick black line.

niah
    The needle-in-a-haystack heatmap of a ``niah.json`` (written by the
    trainers' evaluation), in the style of the FoX paper's figure: context
    length in tokens across, needle depth (%, 0 at the top) down, each cell's
    score from red (0) through yellow to green (1), null scores grey; a
    dashed black line between the lengths within the training context
    (``train_seq_len``, if given) and the longer ones; the title gives the
    mode (easy / standard), the mean score and the step.  The file:
    {"task": "niah", "mode", "step", "train_seq_len", "lengths": [L...],
    "depths": [d...] (percent; all within [0, 1]: fractions), "score":
    [[score at each depth] for each length], "mean", ...}.

passkey
    Passkey retrieval accuracy vs context length (log2 axis), one line per
    ``passkey.json`` ({"task": "passkey", "step", "train_seq_len", "trials",
    "lengths": [L...], "accuracy": [a...], ...}), e.g. TransformerFAM vs a
    sliding window vs full attention, with a dashed line at each run's
    training context.

mqar
    MQAR accuracy vs the number of key-value pairs (log2 axis): each input is
    one result {"task": "mqar", "step", "num_kv", "seq_len", "examples",
    "answers", "accuracy"}; the inputs that share a label (--label, else the
    run directory's name) are one model's line, through its best accuracy at
    each num_kv (a sweep's other runs are faint dots).  In a run directory the
    result is ``mqar_result.json`` (``mqar.json`` is fox_data's dataset).

evals
    For each run, the evaluation lines of ``log.jsonl`` ({"step": 100,
    "niah_score": 0.31}, "passkey_acc", "mc_acc" and "mc_acc_norm",
    "mqar_acc", and any other key ending in _acc, _acc_norm or _score): one
    panel per metric, its value vs step, one line per run: when a skill
    appears during training.

Usage (needs only numpy and matplotlib; Debian's /usr/bin/python3 has both):

    plot.py per-token RUN_OR_NPY [...] --out FILE.png [--labels a,b]
                      [--train-ctx T] [--logx] [--window 101]
    plot.py doc-pos RUN_OR_NPY [...] --out FILE.png [--labels a,b] [--window 101]
    plot.py curves LOG_JSONL_OR_RUNDIR [...] --out FILE.png [--labels a,b]
    plot.py acp LOG_JSONL_OR_RUNDIR [...] --out FILE.png [--labels a,b]
    plot.py niah RUN_OR_FILE [--out FILE.png] [--label NAME]
    plot.py passkey RUN_OR_FILE [...] [--out FILE.png] [--label NAME ...]
    plot.py mqar FILE_OR_RUN [...] [--out FILE.png] [--label NAME ...]
    plot.py evals RUN_OR_LOG [...] [--out FILE.png] [--label NAME ...]

A run directory stands for the file of the expected name inside it
(per_token_loss.npy, doc_pos_loss.npy, log.jsonl, niah.json, passkey.json,
mqar_result.json).  Legend labels default to the run's directory name; the
evaluation subcommands take them as --label NAME ... (after the inputs, or
repeated) or --labels a,b.  Their --out defaults to the first input's name
with .png beside it (niah.json -> niah.png), evals.png beside the log.  On
bad input (a missing file, malformed JSON, a result of another "task", a log
without the lines asked for) the script prints one line
``plot.py: error: ...`` to stderr and exits with status 1.

The building blocks (moving_average, perplexity_curve, read_log,
load_per_token, load_doc_pos, load_curves, load_acp, load_niah,
load_passkey, load_mqar, load_evals, split_evals, mqar_groups,
per_token_figure, doc_pos_figure, curves_figure, acp_figure, niah_figure,
passkey_figure, mqar_figure, evals_figure) are importable;
the figure builders return a matplotlib Figure without saving it.
"""

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass, field
from typing import List, Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.colors  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

PER_TOKEN_NPY = "per_token_loss.npy"
PER_TOKEN_JSON = "per_token_loss.json"
DOC_POS_NPY = "doc_pos_loss.npy"
DOC_POS_COUNT_NPY = "doc_pos_count.npy"
LOG_JSONL = "log.jsonl"
NIAH_JSON = "niah.json"
PASSKEY_JSON = "passkey.json"
MQAR_RESULT_JSON = "mqar_result.json"  # not mqar.json: that is fox_data's MQAR dataset

# The evaluation lines' metrics of log.jsonl, in panel order, with their panel titles; any other key ending in
# one of EVAL_METRIC_SUFFIXES is a metric too (after these).
EVAL_METRICS = {
    "niah_score": "needle in a haystack: mean score",
    "passkey_acc": "passkey retrieval: accuracy",
    "mc_acc": "multiple choice: accuracy",
    "mc_acc_norm": "multiple choice: accuracy, length-normalised",
    "mqar_acc": "MQAR: accuracy",
}
EVAL_METRIC_SUFFIXES = ("_acc", "_acc_norm", "_score")

# The needle-in-a-haystack colours (red, yellow, green), those of the FoX paper's and Kamradt's heatmaps.
NIAH_CMAP = matplotlib.colors.LinearSegmentedColormap.from_list("niah", ["#F0496E", "#EBB839", "#0CD79F"])


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
# Evaluation results (niah.json, passkey.json, mqar_result.json, log.jsonl's evaluation lines)


@dataclass
class NiahResult:
    label: str
    file: str
    mode: Optional[str]
    step: Optional[int]
    train_ctx: Optional[int]
    lengths: np.ndarray         # (n,) context lengths in tokens, ascending
    depths: np.ndarray          # (m,) needle depths in percent, as in the file
    score: np.ndarray           # (n, m) score of each length and depth, NaN where the file has null
    mean: float                 # the file's "mean" (else the mean of the scores)


@dataclass
class PasskeyResult:
    label: str
    file: str
    step: Optional[int]
    train_ctx: Optional[int]
    trials: Optional[int]
    lengths: np.ndarray         # (n,) ascending
    accuracy: np.ndarray        # (n,)


@dataclass
class MqarResult:
    label: str
    file: str
    step: Optional[int]
    num_kv: int
    seq_len: Optional[int]
    accuracy: float


@dataclass
class EvalsRun:
    label: str
    file: str
    metrics: dict               # {metric: (steps array, values array)}, in EVAL_METRICS order then the others


def _read_result(path, default_name, task):
    """(file, default label, object) of a result file (a run directory stands for default_name inside it),
    checked to be a JSON object of that "task"; PlotError otherwise."""
    if os.path.isdir(path) and not os.path.isfile(os.path.join(path, default_name)) and \
            default_name == MQAR_RESULT_JSON and os.path.isfile(os.path.join(path, "mqar.json")):
        raise PlotError(f"no such file: {os.path.join(path, default_name)} ({os.path.join(path, 'mqar.json')} "
                        f"is fox_data's MQAR dataset, not a result)")
    file, label = _resolve(path, default_name)
    try:
        with open(file, "rb") as f:
            obj = json.loads(f.read())
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
        raise PlotError(f"{file}: bad JSON ({e})") from None
    if not isinstance(obj, dict):
        raise PlotError(f"{file}: expected a JSON object, got {type(obj).__name__}")
    if obj.get("task") != task:
        got = json.dumps(obj["task"]) if "task" in obj else "missing"
        raise PlotError(f'{file}: "task" is {got}, expected "{task}"')
    return file, label, obj


def _opt_int(file, obj, key):
    """obj[key] as an int, None if absent or null; PlotError if it is something else."""
    v = obj.get(key)
    if v is None:
        return None
    if not _is_number(v) or not math.isfinite(v) or v != int(v):
        raise PlotError(f"{file}: {key} is {json.dumps(v)}, expected an integer or null")
    return int(v)


def _numbers(file, obj, key, positive=False, fraction=False, allow_null=False):
    """obj[key] as a non-empty 1-D float array (null -> NaN if allow_null); PlotError naming the key."""
    v = obj.get(key)
    if not isinstance(v, list) or not v:
        raise PlotError(f"{file}: {key} must be a non-empty list of numbers")
    for x in v:
        if x is None and allow_null:
            continue
        if not _is_number(x) or not math.isfinite(x) or (positive and x <= 0) or (fraction and not 0 <= x <= 1):
            want = "positive numbers" if positive else "numbers in [0, 1]" if fraction else "numbers"
            raise PlotError(f"{file}: {key} holds {json.dumps(x)}: expected {want}")
    return np.array([np.nan if x is None else x for x in v], dtype=np.float64)


def load_niah(path, label=None):
    """A niah.json (or the one in a run directory) as a NiahResult, its columns sorted by length."""
    file, default_label, obj = _read_result(path, NIAH_JSON, "niah")
    lengths = _numbers(file, obj, "lengths", positive=True)
    depths = _numbers(file, obj, "depths")
    rows = obj.get("score")
    if not isinstance(rows, list) or len(rows) != len(lengths) or \
            not all(isinstance(r, list) and len(r) == len(depths) for r in rows):
        raise PlotError(f"{file}: score must be a list of {len(lengths)} lists (one per length) of "
                        f"{len(depths)} scores (one per depth)")
    score = np.stack([_numbers(file, {"score": r}, "score", fraction=True, allow_null=True) for r in rows])
    if np.isnan(score).all():
        raise PlotError(f"{file}: every score is null")
    mean = obj.get("mean")
    if mean is None:
        mean = float(np.nanmean(score))
    elif not _is_number(mean) or not math.isfinite(mean):
        raise PlotError(f"{file}: mean is {json.dumps(mean)}, expected a number")
    mode = obj.get("mode")
    order = np.argsort(lengths, kind="stable")
    return NiahResult(label or default_label, file, None if mode is None else str(mode), _opt_int(file, obj, "step"),
                      _opt_int(file, obj, "train_seq_len"), lengths[order], depths, score[order], float(mean))


def load_passkey(path, label=None):
    """A passkey.json (or the one in a run directory) as a PasskeyResult, sorted by length."""
    file, default_label, obj = _read_result(path, PASSKEY_JSON, "passkey")
    lengths = _numbers(file, obj, "lengths", positive=True)
    acc = _numbers(file, obj, "accuracy", fraction=True)
    if len(acc) != len(lengths):
        raise PlotError(f"{file}: {len(lengths)} lengths but {len(acc)} accuracies")
    order = np.argsort(lengths, kind="stable")
    return PasskeyResult(label or default_label, file, _opt_int(file, obj, "step"),
                         _opt_int(file, obj, "train_seq_len"), _opt_int(file, obj, "trials"), lengths[order], acc[order])


def load_mqar(path, label=None):
    """An MQAR result (a file, or mqar_result.json in a run directory) as an MqarResult."""
    file, default_label, obj = _read_result(path, MQAR_RESULT_JSON, "mqar")
    if "accuracy" not in obj:
        raise PlotError(f"{file}: no accuracy: not an MQAR result (fox_data's dataset mqar.json has none; the "
                        f"trainer's result is {MQAR_RESULT_JSON})")
    acc = _numbers(file, {"accuracy": [obj["accuracy"]]}, "accuracy", fraction=True)[0]
    num_kv = _opt_int(file, obj, "num_kv")
    if num_kv is None or num_kv <= 0:
        raise PlotError(f"{file}: num_kv must be a positive integer")
    return MqarResult(label or default_label, file, _opt_int(file, obj, "step"), num_kv,
                      _opt_int(file, obj, "seq_len"), float(acc))


def _is_eval_metric(key):
    return key in EVAL_METRICS or key.endswith(EVAL_METRIC_SUFFIXES)


def split_evals(records):
    """{metric: (steps, values)} from log records: every evaluation key (EVAL_METRICS, or a name ending in
    _acc, _acc_norm or _score) of a line with a numeric step; known metrics first, in EVAL_METRICS order."""
    found = {}
    for rec in records:
        step = rec.get("step")
        if not _is_number(step):
            continue
        for key, v in rec.items():
            if _is_eval_metric(key) and _is_number(v):
                found.setdefault(key, ([], []))
                found[key][0].append(step)
                found[key][1].append(v)
    keys = [k for k in EVAL_METRICS if k in found] + sorted(k for k in found if k not in EVAL_METRICS)
    return {k: (np.asarray(found[k][0], dtype=np.float64), np.asarray(found[k][1], dtype=np.float64)) for k in keys}


def load_evals(path, label=None):
    """The evaluation lines of a log.jsonl (or the one in a run directory) as an EvalsRun."""
    file, default_label = _resolve(path, LOG_JSONL)
    metrics = split_evals(read_log(file))
    if not metrics:
        raise PlotError(f"{file}: no evaluation lines (niah_score, passkey_acc, mc_acc, mqar_acc, ...)")
    return EvalsRun(label or default_label, file, metrics)


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


def _tokens_label(n):
    """A context length for a tick: 1024 -> 1K, 1536 -> 1.5K, 100 -> 100."""
    n = int(n)
    return f"{n / 1024:g}K" if n >= 1024 and n % 256 == 0 else str(n)


def niah_boundary(lengths, train_ctx):
    """The x of the training-context line on the heatmap, whose columns are centred at 0..n-1: the boundary
    between the lengths <= train_ctx (left of it) and the longer ones."""
    return int(np.sum(np.asarray(lengths) <= train_ctx)) - 0.5


def niah_figure(res: NiahResult):
    """The FoX paper's needle-in-a-haystack heatmap: context length (columns) by needle depth (rows, 0% at the
    top), the score coloured from red (0) through yellow to green (1), null cells left grey; a dashed black
    line where the training context ends."""
    fig = Figure(figsize=(max(7.0, 2.0 + 0.55 * len(res.lengths)), max(4.5, 1.8 + 0.35 * len(res.depths))),
                 constrained_layout=True)
    ax = fig.subplots()
    n, m = res.score.shape
    mesh = ax.pcolormesh(np.arange(n + 1) - 0.5, np.arange(m + 1) - 0.5, np.ma.masked_invalid(res.score.T),
                         cmap=NIAH_CMAP, vmin=0.0, vmax=1.0, edgecolors="white", linewidth=0.5)
    ax.set_facecolor("0.85")
    ax.set_xlim(-0.5, n - 0.5)
    ax.set_ylim(m - 0.5, -0.5)  # depth 0% at the top
    ax.set_xticks(np.arange(n))
    ax.set_xticklabels([_tokens_label(L) for L in res.lengths], rotation=45, ha="right")
    ax.set_yticks(np.arange(m))
    depths = res.depths * 100 if np.max(res.depths) <= 1.0 else res.depths  # fractions -> percent
    ax.set_yticklabels([f"{d:g}" for d in depths])
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("needle depth (%)")
    if res.train_ctx is not None:
        x = niah_boundary(res.lengths, res.train_ctx)
        ax.axvline(x, color="black", ls="--", lw=2, label=f"training context {res.train_ctx}")
        ax.annotate(f"training context {_tokens_label(res.train_ctx)}", (x, 0), xycoords=("data", "axes fraction"),
                    xytext=(-4, 4), textcoords="offset points", rotation=90, ha="right", va="bottom",
                    fontsize="small")
    fig.colorbar(mesh, ax=ax, label="score")
    title = "Needle in a haystack" + (f" ({res.mode})" if res.mode else "") + f", {res.label}"
    title += f"\nmean score {res.mean:.3f}" + (f", step {res.step}" if res.step is not None else "")
    ax.set_title(title)
    return fig


def passkey_figure(runs: List[PasskeyResult]):
    """One panel: passkey accuracy vs context length (log2 axis), one line per result, a dashed vertical line at
    each run's training context (in its colour; grey where several runs share it)."""
    fig = Figure(figsize=(9, 5.5), constrained_layout=True)
    ax = fig.subplots()
    colors = {}
    for run in runs:
        trials = f", {run.trials} trials" if run.trials else ""
        line, = ax.plot(run.lengths, run.accuracy, marker="o", ms=4, lw=1.5, label=f"{run.label}{trials}")
        if run.train_ctx is not None:
            colors.setdefault(run.train_ctx, []).append(line.get_color())
    for ctx, cs in sorted(colors.items()):
        ax.axvline(ctx, color=cs[0] if len(cs) == 1 else "0.3", ls="--", lw=1, label=f"training context {ctx}")
    lengths = np.unique(np.concatenate([r.lengths for r in runs]))
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths)
    ax.set_xticklabels([_tokens_label(L) for L in lengths], rotation=45 if len(lengths) > 8 else 0)
    ax.minorticks_off()
    ax.set_ylim(-0.03, 1.03)
    ax.set_title("Passkey retrieval")
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("accuracy")
    ax.grid(True, alpha=0.3)
    ax.legend()
    return fig


def mqar_groups(results: List[MqarResult]):
    """{label: (num_kv ascending, best accuracy at each)} in the order labels first appear: the results that share
    a label are one model's points (several at one num_kv, e.g. a learning-rate sweep, give their best)."""
    groups = {}
    for r in results:
        groups.setdefault(r.label, {}).setdefault(r.num_kv, []).append(r.accuracy)
    return {lab: (np.array(sorted(g), dtype=np.float64), np.array([max(g[k]) for k in sorted(g)]))
            for lab, g in groups.items()}


def mqar_figure(results: List[MqarResult]):
    """One panel: MQAR accuracy vs the number of key-value pairs (log2 axis), one line per label through its
    best accuracy at each num_kv, every result a dot."""
    fig = Figure(figsize=(9, 5.5), constrained_layout=True)
    ax = fig.subplots()
    for lab, (kv, best) in mqar_groups(results).items():
        line, = ax.plot(kv, best, marker="o", ms=5, lw=1.5, label=lab)
        pts = [(r.num_kv, r.accuracy) for r in results if r.label == lab]
        if len(pts) > len(kv):  # the runs that are not the best at their num_kv
            ax.scatter(*zip(*pts), s=12, color=line.get_color(), alpha=0.4, zorder=1)
    kvs = sorted({r.num_kv for r in results})
    ax.set_xscale("log", base=2)
    ax.set_xticks(kvs)
    ax.set_xticklabels([str(k) for k in kvs])
    ax.minorticks_off()
    ax.set_ylim(-0.03, 1.03)
    seq = sorted({r.seq_len for r in results if r.seq_len is not None})
    ax.set_title("MQAR" + (f" (sequence length {', '.join(map(str, seq))})" if seq else ""))
    ax.set_xlabel("key-value pairs")
    ax.set_ylabel("accuracy")
    ax.grid(True, alpha=0.3)
    ax.legend()
    return fig


def evals_figure(runs: List[EvalsRun]):
    """One panel per evaluation metric found in any run: its value vs step, one line per run (a run keeps its
    colour across panels)."""
    keys = []
    for run in runs:
        keys += [k for k in run.metrics if k not in keys]
    keys = [k for k in EVAL_METRICS if k in keys] + sorted(k for k in keys if k not in EVAL_METRICS)
    ncols = 1 if len(keys) == 1 else 2
    nrows = (len(keys) + ncols - 1) // ncols
    fig = Figure(figsize=(6 * ncols + 1, 3.8 * nrows + 0.5), constrained_layout=True)
    grid = fig.subplots(nrows, ncols, squeeze=False)
    axes = list(grid.flat)
    for ax in axes[len(keys):]:
        fig.delaxes(ax)
    cycle = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, key in zip(axes, keys):
        for i, run in enumerate(runs):
            if key in run.metrics:
                steps, vals = run.metrics[key]
                ax.plot(steps, vals, marker="o", ms=3, lw=1.2, color=cycle[i % len(cycle)], label=run.label)
        ax.set_title(EVAL_METRICS.get(key, key))
        ax.set_xlabel("step")
        ax.set_ylabel(key)
        if all(((v >= 0) & (v <= 1)).all() for r in runs if key in r.metrics for v in r.metrics[key][1:]):
            ax.set_ylim(-0.03, 1.03)  # a fraction, as every metric the trainers write
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle("Evaluations during training")
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


def _eval_labels(args, n):
    """The labels of the evaluation subcommands: --label NAME... (repeatable) or --labels a,b, one per input."""
    if args.label is not None and args.labels is not None:
        raise PlotError("give --label or --labels, not both")
    if args.label is None:
        return _labels(args.labels, n)
    if len(args.label) != n:
        raise PlotError(f"--label has {len(args.label)} names for {n} inputs")
    return args.label


def default_out(cmd, first_file):
    """--out's default for the evaluation subcommands: beside the first input, its name with .png (niah.json ->
    niah.png, passkey.json -> passkey.png, mqar_result.json -> mqar_result.png), evals.png for a log."""
    if cmd == "evals":
        return os.path.join(os.path.dirname(first_file), "evals.png")
    return os.path.splitext(first_file)[0] + ".png"


def _save(fig, out):
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise PlotError(f"output directory does not exist: {parent}")
    fig.savefig(out, dpi=120)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="plot.py", description="Plot fox.c per-token loss, training curves, ACP's pruning or the evaluations "
        "(needle in a haystack, passkey, MQAR, the metrics of log.jsonl vs step).")
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

    def eval_parser(name, helptext, metavar, nargs):
        e = sub.add_parser(name, help=helptext)
        e.add_argument("inputs", nargs=nargs, metavar=metavar)
        e.add_argument("--out", metavar="FILE.png",
                       help="default: beside the first input, its name with .png (evals: evals.png)")
        e.add_argument("--label", nargs="+", action="extend", metavar="NAME",
                       help="labels, one per input, after the inputs (default: the run directory's name)")
        e.add_argument("--labels", help="the same, comma-separated")
        return e

    eval_parser("niah", "needle-in-a-haystack heatmap of a niah.json", "RUN_OR_FILE", 1)
    eval_parser("passkey", "passkey accuracy vs context length, one line per passkey.json", "RUN_OR_FILE", "+")
    eval_parser("mqar", "MQAR accuracy vs key-value pairs, one line per label", "FILE_OR_RUN", "+")
    eval_parser("evals", "log.jsonl's evaluation metrics vs step, a panel each", "RUN_OR_LOG", "+")

    args = parser.parse_args(argv)
    try:
        if args.cmd in ("niah", "passkey", "mqar", "evals"):
            labels = _eval_labels(args, len(args.inputs))
            if args.cmd == "niah":
                runs = [load_niah(args.inputs[0], labels[0])]
                fig = niah_figure(runs[0])
            elif args.cmd == "passkey":
                runs = [load_passkey(p, lab) for p, lab in zip(args.inputs, labels)]
                fig = passkey_figure(runs)
            elif args.cmd == "mqar":
                runs = [load_mqar(p, lab) for p, lab in zip(args.inputs, labels)]
                fig = mqar_figure(runs)
            else:
                runs = [load_evals(p, lab) for p, lab in zip(args.inputs, labels)]
                fig = evals_figure(runs)
            args.out = args.out or default_out(args.cmd, runs[0].file)
            _save(fig, args.out)
            print(f"wrote {args.out}")
            return 0
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
