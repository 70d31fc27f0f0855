"""The dependency graphs that tests/test_structure.py checks for circles.

Python: one node per module of the product's packages, an edge per import (read with `ast`, so an
import inside a function or under TYPE_CHECKING counts as much as one at the top), to the most
specific module of the product that it names.

C: one node per file of a folder, a header merged into the source of its name (ops.h is ops.c's
interface), an edge per `#include "..."` and per use of a function (a call or its address) that
another file of the folder defines. Declarations are not uses; a `static` function of a source
file is visible to that file alone. The parse is textual, good for this code base, not for C at large.
"""
from __future__ import annotations

import ast
import re
from collections import deque
from pathlib import Path
from typing import Container

PRODUCT = ("common", "services", "native", "fermium")
C_FOLDERS = ("native/cpu", "native/cuda")
C_SOURCES, C_HEADERS = (".c", ".cpp", ".cu"), (".h", ".cuh")
KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "defined", "else", "do", "case", "goto",
            "__attribute__", "_Static_assert", "static_assert", "alignof", "_Alignof", "typeof", "__typeof__"}

# ---- circles in any graph


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every node reachable from `start` over one edge or more."""
    seen, stack = set(), list(graph.get(start, ()))
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack.extend(graph.get(node, ()))
    return seen


def _cycle(graph: dict[str, set[str]], members: set[str], start: str) -> list[str]:
    """A shortest path from `start` back to itself within `members`."""
    came = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in sorted(graph[node] & members):
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(came[path[-1]])
                return [*reversed(path), start]
            if nxt not in came:
                came[nxt] = node
                queue.append(nxt)
    return [start]


def circles(graph: dict[str, set[str]]) -> list[str]:
    """One line per strongly connected component of more than one node: a cycle through it, and
    the rest of its members."""
    reach = {node: _reach(graph, node) for node in graph}
    done, out = set(), []
    for node in sorted(graph):
        if node in done or node not in reach[node]:
            continue
        members = {node} | {other for other in reach[node] if node in reach[other]}
        done |= members
        cycle = _cycle(graph, members, node)
        rest = sorted(members - set(cycle))
        out.append(" -> ".join(cycle) + (f" (and {', '.join(rest)})" if rest else ""))
    return out

# ---- Python


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def python_graph(root: Path) -> dict[str, set[str]]:
    """module -> the product's modules it imports."""
    files = {module_name(root, p): p for top in PRODUCT if (root / top).is_dir()
             for p in sorted((root / top).rglob("*.py")) if "__pycache__" not in p.parts}

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    return {me: {found for name in imported_modules(root, path, files) if (found := resolve(name)) and found != me}
            for me, path in files.items()}


def imported_modules(root: Path, path: Path, modules: Container[str] | None = None) -> set[str]:
    """Every module `path` imports, absolute (a relative import resolved against its package). For
    `from m import x`: m and m.x (which may be a module); given the `modules` there are, m.x where it
    is one of them and m otherwise, since importing a package's module from inside that package is
    no dependency on the package's __init__."""
    package = list(path.relative_to(root).with_suffix("").parts[:-1])
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            named = {f"{module}.{alias.name}" for alias in node.names}
            out |= (named | {module}) if modules is None else {n if n in modules else module for n in named}
    return out

# ---- C

COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
STRING = re.compile(r"\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'")
DIRECTIVE = re.compile(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", re.M)
INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"', re.M)
DEFINITION = re.compile(r"\b([A-Za-z_]\w*)\s*\((?:[^;{}()]|\([^;{}()]*\))*\)\s*"
                        r"(?:const\s*)?(?:__attribute__\s*\(\(.*?\)\)\s*)?\{", re.S)
DECLARED = re.compile(r"(?:^|[;{}(),])\s*((?:[A-Za-z_]\w*[\s*]+)+?)([A-Za-z_]\w*)\s*\(", re.S)
IDENT = re.compile(r"(?<![\w.>])([A-Za-z_]\w*)\b")


def _code(text: str) -> str:
    """The text without comments, strings and preprocessor lines."""
    return DIRECTIVE.sub("", STRING.sub('""', COMMENT.sub(" ", text)))


def c_graph(root: Path, folder: str) -> dict[str, set[str]]:
    """file -> the files of `folder` that it includes or whose functions it uses."""
    here = root / folder
    paths = sorted(p for p in here.glob("*") if p.suffix in C_SOURCES + C_HEADERS)

    def unit(p: Path) -> str:
        source = next((p.with_suffix(s) for s in C_SOURCES if p.suffix in C_HEADERS and p.with_suffix(s).exists()), p)
        return source.relative_to(root).as_posix()

    defined: dict[str, set[str]] = {}        # function -> the units that may be linked or inlined to it
    uses: dict[str, set[str]] = {}
    graph: dict[str, set[str]] = {}
    for p in paths:
        me, raw = unit(p), p.read_text(errors="replace")
        included = [here / name for name in INCLUDE.findall(COMMENT.sub(" ", raw))]   # of this folder only
        graph.setdefault(me, set()).update(unit(i) for i in included if i.exists() and i.parent == here)
        code = _code(raw)
        at_definition = set()
        for m in DEFINITION.finditer(code):
            name = m.group(1)
            if name in KEYWORDS:
                continue
            at_definition.add(m.start(1))
            head = code[max(code.rfind(";", 0, m.start()), code.rfind("}", 0, m.start())) + 1:m.start()]
            local = "static" in head.split() and p.suffix in C_SOURCES
            defined.setdefault(name, set()).add(me if not local else f"{me}#static")
        at_declaration = {m.start(2) for m in DECLARED.finditer(code)
                          if not {"return", "else", "case", "goto", "do"} & set(m.group(1).split())}
        uses.setdefault(me, set()).update(m.group(1) for m in IDENT.finditer(code)
                                          if m.start(1) not in at_definition | at_declaration)
    for me, names in uses.items():
        for name in names:
            owners = defined.get(name, set())
            if me in owners or f"{me}#static" in owners:
                continue
            graph[me] |= {owner for owner in owners if "#" not in owner}
        graph[me].discard(me)
    return graph
