"""Draft proposers that run inside the spec_decode process.

The draft-model proposer is a call to the draft engine (see specdec/spec_decode.py); what lives
here needs no model: prompt lookup (n-gram) decoding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specdec import loop
from specdec.verify import accepted_length


@dataclass(frozen=True)
class Lookup:
    start: int  # where the tokens after the match begin
    length: int  # tokens of the suffix matched; 0: no match
    guess: int | None = None  # a draft led by the engine's guess; then `start` indexes tokens + [guess]


NO_MATCH = Lookup(0, 0)
GUESSED = -1  # PromptLookup.evidence() of a draft the engine's guess leads: its own acceptance
# A guess may lead where lookup's own match is shorter than this. Replaying the held-out grounded
# prompts' outputs (copy_bound's way, with a smaller head trained on a quarter of the data):
# 2.51x priced, against 2.48x from one token and 2.34x from three; 2.33x without guesses.
GUESS_BELOW = 2


class NgramProposer:
    """Prompt lookup: find the longest suffix of the sequence (max_n down to min_n tokens) that
    occurred earlier, and propose the tokens that followed its most recent earlier occurrence.
    Grounded tasks (summarise, edit, answer from a passage) copy spans of the prompt; a model's
    own repetitions are caught too. Proposes nothing when there is no match: a plain step."""

    def __init__(self, min_n: int = 1, max_n: int = 4):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.min_n, self.max_n = min_n, max_n

    def matches(self, tokens: np.ndarray) -> tuple[np.ndarray, int]:
        """Where the tokens after each earlier occurrence of the longest matching suffix start,
        oldest first, and the suffix's length; (empty, 0) when no suffix of min_n..max_n tokens
        occurred earlier. Grows the match a token at a time from the earlier occurrences of the
        last token (a search per suffix length took ~0.17 ms a round at 400 tokens)."""
        tokens = np.asarray(tokens)
        length = len(tokens)
        if length < 2:
            return np.zeros(0, dtype=np.int64), 0
        ends = np.flatnonzero(tokens[: length - 1] == tokens[-1])  # where earlier 1-token matches end
        n = 1 if len(ends) else 0
        while len(ends) and n < min(self.max_n, length - 1):
            room = ends[ends >= n]  # with a token before the match
            longer = room[tokens[room - n] == tokens[length - 1 - n]]
            if not len(longer):
                break
            ends, n = longer, n + 1
        if n < self.min_n:
            return np.zeros(0, dtype=np.int64), 0
        return ends + 1, n

    def lookup(self, tokens: np.ndarray, resume: int | None = None, ranked: Sequence[int] = ()) -> Lookup:
        """The match a draft comes from: of the longest suffix's occurrences, those whose next
        token comes first in `ranked` (the engine's plausible next tokens, best first; a token not
        in it last), and of those the first whose continuation starts at or after `resume` (where
        the previous accepted copy left off: a copy goes on from there), else the most recent."""
        starts, n = self.matches(tokens)
        if not n:
            return NO_MATCH
        if len(ranked) and len(starts) > 1:
            following = tokens[starts]
            rank = np.full(len(starts), len(ranked))
            for i in reversed(range(len(ranked))):  # the best rank written last
                rank[following == ranked[i]] = i
            starts = starts[rank == rank.min()]
        if resume is not None and (later := starts[starts >= resume]).size:
            return Lookup(int(later[0]), n)
        return Lookup(int(starts[-1]), n)

    def propose(self, tokens: np.ndarray, k: int) -> np.ndarray:
        tokens = np.asarray(tokens)
        found = self.lookup(tokens) if k > 0 else NO_MATCH
        return tokens[found.start : found.start + k] if found.length else tokens[:0]


class PromptLookup:
    """One request's prompt lookups: the evidence its draft length is decided by (the length of
    the match) and the draft after it come from one search of the sequence.

    Among the suffix's matches it prefers the one that goes on with the token the engine ranks
    best among its guesses (heard(): the guess, then the other tokens it finds plausible), then
    the one that goes on from where its last accepted draft left off in the sequence
    (NgramProposer.lookup's resume): a rewrite copies its source in order, while the most recent
    occurrence of a short suffix is often elsewhere.

    Where the match is shorter than GUESS_BELOW tokens and the engine guessed the next token, the
    draft is the guess and then what lookup finds after it: a copy often starts where the text so
    far matches nothing (specdec/engine/guess.py). A match of one token keeps the lead if the
    engine finds its copy's next token plausible too: the copy it starts runs on, where a guess's
    run is cut short by what lookup finds after one token.
    benchmarks/copy_bound.py, greedy outputs replayed with drafts of 15 and priced with the bf16
    engine's forward times: held-out grounded prompts 3.00 tokens a round, 2.50x (2.90, 2.43x with
    the guess alone leading short matches; 2.62 tokens a round without guesses); built-in
    grounded 3.09, 2.57x (2.99, 2.50x)."""

    def __init__(self, ngram: NgramProposer, prompt_length: int):
        self.ngram, self.prompt_length = ngram, prompt_length
        self._found = (-1, NO_MATCH)  # (length of the sequence searched, what was found)
        # the last draft: (sequence length, start, tokens) of its copy, and the guess that led it
        self._drafted: tuple[int, int, int, int | None] | None = None
        self._resume: int | None = None  # where the last accepted draft's copy left off
        # (sequence length, the engine's guesses at its next token: its guess, then the other plausible ones)
        self._guesses: tuple[int, list[int]] | None = None

    def heard(self, length: int, guesses: list[int]) -> None:
        """The engine's guess at the token after the first `length` of the sequence, then the other
        tokens it finds plausible there ([]: none)."""
        self._guesses = (length, guesses) if guesses else None

    def find(self, tokens: list[int]) -> Lookup:
        if self._found[0] != len(tokens):
            self._follow(tokens)
            # In the prefill round the suffix is the prompt's own tail (after a chat template, the
            # assistant header), which the answer does not continue: none of 168 such draft
            # tokens over the built-in prompts was accepted, and they cost rows of every batch
            # they joined. Lookup starts with the first generated token.
            found = NO_MATCH
            if len(tokens) > self.prompt_length:
                guesses = self._guesses[1] if self._guesses and self._guesses[0] == len(tokens) else []
                found = self.ngram.lookup(np.asarray(tokens), self._resume, guesses)
                if guesses and found.length < GUESS_BELOW and not (found.length and tokens[found.start] in guesses):
                    guess = guesses[0]
                    after = self.ngram.lookup(np.asarray([*tokens, guess]), self._resume)
                    found = Lookup(after.start if after.length else len(tokens) + 1, after.length, guess)
            self._found = (len(tokens), found)
        return self._found[1]

    def _follow(self, tokens: list[int]) -> None:
        """Move the resume point past what the target accepted of the last draft."""
        if self._drafted is None:
            return
        length, start, count, lead = self._drafted
        self._drafted = None
        if lead is not None and tokens[length - 1 : length] != [lead]:
            return
        accepted = accepted_length(tokens[start : start + count], tokens[length:])
        if accepted:
            self._resume = start + accepted

    def evidence(self, tokens: list[int]) -> int:
        found = self.find(tokens)
        return GUESSED if found.guess is not None else found.length

    def draft(self, tokens: list[int], k: int) -> list[int]:
        found = self.find(tokens)
        if found.guess is not None and k > 0:
            copy = [*tokens, found.guess][found.start : found.start + k - 1]
            self._drafted = (len(tokens) + 1, found.start, len(copy), found.guess)
            return [found.guess, *copy]
        ids = tokens[found.start : found.start + k] if found.length else []
        if ids:
            self._drafted = (len(tokens), found.start, len(ids), None)
        return ids

    async def propose(self, tokens: list[int], k: int) -> loop.Draft:
        return loop.Draft(self.draft(tokens, k))
