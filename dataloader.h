// dataloader.h: fox.c's data loader (docs/model.md §3). Header-only, C11, also compiles as CUDA C++.
//
// Sources: a glob of llm.c shards ("data/train_*.bin"; uint16 or the uint32 variant), or a zarr
// v2 array directory (LongCrawl64's DIR/train.zarr, read through fox/zarr.h; link -lblosc).
//
// Sampling. The unit of sampling is a *window*:
//   .bin:  T+1 consecutive tokens starting at a multiple of T inside one shard (a shard of n
//          tokens gives (n-1)/T windows); input = w[0:T], target = w[1:T+1].
//   zarr:  a rectangle of B consecutive docs x [p*T, (p+1)*T) (docs in blocks of B from doc 0,
//          p < L/T); target = the rectangle, input = target shifted right by one with EOT (50256)
//          at position 0 (docs/model.md §3). One rectangle is one batch, so its chunks decompress once.
// An epoch is an ordering of all windows of the source. Train: for .bin the shard order is a
// seeded permutation and each shard's windows follow their own seeded permutation; for zarr all
// rectangles follow one seeded permutation. Permutations are keyed by (seed, epoch, shard) with
// the project RNG (stream FOX_STREAM_DATA) and computed on the fly (a Feistel network with cycle
// walking), so no index arrays are stored and any position can be jumped to. Validation: the
// natural order (shards in sorted-glob order, windows in file order).
// Rank r of `world` takes the epoch's windows r, r+world, r+2*world, ...: disjoint, and every
// rank gets floor(total/world) windows per epoch (the remainder, < world windows, is skipped so
// ranks stay in step). dataloader_next() takes the rank's next B windows (.bin) or next
// rectangle (zarr), moving on to the next epoch when the rank's share is used up.
// State = (epoch, index into the rank's sequence) plus B, T, rank, world, seed, train and a
// fingerprint of the data's sizes; restoring it resumes the exact batch sequence.
#ifndef FOX_DATALOADER_H
#define FOX_DATALOADER_H

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fox/data_common.h"
#include "fox/rng.h"
#include "fox/zarr.h"

// Shard format (docs/model.md §3): the ONE definition of these constants; Python code parses them from this file.
#define FOX_SHARD_MAGIC 20240520
#define FOX_SHARD_VERSION 1
#define FOX_SHARD_MAGIC_U32 20240801
#define FOX_SHARD_VERSION_U32 7
#define FOX_SHARD_HEADER_INTS 256

#define FOX_EOT 50256
#define FOX_LOADER_STATE_MAGIC 0x464f58444c4f4144ull  // "FOXDLOAD"
#define FOX_LOADER_STATE_VERSION 1
#define FOX_LOADER_STATE_WORDS 12

enum { FOX_SOURCE_BIN = 1, FOX_SOURCE_ZARR = 2 };

typedef struct FoxShard {
    char *path;
    const unsigned char *map;  // whole file, mmap'd read-only
    size_t map_bytes;
    long long ntok;
    int itemsize;              // 2 (uint16) or 4 (uint32)
    long long windows;         // (ntok - 1) / T
} FoxShard;

typedef struct DataLoader {
    int kind, B, T, rank, world, train;
    uint64_t seed, key, fingerprint;
    int vocab_hint;
    // .bin sources
    FoxShard *shards;
    int n_shards;
    // zarr source
    FoxZarr zarr;
    long long doc_blocks, pos_blocks;
    uint32_t *rect;            // B x T scratch
    // sampling
    long long total;           // windows per epoch (all ranks)
    long long per_rank;        // total / world
    long long epoch, index;    // position: the rank's next window is number `index` of epoch `epoch`
    long long order_epoch;     // epoch the shard order below belongs to (-1: none)
    int *shard_order;          // epoch's shard order
    long long *shard_start;    // first epoch position of each shard in that order (n_shards+1)
} DataLoader;

// ---- seeded permutation of [0, n) ----

