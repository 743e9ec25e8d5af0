"""A guess at the token after the one a forward just produced, from that forward's hidden state.

Prompt lookup drafts nothing, or little, where the model starts a new phrase: the token that
begins a copy does not follow the suffix it matched. Given the last hidden state h_t (the row that
produced token t+1) and token t+1 itself, a small residual MLP over the tied embedding guesses
token t+2, and lookup goes on from there (specdec/speculation/lookup.py). Trained on the target's own
greedy outputs (specdec/build/guess_head.py). It is right often enough, and one more draft row
costs little enough to verify, that drafting from it pays where lookup has nothing to copy
(benchmarks/copy_bound.py replays lookup with and without it).

    z = h + W2 silu(W1 [h; e(t+1)] + b1) + b2          e: the embedding table, (V, H)
    guess = argmax over candidates c of z . e(c)

Beside the guess it names the other candidates scored within `margin` of it (at most
MAX_GUESSES - 1 of them, best first): the tokens it finds plausible. Prompt lookup drafts from
the match whose next token ranks best among them, and where it matches one token its copy keeps
the lead if the copy's next token is among them (specdec/speculation/lookup.py).

The candidates are the tokens the model writes most (the file's `candidates`: 1024) and the
sequence's own tokens (OwnTokens): scoring the whole vocabulary would read the whole embedding
table, a sizeable share of a step's memory traffic. On the bf16 CPU engines the head is one
compiled call (compiled_guesses): through the ops from Python, its small steps right after a
forward cost several times as much.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload
from safetensors.torch import load_file

from specdec.config import GUESS_MARGIN
from specdec.engine import amx, kernels
from specdec.engine.kernels import FASTMATH

if TYPE_CHECKING:
    from specdec.engine.model import Llama

MAX_GUESSES = 16  # the guess and the plausible tokens after it, at most


class OwnTokens:
    """Each KV slot's sequence's own candidates: its tokens that are not frequent candidates, in
    the order they first occur, and (for compiled_guesses) their embedding rows, kept as the
    sequence grows, a round's few tokens at a time, in compiled code (add_own_tokens). Right
    after a forward the caches hold nothing of this, so gathering all the rows from the table
    each round, or updating them by numpy calls from Python, would cost a share of a step. A slot's
    sequence that does not extend the one seen there before (a new request) starts afresh."""

    def __init__(self, slots: int, max_len: int, is_candidate: np.ndarray, table: np.ndarray | None):
        """table: the (V, H) embedding whose rows to keep (bf16 bits, int16), or None: ids only."""
        self.is_candidate = is_candidate
        self.table = np.zeros((len(is_candidate), 0), dtype=np.int16) if table is None else table
        self.ids = np.zeros((slots, max_len), dtype=np.int64)  # slot s's own tokens: ids[s, :counts[s]]
        self.counts = np.zeros(slots, dtype=np.int64)
        self.present = np.zeros((slots, len(is_candidate)), dtype=np.bool_)  # ids[s] as a set
        # calloc's zeros: pages backed as rows are written
        self.rows = kernels.line_aligned((slots, max_len, self.table.shape[1]), np.int16, zeros=True)
        self._seen: list[list[int]] = [[] for _ in range(slots)]  # the tokens each slot's ids cover

    def arrays(self) -> tuple[np.ndarray, ...]:
        """add_own_tokens' arguments before the slot and its new tokens."""
        return self.is_candidate, self.table, self.ids, self.rows, self.counts, self.present

    def unseen(self, slot: int, tokens: Sequence[int]) -> list[int]:
        """The tokens the slot has not seen: where `tokens` do not extend what it saw, all of them,
        its own tokens forgotten."""
        seen = self._seen[slot]
        if len(seen) > len(tokens) or tokens[: len(seen)] != seen:
            self.present[slot, self.ids[slot, : self.counts[slot]]] = False
            self.counts[slot] = 0
            seen.clear()
        new = list(tokens[len(seen) :])
        seen.extend(new)
        return new

    def update(self, slot: int, tokens: Sequence[int]) -> np.ndarray:
        """The slot's own tokens once it has seen `tokens` (a view, valid until the next update)."""
        add_own_tokens(*self.arrays(), slot, np.asarray(self.unseen(slot, tokens), dtype=np.int64))
        return self.ids[slot, : self.counts[slot]]


