"""benchmarks/targets.py: each target judged on the unrounded figure."""

from __future__ import annotations

import json

import pytest
from targets import after_first_token, closed_loop_throughput, main, target, throughput_ratio, verdict

from specdec.client.metrics import ArmSummary, stats


def test_a_figure_that_rounds_to_its_target_but_falls_short_is_not_met():
    assert f"{2.4987:.2f}" == "2.50"
    assert verdict(2.4987, 2.5) == "**no** (2.499)"
    assert verdict(2.5, 2.5) == "yes (2.500)"


def test_an_upper_bound_is_met_at_or_below_it():
    assert verdict(1.084, 1.2, at_least=False) == "yes (1.084)"
    assert verdict(1.21, 1.2, at_least=False) == "**no** (1.210)"


def test_a_target_is_labelled_from_the_bound_it_is_judged_by():
    assert target(2.4987, 2.5) == (">= 2.5x", "**no** (2.499)")
    assert target(56.4, 20, " tokens/s") == (">= 20 tokens/s", "yes (56.400)")
    assert target(1.07, 1.2, at_least=False, note=" (the median)") == ("<= 1.2x (the median)", "yes (1.070)")


def _arm(tokens: int, latency_s: list[float], first_token_s: list[float]) -> ArmSummary:
    return ArmSummary(
        requests=len(latency_s), errors=0, request_count=len(latency_s), benchmark_duration=0.0,
        request_latency=stats(s * 1000 for s in latency_s), time_to_first_token=stats(s * 1000 for s in first_token_s),
        time_to_second_token=None, inter_token_latency=None, output_token_throughput_per_user=None,
        output_sequence_length=None, input_sequence_length=None, inter_chunk_latency=None, output_tokens=tokens,
        output_token_throughput=0.0, request_throughput=0.0, request_goodput=None, slo_attainment=None,
        acceptance_rate=None, mean_accepted_length=None, draft_tokens=0, accepted_tokens=0, draft_rounds=0,
    )  # fmt: skip


def test_after_the_first_token_leaves_out_the_prefill_and_its_token():
    # two requests of 101 tokens, each 1.2 s long, its first token at 0.2 s and the other 100 in 1.0 s
    assert after_first_token(_arm(202, [1.2, 1.2], [0.2, 0.2]), concurrency=1) == pytest.approx(100.0)
    # the same requests two at a time: their time spreads over the two slots
    assert after_first_token(_arm(202, [1.2, 1.2], [0.2, 0.2]), concurrency=2) == pytest.approx(200.0)
    assert after_first_token(_arm(0, [], []), concurrency=1) is None


def test_throughput_is_little_laws_of_each_requests_own_time():
    """Blocks of C requests end with their slowest: the ratio takes each request's own time."""
    fast, slow = _arm(200, [1.0, 3.0], [0.1, 0.1]), _arm(200, [4.0, 4.0], [0.1, 0.1])
    assert closed_loop_throughput(fast, concurrency=2) == pytest.approx(200 / 2.0)
    assert throughput_ratio(fast, slow, concurrency=2) == pytest.approx(2.0)
    assert closed_loop_throughput(_arm(0, [], []), concurrency=1) is None


def test_a_sweep_without_one_user_is_refused_before_it_runs(capsys):
    """Plain decoding and the grounded figure are one user's: a sweep without it used to run for
    minutes and then fail."""
    with pytest.raises(SystemExit):
        main(["--concurrency", "16,32"])
    assert "--concurrency must include 1" in capsys.readouterr().err


def _cell(workload: str, concurrency: int, ratio: float) -> dict:
    return {"workload": workload, "prompts": workload, "concurrency": concurrency, "ratio": ratio,
            "ratio_interval": [ratio - 0.1, ratio + 0.2], "aa_ratio": 1.0, "aa_ratio_interval": None}  # fmt: skip


def test_the_ratios_are_drawn_again_from_a_runs_json(tmp_path):
    """`--plot DIR` draws targets.png from the targets.json a sweep wrote (a cell's A/A interval may
    be missing: fewer rounds than it is given for)."""
    rows = [_cell("grounded", 1, 2.4), _cell("grounded", 2, 2.1), _cell("chat", 1, 1.5)]
    (tmp_path / "targets.json").write_text(json.dumps({"levels": rows}))
    assert main(["--plot", str(tmp_path)]) == 0
    png = (tmp_path / "targets.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
