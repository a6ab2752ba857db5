"""The import graph points one way: no cycles, and no import from a lower room into an upper one.

Walks ``app/``, ``workers/``, ``retrieval/`` and ``generation/`` with :mod:`ast` (nothing is
imported), counting module-level AND function-local imports: a cycle hidden inside a function is
still a cycle a reader has to untangle. Imports under ``if TYPE_CHECKING:`` count too: they never
run, but a reader still has to hold both modules in mind at once to read either.

An edge goes to the module named (``from app.db import models`` names ``app.db.models``;
``from app.db import Query`` names ``app.db``) and also to every package above it that Python
initialises first (``app.db.models`` runs ``app/db/__init__.py``), except the importer's own
packages, which are already initialising when it runs. So a package ``__init__`` that re-exports
a module which imports back into that package's importers is a cycle too. ``from pkg import mod``
inside ``pkg`` also reads the half-initialised package itself (``pkg.mod`` is looked up on it), so
it is an edge to ``pkg`` as well: with ``pkg/__init__`` importing the importer, that is a cycle
through the package ``__init__``; siblings are imported by their full name instead.
"""

from __future__ import annotations

import ast
import functools
import gc
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("app", "workers", "retrieval", "generation")

# (importer's top package, imported top package) pairs that must never occur.
FORBIDDEN = {
    ("app", "workers"),
    ("retrieval", "workers"),
    ("generation", "workers"),
    ("generation", "app"),
    ("generation", "retrieval"),
    ("retrieval", "generation"),
    ("retrieval", "app"),
}


def module_name(path: Path) -> str:
    """The dotted module name of a file under ROOT (``pkg/__init__.py`` is ``pkg``)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    """Every module of the walked packages, by dotted name."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[module_name(path)] = path
    return found


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    # The longest known module that ``name`` names (``a.b.Thing`` -> ``a.b``).
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def parse(path: Path) -> ast.Module:
    """The file's syntax tree, parsed with the garbage collector paused.

    CPython 3.11 converts a parse to Python objects with one recursion counter per interpreter; a
    collection during that conversion can run a finalizer whose traceback is formatted (pytest's
    unraisable hook, a logging thread), and 3.11's traceback module parses source lines to place
    its carets: the nested parse moves the counter and the outer one fails with "SystemError: AST
    constructor recursion depth mismatch" (seen once in the fast suite). Without a collection no
    Python code runs inside the conversion, so nothing can nest or switch threads there.
    """
    source = path.read_text(encoding="utf-8")
    enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source, filename=str(path))
    finally:
        if enabled:
            gc.enable()


