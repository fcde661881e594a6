#!/usr/bin/env bash
# The one script the device machine runs (docs/cuda.md, "Testing on the device"). It builds
# nothing: it runs the binaries carried beside it (scripts/gpu_bundle.sh made DIR/bin and
# DIR/lib) with LD_LIBRARY_PATH=DIR/lib, writes full logs under $OUT when set, and prints a
# short PASS/FAIL table last. Exit status: non-zero when any step failed.
# Usage: bash DIR/run.sh   (DIR: the folder holding this script, bin/ and lib/)
set -uo pipefail
dir=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$dir/out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
declare -a names=() states=()
step() { # step NAME COMMAND...: runs it, output to $out/NAME.log and the terminal
  local name=$1
  shift
  echo "=== $name: $*"
  "$@" 2>&1 | tee "$out/$name.log"
  local rc=${PIPESTATUS[0]}
  names+=("$name")
  if [ "$rc" -eq 0 ]; then states+=("PASS"); else states+=("FAIL (exit $rc)"); fi
}
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,clocks.sm,clocks.mem --format=csv 2>&1 | tee "$out/nvidia-smi.log"
if command -v cuobjdump >/dev/null 2>&1 && [ -x "$dir/bin/test_gpu_ops" ]; then
  # the build carries sm_90 machine code and compute_90 PTX (cmake/cuda.cmake)
  step cuobjdump bash -c "cuobjdump --list-elf '$dir/bin/test_gpu_ops' && cuobjdump --list-ptx '$dir/bin/test_gpu_ops' | head -5 && cuobjdump --list-elf '$dir/bin/test_gpu_ops' | grep -q sm_90 && cuobjdump --list-ptx '$dir/bin/test_gpu_ops' | grep -q sm_90"
fi
[ -x "$dir/bin/test_gpu" ] && step test_gpu "$dir/bin/test_gpu"
step test_gpu_ops "$dir/bin/test_gpu_ops" ${EMBER_GPU_TEST_FLAGS:-}
# sequence state (KDA forward/commit, MLA cache and attention): tests/cuda/test_gpu_seq.c
[ -x "$dir/bin/test_gpu_seq" ] && step test_gpu_seq "$dir/bin/test_gpu_seq"
if command -v compute-sanitizer >/dev/null 2>&1 && [ -n "${EMBER_GPU_SANITIZE:-}" ]; then
  # memcheck over every check (no benchmarks), bounded: exit 124 means it ran out of time. API
  # errors are not reported: the error-path checks provoke some on purpose (a 1 PiB cudaMalloc)
  # and assert them themselves.
  step sanitizer timeout "${EMBER_GPU_SANITIZE_SECONDS:-150}" compute-sanitizer --tool memcheck --leak-check no \
    --report-api-errors no --error-exitcode 3 "$dir/bin/test_gpu_ops" --no-bench
  grep -h "ERROR SUMMARY" "$out/sanitizer.log" 2>/dev/null
  # the sequence-state kernels too (shared-memory staging, cp.async): checks only
  [ -x "$dir/bin/test_gpu_seq" ] && step sanitizer_seq timeout "${EMBER_GPU_SANITIZE_SECONDS:-150}" compute-sanitizer \
    --tool memcheck --leak-check no --report-api-errors no --error-exitcode 3 "$dir/bin/test_gpu_seq" --no-bench
  grep -h "ERROR SUMMARY" "$out/sanitizer_seq.log" 2>/dev/null
fi
echo
grep -h "^bench\|^info" "$out/test_gpu_ops.log" "$out/test_gpu_seq.log" 2>/dev/null
grep -h "^FAIL" "$out/test_gpu_ops.log" "$out/test_gpu_seq.log" 2>/dev/null
echo "== device run summary =="
fail=0
for i in "${!names[@]}"; do
  printf '%-14s %s\n' "${names[$i]}" "${states[$i]}"
  [ "${states[$i]}" = PASS ] || fail=1
done
exit $fail
