#!/usr/bin/env bash
# test/test_paper_scripts.sh: the paper run scripts (scripts/paper/), CPU only, no GPU,
# no LongCrawl64: `bash test/test_paper_scripts.sh [BIN [MPI_BIN]]` (BIN: default ./train_fox_cpu, MPI_BIN:
# default $FOX_MPI_BIN, its MPI build; the parts that need them are skipped when they are not built).
#   - run.sh --dry-run: the paper's flags for every size and model (steps = token budget / 512Ki, the
#     peak learning rates of Tables 4 and 5, head dims, --qk-norm-shared on the Pro models only), the
#     launcher, OUT, extra flags last; one-line errors for a bad SIZE/MODEL and a missing LONGCRAWL64;
#   - the relaunch loop, with a fake trainer that exits with a scripted sequence of codes: crashes and
#     stops are relaunched with --resume, exit 3 (diverged) never, MAX_RESTARTS counts relaunches
#     without a new checkpoint, 75 inside Slurm is left to the batch script, a signal to run.sh reaches
#     the trainer as SIGUSR1 and ends the loop, also during the pause before a relaunch, a hung trainer
#     (HANG_TIMEOUT) is killed and relaunched;
#   - with the real CPU trainer on the bundled corpus (the paper's flags, shape and data overridden):
#     a kill -9 of the trainer is relaunched and ends bitwise equal to an uninterrupted run, so does a
#     SIGTERM to run.sh (exit 75) followed by running it again; a finished run run again exits 0; the
#     same under `mpirun -np 2` with the MPI build (SIGUSR1 through mpirun, kill -9 of rank 0).
# Ends with "N passed, M failed"; exits non-zero on any failure.
set -u
cd "$(dirname "$0")/.." || exit 1
BIN=${1:-./train_fox_cpu}
MPI=${2:-${FOX_MPI_BIN:-}}
. test/test_lib.sh
RUN=scripts/paper/run.sh
LC=/data/longcrawl64
unset OUT OUT_ROOT LAUNCH NGPU TRAIN_FOX MAX_RESTARTS RESTART_DELAY HANG_TIMEOUT HANG_KILL_GRACE \
    RELAUNCH_ON_STOP DRY_RUN SLURM_JOB_ID

# ---- dry runs ----
dry() { LONGCRAWL64=$LC "$RUN" --dry-run "$@" 2> /dev/null; }
has() {  # line, fragments: every fragment occurs in the line (a fragment is whole words)
    local line=" $1 " f
    shift
    for f in "$@"; do
        case "$line" in *" $f "*) ;; *) echo "   missing '$f' in: $1"; return 1 ;; esac
    done
}
lacks() {
    case " $1 " in *" $2 "*) echo "   unexpected '$2' in: $1"; return 1 ;; esac
}

line=$(dry 760M fox-pro)
has "$line" "mpirun --bind-to none -np 8 ./train_fox --model fox-pro" "--layers 24 --dim 1536 --heads 24 --qk-norm-shared" \
    "--train $LC/train.zarr --val $LC/heldout.zarr" "--seq-len 16384 --batch 1 --total-batch-tokens 512Ki" \
    "--steps 92160" "--lr 2e-3 --min-lr 0 --warmup-tokens 256Mi --weight-decay 0.1 --grad-clip 1.0" \
    "--sample-tokens 0" "--out runs/paper/fox-pro_760M --resume"
check $? "760M fox-pro: 8 ranks under mpirun, 24 x 1536 / 24 heads, 16384 x 512Ki tokens, 92160 steps (45 x 2^30 tokens), lr 2e-3, warmup 256Mi, cosine to 0, --resume"
case "$line" in *" --resume") true ;; *) false ;; esac
check $? "the command ends with --resume (no extra flags given)"

