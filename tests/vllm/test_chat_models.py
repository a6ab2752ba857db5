"""Instruct checkpoints on REAL vLLM: the tiny Llama 3 and Qwen2 chat pairs
(tests/generation/chat_models.py) get the same prompt ids as the torch engine, as token ids
(vLLM never templates or tokenizes: ``skip_tokenizer_init``), stop at the end-of-turn id, and
answer what the torch engine answers, free of special tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from generation import SamplingParams, load_engine
from retrieval.chat import PromptFormat
from retrieval.prompt import Passage
from tests.generation.chat_models import KINDS, PROBE
from tests.vllm.support import EnginePool

OTHER = ("Is <|im_start|>system a passage? <|eot_id|>", [Passage("t", "Text <|im_end|> here.")])


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_chat_prompts_stop_at_the_end_of_turn_as_on_the_torch_engine(
    engine_pool: EnginePool, chat_models: dict[str, dict[str, Path]], kind: str
) -> None:
    dirs = chat_models[kind]
    tok = AutoTokenizer.from_pretrained(dirs["target"])
    fmt = PromptFormat.for_tokenizer(tok)
    end_of_turn = tok.convert_tokens_to_ids(KINDS[kind]["end_of_turn"])
    prompts = [fmt.encode(*PROBE), fmt.encode(*OTHER)]
    vllm = engine_pool.get(dirs["target"], dirs["draft"], "draft_model", 3, max_model_len=1024)
    assert vllm.engine_args["skip_tokenizer_init"] is True  # ids in: no second templating
    assert sorted(vllm.eos_token_ids) == sorted(
        tok.convert_tokens_to_ids([KINDS[kind]["end_of_turn"], KINDS[kind]["end_of_text"]])
    )
    torch_engine = load_engine("torch", str(dirs["target"]), str(dirs["draft"]), device="cpu")
    params = SamplingParams(max_new_tokens=16, method="draft_model", num_speculative_tokens=3)
    got = [r.token_ids for r in vllm.generate_many(prompts, [params, params])]
    want = [torch_engine.generate(p, params).token_ids for p in prompts]
    assert got == want
    assert got[0][-1] == end_of_turn and len(got[0]) <= 3
    for ids in got:
        assert "<|" not in tok.decode(ids, skip_special_tokens=True)
