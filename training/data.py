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
LOOP_START = 6  # answer tokens before a loop-stop row's loop may start ("According to [n], \"")
LOOP_CYCLE = (4, 24)  # loop-stop rows: length range of the repeated span, in tokens
AMBIGUITY_N = (3, 6)  # n-gram lengths ambiguity_positions looks back over
REPEAT_N = 4  # answer_repeats: an answer holding some REPEAT_N tokens twice


@dataclass(frozen=True)
class Marks:
    """How one row's labels count beyond prompt/answer: position ``p``'s label predicts token
    ``p+1``; the labels of positions ``masked[0] .. masked[1]-1`` carry no loss, and
    ``weights`` gives some answer labels a weight other than 1."""

    masked: tuple[int, int] = (0, 0)
    weights: tuple[tuple[int, float], ...] = ()


Row = tuple[list[int], int] | tuple[list[int], int, Marks]
"""An encoded row: ``(ids, prompt length)``, optionally with its Marks."""


@dataclass
class Batch:
    """Right-padded token rows; ``is_answer``/``is_real`` mark which labels count and how."""

    input_ids: torch.Tensor  # [batch, seq]
    is_real: torch.Tensor  # [batch, seq] bool: position predicts a real next token
    is_answer: torch.Tensor  # [batch, seq] bool: that next token belongs to the answer
    # [batch, seq] float or None: a label's weight within the answer share (default 1 each)
    weight: torch.Tensor | None = None


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


def loop_stop_row(
    ids: list[int],
    n_prompt: int,
    rng: random.Random,
    close: list[int],
    stop_weight: float,
    exit: str = "close",
) -> tuple[list[int], int, Marks] | None:
    """The example's answer caught in a repetition loop, and its way out of it.

    ``ids`` is prompt + answer + EOS (encode_example).  The answer is cut after token ``j`` and
    the span of its last ``c`` tokens (LOOP_CYCLE) is repeated -- what a greedy copier does once
    its induction heads latch onto its own output instead of the passage (the shipped pair's
    looping answers).  The repeated tokens' labels carry no loss (``masked``: the
    text is wrong); the correct prefix and the way out carry it, the way out's first token
    ``stop_weight`` times.  The way out:

    - ``"close"``: 3 .. 2c repeated tokens, then ``close`` (the closing quote) and EOS;
    - ``"resume"``: the span repeated once or twice whole, then the answer's own rest
      ``answer[j:]`` and EOS.  At that point the span's two earlier occurrences disagree on
      what follows -- the passage's says ``answer[j]``, the answer's own says the span again --
      and the label sides with the passage: the skill whose absence makes the loop.

    None when the answer is too short to loop.
    """
    answer = ids[n_prompt:-1]
    lo_c, hi_c = LOOP_CYCLE
    if len(answer) < LOOP_START + lo_c + 2:
        return None
    j = rng.randint(LOOP_START + lo_c, len(answer) - 1)
    c = rng.randint(lo_c, min(hi_c, j - LOOP_START))
    cycle = answer[j - c : j]
    if exit == "resume":
        n_rep = c * rng.choice((1, 2))
        rest = answer[j:]
    else:
        n_rep = rng.randint(3, 2 * c)
        rest = close
    loop = [cycle[t % c] for t in range(n_rep)]
    seq = ids[:n_prompt] + answer[:j] + loop + rest + [ids[-1]]
    start = n_prompt + j  # first injected token; the position before it predicts it
    hi = start - 1 + n_rep
    if exit == "resume":
        way_out: tuple[tuple[int, float], ...] = ((hi, stop_weight),)
    else:
        way_out = tuple((p, stop_weight) for p in range(hi, len(seq) - 1))
    return seq, n_prompt, Marks(masked=(start - 1, hi), weights=way_out)


def citation_marks(
    tok: PreTrainedTokenizerFast, ids: list[int], n_prompt: int, weight: float
) -> Marks | None:
    """Marks weighing the label of the answer's first citation number (the ``2`` of ``[2]``)
    ``weight`` times: the one token that says which passage holds the answer.  None if the
    answer cites nothing."""
    for p in range(n_prompt, len(ids) - 1):
        here, after = str(tok.decode([ids[p]])).strip(), str(tok.decode([ids[p + 1]])).strip()
        if here == "[" and after.isdigit():
            return Marks(weights=((p, weight),))  # position p predicts the number at p + 1
    return None


