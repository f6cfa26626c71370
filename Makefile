# dflash build. `make` builds build/dflash, build/libdflash.a and build/libdflash.so;
# `make test` runs every test; `make asan` / `make tsan` run them under sanitizers;
# `make fuzz` builds the libFuzzer targets (clang, CPU library only); `make install PREFIX=...`.
# Sources are found by wildcard: a new .c file under src/ or tests/ needs no Makefile edit.

CC      ?= cc
PREFIX  ?= /usr/local
BUILD   ?= build
OPT     ?= -O2
CFLAGS_BASE = -std=c11 -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wvla \
              -D_GNU_SOURCE -fPIC -fvisibility=hidden -Iinclude -Isrc -pthread
CFLAGS  ?= $(OPT) -g
ALL_CFLAGS = $(CFLAGS_BASE) $(CFLAGS) $(EXTRA_CFLAGS) -MMD -MP -DDFLASH_MODEL_DIR=\"$(abspath models)\" -DDFLASH_SOURCE_DIR=\"$(abspath .)\"
LDLIBS_CPU = -lm -lpthread
LDLIBS  = $(LDLIBS_CPU)
# PCRE2 only for the tests (the tokenizer tests compare with PCRE2's regex); not in libdflash
TEST_LDLIBS = -lpcre2-8
VERSION = 0.1.0

# optional toolchains, detected once
NVCC  := $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CLANG := $(shell command -v clang 2>/dev/null)

