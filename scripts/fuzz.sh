#!/usr/bin/env bash
# Runs every libFuzzer target in BUILD_DIR for SECONDS each, on a scratch copy of its seed
# corpus (fuzz/corpus/<name without fuzz_>/), so new inputs never land in the repo.
# A crash leaves its input in fuzz/artifacts/ (ignored by git) and fails the script.
# Usage: scripts/fuzz.sh BUILD_DIR SECONDS
set -euo pipefail
build=${1:?usage: fuzz.sh BUILD_DIR SECONDS}
seconds=${2:?usage: fuzz.sh BUILD_DIR SECONDS}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$root/fuzz/artifacts"
status=0
shopt -s nullglob
targets=("$build"/fuzz_*)
[ ${#targets[@]} -gt 0 ] || { echo "fuzz: no targets in $build"; exit 1; }
for target in "${targets[@]}"; do
  [ -x "$target" ] || continue
  name=$(basename "$target")
  work=$(mktemp -d)
  [ -d "$root/fuzz/corpus/${name#fuzz_}" ] && cp -r "$root/fuzz/corpus/${name#fuzz_}/." "$work/"
  echo "fuzz: $name for ${seconds}s ($(ls "$work" | wc -l) seeds)"
  if ! "$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -artifact_prefix="$root/fuzz/artifacts/$name-" -print_final_stats=1 "$work" \
      >"$work.log" 2>&1; then
    echo "fuzz: $name FOUND A PROBLEM"; tail -n 40 "$work.log"; status=1
  else
    grep -E "^Done [0-9]+ runs" "$work.log" | tail -n 1
  fi
  rm -rf "$work" "$work.log"
done
exit $status
