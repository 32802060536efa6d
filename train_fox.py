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
block as the paper's concatenation of the memory and the block with an explicit mask; fam_layer_loop is
a numpy loop form of one layer it is checked against (selfcheck). No document mask either.

Subcommands:
  fixtures --out DIR     write DIR/<name>.fix (float64 reference tensors: init, weights, logits,
                         losses, gradients, 10 AdamW steps) for 16 small configs, plus
                         DIR/manifest.txt: the four attention presets, three switch variants,
                         the four presets again with the document mask (<preset>-docmask),
                         gsa (Gated Slot Attention, 8 slots), transformer-fam and fox-fam
                         (TransformerFAM: blocks of 8 and 16, memories of 4 and 3, windows of 2 and 1),
                         transformer-fam-gpu and fox-fam-gpu (blocks of 128, the GPU trainer's
                         multiple, at T = 384 and 512: memories of 4 and 36, windows of 1 and 2).
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
  selfcheck              internal consistency checks; prints `N passed, M failed`, exits 1 on a
                         failure.

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

Importable: load_model_bin(path) -> (config, params), save_model_bin(path, config, params),
init_params(config, seed), make_config(preset, ...), FoxModel(config, params, doc_sep=None),
read_fixture(path), mc_sequence(start, context, choice, max_len), mc_logliks(model, start, context,
choices, max_len), read_mc_items(path, vocab_size, max_len).
Parameters are numpy float32 arrays in the fox.c layout: (n_layer, rows, cols) for layer-stacked
tensors, (rows, cols) otherwise, flattening row-major to exactly the order of model.bin.