// Element i of a pseudo-random permutation of [0, n) under `key`: a 4-round balanced Feistel
// network on the smallest even-bit domain >= n, re-applied until the value falls below n
// (cycle walking keeps it a bijection of [0, n); the domain is < 4n so few walks are needed).
static inline uint64_t fox_permute(uint64_t key, uint64_t n, uint64_t i) {
    if (n <= 1) return i;
    int bits = 0;
    while (bits < 64 && ((n - 1) >> bits)) bits++;
    int half = (bits + 1) / 2;
    uint64_t mask = (half >= 64) ? ~0ull : ((1ull << half) - 1);
    uint64_t x = i;
    do {
        uint64_t l = x >> half, r = x & mask;
        for (uint64_t round = 0; round < 4; round++) {
            uint64_t f = fox_rng_bits(key, (round << 56) ^ r) & mask;
            uint64_t nl = r;
            r = l ^ f;
            l = nl;
        }
        x = (l << half) | r;
    } while (x >= n);
    return x;
}

// Key of the permutation used for (epoch, what): what = shard index, or ~0 for the shard order.
static inline uint64_t fox_loader_perm_key(const DataLoader *dl, long long epoch, uint64_t what) {
    return fox_rng_bits(dl->key, ((uint64_t)epoch << 32) ^ (what & 0xffffffffull));
}

// ---- llm.c shards ----

static inline void fox_shard_open(FoxShard *s, const char *path) {
    memset(s, 0, sizeof *s);
    s->path = fox_strdup(path);
    int fd = open(path, O_RDONLY);
    if (fd < 0) fox_fatal("%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) fox_fatal("%s: cannot stat: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) fox_fatal("%s: not a regular file", path);
    size_t header_bytes = FOX_SHARD_HEADER_INTS * sizeof(int32_t);
    if ((size_t)st.st_size < header_bytes)
        fox_fatal("%s: truncated file (%lld bytes, shorter than the 1024-byte header)", path, (long long)st.st_size);
    int32_t header[FOX_SHARD_HEADER_INTS];
    if (read(fd, header, header_bytes) != (ssize_t)header_bytes) fox_fatal("%s: cannot read header", path);
    if (header[0] == FOX_SHARD_MAGIC) {
        if (header[1] != FOX_SHARD_VERSION)
            fox_fatal("%s: unsupported version %d for uint16 shards (expected %d)", path, header[1], FOX_SHARD_VERSION);
        s->itemsize = 2;
    } else if (header[0] == FOX_SHARD_MAGIC_U32) {
        if (header[1] != FOX_SHARD_VERSION_U32)
            fox_fatal("%s: unsupported version %d for uint32 shards (expected %d)", path, header[1], FOX_SHARD_VERSION_U32);
        s->itemsize = 4;
    } else {
        fox_fatal("%s: bad magic %d (not an llm.c token shard: expected %d or %d)", path, header[0],
                     FOX_SHARD_MAGIC, FOX_SHARD_MAGIC_U32);
    }
    s->ntok = header[2];
    if (s->ntok < 0) fox_fatal("%s: negative token count %lld in header", path, s->ntok);
    long long expect = (long long)header_bytes + s->ntok * s->itemsize;
    if ((long long)st.st_size != expect)
        fox_fatal("%s: size mismatch: header says %lld tokens (%lld bytes) but the file has %lld bytes%s", path,
                     s->ntok, expect, (long long)st.st_size, (long long)st.st_size < expect ? " (truncated)" : "");
    s->map_bytes = (size_t)st.st_size;
    void *m = mmap(NULL, s->map_bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) fox_fatal("%s: mmap failed: %s", path, strerror(errno));
    s->map = (const unsigned char *)m;
    close(fd);
}

static inline int fox_loader_is_glob(const char *spec) { return strpbrk(spec, "*?[") != NULL; }

// Expands spec into sorted shard paths (a plain path is one shard); errors if nothing matches.
static inline char **fox_loader_glob(const char *spec, int *count) {
    glob_t g;
    memset(&g, 0, sizeof g);
    int rc = glob(spec, 0, NULL, &g);
    if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0)) fox_fatal("%s: no files match", spec);
    if (rc != 0) fox_fatal("%s: glob failed", spec);
    char **paths = (char **)fox_malloc(g.gl_pathc * sizeof(char *));
    for (size_t i = 0; i < g.gl_pathc; i++) paths[i] = fox_strdup(g.gl_pathv[i]);
    *count = (int)g.gl_pathc;
    globfree(&g);
    return paths;
}

