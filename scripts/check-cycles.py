#!/usr/bin/env python3
"""Finds import circles among the top-level modules of each crate (and among the TypeScript
client's files): module A uses module B when A's files name `crate::B` (in a `use` or a path)
or, for a `use crate::*` glob, B is re-exported by the crate root or named as `B::`. A circle is a strongly
connected component of more than one module. Exit 1 naming each circle that is not inside
one of the KNOWN circles below. The table is empty: no crate has a circle (docs/architecture.md
says how each is layered), and a new one fails.

    scripts/check-cycles.py            # every crate under crates/ and clients/typescript/src
"""
import glob
import os
import re
import sys

# Circles tolerated for now, by crate (module names): none.
KNOWN = {}

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(line.split("//", 1)[0] for line in text.split("\n"))


def test_only(text):
    """Drops `#[cfg(test)] mod tests { ... }` blocks: tests may use anything."""
    out, depth, skipping = [], 0, False
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if not skipping and line.strip() == "#[cfg(test)]" and i + 1 < len(lines) and re.match(
            r"\s*mod \w+\s*\{", lines[i + 1]
        ):
            skipping, depth = True, 0
            i += 1
            continue
        if skipping:
            depth += line.count("{") - line.count("}")
            if depth <= 0 and "}" in line:
                skipping = False
            i += 1
            continue
        out.append(line)
        i += 1
    return "\n".join(out)


def rust_graph(src):
    modules = {}
    for path in glob.glob(os.path.join(src, "**", "*.rs"), recursive=True):
        rel = os.path.relpath(path, src)
        top = rel.split(os.sep)[0]
        top = top[:-3] if top.endswith(".rs") else top
        if top in ("lib", "main"):
            continue
        if rel.endswith("tests.rs") or os.sep + "tests" + os.sep in rel:
            continue
        modules.setdefault(top, []).append(path)
    root = ""
    for name in ("lib.rs", "main.rs"):
        if os.path.exists(os.path.join(src, name)):
            root += strip_comments(open(os.path.join(src, name)).read())
    reexported = set(re.findall(r"pub(?:\(crate\))?\s+use\s+(\w+)::", root))
    # Items the root re-exports by name (`pub use job::{Job, JobState}`): `crate::Job` is a use
    # of `job`.
    item_home = {}
    for module, names in re.findall(r"pub(?:\(crate\))?\s+use\s+(\w+)::\{([^}]*)\}", root, flags=re.S):
        for name in re.findall(r"\w+", names):
            item_home[name] = module
    for module, name in re.findall(r"pub(?:\(crate\))?\s+use\s+(\w+)::(\w+)\s*;", root):
        item_home[name] = module
    # Items a root glob re-exports (`pub(crate) use open::*`): `crate::backend` is a use of the
    # module that defines `backend`.
    for module in re.findall(r"pub(?:\(crate\))?\s+use\s+(\w+)::\*", root):
        for path in modules.get(module, []):
            defined = re.findall(
                r"^\s*pub(?:\(crate\))?\s+(?:async\s+)?(?:fn|struct|enum|trait|type|const|static)\s+(\w+)",
                strip_comments(open(path).read()),
                flags=re.M,
            )
            for name in defined:
                item_home.setdefault(name, module)
    edges = {m: set() for m in modules}
    for module, paths in modules.items():
        for path in paths:
            text = test_only(strip_comments(open(path).read()))
            named = re.findall(r"\bcrate::(\w+)", text)
            for group in re.findall(r"\buse\s+crate::\{([^}]*)\}", text, flags=re.S):
                named += re.findall(r"(?:^|,)\s*(\w+)", group)
            for used in named:
                used = used if used in modules else item_home.get(used, "")
                if used in modules and used != module:
                    edges[module].add(used)
            if re.search(r"\buse\s+crate::\*", text):
                # A glob brings the root's items: a sibling module is used when it is named
                # (`reads::kinds`), the root's re-exports (`pub(crate) use open::*`) always.
                edges[module] |= {
                    m for m in modules
                    if m != module and (m in reexported or re.search(rf"(?<![:\w]){m}::", text))
                }
    return edges


def ts_graph(src):
    edges = {}
    for path in glob.glob(os.path.join(src, "*.ts")):
        name = os.path.basename(path)[:-3]
        text = open(path).read()
        edges[name] = {
            m for m in re.findall(r"""from\s+["']\./([\w-]+)(?:\.js)?["']""", text) if m != name
        }
    return edges


def circles(edges):
    """Tarjan's strongly connected components of more than one node."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main():
    found = []
    for src in sorted(glob.glob(os.path.join(ROOT, "crates", "*", "src"))):
        crate = os.path.basename(os.path.dirname(src))
        for component in circles(rust_graph(src)):
            found.append((crate, component))
    ts = os.path.join(ROOT, "clients", "typescript", "src")
    if os.path.isdir(ts):
        for component in circles(ts_graph(ts)):
            found.append(("clients/typescript", component))
    failed = False
    for crate, component in found:
        known = set(component) <= KNOWN.get(crate, set())
        failed |= not known
        print(f"check-cycles: {crate}: {len(component)} modules import each other"
              + (" (known, to be broken)" if known else " (NEW)") + ": " + ", ".join(component))
    for crate, modules in sorted(KNOWN.items()):
        left = set().union(*[set(c) for k, c in found if k == crate]) if found else set()
        if modules - left:
            print(f"check-cycles: {crate}: no longer in a circle, remove from KNOWN: "
                  + ", ".join(sorted(modules - left)))
    if failed:
        return 1
    print("check-cycles: no import circle beyond the known ones")
    return 0


if __name__ == "__main__":
    sys.exit(main())
