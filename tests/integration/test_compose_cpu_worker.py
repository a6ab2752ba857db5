"""The compose profile ``cpu`` answers on a host without a GPU: its answer worker, started with
its own command line and environment from docker-compose.yml, answers a question on the bundled
demo pair.

No Docker engine runs here, so the service's command runs directly: compose's ``${VAR:-default}``
takes its default (a host that sets none), the image's WORKDIR is the repository (the images
copy it there as laid out here: tests/test_images.py), and this host's PostgreSQL and Redis stand
in for the ``postgres`` and ``redis`` services. The question is asked with the API service's
environment, as ``docker compose run --rm api specrag ask`` asks it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from generation.model.dtypes import resolve_dtype
from tests.integration.conftest import Deployment
from tests.integration.helpers import free_port
from workers.cli import main
from workers.process import WorkerProcess

pytestmark = [
    pytest.mark.integration,
    pytest.mark.models,
    pytest.mark.slow,
    pytest.mark.timeout(1200),
]
ROOT = Path(__file__).resolve().parents[2]
DEFAULT = re.compile(r"\$\{(\w+):-([^}]*)\}")


def image_workdir() -> str:
    """The CPU image's WORKDIR, where the repository's layout lies in a container."""
    lines = (ROOT / "docker" / "Dockerfile").read_text().splitlines()
    return next(line.split()[1] for line in lines if line.startswith("WORKDIR "))


def container_value(value: Any) -> str:
    """A compose environment value as a container on a bare host sees it, with the image's
    paths mapped to this checkout."""
    text, workdir = DEFAULT.sub(lambda m: m.group(2), str(value)), image_workdir()
    if text == workdir or text.startswith(workdir + "/"):
        text = str(ROOT) + text[len(workdir) :]
    return text


def service_env(service: dict[str, Any], host: dict[str, str]) -> dict[str, str]:
    """This process's environment without SPECRAG_ settings, then the service's, then ``host``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECRAG_")}
    env.update({k: container_value(v) for k, v in service["environment"].items()})
    return env | host


class ComposeWorker(WorkerProcess):
    """A worker started with a compose service's exact command line."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        super().__init__(env, log, name=argv[argv.index("--hostname") + 1].split("@")[0])
        self.argv = argv

    def start(self) -> ComposeWorker:
        # The console script of this environment, as the image's PATH finds its own.
        argv = [str(Path(sys.executable).parent / self.argv[0]), *self.argv[1:]]
        self._out = self.log.open("ab")
        self.proc = subprocess.Popen(
            argv, env=self.env, cwd=ROOT, stdout=self._out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        return self


def ask(env: dict[str, str], collection: str, *extra: str) -> dict[str, Any]:
    """``specrag ask --json`` through the queue; the view it prints."""
    argv = ["ask", "What does del do?", "-c", collection, "--tenant", "acme", "--max-tokens", "16"]
    result = CliRunner().invoke(main, [*argv, *extra, "--json", "--timeout", "180"], env=env)
    assert result.exit_code == 0, result.output
    view: dict[str, Any] = json.loads(result.output.strip().splitlines()[-1])
    return view


def test_the_cpu_profile_answer_worker_answers_on_the_demo_pair(
    private_deployment: Deployment, private_redis_db: str, tmp_path: Path
) -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    service = compose["services"]["worker-answer-cpu"]
    assert service["profiles"] == ["cpu"]
    settings = private_deployment.settings
    host = {
        "SPECRAG_DATABASE_URL": str(settings.database_url),
        "SPECRAG_BROKER_URL": private_redis_db,
        "SPECRAG_DATA_DIR": str(settings.data_dir),
    }
    # Compose's metrics port is the container's own; here, one that is free on this host.
    env = service_env(service, host | {"SPECRAG_METRICS_PORT": str(free_port())})
    assert env["SPECRAG_TARGET_MODEL"] == str(ROOT / "models" / "demo" / "target")
    worker = ComposeWorker(service["command"], env, tmp_path / "answer-cpu.log").start()
    try:
        worker.wait_ready(timeout=900)
        api_env = service_env(compose["services"]["api"], host)
        view = ask(api_env, private_deployment.collection)
        assert view["status"] == "succeeded", view
        assert view["answer"] and any("del.md" in source["document"] for source in view["sources"])
        stats = view["stats"]
        assert stats["method"] == "draft_model" and stats["num_draft_tokens"] > 0
        assert stats["dtype"] == resolve_dtype("auto", "cpu")
        # The bundled EAGLE head serves method eagle with the image's demo target.
        eagle = ask(api_env, private_deployment.collection, "--method", "eagle")
        assert eagle["status"] == "succeeded", eagle
        assert eagle["stats"]["method"] == "eagle" and eagle["stats"]["num_draft_tokens"] > 0
        log = worker.tail(chars=1 << 20)
        assert f"loading torch engine ({stats['dtype']}): target {ROOT}/models/demo/target" in log
    finally:
        worker.stop()