static inline void fox_loader_open_bin(DataLoader *dl, const char *spec) {
    int n = 0;
    char **paths;
    if (fox_loader_is_glob(spec)) paths = fox_loader_glob(spec, &n);
    else {
        paths = (char **)fox_malloc(sizeof(char *));
        paths[0] = fox_strdup(spec);
        n = 1;
    }
    dl->n_shards = n;
    dl->shards = (FoxShard *)fox_calloc((size_t)n, sizeof(FoxShard));
    dl->total = 0;
    dl->vocab_hint = 65536;
    uint64_t fp = FOX_FNV_INIT;
    for (int i = 0; i < n; i++) {
        FoxShard *s = &dl->shards[i];
        fox_shard_open(s, paths[i]);
        free(paths[i]);
        if (s->itemsize == 4) dl->vocab_hint = 0;
        s->windows = s->ntok > 0 ? (s->ntok - 1) / dl->T : 0;
        dl->total += s->windows;
        long long sig[2] = {s->ntok, s->itemsize};
        fp = fox_fnv1a(fp, sig, sizeof sig);
    }
    free(paths);
    dl->fingerprint = fp;
    if (dl->total < dl->world)
        fox_fatal("%s: T=%d is too long for this data: its %d shard(s) hold %lld window(s) of T+1 tokens, fewer than "
                     "the %d rank(s) need", spec, dl->T, n, dl->total, dl->world);
    dl->shard_order = (int *)fox_malloc((size_t)n * sizeof(int));
    dl->shard_start = (long long *)fox_malloc((size_t)(n + 1) * sizeof(long long));
    dl->order_epoch = -1;
}

// Shard order of `epoch` and where each shard's windows begin in the epoch's sequence.
static inline void fox_loader_shard_order(DataLoader *dl, long long epoch) {
    if (dl->order_epoch == epoch) return;
    uint64_t key = fox_loader_perm_key(dl, epoch, ~0ull);
    long long pos = 0;
    for (int i = 0; i < dl->n_shards; i++) {
        int s = dl->train ? (int)fox_permute(key, (uint64_t)dl->n_shards, (uint64_t)i) : i;
        dl->shard_order[i] = s;
        dl->shard_start[i] = pos;
        pos += dl->shards[s].windows;
    }
    dl->shard_start[dl->n_shards] = pos;
    dl->order_epoch = epoch;
}

// Copies tokens [start, start+n) of a shard into out.
static inline void fox_shard_tokens(const FoxShard *s, long long start, int n, int *out) {
    const unsigned char *base = s->map + FOX_SHARD_HEADER_INTS * sizeof(int32_t);
    if (s->itemsize == 2) {
        for (int k = 0; k < n; k++) {
            uint16_t v;
            memcpy(&v, base + 2 * (size_t)(start + k), 2);
            out[k] = v;
        }
    } else {
        for (int k = 0; k < n; k++) {
            uint32_t v;
            memcpy(&v, base + 4 * (size_t)(start + k), 4);
            if (v > 0x7fffffffu) fox_fatal("%s: token %u at %lld does not fit an int", s->path, v, start + k);
            out[k] = (int)v;
        }
    }
}

// Window number g of `epoch` (g in [0, total)) as (shard, first token).
static inline void fox_loader_locate_bin(DataLoader *dl, long long epoch, long long g, int *shard, long long *start) {
    fox_loader_shard_order(dl, epoch);
    int lo = 0, hi = dl->n_shards - 1;  // the last i with shard_start[i] <= g: never an empty shard
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (dl->shard_start[mid] <= g) lo = mid;
        else hi = mid - 1;
    }
    int s = dl->shard_order[lo];
    long long w = g - dl->shard_start[lo];
    if (dl->train) w = (long long)fox_permute(fox_loader_perm_key(dl, epoch, (uint64_t)s), (uint64_t)dl->shards[s].windows, (uint64_t)w);
    *shard = s;
    *start = w * dl->T;
}

