"""Prints the import cycles among each Rust crate's top-level modules (exit 1 if any).

Usage: modcycles.py CRATE/src [CRATE/src ...]

A module's edges are the `crate::NAME` paths it mentions (use statements and inline
paths), tests excluded. A name the crate root re-exports (`pub use watchdog::LostCause;`)
counts as an edge to the module it comes from, so a cycle through the root shows too.
A name the root itself defines (a trait in lib.rs) is reported separately: every layer
importing the root is an arrow that runs back up. Rough by design: text, not a compiler.

Copied from the team's shared tools (shared/tools/modcycles.py, beside the project); scripts/test.sh runs it.
"""
import os
import re
import sys


def strip(text, tests=False):
    if not tests:
        text = re.split(r"#\[cfg\(test\)\]", text)[0]
    return re.sub(r"//[^\n]*", "", text)


def root_names(src):
    """(re-exported name -> module, names defined in the root)."""
    for f in ("lib.rs", "main.rs"):
        path = os.path.join(src, f)
        if os.path.exists(path):
            rt = strip(open(path).read(), tests=True)
            break
    else:
        return {}, set()
    reexport = {}
    for mod, body in re.findall(r"pub use (\w+)::\{([^}]*)\}", rt, re.S):
        for n in re.findall(r"\w+", body):
            reexport[n] = mod
    for mod, n in re.findall(r"pub use (\w+)::(\w+)\s*;", rt):
        reexport[n] = mod
    defined = set(re.findall(r"pub (?:trait|struct|enum|type|const) (\w+)", rt))
    return reexport, defined


def graph_of(src):
    reexport, defined = root_names(src)
    mods, uses_root = {}, {}
    for root, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs") or (root == src and f in ("lib.rs", "main.rs")):
                continue
            rel = os.path.relpath(os.path.join(root, f), src)
            name = rel.split(os.sep)[0].removesuffix(".rs")
            text = strip(open(os.path.join(root, f)).read())
            deps = mods.setdefault(name, set())
            found = re.findall(r"crate::(\w+)", text)
            for group in re.findall(r"crate::\{([^}]*)\}", text, re.S):
                found += re.findall(r"(?:^|,)\s*(\w+)", group)
            for m in found:
                m = reexport.get(m, m)
                if m in defined:
                    uses_root.setdefault(name, set()).add(m)
                elif m != name:
                    deps.add(m)
    names = set(mods)
    return {m: {d for d in deps if d in names} for m, deps in mods.items()}, uses_root


def sccs(graph):
    index, low, stack, on, out, i = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = i[0]
        i[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            strong(v)
    return out


bad = False
for src in sys.argv[1:] or ["src"]:
    graph, uses_root = graph_of(src)
    found = sccs(graph)
    if found:
        bad = True
        print(f"{src}: cycle: " + "; ".join(" <-> ".join(c) for c in found))
    if uses_root:
        names = sorted({n for ns in uses_root.values() for n in ns})
        print(f"{src}: note: {len(uses_root)} modules import {', '.join(names)} defined in the crate root")
sys.exit(1 if bad else 0)
