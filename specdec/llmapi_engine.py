"""EAGLE-3 through TensorRT-LLM's LLM API (its PyTorch backend), behind the engine tensor contract.

TensorRT-LLM 1.0 builds EAGLE-3 only in its PyTorch backend (the TensorRT-engine example supports
EAGLE-1 only, see specdec/build/trtllm.py), and Triton reaches that backend through the LLM API,
not through the tensorrtllm backend. This engine takes the same requests as a tensorrt_llm model
(parsed by triton_io.parse_engine_request) and answers in the same layout (triton_io.
engine_outputs), with the engine's acceptance, so spec_decode's pass-through serves it unchanged.

LLM API names used (TensorRT-LLM 1.0, see trtllm.py for where they were read): tensorrt_llm.LLM
(model, tensor_parallel_size, pipeline_parallel_size, max_batch_size, max_seq_len, max_num_tokens,
kv_cache_config, speculative_config), tensorrt_llm.llmapi.KvCacheConfig(free_gpu_memory_fraction,
enable_block_reuse), tensorrt_llm.llmapi.EagleDecodingConfig(max_draft_len, speculative_model_dir,
eagle3_one_model), tensorrt_llm.SamplingParams(max_tokens, end_id, temperature, top_k, top_p, seed,
return_perf_metrics), LLM.generate(token id lists, sampling params) -> RequestOutput with
outputs[0].token_ids and request_perf_metrics.speculative_decoding.{total_draft_tokens,
total_accepted_draft_tokens}. Not run here: no GPU and no TensorRT-LLM on the development machine.
"""

from __future__ import annotations

import os
from types import ModuleType

import numpy as np

from specdec.engine.engine import GenerationRequest, GenerationResult
from specdec.triton_io import InvalidInput


def create_llm(options: dict, trtllm: ModuleType, llmapi: ModuleType):
    """The LLM for llm_options (specdec.build.trtllm.llm_options); its GPUs by CUDA_VISIBLE_DEVICES."""
    options = dict(options)
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in options.pop("gpu_ids"))
    spec = llmapi.EagleDecodingConfig(**options.pop("speculative_config"))
    kv_cache = llmapi.KvCacheConfig(**options.pop("kv_cache_config"))
    return trtllm.LLM(**options, kv_cache_config=kv_cache, speculative_config=spec)


def check_request(req: GenerationRequest) -> GenerationRequest:
    if req.draft_ids is not None:
        raise InvalidInput("draft_input_ids: this engine drafts by itself (EAGLE-3); send no drafts")
    return req


def sampling_kwargs(req: GenerationRequest) -> dict:
    s = req.sampling
    # top_k 1 is TensorRT-LLM's greedy; 0 means no cut in the contract and None in the LLM API
    sampling = {"top_k": 1} if s.greedy else {"temperature": s.temperature, "top_k": s.top_k or None, "top_p": s.top_p}
    return {
        "max_tokens": req.max_new_tokens,
        "end_id": req.end_id,
        "seed": s.seed,
        "return_perf_metrics": True,
        **sampling,
    }


def result_of(output) -> GenerationResult:
    """A GenerationResult (the contract's output layout) from an LLM API RequestOutput."""
    spec = output.outputs[0].request_perf_metrics.speculative_decoding
    return GenerationResult(
        tokens=np.asarray(output.outputs[0].token_ids, dtype=np.int32),
        num_draft=int(spec.total_draft_tokens),
        num_accepted=int(spec.total_accepted_draft_tokens),
    )


class LlmApiEngine:
    def __init__(self, llm, sampling_params_class):
        self.llm, self.sampling_params_class = llm, sampling_params_class

    @classmethod
    def create(cls, options: dict) -> LlmApiEngine:
        import tensorrt_llm
        import tensorrt_llm.llmapi

        return cls(create_llm(options, tensorrt_llm, tensorrt_llm.llmapi), tensorrt_llm.SamplingParams)

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """One batched LLM API call for the requests Triton grouped into one execute()."""
        params = [self.sampling_params_class(**sampling_kwargs(r)) for r in requests]
        outputs = self.llm.generate([r.input_ids.astype(int).tolist() for r in requests], params)
        return [result_of(out) for out in outputs]
