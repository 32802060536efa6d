#!/usr/bin/env python3
"""test/test_hf.py: train_fox.py export-hf / import-hf, the exchange with the official FoX code.

Checks, for every preset and switch of the reference fixtures (and output gate / norm apart): a fox.c
model.bin exported and imported back is byte for byte the same file; the config.json fields the official
ForgettingTransformerConfig reads; tensor names and shapes; bfloat16 safetensors read exactly; and that a
missing, misshapen or unknown tensor, an unsupported config (grouped-query heads, another activation, a
tied lm_head, a different norm epsilon) and an existing output are refused with one line and exit 2.
With FOX_OFFICIAL_SRC=DIR (the official repository's src/, on a CUDA machine with transformers, einops and
triton) it also loads each export with AutoModelForCausalLM.from_pretrained and compares its logits with
the reference's (FoxModel, float64): within 3e-2 of the largest logit, the bf16 tolerance of the GPU parity
tests (the official attention kernel takes only bf16/fp16 operands; a misplaced tensor gives O(1) errors).
Usage: python3 test/test_hf.py   (prints "N passed, M failed")
"""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import train_fox as tf  # noqa: E402

passed = failed = 0


def check(ok, what):
    global passed, failed
    print("%s %s" % ("PASS" if ok else "FAIL", what))
    passed, failed = passed + bool(ok), failed + (not ok)


def run(*args):
    """train_fox.py with args: (exit status, stderr)."""
    r = subprocess.run([sys.executable, str(ROOT / "train_fox.py")] + [str(a) for a in args],
                       capture_output=True, text=True)
    return r.returncode, r.stderr


def refused(what, status_err, needle):
    status, err = status_err
    lines = err.strip().splitlines()
    check(status == 2 and len(lines) == 1 and needle in err, "refused: %s (exit %d: %s)" % (what, status, err.strip()))


# Every fixture's config once (the *-docmask fixtures share their presets' configs: the mask is no weight).
CONFIGS = [(name, tf.make_config(preset, **dict(tf.FIXTURE_SHAPE, **over))) for name, preset, over in tf.FIXTURES
           if tf.fixture_doc_sep(name) is None and tf.fixture_config(name)["arch"] == tf.ARCH_ATTENTION]
CONFIGS += [("fox-pro, output gate without output norm", tf.make_config("fox-pro", **dict(tf.FIXTURE_SHAPE, output_norm=0))),
            ("fox-pro, output norm without output gate", tf.make_config("fox-pro", **dict(tf.FIXTURE_SHAPE, output_gate=0)))]


def official_logits(hf_dir, tokens):
    """Logits of the official model loaded from hf_dir (float32, CUDA), or None without the official code."""
    src = os.environ.get("FOX_OFFICIAL_SRC")
    if not src:
        return None
    import torch
    sys.path.insert(0, src)
    import forgetting_transformer.model.forgetting_transformer  # noqa: F401 (registers the model type)
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), torch_dtype=torch.float32).cuda().eval()
    # transformers 5 builds the model on the meta device and loads only the checkpoint's tensors, so the
    # official RotaryEmbedding's non-persistent inv_freq buffer is left uninitialised (garbage angles, at
    # times NaN; transformers 4, which the official code pins, keeps it): recompute it as its __init__ does
    for m in model.modules():
        if hasattr(m, "inv_freq") and hasattr(m, "_compute_inv_freq"):
            m.inv_freq = m._compute_inv_freq(device="cuda")
            m._seq_len_cached = 0
    # bf16 autocast, as the official code trains (its attention kernel takes only fp16/bf16 q, k, v);
    # use_cache=False: the official KV cache predates transformers 5's Cache interface
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(input_ids=torch.as_tensor(tokens, device="cuda"), use_cache=False)
    return out.logits.double().cpu().numpy()


