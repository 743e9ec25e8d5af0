"""Prompt lookup (n-gram) decoding: drafts copied from the sequence itself, led where it matches
little by the engine's guess, a phrase of the model's own (phrases.py) or, in the prefill round,
the user's text's opening (opening.py). The other proposer, the draft model, is a call to the
draft engine (specdec/triton/service.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np

from specdec.engine.verify import accepted_length
from specdec.speculation import loop
from specdec.speculation.opening import Opening
from specdec.speculation.phrases import PhraseIndex


@dataclass(frozen=True)
class Lookup:
    start: int  # where the tokens after the match begin
    length: int  # tokens of the suffix matched; 0: no match
    guess: int | None = None  # a draft led by the engine's guess; then `start` indexes tokens + [guess]
    phrase: tuple[int, ...] = ()  # a draft from the model's own phrasing (PhraseIndex), not from the sequence
    opening_end: int = 0  # the prefill round's draft (Opening): the user's text from start to here


NO_MATCH = Lookup(0, 0)


class Lead(Enum):
    """What leads a draft other than a match in the sequence: PromptLookup.evidence() names it,
    and the controller keeps each one's acceptance apart from the matches' (by length)."""

    GUESS = "the engine's guess"
    PHRASE = "a phrase of the model's own (PhraseIndex)"
    OPENING = "the user's text's opening (Opening), in the prefill round"


# A guess may lead where lookup's own match is shorter than this. benchmarks/copy_bound.py's replay
# of the held-out grounded prompts' outputs (with a smaller head trained on a quarter of the data)
# priced 2 at 2.51x, against 2.48x for 1 and 2.34x for 3; 2.33x without guesses.
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

    def matches(self, tokens: Sequence[int], ends: Sequence[int] | None = None) -> tuple[list[int], int]:
        """Where the tokens after each earlier occurrence of the longest matching suffix start,
        oldest first, and the suffix's length; ([], 0) when no suffix of min_n..max_n tokens
        occurred earlier. `ends`: where the last token occurs before it, in order, where the
        caller keeps them (PromptLookup), else found by a scan.

        In Python, not numpy: a sequence's suffix has a few occurrences, and after a forward has
        emptied the caches the dozen small calls of a numpy search cost more than walking those
        few in Python."""
        tokens = list(tokens)
        if not tokens:
            return [], 0
        length, last = len(tokens), tokens[-1]
        if ends is None:
            ends = [p for p in range(length - 1) if tokens[p] == last]
        n = 1 if ends else 0
        while ends and n < min(self.max_n, length):
            before = tokens[length - 1 - n]
            longer = [p for p in ends if p >= n and tokens[p - n] == before]
            if not longer:
                break
            ends, n = longer, n + 1
        if n < self.min_n:
            return [], 0
        return [p + 1 for p in ends], n

    def lookup(
        self, tokens: Sequence[int], resume: int | None = None, ranked: Sequence[int] = (),
        ends: Sequence[int] | None = None,
    ) -> Lookup:  # fmt: skip
        """The match a draft comes from: of the longest suffix's occurrences, those whose next
        token comes first in `ranked` (the engine's plausible next tokens, best first; a token not
        in it last), and of those the first whose continuation starts at or after `resume` (where
        the previous accepted copy left off: a copy goes on from there), else the most recent.
        `ends`: as matches() takes them."""
        starts, n = self.matches(tokens, ends)
        if not n:
            return NO_MATCH
        if ranked and len(starts) > 1:
            rank = {}
            for i, token in enumerate(ranked):
                rank.setdefault(token, i)
            ranks = [rank.get(tokens[s], len(ranked)) for s in starts]
            best = min(ranks)
            starts = [s for s, r in zip(starts, ranks, strict=True) if r == best]
        if resume is not None and (later := [s for s in starts if s >= resume]):
            return Lookup(later[0], n)
        return Lookup(starts[-1], n)

    def propose(self, tokens: np.ndarray, k: int) -> np.ndarray:
        tokens = np.asarray(tokens)
        found = self.lookup(tokens.tolist()) if k > 0 else NO_MATCH
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
    run is cut short by what lookup finds after one token. Where a phrase index is given and finds
    a phrase of the model's after the sequence (PhraseIndex), that phrase leads before the guess.
    In the prefill round, where an Opening is given, the draft is the user's text's opening.
    benchmarks/copy_bound.py replays greedy outputs through it, with and without the guess and
    the phrase index, priced with the engine's forward times."""

    def __init__(
        self,
        ngram: NgramProposer,
        prompt_length: int,
        phrases: PhraseIndex | None = None,
        phrase_wanted: Callable[[], bool] = lambda: True,
        opening: Opening | None = None,
    ):
        """phrase_wanted: asked before the phrase index is searched (a search costs far more than a
        lookup), whether a phrase's draft could be part of the next round (Controller.would_draft),
        as the engine is asked for its guess only then."""
        self.ngram, self.prompt_length, self.phrases = ngram, prompt_length, phrases
        self.phrase_wanted, self.opening = phrase_wanted, opening
        self._found = (-1, NO_MATCH)  # (length of the sequence searched, what was found)
        # the last draft: (sequence length, start, tokens) of its copy, and the guess that led it
        self._drafted: tuple[int, int, int, int | None] | None = None
        self._resume: int | None = None  # where the last accepted draft's copy left off
        # (sequence length, the engine's guesses at its next token: its guess, then the other plausible ones)
        self._guesses: tuple[int, list[int]] | None = None
        # each token's positions in the sequence, before `_indexed` (a request's sequence only grows)
        self._positions: dict[int, list[int]] = {}
        self._indexed = 0

    def _ends(self, tokens: list[int], token: int) -> list[int]:
        """Where `token` occurs in the sequence before its last token (NgramProposer.matches()'s
        ends), from the positions kept."""
        for p in range(self._indexed, len(tokens) - 1):
            self._positions.setdefault(tokens[p], []).append(p)
        self._indexed = max(self._indexed, len(tokens) - 1)
        return self._positions.get(token, [])

    def heard(self, length: int, guesses: list[int]) -> None:
        """The engine's guess at the token after the first `length` of the sequence, then the other
        tokens it finds plausible there ([]: none)."""
        self._guesses = (length, guesses) if guesses else None

    def find(self, tokens: list[int]) -> Lookup:
        if self._found[0] != len(tokens):
            self._follow(tokens)
            # In the prefill round the suffix is the prompt's own tail (after a chat template, the
            # assistant header), which the answer does not continue: such drafts are all but never
            # accepted, and they cost rows of every batch they join. Lookup starts with the first
            # generated token; the prefill round may draft the user's text's opening.
            found = NO_MATCH
            if len(tokens) == self.prompt_length:
                if self.opening is not None and (span := self.opening.span(tokens)) is not None:
                    found = Lookup(span[0], 0, opening_end=span[1])
            elif len(tokens) > self.prompt_length:
                guesses = self._guesses[1] if self._guesses and self._guesses[0] == len(tokens) else []
                found = self.ngram.lookup(tokens, self._resume, guesses, self._ends(tokens, tokens[-1]))
                if found.length < GUESS_BELOW:  # a phrase of the model's, else the guess, may lead
                    if self.phrases is not None and self.phrase_wanted() and (phrase := self.phrases.draft(tokens)):
                        found = Lookup(0, 0, phrase=tuple(phrase))
                    elif guesses and not (found.length and tokens[found.start] in guesses):
                        guess = guesses[0]
                        ends = self._ends(tokens, guess) + ([len(tokens) - 1] if tokens[-1] == guess else [])
                        after = self.ngram.lookup([*tokens, guess], self._resume, ends=ends)
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

    def evidence(self, tokens: list[int]) -> int | Lead:
        """The length of the match the next draft copies from (0: nothing to draft), or what leads it."""
        found = self.find(tokens)
        if found.phrase:
            return Lead.PHRASE
        if found.opening_end:
            return Lead.OPENING
        return Lead.GUESS if found.guess is not None else found.length

    def draft(self, tokens: list[int], k: int) -> list[int]:
        found = self.find(tokens)
        if found.phrase:
            return list(found.phrase[:k])
        if found.guess is not None and k > 0:
            copy = [*tokens, found.guess][found.start : found.start + k - 1]
            self._drafted = (len(tokens) + 1, found.start, len(copy), found.guess)
            return [found.guess, *copy]
        if found.opening_end:
            ids = tokens[found.start : min(found.start + k, found.opening_end)]
        else:
            ids = tokens[found.start : found.start + k] if found.length else []
        if ids:
            self._drafted = (len(tokens), found.start, len(ids), None)
        return ids

    async def propose(self, tokens: list[int], k: int) -> loop.Draft:
        return loop.Draft(self.draft(tokens, k))
