#!/bin/sh
# Generation through a trainer binary (docs/model.md §7): `sh test/test_generate.sh BIN` with
# ./train_fox_cpu in `make test`, ./train_fox in `make test-gpu`.
#   - --generate from the newest checkpoint in --out and from --init: the prompt, then the continuation,
#     on stdout; timings on stderr; contexts past the training one;
#   - --top-k 1 is repeatable; sampling repeats with its --seed and changes with another; --prompt-file
#     gives what --prompt gives; --samples N prints N continuations; --acp 1 reports the keys it read;
#   - <|endoftext|> ends a sequence unless --stop-at-eot off (a model built to always predict it); with
#     --doc-mask a prompt's <|endoftext|> starts a new document;
#   - bad input: no prompt, an empty one, a prompt file that is not UTF-8 or empty or missing, both prompt
#     flags, --temperature / --top-p / --top-k out of range, a cache larger than the memory, no weights, a
#     tokenizer missing or not one: one line "error: ..." and a non-zero exit; a training run whose sample's
#     tokenizer or prompt file is missing stops so before its first step.
# Environment: PYTHON (with torch and numpy; default python3).
set -u
BIN=${1:-./train_fox_cpu}
PY=${PYTHON:-python3}
. "$(dirname "$0")/test_lib.sh"
SHAPE=$(trainer_shape "$BIN")
$BIN $SHAPE --seq-len 64 --batch 2 --steps 3 --lr 3e-3 --warmup-tokens 512 --eval-every 0 --sample-tokens 0 \
    --out "$tmp/run" > "$tmp/train.txt" 2>&1
check $? "a 3-step run to generate from"
GEN="$BIN --out $tmp/run --generate 24"
one_error() {  # file, text: exactly one line, "error: ..." containing the text
    [ "$(wc -l < "$1")" -eq 1 ] && grep -q "^error: .*$2" "$1"
}

$GEN --prompt "The cat sat on" --top-k 1 > "$tmp/g1.txt" 2> "$tmp/g1.err"
st=$?
$GEN --prompt "The cat sat on" --top-k 1 > "$tmp/g2.txt" 2> /dev/null
[ $st -eq 0 ] && head -c 14 "$tmp/g1.txt" | grep -q "^The cat sat on" && [ "$(wc -c < "$tmp/g1.txt")" -gt 20 ] &&
    grep -q "^prefill: 1 x 5 tokens .* decode: 23 steps x 1 sequences" "$tmp/g1.err" && cmp -s "$tmp/g1.txt" "$tmp/g2.txt"
check $? "--generate 24 --top-k 1 from the newest checkpoint: the prompt, 24 tokens, twice the same ($(head -c 60 "$tmp/g1.txt" | tr '\n' ' ')...)"
$GEN --prompt "The cat sat on" --seed 5 > "$tmp/s1.txt" 2> /dev/null &&
    $GEN --prompt "The cat sat on" --seed 5 > "$tmp/s2.txt" 2> /dev/null &&
    $GEN --prompt "The cat sat on" --seed 6 > "$tmp/s3.txt" 2> /dev/null &&
    cmp -s "$tmp/s1.txt" "$tmp/s2.txt" && ! cmp -s "$tmp/s1.txt" "$tmp/s3.txt"
check $? "sampling repeats with its --seed and differs with another"
$GEN --prompt "The cat sat on" --seed 5 --temperature 0.7 --top-k 40 --top-p 0.9 > "$tmp/s4.txt" 2> /dev/null &&
    head -c 14 "$tmp/s4.txt" | grep -q "^The cat sat on"
check $? "--temperature 0.7 --top-k 40 --top-p 0.9"
printf 'The cat sat on' > "$tmp/prompt.txt"
$GEN --prompt-file "$tmp/prompt.txt" --top-k 1 > "$tmp/f1.txt" 2> /dev/null && cmp -s "$tmp/f1.txt" "$tmp/g1.txt"
check $? "--prompt-file gives what --prompt gives"
$GEN --prompt "Hello" --samples 3 --seed 2 > "$tmp/m.txt" 2> "$tmp/m.err" &&
    grep -q "^--- sample 2 ---" "$tmp/m.txt" && grep -q "decode: 23 steps x 3 sequences" "$tmp/m.err"
check $? "--samples 3: three continuations, decoded together"
$BIN --init "$tmp/run/ckpt_00000003/model.bin" --generate 150 --prompt "Hello" --top-k 1 --acp 1 > /dev/null 2> "$tmp/a.err" &&
    grep -q "decode: 149 steps .*ACP read [0-9.]*% of the cached keys" "$tmp/a.err"
check $? "--init, 150 tokens past the 64-token training context, --acp 1: $(tail -1 "$tmp/a.err")"

