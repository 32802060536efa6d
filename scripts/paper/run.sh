#!/usr/bin/env bash
# scripts/paper/run.sh: one of the FoX paper's LongCrawl64 runs (Lin et al., "Forgetting Transformer",
# ICLR 2025: §4.1 and Appendix B, Tables 4 and 5), relaunched with --resume after a crash or a
# preemption until it finishes (docs/usage.md, "Runs that survive").
#
# usage: scripts/paper/run.sh [--dry-run] SIZE MODEL [train_fox flags...]     (from the repository root)
#   SIZE   125M | 360M | 760M (the paper's main 760M-parameter / 48B-token runs) | 760M-16B
#   MODEL  fox-pro | transformer-pro | fox-llama | transformer-llama
#   flags  go after the paper's, so they override them (--batch 2, --recompute 1, --seed 0, ...)
#
# Environment:
#   LONGCRAWL64       directory holding LongCrawl64's train.zarr and heldout.zarr (required)
#   OUT               run directory (default ${OUT_ROOT:-runs/paper}/MODEL_SIZE)
#   NGPU              GPUs of this node, one rank each (default 8)
#   LAUNCH            launcher (default "mpirun --bind-to none -np $NGPU"; LAUNCH= runs one process;
#                     under Slurm e.g. "srun --kill-on-bad-exit=1 --gpu-bind=none"). It must pass
#                     SIGUSR1 on to the ranks (mpirun and srun do).
#   TRAIN_FOX         trainer binary (default ./train_fox)
#   MAX_RESTARTS      relaunches in a row that bring no new checkpoint before giving up (default 10)
#   RESTART_DELAY     seconds to wait before relaunching after a crash (default 60)
#   HANG_TIMEOUT      seconds without any write under OUT (log line, checkpoint) after which the run is
#                     taken as hung (a stuck NCCL collective): SIGTERM, SIGKILL after HANG_KILL_GRACE
#                     seconds (default 60), relaunch. Default 0: never. Must exceed the start-up (loading
#                     a checkpoint) and --log-every steps; e.g. 1800.
#   RELAUNCH_ON_STOP  when the trainer exits 75 (stopped by a signal) that did not come through this
#                     script: 1 relaunch, 0 exit 75. Default 0 inside a Slurm job (Slurm signalled the
#                     tasks: the job is ending, let the batch script requeue it), 1 elsewhere.
#   DRY_RUN=1         the same as --dry-run: print the trainer's command line, run nothing
#
# What each exit of the trainer leads to (fox.c's exit codes, docs/usage.md "Runs that survive"):
#   0   the run is finished: exit 0.
#   2   the trainer refused its command line (a bad flag): relaunching cannot help: exit 2.
#   3   the non-finite guard stopped it (--max-bad-steps steps in a row with a NaN/Inf loss or gradient
#       norm): a human must look, no relaunch: exit 3.
#   75  stopped by a signal after writing a checkpoint: if this script passed the signal on, exit 75
#       (run it again, or requeue the job, to go on); else see RELAUNCH_ON_STOP.
#   76  a rank died or stopped answering (the trainer's --collective-timeout, or NCCL's reported error): relaunch
#       with --resume, as for the codes below.
#   any other (1, 137 kill -9 / out of memory, 139, an NCCL failure, ...): relaunch with --resume after
#       RESTART_DELAY seconds, from the newest complete checkpoint; after MAX_RESTARTS relaunches in a row
#       without a new checkpoint, give up: exit 1.
# Every launch passes --resume, which starts afresh when OUT holds no checkpoint yet.
#
# Signals: SIGTERM, SIGINT, SIGUSR1 or SIGHUP to this script is passed on to the launcher as SIGUSR1
# (after a SIGTERM or SIGINT mpirun kills the ranks twice odls_base_sigkill_timeout seconds later, 2 by
# default, but SIGUSR1 it forwards with no time limit; for the trainer the four signals are alike): the trainer finishes its step, writes a checkpoint and exits 75, then this
# script exits 75 without relaunching. A signal during the pause before a relaunch: exit 75 at once.
# (Under nohup SIGHUP stays ignored: a shell cannot trap a signal ignored when it started.)
# Each launch and exit is also logged to OUT/relaunch.log.
set -u
# shellcheck source=scripts/paper/wait_status.sh
. "$(dirname "$0")/wait_status.sh"

