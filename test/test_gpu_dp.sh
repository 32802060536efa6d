#!/bin/sh
# Data-parallel checks of ./train_fox (part of `make test-gpu`; needs 2 GPUs and the MPI build): 2 ranks
# with micro-batch B train like 1 rank with 2 micro-batches of B (the same sequences per step, rank r taking
# windows r, r+2, ...; the gradient sums round differently: NCCL's average against fp32 accumulation over
# micro-batches, 7e-6 relative in the losses on 2 H200s), bitwise repeatably, with ZeRO-1 as without; a
# checkpoint written by 2 ranks resumes to the same losses as not stopping; --eval-only on 2 ranks gives the
# L(i) of 1 rank; more ranks than GPUs fail with one line.
# Binary: $TRAIN_FOX (default ./train_fox).
set -u
GPU=${TRAIN_FOX:-./train_fox}
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c GPU)
if [ "$ngpu" -lt 2 ]; then
    echo "SKIP data parallel: $ngpu GPU(s) here, 2 needed"
    echo "0 passed, 0 failed"
    exit 0
fi
if ! ldd "$GPU" | grep -q libnccl; then
    echo "FAIL $GPU was built without MPI/NCCL (install libopenmpi-dev openmpi-bin and rebuild)"
    echo "0 passed, 1 failed"
    exit 1
fi
# Open MPI refuses root without these; NVLink multicast stays off (the device pages say why).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
MPIRUN="mpirun --bind-to none"
. "$(dirname "$0")/test_lib.sh"
ARGS="--model fox-pro --layers 2 --dim 128 --heads 2 --seq-len 256 --batch 2 --steps 6 --lr 3e-3 --warmup-tokens 2K --eval-every 0 --sample-tokens 0 --ckpt-every 3 --keep 5"

$MPIRUN -np 2 $GPU $ARGS --out "$tmp/dp2" > "$tmp/dp2.txt" 2>&1
check $? "mpirun -np 2 train_fox trains 6 steps ($(grep -c '^step .*tok/s' "$tmp/dp2.txt") step lines, from rank 0 only)"
grep -q "x 2 ranks" "$tmp/dp2.txt"
check $? "the run reports 2 ranks"
$GPU $ARGS --total-batch-tokens 1024 --out "$tmp/dp1" > "$tmp/dp1.txt" 2>&1
check $? "1 rank with 2 micro-batches (--total-batch-tokens 1024)"
losses_after "$tmp/dp1/log.jsonl" 0 > "$tmp/l1"
losses_after "$tmp/dp2/log.jsonl" 0 > "$tmp/l2"
diff=$(paste "$tmp/l1" "$tmp/l2" | awk '{ d = $2 - $4; if (d < 0) d = -d; r = d / $2; if (r > m) m = r } END { printf "%.2e", m + 0 }')
[ "$(wc -l < "$tmp/l1")" -eq 6 ] && [ "$(wc -l < "$tmp/l2")" -eq 6 ] && awk -v m="$diff" 'BEGIN { exit !(m < 1e-4) }'
check $? "2 ranks x batch 2 = 1 rank x 2 micro-batches: 6 losses within $diff relative (tol 1e-4)"

$MPIRUN -np 2 $GPU $ARGS --out "$tmp/dp2b" > "$tmp/dp2b.txt" 2>&1
losses_after "$tmp/dp2b/log.jsonl" 0 > "$tmp/l2b"
cmp -s "$tmp/l2" "$tmp/l2b" && cmp -s "$tmp/dp2/ckpt_00000006/model.bin" "$tmp/dp2b/ckpt_00000006/model.bin"
check $? "a second 2-rank run has bitwise the same losses and final weights"

# ZeRO-1 (--zero 1, the default): each rank keeps and updates half of the AdamW state; the update is the
# same arithmetic per element, so --zero 0 (every rank updates everything) gives bitwise the same run.
$MPIRUN -np 2 $GPU $ARGS --zero 0 --out "$tmp/dp2z0" > "$tmp/dp2z0.txt" 2>&1
losses_after "$tmp/dp2z0/log.jsonl" 0 > "$tmp/l2z0"
cmp -s "$tmp/l2" "$tmp/l2z0" && cmp -s "$tmp/dp2/ckpt_00000006/model.bin" "$tmp/dp2z0/ckpt_00000006/model.bin"
check $? "ZeRO-1 and --zero 0 give bitwise the same losses and final weights"
s0=$(wc -c < "$tmp/dp2/ckpt_00000006/state_00000.bin")
s1=$(wc -c < "$tmp/dp2/ckpt_00000006/state_00001.bin")
sf=$(wc -c < "$tmp/dp2z0/ckpt_00000006/state_00000.bin")
[ $((2 * s0)) -lt $((sf + sf / 10)) ] && [ $((2 * s1)) -lt $((sf + sf / 10)) ]
check $? "ZeRO-1: each rank's state file holds its half of the AdamW moments ($s0 and $s1 bytes, $sf without ZeRO)"

mkdir -p "$tmp/dp2r" && cp -r "$tmp/dp2/ckpt_00000003" "$tmp/dp2r/"
$MPIRUN -np 2 $GPU $ARGS --resume --out "$tmp/dp2r" > "$tmp/dp2r.txt" 2>&1
losses_after "$tmp/dp2/log.jsonl" 3 > "$tmp/la"
losses_after "$tmp/dp2r/log.jsonl" 3 > "$tmp/lb"
cmp -s "$tmp/la" "$tmp/lb" && [ "$(wc -l < "$tmp/lb")" -eq 3 ] && [ -f "$tmp/dp2/ckpt_00000003/state_00001.bin" ]
check $? "2 ranks resume their step-3 checkpoint (a state file per rank) to bitwise the same steps 4-6"

EV="--eval-only --val data/val.bin --eval-seqs 5 --eval-seq-len 512 --init $tmp/dp2/ckpt_00000006/model.bin"
$MPIRUN -np 2 $GPU $EV --out "$tmp/ev2" > "$tmp/ev2.txt" 2>&1
s2=$?
$GPU $EV --out "$tmp/ev1" > "$tmp/ev1.txt" 2>&1
s1=$?
cmp -s "$tmp/ev1/per_token_loss.npy" "$tmp/ev2/per_token_loss.npy"
check $((s1 + s2 + $?)) "--eval-only on 2 ranks (sequences r, r+2, ...) gives bitwise the L(i) of 1 rank"

np=$((ngpu + 1))
$MPIRUN --oversubscribe -np $np $GPU $ARGS --steps 1 --out "$tmp/toomany" > "$tmp/toomany.txt" 2>&1
st=$?
msg=$(grep -m1 "error" "$tmp/toomany.txt")
[ $st -ne 0 ] && echo "$msg" | grep -q "one rank per GPU"
check $? "$np ranks on $ngpu GPUs fail with one line ($msg)"

finish
