// fox_data: fox.c's data tool (one binary).
//   fox_data encode [options] FILE... | -     text / JSONL ("text" field) -> llm.c uint16 shards
//   fox_data decode SHARD.bin [--pos p:q]      tokens [p, q) of a shard -> text on stdout
//   fox_data dump SHARD.bin [--pos p:q]        token ids of [p, q), one line
//   fox_data dump ARRAY.zarr --docs a:b [--pos p:q]   ids of a zarr rectangle, one line per doc
//   fox_data tokenize [FILE | -] [--allow-special]    ids of the text on one line (no EOT added)
//   fox_data info SOURCE                        shape, dtype and compression of a shard glob or zarr array
//   fox_data mqar --out DIR [options]           a synthetic multi-query associative recall data set (fox/mqar.h)
//   fox_data passkey --out DIR [options]        passkey retrieval examples to train on (fox/passkey.h)
// encode options: --out PATH (default data/tokens.bin), --shard-tokens N (0 = one file; else
// PATH's stem + _000000.bin, ... holding N tokens each), --jsonl (also implied by .jsonl files),
// --val-out PATH --val-every K (document k goes to PATH when k % K == K/2), --threads N,
// --tokenizer PATH. Every document is preceded by EOT (50256), as llm.c's fineweb.py does.
// mqar options: --vocab V (8192), --num-kv N (16), --seq-len T (256), --train-examples E (100000),
// --test-examples E (1000), --seed S (1337); writes DIR/train.bin, DIR/test.bin and DIR/mqar.json.
// passkey options: --seq-len T (512), --train-examples E (20000), --val-examples E (200), --seed S (1337),
// --tokenizer PATH; writes DIR/train.bin, DIR/val.bin and DIR/passkey.json.
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "dataloader.h"
#include "fox/mqar.h"
#include "fox/passkey.h"
#include "tokenizer.h"

static void usage(void) {
    fprintf(stderr,
            "usage: fox_data encode [--out PATH] [--shard-tokens N] [--jsonl] [--val-out PATH --val-every K]\n"
            "                       [--threads N] [--tokenizer PATH] FILE... | -\n"
            "       fox_data decode SHARD.bin [--pos p:q] [--tokenizer PATH]\n"
            "       fox_data dump SHARD.bin [--pos p:q]\n"
            "       fox_data dump ARRAY.zarr --docs a:b [--pos p:q]\n"
            "       fox_data tokenize [FILE | -] [--allow-special] [--tokenizer PATH]\n"
            "       fox_data info SOURCE\n"
            "       fox_data mqar --out DIR [--vocab V] [--num-kv N] [--seq-len T] [--train-examples E]\n"
            "                     [--test-examples E] [--seed S]\n"
            "       fox_data passkey --out DIR [--seq-len T] [--train-examples E] [--val-examples E] [--seed S]\n"
            "                        [--tokenizer PATH]\n");
    exit(2);
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static long long parse_count(const char *s, const char *what) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno || v < 0) fox_fatal("bad %s '%s' (expected a non-negative integer)", what, s);
    return v;
}

// "p:q", "p:" (to the end) or ":q"; the end defaults to `limit`.
static void parse_range(const char *s, long long limit, long long *lo, long long *hi, const char *what) {
    const char *colon = strchr(s, ':');
    if (!colon) fox_fatal("bad %s range '%s' (expected p:q)", what, s);
    char left[64], right[64];
    size_t nl = (size_t)(colon - s);
    if (nl >= sizeof left || strlen(colon + 1) >= sizeof right) fox_fatal("bad %s range '%s'", what, s);
    memcpy(left, s, nl);
    left[nl] = 0;
    strcpy(right, colon + 1);
    *lo = nl ? parse_count(left, what) : 0;
    *hi = right[0] ? parse_count(right, what) : limit;
    if (*lo >= *hi) fox_fatal("empty %s range %lld:%lld", what, *lo, *hi);
    if (*hi > limit) fox_fatal("%s range %lld:%lld is beyond the data (%lld)", what, *lo, *hi, limit);
}

static char *read_input(const char *path, size_t *len) {
    if (!strcmp(path, "-")) {
        size_t cap = 1 << 20, n = 0;
        char *buf = (char *)fox_malloc(cap + 1);
        size_t got;
        while ((got = fread(buf + n, 1, cap - n, stdin)) > 0) {
            n += got;
            if (n == cap) buf = (char *)fox_realloc(buf, (cap *= 2) + 1);
        }
        if (ferror(stdin)) fox_fatal("reading stdin failed");
        buf[n] = 0;
        *len = n;
        return buf;
    }
    char *buf = fox_read_file(path, len);
    if (!buf) fox_fatal("%s: cannot read: %s", path, strerror(errno));
    return buf;
}