# steps x 512Ki = the token budgets: 2.5, 7, 15, 45 x 2^30 tokens
ok=0
for sb in 125M:$((5 * 2 ** 29)) 360M:$((7 * 2 ** 30)) 760M-16B:$((15 * 2 ** 30)) 760M:$((45 * 2 ** 30)); do
    s=${sb%%:*} budget=${sb#*:}
    for m in fox-pro transformer-pro fox-llama transformer-llama; do
        has "$(dry "$s" "$m")" "--steps $((budget / 524288))" || ok=1
        [ $((budget / 524288 * 524288)) -eq "$budget" ] || ok=1
    done
done
check $ok "steps = token budget / 524288 for all 16 runs: 125M 5120, 360M 14336, 760M-16B 30720, 760M 92160"

ok=0
for t in "125M fox-pro 2e-3" "125M transformer-llama 2e-3" "360M fox-llama 2e-3" "360M transformer-pro 2e-3" \
    "760M-16B fox-pro 1e-3" "760M-16B transformer-llama 1e-3" \
    "760M fox-pro 2e-3" "760M transformer-pro 1e-3" "760M fox-llama 1e-3" "760M transformer-llama 5e-4"; do
    read -r s m want <<< "$t"
    has "$(dry "$s" "$m")" "--lr $want" || ok=1
done
check $ok "peak learning rates: Table 5 per model at 760M/48B (2e-3, 1e-3, 1e-3, 5e-4), Table 4 otherwise (2e-3, 2e-3, 1e-3)"

ok=0
has "$(dry 125M transformer-llama)" "--layers 12 --dim 768 --heads 12" || ok=1
has "$(dry 360M transformer-pro)" "--layers 24 --dim 1024 --heads 16" || ok=1
has "$(dry 760M transformer-pro)" "--layers 24 --dim 1536 --heads 12" || ok=1
has "$(dry 760M-16B transformer-llama)" "--layers 24 --dim 1536 --heads 12" || ok=1
has "$(dry 760M-16B fox-llama)" "--layers 24 --dim 1536 --heads 24" || ok=1
check $ok "shapes (Table 4): head_dim 64, except the 760M Transformers' 128 (12 heads)"

ok=0
for m in fox-llama transformer-llama; do lacks "$(dry 360M $m)" --qk-norm-shared || ok=1; done
has "$(dry 360M transformer-pro)" --qk-norm-shared || ok=1
check $ok "--qk-norm-shared (the paper's shared QK-norm weights) on the Pro models only"

has "$(dry 125m fox-llama)" "--out runs/paper/fox-llama_125M"
check $? "SIZE is case-insensitive (125m)"

line=$(NGPU=4 OUT=/ckpt/x dry 360M fox-pro --batch 2 --recompute 1)
has "$line" "-np 4 ./train_fox" "--out /ckpt/x --resume --batch 2 --recompute 1"
check $? "NGPU=4, OUT, extra flags after the paper's (so they win)"
line=$(LAUNCH='' TRAIN_FOX=/opt/fox/train_fox OUT_ROOT=/scratch dry 125M fox-pro)
case "$line" in "/opt/fox/train_fox --model fox-pro "*) has "$line" "--out /scratch/fox-pro_125M" ;; *) false ;; esac
check $? "LAUNCH= runs the trainer alone (TRAIN_FOX), OUT_ROOT"
line=$(LAUNCH="srun --kill-on-bad-exit=1" dry 125M fox-pro)
case "$line" in "srun --kill-on-bad-exit=1 ./train_fox "*) true ;; *) false ;; esac
check $? "LAUNCH=srun ..."
line=$(DRY_RUN=1 LONGCRAWL64=$LC "$RUN" 125M fox-pro 2> /dev/null)
has "$line" "--steps 5120"
check $? "DRY_RUN=1 is --dry-run"
[ "$(LONGCRAWL64=$LC "$RUN" --dry-run 125M fox-pro | wc -l)" -eq 1 ]
check $? "a dry run prints one line"

"$RUN" 1B fox-pro > /dev/null 2> "$tmp/err"
rc=$?
[ $rc -eq 2 ] && [ "$(wc -l < "$tmp/err")" -eq 1 ] && grep -q "^error: unknown SIZE '1B'" "$tmp/err"
check $? "unknown SIZE: exit 2, one line (rc $rc)"
"$RUN" 125M fox > /dev/null 2> "$tmp/err"
rc=$?
[ $rc -eq 2 ] && [ "$(wc -l < "$tmp/err")" -eq 1 ] && grep -q "^error: unknown MODEL 'fox'" "$tmp/err"
check $? "unknown MODEL: exit 2, one line (rc $rc)"
"$RUN" 125M > /dev/null 2> "$tmp/err"
[ $? -eq 2 ] && grep -q "^usage:" "$tmp/err"
check $? "missing MODEL: usage, exit 2"
(unset LONGCRAWL64; "$RUN" 125M fox-pro > /dev/null 2> "$tmp/err")
rc=$?
[ $rc -eq 1 ] && [ "$(wc -l < "$tmp/err")" -eq 1 ] && grep -q "^error: set LONGCRAWL64" "$tmp/err"
check $? "LONGCRAWL64 unset: exit 1, one line (rc $rc)"
mkdir -p "$tmp/lc_half/train.zarr"
LONGCRAWL64=$tmp/lc_half "$RUN" 125M fox-pro > /dev/null 2> "$tmp/err"
rc=$?
[ $rc -eq 1 ] && [ "$(wc -l < "$tmp/err")" -eq 1 ] && grep -q "heldout.zarr not found" "$tmp/err"
check $? "LONGCRAWL64 without heldout.zarr: exit 1, one line (rc $rc)"
LONGCRAWL64=$tmp/lc_half TRAIN_FOX=$tmp/nothing_here "$RUN" 125M fox-pro > /dev/null 2> "$tmp/err"
[ $? -eq 1 ]
check $? "a trainer that is not there: exit 1"

