// fox/json.h: a JSON reader (RFC 8259, the whole grammar) into a tree, and a JSON string writer, for the
// evaluation's item files (JSON Lines: one value a line) and its result files. Header-only, C11 and C++.
//
// The reader never exits on bad input: fox_json_parse returns 0 and a one-phrase reason ending in the
// byte offset ("expected ':' after an object key at byte 17"), so the caller can name the file and line.
// It reads exactly text[0, len) (no NUL needed), nests at most FOX_JSON_MAX_DEPTH arrays and objects deep,
// and rejects what RFC 8259 does not allow: leading zeros, "+1", ".5", "1.", NaN, unescaped control
// characters, lone surrogates, invalid UTF-8. Strings are decoded to UTF-8 (\u0000 included, so a
// string's len may exceed its strlen); numbers to doubles (beyond a double's range: +-infinity). Out of
// memory is fox_fatal's, through fox_malloc.
//
// The value type is FoxJsonValue, not FoxJson: fox/zarr.h (through dataloader.h and fox/run.h) already
// has a FoxJson, its .zarray cursor, and both headers may share a translation unit.
#ifndef FOX_JSON_H
#define FOX_JSON_H

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io.h"

#define FOX_JSON_MAX_DEPTH 512

typedef enum { FOX_JSON_NULL, FOX_JSON_BOOL, FOX_JSON_NUMBER, FOX_JSON_STRING, FOX_JSON_ARRAY, FOX_JSON_OBJECT } FoxJsonType;

typedef struct FoxJsonValue {
    FoxJsonType type;
    int boolean;                  // FOX_JSON_BOOL: 0 or 1
    double number;                // FOX_JSON_NUMBER
    char *string;                 // FOX_JSON_STRING: UTF-8, len bytes (may hold NULs), then a NUL
    size_t len;
    struct FoxJsonValue *items;   // FOX_JSON_ARRAY: its items; FOX_JSON_OBJECT: its members' values
    char **keys;                  // FOX_JSON_OBJECT: keys[i] (NUL-terminated, keylens[i] bytes) names items[i]
    size_t *keylens;
    int n;                        // the number of items (members), in the document's order
} FoxJsonValue;

// Where the reader is, and where its error message goes.
typedef struct {
    const char *start, *p, *end;
    char *err;
    size_t errcap;
    int depth;
} FoxJsonReader;

// Writes "<reason> at byte <offset of at>" into the reader's err; returns 0 for the caller to return.
static inline FOX_PRINTF(3, 4) int fox_json_error(const FoxJsonReader *r, const char *at, const char *fmt, ...) {
    if (!r->errcap) return 0;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(r->err, r->errcap, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < r->errcap)
        snprintf(r->err + n, r->errcap - (size_t)n, " at byte %zu", (size_t)(at - r->start));
    return 0;
}

// The error for a byte that cannot start a value (or for no byte at all).
static inline int fox_json_error_unexpected(const FoxJsonReader *r) {
    if (r->p == r->end) return fox_json_error(r, r->p, "unexpected end of input");
    unsigned char c = (unsigned char)*r->p;
    if (c > 0x20 && c < 0x7f) return fox_json_error(r, r->p, "unexpected character '%c'", c);
    return fox_json_error(r, r->p, "unexpected byte 0x%02x", c);
}

static inline void fox_json_skip_space(FoxJsonReader *r) {
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r')) r->p++;
}

// 1 and moves past c when it is the next byte after white space; 0 otherwise.
static inline int fox_json_accept(FoxJsonReader *r, char c) {
    fox_json_skip_space(r);
    if (r->p == r->end || *r->p != c) return 0;
    r->p++;
    return 1;
}

// The length of the well-formed UTF-8 sequence starting s (n > 0 bytes there): 1 to 4, or 0 when it is
// not one (a stray continuation byte, an overlong form, a surrogate, beyond U+10FFFF, cut short).
static inline int fox_json_utf8_len(const unsigned char *s, size_t n) {
    unsigned c = s[0], lo = 0x80, hi = 0xbf;  // the range of the second byte
    int len;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) len = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        if (c == 0xe0) lo = 0xa0;  // not overlong
        if (c == 0xed) hi = 0x9f;  // not a surrogate
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        if (c == 0xf0) lo = 0x90;  // not overlong
        if (c == 0xf4) hi = 0x8f;  // at most U+10FFFF
    } else return 0;
    if (n < (size_t)len || s[1] < lo || s[1] > hi) return 0;
    for (int i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xbf) return 0;
    return len;
}