PROG=scripts/paper/run.sh
usage() {
    echo "usage: $PROG [--dry-run] SIZE MODEL [train_fox flags...]   SIZE: 125M|360M|760M|760M-16B, MODEL: fox-pro|transformer-pro|fox-llama|transformer-llama" >&2
    exit 2
}

dry=${DRY_RUN:-0}
[ "$dry" = 0 ] || [ "$dry" = 1 ] || { echo "error: DRY_RUN must be 0 or 1" >&2; exit 2; }
if [ "${1:-}" = "--dry-run" ]; then dry=1; shift; fi
[ $# -ge 2 ] || usage
size_arg=$1
size=$(printf '%s' "$size_arg" | tr '[:lower:]' '[:upper:]')
model=$2
shift 2

# ---- The paper's numbers -------------------------------------------------------------------------
# §4.1: training context 16384; 0.5 x 2^20 = 512Ki tokens per step (the official configs:
# 32 sequences x 16384); linear warmup from 0 over 256 x 2^20 tokens, then cosine decay to 0; AdamW
# (0.9, 0.95), weight decay 0.1, gradient clipping 1.0 (fox.c's defaults, passed anyway).
SEQ_LEN=16384
STEP_TOKENS=524288   # 512Ki
# Token budgets. §4.1: the main runs train on 45 x 2^30 tokens ("roughly 48B"). The smaller
# configurations (Table 4, Appendix F.6) are given only as "roughly 2.7B / 7.5B / 16B"; the exact
# budgets, 2.5 / 7 / 15 x 2^30, are the official configs' train.max_tokens
# (zhixuan-lin/forgetting-transformer, configs/experiment/longcrawl64/*/{125m_2b,360m_7b,760m_16b}.yaml).
# Shapes (Table 4): n_layers, d_model, d_head 64, except the 760M Transformers' d_head 128.
# Peak learning rates: Table 5 for the 760M/48B runs (tuned per model); Table 4 for the other three
# configurations (tuned for Transformer (LLaMA), the same for every model: Appendix B.1).
case "$size" in
125M) layers=12 dim=768 tokens=2684354560 lr=2e-3 ;;      # 2.5 x 2^30, "roughly 2.7B"
360M) layers=24 dim=1024 tokens=7516192768 lr=2e-3 ;;     # 7 x 2^30, "roughly 7.5B"
760M-16B) layers=24 dim=1536 tokens=16106127360 lr=1e-3 ;; # 15 x 2^30, "16B"
760M)
    layers=24 dim=1536 tokens=48318382080                  # 45 x 2^30, "roughly 48B"
    case "$model" in
    fox-pro) lr=2e-3 ;;
    transformer-pro) lr=1e-3 ;;
    fox-llama) lr=1e-3 ;;
    transformer-llama) lr=5e-4 ;;
    esac ;;
*) echo "error: unknown SIZE '$size_arg' (125M, 360M, 760M or 760M-16B)" >&2; exit 2 ;;
esac
case "$model" in
fox-pro | transformer-pro | fox-llama | transformer-llama) ;;
*) echo "error: unknown MODEL '$model' (fox-pro, transformer-pro, fox-llama or transformer-llama)" >&2; exit 2 ;;
esac
head_dim=64
case "$size:$model" in 760M*:transformer-*) head_dim=128 ;; esac
heads=$((dim / head_dim))
steps=$((tokens / STEP_TOKENS))
# Pro models: the paper's runs shared one QK-norm weight vector across the heads (Appendix A,
# footnote 4; "no observable impact"): --qk-norm-shared reproduces them (docs/model.md §1). Override with
# --qk-norm-shared off.
shared=()
case "$model" in *-pro) shared=(--qk-norm-shared) ;; esac

# ---- Where things are ----------------------------------------------------------------------------
if [ "$dry" = 1 ]; then
    data=${LONGCRAWL64:-/path/to/longcrawl64}
else
    if [ -z "${LONGCRAWL64:-}" ]; then
        echo "error: set LONGCRAWL64 to the directory holding LongCrawl64's train.zarr and heldout.zarr" >&2
        exit 1
    fi
    data=$LONGCRAWL64
    for a in train.zarr heldout.zarr; do
        [ -d "$data/$a" ] || { echo "error: $data/$a not found (LONGCRAWL64 must hold train.zarr and heldout.zarr)" >&2; exit 1; }
    done
