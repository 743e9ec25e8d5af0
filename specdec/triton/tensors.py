"""Reading and validating the tensors of Triton requests: pure functions over numpy arrays.

The model.py adapters turn a pb_utils request into {name: array} with `request_inputs`, call the
parser for their model, and answer an InvalidInput with Triton's INVALID_ARG. Every message
starts with the name of the field the client sent.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np

from specdec.build import upstream
from specdec.config import PROPOSERS, Profile
from specdec.contract import (
    CACHE_SALT_INPUT,
    GUESS_INPUT,
    GUESS_OUTPUT,
    MAX_CACHE_SALT_BYTES,
    ROW_ERRORS_OUTPUT,
    SEQUENCE_KEY_INPUT,
    stop_words_from_list,
)
from specdec.engine.engine import Engine, GenerationRequest, GenerationResult
from specdec.engine.sampling import SamplingError, SamplingParams
from specdec.speculation.loop import AcceptanceStats, RequestSpec


class InvalidInput(ValueError):
    """A request the server refuses; the message names the field."""


def request_arrays(request) -> dict[str, np.ndarray]:
    """{name: array} of a pb_utils request, with the batch dimension."""
    return {tensor.name(): tensor.as_numpy() for tensor in request.inputs()}


def request_inputs(request) -> dict[str, np.ndarray]:
    """{name: array} of a pb_utils request, the batch dimension removed (one item per request)."""
    out = {}
    for name, arr in request_arrays(request).items():
        if arr.ndim == 0 or arr.shape[0] != 1:
            raise InvalidInput(f"{name}: send one item per request (batch size 1), got shape {list(arr.shape)}")
        out[name] = arr[0]
    return out


def input_scalar(inputs: dict, name: str, default=None):
    """A scalar input ([1] or []), or default when absent."""
    if name not in inputs:
        return default
    arr = np.asarray(inputs[name])
    if arr.size != 1:
        raise InvalidInput(f"{name}: expected one value, got shape {list(arr.shape)}")
    return arr.reshape(())[()]


def _int(inputs: dict, name: str, default: int | None = None) -> int | None:
    value = input_scalar(inputs, name)
    return default if value is None else int(value)


def _float(inputs: dict, name: str, default: float) -> float:
    value = input_scalar(inputs, name)
    if value is None:
        return default
    value = float(value)
    if not math.isfinite(value):
        raise InvalidInput(f"{name}: must be a finite number, got {value}")
    return value


def _end_id(inputs: dict) -> int | None:
    """The end token; -1 is none (preprocessing's where the tokenizer has no end token,
    spec_decode's where a call has none: all its calls carry the input)."""
    end_id = _int(inputs, "end_id")
    return None if end_id is None or end_id < 0 else end_id


def _text(value, name: str) -> str:
    if isinstance(value, bytes | np.bytes_):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError as err:
            raise InvalidInput(f"{name}: not valid UTF-8 ({err.reason} at byte {err.start})") from None
    if isinstance(value, str):
        return value
    raise InvalidInput(f"{name}: expected text (BYTES), got {type(value).__name__}")


def _cache_salt(inputs: dict) -> str:
    """The request's cache salt ("" when absent)."""
    salt = _text(input_scalar(inputs, CACHE_SALT_INPUT, ""), CACHE_SALT_INPUT)
    if len(salt.encode()) > MAX_CACHE_SALT_BYTES:
        raise InvalidInput(f"{CACHE_SALT_INPUT}: at most {MAX_CACHE_SALT_BYTES} bytes, got {len(salt.encode())}")
    return salt


def _sampling(inputs: dict, names: dict[str, str]) -> SamplingParams:
    """names maps SamplingParams fields to this model's input names."""
    params = SamplingParams(
        temperature=_float(inputs, names["temperature"], 0.0),
        top_k=_int(inputs, names["top_k"], 0),
        top_p=_float(inputs, names["top_p"], 1.0),
        seed=_int(inputs, names["seed"], 0),
    )
    try:
        params.validate()
    except SamplingError as err:
        raise InvalidInput(f"{names[err.field]}: {err.reason}") from None
    return params


_ENSEMBLE_SAMPLING = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "seed": "seed"}
_ENGINE_SAMPLING = {"temperature": "temperature", "top_k": "runtime_top_k", "top_p": "runtime_top_p", "seed": "seed"}


# --- preprocessing -----------------------------------------------------------------------------
ROLES = ("system", "user", "assistant")


