"""The spec_decode service: proposers and the target behind the loop, as engine calls.

Engines are reached through one injected coroutine, `call(model, inputs, outputs, request_id)`,
that speaks the TensorRT-LLM backend's tensors: in the server it is a BLS call
(model_repository/spec_decode/1/model.py); in tests it can call an Engine in-process. Each
sequence is one request id for the engines, so they reuse its KV cache from call to call, and it
is released (a `stop` call) when the request ends, fails or is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from specdec import loop
from specdec.config import Profile
from specdec.engine.engine import Engine
from specdec.proposers import NgramProposer
from specdec.sampling import SamplingParams, derive_seed
from specdec.triton_io import (
    InvalidInput,
    SpecDecodeRequest,
    empty_engine_outputs,
    engine_outputs,
    parse_engine_request,
)

log = logging.getLogger("specdec.spec_decode")

EngineCall = Callable[[str, dict[str, np.ndarray], list[str], str], Awaitable[dict[str, np.ndarray]]]

DRAFT_SEED_SALT = 0xD2AF7  # the draft's sampling noise must be independent of the target's


class EngineError(RuntimeError):
    """An engine call failed; the message is the engine's."""


class Overloaded(RuntimeError):
    """More requests than the server admits and queues."""


class Metrics(Protocol):
    def round(self, proposer: str, num_draft: int, num_accepted: int) -> None: ...
    def finished(self, proposer: str, reason: str, num_tokens: int) -> None: ...


class NoMetrics:
    def round(self, proposer: str, num_draft: int, num_accepted: int) -> None:
        pass

    def finished(self, proposer: str, reason: str, num_tokens: int) -> None:
        pass


def _scalar(value, dtype) -> np.ndarray:
    return np.array([[value]], dtype=dtype)


class EngineClient:
    """One engine model (target or draft), called with TensorRT-LLM's tensor names."""

    def __init__(self, call: EngineCall, model: str):
        self.call, self.model = call, model

    async def generate(
        self,
        tokens: list[int],
        num_tokens: int,
        sampling: SamplingParams,
        key: str,
        end_id: int | None,
        draft: loop.Draft = loop.NO_DRAFT,
        return_logits: bool = False,
    ) -> tuple[list[int], np.ndarray | None]:
        inputs = {
            "input_ids": np.array([tokens], dtype=np.int32),
            "input_lengths": _scalar(len(tokens), np.int32),
            "request_output_len": _scalar(num_tokens, np.int32),
            "exclude_input_in_output": _scalar(True, np.bool_),
            "temperature": _scalar(sampling.temperature, np.float32),
            "runtime_top_k": _scalar(sampling.top_k, np.int32),
            "runtime_top_p": _scalar(sampling.top_p, np.float32),
            "seed": _scalar(sampling.seed, np.uint64),
        }
        if end_id is not None:
            inputs["end_id"] = _scalar(end_id, np.int32)
        if draft.ids:
            inputs["draft_input_ids"] = np.array([draft.ids], dtype=np.int32)
            if draft.logits is not None:
                inputs["draft_logits"] = draft.logits.astype(np.float32)[None]
        outputs = ["output_ids"]
        if return_logits:
            inputs["return_generation_logits"] = _scalar(True, np.bool_)
            outputs.append("generation_logits")
        result = await self.call(self.model, inputs, outputs, key)
        ids = np.asarray(result["output_ids"]).reshape(-1).tolist()
        logits = result.get("generation_logits")
        if logits is not None:
            logits = np.asarray(logits, dtype=np.float32).reshape(len(ids), -1)
        return ids, logits

    async def release(self, key: str) -> None:
        inputs = {
            "input_ids": np.zeros((1, 1), dtype=np.int32),
            "input_lengths": _scalar(1, np.int32),
            "request_output_len": _scalar(1, np.int32),
            "stop": _scalar(True, np.bool_),
        }
        await self.call(self.model, inputs, [], key)


@dataclass
class Chunk:
    tokens: list[int]  # new tokens of this round
    final: bool
    gen: loop.Generation