# ---- the relaunch loop, with a fake trainer ----
# codes: one line per launch: a number (exit with it), N+ckpt (write the next checkpoint directory,
# then exit N), wait (until SIGUSR1, then exit 75), hang (sleep, SIGTERM kills it), stubborn (sleep,
# SIGTERM ignored). Past the list: exit with FAKE_DEFAULT (1).
mkdir -p "$tmp/lc/train.zarr" "$tmp/lc/heldout.zarr"
export LONGCRAWL64=$tmp/lc
cat > "$tmp/fake_trainer" << 'EOF'
#!/usr/bin/env bash
n=$(($(cat "$FAKE_DIR/n" 2> /dev/null || echo 0) + 1))
echo "$n" > "$FAKE_DIR/n"
printf '%s\n' "$*" >> "$FAKE_DIR/args"
out=
while [ $# -gt 0 ]; do [ "$1" = --out ] && out=$2; shift; done
code=$(sed -n "${n}p" "$FAKE_DIR/codes")
code=${code:-${FAKE_DEFAULT:-1}}
case "$code" in
*+ckpt) mkdir -p "$out/$(printf 'ckpt_%08d' "$n")"; exit "${code%+ckpt}" ;;
wait)
    trap 'echo USR1 >> "$FAKE_DIR/signals"; kill $sp 2> /dev/null; exit 75' USR1
    trap 'echo TERM >> "$FAKE_DIR/signals"' TERM
    sleep 30 &
    sp=$!
    echo started > "$FAKE_DIR/started"
    while kill -0 $sp 2> /dev/null; do wait $sp; done
    exit 0 ;;
