"""The spec_decode service: proposers and the target behind the loop, as engine calls.

Engines are reached through one injected function, `prepare(model, inputs, outputs, request_id)`,
that speaks the TensorRT-LLM backend's tensors and returns `send`: calling send() sends the call and
returns an awaitable of its outputs. In the server it is a BLS call
(model_repository/spec_decode/1/model.py); in tests it can call an Engine in-process. Rounds in
step (specdec/speculation/lockstep.py) prepare their calls before they wait and then send them at once, to
the PyTorch engine as one call of a row per sequence. Each sequence is one key for the engines
(the request id, or its row's sequence_key), so they reuse its KV cache from call to call, and it
is released (a `stop` call) when the request ends, fails or is cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import NamedTuple, Protocol

import numpy as np

from specdec.config import Profile
from specdec.contract import CACHE_SALT_INPUT, GUESS_INPUT, GUESS_OUTPUT, ROW_ERRORS_OUTPUT, SEQUENCE_KEY_INPUT
from specdec.engine.engine import Engine
from specdec.engine.sampling import SamplingParams, derive_seed
from specdec.speculation import loop
from specdec.speculation.admission import CANCEL, Admission, drain_path
from specdec.speculation.controller import Controller, Evidence, ForwardCost, calibration_path
from specdec.speculation.lockstep import Lockstep, Send, send_each
from specdec.speculation.lookup import Lead, NgramProposer, PromptLookup
from specdec.speculation.opening import Opening
from specdec.speculation.phrases import PhraseIndex
from specdec.tokenizer import TextTokenizer
from specdec.triton.tensors import (
    InvalidInput,
    SpecDecodeRequest,
    empty_engine_outputs,
    parse_engine_call,
    run_engine_calls,
    stack_rows,
)

log = logging.getLogger("specdec.triton.service")

# (model, inputs, outputs, request_id) -> the call prepared: sending it gives its outputs to come
PrepareCall = Callable[[str, dict[str, np.ndarray], list[str], str], Send]

FindEvidence = Callable[[list[int]], Evidence]  # what a proposer finds before drafting

DRAFT_SEED_SALT = 0xD2AF7  # the draft's sampling noise must be independent of the target's
COST_CHECK_S = 1.0  # how often to look for a newer calibration of the engines' forward times


class EngineError(RuntimeError):
    """An engine call failed; the message is the engine's."""


@dataclass(frozen=True)
class Timing:
    """A request's times from its arrival, in seconds: when it was admitted (its wait in the
    queue), when its first tokens were generated (streamed or not), and when it ended."""

    queued_s: float
    first_token_s: float
    total_s: float


class RequestClock:
    """Takes a request's Timing as it goes."""

    def __init__(self):
        self.arrived = time.perf_counter()
        self.admitted: float | None = None
        self.first_token: float | None = None

    def admit(self) -> None:
        self.admitted = time.perf_counter()

    def tokens(self, new: list[int]) -> None:
        if new and self.first_token is None:
            self.first_token = time.perf_counter()

    def timing(self) -> Timing:
        now = time.perf_counter()
        admitted, first = self.admitted or now, self.first_token or now
        return Timing(admitted - self.arrived, first - self.arrived, now - self.arrived)


class Metrics(Protocol):
    """What the services report, as it happens. load(running, queued) follows the admission's
    counts: called when a request is queued, starts and ends, it is where an implementation may
    send what it recorded."""

    def round(self, proposer: str, num_draft: int, num_accepted: int) -> None: ...
    def fallback(self, proposer: str) -> None: ...
    def refused(self, reason: str) -> None: ...
    def finished(self, proposer: str, reason: str, num_tokens: int, timing: Timing) -> None: ...
    def load(self, running: int, queued: int) -> None: ...


class NoMetrics:
    def round(self, proposer: str, num_draft: int, num_accepted: int) -> None:
        pass

    def fallback(self, proposer: str) -> None:
        pass

    def refused(self, reason: str) -> None:
        pass

    def finished(self, proposer: str, reason: str, num_tokens: int, timing: Timing) -> None:
        pass

    def load(self, running: int, queued: int) -> None:
        pass


