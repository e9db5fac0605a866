#!/usr/bin/env python3
"""Lists the cycles between the modules of src/: a module (a file) that names another module,
directly or through others, that names it back.

A module names another when its code (not its comments, tests or `pub(in ...)` visibility) says
`crate::a::b`, `super::x` or `super::{x, y}`, or, in a mod.rs, `child::`. A parent declaring its
children (`mod x;`) is not naming them.

    scripts/module-cycles.py [SRC] [-v]    # SRC: default src; -v: every edge too

Exit status: 0 without cycles, 1 with (each cycle and its edges are printed).
"""
import os
import re
import sys


def modules(src):
    """Module path (`init::runs::life`) -> file, for every .rs file below src."""
    out = {}
    for root, _, files in os.walk(src):
        for f in files:
            if f.endswith(".rs"):
                path = os.path.join(root, f)
                parts = os.path.relpath(path, src)[:-3].split("/")
                if parts[-1] in ("mod", "lib", "main"):
                    parts = parts[:-1]
                out["::".join(parts)] = path
    return out


def code_of(path):
    """The file's code: without its test module, comments and `pub(in ...)` paths."""
    text = open(path).read()
    text = re.split(r"#\[cfg\(test\)\]\s*(?:pub\(crate\) )?mod tests", text)[0]
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r"pub\(in [^)]*\)", "pub", text)


def edges(mods):
    """Module -> the modules it names."""
    out = {}
    for m, path in mods.items():
        text = code_of(path)
        parts = m.split("::") if m else []
        is_dir = os.path.basename(path) in ("mod.rs", "lib.rs", "main.rs")
        # What `super` is: the parent of the module (for mod.rs, of the directory's module).
        def up(n):
            return parts[: len(parts) - n] if is_dir else parts[: len(parts) - 1 - (n - 1)]

        named = set()
        for mm in re.finditer(r"crate::([a-z_]+(?:::[a-z_]+)*)", text):
            named.add(tuple(mm.group(1).split("::")))
        for mm in re.finditer(r"(?<!::)\b((?:super::)+)([a-z_]+(?:::[a-z_]+)*)", text):
            named.add(tuple(up(mm.group(1).count("super::")) + mm.group(2).split("::")))
        for mm in re.finditer(r"\b(crate|(?:super::)*super)::\{([^}]*)\}", text):
            base = [] if mm.group(1) == "crate" else up(mm.group(1).count("super"))
            for item in mm.group(2).split(","):
                item = item.strip().split("::")[0].split(" ")[0]
                if item and item[0].islower():
                    named.add(tuple(base + [item]))
        if is_dir:
            for mm in re.finditer(r"(?<![:\w])([a-z_]+)::", text):
                named.add(tuple(parts + [mm.group(1)]))
        for t in named:
            # The longest prefix that is a module: `init::runs::Runs` names `init::runs`.
            for k in range(len(t), 0, -1):
                target = "::".join(t[:k])
                if target in mods:
                    if target != m:
                        out.setdefault(m, set()).add(target)
                    break
    return out


def cycles(graph):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
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
                found.append(sorted(comp))

    for v in sorted(set(graph) | {w for ws in graph.values() for w in ws}):
        if v not in index:
            visit(v)
    return found


def main():
    args = [a for a in sys.argv[1:] if a != "-v"]
    graph = edges(modules(args[0] if args else "src"))
    if "-v" in sys.argv:
        for m in sorted(graph):
            print(m or "(crate)", "->", ", ".join(sorted(graph[m])))
    found = cycles(graph)
    for comp in found:
        print("cycle:", " ".join(comp))
        for a in comp:
            for b in sorted(graph.get(a, ())):
                if b in comp:
                    print("   ", a, "->", b)
    if not found:
        print("no cycles between modules")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