static void load_tokenizer(Tokenizer *t, const char *path) {
    const char *why = NULL;
    if (!tokenizer_load(t, path, &why)) fox_fatal("%s: cannot load the tokenizer: %s", path, why);
}

// ---- JSONL: the "text" field of each line ----

static void utf8_put(char *out, size_t *k, uint32_t cp) {
    if (cp < 0x80) out[(*k)++] = (char)cp;
    else if (cp < 0x800) { out[(*k)++] = (char)(0xC0 | (cp >> 6)); out[(*k)++] = (char)(0x80 | (cp & 0x3F)); }
    else if (cp < 0x10000) {
        out[(*k)++] = (char)(0xE0 | (cp >> 12));
        out[(*k)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[(*k)++] = (char)(0x80 | (cp & 0x3F));
    } else {
        out[(*k)++] = (char)(0xF0 | (cp >> 18));
        out[(*k)++] = (char)(0x80 | ((cp >> 12) & 0x3F));
        out[(*k)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[(*k)++] = (char)(0x80 | (cp & 0x3F));
    }
}

static int hex4(const char *p, const char *end, uint32_t *v) {
    if (end - p < 4) return 0;
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
        if (d < 0) return 0;
        *v = (*v << 4) | (uint32_t)d;
    }
    return 1;
}

// Decodes the JSON string at j->p (escapes included; a lone surrogate becomes U+FFFD).
static char *json_string_value(FoxJson *j, size_t *len) {
    fox_json_expect(j, '"');
    const char *p = j->p;
    char *out = (char *)fox_malloc((size_t)(j->end - p) + 1);
    size_t k = 0;
    while (p < j->end && *p != '"') {
        char c = *p++;
        if (c != '\\') { out[k++] = c; continue; }
        if (p >= j->end) break;
        char e = *p++;
        switch (e) {
        case 'n': out[k++] = '\n'; break;
        case 't': out[k++] = '\t'; break;
        case 'r': out[k++] = '\r'; break;
        case 'b': out[k++] = '\b'; break;
        case 'f': out[k++] = '\f'; break;
        case 'u': {
            uint32_t cp;
            if (!hex4(p, j->end, &cp)) fox_json_fail(j, "bad \\u escape");
            p += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                uint32_t lo;
                if (j->end - p >= 6 && p[0] == '\\' && p[1] == 'u' && hex4(p + 2, j->end, &lo) && lo >= 0xDC00 && lo <= 0xDFFF) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    p += 6;
                } else cp = 0xFFFD;
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) cp = 0xFFFD;
            utf8_put(out, &k, cp);
            break;
        }
        default: out[k++] = e; break;  // \" \\ \/
        }
    }
    if (p >= j->end) fox_json_fail(j, "unterminated string");
    j->p = p + 1;
    out[k] = 0;
    *len = k;
    return out;
}

// The "text" value of one JSONL line (malloc'd), or NULL if the object has none.
static char *jsonl_text(const char *line, size_t n, const char *path, long long lineno, size_t *len) {
    char where[512];
    snprintf(where, sizeof where, "%s:%lld", path, lineno);
    FoxJson j = {line, line + n, where};
    char *text = NULL;
    fox_json_expect(&j, '{');
    fox_json_ws(&j);
    if (j.p < j.end && *j.p == '}') return NULL;
    for (;;) {
        char key[64];
        fox_json_string(&j, key, sizeof key);
        fox_json_expect(&j, ':');
        fox_json_ws(&j);
        if (!text && !strcmp(key, "text") && j.p < j.end && *j.p == '"') text = json_string_value(&j, len);
        else fox_json_skip_value(&j);
        fox_json_ws(&j);
        if (j.p < j.end && *j.p == ',') { j.p++; continue; }
        fox_json_expect(&j, '}');
        break;
    }
    return text;
}

// ---- encode ----

typedef struct Doc {
    char *text;
    size_t len;
    int *ids;
    size_t n;
} Doc;

typedef struct ShardWriter {
    const char *out;      // path (single file) or stem for numbered shards
    long long shard_tokens; // 0: everything in one file
    uint16_t *buf;
    long long n, cap;
    int index;
    long long total;
    int files;
} ShardWriter;

