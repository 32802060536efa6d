#!/bin/sh
# Gated Slot Attention (--model gsa, docs/model.md §1.9) end to end on a GPU machine (part of `make test-gpu`):
# ./train_fox trains it (the loss falls; the sample after training decodes from the recurrent state), a resume
# gives bitwise the same losses and weights, the GPU checkpoint trains on in train_fox_cpu, --eval-only's L(i)
# agrees with the CPU's on the same checkpoint, and a head dim the GSA kernels do not run fails with one line.
# Binaries: $TRAIN_FOX (default ./train_fox) and $TRAIN_FOX_CPU (default ./train_fox_cpu).
set -u
GPU=${TRAIN_FOX:-./train_fox}
CPU=${TRAIN_FOX_CPU:-./train_fox_cpu}
PY=${PYTHON:-python3}
. "$(dirname "$0")/test_lib.sh"
ARGS="--model gsa --layers 2 --dim 128 --gsa-heads 2 --seq-len 256 --batch 4 --steps 20 --lr 3e-3 --warmup-tokens 10K --eval-every 10 --val-steps 2 --ckpt-every 10 --keep 5"

$GPU $ARGS --sample-tokens 16 --out "$tmp/a" > "$tmp/a.txt" 2>&1
check $? "train_fox --model gsa trains 20 steps, checkpoints at 10 and 20 ($(grep -c '^step .*tok/s' "$tmp/a.txt") step lines)"
first=$(losses_after "$tmp/a/log.jsonl" 0 | head -n 1 | cut -d' ' -f2)
last=$(losses_after "$tmp/a/log.jsonl" 0 | tail -n 1 | cut -d' ' -f2)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 1.0) }'
check $? "the loss falls (step 1: $first, step 20: $last)"
grep -q '^sample: ' "$tmp/a.txt"
check $? "a sample decoded from the recurrent state is printed"

mkdir -p "$tmp/b" && cp -r "$tmp/a/ckpt_00000010" "$tmp/b/"
$GPU $ARGS --sample-tokens 0 --resume --out "$tmp/b" > "$tmp/b.txt" 2>&1
check $? "train_fox --model gsa resumes from step 10"
losses_after "$tmp/a/log.jsonl" 10 > "$tmp/la"
losses_after "$tmp/b/log.jsonl" 10 > "$tmp/lb"
cmp -s "$tmp/la" "$tmp/lb" && [ "$(wc -l < "$tmp/la")" -eq 10 ]
check $? "steps 11-20 after the resume have bitwise the same losses ($(wc -l < "$tmp/lb") compared)"
cmp -s "$tmp/a/ckpt_00000020/model.bin" "$tmp/b/ckpt_00000020/model.bin"
check $? "and the same final weights"

cp -r "$tmp/a" "$tmp/c"
$CPU $ARGS --steps 22 --sample-tokens 0 --eval-every 0 --resume --out "$tmp/c" > "$tmp/c.txt" 2>&1
check $? "train_fox_cpu resumes the GPU's GSA checkpoint and trains 2 more steps"

$GPU --eval-only --out "$tmp/a" --eval-seqs 4 --eval-seq-len 512 > "$tmp/eg.txt" 2>&1
check $? "train_fox --eval-only of the GSA model at twice the training context"
mkdir -p "$tmp/ec" && cp "$tmp/a/per_token_loss.npy" "$tmp/ec/gpu.npy"
$CPU --eval-only --out "$tmp/a" --eval-seqs 4 --eval-seq-len 512 > "$tmp/ec.txt" 2>&1
check $? "train_fox_cpu --eval-only on the same checkpoint"
$PY -c "
import numpy as np, sys
g, c = np.load('$tmp/ec/gpu.npy'), np.load('$tmp/a/per_token_loss.npy')
d = abs(g.mean() - c.mean())
print('GPU mean L %.5f, CPU %.5f, |diff| %.2e' % (g.mean(), c.mean(), d))
sys.exit(not (g.shape == c.shape == (512,) and d < 2e-2))"
check $? "L(i) of the GPU and the CPU agree in the mean within 2e-2 (bf16 vs fp32)"

$GPU $ARGS --dim 96 --gsa-heads 3 --out "$tmp/h" > "$tmp/bad.txt" 2>&1
st=$?
[ "$st" -ne 0 ] && [ "$(wc -l < "$tmp/bad.txt")" -eq 1 ] && grep -q '^error: .*GSA kernels' "$tmp/bad.txt"
check $? "a head dim the GSA kernels do not run: $(head -c 200 "$tmp/bad.txt")"

finish
