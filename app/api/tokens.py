"""The question's length in tokens of the target's tokenizer, loaded once per API process.

The character limit alone lets a question of 2000 rare characters (each several tokens) crowd
the retrieved passages out of the prompt; the token limit is the one that matches the model. The
tokenizer is loaded on first use (a few MB, no weights); a target without a tokenizer (token ids
in, token ids out) has only the character limit.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from app.lifecycle.queries import RequestError
from app.settings import Settings

log = logging.getLogger(__name__)
_lock = threading.Lock()
Counter = Callable[[str], int]


def token_counter(state: Any, settings: Settings) -> Counter | None:
    """A function counting tokens with the target's tokenizer (cached on ``state``), or None."""
    with _lock:
        if not hasattr(state, "count_tokens"):
            state.count_tokens = _load(settings)
        counter: Counter | None = state.count_tokens
        return counter


def _load(settings: Settings) -> Counter | None:
    try:
        from transformers import AutoTokenizer  # heavy: transformers

        tokenizer = AutoTokenizer.from_pretrained(str(settings.target_model))
    except Exception as exc:  # no tokenizer shipped with the target: characters only
        log.warning("no tokenizer in %s; question limit in characters only (%s)",
                    settings.target_model, exc)  # fmt: skip
        return None

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    return count


def check_question_tokens(counter: Counter | None, settings: Settings, question: str) -> None:
    """RequestError naming ``question`` when it is longer than ``max_question_tokens`` tokens."""
    limit = settings.max_question_tokens
    if counter is None or limit <= 0:
        return
    tokens = counter(question)
    if tokens > limit:
        raise RequestError("question", f"longer than {limit} tokens ({tokens})")