static void shard_path(const ShardWriter *w, char *path, size_t cap) {
    if (w->shard_tokens == 0) { snprintf(path, cap, "%s", w->out); return; }
    size_t n = strlen(w->out);
    int stem = (int)((n > 4 && !strcmp(w->out + n - 4, ".bin")) ? n - 4 : n);
    snprintf(path, cap, "%.*s_%06d.bin", stem, w->out, w->index);
}

static void shard_flush(ShardWriter *w) {
    char path[4096];
    shard_path(w, path, sizeof path);
    if (w->n > 0x7fffffffLL) fox_fatal("%s: %lld tokens do not fit a shard header; use --shard-tokens", path, w->n);
    int32_t header[FOX_SHARD_HEADER_INTS];
    memset(header, 0, sizeof header);
    header[0] = FOX_SHARD_MAGIC;
    header[1] = FOX_SHARD_VERSION;
    header[2] = (int32_t)w->n;
    FILE *f = fopen(path, "wb");
    if (!f) fox_fatal("%s: cannot create: %s", path, strerror(errno));
    if (fwrite(header, sizeof header, 1, f) != 1 || (w->n && fwrite(w->buf, 2, (size_t)w->n, f) != (size_t)w->n) || fclose(f) != 0)
        fox_fatal("%s: write failed: %s", path, strerror(errno));
    w->index++;
    w->files++;
    w->n = 0;
}

static void shard_push(ShardWriter *w, int id) {
    if (id < 0 || id > 65535) fox_fatal("token %d does not fit uint16", id);
    if (w->n == w->cap) {
        w->cap = w->cap ? 2 * w->cap : (1 << 20);
        w->buf = (uint16_t *)fox_realloc(w->buf, (size_t)w->cap * sizeof(uint16_t));
    }
    w->buf[w->n++] = (uint16_t)id;
    w->total++;
    if (w->shard_tokens && w->n == w->shard_tokens) shard_flush(w);
}

typedef struct EncodeJob {
    const Tokenizer *tok;
    Doc *docs;
    int n_docs, cap_docs;
    size_t bytes;          // text bytes queued
    long long docs_done, bytes_done;
    long long val_every;
    ShardWriter train, val;
    double t0;
} EncodeJob;

static void encode_flush(EncodeJob *job) {
    int n = job->n_docs;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1)
#endif
    for (int i = 0; i < n; i++) {
        Doc *d = &job->docs[i];
        d->ids = tokenizer_encode(job->tok, d->text, d->len, &d->n, 0);
    }
    for (int i = 0; i < n; i++) {
        Doc *d = &job->docs[i];
        if (!d->ids) fox_fatal("out of memory while encoding");
        long long k = job->docs_done++;
        ShardWriter *w = (job->val_every && k % job->val_every == job->val_every / 2) ? &job->val : &job->train;
        shard_push(w, FOX_EOT);
        for (size_t t = 0; t < d->n; t++) shard_push(w, d->ids[t]);
        job->bytes_done += (long long)d->len;
        free(d->ids);
        free(d->text);
    }
    job->n_docs = 0;
    job->bytes = 0;
    double dt = now_seconds() - job->t0;
    fprintf(stderr, "\rencoded %lld docs, %.1f MB -> %lld tokens (%.2f MB/s)   ", job->docs_done, job->bytes_done / 1e6,
            job->train.total + job->val.total, dt > 0 ? job->bytes_done / 1e6 / dt : 0.0);
}

static void encode_add(EncodeJob *job, char *text, size_t len) {
    if (job->n_docs == job->cap_docs) {
        job->cap_docs = job->cap_docs ? 2 * job->cap_docs : 1024;
        job->docs = (Doc *)fox_realloc(job->docs, (size_t)job->cap_docs * sizeof(Doc));
    }
    Doc *d = &job->docs[job->n_docs++];
    d->text = text;
    d->len = len;
    d->ids = NULL;
    d->n = 0;
    job->bytes += len;
    if (job->bytes >= (64u << 20) || job->n_docs >= 65536) encode_flush(job);
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

// Streams a JSONL file line by line into the job.
static void encode_jsonl(EncodeJob *job, const char *path) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) fox_fatal("%s: cannot open: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long long lineno = 0;
    while ((n = getline(&line, &cap, f)) >= 0) {
        lineno++;
        size_t k = (size_t)n;
        while (k && (line[k - 1] == '\n' || line[k - 1] == '\r' || line[k - 1] == ' ')) k--;
        if (!k) continue;
        size_t len = 0;
        char *text = jsonl_text(line, k, path, lineno, &len);
        if (!text) fox_fatal("%s:%lld: no \"text\" string field", path, lineno);
        encode_add(job, text, len);
    }
    if (ferror(f)) fox_fatal("%s: read failed", path);
    free(line);
    if (f != stdin) fclose(f);
}

