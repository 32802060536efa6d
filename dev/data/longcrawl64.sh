#!/bin/sh
# Checks an existing LongCrawl64 directory and shows how fox.c reads it (no conversion step).
#   sh dev/data/longcrawl64.sh /path/to/longcrawl64      (holds train.zarr and heldout.zarr)
# Prints each array's shape, dtype and compression, and decodes the start of document 0.
set -eu
dir=${1:?usage: longcrawl64.sh DIR (with train.zarr and heldout.zarr)}
[ -x ./fox_data ] || make fox_data
for a in train.zarr heldout.zarr; do
    ./fox_data info "$dir/$a"
done
echo "first 32 tokens of heldout document 0:"
./fox_data dump "$dir/heldout.zarr" --docs 0:1 --pos 0:32
cat <<MSG
Train on it with:   ./train_fox --train "$dir/train.zarr" --val "$dir/heldout.zarr" ...
(each batch is one rectangle of B consecutive documents x T tokens; see dev/data/README.md)
MSG
