"""spec_decode's pass-through for in-engine speculation: a fake engine call answering the way a
tensorrt_llm model does (output_ids [1, 1, n] without the input, perf-metric outputs), and the
real CPU engine through the same call, which must give the tokens of plain greedy decoding."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from support.trtllm import tiny_profile

from specdec.engine.engine import Engine, GenerationRequest
from specdec.engine.sampling import SamplingParams
from specdec.speculation.loop import RequestSpec
from specdec.triton.passthrough import PassthroughService, drafts_in_engine
from specdec.triton.service import NoMetrics, local_call
from specdec.triton.tensors import SpecDecodeRequest

CONTINUATION = list(range(10, 60))  # what the fake engine generates after any prompt


class FakeTrtllm:
    """Each call: the next tokens of CONTINUATION, and per call 3 drafted / 2 accepted per step."""

    def __init__(self):
        self.calls: list[dict[str, np.ndarray]] = []

    def __call__(self, model, inputs, outputs, request_id):  # an PrepareCall: build now, send later
        return lambda: self.respond(model, inputs, outputs)

    async def respond(self, model, inputs, outputs):
        assert model == "target"
        self.calls.append(inputs)
        prompt_len = int(inputs["input_lengths"].reshape(-1)[0])
        done = prompt_len - 3  # prompts below are 3 tokens long
        n = int(inputs["request_output_len"].reshape(-1)[0])
        new = CONTINUATION[done : done + n]
        steps = -(-len(new) // 3)  # each engine step: 2 accepted drafts + its own token
        answer = {
            "output_ids": np.array([[new]], dtype=np.int32),
            "sequence_length": np.array([[len(new)]], dtype=np.int32),
            "total_draft_tokens": np.array([[3 * steps]], dtype=np.int32),
            "total_accepted_draft_tokens": np.array([[len(new) - steps]], dtype=np.int32),
            "acceptance_rate": np.array([[(len(new) - steps) / (3 * steps)]], dtype=np.float32),
        }
        return {name: answer[name] for name in outputs}


def _request(max_tokens, stream, end_id=None, stop_words=(), temperature=0.0):
    return SpecDecodeRequest(
        spec=RequestSpec([1, 2, 3], max_tokens, 4, end_id=end_id, stop_words=stop_words),
        sampling=SamplingParams(temperature=temperature, seed=5),
        proposer="none",
        stream=stream,
        seeded=True,
    )


async def _serve(service, req, cancelled=lambda: False):
    return [chunk async for chunk in service.serve(req, cancelled)]


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    return tiny_profile("lookahead", tmp_path_factory.mktemp("passthrough"))


def test_selected_for_in_engine_modes_only(profile, tmp_path):
    assert drafts_in_engine(profile)
    assert not drafts_in_engine(tiny_profile("draft-target", tmp_path))


def test_streams_chunks_and_reports_the_engines_acceptance(profile):
    engine = FakeTrtllm()
    chunks = asyncio.run(_serve(PassthroughService(profile, engine), _request(40, stream=True)))
    assert [len(c.tokens) for c in chunks] == [32, 8]  # passthrough_chunk = 32; the last is final
    tokens = [t for c in chunks for t in c.tokens]
    assert tokens == CONTINUATION[:40]
    stats = chunks[-1].gen.stats
    assert (stats.draft_tokens, stats.accepted_tokens, stats.drafts) == (3 * 11 + 3 * 3, 21 + 5, 14)
    assert stats.mean_accepted_length == pytest.approx(40 / 14)
    assert chunks[-1].final and chunks[-1].gen.finish_reason == "length"
    for call in engine.calls:
        assert call["return_perf_metrics"].all() and call["exclude_input_in_output"].all()
        assert int(call["runtime_top_k"].reshape(-1)[0]) == 1  # TensorRT-LLM's greedy
        assert "draft_input_ids" not in call
    assert [int(c["input_lengths"].reshape(-1)[0]) for c in engine.calls] == [3, 35]


class RecordingMetrics(NoMetrics):
    def __init__(self):
        self.events: list[tuple] = []

    def finished(self, proposer, reason, num_tokens, timing):
        assert 0 <= timing.queued_s <= timing.first_token_s <= timing.total_s
        self.events.append(("finished", proposer, reason, num_tokens))

    def load(self, running, queued):
        self.events.append(("load", running, queued))


def test_load_and_finish_are_reported_even_when_the_engine_fails(profile):
    metrics = RecordingMetrics()
    service = PassthroughService(profile, FakeTrtllm(), metrics)
    asyncio.run(_serve(service, _request(40, stream=True)))
    assert metrics.events == [("load", 1, 0), ("finished", "lookahead", "length", 40), ("load", 0, 0)]

    async def engine_down():
        raise RuntimeError("engine down")

    def failing(model, inputs, outputs, request_id):
        return engine_down

    metrics.events.clear()
    with pytest.raises(RuntimeError, match="engine down"):
        asyncio.run(_serve(PassthroughService(profile, failing, metrics), _request(40, stream=True)))
    assert metrics.events == [("load", 1, 0), ("finished", "lookahead", "error", 0), ("load", 0, 0)]


def test_without_streaming_one_call(profile):
    engine = FakeTrtllm()
    chunks = asyncio.run(_serve(PassthroughService(profile, engine), _request(40, stream=False)))
    assert len(engine.calls) == 1 and int(engine.calls[0]["request_output_len"].reshape(-1)[0]) == 40
    assert [t for c in chunks for t in c.tokens] == CONTINUATION[:40]


def test_end_and_stop_words_end_the_request(profile):
    chunks = asyncio.run(_serve(PassthroughService(profile, FakeTrtllm()), _request(40, True, end_id=15)))
    assert [t for c in chunks for t in c.tokens] == CONTINUATION[:5] and chunks[-1].gen.finish_reason == "eos"
    chunks = asyncio.run(_serve(PassthroughService(profile, FakeTrtllm()), _request(40, True, stop_words=((12, 13),))))
    assert [t for c in chunks for t in c.tokens] == [10, 11, 12, 13] and chunks[-1].gen.finish_reason == "stop"


def test_cancelled_between_calls(profile):
    engine = FakeTrtllm()
    chunks = asyncio.run(
        _serve(PassthroughService(profile, engine), _request(100, True), lambda: len(engine.calls) >= 1)
    )
    assert len(engine.calls) == 1 and chunks[-1].gen.finish_reason == "cancelled"


def test_request_draft_controls_are_ignored_with_one_warning(profile):
    warnings = []
    service = PassthroughService(profile, FakeTrtllm(), warn=warnings.append)
    for _ in range(2):
        req = _request(4, True)
        req.proposer = "ngram"
        asyncio.run(_serve(service, req))
    assert len(warnings) == 1 and "ignored" in warnings[0]


def test_sampling_is_passed_on_with_a_seed(profile):
    engine = FakeTrtllm()
    asyncio.run(_serve(PassthroughService(profile, engine), _request(4, True, temperature=0.7)))
    call = engine.calls[0]
    assert call["temperature"].reshape(-1)[0] == pytest.approx(0.7) and int(call["seed"].reshape(-1)[0]) == 5


def test_through_the_cpu_engine_it_is_plain_greedy_decoding(profile):
    engine = Engine(profile.target.hf_dir, kv_slots=2, max_seq_len=256)
    plain = engine.generate([GenerationRequest(np.array([1, 2, 3]), max_new_tokens=40)])[0].tokens.tolist()
    service = PassthroughService(profile, local_call({"target": engine}))
    chunks = asyncio.run(_serve(service, _request(40, stream=True)))
    assert [t for c in chunks for t in c.tokens] == plain
