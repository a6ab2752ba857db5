"""Shadow mismatches judged by dtype: on a real torch engine in bfloat16 (the CPU check
forced, as tests/generation/test_dtype.py does) and a real PostgreSQL database, a speculative
answer that leaves the ``none`` baseline at a near-tie is stored excused, one at a clear margin a
violation; in float32 any mismatch is a violation; an engine without logits leaves it unjudged.
The report counts each apart and alerts critical only on the violations.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import torch
from sqlalchemy import Engine, create_engine, select
from sqlalchemy.orm import Session, sessionmaker

from app.audit import build_report, parse_window, render_report
from app.audit.records import ShadowRun
from app.evals.shadow import run_shadow
from generation import EngineConfig, SamplingParams, SpeculativeEngine
from generation.exactness import _logits
from generation.model import dtypes
from testkit.seeding import seed
from tests.conftest import fresh_pg_database
from tests.generation.tiny_models import build_model

VOCAB = 96
DAY = timedelta(days=1)
MIXED = datetime(2026, 5, 1, tzinfo=UTC)  # every kind of mismatch
TIES = datetime(2026, 5, 3, tzinfo=UTC)  # near-ties only


def _model() -> Any:
    return build_model("llama", vocab_size=VOCAB, seed=5, hidden_size=64, logit_scale=8.0)


@pytest.fixture(scope="module")
def engines() -> Iterator[dict[str, SpeculativeEngine]]:
    """The same tiny target in bfloat16 (as ``auto`` picks on an AMX CPU) and in float32."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dtypes, "cpu_bf16_flags", lambda: frozenset({"amx_bf16"}))
        bf16 = SpeculativeEngine(_model(), config=EngineConfig(dtype="auto"))
    f32 = SpeculativeEngine(_model(), config=EngineConfig(dtype="float32"))
    assert (bf16.dtype, f32.dtype) == ("bfloat16", "float32")
    yield {"bfloat16": bf16, "float32": f32}


@pytest.fixture(scope="module")
def db() -> Iterator[Engine]:
    with fresh_pg_database(migrated=True) as url:
        engine = create_engine(url)
        yield engine
        engine.dispose()


class Logitless:
    """An engine that decodes but exposes no logits (as the vLLM engine): the bf16 engine's
    ``generate`` and dtype, without ``judge_greedy``."""

    def __init__(self, engine: SpeculativeEngine) -> None:
        self.dtype = engine.dtype
        self.generate = engine.generate


def _case(engine: SpeculativeEngine, i: int) -> tuple[list[int], list[int], torch.Tensor]:
    """A prompt, its greedy ``none`` answer on ``engine``, and the top-2 gap at each position."""
    rng = random.Random(100 + i)
    prompt = [rng.randrange(VOCAB) for _ in range(rng.randrange(4, 30))]
    ref = engine.generate(prompt, SamplingParams(max_new_tokens=24, method="none")).token_ids
    top = _logits(engine.target_forward, prompt, ref, True).topk(2, dim=-1).values
    return prompt, ref, top[:, 0] - top[:, 1]


def _runner_up(engine: SpeculativeEngine, prompt: list[int], ref: list[int], at: int) -> list[int]:
    """``ref`` with its token at ``at`` swapped for the runner-up there (what a near-tie flips to)."""
    logits = _logits(engine.target_forward, prompt, ref[: at + 1], True)[at]
    first, second = logits.topk(2).indices.tolist()
    out = list(ref)
    out[at] = second if ref[at] == first else first
    return out


def _with_near_tie(
    engine: SpeculativeEngine, start: int
) -> tuple[int, list[int], list[int], torch.Tensor]:
    """The first case from ``start`` on whose ``none`` run has a near-tie (top-2 gap < 0.03)."""
    for i in range(start, start + 40):
        prompt, ref, gaps = _case(engine, i)
        if float(gaps.min()) < 0.03:
            return i, prompt, ref, gaps
    raise AssertionError("no near-tie in 40 cases: the tiny model's logits changed")


