"""Sampling parameters, the distribution they define, and seeded noise keyed by position.

The distribution p of a logits row is softmax(logits / temperature), then top-k, then top-p
(the smallest set of most likely tokens whose mass reaches top_p), renormalised. Draft (q) and
target (p) distributions go through the same function.

Randomness is keyed by (seed, absolute position, stream), never drawn from a shared generator:
the uniform that decides the token at position j is the same whatever else is in the batch, and
whether j is reached by a plain step or by a verification. With a deterministic proposer, the
rejection sampler (verify.py) then emits exactly the tokens plain sampling emits for that seed.

A token is drawn by inverting p's cumulative sum at one uniform (draw()): one random number a
position. Gumbel-style noise, one Exp(1) per vocabulary entry, drawn for every row of a
verification, would cost about as much as the verification's forward itself.

draw() and probs() are compiled (numba), a row per thread: the engine draws the rows of a step
together, and torch's kernels, on the one thread the engine leaves them, cost several times as
much for a step's rows with top_p. A row's result must not depend on the other rows of the call
(a last-bit difference in p can flip a sample): each row is computed by the same code in the
same order, whatever else is in the call.
On a GPU the rows drawn come to the CPU for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from numba import njit, prange

from specdec.engine.kernels import exp_nonpositive, row_max

# Independent random streams per position.
STREAM_SAMPLE = 1  # the token drawn from p (plain sampling, bonus and residual samples)
STREAM_ACCEPT = 2  # the uniform that accepts or rejects a draft token with stochastic q

_MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy
    top_k: int = 0  # 0 means no top-k cut
    top_p: float = 1.0  # 1 means no nucleus cut
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self) -> None:
        """Raise SamplingError for parameters that define no distribution."""
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise SamplingError("temperature", f"must be a finite number >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise SamplingError("top_k", f"must be >= 0, got {self.top_k}")
        if not math.isfinite(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise SamplingError("top_p", f"must be in (0, 1], got {self.top_p}")
        if not 0 <= self.seed <= _MASK64:
            raise SamplingError("seed", f"must be an unsigned 64-bit integer, got {self.seed}")


class SamplingError(ValueError):
    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field, self.reason = field, reason


def derive_seed(seed: int, salt: int) -> int:
    """A different, reproducible seed (e.g. for the draft model, whose noise must be independent
    of the target's)."""
    return _splitmix64(seed ^ _splitmix64(salt))


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _generator(seed: int, position: int, stream: int) -> torch.Generator:
    key = _splitmix64(_splitmix64(seed ^ (stream << 56)) ^ position) >> 1  # manual_seed takes < 2**63
    return torch.Generator().manual_seed(key)


def sample_uniforms(seed: int, positions: list[int], device: torch.device) -> torch.Tensor:
    """U ~ Uniform[0, 1) in float64, one per position: what sample() draws that position's token with."""
    return _uniforms(seed, positions, STREAM_SAMPLE, torch.float64, device)


def uniform_noise(seed: int, positions: list[int], device: torch.device) -> torch.Tensor:
    """U ~ Uniform[0, 1), one per position: the accept/reject coin."""
    return _uniforms(seed, positions, STREAM_ACCEPT, torch.float32, device)


def _uniforms(seed: int, positions: list[int], stream: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    # drawn on the CPU whatever the device: a seed samples the same tokens on a GPU as on the CPU,
    # and a GPU step does not start a generator and a kernel for each position
    out = [torch.rand(1, dtype=dtype, generator=_generator(seed, pos, stream)) for pos in positions]
    return (torch.cat(out) if out else torch.empty(0, dtype=dtype)).to(device)


def sample(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """(..., V) probabilities (not necessarily normalised), (...) uniforms -> (...) int64: the index
    where each row's running sum (in float64) first exceeds its uniform times the row's total
    (u x total < total for u < 1, so there is one). An index of probability 0 is never drawn; a
    row of zeros gives V - 1 (a caller that can have one replaces it)."""
    flat_p, flat_u = probs.reshape(-1, probs.shape[-1]), uniform.reshape(-1)
    drawn = torch.empty(len(flat_u), dtype=torch.int64, device=probs.device)
    # a row at a time: float64 sums over many whole rows at once cost far more than row by row
    for i, (row, u) in enumerate(zip(flat_p, flat_u, strict=True)):
        cdf = torch.cumsum(row, dim=0, dtype=torch.float64)
        drawn[i] = torch.searchsorted(cdf, (u * cdf[-1]).reshape(1), right=True)[0]
    return drawn.clamp_(max=probs.shape[-1] - 1).reshape(uniform.shape)


def draw(
    logits: torch.Tensor, params: SamplingParams, uniforms: torch.Tensor, rows: list[int] | None = None
) -> torch.Tensor:
    """(N, V) logits, (M,) uniforms (sample_uniforms) -> (M,) int64: the token each of the M
    `rows` of logits (default: all, M = N) samples, where the row's running sum of weights (the
    distribution's, unnormalised) first exceeds its uniform times their total: in id order, or
    with top_p over the kept tokens, most likely first (the order _nucleus finds them in)."""
    if rows is not None and logits.device.type != "cpu":  # only the rows drawn cross to the CPU
        logits, rows = logits[torch.as_tensor(rows, device=logits.device)], None
    tokens = np.empty(len(uniforms), dtype=np.int64)
    which = np.arange(len(logits)) if rows is None else np.asarray(rows, dtype=np.int64)
    _draw(_rows(logits), which, np.float32(params.temperature), params.top_k, params.top_p, _rows(uniforms), tokens)
    return torch.from_numpy(tokens).to(logits.device)


def probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """(M, V) logits -> (M, V) the normalised probabilities draw() samples from (float32), for
    the rejection sampler of a stochastic draft."""
    out = np.empty(logits.shape, dtype=np.float32)
    _probs(_rows(logits), np.float32(params.temperature), params.top_k, params.top_p, out)
    return torch.from_numpy(out).to(logits.device)


def _rows(t: torch.Tensor) -> np.ndarray:
    """A tensor as the compiled kernels take it: on the CPU, contiguous, float32 (uniforms float64)."""
    t = t.detach().cpu()
    return np.ascontiguousarray(t.numpy() if t.dtype == torch.float64 else t.float().numpy())


# Where _nucleus looks for a top_p cut: among the tokens whose weight is at least a tail (the
# most likely token's is 1), the first tail whose tokens hold the mass. A top_p cut usually keeps
# a handful of tokens, which the first tail holds, and only those are sorted: sorting the whole
# vocabulary's weights would cost more than the rest of the draw.
_TAILS = (2.0**-8, 2.0**-11, 2.0**-14, 2.0**-17, 2.0**-20, 0.0)


@njit(fastmath={"reassoc", "contract"}, cache=True)
def _weights(row, temperature, top_k, out):  # pragma: no cover - compiled
    """out = exp(row / temperature - its maximum) over the top_k largest (0: all), 0 elsewhere:
    the distribution's weights, the most likely token's 1. Returns their total (float64)."""
    n = len(row)
    for j in range(n):
        out[j] = row[j] / temperature
    top = row_max(out, n)
    floor = _kth_largest(out, top_k, top) if 0 < top_k < n else -np.inf
    total = 0.0
    for j in range(n):
        w = exp_nonpositive(out[j] - top)
        w = w if out[j] >= floor else np.float32(0.0)  # (a select, not a branch: it vectorizes)
        out[j] = w
        total += np.float64(w)
    return total


@njit(cache=True)
def _kth_largest(z, k, top):  # pragma: no cover - compiled
    """The k-th largest of z (its maximum top), looked for among the values within a margin of
    the top (16: a weight e^-16 the most likely token's), the narrowest that holds k of them:
    partitioning the whole vocabulary would cost more than the rest of the row's work."""
    for margin in (16.0, 24.0, 32.0, 48.0, 64.0, np.inf):
        bound = top - np.float32(margin)
        if np.sum(z >= bound) >= k:
            pool = z[z >= bound]
            return np.partition(pool, len(pool) - k)[len(pool) - k]
    return -np.inf  # (not reached: k < len(z))


@njit(cache=True)
def _nucleus(w, total, top_p, ids):  # pragma: no cover - compiled
    """top_p's cut of weights w: the most likely tokens, in order (equal weights by id), until
    their mass reaches top_p x total; the most likely always. Writes their ids to ids[:k];
    returns k and their mass."""
    bar = top_p * total
    n = 0
    for tail in _TAILS:
        n, mass = 0, 0.0
        for j in range(len(w)):
            if w[j] >= tail and w[j] > 0.0:
                ids[n] = j
                n += 1
                mass += w[j]
        if mass >= bar:  # every token below the tail weighs less than those above it
            break
    found = ids[:n].copy()
    found = found[np.argsort(-w[found], kind="mergesort")]  # stable: equal weights by id
    k, kept = 0, 0.0
    while k < n and (k == 0 or kept < bar):
        ids[k] = found[k]
        kept += w[found[k]]
        k += 1
    return k, kept


@njit(cache=True)
def _distribution(row, temperature, top_k, top_p, w, every):  # pragma: no cover - compiled
    """A row's distribution: its weights into w, then the ids of the tokens it draws from (every
    one, in id order, or top_p's kept tokens, most likely first), their count and their mass."""
    total = _weights(row, temperature, top_k, w)
    if top_p >= 1.0:
        return every, len(w), total
    ids = np.empty(len(w), dtype=np.int64)
    k, kept = _nucleus(w, total, top_p, ids)
    return ids, k, kept


@njit(parallel=True, cache=True)
def _draw(logits, rows, temperature, top_k, top_p, uniforms, out):  # pragma: no cover - compiled
    """draw(): the token of each of the rows into out, in parallel (each computed as it would be alone)."""
    every = np.arange(logits.shape[1])
    for m in prange(len(rows)):
        w = np.empty(logits.shape[1], dtype=np.float32)
        ids, k, total = _distribution(logits[rows[m]], temperature, top_k, top_p, w, every)
        target = uniforms[m] * total  # < total for u < 1; if rounding says otherwise, the last token
        running = 0.0
        for i in range(k):
            if w[ids[i]] > 0.0:
                out[m] = ids[i]
                running += w[ids[i]]
                if running > target:
                    break


@njit(parallel=True, cache=True)
def _probs(logits, temperature, top_k, top_p, out):  # pragma: no cover - compiled
    """probs(): each row's probabilities into out."""
    every = np.arange(logits.shape[1])
    for m in prange(logits.shape[0]):
        ids, k, total = _distribution(logits[m], temperature, top_k, top_p, out[m], every)
        if k < logits.shape[1]:  # top_p's cut: the others weigh nothing
            kept = out[m][ids[:k]].copy()
            out[m][:] = 0.0
            out[m][ids[:k]] = kept
        for j in range(logits.shape[1]):
            out[m, j] = np.float32(out[m, j] / total)
