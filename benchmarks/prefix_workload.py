"""The prefix benchmark's workload: RAG traffic over the demo corpus, and the two engines it is sent to.

Traffic. Production-like RAG traffic over the demo corpus: Zipf-popular documents, repeated questions.

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

Engines. ``TorchRunner`` drives the torch engine's online loop (``EngineLoop``); ``VLLMRunner`` drives
vLLM's ``AsyncLLM`` (CPU build, float32, eager, the same draft model and k, prefix caching on)
on an asyncio loop of its own. Both time a request the same way, on this process's clock: from
``submit`` to the first verified token (TTFT) and to the last one.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.support import warm_up_torch_engine

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


@dataclass
class Outcome:
    """One request's timings (perf_counter seconds) and answer."""

    submitted: float
    first: float | None = None
    done: float | None = None
    tokens: list[int] = field(default_factory=list)
    cached: int = 0
    """Prompt tokens the engine reused from its prefix cache."""

    @property
    def ttft(self) -> float:
        assert self.first is not None
        return self.first - self.submitted


class TorchRunner:
    """The torch engine's ``EngineLoop`` with ``max_batch`` slots."""

    name = "torch"

    def __init__(
        self, target: str, draft: str, k: int, max_batch: int, prefix_mb: float = 0.0
    ) -> None:
        from generation import SamplingParams, SpeculativeEngine
        from generation.config import EngineConfig

        config = EngineConfig(max_batch_size=max_batch, prefix_cache_mb=prefix_mb)
        self.engine = SpeculativeEngine.from_pretrained(target, draft, device="cpu", config=config)
        self.warmup_s = warm_up_torch_engine(self.engine, max_batch)  # as the worker's start
        self.loop = self.engine.start_loop(max_batch)
        self._params = lambda n: SamplingParams(
            max_new_tokens=n, method="draft_model", num_speculative_tokens=k
        )

    def submit(self, prompt: list[int], max_tokens: int) -> Future[Outcome]:
        out = Outcome(time.perf_counter())
        fut: Future[Outcome] = Future()

        def on_delta(ids: list[int]) -> None:
            if out.first is None:
                out.first = time.perf_counter()

        handle = self.loop.submit(prompt, self._params(max_tokens), on_delta)

        def wait() -> None:
            try:
                result = handle.result()
            except BaseException as exc:  # handed to the caller
                fut.set_exception(exc)
                return
            out.done = time.perf_counter()
            out.tokens = list(result.token_ids)
            out.cached = int(getattr(result.stats, "num_cached_prompt_tokens", 0) or 0)
            fut.set_result(out)

        threading.Thread(target=wait, daemon=True).start()
        return fut

    def reset_cache(self) -> None:
        self.engine.reset_prefix_cache()

    def close(self) -> None:
        self.loop.close()


class VLLMRunner:
    """vLLM's ``AsyncLLM`` on the CPU build, as the docstring of this module says."""

    name = "vllm"

    def __init__(self, target: str, draft: str, k: int, max_batch: int) -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self._aio = asyncio.new_event_loop()
        threading.Thread(target=self._aio.run_forever, daemon=True).start()
        args = AsyncEngineArgs(
            model=target,
            dtype="float32",
            enforce_eager=True,
            enable_prefix_caching=True,
            max_model_len=2048,
            max_num_seqs=max_batch,
            seed=0,
            speculative_config={
                "method": "draft_model",
                "model": draft,
                "num_speculative_tokens": k,
                "draft_tensor_parallel_size": 1,
            },
        )

        async def build() -> Any:
            return AsyncLLM.from_engine_args(args)

        self.llm = asyncio.run_coroutine_threadsafe(build(), self._aio).result()

    def submit(self, prompt: list[int], max_tokens: int) -> Future[Outcome]:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        out = Outcome(time.perf_counter())
        params = SamplingParams(
            max_tokens=max_tokens, temperature=0.0, output_kind=RequestOutputKind.CUMULATIVE
        )

        async def run() -> Outcome:
            final = None
            gen = self.llm.generate({"prompt_token_ids": prompt}, params, uuid.uuid4().hex)
            async for final in gen:
                if out.first is None and final.outputs and final.outputs[0].token_ids:
                    out.first = time.perf_counter()
            out.done = time.perf_counter()
            assert final is not None
            out.tokens = [int(t) for t in final.outputs[0].token_ids]
            out.cached = int(final.num_cached_tokens or 0)
            return out

        return asyncio.run_coroutine_threadsafe(run(), self._aio)  # type: ignore[return-value]

    def reset_cache(self) -> None:
        asyncio.run_coroutine_threadsafe(self.llm.reset_prefix_cache(), self._aio).result()

    def close(self) -> None:
        self.llm.shutdown()
        self._aio.call_soon_threadsafe(self._aio.stop)


def target_alone(target: str, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Greedy answers of the target alone: an engine without a draft or a prefix cache."""
    from generation import SamplingParams, SpeculativeEngine

    engine = SpeculativeEngine.from_pretrained(target, None, device="cpu")
    params = SamplingParams(max_new_tokens=max_tokens, method="none")
    return [list(r.token_ids) for r in engine.generate_many(prompts, params)]
