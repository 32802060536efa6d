"""reference/hf.py: the exchange with the official FoX code (`train_fox.py export-hf` / `import-hf`).

A Hugging Face directory, config.json and model.safetensors, that the official code's AutoModelForCausalLM
(zhixuan-lin/forgetting-transformer) loads, and back. Tensor by tensor the weights are the same numbers; only
names and stacking differ (docs/model.md §5.4).
"""
import json
import math
import os
import struct
import tempfile
from pathlib import Path

import numpy as np

from train_fox import (ARCH_ATTENTION, ARCH_GSA, FG_DATA_DEPENDENT, FG_DATA_INDEPENDENT, FG_FIXED, FG_NONE, FOX,
                       _atomic_write, _f32, _naming, _umask, attn_in_slices, config_invalid, layout, load_model_bin,
                       make_config, save_model_bin)

HF_MODEL_TYPE = "forgetting_transformer-project_fox"
HF_FGATE_TYPES = {FG_DATA_DEPENDENT: "full", FG_DATA_INDEPENDENT: "bias_only", FG_FIXED: "fixed", FG_NONE: "none"}
_SAFETENSORS_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64}


def hf_config(cfg):
    """The official config.json of a fox.c config."""
    fg = cfg["forget_gate"]
    timescales = fg in (FG_DATA_INDEPENDENT, FG_FIXED)
    return {
        "architectures": ["ForgettingTransformerForCausalLM"],
        "model_type": HF_MODEL_TYPE,
        "vocab_size": cfg["vocab_size"],
        "hidden_size": cfg["d_model"],
        "num_hidden_layers": cfg["n_layer"],
        "num_heads": cfg["n_head"],
        "num_kv_heads": None,  # as many key/value heads as heads (the official code refuses any number)
        "intermediate_size": cfg["mlp_hidden"],
        "hidden_act": "swish",
        "norm_eps": float(np.float32(FOX["FOX_NORM_EPS"])),
        "use_rope": bool(cfg["rope"]),
        "rope_base": cfg["rope_theta"],
        "use_k_shift": bool(cfg["kv_shift"]),
        "use_v_shift": bool(cfg["kv_shift"]),
        "qk_norm": bool(cfg["qk_norm"]),
        "qk_norm_share_param_across_head": bool(cfg["qk_norm_shared"]),
        "use_output_gate": bool(cfg["output_gate"]),
        "ogate_act": "sigmoid",
        "use_output_norm": bool(cfg["output_norm"]),
        "fgate_type": HF_FGATE_TYPES[fg],
        "fgate_bias_init": timescales,
        "decay_time_min": cfg["t_min"] if timescales else None,
        "decay_time_max": cfg["t_max"] if timescales else None,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "elementwise_affine": True,
        "window_size": None,
        "bos_token_id": FOX["FOX_EOT"] if cfg["vocab_size"] == FOX["FOX_VOCAB_GPT2"] else None,
        "eos_token_id": FOX["FOX_EOT"] if cfg["vocab_size"] == FOX["FOX_VOCAB_GPT2"] else None,
        "torch_dtype": "float32",
    }


def _hf_kv_name(cfg, l, which):
    """The official name of layer l's k or v projection matrix (a ShiftLinear under KV-shift)."""
    return "model.layers.%d.attn.%s_proj.%s" % (l, which, "linear.weight" if cfg["kv_shift"] else "weight")


def hf_tensor_map(cfg):
    """[(official name, fox.c tensor, layer or None, row slice or None)]: where each official tensor's
    rows sit in the fox.c layout."""
    rows, fg = attn_in_slices(cfg), cfg["forget_gate"]
    out = [("model.embeddings.weight", "wte", None, None)]
    for l in range(cfg["n_layer"]):
        a = "model.layers.%d.attn." % l
        out += [("model.layers.%d.attn_norm.weight" % l, "ln1_w", l, None),
                (a + "q_proj.weight", "attn_in_w", l, rows["q"]),
                (_hf_kv_name(cfg, l, "k"), "attn_in_w", l, rows["k"]),
                (_hf_kv_name(cfg, l, "v"), "attn_in_w", l, rows["v"])]
        if cfg["kv_shift"]:
            out += [(a + "k_proj.shift_proj.weight", "attn_in_w", l, rows["k_shift"]),
                    (a + "v_proj.shift_proj.weight", "attn_in_w", l, rows["v_shift"])]
        if fg == FG_DATA_DEPENDENT:
            out += [(a + "fgate_proj.weight", "attn_in_w", l, rows["fgate"]),
                    (a + "fgate_proj.bias", "fgate_b", l, None)]
        elif fg != FG_NONE:
            out.append((a + "fgate_bias", "fgate_b", l, None))
        if cfg["qk_norm"]:
            out += [(a + "q_norm.weight", "qnorm_w", l, None), (a + "k_norm.weight", "knorm_w", l, None)]
        if cfg["output_norm"]:
            out.append((a + "output_norm.weight", "onorm_w", l, None))
        if cfg["output_gate"]:
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


def hf_tensors(cfg, params):
    """{official name: float32 array} of fox.c weights."""
    return {hf: np.ascontiguousarray(_hf_view(params, name, layer, rows), np.float32)
            for hf, name, layer, rows in hf_tensor_map(cfg)}


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
        cfg = make_config("fox-pro", vocab_size=hf.get("vocab_size", 32000), n_layer=hf.get("num_hidden_layers", 24),
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
        cfg["t_min"], cfg["t_max"] = _f32(hf["decay_time_min"]), _f32(hf["decay_time_max"])
    problem = config_invalid(cfg)
    need(problem is None, "its config is not a valid fox.c model: %s" % problem)
    return cfg


def params_from_hf(cfg, tensors, where):
    """fox.c weights from official tensors; ValueError on a missing, misshapen or unknown tensor."""
    params = {p["name"]: np.zeros(p["shape"], np.float32) for p in layout(cfg)}
    expected = hf_tensor_map(cfg)
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
    cfg = config_from_hf(_read_json(d / "config.json"), d / "config.json")
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
    params = params_from_hf(cfg, tensors, d)
    _fresh_output(args.model_bin)
    save_model_bin(args.model_bin, cfg, params)
    print("wrote %s: %d layers, d_model %d, %d heads, forget gate %s" %
          (args.model_bin, cfg["n_layer"], cfg["d_model"], cfg["n_head"], HF_FGATE_TYPES[cfg["forget_gate"]]))
