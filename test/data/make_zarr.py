#!/usr/bin/env python3
"""Builds small zarr v2 arrays in LongCrawl64's layout (uint16, docs x tokens, Blosc) for test_data.

usage: make_zarr.py OUTDIR
Writes OUTDIR/<name>.zarr for each case below plus OUTDIR/<name>.u16, the same array as raw
little-endian uint16 (row-major), which the C test compares the reader against. Also writes
arrays fox.c must reject (bad_*.zarr) and a directory that is not a zarr array.
"""
import json
import os
import shutil
import sys

import numpy as np
import zarr
from numcodecs import Blosc, Zlib

GOOD = [
    # name, shape, chunks, compressor, extra
    ("zstd_shuffle", (37, 300), (8, 128), Blosc(cname="zstd", clevel=3, shuffle=Blosc.SHUFFLE), {}),
    ("lz4_bitshuffle", (29, 257), (16, 64), Blosc(cname="lz4", clevel=5, shuffle=Blosc.BITSHUFFLE), {}),
    ("blosclz_noshuffle", (20, 200), (7, 33), Blosc(cname="blosclz", clevel=9, shuffle=Blosc.NOSHUFFLE), {}),
    ("raw", (13, 100), (5, 30), None, {}),
    ("slash_sep", (11, 90), (4, 32), Blosc(cname="zstd", clevel=1, shuffle=Blosc.SHUFFLE),
     {"dimension_separator": "/"}),
    ("loader", (24, 96), (10, 40), Blosc(cname="zstd", clevel=3, shuffle=Blosc.SHUFFLE), {}),
]


def tokens(shape, seed):
    """GPT-2-like token ids: mostly < 50257, some runs, an EOT now and then."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 50257, size=shape, dtype=np.uint16)
    a[:, ::17] = 50256
    a[::3, 5:40] = 13
    return a


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for i, (name, shape, chunks, comp, extra) in enumerate(GOOD):
        path = os.path.join(out, name + ".zarr")
        shutil.rmtree(path, ignore_errors=True)
        z = zarr.open(zarr.DirectoryStore(path, **extra), mode="w", shape=shape, chunks=chunks, dtype="<u2",
                      compressor=comp, fill_value=7)
        a = tokens(shape, i)
        z[:] = a
        a.astype("<u2").tofile(os.path.join(out, name + ".u16"))
    # Holes, which zarr reads as fill_value and fox.c refuses: a chunk file removed (both separators), a
    # .zarray that claims more documents than the chunks hold, a directory in place of a chunk, and a
    # whole array to delete a chunk from after it was opened.
    holes = {"missing_chunk": ("1.1", {}), "missing_chunk_slash": ("1/1", {"dimension_separator": "/"}),
             "claims_more": (None, {}), "dir_chunk": ("0.1", {}), "delete_later": (None, {})}
    for name, (chunk, extra) in holes.items():
        path = os.path.join(out, name + ".zarr")
        shutil.rmtree(path, ignore_errors=True)
        z = zarr.open(zarr.DirectoryStore(path, **extra), mode="w", shape=(12, 50), chunks=(5, 20), dtype="<u2",
                      compressor=Blosc(cname="lz4", clevel=1, shuffle=Blosc.SHUFFLE), fill_value=7)
        z[:] = tokens((12, 50), 99)
        if chunk:
            os.remove(os.path.join(path, chunk))
        if name == "dir_chunk":
            os.mkdir(os.path.join(path, chunk))
    meta_path = os.path.join(out, "claims_more.zarr", ".zarray")
    meta = json.load(open(meta_path))
    meta["shape"] = [20, 50]
    json.dump(meta, open(meta_path, "w"))
    # Arrays to reject.
    bad = [
        ("bad_dtype", dict(shape=(4, 8), chunks=(2, 4), dtype="<f4", compressor=None)),
        ("bad_compressor", dict(shape=(4, 8), chunks=(2, 4), dtype="<u2", compressor=Zlib(level=1))),
        ("bad_ndim", dict(shape=(4, 8, 2), chunks=(2, 4, 2), dtype="<u2", compressor=None)),
        ("bad_truncated", dict(shape=(4, 8), chunks=(2, 4), dtype="<u2",
                               compressor=Blosc(cname="zstd", clevel=1, shuffle=Blosc.SHUFFLE))),
    ]
    for name, kw in bad:
        path = os.path.join(out, name + ".zarr")
        shutil.rmtree(path, ignore_errors=True)
        z = zarr.open(path, mode="w", **kw)
        z[:] = 1
    chunk = os.path.join(out, "bad_truncated.zarr", "0.0")
    with open(chunk, "rb") as f:
        data = f.read()
    with open(chunk, "wb") as f:
        f.write(data[: len(data) // 2])
    os.makedirs(os.path.join(out, "not_zarr"), exist_ok=True)
    with open(os.path.join(out, "not_zarr", "README"), "w") as f:
        f.write("not an array\n")
    print("zarr fixtures written to", out)


if __name__ == "__main__":
    main()
