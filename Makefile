# libuprobe: the two commands of the README.
#   make test   install missing packages, configure, build, run the whole ctest suite
#   make bench  same set-up, then run every uprobe-bench variant for 1..nproc producers
#   make fuzz-smoke  build the libFuzzer targets (tests/fuzz, clang) in $(FUZZ_BUILD) and run each
#               for FUZZ_SECONDS over the checked-in corpora (CI runs it after make test)
BUILD ?= build
JOBS ?= $(shell nproc)
BENCH_ARGS ?=
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 25
FUZZ_TARGETS ?= usdt_args stapsdt probe_spec xol
FUZZ_CC ?= clang
FUZZ_CXX ?= clang++

.PHONY: all deps configure build test bench fuzz-build fuzz-smoke clean

all: build

deps:
	@tools/install-deps

configure: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

bench: build
	@$(BUILD)/bench/uprobe-bench --sweep $(BENCH_ARGS)

fuzz-build: deps
	@cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=$(FUZZ_CC) \
	  -DCMAKE_CXX_COMPILER=$(FUZZ_CXX) -DUPROBE_FUZZ=ON -DUPROBE_BUILD_TESTS=OFF -DUPROBE_BUILD_BENCH=OFF >/dev/null
	@cmake --build $(FUZZ_BUILD) --target fuzz -j $(JOBS)

fuzz-smoke: fuzz-build
	@tests/fuzz/run-fuzzers $(FUZZ_BUILD) $(FUZZ_SECONDS) $(FUZZ_TARGETS)

clean:
	rm -rf $(BUILD) $(FUZZ_BUILD)
