"""Method ``suffix`` on repeating tenant traffic, side by side with draft_model, ngram and none.

    python -m benchmarks.suffix_traffic --questions 300 --fresh 30 --out runs/suffix.json

Three tenants, each with its own slice of the demo corpus, ask questions about their documents,
interleaved; about half the asks (``--repeat``) repeat or paraphrase one of the same tenant's
earlier questions. Then a fresh set: a fourth tenant, with no history, asks new questions. Every
ask goes through one live worker (Redis, PostgreSQL, the shipped demo pair, warmed), one query at
a time, each method in a tenant of its own (so trees and prefix caches learn only from that
method's own run) and the methods in a rotated order per ask. The trees start empty and learn
from the run itself. Then the warm case: the worker restarts (its trees rebuilt from the stored
answers) and ``suffix`` asks the same trace again.

The worker's prefix cache holds the run's working set, as a deployment sized for its traffic
would: 2 GiB per method (``--prefix-cache-mb``, default 8192 for the four). A method's tenants
ask about 180 distinct prompts of about 600 tokens over the 330-ask trace, and one token's KV of
the demo pair takes 19,968 bytes in bfloat16 (target and draft model: the pool keeps both), so
one prompt takes about 12 MB and a method's prompts about 2 GiB; the pool evicts the least
recently used blocks, and questions asked early and never again leave first. Nothing is cached
ahead of the run: a repeat reuses what its earlier ask's prefill kept. ``--prefix-cache-mb 1024``
gives the shape of one worker at the service's 256 MB per method, which holds about 22 asks of
the four methods: half the repeats then miss and pay a whole prefill. In float32 a prompt takes
twice the bytes. Each ask's prompt length and cached prompt tokens are in ``per_ask``, the count
of repeats whose prompt came mostly from the cache in ``repeat_prefix_hits``.

Reported per method and per kind of ask (``new``, ``repeat``, ``fresh``): mean acceptance length
(1 + accepted / drafts, summed), generation tokens/s (output tokens over generation_ms, summed;
the goals' figure), decode tokens/s (tokens after the first over generation_ms less ttft_ms),
and over the whole trace p50 / p95 of the stored total latency; whether every answer equals
``none``'s; the goals' ratios. Needs PostgreSQL on 127.0.0.1:5432 and ``redis-server``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from app.audit.stats import quantile
from benchmarks.support import DEMO, REPO, RedisServer, goal, note, scratch_database, write_result
from generation.exactness import SLACK

GOALS = [
    goal("suffix", "Repeated asks through a worker: mean acceptance length suffix / draft_model",
         "repeat_mal_vs_draft_model", ">=", 2.0, "x"),
    goal("suffix", "Repeated asks: generation tokens/s suffix / none",
         "repeat_tps_vs_none", ">=", 3.0, "x"),
    goal("suffix", "Repeated asks: generation tokens/s suffix / draft_model",
         "repeat_tps_vs_draft_model", ">=", 1.5, "x"),
    goal("suffix", "Whole trace: p50 total latency suffix / draft_model",
         "trace_p50_vs_draft_model", "<=", 1.0, "x"),
    goal("suffix", "Whole trace: p95 total latency suffix / draft_model",
         "trace_p95_vs_draft_model", "<=", 1.0, "x"),
    goal("suffix", "Whole trace: p50 total latency suffix / ngram",
         "trace_p50_vs_ngram", "<=", 1.0, "x"),
    goal("suffix", "Whole trace: p95 total latency suffix / ngram",
         "trace_p95_vs_ngram", "<=", 1.0, "x"),
    goal("suffix", "Fresh asks (a tenant with no history): generation tokens/s suffix / ngram",
         "fresh_tps_vs_ngram", ">=", 0.95, "x"),
    goal("suffix", "Greedy answers through a worker identical to none's on every ask, every method",
         "identical_to_none", "==", True),
]  # fmt: skip
"""The rows of docs/results.md this benchmark backs (``write_result`` reads them)."""
FIGURES = {
    "repeat_mal_vs_draft_model": "repeat MAL suffix / draft_model >= 2",
    "repeat_tps_vs_none": "repeat tokens/s suffix / none >= 3",
    "repeat_tps_vs_draft_model": "repeat tokens/s suffix / draft_model >= 1.5",
    "trace_p50_vs_draft_model": "trace p50 suffix / draft_model < 1",
    "trace_p95_vs_draft_model": "trace p95 suffix / draft_model < 1",
    "trace_p50_vs_ngram": "trace p50 suffix / ngram < 1",
    "trace_p95_vs_ngram": "trace p95 suffix / ngram < 1",
    "fresh_tps_vs_ngram": "fresh tokens/s suffix / ngram >= 0.95",
}
"""Each goal's figure and the key of the run's ``goals`` ratio it is."""

METHODS = ("suffix", "draft_model", "ngram", "none")
PARAPHRASES = ("{q}", "Quick question: {q}", "Please answer this: {q}", "{lower}")
"""How a tenant asks an earlier question again: as it was, or reworded around it."""
TEMPLATES = ("What is {t}?", "How does {t} work?", "Explain {t}.", "When is {t} used?")


def topics(path: Path) -> list[str]:
    """The headings of one corpus file (its title first), as question topics."""
    heads = [ln.lstrip("#").strip() for ln in path.read_text().splitlines() if ln.startswith("#")]
    return [h.replace('"', "") for h in heads if 3 <= len(h) <= 80]


def build_trace(
    slices: list[list[Path]], n: int, fresh: int, repeat: float, seed: int
) -> list[dict[str, Any]]:
    """``n`` interleaved asks of tenants 0..2 (``repeat`` of them again an earlier question of
    the same tenant), then ``fresh`` new asks of tenant 3; each ``{tenant, question, kind}``, a
    repeat also its ``form`` (``exact`` or ``paraphrase``) and the question it repeats (``of``)."""
    rng = random.Random(seed)
    pools = []
    for files in slices:
        pool = [tpl.format(t=t) for f in files for t in topics(f) for tpl in TEMPLATES]
        rng.shuffle(pool)
        pools.append(pool)
    asked: list[list[str]] = [[], [], []]
    trace = []
    for _ in range(n):
        t = rng.randrange(3)
        if asked[t] and rng.random() < repeat:
            q = rng.choice(asked[t])
            form = rng.choice(PARAPHRASES)
            trace.append({"tenant": t, "question": form.format(q=q, lower=q.lower()),
                          "kind": "repeat", "form": "exact" if form == "{q}" else "paraphrase",
                          "of": q})  # fmt: skip
        else:
            q = pools[t].pop()
            asked[t].append(q)
            trace.append({"tenant": t, "question": q, "kind": "new"})
    trace += [{"tenant": 3, "question": pools[3].pop(), "kind": "fresh"} for _ in range(fresh)]
    return trace


def sums(views: list[dict[str, Any]]) -> dict[str, Any]:
    """Acceptance length, generation tokens/s and latency percentiles of some answers."""
    stats = [v["stats"] for v in views if v.get("status") == "succeeded"]
    drafts = sum(s["num_drafts"] or 0 for s in stats)
    accepted = sum(s["num_accepted_tokens"] or 0 for s in stats)
    gen_ms = sum(s["generation_ms"] for s in stats)
    totals = [s["total_ms"] for s in stats]
    decode_ms = sum(s["generation_ms"] - (s.get("ttft_ms") or 0.0) for s in stats)
    after_first = sum(max(s["num_output_tokens"] - 1, 0) for s in stats)
    return {
        "answers": len(stats),
        "failed": len(views) - len(stats),
        "mean_acceptance_length": 1 + accepted / drafts if drafts else None,
        "tokens_per_s": sum(s["num_output_tokens"] for s in stats) / gen_ms * 1000.0
        if gen_ms
        else None,
        "decode_tokens_per_s": after_first / decode_ms * 1000.0 if decode_ms > 0 else None,
        "ttft_ms_mean": sum(s.get("ttft_ms") or 0.0 for s in stats) / len(stats) if stats else None,
        "total_ms_p50": quantile(totals, 0.5),
        "total_ms_p95": quantile(totals, 0.95),
    }


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from app.db import Query, make_engine, make_session_factory
    from app.lifecycle.outbox import send_and_mark
    from app.lifecycle.queries import create_query, get_or_create_tenant, query_view, wait_for
    from app.requests import validate_request
    from app.resources import Resources
    from app.settings import Settings
    from benchmarks.support import start_worker
    from workers import create_celery, send_query
    from workers.process import settings_env

    files = sorted((REPO / "demo" / "corpus").glob("*.md"))
    random.Random(args.seed).shuffle(files)
    slices = [files[i * args.docs : (i + 1) * args.docs] for i in range(4)]
    trace = build_trace(slices, args.questions, args.fresh, args.repeat, args.seed)
    redis = RedisServer(work)
    redis.start()
    worker = None
    try:
        with scratch_database("specrag_suffix") as url:
            settings = Settings(
                data_dir=work / "data", database_url=url, broker_url=redis.url(0),
                device="cpu", dtype=args.dtype, worker_concurrency=1, torch_threads=args.threads,
                max_tokens_limit=args.max_tokens, eagle_model=None,
                max_speculative_tokens=max(args.k, args.suffix_k or 0, 8),
                prefix_cache_mb=args.prefix_cache_mb,
            )  # fmt: skip
            engine = make_engine(settings)
            sf = make_session_factory(engine)
            retrieval = Resources(settings, sf).retrieval
            note(f"ingesting {len(METHODS) * 4 + 1} tenant collections")
            for method in METHODS:
                for t, docs in enumerate(slices):
                    retrieval.ingest(docs, collection="demo", tenant=f"{method}-{t}")
            retrieval.ingest(files[-1:], collection="demo", tenant="warm-up")
            env = settings_env(settings)
            worker = start_worker(env, work / "worker.log", queues="answer", name="suffix")
            worker.wait_ready(timeout=600)
            celery = create_celery(settings)

            def ask(tenant: str, question: str, method: str) -> dict[str, Any]:
                k = args.suffix_k if method == "suffix" else args.k  # None: the service's
                body = {"question": question, "collection": "demo", "method": method,
                        "max_tokens": args.max_tokens, "num_speculative_tokens": k}  # fmt: skip
                request = validate_request(settings, body)
                with sf() as session:
                    owner = get_or_create_tenant(session, tenant)
                    query, _ = create_query(session, owner, request, source="benchmark")
                send_and_mark(sf, query.id, "answer", lambda q, name: send_query(celery, q, name))
                wait_for(sf, query.id, timeout=600, poll=0.02)
                with sf() as session:
                    view = query_view(session.get_one(Query, query.id))
                return json.loads(json.dumps(view, default=str))

            for method in METHODS:  # kernels and adaptive costs, in a tenant of its own
                ask("warm-up", "What is this document about?", method)
            load = [os.getloadavg()[0]]
            started = time.monotonic()
            cold: dict[str, list[dict[str, Any]]] = {m: [] for m in METHODS}
            # Past --stop-after minutes, the three tenants' asks stop where they are (the fresh
            # set still runs: its tenant learns only from itself); the result holds what ran.
            stop = started + args.stop_after * 60 if args.stop_after else None
            if args.stop_at:  # a UTC clock time, HH:MM (today)
                hours, minutes = (int(x) for x in args.stop_at.split(":"))
                now = time.gmtime()
                left = (hours * 60 + minutes) * 60 - (
                    now.tm_hour * 3600 + now.tm_min * 60 + now.tm_sec
                )
                stop = min(stop or float("inf"), started + left)
            ran: list[dict[str, Any]] = []
            for item in trace:
                if stop is not None and item["kind"] != "fresh" and time.monotonic() > stop:
                    continue
                i = len(ran)
                ran.append(item)
                shift = i % len(METHODS)
                for method in METHODS[shift:] + METHODS[:shift]:
                    view = ask(f"{method}-{item['tenant']}", item["question"], method)
                    cold[method].append(view)
                if (i + 1) % 20 == 0:
                    note(f"{i + 1}/{len(trace)} asks x {len(METHODS)} methods")
            cold_s = time.monotonic() - started
            if len(ran) < len(trace):
                note(f"stopped on time: {len(ran)} of {len(trace)} asks")
            trace = ran
            load.append(os.getloadavg()[0])
            worker.stop()
            note("warm case: a new worker, its trees rebuilt from the stored answers")
            worker = start_worker(env, work / "worker2.log", queues="answer", name="warm")
            worker.wait_ready(timeout=600)
            memory_line = next(
                (ln for ln in (work / "worker2.log").read_text().splitlines()
                 if "suffix memory:" in ln), ""
            )  # fmt: skip
            ask("warm-up", "What is this document about?", "suffix")
            warm = [ask(f"suffix-{it['tenant']}", it["question"], "suffix") for it in trace]
            load.append(os.getloadavg()[0])
            divergences = judge_divergences(sf, cold, warm, settings.dtype)
            add_prompt_lengths(sf, [*(v for views in cold.values() for v in views), *warm])
            worker.stop()  # before its database is dropped
            engine.dispose()
    finally:
        if worker is not None:
            worker.stop()
        redis.stop()
    result = summarise(trace, cold, warm, cold_s, memory_line)
    result["worker"] = {
        "shape": "one worker, the four methods side by side, each in tenants of its own",
        "prefix_cache_mb": args.prefix_cache_mb,
        "prefix_cache_mb_per_method": args.prefix_cache_mb / len(METHODS),
    }
    result["divergences"] = divergences
    result["load_1min"] = {"start": load[0], "after_cold": load[1], "end": load[-1]}
    return result


def summarise(
    trace: list[dict[str, Any]],
    cold: dict[str, list[dict[str, Any]]],
    warm: list[dict[str, Any]],
    cold_s: float,
    memory_line: str,
) -> dict[str, Any]:
    """Per method and kind of ask, the figures; the goals' ratios and verdicts."""
    kinds = ("new", "repeat", "fresh")
    table: dict[str, dict[str, Any]] = {}
    for method, views in [*cold.items(), ("suffix_warm", warm)]:
        table[method] = {"trace": sums(views)}
        for kind in kinds:
            table[method][kind] = sums([v for v, it in zip(views, trace, strict=True)
                                        if it["kind"] == kind])  # fmt: skip
        for form in ("exact", "paraphrase"):
            table[method][f"repeat_{form}"] = sums([v for v, it in zip(views, trace, strict=True)
                                                    if it.get("form") == form])  # fmt: skip
    none_answers = [v.get("answer") for v in cold["none"]]
    rows = per_ask(trace, cold, warm)
    identical = {
        m: sum(v.get("answer") == a for v, a in zip(views, none_answers, strict=True))
        for m, views in [*cold.items(), ("suffix_warm", warm)]
    }

    def ratio(a: str, b: str, kind: str, field: str) -> float | None:
        x, y = table[a][kind][field], table[b][kind][field]
        return x / y if x and y else None

    goals = {
        "repeat MAL suffix / draft_model >= 2": ratio("suffix", "draft_model", "repeat",
                                                      "mean_acceptance_length"),
        "repeat tokens/s suffix / none >= 3": ratio("suffix", "none", "repeat", "tokens_per_s"),
        "repeat tokens/s suffix / draft_model >= 1.5": ratio("suffix", "draft_model", "repeat",
                                                            "tokens_per_s"),
        "fresh tokens/s suffix / ngram >= 0.95": ratio("suffix", "ngram", "fresh", "tokens_per_s"),
        "trace p50 suffix / draft_model < 1": ratio("suffix", "draft_model", "trace",
                                                    "total_ms_p50"),
        "trace p95 suffix / draft_model < 1": ratio("suffix", "draft_model", "trace",
                                                    "total_ms_p95"),
        "trace p50 suffix / ngram < 1": ratio("suffix", "ngram", "trace", "total_ms_p50"),
        "trace p95 suffix / ngram < 1": ratio("suffix", "ngram", "trace", "total_ms_p95"),
    }  # fmt: skip
    met = {}
    for name, value in goals.items():
        bound = float(re.findall(r"[\d.]+$", name)[0])
        met[name] = value is not None and (value < bound if "<" in name else value >= bound)
    return {
        "asks": {k: sum(it["kind"] == k for it in trace) for k in kinds},
        "repeat_forms": {
            f: sum(it.get("form") == f for it in trace) for f in ("exact", "paraphrase")
        },  # fmt: skip
        "per_ask": rows,
        "repeat_prefix_hits": {m: prefix_hits(rows, m) for m in [*cold, "suffix_warm"]},
        "cold_run_s": cold_s,
        "methods": table,
        "identical_to_none": identical,
        "goals": goals,
        "met": met,
        "warm_worker_memory_line": memory_line.split("suffix memory:")[-1].strip(),
        "host": os.uname().machine,
    }


