#!/usr/bin/env python3
"""train_fox.py: the independent PyTorch reference for fox.c (Forgetting Transformer, FoX).

Written from docs/model.md §1-§2 and the FoX paper (Appendix A, eq. 15-23), not from the C code, so
that fox.c can be checked against it. The shared definitions are read from fox/*.h at import
time: config fields, presets and the parameter layout (fox/config.h), the RNG (fox/rng.h), the
model.bin format (fox/checkpoint.h) and the fixture format (test/fixture.h).

The config's arch switch replaces attention by Gated Slot Attention (GSA paper, eq. 6-9; FoxModel.gsa):
gsa_recurrent (the recurrence) and gsa_chunked (the chunked two-pass form, which FoxModel uses) agree
to rounding (selfcheck). A GSA model takes no document mask.

Or by TransformerFAM (FAM paper, Algorithm 2 and Appendix B; docs/model.md §1.10; FoxModel.fam_forward):
block sliding-window attention with a feedback memory of fam_memory rows per layer, written block by
block as the paper's concatenation of the memory and the block with an explicit mask; fam_layer_loop
(test/test_reference.py) is a numpy loop form of one layer it is checked against (selfcheck). No
document mask either.

Subcommands:
  fixtures --out DIR     write DIR/<name>.fix (float64 reference tensors: init, weights, logits,
                         losses, gradients, 10 AdamW steps) for 19 small configs, plus
                         DIR/manifest.txt: the four attention presets, three switch variants,
                         the four presets again with the document mask (<preset>-docmask),
                         gsa (Gated Slot Attention, 8 slots), transformer-fam and fox-fam
                         (TransformerFAM: blocks of 8 and 16, memories of 4 and 3, windows of 2 and 1),
                         transformer-fam-gpu and fox-fam-gpu (blocks of 128, the GPU trainer's
                         multiple, at T = 384 and 512: memories of 4 and 36, windows of 1 and 2),
                         and BSWA alone (--fam-memory 0): transformer-bswa and fox-bswa (blocks of
                         8 and 16), transformer-bswa-gpu (blocks of 128, window 1, T 384).
  init ...               write reference-initialised weights as a fox.c model.bin.
  loss ...               load a fox.c model.bin, print `loss <value>` on a token file (.npy,
                         int array (B, T+1): inputs = [:, :-1], targets = [:, 1:]);
                         --doc-sep ID applies the document mask with separator ID.
  mc --model-bin PATH --items ITEMS.jsonl --max-len T
                         multiple-choice log-likelihoods (float64): for each item {"context": [ids],
                         "choices": [[ids], ...], "label": k}, one line {"index", "label", "loglik",
                         "tokens"} on stdout; loglik = sum of log p(choice token | all before it) on
                         [start] + context + choice, start = 50256 (<|endoftext|>) if vocab_size > 50256
                         else 0, the context cut from the left so the inputs fit T tokens.
  export-hf MODEL_BIN OUT_DIR
                         a Hugging Face directory (config.json, model.safetensors) that the official
                         FoX code loads with AutoModelForCausalLM.from_pretrained.
  import-hf HF_DIR MODEL_BIN
                         the reverse: an official FoX checkpoint as a fox.c model.bin.
  selfcheck              internal consistency checks (test/test_reference.py, run here); prints
                         `N passed, M failed`, exits 1 on a failure.

Errors, as the C programs report them (fox/io.h): a bad command line (an unknown flag, a missing or
malformed argument, an invalid model, an unknown fixture) is one line `error: ...` on stderr and exit
status 2; bad input (a missing or unreadable file, a corrupt model.bin, safetensors, config.json or token
file, an existing output) is one line `error: ...` naming the file and what is wrong, exit status 1.
main catches every exception of the subcommand so: an unforeseen one is the same one line, with the
command line and the exception's type. FOX_TRACEBACK=1 in the environment re-raises it instead, for the
traceback (debugging).

Fixture contents (all float64; parameters flat, in the fox.c layout; absent tensors omitted):
  config                 the FOX_CONFIG_FIELDS values, in order
  doc_sep                (1,) the separator id, only in the -docmask fixtures: everything below is
                         computed with the document mask (docs/model.md §1.8) and separator 3,
                         which their inputs hold at fixed positions (row 0: 0, 17, 18, 40; row 1:
                         5, 33, 63) and their train.inputs at random (p = 0.1), nowhere else
  init.<p>               the weights fox_rng gives for seed 1234 (checks C's init)
  param.<p>              init perturbed (norm weights += 0.1 N(0,1), forget-gate biases
                         += 0.5 N(0,1), +1 for the data-dependent gate; float32-representable);
                         everything below starts from these
  inputs, targets        (B, T) token ids
  logits, loss, pos_loss (B, T, V), (1,), (B, T): mean / per-position cross entropy
  grad.<p>               d loss / d p (zeros for the fixed, untrained forget gate)
  train.hparams          [lr, min_lr, warmup_steps, total_steps, weight_decay, grad_clip, beta1,
                         beta2, eps, accum]
  train.inputs/targets   (steps, accum, B, T): step s uses micro-batches [s, 0..accum)
  train.losses           (steps,) mean of the micro-batch losses before the update
  train.grad_norms       (steps,) global gradient norm before clipping
  train.lrs              (steps,) the learning rate each step used
  train.final.<p>        the weights after all steps

Training contract (docs/model.md §2): gradients = mean over micro-batches of each micro-batch's mean-loss
gradient; if norm > clip, grads *= clip / (norm + 1e-6); lr = peak (s+1)/W for s < W, then
min_lr + (peak - min_lr)(1 + cos(pi (s-W)/max(1, S-W)))/2; AdamW as torch.optim.AdamW, decay
only on the FOX_PARAMS decay=1 tensors.

Document mask (docs/model.md §1.8; FoxModel(..., doc_sep=ID), fox.c's --doc-mask --doc-sep ID): a
separator token starts a document (it belongs to the document it precedes; position 0 starts one too).
Query i attends key j only if j <= i and both lie in one document: an explicit block-diagonal mask
here, independently of fox.c, which closes the forget gate at separators instead. KV-shift takes 0 for
the token before a separator, as at t = 0. RoPE positions stay those of the window.

This file is the reference model and its training, and the command line; the subcommands' other roles
live in reference/: fixtures.py (fixtures), mc.py (mc), hf.py (export-hf, import-hf); the self-check in
test/test_reference.py.

Importable: load_model_bin(path) -> (config, params), save_model_bin(path, config, params),
init_params(config, seed), make_config(preset, ...), FoxModel(config, params, doc_sep=None),
read_fixture(path); reference.mc's mc_sequence(start, context, choice, max_len), mc_logliks(model, start,
context, choices, max_len), read_mc_items(path, vocab_size, max_len).
Parameters are numpy float32 arrays in the fox.c layout: (n_layer, rows, cols) for layer-stacked
tensors, (rows, cols) otherwise, flattening row-major to exactly the order of model.bin.

Runs on PyTorch 1.13 (Debian python3-torch, CPU: use /usr/bin/python3) and PyTorch 2.x.
"""

import argparse
import contextlib
import importlib.util
import math
import os
import re
import struct
import sys
import tempfile
import zlib
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

# ----------------------------------------------------------------------------------------------
# Shared definitions, parsed from fox/*.h

FOX_DIR = Path(__file__).resolve().parent / "fox"


def _header(name):
    return (FOX_DIR / name).read_text()


