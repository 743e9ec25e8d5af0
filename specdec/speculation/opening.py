"""Where an answer may open: the prefill round's draft, from the user's text."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from specdec.tokenizer import TextTokenizer


class Opening:
    """Where an answer may open: as the user's text goes on after its first blank line. A grounded
    request is often an instruction, a blank line and the passage, and its answer copies the
    passage from its start: a code rewrite its function's `def` line, a copy-edit and many
    summaries its first words. That is a draft for the prefill round, where lookup has nothing
    (the prompt's tail is the chat template's assistant header). A code rewrite's answer mostly
    accepts the whole draft, an answer to a question none of it (benchmarks/policy_replay.py
    replays it with the profile's options).

    prefix, suffix: the chat template's tokens before and after a lone user turn's text; a prompt
    that is not framed by them (raw text, a conversation) has no opening. trailing: per token id,
    the newlines its text ends with; only_newlines: per token id, whether its text is newlines
    only (then the line end before it goes on)."""

    def __init__(self, prefix: list[int], suffix: list[int], trailing: np.ndarray, only_newlines: np.ndarray):
        self.prefix, self.suffix = prefix, suffix
        self.trailing, self.only_newlines = trailing.tolist(), only_newlines.tolist()  # (indexed one at a time)

    @classmethod
    def from_tokenizer(cls, tokenizer: TextTokenizer) -> Opening | None:
        """None where the tokenizer has no chat template (a prompt is then the text itself) or one
        that does not write the user's text once as it is (TextTokenizer.user_turn)."""
        turn = tokenizer.user_turn()
        if turn is None:
            return None
        texts = tokenizer.token_texts()
        trailing = np.array([len(t) - len(t.rstrip("\n")) for t in texts])
        only_newlines = np.array([bool(t) and not t.strip("\n") for t in texts])
        return cls(tokenizer.encode(turn[0]), tokenizer.encode(turn[1]), trailing, only_newlines)

    def span(self, prompt: Sequence[int]) -> tuple[int, int] | None:
        """Where the user's text goes on after its first blank line, and where it ends; None
        where it has none, or the prompt is not one user turn in the chat template."""
        first, end = len(self.prefix), len(prompt) - len(self.suffix)
        if end <= first or list(prompt[:first]) != self.prefix or list(prompt[end:]) != self.suffix:
            return None
        newlines = 0  # at the end of the text so far
        for i in range(first, end - 1):  # (a blank line that ends the text opens nothing)
            token = prompt[i]
            if token >= len(self.trailing):  # an id the model has and the tokenizer not
                newlines = 0
                continue
            newlines = self.trailing[token] + (newlines if self.only_newlines[token] else 0)
            if newlines >= 2:
                return i + 1, end
        return None
