#!/usr/bin/env bash
# The one script the device machine runs (docs/cuda.md, "Testing on the device"). It builds
# nothing: it runs the binaries carried beside it (scripts/gpu_bundle.sh made DIR/bin and
# DIR/lib) with LD_LIBRARY_PATH=DIR/lib, writes full logs under DIR/out (and, when $OUT is set,
# all of them packed as $OUT/logs.tgz: the device tool brings back only a few files), and prints
# a short PASS/FAIL table last. Exit status: non-zero when any step failed.
# Usage: bash DIR/run.sh   (DIR: the folder holding this script, bin/ and lib/)
set -uo pipefail
dir=$(cd "$(dirname "$0")" && pwd)
out=$dir/out
mkdir -p "$out"
[ -n "${OUT:-}" ] && trap 'tar czf "$OUT/logs.tgz" -C "$out" . 2>/dev/null' EXIT
# a bundle made with gpu_bundle.sh --pack: unpacked in place
if [ -f "$dir/bundle.tar.xz" ] && [ ! -d "$dir/bin" ]; then tar -C "$dir" -xJf "$dir/bundle.tar.xz" || exit 1; fi
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
# the CUDA target (model/kimi_cuda.c) against the CPU target and transformers' logits: the
# fixtures are converted here by the carried ember (tests/fixtures/ from the repository root,
# the current folder) into DIR/models
convert_fixtures() {
  mkdir -p "$dir/models"
  local c
  for c in kimi_a:f32 kimi_a:q8_0 kimi_b:f32 kimi_b:q8_0 kimi_b_bf16:bf16 kimi_c:f32 kimi_c:q8_0 dspark_deepspec:f32 \
    dspark_deepspec_gated:f32 dspark_specforge_rnn:f32; do
    "$dir/bin/ember" convert "tests/fixtures/${c%%:*}" -o "$dir/models/${c%%:*}_${c##*:}.gguf" --type "${c##*:}" \
      >/dev/null || return 1
  done
}
if [ -x "$dir/bin/test_gpu_target" ] && [ -x "$dir/bin/ember" ]; then
  step convert_fixtures convert_fixtures
  step test_gpu_target "$dir/bin/test_gpu_target" "$dir/models"
  # the drafter on cuda:0 (draft/dspark_cuda.c) against the CPU drafter: tests/cuda/test_gpu_draft.c
  [ -x "$dir/bin/test_gpu_draft" ] && step test_gpu_draft "$dir/bin/test_gpu_draft" "$dir/models"
fi
# the default pair on the 128 eval prompts, greedy speculative == plain, with the target and the
# drafter on cuda:0 (tests/test_default_pair.c; the old-callback comparisons are CPU-only)
[ -x "$dir/bin/test_default_pair" ] && step default_pair_gpu env EMBER_SRC="$PWD" EMBER_TEST_DEVICE=cuda:0 \
  EMBER_TEST_DRAFT_DEVICE=cuda:0 "$dir/bin/test_default_pair"
# the same with every prompt prefilled in wide passes (model/kimi_cuda.c; by default only models
# whose routed experts are large take them)
[ -x "$dir/bin/test_default_pair" ] && step default_pair_gpu_wide env EMBER_GPU_WIDE=1 EMBER_SRC="$PWD" \
  EMBER_TEST_DEVICE=cuda:0 EMBER_TEST_DRAFT_DEVICE=cuda:0 "$dir/bin/test_default_pair"
