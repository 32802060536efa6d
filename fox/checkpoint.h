// fox/checkpoint.h: the checkpoint format (docs/model.md §5), one definition for C, CUDA and Python.
//
// A run directory OUT holds checkpoints as sub-directories OUT/ckpt_SSSSSSSS (S = steps done).
// Each is written as OUT/.tmp_ckpt_SSSSSSSS, every file fsync'd, then renamed into place, so a
// directory named ckpt_* is always complete. Inside:
//   model.bin          int32 header[FOX_CKPT_HEADER_INTS]: [0] FOX_CKPT_MAGIC, [1] FOX_CKPT_VERSION,
//                      [2] number of config fields n, [3 .. 3+n) the FOX_CONFIG_FIELDS in order
//                      (floats as their IEEE-754 bits), [FOX_CKPT_I_CRC] the checksum; then every
//                      parameter as float32, in FOX_PARAMS order (row-major, layers outermost).
//   state_RRRRR.bin    one per rank: int32 header[FOX_CKPT_HEADER_INTS] (FOX_STATE_* indices below),
//                      then AdamW m and v (float32) of the rank's slice of the flat parameter
//                      vector, then the rank's data-loader state (opaque bytes).
// Both end their header with the CRC-32 (fox/crc32.h, zlib's) of the whole file read with that
// word as zero; loading verifies it before it reads any field but the magic and version (a flipped
// bit is named as corruption, never as a mismatched flag), then every header field against the
// others and the directory name. Version 1 files (no checksum) are still read, and state files of
// version 2 (no schedule flags).
// train_fox.py reads and writes model.bin (parsing the constants from this file), so weights move
// freely between fox.c and PyTorch.
#ifndef FOX_CHECKPOINT_H
#define FOX_CHECKPOINT_H

#define FOX_CKPT_MAGIC 20261121
#define FOX_CKPT_VERSION 2
#define FOX_STATE_MAGIC 20261122
#define FOX_STATE_VERSION 3
#define FOX_CKPT_HEADER_INTS 256
// Where both headers keep the file's CRC-32 (version 2 on).
#define FOX_CKPT_I_CRC 255

// Indices into a state file's header (64-bit values take two ints, low word first).
enum {
    FOX_STATE_I_MAGIC = 0,
    FOX_STATE_I_VERSION = 1,
    FOX_STATE_I_RANK = 2,
    FOX_STATE_I_WORLD = 3,
    FOX_STATE_I_STEP = 4,
    FOX_STATE_I_TOKENS = 6,        // int64 tokens seen
    FOX_STATE_I_SHARD_OFFSET = 8,  // int64 first parameter of this rank's optimizer slice
    FOX_STATE_I_SHARD_COUNT = 10,  // int64 parameters in the slice
    FOX_STATE_I_LOADER_BYTES = 12, // int64 size of the loader state
    FOX_STATE_I_SEQ_LEN = 14,
    FOX_STATE_I_BATCH = 15,
    FOX_STATE_I_TOTAL_BATCH = 16,  // int64 tokens per optimizer step
    FOX_STATE_I_RNG = 18,          // uint64 sampling RNG counter
    FOX_STATE_I_SKIPPED = 20,      // int64 steps skipped so far (non-finite or spiking loss)
    FOX_STATE_I_PARAMS = 22,       // int64 parameters of the model (the moments' slice lies inside)
    FOX_STATE_I_LOSS_MEAN = 24,    // float64 bits: the recent mean of the loss (--spike-z)
    FOX_STATE_I_LOSS_VAR = 26,     // float64 bits: its variance
    FOX_STATE_I_LOSS_COUNT = 28,   // int64 steps in those statistics
    // Version 3 on: the schedule's flags the run was written with (a resume says which changed).
    FOX_STATE_I_LR = 30,           // float64 bits: --lr
    FOX_STATE_I_MIN_LR = 32,       // float64 bits: --min-lr
    FOX_STATE_I_WEIGHT_DECAY = 34, // float64 bits: --weight-decay
    FOX_STATE_I_GRAD_CLIP = 36,    // float64 bits: --grad-clip
    FOX_STATE_I_WARMUP_TOKENS = 38,// int64 --warmup-tokens
    FOX_STATE_I_STEPS = 40,        // --steps
};

