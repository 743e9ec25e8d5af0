from __future__ import annotations

import asyncio

from specdec.speculation import loop
from specdec.speculation.loop import Draft, Generation, RequestSpec


def _gen(**kw) -> Generation:
    return Generation(RequestSpec(prompt_ids=[1, 2], **{"max_tokens": 10, "num_draft_tokens": 3, **kw}))


def test_accept_counts_the_matching_prefix():
    g = _gen()
    assert g.accept([5, 6, 7], [5, 6, 9]) == [5, 6, 9]
    assert (g.stats.draft_tokens, g.stats.accepted_tokens, g.stats.drafts) == (3, 2, 1)
    assert g.stats.accepted_at == [1, 1, 0] and g.stats.drafted_at == [1, 1, 1]
    assert g.stats.mean_accepted_length == 3.0


def test_eos_stops_and_is_not_emitted():
    g = _gen(end_id=0)
    assert g.accept([5, 0, 7], [5, 0]) == [5]
    assert g.finish_reason == "eos" and g.tokens == [1, 2, 5]


def test_max_tokens_truncates_a_round():
    g = _gen(max_tokens=2)
    assert g.accept([5, 6, 7], [5, 6, 7, 8]) == [5, 6]
    assert g.finish_reason == "length"


def test_stop_word_is_included_and_stops():
    g = _gen(stop_words=((6, 7),))
    assert g.accept([5, 6, 7], [5, 6, 7, 8]) == [5, 6, 7]
    assert g.finish_reason == "stop"


def test_draft_budget_never_overshoots_max_tokens():
    g = _gen(max_tokens=4)
    assert g.draft_budget(8) == 3
    g.accept([], [5, 6])
    assert g.draft_budget(8) == 1
    g.accept([], [7])
    assert g.draft_budget(8) == 0


def test_run_alternates_propose_and_verify():
    calls = []

    async def propose(tokens, k):
        calls.append(("propose", len(tokens), k))
        return Draft([9] * k)

    async def verify(tokens, draft):
        calls.append(("verify", len(tokens), len(draft.ids)))
        return [*draft.ids[:1], 4]

    g = _gen(max_tokens=5)

    async def main():
        return [chunk async for chunk in loop.run(g, propose, verify)]

    chunks = asyncio.run(main())
    # the last round has room for one token only: no draft, a plain step
    assert chunks == [[9, 4], [9, 4], [4]]
    assert calls[:2] == [("propose", 2, 3), ("verify", 2, 3)] and calls[-1] == ("verify", 6, 0)
    assert g.finish_reason == "length" and g.generated == [9, 4, 9, 4, 4]
