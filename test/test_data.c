// test_data: tests of the data pipeline: tokenizer vs js-tiktoken, zarr reader vs
// numpy/zarr, the loader's sharding / shuffling / resume, every bad input, and fox_data.
// Run by `make test-data` (needs ./fox_data, node with test/data/node_modules/js-tiktoken, and
// $PYTHON with numpy + zarr). Prints one line per check and ends with "N passed, M failed".
// `test_data --open SPEC B T RANK WORLD` and `test_data --state-mismatch SPEC` are helper modes
// the tests run as subprocesses (the loader exits on bad input, so errors are tested that way).
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <sys/wait.h>
#include <time.h>

#include "dataloader.h"
#include "fox/mqar.h"
#include "fox/passkey.h"
#include "tokenizer.h"

static int n_passed, n_failed;
static char tmp[256];
static const char *python = "/usr/bin/python3";

static void check(int ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
    if (ok) n_passed++;
    else n_failed++;
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0) fox_fatal("%s: cannot write", path);
}

static char *path_in(const char *fmt, ...) {
    static char bufs[8][1024];
    static int next;
    char *buf = bufs[next++ % 8];
    va_list ap;
    va_start(ap, fmt);
    int k = snprintf(buf, 1024, "%s/", tmp);
    vsnprintf(buf + k, (size_t)(1024 - k), fmt, ap);
    va_end(ap);
    return buf;
}

static int run(const char *fmt, ...) {
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int rc = system(cmd);
    return (rc != -1 && WIFEXITED(rc)) ? WEXITSTATUS(rc) : -1;
}

// Runs a command that must fail cleanly: non-zero exit (no signal) and stderr exactly one line
// starting "error: ".
static void expect_error(const char *what, const char *cmd) {
    char *err = path_in("stderr.txt");
    char full[4096];
    snprintf(full, sizeof full, "%s >/dev/null 2>%s", cmd, err);
    int rc = system(full);
    int clean_exit = rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) != 0;
    size_t len = 0;
    char *text = fox_read_file(err, &len);
    int lines = 0;
    for (size_t i = 0; text && i < len; i++) lines += text[i] == '\n';
    int one_line = text && len > 7 && !strncmp(text, "error: ", 7) && lines == 1 && text[len - 1] == '\n';
    if (text && len && text[len - 1] == '\n') text[len - 1] = 0;
    check(clean_exit && one_line, "bad input rejected: %s -> %s", what, text && len ? text : "(no message)");
    free(text);
}

// Whether the file at path contains needle.
static int grep_file(const char *path, const char *needle) {
    size_t len = 0;
    char *text = fox_read_file(path, &len);
    int found = text && strstr(text, needle);
    free(text);
    return found;
}

// ---------------------------------------------------------------- tokenizer

static const char *const FIXED_CASES[][2] = {
    {"prose", "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
              "foolishness... \"Well,\" said Mr. O'Brien -- quite calmly -- 'I shan't go.' Isn't it? (Yes!)\n\n"
              "   Indented paragraph; semi-colons: colons, and em\xe2\x80\x94" "dashes \xe2\x80\x9cquoted\xe2\x80\x9d.\n"},
    {"code", "#include <stdio.h>\nint main(int argc, char **argv) {\n\tfor (int i = 0; i < argc; i++) {\n"
             "\t\tprintf(\"%s\\n\", argv[i]);  // print\n\t}\n    return 0x1F + 0b101;\n}\n"
             "def f(x):\n    return [y**2 for y in range(x) if y % 3 != 0]\n\n\n        \n"},
    {"digits", "0 1 12 123 1234 12345 123456789012345 3.14159 -2.5e10 1,000,000 2024-05-20 12abc34 a1b2c3 "
               "\xd9\xa1\xd9\xa2\xd9\xa3 \xe0\xa5\xa7\xe0\xa5\xa8 \xc2\xbd \xc2\xb2 \xe2\x85\xab 007"},
    {"whitespace", "a  b   c\t\td\n\n\ne    \n  f\xc2\xa0g\xe3\x80\x80h \xe2\x80\x83 i\x0b\x0cj  \t \n\n  k   "},
    {"crlf", "line1\r\nline2\r\n\r\nline3 \r\n\r\n\r\n  indented\r\n\ttab\r\nend\r"},
    {"unicode", "na\xc3\xafve caf\xc3\xa9, Gr\xc3\xb6\xc3\x9f" "e, \xce\x95\xce\xbb\xce\xbb\xce\xb7\xce\xbd\xce\xb9\xce\xba\xce\xac, "
                "\xd1\x80\xd1\x83\xd1\x81\xd1\x81\xd0\xba\xd0\xb8\xd0\xb9 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae"
                "\xe3\x83\x86\xe3\x82\xad\xe3\x82\xb9\xe3\x83\x88 \xe4\xb8\xad\xe6\x96\x87\xe5\xad\x97\xe7\xac\xa6 "
                "\xed\x95\x9c\xea\xb5\xad\xec\x96\xb4 \xd8\xa7\xd9\x84\xd8\xb9\xd8\xb1\xd8\xa8\xd9\x8a\xd8\xa9 "
                "emoji \xf0\x9f\x98\x80\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd \xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9"
                "\xe2\x80\x8d\xf0\x9f\x91\xa7! e\xcc\x81 \xe2\x82\xac" "100 \xe2\x84\xa2 \xf0\x9d\x95\x8f"},
    {"contractions", "I'm you're he's we've they'll she'd can't DON'T 'S 'quoted' ''s 'll' 're'x it's's ' s '"},
    {"eot", "first doc<|endoftext|>second <|endoftext|><|endoftext|> third <|endoftext <|endoftext|>"},
    {"empty", ""},
    {"space", " "},
    {"spaces_end", "word   "},
    {"newline_words", "\n\nHello\n \nworld \n\tx"},
};

// Random strings from a palette that exercises every branch of the pre-tokeniser.
static const char *const PALETTE[] = {
    " ", " ", " ", "  ", "\t", "\n", "\r\n", "\n\n", "\xc2\xa0", "\xe3\x80\x80", "a", "the", "The", " word", "xyz",
    "'", "'s", "'t", "'re", "'ll", "'ve", "'d", "'m", "'S", "0", "42", "3.5", "\xd9\xa3", "\xe2\x85\xab", ".", ",", "!?",
    "--", "(", ")", "\"", "#", "@", "$", "%", "\xe2\x80\x94", "\xe6\x97\xa5\xe6\x9c\xac", "\xe4\xb8\xad", "\xce\xb1\xce\xb2",
    "\xd0\xb4\xd0\xb0", "\xf0\x9f\x98\x80", "\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd", "\xc3\xa9", "e\xcc\x81", "_", "__init__",
    "<|endoftext|>", "<|", "|>", "http://x.org/a?b=c", "    ", "\t\t", " \n", "\n ", "A1", "1A", "\x0b", "\x0c"};

static void random_case(uint64_t seed, char *out, size_t cap) {
    uint64_t key = fox_rng_key(seed, 77);
    size_t n = 0, parts = 1 + fox_rng_below(key, 0, 40);
    out[0] = 0;
    for (size_t i = 0; i < parts; i++) {
        const char *p = PALETTE[fox_rng_below(key, i + 1, sizeof PALETTE / sizeof PALETTE[0])];
        size_t k = strlen(p);
        if (n + k + 1 >= cap) break;
        memcpy(out + n, p, k);
        n += k;
        out[n] = 0;
    }
}

static int *read_ids(const char *path, size_t *n) {
    size_t len;
    char *text = fox_read_file(path, &len);
    if (!text) return NULL;
    size_t cap = 16, k = 0;
    int *ids = (int *)fox_malloc(cap * sizeof(int));
    char *p = text, *end;
    for (;;) {
        long v = strtol(p, &end, 10);
        if (end == p) break;
        if (k == cap) ids = (int *)fox_realloc(ids, (cap *= 2) * sizeof(int));
        ids[k++] = (int)v;
        p = end;
    }
    free(text);
    *n = k;
    return ids;
}

static int same_ids(const int *a, size_t na, const int *b, size_t nb) {
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof(int)) == 0);
}

