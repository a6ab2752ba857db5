"""Question/answer examples in the product's prompt format, built from the corpus's structure.

Each example is ``format_prompt(question, passages)`` followed by an answer that cites the
passage holding the answer and quotes it verbatim: `` According to [2], "<copied span>"``.
Copying is the point: it grounds the answer in its source, and it is what a draft model and
the n-gram proposer can predict.  Distractor passages (same document or elsewhere) make the
model pick the right passage; passage lengths vary around the product's 150-220-word chunks.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from retrieval.prompt import Passage, format_prompt
from training.corpus import Document, normalise

_SENTENCE_END = re.compile(r"(?<=[.!?:])\s+(?=[A-Z\"'(`*])")
_DEFINITION = re.compile(r"^(?:The |An? )?([\"'`]?[\w.\"'`() -]{3,40}?) (?:is|are|returns?|means) ")
_GRAMMAR = re.compile(r"^\s*([a-z_][a-z0-9_]*)\s+::=")
_PRONOUNS = {
    "It",
    "This",
    "These",
    "That",
    "Those",
    "Each",
    "There",
    "They",
    "Here",
    "What",
    "Which",
}


@dataclass(frozen=True)
class Chunk:
    """A passage-sized piece of one section, titled as the product titles retrieved passages."""

    title: str
    heading: str
    doc_title: str
    text: str
    first: bool = True


@dataclass(frozen=True)
class Example:
    """One training or evaluation example: the prompt and the answer the model should give."""

    prompt: str
    answer: str
    question: str = ""
    passages: tuple[Passage, ...] = ()


def chunk_documents(docs: Sequence[Document], max_words: int) -> list[Chunk]:
    """Every section cut into chunks of at most ``max_words`` words at paragraph/line breaks."""
    chunks: list[Chunk] = []
    for doc in docs:
        for sec in doc.sections:
            title = f"{doc.title} — {sec.heading}" if sec.heading else doc.title
            lines = normalise(sec.text).split("\n")
            buf: list[str] = []
            count = 0
            first = True
            for line in lines + [None]:
                n = len(line.split()) if line is not None else 0
                if buf and (line is None or count + n > max_words):
                    text = "\n".join(buf).strip("\n")
                    if len(text.split()) >= 8:
                        chunks.append(Chunk(title, sec.heading, doc.title, text, first))
                        first = False
                    buf, count = [], 0
                if line is not None:
                    if n > max_words:  # one enormous line: keep its first max_words words
                        line = " ".join(line.split()[:max_words])
                        n = max_words
                    buf.append(line)
                    count += n
    return chunks


def sentences(text: str) -> list[str]:
    """The passage's sentences as exact substrings of it (so quoting them copies verbatim)."""
    out = []
    for piece in _SENTENCE_END.split(text):
        piece = piece.strip()
        if piece:
            out.append(piece)
    return out


def _quote_span(rng: random.Random, sents: list[str], start: int, max_words: int = 60) -> str:
    span = [sents[start]]
    words = len(sents[start].split())
    j = start + 1
    while j < len(sents) and words < 25 and rng.random() < 0.6:
        w = len(sents[j].split())
        if words + w > max_words:
            break
        span.append(sents[j])
        words += w
        j += 1
    text = " ".join(span)
    if len(text.split()) > max_words:
        text = " ".join(text.split()[:max_words])
    return text


def question_and_quote(rng: random.Random, chunk: Chunk) -> tuple[str, str] | None:
    """A question this chunk answers and the verbatim span that answers it, or None."""
    sents = sentences(chunk.text)
    if not sents:
        return None
    kinds = ["heading", "heading", "title"] if chunk.first else ["keywords", "keywords"]
    grammar = [i for i, s in enumerate(sents) if _GRAMMAR.match(s)]
    defs = [
        (i, m.group(1))
        for i, s in enumerate(sents)
        if (m := _DEFINITION.match(s)) and m.group(1).split()[0] not in _PRONOUNS
    ]
    if grammar:
        kinds += ["grammar"] * 2
    if defs:
        kinds += ["definition"] * 2
    kind = rng.choice(kinds)
    if kind == "grammar":
        i = rng.choice(grammar)
        name = _GRAMMAR.match(sents[i]).group(1)  # type: ignore[union-attr]
        q = rng.choice(
            [
                f"What is the grammar rule for {name}?",
                f"What is the syntax of {name}?",
                f"How is {name} defined in the grammar?",
            ]
        )
        rule = sents[i].strip().split("\n")
        return q, "\n".join(rule[: rng.randint(1, 3)]).strip()
    if kind == "definition":
        i, term = rng.choice(defs)
        term = term.strip()
        q = rng.choice([f"What is {term}?", f"What does {term} do?", f"Explain {term}."])
        return q, _quote_span(rng, sents, i)
    if kind == "keywords":
        i = rng.randrange(len(sents))
        words = [w.strip('.,:;()"') for w in sents[i].split()]
        words = [w for w in words if len(w) > 3 and w.isidentifier()]
        if len(words) < 2:
            return None
        k = rng.sample(words, min(len(words), rng.randint(2, 3)))
        about = " ".join(k)
        q = rng.choice(
            [
                f"What does {chunk.doc_title} say about {about}?",
                f"What about {about}?",
                f"What is said about {about}?",
            ]
        )
        return q, _quote_span(rng, sents, i)
    subject = chunk.heading if kind == "heading" and chunk.heading else chunk.doc_title
    if "." in subject and " " not in subject:  # a docstring's object: module.func
        q = rng.choice(
            [
                f"What does {subject} do?",
                f"What is {subject}?",
                f"How do I use {subject.rsplit('.', 1)[-1]} from {subject.split('.')[0]}?",
            ]
        )
    else:
        q = rng.choice(
            [
                f"What does the documentation say about {subject}?",
                f"What is {subject}?",
                f"Explain {subject}.",
                f"Tell me about {subject}.",
                f"How does {subject} work?",
            ]
        )
    return q, _quote_span(rng, sents, 0)


