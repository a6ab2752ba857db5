"""``make demo``: one question answered end to end on the embedded defaults, no servers needed.

Steps: migrate the embedded SQLite database, ingest demo/corpus, start a real ``specrag worker``
subprocess (embedded SQLAlchemy broker), serve the HTTP API on a loopback port, submit the demo
question with the Python client exactly as the web backend does (API → database → queue →
worker), print the answer as its stream delivers it, then its sources and decoding stats, and
stop the worker.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
SPECRAG = Path(sys.executable).parent / "specrag"
QUESTION = "What does the assert statement do?"
COLLECTION = "demo"
# Printed under the answer when the bundled pair answered: its answers look broken to a
# newcomer (a quote that drifts, repeats), and the product is not.
DEMO_PAIR_NOTICE = """\
Note: this answer comes from the bundled demo pair (models/demo), a 27.5M-parameter target
with a 4.0M-parameter draft trained on a CPU to show the path and the speed-up, not answer
quality: its answers quote a passage, often the wrong part, and can loop. Look at the sources
and the stats. For real answers, point the worker at an instruct pair you have on disk:
  SPECRAG_TARGET_MODEL=/path/to/target SPECRAG_DRAFT_MODEL=/path/to/draft make demo
(docs/models.md)."""


def run_cli(*args: str) -> dict[str, Any]:
    """Run ``specrag ARGS --json`` and return its JSON; exits with its error line on failure."""
    proc = subprocess.run(
        [str(SPECRAG), *args, "--json"], capture_output=True, text=True, cwd=REPO_ROOT
    )
    if proc.returncode != 0:
        sys.exit(
            f"demo: `specrag {' '.join(args)}` failed: {proc.stderr.strip().splitlines()[-1:]}"
        )
    data: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return data


def start_worker(log_path: Path) -> subprocess.Popen[bytes]:
    """A real worker process on the embedded broker; returns once it is consuming.

    It holds one query at a time (``SPECRAG_WORKER_CONCURRENCY=1`` unless set): the demo asks
    one question, and a worker measures its step costs at start for every batch size it can
    reach: on a float32 host (AVX-512 without BF16) its start took 89 s with the default of 4
    (sizes 1, 2 and 4), 31 s with 1.
    """
    log = open(log_path, "wb")
    env = {"SPECRAG_WORKER_CONCURRENCY": "1", **os.environ}
    proc = subprocess.Popen(
        [str(SPECRAG), "worker", "--queues", "answer,batch", "--loglevel", "INFO"],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO_ROOT,
        env=env,
    )
    deadline = time.monotonic() + 600
    while " ready." not in log_path.read_text(errors="replace"):
        if proc.poll() is not None:
            sys.exit(f"demo: the worker exited early; see {log_path}")
        if time.monotonic() > deadline:
            proc.kill()
            sys.exit(f"demo: the worker was not ready in 10 minutes; see {log_path}")
        time.sleep(0.5)
    return proc


def stop_worker(proc: subprocess.Popen[bytes]) -> None:
    """Warm shutdown (finish the current task), then make sure it is gone."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def stream_answer(client: Any, query_id: str, question: str, quiet: bool) -> dict[str, Any]:
    """Print the answer as the stream delivers it (GET /v1/queries/{id}/stream); the final view.

    On the embedded broker the stream comes from the database: the whole answer in one event.
    """
    if not quiet:
        print(f"\nQuestion: {question}\n\nAnswer: ", end="", flush=True)
    for event in client.stream(query_id, timeout=600):
        if event.event == "token" and not quiet:
            print(event.data["text"], end="", flush=True)
        elif event.event == "reset" and not quiet:
            print("\n[the answer started over]\nAnswer: ", end="", flush=True)
        elif event.event in ("done", "error"):
            if not quiet:
                print("\n")
            return dict(event.data)
    return client.get(query_id)


