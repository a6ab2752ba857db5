"""The vLLM engine's online loop: many requests in flight on one ``AsyncLLM``.

An ``AsyncLLM`` is bound to the asyncio event loop that first drives it (its output handler is
a task on that loop), so each engine owns exactly one ``EventLoopThread`` and every
``GenerationLoop`` of that engine, and the blocking ``generate``, submit to it. vLLM batches
whatever is in flight (continuous batching); this module only feeds it, streams each request's
verified tokens back, and turns ``cancel`` into ``AsyncLLM.abort(request_id)``.

Outputs are requested CUMULATIVE, not DELTA: when a consumer falls behind, vLLM merges queued
DELTA outputs with ``RequestOutput.add(aggregate=True)``, which (in the vLLM sources read, see
docs/vllm.md) keeps the earlier completion object and so can drop the final one's
``spec_decode_metrics``; a CUMULATIVE merge replaces the completion, keeping them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping
from contextlib import aclosing
from typing import Any, Protocol

from generation.handle import LoopHandle
from generation.interface import Cancelled, DeltaCallback, GenerationResult
from generation.params import SamplingParams

logger = logging.getLogger(__name__)
CLOSE_TIMEOUT = 30.0
"""Seconds ``VLLMLoop.close`` waits for its aborted requests to end."""


class LoopEngine(Protocol):
    """What a ``VLLMLoop`` needs of its engine (``VLLMEngine`` provides it)."""

    llm: Any
    """The started ``AsyncLLM``."""

    def check_request(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raise ValueError naming the problem when the engine cannot serve the request."""
        ...

    def vllm_sampling_params(self, prompt_token_ids: list[int], params: SamplingParams) -> Any:
        """vLLM's ``SamplingParams`` for one checked request."""
        ...

    def result_from_output(
        self,
        params: SamplingParams,
        final: Any,
        batch_sizes: list[int],
        wall: tuple[float, float | None],
    ) -> GenerationResult:
        """The result of one finished request from vLLM's final ``RequestOutput``."""
        ...