static void test_tokenizer(void) {
    printf("== tokenizer (vs js-tiktoken gpt2)\n");
    Tokenizer tok;
    int loaded = tokenizer_load(&tok, FOX_TOKENIZER_DEFAULT_PATH, NULL);
    check(loaded && tok.n_vocab == 50257 && tok.eot == 50256, "load %s (50257 tokens, EOT 50256)", FOX_TOKENIZER_DEFAULT_PATH);
    if (!loaded) return;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", path_in("tok"));
    run("mkdir -p %s", dir);
    int n_cases = 0;
    char names[256][32];
    for (size_t i = 0; i < sizeof FIXED_CASES / sizeof FIXED_CASES[0]; i++) {
        snprintf(names[n_cases], 32, "%s", FIXED_CASES[i][0]);
        write_bytes(path_in("tok/%s.txt", FIXED_CASES[i][0]), FIXED_CASES[i][1], strlen(FIXED_CASES[i][1]));
        n_cases++;
    }
    // natural text: the start of the bundled validation shard, decoded (EOTs included)
    {
        DataLoader dl;
        dataloader_init(&dl, "data/val.bin", 1, 60000, 0, 1, 0, 0);
        int *in = (int *)fox_malloc(60000 * sizeof(int)), *tg = (int *)fox_malloc(60000 * sizeof(int));
        dataloader_next(&dl, in, tg);
        size_t len;
        char *text = tokenizer_decode(&tok, in, 60000, &len);
        write_bytes(path_in("tok/bundled_val.txt"), text, len);
        snprintf(names[n_cases++], 32, "bundled_val");
        free(text);
        free(in);
        free(tg);
        dataloader_free(&dl);
    }
    char buf[2048];
    for (int r = 0; r < 200; r++) {
        random_case((uint64_t)r, buf, sizeof buf);
        snprintf(names[n_cases], 32, "random_%03d", r);
        write_bytes(path_in("tok/%s.txt", names[n_cases]), buf, strlen(buf));
        n_cases++;
    }
    int rc = run("node test/data/tokenizer_check.mjs %s", dir);
    check(rc == 0, "js-tiktoken reference encodings computed (node test/data/tokenizer_check.mjs)");
    if (rc != 0) { tokenizer_free(&tok); return; }
    int random_ok = 0, random_total = 0;
    for (int c = 0; c < n_cases; c++) {
        size_t len = 0, n_ord, n_all, n_ref_ord = 0, n_ref_all = 0, dlen = 0;
        char *text = fox_read_file(path_in("tok/%s.txt", names[c]), &len);
        int *ord = tokenizer_encode(&tok, text, len, &n_ord, 0);
        int *all = tokenizer_encode(&tok, text, len, &n_all, 1);
        int *ref_ord = read_ids(path_in("tok/%s.ord", names[c]), &n_ref_ord);
        int *ref_all = read_ids(path_in("tok/%s.all", names[c]), &n_ref_all);
        char *back = tokenizer_decode(&tok, ord, n_ord, &dlen);
        char *back_all = tokenizer_decode(&tok, all, n_all, &dlen);
        int ok = ref_ord && ref_all && same_ids(ord, n_ord, ref_ord, n_ref_ord) && same_ids(all, n_all, ref_all, n_ref_all);
        int round = back && dlen == len && memcmp(back, text, len) == 0 && back_all && memcmp(back_all, text, len) == 0;
        if (!strncmp(names[c], "random_", 7)) {
            random_total++;
            random_ok += ok && round;
            if (!(ok && round)) check(0, "random case %s: matches js-tiktoken %d, round trip %d", names[c], ok, round);
        } else {
            check(ok, "%s: %zu tokens, identical to js-tiktoken (ordinary and with <|endoftext|> special)", names[c], n_ord);
            check(round, "%s: decode(encode(x)) == x", names[c]);
        }
        free(text); free(ord); free(all); free(ref_ord); free(ref_all); free(back); free(back_all);
    }
    check(random_ok == random_total, "%d/%d random palette strings identical to js-tiktoken and round-trip", random_ok, random_total);
    // invalid UTF-8: tiktoken cannot take it (str only); fox.c keeps the bytes (identity round trip)
    static const char *const invalid[] = {"abc\xff\xfe def", "\xc3\x28 \xe2\x82 x", "\xf0\x9f\x98 end\x80", "\xed\xa0\x80 surrogate",
                                          "\xc0\xaf overlong", " \xff\xff  \xfe\n", "\xf4\x90\x80\x80 too big"};
    int inv_ok = 1;
    for (size_t i = 0; i < sizeof invalid / sizeof invalid[0]; i++) {
        size_t n, dlen, len = strlen(invalid[i]);
        int *ids = tokenizer_encode(&tok, invalid[i], len, &n, 1);
        char *back = tokenizer_decode(&tok, ids, n, &dlen);
        inv_ok &= ids && back && dlen == len && memcmp(back, invalid[i], len) == 0;
        free(ids);
        free(back);
    }
    check(inv_ok, "invalid UTF-8 bytes: decode(encode(x)) == x for %zu inputs", sizeof invalid / sizeof invalid[0]);
    // throughput on English text (the bundled corpus decoded, repeated to ~24 MB), one thread
    {
        size_t len;
        char *val = fox_read_file(path_in("tok/bundled_val.txt"), &len);
        size_t reps = (24u << 20) / len + 1, total = reps * len, n;
        char *big = (char *)fox_malloc(total);
        for (size_t r = 0; r < reps; r++) memcpy(big + r * len, val, len);
        double t0 = now_seconds();
        int *ids = tokenizer_encode(&tok, big, total, &n, 1);
        double dt = now_seconds() - t0;
        check(ids != NULL && dt > 0, "encode throughput: %.1f MB in %.2f s = %.1f MB/s on one thread (goal: 100 MB < 60 s on 2 cores)",
              total / 1e6, dt, total / 1e6 / dt);
        free(ids);
        free(big);
        free(val);
    }
    tokenizer_free(&tok);
}

// ---------------------------------------------------------------- llm.c shards

// A uint16 shard whose token k is base + k (so a window's first token names it).
static void write_shard(const char *path, int magic, int version, long long ntok, long long header_ntok, uint32_t base, int itemsize) {
    FILE *f = fopen(path, "wb");
    if (!f) fox_fatal("%s: cannot write", path);
    int32_t header[FOX_SHARD_HEADER_INTS];
    memset(header, 0, sizeof header);
    header[0] = magic;
    header[1] = version;
    header[2] = (int32_t)header_ntok;
    fwrite(header, sizeof header, 1, f);
    for (long long k = 0; k < ntok; k++) {
        uint32_t v = base + (uint32_t)k;
        if (itemsize == 2) { uint16_t s = (uint16_t)v; fwrite(&s, 2, 1, f); }
        else fwrite(&v, 4, 1, f);
    }
    if (fclose(f) != 0) fox_fatal("%s: write failed", path);
}

enum { S0 = 1000, S1 = 2501, S2 = 1777, TT = 16 };
static const uint32_t SHARD_BASE[3] = {0, S0, S0 + S1};
static const long long SHARD_N[3] = {S0, S1, S2};

// Is `first` the first token of a valid window of T+1 tokens in the test shards?
static int valid_window_start(int first, int T) {
    for (int s = 0; s < 3; s++) {
        long long off = (long long)first - SHARD_BASE[s];
        if (off >= 0 && off < SHARD_N[s]) return off % T == 0 && off + T + 1 <= SHARD_N[s];
    }
    return 0;
}

static int cmp_int(const void *a, const void *b) { return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b); }

// First tokens of the windows rank `rank` sees in one epoch (B = 1).
static int *epoch_windows(const char *spec, int T, int rank, int world, uint64_t seed, int train, long long *count, int *contiguous) {
    DataLoader dl;
    dataloader_init(&dl, spec, 1, T, rank, world, seed, train);
    long long n = dataloader_num_windows(&dl);
    int *firsts = (int *)fox_malloc((size_t)n * sizeof(int));
    int *in = (int *)fox_malloc((size_t)T * sizeof(int)), *tg = (int *)fox_malloc((size_t)T * sizeof(int));
    *contiguous = 1;
    for (long long i = 0; i < n; i++) {
        dataloader_next(&dl, in, tg);
        firsts[i] = in[0];
        for (int t = 0; t < T; t++) *contiguous &= in[t] == in[0] + t && tg[t] == in[0] + t + 1;
    }
    free(in);
    free(tg);
    dataloader_free(&dl);
    *count = n;
    return firsts;
}

static long long expected_windows(int T) {
    long long w = 0;
    for (int s = 0; s < 3; s++) w += (SHARD_N[s] - 1) / T;
    return w;
}

