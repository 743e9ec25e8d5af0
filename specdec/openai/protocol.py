"""The OpenAI API's requests and responses, as pure functions: a request body checked and turned
into the ensemble's inputs, and the ensemble's answers shaped as OpenAI's objects.

Field names and shapes follow the OpenAI API as its official Python package (the version in
requirements.lock) reads them: chat.completion, chat.completion.chunk, text_completion, model,
and the error body {"error": {"message", "type", "param", "code"}}. tests/server/test_openai.py
drives the server with that package, so it parses every object made here.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass, field

# Fields served, by endpoint; each is read below. The speculation controls, and vLLM's top_k,
# min_tokens and cache_salt, travel as extra body fields (openai's extra_body), which OpenAI
# clients never send by themselves.
EXTRA_FIELDS = ("num_draft_tokens", "draft_method", "top_k", "min_tokens", "cache_salt")
COMMON_FIELDS = ("model", "max_tokens", "temperature", "top_p", "seed", "stop", "stream", "stream_options", "n",
                 "user", *EXTRA_FIELDS)  # fmt: skip
CHAT_FIELDS = (*COMMON_FIELDS, "messages", "max_completion_tokens", "logprobs", "frequency_penalty", "presence_penalty")
COMPLETION_FIELDS = (*COMMON_FIELDS, "prompt", "echo", "logprobs", "frequency_penalty", "presence_penalty")
# OpenAI's fields this server does not serve: named in a 400 rather than ignored
UNSUPPORTED = {
    "tools": "tool calls are not served",
    "tool_choice": "tool calls are not served",
    "functions": "function calls are not served",
    "function_call": "function calls are not served",
    "parallel_tool_calls": "tool calls are not served",
    "top_logprobs": "log probabilities are not served",
    "logit_bias": "logit bias is not served",
    "response_format": "only plain text is served",
    "best_of": "only one completion a request is served",
    "suffix": "suffixes are not served",
    "audio": "audio is not served",
    "modalities": "only text is served",
    "prediction": "predicted outputs are not served",
}
ENSEMBLE_PREFIX = re.compile(r"^(\[StatusCode\.\w+\] )?in ensemble '[^']*', ")
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
MAX_STOP = 4  # as OpenAI's API


class OpenAIError(Exception):
    """A request refused, as OpenAI's API answers it."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 kind: str = "invalid_request_error", code: str | None = None):  # fmt: skip
        super().__init__(message)
        self.message, self.param, self.status, self.kind, self.code = message, param, status, kind, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass
class GenerationRequest:
    """A checked chat or completion request: the ensemble's inputs and what the answer needs."""

    chat: bool
    model: str
    inputs: dict[str, object]  # the ensemble's inputs (specdec.contract.ENSEMBLE_INPUTS names)
    max_tokens: int
    stream: bool
    include_usage: bool  # the stream ends with a chunk of the usage
    continuous_usage: bool  # every chunk carries the usage so far (vLLM's continuous_usage_stats)
    stop: list[str] = field(default_factory=list)
    echo: str = ""  # completions' echo: the prompt, before the answer


def _number(body: dict, name: str, low: float, high: float, integer: bool = False) -> float | int | None:
    value = body.get(name)
    if value is None:
        return None
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not low <= value <= high:
        kind = "an integer" if integer else "a number"
        raise OpenAIError(f"{name} must be {kind} between {low:g} and {high:g}, got {value!r}", name)
    return value


def _known(body: dict, allowed: tuple[str, ...]) -> None:
    if not isinstance(body, dict):
        raise OpenAIError("the request body must be a JSON object")
    for name in body:
        if name in UNSUPPORTED and body[name] not in (None, [], {}, False):
            raise OpenAIError(f"{name}: {UNSUPPORTED[name]}", name)
        if name not in allowed and name not in UNSUPPORTED:
            raise OpenAIError(f"{name}: unknown parameter", name)


def _content(message: dict, i: int) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        if any(p.get("type") != "text" or not isinstance(p.get("text"), str) for p in content):
            raise OpenAIError(f"messages[{i}].content: only text parts are served", f"messages[{i}].content")
        return "".join(p["text"] for p in content)
    raise OpenAIError(f"messages[{i}].content: text or a list of text parts is required", f"messages[{i}].content")


