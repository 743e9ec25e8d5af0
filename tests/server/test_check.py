"""`specdec check`: it must catch a planted difference (with its first position) and pass
identical outputs; and against the real server, greedy speculation passes it."""

from __future__ import annotations

import asyncio

import pytest

from specdec.client.check import CheckArm, Sampled, run_check


@pytest.mark.server
def test_check_against_the_real_server(server, tokenizer):
    from specdec.client.client import TritonClient
    from specdec.client.workloads import WorkloadOptions, load_workload

    prompts = load_workload("mixed", WorkloadOptions())[:3]
    ids = [tokenizer.encode(tokenizer.chat_prompt(p.text)) for p in prompts]

    async def main():
        async with TritonClient(server.internal.grpc_url, internal_key=server.internal.key) as client:
            return await run_check(client, ids, [CheckArm("ngram", 3), CheckArm("draft_model", 2)], 24,
                                   tokenizer.eos_id)  # fmt: skip

    report = asyncio.run(main())
    assert report.passed, (report.mismatches, report.errors)
    assert sum(r.total_draft_tokens for r in report.records["ngram:3"]) > 0


@pytest.mark.server
def test_sampled_check_against_the_real_server(server, tokenizer):
    """Seeded sampling with prompt lookup's drafts reproduces plain sampling token for token, with
    drafts both accepted and rejected."""
    from specdec.client.client import TritonClient
    from specdec.client.workloads import WorkloadOptions, load_workload

    prompts = load_workload("grounded", WorkloadOptions())[:3]
    ids = [tokenizer.encode(tokenizer.chat_prompt(p.text)) for p in prompts]

    async def main():
        async with TritonClient(server.internal.grpc_url, internal_key=server.internal.key) as client:
            return await run_check(client, ids, [CheckArm("ngram", 4)], 32, tokenizer.eos_id,
                                   sampled=Sampled(0.8, 0.95, seed=11))  # fmt: skip

    report = asyncio.run(main())
    assert report.passed, (report.mismatches, report.errors)
    records = report.records["ngram:4"]
    drafted, accepted = (
        sum(getattr(r, f) for r in records) for f in ("total_draft_tokens", "total_accepted_draft_tokens")
    )
    assert 0 < accepted < drafted
