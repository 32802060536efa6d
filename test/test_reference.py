#!/usr/bin/env python3
"""test/test_reference.py: the reference's self-check (also `train_fox.py selfcheck`), plain script, no pytest.

The reference (train_fox.py) checked against itself and against independent forms, in float64: its RNG against
pure Python, its attention and GSA layers against token-by-token loop forms written from the papers (the
_loop_* helpers, attention_layer_loop, gsa_layer_loop, fam_layer_loop, fam_prompt_loop), the document mask,
finite differences, GSA's chunked form against its recurrence, TransformerFAM, AdamW against
torch.optim.AdamW, and the file round trips. One PASS or FAIL line per check, then `N passed, M failed`;
exit status 1 on a failure.

    /usr/bin/python3 test/test_reference.py
"""
import math
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from train_fox import (ARCH_ATTENTION, ARCH_FAM, ARCH_GSA, FG_DATA_DEPENDENT, FG_NONE, FOX, MASK64,  # noqa: E402
                       PRESETS, AdamW, FoxModel, attn_in_slices, fox_arch_name, gsa_chunked, gsa_recurrent,
                       head_dim, init_normal, init_params, layout, load_model_bin, make_config, mix64_np,
                       mix64_py, read_fixture, rng_key, rng_normal_np, rng_normal_py, save_model_bin,
                       write_fixture)
from reference.fixtures import (FIXTURE_DOC_SEP, FIXTURE_SEED, FIXTURE_SHAPE, FIXTURES,  # noqa: E402
                                fixture_config, fixture_doc_sep, perturbed_params, with_separators)

def _loop_rms(x, w, eps):
    return x / math.sqrt(sum(e * e for e in x) / len(x) + eps) * w


def _loop_sigmoid(z):
    return 1.0 / (1.0 + math.exp(-z))


