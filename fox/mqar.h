// fox/mqar.h: multi-query associative recall (MQAR; Zoology, Arora et al. 2023), the one definition of
// its data layout: `fox_data mqar` writes the data with it, the trainers' evaluator scores with it.
// Header-only, C11, also compiles as CUDA C++.
//
// Vocabulary V: token 0 is the start and filler token, keys are [1, 1+K), values [1+K, V), K = (V-1)/2.
// An example is exactly T tokens (T = seq_len, N = num_kv pairs, T >= 1 + 4N, N <= K):
//   position 0           token 0, the start;
//   positions 1..2N      the pairs k_1 v_1 ... k_N v_N: N distinct keys (a uniform N-subset of the keys,
//                        in a uniform order), each value uniform over the values (repeats allowed);
//   positions 2N+1..T-1  the query section, cut into floor((T-1-2N)/2) two-token slots starting at
//                        2N+1 (slot s at 2N+1+2s; when T-1-2N is odd its last position is no slot).
//                        N slots are chosen uniformly among them; they hold the queries "k v", every key
//                        once with its own value, the keys in a uniform order (independent of the pairs'
//                        order), in increasing position. Every other position of the section is 0.
// An answer position is a query's key: t >= 2N+1 with input[t] a key; its target, input[t+1], is the
// value (fox_mqar_is_answer). The only positions an MQAR score counts, N per example.
// Example i of a split is a pure function of (seed, split, i): its draws come from the project RNG
// (fox/rng.h) under fox_rng_key(split key, i), the split key from stream FOX_STREAM_MQAR and the split
// (FOX_MQAR_TRAIN, FOX_MQAR_TEST), so the two splits are seeded independently.
// On disk (fox_data mqar --out DIR): DIR/train.bin and DIR/test.bin, llm.c shards (uint16 tokens, or the
// uint32 variant when V > 65536) holding the split's examples back to back and then one token 0, so a
// loader with seq_len T (dataloader.h: window k = tokens [kT, kT+T+1)) reads example k as input and
// example k shifted by one, ending in the next example's start token, as target. DIR/mqar.json, written
// last, describes the set: {"task": "mqar", "vocab", "num_kv", "seq_len", "key_range": [lo, hi],
// "value_range": [lo, hi], "train_examples", "test_examples", "seed", "layout"} (ranges half-open).
#ifndef FOX_MQAR_H
#define FOX_MQAR_H

// io.h uses POSIX calls (fileno, fsync): a file that includes this header first, under plain -std=c11,
// gets their declarations.
#if !defined(_POSIX_C_SOURCE) && !defined(_DEFAULT_SOURCE) && !defined(_GNU_SOURCE)
#define _POSIX_C_SOURCE 200809L
#endif

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>
#include "io.h"
#include "rng.h"

enum { FOX_MQAR_TRAIN = 0, FOX_MQAR_TEST = 1 };
// The trainers' largest --vocab and --seq-len (fox/args.h).
#define FOX_MQAR_MAX_VOCAB (1 << 30)
#define FOX_MQAR_MAX_SEQ_LEN (1 << 24)

typedef struct FoxMqar {
    int vocab, num_kv, seq_len;
    int key_lo, key_hi, value_lo, value_hi;  // half-open ranges, from vocab (fox_mqar_set_ranges)
    long long train_examples, test_examples;
    uint64_t seed;
} FoxMqar;

// The key and value ranges of m->vocab.
static inline void fox_mqar_set_ranges(FoxMqar *m) {
    int keys = (m->vocab - 1) / 2;
    m->key_lo = 1;
    m->key_hi = 1 + keys;
    m->value_lo = 1 + keys;
    m->value_hi = m->vocab;
}

// Why m's sizes make no data set, in msg (returns 1), or 0 when they do. as_flags: name the sizes as
// fox_data mqar's flags (--num-kv), else as mqar.json's keys (num_kv).
static inline int fox_mqar_problem(const FoxMqar *m, int as_flags, char *msg, size_t cap) {
    const char *const flags[5] = {"--vocab", "--num-kv", "--seq-len", "--train-examples", "--test-examples"};
    const char *const json[5] = {"vocab", "num_kv", "seq_len", "train_examples", "test_examples"};
    const char *const *name = as_flags ? flags : json;
    long long need = 1 + 4LL * m->num_kv;
    long long most = m->seq_len > 0 ? (INT32_MAX - 1) / m->seq_len : 0;  // a shard's header counts tokens in an int32
    int keys = (m->vocab - 1) / 2;
    if (m->vocab < 3 || m->vocab > FOX_MQAR_MAX_VOCAB)
        snprintf(msg, cap, "%s %d is not in [3, 2^30] (MQAR needs a start token, a key and a value)", name[0], m->vocab);
    else if (m->num_kv < 1 || m->num_kv > keys)
        snprintf(msg, cap, "%s %d is not in [1, %d]: a vocabulary of %d has %d keys (tokens 1..%d)", name[1], m->num_kv, keys,
                 m->vocab, keys, keys);
    else if (m->seq_len < need || m->seq_len > FOX_MQAR_MAX_SEQ_LEN)
        snprintf(msg, cap, "%s %d is not in [%lld, 2^24]: %d pairs take 1 + 4 x %d tokens (the start, the pairs, the queries)",
                 name[2], m->seq_len, need, m->num_kv, m->num_kv);
    else if (m->train_examples < 1 || m->train_examples > most)
        snprintf(msg, cap, "%s %lld is not in [1, %lld]: the examples and the final token must fit one shard (2^31-1 tokens)", name[3],
                 m->train_examples, most);
    else if (m->test_examples < 1 || m->test_examples > most)
        snprintf(msg, cap, "%s %lld is not in [1, %lld]: the examples and the final token must fit one shard (2^31-1 tokens)", name[4],
                 m->test_examples, most);
    else return 0;
    return 1;
}

