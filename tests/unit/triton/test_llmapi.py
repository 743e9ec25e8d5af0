"""The EAGLE-3 engine (TensorRT-LLM's LLM API): the profile's options reach LLM / EagleDecodingConfig
/ KvCacheConfig under the field names upstream declares (the stand-in API refuses any other),
CUDA_VISIBLE_DEVICES is set before tensorrt_llm is imported, requests go to generate_async from
any event loop, and the engine's metrics (or their absence) come back in the contract's layout."""

from __future__ import annotations

import asyncio
import os
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from support.trtllm import profile_file, tiny_profile

from specdec.build.trtllm import llm_options
from specdec.config import load_profile
from specdec.engine.engine import Engine, GenerationRequest
from specdec.engine.sampling import SamplingParams
from specdec.triton import standin as trtllm_standin
from specdec.triton.llmapi import NO_METRICS, LlmApiEngine, check_request, create_llm, result_of, sampling_kwargs
from specdec.triton.tensors import InvalidInput, engine_outputs


def standin_modules(seen_devices: list):
    """import_module for the stand-in LLM API, noting CUDA_VISIBLE_DEVICES at import."""
    modules = {"tensorrt_llm": trtllm_standin, "tensorrt_llm.llmapi": trtllm_standin}

    def import_module(name):
        seen_devices.append(os.environ.get("CUDA_VISIBLE_DEVICES"))
        return modules[name]

    return import_module


def test_profile_options_reach_the_llm_api_under_upstream_names(monkeypatch, tmp_path):
    monkeypatch.setitem(os.environ, "CUDA_VISIBLE_DEVICES", "")
    seen: list = []
    llm, sampling_class = create_llm(llm_options(tiny_profile("eagle3", tmp_path)), standin_modules(seen))
    assert seen == ["0", "0"]  # set before the first import
    assert sampling_class is trtllm_standin.SamplingParams
    assert llm.speculative_config.__dict__.keys() == {"max_draft_len", "speculative_model_dir", "eagle3_one_model"}
    assert llm.kv_cache_config.__dict__ == {"free_gpu_memory_fraction": 0.85, "enable_block_reuse": True}
    profile = load_profile(profile_file("eagle3"))
    options = llm_options(profile)
    assert options["speculative_config"]["speculative_model_dir"] == "/models/EAGLE3-LLaMA3.1-Instruct-8B"
    assert (options["tensor_parallel_size"], options["max_seq_len"]) == (1, 8192)


def test_a_field_upstream_does_not_declare_is_refused():
    with pytest.raises(TypeError, match="unknown fields"):
        trtllm_standin.EagleDecodingConfig(max_draft_len=3, speculative_model="x")  # renamed after 1.0


def test_requests_become_sampling_params():
    greedy = GenerationRequest(np.array([1, 2, 3]), max_new_tokens=3, end_id=2)
    sampled = GenerationRequest(np.array([4]), max_new_tokens=5, sampling=SamplingParams(0.8, 0, 0.9, 11))
    assert sampling_kwargs(greedy) == {"max_tokens": 3, "end_id": 2, "seed": 0, "return_perf_metrics": True, "top_k": 1}
    assert sampling_kwargs(sampled)["temperature"] == 0.8 and sampling_kwargs(sampled)["top_k"] is None
    trtllm_standin.SamplingParams(**sampling_kwargs(sampled))  # every name is upstream's


def _output(tokens, metrics):
    return SimpleNamespace(outputs=[SimpleNamespace(token_ids=tokens, request_perf_metrics=metrics)])


def test_results_in_the_contract_with_or_without_metrics():
    spec = SimpleNamespace(speculative_decoding=SimpleNamespace(total_draft_tokens=6, total_accepted_draft_tokens=4))
    measured = result_of(_output([7, 8, 9], spec))
    out = engine_outputs(measured, GenerationRequest(np.array([1])), exclude_input=True)
    assert out["output_ids"].tolist() == [[[7, 8, 9]]]
    assert (int(out["total_draft_tokens"][0, 0]), int(out["total_accepted_draft_tokens"][0, 0])) == (6, 4)
    unmeasured = result_of(_output([7, 8], None))  # no perf metrics at all
    assert (unmeasured.num_draft, unmeasured.num_accepted) == (0, 0)


def test_generate_from_another_event_loop_is_plain_greedy_decoding(tmp_path):
    """The stand-in LLM (its own event loop's thread) answers requests awaited from another loop,
    with the tokens of plain greedy decoding; TensorRT-LLM 1.0's zeroed metrics are said once."""
    profile = tiny_profile("eagle3", tmp_path)
    warnings: list[str] = []
    engine = LlmApiEngine(*create_llm(llm_options(profile), standin_modules([])), warn=warnings.append)
    try:
        prompt = np.array([5, 7, 9, 11, 5, 7, 9, 13, 5, 7])
        requests = [GenerationRequest(prompt, 12), GenerationRequest(prompt[:6], 8)]

        async def both():
            return await asyncio.gather(*(engine.generate(check_request(r)) for r in requests))

        results = asyncio.run(both())
        plain = Engine(profile.model_dir("target"), kv_slots=1, threads=1)
        for req, result in zip(requests, results, strict=True):
            (expected,) = plain.generate([GenerationRequest(req.input_ids, req.max_new_tokens)])
            assert result.tokens.tolist() == expected.tokens.tolist()
        assert warnings == [NO_METRICS]
    finally:
        engine.close()
    assert "tensorrt_llm" not in sys.modules  # nothing imported the real package


def test_drafts_are_refused():
    with pytest.raises(InvalidInput, match="draft_input_ids"):
        check_request(GenerationRequest(np.array([1]), draft_ids=np.array([5])))