static void test_sharding(const char *spec) {
    long long total = expected_windows(TT);
    for (int train = 0; train <= 1; train++) {
        for (int world = 1; world <= 4; world++) {
            int *all = (int *)fox_malloc((size_t)total * sizeof(int));
            long long got = 0, per = -1;
            int contiguous = 1, valid = 1, equal = 1;
            for (int r = 0; r < world; r++) {
                long long n;
                int cont;
                int *f = epoch_windows(spec, TT, r, world, 1234, train, &n, &cont);
                contiguous &= cont;
                if (per < 0) per = n;
                equal &= n == per;
                for (long long i = 0; i < n; i++) { valid &= valid_window_start(f[i], TT); all[got++] = f[i]; }
                free(f);
            }
            qsort(all, (size_t)got, sizeof(int), cmp_int);
            int distinct = 1;
            for (long long i = 1; i < got; i++) distinct &= all[i] != all[i - 1];
            check(equal && per == total / world && got == (total / world) * world && distinct && valid && contiguous,
                  "%s, world %d: each rank gets %lld windows, disjoint, all %lld windows covered but the %lld remainder, "
                  "input/target = w[0:T]/w[1:T+1]",
                  train ? "train" : "val", world, per, total, total % world);
            free(all);
        }
    }
    long long n;
    int cont;
    int *v = epoch_windows(spec, TT, 1, 2, 0, 0, &n, &cont);
    check(v[0] == TT && v[1] == 3 * TT && v[2] == 5 * TT, "val order is sequential: rank 1 of 2 starts at windows 1, 3, 5");
    free(v);
    int *a = epoch_windows(spec, TT, 0, 1, 1, 1, &n, &cont);
    int *b = epoch_windows(spec, TT, 0, 1, 1, 1, &n, &cont);
    int *c = epoch_windows(spec, TT, 0, 1, 2, 1, &n, &cont);
    check(memcmp(a, b, (size_t)n * sizeof(int)) == 0, "train order is deterministic for a seed");
    check(memcmp(a, c, (size_t)n * sizeof(int)) != 0, "train order changes with the seed");
    long long inversions = 0;
    for (long long i = 1; i < n; i++) inversions += a[i] < a[i - 1];
    check(inversions > n / 4, "train order is shuffled (%lld descents in %lld windows)", inversions, n);
    free(a); free(b); free(c);
    // epoch 1 differs from epoch 0 but again covers every window once
    {
        DataLoader dl;
        dataloader_init(&dl, spec, 1, TT, 0, 1, 9, 1);
        long long per = dataloader_num_windows(&dl);
        int *e0 = (int *)fox_malloc((size_t)per * sizeof(int)), *e1 = (int *)fox_malloc((size_t)per * sizeof(int));
        int in[TT], tg[TT];
        for (long long i = 0; i < per; i++) { dataloader_next(&dl, in, tg); e0[i] = in[0]; }
        for (long long i = 0; i < per; i++) { dataloader_next(&dl, in, tg); e1[i] = in[0]; }
        int differs = memcmp(e0, e1, (size_t)per * sizeof(int)) != 0;
        qsort(e0, (size_t)per, sizeof(int), cmp_int);
        qsort(e1, (size_t)per, sizeof(int), cmp_int);
        check(differs && memcmp(e0, e1, (size_t)per * sizeof(int)) == 0, "epoch 2 is a new order of the same %lld windows", per);
        free(e0); free(e1);
        dataloader_free(&dl);
    }
}

// Batches `from`..`to` of a loader, and of a fresh loader restored from the state saved at `from`.
static int resume_matches(const char *spec, int B, int T, int rank, int world, uint64_t seed, int train, int from, int to) {
    DataLoader a, b;
    dataloader_init(&a, spec, B, T, rank, world, seed, train);
    size_t bt = (size_t)B * T;
    int *ia = (int *)fox_malloc(bt * sizeof(int)), *ta = (int *)fox_malloc(bt * sizeof(int));
    int *ib = (int *)fox_malloc(bt * sizeof(int)), *tb = (int *)fox_malloc(bt * sizeof(int));
    for (int i = 0; i < from; i++) dataloader_next(&a, ia, ta);
    size_t bytes = dataloader_state_bytes(&a);
    void *state = fox_malloc(bytes);
    dataloader_save_state(&a, state);
    dataloader_init(&b, spec, B, T, rank, world, seed, train);
    dataloader_next(&b, ib, tb);  // move it off the start: load_state must overwrite the position
    dataloader_load_state(&b, state, bytes);
    int same = 1;
    for (int i = from; i < to; i++) {
        dataloader_next(&a, ia, ta);
        dataloader_next(&b, ib, tb);
        same &= !memcmp(ia, ib, bt * sizeof(int)) && !memcmp(ta, tb, bt * sizeof(int));
    }
    free(ia); free(ta); free(ib); free(tb); free(state);
    dataloader_free(&a);
    dataloader_free(&b);
    return same;
}

static void test_bin_loader(void) {
    printf("== loader: llm.c shards\n");
    run("mkdir -p %s/bin", tmp);
    for (int s = 0; s < 3; s++)
        write_shard(path_in("bin/shard_%d.bin", s), FOX_SHARD_MAGIC, FOX_SHARD_VERSION, SHARD_N[s], SHARD_N[s], SHARD_BASE[s], 2);
    char spec[600];
    snprintf(spec, sizeof spec, "%s/bin/shard_*.bin", tmp);
    {
        DataLoader dl;
        dataloader_init(&dl, spec, 1, TT, 0, 1, 0, 0);
        check(dl.n_shards == 3 && dataloader_num_windows(&dl) == expected_windows(TT) && dataloader_vocab_hint(&dl) == 65536,
              "glob finds 3 shards, %lld windows of T+1=%d tokens, vocab hint 65536", expected_windows(TT), TT + 1);
        dataloader_free(&dl);
    }
    test_sharding(spec);
    check(resume_matches(spec, 5, TT, 1, 3, 77, 1, 17, 60), "train resume (B=5, rank 1 of 3, across an epoch end) yields the same batches");
    check(resume_matches(spec, 4, TT, 0, 1, 5, 1, 82, 90), "train resume exactly at an epoch boundary yields the same batches");
    check(resume_matches(spec, 3, 2 * TT, 0, 2, 0, 0, 10, 40), "validation resume yields the same batches");
    {
        DataLoader dl;
        dataloader_init(&dl, spec, 2, TT, 0, 1, 3, 0);
        int in1[2 * TT], tg1[2 * TT], in2[2 * TT], tg2[2 * TT];
        dataloader_next(&dl, in1, tg1);
        dataloader_next(&dl, in2, tg2);
        dataloader_reset(&dl);
        dataloader_next(&dl, in2, tg2);
        check(!memcmp(in1, in2, sizeof in1) && !memcmp(tg1, tg2, sizeof tg1), "dataloader_reset returns to the first batch");
        dataloader_free(&dl);
    }
    // long validation windows: any T the data allows
    {
        DataLoader dl;
        dataloader_init(&dl, spec, 1, 2500, 0, 1, 0, 0);
        int *in = (int *)fox_malloc(2500 * sizeof(int)), *tg = (int *)fox_malloc(2500 * sizeof(int));
        dataloader_next(&dl, in, tg);
        check(dataloader_num_windows(&dl) == 1 && in[0] == (int)SHARD_BASE[1] && tg[2499] == (int)SHARD_BASE[1] + 2500,
              "validation window of T=2500 (the longest this data allows)");
        free(in); free(tg);
        dataloader_free(&dl);
    }
    // uint32 shards
    write_shard(path_in("bin/u32.bin"), FOX_SHARD_MAGIC_U32, FOX_SHARD_VERSION_U32, 300, 300, 100000, 4);
    {
        DataLoader dl;
        dataloader_init(&dl, path_in("bin/u32.bin"), 2, 8, 0, 1, 0, 0);
        int in[16], tg[16];
        dataloader_next(&dl, in, tg);
        check(in[0] == 100000 && tg[7] == 100008 && in[8] == 100008 && dataloader_vocab_hint(&dl) == 0,
              "uint32 shard (magic %d, version %d): ids above 65535 read back", FOX_SHARD_MAGIC_U32, FOX_SHARD_VERSION_U32);
        dataloader_free(&dl);
    }
    // bad inputs
    write_shard(path_in("bin/bad_magic.bin"), 12345, 1, 100, 100, 0, 2);
    write_shard(path_in("bin/bad_version.bin"), FOX_SHARD_MAGIC, 3, 100, 100, 0, 2);
    write_shard(path_in("bin/size_mismatch.bin"), FOX_SHARD_MAGIC, FOX_SHARD_VERSION, 100, 150, 0, 2);
    write_shard(path_in("bin/too_long.bin"), FOX_SHARD_MAGIC, FOX_SHARD_VERSION, 100, 90, 0, 2);
    write_bytes(path_in("bin/truncated.bin"), "\x30\xd4\x34\x01", 4);
    char cmd[1200];
#define BAD(what, args) (snprintf(cmd, sizeof cmd, "./test_data --open %s", args), expect_error(what, cmd))
    BAD("bad magic", path_in("bin/bad_magic.bin 4 8 0 1"));
    BAD("bad version", path_in("bin/bad_version.bin 4 8 0 1"));
    BAD("size mismatch (header says more tokens)", path_in("bin/size_mismatch.bin 4 8 0 1"));
    BAD("size mismatch (file longer than header)", path_in("bin/too_long.bin 4 8 0 1"));
    BAD("truncated header", path_in("bin/truncated.bin 4 8 0 1"));
    BAD("missing file", path_in("bin/nope.bin 4 8 0 1"));
    BAD("glob matching nothing", path_in("bin/zz_*.bin 4 8 0 1"));
    BAD("T longer than the data", path_in("bin/shard_0.bin 1 1000 0 1"));
    BAD("fewer windows than ranks", path_in("bin/shard_0.bin 1 500 0 3"));
    BAD("rank outside world", path_in("bin/shard_0.bin 1 8 2 2"));
    snprintf(cmd, sizeof cmd, "./test_data --state-mismatch '%s'", spec);
    expect_error("restoring a state saved with another seed", cmd);
}

