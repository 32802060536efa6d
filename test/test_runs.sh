#!/bin/sh
# Runs that survive, end to end through a trainer binary: `sh test/test_runs.sh BIN [MPI_BIN]`,
# with ./train_fox_cpu (and ./train_fox_cpu_mpi) in `make test`, ./train_fox (twice with 2 GPUs) in
# `make test-gpu`.
#   - kill -9 at random moments, several inside checkpoint writes (test hook FOX_TEST_CKPT_STALL_MS holds each
#     write open 100 ms between its state and weights files): every resume ends bitwise equal to an
#     uninterrupted run, each step logged once;
#   - SIGTERM / SIGUSR1: the current step finishes, a checkpoint is written, exit 75, the resume is bitwise
#     the uninterrupted run; a second SIGINT exits at once;
#   - a NaN gradient (test hook FOX_TEST_NONFINITE): the step is skipped, logged as valid JSON, and the run
#     goes on exactly as if that step's batches had been thrown away; --max-bad-steps in a row stop the run
#     with exit 3 and only finite checkpoints;
#   - one run per --out (lock), no fresh run over an earlier one without --overwrite, the log cut back on
#     resume;
#   - flags: ranges, booleans, --eval-only=true, the warmup warning; validation data checked at start-up;
#   - checkpoints: a failed write (file size limit) leaves no temporary and keeps the last good checkpoint;
#     checksums, header fields, non-finite weights;
#   - with MPI_BIN, 2 ranks under mpirun: both skip the NaN step alike, SIGUSR1 stops both at one step.
# Environment: PYTHON (with numpy; default python3).
set -u
BIN=${1:-./train_fox_cpu}
PY=${PYTHON:-python3}
. "$(dirname "$0")/test_lib.sh"
SHAPE=$(trainer_shape "$BIN")
case "$BIN" in *_cpu*) SIGSTEPS=30 ;; *) SIGSTEPS=400 ;; esac
ARGS="$SHAPE --seq-len 64 --batch 2 --lr 3e-3 --warmup-tokens 512 --sample-tokens 0 --val-steps 2"

# The step lines of a log ("step loss"), and whether every line is JSON.
losses() { losses_after "$1" 0; }
json_ok() {
    $PY -c "import json, sys
for line in open(sys.argv[1]): json.loads(line)" "$1" 2> /dev/null
}
# stderr is exactly one line that starts with "error:" and contains $2.
one_error() {
    [ "$(wc -l < "$1")" -eq 1 ] && grep -q "^error: .*$2" "$1"
}
# Every model.bin under a directory holds finite weights (train_fox.py reads them, checksum included).
all_finite() {
    $PY - "$1" << 'EOF'
import glob, sys, importlib.util
import numpy as np
spec = importlib.util.spec_from_file_location("tf", "train_fox.py")
tf = importlib.util.module_from_spec(spec); spec.loader.exec_module(tf)
files = glob.glob(sys.argv[1] + "/ckpt_*/model.bin")
ok = all(np.isfinite(a).all() for f in files for a in tf.load_model_bin(f)[1].values())
sys.exit(0 if files and ok else 1)
EOF
}
# Once file $2 holds pattern $3 on $5 lines (default 1), signal $4 to process $1, then its exit status in st and
# the seconds from the signal to the exit in waited.
stop_when() {
    n=0
    while [ $n -lt 600 ] && [ "$(cat "$2" 2> /dev/null | grep -c "$3")" -lt "${5:-1}" ]; do sleep 0.05; n=$((n + 1)); done
    t0=$(date +%s)
    kill "-$4" "$1"
    wait "$1"
    st=$?
    waited=$(($(date +%s) - t0))
}
# Sets int32 word $3 of file $1's header to $2 and recomputes the file's CRC-32 (a consistent hand edit).
patch_word() {
    $PY - "$1" "$2" "$3" << 'EOF'
import struct, sys, zlib
path, value, at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
data = bytearray(open(path, "rb").read())
struct.pack_into("<i", data, 4 * at, value)
struct.pack_into("<I", data, 4 * 255, 0)
struct.pack_into("<I", data, 4 * 255, zlib.crc32(bytes(data)))
open(path, "wb").write(bytes(data))
EOF
}

# ---- the uninterrupted reference: 12 steps, a checkpoint after each
t0=$(date +%s.%N)
$BIN $ARGS --steps 12 --ckpt-every 1 --keep 2 --eval-every 4 --out "$tmp/ref" > "$tmp/ref.txt" 2>&1
check $? "reference run of 12 steps"
t1=$(date +%s.%N)

# ---- kill -9 at random moments until the run is done
kills=0
in_write=0
tries=0
while [ $tries -lt 200 ] && { [ $kills -lt 10 ] || [ $in_write -lt 3 ]; }; do
    tries=$((tries + 1))
    FOX_TEST_CKPT_STALL_MS=100 $BIN $ARGS --steps 12 --ckpt-every 1 --keep 2 --eval-every 4 --resume --out "$tmp/kill" > "$tmp/kill.txt" 2>&1 &
    pid=$!
    sleep "$(awk -v s="$tries" -v a="$t0" -v b="$t1" 'BEGIN { srand(s); printf "%.2f", (b - a) * (0.1 + 0.9 * rand()) }')"
    if kill -9 $pid 2> /dev/null; then
        kills=$((kills + 1))
        ls -d "$tmp"/kill/.tmp_ckpt_* > /dev/null 2>&1 && in_write=$((in_write + 1))
    fi
    wait $pid 2> /dev/null
    [ -d "$tmp/kill/ckpt_00000012" ] && rm -rf "$tmp/kill"  # finished before a kill: start over
