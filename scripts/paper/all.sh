#!/usr/bin/env bash
# scripts/paper/all.sh: the paper's 12 LongCrawl64 runs (125M / 360M / 760M x fox-pro, transformer-pro,
# fox-llama, transformer-llama; scripts/paper/README.md has the table).
#
#   scripts/paper/all.sh                 print the 12 trainer command lines (run.sh --dry-run)
#   scripts/paper/all.sh --run [SIZE...] run them one after another on this machine, each through run.sh
#                                        (default sizes 125M 360M 760M; 760M-16B is the fourth
#                                        configuration of Table 4)
#   scripts/paper/all.sh --sbatch [SIZE...]  submit one Slurm job each (scripts/paper/slurm.sbatch)
#
# The environment goes to run.sh (LONGCRAWL64, OUT_ROOT, NGPU, LAUNCH, TRAIN_FOX, ...), except OUT: each
# run gets its own, ${OUT_ROOT:-runs/paper}/MODEL_SIZE. A run already finished is relaunched, resumes at
# its last step and exits 0 at once. --run goes on past a run that diverged (exit 3) or gave up, and
# stops at once when run.sh was stopped by a signal (exit 75); it exits non-zero if any run failed.
set -u
here=$(dirname "$0")
# shellcheck source=scripts/paper/wait_status.sh
. "$here/wait_status.sh"
MODELS="fox-pro transformer-pro fox-llama transformer-llama"
mode=print
case "${1:-}" in
--run) mode=run; shift ;;
--sbatch) mode=sbatch; shift ;;
--dry-run) shift ;;
-*) echo "usage: $0 [--run|--sbatch] [SIZE...]" >&2; exit 2 ;;
esac
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(125M 360M 760M)
if [ -n "${OUT:-}" ]; then
    echo "error: OUT would put every run in one directory: set OUT_ROOT instead" >&2
    exit 2
fi

# --run: run.sh in the background, so that a signal to this script reaches it (as SIGUSR1: run.sh
# then has the trainer checkpoint and stop, and exits 75).
run_pid=""
forward() { [ -z "$run_pid" ] || kill -USR1 "$run_pid" 2> /dev/null; }
trap forward USR1 TERM INT HUP
run_one() {  # SIZE MODEL: run.sh's exit code in rc
    "$here/run.sh" "$1" "$2" &
    run_pid=$!
    wait_status "$run_pid"
    run_pid=""
}

failed=()
for size in "${sizes[@]}"; do
    for model in $MODELS; do
        case "$mode" in
        print) "$here/run.sh" --dry-run "$size" "$model" || exit ;;
        sbatch) sbatch --job-name="fox-$model-$size" "$here/slurm.sbatch" "$size" "$model" || exit ;;
        run)
            echo "=== $model $size"
            run_one "$size" "$model"
            case "$rc" in
            0) ;;
            75) echo "=== stopped by a signal during $model $size: run $0 --run again to go on" >&2; exit 75 ;;
            *) echo "=== $model $size failed (exit $rc): going on with the next run" >&2; failed+=("$model $size (exit $rc)") ;;
            esac ;;
        esac
    done
done
if [ ${#failed[@]} -gt 0 ]; then
    printf '=== failed: %s\n' "${failed[@]}" >&2
    exit 1
fi
