"""`specdec check`: it must catch a planted difference (with its first position) and pass
identical outputs; and against the real server, greedy speculation passes it."""

from __future__ import annotations

import asyncio

import pytest

from specdec.client.check import CheckArm, Sampled, compare, first_difference, run_check
from specdec.client.client import Record, RequestParams


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 9, 3]) == 1
    assert first_difference([1, 2, 3], [1, 2]) == 2  # one stopped early
    assert first_difference([], [4]) == 0


def test_compare_reports_each_differing_prompt_once():
    base = [[1, 2, 3], [4, 5, 6]]
    found = compare(base, {"ngram:2": [[1, 2, 3], [4, 5, 7]], "draft_model:2": [[1, 2], [4, 5, 6]]})
    assert [(m.arm, m.prompt, m.position, m.expected, m.got) for m in found] == [
        ("ngram:2", 1, 2, 6, 7),
        ("draft_model:2", 0, 2, 3, None),
    ]


class FakeServer:
    """Plain decoding 'generates' prompt + 100..; one arm has a token planted wrong."""

    def __init__(self, plant: tuple[str, int, int] | None = None, fail: tuple[str, int] | None = None):
        self.plant, self.fail = plant, fail
        self.calls: list[RequestParams] = []

    async def generate_ids(self, input_ids, params: RequestParams, stream: bool = True) -> Record:
        self.calls.append(params)
        await asyncio.sleep(0)
        arm = "baseline" if params.draft_method == "none" else f"{params.draft_method}:{params.num_draft_tokens}"
        tokens = [100 + t + input_ids[0] for t in range(params.max_tokens)]
        record = Record(start=0.0, end=1.0)
        if self.fail == (arm, input_ids[0]):
            record.error = "engine failed"
            return record
        if self.plant and self.plant[:2] == (arm, input_ids[0]):
            tokens[self.plant[2]] += 1
        record.chunks.append((0.5, tokens))
        return record


ARMS = [CheckArm("ngram", 1), CheckArm("ngram", 4), CheckArm("draft_model", 4)]


def test_check_catches_a_planted_difference():
    server = FakeServer(plant=("ngram:4", 2, 5))
    report = asyncio.run(run_check(server, [[0], [1], [2]], ARMS, max_tokens=8, end_id=2))
    assert not report.passed
    assert [(m.arm, m.prompt, m.position) for m in report.mismatches] == [("ngram:4", 2, 5)]
    assert len(server.calls) == 3 * 4  # every prompt: the baseline and three arms
    assert {(p.draft_method, p.num_draft_tokens) for p in server.calls} >= {("none", 0), ("draft_model", 4)}
    assert all(p.end_id == 2 and p.temperature is None for p in server.calls)  # greedy


def test_check_passes_identical_outputs_and_reports_errors_apart():
    assert asyncio.run(run_check(FakeServer(), [[0], [1]], ARMS, max_tokens=8, end_id=None)).passed
    report = asyncio.run(run_check(FakeServer(fail=("ngram:1", 1)), [[0], [1]], ARMS, max_tokens=8, end_id=None))
    assert not report.passed and not report.mismatches
    assert report.errors == [("ngram:1", 1, "engine failed")]


def test_a_sampled_check_gives_each_prompt_one_seed_in_every_arm():
    server = FakeServer()
    arms = [CheckArm("ngram", 1), CheckArm("ngram", 4)]
    report = asyncio.run(run_check(server, [[0], [1]], arms, 8, None, sampled=Sampled(0.7, 0.9, seed=5)))
    assert report.passed
    seeds = {(p.draft_method, p.num_draft_tokens, p.seed) for p in server.calls}
    assert {seed for *_, seed in seeds} == {5, 6} and len(seeds) == 3 * 2
    assert all(p.temperature == 0.7 and p.top_p == 0.9 for p in server.calls)


def test_a_sampled_check_refuses_the_draft_model():
    """Its sampled drafts are exact in distribution, not token for token."""
    with pytest.raises(ValueError, match="draft_model"):
        asyncio.run(run_check(FakeServer(), [[0]], ARMS, 8, None, sampled=Sampled(0.7)))
