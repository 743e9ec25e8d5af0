"""A CPU stand-in for NVIDIA's tensorrtllm Triton backend: the PyTorch engine behind a GPU
profile's own tensorrt_llm model configs, behaving as the backend does at every point that
spec_decode depends on, so that a CPU test of a rendered GPU repository proves it.

Installed as a Python-based backend named "tensorrtllm" (Triton loads <backends>/tensorrtllm/
model.py for a model whose config says backend "tensorrtllm" when no libtriton_tensorrtllm.so is
there), so the rendered config.pbtxt loads unchanged. What it mirrors, each fact from the
upstream record (specdec/build/upstream.py):

- loading: every required parameter (a missing one fails the load, naming it as the backend
  does), gpt_model_type's values, gpt_model_path (absent: no model path), booleans parsed as the
  backend parses them, lookahead's three parameters under decoding_mode lookahead;
- requests: streaming only in a decoupled model; a stop without a request id refused, a stop of
  any id answered empty (each call here is a finished request, as the BLS's calls are there);
  exclude_input_in_output from the request, else from the parameter;
- responses: output_ids and sequence_length must be requested; other outputs are written when
  requested, and with return_perf_metrics every perf-metric output whether requested or not; an
  output the config does not declare fails the response with Triton core's message; generation
  logits only where the config declares them FP32.
- in-engine decoding modes (decoding_mode medusa, lookahead, redrafter, eagle): the engine drafts
  by itself, here by prompt lookup, and reports its drafts in the perf-metric outputs.

Not mirrored: TensorRT-LLM's kernels, scheduler and KV-cache blocks (a finished request leaves
its prefix for the next, as block reuse does), nor what each decoding mode drafts.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specdec.build import upstream
from specdec.engine.engine import Engine, GenerationRequest, GenerationResult
from specdec.speculation.lookup import NgramProposer
from specdec.triton.tensors import InvalidInput, input_scalar, parse_engine_request

IN_ENGINE_DECODING_MODES = ("medusa", "lookahead", "redrafter", "eagle")
# The stand-in's cache: sized for tests, not for an engine's limits.
KV_SLOTS, MAX_SEQ_LEN = 8, 2048
IN_ENGINE_DRAFT = 4  # tokens the stand-in drafts a step in an in-engine decoding mode


class LoadError(RuntimeError):
    """The backend would refuse to load this model; the message is the backend's."""


@dataclass(frozen=True)
class StandinConfig:
    """What the stand-in reads of a tensorrt_llm model's config, checked as the backend checks it."""

    name: str
    model_path: Path
    decoupled: bool
    decoding_mode: str | None
    exclude_input_in_output: bool
    kv_cache_reuse: bool
    declared_outputs: dict[str, str] = field(default_factory=dict)  # name -> data_type


def _bool(params: dict[str, str], name: str, default: bool) -> bool:
    """A boolean parameter as the backend parses it; like the backend's optional reads, a value
    it cannot parse leaves the default."""
    value = params.get(name)
    return True if value in upstream.BOOL_TRUE else False if value in upstream.BOOL_FALSE else default


def load_config(model_config: dict) -> StandinConfig:
    """The model's config (Triton's JSON form), or LoadError where the backend fails the load."""
    params = {k: v.get("string_value", "") for k, v in model_config.get("parameters", {}).items()}
    decoding_mode = params.get("decoding_mode")
    decoding_mode = decoding_mode if decoding_mode in upstream.DECODING_MODES else None
    for name in sorted(upstream.required_parameters(decoding_mode)):
        if name not in params:
            raise LoadError(upstream.MISSING_PARAMETER.format(name))
    if params["gpt_model_type"] not in upstream.GPT_MODEL_TYPES:
        raise LoadError("Invalid gpt_model_type. Must be v1/inflight_batching/inflight_fused_batching.")
    model_path = Path(params.get("gpt_model_path", ""))
    if not params.get("gpt_model_path") or not model_path.exists():
        raise LoadError(upstream.NO_MODEL_PATH)
    policy = model_config.get("model_transaction_policy", {})
    return StandinConfig(
        name=model_config["name"],
        model_path=model_path,
        decoupled=bool(policy.get("decoupled", False)),
        decoding_mode=decoding_mode,
        exclude_input_in_output=_bool(params, "exclude_input_in_output", False),
        kv_cache_reuse=_bool(params, "enable_kv_cache_reuse", True),
        declared_outputs={o["name"]: o["data_type"] for o in model_config.get("output", [])},
    )


