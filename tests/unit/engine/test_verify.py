"""Greedy verification and the rejection sampler, on hand-made and random distributions.

The statistical tests use fixed seeds (deterministic) at significance 1e-3, with sample sizes
chosen so that each deliberately wrong sampler below fails them by many orders of magnitude."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from specdec.engine import verify
from specdec.engine.sampling import sample
from specdec.engine.verify import Verdict, _assemble


def test_greedy_accepts_the_matching_prefix_then_corrects():
    assert verify.greedy_verify([3, 5, 7, 9], [3, 5, 2]) == ([3, 5, 7], 2)  # 2 rejected: the target's 7


def test_greedy_all_accepted_adds_the_bonus_token():
    assert verify.greedy_verify([1, 2, 8], [1, 2]) == ([1, 2, 8], 2)


def test_greedy_first_draft_rejected_emits_one_token():
    assert verify.greedy_verify([4, 5, 6], [9, 5]) == ([4], 0)  # a later match counts for nothing


def test_no_draft_is_a_plain_step():
    assert verify.greedy_verify([6], []) == ([6], 0)


# --- the rejection sampler: does it emit p? -------------------------------------------------------
V, K = 6, 3


def _random_dists(rng: np.random.Generator, rows: int, concentration: float = 1.0) -> torch.Tensor:
    return torch.tensor(rng.dirichlet([concentration] * V, size=rows), dtype=torch.float32)


def _simulate(sampler, p: torch.Tensor, q: torch.Tensor | None, n: int, length: int, seed: int) -> np.ndarray:
    """n sequences of `length` tokens by repeated draft-verify rounds, the target's distribution
    at position j being p[j] and the draft's q[j] (independent of the prefix). Returns (n, length)."""
    g = torch.Generator().manual_seed(seed)
    out = torch.full((n, length), -1, dtype=torch.int64)
    pos = torch.zeros(n, dtype=torch.int64)
    while (pos < length).any():
        rows = torch.nonzero(pos < length).flatten()
        start = pos[rows]
        idx = (start[:, None] + torch.arange(K + 1)[None]).clamp(max=len(p) - 1)
        target = p[idx]  # (B, K+1, V)
        if q is None:  # deterministic proposer: some fixed guess per position
            draft_probs = None
            draft = (start[:, None] + torch.arange(K)[None]) % V
        else:
            draft_probs = q[idx[:, :K]]
            draft = torch.multinomial(draft_probs.reshape(-1, V), 1, generator=g).reshape(len(rows), K)
        uniform = torch.rand(len(rows), K, generator=g)
        sample_uniform = torch.rand(len(rows), K + 1, dtype=torch.float64, generator=g)
        v: Verdict = sampler(target, draft, torch.full((len(rows),), K), draft_probs, uniform, sample_uniform)
        for b, row in enumerate(rows.tolist()):
            for tok in v.emitted(b):
                if pos[row] < length:
                    out[row, pos[row]] = tok
                    pos[row] += 1
    return out.numpy()


def _joint_pvalue(samples: np.ndarray, p: torch.Tensor) -> float:
    """Chi-square goodness of fit of the (first, second) token pairs against p0 x p1."""
    observed = np.bincount(samples[:, 0] * V + samples[:, 1], minlength=V * V)
    expected = np.outer(p[0].double().numpy(), p[1].double().numpy()).reshape(-1)
    return chisquare(observed, expected / expected.sum() * observed.sum()).pvalue


def _marginal_pvalues(samples: np.ndarray, p: torch.Tensor) -> list[float]:
    out = []
    for j in range(samples.shape[1]):
        observed = np.bincount(samples[:, j], minlength=V)
        expected = p[j].double().numpy() / p[j].double().numpy().sum() * len(samples)
        out.append(chisquare(observed, expected).pvalue)
    return out


@pytest.fixture(scope="module")
def dists():
    rng = np.random.default_rng(7)
    return _random_dists(rng, K + 4), _random_dists(rng, K + 4)


N = 12000


def _coupled(target, draft, num_draft, draft_probs, uniform, sample_uniform) -> Verdict:
    """sampled_verify (deterministic drafts) over a batch, as rejection_sample's Verdict."""
    verdicts = verify.sampled_verify(
        [draft[b, : num_draft[b]].tolist() for b in range(len(draft))],
        lambda pairs: [int(sample(target[b, i], sample_uniform[b, i])) for b, i in pairs],
    )
    tokens = torch.full((len(draft), draft.shape[1] + 1), -1)
    for b, (emitted, _) in enumerate(verdicts):
        tokens[b, : len(emitted)] = torch.tensor(emitted)
    return Verdict(torch.tensor([accepted for _, accepted in verdicts]), tokens)