// ---------------------------------------------------------------- zarr

static uint16_t *read_u16(const char *path, size_t *n) {
    size_t len;
    char *b = fox_read_file(path, &len);
    if (!b) return NULL;
    *n = len / 2;
    return (uint16_t *)b;
}

static char *capture(const char *fmt, ...);  // (below: a command's stdout)

static void test_zarr(void) {
    printf("== zarr v2 reader (vs numpy/zarr)\n");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", path_in("zarr"));
    int rc = run("%s test/data/make_zarr.py %s > /dev/null", python, dir);
    check(rc == 0, "fixtures built with %s (python3-zarr)", python);
    if (rc != 0) return;
    static const char *const good[] = {"zstd_shuffle", "lz4_bitshuffle", "blosclz_noshuffle", "raw", "slash_sep"};
    for (size_t g = 0; g < sizeof good / sizeof good[0]; g++) {
        FoxZarr z;
        fox_zarr_open(&z, path_in("zarr/%s.zarr", good[g]));
        size_t n;
        uint16_t *ref = read_u16(path_in("zarr/%s.u16", good[g]), &n);
        int64_t R = z.shape[0], C = z.shape[1];
        uint32_t *all = (uint32_t *)fox_malloc((size_t)(R * C) * sizeof(uint32_t));
        fox_zarr_read(&z, 0, R, 0, C, all);
        int ok = ref && n == (size_t)(R * C);
        for (size_t i = 0; ok && i < n; i++) ok &= all[i] == ref[i];
        long long touched = ((R + z.chunks[0] - 1) / z.chunks[0]) * ((C + z.chunks[1] - 1) / z.chunks[1]);
        int once = z.chunks_decoded == touched;
        fox_zarr_read(&z, 0, R, 0, C, all);  // second read: served from the cache
        once &= z.chunks_decoded == touched;
        int rect_ok = 1;
        uint64_t key = fox_rng_key(g, 5);
        for (int k = 0; k < 40 && ok; k++) {
            int64_t r0 = (int64_t)fox_rng_below(key, 4 * k, (uint64_t)R), c0 = (int64_t)fox_rng_below(key, 4 * k + 1, (uint64_t)C);
            int64_t nr = 1 + (int64_t)fox_rng_below(key, 4 * k + 2, (uint64_t)(R - r0));
            int64_t nc = 1 + (int64_t)fox_rng_below(key, 4 * k + 3, (uint64_t)(C - c0));
            fox_zarr_read(&z, r0, nr, c0, nc, all);
            for (int64_t r = 0; r < nr; r++)
                for (int64_t c = 0; c < nc; c++) rect_ok &= all[r * nc + c] == ref[(r0 + r) * C + c0 + c];
        }
        char comp[128];
        check(ok && rect_ok, "%s (%lld x %lld, chunks %lld x %lld, %s): whole array and 40 random rectangles equal numpy", good[g],
              (long long)R, (long long)C, (long long)z.chunks[0], (long long)z.chunks[1], fox_zarr_compression_name(&z, comp, sizeof comp));
        check(once, "%s: each of the %lld chunks decompressed once (a repeated read hits the cache)", good[g], touched);
        free(all);
        free(ref);
        fox_zarr_close(&z);
    }
    // the loader on a zarr array: rectangles of B docs x T, input = EOT + target[:-1]
    char spec[1024];
    snprintf(spec, sizeof spec, "%s", path_in("zarr/loader.zarr"));
    size_t n;
    uint16_t *ref = read_u16(path_in("zarr/loader.u16"), &n);
    const int B = 4, T = 32, L = 96, D = 24, P = L / T, UNITS = (D / B) * P;
    int in[4 * 32], tg[4 * 32];
    {
        DataLoader dl;
        dataloader_init(&dl, spec, B, T, 0, 1, 0, 0);
        int ok = dataloader_num_windows(&dl) == UNITS * B && dataloader_vocab_hint(&dl) == 65536;
        for (int u = 0; u < UNITS; u++) {
            dataloader_next(&dl, in, tg);
            int d0 = (u / P) * B, p0 = (u % P) * T;
            for (int b = 0; b < B; b++)
                for (int t = 0; t < T; t++) {
                    int want = ref[(size_t)(d0 + b) * L + (size_t)(p0 + t)];
                    ok &= tg[b * T + t] == want;
                    ok &= in[b * T + t] == (t == 0 ? FOX_EOT : (int)ref[(size_t)(d0 + b) * L + (size_t)(p0 + t - 1)]);
                }
        }
        check(ok, "zarr validation: %d rectangles of %d docs x %d in order; target = sample, input = [EOT, sample[:-1]]", UNITS, B, T);
        dataloader_free(&dl);
    }
    for (int world = 1; world <= 3; world++) {
        int seen[64] = {0}, ok = 1;
        for (int r = 0; r < world; r++) {
            DataLoader dl;
            dataloader_init(&dl, spec, B, T, r, world, 42, 1);
            long long per = dataloader_num_windows(&dl) / B;
            ok &= per == UNITS / world;
            for (long long i = 0; i < per; i++) {
                dataloader_next(&dl, in, tg);
                int found = -1;
                for (int u = 0; u < UNITS && found < 0; u++) {
                    int d0 = (u / P) * B, p0 = (u % P) * T, match = 1;
                    for (int b = 0; b < B && match; b++)
                        for (int t = 0; t < T && match; t++) match &= tg[b * T + t] == ref[(size_t)(d0 + b) * L + (size_t)(p0 + t)];
                    if (match) found = u;
                }
                ok &= found >= 0 && in[0] == FOX_EOT;
                if (found >= 0) seen[found]++;
            }
            dataloader_free(&dl);
        }
        int covered = 0, dup = 0;
        for (int u = 0; u < UNITS; u++) { covered += seen[u] > 0; dup |= seen[u] > 1; }
        check(ok && !dup && covered == (UNITS / world) * world, "zarr train, world %d: rectangles disjoint across ranks, %d of %d covered",
              world, covered, UNITS);
    }
    free(ref);
    check(resume_matches(spec, B, T, 1, 2, 3, 1, 2, 12), "zarr train resume (rank 1 of 2, across epochs) yields the same batches");
    char cmd[1200];
    BAD("zarr: T longer than the documents", path_in("zarr/loader.zarr 4 97 0 1"));
    BAD("zarr: B more than the documents", path_in("zarr/loader.zarr 25 8 0 1"));
    BAD("non-zarr directory", path_in("zarr/not_zarr 4 8 0 1"));
    BAD("zarr: unsupported dtype <f4", path_in("zarr/bad_dtype.zarr 2 4 0 1"));
    BAD("zarr: unsupported compressor zlib", path_in("zarr/bad_compressor.zarr 2 4 0 1"));
    BAD("zarr: 3-D array", path_in("zarr/bad_ndim.zarr 2 4 0 1"));
    snprintf(cmd, sizeof cmd, "./fox_data dump %s --docs 0:2", path_in("zarr/bad_truncated.zarr"));
    expect_error("zarr: truncated blosc chunk", cmd);
    // Holes are errors naming the chunk, at open: a missing chunk file, a .zarray that claims more documents
    // than the chunks hold, a directory in place of a chunk; at read: a chunk deleted after the open.
    BAD("zarr: a missing chunk", path_in("zarr/missing_chunk.zarr 2 4 0 1"));
    check(grep_file(path_in("stderr.txt"), "missing_chunk.zarr/1.1: chunk missing"), "  ... the error names chunk 1.1");
    check(!grep_file(path_in("stderr.txt"), "training array"), "  ... without calling it a training array (validation arrays are checked too)");
    BAD("zarr: a missing chunk (separator /)", path_in("zarr/missing_chunk_slash.zarr 2 4 0 1"));
    check(grep_file(path_in("stderr.txt"), "missing_chunk_slash.zarr/1/1: chunk missing"), "  ... the error names chunk 1/1");
    BAD("zarr: .zarray claims 20 documents, chunks hold 12", path_in("zarr/claims_more.zarr 2 4 0 1"));
    check(grep_file(path_in("stderr.txt"), "claims_more.zarr/3.0: chunk missing"), "  ... the error names chunk 3.0");
    BAD("zarr: a directory in place of a chunk", path_in("zarr/dir_chunk.zarr 2 4 0 1"));
    check(grep_file(path_in("stderr.txt"), "dir_chunk.zarr/0.1: a chunk that is not a regular file"), "  ... the error names it");
    snprintf(cmd, sizeof cmd, "./test_data --delete-then-read %s %s", path_in("zarr/delete_later.zarr"),
             path_in("zarr/delete_later.zarr/2.2"));
    expect_error("zarr: a chunk deleted after the open", cmd);
    check(grep_file(path_in("stderr.txt"), "delete_later.zarr/2.2: cannot open chunk"), "  ... the read names it");
    // The build for machines without libblosc (fox_data_noblosc): uncompressed arrays as before, compressed
    // ones refused with one line.
    char *with = capture("./fox_data dump %s --docs 0:2", path_in("zarr/raw.zarr"));
    char *without = capture("./fox_data_noblosc dump %s --docs 0:2", path_in("zarr/raw.zarr"));
    check(with && without && !strcmp(with, without), "built without libblosc: an uncompressed array reads the same");
    free(with);
    free(without);
    snprintf(cmd, sizeof cmd, "./fox_data_noblosc dump %s --docs 0:2", path_in("zarr/zstd_shuffle.zarr"));
    expect_error("built without libblosc: a blosc array", cmd);
    snprintf(cmd, sizeof cmd, "./fox_data dump %s --docs 20:30 --pos 0:8", path_in("zarr/loader.zarr"));
    expect_error("zarr: window beyond the array", cmd);
    snprintf(cmd, sizeof cmd, "./fox_data dump %s --docs 0:1 --pos 90:100", path_in("zarr/loader.zarr"));
    expect_error("zarr: positions beyond the array", cmd);
}

