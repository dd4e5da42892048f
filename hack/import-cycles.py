#!/usr/bin/env python3
"""Finds import circles among the files of a Rust crate's src/ directory.

An edge A -> B means file A names module B by path: `use crate::…`, `crate::…`, `super::…`,
`self::…`, or a path through one of its own child modules (`node::run`), anywhere in A's code
(comments and strings aside). A path is resolved to the deepest
module that is a file of the crate, so `crate::core::status::condition` points at
core/status.rs, not at core/mod.rs. `mod` declarations are not edges: a parent declaring its
children is the layout itself, and neither is a parent's re-export of its own child's items
(`pub use child::Item;`, any visibility): the child's names are the parent's face, and the child
may still use its parent. Prints each circle with the names that tie it and exits 1 if
there is any; with --edges, prints every edge.

With --workspace, every crate of the Cargo workspace in ROOT (default: here) is scanned.

Usage: hack/import-cycles.py [--edges] CRATE_SRC_DIR | --workspace [ROOT]
"""
import os
import re
import sys


def module_path(src, file, has_lib):
    """The module path of `file` under `src`: ['controllers', 'jobs'] for controllers/jobs/mod.rs.
    The crate root is lib.rs; main.rs too when there is no lib.rs (beside one, main.rs is a
    crate of its own that names the library by its name, so it gets a name of its own here)."""
    rel = os.path.relpath(file, src)[: -len(".rs")].split(os.sep)
    if rel == ["main"]:
        return ["<main>"] if has_lib else []
    if rel == ["lib"] or rel[-1] == "mod":
        rel = rel[:-1]
    return rel


def strip_comments_and_strings(text):
    """The code with comments, string and char literals blanked (paths in docs are not imports),
    read in one pass so that `//` inside a string is not a comment, nor `"` inside a comment."""
    out, i, n = [], 0, len(text)
    char_literal = re.compile(r"'(?:\\u\{[0-9a-fA-F]+\}|\\x[0-9a-fA-F]{2}|\\.|[^\\'\n])'")
    raw_string = re.compile(r'b?r(#*)"')
    while i < n:
        after_ident = i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")
        if text.startswith("//", i):
            newline = text.find("\n", i)
            i = n if newline < 0 else newline
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif not after_ident and raw_string.match(text, i):
            hashes = raw_string.match(text, i).group(1)
            close = text.find('"' + hashes, raw_string.match(text, i).end())
            i = n if close < 0 else close + 1 + len(hashes)
            out.append('""')
        elif text[i] == '"' or (not after_ident and text.startswith('b"', i)):
            i = text.index('"', i) + 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            out.append('""')
        elif text[i] == "'" and char_literal.match(text, i):
            i = char_literal.match(text, i).end()
            out.append("' '")
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def expand_use_groups(code):
    """`use a::{b, c::{d, self}, e::*};` as `use a::b, a::c::d, a::c, a::e::*;`: innermost
    braces first, so nested groups come out whole."""
    pattern = re.compile(r"(\w+(?:::\w+)*)::\{([^{}]*)\}")
    while True:
        match = pattern.search(code)
        if not match:
            return code
        prefix, items = match.group(1), match.group(2)
        parts = [p.strip() for p in items.split(",") if p.strip()]
        expanded = ", ".join(f"{prefix}::{p}" if p != "self" else prefix for p in parts)
        code = code[: match.start()] + expanded + code[match.end():]


def inline_modules_as_self(code):
    """Inside an inline module (`mod tests { … }`), `super::` is the file's own module: written
    as `self::` so that it resolves to the file, not to the file's parent."""
    out, position = [], 0
    for match in re.finditer(r"\bmod\s+\w+\s*\{", code):
        if match.start() < position:
            continue  # nested in one already rewritten
        depth, end = 0, len(code)
        for i in range(match.end() - 1, len(code)):
            depth += {"{": 1, "}": -1}.get(code[i], 0)
            if depth == 0:
                end = i + 1
                break
        body = re.sub(r"(?<![\w:])super::", "self::", code[match.start():end])
        out.append(code[position:match.start()] + body)
        position = end
    out.append(code[position:])
    return "".join(out)


def resolve(path, here, modules):
    """The file that `path` (a list of segments starting with crate, super or self) lands in."""
    segments = list(path)
    if segments[0] == "crate":
        base, segments = [], segments[1:]
    else:
        base = list(here)
        while segments and segments[0] in ("super", "self"):
            if segments.pop(0) == "super" and base:
                base.pop()
    full = base + segments
    for length in range(len(full), -1, -1):
        candidate = tuple(full[:length])
        if candidate in modules:
            return modules[candidate]
    return None