// The rng key of a split's examples.
static inline uint64_t fox_mqar_split_key(uint64_t seed, int split) {
    return fox_rng_key(fox_rng_key(seed, FOX_STREAM_MQAR), (uint64_t)split);
}

// An example's draws: uniform integers, one counter value each.
typedef struct FoxMqarDraws {
    uint64_t key, next;
} FoxMqarDraws;

static inline int fox_mqar_below(FoxMqarDraws *d, int n) { return (int)fox_rng_below(d->key, d->next++, (uint64_t)n); }

// The first index of sorted a[0..n) whose value is >= x.
static inline int fox_mqar_lower_bound(const int *a, int n, int x) {
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (a[mid] < x) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

// n distinct integers of [0, k), a uniform n-subset (Floyd's algorithm: n draws, no table of k), sorted
// into set[0..n).
static inline void fox_mqar_distinct(FoxMqarDraws *d, int n, int k, int *set) {
    int size = 0;
    for (int j = k - n; j < k; j++) {
        int t = fox_mqar_below(d, j + 1), at = fox_mqar_lower_bound(set, size, t);
        if (at < size && set[at] == t) {  // t is taken: j goes in, and every member so far is below j
            set[size++] = j;
            continue;
        }
        memmove(set + at + 1, set + at, (size_t)(size - at) * sizeof(int));
        set[at] = t;
        size++;
    }
}

// A uniform permutation of a[0..n) (Fisher-Yates).
static inline void fox_mqar_shuffle(FoxMqarDraws *d, int *a, int n) {
    for (int i = n - 1; i > 0; i--) {
        int j = fox_mqar_below(d, i + 1), x = a[i];
        a[i] = a[j];
        a[j] = x;
    }
}

// Example `index` of the split whose key is split_key (fox_mqar_split_key): m->seq_len tokens.
static inline void fox_mqar_example(const FoxMqar *m, uint64_t split_key, long long index, int *tokens) {
    const int N = m->num_kv, T = m->seq_len, Q = 2 * N + 1, slots = (T - Q) / 2;  // Q: the query section
    FoxMqarDraws d = {fox_rng_key(split_key, (uint64_t)index), 0};
    int *order = (int *)fox_malloc((size_t)N * sizeof(int));
    fox_mqar_distinct(&d, N, m->key_hi - m->key_lo, order);
    fox_mqar_shuffle(&d, order, N);
    tokens[0] = 0;
    for (int i = 0; i < N; i++) {
        tokens[1 + 2 * i] = m->key_lo + order[i];
        tokens[2 + 2 * i] = m->value_lo + fox_mqar_below(&d, m->value_hi - m->value_lo);
    }
    for (int i = 0; i < N; i++) order[i] = i;
    fox_mqar_shuffle(&d, order, N);  // order[r]: the pair the r-th query asks for
    // Selection sampling: slot s is chosen with probability (queries left) / (slots left), which picks a
    // uniform N-subset of the slots in increasing order.
    int r = 0;
    for (int s = 0; s < slots; s++) {
        int *slot = tokens + Q + 2 * s;
        if (r < N && fox_mqar_below(&d, slots - s) < N - r) {
            slot[0] = tokens[1 + 2 * order[r]];
            slot[1] = tokens[2 + 2 * order[r]];
            r++;
        } else slot[0] = slot[1] = 0;
    }
    if ((T - Q) % 2) tokens[T - 1] = 0;  // the position after the last slot
    free(order);
}

// Whether position t of an example's inputs (m->seq_len tokens) is an answer position: a query's key,
// whose target inputs[t+1] is its value.
static inline int fox_mqar_is_answer(const FoxMqar *m, const int *inputs, int t) {
    return t >= 2 * m->num_kv + 1 && t + 1 < m->seq_len && inputs[t] >= m->key_lo && inputs[t] < m->key_hi;
}

// ---- DIR/mqar.json: a fixed set of keys, read by a strict scanner ----
// Not fox/json.h's reader: its numbers are doubles, exact to 2^53, and the seed spans [0, 2^64).

// Where the value of "name" starts in text; fatal when the key is absent.
static inline const char *fox_mqar_json_value(const char *text, const char *path, const char *name) {
    char quoted[64];
    snprintf(quoted, sizeof quoted, "\"%s\"", name);
    for (const char *p = strstr(text, quoted); p; p = strstr(p + 1, quoted)) {
        const char *q = p + strlen(quoted);
        while (isspace((unsigned char)*q)) q++;
        if (*q != ':') continue;  // a string value that happens to spell the key
        for (q++; isspace((unsigned char)*q); q++) {}
        return q;
    }
    fox_fatal("%s: no \"%s\" (is this fox_data mqar's description of a data set?)", path, name);
}

// The JSON integer at *p, in [lo, hi]; *p moves past it. Fatal, naming the key, otherwise.
static inline long long fox_mqar_json_integer(const char **p, const char *path, const char *name, long long lo, long long hi) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(*p, &end, 10);
    int number = **p == '-' || isdigit((unsigned char)**p);  // strtoll would also take '+' and white space
    if (!number || end == *p || errno || v < lo || v > hi || (*end && !strchr(" \t\r\n,]}", *end)))
        fox_fatal("%s: \"%s\" is not an integer in [%lld, %lld]", path, name, lo, hi);
    *p = end;
    return v;
}

