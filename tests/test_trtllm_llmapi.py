"""The EAGLE-3 engine (TensorRT-LLM's LLM API) against stand-ins of the API: the profile's options
reach LLM / EagleDecodingConfig / KvCacheConfig, requests become SamplingParams, and the engine's
speculative-decoding metrics come back in the tensor contract's layout."""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest
from trtllm_checkpoints import profile_file

from specdec.build.trtllm import llm_options
from specdec.config import load_profile
from specdec.engine.engine import GenerationRequest
from specdec.llmapi_engine import LlmApiEngine, check_request, create_llm, sampling_kwargs
from specdec.sampling import SamplingParams
from specdec.triton_io import InvalidInput, engine_outputs


class Recorder:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


class FakeLLM(Recorder):
    def generate(self, prompts, params):
        self.prompts, self.params = prompts, params
        return [
            SimpleNamespace(
                outputs=[
                    SimpleNamespace(
                        token_ids=[7, 8, 9],
                        request_perf_metrics=SimpleNamespace(
                            speculative_decoding=SimpleNamespace(total_draft_tokens=6, total_accepted_draft_tokens=4)
                        ),
                    )
                ]
            )
            for _ in prompts
        ]


def test_profile_options_reach_the_llm_api(monkeypatch):
    monkeypatch.setitem(os.environ, "CUDA_VISIBLE_DEVICES", "")
    api = SimpleNamespace(LLM=FakeLLM, EagleDecodingConfig=Recorder, KvCacheConfig=Recorder)
    llm = create_llm(llm_options(load_profile(profile_file("eagle3"))), api, api)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0"
    assert llm.kwargs["model"] == "/models/Llama-3.1-8B-Instruct"
    assert llm.kwargs["speculative_config"].kwargs == {
        "max_draft_len": 3,
        "speculative_model_dir": "/models/EAGLE3-LLaMA3.1-Instruct-8B",
        "eagle3_one_model": True,
    }
    assert llm.kwargs["kv_cache_config"].kwargs == {"free_gpu_memory_fraction": 0.85, "enable_block_reuse": True}
    assert (llm.kwargs["tensor_parallel_size"], llm.kwargs["max_seq_len"]) == (1, 8192)


def test_requests_and_results_in_the_contract():
    greedy = GenerationRequest(np.array([1, 2, 3]), max_new_tokens=3, end_id=2)
    sampled = GenerationRequest(np.array([4]), max_new_tokens=5, sampling=SamplingParams(0.8, 0, 0.9, 11))
    assert sampling_kwargs(greedy) == {"max_tokens": 3, "end_id": 2, "seed": 0, "return_perf_metrics": True, "top_k": 1}
    assert sampling_kwargs(sampled)["temperature"] == 0.8 and sampling_kwargs(sampled)["top_k"] is None
    engine = LlmApiEngine(FakeLLM(), Recorder)
    results = engine.generate([greedy, sampled])
    assert engine.llm.prompts == [[1, 2, 3], [4]]
    out = engine_outputs(results[0], greedy, exclude_input=True)
    assert out["output_ids"].tolist() == [[[7, 8, 9]]]
    assert (int(out["total_draft_tokens"][0, 0]), int(out["total_accepted_draft_tokens"][0, 0])) == (6, 4)


def test_drafts_are_refused():
    with pytest.raises(InvalidInput, match="draft_input_ids"):
        check_request(GenerationRequest(np.array([1]), draft_ids=np.array([5])))
