#!/bin/sh
# The evaluation tasks through a trainer binary (docs/model.md §8): `sh test/test_eval.sh BIN [MPI_BIN]`
# with ./train_fox_cpu (and ./train_fox_cpu_mpi) in `make test`, ./train_fox in `make test-gpu`.
#   - in training: the tasks at step 0 and every --eval-every steps, their log.jsonl lines and result files;
#     the training run is bitwise the one without them;
#   - --eval-only on the checkpoint gives what the last in-loop evaluation gave (same weights), and with
#     --acp 1 the same answers as without;
#   - the multiple-choice log-likelihoods equal the PyTorch reference's (train_fox.py mc, float64): the CPU
#     to 1e-5 relative, the GPU to bf16's 2e-2;
#   - MQAR: accuracy counted on the answers only; a model trained on the task beats the untrained one, also
#     when trained on the answers alone (--mqar-loss, whose losses on the GPU are the CPU trainer's);
#   - with MPI_BIN, 2 ranks share the tasks and write what 1 rank writes;
#   - bad input (a missing or malformed items file, which line; an item without choices; a label out of
#     range; a haystack without text; a prompt longer than the memory holds; a vocabulary without GPT-2's
#     for text tasks): one line "error: ..." and a non-zero exit, before any training step.
# Environment: PYTHON (with torch and numpy; default python3).
set -u
BIN=${1:-./train_fox_cpu}
MPI=${2:-}
PY=${PYTHON:-python3}
. "$(dirname "$0")/test_lib.sh"
SHAPE=$(trainer_shape "$BIN")
case "$BIN" in
*_cpu*) TOL=1e-5 ;;
*) TOL=2e-2 ;;
esac
one_error() {  # file, text: exactly one line, "error: ..." containing the text
    [ "$(wc -l < "$1")" -eq 1 ] && grep -q "^error: .*$2" "$1"
}
no_step() {  # output: no training step ran
    ! grep -q '^step  *1/' "$1"
}

# A small items file: HellaSwag's form (text) and the plain form (text, and token ids with a string label).
cat > "$tmp/items.jsonl" <<'EOF'
{"ind": 4, "activity_label": "Removing ice from car", "ctx": "Then, the man writes over the snow covering the window of a car, and a woman wearing winter clothes smiles. then", "endings": [", the man adds wax to the windshield and cuts it.", ", a person board a ski lift, while two men supporting the head of the person wearing winter clothes snow as the we girls sled.", ", the man puts on a christmas coat, knitted with netting.", ", the man continues removing the snow on his car."], "label": 3}
{"context": "The cat sat on the", "choices": ["mat.", "moon, which was made of cheese and very far away.", "dog"], "label": "0"}

{"context": [50256, 464, 3797, 3332], "choices": [[319, 262], [11, 290, 340], [13]], "label": 2}
EOF
TASKS="--eval-niah --niah-max-len 128 --niah-lengths 3 --niah-depths 3 --niah-tokens 12 --eval-passkey --passkey-trials 3 --passkey-lengths 96,128 --eval-mc $tmp/items.jsonl --eval-batch 3"
RUN="$BIN $SHAPE --seq-len 64 --batch 2 --steps 4 --lr 3e-3 --warmup-tokens 256 --eval-every 2 --val-steps 1 --sample-tokens 0"

$RUN $TASKS --out "$tmp/a" > "$tmp/a.txt" 2>&1
check $? "training with --eval-niah, --eval-passkey and --eval-mc every 2 steps"
for s in 0 2 4; do
    grep -q "^{\"step\": $s, \"niah_score\": " "$tmp/a/log.jsonl" && grep -q "^{\"step\": $s, \"passkey_acc\": " "$tmp/a/log.jsonl" &&
        grep -q "^{\"step\": $s, \"mc_acc\": [0-9.]*, \"mc_acc_norm\": " "$tmp/a/log.jsonl" || break
