"""The engine's own Llama-family forward pass gives transformers' logits bit for bit."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from generation.forward import FastLlamaForward, HFForward, fast_path_refusal, forward_for
from generation.kv_cache import MIN_CAPACITY
from tests.generation.tiny_models import build_model

VOCAB = 96


def run_with_rollbacks(step, ids: torch.Tensor) -> torch.Tensor:
    """Prefill 20, then passes of 1, 5, 1, 3 tokens..., each followed by a rollback of 2."""
    out = [step(ids[:, :20])]
    pos, sizes = 20, [1, 5, 1, 3, 9, 2]
    i = 0
    while pos + 9 < ids.shape[1]:
        n = sizes[i % len(sizes)]
        out.append(step(ids[:, pos : pos + n]))
        out.append(step(None))  # rollback marker
        pos += n - 2
        i += 1
    return torch.cat([o for o in out if o is not None])


def stepper(fwd, cache):
    def step(chunk):
        if chunk is None:
            cache.crop(-2)
            return None
        return fwd(chunk, cache)

    return step


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_fast_path_equals_transformers_through_growth_and_rollback(
    family: str, kv_heads: int
) -> None:
    model = build_model(family, vocab_size=VOCAB, seed=kv_heads, max_positions=MIN_CAPACITY * 3)
    model.config.num_key_value_heads = kv_heads  # rebuild with this many kv heads
    model = type(model)(model.config).eval()
    with torch.no_grad():
        for p in model.parameters():  # sharper than the default init: logits far from uniform
            p.normal_(0, 0.3)
    assert fast_path_refusal(model) is None
    # Longer than the first buffer, so the cache grows (and copies) at least once.
    ids = torch.randint(
        0, VOCAB, (1, MIN_CAPACITY + 80), generator=torch.Generator().manual_seed(1)
    )
    with torch.inference_mode():
        expected = run_with_rollbacks(
            stepper(HFForward(model), DynamicCache(config=model.config)), ids
        )
        fast = FastLlamaForward(model)
        cache = fast.new_cache()
        got = run_with_rollbacks(stepper(fast, cache), ids)
        after = HFForward(model)(ids[:, :20], DynamicCache(config=model.config))
    assert torch.equal(expected, got)
    assert cache.layers[0]._key_buf.shape[-2] > MIN_CAPACITY  # it grew
    # The fast path reads the module's own weights and leaves the model as it was.
    assert torch.equal(after, expected[:20])
    assert fast.layers[0].k.weight is model.model.layers[0].self_attn.k_proj.weight


def test_logits_to_keep_and_shapes() -> None:
    model = build_model("llama", vocab_size=VOCAB)
    fast = FastLlamaForward(model)
    cache = fast.new_cache()
    with torch.inference_mode():
        all_logits = fast(torch.arange(12).view(1, -1), cache)
        cache.crop(-12)
        last = fast(torch.arange(12).view(1, -1), cache, logits_to_keep=1)
    assert all_logits.shape == (12, VOCAB) and last.shape == (1, VOCAB)
    torch.testing.assert_close(all_logits[-1:], last)  # a 1-row GEMM may round differently
    assert cache.get_seq_length() == 12


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