done
[ $kills -ge 10 ] && [ $in_write -ge 3 ]
check $? "kill -9 $kills times ($in_write inside a checkpoint write)"
$BIN $ARGS --steps 12 --ckpt-every 1 --keep 2 --eval-every 4 --resume --out "$tmp/kill" > "$tmp/kill.txt" 2>&1
check $? "the last resume finishes the run"
losses "$tmp/ref/log.jsonl" > "$tmp/l_ref"
losses "$tmp/kill/log.jsonl" > "$tmp/l_kill"
cmp -s "$tmp/l_ref" "$tmp/l_kill" && [ "$(wc -l < "$tmp/l_ref")" -eq 12 ]
check $? "after the kills: the 12 losses bitwise those of the uninterrupted run, each step logged once ($(wc -l < "$tmp/l_kill") lines)"
cmp -s "$tmp/ref/ckpt_00000012/model.bin" "$tmp/kill/ckpt_00000012/model.bin" &&
    cmp -s "$tmp/ref/ckpt_00000012/state_00000.bin" "$tmp/kill/ckpt_00000012/state_00000.bin"
check $? "and the same final weights, moments and loader state"
json_ok "$tmp/kill/log.jsonl" && [ "$(grep -c val_loss "$tmp/kill/log.jsonl")" -eq 3 ]
check $? "the resumed log is valid JSON with one validation line per evaluation"

# ---- stop signals
$BIN $ARGS --steps $SIGSTEPS --eval-every 0 --out "$tmp/sref" > /dev/null 2>&1
check $? "reference run of $SIGSTEPS steps"
$BIN $ARGS --steps $SIGSTEPS --eval-every 0 --out "$tmp/sig" > "$tmp/sig.txt" 2>&1 &
pid=$!
n=0
while [ $n -lt 600 ] && [ "$(cat "$tmp/sig/log.jsonl" 2> /dev/null | grep -c '"loss"')" -lt 2 ]; do sleep 0.05; n=$((n + 1)); done
kill -TERM $pid
wait $pid
st=$?
at=$(sed -n 's/^stopped by SIGTERM at step \([0-9]*\): resume with --resume.*/\1/p' "$tmp/sig.txt")
[ $st -eq 75 ] && [ -n "$at" ] && [ -d "$tmp/sig/ckpt_$(printf %08d "${at:-0}")" ] && [ "$at" -lt $SIGSTEPS ]
check $? "SIGTERM: exit $st (75), \"stopped by SIGTERM at step $at\", a checkpoint at that step"
$BIN $ARGS --steps $SIGSTEPS --eval-every 0 --resume --out "$tmp/sig" > /dev/null 2>&1
check $? "the stopped run resumes"
losses "$tmp/sref/log.jsonl" > "$tmp/l_sref"
losses "$tmp/sig/log.jsonl" > "$tmp/l_sig"
cmp -s "$tmp/l_sref" "$tmp/l_sig" && cmp -s "$tmp/sref/ckpt_$(printf %08d $SIGSTEPS)/model.bin" "$tmp/sig/ckpt_$(printf %08d $SIGSTEPS)/model.bin"
check $? "and ends bitwise equal to the uninterrupted run (losses and weights)"
$BIN $ARGS --steps $SIGSTEPS --ckpt-every 1 --keep 2 --eval-every 0 --out "$tmp/inw" > "$tmp/inw.txt" 2>&1 &
pid=$!
n=0
while [ $n -lt 3000 ] && ! ls -d "$tmp"/inw/.tmp_ckpt_* > /dev/null 2>&1; do sleep 0.002; n=$((n + 1)); done
kill -TERM $pid
wait $pid
st=$?
at=$(sed -n 's/^stopped by SIGTERM at step \([0-9]*\):.*/\1/p' "$tmp/inw.txt")
[ $st -eq 75 ] && [ -n "$at" ] && [ -f "$tmp/inw/ckpt_$(printf %08d "${at:-0}")/state_00000.bin" ] &&
    ! ls -d "$tmp"/inw/.tmp_ckpt_* > /dev/null 2>&1
check $? "SIGTERM while a checkpoint is being written: the write finishes, exit $st (75) at step $at, no temporary left"
$BIN $ARGS --steps $SIGSTEPS --ckpt-every 1 --keep 2 --eval-every 0 --resume --out "$tmp/inw" > /dev/null 2>&1
losses "$tmp/inw/log.jsonl" > "$tmp/l_inw"
cmp -s "$tmp/l_sref" "$tmp/l_inw"
check $? "and its resume ends bitwise equal to the uninterrupted run"
$BIN $ARGS --steps $SIGSTEPS --eval-every 0 --out "$tmp/usr1" > "$tmp/usr1.txt" 2>&1 &
pid=$!
n=0
while [ $n -lt 600 ] && [ ! -s "$tmp/usr1/log.jsonl" ]; do sleep 0.05; n=$((n + 1)); done
kill -USR1 $pid
wait $pid
st=$?
[ $st -eq 75 ] && grep -q '^stopped by SIGUSR1 at step' "$tmp/usr1.txt"
check $? "SIGUSR1 (Slurm's --signal): exit $st (75) with a checkpoint"
$BIN $SHAPE --seq-len 64 --batch 64 --lr 3e-3 --warmup-tokens 512 --sample-tokens 0 --steps $SIGSTEPS --eval-every 0 --out "$tmp/int" > "$tmp/int.txt" 2>&1 &  # long steps
pid=$!
n=0
while [ $n -lt 600 ] && [ ! -s "$tmp/int/log.jsonl" ]; do sleep 0.05; n=$((n + 1)); done
kill -INT $pid
n=0
while [ $n -lt 600 ] && ! grep -q 'SIGINT again to quit at once' "$tmp/int.txt"; do sleep 0.01; n=$((n + 1)); done
kill -INT $pid
wait $pid
st=$?
[ $st -eq 130 ]
check $? "a second SIGINT exits at once (exit $st, 130)"
$BIN $ARGS --steps $SIGSTEPS --eval-every 0 > "$tmp/noout.txt" 2>&1 &
pid=$!
n=0
while [ $n -lt 600 ] && ! grep -q '^step ' "$tmp/noout.txt"; do sleep 0.05; n=$((n + 1)); done
kill -TERM $pid
wait $pid
st=$?
[ $st -eq 143 ] && grep -q '^stopped by SIGTERM at step [0-9]* (no --out: nothing saved)' "$tmp/noout.txt"
check $? "SIGTERM without --out: exit $st (143: nothing to resume), says nothing was saved"

