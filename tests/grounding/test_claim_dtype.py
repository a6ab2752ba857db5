"""Which numerics the fused scorer encodes claims in: the engine's ``auto`` rule on the CPU
(bfloat16 with AMX or AVX-512 BF16, else float32), passages always through the float32 encoder."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from app.grounding.scorer import claim_dtype, load_scorer
from app.settings import Settings
from generation.model import dtypes
from retrieval.grounding import FusedScorer, ScorerLoadError


class _Model:
    """An encoder that records its texts; ``in_dtype`` gives a sibling in that dtype."""

    def __init__(self, dtype: str = "float32", log: list[tuple[str, str]] | None = None) -> None:
        self.dtype, self.dim = dtype, 4
        self.log: list[tuple[str, str]] = [] if log is None else log

    def in_dtype(self, dtype: str) -> _Model:
        return self if dtype == "float32" else _Model(dtype, self.log)

    def encode(self, texts: list[str]) -> np.ndarray:
        self.log += [(self.dtype, t) for t in texts]
        rows = np.ones((len(texts), self.dim), dtype=np.float32)
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)


@pytest.mark.parametrize(
    ("flags", "name", "want"),
    [
        (frozenset(), "auto", "float32"),
        (frozenset({"avx512_bf16"}), "auto", "bfloat16"),
        (frozenset({"amx_bf16"}), "auto", "bfloat16"),
        (frozenset({"avx512_bf16"}), "float32", "float32"),
        (frozenset({"amx_bf16"}), "bfloat16", "bfloat16"),
    ],
)
def test_claims_are_encoded_in_the_hosts_dtype(
    monkeypatch: pytest.MonkeyPatch, flags: frozenset[str], name: str, want: str
) -> None:
    monkeypatch.setattr(dtypes, "cpu_bf16_flags", lambda: flags)
    settings = Settings(grounding=True, grounding_dtype=name)
    assert claim_dtype(settings) == want
    scorer = load_scorer(settings, _Model())
    assert isinstance(scorer, FusedScorer)
    assert scorer.encoder.dtype == "float32"  # type: ignore[attr-defined]
    assert scorer.claim_encoder.dtype == want  # type: ignore[attr-defined]


def test_bfloat16_on_a_cpu_without_it_refuses_the_scorer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dtypes, "cpu_bf16_flags", lambda: frozenset())
    with pytest.raises(ScorerLoadError, match="avx512_bf16"):
        load_scorer(Settings(grounding=True, grounding_dtype="bfloat16"), _Model())


def test_claims_take_the_claim_encoder_and_passages_the_other() -> None:
    model = _Model()
    scorer = FusedScorer(model, claim_encoder=model.in_dtype("bfloat16"), cache_passages=0)
    passage = "Assert statements insert debugging assertions. Assignments are illegal."
    scorer.support(["It is async.", "Assignments are illegal."], [passage])
    seen: dict[str, Any] = {}
    for dtype, text in model.log:
        seen.setdefault(text, set()).add(dtype)
    assert seen["It is async."] == {"bfloat16"}
    assert seen[passage] == {"float32"}
    # A claim written as a passage sentence takes that sentence's float32 vector, not encoded.
    assert seen["Assignments are illegal."] == {"float32"}