Runs on PyTorch 1.13 (Debian python3-torch, CPU: use /usr/bin/python3) and PyTorch 2.x.
"""

import argparse
import contextlib
import json
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


def config_invalid(c):
    """One line saying why a config is invalid, or None."""
    if min(c["vocab_size"], c["n_layer"], c["d_model"], c["n_head"], c["mlp_hidden"]) <= 0:
        return "vocab_size, n_layer, d_model, n_head and mlp_hidden must be positive"
    if c["arch"] not in (ARCH_ATTENTION, ARCH_GSA, ARCH_FAM):
        return "arch must be 0 (attention), 1 (GSA) or 2 (FAM)"
    if c["arch"] == ARCH_FAM:
        if c["fam_block"] <= 0:
            return "FAM: fam_block must be positive"
        if c["fam_memory"] <= 0:
            return "FAM: fam_memory must be positive"
        if c["fam_window_blocks"] < 0:
            return "FAM: fam_window_blocks must be 0 or more"
    if c["arch"] == ARCH_GSA:
        if c["gsa_heads"] <= 0 or c["d_model"] % c["gsa_heads"]:
            return "GSA: d_model must be a multiple of gsa_heads"
        if c["n_head"] != c["gsa_heads"]:
            return "GSA: n_head must equal gsa_heads"
        if c["gsa_slots"] <= 0:
            return "GSA: gsa_slots must be positive"
        if not c["gsa_tau"] > 0:
            return "GSA: gsa_tau must be positive"
        if c["forget_gate"] != FG_NONE or c["rope"] or c["qk_norm"] or c["kv_shift"] or c["output_gate"]:
            return "GSA has its own slot gates and takes no forget gate, RoPE, QK-norm, KV-shift or output gate"
    if c["d_model"] % c["n_head"]:
        return "d_model must be a multiple of n_head"
    if c["rope"] and head_dim(c) % 2:
        return "RoPE needs an even head_dim"
    if not FG_NONE <= c["forget_gate"] <= FG_FIXED:
        return "forget_gate must be 0..3"
    if not (c["t_min"] > 1.0 and c["t_max"] >= c["t_min"]):
        return "need 1 < t_min <= t_max"
    if c["qk_norm_shared"] and not c["qk_norm"]:
        return "qk_norm_shared needs qk_norm"
    return None


def head_dim(c):
    return c["d_model"] // c["n_head"]


def fox_arch_name(arch):
    """fox_arch_name of fox/config.h."""
    return {ARCH_GSA: "GSA", ARCH_FAM: "FAM"}.get(arch, "attention")


# [(name, rows symbol "D"/"H", C condition on the config c)], the row blocks of attn_in_w in order.
ATTN_IN_ROWS = _macro_entries(_CONFIG_H, "FOX_ATTN_IN_ROWS", "R")


def _c_condition(expr, c):
    """A FOX_ATTN_IN_ROWS condition (`1`, `c->kv_shift`, `c->forget_gate == FOX_FG_...`) on config c."""
    py = re.sub(r"c->(\w+)", lambda m: repr(c[m.group(1)]), expr)
    py = re.sub(r"\bFOX_\w+", lambda m: repr(FOX[m.group(0)]), py)
    if not re.fullmatch(r"[\d.\s=!<>]+", py):
        raise ValueError("FOX_ATTN_IN_ROWS condition %r is not a comparison of numbers" % expr)
    return bool(eval(py))


def attn_in_slices(c):
    """Row ranges of the stacked attention input projection attn_in_w (FOX_ATTN_IN_ROWS in fox/config.h):
    q [D] | k [D] | v [D] | gate [D] | k_shift [H] | v_shift [H] | fgate [H] | slot_gate [gsa_heads x gsa_slots],
    each when present."""
    size = {"D": c["d_model"], "H": c["n_head"], "GM": c["gsa_heads"] * c["gsa_slots"]}
    slices, start = {}, 0
    for name, rows, condition in ATTN_IN_ROWS:
        if _c_condition(condition, c):
            slices[name] = slice(start, start + size[rows])
            start += size[rows]
    return slices


def _dim(c, sym):
    """The size a FOX_PARAMS dimension symbol stands for (fox_dim in config.h)."""
    D, H = c["d_model"], c["n_head"]
    sizes = {
        "1": 1, "V": c["vocab_size"], "D": D, "I": c["mlp_hidden"], "I2": 2 * c["mlp_hidden"],
        "NIN": max(r.stop for r in attn_in_slices(c).values()),
        "HF": 0 if c["forget_gate"] == FG_NONE else H,
        "QN": (D // H if c["qk_norm_shared"] else D) if c["qk_norm"] else 0,
        "ON": D if c["output_norm"] else 0,
        "FM": c["fam_memory"] if c["arch"] == ARCH_FAM else 0,
    }
    return sizes[sym]


def layout(c):
    """The parameter tensors present in config c, in checkpoint order, as dicts with the tensor's
    index in FOX_PARAMS (its RNG stream), name, shape (fox.c layout), numel, decay and init."""
    out = []
    for index, (name, layered, r, cl, decay, init) in enumerate(PARAMS):
        rows, cols = _dim(c, r), _dim(c, cl)
        if rows * cols == 0:
            continue  # a 0-sized dimension drops the tensor (switched-off component)
        shape = (c["n_layer"], rows, cols) if layered else (rows, cols)
        out.append(dict(index=index, name=name, shape=shape, numel=int(np.prod(shape)),
                        decay=decay, init=init))
    return out


def param_learned(c, name):
    """The `fixed` forget-gate bias (ALiBi-like) is not trained (fox_param_learned)."""
    return not (name == "fgate_b" and c["forget_gate"] == FG_FIXED)


def fgate_bias_init(c, h):
    """docs/model.md §1 / FoX Appendix D: for the data-independent and fixed gates, head h has timescale
    T_h = -1/log σ(b), log-spaced from t_min to t_max, so b = -log(expm1(1/T_h)); 0 otherwise.
    Computed in double, returned as float32 (as fox_fgate_bias_init)."""
    if c["forget_gate"] in (FG_NONE, FG_DATA_DEPENDENT):
        return 0.0
    frac = h / (c["n_head"] - 1) if c["n_head"] > 1 else 0.0
    lo, hi = math.log(c["t_min"]), math.log(c["t_max"])
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


def init_params(c, seed, chunk=1 << 22):
    """Reference initialisation (docs/model.md §1 Init): tensor t of FOX_PARAMS uses key
    fox_rng_key(seed, t); N: element i (flat, all layers) = float32(0.02 * normal(key, i));
    ONE: 1; FGATE: fgate_bias_init per head, the same in every layer."""
    params = {}
    for p in layout(c):
        if p["init"] == "N":
            key, arr = rng_key(seed, p["index"]), np.empty(p["numel"], np.float32)
            for start in range(0, p["numel"], chunk):  # chunks bound the uint64 temporaries
                idx = np.arange(start, min(p["numel"], start + chunk), dtype=np.uint64)
                arr[start:start + len(idx)] = init_normal(key, idx, FOX["FOX_INIT_STD"])
        elif p["init"] == "ONE":
            arr = np.ones(p["numel"], np.float32)
        elif p["init"] == "FGATE":
            heads = np.array([fgate_bias_init(c, h) for h in range(c["n_head"])], np.float32)
            arr = np.tile(heads, p["numel"] // c["n_head"])
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


def _config_words(c):
    """The config fields as int32 words, floats as their float32 bits."""
    return [int(np.array([c[n]], np.float32).view(np.int32)[0]) if t == "FLOAT" else int(c[n])
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
        c, p = self.config, self.p
        if c["arch"] == ARCH_FAM:
            return self.fam_forward(idx)
        docs = self.documents(idx)
        x = p["wte"][idx]  # no positional table
        for l in range(c["n_layer"]):
            h = x + self.attention(l, rms_norm(x, p["ln1_w"][l, 0], FOX["FOX_NORM_EPS"]), docs)
            x = h + self.mlp(l, rms_norm(h, p["ln2_w"][l, 0], FOX["FOX_NORM_EPS"]))
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
        c, p = self.config, self.p
        B, T, D = xn.shape
        H, Dh = c["n_head"], head_dim(c)
        rows = attn_in_slices(c)
        proj = xn @ p["attn_in_w"][l].t()
        q, k, v = (proj[..., rows[n]].reshape(B, T, H, Dh) for n in ("q", "k", "v"))
        if c["kv_shift"] and not memory:  # eq. 16-19: k_t = a_t k~_{t-1} + (1 - a_t) k~_t, k~_{-1} = 0
            k = self._shift(k, torch.sigmoid(proj[..., rows["k_shift"]]), starts)
            v = self._shift(v, torch.sigmoid(proj[..., rows["v_shift"]]), starts)
        if c["qk_norm"]:  # eq. 15, 17: per-head RMSNorm over head_dim, on q and the shifted k
            shape = (1, Dh) if c["qk_norm_shared"] else (H, Dh)
            q = rms_norm(q, p["qnorm_w"][l].reshape(shape), FOX["FOX_QK_NORM_EPS"])
            k = rms_norm(k, p["knorm_w"][l].reshape(shape), FOX["FOX_QK_NORM_EPS"])
        if c["rope"]:  # after QK-norm
            q, k = self._rope(q, positions), self._rope(k, positions)
        log_f = None
        if memory:
            pass
        elif c["forget_gate"] == FG_DATA_DEPENDENT:  # eq. 20: f_t = sigmoid(w_f.x_t + b_f)
            log_f = F.logsigmoid(proj[..., rows["fgate"]] + p["fgate_b"][l, 0])
        elif c["forget_gate"] in (FG_DATA_INDEPENDENT, FG_FIXED):  # f = sigmoid(b_h) for all t
            log_f = F.logsigmoid(p["fgate_b"][l, 0]).expand(B, T, H)
        return q, k, v, log_f, proj

    def attention_output(self, l, o, proj):
        """Paper eq. 21-23 on the attention's output o (B, T, H, Dh): the per-head output norm, the output gate
        (its logits in proj), then W_o."""
        c, p = self.config, self.p
        B, T, H, Dh = o.shape
        rows = attn_in_slices(c)
        if c["output_norm"]:  # per-head RMSNorm of o, weight (H * Dh)
            o = rms_norm(o, p["onorm_w"][l].reshape(H, Dh), FOX["FOX_NORM_EPS"])
        o = o.reshape(B, T, H * Dh)
        if c["output_gate"]:  # eq. 21, 23
            o = o * torch.sigmoid(proj[..., rows["gate"]])
        return o @ p["attn_out_w"][l].t()

    def fam_forward(self, idx):
        """TransformerFAM (docs/model.md §1.10): idx (B, T) -> logits (B, T, V). The learned initial memory
        fam_init enters the first layer as token embeddings do (FAM paper B.1, prompt tuning); at each layer
        the rows entering it are that layer's first memory F_0, and the layer turns them (attending to each
        other alone, fam_prompt_layer) into the rows entering the next layer."""
        c, p = self.config, self.p
        x = p["wte"][idx]
        prompt = p["fam_init"]
        for l in range(c["n_layer"]):
            memory = prompt
            if l < c["n_layer"] - 1:
                prompt = self.fam_prompt_layer(l, prompt)
            x = self.fam_layer(l, x, memory)
        x = rms_norm(x, p["lnf_w"][0], FOX["FOX_NORM_EPS"])
        return x @ p["lm_head_w"].t()

    def fam_prompt_layer(self, l, g):
        """The prompt's rows g (M, D) through layer l: full attention among themselves (positions -M..-1, no
        decay), the residual, the MLP."""
        c, p = self.config, self.p
        M = g.shape[0]
        positions = torch.arange(-M, 0, dtype=torch.float64)
        q, k, v, _, proj = self.attention_inputs(l, rms_norm(g, p["ln1_w"][l, 0], FOX["FOX_NORM_EPS"])[None],
                                                 positions=positions, memory=True)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (1, H, M, Dh)
        o = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(head_dim(c)), dim=-1) @ v
        h = g + self.attention_output(l, o.transpose(1, 2), proj)[0]
        return h + self.mlp(l, rms_norm(h, p["ln2_w"][l, 0], FOX["FOX_NORM_EPS"]))

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
        too, with no residual at the first block (FAM paper B.1): F <- h + MLP(h), h = [F] + W_o(...)."""
        c, p = self.config, self.p
        B, T, D = x.shape
        K, M, W = c["fam_block"], c["fam_memory"], c["fam_window_blocks"]
        H, Dh = c["n_head"], head_dim(c)
        ln1, ln2, eps = p["ln1_w"][l, 0], p["ln2_w"][l, 0], FOX["FOX_NORM_EPS"]
        q, k, v, log_f, proj = self.attention_inputs(l, rms_norm(x, ln1, eps))
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, Dh)
        c_tok = torch.cumsum(log_f, dim=1).transpose(1, 2) if log_f is not None else x.new_zeros(B, H, T)
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
            c_mem = c_tok[:, :, t0 - 1:t0] if t0 > 0 else c_tok.new_zeros(B, H, 1)
            c_query = torch.cat([c_tok[:, :, t1 - 1:t1].expand(B, H, M), c_tok[:, :, t0:t1]], dim=-1)
            c_key = torch.cat([c_mem.expand(B, H, M), c_tok[:, :, w0:t1]], dim=-1)
            allowed = torch.zeros(M + n, M + nw, dtype=torch.bool)
            allowed[:, :M] = True  # everyone reads the memory
            allowed[:M, M + (t0 - w0):] = True  # the memory reads its block
            key_pos = torch.arange(w0, t1)
            allowed[M:, M:] = key_pos[None, :] <= torch.arange(t0, t1)[:, None]  # tokens: causal over the window
            s = Q @ Kc.transpose(-1, -2) / math.sqrt(Dh) + c_query[..., :, None] - c_key[..., None, :]
            O = torch.softmax(s.masked_fill(~allowed, float("-inf")), dim=-1) @ V  # (B, H, M + n, Dh)
            h = x[:, t0:t1] + self.attention_output(l, O[:, :, M:].transpose(1, 2), proj[:, t0:t1])
            out.append(h + self.mlp(l, rms_norm(h, ln2, eps)))
            if n == K:  # a complete block updates the memory
                hm = self.attention_output(l, O[:, :, :M].transpose(1, 2), fproj)
                if tau > 0:
                    hm = F_mem + hm
                F_mem = hm + self.mlp(l, rms_norm(hm, ln2, eps))
        return torch.cat(out, dim=1)

    def gsa(self, l, xn):
        """Gated Slot Attention (paper eq. 8-9), G = gsa_heads heads of dh = D / G, m = gsa_slots slots:
        q, k, v = silu(W_{q,k,v} x) (the Swish feature map), alpha = sigmoid(W_slot_gate x)^(1/gsa_tau)
        per head and slot, o = GSA(q, k, v, alpha) per head (gsa_chunked, or gsa_recurrent), then
        W_o RMSNorm(silu(concat of the heads' o)) with the norm over all D (weight onorm_w)."""
        c, p = self.config, self.p
        B, T, D = xn.shape
        G, m = c["gsa_heads"], c["gsa_slots"]
        rows = attn_in_slices(c)
        proj = xn @ p["attn_in_w"][l].t()
        q, k, v = (F.silu(proj[..., rows[n]]).reshape(B, T, G, D // G) for n in ("q", "k", "v"))
        log_alpha = F.logsigmoid(proj[..., rows["slot_gate"]]).reshape(B, T, G, m) / c["gsa_tau"]
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
# Fixtures

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
    # The same at the GPU trainer's blocks (multiples of 128): 3 blocks, memory 4, window 1; 4 blocks, memory 36
    # (more than one warp of keys), window 2.
    ("transformer-fam-gpu", "transformer-fam", dict(fam_block=128, fam_memory=4, fam_window_blocks=1)),
    ("fox-fam-gpu", "fox-fam", dict(fam_block=128, fam_memory=36, fam_window_blocks=2)),
]
# The fixtures whose context is not FIXTURE_T.
FIXTURE_SEQ_LEN = {"transformer-fam-gpu": 384, "fox-fam-gpu": 512}
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


def perturbed_params(c, init):
    """The init weights with every term made to matter: each ONE-init norm weight += 0.1 N(0,1),
    each forget-gate bias += 0.5 N(0,1) (+1.0 more for the data-dependent gate, so sigma(b) is
    away from 1/2). Draws from torch.Generator seeded 99, tensor by tensor in FOX_PARAMS order.
    Results are rounded to float32 so that C loading them as float32 is lossless."""
    gen = torch.Generator().manual_seed(99)
    out = {}
    for p in layout(c):
        arr = init[p["name"]].astype(np.float64)
        if p["init"] == "ONE":
            arr = arr + 0.1 * torch.randn(arr.shape, generator=gen, dtype=torch.float64).numpy()
        elif p["init"] == "FGATE":
            arr = arr + 0.5 * torch.randn(arr.shape, generator=gen, dtype=torch.float64).numpy()
            if c["forget_gate"] == FG_DATA_DEPENDENT:
                arr = arr + 1.0
        out[p["name"]] = arr.astype(np.float32).astype(np.float64)
    return out


def make_fixture(name, shape=FIXTURE_SHAPE):
    """All tensors of one fixture, computed in float64; returns ([(name, array)], grad norms)."""
    c = fixture_config(name, shape)
    V, B, T = c["vocab_size"], FIXTURE_B, FIXTURE_SEQ_LEN.get(name, FIXTURE_T)
    init = init_params(c, FIXTURE_SEED)
    params = perturbed_params(c, init)
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

    out = [("config", np.array([c[n] for _, n, _ in CONFIG_FIELDS], np.float64))]
    if sep is not None:
        out += [("doc_sep", np.array([float(sep)]))]
    out += [("init." + n, a.reshape(-1)) for n, a in init.items()]
    out += [("param." + n, a.reshape(-1)) for n, a in params.items()]
    out += [("inputs", inputs), ("targets", targets)]

    model = FoxModel(c, params, torch.float64, doc_sep=sep)
    loss, pos_loss, logits = model.loss(torch.from_numpy(inputs), torch.from_numpy(targets))
    loss.backward()
    out += [("logits", logits.detach().numpy()), ("loss", np.array([loss.item()])),
            ("pos_loss", pos_loss.detach().numpy())]
    out += [("grad." + n, (t.grad.numpy() if t.grad is not None else np.zeros(t.shape)).reshape(-1))
            for n, t in model.p.items()]

    model = FoxModel(c, params, torch.float64, doc_sep=sep)  # train from param.*, fresh state
    losses, norms, lrs = train(model, hp, torch.from_numpy(train_inputs), torch.from_numpy(train_targets))
    out += [("train.hparams", np.array(list(hp.values()), np.float64)),
            ("train.inputs", train_inputs), ("train.targets", train_targets),
            ("train.losses", np.array(losses)), ("train.grad_norms", np.array(norms)),
            ("train.lrs", np.array(lrs))]
    out += [("train.final." + n, t.detach().numpy().reshape(-1)) for n, t in model.p.items()]
    return out, norms


def cmd_fixtures(args):
    out_dir = Path(args.out)
    shape = dict(FIXTURE_SHAPE, d_model=args.dim, n_head=args.heads)
    wanted = args.only.split(",") if args.only else [n for n, _, _ in FIXTURES]
    unknown = [n for n in wanted if n not in [f for f, _, _ in FIXTURES]]
    if unknown:
        raise UsageError("--only: unknown fixture %s (known: %s)" % (
            ", ".join(unknown), ", ".join(f for f, _, _ in FIXTURES)))
    for name in wanted:  # every config valid at this shape before anything is computed or written
        problem = _usage_config(fixture_config, name, shape)
        if problem:
            raise UsageError("--dim %d --heads %d: fixture %s: %s" % (args.dim, args.heads, name, problem))
    out_dir.mkdir(parents=True, exist_ok=True)
    names = []
    width = max(len(n) for n in wanted)
    for name in wanted:
        tensors, norms = make_fixture(name, shape)
        write_fixture(out_dir / (name + ".fix"), tensors)
        names.append(name + ".fix")
        clipped = sum(n > TRAIN_HPARAMS["grad_clip"] for n in norms)
        print("%-*s loss %.6f  grad norms %s  (%d of %d steps clipped)" % (
            width, name, dict(tensors)["loss"][0], " ".join("%.3f" % n for n in norms), clipped, len(norms)))
    _atomic_write(out_dir / "manifest.txt", [("\n".join(names) + "\n").encode()])
    print("wrote %d fixtures to %s" % (len(names), out_dir))


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


# ----------------------------------------------------------------------------------------------
# mc subcommand: multiple-choice log-likelihoods (the reference of the trainers' evaluation)


def mc_start_token(vocab_size):
    """The token every multiple-choice sequence starts with: <|endoftext|> (50256) when the vocabulary holds
    it, else 0 (fox/run.h's prompt start)."""
    return FOX["FOX_EOT"] if vocab_size > FOX["FOX_EOT"] else 0


def mc_sequence(start, context, choice, max_len):
    """[start] + context + choice, the context cut from the left (its oldest tokens dropped, start kept) until
    the model's inputs, all tokens but the last, are at most max_len: 1 + len(context) + len(choice) - 1 <=
    max_len. A choice must be shorter than max_len (the evaluation's rule, shared with the C side), else
    ValueError (read_mc_items names the item)."""
    if len(choice) > max_len:
        raise ValueError("a choice of %d tokens: must be at most --max-len %d" % (len(choice), max_len))
    keep = max_len - len(choice)  # >= 0
    return [start] + list(context[max(0, len(context) - keep):]) + list(choice)


def _mc_ids(value, what, where, vocab_size):
    """The token-id list value (what: `context`, `choices[2]`), or ValueError naming where (FILE:LINE)."""
    if isinstance(value, str):
        raise ValueError("%s: %s is a string: the reference takes token ids only (the text form is the C "
                         "side's, which tokenizes with GPT-2)" % (where, what))
    if not isinstance(value, list):
        raise ValueError("%s: %s must be a list of token ids, got %s" % (where, what, type(value).__name__))
    for j, t in enumerate(value):
        if isinstance(t, bool) or not isinstance(t, int):
            raise ValueError("%s: %s[%d] = %s is not an integer token id" % (where, what, j, json.dumps(t)))
        if not 0 <= t < vocab_size:
            raise ValueError("%s: %s[%d] = %d is outside the model's vocabulary [0, %d)" % (
                where, what, j, t, vocab_size))
    return value


def read_mc_items(path, vocab_size, max_len):
    """The token-id items of a JSON-lines file, one object a line (blank lines skipped):
    {"context": [ids], "choices": [[ids], ...], "label": k}; each checked (ids in [0, vocab_size), a label
    indexing choices, every choice non-empty and shorter than max_len). Returns [(context, choices, label)];
    ValueError naming FILE:LINE (1-based) and what is wrong."""
    data = Path(path).read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError("%s is not UTF-8 text: %s" % (path, e)) from None
    items = []
    for lineno, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        where = "%s:%d" % (path, lineno)
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise ValueError("%s: not JSON: %s" % (where, e)) from None
        if not isinstance(obj, dict):
            raise ValueError("%s: expected a JSON object {\"context\", \"choices\", \"label\"}, got %s" % (
                where, type(obj).__name__))
        missing = [k for k in ("context", "choices", "label") if k not in obj]
        if missing:
            raise ValueError("%s: missing %s" % (where, ", ".join(missing)))
        context = _mc_ids(obj["context"], "context", where, vocab_size)
        choices = obj["choices"]
        if not isinstance(choices, list):
            raise ValueError("%s: choices must be a list of token-id lists, got %s" % (where, type(choices).__name__))
        if not choices:
            raise ValueError("%s: choices is empty" % where)
        for c, choice in enumerate(choices):
            _mc_ids(choice, "choices[%d]" % c, where, vocab_size)
            if not choice:
                raise ValueError("%s: choices[%d] is empty" % (where, c))
            if len(choice) > max_len:
                raise ValueError("%s: choices[%d] has %d tokens: a choice must be at most --max-len %d "
                                 "(the start token and the choice's tokens but its last are the model's inputs)" % (
                                     where, c, len(choice), max_len))
        label = obj["label"]
        if isinstance(label, bool) or not isinstance(label, int):
            raise ValueError("%s: label %s is not an integer" % (where, json.dumps(label)))
        if not 0 <= label < len(choices):
            raise ValueError("%s: label %d is out of range for %d choices (0 to %d)" % (
                where, label, len(choices), len(choices) - 1))
        items.append((context, choices, label))
    if not items:
        raise ValueError("%s holds no items" % path)
    return items


def mc_logliks(model, start, context, choices, max_len, device="cpu"):
    """[log-likelihood of each choice]: -sum of the model's per-position losses at the choice's tokens, on
    mc_sequence(start, context, choice, max_len) (inputs seq[:-1], targets seq[1:])."""
    out = []
    for choice in choices:
        seq = torch.tensor(mc_sequence(start, context, choice, max_len), dtype=torch.long, device=device)
        pos = model.loss(seq[None, :-1], seq[None, 1:])[1][0]
        out.append(-pos[-len(choice):].double().sum().item())
    return out


def _reference_device(device):
    if device == "cuda":  # reference numerics: no TF32 in float32 matmuls
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        if not torch.cuda.is_available():
            raise ValueError("--device cuda: this PyTorch finds no CUDA device")


@torch.no_grad()
def cmd_mc(args):
    if args.max_len < 2:
        raise UsageError("--max-len %d: must be at least 2 (a choice of one token and the start token)" % args.max_len)
    _reference_device(args.device)
    cfg, params = load_model_bin(args.model_bin)
    items = read_mc_items(args.items, cfg["vocab_size"], args.max_len)  # all checked before any line is written
    model = FoxModel(cfg, params, getattr(torch, args.dtype), args.device)
    start = mc_start_token(cfg["vocab_size"])
    for i, (context, choices, label) in enumerate(items):
        ll = mc_logliks(model, start, context, choices, args.max_len, args.device)
        # json writes a float as its repr: the shortest form that reads back to the same double
        sys.stdout.write(json.dumps({"index": i, "label": label, "loglik": ll,
                                     "tokens": [len(c) for c in choices]}) + "\n")
        sys.stdout.flush()


# ----------------------------------------------------------------------------------------------
# Exchange with the official FoX code (zhixuan-lin/forgetting-transformer): a Hugging Face directory,
# config.json and model.safetensors, that its AutoModelForCausalLM loads, and back. Tensor by tensor
# the weights are the same numbers; only names and stacking differ (docs/model.md §5.4).

HF_MODEL_TYPE = "forgetting_transformer-project_fox"
HF_FGATE_TYPES = {FG_DATA_DEPENDENT: "full", FG_DATA_INDEPENDENT: "bias_only", FG_FIXED: "fixed", FG_NONE: "none"}
_SAFETENSORS_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64}