static int cmd_encode(int argc, char **argv) {
    const char *out = "data/tokens.bin", *val_out = NULL, *tok_path = FOX_TOKENIZER_DEFAULT_PATH;
    long long shard_tokens = 0, val_every = 0;
    int jsonl = 0, n_inputs = 0;
    char **inputs = (char **)fox_malloc((size_t)argc * sizeof(char *));
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--shard-tokens") && i + 1 < argc) shard_tokens = parse_count(argv[++i], "--shard-tokens");
        else if (!strcmp(argv[i], "--jsonl")) jsonl = 1;
        else if (!strcmp(argv[i], "--val-out") && i + 1 < argc) val_out = argv[++i];
        else if (!strcmp(argv[i], "--val-every") && i + 1 < argc) val_every = parse_count(argv[++i], "--val-every");
        else if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc) tok_path = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            long long th = parse_count(argv[++i], "--threads");
#ifdef _OPENMP
            if (th > 0) omp_set_num_threads((int)th);
#else
            (void)th;
#endif
        } else if (argv[i][0] == '-' && argv[i][1]) usage();
        else inputs[n_inputs++] = argv[i];
    }
    if (!n_inputs) usage();
    if ((val_out != NULL) != (val_every > 0)) fox_fatal("--val-out and --val-every go together");
    if (shard_tokens > 0x7fffffffLL) fox_fatal("--shard-tokens %lld is over the 2^31-1 a header can hold", shard_tokens);
    Tokenizer tok;
    load_tokenizer(&tok, tok_path);
    EncodeJob job;
    memset(&job, 0, sizeof job);
    job.tok = &tok;
    job.val_every = val_every;
    job.train.out = out;
    job.train.shard_tokens = shard_tokens;
    job.val.out = val_out;
    job.val.shard_tokens = shard_tokens;
    job.t0 = now_seconds();
    for (int i = 0; i < n_inputs; i++) {
        if (jsonl || ends_with(inputs[i], ".jsonl")) encode_jsonl(&job, inputs[i]);
        else {
            size_t len;
            char *text = read_input(inputs[i], &len);
            encode_add(&job, text, len);
        }
    }
    encode_flush(&job);
    fprintf(stderr, "\n");
    if (job.train.n || job.train.files == 0) shard_flush(&job.train);
    if (val_out && (job.val.n || job.val.files == 0)) shard_flush(&job.val);
    double dt = now_seconds() - job.t0;
    printf("%lld documents, %.1f MB -> %lld tokens in %d file(s)", job.docs_done, job.bytes_done / 1e6, job.train.total,
           job.train.files);
    if (val_out) printf(" + %lld validation tokens in %d file(s)", job.val.total, job.val.files);
    printf(", %.2f s, %.2f MB/s\n", dt, dt > 0 ? job.bytes_done / 1e6 / dt : 0.0);
    free(job.train.buf);
    free(job.val.buf);
    free(job.docs);
    free(inputs);
    tokenizer_free(&tok);
    return 0;
}

// ---- decode / dump / tokenize / info ----

// Tokens [lo, hi) of one .bin shard (validated like the loader does).
static int *shard_range(const char *path, const char *range, long long *count) {
    FoxShard s;
    fox_shard_open(&s, path);
    long long lo = 0, hi = s.ntok;
    if (range) parse_range(range, s.ntok, &lo, &hi, "--pos");
    else if (s.ntok == 0) fox_fatal("%s: the shard holds no tokens", path);
    int *ids = (int *)fox_malloc((size_t)(hi - lo) * sizeof(int));
    long long done = 0;
    while (done < hi - lo) {  // fox_shard_tokens takes an int count
        int step = (int)((hi - lo - done) < (1 << 30) ? (hi - lo - done) : (1 << 30));
        fox_shard_tokens(&s, lo + done, step, ids + done);
        done += step;
    }
    munmap((void *)s.map, s.map_bytes);
    free(s.path);
    *count = hi - lo;
    return ids;
}

static void print_ids(const int *ids, long long n) {
    for (long long i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
    printf("\n");
}

static const char *option(int argc, char **argv, const char *name) {
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], name)) {
            if (i + 1 >= argc) fox_fatal("%s needs a value", name);
            return argv[i + 1];
        }
    return NULL;
}