# ---- the non-finite guard
FOX_TEST_NONFINITE=3 $BIN $ARGS --steps 6 --ckpt-every 2 --eval-every 0 --keep 5 --out "$tmp/nan" > "$tmp/nan.txt" 2>&1
st=$?
[ $st -eq 0 ] && grep -q '^skipped step 3: non-finite grad norm' "$tmp/nan.txt" &&
    grep -q '^{"step": 3, "skipped": "non-finite grad norm", "loss": [0-9].*"grad_norm": null, "skipped_steps": 1}$' "$tmp/nan/log.jsonl"
check $? "a NaN gradient at step 3: skipped, logged (grad_norm null), exit $st"
json_ok "$tmp/nan/log.jsonl" && [ "$(losses "$tmp/nan/log.jsonl" | wc -l)" -eq 6 ] &&
    grep '^{"step": 6, "loss"' "$tmp/nan/log.jsonl" | grep -q '"skipped_steps": 1}'
check $? "its log is valid JSON, 6 applied steps, the skip counted"
FOX_TEST_DISCARD_BATCH=3 $BIN $ARGS --steps 6 --ckpt-every 2 --eval-every 0 --keep 5 --out "$tmp/drop" > /dev/null 2>&1
losses "$tmp/nan/log.jsonl" > "$tmp/l_nan"
losses "$tmp/drop/log.jsonl" > "$tmp/l_drop"
cmp -s "$tmp/l_nan" "$tmp/l_drop" && cmp -s "$tmp/nan/ckpt_00000006/model.bin" "$tmp/drop/ckpt_00000006/model.bin"
check $? "the run goes on bitwise as one that threw step 3's batches away (losses and weights)"
mkdir -p "$tmp/nanres" && cp -r "$tmp/nan/ckpt_00000004" "$tmp/nanres/"
$BIN $ARGS --steps 6 --ckpt-every 2 --eval-every 0 --keep 5 --resume --out "$tmp/nanres" > /dev/null 2>&1
losses_after "$tmp/nan/log.jsonl" 4 > "$tmp/l_nan4"
losses "$tmp/nanres/log.jsonl" > "$tmp/l_nanres"
cmp -s "$tmp/l_nan4" "$tmp/l_nanres" && grep '^{"step": 6, "loss"' "$tmp/nanres/log.jsonl" | grep -q '"skipped_steps": 1}' &&
    cmp -s "$tmp/nan/ckpt_00000006/state_00000.bin" "$tmp/nanres/ckpt_00000006/state_00000.bin"
check $? "a resume after the skip is bitwise the same run (the skip count is checkpointed)"
FOX_TEST_NONFINITE=3:100 $BIN $ARGS --steps 8 --ckpt-every 1 --eval-every 0 --keep 5 --max-bad-steps 4 --out "$tmp/div" > "$tmp/div.txt" 2> "$tmp/div.err"
st=$?
[ $st -eq 3 ] && one_error "$tmp/div.err" "4 steps in a row had a non-finite grad norm.*stops at step 2.*ckpt_00000002" &&
    [ "$(grep -c '^skipped step 3' "$tmp/div.txt")" -eq 4 ] && [ ! -d "$tmp/div/ckpt_00000003" ]
check $? "--max-bad-steps 4: exit $st (3) after 4 skips, one line: $(cat "$tmp/div.err")"
all_finite "$tmp/div" && json_ok "$tmp/div/log.jsonl"
check $? "every checkpoint it left is finite, its log valid JSON"
$BIN $SHAPE --seq-len 128 --batch 4 --warmup-tokens 2K --eval-every 10 --sample-tokens 0 --lr 1e3 --steps 20 --ckpt-every 5 --out "$tmp/lr" > "$tmp/lr.txt" 2> "$tmp/lr.err"
st=$?
{ [ $st -eq 0 ] || [ $st -eq 3 ]; } && json_ok "$tmp/lr/log.jsonl" && { [ ! -d "$tmp/lr/ckpt_00000005" ] || all_finite "$tmp/lr"; }
check $? "--lr 1e3 (the issue's case): exit $st (0 or 3), log valid JSON, no non-finite checkpoint ($(grep -c '^skipped' "$tmp/lr.txt") steps skipped)"