RETRIEVAL_GOLD_WEIGHTS = (6.0, 2.5, 1.5)
"""Gold-passage position weights of the raw pair's data: retrieval ranks the answer first most often."""
UNIFORM_GOLD_WEIGHTS = (1.0, 1.0, 1.0)


def _maybe_flatten(rng: random.Random, text: str) -> str:
    # The product's chunker may or may not keep line breaks; train on both shapes.
    return " ".join(text.split()) if rng.random() < 0.3 else text


def make_example(
    rng: random.Random,
    chunks: Sequence[Chunk],
    by_doc: dict[str, list[int]],
    n_passages: int,
    no_answer_rate: float = 0.0,
    gold_weights: Sequence[float] = RETRIEVAL_GOLD_WEIGHTS,
) -> Example | None:
    """A prompt with ``n_passages`` passages (one gold, others distractors) and its cited answer.

    The gold passage's position is drawn with ``gold_weights`` (first ``n_passages`` of them):
    the raw pair trained on a retrieval-like prior (mostly [1]); the instruct pair's second
    fine-tune draws it uniformly, so citing [1] regardless of content no longer pays.

    With probability ``no_answer_rate`` the gold passage is left out (distractors from other
    documents only) and the answer says the passages do not hold it.
    """
    gi = rng.randrange(len(chunks))
    gold = chunks[gi]
    flat = rng.random() < 0.3
    gold_text = " ".join(gold.text.split()) if flat else gold.text
    qa = question_and_quote(
        rng, Chunk(gold.title, gold.heading, gold.doc_title, gold_text, gold.first)
    )
    if qa is None:
        return None
    question, quote = qa
    others: list[int] = []
    same = [i for i in by_doc[gold.doc_title] if i != gi]
    while len(others) < n_passages - 1:
        pool = same if same and rng.random() < 0.5 else range(len(chunks))
        j = rng.choice(list(pool))
        if j != gi and j not in others:
            others.append(j)
    gold_pos = rng.choices(range(n_passages), weights=list(gold_weights)[:n_passages])[0]
    passages = [Passage(chunks[j].title, _maybe_flatten(rng, chunks[j].text)) for j in others]
    if no_answer_rate and rng.random() < no_answer_rate:
        outside = [j for j in range(len(chunks)) if chunks[j].doc_title != gold.doc_title]
        passages = [
            Passage(chunks[j].title, _maybe_flatten(rng, chunks[j].text))
            for j in rng.sample(outside, n_passages)
        ]
        return Example(
            prompt=format_prompt(question, passages),
            answer=f" {NO_ANSWER}",
            question=question,
            passages=tuple(passages),
        )
    passages.insert(gold_pos, Passage(gold.title, gold_text))
    n = gold_pos + 1
    if rng.random() < 0.8:
        answer = f' According to [{n}], "{quote}"'
    else:
        answer = f' [{n}] {gold.title} says: "{quote}"'
    return Example(
        prompt=format_prompt(question, passages),
        answer=answer,
        question=question,
        passages=tuple(passages),
    )


NO_ANSWER = "The passages do not say."

ChunkTables = dict[int, tuple[list[Chunk], dict[str, list[int]]]]


def chunk_tables(docs: Sequence[Document], max_words: Sequence[int]) -> ChunkTables:
    """For each passage-length limit: the chunks and each document's chunk indices."""
    tables: ChunkTables = {}
    for mw in max_words:
        chunks = chunk_documents(docs, mw)
        by_doc: dict[str, list[int]] = {}
        for i, c in enumerate(chunks):
            by_doc.setdefault(c.doc_title, []).append(i)
        tables[mw] = (chunks, by_doc)
    return tables


DEFAULT_MAX_WORDS = (60, 110, 160, 220)


def make_examples(
    docs: Sequence[Document],
    count: int,
    seed: int,
    max_words: Sequence[int] = DEFAULT_MAX_WORDS,
    tables: ChunkTables | None = None,
    n_passages: Sequence[int] = (2, 3, 3),
    no_answer_rate: float = 0.0,
    gold_weights: Sequence[float] = RETRIEVAL_GOLD_WEIGHTS,
) -> list[Example]:
    """``count`` seeded examples; passage length limits drawn from ``max_words``; a share
    ``no_answer_rate`` of them without the passage that answers (and an answer saying so)."""
    rng = random.Random(seed)
    tables = tables if tables is not None else chunk_tables(docs, max_words)
    out: list[Example] = []
    while len(out) < count:
        mw = rng.choice(list(max_words))
        chunks, by_doc = tables[mw]
        ex = make_example(
            rng,
            chunks,
            by_doc,
            n_passages=rng.choice(list(n_passages)),
            no_answer_rate=no_answer_rate,
            gold_weights=gold_weights,
        )
        if ex is not None:
            out.append(ex)
    return out