class SpecDecodeService:
    def __init__(self, profile: Profile, call: EngineCall, metrics: Metrics | None = None,
                 target_model: str = "target", draft_model: str | None = "draft"):  # fmt: skip
        self.profile = profile
        self.target = EngineClient(call, target_model)
        self.draft = EngineClient(call, draft_model) if draft_model else None
        ngram = profile.speculation.ngram
        self.ngram = NgramProposer(ngram.min_n, ngram.max_n)
        self.metrics = metrics or NoMetrics()
        # Admission: no more sequences in flight than the engines hold KV slots for; a bounded
        # FIFO queue behind them; beyond it, an immediate refusal.
        self.max_inflight = min(profile.server.max_inflight, profile.engine.kv_slots)
        self.active = 0
        self._queue: deque[asyncio.Future] = deque()

    @contextlib.asynccontextmanager
    async def _admitted(self):
        if self.active < self.max_inflight:
            self.active += 1
        else:
            if len(self._queue) >= self.profile.server.max_queue:
                raise Overloaded(
                    f"server busy: {self.active} requests in flight and {len(self._queue)} queued; retry later"
                )
            place = asyncio.get_running_loop().create_future()
            self._queue.append(place)
            try:
                await place  # a finishing request hands its place over
            except asyncio.CancelledError:
                if not place.done():
                    self._queue.remove(place)
                    raise
                self._hand_over()
                raise
        try:
            yield
        finally:
            self._hand_over()

    def _hand_over(self) -> None:
        while self._queue:
            place = self._queue.popleft()
            if not place.done():
                place.set_result(None)
                return
        self.active -= 1

    def _proposer(self, name: str, sampling: SamplingParams, key: str, end_id: int | None) -> loop.Proposer:
        if name == "ngram":

            async def ngram(tokens: list[int], k: int) -> loop.Draft:
                return loop.Draft(self.ngram.propose(np.asarray(tokens), k).tolist())

            return ngram
        if name == "draft_model":
            assert self.draft is not None
            draft_sampling = SamplingParams(
                sampling.temperature, sampling.top_k, sampling.top_p, derive_seed(sampling.seed, DRAFT_SEED_SALT)
            )

            async def draft_model(tokens: list[int], k: int) -> loop.Draft:
                ids, logits = await self.draft.generate(
                    tokens, k, draft_sampling, key, end_id, return_logits=not sampling.greedy
                )
                return loop.Draft(ids, logits)

            return draft_model

        async def none(tokens: list[int], k: int) -> loop.Draft:
            return loop.NO_DRAFT

        return none

    async def serve(
        self, req: SpecDecodeRequest, is_cancelled: Callable[[], bool] = lambda: False
    ) -> AsyncIterator[Chunk]:
        """Run one request; yield its chunks (the last has final=True). Stops within one round
        of a cancellation; always releases the engines' caches for the sequence."""
        sampling = req.sampling
        if not sampling.greedy and not req.seeded:
            sampling = SamplingParams(sampling.temperature, sampling.top_k, sampling.top_p, secrets.randbits(64))
        key = f"specdec-{uuid.uuid4().hex}"
        end_id = req.spec.end_id if req.spec.end_id is not None and req.spec.end_id >= 0 else None
        gen = loop.Generation(req.spec)
        propose = self._proposer(req.proposer, sampling, key, end_id)

        async def verify(tokens: list[int], draft: loop.Draft) -> list[int]:
            ids, _ = await self.target.generate(tokens, len(draft.ids) + 1, sampling, key, end_id, draft)
            return ids

        # The final chunk goes out only after the engines released the sequence: a client that
        # saw its last response never races the cleanup (nor a server shutdown with it).
        final = Chunk([], True, gen)
        async with self._admitted():
            try:
                async for new in loop.run(gen, propose, verify, cancelled=is_cancelled):
                    self.metrics.round(req.proposer, gen.stats.last_draft, gen.stats.last_accepted)
                    if gen.finished:
                        final = Chunk(new, True, gen)
                    else:
                        yield Chunk(new, False, gen)
            finally:
                await self._release(key, draft_used=req.proposer == "draft_model")
                self.metrics.finished(req.proposer, gen.finish_reason or "error", len(gen.generated))
        yield final

    async def _release(self, key: str, draft_used: bool) -> None:
        clients = [self.target] + ([self.draft] if draft_used and self.draft else [])
        for client in clients:
            try:
                await client.release(key)
            except Exception as err:  # releasing is best effort; LRU eviction reclaims the slot
                log.warning("could not release %s on %s: %s", key, client.model, err)


def local_call(engines: dict[str, Engine]) -> EngineCall:
    """An EngineCall that runs engines in this process, through the same request parsing and
    response layout as the Triton engine model, batching the calls that arrive together (as
    Triton's dynamic batcher does): the service without a server, for tests and benchmarks."""
    pending: dict[str, list] = {name: [] for name in engines}

    def flush(model: str) -> None:
        batch, pending[model] = pending[model], []
        results = engines[model].generate([req for req, _, _ in batch])
        for (req, exclude, future), result in zip(batch, results, strict=True):
            if isinstance(result, Exception):
                future.set_exception(EngineError(f"{model}: {result}"))
            else:
                future.set_result(engine_outputs(result, req, exclude))

    async def call(
        model: str, inputs: dict[str, np.ndarray], outputs: list[str], request_id: str
    ) -> dict[str, np.ndarray]:
        arrays = {name: np.asarray(arr)[0] for name, arr in inputs.items()}  # drop the batch dim
        try:
            req = parse_engine_request(arrays, request_id)
        except InvalidInput as err:
            raise EngineError(f"{model}: {err}") from None
        if req is None:
            engines[model].release(request_id)
            return empty_engine_outputs()
        future = asyncio.get_running_loop().create_future()
        if not pending[model]:
            asyncio.get_running_loop().call_soon(flush, model)
        pending[model].append((req, bool(arrays.get("exclude_input_in_output", False)), future))
        out = await future
        return {name: out[name] for name in outputs}

    return call
