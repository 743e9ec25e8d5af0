"""Triton adapter for specdec.triton.service: BLS calls to the engines, streamed responses, metrics."""

import asyncio
import collections
import json
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import triton_python_backend_utils as pb_utils

from specdec.config import load_profile
from specdec.engine.model import LlamaConfig
from specdec.speculation.admission import Overloaded
from specdec.speculation.loop import AcceptanceStats
from specdec.triton.internal import (
    KEY_PARAMETER,
    TAG,
    carries_key,
    checked_request_tagged,
    key_from_environment,
    refusal,
    sequence_tag,
)
from specdec.triton.passthrough import PassthroughService, decoupled_engines, drafts_in_engine
from specdec.triton.service import EngineError, SpecDecodeService
from specdec.triton.tensors import InvalidInput, parse_spec_decode, request_inputs, spec_decode_outputs

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def prepare_call(model, inputs, outputs, request_id, decoupled=False, parameters=None):
    """A BLS call to an engine model, built; the send() it returns hands it to a thread
    (async_exec()) and gives the awaitable of its outputs. A decoupled engine (the LLM API's)
    answers with one response that carries outputs and a final flag, maybe in a last one.
    parameters: the call's request parameters (the key that internal models take calls with)."""
    request = pb_utils.InferenceRequest(
        model_name=model,
        inputs=[pb_utils.Tensor(name, arr) for name, arr in inputs.items()],
        requested_output_names=outputs,
        request_id=request_id,
        parameters=parameters,
    )

    def outputs_of_response(response):
        if response.has_error():
            raise EngineError(f"{model}: {response.error().message()}")
        return {name: pb_utils.get_output_tensor_by_name(response, name).as_numpy() for name in outputs}

    async def outputs_of(pending_response):
        return outputs_of_response(await pending_response)

    async def outputs_of_stream(pending_responses):
        # the responses after the first are waited for by iterating: in a thread, not on the loop
        responses = await asyncio.get_running_loop().run_in_executor(None, list, await pending_responses)
        answered = [outputs_of_response(r) for r in responses if r.has_error() or r.output_tensors()]
        if not answered:
            raise EngineError(f"{model}: no response")
        return answered[0]

    if decoupled:
        return lambda: outputs_of_stream(request.async_exec(decoupled=True))
    return lambda: outputs_of(request.async_exec())


# Histogram buckets, seconds: from a short answer on a GPU to a long one on two CPU cores.
BUCKETS = {
    "ttft": [0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0],
    "tpot": [0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28],
    "duration": [0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0],
    "queue": [0.001, 0.005, 0.025, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0],
}