def _messages(body: dict) -> list[dict[str, str]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise OpenAIError("messages: a non-empty list of messages is required", "messages")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise OpenAIError(f"messages[{i}]: a message object is required", f"messages[{i}]")
        role = message.get("role")
        if role not in ROLES:
            raise OpenAIError(f"messages[{i}].role: one of {', '.join(ROLES)} is served, got {role!r}",
                              f"messages[{i}].role")  # fmt: skip
        out.append({"role": ROLES[role], "content": _content(message, i)})
    return out


def _common(body: dict, model: str, max_tokens_limit: int, chat: bool) -> tuple[dict[str, object], int, list[str]]:
    if body.get("model") != model:
        raise OpenAIError(f"model: {body.get('model')!r} is not served here; the model is {model!r}", "model",
                          status=404, code="model_not_found")  # fmt: skip
    if body.get("n", 1) != 1:
        raise OpenAIError("n: one completion a request is served", "n")
    max_name = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    default = max_tokens_limit if chat else min(16, max_tokens_limit)  # OpenAI's: as long as it takes; 16
    max_tokens = _number(body, max_name, 1, max_tokens_limit, integer=True) or default
    inputs: dict[str, object] = {"max_tokens": int(max_tokens)}
    for name, low, high in (("temperature", 0, 2), ("top_p", 0, 1)):
        value = _number(body, name, low, high)
        if value is not None:
            inputs[name] = float(value)
    if "top_p" in inputs and inputs["top_p"] == 0:
        raise OpenAIError("top_p must be greater than 0", "top_p")
    seed = _number(body, "seed", 0, 2**63 - 1, integer=True)
    if seed is not None:
        inputs["seed"] = int(seed)
    for name in ("frequency_penalty", "presence_penalty"):
        if body.get(name) not in (None, 0, 0.0):
            raise OpenAIError(f"{name}: only 0 is served (a penalty would change the model's distribution)", name)
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop or []
    if not isinstance(stops, list) or len(stops) > MAX_STOP or not all(isinstance(s, str) and s for s in stops):
        raise OpenAIError(f"stop: a string or a list of up to {MAX_STOP} non-empty strings", "stop")
    if stops:
        inputs["stop_words"] = stops
    for name, high in (("num_draft_tokens", 64), ("top_k", 2**31 - 1)):
        value = _number(body, name, 0, high, integer=True)
        if value is not None:
            inputs[name] = int(value)
    for name, what in (("draft_method", "a string (draft_model, ngram or none)"), ("cache_salt", "a string")):
        if body.get(name) is not None:
            if not isinstance(body[name], str):
                raise OpenAIError(f"{name}: {what}", name)
            inputs[name] = body[name]
    min_tokens = _number(body, "min_tokens", 0, max_tokens, integer=True)
    if min_tokens:
        inputs["min_length"] = int(min_tokens)
    return inputs, int(max_tokens), stops


STREAM_OPTIONS = ("include_usage", "continuous_usage_stats")  # OpenAI's; vLLM's (and trtllm-serve's)


def _stream(body: dict) -> tuple[bool, bool, bool]:
    """stream, include_usage, continuous_usage_stats."""
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise OpenAIError("stream: true or false", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or set(options) - set(STREAM_OPTIONS):
        raise OpenAIError(f"stream_options: only {' and '.join(STREAM_OPTIONS)} are served", "stream_options")
    if options and not stream:
        raise OpenAIError("stream_options: only with stream true", "stream_options")
    return stream, *(bool(options.get(name, False)) for name in STREAM_OPTIONS)


def parse_chat(body: dict, model: str, max_tokens_limit: int) -> GenerationRequest:
    """A chat.completions request, checked: OpenAIError names the offending field."""
    _known(body, CHAT_FIELDS)
    if body.get("logprobs"):
        raise OpenAIError("logprobs: log probabilities are not served", "logprobs")
    inputs, max_tokens, stops = _common(body, model, max_tokens_limit, chat=True)
    inputs["messages"] = json.dumps(_messages(body))
    return GenerationRequest(True, model, inputs, max_tokens, *_stream(body), stops)


def parse_completion(body: dict, model: str, max_tokens_limit: int) -> GenerationRequest:
    """A completions request, checked: OpenAIError names the offending field."""
    _known(body, COMPLETION_FIELDS)
    if body.get("logprobs") not in (None, 0):
        raise OpenAIError("logprobs: log probabilities are not served", "logprobs")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise OpenAIError("prompt: one non-empty string is served", "prompt")
    inputs, max_tokens, stops = _common(body, model, max_tokens_limit, chat=False)
    inputs |= {"text_input": prompt, "apply_chat_template": False}
    echo = prompt if body.get("echo") else ""
    return GenerationRequest(False, model, inputs, max_tokens, *_stream(body), stops, echo)


# --- answers ------------------------------------------------------------------------------------------
@dataclass
class Totals:
    """What the ensemble reported of a request so far."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    draft_rounds: int = 0  # verification rounds that carried drafts


def finish_reason(totals: Totals, max_tokens: int) -> str:
    return "length" if totals.completion_tokens >= max_tokens else "stop"


def usage(totals: Totals) -> dict:
    """OpenAI's usage object."""
    return {
        "prompt_tokens": totals.prompt_tokens,
        "completion_tokens": totals.completion_tokens,
        "total_tokens": totals.prompt_tokens + totals.completion_tokens,
    }


def speculation(totals: Totals) -> dict:
    """The request's drafts, sent beside usage as a field of its own (OpenAI clients keep unknown
    fields: openai's `response.model_extra["speculation"]`)."""
    rate = totals.accepted_tokens / totals.draft_tokens if totals.draft_tokens else 0.0
    return {"draft_tokens": totals.draft_tokens, "accepted_tokens": totals.accepted_tokens, "acceptance_rate": rate,
            "draft_rounds": totals.draft_rounds}  # fmt: skip


class Answer:
    """One request's OpenAI objects: the whole answer, or its stream's chunks."""

    def __init__(self, req: GenerationRequest):
        self.req = req
        self.id = f"{'chatcmpl' if req.chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def _base(self, kind: str) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.req.model}

    def whole(self, text: str, totals: Totals) -> dict:
        reason = finish_reason(totals, self.req.max_tokens)
        if self.req.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": reason,
                      "logprobs": None}  # fmt: skip
            out = self._base("chat.completion")
        else:
            choice = {"index": 0, "text": self.req.echo + text, "finish_reason": reason, "logprobs": None}
            out = self._base("text_completion")
        return {**out, "choices": [choice], "usage": usage(totals), "speculation": speculation(totals)}

    def chunk(self, text: str, totals: Totals, first: bool = False, reason: str | None = None) -> dict:
        """A chunk of text (a chat's first carries the assistant's role), with the totals so far
        where continuous_usage_stats asked for them."""
        if self.req.chat:
            delta = {"role": "assistant", "content": text} if first else {"content": text}
            choice = {"index": 0, "delta": delta, "finish_reason": reason, "logprobs": None}
            out = self._base("chat.completion.chunk")
        else:
            choice = {"index": 0, "text": (self.req.echo if first else "") + text, "finish_reason": reason,
                      "logprobs": None}  # fmt: skip
            out = self._base("text_completion")
        if self.req.continuous_usage:
            out |= {"usage": usage(totals), "speculation": speculation(totals)}
        return {**out, "choices": [choice]}

    def last(self, totals: Totals) -> list[dict]:
        """The stream's closing chunks: the finish reason; then, if asked, one with the usage."""
        out = [self.chunk("", totals, reason=finish_reason(totals, self.req.max_tokens))]
        if self.req.include_usage:
            kind = "chat.completion.chunk" if self.req.chat else "text_completion"
            out.append({**self._base(kind), "choices": [], "usage": usage(totals), "speculation": speculation(totals)})
        return out


def models(model: str, created: int) -> dict:
    return {"object": "list", "data": [{"id": model, "object": "model", "created": created, "owned_by": "specdec"}]}


def error_from_triton(message: str) -> OpenAIError:
    """A refusal of the ensemble's as OpenAI's 400: its message starts with the field it names
    (specdec.triton.tensors), told in OpenAI's terms where they differ."""
    text = ENSEMBLE_PREFIX.sub("", message)  # Triton's "in ensemble 'ensemble', " before a step's message
    field, _, _ = text.partition(":")
    renamed = {"text_input": "prompt", "stop_words": "stop", "min_length": "min_tokens"}
    param = renamed.get(field.strip(), field.strip()) if field and " " not in field.strip() else None
    if "server busy" in text or "shutting down" in text:
        return OpenAIError(text, None, status=503, kind="server_error", code="overloaded")
    return OpenAIError(text, param)
