"""Production-like RAG traffic over the demo corpus: Zipf-popular documents, repeated questions.

What the web backend sends is a question and a collection; the worker retrieves the top passages
and builds the numbered prompt (passages first, then the question). So two questions about the
same popular document share the prompt's head (its top passage, often more), and a repeated
question repeats the whole prompt. The prompts here come from the product's own code: the demo
corpus chunked by ``retrieval.chunking`` in the embedder's tokens, embedded by MiniLM, searched
exactly (inner product over unit vectors, as the product's exact index), and put together by
``retrieval.prompt.fit_passages`` within the target's context budget, encoded by the target's
tokenizer as ``app/pipeline.py`` does.

Questions: a document is drawn with Zipf probability (rank r ~ 1 / r^s over a seeded shuffle of
the corpus), then one of a few question templates about its title or one of its headings; a
``repeat`` share of requests instead repeat an earlier question (drawn from those asked so far,
weighted by how often each was asked: popular questions recur, as FAQs do).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TEMPLATES = (
    "What is {t}?",
    "How does {t} work?",
    "Explain {t} with an example.",
    "When should I use {t}?",
    "What are common mistakes with {t}?",
    "Summarize {t}.",
)


@dataclass(frozen=True)
class Request:
    """One request of the traffic: the question, the document it is about, its prompt."""

    question: str
    document: str
    prompt: list[int]
    repeat: bool
    """Whether this question was asked before in the traffic."""


def _topic(title: str, heading: str | None) -> str:
    return heading if heading and heading != title else title.replace("-", " ")


def questions(
    docs: list[tuple[str, list[str | None]]], n: int, seed: int, zipf_s: float, repeat: float
) -> list[tuple[str, str, bool]]:
    """``n`` (question, document, repeated) over ``docs`` (title, headings) as the docstring says."""
    rng = random.Random(seed)
    order = list(range(len(docs)))
    rng.shuffle(order)
    weights = [1.0 / (rank + 1) ** zipf_s for rank in range(len(docs))]
    asked: list[tuple[str, str]] = []
    out = []
    for _ in range(n):
        if asked and rng.random() < repeat:
            question, doc = rng.choice(asked)  # each earlier ask is one ticket: popular recurs
            out.append((question, doc, True))
        else:
            title, headings = docs[order[rng.choices(range(len(docs)), weights)[0]]]
            heading = rng.choice(headings) if headings else None
            question = rng.choice(TEMPLATES).format(t=_topic(title, heading))
            seen = any(q == question for q, _ in asked)
            out.append((question, title, seen))
            doc = title
        asked.append((question, doc))
    return out


def build_traffic(
    settings: Any,
    tokenizer: Any,
    n: int,
    *,
    seed: int = 0,
    zipf_s: float = 1.1,
    repeat: float = 0.3,
    max_tokens: int = 64,
    top_k: int = 3,
    max_context: int = 2048,
    cache: Path | None = None,
) -> list[Request]:
    """``n`` requests of the traffic, prompts as token ids (read from ``cache`` when it matches)."""
    key = {"n": n, "seed": seed, "zipf_s": zipf_s, "repeat": repeat, "top_k": top_k,
           "max_tokens": max_tokens, "v": 1}  # fmt: skip
    if cache is not None and cache.is_file():
        stored = json.loads(cache.read_text())
        if stored.get("key") == key:
            return [Request(**r) for r in stored["requests"]]
    import faiss
    import numpy as np

    from retrieval import Embedder
    from retrieval.chat import PromptFormat
    from retrieval.chunking import Chunker, embedding_text
    from retrieval.loaders import load_document
    from retrieval.prompt import fit_passages
    from retrieval.results import SearchHit

    embedder = Embedder(settings.embedding_model, device="cpu")
    chunker = Chunker(embedder.tokenizer, settings.chunk_tokens, settings.chunk_overlap)
    files = sorted((Path(__file__).resolve().parents[1] / "demo" / "corpus").glob("*.md"))
    chunks, docs = [], []
    for path in files:
        loaded = load_document(path, settings.max_file_bytes)
        drafts = chunker.chunk(loaded)
        docs.append((loaded.title, sorted({d.heading for d in drafts if d.heading}, key=str)))
        chunks.extend((str(path), d) for d in drafts)
    vectors = embedder.encode([embedding_text(d.title, d.heading, d.text) for _, d in chunks])
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    asked = questions(docs, n, seed, zipf_s, repeat)
    qvec = embedder.encode([q for q, _, _ in asked])
    scores, ids = index.search(np.ascontiguousarray(qvec), top_k)

    fmt = PromptFormat.for_tokenizer(tokenizer)  # as the pipeline makes prompts

    out = []
    for (question, doc, repeated), row, score in zip(asked, ids, scores, strict=True):
        hits = [
            SearchHit(chunks[i][0], int(i), float(s), chunks[i][1].text, chunks[i][1].title,
                      chunks[i][1].heading, chunks[i][1].position)
            for i, s in zip(row, score, strict=True)
        ]  # fmt: skip
        passages, _ = fit_passages(
            question, hits, lambda ps, q=question: len(fmt.encode(q, ps)), max_context - max_tokens
        )
        ids_ = fmt.encode(question, passages)
        out.append(Request(question, doc, ids_, repeated))
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps({"key": key, "requests": [r.__dict__ for r in out]}))
    return out


def shared_prefix_share(prompts: list[list[int]], block: int = 16) -> float:
    """Share of prompt tokens an ideal prefix cache (unbounded, full blocks) would reuse, in order."""
    seen: set[tuple[int, ...]] = set()
    total = reused = 0
    for p in prompts:
        total += len(p)
        n = 0
        while (n + 1) * block <= len(p) - 1 and tuple(p[: (n + 1) * block]) in seen:
            n += 1
        reused += n * block
        for i in range(1, len(p) // block + 1):
            seen.add(tuple(p[: i * block]))
    return reused / total if total else 0.0
