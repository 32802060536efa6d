#!/usr/bin/python3
"""Tests for `train_fox.py mc`, the float64 reference of the multiple-choice log-likelihoods (plain script, no pytest).

Run:  /usr/bin/python3 test/test_mc_ref.py

Builds tiny models with `train_fox.py init` (fox-pro, transformer-llama, gsa, transformer-fam with blocks of
4 tokens, and a fox-llama of the GPT-2 vocabulary, whose sequences start with <|endoftext|> 50256 rather than
0) and items of random token ids, runs the subcommand and checks:
  (a) each choice's log-likelihood against two computations of this file: the log_softmax of the reference
      model's logits over the whole sequence gathered at the choice's tokens, and a brute force that runs the
      model on every prefix alone and takes its last position; within 1e-12;
  (b) left truncation: with a small --max-len, the result equals the full computation on the sequence cut
      here ([start] + the context's newest tokens + choice, the inputs exactly --max-len long when the
      context is long enough), and equals `mc` on the item with its context already cut; a large --max-len
      leaves the sequence whole;
  (c) the output: one line per item (blank lines skipped), index, label, tokens, floats that read back to
      the same double as printed (repr);
  (d) bad input: each case is one stderr line `error: ...` naming ITEMS:LINE and what is wrong, exit 1, with
      nothing on stdout; a bad command line exits 2.
Prints one line per check and `N passed, M failed`; exits 1 if anything failed.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SCRIPT = os.path.join(ROOT, "train_fox.py")
sys.path.insert(0, ROOT)
import train_fox as tf  # noqa: E402
from reference import mc  # noqa: E402

from checks import run_check, summary  # noqa: E402

TOL = 1e-12


def cli(*args):
    env = {k: v for k, v in os.environ.items() if k != "FOX_TRACEBACK"}
    return subprocess.run([sys.executable, SCRIPT, *[str(a) for a in args]], capture_output=True, text=True,
                          env=env, timeout=600)


def write_items(path, items, blank_lines=False):
    with open(path, "w") as f:
        for it in items:
            f.write(json.dumps(it) + "\n")
            if blank_lines:
                f.write("\n   \n")


def random_items(rng, n, vocab, ctx_len=(0, 12), choice_len=(1, 5), choices=(1, 4)):
    items = []
    for _ in range(n):
        k = int(rng.integers(choices[0], choices[1] + 1))
        items.append({
            "context": [int(t) for t in rng.integers(0, vocab, int(rng.integers(ctx_len[0], ctx_len[1] + 1)))],
            "choices": [[int(t) for t in rng.integers(0, vocab, int(rng.integers(choice_len[0], choice_len[1] + 1)))]
                        for _ in range(k)],
            "label": int(rng.integers(0, k))})
    return items


# ---------------------------------------------------------------------------
# The independent computations


def start_of(vocab):
    return 50256 if vocab > 50256 else 0


def cut(start, context, choice, max_len):
    """[start] + context + choice, the context's oldest tokens dropped until len(seq) - 1 <= max_len."""
    ctx = list(context)
    while 1 + len(ctx) + len(choice) - 1 > max_len:
        ctx.pop(0)
    return [start] + ctx + list(choice)


@torch.no_grad()
def loglik_gathered(model, seq, n):
    """Sum of log_softmax(logits) at the last n tokens of seq, one forward over seq[:-1]."""
    x = torch.tensor(seq[:-1], dtype=torch.long)[None]
    logp = torch.log_softmax(model(x)[0].double(), dim=-1)  # (T, V)
    tgt = torch.tensor(seq[1:], dtype=torch.long)
    per = logp.gather(1, tgt[:, None])[:, 0]
    return float(per[len(seq) - 1 - n:].sum())


@torch.no_grad()
def loglik_prefixes(model, seq, n):
    """Sum over the last n tokens j of log p(seq[j] | seq[:j]), the model run on each prefix seq[:j] alone."""
    total = 0.0
    for j in range(len(seq) - n, len(seq)):
        logits = model(torch.tensor(seq[:j], dtype=torch.long)[None])[0, -1].double()
        total += float(torch.log_softmax(logits, dim=-1)[seq[j]])
    return total


