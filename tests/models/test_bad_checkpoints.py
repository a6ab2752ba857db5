"""Checkpoint directories that are missing, partial or not causal LMs are refused by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from generation import CheckpointError, SpeculativeEngine

pytestmark = pytest.mark.models


def _copy_demo(src: Path, dst: Path, skip: str) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        if f.name != skip:
            shutil.copy(f, dst / f.name)
    return dst


def test_missing_directory_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(CheckpointError, match="no-such-model.*does not exist"):
        SpeculativeEngine.from_pretrained(missing)


def test_directory_without_weights_is_refused(tmp_path: Path, demo_dirs: tuple[Path, Path]) -> None:
    partial = _copy_demo(demo_dirs[0], tmp_path / "no-weights", skip="model.safetensors")
    with pytest.raises(CheckpointError, match="no-weights.*no weights"):
        SpeculativeEngine.from_pretrained(partial)


def test_directory_without_config_is_refused(tmp_path: Path, demo_dirs: tuple[Path, Path]) -> None:
    partial = _copy_demo(demo_dirs[1], tmp_path / "no-config", skip="config.json")
    with pytest.raises(CheckpointError, match="no-config.*config.json"):
        SpeculativeEngine.from_pretrained(partial, demo_dirs[1])


def test_non_causal_architecture_is_refused(tmp_path: Path, demo_dirs: tuple[Path, Path]) -> None:
    vit = _copy_demo(demo_dirs[1], tmp_path / "vision-model", skip="")
    config = json.loads((vit / "config.json").read_text())
    config.update(model_type="vit", architectures=["ViTModel"])
    (vit / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="vision-model.*'vit' is not a causal"):
        SpeculativeEngine.from_pretrained(vit)
