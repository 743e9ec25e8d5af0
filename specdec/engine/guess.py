"""A guess at the token after the one a forward just produced, from that forward's hidden state.

Prompt lookup drafts nothing, or little, where the model starts a new phrase: the token that
begins a copy does not follow the suffix it matched. Given the last hidden state h_t (the row that
produced token t+1) and token t+1 itself, a small residual MLP over the tied embedding guesses
token t+2, and lookup goes on from there (specdec/proposers.py). Trained on the target's own
greedy outputs (specdec/build/guess_head.py); on the held-out prompts it is right a third of the
time, and a one-token draft costs a twentieth of a step to verify on the bf16 CPU engine.

    z = h + W2 silu(W1 [h; e(t+1)] + b1) + b2          e: the embedding table, (V, H)
    guess = argmax over candidates c of z . e(c)

Beside the guess it names the other candidates scored within `margin` of it (at most
MAX_GUESSES - 1 of them, best first): the tokens it finds plausible. Prompt lookup drafts from
the match whose next token ranks best among them, and where it matches one token its copy keeps
the lead if the copy's next token is among them (specdec/proposers.py).

The candidates are the tokens the model writes most (the file's `candidates`: 1024) and the
sequence's own tokens: scoring the whole vocabulary would read the 49152 x 576 table, a fifth of
a step's memory traffic. On the bf16 engine the head is one compiled call (amx.guess_head): 0.2
against 0.8 ms a call through the ops from Python, right after a forward (2 cores).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from safetensors.torch import load_file

from specdec.config import GUESS_MARGIN

if TYPE_CHECKING:
    from specdec.engine.model import Llama

MAX_GUESSES = 16  # the guess and the plausible tokens after it, at most


class GuessHead:
    """Its products go through the model's ops (bf16 AMX tiles on the bf16 CPU engine), or all of
    it through their compiled kernel where they have one (ops.guess_kernel)."""

    def __init__(self, path: str | Path, model: Llama, margin: float = GUESS_MARGIN):
        weights = load_file(str(path))
        size = model.cfg.hidden_size
        try:
            w1, b1, w2, b2 = (weights[f"fc{i}.{kind}"] for i in (1, 2) for kind in ("weight", "bias"))
            candidates = weights["candidates"].long()  # (N,) token ids
        except KeyError as err:
            raise ValueError(f"{path}: not a guess head (missing {err})") from None
        if w1.shape[1] != 2 * size or w2.shape[0] != size:
            raise ValueError(f"{path}: a head for hidden size {w2.shape[0]}, the model's is {size}")
        if not margin >= 0:
            raise ValueError(f"guess_margin: must be >= 0, got {margin}")
        self.margin = margin
        self.model, ops, dtype, device = model, model.ops, model.dtype, model.device
        self.fc1, self.fc2 = ops.weight(w1.to(device, dtype)), ops.weight(w2.to(device, dtype))  # (D, 2H), (H, D)
        self.b1, self.b2 = b1.to(device, dtype), b2.to(device, dtype)
        self.candidates = candidates.numpy()
        self.candidate_rows = ops.weight(model.embedding(candidates.to(device)).to(dtype))  # (N, H)
        self.is_candidate = np.zeros(model.cfg.vocab_size, dtype=bool)
        self.is_candidate[candidates.numpy()] = True
        self.kernel = ops.guess_kernel
        if self.kernel is not None:  # its arguments besides the rows and contexts, as it takes them
            self.kernel_args = (
                self.fc1.tiles.numpy(), self.b1.float().numpy(), self.fc2.tiles.numpy(), self.b2.float().numpy(),
                self.candidate_rows.tiles.numpy(), self.candidates, self.is_candidate,
                model.embed.view(torch.int16).numpy(), np.float32(margin),
            )  # fmt: skip

    def guesses(self, hidden: torch.Tensor, tokens: torch.Tensor, contexts: Sequence[Sequence[int]]) -> list[list[int]]:
        """hidden: (B, H) the rows that produced `tokens` (B,); contexts: each sequence's tokens
        so far (its candidates besides the frequent ones). Each sequence's guessed next token,
        then the other tokens within the margin of its score, best first."""
        if self.kernel is None:
            return self._guesses(hidden, tokens, contexts)
        out = np.empty((len(contexts), MAX_GUESSES), dtype=np.int64)
        flat = np.concatenate([np.asarray(c, dtype=np.int64) for c in contexts])
        offsets = np.cumsum([0] + [len(c) for c in contexts])
        self.kernel(hidden.numpy(), tokens.numpy(), *self.kernel_args, flat, offsets, out)
        return [row[row >= 0].tolist() for row in out]

    def _guesses(
        self, hidden: torch.Tensor, tokens: torch.Tensor, contexts: Sequence[Sequence[int]]
    ) -> list[list[int]]:
        """guesses() through the ops."""
        model, ops = self.model, self.model.ops
        x = torch.cat([hidden, model.embedding(tokens).to(hidden.dtype)], dim=1)
        z = hidden + ops.linear(torch.nn.functional.silu(ops.linear(x, self.fc1) + self.b1), self.fc2) + self.b2
        frequent = ops.linear(z, self.candidate_rows).float().cpu().numpy()  # (B, N)
        z = z.float()
        out = []
        for b, context in enumerate(contexts):
            ids = np.unique(np.asarray(context, dtype=np.int64))
            own = ids[~self.is_candidate[ids]]
            scores = (model.embedding(torch.from_numpy(own).to(z.device)) @ z[b]).cpu().numpy()
            # candidates before own tokens, each in order: a tie goes to the first (as in the kernel)
            ids, scores = np.concatenate([self.candidates, own]), np.concatenate([frequent[b], scores])
            out.append(ranked_guesses(ids, scores, self.margin))
        return out


def ranked_guesses(ids: np.ndarray, scores: np.ndarray, margin: float) -> list[int]:
    """The best-scoring id, then the others within margin of its score, best first (ties in the
    given order), MAX_GUESSES at most."""
    order = np.argsort(-scores.astype(np.float32), kind="stable")[:MAX_GUESSES]
    keep = scores[order] >= np.float32(scores[order[0]]) - np.float32(margin)
    return ids[order[keep]].tolist()
