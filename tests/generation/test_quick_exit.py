"""The vLLM plugin that freezes the heap at exit of vLLM's processes (generation/vllm_engine/quick_exit.py).

What it saves (vLLM's EngineCore and model worker leaving in about a second instead of five) is
measured, not tested here; tests/vllm runs every engine stop through it. These check what must
hold wherever it runs: it acts only in a child process, the child exits with its heap frozen,
its exit status and what it wrote before exiting are kept, and vLLM finds it as a plugin.
"""

from __future__ import annotations

import importlib.metadata
import multiprocessing
import runpy
from pathlib import Path

from generation.vllm_engine import quick_exit

CHILD = """
import atexit, gc, importlib.util, pathlib, sys

def record_freeze():
    pathlib.Path({frozen!r}).write_text(str(gc.get_freeze_count()))

atexit.register(record_freeze)  # registered first, so it runs after the plugin's hook
# Loaded from its file: the package's __init__ imports torch, ten seconds a child.
spec = importlib.util.spec_from_file_location("quick_exit", {module!r})
plugin = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plugin)
plugin.register()
plugin.register()  # once per process, however often vLLM loads its plugins
print("child's last line", end="\\n", flush=False)  # unflushed: the exit hook flushes it
sys.stderr.write("child's last error line\\n")
sys.exit({status})
"""


def test_a_child_exits_frozen_and_keeps_its_status_and_output(capfd, tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")  # as vLLM starts its processes on this host
    children = {}
    for status in (0, 3):
        script = tmp_path / f"child-{status}.py"
        frozen = tmp_path / f"frozen-{status}"
        script.write_text(
            CHILD.format(frozen=str(frozen), module=quick_exit.__file__, status=status)
        )
        children[status] = (ctx.Process(target=runpy.run_path, args=(str(script),)), frozen)
        children[status][0].start()
    for status, (child, frozen) in children.items():
        child.join(60)
        assert child.exitcode == status
        assert int(frozen.read_text()) > 1_000  # the child's heap, out of the final collections
    out, err = capfd.readouterr()
    assert out.count("child's last line") == 2
    assert err.count("child's last error line") == 2


def test_the_embedding_process_is_left_alone(monkeypatch) -> None:
    registered: list[object] = []
    monkeypatch.setattr(quick_exit.atexit, "register", registered.append)
    monkeypatch.setattr(quick_exit, "_registered", False)
    quick_exit.register()  # this test process was not started by multiprocessing
    assert registered == []


def test_vllm_finds_it_among_its_general_plugins() -> None:
    points = importlib.metadata.entry_points(group="vllm.general_plugins")
    found = {p.name: p.value for p in points}
    assert found.get(quick_exit.PLUGIN_NAME) == "generation.vllm_engine.quick_exit:register"
