// fox/zarr.h: a reader for 2-D zarr v2 directory arrays, the layout of LongCrawl64
// (train.zarr: 6,609,334 docs x 65,536 tokens, uint16, 2048x2048 chunks, Blosc).
//
// An array directory holds `.zarray` (JSON metadata) and one file per chunk named "i.j" (or
// "i/j" with dimension_separator "/"). Every chunk file holds a full chunks[0] x chunks[1]
// C-order block, edge chunks padded. Zarr reads a missing chunk as fill_value; for a training set a
// missing chunk is a broken download, so here every chunk the shape needs must be a regular file:
// fox_zarr_open lists the directory once and names the first one that is missing or not a file.
// Supported: dtype <u2, <u4, |u1; compressor null or blosc (any cname libblosc was built with:
// blosclz, lz4, lz4hc, zlib, zstd; with or without byte/bit shuffle); no filters; order C.
// Anything else is rejected with one "error: ..." line. Link with -lblosc; built with FOX_NO_BLOSC (no
// libblosc on the machine) it reads uncompressed arrays only and says so for compressed ones.
//
// fox_zarr_read() copies a rectangle rows [r0, r0+nr) x cols [c0, c0+nc) into a uint32 buffer.
// A small cache keeps the chunks of the previous reads, so each chunk is decompressed once per
// batch, and consecutive rectangles in the same chunk row (sequential validation) reuse them.
#ifndef FOX_ZARR_H
#define FOX_ZARR_H

#ifndef FOX_NO_BLOSC
#include <blosc.h>
#endif
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <sys/stat.h>

#include "data_common.h"

enum { FOX_ZARR_RAW = 0, FOX_ZARR_BLOSC = 1 };

typedef struct FoxZarrChunk {
    int64_t ci, cj;     // chunk coordinates (-1: empty slot)
    uint64_t last_use;  // LRU tick
    unsigned char *data; // decompressed chunk, chunks[0]*chunks[1]*itemsize bytes
} FoxZarrChunk;

typedef struct FoxZarr {
    char *dir;
    int64_t shape[2], chunks[2];
    int itemsize;          // 1, 2 or 4 bytes (unsigned little-endian)
    char dtype[16];
    int compressor;        // FOX_ZARR_RAW or FOX_ZARR_BLOSC
    char cname[32];        // blosc codec name
    int clevel, shuffle;
    char sep;              // '.' or '/'
    // chunk cache
    FoxZarrChunk *cache;
    int cache_cap;
    uint64_t tick;
    unsigned char *cbuf;   // compressed-bytes scratch
    size_t cbuf_cap;
    long long chunks_decoded; // statistics: decompressions done
} FoxZarr;

// ---- a minimal JSON reader, enough for .zarray ----

typedef struct FoxJson {
    const char *p, *end, *path;
} FoxJson;

static inline void fox_json_ws(FoxJson *j) {
    while (j->p < j->end && isspace((unsigned char)*j->p)) j->p++;
}

static inline FOX_NORETURN void fox_json_fail(const FoxJson *j, const char *what) {
    fox_fatal("%s: malformed .zarray JSON (%s)", j->path, what);
}

static inline void fox_json_expect(FoxJson *j, char c) {
    fox_json_ws(j);
    if (j->p >= j->end || *j->p != c) {
        char what[32];
        snprintf(what, sizeof what, "expected '%c'", c);
        fox_json_fail(j, what);
    }
    j->p++;
}

// Parses a JSON string into out (escapes other than \" \\ \/ kept verbatim: keys and codec names
// are plain ASCII). Truncates to cap-1 bytes.
static inline void fox_json_string(FoxJson *j, char *out, size_t cap) {
    fox_json_expect(j, '"');
    size_t n = 0;
    while (j->p < j->end && *j->p != '"') {
        char c = *j->p++;
        if (c == '\\' && j->p < j->end) c = *j->p++;
        if (n + 1 < cap) out[n++] = c;
    }
    if (j->p >= j->end) fox_json_fail(j, "unterminated string");
    j->p++;
    out[n] = 0;
}

