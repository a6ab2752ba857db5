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


def test_a_bfloat16_copy_leaves_the_float32_model_alone(embedder: Embedder) -> None:
    """in_dtype("bfloat16") runs its own linear layers in bfloat16 (vectors within float
    rounding of float32) and shares the rest; the embedder it came from stays float32, bit for bit
    (search and ingest vectors never change)."""
    import torch

    texts = ["The assert statement inserts debugging assertions into a program.", "It is async."]
    before = embedder.encode(texts)
    bf16 = embedder.in_dtype("bfloat16")
    assert embedder.in_dtype("float32") is embedder
    assert bf16.dtype == "bfloat16" and embedder.dtype == "float32"
    linears = [m for m in bf16._model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(m.weight.dtype == torch.bfloat16 for m in linears)
    assert {p.dtype for p in embedder._model.parameters()} == {torch.float32}
    ours = {id(p) for p in embedder._model.parameters()}
    assert any(id(p) in ours for p in bf16._model.parameters())  # embeddings, layer norms shared
    assert not any(id(m.weight) in ours for m in linears)
    after = bf16.encode(texts)
    assert after.dtype == np.float32 and after.shape == before.shape
    assert not np.array_equal(after, before)  # it did compute in bfloat16
    cosine = (after * before).sum(axis=1)
    assert (cosine > 1 - 1e-3).all(), cosine
    assert np.array_equal(embedder.encode(texts), before)
    with pytest.raises(ValueError, match="float16"):
        embedder.in_dtype("float16")