fi
OUT=${OUT:-${OUT_ROOT:-runs/paper}/${model}_${size}}
NGPU=${NGPU:-8}
launch=${LAUNCH-mpirun --bind-to none -np $NGPU}
TRAIN_FOX=${TRAIN_FOX:-./train_fox}
MAX_RESTARTS=${MAX_RESTARTS:-10}
RESTART_DELAY=${RESTART_DELAY:-60}
HANG_TIMEOUT=${HANG_TIMEOUT:-0}
HANG_KILL_GRACE=${HANG_KILL_GRACE:-60}
if [ -n "${SLURM_JOB_ID:-}" ]; then RELAUNCH_ON_STOP=${RELAUNCH_ON_STOP:-0}; else RELAUNCH_ON_STOP=${RELAUNCH_ON_STOP:-1}; fi
for v in NGPU MAX_RESTARTS RESTART_DELAY HANG_TIMEOUT HANG_KILL_GRACE RELAUNCH_ON_STOP; do
    case "${!v}" in '' | *[!0-9]*) echo "error: $v must be a whole number, not '${!v}'" >&2; exit 2 ;; esac
done

# ---- The command line ----------------------------------------------------------------------------
# Not from the paper (the official runs skip evaluation during training and checkpoint every 256Mi
# tokens): validation on 16 micro-batches per rank of heldout.zarr every 1024 steps (512Mi tokens),
# a checkpoint every 512 steps (256Mi tokens), the newest 3 kept, no text sample at the end.
# The paper's own evaluation (2 x 2^30 tokens of the held-out set in sequences of 65536, §4.1) is a
# separate --eval-only run: see scripts/paper/README.md.
read -r -a cmd <<< "$launch"
cmd+=("$TRAIN_FOX"
    --model "$model" --layers "$layers" --dim "$dim" --heads "$heads" "${shared[@]}"
    --train "$data/train.zarr" --val "$data/heldout.zarr"
    --seq-len "$SEQ_LEN" --batch 1 --total-batch-tokens 512Ki --steps "$steps"
    --lr "$lr" --min-lr 0 --warmup-tokens 256Mi --weight-decay 0.1 --grad-clip 1.0
    --eval-every 1024 --val-steps 16 --ckpt-every 512 --keep 3 --sample-tokens 0
    --out "$OUT" --resume "$@")
line=$(printf '%q ' "${cmd[@]}")
line=${line% }
if [ "$dry" = 1 ]; then
    printf '%s\n' "$line"
    exit 0
fi
if ! command -v "$TRAIN_FOX" > /dev/null 2>&1; then
    echo "error: trainer $TRAIN_FOX not found (build it with make train_fox, or set TRAIN_FOX)" >&2
    exit 1
fi

