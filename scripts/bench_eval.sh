#!/bin/sh
# The evaluation tasks' speed on a GPU (docs/perf.md, "Evaluation"): the FoX repository's 11 x 11
# needle-in-a-haystack grid (1000 to 32000 tokens) on the 760M FoX (Pro), and multiple-choice items per second
# of the 125M on 2000 HellaSwag-shaped items (a context of 40 to 120 tokens, four endings of 10 to 40). The
# weights are one training step's: the speed does not depend on them.
#   sh scripts/bench_eval.sh [OUT]      (BIN=./train_fox by default; OUT=runs/bench_eval)
set -eu
BIN=${BIN:-./train_fox}
OUT=${1:-runs/bench_eval}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
one_step() {  # dir, flags: a checkpoint after one step on the bundled corpus
    [ -e "$1/ckpt_00000001" ] || $BIN $2 --seq-len 2048 --batch 1 --steps 1 --eval-every 0 --val "" --sample-tokens 0 \
        --out "$1" > "$1.log" 2>&1
}
one_step "$OUT/m760" "--model fox-pro --layers 24 --dim 1536 --heads 24"
one_step "$OUT/m125" "--model fox-pro --layers 12 --dim 768 --heads 12"
$BIN --eval-only --out "$OUT/m760" --eval-niah --niah-min-len 1000 --niah-max-len 32000 2>&1 | tee "$OUT/niah_760m.txt"
$PY - "$OUT/items.jsonl" <<'PYEOF'
import json, random, sys
r = random.Random(1)
with open(sys.argv[1], "w") as f:
    for i in range(2000):
        ctx = [r.randrange(50257) for _ in range(r.randrange(40, 121))]
        ends = [[r.randrange(50257) for _ in range(r.randrange(10, 41))] for _ in range(4)]
        f.write(json.dumps({"context": ctx, "choices": ends, "label": r.randrange(4)}) + "\n")
PYEOF
for b in 16 64 256; do
    $BIN --eval-only --out "$OUT/m125" --seq-len 2048 --eval-mc "$OUT/items.jsonl" --eval-batch $b 2>&1 | tee "$OUT/mc_125m_b$b.txt"
done
