"""Real vLLM engines shared by a test session: started once per (checkpoints, method, k).

vLLM fixes the proposer and k when it starts, and a start costs 20-40 s on this 2-core machine
(a spawned process importing vLLM and torch), so tests never start their own: they ask
``EnginePool.get`` for the engine of the speculation they need. At most ``keep`` engines are
alive (each holds a process and its KV cache); the least recently used one is closed first.
tests/vllm/conftest.py orders the tests so each engine starts once.

The pool's engines run their model worker inside the engine-core process (vLLM's ``uni``
executor), where a deployment's engine spawns one more process for it (the ``mp`` executor,
which vLLM's CPU platform picks). The worker's answers do not depend on which process runs it;
the executor choice saves that process's ~15 s of imports per start. The tests that are about
the deployment's processes (test_worker.py, test_spawn.py) start engines the deployment's way.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any
from unittest import mock

from generation import SamplingParams
from generation.vllm_engine import VLLMEngine, checkpoint_limits

SMALL_KV = {"kv_cache_memory_bytes": 256 << 20}
"""vLLM engine arguments for the tests' small engines: a 256 MiB KV cache, not the default 2 GiB."""


def worker_in_engine_core() -> Any:
    """While an engine starts: vLLM's CPU platform keeps the ``uni`` executor (the model worker
    in the engine-core process) instead of switching to ``mp``. vLLM reads the variable when it
    builds the engine's config, in this process, before the engine core is spawned."""
    return mock.patch.dict(os.environ, {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})


def engine_key(params: SamplingParams) -> tuple[str, int | str]:
    """The speculation an engine must be started with to serve ``params``."""
    if params.method == "none":
        return ("none", 4)
    return (params.method, params.num_speculative_tokens)


class EnginePool:
    """Started ``VLLMEngine`` s by (target, draft, method, k, options), at most ``keep`` alive."""

    def __init__(self, keep: int = 2) -> None:
        self.keep = keep
        self.engines: OrderedDict[tuple[Any, ...], VLLMEngine] = OrderedDict()
        self.started: list[tuple[Any, ...]] = []
        """Every key an engine was started for, in order (a test checks none started twice)."""

    def get(
        self, target: Path, draft: Path | None, method: str, k: int | str, **options: Any
    ) -> VLLMEngine:
        key = (str(target), str(draft), method, k, json.dumps(options, sort_keys=True))
        engine = self.engines.get(key)
        if engine is not None:
            self.engines.move_to_end(key)
            return engine
        while len(self.engines) >= self.keep:
            _, oldest = self.engines.popitem(last=False)
            oldest.close()
        options.setdefault("llm_kwargs", dict(SMALL_KV))
        with worker_in_engine_core():
            engine = VLLMEngine.from_pretrained(
                target,
                draft if method in ("draft_model", "eagle") else None,
                device="cpu",
                method=method,
                num_speculative_tokens=k,
                **options,
            )
        backend = engine.llm.vllm_config.parallel_config.distributed_executor_backend
        if backend != "uni":
            engine.close()
            raise AssertionError(f"the pool's engine started the {backend!r} executor, not 'uni'")
        self.engines[key] = engine
        self.started.append(key)
        return engine

    def close(self) -> None:
        while self.engines:
            self.engines.popitem()[1].close()


class PerSpeculationEngine:
    """An ``Engine`` over the pool for the conformance suite, which varies method and k per
    request: each request goes to the real vLLM engine started for its speculation."""

    def __init__(self, pool: EnginePool, target: Path, draft: Path, max_model_len: int) -> None:
        self.pool, self.target, self.draft = pool, target, draft
        self.max_model_len = max_model_len
        vocab, context, eos = checkpoint_limits(target, draft)
        self.vocab_size, self.max_context = vocab, min(context, max_model_len)
        self.eos_token_id = eos[0] if eos else None
        self.model_pair = f"{target.name}+{draft.name}"

    def for_params(self, params: SamplingParams) -> VLLMEngine:
        method, k = engine_key(params)
        return self.pool.get(self.target, self.draft, method, k, max_model_len=self.max_model_len)

    def generate(self, prompt_token_ids: list[int], params: SamplingParams) -> Any:
        return self.for_params(params).generate(prompt_token_ids, params)

    def generate_many(self, prompts: Any, params: Any, *, max_batch_size: Any = None) -> Any:
        first = params if isinstance(params, SamplingParams) else params[0]
        return self.for_params(first).generate_many(prompts, params, max_batch_size=max_batch_size)

    def check_request(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self.for_params(params).check_request(prompt_token_ids, params)

    def start_loop(
        self, max_batch_size: int | None = None, *, prefill_chunk: int | None = None
    ) -> Any:
        return self.for_params(SamplingParams()).start_loop(
            max_batch_size, prefill_chunk=prefill_chunk
        )
