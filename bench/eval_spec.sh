#!/usr/bin/env bash
# bench/eval_spec.sh: the speculative-decoding eval of the default model pair (models/), on the
# CPU: the first 64 HumanEval prompts (raw, code completion) and the first turns of the first 64
# MT-Bench questions (--chat), copied with their licenses into bench/eval/; greedy and T = 0.7;
# 128 tokens per prompt on 2 threads. Prints tau, per-position acceptance, median generation
# tok/s of plain vs speculative decoding and their ratio, and checks that speculative greedy
# tokens equal plain greedy tokens (exit 1 otherwise). bench/eval_spec.py says how each number
# is derived. Takes a few minutes.
#
#   bench/eval_spec.sh [-n 128] [--threads 2] [--limit 64] [--temps 0,0.7] [--sets humaneval,mt_bench]
#                      [--plain-only] [--expert-cache SIZE] [--no-spec-memory]
#                      [--json-out RUNS.json] [-- -m TARGET.gguf --draft DRAFT.gguf]
#
# EMBER_BIN selects the binary (default build/ember, built by `make`). Needs python3 (standard
# library only).
set -euo pipefail
cd "$(dirname "$0")/.."
export EMBER_BIN=${EMBER_BIN:-build/ember}
[ -x "$EMBER_BIN" ] || { echo "eval_spec.sh: $EMBER_BIN is not built (run make, or set EMBER_BIN)" >&2; exit 1; }
exec python3 bench/eval_spec.py "$@"
