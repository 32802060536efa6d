// fox/data_common.h: helpers shared by the data headers (dataloader.h, fox/zarr.h, tokenizer.h):
// the one-line fatal error, checked allocation and whole-file reading. Header-only, C11 and C++.
#ifndef FOX_DATA_COMMON_H
#define FOX_DATA_COMMON_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__)
#define FOX_DATA_NORETURN __attribute__((noreturn))
#define FOX_DATA_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define FOX_DATA_NORETURN
#define FOX_DATA_PRINTF(a, b)
#endif

// Bad input is never a crash: one line "error: ..." on stderr and exit status 1.
static inline FOX_DATA_NORETURN FOX_DATA_PRINTF(1, 2) void fox_data_die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fflush(stdout);
    fputs("error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static inline void *fox_data_malloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) fox_data_die("out of memory allocating %zu bytes", bytes);
    return p;
}

static inline void *fox_data_calloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) fox_data_die("out of memory allocating %zu x %zu bytes", n, size);
    return p;
}

static inline void *fox_data_realloc(void *p, size_t bytes) {
    void *q = realloc(p, bytes ? bytes : 1);
    if (!q) fox_data_die("out of memory allocating %zu bytes", bytes);
    return q;
}

static inline char *fox_data_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = (char *)fox_data_malloc(n);
    memcpy(d, s, n);
    return d;
}

// Reads a whole file into a malloc'd buffer (NUL-terminated for convenience, *len excludes it).
// Returns NULL (errno set) if the file cannot be opened or read.
static inline char *fox_data_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = (char *)fox_data_malloc(cap + 1);
    for (;;) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n < cap) {
            if (ferror(f)) { free(buf); fclose(f); return NULL; }
            break;
        }
        cap *= 2;
        buf = (char *)fox_data_realloc(buf, cap + 1);
    }
    fclose(f);
    buf[n] = 0;
    *len = n;
    return buf;
}

// FNV-1a over bytes, continuing from h (start with FOX_FNV_INIT): the loader's data fingerprint.
#define FOX_FNV_INIT 1469598103934665603ull
static inline uint64_t fox_fnv1a(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = (const unsigned char *)data;
    for (size_t i = 0; i < n; i++) { h ^= p[i]; h *= 1099511628211ull; }
    return h;
}

#endif