def _tampered(ref: list[int], position: int) -> list[int]:
    out = list(ref)
    out[position] = (out[position] + 1) % VOCAB  # not the argmax there
    return out


def _queries(db: Engine, start: datetime, n: int, seed_no: int) -> list[uuid.UUID]:
    """Answered speculative queries (with stats) to hang shadow runs on."""
    seeded = seed(db, 60, start=start, span=DAY, seed=seed_no, failed_share=0.0)
    ids = [q for q, r in zip(seeded.ids, seeded.rows, strict=True) if r["method"] != "none"]
    assert len(ids) >= n
    return ids[:n]


def _shadow(
    db: Engine,
    qid: uuid.UUID,
    engine: Any,
    prompt: list[int],
    spec: list[int],
    shadow_dtype: str = "float32",
) -> tuple[str, ShadowRun]:
    sf = sessionmaker(db, expire_on_commit=False)
    with sf() as session:
        session.add(
            ShadowRun(query_id=qid, status="pending", max_new_tokens=24,
                      prompt_token_ids=prompt, speculative_token_ids=spec)
        )  # fmt: skip
        session.commit()
    outcome = run_shadow(sf, engine, None, qid, shadow_dtype)
    with sf() as session:
        run = session.scalars(select(ShadowRun).where(ShadowRun.query_id == qid)).one()
    return outcome, run


