# tests/lib/check.sh: sourced by the script tests (tests/*.sh) for the set-up they share:
# pass/fail counting, the key=value reader for compat_llama_ref's reports, the "build first"
# check and the ASan preload that llama.cpp's libraries need.
#
#   . "$SRC/tests/lib/check.sh"
#   em_need_exes NAME "$EMBER" "$REF"    # exit 1 unless each is an executable
#   ...; pass; fail "what went wrong"; check "what" WANT GOT
#   finish                               # prints the counts, exits 0 only when nothing failed

passed=0
failed=0
pass() { passed=$((passed + 1)); }
fail() { failed=$((failed + 1)); echo "FAIL: $*"; }
finish() {
    echo "$passed passed, $failed failed"
    [ "$failed" -eq 0 ]
    exit $?
}
# check NAME WANT GOT
check() { if [ "$2" = "$3" ]; then pass; else fail "$1: want '$2', got '$3'"; fi; }
# val KEY FILE: the value of the first line KEY=value in FILE
val() { sed -n "s/^$1=//p" "$2" | head -n 1; }

# em_need_exes NAME FILE...: exits 1 (a failure, not a skip) when a program is not built.
em_need_exes() {
    local name="$1" f
    shift
    for f in "$@"; do
        if [ ! -x "$f" ]; then
            echo "$name: $f is missing (build first)"
            exit 1
        fi
    done
}

# em_preload_stdcxx_for_asan EXE: clang's ASan runtime (linked statically) can intercept C++
# exceptions only when libstdc++ is there at start-up, but llama.cpp's libraries bring it in
# later through dlopen, and the first exception they throw (a model that fails to load) would
# trip an ASan CHECK. gcc's libasan depends on libstdc++ itself and must come first, so only
# the clang case preloads.
em_preload_stdcxx_for_asan() {
    if nm "$1" 2>/dev/null | grep -q ' T __asan_init$'; then
        export LD_PRELOAD="libstdc++.so.6${LD_PRELOAD:+:$LD_PRELOAD}"
    fi
}
