#!/bin/sh
# test/check_names.sh: the names of docs/model.md §1.7 are the code's. For each row of the list below (a
# quantity's name, where it must occur as an identifier, the old names that must not), grep -w the C trainer
# (train_fox.c), the CUDA trainer (train_fox.cu and fox/) and the reference (train_fox.py, and reference/*.py
# where that directory exists). Prints PASS/FAIL lines and "N passed, M failed".
#   sh test/check_names.sh            (from the repository root, or any directory: it finds the root)
cd "$(dirname "$0")/.." || exit 1
. test/test_lib.sh

py_files=train_fox.py
[ -d reference ] && py_files="$py_files $(ls reference/*.py 2>/dev/null)"

files_of() {  # where: c (train_fox.c), cu (train_fox.cu and fox/), py (the reference): the files
    case "$1" in
    c) echo train_fox.c ;;
    cu) echo train_fox.cu fox/*.h fox/*.cuh ;;
    py) echo "$py_files" ;;
    esac
}

# has NAME WHERE: NAME is an identifier of WHERE's files.
has() {
    # shellcheck disable=SC2046
    grep -qw -- "$1" $(files_of "$2")
}

# name NAME "WHERE..." "FORBIDDEN..." [FORBIDDEN_WHERE...]: NAME occurs in each WHERE; no FORBIDDEN name
# occurs in the C and CUDA files (or in FORBIDDEN_WHERE's, when given).
name() {
    n=$1 where=$2 old=$3
    shift 3
    fw=${*:-c cu}
    missing=""
    for w in $where; do has "$n" "$w" || missing="$missing $w"; done
    [ -z "$missing" ]
    check $? "$n is an identifier of $(echo "$where" | sed 's/ /, /g')${missing:+ (missing in:$missing)}"
    for o in $old; do
        found=""
        for w in $fw; do
            # shellcheck disable=SC2046
            hits=$(grep -nw -- "$o" $(files_of "$w") | head -n 3)
            [ -n "$hits" ] && found="$found $w" && echo "$hits" | sed 's/^/    /'
        done
        [ -z "$found" ]
        check $? "the old name $o (now $n) is gone from $(echo "$fw" | sed 's/ /, /g')${found:+ (found in:$found)}"
    done
}

# The configuration is cfg everywhere; c is the cumulative log-forget sum. A config named c would be
# `FoxConfig *c` / `FoxConfig c` (C) or `c = self.config` / `c["..."]` (Python).
name cfg "c cu py" ""
# shellcheck disable=SC2046
! grep -nE 'FoxConfig \*? *c\b' train_fox.c train_fox.cu fox/*.h fox/*.cuh
check $? "no FoxConfig is named c in train_fox.c, train_fox.cu, fox/"
# shellcheck disable=SC2086
hits=$(grep -nE '\bc *= *self\.config\b|\bc\[\"[a-z_0-9]+\"\]' $py_files)
[ -z "$hits" ] || echo "$hits" | head -n 5 | sed 's/^/    /'
[ -z "$hits" ]
check $? "no config is named c in $py_files"

name resid "c cu" ""
name mid "c cu py" ""
name xn1 "c cu" ""
name xn2 "c cu" ""
# the GPU's Acts and FamRows fields: a->xn / f.xn were the pre-attention norm's output
# shellcheck disable=SC2046
! grep -nE '(a->|\bf\.|al\.)xn\b' train_fox.c train_fox.cu fox/*.h fox/*.cuh
check $? "the pre-attention norm's rows are xn1, not a->xn / f.xn / al.xn"
name ln1_rstd c ""
name proj "c cu py" ""
name c "c cu py" ""
name lse "c cu" ""
name mlp_u "c cu" ""
name mlp_h "c cu" ""
name gsa_S "c cu" ""
name acp_kv_first "c cu" "acp_first"
name acp_live "c cu" ""
name acp_tiles "c cu" ""
name Scratch "c cu" ""
name decode_attention_block "c cu" ""
name decode_gsa_block "c cu" "gsa_decode_block"
name cache_bytes_needed "c cu" "cache_bytes"
name fam_update_backward_rows "c cu" ""
finish
