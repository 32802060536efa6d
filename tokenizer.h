// tokenizer.h: GPT-2 byte-level BPE in C (docs/model.md §4), byte-exact with tiktoken's `gpt2` encoding.
// Header-only, C11, also compiles as C++.
//
// Encoding = tiktoken's algorithm:
//  1. pre-tokenise with the gpt2 pattern
//       's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//     (hand-coded below; \s is Unicode White_Space as in tiktoken's Rust regex);
//  2. a piece that is itself a token is that token; otherwise start from its bytes and keep
//     merging the adjacent pair whose concatenation has the lowest rank (leftmost on ties).
//     GPT-2's ranks are its token ids, so no merge table is needed.
// "<|endoftext|>" becomes 50256 only when allow_eot_special is set (tiktoken's
// allowed_special="all"); otherwise it is ordinary text (tiktoken's encode_ordinary).
// Bytes that are not valid UTF-8 (tiktoken only accepts str) are treated as single characters
// of the "other" class, so encode→decode is the identity on any bytes.
// Vocabulary: data/gpt2_tokenizer.bin, built by dev/data/build_tokenizer.mjs.
#ifndef FOX_TOKENIZER_H
#define FOX_TOKENIZER_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FOX_TOKENIZER_DEFAULT_PATH "data/gpt2_tokenizer.bin"
#define FOX_TOKENIZER_MAGIC 20261123
#define FOX_TOKENIZER_VERSION 1

enum { FOX_CH_OTHER = 0, FOX_CH_LETTER = 1, FOX_CH_NUMBER = 2, FOX_CH_SPACE = 3 };

typedef struct Tokenizer {
    int n_vocab, eot;
    unsigned char *pool;      // all token bytes, concatenated
    uint32_t *offset;         // token i = pool[offset[i], offset[i+1])
    int32_t *slots;           // open-addressing hash: token bytes -> id (-1 empty)
    uint32_t slot_mask;
    uint32_t *ranges[3];      // letter, number, space ranges: lo, hi pairs (inclusive)
    int n_ranges[3];
    unsigned char ascii_class[128];
    int byte_token[256];      // id of each single-byte token
} Tokenizer;

static inline uint64_t fox_tok_hash(const unsigned char *s, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001B3ull;
    return h ^ (h >> 29);
}

// Rank (= token id) of the byte string s[0:n], or -1 if it is not a token.
static inline int fox_tok_lookup(const Tokenizer *t, const unsigned char *s, size_t n) {
    uint32_t i = (uint32_t)fox_tok_hash(s, n) & t->slot_mask;
    for (;;) {
        int32_t id = t->slots[i];
        if (id < 0) return -1;
        uint32_t len = t->offset[id + 1] - t->offset[id];
        if (len == n && memcmp(t->pool + t->offset[id], s, n) == 0) return id;
        i = (i + 1) & t->slot_mask;
    }
}

static inline int fox_tok_in_ranges(const uint32_t *r, int n, uint32_t cp) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < r[2 * mid]) hi = mid - 1;
        else if (cp > r[2 * mid + 1]) lo = mid + 1;
        else return 1;
    }
    return 0;
}

static inline int fox_tok_class_of(const Tokenizer *t, uint32_t cp) {
    if (cp < 128) return t->ascii_class[cp];
    if (fox_tok_in_ranges(t->ranges[0], t->n_ranges[0], cp)) return FOX_CH_LETTER;
    if (fox_tok_in_ranges(t->ranges[1], t->n_ranges[1], cp)) return FOX_CH_NUMBER;
    if (fox_tok_in_ranges(t->ranges[2], t->n_ranges[2], cp)) return FOX_CH_SPACE;
    return FOX_CH_OTHER;
}

