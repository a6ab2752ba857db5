"""``make demo``'s printout: the demo pair's answer comes with a notice saying what it is for."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "demo.py"


def _demo() -> ModuleType:
    spec = importlib.util.spec_from_file_location("specrag_demo_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _view() -> dict[str, Any]:
    stats = {
        "method": "draft_model",
        "num_speculative_tokens": 4,
        "num_output_tokens": 64,
        "num_target_forwards": 18,
        "num_draft_tokens": 68,
        "num_accepted_tokens": 47,
        "acceptance_rate": 0.69,
        "mean_acceptance_length": 3.71,
        "accepted_per_position": [15, 13, 10, 9],
        "generation_ms": 900.0,
    }
    return {
        "status": "succeeded",
        "answer": 'According to [1], "expression1, expression1, expression1"',
        "sources": [{"document": "demo/corpus/assert.md", "title": "assert", "score": 0.8}],
        "stats": stats,
        "model_pair": "target+draft",
    }


@pytest.mark.parametrize("demo_pair", [True, False])
def test_the_notice_follows_the_demo_pairs_answer_only(
    demo_pair: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    demo = _demo()
    demo.show(_view(), "What does the assert statement do?", demo_pair=demo_pair)
    out = capsys.readouterr().out
    assert "Decoding stats:" in out and "rate 0.69" in out
    assert ("27.5M-parameter target" in out) is demo_pair
    assert ("docs/models.md" in out) is demo_pair
    if demo_pair:
        # The notice comes after the stats, where the newcomer's eye ends.
        assert out.index("Decoding stats:") < out.index("27.5M-parameter")


def test_the_notice_states_the_shipped_sizes() -> None:
    """The sizes the notice prints are the shipped checkpoints' (a retrained pair updates both)."""
    from safetensors import safe_open

    models = SCRIPT.parent.parent / "models" / "demo"
    counts = {}
    for name in ("target", "draft"):
        with safe_open(str(models / name / "model.safetensors"), "np") as f:
            counts[name] = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
    notice = _demo().DEMO_PAIR_NOTICE
    assert f"{counts['target'] / 1e6:.1f}M-parameter target" in notice
    assert f"{counts['draft'] / 1e6:.1f}M-parameter draft" in notice