#include <stdint.h>
#include <dirent.h>
#include "config.h"
#include "crc32.h"
#include "io.h"

// The schedule's flags (version 3 on; has = 0 when a state file predates them).
typedef struct {
    int has, steps;
    double lr, min_lr, weight_decay, grad_clip;
    long long warmup_tokens;
} FoxSchedule;

// What a rank needs besides weights and moments to continue bit for bit.
typedef struct {
    int rank, world, step, seq_len, batch;
    long long tokens, shard_offset, shard_count, total_batch, loader_bytes, params, skipped, loss_count;
    double loss_mean, loss_var;
    uint64_t rng;
    FoxSchedule schedule;
} FoxTrainState;

static inline void fox_put_i64(int32_t *h, int at, long long v) {
    uint64_t u = (uint64_t)v;
    h[at] = (int32_t)(uint32_t)(u & 0xffffffffu);
    h[at + 1] = (int32_t)(uint32_t)(u >> 32);
}

static inline long long fox_get_i64(const int32_t *h, int at) {
    return (long long)(((uint64_t)(uint32_t)h[at + 1] << 32) | (uint64_t)(uint32_t)h[at]);
}

static inline void fox_put_f64(int32_t *h, int at, double v) {
    long long bits;
    memcpy(&bits, &v, 8);
    fox_put_i64(h, at, bits);
}

static inline double fox_get_f64(const int32_t *h, int at) {
    long long bits = fox_get_i64(h, at);
    double v;
    memcpy(&v, &bits, 8);
    return v;
}

// The CRC-32 of a header as stored, its checksum word read as zero.
static inline uint32_t fox_header_crc(const int32_t *h) {
    int32_t copy[FOX_CKPT_HEADER_INTS];
    memcpy(copy, h, sizeof(copy));
    copy[FOX_CKPT_I_CRC] = 0;
    return fox_crc32(0, copy, sizeof(copy));
}

// Writes a checkpoint file: the header, then the parts, then the file's CRC-32 into the header.
static inline void fox_write_checked(const char *path, int32_t *h, const void *const *parts, const size_t *bytes, int n) {
    uint32_t crc = fox_header_crc(h);
    h[FOX_CKPT_I_CRC] = 0;
    FILE *f = fox_fopen(path, "wb");
    fox_fwrite(h, sizeof(int32_t), FOX_CKPT_HEADER_INTS, f, path);
    for (int i = 0; i < n; i++) {
        fox_fwrite(parts[i], 1, bytes[i], f, path);
        crc = fox_crc32(crc, parts[i], bytes[i]);
    }
    h[FOX_CKPT_I_CRC] = (int32_t)crc;
    if (fseek(f, FOX_CKPT_I_CRC * sizeof(int32_t), SEEK_SET)) fox_fatal("cannot seek in %s: %s", path, strerror(errno));
    fox_fwrite(&h[FOX_CKPT_I_CRC], sizeof(int32_t), 1, f, path);
    fox_fclose_synced(f, path);
}

// Verifies a version-2 (or later) file's CRC-32 over the whole file as stored, its header h (already
// read) with the checksum word as zero: before any field of h is believed.
static inline void fox_verify_file_crc(const char *path, const int32_t *h) {
    const size_t chunk = (size_t)64 << 20;
    unsigned char *buf = (unsigned char *)fox_malloc(chunk);
    FILE *f = fox_fopen(path, "rb");
    uint32_t crc = fox_header_crc(h);
    if (fseek(f, FOX_CKPT_HEADER_INTS * sizeof(int32_t), SEEK_SET)) fox_fatal("cannot seek in %s: %s", path, strerror(errno));
    size_t got;
    while ((got = fread(buf, 1, chunk, f)) > 0) crc = fox_crc32(crc, buf, got);
    if (ferror(f)) fox_fatal("cannot read %s: %s", path, strerror(errno));
    fclose(f);
    free(buf);
    if (crc != (uint32_t)h[FOX_CKPT_I_CRC])
        fox_fatal("%s fails its checksum (stored %08x, computed %08x): the file is corrupted, truncated or was edited",
                  path, (uint32_t)h[FOX_CKPT_I_CRC], crc);
}

