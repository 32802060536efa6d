#!/bin/sh
# Gradient accumulation at scale: `sh test/test_accum.sh [MPI_BIN]` (default ./train_fox_cpu_mpi, the CPU
# trainer's MPI build; skipped when it is not built). --total-batch-tokens with R ranks x M micro-batches,
# R, M in {1, 2, 4}, each rank's --batch 16/(R*M), trains like 1 rank with --batch 16 and no accumulation:
#   - the same sequences in each step: rank r of R takes the epoch's windows r, r+R, r+2R, ... (dataloader.h),
#     micro-batch m of the step the next B of them, so step s (from 0) reads windows 16s + R*(m*B + j) + r,
#     j < B: for every (R, M) exactly the windows 16s .. 16s+15;
#   - what differs is only the order of the fp32 sums (micro-batch gradients scaled by 1/M and added, then
#     the mean over ranks): over the 3 steps the losses agree within 1e-6 relative (measured <= 4.4e-9), the
#     gradient norms within 1e-5 (<= 2.1e-7), the final weights within 1e-4 relative per tensor
#     (|w - w_ref| / |w_ref|, 2-norms; <= 5.6e-6) and 1e-4 element-wise (absolute; <= 1.8e-5). The weights are
#     O(1e-2) and one step moves an element by up to lr = 3e-3: AdamW's g / (sqrt(v) + eps) magnifies the
#     rounding of a gradient near eps = 1e-8, so a few elements differ far more than the rest (already after
#     step 1), while wrong data or a wrong gradient scale moves whole tensors by O(lr);
#   - a --total-batch-tokens that is not a multiple of batch*seq-len*ranks is refused before any step (4 ranks
#     and 1): its error, a non-zero exit, no run directory; with 1 rank exactly one line on stderr.
# Environment: PYTHON (with numpy and torch, for train_fox.py's model.bin reader; default python3).
set -u
BIN=${1:-./train_fox_cpu_mpi}
PY=${PYTHON:-python3}
case "$BIN" in */*) ;; *) BIN=./$BIN ;; esac
if [ ! -x "$BIN" ] || ! command -v mpirun > /dev/null 2>&1; then
    echo "SKIP gradient accumulation: no MPI build of the CPU trainer ($BIN) or no mpirun"
    echo "0 passed, 0 failed"
    exit 0
fi
. "$(dirname "$0")/test_lib.sh"
if ! ldd "$BIN" | grep -q libmpi; then
    check 1 "$BIN is linked with MPI (make train_fox_cpu_mpi)"
    finish
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
MPIRUN="mpirun --oversubscribe --bind-to none"
SEQS=16
T=32
STEPS=3
ARGS="--model fox-pro --layers 2 --dim 64 --heads 2 --seq-len $T --steps $STEPS --lr 3e-3 --warmup-tokens 512 --eval-every 0 --sample-tokens 0"

# ---- every (R, M); (1, 1) is the reference
for R in 1 2 4; do
    for M in 1 2 4; do
        B=$((SEQS / (R * M)))
        TB="--total-batch-tokens $((SEQS * T))"
        [ $R$M = 11 ] && TB=""  # the reference: the flag's default, no accumulation
        $MPIRUN -np $R $BIN $ARGS --batch $B $TB --out "$tmp/r${R}m$M" > "$tmp/r${R}m$M.txt" 2>&1
        st=$?
        grep -q "^model .* $((SEQS * T)) tokens/step = $B x $T x $M accum x $R ranks," "$tmp/r${R}m$M.txt" &&
            [ -f "$tmp/r${R}m$M/ckpt_0000000$STEPS/model.bin" ]
        check $((st + $?)) "$R rank(s) x $M micro-batch(es) of $B sequences train $STEPS steps ($(grep -c '^step .*tok/s' "$tmp/r${R}m$M.txt") step lines)"
        rm -f "$tmp/r${R}m$M"/ckpt_*/state_*.bin  # the AdamW moments, 50 MB a rank: only the weights are compared
    done
done

# ---- each run against the reference: "R M loss norm wrel wabs" (maximum relative differences of the logged
# losses and gradient norms, of the weights per tensor in the 2-norm, and the largest element-wise one)
$PY - "$tmp" "$STEPS" > "$tmp/diffs.txt" 2> "$tmp/diffs.err" << 'EOF'
import importlib.util, json, sys
import numpy as np
spec = importlib.util.spec_from_file_location("tf", "train_fox.py")
tf = importlib.util.module_from_spec(spec); spec.loader.exec_module(tf)
tmp, steps = sys.argv[1], int(sys.argv[2])
def run(name):
    log = [json.loads(line) for line in open("%s/%s/log.jsonl" % (tmp, name))]
    log = [e for e in log if "loss" in e]
    assert [e["step"] for e in log] == list(range(1, steps + 1)), name
    cfg, params = tf.load_model_bin("%s/%s/ckpt_%08d/model.bin" % (tmp, name, steps))
    return log, cfg, params