// Decodes one UTF-8 character at s[i] (strict: no overlongs, surrogates or > U+10FFFF);
// returns its length, or 1 with *cp = 0xFFFFFFFF for an invalid byte.
static inline int fox_utf8_next(const unsigned char *s, size_t n, size_t i, uint32_t *cp) {
    unsigned c = s[i];
    if (c < 0x80) { *cp = c; return 1; }
    int len;
    uint32_t v, min;
    if (c >= 0xC2 && c <= 0xDF) { len = 2; v = c & 0x1F; min = 0x80; }
    else if (c >= 0xE0 && c <= 0xEF) { len = 3; v = c & 0x0F; min = 0x800; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; v = c & 0x07; min = 0x10000; }
    else { *cp = 0xFFFFFFFFu; return 1; }
    if (i + (size_t)len > n) { *cp = 0xFFFFFFFFu; return 1; }
    for (int k = 1; k < len; k++) {
        unsigned d = s[i + (size_t)k];
        if ((d & 0xC0) != 0x80) { *cp = 0xFFFFFFFFu; return 1; }
        v = (v << 6) | (d & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) { *cp = 0xFFFFFFFFu; return 1; }
    *cp = v;
    return len;
}

static inline int fox_tok_read_u32s(FILE *f, uint32_t *dst, size_t n) { return fread(dst, 4, n, f) == n; }

static inline void tokenizer_free(Tokenizer *t) {
    free(t->pool);
    free(t->offset);
    free(t->slots);
    for (int k = 0; k < 3; k++) free(t->ranges[k]);
    memset(t, 0, sizeof *t);
}

// Loads the vocabulary file; returns 1 on success, 0 on failure with why (unless NULL) saying what went wrong, so
// that the caller's one error line can say it.
static inline int tokenizer_load(Tokenizer *t, const char *path, const char **why) {
    memset(t, 0, sizeof *t);
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (why) *why = strerror(errno);
        return 0;
    }
    int32_t h[7];
    size_t total = 0;
    int ok = fread(h, 4, 7, f) == 7 && h[0] == FOX_TOKENIZER_MAGIC && h[1] == FOX_TOKENIZER_VERSION && h[2] > 256 &&
             h[2] < (1 << 24) && h[3] >= 0 && h[3] < h[2] && h[4] >= 0 && h[5] >= 0 && h[6] >= 0 && h[4] < (1 << 20) &&
             h[5] < (1 << 20) && h[6] < (1 << 20);
    if (ok) {
        t->n_vocab = h[2];
        t->eot = h[3];
        t->offset = (uint32_t *)malloc(((size_t)t->n_vocab + 1) * sizeof(uint32_t));
        size_t cap = 1 << 20;
        t->pool = (unsigned char *)malloc(cap);
        ok = t->offset && t->pool;
        for (int i = 0; ok && i < t->n_vocab; i++) {
            uint16_t len;
            t->offset[i] = (uint32_t)total;
            if (fread(&len, 2, 1, f) != 1 || len == 0) { ok = 0; break; }
            if (total + len > cap) {
                cap *= 2;
                unsigned char *p = (unsigned char *)realloc(t->pool, cap);
                if (!p) { ok = 0; break; }
                t->pool = p;
            }
            if (fread(t->pool + total, 1, len, f) != len) { ok = 0; break; }
            total += len;
        }
        if (ok) t->offset[t->n_vocab] = (uint32_t)total;
    }
    for (int k = 0; ok && k < 3; k++) {
        t->n_ranges[k] = h[4 + k];
        t->ranges[k] = (uint32_t *)malloc(2 * (size_t)h[4 + k] * sizeof(uint32_t) + 8);
        ok = t->ranges[k] && fox_tok_read_u32s(f, t->ranges[k], 2 * (size_t)h[4 + k]);
    }
    if (ok && fgetc(f) != EOF) ok = 0;  // trailing bytes: not our format
    fclose(f);
    if (ok) {
        uint32_t cap = 1;
        while (cap < 2u * (uint32_t)t->n_vocab) cap <<= 1;
        t->slot_mask = cap - 1;
        t->slots = (int32_t *)malloc(cap * sizeof(int32_t));
        ok = t->slots != NULL;
        if (ok) memset(t->slots, 0xff, cap * sizeof(int32_t));
        for (int id = 0; ok && id < t->n_vocab; id++) {
            if (id == t->eot) continue;  // the special token is never produced by merging
            const unsigned char *s = t->pool + t->offset[id];
            size_t n = t->offset[id + 1] - t->offset[id];
            uint32_t i = (uint32_t)fox_tok_hash(s, n) & t->slot_mask;
            while (t->slots[i] >= 0) i = (i + 1) & t->slot_mask;
            t->slots[i] = id;
        }
        for (int b = 0; ok && b < 256; b++) {
            unsigned char c = (unsigned char)b;
            t->byte_token[b] = fox_tok_lookup(t, &c, 1);
            if (t->byte_token[b] < 0) ok = 0;
        }
        for (int c = 0; ok && c < 128; c++) {
            uint32_t cp = (uint32_t)c;
            t->ascii_class[c] = fox_tok_in_ranges(t->ranges[0], t->n_ranges[0], cp)   ? FOX_CH_LETTER
                                : fox_tok_in_ranges(t->ranges[1], t->n_ranges[1], cp) ? FOX_CH_NUMBER
                                : fox_tok_in_ranges(t->ranges[2], t->n_ranges[2], cp) ? FOX_CH_SPACE
                                                                                      : FOX_CH_OTHER;
        }
    }
    if (!ok) {
        if (why) *why = "not a fox.c tokenizer file (data/gpt2_tokenizer.bin's format)";
        tokenizer_free(t);
        return 0;
    }
    return 1;
}