// ---------------------------------------------------------------- fox_data

static char *capture(const char *fmt, ...) {
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    snprintf(cmd + k, sizeof cmd - (size_t)k, " > %s/out.txt 2>/dev/null", tmp);
    if (system(cmd) != 0) return NULL;
    size_t len;
    return fox_read_file(path_in("out.txt"), &len);
}

static void test_fox_data(void) {
    printf("== fox_data tool\n");
    const char *text = "Hello, world! It's 2024.\n\tTabs and  spaces; caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80\r\n";
    write_bytes(path_in("doc1.txt"), text, strlen(text));
    write_bytes(path_in("doc2.txt"), "Second document.", 16);
    char *out = capture("./fox_data encode --out %s %s %s", path_in("enc.bin"), path_in("doc1.txt"), path_in("doc2.txt"));
    check(out != NULL, "encode two text files into one shard");
    free(out);
    char *dec = capture("./fox_data decode %s", path_in("enc.bin"));
    char want[512];
    snprintf(want, sizeof want, "<|endoftext|>%s<|endoftext|>Second document.", text);
    check(dec && !strcmp(dec, want), "decode gives back EOT + doc1 + EOT + doc2 exactly");
    free(dec);
    Tokenizer tok;
    if (!tokenizer_load(&tok, FOX_TOKENIZER_DEFAULT_PATH, NULL)) return;
    size_t n;
    int *ids = tokenizer_encode(&tok, text, strlen(text), &n, 0);
    char line[4096] = "";
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += (size_t)snprintf(line + k, sizeof line - k, i ? " %d" : "%d", ids[i]);
    snprintf(line + k, sizeof line - k, "\n");
    char *tk = capture("./fox_data tokenize %s", path_in("doc1.txt"));
    check(tk && !strcmp(tk, line), "tokenize prints the ids on one line, no EOT");
    free(tk);
    char *dump = capture("./fox_data dump %s --pos 1:%zu", path_in("enc.bin"), n + 1);
    check(dump && !strcmp(dump, line), "dump --pos 1:%zu of the shard prints the same ids", n + 1);
    free(dump);
    free(ids);
    // JSONL with escapes, sharded output
    const char *jsonl = "{\"id\": 1, \"text\": \"caf\\u00e9 \\ud83d\\ude00 \\\"q\\\"\\n\\tx\\/y\", \"meta\": {\"a\": [1, 2]}}\n"
                        "{\"text\": \"two\"}\n\n{\"meta\": null, \"text\": \"three \\\\ end\"}\n";
    write_bytes(path_in("in.jsonl"), jsonl, strlen(jsonl));
    out = capture("./fox_data encode --out %s --shard-tokens 5 %s", path_in("js.bin"), path_in("in.jsonl"));
    free(out);
    char joined[512] = "";
    int pieces = 0;
    for (int i = 0; i < 4; i++) {
        char *d = capture("./fox_data decode %s", path_in("js_%06d.bin", i));
        if (d) { strncat(joined, d, sizeof joined - strlen(joined) - 1); pieces++; }
        free(d);
    }
    char *info = capture("./fox_data info '%s'", path_in("js_*.bin"));
    const char *jwant = "<|endoftext|>caf\xc3\xa9 \xf0\x9f\x98\x80 \"q\"\n\tx/y<|endoftext|>two<|endoftext|>three \\ end";
    check(pieces == 4 && !strcmp(joined, jwant), "JSONL \"text\" fields (\\u escapes, surrogate pairs) encoded across four 5-token shards");
    check(info && strstr(info, "js_000000.bin: llm.c shard, 5 tokens, dtype uint16") && strstr(info, "total: 4 shards, 20 tokens"),
          "info lists the numbered shards of 5 tokens");
    free(info);
    char *zi = capture("./fox_data info %s", path_in("zarr/zstd_shuffle.zarr"));
    check(zi && strstr(zi, "shape 37 x 300") && strstr(zi, "dtype <u2") && strstr(zi, "cname=zstd"), "info of a zarr array: shape, dtype, compression");
    free(zi);
    char *zd = capture("./fox_data dump %s --docs 3:5 --pos 10:14", path_in("zarr/raw.zarr"));
    size_t rn;
    uint16_t *ref = read_u16(path_in("zarr/raw.u16"), &rn);
    char zwant[256] = "";
    if (ref) snprintf(zwant, sizeof zwant, "%d %d %d %d\n%d %d %d %d\n", ref[310], ref[311], ref[312], ref[313], ref[410], ref[411], ref[412], ref[413]);
    check(zd && ref && !strcmp(zd, zwant), "dump of a zarr rectangle: one line per document");
    free(zd); free(ref);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "./fox_data decode %s --pos 5:999", path_in("enc.bin"));
    expect_error("fox_data decode: range beyond the shard", cmd);
    snprintf(cmd, sizeof cmd, "./fox_data dump %s --pos 3:1", path_in("enc.bin"));
    expect_error("fox_data dump: empty range", cmd);
    snprintf(cmd, sizeof cmd, "./fox_data encode --out %s %s", path_in("x.bin"), path_in("nope.jsonl"));
    expect_error("fox_data encode: missing input", cmd);
    write_bytes(path_in("bad.jsonl"), "{\"text\": \"ok\"}\n{\"text\": 5}\n", 27);
    snprintf(cmd, sizeof cmd, "./fox_data encode --out %s %s", path_in("x.bin"), path_in("bad.jsonl"));
    expect_error("fox_data encode: JSONL line without a text string", cmd);
    tokenizer_free(&tok);
}

// ---------------------------------------------------------------- MQAR (fox_data mqar, fox/mqar.h)

// All tokens of a shard (malloc'd), its count and item size.
static int *shard_all(const char *path, long long *ntok, int *itemsize) {
    FoxShard s;
    fox_shard_open(&s, path);
    int *ids = (int *)fox_malloc((size_t)s.ntok * sizeof(int));
    fox_shard_tokens(&s, 0, (int)s.ntok, ids);
    *ntok = s.ntok;
    *itemsize = s.itemsize;
    munmap((void *)s.map, s.map_bytes);
    free(s.path);
    return ids;
}

// The pair index of key k in example ex, or -1.
static int mqar_pair_of(const FoxMqar *m, const int *ex, int k) {
    for (int i = 0; i < m->num_kv; i++)
        if (ex[1 + 2 * i] == k) return i;
    return -1;
}

// Writes why an example is not well formed; returns 0.
static int mqar_fail(char *why, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, cap, fmt, ap);
    va_end(ap);
    return 0;
}

// Whether ex (seq_len tokens) follows fox/mqar.h's layout, checked from its description, not its code:
// the start token; N distinct keys and N values in their ranges; in the query section every key once, at
// an even offset, followed by its own value; every other token 0. Says why not in why.
static int mqar_layout_ok(const FoxMqar *m, const int *ex, char *why, size_t cap) {
    const int N = m->num_kv, T = m->seq_len, Q = 2 * N + 1;
    if (ex[0] != 0) return mqar_fail(why, cap, "start token %d", ex[0]);
    for (int i = 0; i < N; i++) {
        int k = ex[1 + 2 * i], v = ex[2 + 2 * i];
        if (k < m->key_lo || k >= m->key_hi || mqar_pair_of(m, ex, k) != i) return mqar_fail(why, cap, "key %d of pair %d", k, i);
        if (v < m->value_lo || v >= m->value_hi) return mqar_fail(why, cap, "value %d of pair %d", v, i);
    }
    char queried[64] = {0};  // the tests' N are below 64
    int queries = 0;
    for (int t = Q; t < T; t++) {
        if (ex[t] == 0) continue;
        int i = mqar_pair_of(m, ex, ex[t]);
        if (i < 0) return mqar_fail(why, cap, "token %d at %d is neither 0 nor a query", ex[t], t);
        if ((t - Q) % 2 || t + 1 >= T || ex[t + 1] != ex[2 + 2 * i] || queried[i]++)
            return mqar_fail(why, cap, "query of key %d at %d (odd offset, wrong value or repeated)", ex[t], t);
        queries++;
        t++;  // its value
    }
    if (queries != N) return mqar_fail(why, cap, "%d of %d keys queried", queries, N);
    return 1;
}