if [ -x "$dir/bin/ember" ]; then
  # greedy `ember run` on cpu and cuda:0: the same tokens; speculative (the default pair's
  # drafter) equal to plain on cuda:0
  greedy() { "$dir/bin/ember" run --temp 0 -n 48 --json "$@" 2>>"$out/greedy.err" | tail -1 | sed 's/.*"tokens":\(\[[^]]*\]\).*/\1/'; }
  same_tokens() {
    local m=$1 a b c
    a=$(greedy -m "$m" -p "Once upon a time" --device cpu) || return 1
    b=$(greedy -m "$m" -p "Once upon a time" --device cuda:0) || return 1
    echo "cpu:     $a"; echo "cuda:0:  $b"
    [ -n "$a" ] && [ "$a" = "$b" ] || return 1
    if [ -n "${2:-}" ]; then
      c=$(greedy -m "$m" -p "Once upon a time" --device cuda:0 --draft "$2") || return 1
      echo "cuda:0 speculative: $c"
      [ "$a" = "$c" ] || return 1
      # the drafter on cuda:0 too, and a CPU target with a GPU drafter
      c=$(greedy -m "$m" -p "Once upon a time" --device cuda:0 --draft "$2" --draft-device cuda:0) || return 1
      echo "cuda:0 / cuda:0 drafter: $c"
      [ "$a" = "$c" ] || return 1
      c=$(greedy -m "$m" -p "Once upon a time" --device cpu --draft "$2" --draft-device cuda:0) || return 1
      echo "cpu / cuda:0 drafter: $c"
      [ "$a" = "$c" ] || return 1
    fi
  }
  step greedy_fixture same_tokens "$dir/models/kimi_a_f32.gguf"
  # the routed experts through model/kimi_cuda_ep.c with one device (--devices cuda:0: one share
  # of every expert, em_gpu_moe_share + em_gpu_moe_combine, passes issued without graphs): the
  # same logits (every row of a 20-token prompt: passes of 16 and 4 rows) as --device cuda:0,
  # and for a model with a tokenizer (tokens: any second argument) the same greedy tokens, with
  # a drafter too (a second argument other than "-")
  ep_same() {
    local m=$1 ids=1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20 a b
    "$dir/bin/ember" logits -m "$m" --tokens $ids -o "$out/ep_one.f32" --device cuda:0 2>>"$out/ep.err" || return 1
    "$dir/bin/ember" logits -m "$m" --tokens $ids -o "$out/ep_share.f32" --devices cuda:0 2>>"$out/ep.err" || return 1
    cmp "$out/ep_one.f32" "$out/ep_share.f32" || return 1
    grep 'routed experts of' "$out/ep.err" | tail -1
    echo "logits of $ids: the same bytes"
    [ -n "${2:-}" ] || return 0
    [ "$2" = - ] && set -- "$1"
    a=$(greedy -m "$m" -p "Once upon a time" --device cuda:0) || return 1
    b=$(greedy -m "$m" -p "Once upon a time" --devices cuda:0 ${2:+--draft "$2" --draft-device cuda:0}) || return 1
    echo "cuda:0:          $a"; echo "--devices cuda:0: $b"
    [ -n "$a" ] && [ "$a" = "$b" ]
  }
  step experts_devices_fixture ep_same "$dir/models/kimi_b_q8_0.gguf"
  step experts_devices_tokens ep_same "$dir/models/kimi_a_q8_0.gguf" -
  step experts_devices_default ep_same models/kimi-linear-19m-q8_0.gguf models/dspark-kimi-linear-19m-q8_0.gguf
  step greedy_default same_tokens models/kimi-linear-19m-q8_0.gguf models/dspark-kimi-linear-19m-q8_0.gguf
  # commit counters with the whole pair on cuda:0: every pass a fast commit, no full replay
  counters() {
    "$dir/bin/ember" run -m models/kimi-linear-19m-q8_0.gguf --draft models/dspark-kimi-linear-19m-q8_0.gguf \
      -p "def quote(s):" -n 64 --temp 0 --json --spec-policy always --device cuda:0 --draft-device cuda:0 2>>"$out/greedy.err" |
      tail -1 | python3 -c 'import json,sys; s=json.load(sys.stdin)["spec"]; print(s); sys.exit(not (s["passes"] > 0 and s["fast_commits"] == s["passes"] and s["full_replays"] == 0 and s["drafted"] > 0))'
  }
  step commit_counters counters
  step device_errors bash -c "'$dir/bin/ember' run -m models/kimi-linear-19m-q8_0.gguf -p a -n 2 --device cuda:7 \
    >/dev/null 2>'$out/cuda7.err'; rc=\$?; cat '$out/cuda7.err'; [ \$rc = 1 ] && grep -q 'no CUDA device cuda:7' '$out/cuda7.err'"