static inline double fox_json_number(FoxJson *j) {
    fox_json_ws(j);
    char *stop = NULL;
    errno = 0;
    double v = strtod(j->p, &stop);
    if (stop == j->p || errno) fox_json_fail(j, "expected a number");
    j->p = stop;
    return v;
}

static inline int fox_json_literal(FoxJson *j, const char *lit) {
    fox_json_ws(j);
    size_t n = strlen(lit);
    if ((size_t)(j->end - j->p) >= n && memcmp(j->p, lit, n) == 0) { j->p += n; return 1; }
    return 0;
}

static inline void fox_json_skip_value(FoxJson *j) {
    fox_json_ws(j);
    if (j->p >= j->end) fox_json_fail(j, "unexpected end");
    char c = *j->p;
    if (c == '"') { char tmp[8]; fox_json_string(j, tmp, sizeof tmp); return; }
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        j->p++;
        fox_json_ws(j);
        if (j->p < j->end && *j->p == close) { j->p++; return; }
        for (;;) {
            if (c == '{') { char key[8]; fox_json_string(j, key, sizeof key); fox_json_expect(j, ':'); }
            fox_json_skip_value(j);
            fox_json_ws(j);
            if (j->p < j->end && *j->p == ',') { j->p++; continue; }
            fox_json_expect(j, close);
            return;
        }
    }
    if (fox_json_literal(j, "null") || fox_json_literal(j, "true") || fox_json_literal(j, "false")) return;
    fox_json_number(j);
}

// Parses "[a, b, ...]" of integers into out (at most cap); returns the count.
static inline int fox_json_int_array(FoxJson *j, int64_t *out, int cap) {
    fox_json_expect(j, '[');
    int n = 0;
    fox_json_ws(j);
    if (j->p < j->end && *j->p == ']') { j->p++; return 0; }
    for (;;) {
        double v = fox_json_number(j);
        if (n < cap) out[n] = (int64_t)v;
        n++;
        fox_json_ws(j);
        if (j->p < j->end && *j->p == ',') { j->p++; continue; }
        fox_json_expect(j, ']');
        return n;
    }
}

// The "compressor" object: {"id": "blosc", "cname": "zstd", "clevel": 5, "shuffle": 1, ...}.
static inline void fox_zarr_parse_compressor(FoxZarr *z, FoxJson *j) {
    if (fox_json_literal(j, "null")) { z->compressor = FOX_ZARR_RAW; return; }
    char id[64] = "";
    fox_json_expect(j, '{');
    fox_json_ws(j);
    if (j->p < j->end && *j->p == '}') fox_json_fail(j, "empty compressor");
    for (;;) {
        char key[64];
        fox_json_string(j, key, sizeof key);
        fox_json_expect(j, ':');
        if (!strcmp(key, "id")) fox_json_string(j, id, sizeof id);
        else if (!strcmp(key, "cname")) fox_json_string(j, z->cname, sizeof z->cname);
        else if (!strcmp(key, "clevel")) z->clevel = (int)fox_json_number(j);
        else if (!strcmp(key, "shuffle")) z->shuffle = (int)fox_json_number(j);
        else fox_json_skip_value(j);
        fox_json_ws(j);
        if (j->p < j->end && *j->p == ',') { j->p++; continue; }
        fox_json_expect(j, '}');
        break;
    }
    if (strcmp(id, "blosc") != 0)
        fox_fatal("%s: unsupported compressor '%s' (fox.c reads blosc or uncompressed zarr arrays)", z->dir, id);
    z->compressor = FOX_ZARR_BLOSC;
}

static inline void fox_zarr_parse_dtype(FoxZarr *z) {
    if (!strcmp(z->dtype, "<u2")) z->itemsize = 2;
    else if (!strcmp(z->dtype, "<u4")) z->itemsize = 4;
    else if (!strcmp(z->dtype, "|u1")) z->itemsize = 1;
    else fox_fatal("%s: unsupported dtype '%s' (token arrays must be <u2, <u4 or |u1)", z->dir, z->dtype);
}

