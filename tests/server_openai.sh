#!/usr/bin/env bash
# tests/server_openai.sh: `ember serve` driven by a client nobody here wrote: the official
# `openai` npm package (pinned below), installed into the ignored folder .deps/npm-openai, used
# unmodified by tests/server/openai_client.mjs: models, chat and completions (plain and
# streaming, the SDK's own stream helper), usage and timings, greedy text against `ember run`,
# and errors as the SDK's typed exceptions. Skips (77) when node/npm are missing or the npm
# registry is unreachable.
set -u
OPENAI_PKG="openai@6.49.0" # the newest 6.x; 7.x needs Node 22 and the machine has Node 20

for tool in node npm curl jq; do
    command -v "$tool" >/dev/null 2>&1 || { echo "skipped: $tool is not installed (scripts/deps.sh)"; exit 77; }
done
. "$EMBER_SRC/tests/server/lib.sh"

PREFIX="$EMBER_SRC/.deps/npm-openai"
installed() { [ -f "$PREFIX/node_modules/openai/package.json" ] &&
    [ "$(jq -r .version "$PREFIX/node_modules/openai/package.json")" = "${OPENAI_PKG#openai@}" ]; }
if ! installed; then
    mkdir -p "$PREFIX" || exit 1
    (
        if command -v flock >/dev/null 2>&1; then flock -w 600 9 || exit 1; fi
        installed && exit 0
        echo "installing $OPENAI_PKG into $PREFIX" >&2
        timeout 300 npm install --prefix "$PREFIX" --no-save --no-audit --no-fund "$OPENAI_PKG" >"$PREFIX/install.log" 2>&1
        exit 0
    ) 9>"$PREFIX/.install.lock"
    if ! installed; then
        echo "skipped: npm could not install $OPENAI_PKG (offline or registry unreachable):"
        tail -n 5 "$PREFIX/install.log" 2>/dev/null | sed 's/^/  npm: /'
        exit 77
    fi
fi

srv_setup
srv_start S --api-key test-key-123 --alias kimi-test

"$EMBER_BIN" run -m "$MODEL" --temp 0 -n 16 --chat -p "Hello world" >"$WORK/ref_chat.txt" 2>/dev/null
"$EMBER_BIN" run -m "$MODEL" --temp 0 -n 16 -p "Hello world" >"$WORK/ref_comp.txt" 2>/dev/null
n_prompt=$("$EMBER_BIN" tokenize -m "$MODEL" --chat -p "Hello world" | tr ',' '\n' | wc -l)

timeout 120 node "$EMBER_SRC/tests/server/openai_client.mjs" "$PREFIX" "$S_URL/v1" test-key-123 kimi-test \
    "$WORK/ref_chat.txt" "$WORK/ref_comp.txt" "$n_prompt"
rc=$?
check "the openai client's checks pass (exit $rc)" test "$rc" = 0
srv_stop S
srv_finish
