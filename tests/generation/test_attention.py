"""generation/model/attention.py: the bf16 slot-attention kernel against float64 attention, where it
applies and where SDPA stays, and a bf16 engine that runs it (greedy speculation is the bf16
``none`` run but at near-ties, as tests/generation/test_dtype.py asks of SDPA)."""

from __future__ import annotations

import logging
import random
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from generation import SamplingParams, SpeculativeEngine
from generation.exactness import check_greedy
from generation.model import attention as attention_module
from generation.model.attention import library, slot_attention
from tests.generation.tiny_models import build_model, perturbed_copy

pytestmark = pytest.mark.models

needs_kernel = pytest.mark.skipif(
    library() is None,
    reason="the kernel cannot run here (no AVX-512 BF16, or not built at install)",
)
CPU = torch.device("cpu")


def _reference(q, keys, values, slots, starts, scale):  # type: ignore[no-untyped-def]
    """float64 attention of each row's query j over its slot's positions <= starts[b] + j."""
    batch, heads, n, dim = q.shape
    groups = heads // keys.shape[1]
    capacity = keys.shape[2]
    out = torch.empty(batch, n, heads, dim, dtype=torch.float64)
    for b, (slot, start) in enumerate(zip(slots, starts, strict=True)):
        k = keys[slot].double().repeat_interleave(groups, dim=0)  # [heads, capacity, dim]
        v = values[slot].double().repeat_interleave(groups, dim=0)
        for j in range(n):
            seen = min(start + j, capacity - 1) + 1
            w = torch.softmax(
                q[b, :, j].double()[:, None] @ k[:, :seen].transpose(1, 2) * scale, -1
            )
            out[b, j] = (w @ v[:, :seen])[:, 0]
    return out.reshape(batch * n, heads * dim)


@needs_kernel
@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "n", "slots", "starts"),
    [
        (6, 6, 64, 5, [0, 1, 2, 3], [700, 3, 250, 511]),  # the demo target's shape, a verification
        (6, 6, 64, 1, [4, 2, 7], [0, 96, 1000]),  # draft passes: one query
        (4, 2, 32, 9, [3, 0, 5], [17, 0, 63]),  # GQA, k = 8, slots out of order, a prompt start
        (4, 2, 32, 16, [1], [40]),  # a short prompt chunk, one row
        (2, 1, 64, 5, [6, 1], [1020, 1019]),  # positions past the slot's end clamp to its last
        (6, 6, 64, 300, [2], [0]),  # a prompt on an empty slot: 19 blocks of queries, causal
        (6, 6, 64, 37, [5], [500]),  # a prompt chunk after cached positions, a partial block
        (4, 2, 32, 40, [3, 0], [0, 100]),  # batched prompts (generate_many), GQA
    ],
)
def test_the_kernel_is_attention_to_bf16_rounding(
    heads, kv_heads, dim, n, slots, starts, monkeypatch
):  # type: ignore[no-untyped-def]
    # Prompt chunks are left to SDPA on an AMX CPU; the kernel is checked on them everywhere.
    monkeypatch.setattr(attention_module, "_cpu_has_amx", lambda: False)
    torch.manual_seed(len(slots) * 31 + n)
    capacity = 1024
    keys = torch.randn(8, kv_heads, capacity, dim).bfloat16()
    values = torch.randn(8, kv_heads, capacity, dim).bfloat16()
    q = (2 * torch.randn(len(slots), n, heads, dim)).bfloat16().transpose(1, 2)  # as forward's
    scale = dim**-0.5
    attend = slot_attention(torch.bfloat16, CPU, slots, starts, n, dim)
    assert attend is not None
    got = attend(q, keys, values, scale)
    assert got.dtype == torch.bfloat16 and got.shape == (len(slots) * n, heads * dim)
    want = _reference(q, keys, values, slots, starts, scale)
    # One bf16 rounding of the output (8 bits of mantissa) and float32 sums: within 2^-8
    # relative of the largest output, as SDPA's own bf16 result is.
    assert (got.double() - want).abs().max() <= 2**-8 * want.abs().max()
    # A wrong mask or slot is far off: the check can fail.
    wrong = _reference(q, keys, values, slots, [s + 1 for s in starts], scale)
    assert (got.double() - wrong).abs().max() > 2**-8 * want.abs().max()


@needs_kernel
def test_it_matches_sdpa_on_a_padded_batch() -> None:
    torch.manual_seed(3)
    keys = torch.randn(4, 6, 512, 64).bfloat16()
    values = torch.randn(4, 6, 512, 64).bfloat16()
    starts, n = [100, 300, 7], 5
    q = torch.randn(3, 6, n, 64).bfloat16()
    end = max(starts) + n
    pos = torch.tensor(starts)[:, None] + torch.arange(n)
    mask = torch.zeros(3, 1, n, end).masked_fill_(
        ~(torch.arange(end) <= pos[:, :, None])[:, None], float("-inf")
    )
    sdpa = (
        F.scaled_dot_product_attention(
            q, keys[:3, :, :end], values[:3, :, :end], attn_mask=mask.bfloat16()
        )
        .transpose(1, 2)
        .reshape(3 * n, -1)
    )
    attend = slot_attention(torch.bfloat16, CPU, [0, 1, 2], starts, n, 64)
    assert attend is not None
    got = attend(q, keys, values, 64**-0.5)
    assert (got.float() - sdpa.float()).abs().max() <= 2**-7 * sdpa.float().abs().max()


