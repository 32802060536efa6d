// fox/generate.h: generation with the KV cache (docs/model.md §7): --generate, and the sample after
// training.
#ifndef FOX_GENERATE_H
#define FOX_GENERATE_H

#include "run_base.h"
#include "sample.h"

// The prompt's text: --prompt, or --prompt-file read whole; it must be UTF-8 (NULL: neither given).
static char *prompt_text(const FoxArgs *a, size_t *len) {
    char *text;
    const char *what = a->prompt_file[0] ? a->prompt_file : "--prompt";
    if (a->prompt_file[0]) {
        text = fox_read_file(a->prompt_file, len);
        if (!text) fox_fatal("cannot read the prompt file %s: %s", a->prompt_file, strerror(errno));
    } else if (a->prompt[0]) {
        *len = strlen(a->prompt);
        text = (char *)fox_malloc(*len + 1);
        memcpy(text, a->prompt, *len + 1);
    } else {
        return NULL;
    }
    if (*len == 0) fox_usage_error("%s: the prompt is empty", what);
    for (size_t i = 0; i < *len;) {
        uint32_t cp;
        int n = fox_utf8_next((const unsigned char *)text, *len, i, &cp);
        if (cp == 0xFFFFFFFFu) fox_usage_error("%s: not UTF-8 text (an invalid byte 0x%02x at offset %zu)", what, (unsigned char)text[i], i);
        i += (size_t)n;
    }
    return text;
}

// The prompt's tokens: <|endoftext|> (a document starts after it, as in the training data), then the
// prompt's encoding with the GPT-2 tokenizer tok (NULL: the model has another vocabulary).
static int *prompt_tokens(const FoxArgs *a, const FoxConfig *cfg, const Tokenizer *tok, int *n) {
    size_t len, count = 0;
    char *text = prompt_text(a, &len);
    int *ids = NULL;
    if (text && !tok) fox_usage_error("--prompt needs the GPT-2 vocabulary and %s (this model has %d tokens)", a->tokenizer, cfg->vocab_size);
    if (text && !(ids = tokenizer_encode(tok, text, len, &count, 1))) fox_fatal("cannot encode the prompt (out of memory)");
    free(text);
    if (count + 1 > (size_t)INT_MAX / 2) fox_usage_error("the prompt is too long (%zu tokens)", count);
    int *out = (int *)fox_malloc((count + 1) * sizeof(int));
    out[0] = FOX_EOT < cfg->vocab_size ? FOX_EOT : 0;
    if (count) memcpy(out + 1, ids, count * sizeof(int));
    free(ids);
    *n = (int)count + 1;
    return out;
}

// What the sample after training reads, checked at set-up: the tokenizer (for GPT-2's vocabulary) and the
// prompt, so that a missing or bad file stops the run before its first step, not after its last.
static void check_sample_inputs(const FoxArgs *a, const FoxConfig *cfg) {
    if (a->sample_tokens <= 0) return;
    Tokenizer tok;
    int gpt2 = cfg->vocab_size >= FOX_VOCAB_GPT2, P;
    if (gpt2) fox_load_gpt2_tokenizer(&tok, a->tokenizer);
    free(prompt_tokens(a, cfg, gpt2 ? &tok : NULL, &P));
    if (gpt2) tokenizer_free(&tok);
}

// Writes token id as text (tok) or as a number, unbuffered enough to follow the generation.
static void emit_token(FILE *f, const Tokenizer *tok, int id) {
    if (!tok) { fprintf(f, " %d", id); return; }
    size_t len;
    char *text = tokenizer_decode(tok, &id, 1, &len);
    if (!text) fox_fatal("cannot decode token %d (out of memory)", id);
    fwrite(text, 1, len, f);
    free(text);
    fflush(f);
}

