"""`specdec check`: speculation must reproduce plain decoding token for token.

Every prompt runs with speculation off (the baseline: draft_method none) and with each proposer
and draft length through spec_decode with token ids (no tokenizer between us and the tokens):
greedy, or sampled with a seed per prompt (`Sampled`), which a deterministic proposer (prompt
lookup) must reproduce too: a draft token is accepted only where it is the token plain sampling
draws with that seed (specdec/engine/verify.py). A draft model's sampled drafts are verified by
rejection sampling, exact in distribution only, so a sampled check takes prompt lookup alone.
All the requests of a check are in flight together, `concurrency` at a time and mixed across
arms, so exactness is checked under batching too. Any prompt whose tokens differ from the
baseline is reported with the first differing position.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from specdec.client.client import Record, RequestParams


@dataclass(frozen=True)
class CheckArm:
    proposer: str  # none | ngram | draft_model
    num_draft_tokens: int

    @property
    def name(self) -> str:
        return "baseline" if self.proposer == "none" else f"{self.proposer}:{self.num_draft_tokens}"


BASELINE = CheckArm("none", 0)
TOKEN_EXACT_WHEN_SAMPLED = ("none", "ngram")  # proposers whose sampled tokens equal plain sampling's


@dataclass(frozen=True)
class Sampled:
    temperature: float
    top_p: float | None = None
    seed: int = 0  # prompt i samples with seed + i, in every arm


def sampled_check_error(arms: Sequence[CheckArm]) -> str | None:
    """Why a sampled check cannot take these arms, or None."""
    others = sorted({a.proposer for a in arms} - set(TOKEN_EXACT_WHEN_SAMPLED))
    if others:
        return f"--temperature: a sampled check compares tokens, which only prompt lookup reproduces; drop {others}"
    return None


@dataclass(frozen=True)
class Mismatch:
    prompt: int
    arm: str
    position: int  # first position whose token differs
    expected: int | None  # the baseline's token there; None: the baseline had ended
    got: int | None


@dataclass
class CheckReport:
    arms: list[CheckArm]  # the baseline first
    records: dict[str, list[Record]]  # arm name -> one record per prompt
    mismatches: list[Mismatch]

    @property
    def errors(self) -> list[tuple[str, int, str]]:
        return [(arm, i, r.error) for arm, recs in self.records.items() for i, r in enumerate(recs) if r.error]

    @property
    def passed(self) -> bool:
        return not self.mismatches and not self.errors


class IdsClient(Protocol):
    async def generate_ids(self, input_ids: list[int], params: RequestParams, stream: bool = True) -> Record: ...


def first_difference(expected: Sequence[int], got: Sequence[int]) -> int | None:
    """The first position where two token sequences differ (a length difference counts at the
    end of the shorter); None when they are equal."""
    for i, (a, b) in enumerate(zip(expected, got, strict=False)):
        if a != b:
            return i
    return None if len(expected) == len(got) else min(len(expected), len(got))


def compare(baseline: Sequence[Sequence[int]], arms: dict[str, Sequence[Sequence[int]]]) -> list[Mismatch]:
    mismatches = []
    for arm, outputs in arms.items():
        for i, (want, got) in enumerate(zip(baseline, outputs, strict=True)):
            pos = first_difference(want, got)
            if pos is not None:
                mismatches.append(
                    Mismatch(i, arm, pos, want[pos] if pos < len(want) else None, got[pos] if pos < len(got) else None)
                )
    return mismatches


async def run_check(
    client: IdsClient,
    prompt_ids: Sequence[list[int]],
    arms: Sequence[CheckArm],
    max_tokens: int,
    end_id: int | None,
    concurrency: int = 4,
    on_done: Callable[[], None] | None = None,
    sampled: Sampled | None = None,
) -> CheckReport:
    """Run every prompt with the baseline and each arm; compare the tokens with the baseline's.
    sampled: sample instead of greedy decoding (the arms must be TOKEN_EXACT_WHEN_SAMPLED)."""
    all_arms = [BASELINE, *(a for a in arms if a != BASELINE)]
    if sampled is not None and (error := sampled_check_error(all_arms)):
        raise ValueError(error)
    gate = asyncio.Semaphore(concurrency)

    async def one(prompt: int, arm: CheckArm) -> Record:
        params = RequestParams(
            max_tokens=max_tokens, num_draft_tokens=arm.num_draft_tokens, draft_method=arm.proposer, end_id=end_id
        )
        if sampled is not None:
            params = replace(params, temperature=sampled.temperature, top_p=sampled.top_p, seed=sampled.seed + prompt)
        async with gate:
            record = await client.generate_ids(prompt_ids[prompt], params)
        if on_done is not None:
            on_done()
        return record

    # prompt by prompt, so the arms of a prompt run side by side
    jobs = [(prompt, arm) for prompt in range(len(prompt_ids)) for arm in all_arms]
    done = await asyncio.gather(*(one(prompt, arm) for prompt, arm in jobs))
    records = {arm.name: list(done[j :: len(all_arms)]) for j, arm in enumerate(all_arms)}
    baseline = [r.ids for r in records[BASELINE.name]]
    others = {arm.name: [r.ids for r in records[arm.name]] for arm in all_arms[1:]}
    # a failed request is reported as an error, not also as a difference
    failed = {(name, i) for name, recs in records.items() for i, r in enumerate(recs) if r.error}
    mismatches = [
        m
        for m in compare(baseline, others)
        if (m.arm, m.prompt) not in failed and (BASELINE.name, m.prompt) not in failed
    ]
    return CheckReport(all_arms, records, mismatches)