class EventLoopThread:
    """One daemon thread running an asyncio event loop; coroutines are submitted thread-safely."""

    def __init__(self, name: str = "vllm-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self.in_flight = 0
        """Requests handed to vLLM and not finished (read on the loop's thread only)."""
        self._background: set[asyncio.Task[Any]] = set()  # referenced until done (no GC)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        """Schedule ``coro`` on the loop; returns its future (thread-safe)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def spawn(self, coro: Coroutine[Any, Any, Any], what: str) -> None:
        """Run ``coro`` as a background task (call on the loop's thread); failures are logged."""
        task = self.loop.create_task(coro)
        self._background.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._background.discard(t)
            if not t.cancelled() and t.exception() is not None:
                logger.warning("%s failed: %r", what, t.exception())

        task.add_done_callback(done)

    def on_loop_thread(self) -> bool:
        """Whether the caller runs on the loop's own thread."""
        return threading.current_thread() is self._thread

    def call_soon(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` on the loop's thread (thread-safe); nothing once the loop is closed."""
        try:
            self.loop.call_soon_threadsafe(fn)
        except RuntimeError:  # closed: every request on it has already ended
            pass

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel what runs on the loop, stop it and join the thread."""
        if self.loop.is_closed():
            return

        async def _cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self._thread.is_alive():
            try:
                self.submit(_cancel_all()).result(timeout)
            except (concurrent.futures.TimeoutError, RuntimeError):
                pass  # a stuck task must not keep the process from stopping
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)
        if not self._thread.is_alive():
            self.loop.close()


class VLLMRequest(LoopHandle):
    """The ``LoopHandle`` of one request in flight in vLLM (generation/handle.py): ``cancel``
    aborts it in vLLM (``AsyncLLM.abort``), its slot freed at the next step."""

    def __init__(
        self,
        runner: EventLoopThread,
        request_id: str,
        on_delta: DeltaCallback | None,
        abort: Callable[[], Coroutine[Any, Any, None]],
    ) -> None:
        super().__init__(on_delta)
        self.request_id = request_id
        self._runner = runner
        self._abort = abort
        self._task: asyncio.Task[Any] | None = None
        self.registered = False
        """Whether the request was handed to vLLM (so ``abort`` can find it)."""
        self.trace_headers: dict[str, str] | None = None
        """W3C trace context (``traceparent``) vLLM's own request span is made a child of."""

    def cancel(self) -> None:
        """Abort the request in vLLM (``AsyncLLM.abort``); its slot is freed at the next step."""
        if not self.done:
            self._runner.call_soon(self._request_cancel)

    # -- called on the loop's thread ------------------------------------------------------
    def _request_cancel(self) -> None:
        if self.done or self.cancel_requested:
            return
        self.cancel_requested = True
        if self.registered:
            self._runner.spawn(self._abort(), f"abort of {self.request_id}")
        elif self._task is not None:
            self._task.cancel()  # still waiting for a slot here: vLLM never saw it


class VLLMLoop:
    """A ``GenerationLoop`` on the engine's ``AsyncLLM``: at most ``max_batch_size`` in flight.

    Requests beyond ``max_batch_size`` wait here (not inside vLLM), in submission order.
    ``close`` aborts this loop's requests; the event-loop thread belongs to the engine
    (``VLLMEngine.close`` stops it).
    """

    def __init__(self, engine: LoopEngine, runner: EventLoopThread, max_batch_size: int) -> None:
        self.engine = engine
        self.max_batch_size = max_batch_size
        self._runner = runner
        self._slots: asyncio.Semaphore | None = None  # made on the loop's thread
        self._live: set[VLLMRequest] = set()
        self._lock = threading.Lock()
        self._closed = False

    @property
    def closed(self) -> bool:
        """Whether ``close`` was called (new requests are refused)."""
        return self._closed

    @property
    def dead(self) -> bool:
        """Whether vLLM's engine core died (EngineCore process killed or crashed) under us."""
        if self._closed:
            return False
        llm = getattr(self.engine, "llm", None)
        return llm is not None and bool(getattr(llm, "errored", False))

    def submit(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        on_delta: DeltaCallback | None = None,
        *,
        background: bool = False,
        trace_headers: Mapping[str, str] | None = None,
    ) -> VLLMRequest:
        """Queue one request; it joins vLLM's running batch at the next step (thread-safe).

        ``background`` is accepted and not acted on: on a GPU a batch job's rows share the
        steps almost free, and a full worker still cancels them for waiting interactive
        queries (app/batch/preempt.py). ``trace_headers`` go to ``AsyncLLM.generate``: with
        ``otlp_traces_endpoint`` among the engine arguments, vLLM's ``llm_request`` span is a
        child of the caller's span (vLLM ignores them without one)."""
        request_id = f"specrag-{uuid.uuid4().hex}"
        llm = self.engine.llm
        handle = VLLMRequest(self._runner, request_id, on_delta, lambda: llm.abort(request_id))
        handle.trace_headers = dict(trace_headers) if trace_headers else None
        with self._lock:
            if self._closed:
                handle.finish(None, Cancelled("the generation loop is closed"))
                return handle
            self._live.add(handle)
        try:
            prompt = list(prompt_token_ids)
            self.engine.check_request(prompt, params)
            sampling = self.engine.vllm_sampling_params(prompt, params)
        except Exception as exc:  # the request's own error, never the loop's
            self._forget(handle)
            handle.finish(None, exc)
            return handle
        self._runner.submit(self._run(handle, prompt, params, sampling))
        return handle

    def close(self) -> None:
        """Abort what this loop has in flight and wait (up to CLOSE_TIMEOUT s) until it has ended.

        Later submits fail their handles. The event-loop thread is the engine's and keeps
        running (``VLLMEngine.close`` stops it).
        """
        with self._lock:
            self._closed = True
            live = list(self._live)
        for handle in live:
            handle.cancel()
        if self._runner.on_loop_thread():
            return  # called from a callback: waiting here would block the aborts
        deadline = time.monotonic() + CLOSE_TIMEOUT
        for handle in live:
            handle.wait(max(0.0, deadline - time.monotonic()))

    def _forget(self, handle: VLLMRequest) -> None:
        with self._lock:
            self._live.discard(handle)

    async def _run(
        self, handle: VLLMRequest, prompt: list[int], params: SamplingParams, sampling: Any
    ) -> None:
        handle._task = asyncio.current_task()
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_batch_size)
        runner = self._runner
        try:
            if handle.cancel_requested:  # cancelled before this task first ran
                raise Cancelled(f"request {handle.request_id}: cancelled before it started")
            async with self._slots:
                if handle.cancel_requested:
                    raise Cancelled(f"request {handle.request_id}: cancelled before it started")
                runner.in_flight += 1
                try:
                    final, batch_sizes, timing = await self._stream(
                        handle, prompt, sampling, params.cache_salt
                    )
                finally:
                    runner.in_flight -= 1
            if final.outputs[0].finish_reason == "abort":
                raise Cancelled(f"request {handle.request_id}: cancelled")
            result = self.engine.result_from_output(params, final, batch_sizes, timing)
        except asyncio.CancelledError:
            handle.finish(None, Cancelled(f"request {handle.request_id}: cancelled"))
            self._forget(handle)
            if not handle.cancel_requested:
                raise  # the event loop is stopping
            return
        except Exception as exc:  # the handle carries the request's own failure
            handle.finish(None, exc)
            self._forget(handle)
            return
        handle.finish(result, None)
        self._forget(handle)

    async def _stream(
        self, handle: VLLMRequest, prompt: list[int], sampling: Any, salt: str | None
    ) -> tuple[Any, list[int], tuple[float, float | None]]:
        """Drive one vLLM request; return its final output, batch sizes seen and wall timings."""
        llm, runner = self.engine.llm, self._runner
        sent, final, batch_sizes = 0, None, []
        started, first_at = time.perf_counter(), None
        handle.registered = True
        # aclosing: an error here closes the stream, and vLLM aborts it.
        inputs: dict[str, Any] = {"prompt_token_ids": prompt}
        if salt is not None:  # vLLM's own per-request salt of its prefix-cache hashes
            inputs["cache_salt"] = salt
        stream_of = llm.generate(
            inputs, sampling, handle.request_id, trace_headers=handle.trace_headers
        )
        async with aclosing(stream_of) as stream:
            async for output in stream:
                batch_sizes.append(runner.in_flight)
                token_ids = output.outputs[0].token_ids  # CUMULATIVE: every token so far
                if len(token_ids) > sent:
                    first_at = first_at or time.perf_counter()
                    handle.emit([int(t) for t in token_ids[sent:]])
                    sent = len(token_ids)
                if handle.cancel_requested and not output.finished:
                    # A cancel that came while vLLM was still adding the request found
                    # nothing to abort; abort now, at the request's first step boundary.
                    await llm.abort(handle.request_id)
                final = output
        if final is None:
            raise RuntimeError(f"request {handle.request_id}: vLLM returned no output")
        ttft = None if first_at is None else first_at - started
        return final, batch_sizes, (time.perf_counter() - started, ttft)