// Whether fox_mqar_is_answer marks exactly N positions of ex, each a key followed by its value.
static int mqar_answers_ok(const FoxMqar *m, const int *ex) {
    int n = 0, ok = 1;
    for (int t = 0; t < m->seq_len; t++) {
        if (!fox_mqar_is_answer(m, ex, t)) continue;
        int i = mqar_pair_of(m, ex, ex[t]);
        ok &= i >= 0 && ex[t + 1] == ex[2 + 2 * i];
        n++;
    }
    return ok && n == m->num_kv;
}

// Whether two files hold the same bytes.
static int same_file(const char *a, const char *b) {
    size_t na = 0, nb = 0;
    char *x = fox_read_file(a, &na), *y = fox_read_file(b, &nb);
    int same = x && y && na == nb && !memcmp(x, y, na);
    free(x);
    free(y);
    return same;
}

// The checks of one written split: shard size and final token, every example's layout and answers, the
// file equal to fox_mqar_example; returns the tokens.
static int *check_mqar_split(const FoxMqar *m, const char *path, int split, long long examples, int want_itemsize) {
    long long ntok;
    int itemsize;
    int *all = shard_all(path, &ntok, &itemsize);
    const int T = m->seq_len;
    check(ntok == examples * T + 1 && all[ntok - 1] == 0 && itemsize == want_itemsize,
          "%s: %lld tokens = %lld examples x %d + a final 0, uint%d", path, ntok, examples, T, 8 * itemsize);
    int layout = 1, answers = 1, same = 1;
    char why[256] = "";
    int *ex = (int *)fox_malloc((size_t)T * sizeof(int));
    uint64_t key = fox_mqar_split_key(m->seed, split);
    for (long long i = 0; i < examples; i++) {
        const int *got = all + i * T;
        if (layout && !mqar_layout_ok(m, got, why, sizeof why)) layout = 0;
        answers &= mqar_answers_ok(m, got);
        fox_mqar_example(m, key, i, ex);
        same &= !memcmp(ex, got, (size_t)T * sizeof(int));
    }
    check(layout, "%s: every example: start token 0, %d distinct keys and values in range, each key queried once with its "
          "value at an even offset of the query section, all else 0%s%s", path, m->num_kv, layout ? "" : ": ", why);
    check(answers, "%s: fox_mqar_is_answer marks %d positions per example, each a key followed by its value", path, m->num_kv);
    check(same, "%s: example i is fox_mqar_example(split %d, i)", path, split);
    free(ex);
    return all;
}

#define MQAR_ARGS "--vocab 64 --num-kv 8 --seq-len 48 --train-examples 300 --test-examples 50"
enum { MQAR_T = 48, MQAR_TRAIN = 300, MQAR_TEST = 50 };

// The draws spread over the ranges: every key, value and slot occurs, and the queries are not in the
// pairs' order.
static void mqar_spread(const FoxMqar *m, const int *train) {
    const int N = m->num_kv, T = m->seq_len, Q = 2 * N + 1, slots = (T - Q) / 2;
    int key_seen[64] = {0}, value_seen[64] = {0}, slot_seen[64] = {0}, same_order = 0;
    for (int e = 0; e < MQAR_TRAIN; e++) {
        const int *ex = train + e * T;
        int in_order = 1, r = 0;
        for (int i = 0; i < N; i++) key_seen[ex[1 + 2 * i]] = value_seen[ex[2 + 2 * i]] = 1;
        for (int s = 0; s < slots; s++) {
            if (!ex[Q + 2 * s]) continue;
            slot_seen[s] = 1;
            in_order &= ex[Q + 2 * s] == ex[1 + 2 * r++];
        }
        same_order += in_order;
    }
    int keys = 0, values = 0, used = 0;
    for (int k = 0; k < 64; k++) { keys += key_seen[k]; values += value_seen[k]; }
    for (int s = 0; s < slots; s++) used += slot_seen[s];
    check(keys == 31 && values == 32 && used == slots && same_order < 3,
          "%d examples use all 31 keys, 32 values and %d slots; queries in the pairs' order in %d", MQAR_TRAIN, slots, same_order);
}

// The loaders with --seq-len T: validation window k is example k (its target shifted by one into the next
// example's 0); training windows are whole examples, shuffled, each once an epoch.
static void mqar_windows(const int *train, const int *test) {
    const int T = MQAR_T;
    DataLoader dl;
    dataloader_init(&dl, path_in("mqar/test.bin"), 1, T, 0, 1, 0, 0);
    int in[5 * MQAR_T], tg[5 * MQAR_T], ok = dataloader_num_windows(&dl) == MQAR_TEST;
    for (int k = 0; k < MQAR_TEST; k++) {
        dataloader_next(&dl, in, tg);
        ok &= !memcmp(in, test + k * T, T * sizeof(int)) && !memcmp(tg, test + k * T + 1, (T - 1) * sizeof(int)) && tg[T - 1] == 0;
    }
    check(ok, "test.bin with T=%d: %d windows; window k's input is example k, its target example k[1:] + 0", T, MQAR_TEST);
    dataloader_free(&dl);
    dataloader_init(&dl, path_in("mqar/train.bin"), 5, T, 0, 1, 3, 1);
    int seen[MQAR_TRAIN] = {0}, descents = 0, prev = -1;
    ok = dataloader_num_windows(&dl) == MQAR_TRAIN;
    for (int b = 0; b < MQAR_TRAIN / 5; b++) {
        dataloader_next(&dl, in, tg);
        for (int w = 0; w < 5; w++) {
            int found = -1;
            for (int e = 0; e < MQAR_TRAIN && found < 0; e++)
                if (!memcmp(in + w * T, train + e * T, T * sizeof(int))) found = e;
            ok &= found >= 0 && tg[w * T + T - 1] == 0;
            if (found >= 0) seen[found]++;
            descents += found < prev;
            prev = found;
        }
    }
    for (int e = 0; e < MQAR_TRAIN; e++) ok &= seen[e] == 1;
    check(ok && descents > MQAR_TRAIN / 6, "train.bin, shuffled: each of the %d windows of an epoch is one whole example, once",
          MQAR_TRAIN);
    dataloader_free(&dl);
}

// The same seed writes the same files, another seed others; the uint32 variant; the defaults.
static void mqar_seeds_and_sizes(void) {
    run("./fox_data mqar --out %s " MQAR_ARGS " --seed 7 > /dev/null", path_in("mqar_same"));
    run("./fox_data mqar --out %s " MQAR_ARGS " --seed 8 > /dev/null", path_in("mqar_other"));
    check(same_file(path_in("mqar/train.bin"), path_in("mqar_same/train.bin")) &&
              same_file(path_in("mqar/test.bin"), path_in("mqar_same/test.bin")) &&
              same_file(path_in("mqar/mqar.json"), path_in("mqar_same/mqar.json")),
          "the same seed writes identical train.bin, test.bin and mqar.json");
    check(!same_file(path_in("mqar/train.bin"), path_in("mqar_other/train.bin")) &&
              !same_file(path_in("mqar/test.bin"), path_in("mqar_other/test.bin")),
          "another seed writes other examples");
    int rc = run("./fox_data mqar --out %s --vocab 200000 --num-kv 4 --seq-len 20 --train-examples 10 --test-examples 5 > /dev/null",
                 path_in("mqar_u32"));
    check(rc == 0, "fox_data mqar --vocab 200000 (values [100000, 200000): the uint32 shard variant)");
    if (rc == 0) {
        FoxMqar big;
        fox_mqar_read(path_in("mqar_u32"), &big);
        free(check_mqar_split(&big, path_in("mqar_u32/test.bin"), FOX_MQAR_TEST, 5, 4));
    }
    rc = run("./fox_data mqar --out %s --train-examples 20 > /dev/null", path_in("mqar_default"));
    check(rc == 0, "fox_data mqar with the defaults (--train-examples 20)");
    if (rc == 0) {
        FoxMqar d;
        fox_mqar_read(path_in("mqar_default"), &d);
        check(d.vocab == 8192 && d.num_kv == 16 && d.seq_len == 256 && d.test_examples == 1000 && d.seed == 1337 &&
                  d.key_hi == 4096 && d.value_lo == 4096,
              "defaults: --vocab 8192 --num-kv 16 --seq-len 256 --test-examples 1000 --seed 1337");
    }
}

