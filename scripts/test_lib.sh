# scripts/test_lib.sh: what the shell test scripts share (sourced): a temporary directory, PASS/FAIL
# counting, the training losses of a log.jsonl, and the closing "N passed, M failed" line.
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
finish() {  # removes the temporary directory, prints the summary line, exits non-zero on any failure
    rm -rf "$tmp"
    echo "$pass passed, $fail failed"
    [ "$fail" -eq 0 ]
    exit $?
}