# The document mask (docs/model.md §1.8) in a prompt: after "<|endoftext|>" the model sees only what follows,
# so (FoX has no positions) the greedy continuation equals that of the second document's text alone. Bitwise
# on the CPU; on the GPU the two windows round differently in bf16, so there only the run itself is checked.
$GEN --doc-mask --prompt "Once upon a time<|endoftext|>The cat sat on" --top-k 1 --stop-at-eot off > "$tmp/d1.txt" 2> /dev/null &&
    $GEN --doc-mask --prompt "The cat sat on" --top-k 1 --stop-at-eot off > "$tmp/d2.txt" 2> /dev/null &&
    head -c 43 "$tmp/d1.txt" | grep -q "^Once upon a time<|endoftext|>The cat sat on" &&
    case "$BIN" in
    *_cpu*) [ "$(tail -c +44 "$tmp/d1.txt")" = "$(tail -c +15 "$tmp/d2.txt")" ] ;;
    *) true ;;
    esac
check $? "--doc-mask: a prompt with a separator continues as its last document alone ($(tail -c +44 "$tmp/d1.txt" | head -c 40 | tr '\n' ' ')...)"

# A model that always predicts <|endoftext|>: the embedding is constant, the blocks add nothing, and the
# lm_head row of token 50256 is the final norm's weight (the one direction the hidden state takes).
$PY - "$tmp/run/ckpt_00000003/model.bin" "$tmp/eot.bin" << 'EOF'
import sys, importlib.util
spec = importlib.util.spec_from_file_location("tf", "train_fox.py")
tf = importlib.util.module_from_spec(spec); spec.loader.exec_module(tf)
cfg, p = tf.load_model_bin(sys.argv[1])
p["wte"][:] = 1.0
for name in ("attn_out_w", "mlp_out_w"):
    p[name][:] = 0.0
p["lm_head_w"][:] = 0.0
p["lm_head_w"][50256] = 10.0 * p["lnf_w"][0]
tf.save_model_bin(sys.argv[2], cfg, p)
EOF
$BIN --init "$tmp/eot.bin" --generate 5 --prompt "Stop" --top-k 1 > "$tmp/e1.txt" 2> /dev/null &&
    $BIN --init "$tmp/eot.bin" --generate 5 --prompt "Stop" --top-k 1 --stop-at-eot off > "$tmp/e2.txt" 2> /dev/null &&
    [ "$(cat "$tmp/e1.txt")" = "Stop" ] && [ "$(cat "$tmp/e2.txt")" = "Stop<|endoftext|><|endoftext|><|endoftext|><|endoftext|><|endoftext|>" ]
check $? "<|endoftext|> ends the sequence; with --stop-at-eot off it is printed"

bad() {  # flags, what the error line must name
    # shellcheck disable=SC2086
    $GEN $1 > /dev/null 2> "$tmp/bad.err"
    st=$?
    [ $st -ne 0 ] && one_error "$tmp/bad.err" "$2"
    check $? "refused: $1: $(cat "$tmp/bad.err")"
}
printf 'caf\351\n' > "$tmp/latin1.txt"
: > "$tmp/empty.txt"
bad "" "needs a prompt"
bad "--prompt=" "needs a prompt"
bad "--prompt-file $tmp/latin1.txt" "not UTF-8"
bad "--prompt-file $tmp/empty.txt" "the prompt is empty"
bad "--prompt-file $tmp/missing.txt" "missing.txt"
bad "--prompt a --prompt-file $tmp/prompt.txt" "--prompt and --prompt-file"
bad "--prompt a --temperature 0" "--temperature 0"
bad "--prompt a --temperature -1" "--temperature -1"
bad "--prompt a --top-p 0" "--top-p 0"
bad "--prompt a --top-p 1.5" "--top-p 1.5"
bad "--prompt a --top-k -1" "--top-k -1"
bad "--prompt a --generate 16000000 --samples 60000" "needs .* GiB"
bad "--prompt a --eval-only" "--generate and --eval-only"
bad "--prompt a --tokenizer $tmp/missing.bin" "cannot load the GPT-2 tokenizer $tmp/missing.bin (--tokenizer): No such file"
bad "--prompt a --tokenizer $tmp/latin1.txt" "not a fox.c tokenizer file"
# The sample after training: its tokenizer and prompt are read at set-up, so a missing one stops the run before
# its first step (not after its last), without a run directory.
for flag in "--tokenizer $tmp/missing.bin" "--prompt-file $tmp/missing.txt"; do
    # shellcheck disable=SC2086
    $BIN $SHAPE --seq-len 64 --batch 2 --steps 3 --warmup-tokens 128 --eval-every 0 --sample-tokens 8 $flag \
        --out "$tmp/nosample" > "$tmp/ns.txt" 2> "$tmp/ns.err"
    st=$?
    [ $st -ne 0 ] && one_error "$tmp/ns.err" "missing" && ! grep -q "^step" "$tmp/ns.txt" && [ ! -e "$tmp/nosample" ]
    check $? "refused before the first step, no run directory: a training run whose sample lacks $flag: $(cat "$tmp/ns.err")"
done
$BIN --generate 4 --prompt a --out "$tmp/nothing" > /dev/null 2> "$tmp/bad.err"
[ $? -ne 0 ] && one_error "$tmp/bad.err" "needs --init PATH or a checkpoint"
check $? "refused: --generate without weights: $(cat "$tmp/bad.err")"
finish
