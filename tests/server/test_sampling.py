"""Sampling through the real server: speculation must not change the distribution, and a seed
must reproduce a request.

Statistical design. SmolLM2 at temperature 0.8, top_p 0.95, prompt "Once upon a time, in a"
(its next token: 0.46, 0.36, 0.08, ...), 240 seeded requests per arm, two tokens each; the first
and second tokens' frequencies with and without speculation are compared by a chi-square test of
homogeneity (categories under 10 expected counts pooled) at significance 1e-3.
The draft must overlap the target for the rejection sampler's general path (q not one-hot) to be
exercised: the embedded 4-layer draft never agrees with SmolLM2 under top_p (overlap 0), so this
test serves a profile whose draft is SmolLM2's first 26 layers (overlap sum(min(p, q)) = 0.46 at
the first token). Power, simulated from the model's exact p and q at the first token (300 runs):
a sampler that accepts every draft (TV 0.54 from p) fails with probability 1.0, one that draws
the correction from p instead of norm(max(0, p - q)) (TV 0.25) with probability 0.98; false
alarms 0/300. Drafts are one token long (k=1), so the second token comes from the bonus draw
when the first was accepted and from a new round when it was not. Subtler bugs
(e.g. a residual p - q/2, TV 0.02 here) are beyond this sample size: tests/test_verify.py and
tests/test_spec_decode_service.py catch those on distributions built to expose them.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import numpy as np
import pytest
from scipy.stats import chi2_contingency
from support.servers import internal_client, variant_server

from specdec.client.client import RequestParams, within

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def stats_server(embedded_profile, smollm_dir):
    """The embedded model with a 26-layer draft (see the module note)."""
    with variant_server(embedded_profile, smollm_dir, "embedded-smollm2-stats", draft_layers=26) as srv:
        yield srv


# Raw text, no chat template: a 7-token prompt keeps 480 prefills cheap, and its next token is
# spread over a few likely words (0.46, 0.36, 0.08, ...: 7 tokens hold 95% of the mass).
PROMPT = "Once upon a time, in a"
PER_ARM = 240
SAMPLING = {"temperature": 0.8, "top_p": 0.95}
REQUEST_DEADLINE_S = 120  # each takes well under a second here


def _records_for_seeds(server, prompt_ids, seeds, **params):
    async def main():
        gate = asyncio.Semaphore(8)
        async with internal_client(server) as client:

            async def one(seed):
                async with gate:
                    # a request the server never ends (its spec_decode stub died) fails the test
                    # after REQUEST_DEADLINE_S, not at pytest's timeout
                    return await within(
                        client.generate_ids(prompt_ids, RequestParams(seed=seed, **params)), REQUEST_DEADLINE_S
                    )

            return await asyncio.gather(*(one(s) for s in seeds))

    records = asyncio.run(main())
    assert [r.error for r in records] == [None] * len(records)
    return records


def _ids_for_seeds(server, prompt_ids, seeds, **params):
    return [r.ids for r in _records_for_seeds(server, prompt_ids, seeds, **params)]


def _homogeneity_pvalue(a: list[int], b: list[int]) -> float:
    counts_a, counts_b = Counter(a), Counter(b)
    tokens = sorted(set(a) | set(b), key=lambda t: -(counts_a[t] + counts_b[t]))
    table, rare = [], np.zeros(2)
    for t in tokens:
        row = np.array([counts_a[t], counts_b[t]])
        if row.sum() >= 20:  # >= 10 expected in each arm
            table.append(row)
        else:
            rare += row
    if rare.sum():
        table.append(rare)
    assert len(table) >= 2, "the test needs at least two categories"
    return chi2_contingency(np.array(table)).pvalue


def test_speculative_sampling_keeps_the_distribution(stats_server, tokenizer):
    ids = tokenizer.encode(PROMPT)
    common = {"max_tokens": 2, "end_id": tokenizer.eos_id, **SAMPLING}
    # different seeds in the two arms: equal seeds would couple them
    off = _ids_for_seeds(stats_server, ids, range(PER_ARM), num_draft_tokens=0, **common)
    on_records = _records_for_seeds(stats_server, ids, range(10**6, 10**6 + PER_ARM), num_draft_tokens=1,
                                    draft_method="draft_model", **common)  # fmt: skip
    on = [r.ids for r in on_records]
    accepted = sum(r.total_accepted_draft_tokens for r in on_records)
    drafted = sum(r.total_draft_tokens for r in on_records)
    assert 0.2 < accepted / drafted < 0.9  # both the accept and the correction paths ran
    assert len({tuple(s) for s in off}) > 3, "the prompt must leave room for sampling"
    assert _homogeneity_pvalue([s[0] for s in off], [s[0] for s in on]) > 1e-3
    assert _homogeneity_pvalue([s[1] for s in off if len(s) > 1], [s[1] for s in on if len(s) > 1]) > 1e-3


def test_a_seed_reproduces_a_request_with_and_without_speculation(server, tokenizer):
    ids = tokenizer.encode(tokenizer.chat_prompt("Write a two-line poem about rain."))
    common = {"max_tokens": 24, "end_id": tokenizer.eos_id, **SAMPLING}
    seeds = [11, 11, 12]
    plain = _ids_for_seeds(server, ids, seeds, num_draft_tokens=0, **common)
    assert plain[0] == plain[1] != plain[2]
    drafted = _ids_for_seeds(server, ids, seeds, num_draft_tokens=3, draft_method="draft_model", **common)
    assert drafted[0] == drafted[1]
    # a deterministic proposer changes nothing at all for a given seed (see specdec/engine/verify.py)
    assert _ids_for_seeds(server, ids, seeds, num_draft_tokens=4, draft_method="ngram", **common) == plain