fi
# the Kimi-Linear-48B-A3B-shaped benchmark (bench/bench_target.c; EMBER_GPU_BENCH48=1): the
# random-weight model written to /dev/shm by the shared generator carried in DIR
if [ -n "${EMBER_GPU_BENCH48:-}" ] && [ -x "$dir/bin/bench_target" ] && [ -f "$dir/kimi_synth_gguf.py" ]; then
  [ -f /dev/shm/k48.gguf ] || step synth48 python3 "$dir/kimi_synth_gguf.py" /dev/shm/k48.gguf
  step bench48 "$dir/bin/bench_target" -m /dev/shm/k48.gguf --device cuda:0 -p "${EMBER_GPU_BENCH_PROMPT:-4096}" \
    -n 128 --reps "${EMBER_GPU_BENCH_REPS:-3}"
  # the same without launch overlap (EMBER_GPU_PDL=0): what programmatic dependent launch gives
  [ -n "${EMBER_GPU_BENCH_NOPDL:-}" ] && step bench48_nopdl env EMBER_GPU_PDL=0 "$dir/bin/bench_target" \
    -m /dev/shm/k48.gguf --device cuda:0 -p 1024 -n 128 --reps "${EMBER_GPU_BENCH_REPS:-3}"
fi
# old against new in one run (EMBER_GPU_BASELINE=FOLDER: another build's bench_target and
# bench_pair, e.g. main's, stripped and carried): the 48B-shaped decode after 512 (verify up to
# 2 rows) with the two builds alternating EMBER_GPU_AB_RUNS times (2), then the default pair with
# each; into out/ab.log, so the numbers come back in logs.tgz whatever the terminal keeps. Only
# ratios within one run count: the same code moves by a few percent between machines.
if [ -n "${EMBER_GPU_BASELINE:-}" ] && [ -x "${EMBER_GPU_BASELINE}/bench_target" ] && [ -x "$dir/bin/bench_target" ] &&
  [ -f "$dir/kimi_synth_gguf.py" ]; then
  [ -f /dev/shm/k48.gguf ] || step synth48 python3 "$dir/kimi_synth_gguf.py" /dev/shm/k48.gguf
  ab() {
    local r v
    for r in $(seq "${EMBER_GPU_AB_RUNS:-2}"); do
      for v in "$EMBER_GPU_BASELINE" "$dir/bin"; do
        echo "=== $v: 48B-shaped decode after 512 (run $r)"
        "$v/bench_target" -m /dev/shm/k48.gguf --device cuda:0 -p 16 -n 128 --reps 3 --ctx-prompt 512 --max-width 2 2>&1 |
          grep -E '^decode|^ +[12] ' || return 1
      done
    done
    for v in "$EMBER_GPU_BASELINE" "$dir/bin"; do
      [ -x "$v/bench_pair" ] || continue
      echo "=== $v: the default pair, target and drafter on cuda:0"
      "$v/bench_pair" --device cuda:0 --draft-device cuda:0 --limit 64 2>&1 | grep -v '^info' || return 1
    done
  }
  step ab ab
fi
# the default pair on the eval prompts in one process (bench/bench_pair.c; EMBER_GPU_BENCH_PAIR=1):
# plain against speculative, the whole pair on cuda:0, then the target on cuda:0 with a CPU drafter
if [ -n "${EMBER_GPU_BENCH_PAIR:-}" ] && [ -x "$dir/bin/bench_pair" ]; then
  step bench_pair_gpu "$dir/bin/bench_pair" --device cuda:0 --draft-device cuda:0 --limit 64
  step bench_pair_gpu_cpu "$dir/bin/bench_pair" --device cuda:0 --draft-device cpu --limit 64
  # the heterogeneous placement (a CPU target, the drafter on cuda:0) against the whole pair on
  # the CPU, at each thread count of EMBER_GPU_PAIR_THREADS (default "2 8")
  for t in ${EMBER_GPU_PAIR_THREADS:-2 8}; do
    step "bench_pair_cpu_gpu_t$t" "$dir/bin/bench_pair" --device cpu --draft-device cuda:0 --threads "$t" --limit 64
    step "bench_pair_cpu_t$t" "$dir/bin/bench_pair" --device cpu --draft-device cpu --threads "$t" --limit 64
  done
