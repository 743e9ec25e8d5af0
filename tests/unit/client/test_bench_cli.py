"""`specdec bench`'s flags: genai-perf's and vllm bench serve's names parse as aliases of ours and
make the same run."""

from __future__ import annotations

import pytest

from specdec.cli import bench_config, parser
from specdec.client.loadgen import BASELINE, Load
from specdec.client.metrics import SLO
from specdec.config import load_profile


@pytest.fixture(scope="module")
def profile():
    return load_profile()


def config(profile, *flags: str):
    return bench_config(parser().parse_args(["bench", "--arms", "baseline", *flags]), profile)


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (["--num-requests", "40"], ["--request-count", "40"]),  # genai-perf
        (["--num-requests", "40"], ["--num-prompts", "40"]),  # vllm bench serve: requests sent
        (["--warmup", "3"], ["--warmup-request-count", "3"]),  # genai-perf
        (["--input-tokens", "300"], ["--synthetic-input-tokens-mean", "300"]),  # genai-perf
        (["--input-tokens", "300"], ["--isl", "300"]),
        (["--input-tokens-stddev", "12.5"], ["--synthetic-input-tokens-stddev", "12.5"]),
        (["--max-tokens", "64"], ["--output-tokens-mean", "64"]),  # genai-perf
        (["--max-tokens", "64"], ["--osl", "64"]),
        (["--workload", "prompts.jsonl"], ["--input-file", "prompts.jsonl"]),  # genai-perf
        (["--concurrency", "4"], ["--max-concurrency", "4"]),  # vllm bench serve
        (["--goodput", "ttft:500", "tpot:50", "e2el:9000"],
         ["--goodput", "time_to_first_token:500", "inter_token_latency:50", "request_latency:9000"]),
    ],
)  # fmt: skip
def test_an_alias_makes_the_same_run_as_our_flag(profile, ours, theirs):
    assert config(profile, *theirs) == config(profile, *ours) != config(profile)


def test_aliases_map_onto_the_runs_settings(profile):
    run = config(profile, "--request-count", "40", "--warmup-request-count", "3", "--isl", "300",
                 "--synthetic-input-tokens-stddev", "12.5", "--osl", "64", "--input-file", "synthetic",
                 "--max-concurrency", "1,4", "--request-rate", "0.5",
                 "--goodput", "time_to_first_token:500", "request_latency:9000")  # fmt: skip
    assert (run.num_requests, run.warmup, run.workloads) == (40, 3, ("synthetic",))
    options = run.workload_options
    assert (options.max_tokens, options.synthetic_input_tokens, options.synthetic_input_stddev) == (64, 300, 12.5)
    assert run.loads == (Load(concurrency=1), Load(concurrency=4), Load(rate=0.5))
    assert run.slo == SLO(time_to_first_token=500, request_latency=9000)
    assert run.arms == (BASELINE,)


def test_defaults_are_unchanged(profile):
    run = config(profile)
    assert (run.num_requests, run.warmup, run.workloads, run.loads) == (16, 2, ("mixed",), (Load(concurrency=1),))
    options = run.workload_options
    assert (options.max_tokens, options.synthetic_input_tokens, options.synthetic_input_stddev) == (128, 256, 0.0)


def test_the_input_length_of_a_run_without_synthetic_prompts_is_warned_of(profile, capsys):
    config(profile, "--isl", "300", "--workload", "chat")
    assert "--workload synthetic" in " ".join(capsys.readouterr().err.split())  # the console writes to stderr
    config(profile, "--isl", "300", "--workload", "chat,synthetic")
    assert "warning" not in capsys.readouterr().err


def test_num_prompts_help_says_whose_meaning_it_takes():
    help_text = " ".join(parser()._subparsers._group_actions[0].choices["bench"].format_help().split())
    assert "--num-prompts vllm bench serve's (requests sent; not genai-perf's --num-prompts" in help_text
