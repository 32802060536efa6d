#!/bin/sh
# The sweeps behind docs/results.md's tables, at a toy size through a trainer binary (`sh test/test_sweeps.sh BIN`,
# ./train_fox_cpu in `make test`; PYTHON: one with matplotlib, default python3):
#   - scripts/mqar_sweep.sh: two pair counts by two models (one Gated Slot Attention at a slot count), a result file
#     per run, a table of accuracies in [0, 1]; run again, it trains nothing and prints the same table; a run that
#     fails stops it with one line;
#   - scripts/passkey_sweep.sh: transformer-fam, its window without the memory (transformer-fam:bswa) and fox-pro
#     on one passkey set, each run asked at two lengths, a table of accuracies; fox-pro asked again with --acp 1
#     gives the same 4 answers; the figure of its runs; a model spec it does not know is one line and exit 2, before
#     anything is written;
#   - either sweep where ./fox_data is not built: one line naming it, exit 2.
set -u
BIN=${1:-./train_fox_cpu}
PY=${PYTHON:-python3}
. "$(dirname "$0")/test_lib.sh"

# Rows of a table (after its header): each name in $2, then one number in [0, 1] per column ($3 columns); $4
# lines in all.
table_ok() {  # table file, names, columns, lines
    n=0
    for name in $2; do
        n=$((n + 1))
        sed -n "$((n + 1))p" "$1" | awk -v name="$name" -v cols="$3" \
            '{ ok = $1 == name && NF == cols + 1; for (i = 2; i <= NF; i++) ok = ok && $i ~ /^[0-9.]+$/ && $i >= 0 && $i <= 1; exit !ok }' ||
            return 1
    done
    [ "$(wc -l < "$1")" -eq "$4" ]
}

BIN=$BIN VOCAB=64 SEQ=32 BATCH=4 STEPS=6 sh scripts/mqar_sweep.sh "$tmp/mq" "2 4" "fox-pro gsa:8" > "$tmp/mq.txt" 2> "$tmp/mq.err"
st=$?
head -n 1 "$tmp/mq.txt" | grep -q "^model  *kv=2  *kv=4$" && table_ok "$tmp/mq.txt" "fox-pro gsa_m8" 2 3 &&
    [ -e "$tmp/mq/gsa_m8_kv4/mqar_result.json" ] && grep -q "^GSA mixer: .* 128\*2\*8, and" "$tmp/mq/gsa_m8_kv4.log"
check $((st + $?)) "mqar_sweep.sh: 2 pair counts x fox-pro and gsa with 8 slots, exit $st, a table: $(tr '\n' '|' < "$tmp/mq.txt")"
BIN=$BIN VOCAB=64 SEQ=32 BATCH=4 STEPS=6 sh scripts/mqar_sweep.sh "$tmp/mq" "2 4" "fox-pro gsa:8" > "$tmp/mq2.txt" 2>&1
st=$?
[ $st -eq 0 ] && cmp -s "$tmp/mq.txt" "$tmp/mq2.txt" && [ "$(find "$tmp/mq" -name '*.log' -newer "$tmp/mq.txt" | wc -l)" -eq 0 ]
check $? "run again over the same directory: nothing trained, the same table"
BIN=$BIN VOCAB=64 SEQ=32 BATCH=4 STEPS=6 sh scripts/mqar_sweep.sh "$tmp/mq" "2" "nosuch" > /dev/null 2> "$tmp/mqbad.err"
st=$?
[ $st -eq 1 ] && [ "$(wc -l < "$tmp/mqbad.err")" -eq 1 ] &&
    grep -q "^error: nosuch_kv2 failed, see $tmp/mq/nosuch_kv2.log: error: --model nosuch: unknown preset" "$tmp/mqbad.err"
check $? "a run that fails stops the sweep, exit $st, one line naming the run, its log and its error: $(head -c 200 "$tmp/mqbad.err")"

PK="BIN=$BIN SEQ=128 TRAIN=64 STEPS=4 BATCH=2 BLOCK=32 WINDOW=1 MEMORY=4 LENGTHS=128,256 TRIALS=2"
env $PK sh scripts/passkey_sweep.sh "$tmp/pk" "transformer-fam transformer-fam:bswa fox-pro" > "$tmp/pk.txt" 2> "$tmp/pk.err"
st=$?
head -n 1 "$tmp/pk.txt" | grep -q "^model  *L=128  *L=256$" && table_ok "$tmp/pk.txt" "transformer-fam transformer-bswa fox-pro" 2 5 &&
    grep -q "^fox-pro ACP  *0\.[0-9]*  *0\.[0-9]*  pruned by --acp 1; answers unchanged: 4 of 4$" "$tmp/pk.txt" &&
    grep -q "^FAM: blocks of 32 tokens, 1 previous blocks in the window, 4 memory tokens" "$tmp/pk/runs/transformer-fam.log" &&
    grep -q "^BSWA: blocks of 32 tokens, 1 previous blocks in the window, no memory" "$tmp/pk/runs/transformer-bswa.log" &&
    [ -e "$tmp/pk/data/passkey.json" ] && [ -e "$tmp/pk/runs/fox-pro/passkey.json" ]
check $((st + $?)) "passkey_sweep.sh: transformer-fam, its BSWA and fox-pro on one passkey set, exit $st, a table: $(tr '\n' '|' < "$tmp/pk.txt")"
$PY scripts/plot.py passkey "$tmp"/pk/runs/*/ --out "$tmp/pk.png" > "$tmp/plot.txt" 2>&1 && [ -s "$tmp/pk.png" ]
check $? "the figure its header names, scripts/plot.py passkey OUT/runs/*/ (4 runs): $(tail -n 1 "$tmp/plot.txt")"
env $PK sh scripts/passkey_sweep.sh "$tmp/pkbad" "fox-pro fox-pro:memoryless" > /dev/null 2> "$tmp/bad.err"
st=$?
[ $st -eq 2 ] && [ "$(wc -l < "$tmp/bad.err")" -eq 1 ] && grep -q "^error: fox-pro:memoryless: a model is a preset or preset:bswa" "$tmp/bad.err" &&
    [ ! -e "$tmp/pkbad" ]
check $? "a model spec it does not know, after a good one: exit $st, nothing written or trained, $(cat "$tmp/bad.err")"

# Without ./fox_data where the sweep runs (a clone where only the trainer is built): one line naming it, exit 2.
root=$(pwd)
mkdir "$tmp/bare"
(cd "$tmp/bare" && BIN=$root/$BIN sh "$root/scripts/mqar_sweep.sh" out "2" fox-pro > /dev/null 2> ../bare_mq.err)
st=$?
[ $st -eq 2 ] && [ "$(wc -l < "$tmp/bare_mq.err")" -eq 1 ] && grep -q "^error: ./fox_data, which writes the MQAR sets, is not built here: make fox_data" "$tmp/bare_mq.err"
check $? "mqar_sweep.sh without ./fox_data: exit $st, $(cat "$tmp/bare_mq.err")"
(cd "$tmp/bare" && BIN=$root/$BIN sh "$root/scripts/passkey_sweep.sh" out fox-pro > /dev/null 2> ../bare_pk.err)
st=$?
[ $st -eq 2 ] && [ "$(wc -l < "$tmp/bare_pk.err")" -eq 1 ] && grep -q "^error: ./fox_data, which writes the passkey set, is not built here: make fox_data" "$tmp/bare_pk.err" &&
    [ -z "$(ls "$tmp/bare")" ]
check $? "passkey_sweep.sh without ./fox_data: exit $st, nothing written, $(cat "$tmp/bare_pk.err")"

finish
