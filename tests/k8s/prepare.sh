#!/usr/bin/env bash
# Makes the chart tests' tools: OUT_DIR/helm-render (tests/k8s/render, built offline from
# Debian's Go packages) and checks that the Kubernetes schema (python3-kubernetes) imports.
# Whatever is missing is installed through scripts/install-deps.sh, as every build does;
# an install or build that fails fails the tests, never skips them.
set -euo pipefail
out=${1:?usage: tests/k8s/prepare.sh OUT_DIR}
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"

export GOPATH=/usr/share/gocode GO111MODULE=off GOFLAGS= GOCACHE="$out/go-cache"
have_tools() {
  command -v go >/dev/null &&
    [[ -d $GOPATH/src/github.com/Masterminds/sprig && -d $GOPATH/src/sigs.k8s.io/yaml ]] &&
    /usr/bin/python3 -c 'import kubernetes.client' 2>/dev/null
}
if ! have_tools; then
  echo "prepare: Go, sprig or python3-kubernetes missing; running scripts/install-deps.sh"
  "$root/scripts/install-deps.sh"
  have_tools || { echo "prepare: still missing after install-deps.sh" >&2; exit 1; }
fi
cd "$root/tests/k8s/render"
go build -o "$out/helm-render.new" . && mv "$out/helm-render.new" "$out/helm-render"
