#!/usr/bin/env bash
# Copies binaries and the non-system shared libraries they need (from ldd) into one folder, so
# that the folder can travel to a machine without them (the device machine: tests/cuda/run.sh
# runs the binaries there with LD_LIBRARY_PATH=FOLDER/lib). Skipped: the C library's own pieces
# (libc, libm, libpthread, libdl, librt, ld-linux) and the driver's libcuda, which the target
# machine must provide itself. The CUDA runtime is linked statically (cmake/cuda.cmake).
# Usage: scripts/gpu_bundle.sh OUT_DIR BINARY...
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 OUT_DIR BINARY..." >&2
  exit 2
fi
out=$1
shift
mkdir -p "$out/bin" "$out/lib"
for bin in "$@"; do
  [ -f "$bin" ] && [ -x "$bin" ] || { echo "gpu_bundle: $bin is not an executable file" >&2; exit 1; }
  cp -f "$bin" "$out/bin/"
  # lines "name => /path (addr)"; a "not found" library is an error here, not on the device
  if ldd "$bin" | grep -q "not found"; then
    echo "gpu_bundle: $bin needs libraries this machine lacks:" >&2
    ldd "$bin" | grep "not found" >&2
    exit 1
  fi
  ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | while read -r name path; do
    case "$name" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda.so*|linux-vdso*) continue ;;
    esac
    cp -fL "$path" "$out/lib/$name"
  done
done
du -sh "$out" | awk -v o="$out" '{ print "gpu_bundle: " o " holds " $1 }'
ls "$out/bin" "$out/lib"