done
check $? "log.jsonl has each task's line at steps 0, 2 and 4"
$PY - "$tmp/a" <<'EOF'
import json, sys
d = sys.argv[1]
n = json.load(open(d + "/niah.json"))
p = json.load(open(d + "/passkey.json"))
mc = [json.loads(l) for l in open(d + "/mc.jsonl")]
s = json.load(open(d + "/mc.json"))
ok = n["task"] == "niah" and n["step"] == 4 and len(n["lengths"]) == 3 and n["lengths"][-1] == 128 and n["depths"] == [0, 50, 100]
ok = ok and len(n["cells"]) == 9 and all(0 <= c["score"] <= 1 for c in n["cells"]) and len(n["score"]) == len(n["lengths"])
ok = ok and p["lengths"] == [96, 128] and len(p["cells"]) == 6 and all(len(c["key"]) == 5 for c in p["cells"])
ok = ok and [m["index"] for m in mc] == [0, 1, 2] and [len(m["loglik"]) for m in mc] == [4, 3, 3] and [m["label"] for m in mc] == [3, 0, 2]
ok = ok and mc[2]["tokens"] == [2, 3, 1] and mc[2]["bytes"] == [2, 3, 1] and all(x < 0 for m in mc for x in m["loglik"])
ok = ok and s["items"] == 3 and abs(s["acc"] - sum(m["pred"] == m["label"] for m in mc) / 3) < 1e-6
print("niah lengths", n["lengths"], "mean", n["mean"], "| passkey", p["accuracy"], "| mc acc", s["acc"], "acc_norm", s["acc_norm"])
sys.exit(not ok)
EOF
check $? "niah.json, passkey.json, mc.jsonl and mc.json parse and hold the grid, the trials and every item"

$PY scripts/plot.py niah "$tmp/a" --out "$tmp/niah.png" > /dev/null 2>&1 && $PY scripts/plot.py passkey "$tmp/a" --out "$tmp/pk.png" > /dev/null 2>&1 &&
    $PY scripts/plot.py evals "$tmp/a" --out "$tmp/evals.png" > /dev/null 2>&1 && [ -s "$tmp/niah.png" ] && [ -s "$tmp/pk.png" ] && [ -s "$tmp/evals.png" ]
check $? "scripts/plot.py draws the run's niah.json, passkey.json and its evaluation lines"

$RUN --out "$tmp/b" > "$tmp/b.txt" 2>&1
losses_after "$tmp/a/log.jsonl" 0 > "$tmp/la"
losses_after "$tmp/b/log.jsonl" 0 > "$tmp/lb"
cmp -s "$tmp/la" "$tmp/lb" && [ "$(wc -l < "$tmp/la")" -eq 4 ] && cmp -s "$tmp/a/ckpt_00000004/model.bin" "$tmp/b/ckpt_00000004/model.bin" &&
    [ "$(grep -c val_loss "$tmp/a/log.jsonl")" -eq "$(grep -c val_loss "$tmp/b/log.jsonl")" ]
check $? "the run with the tasks is bitwise the run without them (losses and final weights)"

mkdir -p "$tmp/e"
$BIN --eval-only --init "$tmp/a/ckpt_00000004/model.bin" --seq-len 64 $TASKS --out "$tmp/e" > "$tmp/e.txt" 2>&1 &&
    cmp -s "$tmp/a/mc.jsonl" "$tmp/e/mc.jsonl" &&
    $PY -c "
import json, sys
a, e = json.load(open('$tmp/a/niah.json')), json.load(open('$tmp/e/niah.json'))
pa, pe = json.load(open('$tmp/a/passkey.json')), json.load(open('$tmp/e/passkey.json'))
sys.exit(not (a['cells'] == e['cells'] and pa['cells'] == pe['cells'] and e['step'] is None))"
check $? "--eval-only on the final checkpoint writes what the last in-loop evaluation wrote"
grep -q "^evaluating .* at context 64" "$tmp/e.txt" && ! grep -q "per_token_loss" "$tmp/e.txt" && [ ! -e "$tmp/e/per_token_loss.npy" ]
check $? "--eval-only with tasks runs the tasks alone (no per-token loss)"

