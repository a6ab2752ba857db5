"""``VLLMEngine``: a started vLLM ``LLM`` behind the ``Engine`` protocol.

vLLM is imported only in ``VLLMEngine.from_pretrained``, after the checkpoints and the draft's
vocabulary are checked, so a bad request for a GPU worker fails fast and clearly on any host.
"""

from __future__ import annotations

import importlib
import json
import threading
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from generation.base import GenerationResult, check_prompt
from generation.loading import (
    CheckpointError,
    IncompatibleDraftError,
    has_tokenizer,
    load_tokenizer,
    validate_checkpoint,
)
from generation.params import SamplingParams
from generation.vllm_engine.mapping import (
    VLLM_PIN,
    SpecCounters,
    Speculation,
    UnsupportedSpeculationError,
    VLLMUnavailableError,
    build_stats,
    request_timings_ms,
    sampling_kwargs,
    speculative_config,
)


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def checkpoint_limits(target_dir: Path, draft_dir: Path | None) -> tuple[int, int, list[int]]:
    """Return (vocab_size, max_context, eos ids) read from the checkpoints' config files."""
    target = _read_json(target_dir / "config.json")
    contexts = [
        _read_json(d / "config.json").get("max_position_embeddings")
        for d in (target_dir, draft_dir)
        if d
    ]
    eos = _read_json(target_dir / "generation_config.json").get("eos_token_id")
    if eos is None:
        eos = target.get("eos_token_id")
    eos_ids = [int(e) for e in eos] if isinstance(eos, list) else [] if eos is None else [int(eos)]
    max_context = min((c for c in contexts if isinstance(c, int) and c > 0), default=1 << 30)
    if not isinstance(target.get("vocab_size"), int):
        raise CheckpointError(f"checkpoint {str(target_dir)!r}: config.json has no vocab_size")
    return target["vocab_size"], max_context, eos_ids


def check_draft_vocab(target_dir: Path, draft_dir: Path) -> None:
    """Raise ``IncompatibleDraftError`` unless the draft's vocabulary is the target's.

    Reads config files and tokenizers only: a 70B target is never loaded on the host to check.
    """
    sizes = [_read_json(d / "config.json").get("vocab_size") for d in (target_dir, draft_dir)]
    if sizes[0] != sizes[1]:
        raise IncompatibleDraftError(
            f"draft {str(draft_dir)!r} has vocabulary size {sizes[1]}, "
            f"target {str(target_dir)!r} has {sizes[0]}"
        )
    if not (has_tokenizer(target_dir) and has_tokenizer(draft_dir)):
        return
    target_vocab = load_tokenizer(target_dir).get_vocab()
    draft_vocab = load_tokenizer(draft_dir).get_vocab()
    differing = [
        t for t in set(target_vocab) | set(draft_vocab) if target_vocab.get(t) != draft_vocab.get(t)
    ]
    if differing:
        tok = sorted(differing)[0]
        raise IncompatibleDraftError(
            f"draft {str(draft_dir)!r} and target {str(target_dir)!r} map {len(differing)} tokens "
            f"to different ids (e.g. {tok!r}: target {target_vocab.get(tok)} vs draft "
            f"{draft_vocab.get(tok)})"
        )


def _cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _import_vllm() -> Any:
    try:
        vllm = importlib.import_module("vllm")
    except ImportError as exc:
        raise VLLMUnavailableError(
            f"vLLM is not installed ({exc}); install the project's `vllm` extra on a GPU host "
            f"(pip install '.[vllm]', vllm=={VLLM_PIN}) or use SPECRAG_ENGINE=torch"
        ) from exc
    version = getattr(vllm, "__version__", "unknown")
    if version != VLLM_PIN:
        warnings.warn(
            f"vllm {version} is installed; this engine reads vllm=={VLLM_PIN}'s output shapes",
            RuntimeWarning,
            stacklevel=3,
        )
    return vllm


