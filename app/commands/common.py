"""What every CLI command shares: settings, ``--json`` output and one-line errors."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any, TypeVar

import click
from pydantic import ValidationError
from sqlalchemy.exc import OperationalError

import app.tracing as tracing
from app.db.schema import SchemaNotCurrentError
from app.dispatch import Dispatcher, DispatcherFactory
from app.settings import Settings, invalid_settings

F = TypeVar("F", bound=Callable[..., Any])


class CommandError(click.ClickException):
    """A bad input or failed precondition: printed as one line, exit status 1 (2 for usage)."""

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")


@dataclass(frozen=True)
class Wiring:
    """What the composition root plugs into the CLI: the queue, and commands of outer rooms."""

    dispatcher: DispatcherFactory
    commands: tuple[click.Command, ...] = ()


_SETTINGS = "specrag.settings"


def get_settings() -> Settings:
    """The process's Settings, built once per CLI invocation and kept on the click context."""
    ctx = click.get_current_context()
    meta = ctx.meta  # one dict shared by the whole invocation
    if _SETTINGS not in meta:
        meta[_SETTINGS] = Settings()
        # Tracing starts with the Settings, before any database engine or queue exists (their
        # spans need the provider); an OTEL_* value it cannot honour stops the command here.
        service = {"api": "specrag-api", "worker": "specrag-worker"}.get(ctx.info_name or "")
        tracing.configure(service or "specrag-cli", enabled=meta[_SETTINGS].tracing)
    settings: Settings = meta[_SETTINGS]
    return settings


def get_dispatcher(settings: Settings) -> Dispatcher:
    """The queue wired into this CLI (``workers/cli.py``); CommandError when there is none."""
    wiring = click.get_current_context().find_object(Wiring)
    if wiring is None:
        raise CommandError(
            "this command needs a queue, and none is wired into this CLI: "
            "run the `specrag` console script (workers.cli:main)"
        )
    return wiring.dispatcher(settings)


def emit(data: Any, as_json: bool, text: str | None = None) -> None:
    """Print ``data`` as JSON, or ``text`` (default: pretty JSON) for people."""
    if as_json:
        click.echo(json.dumps(data, default=str))
    else:
        click.echo(text if text is not None else json.dumps(data, indent=2, default=str))


def one_line_errors(func: F) -> F:
    """Turn bad-input, missing-thing, timeout and schema errors into a one-line CLI error."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except ValidationError as exc:
            if exc.title != Settings.__name__:
                raise CommandError(str(exc).splitlines()[0]) from exc
            raise CommandError(invalid_settings(exc)) from exc  # named as the environment sets it
        except (
            ValueError,
            FileNotFoundError,
            LookupError,
            TimeoutError,
            SchemaNotCurrentError,
        ) as exc:
            raise CommandError(
                str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            ) from exc
        except OperationalError as exc:
            # Database unreachable or locked: say which, on one line, without the SQL dump.
            raise CommandError(f"database error: {str(exc.orig).splitlines()[0]}") from exc

    return wrapper  # type: ignore[return-value]


def stderr(msg: str) -> None:
    print(msg, file=sys.stderr)
