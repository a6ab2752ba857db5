"""A worker's suffix memory kept equal to the stored answers of every scope, on every host.

``SharedSuffixMemory`` owns the process's ``SuffixMemory`` (the engine drafts from it) and keeps
it to the most recent ``suffix_max_answers`` qualifying answers of each scope (app/suffix/store.py):

- at start it is filled from the database, so a restart forgets nothing;
- an answer this worker records is learnt at once and announced (app/suffix/feed.py);
- an answer another worker records is heard on the Redis stream and learnt within a second;
- every ``suffix_sync_seconds`` (and when a ``sync`` event asks) it is compared with the
  database: answers deleted (tenant data deletion, retention) or whose question was scrubbed
  leave the trees, answers it missed join them.

Stored ids that are not a list of ints within the target's vocabulary (a corrupt row, another
tokenizer's) are refused by the trees, logged once and never read again: never proposed.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterable
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

import app.suffix.store as store
from app.requests import Method, served_methods
from app.settings import Settings
from app.suffix.feed import Feed

log = logging.getLogger(__name__)

FEED_RETRY_SECONDS = 2.0
"""Wait before reading the stream again after a Redis error (the sync keeps the trees right)."""


class SharedSuffixMemory:
    """Fills, feeds and prunes one ``SuffixMemory`` (the engine's) from the stored answers."""

    def __init__(
        self,
        memory: Any,
        session_factory: sessionmaker[Session],
        *,
        max_answers: int,
        sync_seconds: float,
        feed_url: str | None,
        prompt_tokens: int = 0,
    ) -> None:
        self.memory = memory
        self._sf = session_factory
        self._max = max_answers
        self._sync_seconds = sync_seconds
        self._prompt_tokens = prompt_tokens
        """Last prompt tokens held before each answer (``StoredAnswer.held_tokens``)."""
        self._feed = Feed(feed_url) if feed_url else None
        self._started = False
        self._lock = threading.Lock()
        self._held: dict[str, dict[uuid.UUID, tuple[int, int]]] = {}
        """scope -> query id -> (row id, the add's sequence number)."""
        self._scope_of: dict[uuid.UUID, str] = {}
        self._refused: set[uuid.UUID] = set()
        self._seq = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def for_settings(
        cls, settings: Settings, session_factory: sessionmaker[Session]
    ) -> SharedSuffixMemory | None:
        """A new, empty shared memory for this process's engine (None: ``suffix`` is not served
        here, or the engine is vLLM, whose suffix requests draft from their own prompt and
        output only: its one tree per process would mix tenants); ValueError naming the fix
        when the suffix tree library is missing."""
        if Method.SUFFIX not in served_methods(settings) or settings.engine != "torch":
            return None
        from generation.spec_decode.suffix import SuffixMemory  # heavy: generation loads torch

        try:
            memory = SuffixMemory(max_answers_per_scope=settings.suffix_max_answers)
        except ImportError as exc:
            raise ValueError(f"SPECRAG_SUFFIX: {exc}; or set SPECRAG_SUFFIX=0") from None
        return cls(
            memory,
            session_factory,
            max_answers=settings.suffix_max_answers,
            sync_seconds=settings.suffix_sync_seconds,
            feed_url=settings.resolved_stream_url,
            prompt_tokens=settings.suffix_prompt_tokens,
        )

    def fill(self) -> None:
        """Fill the trees from the database once (a one-shot process: ``specrag ask --local``)."""
        self._started = True
        self.sync()

    def start(self) -> SharedSuffixMemory:
        """Fill the trees from the database and listen for answers and syncs from now on."""
        position = self._feed_position()  # before the fill: nothing stored after it is missed
        self.fill()
        log.info(
            "suffix memory: %d answers in %d scopes (%d bytes)",
            len(self._scope_of),
            len(self._held),
            self.memory.memory_bytes(),
        )
        self._thread = threading.Thread(
            target=self._run, args=(position,), name="suffix-memory", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening (the trees stay as they are)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._feed is not None:
            self._feed.close()

    def recorded(self, query_id: uuid.UUID) -> None:
        """This worker stored ``query_id``'s answer: learn it and tell the other workers."""
        self.learn([query_id])
        if self._feed is not None:
            try:
                self._feed.announce_answer(query_id)
            except Exception:  # the others' periodic sync learns it instead
                log.warning("suffix memory: could not announce query %s", query_id, exc_info=True)

    def learn(self, query_ids: Iterable[uuid.UUID]) -> int:
        """Add the qualifying stored answers among ``query_ids``; how many were added."""
        wanted = [q for q in query_ids if q not in self._scope_of and q not in self._refused]
        if not wanted or not self._started:
            return 0
        with self._sf() as session:
            found = store.answers(session, wanted)
        with self._lock:
            return sum(self._add(answer) for answer in found)

    def sync(self) -> None:
        """Make the trees hold exactly the database's most recent qualifying answers per scope."""
        with self._lock:
            started = self._seq  # answers added while the database is read are not stale
        with self._sf() as session:
            recent = store.recent_ids(session, self._max)
        wanted = {h.query_id for h in recent}
        with self._lock:
            for scope, held in list(self._held.items()):
                for qid, (_, seq) in list(held.items()):
                    if qid not in wanted and seq <= started:
                        self._remove(scope, qid)
            missing = [h.query_id for h in recent if h.query_id not in self._scope_of]
        self.learn(missing)

    def held(self, scope: str) -> set[uuid.UUID]:
        """The query ids whose answers the trees of ``scope`` hold."""
        with self._lock:
            return set(self._held.get(scope, ()))

    def _add(self, answer: store.StoredAnswer) -> bool:
        if answer.query_id in self._scope_of:
            return False  # heard twice (its own announcement, a sync racing a learn)
        held = self._held.setdefault(answer.scope, {})
        if len(held) >= self._max:
            oldest = min(held, key=lambda q: held[q][0])
            if held[oldest][0] > answer.row_id:
                return False  # older than every answer the scope keeps
            self._remove(answer.scope, oldest)
            held = self._held.setdefault(answer.scope, {})
        # The trees check the ids (a list of ints within the target's vocabulary) and log a
        # refusal; a refused answer is remembered so that no sync reads or logs it again.
        if not self.memory.add(
            answer.scope, str(answer.query_id), answer.held_tokens(self._prompt_tokens)
        ):
            self._refused.add(answer.query_id)
            if not held:
                self._held.pop(answer.scope, None)
            return False
        self._seq += 1
        held[answer.query_id] = (answer.row_id, self._seq)
        self._scope_of[answer.query_id] = answer.scope
        return True

    def _remove(self, scope: str, query_id: uuid.UUID) -> None:
        held = self._held.get(scope, {})
        held.pop(query_id, None)
        self._scope_of.pop(query_id, None)
        if held:
            self.memory.remove(scope, str(query_id))
        else:
            self._held.pop(scope, None)
            self.memory.drop_scope(scope)

    def _feed_position(self) -> str | None:
        if self._feed is None:
            return None
        try:
            return self._feed.position()
        except Exception:
            log.warning("suffix memory: Redis unreachable; the periodic sync feeds the trees")
            return "$"

    def _run(self, position: str | None) -> None:
        next_sync = time.monotonic() + self._sync_seconds
        while not self._stop.is_set():
            wait = max(0.0, next_sync - time.monotonic())
            sync = False
            try:
                if self._feed is None or position is None:
                    self._stop.wait(wait)
                else:
                    position, events = self._feed.read(position, int(min(wait, 1.0) * 1000) or 1)
                    sync = any(e.get("op") == "sync" for e in events)
                    self.learn(_query_ids(events))
            except Exception:
                log.warning("suffix memory: reading the event stream failed", exc_info=True)
                self._stop.wait(FEED_RETRY_SECONDS)
            if sync or time.monotonic() >= next_sync:
                try:
                    self.sync()
                except Exception:
                    log.warning("suffix memory: sync with the database failed", exc_info=True)
                next_sync = time.monotonic() + self._sync_seconds


def _query_ids(events: list[dict[str, str]]) -> list[uuid.UUID]:
    """The query ids of the ``answer`` events (a malformed one is logged and skipped)."""
    out = []
    for event in events:
        if event.get("op") != "answer":
            continue
        try:
            out.append(uuid.UUID(event.get("query_id", "")))
        except ValueError:
            log.warning("suffix memory: an answer event without a query id: %r", event)
    return out
