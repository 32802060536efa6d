#!/bin/sh
# test/test_run_tests.sh: the test harness (scripts/run_tests.sh) and the set-up script (scripts/setup.sh),
# with fake suites: a suite that crashes, exits non-zero or prints no summary line counts as failed in the
# closing "N passed, M failed" line and the exit status; setup.sh prints nothing when nothing is missing,
# as root names what it installs, as anyone else prints the one apt-get command and exits 1.
# Run from the repository root (`make test` does); ends with "N passed, M failed".
set -u
. "$(dirname "$0")/test_lib.sh"
RUN="sh scripts/run_tests.sh"
OK="ok=echo '5 passed, 0 failed'"
ABORT="abort=echo '100 passed, 0 failed'; kill -ABRT \$\$"
EXIT134="exit134=echo '100 passed, 0 failed'; exit 134"
SILENT="silent=echo 'no summary here'"
SOME="some=echo '3 passed, 1 failed'"
last() { tail -n 1 "$tmp/o"; }

$RUN "$OK" > "$tmp/o" 2>&1
st=$?
[ $st -eq 0 ] && [ "$(last)" = "5 passed, 0 failed" ] && grep -qx '=== ok: exit 0, 5 passed, 0 failed' "$tmp/o"
check $? "one passing suite: exit $st, $(last)"

$RUN "$OK" "$ABORT" > "$tmp/o" 2>&1
st=$?
[ $st -ne 0 ] && [ "$(last)" = "105 passed, 1 failed" ] &&
    grep -qx '=== abort: exit 134, 100 passed, 0 failed (counted as 1 failed)' "$tmp/o"
check $? "a suite that prints a passing summary, then SIGABRT: exit $st, $(last)"

$RUN "$EXIT134" "$OK" > "$tmp/o" 2>&1
st=$?
[ $st -ne 0 ] && [ "$(last)" = "105 passed, 1 failed" ] &&
    grep -qx '=== exit134: exit 134, 100 passed, 0 failed (counted as 1 failed)' "$tmp/o"
check $? "a suite that prints a passing summary, then exits 134 (first of two): exit $st, $(last)"

$RUN "$SILENT" > "$tmp/o" 2>&1
st=$?
[ $st -ne 0 ] && [ "$(last)" = "0 passed, 1 failed" ] && grep -qx '=== silent: exit 0, no summary line (counted as 1 failed)' "$tmp/o"
check $? "a suite with no summary line that exits 0: exit $st, $(last)"

$RUN "$SOME" > "$tmp/o" 2>&1
st=$?
[ $st -ne 0 ] && [ "$(last)" = "3 passed, 1 failed" ] && grep -qx '=== some: exit 0, 3 passed, 1 failed' "$tmp/o"
check $? "a suite that exits 0 saying 3 passed, 1 failed: exit $st, $(last)"

$RUN "both=echo '2 passed, 2 failed'; exit 1" > "$tmp/o" 2>&1
st=$?
[ $st -ne 0 ] && [ "$(last)" = "2 passed, 2 failed" ]
check $? "a suite that fails and says so is not counted twice: exit $st, $(last)"

$RUN "$OK" "$ABORT" "$SILENT" "$SOME" "$EXIT134" > "$tmp/o" 2>&1
st=$?
[ $st -ne 0 ] && [ "$(last)" = "208 passed, 4 failed" ] && [ "$(sed -n '$!{h;d};x;p' "$tmp/o")" = "=== all suites" ]
check $? "all five together: exit $st, $(last)"

$RUN > "$tmp/o" 2>&1
st=$?
[ $st -eq 0 ] && [ "$(last)" = "0 passed, 0 failed" ]
check $? "no suites: exit $st, $(last)"

# ---- scripts/setup.sh (FOX_SETUP_PROBE makes it believe packages are missing, FOX_SETUP_DRY_RUN=1 stops
# a root run before apt-get)
sh scripts/setup.sh > "$tmp/o" 2>&1
st=$?
[ $st -eq 0 ] && [ ! -s "$tmp/o" ]
check $? "setup.sh: every package is here, nothing printed: exit $st $(head -c 300 "$tmp/o")"

if [ "$(id -u)" -eq 0 ]; then
    FOX_SETUP_PROBE=python3-zarr,libblosc-dev,python3-zarr FOX_SETUP_DRY_RUN=1 sh scripts/setup.sh > "$tmp/o" 2>&1
    st=$?
    [ $st -eq 0 ] && [ "$(cat "$tmp/o")" = "installing: python3-zarr libblosc-dev" ]
    check $? "setup.sh as root installs what is missing, each package once: exit $st, $(cat "$tmp/o")"
    if command -v setpriv > /dev/null 2>&1; then
        FOX_SETUP_PROBE=nodejs,npm setpriv --reuid=65534 --regid=65534 --clear-groups sh scripts/setup.sh > "$tmp/o" 2>&1
        st=$?
        [ $st -eq 1 ] && [ "$(wc -l < "$tmp/o")" -eq 1 ] &&
            grep -q '^error: .*: sudo apt-get install -y nodejs npm$' "$tmp/o"
        check $? "setup.sh as another user prints the one command, exit 1: exit $st, $(cat "$tmp/o")"
    else
        echo "SKIP setup.sh as another user: no setpriv"
    fi
else
    FOX_SETUP_PROBE=nodejs,npm sh scripts/setup.sh > "$tmp/o" 2>&1
    st=$?
    [ $st -eq 1 ] && [ "$(wc -l < "$tmp/o")" -eq 1 ] && grep -q '^error: .*: sudo apt-get install -y nodejs npm$' "$tmp/o"
    check $? "setup.sh (not root) prints the one command, exit 1: exit $st, $(cat "$tmp/o")"
fi
finish