def imports_of(module: str, path: Path, known: dict[str, Path]) -> set[tuple[str, int]]:
    """The walked modules that ``module`` imports anywhere in its file, with a line number each."""
    tree = parse(path)
    is_package = path.name == "__init__.py"
    edges: set[tuple[str, int]] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")
                anchor = parts if is_package else parts[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{alias.name}" for alias in node.names]
            if base in known and module.startswith(base + "."):
                # ``from pkg import mod`` inside pkg: reads the half-initialised package.
                edges.add((base, node.lineno))
        for name in names:
            target = _resolve(name, known)
            if target is None or target == module:
                continue
            edges.add((target, node.lineno))
            edges.update((package, node.lineno) for package in _packages_run(target, module, known))
    return edges


def _packages_run(target: str, importer: str, known: dict[str, Path]) -> list[str]:
    # The packages above ``target`` whose ``__init__`` importing it runs, less the importer's own.
    parts = target.split(".")
    above = (".".join(parts[:i]) for i in range(1, len(parts)))
    return [p for p in above if p in known and p != importer and not importer.startswith(p + ".")]


@functools.cache
def build_graph() -> dict[str, dict[str, int]]:
    """module -> {imported module: first line that imports it} (built once per test session)."""
    known = all_modules()
    graph: dict[str, dict[str, int]] = {}
    for module, path in known.items():
        targets: dict[str, int] = {}
        for target, line in sorted(imports_of(module, path, known), key=lambda e: e[1]):
            targets.setdefault(target, line)
        graph[module] = targets
    return graph


def find_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0

    def visit(root: str) -> None:
        nonlocal counter
        # Iterative: the graph is deep enough that recursion would be fragile.
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return components


def test_the_walk_sees_function_local_and_relative_imports(tmp_path: Path) -> None:
    known = {"pkg": tmp_path / "pkg/__init__.py", "pkg.a": tmp_path / "pkg/a.py"}
    known["pkg.b"] = tmp_path / "pkg/b.py"
    (tmp_path / "pkg").mkdir()
    known["pkg.a"].write_text("def f():\n    from pkg import b\n", encoding="utf-8")
    known["pkg.b"].write_text("from .a import f\n", encoding="utf-8")
    assert imports_of("pkg.a", known["pkg.a"], known) == {("pkg.b", 2), ("pkg", 2)}
    assert imports_of("pkg.b", known["pkg.b"], known) == {("pkg.a", 1)}
    graph = {"pkg.a": {"pkg.b": 2}, "pkg.b": {"pkg.a": 1}, "pkg": {}}
    assert find_cycles(graph) == [["pkg.a", "pkg.b"]]


def test_importing_a_module_runs_the_packages_above_it(tmp_path: Path) -> None:
    # pkg/__init__ re-exports pkg.a, which imports other.b, which imports pkg.c: importing pkg.c
    # runs pkg/__init__ first, so other.b -> pkg -> pkg.a -> other.b is a cycle that only the
    # package edge shows (no module names a module that names it back).
    known = {
        "pkg": tmp_path / "pkg/__init__.py",
        "pkg.a": tmp_path / "pkg/a.py",
        "pkg.c": tmp_path / "pkg/c.py",
        "other": tmp_path / "other/__init__.py",
        "other.b": tmp_path / "other/b.py",
    }
    for path in known.values():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    known["pkg"].write_text("from pkg.a import f\n", encoding="utf-8")
    known["pkg.a"].write_text("import other.b\nimport pkg.c\n", encoding="utf-8")
    known["other.b"].write_text("from pkg.c import g\n", encoding="utf-8")
    assert imports_of("other.b", known["other.b"], known) == {("pkg.c", 1), ("pkg", 1)}
    # pkg.a's own package is already initialising when pkg.a runs: no edge back to it.
    assert imports_of("pkg.a", known["pkg.a"], known) == {
        ("other.b", 1),
        ("other", 1),
        ("pkg.c", 2),
    }
    graph = {m: dict(imports_of(m, p, known)) for m, p in known.items()}
    assert find_cycles(graph) == [["other.b", "pkg", "pkg.a"]]


def test_no_import_cycles() -> None:
    graph = build_graph()
    cycles = find_cycles(graph)
    lines = []
    for members in cycles:
        inside = set(members)
        edges = [
            f"    {m} -> {t} (line {line})"
            for m in members
            for t, line in sorted(graph[m].items())
            if t in inside
        ]
        lines.append(" <-> ".join(members) + "\n" + "\n".join(edges))
    assert not cycles, "import cycles:\n" + "\n".join(lines)


@pytest.mark.parametrize("importer", PACKAGES)
def test_imports_point_one_way(importer: str) -> None:
    graph = build_graph()
    wrong = [
        f"{module} -> {target} (line {line})"
        for module, targets in graph.items()
        if module.split(".")[0] == importer
        for target, line in targets.items()
        if (importer, target.split(".")[0]) in FORBIDDEN
    ]
    assert not wrong, "imports against the arrows:\n" + "\n".join(wrong)


def test_type_checking_imports_count(tmp_path: Path) -> None:
    known = {"pkg.a": tmp_path / "a.py", "pkg.b": tmp_path / "b.py"}
    known["pkg.a"].write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import b\n",
        encoding="utf-8",
    )
    assert imports_of("pkg.a", known["pkg.a"], known) == {("pkg.b", 3)}


