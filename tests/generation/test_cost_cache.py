"""Step-cost tables kept between processes (generation/spec_decode/cost_cache.py): loaded instead of timed by
the same engine on the same machine, measured again for any other, and a bad file ignored."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from generation.spec_decode.cost_cache import StepCostCache, files_identity, machine_identity
from generation.spec_decode.goodput import StepCosts

K_MAX = 4
STAIRS = [0.010, 0.011, 0.013, 0.020, 0.021]


class CountingTimer:
    """A step timer returning ``STAIRS`` (scaled), counting its calls."""

    def __init__(self, scale: float = 1.0) -> None:
        self.calls: list[tuple[int, bool]] = []
        self.scale = scale

    def __call__(self, batch_size: int, ks: list[int], with_draft: bool) -> dict[int, float]:
        self.calls.append((batch_size, with_draft))
        return {k: STAIRS[k] * self.scale for k in ks}


def identity(**changes: object) -> dict[str, object]:
    return {"models": ["target@1"], "engine": {"dtype": "float32"}, **changes}


def costs(cache: StepCostCache | None, timer: CountingTimer) -> StepCosts:
    return StepCosts(timer, K_MAX, cache=cache)


def test_a_later_process_loads_the_table_instead_of_timing(tmp_path: Path) -> None:
    first = CountingTimer()
    costs(StepCostCache(tmp_path, identity()), first).table(1, True)
    assert first.calls == [(1, True)]
    later = CountingTimer(scale=5.0)  # would time other figures: it must not be asked
    loaded = costs(StepCostCache(tmp_path, identity()), later).table(1, True)
    assert later.calls == []
    assert [loaded.relative(k) for k in range(K_MAX + 1)] == pytest.approx(
        [t / STAIRS[0] for t in STAIRS]
    )
    # Another table of the same engine is measured and kept beside the first.
    costs(StepCostCache(tmp_path, identity()), later).table(1, False)
    assert later.calls == [(1, False)]
    stored = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert set(stored["tables"]) == {"1:True", "1:False"}


@pytest.mark.parametrize(
    "changed",
    [
        identity(engine={"dtype": "bfloat16"}),  # the dtype
        identity(models=["target@2"]),  # the checkpoint's files
        identity(machine={"threads": 2}),  # the CPU or torch's threads
    ],
)
def test_another_engine_or_machine_measures_again(tmp_path: Path, changed: dict) -> None:
    costs(StepCostCache(tmp_path, identity()), CountingTimer()).table(1, True)
    again = CountingTimer()
    costs(StepCostCache(tmp_path, changed), again).table(1, True)
    assert again.calls == [(1, True)]
    assert len(list(tmp_path.glob("*.json"))) == 2  # both kept: neither overwrites the other


def test_rewritten_weights_change_the_identity(tmp_path: Path) -> None:
    model = tmp_path / "target"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"x" * 10)
    before = files_identity(model)
    (model / "model.safetensors").write_bytes(b"y" * 12)
    assert files_identity(model) != before
    assert before["path"] == str(model.resolve())
    assert (
        StepCostCache(tmp_path, {"m": before}).path
        != StepCostCache(tmp_path, {"m": files_identity(model)}).path
    )


def test_the_machine_identity_names_cpu_torch_and_threads() -> None:
    import torch

    found = machine_identity()
    assert found["threads"] == torch.get_num_threads()
    assert found["torch"] == torch.__version__
    assert {"cpu_flags", "cpu_capability", "machine"} <= set(found)


@pytest.mark.parametrize(
    "content",
    [
        "{not json",  # truncated or corrupt
        json.dumps([1, 2, 3]),  # not an object
        json.dumps({"identity": {"format": 1, "other": True}, "tables": {"1:True": STAIRS}}),
        json.dumps({"identity": None, "tables": {"1:True": [0.01, -1, 0.02, 0.03, 0.04]}}),
    ],
)
def test_a_bad_file_is_ignored_with_a_log_line_and_replaced(
    tmp_path: Path, content: str, caplog: pytest.LogCaptureFixture
) -> None:
    cache = StepCostCache(tmp_path, identity())
    cache.path.write_text(content)
    timer = CountingTimer()
    with caplog.at_level(logging.WARNING, logger="generation.spec_decode.cost_cache"):
        costs(cache, timer).table(1, True)
    assert timer.calls == [(1, True)]
    assert any(str(cache.path) in r.getMessage() for r in caplog.records)
    # The measurement replaced it: the next process loads it.
    later = CountingTimer()
    costs(StepCostCache(tmp_path, identity()), later).table(1, True)
    assert later.calls == []


def test_a_malformed_table_is_measured_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = StepCostCache(tmp_path, identity())
    for bad in ([0.01, 0.02], [0.01, 0.0, 0.02, 0.03, 0.04], ["a"] * 5):  # length, zero, type
        cache.path.write_text(json.dumps({"identity": cache.identity, "tables": {"1:True": bad}}))
        timer = CountingTimer()
        with caplog.at_level(logging.WARNING, logger="generation.spec_decode.cost_cache"):
            costs(cache, timer).table(1, True)
        assert timer.calls == [(1, True)]
        assert "malformed" in caplog.records[-1].getMessage()


def test_an_unwritable_directory_costs_a_measurement_not_the_table(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    cache = StepCostCache(blocker / "step_costs", identity())  # its parent is a file
    with caplog.at_level(logging.WARNING, logger="generation.spec_decode.cost_cache"):
        table = costs(cache, CountingTimer()).table(1, True)
    assert table.relative(0) == 1.0
    assert "not written" in caplog.records[-1].getMessage()


def test_fixed_k_steps_are_recorded_only_in_a_table_in_use() -> None:
    timer = CountingTimer()
    step_costs = costs(None, timer)
    step_costs.observe(1, True, False, 4, 0.5)  # no table yet: none is measured to record it
    assert timer.calls == [] and step_costs.tables == {}
    table = step_costs.table(1, True)
    for _ in range(50):
        step_costs.observe(1, True, False, 0, STAIRS[0])
        step_costs.observe(1, True, False, 4, 0.5)
    assert table.relative(4) > 5 * STAIRS[4] / STAIRS[0]  # the observed (slow) steps moved it
    assert timer.calls == [(1, True)]