static inline void fox_zarr_parse_metadata(FoxZarr *z, const char *json, size_t len, const char *path) {
    FoxJson j = {json, json + len, path};
    int format = -1, nshape = -1, nchunks = -1, have_dtype = 0, have_comp = 0;
    char order[8] = "C", sep[8] = ".";
    fox_json_expect(&j, '{');
    fox_json_ws(&j);
    if (j.p < j.end && *j.p == '}') fox_json_fail(&j, "empty object");
    for (;;) {
        char key[64];
        fox_json_string(&j, key, sizeof key);
        fox_json_expect(&j, ':');
        if (!strcmp(key, "zarr_format")) format = (int)fox_json_number(&j);
        else if (!strcmp(key, "shape")) nshape = fox_json_int_array(&j, z->shape, 2);
        else if (!strcmp(key, "chunks")) nchunks = fox_json_int_array(&j, z->chunks, 2);
        else if (!strcmp(key, "dtype")) {
            fox_json_ws(&j);
            if (j.p < j.end && *j.p != '"') fox_fatal("%s: unsupported structured dtype", path);
            fox_json_string(&j, z->dtype, sizeof z->dtype);
            have_dtype = 1;
        } else if (!strcmp(key, "compressor")) { fox_zarr_parse_compressor(z, &j); have_comp = 1; }
        else if (!strcmp(key, "order")) fox_json_string(&j, order, sizeof order);
        else if (!strcmp(key, "dimension_separator")) fox_json_string(&j, sep, sizeof sep);
        else if (!strcmp(key, "filters")) {
            if (!fox_json_literal(&j, "null")) {
                fox_json_ws(&j);
                const char *start = j.p;
                fox_json_skip_value(&j);
                if (!(j.p - start == 2 && start[0] == '[' && start[1] == ']'))
                    fox_fatal("%s: zarr filters are not supported (only a compressor)", path);
            }
        } else fox_json_skip_value(&j);  // fill_value among them: every chunk must be on disk
        fox_json_ws(&j);
        if (j.p < j.end && *j.p == ',') { j.p++; continue; }
        fox_json_expect(&j, '}');
        break;
    }
    if (format != 2) fox_fatal("%s: zarr_format %d is not supported (zarr v2 only)", path, format);
    if (nshape != 2 || nchunks != 2)
        fox_fatal("%s: expected a 2-D array (docs x tokens), got %d dimensions", path, nshape);
    if (!have_dtype) fox_fatal("%s: no dtype", path);
    if (!have_comp) fox_fatal("%s: no compressor field", path);
    if (strcmp(order, "C") != 0) fox_fatal("%s: order '%s' is not supported (C order only)", path, order);
    if (strcmp(sep, ".") && strcmp(sep, "/")) fox_fatal("%s: bad dimension_separator '%s'", path, sep);
    z->sep = sep[0];
    for (int d = 0; d < 2; d++) {
        if (z->shape[d] <= 0) fox_fatal("%s: empty array (shape %lld)", path, (long long)z->shape[d]);
        if (z->chunks[d] <= 0) fox_fatal("%s: bad chunk size %lld", path, (long long)z->chunks[d]);
    }
    fox_zarr_parse_dtype(z);
#ifdef FOX_NO_BLOSC
    if (z->compressor == FOX_ZARR_BLOSC)
        fox_fatal("%s: a blosc-compressed array, and this build has no libblosc (install libblosc-dev, rebuild)", path);
#else
    if (z->compressor == FOX_ZARR_BLOSC && blosc_compname_to_compcode(z->cname) < 0)
        fox_fatal("%s: blosc codec '%s' is not available in this libblosc", path, z->cname);
#endif
}

static inline int fox_zarr_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

// The chunk grid's size along dimension d.
static inline int64_t fox_zarr_grid(const FoxZarr *z, int d) { return (z->shape[d] + z->chunks[d] - 1) / z->chunks[d]; }