static int is_directory(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int cmd_decode(int argc, char **argv) {
    if (argc < 1) usage();
    const char *tok_path = option(argc, argv, "--tokenizer");
    Tokenizer tok;
    load_tokenizer(&tok, tok_path ? tok_path : FOX_TOKENIZER_DEFAULT_PATH);
    long long n;
    int *ids = shard_range(argv[0], option(argc, argv, "--pos"), &n);
    size_t len;
    char *text = tokenizer_decode(&tok, ids, (size_t)n, &len);
    if (!text) fox_fatal("out of memory");
    if (fwrite(text, 1, len, stdout) != len) fox_fatal("write failed");
    free(text);
    free(ids);
    tokenizer_free(&tok);
    return 0;
}

static int cmd_dump(int argc, char **argv) {
    if (argc < 1) usage();
    const char *pos = option(argc, argv, "--pos"), *docs = option(argc, argv, "--docs");
    if (!is_directory(argv[0])) {
        if (docs) fox_fatal("--docs applies to zarr arrays; %s is a shard", argv[0]);
        long long n;
        int *ids = shard_range(argv[0], pos, &n);
        print_ids(ids, n);
        free(ids);
        return 0;
    }
    FoxZarr z;
    fox_zarr_open(&z, argv[0]);
    if (!docs) fox_fatal("dump of a zarr array needs --docs a:b");
    long long d0, d1, p0 = 0, p1 = z.shape[1];
    parse_range(docs, z.shape[0], &d0, &d1, "--docs");
    if (pos) parse_range(pos, z.shape[1], &p0, &p1, "--pos");
    uint32_t *rect = (uint32_t *)fox_malloc((size_t)(p1 - p0) * sizeof(uint32_t));
    int *row = (int *)fox_malloc((size_t)(p1 - p0) * sizeof(int));
    for (long long d = d0; d < d1; d++) {  // one document at a time: bounded memory; the cache keeps chunks
        fox_zarr_read(&z, d, 1, p0, p1 - p0, rect);
        for (long long k = 0; k < p1 - p0; k++) row[k] = (int)rect[k];
        print_ids(row, p1 - p0);
    }
    free(rect);
    free(row);
    fox_zarr_close(&z);
    return 0;
}

static int cmd_tokenize(int argc, char **argv) {
    const char *path = "-", *tok_path = FOX_TOKENIZER_DEFAULT_PATH;
    int special = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--allow-special")) special = 1;
        else if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc) tok_path = argv[++i];
        else if (argv[i][0] == '-' && argv[i][1]) usage();
        else path = argv[i];
    }
    Tokenizer tok;
    load_tokenizer(&tok, tok_path);
    size_t len, n;
    char *text = read_input(path, &len);
    int *ids = tokenizer_encode(&tok, text, len, &n, special);
    if (!ids) fox_fatal("out of memory");
    print_ids(ids, (long long)n);
    free(ids);
    free(text);
    tokenizer_free(&tok);
    return 0;
}

static int cmd_info(int argc, char **argv) {
    if (argc != 1) usage();
    if (is_directory(argv[0])) {
        FoxZarr z;
        fox_zarr_open(&z, argv[0]);
        char comp[128];
        printf("%s: zarr v2 array, shape %lld x %lld (docs x tokens), chunks %lld x %lld, dtype %s, compression %s\n",
               argv[0], (long long)z.shape[0], (long long)z.shape[1], (long long)z.chunks[0], (long long)z.chunks[1],
               z.dtype, fox_zarr_compression_name(&z, comp, sizeof comp));
        fox_zarr_close(&z);
        return 0;
    }
    int n = 1;
    char **paths;
    if (fox_loader_is_glob(argv[0])) paths = fox_loader_glob(argv[0], &n);
    else {
        paths = (char **)fox_malloc(sizeof(char *));
        paths[0] = fox_strdup(argv[0]);
    }
    long long total = 0;
    for (int i = 0; i < n; i++) {
        FoxShard s;
        fox_shard_open(&s, paths[i]);
        printf("%s: llm.c shard, %lld tokens, dtype %s, compression none\n", paths[i], s.ntok,
               s.itemsize == 2 ? "uint16" : "uint32");
        total += s.ntok;
        munmap((void *)s.map, s.map_bytes);
        free(s.path);
        free(paths[i]);
    }
    if (n > 1) printf("total: %d shards, %lld tokens\n", n, total);
    free(paths);
    return 0;
}

