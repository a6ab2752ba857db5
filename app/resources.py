"""The heavy objects a worker process loads once: engine and tokenizer, embedder and retrieval.

Each is loaded on first use, so an ingest-only worker never loads the language models and the API
never loads anything here. A worker warms what its queues need at start (see workers/).
"""

from __future__ import annotations

import inspect
import logging
import threading
from typing import TYPE_CHECKING, Any, Protocol, cast

from sqlalchemy.orm import Session, sessionmaker

from app.db import Tenant
from app.serving import check_concurrency, worker_concurrency
from app.settings import Settings
from app.suffix import SharedSuffixMemory
from app.tracing import config as tracing_config

if TYPE_CHECKING:  # both import torch; they load with the models, not with this module
    from app.grounding.background import GroundingBacklog
    from generation import Engine
    from generation.config import EngineConfig
    from generation.interface import GenerationLoop
    from generation.spec_decode.cost_cache import StepCostCache
    from retrieval import RetrievalService
    from retrieval.chat import PromptFormat
    from retrieval.grounding import SupportScorer

log = logging.getLogger(__name__)


class Tokenizer(Protocol):
    """The part of a Hugging Face tokenizer the service uses: text to ids and back."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]:
        """The token ids of ``text``."""

    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str:
        """The text of ``token_ids``."""


class Resources:
    """Settings, a session factory, and lazily loaded engine, tokenizer and retrieval service."""

    def __init__(self, settings: Settings, session_factory: sessionmaker[Session]) -> None:
        self.settings = settings
        self.session_factory = session_factory
        self._lock = threading.Lock()
        self._engine: Engine | None = None
        self._tokenizer: Tokenizer | None = None
        self._prompt_format: PromptFormat | None = None
        self._retrieval: RetrievalService | None = None
        self._grounding_scorer: SupportScorer | None = None
        self._tenants: dict[int, str] = {}
        self._loop: GenerationLoop | None = None
        self._loop_lock = threading.Lock()
        self.shared_suffix_memory: SharedSuffixMemory | None = None
        """The engine's suffix trees over the stored answers (method suffix), once it loads."""
        self.grounding_backlog: GroundingBacklog | None = None
        """Where answers wait for grounding off the tasks' thread (a worker sets it: workers/
        runtime.py); None: grounding runs in the thread that recorded the answer."""

    @property
    def engine(self) -> Engine:
        """The generation engine (target and draft together), loaded on first use."""
        with self._lock:
            if self._engine is None:
                from generation import load_engine  # heavy: torch

                s = self.settings
                from generation.model.dtypes import resolve_dtype

                try:  # before any model loads: bf16 on a CPU without it fails at once
                    dtype = resolve_dtype(s.dtype, _engine_device(s))
                except ValueError as exc:
                    raise ValueError(f"SPECRAG_DTYPE: {exc}") from None
                if s.engine == "vllm":  # before any model loads: a typo fails at once
                    from generation.vllm_engine import VLLMEngine

                    VLLMEngine.check_options(s.vllm_options)
                log.info(
                    "loading %s engine (%s): target %s, draft %s",
                    s.engine,
                    dtype,
                    s.target_model,
                    s.draft_model,
                )
                shared = SharedSuffixMemory.for_settings(s, self.session_factory)
                self.shared_suffix_memory = shared
                self._engine = load_engine(
                    s.engine,
                    str(s.target_model),
                    str(s.draft_model) if s.draft_model else None,
                    s.device,
                    vllm_options(s) if s.engine == "vllm" else None,
                    config=engine_config(s),
                    dtype=dtype,
                    eagle_dir=str(s.eagle_model) if s.eagle_model else None,
                    suffix_memory=shared.memory if shared is not None else None,
                )
            return self._engine

    @property
    def loop(self) -> GenerationLoop:
        """The process's one engine loop (``GenerationLoop``), started on first use.

        Its batch holds ``worker_concurrency`` requests; an engine that cannot hold that many is
        refused here, with the reason, before any query is taken.
        """
        engine = self.engine
        with self._loop_lock:
            if self._loop is None:
                concurrency = worker_concurrency(self.settings)
                check_concurrency(engine, concurrency)
                start = getattr(engine, "start_loop", None)
                if not callable(start):
                    raise RuntimeError(
                        f"engine: {type(engine).__name__} has no online loop (start_loop); "
                        "a worker needs one to hold queries in flight"
                    )
                self._loop = cast(
                    "GenerationLoop", start(concurrency, prefill_chunk=self.settings.prefill_chunk)
                )
                log.info("engine loop started: %s queries in flight", concurrency)
            return self._loop

    def engine_dead(self) -> bool:
        """Whether this process's engine loop was started and has died (it can answer nothing)."""
        loop = self._loop
        return loop is not None and bool(getattr(loop, "dead", False))

    def close(self) -> None:
        """Stop the engine loop, if one was started (what it holds is cancelled), and the
        grounding thread (app/grounding/background.py: what is queued is grounded, for a while)."""
        with self._loop_lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            loop.close()
        backlog, self.grounding_backlog = self.grounding_backlog, None
        if backlog is not None:
            backlog.close(timeout=10.0)  # what is queued is grounded, for a while
        if self.shared_suffix_memory is not None:
            self.shared_suffix_memory.stop()

    @property
    def tokenizer(self) -> Tokenizer:
        """The target's tokenizer (prompt text to ids and back)."""
        with self._lock:
            if self._tokenizer is None:
                from generation import load_tokenizer  # heavy: transformers

                # A transformers tokenizer: its encode/decode take many more options.
                self._tokenizer = cast(Tokenizer, load_tokenizer(str(self.settings.target_model)))
            return self._tokenizer

    @property
    def prompt_format(self) -> PromptFormat:
        """How prompts are made for the target: its chat template (``chat``) or raw text.

        Decided and checked once: a template that fails on our messages, or a
        ``SPECRAG_SYSTEM_PROMPT`` over its token limit, raises ``PromptFormatError`` here.
        """
        tokenizer = self.tokenizer
        with self._lock:
            if self._prompt_format is None:
                from retrieval.chat import PromptFormat

                self._prompt_format = PromptFormat.for_tokenizer(
                    tokenizer, self.settings.system_prompt
                )
            return self._prompt_format

    @property
    def retrieval(self) -> RetrievalService:
        """The retrieval service with its embedder loaded."""
        return self._open_retrieval(warm_collections=0)

    def _open_retrieval(self, warm_collections: int) -> RetrievalService:
        with self._lock:
            if self._retrieval is None:
                from app.tenancy.collections import collection_limit  # heavy: retrieval
                from retrieval import Embedder, open_retrieval  # heavy: faiss, torch

                s = self.settings
                self._retrieval = open_retrieval(
                    self.session_factory,
                    s.index_dir,
                    lambda: Embedder(s.embedding_model, device="cpu"),
                    warm_collections=warm_collections,
                    max_held=s.held_indexes,
                    max_collections=collection_limit(self.session_factory, s),
                    chunk_tokens=s.chunk_tokens,
                    chunk_overlap=s.chunk_overlap,
                    max_file_bytes=s.max_file_bytes,
                    approx_index_threshold=s.approx_index_threshold,
                    max_query_chars=s.max_question_chars,
                    search_mode=s.search_mode,
                    all_terms_bonus=s.all_terms_bonus,
                    # The fused grounding scorer reads each chunk's vectors stored at ingest.
                    grounding_vectors=s.grounding and s.grounding_model is None,
                )
            return self._retrieval

    @property
    def grounding_scorer(self) -> SupportScorer:
        """The grounding scorer (docs/grounding.md), loaded on first use beside the embedder."""
        with self._lock:
            scorer = self._grounding_scorer
        if scorer is None:
            from app.grounding import load_scorer  # heavy: retrieval, sentence-transformers

            scorer = load_scorer(self.settings, self.retrieval.embedder)
            with self._lock:
                self._grounding_scorer = self._grounding_scorer or scorer
        return self._grounding_scorer or scorer

    def step_cost_cache(self) -> StepCostCache:
        """Where this engine's measured step-cost tables are kept between processes: one file
        per identity (checkpoint files, engine numerics and kernels, CPU, torch threads) under
        ``data_dir/step_costs`` (generation/spec_decode/cost_cache.py)."""
        from generation.spec_decode.cost_cache import (
            StepCostCache,
            files_identity,
            machine_identity,
        )

        s, engine = self.settings, self.engine
        cost_identity = getattr(engine, "cost_identity", None)
        models = [s.target_model, s.draft_model, s.eagle_model]
        identity = {
            "models": [None if m is None else files_identity(m) for m in models],
            "machine": machine_identity(),
            "engine": cost_identity() if callable(cost_identity) else type(engine).__name__,
        }
        return StepCostCache(s.data_dir / "step_costs", identity)

    def tenant_name(self, tenant_id: int) -> str:
        """The name of tenant ``tenant_id`` (cached: tenants are never renamed)."""
        name = self._tenants.get(tenant_id)
        if name is None:
            with self.session_factory() as session:
                tenant = session.get(Tenant, tenant_id)
                if tenant is None:
                    raise LookupError(f"tenant {tenant_id} does not exist")
                name = self._tenants[tenant_id] = tenant.name
        return name

    def warm(self, *, answer: bool = True, ingest: bool = True) -> None:
        """Load now what the given kinds of work need (so the first task does not pay for it).

        An answer worker first checks how it will make prompts (``prompt_format``: a chat
        template that fails on our messages refuses the worker here, naming the error) and logs
        which format it uses.
        """
        if answer:
            fmt = self.prompt_format
            log.info(
                "prompt format: %s (%s)",
                fmt.name,
                "the target tokenizer's chat template with the system prompt"
                if fmt.name == "chat"
                else "raw text: the target tokenizer has no chat template",
            )
        if answer or ingest:
            # An answer worker's recent indexes catch up while the embedding model loads; one
            # encode then warms the model's kernels.
            retrieval = self._open_retrieval(self.settings.warm_collections if answer else 0)
            retrieval.embedder.encode(["warm up"])
        if answer and self.settings.grounding:
            # A grounding checkpoint that cannot load refuses the worker here, naming it.
            log.info("grounding scorer: %s", self.grounding_scorer.name)
        if answer:
            from generation import SamplingParams  # heavy: torch

            # Refused before any warm-up measures batches of that size.
            check_concurrency(self.engine, worker_concurrency(self.settings))
            ids = fmt.encode("warm up", [])
            self.engine.generate(ids, SamplingParams(max_new_tokens=2))
            # The torch engine measures its adaptive-k costs once, here rather than in the
            # first "auto" request; other engines have nothing to measure.
            warmup = getattr(self.engine, "warmup", None)
            if callable(warmup):
                warmup(**_batch_warmup(warmup, self.settings))
            if self.shared_suffix_memory is not None:  # filled before any query drafts from it
                self.shared_suffix_memory.start()
            self.loop  # noqa: B018 - started (and its concurrency checked) before any query


