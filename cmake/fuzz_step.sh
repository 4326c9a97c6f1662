#!/bin/sh
# One step of a fuzz target's build (cmake/fuzzers.cmake). Neither step fails the build: what
# went wrong is written down for the target's test, which fails with it.
#   fuzz_step.sh compile OBJECT SOURCE COMPILER ARGS...
#       compiles SOURCE to OBJECT with OBJECT.d its depfile; on an error OBJECT is left empty
#       (ninja sees its output) and the compiler's messages are in OBJECT.error
#   fuzz_step.sh link BINARY STAMP LINKER ARGS...
#       links BINARY from the objects among the ARGS (*.o); when one of them did not compile or
#       the link fails, no BINARY, and BINARY.error says why
set -u
step=$1
shift
case $step in
compile)
  object=$1 source=$2
  shift 2
  if "$@" -MD -MT "$object" -MF "$object.d" -c "$source" -o "$object.new" 2>"$object.error"; then
    mv "$object.new" "$object"
    rm -f "$object.error"
  else
    rm -f "$object.new"
    : >"$object"
    printf '%s: %s\n' "$object" "$source" >"$object.d"
  fi
  ;;
link)
  binary=$1 stamp=$2
  shift 2
  rm -f "$binary" "$binary.error"
  for arg in "$@"; do
    case $arg in *.o) [ -s "$arg" ] || cat "$arg.error" >>"$binary.error" ;; esac
  done
  if [ ! -s "$binary.error" ] && ! "$@" -o "$binary" 2>"$binary.error"; then
    rm -f "$binary"
  fi
  if [ -x "$binary" ]; then
    rm -f "$binary.error"
  else
    echo "warning: fuzz target ${binary##*/} did not build (its test says why)"
  fi
  touch "$stamp"
  ;;
*)
  echo "fuzz_step.sh: unknown step '$step'" >&2
  exit 2
  ;;
esac
