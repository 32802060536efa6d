#!/bin/sh
# scripts/setup.sh: the Debian packages `make test` needs, installed when missing (run by `make test` and
# .ci/run; not by `make test-gpu`). All there: prints nothing, exits 0. Missing, as root: `apt-get update`
# and `apt-get install` of the missing ones ("installing: ..."), exit 0 (1 if apt-get fails). Missing, as
# anyone else: one line, the command that would install them, exit 1.
#   - the Python the Makefile picks (PYTHON, else the first of python3, /usr/bin/python3, python that
#     imports torch and numpy; on Debian /usr/bin/python3) must also import zarr, numcodecs and matplotlib;
#   - gcc (with the C library's headers), make, libblosc-dev (blosc.h), node and npm (test_data installs
#     js-tiktoken from the npm registry), mpicc and mpirun (the MPI builds), g++ when nvcc is on the PATH.
# For its own test (test/test_run_tests.sh): FOX_SETUP_PROBE=PKG[,PKG...] makes it believe those packages
# are missing too, FOX_SETUP_DRY_RUN=1 stops a root run before apt-get.
set -u
missing=""
lacks() {
    for p in "$@"; do
        case " $missing " in *" $p "*) ;; *) missing="$missing $p" ;; esac
    done
}
has() { command -v "$1" > /dev/null 2>&1; }

# Python: the one the Makefile would pick; without torch anywhere, the Debian one (where apt installs).
py=""
for p in ${PYTHON:-python3 /usr/bin/python3 python}; do
    if "$p" -c 'import torch, numpy' > /dev/null 2>&1; then py=$p; break; fi
done
if [ -z "$py" ]; then
    lacks python3-torch python3-numpy
    py=/usr/bin/python3
fi
"$py" -c 'import zarr, numcodecs' > /dev/null 2>&1 || lacks python3-zarr
"$py" -c 'import matplotlib' > /dev/null 2>&1 || lacks python3-matplotlib

# The C toolchain, libblosc, MPI, node.
cc=${CC:-gcc}
[ "$cc" != cc ] || cc=gcc
if ! has "$cc"; then
    lacks gcc libc6-dev
elif ! printf '#include <stdio.h>\nint main(void) { return puts("") < 0; }\n' | "$cc" -x c - -o /dev/null > /dev/null 2>&1; then
    lacks libc6-dev
fi
has make || lacks make
printf '#include <blosc.h>\n' | "$cc" -E -x c - > /dev/null 2>&1 || lacks libblosc-dev
{ has mpicc && has mpirun; } || lacks libopenmpi-dev openmpi-bin
has node || lacks nodejs
has npm || lacks npm
[ -s /etc/ssl/certs/ca-certificates.crt ] || lacks ca-certificates
! has "${NVCC:-nvcc}" || has g++ || lacks g++

# shellcheck disable=SC2046
lacks $(echo "${FOX_SETUP_PROBE:-}" | tr , ' ')
[ -n "$missing" ] || exit 0
if [ "$(id -u)" -ne 0 ]; then
    echo "error: make test needs Debian packages that are missing; install them with: sudo apt-get install -y$missing" >&2
    exit 1
fi
if ! has apt-get; then
    echo "error: make test needs these packages (Debian names), and apt-get is not here:$missing" >&2
    exit 1
fi
echo "installing:$missing"
[ -z "${FOX_SETUP_DRY_RUN:-}" ] || exit 0
apt-get update -qq || { echo "error: apt-get update failed" >&2; exit 1; }
# shellcheck disable=SC2086
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing > /dev/null ||
    { echo "error: apt-get install -y$missing failed" >&2; exit 1; }