LIB_SRC   := $(sort $(shell find src -name '*.c' -not -path 'src/backend/cuda/*'))
# `dflash serve` (tools/serve/) links jansson; only the CLI and the tests do, never the library
SERVE_SRC := $(sort $(wildcard tools/serve/*.c))
SERVE_LIBS = -ljansson
TOOL_SRC  := $(sort $(wildcard tools/*.c)) $(SERVE_SRC)
TEST_SRC  := $(sort $(wildcard tests/test_*.c))
LIB_OBJ   := $(LIB_SRC:%.c=$(BUILD)/%.o)
TOOL_OBJ  := $(TOOL_SRC:%.c=$(BUILD)/%.o)
TEST_OBJ  := $(TEST_SRC:%.c=$(BUILD)/%.o) $(BUILD)/tests/runner.o $(SERVE_SRC:%.c=$(BUILD)/test-obj/%.o)
# The test runner links a variant of the library built with -DDFL_TEST_HOOKS (fault injection for
# the ordering tests); the release library and CLI never contain the hooks.
TLIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/test-obj/%.o)

# ---- CUDA backend (optional) ----------------------------------------------------------------
# CUDA=auto (default): built when nvcc is found; CUDA=1: required; CUDA=0: never (CPU only).
# The .cu files of src/backend/cuda/ are compiled by nvcc for sm_90 plus compute_90 PTX, with
# warnings as errors; the C code gets -DDFL_HAVE_CUDA and links the CUDA runtime.
CUDA ?= auto
ifeq ($(CUDA),auto)
CUDA_ON := $(if $(NVCC),1,0)
else
CUDA_ON := $(CUDA)
endif
ifeq ($(CUDA_ON),1)
ifeq ($(NVCC),)
$(error CUDA=1 but nvcc was not found (PATH or /usr/local/cuda/bin))
endif
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_SRC  := $(sort $(wildcard src/backend/cuda/*.cu))
CUDA_OBJ  := $(CUDA_SRC:%.cu=$(BUILD)/%.o)
# the test library's variant (-DDFL_TEST_HOOKS: test hooks such as the matmul chunk size)
CUDA_TOBJ := $(CUDA_SRC:%.cu=$(BUILD)/test-obj/%.o)
CUDA_ARCH ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
NVCC_WERROR := $(shell $(NVCC) --help 2>/dev/null | grep -q -e '--Werror' && echo '--Werror all-warnings')
NVCCFLAGS ?= -O3 -g
ALL_NVCCFLAGS = -std=c++17 $(NVCCFLAGS) $(CUDA_ARCH) $(NVCC_WERROR) -Xcompiler -Wall,-Wextra,-Werror,-fPIC,-fvisibility=hidden \
                -Iinclude -Isrc -DDFL_HAVE_CUDA -DDFL_CUDA_LIBDIR=\"$(CUDA_HOME)/lib64\" -MMD -MP
ALL_CFLAGS += -DDFL_HAVE_CUDA
LIB_OBJ   += $(CUDA_OBJ)
TLIB_OBJ  += $(CUDA_TOBJ)
# cuBLAS is opened at run time (src/backend/cuda/cuda_blas.cu): linking it costs every process
# about a second of start-up; the run path lets that dlopen find it
LDLIBS    += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -ldl -lstdc++
CUDA_MSG   = ON: $(NVCC) (release $(shell $(NVCC) --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')), $(CUDA_ARCH), cudart and (at run time) cuBLAS from $(CUDA_HOME)/lib64
else
CUDA_MSG   = OFF (CUDA=$(CUDA)$(if $(NVCC),,; nvcc not found))
endif
# objects depend on the CUDA setting (DFL_HAVE_CUDA) and on the compiler flags: changing either
# (a new -f option in the Makefile, other EXTRA_CFLAGS) rebuilds them, never links stale objects
FLAGS_HASH := $(shell printf '%s' '$(CC) $(ALL_CFLAGS) $(ALL_NVCCFLAGS)' | cksum | cut -d' ' -f1)
CONFIG_STAMP := $(BUILD)/.config-cuda-$(CUDA_ON)-$(FLAGS_HASH)

.PHONY: all lib test check run deps asan tsan fuzz install clean toolchains models bench-cuda

all: toolchains $(BUILD)/dflash $(BUILD)/libdflash.a $(BUILD)/libdflash.so

toolchains:
	@echo "dflash: cc = $(CC) ($$($(CC) -dumpfullversion -dumpversion 2>/dev/null))"
	@if [ -n "$(NVCC)" ]; then echo "dflash: nvcc found at $(NVCC)"; else echo "dflash: nvcc not found (CUDA backend not built)"; fi
	@echo "dflash: CUDA backend $(CUDA_MSG)"
	@if [ -n "$(CLANG)" ]; then echo "dflash: clang found at $(CLANG) (make fuzz available)"; else echo "dflash: clang not found (make fuzz unavailable)"; fi

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -c $< -o $@

$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(ALL_NVCCFLAGS) -c $< -o $@

$(BUILD)/test-obj/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(ALL_NVCCFLAGS) -DDFL_TEST_HOOKS -c $< -o $@

$(CONFIG_STAMP):
	@mkdir -p $(BUILD)
	@rm -f $(BUILD)/.config-cuda-*
	@touch $@

$(LIB_OBJ) $(TLIB_OBJ) $(TOOL_OBJ) $(TEST_OBJ): $(CONFIG_STAMP)

# `make bench-cuda`: the CUDA benchmark program (tests/bench/bench_cuda.c) used by
# tools/device-check.sh.
bench-cuda: $(BUILD)/bench-cuda
$(BUILD)/bench-cuda: tests/bench/bench_cuda.c $(BUILD)/libdflash.a $(CONFIG_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -o $@ tests/bench/bench_cuda.c $(BUILD)/libdflash.a $(LDFLAGS) $(LDLIBS)

$(BUILD)/test-obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -DDFL_TEST_HOOKS -c $< -o $@

$(BUILD)/tests/%.o: tests/%.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -DDFL_TEST_HOOKS -c $< -o $@

$(BUILD)/libdflash-test.a: $(TLIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libdflash.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libdflash.so: $(LIB_OBJ)
	$(CC) -shared -o $@ $^ $(LDFLAGS) $(LDLIBS)

# The CLI links the release library; sanitizer builds link it to the test variant instead (one
# compile of the sources per sanitizer).
CLI_LIB ?= $(BUILD)/libdflash.a
$(BUILD)/dflash: $(TOOL_OBJ) $(CLI_LIB)
	$(CC) $(ALL_CFLAGS) -o $@ $(TOOL_OBJ) $(CLI_LIB) $(LDFLAGS) $(LDLIBS) $(SERVE_LIBS)

$(BUILD)/tests/test_list.h: $(TEST_SRC) tests/gen_list.sh
	@mkdir -p $(dir $@)
	sh tests/gen_list.sh $@ $(TEST_SRC)

$(BUILD)/tests/runner.o: tests/runner.c $(BUILD)/tests/test_list.h
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -DDFL_TEST_HOOKS -I$(BUILD)/tests -c $< -o $@

$(BUILD)/dflash-tests: $(TEST_OBJ) $(BUILD)/libdflash-test.a
	$(CC) $(ALL_CFLAGS) -o $@ $(TEST_OBJ) $(BUILD)/libdflash-test.a $(LDFLAGS) $(LDLIBS) $(TEST_LDLIBS) $(SERVE_LIBS)

# Runs every test (C unit tests, CLI tests, numpy reference and llama.cpp peer tests; the last
# two skip with a message where python3-numpy or node are missing).
test: toolchains $(BUILD)/dflash $(BUILD)/dflash-tests $(if $(filter build,$(BUILD)),$(BUILD)/libdflash.so)
	DFLASH_CLI=$(BUILD)/dflash ./$(BUILD)/dflash-tests $(T)

# Dependencies (Debian packages and the pinned npm peers); idempotent.
deps:
	sh tools/install-deps.sh

# The README's two commands.
# `make check`: everything CI runs (the plain suite, then ASan+UBSan, then TSan on the threaded tests;
# the sanitizer builds are CPU-only: without a GPU the CUDA tests skip anyway).
# The TSan filters (substrings of test names; the runner refuses one that matches no test): the
# thread pool itself (test_cpu_pool.c), threaded matmul and vocab, the backend queues and events,
# the async feature-order tests.
TSAN_TESTS ?= pool thread queue event feature_order
# The builds use every core (JOBS); the tests themselves run one after another.
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
check: deps
	$(MAKE) -j$(JOBS) all
	$(MAKE) -j$(JOBS) test
	$(MAKE) -j$(JOBS) asan
	$(MAKE) -j$(JOBS) tsan T="$(TSAN_TESTS)"
run: deps
	$(MAKE) -j$(JOBS) all
	./$(BUILD)/dflash generate -n 96 -p 'def read_config(path):'
	./$(BUILD)/dflash generate -n 64 -p 'And the LORD spake unto Moses, saying,'

# ASan+UBSan at -O2: the suite runs about 2.3x faster than at -O1 (the SIMD kernels dominate it), for
# a longer build of the kernel files (UBSan's checks make GCC slow there; the build runs in parallel).
ASAN_OPT ?= -O2
asan:
	$(MAKE) BUILD=build-asan CUDA=0 OPT=$(ASAN_OPT) EXTRA_CFLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
	        LDFLAGS="-fsanitize=address,undefined" CLI_LIB=build-asan/libdflash-test.a test

tsan:
	$(MAKE) BUILD=build-tsan CUDA=0 OPT=-O1 EXTRA_CFLAGS="-fsanitize=thread" LDFLAGS="-fsanitize=thread" \
	        CLI_LIB=build-tsan/libdflash-test.a test

FUZZ_SRC := $(sort $(wildcard tests/fuzz/fuzz_*.c))
FUZZ_BIN := $(FUZZ_SRC:tests/fuzz/%.c=build-fuzz/%)
# the server's parser and JSON mapping (no sockets) go into the fuzz targets
FUZZ_SERVE_SRC := tools/serve/http.c tools/serve/api.c
fuzz:
	@if [ -z "$(CLANG)" ]; then echo "make fuzz needs clang"; exit 1; fi
	$(MAKE) BUILD=build-fuzz CUDA=0 CC=clang OPT=-O1 EXTRA_CFLAGS="-fsanitize=fuzzer-no-link,address,undefined" build-fuzz/libdflash.a
	@for f in $(FUZZ_SRC); do n=$$(basename $$f .c); \
	  echo "clang $$f -> build-fuzz/$$n"; \
	  clang $(CFLAGS_BASE) -O1 -g -fsanitize=fuzzer,address,undefined $$f $(FUZZ_SERVE_SRC) build-fuzz/libdflash.a $(LDLIBS_CPU) $(SERVE_LIBS) -o build-fuzz/$$n || exit 1; done
	@echo "fuzz targets: $(FUZZ_BIN)  (run e.g. build-fuzz/fuzz_gguf -max_total_time=600 tests/fuzz/corpus_gguf)"

install: all
	install -d $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 644 $(BUILD)/libdflash.a $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(BUILD)/libdflash.so $(DESTDIR)$(PREFIX)/lib/
	install -m 644 include/dflash.h $(DESTDIR)$(PREFIX)/include/
	install -m 755 $(BUILD)/dflash $(DESTDIR)$(PREFIX)/bin/
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' dflash.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/dflash.pc

# `make models`: retrain the embedded default pair (models/*.gguf) from scratch with PyTorch
# (~90 min on 2 cores; not in CI, which only uses the committed GGUFs). See models/README.md.
models:
	sh train/make_models.sh

clean:
	rm -rf build build-asan build-tsan build-fuzz

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

# `make bench-ops`: CPU backend matmul micro-benchmark (tests/bench/bench_ops.c).
.PHONY: bench-ops
$(BUILD)/bench_ops: tests/bench/bench_ops.c $(BUILD)/libdflash.a
	$(CC) $(ALL_CFLAGS) -o $@ $< $(BUILD)/libdflash.a $(LDFLAGS) $(LDLIBS)
bench-ops: $(BUILD)/bench_ops
	./$(BUILD)/bench_ops $(BENCH_ARGS)

# `make bench-peak`: the int8 multiply rate (vpdpbusd, or vpmaddubsw without VNNI) with no memory traffic (tests/bench/bench_peak.c).
.PHONY: bench-peak
$(BUILD)/bench_peak: tests/bench/bench_peak.c
	@mkdir -p $(BUILD)
	$(CC) $(CFLAGS_BASE) $(CFLAGS) -o $@ $< -lpthread
bench-peak: $(BUILD)/bench_peak
	./$(BUILD)/bench_peak $(BENCH_ARGS)