def add_prompt_lengths(sf: Any, views: list[dict[str, Any]]) -> None:
    """Set each view's ``prompt_tokens`` from its stored prompt ids (None where none are)."""
    from app.drafts.records import AnswerTokens

    with sf() as session:
        rows = session.query(AnswerTokens.query_id, AnswerTokens.prompt_token_ids).all()
    lengths = {str(q): len(ids) for q, ids in rows}
    for view in views:
        view["prompt_tokens"] = lengths.get(str(view.get("id")))


def prefix_hits(rows: list[dict[str, Any]], method: str) -> dict[str, int]:
    """Of the repeated asks, how many ``method`` prefilled mostly from the prefix cache (at
    least half their prompt's tokens cached), how many not, and how many are unknown."""
    hits = misses = unknown = 0
    for row in rows:
        if row["kind"] != "repeat":
            continue
        cell = row[method]
        if not cell.get("prompt_tokens") or cell.get("cached_prompt_tokens") is None:
            unknown += 1
        elif cell["cached_prompt_tokens"] * 2 >= cell["prompt_tokens"]:
            hits += 1
        else:
            misses += 1
    return {"hits": hits, "misses": misses, "unknown": unknown}


def judge_divergences(
    sf: Any, cold: dict[str, list[dict[str, Any]]], warm: list[dict[str, Any]], dtype: str
) -> list[dict[str, Any]]:
    """Every answer whose greedy tokens differ from ``none``'s to the same ask, judged on the
    target as the worker ran it (generation/exactness.py): where they first differ, ``none``'s
    top-2 logit gap against the rounding between one-token and verification-shaped passes. In
    float32 any divergence is a bug; in bfloat16 one is excused only at such a near-tie."""
    from app.drafts.records import AnswerTokens
    from generation import SpeculativeEngine
    from generation.exactness import check_greedy
    from generation.model.dtypes import resolve_dtype

    def ids(query_id: str) -> tuple[list[int], list[int]] | None:
        with sf() as session:
            row = session.query(AnswerTokens).filter_by(query_id=query_id).one_or_none()
            return None if row is None else (row.prompt_token_ids, row.output_token_ids)

    pairs = [(m, i, v, cold["none"][i]) for m, views in [*cold.items(), ("suffix_warm", warm)]
             for i, v in enumerate(views) if m != "none"
             and v.get("answer") != cold["none"][i].get("answer")]  # fmt: skip
    if not pairs:
        return []
    name = resolve_dtype(dtype, "cpu")
    target = SpeculativeEngine.from_pretrained(DEMO / "target", DEMO / "draft", dtype=name)
    found = []
    for method, i, view, ref in pairs:
        mine, theirs = ids(view["id"]), ids(ref["id"])
        if mine is None or theirs is None or mine[0] != theirs[0]:
            found.append({"method": method, "ask": i, "judged": False,
                          "why": "no stored ids" if mine is None or theirs is None
                          else "prompts differ"})  # fmt: skip
            continue
        div = check_greedy(target.target_forward, theirs[0], theirs[1], mine[1])
        found.append({"method": method, "ask": i, "judged": True, "dtype": name,
                      "position": None if div is None else div.position,
                      "gap": None if div is None else div.gap,
                      "tolerance": None if div is None else div.tolerance,
                      "excused": div is None or div.excused})  # fmt: skip
    return found


