"""Text from outside the policy is data: a special token's text in it stays plain text.

Tool results, user turns an environment sends, and the opening messages and tool specs reach the
model through the chat template. If ``<|im_end|>\\n<|im_start|>assistant`` inside a tool result
(or a web page a tool returns) were encoded as the control tokens, the tool could forge turn
boundaries in the model's context. So the data is rendered with each special token's text swapped
for a placeholder (private-use characters the template copies through); the rendering is split at
the special tokens left, which the template wrote itself and which stay special, and every piece
between them is encoded with ``split_special_tokens=True`` after the placeholders are swapped
back. Data without a special token's text takes the ordinary path: the rendering is encoded in
one call, exactly as before. Non-special added tokens (Qwen's ``<tool_call>``) are ordinary
vocabulary and are matched as usual.
"""

from __future__ import annotations

import re
import weakref
from typing import Any

_OPEN, _CLOSE = "\U000f0000", "\U000f0001"  # Supplementary Private Use Area-A
_PLACEHOLDER = re.compile(f"{_OPEN}(\\d+){_CLOSE}")


def special_texts(tokenizer: Any) -> list[str]:
    """The text of every special token of ``tokenizer``, longest first."""
    texts = {str(t) for t in getattr(tokenizer, "all_special_tokens", None) or ()}
    for added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(added, "special", False):
            texts.add(str(getattr(added, "content", added)))
    return sorted((t for t in texts if t), key=lambda t: (-len(t), t))


class Escaper:
    """``hide`` data before rendering; ``encode`` the rendering into ids where only the
    template's own special tokens are special. ``Escaper.of(tokenizer)`` reuses one."""

    _cache: weakref.WeakKeyDictionary[Any, Escaper] = weakref.WeakKeyDictionary()

    @classmethod
    def of(cls, tokenizer: Any) -> Escaper:
        try:
            return cls._cache[tokenizer]
        except (KeyError, TypeError):  # TypeError: an object that takes no weak reference
            esc = cls(tokenizer)
            try:
                cls._cache[tokenizer] = esc
            except TypeError:
                pass
            return esc

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.specials = special_texts(tokenizer)
        # The placeholder characters themselves are hidden too, so any data round-trips.
        self._table = [*self.specials, _OPEN, _CLOSE]
        self._index = {t: i for i, t in enumerate(self._table)}
        self._find = re.compile("|".join(re.escape(t) for t in self._table))
        self._split = (
            re.compile("(" + "|".join(re.escape(t) for t in self.specials) + ")")
            if self.specials
            else None
        )

    def hide(self, value: Any) -> Any:
        """``value`` (a string, or dicts and lists holding strings) with each special token's
        text swapped for a placeholder; dict keys and non-strings are left as they are."""
        if isinstance(value, str):
            return self._find.sub(lambda m: f"{_OPEN}{self._index[m.group(0)]}{_CLOSE}", value)
        if isinstance(value, dict):
            return {k: self.hide(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(self.hide(v) for v in value)
        return value

    def reveal(self, text: str) -> str:
        """The placeholders back to the texts they stand for."""
        return _PLACEHOLDER.sub(lambda m: self._table[int(m.group(1))], text)

    def encode(self, text: str) -> tuple[str, list[int]]:
        """A rendering of hidden data → ``(its real text, ids)``: special tokens where the
        template wrote them, the data's special-token texts as plain characters."""
        if _OPEN not in text:
            return text, plain_ids(self.tokenizer, text, split_special=False)
        if self._split is None:  # no special tokens at all: nothing to keep apart
            real = self.reveal(text)
            return real, plain_ids(self.tokenizer, real, split_special=False)
        ids: list[int] = []
        for i, piece in enumerate(self._split.split(text)):
            if i % 2:  # a special token the template wrote
                ids.append(int(self.tokenizer.convert_tokens_to_ids(piece)))
            elif piece:
                ids.extend(plain_ids(self.tokenizer, self.reveal(piece), split_special=True))
        return self.reveal(text), ids


def plain_ids(tokenizer: Any, text: str, split_special: bool) -> list[int]:
    """``text`` → ids without BOS; ``split_special``: special tokens' texts as plain text."""
    kwargs = {"split_special_tokens": True} if split_special else {}
    return list(tokenizer(text, add_special_tokens=False, **kwargs)["input_ids"])


class PlainTokenizer:
    """A tokenizer view that encodes special tokens' texts as plain text, for counting (and
    cutting) data in the tokens it will take in the episode (``tools.executor.truncate_text``)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return plain_ids(self.tokenizer, text, split_special=True)

    def decode(self, ids: list[int], **kwargs: Any) -> str:
        return self.tokenizer.decode(ids, **kwargs)