def main():
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    rng = np.random.default_rng(7)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for i, (name, c) in enumerate(CONFIGS):
            params = tf.perturbed_params(c, tf.init_params(c, 100 + i))
            a, hf, b = tmp / ("a%d.bin" % i), tmp / ("hf%d" % i), tmp / ("b%d.bin" % i)
            tf.save_model_bin(a, c, params)
            st_out, st_in = run("export-hf", a, hf), run("import-hf", hf, b)
            same = b.exists() and a.read_bytes() == b.read_bytes()
            check(st_out[0] == 0 and st_in[0] == 0 and same, "%s: model.bin -> export-hf -> import-hf is byte for byte "
                  "the same file" % name)
            cfg = json.loads((hf / "config.json").read_text())
            want = dict(model_type=tf.HF_MODEL_TYPE, hidden_size=c["d_model"], num_hidden_layers=c["n_layer"],
                        num_heads=c["n_head"], intermediate_size=c["mlp_hidden"], use_rope=bool(c["rope"]),
                        use_k_shift=bool(c["kv_shift"]), use_v_shift=bool(c["kv_shift"]), qk_norm=bool(c["qk_norm"]),
                        qk_norm_share_param_across_head=bool(c["qk_norm_shared"]),
                        use_output_gate=bool(c["output_gate"]), use_output_norm=bool(c["output_norm"]),
                        fgate_type=tf.HF_FGATE_TYPES[c["forget_gate"]], vocab_size=c["vocab_size"])
            bad = [k for k, v in want.items() if cfg.get(k) != v]
            check(not bad, "%s: config.json fields as the official config reads them%s" % (name, " (wrong: %s)" % bad if bad else ""))
            tensors = tf.read_safetensors(hf / "model.safetensors")
            names_ok = set(tensors) == {n for n, _, _, _ in tf.hf_tensor_map(c)}
            k_name = "model.layers.0.attn.k_proj.linear.weight" if c["kv_shift"] else "model.layers.0.attn.k_proj.weight"
            shapes_ok = (tensors[k_name].shape == (c["d_model"], c["d_model"])
                         and tensors["model.layers.0.mlp.gate_proj.weight"].shape == (2 * c["mlp_hidden"], c["d_model"])
                         and np.array_equal(tensors["model.layers.1.mlp.gate_proj.weight"], params["mlp_in_w"][1]))
            check(names_ok and shapes_ok, "%s: %d tensors under the official names and shapes" % (name, len(tensors)))
            tokens = rng.integers(0, c["vocab_size"], (2, 48))
            theirs = official_logits(hf, tokens)
            if theirs is not None:
                ours = tf.FoxModel(c, params, torch.float64)(torch.as_tensor(tokens)).detach().numpy()
                err = np.abs(theirs - ours).max() / np.abs(ours).max()
                check(err < 3e-2, "%s: the official model's logits (bf16 autocast) equal the reference's (rel err "
                      "%.1e, tol 3e-2, the GPU parity tolerance)" % (name, err))

        # bfloat16 tensors (how released checkpoints are often stored) read as their exact float32 values.
        x = np.array([1.0, -2.5, 3.140625, 1e-3], np.float32)
        bits = (x.view(np.uint32) >> 16).astype("<u2")
        hdr = json.dumps({"x": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]}}).encode()
        hdr += b" " * (-len(hdr) % 8)
        (tmp / "bf16.safetensors").write_bytes(len(hdr).to_bytes(8, "little") + hdr + bits.tobytes())
        got = tf.read_safetensors(tmp / "bf16.safetensors")["x"]
        check(np.array_equal(got, (bits.astype(np.uint32) << 16).view(np.float32)), "bfloat16 tensors read exactly")

        # Refusals: one line, exit 2, nothing written.
        c = CONFIGS[0][1]
        src = tmp / "hf0"
        tensors = tf.read_safetensors(src / "model.safetensors")
        cfg = json.loads((src / "config.json").read_text())

        def variant(tag, edit_cfg=None, edit_tensors=None):
            d = tmp / ("bad_" + tag)
            d.mkdir()
            cc, tt = dict(cfg), dict(tensors)
            if edit_cfg:
                edit_cfg(cc)
            if edit_tensors:
                edit_tensors(tt)
            (d / "config.json").write_text(json.dumps(cc))
            tf.write_safetensors(d / "model.safetensors", tt)
            return d

        def drop(t):
            del t["model.layers.1.attn.fgate_proj.bias"]

        def reshape(t):
            t["model.layers.0.attn.o_proj.weight"] = t["model.layers.0.attn.o_proj.weight"][:, :-1].copy()

        def extra(t):
            t["model.layers.0.attn.k_proj.linear.bias"] = np.zeros(c["d_model"], np.float32)

        cases = [("a missing tensor", variant("missing", edit_tensors=drop), "fgate_proj.bias is missing"),
                 ("a misshapen tensor", variant("shape", edit_tensors=reshape), "o_proj.weight has shape"),
                 ("an unknown tensor", variant("extra", edit_tensors=extra), "no place for"),
                 ("num_kv_heads != num_heads", variant("gqa", lambda x: x.update(num_kv_heads=1)), "num_kv_heads"),
                 ("another MLP activation", variant("act", lambda x: x.update(hidden_act="sigmoid")), "hidden_act"),
                 ("a tied lm_head", variant("tied", lambda x: x.update(tie_word_embeddings=True)), "tie_word_embeddings"),
                 ("another norm epsilon", variant("eps", lambda x: x.update(norm_eps=1e-5)), "norm_eps"),
                 ("another model type", variant("type", lambda x: x.update(model_type="llama")), "model_type")]
        for what, d, needle in cases:
            out = tmp / ("out_" + d.name + ".bin")
            refused(what, run("import-hf", d, out), needle)
            check(not out.exists(), "refused: %s leaves no model.bin" % what)
        (tmp / "exists.bin").write_bytes(b"keep")
        refused("import-hf over an existing file", run("import-hf", src, tmp / "exists.bin"), "already exists")
        check((tmp / "exists.bin").read_bytes() == b"keep", "the existing file is untouched")
        refused("export-hf into a non-empty directory", run("export-hf", tmp / "a0.bin", src), "already exists")
        refused("a directory without config.json", run("import-hf", tmp, tmp / "x.bin"), "config.json")
        (tmp / "trunc").mkdir()
        (tmp / "trunc" / "config.json").write_text(json.dumps(cfg))
        (tmp / "trunc" / "model.safetensors").write_bytes((src / "model.safetensors").read_bytes()[:-100])
        refused("a truncated safetensors file", run("import-hf", tmp / "trunc", tmp / "y.bin"), "data offsets")
    if not os.environ.get("FOX_OFFICIAL_SRC"):
        print("SKIP the official model's logits: set FOX_OFFICIAL_SRC to the official repository's src/ (CUDA machine)")
    print("%d passed, %d failed" % (passed, failed))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
