#!/usr/bin/env bash
# Installs every Debian package that difftrain's build and tests need.
# Idempotent: prints nothing and touches nothing when all packages are present.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config clang-format
  libzmq3-dev cppzmq-dev libyaml-cpp-dev prometheus-cpp-dev libspdlog-dev libfmt-dev
  libgloo-dev libopenblas-openmp-dev libcli11-dev nlohmann-json3-dev libpng-dev zlib1g-dev
  libjpeg-dev libicu-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  # The MPI launch mode and communicator (optional in the build): Open MPI, whose mpirun the
  # tests use, and PMIx for Slurm's `srun --mpi=pmix` (slurm-wlm-basic-plugins' mpi_pmix).
  libopenmpi-dev openmpi-bin libpmix2
  python3-torch python3-numpy dataset-fashion-mnist
  # diffusers' LMSDiscreteScheduler integrates its coefficients with scipy (the sampler
  # reference, tests/reference/schedulers.py).
  python3-scipy
  # An independent GIF decoder for the tests of difftrain's GIF writer (model/io/gif.h).
  python3-pil
  # The metrics tests (tests/metrics): a real Prometheus server and promtool.
  prometheus
  # The Slurm tests (tests/slurm): a real slurmctld and two slurmd on this machine.
  slurm-wlm munge
  # The fuzz targets (cmake/fuzzers.cmake): clang with libFuzzer.
  clang libclang-rt-14-dev
  # The container image (container/): ccache for its build stage's compiles; podman, buildah,
  # runc and mmdebstrap to build its Debian base and the image, and run it, without a daemon
  # or a registry (container/build-image.sh).
  ccache podman buildah runc mmdebstrap
  # The chart tests' tools from PyPI, Helm and kubernetes-validate (tests/k8s/tools.sh).
  python3-venv python3-pip unzip
)
# DIFFTRAIN_DEPS=build: only what compiling difftrain needs (the container image's build
# stage), without the packages that only tests and tools use.
if [[ "${DIFFTRAIN_DEPS:-all}" == build ]]; then
  test_only=" clang-format python3-torch python3-numpy python3-scipy python3-pil dataset-fashion-mnist prometheus \
slurm-wlm munge clang libclang-rt-14-dev podman buildah runc mmdebstrap python3-venv \
python3-pip unzip "
  for i in "${!packages[@]}"; do
    if [[ "$test_only" == *" ${packages[$i]} "* ]]; then unset 'packages[i]'; fi
  done
fi

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "install-deps: installing ${missing[*]}"
sudo=""
[[ $(id -u) -eq 0 ]] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