# ---- the loss-spike guard: replaying the log's losses through the rule (docs/model.md §2) must give
# exactly the steps it skipped; the statistics are checkpointed, so a resume makes the same decisions
SPIKE="$SHAPE --seq-len 64 --batch 2 --lr 0.03 --warmup-tokens 512 --sample-tokens 0 --eval-every 0 --steps 40 --spike-z 0.3 --max-bad-steps 100 --ckpt-every 10 --keep 5"
$BIN $SPIKE --out "$tmp/spike" > "$tmp/spike.txt" 2>&1
st=$?
spikes=$(grep -c '^skipped step [0-9]*: loss spike' "$tmp/spike.txt")
awk -v z=0.3 '
    /"skipped": "loss spike"/ { match($0, /"loss": [^,]*/); l = substr($0, RSTART + 8, RLENGTH - 8) + 0
                                if (!(n >= 20 && l > m + z * sqrt(v))) bad++; next }
    /^{"step": [0-9]*, "loss"/ { match($0, /"loss": [^,]*/); l = substr($0, RSTART + 8, RLENGTH - 8) + 0
                                 if (n >= 20 && l > m + z * sqrt(v) + 1e-9) bad++
                                 n++; a = n < 32 ? 1 / n : 1 / 32; d = l - m; m += a * d; v = (1 - a) * (v + a * d * d) }
    END { exit bad > 0 }' "$tmp/spike/log.jsonl"
ok=$?
[ $st -eq 0 ] && [ "$spikes" -ge 1 ] && [ $ok -eq 0 ] && [ "$(losses "$tmp/spike/log.jsonl" | wc -l)" -eq 40 ]
check $? "--spike-z 0.3: $spikes steps skipped as loss spikes, exactly those the rule picks from the logged losses"
mkdir -p "$tmp/spres" && cp -r "$tmp/spike/ckpt_00000030" "$tmp/spres/"
$BIN $SPIKE --resume --out "$tmp/spres" > /dev/null 2>&1
losses_after "$tmp/spike/log.jsonl" 30 > "$tmp/l_sp"
losses "$tmp/spres/log.jsonl" > "$tmp/l_spres"
cmp -s "$tmp/l_sp" "$tmp/l_spres" && [ "$(wc -l < "$tmp/l_sp")" -eq 10 ]
check $? "a resume from step 30 makes the same decisions, bitwise"

# ---- one run per directory
$BIN $ARGS --steps $SIGSTEPS --eval-every 0 --out "$tmp/lock" > /dev/null 2>&1 &
pid=$!
n=0
while [ $n -lt 600 ] && [ ! -s "$tmp/lock/log.jsonl" ]; do sleep 0.05; n=$((n + 1)); done
$BIN $ARGS --steps 4 --seed 7 --resume --out "$tmp/lock" > /dev/null 2> "$tmp/lock.err"
st=$?
kill -TERM $pid
wait $pid
[ $st -eq 1 ] && one_error "$tmp/lock.err" "in use by another run (pid $pid"
check $? "a second trainer on the same --out is refused: $(cat "$tmp/lock.err")"
$BIN $ARGS --steps 4 --eval-every 0 --out "$tmp/ref" > /dev/null 2> "$tmp/fresh.err"
st=$?
[ $st -eq 1 ] && one_error "$tmp/fresh.err" "holds an earlier run.*--resume.*--overwrite" && [ -d "$tmp/ref/ckpt_00000012" ]
check $? "a fresh run in a used --out is refused, the old run intact: $(cat "$tmp/fresh.err")"
cp -r "$tmp/ref" "$tmp/over"
$BIN $ARGS --steps 4 --ckpt-every 2 --eval-every 0 --overwrite --out "$tmp/over" > /dev/null 2>&1
st=$?
[ $st -eq 0 ] && [ "$(ls -d "$tmp"/over/ckpt_* | wc -l)" -eq 2 ] && [ -d "$tmp/over/ckpt_00000004" ] && [ "$(losses "$tmp/over/log.jsonl" | wc -l)" -eq 4 ]
check $? "--overwrite clears the earlier run's checkpoints and log, then trains"
mkdir -p "$tmp/cut" && cp -r "$tmp/ref/ckpt_00000011" "$tmp/cut/"
cp "$tmp/ref/log.jsonl" "$tmp/cut/" && printf '{"step": 13, "lo' >> "$tmp/cut/log.jsonl"  # killed after step 12's lines
$BIN $ARGS --steps 12 --ckpt-every 1 --keep 2 --eval-every 4 --resume --out "$tmp/cut" > /dev/null 2>&1
losses "$tmp/cut/log.jsonl" > "$tmp/l_cut"
json_ok "$tmp/cut/log.jsonl" && cmp -s "$tmp/l_ref" "$tmp/l_cut"
check $? "resume cuts log.jsonl back to its step (and a half-written line): valid JSON, each step once"

# ---- flags
bad_flag() {  # flags, what the error line must name (exit 2: a bad command line)
    $BIN $ARGS --steps 2 $1 > /dev/null 2> "$tmp/flag.err"
    st=$?
    [ $st -eq 2 ] && one_error "$tmp/flag.err" "$2"
    check $? "bad flag $1: $(cat "$tmp/flag.err")"
}
bad_flag "--log-every 0" "--log-every 0"
bad_flag "--lr -1" "--lr -1"
bad_flag "--mlp-hidden -5" "--mlp-hidden -5"
bad_flag "--ckpt-every -1" "--ckpt-every -1"
bad_flag "--eval-every -5" "--eval-every -5"
bad_flag "--warmup-tokens -100" "--warmup-tokens -100"
bad_flag "--grad-clip -1" "--grad-clip -1"
bad_flag "--top-k -3" "--top-k -3"
bad_flag "--max-bad-steps 0" "--max-bad-steps 0"
bad_flag "--resume maybe --out $tmp/x" "--resume maybe: expected on, off"
bad_flag "--acp=2" "--acp 2"
bad_flag "--min-lr 1 --lr 0.1" "--min-lr"
bad_flag "--overwrite --resume --out $tmp/x" "--overwrite"
bad_flag "--steps 9999999999" "--steps"
$BIN $ARGS --steps 2 --eval-every 0 --resume 1 --out "$tmp/b1" > /dev/null 2>&1 &&
    $BIN $ARGS --steps 3 --eval-every 0 --resume=true --out "$tmp/b1" > /dev/null 2>&1 &&
    $BIN $ARGS --steps 4 --eval-every 0 --resume on --acp off --kv-shift --out "$tmp/b1" > "$tmp/b1.txt" 2>&1 &&
    grep -q 'resumed from .*ckpt_00000003' "$tmp/b1.txt"
check $? "booleans: --resume 1, --resume=true, --resume on, --acp off, a bare --kv-shift"
$BIN $ARGS --eval-only=true --out "$tmp/b1" --eval-seqs 2 > "$tmp/eo.txt" 2>&1
st=$?
[ $st -eq 0 ] && grep -q '^evaluating ' "$tmp/eo.txt" && [ -f "$tmp/b1/per_token_loss.json" ] && [ ! -d "$tmp/b1/ckpt_00000005" ]
check $? "--eval-only=true evaluates (and trains nothing)"
$BIN $SHAPE --seq-len 64 --batch 2 --steps 2 --eval-every 0 --sample-tokens 0 > /dev/null 2> "$tmp/warm.err"
grep -q '^warning: --warmup-tokens 268435456 exceeds the run.s 256 tokens' "$tmp/warm.err"
check $? "the default warmup longer than the run is warned about: $(cat "$tmp/warm.err")"
$PY - "$tmp" << 'EOF'
import numpy as np, sys
d = sys.argv[1]
def shard(name, tokens):
    h = np.zeros(256, np.int32); h[0], h[1], h[2] = 20240520, 1, len(tokens)
    open(d + "/" + name, "wb").write(h.tobytes() + np.asarray(tokens, np.uint16).tobytes())
shard("val_small.bin", np.arange(100) % 50000)
shard("val_badid.bin", [60000] + list(np.arange(4000) % 50000))
EOF
$BIN $ARGS --steps 4 --eval-every 1 --val "$tmp/val_small.bin" > "$tmp/vs.txt" 2> "$tmp/vs.err"
st=$?
[ $st -eq 1 ] && one_error "$tmp/vs.err" "val_small.bin holds fewer than --batch 2 sequences" && ! grep -q '^step' "$tmp/vs.txt"
check $? "validation data smaller than a batch: refused before the first step: $(cat "$tmp/vs.err")"
$BIN $ARGS --steps 4 --eval-every 1 --val "$tmp/val_badid.bin" > "$tmp/vb.txt" 2> "$tmp/vb.err"
st=$?
[ $st -eq 1 ] && one_error "$tmp/vb.err" "val_badid.bin holds token id 60000" && ! grep -q '^step' "$tmp/vb.txt"
check $? "validation token ids outside the vocabulary: refused before the first step"

# ---- checkpoint writes and loads
$BIN $ARGS --steps 2 --ckpt-every 2 --eval-every 0 --out "$tmp/full" > /dev/null 2>&1
bash -c 'trap "" XFSZ; ulimit -f 4096; exec "$@"' sh $BIN $ARGS --steps 4 --ckpt-every 2 --eval-every 0 --resume --out "$tmp/full" > /dev/null 2> "$tmp/full.err"
st=$?
[ $st -eq 1 ] && one_error "$tmp/full.err" "cannot write .*tmp_ckpt_00000004" && ! ls -d "$tmp"/full/.tmp_ckpt_* > /dev/null 2>&1 &&
    [ -d "$tmp/full/ckpt_00000002" ] && [ ! -d "$tmp/full/ckpt_00000004" ]
check $? "a checkpoint write that fails (file size limit): one line, no temporary left, ckpt_00000002 kept: $(cat "$tmp/full.err")"
$BIN $ARGS --steps 4 --ckpt-every 2 --eval-every 0 --resume --out "$tmp/full" > /dev/null 2>&1
check $? "and the run resumes from it once there is room"
c="$tmp/corrupt"
corrupt() {  # label, how to break a copy of the reference run (in $c), what the error line must name
    rm -rf "$c" && cp -r "$tmp/ref" "$c"
    eval "$2"
    $BIN $ARGS --steps 14 --ckpt-every 1 --keep 2 --eval-every 4 --resume --out "$c" > /dev/null 2> "$tmp/cor.err"
    st=$?
    [ $st -eq 1 ] && one_error "$tmp/cor.err" "$3"
    check $? "$1: $(cat "$tmp/cor.err")"
}
corrupt "a flipped byte in the weights" \
    "printf '\\377' | dd of=\$c/ckpt_00000012/model.bin bs=1 seek=500000 conv=notrunc 2> /dev/null" \
    "model.bin fails its checksum.*use the older complete checkpoint ckpt_00000011"
corrupt "a truncated model.bin" "head -c 100000 \$c/ckpt_00000011/model.bin > \$c/ckpt_00000012/model.bin" \
    "model.bin fails its checksum .*truncated"
corrupt "a flipped byte in the AdamW moments" \
    "printf '\\377' | dd of=\$c/ckpt_00000012/state_00000.bin bs=1 seek=200000 conv=notrunc 2> /dev/null" \
    "state_00000.bin fails its checksum"
corrupt "step field -2147483648" "patch_word \$c/ckpt_00000012/state_00000.bin -2147483648 4" \
    "written with step -2147483648, this run has 12"
corrupt "step field 2147483647" "patch_word \$c/ckpt_00000012/state_00000.bin 2147483647 4" \
    "written with step 2147483647, this run has 12"
corrupt "tokens seen not step x tokens per step" "patch_word \$c/ckpt_00000012/state_00000.bin 999 6" \
    "tokens seen (step x tokens per step) 999"
corrupt "world size 2 in a 1-rank run" "patch_word \$c/ckpt_00000012/state_00000.bin 2 3" \
    "world size 2, this run has 1"
$PY - "$tmp/ref/ckpt_00000012/model.bin" "$tmp/nan.bin" << 'EOF'
import sys, importlib.util
spec = importlib.util.spec_from_file_location("tf", "train_fox.py")
tf = importlib.util.module_from_spec(spec); spec.loader.exec_module(tf)
cfg, params = tf.load_model_bin(sys.argv[1])
params["wte"][0, 0] = float("nan")
tf.save_model_bin(sys.argv[2], cfg, params)
EOF
$BIN $ARGS --steps 4 --eval-every 0 --init "$tmp/nan.bin" > /dev/null 2> "$tmp/init.err"
st=$?
[ $st -eq 1 ] && one_error "$tmp/init.err" "nan.bin holds non-finite weights"
check $? "--init with a NaN weight (valid checksum) is refused: $(cat "$tmp/init.err")"

# ---- what a hostile user found
# --overwrite checks the new run's inputs before it deletes anything
cp -r "$tmp/ref" "$tmp/ow"
$BIN $ARGS --steps 4 --eval-every 0 --overwrite --train /nonexistent/typo.bin --out "$tmp/ow" > /dev/null 2> "$tmp/ow.err"
st=$?
[ $st -eq 1 ] && one_error "$tmp/ow.err" "typo.bin" && [ -d "$tmp/ow/ckpt_00000012" ] && cmp -s "$tmp/ref/log.jsonl" "$tmp/ow/log.jsonl"
check $? "--overwrite with a mistyped --train: exit $st (1), the earlier run intact: $(cat "$tmp/ow.err")"
$BIN $ARGS --steps 4 --eval-every 0 --overwrite --init /nonexistent/w.bin --out "$tmp/ow" > /dev/null 2> "$tmp/ow.err"
st=$?
[ $st -eq 1 ] && one_error "$tmp/ow.err" "w.bin" && [ -d "$tmp/ow/ckpt_00000012" ]
check $? "--overwrite with a missing --init: exit $st (1), the earlier run intact"
# a failed start leaves no directory behind it made
$BIN $ARGS --steps 4 --eval-every 0 --train /nonexistent/typo.bin --out "$tmp/new/run" > /dev/null 2>&1
[ $? -eq 1 ] && [ ! -e "$tmp/new/run" ]
check $? "a failed start removes the --out it created (no directory holding only .lock)"
mkdir -p "$tmp/mine" && echo notes > "$tmp/mine/notes.txt"
$BIN $ARGS --steps 4 --eval-every 0 --train /nonexistent/typo.bin --out "$tmp/mine" > /dev/null 2>&1
[ $? -eq 1 ] && [ -f "$tmp/mine/notes.txt" ] && [ ! -e "$tmp/mine/.lock" ]
check $? "and in a directory the user made, only its own lock file goes"
# a file-size limit without `trap "" XFSZ`: the trainer ignores SIGXFSZ, the write fails with one line
$BIN $ARGS --steps 2 --ckpt-every 2 --eval-every 0 --out "$tmp/fsz" > /dev/null 2>&1
bash -c 'ulimit -f 4096; exec "$@"' sh $BIN $ARGS --steps 4 --ckpt-every 2 --eval-every 0 --resume --out "$tmp/fsz" > /dev/null 2> "$tmp/fsz.err"
st=$?
[ $st -eq 1 ] && one_error "$tmp/fsz.err" "cannot write .*tmp_ckpt_00000004" && ! ls -d "$tmp"/fsz/.tmp_ckpt_* > /dev/null 2>&1 &&
    [ -d "$tmp/fsz/ckpt_00000002" ]
check $? "ulimit -f (SIGXFSZ not ignored by the shell): exit $st (1, not 153), one line, no temporary: $(cat "$tmp/fsz.err")"
# what a kill inside a checkpoint write leaves is removed at the next start, under the lock
mkdir -p "$tmp/stale" && cp -r "$tmp/ref/ckpt_00000011" "$tmp/stale/" && mkdir "$tmp/stale/.tmp_ckpt_00000012" &&
    head -c 100000 "$tmp/ref/ckpt_00000012/model.bin" > "$tmp/stale/.tmp_ckpt_00000012/model.bin" &&
    cp "$tmp/ref/train_loss_pos_00000012.npy" "$tmp/ref/train_loss_pos_00000011.npy" "$tmp/stale/"
$BIN $ARGS --steps 11 --ckpt-every 1 --keep 2 --eval-every 4 --resume --out "$tmp/stale" > "$tmp/stale.txt" 2>&1
st=$?
[ $st -eq 0 ] && ! ls -d "$tmp"/stale/.tmp_ckpt_* > /dev/null 2>&1 && [ ! -e "$tmp/stale/train_loss_pos_00000012.npy" ] &&
    [ -f "$tmp/stale/train_loss_pos_00000011.npy" ] && grep -q "removed what an interrupted run left" "$tmp/stale.txt" &&
    grep -q '^the run is complete (step 11 of --steps 11)' "$tmp/stale.txt"
check $? "a resume removes a stale .tmp_ckpt_00000012 and the orphan train_loss_pos_00000012.npy it does not write again"
# skipped steps stay in the log across a stop and resume
FOX_TEST_NONFINITE=5:1000 $BIN $ARGS --steps 8 --eval-every 0 --max-bad-steps 1000 --out "$tmp/skr" > "$tmp/skr.txt" 2>&1 &
stop_when $! "$tmp/skr/log.jsonl" '"skipped"' TERM 3
$BIN $ARGS --steps 8 --eval-every 0 --max-bad-steps 1000 --resume --out "$tmp/skr" > /dev/null 2>&1
lines=$(grep -c '"skipped": ' "$tmp/skr/log.jsonl")
count=$(sed -n 's/^{"step": 8, "loss".*"skipped_steps": \([0-9]*\)}$/\1/p' "$tmp/skr/log.jsonl")
[ $st -eq 75 ] && [ "$lines" -ge 3 ] && [ "$lines" = "$count" ] && json_ok "$tmp/skr/log.jsonl"
check $? "skips, a stop, a resume: log.jsonl keeps the $lines skip lines its step lines count ($count)"
# a stop signal during the sample, --generate and --eval-only: at the next token or sequence
LONG="--sample-tokens 100000 --stop-at-eot off"
$BIN $ARGS --steps 2 --eval-every 0 $LONG --out "$tmp/smp" > "$tmp/smp.txt" 2>&1 &
stop_when $! "$tmp/smp.txt" '^sample: ' TERM
[ $st -eq 75 ] && [ $waited -le 5 ] && grep -q '^stopped by SIGTERM during the sample: training is complete' "$tmp/smp.txt"
check $? "SIGTERM during the sample after training: exit $st (75) in $waited s, training complete"
$BIN --generate 100000 --stop-at-eot off --prompt "And God said" --out "$tmp/smp" > "$tmp/gen.txt" 2> "$tmp/gen.err" &
stop_when $! "$tmp/gen.err" '^generating from' TERM
[ $st -eq 143 ] && [ $waited -le 5 ] && grep -q '^stopped by SIGTERM during generation' "$tmp/gen.txt"
check $? "SIGTERM during --generate: exit $st (143, 128 + SIGTERM) in $waited s, at the next token, says so"
$BIN --eval-only --out "$tmp/smp" --eval-seq-len 2048 --eval-seqs 1000 > "$tmp/ev.txt" 2>&1 &
stop_when $! "$tmp/ev.txt" '^evaluating' INT
[ $st -eq 130 ] && grep -q '^stopped by SIGINT after [0-9]* of [0-9]* sequences per rank: nothing written' "$tmp/ev.txt" &&
    [ ! -e "$tmp/smp/per_token_loss.json" ]
check $? "SIGINT during --eval-only: exit $st (130) after the current sequence, nothing written"
# a corrupted header field is named as corruption, not as a flag mismatch
flip_word() {  # file, int32 word: xor its low bit, leaving the checksum stale
    $PY -c "import sys
p, at = sys.argv[1], int(sys.argv[2])
b = bytearray(open(p, 'rb').read()); b[4 * at] ^= 1; open(p, 'wb').write(bytes(b))" "$1" "$2"
}
corrupt "a flipped --batch word of a state file" "flip_word \$c/ckpt_00000012/state_00000.bin 15" \
    "state_00000.bin fails its checksum.*use the older complete checkpoint ckpt_00000011"
corrupt "a flipped n_layer word of model.bin" "flip_word \$c/ckpt_00000012/model.bin 4" \
    "model.bin fails its checksum"
# flags on resume
cp -r "$tmp/ref" "$tmp/chg"
$BIN $ARGS --steps 14 --ckpt-every 1 --keep 2 --eval-every 0 --lr 1e-3 --init "$tmp/nan.bin" --resume --out "$tmp/chg" > "$tmp/chg.txt" 2>&1
st=$?
[ $st -eq 0 ] && grep -q '^resuming with changed flags: --steps 14 (was 12), --lr 0.001 (was 0.003); steps 13 on follow the new values$' "$tmp/chg.txt" &&
    grep -q '^--init .*nan.bin is not read: the run resumes from its checkpoint' "$tmp/chg.txt"
check $? "a resume names the changed schedule flags and the --init it does not read"
$BIN $ARGS --steps 10 --eval-every 0 --resume --out "$tmp/chg" > /dev/null 2> "$tmp/past.err"
st=$?
[ $st -eq 2 ] && one_error "$tmp/past.err" "--steps 10: the run in .* is at step 14 already"
check $? "--resume with --steps below the checkpoint's step: exit $st (2): $(cat "$tmp/past.err")"
# --generate and --eval-only on a corrupt newest checkpoint name the older one; --generate needs no state file
rm -rf "$c" && cp -r "$tmp/ref" "$c" && flip_word "$c/ckpt_00000012/model.bin" 100
$BIN --generate 4 --prompt "And God said" --out "$c" > /dev/null 2> "$tmp/gc.err"
st=$?
[ $st -eq 1 ] && one_error "$tmp/gc.err" "model.bin fails its checksum.*use the older complete checkpoint ckpt_00000011"
check $? "--generate on a corrupt newest checkpoint names the older one: $(cat "$tmp/gc.err")"
$BIN --eval-only --eval-seqs 2 --out "$c" > /dev/null 2> "$tmp/ec.err"
st=$?
[ $st -eq 1 ] && one_error "$tmp/ec.err" "model.bin fails its checksum.*use the older complete checkpoint ckpt_00000011"
check $? "--eval-only too"
rm -rf "$c" && cp -r "$tmp/ref" "$c" && rm "$c/ckpt_00000012/state_00000.bin"
$BIN --generate 4 --prompt "And God said" --out "$c" > /dev/null 2>&1
check $? "--generate from a checkpoint that kept only model.bin"

# ---- several ranks: the second argument is the binary `mpirun -np 2` starts (its MPI build)
MPI=${2:-}
case "$MPI" in
""|*_cpu*) ;;
*) [ "$(nvidia-smi -L 2> /dev/null | grep -c GPU)" -ge 2 ] || { echo "SKIP 2 ranks: fewer than 2 GPUs here"; MPI=""; } ;;
esac
if [ -n "$MPI" ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
    RUN2="mpirun --oversubscribe --bind-to none -np 2 $MPI"
    FOX_TEST_NONFINITE=3 $RUN2 $ARGS --steps 5 --eval-every 0 --out "$tmp/mnan" > "$tmp/mnan.txt" 2>&1
    st=$?
    FOX_TEST_DISCARD_BATCH=3 $RUN2 $ARGS --steps 5 --eval-every 0 --out "$tmp/mdrop" > /dev/null 2>&1
    losses "$tmp/mnan/log.jsonl" > "$tmp/l_mnan"
    losses "$tmp/mdrop/log.jsonl" > "$tmp/l_mdrop"
    [ $st -eq 0 ] && [ "$(grep -c '^skipped step 3' "$tmp/mnan.txt")" -eq 1 ] && cmp -s "$tmp/l_mnan" "$tmp/l_mdrop" &&
        [ "$(wc -l < "$tmp/l_mnan")" -eq 5 ] && cmp -s "$tmp/mnan/ckpt_00000005/model.bin" "$tmp/mdrop/ckpt_00000005/model.bin"
    check $? "2 ranks: a NaN gradient at step 3 is skipped by both, then bitwise the run without that step's batches"
    $RUN2 $ARGS --steps $SIGSTEPS --eval-every 0 --out "$tmp/msref" > /dev/null 2>&1
    $RUN2 $ARGS --steps $SIGSTEPS --eval-every 0 --out "$tmp/msig" > "$tmp/msig.txt" 2>&1 &
    pid=$!
    n=0
    while [ $n -lt 600 ] && [ "$(cat "$tmp/msig/log.jsonl" 2> /dev/null | grep -c '"loss"')" -lt 2 ]; do sleep 0.05; n=$((n + 1)); done
    kill -USR1 $pid  # mpirun forwards SIGUSR1 to the ranks
    wait $pid
    st=$?
    at=$(sed -n 's/^stopped by SIGUSR1 at step \([0-9]*\): resume.*/\1/p' "$tmp/msig.txt")
    [ -n "$at" ] && [ -d "$tmp/msig/ckpt_$(printf %08d "${at:-0}")" ] && [ -f "$tmp/msig/ckpt_$(printf %08d "${at:-0}")/state_00001.bin" ]
    check $? "2 ranks: SIGUSR1 to mpirun stops both at step ${at:-(none: exit $st after $(grep -c '"loss"' "$tmp/msig/log.jsonl") steps; $(grep -v '^step' "$tmp/msig.txt" | tail -n 2 | tr '\n' ' '))} with a checkpoint of both ranks"
    $RUN2 $ARGS --steps $SIGSTEPS --eval-every 0 --resume --out "$tmp/msig" > /dev/null 2>&1
    losses "$tmp/msref/log.jsonl" > "$tmp/l_msref"
    losses "$tmp/msig/log.jsonl" > "$tmp/l_msig"
    cmp -s "$tmp/l_msref" "$tmp/l_msig" && [ "$(wc -l < "$tmp/l_msig")" -eq $SIGSTEPS ]
    check $? "and the resume on 2 ranks ends bitwise equal to the uninterrupted 2-rank run"
    grep -q "^to stop with a checkpoint: kill -USR1 <mpirun's pid> (no time limit), or SIGTERM or Ctrl-C to mpirun, which kills the ranks 2 s later" "$tmp/msig.txt"
    check $? "under mpirun the run says at start which signals stop it, and mpirun's 2 s before SIGKILL"
    # odls_base_sigkill_timeout 5: 10 s for a step and a checkpoint on a loaded machine (2 s by default)
    mpirun --mca odls_base_sigkill_timeout 5 --oversubscribe --bind-to none -np 2 $MPI $ARGS --steps $SIGSTEPS --eval-every 0 --out "$tmp/mterm" > "$tmp/mterm.txt" 2>&1 &
    stop_when $! "$tmp/mterm/log.jsonl" '"loss"' TERM 2  # what a user, Ctrl-C and a plain scancel send: mpirun's kill sequence
    at=$(sed -n "s/^stopped by mpirun's kill sequence (SIGTERM or Ctrl-C to mpirun) at step \\([0-9]*\\): resume.*/\\1/p" "$tmp/mterm.txt")
    [ -n "$at" ] && [ -f "$tmp/mterm/ckpt_$(printf %08d "${at:-0}")/state_00001.bin" ] && ! ls -d "$tmp"/mterm/.tmp_ckpt_* > /dev/null 2>&1
    check $? "2 ranks: SIGTERM to mpirun stops both at once (its SIGCONT) at step $at with a checkpoint (mpirun exits $st)"
    $RUN2 $ARGS --steps $SIGSTEPS --eval-every 0 --resume --out "$tmp/mterm" > /dev/null 2>&1
    losses "$tmp/mterm/log.jsonl" > "$tmp/l_mterm"
    cmp -s "$tmp/l_msref" "$tmp/l_mterm"
    check $? "and its resume ends bitwise equal to the uninterrupted 2-rank run"
fi

finish