@dataclass
class PreprocessRequest:
    text: str  # the prompt, or "" where the request sent a conversation
    max_tokens: int
    stop_words: list[str]
    end_id: int | None
    apply_chat_template: bool
    messages: list[dict[str, str]] | None = None  # a conversation for the chat template, else None

    @property
    def prompt_field(self) -> str:
        """The input the prompt came in, for refusals that name it."""
        return "text_input" if self.messages is None else "messages"


def parse_messages(value, profile: Profile) -> list[dict[str, str]]:
    """A conversation ([{"role": "system" | "user" | "assistant", "content": str}, ...]) from
    JSON text, checked; the whole no larger than the prompt's limit."""
    text = _text(value, "messages")
    if len(text.encode()) > profile.server.max_prompt_bytes:
        raise InvalidInput(f"messages: the conversation is larger than {profile.server.max_prompt_bytes} bytes")
    try:
        messages = json.loads(text)
    except ValueError as err:
        raise InvalidInput(f"messages: not JSON ({err})") from None
    if not isinstance(messages, list) or not messages:
        raise InvalidInput("messages: a non-empty JSON list of {role, content} objects is required")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or set(message) != {"role", "content"}:
            raise InvalidInput(f"messages: message {i} must be an object with exactly role and content")
        if message["role"] not in ROLES:
            roles = ", ".join(ROLES)
            raise InvalidInput(f"messages: message {i}'s role must be one of {roles}, got {message['role']!r}")
        if not isinstance(message["content"], str):
            raise InvalidInput(f"messages: message {i}'s content must be text")
    if not any(m["content"].strip() for m in messages):
        raise InvalidInput("messages: every message is empty")
    return messages


def parse_preprocess(inputs: dict, profile: Profile) -> PreprocessRequest:
    if ("text_input" in inputs) == ("messages" in inputs):
        raise InvalidInput("text_input: required (or messages, a conversation), not both")
    if not bool(input_scalar(inputs, "exclude_input_in_output", True)):
        raise InvalidInput("exclude_input_in_output: only true is served (text_output is the generated text)")
    messages, text = None, ""
    if "messages" in inputs:
        messages = parse_messages(input_scalar(inputs, "messages"), profile)
    else:
        text = _text(input_scalar(inputs, "text_input"), "text_input")
        if not text.strip():
            raise InvalidInput("text_input: the prompt is empty")
        if len(text.encode()) > profile.server.max_prompt_bytes:
            raise InvalidInput(f"text_input: the prompt is larger than {profile.server.max_prompt_bytes} bytes")
    max_tokens = _int(inputs, "max_tokens")
    if max_tokens is None:
        raise InvalidInput("max_tokens: required")
    _check_max_tokens(max_tokens, profile)
    stop_words = []
    if "stop_words" in inputs:
        words = np.asarray(inputs["stop_words"]).reshape(-1)
        limits = profile.server
        if len(words) > limits.max_stop_words:
            raise InvalidInput(f"stop_words: at most {limits.max_stop_words} stop words, got {len(words)}")
        for word in words:
            word = _text(word, "stop_words")
            if not word:
                raise InvalidInput("stop_words: a stop word is empty")
            if len(word.encode()) > limits.max_stop_word_bytes:
                raise InvalidInput(f"stop_words: a stop word is longer than {limits.max_stop_word_bytes} bytes")
            stop_words.append(word)
    apply = input_scalar(inputs, "apply_chat_template")
    return PreprocessRequest(
        text=text,
        max_tokens=max_tokens,
        stop_words=stop_words,
        end_id=_int(inputs, "end_id"),
        apply_chat_template=profile.chat_template if apply is None else bool(apply),
        messages=messages,
    )


def _check_max_tokens(max_tokens: int, profile: Profile) -> None:
    limit = min(profile.server.max_tokens_limit, profile.engine.max_seq_len - 1)
    if not 1 <= max_tokens <= limit:
        raise InvalidInput(f"max_tokens: must be between 1 and {limit}, got {max_tokens}")


def check_context(prompt_tokens: int, max_tokens: int, max_seq_len: int, prompt_field: str = "text_input") -> None:
    """The prompt (`prompt_field`: the input it came in) and max_tokens fit the context."""
    if prompt_tokens >= max_seq_len:
        raise InvalidInput(f"{prompt_field}: the prompt is {prompt_tokens} tokens, the context holds {max_seq_len}")
    if prompt_tokens + max_tokens > max_seq_len:
        raise InvalidInput(
            f"max_tokens: {prompt_tokens} prompt tokens + {max_tokens} new exceed the context of {max_seq_len} "
            f"tokens; ask for at most {max_seq_len - prompt_tokens}"
        )