hang) exec sleep 30 ;;
stubborn) trap '' TERM; exec sleep 30 ;;
*) exit "$code" ;;
esac
EOF
chmod +x "$tmp/fake_trainer"
export TRAIN_FOX=$tmp/fake_trainer LAUNCH='' RESTART_DELAY=0
case=0
fake() {  # codes (comma-separated): a fresh FAKE_DIR and OUT for a case
    case=$((case + 1))
    export FAKE_DIR=$tmp/fake$case OUT=$tmp/fake$case/out
    mkdir -p "$FAKE_DIR"
    printf '%s\n' "$1" | tr , '\n' > "$FAKE_DIR/codes"
}
launches() { cat "$FAKE_DIR/n" 2> /dev/null || echo 0; }
all_resume() {  # every launch had --resume, the paper's flags, and the extras last
    [ "$(grep -c -- ' --resume$' "$FAKE_DIR/args")" -eq "$(launches)" ] && ! grep -v -- '--steps 5120 ' "$FAKE_DIR/args" | grep -q .
}
wait_for() {  # file, [pattern]: up to 20 s for the file (holding the pattern)
    local _
    for _ in $(seq 200); do
        if [ -e "$1" ] && { [ $# -lt 2 ] || grep -q "$2" "$1"; }; then return 0; fi
        sleep 0.1
    done
    return 1
}

fake 137,75,0
"$RUN" 125M fox-pro > "$tmp/o" 2>&1
rc=$?
[ $rc -eq 0 ] && [ "$(launches)" -eq 3 ] && all_resume && grep -q "finished" "$OUT/relaunch.log"
check $? "exits 137, 75, 0: relaunched twice with --resume, exit 0 (rc $rc, $(launches) launches)"

fake 76,0
"$RUN" 125M fox-pro > "$tmp/o" 2>&1
rc=$?
[ $rc -eq 0 ] && [ "$(launches)" -eq 2 ] && all_resume && grep -q "a rank died or stopped answering (exit 76" "$OUT/relaunch.log"
check $? "exit 76 (a rank died or hung: the collective timeout): relaunched with --resume, says so (rc $rc, $(launches) launches)"

fake 3
"$RUN" 125M fox-pro > "$tmp/o" 2>&1
rc=$?
[ $rc -eq 3 ] && [ "$(launches)" -eq 1 ] && grep -q "DIVERGED" "$tmp/o"
check $? "exit 3 (non-finite guard): no relaunch, exit 3, says DIVERGED (rc $rc, $(launches) launches)"

fake 2
"$RUN" 125M fox-pro > "$tmp/o" 2>&1
rc=$?
[ $rc -eq 2 ] && [ "$(launches)" -eq 1 ] && grep -q "refused its command line" "$tmp/o"
check $? "exit 2 (a bad command line): no relaunch, exit 2 (rc $rc, $(launches) launches)"

fake 137,3
"$RUN" 125M fox-pro > "$tmp/o" 2>&1
rc=$?
[ $rc -eq 3 ] && [ "$(launches)" -eq 2 ]
check $? "a crash then exit 3: exit 3 after 2 launches (rc $rc)"

fake ""
MAX_RESTARTS=2 "$RUN" 125M fox-pro > "$tmp/o" 2>&1
rc=$?
[ $rc -eq 1 ] && [ "$(launches)" -eq 3 ] && all_resume && grep -q "giving up" "$tmp/o"
check $? "always exit 1, MAX_RESTARTS=2: 3 launches, then gives up with exit 1 (rc $rc, $(launches) launches)"

fake 137
MAX_RESTARTS=0 "$RUN" 125M fox-pro > "$tmp/o" 2>&1
rc=$?
[ $rc -eq 1 ] && [ "$(launches)" -eq 1 ]
check $? "MAX_RESTARTS=0: no relaunch (rc $rc, $(launches) launches)"

fake 137+ckpt,139+ckpt,1+ckpt,137+ckpt,0
MAX_RESTARTS=1 "$RUN" 125M fox-pro > "$tmp/o" 2>&1
rc=$?
[ $rc -eq 0 ] && [ "$(launches)" -eq 5 ]
check $? "MAX_RESTARTS=1 counts relaunches without a new checkpoint: 4 crashes that each checkpointed, then done (rc $rc, $(launches) launches)"

fake 137+ckpt,137,137,0
MAX_RESTARTS=1 "$RUN" 125M fox-pro > "$tmp/o" 2>&1
rc=$?
[ $rc -eq 1 ] && [ "$(launches)" -eq 3 ]
check $? "MAX_RESTARTS=1: a checkpointing crash, then 2 crashes without one: gives up (rc $rc, $(launches) launches)"

fake 75,0
SLURM_JOB_ID=42 "$RUN" 125M fox-pro > "$tmp/o" 2>&1
rc=$?
[ $rc -eq 75 ] && [ "$(launches)" -eq 1 ]
check $? "inside Slurm, exit 75 that run.sh did not cause: exit 75 for the batch script to requeue (rc $rc)"
fake 75,0
SLURM_JOB_ID=42 RELAUNCH_ON_STOP=1 "$RUN" 125M fox-pro > "$tmp/o" 2>&1
rc=$?
[ $rc -eq 0 ] && [ "$(launches)" -eq 2 ]
check $? "RELAUNCH_ON_STOP=1 inside Slurm: relaunched (rc $rc)"
fake 75,0
RELAUNCH_ON_STOP=0 "$RUN" 125M fox-pro > "$tmp/o" 2>&1
rc=$?
[ $rc -eq 75 ] && [ "$(launches)" -eq 1 ]
check $? "RELAUNCH_ON_STOP=0: exit 75 (rc $rc)"

# A signal ignored when the shell started (SIGHUP under nohup) cannot be trapped by run.sh: skip that case there.
hup_ignored=$(trap -p HUP)
for sig in TERM USR1 HUP; do
    if [ "$sig" = HUP ] && [ -n "$hup_ignored" ]; then
        echo "SKIP SIGHUP to run.sh: SIGHUP was ignored when this test started (nohup), so run.sh cannot trap it"
        continue
    fi
    fake wait,0
    "$RUN" 125M fox-pro > "$tmp/o" 2>&1 &
    pid=$!
    wait_for "$FAKE_DIR/started"
    kill -"$sig" $pid
    wait $pid
    rc=$?
    [ $rc -eq 75 ] && [ "$(launches)" -eq 1 ] && [ "$(cat "$FAKE_DIR/signals" 2> /dev/null)" = USR1 ] && grep -q "got SIG$sig" "$OUT/relaunch.log"
    check $? "SIG$sig to run.sh: SIGUSR1 to the trainer, which stops with 75: exit 75, no relaunch (rc $rc, $(launches) launches)"
done

fake 137,0
RESTART_DELAY=60 "$RUN" 125M fox-pro > "$tmp/o" 2>&1 &
pid=$!
wait_for "$OUT/relaunch.log" "relaunching with --resume in 60s"
t0=$(date +%s)
kill -TERM $pid
wait $pid
rc=$?
[ $rc -eq 75 ] && [ "$(launches)" -eq 1 ] && [ $(($(date +%s) - t0)) -lt 10 ]
check $? "SIGTERM during the pause before a relaunch: exit 75 at once, no relaunch (rc $rc)"

fake hang,0
HANG_TIMEOUT=2 "$RUN" 125M fox-pro > "$tmp/o" 2>&1
rc=$?
[ $rc -eq 0 ] && [ "$(launches)" -eq 2 ] && grep -q "looks hung" "$OUT/relaunch.log"
check $? "HANG_TIMEOUT: a trainer that writes nothing is killed (SIGTERM) and relaunched (rc $rc, $(launches) launches)"
fake stubborn,0
HANG_TIMEOUT=2 HANG_KILL_GRACE=1 "$RUN" 125M fox-pro > "$tmp/o" 2>&1
rc=$?
[ $rc -eq 0 ] && [ "$(launches)" -eq 2 ] && grep -q "SIGKILL" "$OUT/relaunch.log"
check $? "HANG_TIMEOUT: one that ignores SIGTERM gets SIGKILL after HANG_KILL_GRACE, then relaunched (rc $rc)"

fake 0
LAUNCH="env FOX_FAKE=1" "$RUN" 125M fox-pro > "$tmp/o" 2>&1
rc=$?
[ $rc -eq 0 ] && grep -q "launch 1 (from checkpoint step 0): env FOX_FAKE=1 $tmp/fake_trainer --model fox-pro " "$OUT/relaunch.log"
check $? "the launcher's words come first; relaunch.log records the command (rc $rc)"

# the Slurm example: a signal to the batch shell ends in exit 75 and `scontrol requeue`
mkdir -p "$tmp/bin"
printf '#!/bin/sh\necho "$*" >> "%s/scontrol.log"\n' "$tmp" > "$tmp/bin/scontrol"
chmod +x "$tmp/bin/scontrol"
for sig in USR1 TERM; do
    fake wait,0
    rm -f "$tmp/scontrol.log"
    SLURM_JOB_ID=77 PATH="$tmp/bin:$PATH" bash scripts/paper/slurm.sbatch 125M fox-pro > "$tmp/o" 2>&1 &
    pid=$!
    wait_for "$FAKE_DIR/started"
    kill -"$sig" $pid
    wait $pid
    rc=$?
    [ $rc -eq 75 ] && [ "$(cat "$tmp/scontrol.log" 2> /dev/null)" = "requeue 77" ] && [ "$(cat "$FAKE_DIR/signals")" = USR1 ] &&
        [ "$(launches)" -eq 1 ]
    check $? "slurm.sbatch: SIG$sig to the batch shell reaches the trainer as SIGUSR1, exit 75, scontrol requeue \$SLURM_JOB_ID (rc $rc)"
done
fake 137,0
rm -f "$tmp/scontrol.log"
SLURM_JOB_ID=77 PATH="$tmp/bin:$PATH" bash scripts/paper/slurm.sbatch 125M fox-pro > "$tmp/o" 2>&1
rc=$?
[ $rc -eq 0 ] && [ ! -e "$tmp/scontrol.log" ] && [ "$(launches)" -eq 2 ]
check $? "slurm.sbatch: a crash is relaunched inside the job, exit 0, no requeue (rc $rc)"
fake 3
SLURM_JOB_ID=77 PATH="$tmp/bin:$PATH" bash scripts/paper/slurm.sbatch 125M fox-pro > "$tmp/o" 2>&1
rc=$?
[ $rc -eq 3 ] && [ ! -e "$tmp/scontrol.log" ]
check $? "slurm.sbatch: exit 3 (diverged): no requeue, the job fails (rc $rc)"

# all.sh
(unset OUT; LONGCRAWL64=$LC scripts/paper/all.sh > "$tmp/all.txt")
[ "$(grep -c -- ' --resume$' "$tmp/all.txt")" -eq 12 ] && [ "$(sed 's/.* --out //' "$tmp/all.txt" | sort -u | wc -l)" -eq 12 ]
check $? "all.sh prints the 12 command lines, each with its own --out"
fake 0,0,3,0
(unset OUT; OUT_ROOT=$FAKE_DIR/runs scripts/paper/all.sh --run 125M > "$tmp/o" 2>&1)
rc=$?
[ $rc -eq 1 ] && [ "$(launches)" -eq 4 ] && [ "$(find "$FAKE_DIR/runs" -mindepth 1 -maxdepth 1 -type d | wc -l)" -eq 4 ] && grep -q "fox-llama 125M (exit 3)" "$tmp/o"
check $? "all.sh --run 125M: 4 runs, goes on past one that diverged, exit 1 at the end (rc $rc)"
fake 0,75,0
(unset OUT; OUT_ROOT=$FAKE_DIR/runs RELAUNCH_ON_STOP=0 scripts/paper/all.sh --run 125M > "$tmp/o" 2>&1)
rc=$?
[ $rc -eq 75 ] && [ "$(launches)" -eq 2 ]
check $? "all.sh --run: a run stopped by a signal (75) stops the queue, exit 75 (rc $rc)"
scripts/paper/all.sh --run 125M > /dev/null 2>&1
[ $? -eq 2 ]
check $? "all.sh with OUT set: refused (one OUT for 12 runs)"
unset FAKE_DIR

# ---- the real CPU trainer ----
if [ ! -x "$BIN" ]; then
    echo "SKIP real trainer: $BIN not built"
    finish
fi
export TRAIN_FOX=$BIN RESTART_DELAY=0
SMALL="--layers 1 --dim 32 --heads 2 --mlp-hidden 64 --seq-len 64 --total-batch-tokens 128 --warmup-tokens 256
       --train data/train.bin --val data/val.bin --eval-every 20 --val-steps 2 --ckpt-every 20 --steps 60"
final=ckpt_00000060
# shellcheck disable=SC2086  # SMALL is words
OUT=$tmp/ref "$RUN" 125M fox-pro $SMALL > "$tmp/ref.txt" 2>&1
rc=$?
[ $rc -eq 0 ] && [ -f "$tmp/ref/$final/model.bin" ] && grep -q "x 2 accum" "$tmp/ref.txt"
check $? "real trainer, the paper's flags with a tiny shape and the bundled corpus: 60 steps, exit 0 (rc $rc)"

wait_steps() {  # log.jsonl, n: up to 60 s for n step lines
    local _
    for _ in $(seq 600); do
        [ -f "$1" ] && [ "$(grep -c '"loss"' "$1")" -ge "$2" ] && return 0
        sleep 0.1
    done
    return 1
}
# kill -9 of the trainer between checkpoints: relaunched, resumes from step 20, ends as the reference
# shellcheck disable=SC2086
OUT=$tmp/crash "$RUN" 125M fox-pro $SMALL > "$tmp/crash.txt" 2>&1 &
pid=$!
wait_steps "$tmp/crash/log.jsonl" 25
trainer=$(cat "$tmp/crash/.lock")  # the trainer's PID, in its lock file
[ -n "$trainer" ] && kill -KILL "$trainer"
wait $pid
rc=$?
[ $rc -eq 0 ] && grep -q "launch 1 exited with code 137" "$tmp/crash/relaunch.log" && grep -q "^.*launch 2 (from checkpoint step [1-9]" "$tmp/crash/relaunch.log" &&
    cmp -s "$tmp/ref/$final/model.bin" "$tmp/crash/$final/model.bin"
check $? "kill -9 of the trainer: relaunched with --resume, exit 0, final weights bitwise the uninterrupted run's (rc $rc)"

# SIGTERM to run.sh: the trainer checkpoints and exits 75, run.sh exits 75; run again, it finishes
# shellcheck disable=SC2086
OUT=$tmp/stop "$RUN" 125M fox-pro $SMALL > "$tmp/stop.txt" 2>&1 &
pid=$!
wait_steps "$tmp/stop/log.jsonl" 10
kill -TERM $pid
wait $pid
rc=$?
[ $rc -eq 75 ] && grep -q "stopped by SIGUSR1 at step" "$tmp/stop.txt" && [ "$(grep -c "launch [0-9]* (from" "$tmp/stop/relaunch.log")" -eq 1 ]
check $? "SIGTERM to run.sh: the trainer stops at a step with a checkpoint, exit 75, no relaunch (rc $rc)"
# shellcheck disable=SC2086
OUT=$tmp/stop "$RUN" 125M fox-pro $SMALL >> "$tmp/stop.txt" 2>&1
rc=$?
[ $rc -eq 0 ] && cmp -s "$tmp/ref/$final/model.bin" "$tmp/stop/$final/model.bin" &&
    [ "$(grep -c '"loss"' "$tmp/stop/log.jsonl")" -eq "$(grep -c '"loss"' "$tmp/ref/log.jsonl")" ]
check $? "run again: resumes, exit 0, final weights bitwise the uninterrupted run's, each step logged once (rc $rc)"

# shellcheck disable=SC2086
OUT=$tmp/ref "$RUN" 125M fox-pro $SMALL > "$tmp/again.txt" 2>&1
rc=$?
[ $rc -eq 0 ] && [ "$(grep -c "launch [0-9]* (from" "$tmp/ref/relaunch.log")" -eq 2 ]
check $? "a finished run run again: one launch, exit 0 (rc $rc)"

# ---- 2 ranks under mpirun (the CPU trainer's MPI build: second argument or FOX_MPI_BIN) ----
case "$MPI" in "" | */*) ;; *) MPI=./$MPI ;; esac
if [ -z "$MPI" ] || [ ! -x "$MPI" ] || ! command -v mpirun > /dev/null 2>&1; then
    echo "SKIP mpirun: no MPI build of the CPU trainer (${MPI:-none}) or no mpirun"
    finish
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
export TRAIN_FOX=$MPI LAUNCH="mpirun --oversubscribe --bind-to none -np 2"
# SIGTERM to run.sh: SIGUSR1 to mpirun, which passes it to both ranks; both stop at one step, exit 75
# shellcheck disable=SC2086
OUT=$tmp/mstop "$RUN" 125M fox-pro $SMALL > "$tmp/mstop.txt" 2>&1 &
pid=$!
wait_steps "$tmp/mstop/log.jsonl" 10
kill -TERM $pid
wait $pid
rc=$?
at=$(sed -n 's/^stopped by SIGUSR1 at step \([0-9]*\): resume.*/\1/p' "$tmp/mstop.txt" | head -n 1)
[ $rc -eq 75 ] && [ -n "$at" ] && [ -f "$tmp/mstop/ckpt_$(printf %08d "${at:-0}")/state_00001.bin" ]
check $? "mpirun -np 2: SIGTERM to run.sh stops both ranks at step ${at:-?} with a checkpoint, exit 75 (rc $rc)"
# shellcheck disable=SC2086
OUT=$tmp/mstop "$RUN" 125M fox-pro $SMALL >> "$tmp/mstop.txt" 2>&1
rc=$?
[ $rc -eq 0 ] && [ -f "$tmp/mstop/$final/model.bin" ]
check $? "mpirun -np 2: run again, resumes and finishes (rc $rc)"
# kill -9 of rank 0: mpirun ends the job, run.sh relaunches it
# shellcheck disable=SC2086
OUT=$tmp/mcrash "$RUN" 125M fox-pro $SMALL > "$tmp/mcrash.txt" 2>&1 &
pid=$!
wait_steps "$tmp/mcrash/log.jsonl" 25
rank0=$(cat "$tmp/mcrash/.lock")
[ -n "$rank0" ] && kill -KILL "$rank0"
wait $pid
rc=$?
[ $rc -eq 0 ] && grep -q "launch 2 (from checkpoint step [1-9]" "$tmp/mcrash/relaunch.log" &&
    cmp -s "$tmp/mstop/$final/model.bin" "$tmp/mcrash/$final/model.bin"
check $? "mpirun -np 2: kill -9 of rank 0, relaunched, ends bitwise like the stopped-and-resumed run (rc $rc)"
finish