rlog, rcfg, rw = run("r1m1")
rel = lambda a, b: abs(a - b) / abs(b)
for R in (1, 2, 4):
    for M in (1, 2, 4):
        log, cfg, w = run("r%dm%d" % (R, M))
        assert cfg == rcfg and w.keys() == rw.keys()
        dl = max(rel(a["loss"], b["loss"]) for a, b in zip(log, rlog))
        dn = max(rel(a["grad_norm"], b["grad_norm"]) for a, b in zip(log, rlog))
        d = {k: w[k].astype(np.float64) - rw[k] for k in rw}
        dw = max(np.linalg.norm(d[k]) / np.linalg.norm(rw[k].astype(np.float64)) for k in rw)
        da = max(abs(d[k]).max() for k in rw)
        print("%d %d %.2e %.2e %.2e %.2e" % (R, M, dl, dn, dw, da))
EOF
check $? "the logs and final weights of the 9 runs are read ($(wc -l < "$tmp/diffs.txt") compared)$(head -c 300 "$tmp/diffs.err")"
while read -r R M dl dn dw da; do
    [ "$R$M" = 11 ] && continue
    awk -v a="$dl" -v b="$dn" 'BEGIN { exit !(a < 1e-6 && b < 1e-5) }'
    check $? "$R x $M = 1 x 1: losses within $dl relative (tol 1e-6), gradient norms within $dn (tol 1e-5)"
    awk -v a="$dw" -v b="$da" 'BEGIN { exit !(a < 1e-4 && b < 1e-4) }'
    check $? "$R x $M = 1 x 1: final weights within $dw relative per tensor (tol 1e-4), $da element-wise (tol 1e-4)"
done < "$tmp/diffs.txt"
max() { sort -g | tail -n 1; }
echo "largest: losses $(cut -d' ' -f3 "$tmp/diffs.txt" | max), gradient norms $(cut -d' ' -f4 "$tmp/diffs.txt" | max), weights per tensor $(cut -d' ' -f5 "$tmp/diffs.txt" | max), element-wise $(cut -d' ' -f6 "$tmp/diffs.txt" | max)"

# ---- a step that does not divide into batch*seq-len*ranks: 576 tokens = 18 sequences of 32, a multiple of
# 2 ranks' 64 but not of 4 ranks' 128. Every rank prints the error; mpirun passes on their stderr as it comes
# and ends the job at the first non-zero exit, so a rank's line can be cut into by another's or be missing
# (fox_vfatal writes "error: ", the message and the newline separately): counted, not required.
$MPIRUN -np 4 $BIN $ARGS --batch 1 --total-batch-tokens 576 --out "$tmp/bad4" > "$tmp/bad4.out" 2> "$tmp/bad4.err"
st=$?
text="--total-batch-tokens 576 is not a multiple of batch\*seq-len\*ranks = 128"
intact=$(grep -c "^error: $text\$" "$tmp/bad4.err")
[ $st -ne 0 ] && grep -q -e "$text" "$tmp/bad4.err" && ! grep error "$tmp/bad4.err" | grep -v -e "$text" | grep -q . &&
    ! grep -q '^step ' "$tmp/bad4.out" && [ ! -e "$tmp/bad4" ]
check $? "4 ranks, --total-batch-tokens 576: exit $st before any step, no run directory, no other error than \"$(echo "$text" | tr -d '\\')\" ($intact of the 4 ranks' lines intact)"
$BIN $ARGS --batch 1 --total-batch-tokens 48 --out "$tmp/bad1" > "$tmp/bad1.out" 2> "$tmp/bad1.err"
st=$?
[ $st -ne 0 ] && [ "$(wc -l < "$tmp/bad1.err")" -eq 1 ] && grep -q "^error: .*48 is not a multiple of batch\*seq-len\*ranks = 32" "$tmp/bad1.err" &&
    ! [ -s "$tmp/bad1.out" ] && [ ! -e "$tmp/bad1" ]
check $? "1 rank, --total-batch-tokens 48: exit $st, stderr exactly one line ($(cat "$tmp/bad1.err"))"

finish
