"""reference/fixtures.py: the float64 reference fixtures fox.c is checked against (`train_fox.py fixtures`).

The small configs of FIXTURES, each written as DIR/<name>.fix (the format of test/fixture.h): the init
weights, perturbed weights, one forward and backward pass and 10 AdamW steps of train_fox's FoxModel, all in
float64 (the contents: train_fox.py's docstring). test_fox and test_foxcu read them; test/test_reference.py and
test/test_hf.py build their models from the same configs and weights.
"""
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch

from train_fox import (ARCH_GSA, CONFIG_FIELDS, FG_DATA_DEPENDENT, FG_DATA_INDEPENDENT, FG_FIXED, PRESETS,
                       FoxModel, UsageError, _atomic_write, _usage_config, init_params, layout, make_config,
                       train, write_fixture)

FIXTURE_SHAPE = dict(vocab_size=128, n_layer=2, d_model=64, n_head=4, mlp_hidden=96)
FIXTURE_B, FIXTURE_T, FIXTURE_SEED = 2, 64, 1234
FIXTURES = [  # (name, preset, overrides)
    ("fox-pro", "fox-pro", {}),
    ("fox-llama", "fox-llama", {}),
    ("transformer-pro", "transformer-pro", {}),
    ("transformer-llama", "transformer-llama", {}),
    ("fox-pro-qkshared", "fox-pro", dict(qk_norm_shared=1)),
    ("fox-dataind", "fox-pro", dict(forget_gate=FG_DATA_INDEPENDENT)),
    ("fox-fixed", "fox-pro", dict(forget_gate=FG_FIXED, t_min=2.0, t_max=64.0)),
    # The document mask (docs/model.md §1.8), separator FIXTURE_DOC_SEP (see fixture_doc_sep):
    ("fox-pro-docmask", "fox-pro", {}),
    ("fox-llama-docmask", "fox-llama", {}),
    ("transformer-pro-docmask", "transformer-pro", {}),
    ("transformer-llama-docmask", "transformer-llama", {}),
    # Gated Slot Attention (docs/model.md §1.9): 4 heads of dh 16, 8 slots, tau 8.
    ("gsa", "gsa", dict(gsa_slots=8)),
    # TransformerFAM (docs/model.md §1.10): 8 blocks of 8 with 2 in the window, 4 blocks of 16 with 1.
    ("transformer-fam", "transformer-fam", dict(fam_block=8, fam_memory=4, fam_window_blocks=2)),
    ("fox-fam", "fox-fam", dict(fam_block=16, fam_memory=3, fam_window_blocks=1)),
    # Block sliding window attention alone, the FAM paper's baseline (--fam-memory 0): train_fox_cpu only.
    ("transformer-bswa", "transformer-fam", dict(fam_block=8, fam_memory=0, fam_window_blocks=2)),
    ("fox-bswa", "fox-fam", dict(fam_block=16, fam_memory=0, fam_window_blocks=1)),
    # The same at the GPU trainer's blocks (multiples of 128): 3 blocks, memory 4, window 1; 4 blocks, memory 36
    # (more than one warp of keys), window 2; BSWA alone, 3 blocks, window 1 (block 2 does not see block 0).
    ("transformer-fam-gpu", "transformer-fam", dict(fam_block=128, fam_memory=4, fam_window_blocks=1)),
    ("fox-fam-gpu", "fox-fam", dict(fam_block=128, fam_memory=36, fam_window_blocks=2)),
    ("transformer-bswa-gpu", "transformer-fam", dict(fam_block=128, fam_memory=0, fam_window_blocks=1)),
]
# The fixtures whose context is not FIXTURE_T.
FIXTURE_SEQ_LEN = {"transformer-fam-gpu": 384, "fox-fam-gpu": 512, "transformer-bswa-gpu": 384}
# The separator id of the -docmask fixtures, and where their `inputs` hold it: row 0 at 0 (a
# separator at the window's start), 17 and 18 (a one-token document), 40; row 1 at 5, 33 and 63 (the
# last position). No other input token is FIXTURE_DOC_SEP. Their train.inputs hold it at each
# position with probability FIXTURE_DOC_P, nowhere else.
FIXTURE_DOC_SEP = 3
FIXTURE_DOC_STARTS = [(0, 17, 18, 40), (5, 33, 63)]
FIXTURE_DOC_P = 0.1
# In the order of the fixture's train.hparams vector. Adam's eps is 1e-6 here, not the training
# default 1e-8: with 1e-8 (and lr 1e-2) the 10-step trajectory of this tiny model is chaotic,
# PyTorch's own float32 run then differs from its float64 run by 7e-5 in loss and 9% in weights,
# so no float32 implementation could be held to a tight tolerance. With these values torch
# float32 stays within 1e-7 (loss) and 1e-4 (weights) of float64. The lr is 2e-3, not 3e-3: at 3e-3
# the GPU fixtures' trajectories were ill-conditioned too (transformer-pro-docmask at d 256: a
# relative 2e-3 perturbation of the starting weights, one bf16 rounding, moved the float64
# reference's own 10-step grad norms by 2.3e-2 relative, more than the GPU test's tolerance; at 2e-3
# at most 2.3e-3 over the docmask and transformer-pro fixtures at d 128 and 256, at 1e-3 below 1.2e-3).
# With the clip of 0.9 both paths run: across the fixtures some steps clip and others do not.
TRAIN_HPARAMS = dict(lr=2e-3, min_lr=3e-4, warmup_steps=3, total_steps=10, weight_decay=0.1,
                     grad_clip=0.9, beta1=0.9, beta2=0.95, eps=1e-6, accum=2)