// ---- mqar: multi-query associative recall (fox/mqar.h) ----

// A flag's value that must fit an int.
static int parse_int(const char *s, const char *what) {
    long long v = parse_count(s, what);
    if (v > INT_MAX) fox_fatal("%s %s is too large", what, s);
    return (int)v;
}

// DIR/name into path (cap bytes).
static void path_join(char *path, size_t cap, const char *dir, const char *name) {
    if (snprintf(path, cap, "%s/%s", dir, name) >= (int)cap) fox_fatal("path too long: %s/%s", dir, name);
}

// tokens[0..n) as a shard's items of itemsize bytes (uint16 or uint32, the host's byte order as the loader reads them).
static void pack_tokens(const int *tokens, int n, int itemsize, unsigned char *bytes) {
    for (int t = 0; t < n; t++) {
        if (itemsize == 2) {
            uint16_t v = (uint16_t)tokens[t];
            memcpy(bytes + 2 * (size_t)t, &v, 2);
        } else {
            uint32_t v = (uint32_t)tokens[t];
            memcpy(bytes + 4 * (size_t)t, &v, 4);
        }
    }
}

// One example of a synthetic set: example i (T tokens) into tokens.
typedef void (*ExampleFn)(const void *set, long long i, int *tokens);

// Writes a split's examples of T tokens, back to back and followed by the token `last` (so that the last one
// is a whole window), as an llm.c shard of itemsize-byte tokens at DIR/name, through a temporary file renamed
// into place (fox_open_tmp). The caller bounds examples * T + 1 below 2^31.
static void write_examples(const char *dir, const char *name, int T, int itemsize, long long examples, int last,
                           ExampleFn example, const void *set) {
    char tmp[4300];
    FILE *f = fox_open_tmp(dir, name, tmp, sizeof tmp);
    int32_t header[FOX_SHARD_HEADER_INTS];
    memset(header, 0, sizeof header);
    header[0] = itemsize == 2 ? FOX_SHARD_MAGIC : FOX_SHARD_MAGIC_U32;
    header[1] = itemsize == 2 ? FOX_SHARD_VERSION : FOX_SHARD_VERSION_U32;
    header[2] = (int32_t)(examples * T + 1);
    int *tokens = (int *)fox_malloc((size_t)T * sizeof(int));
    unsigned char *bytes = (unsigned char *)fox_malloc((size_t)T * (size_t)itemsize);
    fox_fwrite(header, sizeof header, 1, f, tmp);
    for (long long i = 0; i < examples; i++) {
        example(set, i, tokens);
        pack_tokens(tokens, T, itemsize, bytes);
        fox_fwrite(bytes, (size_t)itemsize, (size_t)T, f, tmp);
    }
    tokens[0] = last;
    pack_tokens(tokens, 1, itemsize, bytes);
    fox_fwrite(bytes, (size_t)itemsize, 1, f, tmp);
    fox_commit_tmp(f, tmp);
    free(tokens);
    free(bytes);
}

// A split of the MQAR set: its description and the split's draw key.
typedef struct {
    const FoxMqar *m;
    uint64_t key;
} MqarSplit;

static void mqar_example(const void *set, long long i, int *tokens) {
    const MqarSplit *s = (const MqarSplit *)set;
    fox_mqar_example(s->m, s->key, i, tokens);
}

// The split's examples, then one start token; examples * T + 1 fits: fox_mqar_problem bounds the examples.
static void write_mqar_split(const FoxMqar *m, int split, long long examples, const char *dir, const char *name) {
    MqarSplit s = {m, fox_mqar_split_key(m->seed, split)};
    write_examples(dir, name, m->seq_len, m->vocab <= 65536 ? 2 : 4, examples, 0, mqar_example, &s);
}

// Writes DIR/NAME, a set's description, through a temporary file renamed into place (written last: its
// presence says the set is complete).
static FOX_PRINTF(3, 4) void write_set_json(const char *dir, const char *name, const char *fmt, ...) {
    char tmp[4300];
    FILE *f = fox_open_tmp(dir, name, tmp, sizeof tmp);
    va_list ap;
    va_start(ap, fmt);
    int n = vfprintf(f, fmt, ap);
    va_end(ap);
    if (n < 0) fox_fatal("cannot write %s: %s", tmp, strerror(errno));
    fox_commit_tmp(f, tmp);
}

