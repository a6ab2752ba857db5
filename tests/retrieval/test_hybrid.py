"""Hybrid search on real parts: MiniLM, FAISS, Tantivy, SQLite and PostgreSQL.

Exact names are found, every mode is selectable, both legs follow ingest, re-upload and delete,
a second host (own index dir) serves identical hits without analysing text, and bad questions
(punctuation, function words, query syntax, huge tokens) get dense results, never an error.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select, update

from retrieval import QueryError, RetrievalService
from retrieval.backfill import backfill_terms
from retrieval.records import Chunk, Document
from tests.retrieval.conftest import ServiceFactory
from tests.retrieval.docs import ENGINES, FRUIT, write

# Four passages on one theme (configuring a service); one names a setting no other has.
SETTINGS_DOCS = {
    "paths.md": "# Start-up paths\n\nThe interpreter adds the script's folder to the module "
    "search path unless PYTHONSAFEPATH is set, which keeps that folder out.",
    "env.md": "# Environment\n\nEnvironment variables change how the program starts: its "
    "search paths, its encoding and whether it writes bytecode files.",
    "config.md": "# Configuration\n\nSettings are read from a configuration file at start-up; "
    "each one changes where the service looks for its modules and data.",
    "hooks.md": "# Hooks\n\nThe reset_peak_memory_counters() hook and the "
    "sys.flags.safe_path flag are read when the interpreter starts.",
}


def ingest_settings(service: RetrievalService, root: Path, collection: str, tenant: str) -> None:
    paths = [write(root / name, text) for name, text in SETTINGS_DOCS.items()]
    paths += [write(root / "fruit.md", FRUIT), write(root / "engines.md", ENGINES)]
    report = service.ingest(paths, collection=collection, tenant=tenant)
    assert report.ok, report.to_dict()


def names_of(hits: list) -> list[str]:  # type: ignore[type-arg]
    return [Path(h.document).name for h in hits]


@pytest.mark.parametrize(
    ("question", "expected"),
    [
        ("PYTHONSAFEPATH", "paths.md"),
        ("What is PYTHONSAFEPATH used for?", "paths.md"),
        ("reset_peak_memory_counters", "hooks.md"),
        ("sys.flags.safe_path", "hooks.md"),
    ],
)
def test_exact_names_rank_first_in_the_lexical_leg_and_make_the_hybrid_top_two(
    make_service: ServiceFactory, names: dict[str, str], tmp_path: Path, question: str,
    expected: str,
) -> None:  # fmt: skip
    service = make_service()
    ingest_settings(service, tmp_path / "kb", names["collection"], names["a"])
    lexical = service.search(question, collection=names["collection"], tenant=names["a"],
                             top_k=3, mode="lexical")  # fmt: skip
    assert names_of(lexical)[0] == expected and lexical[0].lexical_rank == 1
    assert all(h.dense_rank is None for h in lexical)
    hybrid = service.search(question, collection=names["collection"], tenant=names["a"],
                            top_k=2)  # fmt: skip
    assert expected in names_of(hybrid)
    hit = hybrid[names_of(hybrid).index(expected)]
    assert hit.lexical_rank == 1 and hit.dense_rank is not None  # both legs saw it
    dense = service.search(question, collection=names["collection"], tenant=names["a"],
                           top_k=3, mode="dense")  # fmt: skip
    assert all(h.lexical_rank is None for h in dense)
    assert dense[0].score == dense[0].dense_score  # dense mode keeps cosine scores


def test_both_legs_follow_reupload_and_delete_and_a_new_host_agrees(
    make_service: ServiceFactory, names: dict[str, str], tmp_path: Path
) -> None:
    c, t = names["collection"], names["a"]
    writer = make_service()
    ingest_settings(writer, tmp_path / "kb", c, t)
    reader = RetrievalService(writer.session_factory, tmp_path / "host-b", writer.embedder)
    assert names_of(reader.search("PYTHONSAFEPATH", collection=c, tenant=t, mode="lexical"))[
        0
    ] == "paths.md"  # fmt: skip

    # Re-upload: the name moves to another file; the old passage is gone from both legs.
    write(tmp_path / "kb" / "paths.md", "# Start-up paths\n\nThe folder is added first.")
    write(tmp_path / "kb" / "config.md", SETTINGS_DOCS["config.md"] + " See PYTHONSAFEPATH.")
    writer.ingest([tmp_path / "kb"], collection=c, tenant=t)
    # Delete: the hooks file and its names disappear from both legs.
    assert writer.delete(str(tmp_path / "kb" / "hooks.md"), collection=c, tenant=t)

    fresh = RetrievalService(writer.session_factory, tmp_path / "host-c", writer.embedder)
    for service in (writer, reader, fresh):  # writer: own copy; reader: replayed; fresh: built
        assert names_of(service.search("PYTHONSAFEPATH", collection=c, tenant=t,
                                       mode="lexical")) == ["config.md"]  # fmt: skip
        assert service.search("reset_peak_memory_counters", collection=c, tenant=t,
                              mode="lexical") == []  # fmt: skip
        hybrid = service.search("reset_peak_memory_counters", collection=c, tenant=t, top_k=5)
        assert "hooks.md" not in names_of(hybrid)
    assert reader.indexes.sources["delta"] >= 1  # FAISS caught up from the change log
    for question in ("PYTHONSAFEPATH", "How do governors control engine speed?", "?!"):
        for mode in ("hybrid", "dense", "lexical"):
            got = [
                [
                    h.to_dict()
                    for h in s.search(question, collection=c, tenant=t, top_k=4, mode=mode)
                ]  # type: ignore[arg-type]  # fmt: skip
                for s in (writer, reader, fresh)
            ]
            # The hosts that built their lexical index from stored terms agree exactly.
            assert got[1] == got[2], (question, mode)
            # The writer applied the delete to its index: the removed chunk stays in its BM25
            # statistics (bounded: MAX_REMOVED_FRACTION), so only its BM25 scores may differ;
            # hits, ranks and fused scores (ranks alone) do not.
            for hit in got[0] + got[2]:
                hit.pop("lexical_score")
                if mode == "lexical":
                    hit.pop("score")
            assert got[0] == got[2], (question, mode)


def test_tenants_are_scoped_identically_in_both_legs(
    make_service: ServiceFactory, names: dict[str, str], tmp_path: Path
) -> None:
    service = make_service()
    ingest_settings(service, tmp_path / "kb", names["collection"], names["a"])
    other = write(tmp_path / "b" / "other.md", "# Other\n\nNothing about start-up here at all.")
    service.ingest([other], collection=names["collection"], tenant=names["b"])
    for mode in ("hybrid", "lexical", "dense"):
        hits = service.search("PYTHONSAFEPATH", collection=names["collection"],
                              tenant=names["b"], top_k=5, mode=mode)  # type: ignore[arg-type]  # fmt: skip
        assert names_of(hits) == ([] if mode == "lexical" else ["other.md"])


@pytest.mark.parametrize(
    "question",
    ["?!?", "... --- ***", "the of and", "What is it?", '"', "*", ":", "AND", "NEAR(", "'",
     '"*: AND NEAR( \' OR x:"y', "'; DROP TABLE chunks; --", "x" * 1999],
)  # fmt: skip
def test_bad_questions_get_dense_results_and_are_never_query_syntax(
    make_service: ServiceFactory, names: dict[str, str], tmp_path: Path, question: str
) -> None:
    service = make_service()
    c, t = names["collection"], names["a"]
    ingest_settings(service, tmp_path / "kb", c, t)
    hybrid = service.search(question, collection=c, tenant=t, top_k=3)
    dense = service.search(question, collection=c, tenant=t, top_k=3, mode="dense")
    assert len(hybrid) == 3 and len(dense) == 3
    lexical = service.search(question, collection=c, tenant=t, top_k=3, mode="lexical")
    if not lexical:  # no term matched: the hybrid ranking is the dense one
        assert [h.chunk_id for h in hybrid] == [h.chunk_id for h in dense]
    assert service.search("PYTHONSAFEPATH", collection=c, tenant=t, mode="lexical")  # intact


def test_a_huge_token_in_a_passage_is_bounded_and_still_found(
    make_service: ServiceFactory, names: dict[str, str], tmp_path: Path
) -> None:
    service = make_service()
    token = "A" * 64 + "tail" * 5000
    doc = write(tmp_path / "blob.md", f"# Blob\n\nThe key is {token} and nothing else.")
    service.ingest([doc, write(tmp_path / "fruit.md", FRUIT)], collection=names["collection"])
    hits = service.search(token[:1999], collection=names["collection"], mode="lexical")
    assert names_of(hits) == ["blob.md"]


# A passage about descaling that never says "vinegar", beside a long one that holds all three
# words once: both legs rank the first higher.
KETTLE_DOCS = {
    "descaling.md": "# Descaling a kettle\n\nDescaling a kettle removes the scale that hard "
    "water leaves. Descaling the kettle every month keeps it quiet and fast; descaling tablets "
    "dissolve the scale in the kettle overnight.",
    "kitchen.md": "# Kitchen cleaning\n\nWipe the counters daily and clean the oven racks in "
    "hot soapy water. The fridge shelves come out for washing, and the sink drain wants baking "
    "soda once a week. For the kettle, descaling with white vinegar works as well as any "
    "tablet. Floors last: sweep, then mop with warm water.",
    "vinegar.md": "# Vinegar\n\nWhite vinegar is dilute acetic acid, made by fermenting "
    "alcohol; it pickles vegetables and dresses salads.",
    "tea.md": "# Tea\n\nBoil fresh water, warm the pot, and steep black tea for four minutes.",
}


def test_a_passage_holding_every_term_of_the_question_is_lifted_by_the_bonus(
    make_service: ServiceFactory, names: dict[str, str], tmp_path: Path
) -> None:
    c, t = names["collection"], names["a"]
    plain = make_service(all_terms_bonus=0.0)
    paths = [write(tmp_path / name, text) for name, text in KETTLE_DOCS.items()]
    assert plain.ingest(paths, collection=c, tenant=t).ok
    lifted = make_service()  # the default bonus, on the same database and index files
    question = "What about kettle descaling vinegar?"
    before = plain.search(question, collection=c, tenant=t, top_k=4)
    after = lifted.search(question, collection=c, tenant=t, top_k=4)
    assert names_of(before)[:2] == ["descaling.md", "kitchen.md"]  # best in both legs
    assert before[0].dense_rank == 1 and before[0].lexical_rank == 1
    assert names_of(after)[:2] == ["kitchen.md", "descaling.md"]
    old = {h.chunk_id: h.score for h in before}
    assert after[0].score == pytest.approx(old[after[0].chunk_id] + lifted.all_terms_bonus)
    assert all(h.score == old[h.chunk_id] for h in after[1:])  # the others keep their scores
    # No passage holds "descale" (no stemming): nothing is lifted, the ranking is the fusion's.
    other = "How do I descale a kettle with vinegar?"
    assert plain.search(other, collection=c, tenant=t) == lifted.search(other, collection=c,
                                                                         tenant=t)  # fmt: skip
    # Dense and lexical modes are left as they were.
    for mode in ("dense", "lexical"):
        assert plain.search(question, collection=c, tenant=t, mode=mode) == lifted.search(
            question, collection=c, tenant=t, mode=mode
        )


def test_a_negative_all_terms_bonus_is_refused_by_name(make_service: ServiceFactory) -> None:
    for bad in (-0.5, float("nan")):
        with pytest.raises(ValueError, match="all_terms_bonus must be 0 or more"):
            make_service(all_terms_bonus=bad)


def test_unknown_mode_is_refused_by_name(make_service: ServiceFactory, tmp_path: Path) -> None:
    service = make_service()
    service.ingest([write(tmp_path / "fruit.md", FRUIT)], collection="kb")
    with pytest.raises(QueryError, match="search mode must be one of hybrid, dense, lexical"):
        service.search("apples", collection="kb", mode="fuzzy")  # type: ignore[arg-type]


def test_chunks_without_stored_terms_are_analysed_then_backfilled(
    make_service: ServiceFactory, names: dict[str, str], tmp_path: Path
) -> None:
    """Chunks stored before migration 0008 (NULL terms): a new host analyses their text and
    finds them; ``backfill_terms`` stores the same terms an ingest would have."""
    c, t = names["collection"], names["a"]
    service = make_service()
    ingest_settings(service, tmp_path / "kb", c, t)
    with service.session_factory() as session, session.begin():
        stored = dict(session.execute(select(Chunk.id, Chunk.lexical_terms).join(Document).where(
            Document.tenant == t, Document.collection == c)).all())  # fmt: skip
        session.execute(update(Chunk).where(Chunk.id.in_(list(stored))).values(lexical_terms=None))
    fresh = RetrievalService(service.session_factory, tmp_path / "host-b", service.embedder)
    assert names_of(fresh.search("PYTHONSAFEPATH", collection=c, tenant=t, mode="lexical"))[
        0
    ] == "paths.md"  # fmt: skip
    seen: list[int] = []
    assert backfill_terms(service.session_factory, t, c, progress=seen.append) == len(stored)
    assert sum(seen) == len(stored)
    with service.session_factory() as session:
        again = dict(session.execute(select(Chunk.id, Chunk.lexical_terms).where(
            Chunk.id.in_(list(stored)))).all())  # fmt: skip
    assert again == stored


def test_lexical_snapshots_stay_readable_and_removals_past_the_bound_rebuild(
    tmp_path: Path,
) -> None:
    """An older snapshot keeps answering while a newer one is written (its own directory);
    past MAX_REMOVED_FRACTION removed documents ``changed`` declines (the host builds afresh),
    and an index held in memory only never changes."""
    import numpy as np

    from retrieval.lexical import MAX_REMOVED_FRACTION, LexicalIndex

    ids = list(range(1, 101))
    terms = [f"common doc{i}" for i in ids]
    first = LexicalIndex.build(ids, terms, directory=tmp_path / "v1", version=1)
    second = first.changed(np.asarray([1, 2], dtype="int64"), np.asarray([101], dtype="int64"),
                           ["common doc101"], tmp_path / "v2", 2)  # fmt: skip
    assert second is not None and second.ntotal == 99
    assert [c for c, _ in first.search(["doc1"], 5)] == [1]  # the old snapshot is unchanged
    assert second.search(["doc1"], 5) == [] and [c for c, _ in second.search(["doc101"], 5)] == [
        101
    ]
    memory_only = LexicalIndex.build(ids, terms)
    assert memory_only.changed(np.asarray([3]), np.zeros(0, "int64"), [], tmp_path / "m", 2) is None
    many = np.arange(3, 3 + int(MAX_REMOVED_FRACTION * 100) + 1, dtype="int64")
    assert second.changed(many, np.zeros(0, "int64"), [], tmp_path / "v3", 3) is None
    assert len(second.search(["common"], 200)) == 99  # declined: nothing was applied
