#!/usr/bin/env python3
"""Generation with a KV cache on one GPU: fox.c's decode beside a PyTorch decode of the same model.bin.

For each model size (fox-pro 125M: 12 layers, d 768, 12 heads; 760M: 24, 1536, 24; vocabulary 50257), each
context (the prompt's length in tokens, then --new tokens more) and each batch (sequences decoded together):

1. fox.c: `./train_fox --init MODEL_BIN --generate N --prompt-file PROMPT --samples B --top-k 1
   --stop-at-eot off [--acp 1]`, parsing the timings line it prints to stderr (prefill and decode tokens/s,
   and with --acp 1 the fraction of the cached keys read).
2. PyTorch, plain eager (the baseline): the same weights in bf16 on the GPU, norms, gates, c and softmax in
   fp32; the prompt prefilled in chunks of --chunk queries against the cache so far (no T x T matrix), then
   greedy decode one token per step against a preallocated cache per layer (K and V after KV-shift, QK-norm
   and RoPE, c = Σ log f, and the KV-shift state). Also the same decode step captured in a CUDA graph
   (static shapes: it attends over the whole preallocated cache with a mask beyond the current position).
3. The HBM bound of decode: a step reads the bf16 GEMM weights once and the KV cache (K, V bf16 and c fp32)
   at the mean context of the decode steps; bound tokens/s = B / (bytes / bandwidth).

    python3 scripts/bench_decode.py [--sizes 125M,760M] [--contexts 2048,16384] [--batches 1,16] [--new 128]
                                    [--out FILE.md]
    python3 scripts/bench_decode.py --check      # the PyTorch decoder against train_fox.FoxModel (float64, CPU)
    python3 scripts/bench_decode.py --selftest   # the parser of fox.c's timings line (needs no torch)

The weights are reference-initialised (train_fox.py init, seed 1337), written once to build/bench_decode/.
The prompt is a window of data/train.bin (starting at a document) decoded to text with
data/gpt2_tokenizer.bin; fox.c encodes that text itself and puts <|endoftext|> first, PyTorch takes the
window's token ids after <|endoftext|>, and the two prompt lengths are printed (they may differ by a few
tokens where the text does not re-encode to exactly the window).
Runs on PyTorch 1.13 (CPU, /usr/bin/python3, for --check) and 2.x.
"""

import argparse
import math
import os
import re
import struct
import subprocess
import sys
import time
from pathlib import Path

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError:  # --selftest needs neither
    np = torch = F = None

ROOT = Path(__file__).resolve().parent.parent
SIZES = {"125M": (12, 768, 12), "360M": (24, 1024, 16), "760M": (24, 1536, 24)}  # layers, d_model, heads
PRESET = "fox-pro"
INIT_SEED = 1337  # train_fox.py init's default
# Bandwidth of devices that torch does not describe (bytes/s, the vendors' data sheets).
BANDWIDTH_BY_NAME = [("H100 PCIe", 2.0e12), ("H100 NVL", 3.9e12), ("H100", 3.35e12), ("H200", 4.8e12),
                     ("A100-SXM4-80GB", 2.039e12), ("A100", 1.555e12)]
GEMM_WEIGHTS = ("attn_in_w", "attn_out_w", "mlp_in_w", "mlp_out_w", "lm_head_w")


def reference():
    """train_fox.py, the float64 reference (imported on first use: it needs torch)."""
    if torch is None:
        sys.exit("bench_decode.py: error: this mode needs PyTorch and numpy (e.g. /usr/bin/python3)")
    sys.path.insert(0, str(ROOT))
    import train_fox
    return train_fox


# ----------------------------------------------------------------------------------------------
# fox.c's timings line

_NUM = r"([0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|inf|nan)"
TIMINGS_RE = re.compile(
    r"prefill: (\d+) x (\d+) tokens in %s s \(%s tokens/s\) \| decode: (\d+) steps x (\d+) sequences in %s s "
    r"\(%s steps/s, %s tokens/s\)(?:, ACP read %s%% of the cached keys)?" % ((_NUM,) * 6))


def parse_timings(stderr):
    """The last timings line of fox.c's --generate in stderr as a dict (batch, prompt_tokens, prefill_s,
    prefill_tok_s, steps, decode_s, decode_steps_s, decode_tok_s, acp_read (a fraction, or None)), or None."""
    found = None
    for line in stderr.splitlines():
        m = TIMINGS_RE.search(line)
        if m:
            found = m
    if found is None:
        return None
    g = found.groups()
    return dict(batch=int(g[0]), prompt_tokens=int(g[1]), prefill_s=float(g[2]), prefill_tok_s=float(g[3]),
                steps=int(g[4]), decode_batch=int(g[5]), decode_s=float(g[6]), decode_steps_s=float(g[7]),
                decode_tok_s=float(g[8]), acp_read=None if g[9] is None else float(g[9]) / 100.0)


