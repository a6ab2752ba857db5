"""``specrag``: the command-line entry point. Each command group lives in ``app/commands``."""

from __future__ import annotations

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """specrag: document Q&A workers with speculative decoding."""


def _register() -> None:
    # Command modules are imported here, not at the top, so that adding one never creates an
    # import cycle with this module; none of them does work at import.
    import importlib
    import pkgutil

    import app.commands as pkg

    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if info.name == "common":
            continue
        module = importlib.import_module(f"app.commands.{info.name}")
        for command in getattr(module, "COMMANDS", []):
            main.add_command(command)


_register()