class ResponseError(RuntimeError):
    """The backend would answer this request with an error; the message is the backend's."""


@dataclass
class Call:
    """One request to the stand-in: its inputs (batch dimension removed), the outputs it asked for."""

    inputs: dict[str, np.ndarray]
    requested: set[str]
    request_id: str


def check_call(config: StandinConfig, call: Call) -> GenerationRequest | None:
    """The engine request of a call; None for a stop (answered empty); ResponseError or
    InvalidInput where the backend refuses it."""
    if bool(input_scalar(call.inputs, "stop", False)):
        if not call.request_id:
            raise ResponseError(upstream.STOP_WITHOUT_ID)
        return None
    if bool(input_scalar(call.inputs, "streaming", False)) and not config.decoupled:
        raise ResponseError(upstream.STREAMING_NOT_DECOUPLED)
    req = parse_engine_request(call.inputs, call.request_id)
    assert req is not None
    req.sequence_key = ""  # a finished request: its prefix stays for reuse, nothing else
    return req


def response_arrays(
    config: StandinConfig, call: Call, req: GenerationRequest, result: GenerationResult, times: dict[str, int]
) -> dict[str, np.ndarray]:
    """The outputs the backend writes for this call (upstream.outputs_written), in its layout
    (batch 1, beam 1); ResponseError where the backend's response is an error."""
    missing = upstream.unrequested_required_outputs(call.requested)
    if missing:
        raise ResponseError(upstream.POPULATING_ERROR.format(upstream.OUTPUT_NOT_REQUESTED.format(missing[0])))
    exclude = bool(input_scalar(call.inputs, "exclude_input_in_output", config.exclude_input_in_output))
    ids = result.tokens if exclude else np.concatenate([req.input_ids, result.tokens])
    rate = result.num_accepted / result.num_draft if result.num_draft else 0.0
    available = {
        "output_ids": ids.astype(np.int32)[None, None],
        "sequence_length": np.array([[len(ids)]], dtype=np.int32),
        "kv_cache_alloc_new_blocks": np.zeros((1, 1), np.int32),
        "kv_cache_reused_blocks": np.zeros((1, 1), np.int32),
        "kv_cache_alloc_total_blocks": np.zeros((1, 1), np.int32),
        **{name: np.array([[t]], dtype=np.int64) for name, t in times.items()},
        "acceptance_rate": np.array([[rate]], np.float32),
        "total_accepted_draft_tokens": np.array([[result.num_accepted]], np.int32),
        "total_draft_tokens": np.array([[result.num_draft]], np.int32),
    }
    if result.logits is not None:
        available["generation_logits"] = result.logits.astype(np.float32)[None, None]
    perf = bool(input_scalar(call.inputs, "return_perf_metrics", False))
    out = {}
    for name in upstream.ENGINE_OUTPUTS:  # in the order the backend writes them
        if name not in upstream.outputs_written(call.requested, perf) or name not in available:
            continue
        if name not in config.declared_outputs:
            error = upstream.UNDECLARED_OUTPUT.format(name, config.name)
            raise ResponseError(upstream.POPULATING_ERROR.format(upstream.OUTPUT_BUFFER_ERROR.format(name, error)))
        if name == "generation_logits" and config.declared_outputs[name] != "TYPE_FP32":
            raise ResponseError(upstream.POPULATING_ERROR.format("Logits type is not supported"))
        out[name] = available[name]
    return out