class TritonMetrics:
    """Prometheus metrics on Triton's metrics port (specdec.triton.service.Metrics), labelled by
    model and proposer, in Prometheus's conventions: counters end in _total, durations are
    histograms in seconds, the draft length chosen is a counter of rounds by length (so that it
    sums across replicas).

    Each metric update is a round trip to the Triton process that blocks this model's event loop
    (and every request on it), and a round of 8 drafts makes about 20: so updates collect here and
    go out when the load changes (a request queued, started, ended), at a refusal, and at most
    every FLUSH_S while requests run."""

    FLUSH_S = 1.0

    def __init__(self, model):
        counter, gauge, histogram = (pb_utils.MetricFamily.COUNTER, pb_utils.MetricFamily.GAUGE,
                                     pb_utils.MetricFamily.HISTOGRAM)  # fmt: skip
        self.model = model
        self.families = {
            kind: pb_utils.MetricFamily(name=name, description=doc, kind=k)
            for kind, name, doc, k in (
                ("drafts", "specdec_drafts_total", "Verification rounds that carried draft tokens", counter),
                ("draft_tokens", "specdec_draft_tokens_total", "Draft tokens proposed", counter),
                ("accepted", "specdec_accepted_tokens_total", "Draft tokens accepted by the target", counter),
                ("position", "specdec_accepted_tokens_per_position_total", "Accepted draft tokens by draft position",
                 counter),
                ("drafted_position", "specdec_draft_tokens_per_position_total", "Draft tokens by draft position",
                 counter),
                ("rounds", "specdec_verification_rounds_total", "Verification rounds by the draft length chosen",
                 counter),
                ("requests", "specdec_requests_total", "Finished requests by proposer and finish reason", counter),
                ("refused", "specdec_requests_refused_total", "Requests refused, by reason", counter),
                ("tokens", "specdec_output_tokens_total", "Tokens generated", counter),
                ("fallbacks", "specdec_proposer_fallbacks_total", "Requests whose proposer failed midway", counter),
                ("running", "specdec_requests_running", "Requests running in spec_decode", gauge),
                ("queued", "specdec_requests_queued", "Requests waiting to run in spec_decode", gauge),
                ("ttft", "specdec_time_to_first_token_seconds", "From arrival to the first generated tokens",
                 histogram),
                ("tpot", "specdec_time_per_output_token_seconds",
                 "(request duration - time to first token) / (output tokens - 1)", histogram),
                ("duration", "specdec_request_duration_seconds", "From arrival to the last token", histogram),
                ("queue", "specdec_queue_duration_seconds", "From arrival to admission", histogram),
            )
        }  # fmt: skip
        self.cache = {}
        self.increments = collections.Counter()  # metric key -> amount not yet sent
        self.gauges = {}  # metric key -> latest value not yet sent
        self.observations = []  # (metric key, value) not yet sent
        self.rounds = {}  # proposer -> its rounds not yet sent (specdec.speculation.loop.AcceptanceStats)
        self.lengths = collections.Counter()  # (proposer, draft length) -> rounds not yet sent
        self.flushed = time.monotonic()

    def _key(self, kind, **labels):
        key = (kind, *sorted(labels.items()))
        if key not in self.cache:
            labels = {"model": self.model, **labels}
            buckets = BUCKETS.get(kind)
            self.cache[key] = (self.families[kind].Metric(labels=labels, buckets=buckets) if buckets
                               else self.families[kind].Metric(labels=labels))  # fmt: skip
        return key

    def _add(self, kind, amount, **labels):
        self.increments[self._key(kind, **labels)] += amount

    def _observe(self, kind, value, **labels):
        self.observations.append((self._key(kind, **labels), value))

    def flush(self):
        for proposer, stats in self.rounds.items():
            self._add("drafts", stats.drafts, proposer=proposer)
            self._add("draft_tokens", stats.draft_tokens, proposer=proposer)
            self._add("accepted", stats.accepted_tokens, proposer=proposer)
            for kind, by_position in (("drafted_position", stats.drafted_at), ("position", stats.accepted_at)):
                for i, n in enumerate(by_position):
                    if n:  # a position never accepted gets no counter yet
                        self._add(kind, n, proposer=proposer, position=str(i + 1))
        self.rounds.clear()
        for (proposer, length), n in self.lengths.items():
            self._add("rounds", n, proposer=proposer, draft_tokens=str(length))
        self.lengths.clear()
        for key, amount in self.increments.items():
            self.cache[key].increment(amount)
        for key, value in self.gauges.items():
            self.cache[key].set(value)
        for key, value in self.observations:
            self.cache[key].observe(value)
        self.increments.clear()
        self.gauges.clear()
        self.observations.clear()
        self.flushed = time.monotonic()

    def round(self, proposer, num_draft, num_accepted):
        # counted here, labelled at flush(): a metric key per draft position, built every round,
        # would be on the hot path
        self.lengths[proposer, num_draft] += 1
        if num_draft:
            self.rounds.setdefault(proposer, AcceptanceStats()).record(num_draft, num_accepted)
        if time.monotonic() - self.flushed > self.FLUSH_S:
            self.flush()

    def load(self, running, queued):
        self.gauges[self._key("running")] = running
        self.gauges[self._key("queued")] = queued
        self.flush()

    def refused(self, reason):
        self._add("refused", 1, reason=reason)
        self.flush()

    def fallback(self, proposer):
        self._add("fallbacks", 1, proposer=proposer)

    def finished(self, proposer, reason, num_tokens, timing):
        self._add("requests", 1, proposer=proposer, reason=reason)
        self._add("tokens", num_tokens, proposer=proposer)
        self._observe("queue", timing.queued_s, proposer=proposer)
        if num_tokens:
            self._observe("ttft", timing.first_token_s, proposer=proposer)
            self._observe("duration", timing.total_s, proposer=proposer)
        if num_tokens > 1:
            self._observe("tpot", (timing.total_s - timing.first_token_s) / (num_tokens - 1), proposer=proposer)


class Responses:
    """One request's responses, made and sent in order by a thread that serves every request
    (`sends`), which after each round also asks whether the client cancelled. Sending and
    asking are round trips to the Triton process that hold their thread (with the GIL released)
    until Triton answers: done on the event loop they would hold up every other request's round
    (at many users, a large share of this model's busy time) while the engine waits for the
    round's calls. Made there too, a response's tensors are built while the loop waits."""

    def __init__(self, request, sends):
        self.request, self.sends = request, sends
        self.sender = request.get_response_sender()
        self.requested = set(request.requested_output_names())
        self.cancelled = False  # by the client (polled) or by a relay from postprocessing

    def round(self, outputs=None, final=False):
        """After a round: the arrays to stream (None: nothing), final with the last."""
        make_response = None if outputs is None else partial(_response, outputs, self.requested)
        self.sends.submit(self._send, make_response, final)

    def error(self, message, code):
        self.sends.submit(self._send, partial(_error, message, code), True)

    def _send(self, make_response, final):
        try:
            if make_response is not None or final:
                response = make_response() if make_response is not None else None
                self.sender.send(response, flags=FINAL if final else 0)
            if not final and not self.cancelled:
                self.cancelled = self.request.is_cancelled()
        except Exception as err:  # the client went away; the next round's poll or end stops it
            pb_utils.Logger.log_warn(f"spec_decode: a response could not be sent: {err}")


