#!/bin/sh
# Ranks that fail loudly and ranks on several nodes, through an MPI build:
# `sh test/test_ranks.sh MPI_BIN` (./train_fox_cpu_mpi in `make test`; ./train_fox in `make test-gpu`, where
# the checks that need more ranks than GPUs are skipped).
#   - SIGSTOP one of 2 ranks mid-step, and rank 0 of 4: the others stop within --collective-timeout (plus the
#     grace of the ranks other than 0) with one line naming the step, mpirun exits 76, and the relaunch with
#     --resume ends bitwise equal to the uninterrupted run;
#   - kill -9 one of 2 ranks mid-step, and one of 4 inside a checkpoint write (FOX_TEST_CKPT_STALL_MS holds it
#     open): mpirun ends the others within seconds, the newest complete checkpoint stays, the relaunch is bitwise;
#   - a slow but live rank (FOX_TEST_SLOW_RANK: 3 s at one step under an 8 s timeout) is not stopped, nor is
#     a rank stopped 5 s and continued under a 4 s timeout;
#   - --collective-timeout shorter than twice the first step: one line, exit 2, no checkpoint;
#   - two "nodes" on this machine (Open MPI starting its second daemon through test/fake_ssh.sh): local ranks
#     restart at 0 on the second node, the start-up line maps them, and 2 nodes x 2 ranks train bitwise like
#     4 ranks of one node (CPU); on GPUs, both nodes' local rank 0 takes GPU 0 of this machine: refused.
set -u
BIN=${1:-./train_fox_cpu_mpi}
. "$(dirname "$0")/test_lib.sh"
if [ ! -x "$BIN" ] || ! command -v mpirun > /dev/null 2>&1; then
    echo "SKIP ranks: $BIN not built or no mpirun (install libopenmpi-dev openmpi-bin)"
    finish
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
MPIRUN="mpirun --oversubscribe --bind-to none"
# The GPU's steps take a millisecond: enough of them that the signals land mid-run.
case "$BIN" in
*_cpu*) most=4 STEPS=16 EVERY=4 ;;
*) most=$(nvidia-smi -L 2> /dev/null | grep -c GPU) STEPS=1000 EVERY=100 ;;
esac
LAST=ckpt_$(printf %08d $STEPS)
ARGS="$(trainer_shape "$BIN") --seq-len 64 --batch 2 --lr 3e-3 --warmup-tokens 512 --sample-tokens 0 --eval-every 0 --steps $STEPS --ckpt-every $EVERY --keep 20"

# The pid of rank $2 of the run whose --out is $1 (its environment names its rank; mpirun's does not).
rank_pid() {
    for p in $(pgrep -f -- "--out $1\$"); do
        if tr '\0' '\n' < "/proc/$p/environ" 2> /dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then
            echo "$p"
            return
        fi
    done
}
# Waits (30 s at most) until the log in $1 holds $2 training steps.
wait_steps() {
    n=0
    while [ $n -lt 600 ] && [ "$(losses_after "$1/log.jsonl" 0 2> /dev/null | wc -l)" -lt "$2" ]; do
        sleep 0.05
        n=$((n + 1))
    done
}
# Relaunches $1 ($2 ranks) with --resume; the whole run's losses and final weights must be the reference's ($3).
resumes_bitwise() {
    $MPIRUN -np "$2" $BIN $ARGS --resume --out "$1" > "$1.resume.txt" 2>&1 &&
        losses_after "$1/log.jsonl" 0 > "$1.l" && cmp -s "$1.l" "$3.l" && cmp -s "$1/$LAST/model.bin" "$3/$LAST/model.bin"
}
now() { date +%s; }
# Whether process $1 still runs (a zombie left to an init that does not reap counts as gone).
alive() {
    s=$(ps -o stat= -p "$1" 2> /dev/null)
    [ -n "$s" ] && [ "${s#Z}" = "$s" ]
}

for np in 2 4; do
    [ "$np" -le "$most" ] || { echo "SKIP $np ranks and their checks: $most GPU(s) here"; continue; }
    $MPIRUN -np $np $BIN $ARGS --out "$tmp/ref$np" > "$tmp/ref$np.txt" 2>&1
    check $? "the uninterrupted run on $np ranks"
    losses_after "$tmp/ref$np/log.jsonl" 0 > "$tmp/ref$np.l"
done

