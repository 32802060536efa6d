#!/bin/sh
# The test harness itself (scripts/run_tests.sh) and the set-up script (scripts/setup.sh): a suite that
# crashes, exits non-zero or prints no summary counts as failed in the closing line; setup.sh names
# the missing packages (root: installs them, others: the command, exit 1).
set -u
. "$(dirname "$0")/../scripts/test_lib.sh"
RUN="sh scripts/run_tests.sh"

sh scripts/run_tests.sh "ok=echo '5 passed, 0 failed'" > "$tmp/o" 2>&1
st=$?
[ $st -eq 0 ] && [ "$(tail -n 1 "$tmp/o")" = "5 passed, 0 failed" ]
check $? "a passing suite: exit $st, $(tail -n 1 "$tmp/o")"
$RUN "ok=echo '5 passed, 0 failed'" "crash=echo '100 passed, 0 failed'; kill -ABRT \$\$" > "$tmp/o" 2>&1
st=$?
[ $st -ne 0 ] && [ "$(tail -n 1 "$tmp/o")" = "105 passed, 1 failed" ] && grep -q '^=== crash: exit 134, 100 passed, 0 failed (counted as 1 failed)' "$tmp/o"
check $? "a suite that prints a passing summary then aborts: exit $st, $(tail -n 1 "$tmp/o")"
$RUN "silent=true" > "$tmp/o" 2>&1
st=$?
[ $st -ne 0 ] && [ "$(tail -n 1 "$tmp/o")" = "0 passed, 1 failed" ]
check $? "a suite with no summary line: exit $st, $(tail -n 1 "$tmp/o")"
$RUN "some=echo '3 passed, 1 failed'" > "$tmp/o" 2>&1
st=$?
[ $st -ne 0 ] && [ "$(tail -n 1 "$tmp/o")" = "3 passed, 1 failed" ]
check $? "a suite that exits 0 with 1 failed: exit $st, $(tail -n 1 "$tmp/o")"
$RUN "both=echo '2 passed, 2 failed'; exit 1" > "$tmp/o" 2>&1
[ "$(tail -n 1 "$tmp/o")" = "2 passed, 2 failed" ]
check $? "a suite that fails and says so is not counted twice: $(tail -n 1 "$tmp/o")"

sh scripts/setup.sh > "$tmp/o" 2>&1
check $? "setup.sh finds every package here: $(cat "$tmp/o")"
FOX_SETUP_PROBE=python3-zarr,libblosc-dev FOX_SETUP_DRY_RUN=1 sh scripts/setup.sh > "$tmp/o" 2>&1
st=$?
if [ "$(id -u)" -eq 0 ]; then
    [ $st -eq 0 ] && grep -q '^installing: python3-zarr libblosc-dev$' "$tmp/o"
    check $? "setup.sh as root installs what is missing: $(cat "$tmp/o")"
fi
if command -v setpriv > /dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
    FOX_SETUP_PROBE=python3-zarr setpriv --reuid=65534 --regid=65534 --clear-groups sh scripts/setup.sh > "$tmp/o" 2>&1
    st=$?
    [ $st -eq 1 ] && [ "$(wc -l < "$tmp/o")" -eq 1 ] && grep -q '^error: .*python3-zarr.*sudo apt-get install -y python3-zarr' "$tmp/o"
    check $? "setup.sh as another user prints the one command: $(cat "$tmp/o")"
fi
finish