def fixture_config(name, shape=FIXTURE_SHAPE):
    preset, overrides = next((p, o) for n, p, o in FIXTURES if n == name)
    if PRESETS[preset]["arch"] == ARCH_GSA:  # GSA's heads are its n_head (fox/args.h), at any shape
        overrides = dict(overrides, gsa_heads=shape["n_head"])
    return make_config(preset, **shape, **overrides)


def fixture_doc_sep(name):
    """The document separator a fixture is computed with (FoxModel's doc_sep), or None."""
    return FIXTURE_DOC_SEP if name.endswith("-docmask") else None


def with_separators(tokens, sep, starts, rng):
    """tokens with every `sep` replaced by sep + 1, then sep written where `starts` is True
    (a bool array of tokens' shape) and, with rng, at each position with probability FIXTURE_DOC_P."""
    tokens = np.where(tokens == sep, sep + 1, tokens)
    if rng is not None:
        starts = starts | (rng.random(tokens.shape) < FIXTURE_DOC_P)
    return np.where(starts, sep, tokens)


def perturbed_params(cfg, init):
    """The init weights with every term made to matter: each ONE-init norm weight += 0.1 N(0,1),
    each forget-gate bias += 0.5 N(0,1) (+1.0 more for the data-dependent gate, so sigma(b) is
    away from 1/2). Draws from torch.Generator seeded 99, tensor by tensor in FOX_PARAMS order.
    Results are rounded to float32 so that C loading them as float32 is lossless."""
    gen = torch.Generator().manual_seed(99)
    out = {}
    for p in layout(cfg):
        arr = init[p["name"]].astype(np.float64)
        if p["init"] == "ONE":
            arr = arr + 0.1 * torch.randn(arr.shape, generator=gen, dtype=torch.float64).numpy()
        elif p["init"] == "FGATE":
            arr = arr + 0.5 * torch.randn(arr.shape, generator=gen, dtype=torch.float64).numpy()
            if cfg["forget_gate"] == FG_DATA_DEPENDENT:
                arr = arr + 1.0
        out[p["name"]] = arr.astype(np.float32).astype(np.float64)
    return out