def ambiguity_positions(
    ids: Sequence[int], n_prompt: int, n_range: tuple[int, int] = AMBIGUITY_N
) -> list[int]:
    """Answer positions where copying alone cannot tell which occurrence to continue from.

    Position ``p`` (its label is ``ids[p+1]``, an answer token) is ambiguous when, for some
    ``n`` in ``n_range``, the ``n`` tokens ending at ``p`` also end at an earlier position
    ``q < p`` of the context (prompt + answer so far) whose next token ``ids[q+1]`` differs
    from ``ids[p+1]``: an induction head matching the last ``n`` tokens may continue from the
    wrong occurrence -- a line a code example repeats, or the answer's own earlier text.  The
    demo pair's loops start at exactly such positions.  Sorted, each once.
    """
    lo, hi = n_range
    out: set[int] = set()
    for n in range(lo, hi + 1):
        seen: dict[tuple[int, ...], set[int]] = {}  # n-gram -> the next tokens seen after it
        for p in range(n - 1, len(ids) - 1):
            gram, nxt = tuple(ids[p - n + 1 : p + 1]), ids[p + 1]
            after = seen.setdefault(gram, set())
            if p >= n_prompt - 1 and after - {nxt}:
                out.add(p)
            after.add(nxt)
    return sorted(out)


def answer_repeats(ids: Sequence[int], n_prompt: int, n: int = REPEAT_N) -> bool:
    """Whether the answer (``ids[n_prompt:]``) holds some ``n`` tokens twice: a quote that
    passes a second occurrence of its own text (a code example's repeated line), where a
    copier that continues from the first occurrence starts a loop."""
    answer = ids[n_prompt:]
    seen: set[tuple[int, ...]] = set()
    for i in range(len(answer) - n + 1):
        gram = tuple(answer[i : i + n])
        if gram in seen:
            return True
        seen.add(gram)
    return False


def ambiguity_marks(
    positions: Sequence[int], weight: float, marks: Marks | None = None
) -> Marks | None:
    """``marks`` (or none) with the labels at ``positions`` (ambiguity_positions) weighted
    ``weight`` times, multiplied into a weight ``marks`` already gives them; positions ``marks``
    masks stay masked.  None when there is no such label and no marks."""
    have = dict(marks.weights) if marks is not None else {}
    masked = marks.masked if marks is not None else (0, 0)
    for p in positions:
        if not masked[0] <= p < masked[1]:
            have[p] = have.get(p, 1.0) * weight
    if not have and marks is None:
        return None
    return Marks(masked=masked, weights=tuple(sorted(have.items())))


