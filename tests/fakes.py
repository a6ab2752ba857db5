"""Fakes for fast unit tests of what surrounds the queue and the engine."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from app.requests import QueueName


def memory_session_factory() -> Any:
    """Sessions on a fresh in-memory SQLite database holding every table (no migrations run).

    One connection shared by all threads (StaticPool), so that the pipeline's heartbeat thread
    sees the same database. The migrations themselves are tested by tests/app/test_migrations.py.
    """
    from sqlalchemy import create_engine, event
    from sqlalchemy.pool import StaticPool

    import app.tables  # noqa: F401  (registers every table on the shared metadata)
    from app.db.models import Base
    from app.db.session import make_session_factory

    engine = create_engine(
        "sqlite://", poolclass=StaticPool, connect_args={"check_same_thread": False}
    )

    @event.listens_for(engine, "connect")
    def _foreign_keys(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.execute("PRAGMA foreign_keys=ON")

    Base.metadata.create_all(engine)
    return make_session_factory(engine)


@dataclass
class RecordingDispatcher:
    """An ``app.dispatch.Dispatcher`` that records every send instead of reaching a broker."""

    sent: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)
    waiting: bool = False
    depths: dict[str, int] = field(default_factory=dict)

    def send_query(self, query_id: uuid.UUID, queue: str = QueueName.ANSWER) -> None:
        """Record the query's send."""
        self.sent.append(("query", (query_id, str(queue))))

    def send_ingest(self, paths: list[str], collection: str, tenant: str) -> None:
        """Record the ingest."""
        self.sent.append(("ingest", (list(paths), collection, tenant)))

    def send_uploads(
        self, files: list[dict[str, str]], collection: str, tenant: str, max_chars: int = 0
    ) -> None:
        """Record the upload."""
        self.sent.append(("uploads", (files, collection, tenant, max_chars)))

    def send_delete(self, source: str, collection: str, tenant: str) -> None:
        """Record the deletion."""
        self.sent.append(("delete", (source, collection, tenant)))

    def dispatch_batch(self, batch_id: uuid.UUID, epoch: int, lanes: int) -> None:
        """Record the batch's dispatch."""
        self.sent.append(("batch", (batch_id, epoch, lanes)))

    def send_tune(self, job: dict[str, Any]) -> None:
        """Record the tune."""
        self.sent.append(("tune", (job,)))

    def answer_waiting(self) -> bool:
        """What the test set in ``waiting``."""
        return self.waiting

    def queue_depths(self, queues: Any) -> dict[str, int]:
        """What the test set in ``depths`` (0 for the other queues)."""
        return {queue: self.depths.get(queue, 0) for queue in queues}

    def of(self, kind: str) -> list[tuple[Any, ...]]:
        """The recorded sends of one kind, in order."""
        return [args for k, args in self.sent if k == kind]


class FakeTokenizer:
    """Word-level: each distinct word gets an id on first sight; decode joins words back."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.words: list[str] = []

    def encode(
        self, text: str, add_special_tokens: bool = False, split_special_tokens: bool = False
    ) -> list[int]:
        """One id per whitespace-separated word (it has no special tokens)."""
        out = []
        for word in text.split():
            if word not in self.ids:
                self.ids[word] = len(self.words)
                self.words.append(word)
            out.append(self.ids[word])
        return out

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """The words of ``ids``, space-separated."""
        return " ".join(self.words[i] for i in ids)


@dataclass
class FakeEngine:
    """An ``Engine`` that answers every prompt with its own first ``max_new_tokens`` tokens.

    It names every member of ``generation.interface.Engine`` (tests/test_fakes.py checks it against
    the protocol): requests are checked as a real engine checks them, ``generate_many`` answers
    in input order, and ``start_loop`` gives a ``FakeLoop`` that answers on the submitting thread.
    """

    max_context: int = 512
    model_pair: str = "fake-target+fake-draft"
    vocab_size: int = 1000
    eos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    calls: list[tuple[list[int], Any]] = field(default_factory=list)
    fail_with: BaseException | None = None

    def check_request(self, prompt_token_ids: list[int], params: Any) -> None:
        """ValueError naming the problem, by the checks every engine shares."""
        from generation.requests import check_prompt

        check_prompt(prompt_token_ids, params, self.vocab_size, self.max_context)

    def generate(self, prompt_token_ids: list[int], params: Any) -> Any:
        """The prompt's first tokens back, with stats as the torch engine reports them."""
        from generation import GenerationResult, GenerationStats

        self.check_request(prompt_token_ids, params)
        self.calls.append((list(prompt_token_ids), params))
        if self.fail_with is not None:
            raise self.fail_with
        tokens = list(prompt_token_ids[: params.max_new_tokens])
        stats = GenerationStats(
            method=params.method,
            num_speculative_tokens=params.num_speculative_tokens,
            num_output_tokens=len(tokens),
            num_target_forwards=len(tokens),
            ttft_ms=1.0,
            generation_ms=2.0,
        )
        return GenerationResult(token_ids=tokens, stats=stats)

    def generate_many(
        self, prompts: list[list[int]], params: Any, *, max_batch_size: int | None = None
    ) -> list[Any]:
        """One ``generate`` result per prompt, in input order (``params``: one or one per prompt).

        Every request is checked before any is answered; the first bad one raises ValueError
        naming its index.
        """
        per_prompt = params if isinstance(params, list) else [params] * len(prompts)
        if len(per_prompt) != len(prompts):
            raise ValueError(f"params: {len(per_prompt)} given for {len(prompts)} prompts")
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f"max_batch_size: must be >= 1, got {max_batch_size}")
        for index, (prompt, p) in enumerate(zip(prompts, per_prompt, strict=True)):
            try:
                self.check_request(prompt, p)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"prompts[{index}]: {exc}") from exc
        return [self.generate(prompt, p) for prompt, p in zip(prompts, per_prompt, strict=True)]

    def start_loop(
        self, max_batch_size: int | None = None, *, prefill_chunk: int | None = None
    ) -> FakeLoop:
        """A ``GenerationLoop`` over this engine (see ``FakeLoop``; no prefill to chunk)."""
        return FakeLoop(self)


