# libuprobe: the two commands of the README.
#   make test   install missing packages, configure, build, run the whole ctest suite
#   make bench  same set-up, then run every uprobe-bench variant for 1..nproc producers
# and the sanitizer runs of the same suite (CI runs test-asan and test-tsan after `make test`):
#   make test-asan  ASan + UBSan build in build-asan, ctest without the no-asan label
#   make test-tsan  TSan build in build-tsan, ctest without the no-tsan label
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

# Every report is fatal (the build uses -fno-sanitize-recover=all; TSan exits
# non-zero at the end of a process with a report). detect_leaks stays on.
ASAN_ENV = ASAN_OPTIONS=abort_on_error=0:detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=0 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
TSAN_ENV = TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

.PHONY: all deps configure build test bench fuzz-build fuzz-smoke clean test-asan test-tsan

all: build

deps:
	@tools/install-deps

configure: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DUPROBE_BUILD_TESTS=ON -DUPROBE_BUILD_BENCH=ON >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

test: build
	@cd $(BUILD) && ctest --output-on-failure --no-tests=error -j $(JOBS)

bench: build
	@$(BUILD)/bench/uprobe-bench --sweep $(BENCH_ARGS)

# $(1): build dir, $(2): -fsanitize list, $(3): label to exclude, $(4): environment.
define sanitized_test
	@cmake -S . -B $(1) -DCMAKE_BUILD_TYPE=Release -DUPROBE_SANITIZE=$(2) -DUPROBE_BUILD_TESTS=ON >/dev/null
	@cmake --build $(1) -j $(JOBS)
	@cd $(1) && $(4) ctest --output-on-failure --no-tests=error -j $(JOBS) -LE '^$(3)$$'
endef

test-asan: deps
	$(call sanitized_test,build-asan,address$(comma)undefined,no-asan,$(ASAN_ENV))

test-tsan: deps
	$(call sanitized_test,build-tsan,thread,no-tsan,$(TSAN_ENV))

comma := ,


fuzz-build: deps
	@cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=$(FUZZ_CC) \
	  -DCMAKE_CXX_COMPILER=$(FUZZ_CXX) -DUPROBE_FUZZ=ON -DUPROBE_BUILD_TESTS=OFF -DUPROBE_BUILD_BENCH=OFF >/dev/null
	@cmake --build $(FUZZ_BUILD) --target fuzz -j $(JOBS)

fuzz-smoke: fuzz-build
	@tests/fuzz/run-fuzzers $(FUZZ_BUILD) $(FUZZ_SECONDS) $(FUZZ_TARGETS)

clean:
	rm -rf $(BUILD) $(FUZZ_BUILD) build-asan build-tsan