def test_mismatches_are_judged_by_dtype_and_reported_apart(
    engines: dict[str, SpeculativeEngine], db: Engine
) -> None:
    bf16, f32 = engines["bfloat16"], engines["float32"]
    qids = _queries(db, MIXED, 7, seed_no=31)
    # Near-tie: the smallest gap of the bf16 none run; clear margin: its largest.
    i, prompt, ref, gaps = _with_near_tie(bf16, 0)
    tie, clear = int(gaps.argmin()), int(gaps.argmax())
    assert float(gaps[clear]) > 0.5 and float(gaps[tie]) < 0.05, gaps

    outcome, run = _shadow(db, qids[0], bf16, prompt, _runner_up(bf16, prompt, ref, tie))
    assert outcome == "near_tie" and run.judgment == "excused", (run.divergence_gap, run.error)
    assert run.first_mismatch == tie and run.mismatched_tokens >= 1
    assert (run.dtype, run.judged_dtype) == ("bfloat16", "float32")
    assert run.divergence_gap is not None and run.divergence_tolerance is not None
    assert 0 <= run.divergence_gap <= run.divergence_tolerance

    _, prompt2, ref2, gaps2 = _with_near_tie(bf16, i + 1)
    tie2 = int(gaps2.argmin())
    spec2 = _runner_up(bf16, prompt2, ref2, tie2)
    outcome, run = _shadow(db, qids[1], bf16, prompt2, spec2, "engine")
    assert outcome == "near_tie" and run.judged_dtype == "bfloat16"
    # The engine's own numerics: the gap is the bf16 none run's, as measured above.
    assert run.divergence_gap == pytest.approx(float(gaps2[tie2]), abs=1e-6)

    outcome, run = _shadow(db, qids[2], bf16, prompt, _tampered(ref, clear))
    assert outcome == "violation" and run.judgment == "violation"
    assert run.divergence_gap is not None and run.divergence_tolerance is not None
    assert run.divergence_gap > 5 * run.divergence_tolerance

    # At the same near-tie, a token far below the two tied ones: a bug, not rounding.
    far = list(ref)
    far[tie] = int(_logits(bf16.target_forward, prompt, ref[: tie + 1], True)[tie].argmin())
    outcome, run = _shadow(db, qids[6], bf16, prompt, far)
    assert outcome == "violation" and run.first_mismatch == tie
    assert run.divergence_gap is not None and run.divergence_tolerance is not None
    assert run.divergence_gap <= run.divergence_tolerance  # the position is a near-tie

    outcome, run = _shadow(db, qids[3], bf16, prompt, list(ref))
    assert outcome == "done" and run.mismatched_tokens == 0 and run.judgment is None

    # No logits to judge with: a bf16 mismatch stays unjudged, named as such.
    outcome, run = _shadow(db, qids[4], Logitless(bf16), prompt, _runner_up(bf16, prompt, ref, tie))
    assert outcome == "unjudged" and run.judgment == "unjudged" and run.divergence_gap is None
    assert run.error is not None and "no logits" in run.error and "bfloat16" in run.error

    # float32 is the bit-exact mode: a mismatch at its own near-tie is still a violation.
    _, fprompt, fref, fgaps = _with_near_tie(f32, 0)
    ftie = int(fgaps.argmin())
    outcome, run = _shadow(db, qids[5], f32, fprompt, _runner_up(f32, fprompt, fref, ftie))
    assert outcome == "violation" and run.judgment == "violation" and run.dtype == "float32"
    assert run.divergence_gap == pytest.approx(float(fgaps[ftie]), abs=1e-6)

    with Session(db) as session:
        runs = session.scalars(select(ShadowRun).where(ShadowRun.query_id.in_(qids))).all()
        excused = [r.divergence_gap for r in runs if r.judgment == "excused"]
        r = build_report(session, parse_window(MIXED, MIXED + DAY), ("method",))
        html = render_report(session, since=MIXED, until=MIXED + DAY, fmt="html")[1]
        body = json.loads(render_report(session, since=MIXED, until=MIXED + DAY)[1])
    sh = r["shadow"]
    assert sh["samples"] == 7 and sh["exactness_violations"] == 3
    assert sh["near_ties"] == 2 and sh["unjudged_mismatches"] == 1
    assert (sh["near_tie_gap_min"], sh["near_tie_gap_max"]) == pytest.approx(
        (min(excused), max(excused))
    )
    assert body["shadow"] == json.loads(json.dumps(sh))  # the JSON carries them as they are
    groups = r["groups"]
    assert sum(g["shadow"]["near_ties"] for g in groups) == 2
    assert sum(g["shadow"]["exactness_violations"] for g in groups) == 3
    lows = [g["shadow"]["near_tie_gap_min"] for g in groups if g["shadow"]["near_ties"]]
    assert min(lows) == pytest.approx(min(excused))
    critical = [a for a in r["alerts"] if a["kind"] == "exactness_violation" and not a["group"]]
    assert [a["severity"] for a in critical] == ["critical"]
    assert "3 shadow-sampled" in critical[0]["message"] and "2 near-tie" in critical[0]["message"]
    unjudged = [a for a in r["alerts"] if a["kind"] == "exactness_unjudged"]
    assert [a["severity"] for a in unjudged] == ["warning"] and "bfloat16" in unjudged[0]["message"]
    assert "near-ties excused: 2 (gap" in html and "left unjudged (no logits): 1" in html


def test_near_ties_alone_raise_no_alert(engines: dict[str, SpeculativeEngine], db: Engine) -> None:
    bf16 = engines["bfloat16"]
    qids = _queries(db, TIES, 3, seed_no=32)
    i = 50
    for qid in qids:
        i, prompt, ref, gaps = _with_near_tie(bf16, i + 1)
        spec = _runner_up(bf16, prompt, ref, int(gaps.argmin()))
        outcome, _ = _shadow(db, qid, bf16, prompt, spec)
        assert outcome == "near_tie", (i, gaps.min())
    with Session(db) as session:
        r = build_report(session, parse_window(TIES, TIES + DAY))
    assert r["shadow"]["near_ties"] == 3 and r["shadow"]["exactness_violations"] == 0
    assert not [a for a in r["alerts"] if a["kind"].startswith("exactness")]
