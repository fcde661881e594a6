#!/usr/bin/env bash
# tests/draft_vocab.sh: tools/draft_vocab.py (a drafter with a reduced draft vocabulary) on the
# default pair (models/), with a small corpus (the repository's tools/train/*.py):
#
#   - the written drafter holds d2t (I64, --keep values, ascending target ids, in range) and
#     output.weight / markov_w2.weight of --keep rows (ember inspect --json), every other
#     tensor as it was; the input file is not changed;
#   - ember loads it, and greedy speculative decoding with it gives exactly the plain tokens
#     (the target verifies every draft);
#   - bad input exits non-zero naming what is wrong, writing nothing: --keep 0, a target (not
#     a drafter), a drafter that already has d2t.
#
# Env (set by CTest): EMBER_BIN, EMBER_SRC, EMBER_BUILD.
set -u

SRC="${EMBER_SRC:-$(cd "$(dirname "$0")/.." && pwd)}"
BUILD="${EMBER_BUILD:-$SRC/build}"
EMBER="${EMBER_BIN:-$BUILD/ember}"
. "$SRC/tests/lib/check.sh"
em_need_exes draft_vocab "$EMBER"
command -v python3 >/dev/null || { echo "skipped: python3 is needed"; exit 77; }
T="$SRC/models/kimi-linear-19m-q8_0.gguf"
D="$SRC/models/dspark-kimi-linear-19m-q8_0.gguf"
TOOL="$SRC/tools/draft_vocab.py"

W="$BUILD/testtmp/draft_vocab"
rm -rf "$W"
mkdir -p "$W"
before=$(sha256sum "$D" | cut -d' ' -f1)
python3 "$TOOL" --ember "$EMBER" --drafter "$D" --target "$T" --corpus "$SRC/tools/train" --keep 512 \
    -o "$W/d512.gguf" 2>"$W/tool.err" && pass || { fail "draft_vocab.py"; cat "$W/tool.err"; }
grep -q "512 of 8192 tokens kept" "$W/tool.err" && pass || fail "summary line: $(tail -1 "$W/tool.err")"
check "input unchanged" "$before" "$(sha256sum "$D" | cut -d' ' -f1)"

"$EMBER" inspect "$D" --json >"$W/in.json" 2>/dev/null && "$EMBER" inspect "$W/d512.gguf" --json >"$W/out.json" \
    2>"$W/inspect.err" && pass || { fail "ember inspect"; cat "$W/inspect.err"; }
python3 - "$W/in.json" "$W/out.json" "$W/d512.gguf" <<'EOF' && pass || fail "tensors of the reduced drafter"
import json, struct, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
ta = {t["name"]: t for t in a["tensors"]}
tb = {t["name"]: t for t in b["tensors"]}
assert set(tb) == set(ta) | {"d2t"}, sorted(set(tb) ^ set(ta))
for name, t in ta.items():
    want = t["shape"] if name not in ("output.weight", "markov_w2.weight") else t["shape"][:1] + [512]
    assert tb[name]["shape"] == want and tb[name]["type"] == t["type"], (name, tb[name], want)
assert tb["d2t"]["shape"] == [512] and tb["d2t"]["type"] in ("i64", "I64"), tb["d2t"]
EOF
# the same tokens as plain decoding, greedy (and the drafter proposed something)
tokens() { "$EMBER" run -m "$T" --temp 0 -n 48 --threads 2 -p "def parse_args(argv):" --json "$@" 2>"$W/run.err" |
    tail -1 | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["tokens"], d["spec"]["drafted"] > 0)'; }
plain=$(tokens --draft none) || fail "plain run: $(cat "$W/run.err")"
spec=$(tokens --draft "$W/d512.gguf" --spec-policy always) || fail "speculative run: $(cat "$W/run.err")"
check "greedy tokens, reduced drafter vs plain" "${plain% *}" "${spec% *}"
check "the reduced drafter drafted" "True" "${spec##* }"

# bad input: a message naming it, exit non-zero, nothing written
bad() { # bad WHAT EXPECTED-TEXT ARGS...
    local what=$1 want=$2
    shift 2
    if python3 "$TOOL" --ember "$EMBER" "$@" -o "$W/bad.gguf" >/dev/null 2>"$W/bad.err"; then
        fail "$what: accepted"
    elif ! grep -q "$want" "$W/bad.err"; then
        fail "$what: message '$(cat "$W/bad.err")' lacks '$want'"
    elif [ -e "$W/bad.gguf" ]; then
        fail "$what: wrote a file"
    else
        pass
    fi
}
bad "--keep 0" "must be in" --drafter "$D" --target "$T" --corpus "$SRC/tools/train" --keep 0
bad "a target as drafter" "is not a drafter" --drafter "$T" --target "$T" --corpus "$SRC/tools/train"
bad "a drafter with d2t" "is not a drafter" --drafter "$W/d512.gguf" --target "$T" --corpus "$SRC/tools/train"
bad "not a GGUF" "is not a GGUF file" --drafter "$TOOL" --target "$T" --corpus "$SRC/tools/train"
finish
