"""Triton adapter: a window of token ids -> the text they add (specdec.tokenizer.text_delta).

It also relays cancellations: in Triton 2.51 a client cancelling an ensemble request is seen by
the requests the ensemble creates afterwards (this model's), not by the spec_decode request
already running; so the first cancelled postprocessing request tells spec_decode to stop that
sequence, which then frees its KV cache within one round."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

from specdec.tokenizer import TextTokenizer, text_delta


def _input(request, name):
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy()


class TritonPythonModel:
    def initialize(self, args):
        params = {k: v["string_value"] for k, v in json.loads(args["model_config"])["parameters"].items()}
        self.tokenizer = TextTokenizer(params["tokenizer_dir"])

    def execute(self, requests):
        responses = []
        for request in requests:
            if request.is_cancelled():
                self._relay_cancel(_input(request, "sequence_id"))
                # an empty answer, not an error: after an error here Triton 2.51 cannot unload
                # the ensemble at shutdown (it waits out the exit timeout)
                text = ""
            else:
                ids = _input(request, "output_ids")[0].tolist()
                context = int(_input(request, "context_length").reshape(-1)[0])
                final = bool(_input(request, "is_final").reshape(-1)[0])
                text = text_delta(self.tokenizer.decode, ids, context, final)
            out = np.array([[text.encode("utf-8")]], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("text_output", out)]))
        return responses

    def _relay_cancel(self, sequence_id):
        relay = pb_utils.InferenceRequest(
            model_name="spec_decode",
            inputs=[pb_utils.Tensor("cancel_sequence_id", sequence_id.astype(np.uint64).reshape(1, 1))],
            requested_output_names=[],
        )
        for _ in relay.exec(decoupled=True):  # spec_decode answers with the final flag only
            pass