def parse_out(res):
    return [json.loads(line) for line in res.stdout.splitlines()]


def max_diff(got, want):
    return max(abs(a - b) for a, b in zip(got, want)) if got else 0.0


# ---------------------------------------------------------------------------


MODELS = [  # (name, init flags, vocab)
    ("fox-pro", ["--model", "fox-pro", "--layers", 2, "--dim", 32, "--heads", 2], 64),
    ("transformer-llama", ["--model", "transformer-llama", "--layers", 2, "--dim", 32, "--heads", 2], 64),
    ("gsa", ["--model", "gsa", "--layers", 2, "--dim", 32, "--heads", 2, "--set", "gsa_heads=2",
             "--set", "gsa_slots=8"], 64),
    ("transformer-fam", ["--model", "transformer-fam", "--layers", 2, "--dim", 32, "--heads", 2,
                         "--set", "fam_block=4", "--set", "fam_memory=2", "--set", "fam_window_blocks=1"], 64),
]


def main():
    torch.set_num_threads(min(4, os.cpu_count() or 1))
    rng = np.random.default_rng(7)
    tmp = tempfile.mkdtemp(prefix="test_mc_ref_")

    run_check("mc_start_token: 50256 for the GPT-2 vocabulary, 0 below it",
              lambda: (mc.mc_start_token(50257), mc.mc_start_token(50304), mc.mc_start_token(64),
                       mc.mc_start_token(50256)) == (50256, 50256, 0, 0))
    run_check("mc_sequence cuts the context from the left, keeps the start token",
              lambda: (mc.mc_sequence(9, [1, 2, 3, 4, 5], [6, 7], 4) == [9, 4, 5, 6, 7]
                       and mc.mc_sequence(9, [1, 2], [6, 7], 10) == [9, 1, 2, 6, 7]
                       and mc.mc_sequence(9, [1, 2, 3], [6, 7], 3) == [9, 3, 6, 7],
                       f"{mc.mc_sequence(9, [1, 2, 3, 4, 5], [6, 7], 4)}"))

    models = {}
    for name, flags, vocab in MODELS + [("fox-llama-gpt2", ["--model", "fox-llama", "--layers", 1, "--dim", 16,
                                                              "--heads", 2], 50257)]:
        path = os.path.join(tmp, name + ".bin")
        res = cli("init", *flags, "--vocab", vocab, "--seed", 11, "--out", path)
        run_check(f"init {name}", lambda: (res.returncode == 0, res.stderr.strip()))
        if res.returncode == 0:
            cfg, params = tf.load_model_bin(path)
            models[name] = (path, vocab, tf.FoxModel(cfg, params, torch.float64, "cpu"))

    # --- (a) against the gathered log_softmax and the per-prefix brute force; (c) the output lines
    for name, (path, vocab, model) in models.items():
        gpt2 = vocab > 50256
        items = random_items(rng, 3 if gpt2 else 6, vocab, ctx_len=(0, 10) if gpt2 else (0, 12))
        items_path = os.path.join(tmp, f"{name}_items.jsonl")
        write_items(items_path, items, blank_lines=True)
        T = 64
        res = cli("mc", "--model-bin", path, "--items", items_path, "--max-len", T)
        run_check(f"{name}: mc exits 0, nothing on stderr",
                  lambda: (res.returncode == 0 and res.stderr == "", f"rc={res.returncode} {res.stderr.strip()}"))
        if res.returncode != 0:
            continue
        out = parse_out(res)
        run_check(f"{name}: one line per item (blank lines skipped), index, label, tokens",
                  lambda: (len(out) == len(items) and all(
                      o["index"] == i and o["label"] == it["label"] and o["tokens"] == [len(c) for c in it["choices"]]
                      and len(o["loglik"]) == len(it["choices"]) and set(o) == {"index", "label", "loglik", "tokens"}
                      for i, (o, it) in enumerate(zip(out, items))), f"{out[:1]}"))
        numbers = [s for line in res.stdout.splitlines() for s in
                   line.split('"loglik": [')[1].split("]")[0].split(", ")]
        run_check(f"{name}: log-likelihoods printed as repr (read back to the same double)",
                  lambda: (all(repr(float(s)) == s for s in numbers), f"{numbers[:3]}"))
        start = start_of(vocab)
        gathered, brute, got = [], [], []
        for o, it in zip(out, items):
            for ll, choice in zip(o["loglik"], it["choices"]):
                seq = [start] + it["context"] + choice
                got.append(ll)
                gathered.append(loglik_gathered(model, seq, len(choice)))
                brute.append(loglik_prefixes(model, seq, len(choice)))
        run_check(f"{name}: loglik = gathered log_softmax of the logits (start {start}), within {TOL:g}",
                  lambda: (max_diff(got, gathered) <= TOL, f"max diff {max_diff(got, gathered):.3g}"))
        run_check(f"{name}: loglik = per-prefix brute force, within {TOL:g}",
                  lambda: (max_diff(got, brute) <= TOL, f"max diff {max_diff(got, brute):.3g}"))
        run_check(f"{name}: log-likelihoods are negative and finite",
                  lambda: all(np.isfinite(x) and x < 0 for x in got))
        if gpt2:
            wrong = [loglik_gathered(model, [0] + it["context"] + c, len(c)) for it in items for c in it["choices"]]
            run_check(f"{name}: the start token matters (0 instead of 50256 gives other numbers)",
                      lambda: (max_diff(got, wrong) > 1e-6, f"max diff {max_diff(got, wrong):.3g}"))

    # --- (b) left truncation
    for name in ("fox-pro", "transformer-fam", "gsa"):
        if name not in models:
            continue
        path, vocab, model = models[name]
        T = 7
        items = random_items(rng, 6, vocab, ctx_len=(0, 20), choice_len=(1, T - 1))
        items[0]["context"] = list(range(1, 21))
        items[0]["choices"] = [[30], [31, 32, 33], [34] * (T - 1)]
        items[0]["label"] = 2
        items_path = os.path.join(tmp, f"{name}_trunc.jsonl")
        write_items(items_path, items)
        res = cli("mc", "--model-bin", path, "--items", items_path, "--max-len", T)
        run_check(f"{name} --max-len {T}: mc exits 0",
                  lambda: (res.returncode == 0, f"rc={res.returncode} {res.stderr.strip()}"))
        if res.returncode != 0:
            continue
        out = parse_out(res)
        got, want, lens = [], [], []
        for o, it in zip(out, items):
            for ll, choice in zip(o["loglik"], it["choices"]):
                seq = cut(0, it["context"], choice, T)
                lens.append((len(seq) - 1, len(it["context"]) + len(choice)))
                got.append(ll)
                want.append(loglik_gathered(model, seq, len(choice)))
        run_check(f"{name} --max-len {T}: loglik = full computation on the left-cut sequence, within {TOL:g}",
                  lambda: (max_diff(got, want) <= TOL, f"max diff {max_diff(got, want):.3g}"))
        run_check(f"{name} --max-len {T}: the cut sequences' inputs are min(T, context + choice) tokens",
                  lambda: all(n == min(T, full) for n, full in lens))
        seq0 = cut(0, items[0]["context"], items[0]["choices"][1], T)
        run_check(f"{name} --max-len {T}: [1..20] + [31, 32, 33] keeps start and the context's newest 4 tokens",
                  lambda: (seq0 == [0, 17, 18, 19, 20, 31, 32, 33], f"{seq0}"))
        # the same items with their contexts already cut (one item per choice: each keeps its own amount of
        # context), scored with room to spare: the same numbers
        pre = []
        for it in items:
            for c in it["choices"]:
                keep = T - len(c)
                pre.append({"context": it["context"][max(0, len(it["context"]) - keep):], "choices": [c], "label": 0})
        pre_path = os.path.join(tmp, f"{name}_precut.jsonl")
        write_items(pre_path, pre)
        res2 = cli("mc", "--model-bin", path, "--items", pre_path, "--max-len", 1000)
        flat = [x for o in parse_out(res2) for x in o["loglik"]] if res2.returncode == 0 else []
        run_check(f"{name}: --max-len {T} equals mc on the contexts cut beforehand (--max-len 1000)",
                  lambda: (len(flat) == len(got) and max_diff(got, flat) <= TOL,
                           f"rc={res2.returncode} max diff {max_diff(got, flat) if flat else None}"))
        full_want = [loglik_gathered(model, [0] + it["context"] + c, len(c)) for it in items for c in it["choices"]]
        res3 = cli("mc", "--model-bin", path, "--items", items_path, "--max-len", 1000)
        flat3 = [x for o in parse_out(res3) for x in o["loglik"]] if res3.returncode == 0 else []
        run_check(f"{name}: a large --max-len leaves every sequence whole",
                  lambda: (len(flat3) == len(full_want) and max_diff(flat3, full_want) <= TOL,
                           f"rc={res3.returncode}"))
        run_check(f"{name}: the cut changes the long items' numbers (the check above has teeth)",
                  lambda: max_diff(got, flat3) > 1e-6)

    # --- float32 runs too (the --dtype flag), close to float64
    if "fox-pro" in models:
        path, vocab, model = models["fox-pro"]
        items_path = os.path.join(tmp, "fox-pro_items.jsonl")
        r64 = cli("mc", "--model-bin", path, "--items", items_path, "--max-len", 64)
        r32 = cli("mc", "--model-bin", path, "--items", items_path, "--max-len", 64, "--dtype", "float32")
        a = [x for o in parse_out(r64) for x in o["loglik"]] if r64.returncode == 0 else []
        b = [x for o in parse_out(r32) for x in o["loglik"]] if r32.returncode == 0 else []
        run_check("fox-pro --dtype float32: within 1e-4 of float64 (float64 is the default)",
                  lambda: (a and len(a) == len(b) and max_diff(a, b) < 1e-4 and max_diff(a, b) > 0,
                           f"rc={r32.returncode} max diff {max_diff(a, b) if a and b else None}"))

    # --- (d) bad input: one line `error: ...` naming the line, exit 1, nothing on stdout
    if "fox-pro" in models:
        path, vocab, _ = models["fox-pro"]
        good = json.dumps({"context": [1, 2, 3], "choices": [[4], [5, 6]], "label": 1})
        T = 8
        cases = [  # (what, bad line, needles)
            ("not JSON", '{"context": [1, 2', ["not JSON"]),
            ("not an object", "[1, 2, 3]", ["JSON object"]),
            ("a bare number", "17", ["JSON object"]),
            ("missing context", '{"choices": [[1]], "label": 0}', ["missing context"]),
            ("missing choices", '{"context": [1], "label": 0}', ["missing choices"]),
            ("missing label", '{"context": [1], "choices": [[1]]}', ["missing label"]),
            ("empty choices", '{"context": [1], "choices": [], "label": 0}', ["choices is empty"]),
            ("choices not a list", '{"context": [1], "choices": 3, "label": 0}', ["choices must be a list"]),
            ("an empty choice", '{"context": [1], "choices": [[1], []], "label": 0}', ["choices[1] is empty"]),
            ("label out of range", '{"context": [1], "choices": [[1], [2]], "label": 2}', ["label 2", "out of range"]),
            ("negative label", '{"context": [1], "choices": [[1], [2]], "label": -1}', ["label -1", "out of range"]),
            ("label a string", '{"context": [1], "choices": [[1], [2]], "label": "1"}', ["not an integer"]),
            ("label a float", '{"context": [1], "choices": [[1], [2]], "label": 1.0}', ["not an integer"]),
            ("label a boolean", '{"context": [1], "choices": [[1], [2]], "label": true}', ["not an integer"]),
            ("context id = vocab", '{"context": [1, %d], "choices": [[1]], "label": 0}' % vocab,
             ["context[1] = %d" % vocab, "vocabulary [0, %d)" % vocab]),
            ("negative context id", '{"context": [-1], "choices": [[1]], "label": 0}', ["context[0] = -1", "vocabulary"]),
            ("choice id out of range", '{"context": [1], "choices": [[1], [2, 999]], "label": 0}',
             ["choices[1][1] = 999", "vocabulary"]),
            ("a float token id", '{"context": [1.5], "choices": [[1]], "label": 0}', ["context[0]", "not an integer token id"]),
            ("a string context", '{"context": "Once upon a time", "choices": [[1]], "label": 0}',
             ["context is a string", "token ids"]),
            ("a string choice", '{"context": [1], "choices": [" the end"], "label": 0}',
             ["choices[0] is a string", "token ids"]),
            ("context not a list", '{"context": 5, "choices": [[1]], "label": 0}', ["context must be a list"]),
            ("a choice longer than --max-len", '{"context": [1], "choices": [[1], %s], "label": 0}' % json.dumps([2] * (T + 1)),
             ["choices[1]", "%d tokens" % (T + 1), "--max-len %d" % T]),
        ]
        for what, bad, needles in cases:
            items_path = os.path.join(tmp, "bad.jsonl")
            with open(items_path, "w") as f:
                f.write(good + "\n" + bad + "\n" + good + "\n")
            res = cli("mc", "--model-bin", path, "--items", items_path, "--max-len", T)
            lines = res.stderr.splitlines()
            run_check(f"bad item, {what}: one line `error: ...` naming bad.jsonl:2, exit 1, no output",
                      lambda: (res.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: ")
                               and f"{items_path}:2:" in lines[0] and all(n in lines[0] for n in needles)
                               and res.stdout == "", f"rc={res.returncode} stderr={res.stderr.strip()!r}"))

        def one_line(what, res, status, *needles):
            lines = res.stderr.splitlines()
            run_check(f"{what}: one line `error: ...`, exit {status}",
                      lambda: (res.returncode == status and len(lines) == 1 and lines[0].startswith("error: ")
                               and all(n in lines[0] for n in needles) and res.stdout == "",
                               f"rc={res.returncode} stderr={res.stderr.strip()!r}"))

        empty = os.path.join(tmp, "empty.jsonl")
        with open(empty, "w") as f:
            f.write("\n\n")
        one_line("an items file of blank lines", cli("mc", "--model-bin", path, "--items", empty, "--max-len", T),
                 1, "no items")
        one_line("a missing items file", cli("mc", "--model-bin", path, "--items", os.path.join(tmp, "nope.jsonl"),
                                             "--max-len", T), 1, "nope.jsonl")
        good_path = os.path.join(tmp, "good.jsonl")
        with open(good_path, "w") as f:
            f.write(good + "\n")
        one_line("a missing model.bin", cli("mc", "--model-bin", os.path.join(tmp, "nope.bin"), "--items", good_path,
                                            "--max-len", T), 1, "nope.bin")
        notbin = os.path.join(tmp, "not.bin")
        with open(notbin, "wb") as f:
            f.write(b"\0" * 4096)
        one_line("a file that is no model.bin", cli("mc", "--model-bin", notbin, "--items", good_path, "--max-len", T),
                 1, "not.bin")
        binary = os.path.join(tmp, "binary.jsonl")
        with open(binary, "wb") as f:
            f.write(b"\xff\xfe\x00garbage\n")
        one_line("an items file that is not UTF-8", cli("mc", "--model-bin", path, "--items", binary, "--max-len", T),
                 1, "binary.jsonl")
        one_line("--max-len 1", cli("mc", "--model-bin", path, "--items", good_path, "--max-len", 1), 2, "--max-len")
        one_line("no --max-len", cli("mc", "--model-bin", path, "--items", good_path), 2, "--max-len")
        one_line("--max-len not a number", cli("mc", "--model-bin", path, "--items", good_path, "--max-len", "x"),
                 2, "--max-len")

    if os.environ.get("MC_TEST_KEEP"):
        print(f"kept files in {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
