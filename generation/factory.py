"""``load_engine``: the one place that picks an engine implementation by name."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from generation.config import EngineConfig
from generation.interface import Engine
from generation.model.dtypes import check_dtype_name, resolve_dtype

if TYPE_CHECKING:
    from generation.spec_decode.suffix import SuffixMemory

ENGINE_KINDS = ("torch", "vllm")


def load_engine(
    kind: str,
    target_dir: str | Path,
    draft_dir: str | Path | None = None,
    device: str = "auto",
    options: dict[str, Any] | None = None,
    *,
    config: EngineConfig | None = None,
    dtype: str | None = None,
    eagle_dir: str | Path | None = None,
    suffix_memory: SuffixMemory | None = None,
) -> Engine:
    """Return a loaded engine of ``kind`` ("torch" or "vllm"); vLLM is imported only when asked.

    ``options`` go to the vLLM engine's ``from_pretrained`` (tensor_parallel_size, method,
    num_speculative_tokens, gpu_memory_utilization, max_model_len, ...); the torch engine takes none.
    ``config``: the engine config (generation/config.py); the vLLM engine takes from it room
    for ``max_batch_size`` requests (``max_num_seqs``) unless ``options`` name one.
    ``dtype``: "float32", "bfloat16" or "auto" (None: the config's, else float32), for either
    engine (vLLM: its ``dtype`` engine argument, unless ``options``' llm_kwargs name one);
    refused by name when unknown, or bfloat16 on a CPU without native bf16.
    ``eagle_dir``: an EAGLE head for the target (generation/spec_decode/eagle.py), serving method
    ``eagle`` on the torch engine; on the vLLM engine when ``options`` say ``method="eagle"``
    (the head is then vLLM's speculator in place of the draft; docs/vllm.md).
    ``suffix_memory``: the scopes' past answers the torch engine's ``suffix`` requests draft
    from (generation/spec_decode/suffix.py; None: an empty one of its own). vLLM keeps a suffix
    cache of its own per process and takes none: passing one to it is refused.
    """
    options = options or {}
    if dtype is not None:
        check_dtype_name(dtype)
    if kind == "torch":
        if options:
            raise ValueError(f"engine options: the torch engine takes none, got {sorted(options)}")
        from generation.torch_engine import SpeculativeEngine  # heavy: torch

        return SpeculativeEngine.from_pretrained(
            target_dir, draft_dir, device=device, config=config, dtype=dtype,
            eagle_dir=eagle_dir, suffix_memory=suffix_memory,
        )  # fmt: skip
    if kind == "vllm":
        if suffix_memory is not None:
            raise ValueError(
                "suffix_memory: the vLLM engine keeps its own suffix cache per process (method "
                "'suffix' in options); the shared memory serves the torch engine"
            )
        try:
            from generation.vllm_engine import VLLMEngine  # type: ignore[import-not-found]
            from generation.vllm_engine.engine import DEFAULT_MAX_NUM_SEQS
        except ImportError as exc:
            raise RuntimeError(
                f"engine 'vllm' is not available here ({exc}); install the vllm extra on a GPU "
                "host, or `make vllm-venv` (vLLM's CPU build) on a CPU host"
            ) from exc
        if config is not None:  # room for the batch the config asks for, at least vLLM's default
            seqs = max(config.max_batch_size, DEFAULT_MAX_NUM_SEQS)
            options = {"max_num_seqs": seqs, **options}
        name = dtype or (config.dtype if config is not None else None)
        llm_kwargs = dict(options.get("llm_kwargs") or {})
        if name is not None and "dtype" not in llm_kwargs:
            llm_kwargs["dtype"] = resolve_dtype(name, _vllm_device(device))
            options = {**options, "llm_kwargs": llm_kwargs}
        if options.get("method") == "eagle":  # vLLM's speculator is the head, not a draft
            draft_dir = eagle_dir
        engine: Engine = VLLMEngine.from_pretrained(target_dir, draft_dir, device=device, **options)
        return engine
    raise ValueError(f"engine: unknown kind {kind!r}; expected one of {', '.join(ENGINE_KINDS)}")


def _vllm_device(device: str) -> str:
    """The device vLLM will run on, for ``auto`` dtypes: CUDA where torch sees one."""
    if device != "auto":
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"
