"""Triton adapter: the TensorRT-LLM backend's tensors <-> specdec.engine.Engine. It takes calls
that carry the server's key (spec_decode's BLS calls; specdec.triton.internal) and refuses others."""

import json
import os
import time
from pathlib import Path

import triton_python_backend_utils as pb_utils

from specdec.engine.engine import Engine
from specdec.speculation.controller import ForwardCost
from specdec.triton.internal import carries_key, key_from_environment, refusal
from specdec.triton.tensors import (
    InvalidInput,
    empty_engine_outputs,
    parse_engine_call,
    request_arrays,
    run_engine_calls,
)

COST_WRITE_S = 1.0  # how often the observed forward times are published to spec_decode


def _error(message, code=None):
    code = pb_utils.TritonError.INVALID_ARG if code is None else code
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))


def _response(arrays):
    return pb_utils.InferenceResponse([pb_utils.Tensor(name, arr) for name, arr in arrays.items()])


class TritonPythonModel:
    def initialize(self, args):
        params = {k: v["string_value"] for k, v in json.loads(args["model_config"])["parameters"].items()}
        self.name = json.loads(args["model_config"])["name"]
        self.key = key_from_environment()
        options = json.loads(params["engine_options"])
        self.engine = Engine(params["model_dir"], **options)
        self.engine.warmup()
        self.calibration = Path(params["calibration_file"])
        self.calibration.parent.mkdir(parents=True, exist_ok=True)
        table = self.engine.calibrated(Path(params["calibration_cache"]))
        self.cost = ForwardCost(table["rows"], table["seconds"])
        self._write_cost()
        labels = {"model": self.name}
        # a MetricFamily must outlive its metrics: keep both
        self.families = [
            pb_utils.MetricFamily(name=name, description=doc, kind=kind)
            for name, doc, kind in (
                ("specdec_kv_slots_in_use", "KV cache slots held by live sequences", pb_utils.MetricFamily.GAUGE),
                ("specdec_kv_slots_capacity", "KV cache slots", pb_utils.MetricFamily.GAUGE),
                ("specdec_kv_reused_prefix_tokens_total",
                 "Prompt tokens whose keys/values a new request reused from an ended one's prefix",
                 pb_utils.MetricFamily.COUNTER),
                # spec_decode's family (Triton merges families of one name)
                ("specdec_requests_refused_total", "Requests refused, by reason", pb_utils.MetricFamily.COUNTER),
            )
        ]  # fmt: skip
        in_use, slots_total, reused, refused = self.families
        self.slots_in_use, self.reused_prefix = in_use.Metric(labels=labels), reused.Metric(labels=labels)
        slots_total = slots_total.Metric(labels=labels)
        self.refusals = refused.Metric(labels={**labels, "reason": "internal"})
        slots_total.set(options["kv_slots"])
        self.slots_total = slots_total
        self.slots_reported = None
        self.reused_reported = 0

    def execute(self, requests):
        responses = [None] * len(requests)
        calls, where = [], []
        for i, request in enumerate(requests):
            if not carries_key(request.parameters(), self.key):
                self.refusals.increment(1)
                responses[i] = _error(refusal(self.name))
                continue
            try:
                call = parse_engine_call(request_arrays(request), request.request_id())
            except InvalidInput as err:
                responses[i] = _error(str(err))
                continue
            if call is None:  # stop: the sequence ended or was cancelled
                self.engine.release(request.request_id())
                responses[i] = _response(empty_engine_outputs())
                continue
            calls.append(call)
            where.append(i)
        # one forward pass over every row of every call (a call of several rows: spec_decode's round in step)
        for i, answer in zip(where, run_engine_calls(self.engine, calls), strict=True):
            if isinstance(answer, ValueError):
                responses[i] = _error(str(answer))
            elif isinstance(answer, Exception):
                responses[i] = _error(str(answer), pb_utils.TritonError.UNAVAILABLE)
            else:
                responses[i] = _response(answer)
        self._report_slots()
        if time.monotonic() - self.cost_written > COST_WRITE_S and self.engine.recent_forwards:
            self._write_cost()
        return responses

    def _report_slots(self):
        # a metric update is a blocking round trip to the Triton process: only on a change
        slots = self.engine.slots
        if slots.in_use != self.slots_reported:
            self.slots_reported = slots.in_use
            self.slots_in_use.set(self.slots_reported)
        if slots.shared_tokens != self.reused_reported:
            self.reused_prefix.increment(slots.shared_tokens - self.reused_reported)
            self.reused_reported = slots.shared_tokens

    def _write_cost(self):
        """Fold the forwards run since the last write into the cost table and publish it (an
        atomic rename: spec_decode reads it at any time)."""
        while self.engine.recent_forwards:
            self.cost.observe(*self.engine.recent_forwards.popleft())
        staged = self.calibration.with_suffix(".tmp")
        staged.write_text(self.cost.to_json())
        os.replace(staged, self.calibration)
        self.cost_written = time.monotonic()
