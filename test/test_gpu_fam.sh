#!/bin/sh
# TransformerFAM (--model fox-fam / transformer-fam, docs/model.md §1.10) end to end on a GPU machine (part of
# `make test-gpu`): ./train_fox trains fox-fam (the loss falls, a sample is printed), a resume gives bitwise the same
# losses and weights, the GPU checkpoint trains on in train_fox_cpu, --eval-only's L(i) agrees with the CPU's on the
# same checkpoint; --generate from the checkpoint runs past two block ends (memory updates in the decode), greedy
# twice the same, and with --samples 3; transformer-fam trains; a fox-pro checkpoint resumed as fox-fam (and the
# reverse) and a --fam-block the GPU does not run are one-line errors; BSWA alone (--fam-memory 0) trains, its
# checkpoint's L(i) is the CPU's, and it generates.
# Binaries: $TRAIN_FOX (default ./train_fox) and $TRAIN_FOX_CPU (default ./train_fox_cpu).
set -u
GPU=${TRAIN_FOX:-./train_fox}
CPU=${TRAIN_FOX_CPU:-./train_fox_cpu}
PY=${PYTHON:-python3}
. "$(dirname "$0")/test_lib.sh"
SHAPE="--layers 2 --dim 128 --heads 2 --seq-len 256 --batch 4 --lr 3e-3 --warmup-tokens 10K --val-steps 2"
ARGS="--model fox-fam --fam-block 128 --fam-memory 16 --fam-window-blocks 1 $SHAPE --steps 20 --eval-every 10 --ckpt-every 10 --keep 5"

train_resume_eval_checks fox-fam

one_line_error() {  # log, exit status, expected exit status, pattern, label
    [ "$2" -eq "$3" ] && [ "$(wc -l < "$1")" -eq 1 ] && grep -q "$4" "$1"
    check $? "$5: $(head -c 200 "$1")"
}

GEN="$GPU --out $tmp/a --generate 300 --prompt Once --top-k 1 --stop-at-eot off"
$GEN > "$tmp/g1.txt" 2> "$tmp/g1.err"
st=$?
$GEN > "$tmp/g2.txt" 2> /dev/null
[ $st -eq 0 ] && head -c 4 "$tmp/g1.txt" | grep -q "^Once" && [ "$(wc -c < "$tmp/g1.txt")" -gt 300 ] &&
    grep -q "decode: 299 steps x 1 sequences" "$tmp/g1.err" && cmp -s "$tmp/g1.txt" "$tmp/g2.txt"
check $? "--generate 300 --top-k 1 from the fox-fam checkpoint (K 128: two memory updates), twice the same: $(tail -1 "$tmp/g1.err")"
$GPU --out "$tmp/a" --generate 300 --prompt Once --samples 3 --seed 2 --stop-at-eot off > "$tmp/m.txt" 2> "$tmp/m.err" &&
    grep -q "^--- sample 2 ---" "$tmp/m.txt" && grep -q "decode: 299 steps x 3 sequences" "$tmp/m.err"
check $? "--generate 300 --samples 3 from the fox-fam checkpoint: three continuations, decoded together"

$GPU --model fox-pro $SHAPE --steps 40 --sample-tokens 0 --resume --out "$tmp/a" > "$tmp/arch1.txt" 2>&1
st=$?
[ "$st" -ne 0 ] && grep -q 'arch' "$tmp/arch1.txt"
check $? "a fox-fam checkpoint resumed as fox-pro is refused: $(head -c 200 "$tmp/arch1.txt")"
$GPU --model fox-pro $SHAPE --steps 2 --eval-every 0 --sample-tokens 0 --out "$tmp/p" > /dev/null 2>&1 &&
    $GPU $ARGS --steps 4 --sample-tokens 0 --resume --out "$tmp/p" > "$tmp/arch2.txt" 2>&1
