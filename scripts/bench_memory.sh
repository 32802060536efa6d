#!/bin/sh
# scripts/bench_memory.sh: where one GPU ends. For fox-pro at batch 1 and each context (16K, 32K, 64K, 128K),
# --recompute level (0, 1, 2) and size (125M, 760M), one run of ./train_fox of a few steps on the bundled
# data/train.bin: the device memory in use after the first step (what cudaMemGetInfo shows; everything is
# allocated up front, so it is the peak) with train_fox's own split of it (weights+grads+AdamW, activations,
# backward scratch), and the tokens/s and MFU of the steps after the first. At the end, per size and level, the
# least-squares line of memory in use against tokens: its slope is the activation memory a token costs, its
# intercept what does not grow with the context, and where the line meets the device's memory is the longest
# context one GPU trains at that level (docs/scaling.md §a; scripts/scaling_model.py --memory-log reads this output).
# Usage (repository root, on the GPU machine, after make train_fox): sh scripts/bench_memory.sh [STEPS]   (default 3)
# SEQS="16384 32768 65536 131072" picks the contexts, LEVELS="0 1 2" the recompute levels, SIZES="125M 760M" the
# sizes (also 360M: 24 x 1024, and 1.3B: 24 x 2048 with 32 heads of 64), MODEL=fox-pro the preset, LOGS=DIR keeps
# each run's whole log there, BUDGET=480 the seconds the sweep may take: a run whose predicted time (its FLOPs at
# a conservative MFU, corrected by the runs before it, plus the start-up the runs before it took) does not fit in
# what is left is skipped, with a line that says so.
# A run that does not fit prints one line with train_fox's need (train_fox refuses it before allocating anything).
# At --recompute 0, train_fox keeps the activations of as many blocks as the device holds and recomputes the rest;
# a run that could not keep every block says "partial" and stays out of the fit (its memory is the device's, not
# what the level needs).
set -e
STEPS=${1:-3}
SEQS=${SEQS:-16384 32768 65536 131072}
LEVELS=${LEVELS:-0 1 2}
SIZES=${SIZES:-125M 760M}
MODEL=${MODEL:-fox-pro}
LOGS=${LOGS:-}
BUDGET=${BUDGET:-480}
[ "$STEPS" -ge 2 ] || { echo "error: STEPS must be 2 or more (tokens/s is the mean of the steps after the first)"; exit 2; }
test -x ./train_fox || { echo "error: build ./train_fox first (make train_fox)"; exit 1; }
[ -z "$LOGS" ] || mkdir -p "$LOGS"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || true
COMMON="--batch 1 --steps $STEPS --val '' --eval-every 0 --sample-tokens 0 --warmup-tokens 1M"
data=$(mktemp)      # one line a run that kept everything its level keeps: size level tokens in_use acts+scratch weights device
timing=$(mktemp)    # one line a run: level predicted_step_s measured_step_s overhead_s
trap 'rm -f "$data" "$timing"' EXIT
start=$(date +%s)

# size -> train_fox flags, and N (parameters but the input embedding: docs/model.md §6), layers, d_model
shape() {
    case $1 in
    125M) flags="--layers 12 --dim 768 --heads 12"; nparam=123910800; nl=12; dm=768 ;;
    360M) flags="--layers 24 --dim 1024 --heads 16"; nparam=367339904; nl=24; dm=1024 ;;
    760M) flags="--layers 24 --dim 1536 --heads 24 --lr 1e-3"; nparam=759512640; nl=24; dm=1536 ;;
    1.3B) flags="--layers 24 --dim 2048 --heads 32 --lr 1e-3"; nparam=1328435968; nl=24; dm=2048 ;;
    *) echo "error: SIZES takes 125M, 360M, 760M and 1.3B"; exit 2 ;;
    esac
}

# Predicted seconds of a run: start-up and the first step's extra time (GEMM tuning), the largest of the runs so far
# (10 s before any), plus STEPS steps, a step
# being the FLOPs of docs/model.md §6 at MFU 33% / 30% / 25% for levels 0 / 1 / 2, times the largest ratio of
# measured to predicted step so far at that level (1 before any).
predict() {  # level tokens
    awk -v lv="$1" -v T="$2" -v n="$nparam" -v L="$nl" -v D="$dm" -v steps="$STEPS" '
        { if ($4 > over) over = $4; if ($1 == lv && $2 > 0 && $3 / $2 > k) k = $3 / $2 }
        END { if (!over) over = 10; if (!k) k = 1; eff = lv == 0 ? 0.33 : lv == 1 ? 0.30 : 0.25
              step = T * 3 * (2 * n + 2 * L * D * T) / (eff * 989.4e12)
              printf "%.3f %.0f\n", step, over + steps * step * k }' "$timing"
}