// Parses a chunk index (decimal digits only) from [s, end); -1 if it is not one.
static inline int64_t fox_zarr_index(const char *s, const char *end) {
    if (s == end || end - s > 18) return -1;
    int64_t v = 0;
    for (; s < end; s++) {
        if (*s < '0' || *s > '9') return -1;
        v = v * 10 + (*s - '0');
    }
    return v;
}

// Marks in `have` (row-major over the chunk grid) the chunk files of one directory listing: names
// "i.j" (row < 0) or, inside row directory `row`, "j". A chunk name that is not a regular file is an
// error naming it.
static inline void fox_zarr_list_chunks(const FoxZarr *z, const char *dir, int64_t row, unsigned char *have) {
    DIR *d = opendir(dir);
    if (!d) {
        if (row >= 0 && errno == ENOENT) return;  // a missing row directory: its chunks are missing
        fox_fatal("%s: cannot list: %s", dir, strerror(errno));
    }
    int64_t gi = fox_zarr_grid(z, 0), gj = fox_zarr_grid(z, 1);
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *n = e->d_name, *dot = strchr(n, '.'), *end = n + strlen(n);
        int64_t ci = row, cj;
        if (row < 0) {
            if (!dot) continue;
            ci = fox_zarr_index(n, dot);
            cj = fox_zarr_index(dot + 1, end);
        } else {
            cj = fox_zarr_index(n, end);
        }
        if (ci < 0 || cj < 0 || ci >= gi || cj >= gj) continue;
        int regular = e->d_type == DT_REG;
        if (e->d_type == DT_UNKNOWN || e->d_type == DT_LNK) {  // the file system did not say: ask
            char path[4352];
            struct stat st;
            if (snprintf(path, sizeof path, "%s/%s", dir, n) >= (int)sizeof path) fox_fatal("%s: path too long", dir);
            regular = stat(path, &st) == 0 && S_ISREG(st.st_mode);
        }
        if (!regular) fox_fatal("%s/%s: a chunk that is not a regular file", dir, n);
        have[ci * gj + cj] = 1;
    }
    closedir(d);
}

// Every chunk the shape needs is a file on disk; else an error naming the first missing one.
static inline void fox_zarr_check_chunks(const FoxZarr *z) {
    int64_t gi = fox_zarr_grid(z, 0), gj = fox_zarr_grid(z, 1);
    unsigned char *have = (unsigned char *)fox_calloc((size_t)(gi * gj), 1);
    if (z->sep == '.') {
        fox_zarr_list_chunks(z, z->dir, -1, have);
    } else {
        char path[4352];
        for (int64_t ci = 0; ci < gi; ci++) {
            if (snprintf(path, sizeof path, "%s/%lld", z->dir, (long long)ci) >= (int)sizeof path) fox_fatal("%s: path too long", z->dir);
            fox_zarr_list_chunks(z, path, ci, have);
        }
    }
    for (int64_t k = 0; k < gi * gj; k++)
        if (!have[k])
            fox_fatal("%s/%lld%c%lld: chunk missing (shape %lld x %lld needs %lld x %lld chunks of %lld x %lld): a "
                      "zarr array with a hole is a broken download", z->dir, (long long)(k / gj), z->sep,
                      (long long)(k % gj), (long long)z->shape[0], (long long)z->shape[1], (long long)gi,
                      (long long)gj, (long long)z->chunks[0], (long long)z->chunks[1]);
    free(have);
}

// Opens a zarr v2 array directory; any problem is a fatal one-line error.
static inline void fox_zarr_open(FoxZarr *z, const char *dir) {
    memset(z, 0, sizeof *z);
    z->dir = fox_strdup(dir);
    size_t n = strlen(z->dir);
    while (n > 1 && z->dir[n - 1] == '/') z->dir[--n] = 0;
    if (!fox_zarr_is_dir(z->dir)) fox_fatal("%s: not a directory", z->dir);
    char *path = (char *)fox_malloc(n + 16);
    snprintf(path, n + 16, "%s/.zarray", z->dir);
    size_t len = 0;
    char *json = fox_read_file(path, &len);
    if (!json) {
        snprintf(path, n + 16, "%s/.zgroup", z->dir);
        struct stat st;
        if (stat(path, &st) == 0)
            fox_fatal("%s: is a zarr group, not an array (point at the array inside, e.g. .../train.zarr)", z->dir);
        fox_fatal("%s: not a zarr v2 array directory (no .zarray)", z->dir);
    }
    fox_zarr_parse_metadata(z, json, len, path);
    free(json);
    free(path);
    fox_zarr_check_chunks(z);
#ifndef FOX_NO_BLOSC
    blosc_init();
#endif
}

