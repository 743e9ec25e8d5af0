"""spec_decode for TensorRT-LLM's in-engine speculation: EAGLE-3, Medusa, lookahead, ReDrafter.

The engine drafts and verifies by itself, so the BLS proposes nothing: it asks the target for the
request's tokens, `passthrough_chunk` at a time when streaming (each call a request of its own; KV
cache reuse makes the repeated prefix cheap), applies the same end / stop-word / length rules as
the draft-verify loop (loop.Generation), and reports acceptance from the engine's perf-metric
outputs (return_perf_metrics -> total_draft_tokens, total_accepted_draft_tokens).

Same interface as service.SpecDecodeService (one injected `prepare(model, inputs, outputs,
request_id)` that builds an engine call, `serve` yields Chunks), so the Triton adapter picks either by profile.
Sequences are not released afterwards: every call is a finished request for the engine.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

import numpy as np

from specdec.build import upstream
from specdec.config import Profile
from specdec.speculation import loop
from specdec.triton.service import (
    Chunk,
    EngineClient,
    Metrics,
    NoMetrics,
    PrepareCall,
    RequestClock,
    admission_for,
    new_sequence_key,
    request_sampling,
)
from specdec.triton.tensors import SpecDecodeRequest

log = logging.getLogger("specdec.triton.passthrough")

PERF_OUTPUTS = ["total_draft_tokens", "total_accepted_draft_tokens"]


def drafts_in_engine(profile: Profile) -> bool:
    """The profile's target speculates inside its engine (no drafts from the BLS)."""
    return profile.trtllm is not None and not profile.trtllm.external


def decoupled_engines(profile: Profile) -> set[str]:
    """The engine models that answer through a decoupled response sender: the LLM API's (a mode
    with no engine build), rendered as the target."""
    trt = profile.trtllm
    return {"target"} if trt is not None and upstream.MODES[trt.mode].build_mode is None else set()


def record_engine_round(stats: loop.AcceptanceStats, num_new: int, drafted: int, accepted: int) -> None:
    """Add one engine call's speculation to a request's statistics. Every engine step emits its
    accepted drafts plus one token of its own, so the call ran num_new - accepted steps."""
    stats.drafts += max(num_new - accepted, 0) if drafted else 0
    stats.draft_tokens += drafted
    stats.accepted_tokens += accepted


class PassthroughService:
    def __init__(self, profile: Profile, prepare: PrepareCall, metrics: Metrics | None = None,
                 target_model: str = "target", draft_model: str | None = None,
                 warn: Callable[[str], None] = log.warning):  # fmt: skip
        assert profile.trtllm is not None and draft_model in (None, "")
        self.prepare, self.target_model = prepare, target_model
        self.chunk = profile.trtllm.passthrough_chunk
        self.label = profile.trtllm.mode  # the proposer, for metrics
        self.metrics = metrics or NoMetrics()
        self.admission = admission_for(profile, self.metrics, profile.server.max_inflight)
        self.warn = warn
        self.warned = False

    def _ignored_controls(self, req: SpecDecodeRequest) -> None:
        """draft_method and num_draft_tokens do not reach in-engine speculation: say so, once."""
        if not self.warned and (req.proposer != "none" or req.spec.num_draft_tokens):
            self.warned = True
            self.warn(
                f"{self.label} speculates inside the engine: requests' draft_method and num_draft_tokens are ignored"
            )

    async def serve(
        self, req: SpecDecodeRequest, is_cancelled: Callable[[], bool] = lambda: False
    ) -> AsyncIterator[Chunk]:
        self._ignored_controls(req)
        sampling, end_id = request_sampling(req), req.spec.end_id
        key = new_sequence_key()
        gen = loop.Generation(req.spec)
        perf: dict[str, int] = {}

        def prepare_with_metrics(model, inputs, outputs, request_id):
            inputs = {**inputs, "return_perf_metrics": np.array([[True]], dtype=np.bool_)}
            send = self.prepare(model, inputs, [*outputs, *PERF_OUTPUTS], request_id)

            async def outputs_and_metrics():
                result = await send()
                perf.update({name: int(np.asarray(result[name]).reshape(-1)[0]) for name in PERF_OUTPUTS})
                return result

            return outputs_and_metrics

        target = EngineClient(prepare_with_metrics, self.target_model)
        final = Chunk([], True, gen)
        clock = RequestClock()
        async with self.admission.admitted():
            clock.admit()
            try:
                while not gen.finished:
                    if is_cancelled():
                        gen.finish_reason = "cancelled"
                        break
                    remaining = req.spec.max_tokens - len(gen.generated)
                    asked = min(self.chunk, remaining) if req.stream else remaining
                    ids, _, _ = await target.generate(
                        gen.tokens, asked, sampling, key, end_id, min_tokens=min(asked, gen.min_tokens_left)
                    )
                    new = gen.accept([], ids) if ids else []
                    if not gen.finished and len(ids) < asked:
                        gen.finish_reason = "eos"  # the engine ended at its end token and left it out
                    record_engine_round(
                        gen.stats, len(ids), perf["total_draft_tokens"], perf["total_accepted_draft_tokens"]
                    )
                    clock.tokens(new)
                    if gen.finished:
                        final = Chunk(new, True, gen)
                    else:
                        yield Chunk(new, False, gen)
            finally:
                self.metrics.finished(self.label, gen.finish_reason or "error", len(gen.generated), clock.timing())
        yield final
