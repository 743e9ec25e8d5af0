"""Triton adapter: the engine tensor contract <-> specdec.triton.llmapi (EAGLE-3, LLM API).

Decoupled, with an async execute: each request is answered (one response, FINAL) when its
generation ends, while the LLM generates every request it holds in flight. It takes calls that
carry the server's key (spec_decode's BLS calls; specdec.triton.internal) and refuses others."""

import asyncio
import json

import triton_python_backend_utils as pb_utils

from specdec.triton.internal import carries_key, key_from_environment, refusal
from specdec.triton.llmapi import LlmApiEngine, check_request
from specdec.triton.tensors import (
    InvalidInput,
    empty_engine_outputs,
    engine_outputs,
    parse_engine_request,
    request_inputs,
)

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _response(arrays, requested):
    return pb_utils.InferenceResponse([pb_utils.Tensor(n, a) for n, a in arrays.items() if n in requested])


def _error(message, code):
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config["parameters"].items()}
        self.name, self.key = config["name"], key_from_environment()
        self.engine = LlmApiEngine.create(json.loads(params["llm_options"]), warn=pb_utils.Logger.log_warn)

    async def execute(self, requests):
        await asyncio.gather(*(self._serve(request) for request in requests))

    async def _serve(self, request):
        sender = request.get_response_sender()
        requested = set(request.requested_output_names())
        if not carries_key(request.parameters(), self.key):
            sender.send(_error(refusal(self.name), pb_utils.TritonError.INVALID_ARG), flags=FINAL)
            return
        try:
            parsed = parse_engine_request(request_inputs(request), request.request_id())
            if parsed is None:  # stop: every call is a finished request, nothing to release
                sender.send(_response(empty_engine_outputs(), requested), flags=FINAL)
                return
            result = await self.engine.generate(check_request(parsed))
            sender.send(_response(engine_outputs(result, parsed, exclude_input=True), requested), flags=FINAL)
        except InvalidInput as err:
            sender.send(_error(str(err), pb_utils.TritonError.INVALID_ARG), flags=FINAL)
        except Exception as err:  # the engine failed this request: say so, the others go on
            sender.send(_error(f"{type(err).__name__}: {err}", pb_utils.TritonError.INTERNAL), flags=FINAL)

    def finalize(self):
        self.engine.close()