def test_from_own_package_import_module_is_an_edge_to_the_package(tmp_path: Path) -> None:
    # pkg/__init__ imports pkg.a, and pkg.a does ``from pkg import b``: a cycle through the
    # package __init__; ``import pkg.b as b`` names only the module.
    known = {
        "pkg": tmp_path / "pkg/__init__.py",
        "pkg.a": tmp_path / "pkg/a.py",
        "pkg.b": tmp_path / "pkg/b.py",
    }
    (tmp_path / "pkg").mkdir()
    known["pkg"].write_text("from pkg.a import f\n", encoding="utf-8")
    known["pkg.a"].write_text("from pkg import b\n", encoding="utf-8")
    known["pkg.b"].touch()
    assert imports_of("pkg.a", known["pkg.a"], known) == {("pkg.b", 1), ("pkg", 1)}
    graph = {m: dict(imports_of(m, p, known)) for m, p in known.items()}
    assert find_cycles(graph) == [["pkg", "pkg.a"]]
    known["pkg.a"].write_text("import pkg.b as b\n", encoding="utf-8")
    assert imports_of("pkg.a", known["pkg.a"], known) == {("pkg.b", 1)}


# Rooms that read only what lies below them (shared/STYLE.md): audit reads the database, and
# the pipeline knows nothing of audit or of the evaluations that run it.
ROOM_LIMITS = {
    "app.audit": ("app.audit", "app.db", "app.scoring", "app.settings", "app.validation"),
    "app.pipeline": None,
    "app.lifecycle.finish": None,
}
NEVER_FROM_PIPELINE = ("app.audit", "app.evals")


@pytest.mark.parametrize("room", sorted(ROOM_LIMITS))
def test_rooms_import_only_what_they_may(room: str) -> None:
    graph = build_graph()
    allowed = ROOM_LIMITS[room]
    wrong = []
    for module, targets in graph.items():
        if module != room and not module.startswith(room + "."):
            continue
        for target, line in targets.items():
            if allowed is not None:
                bad = not any(target == a or target.startswith(a + ".") for a in allowed)
            else:
                bad = any(target == n or target.startswith(n + ".") for n in NEVER_FROM_PIPELINE)
            if bad:
                wrong.append(f"{module} -> {target} (line {line})")
    assert not wrong, f"{room} imports outside its room:\n" + "\n".join(wrong)


# generation/ in layers, lowest first: a module imports only its own layer and those below it
# (type-only imports included). The model knows nothing of speculation or batching; the
# proposers read rows through a protocol (generation/spec_decode/rows.py), not the engine's
# sequences; both engines' loops sit above them; the face that builds engines sits on top.
GENERATION_LAYERS = (
    ("generation.model",),
    (
        "generation.params",
        "generation.stats",
        "generation.interface",
        "generation.requests",
        "generation.config",
        "generation.handle",
    ),
    ("generation.spec_decode",),
    ("generation.engine", "generation.vllm_engine"),
    ("generation.torch_engine", "generation.exactness", "generation.factory", "generation"),
)


ENGINES = {"generation.engine", "generation.vllm_engine"}


def _layer(module: str) -> tuple[int, str] | None:
    # (layer, the group it belongs to) of a generation module; the longest matching prefix wins.
    best: tuple[int, str] | None = None
    for level, groups in enumerate(GENERATION_LAYERS):
        for group in groups:
            if module == group or module.startswith(group + "."):
                if best is None or len(group) > len(best[1]):
                    best = (level, group)
    return best


def test_generation_imports_point_down_its_layers() -> None:
    graph = build_graph()
    wrong = []
    for module, targets in graph.items():
        if not module.startswith("generation"):
            continue
        mine = _layer(module)
        assert mine is not None, f"{module} has no layer in GENERATION_LAYERS"
        for target, line in targets.items():
            theirs = _layer(target)
            if theirs is None or theirs[1] == mine[1]:
                continue
            # Upward, or sideways between the two engines (each stands on the layers below).
            if theirs[0] > mine[0] or {mine[1], theirs[1]} == ENGINES:
                wrong.append(f"{module} -> {target} (line {line})")
    assert not wrong, "generation imports against its layers:\n" + "\n".join(wrong)


def test_the_layer_rule_sees_an_upward_import() -> None:
    assert _layer("generation.spec_decode.proposers") == (2, "generation.spec_decode")
    assert _layer("generation.engine.sequence") == (3, "generation.engine")
    assert _layer("generation") == (4, "generation")
    assert _layer("generation.model.forward") == (0, "generation.model")
