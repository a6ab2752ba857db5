"""Both images hold every package the ``specrag`` CLI imports, where the code looks for it.

What the CLI imports is found by walking the import graph with :mod:`ast` (nothing is imported)
from what runs in a container: the console script and every other entry point in pyproject.toml,
the command modules that app/cli.py discovers at run time (``pkgutil`` over ``app.commands``), and
the migrations that Alembic loads by path. Module-level and function-local imports count (a
function-local one runs when its command does: ``specrag draft tune`` imports training/); imports
under ``if TYPE_CHECKING:`` never run and do not. The data the code finds beside itself (the
migrations, the bundled demo pair) is required too.

Each Dockerfile's COPY lines before its editable install must then place every required path at
the same place under its WORKDIR as in the repository: the install maps the packages it finds
there, and ``REPO_ROOT`` (app/settings.py) is the WORKDIR. So a new package, or one a command
starts to import, cannot be left out of an image.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import gc
import json
import re
import shlex
import tomllib
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILES = ("docker/Dockerfile", "docker/Dockerfile.gpu")
DISCOVERED = ("app.commands",)
"""Packages whose every module is imported by name at run time (app/cli.py's ``app_commands``)."""


def module_file(name: str) -> Path | None:
    """The repository file of module ``name``, or None where it is not the project's."""
    path = ROOT.joinpath(*name.split("."))
    for candidate in (path / "__init__.py", path.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_names(module: str, path: Path) -> set[str]:
    """Every dotted name ``module``'s file imports where it can run (TYPE_CHECKING aside)."""
    names: set[str] = set()
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    # The collector paused while parsing: tests/test_import_graph.py's ``parse`` says why.
    enabled = gc.isenabled()
    gc.disable()
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    finally:
        if enabled:
            gc.enable()
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
        todo.extend(ast.iter_child_nodes(node))
    return names


def _own_module(name: str) -> str | None:
    # The longest prefix of ``name`` that is a project module (``a.b.Thing`` -> ``a.b``).
    while name:
        if module_file(name) is not None:
            return name
        name = name.rpartition(".")[0]
    return None


def entry_modules() -> list[str]:
    """The modules pyproject.toml's console scripts and entry points name."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    targets = list(project.get("scripts", {}).values())
    for group in project.get("entry-points", {}).values():
        targets.extend(group.values())
    return [target.partition(":")[0].strip() for target in targets]


def runtime_roots() -> dict[str, Path]:
    """Module name -> file of everything a container starts from."""
    from app.db.schema import MIGRATIONS_DIR

    roots: dict[str, Path] = {}
    for name in entry_modules():
        path = module_file(name)
        assert path is not None, f"pyproject.toml names {name}, which is not in the repository"
        roots[name] = path
    for package in DISCOVERED:
        folder = ROOT.joinpath(*package.split("."))
        for path in sorted(folder.glob("*.py")):
            roots[f"{package}.{path.stem}" if path.stem != "__init__" else package] = path
    for path in sorted(MIGRATIONS_DIR.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        roots[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return roots


def walk(roots: dict[str, Path]) -> dict[str, Path]:
    """Every project module reachable from ``roots`` (with the packages above each, which Python
    initialises first)."""
    seen: dict[str, Path] = {}
    todo = list(roots.items())
    while todo:
        module, path = todo.pop()
        if module in seen:
            continue
        seen[module] = path
        parts = module.split(".")
        found = {".".join(parts[:i]) for i in range(1, len(parts))}
        found.update(filter(None, map(_own_module, imported_names(module, path))))
        for name in found - seen.keys():
            file = module_file(name)
            if file is not None:
                todo.append((name, file))
    return seen


@functools.cache
def required_paths() -> frozenset[str]:
    """Repository paths an image needs: the top-level packages the walk reaches, the data the
    code finds beside itself, and what ``pip install`` reads."""
    from app.db.schema import MIGRATIONS_DIR
    from app.settings import DEMO_MODELS

    packages = {module.split(".")[0] for module in walk(runtime_roots())}
    data = {p.relative_to(ROOT).as_posix() for p in (MIGRATIONS_DIR, DEMO_MODELS)}
    install = {
        name for name in ("pyproject.toml", "setup.py", "README.md") if (ROOT / name).exists()
    }
    return frozenset(packages | data | install)


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    found: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):  # a comment inside a continued instruction
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        word, _, args = (pending + stripped).partition(" ")
        found.append((word.upper(), args.strip()))
        pending = ""
    return found


def placed_before_install(text: str) -> dict[str, PurePosixPath]:
    """Each repository path the COPY lines before the editable install place, and where.

    A copied directory's contents land in the destination; a file lands in it when it ends in
    ``/`` or several sources share it, else it is the destination (Docker's rules)."""
    workdir = PurePosixPath("/")
    placed: dict[str, PurePosixPath] = {}
    for word, args in instructions(text):
        if word == "WORKDIR":
            workdir = workdir / args
        elif word == "RUN" and "pip install -e" in args:
            return placed
        elif word == "COPY":
            words = json.loads(args) if args.startswith("[") else shlex.split(args)
            if any(w.startswith("--from") for w in words):
                continue  # from another stage, not from the build context
            *sources, dest = [w for w in words if not w.startswith("--")]
            into = workdir / dest
            for source in sources:
                name = PurePosixPath(source).as_posix()
                if (ROOT / name).is_dir() or dest.endswith("/") or len(sources) > 1:
                    at = into if (ROOT / name).is_dir() else into / PurePosixPath(name).name
                else:
                    at = into
                placed[name] = at
    raise AssertionError("no `pip install -e` step: REPO_ROOT would not be the WORKDIR")


def missing(text: str, required: frozenset[str]) -> list[str]:
    """The required paths the Dockerfile ``text`` does not place as in the repository."""
    placed = placed_before_install(text)
    workdir = next(PurePosixPath(a) for w, a in instructions(text) if w == "WORKDIR")
    absent = []
    for path in sorted(required):
        where = [
            at / path if source == "." else at / PurePosixPath(path).relative_to(source)
            for source, at in placed.items()
            if source in (".", path) or path.startswith(source + "/")
        ]
        if workdir / path not in where:
            absent.append(path)
    return absent


def test_the_walk_reaches_what_commands_import_inside_functions() -> None:
    modules = walk(runtime_roots())
    # ``specrag draft tune`` -> app.drafts.tune -> training (function-local imports).
    assert {"app.drafts.tune", "training.train_eagle", "training.data"} <= modules.keys()
    assert {"workers.cli", "app.commands.ask", "generation.vllm_engine.cpu_fix"} <= modules.keys()
    required = required_paths()
    assert {"app", "workers", "retrieval", "generation", "training", "migrations"} <= required
    assert "models/demo" in required
    assert not {"tests", "benchmarks", "scripts"} & required


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_the_image_holds_every_package_the_cli_imports(dockerfile: str) -> None:
    text = (ROOT / dockerfile).read_text()
    assert missing(text, required_paths()) == [], f"{dockerfile} does not COPY these"


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_an_image_without_a_package_is_caught(dockerfile: str) -> None:
    text = (ROOT / dockerfile).read_text()
    lines = text.splitlines()
    assert "COPY training ./training" in lines
    without = "\n".join(line for line in lines if line != "COPY training ./training")
    assert missing(without, required_paths()) == ["training"]
    # Copied after the install, the editable install never maps it.
    late = without.replace("USER specrag", "COPY training ./training\nUSER specrag")
    assert missing(late, required_paths()) == ["training"]
    # Copied with others into one destination, a directory's contents land there, not the folder.
    flat = without.replace("COPY app ./app", "COPY app training ./")
    assert missing(flat, required_paths()) == ["app", "training"]


def test_the_install_maps_every_required_package() -> None:
    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    patterns = find["find"]["include"]
    packages = {p for p in required_paths() if (ROOT / p / "__init__.py").is_file()}
    unmapped = [p for p in sorted(packages) if not any(fnmatch.fnmatch(p, x) for x in patterns)]
    assert unmapped == [], "pyproject.toml's [tool.setuptools.packages.find] leaves these out"


def test_both_images_build_the_suffix_tree_the_makefile_pins() -> None:
    # A torch worker serves method suffix by default and refuses to start without the tree:
    # each image builds the same arctic-inference as `make venv`.
    pin = re.search(r"^ARCTIC_PIN := (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert pin is not None, "Makefile: ARCTIC_PIN"
    for name in ("Dockerfile", "Dockerfile.gpu"):
        text = (ROOT / "docker" / name).read_text()
        assert f"--no-build-isolation {pin.group(1)}" in text, f"docker/{name}: {pin.group(1)}"