// ---- zarr source ----

static inline void fox_loader_open_zarr(DataLoader *dl, const char *dir) {
    fox_zarr_open(&dl->zarr, dir);
    FoxZarr *z = &dl->zarr;
    dl->vocab_hint = z->itemsize == 2 ? 65536 : z->itemsize == 1 ? 256 : 0;
    if (dl->T > z->shape[1])
        fox_fatal("%s: T=%d is longer than the array's %lld tokens per document", dir, dl->T, (long long)z->shape[1]);
    if (dl->B > z->shape[0])
        fox_fatal("%s: B=%d is more than the array's %lld documents", dir, dl->B, (long long)z->shape[0]);
    dl->doc_blocks = z->shape[0] / dl->B;
    dl->pos_blocks = z->shape[1] / dl->T;
    dl->total = dl->doc_blocks * dl->pos_blocks;
    if (dl->total < dl->world)
        fox_fatal("%s: only %lld rectangles of %d docs x %d tokens, fewer than the %d ranks", dir, dl->total, dl->B,
                     dl->T, dl->world);
    int64_t sig[5] = {z->shape[0], z->shape[1], z->chunks[0], z->chunks[1], z->itemsize};
    dl->fingerprint = fox_fnv1a(FOX_FNV_INIT, sig, sizeof sig);
    dl->rect = (uint32_t *)fox_malloc((size_t)dl->B * (size_t)dl->T * sizeof(uint32_t));
}

// ---- the API ----

static inline void dataloader_init(DataLoader *dl, const char *spec, int B, int T, int rank, int world, uint64_t seed, int train) {
    memset(dl, 0, sizeof *dl);
    if (!spec || !*spec) fox_fatal("no data source given");
    if (B <= 0 || T <= 0) fox_fatal("bad batch shape B=%d T=%d", B, T);
    if (world <= 0 || rank < 0 || rank >= world) fox_fatal("bad rank %d of world %d", rank, world);
    dl->B = B; dl->T = T; dl->rank = rank; dl->world = world; dl->seed = seed; dl->train = train ? 1 : 0;
    dl->key = fox_rng_key(seed, FOX_STREAM_DATA);
    dl->order_epoch = -1;
    struct stat st;
    if (!fox_loader_is_glob(spec) && stat(spec, &st) != 0) fox_fatal("%s: cannot open: %s", spec, strerror(errno));
    if (!fox_loader_is_glob(spec) && S_ISDIR(st.st_mode)) {
        dl->kind = FOX_SOURCE_ZARR;
        fox_loader_open_zarr(dl, spec);
    } else {
        dl->kind = FOX_SOURCE_BIN;
        fox_loader_open_bin(dl, spec);
    }
    dl->per_rank = dl->total / world;
}

static inline void fox_loader_advance(DataLoader *dl) {
    if (++dl->index == dl->per_rank) { dl->index = 0; dl->epoch++; }
}

static inline void dataloader_next(DataLoader *dl, int *inputs, int *targets) {
    const int B = dl->B, T = dl->T;
    if (dl->kind == FOX_SOURCE_BIN) {
        int *window = (int *)fox_malloc((size_t)(T + 1) * sizeof(int));
        for (int b = 0; b < B; b++) {
            long long g = dl->index * dl->world + dl->rank;
            int shard;
            long long start;
            fox_loader_locate_bin(dl, dl->epoch, g, &shard, &start);
            fox_shard_tokens(&dl->shards[shard], start, T + 1, window);
            memcpy(inputs + (size_t)b * T, window, (size_t)T * sizeof(int));
            memcpy(targets + (size_t)b * T, window + 1, (size_t)T * sizeof(int));
            fox_loader_advance(dl);
        }
        free(window);
        return;
    }
    long long g = dl->index * dl->world + dl->rank;
    long long u = dl->train ? (long long)fox_permute(fox_loader_perm_key(dl, dl->epoch, 0), (uint64_t)dl->total, (uint64_t)g) : g;
    long long doc0 = (u / dl->pos_blocks) * B, pos0 = (u % dl->pos_blocks) * T;
    fox_zarr_read(&dl->zarr, doc0, B, pos0, T, dl->rect);
    for (int b = 0; b < B; b++) {
        const uint32_t *row = dl->rect + (size_t)b * T;
        int *in = inputs + (size_t)b * T, *tg = targets + (size_t)b * T;
        in[0] = FOX_EOT;
        for (int t = 0; t < T; t++) {
            if (row[t] > 0x7fffffffu) fox_fatal("%s: token %u does not fit an int", dl->zarr.dir, row[t]);
            tg[t] = (int)row[t];
            if (t + 1 < T) in[t + 1] = (int)row[t];
        }
    }
    fox_loader_advance(dl);
}

