#!/usr/bin/env bash
# tests/layering.sh: the layer order docs/ARCHITECTURE.md writes down is the order the code keeps.
#
# Reads the table under "## Layers" in docs/ARCHITECTURE.md (first column: one or more src/
# folders per row, lowest row first) and checks, for every file under src/:
#   - each `#include "F/..."` of another src/ folder F names a folder of a LOWER row
#     (folders sharing a row are peers and include neither each other);
#   - every src/ folder appears in the table (a new folder gets a place in the order);
#   - inside each folder, the headers' includes of one another form no cycle (a tree, not a
#     circle).
# Fails listing every offending include, with file and line.
set -euo pipefail
SRC="${EMBER_SRC:-$(cd "$(dirname "$0")/.." && pwd)}"
exec python3 - "$SRC" <<'PY'
import os, re, sys
root = sys.argv[1]
doc = open(os.path.join(root, "docs", "ARCHITECTURE.md"), encoding="utf-8").read()
m = re.search(r"^## Layers.*?\n(.*?)(?=^## )", doc, re.S | re.M)
if not m:
    sys.exit("docs/ARCHITECTURE.md: no '## Layers' section")
rank, row = {}, 0
for line in m.group(1).splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if not line.startswith("|") or not cells[0] or set(cells[0]) <= set("-: "):
        continue
    names = re.findall(r"([a-z_]+)/", cells[0])
    if not names:
        continue  # the header row
    for n in names:
        rank[n] = row
    row += 1
src = os.path.join(root, "src")
bad = []
folders = sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d)))
for d in folders:
    if d not in rank:
        bad.append(f"src/{d}/: not in docs/ARCHITECTURE.md's layer table")
inc_re = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
for d in folders:
    headers = {}
    for dirpath, _, files in os.walk(os.path.join(src, d)):
        for f in sorted(files):
            if not f.endswith((".c", ".h", ".cu", ".cuh")):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, root)
            local = []
            for no, text in enumerate(open(path, encoding="utf-8", errors="replace"), 1):
                mm = inc_re.match(text)
                if not mm:
                    continue
                target = mm.group(1)
                if "/" not in target:
                    local.append(target)
                    continue
                other = target.split("/")[0]
                if other == d or other not in rank or d not in rank:
                    if other == d:
                        local.append(target.split("/", 1)[1])
                    continue
                if rank[other] >= rank[d]:
                    bad.append(f"{rel}:{no}: includes {target}, but {other}/ is not below {d}/")
            if f.endswith((".h", ".cuh")):
                headers[os.path.relpath(path, os.path.join(src, d))] = local
    # cycles among this folder's headers
    state = {}
    def visit(h, stack):
        state[h] = 1
        for n in headers.get(h, []):
            if n not in headers:
                continue
            if state.get(n) == 1:
                bad.append(f"src/{d}/: header cycle " + " -> ".join(stack + [h, n]))
            elif not state.get(n):
                visit(n, stack + [h])
        state[h] = 2
    for h in sorted(headers):
        if not state.get(h):
            visit(h, [])
if bad:
    print("layering: %d problem(s)" % len(bad))
    print("\n".join(bad))
    sys.exit(1)
print("layering: %d folders in order (%s), no upward include, no header cycle"
      % (len(folders), " < ".join(sorted(rank, key=lambda k: (rank[k], k)))))
PY
