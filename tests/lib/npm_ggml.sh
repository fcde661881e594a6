# tests/lib/npm_ggml.sh: sourced by script tests that need ggml/llama.cpp's own libraries (the
# npm prebuilt @node-llama-cpp/linux-x64@3.22.1: libggml-base.so, libggml*.so, libllama*.so and
# the libggml-cpu-*.so backend plugins, all in one "bins" folder, CPU-only, no headers).
#
#   . "$SRC/tests/lib/npm_ggml.sh"
#   BINS=$(em_npm_ggml_bins "$SRC") || exit $?     # 77 (skip) when npm cannot install it
#
# em_npm_ggml_bins SRC installs the package into SRC/.deps/npm (ignored by git) unless it is
# already there, and prints the bins folder. It returns 77 with the reason on stderr when npm
# is missing or cannot reach the registry (the caller exits 77: ctest reports a skip), 1 when
# the package installed but lacks a library. Concurrent callers (ctest -j) take turns through
# a lock file, so only one of them runs npm.
EM_NPM_GGML_PKG="@node-llama-cpp/linux-x64@3.22.1"

em_npm_ggml_bins() {
    local src="$1"
    local prefix="$src/.deps/npm"
    local bins="$prefix/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64"
    if ! em_npm_ggml_complete "$bins"; then
        if ! command -v npm >/dev/null 2>&1; then
            echo "skipped: npm is not installed, cannot fetch $EM_NPM_GGML_PKG" >&2
            return 77
        fi
        mkdir -p "$prefix" || return 1
        (
            # one installer at a time; the others wait and then find it installed
            if command -v flock >/dev/null 2>&1; then flock -w 600 9 || exit 1; fi
            em_npm_ggml_complete "$bins" && exit 0
            echo "installing $EM_NPM_GGML_PKG into $prefix" >&2
            timeout 300 npm install --prefix "$prefix" --no-save --no-audit --no-fund \
                "$EM_NPM_GGML_PKG" >"$prefix/install.log" 2>&1
            exit 0
        ) 9>"$prefix/.install.lock"
        if ! em_npm_ggml_complete "$bins"; then
            if [ -d "$bins" ]; then
                echo "$EM_NPM_GGML_PKG installed, but $bins lacks libggml-base.so or libllama" >&2
                return 1
            fi
            echo "skipped: npm could not install $EM_NPM_GGML_PKG (offline or registry unreachable):" >&2
            tail -n 5 "$prefix/install.log" 2>/dev/null | sed 's/^/  npm: /' >&2
            return 77
        fi
    fi
    printf '%s\n' "$bins"
}

# True when bins holds ggml's base library, libggml and libllama (any version suffix).
em_npm_ggml_complete() {
    local bins="$1"
    [ -f "$bins/libggml-base.so" ] || return 1
    compgen -G "$bins/libggml.*so*" >/dev/null || return 1
    compgen -G "$bins/libllama.*so*" >/dev/null || return 1
}