@njit(cache=True)
def add_own_tokens(is_candidate, table, ids, rows, counts, present, slot, new):  # pragma: no cover - compiled
    """OwnTokens' arrays with the slot's new tokens `new` (int64) added."""
    count = counts[slot]
    for t in new:
        if not is_candidate[t] and not present[slot, t]:
            present[slot, t] = True
            ids[slot, count] = t
            rows[slot, count, :] = table[t]
            count += 1
    counts[slot] = count


class GuessHead:
    """Its products go through the model's ops, or all of it through compiled_guesses where the
    ops pack their weights as bf16 tiles (ops.packed_bf16: the bf16 CPU engines)."""

    def __init__(self, path: str | Path, model: Llama, slots: int, max_len: int, margin: float = GUESS_MARGIN):
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
        self.kernel = compiled_guesses if ops.packed_bf16 else None
        table = model.embed.view(torch.int16).numpy() if self.kernel is not None else None
        self.own = OwnTokens(slots, max_len, self.is_candidate, table)
        if self.kernel is not None:  # its arguments besides the rows and their sequences', as it takes them
            self.kernel_args = (
                self.fc1.tiles.numpy(), self.b1.float().numpy(), self.fc2.tiles.numpy(), self.b2.float().numpy(),
                self.candidate_rows.tiles.numpy(), self.candidates, np.float32(margin),
            )  # fmt: skip

    def guesses(
        self, hidden: torch.Tensor, tokens: torch.Tensor, slots: Sequence[int], contexts: Sequence[Sequence[int]]
    ) -> list[list[int]]:
        """hidden: (B, H) the rows that produced `tokens` (B,); slots: each row's sequence's KV
        slot; contexts: each sequence's tokens so far (its candidates besides the frequent ones).
        Each sequence's guessed next token, then the other tokens within the margin of its
        score, best first."""
        if self.kernel is None:
            for slot, context in zip(slots, contexts, strict=True):
                self.own.update(slot, context)
            return self._guesses(hidden, tokens, slots)
        # in as few numpy calls as can be: right after a forward has emptied the caches each is slow
        unseen = [self.own.unseen(slot, context) for slot, context in zip(slots, contexts, strict=True)]
        new = np.array([t for tokens_of in unseen for t in tokens_of], dtype=np.int64)
        offsets = np.array([0, *itertools.accumulate(len(u) for u in unseen)], dtype=np.int64)
        out = np.empty((len(slots), MAX_GUESSES), dtype=np.int64)
        self.kernel(hidden.numpy(), tokens.numpy(), *self.kernel_args, *self.own.arrays(),
                    np.array(slots, dtype=np.int64), new, offsets, out)  # fmt: skip
        return [[g for g in row if g >= 0] for row in out.tolist()]

    def _guesses(self, hidden: torch.Tensor, tokens: torch.Tensor, slots: Sequence[int]) -> list[list[int]]:
        """guesses() through the ops, the slots' own tokens updated."""
        model, ops = self.model, self.model.ops
        x = torch.cat([hidden, model.embedding(tokens).to(hidden.dtype)], dim=1)
        z = hidden + ops.linear(torch.nn.functional.silu(ops.linear(x, self.fc1) + self.b1), self.fc2) + self.b2
        frequent = ops.linear(z, self.candidate_rows).float().cpu().numpy()  # (B, N)
        z = z.float()
        out = []
        for b, slot in enumerate(slots):
            own = self.own.ids[slot, : self.own.counts[slot]]
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


def _project(x, w):
    """x (M, K) @ W.T for W packed by a bf16 ops' weight(): an array of at least (M, N) whose
    first M rows and N columns are the product (the rest: padding)."""


