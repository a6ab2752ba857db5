"""The OTEL_* variables: when tracing is on, and the values refused with the choices named."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.tracing import SAMPLERS, TracingConfigError, read_config

ENDPOINT = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}


def test_off_without_an_endpoint_and_when_turned_off() -> None:
    assert read_config({}) is None
    assert read_config(ENDPOINT, enabled=False) is None  # SPECRAG_TRACING=0
    assert read_config({**ENDPOINT, "OTEL_SDK_DISABLED": "true"}) is None


def test_on_with_an_endpoint_and_the_standard_names() -> None:
    found = read_config({**ENDPOINT, "OTEL_SERVICE_NAME": "qa-worker"}, default_service="w")
    assert found is not None
    assert found.endpoint == "http://127.0.0.1:4318/v1/traces"
    assert (found.service_name, found.sampler, found.capture_content) == (
        "qa-worker", "parentbased_always_on", False)  # fmt: skip
    signal = read_config({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/custom"})
    assert signal is not None and signal.endpoint == "http://c:4318/custom"
    ratio = read_config(
        {
            **ENDPOINT,
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "0.25",
        }
    )
    assert ratio is not None and ratio.ratio == 0.25
    content = read_config(
        {**ENDPOINT, "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true"}
    )
    assert content is not None and content.capture_content


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"OTEL_TRACES_SAMPLER": "sometimes"}, "OTEL_TRACES_SAMPLER"),
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "half"}, "SAMPLER_ARG"),
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "1.5"}, "SAMPLER_ARG"),
        ({**ENDPOINT, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "OTEL_EXPORTER_OTLP_PROTOCOL"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, "OTEL_EXPORTER_OTLP_ENDPOINT"),
    ],
)
def test_a_value_it_cannot_honour_is_refused_by_name(env: dict[str, str], named: str) -> None:
    with pytest.raises(TracingConfigError, match=named):
        read_config(env)


def test_an_unknown_sampler_error_lists_every_choice() -> None:
    with pytest.raises(TracingConfigError) as caught:
        read_config({"OTEL_TRACES_SAMPLER": "sometimes"})
    assert all(name in str(caught.value) for name in SAMPLERS)


@pytest.mark.parametrize("command", ["worker", "api"])
def test_the_processes_refuse_to_start_on_an_unknown_sampler(command: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "SPECRAG_"))}
    env.update(
        OTEL_TRACES_SAMPLER="sometimes",
        OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9",
        SPECRAG_DATA_DIR=str(tmp_path),
    )
    specrag = str(Path(sys.executable).parent / "specrag")
    done = subprocess.run(
        [specrag, command], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode != 0
    assert "OTEL_TRACES_SAMPLER: unknown sampler 'sometimes'" in done.stderr
    assert "parentbased_traceidratio" in done.stderr
    assert not (tmp_path / "specrag.db").exists()  # refused before anything started