// `command --out DIR FLAGS` for each {label, FLAGS} of bad: a one-line error and a non-zero exit.
static void expect_bad_flags(const char *command, const char *dir, const char *const (*bad)[2], size_t n) {
    char cmd[1200], what[128];
    for (size_t i = 0; i < n; i++) {
        snprintf(cmd, sizeof cmd, "%s --out %s %s", command, dir, bad[i][1]);
        snprintf(what, sizeof what, "%s: %s", command + 2, bad[i][0]);  // without "./"
        expect_error(what, cmd);
    }
}

// `./fox_data SUB --out DIR ARGS --seed 9` over the set in DIR (written with another seed, like the one in SAME):
// refused in one line naming DIR/JSON, and DIR's train.bin still SAME's.
static void expect_set_kept(const char *sub, const char *dir, const char *args, const char *json, const char *same) {
    char cmd[1200], what[128], named[128];
    snprintf(cmd, sizeof cmd, "./fox_data %s --out %s %s --seed 9", sub, path_in("%s", dir), args);
    snprintf(what, sizeof what, "fox_data %s: DIR already holds a data set", sub);
    expect_error(what, cmd);
    snprintf(named, sizeof named, "%s already exists", json);
    check(grep_file(path_in("stderr.txt"), named) && same_file(path_in("%s/train.bin", dir), path_in("%s/train.bin", same)),
          "  ... its %s named, its files left as they were", json);
}

// fox_data mqar's bad input, each one line; a DIR that holds a set's file is left as it was.
static void mqar_bad_flags(void) {
    static const char *const bad[][2] = {
        {"--seq-len under 1 + 4 x --num-kv", "--num-kv 8 --seq-len 32"},
        {"more pairs than keys", "--vocab 16 --num-kv 8 --seq-len 64"},
        {"a vocabulary of 2", "--vocab 2 --num-kv 1 --seq-len 8"},
        {"no test examples", "--test-examples 0"},
        {"more train tokens than a shard holds", "--train-examples 10000000"},
        {"a flag without its value", "--seed"},
    };
    expect_bad_flags("./fox_data mqar", path_in("mqar_bad"), bad, sizeof bad / sizeof bad[0]);
    char cmd[1200];
    expect_error("fox_data mqar: no --out", "./fox_data mqar --num-kv 4");
    expect_set_kept("mqar", "mqar", MQAR_ARGS, "mqar.json", "mqar_same");
    run("mkdir -p %s", path_in("mqar_corpus"));
    write_bytes(path_in("mqar_corpus/train.bin"), "corpus", 6);
    snprintf(cmd, sizeof cmd, "./fox_data mqar --out %s", path_in("mqar_corpus"));
    expect_error("fox_data mqar: DIR holds another train.bin", cmd);
    check(grep_file(path_in("mqar_corpus/train.bin"), "corpus") && run("test -e %s", path_in("mqar_corpus/test.bin")) != 0,
          "  ... which is left as it was, and nothing is written");
}