def test_where_it_does_not_apply_sdpa_stays(monkeypatch: pytest.MonkeyPatch) -> None:
    args = ([0, 1], [10, 20])
    assert slot_attention(torch.float32, CPU, *args, 5, 64) is None  # float32: SDPA
    assert slot_attention(torch.bfloat16, CPU, *args, 5, 48) is None  # head_dim
    # A prompt chunk: the kernel's on a CPU without AMX; on one with AMX torch's flash kernel
    # (tile units) keeps it.
    monkeypatch.setattr(attention_module, "_cpu_has_amx", lambda: False)
    if library() is not None:
        assert slot_attention(torch.bfloat16, CPU, *args, 17, 64) is not None
    monkeypatch.setattr(attention_module, "_cpu_has_amx", lambda: True)
    assert slot_attention(torch.bfloat16, CPU, *args, 17, 64) is None
    monkeypatch.undo()
    assert slot_attention(torch.bfloat16, torch.device("meta"), *args, 5, 64) is None
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert slot_attention(torch.bfloat16, CPU, *args, 5, 64) is None  # one thread only
    finally:
        torch.set_num_threads(previous)


def _fresh_load(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    # Forget the process's load so the next call loads from ``path`` on an AVX-512 BF16 CPU.
    monkeypatch.setattr(attention_module, "_tried", False)
    monkeypatch.setattr(attention_module, "_library", None)
    monkeypatch.setattr(attention_module, "_logged", set())
    monkeypatch.setattr(attention_module, "LIBRARY", path)
    monkeypatch.setattr(attention_module, "_cpu_has_avx512_bf16", lambda: True)


@pytest.mark.parametrize("state", ["absent", "corrupt", "no AVX-512 BF16"])
def test_a_kernel_that_cannot_load_falls_back_to_sdpa_and_says_so_once(
    state: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "_attention.so"
    if state == "corrupt":
        path.write_bytes(b"\x7fELF not a library")  # a cached file that fails to load
    _fresh_load(monkeypatch, path)
    if state == "no AVX-512 BF16":
        monkeypatch.setattr(attention_module, "_cpu_has_avx512_bf16", lambda: False)
    monkeypatch.setattr(attention_module, "_cpu_has_amx", lambda: False)
    with caplog.at_level(logging.INFO, logger=attention_module.__name__):
        for _ in range(3):
            assert slot_attention(torch.bfloat16, CPU, [0, 1], [10, 20], 5, 64) is None
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines  # once per process, not once per pass
    reason = {"absent": "not built at install", "corrupt": "cannot be loaded"}.get(
        state, "lacks AVX-512 BF16"
    )
    assert "bfloat16 decode rows: SDPA" in lines[0] and reason in lines[0], lines[0]


def test_each_kind_of_pass_logs_its_path_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(attention_module, "_logged", set())
    monkeypatch.setattr(attention_module, "_cpu_has_amx", lambda: True)
    with caplog.at_level(logging.INFO, logger=attention_module.__name__):
        for _ in range(2):
            slot_attention(torch.float32, CPU, [0], [3], 5, 64)
            slot_attention(torch.bfloat16, CPU, [0], [3], 40, 64)
    lines = sorted(r.getMessage() for r in caplog.records)
    assert len(lines) == 2, lines
    assert lines[0].startswith("attention for bfloat16 prompt chunks: SDPA (AMX")
    assert lines[1].startswith("attention for float32 decode rows: SDPA (the kernel is for")


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler: install skips the kernel")
def test_install_built_the_kernel_where_a_compiler_exists() -> None:
    # setup.py's optional extension: `pip install -e .` (make venv) compiles attention.c next
    # to attention.py, so no worker ever compiles it inside a request.
    assert attention_module.LIBRARY.exists(), f"{attention_module.LIBRARY} was not built"


@needs_kernel
def test_a_bf16_engine_runs_it_and_speculation_is_the_none_run_but_at_near_ties(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """head_dim 32 (hidden 128, 4 heads): the kernel runs every decode pass of the bf16
    engine, batched and alone; float32 never calls it."""
    calls = {"kernel": 0}
    original = attention_module.slot_attention

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        attend = original(*args, **kwargs)
        calls["kernel"] += attend is not None
        return attend

    monkeypatch.setattr("generation.model.forward.slot_attention", counted)
    target = build_model("llama", vocab_size=96, seed=5, hidden_size=128, logit_scale=8.0)
    draft = perturbed_copy(target, noise=0.3)
    f32 = SpeculativeEngine(target, draft)
    rng = random.Random(11)
    prompts = [[rng.randrange(96) for _ in range(rng.randrange(4, 40))] for _ in range(10)]
    spec = SamplingParams(max_new_tokens=32, num_speculative_tokens=4)
    f32.generate_many(prompts, spec)
    assert calls["kernel"] == 0
    engine = SpeculativeEngine(target.to(torch.bfloat16), draft.to(torch.bfloat16))
    none = SamplingParams(max_new_tokens=32, method="none")
    reference = [engine.generate(p, none).token_ids for p in prompts]
    batched = [r.token_ids for r in engine.generate_many(prompts, spec)]
    alone = [engine.generate(p, spec).token_ids for p in prompts]
    assert calls["kernel"] > 0
    excused = 0
    for p, ref, outs in zip(prompts, reference, zip(batched, alone, strict=True), strict=True):
        for out in outs:
            div = check_greedy(engine.target_forward, p, ref, out)
            if div is not None:
                assert div.excused, div  # a clear margin: a bug
                excused += 1
    assert excused <= len(prompts) // 2