# SIGSTOP: a rank that stops answering. Rank 1 of 2: rank 0 speaks at the timeout.
stopped_rank() {  # ranks, rank to stop, label
    d="$tmp/stop$1_$2"
    $MPIRUN -np "$1" $BIN $ARGS --collective-timeout 4 --out "$d" > "$d.txt" 2> "$d.err" &
    pid=$!
    wait_steps "$d" $((EVERY + 2))
    victim=$(rank_pid "$d" "$2")
    t0=$(now)
    kill -STOP "$victim"
    wait $pid
    st=$?
    n=0  # mpirun may return while its SIGKILL to the stopped rank is still on its way
    while [ $n -lt 60 ] && alive "$victim"; do sleep 0.05; n=$((n + 1)); done
    took=$(($(now) - t0))
    line=$(grep -m1 '^error: rank' "$d.err")
    lines=$(grep -c '^error: rank' "$d.err")
    [ "$st" -eq 76 ] && [ "$took" -le "$4" ] && [ "$lines" -eq 1 ] &&
        echo "$line" | grep -q "no progress for .* in step [0-9]*: the newest checkpoint is ckpt_[0-9]*; relaunch with --resume (exit 76)" &&
        ! alive "$victim"
    check $? "$3: mpirun exits $st after $took s (bound $4 s), every rank gone ($(alive "$victim" && echo "not: the stopped rank is $(ps -o stat= -p "$victim")" || echo yes)), $lines line: $line"
    resumes_bitwise "$d" "$1" "$tmp/ref$1"
    check $? "the relaunch with --resume ends bitwise equal to the uninterrupted run"
}
[ "$most" -ge 2 ] && stopped_rank 2 1 "SIGSTOP to rank 1 of 2 (--collective-timeout 4)" 12
[ "$most" -ge 4 ] && stopped_rank 4 0 "SIGSTOP to rank 0 of 4: the others speak after their grace, naming rank 0" 16
[ "$most" -ge 4 ] && { grep -q "rank 0 did not end the job" "$tmp/stop4_0.err"; check $? "the line says rank 0 did not end the job"; }

# A rank paused and continued (a debugger, a shell's SIGSTOP and SIGCONT) is not taken for a silent peer: rank 0
# stopped 5 s under a 4 s timeout, continued within rank 1's grace, goes on without a line (its own pause is not
# the others' silence).
if [ "$most" -ge 2 ]; then
    d="$tmp/pause"
    $MPIRUN -np 2 $BIN $ARGS --collective-timeout 4 --out "$d" > "$d.txt" 2> "$d.err" &
    pid=$!
    wait_steps "$d" $((EVERY + 2))
    victim=$(rank_pid "$d" 0)
    kill -STOP "$victim"
    sleep 5
    kill -CONT "$victim"
    wait $pid
    st=$?
    losses_after "$d/log.jsonl" 0 > "$d.l"
    [ $st -eq 0 ] && ! grep -q '^error' "$d.err" && cmp -s "$d.l" "$tmp/ref2.l" && cmp -s "$d/$LAST/model.bin" "$tmp/ref2/$LAST/model.bin"
    check $? "rank 0 of 2 stopped 5 s and continued under --collective-timeout 4: exit $st, no line, bitwise the uninterrupted run$(grep -m1 '^error' "$d.err" | sed 's/^/; it said: /')"
fi

# kill -9: mpirun sees the rank die and ends the others.
killed_rank() {  # ranks, rank, stall (ms) in checkpoint writes, label
    d="$tmp/kill$1_$2"
    FOX_TEST_CKPT_STALL_MS=$3 $MPIRUN -np "$1" $BIN $ARGS --out "$d" > "$d.txt" 2>&1 &
    pid=$!
    if [ "$3" -gt 0 ]; then  # inside the write of step 8's checkpoint: its temporary directory exists
        n=0
        while [ $n -lt 600 ] && ! ls -d "$d"/.tmp_ckpt_00000008* > /dev/null 2>&1; do sleep 0.05; n=$((n + 1)); done
    else
        wait_steps "$d" $((EVERY + 2))
    fi
    t0=$(now)
    kill -9 "$(rank_pid "$d" "$2")"
    wait $pid
    st=$?
    took=$(($(now) - t0))
    newest=$(ls -d "$d"/ckpt_* | tail -n 1)
    [ "$st" -ne 0 ] && [ "$took" -le 10 ] && [ -z "$(pgrep -f -- "--out $d\$")" ]
    check $? "$4: mpirun exits $st after $took s, every rank gone (newest checkpoint ${newest##*/})"
    resumes_bitwise "$d" "$1" "$tmp/ref$1"
    check $? "the relaunch resumes from ${newest##*/} and ends bitwise equal to the uninterrupted run"
}
[ "$most" -ge 2 ] && killed_rank 2 1 0 "kill -9 to rank 1 of 2 mid-step"
[ "$most" -ge 4 ] && killed_rank 4 2 1500 "kill -9 to rank 2 of 4 inside the checkpoint write of step 8"
[ "$most" -ge 4 ] && { [ ! -e "$tmp/kill4_2/ckpt_00000008" ] || cmp -s "$tmp/kill4_2/ckpt_00000008/model.bin" "$tmp/ref4/ckpt_00000008/model.bin"; check $? "the checkpoint being written was never taken for a complete one"; }