def _error(message, code):
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))


def _response(arrays, requested):
    """A response with only the outputs the caller asked for. Triton 2.51's response sender drops
    the others itself, with the GIL released (python_backend #390 fixed that later): freeing their
    arrays without the GIL corrupted this stub's heap under load, and the stub died mid-request."""
    return pb_utils.InferenceResponse([pb_utils.Tensor(name, arr) for name, arr in arrays.items() if name in requested])


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config["parameters"].items()}
        self.profile = load_profile(params["profile"])
        self.vocab_size = LlamaConfig.from_dir(self.profile.model_dir("target")).vocab_size
        # In-engine speculation (TensorRT-LLM EAGLE-3, Medusa, ...): pass through to the target.
        service = PassthroughService if drafts_in_engine(self.profile) else SpecDecodeService
        decoupled = decoupled_engines(self.profile)
        self.metrics = TritonMetrics(config["name"])
        self.key = key_from_environment()
        keyed = {KEY_PARAMETER: self.key.decode()}  # on every engine call: the engines refuse calls without it
        self.service = service(
            self.profile,
            lambda model, *args: prepare_call(model, *args, decoupled=model in decoupled, parameters=keyed),
            self.metrics,
            target_model=params["target_model"],
            draft_model=params["draft_model"] or None,
            warn=pb_utils.Logger.log_warn,
        )

        self.live = {}  # sequence id -> its Responses, for a relayed cancellation
        # async_exec() holds a thread of the event loop's default executor until the engine's
        # response comes. The default pool has os.cpu_count() + 4 threads (6 on 2 cores), which
        # would cap the calls in flight, and with them the requests one forward can serve.
        # A thread for each sequence that may run (it makes one engine call at a time).
        self.engine_calls = ThreadPoolExecutor(self.profile.server.max_inflight, thread_name_prefix="engine_call")
        self.engine_calls_installed = False
        self.sends = ThreadPoolExecutor(1, thread_name_prefix="responses")  # one: each request's in order

    async def execute(self, requests):
        if not self.engine_calls_installed:  # the stub's event loop exists from here on
            asyncio.get_running_loop().set_default_executor(self.engine_calls)
            self.engine_calls_installed = True
        await asyncio.gather(*(self._serve(r) for r in requests))

    async def _serve(self, request):
        responses = Responses(request, self.sends)
        sequence_id = secrets.randbits(63)
        try:
            inputs = request_inputs(request)
            keyed = carries_key(request.parameters(), self.key)
            if not (keyed or ("cancel_sequence_id" not in inputs and checked_request_tagged(self.key, inputs))):
                # neither a call with the key (postprocessing's relay, a local operator's) nor the
                # ensemble's step with preprocessing's tag over the checked request
                self.metrics.refused("internal")
                responses.error(refusal("spec_decode"), pb_utils.TritonError.INVALID_ARG)
                return
            if "cancel_sequence_id" in inputs:
                # Triton 2.51's ensemble does not pass a client's cancellation on to this model;
                # postprocessing sees it and relays it here (see postprocessing/1/model.py).
                relayed = self.live.get(int(inputs["cancel_sequence_id"].reshape(-1)[0]))
                if relayed is not None:
                    relayed.cancelled = True
                responses.round(final=True)
                return
            req = parse_spec_decode(inputs, self.profile, self.vocab_size)
            tag = sequence_tag(self.key, sequence_id)[None]  # postprocessing takes the sequence id under it
            self.live[sequence_id] = responses
            sent = []  # tokens already sent, for the postprocessing window
            pending = []
            async for chunk in self.service.serve(req, lambda: responses.cancelled):
                if chunk.gen.finish_reason == "cancelled":
                    responses.round(final=True)
                    return
                if chunk.gen.finish_reason == "shutdown":
                    raise Overloaded(
                        f"server shutting down: the request stopped after {len(chunk.gen.generated)} tokens"
                    )
                pending += chunk.tokens
                if req.stream or chunk.final:
                    outputs = spec_decode_outputs(
                        sent, pending, chunk.final, chunk.gen.stats, sequence_id, len(req.spec.prompt_ids)
                    )
                    outputs[TAG] = tag
                    responses.round(outputs, final=chunk.final)
                    sent += pending
                    pending = []
                else:
                    responses.round()
        except InvalidInput as err:
            self.metrics.refused("invalid_argument")
            responses.error(str(err), pb_utils.TritonError.INVALID_ARG)
        except Overloaded as err:
            responses.error(str(err), pb_utils.TritonError.UNAVAILABLE)
        except EngineError as err:
            responses.error(str(err), pb_utils.TritonError.INTERNAL)
        except Exception as err:  # a bug must not leave the client waiting forever
            pb_utils.Logger.log_error(f"spec_decode: {type(err).__name__}: {err}")
            responses.error(f"internal error: {err}", pb_utils.TritonError.INTERNAL)
        finally:
            self.live.pop(sequence_id, None)