def admission_for(profile: Profile, metrics: Metrics, max_inflight: int) -> Admission:
    """The profile's admission (server.max_inflight, server.max_queue, the drain file), reporting
    its counts and refusals to `metrics`."""
    return Admission(
        max_inflight,
        profile.server.max_queue,
        drain_path(profile.build_path()),
        on_change=metrics.load,
        on_refused=metrics.refused,
    )


class EngineReply(NamedTuple):
    ids: list[int]  # the call's new tokens
    logits: np.ndarray | None  # (len(ids), V) when asked for
    guesses: list[int]  # the engine's guess at the token after them, then its other plausible ones; []: none


def no_evidence(tokens: list[int]) -> None:
    """A proposer that finds out only by drafting (a draft model), or never drafts."""
    return None


def _scalar(value, dtype) -> np.ndarray:
    return np.array([[value]], dtype=dtype)


@dataclass
class PreparedCall:
    """A call of EngineClient.generate(), prepared: calling it sends it (alone); the client's
    send_together() sends several as one call of a row each."""

    client: EngineClient
    inputs: dict[str, np.ndarray]  # each [1, ...]: one row
    outputs: list[str]
    key: str

    def __call__(self) -> Awaitable[EngineReply]:
        return self.client.decoded(self.client.prepare(self.client.model, self.inputs, self.outputs, self.key)(), 0)