// Verifies a version-2 (or later) file's CRC-32 over its header h and the parts that followed it, as read.
static inline void fox_verify_crc(const char *path, const int32_t *h, const void *const *parts, const size_t *bytes, int n) {
    uint32_t crc = fox_header_crc(h);
    for (int i = 0; i < n; i++) crc = fox_crc32(crc, parts[i], bytes[i]);
    if (crc != (uint32_t)h[FOX_CKPT_I_CRC])
        fox_fatal("%s fails its checksum (stored %08x, computed %08x): the file is corrupted, truncated or was edited",
                  path, (uint32_t)h[FOX_CKPT_I_CRC], crc);
}

// Reads a checkpoint file: its header into h, its magic (`what`: the kind of file) and version (1 to
// `version`) checked; then, when the file holds exactly the n parts of `bytes` that the caller expects
// after the header, those parts in one pass, checksum verified over them. A file of another size has its
// checksum verified as stored and its parts left unread (*read = 0): its fields, checked next, then
// say what differs. Either way no field but the magic and version is believed before the checksum (from
// version 2 on). Returns the version.
static inline int fox_read_checked(const char *path, int32_t *h, int32_t magic, int version, const char *what,
                                   void *const *parts, const size_t *bytes, int n, int *read) {
    long long body = 0;
    for (int i = 0; i < n; i++) body += (long long)bytes[i];
    FILE *f = fox_fopen(path, "rb");
    fox_fread(h, sizeof(int32_t), FOX_CKPT_HEADER_INTS, f, path);
    if (h[0] != magic) fox_fatal("%s is not a fox.c %s (magic %d, expected %d)", path, what, h[0], magic);
    if (h[1] < 1 || h[1] > version) fox_fatal("%s has %s version %d, this build reads 1 to %d", path, what, h[1], version);
    *read = fox_file_size(path) == (long long)(FOX_CKPT_HEADER_INTS * sizeof(int32_t)) + body;
    for (int i = 0; *read && i < n; i++) fox_fread(parts[i], 1, bytes[i], f, path);
    fclose(f);
    if (h[1] >= 2 && *read) fox_verify_crc(path, h, (const void *const *)parts, bytes, n);
    else if (h[1] >= 2) fox_verify_file_crc(path, h);
    return h[1];
}

// A checkpoint file's header alone into h: magic and version checked, then (version 2 on) the whole
// file's checksum. Returns the version.
static inline int fox_read_checked_header(const char *path, int32_t *h, int32_t magic, int version, const char *what) {
    int read;
    return fox_read_checked(path, h, magic, version, what, NULL, NULL, 0, &read);
}

// Whether all n floats are finite (a non-finite weight or moment is never written or loaded).
static inline int fox_all_finite(const float *x, size_t n) {
    int ok = 1;
    #pragma omp parallel for reduction(&& : ok)
    for (size_t i = 0; i < n; i++) ok = ok && isfinite(x[i]);
    return ok;
}

static inline void fox_config_to_header(const FoxConfig *cfg, int32_t *h) {
    int i = 3;
#define FOX_PUT_INT(v) h[i++] = (int32_t)(v);
#define FOX_PUT_FLOAT(v) { float fv = (v); memcpy(&h[i++], &fv, 4); }
#define X(type, name, dflt) FOX_PUT_##type(cfg->name)
    FOX_CONFIG_FIELDS(X)
#undef X
    h[2] = i - 3;
}

