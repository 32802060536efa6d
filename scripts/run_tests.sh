#!/bin/sh
# Runs each test suite given as "label=command", streams its output, and sums the
# "N passed, M failed" line each suite ends with. A suite that exits non-zero (a crash included) or
# prints no such line counts as one more failure, so the closing line never says 0 failed when a suite
# failed. Exits non-zero if any suite failed.
total_pass=0
total_fail=0
log=$(mktemp)
rcfile=$(mktemp)
for spec in "$@"; do
    label=${spec%%=*}
    cmd=${spec#*=}
    echo "=== $label: $cmd"
    : > "$rcfile"
    { sh -c "$cmd" 2>&1; echo $? > "$rcfile"; } | tee "$log"
    rc=$(cat "$rcfile")
    [ -n "$rc" ] || rc=255  # the suite's shell itself died: a failure too
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
    p=0
    f=0
    if [ -n "$line" ]; then
        p=$(echo "$line" | sed -E 's/^([0-9]+) passed.*/\1/')
        f=$(echo "$line" | sed -E 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/')
    fi
    note=""
    if [ -z "$line" ] || { [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; }; then
        f=$((f + 1))
        note=" (counted as 1 failed)"
    fi
    total_pass=$((total_pass + p))
    total_fail=$((total_fail + f))
    echo "=== $label: exit $rc, ${line:-no summary line}$note"
done
rm -f "$log" "$rcfile"
echo "=== all suites"
echo "$total_pass passed, $total_fail failed"
[ "$total_fail" -eq 0 ]