def selftest():
    """The parser on the lines fox/run.h prints, with and without ACP, amid other output."""
    plain = ("prefill: 16 x 2048 tokens in 0.412 s (79534 tokens/s) | decode: 127 steps x 16 sequences in "
             "1.905 s (66.7 steps/s, 1067 tokens/s)")
    acp = ("prefill: 1 x 16384 tokens in 1.250 s (13107 tokens/s) | decode: 127 steps x 1 sequences in 0.801 s "
           "(158.6 steps/s, 159 tokens/s), ACP read 3.7% of the cached keys")
    cases = [
        ("plain line", "generating from m.bin (125000000 parameters)\n" + plain + "\n",
         dict(batch=16, prompt_tokens=2048, prefill_tok_s=79534.0, steps=127, decode_tok_s=1067.0, acp_read=None)),
        ("with ACP", acp, dict(batch=1, prompt_tokens=16384, prefill_s=1.25, decode_steps_s=158.6,
                               decode_tok_s=159.0, acp_read=0.037)),
        ("the last of two lines", plain + "\nwarning: x\n" + acp + "\n", dict(prompt_tokens=16384, acp_read=0.037)),
        ("no timings line", "error: the KV cache of 16 sequences x 16512 positions needs 49.2 GiB\n", None),
        ("ACP read 100%", plain + ", ACP read 100.0% of the cached keys", dict(acp_read=1.0)),
    ]
    passed = failed = 0
    for name, text, want in cases:
        got = parse_timings(text)
        if want is None:
            ok = got is None
        else:
            ok = got is not None and all(abs(got[k] - v) <= 1e-9 * max(1.0, abs(v)) if isinstance(v, float)
                                         else got[k] == v for k, v in want.items())
        print("%s parse: %s  %s" % ("PASS" if ok else "FAIL", name, got))
        passed, failed = passed + ok, failed + (not ok)
    print("%d passed, %d failed" % (passed, failed))
    return failed == 0


# ----------------------------------------------------------------------------------------------
# The prompt: a window of data/train.bin as text


def _define(header, name):
    """An integer `#define NAME value` of a repository header (the one definition of a file format)."""
    return int(re.search(r"^#define %s (\d+)" % name, (ROOT / header).read_text(), re.M).group(1))


def read_shard(path):
    """The tokens of an llm.c .bin shard (dataloader.h: 256 int32 header, magic, version, count; uint16 or
    uint32 tokens)."""
    data = Path(path).read_bytes()
    n_header = _define("dataloader.h", "FOX_SHARD_HEADER_INTS")
    magic, _, count = struct.unpack_from("<3i", data, 0)
    kinds = {_define("dataloader.h", "FOX_SHARD_MAGIC"): np.uint16, _define("dataloader.h", "FOX_SHARD_MAGIC_U32"): np.uint32}
    if magic not in kinds:
        raise ValueError("%s: not an llm.c token shard (magic %d)" % (path, magic))
    return np.frombuffer(data, kinds[magic], count, 4 * n_header)


def read_gpt2_vocab(path):
    """The byte string of every token of data/gpt2_tokenizer.bin (tokenizer.h, tokenizer_load: int32 magic,
    version, n_vocab, eot, three range counts; then per token a uint16 length and its bytes) and eot."""
    data = Path(path).read_bytes()
    magic, version, n_vocab, eot = struct.unpack_from("<4i", data, 0)
    if magic != _define("tokenizer.h", "FOX_TOKENIZER_MAGIC") or version != _define("tokenizer.h", "FOX_TOKENIZER_VERSION"):
        raise ValueError("%s: not a fox.c tokenizer file" % path)
    vocab, off = [], 28
    for _ in range(n_vocab):
        (n,) = struct.unpack_from("<H", data, off)
        vocab.append(data[off + 2:off + 2 + n])
        off += 2 + n
    return vocab, eot


def prompt_window(tokens, vocab, eot, length):
    """`length` token ids, <|endoftext|> then a window of the corpus that starts a document and decodes to
    valid UTF-8 (fox.c refuses anything else), and that window's text."""
    starts = np.nonzero(tokens == eot)[0] + 1
    for s in starts:
        window = tokens[s:s + length - 1]
        if len(window) < length - 1:
            break
        try:
            text = b"".join(vocab[t] for t in window).decode("utf-8")
        except UnicodeDecodeError:  # a character split across the window's edge
            continue
        return [eot] + [int(t) for t in window], text
    raise ValueError("the corpus has no window of %d tokens after an <|endoftext|> that decodes to UTF-8 text" % length)


def make_prompt(workdir, length):
    """(token ids, path of the text file) of a `length`-token prompt, written once into workdir."""
    vocab, eot = read_gpt2_vocab(ROOT / "data" / "gpt2_tokenizer.bin")
    ids, text = prompt_window(read_shard(ROOT / "data" / "train.bin"), vocab, eot, length)
    path = workdir / ("prompt_%d.txt" % length)
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")
    return ids, path


# ----------------------------------------------------------------------------------------------
# The PyTorch decoder


