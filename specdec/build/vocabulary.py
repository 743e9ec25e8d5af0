"""A draft is only usable with the target's vocabulary: token ids must mean the same thing."""

from __future__ import annotations

import json
from pathlib import Path


def _vocab(model_dir: Path) -> dict[str, int] | None:
    tokenizer = model_dir / "tokenizer.json"
    if not tokenizer.is_file():
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tokenizer)).get_vocab(with_added_tokens=True)


def vocabulary_mismatch(target_dir: Path, draft_dir: Path) -> str | None:
    """Why the draft's vocabulary differs from the target's, or None when they match."""
    sizes = [json.loads((d / "config.json").read_text()).get("vocab_size") for d in (target_dir, draft_dir)]
    if sizes[0] != sizes[1]:
        return f"the draft has {sizes[1]} tokens, the target {sizes[0]}"
    target, draft = _vocab(target_dir), _vocab(draft_dir)
    if target is None or draft is None:
        return None  # no tokenizer.json on one side: the sizes are all we can compare
    if target != draft:
        differing = sorted(set(target.items()) ^ set(draft.items()), key=lambda kv: kv[1])
        token, idx = differing[0]
        return f"their tokenizers differ (first at id {idx}: {token!r})"
    return None