# --- spec_decode -------------------------------------------------------------------------------
@dataclass
class SpecDecodeRequest:
    spec: RequestSpec
    sampling: SamplingParams
    proposer: str
    stream: bool
    seeded: bool
    cache_salt: str = ""  # the engines reuse only prefixes that requests of this salt left


def parse_spec_decode(inputs: dict, profile: Profile, vocab_size: int) -> SpecDecodeRequest:
    ids = np.asarray(inputs.get("input_ids", []))
    if ids.ndim != 1 or ids.size == 0:
        raise InvalidInput("input_ids: a non-empty list of token ids is required")
    if ids.min() < 0 or ids.max() >= vocab_size:
        raise InvalidInput(f"input_ids: token ids must be in [0, {vocab_size})")
    length = _int(inputs, "input_lengths", len(ids))
    if length != len(ids):
        raise InvalidInput(f"input_lengths: {length} does not match the {len(ids)} input_ids")
    max_tokens = _int(inputs, "max_tokens")
    if max_tokens is None:
        raise InvalidInput("max_tokens: required")
    _check_max_tokens(max_tokens, profile)
    check_context(len(ids), max_tokens, profile.engine.max_seq_len)

    proposer = profile.speculation.proposer
    if "draft_method" in inputs:
        proposer = _text(input_scalar(inputs, "draft_method"), "draft_method").strip()
        if proposer not in PROPOSERS:
            raise InvalidInput(f"draft_method: must be one of {', '.join(PROPOSERS)}, got {proposer!r}")
        if proposer == "draft_model" and profile.draft is None:
            raise InvalidInput("draft_method: draft_model is not available, this deployment has no draft model")
    spec_cfg = profile.speculation
    k = _int(inputs, "num_draft_tokens", spec_cfg.num_draft_tokens)
    if not 0 <= k <= spec_cfg.max_draft_tokens:
        raise InvalidInput(f"num_draft_tokens: must be between 0 and {spec_cfg.max_draft_tokens}, got {k}")
    if proposer == "none":
        k = 0

    stop_words: list[list[int]] = []
    if "stop_words_list" in inputs:
        arr = np.asarray(inputs["stop_words_list"])
        if arr.ndim != 2 or arr.shape[0] != 2:
            raise InvalidInput(f"stop_words_list: expected shape [2, N], got {list(arr.shape)}")
        limit = profile.server.max_stop_words * profile.server.max_stop_word_bytes
        if arr.shape[1] > limit:
            raise InvalidInput(f"stop_words_list: more than {limit} stop-word tokens")
        stop_words = stop_words_from_list(arr)
    end_id = _end_id(inputs)
    if end_id is not None and end_id >= vocab_size:
        raise InvalidInput(f"end_id: must be a token id below {vocab_size} (negative: no end token), got {end_id}")
    params = _sampling(inputs, _ENSEMBLE_SAMPLING)
    _check_sampled(params, profile)
    min_tokens = _int(inputs, "min_tokens", 0)
    if not 0 <= min_tokens <= max_tokens:
        raise InvalidInput(f"min_length: must be between 0 and max_tokens ({max_tokens}), got {min_tokens}")
    return SpecDecodeRequest(
        spec=RequestSpec(
            prompt_ids=ids.astype(np.int64).tolist(),
            max_tokens=max_tokens,
            num_draft_tokens=k,
            end_id=end_id,
            stop_words=tuple(tuple(w) for w in stop_words if w),
            min_tokens=min_tokens,
        ),
        sampling=params,
        proposer=proposer,
        stream=bool(input_scalar(inputs, "stream", False)),
        seeded="seed" in inputs,
        cache_salt=_cache_salt(inputs),
    )


def _check_sampled(params: SamplingParams, profile: Profile) -> None:
    """Refuse a sampled request that the profile's TensorRT-LLM mode would decode greedily
    (upstream.MODES): its output would not follow the target's distribution."""
    mode = profile.trtllm.mode if profile.trtllm is not None else None
    if mode is None or params.greedy or upstream.MODES[mode].sampling == "exact":
        return
    raise InvalidInput(
        f"temperature: {mode} decodes greedily in TensorRT-LLM {upstream.TRTLLM_VERSION} "
        f"({upstream.MODES[mode].sampling_where}), so a sampled request would not follow the model's "
        "distribution: send temperature 0, or serve a draft_target or ngram profile, which sample exactly"
    )