// Reads the config from a header; returns 0 when it holds more fields than this build knows (or none). A
// file written before the later fields existed holds fewer: those take their defaults.
static inline int fox_config_from_header(const int32_t *h, FoxConfig *cfg) {
    int i = 3, n = h[2];
    fox_config_defaults(cfg);
#define FOX_GET_INT(v) if (i - 3 < n) v = h[i]; i++;
#define FOX_GET_FLOAT(v) if (i - 3 < n) memcpy(&v, &h[i], 4); i++;
#define X(type, name, dflt) FOX_GET_##type(cfg->name)
    FOX_CONFIG_FIELDS(X)
#undef X
    return n >= 1 && n <= i - 3;
}

// Describes the first config field where a and b differ into msg; returns 0 when they are equal.
static inline int fox_config_diff(const FoxConfig *a, const FoxConfig *b, char *msg, size_t cap) {
    if (a->arch != b->arch) {  // first: the other fields of another architecture differ as a consequence
        snprintf(msg, cap, "arch %s vs %s", fox_arch_name(a->arch), fox_arch_name(b->arch));
        return 1;
    }
#define FOX_DIFF_INT(name) if (a->name != b->name) { snprintf(msg, cap, "%s %d vs %d", #name, a->name, b->name); return 1; }
#define FOX_DIFF_FLOAT(name) if (memcmp(&a->name, &b->name, 4)) { snprintf(msg, cap, "%s %g vs %g", #name, (double)a->name, (double)b->name); return 1; }
#define X(type, name, dflt) FOX_DIFF_##type(name)
    FOX_CONFIG_FIELDS(X)
#undef X
    return 0;
}

static inline void fox_write_model_bin(const char *path, const FoxConfig *cfg, const float *params) {
    FoxLayout lay;
    fox_layout(cfg, &lay);
    int32_t h[FOX_CKPT_HEADER_INTS] = {0};
    h[0] = FOX_CKPT_MAGIC;
    h[1] = FOX_CKPT_VERSION;
    fox_config_to_header(cfg, h);
    const void *parts[1] = {params};
    size_t bytes[1] = {lay.total * sizeof(float)};
    fox_write_checked(path, h, parts, bytes, 1);
}

// The config of a model.bin's header h, whose checksum holds: its fields, their validity, the file's size.
static inline FoxConfig fox_model_header_config(const char *path, const int32_t *h) {
    FoxConfig cfg;
    if (!fox_config_from_header(h, &cfg)) fox_fatal("%s has %d config fields, this build knows fewer (a newer fox.c wrote it)", path, h[2]);
    const char *bad = fox_config_invalid(&cfg);
    if (bad) fox_fatal("%s holds an invalid config: %s", path, bad);
    FoxLayout lay;
    fox_layout(&cfg, &lay);
    long long want = (long long)(FOX_CKPT_HEADER_INTS * sizeof(int32_t) + lay.total * sizeof(float));
    long long got = fox_file_size(path);
    if (got != want) fox_fatal("%s has %lld bytes, its config needs %lld (truncated?)", path, got, want);
    return cfg;
}

// A model.bin whole, its config unknown beforehand (--generate, --eval-only): the weights (allocated here, as many
// as the file holds past its header) and the config, in one pass over the file; the checksum is verified before
// any field is believed, then the size against the config's layout, and every weight is finite.
static inline float *fox_load_model_bin(const char *path, FoxConfig *cfg) {
    long long body = fox_file_size(path) - (long long)(FOX_CKPT_HEADER_INTS * sizeof(int32_t));
    if (body < 0) body = 0;  // too short for a header: its read below says so
    float *params = (float *)fox_malloc((size_t)body);
    int32_t h[FOX_CKPT_HEADER_INTS];
    void *parts[1] = {params};
    size_t bytes[1] = {(size_t)body};
    int read;
    fox_read_checked(path, h, FOX_CKPT_MAGIC, FOX_CKPT_VERSION, "model file", parts, bytes, 1, &read);
    *cfg = fox_model_header_config(path, h);
    if (!fox_all_finite(params, (size_t)body / sizeof(float))) fox_fatal("%s holds non-finite weights (NaN or Inf)", path);
    return params;
}

