"""The pipeline on an instruct checkpoint (tiny Qwen2 with ChatML): the chat-templated prompt
within the context budget, the collection's own system prompt, ``prompt_format`` in the stored
and shown stats, answers free of special tokens, and a worker refused at start by a failing
template."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from app.collection_prompts import set_system_prompt, system_prompt_view
from app.db import GenerationStatsRecord, Query, prepare
from app.lifecycle.lease import claim
from app.lifecycle.queries import create_query, get_or_create_tenant, query_view, validate_request
from app.pipeline import answer_query, build_request
from app.resources import Resources
from app.settings import Settings
from retrieval.chat import PromptFormatError
from retrieval.prompt import DEFAULT_SYSTEM_PROMPT, Passage

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def resources(tmp_path_factory: Any, chat_models: dict[str, dict[str, Path]]) -> Resources:
    """Resources on the Qwen2 chat pair and a fresh SQLite database with two files ingested."""
    pair = chat_models["qwen2"]
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("chat_pipeline"),
        target_model=pair["target"],
        draft_model=pair["draft"],
        device="cpu",
    )
    _, factory = prepare(settings)
    res = Resources(settings, factory)
    corpus = ROOT / "demo" / "corpus"
    report = res.retrieval.ingest(
        [corpus / "assert.md", corpus / "pass.md"], collection="docs", tenant="acme"
    )
    assert report.ok
    return res


def _submit(res: Resources, **params: Any) -> uuid.UUID:
    req = validate_request(
        res.settings, {"question": "What does assert do?", "collection": "docs", **params}
    )
    with res.session_factory() as session:
        return create_query(session, get_or_create_tenant(session, "acme"), req)[0].id


def test_answers_record_the_chat_format_and_hold_no_special_tokens(resources: Resources) -> None:
    qid = _submit(resources, max_tokens=12, num_speculative_tokens=3)
    assert answer_query(resources, qid, host="test") == "succeeded"
    with resources.session_factory() as session:
        query = session.get(Query, qid)
        assert query is not None and query.answer is not None
        stored = session.query(GenerationStatsRecord).filter_by(query_id=qid).one()
        assert stored.prompt_format == "chat"
        shown = json.loads(json.dumps(query_view(query)))
    assert shown["stats"]["prompt_format"] == "chat"
    assert "<|" not in query.answer.text


def test_the_budget_counts_the_templated_prompt_and_the_collection_prompt_is_used(
    resources: Resources,
) -> None:
    tok = AutoTokenizer.from_pretrained(resources.settings.target_model)
    engine = resources.engine
    max_tokens = 512  # of 1024: the passages must be cut to fit
    qid = _submit(resources, max_tokens=max_tokens)
    claimed = claim(resources.session_factory, qid, "test")
    assert claimed is not None
    hits = resources.retrieval.search(claimed.question, collection="docs", tenant="acme", top_k=3)
    built = build_request(resources, claimed, list(hits))
    assert built.prompt_format == "chat"
    assert 0 < len(built.prompt_ids) <= engine.max_context - max_tokens
    passages = [Passage(h.passage_title, h.text) for h in built.cited]
    assert built.prompt_ids == resources.prompt_format.encode(claimed.question, passages)
    assert DEFAULT_SYSTEM_PROMPT in tok.decode(built.prompt_ids)
    # The budget bit: a passage was cut or dropped to fit the templated prompt.
    whole = [Passage(h.passage_title, h.text) for h in hits]
    assert passages != whole
    assert len(resources.prompt_format.encode(claimed.question, whole)) > len(built.prompt_ids)

    with resources.session_factory() as session:
        set_system_prompt(session, claimed.tenant_id, "docs", "Answer in one sentence.")
        view = system_prompt_view(session, claimed.tenant_id, "docs", DEFAULT_SYSTEM_PROMPT)
    assert view.source == "collection"
    try:
        text = tok.decode(build_request(resources, claimed, list(hits)).prompt_ids)
        assert "Answer in one sentence." in text and DEFAULT_SYSTEM_PROMPT not in text
        with resources.session_factory() as session:  # over the token limit: the query fails
            set_system_prompt(session, claimed.tenant_id, "docs", "cite them all " * 280)
        with pytest.raises(PromptFormatError, match="over the limit of 512"):
            build_request(resources, claimed, list(hits))
    finally:
        with resources.session_factory() as session:
            set_system_prompt(session, claimed.tenant_id, "docs", None)


def test_a_worker_whose_template_raises_is_refused_at_start(
    tmp_path: Path, chat_models: dict[str, dict[str, Path]]
) -> None:
    target = tmp_path / "target"
    shutil.copytree(chat_models["qwen2"]["target"], target)
    (target / "chat_template.jinja").write_text(
        "{{ raise_exception('Conversation roles must alternate user/assistant') }}"
    )
    settings = Settings(data_dir=tmp_path / "var", target_model=target, draft_model=None)
    _, factory = prepare(settings)
    with pytest.raises(PromptFormatError, match="Conversation roles must alternate"):
        Resources(settings, factory).warm(answer=True, ingest=False)
