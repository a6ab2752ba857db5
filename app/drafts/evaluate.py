"""``specrag draft evaluate OLD NEW``: both drafts on the same target, on the same held-out prompts.

Every prompt (a dataset's held-out split, plus any ``--items`` files of the same shape) is
decoded greedily with ``draft_model`` (or ``eagle``, when OLD and NEW are EAGLE heads) twice,
once per draft, on one target; the order of the two
alternates per prompt so that a load change on the host falls on both alike. Per set and draft:

- acceptance rate: accepted draft tokens / drafted tokens (summed over the set);
- acceptance length: accepted tokens per draft round (summed, then divided);
- tokens per target pass: output tokens / target forward passes;
- decode speed: tokens after the first per second after the first token (summed times): the
  phase the draft changes; and generation speed, all output tokens per second of generation
  including the prompt's prefill (time to first token), which the draft does not change.

The target decides what is right: each draft's answer must be token-identical to the target's
own (the stored output of a greedy answer, which the worker decoded with the target verifying
every token), and the two drafts' answers to each other; a difference is reported per set.

A tuned draft that lowers the acceptance rate on the dataset's held-out split is refused
(``RefusedDraft``) unless forced; an accepted one gets the measured figures written into its
manifest (``heldout_acceptance``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.drafts.dataset import DatasetError, load_items, write_json

if TYPE_CHECKING:
    from matplotlib.figure import Figure

HELDOUT = "heldout"


class RefusedDraft(ValueError):
    """The new draft lowers held-out acceptance (``--force`` evaluates and keeps it anyway)."""


def _sum(stats: list[dict[str, Any]], key: str) -> float:
    return float(sum(s.get(key) or 0 for s in stats))


def summarise(stats: list[dict[str, Any]]) -> dict[str, Any]:
    """A set's figures for one draft from its answers' stats."""
    drafted, accepted = _sum(stats, "num_draft_tokens"), _sum(stats, "num_accepted_tokens")
    rounds, passes = _sum(stats, "num_drafts"), _sum(stats, "num_target_forwards")
    tokens, ms = _sum(stats, "num_output_tokens"), _sum(stats, "generation_ms")
    # Decode: after the first token, so the prompt's prefill (the same for both drafts, and
    # most of a short answer's time) does not dilute what the draft changes.
    after_first = sum(max(0, int(s.get("num_output_tokens") or 0) - 1) for s in stats)
    decode_ms = sum(
        max(0.0, float(s.get("generation_ms") or 0.0) - float(s.get("ttft_ms") or 0.0))
        for s in stats
    )
    return {
        "answers": len(stats),
        "acceptance_rate": accepted / drafted if drafted else None,
        "acceptance_length": accepted / rounds if rounds else None,
        "tokens_per_target_pass": tokens / passes if passes else None,
        "decode_tokens_per_s": after_first / (decode_ms / 1000.0) if decode_ms else None,
        "generation_tokens_per_s": tokens / (ms / 1000.0) if ms else None,
        "output_tokens": int(tokens),
        "generation_ms": round(ms, 1),
    }


def evaluate(
    old: Path,
    new: Path,
    target: Path,
    sets: dict[str, list[dict[str, Any]]],
    *,
    k: int = 4,
    device: str = "cpu",
    dtype: str = "float32",
    method: str = "draft_model",
    log: Any = print,
) -> dict[str, Any]:
    """Decode every set's prompts with both drafts on ``target``; the side-by-side report.

    ``method="eagle"``: OLD and NEW are EAGLE heads, each served with the target alone."""
    from generation import SamplingParams, load_engine

    if not any(sets.values()):
        raise DatasetError("nothing to evaluate: every set of prompts is empty")
    if method not in ("draft_model", "eagle"):
        raise DatasetError(f"method: {method!r}; choose draft_model or eagle")

    def engine(path: Path) -> Any:
        if method == "eagle":
            return load_engine("torch", target, device=device, dtype=dtype, eagle_dir=path)
        return load_engine("torch", target, path, device=device, dtype=dtype)

    engines = {"old": engine(old), "new": engine(new)}
    report: dict[str, Any] = {
        "old": str(old), "new": str(new), "target": str(target), "k": k, "dtype": dtype,
        "method": method, "model_pairs": {n: e.model_pair for n, e in engines.items()},
        "sets": {},
    }  # fmt: skip
    for e in engines.values():  # warm-up: kernels and allocators, not measured
        first = next(it for items in sets.values() for it in items)
        e.generate(first["prompt_ids"], SamplingParams(max_new_tokens=8, method=method,
                                                       num_speculative_tokens=k))  # fmt: skip
    started = time.monotonic()
    done = 0
    total = sum(len(v) for v in sets.values())
    for name, items in sets.items():
        stats: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
        differ = {"old_vs_target": 0, "new_vs_target": 0, "old_vs_new": 0}
        checked = 0
        for i, it in enumerate(items):
            params = SamplingParams(max_new_tokens=int(it["max_tokens"]), temperature=0.0,
                                    method=method, num_speculative_tokens=k)  # fmt: skip
            outs: dict[str, list[int]] = {}
            for which in ("old", "new") if i % 2 == 0 else ("new", "old"):
                result = engines[which].generate(list(it["prompt_ids"]), params)
                outs[which] = list(result.token_ids)
                stats[which].append(result.stats.to_dict())
            if float(it.get("temperature") or 0.0) == 0.0:
                checked += 1
                ref = list(it["output_ids"])
                differ["old_vs_target"] += outs["old"] != ref
                differ["new_vs_target"] += outs["new"] != ref
            differ["old_vs_new"] += outs["old"] != outs["new"]
            done += 1
            if done % 10 == 0 or done == total:
                log(f"evaluate: {done}/{total} prompts ({time.monotonic() - started:.0f} s)")
        old_s, new_s = summarise(stats["old"]), summarise(stats["new"])
        report["sets"][name] = {
            "prompts": len(items),
            "checked_against_target": checked,
            "differences": differ,
            "identical": not any(differ.values()),
            "old": old_s,
            "new": new_s,
            "acceptance_gain": _diff(new_s["acceptance_rate"], old_s["acceptance_rate"]),
            "speed_ratio": _ratio(new_s["decode_tokens_per_s"], old_s["decode_tokens_per_s"]),
            "generation_speed_ratio": _ratio(
                new_s["generation_tokens_per_s"], old_s["generation_tokens_per_s"]
            ),
        }
    report["seconds"] = round(time.monotonic() - started, 1)
    return report


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def verdict(report: dict[str, Any], force: bool) -> str:
    """``accepted``, or ``forced`` (refused but forced); RefusedDraft when refused."""
    gate = report["sets"].get(HELDOUT) or next(iter(report["sets"].values()))
    gain = gate["acceptance_gain"]
    differs = [n for n, s in report["sets"].items() if not s["identical"]]
    problems = []
    if gain is not None and gain < 0:
        problems.append(
            f"the new draft lowers held-out acceptance from {gate['old']['acceptance_rate']:.3f} "
            f"to {gate['new']['acceptance_rate']:.3f}"
        )
    if differs:
        problems.append(f"answers differ from the target's on {', '.join(differs)}")
    if problems and not force:
        raise RefusedDraft("; ".join(problems) + " (--force keeps it anyway)")
    return "forced" if problems else "accepted"


def record(new: Path, report: dict[str, Any]) -> None:
    """Write the measured figures into the new draft's manifest (if it has one): the held-out
    acceptance when the dataset's held-out split was replayed, and the latest run's sets."""
    path = new / "manifest.json"
    if not path.is_file():
        return
    manifest = json.loads(path.read_text())
    gate = report["sets"].get(HELDOUT)
    if gate is not None:  # only the dataset's held-out split is the held-out acceptance
        manifest["heldout_acceptance"] = {
            "base": gate["old"]["acceptance_rate"],
            "tuned": gate["new"]["acceptance_rate"],
        }
    manifest["evaluation"] = {
        n: {"acceptance_gain": s["acceptance_gain"], "speed_ratio": s["speed_ratio"],
            "identical": s["identical"], "prompts": s["prompts"]}
        for n, s in report["sets"].items()
    }  # fmt: skip
    manifest["verdict"] = report.get("verdict")
    write_json(path, manifest)


def load_sets(
    dataset: Path | None, extra: list[tuple[str, Path]]
) -> dict[str, list[dict[str, Any]]]:
    """The prompt sets: the dataset's held-out split (as ``heldout``) and each named file."""
    sets: dict[str, list[dict[str, Any]]] = {}
    if dataset is not None:
        path = dataset / "heldout.jsonl"
        if not path.is_file():
            raise DatasetError(
                f"{dataset}: no heldout.jsonl; make one with `specrag draft dataset`"
            )
        sets[HELDOUT] = load_items(path)
    for name, path in extra:
        sets[name] = load_items(path)
    return sets


