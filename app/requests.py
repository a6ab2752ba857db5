"""One request contract for API, CLI, batch and workers: the request model and its vocabulary.

``QueryRequest`` is the one model a question is validated with, wherever it comes from; its
limits and defaults come from Settings (``validate_request``). Statuses, methods and queues are
``StrEnum``s, so a member compares and serialises as the plain string the database and the JSON
contract hold (``QueryStatus.QUEUED == "queued"``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from app.enums import (
    ANSWER_QUEUES,
    FINAL_STATUSES,
    METHOD_CHOICES,
    Method,
    QueryStatus,
    QueueName,
)
from app.settings import Settings
from app.validation import text_problem

# The vocabulary lives in app/enums.py (Settings names a method); callers import it from here.
__all__ = [
    "ANSWER_QUEUES",
    "FINAL_STATUSES",
    "METHOD_CHOICES",
    "Method",
    "QueryStatus",
    "QueueName",
]


DEFAULT_NUM_SPECULATIVE_TOKENS = 4
"""k when a request names none (the method and max_tokens defaults are Settings')."""
DEFAULT_TEMPERATURE = 0.0
"""Greedy unless a request asks to sample."""
MAX_COLLECTION_CHARS = 128
MAX_SEED = 2**63 - 1


class RequestError(ValueError):
    """A refused request; ``field`` names the offending field (for the 4xx JSON body)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def check_text(field: str, value: str) -> str:
    """``value`` unchanged; RequestError naming ``field`` when it holds a NUL or lone surrogate."""
    problem = text_problem(value)
    if problem is not None:
        raise RequestError(field, problem)
    return value


def _storable(value: str) -> str:
    # A NUL cannot be stored in PostgreSQL text, a lone surrogate not encoded (app/validation.py).
    problem = text_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


def _settings(info: ValidationInfo) -> Settings:
    settings: Settings | None = (info.context or {}).get("settings")
    if settings is None:
        # Limits and defaults are deployment settings: a request is never checked without them.
        raise TypeError("QueryRequest is validated with validate_request(settings, data)")
    return settings


class QueryRequest(BaseModel):
    """A question and its decoding parameters: defaults filled in, limits from Settings checked.

    The one request model of the API, the CLI, batch jobs and golden runs; build it with
    ``validate_request``. ``None`` for an optional field means "the default".
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    question: str = Field(description="The question, in natural language.")
    collection: str = Field(description="Collection of the caller's documents to search.")
    method: Method = Field(
        default=None,
        validate_default=True,
        description=f"{METHOD_CHOICES} (default: SPECRAG_DEFAULT_METHOD).",
    )
    num_speculative_tokens: StrictInt | Literal["auto"] = Field(
        default=None,
        validate_default=True,
        description=(
            f"Draft tokens per verification round, k >= 1, or 'auto' (default "
            f"{DEFAULT_NUM_SPECULATIVE_TOKENS}; for suffix 'auto': its trees decide each "
            f"round's length, up to SPECRAG_SUFFIX_MAX_SPECULATIVE_TOKENS)."
        ),
    )
    max_tokens: StrictInt = Field(
        default=None,
        validate_default=True,
        description="Most tokens to generate (default: SPECRAG_DEFAULT_MAX_TOKENS).",
    )
    temperature: StrictFloat = Field(
        default=DEFAULT_TEMPERATURE, validate_default=True, description="0 = greedy."
    )
    seed: StrictInt | None = Field(
        default=None, ge=0, le=MAX_SEED, description="Seed for reproducible sampling."
    )

    @field_validator("question")
    @classmethod
    def _question(cls, value: str, info: ValidationInfo) -> str:
        limit = _settings(info).max_question_chars
        if not value.strip():
            raise ValueError("must be a non-empty string")
        _storable(value)
        if len(value) > limit:
            raise ValueError(f"longer than {limit} characters ({len(value)})")
        return value

    @field_validator("collection")
    @classmethod
    def _collection(cls, value: str) -> str:
        from retrieval.errors import character_problem  # heavy package: faiss

        # Such a name cannot exist (retrieval.errors.check_name): say why, not "unknown".
        problem = character_problem(_storable(value))
        if problem is not None:
            raise ValueError(problem)
        value = value.strip()
        if not value or len(value) > MAX_COLLECTION_CHARS:
            raise ValueError(
                f"must be a non-empty string of at most {MAX_COLLECTION_CHARS} characters"
            )
        return value

    @field_validator("method", mode="before")
    @classmethod
    def _method(cls, value: Any, info: ValidationInfo) -> Any:
        settings = _settings(info)
        if value is not None and not isinstance(value, str):
            # 0, false and [] are not "the default": only null and a missing field are.
            raise ValueError(f"must be a string, one of {', '.join(settings.allowed_methods)}")
        value = value or settings.default_method
        if value not in settings.allowed_methods:
            raise ValueError(f"must be one of {', '.join(settings.allowed_methods)}, got {value!r}")
        missing = _missing_for(value, settings)
        if missing is not None:
            raise ValueError(f"{missing}; it serves {', '.join(served_methods(settings))}")
        return value

    @field_validator("num_speculative_tokens", mode="before")
    @classmethod
    def _k_default(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None:
            # A suffix draft's length follows its match (a long one where the scope has answered
            # the same question before), which a fixed k would cut.
            return (
                "auto"
                if info.data.get("method") == Method.SUFFIX
                else DEFAULT_NUM_SPECULATIVE_TOKENS
            )
        if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 6:
            # The CLI and JSONL files may spell k as text -- in ASCII digits, and short: int()
            # also reads other scripts' digits ("٤") and refuses thousands of digits.
            return int(value)
        if isinstance(value, bool) or not (isinstance(value, int) or value == "auto"):
            shown = value if not isinstance(value, str) or len(value) <= 20 else value[:20] + "..."
            raise ValueError(f"expected an integer >= 1 or 'auto', got {shown!r}")
        return value

    @field_validator("num_speculative_tokens")
    @classmethod
    def _k(cls, value: int | str, info: ValidationInfo) -> int | str:
        high = _settings(info).max_speculative_tokens
        if isinstance(value, int) and not 1 <= value <= high:
            raise ValueError(f"must be between 1 and {high}, got {value}")
        return value

    @field_validator("max_tokens", mode="before")
    @classmethod
    def _max_tokens_default(cls, value: Any, info: ValidationInfo) -> Any:
        return _settings(info).default_max_tokens if value is None else value

    @field_validator("max_tokens")
    @classmethod
    def _max_tokens(cls, value: int, info: ValidationInfo) -> int:
        high = _settings(info).max_tokens_limit
        if not 1 <= value <= high:
            raise ValueError(f"must be between 1 and {high}, got {value}")
        return value

    @field_validator("temperature", mode="before")
    @classmethod
    def _temperature_default(cls, value: Any) -> Any:
        return DEFAULT_TEMPERATURE if value is None else value

    @field_validator("temperature")
    @classmethod
    def _temperature(cls, value: float, info: ValidationInfo) -> float:
        high = _settings(info).max_temperature
        if not 0.0 <= value <= high:
            raise ValueError(f"must be between 0 and {high}, got {value}")
        return value

    def params(self) -> dict[str, Any]:
        """The decoding parameters as stored in ``queries.params`` (plain JSON values)."""
        return self.model_dump(mode="json", exclude={"question", "collection"})


def _missing_for(method: str, settings: Settings) -> str | None:
    """What this service lacks to serve ``method`` (None: nothing)."""
    if method == Method.EAGLE and settings.eagle_model is None:
        return "'eagle' needs an EAGLE head (SPECRAG_EAGLE_MODEL), which this service has not"
    if method == Method.SUFFIX and not settings.suffix:
        return "'suffix' is off on this service (SPECRAG_SUFFIX=0)"
    return None


def served_methods(settings: Settings) -> list[str]:
    """The methods this service answers: the allowed ones it has what they need for."""
    return [m for m in settings.allowed_methods if _missing_for(m, settings) is None]


def validate_request(settings: Settings, data: Any) -> QueryRequest:
    """The request with defaults filled in, or RequestError naming the first bad field."""
    try:
        return QueryRequest.model_validate(data, context={"settings": settings})
    except ValidationError as exc:
        first = exc.errors()[0]
        # The field itself, not the branch of a union that failed ("num_speculative_tokens.int").
        field = str(first["loc"][0]) if first["loc"] else "body"
        message = str(first["msg"]).removeprefix("Value error, ")
        raise RequestError(field, message) from None
