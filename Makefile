# libuprobe: the two commands of the README.
#   make test   install missing packages, configure, build, run the whole ctest suite
#   make bench  same set-up, then run every uprobe-bench variant for 1..nproc producers
BUILD ?= build
JOBS ?= $(shell nproc)
BENCH_ARGS ?=

.PHONY: all deps configure build test bench clean

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

clean:
	rm -rf $(BUILD)