// Writes code point cp (at most U+10FFFF, not a surrogate) as UTF-8 at out; returns the bytes written.
static inline size_t fox_json_put_utf8(char *out, unsigned cp) {
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) { o[0] = (unsigned char)cp; return 1; }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xc0 | cp >> 6);
        o[1] = (unsigned char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xe0 | cp >> 12);
        o[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3f));
        o[2] = (unsigned char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (unsigned char)(0xf0 | cp >> 18);
    o[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3f));
    o[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3f));
    o[3] = (unsigned char)(0x80 | (cp & 0x3f));
    return 4;
}

// Reads the 4 hex digits of a \u escape at p (before end) into *cp; 0 if they are not there.
static inline int fox_json_hex4(const char *p, const char *end, unsigned *cp) {
    if (end - p < 4) return 0;
    *cp = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        unsigned d = c >= '0' && c <= '9' ? (unsigned)(c - '0')
                   : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                   : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10) : 16u;
        if (d == 16) return 0;
        *cp = *cp << 4 | d;
    }
    return 1;
}

// Decodes the \u escape at p (its backslash; before close, the string's closing quote), with the second
// half of a surrogate pair, into UTF-8 at *out; returns the bytes of input read, or 0 on an error.
static inline size_t fox_json_unicode_escape(const FoxJsonReader *r, const char *p, const char *close, char **out) {
    unsigned cp, lo;
    if (!fox_json_hex4(p + 2, close, &cp)) return fox_json_error(r, p, "invalid \\u escape (expected 4 hex digits)");
    if (cp >= 0xdc00 && cp <= 0xdfff) return fox_json_error(r, p, "lone surrogate \\u%04x in a string", cp);
    if (cp < 0xd800 || cp > 0xdbff) { *out += fox_json_put_utf8(*out, cp); return 6; }
    if (close - p < 12 || p[6] != '\\' || p[7] != 'u' || !fox_json_hex4(p + 8, close, &lo) || lo < 0xdc00 || lo > 0xdfff)
        return fox_json_error(r, p, "lone surrogate \\u%04x in a string", cp);
    *out += fox_json_put_utf8(*out, 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00));
    return 12;
}

// The closing quote of the string whose contents start at p, or NULL if the input ends first.
static inline const char *fox_json_string_end(const char *p, const char *end) {
    for (; p < end; p++) {
        if (*p == '"') return p;
        if (*p == '\\' && ++p == end) break;  // the escaped byte cannot close the string
    }
    return NULL;
}

// The two-character escapes: the letter after the backslash, the byte it stands for (same index).
static const char fox_json_escape_letters[] = "\"\\/bfnrt";
static const char fox_json_escape_bytes[] = "\"\\/\b\f\n\r\t";

// Decodes the string at r->p (its opening quote) into a malloc'd, NUL-terminated *out of *len bytes.
static inline int fox_json_parse_string(FoxJsonReader *r, char **out, size_t *len) {
    const char *open = r->p, *p = open + 1, *close = fox_json_string_end(p, r->end);
    if (!close) return fox_json_error(r, open, "unterminated string starting");
    char *s = (char *)fox_malloc((size_t)(close - p) + 1), *o = s;  // decoding never lengthens
    while (p < close) {
        unsigned char c = (unsigned char)*p;
        size_t step = 1;
        if (c == '\\') {  // fox_json_string_end skipped the byte after it: p[1] is before close
            const char *letter = p[1] ? strchr(fox_json_escape_letters, p[1]) : NULL;
            if (p[1] == 'u') step = fox_json_unicode_escape(r, p, close, &o);
            else if (letter) { *o++ = fox_json_escape_bytes[letter - fox_json_escape_letters]; step = 2; }
            else step = fox_json_error(r, p, "invalid escape '\\%c' in a string", p[1] > 0x20 && p[1] < 0x7f ? p[1] : '?');
        } else if (c < 0x20) step = fox_json_error(r, p, "unescaped control character 0x%02x in a string", c);
        else if (c >= 0x80) {
            step = (size_t)fox_json_utf8_len((const unsigned char *)p, (size_t)(close - p));
            if (step) memcpy(o, p, step);
            else fox_json_error(r, p, "invalid UTF-8 in a string");
            o += step;
        } else *o++ = (char)c;
        if (!step) { free(s); return 0; }
        p += step;
    }
    *o = 0;
    *out = s;
    *len = (size_t)(o - s);
    r->p = close + 1;
    return 1;
}

// Past the decimal digits at p (before end).
static inline const char *fox_json_skip_digits(const char *p, const char *end) {
    while (p < end && *p >= '0' && *p <= '9') p++;
    return p;
}

