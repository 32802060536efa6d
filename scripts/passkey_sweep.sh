#!/bin/sh
# Passkey retrieval against the prompt's length (docs/results.md; the task: docs/model.md §8.2): one
# `fox_data passkey` set (examples of SEQ tokens: TRAIN to train on, 200 to validate), each model trained on it
# from scratch at the same width (2 layers, d_model 128, 2 heads), then asked the passkey (--eval-passkey, at step
# 0 and at the end) at LENGTHS tokens with TRIALS keys each. A model is a preset, or preset:bswa for TransformerFAM's
# block sliding window without its memory (--fam-memory 0, the FAM paper's BSWA); the FAM presets run blocks of
# BLOCK tokens with WINDOW previous blocks in the window and MEMORY memory tokens.
# The FoX models but fox-fam are asked again from their final checkpoint with Adaptive Computation
# Pruning (--eval-only --acp 1, into OUT/runs/<name>-acp): the share of attention tiles it pruned, and how many
# answers are the same as without it.
# Results: the set in OUT/data, the runs in OUT/runs/<name> (passkey.json; the log beside, <name>.log), a table
# of accuracy per length on stdout, the figure with `scripts/plot.py passkey OUT/runs/*/`.
#   sh scripts/passkey_sweep.sh OUT "transformer-fam transformer-fam:bswa transformer-pro fox-pro"
#   (BIN=./train_fox, SEQ=512, TRAIN=20000, STEPS=8000, LR=3e-3, BATCH=32, BLOCK=128, WINDOW=1, MEMORY=64,
#   LENGTHS=SEQ,2SEQ,4SEQ,8SEQ, TRIALS=20 by default, the figures of docs/results.md; EXTRA: more trainer flags)
set -eu
OUT=$1
MODELS=$2
BIN=${BIN:-./train_fox}
SEQ=${SEQ:-512}
TRAIN=${TRAIN:-20000}
STEPS=${STEPS:-8000}
LR=${LR:-3e-3}
BATCH=${BATCH:-32}
BLOCK=${BLOCK:-128}
WINDOW=${WINDOW:-1}
MEMORY=${MEMORY:-64}
LENGTHS=${LENGTHS:-$SEQ,$((2 * SEQ)),$((4 * SEQ)),$((8 * SEQ))}
TRIALS=${TRIALS:-20}
EXTRA=${EXTRA:-}
PY=${PYTHON:-python3}
for spec in $MODELS; do  # every spec before anything is written or trained
    case "$spec" in *:*) [ "${spec#*:}" = bswa ] || { echo "error: $spec: a model is a preset or preset:bswa" >&2; exit 2; } ;; esac
done
[ -e "$OUT/data/passkey.json" ] || [ -x ./fox_data ] ||
    { echo "error: ./fox_data, which writes the passkey set, is not built here: make fox_data" >&2; exit 2; }
mkdir -p "$OUT/runs"
[ -e "$OUT/data/passkey.json" ] || ./fox_data passkey --out "$OUT/data" --seq-len "$SEQ" --train-examples "$TRAIN" > /dev/null
names=""
for spec in $MODELS; do
    model=${spec%%:*}
    name=$model
    fam=""
    case "$model" in *-fam) fam="--fam-block $BLOCK --fam-window-blocks $WINDOW --fam-memory $MEMORY" ;; esac
    if [ "$spec" = "$model:bswa" ]; then
        name=${model%-fam}-bswa
        fam="--fam-block $BLOCK --fam-window-blocks $WINDOW --fam-memory 0"
    fi
    names="$names $name"
    run="$OUT/runs/$name"
    last="$run/ckpt_$(printf %08d "$STEPS")"
    if [ ! -e "$run/passkey.json" ] || [ ! -e "$last" ]; then
        rm -rf "$run" "$run-acp"
        $BIN --model "$model" $fam --layers 2 --dim 128 --heads 2 --seq-len "$SEQ" --batch "$BATCH" --steps "$STEPS" \
            --lr "$LR" --warmup-tokens 1M --train "$OUT/data/train.bin" --val "$OUT/data/val.bin" --val-steps 4 \
            --eval-passkey --passkey-lengths "$LENGTHS" --passkey-trials "$TRIALS" --eval-every "$STEPS" \
            --ckpt-every "$STEPS" --sample-tokens 0 --log-every 100 $EXTRA --out "$run" > "$run.log" 2>&1 ||
            { echo "error: $name failed, see $run.log: $(grep -m1 '^error' "$run.log")" >&2; exit 1; }
    fi
    case "$model" in *-fam) ;; fox-*)  # (TransformerFAM's window takes no ACP)
        [ -e "$run-acp/passkey.json" ] && continue
        rm -rf "$run-acp"
        $BIN --eval-only --init "$last/model.bin" --acp 1 --eval-passkey --passkey-lengths "$LENGTHS" \
            --passkey-trials "$TRIALS" --out "$run-acp" > "$run-acp.log" 2>&1 ||
            { echo "error: $name with --acp 1 failed, see $run-acp.log: $(grep -m1 '^error' "$run-acp.log")" >&2; exit 1; }
    esac
done
$PY - "$OUT" $names <<'EOF'
import json, sys
out, names = sys.argv[1], sys.argv[2:]
results = {n: json.load(open(f"{out}/runs/{n}/passkey.json")) for n in names}
lengths = results[names[0]]["lengths"]
print("%-20s %s" % ("model", " ".join("%8s" % ("L=%d" % n) for n in lengths)))
for n in names:
    print("%-20s %s" % (n, " ".join("%8.3f" % a for a in results[n]["accuracy"])))
for n in names:
    try:
        acp = json.load(open(f"{out}/runs/{n}-acp/passkey.json"))
    except FileNotFoundError:
        continue
    same = sum(a["text"] == b["text"] for a, b in zip(results[n]["cells"], acp["cells"]))
    print("%-20s %s  pruned by --acp 1; answers unchanged: %d of %d" % (
        n + " ACP", " ".join("%8.3f" % p for p in acp["acp_pruned"]), same, len(acp["cells"])))
EOF
