"""Method ``eagle``: a head on the target's own features drafts; the target's answer is kept.

Greedy rows give the target's greedy tokens whatever the head says (random heads, mixed
batches, chunked prefill, reused prefixes); a head built to repeat the last token is accepted
exactly where the answer repeats, which pins which feature is fed at which position; the
engine's head computes what the trainable module computes; the checkpoint is vLLM's EAGLE
layout; mismatched heads and heads a worker lacks are refused naming the sizes or methods.
(The sampling law for ``eagle``: tests/generation/test_sampling_distribution.py.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from generation import SamplingParams, SpeculativeEngine
from generation.config import EngineConfig
from generation.model.loading import IncompatibleDraftError
from generation.spec_decode.eagle import EagleHeadModule, head_config, load_head, save_head
from tests.generation.tiny_models import build_model, reference_greedy, save_checkpoint

pytestmark = pytest.mark.models

VOCAB = 48


def random_head(target: Any, seed: int) -> EagleHeadModule:
    torch.manual_seed(seed)
    return EagleHeadModule(head_config(target.config)).eval()


def repeat_last_head(target: Any) -> EagleHeadModule:
    """A head whose g is the target feature it is fed: fc keeps the feature half, the layer
    adds nothing. Fed f_t it predicts what the target did at t, i.e. x_{t+1}: the last token
    of the row, drafted k times over."""
    head = random_head(target, 0)
    hidden = int(target.config.hidden_size)
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.weight[:, hidden:] = torch.eye(hidden)
        head.layers[0].self_attn.o_proj.weight.zero_()
        head.layers[0].mlp.down_proj.weight.zero_()
    return head


def cheap_steps(engine: SpeculativeEngine) -> SpeculativeEngine:
    """Price every step alike, so "auto" drafts (the head's real cost is not what is tested)."""
    engine.step_costs().timer = lambda batch_size, ks, with_draft: {k: 0.01 for k in ks}
    engine.step_costs().eagle_timer = lambda batch_size, ks: {k: 0.01 for k in ks}
    return engine


PROMPTS = [[1, 2, 3, 4, 5], list(range(10, 40)), [7, 7, 7], list(range(40)) + [3, 3]]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("k", [1, 3, "auto"])
def test_greedy_eagle_gives_the_target_greedy_answer(seed: int, k: int | str) -> None:
    target = build_model("llama", vocab_size=VOCAB, seed=seed, logit_scale=4.0)
    engine = cheap_steps(SpeculativeEngine(target, eagle=random_head(target, seed)))
    params = SamplingParams(max_new_tokens=24, method="eagle", num_speculative_tokens=k)
    results = engine.generate_many(PROMPTS, params)
    for prompt, result in zip(PROMPTS, results, strict=True):
        assert result.token_ids == reference_greedy(target, prompt, 24)
        assert result.stats.method == "eagle"
    assert sum(r.stats.num_draft_tokens for r in results) > 0


def test_mixed_batch_chunked_prefill_and_reused_prefixes_keep_greedy_answers() -> None:
    target = build_model("llama", vocab_size=VOCAB, seed=4, logit_scale=4.0)
    config = EngineConfig(
        prefill_chunk=8, batch_prefill_chunk=None, prefix_cache_mb=1.0, prefix_block_size=4
    )
    engine = cheap_steps(
        SpeculativeEngine(target, target, config=config, eagle=repeat_last_head(target))
    )
    shared = list(range(20, 44))
    prompts = [shared + [1, 2], shared + [5], [9, 9, 9, 9, 9, 9], shared + [1, 2, 3]]
    methods = ["eagle", "draft_model", "eagle", "ngram"]
    for _ in range(2):  # the second time, the shared prefix comes from the cache
        params = [SamplingParams(max_new_tokens=20, method=m) for m in methods]
        results = engine.generate_many(prompts, params)
        for prompt, result in zip(prompts, results, strict=True):
            assert result.token_ids == reference_greedy(target, prompt, 20)
    assert results[0].stats.num_cached_prompt_tokens > 0


def expected_repeat_acceptance(tokens: list[int], prompt_len: int, k: int, budget: int) -> int:
    """Accepted drafts of a repeat-last proposer drafting k per round over ``tokens``."""
    accepted, p = 0, prompt_len  # position of the row's last token after the first one
    while p - prompt_len + 1 < budget:
        cap = min(k, budget - (p - prompt_len + 1) - 1)
        run = 0
        while run < cap and p + 1 + run < len(tokens) and tokens[p + 1 + run] == tokens[p]:
            run += 1
        accepted += run
        p += run + 1
    return accepted


@pytest.mark.parametrize(("seed", "repeats"), [(1, True), (3, True), (8, False)])
def test_repeat_last_head_is_accepted_exactly_where_the_answer_repeats(
    seed: int, repeats: bool
) -> None:
    """Fed the feature one position early, the head would draft the token before the last:
    accepted all along seed 8's answer, which alternates two tokens (4 2 4 2 ...)."""
    target = build_model("llama", vocab_size=8, seed=seed, logit_scale=6.0)
    engine = SpeculativeEngine(target, eagle=repeat_last_head(target))
    prompt, budget, k = [1, 2, 3, 1, 2], 40, 3
    result = engine.generate(
        prompt, SamplingParams(max_new_tokens=budget, method="eagle", num_speculative_tokens=k)
    )
    tokens = prompt + result.token_ids
    want = expected_repeat_acceptance(tokens, len(prompt), k, budget)
    assert result.stats.num_accepted_tokens == want
    assert (want > 10) == repeats, want


def test_engine_head_computes_what_the_module_computes() -> None:
    target = build_model("llama", vocab_size=VOCAB, seed=6)
    head = random_head(target, 6)
    engine = SpeculativeEngine(target, eagle=head, config=EngineConfig(packed_weights=False))
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.inference_mode():
        features = target(ids, output_hidden_states=True).hidden_states[-1]  # after the norm
        g = head(target.model.embed_tokens(ids[:, 1:]), features[:, :-1])
        want = target.lm_head(g)[0]  # [n, vocab]
        runner = engine._core.head
        assert runner is not None
        runner.set_length(0, 0)
        got, _ = runner.run_hidden([0], ids[:, 1:], [7], False, features[:, :-1])
    torch.testing.assert_close(got[0], want, rtol=1e-4, atol=1e-4)


def test_checkpoint_is_vllm_eagle_layout_and_loads_back(tmp_path: Path) -> None:
    target = build_model("llama", vocab_size=VOCAB, seed=7)
    head = random_head(target, 7)
    save_head(head, tmp_path / "eagle", {"note": "test"})
    config = json.loads((tmp_path / "eagle" / "config.json").read_text())
    assert config["architectures"] == ["EagleLlamaForCausalLM"]
    assert config["num_hidden_layers"] == 1
    keys = set(load_file(str(tmp_path / "eagle" / "model.safetensors")))
    assert "fc.weight" in keys and "layers.0.self_attn.q_proj.weight" in keys
    assert not any(k.startswith(("embed_tokens", "lm_head", "rotary")) for k in keys)
    assert "layers.0.input_layernorm.weight" not in keys  # vLLM deletes that norm
    loaded = load_head(tmp_path / "eagle", target)
    for name, value in head.state_dict().items():
        if not name.startswith("rotary."):
            torch.testing.assert_close(loaded.state_dict()[name], value.half().float())


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [("hidden_size", 64, "hidden size 64, the target has 32"),
     ("vocab_size", 50, "vocabulary size 50, the target has 48")],
)  # fmt: skip
def test_mismatched_head_is_refused_at_start_naming_both_sizes(
    tmp_path: Path, field: str, value: int, words: str
) -> None:
    target = build_model("llama", vocab_size=VOCAB, seed=8)
    other = build_model("llama", vocab_size=VOCAB, seed=8)
    setattr(other.config, field, value)
    other.config.num_attention_heads = target.config.num_attention_heads
    other.config.head_dim = target.config.head_dim
    save_head(EagleHeadModule(head_config(other.config)), tmp_path / "eagle")
    save_checkpoint(target, tmp_path / "target")
    with pytest.raises(IncompatibleDraftError, match=words):
        SpeculativeEngine.from_pretrained(tmp_path / "target", eagle_dir=tmp_path / "eagle")


def test_eagle_without_a_head_is_refused_naming_the_methods_served() -> None:
    engine = SpeculativeEngine(build_model("llama", vocab_size=VOCAB))
    with pytest.raises(
        ValueError, match="'eagle' needs an EAGLE head.*serves none, ngram, suffix$"
    ):
        engine.generate([1, 2, 3], SamplingParams(method="eagle"))


def test_transformers_forward_cannot_serve_a_head() -> None:
    target = build_model("llama", vocab_size=VOCAB)
    with pytest.raises(ValueError, match="own forward pass"):
        SpeculativeEngine(
            target, eagle=random_head(target, 0), config=EngineConfig(fast_forward=False)
        )
