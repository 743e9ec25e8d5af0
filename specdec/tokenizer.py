"""Tokenizer, chat template and incremental detokenization.

The chat template is Jinja from the checkpoint; it is rendered in a sandbox (no attribute access
to Python internals, no imports), since a profile may point at a checkpoint we did not write.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path

from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

REPLACEMENT_CHAR = "\ufffd"
USER_TEXT_MARK = "\ue000"  # a private-use character: no template writes it


class TextTokenizer:
    def __init__(self, model_dir: str | Path):
        model_dir = Path(model_dir)
        self._tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        config_file = model_dir / "tokenizer_config.json"
        self.config = json.loads(config_file.read_text()) if config_file.is_file() else {}
        eos = self.config.get("eos_token")
        self.eos_id = self._tok.token_to_id(eos) if isinstance(eos, str) else None
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)

    @cached_property
    def _template(self):
        source = self.config.get("chat_template")
        if not source:
            return None
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        return env.from_string(source)

    def chat_prompt(self, user_text: str) -> str:
        """The prompt a chat model expects for one user turn, ending where the answer starts."""
        if self._template is None:
            return user_text
        return self.conversation([{"role": "user", "content": user_text}])

    def conversation(self, messages: list[dict[str, str]]) -> str:
        """A conversation ({role, content} messages: system, user, assistant turns) as the chat
        template writes it, ending where the next answer starts. ValueError without a template."""
        if self._template is None:
            raise ValueError("messages: this model has no chat template; send the prompt as text_input")
        return self._template.render(
            messages=messages,
            add_generation_prompt=True,
            bos_token=self.config.get("bos_token", ""),
            eos_token=self.config.get("eos_token", ""),
        )

    def conversation_ids(self, messages: list[dict[str, str]]) -> list[int]:
        return self.encode(self.conversation(messages))

    def user_turn(self) -> tuple[str, str] | None:
        """The chat template's text before and after a lone user turn's text (chat_prompt() is
        before + text + after); None without a template, or one that does not write the text
        once as it is."""
        if self._template is None:
            return None
        parts = self.chat_prompt(USER_TEXT_MARK).split(USER_TEXT_MARK)
        return (parts[0], parts[1]) if len(parts) == 2 else None

    def token_texts(self) -> list[str]:
        """Each token id's text alone ("" for special tokens)."""
        return self._tok.decode_batch([[i] for i in range(self.vocab_size)], skip_special_tokens=True)

    def prompt_ids(self, text: str, apply_chat_template: bool) -> list[int]:
        """A request's prompt as the engine gets it: in the chat template, or as it is."""
        return self.encode(self.chat_prompt(text) if apply_chat_template else text)


def text_delta(decode, ids: list[int], context_length: int, final: bool) -> str:
    """The text that tokens ids[context_length:] add after ids[:context_length] was streamed.

    Stateless, so the postprocessing model needs no per-request memory: the caller sends a few
    already-streamed ids before the new ones. A byte-level tokenizer can split one UTF-8
    character over several tokens; until the character is complete the decoded text ends in
    U+FFFD, and that tail is held back (both for what was streamed before and for now), so a
    character is never split. The last chunk of a stream flushes everything.
    """
    before = decode(ids[:context_length]).rstrip(REPLACEMENT_CHAR)
    now = decode(ids)
    if not final:
        now = now.rstrip(REPLACEMENT_CHAR)
    return now[len(before) :] if len(now) >= len(before) else ""