def make_fixture(name, shape=FIXTURE_SHAPE):
    """All tensors of one fixture, computed in float64; returns ([(name, array)], grad norms)."""
    cfg = fixture_config(name, shape)
    V, B, T = cfg["vocab_size"], FIXTURE_B, FIXTURE_SEQ_LEN.get(name, FIXTURE_T)
    init = init_params(cfg, FIXTURE_SEED)
    params = perturbed_params(cfg, init)
    rng = np.random.default_rng(7)
    inputs = rng.integers(0, V, size=(B, T))
    targets = rng.integers(0, V, size=(B, T))
    hp = TRAIN_HPARAMS
    rng = np.random.default_rng(8)
    shape = (hp["total_steps"], hp["accum"], B, T)
    train_inputs = rng.integers(0, V, size=shape)
    train_targets = rng.integers(0, V, size=shape)
    sep = fixture_doc_sep(name)
    if sep is not None:  # separators at FIXTURE_DOC_STARTS, and at random in the training inputs
        fixed = np.zeros((B, T), bool)
        for b, ts in enumerate(FIXTURE_DOC_STARTS):
            fixed[b, list(ts)] = True
        inputs = with_separators(inputs, sep, fixed, None)
        train_inputs = with_separators(train_inputs, sep, np.zeros(shape, bool), np.random.default_rng(9))

    out = [("config", np.array([cfg[n] for _, n, _ in CONFIG_FIELDS], np.float64))]
    if sep is not None:
        out += [("doc_sep", np.array([float(sep)]))]
    out += [("init." + n, a.reshape(-1)) for n, a in init.items()]
    out += [("param." + n, a.reshape(-1)) for n, a in params.items()]
    out += [("inputs", inputs), ("targets", targets)]

    model = FoxModel(cfg, params, torch.float64, doc_sep=sep)
    loss, pos_loss, logits = model.loss(torch.from_numpy(inputs), torch.from_numpy(targets))
    loss.backward()
    out += [("logits", logits.detach().numpy()), ("loss", np.array([loss.item()])),
            ("pos_loss", pos_loss.detach().numpy())]
    out += [("grad." + n, (t.grad.numpy() if t.grad is not None else np.zeros(t.shape)).reshape(-1))
            for n, t in model.p.items()]

    model = FoxModel(cfg, params, torch.float64, doc_sep=sep)  # train from param.*, fresh state
    losses, norms, lrs = train(model, hp, torch.from_numpy(train_inputs), torch.from_numpy(train_targets))
    out += [("train.hparams", np.array(list(hp.values()), np.float64)),
            ("train.inputs", train_inputs), ("train.targets", train_targets),
            ("train.losses", np.array(losses)), ("train.grad_norms", np.array(norms)),
            ("train.lrs", np.array(lrs))]
    out += [("train.final." + n, t.detach().numpy().reshape(-1)) for n, t in model.p.items()]
    return out, norms


# Torch threads of the process computing a fixture: these float64 models are small, and processes of one thread
# per core each, several at a time, ran many times slower than processes of 2 (docs/testing.md). The same count
# in and out of the workers keeps the bytes independent of --jobs.
FIXTURE_WORKER_THREADS = 2


def default_fixture_jobs():
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cpus // FIXTURE_WORKER_THREADS)


def _limit_threads():
    torch.set_num_threads(FIXTURE_WORKER_THREADS)


def computed_fixtures(names, shape, jobs):
    """make_fixture of each name, in order: in this process when jobs is 1, else in up to jobs worker processes
    (spawned, not forked: the parent's OpenMP threads do not survive a fork); FIXTURE_WORKER_THREADS threads each."""
    jobs = min(jobs, len(names))
    if jobs <= 1:
        _limit_threads()
        for name in names:
            yield make_fixture(name, shape)
        return
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(jobs, mp_context=context, initializer=_limit_threads) as pool:
        yield from pool.map(make_fixture, names, [shape] * len(names))


def cmd_fixtures(args):
    out_dir = Path(args.out)
    shape = dict(FIXTURE_SHAPE, d_model=args.dim, n_head=args.heads)
    wanted = args.only.split(",") if args.only else [n for n, _, _ in FIXTURES]
    unknown = [n for n in wanted if n not in [f for f, _, _ in FIXTURES]]
    if unknown:
        raise UsageError("--only: unknown fixture %s (known: %s)" % (
            ", ".join(unknown), ", ".join(f for f, _, _ in FIXTURES)))
    if args.jobs < 1:
        raise UsageError("--jobs %d: give 1 or more" % args.jobs)
    for name in wanted:  # every config valid at this shape before anything is computed or written
        problem = _usage_config(fixture_config, name, shape)
        if problem:
            raise UsageError("--dim %d --heads %d: fixture %s: %s" % (args.dim, args.heads, name, problem))
    out_dir.mkdir(parents=True, exist_ok=True)
    names = []
    width = max(len(n) for n in wanted)
    for name, (tensors, norms) in zip(wanted, computed_fixtures(wanted, shape, args.jobs)):
        write_fixture(out_dir / (name + ".fix"), tensors)
        names.append(name + ".fix")
        clipped = sum(n > TRAIN_HPARAMS["grad_clip"] for n in norms)
        print("%-*s loss %.6f  grad norms %s  (%d of %d steps clipped)" % (
            width, name, dict(tensors)["loss"][0], " ".join("%.3f" % n for n in norms), clipped, len(norms)))
    _atomic_write(out_dir / "manifest.txt", [("\n".join(names) + "\n").encode()])
    print("wrote %d fixtures to %s" % (len(names), out_dir))