@pytest.mark.parametrize("stochastic_draft", [True, False])
def test_verification_emits_the_target_distribution(dists, stochastic_draft):
    """The rejection sampler with a stochastic draft, coupling with a deterministic one."""
    p, q = dists
    sampler = verify.rejection_sample if stochastic_draft else _coupled
    samples = _simulate(sampler, p, q if stochastic_draft else None, N, length=4, seed=1)
    assert min(_marginal_pvalues(samples, p)) > 1e-3
    assert _joint_pvalue(samples, p) > 1e-3


def test_sampled_verify_draws_each_sequence_only_up_to_its_first_rejection():
    """One draw() a position, for the sequences that accepted every draft before it: rejected at
    the 3rd position, all accepted (then the bonus), a plain step."""
    plain = [[7, 8, 5, 6, 2], [4, 3, 9], [1]]  # what plain sampling draws at each position
    calls = []

    def draw(pairs):
        calls.append(pairs)
        return [plain[b][i] for b, i in pairs]

    verdicts = verify.sampled_verify([[7, 8, 9, 6], [4, 3], []], draw)
    assert verdicts == [([7, 8, 5], 2), ([4, 3, 9], 2), ([1], 0)]
    assert calls == [[(0, 0), (1, 0), (2, 0)], [(0, 1), (1, 1)], [(0, 2), (1, 2)]]


def test_acceptance_rate_is_the_overlap_of_p_and_q(dists):
    """P(accept x ~ q at a position) = sum_x min(p(x), q(x)): the sampler is not just exact but
    accepts as often as the theory allows."""
    p, q = dists
    g = torch.Generator().manual_seed(3)
    n = 40000
    draft = torch.multinomial(q[0:1].expand(n, V), 1, generator=g)
    v = verify.rejection_sample(
        p[0:2][None].expand(n, 2, V), draft, torch.ones(n, dtype=torch.int64), q[0:1][None].expand(n, 1, V),
        torch.rand(n, 1, generator=g), torch.rand(n, 2, dtype=torch.float64, generator=g),
    )  # fmt: skip
    expected = torch.minimum(p[0], q[0]).sum().item()
    assert abs(v.num_accepted.float().mean().item() - expected) < 4 * (expected * (1 - expected) / n) ** 0.5


# --- deliberately wrong samplers: the tests above must catch each of them --------------------------
def _generic(target, draft, num_draft, draft_probs, uniform, sample_uniform, residual="ok", bonus="p", accept="ok"):
    k = draft.shape[1]
    p_x = target[:, :k].gather(-1, draft[..., None]).squeeze(-1)
    q_x = draft_probs.gather(-1, draft[..., None]).squeeze(-1)
    ratio = p_x / q_x if accept == "ok" else q_x / p_x
    accepted = uniform < ratio
    if residual == "ok":
        res = (target[:, :k] - draft_probs).clamp_min(0)
    elif residual == "p":
        res = target[:, :k]
    else:  # a residual that subtracts only part of q
        res = (target[:, :k] - 0.5 * draft_probs).clamp_min(0)
    fix = sample(res, sample_uniform[:, :k])
    last = sample(draft_probs[:, -1] if bonus == "q" else target[:, k], sample_uniform[:, k])
    fix = torch.cat([fix, last[:, None]], dim=1)
    return _assemble(draft, num_draft, accepted, fix)


WRONG = {
    "residual drawn from p": lambda *a: _generic(*a, residual="p"),
    "residual not p - q": lambda *a: _generic(*a, residual="half"),
    "bonus drawn from q": lambda *a: _generic(*a, bonus="q"),
    "accept with q/p": lambda *a: _generic(*a, accept="inverted"),
}


@pytest.mark.parametrize("bug", list(WRONG))
def test_the_statistical_test_catches_a_wrong_sampler(dists, bug):
    p, q = dists
    samples = _simulate(WRONG[bug], p, q, N, length=4, seed=1)
    assert min(min(_marginal_pvalues(samples, p)), _joint_pvalue(samples, p)) < 1e-6


def test_the_correct_generic_sampler_passes(dists):
    """The wrong samplers differ from a correct one only in their bug."""
    p, q = dists
    samples = _simulate(lambda *a: _generic(*a), p, q, N, length=4, seed=1)
    assert min(_marginal_pvalues(samples, p)) > 1e-3
