# test/test_lib.sh: what the shell test scripts share (sourced): a temporary directory, PASS/FAIL
# counting, the training losses of a log.jsonl, the GPU trainer's train/resume/eval checks, and the closing "N passed, M failed" line.
tmp=$(mktemp -d)
pass=0
fail=0
check() {  # status, label
    if [ "$1" -eq 0 ]; then pass=$((pass + 1)); echo "PASS $2"; else fail=$((fail + 1)); echo "FAIL $2"; fi
}
losses_after() {  # log, step: "step loss" of the training lines after that step
    sed -n 's/^{"step": \([0-9]*\), "loss": \([^,]*\),.*/\1 \2/p' "$1" | awk -v s="$2" '$1 > s'
}
trainer_shape() {  # trainer: the small model the shell tests train (the GPU kernel's head dims are 64 and 128)
    case "$1" in
    *_cpu*) echo "--layers 2 --dim 32 --heads 2 --mlp-hidden 64" ;;
    *) echo "--layers 2 --dim 128 --heads 2" ;;
    esac
}
train_resume_eval_checks() {  # name: $GPU trains $ARGS 20 steps (the loss falls, a sample is printed), a resume
    # from step 10 is bitwise the uninterrupted run, $CPU trains the
    # GPU checkpoint on, and --eval-only's L(i) at twice the context agrees with $CPU's on the same checkpoint (bf16
    # against fp32). Leaves the run in $tmp/a.
    $GPU $ARGS --sample-tokens 16 --out "$tmp/a" > "$tmp/a.txt" 2>&1
    check $? "train_fox ($1) trains 20 steps, checkpoints at 10 and 20 ($(grep -c '^step .*tok/s' "$tmp/a.txt") step lines)"
    first=$(losses_after "$tmp/a/log.jsonl" 0 | head -n 1 | cut -d' ' -f2)
    last=$(losses_after "$tmp/a/log.jsonl" 0 | tail -n 1 | cut -d' ' -f2)
    awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 1.0) }'
    check $? "the loss falls (step 1: $first, step 20: $last)"
    grep -q '^sample: ' "$tmp/a.txt"
    check $? "a decoded sample is printed"

    mkdir -p "$tmp/b" && cp -r "$tmp/a/ckpt_00000010" "$tmp/b/"
    $GPU $ARGS --sample-tokens 0 --resume --out "$tmp/b" > "$tmp/b.txt" 2>&1
    check $? "train_fox ($1) resumes from step 10"
    losses_after "$tmp/a/log.jsonl" 10 > "$tmp/la"
    losses_after "$tmp/b/log.jsonl" 10 > "$tmp/lb"
    cmp -s "$tmp/la" "$tmp/lb" && [ "$(wc -l < "$tmp/la")" -eq 10 ]
    check $? "steps 11-20 after the resume have bitwise the same losses ($(wc -l < "$tmp/lb") compared)"
    cmp -s "$tmp/a/ckpt_00000020/model.bin" "$tmp/b/ckpt_00000020/model.bin"
    check $? "and the same final weights"

    cp -r "$tmp/a" "$tmp/c"
    $CPU $ARGS --steps 22 --sample-tokens 0 --eval-every 0 --resume --out "$tmp/c" > "$tmp/c.txt" 2>&1
    check $? "train_fox_cpu resumes the GPU's $1 checkpoint and trains 2 more steps"

    $GPU --eval-only --out "$tmp/a" --eval-seqs 4 --eval-seq-len 512 > "$tmp/eg.txt" 2>&1
    check $? "train_fox --eval-only ($1) at twice the training context"
    mkdir -p "$tmp/ec" && cp "$tmp/a/per_token_loss.npy" "$tmp/ec/gpu.npy"
    $CPU --eval-only --out "$tmp/a" --eval-seqs 4 --eval-seq-len 512 > "$tmp/ec.txt" 2>&1
    check $? "train_fox_cpu --eval-only on the same checkpoint"
    $PY -c "
import numpy as np, sys
g, c = np.load('$tmp/ec/gpu.npy'), np.load('$tmp/a/per_token_loss.npy')
d = abs(g.mean() - c.mean())
print('GPU mean L %.5f, CPU %.5f, |diff| %.2e' % (g.mean(), c.mean(), d))
sys.exit(not (g.shape == c.shape == (512,) and d < 2e-2))"
    check $? "L(i) of the GPU and the CPU agree in the mean within 2e-2 (bf16 vs fp32)"
}
finish() {  # removes the temporary directory, prints the summary line, exits non-zero on any failure
    rm -rf "$tmp"
    echo "$pass passed, $fail failed"
    [ "$fail" -eq 0 ]
    exit $?
}
