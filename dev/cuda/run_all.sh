#!/bin/sh
# dev/cuda/run_all.sh: builds and runs every per-kernel check of the row-wise kernels (rmsnorm, attn_inputs,
# forget_gate, output_gate, swiglu, crossentropy, adamw, embedding) and of TransformerFAM's fox/fam.cuh (fam), then prints one table of their summary rows:
# worst err/tol over a launch group's outputs (PASS when <= 1), median time of 21 launches after 3 warm-up,
# and GB/s over the bytes that must move ("(L2)": the working set fits in twice the L2, not an HBM figure).
# Exit status: non-zero if a build or any check failed.
#   sh dev/cuda/run_all.sh            (SKIP_BUILD=1 to use the binaries as they are; PROGS="a b" for a subset)
cd "$(dirname "$0")" || exit 1
PROGS=${PROGS:-"rmsnorm attn_inputs forget_gate output_gate swiglu crossentropy adamw embedding fam"}
if [ -z "$SKIP_BUILD" ]; then
    make -j8 $PROGS || exit 1
fi
tmp=$(mktemp -d)
status=0
results=""
for p in $PROGS; do
    echo "=================== $p"
    t0=$(date +%s)
    ./$p > "$tmp/$p.log" 2>&1
    rc=$?
    t1=$(date +%s)
    cat "$tmp/$p.log"
    [ $rc -eq 0 ] || status=1
    results="$results$p: exit $rc, $((t1 - t0)) s\n"
done
echo
echo "=================== summary"
cat "$tmp"/*.log | grep '^@@ ' | sed 's/^@@ //' | awk -F' [|] ' '
    BEGIN { printf "%-12s | %-22s | %-38s | %7s | %-4s | %9s | %s\n", "kernel", "op", "shape", "err/tol", "", "us", "GB/s"
            printf "%s\n", "-------------+------------------------+----------------------------------------+---------+------+-----------+---------" }
    { printf "%-12s | %-22s | %-38s | %7s | %-4s | %9s | %s\n", $1, $2, $3, $4, $5, $6, $7 }'
echo
printf "$results"
grep -h "^device:" "$tmp"/*.log | head -1
if [ $status -eq 0 ]; then echo "ALL PASS"; else echo "SOME CHECKS FAILED"; fi
rm -rf "$tmp"
exit $status
