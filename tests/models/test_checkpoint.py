"""training/checkpoint.py: what every trainer resumes from (the pair's run, distillation, the head)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from training.checkpoint import load_checkpoint, save_checkpoint
from training.pair_run import PairRun

pytestmark = pytest.mark.models


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Linear(4, 3)


def _stepped(model: torch.nn.Module) -> torch.optim.Optimizer:
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    return opt


def test_a_resumed_run_has_the_saved_weights_optimizer_and_counters(tmp_path: Path) -> None:
    path = tmp_path / "ckpt.pt"
    model = _model(0)
    opt = _stepped(model)
    save_checkpoint(path, {"head": model}, {"opt": opt}, state={"step": 7}, dataset="d")
    assert not path.with_suffix(".tmp").exists()  # written beside, then moved over

    fresh = _model(1)
    assert not torch.equal(fresh.weight, model.weight)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    saved = load_checkpoint(path, {"head": fresh}, {"opt": fresh_opt})
    assert saved is not None and saved["state"] == {"step": 7} and saved["dataset"] == "d"
    assert torch.equal(fresh.weight, model.weight)
    assert fresh_opt.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]


def test_no_file_loads_nothing_and_a_refused_file_loads_nothing(tmp_path: Path) -> None:
    model = _model(0)
    opt = torch.optim.AdamW(model.parameters())
    assert load_checkpoint(tmp_path / "absent.pt", {"head": model}, {"opt": opt}) is None

    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, {"head": _model(1)}, {"opt": opt}, state={})
    before = model.weight.clone()

    def refuse(saved: dict) -> None:
        raise ValueError("another run")

    with pytest.raises(ValueError, match="another run"):
        load_checkpoint(path, {"head": model}, {"opt": opt}, check=refuse)
    assert torch.equal(model.weight, before)


def test_the_pair_run_resumes_both_models_and_its_counters(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt.pt"
    target, draft = _model(0), _model(1)
    run = PairRun(target, draft, lr=0.1, draft_lr=0.1, ckpt=ckpt, log=lambda _: None)
    run.state["step"] = 3
    with torch.no_grad():
        target.weight.add_(1.0)
    run.save()

    lines: list[str] = []
    t2, d2 = _model(2), _model(3)
    again = PairRun(t2, d2, lr=0.1, draft_lr=0.1, ckpt=ckpt, log=lines.append)
    assert again.state["step"] == 3 and lines == ["resumed at step 3"]
    assert torch.equal(t2.weight, target.weight) and torch.equal(d2.weight, draft.weight)