// n tokens after the prompt for each of `samples` sequences, with the weights params: a model for the
// prompt's length (forward only, on this rank alone), the prompt's forward filling the KV cache, then
// one decode step per token. Sequence 0 streams to stdout (after `lead`), the others follow it; the
// timings go to stderr. A stop signal ends it at the next token: returns the signal (0: none).
static int generate(Run *r, const float *params, const char *source, int n, int samples, const char *lead) {
    const FoxArgs *a = &r->args;
    const FoxConfig *cfg = &r->cfg;
    int V = cfg->vocab_size, P;
    Tokenizer tok_, *tok = NULL;  // GPT-2's, also for a vocabulary padded past its 50257 tokens
    if (V >= FOX_VOCAB_GPT2) {
        fox_load_gpt2_tokenizer(&tok_, a->tokenizer);
        tok = &tok_;
    }
    int *prompt = prompt_tokens(a, cfg, tok, &P);
    Dist solo = r->dist;
    solo.rank = 0;
    solo.world = 1;
    ModelOptions mo = model_options(a, samples, P, 1);
    r->model = run_model_init(cfg, &mo, &solo);
    run_model_set(r->model, params, NULL, NULL);
    run_model_cache_init(r->model, P + n);
    if (source) fprintf(stderr, "generating from %s (%zu parameters)\n", source, r->lay.total);
    int *tokens = (int *)fox_malloc((size_t)samples * P * sizeof(int)), *next = (int *)fox_calloc((size_t)samples, sizeof(int));
    int *out = (int *)fox_calloc((size_t)samples * n, sizeof(int)), *len = (int *)fox_calloc((size_t)samples, sizeof(int));
    float *logits = (float *)fox_malloc((size_t)samples * V * sizeof(float));
    Sampler s = {a->temperature, a->top_p, a->top_k, (int *)fox_malloc((size_t)V * sizeof(int)), (double *)fox_malloc((size_t)V * sizeof(double))};
    for (int b = 0; b < samples; b++) memcpy(tokens + (size_t)b * P, prompt, (size_t)P * sizeof(int));
    uint64_t key = fox_rng_key((uint64_t)a->seed, FOX_STREAM_SAMPLE);
    fputs(lead, stdout);
    for (int j = 1; j < P; j++) emit_token(stdout, tok, prompt[j]);
    run_stop_note = "\nstopping at the next token (SIGINT again to quit at once)\n";
    double t0 = now_seconds();
    run_model_prefill(r->model, tokens, P, logits);
    double t_prefill = now_seconds() - t0, t1 = now_seconds();
    int steps = 0, live = samples;
    for (int i = 0; i < n && live && !run_stop_signal; i++) {
        if (i) {
            run_model_decode(r->model, next, logits);
            steps++;
        }
        for (int b = 0; b < samples; b++) {
            int done = len[b] < i;  // ended at <|endoftext|> before this step
            next[b] = done ? next[b] : sample_token(&s, logits + (size_t)b * V, V, fox_rng_uniform(key, r->rng++));
            if (done) continue;
            if (a->stop_at_eot && next[b] == FOX_EOT && V >= FOX_VOCAB_GPT2) { live--; continue; }
            out[(size_t)b * n + len[b]++] = next[b];
            if (b == 0) emit_token(stdout, tok, next[b]);
        }
    }
    double t_decode = now_seconds() - t1;
    for (int b = 1; b < samples; b++) {
        printf("\n--- sample %d ---\n", b);
        for (int j = 0; j < len[b]; j++) emit_token(stdout, tok, out[(size_t)b * n + j]);
    }
    printf("\n");
    fflush(stdout);
    double read = run_model_decode_keys_read(r->model);
    char acp[96] = "";
    if (read >= 0) snprintf(acp, sizeof(acp), ", ACP read %.1f%% of the cached keys", 100.0 * read);
    fprintf(stderr, "prefill: %d x %d tokens in %.3f s (%.0f tokens/s) | decode: %d steps x %d sequences in %.3f s "
            "(%.1f steps/s, %.0f tokens/s)%s\n", samples, P, t_prefill, samples * P / t_prefill, steps, samples, t_decode,
            steps / (t_decode > 0 ? t_decode : 1e-9), (double)steps * samples / (t_decode > 0 ? t_decode : 1e-9), acp);
    free(prompt); free(tokens); free(next); free(out); free(len); free(logits); free(s.idx); free(s.p);
    if (tok) tokenizer_free(tok);
    return run_stop_signal;
}

// --generate: the weights of --init or of the newest checkpoint in --out, with their own config.
static void generate_from_file(Run *r) {
    char path[4352];
    if (!r->args.prompt[0] && !r->args.prompt_file[0]) fox_usage_error("--generate needs a prompt: --prompt TEXT or --prompt-file PATH");
    eval_weights_path(&r->args, "--generate", path, sizeof(path), 0);
    r->h_params = fox_load_model_bin(path, &r->cfg);
    check_model_flags(&r->args, &r->cfg, 0, NULL);
    fox_layout(&r->cfg, &r->lay);
    fox_fatal_hint[0] = 0;
    int sig = generate(r, r->h_params, path, r->args.generate, r->args.samples, "");
    if (sig) run_exit_signalled(r, sig, "during generation: the tokens so far are above");
}

// After training (rank 0): --sample-tokens after --prompt (or after <|endoftext|> alone) with the final
// weights, through a fresh forward-only model in place of the training one. A stop signal during it
// exits 75 when the run's final checkpoint is in --out (a --resume samples again), else 128 + signal.
static void print_sample(Run *r) {
    ensure_host_staging(r, 0);
    run_model_get(r->model, r->h_params, NULL, NULL);
    model_free(r->model);
    free(r->model);
    r->model = NULL;
    int sig = generate(r, r->h_params, NULL, r->args.sample_tokens, 1, "sample: ");
    if (!sig) return;
    if (!r->args.out[0]) run_exit_signalled(r, sig, "during the sample (no --out: the trained weights were not saved)");
    char msg[4608];
    snprintf(msg, sizeof(msg), "stopped by %s during the sample: training is complete (%s/ckpt_%08d); --resume samples again",
             run_signal_name(sig), r->args.out, r->step);
    run_free(r);
    run_exit(r, FOX_EXIT_STOPPED, msg);
}
#endif
