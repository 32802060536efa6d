# data.mk: the data pipeline: fox_data, test_data and `make test-data`.
# Included from the main Makefile, which sets CC, CFLAGS, PYTHON and BUILD_CONFIG (the build configuration
# every binary depends on); the defaults below let it also run alone (make -f data.mk test-data).
CC ?= gcc
CFLAGS ?= -O2 -std=c11 -Wall -Wextra -fopenmp
PYTHON ?= /usr/bin/python3
NPM ?= npm
BLOSC_LIB ?= -lblosc
DATA_LIBS = $(BLOSC_LIB) -lm
DATA_HEADERS = dataloader.h tokenizer.h fox/zarr.h fox/data_common.h fox/rng.h fox/mqar.h fox/passkey.h fox/config.h

fox_data: fox_data.c $(DATA_HEADERS) $(BUILD_CONFIG)
	$(CC) $(CFLAGS) -I. -o $@ fox_data.c $(DATA_LIBS)

test_data: test/test_data.c $(DATA_HEADERS) $(BUILD_CONFIG)
	$(CC) $(CFLAGS) -I. -o $@ test/test_data.c $(DATA_LIBS)

# fox_data as a machine without libblosc builds it (-DFOX_NO_BLOSC): test_data checks that it reads
# uncompressed arrays and refuses compressed ones with one line.
fox_data_noblosc: fox_data.c $(DATA_HEADERS) $(BUILD_CONFIG)
	$(CC) $(filter-out -DFOX_NO_BLOSC,$(CFLAGS)) -DFOX_NO_BLOSC -I. -o $@ fox_data.c -lm

# js-tiktoken (the independent reference tokenizer), installed once into test/data/node_modules.
test/data/node_modules/js-tiktoken/package.json:
	cd test/data && $(NPM) install --no-save --no-audit --no-fund --loglevel=error js-tiktoken@1

test-data: fox_data fox_data_noblosc test_data test/data/node_modules/js-tiktoken/package.json
	PYTHON=$(PYTHON) ./test_data

# Rebuild the bundled corpus (data/train.bin, data/val.bin) from Debian packages; see dev/data/README.md.
data-bundled: fox_data
	sh dev/data/build_bundled.sh

.PHONY: test-data data-bundled
