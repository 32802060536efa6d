// test/test_json.c: fox/json.h, the evaluation's JSON reader and string writer. Every value type;
// HellaSwag's and the plain form's item lines; escapes and surrogate pairs decoded to the exact bytes, \u0000
// inside a string; each class of bad input refused with its reason and byte offset; trailing garbage;
// nesting 10^5 deep refused, not a stack overflow; input read only within its length; fox_json_int; the
// string writer's output read back (control characters, quotes, UTF-8, invalid bytes as U+FFFD); a seeded
// fuzz loop over mutated documents and random bytes, each result written back out and read again. Run
// it under -fsanitize=address,undefined or valgrind to see that no input leaks or reads out of bounds.
// Usage: gcc -std=c11 -O1 -g -Wall -Wextra -Werror -I. -o /tmp/test_json test/test_json.c -lm && /tmp/test_json
#ifndef _DEFAULT_SOURCE
#define _DEFAULT_SOURCE  // fileno (fox/io.h) and d_type (fox/zarr.h), as the Makefile's CFLAGS give
#endif
#ifndef FOX_NO_BLOSC
#define FOX_NO_BLOSC  // only zarr.h's names are needed here, not its decompressor
#endif
#include <stdint.h>

#include "fox/zarr.h"  // its FoxJson (the .zarray cursor) shares translation units with fox/json.h
#include "fox/json.h"
#include "test/testing.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;

