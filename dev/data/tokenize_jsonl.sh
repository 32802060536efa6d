#!/bin/sh
# Tokenizes SlimPajama / fineweb-style JSONL (one {"text": ...} object per line; .jsonl,
# .jsonl.gz or .jsonl.zst) into llm.c uint16 shards with GPT-2 tokens.
#   sh dev/data/tokenize_jsonl.sh OUT_PREFIX FILE...      e.g. data/slimpj/train chunk1/*.jsonl.zst
# Writes OUT_PREFIX_000000.bin, OUT_PREFIX_000001.bin, ... of 100M tokens each (SHARD_TOKENS to
# change), every document preceded by EOT; THREADS (default: all cores) encoders run in parallel.
set -eu
prefix=${1:?usage: tokenize_jsonl.sh OUT_PREFIX FILE...}
shift
[ $# -gt 0 ] || { echo "usage: tokenize_jsonl.sh OUT_PREFIX FILE..." >&2; exit 2; }
[ -x ./fox_data ] || make fox_data
mkdir -p "$(dirname "$prefix")"
for f in "$@"; do
    case "$f" in
        *.zst) zstd -dc "$f" ;;
        *.gz) gzip -dc "$f" ;;
        *) cat "$f" ;;
    esac
done | ./fox_data encode --jsonl --shard-tokens "${SHARD_TOKENS:-100000000}" --threads "${THREADS:-$(nproc)}" --out "$prefix.bin" -
./fox_data info "${prefix}_*.bin"
