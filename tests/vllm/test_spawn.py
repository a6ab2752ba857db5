"""vLLM's spawned processes do not re-import the ``__main__`` module that started the engine.

vLLM spawns its engine core, which spawns its model worker; a spawned child imports the
parent's ``__main__`` first. For ``specrag worker`` that is the console script (CLI, API,
Celery, SQLAlchemy imported twice more); for a script doing work at module level it is that
work twice more, before vLLM's OpenMP set-up (the issue measured 4 tokens/s instead of 114).
``generation.vllm_engine.startup.main_module_hidden`` hides the main module while vLLM spawns.
The script here records the pid of every process that imports it, at module level, with
torch imported there too; only the parent may appear. Its tokens/s are printed for the record
(not asserted: the machine is shared); benchmarks/vllm_engines.py compares engines.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = """
import os, sys, time
import torch  # module level, as the issue's script had it
with open(os.environ["MARKER"], "a") as f:
    f.write(f"{os.getpid()}\\n")

def main():
    from generation import SamplingParams, load_engine
    engine = load_engine("vllm", sys.argv[1], sys.argv[2], device="cpu",
                         options={"llm_kwargs": {"kv_cache_memory_bytes": 256 << 20}})
    prompt = list(range(3, 60))
    engine.generate(prompt, SamplingParams(max_new_tokens=8))
    started, n = time.perf_counter(), 0
    for _ in range(3):
        n += len(engine.generate(prompt, SamplingParams(max_new_tokens=64)).token_ids)
    print(f"TOKENS_PER_S {n / (time.perf_counter() - started):.1f}", flush=True)
    engine.close()

if __name__ == "__main__":
    main()
"""


def test_vllms_processes_do_not_reimport_the_main_module(tmp_path: Path) -> None:
    script, marker = tmp_path / "starts_vllm.py", tmp_path / "imported_by"
    script.write_text(SCRIPT)
    env = {**os.environ, "MARKER": str(marker), "PYTHONPATH": str(REPO)}
    demo = REPO / "models" / "demo"
    proc = subprocess.run(
        [sys.executable, str(script), str(demo / "target"), str(demo / "draft")],
        env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    pids = marker.read_text().split()
    assert len(pids) == 1, f"imported by {len(pids)} processes: {pids}"
    rate = [line for line in proc.stdout.splitlines() if line.startswith("TOKENS_PER_S")]
    assert rate, proc.stdout[-2000:]
    print(rate[0], "(demo pair, draft_model k=4, 64 tokens, one stream)")