// Writes DIR/mqar.json: the set's sizes, ranges and seed.
static void write_mqar_json(const FoxMqar *m, const char *dir) {
    write_set_json(dir, "mqar.json",
                   "{\"task\": \"mqar\", \"vocab\": %d, \"num_kv\": %d, \"seq_len\": %d, \"key_range\": [%d, %d], "
                   "\"value_range\": [%d, %d],\n \"train_examples\": %lld, \"test_examples\": %lld, \"seed\": %llu,\n"
                   " \"layout\": \"each example is seq_len tokens: token 0, the num_kv pairs key value (distinct keys from "
                   "key_range, values from value_range, ranges half-open), then the query section from position "
                   "2*num_kv+1, in which num_kv of its two-token slots (at even offsets), chosen uniformly, hold every key "
                   "once followed by its value, in a random order, and every other token is 0; train.bin and test.bin "
                   "hold their examples back to back and then one token 0, so with --seq-len seq_len window k is example "
                   "k; the answer positions are the query keys, whose next token is the value\"}\n",
                   m->vocab, m->num_kv, m->seq_len, m->key_lo, m->key_hi, m->value_lo, m->value_hi, m->train_examples,
                   m->test_examples, (unsigned long long)m->seed);
}

// Refuses a DIR that already holds a file of the set: another run's data is never overwritten.
static void refuse_existing(const char *dir, const char *name) {
    char path[4200];
    path_join(path, sizeof path, dir, name);
    struct stat st;
    if (lstat(path, &st) == 0) fox_fatal("%s already exists: fox_data does not overwrite data (choose another --out)", path);
    if (errno != ENOENT) fox_fatal("cannot check %s: %s", path, strerror(errno));
}

static int cmd_mqar(int argc, char **argv) {
    const char *out = NULL;
    FoxMqar m;
    memset(&m, 0, sizeof m);
    m.vocab = 8192;
    m.num_kv = 16;
    m.seq_len = 256;
    m.train_examples = 100000;
    m.test_examples = 1000;
    m.seed = 1337;
    for (int i = 0; i < argc; i++) {
        const char *flag = argv[i];
        if (strncmp(flag, "--", 2)) usage();
        if (i + 1 >= argc) fox_fatal("%s needs a value", flag);
        const char *v = argv[++i];
        if (!strcmp(flag, "--out")) out = v;
        else if (!strcmp(flag, "--vocab")) m.vocab = parse_int(v, flag);
        else if (!strcmp(flag, "--num-kv")) m.num_kv = parse_int(v, flag);
        else if (!strcmp(flag, "--seq-len")) m.seq_len = parse_int(v, flag);
        else if (!strcmp(flag, "--train-examples")) m.train_examples = parse_count(v, flag);
        else if (!strcmp(flag, "--test-examples")) m.test_examples = parse_count(v, flag);
        else if (!strcmp(flag, "--seed")) m.seed = (uint64_t)parse_count(v, flag);
        else usage();
    }
    if (!out) fox_fatal("fox_data mqar needs --out DIR");
    char msg[256];
    if (fox_mqar_problem(&m, 1, msg, sizeof msg)) fox_fatal("%s", msg);
    fox_mqar_set_ranges(&m);
    fox_mkdir_p(out);
    refuse_existing(out, "mqar.json");
    refuse_existing(out, "train.bin");
    refuse_existing(out, "test.bin");
    double t0 = now_seconds();
    write_mqar_split(&m, FOX_MQAR_TRAIN, m.train_examples, out, "train.bin");
    write_mqar_split(&m, FOX_MQAR_TEST, m.test_examples, out, "test.bin");
    write_mqar_json(&m, out);  // last: its presence says the set is whole
    fox_fsync_dir(out);
    printf("%s: %lld train and %lld test examples of %d tokens (%d pairs, keys [%d, %d), values [%d, %d)), %.2f s\n"
           "train with --train %s/train.bin --val %s/test.bin --seq-len %d --vocab %d (or more)\n",
           out, m.train_examples, m.test_examples, m.seq_len, m.num_kv, m.key_lo, m.key_hi, m.value_lo, m.value_hi,
           now_seconds() - t0, out, out, m.seq_len, m.vocab);
    return 0;
}

// ---- passkey: passkey retrieval examples to train on (fox/passkey.h) ----

typedef struct {
    const Tokenizer *tok;
    const FoxPasskeyText *text;
    uint64_t key;
    int T;
} PasskeySplit;

static void passkey_example(const void *set, long long i, int *tokens) {
    const PasskeySplit *s = (const PasskeySplit *)set;
    fox_passkey_example(s->tok, s->text, s->key, i, s->T, tokens);
}

