#!/usr/bin/env bash
# tests/target_from_gguf.sh: tools/train/target_from_gguf.py (a Kimi-Linear target's Hugging
# Face checkpoint rebuilt from its GGUF, for training drafters against it) against ember's own
# converter:
#
#   - the default target (models/, Q8_0): rebuilt, then `ember convert --type q8_0` again gives
#     every tensor byte for byte and every key but general.name (the folder's name);
#   - the transformers 5.17 fixture (tests/fixtures/kimi_tf5, F32): converted at F32 and
#     rebuilt, every tensor equals the checkpoint's under its own name and shape (A_log within a
#     float's rounding: it goes through -exp and back), and config.json's fields equal the
#     fixture's where both have them;
#   - bad input exits non-zero naming what is wrong and leaves no folder: a drafter GGUF, a
#     truncated GGUF, an output folder that exists.
#
# Env (set by CTest): EMBER_BIN, EMBER_SRC, EMBER_BUILD.
set -u

SRC="${EMBER_SRC:-$(cd "$(dirname "$0")/.." && pwd)}"
BUILD="${EMBER_BUILD:-$SRC/build}"
EMBER="${EMBER_BIN:-$BUILD/ember}"
. "$SRC/tests/lib/check.sh"
em_need_exes target_from_gguf "$EMBER"
command -v python3 >/dev/null || { echo "skipped: python3 is needed"; exit 77; }
TOOL="$SRC/tools/train/target_from_gguf.py"
T="$SRC/models/kimi-linear-19m-q8_0.gguf"
FX="$SRC/tests/fixtures/kimi_tf5"

W="$BUILD/testtmp/target_from_gguf"
rm -rf "$W"
mkdir -p "$W"

# same_gguf.py TOOLS A.gguf B.gguf: tensors byte for byte, keys but general.name
cat >"$W/same_gguf.py" <<'EOF'
import sys
sys.path.insert(0, sys.argv[1])
import gguf_io
_, _, va, ta, _ = gguf_io.read_gguf(sys.argv[2])
_, _, vb, tb, _ = gguf_io.read_gguf(sys.argv[3])
tb = {t["name"]: t for t in tb}
bad = [t["name"] for t in ta if t["name"] not in tb or (tb[t["name"]]["dims"], tb[t["name"]]["raw"]) != (t["dims"], t["raw"])]
keys = sorted(k for k in set(va) | set(vb) if k != "general.name" and va.get(k) != vb.get(k))
print("%d tensors, %d differ %s; keys that differ: %s" % (len(ta), len(bad), bad[:5], keys))
sys.exit(1 if bad or keys or len(ta) != len(tb) else 0)
EOF

python3 "$TOOL" "$T" --out "$W/target" 2>"$W/q8.err" && pass || { fail "rebuild the default target"; cat "$W/q8.err"; }
grep -q "493 tensors, 19048968 values, 8 layers (KKKMKKKM)" "$W/q8.err" && pass || fail "summary: $(tail -1 "$W/q8.err")"
"$EMBER" convert "$W/target" -o "$W/again.gguf" --type q8_0 >"$W/conv.log" 2>&1 && pass || { fail "convert it again"; tail -5 "$W/conv.log"; }
python3 "$W/same_gguf.py" "$SRC/tools" "$T" "$W/again.gguf" && pass || fail "the default target's round trip"

"$EMBER" convert "$FX" -o "$W/tf5.gguf" --type f32 >"$W/conv5.log" 2>&1 && pass || { fail "convert kimi_tf5"; tail -5 "$W/conv5.log"; }
python3 "$TOOL" "$W/tf5.gguf" --out "$W/tf5" 2>"$W/tf5.err" && pass || { fail "rebuild kimi_tf5"; cat "$W/tf5.err"; }
python3 - "$FX" "$W/tf5" "$SRC/tools/train" <<'EOF' && pass || fail "kimi_tf5 rebuilt"
import array, json, sys
sys.path.insert(0, sys.argv[3])
from assemble_drafter import read_st

def load(path):
    out = {}
    for k, (dtype, shape, raw) in read_st(path + "/model.safetensors").items():
        assert dtype == "F32", (k, dtype)
        out[k] = (shape, array.array("f", raw))
    return out

ref, got = load(sys.argv[1]), load(sys.argv[2])
bad = sorted(set(ref) ^ set(got))
for k, (shape, v) in ref.items():
    if k not in got:
        continue
    gs, gv = got[k]
    if gs != shape:
        bad.append("%s shape %s != %s" % (k, gs, shape))
    elif k.endswith("A_log"):
        if any(abs(x - y) > 1e-6 * max(1.0, abs(x)) for x, y in zip(v, gv)):
            bad.append(k)
    elif v != gv:
        bad.append(k)
cr, cg = (json.load(open(p + "/config.json")) for p in sys.argv[1:3])
keys = ["hidden_size", "intermediate_size", "kv_lora_rank", "linear_attn_config", "moe_intermediate_size",
        "num_attention_heads", "num_experts", "num_experts_per_token", "num_hidden_layers", "num_shared_experts",
        "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "vocab_size", "first_k_dense_replace",
        "moe_renormalize", "moe_router_activation_func", "routed_scaling_factor", "rms_norm_eps", "rope_theta"]
for k in keys:
    want = cr.get(k, cr.get("text_config", {}).get(k))
    if k == "linear_attn_config" and want is not None:
        want = {x: want[x] for x in ("full_attn_layers", "head_dim", "kda_layers", "num_heads", "short_conv_kernel_size")}
    if want is not None and cg.get(k) != want:
        bad.append("config %s: %r != %r" % (k, cg.get(k), want))
print("%d tensors compared; wrong: %s" % (len(ref), bad[:8]))
sys.exit(1 if bad else 0)
EOF

# bad input: each exits non-zero, names the problem, leaves no folder
expect_refusal() { # NAME PATTERN ARGS...
    local name="$1" pat="$2"
    shift 2
    if python3 "$TOOL" "$@" 2>"$W/bad.err"; then fail "$name: accepted"; return; fi
    grep -q "$pat" "$W/bad.err" && pass || fail "$name: message '$(tail -1 "$W/bad.err")'"
}
expect_refusal "a drafter" "architecture 'dflash'" "$SRC/models/dspark-kimi-linear-19m-q8_0.gguf" --out "$W/bad1"
[ ! -e "$W/bad1" ] && [ ! -e "$W/bad1.partial" ] && pass || fail "a drafter left a folder"
head -c 20000000 "$T" >"$W/cut.gguf"
expect_refusal "a truncated GGUF" "cut.gguf: .*past the end" "$W/cut.gguf" --out "$W/bad2"
[ ! -e "$W/bad2" ] && pass || fail "a truncated GGUF left a folder"
expect_refusal "an existing folder" "target exists" "$T" --out "$W/target"

finish
