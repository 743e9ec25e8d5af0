"""The model's own phrasing as a source of drafts: a phrase index over its greedy outputs
(`specdec train-guess-head` writes it), searched by the longest suffix of the sequence."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from numba import njit
from numpy.lib.stride_tricks import sliding_window_view
from safetensors.numpy import load_file

SEPARATOR = -1  # PhraseIndex.SEPARATOR: ends each answer of its corpus
KEY_TOKENS, KEY_BITS = 3, 21  # a run key's tokens and bits per token id (vocabularies up to 2M tokens)


def run_keys(tokens: np.ndarray, lead: int) -> np.ndarray:
    """(len(tokens) - lead + 1,) int64: a key for each run of `lead` (<= KEY_TOKENS) tokens, the
    one ending at lead - 1 + i at i, equal exactly where the runs are (SEPARATOR, -1, included)."""
    if len(tokens) < lead:
        return np.zeros(0, dtype=np.int64)
    windows = sliding_window_view(np.asarray(tokens, dtype=np.int64) + 1, lead)
    keys = np.zeros(len(windows), dtype=np.int64)
    for j in range(lead):
        keys = (keys << KEY_BITS) | windows[:, j]
    return keys


class PhraseIndex:
    """The model's own phrasing: its greedy outputs over many prompts, one after another
    (`specdec train-guess-head` writes them). Where prompt lookup finds little, the model is often
    starting one of its stock phrases (after "Here's": " a revised version of the paragraph with
    suggested edits for grammar, style, and clarity"), which other answers of its own hold: the
    draft is the continuation most of the longest matching suffix's occurrences share, a token at
    a time while at least `min_share` of the occurrences still agree (SuffixDecoding's idea,
    arXiv:2411.04975, with a fixed corpus). benchmarks/copy_bound.py replays what it adds to
    prompt lookup.

    `tokens`: the outputs, each led by its prompt's last tokens (the chat template's assistant
    header: a match at an answer's start) and ended by SEPARATOR, which no draft crosses."""

    SEPARATOR = SEPARATOR

    # min_n and min_share as benchmarks/copy_bound.py priced them over the held-out grounded
    # outputs: from 2 matched tokens 2.107x, from 3 2.172x, from 4 2.188x (fresh prompts: 3 a
    # little better); min_share 0, 0.3, 0.5: 2.172x, 2.183x, 2.186x from 3 tokens.
    def __init__(
        self, tokens: np.ndarray, min_n: int = 3, max_n: int = 16, min_share: float = 0.5, max_draft: int = 16
    ):
        self.tokens = np.asarray(tokens, dtype=np.int32)
        self.min_n, self.max_n, self.min_share, self.max_draft = min_n, max_n, min_share, max_draft
        # Where each run of `lead` tokens ends, by the run's key (sorted; in corpus order within a
        # key): the occurrences of the sequence's last tokens are a binary search away. From the
        # last token's occurrences alone (thousands for a common one, scattered over the corpus)
        # the search would cost a share of every round.
        self.lead = min(min_n, KEY_TOKENS)
        keys = run_keys(self.tokens, self.lead)
        self._order = np.argsort(keys, kind="stable") + (self.lead - 1)
        self._keys = keys[self._order - (self.lead - 1)]
        # the corpus with max_draft separators after it: every continuation has max_draft tokens
        self._padded = np.concatenate([self.tokens, np.full(max_draft, self.SEPARATOR, dtype=np.int32)])
        self._draft = np.empty(max_draft, dtype=np.int32)
        self.draft([0] * self.lead)  # phrase_draft compiled (or loaded from numba's cache) now, not in a round

    @classmethod
    def load(cls, path: str | Path) -> PhraseIndex:
        try:
            return cls(load_file(str(path))["tokens"])
        except KeyError:
            raise ValueError(f"{path}: not a phrase index (no 'tokens')") from None

    def draft(self, tokens: Sequence[int]) -> list[int]:
        """The continuation the phrase index proposes after `tokens` (at most max_draft tokens;
        [] where no suffix of min_n tokens occurs). Compiled (phrase_draft): in Python, its ~10
        numpy calls right after a forward has emptied the caches would cost a share of every
        round."""
        if len(tokens) < self.lead:
            return []
        key = 0
        for token in tokens[-self.lead :]:  # run_keys() of one run
            key = (key << KEY_BITS) | (int(token) + 1)
        tail = np.array(tokens[-self.max_n :], dtype=np.int32)
        count = phrase_draft(self._padded, self._order, self._keys, key, tail, self.lead, self.min_n,
                             self.min_share, self._draft)  # fmt: skip
        return self._draft[:count].tolist()


@njit(cache=True)
def phrase_draft(padded, order, keys, key, tail, lead, min_n, min_share, out):  # pragma: no cover - compiled
    """PhraseIndex.draft() into out (its max_draft tokens at most), returning how many: of the runs
    of lead tokens keyed `key` (where they end: order's span of sorted keys), those whose match
    with the tail grows longest (up to len(tail) tokens; min_n at least), then a token at a time
    the one most of those left share (the lower id in a tie), while at least min_share of them
    agree and it is not the separator (the corpus padded with max_draft of them)."""
    first, last = np.searchsorted(keys, key), np.searchsorted(keys, key + 1)
    length = len(tail)
    matched = np.empty(last - first, dtype=np.int64)  # each occurrence's suffix length
    longest = 0
    for i in range(first, last):
        end, n = order[i], lead
        while n < length and end - n >= 0 and padded[end - n] == tail[length - 1 - n]:
            n += 1
        matched[i - first] = n
        longest = max(longest, n)
    if longest < min_n:
        return 0
    starts = np.array([order[i] + 1 for i in range(first, last) if matched[i - first] == longest])
    count = 0
    while count < len(out) and len(starts):
        following = np.sort(padded[starts + count])
        best, most, run = following[0], 0, 0
        for j in range(len(following)):  # the longest run of one token; the first (lowest) of a tie
            run = run + 1 if j > 0 and following[j] == following[j - 1] else 1
            if run > most:
                best, most = following[j], run
        if best == SEPARATOR or most < min_share * len(starts):
            break
        out[count] = best
        starts = starts[padded[starts + count] == best]
        count += 1
    return count


def phrase_tokens(pairs: Sequence[tuple[np.ndarray, np.ndarray]], lead: int = 6) -> np.ndarray:
    """A PhraseIndex's tokens from (prompt, output) pairs: each output led by its prompt's last
    `lead` tokens and ended by PhraseIndex.SEPARATOR."""
    parts = [np.concatenate([p[-lead:], o, [PhraseIndex.SEPARATOR]]) for p, o in pairs]
    return np.concatenate(parts).astype(np.int32) if parts else np.zeros(0, dtype=np.int32)
