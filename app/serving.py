"""How many queries one worker process holds in flight, and whether its engine can hold them.

A worker process runs ONE engine loop (generation.interface.GenerationLoop); Celery's threads pool
feeds it with ``SPECRAG_WORKER_CONCURRENCY`` task threads, each running claim → retrieve →
submit to the loop → wait → record. The default depends on the engine: the CPU demo pair gains
little past a handful of rows per target pass (each row is real arithmetic on two cores), a GPU
target pass costs about the same for one row or tens, and vLLM schedules hundreds.
"""

from __future__ import annotations

from typing import Any

from app.settings import Settings

DEFAULT_CONCURRENCY = {"torch-cpu": 4, "torch-cuda": 16, "vllm": 32}
"""Queries in flight per worker process when ``SPECRAG_WORKER_CONCURRENCY`` is not set."""


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


def check_concurrency(engine: Any, concurrency: int) -> None:
    """Raise ValueError saying why, when ``engine`` cannot hold ``concurrency`` queries at once.

    The engine states its own limit: ``max_concurrency`` (the torch engine's KV slots, decided
    from its memory at the full context) or vLLM's ``max_num_seqs``.
    """
    name = "SPECRAG_WORKER_CONCURRENCY"
    if concurrency < 1:
        raise ValueError(f"{name}: must be >= 1, got {concurrency}")
    limit = getattr(engine, "max_concurrency", None) or getattr(engine, "max_num_seqs", None)
    if isinstance(limit, int) and concurrency > limit:
        raise ValueError(
            f"{name}: {concurrency} queries in flight, but the {type(engine).__name__} engine "
            f"holds at most {limit} at once (its KV memory at the full context, or its "
            "configured batch)"
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
