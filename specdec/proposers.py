"""Draft proposers that run inside the spec_decode process.

The draft-model proposer is a call to the draft engine (see specdec/triton/spec_decode.py);
what lives here needs no model: prompt lookup (n-gram) decoding.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


class NgramProposer:
    """Prompt lookup: find the longest suffix of the sequence (max_n down to min_n tokens) that
    occurred earlier, and propose the tokens that followed its most recent earlier occurrence.
    Grounded tasks (summarise, edit, answer from a passage) copy spans of the prompt; a model's
    own repetitions are caught too. Proposes nothing when there is no match: a plain step."""

    def __init__(self, min_n: int = 1, max_n: int = 4):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.min_n, self.max_n = min_n, max_n

    def matches(self, tokens: np.ndarray) -> np.ndarray:
        """Where the tokens after each earlier occurrence of the longest matching suffix start,
        oldest first; empty when no suffix of min_n..max_n tokens occurred earlier."""
        tokens = np.asarray(tokens)
        length = len(tokens)
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            # windows starting at 0 .. length-n-1: each has at least one token after it
            windows = sliding_window_view(tokens[: length - 1], n)
            hits = np.flatnonzero((windows == tokens[length - n :]).all(axis=1))
            if len(hits):
                return hits + n
        return np.zeros(0, dtype=np.int64)

    def propose(self, tokens: np.ndarray, k: int) -> np.ndarray:
        tokens = np.asarray(tokens)
        starts = self.matches(tokens) if k > 0 else ()
        if len(starts) == 0:
            return tokens[:0]
        return tokens[starts[-1] : starts[-1] + k]
