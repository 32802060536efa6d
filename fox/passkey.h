// fox/passkey.h: passkey retrieval (Landmark Attention's prompt, Mohtashami & Jaggi 2023, as TransformerFAM §4.2
// uses it; docs/model.md §8.2), the one definition of its prompt and answer: the trainers' --eval-passkey
// (fox/eval.h) asks with it, and `fox_data passkey` writes training examples with it, so that a model can be
// taught the task the evaluation scores. Header-only, C11, also compiles as CUDA C++.
//
// A prompt of L tokens: <|endoftext|>, the task (FOX_PASSKEY_TASK), the filler (FOX_PASSKEY_FILLER's tokens
// repeated and cut at a token), the key's line (fox_passkey_line: "\nThe pass key is K. Remember it. K is the
// pass key.\n") after a share `depth` of the filler, the rest of the filler, the question (FOX_PASSKEY_QUESTION,
// which ends "The pass key is"). Its answer (fox_passkey_answer): " K." K: 5 digits, 10000 to 99999.
// A training set on disk (`fox_data passkey --out DIR`): DIR/train.bin and DIR/val.bin, llm.c shards of examples
// of exactly T tokens back to back, then one <|endoftext|>, so a loader with seq_len T reads example k as window
// k and its last target is the next example's start; an example is a prompt of T - n tokens and its answer's n
// tokens. Example i of a split draws its key (draw 2i) and depth (draw 2i + 1) under
// fox_rng_key(fox_rng_key(seed, FOX_STREAM_PASSKEY_DATA), split), independent of the evaluation's
// (FOX_STREAM_PASSKEY). DIR/passkey.json, written last, describes the set.
#ifndef FOX_PASSKEY_H
#define FOX_PASSKEY_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "config.h"         // FOX_EOT
#include "io.h"             // fox_fatal, fox_malloc
#include "rng.h"            // fox_rng_key, fox_rng_below, fox_rng_uniform
#include "../tokenizer.h"   // Tokenizer, tokenizer_encode, FOX_EOT

#define FOX_PASSKEY_TASK "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. " \
                         "I will quiz you about the important information there.\n"
#define FOX_PASSKEY_FILLER "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
#define FOX_PASSKEY_QUESTION "\nWhat is the pass key? The pass key is"
#define FOX_PASSKEY_LINE_MAX 40   // tokens a key's line takes at most
enum { FOX_PASSKEY_TRAIN = 0, FOX_PASSKEY_VAL = 1 };

// Token ids of a text (the evaluation's prompts' pieces too, fox/eval.h).
typedef struct {
    int *ids;
    int n;
} TokenList;

// The prompt's fixed texts as tokens.
typedef struct {
    TokenList task, filler, question;
} FoxPasskeyText;

static inline TokenList fox_encode_text(const Tokenizer *tok, const char *text) {
    size_t n;
    int *ids = tokenizer_encode(tok, text, strlen(text), &n, 0);
    if (!ids) fox_fatal("cannot encode a prompt (out of memory)");
    TokenList t = {ids, (int)n};
    return t;
}

static inline FoxPasskeyText fox_passkey_text(const Tokenizer *tok) {
    FoxPasskeyText t = {fox_encode_text(tok, FOX_PASSKEY_TASK), fox_encode_text(tok, FOX_PASSKEY_FILLER),
                        fox_encode_text(tok, FOX_PASSKEY_QUESTION)};
    return t;
}

static inline void fox_passkey_text_free(FoxPasskeyText *t) {
    free(t->task.ids);
    free(t->filler.ids);
    free(t->question.ids);
}

// Tokens of a prompt that are not filler, the key's line at its longest.
static inline int fox_passkey_fixed_tokens(const FoxPasskeyText *t) {
    return 1 + t->task.n + t->question.n + FOX_PASSKEY_LINE_MAX;
}

static inline TokenList fox_passkey_line(const Tokenizer *tok, int key) {
    char line[128];
    snprintf(line, sizeof(line), "\nThe pass key is %d. Remember it. %d is the pass key.\n", key, key);
    return fox_encode_text(tok, line);
}

static inline TokenList fox_passkey_answer(const Tokenizer *tok, int key) {
    char answer[32];
    snprintf(answer, sizeof(answer), " %d.", key);
    return fox_encode_text(tok, answer);
}

// The prompt of L tokens into out, the key's line `line` after floor(depth * filler) filler tokens. Returns the
// line's position, or -1 when L is too short for the fixed part.
static inline int fox_passkey_prompt(const FoxPasskeyText *t, const TokenList *line, int L, double depth, int *out) {
    int fill = L - 1 - t->task.n - line->n - t->question.n;
    if (fill < 0) return -1;
    int before = (int)(depth * fill), at = 0;
    out[at++] = FOX_EOT;
    memcpy(out + at, t->task.ids, (size_t)t->task.n * sizeof(int));
    at += t->task.n;
    for (int i = 0; i < before; i++) out[at++] = t->filler.ids[i % t->filler.n];
    int line_pos = at;
    memcpy(out + at, line->ids, (size_t)line->n * sizeof(int));
    at += line->n;
    for (int i = before; i < fill; i++) out[at++] = t->filler.ids[i % t->filler.n];
    memcpy(out + at, t->question.ids, (size_t)t->question.n * sizeof(int));
    return line_pos;
}

// The key (10000 to 99999) and the depth ([0, 1)) of draw pair i under key k.
static inline int fox_passkey_key(uint64_t k, uint64_t i) { return 10000 + (int)fox_rng_below(k, 2 * i, 90000); }
static inline double fox_passkey_depth(uint64_t k, uint64_t i) { return fox_rng_uniform(k, 2 * i + 1); }

// The draws' key of a training set's split.
static inline uint64_t fox_passkey_split_key(uint64_t seed, int split) {
    return fox_rng_key(fox_rng_key(seed, FOX_STREAM_PASSKEY_DATA), (uint64_t)split);
}

// Example i of a split (T tokens) into out: the prompt, then the answer. Returns the answer's first position.
static inline int fox_passkey_example(const Tokenizer *tok, const FoxPasskeyText *t, uint64_t split_key, long long i,
                                      int T, int *out) {
    int key = fox_passkey_key(split_key, (uint64_t)i);
    TokenList line = fox_passkey_line(tok, key), answer = fox_passkey_answer(tok, key);
    int L = T - answer.n;
    if (fox_passkey_prompt(t, &line, L, fox_passkey_depth(split_key, (uint64_t)i), out) < 0)
        fox_fatal("a passkey example of %d tokens is too short for its fixed part", T);
    memcpy(out + L, answer.ids, (size_t)answer.n * sizeof(int));
    free(line.ids);
    free(answer.ids);
    return L;
}

#endif
