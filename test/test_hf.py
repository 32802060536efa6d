#!/usr/bin/env python3
"""test/test_hf.py: train_fox.py export-hf / import-hf, the exchange with the official FoX code.

Checks, for every preset and switch of the reference fixtures (and output gate / norm apart): a fox.c
model.bin exported and imported back is byte for byte the same file; the config.json fields the official
ForgettingTransformerConfig reads; tensor names and shapes; bfloat16 safetensors read exactly; and that a
missing, misshapen or unknown tensor, an unsupported config (grouped-query heads, another activation, a
tied lm_head, a different norm epsilon) and an existing output are refused with one line and exit 1.
Errors of every subcommand, as the C programs report them: bad input (a missing file, a corrupt model.bin or
safetensors file, a bad config.json or token file, an unwritable output) is exactly one stderr line
`error: ...` naming the file, exit 1, and FOX_TRACEBACK=1 shows the traceback instead; a bad command line
is one line `error: ...`, exit 2; a truncated safetensors file is reported as truncated; a corrupted
version-2 model.bin fails its checksum before any header field is believed (a version-1 file, which has
none, still loads); export-hf's directory and files get the modes a plain mkdir and open give (umask).
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
from reference import fixtures, hf as tf_hf  # noqa: E402

passed = failed = 0


def check(ok, what):
    global passed, failed
    print("%s %s" % ("PASS" if ok else "FAIL", what))
    passed, failed = passed + bool(ok), failed + (not ok)


def run(*args, env=None, umask=None):
    """train_fox.py with args (FOX_TRACEBACK unset, then env added; umask: the child's): (exit status, stderr)."""
    full = {k: v for k, v in os.environ.items() if k != "FOX_TRACEBACK"}
    full.update(env or {})
    r = subprocess.run([sys.executable, str(ROOT / "train_fox.py")] + [str(a) for a in args],
                       capture_output=True, text=True, env=full,
                       preexec_fn=None if umask is None else (lambda: os.umask(umask)))
    return r.returncode, r.stderr


def one_error_line(what, status_err, status, *needles):
    """The C programs' contract: stderr is exactly one line, `error: ...` holding every needle (the file, what is
    wrong), and the exit status is `status` (1: bad input, 2: a bad command line)."""
    got, err = status_err
    lines = err.splitlines()
    ok = (got == status and len(lines) == 1 and err.endswith("\n") and lines[0].startswith("error: ")
          and all(str(n) in lines[0] for n in needles))
    check(ok, "%s: one line `error: ...` with %s, exit %d (got exit %d, %d line(s): %s)" % (
        what, ", ".join(repr(str(n)) for n in needles) or "nothing", status, got, len(lines),
        " | ".join(lines[:1] + lines[-1:]) if len(lines) > 1 else err.strip()))


def refused(what, status_err, *needles):
    one_error_line("refused: " + what, status_err, 1, *needles)


# Every fixture's config once (the *-docmask fixtures share their presets' configs: the mask is no weight).
CONFIGS = [(name, tf.make_config(preset, **dict(fixtures.FIXTURE_SHAPE, **over))) for name, preset, over in fixtures.FIXTURES
           if fixtures.fixture_doc_sep(name) is None and fixtures.fixture_config(name)["arch"] == tf.ARCH_ATTENTION]
CONFIGS += [("fox-pro, output gate without output norm", tf.make_config("fox-pro", **dict(fixtures.FIXTURE_SHAPE, output_norm=0))),
            ("fox-pro, output norm without output gate", tf.make_config("fox-pro", **dict(fixtures.FIXTURE_SHAPE, output_gate=0)))]


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


def error_checks(tmp, src, cfg):
    """Every subcommand's errors, as the C programs': one line `error: ...`, exit 1 for bad input, 2 for a bad
    command line. tmp holds a0.bin (CONFIGS[0]) and its export src (a Hugging Face directory, config cfg)."""
    model = tmp / "a0.bin"

    def hf_dir(tag, config=None, safetensors=None, files=None):
        """A copy of src with config.json (a JSON value) or model.safetensors (bytes) replaced, files added."""
        d = tmp / ("err_" + tag)
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg if config is None else config))
        st = (src / "model.safetensors").read_bytes() if safetensors is None else safetensors
        (d / "model.safetensors").write_bytes(st)
        for name, text in (files or {}).items():
            (d / name).write_text(text)
        return d

    def safetensors(header, body=b""):
        text = json.dumps(header).encode()
        return len(text).to_bytes(8, "little") + text + body

    # Bad input: exit 1, one line naming the file. Each printed a traceback, or no file, or exit 2, before.
    one_error_line("export-hf of a missing model.bin", run("export-hf", "/nonexistent/model.bin", tmp / "x"), 1,
                   "/nonexistent/model.bin", "No such file or directory")
    got, err = run("export-hf", "/nonexistent/model.bin", tmp / "x", env={"FOX_TRACEBACK": "1"})
    check(got == 1 and err.startswith("Traceback") and "FileNotFoundError" in err,
          "FOX_TRACEBACK=1: the traceback instead of the one line (exit %d, %d lines)" % (got, len(err.splitlines())))
    (tmp / "zeros.bin").write_bytes(bytes(4096))
    one_error_line("export-hf of a file that is no model.bin", run("export-hf", tmp / "zeros.bin", tmp / "x"), 1,
                   tmp / "zeros.bin", "not a fox.c model")
    (tmp / "short.bin").write_bytes(model.read_bytes()[:100])
    one_error_line("export-hf of a model.bin shorter than its header", run("export-hf", tmp / "short.bin", tmp / "x"),
                   1, tmp / "short.bin")
    one_error_line("init into a missing directory", run("init", "--layers", 1, "--dim", 64, "--heads", 4, "--vocab", 32,
                   "--out", tmp / "nodir" / "m.bin"), 1, tmp / "nodir" / "m.bin", "No such file or directory")
    one_error_line("fixtures under a regular file", run("fixtures", "--only", "fox-pro", "--out", model / "fix"), 1,
                   model)
    (tmp / "tokens.txt.npy").write_text("1 2 3\n")
    one_error_line("loss of a token file that is no .npy", run("loss", "--model-bin", model, "--tokens",
                   tmp / "tokens.txt.npy"), 1, tmp / "tokens.txt.npy")
    np.save(tmp / "big.npy", np.full((1, 5), 1000, np.int64))
    one_error_line("loss of token ids beyond the vocabulary", run("loss", "--model-bin", model, "--tokens",
                   tmp / "big.npy"), 1, tmp / "big.npy", "1000")
    one_error_line("loss of a missing model.bin", run("loss", "--model-bin", tmp / "none.bin", "--tokens", tmp / "big.npy"),
                   1, tmp / "none.bin", "No such file or directory")
    d = hf_dir("cfg_list", config=[1, 2])
    one_error_line("import-hf of a config.json that is no object", run("import-hf", d, tmp / "o.bin"), 1, d / "config.json")
    d = hf_dir("cfg_zero", config=dict(cfg, hidden_size=0))
    one_error_line("import-hf of a config with hidden_size 0", run("import-hf", d, tmp / "o.bin"), 1, d / "config.json")
    d = hf_dir("cfg_str", config=dict(cfg, num_heads="four"))
    one_error_line("import-hf of a config with a string for num_heads", run("import-hf", d, tmp / "o.bin"), 1,
                   d / "config.json", "num_heads")
    d = hf_dir("st_list", safetensors=safetensors([1, 2]))
    one_error_line("import-hf of a safetensors header that is no object", run("import-hf", d, tmp / "o.bin"), 1,
                   d / "model.safetensors")
    d = hf_dir("st_nooffsets", safetensors=safetensors({"lm_head.weight": {"dtype": "F32", "shape": [2]}}, bytes(8)))
    one_error_line("import-hf of a safetensors tensor without data_offsets", run("import-hf", d, tmp / "o.bin"), 1,
                   d / "model.safetensors", "data_offsets")
    d = hf_dir("index", files={"model.safetensors.index.json": "{"})
    one_error_line("import-hf of a broken model.safetensors.index.json", run("import-hf", d, tmp / "o.bin"), 1,
                   d / "model.safetensors.index.json")
    check(not (tmp / "o.bin").exists(), "the refused imports leave no model.bin")

    # A bad command line: exit 2, one line (argparse printed its usage block too before).
    one_error_line("no subcommand", run(), 2, "train_fox.py")
    one_error_line("an unknown subcommand", run("nosuch"), 2, "nosuch")
    one_error_line("export-hf without its arguments", run("export-hf"), 2, "export-hf", "OUT_DIR")
    one_error_line("an unknown flag", run("loss", "--bogus", 1, "--model-bin", model, "--tokens", tmp / "big.npy"), 2,
                   "--bogus")
    one_error_line("a flag's value that is no integer", run("init", "--layers", "two", "--dim", 64, "--heads", 4,
                   "--out", tmp / "u.bin"), 2, "--layers", "two")
    one_error_line("fixtures --only an unknown fixture", run("fixtures", "--only", "nosuch", "--out", tmp / "fx"), 2,
                   "nosuch")
    one_error_line("fixtures --jobs 0", run("fixtures", "--jobs", 0, "--out", tmp / "fx"), 2, "--jobs", "0")
    one_error_line("init --set an unknown config field", run("init", "--layers", 1, "--dim", 64, "--heads", 4,
                   "--set", "nosuch=1", "--out", tmp / "u.bin"), 2, "nosuch")
    one_error_line("init --set without =VALUE", run("init", "--layers", 1, "--dim", 64, "--heads", 4,
                   "--set", "t_max", "--out", tmp / "u.bin"), 2, "t_max")
    one_error_line("init with an invalid model (d_model 63, 4 heads)", run("init", "--layers", 1, "--dim", 63,
                   "--heads", 4, "--out", tmp / "u.bin"), 2, "invalid")
    one_error_line("selfcheck with an argument", run("selfcheck", "extra"), 2, "extra")
    check(not (tmp / "u.bin").exists() and not (tmp / "fx").exists(), "the refused command lines write nothing")

    # Fixtures computed in worker processes are the bytes of those computed in this process, in the same order.
    few = ["fox-pro", "gsa", "transformer-fam", "fox-pro-docmask"]
    for jobs in (1, 2):
        st, err = run("fixtures", "--only", ",".join(few), "--dim", 32, "--heads", 2, "--jobs", jobs,
                      "--out", tmp / ("fx%d" % jobs))
        check(st == 0, "fixtures --jobs %d of %d fixtures: exit %d %s" % (jobs, len(few), st, err.strip()[-200:]))
    same = all((tmp / "fx1" / f).read_bytes() == (tmp / "fx2" / f).read_bytes()
               for f in ["manifest.txt"] + [n + ".fix" for n in few] if (tmp / "fx2" / f).exists())
    check(same and all((tmp / "fx2" / (n + ".fix")).exists() for n in few),
          "fixtures --jobs 2 (worker processes) writes the bytes of --jobs 1, manifest included")

    # A truncated safetensors file is reported as truncated; offsets that do not fit a shape, as that.
    whole = (src / "model.safetensors").read_bytes()
    d = hf_dir("trunc", safetensors=whole[:len(whole) // 2])
    one_error_line("import-hf of a safetensors file cut to half", run("import-hf", d, tmp / "o.bin"), 1,
                   d / "model.safetensors", "is truncated",
                   "up to byte %d, the file has %d bytes" % (len(whole), len(whole) // 2))
    d = hf_dir("misfit", safetensors=safetensors({"lm_head.weight": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}},
                                                   bytes(8)))
    one_error_line("import-hf of offsets that do not fit the shape", run("import-hf", d, tmp / "o.bin"), 1,
                   d / "model.safetensors", "do not fit its shape")

    # export-hf's directory and files: the modes of a plain mkdir and open under the umask (mkdtemp gave 0700).
    out = tmp / "modes"
    got = run("export-hf", model, out, umask=0o002)
    modes = [oct((out / f).stat().st_mode & 0o777) if (out / f).exists() else None
             for f in ("", "config.json", "model.safetensors")]
    check(got[0] == 0 and modes == [oct(0o775), oct(0o664), oct(0o664)],
          "export-hf under umask 002: directory 0775, files 0664 (got %s)" % modes)

    # model.bin: the checksum is verified before any header field other than magic and version is believed.
    data = bytearray(model.read_bytes())
    i_dim = 4 * (3 + [n for _, n, _ in tf.CONFIG_FIELDS].index("d_model"))
    data[i_dim] ^= 1  # d_model 64 -> 65: an invalid config, or a size mismatch, were reported before
    (tmp / "flipped.bin").write_bytes(bytes(data))
    one_error_line("export-hf of a model.bin with a flipped config bit", run("export-hf", tmp / "flipped.bin", tmp / "x"), 1,
                   tmp / "flipped.bin", "fails its checksum", "the file is corrupted, truncated or was edited")
    (tmp / "cut.bin").write_bytes(model.read_bytes()[:-4])
    one_error_line("export-hf of a model.bin one weight short", run("export-hf", tmp / "cut.bin", tmp / "x"), 1,
                   tmp / "cut.bin", "fails its checksum")
    data = bytearray(model.read_bytes())
    data[4:8] = (1).to_bytes(4, "little")  # version 1: no checksum (word 255 unused), so a changed weight loads
    data[4 * tf.FOX["FOX_CKPT_I_CRC"]:4 * tf.FOX["FOX_CKPT_I_CRC"] + 4] = bytes(4)
    data[-1] ^= 1
    (tmp / "v1.bin").write_bytes(bytes(data))
    got = run("export-hf", tmp / "v1.bin", tmp / "v1")
    check(got[0] == 0 and (tmp / "v1" / "model.safetensors").exists(),
          "a version-1 model.bin (no checksum) still exports (exit %d: %s)" % got)
    check(not (tmp / "x").exists(), "the failed exports leave no directory")


def main():
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    rng = np.random.default_rng(7)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for i, (name, c) in enumerate(CONFIGS):
            params = fixtures.perturbed_params(c, tf.init_params(c, 100 + i))
            a, hf, b = tmp / ("a%d.bin" % i), tmp / ("hf%d" % i), tmp / ("b%d.bin" % i)
            tf.save_model_bin(a, c, params)
            st_out, st_in = run("export-hf", a, hf), run("import-hf", hf, b)
            same = b.exists() and a.read_bytes() == b.read_bytes()
            check(st_out[0] == 0 and st_in[0] == 0 and same, "%s: model.bin -> export-hf -> import-hf is byte for byte "
                  "the same file" % name)
            cfg = json.loads((hf / "config.json").read_text())
            want = dict(model_type=tf_hf.HF_MODEL_TYPE, hidden_size=c["d_model"], num_hidden_layers=c["n_layer"],
                        num_heads=c["n_head"], intermediate_size=c["mlp_hidden"], use_rope=bool(c["rope"]),
                        use_k_shift=bool(c["kv_shift"]), use_v_shift=bool(c["kv_shift"]), qk_norm=bool(c["qk_norm"]),
                        qk_norm_share_param_across_head=bool(c["qk_norm_shared"]),
                        use_output_gate=bool(c["output_gate"]), use_output_norm=bool(c["output_norm"]),
                        fgate_type=tf_hf.HF_FGATE_TYPES[c["forget_gate"]], vocab_size=c["vocab_size"])
            bad = [k for k, v in want.items() if cfg.get(k) != v]
            check(not bad, "%s: config.json fields as the official config reads them%s" % (name, " (wrong: %s)" % bad if bad else ""))
            tensors = tf_hf.read_safetensors(hf / "model.safetensors")
            names_ok = set(tensors) == {n for n, _, _, _ in tf_hf.hf_tensor_map(c)}
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
        got = tf_hf.read_safetensors(tmp / "bf16.safetensors")["x"]
        check(np.array_equal(got, (bits.astype(np.uint32) << 16).view(np.float32)), "bfloat16 tensors read exactly")

        # Refusals: one line, exit 2, nothing written.
        c = CONFIGS[0][1]
        src = tmp / "hf0"
        tensors = tf_hf.read_safetensors(src / "model.safetensors")
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
            tf_hf.write_safetensors(d / "model.safetensors", tt)
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
            refused(what, run("import-hf", d, out), needle, d)
            check(not out.exists(), "refused: %s leaves no model.bin" % what)
        (tmp / "exists.bin").write_bytes(b"keep")
        refused("import-hf over an existing file", run("import-hf", src, tmp / "exists.bin"), "already exists",
                tmp / "exists.bin")
        check((tmp / "exists.bin").read_bytes() == b"keep", "the existing file is untouched")
        refused("export-hf into a non-empty directory", run("export-hf", tmp / "a0.bin", src), "already exists", src)
        refused("a directory without config.json", run("import-hf", tmp, tmp / "x.bin"), tmp / "config.json")
        error_checks(tmp, src, cfg)
    if not os.environ.get("FOX_OFFICIAL_SRC"):
        print("SKIP the official model's logits: set FOX_OFFICIAL_SRC to the official repository's src/ (CUDA machine)")
    print("%d passed, %d failed" % (passed, failed))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