static inline size_t fox_zarr_chunk_bytes(const FoxZarr *z) {
    return (size_t)z->chunks[0] * (size_t)z->chunks[1] * (size_t)z->itemsize;
}

// Reads and decompresses chunk (ci, cj) into dst; a chunk gone since fox_zarr_open is an error too.
static inline void fox_zarr_load_chunk(FoxZarr *z, int64_t ci, int64_t cj, unsigned char *dst) {
    size_t want = fox_zarr_chunk_bytes(z);
    size_t plen = strlen(z->dir) + 48;
    char *path = (char *)fox_malloc(plen);
    snprintf(path, plen, "%s/%lld%c%lld", z->dir, (long long)ci, z->sep, (long long)cj);
    FILE *f = fopen(path, "rb");
    if (!f) fox_fatal("%s: cannot open chunk: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0) fox_fatal("%s: cannot stat chunk: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) fox_fatal("%s: a chunk that is not a regular file", path);
    long size = (long)st.st_size;
    if (z->compressor == FOX_ZARR_RAW) {
        if ((size_t)size != want)
            fox_fatal("%s: uncompressed chunk has %ld bytes, expected %zu", path, size, want);
        if (fread(dst, 1, want, f) != want) fox_fatal("%s: read failed", path);
    } else {
#ifndef FOX_NO_BLOSC  // (without libblosc fox_zarr_open refused a compressed array)
        if ((size_t)size > z->cbuf_cap) {
            z->cbuf_cap = (size_t)size;
            z->cbuf = (unsigned char *)fox_realloc(z->cbuf, z->cbuf_cap);
        }
        if (size < BLOSC_MIN_HEADER_LENGTH || fread(z->cbuf, 1, (size_t)size, f) != (size_t)size)
            fox_fatal("%s: truncated blosc chunk (%ld bytes)", path, size);
        size_t nbytes = 0;
        if (blosc_cbuffer_validate(z->cbuf, (size_t)size, &nbytes) < 0)
            fox_fatal("%s: corrupt or truncated blosc chunk (%ld bytes)", path, size);
        if (nbytes != want) fox_fatal("%s: blosc chunk holds %zu bytes, expected %zu", path, nbytes, want);
        int threads = 4;
        int got = blosc_decompress_ctx(z->cbuf, dst, want, threads);
        if (got < 0 || (size_t)got != want) fox_fatal("%s: blosc decompression failed (%d)", path, got);
#endif
    }
    fclose(f);
    free(path);
    z->chunks_decoded++;
}

// The cached chunk (ci, cj), loading it into the least recently used slot if absent.
static inline const unsigned char *fox_zarr_chunk(FoxZarr *z, int64_t ci, int64_t cj) {
    int victim = 0;
    for (int s = 0; s < z->cache_cap; s++) {
        if (z->cache[s].ci == ci && z->cache[s].cj == cj) {
            z->cache[s].last_use = ++z->tick;
            return z->cache[s].data;
        }
        if (z->cache[s].last_use < z->cache[victim].last_use) victim = s;
    }
    FoxZarrChunk *c = &z->cache[victim];
    if (!c->data) c->data = (unsigned char *)fox_malloc(fox_zarr_chunk_bytes(z));
    c->ci = -1;
    fox_zarr_load_chunk(z, ci, cj, c->data);
    c->ci = ci;
    c->cj = cj;
    c->last_use = ++z->tick;
    return c->data;
}

