#!/bin/sh
# The Debian packages `make test` needs (used by `make test` and .ci/run): prints nothing and exits 0 when
# all are there; as root installs the missing ones; otherwise prints the one command that would, and
# exits 1. For its test: FOX_SETUP_PROBE=PKG[,PKG...] makes it believe those packages are missing,
# FOX_SETUP_DRY_RUN=1 stops a root run before apt-get.
set -u
missing=""
lacks() { missing="$missing $*"; }
py=/usr/bin/python3
$py -c 'import torch, numpy' > /dev/null 2>&1 || lacks python3-torch python3-numpy
$py -c 'import zarr, numcodecs' > /dev/null 2>&1 || lacks python3-zarr
$py -c 'import matplotlib' > /dev/null 2>&1 || lacks python3-matplotlib
printf '#include <blosc.h>\n' | ${CC:-gcc} -E -x c - > /dev/null 2>&1 || lacks libblosc-dev
command -v gcc > /dev/null 2>&1 || lacks gcc
command -v make > /dev/null 2>&1 || lacks make
command -v node > /dev/null 2>&1 || lacks nodejs
command -v npm > /dev/null 2>&1 || lacks npm
{ command -v mpicc && command -v mpirun; } > /dev/null 2>&1 || lacks libopenmpi-dev openmpi-bin
command -v bash > /dev/null 2>&1 || lacks bash
for p in $(echo "${FOX_SETUP_PROBE:-}" | tr , ' '); do
    case " $missing " in *" $p "*) ;; *) missing="$missing $p" ;; esac
done
[ -n "$missing" ] || exit 0
if [ "$(id -u)" -ne 0 ]; then
    echo "error: make test needs these Debian packages:$missing; install them with: sudo apt-get install -y$missing" >&2
    exit 1
fi
echo "installing:$missing"
[ -z "${FOX_SETUP_DRY_RUN:-}" ] || exit 0
apt-get update -qq || { echo "error: apt-get update failed" >&2; exit 1; }
# shellcheck disable=SC2086
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing > /dev/null || { echo "error: apt-get install$missing failed" >&2; exit 1; }
