"""How many queries one worker process holds in flight, and whether its engine can hold them.

A worker process runs ONE engine loop (generation.base.GenerationLoop); Celery's threads pool
feeds it with ``SPECRAG_WORKER_CONCURRENCY`` task threads, each running claim → retrieve →
submit to the loop → wait → record. The default depends on the engine: the CPU demo pair gains
little past a handful of rows per target pass (each row is real arithmetic on two cores), a GPU
target pass costs about the same for one row or tens, and vLLM schedules hundreds.
"""

from __future__ import annotations

import os
from typing import Any

from app.settings import Settings

DEFAULT_CONCURRENCY = {"torch-cpu": 4, "torch-cuda": 16, "vllm": 32}
"""Queries in flight per worker process when ``SPECRAG_WORKER_CONCURRENCY`` is not set."""

KV_MEMORY_FRACTION = 0.8
"""Share of the device's free memory the loop's KV caches may take at full context."""


def _device_kind(settings: Settings) -> str:
    if settings.engine == "vllm":
        return "vllm"
    if settings.device == "cuda":
        return "torch-cuda"
    if settings.device == "auto":
        try:
            import torch  # heavy

            return "torch-cuda" if torch.cuda.is_available() else "torch-cpu"
        except ImportError:  # pragma: no cover - torch is a dependency
            return "torch-cpu"
    return "torch-cpu"


def worker_concurrency(settings: Settings) -> int:
    """Queries one worker process holds in flight: the setting, or the engine's default."""
    if settings.worker_concurrency is not None:
        return settings.worker_concurrency
    return DEFAULT_CONCURRENCY[_device_kind(settings)]


def kv_bytes_per_query(engine: Any) -> int:
    """Bytes of KV cache one query takes at the full context, target and draft together (0: unknown)."""
    total = 0
    models: list[Any] = [getattr(engine, "target", None), getattr(engine, "draft", None)]
    for model in models:
        config = getattr(model, "config", None)
        if model is None or config is None:
            continue
        layers = int(getattr(config, "num_hidden_layers", 0) or 0)
        heads = int(getattr(config, "num_attention_heads", 0) or 0)
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        head_dim = getattr(config, "head_dim", None) or (
            int(getattr(config, "hidden_size", 0) or 0) // max(heads, 1)
        )
        try:
            element = next(model.parameters()).element_size()
        except (AttributeError, StopIteration, TypeError):
            element = 4
        total += 2 * layers * kv_heads * int(head_dim) * int(engine.max_context) * element
    return total


def free_memory_bytes(engine: Any) -> int | None:
    """Free memory on the engine's device (CUDA: the driver's figure; CPU: MemAvailable)."""
    device = getattr(engine, "device", None)
    if getattr(device, "type", None) == "cuda":
        import torch  # heavy

        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    pages = os.sysconf("SC_AVPHYS_PAGES") if hasattr(os, "sysconf") else None
    return int(pages) * int(os.sysconf("SC_PAGE_SIZE")) if pages else None


def check_concurrency(engine: Any, concurrency: int) -> None:
    """Raise ValueError saying why, when ``engine`` cannot hold ``concurrency`` queries at once.

    An engine that states its own limit (``max_concurrency``, or vLLM's ``max_num_seqs``) is
    held to it; otherwise every query must fit its KV cache at the full context in
    ``KV_MEMORY_FRACTION`` of the device's free memory, so a full loop never runs out mid-step.
    """
    name = "SPECRAG_WORKER_CONCURRENCY"
    if concurrency < 1:
        raise ValueError(f"{name}: must be >= 1, got {concurrency}")
    limit = getattr(engine, "max_concurrency", None) or getattr(engine, "max_num_seqs", None)
    if isinstance(limit, int) and concurrency > limit:
        raise ValueError(
            f"{name}: {concurrency} queries in flight, but the {type(engine).__name__} engine "
            f"holds at most {limit} at once"
        )
    per_query = kv_bytes_per_query(engine)
    free = free_memory_bytes(engine)
    if per_query and free is not None and concurrency * per_query > KV_MEMORY_FRACTION * free:
        mib = 1024 * 1024
        raise ValueError(
            f"{name}: {concurrency} queries x {per_query / mib:.0f} MiB of KV cache at the full "
            f"context ({engine.max_context} tokens) need {concurrency * per_query / mib:.0f} MiB, "
            f"more than {KV_MEMORY_FRACTION:.0%} of the {free / mib:.0f} MiB free on the device"
        )


def pool_concurrency(settings: Settings, option: int | None) -> tuple[Settings, int]:
    """Settings whose ``worker_concurrency`` is what one process holds, and Celery's --concurrency.

    threads: one loop holding N queries, fed by N task threads (N: ``option``, else the setting,
    else the engine's default); solo and prefork: one query per process (prefork forks
    ``option`` processes, each with its own engine).
    """
    if option is not None and option < 1:
        raise ValueError(f"--concurrency: must be >= 1, got {option}")
    if settings.worker_pool == "threads":
        held = option if option is not None else worker_concurrency(settings)
        return settings.model_copy(update={"worker_concurrency": held}), held
    processes = option if option is not None and settings.worker_pool == "prefork" else 1
    return settings.model_copy(update={"worker_concurrency": 1}), processes