def engine_config(settings: Settings) -> EngineConfig:
    """The engine config of this process: its batch, k_max, prefill chunk, prefix cache and
    kernels."""
    from generation.config import EngineConfig  # generation's package imports torch

    fields: dict[str, Any] = {
        "max_batch_size": worker_concurrency(settings),
        "max_speculative_tokens": settings.max_speculative_tokens,
        "suffix_max_speculative_tokens": settings.suffix_max_speculative_tokens,
    }
    if settings.prefill_chunk is not None:
        fields["prefill_chunk"] = settings.prefill_chunk
    if settings.prefix_cache_mb:
        fields["prefix_cache_mb"] = settings.prefix_cache_mb
    if settings.packed_weights is not None:
        fields["packed_weights"] = settings.packed_weights
    return EngineConfig(**fields)


def apply_torch_threads(settings: Settings) -> None:
    """Give torch ``settings.torch_threads`` intra-op threads (unset: torch's default, one per
    core); every process that generates (a worker, a one-shot ``ask --local``) calls this first."""
    if settings.torch_threads:
        import torch  # heavy; the engine loads it next anyway

        torch.set_num_threads(settings.torch_threads)


def _engine_device(settings: Settings) -> str:
    """The device an engine of ``settings`` runs on ("auto": CUDA where torch sees one)."""
    if settings.device != "auto":
        return settings.device
    import torch  # heavy; the engine loads it next anyway

    return "cuda" if torch.cuda.is_available() else "cpu"


def _batch_warmup(warmup: Any, settings: Settings) -> dict[str, Any]:
    """``batch_sizes`` for an engine warm-up that takes them: every batch size the loop can reach.

    The batched engine measures its step costs per batch-size bucket (powers of two) the first
    time a batch of that size runs; measured at start, no burst of queries waits on them.
    """
    if "batch_sizes" not in inspect.signature(warmup).parameters:
        return {}
    from generation.spec_decode.goodput import buckets_up_to  # generation's package imports torch

    return {"batch_sizes": buckets_up_to(worker_concurrency(settings))}


def vllm_options(settings: Settings) -> dict[str, Any]:
    """``SPECRAG_VLLM_OPTIONS``, plus vLLM's own OTLP export while this process traces.

    vLLM then writes one ``llm_request`` span per request, a child of the query's generation
    span (the loop passes the ``traceparent``); an ``otlp_traces_endpoint`` the operator set in
    ``llm_kwargs`` is kept.
    """
    found = tracing_config()
    if found is None:
        return dict(settings.vllm_options)
    llm_kwargs = {
        "otlp_traces_endpoint": found.endpoint,
        **settings.vllm_options.get("llm_kwargs", {}),
    }
    return {**settings.vllm_options, "llm_kwargs": llm_kwargs}
