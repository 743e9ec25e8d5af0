"""Draft verification: greedy acceptance, coupled sampling for a deterministic draft, and the
modified rejection sampler for a stochastic one. Pure functions.

Greedy verification is one sequence's token lists: a batch's tensor version costs more in small
tensor ops than the comparison of a few tokens does.

Rejection sampling (Leviathan et al. 2023; Chen et al. 2023): accept x_i with probability
min(1, p_i(x_i) / q_i(x_i)); at the first rejection emit a sample of norm(max(0, p_i - q_i));
if all are accepted emit a bonus sample of p_{k+1}. The emitted sequence is distributed as p.

For a deterministic draft (prompt lookup, the engine's guess: q one-hot on x_i) this is
coupling (sampled_verify): draw y_i ~ p_i with the position's uniform and accept iff y_i == x_i.
P(accept) = p_i(x_i) = min(1, p/q), and on rejection y_i is distributed as p_i restricted to
tokens != x_i, which is norm(max(0, p_i - onehot(x_i))). Because y_i is the very token plain
sampling draws at that position, a seeded request gives identical tokens with and without
speculation. It draws y_i position by position and stops at each sequence's first rejection, so
the rows after it cost no sampling (at 20-40% acceptance most of a round's rows); a batch's
sequences draw each position together.

The rejection sampler for a stochastic draft works on tensors; its shapes (B sequences, K = the
longest draft in the batch, V vocabulary):
    draft_ids      (B, K)      int64, padded past num_draft[b] with any valid id
    num_draft      (B,)        int64, 0 <= num_draft[b] <= K
    target_probs   (B, K+1, V) p after temperature / top-k / top-p
    draft_probs    (B, K, V)   q, the same processing
    uniform        (B, K)      U[0,1) coins for the accept test
    sample_uniform (B, K+1)    U[0,1): each position's sample (sampling.sample) from the
                               residual where its draft is rejected, from p after the last
Result: Verdict.num_accepted (B,) and Verdict.tokens (B, K+1): the accepted drafts, then one
corrected (first rejection) or bonus (all accepted) token, then -1 padding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from specdec.engine.sampling import sample


@dataclass
class Verdict:
    num_accepted: torch.Tensor  # (B,) int64
    tokens: torch.Tensor  # (B, K+1) int64, -1 after the emitted tokens

    def emitted(self, b: int) -> list[int]:
        return self.tokens[b, : int(self.num_accepted[b]) + 1].tolist()


def _assemble(draft_ids: torch.Tensor, num_draft: torch.Tensor, accepted: torch.Tensor, fix: torch.Tensor) -> Verdict:
    """accepted (B, K) per-position tests; fix (B, K+1) the token to emit if the first rejection
    (or the bonus, at index num_draft) falls at that index."""
    batch, k = draft_ids.shape
    in_draft = torch.arange(k, device=draft_ids.device)[None, :] < num_draft[:, None]
    run = (accepted & in_draft).long().cumprod(dim=1)  # 1 while every draft so far was accepted
    num_accepted = run.sum(dim=1)
    idx = torch.arange(k + 1, device=draft_ids.device)[None, :]
    padded = torch.cat([draft_ids, torch.zeros(batch, 1, dtype=draft_ids.dtype, device=draft_ids.device)], dim=1)
    last = fix.gather(1, num_accepted[:, None])
    tokens = torch.where(idx < num_accepted[:, None], padded, torch.where(idx == num_accepted[:, None], last, -1))
    return Verdict(num_accepted=num_accepted, tokens=tokens)


def accepted_length(draft: Sequence[int], target_tokens: Sequence[int]) -> int:
    """Draft tokens a greedy verification accepts: the common prefix of the draft and the
    target's tokens."""
    n = 0
    while n < min(len(draft), len(target_tokens)) and draft[n] == target_tokens[n]:
        n += 1
    return n


def greedy_verify(target_ids: Sequence[int], draft_ids: Sequence[int]) -> tuple[list[int], int]:
    """Temperature 0: target_ids (K+1) the target's argmax at each of the K draft positions and
    one more. Accept while the draft equals it, then emit the target's own token: (the emitted
    tokens, the number of drafts accepted)."""
    accepted = accepted_length(draft_ids, target_ids)
    return list(target_ids[: accepted + 1]), accepted


def sampled_verify(
    drafts: Sequence[Sequence[int]], draw: Callable[[list[tuple[int, int]]], list[int]]
) -> list[tuple[list[int], int]]:
    """Sampling with deterministic drafts, a batch of sequences: draw(pairs) gives, in one call,
    the token plain sampling draws for each (sequence b, position i) of the round, i = 0..K_b.
    Each sequence accepts while its draw equals its draft, then emits that draw; it is asked
    position by position, for the sequences that accepted every draft before it (one call a
    position, not one a sequence and position). Per sequence: (emitted tokens, drafts accepted)."""
    emitted: list[list[int]] = [[] for _ in drafts]
    drawing = list(range(len(drafts)))
    while drawing:
        tokens = draw([(b, len(emitted[b])) for b in drawing])
        for b, token in zip(drawing, tokens, strict=True):
            emitted[b].append(token)
        # past its draft (the bonus token drawn) or rejected: done
        drawing = [
            b for b in drawing if len(emitted[b]) <= len(drafts[b]) and emitted[b][-1] == drafts[b][len(emitted[b]) - 1]
        ]
    return [(tokens, len(tokens) - 1) for tokens in emitted]


def rejection_sample(
    target_probs: torch.Tensor,
    draft_ids: torch.Tensor,
    num_draft: torch.Tensor,
    draft_probs: torch.Tensor,
    uniform: torch.Tensor,
    sample_uniform: torch.Tensor,
) -> Verdict:
    own_sample = sample(target_probs, sample_uniform)  # (B, K+1): y_i ~ p_i
    k = draft_ids.shape[1]
    p_x = target_probs[:, :k].gather(-1, draft_ids[..., None]).squeeze(-1)
    q_x = draft_probs.gather(-1, draft_ids[..., None]).squeeze(-1)
    accepted = uniform * q_x < p_x  # u < p/q, without dividing by a q that may be 0
    residual = (target_probs[:, :k] - draft_probs).clamp_min(0.0)
    residual_sample = sample(residual, sample_uniform[:, :k])
    # Where p == q the residual is empty and a rejection has probability 0; keep a valid token.
    residual_sample = torch.where(residual.amax(dim=-1) > 0, residual_sample, own_sample[:, :k])
    in_draft = torch.arange(k + 1, device=draft_ids.device)[None, :] < num_draft[:, None]
    fix = torch.where(in_draft, torch.cat([residual_sample, own_sample[:, k:]], dim=1), own_sample)
    return _assemble(draft_ids, num_draft, accepted, fix)