// Writes DIR/passkey.json: the set's sizes and seed.
static void write_passkey_json(const char *dir, int T, long long train, long long val, unsigned long long seed) {
    write_set_json(dir, "passkey.json",
                   "{\"task\": \"passkey\", \"seq_len\": %d, \"train_examples\": %lld, \"val_examples\": %lld, "
                   "\"seed\": %llu,\n \"layout\": \"each example is seq_len tokens: a passkey prompt (fox/passkey.h: "
                   "<|endoftext|>, the task, filler with the key's line at a random depth, the question) and its "
                   "answer ' KEY.'; train.bin and val.bin hold their examples back to back and then one <|endoftext|>, so "
                   "with --seq-len seq_len window k is example k\"}\n",
                   T, train, val, seed);
}

static int cmd_passkey(int argc, char **argv) {
    const char *out = NULL, *tokenizer_path = FOX_TOKENIZER_DEFAULT_PATH;
    int T = 512;
    long long train = 20000, val = 200;
    unsigned long long seed = 1337;
    for (int i = 0; i < argc; i++) {
        const char *flag = argv[i];
        if (strncmp(flag, "--", 2)) usage();
        if (i + 1 >= argc) fox_fatal("%s needs a value", flag);
        const char *v = argv[++i];
        if (!strcmp(flag, "--out")) out = v;
        else if (!strcmp(flag, "--seq-len")) T = parse_int(v, flag);
        else if (!strcmp(flag, "--train-examples")) train = parse_count(v, flag);
        else if (!strcmp(flag, "--val-examples")) val = parse_count(v, flag);
        else if (!strcmp(flag, "--seed")) seed = (unsigned long long)parse_count(v, flag);
        else if (!strcmp(flag, "--tokenizer")) tokenizer_path = v;
        else usage();
    }
    if (!out) fox_fatal("fox_data passkey needs --out DIR");
    Tokenizer tok;
    load_tokenizer(&tok, tokenizer_path);
    FoxPasskeyText text = fox_passkey_text(&tok);
    int least = fox_passkey_fixed_tokens(&text) + 4;  // the answer ' KEY.' takes at most 4 tokens
    if (T < least) fox_fatal("--seq-len %d is shorter than a passkey example's fixed part (%d tokens)", T, least);
    if (train < 1 || val < 1) fox_fatal("--train-examples and --val-examples must be at least 1");
    if ((train > val ? train : val) > (INT32_MAX - 1) / T)
        fox_fatal("%lld examples of %d tokens do not fit one shard (2^31 tokens)", train > val ? train : val, T);
    fox_mkdir_p(out);
    refuse_existing(out, "passkey.json");
    refuse_existing(out, "train.bin");
    refuse_existing(out, "val.bin");
    double t0 = now_seconds();
    PasskeySplit tr = {&tok, &text, fox_passkey_split_key(seed, FOX_PASSKEY_TRAIN), T};
    PasskeySplit va = {&tok, &text, fox_passkey_split_key(seed, FOX_PASSKEY_VAL), T};
    write_examples(out, "train.bin", T, 2, train, FOX_EOT, passkey_example, &tr);
    write_examples(out, "val.bin", T, 2, val, FOX_EOT, passkey_example, &va);
    write_passkey_json(out, T, train, val, seed);  // last: its presence says the set is whole
    fox_fsync_dir(out);
    printf("%s: %lld train and %lld validation examples of %d tokens, %.2f s\n"
           "train with --train %s/train.bin --val %s/val.bin --seq-len %d; score with --eval-passkey\n",
           out, train, val, T, now_seconds() - t0, out, out, T);
    fox_passkey_text_free(&text);
    tokenizer_free(&tok);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) usage();
    const char *cmd = argv[1];
    if (!strcmp(cmd, "encode")) return cmd_encode(argc - 2, argv + 2);
    if (!strcmp(cmd, "decode")) return cmd_decode(argc - 2, argv + 2);
    if (!strcmp(cmd, "dump")) return cmd_dump(argc - 2, argv + 2);
    if (!strcmp(cmd, "tokenize")) return cmd_tokenize(argc - 2, argv + 2);
    if (!strcmp(cmd, "info")) return cmd_info(argc - 2, argv + 2);
    if (!strcmp(cmd, "mqar")) return cmd_mqar(argc - 2, argv + 2);
    if (!strcmp(cmd, "passkey")) return cmd_passkey(argc - 2, argv + 2);
    usage();
    return 2;
}