def _macro_lines(text, macro):
    """The continuation lines of a multi-line `#define macro(...) \\` (the X-macro tables)."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("#define %s(" % macro))
    body = []
    for ln in lines[start + 1:]:
        body.append(ln)
        if not ln.rstrip().endswith("\\"):
            break
    return body


def _macro_entries(text, macro, letter):
    """The argument lists of the `letter(...)` entries of an X-macro table, as string lists."""
    entries = []
    for ln in _macro_lines(text, macro):
        m = re.search(r"\b%s\(([^)]*)\)" % letter, ln)
        if m:
            entries.append([a.strip() for a in m.group(1).split(",")])
    return entries


def _number(s):
    """A C numeric literal (`12`, `1e-6f`, `2.0`) as a Python int or float."""
    return int(s) if re.fullmatch(r"-?\d+", s) else float(s.rstrip("fF"))


_CONFIG_H = _header("config.h")
_ALL_HEADERS = "".join(_header(h) for h in ("config.h", "rng.h", "checkpoint.h", "../test/fixture.h"))

# Every `#define FOX_NAME <number>` of the shared headers.
FOX = {name: _number(val) for name, val in re.findall(
    r"^#define (FOX_\w+) (-?[0-9][0-9.eE+-]*[fF]?)\s*$", _ALL_HEADERS, re.M)}

# [(type "INT"/"FLOAT", name, default)], in checkpoint-header order.
CONFIG_FIELDS = [(t, n, _number(d)) for t, n, d in _macro_entries(_CONFIG_H, "FOX_CONFIG_FIELDS", "X")]
FLOAT_FIELDS = {n for t, n, _ in CONFIG_FIELDS if t == "FLOAT"}

# {preset: {column: value}}; the column names are those documented above FOX_PRESETS.
_PRESET_COLUMNS = [c.strip() for c in re.search(
    r"Presets[^\n]*P\(name, ([^)]*)\)", _CONFIG_H).group(1).split(",")]
PRESETS = {e[0]: dict(zip(_PRESET_COLUMNS, map(int, e[1:])))
           for e in _macro_entries(_CONFIG_H, "FOX_PRESETS", "P")}

# [(name, layered, rows symbol, cols symbol, decay, init)]; the index is the tensor's RNG stream.
PARAMS = [(n, int(ly), r, c, int(dec), ini)
          for n, ly, r, c, dec, ini in _macro_entries(_CONFIG_H, "FOX_PARAMS", "P")]

FG_NONE = FOX["FOX_FG_NONE"]
FG_DATA_DEPENDENT = FOX["FOX_FG_DATA_DEPENDENT"]
FG_DATA_INDEPENDENT = FOX["FOX_FG_DATA_INDEPENDENT"]
FG_FIXED = FOX["FOX_FG_FIXED"]
ARCH_ATTENTION = FOX["FOX_ARCH_ATTENTION"]
ARCH_GSA = FOX["FOX_ARCH_GSA"]
ARCH_FAM = FOX["FOX_ARCH_FAM"]

# ----------------------------------------------------------------------------------------------
# Configuration (mirrors the small functions of fox/config.h)


def _f32(x):
    """x rounded to float32, as a Python float (config floats are stored as float32)."""
    return float(np.float32(x))


def mlp_hidden_for(d_model, mlp_ratio_x2):
    """docs/model.md §1: I = 256 * ceil(int(d * r * 2/3) / 256), r = ratio_x2 / 2."""
    raw = d_model * mlp_ratio_x2 // 3
    return 256 * ((raw + 255) // 256)


def make_config(preset="fox-pro", **overrides):
    """Defaults, then the preset's switches (mlp_hidden following d_model), then overrides."""
    cfg = {n: (_f32(d) if t == "FLOAT" else d) for t, n, d in CONFIG_FIELDS}
    if preset not in PRESETS:
        raise ValueError("unknown preset %r (known: %s)" % (preset, ", ".join(PRESETS)))
    ratio_x2 = PRESETS[preset]["mlp_ratio_x2"]
    cfg.update({k: v for k, v in PRESETS[preset].items() if k != "mlp_ratio_x2"})
    for k, v in overrides.items():
        if k not in cfg:
            raise ValueError("unknown config field %r" % k)
        if k not in FLOAT_FIELDS and v != int(v):
            raise ValueError("config field %s must be an integer, got %r" % (k, v))
        cfg[k] = _f32(v) if k in FLOAT_FIELDS else int(v)
    if "mlp_hidden" not in overrides:
        cfg["mlp_hidden"] = mlp_hidden_for(cfg["d_model"], ratio_x2)
    problem = config_invalid(cfg)
    if problem:
        raise ValueError("invalid config: " + problem)
    return cfg


def config_invalid(cfg):
    """One line saying why a config is invalid, or None."""
    if min(cfg["vocab_size"], cfg["n_layer"], cfg["d_model"], cfg["n_head"], cfg["mlp_hidden"]) <= 0:
        return "vocab_size, n_layer, d_model, n_head and mlp_hidden must be positive"
    if cfg["arch"] not in (ARCH_ATTENTION, ARCH_GSA, ARCH_FAM):
        return "arch must be 0 (attention), 1 (GSA) or 2 (FAM)"
    if cfg["arch"] == ARCH_FAM:
        if cfg["fam_block"] <= 0:
            return "FAM: fam_block must be positive"
        if cfg["fam_memory"] < 0:
            return "FAM: fam_memory must be 0 (no memory: BSWA alone) or more"
        if cfg["fam_window_blocks"] < 0:
            return "FAM: fam_window_blocks must be 0 or more"
    if cfg["arch"] == ARCH_GSA:
        if cfg["gsa_heads"] <= 0 or cfg["d_model"] % cfg["gsa_heads"]:
            return "GSA: d_model must be a multiple of gsa_heads"
        if cfg["n_head"] != cfg["gsa_heads"]:
            return "GSA: n_head must equal gsa_heads"
        if cfg["gsa_slots"] <= 0:
            return "GSA: gsa_slots must be positive"
        if not cfg["gsa_tau"] > 0:
            return "GSA: gsa_tau must be positive"
        if cfg["forget_gate"] != FG_NONE or cfg["rope"] or cfg["qk_norm"] or cfg["kv_shift"] or cfg["output_gate"]:
            return "GSA has its own slot gates and takes no forget gate, RoPE, QK-norm, KV-shift or output gate"
    if cfg["d_model"] % cfg["n_head"]:
        return "d_model must be a multiple of n_head"
    if cfg["rope"] and head_dim(cfg) % 2:
        return "RoPE needs an even head_dim"
    if not FG_NONE <= cfg["forget_gate"] <= FG_FIXED:
        return "forget_gate must be 0..3"
    if not (cfg["t_min"] > 1.0 and cfg["t_max"] >= cfg["t_min"]):
        return "need 1 < t_min <= t_max"
    if cfg["qk_norm_shared"] and not cfg["qk_norm"]:
        return "qk_norm_shared needs qk_norm"
    return None


def head_dim(cfg):
    return cfg["d_model"] // cfg["n_head"]


def fox_arch_name(arch):
    """fox_arch_name of fox/config.h."""
    return {ARCH_GSA: "GSA", ARCH_FAM: "FAM"}.get(arch, "attention")


# [(name, rows symbol "D"/"H", C condition on the config c)], the row blocks of attn_in_w in order.
ATTN_IN_ROWS = _macro_entries(_CONFIG_H, "FOX_ATTN_IN_ROWS", "R")


def _c_condition(expr, cfg):
    """A FOX_ATTN_IN_ROWS condition (`1`, `c->kv_shift`, `c->forget_gate == FOX_FG_...`) on config cfg."""
    py = re.sub(r"c->(\w+)", lambda m: repr(cfg[m.group(1)]), expr)
    py = re.sub(r"\bFOX_\w+", lambda m: repr(FOX[m.group(0)]), py)
    if not re.fullmatch(r"[\d.\s=!<>]+", py):
        raise ValueError("FOX_ATTN_IN_ROWS condition %r is not a comparison of numbers" % expr)
    return bool(eval(py))


def attn_in_slices(cfg):
    """Row ranges of the stacked attention input projection attn_in_w (FOX_ATTN_IN_ROWS in fox/config.h):
    q [D] | k [D] | v [D] | gate [D] | k_shift [H] | v_shift [H] | fgate [H] | slot_gate [gsa_heads x gsa_slots],
    each when present."""
    size = {"D": cfg["d_model"], "H": cfg["n_head"], "GM": cfg["gsa_heads"] * cfg["gsa_slots"]}
    slices, start = {}, 0
    for name, rows, condition in ATTN_IN_ROWS:
        if _c_condition(condition, cfg):
            slices[name] = slice(start, start + size[rows])
            start += size[rows]
    return slices