def _loop_qk(cfg, W, q, k, hd, pos):
    """The loop forms' QK-norm, then RoPE at position pos, of one head's q and k (hd: the head's slice)."""
    if cfg["qk_norm"]:
        wq, wk = W["qnorm_w"].reshape(-1), W["knorm_w"].reshape(-1)
        if not cfg["qk_norm_shared"]:
            wq, wk = wq[hd], wk[hd]
        q, k = _loop_rms(q, wq, FOX["FOX_QK_NORM_EPS"]), _loop_rms(k, wk, FOX["FOX_QK_NORM_EPS"])
    if cfg["rope"]:
        Dh = len(q)
        q, k = q.copy(), k.copy()
        for d in range(Dh // 2):
            th = pos * cfg["rope_theta"] ** (-2.0 * d / Dh)
            for x in (q, k):
                a, b = x[d], x[d + Dh // 2]
                x[d], x[d + Dh // 2] = a * math.cos(th) - b * math.sin(th), b * math.cos(th) + a * math.sin(th)
    return q, k


def attention_layer_loop(cfg, W, xn, starts=None):
    """One attention layer for one sequence, token by token in numpy float64, written from the
    paper's product form (eq. 11: F_ij = prod_{l=j+1..i} f_l) rather than cumsums and matrices.
    W: this layer's tensors in the fox.c layout; xn: (T, D) normalised input. Returns (T, D).
    starts: None, or T bools, the separators of the document mask (docs/model.md §1.8), applied
    as fox.c does rather than as FoxModel does: f = 0 at a separator (so F_ij = 0 across one, also
    with no forget gate) and no KV-shift from the token before it."""
    if cfg["arch"] == ARCH_GSA:
        return gsa_layer_loop(cfg, W, xn)
    T, D = xn.shape
    starts = [False] * T if starts is None else list(starts)
    H, Dh = cfg["n_head"], head_dim(cfg)
    rows = attn_in_slices(cfg)

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
            if cfg["kv_shift"]:
                has_prev = t > 0 and not starts[t]
                k_prev = proj[t - 1][rows["k"]][hd] if has_prev else np.zeros(Dh)
                v_prev = proj[t - 1][rows["v"]][hd] if has_prev else np.zeros(Dh)
                ak = sigmoid(proj[t][rows["k_shift"]][h])
                av = sigmoid(proj[t][rows["v_shift"]][h])
                k = ak * k_prev + (1 - ak) * k
                v = av * v_prev + (1 - av) * v
            q, k = _loop_qk(cfg, W, q, k, hd, t)
            if cfg["forget_gate"] == FG_DATA_DEPENDENT:
                fs.append(sigmoid(proj[t][rows["fgate"]][h] + W["fgate_b"].reshape(-1)[h]))
            elif cfg["forget_gate"] != FG_NONE:
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
            if cfg["output_norm"]:
                o = rms(o, W["onorm_w"].reshape(-1)[hd], 1e-6)
            if cfg["output_gate"]:
                o = o * np.array([sigmoid(z) for z in proj[i][rows["gate"]][hd]])
            out[i, hd] = o
    return np.array([W["attn_out_w"] @ out[t] for t in range(T)])


def gsa_layer_loop(cfg, W, xn):
    """One GSA layer for one sequence, token by token in numpy float64, from the paper (eq. 6, 8, 9):
    the slot memories K~ (S) and V~ (U) updated row by row, alpha = sigmoid(.) ** (1 / tau).
    W: this layer's tensors in the fox.c layout; xn: (T, D) normalised input. Returns (T, D)."""
    T, D = xn.shape
    G, m, tau = cfg["gsa_heads"], cfg["gsa_slots"], cfg["gsa_tau"]
    dh = D // G
    rows = attn_in_slices(cfg)
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
    """The per-row pieces of fam_layer_loop and fam_prompt_loop for config cfg and one layer's tensors W (the
    fox.c layout), in numpy float64 and plain Python loops."""

    def __init__(self, cfg, W):
        self.cfg, self.W, self.rows = cfg, W, attn_in_slices(cfg)
        self.H, self.Dh, self.D = cfg["n_head"], head_dim(cfg), cfg["d_model"]

    rms, sigmoid = staticmethod(_loop_rms), staticmethod(_loop_sigmoid)

    def project(self, row):
        """attn_in_w RMSNorm(row)."""
        return self.W["attn_in_w"] @ self.rms(row, self.W["ln1_w"].reshape(-1), FOX["FOX_NORM_EPS"])

    def heads(self, pr, pos, k_in=None, v_in=None):
        """[(q, k, v)] per head from one row's projection pr at position pos (k_in, v_in: the KV-shifted
        ones, tokens only): QK-norm, then RoPE."""
        cfg, Dh, out = self.cfg, self.Dh, []
        for h in range(self.H):
            hd = slice(h * Dh, (h + 1) * Dh)
            q, k = pr[self.rows["q"]][hd], (pr[self.rows["k"]] if k_in is None else k_in)[hd]
            v = (pr[self.rows["v"]] if v_in is None else v_in)[hd]
            q, k = _loop_qk(cfg, self.W, q, k, hd, pos)
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
        cfg, Dh, z = self.cfg, self.Dh, np.zeros(self.D)
        for h in range(self.H):
            hd = slice(h * Dh, (h + 1) * Dh)
            oh = self.rms(o[h], self.W["onorm_w"].reshape(-1)[hd], FOX["FOX_NORM_EPS"]) if cfg["output_norm"] else o[h]
            if cfg["output_gate"]:
                oh = oh * np.array([self.sigmoid(g) for g in pr[self.rows["gate"]][hd]])
            z[hd] = oh
        mid = res + self.W["attn_out_w"] @ z
        u = self.W["mlp_in_w"] @ self.rms(mid, self.W["ln2_w"].reshape(-1), FOX["FOX_NORM_EPS"])
        I = len(u) // 2
        return mid + self.W["mlp_out_w"] @ np.array([u[i] / (1.0 + math.exp(-u[i])) * u[I + i] for i in range(I)])


def fam_layer_loop(cfg, W, x, memory):
    """One TransformerFAM layer for one sequence, query by query in numpy float64 from the FAM paper's
    Algorithm 2 and docs/model.md §1.10, rather than by masked matrices. x (T, D): the residual stream
    entering the layer; memory (M, D): its first memory F_0; W: the layer's tensors in the fox.c layout.
    Every query lists its keys explicitly, each key with the time of the token whose c it carries (the
    memory's keys: the token before their block, -1 before the first; the memory's queries: the block's
    last token); the decay from key time tk to query time tq is the product of the gates f_l, tk < l <= tq
    (eq. 11's product form). Returns the layer's output (T, D)."""
    T, D = x.shape
    K, M, Wb = cfg["fam_block"], cfg["fam_memory"], cfg["fam_window_blocks"]
    P = _FamLoopParts(cfg, W)
    H, Dh, rows = P.H, P.Dh, P.rows
    proj = [P.project(x[t]) for t in range(T)]
    fs = [[1.0] * T for _ in range(H)]
    if cfg["forget_gate"] != FG_NONE:
        for h in range(H):
            for t in range(T):
                dd = proj[t][rows["fgate"]][h] if cfg["forget_gate"] == FG_DATA_DEPENDENT else 0.0
                fs[h][t] = P.sigmoid(W["fgate_b"].reshape(-1)[h] + dd)

    def decay(h, tk, tq):
        return math.prod(fs[h][tk + 1:tq + 1])

    tok = []
    for t in range(T):
        k_in = v_in = None
        if cfg["kv_shift"]:
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


def fam_prompt_loop(cfg, W, g):
    """The prompt's rows g (M, D) through one layer, in numpy float64 (FAM paper B.1): each row, at position
    i - M, attends to all M rows with no decay; then the residual and the MLP."""
    M = g.shape[0]
    P = _FamLoopParts(cfg, W)
    proj = [P.project(g[i]) for i in range(M)]
    qkv = [P.heads(proj[i], i - M) for i in range(M)]
    return np.array([P.residual_out(g[i], [P.attend(qkv[i][h][0], [(qkv[j][h][1], qkv[j][h][2], 1.0) for j in range(M)])
                                            for h in range(P.H)], proj[i]) for i in range(M)])


def fam_checks():
    """Yields (name, ok, detail): the TransformerFAM checks of selfcheck (float64 throughout)."""
    for name in ("transformer-fam", "fox-fam", "transformer-bswa", "fox-bswa"):
        cfg = fixture_config(name)
        params = perturbed_params(cfg, init_params(cfg, FIXTURE_SEED))
        if cfg["fam_memory"]:  # a memory at the residual stream's scale matters more
            params["fam_init"] = params["fam_init"] * 25
        model = FoxModel(cfg, params, torch.float64)
        layer = {n: a[1] for n, a in params.items() if a.ndim == 3}
        rng = np.random.default_rng(31)
        T = 2 * cfg["fam_block"] + 5  # two memory updates and a partial block
        x = rng.standard_normal((1, T, cfg["d_model"]))
        memory = rng.standard_normal((cfg["fam_memory"], cfg["d_model"]))
        with torch.no_grad():
            fast = model.fam_layer(1, torch.from_numpy(x), torch.from_numpy(memory))[0].numpy()
        slow = fam_layer_loop(cfg, layer, x[0], memory)
        err = np.abs(fast - slow).max() / np.abs(slow).max()
        yield ("FAM layer (the block's concatenation and mask) vs the query-by-query loop form, T %d: %s" % (T, name),
               err < 1e-12, "max rel err %.2e" % err)

        if cfg["fam_memory"]:  # BSWA alone (fam_memory 0) has no prompt
            with torch.no_grad():
                fast = model.fam_prompt_layer(1, torch.from_numpy(memory)).numpy()
            slow = fam_prompt_loop(cfg, layer, memory)
            err = np.abs(fast - slow).max() / np.abs(slow).max()
            yield "FAM prompt through a layer vs its loop form: " + name, err < 1e-12, "max rel err %.2e" % err

        # causality: the logits before position p do not depend on the tokens from p on (at, around and inside
        # block boundaries: the memory after a block must reach only the blocks after it)
        idx = torch.from_numpy(rng.integers(0, cfg["vocab_size"], (1, 3 * cfg["fam_block"] + 3)))
        with torch.no_grad():
            base = model(idx)
            worst = 0.0
            for p in (1, cfg["fam_block"] - 1, cfg["fam_block"], cfg["fam_block"] + 1, 2 * cfg["fam_block"] + 2):
                other = idx.clone()
                other[0, p:] = (other[0, p:] + 1) % cfg["vocab_size"]
                worst = max(worst, (model(other)[0, :p] - base[0, :p]).abs().max().item())
        yield "FAM causality: logits before p unchanged by the tokens from p on, " + name, worst == 0.0, "max diff %.1e" % worst

        if not cfg["fam_memory"]:  # BSWA alone with a window over the whole context is the Pro model's attention
            whole = dict(cfg, fam_window_blocks=idx.shape[1] // cfg["fam_block"] + 1)
            pro = make_config("fox-pro" if cfg["forget_gate"] != FG_NONE else "transformer-pro", **FIXTURE_SHAPE)
            with torch.no_grad():
                a = FoxModel(whole, params, torch.float64)(idx)
                b = FoxModel(pro, params, torch.float64)(idx)
            err = ((a - b).abs().max() / b.abs().max()).item()
            yield ("BSWA (fam_memory 0) with a window over the whole context equals the Pro preset it modifies: " + name,
                   err < 1e-12, "max rel err %.2e" % err)


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
    cfg = fixture_config("gsa")
    params = perturbed_params(cfg, init_params(cfg, FIXTURE_SEED))
    idx = torch.from_numpy(np.random.default_rng(17).integers(0, cfg["vocab_size"], (2, 40)))
    with torch.no_grad():
        chunked = FoxModel(cfg, params, torch.float64)(idx)
        recurrent = FoxModel(cfg, params, torch.float64, gsa_chunk=0)(idx)
    err = rel(chunked, recurrent)
    yield "GSA model logits: chunked vs recurrent, T 40", err < 1e-12, "max rel err %.2e" % err

    # (g3) finite differences of the GSA loss (central, float64, default chunked form, T 24: 2 chunks)
    # along a random direction of the slot-gate rows of attn_in_w (all layers), and of onorm_w.
    model = FoxModel(cfg, params, torch.float64)
    rng = np.random.default_rng(19)
    idx = torch.from_numpy(rng.integers(0, cfg["vocab_size"], (1, 24)))
    tgt = torch.from_numpy(rng.integers(0, cfg["vocab_size"], (1, 24)))
    model.loss(idx, tgt)[0].backward()
    gate_rows = attn_in_slices(cfg)["slot_gate"]
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
        cfg = fixture_config(name)
        if cfg["arch"] == ARCH_FAM:  # a FAM layer is more than its token mixer: fam_checks
            continue
        sep = fixture_doc_sep(name)
        params = perturbed_params(cfg, init_params(cfg, FIXTURE_SEED))
        model = FoxModel(cfg, params, torch.float64, doc_sep=sep, gsa_chunk=5)  # GSA: 3 chunks
        xn = torch.from_numpy(np.random.default_rng(3).standard_normal((1, 12, cfg["d_model"])))
        starts = None if sep is None else np.isin(np.arange(12), (0, 4, 5, 9))
        docs = None if sep is None else model.documents(torch.from_numpy(np.where(starts, sep, 0)[None]))
        with torch.no_grad():
            fast = model.attention(1, xn, docs)[0].numpy()
        layer = {n: a[1] for n, a in params.items() if a.ndim == 3}
        slow = attention_layer_loop(cfg, layer, xn[0].numpy(), starts)
        err = np.abs(fast - slow).max() / np.abs(slow).max()
        yield "attention vs loop form: " + name, err < 1e-12, "max rel err %.2e" % err

    # (e) the document mask (docs/model.md §1.8), every preset: a window [document A, separator,
    # document B] gives B's positions the logits of the window [separator, B] alone (RoPE is
    # relative: equal up to rounding), and with no separator in the window the mask changes nothing.
    for preset in PRESETS:
        cfg = make_config(preset, **FIXTURE_SHAPE)
        params = perturbed_params(cfg, init_params(cfg, FIXTURE_SEED))
        sep = FIXTURE_DOC_SEP
        if cfg["arch"] != ARCH_ATTENTION:  # no document mask for GSA or FAM: FoxModel refuses one
            try:
                FoxModel(cfg, params, torch.float64, doc_sep=sep)
                refused = False
            except ValueError:
                refused = True
            yield "document mask: refused with %s, %s" % (fox_arch_name(cfg["arch"]), preset), refused, ""
            continue
        model = FoxModel(cfg, params, torch.float64, doc_sep=sep)
        rng = np.random.default_rng(13)
        doc_a, doc_b = (with_separators(rng.integers(0, cfg["vocab_size"], n), sep, np.zeros(n, bool), None)
                        for n in (23, 18))
        both = torch.from_numpy(np.concatenate([doc_a, [sep], doc_b])[None])
        alone = torch.from_numpy(np.concatenate([[sep], doc_b])[None])
        with torch.no_grad():
            diff = (model(both)[:, len(doc_a):] - model(alone)).abs().max().item()
        yield "document mask: [A, sep, B] = [sep, B] on B, " + preset, diff < 1e-10, "max abs diff %.2e" % diff
        plain = FoxModel(cfg, params, torch.float64)
        with torch.no_grad():
            same = torch.equal(model(both[:, :len(doc_a)]), plain(both[:, :len(doc_a)]))
        yield "document mask: no separator, logits unchanged exactly, " + preset, same, ""

    # (b) finite differences of the forget-gate bias and KV-shift weights (float64); fox-pro-docmask
    # with separators at 0, 6, 7 and 12.
    for name in ("fox-pro", "fox-dataind", "fox-pro-docmask"):
        cfg = fixture_config(name)
        sep = fixture_doc_sep(name)
        params = perturbed_params(cfg, init_params(cfg, FIXTURE_SEED))
        model = FoxModel(cfg, params, torch.float64, doc_sep=sep)
        rng = np.random.default_rng(11)
        idx = rng.integers(0, cfg["vocab_size"], (1, 16))
        if sep is not None:
            idx = with_separators(idx, sep, np.isin(np.arange(16), (0, 6, 7, 12))[None], None)
        idx = torch.from_numpy(idx)
        tgt = torch.from_numpy(rng.integers(0, cfg["vocab_size"], (1, 16)))
        model.loss(idx, tgt)[0].backward()
        probes = [("fgate_b", (l, 0, h)) for l in range(cfg["n_layer"]) for h in range(cfg["n_head"])]
        if cfg["kv_shift"]:
            rows = attn_in_slices(cfg)
            shift_rows = list(range(rows["k_shift"].start, rows["v_shift"].stop))
            probes += [("attn_in_w", (int(rng.integers(cfg["n_layer"])), int(rng.choice(shift_rows)),
                                      int(rng.integers(cfg["d_model"])))) for _ in range(16)]
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
    cfg = fixture_config("fox-fixed")
    params = perturbed_params(cfg, init_params(cfg, FIXTURE_SEED))
    mine = FoxModel(cfg, params, torch.float64)
    ref = FoxModel(cfg, params, torch.float64)
    decays = {p["name"]: p["decay"] for p in layout(cfg)}
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
            cfg = make_config(preset, **FIXTURE_SHAPE)
            params = init_params(cfg, 5)
            a, b = Path(tmp, "a.bin"), Path(tmp, "b.bin")
            save_model_bin(a, cfg, params)
            c2, p2 = load_model_bin(a)
            save_model_bin(b, c2, p2)
            ok = (a.read_bytes() == b.read_bytes() and c2 == cfg and p2.keys() == params.keys()
                  and all(p2[n].tobytes() == params[n].tobytes() for n in params))
            yield "model.bin round trip " + preset, ok, "%d bytes" % a.stat().st_size
        tensors = [("x", np.arange(6.0).reshape(2, 3)), ("y.z", np.array([math.pi]))]
        write_fixture(Path(tmp, "f.fix"), tensors)
        back = read_fixture(Path(tmp, "f.fix"))
        ok = list(back) == ["x", "y.z"] and all(np.array_equal(back[n], a) for n, a in tensors)
        yield "fixture round trip", ok, ""


def main():
    """Prints one PASS or FAIL line per check, then `N passed, M failed`; returns the exit status."""
    passed = failed = 0
    for name, ok, detail in selfcheck_results():
        print("%s %s  %s" % ("PASS" if ok else "FAIL", name, detail))
        passed, failed = passed + ok, failed + (not ok)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