def hf_config(c):
    """The official config.json of a fox.c config."""
    fg = c["forget_gate"]
    timescales = fg in (FG_DATA_INDEPENDENT, FG_FIXED)
    return {
        "architectures": ["ForgettingTransformerForCausalLM"],
        "model_type": HF_MODEL_TYPE,
        "vocab_size": c["vocab_size"],
        "hidden_size": c["d_model"],
        "num_hidden_layers": c["n_layer"],
        "num_heads": c["n_head"],
        "num_kv_heads": None,  # as many key/value heads as heads (the official code refuses any number)
        "intermediate_size": c["mlp_hidden"],
        "hidden_act": "swish",
        "norm_eps": float(np.float32(FOX["FOX_NORM_EPS"])),
        "use_rope": bool(c["rope"]),
        "rope_base": c["rope_theta"],
        "use_k_shift": bool(c["kv_shift"]),
        "use_v_shift": bool(c["kv_shift"]),
        "qk_norm": bool(c["qk_norm"]),
        "qk_norm_share_param_across_head": bool(c["qk_norm_shared"]),
        "use_output_gate": bool(c["output_gate"]),
        "ogate_act": "sigmoid",
        "use_output_norm": bool(c["output_norm"]),
        "fgate_type": HF_FGATE_TYPES[fg],
        "fgate_bias_init": timescales,
        "decay_time_min": c["t_min"] if timescales else None,
        "decay_time_max": c["t_max"] if timescales else None,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "elementwise_affine": True,
        "window_size": None,
        "bos_token_id": FOX["FOX_EOT"] if c["vocab_size"] == FOX["FOX_VOCAB_GPT2"] else None,
        "eos_token_id": FOX["FOX_EOT"] if c["vocab_size"] == FOX["FOX_VOCAB_GPT2"] else None,
        "torch_dtype": "float32",
    }


