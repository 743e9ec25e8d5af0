"""Triton adapter: the engine tensor contract <-> specdec.llmapi_engine (EAGLE-3, LLM API)."""

import json

import triton_python_backend_utils as pb_utils

from specdec.llmapi_engine import LlmApiEngine, check_request
from specdec.triton_io import InvalidInput, empty_engine_outputs, engine_outputs, parse_engine_request, request_inputs


def _response(arrays):
    return pb_utils.InferenceResponse([pb_utils.Tensor(name, arr) for name, arr in arrays.items()])


class TritonPythonModel:
    def initialize(self, args):
        params = {k: v["string_value"] for k, v in json.loads(args["model_config"])["parameters"].items()}
        self.engine = LlmApiEngine.create(json.loads(params["llm_options"]))

    def execute(self, requests):
        responses = [None] * len(requests)
        batch, where = [], []
        for i, request in enumerate(requests):
            try:
                parsed = parse_engine_request(request_inputs(request), request.request_id())
                if parsed is not None:
                    check_request(parsed)
            except InvalidInput as err:
                responses[i] = pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(str(err), pb_utils.TritonError.INVALID_ARG)
                )
                continue
            if parsed is None:  # stop: every call is a finished request, nothing to release
                responses[i] = _response(empty_engine_outputs())
                continue
            batch.append(parsed)
            where.append(i)
        results = self.engine.generate(batch) if batch else []
        for i, req, result in zip(where, batch, results, strict=True):
            responses[i] = _response(engine_outputs(result, req, exclude_input=True))
        return responses
