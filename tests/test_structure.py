"""The import picture of the tree: no circles, no arrow back up.

Every ``.py`` file of ``harness/``, ``decoders/``, ``tasks/``, ``declare/``, ``plots/``, ``benchmarks/`` and
``run.py`` is parsed (``ast``; nothing is imported or executed), its imports -- those inside functions too --
drawn as edges between modules, and the graph checked:

* no import cycle, over the whole tree and over ``harness/`` alone;
* ``harness/``'s parts import only their own part and the parts below (:data:`LAYERS`, top to bottom; the
  same order as ``harness/__init__.py``'s docstring, which :func:`test_layers_agree_with_the_package_docstring`
  checks);
* ``decoders/``, ``tasks/``, ``declare/`` and ``plots/`` never import ``harness``;
* the rows and config parts and the precheck stay torch-free at import: no chain of import-time imports
  (module level, not inside a function; a module also runs its parent packages' ``__init__``) leads from
  them to ``torch``.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterable, Mapping

import harness

ROOT = Path(__file__).resolve().parents[1]
#: The folders (and files) of the tree whose imports are drawn.
SOURCES = ("harness", "decoders", "tasks", "declare", "plots", "benchmarks", "run.py")
#: ``harness/``'s parts, top to bottom: a part imports only itself and the parts after it.
LAYERS = ["api", "job", "regress", "protocols", "report", "exchange", "rows", "config"]
#: Parts that never import ``harness``.
HARNESS_FREE = ("decoders", "tasks", "declare", "plots")
#: Modules (and every module of these packages) that must reach no torch at import.
TORCH_FREE = ("harness.rows", "harness.config", "harness.config.precheck")
#: Import edges allowed to break the layering for now: ``(importer, imported)`` -> who fixes it. Empty.
KNOWN_LAYER_EXCEPTIONS: dict[tuple[str, str], str] = {}
#: Import edges allowed to close a cycle for now: ``(importer, imported)`` -> who fixes it and how.
KNOWN_CYCLE_EXCEPTIONS: dict[tuple[str, str], str] = {}


def module_name(path: Path, root: Path) -> str:
    """``harness/rows/results.py`` -> ``harness.rows.results``; a package's ``__init__.py`` -> the package."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files(root: Path) -> dict[str, Path]:
    """Module name -> file, for every ``.py`` file under :data:`SOURCES` of ``root``."""
    files: dict[str, Path] = {}
    for src in SOURCES:
        p = root / src
        for f in ([p] if p.is_file() else sorted(p.rglob("*.py")) if p.is_dir() else []):
            if "__pycache__" not in f.parts:
                files[module_name(f, root)] = f
    return files


def _is_package(name: str, files: Mapping[str, Path]) -> bool:
    return name in files and files[name].name == "__init__.py"


