"""Triton adapter: a window of token ids -> the text they add (specdec.tokenizer.text_delta)."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

from specdec.tokenizer import TextTokenizer, text_delta


class TritonPythonModel:
    def initialize(self, args):
        params = {k: v["string_value"] for k, v in json.loads(args["model_config"])["parameters"].items()}
        self.tokenizer = TextTokenizer(params["tokenizer_dir"])

    def execute(self, requests):
        responses = []
        for request in requests:
            ids = pb_utils.get_input_tensor_by_name(request, "output_ids").as_numpy()[0].tolist()
            context = int(pb_utils.get_input_tensor_by_name(request, "context_length").as_numpy().reshape(-1)[0])
            final = bool(pb_utils.get_input_tensor_by_name(request, "is_final").as_numpy().reshape(-1)[0])
            text = text_delta(self.tokenizer.decode, ids, context, final)
            out = np.array([[text.encode("utf-8")]], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("text_output", out)]))
        return responses
