"""reference/mc.py: the multiple-choice reference (`train_fox.py mc`), float64 log-likelihoods of token-id items.

The trainers' evaluation (fox/eval.h) is checked against it (test/test_eval.sh, test/test_mc_ref.py): each choice
is scored on [start] + context + choice, the context cut from the left to fit the model's context.
"""
import json
import sys
from pathlib import Path

import torch

from train_fox import FOX, FoxModel, UsageError, _reference_device, load_model_bin

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