// Loads a model.bin's weights into params, which must be laid out for `expect`: read once, checksum
// verified before the header's fields, every weight finite.
static inline void fox_read_model_bin(const char *path, const FoxConfig *expect, float *params) {
    int32_t h[FOX_CKPT_HEADER_INTS];
    FoxLayout lay;
    fox_layout(expect, &lay);
    void *parts[1] = {params};
    size_t bytes[1] = {lay.total * sizeof(float)};
    int read;
    fox_read_checked(path, h, FOX_CKPT_MAGIC, FOX_CKPT_VERSION, "model file", parts, bytes, 1, &read);
    FoxConfig cfg = fox_model_header_config(path, h);  // a file of another size stops here
    char why[160];
    if (fox_config_diff(&cfg, expect, why, sizeof(why)))
        fox_fatal("%s was written for another model (%s: file vs command line)", path, why);
    if (!fox_all_finite(params, lay.total)) fox_fatal("%s holds non-finite weights (NaN or Inf)", path);
}

static inline void fox_write_state(const char *path, const FoxTrainState *s, const float *m, const float *v,
                                   const void *loader) {
    int32_t h[FOX_CKPT_HEADER_INTS] = {0};
    h[FOX_STATE_I_MAGIC] = FOX_STATE_MAGIC;
    h[FOX_STATE_I_VERSION] = FOX_STATE_VERSION;
    h[FOX_STATE_I_RANK] = s->rank;
    h[FOX_STATE_I_WORLD] = s->world;
    h[FOX_STATE_I_STEP] = s->step;
    h[FOX_STATE_I_SEQ_LEN] = s->seq_len;
    h[FOX_STATE_I_BATCH] = s->batch;
    fox_put_i64(h, FOX_STATE_I_TOKENS, s->tokens);
    fox_put_i64(h, FOX_STATE_I_SHARD_OFFSET, s->shard_offset);
    fox_put_i64(h, FOX_STATE_I_SHARD_COUNT, s->shard_count);
    fox_put_i64(h, FOX_STATE_I_LOADER_BYTES, s->loader_bytes);
    fox_put_i64(h, FOX_STATE_I_TOTAL_BATCH, s->total_batch);
    fox_put_i64(h, FOX_STATE_I_RNG, (long long)s->rng);
    fox_put_i64(h, FOX_STATE_I_SKIPPED, s->skipped);
    fox_put_i64(h, FOX_STATE_I_PARAMS, s->params);
    fox_put_f64(h, FOX_STATE_I_LOSS_MEAN, s->loss_mean);
    fox_put_f64(h, FOX_STATE_I_LOSS_VAR, s->loss_var);
    fox_put_i64(h, FOX_STATE_I_LOSS_COUNT, s->loss_count);
    fox_put_f64(h, FOX_STATE_I_LR, s->schedule.lr);
    fox_put_f64(h, FOX_STATE_I_MIN_LR, s->schedule.min_lr);
    fox_put_f64(h, FOX_STATE_I_WEIGHT_DECAY, s->schedule.weight_decay);
    fox_put_f64(h, FOX_STATE_I_GRAD_CLIP, s->schedule.grad_clip);
    fox_put_i64(h, FOX_STATE_I_WARMUP_TOKENS, s->schedule.warmup_tokens);
    h[FOX_STATE_I_STEPS] = s->schedule.steps;
    const void *parts[3] = {m, v, loader};
    size_t n = (size_t)s->shard_count * sizeof(float), bytes[3] = {n, n, (size_t)s->loader_bytes};
    fox_write_checked(path, h, parts, bytes, 3);
}

