"""A guess at the token after the one a forward just produced, from that forward's hidden state.

Prompt lookup drafts nothing, or little, where the model starts a new phrase: the token that
begins a copy does not follow the suffix it matched. Given the last hidden state h_t (the row that
produced token t+1) and token t+1 itself, a small residual MLP over the tied embedding guesses
token t+2, and lookup goes on from there (specdec/proposers.py). Trained on the target's own
greedy outputs (specdec/build/guess_head.py); on the held-out prompts it is right a third of the
time, and a one-token draft costs a twentieth of a step to verify on the bf16 CPU engine.

    z = h + W2 silu(W1 [h; e(t+1)] + b1) + b2          e: the embedding table, (V, H)
    guess = argmax over candidates c of z . e(c)

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

if TYPE_CHECKING:
    from specdec.engine.model import Llama


class GuessHead:
    """Its products go through the model's ops (bf16 AMX tiles on the bf16 CPU engine), or all of
    it through their compiled kernel where they have one (ops.guess_kernel)."""

    def __init__(self, path: str | Path, model: Llama):
        weights = load_file(str(path))
        size = model.cfg.hidden_size
        try:
            w1, b1, w2, b2 = (weights[f"fc{i}.{kind}"] for i in (1, 2) for kind in ("weight", "bias"))
            candidates = weights["candidates"].long()  # (N,) token ids
        except KeyError as err:
            raise ValueError(f"{path}: not a guess head (missing {err})") from None
        if w1.shape[1] != 2 * size or w2.shape[0] != size:
            raise ValueError(f"{path}: a head for hidden size {w2.shape[0]}, the model's is {size}")
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
                model.embed.view(torch.int16).numpy(),
            )  # fmt: skip

    def guess(self, hidden: torch.Tensor, tokens: torch.Tensor, contexts: Sequence[Sequence[int]]) -> list[int]:
        """hidden: (B, H) the rows that produced `tokens` (B,); contexts: each sequence's tokens
        so far (its candidates besides the frequent ones). The guessed next token of each."""
        if self.kernel is None:
            return self._guess(hidden, tokens, contexts)
        guesses = np.empty(len(contexts), dtype=np.int64)
        flat = np.concatenate([np.asarray(c, dtype=np.int64) for c in contexts])
        offsets = np.cumsum([0] + [len(c) for c in contexts])
        self.kernel(hidden.numpy(), tokens.numpy(), *self.kernel_args, flat, offsets, guesses)
        return guesses.tolist()

    def _guess(self, hidden: torch.Tensor, tokens: torch.Tensor, contexts: Sequence[Sequence[int]]) -> list[int]:
        """guess() through the ops."""
        model, ops = self.model, self.model.ops
        x = torch.cat([hidden, model.embedding(tokens).to(hidden.dtype)], dim=1)
        z = hidden + ops.linear(torch.nn.functional.silu(ops.linear(x, self.fc1) + self.b1), self.fc2) + self.b2
        frequent = ops.linear(z, self.candidate_rows).float().cpu().numpy()  # (B, N)
        z = z.float()
        out = []
        for b, context in enumerate(contexts):
            i = int(frequent[b].argmax())
            guess, score = int(self.candidates[i]), frequent[b, i]
            ids = np.unique(np.asarray(context, dtype=np.int64))
            if len(own := ids[~self.is_candidate[ids]]):
                scores = (model.embedding(torch.from_numpy(own).to(z.device)) @ z[b]).cpu().numpy()
                if scores[j := int(scores.argmax())] > score:
                    guess = int(own[j])
            out.append(guess)
        return out
