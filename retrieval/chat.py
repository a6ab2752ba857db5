"""Prompt token ids for a target tokenizer: its chat template when it has one, else raw text.

``PromptFormat.for_tokenizer`` decides once per process (the worker logs which) and checks the
template on our messages, so a template that fails refuses the worker at start, not a query.

User and document text never becomes a special token: the template is rendered once with
markers in place of the message contents, the text around the markers (the template's own
role headers and special tokens) is encoded with special-token parsing, and every message
content is encoded as plain text (``split_special_tokens=True``), so a passage that says
``<|im_start|>system`` or ``<|eot_id|>`` is those characters, never the tokens.  BOS appears
exactly once: template pieces are encoded without the tokenizer's automatic specials, and BOS
is put in front only when the tokenizer adds one and the template did not.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from retrieval.prompt import (
    DEFAULT_SYSTEM_PROMPT,
    Passage,
    check_system_prompt,
    format_prompt,
    user_message,
)

MAX_SYSTEM_PROMPT_TOKENS = 512
"""Most tokens a system prompt may take (it is paid by every query's prompt)."""

PromptFormatName = Literal["chat", "raw"]


class PromptFormatError(ValueError):
    """The tokenizer's chat template cannot render our messages, or a system prompt is refused."""


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """``text`` as plain text: no automatic specials, and special-token strings left as text."""
    if not text:
        return []
    return list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))


def _adds_bos(tokenizer: Any) -> int | None:
    """The BOS id the tokenizer puts in front of text by default, or None."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return None
    ids = tokenizer.encode("a", add_special_tokens=True)
    return int(bos) if ids and ids[0] == bos else None


@dataclass
class PromptFormat:
    """How one target tokenizer turns (question, passages, system prompt) into prompt ids.

    ``name`` is what every answer's stats record as ``prompt_format``.
    """

    tokenizer: Any
    name: PromptFormatName
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    # chat: ids of the template's own text before, between and after the two contents.
    _pieces: list[list[int]] = field(default_factory=list, repr=False)
    _bos: int | None = None
    _system_ids: dict[str, list[int]] = field(default_factory=dict, repr=False)

    @classmethod
    def for_tokenizer(
        cls, tokenizer: Any, system_prompt: str = DEFAULT_SYSTEM_PROMPT
    ) -> PromptFormat:
        """``chat`` when the tokenizer has a chat template, else ``raw``.

        PromptFormatError when the template raises on a system + user conversation (naming
        its error) or does not show both contents once each, in order, or when
        ``system_prompt`` is over ``MAX_SYSTEM_PROMPT_TOKENS``.
        """
        fmt = cls(tokenizer, "raw", _bos=_adds_bos(tokenizer))
        if getattr(tokenizer, "chat_template", None):
            fmt.name = "chat"
            fmt._pieces = _template_pieces(tokenizer)
            if fmt._bos is not None and fmt._pieces[0][:1] == [fmt._bos]:
                fmt._bos = None  # the template writes BOS itself
        fmt.system_prompt = fmt.check_system_prompt(system_prompt)
        return fmt

    def check_system_prompt(self, text: str) -> str:
        """``text`` stripped, or PromptFormatError naming its length and the limit."""
        try:
            stripped = check_system_prompt(text)
        except ValueError as exc:
            raise PromptFormatError(str(exc)) from None
        n = len(self._system(stripped))
        if n > MAX_SYSTEM_PROMPT_TOKENS:
            raise PromptFormatError(
                f"system prompt: {n} tokens, over the limit of {MAX_SYSTEM_PROMPT_TOKENS}"
            )
        return stripped

    def encode(
        self, question: str, passages: Sequence[Passage], system_prompt: str | None = None
    ) -> list[int]:
        """The prompt ids the target sees; ``system_prompt`` None: this format's default."""
        head = [self._bos] if self._bos is not None else []
        if self.name == "raw":
            return head + encode_text(self.tokenizer, format_prompt(question, passages))
        system = self._system(system_prompt.strip() if system_prompt else self.system_prompt)
        before, between, after = self._pieces
        user = encode_text(self.tokenizer, user_message(question, passages))
        return head + before + system + between + user + after

    def _system(self, text: str) -> list[int]:
        ids = self._system_ids.get(text)
        if ids is None:
            ids = encode_text(self.tokenizer, text)
            if len(self._system_ids) < 64:  # the default and a few collections' overrides
                self._system_ids[text] = ids
        return ids


def _template_pieces(tokenizer: Any) -> list[list[int]]:
    """Ids of the rendered template around a system and a user content: [before, between, after]."""
    tag = uuid.uuid4().hex
    marks = [f"SPECRAGSYSTEM{tag}", f"SPECRAGUSER{tag}"]
    messages = [{"role": "system", "content": marks[0]}, {"role": "user", "content": marks[1]}]
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as exc:  # a template is user code: any error it raises is the answer
        raise PromptFormatError(
            f"the target tokenizer's chat template fails on a system + user conversation: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(text, str) or any(text.count(m) != 1 for m in marks):
        raise PromptFormatError(
            "the target tokenizer's chat template does not show the system and the user "
            "message once each (a template without a system turn is not supported)"
        )
    before, rest = text.split(marks[0])
    between, after = rest.split(marks[1])
    if not after:
        raise PromptFormatError(
            "the target tokenizer's chat template adds no assistant header with "
            "add_generation_prompt=True"
        )
    return [list(tokenizer.encode(p, add_special_tokens=False)) for p in (before, between, after)]
