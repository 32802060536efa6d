# fox.c: `make` builds the trainers and tools, `make test` runs every test, `make train` trains a
# small FoX (Pro) on the bundled data (on the GPU when train_fox is built and a GPU is present).
CC ?= gcc
ifeq ($(CC),cc)
  CC = gcc
endif
# The Python that can import torch and numpy (on Debian: /usr/bin/python3; on the GPU box: python3).
PYTHON ?= $(shell for p in python3 /usr/bin/python3 python; do $$p -c 'import torch, numpy' >/dev/null 2>&1 && command -v $$p && break; done)

# What the configuration found is said once: by the make that builds, not by `make test`'s first one,
# which only runs scripts/setup.sh (that may install what was not found).
NOTE_FINDINGS := $(filter-out test,$(or $(MAKECMDGOALS),all))

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
  $(if $(NOTE_FINDINGS),$(info OpenMP not found: building single-threaded))
  CFLAGS += -fopenmp-simd -Wno-unknown-pragmas
endif
# libblosc (Debian: libblosc-dev) decompresses LongCrawl64's zarr chunks; without it (or with NO_BLOSC=1)
# everything builds (-DFOX_NO_BLOSC) and reads llm.c shards and uncompressed zarr arrays only.
ifeq ($(if $(filter 1,$(NO_BLOSC)),no,$(shell printf '\043include <blosc.h>\n' | $(CC) -E -x c - >/dev/null 2>&1 && echo yes)),yes)
  BLOSC_LIB = -lblosc
else
  $(if $(NOTE_FINDINGS),$(info building without libblosc (no blosc.h, or NO_BLOSC=1): compressed zarr arrays are not readable))
  BLOSC_LIB =
  BLOSC_DEF = -DFOX_NO_BLOSC
  CFLAGS += $(BLOSC_DEF)
endif
LDLIBS = $(BLOSC_LIB) -lm