def show(
    view: dict[str, Any], question: str, streamed: bool = False, demo_pair: bool = False
) -> None:
    """Print the answer (unless it was streamed), its sources and its stats for people.

    ``demo_pair``: the bundled pair answered; a notice says what its answers are for.
    """
    if not streamed:
        print(f"\nQuestion: {question}\n")
    if view["status"] != "succeeded":
        print(f"The query {view['status']}: {view.get('error')}")
        return
    if not streamed:
        answer = view["answer"]
        print(f"Answer:{answer if answer.startswith(' ') else ' ' + answer}\n")
    print("Sources:")
    for rank, src in enumerate(view.get("sources", []), start=1):
        print(f"  [{rank}] {src['document']} — {src.get('title') or ''} (score {src['score']:.3f})")
    s = view["stats"]
    rate = "n/a" if s["acceptance_rate"] is None else f"{s['acceptance_rate']:.2f}"
    mal = "n/a" if s["mean_acceptance_length"] is None else f"{s['mean_acceptance_length']:.2f}"
    print("\nDecoding stats:")
    print(
        f"  method {s['method']}, k={s['num_speculative_tokens']}, model pair {view.get('model_pair')}"
    )
    print(f"  {s['num_output_tokens']} tokens in {s['num_target_forwards']} target forward passes")
    print(f"  drafted {s['num_draft_tokens']}, accepted {s['num_accepted_tokens']} (rate {rate})")
    print(f"  mean acceptance length {mal}; accepted per position {s['accepted_per_position']}")
    timings = ("queue_ms", "retrieval_ms", "ttft_ms", "generation_ms", "total_ms")
    print("  " + ", ".join(f"{k[:-3]} {s[k]:.0f} ms" for k in timings if s.get(k) is not None))
    if demo_pair:
        print("\n" + DEMO_PAIR_NOTICE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--question", default=QUESTION)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--json", action="store_true", help="Print the query as JSON.")
    args = parser.parse_args()

    from app.settings import DEMO_MODELS, Settings

    settings = Settings()
    for name, path in (("target", settings.target_model), ("draft", settings.draft_model)):
        if path is None or not (Path(path) / "config.json").is_file():
            sys.exit(f"demo: the {name} model is missing at {path} (see models/README.md)")
    settings.data_dir.mkdir(parents=True, exist_ok=True)

    print("demo: migrating the embedded database ...", flush=True)
    run_cli("db", "upgrade")
    print("demo: ingesting demo/corpus (unchanged files are skipped) ...", flush=True)
    # A relative path, as a user would type it: sources are stored as given.
    report = run_cli("ingest", "demo/corpus", "--collection", COLLECTION)
    print(f"demo:   {report.get('added', 0)} added, {report.get('unchanged', 0)} unchanged")
    key = run_cli("keys", "create", "--tenant", "default")["key"]

    print("demo: starting a worker (loads the model pair once) ...", flush=True)
    worker = start_worker(settings.data_dir / "demo-worker.log")
    try:
        import uvicorn

        from app.client import SpecragClient
        from workers.cli import create_api

        server = uvicorn.Server(uvicorn.Config(create_api(settings), port=0, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.05)
        port = server.servers[0].sockets[0].getsockname()[1]
        # The first submit builds the queue connection (seconds on a loaded machine).
        with SpecragClient(f"http://127.0.0.1:{port}", key, timeout=120) as client:
            print("demo: submitting the question through the API and the queue ...", flush=True)
            query_id = client.submit(args.question, COLLECTION, max_tokens=args.max_tokens)
            view = stream_answer(client, query_id, args.question, quiet=args.json)
        server.should_exit = True
        thread.join(10)
    finally:
        stop_worker(worker)
    if args.json:
        print(json.dumps(view, indent=2))
    else:
        demo_pair = Path(settings.target_model).resolve() == (DEMO_MODELS / "target").resolve()
        show(view, args.question, streamed=True, demo_pair=demo_pair)
    sys.exit(0 if view["status"] == "succeeded" else 1)


if __name__ == "__main__":
    main()
