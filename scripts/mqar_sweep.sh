#!/bin/sh
# MQAR accuracy against the number of key-value pairs (docs/results.md, "Associative recall"): for each
# pair count a `fox_data mqar` set (vocabulary VOCAB, examples of SEQ tokens, 100000 training and 1000 test
# examples), and each model trained on it from scratch at the same width (2 layers, d_model 128; Gated Slot
# Attention at the slot counts named, as gsa:SLOTS), then scored on the test set's answers
# (--eval-mqar, at step 0 and at the end). Results: OUT/<model>_kv<N>/mqar_result.json, a table on stdout,
# the figure with scripts/plot.py mqar.
#   sh scripts/mqar_sweep.sh OUT "16 32 64" "fox-pro transformer-pro fox-llama gsa:16 gsa:64"
#   (BIN=./train_fox, VOCAB=8192, STEPS=3000, LR=3e-3, SEQ=256, BATCH=64 by default; EXTRA: more trainer flags,
#   e.g. EXTRA=--mqar-loss to train on the answers alone)
set -eu
OUT=$1
KVS=$2
MODELS=$3
BIN=${BIN:-./train_fox}
STEPS=${STEPS:-3000}
LR=${LR:-3e-3}
SEQ=${SEQ:-256}
VOCAB=${VOCAB:-8192}
BATCH=${BATCH:-64}
EXTRA=${EXTRA:-}
for kv in $KVS; do
    [ -e "$OUT/data_kv$kv/mqar.json" ] || [ -x ./fox_data ] ||
        { echo "error: ./fox_data, which writes the MQAR sets, is not built here: make fox_data" >&2; exit 2; }
done
mkdir -p "$OUT"
for kv in $KVS; do
    [ -e "$OUT/data_kv$kv/mqar.json" ] || ./fox_data mqar --out "$OUT/data_kv$kv" --vocab "$VOCAB" --num-kv "$kv" --seq-len "$SEQ" > /dev/null
    for spec in $MODELS; do
        model=${spec%%:*}
        extra=""
        name=$model
        if [ "$model" != "$spec" ]; then extra="--gsa-heads 2 --gsa-slots ${spec#*:}"; name=${model}_m${spec#*:}; fi
        run="$OUT/${name}_kv$kv"
        [ -e "$run/mqar_result.json" ] && [ -e "$run/ckpt_$(printf %08d "$STEPS")" ] && continue
        rm -rf "$run"
        $BIN --model "$model" $extra --vocab "$VOCAB" --layers 2 --dim 128 --heads 2 --seq-len "$SEQ" --batch "$BATCH" \
            --steps "$STEPS" --lr "$LR" --warmup-tokens 1M --val "" --train "$OUT/data_kv$kv/train.bin" \
            --eval-mqar "$OUT/data_kv$kv" --eval-every "$STEPS" --sample-tokens 0 --log-every 500 $EXTRA --out "$run" > "$run.log" 2>&1 ||
            { echo "error: ${name}_kv$kv failed, see $run.log: $(grep -m1 '^error' "$run.log")" >&2; exit 1; }
    done
done
printf '%-24s' model
for kv in $KVS; do printf ' %8s' "kv=$kv"; done
echo
for spec in $MODELS; do
    model=${spec%%:*}
    name=$model
    [ "$model" != "$spec" ] && name=${model}_m${spec#*:}
    printf '%-24s' "$name"
    for kv in $KVS; do
        printf ' %8s' "$(sed -n 's/.*"accuracy": \([0-9.e-]*\).*/\1/p' "$OUT/${name}_kv$kv/mqar_result.json")"
    done
    echo
done
