"""benchmarks/policy_replay.py: its replay's arithmetic on an output known in advance, and --vary."""

from __future__ import annotations

import numpy as np
import pytest
from copy_bound import Sample
from policy_replay import replay, varied_options

from specdec.config import AdaptiveOptions
from specdec.speculation.lookup import NgramProposer
from specdec.speculation.opening import Opening

STEP = {rows: 0.010 for rows in range(1, 17)}  # a forward's seconds, flat: rows cost nothing


def copying_sample() -> Sample:
    """An output that copies 40 tokens of its prompt, from its 6th token on."""
    prompt = np.arange(100, 160)
    output = prompt[5:45].copy()
    return Sample(
        "w", "copy", prompt, output, prefill_s=0.0, guesses=[[] for _ in range(len(prompt) + len(output) + 1)]
    )


def test_drafts_of_fifteen_copy_sixteen_tokens_a_round():
    """The prefill round makes the first token; then each round's 15 drafts are all accepted,
    plus the target's own token: 16, 16 and the last 7. Plain decoding pays 40 steps."""
    speedup, per_round = replay([copying_sample()], AdaptiveOptions(), NgramProposer(1, 4), 15, STEP, 0.0, 0.0, {})
    assert per_round == pytest.approx(40 / 3)
    assert speedup == pytest.approx(40 / 3)


def test_the_prefill_round_drafts_the_opening_where_one_is_given():
    """The prompt frames its text with 90 and 91 and has a blank line (92) before the passage the
    output copies: the prefill round drafts 15 of it and makes 16 tokens, then 16 and the last 8
    in two rounds."""
    prompt = np.array([90, *range(100, 105), 92, *range(110, 160), 91])
    sample = Sample("w", "copy", prompt, prompt[7:47].copy(), prefill_s=0.0,
                    guesses=[[] for _ in range(len(prompt) + 41)])  # fmt: skip
    trailing = np.zeros(200, dtype=int)
    trailing[92] = 2
    opening = Opening([90], [91], trailing, np.zeros(200, dtype=bool))
    args = ([sample], AdaptiveOptions(), NgramProposer(1, 4), 15, STEP, 0.0, 0.0, {})
    assert replay(*args, opening=opening) == pytest.approx((20.0, 20.0))
    assert replay(*args) == pytest.approx((40 / 3, 40 / 3))  # without: the prefill round makes one token


def test_caps_by_evidence_limit_the_drafts_from_it():
    """Capped at 3 after a 1-token match, the first round makes 4 tokens; the copy's later rounds
    match 4 tokens, and capped at 3 there too make 4 tokens each: 9 rounds and a last one of 3.
    Capped at 3 after a 1-token match only, the first makes 4 and the next 15 + 1, 15 + 1, 3."""
    ngram = NgramProposer(1, 4)
    speedup, per_round = replay([copying_sample()], AdaptiveOptions(), ngram, 15, STEP, 0.0, 0.0, {1: 3, 4: 3})
    assert per_round == pytest.approx(40 / 10)
    assert speedup == pytest.approx(40 / 10)
    _, per_round = replay([copying_sample()], AdaptiveOptions(), ngram, 15, STEP, 0.0, 0.0, {1: 3})
    assert per_round == pytest.approx(40 / 4)


def test_the_controller_drafts_long_where_every_draft_is_accepted():
    speedup, _ = replay([copying_sample()], AdaptiveOptions(), NgramProposer(1, 4), 15, STEP, 0.0, 0.006)
    assert speedup > 3


def test_vary_gives_options_with_each_value_and_refuses_what_the_schema_refuses():
    variants = varied_options(AdaptiveOptions(), ["ema_alpha=0.02,0.1", "enabled=false"])
    assert [(name, o.ema_alpha, o.enabled) for name, o in variants] == [
        ("ema_alpha 0.02", 0.02, True),
        ("ema_alpha 0.1", 0.1, True),
        ("enabled false", 0.05, False),
    ]
    with pytest.raises(ValueError, match="KNOB one of enabled"):
        varied_options(AdaptiveOptions(), ["emaalpha=0.1"])
    with pytest.raises(ValueError, match="ema_alpha=2: Input should be less than or equal to 1"):
        varied_options(AdaptiveOptions(), ["ema_alpha=2"])
