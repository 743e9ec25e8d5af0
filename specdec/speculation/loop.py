"""The draft-verify loop of one request, independent of Triton and of the engine behind it.

    propose(tokens, k) -> Draft          (n-gram lookup, or a draft-engine call)
    verify(tokens, draft) -> new tokens  (a target-engine call: accepted drafts + one token)

Every token the loop emits comes from the target (accepted drafts are tokens the target's own
decision procedure produced too), so the output is the target's whatever the proposer does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from specdec.engine.verify import accepted_length


@dataclass(frozen=True)
class Draft:
    ids: list[int]
    logits: np.ndarray | None = None  # (len(ids), V) when the proposer sampled from a distribution


NO_DRAFT = Draft([])


@dataclass
class AcceptanceStats:
    rounds: int = 0  # target calls
    drafts: int = 0  # rounds that carried at least one draft token
    draft_tokens: int = 0
    accepted_tokens: int = 0
    drafted_at: list[int] = field(default_factory=list)  # per draft position: times drafted
    accepted_at: list[int] = field(default_factory=list)  # per draft position: times accepted
    last_draft: int = 0  # the latest round's draft length
    last_accepted: int = 0  # and how many of it the target accepted

    def record(self, num_draft: int, num_accepted: int) -> None:
        self.rounds += 1
        self.last_draft, self.last_accepted = num_draft, num_accepted
        if num_draft == 0:
            return
        self.drafts += 1
        self.draft_tokens += num_draft
        self.accepted_tokens += num_accepted
        grow = num_draft - len(self.drafted_at)
        if grow > 0:
            self.drafted_at += [0] * grow
            self.accepted_at += [0] * grow
        for i in range(num_draft):
            self.drafted_at[i] += 1
            self.accepted_at[i] += i < num_accepted

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens per drafted round: accepted / drafts + 1 (the target's own token)."""
        return self.accepted_tokens / self.drafts + 1 if self.drafts else 1.0


@dataclass(frozen=True)
class RequestSpec:
    prompt_ids: list[int]
    max_tokens: int
    num_draft_tokens: int  # requested draft length; 0 turns speculation off
    end_id: int | None = None
    stop_words: tuple[tuple[int, ...], ...] = ()
    min_tokens: int = 0  # the end token and stop words end nothing before this many tokens


class Generation:
    """State of one request: its tokens, why it finished, and its acceptance statistics."""

    def __init__(self, spec: RequestSpec):
        self.spec = spec
        self.tokens: list[int] = list(spec.prompt_ids)
        self.generated: list[int] = []
        self.finish_reason: str | None = None  # "length", "eos" or "stop"
        self.stats = AcceptanceStats()

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def min_tokens_left(self) -> int:
        """Tokens still to generate before the end token may come (an engine call's min_tokens)."""
        return max(0, self.spec.min_tokens - len(self.generated))

    def draft_budget(self, k: int) -> int:
        """A verification emits up to k + 1 tokens: never draft past max_tokens."""
        return max(0, min(k, self.spec.max_tokens - len(self.generated) - 1))

    def accept(self, draft: Sequence[int], target_tokens: Sequence[int]) -> list[int]:
        """Record one round; return the tokens to stream, with the stop conditions applied."""
        if not target_tokens:
            raise RuntimeError("the target returned no token")
        self.stats.record(len(draft), accepted_length(draft, target_tokens))
        out: list[int] = []
        for tok in target_tokens:
            early = len(self.generated) < self.spec.min_tokens  # (the engines keep end_id out of these)
            if tok == self.spec.end_id and not early:
                self.finish_reason = "eos"
                break
            out.append(tok)
            self.tokens.append(tok)
            self.generated.append(tok)
            if not early and self._hit_stop_word():
                self.finish_reason = "stop"
                break
            if len(self.generated) >= self.spec.max_tokens:
                self.finish_reason = "length"
                break
        return out

    def _hit_stop_word(self) -> bool:
        return any(
            len(w) <= len(self.generated) and tuple(self.generated[-len(w) :]) == w for w in self.spec.stop_words if w
        )


Proposer = Callable[[list[int], int], Awaitable[Draft]]
Verifier = Callable[[list[int], Draft], Awaitable[list[int]]]
ChooseK = Callable[[Generation], int]


def fixed_k(gen: Generation) -> int:
    return gen.draft_budget(gen.spec.num_draft_tokens)


async def run(
    gen: Generation,
    propose: Proposer,
    verify: Verifier,
    choose_k: ChooseK = fixed_k,
    cancelled: Callable[[], bool] = lambda: False,
) -> AsyncIterator[list[int]]:
    """Yield each round's new tokens until the request finishes or is cancelled (checked before
    each round, so a cancelled request costs at most the round already running)."""
    while not gen.finished:
        if cancelled():
            gen.finish_reason = "cancelled"
            return
        k = choose_k(gen)
        draft = await propose(list(gen.tokens), k) if k > 0 else NO_DRAFT
        new = await verify(list(gen.tokens), draft)
        yield gen.accept(draft.ids, new)