// The double the number text s[0, n) (grammar already checked) denotes: strtod on a NUL-terminated copy
// (in the C locale, whose decimal point is '.': the trainers never call setlocale).
static inline double fox_json_to_double(const char *s, size_t n) {
    char small[64], *buf = n < sizeof small ? small : (char *)fox_malloc(n + 1);
    memcpy(buf, s, n);
    buf[n] = 0;
    double d = strtod(buf, NULL);
    if (buf != small) free(buf);
    return d;
}

// A number: -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?
static inline int fox_json_parse_number(FoxJsonReader *r, FoxJsonValue *v) {
    const char *s = r->p, *p = s, *end = r->end, *q;
    if (*p == '-') p++;
    if ((q = fox_json_skip_digits(p, end)) == p) return fox_json_error(r, p, "expected a digit in a number");
    if (*p == '0' && q - p > 1) return fox_json_error(r, p, "leading zero in a number");
    p = q;
    if (p < end && *p == '.') {
        if ((q = fox_json_skip_digits(p + 1, end)) == p + 1) return fox_json_error(r, q, "expected a digit after '.' in a number");
        p = q;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        if ((q = fox_json_skip_digits(p, end)) == p) return fox_json_error(r, p, "expected a digit in a number's exponent");
        p = q;
    }
    v->type = FOX_JSON_NUMBER;
    v->number = fox_json_to_double(s, (size_t)(p - s));
    r->p = p;
    return 1;
}

// true, false or null at r->p.
static inline int fox_json_parse_literal(FoxJsonReader *r, FoxJsonValue *v) {
    static const char *const words[3] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(words[i]);
        if ((size_t)(r->end - r->p) >= n && !memcmp(r->p, words[i], n)) {
            v->type = i < 2 ? FOX_JSON_BOOL : FOX_JSON_NULL;
            v->boolean = i == 0;
            r->p += n;
            return 1;
        }
    }
    return fox_json_error(r, r->p, "invalid literal (expected true, false or null)");
}

static inline int fox_json_parse_value(FoxJsonReader *r, FoxJsonValue *v);

// Makes room for one more item in a container of n items and capacity *cap (keys too for an object);
// the new item is an empty null (and key), counted in n at once so that a failed parse frees it.
static inline int fox_json_append(const FoxJsonReader *r, FoxJsonValue *c, int *cap) {
    if (c->n == INT_MAX) return fox_json_error(r, r->p, "more than %d items in one array or object", INT_MAX);
    if (c->n == *cap) {
        *cap = *cap < INT_MAX / 2 ? (*cap ? 2 * *cap : 4) : INT_MAX;
        c->items = (FoxJsonValue *)fox_realloc(c->items, (size_t)*cap * sizeof *c->items);
        if (c->type == FOX_JSON_OBJECT) {
            c->keys = (char **)fox_realloc(c->keys, (size_t)*cap * sizeof *c->keys);
            c->keylens = (size_t *)fox_realloc(c->keylens, (size_t)*cap * sizeof *c->keylens);
        }
    }
    memset(&c->items[c->n], 0, sizeof *c->items);
    if (c->type == FOX_JSON_OBJECT) { c->keys[c->n] = NULL; c->keylens[c->n] = 0; }
    c->n++;
    return 1;
}

// One member "key": value of an object, appended to v.
static inline int fox_json_parse_member(FoxJsonReader *r, FoxJsonValue *v, int *cap) {
    if (r->p == r->end || *r->p != '"') return fox_json_error(r, r->p, "expected a string key in an object");
    if (!fox_json_append(r, v, cap)) return 0;
    int i = v->n - 1;
    if (!fox_json_parse_string(r, &v->keys[i], &v->keylens[i])) return 0;
    if (!fox_json_accept(r, ':')) return fox_json_error(r, r->p, "expected ':' after an object key");
    fox_json_skip_space(r);
    return fox_json_parse_value(r, &v->items[i]);
}