# Every header of fox/: a binary is rebuilt when any of them changes (a list by hand once missed one).
FOX_HEADERS = $(wildcard fox/*.h) dataloader.h tokenizer.h

# With MPI (Debian: libopenmpi-dev openmpi-bin) the data-parallel build train_fox_cpu_mpi is made
# too: mpirun -np N ./train_fox_cpu_mpi ... (N ranks, gradients averaged with MPI_Allreduce).
MPICC := $(shell command -v mpicc 2>/dev/null)
ifneq ($(MPICC),)
  MPI_BIN = train_fox_cpu_mpi
endif

FIXTURES = build/fixtures

all: train_fox_cpu test_fox test_finite_diff test_end_to_end test_decode test_eval test_json fox_data $(MPI_BIN)

# Every binary depends on build/config.txt, the build configuration (compilers, flags, whether libblosc,
# MPI and nvcc were found, GPU_ARCH), rewritten at the end of this file only when it changes: a machine
# that gains libblosc-dev or MPI rebuilds, an unchanged configuration does not.
BUILD_CONFIG = build/config.txt

train_fox_cpu: train_fox.c $(FOX_HEADERS) $(BUILD_CONFIG)
	$(CC) $(CFLAGS) -I. -o $@ train_fox.c $(LDLIBS)

train_fox_cpu_mpi: train_fox.c $(FOX_HEADERS) $(BUILD_CONFIG)
	$(MPICC) $(CFLAGS) -DFOX_MPI -I. -o $@ train_fox.c $(LDLIBS)

# The tests, one binary per kind (test/): parity with the reference's fixtures, finite differences (the
# model in float64), and the trainer binary end to end (which recomputes losses with the model, so the
# backward and optimizer of train_fox.c go unused there, as the optimizer does in the float64 build).
# The test-only headers sit beside them (TEST_HEADERS).
TEST_HEADERS = test/testing.h test/fixture.h
test_fox: test_fox.c train_fox.c $(TEST_HEADERS) $(FOX_HEADERS) $(BUILD_CONFIG)
	$(CC) $(CFLAGS) -Wno-unused-function -I. -Itest -o $@ test_fox.c $(LDLIBS)

test_decode: test/test_decode.c train_fox.c $(TEST_HEADERS) $(FOX_HEADERS) $(BUILD_CONFIG)
	$(CC) $(CFLAGS) -Wno-unused-function -I. -Itest -o $@ test/test_decode.c $(LDLIBS)

test_finite_diff: test/test_finite_diff.c train_fox.c $(TEST_HEADERS) $(FOX_HEADERS) $(BUILD_CONFIG)
	$(CC) $(CFLAGS) -Wno-unused-function -DFOX_REAL_DOUBLE -I. -Itest -o $@ test/test_finite_diff.c $(LDLIBS)

test_end_to_end: test/test_end_to_end.c train_fox.c $(TEST_HEADERS) $(FOX_HEADERS) $(BUILD_CONFIG)
	$(CC) $(CFLAGS) -Wno-unused-function -I. -Itest -o $@ test/test_end_to_end.c $(LDLIBS)

# The evaluation tasks (fox/eval.h) with a scripted fake model, and the JSON reader they use.
test_eval: test/test_eval.c $(TEST_HEADERS) $(FOX_HEADERS) fox_data $(BUILD_CONFIG)
	$(CC) $(CFLAGS) -Wno-unused-function -I. -Itest -o $@ test/test_eval.c $(LDLIBS)

test_json: test/test_json.c fox/json.h fox/io.h $(TEST_HEADERS) $(BUILD_CONFIG)
	$(CC) $(CFLAGS) -I. -Itest -o $@ test/test_json.c -lm

include data.mk

$(FIXTURES)/manifest.txt: train_fox.py reference/fixtures.py fox/config.h fox/rng.h fox/checkpoint.h test/fixture.h
	@test -n "$(PYTHON)" || { echo "error: no Python with torch and numpy (sh scripts/setup.sh says what make test needs)"; exit 1; }
	$(PYTHON) train_fox.py fixtures --out $(FIXTURES)

# `make test` first installs the Debian packages the tests need (scripts/setup.sh: as root; anyone else
# gets the apt-get command and an error), then runs the suites in a second make, which finds the new
# packages when it parses this file (PYTHON, libblosc, mpicc) and rebuilds what they change.
test:
	@sh scripts/setup.sh
	@$(MAKE) --no-print-directory test-suites

# Every suite prints "N passed, M failed"; scripts/run_tests.sh runs them all and sums them up.
test-suites: train_fox_cpu test_fox test_finite_diff test_end_to_end test_decode test_eval test_json fox_data fox_data_noblosc test_data $(MPI_BIN) $(FIXTURES)/manifest.txt test/data/node_modules/js-tiktoken/package.json
	PYTHON=$(PYTHON) FOX_MPI_BIN=$(MPI_BIN) sh scripts/run_tests.sh \
	  "test harness=sh test/test_run_tests.sh" \
	  "headers compile alone=CC=$(CC) CFLAGS_EXTRA='$(BLOSC_DEF)' NVCC=$(NVCC) sh scripts/check_headers.sh" \
	  "reference selfcheck=$(PYTHON) test/test_reference.py" \
	  "cpu parity=./test_fox $(FIXTURES)" \
	  "finite differences=./test_finite_diff" \
	  "cpu end to end=./test_end_to_end" \
	  "cpu generation=./test_decode" \
	  "generation runs=sh test/test_generate.sh ./train_fox_cpu" \
	  "json reader=./test_json" \
	  "evaluation tasks, scripted model=./test_eval" \
	  "evaluation tasks=sh test/test_eval.sh ./train_fox_cpu $(MPI_BIN:%=./%)" \
	  "multiple-choice reference=$(PYTHON) test/test_mc_ref.py" \
	  "result sweeps=sh test/test_sweeps.sh ./train_fox_cpu" \
	  "runs=sh test/test_runs.sh ./train_fox_cpu $(MPI_BIN:%=./%)" \
	  "gradient accumulation=sh test/test_accum.sh $(MPI_BIN:%=./%)" \
	  "ranks that fail loudly=sh test/test_ranks.sh $(MPI_BIN:%=./%)" \
	  "scaling model=$(PYTHON) scripts/scaling_model.py --check" \
	  "one name per quantity=sh test/check_names.sh" \
	  "paper run scripts=bash test/test_paper_scripts.sh ./train_fox_cpu $(MPI_BIN:%=./%)" \
	  "data pipeline=./test_data" \
	  "plots=$(PYTHON) test/test_plot.py" \
	  "timeline analysis=$(PYTHON) test/test_timeline.py" \
	  "hugging face exchange=$(PYTHON) test/test_hf.py" \
	  "decode benchmark, reference=$(PYTHON) scripts/bench_decode.py --check" \
	  "decode benchmark, parser=$(PYTHON) scripts/bench_decode.py --selftest"

# The main job: a small FoX (Pro) (head_dim 64, as in the paper) on the bundled corpus, about four
# minutes on two CPU cores, then a sample after a prompt (TRAIN_ARGS_GPU below when a GPU runs it).
TRAIN_PROMPT = --prompt "And God said" --sample-tokens 96 --top-k 40
TRAIN_ARGS = --model fox-pro --layers 4 --dim 128 --heads 2 --seq-len 128 --batch 4 --steps 150 \
             --lr 3e-3 --min-lr 3e-4 --warmup-tokens 10K --eval-every 50 --val-steps 8 $(TRAIN_PROMPT)
# A new run directory each time, runs/train_DATE_TIME (a fresh run never writes into another run's
# directory); TRAIN_OUT=DIR chooses it (an earlier run there is refused, or resumed with TRAIN_ARGS+=--resume).
ifndef TRAIN_OUT
  TRAIN_OUT := $(shell d=runs/train_$$(date +%Y%m%d_%H%M%S); o=$$d; i=2; while [ -e $$o ]; do o=$${d}_$$i; i=$$((i + 1)); done; echo $$o)
endif
# TRAIN_BIN (set in the CUDA block below): ./train_fox when it is built and a GPU is present.
train: train_fox_cpu
	$(TRAIN_BIN) $(TRAIN_ARGS) --out $(TRAIN_OUT)

clean:
	rm -rf train_fox_cpu train_fox_cpu_mpi test_fox test_finite_diff test_end_to_end test_decode test_eval test_json fox_data fox_data_noblosc test_data build

# Every header compiles on its own (C headers with $(CC), CUDA headers with nvcc when present).
check-headers:
	CC=$(CC) CFLAGS_EXTRA='$(BLOSC_DEF)' NVCC=$(NVCC) sh scripts/check_headers.sh

.PHONY: all test test-suites train clean check-headers

# --- CUDA (train_fox.cu) ---
# With nvcc on PATH: train_fox (the GPU trainer) and test_foxcu (its parity test against the reference's
# fixtures), for Hopper (sm_90a) by default, GPU_ARCH=80 for Ampere. `make train` runs ./train_fox when
# nvcc is here and nvidia-smi finds a GPU, else ./train_fox_cpu (TRAIN_BIN).
NVCC ?= nvcc
TRAIN_BIN = ./train_fox_cpu
NVCC_FOUND := $(shell command -v $(NVCC) 2>/dev/null)
ifneq ($(NVCC_FOUND),)
GPU_ARCH ?= 90a
NVCCFLAGS = -O3 -std=c++17 -gencode=arch=compute_$(GPU_ARCH),code=sm_$(GPU_ARCH) -Xcompiler -Wall,-Wextra,-fopenmp $(BLOSC_DEF)
CUDA_LDLIBS = -lcublasLt -lcublas -lcudart -lgomp $(BLOSC_LIB) -lm
CUDA_HEADERS = $(wildcard fox/*.cuh) $(FOX_HEADERS)

all: train_fox test_foxcu test_decode_gpu cuda-dev

# The per-kernel check-and-benchmark programs (so CI compiles every CUDA file); all of them rebuilt (-B)
# when the build configuration differs from the one they were built with (build/config_cuda_dev.txt).
cuda-dev:
	$(MAKE) -C dev/cuda $(if $(shell cmp -s $(BUILD_CONFIG) build/config_cuda_dev.txt || echo x),-B) NVCC=$(NVCC) ARCH=$(GPU_ARCH) BLOSC_LIB="$(BLOSC_LIB)" BLOSC_DEF="$(BLOSC_DEF)"
	@cp $(BUILD_CONFIG) build/config_cuda_dev.txt

# With Open MPI (mpicc --showme), train_fox is data parallel under mpirun: one rank per GPU, gradients
# averaged with NCCL (the toolkit's libnccl). Started without mpirun it is one process, MPI untouched.
MPI_INCDIRS := $(if $(MPICC),$(shell $(MPICC) --showme:incdirs 2>/dev/null))
ifneq ($(MPI_INCDIRS),)
  TRAIN_FOX_MPI = -DFOX_MPI $(addprefix -I,$(MPI_INCDIRS))
  TRAIN_FOX_MPI_LIBS = $(addprefix -L,$(shell $(MPICC) --showme:libdirs)) $(addprefix -l,$(shell $(MPICC) --showme:libs)) -lnccl
endif

train_fox: train_fox.cu $(CUDA_HEADERS) $(BUILD_CONFIG)
	$(NVCC) $(NVCCFLAGS) $(TRAIN_FOX_MPI) -I. -o $@ train_fox.cu $(CUDA_LDLIBS) $(TRAIN_FOX_MPI_LIBS)

test_foxcu: test_fox.cu train_fox.cu $(TEST_HEADERS) $(CUDA_HEADERS) $(BUILD_CONFIG)
	$(NVCC) $(NVCCFLAGS) -I. -Itest -o $@ test_fox.cu $(CUDA_LDLIBS)

# Generation with the KV cache on the GPU (prefill + decode steps against the full forward, ACP, refusals).
test_decode_gpu: test/test_decode_gpu.cu train_fox.cu $(TEST_HEADERS) $(CUDA_HEADERS) $(BUILD_CONFIG)
	$(NVCC) $(NVCCFLAGS) -I. -Itest -o $@ test/test_decode_gpu.cu $(CUDA_LDLIBS)

# On a GPU: a FoX (Pro) of 24 layers of width 1024 (head_dim 64) for about two minutes on one H100,
# past 30% MFU (docs/perf.md), the same prompted sample at the end.
TRAIN_ARGS_GPU = --model fox-pro --layers 24 --dim 1024 --heads 16 --seq-len 1024 --batch 16 --steps 400 \
                 --lr 1e-3 --min-lr 1e-4 --warmup-tokens 1M --eval-every 100 --val-steps 4 $(TRAIN_PROMPT)
ifneq ($(shell nvidia-smi -L 2>/dev/null | grep -c GPU),0)
TRAIN_BIN = ./train_fox
TRAIN_ARGS = $(TRAIN_ARGS_GPU)
train: train_fox
endif

# The reference's fixtures at the head dims the attention kernel runs (the standard fixtures have
# head_dim 16): all presets at d_model 128 / 2 heads (64), fox-pro, transformer-pro (with and without the
# document mask), gsa and the three FAM fixtures of blocks of 128 at d_model 256 / 2 heads (128); then the GPU
# parity test on each set.
GPU_FIXTURES = build/fixtures_gpu
test-gpu: train_fox test_foxcu test_decode_gpu train_fox_cpu fox_data
	$(PYTHON) train_fox.py fixtures --dim 128 --heads 2 --out $(GPU_FIXTURES)
	$(PYTHON) train_fox.py fixtures --dim 256 --heads 2 --only fox-pro,transformer-pro,fox-pro-docmask,transformer-pro-docmask,gsa,transformer-fam-gpu,fox-fam-gpu,transformer-bswa-gpu --out $(GPU_FIXTURES)_dh128
	PYTHON=$(PYTHON) sh scripts/run_tests.sh \
	  "gpu parity, head_dim 64=./test_foxcu $(GPU_FIXTURES)" \
	  "gpu parity, head_dim 128=./test_foxcu $(GPU_FIXTURES)_dh128" \
	  "gpu generation=./test_decode_gpu" \
	  "gpu generation runs=sh test/test_generate.sh ./train_fox" \
	  "gpu evaluation tasks=sh test/test_eval.sh ./train_fox" \
	  "gpu end to end=sh test/test_gpu_e2e.sh" \
	  "gpu gsa end to end=sh test/test_gpu_gsa.sh" \
	  "gpu fam end to end=sh test/test_gpu_fam.sh" \
	  "gpu runs=sh test/test_runs.sh ./train_fox $(if $(TRAIN_FOX_MPI),./train_fox)" \
	  "gpu data parallel=sh test/test_gpu_dp.sh" \
	  $(if $(TRAIN_FOX_MPI),"gpu ranks that fail loudly=sh test/test_ranks.sh ./train_fox")

clean: clean-cuda
clean-cuda:
	rm -f train_fox test_foxcu test_decode_gpu

.PHONY: test-gpu clean-cuda cuda-dev
endif
# --- end CUDA ---

# The build configuration (see BUILD_CONFIG), one line each, written when it differs from the last one.
BUILD_CONFIG_TEXT = cc=$(CC)|cflags=$(CFLAGS)|ldlibs=$(LDLIBS)|mpicc=$(MPICC)|nvcc=$(NVCC_FOUND)|nvccflags=$(NVCCFLAGS)|nvcc_mpi=$(TRAIN_FOX_MPI) $(TRAIN_FOX_MPI_LIBS)
$(shell mkdir -p build && t=$(BUILD_CONFIG).$$$$ && printf '%s\n' '$(subst ','\'',$(BUILD_CONFIG_TEXT))' | tr '|' '\n' > $$t && { cmp -s $$t $(BUILD_CONFIG) || mv -f $$t $(BUILD_CONFIG); }; rm -f $$t)