fi
# where a decode pass's time goes, kernel by kernel (EMBER_GPU_PROFILE48=1, after the benchmark
# wrote the model): Nsight Compute's duration of each kernel alone, summed per kernel, over a
# 64-token prompt and 8 greedy steps; the summary table is the log's end
if [ -n "${EMBER_GPU_PROFILE48:-}" ] && command -v ncu >/dev/null 2>&1 && [ -f /dev/shm/k48.gguf ]; then
  step profile48 timeout "${EMBER_GPU_PROFILE_SECONDS:-240}" ncu --clock-control none --metrics gpu__time_duration.sum \
    --print-summary per-kernel -k 'regex:^k_(mm|moe|kda|rms|route|quant|mla|add|argmax|embed|swiglu|situ|sigmoid|res|rope)' \
    "$dir/bin/bench_target" -m /dev/shm/k48.gguf --device cuda:0 -p 1 -n 8 --reps 1 --ctx-prompt 64 --max-width 1
fi
# the same on K3's shape scaled to fit (tests/compat/synth_k3.c variant k: AttnRes, latent MoE of
# 256 experts top-16, Q8_0 experts; EMBER_GPU_BENCHK3=1)
if [ -n "${EMBER_GPU_BENCHK3:-}" ] && [ -x "$dir/bin/bench_target" ] && [ -x "$dir/bin/compat_synth_k3" ]; then
  step synthk3 "$dir/bin/compat_synth_k3" /dev/shm/k3k.gguf --variant k
  step benchk3 "$dir/bin/bench_target" -m /dev/shm/k3k.gguf --device cuda:0 -p 1024 -n 128 --reps 3 --ctx-prompt 256
fi
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
  # the drafter (after convert_fixtures): out-of-bounds accesses (with padding after every
  # allocation, so that a write past a buffer into its neighbour shows), reads of device memory
  # nothing wrote, barriers (its checks with 50 draws and no lossless run)
  if [ -x "$dir/bin/test_gpu_draft" ] && [ -d "$dir/models" ]; then
    for tool in memcheck initcheck synccheck; do
      step "sanitizer_draft_$tool" timeout "${EMBER_GPU_SANITIZE_SECONDS:-150}" compute-sanitizer --tool "$tool" \
        $([ "$tool" = memcheck ] && echo --padding 65536) --report-api-errors no --error-exitcode 3 \
        "$dir/bin/test_gpu_draft" "$dir/models" --quick
      grep -h "ERROR SUMMARY" "$out/sanitizer_draft_$tool.log" 2>/dev/null
    done
  fi
fi
echo
grep -h "^bench\|^info" "$out/test_gpu_ops.log" "$out/test_gpu_seq.log" 2>/dev/null
grep -h "^FAIL" "$out/test_gpu_ops.log" "$out/test_gpu_seq.log" "$out/test_gpu_target.log" 2>/dev/null
for b in bench48 bench48_nopdl ab benchk3 bench_pair_gpu bench_pair_gpu_cpu bench_pair_cpu_gpu_t* bench_pair_cpu_t*; do
  for f in "$out"/$b.log; do [ -f "$f" ] && cat "$f"; done
done
echo "== device run summary =="
fail=0
for i in "${!names[@]}"; do
  printf '%-14s %s\n' "${names[$i]}" "${states[$i]}"
  [ "${states[$i]}" = PASS ] || fail=1
done
exit $fail