st=$?
[ "$st" -ne 0 ] && grep -q 'arch' "$tmp/arch2.txt"
check $? "a fox-pro checkpoint resumed as fox-fam is refused: $(head -c 200 "$tmp/arch2.txt")"

$GPU --model transformer-fam --fam-block 128 --fam-memory 8 --fam-window-blocks 0 $SHAPE --steps 6 --eval-every 0 \
    --sample-tokens 0 --out "$tmp/t" > "$tmp/t.txt" 2>&1
st=$?
first=$(losses_after "$tmp/t/log.jsonl" 0 | head -n 1 | cut -d' ' -f2)
last=$(losses_after "$tmp/t/log.jsonl" 0 | tail -n 1 | cut -d' ' -f2)
[ "$st" -eq 0 ] && awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }'
check $? "transformer-fam --fam-window-blocks 0 trains 6 steps (loss $first to $last)"

$GPU --model fox-fam --fam-block 64 --fam-memory 16 $SHAPE --warmup-tokens 1K --steps 2 --out "$tmp/k" > "$tmp/k.txt" 2>&1
one_line_error "$tmp/k.txt" $? 2 '^error: train_fox runs TransformerFAM with --fam-block a multiple of 128' \
    "--fam-block 64 (the CPU trainer's, not the GPU's), exit 2"

# BSWA alone (--fam-memory 0, the FAM paper's baseline), each block reading itself only (window 0): it trains, and
# its checkpoint's L(i) at twice the context agrees with train_fox_cpu's; greedy generation past two block ends.
BSWA="--model transformer-fam --fam-block 128 --fam-memory 0 --fam-window-blocks 0 $SHAPE --steps 20 --eval-every 0"
$GPU $BSWA --sample-tokens 0 --out "$tmp/w" > "$tmp/w.txt" 2>&1
st=$?
first=$(losses_after "$tmp/w/log.jsonl" 0 | head -n 1 | cut -d' ' -f2)
last=$(losses_after "$tmp/w/log.jsonl" 0 | tail -n 1 | cut -d' ' -f2)
[ "$st" -eq 0 ] && grep -q "^BSWA: blocks of 128 tokens, 0 previous blocks in the window, no memory" "$tmp/w.txt" &&
    awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 1.0) }'
check $? "transformer-fam --fam-memory 0 (BSWA alone) trains 20 steps (loss $first to $last), the start line says BSWA"
$GPU --eval-only --out "$tmp/w" --eval-seqs 4 --eval-seq-len 512 > "$tmp/wg.txt" 2>&1 && cp "$tmp/w/per_token_loss.npy" "$tmp/wg.npy" &&
    $CPU --eval-only --out "$tmp/w" --eval-seqs 4 --eval-seq-len 512 > "$tmp/wc.txt" 2>&1 &&
    $PY -c "
import numpy as np, sys
g, c = np.load('$tmp/wg.npy'), np.load('$tmp/w/per_token_loss.npy')
d = abs(g.mean() - c.mean())
print('GPU mean L %.5f, CPU %.5f, |diff| %.2e' % (g.mean(), c.mean(), d))
sys.exit(not (g.shape == c.shape == (512,) and d < 2e-2))" > "$tmp/wd.txt"
check $? "BSWA's --eval-only L(i) at twice the context, GPU and CPU on the same checkpoint: $(cat "$tmp/wd.txt")"
GEN="$GPU --out $tmp/w --generate 300 --prompt Once --top-k 1 --stop-at-eot off"
$GEN > "$tmp/wg1.txt" 2> "$tmp/wg1.err" && $GEN > "$tmp/wg2.txt" 2> /dev/null &&
    grep -q "decode: 299 steps x 1 sequences" "$tmp/wg1.err" && cmp -s "$tmp/wg1.txt" "$tmp/wg2.txt"
check $? "--generate 300 --top-k 1 from the BSWA checkpoint (two block ends), twice the same: $(tail -1 "$tmp/wg1.err")"

finish
