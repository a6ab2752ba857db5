"""docker-compose.yml is valid and wires the services the way the README says.

No Docker engine runs here, so the file is parsed and checked; the integration tests run the same
commands (db upgrade, api, worker) directly against real PostgreSQL and Redis, and
tests/integration/test_compose_cpu_worker.py runs the CPU answer worker's own command line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from workers.app import QUEUES
from workers.cli import main as cli

ROOT = Path(__file__).resolve().parents[2]


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return data


def test_services_and_healthchecks() -> None:
    services = _compose()["services"]
    assert set(services) == {
        "redis",
        "postgres",
        "migrate",
        "api",
        "worker-cpu",
        "worker-train",
        "worker-answer-cpu",
        "worker-gpu",
        "flower",
        "prometheus",
        "grafana",
        "jaeger",
    }
    for name, service in services.items():
        if name != "migrate":  # a one-shot job has nothing to check once it has exited
            assert "healthcheck" in service, f"{name} has no healthcheck"
    assert services["migrate"]["restart"] == "no"
    for name in ("api", "worker-cpu", "worker-train", "worker-answer-cpu", "worker-gpu"):
        deps = services[name]["depends_on"]
        assert deps["migrate"]["condition"] == "service_completed_successfully", name
        assert deps["redis"]["condition"] == "service_healthy", name
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_gpu_worker_reserves_a_gpu_and_uses_vllm() -> None:
    gpu = _compose()["services"]["worker-gpu"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    assert gpu["environment"]["SPECRAG_ENGINE"] == "vllm"
    dockerfile = ROOT / gpu["build"]["dockerfile"]
    if dockerfile.exists():  # written by the vLLM issue
        assert ".[vllm]" in dockerfile.read_text()
    assert "answer" in " ".join(gpu["command"]) and "ingest" not in " ".join(gpu["command"])
    assert "ingest" in " ".join(_compose()["services"]["worker-cpu"]["command"])


def test_every_service_command_is_a_real_cli_command() -> None:
    for name, service in _compose()["services"].items():
        command = service.get("command")
        if not command or command[0] != "specrag":
            continue
        group: Any = cli
        for word in command[1:]:
            if word.startswith("-"):
                break
            assert word in group.commands, f"{name}: `specrag {word}` does not exist"
            group = group.commands[word]
    env = _compose()["x-specrag-env"]
    assert env["SPECRAG_DATABASE_URL"].startswith("postgresql+psycopg://")
    assert env["SPECRAG_BROKER_URL"].startswith("redis://")


def _started(profile: str) -> dict[str, Any]:
    # The services `docker compose --profile PROFILE up` starts: those of no profile, and its own.
    services = _compose()["services"]
    return {n: s for n, s in services.items() if profile in s.get("profiles", [profile])}


def _queues(service: dict[str, Any]) -> set[str]:
    command = service.get("command") or []
    if command[:2] != ["specrag", "worker"]:
        return set()
    return set(command[command.index("--queues") + 1].split(","))


@pytest.mark.parametrize("profile", ["cpu", "gpu"])
def test_each_profile_consumes_every_queue(profile: str) -> None:
    consumed = set().union(*map(_queues, _started(profile).values()))
    assert consumed == set(QUEUES), f"--profile {profile} leaves queues without a worker"


def test_the_cpu_profile_runs_on_a_host_without_a_gpu() -> None:
    started = _started("cpu")
    for name, service in started.items():
        assert "deploy" not in service, f"{name} reserves a device under --profile cpu"
        if "build" in service:
            assert service["build"]["dockerfile"] == "docker/Dockerfile", name
    answer = started["worker-answer-cpu"]
    assert {"answer", "batch"} == _queues(answer)
    env = answer["environment"]
    assert env["SPECRAG_ENGINE"] == "torch" and env["SPECRAG_DEVICE"] == "cpu"
    assert env["SPECRAG_DTYPE"] == "${SPECRAG_DTYPE:-auto}"
    assert env["SPECRAG_TARGET_MODEL"] == "${SPECRAG_TARGET_MODEL:-/app/models/demo/target}"
    assert env["SPECRAG_DRAFT_MODEL"] == "${SPECRAG_DRAFT_MODEL:-/app/models/demo/draft}"
    assert "worker-gpu" not in started


def test_the_train_worker_consumes_only_train() -> None:
    train = _compose()["services"]["worker-train"]
    assert _queues(train) == {"train"} and "profiles" not in train
    assert train["build"]["dockerfile"] == "docker/Dockerfile"
    assert "specrag-data:/var/lib/specrag" in train["volumes"]  # where tune jobs read and write


def test_jaeger_takes_otlp_under_the_tracing_profile() -> None:
    compose = _compose()
    jaeger = compose["services"]["jaeger"]
    assert jaeger["profiles"] == ["tracing"]
    assert "4318:4318" in jaeger["ports"]
    env = compose["x-specrag-env"]
    # Off unless the operator sets the endpoint: the empty default means no tracing.
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "${OTEL_EXPORTER_OTLP_ENDPOINT:-}"
    assert compose["services"]["api"]["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"]