def chart(report: dict[str, Any]) -> Figure:
    """Bars of acceptance rate and decode speed per set, old beside new."""
    from matplotlib.figure import Figure  # heavy: matplotlib

    names = list(report["sets"])
    fig = Figure(figsize=(8.0, 3.4))
    axes = fig.subplots(1, 2)
    width = 0.38
    for ax, key, label in (
        (axes[0], "acceptance_rate", "acceptance rate"),
        (axes[1], "decode_tokens_per_s", "decode speed (tokens/s after the first)"),
    ):
        xs = list(range(len(names)))
        for offset, which in ((-width / 2, "old"), (width / 2, "new")):
            ys = [report["sets"][n][which][key] or 0.0 for n in names]
            bars = ax.bar([x + offset for x in xs], ys, width, label=f"{which} draft")
            ax.bar_label(bars, fmt="%.2f" if key == "acceptance_rate" else "%.0f", fontsize=7)
        ax.set_xticks(xs, names)
        ax.set_title(label)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(loc="lower left", fontsize=7)
    fig.suptitle(f"{Path(report['old']).name} vs {Path(report['new']).name} (k={report['k']})")
    fig.tight_layout()
    return fig


def render_text(report: dict[str, Any]) -> str:
    """The side-by-side table for people."""
    rows = [f"{'set':<10} {'draft':<5} {'accept':>7} {'acc.len':>7} {'tok/pass':>8} "
            f"{'dec/s':>7} {'gen/s':>7} identical"]  # fmt: skip
    for name, s in report["sets"].items():
        for which in ("old", "new"):
            f = s[which]

            def num(v: float | None, fmt: str) -> str:
                return format(v, fmt) if v is not None else "-"

            rows.append(
                f"{name:<10} {which:<5} {num(f['acceptance_rate'], '7.3f')} "
                f"{num(f['acceptance_length'], '7.2f')} {num(f['tokens_per_target_pass'], '8.2f')} "
                f"{num(f['decode_tokens_per_s'], '7.1f')} "
                f"{num(f['generation_tokens_per_s'], '7.1f')} "
                f"{'yes' if s['identical'] else 'NO ' + json.dumps(s['differences'])}"
            )
        gain, ratio, gen = s["acceptance_gain"], s["speed_ratio"], s["generation_speed_ratio"]
        rows.append(
            f"{name:<10} gain  acceptance {'-' if gain is None else f'{gain:+.3f}'}, "
            f"decode speed {'-' if ratio is None else f'{ratio:.2f}x'}, "
            f"generation speed (with prefill) {'-' if gen is None else f'{gen:.2f}x'}"
        )
    rows.append(f"verdict: {report.get('verdict')}")
    return "\n".join(rows)
