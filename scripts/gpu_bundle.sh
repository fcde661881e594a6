#!/usr/bin/env bash
# Copies binaries and the non-system shared libraries they need (from ldd) into one folder, so
# that the folder can travel to a machine without them (the device machine: tests/cuda/run.sh
# runs the binaries there with LD_LIBRARY_PATH=FOLDER/lib). Skipped: the C library's own pieces
# (libc, libm, libpthread, libdl, librt, ld-linux) and the driver's libcuda, which the target
# machine must provide itself. The CUDA runtime is linked statically (cmake/cuda.cmake).
# With --pack, the stripped binaries and libraries go into OUT_DIR/bundle.tar.xz instead
# (tests/cuda/run.sh unpacks it there): the device tool carries 64 MiB per call, and the
# binaries with their kernels are ~8 MB each, ~1.5 MB packed.
# Usage: scripts/gpu_bundle.sh [--pack] OUT_DIR BINARY...
set -euo pipefail
pack=0
if [ "${1:-}" = --pack ]; then
  pack=1
  shift
fi
if [ $# -lt 2 ]; then
  echo "usage: $0 [--pack] OUT_DIR BINARY..." >&2
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
if [ "$pack" = 1 ]; then
  strip --strip-debug "$out"/bin/* "$out"/lib/* 2>/dev/null || true
  # the device machine (Ubuntu 24.04) has these itself
  rm -f "$out"/lib/libcrypto.so.3 "$out"/lib/libstdc++.so.6 "$out"/lib/libgcc_s.so.1
  tar -C "$out" -cf - bin lib | xz -9 -T2 >"$out/bundle.tar.xz"
  rm -rf "$out/bin" "$out/lib"
fi
du -sh "$out" | awk -v o="$out" '{ print "gpu_bundle: " o " holds " $1 }'
ls "$out"