static inline long long dataloader_num_windows(const DataLoader *dl) {
    return dl->kind == FOX_SOURCE_ZARR ? dl->per_rank * dl->B : dl->per_rank;
}

static inline void dataloader_reset(DataLoader *dl) {
    dl->epoch = 0;
    dl->index = 0;
}

static inline size_t dataloader_state_bytes(const DataLoader *dl) {
    (void)dl;
    return FOX_LOADER_STATE_WORDS * sizeof(uint64_t);
}

static inline void fox_loader_state_words(const DataLoader *dl, uint64_t *w) {
    w[0] = FOX_LOADER_STATE_MAGIC;
    w[1] = FOX_LOADER_STATE_VERSION;
    w[2] = (uint64_t)dl->kind;
    w[3] = (uint64_t)dl->B;
    w[4] = (uint64_t)dl->T;
    w[5] = (uint64_t)dl->rank;
    w[6] = (uint64_t)dl->world;
    w[7] = dl->seed;
    w[8] = (uint64_t)dl->train;
    w[9] = dl->fingerprint;
    w[10] = (uint64_t)dl->epoch;
    w[11] = (uint64_t)dl->index;
}

static inline void dataloader_save_state(const DataLoader *dl, void *buf) {
    uint64_t w[FOX_LOADER_STATE_WORDS];
    fox_loader_state_words(dl, w);
    memcpy(buf, w, sizeof w);
}

static inline void dataloader_load_state(DataLoader *dl, const void *buf, size_t bytes) {
    static const char *const names[] = {"magic", "version", "source kind", "B", "T", "rank", "world", "seed",
                                        "train flag", "data fingerprint (shard sizes / array shape)"};
    if (bytes != dataloader_state_bytes(dl))
        fox_fatal("data-loader state has %zu bytes, expected %zu", bytes, dataloader_state_bytes(dl));
    uint64_t mine[FOX_LOADER_STATE_WORDS], saved[FOX_LOADER_STATE_WORDS];
    fox_loader_state_words(dl, mine);
    memcpy(saved, buf, sizeof saved);
    for (int i = 0; i < 10; i++)
        if (mine[i] != saved[i])
            fox_fatal("data-loader state does not match this loader: %s is %llu in the checkpoint, %llu now", names[i],
                         (unsigned long long)saved[i], (unsigned long long)mine[i]);
    if (saved[11] >= (uint64_t)dl->per_rank || saved[10] > (1ull << 40))
        fox_fatal("data-loader state is corrupt (epoch %llu, index %llu of %lld)", (unsigned long long)saved[10],
                     (unsigned long long)saved[11], dl->per_rank);
    dl->epoch = (long long)saved[10];
    dl->index = (long long)saved[11];
}

static inline int dataloader_vocab_hint(const DataLoader *dl) { return dl->vocab_hint; }

static inline void dataloader_free(DataLoader *dl) {
    for (int i = 0; i < dl->n_shards; i++) {
        if (dl->shards[i].map) munmap((void *)dl->shards[i].map, dl->shards[i].map_bytes);
        free(dl->shards[i].path);
    }
    free(dl->shards);
    free(dl->shard_order);
    free(dl->shard_start);
    if (dl->kind == FOX_SOURCE_ZARR) fox_zarr_close(&dl->zarr);
    free(dl->rect);
    memset(dl, 0, sizeof *dl);
}

#endif
