"""The engine's forward pass on its KV store: transformers' logits bit for bit for one row,
through prefill chunks and rollbacks; several rows in one pass give each row's own logits."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from generation.model.forward import (
    FastLlamaForward,
    HFForward,
    can_pack,
    fast_path_refusal,
    forward_for,
)
from generation.model.kv_store import KVStore, slot_kv
from generation.model.model_runner import PREFILL_BUCKET, ModelRunner
from tests.generation.tiny_models import FAMILIES, build_model

pytestmark = pytest.mark.models

VOCAB = 96
SIZES = [1, 5, 1, 3, 9, 2]


def transformers_with_rollbacks(model, ids: torch.Tensor) -> torch.Tensor:
    """Prefill 20, then passes of SIZES tokens, each followed by a rollback of 2 (reference)."""
    out = []
    pos, i = 20, 0
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        out.append(model(input_ids=ids[:, :20], cache=cache, use_cache=True).logits[0])
        while pos + 9 < ids.shape[1]:
            n = SIZES[i % len(SIZES)]
            out.append(
                model(input_ids=ids[:, pos : pos + n], cache=cache, use_cache=True).logits[0]
            )
            cache.crop(-2)
            pos, i = pos + n - 2, i + 1
    return torch.cat(out)


def engine_with_rollbacks(runner: ModelRunner, ids: torch.Tensor, slot: int) -> torch.Tensor:
    """The same passes on one slot of the engine's store (rollback = a lower length)."""
    out = []
    pos, i = 20, 0
    with torch.inference_mode():
        out.append(runner.run([slot], ids[:, :20], [20])[0])
        while pos + 9 < ids.shape[1]:
            n = SIZES[i % len(SIZES)]
            out.append(runner.run([slot], ids[:, pos : pos + n], [n])[0])
            runner.set_length(slot, runner.length(slot) - 2)
            pos, i = pos + n - 2, i + 1
    return torch.cat(out)


def sharp(family: str, kv_heads: int = 2) -> torch.nn.Module:
    model = build_model(family, vocab_size=VOCAB, seed=kv_heads, max_positions=160)
    if family != "gpt2":
        model.config.num_key_value_heads = kv_heads  # rebuild with this many kv heads
        model = type(model)(model.config).eval()
    with torch.no_grad():
        for p in model.parameters():  # sharper than the default init: logits far from uniform
            p.normal_(0, 0.3)
    return model


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_fast_path_equals_transformers_through_rollback(family: str, kv_heads: int) -> None:
    model = sharp(family, kv_heads)
    assert fast_path_refusal(model) is None
    ids = torch.randint(0, VOCAB, (1, 140), generator=torch.Generator().manual_seed(1))
    expected = transformers_with_rollbacks(model, ids)
    fast = FastLlamaForward(model, packed=False)  # the default GEMM: transformers' own kernels
    got = engine_with_rollbacks(ModelRunner(fast, 3, 160), ids, slot=2)
    assert torch.equal(expected, got)
    # The fast path reads the module's own weights and leaves the model as it was.
    assert torch.equal(transformers_with_rollbacks(model, ids), expected)
    assert fast.layers[0].qkv.parts[1][0] is model.model.layers[0].self_attn.k_proj.weight


