"""What a one-shot ``specrag ask --local`` records as its generation time, cold vs warmed first.

Each round starts two fresh processes on the same data dir (the demo corpus ingested there):
``cold`` answers at once, as ``ask --local`` did before (the torch engine measures its step-cost
tables inside the first batch); ``warm`` runs ``warm_one_shot`` first, as ``ask --local`` does
now. Each then answers a second question in the same process (a warmed engine's figure).
Prints the recorded generation and total ms of both answers, per round, and the medians.

    .venv/bin/python benchmarks/ask_local.py --data-dir DIR [--rounds 3] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

QUESTIONS = ("What does the assert statement do?", "How do I delete a name?")


def one(mode: str, max_tokens: int) -> dict[str, Any]:
    """In this process: (optionally warm,) answer two questions; their stats."""
    from app.commands.ask import warm_one_shot
    from app.db import prepare
    from app.lifecycle.queries import create_query, get_or_create_tenant, validate_request
    from app.pipeline import answer_query
    from app.resources import Resources
    from app.settings import Settings

    settings = Settings()
    _, factory = prepare(settings)
    resources = Resources(settings, factory)
    if mode == "warm":  # as ask --local warms for its question (here: the first)
        first = validate_request(
            settings, {"question": QUESTIONS[0], "collection": "demo", "max_tokens": max_tokens}
        )
        with factory() as session:
            tenant_id = get_or_create_tenant(session, "default").id
        warm_one_shot(resources, first, tenant_id)
    out = {}
    for n, question in enumerate(QUESTIONS):
        req = validate_request(
            settings, {"question": question, "collection": "demo", "max_tokens": max_tokens}
        )
        with factory() as session:
            tenant = get_or_create_tenant(session, "default")
            query, _ = create_query(session, tenant, req, source="benchmark")
        answer_query(resources, query.id)
        with factory() as session:
            from app.db import Query

            stats = session.get(Query, query.id).stats  # type: ignore[union-attr]
            out[f"answer{n + 1}"] = {
                "tokens": stats.num_output_tokens,
                "generation_ms": stats.generation_ms,
                "total_ms": stats.total_ms,
            }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data-dir", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--one", choices=("cold", "warm"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.max_tokens)))
        return
    env = {**os.environ, "SPECRAG_DATA_DIR": str(args.data_dir), "HF_HUB_OFFLINE": "1"}
    rows: dict[str, list[dict[str, Any]]] = {"cold": [], "warm": []}
    print("| round | mode | 1st answer gen ms | 1st total ms | 2nd answer gen ms | tokens |")
    print("|---|---|---|---|---|---|")
    for r in range(args.rounds):
        for mode in ("cold", "warm"):
            cmd = [sys.executable, __file__, "--one", mode, "--max-tokens", str(args.max_tokens),
                   "--data-dir", str(args.data_dir)]  # fmt: skip
            res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            data = json.loads(res.stdout.strip().splitlines()[-1])
            rows[mode].append(data)
            a, b = data["answer1"], data["answer2"]
            print(f"| {r + 1} | {mode} | {a['generation_ms']:,.0f} | {a['total_ms']:,.0f} | "
                  f"{b['generation_ms']:,.0f} | {a['tokens']} / {b['tokens']} |", flush=True)  # fmt: skip
    for mode, data in rows.items():
        first = statistics.median(d["answer1"]["generation_ms"] for d in data)
        second = statistics.median(d["answer2"]["generation_ms"] for d in data)
        print(f"median {mode}: first answer {first:,.0f} ms, second answer {second:,.0f} ms")


if __name__ == "__main__":
    main()