class VLLMEngine:
    """A vLLM ``LLM`` holding the target (and draft), serving one started ``Speculation``."""

    def __init__(
        self,
        llm: Any,
        sampling_params_cls: Any,
        *,
        speculation: Speculation,
        vocab_size: int,
        max_context: int,
        eos_token_ids: list[int],
        model_pair: str,
        per_request_metrics: bool,
    ) -> None:
        self.llm = llm
        self.sampling_params_cls = sampling_params_cls
        self.speculation = speculation
        self.per_request_metrics = per_request_metrics
        """True: vLLM returns each request's spec-decode metrics; False: counter deltas."""
        self._vocab_size = vocab_size
        self._max_context = max_context
        self._eos = list(eos_token_ids)
        self._model_pair = model_pair
        # vllm.LLM is not thread-safe; one request at a time also keeps counter deltas exact.
        self._lock = threading.Lock()

    @classmethod
    def from_pretrained(
        cls,
        target_dir: str | Path,
        draft_dir: str | Path | None = None,
        device: str = "cuda",
        *,
        method: str | None = None,
        num_speculative_tokens: int | str = 4,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.90,
        max_model_len: int | None = None,
        auto_batch_schedule: Sequence[tuple[int, int, int]] | None = None,
        llm_kwargs: dict[str, Any] | None = None,
    ) -> VLLMEngine:
        """Return an engine with vLLM started on the checkpoints and speculation fixed.

        ``method`` defaults to ``draft_model`` with a draft, else ``ngram``. Checkpoints and
        the draft's vocabulary are checked before vLLM is imported or any GPU memory is taken.
        """
        if str(device) not in ("cuda", "auto"):
            raise ValueError(
                f"device: the vLLM engine runs on CUDA only (pick GPUs with "
                f"CUDA_VISIBLE_DEVICES); got {device!r}"
            )
        if method is None:
            method = "draft_model" if draft_dir is not None else "ngram"
        try:
            speculation = Speculation(method, num_speculative_tokens)
        except ValueError as exc:
            raise UnsupportedSpeculationError(str(exc)) from exc
        target = validate_checkpoint(target_dir)
        draft = validate_checkpoint(draft_dir) if draft_dir is not None else None
        if draft is not None:
            check_draft_vocab(target, draft)
        spec = speculative_config(speculation, draft, auto_batch_schedule)
        vocab_size, max_context, eos_ids = checkpoint_limits(target, draft)
        if max_model_len is not None:
            max_context = min(max_context, max_model_len)

        vllm = _import_vllm()
        gpus = _cuda_device_count()
        if gpus < tensor_parallel_size:
            raise VLLMUnavailableError(
                f"the vLLM engine needs {tensor_parallel_size} CUDA GPU(s) "
                f"(tensor_parallel_size); this host has {gpus}"
            )
        kwargs: dict[str, Any] = {
            "model": str(target),
            # Token ids in, token ids out: vLLM needs no tokenizer (the checkpoint may lack one).
            "skip_tokenizer_init": True,
            # vLLM's defaults, not generation_config.json's (its top_p would truncate sampling).
            "generation_config": "vllm",
            "tensor_parallel_size": tensor_parallel_size,
            "gpu_memory_utilization": gpu_memory_utilization,
            "speculative_config": spec,
            # Stats on: request timings and the spec-decode counters need them.
            "disable_log_stats": False,
        }
        if spec is not None:  # vLLM refuses per-request spec metrics without speculation
            kwargs["per_request_spec_decode_metrics"] = "detailed"
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        kwargs.update(llm_kwargs or {})
        try:
            llm = vllm.LLM(**kwargs)
            per_request = True
        except TypeError as exc:
            if "per_request_spec_decode_metrics" not in str(exc) or spec is None:
                raise
            # A vLLM without per-request metrics: fall back to aggregate counter deltas.
            kwargs.pop("per_request_spec_decode_metrics")
            llm, per_request = vllm.LLM(**kwargs), False
        pair = target.name if draft is None else f"{target.name}+{draft.name}"
        return cls(
            llm,
            vllm.SamplingParams,
            speculation=speculation,
            vocab_size=vocab_size,
            max_context=max_context,
            eos_token_ids=eos_ids,
            model_pair=pair,
            per_request_metrics=per_request and spec is not None,
        )

    @property
    def vocab_size(self) -> int:
        """Size of the target's vocabulary; valid token ids are ``range(vocab_size)``."""
        return self._vocab_size

    @property
    def max_context(self) -> int:
        """Longest sequence (prompt + new tokens) the engine accepts."""
        return self._max_context

    @property
    def eos_token_id(self) -> int | None:
        """The target's end-of-sequence token, if it has one."""
        return self._eos[0] if self._eos else None

    @property
    def model_pair(self) -> str:
        """A short label of the loaded target/draft pair."""
        return self._model_pair

    def check_request(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raise ValueError naming the problem when this engine cannot serve the request."""
        check_prompt(prompt_token_ids, params, self.vocab_size, self.max_context)
        if not self.speculation.serves(params):
            s = self.speculation
            raise UnsupportedSpeculationError(
                f"method: this vLLM engine was started with method={s.method!r}, "
                f"num_speculative_tokens={s.num_speculative_tokens!r} and vLLM cannot change "
                f"speculation per request; the request asked method={params.method!r}, "
                f"num_speculative_tokens={params.num_speculative_tokens!r}"
            )

    def generate(self, prompt_token_ids: list[int], params: SamplingParams) -> GenerationResult:
        """Generate up to ``params.max_new_tokens`` tokens after ``prompt_token_ids``."""
        prompt_token_ids = list(prompt_token_ids)
        self.check_request(prompt_token_ids, params)
        budget = min(params.max_new_tokens, self.max_context - len(prompt_token_ids))
        sampling = self.sampling_params_cls(**sampling_kwargs(params, self._eos, budget))
        counted = self.speculation.method != "none" and not self.per_request_metrics
        with self._lock:
            before = SpecCounters.from_metrics(self.llm.get_metrics()) if counted else None
            started = time.perf_counter()
            outputs = self.llm.generate(
                [{"prompt_token_ids": prompt_token_ids}], sampling, use_tqdm=False
            )
            wall_ms = (time.perf_counter() - started) * 1000.0
            after = SpecCounters.from_metrics(self.llm.get_metrics()) if counted else None
        request = outputs[0]
        completion = request.outputs[0]
        token_ids = [int(t) for t in completion.token_ids]
        if before is not None and after is not None:
            counters = after.minus(before)
        elif self.per_request_metrics and getattr(completion, "spec_decode_metrics", None):
            counters = SpecCounters.from_request(completion.spec_decode_metrics)
        else:
            counters = SpecCounters()
        ttft_ms, generation_ms = request_timings_ms(getattr(request, "metrics", None))
        stats = build_stats(params, len(token_ids), counters, ttft_ms, generation_ms or wall_ms)
        return GenerationResult(token_ids=token_ids, stats=stats)