def per_ask(
    trace: list[dict[str, Any]], cold: dict[str, list[dict[str, Any]]], warm: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Each ask's figures per method: acceptance length, output tokens, generation ms; a repeat
    also whether each method's answer equals its method's answer to the question it repeats
    (a paraphrase may retrieve other passages and answer otherwise)."""
    first: dict[tuple[int, str], int] = {}
    rows = []
    for i, item in enumerate(trace):
        if item["kind"] != "repeat":
            first.setdefault((item["tenant"], item["question"]), i)
        row: dict[str, Any] = {k: item[k] for k in ("tenant", "kind", "form") if k in item}
        for method, views in [*cold.items(), ("suffix_warm", warm)]:
            stats = views[i].get("stats") or {}
            drafts, accepted = stats.get("num_drafts") or 0, stats.get("num_accepted_tokens") or 0
            cell: dict[str, Any] = {
                "mal": round(1 + accepted / drafts, 2) if drafts else None,
                "tokens": stats.get("num_output_tokens"),
                "generation_ms": round(stats.get("generation_ms") or 0),
                "ttft_ms": round(stats.get("ttft_ms") or 0),
                "prompt_tokens": views[i].get("prompt_tokens"),
                "cached_prompt_tokens": stats.get("num_cached_prompt_tokens"),
            }
            if item["kind"] == "repeat":
                j = first.get((item["tenant"], item["of"]))
                cell["same_answer_as_first"] = (
                    None if j is None else views[i].get("answer") == views[j].get("answer")
                )
            row[method] = cell
        rows.append(row)
    return rows


def judged(divergences: list[dict[str, Any]]) -> str:
    """One line on the answers that differ from ``none``'s: how many, and how many at a
    near-tie of the target (excused in bfloat16) against at a clear margin (a bug)."""
    if not divergences:
        return "no answer differs"
    near = sum(d["judged"] and d["excused"] for d in divergences)
    unjudged = sum(not d["judged"] for d in divergences)
    where = ", ".join(f"{d['method']} ask {d['ask']}" for d in divergences)
    return (
        f"{len(divergences)} differ ({where}): {near} at a near-tie of the target "
        f"(top-2 gap within {SLACK:g}x the rounding between pass shapes), "
        f"{len(divergences) - near - unjudged} at a clear margin, {unjudged} not judged"
    )


def result_figures(result: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The goals' figures of one run's JSON (what ``main`` prints) and each row's note."""
    figures: dict[str, Any] = {
        key: None if result["goals"][name] is None else round(result["goals"][name], 3)
        for key, name in FIGURES.items()
    }
    asks = result["asks"]
    figures["asks"] = asks
    figures["identical_to_none"] = all(
        n == sum(asks.values()) for n in result["identical_to_none"].values()
    )
    table = result["methods"]

    def warm(kind: str, field: str, base: str) -> str:
        mine, theirs = table["suffix_warm"][kind][field], table[base][kind][field]
        return "n/a" if not mine or not theirs else f"{mine / theirs:.2f}x"

    figures["warm_repeat_mal"] = table["suffix_warm"]["repeat"]["mean_acceptance_length"]
    mal = {
        m: table[m]["repeat"]["mean_acceptance_length"] or 0.0 for m in ("suffix", "draft_model")
    }
    forms = result.get("repeat_forms", {})

    def cold(kind: str, field: str, base: str) -> str:
        mine, theirs = table["suffix"][kind][field], table[base][kind][field]
        return "n/a" if not mine or not theirs else f"{mine / theirs:.2f}x"

    worker = result.get("worker", {})
    hits = result.get("repeat_prefix_hits", {}).get("suffix", {})
    cache = (
        f"one worker, prefix cache {worker.get('prefix_cache_mb_per_method', 0):g} MB per "
        f"method; suffix's repeats prefilled mostly from it: {hits.get('hits')} of "
        f"{asks['repeat']}"
    )
    notes = {
        "repeat_mal_vs_draft_model": f"{asks['repeat']} repeated asks; MAL {mal['suffix']:.2f} "
        f"vs {mal['draft_model']:.2f}; exact repeats ({forms.get('exact')}): "
        f"{cold('repeat_exact', 'mean_acceptance_length', 'draft_model')}, paraphrases "
        f"({forms.get('paraphrase')}): "
        f"{cold('repeat_paraphrase', 'mean_acceptance_length', 'draft_model')}; warm trees: "
        f"{warm('repeat', 'mean_acceptance_length', 'draft_model')}",
        "repeat_tps_vs_none": f"{cache}; after the first token (time to it excluded): "
        f"{cold('repeat', 'decode_tokens_per_s', 'none')}; "
        f"exact repeats: {cold('repeat_exact', 'tokens_per_s', 'none')}, "
        f"paraphrases: {cold('repeat_paraphrase', 'tokens_per_s', 'none')}; warm trees: "
        f"{warm('repeat', 'tokens_per_s', 'none')}",
        "repeat_tps_vs_draft_model": f"warm trees: {warm('repeat', 'tokens_per_s', 'draft_model')}",
        "fresh_tps_vs_ngram": f"{asks['fresh']} fresh asks",
        **{key: f"{sum(asks.values())} asks" for key in FIGURES if key.startswith("trace")},
        "identical_to_none": f"{sum(asks.values())} asks, warm worker included; "
        + judged(result.get("divergences", [])),
    }
    return figures, notes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=300, help="Asks of the 3 tenants.")
    parser.add_argument("--fresh", type=int, default=30, help="Asks of the tenant with none.")
    parser.add_argument("--repeat", type=float, default=0.5, help="Share of repeated asks.")
    parser.add_argument("--docs", type=int, default=6, help="Corpus files per tenant.")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("-k", type=int, default=4, help="k of draft_model and ngram.")
    parser.add_argument(
        "--suffix-k", type=int, default=None,
        help="k of suffix (default: the service's, 'auto': its drafts follow the match).",
    )  # fmt: skip
    parser.add_argument(
        "--stop-after",
        type=float,
        default=None,
        help="Minutes after which the 3 tenants' asks stop (the fresh set runs).",
    )
    parser.add_argument(
        "--stop-at", default=None, help="The same at a UTC clock time, HH:MM (today)."
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", "float32", "bfloat16"),
        help="The worker's dtype (auto: bfloat16 where the CPU has AVX-512 BF16).",
    )
    parser.add_argument("--threads", type=int, default=1, help="The worker's torch threads.")
    parser.add_argument(
        "--prefix-cache-mb", type=float, default=2048.0 * len(METHODS),
        help="The worker's prefix cache (default: 2 GiB per method, the run's working set of "
        "prompts; 1024: the service's 256 MB per method, which holds about 22 asks).",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="Write the JSON here too.")
    parser.add_argument("--work", type=Path, default=None, help="Keep data and logs here.")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory(prefix="specrag-suffix-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        result = {"args": {k: str(v) for k, v in vars(args).items()}, **run(args, work)}
    print(
        "| method | kind | MAL | tokens/s | p50 total ms | p95 total ms |\n|---|---|---|---|---|---|"
    )
    for method, kinds in result["methods"].items():
        for kind, f in kinds.items():
            mal, tps = f["mean_acceptance_length"], f["tokens_per_s"]
            print(f"| {method} | {kind} | {mal or 0:.2f} | {tps or 0:.1f} | "
                  f"{f['total_ms_p50'] or 0:.0f} | {f['total_ms_p95'] or 0:.0f} |")  # fmt: skip
    for name, value in result["goals"].items():
        print(f"{name}: {value if value is None else round(value, 3)} "
              f"({'met' if result['met'][name] else 'NOT met'})")  # fmt: skip
    text = json.dumps(result, indent=2)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(text)
    figures, notes = result_figures(result)
    write_result("suffix_traffic", figures, GOALS, notes)


if __name__ == "__main__":
    main()