// Reads a state file into m, v and loader: its checksum first, then its header against what this run
// expects (`want`: rank, world, seq_len, batch, total_batch, params, shard_offset, shard_count,
// loader_bytes, and step: the one its directory is named for) and against itself (tokens = step x
// tokens per step); fills tokens, rng, skipped, the loss statistics and the schedule's flags.
static inline void fox_read_state(const char *path, FoxTrainState *want, float *m, float *v, void *loader) {
    int32_t h[FOX_CKPT_HEADER_INTS];
    size_t n = (size_t)want->shard_count;
    void *parts[3] = {m, v, loader};
    size_t bytes[3] = {n * sizeof(float), n * sizeof(float), (size_t)want->loader_bytes};
    int read;
    int version = fox_read_checked(path, h, FOX_STATE_MAGIC, FOX_STATE_VERSION, "state file", parts, bytes, 3, &read);
#define FOX_EXPECT(what, got, exp) if ((long long)(got) != (long long)(exp)) \
        fox_fatal("%s was written with %s %lld, this run has %lld", path, what, (long long)(got), (long long)(exp));
    FOX_EXPECT("step", h[FOX_STATE_I_STEP], want->step);
    FOX_EXPECT("world size", h[FOX_STATE_I_WORLD], want->world);
    FOX_EXPECT("rank", h[FOX_STATE_I_RANK], want->rank);
    FOX_EXPECT("--seq-len", h[FOX_STATE_I_SEQ_LEN], want->seq_len);
    FOX_EXPECT("--batch", h[FOX_STATE_I_BATCH], want->batch);
    FOX_EXPECT("--total-batch-tokens", fox_get_i64(h, FOX_STATE_I_TOTAL_BATCH), want->total_batch);
    FOX_EXPECT("optimizer shard offset", fox_get_i64(h, FOX_STATE_I_SHARD_OFFSET), want->shard_offset);
    FOX_EXPECT("optimizer shard size", fox_get_i64(h, FOX_STATE_I_SHARD_COUNT), want->shard_count);
    FOX_EXPECT("data-loader state size", fox_get_i64(h, FOX_STATE_I_LOADER_BYTES), want->loader_bytes);
    FOX_EXPECT("tokens seen (step x tokens per step)", fox_get_i64(h, FOX_STATE_I_TOKENS), (long long)want->step * want->total_batch);
    if (version >= 2) FOX_EXPECT("parameter count", fox_get_i64(h, FOX_STATE_I_PARAMS), want->params);
#undef FOX_EXPECT
    long long need = (long long)(FOX_CKPT_HEADER_INTS * 4) + 8 * want->shard_count + want->loader_bytes;
    if (!read) fox_fatal("%s is truncated (%lld bytes, expected %lld)", path, fox_file_size(path), need);
    if (!fox_all_finite(m, n) || !fox_all_finite(v, n)) fox_fatal("%s holds non-finite AdamW moments (NaN or Inf)", path);
    want->tokens = fox_get_i64(h, FOX_STATE_I_TOKENS);
    want->rng = (uint64_t)fox_get_i64(h, FOX_STATE_I_RNG);
    want->skipped = version >= 2 ? fox_get_i64(h, FOX_STATE_I_SKIPPED) : 0;
    want->loss_mean = version >= 2 ? fox_get_f64(h, FOX_STATE_I_LOSS_MEAN) : 0.0;
    want->loss_var = version >= 2 ? fox_get_f64(h, FOX_STATE_I_LOSS_VAR) : 0.0;
    want->loss_count = version >= 2 ? fox_get_i64(h, FOX_STATE_I_LOSS_COUNT) : 0;
    if (want->skipped < 0 || want->loss_count < 0 || !isfinite(want->loss_mean) || !(want->loss_var >= 0.0 && isfinite(want->loss_var)))
        fox_fatal("%s holds an invalid skipped-step count or loss statistics", path);
    FoxSchedule *sc = &want->schedule;
    memset(sc, 0, sizeof(*sc));
    if (version < 3) return;
    sc->has = 1;
    sc->lr = fox_get_f64(h, FOX_STATE_I_LR);
    sc->min_lr = fox_get_f64(h, FOX_STATE_I_MIN_LR);
    sc->weight_decay = fox_get_f64(h, FOX_STATE_I_WEIGHT_DECAY);
    sc->grad_clip = fox_get_f64(h, FOX_STATE_I_GRAD_CLIP);
    sc->warmup_tokens = fox_get_i64(h, FOX_STATE_I_WARMUP_TOKENS);
    sc->steps = h[FOX_STATE_I_STEPS];
}

