"""Sampling parameters, the distribution they define, and seeded noise keyed by position.

The distribution p of a logits row is softmax(logits / temperature), then top-k, then top-p
(the smallest set of most likely tokens whose mass reaches top_p), renormalised. Draft (q) and
target (p) distributions go through the same function.

Randomness is keyed by (seed, absolute position, stream), never drawn from a shared generator:
the uniform that decides the token at position j is the same whatever else is in the batch, and
whether j is reached by a plain step or by a verification. With a deterministic proposer, the
rejection sampler (verify.py) then emits exactly the tokens plain sampling emits for that seed.

A token is drawn by inverting p's cumulative sum at one uniform (sample()): one random number a
position. Gumbel-style noise, one Exp(1) per vocabulary entry, cost 0.9 ms a row on the CPU
(49152 entries), which a verification pays for every row: 8 ms of a 7-row round against a
10 ms forward (the session of 2026-12-04, HISTORY item 40).

Rows are processed one at a time on purpose: a torch reduction over a (M, V) tensor may order
its additions differently for different M, and a last-bit difference in p can flip a sample.
"""

from __future__ import annotations

import math
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
    """(..., V) probabilities (not necessarily normalised), (...) uniforms -> (...) int64: the token
    where each row's cumulative sum (in float64) first exceeds its uniform times the row's total.
    A token of probability 0 is never drawn; a row of zeros gives V - 1 (a caller that can have
    one replaces it). Row by row, as probs()."""
    flat_p, flat_u = probs.reshape(-1, probs.shape[-1]), uniform.reshape(-1)
    out = torch.empty(len(flat_u), dtype=torch.int64, device=probs.device)
    for i in range(len(flat_u)):
        cdf = torch.cumsum(flat_p[i].double(), dim=0)
        out[i] = torch.searchsorted(cdf, (flat_u[i] * cdf[-1]).reshape(1), right=True)[0]
    return out.clamp_(max=probs.shape[-1] - 1).reshape(uniform.shape)


def probs_row(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """(V,) logits -> (V,) probabilities after temperature, top-k and top-p (float32)."""
    z = logits.float() / params.temperature
    vocab = z.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(z, params.top_k).values[-1]
        z = z.masked_fill(z < kth, -math.inf)
    p = torch.softmax(z, dim=-1)
    if params.top_p < 1.0:
        p = _top_p(p, params.top_p)
    return p


TOP_P_PREFIXES = (256, 4096)  # most likely tokens _top_p looks among before it sorts them all


def _top_p(p: torch.Tensor, top_p: float) -> torch.Tensor:
    """p cut to the most likely tokens until the kept mass reaches top_p, renormalised. It sorts
    only a prefix of the most likely tokens where the cut falls within it (their running sum is
    the sorted row's): sorting all 49152 took 3.5 ms a row, the largest 256 0.1 ms."""
    vocab = p.shape[-1]
    for size in [n for n in TOP_P_PREFIXES if n < vocab] + [vocab]:
        top, order = torch.topk(p, size)  # descending
        mass_before = torch.cumsum(top, dim=-1) - top
        if size == vocab or bool(mass_before[-1] >= top_p):
            break
    keep = mass_before < top_p  # until the kept mass reaches top_p; the most likely always
    keep[0] = True
    kept = torch.zeros_like(p).scatter_(0, order[keep], top[keep])
    return kept / kept.sum()


def probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """(R, V) logits -> (R, V) probabilities, row by row (see the module note)."""
    return torch.stack([probs_row(row, params) for row in logits]) if len(logits) else logits.float()
