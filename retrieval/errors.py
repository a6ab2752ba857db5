"""The errors retrieval raises, so callers can tell bad input from a missing collection.

Every ``ValueError`` subclass here is the caller's fault (a bad query, a bad file) and its message
names the problem; adapters turn them into a 4xx or a one-line CLI error.
"""

from __future__ import annotations


class UnknownCollectionError(LookupError):
    """The tenant has no collection of that name (nothing was ever ingested into it)."""


class QueryError(ValueError):
    """A search question that cannot be searched: empty, or longer than the limit."""


class DocumentError(ValueError):
    """A file that cannot be ingested: unreadable, empty, binary, not UTF-8, unsupported,
    a PDF without a text layer, or over the size limit. The message names the file."""


class InvalidNameError(ValueError):
    """A tenant or collection name that is empty, too long, or holds control characters."""


def check_name(kind: str, name: str) -> str:
    """``name`` itself when it is a usable tenant or collection name; else ``InvalidNameError``."""
    if not isinstance(name, str) or not name.strip():
        raise InvalidNameError(f"{kind} name is empty")
    if len(name) > 128:
        raise InvalidNameError(f"{kind} name is {len(name)} characters, over the limit of 128")
    if any(ord(ch) < 32 for ch in name):
        raise InvalidNameError(f"{kind} name {name!r} contains control characters")
    return name