class EngineClient:
    """One engine model (target or draft), called with TensorRT-LLM's tensor names.

    uniform_inputs: every call carries the same set of input tensors (an empty draft, logits not
    asked for, end_id -1 for none). Triton's dynamic batcher puts two calls of a model with
    optional inputs into one execute() only when they carry the same inputs (core
    scheduler_utils.cc, HasEqualInputs): a call with draft tokens and one without would go into
    separate forward passes. For the PyTorch engine, whose batches are its forward passes and
    which takes calls of several rows (send_together); TensorRT-LLM's in-flight batcher batches
    by itself and is sent only what a call uses.
    """

    def __init__(self, prepare: PrepareCall, model: str, uniform_inputs: bool = False, max_rows: int = 1):
        self.prepare, self.model, self.uniform_inputs = prepare, model, uniform_inputs
        self.max_rows = max_rows if uniform_inputs else 1  # sequences a call may carry

    async def generate(self, *args, **kwargs) -> EngineReply:
        """What the call prepare_generate(*args, **kwargs) builds returns."""
        return await self.prepare_generate(*args, **kwargs)()

    def prepare_generate(
        self,
        tokens: list[int],
        num_tokens: int,
        sampling: SamplingParams,
        key: str,
        end_id: int | None,
        draft: loop.Draft = loop.NO_DRAFT,
        return_logits: bool = False,
        return_guess: bool | None = None,
        cache_salt: str = "",
        min_tokens: int = 0,
    ) -> PreparedCall:
        """The call of generate(), prepared. return_guess: ask for the engine's guess
        (specdec/engine/guess.py): True or False from a client whose engine has a guess head (all
        its calls carry the input and ask for the output then: a row that did not ask gets none),
        None from one whose engine has not. cache_salt: the PyTorch engine's (uniform_inputs);
        TensorRT-LLM's engine has no such input."""
        # TensorRT-LLM decodes greedily with top_k 1 (its maintainers' advice; temperature 0
        # alone is not documented as greedy there); our engine is greedy at temperature 0 anyway.
        top_k = 1 if sampling.greedy else sampling.top_k
        inputs = {
            "input_ids": np.array([tokens], dtype=np.int32),
            "input_lengths": _scalar(len(tokens), np.int32),
            "request_output_len": _scalar(num_tokens, np.int32),
            "exclude_input_in_output": _scalar(True, np.bool_),
            "temperature": _scalar(sampling.temperature, np.float32),
            "runtime_top_k": _scalar(top_k, np.int32),
            "runtime_top_p": _scalar(sampling.top_p, np.float32),
            "seed": _scalar(sampling.seed, np.uint64),
        }
        if end_id is not None or self.uniform_inputs:
            inputs["end_id"] = _scalar(-1 if end_id is None else end_id, np.int32)  # -1: none
        if min_tokens or self.uniform_inputs:
            inputs["min_tokens"] = _scalar(min_tokens, np.int32)
        if draft.ids or self.uniform_inputs:
            inputs["draft_input_ids"] = np.array([draft.ids], dtype=np.int32)  # (1, 0) when empty
        if draft.logits is not None:
            inputs["draft_logits"] = draft.logits.astype(np.float32)[None]
        elif self.uniform_inputs:
            inputs["draft_logits"] = np.zeros((1, 0, 0), dtype=np.float32)
        if return_logits or self.uniform_inputs:
            inputs["return_generation_logits"] = _scalar(return_logits, np.bool_)
        if return_guess is not None:
            inputs[GUESS_INPUT] = _scalar(return_guess, np.bool_)
        if self.uniform_inputs:
            inputs[CACHE_SALT_INPUT] = _scalar(cache_salt.encode(), np.object_)
            inputs[SEQUENCE_KEY_INPUT] = _scalar(key.encode(), np.object_)
        # The same outputs whether or not this call wants the guess: send_together joins only
        # calls that ask for the same ones, and the calls asking and those not asking would leave
        # as two calls and go into two forwards.
        guess = [GUESS_OUTPUT] if return_guess is not None else []
        # sequence_length too: the tensorrtllm backend fails a response without it (upstream.Written.REQUIRED)
        outputs = ["output_ids", "sequence_length"] + (["generation_logits"] if return_logits else []) + guess
        return PreparedCall(self, inputs, outputs, key)

    def send_together(
        self, calls: list[Callable[[], Awaitable[EngineReply]]]
    ) -> list[Awaitable[EngineReply] | Exception]:
        """Send calls at once: this client's, where its engine takes calls of several rows, as
        one call with a row for each (at most max_rows a call), the others one by one. Sent one
        by one, a round's many calls can reach the engine over more than its batcher's delay and
        go into two forward passes. The result of each call, or the exception that kept it from
        being sent."""
        sent: list[Awaitable[EngineReply] | Exception | None] = [None] * len(calls)
        rows: dict[tuple, list[int]] = {}  # calls that can share a call: by their outputs and input names
        for i, call in enumerate(calls):
            # (a draft's logits or the target's would be padded to the longest row: not worth it)
            if (
                self.max_rows > 1
                and isinstance(call, PreparedCall)
                and call.client is self
                and not (call.inputs["draft_logits"].size or "generation_logits" in call.outputs)
            ):
                rows.setdefault((tuple(call.outputs), tuple(call.inputs)), []).append(i)
        for (outputs, _), members in rows.items():
            if len(members) < 2:
                continue  # sent alone below
            for start in range(0, len(members), self.max_rows):
                chunk = members[start : start + self.max_rows]
                try:
                    shared = asyncio.ensure_future(self._send_rows([calls[i] for i in chunk], list(outputs)))
                except Exception as err:  # fails these calls only
                    shared = err
                for row, i in enumerate(chunk):
                    sent[i] = shared if isinstance(shared, Exception) else self.decoded(shared, row)
        alone = [i for i, s in enumerate(sent) if s is None]
        for i, one in zip(alone, send_each([calls[i] for i in alone]), strict=True):
            sent[i] = one
        return sent  # type: ignore[return-value]

    def _send_rows(self, calls: list[PreparedCall], outputs: list[str]) -> Awaitable[dict[str, np.ndarray]]:
        """One call with a row for each of `calls` (which carry the same inputs and ask the same outputs)."""
        fill = {"input_ids": 0, "draft_input_ids": -1}  # input_lengths gives a row's length; a draft ends at -1
        inputs = {
            name: stack_rows([call.inputs[name] for call in calls], fill.get(name, 0)) for name in calls[0].inputs
        }
        return self.prepare(self.model, inputs, [*outputs, ROW_ERRORS_OUTPUT], calls[0].key)()

    async def decoded(self, sent: Awaitable[dict[str, np.ndarray]], row: int) -> EngineReply:
        """Row `row` of a call's outputs (a call of one row: 0)."""
        result = await sent
        if ROW_ERRORS_OUTPUT in result and (error := result[ROW_ERRORS_OUTPUT][row].reshape(-1)[0]):
            raise EngineError(f"{self.model}: {error.decode()}")
        ids = np.asarray(result["output_ids"])[row].reshape(-1)
        ids = ids[: int(np.asarray(result["sequence_length"])[row].reshape(-1)[0])]  # rows padded to the longest
        logits = result.get("generation_logits")
        if logits is not None:
            logits = np.asarray(logits, dtype=np.float32)[row].reshape(len(ids), -1)
        guesses = np.asarray(result[GUESS_OUTPUT])[row].reshape(-1).tolist() if GUESS_OUTPUT in result else []
        return EngineReply(ids.tolist(), logits, [g for g in guesses if g >= 0])

    async def release(self, key: str) -> None:
        inputs = {
            "input_ids": np.zeros((1, 1), dtype=np.int32),
            "input_lengths": _scalar(1, np.int32),
            "request_output_len": _scalar(1, np.int32),
            "stop": _scalar(True, np.bool_),
        }
        await self.prepare(self.model, inputs, [], key)()


