#!/usr/bin/env bash
# tests/ggml_compat.sh: proves that Ember reads and writes GGUF exactly as ggml does, with
# ggml's own library (npm package @node-llama-cpp/linux-x64, libggml-base.so) as the judge.
#
#   ggml -> Ember: files written by ggml's gguf API (every metadata type, alignments, every
#     tensor type, a split set); `ember inspect --json` must print what ggml reads back,
#     `ember tensor` must dequantize every tensor bit for bit as ggml's to_float (a type Ember
#     says it cannot read must fail cleanly instead), and Ember reading a file and writing
#     back all it read must reproduce ggml's file byte for byte.
#   Ember -> ggml: files written by Ember's writer (incl. a split set); ggml must load each and
#     find every key, value, tensor info and byte Ember meant, Ember's quantized bytes must
#     equal ggml_quantize_chunk's, and each file must be byte for byte what ggml's writer
#     produces for the same content. compat_quant_vs_ggml (the exhaustive quant check) runs too
#     when it is built, and so does compat_dot_vs_ggml (Ember's activation quantization and dot
#     kernels against the CPU backend's from_float / vec_dot, libggml-cpu-*.so).
#
# Env (set by CTest): EMBER_BIN (the ember CLI), EMBER_SRC (repo root), EMBER_BUILD (build
# folder with compat_* programs). Exit 77 (skip) when the npm package cannot be installed.
set -u

SRC="${EMBER_SRC:-$(cd "$(dirname "$0")/.." && pwd)}"
BUILD="${EMBER_BUILD:-$SRC/build}"
EMBER="${EMBER_BIN:-$BUILD/ember}"
PROBE="$BUILD/compat_gguf_probe"
JSONDIFF="$BUILD/compat_json_diff"
QUANT="$BUILD/compat_quant_vs_ggml"
DOT="$BUILD/compat_dot_vs_ggml"

. "$SRC/tests/lib/check.sh"
em_need_exes ggml_compat "$EMBER" "$PROBE" "$JSONDIFF"

# ---- the reference library ---------------------------------------------------------------
. "$SRC/tests/lib/npm_ggml.sh"
BINS=$(em_npm_ggml_bins "$SRC") || { rc=$?; echo "ggml_compat: cannot use ggml's library"; exit $rc; }

WORK="$BUILD/testtmp/ggml_compat"
rm -rf "$WORK"
mkdir -p "$WORK/ggml" "$WORK/ember" "$WORK/out"

# ---- ggml -> Ember -------------------------------------------------------------------------
echo "== ggml writes, Ember reads"
if "$PROBE" write-ggml "$BINS" "$WORK/ggml" >"$WORK/write-ggml.log" 2>&1; then
    pass
else
    fail "compat_gguf_probe write-ggml:"
    sed 's/^/  /' "$WORK/write-ggml.log"
fi

if [ -f "$WORK/ggml/manifest.tsv" ]; then
    n=0 n_json=0 n_bits=0 refused=
    while IFS=$'\t' read -r -u 3 kind file a b c d; do
        n=$((n + 1))
        case "$kind" in
        json)
            want="$a"
            got="$WORK/out/$n.json"
            n_json=$((n_json + 1))
            if ! "$EMBER" inspect "$file" --json >"$got" 2>"$got.err"; then
                fail "ember inspect $file --json exited non-zero: $(head -c 400 "$got.err")"
            elif "$JSONDIFF" "$want" "$got" >"$got.diff" 2>&1; then
                pass
            else
                fail "ember inspect --json of $(basename "$file") differs from what ggml reads:"
                cat "$got.diff"
            fi
            # Ember reading and writing back a single ggml file reproduces it byte for byte
            # (a split set is not: Ember's writer lays out shards by its own byte budget)
            case "$file" in
            *-00001-of-*) ;;
            *)
                if "$PROBE" rewrite-ember "$file" >"$got.rewrite" 2>&1; then
                    pass
                else
                    fail "Ember's rewrite of $(basename "$file"):"
                    sed 's/^/  /' "$got.rewrite"
                fi
                ;;
            esac
            ;;
        tensor)
            name="$a" want="$b" readable="$c" type="$d"
            got="$WORK/out/$n.f32"
            "$EMBER" tensor "$file" "$name" -o "$got" >"$got.log" 2>&1
            rc=$?
            if [ "$readable" = 1 ]; then
                n_bits=$((n_bits + 1))
                if [ $rc -ne 0 ]; then
                    fail "ember tensor $(basename "$file") $name ($type) exited $rc: $(head -c 400 "$got.log")"
                elif cmp -s "$want" "$got"; then
                    pass
                else
                    fail "ember tensor $(basename "$file") $name ($type) differs from ggml's to_float:"
                    "$PROBE" cmp-f32 "$want" "$got" | sed 's/^/  /'
                fi
            else
                # Ember says it cannot read this type: it must refuse cleanly (exit 1, message)
                if [ $rc -eq 1 ] && [ -s "$got.log" ]; then
                    pass
                    case " $refused " in *" $type "*) ;; *) refused="$refused $type" ;; esac
                else
                    fail "ember tensor $(basename "$file") $name ($type, not readable by Ember) should fail with exit 1 and a message, got exit $rc"
                fi
            fi
            ;;
        esac
    done 3<"$WORK/ggml/manifest.tsv"
    echo "   $n_json files inspected; $n_bits tensors dequantized and compared bit for bit"
    echo "   types Ember declines to dequantize (checked to fail cleanly):${refused:- none}"
fi

# ---- Ember -> ggml --------------------------------------------------------------------------
echo "== Ember writes, ggml reads"
if "$PROBE" write-ember "$WORK/ember" >"$WORK/write-ember.log" 2>&1; then
    pass
else
    fail "compat_gguf_probe write-ember:"
    sed 's/^/  /' "$WORK/write-ember.log"
fi
if [ -f "$WORK/ember/files.txt" ]; then
    n_read=0 n_same=0
    while read -r -u 3 file; do
        if "$PROBE" read-ggml "$BINS" "$file" >"$WORK/out/read.log" 2>&1; then
            pass
            n_read=$((n_read + 1))
            grep -q "byte for byte" "$WORK/out/read.log" && n_same=$((n_same + 1))
        else
            fail "ggml reading Ember's $(basename "$file"):"
            head -n 40 "$WORK/out/read.log" | sed 's/^/  /'
        fi
    done 3<"$WORK/ember/files.txt"
    echo "   $n_read files (or split sets) read by ggml exactly as Ember meant;" \
        "$n_same of them byte for byte what ggml's own writer produces"
fi

# ---- quantization, exhaustively (the quant helper's program) -------------------------------
if [ -x "$QUANT" ]; then
    echo "== compat_quant_vs_ggml"
    if "$QUANT" "$BINS" >"$WORK/quant.log" 2>&1; then
        pass
    else
        fail "compat_quant_vs_ggml:"
        tail -n 40 "$WORK/quant.log" | sed 's/^/  /'
    fi
fi

# ---- dot products against ggml's CPU backend ---------------------------------------------
if [ -x "$DOT" ]; then
    echo "== compat_dot_vs_ggml"
    "$DOT" "$BINS" >"$WORK/dot.log" 2>&1
    rc=$?
    if [ $rc -eq 0 ]; then
        pass
    elif [ $rc -eq 77 ]; then
        echo "   skipped: $(tail -n 1 "$WORK/dot.log")"
    else
        fail "compat_dot_vs_ggml (exit $rc):"
        tail -n 40 "$WORK/dot.log" | sed 's/^/  /'
    fi
fi

finish