# ---- The relaunch loop ---------------------------------------------------------------------------
mkdir -p "$OUT" || { echo "error: cannot create $OUT" >&2; exit 1; }
note() {  # a line on stderr and in OUT/relaunch.log
    local msg
    msg="$(date '+%Y-%m-%d %H:%M:%S') run.sh[$$]: $*"
    printf '%s\n' "$msg" >&2
    printf '%s\n' "$msg" >> "$OUT/relaunch.log" 2> /dev/null
}
newest_ckpt() {  # the step of the newest complete checkpoint in OUT, 0 when none
    local d s=0
    for d in "$OUT"/ckpt_[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]; do
        [ -d "$d" ] && s=$((10#${d##*_}))
    done
    echo "$s"
}

child=""
stop_sig=""
told=""              # the current child has been sent its SIGUSR1
tell_child() {
    [ -n "$child" ] && [ -z "$told" ] || return 0
    told=1
    kill -USR1 "$child" 2> /dev/null
}
on_signal() {
    if [ -z "$stop_sig" ]; then
        note "got SIG$1: asking the trainer to write a checkpoint and stop (SIGUSR1 to pid ${child:-none}); no relaunch"
    else
        note "got SIG$1 again"
    fi
    stop_sig=$1
    tell_child
}
for s in TERM INT USR1 HUP; do
    # shellcheck disable=SC2064  # $s is meant to expand now
    trap "on_signal $s" "$s"
done

# Waits for the child, through the signals this script traps; with HANG_TIMEOUT, kills it when
# nothing under OUT has been written for that long. Sets rc, and hung=1 when it was killed so.
wait_child() {
    hung=0
    if [ "$HANG_TIMEOUT" -gt 0 ]; then
        local poll=$((HANG_TIMEOUT / 4)) start now termed=0 killed=0 p
        [ "$poll" -ge 1 ] || poll=1
        [ "$poll" -le 30 ] || poll=30
        start=$(date +%s)
        while kill -0 "$child" 2> /dev/null; do
            sleep "$poll" &
            p=$!
            wait "$p" 2> /dev/null
            kill "$p" 2> /dev/null
            kill -0 "$child" 2> /dev/null || break
            now=$(date +%s)
            if [ "$hung" = 0 ]; then
                # alive: a launch younger than HANG_TIMEOUT, or a file under OUT written since
                [ $((now - start)) -ge "$HANG_TIMEOUT" ] || continue
                [ -z "$(find "$OUT" -maxdepth 2 -newermt "@$((now - HANG_TIMEOUT))" -print -quit 2> /dev/null)" ] || continue
                note "nothing written under $OUT for ${HANG_TIMEOUT}s: the run looks hung; SIGTERM to pid $child"
                hung=1
                termed=$now
                kill -TERM "$child" 2> /dev/null
            elif [ "$killed" = 0 ] && [ $((now - termed)) -ge "$HANG_KILL_GRACE" ]; then
                note "pid $child still there ${HANG_KILL_GRACE}s after SIGTERM: SIGKILL"
                killed=1
                kill -KILL "$child" 2> /dev/null
            fi
        done
    fi
    wait_status "$child"
    child=""
}

note "$model $size: $steps steps of 512Ki tokens, peak lr $lr, in $OUT"
launches=0
fruitless=0          # relaunches in a row that brought no new checkpoint
last_ckpt=$(newest_ckpt)
while :; do
    if [ -n "$stop_sig" ]; then
        note "stopped by SIG$stop_sig before launching: exit 75 (run again to resume from step $(newest_ckpt))"
        exit 75
    fi
    launches=$((launches + 1))
    note "launch $launches (from checkpoint step $last_ckpt): $line"
    told=""
    "${cmd[@]}" < /dev/null &
    child=$!
    # a signal that came between the launch and child=$! found no pid to pass on
    if [ -n "$stop_sig" ] && [ -z "$told" ]; then
        note "SIGUSR1 to pid $child (SIG$stop_sig came during the launch)"
        tell_child
    fi
    wait_child
    ckpt=$(newest_ckpt)
    note "launch $launches exited with code $rc (newest checkpoint: step $ckpt)"
    if [ "$rc" -eq 0 ]; then
        note "finished: $steps steps"
        exit 0
    fi
    if [ "$rc" -eq 2 ]; then
        note "the trainer refused its command line (exit 2, the error line above): not relaunching"
        exit 2
    fi
    if [ "$rc" -eq 3 ]; then
        note "DIVERGED: the non-finite guard stopped the run (NaN/Inf loss or gradient norm in --max-bad-steps steps in a row); not relaunching: look at $OUT/log.jsonl (lines with \"skipped\") and the trainer's output. Checkpoints are untouched."
        exit 3
    fi
    if [ "$rc" -eq 76 ] && [ -z "$stop_sig" ]; then
        note "a rank died or stopped answering (exit 76: the trainer's line above names the step): relaunching from step $ckpt"
    fi
    if [ -n "$stop_sig" ]; then
        if [ "$rc" -eq 75 ] || [ "$rc" -gt 128 ]; then
            note "stopped by SIG$stop_sig: exit 75; run the same command again to resume from step $ckpt"
            exit 75
        fi
        note "stopped by SIG$stop_sig, but the trainer exited with code $rc: exit $rc"
        exit "$rc"
    fi
    if [ "$rc" -eq 75 ] && [ "$hung" = 0 ] && [ "$RELAUNCH_ON_STOP" = 0 ]; then
        note "the trainer was stopped by a signal that did not come through this script (RELAUNCH_ON_STOP=0): exit 75; run again or requeue to resume from step $ckpt"
        exit 75
    fi
    if [ "$ckpt" -gt "$last_ckpt" ]; then fruitless=0; else fruitless=$((fruitless + 1)); fi
    last_ckpt=$ckpt
    if [ "$fruitless" -gt "$MAX_RESTARTS" ]; then
        note "giving up: $MAX_RESTARTS relaunches in a row brought no new checkpoint (last exit code $rc): exit 1"
        exit 1
    fi
    if [ "$rc" -ne 75 ] && [ "$RESTART_DELAY" -gt 0 ]; then
        note "relaunching with --resume in ${RESTART_DELAY}s"
        sleep "$RESTART_DELAY" &
        p=$!
        wait "$p" 2> /dev/null
        kill "$p" 2> /dev/null
    fi
done
