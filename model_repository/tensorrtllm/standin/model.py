"""Not a model of the repository: the CPU stand-in for the tensorrtllm backend
(specdec/triton/standin.py), which specdec.triton.serve installs as <backends>/tensorrtllm/model.py so that
a GPU profile's rendered tensorrt_llm models load in the CPU tritonserver unchanged."""

import json

import triton_python_backend_utils as pb_utils

from specdec.triton.standin import Call, LoadError, Standin, load_config
from specdec.triton.tensors import InvalidInput, request_inputs


def _response(arrays):
    return pb_utils.InferenceResponse([pb_utils.Tensor(name, arr) for name, arr in arrays.items()])


def _error(err):
    code = pb_utils.TritonError.INVALID_ARG if isinstance(err, InvalidInput) else pb_utils.TritonError.INTERNAL
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(err), code))


class TritonPythonModel:
    def initialize(self, args):
        try:
            self.standin = Standin(load_config(json.loads(args["model_config"])))
        except LoadError as err:  # the load fails with the backend's message
            raise pb_utils.TritonModelException(str(err)) from None

    def execute(self, requests):
        calls, answers = [], [None] * len(requests)
        for i, request in enumerate(requests):
            try:
                calls.append((i, Call(request_inputs(request), set(request.requested_output_names()),
                                      request.request_id())))  # fmt: skip
            except InvalidInput as err:
                answers[i] = _error(err)
        for (i, _), answer in zip(calls, self.standin.run([call for _, call in calls]), strict=True):
            answers[i] = _error(answer) if isinstance(answer, Exception) else _response(answer)
        return answers