class Standin:
    """The engine behind one tensorrt_llm model: a call's tokens, as the backend returns them."""

    def __init__(self, config: StandinConfig, threads: int | None = None):
        self.config = config
        self.engine = Engine(
            config.model_path,
            kv_slots=KV_SLOTS,
            max_seq_len=MAX_SEQ_LEN,
            threads=threads,
            kv_cache_reuse=config.kv_cache_reuse,
        )
        self.lookup = NgramProposer(1, 4) if config.decoding_mode in IN_ENGINE_DECODING_MODES else None

    def run(
        self, calls: list[Call], clock: Callable[[], int] = time.time_ns
    ) -> list[dict[str, np.ndarray] | Exception]:
        """Each call's outputs, or the exception that fails it; the engine's work for all the
        calls shares its forward passes."""
        arrival = clock()
        answers: list[dict[str, np.ndarray] | Exception | None] = [None] * len(calls)
        requests: dict[int, GenerationRequest] = {}
        for i, call in enumerate(calls):
            try:
                req = check_call(self.config, call)
            except (ResponseError, InvalidInput) as err:
                answers[i] = err
                continue
            if req is None:
                answers[i] = {}
            else:
                requests[i] = req
        results = self.generate(list(requests.values()))
        done = clock()
        times = {"arrival_time_ns": arrival, "first_scheduled_time_ns": arrival, "first_token_time_ns": done,
                 "last_token_time_ns": done}  # fmt: skip
        for (i, req), result in zip(requests.items(), results, strict=True):
            try:
                if isinstance(result, Exception):
                    raise result
                answers[i] = response_arrays(self.config, calls[i], req, result, times)
            except Exception as err:  # fails this call only
                answers[i] = err
        return answers  # type: ignore[return-value]

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult | Exception]:
        """The engine's tokens for each request: one call of the engine, or an in-engine mode's steps."""
        if self.lookup is None or not requests:
            return self.engine.generate(requests)
        return self._draft_in_engine(requests)

    def _draft_in_engine(self, requests: list[GenerationRequest]) -> list[GenerationResult | Exception]:
        """An in-engine decoding mode: steps of (a draft by prompt lookup, its verification) until
        each request has its tokens, every request of the call in each step's forward."""
        assert self.lookup is not None
        keys = [f"standin-{uuid.uuid4().hex}" for _ in requests]
        results: list[GenerationResult | Exception] = [GenerationResult(np.zeros(0, np.int32)) for _ in requests]
        running = list(range(len(requests)))
        try:
            while running:
                step = []
                for i in running:
                    req, result = requests[i], results[i]
                    assert isinstance(result, GenerationResult)
                    tokens = np.concatenate([req.input_ids, result.tokens]).astype(np.int64)
                    left = req.max_new_tokens - len(result.tokens)
                    draft = self.lookup.propose(tokens, min(IN_ENGINE_DRAFT, left - 1))
                    step.append(GenerationRequest(tokens, 1 + len(draft), draft if len(draft) else None,
                                                  sampling=req.sampling, end_id=req.end_id, sequence_key=keys[i],
                                                  cache_salt=req.cache_salt,
                                                  min_tokens=max(0, req.min_tokens - len(result.tokens))))  # fmt: skip
                for i, new in zip(running, self.engine.generate(step), strict=True):
                    if isinstance(new, Exception):
                        results[i] = new
                        continue
                    result = results[i]
                    assert isinstance(result, GenerationResult)
                    result.tokens = np.concatenate([result.tokens, new.tokens]).astype(np.int32)
                    result.num_draft += new.num_draft
                    result.num_accepted += new.num_accepted
                running = [i for i in running if self._running(requests[i], results[i])]
        finally:
            for key in keys:
                self.engine.release(key)
        return results

    @staticmethod
    def _running(req: GenerationRequest, result: GenerationResult | Exception) -> bool:
        if isinstance(result, Exception):
            return False
        ended = len(result.tokens) and req.end_id is not None and int(result.tokens[-1]) == req.end_id
        return len(result.tokens) < req.max_new_tokens and not ended


# --- the LLM API (EAGLE-3's engine): tensorrt_llm's names, over the same engine ------------------------
class _Fields:
    """Keyword arguments checked against the fields upstream declares for the class (the LLM
    API's models forbid unknown fields)."""

    def __init__(self, **kwargs):
        known = upstream.LLM_API[type(self).__name__].fields
        unknown = sorted(set(kwargs) - set(known))
        if unknown:
            raise TypeError(f"{type(self).__name__} got unknown fields {unknown} (upstream: {sorted(known)})")
        self.__dict__.update(kwargs)


