"""The errors retrieval raises, so callers can tell bad input from a missing collection.

Every ``ValueError`` subclass here is the caller's fault (a bad query, a bad file) and its message
names the problem; adapters turn them into a 4xx or a one-line CLI error.
"""

from __future__ import annotations

import errno
import re
import unicodedata

INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Co", "Cn", "Cs"})
"""Unicode categories refused in a name: control, format (bidi overrides such as U+202E, zero
widths, the BOM), line and paragraph separators, private use, unassigned, surrogates."""


# An absolute path (POSIX or Windows) inside an error message: the server's, not the client's.
_PATH = re.compile(r"(?:[A-Za-z]:\\|/)[^\s'\"]*")


def public_reason(exc: BaseException) -> str:
    """What went wrong, for a client: the error's kind and message without server paths.

    An OSError says its errno's text and name (``No space left on device (ENOSPC)``), never
    the file it was writing; any other error its first line with absolute paths cut out."""
    if isinstance(exc, OSError) and exc.strerror:
        code = errno.errorcode.get(exc.errno or 0)
        return f"{exc.strerror}" + (f" ({code})" if code else "")
    first = (str(exc).splitlines() or [""])[0]
    return f"{type(exc).__name__}: {_PATH.sub('<path>', first)}".rstrip(": ")


class UnknownCollectionError(LookupError):
    """The tenant has no collection of that name (nothing was ever ingested into it)."""


class QueryError(ValueError):
    """A search question that cannot be searched: empty, or longer than the limit."""


class DocumentError(ValueError):
    """A file that cannot be ingested: unreadable, empty, binary, not UTF-8, unsupported,
    a PDF without a text layer, or over the size limit. The message names the file."""


class CollectionLimitError(ValueError):
    """An ingest that would create one collection more than its tenant may have; the message
    names the limit (``max_collections``)."""


class InvalidNameError(ValueError):
    """A tenant or collection name that is empty, too long, starts or ends with a space, or holds
    an invisible or look-alike character (the message names it)."""


def character_problem(name: str) -> str | None:
    """Why ``name`` does not read as what it is, naming the character, or None when it does.

    The one rule of names (documents, collections, tenants): no control, format, separator,
    private-use or unassigned character, and no space other than U+0020 (NBSP and its kin look
    like a plain space), so that two names that look alike are the same name."""
    for ch in name:
        category = unicodedata.category(ch)
        if category in INVISIBLE_CATEGORIES or (category == "Zs" and ch != " "):
            kind = "space" if category == "Zs" else "control or format character"
            label = unicodedata.name(ch, "")
            return f"contains the {kind} U+{ord(ch):04X}" + (f" ({label})" if label else "")
    return None


def check_name(kind: str, name: str) -> str:
    """``name`` itself when it is a usable tenant or collection name; else ``InvalidNameError``
    naming the problem (and the character, for an invisible or look-alike one)."""
    if not isinstance(name, str) or not name.strip():
        raise InvalidNameError(f"{kind} name is empty")
    if len(name) > 128:
        raise InvalidNameError(f"{kind} name is {len(name)} characters, over the limit of 128")
    problem = character_problem(name)
    if problem is not None:
        raise InvalidNameError(f"{kind} name {name!r} {problem}")
    if name != name.strip():
        raise InvalidNameError(f"{kind} name {name!r} starts or ends with a space")
    return name
