#!/usr/bin/env python3
"""Fails when a crate's modules import each other in a circle (ARCHITECTURE.md,
"Invariants"). A module depends on another when its code (not its comments) names it
through `crate::` or `super::`; a parent and its own submodules do not count. A
textual check, not the compiler's: enough to keep the module graph a tree of layers."""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def modules(src):
    found = {}
    for root, _, files in os.walk(src):
        for name in files:
            if name.endswith(".rs"):
                path = os.path.join(root, name)
                module = os.path.relpath(path, src)[:-3]
                module = module[:-4] if module.endswith("/mod") else module
                found[module.replace("/", "::")] = open(path, encoding="utf-8").read()
    return found


def graph(src):
    found = modules(src)
    names = set(found) - {"lib", "main"}
    edges = {}
    for module, text in found.items():
        text = re.sub(r"^\s*//.*$", "", text, flags=re.M)
        text = re.sub(r"#\[cfg\(test\)\]\s*mod tests \{.*", "", text, flags=re.S)
        parent = module.rsplit("::", 1)[0] if "::" in module else ""
        named = re.findall(r"crate::((?:\w+::)*\w+)", text)
        named += [f"{parent}::{r}" if parent else r for r in re.findall(r"super::(\w+)", text)]
        targets = set()
        for path in named:
            parts = path.split("::")
            for i in range(len(parts), 0, -1):
                if "::".join(parts[:i]) in names:
                    targets.add("::".join(parts[:i]))
                    break
        edges[module] = {t for t in targets if t != module
                         and not t.startswith(module + "::") and not module.startswith(t + "::")}
    return edges


def circles(edges):
    """Tarjan's strongly connected components of more than one module."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return out


def main():
    sys.setrecursionlimit(10000)
    failed = False
    # The facade at the root, then every crate folder.
    crates = [""] + sorted(d for d in os.listdir(ROOT)
                           if os.path.isfile(os.path.join(ROOT, d, "Cargo.toml")))
    for crate in crates:
        src = os.path.join(ROOT, crate, "src")
        if not os.path.isdir(src):
            continue
        for circle in circles(graph(src)):
            failed = True
            print(f"import circle in {crate or 'distlock'}: {' <-> '.join(circle)}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
