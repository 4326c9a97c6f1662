#!/bin/sh
# A compiler launcher (CMake's CXX_COMPILER_LAUNCHER) that only checks a source: the compiler
# runs as asked plus -fsyntax-only, which parses and instantiates everything and writes the
# depfile but no object; the object it was asked for is then left empty, for the build tool.
set -e
object=
previous=
for arg in "$@"; do
  [ "$previous" = -o ] && object=$arg
  previous=$arg
done
"$@" -fsyntax-only
: >"$object"