def _dim(cfg, sym):
    """The size a FOX_PARAMS dimension symbol stands for (fox_dim in config.h)."""
    D, H = cfg["d_model"], cfg["n_head"]
    sizes = {
        "1": 1, "V": cfg["vocab_size"], "D": D, "I": cfg["mlp_hidden"], "I2": 2 * cfg["mlp_hidden"],
        "NIN": max(r.stop for r in attn_in_slices(cfg).values()),
        "HF": 0 if cfg["forget_gate"] == FG_NONE else H,
        "QN": (D // H if cfg["qk_norm_shared"] else D) if cfg["qk_norm"] else 0,
        "ON": D if cfg["output_norm"] else 0,
        "FM": cfg["fam_memory"] if cfg["arch"] == ARCH_FAM else 0,
    }
    return sizes[sym]


def layout(cfg):
    """The parameter tensors present in config cfg, in checkpoint order, as dicts with the tensor's
    index in FOX_PARAMS (its RNG stream), name, shape (fox.c layout), numel, decay and init."""
    out = []
    for index, (name, layered, r, cl, decay, init) in enumerate(PARAMS):
        rows, cols = _dim(cfg, r), _dim(cfg, cl)
        if rows * cols == 0:
            continue  # a 0-sized dimension drops the tensor (switched-off component)
        shape = (cfg["n_layer"], rows, cols) if layered else (rows, cols)
        out.append(dict(index=index, name=name, shape=shape, numel=int(np.prod(shape)),
                        decay=decay, init=init))
    return out


def param_learned(cfg, name):
    """The `fixed` forget-gate bias (ALiBi-like) is not trained (fox_param_learned)."""
    return not (name == "fgate_b" and cfg["forget_gate"] == FG_FIXED)


def fgate_bias_init(cfg, h):
    """docs/model.md §1 / FoX Appendix D: for the data-independent and fixed gates, head h has timescale
    T_h = -1/log σ(b), log-spaced from t_min to t_max, so b = -log(expm1(1/T_h)); 0 otherwise.
    Computed in double, returned as float32 (as fox_fgate_bias_init)."""
    if cfg["forget_gate"] in (FG_NONE, FG_DATA_DEPENDENT):
        return 0.0
    frac = h / (cfg["n_head"] - 1) if cfg["n_head"] > 1 else 0.0
    lo, hi = math.log(cfg["t_min"]), math.log(cfg["t_max"])
    T = math.exp(lo + frac * (hi - lo))
    return _f32(-math.log(math.expm1(1.0 / T)))


# ----------------------------------------------------------------------------------------------
# RNG (fox/rng.h): counter-based, splitmix64 finaliser, Box-Muller in double

MASK64 = (1 << 64) - 1
_TWO_M53 = 1.0 / 9007199254740992.0  # 2^-53
_TWO_PI = 6.283185307179586


def mix64_py(x):
    """fox_mix64 on a Python int (the reference the numpy version is checked against)."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def rng_key(seed, stream):
    """fox_rng_key: the key of stream `stream` under `seed`."""
    return mix64_py((seed & MASK64) ^ mix64_py(stream))


def rng_normal_py(key, i):
    """fox_rng_normal in pure Python (ints for the bits, libm via `math` for the floats)."""
    u1 = ((mix64_py((key + 2 * i) & MASK64) >> 11) + 1.0) * _TWO_M53
    u2 = (mix64_py((key + 2 * i + 1) & MASK64) >> 11) * _TWO_M53
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(_TWO_PI * u2)


def mix64_np(x):
    """fox_mix64 on a uint64 array (numpy integer arithmetic wraps modulo 2^64, as C does)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def rng_normal_np(key, idx):
    """fox_rng_normal for a uint64 index array. numpy's vectorised log/cos may differ from libm
    by an ulp, so the result can differ from C's in the last bits (see init_normal)."""
    two_i = np.uint64(2) * idx + np.uint64(key)
    u1 = ((mix64_np(two_i) >> np.uint64(11)).astype(np.float64) + 1.0) * _TWO_M53
    u2 = (mix64_np(two_i + np.uint64(1)) >> np.uint64(11)).astype(np.float64) * _TWO_M53
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(_TWO_PI * u2)


def init_normal(key, idx, std):
    """float32(std * fox_rng_normal(key, i)) for a uint64 index array, bitwise as in C.

    numpy's log/cos are within a few ulps of libm's; that only matters where std*normal lies so
    close to a float32 rounding boundary that a relative change of 1e-12 would round it the other
    way. Those few elements (~1e-5 of them) are recomputed with libm (pure Python)."""
    z = std * rng_normal_np(key, idx)
    out = z.astype(np.float32)
    for j in np.nonzero(np.float32(z * (1 - 1e-12)) != np.float32(z * (1 + 1e-12)))[0]:
        out[j] = std * rng_normal_py(key, int(idx[j]))
    return out


def init_params(cfg, seed, chunk=1 << 22):
    """Reference initialisation (docs/model.md §1 Init): tensor t of FOX_PARAMS uses key
    fox_rng_key(seed, t); N: element i (flat, all layers) = float32(0.02 * normal(key, i));
    ONE: 1; FGATE: fgate_bias_init per head, the same in every layer."""
    params = {}
    for p in layout(cfg):
        if p["init"] == "N":
            key, arr = rng_key(seed, p["index"]), np.empty(p["numel"], np.float32)
            for start in range(0, p["numel"], chunk):  # chunks bound the uint64 temporaries
                idx = np.arange(start, min(p["numel"], start + chunk), dtype=np.uint64)
                arr[start:start + len(idx)] = init_normal(key, idx, FOX["FOX_INIT_STD"])
        elif p["init"] == "ONE":
            arr = np.ones(p["numel"], np.float32)
        elif p["init"] == "FGATE":
            heads = np.array([fgate_bias_init(cfg, h) for h in range(cfg["n_head"])], np.float32)
            arr = np.tile(heads, p["numel"] // cfg["n_head"])
        else:
            raise ValueError("unknown init %r" % p["init"])
        params[p["name"]] = arr.reshape(p["shape"])
    return params


# ----------------------------------------------------------------------------------------------
# Files: model.bin (fox/checkpoint.h) and fixtures (test/fixture.h), written atomically


def _umask():
    """The process's umask (os.umask can only read it by setting it)."""
    umask = os.umask(0)
    os.umask(umask)
    return umask


@contextlib.contextmanager
def _naming(path):
    """An OSError while writing path via a temporary file or directory (mkstemp, mkdtemp, a write that
    finds the disk full, the rename) names path, not the temporary name the user never gave, nor none."""
    try:
        yield
    except OSError as e:
        raise OSError(e.errno, e.strerror, str(path)) from e


def _atomic_write(path, chunks):
    """Writes the byte chunks to path via a temporary file in the same directory, fsync'd and
    renamed into place, so path is either the old file or the complete new one. The file gets the
    mode open() gives a new file, 0666 & ~umask (mkstemp's is 0600)."""
    path = Path(path)
    with _naming(path):
        fd, tmp = tempfile.mkstemp(prefix="." + path.name + ".", dir=str(path.parent))
        try:
            os.fchmod(fd, 0o666 & ~_umask())
            with os.fdopen(fd, "wb") as f:
                for chunk in chunks:
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, str(path))
        except BaseException:
            os.unlink(tmp)
            raise
        dir_fd = os.open(str(path.parent), os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _config_words(cfg):
    """The config fields as int32 words, floats as their float32 bits."""
    return [int(np.array([cfg[n]], np.float32).view(np.int32)[0]) if t == "FLOAT" else int(cfg[n])
            for t, n, _ in CONFIG_FIELDS]


def save_model_bin(path, config, params):
    """Writes a fox.c model.bin: int32 header (magic, version, field count, config fields, and at
    FOX_CKPT_I_CRC the CRC-32 of the file read with that word as zero), then every parameter as
    float32 in FOX_PARAMS order (row-major, layers outermost)."""
    header = np.zeros(FOX["FOX_CKPT_HEADER_INTS"], np.int32)
    words = _config_words(config)
    header[:3 + len(words)] = [FOX["FOX_CKPT_MAGIC"], FOX["FOX_CKPT_VERSION"], len(words)] + words
    chunks = []
    for p in layout(config):
        arr = np.asarray(params[p["name"]], np.float32)
        if arr.size != p["numel"]:
            raise ValueError("%s has %d elements, expected %d" % (p["name"], arr.size, p["numel"]))
        chunks.append(np.ascontiguousarray(arr).tobytes())
    crc = zlib.crc32(header.tobytes())
    for chunk in chunks:
        crc = zlib.crc32(chunk, crc)
    header[FOX["FOX_CKPT_I_CRC"]] = np.array([crc], np.uint32).view(np.int32)[0]
    _atomic_write(path, [header.tobytes()] + chunks)


def load_model_bin(path):
    """Reads a fox.c model.bin; returns (config dict, {name: float32 array in fox.c layout}).
    A version-2 file's CRC-32 is verified before any header field but magic and version is read, so a
    corrupted file is reported as such, not by whatever its damaged config or size would say."""
    data = Path(path).read_bytes()
    nh = FOX["FOX_CKPT_HEADER_INTS"]
    if len(data) < 4 * nh:
        raise ValueError("%s has %d bytes, shorter than a model.bin header (%d bytes): truncated, or no model.bin" %
                         (path, len(data), 4 * nh))
    header = np.frombuffer(data, np.int32, nh)
    if header[0] != FOX["FOX_CKPT_MAGIC"]:
        raise ValueError("%s is not a fox.c model.bin (magic %d, expected %d)" % (path, header[0], FOX["FOX_CKPT_MAGIC"]))
    if header[1] not in (1, FOX["FOX_CKPT_VERSION"]):
        raise ValueError("%s has model-file version %d, this train_fox.py reads 1 and %d" %
                         (path, header[1], FOX["FOX_CKPT_VERSION"]))
    if header[1] >= 2:  # version 1 files carry no checksum
        at = 4 * FOX["FOX_CKPT_I_CRC"]
        crc = zlib.crc32(data[at + 4:], zlib.crc32(data[:at] + bytes(4)))
        stored = int(header[FOX["FOX_CKPT_I_CRC"]]) & 0xFFFFFFFF
        if crc != stored:
            raise ValueError("%s fails its checksum (stored %08x, computed %08x): the file is corrupted, truncated "
                             "or was edited" % (path, stored, crc))
    if not 1 <= header[2] <= len(CONFIG_FIELDS):
        raise ValueError("%s has %d config fields, this train_fox.py knows 1 to %d" % (path, header[2], len(CONFIG_FIELDS)))
    # a file written before the later fields existed holds fewer: those take their defaults
    config = {n: (_f32(d) if t == "FLOAT" else d) for t, n, d in CONFIG_FIELDS}
    for (t, n, _), w in zip(CONFIG_FIELDS, header[3:3 + header[2]]):
        config[n] = float(np.array([w], np.int32).view(np.float32)[0]) if t == "FLOAT" else int(w)
    problem = config_invalid(config)
    if problem:
        raise ValueError("%s holds an invalid config: %s" % (path, problem))
    lay = layout(config)
    expected = 4 * (nh + sum(p["numel"] for p in lay))
    if len(data) != expected:
        raise ValueError("%s has %d bytes, its config needs %d (truncated?)" % (path, len(data), expected))
    params, offset = {}, 4 * nh
    for p in lay:
        params[p["name"]] = np.frombuffer(data, np.float32, p["numel"], offset).reshape(p["shape"]).copy()
        offset += 4 * p["numel"]
    return config, params


def write_fixture(path, tensors):
    """Writes named float64 tensors [(name, array)] in the test/fixture.h format."""
    chunks = [struct.pack("<ii", FOX["FOX_FIXTURE_MAGIC"], len(tensors))]
    for name, arr in tensors:
        arr = np.ascontiguousarray(arr, dtype=np.float64)
        b = name.encode()
        chunks.append(struct.pack("<i", len(b)) + b + struct.pack("<i", arr.ndim))
        chunks.append(np.array(arr.shape, np.int64).tobytes() + arr.tobytes())
    _atomic_write(path, chunks)


def read_fixture(path):
    """Reads a fixture file into {name: float64 array}."""
    data = Path(path).read_bytes()
    magic, count = struct.unpack_from("<ii", data, 0)
    if magic != FOX["FOX_FIXTURE_MAGIC"]:
        raise ValueError("%s: not a fixture (magic %d)" % (path, magic))
    out, off = {}, 8
    for _ in range(count):
        (nlen,) = struct.unpack_from("<i", data, off)
        name = data[off + 4:off + 4 + nlen].decode()
        (ndim,) = struct.unpack_from("<i", data, off + 4 + nlen)
        off += 8 + nlen
        shape = tuple(np.frombuffer(data, np.int64, ndim, off))
        off += 8 * ndim
        n = int(np.prod(shape))
        out[name] = np.frombuffer(data, np.float64, n, off).reshape(shape).copy()
        off += 8 * n
    return out


# ----------------------------------------------------------------------------------------------
# The model (docs/model.md §1)


def rms_norm(x, w, eps):
    """RMSNorm over the last dim with weight w."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def fox_attention(q, k, v, log_f, other_doc=None):
    """FoX attention (paper eq. 22), as a full masked T x T matrix:
    o_i = softmax_{j<=i}(q_i.k_j / sqrt(d_h) + c_i - c_j) v_j with c_t = sum_{l<=t} log f_l.
    q, k, v: (B, H, T, Dh); log_f: (B, H, T), or None for no forget gate (c = 0).
    other_doc: None, or the document mask (docs/model.md §1.8), (B, 1, T, T) bool, True where key j
    lies in another document than query i; those keys are dropped as the future ones are."""
    T, Dh = q.shape[-2], q.shape[-1]
    s = q @ k.transpose(-1, -2) / math.sqrt(Dh)
    if log_f is not None:
        c = torch.cumsum(log_f, dim=-1)
        s = s + c[..., :, None] - c[..., None, :]
    masked = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)  # the future
    if other_doc is not None:
        masked = masked | other_doc
    return torch.softmax(s.masked_fill(masked, float("-inf")), dim=-1) @ v


# Gated Slot Attention (GSA paper, eq. 6-9; docs/model.md §1.9). Two forms, checked against each other by
# selfcheck: the recurrence (the definition) and the chunked two-pass form (paper eq. 7, Appendix A/B).
GSA_CHUNK = 16  # FoxModel's default chunk length for gsa_chunked


def gsa_recurrent(q, k, v, log_alpha, return_state=False):
    """GSA token by token (paper eq. 6 and Figure 2). q, k, v: (B, T, G, dh); log_alpha: (B, T, G, m),
    log alpha_t <= 0 per slot. Per (b, g), with S and U (m, dh) zero before t = 0:
        S_t = alpha_t[:, None] * S_{t-1} + (1 - alpha_t)[:, None] * k_t[None, :]
        U_t = alpha_t[:, None] * U_{t-1} + (1 - alpha_t)[:, None] * v_t[None, :]
        p_t = softmax over the m slots of (S_t @ q_t) / sqrt(dh);  o_t = U_t.T @ p_t
    (the 1/sqrt(dh) is the authors' implementation's default scale; the paper's equations omit it).
    Returns o (B, T, G, dh), and with return_state also the final S and U, (B, G, m, dh)."""
    B, T, G, dh = q.shape
    m = log_alpha.shape[-1]
    S = q.new_zeros(B, G, m, dh)
    U = q.new_zeros(B, G, m, dh)
    out = []
    for t in range(T):
        alpha = log_alpha[:, t].exp()[..., None]  # (B, G, m, 1)
        S = alpha * S + (1 - alpha) * k[:, t, :, None, :]
        U = alpha * U + (1 - alpha) * v[:, t, :, None, :]
        p = torch.softmax(torch.einsum("bgid,bgd->bgi", S, q[:, t]) / math.sqrt(dh), dim=-1)
        out.append(torch.einsum("bgid,bgi->bgd", U, p))
    o = torch.stack(out, dim=1)
    return (o, S, U) if return_state else o


def gsa_chunked(q, k, v, log_alpha, chunk=GSA_CHUNK, return_state=False):
    """GSA as two passes of gated linear attention over chunks (paper eq. 7, Appendix A/B); equal to
    gsa_recurrent up to rounding. Same arguments and result; chunk: tokens per chunk (the last one may
    be shorter). Within a chunk of L tokens (t, j = 0..L-1 local), with S0, U0 the states carried in:
        b_t = sum_{l <= t} log_alpha_l                                   (per slot, from the chunk start)
        W[t, j] = exp(b_t - b_j) * (1 - alpha_j) for j <= t, else 0      ((L, L, m): the decay matrix)
    so S_t = exp(b_t) * S0 + sum_j W[t, j] k_j and U_t = exp(b_t) * U0 + sum_j W[t, j] v_j (per slot row):
        pass 1: s_t = exp(b_t) * (S0 @ q_t) + sum_j W[t, j] (q_t . k_j);   p_t = softmax(s_t / sqrt(dh))
        pass 2: o_t = U0.T @ (exp(b_t) * p_t) + sum_j (W[t, j] . p_t) v_j
        carry:  S0 <- exp(b_{L-1}) * S0 + sum_j W[L-1, j] k_j,   U0 likewise with v.
    exp(b_t - b_j) is taken as one exponent of a difference (<= 0 where kept), never as a ratio."""
    B, T, G, dh = q.shape
    m = log_alpha.shape[-1]
    q, k, v, log_alpha = (x.transpose(1, 2) for x in (q, k, v, log_alpha))  # (B, G, T, .)
    S = q.new_zeros(B, G, m, dh)
    U = q.new_zeros(B, G, m, dh)
    out = []
    for t0 in range(0, T, chunk):
        qc, kc, vc, lc = (x[:, :, t0:t0 + chunk] for x in (q, k, v, log_alpha))
        L = qc.shape[2]
        b = torch.cumsum(lc, dim=2)  # (B, G, L, m)
        eb = b.exp()
        future = torch.ones(L, L, dtype=torch.bool, device=q.device).triu(1)[:, :, None]  # j > t
        W = ((b[:, :, :, None, :] - b[:, :, None, :, :]).masked_fill(future, float("-inf")).exp()
             * (1 - lc.exp())[:, :, None, :, :])  # (B, G, L t, L j, m)
        s = eb * torch.einsum("bgid,bgtd->bgti", S, qc) + torch.einsum("bgtji,bgtj->bgti", W, qc @ kc.transpose(-1, -2))
        p = torch.softmax(s / math.sqrt(dh), dim=-1)
        o = (torch.einsum("bgid,bgti->bgtd", U, eb * p)
             + torch.einsum("bgtj,bgjd->bgtd", torch.einsum("bgtji,bgti->bgtj", W, p), vc))
        out.append(o)
        decay_last, W_last = eb[:, :, -1, :, None], W[:, :, -1]  # (B, G, m, 1), (B, G, L j, m)
        S = decay_last * S + torch.einsum("bgji,bgjd->bgid", W_last, kc)
        U = decay_last * U + torch.einsum("bgji,bgjd->bgid", W_last, vc)
    o = torch.cat(out, dim=2).transpose(1, 2)
    return (o, S, U) if return_state else o


class FoxModel(torch.nn.Module):
    """The fox.c model. Parameters are kept in the fox.c layout (names and shapes of
    FOX_PARAMS, e.g. attn_in_w is (n_layer, rows, d_model)) so conversion is exact; the forward
    pass slices them. doc_sep: a token id for the document mask (docs/model.md §1.8, fox.c's
    --doc-mask --doc-sep), or None for none (a GSA or FAM model takes none). gsa_chunk: for a GSA model,
    the chunk length of gsa_chunked, or 0 for gsa_recurrent (the same function up to rounding)."""

    def __init__(self, config, params, dtype=torch.float64, device="cpu", doc_sep=None, gsa_chunk=GSA_CHUNK):
        super().__init__()
        if config["arch"] != ARCH_ATTENTION and doc_sep is not None:
            raise ValueError("the document mask is not supported with %s (arch %d)" % (
                "Gated Slot Attention" if config["arch"] == ARCH_GSA else "TransformerFAM", config["arch"]))
        self.config = dict(config)
        self.doc_sep = doc_sep
        self.gsa_chunk = gsa_chunk
        self.p = torch.nn.ParameterDict({
            name: torch.nn.Parameter(torch.as_tensor(np.asarray(arr), dtype=dtype, device=device).clone(),
                                     requires_grad=param_learned(config, name))
            for name, arr in params.items()})

    def forward(self, idx):
        """idx: (B, T) token ids -> logits (B, T, V)."""
        cfg, p = self.config, self.p
        if cfg["arch"] == ARCH_FAM:
            return self.fam_forward(idx)
        docs = self.documents(idx)
        x = p["wte"][idx]  # no positional table
        for l in range(cfg["n_layer"]):
            mid = x + self.attention(l, rms_norm(x, p["ln1_w"][l, 0], FOX["FOX_NORM_EPS"]), docs)
            x = mid + self.mlp(l, rms_norm(mid, p["ln2_w"][l, 0], FOX["FOX_NORM_EPS"]))
        x = rms_norm(x, p["lnf_w"][0], FOX["FOX_NORM_EPS"])
        return x @ p["lm_head_w"].t()  # untied lm_head

    def loss(self, idx, targets):
        """(mean cross entropy over all B*T positions, per-position losses (B, T), logits)."""
        logits = self(idx)
        pos = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                              reduction="none").view(targets.shape)
        return pos.mean(), pos, logits

    def documents(self, idx):
        """The document mask of idx (B, T) (docs/model.md §1.8), or None when the model has none:
        (starts (B, T) bool: the token is a separator, so it starts a document; other_doc (B, 1, T, T)
        bool: query i and key j lie in different documents). A separator belongs to the document it
        precedes, position 0 starts one too: document of t = number of separators at or before t."""
        if self.doc_sep is None:
            return None
        starts = idx == self.doc_sep
        doc = torch.cumsum(starts.long(), dim=-1)
        return starts, doc[:, None, :, None] != doc[:, None, None, :]

    def mlp(self, l, xn):
        """SwiGLU: down(silu(W_gate x) * W_up x); mlp_in_w rows = gate [I] | up [I]."""
        gate, up = (xn @ self.p["mlp_in_w"][l].t()).chunk(2, dim=-1)
        return (F.silu(gate) * up) @ self.p["mlp_out_w"][l].t()

    def attention(self, l, xn, docs=None):
        """The token mixer of layer l: FoX attention, paper eq. 15-23 with the docs/model.md §1 switches,
        or GSA (arch); xn = RMSNorm(x), (B, T, D); docs: None, or documents(idx), the document mask (§1.8)."""
        if self.config["arch"] == ARCH_GSA:
            return self.gsa(l, xn)
        starts, other_doc = docs if docs is not None else (None, None)
        q, k, v, log_f, proj = self.attention_inputs(l, xn, starts)
        o = fox_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                          None if log_f is None else log_f.transpose(1, 2), other_doc).transpose(1, 2)
        return self.attention_output(l, o, proj)

    def attention_inputs(self, l, xn, starts=None, positions=None, memory=False):
        """Layer l's attention inputs from xn (B, T, D), paper eq. 15-20: q, k, v (B, T, H, Dh) after KV-shift,
        QK-norm and RoPE (at `positions`, a float64 vector; default 0..T-1), log f (B, T, H) of the forget
        gate or None, and proj = xn W_in^T (B, T, NIN). starts: the document mask's separators (§1.8).
        memory: the rows of a TransformerFAM memory (docs/model.md §1.10), which take no KV-shift and have
        no forget gate of their own."""
        cfg, p = self.config, self.p
        B, T, D = xn.shape
        H, Dh = cfg["n_head"], head_dim(cfg)
        rows = attn_in_slices(cfg)
        proj = xn @ p["attn_in_w"][l].t()
        q, k, v = (proj[..., rows[n]].reshape(B, T, H, Dh) for n in ("q", "k", "v"))
        if cfg["kv_shift"] and not memory:  # eq. 16-19: k_t = a_t k~_{t-1} + (1 - a_t) k~_t, k~_{-1} = 0
            k = self._shift(k, torch.sigmoid(proj[..., rows["k_shift"]]), starts)
            v = self._shift(v, torch.sigmoid(proj[..., rows["v_shift"]]), starts)
        if cfg["qk_norm"]:  # eq. 15, 17: per-head RMSNorm over head_dim, on q and the shifted k
            shape = (1, Dh) if cfg["qk_norm_shared"] else (H, Dh)
            q = rms_norm(q, p["qnorm_w"][l].reshape(shape), FOX["FOX_QK_NORM_EPS"])
            k = rms_norm(k, p["knorm_w"][l].reshape(shape), FOX["FOX_QK_NORM_EPS"])
        if cfg["rope"]:  # after QK-norm
            q, k = self._rope(q, positions), self._rope(k, positions)
        log_f = None
        if memory:
            pass
        elif cfg["forget_gate"] == FG_DATA_DEPENDENT:  # eq. 20: f_t = sigmoid(w_f.x_t + b_f)
            log_f = F.logsigmoid(proj[..., rows["fgate"]] + p["fgate_b"][l, 0])
        elif cfg["forget_gate"] in (FG_DATA_INDEPENDENT, FG_FIXED):  # f = sigmoid(b_h) for all t
            log_f = F.logsigmoid(p["fgate_b"][l, 0]).expand(B, T, H)
        return q, k, v, log_f, proj

    def attention_output(self, l, o, proj):
        """Paper eq. 21-23 on the attention's output o (B, T, H, Dh): the per-head output norm, the output gate
        (its logits in proj), then W_o."""
        cfg, p = self.config, self.p
        B, T, H, Dh = o.shape
        rows = attn_in_slices(cfg)
        if cfg["output_norm"]:  # per-head RMSNorm of o, weight (H * Dh)
            o = rms_norm(o, p["onorm_w"][l].reshape(H, Dh), FOX["FOX_NORM_EPS"])
        z = o.reshape(B, T, H * Dh)
        if cfg["output_gate"]:  # eq. 21, 23
            z = z * torch.sigmoid(proj[..., rows["gate"]])
        return z @ p["attn_out_w"][l].t()

    def fam_forward(self, idx):
        """TransformerFAM (docs/model.md §1.10): idx (B, T) -> logits (B, T, V). The learned initial memory
        fam_init enters the first layer as token embeddings do (FAM paper B.1, prompt tuning); at each layer
        the rows entering it are that layer's first memory F_0, and the layer turns them (attending to each
        other alone, fam_prompt_layer) into the rows entering the next layer."""
        cfg, p = self.config, self.p
        x = p["wte"][idx]
        prompt = p["fam_init"] if "fam_init" in p else x.new_zeros(0, cfg["d_model"])  # none: BSWA alone
        for l in range(cfg["n_layer"]):
            memory = prompt
            if l < cfg["n_layer"] - 1:
                prompt = self.fam_prompt_layer(l, prompt)
            x = self.fam_layer(l, x, memory)
        x = rms_norm(x, p["lnf_w"][0], FOX["FOX_NORM_EPS"])
        return x @ p["lm_head_w"].t()

    def fam_prompt_layer(self, l, g):
        """The prompt's rows g (M, D) through layer l: full attention among themselves (positions -M..-1, no
        decay), the residual, the MLP."""
        cfg, p = self.config, self.p
        M = g.shape[0]
        positions = torch.arange(-M, 0, dtype=torch.float64)
        q, k, v, _, proj = self.attention_inputs(l, rms_norm(g, p["ln1_w"][l, 0], FOX["FOX_NORM_EPS"])[None],
                                                 positions=positions, memory=True)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (1, H, M, Dh)
        o = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(head_dim(cfg)), dim=-1) @ v
        mid = g + self.attention_output(l, o.transpose(1, 2), proj)[0]
        return mid + self.mlp(l, rms_norm(mid, p["ln2_w"][l, 0], FOX["FOX_NORM_EPS"]))

    def fam_layer(self, l, x, memory):
        """Layer l of TransformerFAM on the residual stream x (B, T, D) with the first memory `memory` (M, D):
        the FAM paper's Algorithm 2, block by block. For block tau (tokens t0..t1-1, K = fam_block) the
        memory F (M rows) and the block are concatenated into one attention with an explicit mask:
          - a token query i sees the memory's M keys and the tokens w0 <= j <= i, w0 = max(0, t0 - W K)
            (the block and W = fam_window_blocks blocks before it);
          - a memory query sees the memory's keys and the block's tokens t0 <= j < t1;
        with the forget gate's bias c_query - c_key, where a token carries its c, the memory's keys c at the
        token before the block (c_{t0-1}, 0 at the first block) and the memory's queries c of the block's
        last token (c_{t1-1}); the memory's q and k take RoPE at positions t0 - M .. t0 - 1. Token rows then
        go through the output, the residual and the MLP as usual; after a complete block the memory rows do
        too, with no residual at the first block (FAM paper B.1): F <- mid + MLP(mid), mid = [F] + W_o(...)."""
        cfg, p = self.config, self.p
        B, T, D = x.shape
        K, M, W = cfg["fam_block"], cfg["fam_memory"], cfg["fam_window_blocks"]
        H, Dh = cfg["n_head"], head_dim(cfg)
        ln1, ln2, eps = p["ln1_w"][l, 0], p["ln2_w"][l, 0], FOX["FOX_NORM_EPS"]
        q, k, v, log_f, proj = self.attention_inputs(l, rms_norm(x, ln1, eps))
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, Dh)
        c = torch.cumsum(log_f, dim=1).transpose(1, 2) if log_f is not None else x.new_zeros(B, H, T)
        F_mem = memory.expand(B, M, D)
        out = []
        for tau in range((T + K - 1) // K):
            t0, t1 = tau * K, min(T, tau * K + K)
            w0 = max(0, t0 - W * K)
            n, nw = t1 - t0, t1 - w0
            positions = torch.arange(t0 - M, t0, dtype=torch.float64)
            fq, fk, fv, _, fproj = self.attention_inputs(l, rms_norm(F_mem, ln1, eps), positions=positions, memory=True)
            fq, fk, fv = (t.transpose(1, 2) for t in (fq, fk, fv))
            Q = torch.cat([fq, q[:, :, t0:t1]], dim=2)
            Kc = torch.cat([fk, k[:, :, w0:t1]], dim=2)
            V = torch.cat([fv, v[:, :, w0:t1]], dim=2)
            c_mem = c[:, :, t0 - 1:t0] if t0 > 0 else c.new_zeros(B, H, 1)
            c_query = torch.cat([c[:, :, t1 - 1:t1].expand(B, H, M), c[:, :, t0:t1]], dim=-1)
            c_key = torch.cat([c_mem.expand(B, H, M), c[:, :, w0:t1]], dim=-1)
            allowed = torch.zeros(M + n, M + nw, dtype=torch.bool)
            allowed[:, :M] = True  # everyone reads the memory
            allowed[:M, M + (t0 - w0):] = True  # the memory reads its block
            key_pos = torch.arange(w0, t1)
            allowed[M:, M:] = key_pos[None, :] <= torch.arange(t0, t1)[:, None]  # tokens: causal over the window
            s = Q @ Kc.transpose(-1, -2) / math.sqrt(Dh) + c_query[..., :, None] - c_key[..., None, :]
            O = torch.softmax(s.masked_fill(~allowed, float("-inf")), dim=-1) @ V  # (B, H, M + n, Dh)
            mid = x[:, t0:t1] + self.attention_output(l, O[:, :, M:].transpose(1, 2), proj[:, t0:t1])
            out.append(mid + self.mlp(l, rms_norm(mid, ln2, eps)))
            if n == K:  # a complete block updates the memory
                mid_mem = self.attention_output(l, O[:, :, :M].transpose(1, 2), fproj)
                if tau > 0:
                    mid_mem = F_mem + mid_mem
                F_mem = mid_mem + self.mlp(l, rms_norm(mid_mem, ln2, eps))
        return torch.cat(out, dim=1)

    def gsa(self, l, xn):
        """Gated Slot Attention (paper eq. 8-9), G = gsa_heads heads of dh = D / G, m = gsa_slots slots:
        q, k, v = silu(W_{q,k,v} x) (the Swish feature map), alpha = sigmoid(W_slot_gate x)^(1/gsa_tau)
        per head and slot, o = GSA(q, k, v, alpha) per head (gsa_chunked, or gsa_recurrent), then
        W_o RMSNorm(silu(concat of the heads' o)) with the norm over all D (weight onorm_w)."""
        cfg, p = self.config, self.p
        B, T, D = xn.shape
        G, m = cfg["gsa_heads"], cfg["gsa_slots"]
        rows = attn_in_slices(cfg)
        proj = xn @ p["attn_in_w"][l].t()
        q, k, v = (F.silu(proj[..., rows[n]]).reshape(B, T, G, D // G) for n in ("q", "k", "v"))
        log_alpha = F.logsigmoid(proj[..., rows["slot_gate"]]).reshape(B, T, G, m) / cfg["gsa_tau"]
        if self.gsa_chunk:
            o = gsa_chunked(q, k, v, log_alpha, self.gsa_chunk)
        else:
            o = gsa_recurrent(q, k, v, log_alpha)
        z = rms_norm(F.silu(o.reshape(B, T, D)), p["onorm_w"][l, 0], FOX["FOX_NORM_EPS"])
        return z @ p["attn_out_w"][l].t()

    @staticmethod
    def _shift(x, alpha, starts=None):
        """alpha_t x_{t-1} + (1 - alpha_t) x_t over dim 1 with x_{-1} = 0; alpha: (B, T, H).
        starts: None, or (B, T) bool, the separators: x_{t-1} is 0 there too (the shift does not
        reach back across a document boundary)."""
        prev = F.pad(x, (0, 0, 0, 0, 1, 0))[:, :-1]
        if starts is not None:
            prev = prev.masked_fill(starts[:, :, None, None], 0.0)
        a = alpha.unsqueeze(-1)
        return a * prev + (1 - a) * x

    def _rope(self, x, positions=None):
        """Rotary embedding, rotate-half convention (dims d and d + Dh/2 pair up), at positions (float64,
        length T; default t = 0..T-1), inverse frequencies theta^(-2d/Dh); angles in float64."""
        T, Dh = x.shape[1], x.shape[-1]
        inv_freq = self.config["rope_theta"] ** (-torch.arange(0, Dh, 2, dtype=torch.float64) / Dh)
        if positions is None:
            positions = torch.arange(T, dtype=torch.float64)
        ang = positions[:, None] * inv_freq[None, :]
        ang = torch.cat([ang, ang], dim=-1)[:, None, :].to(device=x.device)  # (T, 1, Dh)
        cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
        x1, x2 = x[..., :Dh // 2], x[..., Dh // 2:]
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin


# ----------------------------------------------------------------------------------------------
# Training (docs/model.md §2, with the contract fixed in the fixture hparams)


def lr_at(step, peak, min_lr, warmup, total):
    """Linear warmup to peak over `warmup` steps, then cosine decay to min_lr at `total`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return min_lr + 0.5 * (peak - min_lr) * (1 + math.cos(math.pi * progress))


class AdamW:
    """torch.optim.AdamW semantics: p *= 1 - lr*wd (decay tensors only); m, v moments;
    p -= lr * m_hat / (sqrt(v_hat) + eps) with bias corrections 1 - beta^t, t from 1."""

    def __init__(self, model, beta1, beta2, eps, weight_decay):
        self.model, self.beta1, self.beta2, self.eps, self.wd = model, beta1, beta2, eps, weight_decay
        self.decay = {p["name"]: p["decay"] for p in layout(model.config)}
        self.params = {n: t for n, t in model.p.items() if t.requires_grad}
        self.m = {n: torch.zeros_like(t) for n, t in self.params.items()}
        self.v = {n: torch.zeros_like(t) for n, t in self.params.items()}
        self.t = 0

    @torch.no_grad()
    def step(self, lr):
        self.t += 1
        bc1, bc2 = 1 - self.beta1 ** self.t, 1 - self.beta2 ** self.t
        for n, p in self.params.items():
            g = p.grad
            if self.decay[n]:
                p.mul_(1 - lr * self.wd)
            self.m[n].mul_(self.beta1).add_(g, alpha=1 - self.beta1)
            self.v[n].mul_(self.beta2).addcmul_(g, g, value=1 - self.beta2)
            p.sub_(lr * (self.m[n] / bc1) / ((self.v[n] / bc2).sqrt() + self.eps))


def train(model, hp, inputs, targets):
    """Runs len(inputs) optimizer steps; inputs/targets: (steps, accum, B, T) long tensors.
    hp: dict of the fixture's train.hparams. Returns (losses, pre-clip grad norms, lrs)."""
    opt = AdamW(model, hp["beta1"], hp["beta2"], hp["eps"], hp["weight_decay"])
    steps, accum = inputs.shape[0], inputs.shape[1]
    losses, norms, lrs = [], [], []
    for s in range(steps):
        lr = lr_at(s, hp["lr"], hp["min_lr"], hp["warmup_steps"], hp["total_steps"])
        for p in opt.params.values():
            p.grad = None
        step_loss = 0.0
        for a in range(accum):  # grads = mean over micro-batches of each mean-loss gradient
            loss = model.loss(inputs[s, a], targets[s, a])[0]
            (loss / accum).backward()
            step_loss += loss.item() / accum
        with torch.no_grad():
            norm = torch.sqrt(sum((p.grad ** 2).sum() for p in opt.params.values())).item()
            if norm > hp["grad_clip"]:
                for p in opt.params.values():
                    p.grad.mul_(hp["grad_clip"] / (norm + 1e-6))
        opt.step(lr)
        losses.append(step_loss)
        norms.append(norm)
        lrs.append(lr)
    return losses, norms, lrs


# ----------------------------------------------------------------------------------------------
# init / loss subcommands


class UsageError(Exception):
    """A bad command line found after parsing: main prints it as argparse's errors, exit status 2."""


def _usage_config(make, *args, **kwargs):
    """make(*args, **kwargs) (a config from command-line values); ValueError's message if it refuses them,
    else None."""
    try:
        make(*args, **kwargs)
    except ValueError as e:
        return str(e)
    return None


def cmd_init(args):
    overrides = dict(n_layer=args.layers, d_model=args.dim, n_head=args.heads)
    if args.vocab is not None:
        overrides["vocab_size"] = args.vocab
    if args.mlp_hidden is not None:
        overrides["mlp_hidden"] = args.mlp_hidden
    known = [n for _, n, _ in CONFIG_FIELDS]
    for item in args.set:
        key, eq, val = item.partition("=")
        if not eq or key not in known:
            raise UsageError("--set %s: %s" % (item, "expected FIELD=VALUE" if not eq else
                                               "unknown config field %s (known: %s)" % (key, ", ".join(known))))
        try:
            overrides[key] = float(val)
        except ValueError:
            raise UsageError("--set %s: %r is not a number" % (item, val)) from None
    if PRESETS[args.model]["arch"] == ARCH_GSA:  # GSA's heads are gsa_heads (--set gsa_heads=G), as in fox/args.h
        overrides["n_head"] = overrides.get("gsa_heads", dict((n, d) for _, n, d in CONFIG_FIELDS)["gsa_heads"])
    problem = _usage_config(make_config, args.model, **overrides)
    if problem:
        raise UsageError(problem)
    cfg = make_config(args.model, **overrides)
    params = init_params(cfg, args.seed)
    save_model_bin(args.out, cfg, params)
    print("wrote %s: %s, %d parameters" % (args.out, args.model, sum(a.size for a in params.values())))


@torch.no_grad()
def cmd_loss(args):
    _reference_device(args.device)
    cfg, params = load_model_bin(args.model_bin)
    if args.doc_sep is not None and cfg["arch"] != ARCH_ATTENTION:
        raise ValueError("--doc-sep: %s is a %s model, which takes no document mask" % (
            args.model_bin, fox_arch_name(cfg["arch"])))
    model = FoxModel(cfg, params, getattr(torch, args.dtype), args.device, doc_sep=args.doc_sep)
    tokens = torch.from_numpy(load_tokens(args.tokens, cfg["vocab_size"])).to(args.device)
    total = 0.0  # one sequence at a time bounds the T x T attention matrices' memory
    for row in tokens:
        total += model.loss(row[None, :-1], row[None, 1:])[1].double().sum().item()
    print("loss", repr(total / (tokens.shape[0] * (tokens.shape[1] - 1))))


def load_tokens(path, vocab_size):
    """The (B, T+1) token array of a .npy file, as int64: integers (or floats holding integers, as the C
    tests write them) in [0, vocab_size); ValueError naming the file otherwise."""
    try:
        tokens = np.load(path, allow_pickle=False)
    except (ValueError, EOFError) as e:  # not an .npy (or a cut one); OSError names the file itself
        raise ValueError("%s is not a .npy file numpy reads: %s" % (path, e)) from None
    if not isinstance(tokens, np.ndarray):
        tokens.close()
        raise ValueError("%s is an .npz archive: need one .npy array (B, T+1)" % path)
    if tokens.ndim != 2 or tokens.shape[0] < 1 or tokens.shape[1] < 2 or tokens.dtype.kind not in "iuf":
        raise ValueError("%s: need an int array (B, T+1), got %s of shape %s" % (path, tokens.dtype, tokens.shape))
    if tokens.dtype.kind == "f" and not np.array_equal(tokens, np.floor(tokens)):
        raise ValueError("%s holds non-integer token ids (a float array must hold whole numbers)" % path)
    bad = tokens[(tokens < 0) | (tokens >= vocab_size)]
    if bad.size:
        raise ValueError("%s holds token id %s, outside the model's vocabulary [0, %d)" % (path, bad.flat[0], vocab_size))
    return tokens.astype(np.int64)


def _reference_device(device):
    if device == "cuda":  # reference numerics: no TF32 in float32 matmuls
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        if not torch.cuda.is_available():
            raise ValueError("--device cuda: this PyTorch finds no CUDA device")


# ----------------------------------------------------------------------------------------------


def _fail(status, message):
    """The C programs' way out (fox/io.h fox_vfatal): one line `error: message` on stderr, exit status."""
    sys.stdout.flush()
    sys.stderr.write("error: %s\n" % re.sub(r"\s*\n\s*", " ", str(message).strip()))
    sys.exit(status)


class _Parser(argparse.ArgumentParser):
    """argparse with a bad command line reported as the C programs report it: one line `error: ...` (no
    usage block), exit status 2. The subcommands' parsers are of this class too (add_subparsers)."""

    def error(self, message):
        _fail(2, "%s: %s (see --help)" % (self.prog, message))


def _error_message(e, argv):
    """The one line for an exception of a subcommand. OSError: the file and the system's reason (for
    mkstemp and mkdtemp, _naming has put the user's path there); ValueError: ours name the file and
    what is wrong (the readers check what they parse); anything else is unforeseen: the command line and
    the exception, with a pointer to FOX_TRACEBACK."""
    if isinstance(e, OSError) and e.filename is not None:
        files = "%s -> %s" % (e.filename, e.filename2) if e.filename2 is not None else str(e.filename)
        return "%s: %s" % (files, e.strerror or e)
    if isinstance(e, (OSError, ValueError)):
        return str(e)
    return "train_fox.py %s: %s: %s (unforeseen: FOX_TRACEBACK=1 shows the traceback)" % (
        " ".join(argv), type(e).__name__, e)


def cmd_selfcheck(args):
    """test/test_reference.py, the self-check's home, run in this process: its lines and its exit status."""
    path = Path(__file__).resolve().parent / "test" / "test_reference.py"
    spec = importlib.util.spec_from_file_location("test_reference", path)
    suite = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(suite)
    sys.exit(suite.main())


def main(argv=None):
    # here, not at the top: reference/ imports this module
    from reference.fixtures import (FIXTURE_DOC_SEP, FIXTURE_SHAPE, FIXTURE_WORKER_THREADS, FIXTURES, cmd_fixtures,
                                    default_fixture_jobs)
    from reference.hf import cmd_export_hf, cmd_import_hf
    from reference.mc import cmd_mc
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    ap = _Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="subcommand", required=True)

    p = sub.add_parser("fixtures", help="write the float64 reference fixtures",
                       description="Writes DIR/<name>.fix for %s (vocab 128, 2 layers, d 64, 4 heads, "
                       "mlp 96, B 2, T 64, seed 1234) and DIR/manifest.txt. The -docmask fixtures are "
                       "computed with the document mask (docs/model.md §1.8), separator token %d, which "
                       "their inputs and training inputs contain; they carry a doc_sep tensor."
                       % (", ".join(n for n, _, _ in FIXTURES), FIXTURE_DOC_SEP))
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--dim", type=int, default=FIXTURE_SHAPE["d_model"],
                   help="d_model (default %(default)s; the GPU kernel needs head_dim 64 or 128)")
    p.add_argument("--heads", type=int, default=FIXTURE_SHAPE["n_head"], help="heads (default %(default)s)")
    p.add_argument("--only", metavar="NAMES", help="comma-separated subset of the fixtures")
    p.add_argument("--jobs", type=int, default=default_fixture_jobs(), metavar="N",
                   help="fixtures computed at once in worker processes (1: in this process), each with %d "
                   "threads; the bytes do not depend on N (default: half the usable CPUs, %%(default)s here)"
                   % FIXTURE_WORKER_THREADS)
    p.set_defaults(func=cmd_fixtures)

    p = sub.add_parser("init", help="write reference-initialised weights as a fox.c model.bin")
    p.add_argument("--model", default="fox-pro", choices=list(PRESETS), help="preset (default fox-pro)")
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--dim", type=int, required=True, help="d_model")
    p.add_argument("--heads", type=int, required=True, help="n_head (--model gsa: its heads are gsa_heads, --set gsa_heads=G)")
    p.add_argument("--vocab", type=int, help="vocab_size (default %d)" % FOX["FOX_VOCAB_GPT2"])
    p.add_argument("--mlp-hidden", type=int, help="default: the preset's ratio (docs/model.md §1)")
    p.add_argument("--seed", type=int, default=1337, help="RNG seed (default 1337)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override any config field, e.g. forget_gate=3 or t_max=64 (repeatable)")
    p.add_argument("--out", required=True, metavar="PATH")
    p.set_defaults(func=cmd_init)

    p = sub.add_parser("loss", help="mean next-token loss of a model.bin on a token file",
                       description="Prints `loss <repr>`: mean cross entropy over all positions, "
                       "inputs = tokens[:, :-1], targets = tokens[:, 1:].")
    p.add_argument("--model-bin", required=True, metavar="PATH")
    p.add_argument("--tokens", required=True, metavar="FILE.npy", help="int array (B, T+1)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--doc-sep", type=int, metavar="ID",
                   help="the document mask (docs/model.md §1.8, fox.c's --doc-mask) with separator token "
                   "ID, e.g. 50256 = <|endoftext|> (default: no mask)")
    p.set_defaults(func=cmd_loss)

    p = sub.add_parser("mc", help="multiple-choice log-likelihoods of a model.bin on token-id items",
                       description="Reads ITEMS.jsonl, one item a line: {\"context\": [ids], \"choices\": "
                       "[[ids], ...], \"label\": k} (token ids only; the text form is the C side's). Each choice "
                       "is scored on [start] + context + choice (start = %d, <|endoftext|>, if vocab_size > %d, "
                       "else 0), the context cut from the left until the model's inputs (all tokens but the "
                       "last) are at most --max-len; its log-likelihood is the sum of log p(token | everything "
                       "before it) over the choice's tokens. Writes one line per item to stdout: {\"index\": i "
                       "(0-based, blank lines skipped), \"label\": k, \"loglik\": [...], \"tokens\": "
                       "[len(choice)...]}. Every item is checked before anything is written; a bad one is a "
                       "one-line error naming ITEMS:LINE, exit status 1." % (FOX["FOX_EOT"], FOX["FOX_EOT"]))
    p.add_argument("--model-bin", required=True, metavar="PATH")
    p.add_argument("--items", required=True, metavar="ITEMS.jsonl")
    p.add_argument("--max-len", required=True, type=int, metavar="T",
                   help="the most tokens the model sees (a choice needs fewer than T)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    p.set_defaults(func=cmd_mc)

    p = sub.add_parser("export-hf", help="write a model.bin as a Hugging Face directory of the official FoX code",
                       description="Writes OUT_DIR/config.json and OUT_DIR/model.safetensors, which the official "
                       "forgetting_transformer package loads with AutoModelForCausalLM.from_pretrained.")
    p.add_argument("model_bin", metavar="MODEL_BIN")
    p.add_argument("out_dir", metavar="OUT_DIR", help="a new directory (an existing non-empty one is refused)")
    p.set_defaults(func=cmd_export_hf)

    p = sub.add_parser("import-hf", help="write an official FoX Hugging Face directory as a fox.c model.bin",
                       description="Reads HF_DIR/config.json and HF_DIR/model.safetensors (or the shards of "
                       "model.safetensors.index.json); refuses configs fox.c does not run.")
    p.add_argument("hf_dir", metavar="HF_DIR")
    p.add_argument("model_bin", metavar="MODEL_BIN", help="a new file (an existing one is refused)")
    p.set_defaults(func=cmd_import_hf)

    p = sub.add_parser("selfcheck", help="run the internal checks; exit 1 on failure",
                       description="RNG vs pure Python, attention vs a loop form, the document mask "
                       "(a separated window vs its last document alone, no separator vs no mask), finite "
                       "differences, GSA's chunked form vs its recurrence (outputs, gradients, model logits, "
                       "the state's closed form) and GSA finite differences, AdamW vs torch.optim.AdamW, "
                       "file round trips.")
    p.set_defaults(func=cmd_selfcheck)

    args = ap.parse_args(argv)
    try:
        args.func(args)
    except Exception as e:  # bad input: one line `error: ...`, not a traceback (module docstring)
        if os.environ.get("FOX_TRACEBACK", "") not in ("", "0"):
            raise
        if isinstance(e, UsageError):
            _fail(2, "%s %s: %s (see --help)" % (ap.prog, args.subcommand, e))
        _fail(1, _error_message(e, argv))


if __name__ == "__main__":
    sys.modules["train_fox"] = sys.modules[__name__]  # reference/ imports train_fox: this module, not a second copy
    main()
