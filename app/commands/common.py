"""What every CLI command shares: settings, ``--json`` output and one-line errors."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

import click

from app.settings import Settings

F = TypeVar("F", bound=Callable[..., Any])


class CommandError(click.ClickException):
    """A bad input or failed precondition: printed as one line, exit status 1 (2 for usage)."""

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")


def get_settings() -> Settings:
    """The process's Settings, built once per CLI invocation and kept on the click context."""
    ctx = click.get_current_context()
    root = ctx.find_root()
    if root.obj is None:
        root.obj = Settings()
    assert isinstance(root.obj, Settings)
    return root.obj


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
        from sqlalchemy.exc import OperationalError

        from app.db.schema import SchemaNotCurrentError

        try:
            return func(*args, **kwargs)
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
