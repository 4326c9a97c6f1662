# The two set-up commands of the README, plus the steps they are made of.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_ARGS ?=

.PHONY: deps configure build test run format clean

deps:
	@scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

run: build
	$(BUILD)/difftrain train --config jobs/default.yaml

format:
	clang-format -i $$(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')

clean:
	rm -rf $(BUILD)