// Makes the cache hold at least `need` chunks (all chunks one rectangle touches).
static inline void fox_zarr_reserve(FoxZarr *z, int need) {
    if (need <= z->cache_cap) return;
    z->cache = (FoxZarrChunk *)fox_realloc(z->cache, (size_t)need * sizeof(FoxZarrChunk));
    for (int s = z->cache_cap; s < need; s++) {
        z->cache[s].ci = z->cache[s].cj = -1;
        z->cache[s].last_use = 0;
        z->cache[s].data = NULL;
    }
    z->cache_cap = need;
}

// Copies rows [r0, r0+nr) x cols [c0, c0+nc) into out (nr x nc, row-major, as uint32).
static inline void fox_zarr_read(FoxZarr *z, int64_t r0, int64_t nr, int64_t c0, int64_t nc, uint32_t *out) {
    if (r0 < 0 || c0 < 0 || nr <= 0 || nc <= 0 || r0 + nr > z->shape[0] || c0 + nc > z->shape[1])
        fox_fatal("%s: window docs [%lld, %lld) x pos [%lld, %lld) is outside the array (%lld x %lld)",
                     z->dir, (long long)r0, (long long)(r0 + nr), (long long)c0, (long long)(c0 + nc),
                     (long long)z->shape[0], (long long)z->shape[1]);
    int64_t ci0 = r0 / z->chunks[0], ci1 = (r0 + nr - 1) / z->chunks[0];
    int64_t cj0 = c0 / z->chunks[1], cj1 = (c0 + nc - 1) / z->chunks[1];
    int64_t touched = (ci1 - ci0 + 1) * (cj1 - cj0 + 1);
    if (touched > (1 << 20)) fox_fatal("%s: window touches too many chunks (%lld)", z->dir, (long long)touched);
    fox_zarr_reserve(z, (int)touched);
    for (int64_t ci = ci0; ci <= ci1; ci++) {
        int64_t rs = ci * z->chunks[0] > r0 ? ci * z->chunks[0] : r0;
        int64_t re = (ci + 1) * z->chunks[0] < r0 + nr ? (ci + 1) * z->chunks[0] : r0 + nr;
        for (int64_t cj = cj0; cj <= cj1; cj++) {
            int64_t cs = cj * z->chunks[1] > c0 ? cj * z->chunks[1] : c0;
            int64_t ce = (cj + 1) * z->chunks[1] < c0 + nc ? (cj + 1) * z->chunks[1] : c0 + nc;
            const unsigned char *chunk = fox_zarr_chunk(z, ci, cj);
            for (int64_t r = rs; r < re; r++) {
                const unsigned char *src = chunk + ((size_t)(r - ci * z->chunks[0]) * (size_t)z->chunks[1]
                                                    + (size_t)(cs - cj * z->chunks[1])) * (size_t)z->itemsize;
                uint32_t *dst = out + (size_t)(r - r0) * (size_t)nc + (size_t)(cs - c0);
                int64_t w = ce - cs;
                if (z->itemsize == 2) {
                    for (int64_t k = 0; k < w; k++) { uint16_t v; memcpy(&v, src + 2 * k, 2); dst[k] = v; }
                } else if (z->itemsize == 4) {
                    memcpy(dst, src, (size_t)w * 4);
                } else {
                    for (int64_t k = 0; k < w; k++) dst[k] = src[k];
                }
            }
        }
    }
}

static inline const char *fox_zarr_compression_name(const FoxZarr *z, char *buf, size_t cap) {
    if (z->compressor == FOX_ZARR_RAW) snprintf(buf, cap, "none");
    else snprintf(buf, cap, "blosc(cname=%s, clevel=%d, shuffle=%s)", z->cname, z->clevel,
                  z->shuffle == 0 ? "none" : z->shuffle == 1 ? "byte" : z->shuffle == 2 ? "bit" : "auto");
    return buf;
}

static inline void fox_zarr_close(FoxZarr *z) {
    for (int s = 0; s < z->cache_cap; s++) free(z->cache[s].data);
    free(z->cache);
    free(z->cbuf);
    free(z->dir);
    memset(z, 0, sizeof *z);
}

#endif