# A slow but live rank is not stopped: 3 s at step 6 under an 8 s timeout.
if [ "$most" -ge 2 ]; then
    FOX_TEST_SLOW_RANK=1:6:3000 $MPIRUN -np 2 $BIN $ARGS --collective-timeout 8 --out "$tmp/slow" > "$tmp/slow.txt" 2>&1
    st=$?
    losses_after "$tmp/slow/log.jsonl" 0 > "$tmp/slow.l"
    [ $st -eq 0 ] && cmp -s "$tmp/slow.l" "$tmp/ref2.l" && grep -q "^step *6/$STEPS .* [34][0-9][0-9][0-9]\.[0-9] ms" "$tmp/slow.txt"
    check $? "rank 1 sleeping 3 s in step 6 under --collective-timeout 8 is waited for: the run ends bitwise the uninterrupted one ($(grep -o "^step *6/$STEPS .* ms" "$tmp/slow.txt" | sed 's/.*| //'))"

    # A timeout a step could outlast is refused after the first step, before anything is written.
    FOX_TEST_SLOW_RANK=1:1:2000 $MPIRUN -np 2 $BIN $ARGS --collective-timeout 3 --ckpt-every 1 --out "$tmp/short" > "$tmp/short.txt" 2> "$tmp/short.err"
    st=$?
    line=$(grep '^error' "$tmp/short.err" | head -n 1)
    [ $st -eq 2 ] && echo "$line" | grep -q "shorter than twice the first step" && ! grep "^error" "$tmp/short.err" | grep -vqF "$line" &&
        ! ls -d "$tmp"/short/ckpt_* > /dev/null 2>&1
    check $? "--collective-timeout 3 with a first step of 2 s: exit $st, no checkpoint: $line"
fi

# Two nodes on this machine: Open MPI's second daemon comes through fake_ssh.sh (its rsh launcher, whatever
# OMPI_MCA_plm says); TCP between the nodes, as
# between real ones.
printf 'nodeA slots=2\nnodeB slots=2\n' > "$tmp/hosts"
MULTI="mpirun --bind-to none --mca plm rsh --mca plm_rsh_agent $(cd "$(dirname "$0")" && pwd)/fake_ssh.sh --mca btl tcp,self --hostfile $tmp/hosts --map-by node"
# Launches $1 ranks on the two nodes into $tmp/nodes (stdout nodes.txt, stderr nodes.err; more trainer flags
# after $1). A launch whose second daemon never started (no rank ran: neither the map line nor an error of
# ours) is tried once more, and $again says so.
launch_nodes() {
    np=$1
    shift
    again=""
    for try in 1 2; do
        rm -rf "$tmp/nodes"
        $MULTI -np "$np" -x OMP_NUM_THREADS -x NCCL_NVLS_ENABLE $BIN $ARGS "$@" --out "$tmp/nodes" > "$tmp/nodes.txt" 2> "$tmp/nodes.err"
        st=$?
        grep -q -e 'ranks on' -e '^error' "$tmp/nodes.txt" "$tmp/nodes.err" && return
        again=" (launched twice: the first ended $st before any rank ran: $(cat "$tmp/nodes.txt" "$tmp/nodes.err" | grep -m1 .))"
        sleep 2
    done
}
case "$BIN" in
*_cpu*)
    launch_nodes 4
    map=$(grep -m1 'ranks on' "$tmp/nodes.txt")
    [ $st -eq 0 ] && echo "$map" | grep -q '^4 ranks on 2 nodes (rank: node/local rank): 0:0/0 1:1/0 2:0/1 3:1/1;'
    check $? "2 nodes x 2 ranks (--map-by node): local ranks restart at 0 on the second node: ${map:-$(cat "$tmp/nodes.txt" "$tmp/nodes.err" | head -3)}$again"
    losses_after "$tmp/nodes/log.jsonl" 0 > "$tmp/nodes.l"
    cmp -s "$tmp/nodes.l" "$tmp/ref4.l" && cmp -s "$tmp/nodes/$LAST/model.bin" "$tmp/ref4/$LAST/model.bin"
    check $? "and train bitwise like 4 ranks of one node (losses and final weights)"
    ;;
*)
    launch_nodes 2 --steps 1
    line=$(cat "$tmp/nodes.err" "$tmp/nodes.txt" | grep -m1 '^error')
    [ $st -ne 0 ] && echo "$line" | grep -q "ranks 0 and 1 were given the same GPU"
    check $? "2 nodes of 1 rank on one machine: both local ranks 0 take GPU 0: refused (${line:-exit $st: $(cat "$tmp/nodes.txt" "$tmp/nodes.err" | head -3)})$again"
    ;;
esac

finish
