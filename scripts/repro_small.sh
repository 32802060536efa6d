#!/bin/sh
# scripts/repro_small.sh: the papers' comparisons at a small scale (docs/results.md): fox-pro,
# transformer-pro, fox-llama, transformer-llama (the FoX paper's four), gsa, transformer-fam and fox-fam
# (the GSA and TransformerFAM papers' systems), all of one size, trained the same way at context T on the
# bundled corpus, then evaluated at 4T (per-token loss L(i) and P(l), docs/model.md §6).
# FAM at this scale: blocks of K = T/4 = 128 tokens (the GPU's smallest), a window of W = 1 previous block and
# M = 8 memory rows, the paper's proportions (a window of about half the training context, M = K/16).
# Usage (repository root, GPU machine): sh scripts/repro_small.sh [OUTDIR [MODEL...]]   (default runs/repro,
# all seven). STEPS (default 600) shortens the training for a quick try.
# Then, anywhere with matplotlib: python3 scripts/plot.py per-token OUTDIR/* --out fig.png ...
set -eu
OUT=${1:-runs/repro}
[ $# -gt 0 ] && shift
MODELS=${*:-fox-pro transformer-pro fox-llama transformer-llama gsa transformer-fam fox-fam}
BIN=${TRAIN_FOX:-./train_fox}
T=512
SIZE="--layers 4 --dim 256 --heads 4"
TRAIN="--seq-len $T --batch 8 --steps ${STEPS:-600} --lr 2e-3 --min-lr 2e-4 --warmup-tokens 200K --eval-every 100 --val-steps 8 --sample-tokens 0 --seed 1337"
FAM="--fam-block 128 --fam-memory 8 --fam-window-blocks 1"
for model in $MODELS; do
    run="$OUT/$model"
    extra=""
    case $model in *-fam) extra=$FAM ;; esac
    mkdir -p "$run"
    $BIN --model "$model" $SIZE $extra $TRAIN --out "$run" > "$run/train.txt" 2>&1 || { tail -3 "$run/train.txt"; exit 1; }
    $BIN --eval-only --out "$run" --eval-seq-len $((4 * T)) --eval-seqs 1000 > "$run/eval.txt" 2>&1 || { tail -3 "$run/eval.txt"; exit 1; }
    printf '%-18s %s | %s\n' "$model" "$(grep '^step' "$run/train.txt" | grep 'tok/s' | tail -n 1 | cut -d'|' -f2,6)" \
        "$(grep 'mean loss' "$run/eval.txt")"
done