def collate(rows: Sequence[Row], pad_id: int) -> Batch:
    """One right-padded batch; position t's label is token t+1, counted as the row's Marks say."""
    width = max(len(row[0]) for row in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    real = torch.zeros((len(rows), width), dtype=torch.bool)
    ans = torch.zeros((len(rows), width), dtype=torch.bool)
    weight = None
    for r, row in enumerate(rows):
        seq, n_prompt = row[0], int(row[1])
        ids[r, : len(seq)] = torch.tensor(seq)
        real[r, : len(seq) - 1] = True
        ans[r, n_prompt - 1 : len(seq) - 1] = True
        if len(row) == 3:
            marks: Marks = row[2]  # type: ignore[misc]
            lo, hi = marks.masked
            real[r, lo:hi] = False
            ans[r, lo:hi] = False
            for p, w in marks.weights:
                if weight is None:
                    weight = torch.ones((len(rows), width))
                weight[r, p] = w
    return Batch(ids, real, ans, weight)


def bucket(rows: Sequence[Row], tokens_per_batch: int, rng: random.Random) -> list[list[Row]]:
    """Rows (ids, prompt length) cut into batches of similar length, ~tokens_per_batch padded
    tokens each (a longer row alone), in ``rng``'s shuffled order."""
    batches: list[list[Row]] = []
    cur: list[Row] = []
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
        loop_stop_rate: float = 0.0,
        stop_weight: float = 1.0,
        cite_weight: float = 1.0,
        loop_exit: str = "close",
        ambiguity_weight: float = 1.0,
        ambiguity_n: tuple[int, int] = AMBIGUITY_N,
        ambiguity_repeat: int = 1,
        ambiguity_skip_end: bool = False,
    ) -> None:
        self.docs, self.tok, self.seed = docs, tok, seed
        self.ambiguity_weight, self.ambiguity_n = ambiguity_weight, ambiguity_n
        self.ambiguity_repeat, self.ambiguity_skip_end = ambiguity_repeat, ambiguity_skip_end
        self.loop_stop_rate, self.stop_weight = loop_stop_rate, stop_weight
        self.cite_weight, self.loop_exit = cite_weight, loop_exit
        self.gold_weights = tuple(gold_weights)
        self.fmt, self.no_answer_rate = fmt, no_answer_rate
        self.tokens_per_batch, self.examples_per_round, self.max_len = (
            tokens_per_batch,
            examples_per_round,
            max_len,
        )
        self.max_words, self.n_passages = max_words, n_passages
        self.tables = chunk_tables(docs, max_words)
        self._cache: tuple[int, list[list[Row]]] | None = None

    def round_batches(self, rnd: int) -> list[list[Row]]:
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
        enc: list[Row] = [encode_example(self.tok, e, self.fmt) for e in examples]
        if self.loop_stop_rate:
            # A share of the rows becomes loop-stop rows (loop_stop_row), from a stream of its own
            # so that the examples themselves stay those of a run without them.
            rng = random.Random(self.seed * 1_000_033 + rnd)
            close = encode_text(self.tok, '"')
            for n, (ids, n_prompt, *_) in enumerate(enc):
                if rng.random() < self.loop_stop_rate:
                    looped = loop_stop_row(
                        ids, n_prompt, rng, close, self.stop_weight, self.loop_exit
                    )
                    enc[n] = looped if looped is not None else enc[n]
        if self.cite_weight != 1.0:
            for n, row in enumerate(enc):
                if len(row) == 2:  # loop-stop rows keep their own marks
                    cite = citation_marks(self.tok, row[0], row[1], self.cite_weight)
                    enc[n] = (row[0], row[1], cite) if cite is not None else row
        if self.ambiguity_weight != 1.0 or self.ambiguity_repeat > 1:
            enc = self._ambiguity(enc)
        enc = [e for e in enc if len(e[0]) <= self.max_len]
        batches = bucket(enc, self.tokens_per_batch, random.Random(self.seed * 7 + rnd))
        self._cache = (rnd, batches)
        return batches

    def _ambiguity(self, enc: list[Row]) -> list[Row]:
        """Rows with their ambiguous answer labels weighted (ambiguity_marks), and each row
        whose answer repeats itself (answer_repeats) ``ambiguity_repeat`` times in all: the
        states where a copier must know which occurrence it is in, made heavier and more
        frequent.  With ``ambiguity_skip_end`` the labels that end the answer keep weight 1:
        where the quote stops is ambiguous too (the passage goes on), and weighing it teaches
        stopping in general."""
        out: list[Row] = []
        for row in enc:
            ids, n_prompt = row[0], int(row[1])
            old: Marks | None = row[2] if len(row) == 3 else None  # type: ignore[misc]
            marks = old
            if self.ambiguity_weight != 1.0:
                hits = ambiguity_positions(ids, n_prompt, self.ambiguity_n)
                if self.ambiguity_skip_end:  # not the answer's last token (its closing quote), EOS
                    hits = [p for p in hits if p < len(ids) - 3]
                marks = ambiguity_marks(hits, self.ambiguity_weight, old)
            new: Row = (ids, n_prompt, marks) if marks is not None else (ids, n_prompt)
            repeat = self.ambiguity_repeat > 1 and answer_repeats(ids, n_prompt)
            out.extend([new] * (self.ambiguity_repeat if repeat else 1))
        return out

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
