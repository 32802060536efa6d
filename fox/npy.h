// fox/npy.h: writes float64 arrays (1-D, or 2-D with cols > 0) in numpy's .npy format
// (version 1.0), atomically.
#ifndef FOX_NPY_H
#define FOX_NPY_H

#include "io.h"

static inline void fox_write_npy_f64_2d(const char *path, const double *x, size_t rows, size_t cols) {
    char tmp[4200], header[128];
    if (snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= (int)sizeof(tmp)) fox_fatal("path too long: %s", path);
    char shape[64];
    if (cols) snprintf(shape, sizeof(shape), "(%zu, %zu)", rows, cols);
    else snprintf(shape, sizeof(shape), "(%zu,)", rows);
    size_t n = cols ? rows * cols : rows;
    int len = snprintf(header, sizeof(header), "{'descr': '<f8', 'fortran_order': False, 'shape': %s, }", shape);
    // Magic (6) + version (2) + header length (2) + header, padded with spaces to a multiple of 64, ending in '\n'.
    int total = 10 + len + 1, pad = (64 - total % 64) % 64;
    FILE *f = fox_fopen(tmp, "wb");
    unsigned short hlen = (unsigned short)(len + pad + 1);
    fox_fwrite("\x93NUMPY\x01\x00", 1, 8, f, tmp);
    fox_fwrite(&hlen, 2, 1, f, tmp);
    fox_fwrite(header, 1, (size_t)len, f, tmp);
    for (int i = 0; i < pad; i++) fox_fwrite(" ", 1, 1, f, tmp);
    fox_fwrite("\n", 1, 1, f, tmp);
    fox_fwrite(x, sizeof(double), n, f, tmp);
    fox_fclose_synced(f, tmp);
    if (rename(tmp, path)) fox_fatal("cannot rename %s to %s: %s", tmp, path, strerror(errno));
}

static inline void fox_write_npy_f64(const char *path, const double *x, size_t n) {
    fox_write_npy_f64_2d(path, x, n, 0);
}

#endif