def _imported(node: ast.AST, importer: str, files: Mapping[str, Path]) -> list[str]:
    """The modules one import statement names: a known module where the name is one (``from harness.rows
    import cells`` -> ``harness.rows.cells``), else the dotted name as written (external: ``torch``)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    assert isinstance(node, ast.ImportFrom)
    base = node.module or ""
    if node.level:  # relative: from the importer's package
        pkg = importer.split(".") if _is_package(importer, files) else importer.split(".")[:-1]
        pkg = pkg[:len(pkg) - (node.level - 1)]
        base = ".".join([*pkg, base] if base else pkg)
    out = []
    for a in node.names:
        sub = f"{base}.{a.name}"
        out.append(sub if sub in files else base)
    return out


def import_edges(files: Mapping[str, Path]) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """``(all_edges, import_time_edges)``: ``(importer, imported)`` pairs of every import statement, and of
    those that run when the module is imported (not inside a function or lambda). ``imported`` is a module of
    ``files`` or an external top-level name."""
    every: set[tuple[str, str]] = set()
    at_import: set[tuple[str, str]] = set()

    def visit(node: ast.AST, name: str, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for target in _imported(child, name, files):
                    target = _known(target, files)
                    if target == name or target == "__future__":
                        continue
                    every.add((name, target))
                    if not in_function:
                        at_import.add((name, target))
            visit(child, name, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    for name, path in files.items():
        visit(ast.parse(path.read_text(), str(path)), name, False)
    return every, at_import


def _known(target: str, files: Mapping[str, Path]) -> str:
    """The longest known module that ``target`` names or lies in; an external module by its top-level name."""
    parts = target.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in files:
            return ".".join(parts[:n])
    return parts[0]


def find_cycle(edges: Iterable[tuple[str, str]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or None when the graph has none."""
    graph: dict[str, list[str]] = {}
    for a, b in sorted(edges):
        graph.setdefault(a, []).append(b)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in graph.get(node, []):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = dfs(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = dfs(start)
            if found:
                return found
    return None


def layer_of(module: str) -> str | None:
    """The part of ``harness/`` a module belongs to (``harness.rows.results`` -> ``rows``); None elsewhere."""
    parts = module.split(".")
    return parts[1] if parts[0] == "harness" and len(parts) > 1 else None


def layering_violations(edges: Iterable[tuple[str, str]]) -> list[str]:
    """``"importer -> imported (part a imports part b above it)"`` for every edge running up :data:`LAYERS`."""
    out = []
    for a, b in sorted(edges):
        la, lb = layer_of(a), layer_of(b)
        if la is None or lb is None or (a, b) in KNOWN_LAYER_EXCEPTIONS:
            continue
        if LAYERS.index(lb) < LAYERS.index(la):
            out.append(f"{a} -> {b} ({la} imports {lb}, a part above it)")
    return out


def path_to(edges: Iterable[tuple[str, str]], start: str, goal: str, files: Mapping[str, Path]) -> list[str] | None:
    """A chain of import-time imports from ``start`` to ``goal`` (a module runs its parent packages'
    ``__init__`` too), or None."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    for m in files:  # importing a.b.c runs a and a.b first
        parts = m.split(".")
        for n in range(1, len(parts)):
            if ".".join(parts[:n]) in files:
                graph.setdefault(m, set()).add(".".join(parts[:n]))
    seen, queue = {start: [start]}, [start]
    while queue:
        node = queue.pop(0)
        if node == goal:
            return seen[node]
        for nxt in sorted(graph.get(node, ())):
            if nxt not in seen:
                seen[nxt] = [*seen[node], nxt]
                queue.append(nxt)
    return None


FILES = source_files(ROOT)
EDGES, IMPORT_TIME_EDGES = import_edges(FILES)


def test_the_graph_is_drawn():
    # the parser sees the imports it must see: top-level, from-imports of submodules, function-level ones
    assert ("harness.report.build", "harness.rows.results") in EDGES
    assert ("harness.rows.cells", "harness.rows.identity") in EDGES
    assert ("harness.rows.machine", "torch") in EDGES and ("harness.rows.machine", "torch") not in IMPORT_TIME_EDGES
    assert len(FILES) > 60 and all(layer_of(m) in LAYERS for m in FILES if m.startswith("harness."))


def test_no_import_cycle():
    cycle = find_cycle(e for e in EDGES if e[1] in FILES and e not in KNOWN_CYCLE_EXCEPTIONS)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
    cycle = find_cycle(e for e in EDGES if e[0].startswith("harness") and e[1].startswith("harness"))
    assert cycle is None, "import cycle in harness/: " + " -> ".join(cycle)


def test_known_exceptions_are_still_needed():
    # an exception whose edge is gone (fixed) is taken out of the lists, so it cannot hide a new one
    stale = [e for e in (*KNOWN_CYCLE_EXCEPTIONS, *KNOWN_LAYER_EXCEPTIONS) if e not in EDGES]
    assert not stale, f"known exceptions no longer in the tree (delete them): {stale}"


def test_harness_parts_import_only_parts_below():
    bad = layering_violations(EDGES)
    assert not bad, f"imports up the layering {' > '.join(LAYERS)}:\n" + "\n".join(bad)


def test_layers_agree_with_the_package_docstring():
    named = [line.split("``")[1].removeprefix("harness.") for line in (harness.__doc__ or "").splitlines()
             if line.startswith("* ``harness.")]
    assert named == LAYERS, f"harness/__init__.py lists {named}, tests/test_structure.py LAYERS {LAYERS}"


def test_decoders_tasks_declare_plots_never_import_harness():
    bad = [f"{a} -> {b}" for a, b in sorted(EDGES)
           if a.split(".")[0] in HARNESS_FREE and b.split(".")[0] == "harness"]
    assert not bad, "imports of harness from below it:\n" + "\n".join(bad)


def test_rows_config_and_precheck_are_torch_free_at_import():
    starts = [m for m in FILES if m in TORCH_FREE or m.startswith(tuple(f"{p}." for p in TORCH_FREE))]
    assert "harness.config.precheck" in starts and "harness.rows.results" in starts
    chains = [path_to(IMPORT_TIME_EDGES, m, "torch", FILES) for m in starts]
    bad = [" -> ".join(c) for c in chains if c]
    assert not bad, "torch imported at import time by:\n" + "\n".join(bad)
