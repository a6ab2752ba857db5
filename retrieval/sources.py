"""Which files an ingest call means: paths as given, folders walked, sources named stably.

It exists so that a document's ``source`` is the same string however it was reached (a file, or
a file inside an ingested folder): the path as the caller gave it, normalised but never resolved,
so it stays readable in search results and its file name stays recognisable.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from retrieval.loaders import SUPPORTED_SUFFIXES
from retrieval.results import FileResult


def normalise_source(path: str | Path) -> str:
    """The path as given, minus ``./`` and doubled slashes (never resolved)."""
    return os.path.normpath(str(path))


def expand_paths(
    paths: Iterable[str | Path],
) -> tuple[list[tuple[str, Path]], list[str], list[FileResult]]:
    """``(files as (source, path), folders given, failures for paths that do not exist)``.

    Folders are walked recursively in sorted order; inside them only supported file types are
    taken and hidden files and folders are skipped. A file named explicitly is always taken, so
    that an unsupported type gets its error in the report.
    """
    files: dict[str, Path] = {}
    folders: list[str] = []
    missing: list[FileResult] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            folders.append(normalise_source(given))
            for found in sorted(path.rglob("*")):
                rel = found.relative_to(path)
                hidden = any(part.startswith(".") for part in rel.parts)
                if found.is_file() and not hidden and found.suffix.lower() in SUPPORTED_SUFFIXES:
                    files.setdefault(normalise_source(path / rel), found)
        elif path.exists() or path.is_symlink():
            files.setdefault(normalise_source(given), path)
        else:
            missing.append(FileResult(str(given), "failed", error=f"{given}: no such file"))
    return list(files.items()), folders, missing


def inside(source: str, folders: list[str]) -> bool:
    """True when ``source`` lies under one of the (normalised) folders."""
    return any(source.startswith(folder.rstrip(os.sep) + os.sep) for folder in folders)
