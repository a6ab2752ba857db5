"""Chunking: sized in MiniLM tokens, cut between words, overlapping, titled, deterministic."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from retrieval import Embedder
from retrieval.chunking import Chunker
from retrieval.loaders import load_document

CORPUS = Path(__file__).resolve().parents[2] / "demo" / "corpus"
SAMPLE = ["assignment.md", "debugger.md", "formatstrings.md", "lambda.md", "try.md"]


@pytest.fixture(scope="module")
def chunker(embedder: Embedder) -> Chunker:
    return Chunker(embedder.tokenizer, chunk_tokens=224, overlap=32)


@pytest.mark.parametrize("name", SAMPLE)
def test_chunks_fit_the_budget_in_model_tokens(
    chunker: Chunker, embedder: Embedder, name: str
) -> None:
    doc = load_document(CORPUS / name, 10**7)
    for chunk in chunker.chunk(doc):
        counted = len(embedder.tokenizer.tokenize(chunk.text))
        assert chunk.token_count == counted
        assert counted <= 224 or len(chunk.text.split()) == 1


@pytest.mark.parametrize("name", SAMPLE)
def test_chunks_cut_between_words_overlap_and_cover_every_word(
    chunker: Chunker, embedder: Embedder, name: str
) -> None:
    doc = load_document(CORPUS / name, 10**7)
    for section in doc.sections:
        pieces = chunker.split(section.text)
        words = [(m.start(), m.end()) for m in re.finditer(r"\S+", section.text)]
        starts, ends = {a for a, _ in words}, {b for _, b in words}
        covered: set[int] = set()
        previous_end = -1
        for text, _ in pieces:
            start = section.text.index(text, max(previous_end - len(text), 0))
            end = start + len(text)
            assert start in starts and end in ends  # never mid-word
            if previous_end >= 0:
                # Consecutive chunks overlap, unless the last word alone outweighs the overlap.
                last_word = section.text[:previous_end].split()[-1]
                long_word = len(embedder.tokenizer.tokenize(last_word)) > chunker.overlap
                assert start < previous_end or (long_word and start >= previous_end)
            covered |= {i for i, (a, b) in enumerate(words) if a >= start and b <= end}
            previous_end = end
        assert covered == set(range(len(words)))


def test_overlap_is_about_the_configured_token_count(embedder: Embedder) -> None:
    chunker = Chunker(embedder.tokenizer, chunk_tokens=64, overlap=16)
    text = " ".join(f"word{i}" for i in range(400))  # no sentence ends: pure size-based cuts
    pieces = chunker.split(text)
    assert len(pieces) > 5
    for (a, _), (b, _) in zip(pieces, pieces[1:], strict=False):
        shared = set(a.split()) & set(b.split())
        shared_tokens = sum(len(embedder.tokenizer.tokenize(w)) for w in shared)
        assert 16 - 4 <= shared_tokens <= 16


def test_chunks_carry_title_and_nearest_heading(chunker: Chunker) -> None:
    doc = load_document(CORPUS / "try.md", 10**7)
    chunks = chunker.chunk(doc)
    assert {c.title for c in chunks} == {'The "try" statement'}
    headings = [c.heading for c in chunks]
    assert '"finally" clause' in headings and '"except" clause' in headings
    finally_chunk = next(c for c in chunks if c.heading == '"finally" clause')
    assert finally_chunk.passage_title == 'The "try" statement — "finally" clause'
    assert [c.position for c in chunks] == list(range(len(chunks)))


def test_prefers_paragraph_ends(embedder: Embedder) -> None:
    chunker = Chunker(embedder.tokenizer, chunk_tokens=64, overlap=8)
    paragraph = " ".join(["steam"] * 25) + "."
    pieces = chunker.split("\n\n".join([paragraph] * 6))
    assert all(text.endswith(".") for text, _ in pieces)


def test_deterministic(embedder: Embedder) -> None:
    doc = load_document(CORPUS / "formatstrings.md", 10**7)
    first = Chunker(embedder.tokenizer).chunk(doc)
    second = Chunker(embedder.tokenizer).chunk(doc)
    assert first == second


def test_bad_sizes_are_refused(embedder: Embedder) -> None:
    with pytest.raises(ValueError, match="overlap"):
        Chunker(embedder.tokenizer, chunk_tokens=64, overlap=40)
    with pytest.raises(ValueError, match="at least 16"):
        Chunker(embedder.tokenizer, chunk_tokens=8, overlap=0)
