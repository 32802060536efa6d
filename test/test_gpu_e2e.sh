#!/bin/sh
# End-to-end checks of ./train_fox on a GPU machine (part of `make test-gpu`): resuming gives bitwise
# the same losses as not stopping, a GPU checkpoint resumes in train_fox_cpu, --eval-only writes L(i)
# that train_fox_cpu reproduces from the same checkpoint, bad input fails with one line, ACP pruning
# leaves the losses where they were, and a run too large for the device's memory fails before allocating.
# Binaries: $TRAIN_FOX (default ./train_fox) and $TRAIN_FOX_CPU (default ./train_fox_cpu).
set -u
GPU=${TRAIN_FOX:-./train_fox}
CPU=${TRAIN_FOX_CPU:-./train_fox_cpu}
PY=${PYTHON:-python3}
. "$(dirname "$0")/test_lib.sh"
ARGS="--model fox-pro --layers 2 --dim 128 --heads 2 --seq-len 256 --batch 4 --steps 20 --lr 3e-3 --warmup-tokens 10K --eval-every 10 --val-steps 2 --ckpt-every 10 --keep 5"

train_resume_eval_checks fox-pro

$GPU $ARGS --dim 256 --heads 4 --resume --out "$tmp/a" > "$tmp/bad.txt" 2>&1
st=$?
[ "$st" -ne 0 ] && [ "$(wc -l < "$tmp/bad.txt")" -eq 1 ] && grep -q '^error: .*d_model' "$tmp/bad.txt"
check $? "a checkpoint of another config: $(head -c 150 "$tmp/bad.txt")"
$GPU $ARGS --heads 3 --dim 96 --out "$tmp/h" > "$tmp/bad2.txt" 2>&1
st=$?
[ "$st" -ne 0 ] && [ "$(wc -l < "$tmp/bad2.txt")" -eq 1 ] && grep -q '^error: ' "$tmp/bad2.txt"
check $? "an unsupported head_dim: $(head -c 150 "$tmp/bad2.txt")"

# ACP (--acp 1): fixed gates of timescales 3 and 10 tokens (heads 0 and 1) at T = 1024, so the tiles 2 and 4
# or more blocks below the diagonal fall under the threshold (each tile's bias at least 5 from it, in log
# space). Pruning changes the losses by less than the e^-10 bound (plus bf16 rounding), the GPU's pruned run
# agrees with the CPU's as any GPU run does, and so do the per-(layer, head) pruned fractions of log.jsonl
# ("acp_pruned"): within one tile of the 72 of a (layer, head) (the two c differ by rounding).
AARGS="--model fox-pro --forget-gate fixed --t-min 3 --t-max 10 --layers 2 --dim 128 --heads 2 --seq-len 1024 --batch 2 --steps 5 --lr 3e-3 --warmup-tokens 2K --eval-every 0 --sample-tokens 0"
$GPU $AARGS --acp 0 --out "$tmp/acp0" > "$tmp/acp0.txt" 2>&1 && $GPU $AARGS --acp 1 --out "$tmp/acp1" > "$tmp/acp1.txt" 2>&1 &&
    $CPU $AARGS --acp 1 --out "$tmp/acpc" > "$tmp/acpc.txt" 2>&1
check $? "train_fox --acp 0, --acp 1 and train_fox_cpu --acp 1 train 5 steps at T = 1024"
losses_after "$tmp/acp0/log.jsonl" 0 > "$tmp/la0"
losses_after "$tmp/acp1/log.jsonl" 0 > "$tmp/la1"
losses_after "$tmp/acpc/log.jsonl" 0 > "$tmp/lac"
d01=$(paste "$tmp/la0" "$tmp/la1" | awk '{ d = $2 - $4; if (d < 0) d = -d; d /= $2; if (d > m) m = d } END { printf "%.1e", m + 0 }')
d1c=$(paste "$tmp/la1" "$tmp/lac" | awk '{ d = $2 - $4; if (d < 0) d = -d; if (d > m) m = d } END { printf "%.1e", m + 0 }')
[ "$(wc -l < "$tmp/la1")" -eq 5 ] && awk -v a="$d01" -v b="$d1c" 'BEGIN { exit !(a < 1e-4 && b < 1e-2) }'
check $? "ACP: GPU losses with and without pruning within $d01 relative (tol 1e-4), GPU vs CPU with pruning within $d1c (tol 1e-2)"
$PY -c "
import json, sys
def mats(path):
    return [r['acp_pruned'] for r in map(json.loads, open(path)) if 'acp_pruned' in r]
g, c = mats('$tmp/acp1/log.jsonl'), mats('$tmp/acpc/log.jsonl')
d = max(abs(x - y) for a, b in zip(g, c) for ra, rb in zip(a, b) for x, y in zip(ra, rb))
print('%d steps of 2 x 2; GPU %s, CPU %s; max |diff| %.4f' % (len(g), g[-1], c[-1], d))
sys.exit(not (len(g) == len(c) == 5 and all(len(a) == 2 and len(r) == 2 for a in g + c for r in a) and d <= 1 / 72 + 1e-4
              and g[0][0][0] > g[0][0][1] > 0))"
check $? "ACP per (layer, head): the GPU's and the CPU's acp_pruned matrices agree within one tile (1/72)"

# Device memory: a run that does not fit fails before allocating, in one line with the need and the remedy
# (FOX_TEST_DEVICE_MEMORY caps the usable bytes); --eval-only allocates only what a forward needs.
FOX_TEST_DEVICE_MEMORY=1000000000 $GPU $ARGS --seq-len 16384 --batch 4 --steps 1 --val '' --out "$tmp/oom" > "$tmp/oom.txt" 2> "$tmp/oom.err"
st=$?
[ "$st" -eq 1 ] && [ "$(wc -l < "$tmp/oom.err")" -eq 1 ] && grep -q '^error: this run needs .* GiB of device memory .*--recompute 2.*--batch' "$tmp/oom.err" &&
    [ ! -d "$tmp/oom/ckpt_00000001" ]
check $? "a training run over a 1 GB memory cap: $(cat "$tmp/oom.err")"
FOX_TEST_DEVICE_MEMORY=3000000000 $GPU --eval-only --out "$tmp/a" --eval-seqs 1 --eval-seq-len 16384 > "$tmp/ev16.txt" 2>&1
check $? "--eval-only at 16384 under a 3 GB cap (forward-only buffers)"
FOX_TEST_DEVICE_MEMORY=1000000000 $GPU --eval-only --out "$tmp/a" --eval-seqs 1 --eval-seq-len 16384 > /dev/null 2> "$tmp/ev16.err"
st=$?
[ "$st" -eq 1 ] && [ "$(wc -l < "$tmp/ev16.err")" -eq 1 ] && grep -q '^error: this run needs .*shorter --eval-seq-len than 16384' "$tmp/ev16.err"
check $? "--eval-only over a 1 GB cap: $(cat "$tmp/ev16.err")"

finish
