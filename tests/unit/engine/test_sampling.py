from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from specdec.engine import sampling
from specdec.engine.sampling import SamplingError, SamplingParams


def _probs_row(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    return sampling.probs(logits[None], params)[0]


def test_temperature_softmax():
    logits = torch.tensor([1.0, 2.0, 3.0])
    p = _probs_row(logits, SamplingParams(temperature=2.0))
    torch.testing.assert_close(p, torch.softmax(logits / 2, -1))


def test_top_k_keeps_exactly_the_k_most_likely():
    logits = torch.tensor([0.1, 3.0, 2.0, -1.0, 2.5])
    p = _probs_row(logits, SamplingParams(temperature=1.0, top_k=2))
    assert set(torch.nonzero(p).flatten().tolist()) == {1, 4}
    assert math.isclose(p.sum().item(), 1.0, rel_tol=1e-6)


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    p = _probs_row(probs.log(), SamplingParams(temperature=1.0, top_p=0.75))
    assert torch.nonzero(p).flatten().tolist() == [0, 1]  # 0.5 < 0.75 <= 0.8
    torch.testing.assert_close(p[:2], torch.tensor([0.625, 0.375]))
    p = _probs_row(probs.log(), SamplingParams(temperature=1.0, top_p=0.01))
    assert torch.nonzero(p).flatten().tolist() == [0]  # always at least the most likely token


def test_uniforms_depend_only_on_seed_and_position():
    a = sampling.sample_uniforms(42, [10, 11, 12], torch.device("cpu"))
    b = sampling.sample_uniforms(42, [12], torch.device("cpu"))
    c = sampling.sample_uniforms(43, [12], torch.device("cpu"))
    assert a.dtype == torch.float64 and a[2] == b[0] and b[0] != c[0]
    u1 = sampling.uniform_noise(42, [10, 11], torch.device("cpu"))
    u2 = sampling.uniform_noise(42, [11], torch.device("cpu"))
    assert u1[1] == u2[0]
    assert sampling.sample_uniforms(42, [11], torch.device("cpu"))[0] != u2[0]  # streams apart


def test_sample_draws_each_token_with_its_probability():
    """Chi-square over 20000 draws, zeros in p never drawn, an unnormalised row the same."""
    p = torch.tensor([0.0, 0.1, 0.0, 0.25, 0.6, 0.05, 0.0])
    u = torch.rand(20000, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    drawn = sampling.sample(p.expand(len(u), -1), u)
    counts = np.bincount(drawn.numpy(), minlength=len(p))
    assert counts[p.numpy() == 0].sum() == 0
    support = p.numpy() > 0
    assert chisquare(counts[support], p.numpy()[support] * len(u)).pvalue > 1e-3
    assert torch.equal(sampling.sample(3 * p.expand(len(u), -1), u), drawn)
    assert sampling.sample(torch.zeros(2, 5), torch.tensor([0.0, 0.99], dtype=torch.float64)).tolist() == [4, 4]


def _kept_by_full_sort(p: torch.Tensor, top_p: float) -> torch.Tensor:
    """The definition: sort every token, keep them until the kept mass reaches top_p."""
    sorted_p, order = torch.sort(p.double(), descending=True)
    dropped = torch.cumsum(sorted_p, dim=-1) - sorted_p >= top_p * sorted_p.sum()
    dropped[0] = False
    return torch.ones_like(p, dtype=torch.bool).index_fill_(0, order[dropped], False)


def _same_cut(kept_a: torch.Tensor, kept_b: torch.Tensor, p: torch.Tensor) -> bool:
    """The same kept probabilities, up to which of equally likely tokens a cut through them keeps."""
    return torch.equal(torch.sort(p[kept_a]).values, torch.sort(p[kept_b]).values) and bool(
        p[kept_a].min() >= torch.cat([p[~kept_a], torch.zeros(1)]).max()
    )


def _top_p_cut(logits: torch.Tensor, top_p: float) -> bool:
    """Does probs() keep, for each row, the tokens a full sort of its own probabilities keeps?"""
    p = sampling.probs(logits, SamplingParams(temperature=1.0))
    kept = sampling.probs(logits, SamplingParams(temperature=1.0, top_p=top_p)) > 0
    return all(_same_cut(kept[i], _kept_by_full_sort(p[i], top_p), p[i]) for i in range(len(p)))


# the cut among a few tokens (scale 8), thousands (scale 3, top_p 0.9) and all (scale 0.05)
@pytest.mark.parametrize("scale", [8.0, 3.0, 0.05])
@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.999])
def test_top_p_cuts_where_a_full_sort_would(scale, top_p):
    assert _top_p_cut(torch.randn(5, 49152, generator=torch.Generator().manual_seed(1)) * scale, top_p)


@pytest.mark.parametrize("tail", sampling._TAILS[:-1])
def test_top_p_cut_past_a_tail(tail):
    """The tokens weighing at least a tail (the most likely 1) hold less than top_p: the cut
    is among those weighing a little less, found past the tail."""
    near, below = math.log(tail) + 1e-3, math.log(tail) - 1e-3
    logits = torch.tensor([0.0] + [near] * 50 + [below] * 4000 + [-30.0] * 2000)
    total = 1 + (50 + 4000) * tail
    assert _top_p_cut(logits[None], (1 + 50 * tail + 1000 * tail) / total)
    assert _top_p_cut(logits[None], (1 + 10 * tail) / total)  # (and a cut before it)


