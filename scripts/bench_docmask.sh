#!/bin/sh
# scripts/bench_docmask.sh: training throughput of ./train_fox on packed documents (docs/model.md §1.8), with
# and without --doc-mask --acp 1, at T = 16384, batch 1, 760M (24 x 1536, 24 heads). The data is an llm.c
# shard of fineweb-like packing written here: documents of log-uniform length between 200 and 4000 tokens,
# each after an <|endoftext|>, random token ids (the speed does not depend on them). Prints tokens/s, MFU and
# the fraction of attention tiles computed (the mean of the steps after the first two).
# Three models: fox-pro as initialised (its gates start at f = 1/2, so ACP alone already skips nearly every
# tile), fox-pro with gates that remember (per-head gates of timescale T, --forget-gate data-independent
# --t-min 16384 --t-max 16384: the decay never reaches ACP's threshold, the case of a trained model's long-memory
# heads) and transformer-pro (no gate: only the document mask gives ACP anything to skip).
# Usage (repository root, GPU machine): sh scripts/bench_docmask.sh [STEPS]   (default 8)
# SIZE="--layers 12 --dim 768 --heads 12" picks another model; MODELS="fox-pro transformer-pro" a subset.
set -e
STEPS=${1:-8}
SIZE=${SIZE:---layers 24 --dim 1536 --heads 24}
MODELS=${MODELS:-fox-pro fox-pro-remember transformer-pro}
PYTHON=${PYTHON:-python3}
test -x ./train_fox || { echo "error: build ./train_fox first (make train_fox)"; exit 1; }
SHARD=build/bench_packed.bin
mkdir -p build
$PYTHON - "$SHARD" <<'EOF'
import sys
import numpy as np
rng = np.random.default_rng(0)
n, parts = 1 << 22, []
total = 0
while total < n:  # a document: <|endoftext|>, then its tokens
    length = int(np.exp(rng.uniform(np.log(200), np.log(4000))))
    parts.append(np.concatenate([[50256], rng.integers(0, 50256, length - 1)]))
    total += length
tokens = np.concatenate(parts)[:n].astype(np.uint16)
header = np.zeros(256, np.int32)
header[:3] = (20240520, 1, n)
with open(sys.argv[1], "wb") as f:
    f.write(header.tobytes())
    f.write(tokens.tobytes())
lengths = [len(p) for p in parts]
print("packed shard: %d tokens, %d documents, mean length %.0f, %.1f documents per 16384-token window"
      % (n, len(parts), np.mean(lengths), 16384 / np.mean(lengths)))
EOF
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
COMMON="--seq-len 16384 --batch 1 --steps $STEPS --train $SHARD --val '' --eval-every 0 --sample-tokens 0 --warmup-tokens 1M --lr 1e-3"
run() {  # label, flags
    log=$(eval ./train_fox $COMMON $SIZE $2 2>&1) || { echo "$log" | tail -5; echo "$1: FAILED"; return 0; }
    echo "$log" | awk -v name="$1" '
        /^step / && /tok\/s/ { n++; acp = "";
                               for (i = 1; i <= NF; i++) { if ($i == "tok/s") tps = $(i-1); if ($i == "MFU") mfu = $(i+1);
                                                           if ($i == "ACP") acp = $(i+1) }
                               if (n > 2) { st += tps; sm += mfu + 0; sa += acp + 0; k++ } }
        END { printf "%-44s %8.0f tok/s  MFU %5.1f%%  tiles computed %s  (mean of %d steps)\n", name, st / k, sm / k,
                     (sa > 0 ? sprintf("%.1f%%", sa / k) : "all"), k }'
}
model_flags() {  # a name of MODELS -> its train_fox flags
    case $1 in
        fox-pro-remember) echo "--model fox-pro --forget-gate data-independent --t-min 16384 --t-max 16384" ;;
        *) echo "--model $1" ;;
    esac
}
for name in $MODELS; do
    flags=$(model_flags "$name")
    run "$name" "$flags"
    run "$name --acp 1" "$flags --acp 1"
    run "$name --doc-mask --acp 1" "$flags --doc-mask --acp 1"
done