class DecoderWeights:
    """A model's tensors on one device: the GEMM matrices and the embedding in `store` dtype (bf16 for the
    benchmark), the norm weights and gate biases in `compute` dtype (fp32; float64 for the check)."""

    def __init__(self, cfg, params, device, compute=None, store=None):
        tf = reference()
        self.cfg, self.device = cfg, device
        self.cdt = compute or torch.float32
        self.sdt = store or torch.bfloat16
        self.L, self.D, self.H, self.Dh = cfg["n_layer"], cfg["d_model"], cfg["n_head"], tf.head_dim(cfg)
        self.rows = tf.attn_in_slices(cfg)
        self.norm_eps, self.qk_eps = tf.FOX["FOX_NORM_EPS"], tf.FOX["FOX_QK_NORM_EPS"]
        self.fg = cfg["forget_gate"]
        self.FG_NONE, self.FG_DATA_DEPENDENT = tf.FG_NONE, tf.FG_DATA_DEPENDENT
        matrices = set(GEMM_WEIGHTS) | {"wte"}
        self.p = {name: torch.as_tensor(np.asarray(a)).to(device=device, dtype=self.sdt if name in matrices else self.cdt)
                  for name, a in params.items()}


class KVCacheDecoder:
    """Prefill and greedy decode of `batch` sequences of up to max_len positions with a KV cache.

    Per layer: k, v (B, H, max_len, Dh) as attention takes them (after KV-shift, QK-norm, RoPE) in the store
    dtype; c (B, H, max_len) = Σ log f and its newest value c_last (B, H), in the compute dtype; the KV-shift
    state k_prev, v_prev (B, 1, H, Dh): the newest token's unshifted key and value.
    Two ways to run a decode step (`greedy_step`): dynamic (attend over the cache's first `length` positions,
    a Python int) and static (the position is the device tensor `pos`, every tensor has the same shape at
    every step and attention covers all max_len positions with a mask: what a CUDA graph can capture)."""

    def __init__(self, w, batch, max_len, attn_block_elems=1 << 27):
        self.w, self.B, self.max_len, self.attn_block_elems = w, batch, max_len, attn_block_elems
        B, H, Dh, dev = batch, w.H, w.Dh, w.device
        cfg = w.cfg

        def zeros(*shape, dtype=w.cdt):
            return torch.zeros(shape, dtype=dtype, device=dev)

        self.layers = []
        for _ in range(w.L):
            st = dict(k=zeros(B, H, max_len, Dh, dtype=w.sdt), v=zeros(B, H, max_len, Dh, dtype=w.sdt))
            if w.fg != w.FG_NONE:
                st.update(c=zeros(B, H, max_len), c_last=zeros(B, H))
            if cfg["kv_shift"]:
                st.update(k_prev=zeros(B, 1, H, Dh), v_prev=zeros(B, 1, H, Dh))
            self.layers.append(st)
        self.positions = torch.arange(max_len, device=dev)
        if cfg["rope"]:  # angle t * theta^(-2i/Dh) in double, as the reference, for every position
            inv_freq = cfg["rope_theta"] ** (-torch.arange(0, Dh, 2, dtype=torch.float64) / Dh)
            ang = torch.arange(max_len, dtype=torch.float64)[:, None] * inv_freq[None, :]
            ang = torch.cat([ang, ang], dim=-1)
            self.cos, self.sin = ang.cos().to(dev, w.cdt), ang.sin().to(dev, w.cdt)
        self.length = 0                                  # positions cached (dynamic steps)
        self.pos = zeros(1, dtype=torch.long)            # the next position (static steps)
        self.tok = zeros(B, 1, dtype=torch.long)         # the next token to feed (greedy steps)
        self.gen = zeros(B, max_len + 1, dtype=torch.long)  # gen[:, t]: the greedy token at position t

    # -- the model, on T new tokens at `positions` against the cache's first n_keys positions --

    def _mm(self, x, weight):
        """x @ weight^T with the operands in the store dtype, the result back in the compute dtype."""
        return F.linear(x.to(self.w.sdt), weight).to(self.w.cdt)

    def _norm(self, x, weight, eps):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    def forward(self, idx, positions, n_keys, causal_mask, logits):
        """idx (B, T) at positions (T,) (a device tensor); appends to the cache, returns logits (B, T', V) of
        the last position (logits "last"), of all (logits "all"), or None ("none")."""
        w = self.w
        x = w.p["wte"][idx].to(w.cdt)
        for l in range(w.L):
            x = x + self._attention(l, self._norm(x, w.p["ln1_w"][l, 0], w.norm_eps), positions, n_keys, causal_mask)
            x = x + self._mlp(l, self._norm(x, w.p["ln2_w"][l, 0], w.norm_eps))
        if logits == "none":
            return None
        if logits == "last":
            x = x[:, -1:]
        return self._mm(self._norm(x, w.p["lnf_w"][0], w.norm_eps), w.p["lm_head_w"])

    def _mlp(self, l, xn):
        gate, up = self._mm(xn, self.w.p["mlp_in_w"][l]).chunk(2, dim=-1)
        return self._mm(F.silu(gate) * up, self.w.p["mlp_out_w"][l])

    @staticmethod
    def _shift(x, alpha, prev):
        """KV-shift alpha_t x_{t-1} + (1 - alpha_t) x_t of the chunk x (B, T, H, Dh), x_{-1} from the state
        prev (the unshifted row before the chunk), which moves on to the chunk's last unshifted row."""
        before = torch.cat([prev, x[:, :-1]], dim=1)
        prev.copy_(x[:, -1:])
        a = alpha.unsqueeze(-1)
        return a * before + (1 - a) * x

    def _attention(self, l, xn, positions, n_keys, causal_mask):
        w, st = self.w, self.layers[l]
        B, T, _ = xn.shape
        H, Dh, rows, cfg = w.H, w.Dh, w.rows, w.cfg
        proj = self._mm(xn, w.p["attn_in_w"][l])
        q, k, v = (proj[..., rows[n]].reshape(B, T, H, Dh) for n in ("q", "k", "v"))
        if cfg["kv_shift"]:
            k = self._shift(k, torch.sigmoid(proj[..., rows["k_shift"]]), st["k_prev"])
            v = self._shift(v, torch.sigmoid(proj[..., rows["v_shift"]]), st["v_prev"])
        if cfg["qk_norm"]:
            shape = (1, Dh) if cfg["qk_norm_shared"] else (H, Dh)
            q = self._norm(q, w.p["qnorm_w"][l].reshape(shape), w.qk_eps)
            k = self._norm(k, w.p["knorm_w"][l].reshape(shape), w.qk_eps)
        if cfg["rope"]:
            cos, sin = self.cos[positions][:, None, :], self.sin[positions][:, None, :]
            q, k = (x * cos + torch.cat([-x[..., Dh // 2:], x[..., :Dh // 2]], dim=-1) * sin for x in (q, k))
        st["k"].index_copy_(2, positions, k.transpose(1, 2).to(w.sdt))
        st["v"].index_copy_(2, positions, v.transpose(1, 2).to(w.sdt))
        c_q = None
        if w.fg != w.FG_NONE:
            if w.fg == w.FG_DATA_DEPENDENT:
                log_f = F.logsigmoid(proj[..., rows["fgate"]] + w.p["fgate_b"][l, 0])
            else:
                log_f = F.logsigmoid(w.p["fgate_b"][l, 0]).expand(B, T, H)
            # the scan continues from c_last in one sequential cumsum, as the full forward sums it
            c_q = torch.cumsum(torch.cat([st["c_last"][:, None], log_f], dim=1), dim=1)[:, 1:].transpose(1, 2)
            st["c_last"].copy_(c_q[..., -1])
            st["c"].index_copy_(2, positions, c_q)
        o = self._attend(q.transpose(1, 2), st, c_q, positions, n_keys, causal_mask).transpose(1, 2)
        if cfg["output_norm"]:
            o = self._norm(o, w.p["onorm_w"][l].reshape(H, Dh), w.norm_eps)
        o = o.reshape(B, T, w.D)
        if cfg["output_gate"]:
            o = o * torch.sigmoid(proj[..., rows["gate"]])
        return self._mm(o, w.p["attn_out_w"][l])

    def _attend(self, q, st, c_q, positions, n_keys, causal_mask):
        """softmax_j(q_i.k_j / sqrt(Dh) + c_i - c_j) v_j over the cached keys j < n_keys (j <= the query's
        position when causal_mask), for blocks of queries small enough that a block's scores stay under
        attn_block_elems elements. q (B, H, T, Dh); returns (B, H, T, Dh) in the compute dtype."""
        w = self.w
        B, H, T, Dh = q.shape
        keys, values = st["k"][:, :, :n_keys], st["v"][:, :, :n_keys]
        c_k = None if c_q is None else st["c"][:, :, :n_keys]
        block = max(1, min(T, self.attn_block_elems // (B * H * n_keys)))
        out = []
        for s in range(0, T, block):
            e = min(T, s + block)
            scores = (q[:, :, s:e].to(w.sdt) @ keys.transpose(-1, -2)).to(w.cdt) / math.sqrt(Dh)
            if c_q is not None:
                scores = scores + (c_q[..., s:e, None] - c_k[..., None, :])
            if causal_mask:
                future = self.positions[:n_keys][None, :] > positions[s:e, None]
                scores = scores.masked_fill(future, float("-inf"))
            probs = torch.softmax(scores, dim=-1)
            out.append((probs.to(w.sdt) @ values).to(w.cdt))
        return out[0] if len(out) == 1 else torch.cat(out, dim=2)

    # -- prefill and decode steps --

    def prefill(self, idx, chunk=1024, all_logits=False):
        """Empties the cache and runs the prompts idx (B, P) through it, `chunk` queries at a time; returns the
        logits of the last position (B, 1, V), or of every position (B, P, V) with all_logits."""
        self.reset()
        P, outs = idx.shape[1], []
        for s in range(0, P, chunk):
            e = min(P, s + chunk)
            want = "all" if all_logits else ("last" if e == P else "none")
            out = self.forward(idx[:, s:e], self.positions[s:e], e, e - s > 1, want)
            if out is not None:
                outs.append(out)
        self.length = P
        self.pos.fill_(P)
        return torch.cat(outs, dim=1)

    def step(self, tok, static=False):
        """One decode step on tokens tok (B, 1) at the next position; returns its logits (B, V)."""
        if static:
            self.tok.copy_(tok)
            logits = self.forward(self.tok, self.pos, self.max_len, True, "last")
            self.pos.add_(1)
        else:
            logits = self.forward(tok, self.positions[self.length:self.length + 1], self.length + 1, False, "last")
        self.length += 1  # the host's count (a static step's position lives on the device)
        return logits[:, -1]

    def greedy_step(self, static=False):
        """Feeds self.tok at the next position and puts the argmax into self.tok and gen, all on the device
        (no host synchronisation, so a CUDA graph can capture it)."""
        if static:
            pos = self.pos
            logits = self.forward(self.tok, pos, self.max_len, True, "last")
        else:
            pos = self.positions[self.length:self.length + 1]
            logits = self.forward(self.tok, pos, self.length + 1, False, "last")
        self.tok.copy_(logits[:, -1].argmax(-1, keepdim=True))
        self.gen.index_copy_(1, pos + 1, self.tok)
        if static:
            self.pos.add_(1)
        self.length += 1

    def start_greedy(self, prefill_logits):
        """The first new token: the argmax of the prefill's last logits."""
        self.tok.copy_(prefill_logits[:, -1].argmax(-1, keepdim=True))
        self.gen[:, self.length] = self.tok[:, 0]

    def reset(self):
        for st in self.layers:
            for name in ("c_last", "k_prev", "v_prev"):
                if name in st:
                    st[name].zero_()
        self.length = 0
        self.pos.zero_()

    def state(self):
        """A copy of what a decode step changes besides the cache rows past the current position."""
        small = [{n: st[n].clone() for n in ("c_last", "k_prev", "v_prev") if n in st} for st in self.layers]
        return small, self.length, self.tok.clone()

    def restore(self, saved):
        small, length, tok = saved
        for st, s in zip(self.layers, small):
            for n, t in s.items():
                st[n].copy_(t)
        self.length = length
        self.pos.fill_(length)
        self.tok.copy_(tok)


# ----------------------------------------------------------------------------------------------
# --check: the decoder against train_fox.FoxModel's full forward, float64 on the CPU

CHECK_SHAPE = dict(vocab_size=128, n_layer=2, d_model=64, n_head=2)


def check_params(tf, cfg):
    """Reference init made to exercise every term: the fixtures' perturbation (norm weights, gate biases),
    then every normal-initialised matrix x 8 (std 0.16: scores, gates and shift weights of order 1)."""
    from reference.fixtures import perturbed_params  # beside train_fox, which reference() put on the path
    params = perturbed_params(cfg, tf.init_params(cfg, 1234))
    for p in tf.layout(cfg):
        if p["init"] == "N":
            params[p["name"]] = params[p["name"]] * 8.0
    return params


def check_case(tf, name, preset, overrides, T=24, P=11, chunk=4, block_elems=12):
    """Yields (name, ok, detail): prefill of P tokens in chunks (attention in blocks of queries) and decode of
    the rest, dynamic and static, both batch rows, against the full forward; and the bf16/fp32 decoder."""
    cfg = tf.make_config(preset, **dict(CHECK_SHAPE, **overrides))
    params = check_params(tf, cfg)
    idx = torch.from_numpy(np.random.default_rng(5).integers(0, cfg["vocab_size"], (2, T)))
    with torch.no_grad():
        ref = tf.FoxModel(cfg, params, torch.float64)(idx)
    for label, dtypes, tol in (("float64", (torch.float64, torch.float64), 1e-9),
                               ("bf16 weights and cache, fp32 math", (torch.float32, torch.bfloat16), 5e-2)):
        weights = DecoderWeights(cfg, params, "cpu", *dtypes)
        for static in (False, True):
            if static and label != "float64":
                continue
            dec = KVCacheDecoder(weights, 2, T, attn_block_elems=block_elems)
            with torch.no_grad():
                got = [dec.prefill(idx[:, :P], chunk=chunk, all_logits=True)]
                got += [dec.step(idx[:, t:t + 1], static)[:, None] for t in range(P, T)]
            got = torch.cat(got, dim=1).double()
            err = ((got - ref).abs().max() / ref.abs().max()).item()
            mode = "static (graph) steps" if static else "dynamic steps"
            yield ("%s, %s: prefill %d (chunks of %d) + %d %s vs FoxModel" % (name, label, P, chunk, T - P, mode),
                   math.isfinite(err) and err <= tol, "max|diff|/max|ref| %.2e (tol %.0e)" % (err, tol))


def check():
    tf = reference()
    cases = [("fox-pro", "fox-pro", {}), ("fox-llama", "fox-llama", {}), ("transformer-pro", "transformer-pro", {}),
             ("transformer-llama", "transformer-llama", {}), ("fox-pro qk-norm shared", "fox-pro", dict(qk_norm_shared=1)),
             ("fox-pro data-independent gate", "fox-pro", dict(forget_gate=tf.FG_DATA_INDEPENDENT))]
    passed = failed = 0
    for name, preset, overrides in cases:
        for what, ok, detail in check_case(tf, name, preset, overrides):
            print("%s %s  %s" % ("PASS" if ok else "FAIL", what, detail))
            passed, failed = passed + ok, failed + (not ok)
    print("%d passed, %d failed" % (passed, failed))
    return failed == 0


# ----------------------------------------------------------------------------------------------
# The benchmark


def hbm_bandwidth():
    """(bytes/s, where the number comes from) of GPU 0."""
    props = torch.cuda.get_device_properties(0)
    clock_khz, bus_bits = getattr(props, "memory_clock_rate", 0), getattr(props, "memory_bus_width", 0)
    if clock_khz and bus_bits:  # double data rate: two transfers per clock
        return 2.0 * clock_khz * 1e3 * bus_bits / 8, "torch device properties: %.0f MHz x %d bits x 2" % (
            clock_khz / 1e3, bus_bits)
    for key, bw in BANDWIDTH_BY_NAME:
        if key in props.name:
            return bw, "data sheet of '%s'" % key
    return None, "unknown device %r: no bound" % props.name


def decode_bytes(tf, cfg, batch, context):
    """HBM bytes one decode step reads: the bf16 GEMM weights (the embedding row gather is negligible) and
    the cache at `context` positions: K and V bf16, c fp32."""
    weights = 2 * sum(p["numel"] for p in tf.layout(cfg) if p["name"] in GEMM_WEIGHTS)
    per_position = cfg["n_head"] * tf.head_dim(cfg) * 2 * 2 + (cfg["n_head"] * 4 if cfg["forget_gate"] else 0)
    return weights + cfg["n_layer"] * batch * context * per_position


def model_bin(workdir, size, fgate_bias):
    """The path of the size's reference-initialised fox-pro model.bin (train_fox.py init), written once;
    with fgate_bias, a copy whose forget-gate biases are that number (a gate that remembers longer)."""
    tf = reference()
    layers, dim, heads = SIZES[size]
    path = workdir / ("%s-%s.bin" % (PRESET, size))
    if not path.exists():
        print("writing %s (train_fox.py init --model %s --layers %d --dim %d --heads %d)" % (path, PRESET, layers, dim, heads),
              flush=True)
        cfg = tf.make_config(PRESET, n_layer=layers, d_model=dim, n_head=heads)
        tf.save_model_bin(path, cfg, tf.init_params(cfg, INIT_SEED))
    if fgate_bias is None:
        return path
    biased = workdir / ("%s-%s-fgate%g.bin" % (PRESET, size, fgate_bias))
    if not biased.exists():
        cfg, params = tf.load_model_bin(path)
        params["fgate_b"][:] = fgate_bias
        tf.save_model_bin(biased, cfg, params)
    return biased


def run_foxc(binary, model, prompt_file, new, batch, acp, timeout):
    """fox.c's generation; returns (parsed timings or None, a one-line reason when None)."""
    cmd = [binary, "--init", str(model), "--generate", str(new), "--prompt-file", str(prompt_file), "--samples",
           str(batch), "--top-k", "1", "--stop-at-eot", "off"] + (["--acp", "1"] if acp else [])
    try:
        r = subprocess.run(cmd, cwd=str(ROOT), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "timed out after %d s" % timeout
    err = r.stderr.decode("utf-8", "replace")
    timings = parse_timings(err)
    if r.returncode != 0 or timings is None:
        last = [ln for ln in err.splitlines() if ln.strip()]
        return None, "exit %d: %s" % (r.returncode, last[-1] if last else "no output")
    return timings, None


def synced_seconds(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def is_oom(e):
    return "out of memory" in str(e).lower()


def run_torch(weights, ids, batch, new, warmup, chunk, graph):
    """PyTorch prefill and greedy decode of `new` tokens for `batch` copies of the prompt ids: a dict of
    prefill_tok_s, eager_tok_s, graph_tok_s (None when not run) and graph_agrees (how many of the new tokens
    the graph and the eager decode agree on before the first difference in any sequence)."""
    P, steps = len(ids), new - 1  # as fox.c: the first new token comes from the prefill's logits
    timed = steps - warmup
    dec = KVCacheDecoder(weights, batch, P + new)
    idx = torch.tensor([ids] * batch, device=weights.device)
    res = dict(prefill_tok_s=None, eager_tok_s=None, graph_tok_s=None, graph_agrees=None)
    with torch.no_grad():
        dec.prefill(idx[:, :min(P, 64)], chunk)  # first calls (cuBLAS handles, allocator) outside the timings
        logits = []
        t = synced_seconds(lambda: logits.append(dec.prefill(idx, chunk)))
        res["prefill_tok_s"] = batch * P / t
        dec.start_greedy(logits[0])
        after_prefill = dec.state()

        def decode(step, n):
            for _ in range(n):
                step()

        decode(dec.greedy_step, warmup)
        res["eager_tok_s"] = batch * timed / synced_seconds(lambda: decode(dec.greedy_step, timed))
        eager_tokens = dec.gen[:, P:P + new].clone()
        if not graph:
            return res
        dec.restore(after_prefill)
        side = torch.cuda.Stream()  # capture wants its warm-up on a side stream
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            decode(lambda: dec.greedy_step(static=True), 3)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            dec.greedy_step(static=True)
        dec.restore(after_prefill)  # capture records without running: only the warm-up moved the state
        decode(g.replay, warmup)
        res["graph_tok_s"] = batch * timed / synced_seconds(lambda: decode(g.replay, timed))
        same = (dec.gen[:, P:P + new] == eager_tokens).all(dim=0).tolist()
        res["graph_agrees"] = same.index(False) if False in same else new
    return res


def fmt(x, spec="%.0f"):
    return "—" if x is None else spec % x


def table_row(size, ctx, batch, plain, pruned, res, bound):
    """One line of the table from fox.c's timings without and with ACP, PyTorch's results and the bound
    (each None when missing)."""
    plain, pruned, res = plain or {}, pruned or {}, res or {}
    read = pruned.get("acp_read")
    return [size, ctx, batch, fmt(plain.get("prefill_tok_s")), fmt(plain.get("decode_tok_s")),
            fmt(pruned.get("decode_tok_s")), fmt(None if read is None else 100 * read, "%.1f"),
            fmt(res.get("prefill_tok_s")), fmt(res.get("eager_tok_s")), fmt(res.get("graph_tok_s")), fmt(bound),
            fmt(100 * plain["decode_tok_s"] / bound if plain and bound else None, "%.0f%%")]


def foxc_runs(binary, model, prompts, batches, args, notes):
    """fox.c's timings {(context, batch, acp): dict or None} for every context and batch, without and with
    ACP; a failed run (e.g. a cache that does not fit) adds a note."""
    out = {}
    for ctx, (_, prompt_file) in prompts.items():
        for batch in batches:
            for acp in (False, True):
                t, why = run_foxc(binary, model, prompt_file, args.new, batch, acp, args.timeout)
                out[ctx, batch, acp] = t
                tag = "fox.c %s context %d batch %d%s" % (args.size, ctx, batch, " --acp 1" if acp else "")
                if why:
                    notes.append("%s: %s" % (tag, why))
                    print("%s: %s" % (tag, why), flush=True)
                else:
                    read = "" if t["acp_read"] is None else ", keys read %.1f%%" % (100 * t["acp_read"])
                    print("%s: prefill %.0f tok/s, decode %.0f tok/s%s, prompt %d tokens" % (
                        tag, t["prefill_tok_s"], t["decode_tok_s"], read, t["prompt_tokens"]), flush=True)
    return out


def torch_run(weights, ids, batch, args, notes):
    """run_torch for one case, or None (and a note) when it does not fit in device memory."""
    tag = "PyTorch %s context %d batch %d" % (args.size, len(ids), batch)
    try:
        res = run_torch(weights, ids, batch, args.new, args.warmup, args.chunk, not args.no_graph)
    except RuntimeError as e:  # out of memory (torch 1.13 raises a plain RuntimeError)
        if not is_oom(e):
            raise
        notes.append("%s: out of memory, skipped" % tag)
        return None
    finally:
        torch.cuda.empty_cache()
    agree = ""
    if res["graph_agrees"] is not None:
        agree = "the CUDA-graph and eager greedy tokens agree on the first %d of %d" % (res["graph_agrees"], args.new)
        notes.append("%s: %s" % (tag, agree))
    print("%s: prefill %.0f tok/s, eager decode %.0f tok/s, graph %s tok/s; %s" % (
        tag, res["prefill_tok_s"], res["eager_tok_s"], fmt(res["graph_tok_s"]), agree), flush=True)
    return res


def bench(args):
    """The table's rows and the notes under it."""
    tf = reference()
    binary = str((ROOT / args.bin) if not os.path.isabs(args.bin) else Path(args.bin))
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        sys.exit("bench_decode.py: error: %s is missing: build it on the GPU machine first (make train_fox)" % binary)
    if not torch.cuda.is_available():
        sys.exit("bench_decode.py: error: no CUDA device for PyTorch")
    sizes, contexts = args.sizes.split(","), [int(x) for x in args.contexts.split(",")]
    batches = [int(x) for x in args.batches.split(",")]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        sys.exit("bench_decode.py: error: unknown size %s (known: %s)" % (", ".join(unknown), ", ".join(SIZES)))
    if args.new < args.warmup + 2:
        sys.exit("bench_decode.py: error: --new must exceed --warmup + 1")
    workdir = ROOT / args.workdir
    workdir.mkdir(parents=True, exist_ok=True)
    prompts = {ctx: make_prompt(workdir, ctx) for ctx in contexts}
    rows, notes = [], []
    for size in sizes:
        args.size = size
        path = model_bin(workdir, size, args.fgate_bias)
        foxc = foxc_runs(binary, path, prompts, batches, args, notes)  # first, while this process holds no GPU memory
        if args.bandwidth_source is None:  # this process's first CUDA call
            args.bandwidth, args.bandwidth_source = hbm_bandwidth()
        cfg, params = tf.load_model_bin(path)
        weights = DecoderWeights(cfg, params, "cuda")
        del params
        for ctx in contexts:
            ids = prompts[ctx][0]
            for batch in batches:
                res = None if args.no_torch else torch_run(weights, ids, batch, args, notes)
                plain, pruned = foxc[ctx, batch, False], foxc[ctx, batch, True]
                if plain and batch == batches[0]:
                    notes.append("%s context %d: the prompt is %d tokens in fox.c (its own encoding of the text), %d in "
                                 "PyTorch (the corpus window)" % (size, ctx, plain["prompt_tokens"], len(ids)))
                # the mean cache length over the decode steps: step i attends over P + i positions
                mean_ctx = len(ids) + args.new / 2.0
                bound = None if args.bandwidth is None else batch * args.bandwidth / decode_bytes(tf, cfg, batch, mean_ctx)
                rows.append(table_row(size, ctx, batch, plain, pruned, res, bound))
        del weights
        torch.cuda.empty_cache()
    return rows, notes


def report(args, rows, notes):
    head = ["size", "context", "batch", "fox.c prefill tok/s", "fox.c decode tok/s", "fox.c ACP decode tok/s",
            "ACP keys read %", "PyTorch prefill tok/s", "PyTorch eager decode tok/s", "PyTorch CUDA-graph decode tok/s",
            "HBM bound tok/s", "fox.c % of bound"]
    lines = ["%s, torch %s; fox-pro, vocabulary 50257, %d new tokens after the prompt (greedy), %s weights%s" % (
        torch.cuda.get_device_name(0), torch.__version__, args.new, "reference-initialised",
        "" if args.fgate_bias is None else " with forget-gate bias %g" % args.fgate_bias),
             "HBM bandwidth %s B/s (%s)" % (fmt(args.bandwidth, "%.3g"), args.bandwidth_source),
             "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(x) for x in r) + " |" for r in rows]
    lines += ["",
              "Decode tokens/s = batch x timed steps / time. fox.c: its own timings line (%d decode steps after the "
              "prefill's token). PyTorch: plain eager (the baseline: bf16 weights and cache, fp32 norms, gates, c and "
              "softmax; prefill in chunks of %d queries) and the same step captured in a CUDA graph (attends over the "
              "whole preallocated cache with a mask), %d warm-up steps excluded." % (args.new - 1, args.chunk, args.warmup),
              "HBM bound: bf16 GEMM weights + K, V (bf16) and c (fp32) of every layer at the mean decode context "
              "(prompt + %d/2), read once per step; ACP reads fewer keys, so its column is not held to the bound. "
              "fox.c's decode time also holds its per-step sampling on the host (logits copied back, argmax)." % args.new]
    if args.fgate_bias is None:
        lines.append("With reference-initialised weights every forget gate is about 1/2 (bias 0), so ACP skips nearly "
                     "all of the context: --fgate-bias 5 makes the gates remember a few thousand tokens.")
    lines += ["- " + n for n in notes]
    text = "\n".join(lines)
    print("\n" + text)
    if args.out:
        Path(args.out).write_text(text + "\n")
        print("wrote %s" % args.out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="the PyTorch decoder against FoxModel (float64, CPU)")
    ap.add_argument("--selftest", action="store_true", help="the parser of fox.c's timings line")
    ap.add_argument("--sizes", default="125M,760M", help="comma-separated, of %s" % ", ".join(SIZES))
    ap.add_argument("--contexts", default="2048,16384", help="prompt lengths in tokens")
    ap.add_argument("--batches", default="1,16", help="sequences decoded together")
    ap.add_argument("--new", type=int, default=128, help="tokens generated after the prompt (default 128)")
    ap.add_argument("--warmup", type=int, default=5, help="PyTorch decode steps left out of the timing (default 5)")
    ap.add_argument("--chunk", type=int, default=1024, help="PyTorch prefill queries per chunk (default 1024)")
    ap.add_argument("--no-graph", action="store_true", help="skip the CUDA-graph decode")
    ap.add_argument("--no-torch", action="store_true", help="fox.c and the bound only")
    ap.add_argument("--fgate-bias", type=float, help="set every forget-gate bias to this (e.g. 5: gates near 0.993)")
    ap.add_argument("--bin", default="train_fox", help="the GPU trainer (default ./train_fox)")
    ap.add_argument("--workdir", default="build/bench_decode", help="model.bin files and prompts (default %(default)s)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per fox.c run (default 900)")
    ap.add_argument("--out", metavar="FILE.md", help="also write the table there")
    args = ap.parse_args()
    if args.selftest:
        sys.exit(0 if selftest() else 1)
    if args.check:
        reference()
        torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
        sys.exit(0 if check() else 1)
    reference()
    args.bandwidth = args.bandwidth_source = None
    try:
        rows, notes = bench(args)
    except ValueError as e:  # a bad data file or model.bin: one line
        sys.exit("bench_decode.py: error: %s" % e)
    report(args, rows, notes)


if __name__ == "__main__":
    main()