class FakeLoop:
    """A ``GenerationLoop`` that answers each request at once, on the submitting thread.

    Its handles are the real engine loop's (``generation.handle.LoopHandle``): deltas one token
    at a time, then the result; a request the engine refuses fails its own handle.
    """

    def __init__(self, engine: FakeEngine) -> None:
        self.engine = engine
        self.closed = False
        self.background: list[bool] = []
        """Per submitted request, whether it came as background work (batch jobs)."""

    def submit(
        self,
        prompt_token_ids: list[int],
        params: Any,
        on_delta: Any = None,
        *,
        background: bool = False,
        trace_headers: Any = None,
    ) -> Any:
        """The request's handle, already finished (or failed); ``background`` is recorded."""
        from generation.handle import LoopHandle

        if self.closed:
            raise RuntimeError("the loop is closed")
        self.background.append(background)
        handle = LoopHandle(on_delta)
        try:
            result = self.engine.generate(prompt_token_ids, params)
        except BaseException as exc:  # the request's own error, as a real loop reports it
            handle.fail(exc)
            return handle
        for token in result.token_ids:
            handle.emit([token])
        handle.finish(result)
        return handle

    def close(self) -> None:
        """Refuse further requests (nothing is ever in flight)."""
        self.closed = True


@dataclass
class FakeRetrieval:
    """Retrieval over passages held in memory: every search returns them all, best first."""

    passages: list[str] = field(default_factory=lambda: ["Keys rotate every ninety days."])
    version: int | None = 1

    def search(self, question: str, *, collection: str, tenant: str, top_k: int) -> list[Any]:
        """The passages as hits of ``collection`` (an unknown one raises, as the real one does)."""
        from retrieval import SearchHit, UnknownCollectionError

        if collection == "missing":
            raise UnknownCollectionError(f"no collection {collection!r} for tenant {tenant!r}")
        return [
            SearchHit(
                document=f"doc{i}.md",
                chunk_id=i,
                score=1.0 - i / 10,
                text=text,
                title=f"Doc {i}",
                heading=None,
                position=i,
                index_version=self.version,
            )
            for i, text in enumerate(self.passages[:top_k])
        ]

    def index_version(self, *, collection: str, tenant: str) -> int | None:
        """The fixed version."""
        return self.version


class FakeResources:
    """What the pipeline needs of a worker process, on fakes and a real (SQLite) database."""

    def __init__(self, settings: Any, session_factory: Any) -> None:
        self.settings = settings
        self.session_factory = session_factory
        self.engine = FakeEngine()
        self.tokenizer = FakeTokenizer()
        self.retrieval = FakeRetrieval()
        from retrieval.chat import PromptFormat

        self.prompt_format = PromptFormat.for_tokenizer(self.tokenizer)  # raw: no template
        self.dead = False
        """Set to make ``engine_dead`` report a dead engine loop."""

    def engine_dead(self) -> bool:
        """Whether the (fake) engine loop died."""
        return self.dead

    def tenant_name(self, tenant_id: int) -> str:
        """The tenant's name, read from the database."""
        from app.db import Tenant

        with self.session_factory() as session:
            tenant = session.get(Tenant, tenant_id)
            if tenant is None:
                raise LookupError(f"tenant {tenant_id} does not exist")
            return str(tenant.name)
