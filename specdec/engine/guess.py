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
a step's memory traffic. A guess costs about 0.4 ms a call (bf16 engine, 2 cores).
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
    """Its products go through the model's ops (bf16 AMX tiles on the bf16 CPU engine): in
    float32 through torch, fc1, fc2 and the candidates took 0.6 of 1.3 ms a call."""

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

    def guess(self, hidden: torch.Tensor, tokens: torch.Tensor, contexts: Sequence[Sequence[int]]) -> list[int]:
        """hidden: (B, H) the rows that produced `tokens` (B,); contexts: each sequence's tokens
        so far (its candidates besides the frequent ones). The guessed next token of each."""
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
