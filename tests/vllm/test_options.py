"""Engine options vLLM or this engine refuses: clear errors naming the option and the reason,
from ``load_engine`` and from ``specrag worker``, which refuses to start (real vLLM; each case
fails in vLLM's argument or config checks, before any engine process starts)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from app.settings import Settings
from generation import load_engine
from generation.vllm_engine import VLLMEngine, VLLMOptionError
from workers.process import settings_env

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "models" / "demo"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"tensor_paralel_size": 2}, r"unknown option\(s\) 'tensor_paralel_size'"),
        ({"llm_kwargs": "dtype=float32"}, "llm_kwargs must be a JSON object"),
        ({"llm_kwargs": {"no_such_argument": 1}}, "no_such_argument"),
        ({"llm_kwargs": {"dtype": "float7"}}, "dtype.*float7|float7.*dtype"),
        ({"llm_kwargs": {"max_model_len": 1 << 20}}, "max_model_len"),
    ],
)
def test_a_bad_option_is_refused_naming_it_and_vllms_reason(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(VLLMOptionError, match=message):
        VLLMEngine.check_options(options)
        load_engine("vllm", DEMO / "target", DEMO / "draft", device="cpu", options=options)


def test_the_worker_refuses_to_start_on_an_option_vllm_rejects(
    migrated_pg_url: str, tmp_path: Path
) -> None:
    settings = Settings(
        data_dir=tmp_path, database_url=migrated_pg_url, engine="vllm", device="cpu",
        vllm_options={"llm_kwargs": {"dtype": "float7"}},
    )  # fmt: skip
    env = settings_env(settings)
    worker = [str(Path(sys.executable).parent / "specrag"), "worker", "-Q", "answer"]
    proc = subprocess.run(worker, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert "vLLM refused its engine arguments" in last and "float7" in last, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
