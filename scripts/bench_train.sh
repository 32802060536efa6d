#!/bin/sh
# scripts/bench_train.sh: end-to-end training throughput of ./train_fox (fox-pro, batch 1 x 16384 tokens,
# the bundled data/train.bin) for 125M and 760M at every --recompute level: tokens/s and MFU (mean of
# the steps after the first two) and the device memory in use after the first step; also, at recompute 0,
# with the faster nondeterministic attention backward (--deterministic 0).
# Usage (repository root, on the GPU machine): sh scripts/bench_train.sh [STEPS]   (default 8)
# LEVELS="0" (default "0 1 2") picks the recompute levels, NONDET=0 skips the --deterministic 0 runs,
# RANKS=N runs data parallel on N GPUs (mpirun; tokens/s counts all ranks' tokens, batch 1 per rank), LOGS=DIR keeps
# each run's whole log there (its step lines: losses and gradient norms to compare builds bit for bit),
# MODEL=gsa trains another preset (Gated Slot Attention: its 4 heads, not --heads; several, one after the other:
# MODEL="fox-pro fox-fam transformer-fam", TransformerFAM at its defaults: blocks of 1024, memory 64, window 3),
# SIZES="125M" (default "125M 760M") picks the sizes, TIMELINE=DIR records each run's kernels there (one rank;
# dev/cuda/timeline.so, built by make -C dev/cuda timeline.so) and adds the steps' GPU busy and idle time to its
# line (python3 scripts/timeline.py DIR/FILE.tsv gives the rest: each kernel's time, the gaps).
# Each line ends with the SM clock and the power drawn while the GPUs were busy (nvidia-smi every 100 ms, the
# samples at 90% utilisation or more, every GPU's pooled) and the share of those samples under the driver's power
# cap: where the cap binds, the kernels run below their full clock (dev/perf_history/2026-11-27.md "The 760M step under the power
# cap").
set -e
STEPS=${1:-8}
LEVELS=${LEVELS:-0 1 2}
NONDET=${NONDET:-1}
RANKS=${RANKS:-1}
LOGS=${LOGS:-}
TIMELINE=${TIMELINE:-}
LAUNCH=""
TAG=""
if [ "$RANKS" -gt 1 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
    LAUNCH="mpirun --bind-to none -np $RANKS"
    TAG=" x $RANKS GPUs"
fi
test -x ./train_fox || { echo "error: build ./train_fox first (make train_fox)"; exit 1; }
if [ -n "$TIMELINE" ]; then
    [ "$RANKS" -eq 1 ] || { echo "error: TIMELINE records one rank (RANKS=1)"; exit 2; }
    test -f dev/cuda/timeline.so || { echo "error: build dev/cuda/timeline.so first (make -C dev/cuda timeline.so)"; exit 1; }
    mkdir -p "$TIMELINE"
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
MODEL=${MODEL:-fox-pro}
SIZES=${SIZES:-125M 760M}
COMMON="--seq-len 16384 --batch 1 --steps $STEPS --val '' --eval-every 0 --sample-tokens 0 --warmup-tokens 1M"
run() {  # name (the preset first), recompute level, size flags
    file=$(echo "$1" | tr -c 'A-Za-z0-9\n' _)_r$2
    record=""
    if [ -n "$TIMELINE" ]; then
        [ ! -e "$TIMELINE/$file.tsv" ] || { echo "$1 recompute $2: $TIMELINE/$file.tsv exists (a run never overwrites another's)"; return 0; }
        record="FOX_TIMELINE=$TIMELINE/$file.tsv CUDA_INJECTION64_PATH=$PWD/dev/cuda/timeline.so"
    fi
    smi=$(mktemp)
    nvidia-smi --query-gpu=utilization.gpu,clocks.sm,power.draw,clocks_event_reasons.sw_power_cap \
        --format=csv,noheader,nounits -lms 100 > "$smi" 2>/dev/null &
    smi_pid=$!
    log=$(eval $record $LAUNCH ./train_fox --model ${1%% *} $COMMON --recompute "$2" $3 2>&1) || {
        kill $smi_pid 2>/dev/null; rm -f "$smi"; echo "$log" | tail -5; echo "$1 recompute $2: FAILED"; return 0; }
    kill $smi_pid 2>/dev/null || true
    wait $smi_pid 2>/dev/null || true
    clock=$(awk -F', ' '$1 + 0 >= 90 { n++; c += $2; p += $3; if ($4 == "Active") k++ }
        END { if (n) printf " | %.0f MHz, %.0f W, power-capped %.0f%% (%d busy samples)", c / n, p / n, 100 * k / n, n }' "$smi")
    rm -f "$smi"
    [ -z "$LOGS" ] || { mkdir -p "$LOGS" && echo "$log" > "$LOGS/$file.log"; }
    [ -z "$TIMELINE" ] || log="$log
timeline: $(python3 scripts/timeline.py "$TIMELINE/$file.tsv" 2>&1 | grep -m1 -E '^wall|timeline.py:')"
    echo "$log" | awk -v name="$1$TAG" -v rc="$2" -v clock="$clock" '
        /^step / && /tok\/s/ { n++; for (i = 1; i <= NF; i++) { if ($i == "tok/s") tps = $(i-1); if ($i == "MFU") mfu = $(i+1) }
                               if (n > 2) { st += tps; sm += mfu + 0; k++ } }
        /^memory/ { mem = $0; sub(/^memory \(recompute [0-9], /, "", mem); sub(/\): /, ": ", mem) }
        /^timeline: / { tl = " | " substr($0, 11) }
        END { printf "%-24s recompute %s: %8.0f tok/s  MFU %5.1f%%  (mean of %d steps) | %s%s%s\n", name, rc, st / k, sm / k, k, mem, tl, clock }'
}
for size in $SIZES; do
    case $size in
    125M) flags="--layers 12 --dim 768 --heads 12" ;;
    760M) flags="--layers 24 --dim 1536 --heads 24 --lr 1e-3" ;;
    *) echo "error: SIZES takes 125M and 760M"; exit 2 ;;
    esac
    for model in $MODEL; do
        for level in $LEVELS; do run "$model $size" "$level" "$flags"; done
        [ "$NONDET" = 0 ] || run "$model $size --deterministic 0" 0 "$flags --deterministic 0"
    done
done