// fox_mqar_read of a missing or malformed mqar.json: one line naming the key.
static void mqar_bad_json(void) {
    char cmd[1200], what[128];
    snprintf(cmd, sizeof cmd, "./test_data --mqar-read %s", path_in("mqar_bad"));
    expect_error("fox_mqar_read: no mqar.json", cmd);
    static const char *const bad[][3] = {
        {"no num_kv", "num_kv", "{\"task\": \"mqar\", \"vocab\": 64, \"seq_len\": 48, \"key_range\": [1, 32], "
                                "\"value_range\": [32, 64], \"train_examples\": 3, \"test_examples\": 5, \"seed\": 7}"},
        {"a key_range that vocab does not make", "key_range", "{\"task\": \"mqar\", \"vocab\": 64, \"num_kv\": 8, \"seq_len\": 48, "
                "\"key_range\": [0, 32], \"value_range\": [32, 64], \"train_examples\": 3, \"test_examples\": 5, \"seed\": 7}"},
        {"seq_len 2.5", "seq_len", "{\"task\": \"mqar\", \"vocab\": 64, \"num_kv\": 8, \"seq_len\": 2.5, \"key_range\": [1, 32], "
                                   "\"value_range\": [32, 64], \"train_examples\": 3, \"test_examples\": 5, \"seed\": 7}"},
        {"seq_len under 1 + 4 num_kv", "seq_len", "{\"task\": \"mqar\", \"vocab\": 64, \"num_kv\": 8, \"seq_len\": 32, "
                "\"key_range\": [1, 32], \"value_range\": [32, 64], \"train_examples\": 3, \"test_examples\": 5, \"seed\": 7}"},
        {"another task", "task", "{\"task\": \"niah\", \"vocab\": 64}"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        run("mkdir -p %s", path_in("mqar_json%zu", i));
        write_bytes(path_in("mqar_json%zu/mqar.json", i), bad[i][2], strlen(bad[i][2]));
        snprintf(cmd, sizeof cmd, "./test_data --mqar-read %s", path_in("mqar_json%zu", i));
        snprintf(what, sizeof what, "fox_mqar_read: mqar.json with %s", bad[i][0]);
        expect_error(what, cmd);
        check(grep_file(path_in("stderr.txt"), bad[i][1]), "  ... the error names %s", bad[i][1]);
    }
}

static void test_mqar(void) {
    printf("== MQAR data (fox_data mqar, fox/mqar.h)\n");
    int rc = run("./fox_data mqar --out %s " MQAR_ARGS " --seed 7 > /dev/null", path_in("mqar"));
    check(rc == 0, "fox_data mqar --out DIR " MQAR_ARGS " --seed 7");
    if (rc != 0) return;
    FoxMqar m;
    fox_mqar_read(path_in("mqar"), &m);
    check(m.vocab == 64 && m.num_kv == 8 && m.seq_len == MQAR_T && m.key_lo == 1 && m.key_hi == 32 && m.value_lo == 32 &&
              m.value_hi == 64 && m.train_examples == MQAR_TRAIN && m.test_examples == MQAR_TEST && m.seed == 7 &&
              grep_file(path_in("mqar/mqar.json"), "\"task\": \"mqar\"") && grep_file(path_in("mqar/mqar.json"), "\"key_range\": [1, 32]"),
          "mqar.json: task, vocab, num_kv, seq_len, key_range [1, 32), value_range [32, 64), examples and seed");
    int *train = check_mqar_split(&m, path_in("mqar/train.bin"), FOX_MQAR_TRAIN, MQAR_TRAIN, 2);
    int *test = check_mqar_split(&m, path_in("mqar/test.bin"), FOX_MQAR_TEST, MQAR_TEST, 2);
    mqar_spread(&m, train);
    int shared = 0;
    for (int i = 0; i < MQAR_TEST; i++)
        for (int j = 0; j < MQAR_TRAIN; j++) shared += !memcmp(test + i * MQAR_T, train + j * MQAR_T, MQAR_T * sizeof(int));
    check(shared == 0, "no test example is a train example (the splits are seeded apart)");
    mqar_windows(train, test);
    free(train);
    free(test);
    mqar_seeds_and_sizes();
    mqar_bad_flags();
    mqar_bad_json();
}

// ---------------------------------------------------------------- passkey (fox_data passkey, fox/passkey.h)

#define PASSKEY_T 160
#define PASSKEY_ARGS "--seq-len 160 --train-examples 60 --val-examples 12"

// Whether the text of one example follows fox/passkey.h's description, checked from the text, not the builder:
// <|endoftext|>, the task, filler only, the key's line with K twice, filler only, the question, " K."; *depth:
// the key line's share of the filler before it.
static int passkey_text_ok(const char *text, int *key, double *depth, char *why, size_t cap) {
    const char *head = "<|endoftext|>" FOX_PASSKEY_TASK, *filler = FOX_PASSKEY_FILLER;
    size_t nh = strlen(head), nf = strlen(filler);
    if (strncmp(text, head, nh)) return snprintf(why, cap, "does not open with <|endoftext|> and the task"), 0;
    const char *opening = "\nThe pass key is ", *line = strstr(text + nh, opening);
    long k1 = line ? strtol(line + strlen(opening), NULL, 10) : 0;
    char want[128];
    snprintf(want, sizeof want, "\nThe pass key is %ld. Remember it. %ld is the pass key.\n", k1, k1);
    if (!line || k1 < 10000 || k1 > 99999 || strncmp(line, want, strlen(want)))
        return snprintf(why, cap, "no key line with one 5-digit key twice"), 0;
    const char *after = line + strlen(want), *q = strstr(after, FOX_PASSKEY_QUESTION);
    if (!q) return snprintf(why, cap, "no question"), 0;
    size_t before = (size_t)(line - (text + nh)), rest = (size_t)(q - after);
    for (size_t i = 0; i < before; i++)  // the filler, from its start
        if (text[nh + i] != filler[i % nf]) return snprintf(why, cap, "not filler before the key line"), 0;
    for (size_t i = 0; i < rest; i++)  // the filler, continued where it stopped
        if (after[i] != filler[(before + i) % nf]) return snprintf(why, cap, "not the filler's continuation after it"), 0;
    char tail[64];
    snprintf(tail, sizeof tail, FOX_PASSKEY_QUESTION " %ld.", k1);
    if (strcmp(q, tail)) return snprintf(why, cap, "does not end with the question and \" %ld.\"", k1), 0;
    *key = (int)k1;
    *depth = (double)before / (double)(before + rest);
    return 1;
}

// One written split: shard size and final token, every example's text, equal to fox_passkey_example; returns
// the tokens.
static int *check_passkey_split(const Tokenizer *tok, const char *path, int split, long long examples, uint64_t seed,
                                int *keys) {
    long long ntok;
    int itemsize;
    int *all = shard_all(path, &ntok, &itemsize);
    const int T = PASSKEY_T;
    check(ntok == examples * T + 1 && all[ntok - 1] == FOX_EOT && itemsize == 2,
          "%s: %lld tokens = %lld examples x %d + a final <|endoftext|>, uint16", path, ntok, examples, T);
    FoxPasskeyText text = fox_passkey_text(tok);
    int *ex = (int *)fox_malloc((size_t)T * sizeof(int)), layout = 1, same = 1;
    double lo = 1.0, hi = 0.0;
    char why[256] = "";
    uint64_t key = fox_passkey_split_key(seed, split);
    for (long long i = 0; i < examples; i++) {
        size_t len;
        char *t = tokenizer_decode(tok, all + i * T, (size_t)T, &len);
        double depth = 0.0;
        if (layout && !passkey_text_ok(t, &keys[i], &depth, why, sizeof why)) layout = 0;
        lo = depth < lo ? depth : lo, hi = depth > hi ? depth : hi;
        free(t);
        fox_passkey_example(tok, &text, key, i, T, ex);
        same &= !memcmp(ex, all + i * T, (size_t)T * sizeof(int));
    }
    check(layout, "%s: every example is <|endoftext|>, the task, filler, the key's line (a 5-digit key twice), filler, "
          "the question, then \" KEY.\"%s%s", path, layout ? "" : ": ", why);
    if (examples >= 50) check(lo < 0.2 && hi > 0.8, "%s: the key lines lie at depths from %.2f to %.2f of the filler", path, lo, hi);
    check(same, "%s: example i is fox_passkey_example(split %d, i)", path, split);
    fox_passkey_text_free(&text);
    free(ex);
    return all;
}

static void test_passkey(void) {
    printf("== passkey data (fox_data passkey, fox/passkey.h)\n");
    Tokenizer tok;
    if (!tokenizer_load(&tok, FOX_TOKENIZER_DEFAULT_PATH, NULL)) {
        check(0, "load %s", FOX_TOKENIZER_DEFAULT_PATH);
        return;
    }
    int rc = run("./fox_data passkey --out %s " PASSKEY_ARGS " --seed 7 > /dev/null", path_in("pk"));
    check(rc == 0, "fox_data passkey --out DIR " PASSKEY_ARGS " --seed 7");
    if (rc != 0) return;
    check(grep_file(path_in("pk/passkey.json"), "\"task\": \"passkey\", \"seq_len\": 160, \"train_examples\": 60, "
                    "\"val_examples\": 12, \"seed\": 7"),
          "passkey.json: task, seq_len, examples and seed");
    int train_keys[60], val_keys[12];
    int *train = check_passkey_split(&tok, path_in("pk/train.bin"), FOX_PASSKEY_TRAIN, 60, 7, train_keys);
    int *val = check_passkey_split(&tok, path_in("pk/val.bin"), FOX_PASSKEY_VAL, 12, 7, val_keys);
    int distinct = 0, shared = 0;
    for (int i = 0; i < 60; i++) {
        int seen = 0;
        for (int j = 0; j < i; j++) seen |= train_keys[j] == train_keys[i];
        distinct += !seen;
        for (int j = 0; j < 12; j++) shared += train_keys[i] == val_keys[j];
    }
    check(distinct >= 58 && shared == 0, "%d distinct keys in 60 train examples, none shared with the 12 validation ones "
          "(the splits are seeded apart)", distinct);
    DataLoader dl;
    dataloader_init(&dl, path_in("pk/train.bin"), 1, PASSKEY_T, 0, 1, 0, 0);
    int in[PASSKEY_T], tg[PASSKEY_T];
    dataloader_next(&dl, in, tg);
    check(!memcmp(in, train, sizeof in) && !memcmp(tg, train + 1, sizeof tg) && tg[PASSKEY_T - 1] == FOX_EOT,
          "a loader with --seq-len %d reads example 0 as window 0, its last target the next example's <|endoftext|>", PASSKEY_T);
    dataloader_free(&dl);
    free(train);
    free(val);
    run("./fox_data passkey --out %s " PASSKEY_ARGS " --seed 7 > /dev/null", path_in("pk_same"));
    run("./fox_data passkey --out %s " PASSKEY_ARGS " --seed 8 > /dev/null", path_in("pk_other"));
    check(same_file(path_in("pk/train.bin"), path_in("pk_same/train.bin")) &&
              same_file(path_in("pk/val.bin"), path_in("pk_same/val.bin")) &&
              !same_file(path_in("pk/train.bin"), path_in("pk_other/train.bin")),
          "the same seed writes identical files, another seed other examples");
    static const char *const bad[][2] = {
        {"--seq-len shorter than the fixed part", "--seq-len 60"},
        {"no validation examples", "--val-examples 0"},
        {"more train tokens than a shard holds", "--train-examples 10000000"},
        {"a flag without its value", "--seed"},
    };
    expect_bad_flags("./fox_data passkey", path_in("pk_bad"), bad, sizeof bad / sizeof bad[0]);
    expect_error("fox_data passkey: no --out", "./fox_data passkey --seq-len 256");
    expect_set_kept("passkey", "pk", PASSKEY_ARGS, "passkey.json", "pk_same");
    tokenizer_free(&tok);
}

// ---------------------------------------------------------------- helper modes and main

static int helper_open(char **argv) {
    DataLoader dl;
    dataloader_init(&dl, argv[0], atoi(argv[1]), atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), 0, 1);
    int *in = (int *)fox_malloc((size_t)dl.B * dl.T * sizeof(int)), *tg = (int *)fox_malloc((size_t)dl.B * dl.T * sizeof(int));
    dataloader_next(&dl, in, tg);
    printf("%lld windows\n", dataloader_num_windows(&dl));
    free(in);
    free(tg);
    dataloader_free(&dl);
    return 0;
}

// Opens a zarr array, deletes one of its chunk files, then reads the whole array (which must fail).
static int helper_delete_then_read(const char *dir, const char *chunk) {
    FoxZarr z;
    fox_zarr_open(&z, dir);
    if (unlink(chunk)) fox_fatal("cannot delete %s: %s", chunk, strerror(errno));
    uint32_t *all = (uint32_t *)fox_malloc((size_t)(z.shape[0] * z.shape[1]) * sizeof(uint32_t));
    fox_zarr_read(&z, 0, z.shape[0], 0, z.shape[1], all);
    free(all);
    fox_zarr_close(&z);
    return 0;
}

static int helper_state_mismatch(const char *spec) {
    DataLoader a, b;
    dataloader_init(&a, spec, 2, 8, 0, 1, 1, 1);
    dataloader_init(&b, spec, 2, 8, 0, 1, 2, 1);
    char state[256];
    dataloader_save_state(&a, state);
    dataloader_load_state(&b, state, dataloader_state_bytes(&a));
    return 0;
}

// Reads DIR/mqar.json (which must fail on bad input) and prints its sizes.
static int helper_mqar_read(const char *dir) {
    FoxMqar m;
    fox_mqar_read(dir, &m);
    printf("vocab %d, num_kv %d, seq_len %d\n", m.vocab, m.num_kv, m.seq_len);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 7 && !strcmp(argv[1], "--open")) return helper_open(argv + 2);
    if (argc == 3 && !strcmp(argv[1], "--state-mismatch")) return helper_state_mismatch(argv[2]);
    if (argc == 3 && !strcmp(argv[1], "--mqar-read")) return helper_mqar_read(argv[2]);
    if (argc == 4 && !strcmp(argv[1], "--delete-then-read")) return helper_delete_then_read(argv[2], argv[3]);
    if (getenv("PYTHON") && *getenv("PYTHON")) python = getenv("PYTHON");
    snprintf(tmp, sizeof tmp, "/tmp/fox_test_data.XXXXXX");
    if (!mkdtemp(tmp)) fox_fatal("cannot create a temporary directory");
    test_bin_loader();
    test_tokenizer();
    test_zarr();
    test_fox_data();
    test_mqar();
    test_passkey();
    if (n_failed == 0) run("rm -rf %s", tmp);
    else printf("(files kept in %s)\n", tmp);
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed ? 1 : 0;
}
