"""Redis commands outside a sampled span skip the instrumentation; inside one they are spans."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from testkit.otlp import OtlpReceiver

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import json, sys
import redis
import opentelemetry.instrumentation.redis as instrumented
import opentelemetry.instrumentation.redis.util as util
from app.tracing import configure, span

assert configure("gate-test")
calls = []
format_args = util._format_command_args  # the wrappers' first step, for every command
counted = lambda args: calls.append(args[0]) or format_args(args)
instrumented._format_command_args = util._format_command_args = counted
client = redis.Redis.from_url(sys.argv[1])
client.set("gate", "1")
pipe = client.pipeline()
pipe.get("gate").get("gate")
pipe.execute()
outside = len(calls)
with span("traced"):
    client.set("gate", "2")
    pipe = client.pipeline()
    pipe.get("gate").get("gate")
    pipe.execute()
print(json.dumps({"outside": outside, "inside": len(calls) - outside}))
"""


def test_redis_commands_pay_the_instrumentation_only_inside_a_sampled_span(
    private_redis_db: str,
) -> None:
    with OtlpReceiver() as receiver:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "SPECRAG_"))}
        env.update(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint, OTEL_TRACES_SAMPLER="always_on")
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT, private_redis_db], env=env, cwd=ROOT,
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        counts = json.loads(done.stdout.strip().splitlines()[-1])
        names = sorted(s.name for s in receiver.spans)  # the process exported as it exited
    assert counts == {"outside": 0, "inside": 3}  # the SET and the pipeline's two GETs
    assert names == ["GET GET", "SET", "traced"]