$BIN --eval-only --init "$tmp/a/ckpt_00000004/model.bin" --seq-len 64 $TASKS --acp 1 --out "$tmp/acp" > "$tmp/acp.txt" 2>&1 &&
    $PY -c "
import json, sys
a, e = json.load(open('$tmp/e/niah.json')), json.load(open('$tmp/acp/niah.json'))
pa, pe = json.load(open('$tmp/e/passkey.json')), json.load(open('$tmp/acp/passkey.json'))
ma = [json.loads(l)['pred'] for l in open('$tmp/e/mc.jsonl')]
me = [json.loads(l)['pred'] for l in open('$tmp/acp/mc.jsonl')]
same = [c['text'] for c in a['cells']] == [c['text'] for c in e['cells']] and [c['text'] for c in pa['cells']] == [c['text'] for c in pe['cells']]
print('ACP pruned (niah, per length):', e['acp_pruned'], '| without ACP:', a['acp_pruned'])
sys.exit(not (same and ma == me and all(x is not None for x in e['acp_pruned']) and all(x is None for x in a['acp_pruned'])))"
check $? "--acp 1: the same answers and predictions, the pruned share reported"

# The reference: train_fox.py mc (float64) on the token-id items of the checkpoint, contexts cut at 16 tokens.
$PY - "$tmp/ids.jsonl" <<'EOF'
import json, random, sys
r = random.Random(5)
with open(sys.argv[1], "w") as f:
    for i in range(6):
        ctx = [r.randrange(50257) for _ in range(r.randrange(1, 30))]
        ch = [[r.randrange(50257) for _ in range(r.randrange(1, 8))] for _ in range(r.randrange(2, 5))]
        f.write(json.dumps({"context": ctx, "choices": ch, "label": r.randrange(len(ch))}) + "\n")
EOF
$BIN --eval-only --init "$tmp/a/ckpt_00000004/model.bin" --seq-len 16 --eval-mc "$tmp/ids.jsonl" --eval-batch 4 --out "$tmp/ref" > "$tmp/ref.txt" 2>&1 &&
    $PY train_fox.py mc --model-bin "$tmp/a/ckpt_00000004/model.bin" --items "$tmp/ids.jsonl" --max-len 16 > "$tmp/ref.jsonl" &&
    $PY - "$tmp/ref/mc.jsonl" "$tmp/ref.jsonl" "$TOL" <<'EOF'
import json, sys
ours = [json.loads(l) for l in open(sys.argv[1])]
ref = [json.loads(l) for l in open(sys.argv[2])]
tol = float(sys.argv[3])
err = max(abs(a - b) / abs(b) for o, r in zip(ours, ref) for a, b in zip(o["loglik"], r["loglik"]))
same = len(ours) == len(ref) == 6 and all(o["tokens"] == r["tokens"] and len(o["loglik"]) == len(r["loglik"]) for o, r in zip(ours, ref))
print("max relative error of the log-likelihoods against the float64 reference: %.2e (tolerance %g)" % (err, tol))
sys.exit(not (same and err < tol and any(any(o["truncated"]) for o in ours)))
EOF
check $? "the multiple-choice log-likelihoods equal train_fox.py mc's within $TOL (contexts cut from the left)"

# MQAR: the accuracy counts the answers only; training on the task lifts it above the untrained model's.
./fox_data mqar --out "$tmp/mq" --vocab 16 --num-kv 2 --seq-len 16 --train-examples 20000 --test-examples 200 > /dev/null 2>&1
check $? "fox_data mqar writes a small set"
case "$BIN" in
*_cpu*) MQSHAPE="--layers 2 --dim 64 --heads 4" ;;
*) MQSHAPE="--layers 2 --dim 128 --heads 2" ;;  # the GPU kernels' head dims are 64 and 128
esac
MQ="$BIN --vocab 16 $MQSHAPE --seq-len 16 --batch 32 --lr 3e-3 --warmup-tokens 5K --val '' --sample-tokens 0 --train $tmp/mq/train.bin --eval-mqar $tmp/mq"
eval "$MQ --steps 1500 --eval-every 1500 --out $tmp/mqr" > "$tmp/mqr.txt" 2>&1
first=$(sed -n 's/^{"step": 0, "mqar_acc": \(.*\)}/\1/p' "$tmp/mqr/log.jsonl")
last=$(sed -n 's/^{"step": 1500, "mqar_acc": \(.*\)}/\1/p' "$tmp/mqr/log.jsonl")
$PY -c "
import json, sys
r = json.load(open('$tmp/mqr/mqar_result.json'))
sys.exit(not (r['answers'] == 400 and r['num_kv'] == 2 and r['examples'] == 200 and $first < 0.3 and $last > $first + 0.3))"
check $? "MQAR: 400 answers counted in 200 examples; accuracy at step 0 $first, after 1500 steps $last"

