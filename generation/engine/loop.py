"""The engine's online loop: a thread that steps the running batch while requests come and go.

An ``EngineLoop`` (the ``GenerationLoop`` of generation/interface.py) owns a ``BatchEngine`` and one
thread, which sleeps while there is nothing to do; an unexpected error inside a step fails the
requests of that step and the loop goes on with the next ones. ``run_many`` steps a batch in the
caller's thread instead (``generate_many`` without a loop).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

import torch

from generation.engine.step import BatchEngine
from generation.handle import LoopHandle
from generation.interface import Cancelled, DeltaCallback, GenerationResult
from generation.params import SamplingParams
from generation.requests import collect

log = logging.getLogger(__name__)


class EngineLoop:
    """A ``GenerationLoop`` stepping one ``BatchEngine`` in its own thread.

    ``lock``: held by the loop's thread while it runs (the engine's KV store's lock)."""

    def __init__(self, batch: BatchEngine, lock: threading.Lock | None = None) -> None:
        self._batch = batch
        self._lock = lock or threading.Lock()
        self._wake = threading.Condition()
        self._inbox: list[tuple[list[int], SamplingParams, LoopHandle, bool]] = []
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    @property
    def max_batch_size(self) -> int:
        """Most requests in one step; the rest wait for a free slot."""
        return self._batch.scheduler.max_batch_size

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def dead(self) -> bool:
        """Whether the loop's thread ended without ``close``: nothing submitted will ever run."""
        return not self._closed and not self._thread.is_alive()

    def submit(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        on_delta: DeltaCallback | None = None,
        *,
        background: bool = False,
        trace_headers: Mapping[str, str] | None = None,
    ) -> LoopHandle:
        """Queue one request; it joins the batch at the next step (thread-safe, returns at once).

        ``trace_headers`` are accepted for the protocol's sake: this engine writes no spans of
        its own (the caller's generation span covers the request)."""
        handle = LoopHandle(on_delta)
        try:
            self._batch.core.check_request(prompt_token_ids, params)
        except (TypeError, ValueError) as exc:
            handle.fail(exc)
            return handle
        with self._wake:
            if self._closed:
                handle.fail(Cancelled("the engine loop is closed"))
                return handle
            self._inbox.append((list(prompt_token_ids), params, handle, background))
            self._wake.notify()
        return handle

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _run(self) -> None:
        # Slot moves and releases touch inference tensors, in steps and outside them.
        with self._lock, torch.inference_mode():
            self._serve()

    def _serve(self) -> None:
        batch = self._batch
        while True:
            with self._wake:
                while not self._inbox and not batch.scheduler.has_work and not self._closed:
                    self._wake.wait()
                if self._closed:
                    break
                arrived, self._inbox = self._inbox, []
            for prompt, params, handle, background in arrived:
                batch.add(prompt, params, handle, background)
            try:
                batch.step()
            except Exception as exc:  # a failing step must not end the loop for later requests
                log.exception("engine loop: a step failed; its requests fail with the error")
                batch.fail_all(exc)
        with self._wake:
            arrived, self._inbox = self._inbox, []
        for _, _, handle, _ in arrived:
            handle.fail(Cancelled("the engine loop was closed"))
        batch.fail_all(Cancelled("the engine loop was closed"))


def run_many(
    batch: BatchEngine, prompts: list[list[int]], params: list[SamplingParams]
) -> list[GenerationResult]:
    """Return each request's result in input order, stepping ``batch`` in this thread."""
    handles = [LoopHandle() for _ in prompts]
    for prompt, sampling, handle in zip(prompts, params, handles, strict=True):
        batch.add(prompt, sampling, handle)
    with torch.inference_mode():
        while batch.scheduler.has_work:
            batch.step()
    return collect(handles)
