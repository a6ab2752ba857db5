"""Fault injection for ``specrag worker`` subprocesses of the fault tests (never imported by the
service itself): with ``SPECRAG_TEST_KILL_LOOP_FILE`` set, the torch engine's loop thread ends
(SystemExit inside a step, which the loop does not catch) once that file exists.

It is on a subprocess's PYTHONPATH only when a test puts this directory there.
"""

import os

_TRIGGER = os.environ.get("SPECRAG_TEST_KILL_LOOP_FILE")

if _TRIGGER:
    from generation.engine import step as engine_step

    _step = engine_step.BatchEngine.step

    def _dying_step(self: engine_step.BatchEngine) -> None:
        if os.path.exists(str(_TRIGGER)):
            raise SystemExit("the test killed the engine loop")
        _step(self)

    engine_step.BatchEngine.step = _dying_step  # type: ignore[method-assign]