# --- engine models -----------------------------------------------------------------------------
def _given(inputs: dict, name: str) -> np.ndarray | None:
    """An optional input, None when absent or empty: spec_decode sends an empty draft where there
    is none, so that all its calls carry the same inputs (see service.EngineClient)."""
    value = inputs.get(name)
    return None if value is None or np.size(value) == 0 else np.asarray(value)


def engine_rows(arrays: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """An engine call's inputs ({name: array with the batch dimension}) row by row: a call of
    several rows carries a sequence each (contract.SEQUENCE_KEY_INPUT)."""
    rows = np.shape(arrays.get("input_ids", []))[0]
    if not rows:
        raise InvalidInput("input_ids: a non-empty list of token ids is required")
    for name, arr in arrays.items():
        if np.shape(arr)[:1] != (rows,):
            given = np.shape(arr)[0] if np.ndim(arr) else 0
            raise InvalidInput(f"{name}: {given} rows where input_ids has {rows}: a row per sequence in each input")
    return [{name: arr[row] for name, arr in arrays.items()} for row in range(rows)]


def parse_engine_request(inputs: dict, request_id: str) -> GenerationRequest | None:
    """The engine's GenerationRequest of one row; None for a `stop` request (release request_id)."""
    if bool(input_scalar(inputs, "stop", False)):
        return None
    ids = np.asarray(inputs.get("input_ids", []))
    if ids.ndim != 1 or ids.size == 0:
        raise InvalidInput("input_ids: a non-empty list of token ids is required")
    length = _int(inputs, "input_lengths", len(ids))
    if not 1 <= length <= len(ids):
        raise InvalidInput(f"input_lengths: must be between 1 and {len(ids)}, got {length}")
    draft, draft_logits = _given(inputs, "draft_input_ids"), _given(inputs, "draft_logits")
    if draft is not None:
        ends = np.flatnonzero(draft.reshape(-1) < 0)  # a row's padding
        draft = draft.reshape(-1)[: ends[0] if len(ends) else None]
        if draft_logits is not None:
            draft_logits = draft_logits[: len(draft)]
    return GenerationRequest(
        input_ids=ids[:length].astype(np.int64),
        max_new_tokens=_int(inputs, "request_output_len", 1),
        draft_ids=None if draft is None or not len(draft) else draft.astype(np.int64),
        draft_logits=None if draft_logits is None else draft_logits.astype(np.float32, copy=False),
        sampling=_sampling(inputs, _ENGINE_SAMPLING),
        end_id=_end_id(inputs),
        min_tokens=max(0, _int(inputs, "min_tokens", 0)),
        sequence_key=_text(input_scalar(inputs, SEQUENCE_KEY_INPUT, request_id), SEQUENCE_KEY_INPUT),
        return_logits=bool(input_scalar(inputs, "return_generation_logits", False)),
        return_guess=bool(input_scalar(inputs, GUESS_INPUT, False)),
        cache_salt=_cache_salt(inputs),
    )


@dataclass
class ParsedCall:
    """An engine call's rows: a sequence each."""

    requests: list[GenerationRequest]
    exclude_input: list[bool]  # each row's exclude_input_in_output


def parse_engine_call(arrays: dict[str, np.ndarray], request_id: str) -> ParsedCall | None:
    """The rows of an engine call ({name: array with the batch dimension}); None for a `stop`
    call (release request_id)."""
    rows = engine_rows(arrays)
    requests = [parse_engine_request(row, request_id) for row in rows]
    parsed = [req for req in requests if req is not None]
    if len(parsed) < len(requests):
        if len(rows) > 1:
            raise InvalidInput("stop: a stop call releases one sequence, send it alone")
        return None
    return ParsedCall(parsed, [bool(input_scalar(row, "exclude_input_in_output", False)) for row in rows])


def answer_engine_call(call: ParsedCall, results: list[GenerationResult | Exception]) -> dict[str, np.ndarray]:
    """The outputs of a call from its rows' results: one row's engine_outputs (its error raised),
    or several rows' stacked, each with its error message."""
    rows = [
        result if isinstance(result, Exception) else engine_outputs(result, req, exclude)
        for req, exclude, result in zip(call.requests, call.exclude_input, results, strict=True)
    ]
    if len(rows) > 1:
        return stack_engine_outputs(rows)
    if isinstance(rows[0], Exception):
        raise rows[0]
    return rows[0]


def run_engine_calls(engine: Engine, calls: list[ParsedCall]) -> list[dict[str, np.ndarray] | Exception]:
    """Every row of every call in one Engine.generate (a forward pass over them all at each
    step), then each call's outputs (answer_engine_call), or the exception that fails that call."""
    results = engine.generate([req for call in calls for req in call.requests]) if calls else []
    answers: list[dict[str, np.ndarray] | Exception] = []
    start = 0
    for call in calls:
        rows, start = results[start : start + len(call.requests)], start + len(call.requests)
        try:
            answers.append(answer_engine_call(call, rows))
        except Exception as err:  # fails this call only
            answers.append(err)
    return answers


def stack_rows(rows: list[np.ndarray], fill: float) -> np.ndarray:
    """Arrays of one row each ([1, ...]) as one of len(rows) rows, each padded with `fill` to the
    longest along every other axis."""
    shape = np.max([np.shape(r) for r in rows], axis=0)
    out = np.full((len(rows), *shape[1:]), fill, dtype=np.asarray(rows[0]).dtype)
    for i, r in enumerate(rows):
        out[(i, *(slice(0, n) for n in np.shape(r)[1:]))] = r[0]
    return out


def stack_engine_outputs(rows: list[dict[str, np.ndarray] | Exception]) -> dict[str, np.ndarray]:
    """The answer to a call of several rows: each row's engine_outputs stacked (token ids padded
    with -1, logits with 0) and each row's error message, "" where it has none."""
    answered = [r for r in rows if not isinstance(r, Exception)]
    names = {name: arr for r in answered for name, arr in r.items()}  # a row's array of each name
    out = {
        name: stack_rows(
            [np.zeros((1,) + (0,) * (np.ndim(like) - 1), like.dtype)
             if isinstance(r, Exception) or name not in r else r[name] for r in rows],
            0 if like.dtype.kind == "f" else -1,
        )
        for name, like in names.items()
    }  # fmt: skip
    out[ROW_ERRORS_OUTPUT] = np.array([[str(r).encode() if isinstance(r, Exception) else b""] for r in rows], object)
    return out


def engine_outputs(result: GenerationResult, request: GenerationRequest, exclude_input: bool) -> dict[str, np.ndarray]:
    """A GenerationResult in the TensorRT-LLM backend's output layout (batch 1, beam 1)."""
    ids = result.tokens if exclude_input else np.concatenate([request.input_ids, result.tokens])
    out = {
        "output_ids": ids.astype(np.int32)[None, None],
        "sequence_length": np.array([[len(ids)]], dtype=np.int32),
        "total_draft_tokens": np.array([[result.num_draft]], dtype=np.int32),
        "total_accepted_draft_tokens": np.array([[result.num_accepted]], dtype=np.int32),
        "acceptance_rate": np.array(
            [[result.num_accepted / result.num_draft if result.num_draft else 0.0]], np.float32
        ),
        GUESS_OUTPUT: np.array([result.next_guesses or [-1]], dtype=np.int32),
    }
    if result.logits is not None:
        out["generation_logits"] = result.logits.astype(np.float32)[None, None]
    return out


def empty_engine_outputs() -> dict[str, np.ndarray]:
    """The answer to a `stop` request."""
    return {
        "output_ids": np.zeros((1, 1, 0), dtype=np.int32),
        "sequence_length": np.zeros((1, 1), dtype=np.int32),
    }


DETOKENIZE_CONTEXT = 8  # already-sent tokens repeated so a split UTF-8 character can be completed


def spec_decode_outputs(
    sent: list[int], new: list[int], final: bool, stats: AcceptanceStats, sequence_id: int, num_input_tokens: int
) -> dict[str, np.ndarray]:
    """One spec_decode response: a window of recent tokens for postprocessing, the request's
    acceptance so far, and the id postprocessing quotes to relay a cancellation."""
    context = sent[-DETOKENIZE_CONTEXT:]
    return {
        "sequence_id": np.array([[sequence_id]], dtype=np.uint64),
        "output_ids": np.array([context + new], dtype=np.int32),
        "context_length": np.array([[len(context)]], dtype=np.int32),
        "is_final": np.array([[final]], dtype=np.bool_),
        "total_draft_tokens": np.array([[stats.draft_tokens]], dtype=np.int32),
        "total_accepted_draft_tokens": np.array([[stats.accepted_tokens]], dtype=np.int32),
        "total_draft_rounds": np.array([[stats.drafts]], dtype=np.int32),
        "num_output_tokens": np.array([[len(sent) + len(new)]], dtype=np.int32),
        "num_input_tokens": np.array([[num_input_tokens]], dtype=np.int32),
        "acceptance_rate": np.array([[stats.acceptance_rate]], dtype=np.float32),
    }
