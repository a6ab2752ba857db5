"""Seeded, resumable batches of tokenized RAG examples, bucketed by length to waste little padding.

Batch ``(round, index)`` is a pure function of the seed, so a resumed run sees exactly the
batches an uninterrupted one would have seen.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerFast

from retrieval.chat import PromptFormat, encode_text
from training.corpus import Document
from training.qa import (
    DEFAULT_MAX_WORDS,
    RETRIEVAL_GOLD_WEIGHTS,
    Example,
    chunk_tables,
    make_examples,
)

ANSWER_WEIGHT_SPLIT = 0.8  # share of the loss carried by answer tokens (the copying we measure)
INDUCTION_LEN = (24, 400)  # span length range of synthetic induction rows, in tokens


@dataclass
class Batch:
    """Right-padded token rows; ``is_answer``/``is_real`` mark which labels count and how."""

    input_ids: torch.Tensor  # [batch, seq]
    is_real: torch.Tensor  # [batch, seq] bool: position predicts a real next token
    is_answer: torch.Tensor  # [batch, seq] bool: that next token belongs to the answer


def encode_example(
    tok: PreTrainedTokenizerFast, ex: Example, fmt: PromptFormat | None = None
) -> tuple[list[int], int]:
    """Token ids of prompt + answer + EOS, and how many of them are the prompt.

    ``fmt`` None: the raw prompt text; else ``fmt``'s prompt ids (the serving path's own
    encoder, retrieval/chat.py) and the answer ended by the tokenizer's EOS (end of turn).
    """
    if fmt is None:
        p = tok(ex.prompt, add_special_tokens=False)["input_ids"]
        a = tok(ex.answer, add_special_tokens=False)["input_ids"]
    else:
        p = fmt.encode(ex.question, ex.passages)
        a = encode_text(tok, ex.answer.strip())
    return p + a + [tok.eos_token_id], len(p)


def collate(rows: Sequence[tuple[list[int], int]], pad_id: int) -> Batch:
    """One right-padded batch; position t's label is token t+1."""
    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    real = torch.zeros((len(rows), width), dtype=torch.bool)
    ans = torch.zeros((len(rows), width), dtype=torch.bool)
    for r, (seq, n_prompt) in enumerate(rows):
        ids[r, : len(seq)] = torch.tensor(seq)
        real[r, : len(seq) - 1] = True
        ans[r, n_prompt - 1 : len(seq) - 1] = True
    return Batch(ids, real, ans)


def bucket(
    rows: Sequence[tuple[list[int], int]], tokens_per_batch: int, rng: random.Random
) -> list[list[tuple[list[int], int]]]:
    """Rows (ids, prompt length) cut into batches of similar length, ~tokens_per_batch padded
    tokens each (a longer row alone), in ``rng``'s shuffled order."""
    batches: list[list[tuple[list[int], int]]] = []
    cur: list[tuple[list[int], int]] = []
    for row in sorted(rows, key=lambda r: len(r[0])):
        if cur and (len(cur) + 1) * len(row[0]) > tokens_per_batch:
            batches.append(cur)
            cur = []
        cur.append(row)
    if cur:
        batches.append(cur)
    rng.shuffle(batches)
    return batches


class BatchStream:
    """Rounds of freshly generated examples, cut into length-bucketed batches of ~tokens_per_batch."""

    def __init__(
        self,
        docs: Sequence[Document],
        tok: PreTrainedTokenizerFast,
        seed: int,
        tokens_per_batch: int = 8192,
        examples_per_round: int = 384,
        max_len: int = 1280,
        max_words: Sequence[int] = DEFAULT_MAX_WORDS,
        n_passages: Sequence[int] = (2, 3, 3),
        fmt: PromptFormat | None = None,
        no_answer_rate: float = 0.0,
        gold_weights: Sequence[float] = RETRIEVAL_GOLD_WEIGHTS,
    ) -> None:
        self.docs, self.tok, self.seed = docs, tok, seed
        self.gold_weights = tuple(gold_weights)
        self.fmt, self.no_answer_rate = fmt, no_answer_rate
        self.tokens_per_batch, self.examples_per_round, self.max_len = (
            tokens_per_batch,
            examples_per_round,
            max_len,
        )
        self.max_words, self.n_passages = max_words, n_passages
        self.tables = chunk_tables(docs, max_words)
        self._cache: tuple[int, list[list[tuple[list[int], int]]]] | None = None

    def round_batches(self, rnd: int) -> list[list[tuple[list[int], int]]]:
        """The batches of round ``rnd``, each a list of encoded examples."""
        if self._cache and self._cache[0] == rnd:
            return self._cache[1]
        examples = make_examples(
            self.docs,
            self.examples_per_round,
            seed=self.seed * 100_003 + rnd,
            max_words=self.max_words,
            tables=self.tables,
            n_passages=self.n_passages,
            no_answer_rate=self.no_answer_rate,
            gold_weights=self.gold_weights,
        )
        enc = [encode_example(self.tok, e, self.fmt) for e in examples]
        enc = [e for e in enc if len(e[0]) <= self.max_len]
        batches = bucket(enc, self.tokens_per_batch, random.Random(self.seed * 7 + rnd))
        self._cache = (rnd, batches)
        return batches

    def batch(self, rnd: int, index: int) -> Batch:
        """Batch ``index`` of round ``rnd``."""
        return collate(self.round_batches(rnd)[index], self.tok.pad_token_id)


def induction_batch(vocab: int, eos: int, tokens: int, gen: torch.Generator) -> Batch:
    """Rows ``noise, span, noise, span, EOS`` of random tokens: only the repeat carries the loss.

    Pure copying, in spans as long as the passages a RAG answer quotes from: it keeps the
    induction circuit (training/induction_init.py) exercised beside the RAG batches.
    Tokens are drawn from ids 256 .. vocab (not the single bytes), never EOS.
    """
    lo, hi = INDUCTION_LEN
    n = int(torch.randint(lo, hi + 1, (1,), generator=gen))
    pad = int(torch.randint(0, 16, (1,), generator=gen))
    width = 2 * (n + pad) + 1
    rows = max(1, tokens // width)
    span = torch.randint(256, vocab, (rows, n), generator=gen)
    noise = torch.randint(256, vocab, (rows, 2 * pad), generator=gen)
    ids = torch.cat([noise[:, :pad], span, noise[:, pad:], span, torch.full((rows, 1), eos)], dim=1)
    ids[ids == eos] = eos + 1 if eos + 1 < vocab else eos - 1
    ids[:, -1] = eos
    real = torch.zeros_like(ids, dtype=torch.bool)
    real[:, :-1] = True
    ans = torch.zeros_like(real)
    # Position t predicts t+1; the repeat starts at 2*pad+n, its first token is unpredictable.
    ans[:, 2 * pad + n : -1] = True
    return Batch(ids, real, ans)