def _hf_kv_name(c, l, which):
    """The official name of layer l's k or v projection matrix (a ShiftLinear under KV-shift)."""
    return "model.layers.%d.attn.%s_proj.%s" % (l, which, "linear.weight" if c["kv_shift"] else "weight")


def hf_tensor_map(c):
    """[(official name, fox.c tensor, layer or None, row slice or None)]: where each official tensor's
    rows sit in the fox.c layout."""
    rows, fg = attn_in_slices(c), c["forget_gate"]
    out = [("model.embeddings.weight", "wte", None, None)]
    for l in range(c["n_layer"]):
        a = "model.layers.%d.attn." % l
        out += [("model.layers.%d.attn_norm.weight" % l, "ln1_w", l, None),
                (a + "q_proj.weight", "attn_in_w", l, rows["q"]),
                (_hf_kv_name(c, l, "k"), "attn_in_w", l, rows["k"]),
                (_hf_kv_name(c, l, "v"), "attn_in_w", l, rows["v"])]
        if c["kv_shift"]:
            out += [(a + "k_proj.shift_proj.weight", "attn_in_w", l, rows["k_shift"]),
                    (a + "v_proj.shift_proj.weight", "attn_in_w", l, rows["v_shift"])]
        if fg == FG_DATA_DEPENDENT:
            out += [(a + "fgate_proj.weight", "attn_in_w", l, rows["fgate"]),
                    (a + "fgate_proj.bias", "fgate_b", l, None)]
        elif fg != FG_NONE:
            out.append((a + "fgate_bias", "fgate_b", l, None))
        if c["qk_norm"]:
            out += [(a + "q_norm.weight", "qnorm_w", l, None), (a + "k_norm.weight", "knorm_w", l, None)]
        if c["output_norm"]:
            out.append((a + "output_norm.weight", "onorm_w", l, None))
        if c["output_gate"]:
            out.append((a + "ogate_proj.weight", "attn_in_w", l, rows["gate"]))
        out += [(a + "o_proj.weight", "attn_out_w", l, None),
                ("model.layers.%d.mlp_norm.weight" % l, "ln2_w", l, None),
                ("model.layers.%d.mlp.gate_proj.weight" % l, "mlp_in_w", l, None),
                ("model.layers.%d.mlp.down_proj.weight" % l, "mlp_out_w", l, None)]
    return out + [("model.norm.weight", "lnf_w", None, None), ("lm_head.weight", "lm_head_w", None, None)]


def _hf_view(params, name, layer, rows):
    a = params[name] if layer is None else params[name][layer]
    a = a if rows is None else a[rows]
    return a.reshape(-1) if a.shape[0] == 1 else a  # norm weights and biases are vectors there


def hf_tensors(c, params):
    """{official name: float32 array} of fox.c weights."""
    return {hf: np.ascontiguousarray(_hf_view(params, name, layer, rows), np.float32)
            for hf, name, layer, rows in hf_tensor_map(c)}