def opening(model_dir: Path) -> Opening | None:
    """Where answers may open, from the target's tokenizer (None: it has none, or no chat template)."""
    return Opening.from_tokenizer(TextTokenizer(model_dir)) if (model_dir / "tokenizer.json").is_file() else None


def request_sampling(req: SpecDecodeRequest) -> SamplingParams:
    """The request's sampling; a sampled request without a seed gets a random one, so that all
    its rounds (and its draft) draw from one consistent stream."""
    s = req.sampling
    return s if s.greedy or req.seeded else SamplingParams(s.temperature, s.top_k, s.top_p, secrets.randbits(64))


def new_sequence_key() -> str:
    """The request id a sequence has in the engines (their KV-cache key)."""
    return f"specdec-{uuid.uuid4().hex}"


@dataclass
class Chunk:
    tokens: list[int]  # new tokens of this round
    final: bool
    gen: loop.Generation


class SpecDecodeService:
    def __init__(self, profile: Profile, prepare: PrepareCall, metrics: Metrics | None = None,
                 target_model: str = "target", draft_model: str | None = "draft",
                 warn: Callable[[str], None] = log.warning):  # fmt: skip
        self.profile = profile
        uniform = profile.backend == "pytorch"
        # the engine's guesses lead prompt lookup's drafts where it matches little (lookup.py)
        self.guesses = uniform and profile.speculation.ngram.guess_head is not None
        self.target = EngineClient(prepare, target_model, uniform, profile.engine.max_batch_size)
        self.draft = EngineClient(prepare, draft_model, uniform) if draft_model else None
        # the draft engine returns its logits (exact sampled verification); else it drafts greedily
        self.draft_logits = profile.trtllm is None or profile.trtllm.draft_logits
        ngram = profile.speculation.ngram
        self.ngram = NgramProposer(ngram.min_n, ngram.max_n)
        self.phrases = PhraseIndex.load(ngram.phrases) if ngram.phrases else None
        self.opening = opening(profile.model_dir("target")) if ngram.opening else None
        self.metrics = metrics or NoMetrics()
        self.warn = warn
        self.controller = Controller(profile.speculation.adaptive)
        self.lockstep = Lockstep(profile.server.batch_wait_ms / 1000, self._target_forward_s, self.target.send_together)
        self._costs_checked = -math.inf
        self._cost_mtimes: dict[str, float] = {}
        self.admission = admission_for(profile, self.metrics, min(profile.server.max_inflight, profile.engine.kv_slots))

    def _proposer(
        self, name: str, sampling: SamplingParams, key: str, spec: loop.RequestSpec, salt: str
    ) -> tuple[loop.Proposer, FindEvidence, PromptLookup | None]:
        """The request's proposer, what it finds before drafting (Controller.choose_k), and the
        prompt lookup that hears the engine's guesses, if it is one and there are guesses."""
        prompt_length = len(spec.prompt_ids)
        if name == "ngram":
            wanted = partial(self.controller.would_draft, key, Lead.PHRASE)
            lookup = PromptLookup(self.ngram, prompt_length, self.phrases, wanted, self.opening)
            return lookup.propose, lookup.evidence, lookup if self.guesses else None
        if name == "draft_model":
            assert self.draft is not None
            draft_sampling = SamplingParams(
                sampling.temperature, sampling.top_k, sampling.top_p, derive_seed(sampling.seed, DRAFT_SEED_SALT)
            )
            if not self.draft_logits:
                # without the draft's logits the target verifies by comparing tokens, exact only
                # for a deterministic draft: the draft decodes greedily
                draft_sampling = SamplingParams()

            failed = False

            async def draft_model(tokens: list[int], k: int) -> loop.Draft:
                # A failing draft must not fail the request: the target alone decides every
                # token anyway, so the request goes on without drafts (the same output).
                nonlocal failed
                if failed:
                    return loop.NO_DRAFT
                try:
                    min_tokens = max(0, spec.min_tokens - (len(tokens) - prompt_length))
                    ids, logits, _ = await self.draft.generate(
                        tokens, k, draft_sampling, key, spec.end_id, return_logits=not draft_sampling.greedy,
                        cache_salt=salt, min_tokens=min_tokens,
                    )  # fmt: skip
                except EngineError as err:
                    failed = True
                    self.metrics.fallback(name)
                    self.warn(f"draft model failed, request {key} continues without speculation: {err}")
                    return loop.NO_DRAFT
                return loop.Draft(ids, logits)

            return draft_model, no_evidence, None

        async def none(tokens: list[int], k: int) -> loop.Draft:
            return loop.NO_DRAFT

        return none, no_evidence, None

    async def serve(
        self, req: SpecDecodeRequest, is_cancelled: Callable[[], bool] = lambda: False
    ) -> AsyncIterator[Chunk]:
        """Run one request; yield its chunks (the last has final=True). Stops within one round
        of a cancellation; always releases the engines' caches for the sequence."""
        sampling, end_id = request_sampling(req), req.spec.end_id
        key = new_sequence_key()
        gen = loop.Generation(req.spec)
        propose, evidence, listener = self._proposer(req.proposer, sampling, key, req.spec, req.cache_salt)

        async def verify(tokens: list[int], draft: loop.Draft) -> list[int]:
            rows = len(draft.ids) + (1 if gen.stats.rounds else len(tokens))  # the first call prefills
            ask = None  # (an engine without guesses is not asked)
            if self.guesses:
                ask = listener is not None and self.controller.would_draft(key, Lead.GUESS)
            send = self.target.prepare_generate(
                tokens, len(draft.ids) + 1, sampling, key, end_id, draft, return_guess=ask, cache_salt=req.cache_salt,
                min_tokens=gen.min_tokens_left,
            )  # fmt: skip
            ids, _, guesses = await self.lockstep.call(member, rows, send)
            if listener is not None:
                listener.heard(len(tokens) + len(ids), guesses)
            return ids

        def choose_k(gen: loop.Generation) -> int:
            budget = gen.draft_budget(gen.spec.num_draft_tokens)
            return self.controller.choose_k(key, budget, evidence(gen.tokens) if budget else None)

        # The final chunk goes out only after the engines released the sequence: a client that
        # saw its last response never races the cleanup (nor a server shutdown with it).
        def cancelled() -> bool:
            return is_cancelled() or self.admission.state() == CANCEL

        final = Chunk([], True, gen)
        clock = RequestClock()
        async with self.admission.admitted():
            clock.admit()
            self._load_costs()
            self.controller.start(key, req.proposer, req.spec.num_draft_tokens, sampled=not sampling.greedy)
            try:
                with self.lockstep.member() as member:
                    round_start = time.perf_counter()
                    async for new in loop.run(gen, propose, verify, choose_k, cancelled=cancelled):
                        stats = gen.stats
                        if stats.rounds > 1:  # (the first one is the prompt's prefill)
                            self.controller.observe_round(time.perf_counter() - round_start)
                        round_start = time.perf_counter()
                        self.controller.observe(key, stats.last_draft, stats.last_accepted)
                        self.metrics.round(req.proposer, stats.last_draft, stats.last_accepted)
                        clock.tokens(new)
                        if gen.finished:
                            final = Chunk(new, True, gen)
                        else:
                            yield Chunk(new, False, gen)
                if gen.finish_reason == "cancelled" and not is_cancelled():
                    gen.finish_reason = "shutdown"
            finally:
                self.controller.finish(key)
                await self._release(key, draft_used=req.proposer == "draft_model")
                self.metrics.finished(req.proposer, gen.finish_reason or "error", len(gen.generated), clock.timing())
        yield final

    def _target_forward_s(self, rows: int) -> float:
        cost = self.controller.target
        return cost.time(rows) if cost is not None else 0.0  # unknown: no call waits for another

    def _load_costs(self) -> None:
        """The engines write their calibration while they load and keep it current while they
        serve: pick up each new version (checked at most every COST_CHECK_S)."""
        now = time.monotonic()
        if now - self._costs_checked < COST_CHECK_S:
            return
        self._costs_checked = now
        build = self.profile.build_path()
        for role, client in (("target", self.target), ("draft", self.draft)):
            if client is None:
                continue
            path = calibration_path(build, client.model)
            mtime = path.stat().st_mtime if path.is_file() else None
            if mtime is not None and mtime != self._cost_mtimes.get(role):
                self._cost_mtimes[role] = mtime
                setattr(self.controller, role, ForwardCost.load(path))

    async def _release(self, key: str, draft_used: bool) -> None:
        if self.profile.backend != "pytorch":
            return  # every tensorrtllm call is a finished request: the engine holds no sequence
        clients = [self.target] + ([self.draft] if draft_used and self.draft else [])
        for client in clients:
            try:
                await client.release(key)
            except Exception as err:  # releasing is best effort; LRU eviction reclaims the slot
                log.warning("could not release %s on %s: %s", key, client.model, err)


