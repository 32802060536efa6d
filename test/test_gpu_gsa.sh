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

train_resume_eval_checks gsa

$GPU $ARGS --dim 96 --gsa-heads 3 --out "$tmp/h" > "$tmp/bad.txt" 2>&1
st=$?
[ "$st" -ne 0 ] && [ "$(wc -l < "$tmp/bad.txt")" -eq 1 ] && grep -q '^error: .*GSA kernels' "$tmp/bad.txt"
check $? "a head dim the GSA kernels do not run: $(head -c 200 "$tmp/bad.txt")"

finish
