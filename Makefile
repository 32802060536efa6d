# fox.c: `make` builds the trainers and tools, `make test` runs every test, `make train` trains a
# small FoX (Pro) on the bundled data (on the GPU when train_fox is built and a GPU is present).
CC ?= gcc
ifeq ($(CC),cc)
  CC = gcc
endif
# The Python that can import torch and numpy (on Debian: /usr/bin/python3; on the GPU box: python3).
PYTHON ?= $(shell for p in python3 /usr/bin/python3 python; do $$p -c 'import torch, numpy' >/dev/null 2>&1 && command -v $$p && break; done)

CFLAGS = -O3 -std=c11 -D_DEFAULT_SOURCE -Wall -Wextra
ifneq ($(NATIVE),0)
  CFLAGS += -march=native
endif
# OpenMP when the compiler has it, unless NO_OMP=1 (the simd pragmas stay on either way).
ifeq ($(NO_OMP),1)
  CFLAGS += -fopenmp-simd -Wno-unknown-pragmas
else ifeq ($(shell echo 'int main(void){return 0;}' | $(CC) -fopenmp -x c - -o /dev/null 2>/dev/null && echo yes),yes)
  CFLAGS += -fopenmp
else
  $(info OpenMP not found: building single-threaded)
  CFLAGS += -fopenmp-simd -Wno-unknown-pragmas
endif
LDLIBS = -lblosc -lm

FOX_HEADERS = fox/train_common.h fox/config.h fox/rng.h fox/args.h fox/io.h fox/checkpoint.h fox/npy.h dataloader.h tokenizer.h fox/zarr.h fox/data_common.h

# With MPI (Debian: libopenmpi-dev openmpi-bin) the data-parallel build train_fox_cpu_mpi is made
# too: mpirun -np N ./train_fox_cpu_mpi ... (N ranks, gradients averaged with MPI_Allreduce).
MPICC := $(shell command -v mpicc 2>/dev/null)
ifneq ($(MPICC),)
  MPI_BIN = train_fox_cpu_mpi
endif

FIXTURES = build/fixtures

all: train_fox_cpu test_fox_cpu test_fox_fd fox_data $(MPI_BIN)

train_fox_cpu: train_fox.c $(FOX_HEADERS)
	$(CC) $(CFLAGS) -I. -o $@ train_fox.c $(LDLIBS)

train_fox_cpu_mpi: train_fox.c $(FOX_HEADERS)
	$(MPICC) $(CFLAGS) -DFOX_MPI -I. -o $@ train_fox.c $(LDLIBS)

test_fox_cpu: test_fox.c train_fox.c fox/fixture.h $(FOX_HEADERS)
	$(CC) $(CFLAGS) -I. -o $@ test_fox.c $(LDLIBS)

# The same tests' finite-difference part, with the model in float64 (the optimizer and schedule
# are exercised by test_fox_cpu, hence unused here).
test_fox_fd: test_fox.c train_fox.c $(FOX_HEADERS)
	$(CC) $(CFLAGS) -Wno-unused-function -DFOX_REAL_DOUBLE -I. -o $@ test_fox.c $(LDLIBS)

include data.mk

$(FIXTURES)/manifest.txt: train_fox.py fox/config.h fox/rng.h fox/checkpoint.h fox/fixture.h
	@test -n "$(PYTHON)" || { echo "error: no Python with torch and numpy (apt-get install python3-torch python3-numpy)"; exit 1; }
	$(PYTHON) train_fox.py fixtures --out $(FIXTURES)

# Every suite prints "N passed, M failed"; scripts/run_tests.sh runs them all and sums them up.
test: train_fox_cpu test_fox_cpu test_fox_fd fox_data test_data $(MPI_BIN) $(FIXTURES)/manifest.txt test/data/node_modules/js-tiktoken/package.json
	PYTHON=$(PYTHON) FOX_MPI_BIN=$(MPI_BIN) sh scripts/run_tests.sh \
	  "reference selfcheck=$(PYTHON) train_fox.py selfcheck" \
	  "cpu trainer=./test_fox_cpu $(FIXTURES)" \
	  "finite differences=./test_fox_fd" \
	  "data pipeline=./test_data" \
	  "plots=$(PYTHON) test/test_plot.py"

# The main job: a small FoX (Pro) (head_dim 64, as in the paper) on the bundled corpus, about four
# minutes on two CPU cores, then a decoded sample.
TRAIN_ARGS = --model fox-pro --layers 4 --dim 128 --heads 2 --seq-len 128 --batch 4 --steps 150 \
             --lr 3e-3 --min-lr 3e-4 --warmup-tokens 10K --eval-every 50 --val-steps 8 --out runs/train
train: train_fox_cpu
	./train_fox_cpu $(TRAIN_ARGS)

clean:
	rm -rf train_fox_cpu train_fox_cpu_mpi test_fox_cpu test_fox_fd fox_data test_data build

.PHONY: all test train clean