def write_safetensors(path, tensors):
    """The safetensors format: an 8-byte little-endian header length, a JSON header (name: dtype,
    shape, data_offsets), padded with spaces to a multiple of 8, then the raw little-endian data."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, a in tensors.items():
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    chunks = [struct.pack("<Q", len(text)), text] + [a.astype("<f4").tobytes() for a in tensors.values()]
    _atomic_write(path, chunks)


def _naturals(x, n=None):
    """Whether x is a JSON list of (n) non-negative integers."""
    return (isinstance(x, list) and (n is None or len(x) == n)
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in x))


def read_safetensors(path):
    """{name: float32 array} of a safetensors file (F32, F16, BF16 or F64 tensors). The header is checked
    entry by entry, then a file cut short is reported as truncated, then each tensor's offsets against its
    shape."""
    data = Path(path).read_bytes()
    if len(data) < 8:
        raise ValueError("%s has %d bytes: not a safetensors file (truncated?)" % (path, len(data)))
    n = struct.unpack("<Q", data[:8])[0]
    if 8 + n > len(data):
        raise ValueError("%s is truncated or not a safetensors file: its first 8 bytes give a header of %d bytes, "
                         "the file has %d" % (path, n, len(data)))
    try:
        header = json.loads(data[8:8 + n])
    except ValueError:
        raise ValueError("%s: the safetensors header is not JSON" % path) from None
    if not isinstance(header, dict):
        raise ValueError("%s: the safetensors header is not a JSON object" % path)
    entries = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(info, dict):
            raise ValueError("%s: tensor %s's header entry is not a JSON object" % (path, name))
        dtype = _SAFETENSORS_DTYPES.get(info.get("dtype"))
        if dtype is None:
            raise ValueError("%s: tensor %s has dtype %s (F32, F16, BF16 or F64 expected)" % (path, name, info.get("dtype")))
        offsets, shape = info.get("data_offsets"), info.get("shape")
        if not _naturals(offsets, 2) or offsets[0] > offsets[1]:
            raise ValueError("%s: tensor %s's data_offsets are %s, not [begin, end] with 0 <= begin <= end" %
                             (path, name, json.dumps(offsets)))
        if not _naturals(shape):
            raise ValueError("%s: tensor %s's shape is %s, not a list of non-negative integers" %
                             (path, name, json.dumps(shape)))
        entries[name] = (info["dtype"], np.dtype(dtype).newbyteorder("<"), offsets, tuple(shape))
    body, out = data[8 + n:], {}
    last = max((end for _, _, (_, end), _ in entries.values()), default=0)
    if last > len(body):
        raise ValueError("%s is truncated: its header places tensor data up to byte %d, the file has %d bytes" %
                         (path, 8 + n + last, len(data)))
    for name, (kind, dtype, (begin, end), shape) in entries.items():
        count = math.prod(shape)
        if end - begin != count * dtype.itemsize:
            raise ValueError("%s: tensor %s's data offsets %s do not fit its shape %s" % (path, name, [begin, end], shape))
        a = np.frombuffer(body, dtype, count, begin)
        if kind == "BF16":  # bfloat16 is the top half of a float32
            a = (a.astype(np.uint32) << 16).view(np.float32)
        out[name] = a.astype(np.float32).reshape(shape)
    return out


def config_from_hf(hf, where):
    """The fox.c config of an official config.json, or ValueError saying what fox.c does not run."""
    def need(cond, what):
        if not cond:
            raise ValueError("%s: %s" % (where, what))
    need(isinstance(hf, dict), "not a JSON object")
    for key in ("vocab_size", "num_hidden_layers", "hidden_size", "num_heads", "num_kv_heads", "intermediate_size",
                "hidden_ratio", "rope_base", "norm_eps", "decay_time_min", "decay_time_max"):
        v = hf.get(key)
        integer = key not in ("hidden_ratio", "rope_base", "norm_eps", "decay_time_min", "decay_time_max")
        need(v is None or (isinstance(v, int) or not integer and isinstance(v, float)) and not isinstance(v, bool),
             "%s is %s, not %s" % (key, json.dumps(v), "an integer" if integer else "a number"))
    need(hf.get("model_type") == HF_MODEL_TYPE, "model_type is %r, not %r" % (hf.get("model_type"), HF_MODEL_TYPE))
    H, D = hf.get("num_heads", 32), hf.get("hidden_size", 2048)
    need(hf.get("num_kv_heads") in (None, H), "num_kv_heads %s differs from num_heads %s: fox.c has no "
         "grouped-query attention" % (hf.get("num_kv_heads"), H))
    need(hf.get("hidden_act", "swish") == "swish", "hidden_act %r: fox.c's MLP is SwiGLU (swish)" % hf.get("hidden_act"))
    need(hf.get("window_size") is None, "window_size %r: fox.c attends to the whole context" % hf.get("window_size"))
    need(not hf.get("attention_bias", False), "attention_bias: fox.c's projections have no bias")
    need(not hf.get("tie_word_embeddings", False), "tie_word_embeddings: fox.c's lm_head is untied")
    need(hf.get("elementwise_affine", True), "elementwise_affine false: fox.c's norms have weights")
    need(hf.get("use_k_shift", False) == hf.get("use_v_shift", False),
         "use_k_shift and use_v_shift differ: fox.c shifts keys and values together (--kv-shift)")
    need(not hf.get("use_output_gate", False) or hf.get("ogate_act", "sigmoid") == "sigmoid",
         "ogate_act %r: fox.c's output gate is a sigmoid" % hf.get("ogate_act"))
    need(abs(hf.get("norm_eps", 1e-6) - FOX["FOX_NORM_EPS"]) <= 1e-12,
         "norm_eps %r: fox.c's RMSNorm epsilon is %g" % (hf.get("norm_eps"), FOX["FOX_NORM_EPS"]))
    fgate = {v: k for k, v in HF_FGATE_TYPES.items()}
    need(isinstance(hf.get("fgate_type", "full"), str) and hf.get("fgate_type", "full") in fgate,
         "fgate_type %r (full, bias_only, fixed or none)" % hf.get("fgate_type"))
    inter = hf.get("intermediate_size")
    if inter is None:  # the official rule from hidden_ratio
        inter = int(D * (hf.get("hidden_ratio") or 4) * 2 / 3)
        inter = 256 * ((inter + 255) // 256)
    try:
        c = make_config("fox-pro", vocab_size=hf.get("vocab_size", 32000), n_layer=hf.get("num_hidden_layers", 24),
                        d_model=D, n_head=H, mlp_hidden=inter, forget_gate=fgate[hf.get("fgate_type", "full")],
                        rope=int(bool(hf.get("use_rope", False))), qk_norm=int(bool(hf.get("qk_norm", False))),
                        qk_norm_shared=int(bool(hf.get("qk_norm", False)
                                                and hf.get("qk_norm_share_param_across_head", False))),
                        kv_shift=int(bool(hf.get("use_k_shift", False))),
                        output_gate=int(bool(hf.get("use_output_gate", False))),
                        output_norm=int(bool(hf.get("use_output_norm", False))),
                        rope_theta=float(hf.get("rope_base", 500000.0)))
    except ValueError as e:  # an invalid config: name the file
        raise ValueError("%s: %s" % (where, e)) from None
    if hf.get("fgate_bias_init"):
        need(hf.get("decay_time_min") is not None and hf.get("decay_time_max") is not None,
             "fgate_bias_init without decay_time_min and decay_time_max")
        c["t_min"], c["t_max"] = _f32(hf["decay_time_min"]), _f32(hf["decay_time_max"])
    problem = config_invalid(c)
    need(problem is None, "its config is not a valid fox.c model: %s" % problem)
    return c


def params_from_hf(c, tensors, where):
    """fox.c weights from official tensors; ValueError on a missing, misshapen or unknown tensor."""
    params = {p["name"]: np.zeros(p["shape"], np.float32) for p in layout(c)}
    expected = hf_tensor_map(c)
    for hf, name, layer, rows in expected:
        if hf not in tensors:
            raise ValueError("%s: tensor %s is missing" % (where, hf))
        view = _hf_view(params, name, layer, rows)
        if tensors[hf].shape != view.shape:
            raise ValueError("%s: tensor %s has shape %s, expected %s for its config" %
                             (where, hf, tensors[hf].shape, view.shape))
        view[...] = tensors[hf]
    known = {hf for hf, _, _, _ in expected}
    unknown = sorted(n for n in tensors if n not in known and not n.endswith("rotary.inv_freq"))
    if unknown:
        raise ValueError("%s: %d tensors fox.c has no place for, e.g. %s" % (where, len(unknown), unknown[0]))
    return params


def _fresh_output(path):
    if Path(path).exists() and (not Path(path).is_dir() or any(Path(path).iterdir())):
        raise ValueError("%s already exists: choose a new path (nothing is overwritten)" % path)


def cmd_export_hf(args):
    cfg, params = load_model_bin(args.model_bin)
    if cfg["arch"] != ARCH_ATTENTION:
        raise ValueError("%s is a %s model: the official FoX code has no such architecture" % (
            args.model_bin, "GSA" if cfg["arch"] == ARCH_GSA else "TransformerFAM"))
    _fresh_output(args.out_dir)
    out = Path(args.out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    with _naming(out):
        tmp = Path(tempfile.mkdtemp(prefix="." + out.name + ".", dir=str(out.parent)))
    try:
        _atomic_write(tmp / "config.json", [(json.dumps(hf_config(cfg), indent=2) + "\n").encode()])
        write_safetensors(tmp / "model.safetensors", hf_tensors(cfg, params))
        os.chmod(str(tmp), 0o777 & ~_umask())  # mkdtemp's 0700 -> the mode of a plain mkdir
        if out.exists():
            out.rmdir()
        os.rename(str(tmp), str(out))
    except BaseException:
        for f in tmp.iterdir():
            f.unlink()
        tmp.rmdir()
        raise
    print("wrote %s: config.json, model.safetensors (%d tensors)" % (out, len(hf_tensor_map(cfg))))


def _read_json(path):
    """The JSON value of a file; ValueError naming the file if it is not JSON (OSError names it itself)."""
    text = Path(path).read_bytes()
    try:
        return json.loads(text)
    except ValueError as e:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError("%s is not JSON: %s" % (path, e)) from None


def cmd_import_hf(args):
    d = Path(args.hf_dir)
    c = config_from_hf(_read_json(d / "config.json"), d / "config.json")
    index = d / "model.safetensors.index.json"
    if index.exists():  # a sharded checkpoint: weight_map names the file of each tensor
        weight_map = _read_json(index)
        weight_map = weight_map.get("weight_map") if isinstance(weight_map, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
            raise ValueError("%s: no weight_map object of tensor names and file names" % index)
        files = sorted(set(weight_map.values()))
    else:
        files = ["model.safetensors"]
    tensors = {}
    for f in files:
        if not (d / f).exists():
            raise ValueError("%s: %s is missing" % (d, f))
        tensors.update(read_safetensors(d / f))
    params = params_from_hf(c, tensors, d)
    _fresh_output(args.model_bin)
    save_model_bin(args.model_bin, c, params)
    print("wrote %s: %d layers, d_model %d, %d heads, forget gate %s" %
          (args.model_bin, c["n_layer"], c["d_model"], c["n_head"], HF_FGATE_TYPES[c["forget_gate"]]))


# ----------------------------------------------------------------------------------------------
# selfcheck


def _loop_rms(x, w, eps):
    return x / math.sqrt(sum(e * e for e in x) / len(x) + eps) * w


def _loop_sigmoid(z):
    return 1.0 / (1.0 + math.exp(-z))


def _loop_qk(c, W, q, k, hd, pos):
    """The loop forms' QK-norm, then RoPE at position pos, of one head's q and k (hd: the head's slice)."""
    if c["qk_norm"]:
        wq, wk = W["qnorm_w"].reshape(-1), W["knorm_w"].reshape(-1)
        if not c["qk_norm_shared"]:
            wq, wk = wq[hd], wk[hd]
        q, k = _loop_rms(q, wq, FOX["FOX_QK_NORM_EPS"]), _loop_rms(k, wk, FOX["FOX_QK_NORM_EPS"])
    if c["rope"]:
        Dh = len(q)
        q, k = q.copy(), k.copy()
        for d in range(Dh // 2):
            th = pos * c["rope_theta"] ** (-2.0 * d / Dh)
            for x in (q, k):
                a, b = x[d], x[d + Dh // 2]
                x[d], x[d + Dh // 2] = a * math.cos(th) - b * math.sin(th), b * math.cos(th) + a * math.sin(th)
    return q, k


def attention_layer_loop(c, W, xn, starts=None):
    """One attention layer for one sequence, token by token in numpy float64, written from the
    paper's product form (eq. 11: F_ij = prod_{l=j+1..i} f_l) rather than cumsums and matrices.
    W: this layer's tensors in the fox.c layout; xn: (T, D) normalised input. Returns (T, D).
    starts: None, or T bools, the separators of the document mask (docs/model.md §1.8), applied
    as fox.c does rather than as FoxModel does: f = 0 at a separator (so F_ij = 0 across one, also
    with no forget gate) and no KV-shift from the token before it."""
    if c["arch"] == ARCH_GSA:
        return gsa_layer_loop(c, W, xn)
    T, D = xn.shape
    starts = [False] * T if starts is None else list(starts)
    H, Dh = c["n_head"], head_dim(c)
    rows = attn_in_slices(c)

    rms, sigmoid = _loop_rms, _loop_sigmoid
    proj = [W["attn_in_w"] @ xn[t] for t in range(T)]
    out = np.zeros((T, D))
    for h in range(H):
        hd = slice(h * Dh, (h + 1) * Dh)
        qs, ks, vs, fs = [], [], [], []
        for t in range(T):
            q = proj[t][rows["q"]][hd]
            k = proj[t][rows["k"]][hd]
            v = proj[t][rows["v"]][hd]
            if c["kv_shift"]:
                has_prev = t > 0 and not starts[t]
                k_prev = proj[t - 1][rows["k"]][hd] if has_prev else np.zeros(Dh)
                v_prev = proj[t - 1][rows["v"]][hd] if has_prev else np.zeros(Dh)
                ak = sigmoid(proj[t][rows["k_shift"]][h])
                av = sigmoid(proj[t][rows["v_shift"]][h])
                k = ak * k_prev + (1 - ak) * k
                v = av * v_prev + (1 - av) * v
            q, k = _loop_qk(c, W, q, k, hd, t)
            if c["forget_gate"] == FG_DATA_DEPENDENT:
                fs.append(sigmoid(proj[t][rows["fgate"]][h] + W["fgate_b"].reshape(-1)[h]))
            elif c["forget_gate"] != FG_NONE:
                fs.append(sigmoid(W["fgate_b"].reshape(-1)[h]))
            else:
                fs.append(1.0)
            if starts[t]:
                fs[-1] = 0.0
            qs.append(q), ks.append(k), vs.append(v)
        for i in range(T):
            num, den = np.zeros(Dh), 0.0
            for j in range(i + 1):
                decay = math.prod(fs[j + 1:i + 1])
                wgt = decay * math.exp(qs[i] @ ks[j] / math.sqrt(Dh))
                num, den = num + wgt * vs[j], den + wgt
            o = num / den
            if c["output_norm"]:
                o = rms(o, W["onorm_w"].reshape(-1)[hd], 1e-6)
            if c["output_gate"]:
                o = o * np.array([sigmoid(z) for z in proj[i][rows["gate"]][hd]])
            out[i, hd] = o
    return np.array([W["attn_out_w"] @ out[t] for t in range(T)])


def gsa_layer_loop(c, W, xn):
    """One GSA layer for one sequence, token by token in numpy float64, from the paper (eq. 6, 8, 9):
    the slot memories K~ (S) and V~ (U) updated row by row, alpha = sigmoid(.) ** (1 / tau).
    W: this layer's tensors in the fox.c layout; xn: (T, D) normalised input. Returns (T, D)."""
    T, D = xn.shape
    G, m, tau = c["gsa_heads"], c["gsa_slots"], c["gsa_tau"]
    dh = D // G
    rows = attn_in_slices(c)
    proj = [W["attn_in_w"] @ xn[t] for t in range(T)]
    silu = lambda z: z / (1.0 + np.exp(-z))
    out = np.zeros((T, D))
    for g in range(G):
        hd = slice(g * dh, (g + 1) * dh)
        S, U = np.zeros((m, dh)), np.zeros((m, dh))
        for t in range(T):
            q, k, v = (silu(proj[t][rows[n]][hd]) for n in ("q", "k", "v"))
            gate = proj[t][rows["slot_gate"]][g * m:(g + 1) * m]
            for i in range(m):
                alpha = (1.0 / (1.0 + math.exp(-gate[i]))) ** (1.0 / tau)
                S[i] = alpha * S[i] + (1.0 - alpha) * k
                U[i] = alpha * U[i] + (1.0 - alpha) * v
            s = S @ q / math.sqrt(dh)
            e = np.exp(s - s.max())
            out[t, hd] = U.T @ (e / e.sum())
    z = silu(out)
    z = z / np.sqrt((z * z).mean(-1, keepdims=True) + 1e-6) * W["onorm_w"].reshape(-1)
    return z @ W["attn_out_w"].T


class _FamLoopParts:
    """The per-row pieces of fam_layer_loop and fam_prompt_loop for config c and one layer's tensors W (the
    fox.c layout), in numpy float64 and plain Python loops."""

    def __init__(self, c, W):
        self.c, self.W, self.rows = c, W, attn_in_slices(c)
        self.H, self.Dh, self.D = c["n_head"], head_dim(c), c["d_model"]

    rms, sigmoid = staticmethod(_loop_rms), staticmethod(_loop_sigmoid)

    def project(self, row):
        """attn_in_w RMSNorm(row)."""
        return self.W["attn_in_w"] @ self.rms(row, self.W["ln1_w"].reshape(-1), FOX["FOX_NORM_EPS"])

    def heads(self, pr, pos, k_in=None, v_in=None):
        """[(q, k, v)] per head from one row's projection pr at position pos (k_in, v_in: the KV-shifted
        ones, tokens only): QK-norm, then RoPE."""
        c, Dh, out = self.c, self.Dh, []
        for h in range(self.H):
            hd = slice(h * Dh, (h + 1) * Dh)
            q, k = pr[self.rows["q"]][hd], (pr[self.rows["k"]] if k_in is None else k_in)[hd]
            v = (pr[self.rows["v"]] if v_in is None else v_in)[hd]
            q, k = _loop_qk(c, self.W, q, k, hd, pos)
            out.append((q, k, v))
        return out

    def attend(self, q, keys):
        """keys: [(k, v, decay)]; the weights are decay * exp(q.k / sqrt(Dh)), normalised."""
        num, den = np.zeros(self.Dh), 0.0
        for k, v, decay in keys:
            wgt = decay * math.exp(q @ k / math.sqrt(self.Dh))
            num, den = num + wgt * v, den + wgt
        return num / den

    def residual_out(self, res, o, pr):
        """res + W_o(eq. 21-23 on the heads' outputs o), then + the MLP of that."""
        c, Dh, z = self.c, self.Dh, np.zeros(self.D)
        for h in range(self.H):
            hd = slice(h * Dh, (h + 1) * Dh)
            oh = self.rms(o[h], self.W["onorm_w"].reshape(-1)[hd], FOX["FOX_NORM_EPS"]) if c["output_norm"] else o[h]
            if c["output_gate"]:
                oh = oh * np.array([self.sigmoid(g) for g in pr[self.rows["gate"]][hd]])
            z[hd] = oh
        hh = res + self.W["attn_out_w"] @ z
        u = self.W["mlp_in_w"] @ self.rms(hh, self.W["ln2_w"].reshape(-1), FOX["FOX_NORM_EPS"])
        I = len(u) // 2
        return hh + self.W["mlp_out_w"] @ np.array([u[i] / (1.0 + math.exp(-u[i])) * u[I + i] for i in range(I)])


def fam_layer_loop(c, W, x, memory):
    """One TransformerFAM layer for one sequence, query by query in numpy float64 from the FAM paper's
    Algorithm 2 and docs/model.md §1.10, rather than by masked matrices. x (T, D): the residual stream
    entering the layer; memory (M, D): its first memory F_0; W: the layer's tensors in the fox.c layout.
    Every query lists its keys explicitly, each key with the time of the token whose c it carries (the
    memory's keys: the token before their block, -1 before the first; the memory's queries: the block's
    last token); the decay from key time tk to query time tq is the product of the gates f_l, tk < l <= tq
    (eq. 11's product form). Returns the layer's output (T, D)."""
    T, D = x.shape
    K, M, Wb = c["fam_block"], c["fam_memory"], c["fam_window_blocks"]
    P = _FamLoopParts(c, W)
    H, Dh, rows = P.H, P.Dh, P.rows
    proj = [P.project(x[t]) for t in range(T)]
    fs = [[1.0] * T for _ in range(H)]
    if c["forget_gate"] != FG_NONE:
        for h in range(H):
            for t in range(T):
                dd = proj[t][rows["fgate"]][h] if c["forget_gate"] == FG_DATA_DEPENDENT else 0.0
                fs[h][t] = P.sigmoid(W["fgate_b"].reshape(-1)[h] + dd)

    def decay(h, tk, tq):
        return math.prod(fs[h][tk + 1:tq + 1])

    tok = []
    for t in range(T):
        k_in = v_in = None
        if c["kv_shift"]:
            ak = np.repeat([P.sigmoid(a) for a in proj[t][rows["k_shift"]]], Dh)
            av = np.repeat([P.sigmoid(a) for a in proj[t][rows["v_shift"]]], Dh)
            k_prev = proj[t - 1][rows["k"]] if t else np.zeros(D)
            v_prev = proj[t - 1][rows["v"]] if t else np.zeros(D)
            k_in, v_in = ak * k_prev + (1 - ak) * proj[t][rows["k"]], av * v_prev + (1 - av) * proj[t][rows["v"]]
        tok.append(P.heads(proj[t], t, k_in, v_in))
    F_mem, out = memory.copy(), np.zeros((T, D))
    for tau in range((T + K - 1) // K):
        t0, t1 = tau * K, min(T, tau * K + K)
        fproj = [P.project(F_mem[i]) for i in range(M)]
        mem = [P.heads(fproj[i], t0 - M + i) for i in range(M)]
        for t in range(t0, t1):
            o = [P.attend(tok[t][h][0], [(mem[i][h][1], mem[i][h][2], decay(h, t0 - 1, t)) for i in range(M)] +
                          [(tok[j][h][1], tok[j][h][2], decay(h, j, t)) for j in range(max(0, t0 - Wb * K), t + 1)])
                 for h in range(H)]
            out[t] = P.residual_out(x[t], o, proj[t])
        if t1 - t0 == K:
            new = []
            for i in range(M):
                o = [P.attend(mem[i][h][0], [(mem[j][h][1], mem[j][h][2], decay(h, t0 - 1, t1 - 1)) for j in range(M)] +
                              [(tok[j][h][1], tok[j][h][2], decay(h, j, t1 - 1)) for j in range(t0, t1)])
                     for h in range(H)]
                new.append(P.residual_out(F_mem[i] if tau else np.zeros(D), o, fproj[i]))
            F_mem = np.array(new)
    return out


def fam_prompt_loop(c, W, g):
    """The prompt's rows g (M, D) through one layer, in numpy float64 (FAM paper B.1): each row, at position
    i - M, attends to all M rows with no decay; then the residual and the MLP."""
    M = g.shape[0]
    P = _FamLoopParts(c, W)
    proj = [P.project(g[i]) for i in range(M)]
    qkv = [P.heads(proj[i], i - M) for i in range(M)]
    return np.array([P.residual_out(g[i], [P.attend(qkv[i][h][0], [(qkv[j][h][1], qkv[j][h][2], 1.0) for j in range(M)])
                                            for h in range(P.H)], proj[i]) for i in range(M)])


def fam_checks():
    """Yields (name, ok, detail): the TransformerFAM checks of selfcheck (float64 throughout)."""
    for name in ("transformer-fam", "fox-fam"):
        c = fixture_config(name)
        params = perturbed_params(c, init_params(c, FIXTURE_SEED))
        params["fam_init"] = params["fam_init"] * 25  # a memory at the residual stream's scale matters more
        model = FoxModel(c, params, torch.float64)
        layer = {n: a[1] for n, a in params.items() if a.ndim == 3}
        rng = np.random.default_rng(31)
        T = 2 * c["fam_block"] + 5  # two memory updates and a partial block
        x = rng.standard_normal((1, T, c["d_model"]))
        memory = rng.standard_normal((c["fam_memory"], c["d_model"]))
        with torch.no_grad():
            fast = model.fam_layer(1, torch.from_numpy(x), torch.from_numpy(memory))[0].numpy()
        slow = fam_layer_loop(c, layer, x[0], memory)
        err = np.abs(fast - slow).max() / np.abs(slow).max()
        yield ("FAM layer (the block's concatenation and mask) vs the query-by-query loop form, T %d: %s" % (T, name),
               err < 1e-12, "max rel err %.2e" % err)

        with torch.no_grad():
            fast = model.fam_prompt_layer(1, torch.from_numpy(memory)).numpy()
        slow = fam_prompt_loop(c, layer, memory)
        err = np.abs(fast - slow).max() / np.abs(slow).max()
        yield "FAM prompt through a layer vs its loop form: " + name, err < 1e-12, "max rel err %.2e" % err

        # causality: the logits before position p do not depend on the tokens from p on (at, around and inside
        # block boundaries: the memory after a block must reach only the blocks after it)
        idx = torch.from_numpy(rng.integers(0, c["vocab_size"], (1, 3 * c["fam_block"] + 3)))
        with torch.no_grad():
            base = model(idx)
            worst = 0.0
            for p in (1, c["fam_block"] - 1, c["fam_block"], c["fam_block"] + 1, 2 * c["fam_block"] + 2):
                other = idx.clone()
                other[0, p:] = (other[0, p:] + 1) % c["vocab_size"]
                worst = max(worst, (model(other)[0, :p] - base[0, :p]).abs().max().item())
        yield "FAM causality: logits before p unchanged by the tokens from p on, " + name, worst == 0.0, "max diff %.1e" % worst


def gsa_checks():
    """Yields (name, ok, detail): the GSA checks of selfcheck (float64 throughout)."""
    def rel(a, b):
        return ((a - b).abs().max() / b.abs().max()).item()

    # (g1) gsa_chunked vs gsa_recurrent on random inputs, forward and the gradients of a random linear
    # functional of o; T = 37 with chunks of 16 (a short last chunk), 7 and 64 (one chunk, longer than T).
    gen = torch.Generator().manual_seed(21)
    B, T, G, dh, m = 2, 37, 2, 8, 5
    q, k, v = (torch.randn(B, T, G, dh, generator=gen, dtype=torch.float64).requires_grad_() for _ in range(3))
    log_alpha = F.logsigmoid(2 * torch.randn(B, T, G, m, generator=gen, dtype=torch.float64)).requires_grad_()
    weight = torch.randn(B, T, G, dh, generator=gen, dtype=torch.float64)
    inputs = (q, k, v, log_alpha)

    def forward_and_grads(fn):
        o = fn(*inputs)
        return [o.detach()] + list(torch.autograd.grad((o * weight).sum(), inputs))

    ref = forward_and_grads(gsa_recurrent)
    for chunk in (16, 7, 64):
        got = forward_and_grads(lambda *a: gsa_chunked(*a, chunk=chunk))
        errs = [rel(a, b) for a, b in zip(got, ref)]
        yield ("GSA chunked (chunk %d) vs recurrent, T %d: o and d/dq, dk, dv, dlog_alpha" % (chunk, T),
               max(errs) < 1e-12, "max rel err " + " ".join("%.1e" % e for e in errs))

    # (g2) a GSA model's logits with the chunked form (chunk 16: 3 chunks of 40 tokens) vs the recurrent one.
    c = fixture_config("gsa")
    params = perturbed_params(c, init_params(c, FIXTURE_SEED))
    idx = torch.from_numpy(np.random.default_rng(17).integers(0, c["vocab_size"], (2, 40)))
    with torch.no_grad():
        chunked = FoxModel(c, params, torch.float64)(idx)
        recurrent = FoxModel(c, params, torch.float64, gsa_chunk=0)(idx)
    err = rel(chunked, recurrent)
    yield "GSA model logits: chunked vs recurrent, T 40", err < 1e-12, "max rel err %.2e" % err

    # (g3) finite differences of the GSA loss (central, float64, default chunked form, T 24: 2 chunks)
    # along a random direction of the slot-gate rows of attn_in_w (all layers), and of onorm_w.
    model = FoxModel(c, params, torch.float64)
    rng = np.random.default_rng(19)
    idx = torch.from_numpy(rng.integers(0, c["vocab_size"], (1, 24)))
    tgt = torch.from_numpy(rng.integers(0, c["vocab_size"], (1, 24)))
    model.loss(idx, tgt)[0].backward()
    gate_rows = attn_in_slices(c)["slot_gate"]
    for pname, rows in (("attn_in_w", gate_rows), ("onorm_w", slice(None))):
        t = model.p[pname]
        direction = torch.zeros_like(t)
        direction[:, rows] = torch.from_numpy(rng.standard_normal(tuple(direction[:, rows].shape)))
        eps = 1e-5
        with torch.no_grad():
            orig = t.clone()
            t.add_(eps * direction)
            up = model.loss(idx, tgt)[0].item()
            t.copy_(orig - eps * direction)
            down = model.loss(idx, tgt)[0].item()
            t.copy_(orig)
        fd, ag = (up - down) / (2 * eps), (t.grad * direction).sum().item()
        err = abs(fd - ag) / abs(ag)
        yield ("GSA finite differences along a random direction of " +
               ("the slot-gate rows of attn_in_w" if pname == "attn_in_w" else pname), err < 1e-6,
               "fd %.10e autograd %.10e rel err %.2e" % (fd, ag, err))

    # (g4) the semantics of the recurrence: after t steps, S_t = sum_{j<=t} exp(b_t - b_j) (1 - alpha_j) k_j
    # with b_t = sum_{l<=t} log alpha_l (and U_t likewise with v), for gsa_recurrent's state and the
    # state gsa_chunked carries out of its last chunk (chunk 4, t = 11: a short last chunk).
    rng = np.random.default_rng(23)
    t_steps, dh, m = 11, 4, 5
    k_np, v_np = rng.standard_normal((t_steps, dh)), rng.standard_normal((t_steps, dh))
    la_np = np.log(rng.uniform(0.3, 0.99, (t_steps, m)))
    b = np.cumsum(la_np, axis=0)
    coef = np.exp(b[-1] - b) * (1 - np.exp(la_np))  # (t, m)
    S_closed, U_closed = coef.T @ k_np, coef.T @ v_np
    as_t = lambda x: torch.from_numpy(x)[None, :, None, :]  # (1, t, 1, .)
    q_t = torch.from_numpy(rng.standard_normal((1, t_steps, 1, dh)))
    for form, fn in (("recurrent", gsa_recurrent), ("chunked (chunk 4)", lambda *a, **kw: gsa_chunked(*a, chunk=4, **kw))):
        _, S, U = fn(q_t, as_t(k_np), as_t(v_np), as_t(la_np), return_state=True)
        err = max(np.abs(S[0, 0].numpy() - S_closed).max() / np.abs(S_closed).max(),
                  np.abs(U[0, 0].numpy() - U_closed).max() / np.abs(U_closed).max())
        yield ("GSA state after %d steps = closed form sum_j exp(b_t - b_j)(1 - alpha_j) k_j (and v_j), %s"
               % (t_steps, form), err < 1e-12, "max rel err %.2e" % err)


def selfcheck_results():
    """Yields (name, ok, detail) for each check."""
    # (d) RNG: numpy vs pure Python ints + libm, for a few (seed, stream, i).
    for seed, stream, i in [(0, 0, 0), (1234, 2, 5), (MASK64, 12, 123456789), (2**63 + 7, 1000, 2**40)]:
        key = rng_key(seed, stream)
        idx = np.array([i], np.uint64)
        bits_np = int(mix64_np(np.uint64(key) + idx)[0])
        bits_py = mix64_py((key + i) & MASK64)
        n_np, n_py = rng_normal_np(key, idx)[0], rng_normal_py(key, i)
        w_np, w_py = init_normal(key, idx, 0.02)[0], np.float32(0.02 * n_py)
        ok = bits_np == bits_py and abs(n_np - n_py) <= 1e-14 * abs(n_py) and w_np == w_py
        yield ("rng seed=%d stream=%d i=%d" % (seed, stream, i), ok,
               "bits %016x/%016x normal %r/%r" % (bits_np, bits_py, n_np, n_py))
    key = rng_key(1234, 2)
    w_np = init_normal(key, np.arange(100000, dtype=np.uint64), 0.02)
    w_py = np.array([0.02 * rng_normal_py(key, i) for i in range(100000)], np.float32)
    yield "rng init 100000 elements bitwise", bool((w_np == w_py).all()), "%d differ" % (w_np != w_py).sum()

    # (a) the model's attention layer vs the loop form, every fixture config (the -docmask ones with
    # separators at 0, 4, 5 and 9: its block-diagonal mask vs the loop form's closed gate; gsa: its
    # chunked form, chunk 5, vs the paper's slot-memory recurrence).
    for name, _, _ in FIXTURES:
        c = fixture_config(name)
        if c["arch"] == ARCH_FAM:  # a FAM layer is more than its token mixer: fam_checks
            continue
        sep = fixture_doc_sep(name)
        params = perturbed_params(c, init_params(c, FIXTURE_SEED))
        model = FoxModel(c, params, torch.float64, doc_sep=sep, gsa_chunk=5)  # GSA: 3 chunks
        xn = torch.from_numpy(np.random.default_rng(3).standard_normal((1, 12, c["d_model"])))
        starts = None if sep is None else np.isin(np.arange(12), (0, 4, 5, 9))
        docs = None if sep is None else model.documents(torch.from_numpy(np.where(starts, sep, 0)[None]))
        with torch.no_grad():
            fast = model.attention(1, xn, docs)[0].numpy()
        layer = {n: a[1] for n, a in params.items() if a.ndim == 3}
        slow = attention_layer_loop(c, layer, xn[0].numpy(), starts)
        err = np.abs(fast - slow).max() / np.abs(slow).max()
        yield "attention vs loop form: " + name, err < 1e-12, "max rel err %.2e" % err

    # (e) the document mask (docs/model.md §1.8), every preset: a window [document A, separator,
    # document B] gives B's positions the logits of the window [separator, B] alone (RoPE is
    # relative: equal up to rounding), and with no separator in the window the mask changes nothing.
    for preset in PRESETS:
        c = make_config(preset, **FIXTURE_SHAPE)
        params = perturbed_params(c, init_params(c, FIXTURE_SEED))
        sep = FIXTURE_DOC_SEP
        if c["arch"] != ARCH_ATTENTION:  # no document mask for GSA or FAM: FoxModel refuses one
            try:
                FoxModel(c, params, torch.float64, doc_sep=sep)
                refused = False
            except ValueError:
                refused = True
            yield "document mask: refused with %s, %s" % (fox_arch_name(c["arch"]), preset), refused, ""
            continue
        model = FoxModel(c, params, torch.float64, doc_sep=sep)
        rng = np.random.default_rng(13)
        doc_a, doc_b = (with_separators(rng.integers(0, c["vocab_size"], n), sep, np.zeros(n, bool), None)
                        for n in (23, 18))
        both = torch.from_numpy(np.concatenate([doc_a, [sep], doc_b])[None])
        alone = torch.from_numpy(np.concatenate([[sep], doc_b])[None])
        with torch.no_grad():
            diff = (model(both)[:, len(doc_a):] - model(alone)).abs().max().item()
        yield "document mask: [A, sep, B] = [sep, B] on B, " + preset, diff < 1e-10, "max abs diff %.2e" % diff
        plain = FoxModel(c, params, torch.float64)
        with torch.no_grad():
            same = torch.equal(model(both[:, :len(doc_a)]), plain(both[:, :len(doc_a)]))
        yield "document mask: no separator, logits unchanged exactly, " + preset, same, ""

    # (b) finite differences of the forget-gate bias and KV-shift weights (float64); fox-pro-docmask
    # with separators at 0, 6, 7 and 12.
    for name in ("fox-pro", "fox-dataind", "fox-pro-docmask"):
        c = fixture_config(name)
        sep = fixture_doc_sep(name)
        params = perturbed_params(c, init_params(c, FIXTURE_SEED))
        model = FoxModel(c, params, torch.float64, doc_sep=sep)
        rng = np.random.default_rng(11)
        idx = rng.integers(0, c["vocab_size"], (1, 16))
        if sep is not None:
            idx = with_separators(idx, sep, np.isin(np.arange(16), (0, 6, 7, 12))[None], None)
        idx = torch.from_numpy(idx)
        tgt = torch.from_numpy(rng.integers(0, c["vocab_size"], (1, 16)))
        model.loss(idx, tgt)[0].backward()
        probes = [("fgate_b", (l, 0, h)) for l in range(c["n_layer"]) for h in range(c["n_head"])]
        if c["kv_shift"]:
            rows = attn_in_slices(c)
            shift_rows = list(range(rows["k_shift"].start, rows["v_shift"].stop))
            probes += [("attn_in_w", (int(rng.integers(c["n_layer"])), int(rng.choice(shift_rows)),
                                      int(rng.integers(c["d_model"])))) for _ in range(16)]
        fd, ag = [], []
        eps = 1e-5
        with torch.no_grad():
            for pname, pos in probes:
                t = model.p[pname]
                orig = t[pos].item()
                t[pos] = orig + eps
                up = model.loss(idx, tgt)[0].item()
                t[pos] = orig - eps
                down = model.loss(idx, tgt)[0].item()
                t[pos] = orig
                fd.append((up - down) / (2 * eps))
                ag.append(t.grad[pos].item())
        fd, ag = np.array(fd), np.array(ag)
        err = np.linalg.norm(fd - ag) / np.linalg.norm(ag)
        yield ("finite differences (fgate_b, kv-shift) " + name, err < 1e-6,
               "%d probes, rel err %.2e" % (len(probes), err))

    yield from gsa_checks()
    yield from fam_checks()

    # AdamW against torch.optim.AdamW, 3 steps at varying lr.
    torch.manual_seed(0)
    c = fixture_config("fox-fixed")
    params = perturbed_params(c, init_params(c, FIXTURE_SEED))
    mine = FoxModel(c, params, torch.float64)
    ref = FoxModel(c, params, torch.float64)
    decays = {p["name"]: p["decay"] for p in layout(c)}
    groups = [dict(params=[t for n, t in ref.p.items() if t.requires_grad and decays[n] == d],
                   weight_decay=wd) for d, wd in ((1, 0.1), (0, 0.0))]
    ref_opt = torch.optim.AdamW(groups, lr=1.0, betas=(0.9, 0.95), eps=1e-8)
    opt = AdamW(mine, 0.9, 0.95, 1e-8, 0.1)
    for lr in (1e-2, 5e-3, 2e-3):
        for (n, a), b in zip(mine.p.items(), ref.p.values()):
            if a.requires_grad:
                a.grad = torch.randn_like(a)
                b.grad = a.grad.clone()
        for g in ref_opt.param_groups:
            g["lr"] = lr
        opt.step(lr)
        ref_opt.step()
    err = max((a - b).abs().max().item() for a, b in zip(mine.p.values(), ref.p.values()))
    yield "AdamW vs torch.optim.AdamW", err < 1e-14, "max abs diff %.2e" % err

    # (c) model.bin round trip, bitwise, with and without the optional tensors.
    with tempfile.TemporaryDirectory() as tmp:
        for preset in ("fox-pro", "transformer-llama", "gsa", "fox-fam"):
            c = make_config(preset, **FIXTURE_SHAPE)
            params = init_params(c, 5)
            a, b = Path(tmp, "a.bin"), Path(tmp, "b.bin")
            save_model_bin(a, c, params)
            c2, p2 = load_model_bin(a)
            save_model_bin(b, c2, p2)
            ok = (a.read_bytes() == b.read_bytes() and c2 == c and p2.keys() == params.keys()
                  and all(p2[n].tobytes() == params[n].tobytes() for n in params))
            yield "model.bin round trip " + preset, ok, "%d bytes" % a.stat().st_size
        tensors = [("x", np.arange(6.0).reshape(2, 3)), ("y.z", np.array([math.pi]))]
        write_fixture(Path(tmp, "f.fix"), tensors)
        back = read_fixture(Path(tmp, "f.fix"))
        ok = list(back) == ["x", "y.z"] and all(np.array_equal(back[n], a) for n, a in tensors)
        yield "fixture round trip", ok, ""


def cmd_selfcheck(args):
    passed = failed = 0
    for name, ok, detail in selfcheck_results():
        print("%s %s  %s" % ("PASS" if ok else "FAIL", name, detail))
        passed, failed = passed + ok, failed + (not ok)
    print("%d passed, %d failed" % (passed, failed))
    sys.exit(1 if failed else 0)


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


def main(argv=None):
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
    main()
