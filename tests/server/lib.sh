# tests/server/lib.sh: sourced by the `ember serve` script tests (tests/server_*.sh). Converts
# the tiny fixture model, starts servers on free loopback ports (--port 0: the server binds a
# port the system picks and prints it, so there is no race between choosing and binding),
# waits for /health, and always stops them (EXIT trap), each step bounded in time.
#
#   . "$EMBER_SRC/tests/server/lib.sh"
#   srv_setup                      # $WORK (temp dir), $MODEL (converted kimi_a), the trap
#   srv_start A [serve flags...]   # sets A_URL=http://127.0.0.1:PORT, A_PID; logs to $WORK/A.log
#   srv_stop A                     # SIGTERM, waits, checks the exit status and sanitizer output
#   ok "what" / bad "what"         # counted; srv_finish prints "N passed, M failed" and exits

: "${EMBER_BIN:?EMBER_BIN must name the ember binary}"
: "${EMBER_SRC:?EMBER_SRC must name the source tree}"

N_PASS=0
N_FAIL=0
SRV_NAMES=()

ok() { N_PASS=$((N_PASS + 1)); echo "ok: $*"; }
bad() { N_FAIL=$((N_FAIL + 1)); echo "FAIL: $*" >&2; }
# check "what" CMD...: ok when CMD succeeds
check() { local what="$1"; shift; if "$@"; then ok "$what"; else bad "$what"; fi; }

srv_cleanup() {
    local name pid
    for name in "${SRV_NAMES[@]}"; do
        pid_var="${name}_PID"
        pid="${!pid_var:-}"
        [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null
    done
    for name in "${SRV_NAMES[@]}"; do
        pid_var="${name}_PID"
        pid="${!pid_var:-}"
        [ -z "$pid" ] && continue
        for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null
    done
    [ -n "${WORK:-}" ] && [ -z "${KEEP_WORK:-}" ] && rm -rf "$WORK"
}

srv_setup() {
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/ember-serve.XXXXXX") || exit 1
    trap srv_cleanup EXIT
    trap 'echo "interrupted" >&2; exit 1' INT TERM
    MODEL="$WORK/kimi_a.gguf"
    if ! timeout 120 "$EMBER_BIN" convert "$EMBER_SRC/tests/fixtures/kimi_a" -o "$MODEL" --type f32 \
        >"$WORK/convert.log" 2>&1; then
        cat "$WORK/convert.log" >&2
        echo "FAIL: cannot convert the fixture model" >&2
        exit 1
    fi
}

# srv_start NAME [flags]: starts `ember serve -m $MODEL --port 0 flags` and waits until ready.
srv_start() {
    local name="$1"; shift
    local log="$WORK/$name.log" port="" i
    "$EMBER_BIN" serve -m "$MODEL" --host 127.0.0.1 --port 0 "$@" >"$log" 2>&1 &
    local pid=$!
    printf -v "${name}_PID" '%s' "$pid"
    SRV_NAMES+=("$name")
    for i in $(seq 1 200); do
        port=$(sed -n 's/^ember serve: listening on http:\/\/[^ ]*:\([0-9][0-9]*\)$/\1/p' "$log")
        [ -n "$port" ] && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
    done
    if [ -z "$port" ]; then
        cat "$log" >&2
        echo "FAIL: server $name did not start" >&2
        exit 1
    fi
    printf -v "${name}_URL" 'http://127.0.0.1:%s' "$port"
    printf -v "${name}_PORT" '%s' "$port"
    for i in $(seq 1 600); do
        [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://127.0.0.1:$port/health")" = 200 ] && return 0
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
    done
    cat "$log" >&2
    echo "FAIL: server $name never became ready" >&2
    exit 1
}

# srv_stop NAME: SIGTERM; the server must exit 0 within 10 s, without sanitizer reports.
srv_stop() {
    local name="$1" pid_var="${1}_PID"
    local pid="${!pid_var}" rc i
    kill -TERM "$pid" 2>/dev/null
    for i in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
        bad "server $name did not stop within 10 s of SIGTERM"
        kill -KILL "$pid"
    fi
    wait "$pid"; rc=$?
    printf -v "${name}_PID" '%s' ""
    check "server $name exits 0 on SIGTERM (got $rc)" test "$rc" = 0
    if grep -qE 'AddressSanitizer|LeakSanitizer|ThreadSanitizer|runtime error:' "$WORK/$name.log"; then
        bad "server $name: sanitizer report"
        grep -A20 -E 'AddressSanitizer|LeakSanitizer|ThreadSanitizer|runtime error:' "$WORK/$name.log" | head -60 >&2
    else
        ok "server $name: no sanitizer report"
    fi
}

srv_finish() {
    echo "$N_PASS passed, $N_FAIL failed"
    [ "$N_FAIL" = 0 ] || { KEEP_WORK=1; echo "logs kept in $WORK" >&2; exit 1; }
    exit 0
}