def local_call(engines: dict[str, Engine]) -> PrepareCall:
    """A PrepareCall that runs engines in this process, through the same request parsing and
    response layout as the Triton engine model, batching the calls that arrive together (as
    Triton's dynamic batcher does): the service without a server, for tests and benchmarks."""
    pending: dict[str, list] = {name: [] for name in engines}

    def flush(model: str) -> None:
        batch, pending[model] = pending[model], []
        try:
            answers = run_engine_calls(engines[model], [call for call, _ in batch])
        except Exception as err:  # an engine bug: every call of the batch fails with it, none waits forever
            answers = [err] * len(batch)
        for (_, future), answer in zip(batch, answers, strict=True):
            if isinstance(answer, Exception):
                future.set_exception(EngineError(f"{model}: {answer}"))
            else:
                future.set_result(answer)

    async def call(
        model: str, inputs: dict[str, np.ndarray], outputs: list[str], request_id: str
    ) -> dict[str, np.ndarray]:
        try:
            parsed = parse_engine_call({name: np.asarray(arr) for name, arr in inputs.items()}, request_id)
        except InvalidInput as err:
            raise EngineError(f"{model}: {err}") from None
        if parsed is None:
            engines[model].release(request_id)
            return empty_engine_outputs()
        future = asyncio.get_running_loop().create_future()
        if not pending[model]:
            asyncio.get_running_loop().call_soon(flush, model)
        pending[model].append((parsed, future))
        out = await future
        return {name: out[name] for name in outputs}

    return lambda *args: lambda: call(*args)  # nothing to build ahead in-process
