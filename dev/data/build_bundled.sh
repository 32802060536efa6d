#!/bin/sh
# Rebuilds the bundled corpus data/train.bin + data/val.bin (GPT-2 tokens, llm.c uint16 shards)
# from two public-domain texts packaged by Debian:
#   bible-kjv-text (+ bible-kjv for its `bible` decoder): the King James Bible, one document per chapter;
#   jargon-text: the Jargon File 4.4.7, paragraphs grouped into ~3000-character documents.
# Every 20th document (k % 20 == 10) goes to val.bin. Needs apt-get (download only, no root
# install), dpkg-deb, /usr/bin/python3 and ./fox_data (make fox_data). Run from the repo root:
#   sh dev/data/build_bundled.sh
set -eu
PYTHON=${PYTHON:-/usr/bin/python3}
work=dev/data/build
rm -rf "$work"
mkdir -p "$work"
(cd "$work" && apt-get download bible-kjv bible-kjv-text jargon-text)
for deb in "$work"/*.deb; do dpkg-deb -x "$deb" "$work/root"; done
"$work/root/usr/bin/bible" -p "$work/root/usr/lib" -f "gen1:1-rev22:21" > "$work/kjv.txt"
gzip -dc "$work/root/usr/share/doc/jargon-text/jargon.txt.gz" > "$work/jargon.txt"
"$PYTHON" dev/data/bundled_corpus.py "$work/kjv.txt" "$work/jargon.txt" > "$work/corpus.jsonl"
./fox_data encode --out data/train.bin --val-out data/val.bin --val-every 20 "$work/corpus.jsonl"
./fox_data info data/train.bin
./fox_data info data/val.bin
