// fox/crc32.h: CRC-32 (the IEEE 802.3 / zlib / PNG checksum, reflected polynomial 0xEDB88320) of the
// checkpoint files, so a truncated copy, bit rot or a hand-edited file is caught on load. Python's
// zlib.crc32 computes the same value (train_fox.py writes and checks model.bin with it).
// Large buffers are split into pieces checksummed in parallel (OpenMP) and joined with the CRC
// combination rule, so the check costs little beside the write.
#ifndef FOX_CRC32_H
#define FOX_CRC32_H

#include <stddef.h>
#include <stdint.h>

// tables[k][b]: the CRC register after byte b followed by k zero bytes (slicing-by-8).
static uint32_t fox_crc_tables[8][256];

static inline void fox_crc32_init_tables(void) {
    if (fox_crc_tables[0][1]) return;
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t c = b;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        fox_crc_tables[0][b] = c;
    }
    for (int k = 1; k < 8; k++)
        for (int b = 0; b < 256; b++)
            fox_crc_tables[k][b] = (fox_crc_tables[k - 1][b] >> 8) ^ fox_crc_tables[0][fox_crc_tables[k - 1][b] & 0xff];
}

static inline uint32_t fox_load_le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

// zlib's crc32(crc, p, n) on one thread, eight bytes a step.
static inline uint32_t fox_crc32_serial(uint32_t crc, const unsigned char *p, size_t n) {
    const uint32_t (*t)[256] = fox_crc_tables;
    crc = ~crc;
    for (; n >= 8; n -= 8, p += 8) {
        uint32_t a = fox_load_le32(p) ^ crc, b = fox_load_le32(p + 4);
        crc = t[7][a & 0xff] ^ t[6][(a >> 8) & 0xff] ^ t[5][(a >> 16) & 0xff] ^ t[4][a >> 24] ^
              t[3][b & 0xff] ^ t[2][(b >> 8) & 0xff] ^ t[1][(b >> 16) & 0xff] ^ t[0][b >> 24];
    }
    while (n--) crc = t[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

// Product of the 32 x 32 GF(2) matrix `mat` (one column a word) and the vector `vec`.
static inline uint32_t fox_gf2_times(const uint32_t *mat, uint32_t vec) {
    uint32_t sum = 0;
    for (; vec; vec >>= 1, mat++)
        if (vec & 1) sum ^= *mat;
    return sum;
}

static inline void fox_gf2_square(uint32_t *square, const uint32_t *mat) {
    for (int n = 0; n < 32; n++) square[n] = fox_gf2_times(mat, mat[n]);
}

// CRC of A||B from crc_a = CRC(A), crc_b = CRC(B) and len_b = |B|: crc_a is carried through len_b
// zero bytes by repeated squaring of the one-zero-bit operator (the rule of zlib's crc32_combine).
static inline uint32_t fox_crc32_combine(uint32_t crc_a, uint32_t crc_b, size_t len_b) {
    uint32_t odd[32], even[32];
    if (len_b == 0) return crc_a;
    odd[0] = 0xEDB88320u;
    for (int n = 1; n < 32; n++) odd[n] = 1u << (n - 1);
    fox_gf2_square(even, odd);  // two zero bits
    fox_gf2_square(odd, even);  // four
    for (;;) {
        fox_gf2_square(even, odd);  // one zero byte, then 2, 4, ... bytes
        if (len_b & 1) crc_a = fox_gf2_times(even, crc_a);
        if (!(len_b >>= 1)) break;
        fox_gf2_square(odd, even);
        if (len_b & 1) crc_a = fox_gf2_times(odd, crc_a);
        if (!(len_b >>= 1)) break;
    }
    return crc_a ^ crc_b;
}

// zlib's crc32(crc, p, n): the CRC of the data so far (crc; 0 to start) extended by n bytes at p.
static inline uint32_t fox_crc32(uint32_t crc, const void *data, size_t n) {
    enum { PIECES = 64 };
    const size_t min_parallel = (size_t)16 << 20;
    const unsigned char *p = (const unsigned char *)data;
    fox_crc32_init_tables();
    if (n < min_parallel) return fox_crc32_serial(crc, p, n);
    size_t piece = (n + PIECES - 1) / PIECES;
    uint32_t part[PIECES];
    #pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < PIECES; i++) {
        size_t lo = (size_t)i * piece, hi = lo + piece < n ? lo + piece : n;
        part[i] = lo < n ? fox_crc32_serial(0, p + lo, hi - lo) : 0;
    }
    for (int i = 0; i < PIECES; i++) {
        size_t lo = (size_t)i * piece, hi = lo + piece < n ? lo + piece : n;
        if (lo < n) crc = fox_crc32_combine(crc, part[i], hi - lo);
    }
    return crc;
}

#endif
