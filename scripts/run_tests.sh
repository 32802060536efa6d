#!/bin/sh
# Runs each test suite given as "label=command", streams its output, and sums the
# "N passed, M failed" line each suite ends with. Exits non-zero if any suite exits non-zero,
# fails a check, or prints no such line.
total_pass=0
total_fail=0
status=0
log=$(mktemp)
rcfile=$(mktemp)
for spec in "$@"; do
    label=${spec%%=*}
    cmd=${spec#*=}
    echo "=== $label: $cmd"
    { sh -c "$cmd" 2>&1; echo $? > "$rcfile"; } | tee "$log"
    rc=$(cat "$rcfile")
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
    if [ -z "$line" ]; then
        echo "=== $label: exit $rc, no summary line"
        status=1
        continue
    fi
    [ "$rc" -eq 0 ] || status=1
    p=$(echo "$line" | sed -E 's/^([0-9]+) passed.*/\1/')
    f=$(echo "$line" | sed -E 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/')
    total_pass=$((total_pass + p))
    total_fail=$((total_fail + f))
    echo "=== $label: exit $rc, $line"
done
rm -f "$log" "$rcfile"
[ "$total_fail" -eq 0 ] || status=1
echo "=== all suites"
echo "$total_pass passed, $total_fail failed"
exit $status