# rows whose top_p cuts fall among a few tokens, hundreds, thousands and all, in one call; logits in
# bfloat16's steps, as the engine's, so that equally likely tokens are common
MIXED_ROWS = torch.cat([torch.randn(4, 49152, generator=torch.Generator().manual_seed(s)) * scale
                        for s, scale in ((2, 8.0), (3, 3.0), (4, 0.05))]).bfloat16().float()  # fmt: skip


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7, top_k=50, top_p=0.9),
        SamplingParams(temperature=0.7, top_p=0.9),
        SamplingParams(temperature=1.0, top_p=0.999),
        SamplingParams(temperature=1.3),
    ],
)
def test_a_row_samples_and_has_probabilities_whatever_the_other_rows(params):
    """The engine draws a step's sampled rows in one call: a row's token and probabilities must
    be the bits it gets alone, or picked from the others (`rows`)."""
    uniforms = torch.rand(len(MIXED_ROWS), dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    together, p = sampling.draw(MIXED_ROWS, params, uniforms), sampling.probs(MIXED_ROWS, params)
    for i in range(len(MIXED_ROWS)):
        assert sampling.draw(MIXED_ROWS[i : i + 1], params, uniforms[i : i + 1]).item() == together[i]
        assert sampling.draw(MIXED_ROWS, params, uniforms[i : i + 1], rows=[i]).item() == together[i]
        assert torch.equal(sampling.probs(MIXED_ROWS[i : i + 1], params)[0], p[i])
    assert len({int(t) for t in together}) > len(MIXED_ROWS) // 2  # (not one token for all)


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_draw_samples_the_distribution_of_probs(top_p):
    """Chi-square of 20000 draws of one row against probs(); top_p < 1 draws from the kept
    tokens in order of likelihood, not of id."""
    logits = torch.randn(1, 64, generator=torch.Generator().manual_seed(6)) * 2
    params = SamplingParams(temperature=0.9, top_p=top_p)
    p = sampling.probs(logits, params)[0].double().numpy()
    u = torch.rand(20000, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    counts = np.bincount(sampling.draw(logits.expand(len(u), -1), params, u).numpy(), minlength=len(p))
    assert counts[p == 0].sum() == 0 and (p == 0).any() == (top_p < 1)
    assert chisquare(counts[p > 0], p[p > 0] / p.sum() * len(u)).pvalue > 1e-3


def test_sampled_requests_in_one_call_draw_what_each_draws_alone(tiny_target):
    """A step draws each position's rows of its sampled sequences together, by parameters: each
    sequence still gets its own seed's tokens, and with a deterministic draft the tokens of
    plain sampling."""
    from specdec.engine.engine import Engine, GenerationRequest

    engine = Engine(tiny_target, kv_slots=4, max_seq_len=128)
    params = [SamplingParams(0.9, seed=1), SamplingParams(0.9, seed=2), SamplingParams(1.2, top_p=0.8, seed=3),
              SamplingParams(0.7, top_k=5, seed=4)]  # fmt: skip
    prompts = [np.arange(10 + 3 * i) % 90 + 3 for i in range(len(params))]

    def requests(drafts: list[np.ndarray | None]) -> list[GenerationRequest]:
        return [GenerationRequest(prompt, 8, draft_ids=d, sampling=p)
                for prompt, d, p in zip(prompts, drafts, params, strict=True)]  # fmt: skip

    alone = [engine.generate([r])[0].tokens.tolist() for r in requests([None] * len(params))]
    assert len({tuple(a) for a in alone}) == len(alone)
    together = [r.tokens.tolist() for r in engine.generate(requests([None] * len(params)))]
    assert together == alone
    # drafts of plain sampling's tokens, wrong from the 1st, 3rd, 5th or no token on
    drafts = [np.array(a[:5]) for a in alone]
    for d, wrong in zip(drafts, (0, 2, 4, 5), strict=True):
        d[wrong:] = (d[wrong:] + 1) % 96
    results = engine.generate(requests(drafts))  # (a call with drafts is one round)
    assert [r.num_accepted for r in results] == [0, 2, 4, 5]
    for result, plain in zip(results, alone, strict=True):
        assert result.tokens.tolist() == plain[: result.num_accepted + 1]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        (SamplingParams(temperature=-0.1), "temperature"),
        (SamplingParams(temperature=float("nan")), "temperature"),
        (SamplingParams(temperature=float("inf")), "temperature"),
        (SamplingParams(top_k=-1), "top_k"),
        (SamplingParams(top_p=0.0), "top_p"),
        (SamplingParams(top_p=1.5), "top_p"),
        (SamplingParams(top_p=float("nan")), "top_p"),
        (SamplingParams(seed=-1), "seed"),
    ],
)
def test_invalid_parameters_name_their_field(params, field):
    with pytest.raises(SamplingError) as err:
        params.validate()
    assert err.value.field == field and str(err.value).startswith(field)


def test_derived_seed_differs_and_is_stable():
    assert sampling.derive_seed(5, 1) == sampling.derive_seed(5, 1) != sampling.derive_seed(5, 2)
