#!/usr/bin/env python3
"""Prints the import graph between a crate's top-level modules (from its
`crate::` paths) and exits 1 if the graph has a circle.

    python3 scripts/modcycles.py orchestrator/src

CI runs it on every crate (none has an import circle). `tests`
modules are left out: a test may reach anything."""
import os, re, sys
root = sys.argv[1]
def modname(path):
    rel = os.path.relpath(path, root)[:-3]
    parts = rel.split(os.sep)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return "::".join(parts)
mods = {}
for d, _, fs in os.walk(root):
    for f in fs:
        if f.endswith(".rs"):
            p = os.path.join(d, f)
            mods[modname(p)] = open(p).read()
names = set(mods)
def top(m):  # group by top-level module
    return m.split("::")[0] if m else "<root>"
edges = {}
for m, src in mods.items():
    tm = top(m)
    if tm == "tests":
        continue
    refs = re.findall(r"crate::([a-z_][a-z0-9_]*)", src)
    for grp in re.findall(r"crate::\{([^}]*)\}", src):
        refs += re.findall(r"(?:^|[,{\s])([a-z_][a-z0-9_]*)(?=::|\s*[,}]|$)", grp)
    for ref in refs:
        if ref in names and top(ref) != tm and top(ref) != "tests":
            edges.setdefault(tm, set()).add(top(ref))
# find cycles (Tarjan SCC)
idx = {}; low = {}; st = []; on = set(); out = []; c = [0]
def sc(v):
    idx[v] = low[v] = c[0]; c[0] += 1; st.append(v); on.add(v)
    for w in edges.get(v, ()):
        if w not in idx:
            sc(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], idx[w])
    if low[v] == idx[v]:
        comp = []
        while True:
            w = st.pop(); on.discard(w); comp.append(w)
            if w == v: break
        if len(comp) > 1: out.append(comp)
for v in list(edges):
    if v not in idx: sc(v)
for a in sorted(edges): print(a, "->", ", ".join(sorted(edges[a])))
if out:
    print("CYCLES:", out); sys.exit(1)
print("no import circle")
