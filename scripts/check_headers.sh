#!/bin/sh
# scripts/check_headers.sh: every header compiles on its own, so each includes what it uses (make
# check-headers, part of make test). C headers (fox/*.h, dataloader.h, tokenizer.h, test/*.h) with $CC
# as C11 from the repository root (-I., as the Makefile builds), warnings as errors; CUDA headers (fox/*.cuh) with $NVCC for sm_90a and sm_80 when nvcc is on
# the PATH. fox/trainer.h declares the functions a trainer defines, and fox/run*.h, fox/generate.h and fox/eval.h call them, so for them a static
# function used but not defined is expected and only errors count. Prints "N passed, M failed".
#   CC=gcc CFLAGS="..." NVCC=nvcc sh scripts/check_headers.sh
set -u
CC=${CC:-gcc}
NVCC=${NVCC:-nvcc}
FLAGS="-I. -std=c11 -D_DEFAULT_SOURCE -Wall -Wextra -fopenmp-simd -Wno-unknown-pragmas ${CFLAGS_EXTRA:-}"
passed=0
failed=0
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT

check() {  # name, command...
    name=$1
    shift
    if "$@" > "$tmp" 2>&1; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        echo "FAIL $name compiles alone:"
        head -5 "$tmp"
    fi
}

for h in fox/*.h dataloader.h tokenizer.h test/*.h; do
    [ -f "$h" ] || continue
    case "$h" in
        fox/trainer.h | fox/run*.h | fox/generate.h | fox/eval.h) werror="" ;;
        *) werror="-Werror" ;;
    esac
    # shellcheck disable=SC2086
    check "$h" "$CC" $FLAGS $werror -fsyntax-only -x c "$h"
done
if command -v "$NVCC" > /dev/null 2>&1; then
    for h in fox/*.cuh; do
        for arch in "-arch=sm_90a" "-gencode=arch=compute_80,code=sm_80"; do
            # 177: a static function the header defines but does not call itself
            check "$h ($arch)" "$NVCC" -std=c++17 -x cu "$arch" -diag-suppress 177 -Werror all-warnings \
                -Xcompiler -Wall,-Wextra,-Werror -c "$h" -o /dev/null
        done
    done
else
    echo "nvcc not found: the CUDA headers are not checked"
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
