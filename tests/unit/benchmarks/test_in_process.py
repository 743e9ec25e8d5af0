"""benchmarks/in_process.py on a tiny random-weight model: both arms run every prompt, their texts
compared, their totals counted, the controller pricing rows from a build folder of its own."""

from __future__ import annotations

import asyncio

import pytest
from in_process import ARMS, in_process_service, run_arms

from specdec.config import parse_profile
from specdec.engine.engine import Engine
from specdec.speculation.controller import calibration_path


@pytest.fixture
def service_and_engine(tiny_target, tmp_path):
    profile = parse_profile(
        {
            "name": "tiny",
            "target": {"hf_dir": str(tiny_target)},
            "engine": {"kv_slots": 4, "max_seq_len": 256, "threads": 1},
            "speculation": {"proposer": "ngram", "num_draft_tokens": 4, "max_draft_tokens": 8},
        }
    )
    engine = Engine(tiny_target, kv_slots=4, max_seq_len=256, threads=1)
    return in_process_service(profile, engine, tmp_path / "build"), engine, tmp_path / "build"


def test_both_arms_run_every_prompt_with_the_same_tokens(service_and_engine):
    service, engine, build_dir = service_and_engine
    assert calibration_path(build_dir, "target").is_file()  # the controller's prices, not the server's
    prompts = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6], list(range(20, 40))]
    totals = asyncio.run(run_arms(service, engine, prompts, max_tokens=12, end_id=None, passes=2))
    assert set(totals) == set(ARMS)
    for total in totals.values():
        assert total.requests == 4
        assert total.tokens == 4 * 12  # no end id: every request runs to max_tokens
        assert total.seconds > total.forward_s > 0
    # the baseline emits one token a round; prompt lookup's rounds are as many or fewer
    assert totals["none"].rounds == totals["none"].tokens
    assert totals["none"].tokens_per_round == 1.0
    assert totals["ngram"].rounds <= totals["none"].rounds