// An array or an object at r->p (its '[' or '{'), one level deeper.
static inline int fox_json_parse_container(FoxJsonReader *r, FoxJsonValue *v) {
    int object = *r->p == '{', cap = 0;
    if (r->depth == FOX_JSON_MAX_DEPTH) return fox_json_error(r, r->p, "nesting deeper than %d", FOX_JSON_MAX_DEPTH);
    v->type = object ? FOX_JSON_OBJECT : FOX_JSON_ARRAY;
    r->p++;
    if (fox_json_accept(r, object ? '}' : ']')) return 1;
    r->depth++;
    for (;;) {
        fox_json_skip_space(r);
        int ok = object ? fox_json_parse_member(r, v, &cap)
                        : fox_json_append(r, v, &cap) && fox_json_parse_value(r, &v->items[v->n - 1]);
        if (!ok) return 0;
        if (fox_json_accept(r, ',')) continue;
        if (fox_json_accept(r, object ? '}' : ']')) break;
        return fox_json_error(r, r->p, object ? "expected ',' or '}' in an object" : "expected ',' or ']' in an array");
    }
    r->depth--;
    return 1;
}

// One value at r->p (white space before it already skipped) into v, which starts as an empty null.
static inline int fox_json_parse_value(FoxJsonReader *r, FoxJsonValue *v) {
    if (r->p == r->end) return fox_json_error_unexpected(r);
    char c = *r->p;
    if (c == '{' || c == '[') return fox_json_parse_container(r, v);
    if (c == '"') {
        v->type = FOX_JSON_STRING;
        return fox_json_parse_string(r, &v->string, &v->len);
    }
    if (c == '-' || (c >= '0' && c <= '9')) return fox_json_parse_number(r, v);
    if (c == 't' || c == 'f' || c == 'n') return fox_json_parse_literal(r, v);
    return fox_json_error_unexpected(r);
}

// Frees what v holds (recursively) and leaves it an empty null.
static inline void fox_json_free(FoxJsonValue *v) {
    for (int i = 0; i < v->n; i++) {
        fox_json_free(&v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->keylens);
    free(v->string);
    memset(v, 0, sizeof *v);
}

// Parses exactly one JSON value from text[0, len) (white space around it allowed, anything else after
// it an error). Returns 1 with the value in *v (free it with fox_json_free), or 0 with *v an empty null
// and "<reason> at byte <offset>" in err (errcap bytes, truncated to fit; errcap 0: no message).
static inline int fox_json_parse(const char *text, size_t len, FoxJsonValue *v, char *err, size_t errcap) {
    FoxJsonReader r = {text, text, text + len, err, errcap, 0};
    memset(v, 0, sizeof *v);
    if (errcap) err[0] = 0;
    fox_json_skip_space(&r);
    int ok = fox_json_parse_value(&r, v);
    if (ok) {
        fox_json_skip_space(&r);
        if (r.p != r.end) ok = fox_json_error(&r, r.p, "trailing characters after the value");
    }
    if (!ok) fox_json_free(v);
    return ok;
}

// The value of obj's first member named key (NUL-terminated), or NULL if there is none or obj is not an object.
static inline const FoxJsonValue *fox_json_get(const FoxJsonValue *obj, const char *key) {
    if (!obj || obj->type != FOX_JSON_OBJECT) return NULL;
    size_t n = strlen(key);
    for (int i = 0; i < obj->n; i++)
        if (obj->keylens[i] == n && !memcmp(obj->keys[i], key, n)) return &obj->items[i];
    return NULL;
}

// 1 with *out set if v is a number whose value is an integer within long long's range (3, 3.0, 3e0, -0);
// 0 otherwise (3.5, 1e300, not a number). The value is the parsed double's: beyond 2^53 text rounds first.
static inline int fox_json_int(const FoxJsonValue *v, long long *out) {
    if (!v || v->type != FOX_JSON_NUMBER) return 0;
    double d = v->number;
    if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0) || (double)(long long)d != d) return 0;
    *out = (long long)d;
    return 1;
}

// Writes s[0, len) to f as a JSON string literal, quotes included: '"', '\' and control characters
// escaped (\n, \t, ..., \u001f), well-formed UTF-8 as it is, each byte of anything else as \ufffd, so the
// output is valid JSON for any bytes. Write errors are f's (ferror), for the caller's checked close.
static inline void fox_json_write_string(FILE *f, const char *s, size_t len) {
    const unsigned char *u = (const unsigned char *)s;
    fputc('"', f);
    for (size_t i = 0; i < len;) {
        unsigned c = u[i];
        const char *named = c && c != '/' ? strchr(fox_json_escape_bytes, (int)c) : NULL;  // '/' needs none
        int n = 1;
        if (named) fprintf(f, "\\%c", fox_json_escape_letters[named - fox_json_escape_bytes]);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else if ((n = fox_json_utf8_len(u + i, len - i))) fwrite(u + i, 1, (size_t)n, f);
        else { fputs("\\ufffd", f); n = 1; }
        i += (size_t)n;
    }
    fputc('"', f);
}

#endif
