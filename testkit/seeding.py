"""Synthetic stored traffic for the audit benchmark and the audit tests, inserted in bulk.

Rows are drawn from a seeded generator and returned as plain arrays, so a test can compute what
the report must say (percentiles with numpy) without reading the database back.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import Engine, insert, select

from app.audit.records import ShadowRun
from app.db.models import Answer, AnswerSource, GenerationStatsRecord, Query, Tenant

TENANTS = ("acme", "globex")
COLLECTIONS = ("docs", "faq")
METHODS = ("draft_model", "ngram", "none")
PAIRS = ("target-a+draft-a", "target-b+draft-b")


@dataclass
class Seeded:
    """What was inserted: one entry per query, in insertion order."""

    ids: list[uuid.UUID] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)

    def column(self, name: str, **where: Any) -> np.ndarray:
        """The values of ``name`` (None as NaN) over the rows matching every ``where`` item."""
        vals = [r.get(name) for r in self.rows if all(r.get(k) == v for k, v in where.items())]
        return np.array([np.nan if v is None else v for v in vals], dtype=float)


def _tenant_ids(engine: Engine) -> dict[str, int]:
    with engine.begin() as conn:
        have = dict(conn.execute(select(Tenant.name, Tenant.id)).all())
        for name in TENANTS:
            if name not in have:
                conn.execute(insert(Tenant).values(name=name))
        return dict(conn.execute(select(Tenant.name, Tenant.id)).all())


def seed(
    engine: Engine,
    n: int,
    *,
    start: datetime,
    span: timedelta,
    seed: int = 0,
    failed_share: float = 0.05,
    shadow_share: float = 0.0,
    mismatch_every: int = 0,
    accept_p: float = 0.7,
    latency_scale: float = 1.0,
    chunk: int = 5000,
) -> Seeded:
    """Insert ``n`` queries queued uniformly in ``[start, start + span)`` with answers and stats.

    Failed queries have no answer or stats. ``shadow_share`` of speculative answers get a done
    shadow baseline; every ``mismatch_every``-th of those differs by one token (0: none differ).
    """
    rng = np.random.default_rng(seed)
    # Load figures from a stream of their own, so the other columns stay what they were.
    load_rng = np.random.default_rng(seed + 10_000)
    cache_rng = np.random.default_rng(seed + 20_000)  # prompt lengths and prefix-cache hits
    tenants = _tenant_ids(engine)
    out = Seeded()
    shadows = 0
    for lo in range(0, n, chunk):
        qrows, arows, srows, shrows, srcrows = [], [], [], [], []
        for _ in range(lo, min(n, lo + chunk)):
            qid = uuid.uuid4()
            tenant = TENANTS[rng.integers(len(TENANTS))]
            collection = COLLECTIONS[rng.integers(len(COLLECTIONS))]
            method = METHODS[rng.integers(len(METHODS))]
            pair = PAIRS[rng.integers(len(PAIRS))]
            k = 4
            queued = start + timedelta(seconds=float(rng.uniform(0, span.total_seconds())))
            failed = rng.random() < failed_share
            row: dict[str, Any] = {
                "tenant": tenant,
                "collection": collection,
                "method": method,
                "model_pair": None if failed else pair,
                "status": "failed" if failed else "succeeded",
                "queued_at": queued,
            }
            qrows.append(
                {
                    "id": qid,
                    "tenant_id": tenants[tenant],
                    "collection": collection,
                    "question": "q",
                    "params": {"method": method, "num_speculative_tokens": k, "max_tokens": 64},
                    "status": row["status"],
                    "queue": "answer",
                    "queued_at": queued,
                    "attempts": 1,
                }
            )
            if not failed:
                out_tokens = int(rng.integers(8, 64))
                prompt_tokens = int(cache_rng.integers(64, 1024))
                # Some rows predate migration 0010 (null); of the rest, most reuse a prefix.
                cached = (
                    None if cache_rng.random() < 0.1 else int(prompt_tokens * cache_rng.random())
                )
                if method == "none":
                    drafts, per_pos = 0, [0] * 0
                else:
                    drafts = int(rng.integers(2, 16))
                    # Geometric acceptance: position p is accepted only if p-1 was.
                    per_pos = [0] * k
                    for _ in range(drafts):
                        for p in range(k):
                            if rng.random() >= accept_p:
                                break
                            per_pos[p] += 1
                accepted = sum(per_pos)
                lat = {
                    "queue_ms": float(rng.exponential(50 * latency_scale)),
                    "retrieval_ms": float(rng.gamma(2.0, 5.0 * latency_scale)),
                    "ttft_ms": float(rng.gamma(3.0, 10.0 * latency_scale)),
                    "generation_ms": float(rng.gamma(4.0, 100.0 * latency_scale)),
                }
                lat["total_ms"] = sum(lat.values()) + float(rng.uniform(0, 5))
                stats = {
                    "query_id": qid,
                    "method": method,
                    "num_speculative_tokens": None if method == "none" else str(k),
                    "num_output_tokens": out_tokens,
                    "num_target_forwards": max(1, out_tokens - accepted),
                    "num_drafts": drafts,
                    "num_draft_tokens": drafts * k,
                    "num_accepted_tokens": accepted,
                    "accepted_per_position": per_pos,
                    "acceptance_rate": accepted / (drafts * k) if drafts else None,
                    "mean_acceptance_length": 1 + accepted / drafts if drafts else None,
                    # Some rows predate migration 0006 (null), the rest carry load and chosen k.
                    "mean_batch_size": (
                        None if load_rng.random() < 0.1 else float(load_rng.uniform(1.0, 20.0))
                    ),
                    "mean_chosen_k": (
                        None if load_rng.random() < 0.2 else float(load_rng.uniform(0.0, 4.0))
                    ),
                    "num_cached_prompt_tokens": cached,
                    # Null: rows from before migration 0015 (no extra draw: other figures stay).
                    "dtype": ("float32", "bfloat16", None)[out_tokens % 3],
                    # Null: rows from before migration 0011.
                    "prompt_format": ("chat", "raw", None)[prompt_tokens % 3],
                    **lat,
                }
                srows.append(stats)
                arows.append(
                    {"query_id": qid, "text": "a", "model_pair": pair, "engine": "torch",
                     "prompt_tokens": prompt_tokens}
                )  # fmt: skip
                row["prompt_tokens"] = prompt_tokens
                srcrows.append(qid)
                row.update(stats)
                if method != "none" and rng.random() < shadow_share:
                    shadows += 1
                    bad = mismatch_every and shadows % mismatch_every == 0
                    base_ms = float(lat["generation_ms"] * rng.uniform(0.8, 2.5))
                    shrows.append(
                        {
                            "query_id": qid,
                            "status": "done",
                            "max_new_tokens": 64,
                            "prompt_token_ids": [1, 2, 3],
                            "speculative_token_ids": [5, 6, 7],
                            "baseline_token_ids": [5, 9, 7] if bad else [5, 6, 7],
                            "baseline_generation_ms": base_ms,
                            "mismatched_tokens": 1 if bad else 0,
                        }
                    )
                    row.update(baseline_generation_ms=base_ms, mismatched_tokens=int(bool(bad)))
            out.ids.append(qid)
            out.rows.append(row)
        with engine.begin() as conn:
            conn.execute(insert(Query), qrows)
            if arows:
                conn.execute(insert(Answer), arows)
                answer_ids = dict(
                    conn.execute(
                        select(Answer.query_id, Answer.id).where(Answer.query_id.in_(srcrows))
                    ).all()
                )
                # Two sources per answer: joining them would double-count, the report must not.
                conn.execute(
                    insert(AnswerSource),
                    [
                        {"answer_id": answer_ids[q], "rank": r, "document": "d", "chunk_id": r,
                         "score": 0.5, "text": "t"}
                        for q in srcrows
                        for r in (1, 2)
                    ],
                )  # fmt: skip
                conn.execute(insert(GenerationStatsRecord), srows)
            if shrows:
                conn.execute(insert(ShadowRun), shrows)
    return out
