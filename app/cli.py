"""``specrag``: the command-line group. Each command group lives in ``app/commands``.

The console script is ``workers.cli:main``, which builds this group with the Celery queue and the
``worker`` command wired in; ``main`` here is the same group with no queue (commands that send
work refuse with a one-line error).
"""

from __future__ import annotations

import importlib
import pkgutil

import click

import app.commands as commands_package
from app.commands.common import Wiring


def app_commands() -> list[click.Command]:
    """Every command defined in ``app/commands`` (each module lists its own in ``COMMANDS``)."""
    found: list[click.Command] = []
    for info in sorted(pkgutil.iter_modules(commands_package.__path__), key=lambda m: m.name):
        if info.name == "common":
            continue
        module = importlib.import_module(f"app.commands.{info.name}")
        found.extend(getattr(module, "COMMANDS", []))
    return found


def build_cli(wiring: Wiring | None = None) -> click.Group:
    """The ``specrag`` group; ``wiring`` plugs in the queue and the outer rooms' commands."""
    group = click.Group(
        "specrag",
        help="specrag: document Q&A workers with speculative decoding.",
        context_settings={"help_option_names": ["-h", "--help"], "obj": wiring},
    )
    for command in [*app_commands(), *(wiring.commands if wiring else ())]:
        group.add_command(command)
    return group


main = build_cli()
