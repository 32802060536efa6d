// fox/data_common.h: what the data headers (dataloader.h, fox/zarr.h, tokenizer.h) share beyond
// fox/io.h's checked I/O: the data fingerprint hash. Header-only, C11 and C++.
#ifndef FOX_DATA_COMMON_H
#define FOX_DATA_COMMON_H

#include <stdint.h>
#include "io.h"

// FNV-1a over bytes, continuing from h (start with FOX_FNV_INIT): the loader's data fingerprint.
#define FOX_FNV_INIT 1469598103934665603ull
static inline uint64_t fox_fnv1a(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = (const unsigned char *)data;
    for (size_t i = 0; i < n; i++) { h ^= p[i]; h *= 1099511628211ull; }
    return h;
}

#endif
