"""The embedder on the real MiniLM: a single question's fast path gives sentence-transformers' bits."""

from __future__ import annotations

import numpy as np
import pytest

from retrieval import Embedder
from retrieval.embedder import _torch_threads

QUESTIONS = [
    "What does os.path.join do with absolute components?",
    "PYTHONSAFEPATH",
    "   ",  # whitespace only: the model still sees [CLS] [SEP]
    "__init_subclass__ " * 200,  # past the model's 256 tokens: truncated alike
    "Ünïcödé — emoji 🐍 and CJK 文字",
]


@pytest.mark.parametrize("question", QUESTIONS)
def test_one_question_is_embedded_exactly_as_sentence_transformers_does(
    embedder: Embedder, question: str
) -> None:
    ours = embedder.encode([question])
    with _torch_threads(embedder.query_threads):  # as encode runs a question: same sums
        theirs = embedder._model.encode(
            [question], normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
        )
    assert ours.shape == (1, embedder.dim) and ours.dtype == np.float32
    assert ours.flags["C_CONTIGUOUS"]
    assert np.array_equal(ours, theirs)  # bit for bit: indexes built either way agree
    assert abs(float(np.linalg.norm(ours)) - 1.0) < 1e-5


def test_many_texts_and_one_agree(embedder: Embedder) -> None:
    """The batch path (ingest) and the one-question path (search) embed a text the same."""
    batch = embedder.encode(QUESTIONS[:2])
    one = np.concatenate([embedder.encode([q]) for q in QUESTIONS[:2]])
    np.testing.assert_allclose(batch, one, atol=1e-6)
