#!/bin/sh
# scripts/fingerprint.sh: short deterministic training runs whose outputs a behaviour-preserving change
# (a refactor, a rename, a kernel moved between files) must leave bitwise the same. For every preset, with
# and without ACP, at head_dim 64 (and 128 for the GPU trainer, where the attention kernel has a second
# path), it trains a few steps on the bundled data and prints the md5 of the final checkpoint (weights and optimizer state) and of the
# log's loss and gradient-norm columns. Run it before and after the change and diff the two outputs.
#   sh scripts/fingerprint.sh ./train_fox_cpu > before.txt      (or ./train_fox on a GPU machine)
set -eu
BIN=${1:?usage: sh scripts/fingerprint.sh TRAINER}
STEPS=${STEPS:-4}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
case "$BIN" in
    *train_fox_cpu*) shapes="--layers 2 --dim 64 --heads 1 --seq-len 128 --batch 2" ;;
    *) shapes="--layers 2 --dim 128 --heads 2 --seq-len 512 --batch 2|--layers 2 --dim 256 --heads 2 --seq-len 512 --batch 2" ;;
esac
echo "$shapes" | tr '|' '\n' | while read -r shape; do
    for model in fox-pro fox-llama transformer-pro transformer-llama; do
        for acp in 0 1; do
            out="$tmp/run"
            rm -rf "$out"
            # shellcheck disable=SC2086
            "$BIN" --model "$model" $shape --vocab 50257 --steps "$STEPS" --lr 3e-3 --warmup-tokens 1K \
                --eval-every 0 --sample-tokens 0 --acp "$acp" --out "$out" > "$tmp/log.txt" 2>&1 ||
                { tail -3 "$tmp/log.txt"; echo "error: $model $shape --acp $acp failed"; exit 1; }
            weights=$(cat "$out"/ckpt_*/*.bin | md5sum | cut -c1-12)
            losses=$(grep -o '"\(loss\|grad_norm\)": *[^,}]*' "$out/log.jsonl" | md5sum | cut -c1-12)
            echo "$model | $shape | acp $acp | checkpoint $weights | log $losses"
        done
    done
done