class KvCacheConfig(_Fields):
    pass


class EagleDecodingConfig(_Fields):
    pass


class SamplingParams(_Fields):
    pass


@dataclass
class _Completion:
    token_ids: list[int]
    request_perf_metrics: object  # TensorRT-LLM 1.0's PyTorch path: the speculative section zeroed


@dataclass
class _Output:
    outputs: list[_Completion]
    finished: bool = True


class _RequestOutput:
    """What generate_async returns: async-iterable, one output when not streaming."""

    def __init__(self, produce):
        self.produce = produce
        self.done = False

    def __aiter__(self):
        return self

    async def __anext__(self) -> _Output:
        if self.done:
            raise StopAsyncIteration
        self.done = True
        return await self.produce()

    def abort(self) -> None:
        self.done = True


class LLM(_Fields):
    """tensorrt_llm.LLM over the stand-in engine, drafting by prompt lookup as an in-engine mode
    does; its requests take turns at the engine (one thread)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        reuse = self.kv_cache_config.enable_block_reuse
        self.standin = Standin(StandinConfig("llm", Path(self.model), True, "eagle", True, reuse))
        self.lock = None

    def generate_async(self, inputs: list[int], sampling_params: SamplingParams, streaming: bool = False):
        import asyncio

        async def produce() -> _Output:
            if self.lock is None:
                self.lock = asyncio.Lock()
            s = sampling_params
            req = GenerationRequest(np.asarray(inputs, dtype=np.int64), s.max_tokens, end_id=s.end_id,
                                    min_tokens=getattr(s, "min_tokens", 0))  # fmt: skip
            async with self.lock:
                (result,) = await asyncio.get_running_loop().run_in_executor(None, self.standin.generate, [req])
            if isinstance(result, Exception):
                raise result
            tokens = result.tokens.tolist()
            if s.end_id is not None and tokens and tokens[-1] == s.end_id:
                tokens = tokens[:-1]  # left out, as the LLM API's text is: spec_decode must not rely on it
            zeroed = SpeculativeMetrics(0, 0, 0.0) if s.return_perf_metrics else None
            return _Output([_Completion(tokens, _PerfMetrics(zeroed) if zeroed else None)])

        return _RequestOutput(produce)


@dataclass
class SpeculativeMetrics:
    total_draft_tokens: int
    total_accepted_draft_tokens: int
    acceptance_rate: float


@dataclass
class _PerfMetrics:
    speculative_decoding: SpeculativeMetrics


PACKAGE = {  # the `tensorrt_llm` package a stand-in server imports (specdec.triton.serve writes it)
    "tensorrt_llm/__init__.py": "from specdec.triton.standin import LLM, SamplingParams  # noqa: F401\n",
    "tensorrt_llm/llmapi.py": "from specdec.triton.standin import EagleDecodingConfig, KvCacheConfig  # noqa: F401\n",
}


def build_standin(profile) -> Path:
    """A GPU profile's repository as its build renders it, each engine folder holding the role's
    Hugging Face checkpoint for the stand-in to load (the CPU analogue of trtllm-build), and the
    LLM API's stand-in package beside an LLM-API model. Returns the repository."""
    from specdec.build.repository import render_repository
    from specdec.build.trtllm import engine_dir

    repo = render_repository(profile)
    if upstream.MODES[profile.trtllm.mode].build_mode is None:  # the LLM API's model: its package beside it
        for name, text in PACKAGE.items():
            (repo / "target" / "1" / name).parent.mkdir(parents=True, exist_ok=True)
            (repo / "target" / "1" / name).write_text(text)
    roles = {"target": profile.target, "draft": profile.draft}
    for role, source in roles.items():
        if source is None or upstream.MODES[profile.trtllm.mode].build_mode is None:
            continue
        dest = engine_dir(profile, role)
        dest.mkdir(parents=True, exist_ok=True)
        for file in Path(source.hf_dir).iterdir():
            link = dest / file.name
            if not link.exists():
                link.symlink_to(file.resolve())
    return repo