// The training context a state file was written with (its header, after its checksum).
static inline int fox_state_seq_len(const char *path) {
    int32_t h[FOX_CKPT_HEADER_INTS];
    fox_read_checked_header(path, h, FOX_STATE_MAGIC, FOX_STATE_VERSION, "state file");
    if (h[FOX_STATE_I_SEQ_LEN] < 1) fox_fatal("%s holds an invalid --seq-len %d", path, h[FOX_STATE_I_SEQ_LEN]);
    return h[FOX_STATE_I_SEQ_LEN];
}

static inline void fox_ckpt_dir(char *buf, size_t cap, const char *out, int step, int tmp) {
    if (snprintf(buf, cap, "%s/%sckpt_%08d", out, tmp ? ".tmp_" : "", step) >= (int)cap)
        fox_fatal("checkpoint path too long under %s", out);
}

// Removes a directory that holds only files (a stale temporary or an old checkpoint).
static inline void fox_remove_flat_dir(const char *dir) {
    if (fox_remove_flat_dir_status(dir)) fox_fatal("cannot remove %s: %s", dir, strerror(errno));
}

// Fresh temporary directory for the checkpoint of `step`; its path goes to tmp.
static inline void fox_ckpt_begin(const char *out, int step, char *tmp, size_t cap) {
    fox_mkdir_p(out);
    fox_ckpt_dir(tmp, cap, out, step, 1);
    fox_remove_flat_dir(tmp);
    fox_mkdir_p(tmp);
}

// Publishes a fully written (fsync'd) temporary checkpoint by renaming it into place.
static inline void fox_ckpt_commit(const char *out, int step) {
    char tmp[4096], dst[4096];
    fox_ckpt_dir(tmp, sizeof(tmp), out, step, 1);
    fox_ckpt_dir(dst, sizeof(dst), out, step, 0);
    fox_fsync_dir(tmp);
    fox_remove_flat_dir(dst);
    if (rename(tmp, dst)) fox_fatal("cannot rename %s to %s: %s", tmp, dst, strerror(errno));
    fox_fsync_dir(out);
}

static inline int fox_cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

// Steps of the complete checkpoints in out, ascending; returns how many (at most cap).
static inline int fox_ckpt_list(const char *out, int *steps, int cap) {
    DIR *d = opendir(out);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int step;
        if (strlen(e->d_name) != 13 || strncmp(e->d_name, "ckpt_", 5) || strspn(e->d_name + 5, "0123456789") != 8) continue;
        step = atoi(e->d_name + 5);
        if (n == cap) fox_fatal("more than %d checkpoints in %s", cap, out);
        steps[n++] = step;
    }
    closedir(d);
    qsort(steps, (size_t)n, sizeof(int), fox_cmp_int);
    return n;
}

// Deletes all but the newest `keep` checkpoints.
static inline void fox_ckpt_prune(const char *out, int keep) {
    int steps[4096];
    int n = fox_ckpt_list(out, steps, 4096);
    char dir[4096];
    for (int i = 0; i + keep < n; i++) {
        fox_ckpt_dir(dir, sizeof(dir), out, steps[i], 0);
        fox_remove_flat_dir(dir);
    }
}

// Step of the newest complete checkpoint in out, or -1.
static inline int fox_ckpt_latest(const char *out) {
    int steps[4096];
    int n = fox_ckpt_list(out, steps, 4096);
    return n ? steps[n - 1] : -1;
}

#endif
