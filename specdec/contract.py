"""Tensor names and dtypes shared by the Triton models, the renderer's tests and the client.

ENGINE_* is the TensorRT-LLM backend's contract (tensorrt_llm/config.pbtxt of the pinned
release, see specdec/build/trtllm.py): the PyTorch engine model speaks the same names, so the
spec_decode BLS calls either engine the same way. ENSEMBLE_* is NVIDIA's ensemble interface plus
our speculation controls; SPEC_DECODE_* uses the ensemble's names so errors name what the user sent.
"""

from __future__ import annotations

import numpy as np

# --- engine models ("target", "draft"): a subset of TensorRT-LLM's inputs ------------------------
ENGINE_INPUTS: dict[str, np.dtype] = {
    "input_ids": np.int32,  # [-1] the whole sequence so far
    "input_lengths": np.int32,  # [1]
    "request_output_len": np.int32,  # [1] new tokens wanted (a verification: draft length + 1)
    "draft_input_ids": np.int32,  # [-1] optional draft tokens to verify
    "draft_logits": np.float32,  # [-1, V] optional, the proposer's logits (sampling)
    "end_id": np.int32,
    "pad_id": np.int32,
    "temperature": np.float32,
    "runtime_top_k": np.int32,
    "runtime_top_p": np.float32,
    "seed": np.uint64,
    "min_tokens": np.int32,  # the call's first min_tokens new tokens are not end_id (min_length's rest)
    "return_generation_logits": np.bool_,
    "return_perf_metrics": np.bool_,
    "exclude_input_in_output": np.bool_,
    "streaming": np.bool_,
    "stop": np.bool_,  # with a request id: release that sequence (cancel / end)
}
ENGINE_OUTPUTS: dict[str, np.dtype] = {
    "output_ids": np.int32,  # [beam, -1]
    "sequence_length": np.int32,  # [beam]
    "generation_logits": np.float32,  # [beam, -1, V]
    "total_draft_tokens": np.int32,
    "total_accepted_draft_tokens": np.int32,
    "acceptance_rate": np.float32,
}
# the PyTorch engine's own, beside those, when asked: its guess at the token after the new ones,
# then the other tokens it finds plausible, best first ([-1]: none; specdec/engine/guess.py)
GUESS_INPUT, GUESS_OUTPUT = "return_next_guess", "next_guesses"
# and the request's cache salt: it reuses only prefixes that requests of that salt left
# (specdec/engine/kv_slots.py)
CACHE_SALT_INPUT = "cache_salt"
MAX_CACHE_SALT_BYTES = 256
# A call may carry several sequences, a row each (spec_decode sends the calls of a round in step
# as one, specdec/speculation/lockstep.py): each row names its sequence (a call of one row without it: the
# request id), drafts end at their first -1, and the answer's rows are padded with -1 (output_ids
# up to sequence_length) and carry each row's error message ("": none) instead of failing the call.
SEQUENCE_KEY_INPUT, ROW_ERRORS_OUTPUT = "sequence_key", "row_errors"

# --- the ensemble: what clients, genai-perf and curl talk to ------------------------------------
ENSEMBLE_INPUTS: dict[str, np.dtype] = {
    "text_input": np.object_,  # BYTES
    "messages": np.object_,  # BYTES: a conversation as JSON, [{"role": ..., "content": ...}], instead of text_input
    "max_tokens": np.int32,
    "temperature": np.float32,
    "top_k": np.int32,
    "top_p": np.float32,
    "seed": np.uint64,
    "stream": np.bool_,
    "end_id": np.int32,
    "stop_words": np.object_,  # BYTES [-1]
    "num_draft_tokens": np.int32,  # 0 turns speculation off for this request
    "draft_method": np.object_,  # BYTES: draft_model | ngram | none
    "apply_chat_template": np.bool_,
    "cache_salt": np.object_,  # BYTES: requests share cached prefixes only with the same salt
    "min_length": np.int32,  # the end token is not generated before this many tokens (genai-perf sends it)
    "exclude_input_in_output": np.bool_,  # true only: text_output is the generated text (genai-perf sends it)
}
ENSEMBLE_OUTPUTS: dict[str, np.dtype] = {
    "text_output": np.object_,
    "total_draft_tokens": np.int32,
    "total_accepted_draft_tokens": np.int32,
    "total_draft_rounds": np.int32,  # verification rounds that carried drafts: mean accepted length
    "num_output_tokens": np.int32,  # tokens generated so far
    "num_input_tokens": np.int32,  # the prompt's tokens (after the chat template)
    "acceptance_rate": np.float32,
}

# --- spec_decode (the BLS) ----------------------------------------------------------------------
SPEC_DECODE_INPUTS: dict[str, np.dtype] = {
    "input_ids": np.int32,
    "input_lengths": np.int32,
    "max_tokens": np.int32,
    "end_id": np.int32,
    "stop_words_list": np.int32,  # [2, -1] TensorRT-LLM's format: flat ids, end offsets (-1 pad)
    "temperature": np.float32,
    "top_k": np.int32,
    "top_p": np.float32,
    "seed": np.uint64,
    "stream": np.bool_,
    "num_draft_tokens": np.int32,
    "draft_method": np.object_,
    "cache_salt": np.object_,
    "cancel_sequence_id": np.uint64,  # a control request: cancel that running sequence
    "min_tokens": np.int32,
}
SPEC_DECODE_OUTPUTS: dict[str, np.dtype] = {
    "sequence_id": np.uint64,  # [1] quoted by postprocessing to relay a client's cancellation
    "output_ids": np.int32,  # [-1] a window: context_length already-sent ids, then new ids
    "context_length": np.int32,  # [1]
    "is_final": np.bool_,  # [1]
    "total_draft_tokens": np.int32,
    "total_accepted_draft_tokens": np.int32,
    "total_draft_rounds": np.int32,
    "num_output_tokens": np.int32,
    "num_input_tokens": np.int32,
    "acceptance_rate": np.float32,
}


def stop_words_to_list(words: list[list[int]]) -> np.ndarray:
    """TensorRT-LLM's stop_words_list for one request: [[ids...], [end offsets..., -1 pad]]."""
    flat = [t for w in words for t in w]
    offsets = np.cumsum([len(w) for w in words]).tolist() if words else []
    width = max(1, len(flat))
    out = np.full((2, width), -1, dtype=np.int32)
    out[0, : len(flat)] = flat
    out[1, : len(offsets)] = offsets
    return out


def stop_words_from_list(arr: np.ndarray) -> list[list[int]]:
    arr = np.asarray(arr).reshape(2, -1)
    words, start = [], 0
    for end in arr[1]:
        if end < 0:
            break
        words.append([int(t) for t in arr[0, start:end]])
        start = int(end)
    return words
