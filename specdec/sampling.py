"""Sampling parameters, the distribution they define, and seeded noise keyed by position.

The distribution p of a logits row is softmax(logits / temperature), then top-k, then top-p
(the smallest set of most likely tokens whose mass reaches top_p), renormalised. Draft (q) and
target (p) distributions go through the same function.

Randomness is keyed by (seed, absolute position, stream), never drawn from a shared generator:
the uniform that decides the token at position j is the same whatever else is in the batch, and
whether j is reached by a plain step or by a verification. With a deterministic proposer, the
rejection sampler (verify.py) then emits exactly the tokens plain sampling emits for that seed.

A token is drawn by inverting p's cumulative sum at one uniform (draw()): one random number a
position. Gumbel-style noise, one Exp(1) per vocabulary entry, cost 0.9 ms a row on the CPU
(49152 entries), which a verification pays for every row: 8 ms of a 7-row round against a
10 ms forward (the session of 2026-12-04, HISTORY item 40). draw() takes the rows of a batch in
one call: one row at a time, sampling was 16% of the engine's time at 32 users with top_p.

A row's result must not depend on the other rows of the call (a last-bit difference in p can
flip a sample), so every step is one of torch's row-by-row kernels (softmax, topk, cumsum,
searchsorted) and never a reduction along a row: torch.sum splits a lone row between threads
and not a row of several, so its order of additions depends on how many rows there are.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch

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


def _generator(seed: int, position: int, stream: int, device: torch.device) -> torch.Generator:
    key = _splitmix64(_splitmix64(seed ^ (stream << 56)) ^ position) >> 1  # manual_seed takes < 2**63
    return torch.Generator(device=device).manual_seed(key)


def sample_uniforms(seed: int, positions: list[int], device: torch.device) -> torch.Tensor:
    """U ~ Uniform[0, 1) in float64, one per position: what sample() draws that position's token with."""
    return _uniforms(seed, positions, STREAM_SAMPLE, torch.float64, device)


def uniform_noise(seed: int, positions: list[int], device: torch.device) -> torch.Tensor:
    """U ~ Uniform[0, 1), one per position: the accept/reject coin."""
    return _uniforms(seed, positions, STREAM_ACCEPT, torch.float32, device)


def _uniforms(seed: int, positions: list[int], stream: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    out = [
        torch.rand(1, dtype=dtype, device=device, generator=_generator(seed, pos, stream, device)) for pos in positions
    ]
    return torch.cat(out) if out else torch.empty(0, dtype=dtype, device=device)


def sample(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """(..., V) probabilities (not necessarily normalised), (...) uniforms -> (...) int64: the index
    where each row's running sum (in float64) first exceeds its uniform times the row's total
    (u x total < total for u < 1, so there is one). An index of probability 0 is never drawn; a
    row of zeros gives V - 1 (a caller that can have one replaces it)."""
    flat_p, flat_u = probs.reshape(-1, probs.shape[-1]), uniform.reshape(-1)
    drawn = torch.empty(len(flat_u), dtype=torch.int64, device=probs.device)
    # a row at a time: over 16 whole rows at once the float64 sums took 0.4-4 ms (HISTORY item 41)
    for i, (row, u) in enumerate(zip(flat_p, flat_u, strict=True)):
        cdf = torch.cumsum(row, dim=0, dtype=torch.float64)
        drawn[i] = torch.searchsorted(cdf, (u * cdf[-1]).reshape(1), right=True)[0]
    return drawn.clamp_(max=probs.shape[-1] - 1).reshape(uniform.shape)


def draw(logits: torch.Tensor, params: SamplingParams, uniforms: torch.Tensor) -> torch.Tensor:
    """(M, V) logits, (M,) uniforms (sample_uniforms) -> (M,) int64: the token each row samples.
    sample() over the row's probabilities in id order, or with top_p over its kept tokens from
    the most likely (the order _nucleus finds them in), which skips a pass over the vocabulary."""
    p = _softmax(logits, params)
    if params.top_p >= 1.0:
        return sample(p, uniforms)
    tokens = torch.empty(len(p), dtype=torch.int64, device=p.device)
    for rows, top, ids in _nucleus(p, params.top_p):
        tokens[rows] = ids.gather(1, sample(top, uniforms[rows])[:, None])[:, 0]
    return tokens


def probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """(M, V) logits -> (M, V) the normalised probabilities draw() samples from (float32), for
    the rejection sampler of a stochastic draft."""
    p = _softmax(logits, params)
    if params.top_p < 1.0:
        kept = torch.zeros_like(p)
        for rows, top, ids in _nucleus(p, params.top_p):
            kept[rows] = torch.zeros_like(p[rows]).scatter_(1, ids, top)
        p = kept
    # the total as a running sum: a reduction's order over a row depends on the other rows
    # (a lone row's is split between threads), and a row's probabilities must not
    return p / torch.cumsum(p, dim=-1)[:, -1:]


def _softmax(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """(M, V) logits -> (M, V) float32 softmax(logits / temperature) over the top_k most likely."""
    z = logits.float() / params.temperature
    if 0 < params.top_k < z.shape[-1]:
        kth = torch.topk(z, params.top_k, dim=-1).values[:, -1:]
        z = z.masked_fill(z < kth, -math.inf)
    return torch.softmax(z, dim=-1)


# most likely tokens _nucleus looks among before it sorts them all. A top_p of 0.9 at temperature
# 0.7 keeps 1-17 tokens of the held-out open questions' rows: the largest 32 of 32 rows took
# 1.0 ms, the largest 256 2.2 ms (the EPYC, two threads)
TOP_P_PREFIXES = (32, 256, 4096)


def _nucleus(p: torch.Tensor, top_p: float) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(M, V) probabilities -> groups of rows (indices into p) with, for each row, its n most
    likely tokens' probabilities (descending), zero past top_p's cut, and their ids (n the same
    within a group). The cut keeps the most likely tokens until their mass reaches top_p. Each
    row takes the shortest of TOP_P_PREFIXES (else the whole row) that holds its cut, whatever
    the other rows need: a longer prefix may order equally likely tokens otherwise, and draw()
    samples in that order. Sorting all 49152 took 3.5 ms a row, the largest 256 0.1 ms."""
    vocab = p.shape[-1]
    rows = torch.arange(len(p), device=p.device)
    for size in [n for n in TOP_P_PREFIXES if n < vocab] + [vocab]:
        top, ids = torch.topk(p if len(rows) == len(p) else p[rows], size, dim=-1)  # descending
        mass_before = torch.cumsum(top, dim=-1) - top
        held = (mass_before[:, -1] >= top_p) if size < vocab else torch.ones_like(rows, dtype=torch.bool)
        keep = mass_before[held] < top_p  # until the kept mass reaches top_p; the most likely always
        keep[:, 0] = True
        yield rows[held], top[held] * keep, ids[held]
        rows = rows[~held]
        if not len(rows):
            return