@overload(_project)
def _project_typed(x, w):
    if w.dtype == types.int16:  # amx.pack_weight's tiles

        def on_tiles(x, w):
            out = amx.lined((-(-x.shape[0] // amx.ROWS) * amx.ROWS, w.shape[0] * amx.GROUP * 16), np.float32)
            amx.matmul(x, w, out)
            return out

        return on_tiles

    def on_pairs(x, w):  # kernels.pack_bf16_weight's
        out = np.empty((x.shape[0], w.shape[0] * kernels.TILE), dtype=np.float32)
        kernels.matmul(x, w, out, False)
        return out

    return on_pairs


@intrinsic
def _float32(typingctx, bits):
    """bf16 bits (int16) -> float32: the bits as a float32's upper half."""
    if bits != types.int16:
        return None

    def codegen(context, builder, sig, args):
        i32 = ir.IntType(32)
        upper = builder.shl(builder.zext(args[0], i32), ir.Constant(i32, 16))
        return builder.bitcast(upper, ir.FloatType())

    return types.float32(types.int16), codegen


@njit(fastmath=FASTMATH, cache=True)
def compiled_guesses(hidden, tokens, fc1, b1, fc2, b2, candidate_rows, candidates, margin, is_candidate, table,
                     own_ids, own_rows, own_counts, own_present, slots, new, offsets,
                     guesses):  # pragma: no cover - compiled  # fmt: skip
    """GuessHead.guesses in one compiled call, for the bf16 CPU engines: from Python its dozen
    small steps, each slow right after a forward, would cost several times as much. hidden (B, H)
    float32, tokens (B,); fc1, fc2, candidate_rows the ops' packed weights (_project); b1, b2
    float32; is_candidate .. own_present an OwnTokens' arrays (table: the (V, H) bf16 embedding,
    int16 bits), the b-th row's sequence's those of slot slots[b], which are first updated with
    its tokens new[offsets[b] : offsets[b + 1]]. Row b of guesses (B, MAX_GUESSES) gets the b-th
    guess and the tokens within margin of its score, best first, then -1s."""
    batch, size = hidden.shape
    for b in range(batch):
        add_own_tokens(is_candidate, table, own_ids, own_rows, own_counts, own_present, slots[b],
                       new[offsets[b] : offsets[b + 1]])  # fmt: skip
    x = np.empty((batch, 2 * size), dtype=np.float32)  # [h; e(token)]
    for b in range(batch):
        for d in range(size):
            x[b, d] = hidden[b, d]
            x[b, size + d] = _float32(table[tokens[b], d])
    a = _project(x, fc1)
    for b in range(batch):
        for d in range(len(b1)):
            v = a[b, d] + b1[d]
            a[b, d] = v / (np.float32(1.0) + np.exp(-v))
    z = _project(a[:batch, : len(b1)], fc2)
    for b in range(batch):
        for d in range(size):
            z[b, d] += x[b, d] + b2[d]
    scores = _project(z[:batch, :size], candidate_rows)
    for b in range(batch):
        s, n = slots[b], len(candidates)
        count = own_counts[s]
        ids = np.empty(n + count, dtype=np.int64)  # candidates, then own tokens
        values = np.empty(n + count, dtype=np.float32)
        ids[:n] = candidates
        values[:n] = scores[b, :n]
        for i in range(count):
            row = own_rows[s, i]
            score = np.float32(0.0)
            for d in range(size):
                score += _float32(row[d]) * z[b, d]
            ids[n], values[n] = own_ids[s, i], score
            n += 1
        best = 0
        for i in range(1, n):
            if values[i] > values[best]:
                best = i
        near = np.flatnonzero(values[:n] >= values[best] - margin)  # only these are sorted, not all
        order = near[np.argsort(-values[near], kind="mergesort")]  # stable: a tie goes to the first
        guesses[b, :] = -1
        for i in range(min(len(order), guesses.shape[1])):
            guesses[b, i] = ids[order[i]]