# --mqar-loss (Zoology's loss): only the answers count; the model still learns the task, and on the GPU the
# loss of its first steps is the CPU trainer's (the same initial weights, bf16 against fp32).
eval "$MQ --steps 600 --eval-every 600 --mqar-loss --out $tmp/mqm" > "$tmp/mqm.txt" 2>&1
first=$(sed -n 's/^{"step": 0, "mqar_acc": \(.*\)}/\1/p' "$tmp/mqm/log.jsonl")
last=$(sed -n 's/^{"step": 600, "mqar_acc": \(.*\)}/\1/p' "$tmp/mqm/log.jsonl")
$PY -c "import sys; sys.exit(not ($first < 0.3 and $last > $first + 0.3))"
check $? "--mqar-loss: accuracy at step 0 $first, after 600 steps $last"
case "$BIN" in
*_cpu*) ;;
*)
    M2="--vocab 16 --layers 2 --dim 128 --heads 2 --seq-len 16 --batch 32 --lr 3e-3 --warmup-tokens 5K --val '' --sample-tokens 0 --eval-every 0 --train $tmp/mq/train.bin --eval-mqar $tmp/mq --mqar-loss --steps 3"
    eval "$BIN $M2 --out $tmp/mg" > /dev/null 2>&1 && eval "./train_fox_cpu $M2 --out $tmp/mc" > /dev/null 2>&1
    losses_after "$tmp/mg/log.jsonl" 0 | cut -d' ' -f2 > "$tmp/lg"
    losses_after "$tmp/mc/log.jsonl" 0 | cut -d' ' -f2 > "$tmp/lc"
    $PY -c "
import sys
g, c = [float(x) for x in open('$tmp/lg')], [float(x) for x in open('$tmp/lc')]
print('answer-only losses, GPU', g, 'CPU', c)
sys.exit(not (len(g) == len(c) == 3 and all(abs(a - b) <= 2e-2 * abs(b) for a, b in zip(g, c))))"
    check $? "--mqar-loss: the GPU's losses of steps 1-3 are the CPU trainer's within 2e-2"
    ;;
esac