run() {  # size level tokens
    name="$1 recompute $2 seq $3"
    set -- $(predict "$2" "$3")
    pstep=$1 ptime=$2
    now=$(date +%s)
    left=$((BUDGET - (now - start)))
    if [ "$ptime" -gt "$left" ]; then
        echo "$name: skipped: predicted ${ptime} s, ${left} s of the ${BUDGET} s budget left (BUDGET= to allow it)"
        return 0
    fi
    rc=0
    log=$(eval ./train_fox --model "$MODEL" $COMMON --seq-len "$tokens" --recompute "$level" $flags 2>&1) || rc=$?
    wall=$(($(date +%s) - now))
    [ -z "$LOGS" ] || echo "$log" > "$LOGS/$(echo "$size" | tr . _)_r${level}_t${tokens}.log"
    if [ "$rc" -ne 0 ]; then
        need=$(echo "$log" | sed -n 's/^error: this run needs \([0-9.]* GiB\) of device memory (\(.*\)) but \([0-9.]* GiB\) is free.*/needs \1 (\2), \3 free/p' | head -1)
        if [ -n "$need" ]; then
            echo "$name: does not fit: $need | ${wall} s"
            echo "$level 0 0 $wall" >> "$timing"
        else
            echo "$log" | tail -5
            echo "$name: FAILED (exit $rc) | ${wall} s"
        fi
        return 0
    fi
    echo "$log" | awk -v name="$name" -v size="$size" -v lv="$level" -v T="$tokens" -v wall="$wall" -v pstep="$pstep" \
        -v data="$data" -v timing="$timing" '
        /^step / && /tok\/s/ { n++
            for (i = 1; i <= NF; i++) { if ($i == "tok/s") tps = $(i-1); if ($i == "MFU") mfu = $(i+1); if ($i == "ms") ms = $(i-1) }
            if (n > 1) { st += tps; sm += mfu + 0; sms += ms; k++ } }
        /^memory \(recompute/ {
            s = $0; sub(/^memory \(recompute /, "", s); ran = s + 0
            s = $0; sub(/.*kept in /, "", s); split(s, a, " "); qkv = a[1]; L = a[3]
            s = $0; sub(/.*xn, z, h in /, "", s); outs = s + 0
            s = $0; sub(/.*\): /, "", s); inuse = s + 0
            s = $0; sub(/.*on the device of /, "", s); dev = s + 0
            s = $0; sub(/.*weights\+grads\+AdamW /, "", s); w = s + 0
            s = $0; sub(/.*activations /, "", s); act = s + 0
            s = $0; sub(/.*backward scratch /, "", s); scr = s + 0 }
        END {
            if (inuse == "") { print name ": FAILED (no memory line in the log) | " wall " s"; exit }
            partial = lv == 0 && (qkv < L || outs < L)
            keep = lv == 0 ? sprintf(" | kept q,k,v %d/%d, xn,z,h %d/%d%s", qkv, L, outs, L,
                                     ran != lv ? " (ran as --recompute " ran ": not in the fit)" :
                                     partial ? " (partial: not in the fit)" : "") : ""
            rate = k ? sprintf("%.0f tok/s MFU %.1f%% (mean of steps 2-%d)", st / k, sm / k, n) : "no tok/s"
            printf "%s: %.2f GiB in use of %.2f | ours: weights+grads+AdamW %.2f, activations %.2f, backward scratch %.2f GiB%s | %s | %d s\n",
                name, inuse, dev, w, act, scr, keep, rate, wall
            if (!partial) printf "%s %s %s %.4f %.4f %.4f %.4f\n", size, lv, T, inuse, act + scr, w, dev >> data
            over = k ? wall - n * sms / k / 1000 : wall; if (over < 0) over = 0
            printf "%s %s %.3f %.1f\n", lv, pstep, k ? sms / k / 1000 : 0, over >> timing }'
}

for size in $SIZES; do
    shape "$size"
    for tokens in $SEQS; do
        for level in $LEVELS; do run "$size" "$level" "$tokens"; done
    done
done

echo "per-token memory: least squares of GiB in use against tokens over the contexts that ran, per size and level"
awk -v h100=79.65 '
    { key = $1 " recompute " $2; if (!(key in n)) order[++m] = key
      n[key]++; x = $3; y = $4; z = $5; sx[key] += x; sy[key] += y; sz[key] += z; sxx[key] += x * x; sxy[key] += x * y
      sxz[key] += x * z; w[key] = $6; dev[key] = $7
      if (!(key in lo) || x < lo[key]) lo[key] = x
      if (!(key in hi) || x > hi[key]) hi[key] = x }
    END {
        for (i = 1; i <= m; i++) { k = order[i]
            if (n[k] < 2) { printf "%s: one context only (%d tokens): no fit\n", k, lo[k]; continue }
            d = n[k] * sxx[k] - sx[k] * sx[k]
            b = (n[k] * sxy[k] - sx[k] * sy[k]) / d; a = (sy[k] - b * sx[k]) / n[k]
            bz = (n[k] * sxz[k] - sx[k] * sz[k]) / d
            printf "%s: %.0f KiB a token in use (activations + backward scratch %.0f), %.2f GiB fixed (weights+grads+AdamW %.2f); ", \
                k, b * 1024 * 1024, bz * 1024 * 1024, a, w[k]
            printf "fills this %.1f GiB device at ~%d tokens, an H100 (%.2f GiB) at ~%d (fit over %d contexts, %d..%d)\n", \
                dev[k], int((dev[k] - a) / b / 1000 + 0.5) * 1000, h100, int((h100 - a) / b / 1000 + 0.5) * 1000, n[k], \
                lo[k], hi[k] } }' "$data"
echo "sweep: $(($(date +%s) - start)) s"
