# The two set-up commands of the README, plus the steps they are made of.
BUILD ?= build
JOBS ?= $(shell nproc)
# Tests at once: one more than the cores. Many tests spend part of their time waiting on
# their subprocesses (ranks, daemons, Slurm, Python references); with as many tests as cores,
# two cores were 70% busy over ctest's run, with one more the whole run took 22% less time
# (docs/benchmarks.md, "make test: one test more than the cores").
TEST_JOBS ?= $(shell echo $$(( $$(nproc) + 1 )))
CMAKE_ARGS ?=

.PHONY: deps configure build bench test run format clean

deps:
	@scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

# The build plus the benchmark programs (bench/), which `make test` does not run and so the
# default build leaves out; the scripts in bench/ call this before they run one.
bench: configure
	@cmake --build $(BUILD) -j $(JOBS) --target all benchmarks

# CPU ranks take their MFU peak from DIFFTRAIN_CPU_PEAK_GFLOPS (about one core's sgemm here)
# rather than measuring it at each start: ~0.15-0.2 s a rank on one thread, ~30% of a small
# multi-rank test (docs/metrics.md). Tests that check the measurement unset it.
test: build
	cd $(BUILD) && DIFFTRAIN_CPU_PEAK_GFLOPS=$${DIFFTRAIN_CPU_PEAK_GFLOPS:-40} \
	  ctest --output-on-failure -j $(TEST_JOBS)

# Trains the default job (a small DiT on Fashion-MNIST, a few minutes on a CPU) the way a
# cluster does, with a controller and a worker daemon on this machine (`difftrain run`),
# then draws one row of samples per class from its EMA weights.
run: build
	$(BUILD)/difftrain run jobs/default.yaml
	$(BUILD)/difftrain sample --checkpoint runs/default/checkpoints --classes 0,1,2,3,4,5,6,7,8,9 \
	  --per-class 10 --sampler ddim --steps 50 --cfg 3 --out runs/default/samples.png
	@echo "difftrain: checkpoints in runs/default/checkpoints, samples in runs/default/samples.png"

format:
	clang-format -i $$(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')

clean:
	rm -rf $(BUILD)
