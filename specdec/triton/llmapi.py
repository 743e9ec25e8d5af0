"""EAGLE-3 through TensorRT-LLM's LLM API (its PyTorch backend), behind the engine tensor contract.

TensorRT-LLM 1.0 builds EAGLE-3 only in its PyTorch backend (the TensorRT-engine example is
EAGLE-1: upstream.EAGLE3_ENGINE_PATH_WHERE), which Triton reaches through the LLM API, not through
the tensorrtllm backend. This engine takes the same requests as a tensorrt_llm model (parsed by
tensors.parse_engine_request) and answers in the same layout (tensors.engine_outputs), with
the engine's acceptance, so spec_decode's pass-through serves it unchanged.

As upstream's own LLM-API Triton model does (upstream.LLMAPI_MODEL_WHERE), requests go to
LLM.generate_async on an event loop of the engine's own thread, so that the LLM batches them in
flight while the Triton model (decoupled, async execute) answers each as it finishes. The names
used are upstream.LLM_API's. Acceptance comes from outputs[0].request_perf_metrics, which is None
without return_perf_metrics and whose speculative section TensorRT-LLM 1.0's PyTorch path leaves
at zero (upstream.PERF_METRICS_ZEROED_WHERE): then no drafts are counted, and the model says so once.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import threading
from collections.abc import Callable
from types import ModuleType

import numpy as np

from specdec.engine.engine import GenerationRequest, GenerationResult
from specdec.triton.tensors import InvalidInput

NO_METRICS = (
    "the engine reported no speculative-decoding metrics (TensorRT-LLM 1.0's PyTorch path leaves them at zero): "
    "this profile's acceptance is not measured"
)


def create_llm(options: dict, import_module: Callable[[str], ModuleType] = importlib.import_module):
    """The LLM for llm_options (specdec.build.trtllm.llm_options). Its GPUs are set by
    CUDA_VISIBLE_DEVICES before tensorrt_llm is imported: the import loads the CUDA libraries and
    starts MPI (upstream.IMPORT_INIT_WHERE)."""
    options = dict(options)
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in options.pop("gpu_ids"))
    trtllm, llmapi = import_module("tensorrt_llm"), import_module("tensorrt_llm.llmapi")
    spec = llmapi.EagleDecodingConfig(**options.pop("speculative_config"))
    kv_cache = llmapi.KvCacheConfig(**options.pop("kv_cache_config"))
    return trtllm.LLM(**options, kv_cache_config=kv_cache, speculative_config=spec), trtllm.SamplingParams


def check_request(req: GenerationRequest) -> GenerationRequest:
    if req.draft_ids is not None:
        raise InvalidInput("draft_input_ids: this engine drafts by itself (EAGLE-3); send no drafts")
    return req


def sampling_kwargs(req: GenerationRequest) -> dict:
    s = req.sampling
    # top_k 1 is greedy for the LLM API; 0 means no cut in the contract and None in the LLM API
    sampling = {"top_k": 1} if s.greedy else {"temperature": s.temperature, "top_k": s.top_k or None, "top_p": s.top_p}
    return {
        "max_tokens": req.max_new_tokens,
        "end_id": req.end_id,
        "seed": s.seed,
        "return_perf_metrics": True,
        **({"min_tokens": req.min_tokens} if req.min_tokens else {}),
        **sampling,
    }


def result_of(output) -> GenerationResult:
    """A GenerationResult (the contract's output layout) from an LLM API RequestOutput; no drafts
    counted where the engine reported no metrics."""
    completion = output.outputs[0]
    spec = getattr(completion.request_perf_metrics, "speculative_decoding", None)
    return GenerationResult(
        tokens=np.asarray(completion.token_ids, dtype=np.int32),
        num_draft=int(spec.total_draft_tokens) if spec is not None else 0,
        num_accepted=int(spec.total_accepted_draft_tokens) if spec is not None else 0,
    )


class LlmApiEngine:
    """The LLM on an event loop of its own thread; generate() may be awaited from any other loop."""

    def __init__(self, llm, sampling_params_class, warn: Callable[[str], None] = print):
        self.llm, self.sampling_params_class, self.warn = llm, sampling_params_class, warn
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="llm_api", daemon=True)
        self.thread.start()
        self.warned = False

    @classmethod
    def create(cls, options: dict, warn: Callable[[str], None] = print) -> LlmApiEngine:
        return cls(*create_llm(options), warn=warn)

    async def generate(self, req: GenerationRequest) -> GenerationResult:
        """One request's tokens, generated in flight with every other request the LLM holds."""
        future = asyncio.run_coroutine_threadsafe(self._generate(req), self.loop)
        result = await asyncio.wrap_future(future)
        if not self.warned and result.num_draft == 0 and len(result.tokens) > 1:
            self.warned = True
            self.warn(NO_METRICS)
        return result

    async def _generate(self, req: GenerationRequest) -> GenerationResult:
        params = self.sampling_params_class(**sampling_kwargs(req))
        final = None
        async for output in self.llm.generate_async(req.input_ids.astype(int).tolist(), params, streaming=False):
            final = output
        if final is None:
            raise RuntimeError("the LLM API returned no output")
        return result_of(final)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
