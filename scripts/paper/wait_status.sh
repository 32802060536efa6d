# scripts/paper/wait_status.sh (sourced by run.sh and all.sh): wait_status PID leaves PID's exit status in
# rc. `wait` returns above 128 when a trapped signal interrupts it, so wait again while the child lives (a
# child that really died of a signal is gone: kill -0 fails and its status stays).
wait_status() {
    rc=0
    wait "$1" || rc=$?
    while [ "$rc" -gt 128 ] && kill -0 "$1" 2> /dev/null; do
        rc=0
        wait "$1" || rc=$?
    done
}
