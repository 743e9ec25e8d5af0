"""Draft proposers that run inside the spec_decode process.

The draft-model proposer is a call to the draft engine (see specdec/spec_decode.py); what lives
here needs no model: prompt lookup (n-gram) decoding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from numba import njit
from numpy.lib.stride_tricks import sliding_window_view
from safetensors.numpy import load_file

from specdec import loop
from specdec.verify import accepted_length

if TYPE_CHECKING:
    from specdec.tokenizer import TextTokenizer


@dataclass(frozen=True)
class Lookup:
    start: int  # where the tokens after the match begin
    length: int  # tokens of the suffix matched; 0: no match
    guess: int | None = None  # a draft led by the engine's guess; then `start` indexes tokens + [guess]
    phrase: tuple[int, ...] = ()  # a draft from the model's own phrasing (PhraseIndex), not from the sequence
    opening_end: int = 0  # the prefill round's draft (Opening): the user's text from start to here


NO_MATCH = Lookup(0, 0)
GUESSED = -1  # PromptLookup.evidence() of a draft the engine's guess leads: its own acceptance
PHRASED = -2  # PromptLookup.evidence() of a draft from the phrase index: its own acceptance
OPENED = -3  # PromptLookup.evidence() of the prefill round's draft, the user's text's opening (Opening)
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

    def matches(self, tokens: Sequence[int], ends: Sequence[int] | None = None) -> tuple[list[int], int]:
        """Where the tokens after each earlier occurrence of the longest matching suffix start,
        oldest first, and the suffix's length; ([], 0) when no suffix of min_n..max_n tokens
        occurred earlier. `ends`: where the last token occurs before it, in order, where the
        caller keeps them (PromptLookup), else found by a scan.

        In Python, not numpy: a sequence's suffix has a few occurrences, and after a forward has
        emptied the caches each of the ~10 numpy calls of suffix_matches() took ~5 us."""
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
    arXiv:2411.04975, with a fixed corpus). Replayed (benchmarks/copy_bound.py): code rewrites +6%
    tokens a second, the held-out and fresh grounded mixes +2%.

    `tokens`: the outputs, each led by its prompt's last tokens (the chat template's assistant
    header: a match at an answer's start) and ended by SEPARATOR, which no draft crosses."""

    SEPARATOR = SEPARATOR

    # Replayed over the held-out grounded outputs (HISTORY item 36), priced: from 2 matched tokens
    # 2.107x, from 3 2.172x, from 4 2.188x (fresh prompts: 3 a little better); min_share 0, 0.3,
    # 0.5: 2.172x, 2.183x, 2.186x from 3 tokens.
    def __init__(
        self, tokens: np.ndarray, min_n: int = 3, max_n: int = 16, min_share: float = 0.5, max_draft: int = 16
    ):
        self.tokens = np.asarray(tokens, dtype=np.int32)
        self.min_n, self.max_n, self.min_share, self.max_draft = min_n, max_n, min_share, max_draft
        # Where each run of `lead` tokens ends, by the run's key (sorted; in corpus order within a
        # key): the occurrences of the sequence's last tokens are a binary search away. From the
        # last token's occurrences alone (thousands for a common one, scattered over the 325k-token
        # corpus) the search took ~0.1 ms a round.
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
        [] where no suffix of min_n tokens occurs). Compiled (phrase_draft): right after a forward
        has emptied the caches, its ~10 numpy calls took ~0.2 ms a round in Python."""
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


class Opening:
    """Where an answer may open: as the user's text goes on after its first blank line. A grounded
    request is often an instruction, a blank line and the passage, and its answer copies the
    passage from its start: a code rewrite its function's `def` line, a copy-edit and many
    summaries its first words. That is a draft for the prefill round, where lookup has nothing
    (the prompt's tail is the chat template's assistant header). Replayed over the held-out
    grounded prompts' greedy outputs, a draft of 15 from there had 7.4 tokens accepted on average
    (all 15 for each of the 8 code rewrites, none for the 6 answers to a question).

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
    benchmarks/copy_bound.py, greedy outputs replayed with drafts of 15 and priced with the bf16
    engine's forward times: held-out grounded prompts 3.00 tokens a round, 2.50x (2.90, 2.43x with
    the guess alone leading short matches; 2.62 tokens a round without guesses); built-in
    grounded 3.09, 2.57x (2.99, 2.50x)."""

    def __init__(
        self,
        ngram: NgramProposer,
        prompt_length: int,
        phrases: PhraseIndex | None = None,
        phrase_wanted: Callable[[], bool] = lambda: True,
        opening: Opening | None = None,
    ):
        """phrase_wanted: asked before the phrase index is searched (~0.1 ms a search), whether a
        phrase's draft could be part of the next round (Controller.would_draft), as the engine is
        asked for its guess only then."""
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
            # assistant header), which the answer does not continue: none of 168 such draft
            # tokens over the built-in prompts was accepted, and they cost rows of every batch
            # they joined. Lookup starts with the first generated token; the prefill round may
            # draft the user's text's opening.
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

    def evidence(self, tokens: list[int]) -> int:
        found = self.find(tokens)
        if found.phrase:
            return PHRASED
        if found.opening_end:
            return OPENED
        return GUESSED if found.guess is not None else found.length

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