# Several ranks share the tasks and write what one rank writes.
if [ -n "$MPI" ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
    mpirun --oversubscribe --bind-to none -np 2 $MPI --eval-only --init "$tmp/a/ckpt_00000004/model.bin" --seq-len 64 $TASKS \
        --out "$tmp/m2" > "$tmp/m2.txt" 2>&1 &&
        cmp -s "$tmp/e/mc.jsonl" "$tmp/m2/mc.jsonl" &&
        $PY -c "
import json, sys
a, e = json.load(open('$tmp/e/niah.json')), json.load(open('$tmp/m2/niah.json'))
pa, pe = json.load(open('$tmp/e/passkey.json')), json.load(open('$tmp/m2/passkey.json'))
sys.exit(not (a == e and pa == pe))"
    check $? "2 ranks (mpirun): the same niah.json, passkey.json and mc.jsonl as one rank"
fi

# --eval-only on a run's checkpoint with a bad items file: the item's line alone (no checkpoint hint), exit 1.
printf '{"ctx": "a", "endings": ["b"], "label": 3}\n' > "$tmp/bad0.jsonl"
$BIN --eval-only --out "$tmp/a" --eval-mc "$tmp/bad0.jsonl" > /dev/null 2> "$tmp/bad0.err"
st=$?
[ $st -eq 1 ] && one_error "$tmp/bad0.err" "bad0.jsonl line 1: label 3 is out of range (1 choices)$"
check $? "--eval-only, a label out of range: exit $st, $(cat "$tmp/bad0.err")"

# Bad input: one line, a non-zero exit, and no training step.
bad() {  # label, expected text, flags...
    label=$1 text=$2
    shift 2
    $RUN "$@" > "$tmp/bad.txt" 2> "$tmp/bad.err"
    st=$?
    [ $st -ne 0 ] && one_error "$tmp/bad.err" "$text" && no_step "$tmp/bad.txt"
    check $? "$label: exit $st, $(cat "$tmp/bad.err")"
}
bad "a missing items file" "$tmp/none.jsonl" --eval-mc "$tmp/none.jsonl"
printf '{"context": "a", "choices": ["b"], "label": 0}\n{"context": "a", "choices": ["b"],\n' > "$tmp/bad1.jsonl"
bad "a malformed line" "bad1.jsonl line 2: not JSON" --eval-mc "$tmp/bad1.jsonl"
printf '{"context": "a", "choices": [], "label": 0}\n' > "$tmp/bad2.jsonl"
bad "an item without choices" "line 1: has no choices" --eval-mc "$tmp/bad2.jsonl"
printf '{"context": "a", "choices": ["b", "c"], "label": 0}\n{"ctx": "a", "endings": ["b", "c"], "label": 7}\n' > "$tmp/bad3.jsonl"
bad "a label out of range" "line 2: label 7 is out of range (2 choices)" --eval-mc "$tmp/bad3.jsonl"
printf '{"context": "a", "choices": ["b", ""], "label": 0}\n' > "$tmp/bad4.jsonl"
bad "an empty choice" "line 1: its choice 1 is empty" --eval-mc "$tmp/bad4.jsonl"
printf '{"context": [1, 2], "choices": [[3], [99999999]], "label": 0}\n' > "$tmp/bad5.jsonl"
bad "a token id outside the vocabulary" "line 1: its choice 1 holds something other than a token id" --eval-mc "$tmp/bad5.jsonl"
printf '\n\n' > "$tmp/empty.jsonl"
bad "an items file without items" "holds no item" --eval-mc "$tmp/empty.jsonl"
mkdir -p "$tmp/hay0" "$tmp/hay1" && : > "$tmp/hay1/empty.txt"
bad "a haystack directory without .txt files" "holds no .txt file" --eval-niah --niah-max-len 128 --niah-haystack "$tmp/hay0"
bad "a haystack of empty files" "holds no text" --eval-niah --niah-max-len 128 --niah-haystack "$tmp/hay1"
bad "a NIAH prompt too short for the needle" "niah-min-len 20: a prompt needs at least" --eval-niah --niah-max-len 128 --niah-min-len 20
bad "a training context too short for NIAH" "the longest prompt, 64 tokens" --eval-niah
bad "--niah-mode other" "expected standard or easy" --eval-niah --niah-mode hard
bad "a passkey length list that is not one" "expected lengths in tokens" --eval-passkey --passkey-lengths 100,x
bad "a passkey prompt too short" "shorter than the prompt's fixed part" --eval-passkey --passkey-lengths 30
bad "an MQAR directory that is none" "mqar.json" --eval-mqar "$tmp/hay0"
bad "a NIAH grid longer than the memory holds" "memory" --eval-niah --niah-max-len 16000000 --niah-lengths 1
$BIN --vocab 16 $SHAPE --seq-len 16 --steps 2 --warmup-tokens 16 --train "$tmp/mq/train.bin" --val "" --eval-niah > "$tmp/bad.txt" 2> "$tmp/bad.err"
st=$?
[ $st -eq 2 ] && one_error "$tmp/bad.err" "eval-niah needs the GPT-2 vocabulary" && no_step "$tmp/bad.txt"
check $? "--eval-niah with a 16-token vocabulary: exit $st, $(cat "$tmp/bad.err")"

finish