@pytest.mark.skipif(not can_pack(torch.ones(1)), reason="torch built without oneDNN's linear ops")
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_packed_weights_give_transformers_logits_to_rounding(family: str) -> None:
    model = sharp(family, kv_heads=2)
    ids = torch.randint(0, VOCAB, (1, 140), generator=torch.Generator().manual_seed(3))
    expected = transformers_with_rollbacks(model, ids)
    fast = forward_for(model)
    assert isinstance(fast, FastLlamaForward) and fast.packed  # the default on a CPU
    assert fast.layers[0].qkv.packed is not None and fast.lm_head.packed is not None
    got = engine_with_rollbacks(ModelRunner(fast, 2, 160), ids, slot=1)
    assert not torch.equal(expected, got)  # other kernels: the last bits differ
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert torch.equal(got.argmax(dim=-1), expected.argmax(dim=-1))
    # The module is untouched: transformers still gives its own logits.
    assert torch.equal(transformers_with_rollbacks(model, ids), expected)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_prefill_runs_padded_to_a_bucket_and_its_padding_is_never_read(family: str) -> None:
    # Prompt chunks run padded to a multiple of PREFILL_BUCKET (oneDNN builds a GEMM primitive
    # per shape: fewer shapes, fewer builds); the slot's length counts only the real tokens,
    # and the padding's keys (token 0's) must not reach any later query.
    model = sharp(family)
    ids = torch.randint(1, VOCAB, (1, 40), generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        expected = model(input_ids=ids).logits[0]  # [40, vocab]
    runner = ModelRunner(forward_for(model), 1, 160)
    assert runner._prefill_ids(0, list(range(21))).shape == (1, 32) == (1, 2 * PREFILL_BUCKET)
    with torch.inference_mode():
        first = runner.prefill(0, ids[0, :21].tolist())
        assert runner.length(0) == 21
        rest = runner.run([0], ids[:, 21:], [19])[0]  # attends positions 0-39 only
    torch.testing.assert_close(first, expected[20], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(rest, expected[21:], rtol=1e-4, atol=1e-4)
    # A slot without room for the padding runs the chunk as it is.
    near_full = ModelRunner(forward_for(model), 1, 24)
    assert near_full._prefill_ids(0, list(range(21))).shape == (1, 21)
    with torch.inference_mode():
        torch.testing.assert_close(
            near_full.prefill(0, ids[0, :21].tolist()), expected[20], rtol=1e-4, atol=1e-4
        )


@pytest.mark.parametrize("family", FAMILIES)
def test_fill_writes_the_keys_and_values_prefill_writes(family: str) -> None:
    # A draft's prompt runs without its output projection (FastLlamaForward.fill); a forward
    # without ``fill`` (transformers') prefills. Either way the slot holds what prefill writes.
    model = sharp(family)
    ids = torch.randint(1, VOCAB, (27,), generator=torch.Generator().manual_seed(6)).tolist()
    filled, prefilled = (ModelRunner(forward_for(model), 2, 160) for _ in range(2))
    with torch.inference_mode():
        for runner, run in ((filled, filled.fill), (prefilled, prefilled.prefill)):
            runner.set_length(1, 0)
            run(1, ids[:20])
            run(1, ids[20:])  # a second chunk after cached positions
        assert filled.length(1) == prefilled.length(1) == 27
        for got, want in zip(slot_kv(filled.store, 1), slot_kv(prefilled.store, 1), strict=True):
            for layer_got, layer_want in zip(got, want, strict=True):
                assert torch.equal(layer_got[:27], layer_want[:27])


def test_fill_stops_the_last_layer_at_its_keys_and_values() -> None:
    # Nothing reads a fill's output: the last layer's attention output and MLP are not run.
    fwd = forward_for(sharp("llama"))
    assert isinstance(fwd, FastLlamaForward) and len(fwd.layers) >= 2
    calls: list[str] = []

    def counted(part, tag: str):
        def call(x: torch.Tensor) -> torch.Tensor:
            calls.append(tag)
            return part(x)

        return call

    for i, layer in enumerate(fwd.layers):
        for name in ("qkv", "o", "gate_up", "down"):
            setattr(layer, name, counted(getattr(layer, name), f"{i}.{name}"))
    runner = ModelRunner(fwd, 1, 160)
    with torch.inference_mode():
        runner.fill(0, list(range(1, 21)))
    last = len(fwd.layers) - 1
    assert f"{last}.qkv" in calls and f"{last - 1}.down" in calls
    assert not {f"{last}.o", f"{last}.gate_up", f"{last}.down"} & set(calls)


@pytest.mark.parametrize("family", ["llama", "qwen2"])  # the fast path's (an EAGLE head's)
def test_prefill_hidden_gives_prefills_logits_and_every_positions_features(family: str) -> None:
    # An EAGLE prompt's prefill: logits at the last position only (as ``prefill`` computes
    # them, to the bit: the first token is the one ``none`` picks), the final hidden states
    # of every position (as ``run_hidden`` returns them over the whole chunk).
    model = sharp(family)
    fwd = forward_for(model)
    assert isinstance(fwd, FastLlamaForward)
    ids = torch.randint(1, VOCAB, (27,), generator=torch.Generator().manual_seed(7)).tolist()
    eagle, plain, full = (ModelRunner(fwd, 2, 160) for _ in range(3))
    rows: list[int] = []  # how many rows each output projection ran on
    lm_head = fwd.lm_head

    def counted(h: torch.Tensor) -> torch.Tensor:
        rows.append(h.shape[0])
        return lm_head(h)

    with torch.inference_mode():
        for chunk in (ids[:20], ids[20:]):  # the second after cached positions
            rows.clear()
            fwd.lm_head = counted  # type: ignore[assignment]
            logits, hidden = eagle.prefill_hidden(1, chunk)
            fwd.lm_head = lm_head
            assert rows == [1]  # not one per prompt position
            want = plain.prefill(1, chunk)
            every, features = full.run_hidden([1], torch.tensor([chunk]), [len(chunk)])
            assert torch.equal(logits, want)
            assert hidden.shape == (len(chunk), model.config.hidden_size)
            torch.testing.assert_close(hidden, features[0], rtol=0, atol=1e-5)
            assert logits.argmax() == every[0, -1].argmax()
        assert eagle.length(1) == plain.length(1) == full.length(1) == 27


def test_packed_weights_are_refused_where_onednn_cannot_run_them() -> None:
    model = sharp("llama").to(torch.float64)
    assert not FastLlamaForward(model).packed  # None: packed only where it can be
    with pytest.raises(ValueError, match="packed weights need float32"):
        FastLlamaForward(model, packed=True)


@pytest.mark.parametrize("family", FAMILIES)
def test_transformers_forward_on_the_store_equals_its_own_cache(family: str) -> None:
    model = sharp(family)
    ids = torch.randint(0, VOCAB, (1, 140), generator=torch.Generator().manual_seed(2))
    got = engine_with_rollbacks(ModelRunner(HFForward(model), 2, 160), ids, slot=1)
    torch.testing.assert_close(got, transformers_with_rollbacks(model, ids), rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_batched_pass_gives_each_row_its_own_logits(family: str) -> None:
    model = sharp(family)
    fwd = forward_for(model)
    prompts = [list(range(3, 3 + n)) for n in (7, 12, 4)]
    alone, batched = ModelRunner(fwd, 3, 160), ModelRunner(fwd, 4, 160)
    slots = [3, 0, 2]  # not a dense run: the store is gathered
    with torch.inference_mode():
        for slot, prompt in zip(slots, prompts, strict=True):
            batched.prefill(slot, prompt)
        for b, prompt in enumerate(prompts):
            alone.prefill(b, prompt)
        # Right-padded: row 1 has 3 real tokens, rows 0 and 2 have 1 and 2.
        new = torch.tensor([[5, 0, 0], [6, 7, 8], [9, 10, 0]])
        counts = [1, 3, 2]
        got = batched.run(slots, new, counts)
        for b, count in enumerate(counts):
            want = alone.run([b], new[b : b + 1, :count], [count])[0]
            torch.testing.assert_close(got[b, :count], want, rtol=1e-4, atol=1e-4)
        last = batched.run(slots, new, [1, 1, 1], last_only=True)  # [B, vocab]
    assert last.shape == (3, VOCAB)
    assert [batched.length(s) for s in slots] == [7 + 1 + 1, 12 + 3 + 1, 4 + 2 + 1]


def test_a_prefix_copied_between_slots_prefills_the_rest_exactly() -> None:
    model = sharp("llama")
    fwd = FastLlamaForward(model)
    runner = ModelRunner(fwd, 2, 64)
    prompt = list(range(1, 30))
    with torch.inference_mode():
        want = runner.prefill(0, prompt)
        store: KVStore = runner.store
        for src, dst in zip(slot_kv(store, 0), slot_kv(store, 1), strict=True):
            for layer_src, layer_dst in zip(src, dst, strict=True):
                layer_dst[:20] = layer_src[:20]  # the first 20 prompt positions, attached
        store.lengths[1] = 20
        got = runner.prefill(1, prompt[20:])  # the rest prefilled after the prefix
    assert runner.length(1) == len(prompt)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_other_families_and_variants_run_on_transformers() -> None:
    gpt2 = build_model("gpt2", vocab_size=VOCAB)
    assert isinstance(forward_for(gpt2), HFForward)
    assert "not a Llama-family model" in str(fast_path_refusal(gpt2))
    gelu = build_model("llama", vocab_size=VOCAB)
    gelu.config.hidden_act = "gelu"
    assert isinstance(forward_for(gelu), HFForward)
    with pytest.raises(ValueError, match="hidden_act 'gelu'"):
        FastLlamaForward(gelu)
    eager = build_model("llama", vocab_size=VOCAB)
    eager.config._attn_implementation = "eager"  # rounds differently from SDPA
    assert "attention implementation 'eager'" in str(fast_path_refusal(eager))
    assert isinstance(forward_for(eager), HFForward)
    llama = build_model("llama", vocab_size=VOCAB)
    assert isinstance(forward_for(llama), FastLlamaForward)
    assert isinstance(forward_for(llama, fast=False), HFForward)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_is_transformers_rmsnorm_to_the_bit(dtype: torch.dtype) -> None:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from generation.model.forward import rms_norm

    norm = LlamaRMSNorm(96, eps=1e-6).to(dtype)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(96, generator=generator) * 0.3 + 1)
    with torch.inference_mode():
        for rows in (1, 5, 80, 300):
            x = (torch.randn(rows, 96, generator=generator) * 3).to(dtype)
            kept = x.clone()
            assert torch.equal(rms_norm(x, norm), norm(x)), rows
            assert torch.equal(x, kept)  # the input is not written
