"""Drafts tuned from stored traffic: token ids kept at answer time, dataset, tune, evaluate.

Real PostgreSQL for the stored traffic, the tiny random-weight pair for tuning and decoding.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session, sessionmaker

from app.cli import main
from app.db import Answer, Query
from app.drafts.dataset import DatasetError, Filters, build_dataset, split
from app.drafts.evaluate import RefusedDraft, verdict
from app.drafts.hooks import store_token_ids
from app.drafts.records import AnswerTokens
from app.hooks import Answered
from app.lifecycle.queries import get_or_create_tenant
from app.settings import Settings


@pytest.fixture
def pg_factory(migrated_pg_url: str) -> Any:
    engine = create_engine(migrated_pg_url)
    yield sessionmaker(engine, expire_on_commit=False)
    engine.dispose()


def _answered(
    sf: sessionmaker[Session],
    tenant: str,
    *,
    done_at: datetime,
    stored: str | None = None,
    source: str = "api",
    method: str = "draft_model",
    status: str = "succeeded",
    collection: str = "docs",
    tokens: bool = True,
    store_questions: str = "clear",
    prompt: list[int] | None = None,
    output: list[int] | None = None,
) -> uuid.UUID:
    """A final query with its answer, its token ids stored through the real after-answer hook."""
    with sf() as session:
        t = get_or_create_tenant(session, tenant)
        q = Query(
            tenant_id=t.id, collection=collection, question="what is x?", status=status,
            params={"method": method, "max_tokens": 8, "temperature": 0.0,
                    "num_speculative_tokens": 4},
            source=source, done_at=done_at, question_stored=stored,
        )  # fmt: skip
        session.add(q)
        session.flush()
        if status == "succeeded":
            session.add(Answer(query_id=q.id, text="x", model_pair="t+d", engine="torch"))
        session.commit()
        qid = q.id
    if tokens:
        resources = SimpleNamespace(
            settings=Settings(store_questions=store_questions), session_factory=sf
        )
        store_token_ids(
            resources,
            Answered(
                query_id=qid, status=status, prompt_token_ids=prompt or [5, 6, 7],
                output_token_ids=output or [8, 9],
            ),
        )  # fmt: skip
    return qid


def test_hook_keeps_token_ids_only_for_clear_questions(pg_factory: Any) -> None:
    now = datetime.now(UTC)
    tenant = f"hook-{uuid.uuid4().hex[:6]}"
    clear = _answered(pg_factory, tenant, done_at=now)
    hashed = _answered(pg_factory, tenant, done_at=now, store_questions="hashed")
    failed = _answered(pg_factory, tenant, done_at=now, status="failed")
    with pg_factory() as session:
        kept = {r.query_id: r for r in session.scalars(select(AnswerTokens))}
    assert kept[clear].prompt_token_ids == [5, 6, 7] and kept[clear].output_token_ids == [8, 9]
    assert hashed not in kept and failed not in kept
    # A redelivered task stores nothing twice (and does not raise).
    store_token_ids(
        SimpleNamespace(settings=Settings(), session_factory=pg_factory),
        Answered(query_id=clear, status="succeeded", prompt_token_ids=[1], output_token_ids=[2]),
    )
    with pg_factory() as session:
        row = session.scalar(select(AnswerTokens).where(AnswerTokens.query_id == clear))
    assert row is not None and row.prompt_token_ids == [5, 6, 7]


def test_dataset_window_filters_privacy_and_split(pg_factory: Any, tmp_path: Path) -> None:
    from app.audit.window import Window

    now = datetime.now(UTC)
    a, b = f"ds-a-{uuid.uuid4().hex[:6]}", f"ds-b-{uuid.uuid4().hex[:6]}"
    good = [
        _answered(pg_factory, a, done_at=now - timedelta(minutes=i + 1), prompt=[i, 1, 2])
        for i in range(12)
    ]
    # Left out: hashed / redacted questions (counted, never read), no token ids (counted),
    # checks (benchmark source), failures, another collection, the ngram method, outside.
    _answered(pg_factory, b, done_at=now, stored="hashed", tokens=False)
    _answered(pg_factory, b, done_at=now, stored="redacted", tokens=False)
    _answered(pg_factory, a, done_at=now, tokens=False)
    _answered(pg_factory, a, done_at=now, source="benchmark")
    _answered(pg_factory, a, done_at=now, status="failed")
    _answered(pg_factory, a, done_at=now, method="ngram")
    _answered(pg_factory, a, done_at=now, collection="other")
    _answered(pg_factory, a, done_at=now - timedelta(days=2))
    window = Window(now - timedelta(hours=1), now + timedelta(seconds=1))
    filters = Filters(tenants=(a, b), collections=("docs",), methods=("draft_model",))
    with pg_factory() as session:
        manifest = build_dataset(
            session, tmp_path / "ds", window, filters, heldout=0.25, min_items=10
        )
    assert manifest["items"] == 12
    assert manifest["left_out"] == {"privacy": 2, "no_token_ids": 1}
    train = [json.loads(x) for x in (tmp_path / "ds" / "train.jsonl").read_text().splitlines()]
    held = [json.loads(x) for x in (tmp_path / "ds" / "heldout.jsonl").read_text().splitlines()]
    assert (len(train), len(held)) == (9, 3)
    ids = {i["query_id"] for i in train} | {i["query_id"] for i in held}
    assert ids == {str(q) for q in good}
    assert not {i["query_id"] for i in train} & {i["query_id"] for i in held}
    assert set(manifest["queries"]["heldout"]) == {i["query_id"] for i in held}
    assert all(i["output_ids"] == [8, 9] and i["prompt_ids"][1:] == [1, 2] for i in train)
    # The split is a function of the query ids and the seed: the same window splits alike.
    again_train, again_held = split(train + held, 0.25, 0)
    assert {i["query_id"] for i in again_held} == {i["query_id"] for i in held}
    # Too small: the error names how many were found and how many are needed.
    with pg_factory() as session, pytest.raises(DatasetError, match=r"holds 12 usable .* 50 are"):
        build_dataset(session, tmp_path / "x", window, filters, min_items=50)
    assert not (tmp_path / "x").exists()


def test_dataset_cli_empty_window_is_a_one_line_error(migrated_pg_url: str, tmp_path: Path) -> None:
    env = {"SPECRAG_DATA_DIR": str(tmp_path), "SPECRAG_DATABASE_URL": migrated_pg_url}
    result = CliRunner().invoke(
        main,
        ["draft", "dataset", "--since", "2001-01-01", "--until", "2001-01-02",
         "--out", str(tmp_path / "ds")],
        env=env,
    )  # fmt: skip
    assert result.exit_code == 1
    assert "holds 0 usable answers" in result.output and "at least 50 are needed" in result.output
    assert "0 for privacy" in result.output


def _tiny_dataset(tiny: dict[str, Path], out: Path, n: int = 16) -> Path:
    """A dataset of the tiny target's own greedy answers (as a worker would have stored)."""
    import torch
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(str(tiny["target"])).eval()
    gen = torch.Generator().manual_seed(0)
    items = []
    for i in range(n):
        prompt = torch.randint(10, 200, (12,), generator=gen).tolist()
        with torch.no_grad():
            ids = target.generate(
                torch.tensor([prompt]), max_new_tokens=8, do_sample=False, pad_token_id=0
            )[0, 12:].tolist()
        items.append({"query_id": str(uuid.UUID(int=i)), "prompt_ids": prompt, "output_ids": ids,
                      "temperature": 0.0, "max_tokens": 8, "method": "draft_model"})  # fmt: skip
    out.mkdir(parents=True)
    for name, rows in (("train", items[4:]), ("heldout", items[:4])):
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    manifest = {"format": "specrag-draft-dataset/1", "window": {"since": "a", "until": "b"},
                "filters": {}, "items": n}  # fmt: skip
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def test_tune_resumes_writes_manifest_and_evaluate_compares(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    ds = _tiny_dataset(tiny_models, tmp_path / "ds")
    out = tmp_path / "draft-tuned"
    base = ["draft", "tune", "--dataset", str(ds), "--draft", str(tiny_models["draft"]),
            "--target", str(tiny_models["target"]), "--out", str(out), "--run-dir",
            str(tmp_path / "run"), "--tokens-per-batch", "64", "--lr", "3e-3", "--no-progress"]  # fmt: skip
    first = CliRunner().invoke(main, [*base, "--max-steps", "2", "--json"])
    assert first.exit_code == 0, first.output
    m1 = json.loads(first.output.strip().splitlines()[-1])
    assert m1["steps"] == 2 and m1["loss"] == "logits" and m1["base_draft"].endswith("draft")
    # Resumable: with the output removed, a longer run continues from the run's checkpoint.
    import shutil

    shutil.rmtree(out)
    second = CliRunner().invoke(main, [*base, "--max-steps", "6", "--json"])
    assert second.exit_code == 0, second.output
    assert "resumed at step 2" in second.output
    m2 = json.loads((out / "manifest.json").read_text())
    assert m2["steps"] == 6 and m2["data_window"] == {"since": "a", "until": "b"}
    assert m2["last_loss"] < m2["first_loss"]
    # Tuned: the draft now predicts the target's held-out answers at least as well.
    assert m2["heldout_greedy_match"]["tuned"] >= m2["heldout_greedy_match"]["base"]

    from generation import load_engine

    engine = load_engine("torch", tiny_models["target"], out, device="cpu")
    assert engine.model_pair == "target+draft-tuned"  # a distinct pair label, by directory

    result = CliRunner().invoke(
        main,
        ["draft", "evaluate", str(tiny_models["draft"]), str(out), "--dataset", str(ds),
         "--target", str(tiny_models["target"]), "--chart", str(tmp_path / "c.png"), "--json",
         "--force"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    held = report["sets"]["heldout"]
    assert held["identical"] and held["checked_against_target"] == 4
    assert held["old"]["answers"] == held["new"]["answers"] == 4
    assert report["verdict"] in ("accepted", "forced")
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((out / "manifest.json").read_text())["heldout_acceptance"] is not None


def test_draft_with_another_vocabulary_is_refused_before_training(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    from transformers import AutoConfig, LlamaForCausalLM

    config = AutoConfig.from_pretrained(str(tiny_models["draft"]))
    config.vocab_size += 7
    other = tmp_path / "other-draft"
    LlamaForCausalLM(config).save_pretrained(other)
    ds = _tiny_dataset(tiny_models, tmp_path / "ds", n=6)
    result = CliRunner().invoke(
        main,
        ["draft", "tune", "--dataset", str(ds), "--draft", str(other), "--target",
         str(tiny_models["target"]), "--out", str(tmp_path / "o"), "--run-dir", str(tmp_path / "r")],
    )  # fmt: skip
    assert result.exit_code == 1
    assert "vocabulary size" in result.output
    assert not (tmp_path / "r").exists() and not (tmp_path / "o").exists()


def _report(old: float, new: float, identical: bool = True) -> dict[str, Any]:
    side = {"acceptance_rate": None}
    return {
        "sets": {
            "heldout": {
                "old": {**side, "acceptance_rate": old},
                "new": {**side, "acceptance_rate": new},
                "acceptance_gain": new - old,
                "identical": identical,
            }
        }
    }


def test_evaluate_refuses_a_draft_that_lowers_heldout_acceptance() -> None:
    assert verdict(_report(0.5, 0.6), force=False) == "accepted"
    with pytest.raises(RefusedDraft, match=r"lowers held-out acceptance from 0.500 to 0.450"):
        verdict(_report(0.5, 0.45), force=False)
    assert verdict(_report(0.5, 0.45), force=True) == "forced"
    with pytest.raises(RefusedDraft, match="answers differ"):
        verdict(_report(0.5, 0.6, identical=False), force=False)


def test_tune_queue_without_a_queue_is_a_one_line_error(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    ds = _tiny_dataset(tiny_models, tmp_path / "ds", n=6)
    result = CliRunner().invoke(
        main,  # app.cli.main: no queue wired in
        ["draft", "tune", "--dataset", str(ds), "--draft", str(tiny_models["draft"]), "--target",
         str(tiny_models["target"]), "--out", str(tmp_path / "o"), "--queue"],
    )  # fmt: skip
    assert result.exit_code == 1
    assert "this command needs a queue" in result.output
    assert not (tmp_path / "o").exists()


def test_tune_on_the_target_tokens_alone(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    """``--loss tokens``: cross-entropy on the stored output ids, no target forward."""
    ds = _tiny_dataset(tiny_models, tmp_path / "ds", n=6)
    result = CliRunner().invoke(
        main,
        ["draft", "tune", "--dataset", str(ds), "--draft", str(tiny_models["draft"]), "--target",
         str(tiny_models["target"]), "--out", str(tmp_path / "o"), "--max-steps", "1",
         "--loss", "tokens", "--no-progress", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert manifest["loss"] == "tokens" and manifest["steps"] == 1


def _tiny_head(tiny: dict[str, Path], out: Path, **overrides: Any) -> Path:
    """A seeded random EAGLE head for the tiny target (``overrides``: config fields changed)."""
    import torch
    from transformers import AutoConfig

    from generation.spec_decode.eagle import EagleHeadModule, head_config, save_head

    config = head_config(AutoConfig.from_pretrained(str(tiny["target"])))
    for name, value in overrides.items():
        setattr(config, name, value)
    torch.manual_seed(3)
    save_head(EagleHeadModule(config), out)
    return out


def test_eagle_head_tune_resumes_writes_manifest_and_evaluate_compares(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """``draft tune --eagle``: the shared loop on a head (features recorded once, resumable,
    loss falls), a head of its own name in model_pair, and ``draft evaluate`` telling heads by
    their config and decoding with method eagle: the target's answers, identical."""
    import shutil

    ds = _tiny_dataset(tiny_models, tmp_path / "ds")
    # The random target's answers are random tokens: 12 of them teach nothing that carries to
    # unseen prompts, so the "held-out" split here repeats four training items. The match
    # then shows the head learnt, through the lm_head at the offsets decoding uses, what it
    # was trained on (0 for the random base head).
    train = (ds / "train.jsonl").read_text().splitlines()
    (ds / "heldout.jsonl").write_text("".join(line + "\n" for line in train[:4]))
    head = _tiny_head(tiny_models, tmp_path / "eagle")
    out = tmp_path / "eagle-tuned"
    base = ["draft", "tune", "--dataset", str(ds), "--eagle", str(head),
            "--target", str(tiny_models["target"]), "--out", str(out), "--run-dir",
            str(tmp_path / "run"), "--tokens-per-batch", "64", "--lr", "1e-2", "--epochs", "8",
            "--no-progress"]  # fmt: skip
    first = CliRunner().invoke(main, [*base, "--max-steps", "2", "--json"])
    assert first.exit_code == 0, first.output
    m1 = json.loads(first.stdout)  # the manifest alone: progress goes to stderr
    assert m1["steps"] == 2 and m1["kind"] == "eagle" and m1["base_head"].endswith("eagle")
    assert (tmp_path / "run" / "features.pt").is_file()
    shutil.rmtree(out)
    second = CliRunner().invoke(main, [*base, "--max-steps", "24", "--json"])
    assert second.exit_code == 0, second.output
    assert "resumed at step 2" in second.output
    m2 = json.loads((out / "manifest.json").read_text())
    assert m2["steps"] == 24 and m2["data_window"] == {"since": "a", "until": "b"}
    assert (tmp_path / "run" / "features.sha256").is_file()
    assert m2["last_loss"] < m2["first_loss"]
    match = m2["heldout_greedy_match"]
    assert match["base"] == 0.0 and match["tuned"] >= 0.15, match  # 0.28 when written

    from generation import load_engine
    from generation.spec_decode.eagle import ARCHITECTURE

    assert json.loads((out / "config.json").read_text())["architectures"] == [ARCHITECTURE]
    engine = load_engine("torch", tiny_models["target"], device="cpu", eagle_dir=out)
    assert engine.model_pair == "target+eagle-tuned"  # a distinct pair label, by directory
    assert load_engine("torch", tiny_models["target"], device="cpu", eagle_dir=head).model_pair == (
        "target+eagle"
    )

    result = CliRunner().invoke(
        main,
        ["draft", "evaluate", str(head), str(out), "--dataset", str(ds),
         "--target", str(tiny_models["target"]), "--json", "--force"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    assert report["method"] == "eagle"
    held = report["sets"]["heldout"]
    assert held["identical"] and held["checked_against_target"] == 4
    assert held["old"]["answers"] == held["new"]["answers"] == 4
    assert held["new"]["acceptance_rate"] is not None
    assert json.loads((out / "manifest.json").read_text())["heldout_acceptance"] is not None
    # A head beside a draft is not a comparison.
    mixed = CliRunner().invoke(
        main,
        ["draft", "evaluate", str(head), str(tiny_models["draft"]), "--dataset", str(ds),
         "--target", str(tiny_models["target"])],
    )  # fmt: skip
    assert mixed.exit_code == 1 and "is an EAGLE head and the other a draft" in mixed.output


def test_eagle_head_of_another_width_is_refused_before_training(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    ds = _tiny_dataset(tiny_models, tmp_path / "ds", n=6)
    head = _tiny_head(tiny_models, tmp_path / "wide", hidden_size=96, intermediate_size=128)
    result = CliRunner().invoke(
        main,
        ["draft", "tune", "--dataset", str(ds), "--eagle", str(head), "--target",
         str(tiny_models["target"]), "--out", str(tmp_path / "o"), "--run-dir", str(tmp_path / "r")],
    )  # fmt: skip
    assert result.exit_code == 1
    assert "hidden size 96, the target has 64" in result.output
    assert not (tmp_path / "r").exists() and not (tmp_path / "o").exists()
    # A draft model given as a head is named as such, also before anything runs.
    not_head = CliRunner().invoke(
        main,
        ["draft", "tune", "--dataset", str(ds), "--eagle", str(tiny_models["draft"]), "--target",
         str(tiny_models["target"]), "--out", str(tmp_path / "o"), "--run-dir", str(tmp_path / "r")],
    )  # fmt: skip
    assert not_head.exit_code == 1 and "not an EAGLE head" in not_head.output
    assert not (tmp_path / "r").exists()
    # A run dir whose features were recorded from other answers is not resumed on these.
    good = _tiny_head(tiny_models, tmp_path / "eagle")
    args = ["draft", "tune", "--eagle", str(good), "--target", str(tiny_models["target"]),
            "--run-dir", str(tmp_path / "r"), "--max-steps", "1", "--no-progress"]  # fmt: skip
    first = CliRunner().invoke(main, [*args, "--dataset", str(ds), "--out", str(tmp_path / "o1")])
    assert first.exit_code == 0, first.output
    other = _tiny_dataset(tiny_models, tmp_path / "ds2", n=7)
    again = CliRunner().invoke(
        main, [*args, "--dataset", str(other), "--out", str(tmp_path / "o2")]
    )
    assert again.exit_code == 1 and "recorded features are of other answers" in again.output
