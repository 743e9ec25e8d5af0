"""Triton adapter: a window of token ids -> the text they add (specdec.tokenizer.text_delta).

It also relays cancellations: in Triton 2.51 a client cancelling an ensemble request is seen by
the requests the ensemble creates afterwards (this model's), not by the spec_decode request
already running; so the first cancelled postprocessing request tells spec_decode to stop that
sequence, which then frees its KV cache within one round. It takes a request only with
spec_decode's tag over its sequence id, so that no one else can have a sequence's cancellation
relayed, and relays with the server's key (specdec.triton.internal)."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

from specdec.tokenizer import TextTokenizer, text_delta
from specdec.triton.internal import KEY_PARAMETER, TAG, key_from_environment, refusal, sequence_tag, tag_matches


def _input(request, name):
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy()


class TritonPythonModel:
    def initialize(self, args):
        params = {k: v["string_value"] for k, v in json.loads(args["model_config"])["parameters"].items()}
        self.tokenizer = TextTokenizer(params["tokenizer_dir"])
        self.key = key_from_environment()
        # the family spec_decode counts its refusals in (Triton merges families of one name); a
        # MetricFamily must outlive its metrics: both kept
        self.refusal_family = pb_utils.MetricFamily(
            name="specdec_requests_refused_total", description="Requests refused, by reason",
            kind=pb_utils.MetricFamily.COUNTER,
        )  # fmt: skip
        self.refusals = self.refusal_family.Metric(labels={"model": "postprocessing", "reason": "internal"})

    def execute(self, requests):
        responses = []
        for request in requests:
            if not self._tagged(request):
                self.refusals.increment(1)
                error = pb_utils.TritonError(refusal("postprocessing"), pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
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

    def _tagged(self, request):
        """Whether the request carries spec_decode's tag over its sequence id."""
        given = pb_utils.get_input_tensor_by_name(request, TAG)
        sequence_id = pb_utils.get_input_tensor_by_name(request, "sequence_id")
        if given is None or sequence_id is None or sequence_id.as_numpy().size != 1:
            return False
        expected = sequence_tag(self.key, int(sequence_id.as_numpy().reshape(-1)[0]))
        return tag_matches(expected, given.as_numpy())

    def _relay_cancel(self, sequence_id):
        relay = pb_utils.InferenceRequest(
            model_name="spec_decode",
            inputs=[pb_utils.Tensor("cancel_sequence_id", sequence_id.astype(np.uint64).reshape(1, 1))],
            requested_output_names=[],
            parameters={KEY_PARAMETER: self.key.decode()},
        )
        for _ in relay.exec(decoupled=True):  # spec_decode answers with the final flag only
            pass