static uint64_t next_random(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static size_t random_below(size_t n) { return (size_t)(next_random() % n); }

// Parses text[0, len) from a malloc'd copy of exactly len bytes, so a read past the end is the
// sanitizer's error (a literal's NUL would hide it).
static int parse_exact(const char *text, size_t len, FoxJsonValue *v, char *err, size_t errcap) {
    char *copy = (char *)fox_malloc(len);
    memcpy(copy, text, len);
    int ok = fox_json_parse(copy, len, v, err, errcap);
    free(copy);
    return ok;
}

static int parse(const char *text, FoxJsonValue *v) {
    char err[128];
    int ok = parse_exact(text, strlen(text), v, err, sizeof err);
    if (!ok) printf("     (%s: %s)\n", text, err);
    return ok;
}

static int is_empty_null(const FoxJsonValue *v) {
    return v->type == FOX_JSON_NULL && !v->items && !v->keys && !v->keylens && !v->string && v->n == 0;
}

static int string_is(const FoxJsonValue *v, const char *bytes, size_t len) {
    return v && v->type == FOX_JSON_STRING && v->len == len && !memcmp(v->string, bytes, len) && v->string[len] == 0;
}

static int int_is(const FoxJsonValue *v, long long want) {
    long long got = 0;
    return fox_json_int(v, &got) && got == want;
}

// The error fox_json_parse gives text[0, len) (""; a FAIL line if it parses).
static const char *error_of(const char *text, size_t len) {
    static char err[160];
    FoxJsonValue v;
    if (parse_exact(text, len, &v, err, sizeof err)) {
        fox_json_free(&v);
        return "";
    }
    return is_empty_null(&v) ? err : "(the value was not left empty)";
}

// A PASS line when text is refused with exactly the message want.
static void check_error(const char *what, const char *text, size_t len, const char *want) {
    const char *got = error_of(text, len);
    check(!strcmp(got, want), "%-40s -> \"%s\"%s%s", what, got, strcmp(got, want) ? ", expected " : "", strcmp(got, want) ? want : "");
}

static void test_values(void) {
    FoxJsonValue v;
    check(parse(" null ", &v) && v.type == FOX_JSON_NULL, "null");
    check(parse("true", &v) && v.type == FOX_JSON_BOOL && v.boolean == 1, "true");
    check(parse("\t\r\nfalse\n", &v) && v.type == FOX_JSON_BOOL && v.boolean == 0, "false, with white space around");
    const char *numbers[] = {"0", "-0", "7", "-12", "1.5", "-1.25e2", "1E+2", "2e-3", "0.0625", "123456789012"};
    const double values[] = {0, -0.0, 7, -12, 1.5, -125, 100, 0.002, 0.0625, 123456789012.0};
    int all = 1;
    for (int i = 0; i < 10; i++) {
        all &= parse(numbers[i], &v) && v.type == FOX_JSON_NUMBER && v.number == values[i];
        fox_json_free(&v);
    }
    check(all, "numbers: 0 -0 7 -12 1.5 -1.25e2 1E+2 2e-3 0.0625 123456789012");
    check(parse("-0", &v) && signbit(v.number), "-0 keeps its sign");
    check(parse("1e400", &v) && isinf(v.number) && v.number > 0, "1e400: beyond a double, +infinity");
    char digits[1002] = "-1";
    memset(digits + 2, '0', 999);
    check(parse_exact(digits, 1001, &v, NULL, 0) && isinf(v.number) && v.number < 0, "a 1001-character number: -infinity");
    check(parse("\"\"", &v) && string_is(&v, "", 0), "empty string");
    fox_json_free(&v);
    check(parse("\"hello, world\"", &v) && string_is(&v, "hello, world", 12), "string");
    fox_json_free(&v);
    check(parse("[]", &v) && v.type == FOX_JSON_ARRAY && v.n == 0 && !v.items, "empty array");
    check(parse("{ }", &v) && v.type == FOX_JSON_OBJECT && v.n == 0 && !fox_json_get(&v, "a"), "empty object");
    check(parse("[1, \"two\", [3, [true]], {\"k\": null}, false]", &v) && v.type == FOX_JSON_ARRAY && v.n == 5 &&
              int_is(&v.items[0], 1) && string_is(&v.items[1], "two", 3) && v.items[2].n == 2 &&
              v.items[2].items[1].items[0].boolean == 1 && fox_json_get(&v.items[3], "k")->type == FOX_JSON_NULL &&
              v.items[4].type == FOX_JSON_BOOL,
          "nested array: items in order, each of its type");
    fox_json_free(&v);
    check(is_empty_null(&v), "fox_json_free leaves an empty null");
    check(parse("{\"a\": 1, \"b\": {\"c\": [2]}, \"a\": 3}", &v) && v.n == 3 && int_is(fox_json_get(&v, "a"), 1) &&
              int_is(&fox_json_get(fox_json_get(&v, "b"), "c")->items[0], 2) && !strcmp(v.keys[2], "a") && int_is(&v.items[2], 3),
          "object: members in order, duplicate key allowed, fox_json_get gives the first");
    check(!fox_json_get(&v, "missing") && !fox_json_get(fox_json_get(&v, "a"), "a") && !fox_json_get(NULL, "a"),
          "fox_json_get: NULL for an absent key, a non-object, NULL");
    fox_json_free(&v);
    char *big = (char *)fox_malloc(700000);
    size_t n = 0;
    big[n++] = '[';
    for (int i = 0; i < 100000; i++) n += (size_t)snprintf(big + n, 700000 - n, "%s%d", i ? "," : "", i);
    big[n++] = ']';
    FoxJsonValue w;
    char err[128];
    int ok = parse_exact(big, n, &w, err, sizeof err) && w.n == 100000 && int_is(&w.items[99999], 99999);
    check(ok, "an array of 100000 numbers");
    fox_json_free(&w);
    free(big);
}

static void test_items(void) {
    const char *hellaswag =
        "{\"ind\": 24, \"activity_label\": \"Roof shingle removal\", \"ctx_a\": \"A man is sitting on a roof.\", "
        "\"ctx_b\": \"he\", \"ctx\": \"A man is sitting on a roof. he\", \"split\": \"val\", \"split_type\": \"indomain\", "
        "\"label\": 3, \"endings\": [\"is using wrap to wrap a pair of skis.\", \"is ripping level tiles off.\", "
        "\"is holding a rubik's cube.\", \"starts pulling up roofing on a roof.\"], \"source_id\": \"activitynet~v_-JhWjGDPHMY\"}";
    FoxJsonValue v;
    check(parse(hellaswag, &v) && string_is(fox_json_get(&v, "ctx"), "A man is sitting on a roof. he", 30) &&
              fox_json_get(&v, "endings")->n == 4 &&
              string_is(&fox_json_get(&v, "endings")->items[3], "starts pulling up roofing on a roof.", 36) &&
              int_is(fox_json_get(&v, "label"), 3),
          "HellaSwag line: ctx, 4 endings, label 3");
    fox_json_free(&v);
    check(parse("{\"context\": \"The capital of France is\", \"choices\": [\" Paris\", \" Rome\"], \"label\": 0}", &v) &&
              string_is(fox_json_get(&v, "context"), "The capital of France is", 24) &&
              string_is(&fox_json_get(&v, "choices")->items[1], " Rome", 5) && int_is(fox_json_get(&v, "label"), 0),
          "plain line, text: context, choices, label 0");
    fox_json_free(&v);
    check(parse("{\"context\": [464, 3139, 286], \"choices\": [[6342], [10598, 12]], \"label\": 1}", &v) &&
              fox_json_get(&v, "context")->n == 3 && int_is(&fox_json_get(&v, "context")->items[2], 286) &&
              fox_json_get(&v, "choices")->items[1].n == 2 && int_is(&fox_json_get(&v, "choices")->items[1].items[0], 10598) &&
              int_is(fox_json_get(&v, "label"), 1),
          "plain line, tokens: context and choices as int arrays");
    fox_json_free(&v);
}

static void test_strings(void) {
    FoxJsonValue v;
    check(parse("\"\\\" \\\\ \\/ \\b \\f \\n \\r \\t\"", &v) && string_is(&v, "\" \\ / \b \f \n \r \t", 15), "the two-character escapes");
    fox_json_free(&v);
    check(parse("\"\\u0041\\u00e9\\u20AC\\uffff\"", &v) && string_is(&v, "A\xc3\xa9\xe2\x82\xac\xef\xbf\xbf", 9),
          "\\u escapes of 1, 2 and 3 UTF-8 bytes (hex either case)");
    fox_json_free(&v);
    check(parse("\"\\ud83d\\ude00 \\uD834\\uDD1E \\udbff\\udfff\"", &v) &&
              string_is(&v, "\xf0\x9f\x98\x80 \xf0\x9d\x84\x9e \xf4\x8f\xbf\xbf", 14),
          "surrogate pairs: U+1F600, U+1D11E, U+10FFFF");
    fox_json_free(&v);
    check(parse("\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \x7f\"", &v) && string_is(&v, "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \x7f", 16),
          "UTF-8 of 2, 3 and 4 bytes and DEL as they are");
    fox_json_free(&v);
    check(parse("\"a\\u0000b\"", &v) && string_is(&v, "a\0b", 3) && strlen(v.string) == 1, "\\u0000 inside a string: len 3, strlen 1");
    fox_json_free(&v);
    check(parse("{\"a\\u0000b\": 1, \"a\": 2}", &v) && v.keylens[0] == 3 && int_is(fox_json_get(&v, "a"), 2),
          "a key holding \\u0000 is not the key before its NUL");
    fox_json_free(&v);
}

static void test_errors(void) {
    struct { const char *what, *text, *want; } cases[] = {
        {"empty input", "", "unexpected end of input at byte 0"},
        {"only white space", " \n\t", "unexpected end of input at byte 3"},
        {"array cut short", "[1,", "unexpected end of input at byte 3"},
        {"missing ':'", "{\"ctx\" \"a\"}", "expected ':' after an object key at byte 7"},
        {"missing ',' in an array", "[1 2]", "expected ',' or ']' in an array at byte 3"},
        {"missing ',' in an object", "{\"a\":1 \"b\":2}", "expected ',' or '}' in an object at byte 7"},
        {"unclosed array", "[1", "expected ',' or ']' in an array at byte 2"},
        {"key not a string", "{1:2}", "expected a string key in an object at byte 1"},
        {"trailing comma, array", "[1,]", "unexpected character ']' at byte 3"},
        {"trailing comma, object", "{\"a\":1,}", "expected a string key in an object at byte 7"},
        {"single quotes", "['a']", "unexpected character ''' at byte 1"},
        {"leading zero", "012", "leading zero in a number at byte 0"},
        {"leading zero, negative", "[-01]", "leading zero in a number at byte 2"},
        {"leading zeros", "00", "leading zero in a number at byte 0"},
        {"'+' sign", "+1", "unexpected character '+' at byte 0"},
        {"no integer part", ".5", "unexpected character '.' at byte 0"},
        {"no fraction digits", "1.", "expected a digit after '.' in a number at byte 2"},
        {"no fraction digits, exponent", "1.e5", "expected a digit after '.' in a number at byte 2"},
        {"no exponent digits", "1e", "expected a digit in a number's exponent at byte 2"},
        {"no exponent digits, signed", "1e+", "expected a digit in a number's exponent at byte 3"},
        {"lone minus", "-", "expected a digit in a number at byte 1"},
        {"NaN", "NaN", "unexpected character 'N' at byte 0"},
        {"Infinity", "Infinity", "unexpected character 'I' at byte 0"},
        {"-Infinity", "-Infinity", "expected a digit in a number at byte 1"},
        {"hex number", "0x10", "trailing characters after the value at byte 1"},
        {"bad literal", "[tru]", "invalid literal (expected true, false or null) at byte 1"},
        {"literal cut short", "nul", "invalid literal (expected true, false or null) at byte 0"},
        {"capitalised literal", "True", "unexpected character 'T' at byte 0"},
        {"unterminated string", "[\"abc", "unterminated string starting at byte 1"},
        {"string ending in an escaped quote", "\"abc\\\"", "unterminated string starting at byte 0"},
        {"string ending in a backslash", "\"abc\\", "unterminated string starting at byte 0"},
        {"unknown escape", "\"a\\qb\"", "invalid escape '\\q' in a string at byte 2"},
        {"escaped single quote", "\"\\'\"", "invalid escape '\\'' in a string at byte 1"},
        {"short \\u escape", "\"\\u12\"", "invalid \\u escape (expected 4 hex digits) at byte 1"},
        {"\\u escape, not hex", "\"x\\u12G4\"", "invalid \\u escape (expected 4 hex digits) at byte 2"},
        {"lone high surrogate", "\"\\ud800\"", "lone surrogate \\ud800 in a string at byte 1"},
        {"lone low surrogate", "\"ab\\uDC00\"", "lone surrogate \\udc00 in a string at byte 3"},
        {"high surrogate, then a letter", "\"\\ud83dx\"", "lone surrogate \\ud83d in a string at byte 1"},
        {"high surrogate, then not a low one", "\"\\ud83d\\u0041\"", "lone surrogate \\ud83d in a string at byte 1"},
        {"two high surrogates", "\"\\ud83d\\ud83d\"", "lone surrogate \\ud83d in a string at byte 1"},
        {"high surrogate, bad second escape", "\"\\ud83d\\uzzzz\"", "lone surrogate \\ud83d in a string at byte 1"},
        {"raw newline in a string", "\"a\nb\"", "unescaped control character 0x0a in a string at byte 2"},
        {"raw tab in a string", "{\"k\": \"\t\"}", "unescaped control character 0x09 in a string at byte 7"},
        {"raw 0x01 in a key", "{\"\x01\": 1}", "unescaped control character 0x01 in a string at byte 2"},
        {"invalid byte 0xff", "\"\xff\"", "invalid UTF-8 in a string at byte 1"},
        {"stray continuation byte", "\"ab\x80\"", "invalid UTF-8 in a string at byte 3"},
        {"overlong '/'", "\"\xc0\xaf\"", "invalid UTF-8 in a string at byte 1"},
        {"overlong 3-byte", "\"\xe0\x80\xaf\"", "invalid UTF-8 in a string at byte 1"},
        {"UTF-8 surrogate", "\"\xed\xa0\x80\"", "invalid UTF-8 in a string at byte 1"},
        {"beyond U+10FFFF", "\"\xf4\x90\x80\x80\"", "invalid UTF-8 in a string at byte 1"},
        {"0xf5 lead byte", "\"\xf5\x80\x80\x80\"", "invalid UTF-8 in a string at byte 1"},
        {"UTF-8 cut by the quote", "\"\xe2\x82\"", "invalid UTF-8 in a string at byte 1"},
        {"no-break space as white space", "\xc2\xa0" "1", "unexpected byte 0xc2 at byte 0"},
        {"trailing garbage", "{} x", "trailing characters after the value at byte 3"},
        {"two values", "1 2", "trailing characters after the value at byte 2"},
        {"extra bracket", "[1]]", "trailing characters after the value at byte 3"},
        {"literal run on", "nulll", "trailing characters after the value at byte 4"},
        {"two strings", "\"a\"\"b\"", "trailing characters after the value at byte 3"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_error(cases[i].what, cases[i].text, strlen(cases[i].text), cases[i].want);
    check_error("NUL byte after the value", "[1]\0", 4, "trailing characters after the value at byte 3");
    check_error("NUL byte as a value", "\0", 1, "unexpected byte 0x00 at byte 0");
    check_error("raw NUL in a string", "\"a\0\"", 4, "unescaped control character 0x00 in a string at byte 2");

    FoxJsonValue v;
    char small[12];
    check(!fox_json_parse("[1 2]", 5, &v, small, sizeof small) && !strcmp(small, "expected ',"), "a short err buffer gets the message cut to fit");
    check(!fox_json_parse("[1 2]", 5, &v, NULL, 0) && is_empty_null(&v), "errcap 0: no message, still refused");
    check(parse_exact("[1,2]xyz", 5, &v, small, sizeof small) && v.n == 2, "only text[0, len) is read: \"[1,2]\" of \"[1,2]xyz\"");
    fox_json_free(&v);
    check(parse_exact("123456", 3, &v, small, sizeof small) && int_is(&v, 123), "a number ends at len: \"123\" of \"123456\"");
    check_error("a string ends at len", "\"abc\"", 4, "unterminated string starting at byte 0");
    check_error("a literal ends at len", "true", 3, "invalid literal (expected true, false or null) at byte 0");
}

// n copies of open, then n of close: a document nested n deep.
static char *nested(int n, const char *open, const char *close, size_t *len) {
    size_t lo = strlen(open), lc = strlen(close);
    char *s = (char *)fox_malloc((size_t)n * (lo + lc) + 1), *p = s;
    for (int i = 0; i < n; i++, p += lo) memcpy(p, open, lo);
    for (int i = 0; i < n; i++, p += lc) memcpy(p, close, lc);
    *len = (size_t)(p - s);
    return s;
}

static void test_depth(void) {
    size_t len;
    char err[128];
    FoxJsonValue v;
    char *s = nested(FOX_JSON_MAX_DEPTH, "[", "]", &len);
    check(parse_exact(s, len, &v, err, sizeof err) && v.items[0].items[0].n == 1, "%d nested arrays parse", FOX_JSON_MAX_DEPTH);
    fox_json_free(&v);
    free(s);
    s = nested(FOX_JSON_MAX_DEPTH + 1, "[", "]", &len);
    check_error("513 nested arrays", s, len, "nesting deeper than 512 at byte 512");
    free(s);
    s = nested(100000, "[", "", &len);
    check_error("10^5 '['", s, len, "nesting deeper than 512 at byte 512");
    free(s);
    s = nested(100000, "{\"a\":", "}", &len);
    check_error("10^5 nested objects", s, len, "nesting deeper than 512 at byte 2560");
    free(s);
    s = nested(100000, "[{\"a\":", "}]", &len);
    check_error("10^5 arrays and objects alternating", s, len, "nesting deeper than 512 at byte 1536");
    free(s);
}

static void test_int(void) {
    const char *texts[] = {"3", "3.0", "30e-1", "-0", "-3", "3.5", "1e300", "1e400", "-9223372036854775808", "9223372036854775807", "\"3\"", "[3]"};
    const int ok[] = {1, 1, 1, 1, 1, 0, 0, 0, 1, 0, 0, 0};
    const long long want[] = {3, 3, 3, 0, -3, 0, 0, 0, LLONG_MIN, 0, 0, 0};
    for (int i = 0; i < 12; i++) {
        FoxJsonValue v;
        long long got = 42;
        int parsed = parse(texts[i], &v), is_int = fox_json_int(&v, &got);
        check(parsed && is_int == ok[i] && (is_int ? got == want[i] : got == 42), "fox_json_int(%s): %s", texts[i],
              is_int ? "an integer" : "not an integer (*out untouched)");
        fox_json_free(&v);
    }
    long long got;
    check(!fox_json_int(NULL, &got), "fox_json_int(NULL): not an integer");
}

// What fox_json_write_string writes for s[0, len), read back whole.
static char *written(const char *s, size_t len, size_t *out_len) {
    FILE *f = tmpfile();
    if (!f) fox_fatal("tmpfile: %s", strerror(errno));
    fox_json_write_string(f, s, len);
    long n = ftell(f);
    rewind(f);
    char *text = (char *)fox_malloc((size_t)n + 1);
    fox_fread(text, 1, (size_t)n, f, "the tmpfile");
    text[n] = 0;
    fclose(f);
    *out_len = (size_t)n;
    return text;
}

static void check_written(const char *what, const char *s, size_t len, const char *decoded, size_t decoded_len) {
    size_t n;
    char *text = written(s, len, &n), err[128];
    FoxJsonValue v;
    int ok = parse_exact(text, n, &v, err, sizeof err);
    check(ok && string_is(&v, decoded, decoded_len), "write_string round trip: %-34s %s", what, ok ? "" : err);
    fox_json_free(&v);
    free(text);
}

static void test_writer(void) {
    size_t n;
    char *text = written("a\"b\\c/\n\t\x01\x1f\x7f", 11, &n);
    check(!strcmp(text, "\"a\\\"b\\\\c/\\n\\t\\u0001\\u001f\x7f\""), "write_string text: %s", text);
    free(text);
    text = written("a\xff\xe2\x82", 4, &n);
    check(!strcmp(text, "\"a\\ufffd\\ufffd\\ufffd\""), "write_string text, invalid bytes: %s", text);
    free(text);
    check_written("ASCII", "The capital of France is Paris.", 31, "The capital of France is Paris.", 31);
    check_written("empty", "", 0, "", 0);
    check_written("control characters, NUL", "\x01\b\f\n\r\t\x1f\0z", 9, "\x01\b\f\n\r\t\x1f\0z", 9);
    check_written("quotes, backslash, slash", "say \"hi\" \\ / \\n", 15, "say \"hi\" \\ / \\n", 15);
    check_written("2- and 3-byte UTF-8", "caf\xc3\xa9 \xe2\x82\xac", 9, "caf\xc3\xa9 \xe2\x82\xac", 9);
    check_written("emoji, U+10FFFF", "\xf0\x9f\x98\x80\xf4\x8f\xbf\xbf", 8, "\xf0\x9f\x98\x80\xf4\x8f\xbf\xbf", 8);
    check_written("invalid 0xff", "a\xff" "b", 3, "a\xef\xbf\xbd" "b", 5);
    check_written("stray continuation", "\x80", 1, "\xef\xbf\xbd", 3);
    check_written("overlong (2 bytes)", "\xc0\xaf", 2, "\xef\xbf\xbd\xef\xbf\xbd", 6);
    check_written("UTF-8 surrogate (3 bytes)", "\xed\xa0\x80", 3, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 9);
    check_written("beyond U+10FFFF (4 bytes)", "\xf4\x90\x80\x80", 4,
                  "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 12);
    check_written("cut short at the end", "ok\xe2\x82", 4, "ok\xef\xbf\xbd\xef\xbf\xbd", 8);
    check_written("cut short by ASCII", "\xf0\x9f" "a", 3, "\xef\xbf\xbd\xef\xbf\xbd" "a", 7);
}

// Writes v as JSON (strings through fox_json_write_string; numbers with 17 digits, infinity as 1e999).
static void write_value(FILE *f, const FoxJsonValue *v) {
    switch (v->type) {
    case FOX_JSON_NULL: fputs("null", f); break;
    case FOX_JSON_BOOL: fputs(v->boolean ? "true" : "false", f); break;
    case FOX_JSON_NUMBER:
        if (isinf(v->number)) fputs(v->number > 0 ? "1e999" : "-1e999", f);
        else fprintf(f, "%.17g", v->number);
        break;
    case FOX_JSON_STRING: fox_json_write_string(f, v->string, v->len); break;
    case FOX_JSON_ARRAY:
    case FOX_JSON_OBJECT:
        fputc(v->type == FOX_JSON_ARRAY ? '[' : '{', f);
        for (int i = 0; i < v->n; i++) {
            if (i) fputc(',', f);
            if (v->type == FOX_JSON_OBJECT) {
                fox_json_write_string(f, v->keys[i], v->keylens[i]);
                fputc(':', f);
            }
            write_value(f, &v->items[i]);
        }
        fputc(v->type == FOX_JSON_ARRAY ? ']' : '}', f);
        break;
    }
}

static int same_value(const FoxJsonValue *a, const FoxJsonValue *b) {
    if (a->type != b->type || a->n != b->n) return 0;
    if (a->type == FOX_JSON_BOOL) return a->boolean == b->boolean;
    if (a->type == FOX_JSON_NUMBER) return a->number == b->number;
    if (a->type == FOX_JSON_STRING) return a->len == b->len && !memcmp(a->string, b->string, a->len);
    for (int i = 0; i < a->n; i++) {
        if (a->type == FOX_JSON_OBJECT && (a->keylens[i] != b->keylens[i] || memcmp(a->keys[i], b->keys[i], a->keylens[i])))
            return 0;
        if (!same_value(&a->items[i], &b->items[i])) return 0;
    }
    return 1;
}

// 1 if v, written out and parsed again, is the same value.
static int survives_round_trip(const FoxJsonValue *v) {
    FILE *f = tmpfile();
    if (!f) fox_fatal("tmpfile: %s", strerror(errno));
    write_value(f, v);
    long n = ftell(f);
    rewind(f);
    char *text = (char *)fox_malloc((size_t)n), err[160];
    fox_fread(text, 1, (size_t)n, f, "the tmpfile");
    fclose(f);
    FoxJsonValue w;
    int ok = parse_exact(text, (size_t)n, &w, err, sizeof err) && same_value(v, &w);
    fox_json_free(&w);
    free(text);
    return ok;
}

// 1 if err is "<reason> at byte N" with N within [0, len].
static int names_an_offset(const char *err, size_t len) {
    const char *at = strstr(err, " at byte ");
    unsigned long long offset;
    char rest;
    return at && at > err && sscanf(at, " at byte %llu%c", &offset, &rest) == 1 && offset <= len;
}

// One random edit of s[0, *len) (capacity cap): a byte replaced, inserted (often one of JSON's own),
// deleted, a span repeated, or the end cut off.
static void mutate(char *s, size_t *len, size_t cap) {
    static const char syntax[] = "[]{}\",:\\u0123456789abcdefABCDEF.eE+- tfnrl\x01\x7f\x80\xbf\xc3\xed\xf0\xf4\xff";
    size_t n = *len, at = n ? random_below(n) : 0;
    char byte = random_below(2) ? syntax[random_below(sizeof syntax - 1)] : (char)random_below(256);
    switch (random_below(5)) {
    case 0: if (n) s[at] = byte; break;
    case 1: if (n < cap) { memmove(s + at + 1, s + at, n - at); s[at] = byte; *len = n + 1; } break;
    case 2: if (n) { memmove(s + at, s + at + 1, n - at - 1); *len = n - 1; } break;
    case 3: {
        size_t span = n - at < 16 ? n - at : 1 + random_below(16);
        if (n + span <= cap) { memmove(s + at + span, s + at, n - at); *len = n + span; }
        break;
    }
    default: *len = at; break;
    }
}

static void test_fuzz(void) {
    const char *seeds[] = {
        "{\"ctx\": \"A man is sitting on a roof. he\", \"label\": 3, \"endings\": [\"is using wrap\", \"is ripping\", \"holds a cube.\", \"starts pulling\"]}",
        "{\"context\": [464, 3139, 286], \"choices\": [[6342], [10598, 12]], \"label\": 1}",
        "[\"\\ud83d\\ude00 \\u00e9\\n\\t\\\"\\\\\\/\\b\\f\\r\", \"caf\xc3\xa9 \xf0\x9f\x98\x80\", \"a\\u0000b\", {\"\": {}}]",
        "[-0, 1.5e-3, 12E+4, 0.25, -7, true, false, null, [[[]]], 1e400]",
        " { \"a\" : [ 1 , { \"b\" : null } ] , \"a\" : \"dup\" } ",
    };
    enum { MUTANTS = 20000, RANDOM = 10000, CAP = 512 };
    int done = 0, empty_on_error = 1, offsets = 1, round_trips = 1, parsed = 0;
    char buf[CAP], err[160];
    for (int i = 0; i < MUTANTS + RANDOM; i++) {
        size_t len;
        if (i < MUTANTS) {
            const char *seed = seeds[i % 5];
            len = strlen(seed);
            memcpy(buf, seed, len);
            for (int k = 1 + (int)random_below(4); k > 0; k--) mutate(buf, &len, CAP);
        } else {
            const char *alphabet = i % 2 ? "[]{}\",:\\ u0123456789.eE-+tfn\xc3\xa9" : NULL;
            len = random_below(64);
            for (size_t k = 0; k < len; k++) buf[k] = alphabet ? alphabet[random_below(strlen(alphabet))] : (char)random_below(256);
        }
        FoxJsonValue v;
        if (parse_exact(buf, len, &v, err, sizeof err)) {
            parsed++;
            round_trips &= survives_round_trip(&v);
        } else {
            empty_on_error &= is_empty_null(&v);
            offsets &= names_an_offset(err, len);
        }
        fox_json_free(&v);
        done++;
    }
    check(done == MUTANTS + RANDOM, "fuzz: %d mutated documents and %d random byte strings parsed and freed (%d valid)", MUTANTS, RANDOM, parsed);
    check(parsed > 1000 && parsed < MUTANTS, "fuzz: the mutations make both valid and invalid documents");
    check(empty_on_error, "fuzz: every refused input leaves an empty null");
    check(offsets, "fuzz: every error names a byte offset within the input");
    check(round_trips, "fuzz: every parsed value written back out parses to the same value");
}

int main(void) {
    test_values();
    test_items();
    test_strings();
    test_errors();
    test_depth();
    test_int();
    test_writer();
    test_fuzz();
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
