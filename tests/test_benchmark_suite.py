"""The benchmark suite stays a package apart: tests never import it, and it stays small.

Read with :mod:`ast` (nothing is imported): every import statement counts, function-local ones
included. What tests and benchmarks share lives in ``testkit/``, which imports neither.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_SCRIPTS = 30


def imported_modules(path: Path) -> list[tuple[str, int]]:
    """(module, line) for every import in ``path``, relative imports resolved to their package."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append(("." * node.level + (node.module or ""), node.lineno))
    return found


def importers_of(folder: str, packages: tuple[str, ...]) -> list[str]:
    """``file:line -> module`` for every import under ``folder`` of one of ``packages``."""
    wrong = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for module, line in imported_modules(path):
            if module.split(".")[0] in packages:
                wrong.append(f"{path.relative_to(ROOT)}:{line} -> {module}")
    return wrong


def test_no_test_imports_a_benchmark() -> None:
    assert importers_of("tests", ("benchmarks",)) == []


def test_testkit_imports_neither_tests_nor_benchmarks() -> None:
    assert importers_of("testkit", ("tests", "benchmarks")) == []


def test_the_product_never_imports_testkit_or_benchmarks() -> None:
    for folder in ("app", "workers", "retrieval", "generation", "training"):
        assert importers_of(folder, ("testkit", "benchmarks", "tests")) == [], folder


def test_benchmarks_are_a_small_package_that_leaves_sys_path_alone() -> None:
    # A script is a module the suite runs (``python -m benchmarks.NAME``: it has a main guard);
    # the shared support module and a benchmark's workload module are libraries of the suite.
    modules = sorted(p for p in (ROOT / "benchmarks").glob("*.py") if p.name != "__init__.py")
    scripts = [p for p in modules if '__name__ == "__main__"' in p.read_text(encoding="utf-8")]
    assert (ROOT / "benchmarks" / "__init__.py").is_file()
    assert len(scripts) <= MAX_SCRIPTS, [p.name for p in scripts]
    shadowing = [p.name for p in modules if p.stem in sys.stdlib_module_names]
    assert shadowing == [], "a benchmark named like a standard-library module"
    edits = [
        f"{p.name}:{n}"
        for p in modules
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if "sys.path." in line
    ]
    assert edits == [], "benchmarks run as python -m benchmarks.NAME and edit no sys.path"


def test_benchmarks_import_each_other_by_package_name() -> None:
    # A benchmark named like a top-level package (benchmarks/retrieval.py) is not a bare import
    # when the package is what is meant: imports are absolute.
    names = {p.stem for p in (ROOT / "benchmarks").glob("*.py")} - {
        p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()
    }
    bare = [
        f"{p.name}:{line} -> {module}"
        for p in sorted((ROOT / "benchmarks").glob("*.py"))
        for module, line in imported_modules(p)
        if module.split(".")[0] in names or module.startswith(".")
    ]
    assert bare == [], "one import style: from benchmarks.NAME import ..."
