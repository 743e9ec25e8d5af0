"""Triton adapter: the TensorRT-LLM backend's tensors <-> specdec.engine.Engine."""

import json
import os
import queue
import threading
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from specdec.controller import ForwardCost
from specdec.engine.engine import Engine
from specdec.triton_io import (
    InvalidInput,
    empty_engine_outputs,
    engine_outputs,
    parse_engine_request,
    request_inputs,
)

COST_WRITE_S = 5.0  # how often the observed forward times are published to spec_decode
GATHER_S = 0.0005  # a call arriving within this of the previous one joins its forward


def _error(message, code=None):
    code = pb_utils.TritonError.INVALID_ARG if code is None else code
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))


def _response(arrays):
    return pb_utils.InferenceResponse([pb_utils.Tensor(name, arr) for name, arr in arrays.items()])


def _send(request, response):
    request.get_response_sender().send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


class TritonPythonModel:
    """Decoupled: execute() only queues the requests and returns, and one worker thread runs the
    engine over every request queued when a forward starts. A model that computed inside
    execute() would leave calls arriving during a forward to Triton's dynamic batcher, which at
    times holds them until its 500 ms idle timeout (measured: a third of the wall time at 8
    requests in flight)."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config["parameters"].items()}
        options = json.loads(params["engine_options"])
        # The engine lives in the worker thread from its first kernel on: numba's OpenMP threads
        # belong to the thread that started them, and a kernel called from another thread runs
        # ~1.6x slower (measured).
        self.inbox = queue.SimpleQueue()  # pb_utils requests; None stops the worker
        started, failure = threading.Event(), []
        self.worker = threading.Thread(
            target=self._serve_forever, args=(params, options, started, failure), name="engine", daemon=True
        )
        self.worker.start()
        started.wait()
        if failure:
            raise failure[0]
        labels = {"model": config["name"]}
        # a MetricFamily must outlive its metrics: keep both
        self.families = [
            pb_utils.MetricFamily(name=name, description=doc, kind=pb_utils.MetricFamily.GAUGE)
            for name, doc in (
                ("specdec_kv_slots_in_use", "KV cache slots held by live sequences"),
                ("specdec_kv_slots_total", "KV cache slots"),
            )
        ]
        self.slots_in_use, slots_total = (family.Metric(labels=labels) for family in self.families)
        slots_total.set(options["kv_slots"])
        self.slots_total = slots_total

    def execute(self, requests):
        for request in requests:
            self.inbox.put(request)
        return None

    def finalize(self):
        self.inbox.put(None)
        self.worker.join()

    def _start(self, params, options):
        self.engine = Engine(params["model_dir"], **options)
        self.engine.warmup()
        self.calibration = Path(params["calibration_file"])
        self.calibration.parent.mkdir(parents=True, exist_ok=True)
        table = self.engine.calibrate()
        self.cost = ForwardCost(table["rows"], table["seconds"])
        self._write_cost()

    def _serve_forever(self, params, options, started, failure):
        try:
            self._start(params, options)
        except Exception as err:
            failure.append(err)
            return
        finally:
            started.set()
        while (first := self.inbox.get()) is not None:
            batch = [first]
            # everything that arrived during the last forward goes in this one, and the calls
            # that spec_decode sends together (they arrive a fraction of a millisecond apart)
            while True:
                try:
                    request = self.inbox.get(timeout=GATHER_S)
                except queue.Empty:
                    break
                if request is None:
                    self._run(batch)
                    return
                batch.append(request)
            self._run(batch)

    def _run(self, requests):
        batch = []  # (request, parsed, exclude_input)
        for request in requests:
            try:
                inputs = request_inputs(request)
                parsed = parse_engine_request(inputs, request.request_id())
            except InvalidInput as err:
                _send(request, _error(str(err)))
                continue
            if parsed is None:  # stop: the sequence ended or was cancelled
                self.engine.release(request.request_id())
                _send(request, _response(empty_engine_outputs()))
                continue
            exclude = bool(np.asarray(inputs.get("exclude_input_in_output", False)).reshape(-1)[0])
            batch.append((request, parsed, exclude))
        try:
            results = self.engine.generate([parsed for _, parsed, _ in batch]) if batch else []
        except Exception as err:  # the engine failed: fail this batch, keep serving
            results = [RuntimeError(f"engine failure: {err}")] * len(batch)
        for (request, parsed, exclude), result in zip(batch, results, strict=True):
            if isinstance(result, Exception):
                code = (
                    pb_utils.TritonError.INVALID_ARG
                    if isinstance(result, ValueError)
                    else pb_utils.TritonError.UNAVAILABLE
                )
                _send(request, _error(str(result), code))
            else:
                _send(request, _response(engine_outputs(result, parsed, exclude)))
        self.slots_in_use.set(self.engine.slots.in_use)
        if time.monotonic() - self.cost_written > COST_WRITE_S and self.engine.recent_forwards:
            self._write_cost()

    def _write_cost(self):
        """Fold the forwards run since the last write into the cost table and publish it (an
        atomic rename: spec_decode reads it at any time)."""
        while self.engine.recent_forwards:
            self.cost.observe(*self.engine.recent_forwards.popleft())
        staged = self.calibration.with_suffix(".tmp")
        staged.write_text(self.cost.to_json())
        os.replace(staged, self.calibration)
        self.cost_written = time.monotonic()