// Moves *p past the character c (after white space); fatal, naming the key, if it is not there.
static inline void fox_mqar_json_expect(const char **p, char c, const char *path, const char *name) {
    while (isspace((unsigned char)**p)) (*p)++;
    if (**p != c) fox_fatal("%s: \"%s\" is not a range [lo, hi]", path, name);
    (*p)++;
}

// The integer value of key `name`, in [lo, hi].
static inline long long fox_mqar_json_int(const char *text, const char *path, const char *name, long long lo, long long hi) {
    const char *p = fox_mqar_json_value(text, path, name);
    return fox_mqar_json_integer(&p, path, name, lo, hi);
}

// The range [lo, hi] of key `name`, which must equal [want_lo, want_hi) as vocab defines it.
static inline void fox_mqar_json_range(const char *text, const char *path, const char *name, int want_lo, int want_hi, int vocab) {
    const char *p = fox_mqar_json_value(text, path, name);
    fox_mqar_json_expect(&p, '[', path, name);
    long long lo = fox_mqar_json_integer(&p, path, name, 0, INT_MAX);
    fox_mqar_json_expect(&p, ',', path, name);
    while (isspace((unsigned char)*p)) p++;
    long long hi = fox_mqar_json_integer(&p, path, name, 0, INT_MAX);
    fox_mqar_json_expect(&p, ']', path, name);
    if (lo != want_lo || hi != want_hi)
        fox_fatal("%s: \"%s\" is [%lld, %lld), but a vocab of %d makes it [%d, %d)", path, name, lo, hi, vocab, want_lo, want_hi);
}

// Reads DIR/mqar.json into m; a missing or malformed file is fatal (one line naming what is wrong).
static inline void fox_mqar_read(const char *dir, FoxMqar *m) {
    char path[4200];
    if (snprintf(path, sizeof path, "%s/mqar.json", dir) >= (int)sizeof path) fox_fatal("path too long: %s", dir);
    size_t len;
    char *text = fox_read_file(path, &len);
    if (!text) fox_fatal("%s: cannot read: %s (fox_data mqar --out %s writes it)", path, strerror(errno), dir);
    if (strlen(text) != len) fox_fatal("%s: holds a NUL byte", path);
    if (strncmp(fox_mqar_json_value(text, path, "task"), "\"mqar\"", 6)) fox_fatal("%s: \"task\" is not \"mqar\"", path);
    memset(m, 0, sizeof *m);
    m->vocab = (int)fox_mqar_json_int(text, path, "vocab", 0, INT_MAX);
    m->num_kv = (int)fox_mqar_json_int(text, path, "num_kv", 0, INT_MAX);
    m->seq_len = (int)fox_mqar_json_int(text, path, "seq_len", 0, INT_MAX);
    m->train_examples = fox_mqar_json_int(text, path, "train_examples", 0, LLONG_MAX);
    m->test_examples = fox_mqar_json_int(text, path, "test_examples", 0, LLONG_MAX);
    const char *p = fox_mqar_json_value(text, path, "seed");
    char *end = NULL;
    errno = 0;
    m->seed = strtoull(p, &end, 10);
    if (!isdigit((unsigned char)*p) || errno || (*end && !strchr(" \t\r\n,}", *end)))
        fox_fatal("%s: \"seed\" is not an integer in [0, 2^64)", path);
    char msg[256];
    if (fox_mqar_problem(m, 0, msg, sizeof msg)) fox_fatal("%s: %s", path, msg);
    fox_mqar_set_ranges(m);
    fox_mqar_json_range(text, path, "key_range", m->key_lo, m->key_hi, m->vocab);
    fox_mqar_json_range(text, path, "value_range", m->value_lo, m->value_hi, m->vocab);
    free(text);
}

#endif