// ---- pre-tokenisation ----

typedef struct FoxTokCursor {
    const Tokenizer *t;
    const unsigned char *s;
    size_t n;
} FoxTokCursor;

// Class and length of the character at i (invalid bytes: "other", length 1).
static inline int fox_tok_char(const FoxTokCursor *c, size_t i, int *len) {
    uint32_t cp;
    *len = fox_utf8_next(c->s, c->n, i, &cp);
    if (cp == 0xFFFFFFFFu) return FOX_CH_OTHER;
    return fox_tok_class_of(c->t, cp);
}

// End of the run of characters of class `cls` starting at i (for OTHER: not letter/number/space).
static inline size_t fox_tok_run(const FoxTokCursor *c, size_t i, int cls) {
    while (i < c->n) {
        int len;
        if (fox_tok_char(c, i, &len) != cls) break;
        i += (size_t)len;
    }
    return i;
}

// Length of the contraction ('s 't 'm 'd 're 've 'll) at i, or 0.
static inline size_t fox_tok_contraction(const FoxTokCursor *c, size_t i) {
    if (c->s[i] != '\'' || i + 1 >= c->n) return 0;
    unsigned char a = c->s[i + 1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (i + 2 < c->n) {
        unsigned char b = c->s[i + 2];
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    }
    return 0;
}

// End of the pre-token starting at i: the gpt2 pattern's alternatives in order.
static inline size_t fox_tok_piece_end(const FoxTokCursor *c, size_t i) {
    size_t k = fox_tok_contraction(c, i);
    if (k) return i + k;
    size_t j = i;
    if (c->s[i] == ' ' && i + 1 < c->n) j = i + 1;  // the optional leading space
    int len, cls = fox_tok_char(c, j, &len);
    if (j > i || cls != FOX_CH_SPACE) {
        if (cls != FOX_CH_SPACE) return fox_tok_run(c, j + (size_t)len, cls);
        j = i;  // a space before white space: fall through to the white-space rules
    }
    // \s+(?!\S) takes the run but one when a non-space follows (that one may lead the next
    // piece); \s+ takes a lone white-space character.
    size_t end = fox_tok_run(c, i, FOX_CH_SPACE), last = end;
    if (end == c->n) return end;
    // back off one character (white space may be multi-byte, e.g. U+3000)
    size_t prev = i;
    for (size_t p = i; p < end;) {
        int l;
        fox_tok_char(c, p, &l);
        prev = p;
        p += (size_t)l;
    }
    last = prev;
    return last > i ? last : end;
}

// ---- BPE ----

typedef struct FoxTokBuf {
    int *ids;
    size_t n, cap;
} FoxTokBuf;

static inline int fox_tokbuf_push(FoxTokBuf *b, int id) {
    if (b->n == b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 1024;
        int *p = (int *)realloc(b->ids, cap * sizeof(int));
        if (!p) return 0;
        b->ids = p;
        b->cap = cap;
    }
    b->ids[b->n++] = id;
    return 1;
}

// Scratch for byte_pair_merge: part starts and the rank of each part merged with its successor.
typedef struct FoxBpeScratch {
    size_t *start;
    int *rank;
    size_t cap;
} FoxBpeScratch;

#define FOX_NO_RANK 0x7fffffff

// Rank of parts i and i+1 joined (m parts; start[m] is the end of the piece).
static inline int fox_bpe_pair_rank(const Tokenizer *t, const unsigned char *p, const size_t *start, size_t m, size_t i) {
    if (i + 1 >= m) return FOX_NO_RANK;
    int r = fox_tok_lookup(t, p + start[i], start[i + 2] - start[i]);
    return r < 0 ? FOX_NO_RANK : r;
}

// Encodes one piece p[0:n] (tiktoken's byte_pair_merge), appending ids to out.
static inline int fox_bpe_piece(const Tokenizer *t, const unsigned char *p, size_t n, FoxBpeScratch *w, FoxTokBuf *out) {
    int whole = fox_tok_lookup(t, p, n);
    if (whole >= 0) return fox_tokbuf_push(out, whole);
    if (n + 1 > w->cap) {
        size_t cap = 2 * (n + 1);
        size_t *s = (size_t *)realloc(w->start, cap * sizeof(size_t));
        if (!s) return 0;
        w->start = s;
        int *r = (int *)realloc(w->rank, cap * sizeof(int));
        if (!r) return 0;
        w->rank = r;
        w->cap = cap;
    }
    // parts: start[0..m) plus a sentinel start[m] = n; rank[i] = rank of parts i and i+1 joined
    size_t m = n;
    for (size_t i = 0; i <= n; i++) w->start[i] = i;
    for (size_t i = 0; i < m; i++) w->rank[i] = fox_bpe_pair_rank(t, p, w->start, m, i);
    for (;;) {
        int best = FOX_NO_RANK;
        size_t bi = 0;
        for (size_t i = 0; i + 1 < m; i++)
            if (w->rank[i] < best) { best = w->rank[i]; bi = i; }
        if (best == FOX_NO_RANK) break;
        // merge parts bi and bi+1: drop start[bi+1]
        memmove(w->start + bi + 1, w->start + bi + 2, (m - bi - 1) * sizeof(size_t));
        memmove(w->rank + bi + 1, w->rank + bi + 2, (m - bi - 2) * sizeof(int));
        m--;
        w->rank[bi] = fox_bpe_pair_rank(t, p, w->start, m, bi);
        if (bi > 0) w->rank[bi - 1] = fox_bpe_pair_rank(t, p, w->start, m, bi - 1);
    }
    for (size_t i = 0; i < m; i++) {
        int id = fox_tok_lookup(t, p + w->start[i], w->start[i + 1] - w->start[i]);
        if (!fox_tokbuf_push(out, id)) return 0;
    }
    return 1;
}

static inline const unsigned char *fox_tok_find_eot(const unsigned char *s, size_t n) {
    static const char pat[] = "<|endoftext|>";
    const size_t k = sizeof pat - 1;
    for (size_t i = 0; i + k <= n; i++) {
        const unsigned char *q = (const unsigned char *)memchr(s + i, '<', n - i - k + 1);
        if (!q) return NULL;
        if (memcmp(q, pat, k) == 0) return q;
        i = (size_t)(q - s);
    }
    return NULL;
}

// Encodes ordinary text s[0:n] (no special tokens) into out.
static inline int fox_tok_encode_ordinary(const Tokenizer *t, const unsigned char *s, size_t n, FoxBpeScratch *w, FoxTokBuf *out) {
    FoxTokCursor c = {t, s, n};
    size_t i = 0;
    while (i < n) {
        size_t e = fox_tok_piece_end(&c, i);
        if (!fox_bpe_piece(t, s + i, e - i, w, out)) return 0;
        i = e;
    }
    return 1;
}

static inline int *tokenizer_encode(const Tokenizer *t, const char *text, size_t len, size_t *n, int allow_eot_special) {
    FoxTokBuf out = {NULL, 0, 0};
    FoxBpeScratch w = {NULL, NULL, 0};
    const unsigned char *s = (const unsigned char *)text, *end = s + len;
    int ok = fox_tokbuf_push(&out, 0);  // ensure a non-NULL result even for empty text
    out.n = 0;
    while (ok && s < end) {
        const unsigned char *q = allow_eot_special ? fox_tok_find_eot(s, (size_t)(end - s)) : NULL;
        const unsigned char *stop = q ? q : end;
        ok = fox_tok_encode_ordinary(t, s, (size_t)(stop - s), &w, &out);
        if (ok && q) ok = fox_tokbuf_push(&out, t->eot);
        s = q ? q + 13 : end;
    }
    free(w.start);
    free(w.rank);
    if (!ok) {
        free(out.ids);
        *n = 0;
        return NULL;
    }
    *n = out.n;
    return out.ids;
}

// Decodes ids to bytes; an id outside the vocabulary decodes to U+FFFD.
static inline char *tokenizer_decode(const Tokenizer *t, const int *ids, size_t n, size_t *len) {
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += (ids[i] >= 0 && ids[i] < t->n_vocab) ? t->offset[ids[i] + 1] - t->offset[ids[i]] : 3;
    char *buf = (char *)malloc(total + 1);
    if (!buf) { *len = 0; return NULL; }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] >= 0 && ids[i] < t->n_vocab) {
            uint32_t a = t->offset[ids[i]], b = t->offset[ids[i] + 1];
            memcpy(buf + k, t->pool + a, b - a);
            k += b - a;
        } else {
            memcpy(buf + k, "\xEF\xBF\xBD", 3);
            k += 3;
        }
    }
    buf[k] = 0;
    *len = k;
    return buf;
}

#endif
