#!/bin/sh
# scripts/repro_small.sh: the paper's FoX-versus-Transformer comparison at a small scale (issue 5):
# fox-pro, transformer-pro, fox-llama and transformer-llama of one size, trained at context T on the
# bundled corpus, then evaluated at 4T (per-token loss L(i) and P(l), docs/model.md §6).
# Usage (repository root, GPU machine): sh scripts/repro_small.sh [OUTDIR]   (default runs/repro)
# Then, anywhere with matplotlib: python3 scripts/plot.py per-token OUTDIR/* --out fig.png ...
set -eu
OUT=${1:-runs/repro}
BIN=${TRAIN_FOX:-./train_fox}
T=512
SIZE="--layers 4 --dim 256 --heads 4"
TRAIN="--seq-len $T --batch 8 --steps 600 --lr 2e-3 --min-lr 2e-4 --warmup-tokens 200K --eval-every 100 --val-steps 8 --sample-tokens 0 --seed 1337"
for model in fox-pro transformer-pro fox-llama transformer-llama; do
    run="$OUT/$model"
    mkdir -p "$run"
    $BIN --model "$model" $SIZE $TRAIN --out "$run" > "$run/train.txt" 2>&1 || { tail -3 "$run/train.txt"; exit 1; }
    $BIN --eval-only --out "$run" --eval-seq-len $((4 * T)) --eval-seqs 1000 > "$run/eval.txt" 2>&1 || { tail -3 "$run/eval.txt"; exit 1; }
    printf '%-18s %s | %s\n' "$model" "$(grep '^step' "$run/train.txt" | grep 'tok/s' | tail -n 1 | cut -d'|' -f2,6)" \
        "$(grep 'mean loss' "$run/eval.txt")"
done
