"""Triton adapter: text -> token ids (specdec.tokenizer), with the checks that need tokens; the
checked request goes to spec_decode under a tag (specdec.triton.internal)."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils
from jinja2 import TemplateError

from specdec.config import load_profile
from specdec.contract import stop_words_to_list
from specdec.tokenizer import TextTokenizer
from specdec.triton.internal import TAG, checked_tag, key_from_environment
from specdec.triton.tensors import InvalidInput, check_context, parse_preprocess, request_inputs

# this model's outputs under the names spec_decode takes them by (the ensemble's maps)
OUTPUT_NAMES = {"input_ids": "input_ids", "input_lengths": "input_lengths", "max_tokens": "max_tokens_out",
                "end_id": "end_id_out", "stop_words_list": "stop_words_list"}  # fmt: skip


class TritonPythonModel:
    def initialize(self, args):
        params = {k: v["string_value"] for k, v in json.loads(args["model_config"])["parameters"].items()}
        self.profile = load_profile(params["profile"])
        self.tokenizer = TextTokenizer(params["tokenizer_dir"])
        self.key = key_from_environment()
        # the family spec_decode counts its refusals in (Triton merges families of one name); a
        # MetricFamily must outlive its metrics: both kept
        self.refusal_family = pb_utils.MetricFamily(
            name="specdec_requests_refused_total", description="Requests refused, by reason",
            kind=pb_utils.MetricFamily.COUNTER,
        )  # fmt: skip
        self.refusals = self.refusal_family.Metric(labels={"model": "preprocessing", "reason": "invalid_argument"})

    def execute(self, requests):
        return [self._one(r) for r in requests]

    def _one(self, request):
        try:
            req = parse_preprocess(request_inputs(request), self.profile)
            if req.messages is not None:
                ids = self.tokenizer.conversation_ids(req.messages)
            else:
                ids = self.tokenizer.prompt_ids(req.text, req.apply_chat_template)
            check_context(len(ids), req.max_tokens, self.profile.engine.max_seq_len, req.prompt_field)
        except (InvalidInput, ValueError, TemplateError) as err:  # the template's: a conversation it refuses
            message = str(err) if isinstance(err, ValueError) else f"messages: the chat template refuses them: {err}"
            self.refusals.increment(1)
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, pb_utils.TritonError.INVALID_ARG))
        end_id = req.end_id if req.end_id is not None else self.tokenizer.eos_id
        stop_words = stop_words_to_list([self.tokenizer.encode(w) for w in req.stop_words])
        checked = {  # one request's, as spec_decode reads them (no batch dimension)
            "input_ids": np.array(ids, dtype=np.int32),
            "input_lengths": np.array([len(ids)], dtype=np.int32),
            "max_tokens": np.array([req.max_tokens], dtype=np.int32),
            "end_id": np.array([-1 if end_id is None else end_id], dtype=np.int32),
            "stop_words_list": stop_words,
        }
        tensors = [pb_utils.Tensor(OUTPUT_NAMES[name], arr[None]) for name, arr in checked.items()]
        return pb_utils.InferenceResponse([*tensors, pb_utils.Tensor(TAG, checked_tag(self.key, checked)[None])])