def without_reexports_of_children(code, here, modules):
    """The code less each path of a `pub use` that names an item of one of the file's own child
    modules: a parent handing on its child's names is no import."""
    def keep(match):
        paths = [p.strip() for p in match.group(2).split(",") if p.strip()]
        kept = []
        for path in paths:
            segments = path.split(" as ")[0].strip().split("::")
            if segments[0] == "self":
                segments = segments[1:]
            if segments and tuple(here + [segments[0]]) in modules:
                continue
            kept.append(path)
        return f"{match.group(1)}use {', '.join(kept)};" if kept else ""

    return re.sub(r"\b(pub(?:\s*\([^)]*\))?\s+)use\s+([^;]*);", keep, code)


def edges_of(src):
    files = []
    bins = os.path.join(src, "bin")
    for root, _, names in os.walk(src):
        # src/bin/*.rs are crates of their own, which name the library by its name.
        if root == bins or root.startswith(bins + os.sep):
            continue
        files.extend(os.path.join(root, n) for n in names if n.endswith(".rs"))
    has_lib = os.path.join(src, "lib.rs") in files
    modules = {tuple(module_path(src, f, has_lib)): f for f in files}
    edges = {}
    for file in files:
        here = module_path(src, file, has_lib)
        # A file's own module (for `self::`) is its module path; `super::` of foo.rs is its parent.
        code = strip_comments_and_strings(open(file, encoding="utf-8").read())
        # `#[cfg(test)] mod tests { use super::*; }` names the file itself: no edge.
        code = expand_use_groups(inline_modules_as_self(code))
        code = without_reexports_of_children(code, here, modules)
        # A glob (`use super::*;`) names the module it reads from.
        code = code.replace("::*", "::__glob__")
        for match in re.finditer(r"(?<![\w:])(\w+(?:::\w+)+)", code):
            segments = match.group(1).split("::")
            if segments[0] not in ("crate", "super", "self"):
                # A path through a child module (`node::run` in controllers/mod.rs) is one too.
                if tuple(here + [segments[0]]) not in modules:
                    continue
                segments = ["self"] + segments
            target = resolve(segments, here, modules)
            if target and target != file:
                name = "*" if segments[-1] == "__glob__" else segments[-1]
                edges.setdefault(file, {}).setdefault(target, set()).add(name)
    return files, edges


def circles(files, edges):
    """Strongly connected components of more than one file (Tarjan)."""
    index, low, stack, on_stack, result, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, {}):
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
                result.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in sorted(files):
        if v not in index:
            visit(v)
    return result


def workspace_sources(root):
    """The source folder of every crate of the Cargo workspace at root: each member's src/, and the
    folder of each test binary declared with a path of its own (tests/integration/main.rs)."""
    import tomllib

    with open(os.path.join(root, "Cargo.toml"), "rb") as f:
        members = tomllib.load(f)["workspace"]["members"]
    sources = []
    for member in members:
        if os.path.isdir(os.path.join(root, member, "src")):
            sources.append(os.path.join(root, member, "src"))
        with open(os.path.join(root, member, "Cargo.toml"), "rb") as f:
            manifest = tomllib.load(f)
        for target in manifest.get("test", []) + manifest.get("bench", []):
            path = target.get("path", "")
            if path.endswith("main.rs"):
                sources.append(os.path.join(root, member, os.path.dirname(path)))
    return sources


def scan(src, show_edges):
    """Prints src's circles (or that it has none), and every edge with show_edges; 1 if any."""
    files, edges = edges_of(src)
    if show_edges:
        for a in sorted(edges):
            for b in sorted(edges[a]):
                print(f"{a} -> {b}: {', '.join(sorted(edges[a][b]))}")
    found = circles(files, edges)
    count = sum(len(e) for e in edges.values())
    for component in found:
        members = set(component)
        print(f"import circle of {len(component)} files:")
        for a in component:
            for b in sorted(edges.get(a, {})):
                if b in members:
                    print(f"  {a} -> {b}: {', '.join(sorted(edges[a][b]))}")
    if found:
        return 1
    print(f"{src}: {len(files)} files, {count} imports, no circle")
    return 0


def main():
    args = sys.argv[1:]
    show_edges = "--edges" in args
    args = [a for a in args if a != "--edges"]
    if args[:1] == ["--workspace"] and len(args) <= 2:
        # Paths are printed from the workspace's root, wherever this runs from.
        os.chdir(args[1] if len(args) == 2 else ".")
        sources = [os.path.relpath(s) for s in workspace_sources(".")]
    elif len(args) == 1 and not args[0].startswith("--"):
        sources = [args[0].rstrip("/")]
    else:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    return max(scan(src, show_edges) for src in sources)


if __name__ == "__main__":
    sys.exit(main())
