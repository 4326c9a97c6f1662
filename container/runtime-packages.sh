#!/usr/bin/env bash
# Prints the Debian/Ubuntu packages that own the shared libraries BINARY loads, one per
# line: what the runtime stage installs so the binary runs there. The GPU driver's
# libraries are left out: the NVIDIA container runtime mounts them from the host.
set -euo pipefail
binary=${1:?usage: container/runtime-packages.sh BINARY}

libraries=$(ldd "$binary" | awk '
  /not found/ && $1 !~ /^lib(cuda|nvidia-ml)\.so/ { print "missing " $1; next }
  $2 == "=>" && $3 ~ /^\// { print $3 }')
if grep -q '^missing ' <<<"$libraries"; then
  echo "runtime-packages: $binary needs libraries that are not installed:" >&2
  grep '^missing ' <<<"$libraries" >&2
  exit 1
fi
for library in $libraries; do
  real=$(readlink -f "$library")
  # dpkg knows a file by the path its package installed; /lib is a link to /usr/lib.
  dpkg -S "$real" 2>/dev/null || dpkg -S "$library" 2>/dev/null || dpkg -S "${real#/usr}" \
    || { echo "runtime-packages: no package owns $library" >&2; exit 1; }
done | cut -d: -f1 | sort -u
